"""Export a trace as Chrome/Perfetto trace-event JSON (open it at ui.perfetto.dev): the
``perfetto`` reporter of a trace (:class:`PerfettoReporter`).

JSON rather than Perfetto's protobuf format because it needs no dependency and every trace
viewer reads it. The format has two constraints that shape this module:

* slices (``ph: "X"``) on one thread must nest perfectly, or Perfetto draws them wrongly.
  Kernels therefore get one track per stream where a GPU has several, and slices that still
  overlap on a track (migrations and copies sharing a copy direction) are cut short at the
  next slice's start; the true duration stays in the args as ``dur_ns``;
* the UI slows down past a few million events, so above ``max_events`` runs of consecutive
  events of the same name on the same track are merged (args then carry ``merged``: how many,
  and the sums of additive values such as bytes; a track whose events have several names is
  split into one track per name, so merged runs do not overlap), and the fault-rate counter
  uses wider bins.

Events are formatted column-wise with numpy string operations and written in chunks, so the
exporter never holds the JSON text of the whole trace.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import numpy as np

from .. import UmctlError
from ..events.schema import Cause, CopyKind, Kind, Op, Status
from ..events.trace import Trace
from ..units import CPU

_STR = np.dtypes.StringDType()
_CHUNK = 100_000
_NS_PER_MS = 1_000_000
_HEX_DIGITS = np.array([f"{i:02x}" for i in range(256)], dtype="S2")

# Track order inside a process: per GPU, kernels first, then faults, copy directions, evictions.
_SLOT_KERNELS, _SLOT_FAULTS, _SLOT_H2D, _SLOT_D2H, _SLOT_P2P, _SLOT_EVICT = range(6)
_SLOTS_PER_GPU = 8
_SORT_CPU_FAULTS = 1 << 20
_SORT_COMMANDS = 1 << 21


def _key(*cols: np.ndarray) -> np.ndarray:
    """One int64 per row that orders rows as the columns do lexicographically: sorting one
    key is much faster than np.unique(axis=1) or a multi-key lexsort on millions of rows."""
    key = np.zeros(len(cols[0]), dtype=np.int64)
    for c in cols:
        values, rank = np.unique(c, return_inverse=True)
        key = key * len(values) + rank.reshape(-1)
    return key


# -- columnar events ------------------------------------------------------------------------

@dataclass
class _Events:
    """One category's events before formatting. ``labels`` are descriptive args (dropped when
    events are merged); ``sums`` are additive args (summed when merged)."""

    category: str
    pid: np.ndarray
    track: np.ndarray  # index into tracks
    tracks: list[tuple[str, int]]  # (thread name, sort index)
    code: np.ndarray  # index into names
    names: list[str]
    start: np.ndarray  # ns
    end: np.ndarray  # ns; == start for an instant
    sums: dict[str, np.ndarray] = field(default_factory=dict)
    labels: dict[str, tuple[str, np.ndarray]] = field(default_factory=dict)  # (format, values)
    count: np.ndarray | None = None  # events merged into each (None: one each)
    true_end: np.ndarray | None = None  # end before overlap clipping

    def __len__(self) -> int:
        return len(self.start)

    def n_groups(self) -> int:
        """Distinct (pid, track, name) groups: merging never crosses them."""
        if len(self) == 0:
            return 0
        return len(np.unique(_key(self.pid, self.track, self.code)))

    def merged(self, k: int) -> "_Events":
        """Runs of ``k`` consecutive events (by start) of the same pid, track and name as one."""
        group = _key(self.pid, self.track, self.code)
        order = np.lexsort((self.start, group))
        pid, track, code, group = self.pid[order], self.track[order], self.code[order], group[order]
        boundary = np.r_[True, group[1:] != group[:-1]]
        group_start = np.maximum.accumulate(np.where(boundary, np.arange(len(order)), 0))
        new = boundary | ((np.arange(len(order)) - group_start) % k == 0)
        starts = np.flatnonzero(new)
        counts = np.diff(np.r_[starts, len(order)])
        prev = self.count[order] if self.count is not None else None
        # Merged runs of different names on one track would overlap (demand and prefetch
        # migrations interleave): each name gets its own track then.
        m_track, m_code = track[starts], code[starts]
        _, first, new_track = np.unique(_key(m_track, m_code), return_index=True, return_inverse=True)
        names_per_track = np.bincount(m_track[first], minlength=len(self.tracks))
        tracks = [(f"{self.tracks[t][0]} ({self.names[c]})" if names_per_track[t] > 1 else self.tracks[t][0],
                   self.tracks[t][1]) for t, c in zip(m_track[first].tolist(), m_code[first].tolist())]
        return _Events(
            self.category, pid[starts], new_track.reshape(-1), tracks, m_code, self.names,
            np.minimum.reduceat(self.start[order], starts), np.maximum.reduceat(self.end[order], starts),
            {n: np.add.reduceat(v[order], starts) for n, v in self.sums.items()},
            {n: (f, v[order][starts]) for n, (f, v) in self.labels.items()},
            counts if prev is None else np.add.reduceat(prev, starts),
        )


def _hex(values: np.ndarray) -> np.ndarray:
    """'"0x…"' JSON strings of uint64 values: 64-bit addresses and hashes exceed the 2^53 a
    JSON number keeps exactly in a browser."""
    b = np.ascontiguousarray(values.astype(">u8")).view(np.uint8).reshape(-1, 8)
    digits = _HEX_DIGITS[b].view("S16").reshape(-1).astype(_STR)
    return np.strings.add(np.strings.add('"0x', digits), '"')


def _num(values: np.ndarray) -> np.ndarray:
    return np.asarray(values).astype(_STR)


def _us(ns: np.ndarray) -> np.ndarray:
    """Non-negative nanoseconds as microseconds with three decimals, exact (no float)."""
    q, r = np.divmod(ns.astype(np.int64), 1000)
    return np.strings.add(np.strings.add(_num(q), "."), np.strings.zfill(_num(r), 3))


def _label_text(fmt: str, v: np.ndarray) -> np.ndarray:
    if fmt == "hex":
        return _hex(v)
    if fmt == "bool":
        return np.where(v, "true", "false").astype(_STR)
    if fmt == "xyz":
        s = [_num(v[:, i]) for i in range(3)]
        return np.strings.add(np.strings.add(np.strings.add(np.strings.add(np.strings.add(
            np.strings.add("[", s[0]), ","), s[1]), ","), s[2]), "]")
    if fmt == "str":  # already JSON-encoded strings
        return v.astype(_STR)
    return _num(v)


def _cat(*parts: np.ndarray | str) -> np.ndarray:
    out = parts[0]
    for p in parts[1:]:
        out = np.strings.add(out, p)
    return out


def _format(ev: _Events, names_json: np.ndarray, lo: int, hi: int, tid: np.ndarray, t0: int) -> str:
    """JSON text of events [lo, hi) of a category, one event per line."""
    start = ev.start[lo:hi] - t0
    dur = ev.end[lo:hi] - ev.start[lo:hi]
    is_x = dur > 0
    merged = ev.count[lo:hi] > 1 if ev.count is not None else np.zeros(hi - lo, np.bool_)
    args = [np.strings.add(f',"{n}":', _num(v[lo:hi])) for n, v in ev.sums.items()]
    for n, (fmt, v) in ev.labels.items():
        args.append(np.where(merged, "", np.strings.add(f',"{n}":', _label_text(fmt, v[lo:hi]))).astype(_STR))
    if ev.count is not None:
        args.append(np.where(merged, np.strings.add(',"merged":', _num(ev.count[lo:hi])), "").astype(_STR))
    if ev.true_end is not None:
        true_dur = ev.true_end[lo:hi] - ev.start[lo:hi]
        args.append(np.where(true_dur != dur, np.strings.add(',"dur_ns":', _num(true_dur)), "").astype(_STR))
    arg_text = np.strings.lstrip(_cat(np.full(hi - lo, "", dtype=_STR), *args), ",")
    names = names_json[ev.code[lo:hi]]
    head = np.where(is_x, '{"ph":"X","cat":"', '{"ph":"i","s":"t","cat":"').astype(_STR)
    dur_text = np.where(is_x, np.strings.add(',"dur":', _us(dur)), "").astype(_STR)
    lines = _cat(head, ev.category + '","name":', names, ',"pid":', _num(ev.pid[lo:hi]), ',"tid":',
                 _num(tid[lo:hi]), ',"ts":', _us(start), dur_text, ',"args":{', arg_text, "}}")
    return ",\n".join(lines.tolist())


# -- categories -----------------------------------------------------------------------------

def _gpu_tracks(gpu: np.ndarray, slot: int, label: str) -> tuple[np.ndarray, list[tuple[str, int]]]:
    gpus, track = np.unique(gpu, return_inverse=True)
    return track, [(f"GPU {int(g)} {label}", int(g) * _SLOTS_PER_GPU + slot) for g in gpus]


def _kernels(trace: Trace) -> _Events:
    ev = trace.events(Kind.LAUNCH)
    names = list(trace.names)
    code = ev["name_id"].astype(np.int64)
    bad = (code < 0) | (code >= len(names))
    if bad.any():
        funcs, inv = np.unique(ev["func"][bad], return_inverse=True)
        code[bad] = len(names) + inv
        names += [f"func 0x{int(f):x}" for f in funcs]
    # One track per (GPU, stream) where a GPU has several streams: their kernels overlap.
    _, first, track = np.unique(_key(ev["gpu"], ev["stream"]), return_index=True, return_inverse=True)
    gpus, per_gpu = np.unique(ev["gpu"][first], return_counts=True)
    multi = set(gpus[per_gpu > 1].tolist())
    tracks = [(f"GPU {g} kernels" + (f" (stream 0x{s:x})" if g in multi else ""), g * _SLOTS_PER_GPU + _SLOT_KERNELS)
              for g, s in zip(ev["gpu"][first].tolist(), ev["stream"][first].tolist())]
    return _Events("kernel", ev["pid"], track, tracks, code, names, ev["t_ns"],
                   np.maximum(ev["t_end_ns"], ev["t_ns"]),
                   labels={"grid": ("xyz", ev["grid"]), "block": ("xyz", ev["block"]),
                           "exec_hash": ("hex", ev["exec_hash"]), "seq": ("int", ev["seq"])})


def _fault_batches(faults: np.ndarray, replays: np.ndarray, default_pid: int) -> _Events:
    """One slice per serviced fault batch. REPLAY records carry no pid: a batch is shown in
    the process of its first fault (or ``default_pid`` when the trace kept no faults)."""
    key = _key(np.r_[faults["gpu"], replays["gpu"]], np.r_[faults["batch_id"], replays["batch_id"]])
    fkey, rkey = key[:len(faults)], key[len(faults):]
    order = np.argsort(fkey, kind="stable")
    batch_keys, starts = np.unique(fkey[order], return_index=True)
    first = order[starts]
    if len(replays):
        gpu, batch_id, end = replays["gpu"], replays["batch_id"], replays["t_ns"]
        begin = np.where((replays["t_start_ns"] > 0) & (replays["t_start_ns"] <= end), replays["t_start_ns"], end)
        nfaults = replays["nfaults"].astype(np.int64)
        j = np.minimum(np.searchsorted(batch_keys, rkey), max(len(batch_keys) - 1, 0))
        hit = batch_keys[j] == rkey if len(batch_keys) else np.zeros(len(replays), np.bool_)
        pid = np.where(hit, faults["pid"][first[j]] if len(batch_keys) else 0, default_pid)
    else:
        t_sorted = faults["t_ns"][order]
        gpu, batch_id, pid = faults["gpu"][first], faults["batch_id"][first], faults["pid"][first]
        begin = np.minimum.reduceat(t_sorted, starts) if len(starts) else t_sorted
        end = np.maximum.reduceat(t_sorted, starts) if len(starts) else t_sorted
        nfaults = np.diff(np.r_[starts, len(faults)])
    track, tracks = _gpu_tracks(gpu, _SLOT_FAULTS, "faults")
    return _Events("fault_batch", pid, track, tracks, np.zeros(len(gpu), np.int64), ["fault batch"],
                   begin, end, sums={"nfaults": nfaults}, labels={"batch_id": ("int", batch_id)})


_DIRS = ((_SLOT_H2D, "H2D"), (_SLOT_D2H, "D2H"), (_SLOT_P2P, "P2P"))


def _direction_tracks(direction: np.ndarray, gpu: np.ndarray) -> tuple[np.ndarray, list[tuple[str, int]]]:
    _, first, track = np.unique(_key(direction, gpu), return_index=True, return_inverse=True)
    tracks = [(f"GPU {g} {_DIRS[d][1]}", g * _SLOTS_PER_GPU + _DIRS[d][0])
              for d, g in zip(direction[first].tolist(), gpu[first].tolist())]
    return track.reshape(-1), tracks


def _migrations(trace: Trace) -> _Events:
    ev = trace.events(Kind.MIGRATION)
    src, dst = ev["src"].astype(np.int64), ev["dst"].astype(np.int64)
    to_gpu = (src == CPU) & (dst >= 0)
    to_cpu = (src >= 0) & (dst == CPU)
    direction = np.select([to_gpu, to_cpu], [0, 1], 2)
    gpu = np.where(to_gpu, dst, np.maximum(src, 0))
    track, tracks = _direction_tracks(direction, gpu)
    cause = np.minimum(ev["cause"].astype(np.int64), len(Cause))  # unknown codes -> "other cause"
    names = [c.name.lower() for c in Cause] + ["other cause"]
    return _Events("migration", ev["pid"], track, tracks, cause, names, ev["t_ns"],
                   np.maximum(ev["t_end_ns"], ev["t_ns"]), sums={"bytes": ev["bytes"]},
                   labels={"addr": ("hex", ev["addr"]), "src": ("int", src), "dst": ("int", dst)})


def _copies(trace: Trace) -> _Events:
    ev = trace.events(Kind.COPY)
    kind = np.minimum(ev["kind"].astype(np.int64), len(CopyKind) - 1)
    direction = np.select([kind == CopyKind.H2D, kind == CopyKind.D2H], [0, 1], 2)
    track, tracks = _direction_tracks(direction, ev["gpu"])
    return _Events("copy", ev["pid"], track, tracks, kind, [f"memcpy {k.name}" for k in CopyKind], ev["t_ns"],
                   np.maximum(ev["t_end_ns"], ev["t_ns"]), sums={"bytes": ev["bytes"]},
                   labels={"src_addr": ("hex", ev["src_addr"]), "dst_addr": ("hex", ev["dst_addr"]),
                           "async": ("bool", ev["is_async"])})


def _evictions(trace: Trace) -> _Events:
    ev = trace.events(Kind.EVICTION)
    track, tracks = _gpu_tracks(ev["gpu"], _SLOT_EVICT, "evictions")
    return _Events("eviction", ev["pid"], track, tracks, ev["critical"].astype(np.int64),
                   ["evict", "evict (critical)"], ev["t_ns"], ev["t_ns"],
                   sums={"bytes_written": ev["bytes_written"], "pages": ev["pages"]},
                   labels={"addr": ("hex", ev["addr"])})


def _thrashing(trace: Trace) -> _Events:
    ev = trace.events(Kind.THRASHING)
    track, tracks = _gpu_tracks(ev["gpu"], _SLOT_FAULTS, "faults")
    return _Events("thrashing", ev["pid"], track, tracks, np.zeros(len(ev), np.int64), ["thrashing"],
                   ev["t_ns"], ev["t_ns"], sums={"bytes": ev["bytes"]}, labels={"addr": ("hex", ev["addr"])})


def _cpu_faults(trace: Trace) -> _Events:
    ev = trace.events(Kind.CPU_FAULT)
    code = np.minimum(ev["access"].astype(np.int64), 3)
    return _Events("cpu_fault", ev["pid"], np.zeros(len(ev), np.int64), [("CPU faults", _SORT_CPU_FAULTS)],
                   code, ["cpu fault read", "cpu fault write", "cpu fault atomic", "cpu fault other"],
                   ev["t_ns"], ev["t_ns"], labels={"addr": ("hex", ev["addr"]), "pc": ("hex", ev["pc"]),
                                                   "tid": ("int", ev["tid"])})


def _commands(trace: Trace) -> _Events:
    """Commands as instants, with the outcome from the matching RESULT (by cmd_id) if any."""
    ev = trace.events(Kind.COMMAND)
    res = trace.events(Kind.RESULT)
    res = res[np.argsort(res["cmd_id"], kind="stable")]
    status_names = [json.dumps(s.name.lower()) for s in Status] + ['"unknown"', '"none"']
    status = np.full(len(ev), len(Status) + 1, dtype=np.int64)  # "none": no RESULT (yet)
    latency = np.full(len(ev), -1, dtype=np.int64)
    if len(res):
        j = np.minimum(np.searchsorted(res["cmd_id"], ev["cmd_id"]), len(res) - 1)
        found = res["cmd_id"][j] == ev["cmd_id"]
        code = res["status"][j].astype(np.int64)
        status[found] = np.where(code < len(Status), code, len(Status))[found]
        latency[found] = res["latency_ns"][j][found]
    code = np.minimum(ev["op"].astype(np.int64), len(Op))
    labels = {"addr": ("hex", ev["addr"]), "dst": ("int", ev["dst"]), "cmd_id": ("int", ev["cmd_id"]),
              "priority": ("int", ev["priority"]), "exec_id": ("int", ev["exec_id"]),
              "status": ("str", np.array(status_names, dtype=_STR)[status]), "latency_ns": ("int", latency)}
    return _Events("command", ev["pid"], np.zeros(len(ev), np.int64), [("umctl commands", _SORT_COMMANDS)],
                   code, [o.name.lower() for o in Op] + ["other command"], ev["t_ns"], ev["t_ns"],
                   sums={"bytes": ev["bytes"]}, labels=labels)


# -- fault-rate counters --------------------------------------------------------------------

@dataclass
class _Counter:
    """Faults per ms of each (pid, GPU), one value per non-empty bin plus a zero after each
    run of non-empty bins so the graph drops to zero in gaps."""

    pid: np.ndarray
    gpu: np.ndarray
    t: np.ndarray  # bin start, ns
    rate: np.ndarray  # faults per ms

    @classmethod
    def build(cls, faults: np.ndarray, t0: int, width_ns: int) -> "_Counter":
        if len(faults) == 0:
            z = np.zeros(0, np.int64)
            return cls(z, z, z, np.zeros(0))
        series = _key(faults["pid"], faults["gpu"])
        b = (faults["t_ns"] - t0) // width_ns
        key, first, n = np.unique(series * (int(b.max()) + 2) + b, return_index=True, return_counts=True)
        pid, gpu, b = faults["pid"][first].astype(np.int64), faults["gpu"][first].astype(np.int64), b[first]
        gap_after = np.r_[key[1:] != key[:-1] + 1, True]
        pid = np.r_[pid, pid[gap_after]]
        gpu = np.r_[gpu, gpu[gap_after]]
        b = np.r_[b, b[gap_after] + 1]
        rate = np.r_[n / (width_ns / _NS_PER_MS), np.zeros(int(gap_after.sum()))]
        order = np.lexsort((b, _key(pid, gpu)))
        return cls(pid[order], gpu[order], t0 + b[order] * width_ns, rate[order])

    def __len__(self) -> int:
        return len(self.t)

    def format(self, lo: int, hi: int, t0: int) -> str:
        lines = _cat('{"ph":"C","name":"GPU ', _num(self.gpu[lo:hi]), ' faults/ms","pid":', _num(self.pid[lo:hi]),
                     ',"ts":', _us(self.t[lo:hi] - t0), ',"args":{"faults":', _num(np.round(self.rate[lo:hi], 3)),
                     "}}")
        return ",\n".join(lines.tolist())


# -- assembling -----------------------------------------------------------------------------

def _budgets(sizes: dict[str, int], floors: dict[str, int], max_events: int) -> dict[str, int]:
    """Share max_events among categories: small ones keep everything, the rest split what is
    left evenly (water filling), so one flood of migrations cannot push out the kernels."""
    out: dict[str, int] = {}
    left, pending = max_events, sorted(sizes, key=sizes.__getitem__)
    while pending:
        share = max(left // len(pending), 0)
        cat = pending.pop(0)
        out[cat] = sizes[cat] if sizes[cat] <= share else max(share, floors[cat])
        left -= out[cat]
    return out


def _clip_overlaps(cats: list[_Events], tids: list[np.ndarray]) -> int:
    """Cut each slice at the next slice's start on its thread (see module doc); returns how
    many were cut."""
    pid = np.concatenate([e.pid for e in cats]).astype(np.int64)
    tid = np.concatenate(tids)
    start = np.concatenate([e.start for e in cats])
    end = np.concatenate([e.end for e in cats])
    is_x = end > start
    order = np.flatnonzero(is_x)
    track = _key(pid[order], tid[order])
    sub = np.lexsort((end[order], start[order], track))
    order, track = order[sub], track[sub]
    same = track[1:] == track[:-1]
    new_end = end.copy()
    nxt = start[order][1:]
    cut = same & (end[order][:-1] > nxt)
    new_end[order[:-1][cut]] = nxt[cut]
    offset = 0
    for e in cats:
        n = len(e)
        if (new_end[offset:offset + n] != e.end).any():
            e.true_end = e.end
            e.end = new_end[offset:offset + n]
        offset += n
    return int(cut.sum())


def export_perfetto(trace: Trace, out_path: str | os.PathLike, max_events: int = 2_000_000) -> dict:
    """Write ``trace`` as trace-event JSON to ``out_path`` (via ``<out_path>.partial``) and
    return a summary: events written per category, whether and how they were aggregated."""
    kernels = _kernels(trace)
    faults = trace.events(Kind.FAULT)
    default_pid = int(kernels.pid.min()) if len(kernels) else 0
    builders = [kernels, _fault_batches(faults, trace.events(Kind.REPLAY), default_pid), _migrations(trace),
                _copies(trace), _evictions(trace), _thrashing(trace), _cpu_faults(trace), _commands(trace)]
    cats = [e for e in builders if len(e)]
    t0 = min([int(e.start.min()) for e in cats] + ([int(faults["t_ns"].min())] if len(faults) else []), default=0)
    counter = _Counter.build(faults, t0, _NS_PER_MS)

    sizes = {e.category: len(e) for e in cats}
    floors = {e.category: e.n_groups() for e in cats}
    if len(counter):
        sizes["fault_rate"] = len(counter)
        floors["fault_rate"] = 2 * len(np.unique(_key(counter.pid, counter.gpu)))
    budgets = _budgets(sizes, floors, max_events) if sum(sizes.values()) > max_events else dict(sizes)
    summary_cats: dict[str, dict] = {}
    for i, e in enumerate(cats):
        k = 1
        if budgets[e.category] < len(e):
            room = budgets[e.category] - floors[e.category]
            k = len(e) if room <= 0 else math.ceil(len(e) / room)
            cats[i] = e.merged(k)
        summary_cats[e.category] = {"source": len(e), "written": len(cats[i]), "aggregated": k > 1, "group": k}
    if len(counter):
        width, span = _NS_PER_MS, int(counter.t.max() - t0) + _NS_PER_MS
        while len(counter) > budgets["fault_rate"] and width < span:
            width *= max(2, math.ceil(len(counter) / max(budgets["fault_rate"], 1)))
            counter = _Counter.build(faults, t0, width)
        summary_cats["fault_rate"] = {"source": sizes["fault_rate"], "written": len(counter),
                                      "aggregated": width > _NS_PER_MS, "bin_ms": width / _NS_PER_MS}

    registry: dict[tuple[int, str], tuple[int, int]] = {}  # (pid, thread name) -> (tid, sort index)
    tids = []
    for e in cats:
        _, first, inv = np.unique(_key(e.pid, e.track), return_index=True, return_inverse=True)
        tid_of_pair = np.empty(len(first), dtype=np.int64)
        for j, (pid, tr) in enumerate(zip(e.pid[first].tolist(), e.track[first].tolist())):
            name, sort = e.tracks[tr]
            tid_of_pair[j] = registry.setdefault((pid, name), (len(registry) + 1, sort))[0]
        tids.append(tid_of_pair[inv.reshape(-1)])
    clipped = _clip_overlaps(cats, tids) if cats else 0

    out_path = Path(out_path)
    partial = out_path.with_name(out_path.name + ".partial")
    written = 0
    try:
        with open(partial, "w", encoding="utf-8") as f:
            f.write('{"displayTimeUnit":"ns","traceEvents":[\n')
            first = True

            def emit(text: str) -> None:
                nonlocal first
                if text:
                    f.write(text if first else ",\n" + text)
                    first = False

            for e, tid in zip(cats, tids):
                names_json = np.array([json.dumps(n) for n in e.names], dtype=_STR)
                for lo in range(0, len(e), _CHUNK):
                    emit(_format(e, names_json, lo, min(lo + _CHUNK, len(e)), tid, t0))
                written += len(e)
            for lo in range(0, len(counter), _CHUNK):
                emit(counter.format(lo, min(lo + _CHUNK, len(counter)), t0))
            written += len(counter)
            emit(_thread_metadata(registry, counter))
            summary = {"path": str(out_path), "events": written, "max_events": max_events,
                       "aggregated": any(c["aggregated"] for c in summary_cats.values()),
                       "clipped_overlaps": clipped, "threads": len(registry), "categories": summary_cats}
            _write_tail(f, trace, t0, summary)
        os.replace(partial, out_path)
    except OSError as e:
        partial.unlink(missing_ok=True)
        raise UmctlError(f"{out_path}: cannot write Perfetto trace ({e.strerror or e})") from e
    return summary


def _thread_metadata(registry: dict[tuple[int, str], tuple[int, int]], counter: _Counter) -> str:
    pids = sorted({p for p, _ in registry} | set(counter.pid.tolist()))
    lines = [json.dumps({"ph": "M", "name": "process_name", "pid": p, "args": {"name": f"pid {p}"}}) for p in pids]
    for (pid, name), (tid, sort) in registry.items():
        lines.append(json.dumps({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}))
        lines.append(json.dumps({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                                 "args": {"sort_index": sort}}))
    return ",\n".join(lines)


def _write_tail(f: TextIO, trace: Trace, t0: int, summary: dict) -> None:
    meta = dict(trace.meta)
    meta.update(source=str(trace.path), t0_ns=t0, export=summary)
    f.write("\n],\n\"metadata\":")
    f.write(json.dumps(meta, default=str))
    f.write("}\n")


class PerfettoReporter:
    """A trace as a Perfetto / Chrome timeline file (:func:`export_perfetto`); ``render``
    returns the export's summary (events and tracks written, what was merged)."""

    name = "perfetto"
    to_file = True

    def __init__(self, max_events: int = 2_000_000):
        self.max_events = max_events

    def render(self, result: Trace, out: str | os.PathLike) -> dict:
        return export_perfetto(result, out, max_events=self.max_events)
