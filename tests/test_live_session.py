"""The live session as a library: a new source and a new actuator plug in through the declared
interfaces (umctl.live.interfaces) and run a controlled session end to end, with no CLI file
involved; the mode rules of umctl.live.spec come from the controller classes."""

from __future__ import annotations

import os

import numpy as np
import pytest

from umctl import UmctlError
from umctl.events.schema import EventBatch, Kind, Op, empty
from umctl.events.trace import read_trace
from umctl.live.interfaces import Actuator, LaunchSource, Source
from umctl.live.session import Session
from umctl.live.spec import ACTUATORS, ControlSpec
from umctl.units import BLOCK_SIZE

from test_live_control import FakeActuator   # an ActuatorBase: the shared bookkeeping

BASE = 0x7F00_0000_0000


class ScriptedSource:
    """A source that plays fault batches (one per drain) and then reports the target gone."""

    actuator = "scripted"

    def __init__(self, batches: list[list[int]]):
        self.pid = os.getpid()
        self.gpus = [{"gpu": 0, "memory_bytes": 1 << 30}]
        self.kinds = frozenset({Kind.FAULT})
        self._batches = list(batches)
        self._t = 1_000_000
        self.stopped = self.closed = False

    def drain(self) -> EventBatch:
        self._t += 1_000_000
        b = EventBatch(now_ns=self._t)
        if self._batches and not self.stopped:
            blocks = self._batches.pop(0)
            f = empty(Kind.FAULT, len(blocks))
            f["t_ns"], f["gpu"] = self._t, 0
            f["addr"] = BASE + np.asarray(blocks, np.uint64) * np.uint64(BLOCK_SIZE)
            b.add(Kind.FAULT, f)
        return b

    def counters(self) -> dict[str, int]:
        return {}

    def sample_fraction(self) -> float:
        return 1.0

    def exited(self) -> bool:
        return not self._batches

    def stats(self) -> dict:
        return {"scripted": True}

    def stop(self) -> None:
        self.stopped = True

    def close(self) -> None:
        self.closed = True


class NoLaunches:
    def drain(self) -> EventBatch:
        return EventBatch()

    def close(self) -> None:
        pass


def test_fakes_satisfy_the_declared_protocols():
    assert isinstance(ScriptedSource([]), Source)
    assert isinstance(FakeActuator(), Actuator)
    assert isinstance(NoLaunches(), LaunchSource)


def test_a_new_source_and_actuator_run_a_controlled_session(tmp_path, monkeypatch):
    """Mode none under a 32 MiB budget: 40 blocks fault in, the budget keeper pre-evicts the
    oldest through the registered actuator, and every command's RESULT reaches the trace."""
    act = FakeActuator()
    monkeypatch.setitem(ACTUATORS, "scripted", lambda src, rate: act)
    src = ScriptedSource([list(range(i, i + 8)) for i in range(0, 40, 8)])
    spec = ControlSpec("none", "32MiB", None, None, 0, None)
    ticks: list[float] = []
    trace = tmp_path / "s.parquet"
    r = Session(src, command="test", control=spec, output=str(trace), interval=0.0,
                on_tick=lambda s: ticks.append(s.elapsed())).run()
    assert r.reason == "target exited" and src.stopped and src.closed and act.closed
    assert r.stats.faults == 40 and ticks
    cmds = np.concatenate(act.submitted)
    assert (cmds["op"] == Op.PREEVICT).all() and len(cmds) >= 40 - 16
    assert r.source["control"]["commands"] == len(cmds) and r.source["scripted"]
    t = read_trace(trace)
    counts = t.counts()
    assert counts[Kind.FAULT] == 40 and counts[Kind.COMMAND] == len(cmds) == counts[Kind.RESULT]
    assert t.meta["source"] == "umctl test" and t.meta["end"] == "target exited"


def test_an_actuator_instance_needs_no_registration():
    act = FakeActuator()
    src = ScriptedSource([[0, 1, 2]])
    src.actuator = "nowhere"
    r = Session(src, control=ControlSpec("none", "2MiB", None, None, 0, None), actuator=act).run()
    assert r.stats.faults == 3 and act.closed and len(np.concatenate(act.submitted)) >= 2


def test_a_source_without_actuator_can_observe_but_not_control():
    src = ScriptedSource([[0]])
    src.actuator = "nowhere"
    with pytest.raises(UmctlError, match="names no known actuator"):
        Session(src, control=ControlSpec("none", "2MiB", None, None, 0, None)).run()
    assert src.closed
    r = Session(ScriptedSource([[0], [1]])).run()   # observing: no actuator asked for
    assert r.stats.faults == 2 and "control" not in r.source


def test_stop_ends_the_session_from_another_thread():
    src = ScriptedSource([[0]] * 10_000)
    s = Session(src, interval=0.01, on_tick=lambda s: s.stop("enough"))
    assert s.run().reason == "enough" and src.closed


def test_a_failing_launch_source_is_said_once_and_closed():
    class Broken(NoLaunches):
        closed = False

        def drain(self):
            raise OSError("gone")

        def close(self):
            Broken.closed = True

    warned: list[str] = []
    r = Session(ScriptedSource([[0], [1]]), launches=Broken(), on_warning=warned.append).run()
    assert r.stats.faults == 2 and Broken.closed
    assert len(warned) == 1 and "launch probe stopped (gone)" in warned[0]


@pytest.mark.parametrize("args, message", [
    (("oracle",), "mode oracle needs the future and runs only on replay"),
    (("snurhac-sp",), "compiler's access ranges"),
    (("hum",), "hum changes how the program copies, so it must start under umctl"),
    (("snurhac",), "must start under umctl: umctl run --mode snurhac --gpus N -- CMD"),
    (("harvest", "1GiB"), "--mode harvest needs --spare-gpus N"),
    (("deepum", None, 2), "--gpus is for --mode snurhac / snurhac-dp"),
])
def test_live_rules_come_from_the_controller_classes(args, message):
    mode, budget, gpus = (list(args) + [None, None])[:3]
    with pytest.raises(UmctlError) as e:
        ControlSpec(mode, budget, None, None, 0, None, gpus)
    assert message in str(e.value)


def test_harvest_runs_live_as_the_budget_keeper_spilling_to_neighbours():
    spec = ControlSpec("harvest", "1GiB", None, None, 1, None)
    assert spec.label == "harvest" and spec.mode == "none" and spec.spare_gpus == 1
    with pytest.raises(UmctlError, match="--degree: mode none has no prefetch degree"):
        ControlSpec("harvest", "1GiB", None, 8, 1, None)
    assert ControlSpec("deepum", None, ["num_rows=512"], 8, 0, None).controller.degree == 8
