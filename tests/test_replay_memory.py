"""Memory at the papers' scale (issue 35 §4): the oracle's tables are per run / per use, never
per access; a replay that would not fit is refused up front in one line; out of memory is one
line too; and none of it changes a replay's numbers."""

from __future__ import annotations

import os
import tracemalloc

import numpy as np
import pytest

from umctl import UmctlError
from umctl.cli.main import main
from umctl.controller.base import make_controller
from umctl.sim.engine import Simulator
from umctl.sim.replay import check_memory, estimate_bytes, run_modes
from umctl.workload.target import resolve_target
from umctl.workload.workload import AccessRuns

DATA = os.path.join(os.path.dirname(__file__), "data", "real")


@pytest.fixture(scope="module")
def gpt2():
    return resolve_target("gpt2-xl", {"iterations": "2"})   # 2.1 M accesses in 14 K runs


def _init_peak(workload, mode: str) -> tuple[int, object]:
    ctl = make_controller(mode)
    tracemalloc.start()
    try:
        Simulator(workload, ctl)
        return tracemalloc.get_traced_memory()[1], ctl
    finally:
        tracemalloc.stop()


def test_oracle_memory_per_access_is_bounded(gpt2):
    """The oracle's future (uses, their pages, Belady's next uses) costs well under a byte per
    access: the old per-access tables took ~8 B/access kept and ~90 B/access at set-up."""
    n = gpt2.n_accesses
    peak_none, _ = _init_peak(gpt2, "none")
    peak_oracle, ctl = _init_peak(gpt2, "oracle")
    kept = sum(v.nbytes for v in vars(ctl).values() if isinstance(v, np.ndarray))
    assert kept < 1.0 * n, f"oracle keeps {kept / n:.2f} B per access"
    assert peak_oracle - peak_none < 2.0 * n, f"oracle set-up peaks at {(peak_oracle - peak_none) / n:.2f} B per access"
    # and the workload was never expanded to one entry per access
    assert gpt2._acc_page is None


def test_cut_at_keeps_the_stream():
    r = AccessRuns(np.array([10, 100]), np.array([5, 3]), np.array([False, True]))
    c = r.cut_at(np.array([2, 5, 7, 0, 8]))
    assert c.n_accesses == r.n_accesses and len(c) == 4
    assert all((a == b).all() for a, b in zip(c.expand(), r.expand()))
    assert r.cut_at(np.array([5])) is r


#: replay numbers before issue 35 §4 (time_ns, faults, evictions, bytes_h2d, bytes_d2h): the
#: memory work must not move any of them. dlrm's oracle re-recorded when the simulator began to
#: wait for write-backs (tests/test_bound_writeback.py): 14 K of its faults read back pages it had
#: pre-evicted, which now wait for their write-back on the GPU->host queue (310.2 -> 400.6 ms;
#: 302.7 ms with that wait switched off)
EXPECTED = {
    ("gpt2-l", (("iterations", "1"),)): {
        "none": [271907697, 111626, 479, 520011776, 1000984576],
        "deepum": [271907697, 111626, 479, 520011776, 1000984576],   # one iteration: none's
        "oracle": [58754989, 11609, 0, 493854720, 429916160]},
    ("dlrm", (("iterations", "2"),)): {
        "none": [553307467, 108176, 1523, 3277676544, 3181494272],
        "oracle": [400610006, 36660, 0, 3810402304, 3665981440]},
    (os.path.join(DATA, "gemm.parquet"), ()): {
        "none": [158696730, 44856, 0, 360710144, 192938020],
        "oracle": [134788172, 10505, 0, 427819008, 260046884]},
}


@pytest.mark.parametrize("target,params", list(EXPECTED), ids=lambda x: os.path.basename(x) if isinstance(x, str) else "")
def test_replay_numbers_unchanged(target, params):
    w = resolve_target(target, dict(params))
    want = EXPECTED[(target, params)]
    got = {r.mode: [r.time_ns, r.faults, r.evictions, r.bytes_h2d, r.bytes_d2h] for r in run_modes(w, list(want))}
    assert got == want


def test_estimate_scales_with_the_workload(gpt2):
    small = resolve_target("gpt2-xl", {"iterations": "1"})
    assert 0 < estimate_bytes(small, ["none"]) < estimate_bytes(gpt2, ["none"]) <= estimate_bytes(gpt2, ["none", "oracle"])
    with pytest.raises(UmctlError, match=r"needs about .*--max-rss is 1 MiB"):
        check_memory(gpt2, ["none"], 1 << 20)
    assert check_memory(gpt2, ["none"], 1 << 50) > 0


def test_max_rss_refuses_in_one_line(capsys):
    rc = main(["replay", "gpt2-xl", "--iters", "1", "-m", "none,oracle", "--max-rss", "64MiB", "--json"])
    cap = capsys.readouterr()
    assert rc != 0
    assert cap.out == ""
    lines = [ln for ln in cap.err.splitlines() if ln.strip()]
    assert len(lines) == 1, cap.err
    assert lines[0].startswith("umctl: error: this replay needs about ") and "--max-rss is 64 MiB" in lines[0]


def test_max_rss_bad_size(capsys):
    assert main(["replay", "gpt2-xl", "--iters", "1", "--max-rss", "lots"]) != 0
    assert "--max-rss" in capsys.readouterr().err


def test_out_of_memory_is_one_line(monkeypatch, capsys):
    """numpy's _ArrayMemoryError (a MemoryError) at the replay edge: one line, no traceback."""
    import umctl.sim.replay as replay

    class Boom(Simulator):
        def __init__(self, *a, **k):
            np.empty(1 << 60, np.uint8)   # numpy's _ArrayMemoryError: "Unable to allocate 1 EiB ..."

    monkeypatch.setattr(replay, "Simulator", Boom)
    rc = main(["replay", "gpt2-xl", "--iters", "1", "-m", "none", "--json"])
    err = capsys.readouterr().err
    assert rc != 0
    assert "Traceback" not in err and len([ln for ln in err.splitlines() if ln.strip()]) == 1
    assert err.startswith("umctl: error: out of memory replaying gpt2-xl under mode none")
