"""SnuRHAC live without a GPU: the runtime's grid partitioning (runtime/umctl_rt.c,
UMCTL_RT_GPUS) on the fake CUDA runtime with several fake devices (tests/rtprog/fakecudart.c),
checked against the replay controller's rule (umctl.controller.snurhac.partition); the CLI's
refusals; the replay controller's dynamic prefetcher driven by live-shaped fault batches."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from umctl.cli.main import main
from umctl.controller.base import make_controller
from umctl.controller.snurhac import partition
from umctl.events.schema import EventBatch, Kind, Op, empty
from umctl.live.control import LiveControl
from umctl.runtime import child_env
from umctl.units import BLOCK_SHIFT, BLOCK_SIZE, PAGE_SIZE

from test_live_control import FakeActuator
from test_runtime import run_prog, stats

MANGLED = "_Z9part_kern12umctl_part_tPjPiPKj"


def run_part(built, grid, gpus: int, devices: int = 4, variant: str = "part",
             param_info: bool = True, extra: dict | None = None) -> tuple[dict, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("UMCTL_RT_", "LD_PRELOAD", "FAKE_"))}
    base.update(FAKE_LIBCUDA=str(built["libcuda"]), FAKE_DEVICES=str(devices))
    if not param_info:
        base["FAKE_NO_PARAM_INFO"] = "1"
    env = child_env(base, library=built["lib"], managed=True, gpus=str(gpus), libcuda=str(built["libcuda"]),
                    stats="1")
    env.update(extra or {})
    return run_prog(built, ["part", *map(str, grid), variant], env)


def check_wiring(log: list[str], n_slabs: int) -> None:
    """One partitioned launch: an event on the caller's stream (0), every slab stream waits on
    it before its launch, each slab is followed by an event on its stream, and the caller's
    stream waits on all of those (no host synchronisation anywhere)."""
    start = re.fullmatch(r"record event=(\d+) stream=0", log[0])
    assert start, log
    waited: set[str] = set()
    done: dict[str, str] = {}
    for i, ln in enumerate(log[1:], 1):
        if m := re.fullmatch(r"wait stream=(\d+) event=(\d+)", ln):
            if m[1] == "0":
                assert m[2] in done.values(), ln
            else:
                assert m[2] == start[1]
                waited.add(m[1])
        elif m := re.fullmatch(r"launch \S+ dev=(\d+) stream=(\d+) grid=\S+", ln):
            assert m[2] in waited, f"slab launched before its stream waited: {ln}"
            nxt = re.fullmatch(r"record event=(\d+) stream=(\d+)", log[i + 1])
            assert nxt and nxt[2] == m[2]
            done[m[2]] = nxt[1]
    assert len(done) == n_slabs
    tail = [ln for ln in log if ln.startswith("wait stream=0 ")]
    assert sorted(t.split("event=")[1] for t in tail) == sorted(done.values())


@pytest.mark.parametrize("grid", [(7, 3, 1), (1, 1, 5), (2, 9, 1), (3, 1, 1)])
@pytest.mark.parametrize("gpus", [2, 3, 4])
def test_runtime_partition_equals_the_replay_rule(built, grid, gpus):
    """§6.2: each thread block runs exactly once, on the GPU partition() gives it; slab launches
    carry the slab's grid, in order, on devices 0..N-1; the caller's device and argument come back
    unchanged."""
    res, err = run_part(built, grid, gpus)
    assert res["rc"] == 0 and res["dev_after"] == 0
    dim, parts = partition(grid, gpus)
    want = np.full(int(np.prod(grid)), -1)
    for g, tbs in enumerate(parts):
        want[tbs] = g
    assert res["owner"] == want.tolist()
    assert set(res["hits"]) == {2}                      # two launches, every block once each
    log = res["log"].splitlines()
    launches = [ln for ln in log if ln.startswith("launch ")]
    slabs = [g for g, tbs in enumerate(parts) if len(tbs)]
    assert len(launches) == 2 * len(slabs)
    for ln, g in zip(launches, slabs * 2):
        assert f"dev={g} " in ln and MANGLED in ln
        sg = list(grid)
        sg[dim] = len(parts[g]) * grid[dim] // int(np.prod(grid))
        assert ln.endswith("grid=" + ",".join(map(str, sg)))
    half = len(log) // 2
    check_wiring(log[:half], len(slabs))
    check_wiring(log[half:], len(slabs))
    st = stats(err)
    assert st["partitioned"] == "2" and st["part_fallbacks"] == "0"
    # §6.4: `in` is marked read-only by the first launch and written (unmarked) by the second
    assert st["read_mostly"] == "1,1"


def test_read_only_advice_without_parameter_sizes(built):
    """Driver 580 / CUDA 13 gave no parameter sizes for nvcc-built kernels: the ro_mask's
    arguments are then taken as pointers, and a flagged buffer the next launch does not mark
    read-only loses its flag (a written READ_MOSTLY buffer bounced between 2 H200s, 100x slower)."""
    res, err = run_part(built, (8, 4, 1), 2, param_info=False)
    st = stats(err)
    assert st["partitioned"] == "2" and st["read_mostly"] == "1,1"
    assert set(res["hits"]) == {2}


def test_kernel_without_convention_or_magic_runs_once_unchanged(built):
    res, err = run_part(built, (8, 4, 1), 4, variant="plain")
    launches = [ln for ln in res["log"].splitlines() if ln.startswith("launch ")]
    assert launches == ["launch _Z10plain_kernPjPi dev=0 stream=0 grid=8,4,1"]
    assert set(res["owner"]) == {0} and set(res["hits"]) == {1} and stats(err)["partitioned"] == "0"
    res, err = run_part(built, (8, 4, 1), 4, variant="nomagic")
    launches = [ln for ln in res["log"].splitlines() if ln.startswith("launch ")]
    assert len(launches) == 2 and all("dev=0 stream=0 grid=8,4,1" in ln for ln in launches)
    assert set(res["hits"]) == {2}
    assert stats(err)["partitioned"] == "0" and stats(err)["part_fallbacks"] == "2"


def test_more_gpus_than_devices_is_a_clean_single_launch(built):
    res, err = run_part(built, (7, 3, 1), 3, devices=2)
    assert set(res["owner"]) == {0} and set(res["hits"]) == {2}
    assert "not partitioned" in err and stats(err)["partitioned"] == "0"


def test_one_gpu_is_unchanged(built):
    res, err = run_part(built, (7, 3, 1), 1)
    assert set(res["owner"]) == {0} and stats(err)["partitioned"] == "0"
    assert res["log"].count("launch ") == 2


# -- the CLI --------------------------------------------------------------------------------

def cli(capsys, *args) -> tuple[int, str]:
    code = main(list(args))
    _, err = capsys.readouterr()
    return code, err


@pytest.mark.parametrize("args,msg", [
    (["run", "--mode", "snurhac-sp", "--gpus", "2", "--", "true"], "access ranges"),
    (["run", "--mode", "snurhac-sp-dp", "--gpus", "2", "--", "true"], "access ranges"),
    (["run", "--mode", "snurhac", "--", "true"], "needs --gpus"),
    (["run", "--mode", "snurhac", "--gpus", "0", "--", "true"], "1 or more"),
    (["run", "--mode", "snurhac-dp", "--gpus", "9", "--", "true"], "has 4 GPUs"),
    (["run", "--mode", "deepum", "--gpus", "2", "--", "true"], "--gpus is for"),
    (["run", "--mode", "snurhac", "--gpus", "2", "--budget", "1GiB", "--", "true"], "no --budget"),
    (["attach", "--pid", "1", "--mode", "snurhac"], "must start under umctl"),
])
def test_cli_refusals_are_one_line(capsys, monkeypatch, args, msg):
    monkeypatch.setattr("umctl.live.spec.gpus_present", lambda: 4)
    code, err = cli(capsys, *args)
    assert code != 0 and msg in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_snurhac_run_sets_up_the_runtime(monkeypatch):
    """--gpus N: managed routing, partitioning over N GPUs, a controller with N GPUs' tables."""
    from umctl.live.spec import ControlSpec

    monkeypatch.setattr("umctl.live.spec.gpus_present", lambda: 4)
    spec = ControlSpec("snurhac-dp", None, None, None, 0, None, 4, live_run=True)
    assert spec.gpus == 4 and spec.controller.name == "snurhac-dp"
    env = child_env({}, library="/x.so", managed=True, gpus="4")
    assert env["UMCTL_RT_GPUS"] == "4" and env["UMCTL_RT_MANAGED"] == "1"


