"""Mode ``harvest``: memHarvester on HUVM (Choi et al., ATC'22 §4-§5): an oversubscribed GPU
uses the spare memory of neighbour GPUs over NVLink as a victim cache between itself and the
host.

The policy lives here; the mechanism is the HUVM driver's (the simulator models it, see
``umctl/sim/engine.py``; the stock driver has none of it, so these modes are replay-only):

* H   harvesting: evictions on the fault path go to a neighbour's spare memory over NVLink
      (round-robin target, §4.2.3) instead of to the host; a background thread writes
      harvested chunks back to the host on the lender's PCIe lane, making them *removable*, and
      the lender's own demand reclaims them first (§4.2, §5.2).
* PE  pre-eviction (§4.2.1): when fewer than 50 free 2 MiB chunks remain (scaled to the GPU:
      50 of a 16 GB V100's 8192), the least recently migrated-in chunks are pre-evicted to the
      neighbours (round robin) while they lend memory, else to the host.
* LP  large-page eviction (§4.2.2): write-back to the host in 2 MiB operations (the pinned copy
      rate) instead of 512 page populations (the stock UVM eviction rate).
* PLF parallel fetch (§4.3.1): half of each fault batch comes through a neighbour's PCIe lane.
* MPF multi-path prefetcher (§4.3.2-4.3.3): next-line/stride prefetch of 32 MiB (2 MiB stride)
      in the direction of the faults; chunks in spare memory come to the GPU over NVLink, chunks
      on the host go to the spare memory over the lender's PCIe lane, or straight to the GPU
      when more harvesters are active than GPUs lend (the lenders' lanes would be congested).
* LPF the paper's comparison point for MPF: the same prefetcher, always host -> local GPU.

Modes, cumulative as in HUVM Figure 7: ``harvest-h``, ``harvest-pe`` (+PE), ``harvest-lp``
(+LP), ``harvest-plf`` (+PLF), ``harvest-lpf`` (+LPF), ``harvest`` (all, MPF instead of LPF).
Baseline ``pre-ef-host`` (§6.1, the prior work memHarvester compares with): pre-eviction and the
same prefetcher, host only, on the stock driver.

Which GPUs harvest and which lend comes from ``workload.meta['tenants']`` (the ``tenants``
scenario family); without it GPU 0 harvests and the others lend.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from .. import UmctlError
from ..events.schema import EventBatch, Kind, Op, commands
from ..units import BLOCK_SHIFT, BLOCK_SIZE, CPU, GiB
from .base import Controller, ControllerContext, register

#: HUVM's pre-eviction threshold: 50 free chunks of a 16 GB GPU (8192 chunks of 2 MiB).
PAPER_THRESHOLD_CHUNKS = 50
PAPER_GPU_CHUNKS = 16 * GiB // BLOCK_SIZE


def roles(workload, n_gpus: int) -> tuple[list[int], list[int]]:
    """(harvesting GPUs, lending GPUs) of a workload."""
    tenants = (getattr(workload, "meta", None) or {}).get("tenants") if workload is not None else None
    if tenants:
        harv = sorted({int(t["gpu"]) for t in tenants if t.get("harvester", int(t["gpu"]) == 0)})
        lend = sorted({int(t["gpu"]) for t in tenants} - set(harv))
        return harv, lend
    return [0], list(range(1, n_gpus))


def scaled_threshold(capacity_chunks: int) -> int:
    """The paper's 50 free chunks, as the same share of a smaller simulated GPU (at least 2)."""
    return max(2, round(PAPER_THRESHOLD_CHUNKS * capacity_chunks / PAPER_GPU_CHUNKS))


