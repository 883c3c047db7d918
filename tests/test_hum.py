"""HUM (PPoPP'20 §4): the chunked-copy mechanism, the mode's rules, and orderings on the family."""

from __future__ import annotations

import numpy as np
import pytest

from umctl import UmctlError
from umctl.controller import make_controller
from umctl.controller.hum import hum_copies, may_start_early, rewrite
from umctl.events.schema import CopyKind
from umctl.sim.calibration import DEFAULT
from umctl.sim.engine import simulate
from umctl.sim.replay import run_modes
from umctl.sim.umcopy import ChunkedCopies, chunk_sizes
from umctl.workload.scenario import load_scenario
from umctl.workload.workload import OpType, WorkloadBuilder
from umctl.units import MiB


def _engine(stage_Bps=1e15, **kw) -> tuple[ChunkedCopies, dict]:
    done: dict[int, float] = {}
    eng = ChunkedCopies(stage_Bps=stage_Bps, migrate_Bps=2 * MiB * 1e3, latency_ns=0.0,   # 1 ms per chunk
                        set_done=lambda e, t: done.__setitem__(e, t), **kw)
    return eng, done


# -- the chunked copy (umcopy.py) --------------------------------------------------------------

def test_chunks_are_2mib_with_the_remainder_last() -> None:
    assert chunk_sizes(5 * MiB).tolist() == [2 * MiB, 2 * MiB, MiB]
    assert chunk_sizes(2 * MiB).tolist() == [2 * MiB]


def test_copies_back_to_back_are_migrated_round_robin() -> None:
    """§4.6: one PMQ per copy, the PMT visits the non-empty queues round-robin (Fig. 8(c))."""
    eng, done = _engine()
    a = eng.issue(0, 0.0, 6 * MiB, np.array([1, 2, 3]))
    b = eng.issue(0, 0.0, 6 * MiB, np.array([4, 5, 6]))
    order = sorted(done, key=done.get)
    assert order == [1, 4, 2, 5, 3, 6]
    assert b.done_ns[0] < a.done_ns[-1]      # B's first chunk arrives before A is complete


def test_one_copy_alone_is_served_in_order_and_back_to_back() -> None:
    eng, done = _engine()
    c = eng.issue(0, 0.0, 8 * MiB, np.arange(1, 5))
    assert np.all(np.diff(c.done_ns) > 0)
    assert c.done_ns[-1] == pytest.approx(4e6)   # four 1 ms migrations, no gaps


def test_a_later_copy_only_moves_chunks_not_started_before_it() -> None:
    eng, done = _engine()
    a = eng.issue(0, 0.0, 8 * MiB, np.arange(1, 5))
    before = a.done_ns.copy()
    eng.issue(0, 1.5e6, 4 * MiB, np.array([9, 10]))   # A's chunk 1 started at 1 ms
    assert a.done_ns[:2].tolist() == before[:2].tolist()
    assert a.done_ns[-1] > before[-1]                # A's tail now shares the thread with B
    with pytest.raises(ValueError):
        eng.issue(0, 1.0e6, 2 * MiB, np.array([11]))  # issues come in time order


def test_migration_waits_for_staging() -> None:
    """A chunk joins its queue once staged (host -> host UM, §4.5): with slow staging the
    migrations follow it."""
    eng, done = _engine(stage_Bps=2 * MiB * 1e3 / 2)   # 2 ms per chunk to stage
    c = eng.issue(0, 0.0, 6 * MiB, np.array([1, 2, 3]))
    assert np.all(c.start_ns >= c.staged_ns)
    assert c.staged_ns.tolist() == pytest.approx([2e6, 4e6, 6e6])


# -- the mode's rules (controller/hum.py) -------------------------------------------------------

def _program(kernel_reads_copy: bool = True, two_copies: bool = False, rewrite_src: bool = False,
             host_gbps: float = 4.0, compute_ns: int = 0):
    b = WorkloadBuilder("t", gpu_mem=256 * MiB)
    hA = b.alloc("hA", 32 * MiB, managed=False, gpu=-1)
    dA = b.alloc("dA", 32 * MiB, managed=False, gpu=0)
    hB = b.alloc("hB", 32 * MiB, managed=False, gpu=-1)
    dB = b.alloc("dB", 32 * MiB, managed=False, gpu=0)
    b.host_write(hA, int(32 * MiB / host_gbps))
    b.copy(hA, dA, kind=CopyKind.H2D)
    if two_copies:
        b.host_write(hB, int(32 * MiB / host_gbps))
        b.copy(hB, dB, kind=CopyKind.H2D)
    if rewrite_src:
        b.host_write(hA, int(32 * MiB / host_gbps))
    reads = ([dA, dB] if two_copies else [dA]) if kernel_reads_copy else [dB]
    b.kernel("k", reads=reads, compute_ns=compute_ns)
    return b.build()


