"""Discrete-event model of the nvidia-uvm driver serving a workload's access stream.

What is modelled, and why at this grain:
  * GPU memory is a number of 2 MiB chunks per GPU; a UM block that has any page on a GPU holds
    one chunk there (the driver evicts root chunks, not pages).
  * A kernel walks its access stream. The GPU runs ahead of a fault by a window of accesses
    (many warps fault concurrently); the distinct non-resident pages in that window, at most
    ``batch_max_faults``, form one fault batch. Servicing a batch stalls the kernel:
    ``batch_ns + fault_ns * faults + block_ns * (blocks - 1) + bytes / fault_h2d_Bps`` plus any
    eviction it needs (the driver services a batch block by block).
  * Each fault grows to its 64 KiB big page (the driver's fault granularity), then the stock
    density prefetcher (tree over the block's 512 pages, threshold 51 %) extends each batch, and eviction of whole chunks (the least recently migrated into, the driver's
    list; ``eviction_refresh = "access"`` makes it a true LRU as a what-if) runs on the fault
    path when no chunk is free: that is the "naive UM" baseline.
  * Commands from a controller (prefetch, pre-evict, invalidate, advise) run asynchronously on
    per-GPU copy engines with their transfer cost; demand transfers pre-empt prefetch
    transfers. A page whose prefetch is still in flight faults and waits for it.
  * Evicting a page writes it back unless another valid copy exists; invalidated pages are
    dropped without write-back and their next touch zero-fills without a transfer. A
    controller's prefetch into a full GPU evicts the least recently migrated chunk as the driver
    does (``prefetch_evicts``). Write-backs are waited for, as the driver's block tracker
    orders copies: a chunk is free for reuse only when the copies out of it end (``wb_busy``;
    a partial pre-eviction keeps the chunk busy, and a collapse, discard or eviction of the
    block then waits for it), and a page is read back from the host (fault, prefetch, remote
    mapping, host write) only when its queued write-back has landed (``host_ready``).
  * The driver's thrashing heuristics (uvm_perf_thrashing.c; ``thrashing_*`` in the
    calibration, the rules in ``_simcore.c``): pages migrated back and forth by faults within
    the lapse are detected, the processors fighting over them throttled, and pages throttled
    often enough pinned on the host and mapped remotely by the GPUs. One GPU evicting and
    re-faulting its own data never counts as thrashing there, so the single-GPU training
    loops are unaffected; host<->GPU ping-pong is where it acts.

  * HUVM (memHarvester, ATC'22) driver features, off unless a controller configures them
    (``ControllerContext.harvest``): a GPU may lend free chunks to another GPU's evicted data
    (*harvested* chunks, a victim cache); pre-eviction to a neighbour GPU and ``Op.STAGE`` put
    data there; a background thread writes harvested data back to the host on the lender's
    PCIe lane, after which the chunk is *removable*. The owner fetches harvested pages over
    NVLink (faults and prefetches; prefetches from spare memory use their own NVLink queue).
    A lender's own demand reclaims harvested chunks before its own (removable first, the
    earliest placed first), waiting for a write-back still under way; a full lender replaces
    its harvested chunks the same way. Per GPU, evictions on the fault path may go to the
    neighbours round robin, part of each fault batch may come through a neighbour's PCIe lane
    in parallel, and write-back may run at a faster (large-page) rate.
  * Independent jobs, one process per GPU (a shared server: the ``tenants`` family), each run
    on their own host thread and are interleaved in the order of their own clocks, one drain
    at a time (``_run_tenants``), so that the controller hears every job's events when they
    happen and its commands run at the time of the GPU they act on. One process's kernels
    launched back to back on several GPUs (SnuRHAC's split kernels, a hand-written
    multi-GPU program) run side by side the same way (``_run_concurrent``). Either way a
    drain is cut when the earliest clock passes its deadline, holding every GPU's events up
    to then (``_in_time_order``).

  * Nodes (``workload.meta["nodes"]``, SnuRHAC's cluster): GPUs spread evenly over nodes, the
    host memory on node 0; crossing nodes adds a network leg (a fixed share of a node's link)
    and SnuRHAC's fault-protocol round trips (``_init_nodes``, ``_simcore.c``); GPU sets are
    8-bit masks up to 8 GPUs and 32-bit ones beyond (two builds of the core, ``core.py``).

  * Advice: read-mostly duplicates on read faults (writes collapse the copies); preferred
    location is recorded but has no effect yet.
  * Explicit copies (``OpType.COPY``): ``cudaMemcpy`` is pageable (host blocks), ``cudaMemcpyAsync``
    pinned (host goes on); both run in stream order, so a kernel waits for every copy before it.
  * Chunked copies into managed memory (``OpType.UM_COPY``, a mode's rewrite of H2D copies, e.g.
    HUM's): the host does not wait; the copy is split in 2 MiB chunks, staged by a thread pool
    and migrated by one page-migration thread serving one queue per copy round-robin
    (``umcopy.py``); the stream moves on once the copy is initiated, so the next kernel starts
    early; each chunk is one in-flight transfer entry, so a GPU touch of a page not yet copied
    faults and waits for its chunk; the source pages are write-protected until their chunk is
    staged, so a host write to one waits for it and the program computes what plain CUDA does.
    ``OpType.STREAM_WAIT`` makes the stream wait for the chunked copies issued on it (where the
    mode's runtime keeps the ordinary stream order); a SYNC waits for them too.

  * The launch queue (``launch_queue=Q``, off by default): the host issues kernel launches
    ahead of the GPU, at most Q launches per GPU issued and not yet started (the host blocks
    on the Q+1-th: launch k is issued at max(host clock, start of the kernel Q launches before
    it on that GPU), and the host clock carries that wait). A SYNC, a pageable copy or a host
    write is a point the host cannot pass before the GPU side does, so no launch after it is
    issued before it completes: the queue drains there. A controller subscribing to
    ``Kind.LAUNCH_ARGS`` hears each launch as issued, with the ranges its pointer arguments
    name (``_launch_ranges``); LAUNCH itself stays the kernel's start (the execution-ID
    transition). Off (None), launches are seen at the kernel's start and the host never
    blocks on them, as before the queue was modelled; Q = 0 also shows each launch at its
    kernel's start (no lookahead) but makes the host wait for it.

Invariants (tests/test_sim_invariants.py): chunks in use never exceed capacity, every faulting
access completes, bytes are conserved (each migrated byte is counted once per move), the same
seed gives the same result.

The walk over the access stream and fault servicing are C (``_simcore.c``, through
``core.py``); this module owns the state arrays and does everything per command or per
operation. Replay-only controllers (the oracle) may replace LRU by Belady through
``ControllerContext.belady``.
"""

from __future__ import annotations

import ctypes as C
import heapq
import time as _time
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from .. import UmctlError
from ..controller.base import Controller, ControllerContext
from ..events.schema import Access, Advice, AllocOp, Cause, EventBatch, Kind, Op, Status, empty
from ..loop.control import ControlLoop
from ..workload.workload import AccessRuns, Init, OpType, Workload
from ..units import CPU, GiB, PAGE_SHIFT, PAGE_SIZE, PAGE_TO_BLOCK_SHIFT, PAGES_PER_BLOCK
from . import core
from .calibration import DEFAULT, Calibration
from .pagespace import PageSpace
from .umcopy import ChunkedCopies


@dataclass
class SimResult:
    """Totals of one replay; the report and ``--json`` read these."""

    mode: str
    workload: str
    time_ns: int = 0
    faults: int = 0
    fault_batches: int = 0
    bytes_h2d: int = 0
    bytes_d2h: int = 0
    bytes_p2p: int = 0
    demand_bytes: int = 0
    driver_prefetch_bytes: int = 0
    user_prefetch_bytes: int = 0
    copy_bytes: int = 0
    evictions: int = 0
    evicted_bytes: int = 0
    preevictions: int = 0
    preevicted_bytes: int = 0
    invalidated_bytes: int = 0
    prefetch_pages: int = 0
    prefetch_used: int = 0
    prefetch_wasted: int = 0
    stall_ns: int = 0
    compute_ns: int = 0
    #: chunked copies into managed memory (OpType.UM_COPY), their 2 MiB chunks, and the host
    #: time spent waiting on write-protected source pages
    um_copies: int = 0
    um_copy_chunks: int = 0
    write_protect_wait_ns: int = 0
    kernels: int = 0
    accesses: int = 0
    commands: int = 0
    wall_s: float = 0.0
    controller: dict = field(default_factory=dict)
    #: under a soft budget (Simulator(budget_bytes=...)): the loop's budget figures and the
    #: budget check's verdict (None without a budget: the GPU's size was the limit)
    budget: dict | None = None
    budget_held: bool | None = None
    budget_check: dict | None = None
    #: per kernel: start/end ns and faults (for timelines)
    kernel_start_ns: np.ndarray | None = None
    kernel_end_ns: np.ndarray | None = None
    kernel_faults: np.ndarray | None = None
    #: when each iteration of the workload (ops' ``iteration``) ended, and its faults
    iteration_end_ns: np.ndarray | None = None
    iteration_faults: np.ndarray | None = None
    #: every fault charged to one cause (core.FAULT_CAUSES): how the page had left the GPU
    #: (never there, evicted by the driver, pre-evicted or discarded by the controller, ...)
    #: or why it was not usable yet (a prefetch still in flight); totals and per iteration
    fault_causes: dict = field(default_factory=dict)
    iteration_fault_causes: np.ndarray | None = None
    kernel_fault_causes: np.ndarray | None = None     # kernels x causes (which kernel pays for what)
    #: per GPU: when its last kernel ended, and the time its kernels ran (compute + fault
    #: stalls). On a shared server (independent jobs, one GPU each) every job has its own
    #: host thread and the jobs run interleaved in time order, so each is its tenant's time.
    gpu_end_ns: np.ndarray | None = None
    gpu_kernel_ns: np.ndarray | None = None
    #: HUVM features: lent chunks reclaimed by their GPU, fault-path evictions into a
    #: neighbour, bytes written back by lenders, lent chunks given up
    reclaims: int = 0
    spills: int = 0
    harvest_writeback_bytes: int = 0
    harvest_drops: int = 0
    staged_bytes: int = 0
    #: nvidia-uvm's thrashing heuristics (calibration thrashing_*): thrashing detections (a
    #: page counts again once its history was reset, as the driver's thrashing_stats count),
    #: and faults whose processor was throttled (made to wait out a nap) for them
    thrashing_pages: int = 0
    throttles: int = 0
    #: thrashing pages pinned on the host, and GPU accesses that read them through a remote
    #: mapping (over the link, without a fault)
    pins: int = 0
    remote_accesses: int = 0
    #: nodes (``workload.meta["nodes"]`` > 1): bytes that crossed the network between nodes, and
    #: the messages of SnuRHAC's fault protocol (descriptor locks, faulted lists, page requests)
    nodes: int = 1
    bytes_internode: int = 0
    internode_messages: int = 0
    #: with Simulator(timeline=True): (lane, label, t0_ns, t1_ns, group) per host operation,
    #: copy (per chunk for chunked copies) and kernel, for HUM figure 8-style timelines
    timeline: list | None = None

    @property
    def time_s(self) -> float:
        return self.time_ns / 1e9

    @property
    def steady_time_ns(self) -> int | None:
        """Time of the iterations after the first (warm-up: tables empty, caches cold), as
        the papers measure training throughput; None for single-iteration workloads."""
        e = self.iteration_end_ns
        return int(e[-1] - e[0]) if e is not None and len(e) > 1 else None

    @property
    def steady_faults_per_iter(self) -> float | None:
        f = self.iteration_faults
        return float(f[1:].mean()) if f is not None and len(f) > 1 else None

    @property
    def steady_fault_causes_per_iter(self) -> dict | None:
        """Faults per steady iteration (after the first) by cause."""
        c = self.iteration_fault_causes
        if c is None or len(c) < 2:
            return None
        return dict(zip(core.FAULT_CAUSES, (float(x) for x in c[1:].mean(axis=0))))

    @property
    def prefetch_accuracy(self) -> float | None:
        """Prefetched pages used before they were evicted, over prefetched pages."""
        return self.prefetch_used / self.prefetch_pages if self.prefetch_pages else None

    @property
    def prefetch_coverage(self) -> float | None:
        """Would-be faults served by a prefetch instead: used / (used + faults)."""
        total = self.prefetch_used + self.faults
        return self.prefetch_used / total if self.prefetch_pages and total else None

    def summary(self) -> dict:
        d = {k: v for k, v in asdict(self).items()
             if not isinstance(v, np.ndarray) and v is not None and k != "timeline"}
        d["time_s"] = self.time_s
        d["prefetch_accuracy"] = self.prefetch_accuracy
        d["prefetch_coverage"] = self.prefetch_coverage
        d["steady_time_ns"] = self.steady_time_ns
        d["steady_faults_per_iter"] = self.steady_faults_per_iter
        d["steady_fault_causes_per_iter"] = self.steady_fault_causes_per_iter
        d["iteration_faults"] = self.iteration_faults.tolist() if self.iteration_faults is not None else None
        d["gpu_end_ns"] = self.gpu_end_ns.tolist() if self.gpu_end_ns is not None else None
        d["gpu_kernel_ns"] = self.gpu_kernel_ns.tolist() if self.gpu_kernel_ns is not None else None
        return d


