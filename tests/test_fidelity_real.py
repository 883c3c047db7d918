"""Replay of real H100 recordings against the time the programs measured (issue 23, item 5).

tests/data/real/ holds four recorded runs (benchmarks/gpu/fidelity_real.py record, 2026-11-25,
H100 80GB HBM3, driver 580.159.04): each trace carries the span its program timed itself over
and NAME.json beside it the measured time. The replay is deterministic, so this checks the
model (tracefile -> simulator, shipped h100-r580 calibration), not the machine. Also the span,
host-time and CPU-fault bookkeeping of umctl/workload/tracefile.py on small synthetic traces."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from umctl.events.schema import EventBatch, Kind, empty
from umctl.events.trace import TraceWriter, read_trace
from umctl.workload.tracefile import workload_from_trace
from umctl.workload.workload import OpType
from umctl.units import PAGE_SHIFT

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "real"
SPEC = importlib.util.spec_from_file_location("fidelity_real", ROOT / "benchmarks" / "gpu" / "fidelity_real.py")
fidelity = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(fidelity)

#: the bound every shipped recording replays within (docs/evaluation/fidelity-h100.md)
BOUND_PCT = 20.0


@pytest.mark.parametrize("name", ["transformer", "gemm", "gather", "stencil"])
def test_real_recording_replays_near_its_measured_time(name: str) -> None:
    info = json.loads((DATA / f"{name}.json").read_text())
    row = {"measured_ms": info["measured_ms"], **fidelity.replay(DATA / f"{name}.parquet")}
    assert row["span_ms"] == pytest.approx(info["measured_ms"], rel=0.01)   # the trace's span is the timed one
    assert row["calibration"] == "h100-r580"                                # the shipped h100-r580 file, by its name
    assert abs(fidelity.error_pct(row)) <= BOUND_PCT, row
    assert row["sim_batches"] > 0 and row["rec_batches"] > 0


def test_recordings_are_small() -> None:
    for p in DATA.glob("*.parquet"):
        assert p.stat().st_size < 2 << 20, p


# -- spans and recorded host time, on synthetic traces --------------------------------------

BASE_PAGE = 0x7F00_0000_0000 >> PAGE_SHIFT
MS = 1_000_000


def _trace(path: Path, arrays: dict, meta: dict | None = None):
    b = EventBatch(names=["k"])
    for k, a in arrays.items():
        b.add(k, a)
    with TraceWriter(path, {"gpu_mem": 64 << 20, **(meta or {})}) as w:
        w.write(b)
    return read_trace(path)


def _launches(t) -> np.ndarray:
    out = empty(Kind.LAUNCH, len(t))
    out["t_ns"], out["pid"], out["name_id"], out["seq"] = t, 42, 0, np.arange(len(t))
    out["grid"], out["block"] = (1, 1, 1), (32, 1, 1)
    return out


def _faults(t, page) -> np.ndarray:
    out = empty(Kind.FAULT, len(t))
    out["t_ns"], out["addr"], out["pid"], out["batch_id"] = t, (BASE_PAGE + np.asarray(page)) << PAGE_SHIFT, 42, t
    return out


def _cpu_faults(t, page) -> np.ndarray:
    out = empty(Kind.CPU_FAULT, len(t))
    out["t_ns"], out["addr"], out["pid"] = t, (BASE_PAGE + np.asarray(page)) << PAGE_SHIFT, 42
    return out


def test_span_cuts_the_trace_and_keeps_the_lead_in(tmp_path: Path) -> None:
    """Launches before the span (warm-up) and after it (exit) are left out; the span's start
    to its first launch is host time; the last kernel runs until the span's end."""
    la = _launches([1 * MS, 10 * MS, 12 * MS, 50 * MS])
    f = _faults([1 * MS + 10, 10 * MS + 10, 12 * MS + 10, 50 * MS + 10], [0, 1, 2, 3])
    tr = _trace(tmp_path / "s.parquet", {Kind.LAUNCH: la, Kind.FAULT: f}, {"measured_span_ns": [7 * MS, 20 * MS]})
    w = workload_from_trace(tr)
    assert w.meta["replayed_span_ns"] == [7 * MS, 20 * MS]
    assert w.ops["type"][0] == OpType.HOST and w.ops["compute_ns"][0] == 3 * MS       # 7 -> 10 ms
    assert w.kernels["compute_ns"].tolist() == [2 * MS, 8 * MS]                       # 12 -> 20 ms, not 50
    assert sorted((w.acc_page - BASE_PAGE).tolist()) == [1, 2]
    whole = workload_from_trace(tr, span=(0, 60 * MS))                                # an explicit span wins
    assert len(whole.kernels) == 4


def test_faults_before_the_first_launch_keep_their_time(tmp_path: Path) -> None:
    """Faults before any launch (copies into managed memory, say) form a synthetic kernel that
    runs until the first launch, less the recorded batch service: the time passed."""
    la = _launches([30 * MS])
    f = _faults([5 * MS, 30 * MS + 10], [0, 1])
    rp = empty(Kind.REPLAY, 1)
    rp["t_ns"], rp["t_start_ns"], rp["batch_id"], rp["nfaults"] = 6 * MS, 5 * MS, 5 * MS, 1
    w = workload_from_trace(_trace(tmp_path / "e.parquet", {Kind.LAUNCH: la, Kind.FAULT: f, Kind.REPLAY: rp}))
    assert w.kernels["compute_ns"][0] == 25 * MS - 1 * MS


