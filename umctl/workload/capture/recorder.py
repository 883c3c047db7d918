"""Record what a PyTorch program does to device memory, op by op, without a GPU.

:class:`Recorder` is a ``TorchDispatchMode``: it sees every aten operator after autograd and the
composite decompositions, i.e. the operators a CUDA run launches kernels for. For each one on
meta tensors it notes the bytes of every storage it reads and writes (a view's span in its
storage, not the whole storage), its FLOPs (``torch.utils.flop_counter``'s formulas) and its
precision. Storages are followed by identity: the first time an op returns one it is
*allocated*; a ``weakref.finalize`` on the storage tells the instant its last tensor dies, which
is when PyTorch's caching allocator takes the block back. So the log has the allocator's
malloc/free sequence in program order, interleaved with the kernels, exactly as a CUDA run
would issue them.

Ops that move no data (views, ``detach``, ``empty``) are allocations or nothing, not kernels.
Reads of a value on the host (``.item()``, ``.tolist()``, ``.cpu()``) are synchronisations;
their values come from :mod:`.shadow`, as do the sizes of data-dependent outputs.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .shadow import Shadows

aten = torch.ops.aten

# event kinds of CaptureLog.events
ALLOC, FREE, OP, SYNC = 0, 1, 2, 3

#: ops that allocate (or alias) without touching data: no kernel
NO_KERNEL = {
    aten.empty.memory_format, aten.empty_strided.default, aten.new_empty.default,
    aten.new_empty_strided.default, aten.empty_like.default, aten.lift_fresh.default,
    aten.detach.default, aten.alias.default, aten.resize_.default, aten.set_.source_Storage,
    aten.set_.source_Storage_storage_offset, aten.set_.source_Tensor, aten.set_.default,
    aten._local_scalar_dense.default,
}
#: matmul-like ops (tensor cores) and convolutions, for the peak rate of their precision
MATMUL = {"mm", "addmm", "_grouped_mm", "bmm", "baddbmm", "_scaled_mm", "_scaled_dot_product_efficient_attention",
          "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention_backward",
          "_scaled_dot_product_flash_attention_backward", "_scaled_dot_product_cudnn_attention",
          "_scaled_dot_product_cudnn_attention_backward", "_flash_attention_forward",
          "_flash_attention_backward", "_efficient_attention_forward", "_efficient_attention_backward"}
CONV = {"convolution", "_convolution", "convolution_backward", "cudnn_convolution", "convolution_overrideable"}
_DYNAMIC_TAG = torch.Tag.dynamic_output_shape
_BOOL_INDEX = {aten.index.Tensor, aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default}


@dataclass
class OpRecord:
    """One kernel: what it reads and writes (storage id, byte range in the storage)."""

    name: str
    reads: list[tuple[int, int, int]]
    writes: list[tuple[int, int, int]]
    flops: float
    kind: str            # "matmul", "conv" or "other"
    dtype: str           # precision of its first floating-point operand
    out_elements: int


@dataclass
class StorageRecord:
    sid: int
    nbytes: int
    step: int            # the step it was allocated in (-1: while the model was built)
    label: str           # the op that made it
    freed: bool = False


@dataclass
class CaptureLog:
    """What a capture saw: storages and the event sequence (``(ALLOC, sid)``, ``(FREE, sid)``,
    ``(OP, OpRecord)``, ``(SYNC, None)``); ``step_starts[k]`` is the event index where step k
    began, ``end`` where the last one ended."""

    storages: list[StorageRecord] = field(default_factory=list)
    events: list[tuple[int, object]] = field(default_factory=list)
    step_starts: list[int] = field(default_factory=list)
    end: int = 0
    notes: dict = field(default_factory=dict)
    params: set[int] = field(default_factory=set)
    grads: set[int] = field(default_factory=set)
    has_model: bool = True   # make_step returned (model, step): parameters and gradients are known


def _span(t: torch.Tensor, nbytes: int) -> tuple[int, int] | None:
    """Byte range of ``t``'s elements in its storage (the hull of a strided view)."""
    if t.numel() == 0:
        return None
    size = t.element_size()
    last = t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if n > 1 and s > 0)
    lo, hi = t.storage_offset() * size, min((last + 1) * size, nbytes)
    return (lo, hi) if hi > lo else None


