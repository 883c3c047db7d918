"""``umctl exporter``: the agent against the project's fake UVM tools device (FakeDriver at
the Ioctl seam, a fake /proc tree) with many processes, the metrics as Prometheus parses
them, sampling, process exit and the grace period, attach refusals, a failing driver,
controllers' state files, the CLI's input errors, and 1,000 processes coming and going under
one agent with bounded memory. The real Prometheus server is test_exporter_prometheus.py."""

from __future__ import annotations

import gc
import os
import random
import shutil
import threading
import time

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from umctl.events.schema import EventBatch, Kind, Op, Status, commands, empty
from umctl.exporter import agent as agent_mod
from umctl.exporter.agent import Agent
from umctl.live import fleet as fleet_mod
from umctl.live.fleet import is_umctl
from umctl.exporter.control_state import ensure_state_dir, publisher_for, read_published
from umctl.exporter.metrics import ExporterCollector, ExporterState, ProcessTotals
from umctl.driver import abi, process
from umctl.sources.uvmtools import DEFAULT_KINDS, UvmToolsSource
from umctl.sources.uvmtools.sampling import Sampler

from test_uvmtools_source import GPU_UUID, FakeDriver, entries, fake_proc, produce, run_cli

UVM_FDS = {0: "/dev/pts/0", 10: "/dev/nvidia-uvm", 11: "/dev/nvidia-uvm", 13: "/dev/nvidiactl"}


class NodeDriver(FakeDriver):
    """FakeDriver for a whole node: every process's va_space fd is 11, each tracker's ring is
    known by the pid it watches, a pid has exited when its /proc entry is gone, and a closed
    tracker's ring is forgotten (its memory is unmapped when the source is freed)."""

    def __init__(self, proc_root: str):
        super().__init__(pid=0)
        self.proc_root = proc_root
        self.dup_pid: dict[int, int] = {}
        self.ring_of: dict[int, tuple[int, np.ndarray, np.ndarray]] = {}   # pid -> (tools fd, ring, ctrl)
        self.forked_from: dict[int, int] = {}   # child pid -> the parent whose uvm fds it inherited

    def same_file(self, pid1: int, fd1: int, pid2: int, fd2: int) -> bool:
        """kcmp(KCMP_FILE) on this node: a forked child's uvm fds are its parent's files."""
        return self.forked_from.get(pid1) == pid2

    def pidfd_getfd(self, pidfd: int, targetfd: int) -> int:
        fd = super().pidfd_getfd(pidfd, targetfd)
        self.dup_pid[fd] = self.fds[pidfd][1]
        return fd

    def ioctl(self, fd: int, cmd: int, params) -> int:
        st = super().ioctl(fd, cmd, params)
        if cmd == abi.UVM_TOOLS_INIT_EVENT_TRACKER_V2 and st == abi.NV_OK and params.queueBufferSize:
            ring, ctrl = self.rings.pop()
            self.ring_of[self.dup_pid[params.uvmFd]] = (fd, ring, ctrl)
        return st

    def close(self, fd: int) -> None:
        super().close(fd)
        self.dup_pid.pop(fd, None)
        for pid, (tfd, _, _) in list(self.ring_of.items()):
            if tfd == fd:
                del self.ring_of[pid]

    def process_exited(self, pidfd: int) -> bool:
        return not os.path.isdir(f"{self.proc_root}/{self.fds[pidfd][1]}")

    def emit(self, pid: int, recs: np.ndarray) -> int:
        _, ring, ctrl = self.ring_of[pid]
        return produce(ring, ctrl, recs)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def node(monkeypatch):
    """A fake node in a directory of its own: pytest's numbered tmp_path directories are pruned
    by other pytest runs on the same machine, which would look like every process exiting."""
    import pathlib
    import tempfile

    base = pathlib.Path(tempfile.mkdtemp(prefix="umctl-exporter-node-"))
    root = str(base / "proc")
    os.makedirs(root)
    drv = NodeDriver(root)
    monkeypatch.setattr(process, "PROC_ROOT", root)
    yield drv, root, base
    shutil.rmtree(base, ignore_errors=True)


def spawn(tmp_path, pid: int, fds=None, comm: str = "python3", cmdline: bytes = b"python3\0train.py\0") -> None:
    fake_proc(tmp_path, pid, fds or UVM_FDS)
    d = tmp_path / "proc" / str(pid)
    (d / "comm").write_text(comm + "\n")
    (d / "cmdline").write_bytes(cmdline)


def kill(tmp_path, pid: int) -> None:
    shutil.rmtree(tmp_path / "proc" / str(pid))


#: agents made by this test; closed when it ends (passed or not), so that no drain thread of
#: one test runs on into the next (tests/conftest.py fails a test that leaves one running)
_AGENTS: list[Agent] = []


@pytest.fixture(autouse=True)
def _close_agents():
    yield
    while _AGENTS:
        _AGENTS.pop().close()


