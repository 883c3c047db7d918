"""The exporter's node agent: a :class:`~umctl.live.fleet.Fleet` of every process using
Unified Memory (discovery, attach with back-off, drain, retire after ``grace_s``: fleet.py says
what it survives and how), each drained batch folded into :class:`~umctl.exporter.metrics.ProcessTotals`.

What the agent adds: its series. An ended process keeps its series for ``grace_s`` so that
Prometheus scrapes the final increments, then they are dropped with the fleet's member, so
memory is bounded by the processes alive plus those ended within the grace period
(tests/test_exporter.py churns 1,000 of them). Refusals are counted by reason
(``umctl_exporter_attach_failures_total``) and logged once per reason; ``umctl_exporter_driver_up``
says whether ``/dev/nvidia-uvm-tools`` is there. Nothing that happens to a target is allowed
out of :meth:`Agent.step`: errors are counted in ``umctl_exporter_errors_total`` and logged,
one line each. The fleet skips umctl's own processes and children sharing an attached
process's va_space (``dedupe``), whose events would be counted twice.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable

from ..events.schema import EventBatch, Kind
from ..driver import abi
from ..driver.process import nvidia_smi_gpus
from ..live.fleet import Fleet, FleetEvents, Member, tools_source
from .control_state import read_published
from .metrics import ControlTotals, ExporterState, ProcessTotals

#: Exporter ring: 2^15 entries (2.4 MB) per process instead of attach's 2^18 (19 MB): a node
#: agent holds one per process. Overflow is never silent (umctl_exporter_dropped_events_total).
RING_ENTRIES = 1 << 15
#: The most events per second one process was measured to produce (docs/evaluation/measurements.md: 1.02-1.12 M/s
#: peaks on the H200), which sets how often a ring must be drained.
PEAK_EVENTS_PER_S = 1.1e6
#: What says the driver is there (the nvidia-uvm module creates it).
TOOLS_PATH = abi.Ioctl.TOOLS_PATH


def drain_ms_for(ring_entries: int) -> float:
    """How often a ring is drained: when 80 % of it would fill at the peak rate (2^15: 24 ms).
    The exporter's CPU goes on its per-process drain threads waking up (docs/guide/exporter.md
    has the measurements), so each ring is
    drained as seldom as it safely can be; a larger --ring-entries buys less CPU with memory.
    Sampling windows then switch at drain ticks: coarser, but the on-time is measured, so the
    estimates stay unbiased and the average duty stays the configured one."""
    return min(100.0, max(2.0, 0.8 * ring_entries / PEAK_EVENTS_PER_S * 1e3))


@dataclass
class _Folding:
    """One attachment's fold: the process's totals (kept across a re-attach within the grace),
    and the sampler's clock and on-time at the previous fold (what each drain is scaled by)."""

    totals: ProcessTotals
    t_prev: float
    on_prev: float


