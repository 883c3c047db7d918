"""The one control loop: events -> controller -> COMMAND records -> actuator -> RESULT records.

A live session and a replay drive the same :class:`ControlLoop`; they differ only in what they
plug into it. Live, the source is the driver's event stream and the actuator carries commands
out on the target's memory (``umctl/actuators/``); in a replay the simulator is both: it hands
over its events every ``--drain-us`` and, as the actuator, applies the commands to its model of
the driver and answers with RESULT records (``umctl/sim/engine.py``). So what the loop owns --
which events the controller hears (its subscriptions, plus the budget keeper's evictions), the
residency estimate, the soft budget and its check, and the COMMAND/RESULT bookkeeping -- is
written once, and a replay under ``--budget`` evicts by the very rule a live ``--budget`` does
(``tests/test_loop_equivalence.py`` holds the two paths to the same commands).

Nothing here knows whether it runs live or in a replay: the caller builds the controller's
:class:`~umctl.controller.base.ControllerContext` (using :meth:`ControlLoop.controlled_memory`
and :attr:`ControlLoop.free_memory`) and attaches the controller itself.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np

from ..controller.base import Controller
from ..events.schema import EventBatch, Kind, Op, Status
from ..units import BLOCK_SHIFT, BLOCK_SIZE
from .budget_check import BudgetCheck
from .residency import Budget, Residency, keeper_evictions


@runtime_checkable
class Actuator(Protocol):
    """Carries out COMMAND records on the target, asynchronously.

    ``submit`` never waits for a command to run and returns one cmd_id per command; each
    outcome comes back later as a RESULT record (status, bytes, latency) from ``results``.
    ``close(drain=True)`` waits up to ``timeout`` for work in flight and leaves the target as it
    was (advice undone). :class:`umctl.actuators.base.ActuatorBase` holds the id and result
    bookkeeping of the live actuators; the simulator is the replay's actuator."""

    def submit(self, cmds: np.ndarray) -> np.ndarray: ...

    def results(self) -> np.ndarray: ...

    def pending(self) -> int: ...

    def stats(self) -> dict: ...

    def close(self, drain: bool = False, timeout: float = 5.0) -> None: ...


class StepObserver(Protocol):
    """Hears each step's output and the loop's end (live: the exporter's state file, through
    ``umctl/live/observers.py``); the loop does not know who."""

    def record(self, ctl: Any, out: EventBatch) -> None: ...

    def close(self) -> None: ...


#: What the residency estimate and the budget check read from the event stream, beyond the
#: controller's subscriptions: a replay under a budget has its simulator emit these.
ESTIMATE_KINDS = frozenset({Kind.FAULT, Kind.MIGRATION, Kind.EVICTION, Kind.ALLOC})


