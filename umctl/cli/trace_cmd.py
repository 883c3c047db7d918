"""``umctl trace``: look inside trace files and export them for viewing.

Errors are raised as UmctlError/TraceError and reported by ``umctl.cli.main`` as one line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from .. import UmctlError
from ..events.schema import KIND_BY_CODE, Cause, CopyKind, Kind
from ..events.trace import Trace, read_trace
from ..units import CPU, format_bytes

app = typer.Typer(
    help="Inspect and export trace files.\n\nExample: [bold]umctl trace info run.parquet[/bold]",
    no_args_is_help=True,
    rich_markup_mode="rich",
)

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


def summarize(trace: Trace) -> dict[str, Any]:
    """What ``umctl trace info`` shows, as a JSON-able dict (also for reports). H2D is data
    moved from the CPU to a GPU, D2H from a GPU to the CPU, P2P between GPUs."""
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
    return {
        "file": str(trace.path),
        # False for a recording that was interrupted or failed (kept as NAME.partial): its
        # events stop at that point, and a replay of it is a replay of part of the run
        "complete": trace.meta.get("complete") is not False,
        "meta": trace.meta,
        "kernel_names": len(trace.names),
        "events": {k.value: n for k, n in counts.items() if n},
        "total_events": sum(counts.values()),
        "time_span_ns": [t0, t1],
        "duration_ns": t1 - t0,
        "gpu_faults": counts[Kind.FAULT],
        "fault_batches": batches,
        "migrated_bytes": {
            "H2D": _by_cause(h2d, mig["cause"], mig["bytes"]),
            "D2H": _by_cause(d2h, mig["cause"], mig["bytes"]),
            "P2P": _by_cause(p2p, mig["cause"], mig["bytes"]),
        },
        "copied_bytes": {k.name: int(copies["bytes"][copies["kind"] == k].sum()) for k in CopyKind
                         if (copies["kind"] == k).any()},
        "evictions": {"count": len(ev), "bytes_written": int(ev["bytes_written"].sum()),
                      "pages": int(ev["pages"].sum()), "critical": int(ev["critical"].sum())},
        "dropped_events": dropped,
    }


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


def _print_info(s: dict[str, Any], console: Console) -> None:
    meta = dict(s["meta"])
    if not s["complete"]:
        why = meta.get("error") or "the recording did not finish"
        console.print(f"[bold yellow]INCOMPLETE trace[/bold yellow] ({why}): its events stop where the "
                      "recording stopped; a replay of it covers only that part of the run", soft_wrap=True)
    t = Table(title=s["file"], title_justify="left", show_header=False, box=None)
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
    for kind, n in s["events"].items():
        counts.add_row(kind, f"{n:,}")
    counts.add_row("total", f"{s['total_events']:,}", style="bold")
    console.print(counts)

    t0, t1 = s["time_span_ns"]
    console.print(f"time span: {t0:,} .. {t1:,} ns ({s['duration_ns'] / 1e9:.6f} s)")
    console.print(f"GPU faults: {s['gpu_faults']:,} in {s['fault_batches']:,} batches")
    mig = Table(title="bytes migrated", title_justify="left", header_style="bold")
    mig.add_column("cause")
    directions = list(s["migrated_bytes"])
    for d in directions:
        mig.add_column(d, justify="right")
    causes = sorted({c for d in directions for c in s["migrated_bytes"][d]})
    for c in causes:
        mig.add_row(c, *(format_bytes(s["migrated_bytes"][d].get(c, 0)) for d in directions))
    if causes:
        console.print(mig)
    else:
        console.print("bytes migrated: none")
    for kind, n in s["copied_bytes"].items():
        console.print(f"copies {kind}: {format_bytes(n)}")
    e = s["evictions"]
    console.print(f"evictions: {e['count']:,} ({format_bytes(e['bytes_written'])} written back, "
                  f"{e['critical']:,} critical)")
    if s["dropped_events"]:
        lost = ", ".join(f"{k} {n:,}" for k, n in s["dropped_events"].items())
        console.print(f"[yellow]events dropped by the source: {lost}[/yellow]")


@app.command()
def info(
    file: Path = typer.Argument(..., help="Trace file (.parquet)."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Show a trace's metadata, event counts, faults, migrations and evictions.

    Example: [bold]umctl trace info run.parquet --json[/bold]
    """
    with read_trace(file) as trace:
        s = summarize(trace)
    if as_json:
        typer.echo(json.dumps(s, indent=2, default=str))
    else:
        _print_info(s, Console(highlight=False))


