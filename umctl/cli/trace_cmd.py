"""``umctl trace``: look inside trace files and export them for viewing.

Errors are raised as UmctlError/TraceError and reported by ``umctl.cli.main`` as one line.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from .. import UmctlError
from ..events.schema import Kind
from ..events.trace import read_trace
from ..report.base import get_reporter
from ..report.trace_info import summarize  # noqa: F401 - `umctl trace info`'s summary, also for scripts

app = typer.Typer(
    help="Inspect and export trace files.\n\nExample: [bold]umctl trace info run.parquet[/bold]",
    no_args_is_help=True,
    rich_markup_mode="rich",
)


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
        get_reporter("trace-info", "json").render(s, sys.stdout)
    else:
        get_reporter("trace-info", "table").render(s, Console(highlight=False))


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
    from ..report.control import from_trace

    if not (0 <= skip <= 1e6):   # nan fails both comparisons; no trace is 11 days long
        raise UmctlError(f"--skip must be between 0 and 1e6 seconds (got {skip:g})")

    with read_trace(file) as trace:
        if not trace.counts()[Kind.COMMAND]:
            raise UmctlError(f"{file}: no COMMAND records (record a controlled run: umctl attach/run --mode ... -o FILE)")
        rep = from_trace(trace, skip_s=skip)
    get_reporter("control", "json" if as_json else "table", title=str(file), skip_s=skip).render(
        rep, sys.stdout if as_json else Console(highlight=False))


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
    if perfetto is None:
        raise UmctlError("nothing to export: give an output, e.g. --perfetto out.json")
    with read_trace(file) as trace:
        s = get_reporter("trace", "perfetto", max_events=max_events).render(trace, perfetto)
    merged = [c for c, v in s["categories"].items() if v["aggregated"]]
    how = f", merged {', '.join(merged)} to stay under {max_events:,}" if merged else ""
    typer.echo(f"wrote {perfetto}: {s['events']:,} events on {s['threads']} tracks{how}; "
               "open it at ui.perfetto.dev")