class Agent(FleetEvents[_Folding]):
    """The fleet, its folding and the exporter's own figures; :meth:`step` is one interval's
    work (tests call it directly), :meth:`run` loops it until ``stop`` is set."""

    def __init__(self, state: ExporterState, *, kinds: Iterable[Kind], sample: float = 0.1,
                 interval_s: float = 1.0, grace_s: float = 120.0, ring_entries: int = RING_ENTRIES,
                 drain_ms: float | None = None, state_dir: str | None = None,
                 io_factory: Callable[[], abi.Ioctl] | None = None, proc_root: str | None = None,
                 driver_present: Callable[[], bool] | None = None,
                 same_file: Callable[[int, int, int, int], bool | None] | None = None,
                 log: Callable[[str], None] | None = None, clock: Callable[[], float] = time.monotonic):
        self.state = state
        self.kinds = frozenset(kinds)
        self.sample = float(sample)
        self.interval_s = float(interval_s)
        self.grace_s = float(grace_s)
        self.ring_entries = int(ring_entries)
        self.drain_ms = drain_ms_for(self.ring_entries) if drain_ms is None else float(drain_ms)
        self.state_dir = state_dir
        self.io_factory = io_factory
        self.proc_root = proc_root
        self.driver_present = driver_present or (lambda: os.path.exists(TOOLS_PATH))
        self.log = log or _stderr_log
        self.clock = clock
        self.fleet: Fleet[_Folding] = Fleet(self._open, self, grace_s=self.grace_s, dedupe=True,
                                            proc_root=proc_root, same_file=same_file, clock=clock)
        self._smi: list[dict] | None = None
        self._smi_t = -1e9
        self._migrations = Kind.MIGRATION in self.kinds
        #: fault batches counted by their replay records: every event collected, replays among them
        self._replays = self.sample >= 1 and Kind.REPLAY in self.kinds

    # -- one interval ---------------------------------------------------------------------
    def step(self) -> None:
        t0 = time.perf_counter()
        now = self.clock()
        up = self._guard("driver check", self.driver_present, False)
        self.fleet.step()
        if self.state_dir:
            self._guard("control state", self._controls, None, now)
        lags = [m.source.lag_delivery for m in self.fleet.attached().values()]
        p50 = max((h.percentile(50) or 0.0 for h in lags), default=0.0)
        p99 = max((h.percentile(99) or 0.0 for h in lags), default=0.0)
        with self.state.lock:
            self.state.driver_up = bool(up)
            self.state.hidden = self.fleet.hidden
            self.state.unattachable = len(self.fleet.waiting())
            self.state.lag_p50_s, self.state.lag_p99_s = p50 / 1e9, p99 / 1e9
            self.state.retire(now, self.grace_s)
            self.state.loop_s = time.perf_counter() - t0
            self.state.updated = self.clock()

    def _guard(self, what: str, fn, default, *args):
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001 - nothing about one target may stop the agent
            self._count_error(what, e)
            return default

    def _count_error(self, what: str, e: Exception) -> None:
        with self.state.lock:
            self.state.errors += 1
        self.log(f"{what}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")

    def _gpus(self) -> list[dict]:
        if self.clock() - self._smi_t > 60.0:   # nvidia-smi costs ~100 ms: not once per attach
            self._smi, self._smi_t = nvidia_smi_gpus(), self.clock()
        return self._smi or []

    def _open(self, pid: int):
        return tools_source(pid, self.kinds, self.sample, ring_entries=self.ring_entries, drain_ms=self.drain_ms,
                            io=self.io_factory() if self.io_factory else None, proc_root=self.proc_root,
                            smi=self._gpus())

    # -- what the fleet reports -----------------------------------------------------------
    def on_attach(self, m: Member[_Folding]) -> None:
        src = m.source
        on, t = (src.sampler.on_time(), src.sampler.clock()) if src.sampler is not None else (0.0, 0.0)
        with self.state.lock:
            totals = self.state.processes.get(m.pid)
            if totals is None or totals.comm != m.comm:
                totals = self.state.processes[m.pid] = ProcessTotals(m.pid, m.comm)
            # else: attached again within the grace (after a source error): its counters go on
            totals.ended = None
            totals.uuids = {int(g["gpu"]): str(g["uuid"]) for g in src.gpus}
            totals.reset_baselines()
            self.state.attaches += 1
        m.data = _Folding(totals, t, on)
        self.log(f"pid {m.pid} ({m.comm}): attached")

    def on_refuse(self, m: Member[_Folding], error: Exception, first: bool) -> None:
        with self.state.lock:
            self.state.attach_failures[m.reason] = self.state.attach_failures.get(m.reason, 0) + 1
        if first and m.gone is None:
            self.log(f"pid {m.pid} ({m.comm}): not attached: {error}")

    def on_batch(self, m: Member[_Folding], batch: EventBatch) -> None:
        src, f = m.source, m.data
        scale = 1.0
        if src.sampler is not None:   # elapsed over on-time, both on the sampler's clock
            on, now = src.sampler.on_time(), src.sampler.clock()
            d_on, d_t = on - f.on_prev, now - f.t_prev
            scale = d_t / d_on if d_on > 0 else 1.0 / self.sample
            f.on_prev, f.t_prev = on, now
        counters = src.counters()
        uuids = None
        if src.gpus and len(src.gpus) != len(f.totals.uuids):
            uuids = {int(g["gpu"]): str(g["uuid"]) for g in src.gpus}
        with self.state.lock:
            if uuids is not None:
                f.totals.uuids = uuids
            f.totals.fold(batch, scale, counters=counters, replay_batches=self._replays,
                          migration_events=self._migrations)
            f.totals.sampled_ratio = src.sample_fraction()

    def on_detach(self, m: Member[_Folding]) -> None:
        if m.data is None:
            return
        with self.state.lock:
            if m.data.totals.ended is None:
                m.data.totals.ended = self.clock()
        self.log(f"pid {m.pid} ({m.comm}): ended")

    def on_retire(self, m: Member[_Folding]) -> None:
        """The grace is over: the process's series end (Prometheus marks them stale)."""
        with self.state.lock:
            if m.data is not None and self.state.processes.get(m.pid) is m.data.totals:
                self.state.dropped_ended += self.state.processes.pop(m.pid).dropped

    def on_warning(self, text: str) -> None:
        self.log(text)

    def on_error(self, pid: int | None, error: Exception) -> None:
        self._count_error("scan" if pid is None else f"pid {pid}", error)

    def _controls(self, now: float) -> None:
        pubs = read_published(self.state_dir, self.proc_root or "/proc")
        with self.state.lock:
            seen = set()
            for p in pubs:
                key = (p.target_pid, p.umctl_pid)
                seen.add(key)
                c = self.state.controls.get(key)
                if c is None:
                    c = self.state.controls[key] = ControlTotals(p.target_pid, p.umctl_pid, p.mode)
                c.budget_bytes, c.resident_bytes = p.budget_bytes, p.resident_bytes
                c.sent, c.failed, c.moved, c.ended = p.sent, p.failed, p.moved, None
            for key, c in self.state.controls.items():
                if key not in seen and c.ended is None:
                    c.ended = now

    # -- the loop -------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Step every ``interval_s`` until ``stop``; then detach from everything."""
        try:
            while not stop.is_set():
                t = self.clock()
                self.step()
                stop.wait(max(0.0, self.interval_s - (self.clock() - t)))
        finally:
            self.close()

    def close(self) -> None:
        self.fleet.close()


def _stderr_log(msg: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} umctl exporter: {msg}", file=sys.stderr, flush=True)
