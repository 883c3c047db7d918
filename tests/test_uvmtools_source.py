"""UvmToolsSource and the live commands against a fake driver at the Ioctl seam and a fake
/proc tree: attach sequence, fd selection, error paths and their exit codes, ring draining
through the real Ring/Drainer code, target exit. No real device is touched."""

from __future__ import annotations

import ctypes as C
import errno
import os
import time

import numpy as np
import pytest

from umctl.events.schema import Kind
from umctl.events.trace import read_trace
from umctl.driver import abi, process
from umctl.sources.uvmtools import (
    ALL_KINDS, DEFAULT_KINDS, LiveError, NoDriver, NoPermission, NoUvm, TargetExited, UvmToolsSource, parse_kinds,
)
from umctl.driver.process import NoSuchProcess

GPU_UUID = bytes(range(16))
CPU_UUID = bytes([0xA6] * 16)


def entries(*recs: dict) -> np.ndarray:
    """Synthetic ring entries from field dicts (ENTRY_DTYPE field names)."""
    out = np.zeros(len(recs), dtype=abi.ENTRY_DTYPE)
    for i, r in enumerate(recs):
        for k, v in r.items():
            out[i][k] = v
    return out


def produce(ring_entries: np.ndarray, control: np.ndarray, recs: np.ndarray) -> int:
    """The driver's enqueue protocol (uvm_tools.c): masked indices, drop when one slot would
    remain, count drops per type. Returns how many were enqueued."""
    n = len(ring_entries)
    mask = n - 1
    c = control[0]
    done = 0
    for r in recs:
        get = int(c["get_behind"]) & mask
        put = int(c["put_ahead"]) & mask
        if ((n + get - put) & mask) == 1:
            control["dropped"][0][int(r["type"])] += 1
            continue
        ring_entries[put] = r
        control["put_ahead"][0] = (put + 1) & mask
        control["put_behind"][0] = (put + 1) & mask
        done += 1
    return done


