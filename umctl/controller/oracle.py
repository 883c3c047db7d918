"""Mode ``oracle`` (replay only): the upper bound every policy is compared with.

It knows the whole future access stream. At every kernel launch it prefetches, in order of
first use, the 2 MiB blocks the next kernels will touch, and makes room by pre-evicting the
resident block whose next use lies farthest in the future (Belady's MIN) — but only when that
next use is later than the use of the block it brings in, so it never makes things worse.
Blocks of allocator blocks marked inactive are dead and invalidated (no write-back), as any
policy that sees the allocator may do.
"""

from __future__ import annotations

import numpy as np

from ..events.schema import AllocOp, EventBatch, Kind, Op, commands
from ..sources.workload import OpType
from ..units import BLOCK_SIZE, CPU, PAGE_TO_BLOCK_SHIFT
from .base import Controller, ControllerContext, register

_NEVER = np.iinfo(np.int64).max


@register
class OracleController(Controller):
    name = "oracle"
    subscribes = frozenset({Kind.LAUNCH, Kind.ALLOC})
    replay_only = True

    def __init__(self, lookahead: int = 64, **options):
        super().__init__(**options)
        self.lookahead = int(lookahead)
        self.n_prefetch = 0
        self.n_preevict = 0
        self.n_invalidate = 0

    def attach(self, ctx: ControllerContext) -> None:
        super().attach(ctx)
        from .. import UmctlError

        if ctx.workload is None or ctx.residency is None:
            raise UmctlError("mode oracle needs the future: it runs only in replay")
        w = ctx.workload
        space = ctx.options["page_space"]
        ops = w.ops
        kidx = np.flatnonzero(ops["type"] == OpType.KERNEL)
        self.kernel_of_op = np.full(len(ops), -1, np.int64)
        self.kernel_of_op[kidx] = np.arange(len(kidx))
        self.kernel_gpu = ops["gpu"][kidx].astype(np.int64)
        # (kernel, block) pairs in first-touch order within each kernel
        pk, pb = [], []
        for k, i in enumerate(kidx):
            lo, hi = int(ops["acc_lo"][i]), int(ops["acc_hi"][i])
            if hi <= lo:
                continue
            blocks = space.to_local_pages(w.acc_page[lo:hi]) >> PAGE_TO_BLOCK_SHIFT
            ub, first = np.unique(blocks, return_index=True)
            ub = ub[np.argsort(first)]
            pk.append(np.full(len(ub), k, np.int64))
            pb.append(ub)
        self.pair_k = np.concatenate(pk) if pk else np.zeros(0, np.int64)
        self.pair_b = np.concatenate(pb) if pb else np.zeros(0, np.int64)
        # next use of the same block after each pair
        order = np.lexsort((self.pair_k, self.pair_b))
        nxt = np.full(len(order), _NEVER, np.int64)
        same = self.pair_b[order][1:] == self.pair_b[order][:-1]
        nxt_sorted = np.where(same, self.pair_k[order][1:], _NEVER)
        nxt[order[:-1]] = nxt_sorted
        self.pair_next = nxt
        self.kernel_pair_lo = np.searchsorted(self.pair_k, np.arange(len(kidx) + 1))
        nb = space.nblocks
        self.next_use = np.full(nb, _NEVER, np.int64)
        firsts = np.unique(self.pair_b, return_index=True)
        self.next_use[firsts[0]] = self.pair_k[firsts[1]]
        self.done_pairs = 0
        # only managed blocks can be moved
        self.movable = np.zeros(nb, np.bool_)
        for rec in w.allocations[w.allocations["managed"]]:
            for lo, hi in space.local_range(int(rec["addr"]), int(rec["bytes"])):
                self.movable[lo >> PAGE_TO_BLOCK_SHIFT] = True
        self.block_addr = ctx.block_addr
        self.cap_blocks = [int(m) // BLOCK_SIZE for m in ctx.gpu_mem]

    def on_events(self, batch: EventBatch) -> np.ndarray | None:
        out = []
        if Kind.ALLOC in batch:
            a = batch[Kind.ALLOC]
            dead = a[(a["op"] == AllocOp.BLOCK_INACTIVE) | (a["op"] == AllocOp.FREE)]
            if len(dead):
                out.append(commands(Op.INVALIDATE, dead["addr"], dead["bytes"]))
                self.n_invalidate += len(dead)
        if Kind.LAUNCH in batch:
            for ev in batch[Kind.LAUNCH]:
                k = int(self.kernel_of_op[int(ev["seq"])])
                if k >= 0:
                    cmds = self._plan(k, int(ev["gpu"]))
                    if cmds is not None:
                        out.append(cmds)
        return np.concatenate(out) if out else None

    def _advance(self, k: int) -> None:
        """Pairs of kernels before k are in the past: move their blocks' next use on."""
        end = int(self.kernel_pair_lo[k])
        if end > self.done_pairs:
            sl = slice(self.done_pairs, end)
            self.next_use[self.pair_b[sl]] = self.pair_next[sl]
            self.done_pairs = end

    def _plan(self, k: int, g: int) -> np.ndarray | None:
        self._advance(k)
        resident, free = self.ctx.residency(g)
        lo = int(self.kernel_pair_lo[k])
        hi = int(self.kernel_pair_lo[min(len(self.kernel_pair_lo) - 1, k + self.lookahead)])
        kk, bb = self.pair_k[lo:hi], self.pair_b[lo:hi]
        sel = (self.kernel_gpu[kk] == g) & self.movable[bb]
        kk, bb = kk[sel], bb[sel]
        ub, first = np.unique(bb, return_index=True)
        order = np.argsort(first)
        ub, uk = ub[order][: self.cap_blocks[g]], kk[first[order]][: self.cap_blocks[g]]
        missing = ~resident[ub]
        mb, mk = ub[missing], uk[missing]
        if len(mb) == 0:
            return None
        nfree = max(0, int(free))
        take = min(len(mb), nfree)
        victims = np.zeros(0, np.int64)
        if len(mb) > nfree:
            # Belady: resident movable blocks not needed in the planned window, farthest first
            cand = np.flatnonzero(resident & self.movable)
            cand = cand[~np.isin(cand, ub)]
            cand = cand[np.argsort(-self.next_use[cand], kind="stable")]
            want = mb[nfree:]
            wantk = mk[nfree:]
            n = min(len(want), len(cand))
            ok = self.next_use[cand[:n]] > wantk[:n]
            n_ok = int(np.argmin(ok)) if not ok.all() else n
            victims = cand[:n_ok]
            take += n_ok
        pref = mb[:take]
        out = []
        if len(victims):
            out.append(commands(Op.PREEVICT, self.block_addr[victims], BLOCK_SIZE, dst=CPU))
            self.n_preevict += len(victims)
        if len(pref):
            out.append(commands(Op.PREFETCH, self.block_addr[pref], BLOCK_SIZE, dst=g,
                                exec_id=k, priority=0))
            self.n_prefetch += len(pref)
        return np.concatenate(out) if out else None

    def stats(self) -> dict:
        return {"prefetch_cmds": self.n_prefetch, "preevict_cmds": self.n_preevict,
                "invalidate_cmds": self.n_invalidate}
