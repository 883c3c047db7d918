"""GPU benchmark: live control of a real process under a soft residency budget.

Runs benchmarks/gpu/workloads/wl_layers.py (layers x MiB of managed memory, iterated) four ways:
  plain                 no umctl, footprint fits the GPU (the lower bound)
  none  --budget B      umctl's LRU eviction at the budget, no prefetch (naive UM at B)
  deepum --budget B     DeepUM's prefetch + pre-eviction at the same budget
  deepum-prefetch -B    prefetch only (ablation)
and prints a table of steady iteration time (median of iterations after the first two),
faults, commands and bytes moved. Usage: python3 benchmarks/gpu/bench_control.py [--budget 1GiB]
"""

import argparse
import re
import statistics
import subprocess
import sys


def run(cmd: list[str], timeout: float) -> tuple[str, str, int]:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return p.stdout, p.stderr, p.returncode


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", default="1GiB")
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--mib", type=int, default=128)
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--modes", default="none,deepum,deepum-prefetch", help="mode[@degree][+rt],...")
    ap.add_argument("--no-plain", action="store_true")
    ap.add_argument("--spare-gpus", type=int, default=1, help="for mode harvest")
    ap.add_argument("--sync-each", action="store_true", help="workload synchronises after every kernel")
    a = ap.parse_args()
    wl = [sys.executable, "benchmarks/gpu/workloads/wl_layers.py", "--layers", str(a.layers), "--mib", str(a.mib),
          "--iters", str(a.iters)] + (["--sync-each"] if a.sync_each else []) + (
          ["--register-gpus", str(1 + a.spare_gpus)] if "harvest" in a.modes else [])
    rows = []
    def umctl(spec: str) -> list[str]:
        """'deepum@4' = mode deepum with --degree 4."""
        rt = spec.endswith("+rt")   # launches and allocations from the preloaded runtime
        mode, _, degree = spec.removesuffix("+rt").partition("@")
        spare = ["--spare-gpus", str(a.spare_gpus)] if mode == "harvest" else []
        return (["umctl", "run", "--mode", mode, "--budget", a.budget, "-q"] + spare
                + (["--degree", degree] if degree else []) + (["--runtime"] if rt else []) + ["--"])

    configs = [("plain", wl)] + [(m, umctl(m) + wl) for m in a.modes.split(",")]
    for name, cmd in configs[1:] if a.no_plain else configs:
        out, err, rc = run(cmd, 240)
        iters = [float(x) for x in re.findall(r"^ITER \d+ ([\d.]+)", out, re.M)]
        ok = "check ok" in out
        faults = re.search(r"GPU faults\s+([\d,]+)", out)
        ctl = re.search(r"control\s+mode .*", out)
        bud = re.search(r"budget\s+.*", out)
        steady = statistics.median(iters[2:]) if len(iters) > 2 else float("nan")
        rows.append((name, rc, ok, iters[0] if iters else float("nan"), steady,
                     faults.group(1) if faults else "-", ctl.group(0) if ctl else "", bud.group(0) if bud else ""))
        print(f"--- {name} rc={rc}: {' '.join(cmd[:8])} ...", flush=True)
        print("\n".join(l for l in out.splitlines() if not l.startswith("ITER")), flush=True)
        if rc:
            print(err[-2000:], flush=True)
    print(f"\nbudget {a.budget}, footprint {a.layers * a.mib} MiB, {a.iters} iterations")
    print(f"{'config':<18}{'rc':>4}{'check':>7}{'iter0 ms':>10}{'steady ms':>11}{'GPU faults':>13}")
    base = next((r[4] for r in rows if r[0] == "none"), None)
    for r in rows:
        sp = f"  {base / r[4]:.2f}x vs none" if base and r[4] == r[4] and r[4] > 0 else ""
        print(f"{r[0]:<18}{r[1]:>4}{str(r[2]):>7}{r[3]:>10.1f}{r[4]:>11.1f}{r[5]:>13}{sp}")
    for r in rows:
        if r[6]:
            print(f"{r[0]}: {r[6]}\n    {r[7]}")


if __name__ == "__main__":
    main()
