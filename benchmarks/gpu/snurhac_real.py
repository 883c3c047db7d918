"""SnuRHAC on real GPUs (tracker 8a): the snurhac family's programs as CUDA programs
(tests/gpu/snurhac/*.cu) run plainly on one GPU (cudaMalloc, no umctl: the thesis's baseline)
and under ``umctl run --mode snurhac --gpus N`` (the runtime partitions each kernel's grid over N
GPUs) and ``--mode snurhac-dp`` at the largest N, next to the simulator's prediction for the same
program at the same size (the multigpu scenario family, modes none / snurhac / snurhac-dp).

The simulator's compute rates (``tflops`` for gemm, ``hbm_gbps`` for the memory-bound
kernels) are taken from the plain run's kernel time (KERNEL_MS), i.e. from the one-GPU baseline
only; everything about the multi-GPU runs is predicted. The calibration is the shipped one for
the GPU if there is one (h200-r580, h100-r580), else the default.

    PYTHONPATH=. python3 benchmarks/gpu/snurhac_real.py [--gpus 1,2,4] [--reps 2] [--json OUT.json]

Needs nvcc, NVIDIA GPUs and the rights `umctl run` needs (the UVM tools API). Every command
has a timeout; a failed or timed-out run is a row with an error, never a hang.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SRC = ROOT / "tests" / "gpu" / "snurhac"
#: program -> (default argv, buffers counted by the multigpu scenario's footprint, sim params)
PROGRAMS: dict[str, dict] = {
    "gemm": {"args": ["8192"], "mats": 3},
    "gesummv": {"args": ["16384"], "mats": 2},
    "stencil": {"args": ["8192", "20"], "mats": 3},
}
LINE = re.compile(r"TIME_MS\s+([\d.]+)\s+CHECK\s+(\S+)\s+(OK|FAIL)")
KLINE = re.compile(r"KERNEL_MS\s+([\d.]+)")


def nvcc() -> str:
    for c in (shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if c and os.path.exists(c):
            return c
    sys.exit("snurhac_real: nvcc not found (PATH or /usr/local/cuda/bin)")


def umctl_cmd() -> list[str]:
    exe = shutil.which("umctl")
    return [exe] if exe else [sys.executable, "-m", "umctl.cli.main"]


def build(out: Path) -> dict[str, Path]:
    cc = nvcc()
    exes = {}
    for p in PROGRAMS:
        exe = out / p
        r = subprocess.run([cc, "-O3", "-arch=sm_90", "-cudart", "shared", "-o", str(exe), str(SRC / f"{p}.cu")],
                           capture_output=True, text=True, timeout=240)
        if r.returncode:
            sys.exit(f"snurhac_real: nvcc {p}.cu failed:\n{r.stderr[-3000:]}")
        exes[p] = exe
    return exes


def run_once(cmd: list[str], timeout: float, env: dict | None = None) -> dict:
    """One run: {ms, kernel_ms, check, ok} or {error}."""
    t0 = time.monotonic()
    # its own process group: a timeout ends umctl *and* the program it started
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    try:
        stdout, stderr = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.communicate()
        return {"error": f"timeout after {timeout:g} s"}
    m = LINE.search(stdout)
    if not m:
        tail = (stderr.strip().splitlines() or stdout.strip().splitlines() or ["no output"])[-1]
        return {"error": f"rc {p.returncode}: {tail[:200]}"}
    k = KLINE.search(stdout)
    rt = [ln for ln in stderr.splitlines() if ln.startswith("umctl_rt:")]
    return {"ms": float(m[1]), "kernel_ms": float(k[1]) if k else None, "check": m[2], "ok": m[3] == "OK",
            "wall_s": round(time.monotonic() - t0, 2), "rt_stats": rt[-1] if rt else None}


def measure(cmd: list[str], reps: int, timeout: float, env: dict | None = None, deadline: float = float("inf")) -> dict:
    """Median of ``reps`` runs (fewer once past ``deadline``, at least one)."""
    runs = []
    for _ in range(reps):
        if runs and time.monotonic() > deadline:
            break
        runs.append(run_once(cmd, min(timeout, max(10.0, deadline - time.monotonic() + timeout / 2)), env))
    good = [r for r in runs if "error" not in r]
    if not good:
        return {"error": runs[-1]["error"]}
    return {"ms": statistics.median(r["ms"] for r in good),
            "kernel_ms": statistics.median(r["kernel_ms"] for r in good if r["kernel_ms"] is not None)
            if any(r["kernel_ms"] is not None for r in good) else None,
            "checks": sorted({r["check"] for r in good}), "ok": all(r["ok"] for r in good),
            "runs": [r.get("ms", r.get("error")) for r in runs], "rt_stats": good[-1]["rt_stats"]}


# -- the simulator's prediction ---------------------------------------------------------------

def sim_params(prog: str, args: list[str], kernel_ms: float | None, gpu_mem: int) -> dict[str, str]:
    """multigpu scenario parameters giving the real program's n (fill x gpu_mem = the device
    footprint) and, from the baseline's kernel time, its compute rate."""
    n = int(args[0])
    mats = PROGRAMS[prog]["mats"]
    vec = 3 * n * 4 if prog == "gesummv" else 0
    params = {"gpu_mem": str(gpu_mem), "fill": repr(mats * 4 * n * n * (1 + 1e-9) / gpu_mem), "tiles": "16"}
    if prog == "stencil":
        params["iterations"] = args[1] if len(args) > 1 else "20"
    if kernel_ms:
        sec = kernel_ms / 1e3
        if prog == "gemm":
            params["tflops"] = repr(2.0 * n ** 3 / sec / 1e12)
        elif prog == "gesummv":   # one pass over both matrices (the scenario's kernel cost: 2 n row bytes)
            params["hbm_gbps"] = repr((2.0 * n * n * 4 + vec) / sec / 1e9)
        else:                      # per step: read cur and power, write next (3 n row bytes)
            steps = int(params["iterations"])
            params["hbm_gbps"] = repr(3.0 * n * n * 4 * steps / sec / 1e9)
    return params


