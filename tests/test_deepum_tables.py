"""DeepUM's tables and chaining against the paper's worked examples (figures 5, 6, 7)."""

import numpy as np
import pytest

from umctl.controller.deepum import BlockTable, Chain, DeepUMController
from umctl.controller.tables import ExecCorrelationTable, ExecIdTable, PairCorrelationTable
from umctl.events.schema import DTYPES, Kind

a, b, c, d, e, f, g, k, n, p, q, t, i, u = range(1, 15)


def test_figure5_pair_based_correlation_table():
    """Misses a, b, c: a holds b in level 1 and c in level 2; b holds c. Then a misses again:
    c gets a (level 1), b gets a (level 2), and a's row (b, c) is what gets prefetched."""
    tab = PairCorrelationTable(num_rows=64, assoc=1, num_succs=4, num_levels=2)
    for x in (a, b, c):
        tab.record(x)
    assert tab.successors(a, 0) == [b] and tab.successors(a, 1) == [c]
    assert tab.successors(b, 0) == [c] and tab.successors(b, 1) == []
    assert tab.last == [c, b]  # Last, SecondLast
    tab.record(a)
    assert tab.successors(c, 0) == [a]
    assert tab.successors(b, 1) == [a]
    assert tab.last == [a, c]
    assert tab.successors(a) == [b, c]  # prefetched on the miss of a


def test_mru_order_num_succs_and_associativity():
    tab = PairCorrelationTable(num_rows=1, assoc=2, num_succs=2, num_levels=1)
    for x in (a, b, a, c, a, d, a, c):
        tab.record(x)
    assert tab.successors(a) == [c, d]  # most recent first, at most NumSuccs
    # one row, two ways: a third key evicts the least recently used way
    assert sum(1 for _ in tab.keys()) == 2
    assert tab.n_evicted > 0


def test_figure6_execution_id_correlation_table():
    """Entry 0 holds (7, 9, 92, 75): 7, 9, 92 ran, 0 runs now, 75 is next. Entries hold a
    variable number of records."""
    tab = ExecCorrelationTable(fallback=False)
    seq = [7, 9, 92, 0, 75]
    for j in range(3, len(seq) - 1):
        tab.record(tuple(seq[j - 3:j]), seq[j], seq[j + 1])
    assert tab.records(0) == [(7, 9, 92, 75)]
    assert tab.predict((7, 9, 92), 0) == 75
    for rec in ((89, 53, 24, 10), (34, 52, 22, 99), (4, 3, 939, 2)):
        tab.record(rec[:3], 1, rec[3])
    assert tab.records(1) == [(89, 53, 24, 10), (34, 52, 22, 99), (4, 3, 939, 2)]
    assert tab.predict((34, 52, 22), 1) == 99
    assert tab.predict((1, 1, 1), 1) is None
    assert ExecCorrelationTable(fallback=True).predict((1, 1, 1), 5) is None


def test_execution_ids_follow_hashes():
    ids = ExecIdTable()
    assert [ids.get(h) for h in (0xAB, 0xCD, 0xAB, 0xEF)] == [0, 1, 0, 2]
    assert len(ids) == 3


def _pair(table: BlockTable, src: int, dst: int) -> None:
    """Record the miss pair src -> dst (and nothing before src)."""
    table.last = []
    table.record(src)
    table.record(dst)


def _figure7_controller(degree: int = 32) -> DeepUMController:
    """The block tables of figure 7 and an execution history in which 1 follows 0."""
    ctl = DeepUMController(degree=degree)
    t0 = ctl.tables[0] = BlockTable(2048, 2, 4)
    for src, succs in ((a, (p, b)), (b, (q, e)), (c, (d,))):  # recorded oldest first: MRU ends first
        for s in succs:
            _pair(t0, src, s)
    t0.start, t0.end = a, q
    t1 = ctl.tables[1] = BlockTable(2048, 2, 4)
    for src, succs in ((f, (u, e)), (g, (i, t)), (k, (n, g))):
        for s in succs:
            _pair(t1, src, s)
    t1.start, t1.end = k, u
    ctl.exec_table.record((5, 6, 7), 0, 1)
    ctl.history = [5, 6, 7, 0]
    ctl.cur = 0
    return ctl


def _walk(ctl: DeepUMController, limit: int) -> list[tuple[int, int]]:
    """The walk's output as (block, execution ID) pairs."""
    blocks, execs = ctl._walk(limit)
    return list(zip(blocks.tolist(), execs.tolist()))