class FakeDriver(abi.Ioctl):
    """A pretend nvidia-uvm: target fds, pidfds, trackers, ring buffers at the addresses the
    source passes (written through ctypes exactly like the kernel writes user memory)."""

    def __init__(self, pid: int, va_fd: int = 11, mm_fd: int = 10):
        self.pid = pid
        self.va_target_fd, self.mm_target_fd = va_fd, mm_fd
        self.next_fd = 1000
        self.fds: dict[int, tuple] = {}
        self.no_driver = False
        self.pidfd_errno = 0
        self.getfd_errno = 0
        self.exited = False
        self.pending: list[np.ndarray] = []   # entries the next flush delivers
        self.rings: list[tuple[np.ndarray, np.ndarray]] = []
        self.enabled_mask = 0
        self.counters: np.ndarray | None = None
        self.counters_on = False
        self.calls: list[int] = []

    def _new(self, what: tuple) -> int:
        self.next_fd += 1
        self.fds[self.next_fd] = what
        return self.next_fd

    def open_tools(self) -> int:
        if self.no_driver:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory")
        return self._new(("tools",))

    def close(self, fd: int) -> None:
        assert fd in self.fds, f"close of unknown fd {fd}"
        del self.fds[fd]

    def pidfd_open(self, pid: int) -> int:
        if self.pidfd_errno:
            raise OSError(self.pidfd_errno, os.strerror(self.pidfd_errno))
        return self._new(("pidfd", pid))

    def pidfd_getfd(self, pidfd: int, targetfd: int) -> int:
        if self.getfd_errno:
            raise OSError(self.getfd_errno, os.strerror(self.getfd_errno))
        return self._new(("dup", targetfd))

    def process_exited(self, pidfd: int) -> bool:
        self.deliver(flush=False)  # polled by the loop: time passes, fault events arrive
        return self.exited

    def ioctl(self, fd: int, cmd: int, params) -> int:
        self.calls.append(cmd)
        kind = self.fds[fd]
        if cmd == abi.UVM_TOOLS_INIT_EVENT_TRACKER_V2:
            assert kind[0] == "tools"
            target = self.fds.get(params.uvmFd)
            if target is None or target[1] != self.va_target_fd:
                return abi.NV_ERR_ILLEGAL_ACTION
            if params.queueBufferSize:
                n = params.queueBufferSize
                ring = np.ctypeslib.as_array((C.c_uint8 * (n * abi.ENTRY_SIZE)).from_address(params.queueBuffer))
                ctrl = np.ctypeslib.as_array((C.c_uint8 * abi.CONTROL_SIZE).from_address(params.controlBuffer))
                self.rings.append((ring.view(abi.ENTRY_DTYPE), ctrl.view(abi.CONTROL_DTYPE)))
            else:
                cnt = np.ctypeslib.as_array((C.c_uint8 * (abi.N_COUNTERS * 8)).from_address(params.controlBuffer))
                self.counters = cnt.view("<u8")
            return abi.NV_OK
        if cmd == abi.UVM_TOOLS_EVENT_QUEUE_ENABLE_EVENTS:
            self.enabled_mask |= params.value
            self.deliver(flush=False)
            return abi.NV_OK
        if cmd == abi.UVM_TOOLS_EVENT_QUEUE_DISABLE_EVENTS:
            self.enabled_mask &= ~params.value
            return abi.NV_OK
        if cmd == abi.UVM_TOOLS_ENABLE_COUNTERS:
            self.counters_on = True
            return abi.NV_OK
        if cmd == abi.UVM_TOOLS_DISABLE_COUNTERS:
            self.counters_on = False
            return abi.NV_OK
        if cmd == abi.UVM_TOOLS_GET_PROCESSOR_UUID_TABLE_V2:
            assert kind == ("dup", self.va_target_fd)
            table = (abi.NvProcessorUuid * abi.UVM_ID_MAX_PROCESSORS).from_address(params.value)
            C.memmove(table[0].uuid, CPU_UUID, 16)
            C.memmove(table[1].uuid, GPU_UUID, 16)
            return abi.NV_OK
        if cmd == abi.UVM_TOOLS_FLUSH_EVENTS:
            assert kind == ("dup", self.va_target_fd)
            self.deliver()
            return abi.NV_OK
        raise AssertionError(f"unexpected ioctl {cmd}")

    def deliver(self, flush: bool = True) -> None:
        """Like the driver (measured on the H100): fault events reach the ring as they are
        recorded (p50 1.2 ms, no flush needed); Migration events wait for a flush."""
        keep = []
        while self.pending and self.rings:
            recs = self.pending.pop(0)
            ring, ctrl = self.rings[0]
            mask = np.array([(self.enabled_mask >> int(t)) & 1 for t in recs["type"]], dtype=bool)
            if not flush:
                deferred = recs["type"] == abi.EV_MIGRATION
                if deferred.any():
                    keep.append(recs[deferred])
                mask &= ~deferred
            if self.counters is not None and self.counters_on:   # every fault, enabled events or not
                self.counters[9] += int((recs["type"] == abi.EV_GPU_FAULT).sum())
                self.counters[2] += int((recs["type"] == abi.EV_CPU_FAULT).sum())
            produce(ring, ctrl, recs[mask])
        self.pending[:0] = keep


def fake_proc(tmp_path, pid: int, fds: dict[int, str], state: str = "S", readable: bool = True) -> str:
    root = tmp_path / "proc"
    d = root / str(pid)
    (d / "fd").mkdir(parents=True)
    for fd, target in fds.items():
        os.symlink(target, d / "fd" / str(fd))
    (d / "stat").write_text(f"{pid} (python3) {state} 1 1 1")
    (d / "comm").write_text("python3\n")
    (d / "cmdline").write_bytes(b"python3\0train.py\0")
    if not readable:
        os.chmod(d / "fd", 0)
    return str(root)


PID = 4242


@pytest.fixture
def target(tmp_path, monkeypatch):
    root = fake_proc(tmp_path, PID, {0: "/dev/pts/0", 10: "/dev/nvidia-uvm", 11: "/dev/nvidia-uvm",
                                     12: "/dev/nvidia-uvm-tools", 13: "/dev/nvidiactl"})
    drv = FakeDriver(PID)
    monkeypatch.setattr(process, "PROC_ROOT", root)
    return drv, root


def gpu_faults(n: int, batch: int, t0: int = 1_000_000) -> np.ndarray:
    return entries(*[{"type": abi.EV_GPU_FAULT, "g_gpu": 1, "g_addr": 0x7F0000000000 + i * 4096, "g_ts": t0 + i,
                      "g_batch": batch, "g_access": 1, "g_client_type": 1, "g_client_id": 3} for i in range(n)])