def make_agent(drv, root, *, sample=1.0, grace=5.0, clock=None, kinds=DEFAULT_KINDS, state_dir=None,
               ring_entries=256, drain_ms=1.0, **kw):
    """An agent over the fake node. ``clock`` (a :class:`Clock`) drives the grace periods and
    retry back-offs; with the default real clock a test must not depend on how much time passes."""
    state = ExporterState(sample=sample, kinds="test", version="t")
    logs: list[str] = []
    agent = Agent(state, kinds=kinds, sample=sample, interval_s=0.05, grace_s=grace, ring_entries=ring_entries,
                  drain_ms=drain_ms, io_factory=lambda: drv, proc_root=root, driver_present=lambda: not drv.no_driver,
                  log=logs.append, clock=clock or time.monotonic, state_dir=state_dir, same_file=drv.same_file, **kw)
    agent._smi_t = float("inf")   # never run nvidia-smi in tests
    agent._smi = []
    _AGENTS.append(agent)
    return agent, state, logs


def scrape(state: ExporterState) -> dict[str, dict[tuple, float]]:
    """What Prometheus would parse: sample name -> {sorted label items: value}."""
    reg = CollectorRegistry()
    reg.register(ExporterCollector(state))
    out: dict[str, dict[tuple, float]] = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def value(m: dict, name: str, **labels) -> float | None:
    want = {k: str(v) for k, v in labels.items()}
    hits = [v for k, v in m.get(name, {}).items() if all(dict(k).get(a) == b for a, b in want.items())]
    return sum(hits) if hits else None


def settle(agent: Agent, cond, timeout: float = 60.0) -> None:
    """Step until ``cond()`` holds. The drain threads take events off the rings whenever the
    scheduler runs them, so a test waits for the condition (generously: a loaded 2-core machine
    may not run a thread for seconds), never for a fixed time; a timeout is a failure."""
    end = time.monotonic() + timeout
    while True:
        agent.step()
        if cond():
            return
        assert time.monotonic() < end, f"not reached within {timeout:g} s"
        time.sleep(0.01)


def faults_for(pid: int, n: int, batch: int, gpu: int = 1) -> np.ndarray:
    return entries(*[{"type": abi.EV_GPU_FAULT, "g_gpu": gpu, "g_addr": 0x7F0000000000 + i * 4096,
                      "g_ts": 1_000_000 + i, "g_batch": batch, "g_access": 1, "g_client_type": 1} for i in range(n)])


def test_every_uvm_process_is_attached_and_counted_per_process_and_gpu(node):
    drv, root, tmp = node
    spawn(tmp, 101)
    spawn(tmp, 102, comm="trainer")
    spawn(tmp, 103, fds={0: "/dev/null"})                       # no UVM: not a target
    agent, state, logs = make_agent(drv, root)
    agent.step()
    assert sorted(agent.fleet.attached()) == [101, 102]
    drv.emit(101, faults_for(101, 30, batch=1))
    drv.emit(101, faults_for(101, 20, batch=2))
    drv.emit(101, entries({"type": abi.EV_GPU_FAULT_REPLAY, "r_gpu": 1, "r_batch": 1, "r_ts": 2_000_000},
                          {"type": abi.EV_GPU_FAULT_REPLAY, "r_gpu": 1, "r_batch": 2, "r_ts": 2_000_100},
                          {"type": abi.EV_CPU_FAULT, "c_addr": 0x7F0000000000, "c_ts": 2_000_200},
                          {"type": abi.EV_THRASHING_DETECTED, "t_procs": [2, 0, 0, 0, 0], "t_addr": 0x7F0000000000,
                           "t_size": 4096, "t_ts": 2_000_300}))
    drv.emit(102, faults_for(102, 7, batch=9))
    drv.counters[0] = 3 << 20   # bytes_htd of the last counters tracker (102's)
    settle(agent, lambda: value(scrape(state), "umctl_gpu_faults_total", pid=102) == 7
           and value(scrape(state), "umctl_thrashing_events_total", pid=101) == 1)
    m = scrape(state)
    uuid = process.uuid_str(GPU_UUID)
    assert m["umctl_gpu_faults_total"][(("comm", "python3"), ("gpu", "0"), ("pid", "101"), ("uuid", uuid))] == 50
    assert value(m, "umctl_gpu_faults_total", pid=102, comm="trainer") == 7
    assert value(m, "umctl_gpu_fault_batches_total", pid=101) == 2
    assert value(m, "umctl_cpu_faults_total", pid=101) == 1
    assert value(m, "umctl_migrated_bytes_total", pid=102, direction="h2d", cause="unattributed") == 3 << 20
    assert value(m, "umctl_process_attached", pid=101) == 1
    assert value(m, "umctl_exporter_processes", state="attached") == 2
    assert value(m, "umctl_exporter_attaches_total") == 2
    assert value(m, "umctl_exporter_driver_up") == 1
    assert value(m, "umctl_exporter_sample_ratio") == 1
    # counters never go back: a second identical scrape, then more events, only grow
    drv.emit(101, faults_for(101, 5, batch=3))
    settle(agent, lambda: value(scrape(state), "umctl_gpu_faults_total", pid=101) == 55)
    assert value(scrape(state), "umctl_gpu_faults_total", pid=101) == 55
    agent.close()
    assert drv.fds == {}


