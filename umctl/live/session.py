"""A live session as a library object: one observed (and optionally controlled) process.

:class:`Session` runs the loop that ``umctl attach / record / run`` share: every few ms it
drains the source, merges the launch source's records, folds the batch into
:class:`~umctl.live.stats.LiveStats`, steps the controller (whose COMMAND and RESULT records join
the batch) and writes the batch to the trace if one is open. It ends on the duration, Ctrl-C,
SIGTERM (from the main thread), :meth:`Session.stop`, a child's exit or the source's target
exiting; in every case it stops the source with a final drain, lets the controller's in-flight
commands finish (undoing advice), closes the launch source and the source, and completes the
trace, so a summary and a trace survive ``kill``.

Ctrl-C and SIGTERM are a request to stop, answered at the next step: the trace then ends
cleanly with every event up to the stop, so it is complete (its ``end`` says which signal), and
the signal is noted (:func:`umctl.interrupts.note`) for the CLI to exit 130 / 143. A second
signal while the session stops is not waited on: it raises, and the trace is closed as
incomplete (``NAME.partial``, readable) with whatever was drained.

It reports through callbacks and never prints: ``on_tick(session)`` once per ``interval``
(the CLI renders a status line from ``session.stats`` / ``session.control``), ``on_warning(text)``
for what degrades without ending the session (no launch probe, a probe that stopped).
It is written against the :mod:`umctl.live.interfaces` protocols only.
"""

from __future__ import annotations

import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Callable

from ..events.schema import EventBatch
from ..results import SessionSummary
from .interfaces import Actuator, LaunchSource, Source
from .stats import LiveStats


def _first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def start_launch_probe(pid: int, warn: Callable[[str], None]) -> LaunchSource | None:
    """The BPF launch probe for ``pid``, or None (said once through ``warn``): it needs libbpf,
    root and the uprobes module, none of which may be present."""
    try:
        from ..sources.uprobes import LaunchProbe
    except Exception as e:  # noqa: BLE001 - missing module or a broken import: same outcome
        warn(f"no kernel-launch events (launch probe unavailable: {type(e).__name__}: "
             f"{str(e).splitlines()[0] if str(e) else ''}); continuing without them")
        return None
    try:
        probe = LaunchProbe(pid)
        probe.start()
        return probe
    except Exception as e:  # noqa: BLE001 - UmctlError or anything the loader raises
        warn(f"no kernel-launch events ({_first_line(e)}); continuing without them")
        return None


def merge_launches(batch: EventBatch, launches: LaunchSource | None,
                   warn: Callable[[str], None]) -> tuple[EventBatch, LaunchSource | None]:
    """``batch`` with the launch source's records added; the launch source, or None once it
    failed (a probe failure must not end a recording; it is said once)."""
    if launches is None:
        return batch, None
    try:
        lb = launches.drain()
    except Exception as e:  # noqa: BLE001
        warn(f"launch probe stopped ({e}); continuing without launch events")
        try:
            launches.close()
        except Exception:  # noqa: BLE001 - it is broken already
            pass
        return batch, None
    for kind, records in lb.arrays.items():  # launches; the runtime also reports allocations, copies
        if len(records):
            batch.add(kind, records)
    if lb.names:
        batch.names = lb.names
    if lb.runtime_ns is not None:
        batch.runtime_ns = lb.runtime_ns
    return batch, launches


class _StopOnSignal:
    """While the session runs in the main thread: the first SIGINT/SIGTERM stops it at its
    next step (a clean end: final drain, controller finish, complete trace) and is noted for
    the exit status; one more, a second or more after the first, raises
    :class:`~umctl.interrupts.Interrupted` -- the user asked twice, and the teardown must not
    hang on a stuck step. (Within that second it is a double-tapped Ctrl-C, and ignored.)"""

    #: seconds after the first signal in which another one is taken as the same request
    GRACE_S = 1.0

    def __init__(self, session: "Session") -> None:
        self.session = session
        self._old: dict[int, object] = {}
        self._first = 0.0

    def _handle(self, signum: int, frame: object) -> None:
        from ..interrupts import Interrupted, note

        note(signum)
        if self.session.signal is None:
            self.session.signal, self._first = signum, time.monotonic()
            self.session.stop("interrupted" if signum == signal.SIGINT else signal.Signals(signum).name)
        elif time.monotonic() - self._first >= self.GRACE_S:
            raise Interrupted(signum)

    def __enter__(self) -> "_StopOnSignal":
        try:
            for s in (signal.SIGINT, signal.SIGTERM):
                self._old[s] = signal.signal(s, self._handle)
        except ValueError:  # not the main thread: the caller stops it with Session.stop
            pass
        return self

    def __exit__(self, *exc: object) -> None:
        for s, h in self._old.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)


