"""The side-by-side replay table (rich): the ``table`` reporter of a replay."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from ..results import ReplayReport, ReplayResult
from ..units import format_bytes


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f} %"


def _si(n: float) -> str:
    n = float(n)
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n:.0f}"


def _time(ns: float) -> str:
    s = ns / 1e9
    return f"{s:.3f} s" if s >= 1 else f"{s * 1e3:.2f} ms"


def replay_table(rows: list[ReplayResult], title: str) -> Table:
    """The modes side by side: time, speedup, faults, traffic, evictions, prefetch figures;
    the fastest mode in green."""
    t = Table(title=title, title_justify="left", header_style="bold")
    t.add_column("mode", style="bold cyan", no_wrap=True)
    bound = any(r.pct_of_bound is not None for r in rows)
    for name in ("sim time", "speedup", *(("% of bound",) if bound else ()), "GPU faults", "batches", "H2D", "D2H",
                 "evictions", "pf accuracy", "pf coverage"):
        t.add_column(name, justify="right", no_wrap=True)
    best = min(r.time_ns for r in rows) if rows else 0
    for r in rows:
        style = "green" if r.time_ns == best and len(rows) > 1 else None
        t.add_row(
            r.mode, _time(r.time_ns), f"{r.speedup:.2f}×" if r.speedup else "—",
            *((f"{r.pct_of_bound:.0f} %" if r.pct_of_bound is not None else "—",) if bound else ()),
            _si(r.faults), _si(r.fault_batches), format_bytes(r.bytes_h2d),
            format_bytes(r.bytes_d2h), _si(r.evictions), _pct(r.prefetch_accuracy),
            _pct(r.prefetch_coverage), style=style,
        )
    return t


def budget_lines(rows: list[ReplayResult]) -> list[str]:
    """Under ``replay --budget``: per mode, what the loop's budget keeper evicted and the budget
    check's verdict, as a live session's summary says them; nothing without a budget."""
    from .live import budget_check_line

    out = []
    for r in rows:
        if r.budget is None:
            continue
        b = r.budget
        out.append(f"{r.mode}: soft budget {format_bytes(b['bytes'])} ({b['hold']}), peak estimate "
                   f"{format_bytes(b['peak_estimate_bytes'])}, keeper evicted {b['overflow_blocks_evicted']:,} blocks")
        if r.budget_check is not None:
            out.append(budget_check_line(r.budget_check))
    return out


#: column heads for the simulator's fault causes (umctl.sim.core.FAULT_CAUSES)
CAUSE_HEADS = {
    "cold": "first touch", "evicted": "evicted by driver", "evicted_for_prefetch": "evicted for a prefetch",
    "preevicted": "pre-evicted", "discarded": "discarded", "moved": "on another GPU", "host": "host wrote",
    "late_prefetch": "prefetch late", "in_flight": "copy in flight", "read_mostly_write": "read-mostly write",
}


def fault_cause_table(rows: list[ReplayResult]) -> Table | None:
    """Why each mode's GPU still faulted: every fault of the replay charged to one cause,
    the way the page had left the GPU or why it was not usable yet. Only causes some mode
    has are shown; None if no mode faulted."""
    causes = [c for c in CAUSE_HEADS if any((r.fault_causes or {}).get(c) for r in rows)]
    if not causes:
        return None
    t = Table(title="GPU faults by cause (share of the mode's faults)", title_justify="left", header_style="bold")
    t.add_column("mode", style="bold cyan", no_wrap=True)
    t.add_column("GPU faults", justify="right", no_wrap=True)
    for c in causes:
        t.add_column(CAUSE_HEADS[c], justify="right")
    for r in rows:
        fc = r.fault_causes or {}
        total = sum(fc.values())
        t.add_row(r.mode, _si(total), *(f"{_si(fc.get(c, 0))} ({100 * fc.get(c, 0) / total:.0f} %)"
                                           if total and fc.get(c) else "—" for c in causes))
    return t


class ReplayTableReporter:
    """A replay as text: the modes' table, the faults by cause (when any mode faulted) and a
    dim line naming the calibration and each mode's wall time."""

    name = "table"
    to_file = False

    def render(self, result: ReplayReport, out) -> None:
        console = out if isinstance(out, Console) else Console(file=out, width=160)
        rows = result.results
        console.print(replay_table(rows, result.title))
        causes = fault_cause_table(rows)
        if causes is not None:
            console.print(causes)
        for line in budget_lines(rows):
            console.print(line, highlight=False)
        walls = ", ".join(f"{r.mode} {r.wall_s:.2f}s" for r in rows)
        calib = rows[0].calibration if rows else ""
        console.print(f"[dim]UVM simulator, calibration {calib} ({result.calibration_from}); "
                      f"wall time: {walls}[/dim]")
