"""Many GPUs for real: SnuRHAC's programs plain on one GPU, under the live runtime on 1, 2 and 4
GPUs of one host, and over MPI (one rank a GPU) where mpirun exists, beside the replay's
prediction for the same program and GPU count. One JSON, one markdown table.

    python3 benchmarks/gpu/multigpu.py [--gpus 1,2,4] [--reps 3] [--programs gemm,...]
        [--size PROG=ARGS] [--mpi-size PROG=ARGS] [--mpi auto|off] [--dp] [--timeout S] [--budget S]
        [--max-runs N] [--json OUT.json] [--md OUT.md] [--dry-run]

Programs (tests/gpu/snurhac/*.cu, built once with nvcc, all at once): gemm, gesummv, a stencil
(hotspot), covariance (kept on one GPU by §6.4's write-overlap rule), and two the thesis finds
kernel-time dominated (nbody, binomial: the CUDA Samples' Nbody and binomialOptions). Rows:

  plain        the program as written, one GPU, no umctl (the thesis's baseline)
  snurhac      `umctl run -q --mode snurhac --gpus G -- prog` for G in --gpus
  snurhac-dp   the same with the controller's dynamic prefetching, at the largest G (--dp)
  mpi          `mpirun -H localhost:R -n R python3 -m umctl.cluster.live --gpus 1 -- prog`: one rank
               a GPU (each rank's program sees its own GPU), R = the largest G; for the programs
               with an MPI size (gemm at a smaller n: the MPI path moves every page through the
               agents), which also get plain and snurhac rows at that size

Every configuration runs once before any runs twice (so a cut-short run still has every row),
then again up to --reps times while --budget and --max-runs allow; a row's time is the median
of its runs' TIME_MS (copy-in to copy-back, the program's own clock), its speedup is over the
plain one-GPU run of the same program and size, "identical" says whether every run's result
checksum equals the plain run's (and the program's own check passed). The replay (the multigpu
scenario at the same n, compute rate from the plain run's kernel time, the GPU's calibration:
snurhac_real.py) runs in worker processes while the GPUs run. --dry-run prints the commands and
the plan, runs nothing and needs no GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import snurhac_real as sr  # noqa: E402

ROOT = sr.ROOT


class BadInput(Exception):
    """A bad option value: one line for the user."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="multigpu.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", default="1,2,4", help="GPU counts for --mode snurhac (those above the machine's are skipped)")
    ap.add_argument("--reps", type=int, default=3, help="runs per configuration (median), budget permitting")
    ap.add_argument("--programs", default=",".join(sr.PROGRAMS))
    ap.add_argument("--size", action="append", default=[], metavar="PROG=ARGS",
                    help="program arguments, e.g. gemm=4096 or stencil=8192,20")
    ap.add_argument("--mpi-size", action="append", default=[], metavar="PROG=ARGS",
                    help="arguments of a program's MPI rows (and of its plain and snurhac rows at that size)")
    ap.add_argument("--mpi", choices=("auto", "off"), default="auto", help="MPI rows where mpirun and mpi4py exist")
    ap.add_argument("--dp", action="store_true", help="also --mode snurhac-dp at the largest GPU count")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds per run")
    ap.add_argument("--budget", type=float, default=420.0, help="start no run after this many seconds (the first "
                    "pass over the configurations always completes unless it alone passes it)")
    ap.add_argument("--max-runs", type=int, default=40, help="most program runs in all")
    ap.add_argument("--no-replay", action="store_true", help="no replay predictions")
    ap.add_argument("--json", metavar="PATH", help="write the rows as JSON")
    ap.add_argument("--md", metavar="PATH", help="also write the markdown table")
    ap.add_argument("--build-dir", metavar="DIR", help="where to build the programs (default: a temporary one)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands and the plan; run nothing")
    a = ap.parse_args(argv)
    try:
        a.counts = sorted({int(x) for x in a.gpus.split(",") if x.strip()})
    except ValueError:
        raise BadInput(f"--gpus: {a.gpus!r} is not a comma list of GPU counts") from None
    if not a.counts or min(a.counts) < 1:
        raise BadInput(f"--gpus: counts must be 1 or more (got {a.gpus!r})")
    a.progs = [p.strip() for p in a.programs.split(",") if p.strip()]
    bad = [p for p in a.progs if p not in sr.PROGRAMS]
    if bad or not a.progs:
        raise BadInput(f"--programs: unknown {', '.join(bad) or '(none given)'}; known: {', '.join(sr.PROGRAMS)}")
    for name in ("reps", "max_runs"):
        if getattr(a, name) < 1:
            raise BadInput(f"--{name.replace('_', '-')} must be 1 or more")
    if a.timeout <= 0 or a.budget <= 0:
        raise BadInput("--timeout and --budget must be positive")
    a.sizes = _sizes(a.size, "--size")
    a.mpi_sizes = _sizes(a.mpi_size, "--mpi-size")
    return a


def _sizes(items: list[str], opt: str) -> dict[str, list[str]]:
    out = {}
    for s in items:
        prog, sep, args = s.partition("=")
        if not sep or prog not in sr.PROGRAMS or not args:
            raise BadInput(f"{opt}: {s!r} is not PROG=ARGS with PROG one of {', '.join(sr.PROGRAMS)}")
        out[prog] = args.split(",")
    return out


def plan(a: argparse.Namespace, have: int, mpi: bool) -> list[dict]:
    """The configurations, in the order they run: per program its plain run first."""
    counts = [g for g in a.counts if g <= have]
    top = max(counts)
    out: list[dict] = []
    for prog in a.progs:
        args = a.sizes.get(prog, sr.PROGRAMS[prog]["args"])
        out.append({"program": prog, "args": args, "gpus": 1, "mode": "plain"})
        out += [{"program": prog, "args": args, "gpus": g, "mode": "snurhac"} for g in counts]
        if a.dp and top >= 2:
            out.append({"program": prog, "args": args, "gpus": top, "mode": "snurhac-dp"})
        margs = a.mpi_sizes.get(prog, sr.PROGRAMS[prog].get("mpi_args"))
        if mpi and margs and top >= 2:
            if margs != args:
                out.append({"program": prog, "args": margs, "gpus": 1, "mode": "plain"})
                out.append({"program": prog, "args": margs, "gpus": top, "mode": "snurhac"})
            out.append({"program": prog, "args": margs, "gpus": top, "mode": "mpi"})
    return out


def command(c: dict, exe: Path, mpirun: str | None, timeout: float) -> list[str]:
    prog = [str(exe), *c["args"]]
    if c["mode"] == "plain":
        return prog
    if c["mode"] == "mpi":
        from umctl.cluster.live import mpirun_command

        line = mpirun_command(f"localhost:{c['gpus']}", prog, gpus_per_node=1, mpirun=mpirun or "mpirun",
                              um_space=1 << 30)
        i = line.index("--", line.index("umctl.cluster.live"))
        return line[:i] + ["--timeout", f"{max(10.0, timeout):g}"] + line[i:]
    return [*sr.umctl_cmd(), "run", "-q", "--mode", c["mode"], "--gpus", str(c["gpus"]), "--", *prog]


def key(c: dict) -> tuple:
    return c["program"], tuple(c["args"]), c["gpus"], c["mode"]


def summarize(rows: list[dict]) -> None:
    """Per row: median ms, speedup over the plain one-GPU run of the same program and size, the
    replay's predicted speedup, and whether its results are identical to that plain run."""
    base = {(r["program"], tuple(r["args"])): r for r in rows if r["mode"] == "plain"}
    for r in rows:
        good = [x for x in r.get("runs", []) if "error" not in x]
        r["n"] = len(good)
        r["ms"] = statistics.median(x["ms"] for x in good) if good else None
        ks = [x["kernel_ms"] for x in good if x.get("kernel_ms") is not None]
        r["kernel_ms"] = statistics.median(ks) if ks else None
        r["checks"] = sorted({x["check"] for x in good})
        errs = [x["error"] for x in r.get("runs", []) if "error" in x]
        r["error"] = errs[-1] if errs and not good else None
        b = base.get((r["program"], tuple(r["args"])), {})
        r["speedup"] = b["ms"] / r["ms"] if r["ms"] and b.get("ms") else None
        pb, pr = b.get("predicted_ms"), r.get("predicted_ms")
        r["predicted_speedup"] = pb / pr if isinstance(pb, float) and isinstance(pr, float) and pr > 0 else None
        own_ok = bool(good) and all(x["ok"] for x in good)
        if r["mode"] == "plain":
            r["identical"] = own_ok and len(r["checks"]) == 1
        else:
            r["identical"] = own_ok and bool(b.get("checks")) and r["checks"] == b["checks"] if good else None


def table(rows: list[dict]) -> str:
    def f(v, fmt):
        return format(v, fmt) if isinstance(v, (int, float)) and v is not None else "-"

    out = ["| program | args | GPUs | mode | median ms (runs) | speedup vs plain 1 GPU | replay-predicted speedup "
           "| identical? |", "| --- | --- | ---: | --- | ---: | ---: | ---: | --- |"]
    for r in rows:
        ms = f"{f(r.get('ms'), '.1f')} ({r.get('n', 0)})" if r.get("ms") else (r.get("error") or "-")
        pred = f(r.get("predicted_speedup"), ".2f")
        if pred == "-" and isinstance(r.get("predicted_ms"), str):
            pred = r["predicted_ms"]
        ident = {True: "yes", False: "NO", None: "-"}[r.get("identical")]
        out.append(f"| {r['program']} | {' '.join(r['args'])} | {r['gpus']} | {r['mode']} | {ms} | "
                   f"{f(r.get('speedup'), '.2f')} | {pred} | {ident} |")
    return "\n".join(out)


def _predict_job(prog: str, params: dict, gpus: int, rmode: str, cal_name: str) -> float | str:
    from umctl.sim.calibration import DEFAULT, Calibration

    calib = DEFAULT if cal_name == "default" else Calibration.load(cal_name)
    return sr.predict(prog, params, gpus, rmode, calib)


def _mpi_available() -> str | None:
    mpirun = shutil.which("mpirun")
    if not mpirun:
        return None
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return None
    return mpirun


def main(argv: list[str] | None = None) -> int:
    try:
        a = parse_args(argv)
    except BadInput as e:
        print(f"multigpu: {e}", file=sys.stderr)
        return 2
    t_start = time.monotonic()
    if a.dry_run:
        have = max(a.counts)
        mpirun = (shutil.which("mpirun") or "mpirun") if a.mpi == "auto" else None
        cal_name = "(the GPU's)"
    else:
        from umctl.live.spec import gpus_present

        have = gpus_present()
        mpirun = _mpi_available() if a.mpi == "auto" else None
        cal_name, _ = sr.calibration_for_gpu()
    if not [g for g in a.counts if g <= have]:
        print(f"multigpu: no GPU count of {a.gpus} fits the {have} GPU(s) here", file=sys.stderr)
        return 2
    configs = plan(a, have, mpirun is not None)
    if a.build_dir:
        out = Path(a.build_dir)
        out.mkdir(parents=True, exist_ok=True)
    else:
        out = Path(tempfile.gettempdir()) / "umctl_multigpu" if a.dry_run else Path(tempfile.mkdtemp(prefix="umctl_multigpu_"))
    progs = list(dict.fromkeys(c["program"] for c in configs))
    exes = {p: out / p for p in progs}
    env = {**os.environ, "UMCTL_RT_STATS": "1",
           "PYTHONPATH": str(ROOT) + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")}
    cmds = {key(c): command(c, exes[c["program"]], mpirun, a.timeout) for c in configs}
    planned = min(a.max_runs, len(configs) * a.reps)
    print(f"multigpu: {have} GPU(s), counts {[g for g in a.counts if g <= have]}, {len(configs)} configurations, "
          f"up to {planned} runs (--reps {a.reps}, --max-runs {a.max_runs}); MPI rows: "
          f"{'yes (' + mpirun + ')' if mpirun else 'no (no mpirun/mpi4py, or --mpi off)'}; calibration {cal_name}",
          flush=True)
    if a.dry_run:
        for p, cmd in sr.build_commands(out, progs).items():
            print("build:", " ".join(cmd))
        for c in configs:
            rm = sr.replay_mode(c["mode"], c["gpus"])
            rp = "no replay scenario" if not sr.PROGRAMS[c["program"]]["mats"] else (f"replay {rm}" if rm else "no replay")
            print(f"run [{c['program']} {c['mode']} x{c['gpus']}; {rp}]:", " ".join(cmds[key(c)]))
        if a.json:
            Path(a.json).write_text(json.dumps({"dry_run": True, "planned_runs": planned,
                                                "rows": [{**c, "command": cmds[key(c)]} for c in configs]}, indent=1))
        return 0

    exes = sr.build(out, progs)
    print(f"multigpu: built {', '.join(exes)} in {out} ({time.monotonic() - t_start:.0f} s)", flush=True)
    rows = {key(c): {**c, "command": cmds[key(c)], "runs": []} for c in configs}
    pool = None if a.no_replay else ProcessPoolExecutor(max_workers=max(1, min(8, (os.cpu_count() or 2) - 2)))
    futures: dict[tuple, object] = {}
    runs = 0
    for rep in range(a.reps):
        for c in configs:
            k = key(c)
            late = time.monotonic() - t_start > a.budget
            if runs >= a.max_runs or (late and (rep > 0 or rows[k]["runs"])):
                continue
            if late:
                rows[k]["runs"].append({"error": "skipped (time budget)"})
                continue
            r = sr.run_once(cmds[k], a.timeout, env)
            runs += 1
            rows[k]["runs"].append(r)
            print(f"  [{time.monotonic() - t_start:5.0f} s] {c['program']} {' '.join(c['args'])} {c['mode']} "
                  f"x{c['gpus']}: {r.get('ms', r.get('error'))}", flush=True)
            # the replay of this program, once its plain run gave the kernel time
            if pool and c["mode"] == "plain" and "error" not in r and not any(f[:2] == k[:2] for f in futures):
                params = sr.sim_params(c["program"], c["args"], r.get("kernel_ms"))
                rows[k]["sim_params"] = params
                for c2 in configs:
                    rm = sr.replay_mode(c2["mode"], c2["gpus"])
                    if params and rm and key(c2)[:2] == k[:2]:
                        futures[key(c2)] = pool.submit(_predict_job, c2["program"], params, c2["gpus"], rm, cal_name)
    for k, fut in futures.items():
        try:
            rows[k]["predicted_ms"] = fut.result(timeout=max(5.0, a.budget + 120 - (time.monotonic() - t_start)))
        except Exception as e:  # noqa: BLE001 - a replay that failed or ran out of time is a note in its row
            rows[k]["predicted_ms"] = f"replay: {type(e).__name__}"
        rows[k]["replay_mode"] = sr.replay_mode(k[3], k[2])
    if pool:
        pool.shutdown(cancel_futures=True)
    for r in rows.values():
        if "predicted_ms" not in r and not sr.PROGRAMS[r["program"]]["mats"]:
            r["predicted_ms"] = "no replay scenario"
    out_rows = list(rows.values())
    summarize(out_rows)
    md = table(out_rows)
    print(f"\nSnuRHAC on {have} GPUs (calibration {cal_name}); {runs} runs, {time.monotonic() - t_start:.0f} s\n")
    print(md)
    for r in out_rows:
        last = next((x for x in reversed(r["runs"]) if x.get("rt_stats")), None)
        if last and r["mode"] != "plain":
            print(f"  {r['program']} {r['mode']} x{r['gpus']}: " + " | ".join(last["rt_stats"])[:400])
    if a.md:
        Path(a.md).write_text(md + "\n")
    if a.json:
        Path(a.json).write_text(json.dumps({"calibration": cal_name, "gpus_present": have, "runs": runs,
                                            "wall_s": round(time.monotonic() - t_start, 1), "rows": out_rows},
                                           indent=1, default=str))
    bad = [r for r in out_rows if r.get("identical") is False]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