_GROUPED_MM = getattr(aten, "_grouped_mm", None)
_GROUPED_MM = getattr(_GROUPED_MM, "default", None)


def _grouped_mm_shape(a: torch.Tensor, b: torch.Tensor, offs) -> tuple[list[int], float]:
    """Output shape and FLOPs of a grouped matmul (a MoE layer's experts in one kernel)."""
    if a.dim() == 2 and b.dim() == 3:
        return [a.shape[0], b.shape[-1]], 2.0 * a.shape[0] * a.shape[1] * b.shape[-1]
    if a.dim() == 2 and b.dim() == 2:
        return [offs.shape[0], a.shape[0], b.shape[-1]], 2.0 * a.shape[0] * a.shape[1] * b.shape[-1]
    if a.dim() == 3 and b.dim() == 3:
        return [a.shape[0], a.shape[1], b.shape[-1]], 2.0 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[-1]
    return [a.shape[1], b.shape[-1]], 2.0 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[-1]


def _grouped_mm(func, args, kwargs):
    """``_grouped_mm`` on meta: its meta kernel takes bf16 only (the sm90 kernel), where CUDA
    runs other dtypes through a fallback; the capture needs only the output's shape."""
    try:
        return func(*args, **kwargs)
    except RuntimeError:
        a, b = args[0], args[1]
        offs = args[2] if len(args) > 2 else kwargs.get("offs")
        dtype = kwargs.get("out_dtype") or (args[4] if len(args) > 4 else None) or a.dtype
        return torch.empty(_grouped_mm_shape(a, b, offs)[0], dtype=dtype, device="meta")


def _flops(func, args, kwargs, out) -> float:
    from torch.utils.flop_counter import flop_registry

    if func is _GROUPED_MM and func is not None:
        return _grouped_mm_shape(args[0], args[1], args[2] if len(args) > 2 else kwargs.get("offs"))[1]

    f = flop_registry.get(func._overloadpacket)
    if f is None:
        return 0.0
    try:
        return float(f(*args, **kwargs, out_val=out))
    except Exception:   # a formula that does not take this overload's arguments
        return 0.0