@app.command()
def control(
    file: Path = typer.Argument(..., help="Trace of a controlled run (umctl attach/run --mode ... -o FILE)."),
    skip: float = typer.Option(0.0, "--skip", help="Leave out the first SECONDS (warm-up, tables still learning)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Why a controlled run still faulted: each faulted block, by what umctl did to it before.

    Classes, by the block's last command before the fault: late (a prefetch still in flight),
    prefetched and resident (the driver's doing), evicted by the budget keeper, evicted by the
    controller, evicted by the budget's sweep (--budget-sweep), never touched.

    Example: [bold]umctl trace control run.parquet --skip 2[/bold]
    """
    from ..report.control import CLASSES, from_trace

    if not (0 <= skip <= 1e6):   # nan fails both comparisons; no trace is 11 days long
        raise UmctlError(f"--skip must be between 0 and 1e6 seconds (got {skip:g})")

    with read_trace(file) as trace:
        if not trace.counts()[Kind.COMMAND]:
            raise UmctlError(f"{file}: no COMMAND records (record a controlled run: umctl attach/run --mode ... -o FILE)")
        rep = from_trace(trace, skip_s=skip)
    if as_json:
        typer.echo(json.dumps(rep.as_dict(), indent=2))
        return
    console = Console(highlight=False)
    t = Table(title=f"{file}: {rep.fault_blocks:,} faulted blocks (one per block per fault batch)"
              + (f" after the first {skip:g} s" if skip else ""))
    t.add_column("umctl's last command for the block")
    t.add_column("blocks", justify="right")
    t.add_column("share", justify="right")
    for c in CLASSES:
        n = rep.classes[c]
        t.add_row(c, f"{n:,}", f"{100 * n / max(rep.fault_blocks, 1):.1f} %")
    console.print(t)
    console.print(f"faults whose use the controller had predicted (prefetched since the block's previous use): "
                  f"{rep.predicted:,} ({100 * rep.predicted / max(rep.fault_blocks, 1):.1f} %); the rest it did not predict")
    cmds = ", ".join(f"{k} {v:,}" for k, v in rep.commands.items())
    console.print(f"commands: {cmds or 'none'}")
    if rep.prefetch_turnaround_ms:
        console.print(f"prefetch submitted -> completed: p50 {rep.prefetch_turnaround_ms[0]} ms, "
                      f"p90 {rep.prefetch_turnaround_ms[1]} ms")
    if rep.late_submitted_before_ms:
        msg = (f"late prefetches: submitted p50 {rep.late_submitted_before_ms[0]} ms before the fault"
               + (f", completed p50 {rep.late_completed_after_ms[0]} ms after it" if rep.late_completed_after_ms else ""))
        console.print(msg)
    if rep.evicted_refault_ms:
        console.print(f"evicted blocks faulted again p50 {rep.evicted_refault_ms[0]} ms, "
                      f"p90 {rep.evicted_refault_ms[1]} ms after their eviction")


@app.command()
def export(
    file: Path = typer.Argument(..., help="Trace file (.parquet)."),
    perfetto: Optional[Path] = typer.Option(None, "--perfetto", help="Write Chrome/Perfetto trace-event JSON here."),
    max_events: int = typer.Option(2_000_000, "--max-events", min=1,
                                   help="Merge events beyond this many (the UI slows down past a few million)."),
) -> None:
    """Export a trace for a timeline viewer.

    Example: [bold]umctl trace export run.parquet --perfetto run.json[/bold]
    """
    from ..report.perfetto import export_perfetto

    if perfetto is None:
        raise UmctlError("nothing to export: give an output, e.g. --perfetto out.json")
    with read_trace(file) as trace:
        s = export_perfetto(trace, perfetto, max_events=max_events)
    merged = [c for c, v in s["categories"].items() if v["aggregated"]]
    how = f", merged {', '.join(merged)} to stay under {max_events:,}" if merged else ""
    typer.echo(f"wrote {perfetto}: {s['events']:,} events on {s['threads']} tracks{how}; "
               "open it at ui.perfetto.dev")
