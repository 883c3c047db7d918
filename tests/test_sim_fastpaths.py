"""The simulator's speed-ups give the results of the plain algorithms they replace: the access
stream as runs, the LRU tree against a scan of every block, the word-wide hit test."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from umctl.controller import make_controller
from umctl.sim.engine import Simulator
from umctl.workload.scenario import load_scenario
from umctl.workload.workload import AccessRuns, Workload


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3000), st.booleans()), max_size=200), st.integers(0, 250),
       st.integers(0, 250))
def test_runs_round_trip(accesses, a, b):
    pages = np.array([p for p, _ in accesses], np.int64)
    writes = np.array([w for _, w in accesses], np.bool_)
    runs = AccessRuns.from_flat(pages, writes)
    assert runs.n_accesses == len(pages) and (runs.length >= 1).all()
    got_p, got_w = runs.expand()
    assert np.array_equal(got_p, pages) and np.array_equal(got_w, writes)
    lo, hi = min(a, b, len(pages)), min(max(a, b), len(pages))
    sp, sw = runs.expand(lo, hi)
    assert np.array_equal(sp, pages[lo:hi]) and np.array_equal(sw, writes[lo:hi])
    split = runs.split_blocks(9)
    assert np.array_equal(split.expand()[0], pages)
    assert ((split.page >> 9) == ((split.page + split.length - 1) >> 9)).all()   # one block each


def test_of_pages_is_from_flat_of_one_kind():
    pages = np.array([4, 5, 6, 9, 10, 2, 3, 3], np.int64)
    a = AccessRuns.of_pages(pages, True)
    b = AccessRuns.from_flat(pages, np.ones(len(pages), np.bool_))
    assert a.page.tolist() == b.page.tolist() == [4, 9, 2, 3]
    assert a.length.tolist() == b.length.tolist() == [3, 2, 2, 1]
    assert a.write.all()


def _flat_copy(w: Workload) -> Workload:
    """The same workload given by flat per-access arrays, as a trace file gives it."""
    return Workload(w.name, w.ops, w.acc_page.copy(), w.acc_write.copy(), w.allocations, w.names, w.n_gpus,
                    w.gpu_mem, w.params, w.meta, w.thread_blocks, w.acc_win)


def _replay(w: Workload, mode: str):
    sim = Simulator(w, make_controller(mode))
    sim.cs.lru_check = 1
    r = sim.run()
    return sim, r


@pytest.mark.parametrize("scenario,params,mode", [
    ("gpt2-l", {"oversub": "2", "iterations": "2"}, "none"),
    ("gpt2-l", {"oversub": "2", "iterations": "2"}, "deepum"),
    ("dlrm", {"iterations": "2"}, "none"),
    ("huvm-pair", {}, "harvest"),
])
def test_runs_and_flat_replay_alike_and_lru_tree_matches_scan(scenario, params, mode):
    w = load_scenario(scenario, params)
    sim_r, r = _replay(w, mode)
    sim_f, f = _replay(_flat_copy(w), mode)
    assert r.evictions + r.preevictions > 0          # the victim choice was exercised
    assert sim_r.cs.lru_mismatch == 0 and sim_f.cs.lru_mismatch == 0
    for k in ("time_ns", "faults", "fault_batches", "bytes_h2d", "bytes_d2h", "evictions", "preevictions",
              "prefetch_used", "fault_causes"):
        assert getattr(r, k) == getattr(f, k), k
    assert np.array_equal(r.kernel_end_ns, f.kernel_end_ns)


def test_lru_tree_root_is_least_recently_migrated_block():
    w = load_scenario("gpt2-l", {"oversub": "2", "iterations": "1"})
    sim = Simulator(w, make_controller("deepum"))
    sim.run()
    key = np.where(sim.has_chunk[0] & ~sim.pinned[0], sim.lru[0], np.inf)
    assert np.isfinite(key).any()
    assert sim._lru_tree[0, 1] == int(np.argmin(key))   # argmin: the lowest block on a tie


def test_local_span_is_the_union_of_local_range():
    from umctl.sim.pagespace import PageSpace
    rng = np.random.default_rng(2)
    for _ in range(200):
        n = int(rng.integers(1, 6))
        addrs = np.sort(rng.choice(200, n, replace=False)) * (2 << 20) + rng.integers(0, 512, n) * 4096
        space = PageSpace(addrs, rng.integers(1, 5 * (2 << 20), n))
        for _ in range(5):
            a, nbytes = int(rng.integers(0, 210 * (2 << 20))), int(rng.integers(-5, 8 * (2 << 20)))
            pieces = space.local_range(a, nbytes)
            assert all(x[1] == y[0] for x, y in zip(pieces, pieces[1:]))   # they continue one another
            assert space.local_span(a, nbytes) == ((pieces[0][0], pieces[-1][1]) if pieces else (0, 0))
