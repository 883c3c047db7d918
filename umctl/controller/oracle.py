"""Mode ``oracle`` (replay only): the upper bound every policy is compared with.

It knows the whole future access stream, as a sequence of (kernel, 2 MiB block) *uses* in
first-touch order with the exact pages of each use. A cursor follows the program: it jumps to
a kernel's first use at its launch and moves through the kernel's uses as its faults show
where it is, so kernels larger than GPU memory are planned inside too.

Two replay-only powers make it an upper bound rather than a policy:
  * eviction is Belady's MIN: it hands the simulated driver a victim order (next use farthest
    in the future first, never-used-again before all), used both on the fault path and when a
    prefetch needs room;
  * it prefetches, in order, the upcoming uses that are not resident, as far ahead as memory
    allows — a use is brought in only if some resident block is needed later than it (or a
    chunk is free), so prefetching never evicts something needed sooner. Each prefetch is the
    whole block or the exact page runs of the use, whichever costs less on the link given the
    calibration (command start-up vs bytes moved in now and written back later).
Allocator blocks marked inactive are dead and invalidated, as any policy that sees the
allocator may do.
"""

from __future__ import annotations

import numpy as np

from ..events.schema import AllocOp, EventBatch, Kind, Op, commands
from ..sources.workload import OpType
from ..units import BLOCK_SIZE, CPU, PAGE_SIZE, PAGE_TO_BLOCK_SHIFT, PAGES_PER_BLOCK
from .base import Controller, ControllerContext, register

_NEVER = np.iinfo(np.int64).max


