"""`umctl top` in a real terminal (a pseudo-terminal): it draws, takes keys without Enter
(a sort key, and m, which attaches everything again with migration events toggled), quits on
`q`, and leaves the terminal as it found it. On a machine without UVM processes (CI) it shows
the empty view, which is enough to exercise the terminal handling end to end; the view over a
fleet with processes in it is checked with stand-in sources (test_fleet.py's)."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import termios
import time


def _read_until(fd: int, needle: bytes, timeout: float) -> bytes:
    buf = b""
    end = time.monotonic() + timeout
    while time.monotonic() < end and needle not in buf:
        r, _, _ = select.select([fd], [], [], 0.1)
        if r:
            try:
                buf += os.read(fd, 65536)
            except OSError:
                break
    return buf


def test_top_interactive_keys_and_terminal_restored():
    master, slave = pty.openpty()
    before = termios.tcgetattr(slave)
    env = dict(os.environ, COLUMNS="120", LINES="30", TERM="xterm")
    p = subprocess.Popen([sys.executable, "-m", "umctl.cli.main", "top", "--interval", "0.2"],
                         stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    try:
        first = _read_until(master, b"nvidia-uvm", 30)
        assert b"no process has /dev/nvidia-uvm open" in first, first[-500:]
        os.write(master, b"b")            # a sort key, no Enter: cbreak mode
        assert b"sort: batches" in _read_until(master, b"sort: batches", 10)
        os.write(master, b"m")            # migrations on: a new fleet, the view goes on
        _read_until(master, b"\0", 0.5)   # (read what it draws: a full pty would block it)
        os.write(master, b"q")
        end = time.monotonic() + 10
        while p.poll() is None and time.monotonic() < end:
            _read_until(master, b"\0", 0.1)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0
    after = termios.tcgetattr(slave)
    assert after[3] == before[3]          # local modes (ICANON, ECHO) restored
    os.close(master)
    os.close(slave)


def test_top_once_over_a_fleet_shows_a_row_per_process_and_why_one_is_not_attached(tmp_path, capsys):
    from umctl.driver.process import NoUvm
    from umctl.live.fleet import Fleet
    from umctl.tui.top import TopView, run_top

    from test_fleet import StandIn, spawn

    spawn(tmp_path, 4242)
    spawn(tmp_path, 4343)
    opened: list[StandIn] = []

    def open_source(pid: int) -> StandIn:
        if pid == 4343:
            raise NoUvm("process 4343 has /dev/nvidia-uvm open but the driver accepted no event tracker")
        opened.append(StandIn(pid))
        opened[-1].queued = [50]           # 50 faults at address 0
        return opened[-1]

    asked: list[bool] = []

    def open_fleet(view: TopView, migrations: bool) -> Fleet:
        asked.append(migrations)
        return Fleet(open_source, view, proc_root=str(tmp_path / "proc"))

    from rich.console import Console

    run_top(open_fleet, migrations=True, once=True, interval=0.01, sort="faults", console=Console(), warn=print)
    out = capsys.readouterr().out.splitlines()
    assert asked == [True] and out[0] == "umctl top — 2 process(es) using UVM — sort: faults"
    rows = {ln.split()[0]: ln for ln in out[2:4]}
    assert rows["4343"].rstrip().endswith("process 4343 has /dev/nvidia-uvm open but the driver accepte")  # 60 chars
    assert rows["4242"].split()[1] == "python3"
    assert out[4] == "pid 4242: top kernels by faults: (no launch events)   top 2 MiB blocks: 0x0 50"
    assert opened[0].closed                # detached on the way out
