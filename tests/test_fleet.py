"""The fleet that ``umctl top`` and ``umctl exporter`` share (umctl/live/fleet.py), with
stand-in sources over a fake /proc tree and a test clock: discovery, drain, the final drain of
an exited process, retirement after the grace period (and not before), refusals and their
back-off, failing sources, duplicates, and the one-pid fleet whose refusal raises. The
exporter's and top's own tests run the same fleet over the fake tools-API driver."""

from __future__ import annotations

import shutil

import pytest

from umctl.driver.process import NoDriver, NoPermission, TargetExited
from umctl.events.schema import EventBatch, Kind, empty
from umctl.live.fleet import BACKOFF_S, Fleet, FleetEvents, Member, reason_of

from test_uvmtools_source import fake_proc

UVM = {10: "/dev/nvidia-uvm", 11: "/dev/nvidia-uvm"}


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class StandIn:
    """A source: what the test queues comes out of ``drain``; ``exit()`` makes the target gone."""

    def __init__(self, pid: int):
        self.pid = pid
        self.gpus: list[dict] = []
        self.kinds = frozenset({Kind.FAULT})
        self.queued: list[int] = []      # fault counts, one batch each
        self.gone = False
        self.stopped = self.closed = False
        self.target_fd = 11

    def drain(self) -> EventBatch:
        b = EventBatch()
        for n in self.queued:
            b.add(Kind.FAULT, empty(Kind.FAULT, n))
        self.queued = []
        return b

    def counters(self) -> dict[str, int]:
        return {}

    def sample_fraction(self) -> float:
        return 1.0

    def exited(self) -> bool:
        return self.gone

    def stats(self) -> dict:
        return {}

    def stop(self) -> None:
        self.stopped = True

    def close(self) -> None:
        self.closed = True


class Recorder(FleetEvents[list]):
    """Every event, in order; each member's data is the fault counts of its batches."""

    def __init__(self) -> None:
        self.log: list[tuple] = []

    def on_attach(self, m: Member[list]) -> None:
        m.data = m.data if m.data is not None else []
        self.log.append(("attach", m.pid))

    def on_refuse(self, m: Member[list], error: Exception, first: bool) -> None:
        self.log.append(("refuse", m.pid, m.reason, first))

    def on_batch(self, m: Member[list], batch: EventBatch) -> None:
        if len(batch[Kind.FAULT]):
            m.data.append(len(batch[Kind.FAULT]))

    def on_detach(self, m: Member[list]) -> None:
        self.log.append(("detach", m.pid, m.gone is not None))

    def on_retire(self, m: Member[list]) -> None:
        self.log.append(("retire", m.pid))

    def on_warning(self, text: str) -> None:
        self.log.append(("warning", text))

    def on_error(self, pid: int | None, error: Exception) -> None:
        self.log.append(("error", pid, type(error).__name__))

    def kinds(self, kind: str) -> list[tuple]:
        return [e for e in self.log if e[0] == kind]


@pytest.fixture
def node(tmp_path):
    """A fake /proc, the sources the fleet opened (pid -> StandIn) and what opening raises."""
    root = tmp_path / "proc"
    root.mkdir()
    opened: dict[int, StandIn] = {}
    refuse: dict[int, Exception] = {}

    def open_source(pid: int) -> StandIn:
        if pid in refuse:
            raise refuse[pid]
        opened[pid] = StandIn(pid)
        return opened[pid]

    return tmp_path, str(root), opened, refuse, open_source


def spawn(tmp_path, pid: int, fds=None, cmdline: bytes = b"python3\0train.py\0") -> None:
    fake_proc(tmp_path, pid, UVM if fds is None else fds)
    (tmp_path / "proc" / str(pid) / "cmdline").write_bytes(cmdline)


def kill(tmp_path, pid: int) -> None:
    shutil.rmtree(tmp_path / "proc" / str(pid))


def make(node, **kw) -> tuple[Fleet, Recorder, Clock]:
    tmp_path, root, opened, refuse, open_source = node
    ev, clock = Recorder(), Clock()
    return Fleet(open_source, ev, proc_root=root, clock=clock, **kw), ev, clock


def test_a_new_process_is_discovered_and_attached_at_the_next_scan(node):
    tmp, root, opened, _, _ = node
    spawn(tmp, 101)
    spawn(tmp, 102, fds={0: "/dev/null"})        # no UVM: not a member
    fleet, ev, _ = make(node)
    fleet.step()
    assert sorted(fleet.attached()) == [101] and ev.log == [("attach", 101)]
    spawn(tmp, 103)
    fleet.step()
    assert sorted(fleet.attached()) == [101, 103] and sorted(opened) == [101, 103]
    assert ev.kinds("attach") == [("attach", 101), ("attach", 103)]   # 101 is not attached twice
    assert fleet.errors == 0


