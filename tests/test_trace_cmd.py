"""``umctl trace`` sub-app, driven through typer's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from umctl import UmctlError
from umctl.cli.trace_cmd import app
from umctl.events.schema import Cause, DTYPES, EventBatch, Kind, KIND_CODES, empty
from umctl.events.trace import TraceError, TraceWriter
from umctl.units import CPU, MiB

runner = CliRunner()


@pytest.fixture
def trace_path(tmp_path: Path) -> Path:
    b = EventBatch(names=["gemm"])
    lau = empty(Kind.LAUNCH, 2)
    lau["t_ns"], lau["t_end_ns"] = [1_000, 5_000], [2_000, 0]
    b.add(Kind.LAUNCH, lau)
    f = empty(Kind.FAULT, 5)
    f["t_ns"], f["batch_id"] = [1_100, 1_200, 1_300, 5_100, 5_200], [0, 0, 0, 1, 1]
    b.add(Kind.FAULT, f)
    m = empty(Kind.MIGRATION, 3)
    m["t_ns"], m["src"], m["dst"] = [1_500, 1_600, 5_500], [CPU, CPU, 0], [0, 0, CPU]
    m["bytes"], m["cause"] = [2 * MiB, MiB, 4 * MiB], [Cause.DEMAND, Cause.DRIVER_PREFETCH, Cause.EVICTION]
    b.add(Kind.MIGRATION, m)
    e = empty(Kind.EVICTION, 1)
    e["t_ns"], e["bytes_written"], e["critical"] = 5_400, 4 * MiB, True
    b.add(Kind.EVICTION, e)
    d = empty(Kind.DROPS, 1)
    d["kind"], d["count"] = KIND_CODES[Kind.FAULT], 12
    b.add(Kind.DROPS, d)
    path = tmp_path / "run.parquet"
    meta = {"scenario": "gpt2-xl", "mode": "oracle",
            "gpu": [{"index": 0, "name": "NVIDIA H200", "memory_bytes": 141 << 30}],
            "uvm_params": {"uvm_perf_prefetch_threshold": "51", "uvm_leak_checker": "0"}}
    with TraceWriter(path, meta) as w:
        w.write(b)
    return path


def test_info_prints_counts(trace_path: Path) -> None:
    r = runner.invoke(app, ["info", str(trace_path)])
    assert r.exit_code == 0, r.output
    for text in ("gpt2-xl", "oracle", "schema version", "fault", "launch", "migration", "5 in 2 batches",
                 "demand", "2.00 MiB", "driver_prefetch", "evictions: 1", "1 critical", "dropped", "fault 12",
                 "0: NVIDIA H200, 141.00 GiB", "perf_prefetch_threshold=51 (+1 more with --json)"):
        assert text in r.output, text


def test_info_json(trace_path: Path) -> None:
    r = runner.invoke(app, ["info", str(trace_path), "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.output)
    assert s["events"] == {"fault": 5, "migration": 3, "eviction": 1, "launch": 2, "drops": 1}
    assert s["gpu_faults"] == 5 and s["fault_batches"] == 2
    assert s["time_span_ns"] == [0, 5_500] and s["duration_ns"] == 5_500  # DROPS rows have t_ns 0
    assert s["migrated_bytes"] == {"H2D": {"demand": 2 * MiB, "driver_prefetch": MiB},
                                   "D2H": {"eviction": 4 * MiB}, "P2P": {}}
    assert s["evictions"] == {"count": 1, "bytes_written": 4 * MiB, "pages": 0, "critical": 1}
    assert s["dropped_events"] == {"fault": 12}
    assert s["meta"]["scenario"] == "gpt2-xl" and s["kernel_names"] == 1


def test_export_writes_perfetto(trace_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    r = runner.invoke(app, ["export", str(trace_path), "--perfetto", str(out), "--max-events", "1000"])
    assert r.exit_code == 0, r.output
    assert "ui.perfetto.dev" in r.output and str(out) in r.output
    assert len(r.output.strip().splitlines()) == 1
    assert json.loads(out.read_text())["traceEvents"]


def test_export_needs_an_output(trace_path: Path) -> None:
    r = runner.invoke(app, ["export", str(trace_path)])
    assert isinstance(r.exception, UmctlError) and "--perfetto" in str(r.exception)


@pytest.mark.parametrize("content", [b"", b"garbage" * 100, b"PAR1 cut short"])
def test_corrupt_file_is_one_line_error(tmp_path: Path, content: bytes) -> None:
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(content)
    for args in (["info", str(bad)], ["export", str(bad), "--perfetto", str(tmp_path / "o.json")]):
        r = runner.invoke(app, args)
        assert r.exit_code != 0
        assert isinstance(r.exception, TraceError)  # main() prints it as one line, exit 2
        msg = str(r.exception)
        assert "\n" not in msg and msg.startswith(str(bad))
        assert "Traceback" not in r.output
        assert not (tmp_path / "o.json").exists()


def test_help_has_examples() -> None:
    for cmd in ("info", "export"):
        r = runner.invoke(app, [cmd, "--help"])
        assert r.exit_code == 0 and "Example" in r.output and f"umctl trace {cmd}" in r.output
    r = runner.invoke(app, [])
    assert "info" in r.output and "export" in r.output


def test_all_kinds_are_summarised(tmp_path: Path) -> None:
    b = EventBatch()
    for k in Kind:
        b.add(k, np.zeros(2, DTYPES[k]))
    path = tmp_path / "all.parquet"
    with TraceWriter(path, {}) as w:
        w.write(b)
    r = runner.invoke(app, ["info", str(path)])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["export", str(path), "--perfetto", str(tmp_path / "all.json")])
    assert r.exit_code == 0, r.output
