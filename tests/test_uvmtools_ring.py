"""Ring consumer and drain thread on a fake control block driven by the driver's enqueue
protocol (see produce() in test_uvmtools_source.py): wrap-around, full ring, drops, and no
event lost or duplicated across thousands of interleaved produce/drain steps."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from umctl.driver import abi
from umctl.sources.uvmtools.ring import Drainer, LagHistogram, Ring
from test_uvmtools_source import produce


def make_ring(n: int) -> tuple[Ring, np.ndarray, np.ndarray]:
    entries = np.zeros(n, dtype=abi.ENTRY_DTYPE)
    control = np.zeros(1, dtype=abi.CONTROL_DTYPE)
    return Ring(entries, control), entries, control


def numbered(start: int, count: int, etype: int = abi.EV_GPU_FAULT) -> np.ndarray:
    e = np.zeros(count, dtype=abi.ENTRY_DTYPE)
    e["type"] = etype
    e["g_addr"] = np.arange(start, start + count, dtype=np.uint64)
    return e


def test_ring_needs_a_power_of_two():
    with pytest.raises(ValueError):
        Ring(np.zeros(12, dtype=abi.ENTRY_DTYPE), np.zeros(1, dtype=abi.CONTROL_DTYPE))


def test_wrap_around_keeps_order_and_releases_slots():
    ring, entries, control = make_ring(8)
    assert produce(entries, control, numbered(0, 6)) == 6
    assert ring.drain()["g_addr"].tolist() == list(range(6))
    assert int(control["get_behind"][0]) == 6 == int(control["get_ahead"][0])
    assert produce(entries, control, numbered(6, 7)) == 7  # slots 6,7,0..4: wraps
    out = ring.drain()
    assert out["g_addr"].tolist() == list(range(6, 13)) and out.dtype == abi.ENTRY_DTYPE
    assert ring.pending() == 0 and len(ring.drain()) == 0


def test_full_ring_drops_and_counts_per_type():
    ring, entries, control = make_ring(8)
    assert produce(entries, control, numbered(0, 10)) == 7  # N - 1
    assert produce(entries, control, numbered(0, 2, abi.EV_MIGRATION)) == 0
    d = ring.dropped()
    assert d[abi.EV_GPU_FAULT] == 3 and d[abi.EV_MIGRATION] == 2
    assert ring.drain()["g_addr"].tolist() == list(range(7))
    assert produce(entries, control, numbered(100, 3)) == 3


def test_drain_limit_takes_the_oldest_first():
    ring, entries, control = make_ring(16)
    produce(entries, control, numbered(0, 10))
    assert ring.drain(limit=4)["g_addr"].tolist() == [0, 1, 2, 3]
    assert ring.drain()["g_addr"].tolist() == list(range(4, 10))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.booleans()), min_size=1, max_size=60),
       st.sampled_from([4, 8, 32]))
def test_no_event_lost_or_duplicated(steps, n):
    """Whatever the interleaving, drained + dropped == produced, and drained events come out
    in production order."""
    ring, entries, control = make_ring(n)
    seq = 0
    got: list[int] = []
    for count, drain in steps:
        produce(entries, control, numbered(seq, count))
        seq += count
        if drain:
            got.extend(ring.drain()["g_addr"].tolist())
    got.extend(ring.drain()["g_addr"].tolist())
    dropped = int(ring.dropped()[abi.EV_GPU_FAULT])
    assert len(got) + dropped == seq
    assert got == sorted(got) and len(set(got)) == len(got)


def test_drainer_thread_flushes_and_collects_everything():
    ring, entries, control = make_ring(64)
    produced = []

    def flush() -> None:  # like UVM_TOOLS_FLUSH_EVENTS: the driver hands over what it holds
        batch = numbered(len(produced), 5)
        produced.extend(batch["g_addr"].tolist())
        produce(entries, control, batch)

    d = Drainer(ring, flush=flush, flush_ms=1, drain_ms=1)
    d.start()
    time.sleep(0.1)
    d.stop()
    chunks = d.take()
    got = np.concatenate([c.entries["g_addr"] for c in chunks]).tolist()
    assert got == produced and len(got) >= 20
    assert d.stats.flushes >= 10 and d.stats.entries == len(got)
    assert all(c.drained_ns > 0 for c in chunks)


def test_lag_histogram_percentiles():
    h = LagHistogram()
    h.add(np.full(990, 1_000_000))   # 1 ms
    h.add(np.full(10, 50_000_000))   # 50 ms
    assert 1.0e6 <= h.percentile(50) <= 1.13e6
    assert 1.0e6 <= h.percentile(98) <= 1.13e6
    assert 50e6 <= h.percentile(99.5) <= 57e6
    assert LagHistogram().percentile(50) is None
