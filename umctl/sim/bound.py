"""A provable lower bound on a replay's simulated time (issue 38 §1).

``replay_bound(workload, calib)`` gives a time ``T_bound`` that no replay of the workload on
the simulator (``engine.Simulator``) under that calibration and GPU size can beat, whatever
the controller, because it is derived from what the simulator charges, not from a policy.
``umctl replay`` shows each mode's time as a percentage of it; ``oracle`` is only a policy.

What the simulator charges (engine.py ``_kernel``, _simcore.c ``sim_kernel``/``service``/
``sim_prefetch``), for one GPU:

  (E1) Kernels run one after another on the GPU's stream: kernel k ends at
       ``start_k + compute_k + stall_k`` with ``start_k >= end_{k-1}`` and ``stall_k >= 0``;
       the replay ends at or after the last kernel. A kernel also starts no earlier than the
       host, whose clock only grows, by at least each HOST / HOST_WRITE op's ``compute_ns``.
  (E2) A page reaches the GPU from the host in one of two ways. The fault path moves it inside
       a fault batch, and the batch's duration, which is added to the kernel's stall, includes
       ``pages * PAGE / fault_h2d_Bps``; the density prefetcher's extra pages pay the same. A
       controller's prefetch (UVM_MIGRATE) is queued on the GPU's host->GPU copy engine: one
       queue (``h2d_tail``), one command after another, at ``prefetch_h2d_Bps``. A page still
       in flight when the kernel touches it faults, and the batch waits for the transfer.
  (E3) A page that is not populated anywhere is zero-filled on the GPU without using the link.
       Such a page was never touched, or the program freed it, or a controller discarded it
       after the allocator marked it inactive; the fault batch or the HBM-rate fill of a
       prefetch is still charged. A populated page that is not on the GPU has its only valid
       copy on the host: either the host wrote it (``Init.HOST``, HOST_WRITE), or an eviction
       wrote it back. Moving it to the GPU costs one page over the link.
  (E4) GPU memory is ``gpu_mem // 2 MiB`` chunks. A block that has any page on the GPU holds a
       whole chunk, so at most ``chunks * 512`` pages are on the GPU at any time.

The bound. Take the program's page accesses in op order. Within a kernel, keep only the first
access to each page; this is a subsequence, so a relaxation. After a FREE or BLOCK_INACTIVE of
its allocation, after a HOST_WRITE of it, or after an H2D copy into it, treat a page as a new
page. Its old contents are dead or overwritten, and the simulator drops its GPU copy, or may.
Every schedule the simulator can carry out is a paging schedule with room for
``P = chunks * 512`` pages (E4). Pages of one block count separately: a block that holds a
chunk with only some of its pages uses more room than that, so counting pages is a relaxation.
In this paging schedule, every load of a populated page costs one page over the link (E3).
Loads of unpopulated pages are free; they are compulsory: they happen in every schedule, at
the first access after the page is born. Belady's MIN minimises the number of misses in every
prefix of the sequence at once: on a prefix, evicting the page used farthest in the future
never does worse than evicting one not used again in the prefix. Every other miss is a reload
of a populated page. So ``N_k``, the number of costly misses of page-level MIN by the end of
kernel k, is the least number of pages that must cross the link before kernel k ends.

Let ``C`` be the total compute, ``C_{<=k}`` and ``C_{>k}`` the compute up to kernel k and
after it, ``a = PAGE / prefetch_h2d_Bps``, ``b = PAGE / fault_h2d_Bps``. Of the ``N_k`` pages,
say ``x`` come through prefetches and ``N_k - x`` through faults. The prefetch queue is serial
and starts at time 0, and a kernel waits for the prefetches it touches (E2), so
``end_k >= x*a`` and ``T >= x*a + C_{>k}``. The fault pages are stall (E1, E2), so
``T >= C + (N_k - x)*b``. Minimising the larger of the two over ``x`` in ``[0, N_k]`` gives::

    T >= max(C, C_{>k} + a * min(N_k, (C_{<=k} + N_k*b) / (a + b)))        for every kernel k
    T >= max_k (host time before kernel k + C_{>=k})                         (E1)
    T >= H2D copy bytes / max(copy rates, prefetch_h2d_Bps)   (copies run one at a time)

This does not assume that demand transfers hold up queued prefetches. The simulator makes
them do so (``preempt``), but only for entries on its active list, so the bound counts the two
paths as if they could run side by side. ``T_bound`` is the largest of these terms.

Sequence and Belady are kept per *page class*, not per page. A class is a maximal range of
pages inside one 2 MiB block that every access run, host write, copy and allocator event
covers either completely or not at all. All pages of a class are used in the same places, so
page-level MIN treats them alike: it may evict part of a class. This is exact for page-level
MIN, and it costs memory and time per run, not per access. GPT-2 XL at the DeepUM paper's scale
(batch 5, 2 iterations, 277 M accesses) takes 1.4 s and 247 MB peak RSS, workload included, on a
2-core VM; the replay under ``none`` takes 7.4 s and 426 MB.

What it covers: one GPU; every single-GPU mode (none, deepum*, oracle, hum*, and budgeted
replays, whose budget only evicts more). Controllers may only discard data that the allocator
marked inactive or freed; every shipped mode does this. It does not cover several GPUs: it
raises ValueError for them. There, pages come from peers over NVLink, from harvested spare
memory, and through a neighbour's PCIe lane (memHarvester), and SnuRHAC splits kernels.
HUM's chunked copies are covered: they only carry copy bytes, and each copy's data counts as
a new page. Pinned thrashing pages are read remotely without being loaded, so when host
writes to managed memory can trigger pinning, only compulsory misses are counted, and the
fault path's rate becomes the faster of the two links.

What makes it loose: fault batches' fixed costs (``batch_ns``, ``fault_ns``, ``block_ns``) and
eviction write-backs (on the fault path, stall) are left out. Page granularity ignores wasted
room in half-used chunks. Belady knows the future. Treating the two paths as parallel charges
the transfer at about ``1/(1/a + 1/b)``, the links' combined rate (74.5 GB/s for the H100's
49.5 + 25). Each command's start-up (``transfer_latency_ns``) is left out. Copies and host
work do not add to the kernel terms, only bound the time on their own.

What it cannot count, and why (issue 38 §4). On mixtral-8x7b at fit scale (512 MiB GPU,
oversubscription 2, 3 iterations) the bound is 3.78 ms: 3.07 ms of compute, and 34,561 cold
pages (135 MiB, weights the host wrote) at the links' combined rate; page-level MIN has no
capacity miss there, since the pages used before and after any point never exceed 70,331
(275 MiB). The best mode (``deepum-launch``, queue 1024) takes 74.6 ms and its GPU->host
engine is busy to the end: 727 MiB written back (58.7 ms at 13 GB/s, plus 10 µs for each
of its 987 pre-evictions), against 513 MiB host->GPU and 798 fault batches. The candidates:

  * Write-back is not a lower bound on the simulator's time, so no term counts it. Data
    written on the GPU (or first touched there) that has not died must leave when it no longer
    fits, and physically it must arrive on the host before its memory is reused. The simulator
    does not make anyone wait for it: a pre-eviction of part of a block queues its copy on the
    GPU->host engine and counts the pages valid on the host at once while the chunk stays with
    the block, and an ``UNSET_READ_MOSTLY`` advice frees a chunk that holds only
    read-duplicates at once, as a fault-path eviction frees one for ``evict_chunk_ns`` and
    whatever is left in it. A policy that empties dirty blocks that way and zero-fills the next
    ones runs a stream of 28 dirty 2 MiB blocks through a 4-chunk GPU in 1.8 ms where writing
    them back takes 4.5 ms (tests/test_bound_writeback.py). Were a chunk's release and a page's
    reload made to wait for the write-backs out of it (engine.py, _simcore.c), a term could
    be proved: every page written since its birth in a block that loses its chunk before the
    page dies is written back once. A relaxation over 2 MiB blocks (hold a block through each
    gap between its uses or lose it; at most ``chunks - 1`` held besides the one in use; each
    write charged to one gap; solved exactly as a min-cost flow, not shipped) says at least
    42,173 pages (165 MiB) on Mixtral, 13 ms on one 13 GB/s link; per page instead, data
    written and alive peaks at 138,244 pages against the GPU's 131,072 only at the end, so
    7,172 pages (28 MiB).
  * Chunk granularity is provable and small, so it is left out. A block that gives up its
    chunk loses all its pages, so the reloads that block room forces are a lower bound; on
    Mixtral the live pages lie in up to 347 blocks against 256 chunks, but the same block
    relaxation needs only 4,638 reloaded pages (18 MiB): the bound would rise by at most
    0.18 ms, for a min-cost flow per replay. On the dense models page-level MIN counts far
    more (gpt2-xl: 332,844 capacity pages against 34,785 from blocks). The fault path's
    64 KiB granularity is no term: a controller's prefetch moves any page range.
  * Fault-service costs are no term: a policy that has every page there in time faults on
    nothing, and a prefetch of never-populated pages is a zero-fill beside the copy engine.
"""

