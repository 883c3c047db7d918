"""A captured step as a umctl :class:`~umctl.workload.workload.Workload`: the steady training
step, repeated, in managed memory laid out by PyTorch's caching allocator.

The capture logs the program from its first allocation: building the model, the warm-up
step(s) and the step kept (the last: by then gradients and optimizer state exist, as in every
later step). Replaying that history through :class:`~.allocator.CachingAllocator` gives the
segments and the address of every block in the kept step. To run it again the way the next
iteration would, the tensors a step hands to the next are followed: a storage allocated in the
step and still alive at its end (a gradient under ``zero_grad(set_to_none=True)``, a kept loss)
plays, one iteration later, the part of the storage from before the step that the step freed
(matched by size, in allocation order). Each repetition runs through the allocator on the
state the previous one left, so the plan reaches the steady state a real run reaches, and a
program that keeps something every step grows as it would.

Every segment is one managed allocation (``umctl run --managed`` turns cudaMalloc into
cudaMallocManaged); a segment that holds data when the kept step starts (weights, optimizer
state) starts on the host, as weights loaded by a script do. Every block the allocator hands
out is BLOCK_ACTIVE, every block it takes back BLOCK_INACTIVE (its whole pages only: a page it
shares with a live block keeps its data), as DeepUM's allocator hooks see them.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from ...events.schema import AllocOp
from ...units import PAGE_SHIFT, PAGE_SIZE
from ..families.common import grid_for
from ..workload import Buffer, Init, Workload, WorkloadBuilder
from .allocator import CachingAllocator, Placement, round_size
from .cost import KernelCost
from .recorder import ALLOC, FREE, OP, SYNC, CaptureLog, OpRecord


@dataclass(frozen=True)
class _Planned:
    kind: str           # "segment", "active", "inactive", "op", "sync"
    value: object
    rep: int


def _roles(log: CaptureLog) -> tuple[list[tuple[int, object]], set[int], dict[int, int]]:
    """The kept step's events, the storages it allocates, and carried-in -> carried-out pairs."""
    s0, s1 = log.step_starts[-1], log.end
    step = log.events[s0:s1]
    born = {sid for kind, sid in step if kind == ALLOC}
    freed = [sid for kind, sid in step if kind == FREE]
    carried_in = sorted(sid for sid in set(freed) if sid not in born)
    carried_out = sorted(sid for sid in born if sid not in set(freed))
    by_size_in: dict[int, list[int]] = defaultdict(list)
    for sid in carried_in:
        by_size_in[log.storages[sid].nbytes].append(sid)
    pair: dict[int, int] = {}
    for sid in carried_out:
        q = by_size_in.get(log.storages[sid].nbytes)
        if q:
            pair[q.pop(0)] = sid
    return step, born, pair


def plan(log: CaptureLog, iterations: int) -> tuple[CachingAllocator, list[_Planned], dict, dict]:
    """Run the allocator over the history and ``iterations`` repetitions of the kept step.
    Returns the allocator, the planned events of the repetitions, every allocation's placement
    (by (sid, repetition)) and figures of the kept step."""
    if not log.step_starts:
        raise ValueError("the capture has no step")
    s0 = log.step_starts[-1]
    step, born, pair = _roles(log)
    alloc = CachingAllocator()
    where: dict[tuple[int, int], Placement] = {}
    # a zero-byte storage gets no block from PyTorch's allocator (nor a kernel's access)
    empty = {s.sid for s in log.storages if s.nbytes == 0}
    for kind, sid in log.events[:s0]:
        if kind in (ALLOC, FREE) and sid in empty:
            continue
        if kind == ALLOC:
            where[(sid, 0)], _ = alloc.malloc((sid, 0), log.storages[sid].nbytes)
        elif kind == FREE and (sid, 0) in alloc.live:
            alloc.free((sid, 0))
    n_history_segments = len(alloc.segments)
    live_at_start = dict(alloc.live)
    persistent = sum(p.size for p in live_at_start.values())

    def key(sid: int, r: int) -> tuple[int, int]:
        if r == 0 or not (sid in born or sid in pair):
            return (sid, 0)
        return (sid, r) if sid in born else (pair[sid], r - 1)

    planned: list[_Planned] = []
    peak_step = 0
    for r in range(iterations):
        alloc.peak_allocated = alloc.allocated
        for kind, v in step:
            if kind in (ALLOC, FREE) and v in empty:
                continue
            if kind == ALLOC:
                k = key(v, r)
                p, new_seg = alloc.malloc(k, log.storages[v].nbytes)
                where[k] = p
                if new_seg:
                    planned.append(_Planned("segment", p.segment, r))
                planned.append(_Planned("active", p, r))
            elif kind == FREE:
                k = key(v, r)
                if k in alloc.live and (r == 0 or v in born or v in pair):
                    planned.append(_Planned("inactive", alloc.free(k), r))
            elif kind == OP:
                planned.append(_Planned("op", (v, r), r))
            elif kind == SYNC:
                planned.append(_Planned("sync", None, r))
        if r == 0:
            peak_step = alloc.peak_allocated
    stats = {"n_history_segments": n_history_segments, "persistent_bytes": persistent,
             "peak_allocated": peak_step, "live_at_start": live_at_start, "key": key}
    return alloc, planned, where, stats