def test_attach_picks_the_va_space_fd_and_closes_every_other(target):
    drv, root = target
    src = UvmToolsSource(PID, DEFAULT_KINDS, ring_entries=64, flush_ms=1, drain_ms=1, io=drv, smi=[])
    src.start()
    try:
        assert src.target_fd == 11
        dups = [v for v in drv.fds.values() if v[0] == "dup"]
        assert dups == [("dup", 11)]  # the mm fd's duplicate was closed
        assert drv.enabled_mask == abi.event_mask([1, 3, 4, 10])  # no Migration by default
        assert src.gpus[0]["uuid"].startswith("GPU-00010203")
        drv.pending.append(gpu_faults(5, batch=7))
        drv.pending.append(entries({"type": abi.EV_GPU_FAULT_REPLAY, "r_gpu": 1, "r_batch": 7, "r_ts": 2_000_000}))
        deadline = time.monotonic() + 5
        got = []
        while time.monotonic() < deadline and sum(len(b[Kind.REPLAY]) for b in got) == 0:
            time.sleep(0.01)
            got.append(src.drain())
    finally:
        src.close()
    assert drv.fds == {}  # every fd we opened or duplicated is closed
    faults = np.concatenate([b[Kind.FAULT] for b in got])
    replay = np.concatenate([b[Kind.REPLAY] for b in got])
    assert len(faults) == 5 and (faults["gpu"] == 0).all() and (faults["pid"] == PID).all()
    assert replay["nfaults"].tolist() == [5]
    assert src.totals[Kind.FAULT] == 5 and src.dropped_total == 0


def test_ring_overflow_surfaces_as_drops_and_later_events_still_arrive(target):
    drv, root = target
    src = UvmToolsSource(PID, ALL_KINDS, ring_entries=16, flush_ms=0, drain_ms=1000, io=drv, smi=[]).start()
    try:
        assert drv.enabled_mask & (1 << abi.EV_MIGRATION)
        ring, ctrl = drv.rings[0]
        assert produce(ring, ctrl, gpu_faults(40, batch=1)) == 15  # N - 1 fit
        b1 = src.drainer.drain_once() and src.drain()
        assert len(b1[Kind.FAULT]) == 15
        assert b1[Kind.DROPS]["count"].tolist() == [25]
        assert produce(ring, ctrl, gpu_faults(10, batch=2)) == 10  # wraps around the end
        b2 = src.drainer.drain_once() and src.drain()
        assert len(b2[Kind.FAULT]) == 10 and Kind.DROPS not in b2
        assert src.dropped_total == 25
    finally:
        src.close()


@pytest.mark.parametrize("setup, exc, code", [
    (lambda drv, tmp: setattr(drv, "no_driver", True), NoDriver, 6),
    (lambda drv, tmp: setattr(drv, "pidfd_errno", errno.EPERM), NoPermission, 5),
    (lambda drv, tmp: setattr(drv, "getfd_errno", errno.EPERM), NoPermission, 5),
    (lambda drv, tmp: setattr(drv, "pidfd_errno", errno.ESRCH), TargetExited, 7),
    (lambda drv, tmp: setattr(drv, "va_target_fd", 99), NoUvm, 4),
])
def test_attach_errors_are_distinct(target, tmp_path, setup, exc, code):
    drv, root = target
    setup(drv, tmp_path)
    with pytest.raises(exc) as ei:
        UvmToolsSource(PID, io=drv, smi=[]).start()
    assert ei.value.exit_code == code
    assert "\n" not in str(ei.value)
    assert drv.fds == {}  # nothing leaked on the error path


def test_no_such_pid_and_pid_without_uvm(tmp_path, monkeypatch):
    root = fake_proc(tmp_path, 77, {0: "/dev/null", 1: "/dev/nvidiactl"})
    monkeypatch.setattr(process, "PROC_ROOT", root)
    drv = FakeDriver(77)
    with pytest.raises(NoSuchProcess) as ei:
        UvmToolsSource(78, io=drv).start()
    assert ei.value.exit_code == 3
    with pytest.raises(NoUvm, match="no /dev/nvidia-uvm open") as ei:
        UvmToolsSource(77, io=drv).start()
    assert ei.value.exit_code == 4


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any directory")
def test_unreadable_fd_table_is_a_permission_error(tmp_path, monkeypatch):
    root = fake_proc(tmp_path, 55, {3: "/dev/nvidia-uvm"}, readable=False)
    monkeypatch.setattr(process, "PROC_ROOT", root)
    with pytest.raises(NoPermission):
        UvmToolsSource(55, io=FakeDriver(55)).start()


