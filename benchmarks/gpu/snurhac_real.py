"""SnuRHAC on real GPUs: the pieces ``benchmarks/gpu/multigpu.py`` is made of -- the programs
(tests/gpu/snurhac/*.cu, the thesis's Table 7.10 programs or stand-ins), their build, one timed
run of a command, and the simulator's prediction of a program at the same size (the multigpu
scenario family). Run as a script it is ``multigpu.py`` (the same options; ``--no-dp`` leaves
out the ``snurhac-dp`` rows it adds), as earlier device scripts call it.

The simulator's compute rates (``tflops`` for gemm and covariance, ``hbm_gbps`` for the
memory-bound kernels) are taken from the plain run's kernel time (KERNEL_MS), i.e. from the
one-GPU baseline only; everything about the multi-GPU runs is predicted. The calibration is the
shipped one for the GPU if there is one (h200-r580, h100-r580), else the default.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SRC = ROOT / "tests" / "gpu" / "snurhac"
#: program -> default argv; the multigpu scenario's matrices (its footprint) where the replay has
#: the program; whether the thesis finds it kernel-time dominated (it scales well: §7.3.2, Figure
#: 7.10); the argv of its MPI rows (one rank a GPU), smaller where the program moves much data
PROGRAMS: dict[str, dict] = {
    "gemm": {"args": ["8192"], "mats": 3, "kernel_bound": False, "mpi_args": ["4096"]},
    "gesummv": {"args": ["16384"], "mats": 2, "kernel_bound": False},
    "stencil": {"args": ["8192", "20"], "mats": 3, "kernel_bound": False},
    "nbody": {"args": ["131072", "10"], "mats": None, "kernel_bound": True, "mpi_args": ["131072", "10"]},
    "binomial": {"args": ["32768", "2048"], "mats": None, "kernel_bound": True, "mpi_args": ["32768", "2048"]},
    "covariance": {"args": ["1024", "1024"], "mats": 2, "kernel_bound": False},
}
LINE = re.compile(r"TIME_MS\s+([\d.]+)\s+CHECK\s+(\S+)\s+(OK|FAIL)")
KLINE = re.compile(r"KERNEL_MS\s+([\d.]+)")


def nvcc(required: bool = True) -> str | None:
    for c in (shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if c and os.path.exists(c):
            return c
    if required:
        sys.exit("snurhac_real: nvcc not found (PATH or /usr/local/cuda/bin)")
    return None


def umctl_cmd() -> list[str]:
    exe = shutil.which("umctl")
    return [exe] if exe else [sys.executable, "-m", "umctl.cli.main"]


def build_commands(out: Path, programs, cc: str = "nvcc") -> dict[str, list[str]]:
    """One nvcc command per program, as the runtime needs them (-cudart shared: the runtime
    interposes libcudart)."""
    return {p: [cc, "-O3", "-arch=sm_90", "-cudart", "shared", "-o", str(out / p), str(SRC / f"{p}.cu")]
            for p in programs}


def build(out: Path, programs=None) -> dict[str, Path]:
    """Build the programs with nvcc, all at once (one nvcc process each)."""
    cmds = build_commands(out, programs or PROGRAMS, nvcc())

    def one(item):
        p, cmd = item
        return p, subprocess.run(cmd, capture_output=True, text=True, timeout=300)

    with ThreadPoolExecutor(max_workers=len(cmds)) as ex:
        for p, r in ex.map(one, cmds.items()):
            if r.returncode:
                sys.exit(f"snurhac_real: nvcc {p}.cu failed:\n{r.stderr[-3000:]}")
    return {p: out / p for p in cmds}


def run_once(cmd: list[str], timeout: float, env: dict | None = None) -> dict:
    """One run: {ms, kernel_ms, check, ok, wall_s, rt_stats} or {error}."""
    t0 = time.monotonic()
    # its own process group: a timeout ends umctl (or mpirun) *and* the program it started
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
    found = LINE.findall(stdout)
    if not found or p.returncode:
        tail = (stderr.strip().splitlines() or stdout.strip().splitlines() or ["no output"])[-1]
        return {"error": f"rc {p.returncode}: {tail[:200]}"}
    # every rank of an MPI run prints its line: the slowest is the run's time; their checks must agree
    ms = max(float(m[0]) for m in found)
    checks = sorted({m[1] for m in found})
    k = KLINE.findall(stdout)
    rt = [ln for ln in stderr.splitlines() if ln.startswith(("umctl_rt:", "umctl_rt_snurhac:"))]
    return {"ms": ms, "kernel_ms": max(float(x) for x in k) if k else None, "check": checks[0] if len(checks) == 1
            else "ranks differ: " + ",".join(checks), "ok": all(m[2] == "OK" for m in found),
            "wall_s": round(time.monotonic() - t0, 2), "rt_stats": rt[-2:] or None}


# -- the simulator's prediction ---------------------------------------------------------------

def sim_params(prog: str, args: list[str], kernel_ms: float | None) -> dict[str, str] | None:
    """multigpu scenario parameters giving the real program's n and, from the baseline's kernel
    time, its compute rate; None for a program the family does not have. gpu_mem is twice the
    footprint: the programs fit one GPU, and the replay's size bound counts gpu_mem."""
    mats = PROGRAMS[prog]["mats"]
    if not mats:
        return None
    n = int(args[0])
    foot = mats * 4 * n * n
    gpu_mem = max(2 * foot, 1 << 30)
    params = {"gpu_mem": str(gpu_mem), "fill": repr(foot * (1 + 1e-9) / gpu_mem), "tiles": "16"}
    if prog == "stencil":
        params["iterations"] = args[1] if len(args) > 1 else "20"
    if kernel_ms:
        sec = kernel_ms / 1e3
        if prog == "gemm":
            params["tflops"] = repr(2.0 * n ** 3 / sec / 1e12)
        elif prog == "covariance":   # the scenario's covar kernel: n^3 flops (mean and centring not modelled)
            params["tflops"] = repr(1.0 * n ** 3 / sec / 1e12)
        elif prog == "gesummv":      # one pass over both matrices (the scenario's kernel cost: 2 n row bytes)
            params["hbm_gbps"] = repr((2.0 * n * n * 4 + 3 * n * 4) / sec / 1e9)
        else:                         # stencil, per step: read cur and power, write next (3 n row bytes)
            params["hbm_gbps"] = repr(3.0 * n * n * 4 * int(params["iterations"]) / sec / 1e9)
    return params


