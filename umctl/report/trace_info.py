"""What ``umctl trace info`` says about a trace file: :func:`summarize` builds the typed
:class:`~umctl.results.TraceInfo`, :class:`TraceInfoTableReporter` prints it (the ``json``
reporter is the common one)."""

from __future__ import annotations

from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from ..events.schema import KIND_BY_CODE, Cause, CopyKind, Kind
from ..events.trace import Trace
from ..results import EvictionTotals, TraceInfo
from ..units import CPU, format_bytes
from .base import Out

# Metadata keys shown in their own rows, in this order; any other key is listed after them.
_META_ROWS = (("schema_version", "schema version"), ("created", "created"), ("umctl_version", "umctl"),
              ("complete", "complete"), ("error", "error"), ("host", "host"), ("gpu", "GPU"),
              ("driver", "driver"), ("uvm_params", "UVM params"), ("command_line", "command line"),
              ("scenario", "scenario"), ("params", "parameters"), ("mode", "mode"), ("calibration", "calibration"))


def _by_cause(mask: np.ndarray, cause: np.ndarray, nbytes: np.ndarray) -> dict[str, int]:
    sums = np.bincount(np.minimum(cause[mask], len(Cause)), weights=nbytes[mask].astype(np.float64),
                       minlength=len(Cause) + 1)
    names = [c.name.lower() for c in Cause] + ["other cause"]
    return {names[i]: int(v) for i, v in enumerate(sums) if v}


def summarize(trace: Trace) -> TraceInfo:
    """What ``umctl trace info`` shows. H2D is data moved from the CPU to a GPU, D2H from a
    GPU to the CPU, P2P between GPUs."""
    counts = trace.counts()
    t0, t1 = trace.time_span_ns()
    faults = trace.events(Kind.FAULT)
    if counts[Kind.REPLAY]:
        batches = counts[Kind.REPLAY]
    else:
        batches = len(np.unique(np.stack([faults["gpu"].astype(np.int64), faults["batch_id"]]), axis=1)[0]) \
            if len(faults) else 0
    mig = trace.events(Kind.MIGRATION)
    src, dst = mig["src"], mig["dst"]
    h2d = (src == CPU) & (dst >= 0)
    d2h = (src >= 0) & (dst == CPU)
    p2p = (src >= 0) & (dst >= 0)
    copies = trace.events(Kind.COPY)
    ev = trace.events(Kind.EVICTION)
    drops = trace.events(Kind.DROPS)
    dropped: dict[str, int] = {}
    for code, n in zip(drops["kind"].tolist(), drops["count"].tolist()):
        name = KIND_BY_CODE[code].value if code in KIND_BY_CODE else f"kind {code}"
        dropped[name] = dropped.get(name, 0) + int(n)
    return TraceInfo(
        file=str(trace.path),
        # False for a recording that was interrupted or failed (kept as NAME.partial): its
        # events stop at that point, and a replay of it is a replay of part of the run
        complete=trace.meta.get("complete") is not False,
        meta=trace.meta,
        kernel_names=len(trace.names),
        events={k.value: n for k, n in counts.items() if n},
        total_events=sum(counts.values()),
        time_span_ns=(t0, t1),
        duration_ns=t1 - t0,
        gpu_faults=counts[Kind.FAULT],
        fault_batches=batches,
        migrated_bytes={
            "H2D": _by_cause(h2d, mig["cause"], mig["bytes"]),
            "D2H": _by_cause(d2h, mig["cause"], mig["bytes"]),
            "P2P": _by_cause(p2p, mig["cause"], mig["bytes"]),
        },
        copied_bytes={k.name: int(copies["bytes"][copies["kind"] == k].sum()) for k in CopyKind
                      if (copies["kind"] == k).any()},
        evictions=EvictionTotals(count=len(ev), bytes_written=int(ev["bytes_written"].sum()),
                                 pages=int(ev["pages"].sum()), critical=int(ev["critical"].sum())),
        dropped_events=dropped,
    )


def _text(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={_text(v)}" for k, v in value.items())
    if isinstance(value, list):
        return "; ".join(_text(v) for v in value)
    return str(value)


def _meta_text(key: str, value: Any) -> str:
    if key == "gpu" and isinstance(value, list):
        return "; ".join(f"{g.get('index', i)}: {g.get('name')}"
                         + (f", {format_bytes(g['memory_bytes'])}" if isinstance(g.get("memory_bytes"), int) else "")
                         for i, g in enumerate(value) if isinstance(g, dict))
    if key == "uvm_params" and isinstance(value, dict):
        # The driver has ~50 parameters; the uvm_perf_* ones shape paging behaviour.
        perf = {k.removeprefix("uvm_"): v for k, v in value.items() if k.startswith("uvm_perf_")}
        rest = len(value) - len(perf)
        return _text(perf) + (f" (+{rest} more with --json)" if rest else "")
    return _text(value)


def _print_info(s: TraceInfo, console: Console) -> None:
    meta = dict(s.meta)
    if not s.complete:
        why = meta.get("error") or "the recording did not finish"
        console.print(f"[bold yellow]INCOMPLETE trace[/bold yellow] ({why}): its events stop where the "
                      "recording stopped; a replay of it covers only that part of the run", soft_wrap=True)
    t = Table(title=s.file, title_justify="left", show_header=False, box=None)
    t.add_column(style="bold")
    t.add_column(overflow="fold")
    for key, label in _META_ROWS:
        if key in meta:
            t.add_row(label, _meta_text(key, meta.pop(key)))
    for key, value in meta.items():
        t.add_row(key, _text(value))
    console.print(t)

    counts = Table(title="events", title_justify="left", header_style="bold")
    counts.add_column("kind")
    counts.add_column("count", justify="right")
    for kind, n in s.events.items():
        counts.add_row(kind, f"{n:,}")
    counts.add_row("total", f"{s.total_events:,}", style="bold")
    console.print(counts)

    t0, t1 = s.time_span_ns
    console.print(f"time span: {t0:,} .. {t1:,} ns ({s.duration_ns / 1e9:.6f} s)")
    console.print(f"GPU faults: {s.gpu_faults:,} in {s.fault_batches:,} batches")
    mig = Table(title="bytes migrated", title_justify="left", header_style="bold")
    mig.add_column("cause")
    directions = list(s.migrated_bytes)
    for d in directions:
        mig.add_column(d, justify="right")
    causes = sorted({c for d in directions for c in s.migrated_bytes[d]})
    for c in causes:
        mig.add_row(c, *(format_bytes(s.migrated_bytes[d].get(c, 0)) for d in directions))
    if causes:
        console.print(mig)
    else:
        console.print("bytes migrated: none")
    for kind, n in s.copied_bytes.items():
        console.print(f"copies {kind}: {format_bytes(n)}")
    e = s.evictions
    console.print(f"evictions: {e.count:,} ({format_bytes(e.bytes_written)} written back, "
                  f"{e.critical:,} critical)")
    if s.dropped_events:
        lost = ", ".join(f"{k} {n:,}" for k, n in s.dropped_events.items())
        console.print(f"[yellow]events dropped by the source: {lost}[/yellow]")


class TraceInfoTableReporter:
    """A trace's summary as text: incomplete warning, header rows, events by kind, time span,
    faults, bytes migrated by cause and direction, copies, evictions, drops."""

    name = "table"
    to_file = False

    def render(self, result: TraceInfo, out: Out) -> None:
        _print_info(result, out if isinstance(out, Console) else Console(file=out, highlight=False))
