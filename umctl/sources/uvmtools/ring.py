"""The tools event ring: consumer side of the driver's single-producer queue, and the thread
that keeps it empty.

Protocol (what the 580 driver's enqueue does, uvm_tools.c): indices live in the control
block and are taken modulo the entry count, which must be a power of two. The producer
writes the entry at ``put_ahead``, then advances ``put_ahead`` and ``put_behind``; it drops
the event (and increments ``dropped[type]``) when writing would leave no free slot before
``get_behind``, so a ring of N entries holds at most N - 1 events. The consumer copies
``[get_behind, put_behind)`` (in two pieces when it wraps), and only *then* publishes the new
``get`` -- publishing first would let the driver overwrite entries still being copied.

The drain thread copies raw bytes only (a numpy slice copy, microseconds) and leaves decoding
to whoever calls :meth:`Drainer.take`: the ring is the one thing that must never fill, so the
thread does the least work possible per wake-up.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ...driver import abi


class Ring:
    """Consumer of one ring: ``entries`` is a structured array of ``abi.ENTRY_DTYPE`` over the
    queue buffer, ``control`` a one-element array of ``abi.CONTROL_DTYPE`` over the control
    block (both shared with the driver, or with a fake producer in tests)."""

    def __init__(self, entries: np.ndarray, control: np.ndarray):
        n = len(entries)
        if n < 2 or n & (n - 1):
            raise ValueError(f"ring entry count must be a power of two >= 2 (got {n})")
        if entries.dtype != abi.ENTRY_DTYPE or control.dtype != abi.CONTROL_DTYPE or len(control) != 1:
            raise TypeError("entries/control must be views of ENTRY_DTYPE / one CONTROL_DTYPE record")
        self.entries = entries
        self.control = control
        self.n = n
        self.mask = n - 1

    def pending(self) -> int:
        c = self.control[0]
        return (int(c["put_behind"]) - int(c["get_behind"])) & self.mask

    def drain(self, limit: int | None = None) -> np.ndarray:
        """Copy out every complete entry (at most ``limit``) and release their slots.
        Returns an ENTRY_DTYPE array, possibly empty."""
        ctrl = self.control
        put = int(ctrl["put_behind"][0]) & self.mask
        get = int(ctrl["get_behind"][0]) & self.mask
        count = (put - get) & self.mask
        if limit is not None:
            count = min(count, int(limit))
        if count == 0:
            return self.entries[:0].copy()
        end = get + count
        if end <= self.n:
            out = self.entries[get:end].copy()
        else:
            out = abi.concat_entries([self.entries[get:], self.entries[:end - self.n]])
        new_get = end & self.mask
        ctrl["get_ahead"][0] = new_get
        ctrl["get_behind"][0] = new_get
        return out

    def dropped(self) -> np.ndarray:
        """Cumulative dropped-entry counters, one per UVM event type (a copy)."""
        return self.control["dropped"][0].copy()


def clock_offset_ns() -> int:
    """CLOCK_MONOTONIC - CLOCK_MONOTONIC_RAW now (see decode.py: driver stamps are RAW).
    Read between two RAW reads so the error is half the read-to-read gap."""
    a = time.clock_gettime_ns(time.CLOCK_MONOTONIC_RAW)
    m = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    b = time.clock_gettime_ns(time.CLOCK_MONOTONIC_RAW)
    return m - (a + b) // 2


@dataclass
class Chunk:
    """Raw entries drained at one wake-up, with the time they were taken off the ring
    (CLOCK_MONOTONIC ns), the clock offset then, and the cumulative drop counters."""

    entries: np.ndarray
    drained_ns: int
    clock_offset_ns: int
    dropped: np.ndarray


@dataclass
class DrainStats:
    wakeups: int = 0
    chunks: int = 0
    entries: int = 0
    max_chunk: int = 0
    max_fill: float = 0.0          # largest fraction of the ring found full at a wake-up
    flushes: int = 0
    flush_ns_total: int = 0
    flush_ns_max: int = 0
    errors: list[str] = field(default_factory=list)


class Drainer:
    """Thread that empties a :class:`Ring` every ``drain_ms`` and calls ``flush`` (the
    UVM_TOOLS_FLUSH_EVENTS ioctl) every ``flush_ms``. Without the flush the driver holds
    migration events back for 100-400 ms; docs/evaluation/measurements.md has the lag and the
    cost of a call with one every 5 ms."""

    def __init__(self, ring: Ring, *, flush: Callable[[], None] | None = None, flush_ms: float = 5.0,
                 drain_ms: float = 2.0, name: str = "umctl-uvm-drain",
                 tick: Callable[[], None] | None = None):
        self.ring = ring
        self.tick = tick   # called every wake-up before draining (the event sampler's clock)
        self.flush = flush
        self.flush_ms = float(flush_ms)
        self.drain_ms = float(drain_ms)
        self.stats = DrainStats()
        self._chunks: list[Chunk] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._offset = clock_offset_ns()
        self._offset_at = time.monotonic()

    def start(self) -> None:
        self._thread.start()

    def _do_flush(self) -> None:
        if self.flush is None:
            return
        t = time.perf_counter_ns()
        try:
            self.flush()
        except Exception as e:  # noqa: BLE001 - a failing flush must not kill draining
            if len(self.stats.errors) < 10:
                self.stats.errors.append(f"flush: {e}")
        dt = time.perf_counter_ns() - t
        self.stats.flushes += 1
        self.stats.flush_ns_total += dt
        self.stats.flush_ns_max = max(self.stats.flush_ns_max, dt)

    def drain_once(self) -> int:
        """Take whatever the ring holds now (also used for the final drain after stop)."""
        fill = self.ring.pending() / self.ring.n
        entries = self.ring.drain()
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        if time.monotonic() - self._offset_at > 1.0:  # NTP slews slowly; once a second is plenty
            self._offset, self._offset_at = clock_offset_ns(), time.monotonic()
        st = self.stats
        st.wakeups += 1
        st.max_fill = max(st.max_fill, fill)
        dropped = self.ring.dropped()
        if len(entries) or dropped.any():
            with self._lock:
                self._chunks.append(Chunk(entries, now, self._offset, dropped))
            if len(entries):
                st.chunks += 1
                st.entries += len(entries)
                st.max_chunk = max(st.max_chunk, len(entries))
        return len(entries)

    def _run(self) -> None:
        next_flush = time.monotonic() + self.flush_ms / 1e3 if self.flush_ms > 0 else float("inf")
        period = self.drain_ms / 1e3
        while not self._stop.wait(period):
            now = time.monotonic()
            if now >= next_flush:
                self._do_flush()
                next_flush = now + self.flush_ms / 1e3
            if self.tick is not None:
                try:
                    self.tick()
                except Exception as e:  # noqa: BLE001 - sampling trouble must not stop draining
                    if len(self.stats.errors) < 10:
                        self.stats.errors.append(f"tick: {e}")
            self.drain_once()

    def take(self) -> list[Chunk]:
        """Chunks drained since the last call, oldest first."""
        with self._lock:
            out, self._chunks = self._chunks, []
        return out

    def stop(self, final_flush: bool = True) -> None:
        """Stop the thread, then flush once and drain what is left so nothing is lost."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if final_flush:
            self._do_flush()
        self.drain_once()


class LagHistogram:
    """Delivery lag (event time -> drained) on fixed log-spaced bins, 1 us .. 100 s: p50/p99
    over millions of events without keeping them."""

    EDGES = np.logspace(3, 11, 161)  # ns; 20 bins per decade

    def __init__(self) -> None:
        self.counts = np.zeros(len(self.EDGES) + 1, dtype=np.int64)
        self.n = 0
        self.max_ns = 0

    def add(self, lag_ns: np.ndarray) -> None:
        if len(lag_ns) == 0:
            return
        idx = np.searchsorted(self.EDGES, lag_ns, side="right")
        self.counts += np.bincount(idx, minlength=len(self.counts))
        self.n += len(lag_ns)
        self.max_ns = max(self.max_ns, int(lag_ns.max()))

    def percentile(self, p: float) -> float | None:
        """Upper edge of the bin holding the p-th percentile, in ns (<= 12 % high)."""
        if self.n == 0:
            return None
        k = int(np.searchsorted(np.cumsum(self.counts), p / 100 * self.n, side="left"))
        if k >= len(self.EDGES):
            return float(self.max_ns)
        return float(min(self.EDGES[k], max(self.max_ns, 1)))
