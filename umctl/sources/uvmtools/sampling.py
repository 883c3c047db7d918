"""Time-sampled collection: the tracker's events and counters on for ``on_ms`` of every ``period_ms``.

Why it exists: while any tools event or counter is enabled on a va_space, the driver (580)
makes every CPU fault wait for its tools kthread queue (``uvm_va_space_cpu_fault`` calls
``uvm_tools_flush_events``) and runs a tools callback on every GPU fault, and we decode every
event. A view that wants rates and rankings (faults/s, top kernels, top blocks) does not need
every event: in a 10 % duty cycle the driver runs tool-free 90 % of the time, umctl decodes a
tenth of the events, and totals are the windows' counts over the measured on-time -- the trade
a sampling profiler makes.

What it did not do (H100, fault-heavy PyTorch loop, docs/live.md): lower the target's slowdown.
Every event, counters alone and a 10 % sample all cost about +12 % there, so that cost is
something fixed about being attached, not per-event work; sampling therefore is an option
(``--sample``), not the default. Recording and control never sample: a trace must replay and a
controller must see every fault.

The sampler is ticked by the drain thread (every ``drain_ms``), so window edges are accurate
to a couple of milliseconds; ``fraction`` is the measured on-time over the elapsed time, which
is what estimates divide by (not the nominal duty)."""

from __future__ import annotations

import time
from typing import Callable

from .process import LiveError


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


class Sampler:
    """Turns collection on and off in a fixed duty cycle. ``toggle(on)`` is the driver call
    (the source's ENABLE/DISABLE_EVENTS and ENABLE/DISABLE_COUNTERS); it starts on."""

    def __init__(self, toggle: Callable[[bool], None], duty: float, period_ms: float = 100.0,
                 clock: Callable[[], float] = time.monotonic):
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

    def tick(self) -> None:
        """Called often (every drain): switch state at the window edges."""
        if self.duty >= 1:
            return
        now = self.clock()
        phase = (now - self.t0) % self.period_s
        want = phase < self.duty * self.period_s
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

    def fraction(self) -> float:
        """Measured fraction of the time events were on (1.0 when not sampling)."""
        if self.duty >= 1:
            return 1.0
        now = self.clock()
        on = self._on_s + (now - self._edge if self.on else 0.0)
        return min(1.0, on / max(now - self.t0, 1e-9)) if now > self.t0 else 1.0