class ControlLoop:
    """One controller driving one target through an actuator, under an optional soft budget.

    ``step(batch)`` is called with every batch of events (a live drain, a replay's delivery); it
    hands the controller the kinds it subscribes to, issues its commands and the budget keeper's
    through the actuator, and returns the COMMAND and RESULT records to write next to the
    events that caused them. ``finish()`` ends the loop; ``stats()`` is its summary.

    ``budget_bytes``: the soft budget on each budgeted GPU (GPU 0 alone when ``spare_gpus``
    lend their memory: overflow goes there, else to the host); ``admission``: hold it by
    admission instead of evicting after the fact (:mod:`umctl.loop.residency`, *Admission*).
    ``estimate``: keep the residency estimate without a budget (live does, for its summary; a
    replay without a budget has the simulator's exact residency and skips the cost)."""

    def __init__(self, controller: Controller, actuator: Actuator, *, n_gpus: int, pid: int = 0,
                 budget_bytes: int | None = None, spare_gpus: int = 0, budget_sweep_ms: float = 0.0,
                 admission: bool = False, migrations_on: bool | None = None, estimate: bool = True,
                 observer: StepObserver | None = None, result_arrivals: bool = True):
        self.ctl = controller
        self.act = actuator
        self.pid = pid
        n = max(1, n_gpus)
        self.target_gpus = [0] if spare_gpus else list(range(n))
        # Spare GPUs need not be known yet: a program registers its GPUs with UVM as it creates
        # contexts, and the actuator looks their UUIDs up when it first moves data there (a
        # GPU the target never registers shows as a counted failure, never a crash).
        spare = list(range(1, 1 + spare_gpus))
        self.res: Residency | None = Residency(n) if (estimate or budget_bytes) else None
        self.budget = (Budget(budget_bytes, self.res, dst=spare or None, sweep_ms=budget_sweep_ms)
                       if budget_bytes and self.res is not None else None)
        if self.budget is not None:
            self.budget.admission = bool(admission)
        #: the budget's independent check: true residency from the driver's events
        self._dump_steps = 0
        self.check = (BudgetCheck(self.budget.nbytes, self.target_gpus, migrations_on=migrations_on,
                                  result_arrivals=result_arrivals)
                      if self.budget is not None else None)
        #: the event kinds the loop needs delivered: the controller's, and under an estimate
        #: what the estimate and the check read
        self.kinds = frozenset(controller.subscribes) | (ESTIMATE_KINDS if self.res is not None else frozenset())
        #: cmd_id -> (op, first block, dst, when issued, whether the command is what put the block
        #: in the estimate: a PREFETCH that fails is taken back only then)
        self._issued: dict[int, tuple[int, int, int, int, bool]] = {}
        self._fresh: set[tuple[int, int]] = set()   # (dst, block) this step's prefetches added
        self._evictions: np.ndarray | None = None
        self.commands = 0
        self.t_controller_ns = 0
        #: who else hears each step (the exporter's state file when one runs)
        self.publisher = observer

    # ------------------------------------------------------------------ the controller's view
    def controlled_memory(self, mem: list[int]) -> list[int]:
        """The GPU memory the controller is told of, per GPU: the budget on a budgeted GPU."""
        if self.budget is None:
            return list(mem)
        return [self.budget.nbytes if i in self.target_gpus else m for i, m in enumerate(mem)]

    @property
    def free_memory(self) -> Callable[[int], int] | None:
        """``free_memory(gpu)`` under the budget (what is left of it), None without one."""
        return self.budget.free_memory if self.budget is not None else None

    def _view(self, batch: EventBatch) -> EventBatch:
        """The kinds the controller subscribes to, plus the budget keeper's evictions as the
        EVICTION events a replay's driver would report (DeepUM forgets those blocks were
        resident). The batch itself where it holds nothing else (a replay emits only those)."""
        sub = self.ctl.subscribes
        kept, self._evictions = self._evictions, None
        if kept is None and batch.arrays.keys() <= sub:
            return batch
        view = EventBatch(now_ns=batch.now_ns, arrays={k: a for k, a in batch.arrays.items() if k in sub},
                          names=batch.names)
        if kept is not None and Kind.EVICTION in sub:
            view.add(Kind.EVICTION, kept)
        return view

    # ------------------------------------------------------------------ one step
    def step(self, batch: EventBatch) -> EventBatch:
        t0 = time.perf_counter_ns()
        now = batch.now_ns
        if self.check is not None:
            self.check.observe(batch)
        if self.res is not None:
            freed = self.res.observe(batch)
            if freed and self.budget is not None:
                self.budget.forget(freed)
        view = self._view(batch)
        sub = self.ctl.subscribes
        cmds = self.ctl.on_events(view) if any(k in view for k in sub) else None
        parts = []
        budget = self.budget
        room_ev = None
        if budget is not None and budget.admission:
            for g, blocks in self.res.demand.items():
                if g in self.target_gpus:
                    budget.want(g, blocks, now)
            cmds, demand, room_ev = budget.admit(cmds, self.target_gpus, now, order=self.ctl.eviction_order)
            if demand is not None:
                self._account(demand, now)
                parts.append(demand)
        if cmds is not None and len(cmds):
            if self.res is not None:
                self._account(cmds, now)
            parts.append(cmds)
        if room_ev is not None:
            room_ev = self.ctl.eviction_commands(room_ev)
            parts.append(room_ev)
            self._evictions = keeper_evictions(room_ev, self.pid)
        if budget is not None:
            ev = budget.enforce(self.target_gpus, now, order=self.ctl.eviction_order)
            if ev is not None:
                ev = self.ctl.eviction_commands(ev)
                parts.append(ev)
                kept = keeper_evictions(ev, self.pid)
                self._evictions = kept if self._evictions is None else np.concatenate([self._evictions, kept])
            sw = budget.sweep(self.target_gpus, now)
            if sw is not None:
                parts.append(sw)
        out = EventBatch(now_ns=now, names=batch.names)
        if parts:
            self._issue(np.concatenate(parts), now, out)
        self._fresh = set()
        self._results(out)
        if self.check is not None:
            self.check.observe(out)   # umctl's own prefetches that landed (budget_check.py)
            if self.check.dumping and self.res is not None:
                self._dump_steps += 1
                if self._dump_steps % 25 == 1:   # what the keeper counts, beside the check's input
                    for g in self.target_gpus:
                        self.check.note(("keeper", g, now, sorted(self.res.blocks[g])))
        if self.publisher is not None:
            self.publisher.record(self, out)
        self.t_controller_ns += time.perf_counter_ns() - t0
        return out

    def _issue(self, cmds: np.ndarray, now: int, out: EventBatch) -> None:
        """Stamp the commands, hand them to the actuator and remember what each one is."""
        cmds["pid"] = self.pid
        cmds["t_ns"] = now
        ids = self.act.submit(cmds)
        cmds["cmd_id"] = ids
        if self.res is not None:
            fresh, pending, issued = self._fresh, self.res.pending_in, self._issued
            for op, a, d, i in zip(cmds["op"].tolist(), cmds["addr"].tolist(), cmds["dst"].tolist(), ids.tolist()):
                b = a >> BLOCK_SHIFT
                issued[i] = (op, b, d, now, (d, b) in fresh)
                if op == Op.PREFETCH and d >= 0:
                    pending[(d, b)] = pending.get((d, b), 0) + 1
        self.commands += len(cmds)
        out.add(Kind.COMMAND, cmds)

    def _account(self, cmds: np.ndarray, now: int) -> None:
        """The loop's own commands change residency as soon as they are issued
        (optimistically; a failed prefetch is taken back when its result arrives)."""
        res, budget = self.res, self.budget
        for op, dst in {(int(o), int(d)) for o, d in zip(cmds["op"], cmds["dst"])}:
            sel = (cmds["op"] == op) & (cmds["dst"] == dst)
            blocks = (cmds["addr"][sel] >> np.uint64(BLOCK_SHIFT)).astype(np.int64).tolist()
            if op == Op.PREFETCH and dst >= 0:
                self._fresh.update((dst, b) for b in res.arrive(dst, blocks, now))
            elif op == Op.PREEVICT:
                for g in range(len(res.blocks)):
                    if g != dst:
                        left = res.leave(g, blocks, now)
                        if budget is not None and g in self.target_gpus:
                            budget.sent_away(g, blocks, now)
                            budget.evicting_now(g, left, now)
                if dst >= 0:
                    res.arrive(dst, blocks, now)
            elif op == Op.INVALIDATE:
                whole = [b for b, n in zip(blocks, cmds["bytes"][sel].tolist()) if n >= BLOCK_SIZE]
                res.leave_all(whole, now)
                if budget is not None:
                    budget.forget(whole)   # discarded: nothing left to move

    def _results(self, out: EventBatch) -> None:
        r = self.act.results()
        if len(r) == 0:
            return
        out.add(Kind.RESULT, r)
        if self.res is None:
            return
        pending = self.res.pending_in
        for cid, st in zip(r["cmd_id"].tolist(), r["status"].tolist()):
            op, b, dst, t, fresh = self._issued.pop(cid, (None, 0, 0, 0, False))
            if op == Op.PREFETCH and dst >= 0:
                n = pending.get((dst, b), 0) - 1
                if n > 0:
                    pending[(dst, b)] = n
                else:
                    pending.pop((dst, b), None)
            if op == Op.PREFETCH and st in (Status.FAILED, Status.RANGE_INVALID) and dst >= 0:
                # only what the prefetch itself put in the estimate: a block the program faulted
                # in (DeepUM's fault queue completes such blocks) holds GPU memory all the same
                if fresh and not self.res.reported_since(dst, b, t):
                    self.res.leave(dst, [b])
            if op in (Op.PREEVICT, Op.INVALIDATE) and self.budget is not None:
                self.budget.evicted(b)   # a keeper eviction may have become an INVALIDATE
            if op in (Op.PREEVICT, Op.INVALIDATE) and st == Status.FAILED:
                # the block did not leave: count it again where umctl had taken it out (an
                # INVALIDATE's RESULT is its follow-up pre-eviction's, actuators/uvm.py)
                for g, gone in enumerate(self.res.gone_at):
                    if (op == Op.INVALIDATE or g != dst) and gone.get(b, None) is not None and gone[b] <= t:
                        self.res.arrive(g, [b], t)

    # ------------------------------------------------------------------ the end
    def finish(self, out: EventBatch | None = None, timeout: float = 5.0) -> EventBatch:
        """Stop issuing, wait briefly for in-flight commands, undo advice (the actuator's
        close), and return the last RESULT records."""
        out = out if out is not None else EventBatch()
        self.act.close(drain=True, timeout=timeout)
        self._results(out)
        if self.check is not None:
            self.check.observe(out)
            self.check.finish()
        if self.publisher is not None:
            self.publisher.record(self, out)
            self.publisher.close()
        return out

    def stats(self) -> dict:
        """The summary: mode, commands, the actuator's and the controller's figures, the
        estimate per GPU, and under a budget ``budget`` plus :meth:`budget_verdict`'s keys."""
        s = {"mode": self.ctl.name, "commands": self.commands, "actuator": self.act.stats(),
             "controller": self.ctl.stats(), "controller_ms": round(self.t_controller_ns / 1e6, 1),
             "resident_bytes": ([self.res.resident_bytes(g) for g in range(len(self.res.blocks))]
                                if self.res is not None else [])}
        b = self.budget
        if b is not None:
            s["budget"] = {"bytes": b.nbytes, "peak_estimate_bytes": b.peak_bytes,
                           "peak_before_enforcement_bytes": b.peak_before,
                           "overflow_blocks_evicted": b.enforced_blocks, "dst": b.dst,
                           "swept_blocks": b.swept_blocks, "sweep_ms": b.sweep_ns / 1e6,
                           "hold": "admit" if b.admission else "evict"}
            if b.admission:
                s["budget"].update(admitted_blocks=b.admitted_blocks, deferred_prefetches=b.deferred_prefetches,
                                   room_evictions=b.room_evictions, wanted_peak_blocks=b.wanted_peak)
            s.update(self.budget_verdict())
        return s

    def budget_verdict(self) -> dict:
        """``budget_held`` (True / False / None: unverified), the check's verdict and its time
        series (budget_check.py); {} without a budget."""
        if self.check is None or self.budget is None:
            return {}
        v = self.check.verdict(estimate_peak_bytes=self.budget.peak_bytes)
        return {"budget_held": v.held, "budget_check": v.as_dict(),
                "budget_series": {"columns": ["t_s", "resident_block_bytes", "resident_page_bytes"],
                                  "rows": [list(r) for r in self.check.series]}}

