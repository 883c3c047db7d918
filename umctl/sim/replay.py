"""Replay a target (scenario or trace file) under several controller modes, side by side.

The same :class:`~umctl.sim.engine.Simulator` runs every mode with the same seed, so the
differences between rows come from the policies alone.
"""

from __future__ import annotations

import gc
from typing import Callable

from .. import UmctlError
from ..controller.base import available_modes, make_controller
from ..controller.options import parse_mode_options  # noqa: F401 - benchmarks and notebooks import it here
from ..workload.target import is_trace_path, resolve_target  # noqa: F401 - the same
from ..results import ReplayResult
from ..workload.workload import Workload
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
              drain_ns: int | None = None, timeline: bool = False,
              max_rss: int | str | None = None, budget_bytes: int | None = None) -> list[SimResult]:
    """Simulate the workload once per mode (same seed), one mode at a time: a mode's
    simulator and controller are let go before the next one is built.

    ``max_rss``: refuse up front (one-line UmctlError) a replay whose estimated peak resident
    memory (:func:`estimate_bytes`) is over this many bytes; ``"auto"``: over what the machine
    has available (:func:`default_max_rss`); None: no check. Running out of memory anyway is
    an UmctlError too, never a numpy traceback.

    ``budget_bytes``: every mode runs under the live soft budget (the control loop's keeper
    evicts what goes over it; the simulated GPUs keep their size); see :func:`check_budget`."""
    results = []
    extra = {} if drain_ns is None else {"drain_ns": int(drain_ns)}
    if timeline:
        extra["timeline"] = True
    if budget_bytes is not None:
        check_budget(workload, budget_bytes)
        extra["budget_bytes"] = int(budget_bytes)
    ctls = [make_controller(mode, **(mode_options or {}).get(mode, {})) for mode in modes]
    for mode, ctl in zip(modes, ctls):
        why = ctl.applies_to(workload)
        if why:
            raise UmctlError(f"mode {mode} does not apply to {workload.name}: {why}")
    if max_rss is not None:
        check_memory(workload, modes, max_rss)
    for j, mode in enumerate(modes):
        # the controller's context holds the simulator (residency, Belady keys): drop both
        # once the mode is done, or every mode's state would stay alive to the end
        ctl, ctls[j] = ctls[j], None
        cb = (lambda done, total, m=mode: progress(m, done, total)) if progress else None
        rec = recorder_for(mode) if recorder_for else None
        sim = None
        try:
            sim = Simulator(workload, ctl, calib=calib, seed=seed, progress=cb, recorder=rec, **extra)
            results.append(sim.run())
        except MemoryError:
            sim = ctl = None
            need = estimate_bytes(workload, [mode])
            raise UmctlError(f"out of memory replaying {workload.name} under mode {mode} (this replay needs "
                             f"about {_gib(need)}, {_gib(_available())} was available); free memory or "
                             "make the workload smaller (--iters, --param batch=...)") from None
        finally:
            if rec is not None:
                rec.close()
            del sim, ctl
            gc.collect()   # simulator and controller refer to each other: a cycle
    return results


def check_budget(workload: Workload, budget_bytes: int) -> None:
    """A replay's soft budget must be at least one 2 MiB block and below the smallest simulated
    GPU: at or above it, the GPU's own size is the limit and the budget would change nothing
    (that is ``--gpu-mem``). One-line UmctlError otherwise."""
    from ..units import BLOCK_SIZE, format_bytes

    if budget_bytes < BLOCK_SIZE:
        raise UmctlError(f"--budget must be at least 2 MiB (got {format_bytes(budget_bytes)})")
    smallest = min(int(m) for m in workload.gpu_mem)
    if budget_bytes >= smallest:
        raise UmctlError(f"--budget {format_bytes(budget_bytes)} is not below the simulated GPU's "
                         f"{format_bytes(smallest)}: the GPU's size is the limit already (--gpu-mem sets it)")


# ---------------------------------------------------------------------- memory
#: What a replay holds, in bytes per unit, rounded up from /proc/self/status VmHWM per mode
#: on GPT-2 XL at full scale (batch 5, 2 iterations: 277 M accesses in 0.56 M runs, 32 M
#: pages): per access run of the simulator (runs cut at 2 MiB blocks; set-up temporaries
#: included), per simulated page (the per-page state, 19 B with every array touched), per
#: 2 MiB block and GPU, per operation (records, per-op tables), and on top of that what
#: each mode's controller keeps. Measured there: none +346 MiB, deepum +558 MiB (its
#: prefetches touch more of the per-page state), oracle (see _MODE_PER_RUN).
_PER_RUN = 120
_PER_PAGE = 20
_PER_BLOCK = 96
_PER_OP = 900
_MODE_PER_RUN = {"oracle": 240}
#: modes that rewrite the workload from its flat per-access stream (hum, snurhac)
_MODE_PER_ACCESS = {"hum": 48, "snurhac": 64}
_MODE_PER_BLOCK = {"deepum": 1024}
_BASE = 64 << 20   # the modes' fixed tables and buffers


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def _proc_status(key: str) -> int | None:
    """A size in bytes from /proc/self/status (VmRSS, VmHWM); None where there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _available() -> int:
    """MemAvailable of the machine (bytes); a large number where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 50


#: share of the available memory a replay may plan to use by default
AVAILABLE_SHARE = 0.8


