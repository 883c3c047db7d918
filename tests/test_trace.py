"""Trace files: exact round trip, streaming, the .partial protocol, and one-line errors."""

from __future__ import annotations

import json
import os
import stat
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from umctl import UmctlError
from umctl.events import trace as tr
from umctl.events.schema import SCHEMA_VERSION, Access, EventBatch, Kind, empty
from umctl.events.trace import TraceError, TraceWriter, collect_host_meta, read_trace


def random_records(kind: Kind, n: int, rng: np.random.Generator) -> np.ndarray:
    """Records whose every field spans its dtype's full range (uint64 addresses above 2^63
    included), so a lossy cast anywhere would show."""
    out = empty(kind, n)
    for name in out.dtype.names:
        dt, shape = out.dtype.fields[name][0].base, out.dtype.fields[name][0].shape
        size = (n, *shape)
        if dt == np.bool_:
            out[name] = rng.integers(0, 2, size=size).astype(bool)
        else:
            info = np.iinfo(dt)
            out[name] = rng.integers(info.min, info.max, size=size, dtype=dt, endpoint=True)
    return out


def write(path: Path, batches: list[EventBatch], meta: dict | None = None, **kw) -> Path:
    with TraceWriter(path, meta or {}, **kw) as w:
        for b in batches:
            w.write(b)
    return path


def batch_of(arrays: dict[Kind, np.ndarray], names: list[str] | None = None) -> EventBatch:
    b = EventBatch(names=list(names or []))
    for k, a in arrays.items():
        b.add(k, a)
    return b