def test_early_start_needs_the_preceding_copy_to_be_a_dependence() -> None:
    """§4.6 conditions: K's stream predecessor is a copy C K depends on, C initiated, C's target
    pages unmapped once since."""
    w, _ = rewrite(_program())
    ops = w.ops
    c = ops[ops["type"] == OpType.UM_COPY][0]
    k = ops[ops["type"] == OpType.KERNEL][0]
    assert may_start_early(c, k, w)
    assert not may_start_early(c, k, w, initiated=False)
    assert not may_start_early(c, k, w, unmapped=False)
    assert not may_start_early(None, k, w)
    assert not may_start_early(k, k, w)            # predecessor is not a copy
    w2, _ = rewrite(_program(kernel_reads_copy=False))
    c2 = w2.ops[w2.ops["type"] == OpType.UM_COPY][0]
    k2 = w2.ops[w2.ops["type"] == OpType.KERNEL][0]
    assert not may_start_early(c2, k2, w2)         # condition 1: no dependence on C


def test_rewrite_makes_copies_chunked_and_destinations_managed() -> None:
    w = _program(two_copies=True)
    assert len(hum_copies(w)) == 2
    out, counts = rewrite(w)
    assert (out.ops["type"] == OpType.UM_COPY).sum() == 2
    assert (out.ops["type"] == OpType.COPY).sum() == 0
    a = out.allocations
    names = [out.names[i] for i in a["name_id"]]
    assert a["managed"][names.index("dA")] and a["managed"][names.index("dB")]
    assert not a["managed"][names.index("hA")]
    assert counts == {"copies": 2, "early_starts": 1, "stream_waits": 0}
    # HUM-no-sched: the second copy waits for the first (Fig. 8(b))
    ns, counts = rewrite(w, schedule=False)
    types = ns.ops["type"].tolist()
    assert types.index(OpType.STREAM_WAIT) == types.index(OpType.UM_COPY, types.index(OpType.UM_COPY) + 1) - 1
    # a kernel that does not depend on the copy before it keeps the stream order
    _, counts = rewrite(_program(kernel_reads_copy=False))
    assert counts["stream_waits"] == 1 and counts["early_starts"] == 0


def test_hum_refuses_programs_without_h2d_copies() -> None:
    w = load_scenario("gpt2-l", {"iterations": "1"})
    assert make_controller("hum").applies_to(w)
    with pytest.raises(UmctlError, match="mode hum does not apply"):
        run_modes(w, ["none", "hum"])
    assert make_controller("hum").applies_to(load_scenario("hum-sync")) is None


# -- the mechanism in the simulator -------------------------------------------------------------

def _tl(r, lane, label=None):
    return [(t0, t1) for ln, lb, t0, t1, _ in r.timeline if ln == lane and (label is None or label in lb)]


def test_kernel_starts_early_and_faults_wait_for_their_chunk() -> None:
    w = _program(compute_ns=0)
    r = simulate(w, make_controller("hum"), timeline=True)
    base = simulate(w, make_controller("none"), timeline=True)
    (k0, k1), = _tl(r, "kernel")
    chunks = _tl(r, "copy", "H2D")
    assert len(chunks) == 16 and r.um_copy_chunks == 16
    assert k0 < chunks[0][1]                 # started before the first chunk arrived
    assert k1 >= max(t1 for _, t1 in chunks)  # ... and could not finish before the last one
    assert r.faults > 0
    assert base.faults == 0 and r.time_ns < base.time_ns