_NO_RESULTS = empty(Kind.RESULT, 0)

_COLD, _EVICTED, _PREEVICTED, _DISCARDED, _MOVED, _HOST = (core.GONE.index(n) for n in (
    "cold", "evicted", "preevicted", "discarded", "moved", "host"))


#: A kernel touching one allocation in more than this many separate ranges gathers from one
#: tensor: its launch names the tensor (one range over them), not the rows (_launch_ranges).
_GATHER_RANGES = 8


def _ns(nbytes: float, Bps: float) -> float:
    """Transfer time in ns (the simulated clock) of nbytes at Bps bytes per second."""
    return nbytes / Bps * 1e9


class Simulator:
    """Closed-loop replay of one workload under one controller.

    The simulator is the two ends of the control loop a live session runs
    (:class:`~umctl.loop.control.ControlLoop`): the source (its events, delivered every drain)
    and the actuator (``submit`` / ``results``: the commands run on the model and are answered
    by RESULT records). ``budget_bytes``: the loop holds the live soft budget on a GPU of full
    size (``umctl replay --budget``), where a smaller ``gpu_mem`` is the driver's own limit."""

    def __init__(self, workload: Workload, controller: Controller, *, calib: Calibration = DEFAULT,
                 seed: int = 0, recorder=None, progress: Callable[[int, int], None] | None = None,
                 controller_delay_ns: int = 20_000, drain_ns: int = 1_000_000, timeline: bool = False,
                 budget_bytes: int | None = None, launch_queue: int | None = None):
        t_init = _time.perf_counter()
        workload = controller.prepare(workload)
        self.w = workload
        self.c = calib
        self.ctl = controller
        self.recorder = recorder
        self.progress = progress
        self.delay = float(controller_delay_ns)
        self.drain = float(drain_ns if controller.drain_ns is None else min(drain_ns, controller.drain_ns))
        self.n_gpus = G = workload.n_gpus
        if not 1 <= G <= core.MAX_GPUS:
            raise ValueError(f"the simulator models 1 to {core.MAX_GPUS} GPUs")
        a = workload.allocations
        # the access stream as runs within one 2 MiB block each, in compact pages: a run is
        # contiguous there too, and the core walks runs instead of a per-access array
        # and in one operation (cut where an operation's range starts or ends: a trace's flat
        # stream may run on across kernels), so a run is one block's accesses by one kernel
        ops = workload.ops
        ranged = ops[(ops["type"] == OpType.KERNEL) | (ops["type"] == OpType.HOST_WRITE)]
        runs = workload.acc_runs.cut_at(np.concatenate([ranged["acc_lo"], ranged["acc_hi"]]))
        runs = runs.split_blocks(PAGE_TO_BLOCK_SHIFT)
        try:
            self.space = PageSpace(a["addr"], a["bytes"])
            local = self.space.to_local_pages(runs.page)
        except ValueError:  # accesses outside every allocation: map their blocks too
            self.space = PageSpace(a["addr"], a["bytes"], runs.page)
            local = self.space.to_local_pages(runs.page)
        self.runs = AccessRuns(local, runs.length, runs.write)
        npg, nbl = self.space.npages, self.space.nblocks
        self.acc_win = (None if workload.acc_win is None
                        else np.ascontiguousarray(workload.acc_win, dtype=np.int32))

        # per-page state (shared with the C core)
        self._mask = core.WIDTHS[core.width(G)][1]   # the core's mask_t for this many GPUs
        self.gmask = np.zeros(npg, self._mask)        # bit g: valid copy on GPU g
        self.gone = np.zeros(npg, np.uint8)           # core.GONE: how the page last left a GPU
        self.cpu_valid = np.zeros(npg, np.bool_)      # valid copy on the host
        self.managed = np.zeros(npg, np.bool_)        # migrates on faults (else never faults)
        self.pf_entry = np.zeros(npg, np.int32)       # in-flight transfer bringing the page
        self.pf_tag = np.zeros(npg, np.bool_)         # prefetched by a command, not yet used
        self.seen = np.zeros(npg, np.uint8)           # scratch of the core
        self.entry_done = np.full(1024, -np.inf)      # entry 0: "nothing in flight"
        self.read_mostly = np.zeros(nbl, np.bool_)
        self.preferred = np.full(nbl, -2, np.int16)   # advice recorded, no effect modelled yet
        # per-GPU chunk state
        self.cap = np.array([int(m) // (PAGES_PER_BLOCK * PAGE_SIZE) for m in workload.gpu_mem], np.int64)
        self.used = np.zeros(G, np.int64)
        self.maxblocks = np.zeros(G, np.int64)
        self.has_chunk = np.zeros((G, nbl), np.bool_)
        self.pinned = np.zeros((G, nbl), np.bool_)
        self.lru = np.zeros((G, nbl))
        self._evict_key: np.ndarray | None = None
        self._next_run: np.ndarray | None = None     # Belady (oracle): per run, see _belady
        self.rescount = np.zeros((G, nbl), np.int32)
        maxp = max(1, int(self.cap.max()))
        self.pending = np.zeros((G, maxp))
        self.npending = np.zeros(G, np.int64)
        self.max_active = 1 << 14
        self.active = np.zeros((G, self.max_active), np.int64)
        self.nactive = np.zeros(G, np.int64)
        self.h2d_tail = np.zeros(G)
        self.d2h_tail = np.zeros(G)
        self.counters = np.zeros(len(core.ST_NAMES), np.int64)   # the core's statistics (core.ST)
        # write-backs are awaited (module doc): when the copies out of each chunk end, and when
        # each page's latest queued write-back reaches the host (0: none pending)
        self.wb_busy = np.zeros((G, nbl))
        self.host_ready = np.zeros(npg)
        # HUVM driver state (see the module docstring)
        self.harvested = np.zeros((G, nbl), np.uint8)
        self.removable_at = np.zeros((G, nbl))
        self.spill_mask = np.zeros(G, np.int64)
        self.spill_rr = np.zeros(G, np.int64)
        self.fetch_via = np.full(G, -1, np.int64)
        self.wb_Bpns = np.zeros(G)
        self.p2p_tail = np.zeros(G)
        self.nlent = np.zeros(G, np.int64)             # chunks of g holding harvested data
        self.lend_cap = np.full(G, -1, np.int64)       # most chunks g lends (-1: no limit)
        self.stream = [0.0] * G
        self.host = 0.0
        #: while GPUs or tenants are interleaved (_in_time_order): the GPU running now
        self._own_gpu: int | None = None
        #: GPUs or jobs run interleaved in time order (``_in_time_order``): the drain is cut
        #: there, once the earliest of them has passed its deadline
        self._interleaved = False
        #: while the controller handles a delivery: its time, the clock its queries read
        self._t_deliver: float | None = None
        #: interleaved GPUs' next pause: one drain interval after the earliest passed the last
        self._step_at = 0.0
        self.r = SimResult(mode=controller.name, workload=workload.name)
        self._um: dict[int, ChunkedCopies] = {}        # per GPU, created by the first UM_COPY
        self._protect = np.zeros(npg)                  # source page write-protected until (ns)
        self._tl: list | None = [] if timeline else None
        self._tl_copies: list = []
        self.lib = core.lib(G)
        self.cs = core.SimState(
            npg=npg, nbl=nbl, ngpu=G, max_pending=maxp, max_active=self.max_active,
            any_read_mostly=0, batch_ns=calib.batch_ns, fault_ns=calib.fault_ns, block_ns=calib.block_ns,
            fault_h2d_Bpns=calib.fault_h2d_Bps / 1e9, nvlink_Bpns=calib.nvlink_Bps / 1e9, d2h_Bpns=calib.d2h_Bps / 1e9,
            evict_chunk_ns=calib.evict_chunk_ns, density_threshold=calib.density_threshold,
            window_jitter=calib.window_jitter, transfer_latency_ns=calib.transfer_latency_ns,
            window_pages=calib.fault_window_pages, batch_max=min(calib.batch_max_faults, core.MAXB),
            prefetch_Bpns=calib.prefetch_h2d_Bps / 1e9, hbm_Bpns=calib.hbm_Bps / 1e9,
            n_entries=1, max_entries=len(self.entry_done),
            rng=(seed * 0x9E3779B97F4A7C15 + 1) & 0xFFFFFFFFFFFFFFFF)
        for name in ("gmask", "cpu_valid", "managed", "pf_tag", "pf_entry", "entry_done", "read_mostly",
                     "has_chunk", "pinned", "lru", "rescount", "used", "cap", "maxblocks", "pending", "npending",
                     "active", "nactive", "h2d_tail", "d2h_tail", "seen",
                     "harvested", "removable_at", "spill_mask", "spill_rr", "fetch_via", "wb_Bpns", "p2p_tail",
                     "nlent", "lend_cap", "gone", "wb_busy", "host_ready"):
            setattr(self.cs, name, core.ptr(getattr(self, name)))
        self.cs.stats = core.ptr(self.counters)
        self.cs.drop_reason = _EVICTED
        self.csp = C.byref(self.cs)
        self.out = core.EventOut()
        self._set_runs(self.runs)
        self._pf_out = (C.c_double * 6)()
        self._init_allocations()
        self.maxblocks[:] = self.cap - self.pinned.sum(1)
        self.cs.thr_threshold, self.cs.thr_max_resets = calib.thrashing_threshold, calib.thrashing_max_resets
        self.cs.thr_lapse_ns, self.cs.thr_nap_ns = calib.thrashing_lapse_ns, calib.thrashing_nap_ns
        self.cs.thr_epoch_ns, self.cs.prefetch_evicts = calib.thrashing_epoch_ns, int(calib.prefetch_evicts)
        self.cs.lru_on_access = int(calib.eviction_refresh == "access")
        self.cs.fault_gran = calib.fault_granularity_pages
        self.cs.thr_pin_threshold, self.cs.thr_pin_ns = calib.thrashing_pin_threshold, calib.thrashing_pin_ns
        self.cs.remote_ns = _ns(PAGE_SIZE, calib.prefetch_h2d_Bps)   # a page read through a remote mapping
        self.remote = np.zeros(npg, self._mask)       # bit g: GPU g maps the page's host copy remotely
        self.cs.remote = core.ptr(self.remote)
        self._init_nodes(int(workload.meta.get("nodes", 1)))
        if calib.thrashing_threshold and not self.lib.sim_thr_init(self.csp):
            raise MemoryError("simulator thrashing state")
        leaves = 1 << max(0, nbl - 1).bit_length()
        self._lru_tree = np.full((G, 2 * leaves), -1, np.int32)
        self.cs.lru_tree, self.cs.lru_leaves = core.ptr(self._lru_tree), leaves
        self.lib.sim_lru_build(self.csp)
        self._managed_per_block = self.managed.reshape(-1, PAGES_PER_BLOCK).sum(1).astype(np.int32)

        # the control loop a live session runs (umctl/loop/control.py), with this simulator as
        # its actuator; under a budget it keeps the live residency estimate and soft budget on
        # a GPU of full size, else it needs no estimate (the model's residency is exact)
        # the model reports every page it brings onto a GPU (MIGRATION records, exact runs), so
        # the budget check need not take an OK prefetch's whole range as arrived
        # the launch queue (module doc): Simulator(launch_queue=Q), else ``-O launch_queue=Q``
        # (a replay option every mode takes, umctl/controller/options.py, handed over in the
        # controller's options); None: not modelled
        launch_q = launch_queue if launch_queue is not None else (getattr(controller, "options", None) or {}).get(
            "launch_queue")
        if launch_q is not None and (isinstance(launch_q, bool) or not isinstance(launch_q, (int, np.integer))
                                     or launch_q < 0):
            raise ValueError(f"launch_queue must be a count of launches >= 0, got {launch_q!r}")
        self.launch_queue = None if launch_q is None else int(launch_q)
        self.loop = ControlLoop(controller, self, n_gpus=G, budget_bytes=budget_bytes, migrations_on=True,
                                estimate=False, result_arrivals=False)
        self._issue_at = 0.0          # when the commands of the current delivery run
        self._next_cmd_id = 0
        self._result_parts: list[np.ndarray] = []
        self.emit = set(self.loop.kinds)
        #: under a budget the check rebuilds residency from the model's events, so MIGRATION
        #: records then describe residency page-exactly: a prefetch's arrivals (copied or
        #: populated), a pre-eviction's departures (clean pages dropped included), a discard's.
        #: Otherwise they count the bytes copied (what a trace's byte totals add up to).
        self._exact_residency = self.loop.check is not None
        if self._exact_residency:
            # every departure too (a fault-path eviction frees its whole chunk); the loop hands
            # a controller only the kinds it subscribes to, so what it sees is unchanged
            self.emit |= {Kind.MIGRATION, Kind.EVICTION}
        if recorder is not None:
            # LAUNCH_ARGS only where asked for (a subscriber, or a launch queue to record): a
            # recorded trace of the other modes stays what it was
            self.emit |= set(Kind) - {Kind.LAUNCH_ARGS}
            if launch_q is not None:
                self.emit.add(Kind.LAUNCH_ARGS)
        self.out.collect = int(bool(self.emit & {Kind.FAULT, Kind.REPLAY, Kind.MIGRATION, Kind.EVICTION}))
        # fault-path events reach the loop in drains, as on the live path (ring drained every
        # few ms); a loop that needs none of them (a controller, a budget) lets the core run freely
        self._timed = bool(self.loop.kinds & {Kind.FAULT, Kind.REPLAY, Kind.MIGRATION, Kind.EVICTION})
        self._next_drain = 0.0
        self._pending: dict[Kind, list[np.ndarray]] = {}
        self._launch_idx: list[int] = []   # kernels launched since the last delivery
        self._alloc_idx: list[int] = []    # allocator events since the last delivery
        self._prebuild_records()
        self._init_launch_queue()
        ctx = ControllerContext(n_gpus=G, gpu_mem=self.loop.controlled_memory(list(workload.gpu_mem)),
                                free_memory=self.loop.free_memory or self._free_memory,
                                workload=workload,
                                residency=self._residency, block_addr=self.space.block_addr(),
                                belady=self._belady, spare_memory=self._spare_memory,
                                harvest=self._configure_harvest)
        ctx.options["page_space"] = self.space
        # the stream the core walks: runs in compact pages, each within one 2 MiB block and
        # one operation (what ``belady(next_run=...)`` is indexed by)
        ctx.options["access_runs"] = self.runs
        ctx.options["calibration"] = calib
        controller.attach(ctx)
        self._init_s = _time.perf_counter() - t_init  # counted in wall_s: set-up is part of a replay

    # ------------------------------------------------------------------ set-up
    def _bit(self, g: int):
        """GPU g's bit in this replay's masks."""
        return self._mask(1 << g)

    def _init_nodes(self, nodes: int) -> None:
        """A cluster of ``nodes`` hosts with the GPUs spread evenly, GPU g on node g // (G / nodes);
        the program's host memory is node 0's. The network link of a node is shared by the transfers
        that use it at once, and the model walks one GPU's kernel at a time, so a queue per link
        would serialise GPUs that in fact run together: each transfer gets a fixed share instead.
        Host data leaves node 0 for the other nodes at once (every GPU runs its part of each kernel
        together) and enters a node for its GPUs: the share is the larger of the two. Between GPUs
        of two nodes, a node's GPUs share its link. Block descriptors sit on node
        (block // run) mod nodes, ``run`` being the controller's ``descriptor_run`` (SnuRHAC's
        round robin, §6.3)."""
        G = self.n_gpus
        if nodes < 1 or G % nodes:
            raise ValueError(f"{G} GPUs do not spread evenly over {nodes} node(s)")
        self.r.nodes = nodes
        if nodes == 1:
            return   # one host: the core's node pointers stay NULL
        per = G // nodes
        self._node = np.arange(G, dtype=np.int64) // per
        self._node_mask = np.array([sum(1 << h for h in range(n * per, (n + 1) * per)) for n in self._node],
                                   dtype=self._mask)
        self._net_host_Bpns = np.full(G, self.c.internode_Bps / max(nodes - 1, per) / 1e9)
        self._desc_node = ((self.space.global_blocks // self.ctl.descriptor_run) % nodes).astype(np.int32)
        cs = self.cs
        cs.node, cs.node_mask = core.ptr(self._node), core.ptr(self._node_mask)
        cs.net_host_Bpns, cs.desc_node = core.ptr(self._net_host_Bpns), core.ptr(self._desc_node)
        cs.net_peer_Bpns = self.c.internode_Bps / per / 1e9
        cs.net_latency_ns = float(self.c.internode_latency_ns)

    def _init_allocations(self) -> None:
        host = int(Init.HOST)
        for rec in self.w.allocations:
            if rec["managed"]:
                # one slice, not one per 2 MiB block: a full-scale model has tens of thousands
                # of blocks in a few hundred allocations
                lo, hi = self.space.local_span(int(rec["addr"]), int(rec["bytes"]))
                self.managed[lo:hi] = True
                if rec["init"] == host:
                    self.cpu_valid[lo:hi] = True
                continue
            for lo, hi in self.space.local_range(int(rec["addr"]), int(rec["bytes"])):
                if rec["gpu"] >= 0:
                    # cudaMalloc device memory: resident for good, holds its chunks.
                    g = int(rec["gpu"])
                    b = lo >> PAGE_TO_BLOCK_SHIFT
                    self.gmask[lo:hi] |= self._bit(g)
                    if not self.has_chunk[g, b]:
                        self.has_chunk[g, b] = True
                        self.pinned[g, b] = True
                        self.used[g] += 1
                    self.rescount[g, b] += hi - lo
        for g in range(self.n_gpus):
            if self.used[g] > self.cap[g]:
                raise ValueError(f"device allocations need {self.used[g]} chunks but GPU {g} has {self.cap[g]}")

    def _belady(self, next_access: np.ndarray | None = None, *, next_run: np.ndarray | None = None) -> np.ndarray:
        """Replay only: evict by Belady's MIN instead of LRU. The core keeps each block's key
        at minus the position of its next access on the same GPU as the kernels walk the
        stream; the smallest key is evicted first. Returns the (GPUs x blocks) key array,
        which the caller initialises (first access of each block) and may read.

        ``next_run[r]`` (one per run of ``ctx.options["access_runs"]``, whose runs each lie in
        one block and one operation) is the position of the next access to run r's block by
        the same GPU after the run's last access (int64 max: never); inside a run it is the
        next position. That is 8 bytes a run; ``next_access`` (one per access, the older form:
        8 bytes an access, gigabytes at the papers' scale) is still taken and reduced to it."""
        runs = self.runs
        if next_access is not None:
            if len(next_access) != runs.n_accesses:
                raise ValueError("next_access must give one position per access")
            nxt = np.asarray(next_access, dtype=np.int64)
            # cut the runs wherever the next access is not simply the next position
            inner = np.flatnonzero(nxt[:-1] != np.arange(1, len(nxt), dtype=np.int64)) + 1
            self._set_runs(runs.cut_at(inner))
            next_run = nxt[self.runs.pos[1:] - 1]
        if next_run is None or len(next_run) != len(self.runs):
            raise ValueError("next_run must give one position per run")
        self._next_run = np.ascontiguousarray(next_run, dtype=np.int64)
        self._evict_key = np.full_like(self.lru, -np.inf)
        self.cs.evict_key = core.ptr(self._evict_key)
        return self._evict_key

    def _set_runs(self, runs: AccessRuns) -> None:
        self.runs = runs
        self._run_write = runs.write.view(np.uint8)
        self._runs_c = (core.ptr(runs.page), core.ptr(self._run_write), core.ptr(runs.pos), len(runs))

    def _free_memory(self, g: int) -> int:
        """Bytes the driver can hand out without evicting: free chunks and chunks whose
        write-back is under way (as the driver's free list would count them soon)."""
        return self._free_chunks(g) * PAGES_PER_BLOCK * PAGE_SIZE

    def _spare_memory(self, g: int) -> int:
        """Bytes GPU g can lend now: free chunks and lent chunks already removable."""
        t = self._now()
        removable = int((self.harvested[g].astype(bool) & (self.removable_at[g] <= t)).sum())
        free = self._free_chunks(g)
        if self.lend_cap[g] >= 0:   # it lends only what its own job leaves unused
            free = max(0, min(free, int(self.lend_cap[g] - self.nlent[g])))
        return (free + removable) * PAGES_PER_BLOCK * PAGE_SIZE

    def _configure_harvest(self, gpu: int, spill_to=(), fetch_via: int = -1, writeback_Bps: float = 0.0,
                           lend_chunks: int = -1) -> None:
        """HUVM driver settings of one GPU (see ControllerContext.harvest). ``lend_chunks``:
        the most chunks it lends (-1: any free chunk)."""
        G = self.n_gpus
        if not 0 <= gpu < G or any(not 0 <= h < G or h == gpu for h in spill_to) or fetch_via == gpu \
                or fetch_via >= G:
            raise ValueError(f"bad harvest settings for GPU {gpu}: spill_to={spill_to}, fetch_via={fetch_via}")
        self.spill_mask[gpu] = sum(1 << int(h) for h in set(spill_to))
        self.fetch_via[gpu] = int(fetch_via)
        self.wb_Bpns[gpu] = float(writeback_Bps) / 1e9
        self.lend_cap[gpu] = int(lend_chunks)

    def _free_chunks(self, g: int) -> int:
        return int(self.cap[g] - self.used[g] + self.npending[g])

    def _residency(self, g: int) -> tuple[np.ndarray, np.ndarray, int]:
        """(blocks holding a chunk on g, blocks with every managed page on g, free chunks
        counting those being written back)."""
        complete = self.has_chunk[g] & (self.rescount[g] >= self._managed_per_block)
        return self.has_chunk[g], complete, self._free_chunks(g)

    # ------------------------------------------------------------------ transfers
    def _new_entry(self, done: float) -> int:
        """A transfer in flight, completing at ``done`` (the core allocates most of them)."""
        self._ensure_entries(1)
        e = int(self.cs.n_entries)
        self.entry_done[e] = done
        self.cs.n_entries = e + 1
        return e

    def _ensure_entries(self, k: int) -> None:
        if self.cs.n_entries + k > self.cs.max_entries:
            self.entry_done = np.concatenate([self.entry_done, np.full(len(self.entry_done) + k, -np.inf)])
            self.cs.entry_done = core.ptr(self.entry_done)
            self.cs.max_entries = len(self.entry_done)

    def _migration(self, t0, t1, src, dst, b, nbytes, cause, exec_id=-1):
        m = empty(Kind.MIGRATION, 1)
        m["t_ns"], m["t_end_ns"], m["src"], m["dst"] = int(t0), int(t1), src, dst
        m["addr"], m["bytes"], m["cause"], m["exec_id"] = int(self.space.global_blocks[b]) << 21, nbytes, int(cause), exec_id
        self._emit(Kind.MIGRATION, m)

    def _eviction_event(self, g, b, written, t, critical) -> None:
        self._eviction_events(g, np.array([b], np.int64), np.array([written], np.int64), np.array([float(t)]),
                              critical)

    def _eviction_events(self, g: int, b: np.ndarray, written: np.ndarray, t: np.ndarray, critical: bool) -> None:
        """EVICTION records of chunks evicted from g (blocks b, pages written back, times), and
        the MIGRATION of each write-back; one array per kind (a fault-heavy drain evicts many)."""
        if Kind.EVICTION in self.emit:
            ev = empty(Kind.EVICTION, len(b))
            ev["t_ns"], ev["gpu"], ev["addr"] = t.astype(np.int64), g, self.space.global_blocks[b] << 21
            ev["bytes_written"], ev["pages"], ev["critical"] = written * PAGE_SIZE, written, critical
            self._emit(Kind.EVICTION, ev)
        sel = written > 0
        if Kind.MIGRATION in self.emit and sel.any():
            m = empty(Kind.MIGRATION, int(sel.sum()))
            m["t_ns"] = m["t_end_ns"] = t[sel].astype(np.int64)
            m["src"], m["dst"], m["cause"], m["exec_id"] = g, CPU, int(Cause.EVICTION), -1
            m["addr"], m["bytes"] = self.space.global_blocks[b[sel]] << 21, written[sel] * PAGE_SIZE
            self._emit(Kind.MIGRATION, m)

    def _release_block(self, g: int, b: int, n_pages: int) -> None:
        """n_pages of block b left GPU g; free the chunk when none remain."""
        self.rescount[g, b] -= n_pages
        if self.rescount[g, b] <= 0:
            self.rescount[g, b] = 0
            if self.has_chunk[g, b] and not self.pinned[g, b]:
                self.lib.sim_release_chunk(self.csp, g, b, -1.0)

    def _take_chunk(self, g: int, b: int, t: float) -> float:
        victim, written = C.c_int64(), C.c_int64()
        ready = self.lib.sim_take_chunk_async(self.csp, g, b, t, C.byref(victim), C.byref(written))
        if victim.value >= 0:
            self._eviction_event(g, victim.value, written.value, t, False)
        return ready

    # ------------------------------------------------------------------ kernels
    def _kernel(self, i: int, op) -> None:
        for _ in self._kernel_steps(i, op):
            pass

    def _kernel_steps(self, i: int, op):
        """Kernel i, one drain at a time: yields the kernel's own clock each time it pauses at a
        drain deadline, so that independent tenants' kernels can be interleaved in time order
        (``_run_tenants``); run to the end in one go, it is the sequential replay."""
        g, pid, lo, hi, compute = self._kcols[i]
        start = max(self.stream[g], self.host)
        if self.launch_queue is not None:
            # the host issued this launch once its queue slot was free (module doc): it waits
            # for the start of the kernel Q launches before (Q = 0: this one's own start)
            p = self._qprev_list[i]
            if p >= 0:
                self.host = max(self.host, start if p == i else float(self._kstart[p]))
            self._issue_launches(i, start)
        elif self._args:
            self._launch_args_at(i, start)
        self.r.kernels += 1
        self.r.compute_ns += int(compute)
        self.r.accesses += hi - lo
        self._launch_event(i, op, g, pid, start)
        self._deliver(start, force=self.ctl.launch_sync)
        stall = C.c_double(0.0)
        faults = 0
        causes = np.zeros(len(core.FAULT_CAUSES), np.int64)
        pos = lo
        rp, rw, rpos, nruns = self._runs_c
        nx = core.ptr(self._next_run) if self._next_run is not None else None
        wn = core.ptr(self.acc_win) if self.acc_win is not None else None
        out = self.out
        rate = compute / (hi - lo) if hi > lo else 0.0
        while pos < hi:
            # counted per step: between steps other tenants' kernels run and fault
            faults0 = int(self.counters[core.ST["faults"]])
            causes0 = self.counters[core.FC].copy()
            # interleaved GPUs step a drain at a time on a clock of their own (``_step_at``),
            # whether or not anyone listens: how finely they interleave must not depend on a
            # subscriber or on when deliveries happen
            if self._interleaved:
                deadline = max(self._step_at, start)
            else:
                deadline = max(self._next_drain, start) if self._timed else np.inf
            pos = self.lib.sim_kernel(self.csp, g, rp, rw, rpos, nruns, nx, wn, lo, hi, pos, start, compute,
                                      C.byref(stall), deadline, C.byref(out))
            if pos < 0:
                raise UmctlError(f"GPU {g} has no memory left for managed data ({self.cap[g]} chunks of "
                                 f"2 MiB, all held by device allocations); raise --gpu-mem")
            if out.nb:
                t_last = float(out.views()["b_end"][out.nb - 1])
                self._batch_events(g, pid)
                if t_last >= deadline and not self._interleaved:
                    self._deliver(t_last)
            faults += int(self.counters[core.ST["faults"]]) - faults0
            causes += self.counters[core.FC] - causes0
            if pos < hi:
                yield start + rate * (pos - lo) + stall.value
        end = start + compute + stall.value
        self.r.stall_ns += int(stall.value)
        self.stream[g] = end
        self._kstart[i], self._kend[i] = start, end
        self._kfaults[i] = faults
        self._kcauses[i] = causes

    def _batch_events(self, g: int, pid: int) -> None:
        """Turn the core's drain buffers into event records (vectorised) and empty them."""
        o = self.out
        v = o.views()   # the counts read once: each ctypes field read costs as much as a slice
        nf, nb, ne, nm = o.nf, o.nb, o.ne, o.nm
        b_id, b_nf, b_t, b_end = v["b_id"][:nb], v["b_nf"][:nb], v["b_t"][:nb], v["b_end"][:nb]
        if ne and (Kind.EVICTION in self.emit or Kind.MIGRATION in self.emit):
            self._eviction_events(g, v["e_block"][:ne], v["e_written"][:ne], v["e_t"][:ne], True)
        if Kind.FAULT in self.emit:
            fb = v["f_batch"][:nf]
            f = empty(Kind.FAULT, nf)
            f["t_ns"], f["gpu"], f["pid"], f["batch_id"] = b_t[fb].astype(np.int64), g, pid, b_id[fb]
            f["addr"] = self.space.to_global_pages(v["f_page"][:nf]) << 12
            f["access"] = np.where(v["f_write"][:nf] != 0, Access.WRITE, Access.READ)
            self._emit(Kind.FAULT, f)
        if Kind.REPLAY in self.emit:
            rp = empty(Kind.REPLAY, len(b_id))
            rp["t_ns"], rp["gpu"], rp["batch_id"] = b_end.astype(np.int64), g, b_id
            rp["nfaults"], rp["t_start_ns"] = b_nf, b_t.astype(np.int64)
            self._emit(Kind.REPLAY, rp)
        if Kind.MIGRATION in self.emit and nm:
            mbatch, mblock = v["m_batch"][:nm], v["m_block"][:nm]
            for cause, nbytes in ((Cause.DEMAND, v["m_bytes"][:nm]), (Cause.DRIVER_PREFETCH, v["m_pf_bytes"][:nm])):
                sel = nbytes > 0
                m = empty(Kind.MIGRATION, int(sel.sum()))
                m["t_ns"], m["t_end_ns"] = b_t[mbatch[sel]].astype(np.int64), b_end[mbatch[sel]].astype(np.int64)
                m["src"], m["dst"], m["cause"], m["exec_id"] = CPU, g, int(cause), -1
                m["addr"] = self.space.global_blocks[mblock[sel]] << 21
                m["bytes"] = nbytes[sel]
                self._emit(Kind.MIGRATION, m)
        o.clear()

    def _prebuild_records(self) -> None:
        """LAUNCH and ALLOC records for every operation, built once (vectorised); at run
        time only their timestamps are filled in."""
        ops = self.w.ops
        self._launch_all = empty(Kind.LAUNCH, len(ops))
        if Kind.LAUNCH in self.emit:
            la = self._launch_all
            la["gpu"], la["pid"] = ops["gpu"], ops["pid"]
            la["func"] = ops["exec_hash"] & np.uint64(0xFFFFFFFFFFFF)
            la["exec_hash"], la["name_id"], la["seq"] = ops["exec_hash"], ops["name_id"], np.arange(len(ops))
            la["grid"], la["block"] = ops["grid"], ops["block"]
        self._alloc_all = empty(Kind.ALLOC, len(ops))
        if Kind.ALLOC in self.emit:
            al = self._alloc_all
            al["pid"], al["op"], al["addr"], al["bytes"] = ops["pid"], ops["mem_op"], ops["addr"], ops["bytes"]
            al["alloc_id"], al["managed"] = ops["alloc_id"], True

    def _emit(self, kind: Kind, records: np.ndarray) -> None:
        self._pending.setdefault(kind, []).append(records)

    def _launch_event(self, i, op, g, pid, t) -> None:
        if Kind.LAUNCH in self.emit:
            self._launch_all["t_ns"][i] = int(t)
            self._launch_idx.append(i)

    # ------------------------------------------------------------------ the launch queue
    def _launch_ranges(self) -> tuple[np.ndarray, np.ndarray]:
        """What each kernel's launch names: the address ranges of its pointer arguments, as
        LAUNCH_ARGS records without a time (CSR over operations: op i's are
        ``recs[ptr[i]:ptr[i + 1]]``), in the order the kernel first touches them.

        A workload has no argument list, so the ranges come from the access stream at tensor
        grain: the pages a kernel touches, merged into maximal contiguous ranges (a tensor is
        contiguous, and one a kernel reads in full is one range). A kernel that touches one
        allocation in more than ``_GATHER_RANGES`` separate pieces is gathering from one tensor
        (embedding rows, a graph's neighbours): its launch names the tensor's pointer, not the
        rows, so it gets one range spanning them. Built only when a controller listens."""
        ops = self.w.ops
        kern = np.flatnonzero(ops["type"] == OpType.KERNEL)
        ptr = np.zeros(len(ops) + 1, np.int64)
        lo_k, hi_k = ops["acc_lo"][kern].astype(np.int64), ops["acc_hi"][kern].astype(np.int64)
        runs = self.w.acc_runs.cut_at(np.concatenate([lo_k, hi_k]))
        r0 = np.searchsorted(runs.pos, lo_k, "right") - 1
        r1 = np.searchsorted(runs.pos, hi_k, "left")
        cnt = np.where(hi_k > lo_k, r1 - r0, 0)
        # (kernel, run) pairs: kernels may share stream positions (a trace), so no run is owned
        kk = np.repeat(np.arange(len(kern)), cnt)
        rr = np.repeat(r0 - np.concatenate(([0], np.cumsum(cnt)[:-1])), cnt) + np.arange(int(cnt.sum()))
        plo = runs.page[rr]
        phi = plo + runs.length[rr]
        first = runs.pos[rr]
        wr = runs.write[rr]
        # merge overlapping or adjacent page ranges per kernel: one key space, kernels apart
        span = int(phi.max()) + 1 if len(phi) else 1
        order = np.lexsort((plo, kk))
        kk, plo, phi, first, wr = kk[order], plo[order], phi[order], first[order], wr[order]
        key_lo = kk * span + plo
        key_hi = np.maximum.accumulate(kk * span + phi)
        new = np.ones(len(kk), np.bool_)
        new[1:] = key_lo[1:] > key_hi[:-1]
        starts = np.flatnonzero(new)
        g_k, g_lo = kk[starts], plo[starts]
        if len(starts):
            g_hi = np.maximum.reduceat(phi, starts)
            g_first = np.minimum.reduceat(first, starts)
            g_wr = np.maximum.reduceat(wr.astype(np.uint8), starts)
        else:
            g_hi, g_first, g_wr = phi, first, wr.astype(np.uint8)
        # gathers: more than _GATHER_RANGES ranges of one kernel in one allocation -> their span
        a = self.w.allocations
        a_order = np.argsort(a["addr"])
        a_addr = a["addr"][a_order].astype(np.int64)
        alloc = np.searchsorted(a_addr, g_lo << PAGE_SHIFT, "right") - 1   # -1: outside every allocation
        key = g_k * (len(a) + 1) + (alloc + 1)
        uk, inv, per = np.unique(key, return_inverse=True, return_counts=True)
        many = per[inv] > _GATHER_RANGES
        if many.any():
            o = np.argsort(key, kind="stable")
            ks = key[o]
            st = np.flatnonzero(np.concatenate(([True], ks[1:] != ks[:-1])))
            m_lo = np.minimum.reduceat(g_lo[o], st)
            m_hi = np.maximum.reduceat(g_hi[o], st)
            m_first = np.minimum.reduceat(g_first[o], st)
            m_wr = np.maximum.reduceat(g_wr[o], st)
            m_k = g_k[o][st]
            coll = per > _GATHER_RANGES           # per unique key, in the same (sorted) order
            keep = ~many
            g_k = np.concatenate([g_k[keep], m_k[coll]])
            g_lo = np.concatenate([g_lo[keep], m_lo[coll]])
            g_hi = np.concatenate([g_hi[keep], m_hi[coll]])
            g_first = np.concatenate([g_first[keep], m_first[coll]])
            g_wr = np.concatenate([g_wr[keep], m_wr[coll]])
        # a launch that names no managed range is still heard (one empty record): the queue
        # then shows every launch, in order
        bare = np.setdiff1d(np.arange(len(kern)), g_k)
        if len(bare):
            z = np.zeros(len(bare), np.int64)
            g_k, g_lo, g_hi = np.concatenate([g_k, bare]), np.concatenate([g_lo, z]), np.concatenate([g_hi, z])
            g_first = np.concatenate([g_first, z])
            g_wr = np.concatenate([g_wr, z.astype(g_wr.dtype)])
        order = np.lexsort((g_first, g_k))     # per kernel, in the order it first touches them
        g_k, g_lo, g_hi, g_wr = g_k[order], g_lo[order], g_hi[order], g_wr[order]
        op_of = kern[g_k]
        recs = empty(Kind.LAUNCH_ARGS, len(g_k))
        recs["gpu"], recs["pid"] = ops["gpu"][op_of], ops["pid"][op_of]
        recs["seq"], recs["exec_hash"] = op_of, ops["exec_hash"][op_of]
        recs["addr"] = (g_lo << PAGE_SHIFT).astype(np.uint64)
        recs["bytes"] = ((g_hi - g_lo) << PAGE_SHIFT).astype(np.uint64)
        recs["access"] = np.where(g_wr != 0, int(Access.WRITE), int(Access.READ))
        np.add.at(ptr, op_of + 1, 1)
        np.cumsum(ptr, out=ptr)
        return recs, ptr

    def _init_launch_queue(self) -> None:
        """Per kernel, the kernel whose start frees its slot in the queue (the Q-th launch
        before it on its GPU; Q = 0: itself), and the issuer's cursor (module doc)."""
        ops = self.w.ops
        q = self.launch_queue
        self._args = Kind.LAUNCH_ARGS in self.emit
        if self._args:
            self._args_all, self._args_ptr = self._launch_ranges()
        self._future_args: list[tuple[float, np.ndarray]] = []   # issued after the delivery time
        self._issue_cursor = 0          # every kernel before this op has been issued
        self._issue_host = 0.0          # the host clock there (the issuer's projection)
        if q is None:
            return
        self._qprev = np.full(len(ops), -1, np.int64)
        is_k = ops["type"] == OpType.KERNEL
        for g in np.unique(ops["gpu"][is_k]).tolist():
            k = np.flatnonzero(is_k & (ops["gpu"] == g))
            if q == 0:
                self._qprev[k] = k
            elif len(k) > q:
                self._qprev[k[q:]] = k[:-q]
        self._qprev_list = self._qprev.tolist()
        # where the host waits for the GPU side: no launch beyond it is issued before the main
        # walk has passed it (SYNC, a pageable copy, a host write whose time depends on the GPU's)
        t = ops["type"]
        self._issue_stop = ((t == OpType.SYNC) | (t == OpType.HOST_WRITE)
                            | ((t == OpType.COPY) & ~ops["is_async"])).tolist()

    def _launch_args_at(self, i: int, t: float) -> None:
        """No launch queue: kernel i's launch is heard at its start, with its ranges."""
        recs = self._args_all[self._args_ptr[i]:self._args_ptr[i + 1]]
        if len(recs):
            recs = recs.copy()
            recs["t_ns"] = int(t)
            self._emit(Kind.LAUNCH_ARGS, recs)

    def _issue_launches(self, i: int, now: float) -> None:
        """Kernel i starts at ``now``: issue (as LAUNCH_ARGS records) its launch if the issuer
        had not yet, then every later launch the host can issue before kernel i ends, in program
        order: until a stop (``_issue_stop``), or a launch whose queue slot frees only when a
        kernel not yet started starts. A launch issued after ``now`` (the host clock is later)
        waits in ``_future_args`` for the delivery that passes its time."""
        types = self._types
        qprev = self._qprev_list
        kstart = self._kstart
        if self._issue_cursor <= i:
            self._issue_cursor, self._issue_host = i, self.host
        j = self._issue_cursor
        n = len(types)
        proj = self._issue_host
        kernel, host_op = int(OpType.KERNEL), int(OpType.HOST)
        while j < n:
            typ = types[j]
            if typ == kernel:
                p = qprev[j]
                if j > i and p > i:   # its slot frees only when a kernel not yet started starts
                    break
                if p >= 0:
                    proj = max(proj, now if p == i else float(kstart[p]))
                if self._args:
                    recs = self._args_all[self._args_ptr[j]:self._args_ptr[j + 1]]
                    if len(recs):
                        recs = recs.copy()
                        recs["t_ns"] = int(proj)
                        if proj <= now:
                            self._emit(Kind.LAUNCH_ARGS, recs)
                        else:
                            self._future_args.append((proj, recs))
            elif j > i and self._issue_stop[j]:
                break
            elif typ == host_op:
                proj += float(self._ops_compute[j])
            j += 1
        self._issue_cursor, self._issue_host = j, proj

    # ------------------------------------------------------------------ other ops
    def _protect_wait(self, pages: np.ndarray, t0: float, dur: float) -> float:
        """How long a host write of ``pages`` (in order, over ``dur`` from ``t0``) stalls on
        pages write-protected by chunked copies: page j is written at t0 + dur*j/n unless an
        earlier stall pushed it later, so the write ends at max(t0 + dur, max_j(protect_j +
        dur*(n-j)/n))."""
        if not self._um or len(pages) == 0:
            return 0.0
        prot = self._protect[pages]
        n = len(pages)
        late = prot - (t0 + dur * np.arange(n) / n)
        return max(0.0, float(late.max()))

    def _host_write(self, op) -> None:
        lo, hi = int(op["acc_lo"]), int(op["acc_hi"])
        pages = self.runs.expand(lo, hi)[0]
        wait = self._protect_wait(pages, self.host, float(op["compute_ns"]))
        self.r.write_protect_wait_ns += int(wait)
        if self._tl is not None and wait > 0:
            self._tl.append(("host", "write-protect wait", self.host, self.host + wait, -1))
        self.host += wait
        pages = pages[self.managed[pages]]
        if len(pages):
            # a write to a page whose write-back is still under way waits for it to land
            self.host = max(self.host, float(self.host_ready[pages].max()))
        t0 = self.host
        t = self.host + float(op["compute_ns"])
        if len(pages):
            sel = pages[self.gmask[pages] != 0]
            if len(sel):
                # CPU faults on GPU-resident pages: thrashing ones may throttle the host
                on_gpu = np.ascontiguousarray(np.sort(sel), dtype=np.int64)
                t += self.lib.sim_thr_host(self.csp, core.ptr(on_gpu), len(on_gpu), t0) - t0
                back = sel[~self.cpu_valid[sel]]
                self.counters[core.ST["bytes_d2h"]] += len(back) * PAGE_SIZE
                if self.r.nodes > 1:   # the host is node 0: pages only other nodes hold cross the network
                    away = int(((self.gmask[back] & self._node_mask[0]) == 0).sum())
                    t += self.lib.sim_host_net_ns(self.csp, self.n_gpus - 1, away)
                t += len(sel) * PAGE_SIZE / GiB * self.c.cpu_fault_ns_per_GiB
                for g in range(self.n_gpus):
                    gs = sel[(self.gmask[sel] & self._bit(g)) != 0]
                    if len(gs):
                        blocks, counts = np.unique(gs >> PAGE_TO_BLOCK_SHIFT, return_counts=True)
                        for b, cnt in zip(blocks.tolist(), counts.tolist()):
                            self._release_block(g, b, cnt)
                wasted = int(self.pf_tag[sel].sum())
                self.counters[core.ST["prefetch_wasted"]] += wasted
                self.pf_tag[sel] = False
                self.gmask[sel] = 0
                self.gone[sel] = _HOST
                self.pf_entry[sel] = 0
                self.counters[core.ST["epoch"]] += 1
            self.cpu_valid[pages] = True
        self.host = t
        if self._tl is not None:
            self._tl.append(("host", f"write {self._alloc_name(int(op['addr']))}", t0, t, int(op["addr"])))

    def _copy(self, op) -> None:
        g = max(0, int(op["gpu"]))
        nbytes = int(op["bytes"])
        asynchronous = bool(op["is_async"])
        # hand-written asynchronous copies use pinned buffers; plain cudaMemcpy pageable ones
        bw = self.c.pinned_copy_Bps if asynchronous else self.c.pageable_copy_Bps
        start = max(self.host, self.stream[g])
        end = start + self.c.transfer_latency_ns + _ns(nbytes, bw)
        end += self.lib.sim_host_net_ns(self.csp, g, -(-nbytes // PAGE_SIZE))   # g on another node than the host
        self.stream[g] = end
        if not asynchronous:
            self.host = end
        self.r.copy_bytes += nbytes
        if self._tl is not None:
            src = int(op["addr"]) if op["copy_kind"] == 0 else int(op["dst_addr"])
            self._tl.append(("copy", f"{'H2D' if op['copy_kind'] == 0 else 'D2H'} {self._alloc_name(src)}",
                             start, end, src))
        if op["copy_kind"] == 1:
            self.counters[core.ST["bytes_d2h"]] += nbytes
        elif op["copy_kind"] == 0:
            self.counters[core.ST["bytes_h2d"]] += nbytes
        if Kind.COPY in self.emit:
            ev = empty(Kind.COPY, 1)
            ev["t_ns"], ev["t_end_ns"], ev["gpu"], ev["pid"] = int(start), int(end), g, int(op["pid"])
            ev["kind"], ev["src_addr"], ev["dst_addr"] = op["copy_kind"], op["addr"], op["dst_addr"]
            ev["bytes"], ev["is_async"] = nbytes, asynchronous
            self._emit(Kind.COPY, ev)

    def _alloc_name(self, addr: int) -> str:
        a = self.w.allocations
        i = np.nonzero((a["addr"] <= addr) & (addr < a["addr"] + a["bytes"]))[0]
        return self.w.names[int(a["name_id"][i[0]])] if len(i) and a["name_id"][i[0]] >= 0 else hex(addr)

    def _um_tail(self, g: int | None = None) -> float:
        """When the chunked copies issued so far (on GPU g, or on any) have arrived."""
        engines = self._um.values() if g is None or g < 0 else [self._um[g]] if g in self._um else []
        return max([e.tail_ns() for e in engines] + [0.0])

    def _set_entry_done(self, e: int, done: float) -> None:
        self.entry_done[e] = done

    def _um_copy(self, op) -> None:
        """A host->device copy into managed memory as chunked UM migrations (see umcopy.py):
        initiated once the stream reaches it, without blocking the host; every destination
        page is unmapped from wherever it was (the copy overwrites it) and marked in flight
        on its chunk's entry; the source pages are write-protected until their chunk is staged."""
        g = max(0, int(op["gpu"]))
        nbytes = int(op["bytes"])
        if nbytes <= 0:
            return
        eng = self._um.get(g)
        if eng is None:
            eng = self._um[g] = ChunkedCopies(stage_Bps=self.c.um_stage_Bps, migrate_Bps=self.c.prefetch_h2d_Bps,
                                              latency_ns=self.c.um_migrate_latency_ns, set_done=self._set_entry_done)
        init = max(self.host, self.stream[g])
        dst = self.space.local_range(int(op["dst_addr"]), nbytes)
        if sum(hi - lo for lo, hi in dst) * PAGE_SIZE < nbytes or not self.managed[dst[0][0]:dst[-1][1]].all():
            raise UmctlError("a chunked copy needs a managed destination (the mode's prepare() makes it managed)")
        # byte offset -> chunk: the destination is 2 MiB aligned, so each block range is one chunk
        n_chunks = -(-nbytes // (PAGES_PER_BLOCK * PAGE_SIZE))
        if len(dst) != n_chunks:
            raise UmctlError("a chunked copy's destination must start on a 2 MiB boundary")
        self._ensure_entries(n_chunks)
        entries = np.array([self._new_entry(np.inf) for _ in range(n_chunks)], np.int64)
        # each chunk's destination memory first: a chunk taken from an evicted block is written
        # only once that block's write-back is out of it
        dest_ready = np.full(n_chunks, init)
        for k, (lo, hi) in enumerate(dst):
            self._invalidate(lo, hi, init, count=False)
            b = lo >> PAGE_TO_BLOCK_SHIFT
            if not self.has_chunk[g, b]:
                dest_ready[k] = self._take_chunk(g, b, init)
                if dest_ready[k] < 0:
                    raise UmctlError(f"GPU {g} has no memory left for a chunked copy; raise --gpu-mem")
            else:
                dest_ready[k] = max(init, float(self.wb_busy[g, b]))
            self.lru[g, b] = np.inf     # not a victim for the copy's next chunks (its time below)
            self.lib.sim_lru_fix(self.csp, g, b)
        c = eng.issue(g, init, nbytes, entries, dest_ready)
        bit = self._bit(g)
        for k, (lo, hi) in enumerate(dst):
            b = lo >> PAGE_TO_BLOCK_SHIFT
            self.gmask[lo:hi] |= bit
            self.cpu_valid[lo:hi] = False
            self.pf_entry[lo:hi] = int(entries[k])
            self.rescount[g, b] += hi - lo
            self.lru[g, b] = c.done_ns[k]
            self.lib.sim_lru_fix(self.csp, g, b)
        src = np.concatenate([np.arange(lo, hi) for lo, hi in self.space.local_range(int(op["addr"]), nbytes)])
        chunk_of = np.minimum(np.arange(len(src)) * PAGE_SIZE // (PAGES_PER_BLOCK * PAGE_SIZE), n_chunks - 1)
        self._protect[src] = np.maximum(self._protect[src], c.staged_ns[chunk_of])
        self.stream[g] = init
        self.r.copy_bytes += nbytes
        self.r.um_copies += 1
        self.r.um_copy_chunks += n_chunks
        self.counters[core.ST["bytes_h2d"]] += nbytes
        self.counters[core.ST["epoch"]] += 1
        if self._tl is not None:
            self._tl_copies.append((c, int(op["addr"])))
        if Kind.COPY in self.emit:
            ev = empty(Kind.COPY, 1)
            ev["t_ns"], ev["t_end_ns"], ev["gpu"], ev["pid"] = int(init), int(c.end_ns), g, int(op["pid"])
            ev["kind"], ev["src_addr"], ev["dst_addr"] = op["copy_kind"], op["addr"], op["dst_addr"]
            ev["bytes"], ev["is_async"] = nbytes, True
            self._emit(Kind.COPY, ev)

    def _mem(self, i: int, op) -> None:
        t = self._now()
        if int(op["mem_op"]) == AllocOp.FREE:
            for lo, hi in self.space.local_range(int(op["addr"]), int(op["bytes"])):
                self._invalidate(lo, hi, t, count=False)
        if Kind.ALLOC in self.emit:
            self._alloc_all["t_ns"][i] = int(t)
            self._alloc_idx.append(i)

    # ------------------------------------------------------------------ controller loop
    def _deliver(self, t: float, force: bool = True) -> None:
        """Hand pending events to the control loop (and the recorder), as a live source hands
        over a drain: the loop filters them for the controller, keeps the budget, and submits
        the commands back to this simulator (its actuator); the COMMAND and RESULT records it
        returns go to the recorder next to the events. Unless forced, only once the drain
        interval has passed: the live sources also hand events over in drains, and one delivery
        per event would dominate a replay's cost."""
        if not force and t < self._next_drain:
            return
        if self._launch_idx:
            self._emit(Kind.LAUNCH, self._launch_all[self._launch_idx])
            self._launch_idx = []
        if self._future_args and self._future_args[0][0] <= t:
            k = 0
            while k < len(self._future_args) and self._future_args[k][0] <= t:
                self._emit(Kind.LAUNCH_ARGS, self._future_args[k][1])
                k += 1
            del self._future_args[:k]
        if self._alloc_idx:
            self._emit(Kind.ALLOC, self._alloc_all[self._alloc_idx])
            self._alloc_idx = []
        if not self._pending:
            return
        self._next_drain = t + self.drain
        arrays = {k: (v[0] if len(v) == 1 else _concat(v)) for k, v in self._pending.items()}
        self._pending = {}
        if self._interleaved:
            # a GPU that ran ahead of t has events after it: they belong to a later drain
            for k in list(arrays):
                a = arrays[k]
                late = a["t_ns"] > t
                if late.any():
                    self._pending[k] = [a[late]]
                    arrays[k] = a[~late]
                    if not len(arrays[k]):
                        del arrays[k]
            if not arrays:
                return
        ev = EventBatch(now_ns=int(t), arrays=arrays, names=self.w.names)
        if self.recorder is not None:
            self.recorder.write(ev)
        self._issue_at = t + self.delay
        self._t_deliver = t
        try:
            out = self.loop.step(ev)
        finally:
            self._t_deliver = None
        if self.recorder is not None and len(out):
            self.recorder.write(out)

    # ------------------------------------------------------------------ the loop's actuator
    def submit(self, cmds: np.ndarray) -> np.ndarray:
        """The Actuator protocol (umctl/loop/control.py): run the commands on the model at the
        current delivery's time plus the controller's delay (:meth:`apply_commands`); every
        command is answered by a RESULT record (OK and the command's bytes; SKIPPED for a
        prefetch to a GPU outside the model) at the loop's next ``results()``. Returns the
        commands' ids."""
        t = self._issue_at
        n = len(cmds)
        self.apply_commands(cmds, t)
        ids = np.arange(self._next_cmd_id, self._next_cmd_id + n, dtype=np.int64)
        self._next_cmd_id += n
        res = empty(Kind.RESULT, n)
        res["t_ns"], res["cmd_id"], res["bytes"], res["latency_ns"] = int(t), ids, cmds["bytes"], int(self.delay)
        res["status"] = np.where((cmds["op"] == Op.PREFETCH) & ((cmds["dst"] < 0) | (cmds["dst"] >= self.n_gpus)),
                                 Status.SKIPPED, Status.OK)
        if self.loop.check is not None:
            # as the driver does live (UVM_MIGRATE refuses a range outside managed memory): a
            # prefetch that reaches past the program's allocations fails, so that the budget
            # check, which counts an OK prefetch's whole range as arrived, counts no page the
            # model never moved
            for i in np.flatnonzero((cmds["op"] == Op.PREFETCH) & (res["status"] == Status.OK)).tolist():
                pieces = self.space.local_range(int(cmds["addr"][i]), int(cmds["bytes"][i]))
                covered = sum(int(self.managed[lo:hi].sum()) for lo, hi in pieces)
                if covered * PAGE_SIZE < int(cmds["bytes"][i]):
                    res["status"][i] = Status.RANGE_INVALID
        self._result_parts.append(res)
        return ids

    def results(self) -> np.ndarray:
        """RESULT records of the commands submitted since the last call."""
        parts, self._result_parts = self._result_parts, []
        if not parts:
            return _NO_RESULTS
        return parts[0] if len(parts) == 1 else _concat(parts)

    def pending(self) -> int:
        """Commands accepted and not answered: none (the model runs each one at submit)."""
        return 0

    def stats(self) -> dict:
        """The actuator's figures in the loop's summary."""
        return {"commands": self.r.commands}

    def close(self, drain: bool = False, timeout: float = 5.0) -> None:
        """Nothing to undo: the replay ends with the model."""

    def apply_commands(self, cmds: np.ndarray, t: float) -> None:
        """Execute a command batch on the model at time t, in order."""
        self.r.commands += len(cmds)
        cols = (cmds["op"].tolist(), cmds["addr"].tolist(), cmds["bytes"].tolist(), cmds["dst"].tolist(),
                cmds["exec_id"].tolist(), cmds["advice"].tolist())
        for op, addr, nbytes, dst, exec_id, advice in zip(*cols):
            for j, (lo, hi) in enumerate(self.space.local_range(addr, nbytes)):
                if op == Op.PREFETCH:
                    # one command is one pipelined DMA stream: its start-up is paid once
                    self._prefetch(lo, hi, dst, t, exec_id, first=j == 0)
                elif op == Op.PREEVICT:
                    self._preevict(lo, hi, dst, t)
                elif op == Op.INVALIDATE:
                    self._invalidate(lo, hi, t)
                elif op == Op.STAGE:
                    self._stage(lo, hi, dst, t)
                elif op == Op.ADVISE:
                    self._advise(lo, hi, advice, dst)

    def _prefetch(self, lo: int, hi: int, g: int, t: float, exec_id: int, first: bool = True) -> None:
        """UVM_MIGRATE of one block's pages to GPU g (executed by the core)."""
        if not 0 <= g < self.n_gpus:
            return
        self._ensure_entries(1)
        out = self._pf_out
        bit = self._bit(g)
        had = (self.gmask[lo:hi] & bit) != 0 if self._exact_residency else None
        done = self.lib.sim_prefetch(self.csp, g, lo, hi, t, int(first), out)
        if out[4] >= 0:
            self._eviction_event(g, int(out[4]), int(out[5]), t, False)
        if had is not None and done >= 0:
            # exactly the pages that arrived (copied, or populated without a copy), one record
            # per run: a residency rebuilt from the records counts no page the model did not bring
            new = np.flatnonzero(((self.gmask[lo:hi] & bit) != 0) & ~had) + lo
            if len(new):
                self._arrival_runs(g, new, int(out[0]), int(done), exec_id)
        elif done >= 0 and out[1] and Kind.MIGRATION in self.emit:
            self._migration(out[0], done, CPU, g, lo >> PAGE_TO_BLOCK_SHIFT, int(out[1]) * PAGE_SIZE, Cause.USER,
                            exec_id=exec_id)

    def _preevict(self, lo: int, hi: int, dst: int, t: float) -> None:
        """Migrate pages [lo, hi) of one block away from every GPU but dst, ahead of need: to
        the host (write-back on the GPU->host link) or into a neighbour GPU's memory over
        NVLink (memHarvester's victim cache). A chunk left empty is free once the copy ends."""
        b = lo >> PAGE_TO_BLOCK_SHIFT
        for g in range(self.n_gpus):
            if g == dst or not self.has_chunk[g, b] or self.pinned[g, b]:
                continue
            bit = self._bit(g)
            pages = np.arange(lo, hi)[(self.gmask[lo:hi] & bit) != 0]
            if len(pages) == 0:
                continue
            to_gpu = 0 <= dst < self.n_gpus
            ready = t
            if to_gpu and not self.has_chunk[dst, b]:
                # the neighbour lends spare memory: a free chunk or one it already lends,
                # never one of its own
                ready = self.lib.sim_take_spare(self.csp, dst, b, t)
                if ready < 0:   # it lends nothing now: to the host instead
                    to_gpu, ready = False, t
            on_host = None if to_gpu else self.cpu_valid[lo:hi].copy()
            written = self._drop(g, lo, hi, 1 if to_gpu else 0, _MOVED if to_gpu else _PREEVICTED)
            nbytes = (len(pages) if to_gpu else written) * PAGE_SIZE
            start = max(ready, self.d2h_tail[g])
            host_Bps = self.wb_Bpns[g] * 1e9 if self.wb_Bpns[g] > 0 else self.c.d2h_Bps   # large-page write-back
            done = start + self.c.transfer_latency_ns + _ns(nbytes, self.c.nvlink_Bps if to_gpu else host_Bps)
            if not to_gpu:   # into node 0's memory: across the network from another node
                done += self.lib.sim_host_net_ns(self.csp, g, written)
            self.d2h_tail[g] = done
            if written and not to_gpu:
                # the pages written back are on the host once the copy lands: a read waits for it
                self.host_ready[lo:hi][self.cpu_valid[lo:hi] & ~on_host] = done
            if self.rescount[g, b] == 0:
                self.lib.sim_release_chunk(self.csp, g, b, done)   # free when the copy ends
            else:
                # part of the block stays: the chunk is not free of the copy until it ends
                self.wb_busy[g, b] = max(self.wb_busy[g, b], done)
            self.counters[core.ST["preevictions"]] += 1
            if to_gpu:
                dbit = self._bit(dst)
                new = pages[(self.gmask[pages] & dbit) == 0]
                self.gmask[new] |= dbit
                self.rescount[dst, b] += len(new)
                self.lru[dst, b] = done
                self.lib.sim_lru_fix(self.csp, dst, b)
                self.pf_entry[new] = self._new_entry(done)
                self.counters[core.ST["bytes_p2p"]] += nbytes
                if self.harvested[dst, b]:
                    self.lib.sim_harvest_writeback(self.csp, dst, b, done)
            else:
                self.counters[core.ST["preevicted_bytes"]] += nbytes
                self.counters[core.ST["bytes_d2h"]] += nbytes
                if self._exact_residency:
                    # every page that left, the clean ones dropped without a copy included
                    self._departure_runs(g, pages, int(start), int(done), Cause.USER)
                elif Kind.MIGRATION in self.emit and nbytes:
                    self._migration(start, done, g, CPU, b, nbytes, Cause.USER)

    def _stage(self, lo: int, hi: int, h: int, t: float) -> None:
        """Op.STAGE: host pages [lo, hi) of one block (on no GPU) into neighbour h's spare
        memory over h's own PCIe lane (HUVM's multi-path prefetcher); clean, so removable
        at once. The owner's later fault or prefetch fetches them over NVLink."""
        if not 0 <= h < self.n_gpus:
            return
        b = lo >> PAGE_TO_BLOCK_SHIFT
        idx = np.arange(lo, hi)
        sel = idx[self.managed[lo:hi] & (self.gmask[lo:hi] == 0) & self.cpu_valid[lo:hi]]
        if len(sel) == 0 or (self.has_chunk[h, b] and not self.harvested[h, b]):
            return
        ready = t
        if not self.has_chunk[h, b]:
            ready = self.lib.sim_take_spare(self.csp, h, b, t)
            if ready < 0:
                return
        start = max(ready, self.h2d_tail[h], float(self.host_ready[sel].max()))   # write-backs landed
        done = start + self.c.transfer_latency_ns + _ns(len(sel) * PAGE_SIZE, self.c.prefetch_h2d_Bps)
        self.h2d_tail[h] = done
        self.gmask[sel] |= self._bit(h)
        self.rescount[h, b] += len(sel)
        self.lru[h, b] = done
        self.lib.sim_lru_fix(self.csp, h, b)
        self.removable_at[h, b] = done
        self.pf_entry[sel] = self._new_entry(done)
        self.counters[core.ST["bytes_h2d"]] += len(sel) * PAGE_SIZE
        self.r.staged_bytes += len(sel) * PAGE_SIZE

    def _drop(self, g: int, lo: int, hi: int, discard: int, why: int) -> int:
        """GPU g drops pages [lo, hi) of one block, charged to `why` if they fault again."""
        self.cs.drop_reason = why
        try:
            return int(self.lib.sim_drop_range(self.csp, g, lo, hi, discard))
        finally:
            self.cs.drop_reason = _EVICTED

    def _invalidate(self, lo: int, hi: int, t: float, count: bool = True) -> None:
        """UVM_DISCARD of one block's pages (executed by the core). `count`: a controller's
        command; otherwise the program freed or overwrote the memory, so a later fault there
        is a first touch (cold)."""
        self.cs.drop_reason = _DISCARDED if count else _COLD
        if self._exact_residency:
            self._departures(lo, hi, int(t), Cause.OTHER)
        try:
            dropped = int(self.lib.sim_invalidate(self.csp, lo, hi))
        finally:
            self.cs.drop_reason = _EVICTED
        if count:
            self.r.invalidated_bytes += dropped * PAGE_SIZE

    def _departures(self, lo: int, hi: int, t: int, cause: Cause) -> None:
        """MIGRATION records (to the host) of the pages of [lo, hi) (one block) on each GPU: in
        this model a discard frees the memory, and a residency rebuilt from the records (the
        budget check) must see it go. No controller subscribes to MIGRATION."""
        mask = self.gmask[lo:hi]
        for g in range(self.n_gpus):
            pages = np.flatnonzero((mask & self._bit(g)) != 0) + lo
            if len(pages):
                self._departure_runs(g, pages, t, t, cause)

    def _arrival_runs(self, g: int, pages: np.ndarray, t0: int, t1: int, exec_id: int) -> None:
        """One MIGRATION record from the host to GPU g per run of consecutive ``pages`` (one
        block's local page numbers) a prefetch made resident."""
        self._page_runs(pages, t0, t1, CPU, g, Cause.USER, exec_id)

    def _departure_runs(self, g: int, pages: np.ndarray, t0: int, t1: int, cause: Cause) -> None:
        """One MIGRATION record from GPU g to the host per run of consecutive ``pages`` (one
        block's local page numbers), whether they were copied or dropped clean."""
        self._page_runs(pages, t0, t1, g, CPU, cause, -1)

    def _page_runs(self, pages: np.ndarray, t0: int, t1: int, src: int, dst: int, cause: Cause, exec_id: int) -> None:
        b = int(pages[0]) >> PAGE_TO_BLOCK_SHIFT
        base = (int(self.space.global_blocks[b]) << 21) - ((b << PAGE_TO_BLOCK_SHIFT) * PAGE_SIZE)
        runs = np.split(pages, np.flatnonzero(np.diff(pages) != 1) + 1)
        m = empty(Kind.MIGRATION, len(runs))
        m["t_ns"], m["t_end_ns"], m["src"], m["dst"] = int(t0), int(t1), src, dst
        m["addr"] = [base + int(r[0]) * PAGE_SIZE for r in runs]
        m["bytes"] = [len(r) * PAGE_SIZE for r in runs]
        m["cause"], m["exec_id"] = int(cause), exec_id
        self._emit(Kind.MIGRATION, m)

    def _advise(self, lo: int, hi: int, advice: int, dst: int) -> None:
        b = lo >> PAGE_TO_BLOCK_SHIFT
        if advice == Advice.READ_MOSTLY:
            self.read_mostly[b] = True
            self.cs.any_read_mostly = 1
        elif advice == Advice.UNSET_READ_MOSTLY:
            # the model keeps the advice per block: unsetting it for part of a block unsets it
            # for all of it, so all of the block's duplicates collapse (a duplicate left behind
            # would take a GPU write without losing its host copy: dirty data counted clean)
            if self.read_mostly[b]:
                b_lo = b << PAGE_TO_BLOCK_SHIFT
                self._collapse(b_lo, min(b_lo + PAGES_PER_BLOCK, len(self.gmask)))
            self.read_mostly[b] = False
        elif advice == Advice.PREFERRED_LOCATION:
            self.preferred[b] = dst
        elif advice == Advice.UNSET_PREFERRED_LOCATION:
            self.preferred[b] = -2

    def _collapse(self, lo: int, hi: int) -> None:
        """cudaMemAdviseUnsetReadMostly: read-duplicated copies of pages [lo, hi) (one block)
        collapse into one (CUDA: "the location chosen is arbitrary" without a preferred
        location). The host copy is kept where valid, else the lowest GPU's; the others are
        dropped without a transfer (they were clean duplicates)."""
        pages = np.arange(lo, hi)
        m = self.gmask[lo:hi]
        keep = np.where(self.cpu_valid[lo:hi], self._mask(0), m & (~m + self._mask(1)))  # lowest set bit
        drop = m & ~keep
        if not drop.any():
            return
        b = lo >> PAGE_TO_BLOCK_SHIFT
        for g in range(self.n_gpus):
            bit = self._bit(g)
            sel = (drop & bit) != 0
            n = int(sel.sum())
            if n:
                self.gmask[pages[sel]] &= ~bit
                self.gone[pages[sel]] = _MOVED
                self._release_block(g, b, n)
        self.counters[core.ST["epoch"]] += 1

    # ------------------------------------------------------------------ run
    def _other_op(self, i: int, op, typ: int) -> None:
        """Every operation but a kernel, on the host's clock."""
        if typ == OpType.HOST:
            if self._tl is not None:
                self._tl.append(("host", "compute", self.host, self.host + float(op["compute_ns"]), -1))
            self.host += float(op["compute_ns"])
        elif typ == OpType.HOST_WRITE:
            self._host_write(op)
        elif typ == OpType.COPY:
            self._copy(op)
        elif typ == OpType.SYNC:
            g = int(op["gpu"])
            if g < 0 and self._own_gpu is not None:
                g = self._own_gpu
            self.host = max([self.host, self._um_tail(g)] + (self.stream if g < 0 else [self.stream[g]]))
        elif typ == OpType.UM_COPY:
            self._um_copy(op)
        elif typ == OpType.STREAM_WAIT:
            g = max(0, int(op["gpu"]))
            self.stream[g] = max(self.stream[g], self._um_tail(g))
        elif typ == OpType.MEM:
            self._mem(i, op)

    def _now(self) -> float:
        """The clock of whatever runs now: the host and every GPU, or, while independent tenants
        are interleaved, the running tenant's host and GPU."""
        if self._t_deliver is not None:
            return self._t_deliver
        if self._own_gpu is None:
            return max([self.host] + self.stream)
        return max(self.host, self.stream[self._own_gpu])

    def _tenant_gpus(self) -> dict[int, int] | None:
        """pid -> GPU when the workload is independent jobs, one GPU each (a shared server:
        the ``tenants`` family); None otherwise, and with the launch queue, whose issue cursor
        walks the operations in order."""
        if self.launch_queue is not None:
            return None
        ops = self.w.ops
        pids = np.unique(ops["pid"])
        if len(pids) < 2:
            return None
        placed = np.isin(ops["type"], [OpType.KERNEL, OpType.COPY, OpType.UM_COPY, OpType.STREAM_WAIT]) | (
            (ops["type"] == OpType.SYNC) & (ops["gpu"] >= 0))
        out = {}
        for p in pids.tolist():
            gpus = np.unique(ops["gpu"][placed & (ops["pid"] == p)]).tolist()
            if len(gpus) != 1:
                return None
            out[p] = int(gpus[0])
        return out if len(set(out.values())) == len(out) else None

    def _run_tenants(self, tenants: dict[int, int], types: list, it_list: list, it_end: np.ndarray,
                     every: int) -> float:
        """Independent jobs on their own GPUs (a shared server), interleaved in time order.

        Each job has its own host thread (its own ``host`` clock), and the job whose clock is
        earliest runs next, one drain at a time inside a kernel. Run in the trace's order
        instead (interleaved by *estimated* compute time), a job that stalls more runs ahead of
        the others by seconds: the drains it triggers hand the controller the others' events
        late, and the commands it answers with run on the others' GPUs in their future (HUVM
        Case-3 under ``pre-ef-host``: WCC's faults reached the controller a median 2 s late,
        behind BFS's drains, and its pre-evictions ran up to 17 s ahead of its GPU). Returns
        when the last job ends."""
        ops = self.w.ops
        pid_col = ops["pid"]
        nk = len(ops)
        kernel = int(OpType.KERNEL)
        host = {p: self.host for p in tenants}
        done = [0]

        def job(p: int):
            g = tenants[p]
            for i in np.flatnonzero(pid_col == p).tolist():
                op = ops[i]
                if types[i] == kernel:
                    yield from self._kernel_steps(i, op)
                else:
                    self._other_op(i, op, types[i])
                t = max(self.host, self._um_tail(g), self.stream[g])
                it_end[it_list[i]] = max(it_end[it_list[i]], t)
                done[0] += 1
                if self.progress is not None and (done[0] % every == 0 or done[0] == nk):
                    self.progress(done[0], nk)
                yield t

        def enter(p: int) -> None:
            self.host, self._own_gpu = host[p], tenants[p]

        def leave(p: int) -> None:
            host[p] = self.host

        self._in_time_order({p: job(p) for p in tenants}, {p: self.host for p in tenants}, enter, leave)
        self.host = max(host.values())
        return max([self.host, self._um_tail()] + self.stream)

    def _run_concurrent(self, i: int, j: int, gpu_list: list, it_list: list, it_end: np.ndarray) -> None:
        """Kernels i..j-1 of one process, launched back to back on several GPUs: each GPU runs
        its own in order, the GPUs side by side. Run one after another instead (each kernel
        whole, GPU 0's first), a GPU ran to the end of its kernel before the next GPU's began at
        the same start time: the drains went back in time (GPU 1's faults reached the
        controller after GPU 0's later ones), and GPU 1 found in memory what GPU 0 would fetch
        only later."""
        ops = self.w.ops
        queues: dict[int, list[int]] = {}
        for k in range(i, j):
            queues.setdefault(gpu_list[k], []).append(k)

        def run(g: int):
            for k in queues[g]:
                yield from self._kernel_steps(k, ops[k])
                it_end[it_list[k]] = max(it_end[it_list[k]], self.stream[g])
                yield self.stream[g]

        def enter(g: int) -> None:
            self._own_gpu = g

        self._in_time_order({g: run(g) for g in queues}, {g: max(self.stream[g], self.host) for g in queues},
                            enter, lambda g: None)

    def _in_time_order(self, jobs: dict, clock: dict[int, float], enter: Callable[[int], None],
                       leave: Callable[[int], None]) -> None:
        """Run independent streams of work (generators that yield their clock whenever they
        pause: at a drain deadline inside a kernel, after an operation) earliest clock first.
        A drain is cut when the earliest clock has passed its deadline, so it holds every
        stream's events up to then, as one drain of a ring that all of them write. Cut by
        whichever stream crossed the deadline first, each delivery pushed the next deadline on
        and the other streams ran past it undelivered: with 4 GPUs each one's events reached the
        controller about one drain in four (lavaMD under SnuRHAC-SP-DP: 8-12 deliveries per GPU
        instead of 22-27)."""
        heap = [(t, k) for k, t in clock.items()]
        heapq.heapify(heap)
        self._interleaved = True
        collect = self.out.collect
        self.out.collect = 1   # the core pauses at a drain deadline only while it reports batches
        try:
            while heap:
                t_min, k = heapq.heappop(heap)
                if t_min >= self._step_at:
                    self._step_at = t_min + self.drain
                if self._timed and self._pending and t_min >= self._next_drain:
                    self._deliver(t_min)
                enter(k)
                t = next(jobs[k], None)
                leave(k)
                if t is not None:
                    heapq.heappush(heap, (t, k))
        finally:
            self._interleaved = False
            self._own_gpu = None
            self.out.collect = collect

    def run(self) -> SimResult:
        try:
            return self._run()
        finally:
            self.lib.sim_thr_free(self.csp)   # the core's own thrashing state

    def _run(self) -> SimResult:
        t0 = _time.perf_counter()
        ops = self.w.ops
        nk = len(ops)
        self._kstart = np.zeros(nk)
        self._kend = np.zeros(nk)
        self._kfaults = np.zeros(nk, np.int64)
        self._kcauses = np.zeros((nk, len(core.FAULT_CAUSES)), np.int64)
        every = max(1, nk // 200)
        iters = ops["iteration"]
        n_it = int(iters.max()) + 1 if nk else 0
        it_end = np.zeros(max(n_it, 1))
        # per-op fields as Python scalars once: reading them from the record array cost
        # more than a short kernel's walk
        types, it_list = ops["type"].tolist(), iters.tolist()
        self._types, self._ops_compute = types, ops["compute_ns"].tolist()
        self._kcols = list(zip(ops["gpu"].tolist(), ops["pid"].tolist(), ops["acc_lo"].tolist(),
                               ops["acc_hi"].tolist(), ops["compute_ns"].astype(np.float64).tolist()))
        kernel = int(OpType.KERNEL)
        tenants = self._tenant_gpus()
        if tenants:
            end = self._run_tenants(tenants, types, it_list, it_end, every)
        else:
            gpu_list = ops["gpu"].tolist()
            # with a launch queue the host issues launches in order, a cursor over the operations
            concurrent = self.n_gpus > 1 and self.launch_queue is None
            i = 0
            plain_until = 0   # kernels up to here form a one-GPU run: replayed in order, not rescanned

            def close_iteration(k: int) -> None:
                """After op k: if it was its iteration's last, the iteration ends when all it began has."""
                if k == nk - 1 or it_list[k + 1] != it_list[k]:
                    it_end[it_list[k]] = max([it_end[it_list[k]], self.host, self._um_tail()] + self.stream)

            while i < nk:
                op = ops[i]
                if types[i] == kernel and concurrent and i >= plain_until:
                    j = i
                    while j < nk and types[j] == kernel:   # across iterations too: no sync between
                        j += 1
                    plain_until = j
                    if len(set(gpu_list[i:j])) > 1:
                        self._run_concurrent(i, j, gpu_list, it_list, it_end)
                        if self.progress is not None:
                            self.progress(j, nk)
                        close_iteration(j - 1)
                        i = j
                        continue
                if types[i] == kernel:
                    self._kernel(i, op)
                else:
                    self._other_op(i, op, types[i])
                if self.progress is not None and (i % every == 0 or i == nk - 1):
                    self.progress(i + 1, nk)
                close_iteration(i)
                i += 1
            end = max([self.host, self._um_tail()] + self.stream)
        self._deliver(end)
        last = self.loop.finish()
        if self.recorder is not None and len(last):
            self.recorder.write(last)
        self._check_capacity()
        r = self.r
        for name in core.ST_NAMES:
            if hasattr(r, name):
                setattr(r, name, int(self.counters[core.ST[name]]))
        r.time_ns = int(end)
        kmask = ops["type"] == OpType.KERNEL
        r.kernel_start_ns = self._kstart[kmask].astype(np.int64)
        r.kernel_end_ns = self._kend[kmask].astype(np.int64)
        r.kernel_faults = self._kfaults[kmask]
        r.kernel_fault_causes = self._kcauses[kmask]
        r.gpu_end_ns = np.zeros(self.n_gpus, np.int64)
        if kmask.any():
            np.maximum.at(r.gpu_end_ns, ops["gpu"][kmask].astype(np.int64), r.kernel_end_ns)
        r.gpu_kernel_ns = np.bincount(ops["gpu"][kmask].astype(np.int64), weights=r.kernel_end_ns - r.kernel_start_ns,
                                      minlength=self.n_gpus).astype(np.int64)
        if n_it:
            r.iteration_end_ns = np.maximum.accumulate(it_end[:n_it]).astype(np.int64)
            r.iteration_faults = np.bincount(iters[kmask], weights=r.kernel_faults, minlength=n_it).astype(np.int64)
            r.iteration_fault_causes = np.zeros((n_it, len(core.FAULT_CAUSES)), np.int64)
            np.add.at(r.iteration_fault_causes, iters[kmask], self._kcauses[kmask])
        r.fault_causes = dict(zip(core.FAULT_CAUSES, self.counters[core.FC].tolist()))
        r.controller = self.ctl.stats()
        if self.loop.budget is not None:
            loop = self.loop.stats()
            r.budget, r.budget_held, r.budget_check = loop["budget"], loop["budget_held"], loop["budget_check"]
        if self._tl is not None:
            self._finish_timeline(kmask)
        r.wall_s = self._init_s + _time.perf_counter() - t0
        return r

    def _finish_timeline(self, kmask: np.ndarray) -> None:
        """Kernels and the chunks of chunked copies join the host and copy intervals."""
        tl = self._tl
        ops = self.w.ops
        for i in np.nonzero(kmask)[0].tolist():
            nid = int(ops["name_id"][i])
            tl.append(("kernel", self.w.names[nid] if nid >= 0 else "kernel", self._kstart[i], self._kend[i], -1))
        for c, src in self._tl_copies:
            name = self._alloc_name(src)
            for k in range(c.n):
                tl.append(("stage", f"stage {name}", c.staged_ns[k] - c.chunk_bytes[k] / self.c.um_stage_Bps * 1e9,
                           c.staged_ns[k], src))
                tl.append(("copy", f"H2D {name}", c.start_ns[k], c.done_ns[k], src))
        self.r.timeline = [(lane, label, float(t0), float(t1), grp) for lane, label, t0, t1, grp in tl]

    def _check_capacity(self) -> None:
        """End-of-replay invariants: no GPU over capacity, and every page valid on a GPU sits
        in a chunk that GPU holds (a page without a chunk is memory for free: a harvest spill
        bug once made a tenant 16x faster that way)."""
        per_block = self.gmask.reshape(-1, PAGES_PER_BLOCK)
        for g in range(self.n_gpus):
            held = int(self.has_chunk[g].sum()) + int(self.npending[g])
            if self.used[g] > self.cap[g] or held > self.cap[g]:
                raise AssertionError(f"GPU {g} over capacity: {self.used[g]} chunks of {self.cap[g]}")
            on = (per_block & self._bit(g)).any(axis=1)
            orphans = int((on & ~self.has_chunk[g]).sum())
            if orphans:
                raise AssertionError(f"GPU {g} has valid pages in {orphans} blocks without a chunk")


def _concat(parts: list[np.ndarray]) -> np.ndarray:
    """np.concatenate of record arrays of one dtype, without its field-by-field dtype
    promotion (which cost more than the copy on every drain)."""
    out = np.empty(sum(len(p) for p in parts), parts[0].dtype)
    i = 0
    for p in parts:
        out[i:i + len(p)] = p
        i += len(p)
    return out


def simulate(workload: Workload, controller: Controller, **kw) -> SimResult:
    """Run one replay (convenience wrapper)."""
    return Simulator(workload, controller, **kw).run()