# -- the replay controller, live ------------------------------------------------------------

BASE = 0x7F00_0000_0000
GPUS = [{"gpu": g, "uuid": f"GPU-{g}", "memory_bytes": 80 << 30} for g in range(4)]


def fault_batch(t: int, pages, gpu: int, write: bool = False, batch_id: int = 0) -> EventBatch:
    f = empty(Kind.FAULT, len(pages))
    f["t_ns"], f["gpu"], f["batch_id"] = t, gpu, batch_id
    f["addr"] = BASE + np.asarray(pages, np.uint64) * PAGE_SIZE
    f["access"] = 1 if write else 0
    b = EventBatch(now_ns=t)
    b.add(Kind.FAULT, f)
    return b


def test_live_dynamic_prefetch_per_gpu():
    """snurhac-dp live: a block only read so far is prefetched whole to the faulting GPU (the
    stand-in for the read-only flag the runtime sets in-process); a written block is not, but
    its repeating fault sequence is learned per GPU and prefetched to that GPU."""
    act = FakeActuator()
    lc = LiveControl(make_controller("snurhac-dp"), act, pid=1, gpus=GPUS)
    lc.step(fault_batch(1, [3], gpu=2))
    cmds = act.all()
    assert len(cmds) == 1 and int(cmds["op"][0]) == Op.PREFETCH and int(cmds["dst"][0]) == 2
    assert int(cmds["addr"][0]) == (BASE >> BLOCK_SHIFT) << BLOCK_SHIFT and int(cmds["bytes"][0]) == BLOCK_SIZE
    # written pages in block 5, the same order three times on GPU 1: later, the successors
    pages = [5 * 512 + k for k in (0, 7, 3, 9)]
    for rep in range(3):
        for i, p in enumerate(pages):
            lc.step(fault_batch(10 + rep * 10 + i, [p], gpu=1, write=True, batch_id=rep * 10 + i))
    got = [c for c in act.all() if int(c["dst"]) == 1]
    assert got and all(int(c["op"]) == Op.PREFETCH for c in got)
    assert {(int(c["addr"]) - BASE) // PAGE_SIZE for c in got} & set(pages[1:])
    assert lc.ctl.stats()["correlation_pages"] > 0
    # a GPU the program was not spread over is not tracked (and does not crash the tables)
    lc.step(fault_batch(100, [1], gpu=7))


def test_gpu_programs_compile_and_follow_the_convention(tmp_path):
    """tests/gpu/snurhac/*.cu build as the benchmark builds them (nvcc -cudart shared, so the
    runtime interposes the launches), and each kernel's mangled name carries umctl_part_t as its
    first parameter, which is what the runtime looks for. Skipped without nvcc."""
    import shutil

    cc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)
    if cc is None:
        pytest.skip("nvcc not installed")
    src = Path(__file__).resolve().parent / "gpu" / "snurhac"
    kernels = {"gemm": ["gemm_kernel"], "gesummv": ["gesummv_kernel"], "stencil": ["calculate_temp"],
               "nbody": ["nbody_step"], "binomial": ["binomial_kernel"],
               "covariance": ["mean_kernel", "reduce_kernel", "covar_kernel"]}
    assert sorted(p.stem for p in src.glob("*.cu")) == sorted(kernels)
    procs = {prog: subprocess.Popen([cc, "-O3", "-arch=sm_90", "-cudart", "shared", "-o", str(tmp_path / prog),
                                     str(src / f"{prog}.cu")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for prog in kernels}
    for prog, names in kernels.items():
        _, err = procs[prog].communicate(timeout=300)
        assert procs[prog].returncode == 0, err
        blob = (tmp_path / prog).read_bytes()
        for kernel in names:
            assert f"_Z{len(kernel)}{kernel}12umctl_part_t".encode() in blob, (prog, kernel)