def _inner(seg: Buffer, p: Placement) -> Buffer | None:
    """The whole pages of a block (what may be invalidated without touching a neighbour)."""
    lo = seg.addr + p.offset
    a = (lo + PAGE_SIZE - 1) // PAGE_SIZE * PAGE_SIZE
    b = (lo + p.size) // PAGE_SIZE * PAGE_SIZE
    return Buffer(seg.alloc_id, a, b - a, seg.name, seg.pid) if b > a else None


def _merge(ranges: list[tuple[int, int]]) -> list[range]:
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [range(lo, hi) for lo, hi in out]


def build_workload(log: CaptureLog, *, name: str, gpu_mem: int, iterations: int = 3,
                   cost: KernelCost, meta: dict | None = None) -> Workload:
    """The workload of ``iterations`` steady steps on a GPU of ``gpu_mem`` bytes; ``cost``
    times the kernels; ``meta`` is stored with it (the capture's settings)."""
    if iterations < 1:
        raise ValueError("iterations must be at least 1")
    alloc, planned, where, st = plan(log, iterations)
    key = st["key"]
    b = WorkloadBuilder(name, gpu_mem=int(gpu_mem))
    holding = {p.segment for p in st["live_at_start"].values()}
    segs: dict[int, Buffer] = {}

    def segment(i: int, init: Init) -> None:
        s = alloc.segments[i]
        segs[i] = b.alloc(f"{'small' if s.small else 'large'}_segment_{i}", s.size, init=init, emit=True)

    for i in range(st["n_history_segments"]):
        segment(i, Init.HOST if i in holding else Init.UNTOUCHED)
    compute_ns = 0
    flops = 0.0
    kernels = 0
    by_rep: dict[int, list[_Planned]] = defaultdict(list)
    for ev in planned:
        by_rep[ev.rep].append(ev)
    for r in range(iterations):
        b.iteration = r
        for ev in by_rep[r]:
            if ev.kind == "segment":
                segment(ev.value, Init.UNTOUCHED)
            elif ev.kind in ("active", "inactive"):
                buf = _inner(segs[ev.value.segment], ev.value)
                if buf is not None:
                    b.mem(AllocOp.BLOCK_ACTIVE if ev.kind == "active" else AllocOp.BLOCK_INACTIVE, buf)
            elif ev.kind == "sync":
                b.sync(0)
            else:
                rec, _ = ev.value
                ns = _kernel(b, rec, r, key, where, segs, cost)
                if r == 0:
                    compute_ns += ns
                    flops += rec.flops
                    kernels += 1
        b.sync(0)   # each iteration ends on a synchronisation (the next one's data loading)
    w = b.build()
    info = dict(meta or {})
    sizes = {sid: round_size(s.nbytes) if s.nbytes else 0 for sid, s in enumerate(log.storages)}
    start = {k[0] for k in st["live_at_start"]}
    end = {sid for sid, s in enumerate(log.storages) if not s.freed}
    params = sum(sizes[s] for s in log.params)
    grads = sum(sizes[s] for s in log.grads - log.params)
    kept = sum(sizes[s] for s in (start & end) - log.params - log.grads)   # optimizer state, buffers
    info.update(
        footprint={"reserved": int(alloc.reserved), "segments": len(alloc.segments),
                   "peak_allocated": int(st["peak_allocated"]), "parameters": int(params), "gradients": int(grads),
                   "optimizer_state": int(kept),
                   "activations_peak": max(0, int(st["peak_allocated"] - params - grads - kept))},
        kernels_per_iteration=kernels, flops_per_iteration=flops, compute_ns_per_iteration=int(compute_ns),
        iterations=iterations, assumptions=dict(log.notes), has_model=bool(getattr(log, "has_model", True)),
    )
    w.meta.update(info)
    w.meta["footprint_oversub"] = w.peak_managed_bytes / max(1, int(gpu_mem))
    return w


def _kernel(b: WorkloadBuilder, rec: OpRecord, r: int, key, where, segs, cost: KernelCost) -> int:
    def pages(spans):
        out, args, nbytes = [], [], 0
        for sid, lo, hi in spans:
            p = where.get(key(sid, r))
            if p is None:
                continue
            a = segs[p.segment].addr + p.offset + lo
            out.append((a >> PAGE_SHIFT, ((a + hi - lo - 1) >> PAGE_SHIFT) + 1))
            args.append((a, hi - lo))
            nbytes += hi - lo
        return _merge(out), args, nbytes

    rp, ra, rb = pages(rec.reads)
    wp, wa, wb = pages(rec.writes)
    ns = cost.ns(rec.flops, rb + wb, rec.kind, rec.dtype)
    parts = [(x, False) for x in rp] + [(x, True) for x in wp]
    b.kernel(rec.name, pages=parts, compute_ns=ns, args=tuple(ra + wa),
             grid=grid_for(rec.out_elements, 16384 if rec.kind != "other" else 1024), block=(256, 1, 1))
    return ns