def trace_meta(src: Source, command: str, extra: dict) -> dict:
    """The trace header of a live recording: the target, its GPUs and the host."""
    from ..events.trace import collect_host_meta
    from ..driver.process import cmdline_of, comm_of
    from ..sources.uvmtools.source import kinds_label

    host = collect_host_meta()
    gpu_mem = [g.get("memory_bytes") for g in src.gpus]
    if not gpu_mem or not all(isinstance(v, int) and v > 0 for v in gpu_mem):
        smi = host.get("gpu")
        gpu_mem = [g.get("memory_bytes") for g in smi] if isinstance(smi, list) else []
    meta = {"source": f"umctl {command}", "pid": src.pid, "target_comm": comm_of(src.pid),
            "target_cmdline": cmdline_of(src.pid), "kinds": kinds_label(src.kinds),
            "uvm_gpus": src.gpus, "clock": "CLOCK_MONOTONIC", **extra}
    if gpu_mem and all(isinstance(v, int) and v > 0 for v in gpu_mem):
        meta["gpu_mem"] = gpu_mem
    return meta


@dataclass
class SessionResult:
    """How a session ended: the statistics, the source's figures (plus ``control``,
    ``elapsed_s``, ``trace``, ``trace_events``) and why it ended; :meth:`summary` is its
    typed, versioned form (what ``--json`` prints and every summary view renders)."""

    stats: LiveStats
    source: dict
    reason: str
    #: SIGINT / SIGTERM when a signal ended the session, else None
    signal: int | None = None
    #: the command that ran the session (attach, run, record; a library caller's own name)
    command: str = "attach"

    def summary(self) -> SessionSummary:
        """The session's :class:`~umctl.results.SessionSummary`: the totals (top 5 kernels
        and blocks), the source's figures, the end, and under a budget the check's verdict
        repeated at the top (``budget_held``, ``budget_check``)."""
        ctl = self.source.get("control") or {}
        checked = "budget_check" in ctl
        return SessionSummary(summary=self.stats.snapshot(5), source=self.source, end=self.reason,
                              budget_held=ctl.get("budget_held") if checked else None,
                              budget_check=ctl.get("budget_check") if checked else None,
                              command=self.command)


