"""Live source: the nvidia-uvm tools API (event tracker V2 + counters) on an unmodified
process. See source.py for the entry point and docs/guide/observe.md for costs and permissions."""

from ...driver.process import (  # noqa: F401
    LiveError, NoDriver, NoPermission, NoSuchProcess, NoUvm, TargetExited, TrackerError, UvmProcess,
    list_uvm_processes,
)
from .source import ALL_KINDS, DEFAULT_KINDS, KIND_NAMES, UvmToolsSource, kinds_label, parse_kinds  # noqa: F401