def test_drain_hands_each_process_its_own_batches(node):
    tmp, root, opened, _, _ = node
    spawn(tmp, 201)
    spawn(tmp, 202)
    fleet, ev, _ = make(node)
    fleet.scan()
    opened[201].queued = [5, 7]
    opened[202].queued = [3]
    fleet.drain()
    fleet.drain()                                 # nothing new: no batch with faults
    assert fleet.members[201].data == [12] and fleet.members[202].data == [3]


def test_exited_process_is_drained_once_more_then_retired_after_the_grace_not_before(node):
    tmp, root, opened, _, _ = node
    spawn(tmp, 301)
    fleet, ev, clock = make(node, grace_s=30.0)
    fleet.step()
    src = opened[301]
    src.queued = [40]
    src.gone = True                               # exited with events still in its ring
    kill(tmp, 301)
    fleet.step()
    m = fleet.members[301]
    assert src.stopped and src.closed and m.source is None
    assert m.data == [40] and m.gone == clock.t    # the final drain counted
    assert ev.kinds("detach") == [("detach", 301, True)]
    clock.t += 29.9
    fleet.step()
    assert 301 in fleet.members and ev.kinds("retire") == []
    clock.t += 0.1
    fleet.step()
    assert 301 not in fleet.members and ev.kinds("retire") == [("retire", 301)]
    assert fleet.waiting() == {} and fleet.attached() == {}


def test_a_source_that_raises_on_attach_is_one_recorded_error_and_no_crash(node):
    tmp, root, opened, refuse, _ = node
    spawn(tmp, 401)
    spawn(tmp, 402)
    refuse[401] = RuntimeError("tracker exploded")
    fleet, ev, clock = make(node)
    fleet.step()
    fleet.step()                                  # within the back-off: not tried again
    assert fleet.errors == 1 and ev.kinds("error") == [("error", 401, "RuntimeError")]
    assert ev.kinds("refuse") == [("refuse", 401, "runtime_error", True)]
    assert sorted(fleet.attached()) == [402] and sorted(fleet.waiting()) == [401]
    assert fleet.members[401].error == "tracker exploded"
    del refuse[401]
    clock.t += BACKOFF_S[0]
    fleet.step()
    assert sorted(fleet.attached()) == [401, 402] and fleet.errors == 1
    assert fleet.waiting() == {} and fleet.members[401].error == ""


