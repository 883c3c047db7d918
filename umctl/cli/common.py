"""What several CLI commands share: the consoles, refusing an unwritable output early, scenario
overrides from the common flags, and the one-line description of a workload."""

from __future__ import annotations

import os

from rich.console import Console

from .. import UmctlError
from ..units import Range

#: ``replay --drain-us``: how often the controller sees events, in simulated µs. Above 0 (0
#: would deliver nothing); at most 10 s, far beyond any live source's drain period (1 ms).
DRAIN_US = Range(0, 1e7, lo_open=True)
#: ``top --interval`` in seconds: above 0, at most a day (``time.sleep`` takes no NaN, inf or
#: negative value, and a longer wait is a hang to anyone watching).
TOP_INTERVAL_S = Range(0, 86400, lo_open=True)

out = Console()
if not out.is_terminal:  # piped or captured: don't squeeze tables into 80 columns
    out = Console(width=160)
err = Console(stderr=True)


def overrides(oversub, gpu_mem, iters, seed, params) -> dict[str, str]:
    """Scenario overrides from ``--param`` and the flags that name a parameter. The same
    parameter given twice (``--param batch=2 --param batch=3``, ``--iters 2 --param
    iterations=nan``) is refused: one value would silently replace the other, bad or not."""
    from ..workload.scenario import ALIASES, parse_param

    ov: dict[str, str] = {}
    given: dict[str, str] = {}

    def put(name: str, value: str, label: str) -> None:
        canon = ALIASES.get(name.strip().replace("-", "_"), name.strip().replace("-", "_"))
        if canon in given:
            raise UmctlError(f"{label}: parameter {canon} is already set by {given[canon]}; give it once")
        given[canon] = label
        ov[name if label.startswith("--param") else canon] = value

    for p in params or []:
        k, v = parse_param(p)
        put(k, v, f"--param {p}")
    for flag, name, value in (("--oversub", "oversub", oversub), ("--gpu-mem", "gpu_mem", gpu_mem),
                              ("--iters", "iterations", iters), ("--seed", "seed", seed)):
        if value is not None:
            put(name, str(value), f"{flag} {value}")
    return ov


#: The file name ending each kind of output must have: a figure is always written as a PNG
#: (matplotlib would otherwise pick a format from the ending, refuse ``out.txt`` with a
#: traceback, or append ``.png`` to a name without one and write a file the user did not name).
OUTPUT_SUFFIX = {"figure": ".png", "timeline": ".png"}


def check_output_path(path: str | None, what: str, suffix: str | None = None) -> None:
    """Refuse an output file that cannot be written before any work is done (a replay or a
    sweep can take minutes, and its figure is the last thing it writes): a missing or
    unwritable directory, an existing directory or device (``--png /tmp`` wrote /tmp.png,
    ``--record DIR`` failed at the end), a name without the ending its format needs
    (``suffix``, by default :data:`OUTPUT_SUFFIX` of ``what``)."""
    if path is None:
        return
    if not path.strip():   # given, but empty: the output would be skipped without a word
        raise UmctlError(f"the {what} file name is empty")
    suffix = suffix or OUTPUT_SUFFIX.get(what)
    if os.path.isdir(path):
        raise UmctlError(f"{path}: cannot write the {what}: it is a directory (give a file name"
                         + (f" ending in {suffix})" if suffix else ")"))
    if os.path.exists(path) and not os.path.isfile(path):
        raise UmctlError(f"{path}: cannot write the {what}: not a regular file")
    if suffix and not path.lower().endswith(suffix):
        raise UmctlError(f"{path}: the {what} is written as {suffix[1:].upper()}: give a file name ending in {suffix}")
    parent = os.path.dirname(os.path.abspath(path)) or "."
    if not os.path.isdir(parent):
        raise UmctlError(f"{path}: cannot write the {what}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise UmctlError(f"{path}: cannot write the {what}: permission denied")
    if os.path.realpath(parent).startswith(("/proc/", "/sys/")) or os.path.realpath(parent) in ("/proc", "/sys"):
        raise UmctlError(f"{path}: cannot write the {what}: {parent} is a kernel file system")


def check_number(value: float | None, label: str, rng, unit: str = "") -> None:
    """A number option within ``rng`` (a :class:`umctl.units.Range`; finite), else a one-line
    error naming the option and the range; None (not given) passes."""
    if value is not None and value not in rng:
        raise UmctlError(f"{label} must be {rng.describe()}{unit} (got {value!r})")


def describe(w) -> str:
    from ..units import format_bytes

    cap = sum(w.gpu_mem)
    peak, total = w.peak_managed_bytes, w.managed_bytes
    allocated = f" ({format_bytes(total)} allocated in all)" if total > peak else ""
    return (f"{w.name}: {format_bytes(peak)} managed at peak{allocated} on {w.n_gpus} GPU(s) of "
            f"{format_bytes(w.gpu_mem[0])} ({peak / cap:.2f}× oversubscribed), "
            f"{len(w.kernels):,} kernels, {w.n_accesses:,} page accesses")


KINDS_HELP = ("Event kinds: 'default' (faults,replays,cpu_faults,thrashing: cheap), 'all' (adds migrations: "
              "~1.8x slower fault service), a list such as faults,migrations, or +migrations.")

SAMPLE_HELP = ("Collect events and counters only this fraction of the time (e.g. 0.1 or 10%; 1 = every event). "
               "Default: 10% for a view (what attaching costs the target is per event in the driver: every event "
               "made a fault-heavy PyTorch loop ~16% slower on the H100, a 10% sample left it within noise; "
               "docs/evaluation/measurements.md); every event with -o or --mode, which refuse less: a trace must replay and a "
               "controller must see every fault. Sampled totals are estimates, rankings are of the sample.")