def test_migration_events_give_bytes_by_direction_and_cause_and_evictions(node):
    drv, root, tmp = node
    spawn(tmp, 201)
    agent, state, _ = make_agent(drv, root, kinds=DEFAULT_KINDS | {Kind.MIGRATION})
    agent.step()

    def mig(cause, src, dst, nbytes):
        return {"type": abi.EV_MIGRATION, "m_cause": cause, "m_src": src, "m_dst": dst, "m_addr": 0x7F0000000000,
                "m_bytes": nbytes, "m_begin": 10, "m_end": 20}

    drv.emit(201, entries(mig(abi.MIG_CAUSE_COHERENCE, 0, 1, 4 << 20), mig(abi.MIG_CAUSE_PREFETCH, 0, 1, 2 << 20),
                          mig(abi.MIG_CAUSE_EVICTION, 1, 0, 2 << 20), mig(abi.MIG_CAUSE_EVICTION, 1, 0, 2 << 20),
                          mig(abi.MIG_CAUSE_USER, 0, 1, 8 << 20)))
    drv.counters[0] = 99 << 20   # ignored: Migration events are on, the cause split comes from them
    settle(agent, lambda: value(scrape(state), "umctl_evictions_total", pid=201) == 2)
    m = scrape(state)
    assert value(m, "umctl_migrated_bytes_total", pid=201, direction="h2d", cause="fault") == 4 << 20
    assert value(m, "umctl_migrated_bytes_total", pid=201, direction="h2d", cause="prefetch") == 2 << 20
    assert value(m, "umctl_migrated_bytes_total", pid=201, direction="d2h", cause="eviction") == 4 << 20
    assert value(m, "umctl_migrated_bytes_total", pid=201, direction="h2d", cause="user") == 8 << 20
    assert value(m, "umctl_migrated_bytes_total", cause="unattributed") is None
    assert value(m, "umctl_evictions_total", pid=201, gpu=0) == 2
    agent.close()


def test_without_replay_events_batches_are_counted_by_their_ids(node):
    """--kinds faults (no GpuFaultReplay events): every event is collected, but batches can
    only be counted by the distinct batch ids of their faults."""
    drv, root, tmp = node
    spawn(tmp, 251)
    agent, state, _ = make_agent(drv, root, kinds={Kind.FAULT})
    agent.step()
    drv.emit(251, faults_for(251, 30, batch=1))
    drv.emit(251, faults_for(251, 20, batch=2))
    settle(agent, lambda: value(scrape(state), "umctl_gpu_faults_total", pid=251) == 50)
    assert value(scrape(state), "umctl_gpu_fault_batches_total", pid=251) == 2
    agent.close()


def test_ended_process_keeps_its_final_values_for_the_grace_then_its_series_end(node):
    drv, root, tmp = node
    clock = Clock()
    spawn(tmp, 301)
    agent, state, logs = make_agent(drv, root, grace=30.0, clock=clock)
    agent.step()
    drv.emit(301, faults_for(301, 40, batch=1))
    kill(tmp, 301)                      # events still in its ring are drained on the way out
    agent.step()
    assert 301 not in agent.fleet.attached() and drv.fds == {}
    m = scrape(state)
    assert value(m, "umctl_gpu_faults_total", pid=301) == 40
    assert value(m, "umctl_process_attached", pid=301) == 0
    assert value(m, "umctl_exporter_processes", state="ended") == 1
    clock.t += 29.0
    agent.step()
    assert value(scrape(state), "umctl_gpu_faults_total", pid=301) == 40
    clock.t += 1.0
    agent.step()
    m = scrape(state)
    assert value(m, "umctl_gpu_faults_total", pid=301) is None and value(m, "umctl_process_attached", pid=301) is None
    assert state.processes == {}
    assert any("pid 301 (python3): ended" in ln for ln in logs)