def test_refusals_back_off_and_are_said_once_per_reason_and_forgotten_when_gone(node):
    tmp, root, opened, refuse, _ = node
    spawn(tmp, 501)
    refuse[501] = NoPermission("not ours")
    fleet, ev, clock = make(node, grace_s=0.0)
    fleet.step()
    waits = []
    for _ in range(7):
        waits.append(fleet.members[501].backoff)
        clock.t = fleet.members[501].retry_at
        fleet.step()
    assert waits == [2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    assert [e[3] for e in ev.kinds("refuse")] == [True] + [False] * 7
    assert fleet.errors == 0                      # a refusal is not an error
    refuse[501] = NoDriver("no driver")           # the driver went: its return is tried soon
    clock.t = fleet.members[501].retry_at
    fleet.step()
    assert fleet.members[501].backoff == BACKOFF_S[0] and ev.kinds("refuse")[-1] == ("refuse", 501, "no_driver", True)
    kill(tmp, 501)
    fleet.step()
    assert fleet.members == {} and ev.kinds("retire") == [("retire", 501)]


def test_a_process_that_exits_while_attaching_is_not_retried(node):
    tmp, root, opened, refuse, _ = node
    spawn(tmp, 551)
    refuse[551] = TargetExited("process 551 exited")
    fleet, ev, clock = make(node, grace_s=5.0)
    fleet.step()
    assert fleet.members[551].gone == clock.t and fleet.waiting() == {}
    clock.t += 5.0
    kill(tmp, 551)
    fleet.step()
    assert fleet.members == {}


def test_a_failing_drain_ends_that_source_only_and_it_is_attached_again_after_the_backoff(node):
    tmp, root, opened, _, _ = node
    spawn(tmp, 601)
    spawn(tmp, 602)
    fleet, ev, clock = make(node)
    fleet.step()
    first = opened[601]
    first.queued = [4]
    fleet.drain()

    def broken() -> EventBatch:
        raise OSError(5, "Input/output error")

    first.drain = broken
    opened[602].queued = [2]
    fleet.step()
    m = fleet.members[601]
    assert first.closed and m.source is None and m.gone is None and m.reason == "source_error"
    assert fleet.errors == 1 and ev.kinds("error") == [("error", 601, "OSError")]
    assert fleet.members[602].data == [2]         # the other process goes on
    fleet.step()
    assert 601 in fleet.waiting()                 # not at the very next scan
    clock.t += BACKOFF_S[0]
    fleet.step()
    assert opened[601] is not first and 601 in fleet.attached()
    assert fleet.members[601].data == [4]         # the member, and what its consumer kept, go on


def test_what_the_consumer_raises_on_a_batch_ends_that_source_like_a_failing_drain(node):
    tmp, root, opened, _, _ = node
    spawn(tmp, 651)

    class Folding(Recorder):
        def on_batch(self, m, batch):
            raise ValueError("bad fold")

    fleet = Fleet(node[4], Folding(), proc_root=root, clock=Clock())
    fleet.step()
    assert fleet.errors == 1 and opened[651].closed and fleet.attached() == {}


def test_launch_sources_are_merged_into_the_batch_and_closed_with_the_source(node):
    tmp, root, opened, _, _ = node
    spawn(tmp, 701)

    class Launches:
        closed = False

        def drain(self) -> EventBatch:
            b = EventBatch()
            b.add(Kind.LAUNCH, empty(Kind.LAUNCH, 2))
            return b

        def close(self) -> None:
            self.closed = True

    probes: dict[int, Launches] = {}
    seen: list[int] = []

    class Launched(Recorder):
        def on_batch(self, m, batch):
            seen.append(len(batch[Kind.LAUNCH]))

    fleet = Fleet(node[4], Launched(), proc_root=root, clock=Clock(),
                  launches=lambda pid, warn: probes.setdefault(pid, Launches()))
    fleet.step()
    assert seen == [2]
    opened[701].gone = True
    fleet.drain()
    assert probes[701].closed and opened[701].closed


def test_umctl_processes_and_children_sharing_a_va_space_are_skipped_with_dedupe(node):
    tmp, root, opened, _, _ = node
    spawn(tmp, 801)
    spawn(tmp, 802)                               # forked from 801 after CUDA started
    spawn(tmp, 803, cmdline=b"/usr/bin/python3\0/usr/local/bin/umctl\0attach\0--pid\0801\0")
    asked: list[tuple] = []

    def same_file(pid1, fd1, pid2, fd2):
        asked.append((pid1, pid2, fd2))
        return pid1 == 802 and pid2 == 801

    fleet, ev, _ = make(node, dedupe=True, same_file=same_file)
    fleet.step()
    assert sorted(fleet.attached()) == [801] and fleet.skipped == {802: 801, 803: 0}
    assert (802, 801, 11) in asked                # against the attached source's borrowed fd
    assert [e for e in ev.log if e[0] == "warning"][0][1].startswith("pid 802 (python3): shares the va_space of pid 801")
    fleet.step()
    assert len(ev.kinds("warning")) == 1          # not looked at again
    kill(tmp, 802)
    fleet.step()
    assert fleet.skipped == {803: 0}
    plain, _, _ = make(node)                      # without dedupe (top): every UVM process
    plain.step()
    assert sorted(plain.attached()) == [801, 803]


def test_a_fleet_of_one_pid_raises_when_it_cannot_attach_it(node):
    tmp, root, opened, refuse, _ = node
    spawn(tmp, 901)
    spawn(tmp, 902)
    fleet, ev, clock = make(node, pid=901)
    fleet.step()
    assert sorted(fleet.attached()) == [901]      # only the one named
    first = opened[901]
    first.drain = lambda: 1 / 0                   # a failing source: attached again after the back-off
    fleet.step()
    fleet.step()
    assert opened[901] is first and fleet.attached() == {}
    clock.t += BACKOFF_S[0]
    fleet.step()
    assert opened[901] is not first and sorted(fleet.attached()) == [901]
    refuse[903] = NoPermission("not ours")
    with pytest.raises(NoPermission):
        make(node, pid=903)[0].step()


def test_close_detaches_every_source():
    closed: list[int] = []

    class Src(StandIn):
        def close(self) -> None:
            closed.append(self.pid)

    ev = Recorder()
    fleet = Fleet(Src, ev, pid=42, proc_root="/nonexistent", clock=Clock())
    fleet.step()
    fleet.close()
    assert closed == [42] and fleet.attached() == {} and ev.kinds("detach") == [("detach", 42, False)]


def test_reason_labels_are_the_error_class_in_snake_case():
    assert reason_of(NoPermission("x")) == "no_permission" and reason_of(TargetExited("x")) == "target_exited"