def assert_same(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype
    assert a.tobytes() == b.tobytes()


def one_line_error(exc: pytest.ExceptionInfo, path: Path | str, phrase: str) -> None:
    msg = str(exc.value)
    assert "\n" not in msg
    assert msg.startswith(f"{path}: ")
    assert phrase in msg
    assert isinstance(exc.value, UmctlError)


# -- round trip -----------------------------------------------------------------------------

def test_every_kind_round_trips_exactly(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    data = {k: random_records(k, 300, rng) for k in Kind}
    path = write(tmp_path / "t.parquet", [batch_of(data)])
    t = read_trace(path)
    assert t.counts() == {k: 300 for k in Kind}
    for k in Kind:
        assert_same(t.events(k), data[k])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=st.dictionaries(st.sampled_from(list(Kind)), st.integers(0, 40), max_size=6),
       n_batches=st.integers(1, 4), row_group_rows=st.integers(1, 50), seed=st.integers(0, 2**32 - 1))
def test_round_trip_property(sizes: dict[Kind, int], n_batches: int, row_group_rows: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    parts = {k: [random_records(k, n, rng) for _ in range(n_batches)] for k, n in sizes.items()}
    batches = [batch_of({k: p[i] for k, p in parts.items()}) for i in range(n_batches)]
    with tempfile.TemporaryDirectory() as d:
        with read_trace(write(Path(d) / "p.parquet", batches, row_group_rows=row_group_rows)) as t:
            for k in Kind:
                expected = np.concatenate(parts[k]) if k in parts else empty(k)
                assert_same(t.events(k), expected)
                assert t.counts()[k] == len(expected)


def test_names_and_meta_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "m.parquet"
    meta = {"scenario": {"name": "gpt2", "oversub": np.float64(2.0)}, "mode": "oracle",
            "seed": np.int64(7), "access": Access.WRITE, "where": tmp_path}
    with TraceWriter(path, meta, names=["a"]) as w:
        w.write(batch_of({Kind.LAUNCH: empty(Kind.LAUNCH, 2)}, names=["a", "b"]))  # batch names grow
        w.write(batch_of({}, names=["a", "b", "c"]))
        w.meta["calibration"] = "h100"  # allowed until close
    t = read_trace(path)
    assert t.names == ["a", "b", "c"]
    assert t.meta["scenario"] == {"name": "gpt2", "oversub": 2.0}
    assert t.meta["seed"] == 7 and t.meta["access"] == int(Access.WRITE) and t.meta["where"] == str(tmp_path)
    assert t.meta["mode"] == "oracle" and t.meta["calibration"] == "h100"
    assert t.meta["schema_version"] == SCHEMA_VERSION and t.meta["complete"] is True
    for key in ("created", "umctl_version", "command_line", "host", "gpu", "driver", "uvm_params"):
        assert key in t.meta
    assert "names" not in t.meta

    with TraceWriter(tmp_path / "n.parquet", {}) as w:
        w.set_names(["x", "y"])
    assert read_trace(tmp_path / "n.parquet").names == ["x", "y"]


def test_span_counts_and_batch(tmp_path: Path) -> None:
    launch = empty(Kind.LAUNCH, 2)
    launch["t_ns"], launch["t_end_ns"] = [100, 200], [150, 900]
    fault = empty(Kind.FAULT, 3)
    fault["t_ns"] = [50, 60, 300]
    path = write(tmp_path / "s.parquet", [batch_of({Kind.LAUNCH: launch, Kind.FAULT: fault}, names=["k"])])
    t = read_trace(path)
    assert t.time_span_ns() == (50, 900)
    b = t.to_batch()
    assert b.now_ns == 900 and b.names == ["k"] and set(b.arrays) == {Kind.LAUNCH, Kind.FAULT}
    assert_same(b[Kind.FAULT], fault)
    with TraceWriter(tmp_path / "empty.parquet", {}):
        pass
    e = read_trace(tmp_path / "empty.parquet")
    assert e.time_span_ns() == (0, 0) and sum(e.counts().values()) == 0 and len(e.events(Kind.FAULT)) == 0


def test_mixed_row_groups_from_another_writer_are_read(tmp_path: Path) -> None:
    """A writer other than ours may mix kinds in a row group; the reader filters by row."""
    rng = np.random.default_rng(3)
    f1, l1, f2 = random_records(Kind.FAULT, 5, rng), random_records(Kind.LAUNCH, 4, rng), random_records(Kind.FAULT, 6, rng)
    table = pa.Table.from_batches([tr._record_batch(Kind.FAULT, f1), tr._record_batch(Kind.LAUNCH, l1),
                                   tr._record_batch(Kind.FAULT, f2)])
    table = table.replace_schema_metadata({"umctl": json.dumps({"schema_version": 1, "names": []})})
    pq.write_table(table, tmp_path / "mixed.parquet", row_group_size=8)
    t = read_trace(tmp_path / "mixed.parquet")
    assert t.counts()[Kind.FAULT] == 11 and t.counts()[Kind.LAUNCH] == 4
    assert_same(t.events(Kind.FAULT), np.concatenate([f1, f2]))
    assert_same(t.events(Kind.LAUNCH), l1)


def test_widen_keeps_every_bit() -> None:
    assert tr.widen([np.dtype(np.uint64), np.dtype(np.int32)]) == np.int64
    assert tr.widen([np.dtype(np.int16), np.dtype(np.int32)]) == np.int32
    assert tr.widen([np.dtype(np.uint8), np.dtype(np.bool_)]) == np.uint8
    v = np.array([0, 2**63, 2**64 - 1], dtype=np.uint64)
    assert (v.astype(np.int64).astype(np.uint64) == v).all()
    # Every column has exactly one Arrow type, and kinds' fields map onto existing columns.
    assert len(set(tr.SCHEMA.names)) == len(tr.SCHEMA.names)
    for cols in tr.KIND_COLUMNS.values():
        assert all(c.name in tr.COLUMN_DTYPES for c in cols)


# -- streaming and the .partial protocol ----------------------------------------------------

def test_writer_streams_row_groups_of_one_kind(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    path = tmp_path / "big.parquet"
    w = TraceWriter(path, {}, row_group_rows=100)
    sizes = []
    for _ in range(10):
        w.write(batch_of({Kind.FAULT: random_records(Kind.FAULT, 55, rng),
                          Kind.MIGRATION: random_records(Kind.MIGRATION, 30, rng)}))
        sizes.append(w.partial_path.stat().st_size)
        assert sum(len(p) for parts in w._buffers.values() for p in parts) <= 2 * 100 + 85
    assert not path.exists() and w.partial_path.exists()
    deadline = time.monotonic() + 10   # row groups reach the disk before close (the writer's thread)
    while w.partial_path.stat().st_size <= sizes[0] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert w.partial_path.stat().st_size > sizes[0]
    w.close()
    assert path.exists() and not w.partial_path.exists()
    md = pq.ParquetFile(path).metadata
    assert md.num_row_groups >= 8
    kind_col = pq.ParquetFile(path).schema_arrow.names.index("kind")
    for i in range(md.num_row_groups):
        s = md.row_group(i).column(kind_col).statistics
        assert s.min == s.max  # one kind per row group
    t = read_trace(path)
    assert t.counts()[Kind.FAULT] == 550 and t.counts()[Kind.MIGRATION] == 300


def test_a_write_error_in_the_writer_thread_reaches_the_caller(tmp_path: Path) -> None:
    """Row groups are written by the writer's thread (the live loop must not stall ~0.5 s per
    1 M-row group); a disk error there is raised by the next write or by close, never lost."""
    rng = np.random.default_rng(6)
    w = TraceWriter(tmp_path / "e.parquet", {}, row_group_rows=10)

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    w._writer.write_table = full
    w.write(batch_of({Kind.FAULT: random_records(Kind.FAULT, 25, rng)}))
    deadline = time.monotonic() + 10
    while w._error is None and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(TraceError, match="No space left"):
        w.write(batch_of({Kind.FAULT: random_records(Kind.FAULT, 1, rng)}))
    with pytest.raises(TraceError, match="No space left"):
        w.close()


def test_exception_keeps_what_was_written(tmp_path: Path) -> None:
    """An error keeps what was recorded, readable, but only under NAME.partial: a file under
    the final name is always a complete run (issue 35)."""
    path = tmp_path / "crash.parquet"
    faults = random_records(Kind.FAULT, 10, np.random.default_rng(0))
    with pytest.raises(RuntimeError, match="boom"):
        with TraceWriter(path, {"mode": "none"}) as w:
            w.write(batch_of({Kind.FAULT: faults}, names=["k"]))
            raise RuntimeError("boom")
    assert not path.exists() and w.partial_path.exists()
    t = read_trace(w.partial_path)
    assert t.meta["complete"] is False and "RuntimeError: boom" in t.meta["error"]
    assert t.names == ["k"]
    assert_same(t.events(Kind.FAULT), faults)


def test_writer_rejects_wrong_dtype_and_bad_directory(tmp_path: Path) -> None:
    with TraceWriter(tmp_path / "d.parquet", {}) as w:
        b = EventBatch()
        b.arrays[Kind.FAULT] = empty(Kind.REPLAY, 1)
        with pytest.raises(TypeError):
            w.write(b)
    with pytest.raises(TraceError) as exc:
        TraceWriter(tmp_path / "missing" / "x.parquet", {})
    one_line_error(exc, tmp_path / "missing" / "x.parquet", "cannot write trace")


# -- corrupt and foreign files --------------------------------------------------------------

@pytest.fixture
def good_trace(tmp_path: Path) -> Path:
    rng = np.random.default_rng(2)
    return write(tmp_path / "good.parquet", [batch_of({Kind.FAULT: random_records(Kind.FAULT, 2000, rng)})])


@pytest.mark.parametrize("cut", [1, 100, 0.5])
def test_truncated_trace(tmp_path: Path, good_trace: Path, cut: float) -> None:
    data = good_trace.read_bytes()
    n = int(len(data) * cut) if isinstance(cut, float) else len(data) - cut
    bad = tmp_path / "trace.parquet"
    bad.write_bytes(data[:n])
    with pytest.raises(TraceError) as exc:
        read_trace(bad)
    one_line_error(exc, bad, "truncated or corrupt Parquet file (no footer)")


def test_interrupted_recording_is_named(tmp_path: Path, good_trace: Path) -> None:
    bad = tmp_path / "run.parquet.partial"
    bad.write_bytes(good_trace.read_bytes()[:-50])
    with pytest.raises(TraceError) as exc:
        read_trace(bad)
    one_line_error(exc, bad, "recording was interrupted")


def test_random_bytes_empty_missing_and_directory(tmp_path: Path) -> None:
    cases = {
        "random.parquet": (np.random.default_rng(0).bytes(5000), "not a Parquet file"),
        "empty.parquet": (b"", "empty file"),
        "tiny.parquet": (b"PAR1PAR1", "truncated or corrupt"),
        "footer.parquet": (b"PAR1" + b"\x00" * 40 + b"\x10\x00\x00\x00PAR1", "corrupt Parquet file"),
    }
    for name, (content, phrase) in cases.items():
        p = tmp_path / name
        p.write_bytes(content)
        with pytest.raises(TraceError) as exc:
            read_trace(p)
        one_line_error(exc, p, phrase)
    with pytest.raises(TraceError) as exc:
        read_trace(tmp_path / "nope.parquet")
    one_line_error(exc, tmp_path / "nope.parquet", "no such file")
    with pytest.raises(TraceError) as exc:
        read_trace(tmp_path)
    one_line_error(exc, tmp_path, "directory")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads anything")
def test_unreadable_file(tmp_path: Path, good_trace: Path) -> None:
    good_trace.chmod(0)
    try:
        with pytest.raises(TraceError) as exc:
            read_trace(good_trace)
        one_line_error(exc, good_trace, "cannot read")
    finally:
        good_trace.chmod(stat.S_IRUSR | stat.S_IWUSR)


def _foreign(path: Path, meta: dict | None, table: pa.Table | None = None) -> Path:
    table = table if table is not None else pa.table({"a": [1, 2, 3]})
    if meta is not None:
        table = table.replace_schema_metadata({"umctl": json.dumps(meta) if isinstance(meta, dict) else meta})
    pq.write_table(table, path)
    return path


def test_foreign_future_and_malformed_traces(tmp_path: Path) -> None:
    kinds = pa.DictionaryArray.from_arrays(pa.array([0], pa.int8()), pa.array(["fault"]))
    cases = [
        (_foreign(tmp_path / "x.parquet", None), "not a umctl trace (no umctl metadata)"),
        (_foreign(tmp_path / "future.parquet", {"schema_version": SCHEMA_VERSION + 1}),
         f"trace schema version {SCHEMA_VERSION + 1} is newer than this umctl supports"),
        (_foreign(tmp_path / "nover.parquet", {"created": "x"}), "no schema_version"),
        (_foreign(tmp_path / "json.parquet", "{not json"), "not valid JSON"),  # type: ignore[arg-type]
        (_foreign(tmp_path / "names.parquet", {"schema_version": 1, "names": [1]}), "names"),
        (_foreign(tmp_path / "nokind.parquet", {"schema_version": 1}), "missing column 'kind'"),
        (_foreign(tmp_path / "cols.parquet", {"schema_version": 1},
                  pa.table({"kind": kinds, "t_ns": pa.array([1], pa.int64())})),
         "missing column 'gpu' (needed by fault events)"),
        (_foreign(tmp_path / "unknown.parquet", {"schema_version": 1},
                  pa.table({"kind": pa.array(["bogus"]), "t_ns": [1]})), "unknown event kind 'bogus'"),
        (_foreign(tmp_path / "type.parquet", {"schema_version": 1},
                  pa.table({"kind": ["drops"], "t_ns": [1], "kind_code": ["x"], "count": [1]})),
         "column 'kind_code' has type string"),
    ]
    for path, phrase in cases:
        with pytest.raises(TraceError) as exc:
            read_trace(path)
        one_line_error(exc, path, phrase)


# -- host metadata --------------------------------------------------------------------------

def test_collect_host_meta_never_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tr._host_meta_cached.cache_clear()
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    m = collect_host_meta()
    assert m["gpu"] == "none" and m["host"]["hostname"]
    assert set(m) == {"host", "gpu", "driver", "uvm_params"}
    if not Path("/proc/driver/nvidia/version").exists():
        assert m["driver"] == "none" and m["uvm_params"] == "none"

    tr._host_meta_cached.cache_clear()
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA H100 80GB HBM3, 81559 MiB'\necho 'NVIDIA H100 80GB HBM3, 81559 MiB'\n")
    smi.chmod(0o755)
    m = collect_host_meta()
    assert m["gpu"] == [{"index": i, "name": "NVIDIA H100 80GB HBM3", "memory_bytes": 81559 << 20} for i in (0, 1)]
    m["gpu"].clear()  # callers get a copy
    assert collect_host_meta()["gpu"]

    tr._host_meta_cached.cache_clear()
    smi.write_text("#!/bin/sh\nexit 9\n")
    assert collect_host_meta()["gpu"] == "none"
    tr._host_meta_cached.cache_clear()
