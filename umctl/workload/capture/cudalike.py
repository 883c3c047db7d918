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
capturing, it is replaced by :class:`AutocastRequests`, which runs the block in the tensors'
own precision and counts the request, so the capture reports that it did not model it.
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

aten = torch.ops.aten


def _sdpa(orig):
    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
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


class AutocastRequests(contextlib.ContextDecorator):
    """What stands for ``torch.autocast`` (and ``torch.amp.autocast``, ``torch.cuda.amp.autocast``)
    during a capture: a context manager (and decorator) that changes nothing and counts each
    enabled request by dtype in ``AutocastRequests.seen``."""

    seen: Counter = Counter()

    def __init__(self, device_type: str = "cuda", dtype=None, enabled: bool = True, cache_enabled=None):
        self.device_type = device_type
        self.dtype = dtype if dtype is not None else (torch.bfloat16 if device_type == "cpu" else torch.float16)
        self.enabled = enabled

    def __enter__(self):
        if self.enabled:
            AutocastRequests.seen[str(self.dtype).removeprefix("torch.")] += 1
        return self

    def __exit__(self, *exc) -> bool:
        return False


def autocast_notes(seen: Counter) -> dict[str, int]:
    """The assumption lines for the autocast requests a capture ignored."""
    return {f"autocast({dt}) not modelled: captured in fp32 (activations about 2x too large, "
            f"GEMMs timed at the fp32 rate)": n for dt, n in sorted(seen.items())}


def _cuda_amp_autocast(enabled: bool = True, dtype=torch.float16, cache_enabled: bool = True):
    return AutocastRequests("cuda", dtype=dtype, enabled=enabled)


@contextmanager
def cuda_kernel_choices() -> Iterator[None]:
    """While inside, attention and dropout on meta tensors take the kernels CUDA would,
    optimizers and clip_grad_norm_ their foreach kernels, and autocast is recorded, not applied."""
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
    try:
        yield
    finally:
        F.scaled_dot_product_attention, F.dropout = saved
        for m, orig in foreach:
            m._get_foreach_kernels_supported_devices = orig
        for owner, attr, orig in amp_saved:
            setattr(owner, attr, orig)
