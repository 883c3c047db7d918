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
from ..workload.workload import OpType
from ..units import BLOCK_SIZE, CPU, PAGE_SIZE, PAGE_TO_BLOCK_SHIFT, PAGES_PER_BLOCK, ranges
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
        # The future is computed on the simulator's runs (compact pages, each run inside one
        # 2 MiB block and one operation), never on the flat per-access stream: a paper-scale
        # replay makes hundreds of millions of accesses in a few hundred thousand runs, and
        # every table here is per run, per use or per block.
        runs = ctx.options["access_runs"]
        self._plan_uses(runs, ops, kidx)
        self._plan_belady(runs, ops, kidx, ctx)
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
        self.fits = self._fits(w, space)
        # link cost of one command and of one page (moved in now, written back later)
        self.cmd_ns = float(calib.transfer_latency_ns)
        self.page_ns = PAGE_SIZE / calib.prefetch_h2d_Bps * 1e9 + PAGE_SIZE / calib.d2h_Bps * 1e9

    def _fits(self, w, space) -> list[bool]:
        """Per GPU: do all the managed blocks its kernels ever touch fit in its memory beside
        its device allocations? Then the stock driver never evicts there and only faults each
        block in once, and neither pre-evicting nor discarding can save anything: a discarded
        dead block is zero-filled on its next use, a fault the stock driver does not take
        (it keeps the block), and a reserve of free chunks only evicts blocks needed again."""
        out = []
        dev = w.allocations[~w.allocations["managed"]]
        for g, cap in enumerate(self.cap_blocks):
            used = np.unique(self.use_b[(self.kernel_gpu[self.use_k] == g) & self.movable[self.use_b]])
            pinned = set()
            for rec in dev[dev["gpu"] == g]:
                for lo, hi in space.local_range(int(rec["addr"]), int(rec["bytes"])):
                    pinned.add(lo >> PAGE_TO_BLOCK_SHIFT)
            out.append(len(used) + len(pinned) <= cap)
        return out

    @staticmethod
    def _kernel_runs(runs, ops, kidx) -> tuple[np.ndarray, np.ndarray]:
        """(kernel, run) of every run of every kernel, kernels in launch order and each one's
        runs in stream order (a run inside several kernels' ranges is listed once per kernel)."""
        lo = np.searchsorted(runs.pos, ops["acc_lo"][kidx], "right") - 1
        hi = np.searchsorted(runs.pos, ops["acc_hi"][kidx], "left")
        empty = ops["acc_hi"][kidx] <= ops["acc_lo"][kidx]
        n = np.where(empty, 0, hi - lo)
        rk = np.repeat(np.arange(len(kidx), dtype=np.int64), n)
        rr = ranges(lo, n)
        return rk, rr

    def _plan_uses(self, runs, ops, kidx) -> None:
        """Uses: (kernel, block) in first-touch order, each with its distinct pages as runs of
        in-block offsets (the union of the kernel's runs in that block)."""
        rk, rr = self._kernel_runs(runs, ops, kidx)
        page = runs.page[rr]
        blk = page >> PAGE_TO_BLOCK_SHIFT
        off = page & (PAGES_PER_BLOCK - 1)
        end = off + runs.length[rr]
        # group the runs by (kernel, block), offsets ascending inside a group
        srt = np.lexsort((off, blk, rk))
        gk, gb, s_off, s_end, s_run = rk[srt], blk[srt], off[srt], end[srt], rr[srt]
        del page, off, end, blk
        newg = np.ones(len(srt), np.bool_)
        newg[1:] = (gk[1:] != gk[:-1]) | (gb[1:] != gb[:-1])
        gstart = np.flatnonzero(newg)
        gid = np.cumsum(newg) - 1
        g_k, g_b = gk[gstart], gb[gstart]
        g_first = np.minimum.reduceat(s_run, gstart) if len(gstart) else np.zeros(0, np.int64)   # first-touch run
        # merge each group's intervals: a new page run starts past the ends seen so far
        span = 2 * PAGES_PER_BLOCK
        reach = np.maximum.accumulate(gid * span + s_end)
        newr = newg.copy()
        newr[1:] |= gid[1:] * span + s_off[1:] > reach[:-1]
        rstart = np.flatnonzero(newr)
        m_off = s_off[rstart]
        m_len = (reach[np.append(rstart[1:], len(reach)) - 1] - gid[rstart] * span) - m_off if len(rstart) else m_off
        m_gid = gid[rstart]
        del gk, gb, s_off, s_end, s_run, reach, newr, gid
        # uses in first-touch order inside each kernel
        order = np.lexsort((g_first, g_k))
        rank = np.empty(len(order), np.int64)
        rank[order] = np.arange(len(order))
        mord = np.argsort(rank[m_gid], kind="stable")
        self.use_k, self.use_b = g_k[order], g_b[order]
        self.use_pos = runs.pos[g_first[order]]
        nruns = np.bincount(m_gid, minlength=len(g_k))[order]
        self.use_rlo = np.zeros(len(order) + 1, np.int64)
        np.cumsum(nruns, out=self.use_rlo[1:])
        self.use_roff = m_off[mord].astype(np.int16)     # in-block page offset of each page run
        self.use_rlen = m_len[mord].astype(np.int16)     # its pages (<= 512)
        self.use_runs = nruns
        self.use_npages = np.bincount(m_gid, weights=m_len, minlength=len(g_k))[order].astype(np.int64)
        n = len(self.use_k)
        self.issued = np.zeros(n, np.bool_)
        # uses grouped by block, to forget a block's future uses when it is dropped
        nblocks = self.ctx.options["page_space"].nblocks
        self.by_block = np.lexsort((np.arange(n), self.use_b))
        self.by_block_lo = np.searchsorted(self.use_b[self.by_block], np.arange(nblocks + 1))
        self.kernel_use_lo = np.searchsorted(self.use_k, np.arange(len(kidx) + 1))

    def _plan_belady(self, runs, ops, kidx, ctx: ControllerContext) -> None:
        """Belady in the driver: per run, the next access to its block by the same GPU after
        the run (inside a run the next access is the next position: the core knows)."""
        gpu = np.full(len(runs), -1, np.int64)
        rk, rr = self._kernel_runs(runs, ops, kidx)
        gpu[rr] = self.kernel_gpu[rk]         # a run in several kernels: the last one's GPU
        del rk, rr
        blk = runs.page >> PAGE_TO_BLOCK_SHIFT
        order = np.lexsort((np.arange(len(blk)), blk, gpu))
        order = order[gpu[order] >= 0]
        sg, sb = gpu[order], blk[order]
        same = (sb[1:] == sb[:-1]) & (sg[1:] == sg[:-1])
        nxt = np.full(len(blk), _NEVER, np.int64)
        nxt[order[:-1]] = np.where(same, runs.pos[order[1:]], _NEVER)
        self.key = ctx.belady(next_run=nxt)  # the core keeps key = -(next access) as it walks
        first = np.ones(len(order), np.bool_)
        first[1:] = ~same
        fo = order[first]
        self.key[gpu[fo], blk[fo]] = -runs.pos[fo].astype(np.float64)

    # ------------------------------------------------------------------ events
    def on_events(self, batch: EventBatch) -> np.ndarray | None:
        out = []
        dropped = np.zeros(0, np.int64)
        if Kind.ALLOC in batch:
            a = batch[Kind.ALLOC]
            dead = a[(a["op"] == AllocOp.BLOCK_INACTIVE) | (a["op"] == AllocOp.FREE)]
            if len(dead) and not all(self.fits):   # where everything fits, dead blocks stay for reuse
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
        reserve = 0 if self.fits[g] else max(2, int(self.cap_blocks[g] * self.reserve_frac))
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
        if n_evict > 0 and not self.fits[g]:
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
            lo, hi = self.use_rlo[u], self.use_rlo[u + 1]
            off = self.use_roff[lo:hi].astype(np.int64)
            lens = self.use_rlen[lo:hi].astype(np.int64)
            out.append(commands(Op.PREFETCH, self.block_addr[b] + off * PAGE_SIZE, lens * PAGE_SIZE,
                                dst=g, exec_id=exec_id, priority=0))
        res = np.concatenate(out)
        self.n_prefetch += len(res)
        return res

    def stats(self) -> dict:
        return {"prefetch_cmds": self.n_prefetch, "preevict_cmds": self.n_preevict,
                "invalidate_cmds": self.n_invalidate, "plans": self.n_plans}