class SteppedSource(UvmToolsSource):
    """The tools source with no drain thread and its sampler on the test's clock: ``drain()``
    first takes what the ring holds, and the sampler's windows move only when the test ticks
    it. What the agent estimates then depends on the test alone, never on how a loaded machine
    schedules threads. (The drain thread ticking the sampler is test_uvmtools_sampling.py's.)"""

    clock: Clock
    rng: random.Random

    def _attach(self) -> None:
        super()._attach()
        if self.sampler is not None:   # the same driver toggle, on the test's clock and seed
            self.sampler = Sampler(self.sampler.toggle, self.sample, self.sample_period_ms, clock=self.clock,
                                   rng=self.rng)
        self.drainer.tick = None
        self.drainer.start = lambda: None

    def drain(self):
        if self.drainer is not None and not self._stopped:
            self.drainer.drain_once()
        return super().drain()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sampled_counters_are_scaled_by_the_measured_on_time(node, monkeypatch, seed):
    """A process faulting at a steady 100 faults per 5 ms, collected in 50 ms windows of each
    100 ms (sample 0.5, random window offsets): each 300 ms interval's count, scaled by its
    elapsed time over its measured on-time, gives the exact total -- dividing by the nominal
    duty (x2) would not: the windows' measured on-time is not exactly half of the run."""
    drv, root, tmp = node
    clock = Clock()
    monkeypatch.setattr(fleet_mod, "UvmToolsSource", type("S", (SteppedSource,), {"clock": clock,
                                                                                  "rng": random.Random(seed)}))
    spawn(tmp, 401)
    agent, state, _ = make_agent(drv, root, sample=0.5, ring_entries=8192, clock=clock)   # one interval's events
    agent.step()
    src = agent.fleet.members[401].source
    assert src.sampler is not None and src.sampler.clock is clock
    truth = collected = 0
    slots = 600                          # 5 ms slots: 3 s, 30 sampling periods, 10 agent intervals
    for i in range(slots):
        if drv.enabled_mask & (1 << abi.EV_GPU_FAULT):   # the driver drops them while disabled
            n = drv.emit(401, faults_for(401, 100, batch=i))
            assert n == 100, "ring overflow"
            collected += n
        truth += 100
        clock.t += 0.005                 # the slot is over: the sampler may switch now
        src.sampler.tick()
        if (i + 1) % 60 == 0:
            agent.step()
    est = value(scrape(state), "umctl_gpu_faults_total", pid=401)
    frac = src.sample_fraction()
    assert 0.3 < frac < 0.7 and src.sampler.toggles >= 30
    assert collected == pytest.approx(truth * frac)      # what was collected is the on-time's share
    assert collected != truth / 2                         # so dividing by the nominal duty would be off
    assert est == pytest.approx(truth, rel=1e-9), (est, truth, frac)
    assert value(scrape(state), "umctl_process_sampled_ratio", pid=401) == pytest.approx(frac)
    agent.close()


def test_fold_scales_and_counts_a_batch_spanning_two_drains_once():
    t = ProcessTotals(1, "x")
    f = empty(Kind.FAULT, 4)
    f["gpu"], f["batch_id"] = 0, [5, 5, 6, 6]
    t.fold(EventBatch(arrays={Kind.FAULT: f}), 10.0, replay_batches=False)
    f2 = empty(Kind.FAULT, 2)
    f2["gpu"], f2["batch_id"] = 0, [6, 7]       # batch 6 goes on in the next drain
    t.fold(EventBatch(arrays={Kind.FAULT: f2}), 10.0, replay_batches=False)
    assert t.faults == {0: 60.0} and t.batches == {0: 30.0}


def test_with_every_event_a_batch_is_counted_by_its_replay_once_across_drains():
    """Unsampled, fault batches are counted by their replay records. A drain can end between a
    batch's faults and its replay (the drain thread runs when it runs): the batch is counted
    when its replay comes, once -- not also by the batch ids of its faults."""
    t = ProcessTotals(1, "x")
    f = empty(Kind.FAULT, 3)
    f["gpu"], f["batch_id"] = 0, [1, 1, 2]
    t.fold(EventBatch(arrays={Kind.FAULT: f}))            # faults of batches 1 and 2, replays not yet
    assert t.batches == {} and t.faults == {0: 3.0}
    r = empty(Kind.REPLAY, 2)
    r["gpu"] = 0
    t.fold(EventBatch(arrays={Kind.REPLAY: r}))
    assert t.batches == {0: 2.0}


def test_refused_attach_is_retried_with_backoff_and_forgotten_when_gone(node):
    drv, root, tmp = node
    clock = Clock()
    spawn(tmp, 501, fds={10: "/dev/nvidia-uvm"})       # only an mm fd: the driver refuses a tracker
    agent, state, logs = make_agent(drv, root, clock=clock)
    agent.step()
    assert 501 in agent.fleet.waiting() and agent.fleet.members[501].reason == "no_uvm"
    agent.step()
    assert state.attach_failures == {"no_uvm": 1}      # not retried before the back-off
    clock.t += 2.5
    agent.step()
    assert state.attach_failures == {"no_uvm": 2} and agent.fleet.members[501].backoff == 4.0
    assert sum("501" in ln for ln in logs) == 1        # logged once per reason, not per retry
    assert value(scrape(state), "umctl_exporter_processes", state="unattachable") == 1
    kill(tmp, 501)
    agent.step()
    assert agent.fleet.waiting() == {} and drv.fds == {}


