"""Replay a target (scenario or trace file) under several controller modes, side by side.

The same :class:`~umctl.sim.engine.Simulator` runs every mode with the same seed, so the
differences between rows come from the policies alone.
"""

from __future__ import annotations

from typing import Callable

from .. import UmctlError
from ..controller.base import available_modes, make_controller
from ..controller.options import parse_mode_options  # noqa: F401 - benchmarks and notebooks import it here
from ..sources.target import is_trace_path, resolve_target  # noqa: F401 - the same
from ..sources.workload import Workload
from .calibration import DEFAULT, Calibration
from .engine import SimResult, Simulator


def parse_modes(text: str) -> list[str]:
    """'none,oracle' -> ['none', 'oracle']; 'all' -> every registered mode. ``none`` is always
    run first because speedups are relative to it."""
    modes = [m.strip() for m in text.split(",") if m.strip()]
    known = available_modes()
    if modes == ["all"]:
        modes = list(known)
    bad = [m for m in modes if m not in known]
    if bad:
        raise UmctlError(f"unknown mode {bad[0]!r}; available: {', '.join(known)}")
    if not modes:
        raise UmctlError("no mode given (e.g. --mode none,oracle)")
    if "none" in modes:
        modes.remove("none")
    return ["none"] + modes


def run_modes(workload: Workload, modes: list[str], *, seed: int = 0, calib: Calibration = DEFAULT,
              progress: Callable[[str, int, int], None] | None = None,
              mode_options: dict[str, dict] | None = None, recorder_for: Callable[[str], object] | None = None,
              drain_ns: int | None = None, timeline: bool = False) -> list[SimResult]:
    """Simulate the workload once per mode (same seed)."""
    results = []
    extra = {} if drain_ns is None else {"drain_ns": int(drain_ns)}
    if timeline:
        extra["timeline"] = True
    ctls = [make_controller(mode, **(mode_options or {}).get(mode, {})) for mode in modes]
    for mode, ctl in zip(modes, ctls):
        why = ctl.applies_to(workload)
        if why:
            raise UmctlError(f"mode {mode} does not apply to {workload.name}: {why}")
    for mode, ctl in zip(modes, ctls):
        cb = (lambda done, total, m=mode: progress(m, done, total)) if progress else None
        rec = recorder_for(mode) if recorder_for else None
        try:
            sim = Simulator(workload, ctl, calib=calib, seed=seed, progress=cb, recorder=rec, **extra)
            results.append(sim.run())
        finally:
            if rec is not None:
                rec.close()
    return results


def result_rows(results: list[SimResult]) -> list[dict]:
    """One JSON-able dict per mode, with speedup over ``none`` (the first row)."""
    base = next((r for r in results if r.mode == "none"), results[0])
    rows = []
    for r in results:
        d = r.summary()
        d["speedup"] = base.time_ns / r.time_ns if r.time_ns else None
        d["steady_speedup"] = (base.steady_time_ns / r.steady_time_ns
                               if r.steady_time_ns and base.steady_time_ns else None)
        d["workload"] = r.workload
        rows.append(d)
    return rows
