"""Turn a trace file into the access stream the simulator replays.

Two kinds of trace carry accesses:

* scripted traces have ACCESS events: the complete page-access stream, grouped into kernels by
  ``seq`` (LAUNCH records with the same ``seq`` give the kernel's name and identity);
* recorded traces only have the GPU faults the driver saw. The faulted pages stand in for the
  accesses: a page that did not fault was resident, so replaying the faults under the recorded
  capacity reproduces the run's paging, but under a different policy or capacity the replay
  cannot know about accesses that hit in the original run. That is the price of recording
  what the UVM tools API exposes.

Everything here is columnar (traces hold millions of faults); the only Python loops run per
GPU, per unmatched kernel-function or per allocation.
"""

from __future__ import annotations

import numpy as np

from .. import UmctlError
from ..events.schema import Access, AllocOp, Cause, Kind, empty
from ..events.trace import Trace, TraceError
from ..units import BLOCK_SHIFT, BLOCK_SIZE, PAGE_SHIFT, PAGE_TO_BLOCK_SHIFT, PAGES_PER_BLOCK, parse_size
from .workload import ALLOCATION_DTYPE, OP_DTYPE, Init, OpType, Workload, exec_hash

#: Name of the kernel that carries faults seen before a GPU's first recorded launch (the
#: launch probe attached late, or the faults came from host-initiated prefetch).
BEFORE_FIRST_LAUNCH = "<before first launch>"
#: Name of a kernel that has ACCESS events but no LAUNCH record with its seq.
NO_LAUNCH_RECORD = "<no launch record>"
#: A kernel without a recorded end is taken to run until the next launch on its GPU, but
#: never longer than this: a long idle gap (host work, a pause) is not kernel time.
MAX_INFERRED_COMPUTE_NS = 1_000_000_000

_KERNEL_DTYPE = np.dtype([
    ("t_ns", np.int64), ("gpu", np.int16), ("pid", np.int32), ("exec_hash", np.uint64),
    ("name_id", np.int32), ("compute_ns", np.int64), ("acc_lo", np.int64), ("acc_hi", np.int64),
    ("grid", np.uint32, (3,)), ("block", np.uint32, (3,)), ("atomics", np.bool_),
])

# Order of operations that share a timestamp: memory must exist before a kernel uses it and be
# released after; copies feed the kernel launched with them.
_PRIO_ACQUIRE, _PRIO_COPY, _PRIO_KERNEL, _PRIO_RELEASE, _PRIO_HOST = 0, 1, 2, 3, 4


class _Names:
    """The workload's name table: the trace's names, plus names this module makes up."""

    def __init__(self, names: list[str]):
        self.names = list(names)
        self._index = {n: i for i, n in enumerate(self.names)}

    def id(self, name: str) -> int:
        if name not in self._index:
            self._index[name] = len(self.names)
            self.names.append(name)
        return self._index[name]


def workload_from_trace(trace: Trace, *, gpu_mem: int | None = None, oversub: float | None = None,
                        span: tuple[int, int] | None = None) -> Workload:
    """The workload a trace describes, for the simulator to replay.

    Kernel ``compute_ns`` is LAUNCH ``t_end_ns - t_ns`` where the end was recorded, else the
    gap to the next launch on that GPU (at most :data:`MAX_INFERRED_COMPUTE_NS`). In recorded
    fault traces both include the time the kernel stalled on faults, which the simulator adds
    again from its own model; so the fault batches serviced during a kernel (REPLAY
    ``t_start_ns .. t_ns``) are subtracted from it.

    CPU faults (the host touching managed memory) become host operations between kernels:
    see :class:`_Bursts`.

    GPU capacity: ``gpu_mem`` bytes per GPU if given; else each GPU's footprint (distinct 2 MiB
    blocks it touches, since the driver backs and evicts memory in 2 MiB chunks) divided by
    ``oversub``; else what the trace metadata says (see :func:`_recorded_gpu_mem`); else
    TraceError.

    ``span`` (CLOCK_MONOTONIC ns, the clock of every trace) replays only that part of the
    recording, by default the trace metadata's ``measured_span_ns`` when it has one: the span a
    program timed itself over (benchmarks/gpu/workloads/wl_*.py print theirs), so a replay compares with the
    program's own measurement and not with its start-up (CUDA, cuBLAS and module loading before
    the span) or its exit (allocator frees after it). Events outside the span are left out,
    except allocations made before it (still live in it); the last kernel runs until the span's
    end at most, and the host time from the span's start to its first GPU work comes first.
    """
    if span is None:
        span = _meta_span(trace.meta)
    ev = _SpanEvents(trace, span)
    counts = {k: len(ev(k)) for k in (Kind.ACCESS, Kind.FAULT)}
    names = _Names(trace.names)
    launches = np.sort(ev(Kind.LAUNCH), order="t_ns", kind="stable")
    t_end = trace.time_span_ns()[1] if span is None else int(span[1])
    acc_batch = None
    if counts[Kind.ACCESS]:
        kernels, acc_page, acc_write = _from_accesses(ev(Kind.ACCESS), launches, names, t_end)
        derived_from = "access events"
    elif counts[Kind.FAULT]:
        faults = ev(Kind.FAULT)
        derived_from = "fault events"
        if complete_accesses(trace.meta):
            faults = _with_migrated_pages(faults, ev(Kind.MIGRATION))
            derived_from = "fault and migration events"
        kernels, acc_page, acc_write, acc_batch = _from_faults(faults, launches, names, t_end)
    else:
        raise TraceError(f"{trace.path}: nothing to replay (the trace has no access or fault events"
                         f"{' in its measured span' if span is not None else ''})")
    # which blocks a GPU had faulted before each CPU fault: the whole recording counts, a span
    # may start with data a GPU faulted in before it
    gpu_first = _first_gpu_fault(trace.events(Kind.FAULT) if counts[Kind.FAULT] else ev(Kind.ACCESS))
    bursts = _host_bursts(ev(Kind.CPU_FAULT), kernels, launches, len(acc_page), gpu_first)
    if bursts is not None and acc_batch is not None:
        acc_page, acc_write, acc_batch = _reread_after_bursts(kernels, acc_page, acc_write, acc_batch, bursts)
        bursts = _host_bursts(ev(Kind.CPU_FAULT), kernels, launches, len(acc_page), gpu_first)
    if bursts is not None:
        _cap_at_bursts(kernels, launches, bursts)
    if derived_from != "access events":
        # after the cap: a kernel's time is its launch-to-next-event gap less the batches
        # serviced in it (subtracting first and capping after lost the stall of a kernel the
        # host waited for before a burst: the gemm's cold 4096 GEMM kept its 21.9 ms twice)
        _subtract_recorded_stalls(kernels, ev(Kind.REPLAY))
    if bursts is not None:
        acc_page = np.concatenate([acc_page, bursts.pages])
        acc_write = np.concatenate([acc_write, np.ones(len(bursts.pages), np.bool_)])
        if acc_batch is not None:
            acc_batch = np.concatenate([acc_batch, np.full(len(bursts.pages), -1, np.int64)])

    alloc_events = np.sort(ev(Kind.ALLOC), order="t_ns", kind="stable")
    copies = ev(Kind.COPY)
    acc_pid = np.repeat(kernels["pid"], kernels["acc_hi"] - kernels["acc_lo"])
    if bursts is not None:
        acc_pid = np.concatenate([acc_pid, bursts.page_pid])
    allocations = _allocations(alloc_events, acc_page, acc_pid, names)
    if counts[Kind.FAULT]:
        n_recorded = int((alloc_events["op"] == AllocOp.ALLOC).sum())   # _allocations puts them first
        _zero_filled(allocations[:n_recorded], trace.events(Kind.FAULT), trace.events(Kind.CPU_FAULT),
                     trace.events(Kind.COPY), since=None if span is None else int(span[0]))
    ops = _program_order(kernels, alloc_events, allocations, copies, bursts)
    if span is not None:
        ops = _lead_in(ops, span, kernels, copies, bursts)

    gpu_cols = [kernels["gpu"], copies["gpu"]]
    n_gpus = max(1, max((int(g.max()) + 1 for g in gpu_cols if len(g)), default=1))
    footprint = _footprint_per_gpu(kernels, acc_page, n_gpus)
    capacity, capacity_from = _capacity(trace, n_gpus, footprint, gpu_mem, oversub)

    meta = dict(trace.meta)
    scenario = meta.get("scenario")
    if isinstance(scenario, dict):
        scenario = scenario.get("name")
    params = meta.get("params")
    meta.update(source=str(trace.path), derived_from=derived_from, capacity_from=capacity_from,
                footprint_bytes=footprint)
    if span is not None:
        meta["replayed_span_ns"] = [int(span[0]), int(span[1])]
    w = Workload(
        name=scenario if isinstance(scenario, str) and scenario else trace.path.stem,
        ops=ops, acc_page=acc_page, acc_write=acc_write, allocations=allocations, names=names.names,
        n_gpus=n_gpus, gpu_mem=capacity, params=dict(params) if isinstance(params, dict) else {}, meta=meta,
        acc_win=None if acc_batch is None else _batch_windows(acc_batch, kernels),
    )
    try:
        w.validate()
    except ValueError as e:
        raise TraceError(f"{trace.path}: cannot replay this trace ({e})") from e
    return w


