"""One control loop (umctl/loop/control.py): a replay and a live session issue the same commands
for the same events.

The replay runs a workload with the simulator as the loop's source and actuator and records
every delivery (the events the loop was handed, then the COMMAND and RESULT records it
returned). The same event batches are then fed, one by one, to a live loop (``LiveControl``
with a stand-in actuator that answers every command OK, as the simulator does), and the
COMMAND records of every step are compared (op, addr, bytes, dst). If the replay filtered
subscriptions, kept residency or evicted over a budget by a rule of its own, they would part.
"""

from __future__ import annotations

import numpy as np
import pytest

from umctl.controller.base import make_controller
from umctl.events.schema import EventBatch, Kind, Op
from umctl.live.control import LiveControl
from umctl.sim.engine import Simulator
from umctl.units import MiB

from simkit import mini_dnn
from test_live_control import FakeActuator

FIELDS = ("op", "addr", "bytes", "dst")


class Deliveries:
    """A recorder keeping each delivery: (events handed to the loop, the loop's COMMANDs)."""

    def __init__(self) -> None:
        self.steps: list[list] = []

    def write(self, batch: EventBatch) -> None:
        if Kind.COMMAND in batch.arrays or Kind.RESULT in batch.arrays:
            if self.steps:   # the loop's output follows the events it answered
                self.steps[-1][1] = batch[Kind.COMMAND].copy()
        else:
            self.steps.append([batch, None])

    def close(self) -> None:
        pass


def _cmds(a: np.ndarray | None) -> list[tuple]:
    return [] if a is None else [tuple(int(r[f]) for f in FIELDS) for r in a]


def both_ways(mode: str, budget: int | None):
    """(replay's commands per step, live loop's commands per step, the replay's result)."""
    w = mini_dnn(gpu_mem=64 * MiB, oversub=2.0, layers=8, iters=2)
    rec = Deliveries()
    r = Simulator(w, make_controller(mode), recorder=rec, budget_bytes=budget).run()
    # safe_invalidate: DeepUM discards live only where the program's runtime carries it out; a
    # replay's model is that runtime
    live = LiveControl(make_controller(mode), FakeActuator(), pid=0, gpus=[{"gpu": 0, "memory_bytes": w.gpu_mem[0]}],
                       budget_bytes=budget, safe_invalidate=True, migrations_on=True)
    replayed, lived = [], []
    for events, cmds in rec.steps:
        replayed.append(_cmds(cmds))
        lived.append(_cmds(live.step(events)[Kind.COMMAND]))
    live.finish()
    return replayed, lived, r, live


@pytest.mark.parametrize("mode,budget", [("none", 40 * MiB), ("deepum", 40 * MiB), ("deepum", None)])
def test_replay_and_live_loop_issue_the_same_commands(mode, budget):
    replayed, lived, r, live = both_ways(mode, budget)
    assert len(replayed) > 10
    issued = sum(map(len, replayed))
    if budget is not None or mode != "none":
        assert issued > 0, "nothing was issued: the comparison would be empty"
    if budget is not None:   # the keeper evicted: the budget is the loop's, not the GPU's
        assert any(op == Op.PREEVICT for step in replayed for op, *_ in step)
        assert r.budget["overflow_blocks_evicted"] == live.stats()["budget"]["overflow_blocks_evicted"] > 0
    for i, (a, b) in enumerate(zip(replayed, lived)):
        assert a == b, f"step {i}: replay issued {len(a)} commands, the live loop {len(b)}"
    assert r.commands == issued


def test_the_comparison_can_fail():
    """A live loop under another budget issues other commands for the same events."""
    w = mini_dnn(gpu_mem=64 * MiB, oversub=2.0, layers=8, iters=2)
    rec = Deliveries()
    Simulator(w, make_controller("none"), recorder=rec, budget_bytes=40 * MiB).run()
    live = LiveControl(make_controller("none"), FakeActuator(), pid=0, gpus=[{"gpu": 0, "memory_bytes": w.gpu_mem[0]}],
                       budget_bytes=20 * MiB)
    assert any(_cmds(c) != _cmds(live.step(e)[Kind.COMMAND]) for e, c in rec.steps)
