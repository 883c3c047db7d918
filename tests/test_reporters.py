"""One reporter interface (umctl/report/base.py): every output of a result -- table, JSON, PNG,
Perfetto, Prometheus -- is a Reporter picked by name, and moving the renderers behind it kept
their output: the texts below (tests/data/reporters/*.txt) were printed by the renderers as they
were before the move, from the same inputs."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
from rich.console import Console

from umctl import UmctlError
from umctl.report.base import REPORTERS, JsonReporter, Reporter, get_reporter, reporter_names
from umctl.results import ReplayReport, ReplayResult, SessionSummary

DATA = Path(__file__).resolve().parent / "data" / "reporters"


def _replay_report() -> ReplayReport:
    """The two modes whose table the old renderer printed into replay_table.txt."""
    base = json.loads((DATA / "replay_result.json").read_text())
    none = {**base, "mode": "none", "time_s": 0.853123678, "speedup": 1.0, "faults": 280081,
            "fault_batches": 7840, "bytes_h2d": 2907656192, "bytes_d2h": 3372232704, "evictions": 1617,
            "prefetch_accuracy": None, "prefetch_coverage": None, "time_ns": 853123678, "wall_s": 0.08,
            "fault_causes": {"cold": 76150, "evicted": 203931}, "calibration": "h100-x"}
    oracle = {**base, "mode": "oracle", "time_s": 0.20608, "speedup": 4.1397, "faults": 35800, "fault_batches": 1030,
              "bytes_h2d": 1685774336, "bytes_d2h": 1610612736, "evictions": 0, "prefetch_accuracy": 0.995,
              "prefetch_coverage": 0.969, "time_ns": 206080000, "wall_s": 0.21, "calibration": "h100-x",
              "fault_causes": {"cold": 3870, "preevicted": 1830, "discarded": 1970, "late_prefetch": 28130}}
    return ReplayReport([ReplayResult.from_json(none), ReplayResult.from_json(oracle)], title="gpt2-xl: a title",
                        workload_name="gpt2-xl", calibration_from="umctl/sim/calibration.py")


def _text(subject: str, result, width: int) -> str:
    buf = io.StringIO()
    get_reporter(subject, "table").render(result, Console(file=buf, width=width))
    return buf.getvalue()


def test_every_registered_reporter_is_a_reporter_named_as_registered():
    for subject, names in REPORTERS.items():
        for name in names:
            r = get_reporter(subject, name)
            assert isinstance(r, Reporter) and r.name == name and isinstance(r.to_file, bool), (subject, name)
    assert reporter_names("replay") == ["table", "json", "png", "timeline"]
    with pytest.raises(KeyError, match="no reporter replay/html"):
        get_reporter("replay", "html")


def test_replay_table_is_the_old_table():
    assert _text("replay", _replay_report(), 160) == (DATA / "replay_table.txt").read_text()


@pytest.mark.parametrize("name", ["session_budget", "session_observe"])
def test_session_summary_text_is_the_old_summary(name):
    """The summary of a budgeted session (control, actuator, errors, budget, budget NOT held)
    and of an observing one, each line wrapped or not as before."""
    s = SessionSummary.from_json(json.loads((DATA / f"{name}.json").read_text()))
    assert _text("session", s, 120) == (DATA / f"{name}.txt").read_text()


def test_json_reporter_writes_the_documents_to_a_stream_or_a_console():
    report = _replay_report()
    stream = io.StringIO()
    get_reporter("replay", "json").render(report, stream)
    assert stream.getvalue() == json.dumps(report.to_json(), indent=2) + "\n"
    buf = io.StringIO()
    get_reporter("replay", "json").render(report, Console(file=buf))   # a console: its file, no markup
    assert buf.getvalue() == stream.getvalue()
    s = SessionSummary.from_json(json.loads((DATA / "session_observe.json").read_text()))
    one = io.StringIO()
    get_reporter("session", "json").render(s, one)
    assert one.getvalue() == json.dumps(s.to_json(), indent=1, default=str) + "\n"   # attach --json's indent
    assert JsonReporter().indent == 2


def test_replay_cli_renders_through_the_reporters(capsys, monkeypatch):
    """`umctl replay` calls one reporter per output: the table (or --json) and each file."""
    from umctl.cli.main import main
    from umctl.report import base

    calls = []
    real = base.get_reporter

    def spy(subject, name, **kw):
        calls.append((subject, name))
        return real(subject, name, **kw)

    monkeypatch.setattr(base, "get_reporter", spy)
    assert main(["replay", "gpt2-l", "-m", "none", "--gpu-mem", "128MiB", "--iters", "1", "--json"]) == 0
    docs = json.loads(capsys.readouterr().out)
    assert calls == [("replay", "json")] and docs[0]["schema"] == "umctl.replay-result/1"


def test_png_reporters_need_the_simulators_results(tmp_path):
    from umctl.sim.replay import replay_results, result_rows, run_modes
    from umctl.workload.target import resolve_target

    sims = run_modes(resolve_target("gpt2-l", {"gpu_mem": "128MiB", "iterations": "1"}), ["none", "oracle"])
    report = ReplayReport(replay_results(result_rows(sims), "c"), title="t", workload_name="gpt2-l", sims=sims)
    png = tmp_path / "r.png"
    assert get_reporter("replay", "png").to_file
    get_reporter("replay", "png").render(report, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(UmctlError, match="read back from JSON"):
        get_reporter("replay", "png").render(ReplayReport.from_json(report.to_json()), tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_perfetto_reporter_is_the_export(tmp_path):
    from umctl.report.perfetto import export_perfetto

    from test_perfetto import make, small_arrays   # a small trace of the kinds the export draws

    with make(tmp_path / "t.parquet", small_arrays()) as t:
        summary = get_reporter("trace", "perfetto", max_events=5).render(t, tmp_path / "a.json")
        direct = export_perfetto(t, tmp_path / "b.json", max_events=5)
    a = json.loads((tmp_path / "a.json").read_text())
    b = json.loads((tmp_path / "b.json").read_text())
    assert a["traceEvents"] == b["traceEvents"] and summary["events"] == direct["events"] > 0
    assert summary["max_events"] == 5 and summary["aggregated"]


def test_prometheus_reporter_is_what_metrics_serves():
    from prometheus_client import CollectorRegistry, generate_latest

    from umctl.exporter.metrics import ExporterCollector, ExporterState, ProcessTotals

    state = ExporterState(sample=1.0, kinds="default", version="t")
    state.processes[42] = t = ProcessTotals(pid=42, comm="train")
    t.faults[0] = 7.0
    t.bytes[("h2d", "fault")] = 4096.0
    out = io.StringIO()
    get_reporter("exporter", "prometheus").render(state, out)
    reg = CollectorRegistry()
    reg.register(ExporterCollector(state, clock=lambda: 0.0))
    state.updated = 0.0
    text = out.getvalue()
    assert 'umctl_gpu_faults_total{comm="train",gpu="0",pid="42",uuid=""} 7.0' in text
    assert 'umctl_migrated_bytes_total{cause="fault",comm="train",direction="h2d",pid="42"} 4096.0' in text
    assert text == generate_latest(reg).decode()


def test_trace_info_and_control_reporters(tmp_path, capsys):
    """The trace commands print through their reporters: info's table and JSON, control's."""
    from umctl.cli.main import main

    trace = tmp_path / "r.parquet"
    assert main(["replay", "gpt2-l", "-m", "deepum", "--gpu-mem", "128MiB", "--iters", "2", "--record", str(trace)]) == 0
    capsys.readouterr()
    deepum = tmp_path / "r.deepum.parquet"
    assert main(["trace", "info", str(deepum)]) == 0
    out = capsys.readouterr().out
    assert "GPU faults:" in out and "bytes migrated" in out
    assert main(["trace", "control", str(deepum), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["fault_blocks"] > 0 and sum(rep["classes"].values()) == rep["fault_blocks"]
    assert main(["trace", "control", str(deepum), "--skip", "0.001"]) == 0
    out = capsys.readouterr().out
    assert "after the first 0.001 s" in out and "faulted blocks" in out


def test_live_totals_are_the_running_statistics():
    """LiveStats.snapshot(): what every view of a process's totals reads equals the running
    statistics' own figures, scaled the same way when sampled."""
    sys.path.insert(0, str(DATA))
    try:
        from session_fakes import budgeted_session
    finally:
        sys.path.remove(str(DATA))
    stats = budgeted_session(None).stats
    snap = stats.snapshot(5)
    assert (snap.faults, snap.batches, snap.launches, snap.h2d_total, snap.d2h_total) == (
        stats.faults, stats.batches, stats.launches, stats.h2d_total(), stats.d2h_total())
    assert snap.top_kernels == stats.top_kernels(5) and snap.top_blocks[0][0].startswith("0x")
    stats.sample = 0.25
    sampled = stats.snapshot()
    assert sampled.faults == 4 * snap.faults and sampled.counter("bytes_htd") == stats.counter("bytes_htd")
    from umctl.report.live import estimate_mark, sampled_tag
    assert estimate_mark(sampled) == "~" and "25%" in sampled_tag(sampled) and sampled_tag(snap) == ""
