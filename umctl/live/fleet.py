"""Every process on the node that uses Unified Memory, followed as processes come and go: the
loop that ``umctl top`` and ``umctl exporter`` share.

A :class:`Fleet` discovers processes with ``/dev/nvidia-uvm`` open (or watches the one pid it
is given), attaches a source to each (and optionally a launch source), drains them, and
forgets a process ``grace_s`` after it is gone. It never prints and never folds events itself:
it reports through :class:`FleetEvents`, and keeps per process whatever its consumer puts in
:attr:`Member.data` (top a :class:`~umctl.live.stats.LiveStats`, the exporter its totals).

What it must survive, and how:

* **Processes that exit** -- each drain asks the source whether its target exited (the tools
  source polls its pidfd); an exited process is drained one last time (its final events still
  count), its source closed (every fd and ring released) and its member kept for ``grace_s``,
  so that a consumer can show the final values, then retired. Memory is therefore bounded by
  the processes alive plus those ended within the grace period.
* **Processes it cannot attach to** -- not yet CUDA-initialised, refused by the driver, not
  ours to ptrace: remembered with the reason and retried with a growing back-off
  (:data:`BACKOFF_S`) instead of at every scan; forgotten once the process is gone.
* **Sources that fail** -- anything raised while attaching or draining one process (by its
  source, or by the consumer's fold of its batch) ends that process's source only; it is
  recorded (:attr:`Fleet.errors`, :meth:`FleetEvents.on_error`) and, if the process is still
  there, attached again after the first back-off. A fleet given one ``pid`` is the exception:
  its caller named that process, so a failure to attach it raises.

With ``dedupe``, umctl's own processes (``umctl attach/run/record/top``, an exporter) are not
attached: they hold duplicated ``/dev/nvidia-uvm`` fds of their targets, and a tracker through
those would report the target's events again under the umctl pid. Children forked from a CUDA
process hold its open file too and are skipped after asking the kernel (kcmp).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import time
from dataclasses import dataclass
from typing import Callable, Generic, TypeVar

from ..driver.process import (LiveError, NoDriver, NoSuchProcess, TargetExited, UvmProcess, comm_of,
                              list_uvm_processes, process_alive)
from ..events.schema import EventBatch, Kind
from ..sources.uvmtools import UvmToolsSource
from .interfaces import LaunchSource, Source
from .session import merge_launches

T = TypeVar("T")

#: Back-off of a refused attach: first retry, longest wait (seconds). A process that is not
#: CUDA-initialised yet is usually attachable a moment later; one we may not trace never is.
BACKOFF_S = (2.0, 60.0)

#: A started source on a pid (raises on refusal, a LiveError when the driver or the kernel says no).
OpenSource = Callable[[int], Source]
#: A started launch source on a pid, or None; says through the callable why not.
OpenLaunches = Callable[[int, Callable[[str], None]], "LaunchSource | None"]


def tools_source(pid: int, kinds: frozenset[Kind], sample: float, **options) -> Source:
    """A started tools-API source on ``pid`` as a fleet attaches it. Migration events get a
    5 ms flush (the driver defers them 100-400 ms otherwise); without them no flush runs, as it
    costs driver time on every call (live/attach.py). ``options``: the source's own (ring size,
    drain period, io, proc root, nvidia-smi table)."""
    return UvmToolsSource(pid, kinds, flush_ms=5.0 if Kind.MIGRATION in kinds else 0.0, sample=sample,
                          **options).start()


@dataclass(eq=False)
class Member(Generic[T]):
    """One process the fleet knows: attached (``source`` set), waiting to be attached again
    (``error``, ``retry_at``), or gone (``gone`` set; retired ``grace_s`` later)."""

    pid: int
    comm: str
    source: Source | None = None
    launches: LaunchSource | None = None
    #: what the consumer keeps for this process, set from its callbacks
    data: T | None = None
    #: why it is not attached: the last refusal or source failure ("" while attached)
    error: str = ""
    #: that error's class, snake_case (``no_permission``; ``source_error`` for a failed source)
    reason: str = ""
    retry_at: float = 0.0
    backoff: float = 0.0
    #: when the process was seen gone (fleet clock)
    gone: float | None = None


class FleetEvents(Generic[T]):
    """What a fleet reports; every method is a no-op here, a consumer overrides what it needs.

    ``on_batch`` runs inside the member's guard: what it raises ends that member's source like
    a failing drain (it reads the source: counters, sampling). The others are the consumer's own
    code and what they raise propagates out of the fleet's call."""

    def on_attach(self, m: Member[T]) -> None:
        """``m.source`` is attached and started."""

    def on_refuse(self, m: Member[T], error: Exception, first: bool) -> None:
        """Attaching failed (``m.error``, ``m.reason``); ``first``: not for this reason just
        before (say it once, not at every retry). ``m.gone`` is set when the process went away
        while attaching."""

    def on_batch(self, m: Member[T], batch: EventBatch) -> None:
        """One drain of ``m.source`` (launch records merged in)."""

    def on_detach(self, m: Member[T]) -> None:
        """``m``'s source is closed: its process exited (``m.gone`` set), its source failed
        (``m.error``; attached again later) or the fleet closed."""

    def on_retire(self, m: Member[T]) -> None:
        """``m``'s process has been gone for the grace period: forget it."""

    def on_warning(self, text: str) -> None:
        """Something that degrades without failing (no launch probe; a process skipped as a
        duplicate)."""

    def on_error(self, pid: int | None, error: Exception) -> None:
        """A failure the fleet survived: of one process (``pid``) or of discovery (None)."""


