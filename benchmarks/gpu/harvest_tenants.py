"""GPU benchmark: memHarvester's multi-tenant case on a real multi-GPU machine (HUVM case 1).

One harvester process on GPU 0 runs ``benchmarks/gpu/workloads/wl_layers.py`` (managed memory, iterated)
under a soft residency budget; the other GPUs each run their own job
(``benchmarks/gpu/workloads/wl_lender.py``, ordinary device memory) the whole time. The harvester runs:

  plain                          no umctl (its footprint fits: the lower bound)
  none --budget B                over-budget blocks evicted to the host (host-only pre-eviction)
  harvest --budget B --spare-gpus N-1
                                 evicted into the neighbours' spare memory (victim cache)

and the table gives the harvester's steady iteration time and speedup over host-only, and
each yielding job's iteration time while the harvester ran, against the same job alone
(median over the window; the harvester's ITER lines carry CLOCK_MONOTONIC stamps that the
jobs' logs are cut to). Never more managed memory than GPU 0 has free: the footprint is a few
GiB, and the budget makes it behave like a GPU with that much memory.

Both hold the budget by admission (``--hold admit``, the default; under umctl's runtime): a
miss is read remotely until umctl admits the block, from the host under ``none``, from the
neighbour's memory over NVLink under ``harvest`` (the runtime makes the neighbours the preferred
location). ``--hold evict`` runs the evict-after keeper instead, whose faults migrate at once.
A speedup is printed only where both runs' budget checks said held.

  python3 benchmarks/gpu/harvest_tenants.py [--budget 1GiB] [--kinds gemm,stream,stream] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from live_control import parse_umctl_summary  # noqa: E402  (the one reader of umctl's summary)


def gpu_count() -> int:
    out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=30).stdout
    return len(out.split())


def window_median(log: list[tuple[int, float]], lo: int, hi: int) -> tuple[float, int]:
    """Median iteration ms of the job's iterations that ended inside [lo, hi] (ns)."""
    xs = [ms for t, ms in log if lo <= t <= hi]
    return (statistics.median(xs) if xs else float("nan")), len(xs)


def parse_lender(path: str) -> list[tuple[int, float]]:
    with open(path) as f:
        return [(int(t), float(ms)) for t, ms in re.findall(r"^IT (\d+) ([\d.]+)", f.read(), re.M)]


