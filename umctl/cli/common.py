"""What several CLI commands share: the consoles, refusing an unwritable output early, scenario
overrides from the common flags, and the one-line description of a workload."""

from __future__ import annotations

import os

from rich.console import Console

from .. import UmctlError

out = Console()
if not out.is_terminal:  # piped or captured: don't squeeze tables into 80 columns
    out = Console(width=160)
err = Console(stderr=True)


def overrides(oversub, gpu_mem, iters, seed, params) -> dict[str, str]:
    from ..sources.scenario import parse_param

    ov: dict[str, str] = {}
    for p in params or []:
        k, v = parse_param(p)
        ov[k] = v
    if oversub is not None:
        ov["oversub"] = str(oversub)
    if gpu_mem is not None:
        ov["gpu_mem"] = gpu_mem
    if iters is not None:
        ov["iterations"] = str(iters)
    if seed is not None:
        ov["seed"] = str(seed)
    return ov


def check_output_path(path: str | None, what: str) -> None:
    """Refuse an output file that cannot be written before any work is done (a replay or a
    sweep can take minutes, and its figure is the last thing it writes)."""
    if not path:
        return
    parent = os.path.dirname(os.path.abspath(path)) or "."
    if not os.path.isdir(parent):
        raise UmctlError(f"{path}: cannot write the {what}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise UmctlError(f"{path}: cannot write the {what}: permission denied")


def describe(w) -> str:
    from ..units import format_bytes

    cap = sum(w.gpu_mem)
    peak, total = w.peak_managed_bytes, w.managed_bytes
    allocated = f" ({format_bytes(total)} allocated in all)" if total > peak else ""
    return (f"{w.name}: {format_bytes(peak)} managed at peak{allocated} on {w.n_gpus} GPU(s) of "
            f"{format_bytes(w.gpu_mem[0])} ({peak / cap:.2f}× oversubscribed), "
            f"{len(w.kernels):,} kernels, {w.n_accesses:,} page accesses")


def fmt_bytes(n: float) -> str:
    from ..units import format_bytes

    return format_bytes(int(n))


KINDS_HELP = ("Event kinds: 'default' (faults,replays,cpu_faults,thrashing: cheap), 'all' (adds migrations: "
              "~1.8x slower fault service), a list such as faults,migrations, or +migrations.")

SAMPLE_HELP = ("Collect events and counters only this fraction of the time (e.g. 0.1 or 10%; 1 = every event). "
               "Default: 10% for a view (what attaching costs the target is per event in the driver: every event "
               "made a fault-heavy PyTorch loop ~16% slower on the H100, a 10% sample left it within noise; "
               "docs/live.md); every event with -o or --mode, which refuse less: a trace must replay and a "
               "controller must see every fault. Sampled totals are estimates, rankings are of the sample.")
