"""Live source on a real GPU (device machine): attach to the test workloads and check what
must be true. Run with ``python3 -m pytest -m gpu tests/gpu``."""

import os
import subprocess
import sys

import numpy as np
import pytest

from umctl.cli.main import main as umctl_main
from umctl.events.schema import Cause, Kind
from umctl.events.trace import read_trace
from umctl.sources.uvmtools import ALL_KINDS, NoUvm, UvmToolsSource

HERE = os.path.dirname(os.path.abspath(__file__))
#: the workload programs the GPU tests run (benchmarks/gpu/workloads/)
WORKLOADS = os.path.join(os.path.dirname(os.path.dirname(HERE)), "benchmarks", "gpu", "workloads")
pytestmark = pytest.mark.gpu


def _start(script, *args):
    p = subprocess.Popen([sys.executable, os.path.join(WORKLOADS, script), "--wait", *args], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, bufsize=1)
    line = p.stdout.readline()
    assert line.startswith("READY"), line
    _, pid, base, nbytes = line.split()
    return p, int(pid), int(base), int(nbytes)


def _collect(src, proc):
    batches = []
    proc.stdin.write("GO\n")
    proc.stdin.flush()
    lines = []
    for line in proc.stdout:
        lines.append(line)
        batches.append(src.drain())
        if line.startswith("DONE"):
            break
    assert proc.wait(timeout=60) == 0
    src.stop()
    batches.append(src.drain())
    return batches, lines


def _cat(batches, kind):
    arrs = [b[kind] for b in batches if kind in b]
    return np.concatenate(arrs) if arrs else batches[0][kind][:0]


def test_sweep_faults_land_in_the_managed_buffer_and_nothing_is_dropped():
    proc, pid, base, nbytes = _start("wl_sweep.py", "--mib", "256", "--passes", "3", "--thrash")
    src = UvmToolsSource(pid, ALL_KINDS).start()
    try:
        batches, lines = _collect(src, proc)
    finally:
        src.close()
    faults = _cat(batches, Kind.FAULT)
    thrash_line = next(ln for ln in lines if ln.startswith("THRASH"))
    _, tbase, tbytes = thrash_line.split()
    ranges = [(base, base + nbytes), (int(tbase), int(tbase) + int(tbytes))]
    inside = np.zeros(len(faults), dtype=bool)
    for lo, hi in ranges:
        inside |= (faults["addr"] >= lo) & (faults["addr"] < hi)
    assert len(faults) > 3 * (nbytes >> 16) // 4, len(faults)  # at least ~one fault per 64 KiB per pass
    assert inside.all(), hex(int(faults["addr"][~inside][0]))
    assert (faults["pid"] == pid).all() and (faults["gpu"] == 0).all()
    # every 4 KiB page of the sweep buffer faulted on the GPU at least once or was prefetched along
    mig = _cat(batches, Kind.MIGRATION)
    h2d = mig[(mig["src"] == -1) & (mig["dst"] == 0)]
    assert int(h2d["bytes"].sum()) >= 3 * nbytes
    assert set(np.unique(h2d["cause"]).tolist()) <= {Cause.DEMAND, Cause.DRIVER_PREFETCH, Cause.USER}
    replays = _cat(batches, Kind.REPLAY)
    assert len(replays) > 0 and int(replays["nfaults"].sum()) == len(faults)
    assert src.dropped_total == 0
    cpu = _cat(batches, Kind.CPU_FAULT)
    assert len(cpu) > 0 and (cpu["pid"] == pid).all()
    ts = faults["t_ns"]
    assert (np.diff(ts) >= 0).mean() > 0.99  # faults arrive in time order


def test_attaching_to_a_process_without_cuda_says_so():
    # a child of ours, not this process: an earlier test may have initialised CUDA in pytest
    p = subprocess.Popen(["sleep", "30"])
    try:
        with pytest.raises(NoUvm):
            UvmToolsSource(p.pid).start()
    finally:
        p.kill()
        p.wait()


def test_record_torch_training_loop_and_replay(tmp_path, capsys):
    trace = tmp_path / "torch.parquet"
    code = umctl_main(["run", "-o", str(trace), "--quiet", "--", sys.executable, os.path.join(WORKLOADS, "wl_torch.py"),
                       "--steps", "8"])
    out, err = capsys.readouterr()
    assert code == 0, err
    t = read_trace(trace)
    assert t.counts()[Kind.FAULT] > 0
    assert t.meta["source"] == "umctl run" and t.meta["gpu_mem"][0] > 0
    code = umctl_main(["replay", str(trace), "--mode", "none", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err


def test_record_sweep_replays(tmp_path, capsys):
    trace = tmp_path / "sweep.parquet"
    code = umctl_main(["run", "-o", str(trace), "--quiet", "--", sys.executable, os.path.join(WORKLOADS, "wl_sweep.py"),
                       "--mib", "256", "--passes", "2"])
    out, err = capsys.readouterr()
    assert code == 0, err
    t = read_trace(trace)
    f = t.events(Kind.FAULT)
    assert len(f) > 1000
    code = umctl_main(["replay", str(trace), "--mode", "none", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
