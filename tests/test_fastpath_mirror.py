"""The fast path's mirror of DeepUM's tables (umctl/actuators/fastpath.py merged_successors):
what the in-kernel walk gets must be the controller's own successor lists, for the current
kernel and the predicted next ones, chained end block -> next start block."""

from __future__ import annotations

import numpy as np

from umctl.actuators.fastpath import NSUCCS, merged_successors
from umctl.controller import make_controller
from umctl.events.schema import EventBatch, Kind, empty
from umctl.units import BLOCK_SHIFT

KERNELS = {101: 1000, 102: 2000, 103: 3000}   # exec hash -> first block; 4 blocks each


def run(ctl, iters: int) -> None:
    t = 1
    for _ in range(iters):
        for h, b0 in KERNELS.items():
            la = empty(Kind.LAUNCH, 1)
            la["t_ns"], la["exec_hash"], la["pid"] = t, h, 1
            t += 1
            f = empty(Kind.FAULT, 4)
            f["t_ns"] = np.arange(t, t + 4)
            f["batch_id"] = t
            f["addr"] = (np.arange(b0, b0 + 4, dtype=np.uint64) << np.uint64(BLOCK_SHIFT))
            t += 4
            b = EventBatch(now_ns=t)
            b.add(Kind.LAUNCH, la)
            b.add(Kind.FAULT, f)
            ctl.on_events(b)


def test_mirror_follows_tables_and_chains_kernels():
    ctl = make_controller("deepum")
    assert merged_successors(ctl) == {}            # nothing launched yet
    run(ctl, 2)
    # the last launch was kernel 103: current = 103, predicted next 101, then 102
    m = merged_successors(ctl, kernels=3)
    assert m[3000] == (3001,) and m[3001] == (3002,) and m[3002] == (3003,)
    assert m[3003][0] == 1000                       # end of 103 -> start of 101
    assert m[1003][0] == 2000                       # end of 101 -> start of 102
    assert all(len(s) <= NSUCCS for s in m.values())
    # only the current kernel when asked for one
    one = merged_successors(ctl, kernels=1)
    assert set(one) == {3000, 3001, 3002}
