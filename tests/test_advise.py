"""umctl advise and umctl capture on the command line: the recommendation, the figure, and
every bad input as one line and a non-zero exit (umctl/cli/advise_cmd.py, capture_cmd.py); the
commands of docs/guide/advise.md, run as written."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from umctl.cli.main import main  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

MLP = '''
import torch

def make_step(batch, device):
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512)).to(device)
    opt = torch.optim.Adam(model.parameters())
    def step():
        x = torch.randn(batch, 512, device=device)
        loss = (model(x) - x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model, step

def raising(batch, device):
    raise ValueError("no such dataset")

def bad_step(batch, device):
    def step():
        torch.ones(3, device=device) @ torch.ones(4, device=device)
    return step
'''


@pytest.fixture
def entry(tmp_path):
    p = tmp_path / "mlp_step.py"
    p.write_text(MLP)
    return str(p)


def _advise(capsys, *args) -> list[dict]:
    capsys.readouterr()
    assert main(["advise", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_advise_recommends_none_where_the_model_fits(entry, capsys, tmp_path):
    png = tmp_path / "advise.png"
    rows = _advise(capsys, f"{entry}:make_step", "--gpu-mem", "1GiB", "--batch", "16,2048", "--iters", "2",
                   "--png", str(png))
    assert [r["batch"] for r in rows] == [16, 2048]
    for r in rows:
        assert r["fits"] and r["oversub"] < 1 and r["recommended"] == "none"
        assert set(r["modes"]) == {"none", "deepum", "deepum-prefetch", "oracle"}
        assert r["modes"]["none"]["step_s"] > 0 and r["modes"]["none"]["pct_of_bound"] >= 100 - 1e-6
    assert rows[1]["footprint_bytes"] > rows[0]["footprint_bytes"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_advise_recommends_a_mode_when_twice_oversubscribed(capsys):
    pytest.importorskip("transformers")
    fits = _advise(capsys, "examples/torch/gpt2_step.py:make_step", "--gpu-mem", "4GiB", "--batch", "8",
                   "-m", "none", "--iters", "1")
    half = fits[0]["footprint_bytes"] // 2
    rows = _advise(capsys, "examples/torch/gpt2_step.py:make_step", "--gpu-mem", f"{half}B", "--batch", "8",
                   "--iters", "2")
    r = rows[0]
    assert not r["fits"] and 1.9 < r["oversub"] < 2.1
    assert r["recommended"] not in ("none", "oracle")   # the oracle is a bound, never the advice
    rec = r["modes"][r["recommended"]]["step_s"]
    assert rec < r["modes"]["none"]["step_s"]


def _one_line_error(capsys, args, pattern):
    capsys.readouterr()
    code = main(args)
    err = capsys.readouterr().err.strip()
    assert code != 0, args
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert re.search(pattern, err), err


@pytest.mark.parametrize("cmd", ["advise", "capture"])
def test_bad_input_is_one_line(cmd, entry, capsys, tmp_path):
    tail = ["--gpu-mem", "1GiB"] + (["-o", str(tmp_path / "x.umw")] if cmd == "capture" else [])
    b = ["--batch", "4"]
    _one_line_error(capsys, [cmd, str(tmp_path / "missing.py:make_step"), *b, *tail], "no such file")
    _one_line_error(capsys, [cmd, f"{entry}:nothing", *b, *tail], "has no function 'nothing'")
    _one_line_error(capsys, [cmd, entry, *b, *tail], "expected FILE.py:FUNCTION")
    _one_line_error(capsys, [cmd, f"{entry}:raising", *b, *tail], "raised ValueError: no such dataset")
    _one_line_error(capsys, [cmd, f"{entry}:bad_step", *b, *tail], "step 1 at batch 4 raised")
    _one_line_error(capsys, [cmd, f"{entry}:make_step", "--batch", "0", *tail], "positive integer")
    _one_line_error(capsys, [cmd, f"{entry}:make_step", "--batch", "x", *tail], "--batch")
    _one_line_error(capsys, [cmd, f"{entry}:make_step", *b, *tail[2:], "--gpu-mem", "lots"], "--gpu-mem")
    if cmd == "advise":
        _one_line_error(capsys, [cmd, f"{entry}:make_step", "--batch", "4,4", *tail], "twice")
        _one_line_error(capsys, [cmd, f"{entry}:make_step", *b, *tail, "-m", "fastest"], "unknown mode")
    else:
        _one_line_error(capsys, [cmd, f"{entry}:make_step", *b, "-o", str(tmp_path / "x.parquet")], r"\.umw")


def test_without_torch_the_commands_say_so(entry, capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torch", None)   # `import torch` raises ImportError
    _one_line_error(capsys, ["advise", f"{entry}:make_step", "--gpu-mem", "1GiB"], "PyTorch is not installed")
    _one_line_error(capsys, ["capture", f"{entry}:make_step", "-b", "2", "-o", str(tmp_path / "m.umw")],
                    "PyTorch is not installed")


def _documented_commands() -> list[str]:
    text = (ROOT / "docs" / "guide" / "advise.md").read_text()
    block = text.split("<!-- the commands below run in tests/test_advise.py -->", 1)[1]
    block = re.search(r"```bash\n(.*?)```", block, re.S).group(1)
    return [line.split(" #", 1)[0].strip() for line in block.splitlines() if line.strip().startswith("umctl ")]


def test_the_guide_runs_as_written(tmp_path, capsys, monkeypatch):
    """docs/guide/advise.md's example, command by command, in a folder holding examples/."""
    pytest.importorskip("transformers")
    cmds = _documented_commands()
    assert [c.split()[1] for c in cmds] == ["capture", "replay", "advise"]
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    for cmd in cmds:
        capsys.readouterr()
        assert main(shlex.split(cmd)[1:]) == 0, cmd
    assert (tmp_path / "gpt2.umw").is_file() and (tmp_path / "advise.png").is_file()