@register
class OracleController(Controller):
    name = "oracle"
    subscribes = frozenset({Kind.LAUNCH, Kind.ALLOC, Kind.FAULT, Kind.EVICTION})
    replay_only = True

    def __init__(self, lookahead: int = 64, replan_uses: int = 8, reserve_frac: float = 0.125,
                 prefetch_blocks: int = 32, **options):
        super().__init__(**options)
        self.prefetch_blocks = int(prefetch_blocks)
        self.reserve_frac = float(reserve_frac)  # of GPU memory kept free for prefetches
        self.lookahead = int(lookahead)      # kernels ahead considered at most
        self.replan_uses = int(replan_uses)  # re-plan inside a kernel every this many uses
        self.n_prefetch = 0
        self.n_preevict = 0
        self.n_invalidate = 0
        self.n_plans = 0

    # ------------------------------------------------------------------ the future
    def attach(self, ctx: ControllerContext) -> None:
        super().attach(ctx)
        from .. import UmctlError

        if ctx.workload is None or ctx.residency is None:
            raise UmctlError("mode oracle needs the future: it runs only in replay")
        w = ctx.workload
        space = ctx.options["page_space"]
        calib = ctx.options["calibration"]
        ops = w.ops
        kidx = np.flatnonzero(ops["type"] == OpType.KERNEL)
        self.kernel_of_op = np.full(len(ops), -1, np.int64)
        self.kernel_of_op[kidx] = np.arange(len(kidx))
        self.kernel_gpu = ops["gpu"][kidx].astype(np.int64)
        # uses: (kernel, block) in first-touch order, each with its sorted pages
        uk, ub, upos, pages, counts = [], [], [], [], []
        gpu_of = np.full(len(w.acc_page), -1, np.int64)
        local_all = space.to_local_pages(w.acc_page) if len(w.acc_page) else np.zeros(0, np.int64)
        for k, i in enumerate(kidx):
            lo, hi = int(ops["acc_lo"][i]), int(ops["acc_hi"][i])
            if hi <= lo:
                continue
            gpu_of[lo:hi] = ops["gpu"][i]
            local = local_all[lo:hi]
            up = np.unique(local)
            blocks, start, cnt = np.unique(up >> PAGE_TO_BLOCK_SHIFT, return_index=True, return_counts=True)
            first_touch = np.unique(local >> PAGE_TO_BLOCK_SHIFT, return_index=True)[1]
            order = np.argsort(first_touch)
            uk.append(np.full(len(blocks), k, np.int64))
            ub.append(blocks[order])
            upos.append(lo + first_touch[order])
            pages.append(np.concatenate([up[start[j]:start[j] + cnt[j]] for j in order]))
            counts.append(cnt[order])
        self.use_k = np.concatenate(uk) if uk else np.zeros(0, np.int64)
        self.use_b = np.concatenate(ub) if ub else np.zeros(0, np.int64)
        self.use_pos = np.concatenate(upos) if upos else np.zeros(0, np.int64)
        self.use_pages = np.concatenate(pages) if pages else np.zeros(0, np.int64)
        self.use_plo = np.concatenate([[0], np.cumsum(np.concatenate(counts))]) if counts else np.zeros(1, np.int64)
        n = len(self.use_k)
        self.issued = np.zeros(n, np.bool_)
        breaks = np.diff(self.use_pages, prepend=-2) != 1
        cum = np.cumsum(breaks)
        lo_, hi_ = self.use_plo[:-1], self.use_plo[1:]
        self.use_npages = hi_ - lo_
        self.use_runs = np.where(hi_ > lo_, cum[np.maximum(hi_ - 1, 0)] - cum[lo_] + 1, 0)
        # uses grouped by block, to forget a block's future uses when it is dropped
        self.by_block = np.lexsort((np.arange(n), self.use_b))
        self.by_block_lo = np.searchsorted(self.use_b[self.by_block], np.arange(space.nblocks + 1))
        self.kernel_use_lo = np.searchsorted(self.use_k, np.arange(len(kidx) + 1))
        # Belady in the driver: per access, the next access to its block on the same GPU
        blk = local_all >> PAGE_TO_BLOCK_SHIFT
        pos = np.arange(len(blk))
        order = np.lexsort((pos, blk, gpu_of))
        same = (blk[order][1:] == blk[order][:-1]) & (gpu_of[order][1:] == gpu_of[order][:-1])
        nxt = np.full(len(blk), _NEVER, np.int64)
        nxt[order[:-1]] = np.where(same, order[1:], _NEVER)
        nxt[gpu_of < 0] = _NEVER
        self.key = ctx.belady(nxt)  # the core keeps key = -(next access) as it walks
        first = np.ones(len(order), np.bool_)
        first[1:] = ~same
        fo = order[first]
        fo = fo[gpu_of[fo] >= 0]
        self.key[gpu_of[fo], blk[fo]] = -fo.astype(np.float64)
        self.cursor = 0
        self.last_plan = -1
        self.kernel = -1
        self.movable = np.zeros(space.nblocks, np.bool_)
        for rec in w.allocations[w.allocations["managed"]]:
            for lo, hi in space.local_range(int(rec["addr"]), int(rec["bytes"])):
                self.movable[lo >> PAGE_TO_BLOCK_SHIFT] = True
        self.block_addr = ctx.block_addr
        self.space = space
        self.cap_blocks = [int(m) // BLOCK_SIZE for m in ctx.gpu_mem]
        # link cost of one command and of one page (moved in now, written back later)
        self.cmd_ns = float(calib.transfer_latency_ns)
        self.page_ns = PAGE_SIZE / calib.prefetch_h2d_Bps * 1e9 + PAGE_SIZE / calib.d2h_Bps * 1e9

    # ------------------------------------------------------------------ events
    def on_events(self, batch: EventBatch) -> np.ndarray | None:
        out = []
        dropped = np.zeros(0, np.int64)
        if Kind.ALLOC in batch:
            a = batch[Kind.ALLOC]
            dead = a[(a["op"] == AllocOp.BLOCK_INACTIVE) | (a["op"] == AllocOp.FREE)]
            if len(dead):
                out.append(commands(Op.INVALIDATE, dead["addr"], dead["bytes"]))
                self.n_invalidate += len(dead)
                dropped = self._blocks_of(dead["addr"], dead["bytes"])
        if Kind.EVICTION in batch:
            # the driver made room (by our Belady order): those blocks' uses need a prefetch again
            self._forget(self._blocks_of(batch[Kind.EVICTION]["addr"], np.full(len(batch[Kind.EVICTION]), 1)))
        g = None
        if Kind.LAUNCH in batch:
            for ev in batch[Kind.LAUNCH]:
                k = int(self.kernel_of_op[int(ev["seq"])])
                if k >= 0:
                    self.kernel = k
                    g = int(ev["gpu"])
                    self._move_cursor(int(self.kernel_use_lo[k]))
        elif Kind.FAULT in batch and self.kernel >= 0:
            self._progress(batch[Kind.FAULT])
            g = int(self.kernel_gpu[self.kernel])
        if g is not None and (self.cursor - self.last_plan >= self.replan_uses or Kind.LAUNCH in batch or len(dropped)):
            cmds = self._plan(g, dropped)
            if cmds is not None:
                out.append(cmds)
        return np.concatenate(out) if out else None

    def _progress(self, faults: np.ndarray) -> None:
        """Move the cursor to the furthest use of the current kernel that faulted."""
        k = self.kernel
        lo, hi = int(self.kernel_use_lo[k]), int(self.kernel_use_lo[k + 1])
        if hi <= lo:
            return
        gb = (faults["addr"].astype(np.int64) >> 21)
        cb = np.searchsorted(self.space.global_blocks, gb)
        cb = cb[cb < self.space.nblocks]
        where = np.flatnonzero(np.isin(self.use_b[lo:hi], cb))
        if len(where):
            self._move_cursor(lo + int(where.max()))

    def _move_cursor(self, c: int) -> None:
        self.cursor = max(self.cursor, c)

    def _blocks_of(self, addr: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
        """Compact blocks overlapped by byte ranges."""
        ba = self.block_addr.astype(np.int64)
        start = addr.astype(np.int64) // BLOCK_SIZE * BLOCK_SIZE
        end = (addr.astype(np.int64) + np.maximum(nbytes.astype(np.int64), 1) - 1) // BLOCK_SIZE * BLOCK_SIZE
        lo = np.searchsorted(ba, start)
        hi = np.searchsorted(ba, end, side="right")
        return np.unique(np.concatenate([np.arange(a, b) for a, b in zip(lo, hi)])) if len(lo) else lo

    # ------------------------------------------------------------------ planning
    def _plan(self, g: int, dropped: np.ndarray) -> np.ndarray | None:
        self.n_plans += 1
        self.last_plan = self.cursor
        holds, complete, free = self.ctx.residency(g)
        if len(dropped):
            # the invalidations sent with this plan are applied before it: see them now
            holds, complete = holds.copy(), complete.copy()
            complete[dropped] = False
            self._forget(dropped)
        c = self.cursor
        kend = min(len(self.kernel_use_lo) - 1, int(self.use_k[c]) + self.lookahead) if c < len(self.use_k) else 0
        idx = np.arange(c, int(self.kernel_use_lo[kend]))
        bb = self.use_b[idx]
        sel = (self.kernel_gpu[self.use_k[idx]] == g) & self.movable[bb]
        idx, bb = idx[sel], bb[sel]
        ub, first = np.unique(bb, return_index=True)
        # plan as far ahead as memory allows, less a reserve kept free so that prefetches
        # never wait for the write-back of the chunk they take
        reserve = max(2, int(self.cap_blocks[g] * self.reserve_frac))
        order = np.argsort(first)[: max(1, self.cap_blocks[g] - reserve)]
        ub, uu = ub[order], idx[first[order]]
        missing = ~complete[ub] & ~self.issued[uu]
        # write-backs (the slow direction) are started for the whole window, prefetches only
        # for its first blocks: a long host->GPU queue would make near uses wait behind far ones
        near = np.arange(len(ub)) < self.prefetch_blocks
        mb, mu = ub[missing & near], uu[missing & near]
        needs_chunk = ~holds[ub[missing]]
        # make room ahead of need: pre-evict the resident blocks used farthest in the future
        # (Belady), all of them used after every block of the window
        n_evict = int(needs_chunk.sum()) + reserve - max(0, int(free))
        out = []
        if n_evict > 0:
            cand = np.flatnonzero(holds & self.movable)
            cand = cand[~np.isin(cand, ub)]
            victims = cand[np.argsort(self.key[g, cand], kind="stable")][:n_evict]
            if len(victims):
                out.append(commands(Op.PREEVICT, self.block_addr[victims], BLOCK_SIZE, dst=CPU))
                self.n_preevict += len(victims)
                self._forget(victims)
        if len(mb):
            self.issued[mu] = True
            # whole block, or page runs: judged on all of the block's uses in the window
            nb = len(holds)
            runs = np.bincount(bb, weights=self.use_runs[idx], minlength=nb)[mb]
            npages = np.minimum(PAGES_PER_BLOCK, np.bincount(bb, weights=self.use_npages[idx], minlength=nb)[mb])
            sparse = runs * self.cmd_ns + npages * self.page_ns < self.cmd_ns + PAGES_PER_BLOCK * self.page_ns
            out.append(self._prefetch_cmds(mb, mu, sparse, g))
        return np.concatenate(out) if out else None

    def _forget(self, blocks: np.ndarray) -> None:
        """Blocks leave the GPU: their future uses must be prefetched again."""
        for b in blocks:
            ids = self.by_block[self.by_block_lo[b]:self.by_block_lo[b + 1]]
            self.issued[ids[ids >= self.cursor]] = False

    def _prefetch_cmds(self, blocks: np.ndarray, uses: np.ndarray, sparse: np.ndarray, g: int) -> np.ndarray:
        """Whole blocks (consecutive ones merged into one command: one DMA start-up), or the
        exact page runs of the use for sparse blocks."""
        exec_id = int(self.use_k[uses[0]])
        out = []
        whole = self.block_addr[blocks[~sparse]].astype(np.int64)
        if len(whole):
            starts = np.flatnonzero(np.diff(whole, prepend=-2 * BLOCK_SIZE) != BLOCK_SIZE)
            lens = np.diff(np.append(starts, len(whole)))
            out.append(commands(Op.PREFETCH, whole[starts], lens * BLOCK_SIZE, dst=g, exec_id=exec_id, priority=0))
        for b, u in zip(blocks[sparse], uses[sparse]):
            pg = self.use_pages[self.use_plo[u]:self.use_plo[u + 1]] & (PAGES_PER_BLOCK - 1)
            starts = np.flatnonzero(np.diff(pg, prepend=-2) != 1)
            lens = np.diff(np.append(starts, len(pg)))
            out.append(commands(Op.PREFETCH, self.block_addr[b] + pg[starts] * PAGE_SIZE, lens * PAGE_SIZE,
                                dst=g, exec_id=exec_id, priority=0))
        res = np.concatenate(out)
        self.n_prefetch += len(res)
        return res

    def stats(self) -> dict:
        return {"prefetch_cmds": self.n_prefetch, "preevict_cmds": self.n_preevict,
                "invalidate_cmds": self.n_invalidate, "plans": self.n_plans}
