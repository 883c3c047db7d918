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
  (E5) A page the GPU writes has its only copy there (a write to a read-duplicate collapses
       it first), and when it leaves the GPU before it dies it is written back: on the fault
       path, as the batch's stall, ``PAGE / d2h_Bps`` a page; or queued on the GPU's
       GPU->host copy engine (``d2h_tail``: one queue, serial from time 0, at ``d2h_Bps``) by a
       pre-eviction or by the eviction a prefetch makes. The simulator waits for those copies as
       the driver's block tracker orders them: a chunk becomes free, for any block, only when
       the copies out of it have ended (``wb_busy``: whether the block loses it by eviction,
       pre-eviction, a read-mostly collapse or a discard), and a page is read from the host only
       once its write-back has landed (``host_ready``). Only data the allocator freed or marked
       inactive is discarded without a write-back.

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
paths as if they could run side by side. ``T_bound`` is the largest of these terms and the
write-back term below.

Write-back (E5). Relax to 2 MiB blocks and to the kernels' first accesses. A block's *uses* are
the kernels that touch it; its gap j runs from its last access in use j to its first access in
use j + 1 (the last gap to the end). At the first access of each kernel (to a page that
cannot be pinned, of a block A, which then holds a chunk), at most ``chunks - 1`` other blocks
hold one, so at most ``chunks - 1``
gaps covering that point are *held* (the block keeps a chunk throughout). A *run* is a page's
write in a kernel up to its next write, death or host write; it spans the gaps that start at
or after the write and end before the next write, or before the death, or the block's last gap
if the page lives to the end. Claim: in any replay, the pages of the runs that span a lost gap
are written back by copies that end before the last kernel does. Proof: take the replay's
losses of a block's chunk; call one *counted* if that chunk is reused (by any block) before
the last kernel ends. Build a schedule of gaps: before the block's first uncounted loss, a gap
is held if the block kept its chunk through it; from that loss on, every gap is held, by the
chunk it released, which nobody uses until the end (a chunk per block, so the room holds at
every point). A gap lost there holds a loss before the first uncounted one, and so does the
first loss after the write of a run that spans that gap (a loss anywhere, within a kernel
too): both are counted. The written page is still alive at that loss, so it is written back
there or before it while the block kept that chunk (a partial pre-eviction, whose copy the
chunk's release waits for: ``wb_busy``); the copy ends before the chunk is reused, so before
the last kernel ends. Two runs of one page are written back by two copies: a lost gap in
the first run's span ends before the second write. The least number of such pages is at least
``W``, the least cost over holdings that respect the room when each run is charged to its last
gap only (its pages count if that gap is lost). That is an interval packing, whose linear
program is exact; ``_writeback_pages`` bounds its optimum from below by Lagrangian duality
(prices on the points, subgradient ascent; every price vector gives a bound). Pages of classes
that may be pinned (below) are left out: a GPU may write them through a remote mapping.

The W pages' copies end before the last kernel does: say y of them on the GPU->host queue
(``T >= y*w``, ``w = PAGE / d2h_Bps``) and the rest on the fault path, stall added to the stall
of the fault path's own transfers. With the ``N`` pages of the transfer term for the last
kernel, x of them through the prefetch queue::

    T >= min over x, y of max(C + (N - x)*b + (W - y)*w, x*a, y*w)      (the write-back term)

(the pinned pages as in the transfer term), computed by bisection (``_writeback_term``). Only
the last kernel is taken: ``C_{>k} = 0`` there, and ``W`` needs a dual ascent per kernel.

Sequence and Belady are kept per *page class*, not per page. A class is a maximal range of
pages inside one 2 MiB block that every access run, host write, copy and allocator event
covers either completely or not at all. All pages of a class are used in the same places, so
page-level MIN treats them alike: it may evict part of a class. This is exact for page-level
MIN, and it costs memory and time per run, not per access (the cost with the write-back term:
below; the replay under ``none`` of GPT-2 XL at the DeepUM paper's scale takes 7.4 s and 426 MB).

What it covers: one GPU; every single-GPU mode (none, deepum*, oracle, hum*, and budgeted
replays, whose budget only evicts more). Controllers may only discard data that the allocator
marked inactive or freed; every shipped mode does this. It does not cover several GPUs: it
raises ValueError for them. There, pages come from peers over NVLink, from harvested spare
memory, and through a neighbour's PCIe lane (memHarvester), and SnuRHAC splits kernels.
HUM's chunked copies are covered: they only carry copy bytes, and each copy's data counts as
a new page. Pinned thrashing pages are read remotely without being loaded, so when host
writes to managed memory can trigger pinning, only compulsory misses are counted, and the
fault path's rate becomes the faster of the two links.

What makes it loose: fault batches' fixed costs (``batch_ns``, ``fault_ns``, ``block_ns``) are
left out, and write-backs count only in the write-back term (below). Page granularity ignores
wasted room in half-used chunks. Belady knows the future. Treating the two paths as parallel charges
the transfer at about ``1/(1/a + 1/b)``, the links' combined rate (74.5 GB/s for the H100's
49.5 + 25). Each command's start-up (``transfer_latency_ns``) is left out. Copies and host
work do not add to the kernel terms, only bound the time on their own.

What the write-back term counts, and what it leaves out (issue 38 §4). On mixtral-8x7b at fit
scale (512 MiB GPU, oversubscription 2, 3 iterations) the bound is 8.16 ms, limited by it:
``W`` = 42,058 pages (164 MiB; the relaxation's exact optimum is 42,082, solved apart as a
linear program with scipy's HiGHS), half of 3.07 ms of compute plus 13.3 ms of write-back,
the split between the GPU->host queue and the fault path that balances them. Before it the
bound was 3.78 ms (the transfer term: 34,561 cold pages at the links' combined rate). The best
mode (``deepum-launch``, queue 1024) takes 75.4 ms and writes back 735 MiB. What is left out:

  * Charging each run to its last gap: charging it to any gap of its span that is lost (the
    relaxation as proved) is a harder problem; its linear program gives 57,634 pages on
    Mixtral. A run's write-back is also charged only when its block loses its chunk, not when
    the page alone is pre-evicted.
  * The other kernels: ``W`` is counted for the whole replay and the term taken at its end
    only; a kernel k whose write-backs come early and compute late (``C_{>k}``) would give more.
  * The dual ascent stops after ``3 * WB_ITERS`` steps: at fit scale it comes within 3 % of
    the relaxation's optimum on mixtral-8x7b (2x), gpt2-l (2x), gpt2-xl (3x), bert-base (4x),
    resnet152 (4x) and sd15-unet (2x), but only to 75 % of it on llama-7b at 3x (232,451 of
    310,583 pages; thousands of steps reach 98 %).
  * A page's reload waits for its write-back (``host_ready``); the term adds the two paths'
    times as if independent.
  * Chunk granularity of reloads: a block that gives up its chunk loses all its pages, so the
    reloads that block room forces are a lower bound; on Mixtral the same block relaxation
    needs only 4,638 reloaded pages (18 MiB), and page-level MIN counts far more on the dense
    models (gpt2-xl: 332,844 capacity pages against 34,785 from blocks). The fault path's
    64 KiB granularity is no term: a controller's prefetch moves any page range.
  * Fault-service costs are no term: a policy that has every page there in time faults on
    nothing, and a prefetch of never-populated pages is a zero-fill beside the copy engine.

Cost: at the DeepUM paper's scale (``v100-pcie3``) the bound takes 3.1 s and 252 MB peak RSS for
GPT-2 XL batch 5, 2 iterations (1.1 s and 247 MB without the write-back term; 14.45 s against
14.21 s, ``W`` = 31.5 M pages), and 13.6 s and 745 MB for ResNet-152 batch 1280 (3.4 s and
706 MB before; still limited by the transfer term), workload included, on the 2-core VM.
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
#: the write-back relaxation's dual (``_writeback_pages``): steps of each ascent, and the ascents
#: (scale over total cost per over-full point, root-mean-square normalisation, patience); the
#: best of them against the relaxation's exact optimum (a linear program, solved apart with
#: scipy's HiGHS, which umctl does not depend on): the module docstring's *Write-back* list
WB_ITERS = 400
WB_ASCENTS = ((4.0, False, 10), (1.0, True, 10), (0.05, True, 30))


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
    #: which term gave the bound: "compute", "transfer", "writeback", "host" or "copy"
    limited_by: str
    #: the kernel (index among kernels) whose transfer term is the largest, -1 if none
    critical_kernel: int
    gpu_pages: int
    #: pages every replay writes back to the host before its last kernel ends (the block
    #: relaxation's least cost, from below), and the term that adds them to the last kernel's
    #: transfers (module docstring, *Write-back*)
    writeback_pages: int = 0
    writeback_term_ns: float = 0.0

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
    cold, cap_miss, per_kernel, per_kernel_pin, wb_pages = _min_transfers(workload, kidx, gpu_pages, pins)
    a = PAGE_SIZE / calib.prefetch_h2d_Bps * 1e9
    b = PAGE_SIZE / calib.fault_h2d_Bps * 1e9
    term = _transfer_terms(compute, per_kernel.astype(np.float64), per_kernel_pin.astype(np.float64), a, b,
                           min(a, b))
    crit = int(np.argmax(term)) if len(term) else -1
    transfer = float(term[crit]) if len(term) else 0.0
    wb = _writeback_term(C, float(per_kernel[-1]) if len(per_kernel) else 0.0,
                         float(per_kernel_pin[-1]) if len(per_kernel_pin) else 0.0, float(wb_pages), a, b, min(a, b),
                         PAGE_SIZE / calib.d2h_Bps * 1e9)
    parts = {"compute": C, "transfer": transfer, "writeback": wb, "host": host_chain, "copy": copy_ns}
    limited = max(parts, key=parts.get)
    return Bound(time_ns=max(parts.values()), compute_ns=C, transfer_term_ns=transfer, host_chain_ns=host_chain,
                 copy_ns=copy_ns, transfer_pages=int(cold + cap_miss), cold_pages=int(cold),
                 capacity_pages=int(cap_miss), limited_by=limited, critical_kernel=crit, gpu_pages=gpu_pages,
                 writeback_pages=int(wb_pages), writeback_term_ns=wb)


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


def _writeback_term(C: float, n: float, n_pin: float, wb: float, a: float, b: float, b_pin: float,
                    w: float) -> float:
    """The least time of a replay that, by the end of its last kernel, moves ``n`` pages to the
    GPU (``n_pin`` of them possibly as stall at ``b_pin``) and writes ``wb`` pages back: x pages
    through the prefetch queue (``a`` each) and y through the GPU->host queue (``w`` each),
    both serial from time 0 and ending before the last kernel does, the rest as the fault
    path's stall (``b``, ``b_pin``, and ``w`` per page written back). The least T with
    ``C + stall(T) <= T``, the queues taking ``T/a`` and ``T/w`` pages (the dearest first): the
    stall side only falls as T grows, so bisection keeps a T that is still too small."""
    n_ord = n - n_pin

    def over(T: float) -> bool:
        q = T / a                                  # pages the prefetch queue can carry by T
        stall = b * max(0.0, n_ord - q) + b_pin * max(0.0, n_pin - max(0.0, q - n_ord))
        return C + stall + w * max(0.0, wb - T / w) > T

    lo, hi = 0.0, C + n_ord * b + n_pin * b_pin + wb * w
    if not over(lo):
        return 0.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if over(mid):
            lo = mid
        else:
            hi = mid
    return lo


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
                   pins: bool = False) -> tuple[int, int, np.ndarray, np.ndarray, int]:
    """Page-level MIN over the workload's page classes (see the module docstring): cold
    (costly compulsory) misses, costly capacity misses, and per kernel the costly misses by
    its end (cumulative), all of them and those of classes the host writes where ``pins``
    (pinned pages may be read remotely: such classes take no room and count only their
    compulsory misses); and the pages that must be written back before the last kernel ends
    (``_writeback_pages``) on a GPU of ``gpu_pages // 512`` chunks."""
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
    r_op, r_lo, r_hi, r_wr = r_op[keep], r_lo[keep], r_hi[keep], runs.write[keep]
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
        return 0, 0, np.zeros(nk, np.int64), np.zeros(nk, np.int64), 0
    c_size = np.diff(cuts)                       # class c = pages [cuts[c], cuts[c + 1])
    c_host = np.zeros(len(c_size), np.bool_)     # starts populated on the host
    if len(h_lo):
        a0, a1 = np.searchsorted(cuts, h_lo), np.searchsorted(cuts, h_hi)
        c_host[_ranges_idx(a0, a1 - a0)] = True

    # expand runs and deaths into (class, op) events
    ra, rb = np.searchsorted(cuts, r_lo), np.searchsorted(cuts, r_hi)
    rcls = _ranges_idx(ra, rb - ra)
    rop = np.repeat(r_op, rb - ra)
    rwr = np.repeat(r_wr, rb - ra)               # a kernel's write (a host write is a birth)
    rseq = np.arange(len(rcls))                  # stream order inside an op
    del ra, rb, r_lo, r_hi, r_op, r_wr
    is_write = types[rop] == OpType.HOST_WRITE
    rwr &= ~is_write
    da, db = np.searchsorted(cuts, d_lo), np.searchsorted(cuts, d_hi)
    dcls = _ranges_idx(da, db - da)
    dop = np.repeat(d_op, db - da)
    cls = np.concatenate([rcls, dcls])
    op = np.concatenate([rop, dop])
    kind = np.concatenate([np.where(is_write, _WRITE, _USE), np.full(len(dcls), _DEATH)]).astype(np.int8)
    seq = np.concatenate([rseq, np.zeros(len(dcls), np.int64)])
    wr = np.concatenate([rwr, np.zeros(len(dcls), np.bool_)])
    del rcls, rop, rseq, dcls, dop, is_write, rwr
    # first touch of each class in a kernel only (a relaxation); host writes and deaths once per
    # op; a class's event in a kernel writes if any of its accesses there does
    o = np.lexsort((seq, kind, cls, op))
    cls, op, kind, seq, wr = cls[o], op[o], kind[o], seq[o], wr[o]
    dup = np.zeros(len(cls), np.bool_)
    dup[1:] = (cls[1:] == cls[:-1]) & (op[1:] == op[:-1]) & (kind[1:] == kind[:-1])
    if dup.any():
        grp = np.cumsum(~dup) - 1
        wr = np.bincount(grp, weights=wr, minlength=int(grp[-1]) + 1) > 0
    cls, op, kind, seq = cls[~dup], op[~dup], kind[~dup], seq[~dup]
    # the sequence: op order, then stream order inside a kernel (first touch)
    o = np.lexsort((seq, op))
    cls, op, kind, wr = cls[o], op[o], kind[o], wr[o]
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
    wb = _writeback_pages(cls, op, kind, wr, k_of, cuts[:-1] >> PAGE_TO_BLOCK_SHIFT, c_size, bypass, kidx,
                          gpu_pages // (BLOCK_SIZE // PAGE_SIZE))
    per_kernel = np.zeros(nk, np.int64)
    per_kernel_pin = np.zeros(nk, np.int64)
    sel = (kind == _USE) & (k_of >= 0)
    np.add.at(per_kernel, k_of[sel], per_event[sel])
    sel &= bypass[cls]
    np.add.at(per_kernel_pin, k_of[sel], per_event[sel])
    return cold, cap, np.cumsum(per_kernel), np.cumsum(per_kernel_pin), wb


def _writeback_pages(cls: np.ndarray, op: np.ndarray, kind: np.ndarray, wr: np.ndarray, k_of: np.ndarray,
                     c_block: np.ndarray, c_size: np.ndarray, bypass: np.ndarray, kidx: np.ndarray, chunks: int,
                     iters: int = WB_ITERS) -> int:
    """Pages that every replay on ``chunks`` 2 MiB chunks writes back to the host, each copy
    ending before the last kernel does: the block relaxation of the module docstring
    (*Write-back*), its minimum bounded from below by Lagrangian duality.

    The sequence (``cls``, ``op``, ``kind``, ``wr``, ``k_of``) is ``_min_transfers``'s: each
    class's first touch per kernel (``wr``: some access of it there writes), host writes and
    deaths. A block's *uses* are the kernels touching it (classes that may be pinned,
    ``bypass``, left out); gap j of a block runs from its use j to its next use, the last one
    to the end. A *run* is a class's write in a kernel up to the class's next write, death or
    host write: it costs its pages if the block loses its chunk in the last gap the run spans
    whole (the gap before the next write; before the death, if the block is used again before
    it; the block's last gap if the page lives to the end). At the first access of each kernel,
    at most ``chunks - 1`` gaps of other blocks covering that point are held. For prices
    ``mu >= 0`` on those points, holding gap g costs the prices of the points it covers, so
    ``sum_g min(cost_g, mu(g)) - (chunks - 1) * sum(mu)`` is at most the least cost (weak
    duality); ``iters`` steps of subgradient ascent choose the prices, and the best value
    found is returned (rounded down)."""
    nk = len(kidx)
    cap = chunks - 1
    if nk == 0 or cap < 0:
        return 0
    use = (kind == _USE) & (k_of >= 0) & ~bypass[cls]
    if not use.any():
        return 0
    blk = c_block[cls]
    # block uses (block, kernel), sorted; a block's gaps are its uses' positions in this list
    stride = nk + 1
    bu = np.unique(blk[use] * stride + k_of[use])
    ub, uk = bu // stride, bu % stride
    last = np.ones(len(bu), np.bool_)
    last[:-1] = ub[1:] != ub[:-1]
    # the point of each kernel: its first access (of a class that cannot be pinned)
    ev = np.flatnonzero(use)
    first = np.ones(len(ev), np.bool_)
    first[1:] = k_of[ev[1:]] != k_of[ev[:-1]]
    first_blk = np.full(nk, -1, np.int64)
    first_blk[k_of[ev[first]]] = blk[ev[first]]
    point = first_blk >= 0          # a kernel that touches nothing of that kind has no point
    # gap j covers the points of the kernels after use j, up to the next use (whose own point
    # only if its first access is to another block); the last gap to the last kernel
    nxt = np.append(uk[1:], 0)
    p_lo = uk + 1
    p_hi = np.where(last, nk - 1, nxt - (first_blk[np.minimum(nxt, nk - 1)] == ub))
    # runs: each write of a class, up to its class's next write, death or host write
    n = len(cls)
    o = np.lexsort((np.arange(n), cls))
    c_o, kind_o, wr_o, k_o, op_o = cls[o], kind[o], wr[o], k_of[o], op[o]
    term = (kind_o != _USE) | wr_o
    nt = np.where(term, np.arange(n), n)
    nt = np.minimum.accumulate(nt[::-1])[::-1]              # first terminator at or after i
    nt = np.append(nt[1:], n)                                # ... strictly after i
    has = nt < n
    has[has] = c_o[nt[has]] == c_o[has]
    r = np.flatnonzero((kind_o == _USE) & wr_o & (k_o >= 0) & ~bypass[c_o])
    if len(r) == 0:
        return 0
    rb = c_block[c_o[r]]
    t = nt[r]
    h = has[r]
    g_last = np.searchsorted(bu, rb * stride + stride) - 1  # the block's last gap (to the end)
    by_write = h & (kind_o[np.minimum(t, n - 1)] == _USE)
    g_last[by_write] = np.searchsorted(bu, rb[by_write] * stride + k_o[t[by_write]]) - 1
    by_death = h & ~by_write
    if by_death.any():
        kd = np.searchsorted(kidx, op_o[t[by_death]])         # kernels before the death
        g_last[by_death] = np.searchsorted(bu, rb[by_death] * stride + kd) - 2
    g_own = np.searchsorted(bu, rb * stride + k_o[r])        # the gap right after the write
    keep = g_last >= g_own
    cost = np.bincount(g_last[keep], weights=c_size[c_o[r[keep]]].astype(np.float64), minlength=len(bu))
    # gaps that cost nothing are lost for free, and those that cover no point held for free
    sel = (cost > 0) & (p_lo <= p_hi)
    cost, p_lo, p_hi = cost[sel], p_lo[sel], p_hi[sel]
    cov = np.bincount(p_lo, minlength=nk + 1) - np.bincount(p_hi + 1, minlength=nk + 1)
    if len(cost) == 0 or np.cumsum(cov)[:nk].max() <= cap:
        return 0
    # only the points over the room carry a price (at the others the prices stay 0), and only
    # the gaps covering one of them can be lost for a reason: renumber those points 0..m-1
    over = (np.cumsum(cov)[:nk] > cap) & point
    rank = np.concatenate(([0], np.cumsum(over)))          # over-full points before each point
    lo_r, hi_r = rank[p_lo], rank[p_hi + 1] - 1
    sel = hi_r >= lo_r
    cost, p_lo, p_hi = cost[sel], lo_r[sel], hi_r[sel]
    nk = int(rank[-1])
    if nk == 0 or len(cost) == 0:
        return 0
    point = np.ones(nk, np.bool_)
    scale = float(cost.sum()) / max(nk, 1)
    # three step rules (the best of them differs between workloads; each value is a bound)
    best = max(_dual_ascent(cost, p_lo, p_hi, point, nk, cap, iters, scale * k, l2, patience)
               for k, l2, patience in WB_ASCENTS)
    return int(np.floor(best * (1 - 1e-12)))


def _dual_ascent(cost: np.ndarray, p_lo: np.ndarray, p_hi: np.ndarray, point: np.ndarray, nk: int, cap: int,
                 iters: int, scale: float, l2: bool, patience: int) -> float:
    """Subgradient ascent on the prices ``mu`` of ``_writeback_pages``'s dual: the best value of
    ``sum_g min(cost_g, mu(g)) - cap * sum(mu)`` seen in ``iters`` steps. A step moves the prices
    by the points' excess of held gaps over ``cap``, normalised (largest excess, or root mean
    square over the over-full points), times ``scale``; the scale halves, from the best prices
    so far, after ``patience`` steps without progress."""
    cov = np.cumsum(np.bincount(p_lo, minlength=nk + 1) - np.bincount(p_hi + 1, minlength=nk + 1))[:nk]
    over = max(1, int(((cov > cap) & point).sum()))
    mu = best_mu = np.zeros(nk)
    best, stall = 0.0, 0
    for _ in range(iters):
        P = np.concatenate(([0.0], np.cumsum(mu)))
        mg = P[p_hi + 1] - P[p_lo]                 # the price of holding each gap
        held = cost > mg
        val = float(np.minimum(cost, mg).sum() - cap * P[-1])
        if val > best:
            best, best_mu, stall = val, mu, 0
        else:
            stall += 1
            if stall >= patience:
                scale, mu, stall = scale / 2, best_mu, 0
                continue
        g = np.cumsum(np.bincount(p_lo[held], minlength=nk + 1) - np.bincount(p_hi[held] + 1, minlength=nk + 1))[:nk]
        g = np.where(point, g - cap, 0).astype(np.float64)
        norm = float(np.sqrt((g * g).sum() / over)) if l2 else float(np.abs(g).max())
        if norm == 0:
            break
        mu = np.maximum(0.0, mu + scale * g / norm)
    return best


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
