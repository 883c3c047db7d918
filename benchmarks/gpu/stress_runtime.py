"""GPU stress test (issue 34, §1): the runtime under DeepUM, many consecutive runs.

``--runs`` (20) consecutive ``umctl run --runtime --managed --mode deepum --budget B -- python3
benchmarks/gpu/programs/transformer.py`` runs. B is ``--budget`` or, by default, half the
footprint of one plain run of the same program (which also gives the reference checksum).
Reports crashes -- a non-zero exit, or 'buffer overflow' / sanitizer / abort text on stderr --
(goal: 0) and whether every run printed the same checksum as the plain run (goal: all 20).
Exits 1 when either goal is missed.

  python3 benchmarks/gpu/stress_runtime.py [--runs 20] [--budget 1GiB] [--steps 4] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import live_control as lc  # noqa: E402

#: what counts as a crash on stderr, most specific first (the first that matches is the reason)
CRASH = [re.compile(p) for p in (r"buffer overflow", r"AddressSanitizer", r"UndefinedBehaviorSanitizer",
                                 r"LeakSanitizer", r"runtime error:", r"stack smashing", r"double free",
                                 r"free\(\): invalid", r"malloc\(\):", r"corrupted", r"Segmentation fault",
                                 r"core dumped", r"Aborted", r"\*\*\* .*terminated")]


def crash_reason(rc: int | None, stderr: str) -> str | None:
    """Why a run counts as a crash (None: it did not crash)."""
    for pat in CRASH:
        if m := pat.search(stderr):
            return m.group(0)
    if rc is None:
        return "timed out"
    if rc != 0:
        return f"exit {rc}"
    return None


def run_line(r: dict) -> str:
    """One run as this benchmark prints it (``r`` as in ``--json``'s ``runs``)."""
    return (f"run {r['i']:2}: rc={r['rc']} {r['wall_s']:5.1f} s step {r['step_ms']} ms faults {r['gpu_faults']} "
            f"held {r['budget_held']} checksum {r['checksum']}" + (f"  CRASH: {r['crash']}" if r["crash"] else ""))


def summary_line(program: str, mode: str, budget: str, runs: list[dict], planned: int, same: bool | None,
                 ref: str | None) -> str:
    """The verdict line: runs made of ``planned``, crashes (goal 0), identical checksums."""
    crashes = sum(1 for r in runs if r["crash"])
    sums = {r["checksum"] for r in runs}
    return (f"STRESS {program} {mode} --budget {budget}: {len(runs)}/{planned} runs, crashes {crashes} "
            f"(goal 0), checksums identical {'yes' if same else 'NO'} ({len(sums)} distinct; plain {ref})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--program", default="transformer", choices=sorted(lc.PROGRAMS))
    ap.add_argument("--program-args", default="", help="extra program arguments (default: its own sizes)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--budget", help="e.g. 1GiB or bytes (default: --budget-frac of a plain run's footprint)")
    ap.add_argument("--budget-frac", type=float, default=0.5)
    ap.add_argument("--mode", default="deepum")
    ap.add_argument("--umctl", default="umctl")
    ap.add_argument("--umctl-args", default="")
    ap.add_argument("--run-timeout", type=float, default=60.0)
    ap.add_argument("--max-seconds", type=float, default=300.0)
    ap.add_argument("--json")
    a = ap.parse_args()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    script, _ = lc.PROGRAMS[a.program]
    prog = [sys.executable, os.path.join(lc.PROG_DIR, script), "--steps", str(a.steps), *a.program_args.split()]
    t_end = time.monotonic() + a.max_seconds
    ref = None
    budget = a.budget
    rc, so, se, wall = lc.run_cmd(prog, a.run_timeout, env)
    o = lc.parse_program_output(so)
    ref = o.checksum
    print(f"plain: rc={rc} {wall:.1f} s footprint {lc._gib(o.footprint)} checksum {ref}", flush=True)
    if budget is None:
        if rc != 0 or not o.footprint:
            print(se[-2000:])
            sys.exit("stress_runtime: the plain run failed; give --budget")
        budget = f"{max(1, int(a.budget_frac * o.footprint) >> 20)}MiB"
    cmd = [a.umctl, "run", "-q", "--runtime", "--managed", "--mode", a.mode, "--budget", budget,
           *a.umctl_args.split(), "--", *prog]
    print("stress: " + " ".join(cmd), flush=True)
    runs = []
    for i in range(a.runs):
        left = t_end - time.monotonic()
        expect = max((r["wall_s"] for r in runs), default=10.0)
        if left < expect:
            print(f"stopping after {i} runs: {left:.0f} s left of --max-seconds {a.max_seconds:.0f}", flush=True)
            break
        rc, so, se, wall = lc.run_cmd(cmd, min(a.run_timeout, left), env)
        o = lc.parse_program_output(so)
        s = lc.parse_umctl_summary(so + "\n" + se)
        why = crash_reason(rc, se)
        runs.append({"i": i, "rc": rc, "wall_s": wall, "checksum": o.checksum, "crash": why,
                     "step_ms": lc.steady_ms(o.steps), "gpu_faults": s["gpu_faults"],
                     "budget_held": s["budget_held"], "stderr_tail": se[-1500:] if why else ""})
        print(run_line(runs[-1]), flush=True)
        if why:
            print("    " + se[-1200:].replace("\n", "\n    "), flush=True)
    crashes = sum(1 for r in runs if r["crash"])
    sums = {r["checksum"] for r in runs}
    if ref:
        same = bool(runs) and sums == {ref}
    else:
        same = len(sums) == 1 and None not in sums
    print("\n" + summary_line(a.program, a.mode, budget, runs, a.runs, same, ref))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"command": cmd, "budget": budget, "plain_checksum": ref, "runs": runs,
                       "crashes": crashes, "identical": same}, f, indent=1)
    return 0 if crashes == 0 and same and len(runs) == a.runs else 1


if __name__ == "__main__":
    sys.exit(main())