def test_host_first_touch_is_host_time_and_resident_touches_are_modelled(tmp_path: Path) -> None:
    """A burst of CPU faults on blocks no GPU has faulted (the host filling fresh memory) keeps
    its recorded time; one on blocks a GPU held is left to the simulator's CPU-fault cost."""
    la = _launches([20 * MS, 40 * MS])
    f = _faults([20 * MS + 10, 40 * MS + 10], [0, 0])
    fresh = _cpu_faults([2 * MS, 6 * MS, 10 * MS], [0, 16, 32])        # before any GPU fault: 8 ms of host time
    again = _cpu_faults([25 * MS, 29 * MS], [0, 16])                    # the GPU had faulted block 0 at 20 ms
    w = workload_from_trace(_trace(tmp_path / "h.parquet", {Kind.LAUNCH: la, Kind.FAULT: f,
                                                           Kind.CPU_FAULT: np.concatenate([fresh, again])}))
    hw = w.ops[w.ops["type"] == OpType.HOST_WRITE]
    assert hw["compute_ns"].tolist() == [8 * MS, 0]


def test_allocations_first_touched_by_a_gpu_start_untouched(tmp_path: Path) -> None:
    """A recorded allocation whose first touch is a GPU fault zero-fills on the GPU (no
    transfer); one the host touched first, or a copy filled, stays host-initialised."""
    from umctl.workload.workload import Init
    from umctl.units import BLOCK_SIZE

    al = empty(Kind.ALLOC, 3)
    al["t_ns"], al["pid"], al["op"], al["managed"] = 0, 42, 0, True
    al["addr"] = [(BASE_PAGE << PAGE_SHIFT) + i * BLOCK_SIZE for i in range(3)]
    al["bytes"], al["alloc_id"] = BLOCK_SIZE, [0, 1, 2]
    la = _launches([10 * MS])
    f = _faults([10 * MS + 10] * 3, [0, 512, 1024])                       # one fault in each allocation
    cf = _cpu_faults([5 * MS], [512])                                      # the host wrote allocation 1 first
    cp = empty(Kind.COPY, 1)
    cp["t_ns"], cp["dst_addr"], cp["bytes"], cp["pid"] = 6 * MS, (BASE_PAGE + 1024) << PAGE_SHIFT, 4096, 42
    w = workload_from_trace(_trace(tmp_path / "z.parquet", {Kind.ALLOC: al, Kind.LAUNCH: la, Kind.FAULT: f,
                                                           Kind.CPU_FAULT: cf, Kind.COPY: cp}))
    assert w.allocations["init"][:3].tolist() == [Init.UNTOUCHED, Init.HOST, Init.HOST]



def test_a_span_after_the_gpu_first_wrote_an_allocation_fetches_it_back(tmp_path: Path) -> None:
    """A replayed span starts with nothing on the GPU: an allocation the GPU zero-filled before
    the span (a warm-up step) holds data in it, so its faults in the span move bytes; one the GPU
    first touches inside the span still zero-fills (benchmarks/gpu/workloads/wl_convnet.py's cold steps)."""
    from umctl.controller.base import make_controller
    from umctl.sim.engine import simulate
    from umctl.workload.workload import Init
    from umctl.units import BLOCK_SIZE

    al = empty(Kind.ALLOC, 2)
    al["t_ns"], al["pid"], al["op"], al["managed"] = 0, 42, 0, True
    al["addr"] = [(BASE_PAGE << PAGE_SHIFT) + i * BLOCK_SIZE for i in range(2)]
    al["bytes"], al["alloc_id"] = BLOCK_SIZE, [0, 1]
    la = _launches([10 * MS, 30 * MS])
    f = _faults([10 * MS + 10, 30 * MS + 10, 30 * MS + 20], [0, 1, 512])   # warm-up writes alloc 0; the span faults both
    cf = _cpu_faults([20 * MS], [0])                                       # the host read page 0 back before the span
    tr = _trace(tmp_path / "s.parquet", {Kind.ALLOC: al, Kind.LAUNCH: la, Kind.FAULT: f, Kind.CPU_FAULT: cf})
    whole = workload_from_trace(tr)
    assert whole.allocations["init"][:2].tolist() == [Init.UNTOUCHED, Init.UNTOUCHED]
    span = workload_from_trace(tr, span=(25 * MS, 40 * MS))
    assert span.allocations["init"][:2].tolist() == [Init.HOST, Init.UNTOUCHED]
    assert simulate(span, make_controller("none")).bytes_h2d > 0