def replay_mode(mode: str, gpus: int) -> str | None:
    """The replay's variant for a live configuration: plain is mode none; live snurhac on one GPU
    is managed memory alone (snurhac); on several the runtime places and prefetches each GPU's
    ranges from the convention (snurhac-sp: static prefetching from the access ranges); -dp adds
    the controller's dynamic prefetching. The MPI path has no replay on one host (the replay's
    nodes are InfiniBand nodes)."""
    if mode == "plain":
        return "none"
    if mode == "snurhac":
        return "snurhac" if gpus == 1 else "snurhac-sp"
    if mode == "snurhac-dp":
        return "snurhac-sp-dp"
    return None


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


def calibration_for_gpu(name: str | None = None):
    """(name, Calibration) for the GPU nvidia-smi names (or ``name``)."""
    from umctl.sim.calibration import DEFAULT, Calibration

    if name is None:
        try:
            name = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                  text=True, timeout=30).stdout.splitlines()[0].lower()
        except (OSError, subprocess.SubprocessError, IndexError):
            name = ""
    for key in ("h200", "h100"):
        if key in name.lower():
            try:
                return f"{key}-r580", Calibration.load(f"{key}-r580")
            except Exception:  # noqa: BLE001 - a missing file: the default
                break
    return "default", DEFAULT


if __name__ == "__main__":
    import multigpu

    argv = sys.argv[1:]
    if "--no-dp" in argv:
        argv.remove("--no-dp")
    else:
        argv.append("--dp")
    raise SystemExit(multigpu.main(argv))