def predict(prog: str, params: dict[str, str], gpus: int, mode: str, calib) -> float | str:
    """Predicted program time in ms (copies + kernels, the real program's TIME_MS), or an error."""
    from umctl import UmctlError
    from umctl.controller import make_controller
    from umctl.sim.engine import Simulator
    from umctl.workload.scenario import load_scenario

    try:
        w = load_scenario(f"mgpu-{prog}", {**params, "gpus": str(gpus)})
        opts = {"single_gpu": True} if mode.startswith("snurhac") and gpus == 1 else {}
        return Simulator(w, make_controller(mode, **opts), calib=calib).run().time_ns / 1e6
    except (UmctlError, ValueError) as e:
        return f"sim: {str(e).splitlines()[0][:120]}"


def calibration_for_gpu():
    from umctl.sim.calibration import DEFAULT, Calibration

    try:
        name = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30).stdout.splitlines()[0].lower()
    except (OSError, subprocess.SubprocessError, IndexError):
        name = ""
    for key in ("h200", "h100"):
        if key in name:
            try:
                return f"{key}-r580", Calibration.load(f"{key}-r580")
            except Exception:  # noqa: BLE001 - a missing file: the default
                break
    return "default", DEFAULT


def gpu_memory_bytes() -> int:
    try:
        mib = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout.split()[0]
        return int(mib) << 20
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        return 80 << 30