class Session:
    """One process observed through ``source`` (already started), optionally controlled.

    ``launches``: a launch source already started (the runtime's), else with
    ``probe_launches`` the BPF launch probe is tried. ``control``: a
    :class:`~umctl.live.spec.ControlSpec` (or anything with ``start(source, launches,
    actuator)``) and ``actuator`` the actuator to give it (default: the one the source declares).
    ``output``: a trace file written as the session runs, with ``command`` and ``meta`` in its
    header. ``child``: a started program whose exit ends the session."""

    def __init__(self, source: Source, *, command: str = "attach", launches: LaunchSource | None = None,
                 probe_launches: bool = False, control=None, actuator: Actuator | None = None,
                 output: str | None = None, meta: dict | None = None, duration: float | None = None,
                 interval: float = 1.0, child: subprocess.Popen | None = None,
                 on_tick: Callable[["Session"], None] | None = None,
                 on_warning: Callable[[str], None] | None = None, comm: str | None = None):
        self.source = source
        self.command = command
        self._launches = launches
        self._probe = probe_launches and launches is None
        self._spec = control
        self._actuator = actuator
        self.output = output
        self.meta = dict(meta or {})
        self.duration = duration
        self.interval = float(interval)
        self.child = child
        self.on_tick = on_tick
        self.warnings: list[str] = []
        self._warn_cb = on_warning
        if comm is None:
            from ..driver.process import comm_of

            comm = comm_of(source.pid)
        self.stats = LiveStats(pid=source.pid, comm=comm)
        #: the running control loop (:class:`~umctl.live.control.LiveControl`), once started
        self.control = None
        self.t0 = time.monotonic()
        self._stop_reason = ""
        self._writer = None
        self._had_launches = False
        #: the signal that stopped the session (SIGINT, SIGTERM), once one did
        self.signal: int | None = None

    # -- what callbacks read ------------------------------------------------------------------
    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def lag_p99_ms(self) -> float | None:
        """The source's event-to-drain lag, p99 (None where the source keeps no such figure)."""
        ring = getattr(self.source, "lag_ring", None)
        v = ring.percentile(99) if ring is not None else None
        return None if v is None else v / 1e6

    def stop(self, reason: str = "stopped") -> None:
        """End the session at its next step. Safe from another thread and from a signal handler
        (no lock: a handler that waited for one its own thread holds would never return)."""
        if not self._stop_reason:
            self._stop_reason = reason

    def _warn(self, text: str) -> None:
        self.warnings.append(text)
        if self._warn_cb is not None:
            self._warn_cb(text)

    # -- the loop -----------------------------------------------------------------------------
    def step(self) -> EventBatch:
        """One drain: events in, statistics, controller, trace. Returns the batch written."""
        batch, self._launches = merge_launches(self.source.drain(), self._launches, self._warn)
        self.stats.feed(batch, self.source)
        if self.control is not None:
            for k, a in self.control.step(batch).arrays.items():
                batch.add(k, a)
        if self._writer is not None and len(batch):
            self._writer.write(batch)
        return batch

    def _start(self) -> None:
        try:
            if self._probe:
                self._launches = start_launch_probe(self.source.pid, self._warn)
            if self._spec is not None:
                self.control = self._spec.start(self.source, self._launches, self._actuator)
            self._had_launches = self._launches is not None
            if self.output:
                from ..events.trace import TraceWriter

                self._writer = TraceWriter(self.output, trace_meta(self.source, self.command, self.meta))
        except BaseException:  # an error, or a second Ctrl-C while starting: undo what started
            self._abandon_start()
            raise
        self.t0 = time.monotonic()

    def _abandon_start(self) -> None:
        for undo in (self.control.finish if self.control is not None else None,
                     self._launches.close if self._launches is not None else None, self.source.close):
            if undo is None:
                continue
            try:
                undo()
            except Exception:  # noqa: BLE001 - the error that stopped the start is the one to report
                pass

    def _loop(self) -> str:
        # controlling: react within a few ms of a fault (the ring drains every 2 ms);
        # observing: a refresh every 50 ms is plenty
        period = 0.002 if self.control is not None else min(self.interval, 0.05)
        last_tick = self.t0
        try:
            while True:
                time.sleep(period)
                self.step()
                now = time.monotonic()
                if now - last_tick >= self.interval:
                    self.stats.tick()
                    last_tick = now
                    if self.on_tick is not None:
                        self.on_tick(self)
                if self._stop_reason:
                    return self._stop_reason
                if self.duration is not None and now - self.t0 >= self.duration:
                    return f"duration {self.duration:g} s reached"
                if (self.child is not None and self.child.poll() is not None) or self.source.exited():
                    return "target exited"
        except KeyboardInterrupt:
            if self.signal is not None:   # a signal after the first: forced, the trace stays .partial
                raise
            return "interrupted"

    def run(self) -> SessionResult:
        """Start (launch probe, controller, trace), loop until an end condition, then tear down
        in order; re-raises what went wrong after the trace is closed with the error noted.
        Signals are handled from the start to the end of the teardown (:class:`_StopOnSignal`)."""
        with _StopOnSignal(self):
            self._start()
            reason = ""
            error: BaseException | None = None
            try:
                reason = self._loop()
            except BaseException as e:  # noqa: BLE001 - closed below, re-raised after
                error = e
            st, error = self._finish(reason, error)
        if error is not None:
            raise error
        st["elapsed_s"] = round(self.elapsed(), 3)
        st["trace"] = self.output
        st["trace_events"] = sum(self._writer.counts.values()) if self._writer is not None else None
        return SessionResult(self.stats, st, reason, self.signal, self.command)

    def _finish(self, reason: str, error: BaseException | None) -> tuple[dict, BaseException | None]:
        src, writer = self.source, self._writer
        st: dict = {}
        try:
            st, error = self._teardown(reason, error)
        except BaseException as e:  # noqa: BLE001 - a second Ctrl-C during teardown: still close below
            error = error or e
            try:
                src.close()
            except Exception:  # noqa: BLE001
                pass
        finally:
            if writer is not None:
                # complete unless something failed or a second signal cut the teardown short
                # (the first only stopped the loop: every event up to it is in the trace)
                writer.close(error=error)
        return st, error

    def _teardown(self, reason: str, error: BaseException | None) -> tuple[dict, BaseException | None]:
        src, writer = self.source, self._writer
        src.stop()
        try:
            self.step()
        except Exception as e:  # noqa: BLE001
            error = error or e
        self.stats.tick()
        if self.control is not None:
            # stop commanding before detaching: in-flight commands finish, advice is undone
            try:
                tail = self.control.finish()
                if writer is not None and len(tail):
                    writer.write(tail)
            except Exception as e:  # noqa: BLE001
                error = error or e
        if self._launches is not None:
            try:
                self._launches.close()
            except Exception:  # noqa: BLE001
                pass
        st = src.stats()
        if self.control is not None:
            st["control"] = self.control.stats()
        src.close()
        if writer is not None:
            if src.gpus:  # the UUID table may have filled in after attach
                writer.meta["uvm_gpus"] = src.gpus
            writer.meta.update({"attach": {k: v for k, v in st.items() if k != "gpus"},
                                "duration_s": round(self.elapsed(), 3), "end": reason,
                                "launch_events": self._had_launches})
        return st, error