class Recorder(TorchDispatchMode):
    """Log allocations, frees and kernels of meta tensors into ``self.log``."""

    def __init__(self, max_shadow_elements: int | None = None):
        super().__init__()
        self.log = CaptureLog()
        self.step = -1
        self._live: dict[int, int] = {}        # storage _cdata -> sid
        self.closed = False
        kw = {} if max_shadow_elements is None else {"max_elements": max_shadow_elements}
        self.shadows = Shadows(self.sid_of, **kw)

    # -- storages ------------------------------------------------------------------------
    def sid_of(self, t: torch.Tensor) -> int:
        """The storage id of meta tensor ``t`` (registered, as allocated now, on first sight)."""
        st = t.untyped_storage()
        sid = self._live.get(st._cdata)
        if sid is None:
            sid = self._register(st, "<first seen>")
        return sid

    def _register(self, st, label: str) -> int:
        sid = len(self.log.storages)
        self.log.storages.append(StorageRecord(sid, int(st.nbytes()), self.step, label))
        self._live[st._cdata] = sid
        weakref.finalize(st, self._freed, st._cdata, sid)
        if not self.closed:
            self.log.events.append((ALLOC, sid))
        return sid

    def _freed(self, cdata: int, sid: int) -> None:
        if self._live.get(cdata) == sid:
            del self._live[cdata]
        self.shadows.forget(sid)
        if not self.closed:
            self.log.storages[sid].freed = True
            self.log.events.append((FREE, sid))

    def mark_step(self, k: int) -> None:
        self.step = k
        self.log.step_starts.append(len(self.log.events))

    def close(self) -> None:
        self.log.end = len(self.log.events)
        self.log.notes = dict(self.shadows.notes)
        self.closed = True

    # -- the dispatch hook -----------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.closed or func.namespace != "aten":
            return func(*args, **kwargs)
        flat_in = tree_flatten((args, kwargs))[0]
        metas_in = [x for x in flat_in if isinstance(x, torch.Tensor) and x.is_meta]
        if metas_in:
            special = self._host_read(func, args, kwargs)
            if special is not NotImplemented:
                return special
        if metas_in and (_DYNAMIC_TAG in func.tags or func in _BOOL_INDEX) and self._data_dependent(func, args):
            out = self.shadows.dynamic(func, args, kwargs)
        elif func is _GROUPED_MM and metas_in:
            out = _grouped_mm(func, args, kwargs)
        else:
            out = func(*args, **kwargs)
        metas_out = [x for x in tree_flatten(out)[0] if isinstance(x, torch.Tensor) and x.is_meta]
        if not metas_in and not metas_out:
            return out
        self._record(func, args, kwargs, out, metas_out)
        return out

    def _data_dependent(self, func, args) -> bool:
        if func in _BOOL_INDEX:
            return any(ix is not None and ix.dtype in (torch.bool, torch.uint8) for ix in args[1])
        return True

    def _host_read(self, func, args, kwargs):
        """``.item()``, ``.cpu()``/``.tolist()``: a synchronisation, and a value from the shadows."""
        if func is aten._local_scalar_dense.default:
            self.log.events.append((SYNC, None))
            return self.shadows.scalar(args[0])
        if func is aten._to_copy.default and args[0].is_meta:
            dev = kwargs.get("device")
            if dev is not None and torch.device(dev).type != "meta":
                self.log.events.append((SYNC, None))
                return self.shadows.to_host(args[0], kwargs.get("dtype")).to(dev)
        if func is aten.copy_.default and not args[0].is_meta and args[1].is_meta:
            self.log.events.append((SYNC, None))
            return args[0].copy_(self.shadows.to_host(args[1]))
        return NotImplemented

    def _record(self, func, args, kwargs, out, metas_out) -> None:
        before = set(self._live.values())
        schema = func._schema
        reads: list[torch.Tensor] = []
        written: list[torch.Tensor] = []
        for i, arg in enumerate(schema.arguments):
            value = args[i] if i < len(args) and not arg.kwarg_only else kwargs.get(arg.name)
            tensors = [x for x in tree_flatten(value)[0] if isinstance(x, torch.Tensor) and x.is_meta]
            if not tensors:
                continue
            w = arg.alias_info is not None and arg.alias_info.is_write
            if w:
                written += tensors
            if not w or not arg.kwarg_only:   # in-place: read and written; out=: written only
                reads += tensors
        births = []
        for t in metas_out:
            st = t.untyped_storage()
            if st._cdata not in self._live:
                births.append(self._register(st, func.__name__))
        for m, v in self.shadows.take_pending():
            self.shadows.set(m, v)
        self.shadows.after(func, args, kwargs, out, written)
        if func in NO_KERNEL:
            return
        write_sids = {self.sid_of(t) for t in written}
        new = [t for t in metas_out if self.sid_of(t) not in before and self.sid_of(t) not in write_sids]
        w_spans = self._spans(written + new)
        if not w_spans:
            return   # reads only (a view, a metadata query): no kernel
        r_spans = self._spans(reads)
        dtype = next((str(x.dtype).removeprefix("torch.") for x in reads + written + new
                      if x.dtype.is_floating_point), "float32")
        name = func._overloadpacket.__name__
        kind = "matmul" if name in MATMUL else "conv" if name in CONV else "other"
        out_el = sum(t.numel() for t in written + new)
        self.log.events.append((OP, OpRecord(f"aten.{func.__name__}", r_spans, w_spans,
                                             _flops(func, args, kwargs, out), kind, dtype, out_el)))

    def _spans(self, tensors: list[torch.Tensor]) -> list[tuple[int, int, int]]:
        out = []
        for t in tensors:
            sid = self.sid_of(t)
            s = _span(t, self.log.storages[sid].nbytes)
            if s is not None:
                out.append((sid, s[0], s[1]))
        return out
