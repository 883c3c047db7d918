"""Replay a target (scenario or trace file) under several controller modes, side by side.

The same :class:`~umctl.sim.engine.Simulator` runs every mode with the same seed, so the
differences between rows come from the policies alone.
"""

from __future__ import annotations

import os
from typing import Callable

from .. import UmctlError
from ..controller.base import available_modes, make_controller
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


def is_trace_path(target: str) -> bool:
    if target.endswith(".parquet"):
        return True
    if os.path.isfile(target):
        with open(target, "rb") as f:
            return f.read(4) == b"PAR1"
    return False


def resolve_target(target: str, overrides: dict[str, str] | None = None) -> Workload:
    """Scenario name, scenario file (``file.toml[:name]``) or trace file -> Workload."""
    overrides = dict(overrides or {})
    if is_trace_path(target):
        from ..events.trace import read_trace
        from ..sources.tracefile import workload_from_trace
        from ..units import parse_size

        gpu_mem = overrides.pop("gpu_mem", None)
        oversub = overrides.pop("oversub", None)
        for ignored in ("seed",):
            overrides.pop(ignored, None)
        if overrides:
            raise UmctlError(f"scenario parameters do not apply to a trace file: {', '.join(overrides)}")
        try:
            return workload_from_trace(read_trace(target),
                                       gpu_mem=parse_size(gpu_mem) if gpu_mem else None,
                                       oversub=float(oversub) if oversub else None)
        except ValueError as e:
            raise UmctlError(f"{target}: {e}") from None
    from ..sources.scenario import load_scenario

    return load_scenario(target, overrides)


def parse_mode_options(items: list[str] | None, modes: list[str]) -> dict[str, dict]:
    """``deepum.degree=8`` (one mode) or ``degree=8`` (every mode that takes it) -> per-mode
    keyword arguments, values parsed as int, float or bool where they look like one."""
    import inspect

    from ..controller.base import _REGISTRY

    known = available_modes()  # also loads the mode modules
    bad = [m for m in modes if m not in known]
    if bad:
        raise UmctlError(f"unknown mode {bad[0]!r}; available: {', '.join(known)}")
    out: dict[str, dict] = {m: {} for m in modes}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UmctlError(f"bad mode option {item!r}: use MODE.KEY=VALUE or KEY=VALUE (e.g. deepum.degree=8)")
        mode, _, name = key.rpartition(".")
        targets = [mode] if mode else modes
        parsed: object = value
        for conv in (int, float):
            try:
                parsed = conv(value)
                break
            except ValueError:
                continue
        if value.lower() in ("true", "false"):
            parsed = value.lower() == "true"
        taken = False
        for m in targets:
            if m not in out:
                raise UmctlError(f"mode option {item!r} names mode {m!r}, which is not being run")
            params = inspect.signature(_REGISTRY[m].__init__).parameters
            if name in params:
                out[m][name] = parsed
                taken = True
        if not taken:
            raise UmctlError(f"no mode among {', '.join(targets)} takes option {name!r}")
    return out


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