def test_driver_presence_and_drain_period_defaults(tmp_path, monkeypatch):
    from umctl.exporter import agent as agent_mod

    agent = Agent(ExporterState(sample=1, kinds="", version=""), kinds=DEFAULT_KINDS)
    monkeypatch.setattr(agent_mod, "TOOLS_PATH", str(tmp_path / "nvidia-uvm-tools"))
    assert agent.driver_present() is False
    (tmp_path / "nvidia-uvm-tools").touch()
    assert agent.driver_present() is True
    # each ring drained before 80 % of it fills at the measured peak of 1.1 M events/s
    assert agent.drain_ms == agent_mod.drain_ms_for(1 << 15) == pytest.approx(0.8 * 32768 / 1.1e3)
    assert agent_mod.drain_ms_for(1 << 10) == 2.0 and agent_mod.drain_ms_for(1 << 20) == 100.0


def test_umctl_processes_are_not_attached():
    assert is_umctl("/usr/local/bin/umctl attach --pid 4")
    assert is_umctl("python3 /usr/local/bin/umctl run -- python3 x.py")
    assert is_umctl("python3 -m umctl exporter")
    assert not is_umctl("python3 train.py --umctl")
    assert not is_umctl("python3 umctl_bench.py")


def test_umctl_process_with_borrowed_fds_is_skipped(node):
    drv, root, tmp = node
    spawn(tmp, 601)
    spawn(tmp, 602, comm="umctl", cmdline=b"/usr/bin/python3\0/usr/local/bin/umctl\0attach\0--pid\0601\0")
    agent, _, _ = make_agent(drv, root)
    agent.step()
    assert sorted(agent.fleet.attached()) == [601]
    agent.close()


def test_a_child_forked_after_cuda_is_not_attached_twice(node):
    """DataLoader workers forked from a CUDA process inherit its /dev/nvidia-uvm fds: the
    same va_space, whose events must be counted once, under the parent."""
    drv, root, tmp = node
    spawn(tmp, 901)
    spawn(tmp, 902, comm="pt_data_worker")
    spawn(tmp, 903)                                    # an unrelated process: attached
    drv.forked_from[902] = 901
    agent, state, logs = make_agent(drv, root)
    agent.step()
    assert sorted(agent.fleet.attached()) == [901, 903] and agent.fleet.skipped == {902: 901}
    assert any("pid 902 (pt_data_worker): shares the va_space of pid 901" in ln for ln in logs)
    agent.step()
    assert sum("902" in ln for ln in logs) == 1        # not looked at again
    kill(tmp, 902)
    agent.step()
    assert agent.fleet.skipped == {}
    agent.close()


def test_kcmp_tells_one_open_file_from_another_on_this_kernel(tmp_path):
    import subprocess
    import sys

    from umctl.live.fleet import kcmp_same_file

    me = os.getpid()
    fd = os.open(tmp_path / "f", os.O_CREAT | os.O_RDWR)
    other = os.open(tmp_path / "f", os.O_RDONLY)
    dup = os.dup(fd)
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                             pass_fds=(fd,))
    try:
        if kcmp_same_file(me, fd, me, dup) is None:
            pytest.skip("kcmp(2) not available or not permitted here")
        assert kcmp_same_file(me, fd, me, dup) is True
        assert kcmp_same_file(me, fd, me, other) is False
        assert kcmp_same_file(child.pid, fd, me, fd) is True      # inherited across fork/exec
        assert kcmp_same_file(child.pid, fd, me, other) is False
        assert kcmp_same_file(me, 987654, me, fd) is False         # a closed fd: not the same
    finally:
        child.stdin.close()
        child.wait()
        for f in (fd, other, dup):
            os.close(f)


def test_a_failing_source_or_a_missing_driver_never_stops_the_agent(node):
    drv, root, tmp = node
    spawn(tmp, 701)
    spawn(tmp, 702)
    # the test's clock: 701's re-attach back-off must not run out while the driver is gone
    agent, state, logs = make_agent(drv, root, clock=Clock())
    agent.step()
    drv.emit(702, faults_for(702, 3, batch=1))
    settle(agent, lambda: value(scrape(state), "umctl_gpu_faults_total", pid=702) == 3)

    def broken():
        raise OSError(5, "Input/output error")

    agent.fleet.members[701].source.drain = broken             # e.g. the GPU fell off the bus
    agent.step()
    assert 701 not in agent.fleet.attached() and 702 in agent.fleet.attached()
    assert state.errors == 1 and any("OSError" in ln for ln in logs)
    drv.no_driver = True                               # the module is gone: no new attaches
    spawn(tmp, 703)
    agent.step()
    m = scrape(state)
    assert value(m, "umctl_exporter_driver_up") == 0
    assert value(m, "umctl_exporter_attach_failures_total", reason="no_driver") == 1
    assert value(m, "umctl_gpu_faults_total", pid=702) == 3
    drv.no_driver = False                              # back: attached on a later scan
    agent.fleet.members[703].retry_at = 0
    agent.step()
    assert 703 in agent.fleet.attached()
    agent.close()
    assert drv.fds == {}


