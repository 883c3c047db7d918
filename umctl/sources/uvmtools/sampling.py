"""Time-sampled collection: the tracker's events and counters on for a window of
``duty x period_ms`` in every ``period_ms``, at a random place in each period.

Why it exists: what attaching costs a target is per event, in the driver. Measured inside one
running PyTorch loop on the H100 (benchmarks/gpu/attach_overhead.py, docs/evaluation/measurements.md): the
duplicated fd and an idle tracker cost nothing measurable, the counters ~4 %, and GPU fault
events ~0.45 us each on the fault-service path, +15 % on a loop taking 230 K faults/s; while
any tools event or counter is enabled the driver also makes every CPU fault wait for its tools
kthread queue (``uvm_va_space_cpu_fault`` -> ``uvm_tools_flush_events``). With a 10 % duty
cycle the driver runs tool-free 90 % of the time and the cost falls with it, to within the
noise (-2 % .. +0.2 %, against +16 .. +19 % for every event). A view that wants rates and
rankings (faults/s, top kernels, top blocks) does not need every event, so ``attach`` and
``top`` sample by default -- the trade a sampling profiler makes; totals are the windows'
counts over the measured on-time. Recording and control never sample: a trace must replay and
a controller must see every fault.

The window's start in each period is drawn at random (the first period starts on; a window
may run on into the next period), so every instant is sampled with the same probability and
a workload whose steps repeat at the sampling period is not always caught in the same phase,
which would bias the estimates. The sampler is ticked by the drain thread (every
``drain_ms``), so window edges are accurate to a couple of milliseconds; ``fraction`` is the
measured on-time over the elapsed time, which is what estimates divide by (not the nominal
duty)."""

from __future__ import annotations

import random
import time
from typing import Callable

from ...driver.process import LiveError


def parse_sample(text: str | float | None) -> float:
    """``--sample`` value: a fraction in (0, 1] or a percentage ``10%``; 1 = every event."""
    if text is None:
        return 1.0
    s = str(text).strip()
    try:
        v = float(s[:-1]) / 100 if s.endswith("%") else float(s)
    except ValueError:
        raise LiveError(f"--sample must be a fraction in (0, 1] or a percentage such as 10% (got {text!r})") from None
    if not 0 < v <= 1:
        raise LiveError(f"--sample must be in (0, 1] (got {text!r})")
    return v


#: What ``attach`` and ``top`` collect by default (``--sample``): 10 % of the time.
VIEW_SAMPLE = 0.1


class Sampler:
    """Turns collection on and off: one window of ``duty`` of each period, at a random offset.
    ``toggle(on)`` is the driver call (the source's ENABLE/DISABLE_EVENTS and
    ENABLE/DISABLE_COUNTERS); it starts on."""

    def __init__(self, toggle: Callable[[bool], None], duty: float, period_ms: float = 100.0,
                 clock: Callable[[], float] = time.monotonic, rng: random.Random | None = None):
        if not 0 < duty <= 1:
            raise ValueError(f"duty must be in (0, 1], got {duty}")
        self.toggle = toggle
        self.duty = float(duty)
        self.period_s = period_ms / 1e3
        self.clock = clock
        self.on = True
        self.t0 = clock()
        self._edge = self.t0               # when the current state began
        self._on_s = 0.0                   # on-time of finished windows
        self.toggles = 0
        self.errors = 0
        self.rng = rng if rng is not None else random.Random()
        self._period = 0                   # index of the period whose offset is drawn
        self._offset = 0.0                 # its window's start within the period (0: the first)
        self._prev_offset = -1.0           # the previous period's (its window may run into this one)

    def _want(self, now: float) -> bool:
        # Each period's window starts at a uniform offset in [0, period) and may run on into the
        # next period: every instant is then covered with the same probability (the duty), which
        # a window kept inside its period would not give its edges.
        k = int((now - self.t0) // self.period_s)
        while self._period < k:
            self._prev_offset = self._offset
            self._period += 1
            self._offset = self.rng.uniform(0.0, self.period_s)
        phase = (now - self.t0) - k * self.period_s
        on = self.duty * self.period_s
        return (self._offset <= phase < self._offset + on) or phase < self._prev_offset + on - self.period_s

    def tick(self) -> None:
        """Called often (every drain): switch state at the window edges."""
        if self.duty >= 1:
            return
        now = self.clock()
        want = self._want(now)
        if want == self.on:
            return
        try:
            self.toggle(want)
        except OSError:
            self.errors += 1   # counted, and tried again at the next tick
            return
        if self.on:
            self._on_s += now - self._edge
        self._edge = now
        self.on = want
        self.toggles += 1

    def on_time(self) -> float:
        """Seconds collected so far, the open window included: the exporter scales each
        interval's counts by its elapsed time over its growth in this."""
        now = self.clock()
        return self._on_s + (now - self._edge if self.on else 0.0)

    def fraction(self) -> float:
        """Measured fraction of the time events were on (1.0 when not sampling)."""
        if self.duty >= 1:
            return 1.0
        now = self.clock()
        on = self._on_s + (now - self._edge if self.on else 0.0)
        return min(1.0, on / max(now - self.t0, 1e-9)) if now > self.t0 else 1.0
