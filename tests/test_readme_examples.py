"""Every ``umctl`` example in README.md is run by a test.

Each example is parsed by the real command line (every option it names exists and takes the
value it is given); the ones that need no GPU and no root (replays, sweeps, traces, scenarios)
also run for real, in a scratch folder, and must exit 0. The long ones run under the ``slow``
marker. An example added to the README without a way to run it here fails
``test_every_example_is_classified``."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"

#: examples that need a GPU, root or a program to attach to: parsed, not run
LIVE = ("attach", "top", "exporter", "record", "run")
#: examples that take many seconds (the papers' full-scale runs, sweeps): run under -m slow
SLOW = ("--param scale=full", "umctl sweep")   # sweeps: 8 s each; tests/test_deepum_replay.py sweeps too


def examples() -> list[str]:
    """The ``umctl ...`` command lines of the README: its bash blocks and the backticked
    ``umctl ...`` spans of its command table's first column (optional ``[...]`` parts given),
    comments dropped, ``sudo`` dropped."""
    text = README.read_text()
    found: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.splitlines():
            line = line.split(" #", 1)[0].strip()
            if line.startswith(("umctl ", "sudo umctl ")):
                found.append(line)
    for row in re.findall(r"^\| (.*?) \|", text, re.M):   # the first column of the command table
        for span in re.findall(r"`((?:sudo )?umctl [^`]+)`", row):
            found.append(re.sub(r"\[([^\]]*)\]", r"\1", span))   # "[--once]": optional, given
    out = []
    for cmd in found:
        cmd = cmd.removeprefix("sudo ").strip()
        if cmd not in out:
            out.append(cmd)
    return out


def _placeholders(cmd: str, tmp: Path) -> list[str]:
    """The example's arguments with the README's placeholders made concrete."""
    subs = {"PID": "4242", "FILE": str(tmp / "run.parquet"), "TARGET": "gpt2-l", "SCENARIO": "gpt2-l",
            "CMD": "true", "N": "1"}
    words = shlex.split(cmd)[1:]
    return [subs.get(w, w) for w in words]


def _is_live(words: list[str]) -> bool:
    return bool(words) and words[0] in LIVE


def test_the_readme_has_examples():
    ex = examples()
    assert len(ex) >= 15, ex
    assert any(e.startswith("umctl replay") for e in ex) and any(e.startswith("umctl run") for e in ex)


def test_every_example_is_classified():
    """Every example names a command of the real CLI."""
    from umctl.cli.main import command_tree

    tree = command_tree()
    for cmd in examples():
        words = shlex.split(cmd)[1:]
        assert words and (words[0].startswith("-") or words[0] in tree.commands), cmd


@pytest.mark.parametrize("cmd", examples())
def test_every_example_parses(cmd, tmp_path):
    """The real parser takes every option and value the example gives (nothing is run)."""
    from umctl.cli.main import command_tree

    words = _placeholders(cmd, tmp_path)
    if words[0].startswith("-"):   # a global flag such as --version
        return
    tree = command_tree()
    ctx = tree.make_context("umctl", list(words))
    sub = tree.get_command(ctx, words[0])
    assert sub is not None, cmd
    rest = words[1:]
    if hasattr(sub, "commands"):   # a group (trace): its command, then that command's options
        sub_ctx = sub.make_context(words[0], list(rest), parent=ctx)
        leaf = sub.get_command(sub_ctx, rest[0])
        assert leaf is not None, cmd
        leaf.make_context(rest[0], list(rest[1:]), parent=sub_ctx)
    else:
        sub.make_context(words[0], list(rest), parent=ctx)


def _runnable() -> list:
    out = []
    for cmd in examples():
        words = shlex.split(cmd)[1:]
        if not words or _is_live(words) or words[0].startswith("-"):
            continue
        marks = [pytest.mark.slow] if any(s in cmd for s in SLOW) else []
        out.append(pytest.param(cmd, marks=marks, id=cmd[:60]))
    return out


@pytest.fixture(scope="module")
def controlled_trace(tmp_path_factory) -> Path:
    """A trace of a controlled replay, for the examples that read one (trace control needs
    COMMAND records; deepum is replayed beside none, so --record writes one file per mode)."""
    d = tmp_path_factory.mktemp("readme-trace")
    rec = subprocess.run([sys.executable, "-m", "umctl.cli.main", "replay", "gpt2-l", "-m", "deepum", "--iters", "2",
                          "--record", str(d / "rec.parquet")], cwd=d, capture_output=True, text=True, timeout=600)
    assert rec.returncode == 0, rec.stderr[-2000:]
    return d / "rec.deepum.parquet"


@pytest.mark.parametrize("cmd", _runnable())
def test_every_offline_example_runs(cmd, tmp_path, controlled_trace):
    """The example runs to a zero exit in a scratch folder (one that reads a trace gets a
    controlled run's under the name it gives)."""
    words = _placeholders(cmd, tmp_path)
    for t in (w for w in words if w.endswith(".parquet") and "--record" not in words):
        p = Path(t) if Path(t).is_absolute() else tmp_path / t
        if not p.exists():
            shutil.copyfile(controlled_trace, p)
    p = subprocess.run([sys.executable, "-m", "umctl.cli.main", *words], cwd=tmp_path, capture_output=True,
                       text=True, timeout=1800)
    assert p.returncode == 0, f"{cmd}: rc {p.returncode}\n{p.stderr[-2000:]}"
    assert "Traceback" not in p.stderr
