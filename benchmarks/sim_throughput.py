"""Simulator throughput: simulated GPU faults per second of wall time, one core.

Builds a GPT-2 XL-shaped training loop of about 10 million page accesses at 2x
oversubscription and replays it under each mode. Prints a table; asserts nothing (timings
depend on the machine). Usage:

    python3 benchmarks/sim_throughput.py [--accesses 10M] [--modes none,oracle] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from rich.console import Console
from rich.table import Table

from umctl.controller import make_controller
from umctl.sim.engine import simulate
from umctl.sources.scenario import load_scenario
from umctl.units import format_bytes


def dnn_workload(accesses: int, oversub: float, iterations: int = 3):
    """gpt2-xl with the simulated GPU size chosen so the loop makes ~`accesses` accesses."""
    probe = load_scenario("gpt2-xl", {"oversub": str(oversub), "iterations": "1"})
    gpu_mem = int(probe.gpu_mem[0] * accesses / (iterations * probe.n_accesses))
    gpu_mem = max(64 << 20, gpu_mem // (2 << 20) * (2 << 20))
    return load_scenario("gpt2-xl", {"oversub": str(oversub), "iterations": str(iterations),
                                     "gpu_mem": str(gpu_mem)})


def _count(text: str) -> int:
    """'10M' -> 10_000_000 (decimal: these are counts, not sizes)."""
    mult = {"K": 10**3, "M": 10**6, "G": 10**9}.get(text[-1].upper())
    return int(float(text[:-1]) * mult) if mult else int(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--accesses", default="10M", help="target page accesses (e.g. 10M)")
    ap.add_argument("--oversub", type=float, default=2.0)
    ap.add_argument("--modes", default="none,oracle")
    ap.add_argument("--repeat", type=int, default=3, help="runs per mode; the best wall time is kept")
    args = ap.parse_args()
    target = _count(args.accesses)
    t0 = time.perf_counter()
    w = dnn_workload(target, args.oversub)
    gen_s = time.perf_counter() - t0
    con = Console(width=max(120, Console().width))
    con.print(f"[bold]{w.name}[/bold]: {w.n_accesses:,} page accesses, {len(w.kernels):,} kernels, "
              f"{format_bytes(w.managed_bytes)} managed on a {format_bytes(w.gpu_mem[0])} GPU "
              f"({w.managed_bytes / w.gpu_mem[0]:.2f}× oversubscribed); generated in {gen_s:.2f} s")
    t = Table(title=f"simulator throughput, one core ({platform.processor() or platform.machine()}, "
                    f"{os.cpu_count()} CPUs visible)", title_justify="left")
    for col in ("mode", "sim time", "GPU faults", "batches", "wall (best)", "faults/s", "accesses/s"):
        t.add_column(col, justify="right")
    for mode in args.modes.split(","):
        best = None
        for _ in range(args.repeat):
            r = simulate(w, make_controller(mode))
            if best is None or r.wall_s < best.wall_s:
                best = r
        t.add_row(mode, f"{best.time_s:.3f} s", f"{best.faults:,}", f"{best.fault_batches:,}",
                  f"{best.wall_s:.3f} s", f"{best.faults / best.wall_s / 1e6:.2f} M",
                  f"{best.accesses / best.wall_s / 1e6:.1f} M")
    con.print(t)


if __name__ == "__main__":
    main()