def test_controller_state_files_become_command_metrics(node, tmp_path):
    drv, root, tmp = node
    sdir = ensure_state_dir(str(tmp_path / "run"))
    assert oct(os.stat(sdir).st_mode & 0o7777) == "0o1777"
    spawn(tmp, 801)
    spawn(tmp, os.getpid(), fds={0: "/dev/null"})      # the publishing umctl process (this one)

    class Budget:
        enforced_blocks = 0

    class Res:
        blocks = [None]

        @staticmethod
        def resident_bytes(g):
            return 6 << 20

    class Ctl:
        budget = Budget()
        res = Res()

    pub = publisher_for(801, "deepum", 8 << 20, directory=sdir)
    assert pub is not None and publisher_for(801, "none", None, directory=str(tmp_path / "absent")) is None
    ctl = Ctl()
    out = EventBatch()
    cmds = commands(Op.PREFETCH, [0x1000, 0x2000, 0x3000], 2 << 20)
    cmds["cmd_id"] = [1, 2, 3]
    out.add(Kind.COMMAND, cmds)
    res = empty(Kind.RESULT, 2)
    res["cmd_id"], res["status"], res["bytes"] = [1, 2], [Status.OK, Status.FAILED], [2 << 20, 0]
    out.add(Kind.RESULT, res)
    pub.record(ctl, out)
    ctl.budget.enforced_blocks = 1                     # the keeper evicted in this step
    ev = EventBatch()
    e = commands(Op.PREEVICT, [0x4000], 2 << 20)
    e["cmd_id"] = [4]
    ev.add(Kind.COMMAND, e)
    pub.record(ctl, ev)
    pub.write(ctl)
    assert [p.mode for p in read_published(sdir, root)] == ["deepum"]
    agent, state, _ = make_agent(drv, root, state_dir=sdir)
    agent.step()
    m = scrape(state)
    assert value(m, "umctl_control_commands_sent_total", pid=801, mode="deepum", op="prefetch", budget="under") == 3
    assert value(m, "umctl_control_commands_sent_total", pid=801, op="preevict", budget="enforcing") == 1
    assert value(m, "umctl_control_commands_failed_total", pid=801, op="prefetch") == 1
    assert value(m, "umctl_control_migrated_bytes_total", pid=801, op="prefetch") == 2 << 20
    assert value(m, "umctl_control_budget_bytes", pid=801) == 8 << 20
    assert value(m, "umctl_control_resident_estimate_bytes", pid=801) == 6 << 20
    pub.close()                                        # detached: ended, dropped after the grace
    agent.step()
    assert next(iter(state.controls.values())).ended is not None
    agent.close()


def test_a_live_controller_publishes_while_it_runs_and_withdraws_on_finish(tmp_path, monkeypatch):
    """The hook in LiveControl: with an exporter's state directory present, the budget
    keeper's evictions are published as sent under an enforcing budget; finish removes the
    file. Without the directory nothing is written."""
    from umctl.controller.base import make_controller
    from umctl.live.control import LiveControl
    from umctl.units import BLOCK_SIZE

    from test_live_control import GPUS, FakeActuator, faults as block_faults

    monkeypatch.setenv("UMCTL_STATE_DIR", str(tmp_path / "absent"))
    assert LiveControl(make_controller("none"), FakeActuator(), pid=42, gpus=GPUS).publisher is None
    sdir = ensure_state_dir(str(tmp_path / "run"))
    monkeypatch.setenv("UMCTL_STATE_DIR", sdir)
    lc = LiveControl(make_controller("none"), FakeActuator(), pid=os.getpid(), gpus=GPUS, budget_bytes=4 * BLOCK_SIZE)
    b = EventBatch(now_ns=1_000_000)
    b.add(Kind.FAULT, block_faults(1_000_000, range(8)))
    out = lc.step(b)
    assert len(out[Kind.COMMAND]) == 5                           # 4 over the budget + 1 slack
    pubs = read_published(sdir)
    assert len(pubs) == 1 and pubs[0].mode == "none" and pubs[0].budget_bytes == 4 * BLOCK_SIZE
    assert pubs[0].sent == {("preevict", "enforcing"): 5}
    lc.finish()
    assert read_published(sdir) == [] and os.listdir(sdir) == []