def test_list_uvm_processes_finds_only_uvm_users(tmp_path):
    root = fake_proc(tmp_path, 10, {3: "/dev/nvidia-uvm"})
    fake_proc(tmp_path, 11, {3: "/dev/nvidia-uvm-tools", 4: "/dev/null"}) if False else None
    d = tmp_path / "proc" / "11" / "fd"
    d.mkdir(parents=True)
    os.symlink("/dev/nvidia-uvm-tools", d / "3")
    procs, hidden = process.list_uvm_processes(root)
    assert [p.pid for p in procs] == [10] and procs[0].fds == [3]


def test_parse_kinds():
    assert parse_kinds("default") == DEFAULT_KINDS and parse_kinds("all") == ALL_KINDS
    assert parse_kinds("+migrations") == DEFAULT_KINDS | {Kind.MIGRATION}
    assert parse_kinds("faults") == {Kind.FAULT}
    with pytest.raises(LiveError, match="unknown event kind"):
        parse_kinds("faults,launches")


# -- the commands ---------------------------------------------------------------------------

def run_cli(capsys, *args):
    from umctl.cli.main import main
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def fake_io(target, monkeypatch):
    drv, root = target
    monkeypatch.setattr(abi, "Ioctl", lambda: drv)
    monkeypatch.setattr(process, "nvidia_smi_gpus", lambda: [])
    import umctl.sources.uvmtools.source as source_mod
    monkeypatch.setattr(source_mod, "nvidia_smi_gpus", lambda: [])
    return drv


def test_attach_records_until_target_exits_then_closes_the_trace(fake_io, tmp_path, capsys, monkeypatch):
    drv = fake_io
    drv.pending.append(gpu_faults(300, batch=1))
    drv.pending.append(entries({"type": abi.EV_GPU_FAULT_REPLAY, "r_gpu": 1, "r_batch": 1, "r_ts": 5_000_000},
                               {"type": abi.EV_MIGRATION, "m_cause": 2, "m_src": 0, "m_dst": 1,
                                "m_addr": 0x7F0000000000, "m_bytes": 2 << 20, "m_begin": 10, "m_end": 20}))
    t_exit = time.monotonic() + 1.0
    drv.process_exited = lambda pidfd: time.monotonic() > t_exit  # type: ignore[method-assign]
    trace = tmp_path / "t.parquet"
    code, out, err = run_cli(capsys, "attach", "--pid", str(PID), "-o", str(trace), "--kinds", "all",
                             "--interval", "0.2", "--no-launches")
    assert code == 0, err
    assert "target exited" in out and "GPU faults   300 in 1 batches" in out
    assert "dropped      0 events" in out
    assert "demand 2.00 MiB" in out
    t = read_trace(trace)
    assert t.counts()[Kind.FAULT] == 300 and t.counts()[Kind.MIGRATION] == 1
    assert t.meta["source"] == "umctl attach" and t.meta["pid"] == PID and t.meta["complete"] is True
    assert drv.fds == {}


def test_record_duration(fake_io, tmp_path, capsys):
    drv = fake_io
    drv.pending.append(gpu_faults(10, batch=3))
    trace = tmp_path / "r.parquet"
    code, out, err = run_cli(capsys, "record", "--pid", str(PID), "-o", str(trace), "--duration", "0.5",
                             "--no-launches")
    assert code == 0, err
    assert "duration 0.5 s reached" in out
    assert read_trace(trace).counts()[Kind.FAULT] == 10


@pytest.mark.parametrize("mutate, needle, code", [
    (lambda d: setattr(d, "no_driver", True), "no NVIDIA UVM driver", 6),
    (lambda d: setattr(d, "pidfd_errno", errno.EPERM), "pidfd_open(4242) refused", 5),
    (lambda d: setattr(d, "va_target_fd", 1), "accepted no event tracker", 4),
])
def test_cli_errors_are_one_line(fake_io, capsys, mutate, needle, code):
    mutate(fake_io)
    rc, out, err = run_cli(capsys, "attach", "--pid", str(PID), "--no-launches")
    assert rc == code
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in err and "Traceback" not in err


