"""The umctl command as a user runs it: outputs, files, and one-line errors."""

import json

import pytest

from umctl.cli.main import main


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_replay_json_has_the_documented_keys(capsys):
    code, out, err = run(capsys, "replay", "gpt2-l", "--mode", "none,oracle", "--gpu-mem", "128MiB",
                         "--iters", "2", "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert [r["mode"] for r in rows] == ["none", "oracle"]
    for r in rows:
        for k in ("mode", "time_s", "speedup", "faults", "fault_batches", "bytes_h2d", "bytes_d2h",
                  "evictions", "prefetch_accuracy", "prefetch_coverage"):
            assert k in r
    # speedups are over `none`, the first row: oracle's is none's time over its own (> 1)
    assert rows[1]["time_s"] < rows[0]["time_s"]
    assert rows[1]["speedup"] == pytest.approx(rows[0]["time_s"] / rows[1]["time_s"], rel=1e-6)
    assert rows[0]["prefetch_accuracy"] is None and 0 < rows[1]["prefetch_accuracy"] <= 1
    for r in rows:  # the faults by cause, in total and per steady iteration
        assert sum(r["fault_causes"].values()) == r["faults"]
        assert sum(r["steady_fault_causes_per_iter"].values()) == pytest.approx(r["steady_faults_per_iter"])


def test_calib_set_changes_the_replay_and_says_so(capsys):
    args = ("replay", "bert-large", "-m", "none", "--gpu-mem", "128MiB", "--iters", "3", "--json")
    code, out, err = run(capsys, *args)
    assert code == 0, err
    base = json.loads(out)[0]
    code, out, err = run(capsys, *args, "--calib-set", "fault_h2d_Bps=1e9", "--calib-set", "eviction_refresh=access")
    assert code == 0, err
    what_if = json.loads(out)[0]
    assert base["calibration"] == "h100-pcie5-r580"
    assert what_if["calibration"] == "h100-pcie5-r580+fault_h2d_Bps=1000000000.0,eviction_refresh=access"
    assert what_if["time_s"] > base["time_s"]           # a 25x slower fault path costs more


def test_replay_table_and_png(capsys, tmp_path):
    png = tmp_path / "r.png"
    code, out, err = run(capsys, "replay", "bert-large", "-m", "oracle", "--gpu-mem", "128MiB", "--iters", "2",
                         "--png", str(png))
    assert code == 0, err
    assert "none" in out and "oracle" in out and "speedup" in out
    assert "GPU faults by cause" in out and "evicted by driver" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_record_then_inspect_export_and_replay_the_trace(capsys, tmp_path):
    trace = tmp_path / "run.parquet"
    code, _, err = run(capsys, "replay", "gpt2-l", "-m", "none", "--gpu-mem", "128MiB", "--iters", "1",
                       "--record", str(trace))
    assert code == 0, err
    code, out, err = run(capsys, "trace", "info", str(trace), "--json")
    assert code == 0, err
    info = json.loads(out)
    assert info["events"]["fault"] > 0 and info["events"]["launch"] > 0
    pf = tmp_path / "run.json"
    code, out, err = run(capsys, "trace", "export", str(trace), "--perfetto", str(pf))
    assert code == 0, err
    events = json.loads(pf.read_text())["traceEvents"]
    assert any(e.get("ph") == "X" for e in events)
    code, out, err = run(capsys, "replay", str(trace), "-m", "none,oracle", "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert rows[1]["time_s"] <= rows[0]["time_s"]


@pytest.mark.parametrize("args, needle", [
    (["replay", "gpt2-xxl"], "unknown scenario"),
    (["replay", "gpt2-l", "--mode", "deepumm"], "unknown mode"),
    (["replay", "gpt2-l", "--param", "batch=lots"], "batch"),
    (["replay", "gpt2-l", "--gpu-mem", "many"], "gpu_mem"),
    (["replay", "gpt2-l", "--param", "nonsense=1"], "nonsense"),
    (["replay", "gpt2-l", "--oversub", "-1"], "oversub"),
    (["trace", "info", "/nonexistent/x.parquet"], "x.parquet"),
    (["replay", "--help-me"], "--help-me"),
    (["replay", "gpt2-l", "--calib-set", "eviction_refresh=lru"], "eviction_refresh"),
    (["replay", "gpt2-l", "--calib-set", "d2h=1"], "d2h_Bps"),
])
def test_bad_input_is_one_line_and_nonzero(capsys, args, needle):
    code, out, err = run(capsys, *args)
    assert code != 0
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert needle in err and "Traceback" not in err


def test_corrupt_trace_is_refused(capsys, tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1" + b"\0" * 100)
    code, out, err = run(capsys, "replay", str(bad))
    assert code != 0 and "bad.parquet" in err and len(err.strip().splitlines()) == 1


def test_scenarios_lists_every_family(capsys):
    code, out, err = run(capsys, "scenarios", "--json")
    assert code == 0, err
    fams = {s["family"] for s in json.loads(out)}
    assert {"dnn", "embedding", "graph", "hum", "multigpu", "multitenant"} <= fams


@pytest.mark.slow
def test_demo(capsys):
    code, out, err = run(capsys, "demo", "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert rows[0]["mode"] == "none" and all(r["speedup"] >= 1.0 for r in rows)


def test_bad_mode_option_value_is_one_line(capsys):
    from umctl.cli.main import main

    code = main(["replay", "gpt2-xl", "-m", "deepum", "-O", "deepum.num_rows=abc"])
    err = capsys.readouterr().err
    assert code != 0 and "option num_rows takes an int" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_unwritable_outputs_are_refused_before_the_replay(capsys, tmp_path):
    from umctl.cli.main import main

    for args in (["replay", "gpt2-xl", "-m", "none", "--png", str(tmp_path / "no" / "x.png")],
                 ["replay", "hum-sync", "-m", "none,hum", "--timeline", str(tmp_path / "no" / "t.png")],
                 ["sweep", "resnet152", "--png", str(tmp_path / "no" / "s.png")]):
        code = main(args)
        err = capsys.readouterr().err
        assert code != 0 and "does not exist" in err and "Traceback" not in err, args