# -- the measured span ----------------------------------------------------------------------

#: Trace metadata key: [t0, t1] CLOCK_MONOTONIC ns, the span the recorded program measured.
SPAN_META_KEY = "measured_span_ns"


def _meta_span(meta: dict) -> tuple[int, int] | None:
    v = meta.get(SPAN_META_KEY)
    if v is None:
        return None
    if (not isinstance(v, list) or len(v) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in v)
            or v[1] <= v[0]):
        raise TraceError(f"{SPAN_META_KEY} in the trace metadata must be [t0, t1] in ns with t0 < t1 (got {v!r})")
    return int(v[0]), int(v[1])


class _SpanEvents:
    """A trace's events of one kind, cut to a span: every kind by its ``t_ns``, except that
    allocator events from before the span stay (what was allocated then is live in it)."""

    def __init__(self, trace: Trace, span: tuple[int, int] | None):
        self.trace, self.span = trace, span
        if span is not None and not span[0] < span[1]:
            raise UmctlError(f"replay span must have t0 < t1 (got {span[0]}, {span[1]})")

    def __call__(self, kind: Kind) -> np.ndarray:
        e = self.trace.events(kind)
        if self.span is None or len(e) == 0:
            return e
        keep = e["t_ns"] <= self.span[1]
        if kind != Kind.ALLOC:
            keep &= e["t_ns"] >= self.span[0]
        return e[keep]


def _lead_in(ops: np.ndarray, span: tuple[int, int], kernels: np.ndarray, copies: np.ndarray,
             bursts: "_Bursts | None") -> np.ndarray:
    """Prepend the host time from the span's start to its first GPU work (a kernel launch, a
    copy, a host burst): the program's set-up inside the span (building a model on the CPU,
    say), which no recorded event carries."""
    firsts = [a.min() for a in (kernels["t_ns"], copies["t_ns"], bursts.t0 if bursts is not None else None)
              if a is not None and len(a)]
    lead = int(min(firsts)) - int(span[0]) if firsts else 0
    if lead <= 0:
        return ops
    h = np.zeros(1, dtype=OP_DTYPE)
    h["type"], h["gpu"], h["compute_ns"], h["name_id"], h["alloc_id"] = OpType.HOST, -1, lead, -1, -1
    h["grid"] = h["block"] = 1
    if len(ops):
        h["pid"] = ops["pid"][0]
    return np.concatenate([h, ops])


# -- kernels and their accesses -------------------------------------------------------------

def _launch_compute_ns(launches: np.ndarray, t_end: int) -> np.ndarray:
    """Per launch (launches sorted by time): recorded duration, or the gap to the next launch
    on the same GPU (the trace's end for the last one), capped."""
    n = len(launches)
    dur = launches["t_end_ns"] - launches["t_ns"]
    order = np.lexsort((np.arange(n), launches["gpu"]))  # by GPU, time order kept within
    t = launches["t_ns"][order]
    g = launches["gpu"][order]
    nxt = np.full(n, t_end, dtype=np.int64)
    same = g[1:] == g[:-1]
    nxt[:-1][same] = t[1:][same]
    gap = np.empty(n, dtype=np.int64)
    gap[order] = nxt - t
    out = np.where((launches["t_end_ns"] > 0) & (dur > 0), dur, gap)
    return np.clip(out, 0, MAX_INFERRED_COMPUTE_NS)


