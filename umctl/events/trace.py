"""Trace files: every recording and every replay is one Parquet file.

One file and one table, rather than a file per kind, so a trace is a single artefact to copy,
attach to a bug report or diff; a ``kind`` column says which event a row is and the other
columns are the union of every kind's fields (null where a kind lacks the field). The writer
buffers each kind separately and writes row groups that hold one kind only, so a reader that
wants the faults touches only fault row groups, and the null columns of those groups cost
next to nothing on disk (a run of undefined values). Readers still cope with mixed row groups.

The metadata block (JSON under the key ``umctl`` in the Parquet key-value metadata) says where
the trace came from: schema version, creation time, host, GPU, driver, UVM module parameters,
the command line, whatever the caller adds (scenario, simulator mode, calibration), and the
kernel-name table that LAUNCH.name_id indexes. It is written when the file is closed, because
names keep arriving during a recording (see :class:`TraceWriter`).
"""

from __future__ import annotations

import copy
import datetime as _dt
import enum
import functools
import json
import os
import platform
import queue
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import UmctlError, __version__
from ..interrupts import deferred
from ..units import parse_size
from .schema import DTYPES, SCHEMA_VERSION, EventBatch, Kind, empty

#: Key of the metadata block in the Parquet key-value metadata.
META_KEY = "umctl"
#: Rows per row group. ~1 M rows keeps a flush to tens of MB in memory while still giving
#: Parquet long enough columns to compress well.
ROW_GROUP_ROWS = 1 << 20
#: Name of the column that holds the event kind (Kind.value, dictionary-encoded).
KIND_COLUMN = "kind"

_PARQUET_MAGIC = b"PAR1"
_SUBARRAY_SUFFIXES = ("x", "y", "z")
# A field may not take the name of the kind column (COPY.kind, DROPS.kind); both are small
# enum codes, so one renamed column serves them.
_RENAMED_FIELDS = {KIND_COLUMN: "kind_code"}


class TraceError(UmctlError):
    """A trace file cannot be read or written; the message names the file and the problem."""


#: (path, complete) of every trace closed in this process since the last
#: :func:`forget_closed_traces`, in order: ``path`` is the ``.partial`` file of an incomplete one
_CLOSED: list[tuple[Path, bool]] = []


#: writers not closed yet (weakly: a writer dropped unclosed is the caller's bug, not a leak here)
_OPEN: "weakref.WeakSet[TraceWriter]" = weakref.WeakSet()


def close_open_traces(error: BaseException) -> None:
    """Close every writer still open as incomplete, with ``error`` as the reason. The CLI's
    last step after an interrupt or a failure: an interrupt can land between a writer's
    creation and the ``try`` that would close it, and the ``.partial`` must still get a footer."""
    for w in list(_OPEN):
        try:
            w.close(error=error)
        except Exception:  # noqa: BLE001 - the error that ended the run is the one to report
            pass


def closed_traces() -> list[tuple[Path, bool]]:
    """The traces closed since :func:`forget_closed_traces`: (path, complete). The CLI names
    them after an interrupt or an error -- which file is whole, which was kept as
    ``.partial`` -- since the code that opened them has unwound by then."""
    return list(_CLOSED)


def forget_closed_traces() -> None:
    _CLOSED.clear()


def check_trace_path(path: str | os.PathLike) -> None:
    """Refuse a trace name that is a directory (``--record DIR``) before anything is written:
    the writer would otherwise leave ``DIR.partial`` beside it and then fail to rename."""
    p = Path(path)
    if str(path).endswith(os.sep) or p.is_dir():
        raise TraceError(f"{path}: is a directory; give a trace file name, e.g. {p / 'trace.parquet'}")


# -- layout ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Column:
    """Where one (scalar part of a) field of a kind lives in the table."""

    field: str
    index: int | None  # element of a subarray field (LAUNCH grid/block), else None
    name: str  # column name in the file
    dtype: np.dtype  # the field's own numpy dtype (before widening)


