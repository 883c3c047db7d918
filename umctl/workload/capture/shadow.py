"""Values for the decisions a captured step makes on tensor *contents*, which a meta tensor has not.

A capture runs the model on PyTorch's meta device: shapes, dtypes and storages, no data. Most of
a training step needs nothing else, but some of it branches on values: a mixture-of-experts
layer routes tokens by ``topk`` of the router's scores, finds the experts hit with
``nonzero``/``where``/``unique``, loops over them in Python (``.tolist()``, ``if idx == E``), and
sizes each expert's batch by how many tokens chose it. This module keeps, next to each small
integer or boolean storage whose value can be known, a real CPU copy (its *shadow*) and
computes shadows op by op where every input has one, so those decisions are taken on values.

Where a value cannot be known it is assumed, and every assumption is counted (``notes``), so a
capture can say what it did not see:

* routing is **uniform**: the indices of ``topk``/``argmax``/``max(dim)`` of unknown scores are
  dealt round robin, row r's j-th choice being ``(r * k + j) mod R``: every expert gets the same
  share of tokens (real routers are imbalanced, so a real step's largest expert batch is bigger);
* ``isnan``/``isinf`` of unknown values are all False, ``isfinite`` all True (a healthy step);
* an op whose output size depends on values nobody knows (``nonzero`` of a dropout mask,
  boolean indexing by a comparison of activations) is sized at its upper bound: every element
  selected;
* ``.item()``/``bool()``/``.tolist()`` of an unknown value read 1, 1.0 or True.

A shadow is a flat CPU tensor per storage; a view reads it through its own size, stride and
offset, so views and in-place updates stay consistent. Shadows are only kept up to
``max_elements`` per storage, so the capture never holds data the size of an activation.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Callable

import torch
from torch.utils._pytree import tree_flatten, tree_map

from .errors import CaptureError

aten = torch.ops.aten

#: Storages of at most this many elements keep a shadow (4 Mi elements: 32 MiB of int64).
MAX_SHADOW_ELEMENTS = 1 << 22

#: ops whose index outputs are routing decisions: dealt round robin when their input is unknown
_INDEX_OUTPUTS = {
    aten.topk.default: 1, aten.max.dim: 1, aten.min.dim: 1, aten.sort.default: 1, aten.sort.stable: 1,
    aten.argmax.default: 0, aten.argmin.default: 0,
}
_ALL_FALSE = {aten.isnan.default, aten.isinf.default, aten.isposinf.default, aten.isneginf.default}
_ALL_TRUE = {aten.isfinite.default}

#: data-dependent output sizes this module can size without values (upper bounds)
_UPPER_BOUND = {aten.nonzero.default, aten.masked_select.default, aten._unique2.default,
                aten.unique_consecutive.default, aten.unique_dim.default, aten.argwhere.default}


def _bind(func, args, kwargs) -> dict:
    """The op's arguments by name (its schema's defaults filled in)."""
    out = {}
    for k, a in enumerate(func._schema.arguments):
        if k < len(args) and not a.kwarg_only:
            out[a.name] = args[k]
        elif a.name in kwargs:
            out[a.name] = kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
    return out


def _is_meta(x) -> bool:
    return isinstance(x, torch.Tensor) and x.is_meta


class Shadows:
    """Shadow values by storage id; ``sid_of`` gives a meta tensor's storage id."""

    def __init__(self, sid_of: Callable[[torch.Tensor], int], max_elements: int = MAX_SHADOW_ELEMENTS):
        self.sid_of = sid_of
        self.max_elements = max_elements
        self._flat: dict[int, torch.Tensor] = {}
        self._pending: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.notes: Counter = Counter()

    # -- storage of values ---------------------------------------------------------------
    def value(self, t: torch.Tensor) -> torch.Tensor | None:
        """The CPU value of meta tensor ``t``, or None where it is not known."""
        flat = self._flat.get(self.sid_of(t))
        if flat is None or flat.dtype != t.dtype:
            return None
        try:
            return flat.as_strided(t.shape, t.stride(), t.storage_offset())
        except RuntimeError:   # a view outside what the shadow holds
            return None

    def set(self, t: torch.Tensor, value: torch.Tensor) -> None:
        sid = self.sid_of(t)
        n = t.untyped_storage().nbytes() // max(1, t.element_size())
        if n > self.max_elements or value.shape != t.shape:
            self._flat.pop(sid, None)
            return
        flat = self._flat.get(sid)
        if flat is None or flat.dtype != t.dtype or flat.numel() != n:
            flat = self._flat[sid] = torch.zeros(n, dtype=t.dtype)
        flat.as_strided(t.shape, t.stride(), t.storage_offset()).copy_(value)

    def forget(self, sid: int) -> None:
        self._flat.pop(sid, None)

    def known(self, tensors) -> bool:
        return all(self.value(t) is not None for t in tensors)

    def _cpu(self, tree):
        """``tree`` with each meta tensor replaced by its value and meta devices by cpu."""
        def f(x):
            if _is_meta(x):
                return self.value(x)
            if isinstance(x, torch.device) and x.type == "meta":
                return torch.device("cpu")
            return x
        return tree_map(f, tree)

    def _small(self, tensors) -> bool:
        return all(t.numel() <= self.max_elements for t in tensors)

    # -- after an op -----------------------------------------------------------------------
    def after(self, func, args, kwargs, out, written: list[torch.Tensor]) -> None:
        """Give ``out``'s meta tensors (and the meta tensors ``func`` wrote) their values where
        they can be known; forget the values of written storages otherwise."""
        ins = [x for x in tree_flatten((args, kwargs))[0] if _is_meta(x)]
        outs = [x for x in tree_flatten(out)[0] if _is_meta(x)]
        if not outs and not written:
            return
        if func in _INDEX_OUTPUTS and not self.known(ins[:1]) and self._small(outs):
            self._deal(func, args, kwargs, out)
            return
        if (func in _ALL_FALSE or func in _ALL_TRUE) and not self.known(ins) and self._small(outs):
            self.notes["isnan/isinf of unknown values taken as all False (isfinite: all True)"] += 1
            self.set(outs[0], torch.full(outs[0].shape, func in _ALL_TRUE, dtype=torch.bool))
            return
        if ins and self.known(ins) and self._small(outs):
            try:
                res = func(*self._cpu(args), **self._cpu(kwargs))
            except Exception:   # an op the CPU will not run on these values: they are unknown
                res = None
            if res is not None:
                for m, v in zip(tree_flatten(out)[0], tree_flatten(res)[0]):
                    if _is_meta(m) and isinstance(v, torch.Tensor):
                        self.set(m, v)
                return
        if not ins and outs and self._small(outs) and not any(t.dtype.is_floating_point for t in outs):
            # an integer or boolean factory (arange, zeros, full, randint): its value is known
            try:
                res = func(*self._cpu(args), **self._cpu(kwargs))
                for m, v in zip(tree_flatten(out)[0], tree_flatten(res)[0]):
                    if _is_meta(m) and isinstance(v, torch.Tensor):
                        self.set(m, v)
                return
            except Exception:
                pass
        for t in written + outs:
            self.forget(self.sid_of(t))

    def _deal(self, func, args, kwargs, out) -> None:
        """Round-robin routing for the index output of ``func`` over unknown scores."""
        x = args[0]
        i = _INDEX_OUTPUTS[func]
        idx = tree_flatten(out)[0][i] if i else out
        if not _is_meta(idx):
            return
        dim = _bind(func, args, kwargs).get("dim")
        if dim is None:   # argmax over everything: one index
            self.set(idx, torch.zeros(idx.shape, dtype=idx.dtype))
            return
        dim = dim % max(1, x.dim())
        R = x.shape[dim] if x.dim() else 1
        shape = list(idx.shape)
        if len(shape) != x.dim():   # argmax/max without keepdim dropped the dim
            shape.insert(dim, 1)
        k = shape[dim]
        rows = math.prod(shape) // max(1, k)
        if func in (aten.sort.default, aten.sort.stable):
            vals = torch.arange(k).repeat(rows, 1)          # unknown order: identity permutation
        else:
            vals = torch.arange(rows * k).reshape(rows, k) % max(1, R)
            self.notes["routing of unknown scores taken as uniform (round robin)"] += 1
        moved = shape[:dim] + shape[dim + 1:] + [k]
        vals = vals.reshape(moved).movedim(-1, dim).reshape(idx.shape).to(idx.dtype)
        self.set(idx, vals)

    # -- ops whose output size depends on values -----------------------------------------
    def dynamic(self, func, args, kwargs):
        """Run a data-dependent-size op on meta tensors: on the values where known, else at
        its upper bound; CaptureError for one that has no upper bound here."""
        ins = [x for x in tree_flatten((args, kwargs))[0] if _is_meta(x)]
        if func in (aten.index.Tensor, aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default):
            return self._bool_index(func, args, kwargs)
        if self.known(ins) and self._small(ins):
            res = func(*self._cpu(args), **self._cpu(kwargs))
            return tree_map(self._meta_like, res)
        self.notes[f"{func.__name__}: output size of unknown values taken at its upper bound"] += 1
        x = args[0]
        n = x.numel()
        empty = lambda shape, dtype: torch.empty(shape, dtype=dtype, device="meta")  # noqa: E731
        if func in (aten.nonzero.default, aten.argwhere.default):
            return empty((n, x.dim()), torch.long)
        if func is aten.masked_select.default:
            return empty((torch.broadcast_shapes(x.shape, args[1].shape).numel(),), x.dtype)
        if func is aten._unique2.default:
            inverse = len(args) > 2 and args[2] or kwargs.get("return_inverse", False)
            counts = len(args) > 3 and args[3] or kwargs.get("return_counts", False)
            return (empty((n,), x.dtype), empty(x.shape if inverse else (0,), torch.long),
                    empty((n,) if counts else (0,), torch.long))
        if func is aten.unique_consecutive.default:
            return (empty((n,), x.dtype), empty(x.shape, torch.long), empty((n,), torch.long))
        if func is aten.unique_dim.default:
            d = args[1] % x.dim()
            return (x.new_empty(x.shape), empty((x.shape[d],), torch.long), empty((x.shape[d],), torch.long))
        raise CaptureError(f"{func.__name__}: its output size depends on tensor values the capture "
                           "cannot know (meta tensors have none)")

    def _meta_like(self, v):
        if not isinstance(v, torch.Tensor):
            return v
        m = torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
        self._pending.append((m, v))
        return m

    def take_pending(self) -> list:
        """Values of meta tensors made by :meth:`dynamic` (set once their storages have ids)."""
        out, self._pending = self._pending, []
        return out

    def _bool_index(self, func, args, kwargs):
        """Indexing with boolean masks: each mask becomes the long indices of its True elements
        (known, or every element where the mask is unknown), as PyTorch itself expands it."""
        indices = list(args[1])
        new = []
        for ix in indices:
            if ix is None or ix.dtype not in (torch.bool, torch.uint8):
                new.append(ix)
                continue
            v = self.value(ix) if _is_meta(ix) else ix
            if v is None:
                self.notes[f"{func.__name__}: boolean mask of unknown values taken as all True"] += 1
                nz = None
                count = ix.numel()
            else:
                nz = v.bool().nonzero()
                count = nz.shape[0]
            for d in range(ix.dim()):
                m = torch.empty((count,), dtype=torch.long, device="meta")
                if nz is not None:
                    self._pending.append((m, nz[:, d].clone()))
                new.append(m)
        return func(args[0], new, *args[2:], **kwargs)

    # -- host reads --------------------------------------------------------------------------
    def scalar(self, t: torch.Tensor):
        """``t.item()`` for a one-element meta tensor."""
        v = self.value(t)
        if v is not None:
            return v.reshape(()).item()
        self.notes[".item()/bool() of an unknown value read as 1"] += 1
        if t.dtype == torch.bool:
            return True
        return 1.0 if t.dtype.is_floating_point or t.dtype.is_complex else 1

    def to_host(self, t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A CPU copy of meta tensor ``t``: its value, or ones (no memory: one element expanded)."""
        dtype = dtype or t.dtype
        v = self.value(t)
        if v is not None:
            return v.to(dtype).clone()
        self.notes[".cpu()/.tolist() of unknown values read as ones"] += 1
        return torch.ones((), dtype=dtype).expand(t.shape)
