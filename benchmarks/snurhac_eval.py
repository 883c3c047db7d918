"""SnuRHAC on the multigpu scenarios: the thesis's variant comparison and scaling table.

Prints (1) per program at ``--gpus`` GPUs, the speedup of SnuRHAC / -SP / -SP-DP over the
program on one GPU as written (mode ``none``: CUDA without UM, the thesis's baseline; figure
7.9's bars at one GPU count), (2) the scaling of SnuRHAC-SP-DP over 1, 2, 4 and 8 GPUs (figure
7.9's curves), and (3) the one-GPU overhead of the three variants (table 7.11).

    PYTHONPATH=. python3 benchmarks/snurhac_eval.py [--gpus 4] [--programs mgpu-gemm,...]
"""

from __future__ import annotations

import argparse
import time

from umctl.controller import make_controller
from umctl.sim.engine import simulate
from umctl.sources.scenario import list_scenarios, load_scenario

VARIANTS = ["snurhac", "snurhac-sp", "snurhac-sp-dp"]


def run(name: str, gpus: int, mode: str, **opts) -> float:
    w = load_scenario(name, {"gpus": str(gpus)})
    return simulate(w, make_controller(mode, **opts)).time_ns


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=4)
    ap.add_argument("--programs", default=",".join(i.name for i in list_scenarios("multigpu")))
    a = ap.parse_args()
    progs = a.programs.split(",")
    t0 = time.perf_counter()
    base = {p: run(p, 1, "none") for p in progs}

    print(f"Speedup over the program on one GPU (CUDA, no UM), {a.gpus} GPUs (figure 7.9)\n")
    print(f"| program | {' | '.join(VARIANTS)} |\n| --- |" + " ---: |" * len(VARIANTS))
    for p in progs:
        print(f"| {p} | " + " | ".join(f"{base[p] / run(p, a.gpus, m):.2f}" for m in VARIANTS) + " |")

    counts = [1, 2, 4, 8]
    print("\nScaling of snurhac-sp-dp: speedup over the program on one GPU (figure 7.9)\n")
    print("| program | " + " | ".join(f"{g} GPU" for g in counts) + " |\n| --- |" + " ---: |" * len(counts))
    for p in progs:
        cells = [base[p] / run(p, g, "snurhac-sp-dp", single_gpu=g == 1) for g in counts]
        print(f"| {p} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")

    print("\nOne GPU: speedup of each variant over CUDA (table 7.11)\n")
    print(f"| program | {' | '.join(VARIANTS)} |\n| --- |" + " ---: |" * len(VARIANTS))
    for p in progs:
        print(f"| {p} | " + " | ".join(f"{base[p] / run(p, 1, m, single_gpu=True):.3f}" for m in VARIANTS) + " |")
    print(f"\n(wall {time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