def test_reread_pages_ride_in_the_batch_that_faulted_their_block(tmp_path: Path) -> None:
    """After the host fills a block, the first kernel faulting it is taken to read the block's
    written pages: they join that fault's recorded batch (one simulated window), right after it."""
    la = _launches([20 * MS])
    f = _faults([20 * MS + 10, 20 * MS + 10], [3, 600])                  # one batch, blocks 0 and 1
    cf = _cpu_faults([2 * MS, 3 * MS, 4 * MS], [0, 8, 16])                # the host filled pages 0..31 of block 0
    w = workload_from_trace(_trace(tmp_path / "r.parquet", {Kind.LAUNCH: la, Kind.FAULT: f, Kind.CPU_FAULT: cf}))
    k = w.kernels[0]
    pages = (w.acc_page[k["acc_lo"]:k["acc_hi"]] - BASE_PAGE).tolist()
    assert pages[0] == 3 and pages[-1] == 600 and sorted(pages[1:-1]) == [p for p in range(32) if p != 3]
    assert w.acc_win[k["acc_lo"]] == len(pages)                            # the whole kernel is one window


def test_a_cpu_fault_moves_the_drivers_density_region() -> None:
    """A host sweeping a GPU-resident block faults at 0, 16, 32, 64, 128, 256 and moves all of
    it; scattered faults move their 64 KiB regions (the probe's 476 faults moved 31 MiB)."""
    from umctl.workload.tracefile import _fill_host_runs

    blk = 3 << 9
    sweep = _fill_host_runs(np.array([blk + o for o in (0, 16, 32, 64, 128, 256)], np.int64))
    assert sweep.tolist() == list(range(blk, blk + 512))
    scattered = _fill_host_runs(np.array([blk + 5, blk + 200, blk + 450], np.int64))
    assert scattered.tolist() == list(range(blk, blk + 16)) + list(range(blk + 192, blk + 208)) + \
        list(range(blk + 448, blk + 464))
    # half a block on the host already: the next fault takes the whole block (> 51 %)
    dense = _fill_host_runs(np.array([blk + o for o in range(0, 256, 16)] + [blk + 300], np.int64))
    assert dense.tolist() == list(range(blk, blk + 512))


def test_stall_is_subtracted_after_the_burst_cap(tmp_path: Path) -> None:
    """A kernel the host waits for before writing memory: its duration is launch -> burst, less
    the batches serviced in it (not the gap to the next launch less them, then capped)."""
    la = _launches([0, 100 * MS])
    f = _faults([1 * MS, 101 * MS], [0, 600])
    rp = empty(Kind.REPLAY, 1)
    rp["t_ns"], rp["t_start_ns"], rp["batch_id"], rp["nfaults"] = 21 * MS, 1 * MS, 1 * MS, 1
    cf = _cpu_faults([50 * MS], [1024])
    w = workload_from_trace(_trace(tmp_path / "c.parquet", {Kind.LAUNCH: la, Kind.FAULT: f, Kind.REPLAY: rp,
                                                           Kind.CPU_FAULT: cf}))
    assert w.kernels["compute_ns"][0] == 50 * MS - 20 * MS


def test_conv_probe_replays_the_shipped_recording_and_compares_with_the_model() -> None:
    """benchmarks/gpu/conv_probe.py on its shipped H100 recording (batch 16, one bottleneck per
    stage): the recorded statistics of each cold step, three replays, and the fault path's
    time against umctl's synthetic ResNet of the same net."""
    spec = importlib.util.spec_from_file_location("conv_probe", ROOT / "benchmarks" / "gpu" / "conv_probe.py")
    cp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cp)
    trace = DATA / "convnet.parquet"
    rows, meta = cp.replay(trace)
    assert [r["phase"] for r in rows] == ["cold0", "cold1"]
    assert rows[0]["entries"] == 124_047 and rows[0]["pages"] == 40_368 and rows[0]["batches"] == 811
    for r in rows:
        assert all(r[k]["ms"] > 0 and r[k]["h2d_bytes"] > 0 for k in ("recorded", "window", "sorted"))
    cmp = cp.against_model(meta, rows)
    assert cmp["batch"] == 16 and cmp["blocks"] == "1,1,1,1"
    assert cmp["model"]["cold_ms"] > cmp["model"]["warm_ms"] > 0
    for ph in cmp["phases"]:
        assert ph["error_pct"] == pytest.approx(100 * (ph["model_ms"] / ph["measured_ms"] - 1))
    assert "| cold0 | 150.8 |" in cp.table(rows)


def test_probe_scripts_reject_bad_input_in_one_line(tmp_path: Path) -> None:
    """conv_probe and footprint_probe: a file that is not what they read, or a malformed row,
    is a one-line error and exit 1, not a traceback."""
    import subprocess
    import sys

    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    cases = [("conv_probe.py", ["replay", str(bad)], "not a Parquet file"),
             ("conv_probe.py", ["replay", str(DATA / "gemm.parquet")], "no phases"),
             ("footprint_probe.py", ["compare", str(bad)], "is not JSON"),
             ("footprint_probe.py", ["run", "--only", "gpt2"], "bad row 'gpt2'")]
    for script, args, want in cases:
        p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / script), *args],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 1, (script, args, p.stderr)
        assert want in p.stderr and "Traceback" not in p.stderr
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr
