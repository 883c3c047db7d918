"""Mode ``snurhac``: one virtual GPU over several (thesis ch. 6, SnuRHAC; evaluation §7.3).

The runtime part (``prepare``, what SnuRHAC's LD_PRELOADed runtime does to the program):
  * ``cudaMalloc`` becomes ``cudaMallocManaged``; ``cudaMemcpy`` to the device becomes a
    (multi-threaded) host copy into the managed buffer, and a copy back a host read of it;
  * each kernel's grid is cut into one chunk of thread blocks per GPU along z if it has at
    least as many blocks as GPUs there, else y, else x -- one dimension only (§6.2,
    :func:`partition_dim`); all GPUs finish a kernel before the next starts;
  * a kernel with atomics, or whose per-GPU write ranges overlap by more than
    ``overlap_threshold`` (0.5, §7.3.2) of their total, runs on one GPU (§6.4);
  * buffers a kernel only reads get the read-only flag (READ_MOSTLY advice: pages are
    duplicated, not migrated) for that kernel; one it writes loses it (§6.4).

The driver part (``on_events``): block descriptors with per-node read/write masks, owned 32
blocks at a time round-robin (§6.3, :class:`BlockDescriptors`), kept from the fault stream;
static prefetching (§6.5.1): at each partitioned launch, the GPU's thread blocks' affine access
ranges are prefetched to it in thread-block order; dynamic prefetching (§6.5.2): a fault in a
read-only block prefetches the whole UM block (adjacent pages), any other fault the page-level
pair-correlation successors (64 K rows, 4-way, 3 levels, 4 successors per level) of the GPU's
own table.

Variants as the thesis names them (figure 7.9, table 7.11): ``snurhac`` without prefetching
(pages move on demand), ``snurhac-sp`` with static prefetching, ``snurhac-sp-dp`` with static
and dynamic prefetching; ``snurhac-dp`` (dynamic only) is ours, for the ablation.

Nodes: a workload whose ``meta["nodes"]`` says how many nodes the GPUs sit on (the multigpu
scenarios' ``--param nodes=N``) keeps the descriptors per node, as the thesis does (GPU g on node
g // GPUs-per-node); without it (live, one host) each GPU counts as a node of its own. The
simulator times the protocol's messages and the pages' network legs (engine ``_init_nodes``).

Deviations: inside a kernel the
simulator migrates a written page away from its readers where SnuRHAC lets stale read copies
live until the kernel ends; the stock density prefetcher stays on; dynamic prefetches follow
faults by the controller delay (and a drain of at most 50 µs) instead of running inside the
fault handler.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..events.schema import COMMAND_DTYPE, Advice, CopyKind, EventBatch, Kind, Op, commands
from ..workload.threadblocks import KernelBlocks
from ..workload.workload import OP_DTYPE, Init, OpType, Workload
from ..units import BLOCK_SHIFT, BLOCK_SIZE, PAGE_SHIFT, PAGE_SIZE, PAGES_PER_BLOCK, ranges
from .base import DESCRIPTOR_RUN, Controller, register  # noqa: F401 - DESCRIPTOR_RUN: umctl/cluster imports it here
from .tables import PairCorrelationTable


# ------------------------------------------------------------------ runtime rules (pure)
def partition_dim(grid: tuple[int, int, int], n_gpus: int) -> int:
    """§6.2: z if it has at least as many blocks as GPUs, else y, else x (0=x, 1=y, 2=z).
    x comes last because warps coalesce along x and neighbouring blocks in x share pages."""
    if grid[2] >= n_gpus:
        return 2
    if grid[1] >= n_gpus:
        return 1
    return 0


def partition(grid: tuple[int, int, int], n_gpus: int) -> tuple[int, list[np.ndarray]]:
    """The chosen dimension and, per GPU, its thread blocks (linear ids, in launch order):
    equal contiguous slabs along one dimension (GPUs are assumed equally fast)."""
    dim = partition_dim(grid, n_gpus)
    gx, gy, gz = grid
    tb = np.arange(gx * gy * gz, dtype=np.int64)
    coord = (tb % gx, (tb // gx) % gy, tb // (gx * gy))[dim]
    edges = (np.arange(n_gpus + 1) * grid[dim]) // n_gpus
    return dim, [tb[(coord >= edges[g]) & (coord < edges[g + 1])] for g in range(n_gpus)]


def thread_block_ranges(kb: KernelBlocks, tbs: np.ndarray, *, write: bool | None = None,
                        affine_only: bool = True) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """Per memory operation (filtered by ``write``): (alloc_id, lo, hi) byte ranges of the
    given thread blocks, from the static access ranges."""
    bx, by, bz = kb.coords(tbs)
    out = []
    for r in kb.ranges:
        if (write is not None and r.write != write) or (affine_only and not r.affine):
            continue
        lo, hi = r.bounds(bx, by, bz)
        out.append((r.alloc_id, lo, hi))
    return out


def write_overlap_ratio(kb: KernelBlocks, parts: list[np.ndarray]) -> float:
    """§6.4 / figure 6.4: each GPU's write range per buffer is the hull of its thread blocks'
    write ranges; the overlap is what of each GPU's range some other GPU's range also covers,
    summed, over the summed lengths. Disjoint bands give 0, every GPU writing everything 1.
    Writes the analyser cannot bound are left out (the runtime has no range for them)."""
    hulls: dict[int, list[tuple[int, int]]] = {}
    for tbs in parts:
        if len(tbs) == 0:
            continue
        per: dict[int, tuple[int, int]] = {}
        for aid, lo, hi in thread_block_ranges(kb, tbs, write=True):
            a, b = int(lo.min()), int(hi.max())
            if aid in per:
                a, b = min(a, per[aid][0]), max(b, per[aid][1])
            per[aid] = (a, b)
        for aid, r in per.items():
            hulls.setdefault(aid, []).append(r)
    return hull_overlap_ratio(hulls)


def hull_overlap_ratio(hulls: dict[int, list[tuple[int, int]]]) -> float:
    """Figure 6.4's ratio from the write hulls themselves: per buffer, one [lo, hi) byte range
    per GPU that writes it. Split from :func:`write_overlap_ratio` so that the cluster runtime,
    which gets ranges from the program rather than from an access description, decides the same."""
    total = overlap = 0
    for rs in hulls.values():
        for i, (a, b) in enumerate(rs):
            total += b - a
            # what of [a, b) the union of the other GPUs' ranges covers
            others = sorted((max(a, c), min(b, d)) for j, (c, d) in enumerate(rs) if j != i and c < b and d > a)
            end = a
            for c, d in others:
                c = max(c, end)
                if d > c:
                    overlap += d - c
                    end = d
    return overlap / total if total else 0.0


def page_runs(pages: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first page, length) of the runs of consecutive pages, in the given order."""
    if len(pages) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    brk = np.flatnonzero(np.diff(pages) != 1) + 1
    starts = np.concatenate([[0], brk])
    ends = np.concatenate([brk, [len(pages)]])
    return pages[starts], ends - starts


def ordered_unique(pages: np.ndarray) -> np.ndarray:
    _, first = np.unique(pages, return_index=True)
    return pages[np.sort(first)]


# ------------------------------------------------------------------ driver tables
class BlockDescriptors:
    """Table 6.1: per UM block, per node, 512-bit read and write masks, and flags; the node
    owning a block's descriptor is ``(block // 32) mod nodes`` (§6.3). Created on first use."""

    def __init__(self, nodes: int, run: int = DESCRIPTOR_RUN):
        self.nodes = nodes
        self.run = run            # blocks per round-robin run (tests shrink it to spread few blocks)
        self.read: dict[int, np.ndarray] = {}
        self.write: dict[int, np.ndarray] = {}
        self.read_only: set[int] = set()
        self.lookups = 0          # descriptor lock requests
        self.remote_lookups = 0   # ... sent to another node

    def owner(self, block: int) -> int:
        return (block // self.run) % self.nodes

    def _masks(self, block: int) -> tuple[np.ndarray, np.ndarray]:
        r = self.read.get(block)
        if r is None:
            r = self.read[block] = np.zeros((self.nodes, PAGES_PER_BLOCK), np.bool_)
            self.write[block] = np.zeros((self.nodes, PAGES_PER_BLOCK), np.bool_)
        return r, self.write[block]

    def fault(self, node: int, block: int, offs: np.ndarray, is_write: np.ndarray) -> None:
        """One faulted block's pages from ``node`` (one lock of its descriptor): a read sets
        the node's read bit; a write sets its read and write bits and clears every other
        node's write bit (their copies are degraded to read, §6.3)."""
        self.lookups += 1
        self.remote_lookups += int(self.owner(block) != node)
        r, w = self._masks(block)
        r[node, offs] = True
        wo = offs[is_write]
        if len(wo):
            w[:, wo] = False
            w[node, wo] = True

    def stale(self) -> list[tuple[int, np.ndarray]]:
        """Per block with a written page: the (nodes x pages) mask of read copies that the
        synchronisation after a kernel unmaps (a node's copy of a page another node writes)."""
        out = []
        for block, w in self.write.items():
            written = w.any(0)
            if not written.any():
                continue
            s = self.read[block] & ~w & written
            if s.any():
                out.append((block, s))
        return out

    def kernel_done(self) -> int:
        """Synchronisation after a kernel (§6.3): a page someone holds for writing is unmapped
        from the other nodes' read copies. Returns the read copies dropped."""
        dropped = 0
        for block, s in self.stale():
            dropped += int(s.sum())
            self.read[block] &= ~s
        return dropped


@dataclass
class _Launch:
    """What the runtime knows about one launch of the rewritten program."""

    gpu: int
    kernel: int            # index of the kernel in the original program
    first: bool            # first piece of its kernel (advice and descriptor sync go here)
    static: np.ndarray     # PREFETCH commands of its thread blocks' affine ranges
    advise: np.ndarray     # ADVISE commands (read-only flags) for the kernel


@register
class SnuRHACController(Controller):
    name = "snurhac"
    subscribes = frozenset({Kind.LAUNCH, Kind.FAULT})
    launch_sync = True
    #: the dynamic prefetcher lives in the SnuRHAC driver's fault handler (§6.5.2)
    drain_ns = 50_000
    static_prefetch = False
    dynamic_prefetch = False
    needs_runtime = True
    runtime_why = "partitions the program's kernels inside the program"
    live_gpus = True

    def __init__(self, overlap_threshold: float = 0.5, host_copy_gbps: float = 20.0, num_rows: int = 65536,
                 assoc: int = 4, num_levels: int = 3, num_succs: int = 4, single_gpu: bool = False,
                 read_only: bool = True, **options):
        super().__init__(**options)
        self.overlap_threshold = float(overlap_threshold)
        self.host_copy_Bps = float(host_copy_gbps) * 1e9  # the runtime's 8-thread host copy
        self.table_dims = (int(num_rows), int(assoc), int(num_succs), int(num_levels))
        self.single_gpu = bool(single_gpu)
        self.read_only = bool(read_only)
        self.launches: dict[int, _Launch] = {}
        self.flagged: set[int] = set()      # allocations carrying the read-only flag now
        self.tables: dict[int, PairCorrelationTable] = {}
        self.desc: BlockDescriptors | None = None
        self.st = {k: 0 for k in ("kernels", "partitioned", "fallback_atomics", "fallback_overlap",
                                  "static_pages", "adjacent_blocks", "correlation_pages", "faults",
                                  "stale_read_copies")}
        self.dims = [0, 0, 0]

    # ------------------------------------------------------------------ applicability
    def applies_to(self, workload: Workload) -> str | None:
        k = workload.kernels
        if len(k) and (k["gpu"] != k["gpu"][0]).any():
            return "the program already uses several GPUs; SnuRHAC spreads a single-GPU program"
        if not workload.thread_blocks:
            return ("its kernels carry no thread-block access description to partition "
                    "(the multigpu scenarios do)")
        if workload.n_gpus < 2 and not self.single_gpu:
            return (f"the machine has {workload.n_gpus} GPU; SnuRHAC spreads a program over several "
                    "(--param gpus=2..8 [--param nodes=N], or -O snurhac.single_gpu=true for its one-GPU overhead)")
        return None

    # ------------------------------------------------------------------ runtime: rewrite
    def prepare(self, w: Workload) -> Workload:
        G = w.n_gpus
        allocs = w.allocations.copy()
        dev = ~allocs["managed"] & (allocs["gpu"] >= 0)
        allocs["managed"][dev] = True
        allocs["init"][dev] = Init.UNTOUCHED
        dev_lo = allocs["addr"][dev].astype(np.int64)
        dev_hi = dev_lo + allocs["bytes"][dev].astype(np.int64)

        def on_device(addr: int) -> bool:
            return bool(((dev_lo <= addr) & (addr < dev_hi)).any())

        ops: list = []
        acc_p: list[np.ndarray] = []
        acc_w: list[np.ndarray] = []
        n_acc = 0

        def add_acc(pages: np.ndarray, writes: np.ndarray) -> tuple[int, int]:
            nonlocal n_acc
            acc_p.append(pages)
            acc_w.append(writes)
            n_acc += len(pages)
            return n_acc - len(pages), n_acc

        def emit(op) -> None:
            ops.append(op)

        for i, op in enumerate(w.ops):
            typ = int(op["type"])
            op = op.copy()
            if typ == OpType.COPY and int(op["copy_kind"]) in (CopyKind.H2D, CopyKind.D2H):
                target = int(op["dst_addr"] if op["copy_kind"] == CopyKind.H2D else op["addr"])
                if on_device(target):
                    # the runtime copies between the host buffer and the host side of the
                    # managed buffer (multi-threaded memcpy); the host touching the managed
                    # pages brings back what GPUs hold (a copy back reads them)
                    nbytes = int(op["bytes"])
                    pages = np.arange(target >> PAGE_SHIFT, (target + nbytes + PAGE_SIZE - 1) >> PAGE_SHIFT)
                    lo, hi = add_acc(pages, np.ones(len(pages), np.bool_))
                    new = np.zeros(1, OP_DTYPE)[0]
                    new["type"], new["pid"], new["iteration"] = OpType.HOST_WRITE, op["pid"], op["iteration"]
                    new["compute_ns"] = int(nbytes / self.host_copy_Bps * 1e9)
                    new["acc_lo"], new["acc_hi"], new["addr"], new["bytes"] = lo, hi, target, nbytes
                    new["alloc_id"] = -1
                    emit(new)
                    continue
            if typ in (OpType.KERNEL, OpType.HOST_WRITE):
                a0, a1 = int(op["acc_lo"]), int(op["acc_hi"])
                kb = w.thread_blocks.get(i) if typ == OpType.KERNEL else None
                if kb is not None:
                    self._partition(i, op, kb, w, G, emit, add_acc, ops)
                    continue
                op["acc_lo"], op["acc_hi"] = add_acc(w.acc_page[a0:a1], w.acc_write[a0:a1])
            emit(op)
        out = Workload(w.name, np.array(ops, dtype=OP_DTYPE),
                       np.concatenate(acc_p) if acc_p else np.zeros(0, np.int64),
                       np.concatenate(acc_w) if acc_w else np.zeros(0, np.bool_),
                       allocs, list(w.names), w.n_gpus, list(w.gpu_mem), dict(w.params), dict(w.meta))
        out.validate()
        return out

    def _partition(self, i, op, kb: KernelBlocks, w: Workload, G: int, emit, add_acc, ops) -> None:
        """Emit kernel i as one piece per GPU (or whole on GPU 0 when it must not be split),
        then the all-GPU synchronisation that ends a kernel under SnuRHAC."""
        self.st["kernels"] += 1
        dim, parts = partition(kb.grid, G)
        if bool(op["atomics"]):
            self.st["fallback_atomics"] += 1
            parts = [np.arange(kb.n_blocks)]
        elif G > 1 and write_overlap_ratio(kb, parts) > self.overlap_threshold:
            self.st["fallback_overlap"] += 1
            parts = [np.arange(kb.n_blocks)]
        elif G > 1:
            self.st["partitioned"] += 1
            self.dims[dim] += 1
        advise = self._advice(kb)
        a0 = int(op["acc_lo"])
        first = True
        for g, tbs in enumerate(parts):
            if len(tbs) == 0:
                continue
            lens = kb.tb_off[tbs + 1] - kb.tb_off[tbs]
            idx = ranges(a0 + kb.tb_off[tbs], lens)
            piece = op.copy()
            piece["gpu"] = g
            piece["acc_lo"], piece["acc_hi"] = add_acc(w.acc_page[idx], w.acc_write[idx])
            piece["compute_ns"] = max(1, int(int(op["compute_ns"]) * len(tbs) / kb.n_blocks))
            grid = list(kb.grid)
            if len(parts) > 1:
                grid[dim] = int(np.ceil(kb.grid[dim] / G))
            piece["grid"] = grid
            self.launches[len(ops)] = _Launch(g, i, first, self._static(kb, tbs, g), advise if first else None)
            first = False
            emit(piece)
        sync = np.zeros(1, OP_DTYPE)[0]
        sync["type"], sync["gpu"], sync["pid"], sync["iteration"] = OpType.SYNC, -1, op["pid"], op["iteration"]
        emit(sync)

    def _advice(self, kb: KernelBlocks) -> np.ndarray:
        """§6.4: a buffer every memory operation of the kernel only reads gets the read-only
        flag; one it writes loses it. (Which buffers are flagged is decided here, in program
        order, as the runtime decides it at each launch.)"""
        if not self.read_only:
            return np.zeros(0, COMMAND_DTYPE)
        bufs: dict[int, tuple[int, int, bool]] = {}
        for r in kb.ranges:
            a, n, wr = bufs.get(r.alloc_id, (r.addr, r.nbytes, False))
            bufs[r.alloc_id] = (a, n, wr or r.write)
        cmds = []
        for aid, (addr, nbytes, written) in bufs.items():
            if not written and aid not in self.flagged:
                self.flagged.add(aid)
                cmds.append(commands(Op.ADVISE, addr, nbytes, advice=Advice.READ_MOSTLY))
            elif written and aid in self.flagged:
                self.flagged.discard(aid)
                cmds.append(commands(Op.ADVISE, addr, nbytes, advice=Advice.UNSET_READ_MOSTLY))
        return np.concatenate(cmds) if cmds else np.zeros(0, COMMAND_DTYPE)

    def _static(self, kb: KernelBlocks, tbs: np.ndarray, g: int) -> np.ndarray:
        """§6.5.1: the pages of the thread blocks' affine ranges, in thread-block order (so
        the first blocks' data arrives first), as runs of PREFETCH commands to GPU g."""
        if not self.static_prefetch:
            return np.zeros(0, COMMAND_DTYPE)
        rs = thread_block_ranges(kb, tbs)
        if not rs:
            return np.zeros(0, COMMAND_DTYPE)
        lo = np.stack([r[1] for r in rs], 1).ravel() >> PAGE_SHIFT  # thread block major
        hi = (np.stack([r[2] for r in rs], 1).ravel() + PAGE_SIZE - 1) >> PAGE_SHIFT
        pages = ordered_unique(ranges(lo, np.maximum(hi - lo, 0)))
        first, n = page_runs(pages)
        # one command per UM block at most, so the first thread blocks' data is not queued
        # behind one huge transfer
        k = (n + PAGES_PER_BLOCK - 1) // PAGES_PER_BLOCK
        starts = np.repeat(first, k) + ranges(np.zeros(len(k), np.int64), k) * PAGES_PER_BLOCK
        ends = np.minimum(starts + PAGES_PER_BLOCK, np.repeat(first + n, k))
        self.st["static_pages"] += int(len(pages))
        return commands(Op.PREFETCH, starts << PAGE_SHIFT, (ends - starts) << PAGE_SHIFT, dst=g)

    # ------------------------------------------------------------------ driver: events
    def attach(self, ctx) -> None:
        super().attach(ctx)
        nodes = int((ctx.workload.meta if ctx.workload is not None else {}).get("nodes", 0))
        self.n_gpus = ctx.n_gpus
        self.per_node = ctx.n_gpus // nodes if nodes >= 1 else 1
        self.desc = BlockDescriptors(nodes if nodes >= 1 else ctx.n_gpus)
        self._ro_blocks: set[int] = set()
        # Live there is no prepare(): the runtime sets the read-only advice in-process from the
        # convention's ro_mask (runtime/umctl_snurhac.h) and the controller is not told, so a
        # block no GPU has written yet stands in for a flagged one (its descriptor's write
        # masks are empty: every copy of it is a read copy, which is what the flag promises)
        self.live = bool(ctx.options.get("live", False))

    def on_events(self, batch: EventBatch) -> np.ndarray | None:
        out: list[np.ndarray] = []
        if Kind.FAULT in batch:
            out += self._faults(batch[Kind.FAULT])
        for seq in batch[Kind.LAUNCH]["seq"].tolist():
            ln = self.launches.get(int(seq))
            if ln is None:
                continue
            if ln.first:
                self.st["stale_read_copies"] += self.desc.kernel_done()
                if ln.advise is not None and len(ln.advise):
                    out.append(ln.advise)
                    self._track_flags(ln.advise)
            if len(ln.static):
                out.append(ln.static)
        return np.concatenate(out) if out else None

    def _track_flags(self, adv: np.ndarray) -> None:
        """The descriptors' read-only flag bit, per UM block, follows the advice."""
        for a, n, kind in zip(adv["addr"].tolist(), adv["bytes"].tolist(), adv["advice"].tolist()):
            blocks = range(a >> BLOCK_SHIFT, ((a + n - 1) >> BLOCK_SHIFT) + 1)
            if kind == Advice.READ_MOSTLY:
                self.desc.read_only.update(blocks)
            else:
                self.desc.read_only.difference_update(blocks)

    def _faults(self, f: np.ndarray) -> list[np.ndarray]:
        # live, a GPU the program was not spread over may still report faults: not ours to track
        f = f[(f["gpu"] >= 0) & (f["gpu"] < self.n_gpus)]
        if len(f) == 0:
            return []
        self.st["faults"] += len(f)
        page = f["addr"].astype(np.int64) >> PAGE_SHIFT
        block = page >> (BLOCK_SHIFT - PAGE_SHIFT)
        gpu = f["gpu"].astype(np.int64)
        wr = f["access"] != 0
        # descriptor updates: one lock per (batch, GPU, block)
        key = np.stack([f["batch_id"].astype(np.int64), gpu, block])
        _, inv = np.unique(key, axis=1, return_inverse=True)
        inv = inv.ravel()
        order = np.argsort(inv, kind="stable")
        bounds = np.flatnonzero(np.diff(inv[order])) + 1
        for grp in np.split(order, bounds):
            j = grp[0]
            self.desc.fault(int(gpu[j]) // self.per_node, int(block[j]), page[grp] & (PAGES_PER_BLOCK - 1), wr[grp])
        if not self.dynamic_prefetch:
            return []
        out = []
        ro = self.desc.read_only
        adj: set[tuple[int, int]] = set()
        corr: dict[int, list[int]] = {}
        for g, p, b in zip(gpu.tolist(), page.tolist(), block.tolist()):
            if b in ro or (self.live and not self.desc.write[b].any()):
                adj.add((g, b))            # adjacent pages: the faulted page's whole block
                continue
            t = self.tables.get(g)
            if t is None:
                rows, assoc, succs, levels = self.table_dims
                t = self.tables[g] = PairCorrelationTable(rows, assoc, succs, levels)
            t.record(p)
            succ = t.successors(p)
            if succ:
                corr.setdefault(g, []).extend(succ)
        if adj:
            gs, bs = zip(*sorted(adj))
            out.append(commands(Op.PREFETCH, np.array(bs, np.int64) << BLOCK_SHIFT, BLOCK_SIZE, dst=np.array(gs)))
            self.st["adjacent_blocks"] += len(adj)
        for g, pages in corr.items():
            pages = ordered_unique(np.array(pages, np.int64))
            first, n = page_runs(pages)
            self.st["correlation_pages"] += len(pages)
            out.append(commands(Op.PREFETCH, first << PAGE_SHIFT, n << PAGE_SHIFT, dst=g))
        return out

    def stats(self) -> dict:
        d = dict(self.st)
        d["partition_dims"] = {"x": self.dims[0], "y": self.dims[1], "z": self.dims[2]}
        if self.desc is not None:
            d["descriptor_lookups"] = self.desc.lookups
            d["remote_descriptor_lookups"] = self.desc.remote_lookups
        d["table_bytes"] = PairCorrelationTable(*self.table_dims[:3], self.table_dims[3]).nbytes() \
            if self.dynamic_prefetch else 0
        return d


@register
class SnuRHACStatic(SnuRHACController):
    """SnuRHAC-SP: with static prefetching from the known access ranges."""

    name = "snurhac-sp"
    static_prefetch = True
    replay_only = True
    replay_only_why = ("prefetches from the compiler's access ranges, which a live program does not give umctl "
                       "(live: snurhac, snurhac-dp)")


@register
class SnuRHACStaticDynamic(SnuRHACController):
    """SnuRHAC-SP-DP: static and dynamic prefetching (the thesis's full system)."""

    name = "snurhac-sp-dp"
    static_prefetch = True
    replay_only = True
    replay_only_why = SnuRHACStatic.replay_only_why
    dynamic_prefetch = True


@register
class SnuRHACDynamic(SnuRHACController):
    """Dynamic prefetching alone (not in the thesis): what it recovers without MAPA."""

    name = "snurhac-dp"
    dynamic_prefetch = True