from __future__ import annotations

import heapq
from dataclasses import asdict, dataclass

import numpy as np

from ..events.schema import AllocOp, CopyKind
from ..units import BLOCK_SIZE, PAGE_SIZE, PAGE_TO_BLOCK_SHIFT
from ..workload.workload import OpType, Workload
from .calibration import DEFAULT, Calibration

_NEVER = np.iinfo(np.int64).max

# event kinds in the per-class sequence, in the order they sort at one position
_USE, _DEATH, _WRITE = 0, 1, 2


@dataclass(frozen=True)
class Bound:
    """A replay's lower bound and its parts (ns, pages); ``time_ns`` is the bound."""

    time_ns: float
    #: sum of the kernels' compute
    compute_ns: float
    #: the best single kernel's transfer term (the first line of the module docstring's bound)
    transfer_term_ns: float
    #: host time before a kernel plus the compute from it on, at most
    host_chain_ns: float
    #: H2D copy bytes at the fastest rate a copy can run
    copy_ns: float
    #: pages that must cross the host->GPU link in every replay (page-level MIN), of which cold
    #: (the first use of data the host wrote) and the rest reloads after an eviction
    transfer_pages: int
    cold_pages: int
    capacity_pages: int
    #: which term gave the bound: "compute", "transfer", "host" or "copy"
    limited_by: str
    #: the kernel (index among kernels) whose transfer term is the largest, -1 if none
    critical_kernel: int
    gpu_pages: int

    @property
    def time_s(self) -> float:
        return self.time_ns / 1e9

    def as_dict(self) -> dict:
        d = asdict(self)
        d["time_s"] = self.time_s
        return d