def test_figure7_tables_as_drawn():
    ctl = _figure7_controller()
    assert ctl.tables[0].successors(a) == [b, p] and ctl.tables[0].successors(b) == [e, q]
    assert ctl.tables[1].successors(k) == [g, n] and ctl.tables[1].successors(g) == [t, i]


def test_figure7_chaining_walkthrough():
    """Prefetching b for kernel 0: its successors e and q are prefetched; q is kernel 0's end
    block, so the walk predicts kernel 1 and continues from its start block k."""
    ctl = _figure7_controller()
    ctl.chain = Chain(0, (5, 6, 7), b)
    out = _walk(ctl, 100)
    assert out[:3] == [(e, 0), (q, 0), (k, 1)]
    assert out[3:5] == [(g, 1), (n, 1)]
    assert (t, 1) in out and (i, 1) in out
    assert ctl.chain is None  # nothing predicted after kernel 1: the walk ends


def test_chaining_pauses_after_degree_kernels_and_resumes():
    ctl = DeepUMController(degree=2)
    for x in range(6):  # kernels 0..5, each with one block 100+x, in a loop
        tb = ctl.tables[x] = BlockTable(64, 2, 4)
        tb.record(100 + x)
        tb.start = tb.end = 100 + x
    hist = [3, 4, 5]
    for x in list(range(6)) * 2:
        ctl.exec_table.record(tuple(hist[-3:]), x, (x + 1) % 6)
        hist.append(x)
    ctl.history, ctl.cur = [3, 4, 5, 0], 0
    ctl.chain = Chain(0, (3, 4, 5), None)
    out = _walk(ctl, 100)
    assert [blk for blk, _ in out] == [100, 101, 102]  # current kernel + 2 ahead
    assert ctl.chain.paused
    # kernel 0 finishes (kernel 1 launches): the walk resumes and covers one more kernel
    ctl.exec_ids.ids = {1000 + x: x for x in range(6)}
    ev = np.zeros(1, DTYPES[Kind.LAUNCH])[0]
    ev["exec_hash"] = 1001
    ctl._launch(ev)
    assert not ctl.chain.paused
    assert [blk for blk, _ in _walk(ctl, 100)] == [103]


@pytest.mark.parametrize("rows,assoc,succs", [(128, 2, 4), (2048, 2, 4), (4096, 2, 4), (512, 4, 4)])
def test_table_nbytes_is_the_fixed_array_size(rows, assoc, succs):
    assert BlockTable(rows, assoc, succs).nbytes() == rows * assoc * (1 + succs) * 8


def _run_kernels(ctl: DeepUMController, kernels: list[tuple[int, list[int]]]) -> None:
    """Launch each (exec_hash, faulted blocks) in order, faulting its blocks in turn."""
    for h, blocks in kernels:
        ev = np.zeros(1, DTYPES[Kind.LAUNCH])[0]
        ev["exec_hash"] = h
        ctl._launch(ev)
        for blk in blocks:
            ctl._fault(blk, 0)


@pytest.mark.parametrize("trained_ends", [True, False])
def test_a_late_fault_inside_a_trained_kernel_keeps_its_start_and_end(trained_ends):
    """Iteration 1 trains kernel A on blocks 10..14 (start 10, end 14). In iteration 2 its only
    fault is a late one on block 12, which DeepUM holds: the literal reading
    (trained_ends=false) moves start and end to 12, so the next walk covers 12 alone; by
    default they stay. A block DeepUM does not hold (the tensors moved, or the walk missed
    it) still becomes the start."""
    ctl = DeepUMController(trained_ends=trained_ends)
    A, B = 1001, 1002
    _run_kernels(ctl, [(A, [10, 11, 12, 13, 14]), (B, [20, 21])])
    ta = ctl.tables[ctl.exec_ids.get(A)]
    assert (ta.start, ta.end) == (10, 14)
    _run_kernels(ctl, [(A, [12]), (B, [])])
    assert (ta.start, ta.end) == ((10, 14) if trained_ends else (12, 12))
    _run_kernels(ctl, [(A, [30, 31]), (B, [])])
    assert ta.start == 30 and ta.end == 31
    ctl._unmark(11)                        # the driver evicted block 11: a fault on it is a gap
    _run_kernels(ctl, [(A, [11]), (B, [])])
    assert (ta.start, ta.end) == (11, 11)


def test_trained_ends_is_a_mode_option():
    from umctl.controller.options import mode_options

    assert mode_options("deepum")["trained_ends"].default is True
    assert DeepUMController(trained_ends=False).trained_ends is False
