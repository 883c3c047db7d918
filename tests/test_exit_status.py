"""The exit status is the truth (issues 34 and 35): every command's status reaches the shell,
``umctl run`` exits with its program's status (128 + N when signal N killed it, said in one
line), Ctrl-C is 130 and SIGTERM 143 with ``umctl: interrupted``, and ``umctl version`` /
``--version`` / ``-h`` work without loading what no command there needs.

``umctl run`` is run for real. Without a GPU driver the program never opens /dev/nvidia-uvm, so
the plain CLI covers the paths before CUDA use; the observed path (the session, its summary,
the wait for the program) runs with the tools-API source replaced by :class:`ChildSource`, a
source of made-up faults on the real child, inside a real ``umctl`` process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from umctl.cli.live_cmd import program_exit_status
from umctl.cli.main import main
from umctl.events.schema import EventBatch, Kind, empty

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
ENV = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
ENV.pop("UMCTL_DEBUG", None)


class ChildSource:
    """A stand-in for the tools-API source on a program umctl started: one made-up fault a
    drain, so a trace has events; the session ends on the child's exit (Session.child)."""

    actuator = "none"

    def __init__(self, pid: int):
        self.pid = pid
        self.gpus = [{"gpu": 0, "memory_bytes": 1 << 30}]
        self.kinds = frozenset({Kind.FAULT})
        self._n = 0

    def drain(self) -> EventBatch:
        self._n += 1
        b = EventBatch(now_ns=time.monotonic_ns())
        f = empty(Kind.FAULT, 1)
        f["t_ns"], f["gpu"], f["addr"] = time.monotonic_ns(), 0, np.uint64(0x7F00_0000_0000 + (self._n << 21))
        b.add(Kind.FAULT, f)
        return b

    def counters(self) -> dict[str, int]:
        return {}

    def sample_fraction(self) -> float:
        return 1.0

    def exited(self) -> bool:
        return False

    def stats(self) -> dict:
        return {"attach_ms": 0.0, "kinds": "faults", "ring_entries": 1024, "ring_max_fill": 0.0, "flush_ms": 0}

    def stop(self) -> None:
        pass

    def close(self) -> None:
        pass


#: `umctl ARGS` in a process of its own whose tools-API source is a ChildSource
OBSERVED = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
from test_exit_status import ChildSource
from umctl.cli import live_cmd
live_cmd.attach_child = lambda child, *a: ChildSource(child.pid)
sys.argv = ["umctl", *sys.argv[1:]]
from umctl.cli.entry import entry
entry()
"""


def umctl(*args: str, observed: bool = False, **kw) -> subprocess.Popen:
    cmd = [sys.executable, "-c", OBSERVED, *args] if observed else [sys.executable, "-m", "umctl.cli.entry", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                            cwd=kw.pop("cwd", None), **kw)


def finish(p: subprocess.Popen, timeout: float = 60) -> tuple[int, str, str]:
    out, err = p.communicate(timeout=timeout)
    return p.returncode, out, err


def lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.strip()]


# -- the mapping ------------------------------------------------------------------------------

@pytest.mark.parametrize("returncode, code, line", [
    (0, 0, None),
    (3, 3, "program exited with status 3"),
    (255, 255, "program exited with status 255"),
    (-9, 137, "program killed by signal 9 (SIGKILL)"),
    (-15, 143, "program killed by signal 15 (SIGTERM)"),
    (-2, 130, "program killed by signal 2 (SIGINT)"),
    (-64, 192, "program killed by signal 64 (SIGRTMAX)"),
])
def test_program_status_becomes_the_exit_status(returncode, code, line):
    """Popen's -N for a signal would reach the shell as 256 - N (247 for SIGKILL): 128 + N is
    what a shell reports for a program killed by N."""
    assert program_exit_status(returncode) == (code, line)


# -- umctl run: the program's status ----------------------------------------------------------

@pytest.mark.parametrize("script, code, line", [
    ("import time; time.sleep(0.3)", 0, None),
    ("import time; time.sleep(0.3); raise SystemExit(3)", 3, "umctl: program exited with status 3"),
    ("import os, time; time.sleep(0.3); os.kill(os.getpid(), 9)", 137, "umctl: program killed by signal 9 (SIGKILL)"),
])
def test_run_exits_with_the_observed_programs_status(tmp_path, script, code, line):
    """The observed path: session, summary, trace, then the program's status."""
    trace = tmp_path / "t.parquet"
    rc, out, err = finish(umctl("run", "-q", "--no-launches", "-o", str(trace), "--", sys.executable, "-c", script,
                                observed=True))
    assert rc == code, err
    assert "Traceback" not in err
    assert "umctl run: pid" in out and "detached (target exited)" in out
    umctl_lines = [ln for ln in lines(err) if ln.startswith("umctl:")]
    assert umctl_lines == ([line] if line else []), err
    assert trace.exists() and not Path(f"{trace}.partial").exists()   # the program's end is a clean finish


@pytest.mark.parametrize("command, code, line", [
    ("exit 0", 0, None),
    ("exit 3", 3, "umctl: program exited with status 3"),
    ("kill -9 $$", 137, "umctl: program killed by signal 9 (SIGKILL)"),
])
def test_run_exits_with_the_status_of_a_program_that_never_used_cuda(command, code, line):
    """No GPU here: the program exits before it opens /dev/nvidia-uvm, and its status is
    still umctl's (it was 7, TargetExited, or 4 when it exited while umctl waited)."""
    rc, out, err = finish(umctl("run", "--runtime", "--", "sh", "-c", command))
    assert rc == code, err
    assert lines(err) == ([line] if line else []), err