# -- main -------------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", default="1,2,4", help="GPU counts for --mode snurhac (those above the machine's are skipped)")
    ap.add_argument("--reps", type=int, default=2, help="runs per configuration (median)")
    ap.add_argument("--programs", default=",".join(PROGRAMS))
    ap.add_argument("--size", action="append", default=[], metavar="PROG=ARGS",
                    help="program arguments, e.g. gemm=4096 or stencil=8192,20")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per run")
    ap.add_argument("--budget", type=float, default=300.0, help="stop starting new runs after this many seconds")
    ap.add_argument("--no-dp", action="store_true", help="skip --mode snurhac-dp")
    ap.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    a = ap.parse_args()
    t_start = time.monotonic()

    from umctl.live.spec import gpus_present

    have = gpus_present()
    counts = [g for g in (int(x) for x in a.gpus.split(",")) if 1 <= g <= have]
    skipped = [g for g in (int(x) for x in a.gpus.split(",")) if g > have]
    print(f"snurhac_real: {have} GPU(s); GPU counts {counts}" + (f" (skipping {skipped})" if skipped else ""), flush=True)
    if not counts:
        sys.exit("snurhac_real: no usable GPU count")
    sizes = {k: v.split(",") for k, v in (s.split("=", 1) for s in a.size)}
    cal_name, calib = calibration_for_gpu()
    gpu_mem = gpu_memory_bytes()
    out = Path(tempfile.mkdtemp(prefix="umctl_snurhac_"))
    exes = build(out)
    print(f"snurhac_real: built {', '.join(exes)} in {out} ({time.monotonic() - t_start:.0f} s); "
          f"calibration {cal_name}", flush=True)
    env = {**os.environ, "UMCTL_RT_STATS": "1"}
    rows: list[dict] = []
    for prog in a.programs.split(","):
        args = sizes.get(prog, PROGRAMS[prog]["args"])
        cmd = [str(exes[prog]), *args]
        configs = [(g, "snurhac") for g in counts]
        if not a.no_dp and max(counts) >= 2:
            configs.append((max(counts), "snurhac-dp"))
        deadline = t_start + a.budget
        base = measure(cmd, a.reps, a.timeout, env, deadline)
        params = sim_params(prog, args, base.get("kernel_ms"), gpu_mem)
        pred_base = predict(prog, params, 1, "none", calib)
        rows.append({"program": prog, "args": args, "gpus": 1, "mode": "plain", **base, "predicted_ms": pred_base,
                     "sim_params": params})
        print(f"  {prog} plain: {base.get('ms', base.get('error'))}", flush=True)
        for g, mode in configs:
            if time.monotonic() - t_start > a.budget:
                rows.append({"program": prog, "gpus": g, "mode": mode, "error": "skipped (time budget)"})
                continue
            r = measure([*umctl_cmd(), "run", "-q", "--mode", mode, "--gpus", str(g), "--", *cmd], a.reps,
                        a.timeout, env, deadline)
            if "error" not in r and "error" not in base:
                r["check_equal"] = r["checks"] == base["checks"]
            rows.append({"program": prog, "args": args, "gpus": g, "mode": mode, **r,
                         "predicted_ms": predict(prog, params, g, mode, calib)})
            print(f"  {prog} {mode} x{g}: {r.get('ms', r.get('error'))}", flush=True)

    # speedups over the plain run, measured and predicted
    base_of = {r["program"]: r for r in rows if r["mode"] == "plain"}
    for r in rows:
        b = base_of.get(r["program"], {})
        if isinstance(r.get("ms"), float) and isinstance(b.get("ms"), float):
            r["speedup"] = b["ms"] / r["ms"]
        if isinstance(r.get("predicted_ms"), float) and isinstance(b.get("predicted_ms"), float):
            r["predicted_speedup"] = b["predicted_ms"] / r["predicted_ms"]
        if isinstance(r.get("ms"), float) and isinstance(r.get("predicted_ms"), float):
            r["error_pct"] = 100.0 * (r["predicted_ms"] - r["ms"]) / r["ms"]

    print(f"\nSnuRHAC on real GPUs vs the simulator ({cal_name}); speedups over the plain one-GPU run\n")
    print("| program | GPUs | mode | measured ms | speedup | predicted ms | pred. speedup | error | check |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        def f(k, fmt):
            v = r.get(k)
            return format(v, fmt) if isinstance(v, float) else ("-" if v is None else str(v))
        if "error" in r:
            chk = r["error"]
        elif r["mode"] == "plain":
            chk = "OK" if r.get("ok") else "FAIL"
        else:
            chk = ("OK" if r.get("ok") else "FAIL") + ("" if r.get("check_equal", True) else " (checksum differs)")
        print(f"| {r['program']} | {r['gpus']} | {r['mode']} | {f('ms', '.1f')} | {f('speedup', '.2f')} | "
              f"{f('predicted_ms', '.1f')} | {f('predicted_speedup', '.2f')} | {f('error_pct', '+.0f')}% | {chk} |")
    for r in rows:
        if r.get("rt_stats") and r["mode"] != "plain":
            st = dict(kv.split("=", 1) for kv in r["rt_stats"].split()[1:] if "=" in kv)
            print(f"  {r['program']} {r['mode']} x{r['gpus']}: partitioned={st.get('partitioned')} "
                  f"fallbacks={st.get('part_fallbacks')} read_mostly={st.get('read_mostly')} managed={st.get('managed_allocs')}")
    print(f"\n(wall {time.monotonic() - t_start:.0f} s)")
    if a.json:
        Path(a.json).write_text(json.dumps({"calibration": cal_name, "gpus_present": have, "rows": rows}, indent=1,
                                           default=str))
    bad = [r for r in rows if r.get("ok") is False or r.get("check_equal") is False]
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