def _subtract_recorded_stalls(kernels: np.ndarray, replays: np.ndarray) -> None:
    """Take the recorded fault-batch service time out of each kernel's compute time, in place.
    A batch belongs to the kernel running on its GPU when the batch began; the driver services
    one GPU's batches one after another, so their sum never exceeds the kernel's time (clipped
    at zero where timestamps disagree)."""
    if len(replays) == 0 or len(kernels) == 0:
        return
    dur = np.maximum(replays["t_ns"] - replays["t_start_ns"], 0).astype(np.float64)
    for g in np.unique(kernels["gpu"]):
        ks = np.flatnonzero(kernels["gpu"] == g)
        ks = ks[np.argsort(kernels["t_ns"][ks], kind="stable")]
        on = replays["gpu"] == g
        owner = np.searchsorted(kernels["t_ns"][ks], replays["t_start_ns"][on], side="right") - 1
        ok = owner >= 0
        stall = np.bincount(owner[ok], weights=dur[on][ok], minlength=len(ks)).astype(np.int64)
        kernels["compute_ns"][ks] = np.maximum(kernels["compute_ns"][ks] - stall, 0)


def _kernels_from_launches(launches: np.ndarray, names: _Names, t_end: int) -> np.ndarray:
    k = np.zeros(len(launches), dtype=_KERNEL_DTYPE)
    for f in ("t_ns", "gpu", "pid", "exec_hash", "name_id", "grid", "block"):
        k[f] = launches[f]
    k["compute_ns"] = _launch_compute_ns(launches, t_end)
    # Launches whose name the recorder could not resolve are named after their function.
    bad = (k["name_id"] < 0) | (k["name_id"] >= len(names.names))
    if bad.any():
        funcs, inverse = np.unique(launches["func"][bad], return_inverse=True)
        ids = np.array([names.id(f"func 0x{int(f):x}") for f in funcs], dtype=np.int32)
        k["name_id"][bad] = ids[inverse]
    return k


def _synthetic_kernels(name: str, t_ns: np.ndarray, gpu: np.ndarray, pid: np.ndarray, names: _Names,
                       seq: np.ndarray | None = None) -> np.ndarray:
    k = np.zeros(len(t_ns), dtype=_KERNEL_DTYPE)
    k["t_ns"], k["gpu"], k["pid"] = t_ns, gpu, pid
    k["name_id"] = names.id(name)
    k["exec_hash"] = exec_hash(name) if seq is None else [exec_hash(name, (int(s),)) for s in seq]
    k["grid"] = k["block"] = 1
    return k


def _is_write(access: np.ndarray) -> np.ndarray:
    return (access == Access.WRITE) | (access == Access.ATOMIC)