def test_gpu_sizes_below_2_mib_are_refused(entry, capsys, tmp_path):
    _one_line_error(capsys, ["advise", f"{entry}:make_step", "--gpu-mem", "1MiB"], "at least 2 MiB")
    _one_line_error(capsys, ["capture", f"{entry}:make_step", "-b", "2", "--gpu-mem", "1MiB", "-o",
                             str(tmp_path / "m.umw")], "at least 2 MiB")


def test_the_table_says_no_mode_faster_and_keeps_its_title_short(capsys):
    from umctl.cli.advise_cmd import advise_table

    def row(fits, rec):
        modes = {m: {"step_s": 0.01, "samples_per_s": 100.0, "pct_of_bound": 100.0} for m in ("none", "deepum")}
        return {"batch": 4, "footprint_bytes": 1 << 30, "oversub": 2.0 if not fits else 0.5, "fits": fits,
                "recommended": rec, "modes": modes}

    capsys.readouterr()
    advise_table([row(False, "none"), row(True, "none")], ["none", "deepum"], "m", 1 << 30, "h100")
    text = capsys.readouterr().out
    assert "no mode faster" in text and "(fits)" in text and "× none" not in text
    title = text.splitlines()[0]
    assert title.strip().endswith("predicted steady step time"), title
    assert "% of its lower bound" in text   # the % column's caption, under the table


def test_capture_without_a_model_labels_persistent_tensors(tmp_path, capsys):
    p = tmp_path / "nomodel.py"
    p.write_text(MLP.replace("    return model, step\n", "    return step\n", 1))
    capsys.readouterr()
    assert main(["capture", f"{p}:make_step", "-b", "2", "-o", str(tmp_path / "m.umw")]) == 0
    text = capsys.readouterr().out
    assert "persistent tensors (parameters, gradients, optimizer state)" in text
    assert "optimizer state, buffers" not in text