def test_run_with_a_trace_says_nothing_was_recorded(tmp_path):
    rc, _, err = finish(umctl("run", "-o", str(tmp_path / "t.parquet"), "--", "sh", "-c", "exit 5"))
    assert rc == 5
    assert lines(err) == ["umctl: program exited with status 5 before umctl saw it use CUDA Unified Memory; "
                          "nothing recorded"]
    # exit 0 but no trace: what was asked for was not done, which is umctl's error (one line)
    rc, _, err = finish(umctl("run", "-o", str(tmp_path / "t.parquet"), "--", "true"))
    assert rc == 4 and len(lines(err)) == 1 and lines(err)[0].startswith("umctl: error: ") and "nothing recorded" in err
    assert list(tmp_path.iterdir()) == []


def test_main_returns_the_status_a_command_exits_with(capsys):
    """main() ran typer with standalone_mode=False and returned 0, dropping the status typer
    *returns* for typer.Exit there: `umctl run` of a failing program exited 0."""
    assert main(["run", "--runtime", "--", "sh", "-c", "exit 3"]) == 3
    assert main(["run", "--runtime", "--", "sh", "-c", "kill -9 $$"]) == 137
    assert "umctl: program killed by signal 9 (SIGKILL)" in capsys.readouterr().err


# -- interrupts ---------------------------------------------------------------------------------

def _wait_for_child(p: subprocess.Popen, timeout: float = 30) -> int:
    """The pid of the program umctl started (its only child), once it runs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            kids = Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split()
        except OSError:
            kids = []
        if kids:
            return int(kids[0])
        assert p.poll() is None, p.communicate()
        time.sleep(0.02)
    raise AssertionError("umctl started no program")


def _gone(pid: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.02)
    return False


@pytest.mark.parametrize("sig, code, line", [(signal.SIGINT, 130, "umctl: interrupted"),
                                             (signal.SIGTERM, 143, "umctl: interrupted (SIGTERM)")])
def test_interrupted_run_waiting_for_cuda(sig, code, line):
    """umctl alone is signalled while it waits for the program's first CUDA use: it stops the
    program and exits 128 + N, one line, no traceback."""
    p = umctl("run", "--runtime", "--", "sleep", "30")
    kid = _wait_for_child(p)
    time.sleep(0.3)
    p.send_signal(sig)
    rc, _, err = finish(p)
    assert rc == code and lines(err) == [line], err
    assert _gone(kid)


@pytest.mark.parametrize("sig, code, line", [(signal.SIGINT, 130, "umctl: interrupted"),
                                             (signal.SIGTERM, 143, "umctl: interrupted (SIGTERM)")])
def test_interrupted_observed_run_keeps_a_complete_trace(tmp_path, sig, code, line):
    """Ctrl-C from a terminal (the whole process group) or SIGTERM to umctl alone while it
    observes: the session stops cleanly, so the trace is complete under its final name (its
    `end` names the signal); SIGTERM is passed on to the program; the status is 130 / 143
    whatever the program's, and stderr says so once."""
    trace = tmp_path / "t.parquet"
    p = umctl("run", "-q", "--no-launches", "-o", str(trace), "--", "sleep", "30", observed=True,
              start_new_session=True)
    kid = _wait_for_child(p)
    time.sleep(1.0)   # the session is running
    if sig == signal.SIGINT:
        os.killpg(p.pid, sig)   # what a terminal's Ctrl-C does
    else:
        p.send_signal(sig)
    rc, out, err = finish(p)
    assert rc == code, err
    assert "Traceback" not in err and line in lines(err)
    assert f"umctl: program killed by signal {int(sig)} ({sig.name})" in lines(err)
    assert _gone(kid)
    assert trace.exists() and not Path(f"{trace}.partial").exists()
    assert main(["trace", "info", str(trace), "--json"]) == 0


# -- startup: version and help ------------------------------------------------------------------

HEAVY = ("numpy", "pyarrow", "matplotlib")


@pytest.mark.parametrize("entry", ["umctl.cli.entry", "umctl.cli.main"])
@pytest.mark.parametrize("args", [["version"], ["--version"], ["-V"]])
def test_version_loads_no_heavy_module(entry, args):
    """`umctl version` is answered before the CLI is imported (issue 35: <= 0.3 s, and numpy,
    pyarrow and matplotlib alone take longer than that on a loaded machine)."""
    code = (f"import runpy, sys; sys.argv = ['umctl', *{args!r}]\n"
            f"try:\n    runpy.run_module({entry!r}, run_name='__main__', alter_sys=True)\n"
            "except SystemExit as e:\n    assert e.code == 0, e.code\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["umctl 0.1.0", "[]"], p.stdout


def test_version_and_help_options(capsys):
    from umctl import __version__

    for args in (["--version"], ["-V"], ["version"]):
        assert main(args) == 0
        assert capsys.readouterr().out.strip() == f"umctl {__version__}"
    for args in (["-h"], ["--help"], ["replay", "-h"], ["trace", "info", "-h"], ["run", "-h"]):
        assert main(args) == 0, args
        out = capsys.readouterr().out
        assert "Usage: umctl" in out, args
    assert main(["-h"]) == 0 and "--version" in capsys.readouterr().out


def test_a_usage_error_points_at_the_full_command_path(capsys):
    """`umctl trace info a b` pointed at `umctl info --help`, which does not exist."""
    assert main(["trace", "info", "a", "b"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("umctl: error: ") and err.endswith("(see umctl trace info --help)")
    assert main(["bogus"]) == 2
    assert capsys.readouterr().err.strip().endswith("(see umctl --help)")
    assert main(["replay", "--bogus"]) == 2
    assert capsys.readouterr().err.strip().endswith("(see umctl replay --help)")

