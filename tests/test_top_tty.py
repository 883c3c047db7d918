"""`umctl top` in a real terminal (a pseudo-terminal): it draws, takes keys without Enter,
quits on `q`, and leaves the terminal as it found it. On a machine without UVM processes (CI)
it shows the empty view, which is enough to exercise the terminal handling end to end."""

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
        time.sleep(0.5)
        os.write(master, b"q")
        p.wait(timeout=10)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0
    after = termios.tcgetattr(slave)
    assert after[3] == before[3]          # local modes (ICANON, ECHO) restored
    os.close(master)
    os.close(slave)