def reason_of(e: BaseException) -> str:
    """CamelCase error class -> snake_case label (NoPermission -> no_permission)."""
    name = type(e).__name__
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_") or "error"


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


class Fleet(Generic[T]):
    """The processes using UVM and a source on each. :meth:`step` is one interval's work
    (:meth:`scan`, then :meth:`drain`); a view that drains more often than it looks for new
    processes calls the two apart. ``pid``: watch only that process (attach failures raise).
    ``launches``: also a launch source per process (top's BPF probe). ``proc_root``,
    ``same_file`` and ``clock`` are seams for tests."""

    def __init__(self, open_source: OpenSource, events: FleetEvents[T], *, pid: int | None = None,
                 grace_s: float = 0.0, launches: OpenLaunches | None = None, dedupe: bool = False,
                 proc_root: str | None = None, same_file: Callable[[int, int, int, int], bool | None] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.open_source = open_source
        self.events = events
        self.pid = pid
        self.grace_s = float(grace_s)
        self.open_launches = launches
        self.dedupe = dedupe
        self.proc_root = proc_root
        self.same_file = same_file or kcmp_same_file
        self.clock = clock
        self.members: dict[int, Member[T]] = {}
        #: processes not looked at again: umctl's own (0) or sharing an attached one's va_space (its pid)
        self.skipped: dict[int, int] = {}
        #: processes whose fd table this user may not read (top says so rather than showing nothing)
        self.hidden = 0
        #: failures survived (raised while attaching, draining or discovering), one per failure
        self.errors = 0
        self._kcmp_ok = True

    # -- what consumers read ----------------------------------------------------------------
    def attached(self) -> dict[int, Member[T]]:
        return {p: m for p, m in self.members.items() if m.source is not None}

    def waiting(self) -> dict[int, Member[T]]:
        """Processes alive but not attached (refused, or their source failed): to be retried."""
        return {p: m for p, m in self.members.items() if m.source is None and m.gone is None}

    # -- the loop ---------------------------------------------------------------------------
    def step(self) -> None:
        self.scan()
        self.drain()

    def scan(self) -> None:
        """Retire what has been gone for the grace period, then attach new processes (and those
        whose back-off ran out)."""
        now = self.clock()
        for m in list(self.members.values()):
            if m.gone is None and m.source is None and not process_alive(m.pid, self.proc_root):
                m.gone = now
            if m.gone is not None and now - m.gone >= self.grace_s:
                del self.members[m.pid]
                self.events.on_retire(m)
        self.skipped = {p: o for p, o in self.skipped.items() if process_alive(p, self.proc_root)}
        for p in self._discover(now):      # in pid order: a parent before the children it forked
            if self.dedupe and self._duplicate(p):
                continue
            m = self.members.get(p.pid)
            if m is None:
                m = self.members[p.pid] = Member(p.pid, p.comm)
            elif m.gone is not None:     # its pid is in use again: a new process
                m.gone, m.backoff, m.reason = None, 0.0, ""
            m.comm = p.comm
            self._attach(m, now)

    def drain(self) -> None:
        """Drain every attached process; one that exited is drained a last time and detached."""
        for m in list(self.members.values()):
            if m.source is not None:
                self._drain(m)

    def close(self) -> None:
        """Detach from every process (a consumer hears ``on_detach`` for each)."""
        for m in list(self.members.values()):
            if m.source is not None:
                self._detach(m, gone=False)

    # -- parts ------------------------------------------------------------------------------
    def _discover(self, now: float) -> list[UvmProcess]:
        """The processes to attach now: new ones, and those whose back-off ran out."""
        known = {p for p, m in self.members.items() if m.source is not None or (m.gone is None and now < m.retry_at)}
        if self.pid is not None:   # named: attached whether or not it has the device open (the source says why not)
            self.hidden = 0
            return [] if self.pid in known else [UvmProcess(self.pid, comm_of(self.pid, self.proc_root), "")]
        try:   # known processes are not looked at: their fd tables are the scan's cost
            procs, self.hidden = list_uvm_processes(self.proc_root, skip=known | self.skipped.keys())
        except Exception as e:  # noqa: BLE001 - discovery runs again at the next scan
            self._error(None, e)
            return []
        return procs

    def _duplicate(self, p: UvmProcess) -> bool:
        if is_umctl(p.cmdline):
            self.skipped[p.pid] = 0
            return True
        owner = self._va_space_owner(p.pid, p.fds)
        if owner is None:
            return False
        self.skipped[p.pid] = owner
        self.events.on_warning(f"pid {p.pid} ({p.comm}): shares the va_space of pid {owner} (forked after CUDA "
                               f"started): its events are counted there")
        return True

    def _va_space_owner(self, pid: int, fds: list[int]) -> int | None:
        """The attached process whose va_space ``pid`` holds too, if any. A child forked after
        its parent opened /dev/nvidia-uvm (PyTorch's DataLoader workers) inherits the same
        open file; a tracker through it would see the parent's events again, under the
        child's pid, and add its cost to the parent a second time."""
        if not self._kcmp_ok:
            return None
        for owner, m in self.attached().items():
            target_fd = getattr(m.source, "target_fd", -1)   # the tools source's borrowed fd
            for fd in fds:
                same = self.same_file(pid, fd, owner, target_fd)
                if same is None:   # the kernel cannot tell us (no kcmp, or not allowed)
                    self._kcmp_ok = False
                    self.events.on_warning("kcmp(2) unavailable: processes forked from a CUDA process are "
                                           "counted twice")
                    return None
                if same:
                    return owner
        return None

    def _attach(self, m: Member[T], now: float) -> None:
        try:
            src = self.open_source(m.pid)
        except Exception as e:  # noqa: BLE001 - a refusal, or a fault of the source: this process only
            if self.pid is not None:
                raise
            self._refused(m, e, now)
            return
        m.source, m.error, m.reason, m.backoff, m.retry_at, m.gone = src, "", "", 0.0, 0.0, None
        if self.open_launches is not None:
            m.launches = self.open_launches(m.pid, self.events.on_warning)
        self.events.on_attach(m)

    def _refused(self, m: Member[T], e: Exception, now: float) -> None:
        reason = reason_of(e)
        first = reason != m.reason
        m.error, m.reason = str(e), reason
        if isinstance(e, (TargetExited, NoSuchProcess)):
            m.gone = now          # gone while attaching: nothing to retry
        else:
            # the driver coming back is worth noticing soon: no growing back-off for its absence
            m.backoff = (BACKOFF_S[0] if not m.backoff or isinstance(e, NoDriver)
                         else min(m.backoff * 2, BACKOFF_S[1]))
            m.retry_at = now + m.backoff
        if not isinstance(e, LiveError):   # not a refusal but a fault: counted as one
            self._error(m.pid, e)
        self.events.on_refuse(m, e, first)

    def _drain(self, m: Member[T]) -> None:
        src = m.source
        assert src is not None
        exited = False
        try:
            exited = src.exited()
            if exited:
                src.stop()      # final flush and drain: the last events still count
            batch, m.launches = merge_launches(src.drain(), m.launches, self.events.on_warning)
            self.events.on_batch(m, batch)
        except Exception as e:  # noqa: BLE001 - nothing about one target may stop the fleet
            m.error, m.reason = str(e), "source_error"
            self._detach(m, gone=exited)
            if not exited:     # alive: attach again after a back-off, not at the very next scan
                m.backoff = BACKOFF_S[0]
                m.retry_at = self.clock() + m.backoff
            self._error(m.pid, e)
            return
        if exited:
            self._detach(m, gone=True)

    def _detach(self, m: Member[T], *, gone: bool) -> None:
        src, launches = m.source, m.launches
        m.source = m.launches = None
        if launches is not None:
            try:
                launches.close()
            except Exception:  # noqa: BLE001 - it is being dropped either way
                pass
        failed: Exception | None = None
        try:
            if src is not None:
                src.close()
        except Exception as e:  # noqa: BLE001
            failed = e
        if gone:
            m.gone = self.clock()
        self.events.on_detach(m)
        if failed is not None:
            self._error(m.pid, failed)

    def _error(self, pid: int | None, e: Exception) -> None:
        self.errors += 1
        self.events.on_error(pid, e)
