"""Per-process live statistics: what ``umctl attach``/``top`` show and what a library user of
:class:`umctl.live.session.Session` reads.

The statistics are kept as running totals plus the totals at the previous refresh, so a rate
is a difference over the refresh interval: no per-event history is kept however long a view
runs. Per-block and per-kernel fault counts are folded in with numpy (np.unique per batch) into
dicts keyed by 2 MiB block / kernel name id, whose size is bounded by the program's footprint
and kernel count, not by the number of events.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..events.schema import Cause, EventBatch, Kind
from ..results import LiveTotals, scaled_estimate
from ..units import BLOCK_SHIFT, CPU

#: Causes shown as columns of bytes moved (the rest are summed into "other").
CAUSE_COLUMNS = (("demand", Cause.DEMAND), ("prefetch", Cause.DRIVER_PREFETCH), ("evict", Cause.EVICTION),
                 ("user", Cause.USER))


@dataclass
class LiveStats:
    """Running totals of one observed process."""

    pid: int
    comm: str = ""
    dropped: int = 0
    launches: int = 0
    h2d: dict[str, int] = field(default_factory=lambda: {n: 0 for n, _ in CAUSE_COLUMNS} | {"other": 0})
    d2h: dict[str, int] = field(default_factory=lambda: {n: 0 for n, _ in CAUSE_COLUMNS} | {"other": 0})
    block_faults: dict[int, int] = field(default_factory=dict)
    #: faults per kernel: keyed by name_id, or for a kernel whose name is unknown (loaded before
    #: umctl attached, so the name probes never saw it) by -3 - its index in ``_handles``
    kernel_faults: dict[int, int] = field(default_factory=dict)
    names: list[str] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    have_migrations: bool = False
    #: measured fraction of the time events and counters were collected (the source's
    #: sampler); below 1 every total is the window count scaled up (:meth:`scaled`), while
    #: top blocks / top kernels are rankings of the sampled events
    sample: float = 1.0
    status: str = ""
    _seen: dict[str, int] = field(default_factory=lambda: {"faults": 0, "batches": 0, "cpu_faults": 0, "thrashing": 0,
                                                           "batch_ids": 0})
    t0: float = field(default_factory=time.monotonic)
    _prev: dict[str, float] = field(default_factory=dict)
    _prev_t: float = 0.0
    rates: dict[str, float] = field(default_factory=dict)
    _launch_t: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    _launch_name: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    _handles: dict[int, int] = field(default_factory=dict)   # unnamed kernel's function handle -> index
    _batch_ids: set = field(default_factory=set)

    def feed(self, batch: EventBatch, source) -> None:
        """One drained batch, with the source's counters and sampling fraction as of now (what
        the estimates are scaled by)."""
        self.counters = source.counters()
        self.sample = source.sample_fraction()
        self.update(batch)

    def update(self, batch: EventBatch) -> None:
        f = batch[Kind.FAULT]
        seen = self._seen
        seen["faults"] += len(f)
        new: set = set()
        if len(f):
            new = set(np.unique((f["gpu"].astype(np.int64) << 32) | f["batch_id"]).tolist()) - self._batch_ids
            seen["batch_ids"] += len(new)
            if len(self._batch_ids) < 100_000:
                self._batch_ids |= new
            else:
                self._batch_ids = new
        if Kind.REPLAY in batch:
            seen["batches"] += len(batch[Kind.REPLAY])
        else:  # replays disabled: count distinct batch ids instead
            seen["batches"] += len(new)
        seen["cpu_faults"] += len(batch[Kind.CPU_FAULT])
        seen["thrashing"] += len(batch[Kind.THRASHING])
        if Kind.DROPS in batch:
            self.dropped += int(batch[Kind.DROPS]["count"].sum())
        m = batch[Kind.MIGRATION]
        if len(m):
            self.have_migrations = True
            known = np.zeros(len(m), dtype=bool)
            for name, cause in CAUSE_COLUMNS:
                sel = m["cause"] == cause
                known |= sel
                self.h2d[name] += int(m["bytes"][sel & (m["src"] == CPU)].sum())
                self.d2h[name] += int(m["bytes"][sel & (m["dst"] == CPU)].sum())
            self.h2d["other"] += int(m["bytes"][~known & (m["src"] == CPU)].sum())
            self.d2h["other"] += int(m["bytes"][~known & (m["dst"] == CPU)].sum())
        if len(f):
            blocks, n = np.unique((f["addr"] >> np.uint64(BLOCK_SHIFT)).astype(np.int64), return_counts=True)
            bf = self.block_faults
            for b, c in zip(blocks.tolist(), n.tolist()):
                bf[b] = bf.get(b, 0) + c
        la = batch[Kind.LAUNCH]
        if len(batch.names) > len(self.names):
            self.names = list(batch.names)
        if len(la):
            self.launches += len(la)
            order = np.argsort(la["t_ns"], kind="stable")
            self._launch_t = np.concatenate([self._launch_t, la["t_ns"][order]])[-4096:]
            key = la["name_id"][order].astype(np.int64)
            for j in np.flatnonzero(key < 0):   # unnamed: one entry per function handle, not one "#-1"
                key[j] = -3 - self._handles.setdefault(int(la["func"][order[j]]), len(self._handles))
            self._launch_name = np.concatenate([self._launch_name, key])[-4096:]
        if len(f) and len(self._launch_t):
            pos = np.searchsorted(self._launch_t, f["t_ns"], side="right") - 1
            ids, n = np.unique(np.where(pos >= 0, self._launch_name[np.maximum(pos, 0)], -2), return_counts=True)
            kf = self.kernel_faults
            for i, c in zip(ids.tolist(), n.tolist()):
                kf[i] = kf.get(i, 0) + c

    def scaled(self, n: int) -> int:
        """A count taken while collecting, as a total: itself without sampling, else over the
        measured on-time (events and counters both run in the windows only)."""
        return scaled_estimate(n, self.sample)

    @property
    def faults(self) -> int:
        return self.scaled(self._seen["faults"])

    @property
    def cpu_faults(self) -> int:
        return self.scaled(self._seen["cpu_faults"])

    @property
    def thrashing(self) -> int:
        return self.scaled(self._seen["thrashing"])

    @property
    def batches(self) -> int:
        seen = self._seen
        if self.sample >= 1:
            return seen["batches"]
        # distinct batch ids of the sampled faults: replay events seen in windows undercounted
        # on the H100 (they are posted when the replay completes)
        return self.scaled(seen["batch_ids"] or seen["batches"])

    def counter(self, name: str) -> int:
        """A driver counter, scaled up when it too only counted in the sample windows."""
        return self.scaled(self.counters.get(name, 0))

    def h2d_total(self) -> int:
        if self.have_migrations:
            return self.scaled(sum(self.h2d.values()))
        return self.counter("bytes_htd")

    def d2h_total(self) -> int:
        if self.have_migrations:
            return self.scaled(sum(self.d2h.values()))
        return self.counter("bytes_dth")

    def tick(self) -> None:
        """Recompute rates over the time since the last tick."""
        now = time.monotonic()
        cur = {"faults": self.faults, "batches": self.batches, "cpu_faults": self.cpu_faults,
               "thrashing": self.thrashing, "dropped": self.dropped, "h2d": self.h2d_total(),
               "d2h": self.d2h_total(), "launches": self.launches}
        for name, _ in CAUSE_COLUMNS + (("other", None),):   # by-cause bytes come from sampled events
            cur[f"h2d_{name}"] = self.scaled(self.h2d[name])
            cur[f"d2h_{name}"] = self.scaled(self.d2h[name])
        if self._prev:
            dt = max(now - self._prev_t, 1e-6)
            self.rates = {k: (v - self._prev.get(k, 0)) / dt for k, v in cur.items()}
        else:
            dt = max(now - self.t0, 1e-6)
            self.rates = {k: v / dt for k, v in cur.items()}
        self._prev, self._prev_t = cur, now

    def top_blocks(self, n: int = 3) -> list[tuple[int, int]]:
        items = self.block_faults.items()
        return sorted(items, key=lambda kv: -kv[1])[:n]

    def kernel_label(self, key: int) -> str:
        if 0 <= key < len(self.names):
            return self.names[key]
        if key == -2:
            return "<before first launch>"
        handle = next((h for h, i in self._handles.items() if -3 - i == key), None)
        return f"<kernel 0x{handle:x}, loaded before attach>" if handle is not None else f"#{key}"

    def top_kernels(self, n: int = 3) -> list[tuple[str, int]]:
        return [(self.kernel_label(i), c) for i, c in sorted(self.kernel_faults.items(), key=lambda kv: -kv[1])[:n]]

    def snapshot(self, top: int = 5) -> LiveTotals:
        """The totals as of now, typed: what a session's summary holds and every view of a
        process's totals reads (``top`` kernels and blocks, most faults first)."""
        return LiveTotals(pid=self.pid, comm=self.comm, faults=self.faults, batches=self.batches,
                          cpu_faults=self.cpu_faults, thrashing=self.thrashing, dropped=self.dropped,
                          launches=self.launches, h2d=dict(self.h2d), d2h=dict(self.d2h),
                          counters=dict(self.counters), top_kernels=self.top_kernels(top),
                          top_blocks=[(f"0x{b << BLOCK_SHIFT:x}", c) for b, c in self.top_blocks(top)],
                          sample=self.sample, have_migrations=self.have_migrations,
                          h2d_total=self.h2d_total(), d2h_total=self.d2h_total())
