"""GPU benchmark: a PyTorch training loop on managed memory under a soft budget
of about half its footprint. Configurations: plain torch; under the runtime with managed
routing and no budget; `none --budget` (LRU at the budget); `deepum --budget`. Prints steady
step time (median of steps 3..), GPU faults, what umctl moved, and the parameter checksum,
which must be the same everywhere.   python3 benchmarks/gpu/bench_torch_control.py [--budget 512MiB]"""

import argparse
import re
import statistics
import subprocess
import sys


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", default="512MiB")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--modes", default="none,deepum",
                    help="comma-separated; MODE+FLAG adds --FLAG to that run (e.g. deepum+gate)")
    ap.add_argument("--degrees", default="", help="deepum modes: one run per degree N (e.g. 32,8)")
    ap.add_argument("--no-baselines", action="store_true", help="skip plain torch and the no-budget run")
    ap.add_argument("--umctl-args", default="", help="extra umctl run arguments for the budget runs "
                    "(e.g. '--budget-sweep 0')")
    ap.add_argument("--allocator", choices=("torch", "umctl"), default="torch",
                    help="umctl: every tensor through the runtime's pluggable allocator (freed blocks "
                         "reported inactive, so DeepUM may invalidate them); plain torch keeps its own")
    a = ap.parse_args()
    wl = [sys.executable, "benchmarks/gpu/workloads/wl_torch_train.py", "--steps", str(a.steps)]
    wl_plain = list(wl)
    if a.allocator == "umctl":
        wl += ["--allocator", "umctl"]
    rt = ["umctl", "run", "-q", "--runtime", "--managed"]
    configs = [] if a.no_baselines else [("plain torch", wl_plain), ("runtime, managed, no budget", rt + ["--"] + wl)]
    for spec in a.modes.split(","):
        m, *flags = spec.split("+")
        for d in (a.degrees.split(",") if a.degrees and m.startswith("deepum") else [""]):
            extra = (["--degree", d] if d else []) + [f"--{f}" for f in flags]
            configs.append((f"{spec}{' N=' + d if d else ''} --budget {a.budget}",
                            rt + ["--mode", m, "--budget", a.budget, *extra, *a.umctl_args.split(), "--"] + wl))
    rows = []
    for name, cmd in configs:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        steps = [float(x) for x in re.findall(r"^STEP \d+ ([\d.]+)", p.stdout, re.M)]
        done = re.search(r"^DONE ([\d.]+) (\w+)", p.stdout, re.M)
        faults = re.search(r"GPU faults\s+([\d,]+)", p.stdout)
        ctl = re.search(r"control\s+mode .*", p.stdout)
        bud = re.search(r"budget\s+\S+: .*", p.stdout)
        print(f"--- {name} rc={p.returncode}")
        print("\n".join(l for l in p.stdout.splitlines() if not l.startswith("STEP"))[-2500:])
        if p.returncode:
            print(p.stderr[-1500:])
        rows.append((name, p.returncode, statistics.median(steps[2:]) if len(steps) > 2 else float("nan"),
                     done.group(2) if done else "-", faults.group(1) if faults else "-"))
    print(f"\nbudget {a.budget}, {a.steps} steps")
    print(f"{'config':<32}{'rc':>4}{'step ms':>10}{'checksum':>19}{'GPU faults':>13}")
    for r in rows:
        print(f"{r[0]:<32}{r[1]:>4}{r[2]:>10.1f}{r[3]:>19}{r[4]:>13}")


if __name__ == "__main__":
    main()