def _columns_of(dtype: np.dtype) -> list[Column]:
    cols: list[Column] = []
    for field in dtype.names:
        sub = dtype.fields[field][0]
        base = _RENAMED_FIELDS.get(field, field)
        if sub.shape == ():
            cols.append(Column(field, None, base, sub))
            continue
        (n,) = sub.shape
        suffixes = _SUBARRAY_SUFFIXES if n <= len(_SUBARRAY_SUFFIXES) else [str(i) for i in range(n)]
        cols.extend(Column(field, i, f"{base}_{suffixes[i]}", sub.base) for i in range(n))
    return cols


def widen(dtypes: Iterable[np.dtype]) -> np.dtype:
    """One storage dtype for a column that several kinds share with different types.

    numpy promotes uint64 with a signed type to float64, which would lose addresses; int64 is
    used instead, because casting uint64 -> int64 -> uint64 restores every bit, so the round
    trip stays exact whatever the values."""
    dts = list(dtypes)
    out = functools.reduce(np.promote_types, dts)
    if out.kind == "f" and all(d.kind in "biu" for d in dts):
        return np.dtype(np.int64)
    return out


KIND_COLUMNS: dict[Kind, list[Column]] = {k: _columns_of(dt) for k, dt in DTYPES.items()}


def _storage_dtypes() -> dict[str, np.dtype]:
    seen: dict[str, list[np.dtype]] = {}
    for cols in KIND_COLUMNS.values():
        for c in cols:
            seen.setdefault(c.name, []).append(c.dtype)
    return {name: widen(dts) for name, dts in seen.items()}


#: Storage dtype of every data column, in file order.
COLUMN_DTYPES: dict[str, np.dtype] = _storage_dtypes()
_KIND_DICTIONARY = pa.array([k.value for k in Kind], type=pa.string())
_KIND_INDEX = {k: i for i, k in enumerate(Kind)}
SCHEMA = pa.schema(
    [pa.field(KIND_COLUMN, pa.dictionary(pa.int8(), pa.string()), nullable=False)]
    + [pa.field(name, pa.from_numpy_dtype(dt)) for name, dt in COLUMN_DTYPES.items()]
)


def _record_batch(kind: Kind, records: np.ndarray) -> pa.RecordBatch:
    """Records of one kind as a batch of the full table schema (other kinds' columns null)."""
    n = len(records)
    columns: dict[str, pa.Array] = {
        KIND_COLUMN: pa.DictionaryArray.from_arrays(pa.array(np.full(n, _KIND_INDEX[kind], np.int8)), _KIND_DICTIONARY)
    }
    for c in KIND_COLUMNS[kind]:
        values = records[c.field] if c.index is None else records[c.field][:, c.index]
        columns[c.name] = pa.array(np.ascontiguousarray(values).astype(COLUMN_DTYPES[c.name], copy=False))
    arrays = [columns[f.name] if f.name in columns else pa.nulls(n, f.type) for f in SCHEMA]
    return pa.RecordBatch.from_arrays(arrays, schema=SCHEMA)


# -- metadata -------------------------------------------------------------------------------

