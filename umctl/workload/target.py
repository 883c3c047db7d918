"""What ``umctl replay`` / ``umctl sweep`` replay: a scenario name, a scenario file or a trace
file, turned into a :class:`~umctl.workload.workload.Workload`."""

from __future__ import annotations

import os

from .. import UmctlError
from .workload import Workload


def is_trace_path(target: str) -> bool:
    """A trace by its suffix, or by parquet's magic for a file named otherwise."""
    if target.endswith(".parquet"):
        return True
    if os.path.isfile(target):
        try:
            with open(target, "rb") as f:
                return f.read(4) == b"PAR1"
        except OSError:   # unreadable: the scenario loader says why
            return False
    return False


def _trace_override(name: str, text: str, parse) -> float:
    """``--gpu-mem`` / ``--oversub`` for a trace, checked as a scenario's would be (type,
    finiteness, range): a one-line UmctlError otherwise."""
    from .scenario import check_value

    try:
        value = parse(text)
        check_value(name, "size" if name == "gpu_mem" else "float", value)
    except ValueError as e:
        raise UmctlError(f"--{name.replace('_', '-')} {text}: {' '.join(str(e).split())}") from None
    return value


def resolve_target(target: str, overrides: dict[str, str] | None = None) -> Workload:
    """Scenario name, scenario file (``file.toml[:name]``) or trace file -> Workload."""
    overrides = dict(overrides or {})
    if is_trace_path(target):
        from ..events.trace import read_trace
        from .tracefile import workload_from_trace
        from ..units import parse_size

        gpu_mem = overrides.pop("gpu_mem", None)
        oversub = overrides.pop("oversub", None)
        for ignored in ("seed",):
            overrides.pop(ignored, None)
        if overrides:
            raise UmctlError(f"scenario parameters do not apply to a trace file: {', '.join(overrides)}")
        gpu_mem = _trace_override("gpu_mem", gpu_mem, parse_size) if gpu_mem else None
        oversub = _trace_override("oversub", oversub, float) if oversub else None
        try:
            return workload_from_trace(read_trace(target), gpu_mem=gpu_mem, oversub=oversub)
        except ValueError as e:
            raise UmctlError(f"{target}: {e}") from None
    from .scenario import load_scenario

    return load_scenario(target, overrides)