def test_observers_are_registered_factories_and_several_hear_each_step(monkeypatch):
    """The hook a control loop goes through (live/observers.py): what each registered factory
    gives for a loop, one observer or several as one; nothing when no factory wants the loop."""
    from umctl.live import observers

    assert publisher_for in observers._FACTORIES           # importing control_state registered it
    monkeypatch.setattr(observers, "_FACTORIES", [])
    assert observers.control_observer(7, "none", None) is None
    heard: list[tuple] = []

    class Obs:
        def __init__(self, name):
            self.name = name

        def record(self, ctl, out):
            heard.append((self.name, "record", ctl))

        def close(self):
            heard.append((self.name, "close"))

    def first(pid, mode, budget):
        return Obs(f"first {pid} {mode} {budget}")

    observers.register_control_observer(first)
    observers.register_control_observer(first)             # a second import: still once
    only = observers.control_observer(7, "deepum", 1 << 20)
    assert isinstance(only, Obs) and only.name == "first 7 deepum 1048576"
    observers.register_control_observer(lambda pid, mode, budget: None)   # not wanted here
    observers.register_control_observer(lambda pid, mode, budget: Obs("second"))
    both = observers.control_observer(7, "deepum", None)
    both.record("ctl", EventBatch())
    both.close()
    assert heard == [("first 7 deepum None", "record", "ctl"), ("second", "record", "ctl"),
                     ("first 7 deepum None", "close"), ("second", "close")]


_PUBLISHING_ATTACH = """
import json, os, sys
sys.path[:0] = [{root!r}, {tests!r}]
from umctl.driver import abi, process
import umctl.sources.uvmtools.source as source_mod
from test_uvmtools_source import FakeDriver, fake_proc, gpu_faults
assert "umctl.exporter.control_state" not in sys.modules
root = fake_proc(__import__("pathlib").Path({tmp!r}), 4242, {{10: "/dev/nvidia-uvm", 11: "/dev/nvidia-uvm"}})
drv = FakeDriver(4242)
process.PROC_ROOT = root
abi.Ioctl = lambda: drv
process.nvidia_smi_gpus = source_mod.nvidia_smi_gpus = lambda: []
drv.ioctl = lambda fd, cmd, params, plain=drv.ioctl: abi.NV_OK if cmd == abi.UVM_MIGRATE else plain(fd, cmd, params)
drv.pending.append(gpu_faults(40, batch=1))
published = []
replace = os.replace
def spy(src, dst):
    if "control-" in str(dst):
        published.append(json.load(open(src)))
    return replace(src, dst)
os.replace = spy
from umctl.cli.main import main
rc = main(["attach", "--pid", "4242", "--mode", "none", "--budget", "8MiB", "--duration", "0.5", "--no-launches"])
print(json.dumps({{"rc": rc, "published": published, "left": os.listdir({sdir!r})}}))
"""


def test_a_controlling_command_publishes_to_the_exporter_from_a_fresh_process(tmp_path):
    """``umctl attach --mode`` in a process of its own (where nothing imported the exporter
    beforehand) writes the controller's state file while it runs and removes it when it
    detaches: the command brings the exporter's observer in, the control loop never names it."""
    import json
    import subprocess
    import sys

    sdir = ensure_state_dir(str(tmp_path / "run"))
    here = os.path.dirname(os.path.abspath(__file__))
    code = _PUBLISHING_ATTACH.format(root=os.path.dirname(here), tests=here, tmp=str(tmp_path), sdir=sdir)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, UMCTL_STATE_DIR=sdir))
    assert p.returncode == 0, p.stderr[-2000:]
    doc = json.loads(p.stdout.strip().splitlines()[-1])
    assert doc["rc"] == 0 and doc["left"] == []
    assert doc["published"] and doc["published"][0]["target_pid"] == 4242 and doc["published"][0]["mode"] == "none"
    assert doc["published"][0]["budget_bytes"] == 8 << 20


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_churn_of_1000_processes_keeps_memory_bounded(node):
    """1,000 processes start, fault and exit under one agent, 50 alive at a time: every fd,
    ring and drain thread is released, ended series are retired after the grace, no source
    object outlives its process, and the last 800 processes leave the resident size where
    the first 200 did."""
    drv, root, tmp = node
    clock = Clock()
    # drained every 50 ms, not 1: 50 threads waking each millisecond only fight for the GIL
    # (what is checked is that each is released; the last drain on exit takes its events)
    agent, state, _ = make_agent(drv, root, grace=3.0, clock=clock, drain_ms=50.0)
    slots = [f"{root}/.slot{i}" for i in range(50)]   # a process starts and exits by a rename
    for i in range(50):                              # (quick on any file system, unlike rmtree)
        spawn(tmp, 90_000 + i)
        os.rename(f"{root}/{90_000 + i}", slots[i])
    others = set(threading.enumerate())

    def drain_threads() -> int:   # this agent's: not a thread some other test left behind
        return sum(t.name.startswith("umctl-uvm-") for t in threading.enumerate() if t not in others)

    # the fake pids must not include this test's own: the agent never attaches to its own process
    pid = 10_000 if not 10_000 <= os.getpid() < 11_000 else 20_000
    produced = 0
    rss = []
    for wave in range(20):
        pids = list(range(pid, pid + 50))
        pid += 50
        for p, slot in zip(pids, slots):
            os.rename(slot, f"{root}/{p}")
        agent.step()
        assert sorted(agent.fleet.attached()) == pids
        assert drain_threads() == 50                             # one drain thread each
        for p in pids:
            produced += drv.emit(p, faults_for(p, 20, batch=wave))
        for p, slot in zip(pids, slots):
            os.rename(f"{root}/{p}", slot)
        agent.step()
        clock.t += 1.0
        assert agent.fleet.attached() == {} and drv.fds == {} and drv.ring_of == {}
        assert drain_threads() == 0
        assert len(state.processes) <= 150          # the last three waves, inside the grace
        if wave in (3, 19):
            gc.collect()
            rss.append(_rss())
    assert state.attaches == 1000 and produced == 20_000
    assert value(scrape(state), "umctl_gpu_faults_total", pid=pid - 1) == 20
    assert not [o for o in gc.get_objects() if isinstance(o, UvmToolsSource)]
    assert rss[1] - rss[0] < 8 << 20, rss            # < 8 MiB more after 800 more processes
    clock.t += 10
    agent.step()
    assert state.processes == {}
    assert value(scrape(state), "umctl_exporter_processes", state="ended") == 0


