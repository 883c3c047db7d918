"""Make a meta-device run pick the operators a CUDA run picks, where the choice changes memory.

PyTorch chooses some kernels by device. On meta (as on CPU) ``scaled_dot_product_attention``
falls back to the math path, which materialises the batch x heads x seq x seq scores and
probabilities and saves them for backward; on an H100 the same call runs the flash or the
memory-efficient kernel, which keep only a per-row log-sum-exp. And ``dropout`` on CUDA is the
fused ``native_dropout`` with a one-byte mask, where elsewhere it is ``bernoulli_`` into a
float mask of the input's size. For a GPT-2 at sequence 1024 the difference is gigabytes, so
while a capture runs these two functions take the CUDA choice, as PyTorch's own dispatcher makes
it (sdp_utils): flash for fp16/bf16 without a mask, memory-efficient otherwise, math where the
program switched the fused kernels off (``torch.backends.cuda.enable_*_sdp(False)``,
``sdpa_kernel``) or asked for what they do not support (grouped-query attention, other ranks).

Optimizers and ``clip_grad_norm_`` pick the multi-tensor ``_foreach_*`` kernels by device: meta
is not a foreach device, so without help they take the per-tensor loop, where CUDA runs the
foreach path (whose temporaries span every parameter at once). While capturing, meta counts as a
foreach device, as cuda does.

``torch.autocast`` cannot act on meta tensors (there is no autocast key for meta): while
capturing, it is replaced by :class:`AutocastRequests`, which does what CUDA's autocast does at
the level of functions, above autograd (a ``TorchFunctionMode``): the ops of CUDA autocast's
lower-precision list (GEMMs, convolutions, attention) get their floating inputs cast to the
autocast dtype, those of its fp32 list (softmax, norms, losses, reductions, exp/log/pow) to
float32, and a parameter's cast is made once per autocast region (autocast's weight cache). The
casts are real ``to`` calls, so autograd records them and the backward pass runs in the same
precisions, with float32 gradients for the float32 master weights, as under AMP. What it does not
do: the "promote" list is left to PyTorch's own type promotion, and ops not named below run in
whatever precision their inputs have.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections import Counter
from contextlib import contextmanager
from typing import Iterator

import torch
import torch.nn.functional as F
import torch.utils._pytree

aten = torch.ops.aten


def _sdpa(orig):
    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        dt = AutocastRequests.active()   # attention is on autocast's lower-precision list
        if dt is not None:
            query, key, value = (AutocastRequests.cast(t, dt) for t in (query, key, value))
        fused_ok = (query.is_meta and query.dim() == 4 and key.dim() == 4 and value.dim() == 4 and not enable_gqa
                    and query.shape[1] == key.shape[1] == value.shape[1])
        if not fused_ok:
            return orig(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                        scale=scale, enable_gqa=enable_gqa)
        half = query.dtype in (torch.float16, torch.bfloat16)
        if (torch.backends.cuda.flash_sdp_enabled() and half and attn_mask is None
                and query.shape[-1] == value.shape[-1] and query.shape[-1] <= 256):
            return aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal,
                                                            False, scale=scale)[0]
        if torch.backends.cuda.mem_efficient_sdp_enabled():
            bias = attn_mask
            if bias is not None and bias.dtype == torch.bool:   # as the CUDA path converts it
                bias = torch.zeros(bias.shape, dtype=query.dtype, device=query.device).masked_fill(
                    bias.logical_not(), float("-inf"))
            if bias is not None:
                bias = bias.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
            need_lse = query.requires_grad or key.requires_grad or value.requires_grad
            return aten._scaled_dot_product_efficient_attention(query, key, value, bias, need_lse, dropout_p,
                                                                is_causal, scale=scale)[0]
        return orig(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                    scale=scale, enable_gqa=enable_gqa)
    return sdpa


def _dropout(orig):
    def dropout(input, p=0.5, training=True, inplace=False):
        if isinstance(input, torch.Tensor) and input.is_meta and training and 0 < p < 1 and not inplace:
            return aten.native_dropout(input, p, True)[0]
        return orig(input, p, training, inplace)
    return dropout


def _with_meta(orig):
    def devices() -> list[str]:
        found = list(orig())
        return found if "meta" in found else found + ["meta"]
    return devices


#: the modules that hold ``_get_foreach_kernels_supported_devices`` (optimizers, clip_grad_norm_,
#: swa_utils: each its own binding of the name)
_FOREACH_HOLDERS = ("torch.utils._foreach_utils", "torch.optim.optimizer", "torch.optim.swa_utils")


#: CUDA autocast's lower-precision ops, by the names the functions carry (``F.linear`` is
#: ``torch._C._nn.linear``, ``x @ w`` is ``Tensor.__matmul__``)
#: (the mode sees only the outermost torch function of a call, so functions that run these
#: inside in Python -- einsum, multi-head attention, tensordot, bilinear -- are on it too)
_LOW = frozenset({"__matmul__", "__rmatmul__", "addbmm", "addmm", "addmv", "addr", "baddbmm", "bmm", "chain_matmul",
                  "multi_dot", "linalg_multi_dot", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
                  "conv_transpose2d", "conv_transpose3d", "linear", "matmul", "mm", "mv", "prelu",
                  "scaled_dot_product_attention", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
                  "einsum", "multi_head_attention_forward", "tensordot", "bilinear"})
#: ... and its float32 ops
_FP32 = frozenset({"__pow__", "__rdiv__", "__rpow__", "__rtruediv__", "acos", "asin", "binary_cross_entropy_with_logits",
                   "cosh", "cosine_embedding_loss", "cdist", "cosine_similarity", "cross_entropy", "cross_entropy_loss",
                   "cumprod", "cumsum", "dist", "erfinv", "exp", "expm1", "group_norm", "hinge_embedding_loss",
                   "kl_div", "l1_loss", "layer_norm", "log", "log_softmax", "log10", "log1p", "log2",
                   "margin_ranking_loss", "mse_loss", "multilabel_margin_loss", "multi_margin_loss", "nll_loss",
                   "nll_loss_nd", "nll_loss2d", "norm", "normalize", "pdist", "poisson_nll_loss", "pow", "prod",
                   "reciprocal", "rsqrt", "sinh", "smooth_l1_loss", "soft_margin_loss", "softmax", "softmin",
                   "softplus", "sum", "renorm", "tan", "triplet_margin_loss", "rms_norm"})
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)   # float64 is left alone, as by autocast


class _AutocastMode(torch.overrides.TorchFunctionMode):
    """The casts of the innermost enabled :class:`AutocastRequests` (module doc)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        dtype = AutocastRequests.active()
        name = getattr(func, "__name__", "")
        if dtype is not None and (name in _LOW or name in _FP32) and "out" not in kwargs:   # out=: as asked
            to = dtype if name in _LOW else torch.float32
            args, kwargs = torch.utils._pytree.tree_map(lambda a: AutocastRequests.cast(a, to), (args, kwargs))
        return func(*args, **kwargs)


