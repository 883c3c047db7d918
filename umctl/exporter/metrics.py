"""What the exporter serves: per-process totals folded from event batches, and the collector
that renders them for Prometheus at scrape time.

Why totals of our own and a custom collector rather than prometheus_client ``Counter``
objects: the agent thread folds a drain into many series at once while the HTTP thread may be
scraping, and a scrape must see one consistent state (one lock around a plain snapshot); the
series of an ended process must disappear after a grace period, which is dropping a dict
entry here; and a sampled counter is an *estimate* whose increments are scaled by the
measured on-time of each interval, which ``Counter.inc`` would accept but cannot document.

Sampling: with ``--sample`` below 1 the source collects in windows (sampling.py). Each
interval's raw counts are scaled by ``elapsed / on-time`` of that interval before they are
added, so every estimated total only ever grows (a counter in Prometheus terms) and its rate
is the windows' rate; the configured ratio and each process's measured on-time ratio are
exported beside them. Drops (ring overflow) are raw counts: they say what the exporter lost,
not what the process did.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np

from ..events.schema import Cause, EventBatch, Kind
from ..units import CPU

#: Migration cause -> the ``cause`` label. ``user`` is an explicit migrate: a umctl command
#: (UVM_MIGRATE from a controller) or the program's own cudaMemPrefetchAsync; the tools API
#: does not tell them apart (the controller's own bytes are umctl_control_migrated_bytes_total).
CAUSE_LABEL: dict[int, str] = {Cause.DEMAND: "fault", Cause.DRIVER_PREFETCH: "prefetch", Cause.EVICTION: "eviction",
                               Cause.USER: "user", Cause.ACCESS_COUNTER: "access_counter", Cause.COPY: "other",
                               Cause.OTHER: "other"}
#: The cause label of bytes known only from the driver's counters (Migration events off).
UNATTRIBUTED = "unattributed"


def _add(d: dict, key, value: float) -> None:
    if value:
        d[key] = d.get(key, 0.0) + value


@dataclass
class ProcessTotals:
    """Estimated totals of one process since the exporter attached to it."""

    pid: int
    comm: str
    uuids: dict[int, str] = field(default_factory=dict)        # gpu -> "GPU-..." (DCGM's UUID label)
    faults: dict[int, float] = field(default_factory=dict)     # per gpu
    batches: dict[int, float] = field(default_factory=dict)
    thrashing: dict[int, float] = field(default_factory=dict)
    evictions: dict[int, float] = field(default_factory=dict)
    cpu_faults: float = 0.0
    bytes: dict[tuple[str, str], float] = field(default_factory=dict)   # (direction, cause)
    dropped: int = 0
    sampled_ratio: float = 1.0
    ended: float | None = None     # monotonic time the process was seen gone
    #: per GPU, the highest fault-batch id counted: batch ids grow per GPU, so a batch whose
    #: faults span two drains is counted once
    _last_batch: dict[int, int] = field(default_factory=dict)
    _counters: dict[str, int] = field(default_factory=dict)

    def fold(self, batch: EventBatch, scale: float = 1.0, *, counters: dict[str, int] | None = None,
             replay_batches: bool = True, migration_events: bool = False) -> None:
        """One drained batch. ``scale`` turns this interval's raw counts into estimates
        (elapsed / on-time; 1 without sampling). ``replay_batches``: count fault batches by
        GpuFaultReplay records (exact when every event is collected, replays included), and
        only by them: a drain that holds a batch's faults but not yet its replay counts it when
        the replay comes, not twice; otherwise by distinct batch ids of the faults seen, since
        a sampling window catches a batch's faults but often not its replay, which the driver
        posts when the batch completes.
        ``migration_events``: bytes by cause come from Migration events; without them, from
        the growth of the driver's byte ``counters`` (cumulative since attach), by direction."""
        f = batch[Kind.FAULT]
        if len(f):
            gpus, n = np.unique(f["gpu"], return_counts=True)
            for g, c in zip(gpus.tolist(), n.tolist()):
                _add(self.faults, g, c * scale)
        if replay_batches:
            if Kind.REPLAY in batch:
                gpus, n = np.unique(batch[Kind.REPLAY]["gpu"], return_counts=True)
                for g, c in zip(gpus.tolist(), n.tolist()):
                    _add(self.batches, g, c * scale)
        elif len(f):
            for g in np.unique(f["gpu"]).tolist():
                ids = np.unique(f["batch_id"][f["gpu"] == g])
                last = self._last_batch.get(g, -1)
                _add(self.batches, g, int((ids > last).sum()) * scale)
                self._last_batch[g] = max(last, int(ids[-1]))
        self.cpu_faults += len(batch[Kind.CPU_FAULT]) * scale
        t = batch[Kind.THRASHING]
        if len(t):
            gpus, n = np.unique(t["gpu"], return_counts=True)
            for g, c in zip(gpus.tolist(), n.tolist()):
                _add(self.thrashing, g, c * scale)
        if Kind.DROPS in batch:
            self.dropped += int(batch[Kind.DROPS]["count"].sum())
        if migration_events:
            m = batch[Kind.MIGRATION]
            if len(m):
                self._fold_migrations(m, scale)
        elif counters:
            for name, direction in (("bytes_htd", "h2d"), ("bytes_dth", "d2h")):
                delta = counters.get(name, 0) - self._counters.get(name, 0)
                if delta > 0:
                    _add(self.bytes, (direction, UNATTRIBUTED), delta * scale)
        if counters:
            self._counters = dict(counters)

    def reset_baselines(self) -> None:
        """A new attachment: its driver counters and batch ids start afresh."""
        self._counters = {}
        self._last_batch = {}

    def _fold_migrations(self, m: np.ndarray, scale: float) -> None:
        src, dst = m["src"].astype(np.int64), m["dst"].astype(np.int64)
        direction = np.where(src == CPU, 0, np.where(dst == CPU, 1, 2))
        key = direction * 256 + m["cause"].astype(np.int64)
        sums = np.bincount(key, weights=m["bytes"].astype(np.float64), minlength=3 * 256)
        for k in np.flatnonzero(sums).tolist():
            d, cause = divmod(k, 256)
            _add(self.bytes, (("h2d", "d2h", "d2d")[d], CAUSE_LABEL.get(cause, "other")), float(sums[k]) * scale)
        ev = m["cause"] == Cause.EVICTION
        if ev.any():
            gpus, n = np.unique(src[ev], return_counts=True)
            for g, c in zip(gpus.tolist(), n.tolist()):
                if g != CPU:
                    _add(self.evictions, g, c * scale)

    def labels(self, gpu: int) -> tuple[str, str, str, str]:
        return (str(self.pid), self.comm, str(gpu), self.uuids.get(gpu, ""))


