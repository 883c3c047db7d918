"""The DeepUM walk reuses a traced path through each block table while the table is unchanged
(``Segment``). These tests run it step by step beside the walk as §4.2 states it, hop by hop
over live tables, on random tables, residency, limits, pauses, restarts and table updates
between steps: both must offer the same blocks for the same kernels and stop in the same place."""

import random
from dataclasses import dataclass, field

import pytest

from umctl.controller.deepum import BlockTable, Chain, DeepUMController


@dataclass
class RefChain:
    exec_id: int
    hist: tuple
    block: int | None
    path: list = field(default_factory=list)
    visited: set = field(default_factory=set)
    paused: bool = False


def ref_next(ctl: DeepUMController, c: RefChain):
    if len(c.path) >= ctl.degree:
        c.paused = True
        return c
    nxt = ctl.exec_table.predict(c.hist, c.exec_id)
    if nxt is None:
        return None
    c.hist = (c.hist[1], c.hist[2], c.exec_id)
    c.exec_id, c.block, c.visited = nxt, None, set()
    c.path.append(nxt)
    return c


def ref_walk(ctl: DeepUMController, c: RefChain | None, limit: int):
    """The walk hop by hop: offer the successors of the block, leave a kernel's table at its end
    block (or a dead end), predict the next kernel, pause after ``degree`` kernels."""
    out, seen = [], set()
    while c is not None and not c.paused and len(out) < limit:
        t = ctl.tables.get(c.exec_id)
        if t is None or (c.block is None and t.start is None):
            c = ref_next(ctl, c)
            continue
        if c.block is None:
            c.block = t.start
            c.visited.add(c.block)
            if c.block not in seen and c.block not in ctl.resident:
                out.append((c.block, c.exec_id))
                seen.add(c.block)
        if c.block == t.end:
            c = ref_next(ctl, c)
            continue
        succ = t.successors(c.block, 0)
        for s in succ:
            if s not in seen and s not in ctl.resident:
                out.append((s, c.exec_id))
                seen.add(s)
        if t.end is not None and t.end in succ:
            c = ref_next(ctl, c)
            continue
        nxt = next((s for s in succ if s not in c.visited), None)
        if nxt is None:
            c = ref_next(ctl, c)
            continue
        c.visited.add(nxt)
        c.block = nxt
    return out, c


def random_controller(rng: random.Random, kernels: int, universe: int) -> DeepUMController:
    ctl = DeepUMController(degree=rng.randint(1, 4))
    for x in range(kernels):
        tb = ctl.tables[x] = BlockTable(rng.choice([4, 16, 64]), rng.choice([1, 2]), rng.choice([1, 2, 4]))
        seq = [rng.randrange(universe) for _ in range(rng.randint(1, 25))]
        for blk in seq:
            tb.record(blk)
        tb.start = seq[0] if rng.random() < 0.9 else None
        tb.end = rng.choice(seq) if rng.random() < 0.8 else None
    hist = [-1, -1, -1]
    for x in list(range(kernels)) * 2:
        ctl.exec_table.record(tuple(hist[-3:]), x, (x + 1) % kernels)
        hist.append(x)
    return ctl


@pytest.mark.parametrize("seed", range(80))
def test_segment_walk_matches_the_hop_by_hop_walk(seed):
    rng = random.Random(seed)
    universe = 40
    ctl = random_controller(rng, rng.randint(1, 6), universe)
    for blk in rng.sample(range(universe), rng.randint(0, universe // 2)):
        ctl._mark(blk, 0.0)
    ref: RefChain | None = None
    ctl.chain = None
    for step in range(40):
        if ref is None or rng.random() < 0.25:      # a fault restarts the walk (or a fresh start)
            x = rng.randrange(len(ctl.tables))
            blk = None if rng.random() < 0.3 else rng.randrange(universe)
            hist = (-1, -1, -1)
            ref = RefChain(x, hist, blk)
            ctl.chain = Chain(x, hist, blk)
        limit = rng.randint(1, 12)
        want, ref = ref_walk(ctl, ref, limit)
        blocks, execs = ctl._walk(limit)
        assert list(zip(blocks.tolist(), execs.tolist())) == want, (seed, step)
        assert (ctl.chain is None) == (ref is None), (seed, step)
        if ref is not None:
            assert (ctl.chain.exec_id, ctl.chain.paused, ctl.chain.path) == (ref.exec_id, ref.paused, ref.path)
        for blk, _ in want:                          # prefetched: now resident
            ctl._mark(blk, float(step))
        for blk in rng.sample(sorted(ctl.resident), min(len(ctl.resident), rng.randint(0, 4))):
            ctl._unmark(blk)                          # evicted meanwhile
        if rng.random() < 0.4:                        # a kernel's table learns (and may change the path)
            tb = ctl.tables[rng.randrange(len(ctl.tables))]
            for _ in range(rng.randint(1, 3)):
                tb.record(rng.randrange(universe))
        if ref is not None and ref.paused:            # the current kernel finished: resume
            if ref.path:
                ref.path.pop(0)
                ctl.chain.path.pop(0)
            ref.paused = ctl.chain.paused = False
