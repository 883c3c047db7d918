"""HUM on ordinary CUDA programs (issue 6, 5b): builds benchmarks/gpu/workloads/hum/{vadd,stencil,gesummv}.cu
with nvcc (shared libcudart, so the runtime can interpose it), runs each plainly and under
`umctl run --mode hum`, alternating, and prints the median times, the speedups and whether the
result hashes match. Needs nvcc, an NVIDIA GPU and root (umctl run attaches the tools API).

    python3 benchmarks/gpu/hum_programs.py [--reps 3] [--ablation]

Two times per run, both printed by the program itself: GPU_MS (device allocations, copies,
kernels, result back: the run less input generation, which stands in for the file I/O the
paper leaves out of its timings) and TIME_MS (everything, input generation included).
--ablation adds one worker without pinned staging (the path before pinned staging), one worker
and 4 workers with it (the default is 8, UMCTL_RT_HUM_THREADS). --stats prints the runtime's
counters of each HUM run (UMCTL_RT_STATS: staging, protection and per-copy times).
--config NAME=VAR=VAL[,VAR=VAL] adds a configuration of runtime variables (repeatable);
LIBRARY=path.so in it preloads that build of the runtime directly instead of `umctl run`."""

from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = ("vadd", "stencil", "gesummv")
LINE = re.compile(r"^(\w+) TIME_MS ([\d.]+) GPU_MS ([\d.]+) HASH (\w+)", re.M)


STATS = re.compile(r"^umctl_rt: pid=\d+ (.*)$", re.M)


def run(cmd: list[str], env: dict[str, str] | None = None, label: str = "") -> tuple[float, float, str]:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    m = LINE.search(p.stdout)
    if p.returncode or not m:
        sys.exit(f"{' '.join(cmd)} failed (rc {p.returncode}): {(p.stderr or p.stdout)[-400:]}")
    for st in STATS.findall(p.stderr):
        print(f"STATS {label} GPU_MS {m.group(3)}: {st}", flush=True)
    return float(m.group(2)), float(m.group(3)), m.group(4)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ablation", action="store_true")
    ap.add_argument("--stats", action="store_true")
    ap.add_argument("--config", action="append", default=[], metavar="NAME=VAR=VAL[,VAR=VAL]")
    ap.add_argument("--programs", default=",".join(PROGRAMS))
    a = ap.parse_args()
    build = Path(tempfile.mkdtemp(prefix="umctl_hum_"))
    configs = [("hum", {})]
    if a.ablation:
        configs += [("1 worker, pageable DMA", {"UMCTL_RT_HUM_THREADS": "1", "UMCTL_RT_HUM_PINNED": "0"}),
                    ("1 worker, pinned", {"UMCTL_RT_HUM_THREADS": "1"}),
                    ("4 workers, pinned", {"UMCTL_RT_HUM_THREADS": "4"})]
    for spec in a.config:
        name, _, assigns = spec.partition("=")
        configs.append((name, dict(kv.split("=", 1) for kv in assigns.split(",") if "=" in kv)))
    stats = {"UMCTL_RT_STATS": "1"} if a.stats else {}
    rows, speedups = [], []
    for prog in a.programs.split(","):
        exe = build / prog
        subprocess.run(["nvcc", "-O3", "-arch=sm_90", "-cudart", "shared", "-o", str(exe),
                        str(ROOT / "tests" / "gpu" / "hum" / f"{prog}.cu")], check=True)
        res: dict[str, list[tuple[float, float, str]]] = {"plain": []}
        for _ in range(a.reps):
            res["plain"].append(run([str(exe)]))
            for name, extra in configs:
                if "LIBRARY" in extra:   # another build of the runtime, preloaded directly (A/B of a change)
                    env = {**os.environ, **stats, "UMCTL_RT_HUM": "1", "LD_PRELOAD": extra["LIBRARY"],
                           **{k: v for k, v in extra.items() if k != "LIBRARY"}}
                    cmd = [str(exe)]
                else:
                    env, cmd = {**os.environ, **stats, **extra}, ["umctl", "run", "--mode", "hum", "-q", "--", str(exe)]
                res.setdefault(name, []).append(run(cmd, env=env, label=f"{prog} {name}"))
        base_gpu = statistics.median(r[1] for r in res["plain"])
        base_all = statistics.median(r[0] for r in res["plain"])
        hashes = {r[2] for rs in res.values() for r in rs}
        for name, rs in res.items():
            g, t = statistics.median(r[1] for r in rs), statistics.median(r[0] for r in rs)
            rows.append((prog, name, g, base_gpu / g, t, base_all / t, "yes" if len(hashes) == 1 else "NO"))
            if name == "hum":
                speedups.append(base_gpu / g)
    print(f"\nmedians of {a.reps} alternating runs; speedup = plain / config")
    print(f"{'program':<9}{'config':<24}{'GPU_MS':>9}{'x':>7}{'TIME_MS':>10}{'x':>7}{'same result':>13}")
    for prog, name, g, sg, t, st, same in rows:
        print(f"{prog:<9}{name:<24}{g:>9.1f}{sg:>6.2f}x{t:>10.1f}{st:>6.2f}x{same:>13}")
    gm = math.exp(sum(map(math.log, speedups)) / len(speedups))
    print(f"HUM over plain CUDA (GPU_MS): mean {statistics.mean(speedups):.2f}x, geometric mean {gm:.2f}x "
          "(paper: 1.21x on 51 applications, V100)")


if __name__ == "__main__":
    main()