class AutocastRequests(contextlib.ContextDecorator):
    """What stands for ``torch.autocast`` (and ``torch.amp.autocast``, ``torch.cuda.amp.autocast``)
    during a capture (module doc). Counts each enabled request by dtype in ``seen``."""

    seen: Counter = Counter()
    _stack: list = []          # per entered region: its dtype, or None (autocast disabled there)
    _cache: dict = {}          # id(parameter) -> (parameter, its cast): one cast per region
    _mode: _AutocastMode | None = None

    def __init__(self, device_type: str = "cuda", dtype=None, enabled: bool = True, cache_enabled=None):
        self.device_type = device_type
        self.dtype = dtype if dtype is not None else (torch.bfloat16 if device_type == "cpu" else torch.float16)
        self.enabled = bool(enabled) and self.dtype in (torch.float16, torch.bfloat16)
        self.cache_enabled = True if cache_enabled is None else bool(cache_enabled)

    @classmethod
    def active(cls):
        return cls._stack[-1] if cls._stack else None

    @classmethod
    def cast(cls, a, to):
        """``a`` in ``to`` where autocast would cast it (a floating tensor of another dtype)."""
        if not isinstance(a, torch.Tensor) or a.dtype == to or a.dtype not in _FLOATS:
            return a
        if a.is_leaf and a.requires_grad and to != torch.float32:   # autocast's weight cache
            hit = cls._cache.get((id(a), to))
            if hit is not None and hit[0] is a:
                return hit[1]
            c = a.to(to)
            cls._cache[(id(a), to)] = (a, c)
            return c
        return a.to(to)

    def __enter__(self):
        if self.enabled:
            AutocastRequests.seen[str(self.dtype).removeprefix("torch.")] += 1
        cls = AutocastRequests
        cls._stack.append(self.dtype if self.enabled else None)
        if cls._mode is None:
            cls._mode = _AutocastMode()
            cls._mode.__enter__()
        return self

    def __exit__(self, *exc) -> bool:
        cls = AutocastRequests
        cls._stack.pop()
        if not cls._stack:
            cls._cache.clear()      # the weight cache lives as long as the outermost region
            if cls._mode is not None:
                mode, cls._mode = cls._mode, None
                mode.__exit__(*exc)
        return False