# -- the command --------------------------------------------------------------------------

@pytest.mark.parametrize("args, needle", [
    (["--listen", "9464"], "--listen must be HOST:PORT"),
    (["--listen", ":9464"], "--listen must be HOST:PORT"),
    (["--interval", "0s"], "--interval must be a positive duration"),
    (["--grace", "soon"], "--grace must be a positive duration"),
    (["--sample", "2"], "--sample must be in (0, 1]"),
    (["--kinds", "launches"], "unknown event kind"),
    (["--ring-entries", "1000"], "--ring-entries must be a power of two"),
])
def test_bad_input_is_one_line(capsys, args, needle):
    rc, out, err = run_cli(capsys, "exporter", *args)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and needle in err and "Traceback" not in err


def test_busy_port_is_one_line(capsys):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    try:
        rc, out, err = run_cli(capsys, "exporter", "--listen", f"127.0.0.1:{s.getsockname()[1]}", "--duration", "1")
    finally:
        s.close()
    assert rc == 2 and "cannot listen on" in err and len(err.strip().splitlines()) == 1


# -- deploy/ ----------------------------------------------------------------------------------

DEPLOY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "deploy")


def test_grafana_dashboard_queries_only_metrics_the_exporter_serves():
    import json
    import re

    from umctl.exporter.metrics import ControlTotals

    state = ExporterState(sample=0.1, kinds="faults", version="t")
    t = ProcessTotals(1, "x", faults={0: 1.0}, batches={0: 1.0}, thrashing={0: 1.0}, evictions={0: 1.0},
                      bytes={("h2d", "fault"): 1.0})
    state.processes[1] = t
    state.controls[(1, 2)] = ControlTotals(1, 2, "deepum", sent={("prefetch", "under"): 1},
                                           failed={("prefetch", "under"): 1}, moved={"prefetch": 1})
    state.attach_failures["no_uvm"] = 1
    served = set(scrape(state)) | {"process_resident_memory_bytes"}
    with open(os.path.join(DEPLOY, "grafana-umctl.json")) as f:
        dash = json.load(f)
    exprs = [tg["expr"] for p in dash["panels"] for tg in p.get("targets", [])]
    used = {m for e in exprs for m in re.findall(r"\b((?:umctl|process)_[a-z_]+)\b", e)}
    assert len(exprs) >= 20 and used and not used - served, used - served
    for name in ("umctl_gpu_faults_total", "umctl_migrated_bytes_total", "umctl_control_commands_sent_total",
                 "umctl_exporter_dropped_events_total", "umctl_exporter_event_lag_seconds"):
        assert name in used
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))


def test_systemd_unit_runs_the_exporter_with_valid_options(capsys, tmp_path):
    import shlex

    with open(os.path.join(DEPLOY, "umctl-exporter.service")) as f:
        unit = f.read()
    exec_line = next(ln for ln in unit.splitlines() if ln.startswith("ExecStart="))
    argv = shlex.split(exec_line.split("=", 1)[1])
    assert os.path.basename(argv[0]) == "umctl" and argv[1] == "exporter"
    assert argv[argv.index("--listen") + 1].startswith("127.0.0.1:")       # localhost by default
    assert "RuntimeDirectory=umctl" in unit                               # the controllers' state dir
    args = argv[2:]
    args[args.index("--listen") + 1] = "127.0.0.1:0"
    rc, out, err = run_cli(capsys, "exporter", *args, "--duration", "0.3", "--state-dir", str(tmp_path / "run"))
    assert rc == 0, err
    assert "serving http://127.0.0.1:" in err and "stopped after" in err