def _from_accesses(acc: np.ndarray, launches: np.ndarray, names: _Names, t_end: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scripted trace: kernels are the seq values (in seq order), each with its accesses in
    file order; LAUNCH records with the same seq supply identity and duration."""
    order = np.argsort(acc["seq"], kind="stable")
    acc = acc[order]
    seqs, first = np.unique(acc["seq"], return_index=True)
    launch_seq, launch_first = np.unique(launches["seq"], return_index=True)
    all_seqs = np.union1d(seqs, launch_seq)  # a launch without accesses still takes time

    kernels = np.zeros(len(all_seqs), dtype=_KERNEL_DTYPE)
    launched = np.isin(all_seqs, launch_seq)
    if launched.any():
        kernels[launched] = _kernels_from_launches(launches, names, t_end)[launch_first]
    missing = ~launched  # only possible for seqs that have accesses
    if missing.any():
        src = first[np.searchsorted(seqs, all_seqs[missing])]
        t_first = np.minimum.reduceat(acc["t_ns"], first)[np.searchsorted(seqs, all_seqs[missing])]
        kernels[missing] = _synthetic_kernels(NO_LAUNCH_RECORD, t_first, acc["gpu"][src], acc["pid"][src],
                                              names, seq=all_seqs[missing])
    kernels["acc_lo"] = np.searchsorted(acc["seq"], all_seqs, side="left")
    kernels["acc_hi"] = np.searchsorted(acc["seq"], all_seqs, side="right")
    atomic = acc["access"] == Access.ATOMIC
    has = kernels["acc_hi"] > kernels["acc_lo"]
    if has.any():
        kernels["atomics"][has] = np.logical_or.reduceat(atomic, kernels["acc_lo"][has])
    return kernels, (acc["addr"] >> np.uint64(PAGE_SHIFT)).astype(np.int64), _is_write(acc["access"])


def complete_accesses(meta: dict) -> bool:
    """Whether the trace was recorded with ``umctl run --complete-accesses`` (all managed
    memory sent home after every kernel)."""
    rt = meta.get("runtime") if isinstance(meta, dict) else None
    return bool(isinstance(rt, dict) and rt.get("complete_accesses"))


def _with_migrated_pages(faults: np.ndarray, migrations: np.ndarray) -> np.ndarray:
    """A --complete-accesses recording's faults plus one read "fault" per page the driver moved
    onto a GPU for them (demand or its density prefetcher), in time order.

    Why: every kernel of such a run starts with nothing on the GPU, so what migrates onto it
    while the kernel runs is what the kernel touches, whereas the faults are only the pages
    touched before the prefetcher brought the rest of their region: measured on Hugging Face
    GPT-2 (H200), the faulted pages were about a tenth of the 40 GB a step moved, and a replay
    of the faults alone moved half of what the capture of the same step did. The prefetcher
    may also bring pages the kernel does not touch (at most the rest of a region it found
    more than half used). Each added page takes the batch of its GPU's latest fault before
    the migration (the batch it served)."""
    gpu_in = (migrations["dst"] >= 0) & np.isin(migrations["cause"], (Cause.DEMAND, Cause.DRIVER_PREFETCH))
    m = migrations[gpu_in]
    if not len(m):
        return faults
    first = (m["addr"] >> np.uint64(PAGE_SHIFT)).astype(np.int64)
    last = ((m["addr"] + np.maximum(m["bytes"], 1) - np.uint64(1)) >> np.uint64(PAGE_SHIFT)).astype(np.int64)
    n = last - first + 1
    rep = np.repeat(np.arange(len(m)), n)
    offs = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
    add = empty(Kind.FAULT, len(rep))
    add["t_ns"], add["gpu"], add["pid"] = m["t_ns"][rep], m["dst"][rep], m["pid"][rep]
    add["addr"] = ((first[rep] + offs).astype(np.uint64) << np.uint64(PAGE_SHIFT))
    add["access"] = Access.READ
    add["batch_id"] = -1
    for g in np.unique(add["gpu"]):
        on = np.flatnonzero(faults["gpu"] == g)
        on = on[np.argsort(faults["t_ns"][on], kind="stable")]
        mine = np.flatnonzero(add["gpu"] == g)
        pos = np.searchsorted(faults["t_ns"][on], add["t_ns"][mine], side="right") - 1
        ok = pos >= 0
        add["batch_id"][mine[ok]] = faults["batch_id"][on[pos[ok]]]
    out = np.concatenate([faults, add])
    return out[np.argsort(out["t_ns"], kind="stable")]


def _from_faults(faults: np.ndarray, launches: np.ndarray, names: _Names, t_end: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Recorded trace: each fault belongs to the latest launch on its GPU at or before it; a
    kernel's accesses are its distinct faulted pages in order of first fault, written if any
    of that page's faults was a write (a read fault followed by a write-upgrade fault is one
    written page). Also returns each access's fault batch (that of its first fault)."""
    n_launch = len(launches)
    kernel_of = np.empty(len(faults), dtype=np.int64)
    early_gpus: list[int] = []
    early_t: list[int] = []
    early_pid: list[int] = []
    for g in np.unique(faults["gpu"]):
        on_gpu = np.flatnonzero(faults["gpu"] == g)
        launch_idx = np.flatnonzero(launches["gpu"] == g)
        pos = np.searchsorted(launches["t_ns"][launch_idx], faults["t_ns"][on_gpu], side="right") - 1
        early = pos < 0
        kernel_of[on_gpu[~early]] = launch_idx[pos[~early]]
        if early.any():
            kernel_of[on_gpu[early]] = n_launch + len(early_gpus)
            first = on_gpu[early][np.argmin(faults["t_ns"][on_gpu[early]])]
            early_gpus.append(int(g))
            early_t.append(int(faults["t_ns"][first]))
            early_pid.append(int(faults["pid"][first]))
    early = _synthetic_kernels(BEFORE_FIRST_LAUNCH, np.array(early_t, np.int64), np.array(early_gpus, np.int16),
                               np.array(early_pid, np.int32), names)
    # Like a launch without a recorded end, the faults' unseen work runs until the GPU's first
    # launch: that time passed in the recorded run (copies into managed memory, a kernel
    # launched before the recording, host work before the first launch) and is kept.
    for i, g in enumerate(early_gpus):
        on = launches["t_ns"][launches["gpu"] == g]
        nxt = int(on.min()) if len(on) else t_end
        early["compute_ns"][i] = min(max(nxt - early_t[i], 0), MAX_INFERRED_COMPUTE_NS)
    kernels = np.concatenate([_kernels_from_launches(launches, names, t_end), early])
    # Program order of kernels; synthetic ones precede every launch on their GPU.
    korder = np.argsort(kernels["t_ns"], kind="stable")
    kernels = kernels[korder]
    rank = np.empty(len(kernels), dtype=np.int64)
    rank[korder] = np.arange(len(kernels))
    krank = rank[kernel_of]

    by_time = np.argsort(faults["t_ns"], kind="stable")  # near-linear: faults arrive in time order
    by_time = by_time[np.argsort(krank[by_time], kind="stable")]
    k_s = krank[by_time]
    page_s = (faults["addr"][by_time] >> np.uint64(PAGE_SHIFT)).astype(np.int64)
    write_s = _is_write(faults["access"][by_time])
    atomic_s = faults["access"][by_time] == Access.ATOMIC
    # Group equal (kernel, page) pairs, earliest first, to keep one access per pair. One
    # packed key sorts much faster than a multi-key lexsort (pages are dense-ranked to fit).
    page_values, page_rank = np.unique(page_s, return_inverse=True)
    pair = k_s * len(page_values) + page_rank.reshape(-1)
    grp = np.argsort(pair, kind="stable")
    starts = np.flatnonzero(np.r_[True, pair[grp][1:] != pair[grp][:-1]]) if len(grp) else grp
    keep = np.argsort(grp[starts])
    keep_pos = grp[starts][keep]
    write_any = np.logical_or.reduceat(write_s[grp], starts)[keep] if len(grp) else write_s
    acc_kernel = k_s[keep_pos]
    kid = np.arange(len(kernels))
    kernels["acc_lo"] = np.searchsorted(acc_kernel, kid, side="left")
    kernels["acc_hi"] = np.searchsorted(acc_kernel, kid, side="right")
    kernels["atomics"] = np.bincount(k_s[atomic_s], minlength=len(kernels)) > 0
    return kernels, page_s[keep_pos], write_any, faults["batch_id"][by_time][keep_pos].astype(np.int64)


def _batch_windows(acc_batch: np.ndarray, kernels: np.ndarray) -> np.ndarray:
    """Per access, the accesses from it to the end of its run of one recorded fault batch
    within its kernel (0 where the batch is unknown): the simulator's fault window there."""
    n = len(acc_batch)
    cut = np.zeros(n + 1, np.bool_)
    cut[0] = cut[n] = True
    cut[1:n] |= acc_batch[1:] != acc_batch[:-1]
    edges = np.concatenate([kernels["acc_lo"], kernels["acc_hi"]])
    cut[np.clip(edges, 0, n)] = True
    starts = np.flatnonzero(cut[:n])
    ends = np.append(starts[1:], n)
    run_end = np.repeat(ends, ends - starts)
    win = (run_end - np.arange(n)).astype(np.int32)
    win[acc_batch < 0] = 0
    return win


# -- host writes ----------------------------------------------------------------------------

class _Bursts:
    """The host's touches of managed memory, from CPU_FAULT events: one burst per process and
    gap between two of its kernel launches, each replayed as SYNC (the host only touches pages
    a GPU holds after waiting for it), HOST_WRITE of the burst's distinct pages (the simulator
    charges the CPU-fault cost and takes the pages off the GPUs, so later kernels fault them
    back, as the recorded run did), and HOST for the host time between the burst and the next
    launch. Without them a loop whose host writes its input every step replays with that input
    resident on the GPU after the first step and replays short.

    The HOST_WRITE keeps, as host time (``write_ns``), the recorded time of the burst's CPU
    faults on blocks no GPU had faulted yet: the host's first touch of fresh managed memory (a
    loader filling a buffer), which the driver serves on the CPU alone and the simulator does
    not charge. The faults on blocks a GPU held are left to the simulator's CPU-fault cost, so a
    replay under another policy or capacity still pays for what it left on the GPU. Without it
    a host filling fresh managed memory would replay in no time (docs/evaluation/fidelity-h100.md)."""

    def __init__(self, t0, t1, pid, lo, hi, host_ns, pages, page_pid, write_ns):
        self.t0, self.t1, self.pid, self.lo, self.hi = t0, t1, pid, lo, hi
        self.host_ns, self.pages, self.page_pid, self.write_ns = host_ns, pages, page_pid, write_ns

    def __len__(self) -> int:
        return len(self.t0)


def _first_gpu_fault(faults: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(2 MiB blocks, the time of each one's first GPU fault), blocks sorted."""
    blk = (faults["addr"] >> np.uint64(BLOCK_SHIFT)).astype(np.int64)
    blocks, inv = np.unique(blk, return_inverse=True)
    first = np.full(len(blocks), np.iinfo(np.int64).max, np.int64)
    np.minimum.at(first, inv.reshape(-1), faults["t_ns"])
    return blocks, first


def _first_touch_ns(cpu: np.ndarray, gpu_first: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Per CPU fault (sorted by time within each burst), the time to the next fault of its
    burst if no GPU had faulted its block before it, else 0; a burst's last fault gets 0."""
    blocks, first = gpu_first
    blk = (cpu["addr"] >> np.uint64(BLOCK_SHIFT)).astype(np.int64)
    on_gpu = np.zeros(len(cpu), np.bool_)
    if len(blocks):
        at = np.minimum(np.searchsorted(blocks, blk), len(blocks) - 1)
        on_gpu = (blocks[at] == blk) & (first[at] < cpu["t_ns"])
    gap = np.zeros(len(cpu), np.int64)
    gap[:-1] = np.diff(cpu["t_ns"])
    return np.where(on_gpu, 0, np.maximum(gap, 0))


def _host_bursts(cpu: np.ndarray, kernels: np.ndarray, launches: np.ndarray, acc_base: int,
                 gpu_first: tuple[np.ndarray, np.ndarray]) -> _Bursts | None:
    if len(cpu) == 0:
        return None
    cpu = cpu[np.lexsort((cpu["t_ns"], cpu["pid"]))]
    # burst key: (pid, number of that pid's launches before the fault)
    gap = np.zeros(len(cpu), np.int64)
    next_launch = np.full(len(cpu), -1, np.int64)
    for p in np.unique(cpu["pid"]):
        on = np.flatnonzero(cpu["pid"] == p)
        lt = np.sort(launches["t_ns"][launches["pid"] == p]) if len(launches) else np.zeros(0, np.int64)
        idx = np.searchsorted(lt, cpu["t_ns"][on], side="right")
        gap[on] = idx
        if len(lt):
            next_launch[on] = np.where(idx < len(lt), lt[np.minimum(idx, len(lt) - 1)], -1)
    key_change = np.r_[True, (cpu["pid"][1:] != cpu["pid"][:-1]) | (gap[1:] != gap[:-1])]
    starts = np.flatnonzero(key_change)
    ends = np.r_[starts[1:], len(cpu)]
    page = (cpu["addr"] >> np.uint64(PAGE_SHIFT)).astype(np.int64)
    pages_out: list[np.ndarray] = []
    lo = np.zeros(len(starts), np.int64)
    hi = np.zeros(len(starts), np.int64)
    pos = acc_base
    for i, (a, b) in enumerate(zip(starts.tolist(), ends.tolist())):
        u, first = np.unique(page[a:b], return_index=True)
        u = _fill_host_runs(u)
        pages_out.append(u)
        lo[i], hi[i] = pos, pos + len(u)
        pos += len(u)
    t0 = cpu["t_ns"][starts]
    t1 = cpu["t_ns"][ends - 1]
    nxt = next_launch[ends - 1]
    host_ns = np.where(nxt >= 0, np.clip(nxt - t1, 0, MAX_INFERRED_COMPUTE_NS), 0)
    pages = np.concatenate(pages_out) if pages_out else np.zeros(0, np.int64)
    page_pid = np.repeat(cpu["pid"][starts], hi - lo).astype(np.int32)
    touch = _first_touch_ns(cpu, gpu_first)
    touch[ends - 1] = 0   # a burst's last fault: what follows is the HOST op's time
    write_ns = np.add.reduceat(touch, starts) if len(starts) else np.zeros(0, np.int64)
    return _Bursts(t0, t1, cpu["pid"][starts], lo, hi, host_ns, pages, page_pid, write_ns)


#: The driver's density threshold (uvm_perf_prefetch_threshold, 51 %) and its smallest
#: migration region on the CPU fault path (64 KiB: benchmarks/gpu/fidelity_real.py's probe,
#: 476 scattered CPU faults on GPU-resident memory moved 31.1 MiB, 65 KiB each).
_CPU_DENSITY = 0.51
_CPU_REGION_PAGES = 16


def _fill_host_runs(pages: np.ndarray) -> np.ndarray:
    """The pages a burst of CPU faults really moved, from the faulted ones (sorted, unique).

    One CPU fault migrates a region of pages, not one, and the tools API reports only the
    faulting address. The driver picks the region as its density prefetcher does on the GPU
    side: the 64 KiB-aligned region of the fault, or the largest aligned subtree of the 2 MiB
    block (32 .. 512 pages) of which more than 51 % would then be on the host. A host sweeping a
    GPU-resident block so faults at page offsets 0, 16, 32, 64, 128, 256 and moves the whole
    block, while scattered writes (a sparse update of random rows) move 64 KiB per fault, as the
    probes of docs/evaluation/fidelity-h100.md show. Faults are taken in page order within a
    block; a page an earlier fault of the burst moved does not fault again."""
    if len(pages) == 0:
        return pages
    blk = pages >> PAGE_TO_BLOCK_SHIFT
    starts = np.flatnonzero(np.r_[True, blk[1:] != blk[:-1]])
    ends = np.r_[starts[1:], len(pages)]
    out = []
    for a, b in zip(starts.tolist(), ends.tolist()):
        on_host = np.zeros(PAGES_PER_BLOCK, np.bool_)
        for o in (pages[a:b] & (PAGES_PER_BLOCK - 1)).tolist():
            if on_host[o]:
                continue
            lo = o & ~(_CPU_REGION_PAGES - 1)
            hi = lo + _CPU_REGION_PAGES
            region = _CPU_REGION_PAGES - int(on_host[lo:hi].sum())
            size = 2 * _CPU_REGION_PAGES
            while size <= PAGES_PER_BLOCK:
                s_lo = o & ~(size - 1)
                if int(on_host[s_lo:s_lo + size].sum()) + region > _CPU_DENSITY * size:
                    lo, hi = s_lo, s_lo + size
                size *= 2
            on_host[lo:hi] = True
        out.append((int(blk[a]) << PAGE_TO_BLOCK_SHIFT) + np.flatnonzero(on_host))
    return np.concatenate(out).astype(np.int64)


def _reread_after_bursts(kernels: np.ndarray, acc_page: np.ndarray, acc_write: np.ndarray, acc_batch: np.ndarray,
                         bursts: "_Bursts") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Recorded traces list only the pages that faulted; the driver's density prefetcher
    brings the rest of a block without a fault. After a host burst that is what hides most of
    the re-read: on a torch loop the GPU faults a fraction of the pages the host has just
    written, yet moves the whole buffer back. So the first kernel after a burst that faults a
    block the burst covered is taken to read all of the burst's pages in that block (a host
    writes data for the GPU to use; those re-reads belong to no recorded batch) — except the
    pages a kernel faults on before the next burst: the driver evidently did not bring those
    along, and their recorded faults place them. Returns new
    access arrays; kernels' ranges are updated."""
    k_pid = kernels["pid"]
    order = np.argsort(kernels["t_ns"], kind="stable")
    add: dict[int, list[np.ndarray]] = {}
    base = int(bursts.lo[0]) if len(bursts) else 0
    for i in range(len(bursts)):
        pages = bursts.pages[int(bursts.lo[i]) - base:int(bursts.hi[i]) - base]
        if len(pages) == 0:
            continue
        blocks = pages >> PAGE_TO_BLOCK_SHIFT
        pending = set(np.unique(blocks).tolist())
        nxt = bursts.t0[(bursts.pid == bursts.pid[i]) & (bursts.t0 > bursts.t0[i])]
        t_end = int(nxt.min()) if len(nxt) else np.iinfo(np.int64).max
        until_next = [k for k in order.tolist()
                      if k_pid[k] == bursts.pid[i] and bursts.t1[i] <= kernels["t_ns"][k] < t_end]
        # a page some kernel faults on before the next burst was evidently not brought along
        faulted_later = np.unique(np.concatenate(
            [acc_page[kernels["acc_lo"][k]:kernels["acc_hi"][k]] for k in until_next] or [np.zeros(0, np.int64)]))
        for k in until_next:
            if not pending:
                break
            kb = np.unique(acc_page[kernels["acc_lo"][k]:kernels["acc_hi"][k]] >> PAGE_TO_BLOCK_SHIFT)
            hit = [b for b in kb.tolist() if b in pending]
            if hit:
                take = np.isin(blocks, hit) & ~np.isin(pages, faulted_later)
                add.setdefault(k, []).append(pages[take])
                pending.difference_update(hit)
    if not add:
        return acc_page, acc_write, acc_batch
    pages_out, write_out, batch_out = [], [], []
    pos = 0
    for k in range(len(kernels)):
        lo, hi = int(kernels["acc_lo"][k]), int(kernels["acc_hi"][k])
        p, wr, bt = acc_page[lo:hi], acc_write[lo:hi], acc_batch[lo:hi]
        if k in add:
            extra = np.concatenate(add[k])
            extra = np.sort(extra[~np.isin(extra, p)])
            p, wr, bt = _ride_along(p, wr, bt, extra)
        pages_out.append(p)
        write_out.append(wr)
        batch_out.append(bt)
        kernels["acc_lo"][k], kernels["acc_hi"][k] = pos, pos + len(p)
        pos += len(p)
    return np.concatenate(pages_out), np.concatenate(write_out), np.concatenate(batch_out)


def _ride_along(p: np.ndarray, wr: np.ndarray, bt: np.ndarray, extra: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Insert a kernel's re-read pages (sorted) right after its first access to their block,
    in that access's recorded fault batch: the driver brought them with the batch that
    faulted the block (the gather's first step moved its 256 MiB table in 60 batches with
    2.8 K faults), so they belong to that batch's window, not to windows of their own (which
    made 1.1 K simulated batches of it). Read accesses, as before."""
    blk = p >> PAGE_TO_BLOCK_SHIFT
    ublk, first = np.unique(blk, return_index=True)
    eblk = extra >> PAGE_TO_BLOCK_SHIFT
    at = np.minimum(np.searchsorted(ublk, eblk), len(ublk) - 1)
    if not (ublk[at] == eblk).all():   # _reread_after_bursts only adds blocks the kernel faulted
        raise AssertionError("re-read page outside the kernel's faulted blocks")
    pos = first[at] + 1
    return (np.insert(p, pos, extra), np.insert(wr, pos, np.zeros(len(extra), np.bool_)),
            np.insert(bt, pos, bt[first[at]]))


def _cap_at_bursts(kernels: np.ndarray, launches: np.ndarray, bursts: _Bursts) -> None:
    """A kernel whose duration was inferred (no recorded end) ran at most until its process's
    next host burst: the host waited for the GPU before touching its pages, so the time after
    that is host time, which the burst ops carry. In place."""
    inferred = np.ones(len(kernels), np.bool_)
    if len(launches):
        recorded = (launches["t_end_ns"] > 0) & (launches["t_end_ns"] > launches["t_ns"])
        if recorded.any():
            inferred = ~np.isin(kernels["t_ns"], launches["t_ns"][recorded])
    for p in np.unique(bursts.pid):
        ks = np.flatnonzero((kernels["pid"] == p) & inferred)
        bt = np.sort(bursts.t0[bursts.pid == p])
        nb = np.searchsorted(bt, kernels["t_ns"][ks], side="right")
        has = nb < len(bt)
        cap = bt[np.minimum(nb, len(bt) - 1)] - kernels["t_ns"][ks]
        kernels["compute_ns"][ks[has]] = np.maximum(np.minimum(kernels["compute_ns"][ks[has]], cap[has]), 0)


# -- allocations ----------------------------------------------------------------------------

def _runs(units: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Maximal runs of consecutive integers in a sorted unique array: (first, length)."""
    if len(units) == 0:
        return units, units
    starts = np.flatnonzero(np.r_[True, np.diff(units) != 1])
    return units[starts], np.diff(np.r_[starts, len(units)])


def _allocations(alloc_events: np.ndarray, acc_page: np.ndarray, acc_pid: np.ndarray, names: _Names) -> np.ndarray:
    """Recorded allocations (ALLOC op ALLOC), plus inferred ones for touched pages no recorded
    allocation covers. Without any ALLOC events, the inferred allocations are the 2 MiB-aligned
    runs of touched blocks (as cudaMallocManaged aligns large allocations); otherwise they are
    the page runs left uncovered, so they never overlap a recorded one.

    Every allocation is assumed host-initialised: a trace cannot tell a first touch that
    zero-fills from one that migrates data in, and assuming migration is the conservative
    choice for a replay."""
    rec = alloc_events[alloc_events["op"] == AllocOp.ALLOC]
    ids = rec["alloc_id"]
    if len(ids) and ((ids < 0).any() or len(np.unique(ids)) != len(ids)):
        ids = np.arange(len(rec), dtype=np.int64)
    recorded = np.zeros(len(rec), dtype=ALLOCATION_DTYPE)
    recorded["alloc_id"], recorded["pid"], recorded["addr"] = ids, rec["pid"], rec["addr"]
    recorded["bytes"], recorded["managed"] = rec["bytes"], rec["managed"]
    recorded["name_id"] = [names.id(f"alloc {int(i)}") for i in ids]

    pages, first = np.unique(acc_page, return_index=True)
    if len(rec):
        order = np.argsort(rec["addr"], kind="stable")
        start = rec["addr"][order].astype(np.int64)
        end_max = np.maximum.accumulate(start + rec["bytes"][order].astype(np.int64))
        addr = pages << PAGE_SHIFT
        idx = np.searchsorted(start, addr, side="right") - 1
        covered = (idx >= 0) & (addr < end_max[np.maximum(idx, 0)])
        pages, first = pages[~covered], first[~covered]
        run_first, run_len = _runs(pages)
        run_addr, run_bytes = run_first << PAGE_SHIFT, run_len << PAGE_SHIFT
        run_pid = acc_pid[first[np.searchsorted(pages, run_first)]] if len(run_first) else run_first
    else:
        blocks = np.unique(pages >> PAGE_TO_BLOCK_SHIFT)
        run_first, run_len = _runs(blocks)
        run_addr, run_bytes = run_first << BLOCK_SHIFT, run_len * BLOCK_SIZE
        first_page = np.searchsorted(pages, run_first << PAGE_TO_BLOCK_SHIFT)
        run_pid = acc_pid[first[first_page]] if len(run_first) else run_first

    inferred = np.zeros(len(run_first), dtype=ALLOCATION_DTYPE)
    base_id = int(recorded["alloc_id"].max()) + 1 if len(recorded) else 0
    inferred["alloc_id"] = base_id + np.arange(len(run_first))
    inferred["pid"], inferred["addr"], inferred["bytes"] = run_pid, run_addr, run_bytes
    inferred["managed"] = True
    inferred["name_id"] = [names.id(f"inferred 0x{int(a):x}") for a in run_addr]
    out = np.concatenate([recorded, inferred])
    out["init"] = Init.HOST
    return out


def _first_in(allocations: np.ndarray, addr: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Per allocation, the earliest ``t`` of the events whose ``addr`` falls in it (int64 max
    where none)."""
    out = np.full(len(allocations), np.iinfo(np.int64).max, np.int64)
    if len(allocations) == 0 or len(addr) == 0:
        return out
    order = np.argsort(allocations["addr"], kind="stable")
    start = allocations["addr"][order]
    end = start + allocations["bytes"][order]
    idx = np.searchsorted(start, addr, side="right") - 1
    ok = (idx >= 0) & (addr < end[np.maximum(idx, 0)])
    first = np.full(len(allocations), np.iinfo(np.int64).max, np.int64)
    np.minimum.at(first, idx[ok], t[ok])
    out[order] = first
    return out


def _zero_filled(recorded: np.ndarray, faults: np.ndarray, cpu: np.ndarray, copies: np.ndarray,
                 since: int | None = None) -> None:
    """Recorded allocations whose first touch was a GPU fault -- no CPU fault and no copy into
    them before it -- start untouched: the driver zero-fills those pages on the GPU without a
    transfer (torch's fresh blocks for activations and optimizer state; the probe phase
    ``gpu-first-write`` of benchmarks/gpu/fidelity_real.py). Everything else stays
    host-initialised, the conservative default (see :func:`_allocations`). In place (a view).

    A replay of a span (``since``: its start) starts with nothing on the GPU, so an allocation
    the GPU first touched before the span holds data by then: a page of it that faults in the
    span was evicted or moved to the host since, and comes back with a copy, not a zero-fill
    (benchmarks/gpu/workloads/wl_convnet.py's cold steps: torch's blocks, first written by the warm-up, moved
    to the host before the step)."""
    gpu = _first_in(recorded, faults["addr"], faults["t_ns"])
    host = np.minimum(_first_in(recorded, cpu["addr"], cpu["t_ns"]),
                      _first_in(recorded, copies["dst_addr"], copies["t_ns"]))
    untouched = (gpu < np.iinfo(np.int64).max) & (gpu < host)
    if since is not None:
        untouched &= gpu >= since
    recorded["init"][untouched] = Init.UNTOUCHED


def _alloc_id_of(events: np.ndarray, allocations: np.ndarray) -> np.ndarray:
    """The allocation an allocator event refers to: its own alloc_id when that names a known
    allocation, else the allocation containing its address (-1 if none)."""
    out = np.where(np.isin(events["alloc_id"], allocations["alloc_id"]), events["alloc_id"], -1)
    if len(allocations) == 0:
        return out
    order = np.argsort(allocations["addr"], kind="stable")
    start = allocations["addr"][order]
    idx = np.searchsorted(start, events["addr"], side="right") - 1
    ok = idx >= 0
    idx = np.maximum(idx, 0)
    inside = ok & (events["addr"] < start[idx] + allocations["bytes"][order][idx])
    by_addr = np.where(inside, allocations["alloc_id"][order][idx], -1)
    return np.where(out >= 0, out, by_addr)


# -- program order --------------------------------------------------------------------------

def _program_order(kernels: np.ndarray, alloc_events: np.ndarray, allocations: np.ndarray,
                   copies: np.ndarray, bursts: _Bursts | None = None) -> np.ndarray:
    """Kernels, allocator events, copies and host bursts merged into one op stream by time.
    Kernels keep their own order; other ops go where their timestamps fall between launches."""
    nk, nm, nc = len(kernels), len(alloc_events), len(copies)
    nb = len(bursts) if bursts is not None else 0
    ops = np.zeros(nk + nm + nc + 3 * nb, dtype=OP_DTYPE)
    ops["name_id"] = -1
    ops["alloc_id"] = -1
    ops["grid"] = ops["block"] = 1

    k = ops[:nk]
    k["type"] = OpType.KERNEL
    for f in ("gpu", "pid", "exec_hash", "name_id", "compute_ns", "acc_lo", "acc_hi", "grid", "block", "atomics"):
        k[f] = kernels[f]

    m = ops[nk:nk + nm]
    m["type"] = OpType.MEM
    m["pid"], m["mem_op"], m["addr"], m["bytes"] = (alloc_events[f] for f in ("pid", "op", "addr", "bytes"))
    m["alloc_id"] = _alloc_id_of(alloc_events, allocations)

    c = ops[nk + nm:nk + nm + nc]
    c["type"] = OpType.COPY
    c["gpu"], c["pid"], c["bytes"], c["copy_kind"], c["is_async"] = (
        copies[f] for f in ("gpu", "pid", "bytes", "kind", "is_async"))
    c["addr"], c["dst_addr"] = copies["src_addr"], copies["dst_addr"]

    t_b = np.zeros(3 * nb, np.int64)
    if nb:
        h = ops[nk + nm + nc:].reshape(nb, 3)  # per burst: SYNC, HOST_WRITE, HOST
        h["pid"] = bursts.pid[:, None]
        h["type"] = [OpType.SYNC, OpType.HOST_WRITE, OpType.HOST]
        h["gpu"][:, 0] = -1
        h["acc_lo"][:, 1], h["acc_hi"][:, 1] = bursts.lo, bursts.hi
        h["compute_ns"][:, 1] = bursts.write_ns
        h["compute_ns"][:, 2] = bursts.host_ns
        t_b = np.repeat(bursts.t0, 3)
    release = np.isin(alloc_events["op"], (AllocOp.FREE, AllocOp.BLOCK_INACTIVE))
    t = np.concatenate([np.maximum.accumulate(kernels["t_ns"]) if nk else kernels["t_ns"],
                        alloc_events["t_ns"], copies["t_ns"], t_b])
    prio = np.concatenate([np.full(nk, _PRIO_KERNEL), np.where(release, _PRIO_RELEASE, _PRIO_ACQUIRE),
                           np.full(nc, _PRIO_COPY), np.full(3 * nb, _PRIO_HOST)])
    return ops[np.lexsort((np.arange(len(ops)), prio, t))]


# -- capacity -------------------------------------------------------------------------------

def _footprint_per_gpu(kernels: np.ndarray, acc_page: np.ndarray, n_gpus: int) -> list[int]:
    acc_gpu = np.repeat(kernels["gpu"], kernels["acc_hi"] - kernels["acc_lo"])
    blocks = acc_page[:len(acc_gpu)] >> PAGE_TO_BLOCK_SHIFT  # kernels' accesses come first
    return [int(len(np.unique(blocks[acc_gpu == g]))) * BLOCK_SIZE for g in range(n_gpus)]


def _capacity(trace: Trace, n_gpus: int, footprint: list[int], gpu_mem: int | None,
              oversub: float | None) -> tuple[list[int], str]:
    if gpu_mem is not None:
        if gpu_mem <= 0:
            raise UmctlError(f"GPU memory must be positive (got {gpu_mem})")
        return [int(gpu_mem)] * n_gpus, "gpu_mem argument"
    if oversub is not None:
        if not oversub > 0:
            raise UmctlError(f"oversubscription must be positive (got {oversub})")
        return ([max(BLOCK_SIZE, int(f / oversub) // BLOCK_SIZE * BLOCK_SIZE) for f in footprint],
                f"footprint / oversub {oversub:g}")
    recorded = _recorded_gpu_mem(trace.meta)
    if recorded:
        return [recorded[min(g, len(recorded) - 1)] for g in range(n_gpus)], "trace metadata"
    raise TraceError(f"{trace.path}: GPU memory size unknown (not in the trace metadata); "
                     "pass --gpu-mem or --oversub")


def _recorded_gpu_mem(meta: dict) -> list[int]:
    """GPU capacities from trace metadata, most specific first: ``gpu_mem`` (bytes, one value
    or one per GPU: what a simulated run used), the scenario's ``params.gpu_mem``, then the
    ``memory_bytes`` nvidia-smi reported for the recording host's ``gpu`` entries."""
    params = meta.get("params") if isinstance(meta.get("params"), dict) else {}
    for value in (meta.get("gpu_mem"), params.get("gpu_mem")):
        values = value if isinstance(value, list) else [value]
        try:
            sizes = [parse_size(v) for v in values if isinstance(v, (int, str)) and not isinstance(v, bool)]
        except ValueError:
            continue
        if len(sizes) == len(values) and all(v > 0 for v in sizes):
            return sizes
    gpus = meta.get("gpu")
    if isinstance(gpus, list):
        mems = [g.get("memory_bytes") for g in gpus if isinstance(g, dict)]
        if mems and all(isinstance(v, int) and v > 0 for v in mems):
            return mems
    return []
