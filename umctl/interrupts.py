"""SIGINT and SIGTERM for the ``umctl`` process: what they raise, what they exit with, and
the short stretches (closing a trace) that must not be cut in half.

Why a module of its own, below everything else: the CLI installs the handlers, the live
session swaps in its own while its loop runs (a signal there is a clean stop), and the trace
writer defers them while it writes a footer -- three layers that may not import each other
the other way round. It imports nothing heavy: ``umctl``'s entry point installs the handlers
before typer, rich or numpy are imported, so a Ctrl-C in the first second is already an
``umctl: interrupted`` and exit 130 rather than an import traceback.

The exit status is 128 + the signal number (130 for SIGINT, 143 for SIGTERM), as a shell
reports a process killed by that signal. The last signal received is noted, because the
command's own code may catch the exception (the live session and ``top`` end cleanly on
Ctrl-C; typer turns any KeyboardInterrupt into exit 130, SIGTERM included): the CLI reads
:func:`last_signal` when the command returns, so the exit status says what happened whatever
caught the exception on the way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Callable, Iterator, NoReturn

#: the signals umctl turns into :class:`Interrupted`
SIGNALS = (signal.SIGINT, signal.SIGTERM)

_last: int | None = None


class Interrupted(KeyboardInterrupt):
    """Raised in the main thread by the handlers :func:`install` sets, for SIGINT and SIGTERM.

    A KeyboardInterrupt, so every ``except KeyboardInterrupt`` / ``finally`` that already
    unwinds cleanly on Ctrl-C (the live session, ``top``'s screen, subprocess's wait, the
    trace writer's close) does the same on SIGTERM, with no second except clause to forget."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(describe(signum))
        self.signum = int(signum)
        self.exit_code = exit_code(self.signum)


def describe(signum: int) -> str:
    """``interrupted (SIGTERM)``: how a trace's metadata and the CLI name the signal."""
    return f"interrupted ({signal_name(signum)})"


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def exit_code(signum: int) -> int:
    """What umctl exits with after ``signum``: 128 + N, as for a process killed by it."""
    return 128 + int(signum)


def note(signum: int) -> None:
    """Remember that ``signum`` arrived (a handler that stops cleanly instead of raising calls
    this, so the CLI still exits 128 + N)."""
    global _last
    _last = int(signum)


def last_signal() -> int | None:
    """The last SIGINT/SIGTERM noted since :func:`reset`, or None."""
    return _last


def reset() -> None:
    global _last
    _last = None


def _raise(signum: int, frame: object) -> None:
    note(signum)
    raise Interrupted(signum)


def install() -> None:
    """SIGINT and SIGTERM raise :class:`Interrupted` in the main thread (the CLI's entry point
    calls this first), and nothing is noted yet. A signal the process was started with
    ignored stays ignored (``nohup``, a background job of a script: the shell's way of saying
    Ctrl-C is not for this process -- Python keeps that too). A no-op outside the main thread."""
    reset()
    if threading.current_thread() is not threading.main_thread():
        return
    for s in SIGNALS:
        if signal.getsignal(s) is not signal.SIG_IGN:
            signal.signal(s, _raise)


def install_exit() -> None:
    """For the last moments of the process (the CLI once its command returned, its output
    flushed and its traces closed): SIGINT/SIGTERM still say ``umctl: interrupted`` and exit
    128 + N, at once, with nothing left to unwind -- rather than a traceback from the
    interpreter's shutdown, or an exit status that says the interrupt never came."""
    if threading.current_thread() is not threading.main_thread():
        return

    def leave(signum: int, frame: object) -> None:
        text = "umctl: interrupted\n" if signum == signal.SIGINT else f"umctl: {describe(signum)}\n"
        try:
            os.write(2, text.encode())
        finally:
            os._exit(exit_code(signum))

    for s in SIGNALS:
        if signal.getsignal(s) is _raise:
            signal.signal(s, leave)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM for the duration of the block, then deliver the first one that
    arrived to whatever handler was in place (so it raises, stops a session or kills the
    process, as it would have). For short steps that must not stop half-way: writing a
    trace's footer and renaming it, handing a row group to the writer thread. Python runs
    signal handlers in the main thread only, so elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []

    def hold(signum: int, frame: object) -> None:
        pending.append(signum)

    old = {}
    try:
        for s in SIGNALS:
            old[s] = signal.signal(s, hold)
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        if pending:
            signal.raise_signal(pending[0])


def run_cli(load_main: Callable[[], Callable[[], int]]) -> NoReturn:
    """The ``umctl`` process around its CLI: handlers first, then the CLI's import and run
    (``load_main()`` imports it and returns its ``main``), then exit with its status.

    Here rather than in the CLI so that the console script's module and ``python3 -m
    umctl.cli.main`` can run it before importing typer, rich or numpy: a Ctrl-C during those
    imports (the first second, on a loaded machine) is then ``umctl: interrupted`` and 130,
    not an import traceback. ``umctl version`` / ``--version`` is answered without importing
    the CLI at all (it must answer within 0.3 s)."""
    install()
    try:
        if sys.argv[1:] in (["version"], ["--version"], ["-V"]):
            from . import __version__

            print(f"umctl {__version__}")
            code = 0
        else:
            code = load_main()()
    except KeyboardInterrupt as e:
        # before main() could take it (an import), or a second signal while main() reported the first
        signum = getattr(e, "signum", None) or last_signal() or signal.SIGINT
        try:
            sys.stderr.write("umctl: interrupted\n" if signum == signal.SIGINT else f"umctl: {describe(signum)}\n")
        except (KeyboardInterrupt, OSError):
            pass
        code = exit_code(signum)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (BrokenPipeError, ValueError):   # `umctl ... | head`: nothing more to say to that reader
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except KeyboardInterrupt as e:
        code = exit_code(getattr(e, "signum", signal.SIGINT))
    # From here a signal exits at once, 128 + N with its line, rather than a traceback from
    # the interpreter's shutdown -- while it may still wait on something (threads). Once only
    # the modules' teardown is left (atexit runs just before the interpreter puts the default
    # actions back; with numpy and pyarrow loaded the teardown takes a moment), signals are
    # ignored: the command is over, its status stands, and a late Ctrl-C is not a kill.
    install_exit()
    import atexit

    atexit.register(_ignore_signals)
    sys.exit(code)


def _ignore_signals() -> None:
    if threading.current_thread() is threading.main_thread():
        for s in SIGNALS:
            if signal.getsignal(s) is not signal.SIG_IGN:
                signal.signal(s, signal.SIG_IGN)