@dataclass
class ControlTotals:
    """What one controller (``umctl attach/run --mode``) published (control_state.py)."""

    target_pid: int
    umctl_pid: int
    mode: str
    budget_bytes: int = 0
    resident_bytes: int = 0
    sent: dict[tuple[str, str], int] = field(default_factory=dict)        # (op, budget state)
    failed: dict[tuple[str, str], int] = field(default_factory=dict)
    moved: dict[str, int] = field(default_factory=dict)                   # op -> bytes done
    ended: float | None = None


class ExporterState:
    """Everything a scrape renders, behind one lock (the agent writes, the HTTP thread reads)."""

    def __init__(self, *, sample: float, kinds: str, version: str):
        self.lock = threading.Lock()
        self.sample = sample
        self.kinds = kinds
        self.version = version
        self.processes: dict[int, ProcessTotals] = {}
        self.controls: dict[tuple[int, int], ControlTotals] = {}
        self.unattachable = 0
        self.hidden = 0
        self.driver_up = False
        self.attaches = 0
        self.attach_failures: dict[str, int] = {}
        self.errors = 0
        self.dropped_ended = 0        # drops of processes whose series were retired
        self.lag_p50_s = 0.0
        self.lag_p99_s = 0.0
        self.loop_s = 0.0
        self.updated = 0.0            # monotonic time of the last completed agent step

    def retire(self, now: float, grace_s: float) -> None:
        """Forget ended processes and controllers once their grace period is over: their
        last values stay visible for ``grace_s`` so that Prometheus scrapes the final
        increments, then the series end (Prometheus marks them stale)."""
        for pid in [p for p, t in self.processes.items() if t.ended is not None and now - t.ended >= grace_s]:
            self.dropped_ended += self.processes.pop(pid).dropped
        for key in [k for k, c in self.controls.items() if c.ended is not None and now - c.ended >= grace_s]:
            del self.controls[key]


