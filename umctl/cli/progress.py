"""Progress of a long command (``replay``, ``sweep``): never silent for minutes.

On a terminal it is a rich bar per task (mode, sweep), shown once the command has run for
``delay`` seconds (so quick runs do not flash one); elsewhere (a pipe, a log, CI) one plain
line on stderr about every ``interval`` seconds::

    umctl: replay gpt2-xl: deepum 42% (3,507/8,350 ops), 1m10s elapsed

A phase without counts (generating a full-scale workload) is reported the same way
(``with prog.phase("generating the workload"):``). The lines come from a daemon thread, so
they keep coming while one long kernel runs in the simulator's C core or numpy builds a big
array. stdout is never written (``--json`` stays parseable).

Environment: ``UMCTL_PROGRESS_INTERVAL`` (seconds between lines, default 10),
``UMCTL_PROGRESS=1`` (a bar even for a short run, at once), ``UMCTL_PROGRESS=0`` (nothing).
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from typing import Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as _RichProgress

INTERVAL_S = 10.0   # between plain lines
DELAY_S = 2.0       # before a bar appears on a terminal


def format_elapsed(s: float) -> str:
    """45s, 1m10s, 2h03m."""
    s = int(s)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _env_float(name: str, default: float) -> float:
    try:
        v = float(os.environ.get(name, ""))
        return v if v > 0 else default
    except ValueError:
        return default


class Progress:
    """Tasks with counts (``add``, ``update``) and phases without, for one command.

    ``what`` names the command in the plain lines (``replay gpt2-xl``); ``unit`` the counted
    things (ops, points)."""

    def __init__(self, what: str, *, console: Console | None = None, unit: str = "ops", transient: bool = False,
                 interval: float | None = None, delay: float | None = None, terminal: bool | None = None):
        self.what = what
        self.unit = unit
        self.console = console or Console(stderr=True)
        env = os.environ.get("UMCTL_PROGRESS", "")
        self.enabled = env != "0"
        self.terminal = self.console.is_terminal if terminal is None else terminal
        self.interval = interval if interval is not None else _env_float("UMCTL_PROGRESS_INTERVAL", INTERVAL_S)
        self.delay = delay if delay is not None else (0.0 if env == "1" else DELAY_S)
        self._tasks: dict[str, list] = {}    # name -> [done, total, rich task id]
        self._current: str | None = None
        self._phase: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar: _RichProgress | None = None
        self._bar_shown = False
        self._t0 = time.monotonic()
        if self.enabled and self.terminal:
            self._bar = _RichProgress(TextColumn("[bold]{task.description:>10}"), BarColumn(), MofNCompleteColumn(),
                                      TextColumn(unit), TimeElapsedColumn(), console=self.console,
                                      transient=transient, auto_refresh=True)

    # ------------------------------------------------------------------ lifetime
    def __enter__(self) -> "Progress":
        self._t0 = time.monotonic()
        if self.enabled:
            if self._bar is not None and self.delay <= 0:
                self._show_bar()
            self._thread = threading.Thread(target=self._loop, name="umctl-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._bar_shown:
            self._bar.stop()
            self._bar_shown = False

    # ------------------------------------------------------------------ reporting
    def add(self, name: str, total: int) -> None:
        with self._lock:
            tid = self._bar.add_task(name, total=total) if self._bar is not None else None
            self._tasks[name] = [0, int(total), tid]

    def update(self, name: str, done: int, total: int | None = None) -> None:
        """``done`` of ``total`` (``unit``) of task ``name`` (added on first use)."""
        if name not in self._tasks:
            self.add(name, total or 0)
        with self._lock:
            t = self._tasks[name]
            t[0] = int(done)
            if total is not None:
                t[1] = int(total)
            self._current = name
            if self._bar is not None:
                self._bar.update(t[2], completed=t[0], total=t[1])

    @contextmanager
    def phase(self, label: str) -> Iterator[None]:
        """A stretch of work without counts (generation of a workload, a set-up)."""
        with self._lock:
            prev, self._phase = self._phase, label
        tid = None
        if self._bar is not None:
            tid = self._bar.add_task(label, total=None)
        try:
            yield
        finally:
            with self._lock:
                self._phase = prev
            if tid is not None:
                self._bar.remove_task(tid)

    def line(self) -> str:
        """The plain progress line for now."""
        with self._lock:
            if self._phase is not None:
                state = self._phase
            elif self._tasks:
                # the task last updated; once it is complete, the next one not yet complete
                # (a mode being set up has not reported yet)
                names = list(self._tasks)
                cur = self._current
                if cur is None or self._tasks[cur][0] >= self._tasks[cur][1] > 0:
                    cur = next((n for n in names if self._tasks[n][0] < self._tasks[n][1]), cur or names[0])
                done, total, _ = self._tasks[cur]
                pct = f"{100 * done // total}% " if total else ""
                state = f"{cur} {pct}({done:,}/{total:,} {self.unit})"
                if len(names) > 1:
                    state += f", {names.index(cur) + 1} of {len(names)}"
            else:
                state = "starting"
        return f"umctl: {self.what}: {state}, {format_elapsed(time.monotonic() - self._t0)} elapsed"

    # ------------------------------------------------------------------ the thread
    def _show_bar(self) -> None:
        if not self._bar_shown:
            self._bar_shown = True
            self._bar.start()

    def _loop(self) -> None:
        if self._bar is not None:   # a terminal: the bar, once the command has run a while
            if not self._stop.wait(self.delay):
                self._show_bar()
            return
        while not self._stop.wait(self.interval):
            self.console.file.write(self.line() + "\n")
            self.console.file.flush()


def generate(what: str, fn, *args, console: Console | None = None, **kw):
    """``fn(*args, **kw)`` (a scenario generator, a trace read) as the phase "generating the
    workload" of command ``what``: reported like any long stretch, and running out of memory
    there is one line (UmctlError), not numpy's traceback."""
    from .. import UmctlError

    with Progress(what, console=console, transient=True) as prog, prog.phase("generating the workload"):
        try:
            return fn(*args, **kw)
        except MemoryError:
            raise UmctlError(f"{what}: out of memory generating the workload; make it smaller "
                             "(--iters, --param batch=...)") from None