def autocast_notes(seen: Counter) -> dict[str, int]:
    """The assumption lines for the autocast regions a capture modelled."""
    return {f"autocast({dt}) modelled at the function level: CUDA autocast's lower-precision and fp32 op "
            f"lists, parameters cast once per region; other ops keep their inputs' precision": n
            for dt, n in sorted(seen.items())}


def _cuda_amp_autocast(enabled: bool = True, dtype=torch.float16, cache_enabled: bool = True):
    return AutocastRequests("cuda", dtype=dtype, enabled=enabled)


@contextmanager
def cuda_kernel_choices() -> Iterator[None]:
    """While inside, attention and dropout on meta tensors take the kernels CUDA would,
    optimizers and clip_grad_norm_ their foreach kernels, and autocast casts as CUDA's would."""
    saved = F.scaled_dot_product_attention, F.dropout
    holders = [m for m in (sys.modules.get(n) or importlib.import_module(n) for n in _FOREACH_HOLDERS)
               if hasattr(m, "_get_foreach_kernels_supported_devices")]
    foreach = [(m, m._get_foreach_kernels_supported_devices) for m in holders]
    amp_saved = [(torch, "autocast", torch.autocast), (torch.amp, "autocast", torch.amp.autocast)]
    cuda_amp = getattr(torch.cuda, "amp", None)
    if cuda_amp is not None and hasattr(cuda_amp, "autocast"):
        amp_saved.append((cuda_amp, "autocast", cuda_amp.autocast))
    F.scaled_dot_product_attention = _sdpa(saved[0])
    F.dropout = _dropout(saved[1])
    for m, orig in foreach:
        m._get_foreach_kernels_supported_devices = _with_meta(orig)
    for owner, attr, _ in amp_saved:
        setattr(owner, attr, _cuda_amp_autocast if owner is cuda_amp else AutocastRequests)
    AutocastRequests.seen = Counter()
    AutocastRequests._stack, AutocastRequests._cache, AutocastRequests._mode = [], {}, None
    try:
        yield
    finally:
        F.scaled_dot_product_attention, F.dropout = saved
        for m, orig in foreach:
            m._get_foreach_kernels_supported_devices = orig
        for owner, attr, orig in amp_saved:
            setattr(owner, attr, orig)
        # a region entered and never left (a step that raised between a framework's enter and
        # exit hooks) must not go on casting after the capture
        mode = AutocastRequests._mode
        AutocastRequests._stack, AutocastRequests._cache, AutocastRequests._mode = [], {}, None
        if mode is not None:
            mode.__exit__(None, None, None)
