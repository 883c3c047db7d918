"""benchmarks/gpu/multigpu.py without a GPU: --dry-run prints the build and every planned run and
fits the device run's limits (about 40 runs); bad options are one-line errors; the run loop,
speedups and the identical-results check on stand-in programs (tiny scripts printing the CUDA
programs' TIME_MS line); the replay's parameters and its mode per live configuration."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks" / "gpu"
sys.path.insert(0, str(BENCH))

import multigpu  # noqa: E402
import snurhac_real as sr  # noqa: E402


def run_bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH / "multigpu.py"), *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_dry_run_plans_every_program_and_fits_the_device_run(tmp_path):
    p = run_bench("--dry-run", "--json", str(tmp_path / "plan.json"))
    assert p.returncode == 0, p.stderr
    out = p.stdout
    plan = json.loads((tmp_path / "plan.json").read_text())
    rows = plan["rows"]
    progs = {r["program"] for r in rows}
    # six programs of Table 7.10 (or stand-ins): gemm, gesummv, a stencil, and two kernel-bound ones
    assert {"gemm", "gesummv", "stencil"} <= progs and len(progs) >= 6
    assert sum(sr.PROGRAMS[p]["kernel_bound"] for p in progs) >= 2
    for prog in progs:
        args = sr.PROGRAMS[prog]["args"]
        mine = {(r["gpus"], r["mode"]) for r in rows if r["program"] == prog and r["args"] == args}
        assert {(1, "plain"), (1, "snurhac"), (2, "snurhac"), (4, "snurhac")} <= mine, prog
        assert f"-o {Path(tempfile_dir(out)) / prog} " in out and f"tests/gpu/snurhac/{prog}.cu" in out
    # one nvcc per program, the runs themselves: plain, under umctl, over mpirun
    assert out.count("build: ") == len(progs)
    assert "umctl run -q --mode snurhac --gpus 4 -- " in out.replace(sys.executable + " -m umctl.cli.main", "umctl")
    mpi = [r for r in rows if r["mode"] == "mpi"]
    assert {r["program"] for r in mpi} >= {"gemm"} and all("umctl.cluster.live" in r["command"] for r in mpi)
    # gemm's MPI rows are at a smaller size, with plain and 4-GPU rows at that size to compare with
    g = sr.PROGRAMS["gemm"]["mpi_args"]
    assert {(r["gpus"], r["mode"]) for r in rows if r["program"] == "gemm" and r["args"] == g} == \
        {(1, "plain"), (4, "snurhac"), (4, "mpi")}
    assert plan["planned_runs"] <= 40 and len(rows) <= 40


def tempfile_dir(out: str) -> str:
    line = next(ln for ln in out.splitlines() if ln.startswith("build: "))
    return str(Path(line.split(" -o ")[1].split()[0]).parent)


@pytest.mark.parametrize("args,msg", [
    (["--programs", "gemm,nope"], "unknown nope"),
    (["--gpus", "0"], "1 or more"),
    (["--gpus", "two"], "comma list"),
    (["--size", "gemm"], "PROG=ARGS"),
    (["--reps", "0"], "--reps must be"),
    (["--gpus", "8", "--dry-run"], None),
])
def test_bad_options_are_one_line(args, msg):
    p = run_bench("--dry-run", *args)
    if msg is None:   # --gpus 8 alone: planned as asked (the dry run assumes the GPUs exist)
        assert p.returncode == 0
        return
    assert p.returncode == 2 and msg in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


# -- the run loop on stand-in programs ------------------------------------------------------------

FAKE_PROG = """#!{py}
import os, sys
g = int(os.environ.get("FAKE_GPUS", "1"))
base = 100.0 * int(sys.argv[1]) / 64
check = "abcd" if not (os.environ.get("FAKE_BAD") and g > 1) else "ffff"
print("KERNEL_MS", base / 2)
print("TIME_MS", base / g, "CHECK", check, "OK")
"""
FAKE_UMCTL = """#!{py}
import os, sys
argv = sys.argv[1:]
g = argv[argv.index("--gpus") + 1]
cmd = argv[argv.index("--") + 1:]
os.execve(cmd[0], cmd, {{**os.environ, "FAKE_GPUS": g}})
"""


@pytest.fixture
def fake_bench(tmp_path, monkeypatch):
    def build(out, programs=None):
        exes = {}
        for p in programs:
            exe = Path(out) / p
            exe.write_text(FAKE_PROG.format(py=sys.executable))
            exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
            exes[p] = exe
        return exes

    umctl = tmp_path / "umctl"
    umctl.write_text(FAKE_UMCTL.format(py=sys.executable))
    umctl.chmod(umctl.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(sr, "build", build)
    monkeypatch.setattr(sr, "umctl_cmd", lambda: [str(umctl)])
    monkeypatch.setattr(sr, "calibration_for_gpu", lambda name=None: ("default", None))
    monkeypatch.setattr("umctl.live.spec.gpus_present", lambda: 4)
    monkeypatch.setattr(sr, "PROGRAMS", {
        "alpha": {"args": ["64"], "mats": None, "kernel_bound": True},
        "beta": {"args": ["128"], "mats": None, "kernel_bound": False},
    })
    return tmp_path


def test_runs_speedups_and_identical_results(fake_bench, capsys):
    out = fake_bench / "r.json"
    rc = multigpu.main(["--mpi", "off", "--no-replay", "--reps", "2", "--build-dir", str(fake_bench / "b"),
                        "--json", str(out), "--md", str(fake_bench / "r.md")])
    assert rc == 0
    d = json.loads(out.read_text())
    rows = {(r["program"], r["gpus"], r["mode"]): r for r in d["rows"]}
    assert d["runs"] == 16 and len(rows) == 8   # 2 programs x (plain, 1, 2, 4 GPUs) x 2 runs
    for prog, base in (("alpha", 100.0), ("beta", 200.0)):
        assert rows[(prog, 1, "plain")]["ms"] == pytest.approx(base) and rows[(prog, 1, "plain")]["n"] == 2
        for g in (1, 2, 4):
            r = rows[(prog, g, "snurhac")]
            assert r["speedup"] == pytest.approx(g) and r["identical"] is True
            assert r["predicted_ms"] == "no replay scenario"
    md = (fake_bench / "r.md").read_text()
    assert "| alpha | 64 | 4 | snurhac | 25.0 (2) | 4.00 | no replay scenario | yes |" in md
    assert md in capsys.readouterr().out


def test_a_result_differing_from_plain_fails_the_run(fake_bench, monkeypatch):
    monkeypatch.setenv("FAKE_BAD", "1")
    out = fake_bench / "r.json"
    rc = multigpu.main(["--mpi", "off", "--no-replay", "--reps", "1", "--gpus", "1,2", "--programs", "alpha",
                        "--build-dir", str(fake_bench / "b"), "--json", str(out)])
    rows = {(r["gpus"], r["mode"]): r for r in json.loads(out.read_text())["rows"]}
    assert rc == 1
    assert rows[(1, "snurhac")]["identical"] is True and rows[(2, "snurhac")]["identical"] is False


def test_max_runs_and_budget_cut_the_repetitions_not_the_rows(fake_bench):
    out = fake_bench / "r.json"
    assert multigpu.main(["--mpi", "off", "--no-replay", "--reps", "3", "--max-runs", "10",
                          "--build-dir", str(fake_bench / "b"), "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["runs"] == 10 and all(r["n"] >= 1 for r in d["rows"])   # every row once before any twice


# -- the replay side -------------------------------------------------------------------------

def test_replay_mode_per_live_configuration():
    assert sr.replay_mode("plain", 1) == "none"
    assert sr.replay_mode("snurhac", 1) == "snurhac"          # managed memory alone on one GPU
    assert sr.replay_mode("snurhac", 4) == "snurhac-sp"       # placement + prefetch from the ranges
    assert sr.replay_mode("snurhac-dp", 4) == "snurhac-sp-dp"
    assert sr.replay_mode("mpi", 4) is None


def test_sim_params_match_the_programs_and_predict():
    assert sr.sim_params("nbody", ["131072", "10"], 50.0) is None
    p = sr.sim_params("stencil", ["512", "4"], 2.0)
    assert p["iterations"] == "4" and float(p["hbm_gbps"]) == pytest.approx(3 * 512 * 512 * 4 * 4 / 2e-3 / 1e9)
    # the replay's footprint is the program's: n comes out as the program's
    from umctl.workload.scenario import load_scenario

    g = sr.sim_params("gesummv", ["2048"], 1.0)
    w = load_scenario("mgpu-gesummv", {**g, "gpus": "2"})
    assert w.meta["n"] == 2048
    from umctl.sim.calibration import DEFAULT

    t1 = sr.predict("gesummv", g, 1, "none", DEFAULT)
    t4 = sr.predict("gesummv", g, 4, "snurhac-sp", DEFAULT)
    assert isinstance(t1, float) and isinstance(t4, float) and t1 > 0 and t4 > 0
