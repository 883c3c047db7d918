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
"""

from __future__ import annotations

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


@contextmanager
def cuda_kernel_choices() -> Iterator[None]:
    """While inside, attention and dropout on meta tensors take the kernels CUDA would."""
    saved = F.scaled_dot_product_attention, F.dropout
    F.scaled_dot_product_attention = _sdpa(saved[0])
    F.dropout = _dropout(saved[1])
    try:
        yield
    finally:
        F.scaled_dot_product_attention, F.dropout = saved