def test_host_rewrite_of_a_source_waits_for_its_chunk() -> None:
    """§4.2: the source is write-protected until copied; a write to a page not yet copied waits
    for that page, so the copy sends the data plain CUDA would have sent."""
    w = _program(rewrite_src=True, host_gbps=100.0)   # the host writes faster than HUM stages
    r = simulate(w, make_controller("hum"), timeline=True)
    writes = _tl(r, "host", "write hA")
    stages = _tl(r, "stage")
    assert len(writes) == 2 and len(stages) == 16
    assert r.write_protect_wait_ns > 0
    assert writes[1][0] >= stages[0][1]      # the first page waited for the first chunk
    assert writes[1][1] >= stages[-1][1]     # and the write cannot end before the last chunk is read
    r2 = simulate(_program(rewrite_src=False, host_gbps=100.0), make_controller("hum"))
    assert r2.write_protect_wait_ns == 0


def test_sync_waits_for_chunked_copies() -> None:
    b = WorkloadBuilder("t", gpu_mem=128 * MiB)
    h = b.alloc("h", 16 * MiB, managed=False, gpu=-1)
    d = b.alloc("d", 16 * MiB, managed=False, gpu=0)
    b.copy(h, d, kind=CopyKind.H2D, is_async=True)
    b.sync()
    b.host(1_000_000)
    r = simulate(b.build(), make_controller("hum"), timeline=True)
    (h0, _), = _tl(r, "host", "compute")
    assert h0 >= max(t1 for _, t1 in _tl(r, "copy")) - 1.0   # the host went on only after the last chunk


# -- orderings on the family (HUM §5.2) ---------------------------------------------------------

@pytest.mark.parametrize("name", ["hum-sync", "hum-gemm", "hum-hostcompute", "hum-copybound",
                                  "hum-vectoradd", "hum-mixed"])
def test_hum_beats_plain_synchronous_cuda(name: str) -> None:
    w = load_scenario(name, {"async_copy": "false", "mixed_copies": "false", "iterations": "2"})
    none, hum, nosched = run_modes(w, ["none", "hum", "hum-no-sched"])
    assert hum.time_ns < none.time_ns
    assert hum.time_ns <= nosched.time_ns * 1.001      # scheduling never hurts
    assert hum.bytes_h2d == none.bytes_h2d              # the same bytes reach the GPU


def test_copy_scheduling_pays_off_when_staging_outruns_migration() -> None:
    """Fig. 8(b) vs (c): with the copies back to back and an element-wise kernel, round-robin
    queues let the kernel start on B's first chunk instead of waiting for all of A."""
    w = load_scenario("hum-vectoradd", {"iterations": "1"})
    calib = DEFAULT.with_overrides(um_stage_Bps=60e9)
    hum = simulate(w, make_controller("hum"), calib=calib)
    nosched = simulate(w, make_controller("hum-no-sched"), calib=calib)
    assert hum.time_ns < nosched.time_ns


def test_rewrite_scenario_waits_on_write_protection() -> None:
    r = simulate(load_scenario("hum-rewrite", {"async_copy": "false", "iterations": "1"}), make_controller("hum"))
    assert r.write_protect_wait_ns > 0
    r = simulate(load_scenario("hum-sync", {"iterations": "1"}), make_controller("hum"))
    assert r.write_protect_wait_ns == 0


def test_timeline_png(tmp_path) -> None:
    from umctl.report.png import timeline_png

    w = load_scenario("hum-vectoradd", {"iterations": "1"})
    rs = [simulate(w, make_controller(m), timeline=True) for m in ("none", "hum")]
    out = tmp_path / "t.png"
    timeline_png(rs, str(out), "t")
    assert out.stat().st_size > 10_000
    with pytest.raises(ValueError):
        timeline_png([simulate(w, make_controller("none"))], str(out), "t")


def test_cli_runs_hum_side_by_side_with_a_timeline_and_refuses_it_elsewhere(capsys, tmp_path) -> None:
    import json

    from umctl.cli.main import main

    png = tmp_path / "tl.png"
    assert main(["replay", "hum-vectoradd", "--iters", "1", "-m", "none,hum-no-sched,hum", "--json",
                 "--timeline", str(png)]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["mode"] for r in rows] == ["none", "hum-no-sched", "hum"] and rows[2]["speedup"] > 1.0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["replay", "gpt2-l", "--iters", "1", "-m", "none,hum"]) != 0
    err = capsys.readouterr().err
    assert "mode hum does not apply" in err and len(err.strip().splitlines()) == 1