def test_cli_no_such_pid(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(process, "PROC_ROOT", str(tmp_path))
    rc, out, err = run_cli(capsys, "attach", "--pid", "123456")
    assert rc == 3 and err.strip() == "umctl: error: no process with pid 123456"


def test_top_once_shows_each_uvm_process(fake_io, capsys):
    drv = fake_io
    drv.pending.append(gpu_faults(50, batch=1))
    rc, out, err = run_cli(capsys, "top", "--once", "--interval", "0.3", "--no-launches", "--sample", "1")
    assert rc == 0, err
    assert "1 process(es) using UVM" in out
    row = next(ln for ln in out.splitlines() if ln.startswith(str(PID)))
    assert "python3" in row
    assert "0x7f0000000000 50" in out  # top 2 MiB block by faults


def test_attach_mode_none_budget_preevicts_through_the_target_va_space(fake_io, tmp_path, capsys):
    """``attach --mode none --budget``: faults on 12 blocks against an 8 MiB budget make the
    budget keeper pre-evict the oldest blocks with UVM_MIGRATE to the CPU's UUID on the
    duplicated va_space fd; commands and their results land in the trace; detach is clean."""
    drv = fake_io
    migrations: list[tuple[int, int, bytes]] = []
    plain = drv.ioctl

    def ioctl(fd, cmd, params):
        if cmd == abi.UVM_MIGRATE:
            assert drv.fds[fd] == ("dup", drv.va_target_fd)
            migrations.append((params.base, params.length, bytes(params.destinationUuid.uuid)))
            return abi.NV_OK
        return plain(fd, cmd, params)

    drv.ioctl = ioctl  # type: ignore[method-assign]
    drv.pending.append(entries(*[{"type": abi.EV_GPU_FAULT, "g_gpu": 1, "g_addr": 0x7F0000000000 + (i << 21),
                                  "g_ts": 1_000_000 + i, "g_batch": 1, "g_access": 1, "g_client_type": 1}
                                 for i in range(12)]))
    trace = tmp_path / "c.parquet"
    code, out, err = run_cli(capsys, "attach", "--pid", str(PID), "-o", str(trace), "--duration", "0.6",
                             "--interval", "0.2", "--no-launches", "--mode", "none", "--budget", "8MiB")
    assert code == 0, err
    assert migrations, "no pre-eviction reached the driver"
    assert all(u == CPU_UUID and n == 2 << 20 or n % (2 << 20) == 0 for _, n, u in migrations)
    evicted = sorted({(b - 0x7F0000000000) >> 21 for b, n, _ in migrations for b in range(b, b + n, 2 << 20)})
    assert evicted[:4] == [0, 1, 2, 3]                     # least recently migrated first
    assert "control      mode none" in out and "budget       8.00 MiB" in out
    t = read_trace(trace)
    assert t.counts()[Kind.COMMAND] >= 4 and t.counts()[Kind.RESULT] == t.counts()[Kind.COMMAND]
    assert drv.fds == {}


def test_attach_mode_needing_launches_without_probe_is_refused(fake_io, capsys):
    code, out, err = run_cli(capsys, "attach", "--pid", str(PID), "--duration", "0.2", "--no-launches",
                             "--mode", "deepum")
    assert code != 0 and "needs kernel-launch events" in err and "Traceback" not in err
    assert fake_io.fds == {}


def test_attach_merges_launch_events_into_the_trace_and_summary(fake_io, tmp_path, capsys, monkeypatch):
    """The launch probe's LAUNCH records and kernel names join the tools-API batch: they reach
    the trace (with the names table) and the summary's top kernels by faults."""
    import umctl.live.session as session
    from umctl.events.schema import EventBatch, empty

    class FakeProbe:
        def __init__(self):
            self.sent = False
            self.closed = False

        def drain(self):
            b = EventBatch(names=["my_kernel"])
            if not self.sent:
                la = empty(Kind.LAUNCH, 1)
                la["t_ns"], la["name_id"], la["seq"], la["exec_hash"] = 1, 0, 0, 7   # before the faults
                b.add(Kind.LAUNCH, la)
                self.sent = True
            return b

        def close(self):
            self.closed = True

    probe = FakeProbe()
    monkeypatch.setattr(session, "start_launch_probe", lambda pid, warn: probe)
    fake_io.pending.append(gpu_faults(50, batch=1))
    trace = tmp_path / "l.parquet"
    code, out, err = run_cli(capsys, "attach", "--pid", str(PID), "-o", str(trace), "--duration", "0.5",
                             "--interval", "0.2")
    assert code == 0, err
    assert "launches     1; top kernels by faults: my_kernel 50" in out
    t = read_trace(trace)
    assert t.counts()[Kind.LAUNCH] == 1 and "my_kernel" in t.names and probe.closed