def speedups_vs_host(rows: list[dict]) -> None:
    """Each row's ``speedup_vs_host`` over the ``none --budget`` row: NaN where the row or the
    baseline ran under a budget not verified held (a speedup under a budget counts only at
    equal, verified memory); the plain run, which has no budget, against a held baseline only."""
    host = next(r for r in rows if r["config"] == "none --budget")
    for r in rows:
        both = host.get("budget_held") is True and (r["config"] == "plain" or r.get("budget_held") is True)
        ok = both and r["steady_ms"] == r["steady_ms"] and host["steady_ms"] == host["steady_ms"]
        r["speedup_vs_host"] = host["steady_ms"] / r["steady_ms"] if ok else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget", default="1GiB")
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--mib", type=int, default=128)
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--kinds", default="gemm,stream,stream", help="the neighbours' jobs, GPU 1, 2, ...")
    ap.add_argument("--lender-gib", type=float, default=8.0)
    ap.add_argument("--alone-s", type=float, default=6.0, help="how long the jobs run alone first")
    ap.add_argument("--hold", choices=("admit", "evict"), default="admit",
                    help="how the budget is held: admit (under the runtime: misses are read remotely from the host "
                         "under none, from the neighbours' memory under harvest; the budget holds) or evict (umctl "
                         "evicts after the driver migrated; on a fast-faulting program the budget is not held)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    os.chdir(ROOT)
    n = gpu_count()
    if n < 2:
        sys.exit("harvest_tenants: needs at least 2 GPUs")
    kinds = (a.kinds.split(",") * n)[:n - 1]
    tmp = tempfile.mkdtemp(prefix="umctl-tenants-")
    stop = os.path.join(tmp, "stop")
    lenders = []
    for g, kind in enumerate(kinds, start=1):
        log = os.path.join(tmp, f"lender{g}.log")
        p = subprocess.Popen([sys.executable, "benchmarks/gpu/workloads/wl_lender.py", "--gpu", str(g), "--kind", kind,
                              "--gib", str(a.lender_gib), "--duration", "400", "--stop-file", stop],
                             stdout=open(log, "w"), stderr=subprocess.STDOUT)
        lenders.append((g, kind, log, p))
    deadline = time.monotonic() + 90
    while any("READY" not in open(l[2]).read() for l in lenders):
        if time.monotonic() > deadline or any(l[3].poll() is not None for l in lenders):
            for l in lenders:
                print(open(l[2]).read()[-1500:])
            open(stop, "w").close()
            sys.exit("harvest_tenants: a neighbour job did not start")
        time.sleep(0.2)
    t_alone = time.monotonic_ns()
    time.sleep(a.alone_s)
    windows = {"alone": (t_alone, time.monotonic_ns())}

    wl = [sys.executable, "benchmarks/gpu/workloads/wl_layers.py", "--layers", str(a.layers), "--mib", str(a.mib),
          "--iters", str(a.iters), "--sync-each", "--register-gpus", str(n)]
    hold = ["--runtime", "--budget-hold", "admit"] if a.hold == "admit" else ["--budget-hold", "evict"]
    configs = [("plain", wl),
               ("none --budget", ["umctl", "run", "-q", *hold, "--mode", "none", "--budget", a.budget, "--"] + wl),
               ("harvest --budget", ["umctl", "run", "-q", *hold, "--mode", "harvest", "--budget", a.budget,
                                     "--spare-gpus", str(n - 1), "--"] + wl)]
    rows = []
    for name, cmd in configs:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        its = [(int(t), float(ms)) for ms, t in re.findall(r"^ITER \d+ ([\d.]+) (\d+)", p.stdout, re.M)]
        ok = p.returncode == 0 and "check ok" in p.stdout
        steady = statistics.median([ms for _, ms in its[2:]]) if len(its) > 2 else float("nan")
        # the window: from the end of the harvester's second iteration to its last
        win = (its[1][0], its[-1][0]) if len(its) > 2 else (0, 0)
        windows[name] = win
        summ = parse_umctl_summary(p.stdout + p.stderr) if name != "plain" else {}
        rows.append({"config": name, "rc": p.returncode, "check": ok, "steady_ms": steady,
                     "budget_held": summ.get("budget_held"), "verdict": summ.get("verdict"),
                     "faults": (re.search(r"GPU faults\s+([\d,]+)", p.stdout) or [None, "-"])[1],
                     "control": (re.search(r"control\s+mode .*", p.stdout) or [""])[0]})
        print(f"--- {name} rc={p.returncode}: {' '.join(cmd[:9])} ...", flush=True)
        print("\n".join(l for l in p.stdout.splitlines() if not l.startswith("ITER"))[-3000:], flush=True)
        if p.returncode:
            print(p.stderr[-2000:], flush=True)
    open(stop, "w").close()
    lender_rows = []
    for g, kind, log, p in lenders:
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
        text = open(log).read()
        it = parse_lender(log)
        alone, n_alone = window_median(it, *windows["alone"])
        r = {"gpu": g, "kind": kind, "check": "check ok" in text, "alone_ms": alone, "n_alone": n_alone}
        for name in ("none --budget", "harvest --budget"):
            m, k = window_median(it, *windows[name])
            r[name] = m
            r[f"n {name}"] = k
        lender_rows.append(r)

    print(f"\nharvester: {a.layers} x {a.mib} MiB managed on GPU 0, budget {a.budget}, "
          f"{a.iters} iterations; neighbours: {', '.join(f'GPU {g} {k}' for g, k, _, _ in lenders)}")
    print(f"{'harvester':<20}{'rc':>4}{'check':>7}{'budget':>8}{'steady ms':>11}{'vs host-only':>14}{'GPU faults':>13}")
    speedups_vs_host(rows)
    for r in rows:
        sp = r["speedup_vs_host"]
        b = {True: "held", False: "NOT", None: "-"}[r.get("budget_held")] if r["config"] != "plain" else ""
        print(f"{r['config']:<20}{r['rc']:>4}{str(r['check']):>7}{b:>8}{r['steady_ms']:>11.1f}{sp:>13.2f}x{r['faults']:>13}")
    print(f"\n{'yielding job':<16}{'check':>7}{'alone ms':>10}{'w/ host-only':>14}{'w/ harvest':>12}{'slowdown':>10}")
    for r in lender_rows:
        h = r["harvest --budget"]
        slow = (h / r["alone_ms"] - 1) * 100 if h == h and r["alone_ms"] == r["alone_ms"] else float("nan")
        r["slowdown_pct"] = slow
        print(f"{'GPU %d %s' % (r['gpu'], r['kind']):<16}{str(r['check']):>7}{r['alone_ms']:>10.2f}"
              f"{r['none --budget']:>14.2f}{h:>12.2f}{slow:>+9.1f}%")
    for r in rows:
        if r["control"]:
            print(f"{r['config']}: {r['control']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"harvester": rows, "yielding": lender_rows}, f, indent=1)


if __name__ == "__main__":
    main()
