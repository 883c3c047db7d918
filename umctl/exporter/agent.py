"""The exporter's node agent: find every process using Unified Memory, attach the tools-API
source to each, fold what they drain into :class:`~umctl.exporter.metrics.ProcessTotals`,
and follow processes as they come and go.

What it must survive, and how:

* **Processes that exit** -- each interval the agent polls every source's pidfd; an exited
  process is drained one last time, its source closed (every fd and ring released) and its
  series kept for ``grace_s`` so that Prometheus scrapes the final increments, then dropped.
  Memory is therefore bounded by the processes alive plus those ended within the grace
  period, however many come and go (tests/test_exporter.py churns 1,000 of them).
* **Processes it cannot attach to** -- not yet CUDA-initialised, refused by the driver, not
  ours to ptrace: remembered with the reason and retried with a growing back-off (2 s up to
  60 s) instead of every scan; forgotten once the process is gone.
* **A driver that goes away** -- any failure of one source (an ioctl error, a drain that
  raises) ends that source only; discovery keeps running, ``umctl_exporter_driver_up`` says
  whether ``/dev/nvidia-uvm-tools`` is there, and processes are attached again when it is.
  Nothing that happens to a target is allowed out of :meth:`Agent.step`: errors are counted
  in ``umctl_exporter_errors_total`` and logged, one line each.

umctl's own processes (``umctl attach/run/record/top``, another exporter) hold duplicated
``/dev/nvidia-uvm`` fds of their targets; attaching through those would count the target's
events twice under the umctl pid, so they are skipped by command line. Children forked from a
CUDA process hold its open file too and are skipped after asking the kernel (kcmp).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable

from ..events.schema import Kind
from ..sources.uvmtools import LiveError, UvmToolsSource, list_uvm_processes
from ..driver import abi
from ..driver.process import NoDriver, NoSuchProcess, TargetExited, nvidia_smi_gpus, process_alive
from .control_state import read_published
from .metrics import ControlTotals, ExporterState, ProcessTotals

#: Exporter ring: 2^15 entries (2.4 MB) per process instead of attach's 2^18 (19 MB): a node
#: agent holds one per process. Overflow is never silent (umctl_exporter_dropped_events_total).
RING_ENTRIES = 1 << 15
#: The most events per second one process was measured to produce (docs/live.md: 1.02-1.12 M/s
#: peaks on the H200), which sets how often a ring must be drained.
PEAK_EVENTS_PER_S = 1.1e6
#: What says the driver is there (the nvidia-uvm module creates it).
TOOLS_PATH = abi.Ioctl.TOOLS_PATH
#: Back-off of a refused attach: first retry, longest wait (seconds).
BACKOFF_S = (2.0, 60.0)


def drain_ms_for(ring_entries: int) -> float:
    """How often a ring is drained: when 80 % of it would fill at the peak rate (2^15: 24 ms).
    The exporter's CPU goes on its per-process drain threads waking up (measured on the 2-core
    dev VM: 0.6 % of a core per process at a 10 ms drain, 0.3 % at 24 ms), so each ring is
    drained as seldom as it safely can be; a larger --ring-entries buys less CPU with memory.
    Sampling windows then switch at drain ticks: coarser, but the on-time is measured, so the
    estimates stay unbiased and the average duty stays the configured one."""
    return min(100.0, max(2.0, 0.8 * ring_entries / PEAK_EVENTS_PER_S * 1e3))


_SYS_KCMP = {"x86_64": 312, "aarch64": 272}.get(platform.machine())
_KCMP_FILE = 0
_libc = None


def kcmp_same_file(pid1: int, fd1: int, pid2: int, fd2: int) -> bool | None:
    """Whether fd1 of pid1 and fd2 of pid2 are one open file (kcmp(2), KCMP_FILE): True or
    False, or None when the kernel cannot say (no kcmp, or no ptrace rights over both)."""
    global _libc
    if _SYS_KCMP is None:
        return None
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    r = _libc.syscall(_SYS_KCMP, pid1, pid2, _KCMP_FILE, fd1, fd2)
    if r < 0:
        e = ctypes.get_errno()
        return None if e in (errno.ENOSYS, errno.EPERM, errno.EACCES) else False   # EBADF/ESRCH: gone
    return r == 0


def is_umctl(cmdline: str) -> bool:
    """A umctl process (``umctl ...``, ``python3 -m umctl``, ``.../bin/umctl``): it holds
    borrowed fds of its targets, not a va_space of its own."""
    argv = cmdline.split()[:4]
    if any(os.path.basename(a) == "umctl" for a in argv[:2]):
        return True
    return any(a in ("umctl", "umctl.cli.main") and argv[i - 1] == "-m" for i, a in enumerate(argv) if i)


def _reason(e: BaseException) -> str:
    """CamelCase error class -> snake_case label (NoPermission -> no_permission)."""
    name = type(e).__name__
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_") or "error"


@dataclass
class _Session:
    src: UvmToolsSource
    totals: ProcessTotals
    t_prev: float
    on_prev: float


@dataclass
class _Refused:
    reason: str
    retry_at: float
    backoff: float


class Agent:
    """Discovery, attach/detach and folding; :meth:`step` is one interval's work (tests call
    it directly), :meth:`run` loops it until ``stop`` is set."""

    def __init__(self, state: ExporterState, *, kinds: Iterable[Kind], sample: float = 0.1,
                 interval_s: float = 1.0, grace_s: float = 120.0, ring_entries: int = RING_ENTRIES,
                 drain_ms: float | None = None, state_dir: str | None = None,
                 io_factory: Callable[[], abi.Ioctl] | None = None, proc_root: str | None = None,
                 driver_present: Callable[[], bool] | None = None,
                 same_file: Callable[[int, int, int, int], bool | None] | None = None,
                 log: Callable[[str], None] | None = None, clock: Callable[[], float] = time.monotonic):
        self.state = state
        self.kinds = frozenset(kinds)
        self.sample = float(sample)
        self.interval_s = float(interval_s)
        self.grace_s = float(grace_s)
        self.ring_entries = int(ring_entries)
        self.drain_ms = drain_ms_for(self.ring_entries) if drain_ms is None else float(drain_ms)
        self.state_dir = state_dir
        self.io_factory = io_factory
        self.proc_root = proc_root
        self.driver_present = driver_present or (lambda: os.path.exists(TOOLS_PATH))
        self.log = log or _stderr_log
        self.clock = clock
        self.sessions: dict[int, _Session] = {}
        self.refused: dict[int, _Refused] = {}
        #: processes not looked at again: umctl's own (0) or sharing an attached one's va_space (its pid)
        self.skipped: dict[int, int] = {}
        self.same_file = same_file or kcmp_same_file
        self._kcmp_ok = True
        self._smi: list[dict] | None = None
        self._smi_t = -1e9
        self._migrations = Kind.MIGRATION in self.kinds
        #: fault batches counted by their replay records: every event collected, replays among them
        self._replays = self.sample >= 1 and Kind.REPLAY in self.kinds

    # -- one interval ---------------------------------------------------------------------
    def step(self) -> None:
        t0 = time.perf_counter()
        now = self.clock()
        up = self._guard("driver check", self.driver_present, False)
        hidden = self._guard("scan", self._scan, None)
        for pid in list(self.sessions):
            self._guard(f"pid {pid}", self._drain, None, pid)
        if self.state_dir:
            self._guard("control state", self._controls, None, now)
        lags = [s.src.lag_delivery for s in self.sessions.values()]
        p50 = max((h.percentile(50) or 0.0 for h in lags), default=0.0)
        p99 = max((h.percentile(99) or 0.0 for h in lags), default=0.0)
        with self.state.lock:
            self.state.driver_up = bool(up)
            if hidden is not None:
                self.state.hidden = hidden
            self.state.unattachable = len(self.refused)
            self.state.lag_p50_s, self.state.lag_p99_s = p50 / 1e9, p99 / 1e9
            self.state.retire(now, self.grace_s)
            self.state.loop_s = time.perf_counter() - t0
            self.state.updated = self.clock()

    def _guard(self, what: str, fn, default, *args):
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001 - nothing about one target may stop the agent
            with self.state.lock:
                self.state.errors += 1
            self.log(f"{what}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            return default

    def _scan(self) -> int:
        """Attach to new UVM processes; forget refusals of processes that are gone. Returns
        how many fd tables could not be read."""
        now = self.clock()
        for pid in [p for p in self.refused if not process_alive(p, self.proc_root)]:
            del self.refused[pid]
        self.skipped = {p: o for p, o in self.skipped.items() if process_alive(p, self.proc_root)}
        waiting = {p for p, r in self.refused.items() if now < r.retry_at}
        procs, hidden = list_uvm_processes(self.proc_root, skip=self.sessions.keys() | waiting | self.skipped.keys())
        for p in procs:    # in pid order: a parent before the children it forked
            if is_umctl(p.cmdline):
                self.skipped[p.pid] = 0
                continue
            owner = self._va_space_owner(p.pid, p.fds)
            if owner is not None:
                self.skipped[p.pid] = owner
                self.log(f"pid {p.pid} ({p.comm}): shares the va_space of pid {owner} (forked after CUDA "
                         f"started): its events are counted there")
                continue
            self._attach(p.pid, p.comm, self.refused.get(p.pid))
        return hidden

    def _va_space_owner(self, pid: int, fds: list[int]) -> int | None:
        """The attached process whose va_space ``pid`` holds too, if any. A child forked after
        its parent opened /dev/nvidia-uvm (PyTorch's DataLoader workers) inherits the same
        open file; a tracker through it would see the parent's events again, under the
        child's pid, and add its cost to the parent a second time."""
        if not self._kcmp_ok:
            return None
        for owner, s in self.sessions.items():
            for fd in fds:
                same = self.same_file(pid, fd, owner, s.src.target_fd)
                if same is None:   # the kernel cannot tell us (no kcmp, or not allowed)
                    self._kcmp_ok = False
                    self.log("kcmp(2) unavailable: processes forked from a CUDA process are counted twice")
                    return None
                if same:
                    return owner
        return None

    def _gpus(self) -> list[dict]:
        if self.clock() - self._smi_t > 60.0:   # nvidia-smi costs ~100 ms: not once per attach
            self._smi, self._smi_t = nvidia_smi_gpus(), self.clock()
        return self._smi or []

    def _attach(self, pid: int, comm: str, refused: _Refused | None) -> None:
        try:
            src = UvmToolsSource(pid, self.kinds, ring_entries=self.ring_entries,
                                 flush_ms=5.0 if self._migrations else 0.0, drain_ms=self.drain_ms,
                                 sample=self.sample, io=self.io_factory() if self.io_factory else None,
                                 proc_root=self.proc_root, smi=self._gpus())
            src.start()
        except LiveError as e:
            reason = _reason(e)
            with self.state.lock:
                self.state.attach_failures[reason] = self.state.attach_failures.get(reason, 0) + 1
            if isinstance(e, (TargetExited, NoSuchProcess)):
                self.refused.pop(pid, None)
                return
            backoff = BACKOFF_S[0] if refused is None else min(refused.backoff * 2, BACKOFF_S[1])
            if refused is None or refused.reason != reason:
                self.log(f"pid {pid} ({comm}): not attached: {e}")
            if isinstance(e, NoDriver):
                backoff = BACKOFF_S[0]
            self.refused[pid] = _Refused(reason, self.clock() + backoff, backoff)
            return
        self.refused.pop(pid, None)
        on, t = (src.sampler.on_time(), src.sampler.clock()) if src.sampler is not None else (0.0, 0.0)
        with self.state.lock:
            totals = self.state.processes.get(pid)
            if totals is None or totals.comm != comm:
                totals = self.state.processes[pid] = ProcessTotals(pid, comm)
            # else: attached again within the grace (after a source error): its counters go on
            totals.ended = None
            totals.uuids = {int(g["gpu"]): str(g["uuid"]) for g in src.gpus}
            totals.reset_baselines()
            self.state.attaches += 1
        self.sessions[pid] = _Session(src, totals, t, on)
        self.log(f"pid {pid} ({comm}): attached")

    def _drain(self, pid: int) -> None:
        s = self.sessions[pid]
        src = s.src
        exited = False
        try:
            exited = src.exited()
            if exited:
                src.stop()      # final flush and drain: the last events still count
            batch = src.drain()
            scale = 1.0
            if src.sampler is not None:   # elapsed over on-time, both on the sampler's clock
                on, now = src.sampler.on_time(), src.sampler.clock()
                d_on, d_t = on - s.on_prev, now - s.t_prev
                scale = d_t / d_on if d_on > 0 else 1.0 / self.sample
                s.on_prev, s.t_prev = on, now
            counters = src.counters()
            if src.gpus and len(src.gpus) != len(s.totals.uuids):
                uuids = {int(g["gpu"]): str(g["uuid"]) for g in src.gpus}
            else:
                uuids = None
            with self.state.lock:
                if uuids is not None:
                    s.totals.uuids = uuids
                s.totals.fold(batch, scale, counters=counters, replay_batches=self._replays,
                              migration_events=self._migrations)
                s.totals.sampled_ratio = src.sample_fraction()
        except Exception:
            self._end(pid)
            if not exited:   # alive: attach again after a back-off, not at the very next scan
                self.refused[pid] = _Refused("source_error", self.clock() + BACKOFF_S[0], BACKOFF_S[0])
            raise
        if exited:
            self._end(pid)

    def _end(self, pid: int) -> None:
        s = self.sessions.pop(pid)
        try:
            s.src.close()
        finally:
            with self.state.lock:
                if s.totals.ended is None:
                    s.totals.ended = self.clock()
            self.log(f"pid {pid} ({s.totals.comm}): ended")

    def _controls(self, now: float) -> None:
        pubs = read_published(self.state_dir, self.proc_root or "/proc")
        with self.state.lock:
            seen = set()
            for p in pubs:
                key = (p.target_pid, p.umctl_pid)
                seen.add(key)
                c = self.state.controls.get(key)
                if c is None:
                    c = self.state.controls[key] = ControlTotals(p.target_pid, p.umctl_pid, p.mode)
                c.budget_bytes, c.resident_bytes = p.budget_bytes, p.resident_bytes
                c.sent, c.failed, c.moved, c.ended = p.sent, p.failed, p.moved, None
            for key, c in self.state.controls.items():
                if key not in seen and c.ended is None:
                    c.ended = now

    # -- the loop -------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Step every ``interval_s`` until ``stop``; then detach from everything."""
        try:
            while not stop.is_set():
                t = self.clock()
                self.step()
                stop.wait(max(0.0, self.interval_s - (self.clock() - t)))
        finally:
            self.close()

    def close(self) -> None:
        for pid in list(self.sessions):
            self._guard(f"pid {pid}", self._end, None, pid)


def _stderr_log(msg: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} umctl exporter: {msg}", file=sys.stderr, flush=True)
