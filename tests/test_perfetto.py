"""Perfetto export: tracks, event counts, durations, overlap handling and aggregation."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest

from umctl import UmctlError
from umctl.events.schema import AllocOp, Cause, CopyKind, EventBatch, Kind, Op, Status, empty
from umctl.events.trace import Trace, TraceWriter, read_trace
from umctl.report.perfetto import export_perfetto
from umctl.units import CPU, MiB

T0 = 1_000_000_000  # absolute start; the export is relative to the first event


def make(path: Path, arrays: dict[Kind, np.ndarray], names: list[str] = ("gemm", "relu")) -> Trace:
    b = EventBatch(names=list(names))
    for k, a in arrays.items():
        b.add(k, a)
    with TraceWriter(path, {"scenario": "p"}) as w:
        w.write(b)
    return read_trace(path)


def small_arrays(with_replay: bool = True) -> dict[Kind, np.ndarray]:
    lau = empty(Kind.LAUNCH, 3)
    lau["t_ns"] = T0 + np.array([0, 10_000, 20_000])
    lau["t_end_ns"] = [T0 + 5_000, 0, T0 + 21_234]  # the second has no recorded end
    lau["name_id"], lau["pid"], lau["grid"], lau["block"] = [0, 1, 9], 7, (8, 1, 1), (128, 1, 1)
    lau["func"], lau["exec_hash"] = 0xABC, 2**64 - 1
    f = empty(Kind.FAULT, 6)
    f["t_ns"] = T0 + np.array([100, 200, 300, 12_000, 12_100, 2_500_000])
    f["batch_id"], f["pid"] = [0, 0, 0, 1, 1, 2], 7
    rep = empty(Kind.REPLAY, 3)
    rep["t_start_ns"] = T0 + np.array([100, 12_000, 2_500_000])
    rep["t_ns"] = T0 + np.array([1_100, 13_000, 2_501_000])
    rep["batch_id"], rep["nfaults"] = [0, 1, 2], [3, 2, 1]
    mig = empty(Kind.MIGRATION, 4)
    mig["t_ns"] = T0 + np.array([1_000, 3_000, 6_000, 7_000])
    mig["t_end_ns"] = mig["t_ns"] + 500
    mig["src"], mig["dst"] = [CPU, CPU, 0, 0], [0, 0, CPU, 1]
    mig["bytes"], mig["cause"], mig["pid"] = 65536, [Cause.DEMAND, Cause.DRIVER_PREFETCH, Cause.EVICTION, Cause.USER], 7
    mig["addr"] = 0x7F00_0000_0000
    cp = empty(Kind.COPY, 1)
    cp["t_ns"], cp["t_end_ns"], cp["kind"], cp["bytes"], cp["pid"] = T0 + 30_000, T0 + 31_000, CopyKind.D2H, 4096, 7
    ev = empty(Kind.EVICTION, 2)
    ev["t_ns"], ev["pid"], ev["bytes_written"], ev["critical"] = T0 + np.array([6_000, 7_000]), 7, 2 * MiB, [False, True]
    cmd = empty(Kind.COMMAND, 2)
    cmd["t_ns"], cmd["cmd_id"], cmd["op"], cmd["pid"] = T0 + np.array([50, 60]), [1, 2], [Op.PREFETCH, Op.PREEVICT], 9
    res = empty(Kind.RESULT, 1)
    res["cmd_id"], res["status"], res["latency_ns"] = 2, Status.SKIPPED, 77
    al = empty(Kind.ALLOC, 1)  # not drawn: allocations have no timeline meaning here
    al["op"] = AllocOp.ALLOC
    out = {Kind.LAUNCH: lau, Kind.FAULT: f, Kind.MIGRATION: mig, Kind.COPY: cp, Kind.EVICTION: ev,
           Kind.COMMAND: cmd, Kind.RESULT: res, Kind.ALLOC: al}
    if with_replay:
        out[Kind.REPLAY] = rep
    return out


def load(path: Path) -> tuple[list[dict], dict[tuple[int, int], str], dict]:
    doc = json.loads(path.read_text())
    assert doc["displayTimeUnit"] == "ns"
    events = doc["traceEvents"]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    return [e for e in events if e["ph"] != "M"], threads, doc


def on(events: list[dict], threads: dict, name: str) -> list[dict]:
    return [e for e in events if e["ph"] in "Xi" and threads.get((e["pid"], e["tid"])) == name]


def test_small_trace_tracks_and_events(tmp_path: Path) -> None:
    t = make(tmp_path / "t.parquet", small_arrays())
    out = tmp_path / "t.json"
    s = export_perfetto(t, out)
    events, threads, doc = load(out)
    assert not (tmp_path / "t.json.partial").exists()
    assert set(threads.values()) == {"GPU 0 kernels", "GPU 0 faults", "GPU 0 H2D", "GPU 0 D2H", "GPU 0 P2P",
                                     "GPU 0 evictions", "umctl commands"}
    procs = {e["pid"]: e["args"]["name"] for e in json.loads(out.read_text())["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert procs == {7: "pid 7", 9: "pid 9"}
    assert doc["metadata"]["t0_ns"] == T0 and doc["metadata"]["scenario"] == "p"

    k = on(events, threads, "GPU 0 kernels")
    assert [(e["ph"], e["name"]) for e in k] == [("X", "gemm"), ("i", "relu"), ("X", "func 0xabc")]
    assert k[0]["ts"] == 0.0 and k[0]["dur"] == 5.0 and k[2]["dur"] == 1.234 and k[1]["ts"] == 10.0
    assert k[0]["args"] == {"grid": [8, 1, 1], "block": [128, 1, 1], "exec_hash": "0xffffffffffffffff", "seq": 0}

    fb = on(events, threads, "GPU 0 faults")
    assert [(e["ts"], e["dur"], e["args"]["nfaults"]) for e in fb] == [(0.1, 1.0, 3), (12.0, 1.0, 2), (2500.0, 1.0, 1)]
    h2d = on(events, threads, "GPU 0 H2D")
    assert [e["name"] for e in h2d] == ["demand", "driver_prefetch"]
    assert h2d[0]["args"]["bytes"] == 65536 and h2d[0]["args"]["addr"] == "0x00007f0000000000"
    assert h2d[0]["dur"] == 0.5
    d2h = on(events, threads, "GPU 0 D2H")
    assert sorted(e["name"] for e in d2h) == ["eviction", "memcpy D2H"]
    assert [e["name"] for e in on(events, threads, "GPU 0 P2P")] == ["user"]
    ev = on(events, threads, "GPU 0 evictions")
    assert [(e["ph"], e["name"]) for e in ev] == [("i", "evict"), ("i", "evict (critical)")]
    cmds = on(events, threads, "umctl commands")
    assert [(e["name"], e["args"]["status"]) for e in cmds] == [("prefetch", "none"), ("preevict", "skipped")]
    assert cmds[1]["args"]["latency_ns"] == 77

    counters = [e for e in events if e["ph"] == "C"]
    assert [(e["ts"], e["args"]["faults"]) for e in counters] == [(0.0, 5.0), (1000.0, 0.0), (2000.0, 1.0), (3000.0, 0.0)]
    assert s["aggregated"] is False and s["clipped_overlaps"] == 0
    assert s["categories"]["fault_batch"] == {"source": 3, "written": 3, "aggregated": False, "group": 1}
    assert s["events"] == len(events)


def test_fault_batches_without_replay_come_from_faults(tmp_path: Path) -> None:
    t = make(tmp_path / "f.parquet", small_arrays(with_replay=False))
    events, threads, _ = load(Path(export_perfetto(t, tmp_path / "f.json")["path"]))
    fb = on(events, threads, "GPU 0 faults")
    assert [(e["ph"], e["ts"], e["args"]["nfaults"]) for e in fb] == [("X", 0.1, 3), ("X", 12.0, 2), ("i", 2500.0, 1)]
    assert fb[0]["dur"] == 0.2


def test_overlaps_are_cut_and_streams_get_tracks(tmp_path: Path) -> None:
    mig = empty(Kind.MIGRATION, 3)
    mig["t_ns"], mig["t_end_ns"] = [0, 100, 150], [200, 300, 160]
    mig["src"], mig["dst"], mig["bytes"] = CPU, 0, 1
    lau = empty(Kind.LAUNCH, 2)
    lau["t_ns"], lau["t_end_ns"], lau["stream"] = [0, 10], [100, 50], [1, 2]
    t = make(tmp_path / "o.parquet", {Kind.MIGRATION: mig, Kind.LAUNCH: lau})
    s = export_perfetto(t, tmp_path / "o.json")
    events, threads, _ = load(tmp_path / "o.json")
    assert {"GPU 0 kernels (stream 0x1)", "GPU 0 kernels (stream 0x2)"} <= set(threads.values())
    h2d = on(events, threads, "GPU 0 H2D")
    assert [(e["ts"], e.get("dur")) for e in h2d] == [(0.0, 0.1), (0.1, 0.05), (0.15, 0.01)]
    assert h2d[0]["args"]["dur_ns"] == 200 and "dur_ns" not in h2d[2]["args"]
    assert s["clipped_overlaps"] == 2
    by_track = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            by_track[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_track.values():
        spans.sort()
        assert all(a[1] <= b[0] + 1e-9 for a, b in zip(spans, spans[1:]))


def test_aggregation_under_small_budget(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    n = 5000
    mig = empty(Kind.MIGRATION, n)
    mig["t_ns"] = np.sort(rng.integers(0, 10**9, n))
    mig["t_end_ns"] = mig["t_ns"] + 10
    mig["src"], mig["dst"] = CPU, 0
    mig["cause"] = rng.integers(0, 2, n)
    mig["bytes"] = rng.integers(1, 1 << 20, n)
    f = empty(Kind.FAULT, n)
    f["t_ns"], f["batch_id"] = np.sort(rng.integers(0, 10**9, n)), np.arange(n) // 4
    lau = empty(Kind.LAUNCH, 10)
    lau["t_ns"] = np.arange(10) * 10**8
    t = make(tmp_path / "a.parquet", {Kind.MIGRATION: mig, Kind.FAULT: f, Kind.LAUNCH: lau})
    full = export_perfetto(t, tmp_path / "full.json")
    assert full["aggregated"] is False and full["events"] > 2000
    s = export_perfetto(t, tmp_path / "a.json", max_events=300)
    events, threads, _ = load(tmp_path / "a.json")
    assert s["aggregated"] is True and s["events"] == len(events) <= 300
    cats = s["categories"]
    assert cats["kernel"] == {"source": 10, "written": 10, "aggregated": False, "group": 1}
    assert cats["migration"]["aggregated"] and cats["migration"]["written"] < n
    assert cats["fault_rate"]["aggregated"] and cats["fault_rate"]["bin_ms"] > 1
    # each cause on its own track once merged, so merged runs of different causes do not overlap
    assert {n for n in threads.values() if n.startswith("GPU 0 H2D")} == {"GPU 0 H2D (demand)",
                                                                         "GPU 0 H2D (driver_prefetch)"}
    mig_ev = on(events, threads, "GPU 0 H2D (demand)") + on(events, threads, "GPU 0 H2D (driver_prefetch)")
    assert s["clipped_overlaps"] == 0
    # merging keeps totals: bytes and counts add up, names stay per cause
    assert sum(e["args"]["bytes"] for e in mig_ev) == int(mig["bytes"].sum())
    assert sum(e["args"].get("merged", 1) for e in mig_ev) == n
    per_cause = Counter()
    for e in mig_ev:
        per_cause[e["name"]] += e["args"].get("merged", 1)
    assert per_cause == {Cause(c).name.lower(): int((mig["cause"] == c).sum()) for c in (0, 1)}
    assert "addr" not in next(e for e in mig_ev if e["args"].get("merged", 1) > 1)["args"]
    fb = on(events, threads, "GPU 0 faults")
    assert sum(e["args"]["nfaults"] for e in fb) == n


def test_empty_trace_and_unwritable_output(tmp_path: Path) -> None:
    t = make(tmp_path / "e.parquet", {})
    s = export_perfetto(t, tmp_path / "e.json")
    events, threads, _ = load(tmp_path / "e.json")
    assert events == [] and s["events"] == 0
    with pytest.raises(UmctlError, match="cannot write Perfetto trace"):
        export_perfetto(t, tmp_path / "missing" / "x.json")