class _Base(Controller):
    """memHarvester's policy with a set of its techniques enabled (see the module docstring)."""

    subscribes: ClassVar[frozenset[Kind]] = frozenset({Kind.FAULT, Kind.EVICTION})
    replay_only: ClassVar[bool] = True
    replay_only_why: ClassVar[str] = "needs the HUVM driver"
    features: ClassVar[frozenset[str]] = frozenset()
    # Live, with the stock driver, memHarvester is its victim cache: what the budget evicts goes
    # to the neighbours' spare memory (round-robin) and faults fetch it back over NVLink. The
    # HUVM driver features (parallel fetch, large-page write-back, multi-path prefetch) exist
    # only on replay.
    live_as: ClassVar[str | None] = "none"
    needs_spare_gpus: ClassVar[bool] = True

    def __init__(self, threshold_chunks: int = 0, prefetch_bytes: int = 32 << 20, stride_bytes: int = 2 << 20,
                 active_window_ns: int = 5_000_000, lend_limit: bool = True):
        super().__init__(threshold_chunks=threshold_chunks, prefetch_bytes=prefetch_bytes,
                         stride_bytes=stride_bytes, active_window_ns=active_window_ns, lend_limit=lend_limit)
        self.lend_limit = bool(lend_limit)
        if threshold_chunks < 0 or prefetch_bytes < 0 or stride_bytes < 0:
            raise UmctlError("threshold_chunks, prefetch_bytes and stride_bytes must not be negative")
        self.threshold_opt = int(threshold_chunks)
        self.depth = max(0, int(prefetch_bytes) // BLOCK_SIZE)
        self.stride = max(1, int(stride_bytes) // BLOCK_SIZE)
        self.window = int(active_window_ns)
        self.harvesters: list[int] = []
        self.lenders: list[int] = []
        # per harvester GPU: its blocks in order of migration into it (LRU first), the last
        # faulted block and direction, when it last faulted, prefetches issued
        self.resident: dict[int, dict[int, None]] = {}
        self.last_block: dict[int, int] = {}
        self.direction: dict[int, int] = {}
        self.last_fault: dict[int, int] = {}
        self.rr = 0
        self.n = {k: 0 for k in ("preevict_spare", "preevict_host", "prefetch_local", "prefetch_spare",
                                 "stage_spare", "local_policy")}

    def has(self, f: str) -> bool:
        return f in self.features

    def applies_to(self, workload) -> str | None:
        if not self.has("h"):
            return None
        n = workload.n_gpus
        if n < 2:
            return f"{self.name} harvests neighbour GPUs' spare memory: the program runs on {n} GPU"
        harv, lend = roles(workload, n)
        if not harv or not lend:
            return f"{self.name} needs a harvesting GPU and a lending one (tenants: {harv} harvest, {lend} lend)"
        return None

    def attach(self, ctx: ControllerContext) -> None:
        super().attach(ctx)
        self.harvesters, self.lenders = roles(ctx.workload, ctx.n_gpus)
        if not self.has("h"):
            self.lenders = []
        cap = [int(m) // BLOCK_SIZE for m in ctx.gpu_mem]
        self.threshold = {g: self.threshold_opt or scaled_threshold(cap[g]) for g in self.harvesters}
        space = ctx.block_addr
        self.blocks = {int(a) >> BLOCK_SHIFT: i for i, a in enumerate(space.tolist())} if space is not None else None
        for g in self.harvesters:
            self.resident[g] = {}
        if not self.has("h"):
            return  # host only: the stock driver does the rest
        if ctx.harvest is None:
            raise UmctlError(f"{self.name} needs the HUVM driver (harvested memory); this target has the stock one")
        calib = ctx.options.get("calibration")
        stock = calib.d2h_Bps if calib is not None else 13e9
        large = calib.pinned_copy_Bps if calib is not None else 54.9e9
        wb = large if self.has("lp") else stock
        for i, g in enumerate(self.harvesters):
            via = self.lenders[i % len(self.lenders)] if self.has("plf") else -1
            ctx.harvest(g, spill_to=tuple(self.lenders), fetch_via=via, writeback_Bps=wb)
        ratio = {int(t["gpu"]): float(t.get("ratio", 0.0)) for t in (ctx.workload.meta or {}).get("tenants", [])} \
            if ctx.workload is not None else {}
        for h in self.lenders:
            # lend only what the neighbour's own job leaves free (its footprint is `ratio` of
            # its GPU), as the paper's lenders, whose memory is allocated already; without it
            # a lender reclaims on its own first touches (-O harvest.lend_limit=false)
            lend = int((1.0 - ratio[h]) * cap[h]) if self.lend_limit and h in ratio else -1
            ctx.harvest(h, writeback_Bps=wb, lend_chunks=lend)

    # ------------------------------------------------------------------ events
    def on_events(self, batch: EventBatch) -> np.ndarray | None:
        if Kind.EVICTION in batch:
            ev = batch[Kind.EVICTION]
            for g, a in zip(ev["gpu"].tolist(), ev["addr"].tolist()):
                r = self.resident.get(g)
                if r is not None:
                    r.pop(a >> BLOCK_SHIFT, None)
        out: list[np.ndarray] = []
        f = batch[Kind.FAULT]
        now = batch.now_ns
        for g in self.harvesters:
            fg = f[f["gpu"] == g] if len(f) else f
            if len(fg):
                self.last_fault[g] = int(fg["t_ns"][-1])
                blocks = fg["addr"].astype(np.int64) >> BLOCK_SHIFT
                r = self.resident[g]
                for b in blocks.tolist():
                    r.pop(b, None)
                    r[b] = None
                self._direction(g, blocks)
                if self.has("lpf") or self.has("mpf"):
                    out += self._prefetch(g, now)
            if self.has("pe"):
                out += self._preevict(g, set(blocks.tolist()) if len(fg) else set())
        return np.concatenate(out) if out else None

    def _direction(self, g: int, blocks: np.ndarray) -> None:
        """Direction of the fault stream: the sign of the net block movement in this drain
        (the next-line/stride prefetcher's trigger, §5.3)."""
        prev = self.last_block.get(g)
        first = int(blocks[0]) if prev is None else prev
        last = int(blocks[-1])
        d = last - first
        if d:
            self.direction[g] = 1 if d > 0 else -1
        self.last_block[g] = last

    # ------------------------------------------------------------------ pre-eviction
    def _target(self) -> int:
        """Next lending GPU with spare memory, round robin (§4.2.3); CPU when none lends."""
        k = len(self.lenders)
        for i in range(k):
            h = self.lenders[(self.rr + i) % k]
            if self.ctx.spare_memory(h) > 0:
                self.rr = (self.rr + i + 1) % k
                return h
        return CPU

    def _preevict(self, g: int, keep: set[int]) -> list[np.ndarray]:
        free = self.ctx.free_memory(g) // BLOCK_SIZE if self.ctx.free_memory else 0
        need = self.threshold[g] - free
        if need <= 0:
            return []
        r = self.resident[g]
        victims = []
        for b in r:
            if b not in keep:
                victims.append(b)
                if len(victims) == need:
                    break
        out = []
        for b in victims:
            del r[b]
            dst = self._target() if self.lenders else CPU
            self.n["preevict_host" if dst == CPU else "preevict_spare"] += 1
            out.append(commands(Op.PREEVICT, b << BLOCK_SHIFT, BLOCK_SIZE, dst=dst))
        return out

    # ------------------------------------------------------------------ prefetch
    def _active_harvesters(self, now: int) -> int:
        return sum(1 for g in self.harvesters if now - self.last_fault.get(g, -self.window - 1) <= self.window)

    def _where(self, b: int) -> int:
        """Lending GPU holding block b (global 2 MiB index) in its spare memory, else CPU."""
        if self.ctx.residency is None or self.blocks is None:
            return CPU
        i = self.blocks[b]
        for h in self.lenders:
            if self.ctx.residency(h)[0][i]:
                return h
        return CPU

    def _prefetch(self, g: int, now: int) -> list[np.ndarray]:
        """Next-line/stride prefetch of ``depth`` chunks ahead of the last fault."""
        d = self.direction.get(g)
        if d is None or self.depth == 0:
            return []
        last = self.last_block[g]
        cand = [last + d * self.stride * k for k in range(1, self.depth + 1)]
        cand = [b for b in cand if self.blocks is None or b in self.blocks]
        hold = self.ctx.residency(g)[1] if self.ctx.residency is not None and self.blocks is not None else None
        if hold is not None:
            cand = [b for b in cand if not hold[self.blocks[b]]]
        if not cand:
            return []
        local, stage = [], []
        # MPF sends host chunks to spare memory unless the lenders' PCIe lanes are crowded
        to_spare = self.has("mpf") and self._active_harvesters(now) <= len(self.lenders)
        if self.has("mpf") and not to_spare:
            self.n["local_policy"] += 1
        for b in cand:
            if self.has("mpf") and self._where(b) != CPU:
                local.append(b)                     # spare -> local over NVLink
                self.n["prefetch_spare"] += 1
            elif to_spare:
                stage.append(b)                     # host -> spare over the lender's lane
            else:
                local.append(b)                     # host -> local
                self.n["prefetch_local"] += 1
        out = []
        r = self.resident[g]
        if local:
            for b in local:
                r.pop(b, None)
                r[b] = None
            out.append(commands(Op.PREFETCH, np.array(local, np.int64) << BLOCK_SHIFT, BLOCK_SIZE, dst=g))
        for b in stage:
            h = self._target()
            if h == CPU:
                break
            self.n["stage_spare"] += 1
            out.append(commands(Op.STAGE, b << BLOCK_SHIFT, BLOCK_SIZE, dst=h))
        return out

    def stats(self) -> dict:
        return {"harvesters": self.harvesters, "lenders": self.lenders, **self.n}


@register
class HarvestH(_Base):
    name = "harvest-h"
    features = frozenset({"h"})


@register
class HarvestPE(_Base):
    name = "harvest-pe"
    features = frozenset({"h", "pe"})


@register
class HarvestLP(_Base):
    name = "harvest-lp"
    features = frozenset({"h", "pe", "lp"})


@register
class HarvestPLF(_Base):
    name = "harvest-plf"
    features = frozenset({"h", "pe", "lp", "plf"})


@register
class HarvestLPF(_Base):
    name = "harvest-lpf"
    features = frozenset({"h", "pe", "lp", "plf", "lpf"})


@register
class Harvest(_Base):
    name = "harvest"
    features = frozenset({"h", "pe", "lp", "plf", "mpf"})


@register
class PreEfHost(_Base):
    """Pre-eviction and prefetch to and from the host only, on the stock driver (§6.1)."""

    name = "pre-ef-host"
    features = frozenset({"pe", "lpf"})
    live_as = None   # no neighbour's memory to spill to: nothing of it runs on the stock driver
    needs_spare_gpus = False
