"""The residency estimate and the soft GPU-memory budget of a control loop
(:class:`~umctl.loop.control.ControlLoop`), live and in a replay alike.

The driver knows residency exactly; umctl sees only what the driver's events report, so
:class:`Residency` keeps an estimate per 2 MiB block from the fault stream and from the commands
the loop issued itself, and :class:`Budget` turns that estimate into a *soft* GPU-memory budget:
the controller sees ``free_memory = budget - resident`` and pre-evicts to stay inside it, and
when the controller lets residency overflow anyway the budget keeper evicts the least recently
migrated blocks itself — exactly what the driver does on the fault path when a GPU is really
full, which is the "naive UM" baseline (``--mode none --budget``). That is how oversubscription
policies run on a real GPU without ever asking the driver for more memory than the card has
(docs/evaluation/measurements.md).

Why block granularity is right for the estimate: the driver backs and evicts managed memory
in 2 MiB root chunks, so a block with any page on the GPU holds a whole chunk there.

The estimate is what the keeper acts on, and it is optimistic about umctl's own evictions (a
block leaves it when the eviction is queued); whether the budget was *held* is judged apart from
it, from the driver's own events, by :class:`~umctl.loop.budget_check.BudgetCheck`, which every
budgeted session runs (the budget turns migration events on for it).

**Admission** (``umctl run --runtime``, the default there: ``--budget-hold admit``). Evicting
after the fact cannot hold a budget against a program that faults faster than umctl can evict:
the GPU has room, so the driver serves every fault at once. Under the runtime, every managed
allocation prefers the host (``UMCTL_RT_PREFER_HOST``): the driver then serves a GPU fault by
mapping the host page remotely, so faults bring nothing in and umctl's own migrations are what
fills the GPU (what the driver still moves on its own -- copies into managed memory, for one --
reaches the estimate from its migration records and is evicted after the fact, and the budget
check counts it, so a program that does much of it can still be judged NOT held). The
keeper turns faults into *demand* (the blocks the program wants), and every PREFETCH onto a
budgeted GPU -- demand first, then the controller's -- is admitted only while the blocks already
there, plus the blocks whose eviction is still being copied out, leave room. What does not fit
waits (demand) or is dropped (a controller's prediction), and the keeper evicts to make room.
So the budget holds by construction. The price, and why it is not a smaller GPU: until a block
is admitted, the program reads it over the link, and re-touching an evicted block costs a
remote-mapping fault per page (measured: 2.7 s per 2 GiB, against 0.27 s for migrating
faults; ``benchmarks/gpu/prefer_host_probe.py``).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from .. import UmctlError
from ..events.schema import AllocOp, EventBatch, Kind, Op, commands, empty
from ..units import BLOCK_SHIFT, BLOCK_SIZE, CPU, ranges
from .budget_check import RangeSet


#: Command priority of the budget's sweep (below the budget keeper's 0 and the controller's 1);
#: `umctl trace control` tells the sweep's evictions apart by it
SWEEP_PRIORITY = 2


def keeper_evictions(cmds: np.ndarray, pid: int = 0) -> np.ndarray:
    """The budget keeper's PREEVICT commands as the EVICTION events a controller hears of
    (stamped with the commands' time): the driver's evictions of a replay, live."""
    e = empty(Kind.EVICTION, len(cmds))
    e["t_ns"], e["addr"], e["pid"] = cmds["t_ns"], cmds["addr"], pid
    e["pages"], e["bytes_written"] = cmds["bytes"] // 4096, cmds["bytes"]
    return e


def _faulted_blocks(f: np.ndarray):
    """Per GPU (the CPU's records left out): (gpu, its faulted 2 MiB blocks in first-fault
    order, the earliest fault's time)."""
    for g in np.unique(f["gpu"]).tolist() if len(f) else []:
        if g < 0:
            continue
        sel = f[f["gpu"] == g]
        blocks, first = np.unique((sel["addr"] >> np.uint64(BLOCK_SHIFT)).astype(np.int64), return_index=True)
        yield g, blocks[np.argsort(first)].tolist(), int(sel["t_ns"][first].min())


class Residency:
    """Which 2 MiB blocks of the target hold GPU memory, per GPU, oldest arrival first."""

    def __init__(self, n_gpus: int):
        self.blocks: list[OrderedDict[int, int]] = [OrderedDict() for _ in range(max(1, n_gpus))]
        #: per GPU: block -> when umctl took it out of the estimate (its eviction was queued)
        self.gone_at: list[dict[int, int]] = [{} for _ in self.blocks]
        #: per GPU: block -> when the driver last reported it arriving (a fault or a migration)
        self.reported_at: list[dict[int, int]] = [{} for _ in self.blocks]
        #: ranges the runtime made host-preferred: a GPU fault there maps the host page and
        #: brings nothing in (module doc, *Admission*)
        self.host_preferred = RangeSet()
        #: per GPU: blocks the program faulted on in host-preferred ranges while not resident,
        #: first fault first, since the last :meth:`observe` (what admission serves)
        self.demand: dict[int, list[int]] = {}
        #: (GPU, block) -> umctl's prefetches of it with no RESULT yet (kept by the ControlLoop): a
        #: departure reported meanwhile is an older eviction's, which that prefetch undoes
        self.pending_in: dict[tuple[int, int], int] = {}

    def _gpu(self, g: int) -> OrderedDict[int, int]:
        while g >= len(self.blocks):
            self.blocks.append(OrderedDict())
            self.gone_at.append({})
            self.reported_at.append({})
        return self.blocks[g]

    def arrive(self, g: int, blocks, t: int) -> list[int]:
        """Blocks now hold a chunk on GPU g (kept at their first arrival time: the driver's
        eviction order is by migration into the GPU, not by use). Returns those that were not
        counted before."""
        d = self._gpu(g)
        gone = self.gone_at[g]
        new = []
        for b in blocks:
            if b not in d:
                d[b] = t
                gone.pop(b, None)
                new.append(b)
        return new

    def leave(self, g: int, blocks, t: int | None = None) -> list[int]:
        """Blocks no longer count on GPU g; ``t``: umctl sent them away then (its eviction was
        queued), so a migration into g that began before ``t`` is not news (below). Returns
        those that did count."""
        d = self._gpu(g)
        gone = self.gone_at[g]
        out = []
        for b in blocks:
            if d.pop(b, None) is not None:
                out.append(b)
                if t is not None:
                    gone[b] = t
        return out

    def leave_all(self, blocks, t: int | None = None) -> None:
        """:meth:`leave` on every GPU."""
        for g in range(len(self.blocks)):
            self.leave(g, blocks, t)

    def reported_since(self, g: int, block: int, t: int) -> bool:
        """Whether the driver reported ``block`` arriving on GPU g (a fault or a migration) at
        ``t`` or later."""
        self._gpu(g)
        return self.reported_at[g].get(block, -1) >= t

    def _reported(self, g: int, blocks, t: int) -> list[int]:
        """The driver reported ``blocks`` arriving on g at ``t``: all but those umctl sent away
        after ``t`` (a late record of an arrival that the queued eviction undoes)."""
        self._gpu(g)
        gone, rep = self.gone_at[g], self.reported_at[g]
        out = []
        for b in blocks:
            if gone.get(b, -1) > t:
                continue
            rep[b] = max(rep.get(b, t), t)
            out.append(b)
        return out

    def observe(self, batch: EventBatch) -> list[int]:
        """Fold what the driver reported: GPU faults bring their blocks in; migrations (on
        whenever a budget is set) bring blocks in too -- the density prefetcher's, umctl's own
        prefetches as they land, and anything that came back without a fault -- and move whole
        blocks out; freed ranges leave every GPU (returned). Migration records come late (the
        driver defers them), so an arrival that began before umctl queued the block's eviction
        is dropped: the eviction, executed after it, undoes it."""
        a = batch[Kind.ALLOC]
        if len(a):
            self.host_preferred.observe(a)
        self.demand = {}
        f = batch[Kind.FAULT]
        if len(f) and len(self.host_preferred):
            remote = self.host_preferred.contains(f["addr"].astype(np.int64))
            if remote.any():
                self._demand(f[remote])
                f = f[~remote]
        for g, bl, t in _faulted_blocks(f):
            self._gpu(g)
            rep = self.reported_at[g]
            for b in bl:
                rep[b] = t
            self.arrive(g, bl, t)
        m = batch[Kind.MIGRATION]
        if len(m):
            # one pass per (GPU, block), not per record: a drain holds thousands of page runs
            lo = m["addr"].astype(np.int64)
            b0, b1 = lo >> BLOCK_SHIFT, (lo + np.maximum(m["bytes"].astype(np.int64), 1) - 1) >> BLOCK_SHIFT
            reps = b1 - b0 + 1
            idx = np.repeat(np.arange(len(m)), reps)
            blk = ranges(b0, reps)
            dst, t = m["dst"][idx].astype(np.int64), m["t_ns"][idx]
            last_in: dict[tuple[int, int], int] = {}
            into = dst >= 0
            if into.any():
                key = (blk[into] << 8) | dst[into]
                uk, inv = np.unique(key, return_inverse=True)
                t_in = t[into]
                t_first = np.full(len(uk), np.iinfo(np.int64).max, np.int64)
                t_last = np.full(len(uk), np.iinfo(np.int64).min, np.int64)
                np.minimum.at(t_first, inv.reshape(-1), t_in)
                np.maximum.at(t_last, inv.reshape(-1), t_in)
                for k, t0, t1 in zip(uk.tolist(), t_first.tolist(), t_last.tolist()):
                    g, b = k & 0xFF, k >> 8
                    last_in[(g, b)] = t1
                    if self._reported(g, [b], t1):
                        self.arrive(g, [b], t0)
            whole = np.flatnonzero((m["src"] >= 0) & (m["bytes"] >= BLOCK_SIZE))
            pending = self.pending_in
            for i in whole.tolist():
                g, t_end = int(m["src"][i]), int(max(m["t_end_ns"][i], m["t_ns"][i]))
                b_lo, b_hi = int(b0[i]), int(b1[i])
                rep = self.reported_at[g] if g < len(self.reported_at) else {}
                # not gone: a block that arrived again after this departure, in this batch or an
                # earlier one (records come late), or that umctl is bringing back right now
                self.leave(g, [b for b in range(b_lo, b_hi + 1)
                               if last_in.get((g, b), -1) <= t_end and rep.get(b, -1) <= t_end
                               and not pending.get((g, b))])
        freed: list[int] = []
        if len(a):
            for rec in a[a["op"] == AllocOp.FREE]:
                b0 = int(rec["addr"]) >> BLOCK_SHIFT
                b1 = (int(rec["addr"]) + int(rec["bytes"])) >> BLOCK_SHIFT
                # only blocks wholly inside the freed range: a neighbour may share the rest
                whole = range(b0 + (int(rec["addr"]) % BLOCK_SIZE != 0), b1)
                self.leave_all(whole)
                freed += whole
        return freed

    def _demand(self, f: np.ndarray) -> None:
        """Faults served remotely: their blocks, where not resident, are the program's demand."""
        for g, bl, _ in _faulted_blocks(f):
            here = self._gpu(g)
            self.demand[g] = [b for b in bl if b not in here]

    def resident_bytes(self, g: int) -> int:
        return len(self._gpu(g)) * BLOCK_SIZE

    def oldest(self, g: int, n: int, skip: set[int] | None = None) -> list[int]:
        out = []
        for b in self._gpu(g):
            if skip and b in skip:
                continue
            out.append(b)
            if len(out) == n:
                break
        return out


class Budget:
    """A soft cap on the target's GPU-resident managed memory, per GPU.

    ``dst`` is where overflow goes: the CPU, or (memHarvester) a list of neighbour GPUs used
    round-robin. ``slack`` is how far below the cap one enforcement goes, so that a loop
    hovering at the cap does not issue one 2 MiB eviction per drain."""

    def __init__(self, nbytes: int, residency: Residency, *, dst: list[int] | None = None, slack: float = 0.02,
                 sweep_ms: float = 0.0, sweep_age_ms: float = 100.0):
        if nbytes < BLOCK_SIZE:
            raise UmctlError(f"budget must be at least 2 MiB (got {nbytes} bytes)")
        if sweep_ms < 0:
            raise UmctlError("--budget-sweep must be 0 (off) or more milliseconds")
        self.nbytes = int(nbytes)
        self.res = residency
        self.dst = list(dst) if dst else [CPU]
        self._rr = 0
        #: Blocks umctl sent away from each GPU -> when it last did (see :meth:`sweep`)
        self.away: dict[int, dict[int, int]] = {}
        self.sweep_ns = int(sweep_ms * 1e6)
        self.sweep_age_ns = int(sweep_age_ms * 1e6)
        self._last_sweep = 0
        self.swept_blocks = 0
        self.slack_blocks = max(1, int(self.nbytes * slack) // BLOCK_SIZE)
        self.enforced_blocks = 0
        #: estimated residency at its highest after each enforcement (what the budget holds)
        #: and before it (how far faults and the controller's prefetches overshoot in one
        #: control period; the evictions that undo it are queued ahead of any prefetch)
        self.peak_bytes = 0
        self.peak_before = 0
        #: admission control (module doc, *Admission*): set by the ControlLoop under the runtime
        self.admission = False
        #: per GPU: blocks whose eviction umctl issued and that have no RESULT yet -> when: they
        #: still hold GPU memory, so admission counts them
        self.evicting: dict[int, dict[int, int]] = {}
        #: per GPU: the program's demand not admitted yet (block -> first fault), oldest first
        self.wanted: dict[int, OrderedDict[int, int]] = {}
        self.admitted_blocks = 0        # demand blocks admitted
        self.deferred_prefetches = 0    # controller prefetches dropped for want of room
        self.room_evictions = 0         # blocks evicted to make room for demand
        self.wanted_peak = 0

    #: Round-robin unit over several destinations, in 2 MiB blocks: per block, every command
    #: would be its own 2 MiB ioctl (14,683 ioctls for 14,858 blocks over 3 spare H200s, where
    #: the host-only run coalesced 13,322 blocks into 817).
    SPREAD_RUN = 16

    def _spread(self, victims: list[int], dsts: list[int]) -> tuple[list[int], np.ndarray]:
        """Destinations for the victims: runs of up to SPREAD_RUN address-contiguous blocks
        go round-robin to ``dsts`` so the actuator can still coalesce each run."""
        if len(dsts) == 1:   # ascending, so that the actuator coalesces runs (it extends forwards)
            return sorted(victims), np.full(len(victims), dsts[0], np.int16)
        v = np.sort(np.asarray(victims, np.int64))
        new_run = np.ones(len(v), bool)
        new_run[1:] = np.diff(v) != 1
        start = np.flatnonzero(new_run)[np.cumsum(new_run) - 1]   # each block's run start
        # a piece begins at a run's start and every SPREAD_RUN blocks into it
        piece = np.cumsum(new_run | ((np.arange(len(v)) - start) % self.SPREAD_RUN == 0)) - 1
        dst = np.asarray(dsts, np.int16)[(self._rr + piece) % len(dsts)]
        self._rr += int(piece[-1]) + 1 if len(piece) else 0
        return v.tolist(), dst

    def free_memory(self, g: int) -> int:
        return max(0, self.nbytes - self.res.resident_bytes(g))

    def enforce(self, gpus: list[int], now: int, order=None) -> np.ndarray | None:
        """PREEVICT commands bringing every GPU back under the cap (least recently migrated
        first); the blocks are taken out of the estimate at once so the next drain does not
        evict them again while the migration is under way."""
        out = []
        for g in gpus:
            used = self.res.resident_bytes(g)
            self.peak_before = max(self.peak_before, used)
            if used <= self.nbytes:
                self.peak_bytes = max(self.peak_bytes, used)
                continue
            n = (used - self.nbytes) // BLOCK_SIZE + self.slack_blocks
            if order is None:
                victims = self.res.oldest(g, n)
            else:  # the controller ranks every resident block (DeepUM: unexpected ones first)
                victims = order(g, self.res.oldest(g, len(self.res.blocks[g])))[:n]
            if not victims:
                continue
            self.res.leave(g, victims, now)
            self.sent_away(g, victims, now)
            self.evicting_now(g, victims, now)
            self.peak_bytes = max(self.peak_bytes, self.res.resident_bytes(g))
            self.enforced_blocks += len(victims)
            cmds = self._preevict(g, victims, now, priority=0)
            blocks = (cmds["addr"] >> np.uint64(BLOCK_SHIFT)).astype(np.int64)
            for d in set(cmds["dst"].tolist()):
                if d >= 0:   # a neighbour GPU (memHarvester) now holds them
                    self.res.arrive(d, blocks[cmds["dst"] == d].tolist(), now)
            out.append(cmds)
        return np.concatenate(out) if out else None

    #: an eviction whose RESULT never came (dropped by the actuator's queue) stops counting
    #: against admission after this long
    EVICTING_TTL_NS = 2_000_000_000
    #: blocks of demand admission makes room for per control step (256 MiB: large enough for the
    #: actuator to coalesce runs of blocks into 64 MiB ioctls, small enough that the eviction
    #: queue stays short; demand beyond it waits for the next steps)
    ROOM_STEP_BLOCKS = 128

    def room(self, g: int, now: int) -> int:
        """Blocks that may still be admitted onto GPU g: the cap less what is resident and what
        is still being copied out."""
        ev = self.evicting.setdefault(g, {})
        stale = [b for b, t in ev.items() if now - t > self.EVICTING_TTL_NS]
        for b in stale:
            del ev[b]
        return self.nbytes // BLOCK_SIZE - len(self.res.blocks[g] if g < len(self.res.blocks) else ()) - len(ev)

    def evicting_now(self, g: int, blocks, now: int) -> None:
        if self.admission:
            ev = self.evicting.setdefault(g, {})
            for b in blocks:
                ev[b] = now

    def evicted(self, block: int) -> None:
        """An eviction's RESULT came (whatever its status: a failed one is counted resident
        again by the ControlLoop): the block no longer holds room as 'being copied out'."""
        for ev in self.evicting.values():
            ev.pop(block, None)

    def want(self, g: int, blocks: list[int], now: int) -> None:
        w = self.wanted.setdefault(g, OrderedDict())
        for b in blocks:
            w[b] = now
            w.move_to_end(b)         # demanded again: the most recent use
        cap = self.nbytes // BLOCK_SIZE
        while len(w) > cap:          # older demand than a whole budget's worth is stale
            w.popitem(last=False)
        self.wanted_peak = max(self.wanted_peak, len(w))

    def admit(self, cmds: np.ndarray | None, gpus: list[int], now: int, order=None
              ) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
        """Admission (module doc): returns (the controller's commands with the prefetches that do
        not fit removed, PREFETCH commands admitting demand, PREEVICT commands making room for the
        demand still waiting). The demand prefetches count in the estimate once issued (the
        caller accounts them like the controller's); the room evictions are accounted here.

        Newest demand first: a fault served remotely has already completed, so a block's demand
        says only that the program was using it then; the most recent is the likeliest to be
        used again (and a program's demand from an earlier kernel, served first, would evict the
        current kernel's blocks)."""
        keep = np.ones(len(cmds), bool) if cmds is not None else None
        demand_parts, evict_parts = [], []
        for g in gpus:
            here = self.res._gpu(g)
            room = self.room(g, now)
            w = self.wanted.setdefault(g, OrderedDict())
            admit: list[int] = []
            for b in reversed(list(w)):
                if b in here:
                    del w[b]
                elif room > 0:
                    del w[b]
                    admit.append(b)
                    room -= 1
                else:
                    break
            taken = set(admit)
            if cmds is not None and len(cmds):
                sel = np.flatnonzero((cmds["op"] == Op.PREFETCH) & (cmds["dst"] == g))
                for i, a in zip(sel.tolist(), cmds["addr"][sel].tolist()):
                    b = int(a) >> BLOCK_SHIFT
                    if b in here:
                        continue                 # already there: a no-op, harmless
                    if b in taken:
                        keep[i] = False          # the demand admits it already
                    elif room > 0:
                        taken.add(b)
                        w.pop(b, None)
                        room -= 1
                    else:
                        keep[i] = False
                        self.deferred_prefetches += 1
            if admit:
                self.admitted_blocks += len(admit)
                # ascending: the actuator coalesces a run of blocks into one ioctl only forwards
                demand_parts.append(commands(Op.PREFETCH, np.sort(np.array(admit, np.int64)) << BLOCK_SHIFT, BLOCK_SIZE,
                                             dst=g, priority=0, t_ns=now))
            # room for what still waits, less what the evictions under way will free
            need = min(len(w), self.ROOM_STEP_BLOCKS) - max(0, room) - len(self.evicting.get(g, {}))
            if need > 0:
                cand = self.res.oldest(g, len(here), skip=taken)
                victims = (order(g, cand) if order is not None else cand)[:need]
                if victims:
                    self.res.leave(g, victims, now)
                    self.sent_away(g, victims, now)
                    self.evicting_now(g, victims, now)
                    self.room_evictions += len(victims)
                    self.enforced_blocks += len(victims)
                    evict_parts.append(self._preevict(g, victims, now, priority=0))
        return (cmds[keep] if cmds is not None else None,
                np.concatenate(demand_parts) if demand_parts else None,
                np.concatenate(evict_parts) if evict_parts else None)

    def _preevict(self, g: int, blocks: list[int], now: int, *, priority: int) -> np.ndarray:
        """PREEVICT commands moving ``blocks`` off GPU g to the budget's destinations."""
        victims, dst = self._spread(blocks, [d for d in self.dst if d != g] or [CPU])
        return commands(Op.PREEVICT, np.array(victims, np.int64) << BLOCK_SHIFT, BLOCK_SIZE,
                        dst=dst, priority=priority, t_ns=now)

    def sent_away(self, g: int, blocks, now: int) -> None:
        d = self.away.setdefault(g, {})
        for b in blocks:
            d[b] = now

    def forget(self, blocks) -> None:
        """Freed blocks: nothing to send away, or to admit, any more."""
        for d in [*self.away.values(), *self.wanted.values()]:
            for b in blocks:
                d.pop(b, None)

    def sweep(self, gpus: list[int], now: int) -> np.ndarray | None:
        """Send away again, every ``sweep_ms``, the blocks umctl evicted at least
        ``sweep_age_ms`` ago and has not seen come back.

        Why: the budget holds only if the estimate is right, and the estimate learns of
        arrivals from fault events only; a control loop that falls behind its events would let
        evicted blocks come back unseen, and the budget would silently not be enforced. A block
        moved out again here faults if the program still uses it, which is how umctl learns it
        is there; one already on the host costs the driver a residency check (one ioctl per
        address-contiguous run). Off (0) by default: with a loop that keeps up it re-evicts
        blocks that did come back and are in use. The measurements behind both halves are in
        docs/evaluation/live-control.md ("What the figures depend on")."""
        if not self.sweep_ns or now - self._last_sweep < self.sweep_ns:
            return None
        self._last_sweep = now
        out = []
        for g in gpus:
            d = self.away.get(g)
            if not d:
                continue
            here = self.res.blocks[g] if g < len(self.res.blocks) else {}
            back = [b for b in d if b in here]
            for b in back:
                del d[b]   # umctl knows it came back: the estimate counts it again
            due = sorted(b for b, t in d.items() if now - t >= self.sweep_age_ns)
            if not due:
                continue
            for b in due:
                d[b] = now
            self.swept_blocks += len(due)
            out.append(self._preevict(g, due, now, priority=SWEEP_PRIORITY))
        return np.concatenate(out) if out else None


