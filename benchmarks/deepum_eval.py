"""DeepUM on replay: fault removal and speedup against none and oracle, at several
oversubscription ratios (issue 3's acceptance table). Prints a table; asserts nothing.

    python3 benchmarks/deepum_eval.py [--scenarios gpt2-xl,bert-large,...] [--ratios 1.5,2,3] [--iters 5]
                                      [--skip 1] [--param peak_tflops=2] [-O deepum.degree=64]

Steady state = the iterations after the first --skip (default 1: DeepUM's tables are empty
in the first one; they go on learning for ~10 iterations, so the paper's trained state, its
Table 5, is e.g. --iters 20 --skip 15). "oracle removed" is the share of
none's faults the oracle (the whole future known, Belady's eviction) removes; it plans for
time, not for faults (it discards dead allocator blocks at once, and keeps the host-to-GPU
queue short), so deepum can fault less than it. What the oracle leaves is mostly prefetches
still in flight: the link and the room the GPU-to-host write-back makes. The last columns charge
deepum's steady faults to their causes (umctl.sim.core.FAULT_CAUSES): prefetches still in
flight when the kernel got there, blocks DeepUM's pre-eviction sent away that came back, and
the rest (driver evictions, discards, first touches). "% of bound": each mode's whole-run
time over the workload's provable lower bound (umctl/sim/bound.py; 100 % is optimal).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from rich.console import Console
from rich.table import Table

from umctl import UmctlError
from umctl.sim.core import FAULT_CAUSES
from umctl.sim.engine import SimResult
from umctl.controller.options import parse_mode_options
from umctl.sim.replay import run_modes, workload_bound
from umctl.workload.scenario import load_scenario

MODES = ["none", "deepum", "oracle"]


def steady(r: SimResult, skip: int) -> tuple[float, float, np.ndarray]:
    """Faults per iteration, time (ns) per iteration and faults per iteration by cause, over
    the iterations after the first ``skip``."""
    f, e, c = r.iteration_faults, r.iteration_end_ns, r.iteration_fault_causes
    n = len(f) - skip
    return float(f[skip:].mean()), float(e[-1] - e[skip - 1]) / n, c[skip:].mean(axis=0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", default="gpt2-xl,gpt2-l,bert-large,resnet152,dlrm")
    ap.add_argument("--ratios", default="1.5,2,3")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--skip", type=int, default=1, help="iterations left out of the steady state (warm-up; "
                    "DeepUM's tables keep learning for ~10 iterations)")
    ap.add_argument("--gpu-mem", default=None)
    ap.add_argument("--param", "-p", action="append", default=[], metavar="KEY=VALUE",
                    help="scenario parameter, e.g. peak_tflops=2 for a compute-bound regime (repeatable)")
    ap.add_argument("--mode-opt", "-O", action="append", default=[], metavar="[MODE.]KEY=VALUE",
                    help="controller option as in umctl replay, e.g. deepum.degree=64 (repeatable)")
    args = ap.parse_args()
    if any("=" not in p for p in args.param):
        ap.error("--param takes KEY=VALUE")
    if not 1 <= args.skip < args.iters:
        ap.error("--skip must be at least 1 and less than --iters")
    params = dict(p.split("=", 1) for p in args.param)
    try:
        options = parse_mode_options(args.mode_opt, MODES)
    except UmctlError as e:
        sys.exit(f"deepum_eval.py: error: {e}")
    title = f"DeepUM vs none and oracle (simulated H100, PCIe 5), steady = iterations {args.skip + 1}-{args.iters}"
    if params or args.mode_opt:
        title += " — " + " ".join([f"{k}={v}" for k, v in params.items()] + args.mode_opt)
    t = Table(title=title, title_justify="left")
    for col in ("scenario", "oversub", "none faults/iter", "deepum faults/iter", "faults removed",
                "oracle removed", "deepum speedup", "oracle speedup", "of oracle's", "steady: deepum", "oracle",
                "of oracle's", "deepum left: late", "pre-evicted", "other", "% of bound: none", "deepum", "oracle"):
        t.add_column(col, justify="right")
    late_i, pre_i = FAULT_CAUSES.index("late_prefetch"), FAULT_CAUSES.index("preevicted")
    for name in args.scenarios.split(","):
        for ratio in args.ratios.split(","):
            ov = {**params, "oversub": ratio, "iterations": str(args.iters)}
            if args.gpu_mem:
                ov["gpu_mem"] = args.gpu_mem
            w = load_scenario(name, ov)
            lower = workload_bound(w)
            n, d, o = run_modes(w, MODES, mode_options=options)
            (nf, nt, _), (df, dt, dc), (of, ot, _) = (steady(r, args.skip) for r in (n, d, o))
            sp_d, sp_o = n.time_ns / d.time_ns, n.time_ns / o.time_ns
            ss_d, ss_o = nt / dt, nt / ot
            frac = (sp_d - 1) / (sp_o - 1) if sp_o > 1 else float("nan")
            sfrac = (ss_d - 1) / (ss_o - 1) if ss_o > 1 else float("nan")
            late, pre = dc[late_i], dc[pre_i]
            shares = ([f"{100 * x / df:.0f} %" for x in (late, pre, max(0.0, df - late - pre))] if df
                      else ["—"] * 3)
            t.add_row(name, ratio, f"{nf:,.0f}", f"{df:,.0f}", f"{100 * (1 - df / nf):.1f} %",
                      f"{100 * (1 - of / nf):.1f} %", f"{sp_d:.2f}×", f"{sp_o:.2f}×", f"{100 * frac:.0f} %",
                      f"{ss_d:.2f}×", f"{ss_o:.2f}×", f"{100 * sfrac:.0f} %", *shares,
                      *[f"{100 * r.time_ns / lower.time_ns:.0f} %" if lower is not None and lower.time_ns else "—"
                        for r in (n, d, o)])
    Console(width=240).print(t)


if __name__ == "__main__":
    main()