def default_max_rss() -> int:
    """What a replay may reach without --max-rss: what the process holds now plus
    ``AVAILABLE_SHARE`` of the machine's MemAvailable."""
    return int((_proc_status("VmRSS") or 0) + AVAILABLE_SHARE * _available())


def estimate_bytes(workload: Workload, modes: list[str]) -> int:
    """Estimated peak memory that replaying ``modes`` adds to the process (the modes run one
    after another, so the largest of them), from the workload's size: its access runs,
    pages, blocks and operations. Cheap: nothing is expanded."""
    import numpy as np

    from ..units import BLOCK_SHIFT, PAGE_TO_BLOCK_SHIFT, PAGES_PER_BLOCK

    r = workload.acc_runs
    first = r.page >> PAGE_TO_BLOCK_SHIFT
    runs = int(((r.page + r.length - 1) >> PAGE_TO_BLOCK_SHIFT).sum() - first.sum()) + len(r)
    a = workload.allocations
    addr = a["addr"].astype(np.int64)
    blocks = int((((addr + np.maximum(a["bytes"].astype(np.int64), 1) - 1) >> BLOCK_SHIFT)
                  - (addr >> BLOCK_SHIFT) + 1).sum()) if len(a) else len(np.unique(first))
    G = max(1, workload.n_gpus)
    base = (_BASE + runs * _PER_RUN + blocks * PAGES_PER_BLOCK * _PER_PAGE * (1 + (G > 8))
            + blocks * G * _PER_BLOCK + len(workload.ops) * _PER_OP)
    worst = 0
    for m in modes:
        fam = m.split("-")[0]
        extra = (runs * _MODE_PER_RUN.get(fam, 0) + workload.n_accesses * _MODE_PER_ACCESS.get(fam, 0)
                 + blocks * G * _MODE_PER_BLOCK.get(fam, 0))
        worst = max(worst, extra)
    return int(base + worst)


def parse_max_rss(text: str | None) -> int | str:
    """``--max-rss``: a size (512MiB, 4GiB), ``auto`` or nothing (the machine's available
    memory: :func:`default_max_rss`)."""
    if text is None or str(text).strip().lower() == "auto":
        return "auto"
    from ..units import parse_size

    try:
        n = parse_size(text)
    except ValueError as e:
        raise UmctlError(f"--max-rss: {e}") from None
    if n <= 0:
        raise UmctlError("--max-rss must be more than 0 bytes")
    return n


def check_memory(workload: Workload, modes: list[str], max_rss: int | str) -> int:
    """Refuse (UmctlError, one line) a replay that would not fit: the process's resident
    memory now plus :func:`estimate_bytes` over ``max_rss`` (bytes, or ``"auto"``:
    :func:`default_max_rss`). Returns the estimated peak."""
    now = _proc_status("VmRSS") or 0
    need = now + estimate_bytes(workload, modes)
    if max_rss == "auto":
        limit = default_max_rss()
        if need > limit:
            raise UmctlError(f"this replay needs about {_gib(need)} of memory and about {_gib(limit)} is available "
                             f"({AVAILABLE_SHARE:.0%} of MemAvailable); free memory, make the workload smaller "
                             "(--iters, --param batch=...) or set --max-rss to run it anyway")
    else:
        limit = int(max_rss)
        if need > limit:
            raise UmctlError(f"this replay needs about {_gib(need)}; --max-rss is {_gib(limit)} "
                             "(make the workload smaller: --iters, --param batch=...; or raise --max-rss)")
    return need


def replay_results(rows: list[dict], calibration: str) -> list[ReplayResult]:
    """The typed results (what ``umctl replay --json`` prints, one per mode) of
    :func:`result_rows`' rows; ``calibration`` is the calibration's name. The fields, their
    order and their JSON schema are :class:`~umctl.results.ReplayResult`'s."""
    return [ReplayResult.from_row(r, calibration) for r in rows]


def workload_bound(workload: Workload, calib=None):
    """The lower bound on any replay of ``workload`` (:mod:`umctl.sim.bound`), computed on the
    workload as given (before a mode's own preparation), or None where the bound does not
    apply (several GPUs)."""
    from .bound import replay_bound
    from .calibration import DEFAULT

    if workload.n_gpus != 1:
        return None
    try:
        return replay_bound(workload, calib if calib is not None else DEFAULT)
    except ValueError:
        return None


def result_rows(results: list[SimResult], bound=None) -> list[dict]:
    """One JSON-able dict per mode, with speedup over ``none`` (the first row): every figure
    of the simulator's result (more than :class:`~umctl.results.ReplayResult` holds; tests
    and benchmarks read the rest), for :func:`replay_results`; with ``bound``
    (:func:`workload_bound`), each mode's time as a percentage of it."""
    base = next((r for r in results if r.mode == "none"), results[0])
    rows = []
    for r in results:
        d = r.summary()
        d["speedup"] = base.time_ns / r.time_ns if r.time_ns else None
        d["steady_speedup"] = (base.steady_time_ns / r.steady_time_ns
                               if r.steady_time_ns and base.steady_time_ns else None)
        d["workload"] = r.workload
        if bound is not None and bound.time_ns > 0:
            d["bound_s"] = bound.time_ns / 1e9
            d["pct_of_bound"] = 100.0 * r.time_ns / bound.time_ns
        rows.append(d)
    return rows
