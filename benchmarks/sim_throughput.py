"""Simulator throughput: simulated GPU faults per second of wall time, one core.

Builds a GPT-2 XL-shaped training loop of about 10 million page accesses at 2x
oversubscription and replays it under each mode; then, unless ``--no-full``, one GPT-2 XL
iteration at the DeepUM paper's scale (batch 3, unscaled fp32 tensors on a 32 GB V100, the
v100-pcie3 calibration; ~90 M accesses, ~10 M faults). Wall time counts the replay's set-up
(the workload's generation is printed apart). Prints a table; asserts nothing (timings depend
on the machine). Usage:

    python3 benchmarks/sim_throughput.py [--accesses 10M] [--modes none,deepum] [--repeat 3] [--no-full]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from rich.console import Console
from rich.table import Table

from umctl.controller import make_controller
from umctl.sim.calibration import Calibration
from umctl.sim.engine import simulate
from umctl.workload.scenario import load_scenario
from umctl.units import format_bytes


def dnn_workload(accesses: int, oversub: float, iterations: int = 3):
    """gpt2-xl with the simulated GPU size chosen so the loop makes ~`accesses` accesses."""
    probe = load_scenario("gpt2-xl", {"oversub": str(oversub), "iterations": "1"})
    gpu_mem = int(probe.gpu_mem[0] * accesses / (iterations * probe.n_accesses))
    gpu_mem = max(64 << 20, gpu_mem // (2 << 20) * (2 << 20))
    return load_scenario("gpt2-xl", {"oversub": str(oversub), "iterations": str(iterations),
                                     "gpu_mem": str(gpu_mem)})


def full_scale_workload():
    """One GPT-2 XL iteration as the DeepUM paper ran it (batch 3 on a 32 GB V100)."""
    return load_scenario("gpt2-xl", {"scale": "full", "gpu_mem": "32GiB", "iterations": "1", "batch": "3"})


def _count(text: str) -> int:
    """'10M' -> 10_000_000 (decimal: these are counts, not sizes)."""
    mult = {"K": 10**3, "M": 10**6, "G": 10**9}.get(text[-1].upper())
    return int(float(text[:-1]) * mult) if mult else int(text)


def _describe(con: Console, label: str, w, gen_s: float) -> None:
    con.print(f"[bold]{label}[/bold]: {w.n_accesses:,} page accesses in {len(w.acc_runs):,} runs, "
              f"{len(w.kernels):,} kernels, {format_bytes(w.managed_bytes)} managed on a "
              f"{format_bytes(w.gpu_mem[0])} GPU ({w.managed_bytes / w.gpu_mem[0]:.2f}× oversubscribed); "
              f"generated in {gen_s:.2f} s")


def _rows(t: Table, label: str, w, modes: list[str], repeat: int, **kw) -> None:
    for mode in modes:
        best = None
        for _ in range(repeat):
            r = simulate(w, make_controller(mode), **kw)
            if best is None or r.wall_s < best.wall_s:
                best = r
        t.add_row(label, mode, f"{best.time_s:.3f} s", f"{best.faults:,}", f"{best.fault_batches:,}",
                  f"{best.wall_s:.3f} s", f"{best.faults / best.wall_s / 1e6:.2f} M",
                  f"{best.accesses / best.wall_s / 1e6:.1f} M")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--accesses", default="10M", help="target page accesses (e.g. 10M)")
    ap.add_argument("--oversub", type=float, default=2.0)
    ap.add_argument("--modes", default="none,deepum")
    ap.add_argument("--repeat", type=int, default=3, help="runs per mode; the best wall time is kept")
    ap.add_argument("--no-full", action="store_true", help="skip the full-scale GPT-2 XL iteration")
    args = ap.parse_args()
    modes = args.modes.split(",")
    con = Console(width=max(120, Console().width))
    t = Table(title=f"simulator throughput, one core ({platform.processor() or platform.machine()}, "
                    f"{os.cpu_count()} CPUs visible)", title_justify="left")
    for col in ("workload", "mode", "sim time", "GPU faults", "batches", "wall (best)", "faults/s", "accesses/s"):
        t.add_column(col, justify="right")

    t0 = time.perf_counter()
    w = dnn_workload(_count(args.accesses), args.oversub)
    _describe(con, w.name, w, time.perf_counter() - t0)
    _rows(t, f"{w.n_accesses / 1e6:.0f} M acc.", w, modes, args.repeat)
    if not args.no_full:
        t0 = time.perf_counter()
        w = full_scale_workload()
        _describe(con, "gpt2-xl, full scale", w, time.perf_counter() - t0)
        _rows(t, "full scale", w, modes, args.repeat, calib=Calibration.load("v100-pcie3"))
    con.print(t)


if __name__ == "__main__":
    main()