def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def _gpus_from_nvidia_smi() -> list[dict] | str:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return "none"
    try:
        proc = subprocess.run([exe, "--query-gpu=name,memory.total", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return "none"
    gpus: list[dict] = []
    for i, line in enumerate(proc.stdout.splitlines() if proc.returncode == 0 else []):
        name, _, mem = line.rpartition(",")
        try:
            mem_bytes: int | None = parse_size(mem)
        except ValueError:
            mem_bytes = None
        gpus.append({"index": i, "name": name.strip() or line.strip(), "memory_bytes": mem_bytes})
    return gpus or "none"


@functools.lru_cache(maxsize=1)
def _host_meta_cached() -> dict:
    driver = _read_text("/proc/driver/nvidia/version")
    params_dir = Path("/sys/module/nvidia_uvm/parameters")
    try:
        param_files = sorted(params_dir.iterdir())
    except OSError:
        param_files = []
    params = {p.name: v for p in param_files if (v := _read_text(str(p))) is not None}
    return {
        "host": {"hostname": socket.gethostname(), "kernel": platform.release(),
                 "machine": platform.machine(), "python": platform.python_version()},
        "gpu": _gpus_from_nvidia_smi(),
        "driver": driver.splitlines()[0] if driver else "none",
        "uvm_params": params or "none",
    }


def collect_host_meta() -> dict:
    """Host, GPU, driver and nvidia-uvm module parameters of this machine, "none" where
    absent. Never fails: a trace recorded on a machine without a GPU (a replay on a laptop)
    must still be writable. Cached per process, since nvidia-smi takes up to seconds."""
    return copy.deepcopy(_host_meta_cached())


def _json_default(obj: Any) -> Any:
    """Let callers put numpy scalars, enums, paths and such into the metadata without
    converting them first; anything unknown becomes its str() rather than failing the write."""
    if isinstance(obj, enum.Enum):
        return obj.value if isinstance(obj.value, (int, str)) else obj.name
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=str)
    return str(obj)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


# -- writing --------------------------------------------------------------------------------

class TraceWriter:
    """Streams events into a trace file.

    Data goes to ``<path>.partial``, which :meth:`close` renames to ``path`` only after a clean
    finish, so a file under the final name is always complete. A recording that ends in an
    error or an interrupt (Ctrl-C, SIGTERM) keeps what it had under ``<path>.partial``, closed
    properly -- readable, its metadata saying ``"complete": false`` and why -- and noted for
    :func:`closed_traces` so the CLI can name it; a cut-short trace under the final name would
    replay as if it were the whole run. Only a process killed outright (SIGKILL) leaves a ``.partial`` without a
    footer, which the reader names as an interrupted recording.

    The metadata block and the name table are written at close, through the Parquet writer's
    key-value metadata (which pyarrow accepts until the footer is written), because kernel
    names keep arriving during a recording. Until then ``meta`` may be updated freely.

    Used as a context manager, an exception inside the ``with`` block closes the file as
    incomplete; so does :meth:`close` called without ``error`` from a ``finally`` block that an
    exception is unwinding (the simulator's loop closes its recorder that way). The exception
    then propagates as usual. Closing holds SIGINT/SIGTERM until the footer is written and the
    file renamed (:func:`umctl.interrupts.deferred`), so a second Ctrl-C cannot cut it in half.

    Full row groups are compressed and written by a thread of the writer's own, so
    :meth:`write` only buffers. Why: a 1 M-row group of faults takes ~0.5 s to compress, and
    the live control loop that records a trace (``umctl run -o --budget``) stalled that long --
    no evictions while the GPU pulled everything back, so a recorded run behaved unlike an
    unrecorded one (docs/evaluation/live-control.md). A
    write error in the thread is raised by the next :meth:`write` or by :meth:`close`.
    """

    def __init__(self, path: str | os.PathLike, meta: dict | None = None, names: list[str] | None = None,
                 *, row_group_rows: int = ROW_GROUP_ROWS):
        check_trace_path(path)
        self.path = Path(path)
        self.partial_path = self.path.with_name(self.path.name + ".partial")
        self.names: list[str] = list(names or [])
        self.meta: dict = {
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "umctl_version": __version__,
            "command_line": shlex.join(sys.argv),
            **collect_host_meta(),
            **(meta or {}),
        }
        self.row_group_rows = max(1, int(row_group_rows))
        self.counts: dict[Kind, int] = {k: 0 for k in Kind}
        self._buffers: dict[Kind, list[np.ndarray]] = {k: [] for k in Kind}
        self._buffered: dict[Kind, int] = {k: 0 for k in Kind}
        self._closed = False
        #: (kind, records) row groups for the thread; bounded so a slow disk slows the caller
        #: down instead of filling memory
        self._queue: queue.Queue = queue.Queue(maxsize=4)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        try:
            with deferred():  # a created .partial is always a registered writer that can close it
                self._writer = pq.ParquetWriter(self.partial_path, SCHEMA, compression="zstd")
                _OPEN.add(self)
        except (OSError, pa.ArrowException) as e:
            raise TraceError(f"{path}: cannot write trace ({_one_line(e)})") from e

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is None:
            self.close()
            return
        try:
            self.close(error=exc)
        except Exception:  # noqa: BLE001 - the original exception matters more than this one
            pass

    def set_names(self, names: list[str]) -> None:
        """Replace the kernel-name table (LAUNCH.name_id indexes it)."""
        self.names = list(names)

    def write(self, batch: EventBatch) -> None:
        """Buffer a batch's events; full row groups go to disk at once. Adopts the batch's
        name table when it has grown (EventBatch.names is shared and append-only)."""
        if self._closed:
            raise ValueError("write to a closed TraceWriter")
        self._raise_thread_error()
        if len(batch.names) > len(self.names):
            self.names = list(batch.names)
        for kind, records in batch.arrays.items():
            kind = Kind(kind)
            if records is None or len(records) == 0:
                continue
            if records.dtype != DTYPES[kind]:
                raise TypeError(f"{kind.value} records must have dtype {DTYPES[kind]}")
            self._buffers[kind].append(records)
            self._buffered[kind] += len(records)
            self.counts[kind] += len(records)
            if self._buffered[kind] >= self.row_group_rows:
                self._flush(kind)
        # Bound memory when many kinds each hold a part-filled group: spill the largest.
        while sum(self._buffered.values()) > 2 * self.row_group_rows:
            self._flush(max(self._buffered, key=self._buffered.__getitem__))

    def _flush(self, kind: Kind) -> None:
        """Hand the kind's buffered records to the writer thread (which joins them: the
        caller never copies a row group)."""
        parts = self._buffers[kind]
        if not parts:
            return
        with deferred():  # a row group is either queued and dropped from the buffer, or neither
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="umctl-trace-writer", daemon=True)
                self._thread.start()
            self._queue.put((kind, parts))
            self._buffers[kind] = []
            self._buffered[kind] = 0

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if self._error is not None:
                continue   # keep taking items so the caller never blocks on a dead writer
            kind, parts = item
            try:
                records = parts[0] if len(parts) == 1 else np.concatenate(parts)
                table = pa.Table.from_batches([_record_batch(kind, records)])
                self._writer.write_table(table, row_group_size=self.row_group_rows)
            except (OSError, pa.ArrowException) as e:
                self._error = TraceError(f"{self.path}: cannot write trace ({_one_line(e)})")
            except BaseException as e:  # noqa: BLE001 - reported to the caller, not lost in a thread
                self._error = e

    def _raise_thread_error(self) -> None:
        if self._error is not None:
            raise self._error

    def _join(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def close(self, error: BaseException | None = None) -> None:
        """Flush, write the metadata block and the footer; rename ``.partial`` to the final
        name if the recording finished cleanly, else keep it as ``.partial`` (readable, marked
        incomplete). ``error`` is the exception that ended the recording; without one, an
        exception being handled or unwound when close is called counts (``close()`` in a
        ``finally``), and so does a write error in the writer's thread."""
        if self._closed:
            return
        given = error if error is not None else sys.exc_info()[1]
        with deferred():
            self._close(given)
        if given is None:
            self._raise_thread_error()   # else the error that ended the recording goes on unchanged

    def _close(self, error: BaseException | None) -> None:
        self._closed = True
        _OPEN.discard(self)
        try:
            for kind in Kind:
                self._flush(kind)
        finally:
            self._join()
            if error is None and self._error is not None:
                error = self._error
            meta = dict(self.meta)
            meta["schema_version"] = SCHEMA_VERSION
            meta["complete"] = error is None
            if error is not None:
                meta["error"] = _describe_error(error)
            meta["names"] = self.names
            try:
                self._writer.add_key_value_metadata({META_KEY: json.dumps(meta, default=_json_default)})
                self._writer.close()
            except BaseException:
                # no footer: nothing readable to keep (a full disk, most likely)
                self.partial_path.unlink(missing_ok=True)
                raise
            if error is None:
                os.replace(self.partial_path, self.path)
                _CLOSED.append((self.path, True))
            else:
                _CLOSED.append((self.partial_path, False))


def _describe_error(error: BaseException) -> str:
    """The ``error`` of an incomplete trace's metadata: ``interrupted (SIGTERM)`` for a
    signal, ``Type: first line`` otherwise."""
    if isinstance(error, KeyboardInterrupt):
        return str(error) if str(error).startswith("interrupted") else "interrupted (SIGINT)"
    return f"{type(error).__name__}: {_one_line(error)}"


# -- reading --------------------------------------------------------------------------------

class Trace:
    """A trace file opened for reading. Only the footer is read up front; each kind's events
    are read (only that kind's columns and row groups) when asked for."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._label = str(path)
        self._check_container()
        try:
            self._pf = pq.ParquetFile(self.path)
        except (OSError, pa.ArrowException) as e:
            raise self._error(f"corrupt Parquet file ({_one_line(e)})") from e
        try:
            self.meta, self.names = self._read_meta()
            self._group_counts = self._index_row_groups()
            self._check_columns()
        except TraceError:
            self._pf.close()
            raise

    # -- opening ---------------------------------------------------------------------------
    def _error(self, problem: str) -> TraceError:
        return TraceError(f"{self._label}: {problem}")

    def _check_container(self) -> None:
        """Tell the common failures apart before pyarrow does: its one message ('magic bytes
        not found') covers a truncated trace, an interrupted recording and a file that was
        never Parquet, and the user's next step differs."""
        try:
            size = self.path.stat().st_size
            with open(self.path, "rb") as f:
                head = f.read(4)
                f.seek(max(0, size - 4))
                tail = f.read(4)
        except FileNotFoundError:
            raise self._error("no such file") from None
        except IsADirectoryError:
            raise self._error("is a directory, not a trace file") from None
        except OSError as e:
            raise self._error(f"cannot read ({e.strerror or _one_line(e)})") from None
        if size == 0:
            raise self._error("empty file (not a Parquet trace)")
        if head != _PARQUET_MAGIC:
            raise self._error("not a Parquet file")
        if size < 12 or tail != _PARQUET_MAGIC:
            hint = " -- the recording was interrupted" if self.path.name.endswith(".partial") else ""
            raise self._error(f"truncated or corrupt Parquet file (no footer){hint}")

    def _read_meta(self) -> tuple[dict, list[str]]:
        raw = (self._pf.metadata.metadata or {}).get(META_KEY.encode())
        if raw is None:
            raise self._error("not a umctl trace (no umctl metadata)")
        try:
            meta = json.loads(raw)
        except ValueError:
            raise self._error("corrupt umctl metadata (not valid JSON)") from None
        if not isinstance(meta, dict) or not isinstance(meta.get("schema_version"), int):
            raise self._error("corrupt umctl metadata (no schema_version)")
        version = meta["schema_version"]
        if version > SCHEMA_VERSION:
            raise self._error(f"trace schema version {version} is newer than this umctl supports "
                              f"({SCHEMA_VERSION}); upgrade umctl to read it")
        names = meta.pop("names", [])
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise self._error("corrupt umctl metadata (names is not a list of strings)")
        return meta, names

    def _index_row_groups(self) -> list[dict[Kind, int]]:
        """Events per kind in each row group. Row groups written by TraceWriter hold one
        kind, which the column statistics show without reading data; mixed groups (other
        writers) cost one read of the small dictionary-encoded kind column."""
        md = self._pf.metadata
        names = self._pf.schema_arrow.names
        if KIND_COLUMN not in names:
            raise self._error(f"missing column '{KIND_COLUMN}'")
        kind_idx = names.index(KIND_COLUMN)
        by_value = {k.value: k for k in Kind}
        groups: list[dict[Kind, int]] = []
        for i in range(md.num_row_groups):
            rg = md.row_group(i)
            stats = rg.column(kind_idx).statistics
            if rg.num_rows == 0:
                counts: dict[str, int] = {}
            elif stats is not None and stats.has_min_max and stats.min == stats.max and stats.null_count == 0:
                counts = {stats.min: rg.num_rows}
            else:
                try:
                    col = self._pf.read_row_group(i, columns=[KIND_COLUMN])[KIND_COLUMN]
                except (OSError, pa.ArrowException) as e:
                    raise self._error(f"corrupt data ({_one_line(e)})") from e
                counts = {str(v["values"]): int(v["counts"]) for v in pc.value_counts(col).to_pylist()}
            unknown = [v for v in counts if v not in by_value]
            if unknown:
                raise self._error(f"unknown event kind {unknown[0]!r}")
            groups.append({by_value[v]: n for v, n in counts.items()})
        return groups

    def _check_columns(self) -> None:
        schema = self._pf.schema_arrow
        present = {k for g in self._group_counts for k in g}
        for kind in Kind:
            if kind not in present:
                continue
            for c in KIND_COLUMNS[kind]:
                if c.name not in schema.names:
                    raise self._error(f"missing column '{c.name}' (needed by {kind.value} events)")
                t = schema.field(c.name).type
                if not (pa.types.is_integer(t) or pa.types.is_boolean(t)):
                    raise self._error(f"column '{c.name}' has type {t}, expected an integer")

    # -- access ----------------------------------------------------------------------------
    def __enter__(self) -> "Trace":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the file handle (also released when the Trace is garbage-collected)."""
        self._pf.close()

    def counts(self) -> dict[Kind, int]:
        """Events per kind (every kind, zero where absent), from the footer alone."""
        out = {k: 0 for k in Kind}
        for g in self._group_counts:
            for k, n in g.items():
                out[k] += n
        return out

    def events(self, kind: Kind) -> np.ndarray:
        """All events of ``kind`` as a structured array of ``DTYPES[kind]``, in file order."""
        kind = Kind(kind)
        groups = [i for i, g in enumerate(self._group_counts) if g.get(kind)]
        if not groups:
            return empty(kind)
        cols = KIND_COLUMNS[kind]
        mixed = any(len(self._group_counts[i]) > 1 for i in groups)
        try:
            table = self._pf.read_row_groups(groups, columns=[c.name for c in cols] + ([KIND_COLUMN] if mixed else []))
            if mixed:
                table = table.filter(pc.equal(table[KIND_COLUMN], kind.value))
        except (OSError, pa.ArrowException) as e:
            raise self._error(f"corrupt data in {kind.value} events ({_one_line(e)})") from e
        out = np.empty(table.num_rows, dtype=DTYPES[kind])
        for c in cols:
            col = table[c.name]
            if col.null_count:
                raise self._error(f"column '{c.name}' has nulls in {kind.value} events")
            values = col.to_numpy().astype(c.dtype, copy=False)
            if c.index is None:
                out[c.field] = values
            else:
                out[c.field][:, c.index] = values
        return out

    def time_span_ns(self) -> tuple[int, int]:
        """(first t_ns, last of t_ns and t_end_ns) over all events; (0, 0) when empty. From
        the column statistics where present, so it costs no data read on our own files."""
        md = self._pf.metadata
        names = self._pf.schema_arrow.names
        lo: int | None = None
        hi: int | None = None
        for i in range(md.num_row_groups):
            for name, want_min in (("t_ns", True), ("t_end_ns", False)):
                if name not in names:
                    continue
                vmin, vmax = self._min_max(i, names.index(name), name)
                if vmin is None:
                    continue
                if want_min:
                    lo = vmin if lo is None else min(lo, vmin)
                hi = vmax if hi is None else max(hi, vmax)
        return (lo, hi) if lo is not None and hi is not None else (0, 0)

    def _min_max(self, group: int, col_idx: int, name: str) -> tuple[int | None, int | None]:
        rg = self._pf.metadata.row_group(group)
        stats = rg.column(col_idx).statistics
        if stats is not None and stats.has_min_max:
            return int(stats.min), int(stats.max)
        if stats is not None and stats.null_count == rg.num_rows:
            return None, None
        try:
            mm = pc.min_max(self._pf.read_row_group(group, columns=[name])[name]).as_py()
        except (OSError, pa.ArrowException) as e:
            raise self._error(f"corrupt data ({_one_line(e)})") from e
        return mm["min"], mm["max"]

    def to_batch(self) -> EventBatch:
        """The whole trace as one EventBatch (loads everything: for small traces and tests)."""
        batch = EventBatch(now_ns=self.time_span_ns()[1], names=list(self.names))
        for kind, n in self.counts().items():
            if n:
                batch.arrays[kind] = self.events(kind)
        return batch


def read_trace(path: str | os.PathLike) -> Trace:
    """Open a trace file; raises TraceError (one line naming the file) if it is not a
    readable umctl trace of a schema version this umctl understands."""
    return Trace(path)
