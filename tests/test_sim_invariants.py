"""Simulator invariants: capacity, conservation of bytes and data, completion, determinism."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simkit import Chaos, mini_dnn, sweep
from umctl.controller import make_controller
from umctl.events.schema import AllocOp
from umctl.sim.engine import Simulator, simulate
from umctl.workload.workload import Init, WorkloadBuilder
from umctl.units import BLOCK_SIZE, MiB, PAGE_SIZE


def _check_conservation(sim: Simulator, r) -> None:
    # every byte moved host->GPU has exactly one cause
    assert r.bytes_h2d == r.demand_bytes + r.driver_prefetch_bytes + r.user_prefetch_bytes + \
        sum(int(o["bytes"]) for o in sim.w.ops if o["type"] == 3 and o["copy_kind"] == 0)
    # without read-mostly duplication a page lives in at most one place
    if not sim.read_mostly.any():
        m = sim.managed
        gm = sim.gmask[m]
        assert not np.any((gm != 0) & sim.cpu_valid[m])
        assert not np.any(gm & (gm - 1))  # at most one GPU bit
    # chunk bookkeeping matches page residency
    for g in range(sim.n_gpus):
        bit = sim._bit(g)
        per_block = ((sim.gmask & bit) != 0).reshape(-1, 512).sum(1)
        assert np.array_equal(per_block, sim.rescount[g])
        assert np.all(sim.has_chunk[g][per_block > 0])
        assert int(sim.has_chunk[g].sum()) + int(sim.npending[g]) <= sim.cap[g]


def test_cold_sweep_completes_every_access():
    w = sweep(256 * MiB)
    sim = Simulator(w, make_controller("none"))
    r = sim.run()
    assert r.accesses == w.n_accesses and r.kernels == 1
    assert np.all((sim.gmask[sim.runs.expand()[0]] & 1) == 1)  # everything touched is resident now
    assert r.bytes_h2d == 256 * MiB
    assert 0 < r.faults <= w.n_accesses
    _check_conservation(sim, r)


def test_oversubscribed_never_exceeds_capacity_and_writes_back():
    w = mini_dnn(oversub=2.0)
    sim = Simulator(w, make_controller("none"))
    r = sim.run()
    _check_conservation(sim, r)
    assert r.evictions > 0 and r.bytes_d2h > 0
    assert r.evicted_bytes <= r.evictions * BLOCK_SIZE


def test_data_is_never_lost():
    """Host-initialised weights stay populated somewhere under eviction pressure."""
    w = mini_dnn(oversub=3.0)
    sim = Simulator(w, make_controller("none"))
    sim.run()
    weights = [a for a in w.allocations if w.names[a["name_id"]].startswith("w")]
    for a in weights:
        for lo, hi in sim.space.local_range(int(a["addr"]), int(a["bytes"])):
            assert np.all((sim.gmask[lo:hi] != 0) | sim.cpu_valid[lo:hi])


def test_same_seed_same_result_and_seed_matters():
    w = mini_dnn()
    a = simulate(w, make_controller("none"), seed=3).summary()
    b = simulate(w, make_controller("none"), seed=3).summary()
    for k in ("time_ns", "faults", "fault_batches", "bytes_h2d", "bytes_d2h", "evictions"):
        assert a[k] == b[k]
    c = simulate(w, make_controller("none"), seed=4).summary()
    assert (c["faults"], c["time_ns"]) != (a["faults"], a["time_ns"])


def test_kernel_time_includes_compute_and_stalls():
    w = mini_dnn()
    r = simulate(w, make_controller("none"))
    assert np.all(r.kernel_end_ns >= r.kernel_start_ns)
    assert r.time_ns >= r.compute_ns + r.stall_ns - len(r.kernel_end_ns)  # rounding
    assert np.all(np.diff(r.kernel_start_ns) >= 0)  # one stream: launches in order


def test_free_invalidates_and_gives_chunks_back():
    b = WorkloadBuilder("free", gpu_mem=64 * MiB)
    x = b.alloc("x", 32 * MiB, init=Init.HOST)
    b.kernel("k", reads=[x], compute_ns=1000)
    b.mem(AllocOp.FREE, x)
    w = b.build()
    sim = Simulator(w, make_controller("none"))
    sim.run()
    assert sim.used[0] == 0 and not sim.gmask.any() and not sim.cpu_valid.any()


@st.composite
def workloads(draw):
    n_gpus = draw(st.integers(1, 3))
    cap_blocks = draw(st.integers(2, 12))
    b = WorkloadBuilder("prop", n_gpus=n_gpus, gpu_mem=cap_blocks * BLOCK_SIZE)
    bufs = [b.alloc(f"a{i}", draw(st.integers(1, 3 * 512)) * PAGE_SIZE,
                    init=draw(st.sampled_from([Init.HOST, Init.UNTOUCHED])))
            for i in range(draw(st.integers(1, 5)))]
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    for k in range(draw(st.integers(1, 12))):
        kind = draw(st.integers(0, 3))
        buf = bufs[draw(st.integers(0, len(bufs) - 1))]
        pages = buf.pages()
        if kind == 0:
            parts = [(pages, False)]
        elif kind == 1:  # random gather, revisits included
            parts = [(rng.choice(pages, size=min(len(pages), 300)), bool(rng.random() < 0.5))]
        elif kind == 2:
            parts = [(pages[::-1], True)]
        else:
            b.host_write(buf, 1000)
            continue
        b.kernel(f"k{k}", pages=parts, compute_ns=int(rng.integers(0, 10**6)), gpu=int(rng.integers(0, n_gpus)))
        if rng.random() < 0.2:
            b.mem(AllocOp.BLOCK_INACTIVE, buf)
    return b.build()


@settings(max_examples=int(__import__("os").environ.get("UMCTL_HYPOTHESIS_EXAMPLES", 60)), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads(), seed=st.integers(0, 1000), mode=st.sampled_from(["none", "oracle", "chaos"]))
def test_invariants_hold_for_random_workloads_and_commands(w, seed, mode):
    ctl = Chaos(seed, w.n_gpus) if mode == "chaos" else make_controller(mode)
    sim = Simulator(w, ctl, seed=seed)
    r = sim.run()
    k = w.kernels
    assert r.accesses == int((k["acc_hi"] - k["acc_lo"]).sum())
    assert r.kernels == len(k)
    assert r.faults <= r.accesses + r.prefetch_pages
    assert r.prefetch_used + r.prefetch_wasted <= r.prefetch_pages
    # every fault is charged to exactly one cause, in total and per iteration
    assert sum(r.fault_causes.values()) == r.faults
    assert (r.iteration_fault_causes.sum(axis=1) == r.iteration_faults).all()
    _check_conservation(sim, r)


def test_recorded_events_account_for_every_byte(tmp_path):
    """The trace of a replay and the replay's totals agree: migrations by cause sum to the
    host<->GPU byte counters, fault records to the fault count."""
    from umctl.events.schema import Cause, Kind
    from umctl.events.trace import TraceWriter, read_trace

    w = mini_dnn()
    path = tmp_path / "run.parquet"
    with TraceWriter(path, {"gpu_mem": w.gpu_mem}, names=w.names) as tw:
        r = Simulator(w, make_controller("oracle"), recorder=tw).run()
    t = read_trace(path)
    m = t.events(Kind.MIGRATION)
    h2d, d2h = m[m["src"] == -1], m[m["dst"] == -1]
    assert int(h2d["bytes"].sum()) == r.bytes_h2d
    assert int(d2h["bytes"].sum()) == r.bytes_d2h
    assert int(h2d["bytes"][h2d["cause"] == Cause.DEMAND].sum()) == r.demand_bytes
    assert int(h2d["bytes"][h2d["cause"] == Cause.DRIVER_PREFETCH].sum()) == r.driver_prefetch_bytes
    assert len(t.events(Kind.FAULT)) == r.faults
    assert len(t.events(Kind.REPLAY)) == r.fault_batches
    assert len(t.events(Kind.LAUNCH)) == r.kernels
    assert len(t.events(Kind.COMMAND)) == r.commands
