"""Long commands are never silent (issue 35 §4): off a terminal, a plain progress line on
stderr about every UMCTL_PROGRESS_INTERVAL seconds; stdout (--json) untouched."""

from __future__ import annotations

import io
import json
import re
import time

from rich.console import Console

from umctl.cli.main import main
from umctl.cli.progress import Progress, format_elapsed

LINE = re.compile(r"^umctl: replay gpt2-xl: (starting|(none|oracle) \d+% \([\d,]+/[\d,]+ ops\), [12] of 2), "
                  r"\d+s elapsed$")


def test_replay_prints_plain_progress_lines(monkeypatch, capsys):
    monkeypatch.setenv("UMCTL_PROGRESS_INTERVAL", "0.01")   # many intervals even in a short, loaded run
    rc = main(["replay", "gpt2-xl", "--iters", "1", "-m", "none,oracle", "--json"])
    cap = capsys.readouterr()
    assert rc == 0
    assert [r["mode"] for r in json.loads(cap.out)] == ["none", "oracle"]   # stdout is the JSON alone
    lines = [ln for ln in cap.err.splitlines() if ln.startswith("umctl: replay gpt2-xl: ")]
    assert lines, cap.err
    progress = [ln for ln in lines if "generating" not in ln and "computing the lower bound" not in ln]   # phases
    # a line may come before any mode has reported ("starting"), but some line shows a mode
    assert progress and all(LINE.match(ln) for ln in progress), progress
    assert any("starting" not in ln for ln in progress), progress
    assert "\x1b[" not in cap.err   # no bar, no colour codes off a terminal


def test_no_line_before_the_interval(monkeypatch, capsys):
    monkeypatch.setenv("UMCTL_PROGRESS_INTERVAL", "600")
    assert main(["replay", "gpt2-xl", "--iters", "1", "-m", "none", "--json"]) == 0
    assert "umctl: replay" not in capsys.readouterr().err


def test_phase_and_counts_lines():
    buf = io.StringIO()
    con = Console(file=buf, force_terminal=False)
    with Progress("sweep resnet152 (deepum)", console=con, unit="points", interval=0.02) as prog:
        with prog.phase("generating the workload"):
            time.sleep(0.1)
        prog.add("table", 13)
        prog.update("table", 3)
        time.sleep(0.1)
    lines = buf.getvalue().splitlines()
    assert "umctl: sweep resnet152 (deepum): generating the workload, 0s elapsed" in lines
    assert "umctl: sweep resnet152 (deepum): table 23% (3/13 points), 0s elapsed" in lines


def test_disabled_and_terminal(monkeypatch):
    monkeypatch.setenv("UMCTL_PROGRESS", "0")
    buf = io.StringIO()
    with Progress("replay x", console=Console(file=buf), interval=0.01) as prog:
        prog.update("none", 1, 2)
        time.sleep(0.05)
    assert buf.getvalue() == ""
    monkeypatch.setenv("UMCTL_PROGRESS", "1")   # a terminal: the rich bar at once, no plain lines
    buf = io.StringIO()
    with Progress("replay x", console=Console(file=buf, force_terminal=True, width=100), interval=0.01) as prog:
        prog.update("none", 1, 2)
        time.sleep(0.05)
    assert "umctl: replay" not in buf.getvalue() and "1/2" in buf.getvalue()


def test_format_elapsed():
    assert [format_elapsed(s) for s in (0, 59.9, 70, 3600 + 125)] == ["0s", "59s", "1m10s", "1h02m"]