def replay_bound(workload: Workload, calib: Calibration = DEFAULT, gpu_mem: int | None = None) -> Bound:
    """The lower bound on any replay of ``workload`` (one GPU) under ``calib`` with a GPU of
    ``gpu_mem`` bytes (default: the workload's own). See the module docstring for the proof."""
    if workload.n_gpus != 1:
        raise ValueError(f"the bound covers one GPU; {workload.name} has {workload.n_gpus}")
    mem = int(workload.gpu_mem[0] if gpu_mem is None else gpu_mem)
    gpu_pages = (mem // BLOCK_SIZE) * (BLOCK_SIZE // PAGE_SIZE)
    ops = workload.ops
    types = ops["type"]
    kidx = np.flatnonzero(types == OpType.KERNEL)
    compute = ops["compute_ns"][kidx].astype(np.float64)
    C = float(compute.sum())

    # host chain (E1): host time accumulated before each kernel, plus the compute from it on
    host_dur = np.where((types == OpType.HOST) | (types == OpType.HOST_WRITE), ops["compute_ns"], 0).astype(np.float64)
    host_before = np.cumsum(host_dur) - host_dur          # host time before each op
    suffix = np.cumsum(compute[::-1])[::-1] if len(compute) else compute    # C_{>=k}
    host_chain = float(max((host_before[kidx] + suffix).max() if len(kidx) else 0.0, host_dur.sum()))

    copies = ops[(types == OpType.COPY) & (ops["copy_kind"] == CopyKind.H2D)]
    copy_rate = max(calib.pinned_copy_Bps, calib.pageable_copy_Bps, calib.prefetch_h2d_Bps)
    copy_ns = float(copies["bytes"].astype(np.float64).sum()) / copy_rate * 1e9

    # pinned thrashing pages are read through a remote mapping (each access a page over the link
    # at the prefetch rate, as stall) without being loaded: only pages the host writes can get
    # there (the host must take part in their thrashing), so those never take room in the
    # relaxation and count only their compulsory misses, at the cheaper of the two stall rates
    pins = calib.thrashing_threshold > 0 and calib.thrashing_pin_threshold > 0
    cold, cap_miss, per_kernel, per_kernel_pin = _min_transfers(workload, kidx, gpu_pages, pins)
    a = PAGE_SIZE / calib.prefetch_h2d_Bps * 1e9
    b = PAGE_SIZE / calib.fault_h2d_Bps * 1e9
    term = _transfer_terms(compute, per_kernel.astype(np.float64), per_kernel_pin.astype(np.float64), a, b,
                           min(a, b))
    crit = int(np.argmax(term)) if len(term) else -1
    transfer = float(term[crit]) if len(term) else 0.0
    parts = {"compute": C, "transfer": transfer, "host": host_chain, "copy": copy_ns}
    limited = max(parts, key=parts.get)
    return Bound(time_ns=max(parts.values()), compute_ns=C, transfer_term_ns=transfer, host_chain_ns=host_chain,
                 copy_ns=copy_ns, transfer_pages=int(cold + cap_miss), cold_pages=int(cold),
                 capacity_pages=int(cap_miss), limited_by=limited, critical_kernel=crit, gpu_pages=gpu_pages)


def _transfer_terms(compute: np.ndarray, n: np.ndarray, n_pin: np.ndarray, a: float, b: float,
                    b_pin: float) -> np.ndarray:
    """Per kernel k, the least time of a replay that moves ``n[k]`` pages over the link before
    kernel k ends, ``n_pin[k]`` of them (those are included in ``n``) possibly as stall at
    ``b_pin`` per page: min over the pages x sent through the prefetch queue (``a`` per page,
    serial from time 0, before kernel k ends) of max(C + stall of the others, x*a + C_{>k}).
    The stall side is piecewise linear in x (the ordinary pages, ``b`` each, go to the queue
    first: they cost the most as stall), the queue side linear; the least max is where they
    cross, or at x = n where the stall side is still above (the bound is then C)."""
    C = float(compute.sum())
    c_upto = np.cumsum(compute)
    c_after = C - c_upto
    n_ord = n - n_pin
    # crossing while ordinary pages remain on the stall side: C + (n_ord - x) b + n_pin b_pin = x a + C_{>k}
    x1 = (c_upto + n_ord * b + n_pin * b_pin) / (a + b)
    # crossing once only the others remain: C + (n - x) b_pin = x a + C_{>k}
    x2 = (c_upto + n * b_pin) / (a + b_pin)
    x = np.where(x1 <= n_ord, x1, np.minimum(x2, n))
    return np.maximum(C, c_after + a * np.maximum(x, 0.0))


def _managed_spans(workload: Workload) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Managed memory as disjoint sorted page spans [lo, hi), and the spans initialised by the
    host (``Init.HOST``: their pages start populated on the host)."""
    a = workload.allocations[workload.allocations["managed"]]
    lo = a["addr"].astype(np.int64) >> 12
    hi = lo + (a["bytes"].astype(np.int64) + PAGE_SIZE - 1) // PAGE_SIZE

    def union(l: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if len(l) == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        o = np.argsort(l, kind="stable")
        l, h = l[o], h[o]
        reach = np.maximum.accumulate(h)
        new = np.ones(len(l), np.bool_)
        new[1:] = l[1:] > reach[:-1]
        starts = np.flatnonzero(new)
        ends = np.append(starts[1:], len(l)) - 1
        return l[starts], reach[ends]

    ml, mh = union(lo, hi)
    host = a["init"] == 1
    hl, hh = union(lo[host], hi[host])
    return ml, mh, hl, hh


def _clip(lo: np.ndarray, hi: np.ndarray, sl: np.ndarray, sh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each range [lo, hi) clipped to the span of (sl, sh) holding lo; empty (hi <= lo) where no
    span holds it. Dropping accesses only relaxes the paging problem."""
    i = np.searchsorted(sl, lo, "right") - 1
    ok = i >= 0
    j = np.maximum(i, 0)
    inside = ok & (lo < sh[j] if len(sh) else False)
    h = np.where(inside, np.minimum(hi, sh[j] if len(sh) else hi), lo)
    return lo, h


def _min_transfers(workload: Workload, kidx: np.ndarray, gpu_pages: int,
                   pins: bool = False) -> tuple[int, int, np.ndarray, np.ndarray]:
    """Page-level MIN over the workload's page classes (see the module docstring): cold
    (costly compulsory) misses, costly capacity misses, and per kernel the costly misses by
    its end (cumulative), all of them and those of classes the host writes where ``pins``
    (pinned pages may be read remotely: such classes take no room and count only their
    compulsory misses)."""
    ops = workload.ops
    types = ops["type"]
    nk = len(kidx)
    ml, mh, hl, hh = _managed_spans(workload)

    # ranges of the sequence, in op order: kernel accesses (runs), host writes, deaths
    ranged = np.flatnonzero(((types == OpType.KERNEL) | (types == OpType.HOST_WRITE)) & (ops["acc_hi"] > ops["acc_lo"]))
    runs = workload.acc_runs.cut_at(np.concatenate([ops["acc_lo"][ranged], ops["acc_hi"][ranged]]))
    runs = runs.split_blocks(PAGE_TO_BLOCK_SHIFT)
    # the op each run belongs to (the last ranged op whose range starts at or before it)
    starts = ops["acc_lo"][ranged]
    order = np.argsort(starts, kind="stable")
    r_at = np.searchsorted(starts[order], runs.pos[:-1], "right") - 1
    keep = r_at >= 0
    r_op = np.where(keep, ranged[order][np.maximum(r_at, 0)], -1)
    keep &= runs.pos[:-1] < ops["acc_hi"][np.maximum(r_op, 0)]
    r_lo, r_hi = _clip(runs.page, runs.page + runs.length, ml, mh)
    keep &= r_hi > r_lo
    r_op, r_lo, r_hi = r_op[keep], r_lo[keep], r_hi[keep]
    del runs, keep, r_at, order

    mem = np.flatnonzero(((types == OpType.MEM) & ((ops["mem_op"] == AllocOp.FREE)
                                                    | (ops["mem_op"] == AllocOp.BLOCK_INACTIVE)))
                         | ((types == OpType.COPY) & (ops["copy_kind"] == CopyKind.H2D)))
    d_addr = np.where(types[mem] == OpType.COPY, ops["dst_addr"][mem], ops["addr"][mem]).astype(np.int64)
    d_lo = d_addr >> 12
    d_hi = d_lo + (ops["bytes"][mem].astype(np.int64) + PAGE_SIZE - 1) // PAGE_SIZE
    # deaths within one block each (classes never cross a block)
    d_lo, d_hi, d_op = _split_blocks(d_lo, d_hi, mem)
    d_lo, d_hi = _clip(d_lo, d_hi, ml, mh)
    ok = d_hi > d_lo
    d_lo, d_hi, d_op = d_lo[ok], d_hi[ok], d_op[ok]

    # classes: cut every block at every range boundary, and at the host-initialised spans'
    h_lo, h_hi, _ = _split_blocks(hl, hh, np.zeros(len(hl), np.int64))
    cuts = np.unique(np.concatenate([r_lo, r_hi, d_lo, d_hi, h_lo, h_hi]))
    if len(cuts) < 2:
        return 0, 0, np.zeros(nk, np.int64), np.zeros(nk, np.int64)
    c_size = np.diff(cuts)                       # class c = pages [cuts[c], cuts[c + 1])
    c_host = np.zeros(len(c_size), np.bool_)     # starts populated on the host
    if len(h_lo):
        a0, a1 = np.searchsorted(cuts, h_lo), np.searchsorted(cuts, h_hi)
        c_host[_ranges_idx(a0, a1 - a0)] = True

    # expand runs and deaths into (class, op) events
    ra, rb = np.searchsorted(cuts, r_lo), np.searchsorted(cuts, r_hi)
    rcls = _ranges_idx(ra, rb - ra)
    rop = np.repeat(r_op, rb - ra)
    rseq = np.arange(len(rcls))                  # stream order inside an op
    del ra, rb, r_lo, r_hi, r_op
    is_write = types[rop] == OpType.HOST_WRITE
    da, db = np.searchsorted(cuts, d_lo), np.searchsorted(cuts, d_hi)
    dcls = _ranges_idx(da, db - da)
    dop = np.repeat(d_op, db - da)
    cls = np.concatenate([rcls, dcls])
    op = np.concatenate([rop, dop])
    kind = np.concatenate([np.where(is_write, _WRITE, _USE), np.full(len(dcls), _DEATH)]).astype(np.int8)
    seq = np.concatenate([rseq, np.zeros(len(dcls), np.int64)])
    del rcls, rop, rseq, dcls, dop, is_write
    # first touch of each class in a kernel only (a relaxation); host writes and deaths once per op
    o = np.lexsort((seq, kind, cls, op))
    cls, op, kind, seq = cls[o], op[o], kind[o], seq[o]
    dup = np.zeros(len(cls), np.bool_)
    dup[1:] = (cls[1:] == cls[:-1]) & (op[1:] == op[:-1]) & (kind[1:] == kind[:-1])
    cls, op, kind, seq = cls[~dup], op[~dup], kind[~dup], seq[~dup]
    # the sequence: op order, then stream order inside a kernel (first touch)
    o = np.lexsort((seq, op))
    cls, op, kind = cls[o], op[o], kind[o]
    n = len(cls)
    pos = np.arange(n, dtype=np.int64)
    # per class: the event after each one, and the one before (for next use and for cost)
    o = np.lexsort((pos, cls))
    same_next = np.zeros(n, np.bool_)
    same_next[o[:-1]] = cls[o[1:]] == cls[o[:-1]]
    nxt_pos = np.full(n, _NEVER, np.int64)
    nxt_kind = np.full(n, -1, np.int8)
    nxt_pos[o[:-1]] = np.where(same_next[o[:-1]], o[1:], _NEVER)
    nxt_kind[o[:-1]] = np.where(same_next[o[:-1]], kind[o[1:]], -1)
    prev_kind = np.full(n, -1, np.int8)
    has_prev = np.zeros(n, np.bool_)
    has_prev[o[1:]] = cls[o[1:]] == cls[o[:-1]]
    prev_kind[o[1:]] = np.where(has_prev[o[1:]], kind[o[:-1]], -1)
    # a use's next use (a death or host write in between ends the page: never)
    next_use = np.where(nxt_kind == _USE, nxt_pos, _NEVER)
    # is the class populated off the GPU when this use misses? after a use or a host write, or
    # from the start if the host initialised it; not after a death
    costly = np.where(has_prev, (prev_kind == _USE) | (prev_kind == _WRITE), c_host[cls])
    compulsory = ~has_prev | (prev_kind != _USE)

    kernel_of = np.full(len(ops), -1, np.int64)
    kernel_of[kidx] = np.arange(nk)
    k_of = kernel_of[op]
    bypass = np.zeros(len(c_size), np.bool_)
    if pins:
        bypass[cls[kind == _WRITE]] = True
    cold, cap, per_event = _belady(cls, kind, next_use, costly, compulsory, c_size, gpu_pages, bypass)
    per_kernel = np.zeros(nk, np.int64)
    per_kernel_pin = np.zeros(nk, np.int64)
    sel = (kind == _USE) & (k_of >= 0)
    np.add.at(per_kernel, k_of[sel], per_event[sel])
    sel &= bypass[cls]
    np.add.at(per_kernel_pin, k_of[sel], per_event[sel])
    return cold, cap, np.cumsum(per_kernel), np.cumsum(per_kernel_pin)


def _belady(cls: np.ndarray, kind: np.ndarray, next_use: np.ndarray, costly: np.ndarray, compulsory: np.ndarray,
            size: np.ndarray, capacity: int, bypass: np.ndarray) -> tuple[int, int, np.ndarray]:
    """Page-level MIN over classes of ``size`` interchangeable pages, ``capacity`` pages of room:
    returns costly compulsory misses, costly capacity misses and the costly misses of each
    event. A use loads the class's missing pages, then the classes used farthest in the
    future (itself included) lose pages until the room holds; a death or host write drops
    the class (its next use is already "never"). A ``bypass`` class takes no room and counts
    only its compulsory misses (every use after the first may be served without loading)."""
    n = len(cls)
    out = np.zeros(n, np.int64)
    resident = [0] * len(size)
    key = [0] * len(size)          # current next use of each class (heap entries may be stale)
    sz = size.tolist()
    heap: list[tuple[int, int]] = []
    used = 0
    cold = cap = 0
    cls_l, kind_l, nu_l = cls.tolist(), kind.tolist(), next_use.tolist()
    cost_l, comp_l, byp = costly.tolist(), compulsory.tolist(), bypass.tolist()
    push, pop = heapq.heappush, heapq.heappop
    fits = int(size[~bypass].sum()) <= capacity
    for i in range(n):
        c = cls_l[i]
        if kind_l[i] != _USE:
            used -= resident[c]
            resident[c] = 0
            continue
        s = sz[c]
        if byp[c]:
            if comp_l[i] and cost_l[i]:
                cold += s
                out[i] = s
            continue
        miss = s - resident[c]
        if comp_l[i]:
            if cost_l[i]:
                cold += miss
                out[i] = miss
        elif miss:
            cap += miss
            out[i] = miss
        used += miss
        resident[c] = s
        k = nu_l[i]
        key[c] = k
        if fits:
            continue
        push(heap, (-k, c))
        while used > capacity and heap:
            nk, v = pop(heap)
            if -nk != key[v] or resident[v] == 0:
                continue
            drop = min(resident[v], used - capacity)
            resident[v] -= drop
            used -= drop
            if resident[v]:
                push(heap, (nk, v))
    return cold, cap, out


def _split_blocks(lo: np.ndarray, hi: np.ndarray, tag: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Page ranges [lo, hi) cut at 2 MiB block boundaries, each piece with its range's tag."""
    lo, hi = np.asarray(lo, np.int64), np.asarray(hi, np.int64)
    ok = hi > lo
    lo, hi, tag = lo[ok], hi[ok], np.asarray(tag)[ok]
    if len(lo) == 0:
        return lo, hi, tag
    fb, lb = lo >> PAGE_TO_BLOCK_SHIFT, (hi - 1) >> PAGE_TO_BLOCK_SHIFT
    pieces = lb - fb + 1
    r = np.repeat(np.arange(len(lo)), pieces)
    k = np.arange(len(r)) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    s = np.maximum(lo[r], (fb[r] + k) << PAGE_TO_BLOCK_SHIFT)
    e = np.minimum(hi[r], (fb[r] + k + 1) << PAGE_TO_BLOCK_SHIFT)
    return s, e, tag[r]


def _ranges_idx(start: np.ndarray, length: np.ndarray) -> np.ndarray:
    """Concatenation of arange(start[i], start[i] + length[i])."""
    length = np.asarray(length, np.int64)
    total = int(length.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    off = np.repeat(np.cumsum(length) - length, length)
    return np.repeat(np.asarray(start, np.int64), length) + (np.arange(total) - off)