class ExporterCollector:
    """prometheus_client collector over an :class:`ExporterState`."""

    def __init__(self, state: ExporterState, clock=time.monotonic):
        self.state = state
        self.clock = clock

    def describe(self):
        return []   # unchecked collector: the families depend on what is attached

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        st = self.state
        P = ["pid", "comm"]
        G = P + ["gpu", "uuid"]
        fam = {
            "faults": CounterMetricFamily("umctl_gpu_faults", "GPU page faults on managed memory (estimated when sampled).", labels=G),
            "batches": CounterMetricFamily("umctl_gpu_fault_batches", "Fault batches the driver serviced (estimated when sampled).", labels=G),
            "thrashing": CounterMetricFamily("umctl_thrashing_events", "The driver's thrashing detections.", labels=G),
            "evictions": CounterMetricFamily("umctl_evictions", "Eviction migrations out of a GPU (needs --kinds +migrations).", labels=G),
            "cpu": CounterMetricFamily("umctl_cpu_faults", "CPU page faults on managed memory.", labels=P),
            "bytes": CounterMetricFamily("umctl_migrated_bytes", "Bytes migrated, by direction and cause "
                                         "(cause 'unattributed' when Migration events are off: the driver's counters).",
                                         labels=P + ["direction", "cause"]),
            "dropped": CounterMetricFamily("umctl_exporter_dropped_events", "Events the exporter lost to ring overflow.", labels=P),
            "ratio": GaugeMetricFamily("umctl_process_sampled_ratio", "Measured fraction of the time events were collected.", labels=P),
            "up": GaugeMetricFamily("umctl_process_attached", "1 while attached, 0 during the grace period after the process ended.", labels=P),
        }
        C = ["pid", "mode"]
        ctl = {
            "sent": CounterMetricFamily("umctl_control_commands_sent", "Commands a umctl controller sent, by operation and budget state.",
                                        labels=C + ["op", "budget"]),
            "failed": CounterMetricFamily("umctl_control_commands_failed", "Commands that failed in the driver.",
                                          labels=C + ["op", "budget"]),
            "moved": CounterMetricFamily("umctl_control_migrated_bytes", "Bytes umctl's commands moved, by operation.", labels=C + ["op"]),
            "budget": GaugeMetricFamily("umctl_control_budget_bytes", "The controller's soft GPU-memory budget (0: none).", labels=C),
            "resident": GaugeMetricFamily("umctl_control_resident_estimate_bytes", "The controller's estimate of the target's GPU-resident managed memory.", labels=C),
        }
        with st.lock:
            now = self.clock()
            for t in st.processes.values():
                p = [str(t.pid), t.comm]
                for name in ("faults", "batches", "thrashing", "evictions"):
                    for g, v in sorted(getattr(t, name).items()):
                        fam[name].add_metric(list(t.labels(g)), v)
                fam["cpu"].add_metric(p, t.cpu_faults)
                for (d, c), v in sorted(t.bytes.items()):
                    fam["bytes"].add_metric(p + [d, c], v)
                fam["dropped"].add_metric(p, t.dropped)
                fam["ratio"].add_metric(p, t.sampled_ratio)
                fam["up"].add_metric(p, 0.0 if t.ended is not None else 1.0)
            for c in st.controls.values():
                k = [str(c.target_pid), c.mode]
                for (op, b), v in sorted(c.sent.items()):
                    ctl["sent"].add_metric(k + [op, b], v)
                for (op, b), v in sorted(c.failed.items()):
                    ctl["failed"].add_metric(k + [op, b], v)
                for op, v in sorted(c.moved.items()):
                    ctl["moved"].add_metric(k + [op], v)
                ctl["budget"].add_metric(k, c.budget_bytes)
                ctl["resident"].add_metric(k, c.resident_bytes)
            attached = sum(1 for t in st.processes.values() if t.ended is None)
            own = [
                _gauge("umctl_exporter_info", "Build and configuration of the exporter.", 1.0,
                       {"version": st.version, "kinds": st.kinds}),
                _gauge("umctl_exporter_sample_ratio", "Configured fraction of the time events are collected (--sample).", st.sample),
                _gauge("umctl_exporter_driver_up", "1 when /dev/nvidia-uvm-tools exists.", float(st.driver_up)),
                _gauge("umctl_exporter_hidden_processes", "Processes whose fd table this user cannot read (run as root).", st.hidden),
                _counter("umctl_exporter_attaches", "Successful attaches to processes.", st.attaches),
                _counter("umctl_exporter_errors", "Errors the agent survived (see its log).", st.errors),
                _counter("umctl_exporter_retired_dropped_events", "Dropped events of processes whose series have ended.",
                         st.dropped_ended),
                _gauge("umctl_exporter_loop_duration_seconds", "Wall time of the agent's last drain-and-fold step.", st.loop_s),
                _gauge("umctl_exporter_update_age_seconds", "Seconds since the agent last completed a step (staleness).",
                       max(0.0, now - st.updated) if st.updated else -1.0),
            ]
            procs = GaugeMetricFamily("umctl_exporter_processes", "Processes by state.", labels=["state"])
            procs.add_metric(["attached"], attached)
            procs.add_metric(["ended"], len(st.processes) - attached)
            procs.add_metric(["unattachable"], st.unattachable)
            fails = CounterMetricFamily("umctl_exporter_attach_failures", "Failed attaches, by reason.", labels=["reason"])
            for r, v in sorted(st.attach_failures.items()):
                fails.add_metric([r], v)
            lag = GaugeMetricFamily("umctl_exporter_event_lag_seconds", "Event time to the exporter's fold, worst process, "
                                    "since it attached.", labels=["quantile"])
            lag.add_metric(["0.5"], st.lag_p50_s)
            lag.add_metric(["0.99"], st.lag_p99_s)
        yield from fam.values()
        yield from ctl.values()
        yield from own
        yield from (procs, fails, lag)


def _gauge(name: str, doc: str, value: float, labels: dict[str, str] | None = None):
    from prometheus_client.core import GaugeMetricFamily

    g = GaugeMetricFamily(name, doc, labels=list(labels) if labels else None)
    g.add_metric(list(labels.values()) if labels else [], value)
    return g


def _counter(name: str, doc: str, value: float):
    from prometheus_client.core import CounterMetricFamily

    return CounterMetricFamily(name, doc, value=value)
