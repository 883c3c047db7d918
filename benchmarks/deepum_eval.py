"""DeepUM on replay: fault removal and speedup against none and oracle, at several
oversubscription ratios (issue 3's acceptance table). Prints a table; asserts nothing.

    python3 benchmarks/deepum_eval.py [--scenarios gpt2-xl,bert-large,...] [--ratios 1.5,2,3] [--iters 5]
                                      [--param peak_tflops=2]

Steady state = the iterations after the first (DeepUM's tables are empty in the first one;
the paper reports training throughput, i.e. steady state). "oracle removed" is the share of
none's faults the oracle (the whole future known, Belady's eviction) removes; it plans for
time, not for faults (it discards dead allocator blocks at once, and keeps the host-to-GPU
queue short), so deepum can fault less than it. What the oracle leaves is mostly prefetches
still in flight: the link and the room the GPU-to-host write-back makes. The last columns charge
deepum's steady faults to their causes (umctl.sim.core.FAULT_CAUSES): prefetches still in
flight when the kernel got there, blocks DeepUM's pre-eviction sent away that came back, and
the rest (driver evictions, discards, first touches).
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from umctl.sim.replay import result_rows, run_modes
from umctl.sources.scenario import load_scenario


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", default="gpt2-xl,gpt2-l,bert-large,resnet152,dlrm")
    ap.add_argument("--ratios", default="1.5,2,3")
    ap.add_argument("--iters", default="5")
    ap.add_argument("--gpu-mem", default=None)
    ap.add_argument("--param", "-p", action="append", default=[], metavar="KEY=VALUE",
                    help="scenario parameter, e.g. peak_tflops=2 for a compute-bound regime (repeatable)")
    args = ap.parse_args()
    if any("=" not in p for p in args.param):
        ap.error("--param takes KEY=VALUE")
    params = dict(p.split("=", 1) for p in args.param)
    t = Table(title="DeepUM vs none and oracle (simulated H100, PCIe 5)", title_justify="left")
    for col in ("scenario", "oversub", "none faults/iter", "deepum faults/iter", "faults removed",
                "oracle removed", "deepum speedup", "oracle speedup", "of oracle's", "steady: deepum", "oracle",
                "of oracle's", "deepum left: late", "pre-evicted", "other"):
        t.add_column(col, justify="right")
    for name in args.scenarios.split(","):
        for ratio in args.ratios.split(","):
            ov = {**params, "oversub": ratio, "iterations": args.iters}
            if args.gpu_mem:
                ov["gpu_mem"] = args.gpu_mem
            rows = {r["mode"]: r for r in result_rows(run_modes(load_scenario(name, ov), ["none", "deepum", "oracle"]))}
            n, d, o = rows["none"], rows["deepum"], rows["oracle"]
            frac = (d["speedup"] - 1) / (o["speedup"] - 1) if o["speedup"] > 1 else float("nan")
            sfrac = ((d["steady_speedup"] - 1) / (o["steady_speedup"] - 1)
                     if o["steady_speedup"] and o["steady_speedup"] > 1 else float("nan"))
            removed = 1 - d["steady_faults_per_iter"] / n["steady_faults_per_iter"]
            o_removed = 1 - o["steady_faults_per_iter"] / n["steady_faults_per_iter"]
            c = d["steady_fault_causes_per_iter"]
            left = d["steady_faults_per_iter"] or 1.0
            late, pre = c["late_prefetch"], c["preevicted"]
            t.add_row(name, ratio, f"{n['steady_faults_per_iter']:,.0f}", f"{d['steady_faults_per_iter']:,.0f}",
                      f"{100 * removed:.1f} %", f"{100 * o_removed:.1f} %", f"{d['speedup']:.2f}×",
                      f"{o['speedup']:.2f}×", f"{100 * frac:.0f} %", f"{d['steady_speedup']:.2f}×",
                      f"{o['steady_speedup']:.2f}×", f"{100 * sfrac:.0f} %", f"{100 * late / left:.0f} %",
                      f"{100 * pre / left:.0f} %", f"{100 * (left - late - pre) / left:.0f} %")
    Console(width=240).print(t)


if __name__ == "__main__":
    main()
