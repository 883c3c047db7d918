"""How a live session's totals read as text: the summary ``umctl attach / run / record`` print
at the end (the ``table`` reporter of a :class:`~umctl.results.SessionSummary`), and the
pieces every view of a process's totals shares.

One rendering path: every view reads a :class:`~umctl.results.LiveTotals` (``LiveStats.
snapshot()``; a session's summary holds one), never the running statistics' internals, and
what two views both show -- the sampled-estimate mark, the sampling note, the top kernels and
blocks -- is written by one function here.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console

from ..results import ControlStats, LiveTotals, SessionSummary
from ..units import format_bytes
from .base import Out


def estimate_mark(t: LiveTotals) -> str:
    """``~`` before a total that is an estimate (sampled), else nothing."""
    return "~" if t.sample < 1 else ""


def sampled_tag(t: LiveTotals) -> str:
    """`` (events sampled N% of the time)`` when sampled, else nothing."""
    return f" (events sampled {100 * t.sample:.0f}% of the time)" if t.sample < 1 else ""


def top_kernels_text(t: LiveTotals, n: int = 3, *, width: int | None = None, count=lambda c: f"{c:,}") -> str:
    """The ``n`` kernels with the most faults: ``name count, ...`` (names cut at ``width``)."""
    return ", ".join(f"{name[:width] if width else name} {count(c)}" for name, c in t.top_kernels[:n])


def top_blocks_text(t: LiveTotals, n: int = 3, *, count=lambda c: f"{c:,}") -> str:
    """The ``n`` 2 MiB blocks with the most faults: ``0xaddr count, ...``."""
    return ", ".join(f"{addr} {count(c)}" for addr, c in t.top_blocks[:n])


def summary_lines(s: SessionSummary) -> list[str]:
    """The observation part of the end-of-session summary: faults, bytes each way (by cause
    when migration events were on), thrashing, launches, drops, lags, the attachment, the
    trace."""
    t, st = s.summary, s.source
    el = max(st.get("elapsed_s", 0.0), 1e-9)
    est = estimate_mark(t)   # sampled: every total is an estimate
    lines = [f"umctl {s.command}: pid {t.pid} ({t.comm}) observed {el:.1f} s, detached ({s.end})",
             f"  GPU faults   {est}{t.faults:,} in {est}{t.batches:,} batches "
             f"({est}{t.faults / el:,.0f}/s)", f"  CPU faults   {est}{t.cpu_faults:,}"]
    if t.sample < 1:
        lines.append(f"  sampling     events and counters collected {100 * t.sample:.1f}% of the time (--sample): "
                     "totals are estimates scaled by that, top kernels/blocks ranked from the sample")
    if t.have_migrations:
        def causes(d: dict) -> str:
            return ", ".join(f"{k} {format_bytes(v)}" for k, v in d.items() if v)
        lines.append(f"  H2D          {est}{format_bytes(t.h2d_total)} ({causes(t.h2d) or '-'})")
        lines.append(f"  D2H          {est}{format_bytes(t.d2h_total)} ({causes(t.d2h) or '-'})")
    elif t.counters:
        lines.append(f"  H2D          {est}{format_bytes(t.h2d_total)} (prefetch {format_bytes(t.counter('prefetch_bytes_htd'))};"
                     " --kinds +migrations splits by cause)")
        lines.append(f"  D2H          {est}{format_bytes(t.d2h_total)}")
    lines.append(f"  thrashing    {est}{t.thrashing:,}")
    if t.launches:
        lines.append(f"  launches     {t.launches:,}; top kernels by faults: {top_kernels_text(t)}")
    lines.append(f"  dropped      {t.dropped:,} events")
    lr, ld = st.get("lag_ring_ms", {}), st.get("lag_delivery_ms", {})
    if lr.get("p50") is not None:
        lines.append(f"  lag          event -> drained p50 {lr['p50']:.2f} ms, p99 {lr['p99']:.2f} ms; "
                     f"-> delivered p50 {ld['p50']:.2f} ms, p99 {ld['p99']:.2f} ms")
    lm = st.get("lag_migration_ms", {})
    if lm.get("n"):
        lines.append(f"  lag (migr.)  end -> drained p50 {lm['p50']:.2f} ms, p99 {lm['p99']:.2f} ms")
    lines.append(f"  attach       {st.get('attach_ms', 0):.1f} ms, kinds {st.get('kinds')}, ring {st.get('ring_entries') or 0:,} "
                 f"entries (max fill {100 * (st.get('ring_max_fill') or 0):.1f} %), "
                 + (f"flush every {st.get('flush_ms'):g} ms" if st.get('flush_ms') else "no flush"))
    if st.get("trace"):
        lines.append(f"  trace        {st['trace']} ({st.get('trace_events') or 0:,} events)")
    return lines


def control_lines(c: ControlStats | None) -> list[tuple[str, bool]]:
    """The control part of the summary (none for a session that only observed): commands and
    what they did, the actuator's latencies and errors, invalidation, the budget and its check.
    Each line with whether it is printed soft-wrapped (left whole) or wrapped at the width."""
    if c is None:
        return []
    a: dict[str, Any] = c.actuator
    n = a["counts"]
    moved = ", ".join(f"{k} {format_bytes(v)}" for k, v in a["bytes"].items() if v) or "nothing"
    lines = [(f"  control      mode {c.mode}: {c.commands:,} commands -> {n['ioctls']:,} ioctls "
             f"({n['ok']:,} ok, {n['failed']:,} failed, {n['target_gone']:,} after exit, {n['superseded']:,} superseded, "
             f"{n['dropped']:,} dropped); moved {moved}; controller {c.controller_ms:.0f} ms", True)]
    lat = [f"{k} {a['latency_ms'][k] / max(1, a['bytes'][k] / (2 << 20)):.2f} ms/2MiB"
           for k in ("prefetch", "preevict") if a["bytes"].get(k)]
    if lat:
        lines.append(("  actuator     " + ", ".join(lat), False))
    if a["errors"]:
        lines.append(("  errors       " + ", ".join(f"{k} x{v}" for k, v in a["errors"].items()), False))
    cs = c.controller or {}
    why = cs.get("invalidate_off_live")
    if why:
        reason = ("off (-O deepum.live_invalidate=false)" if why == "option" else
                  "off: only umctl's runtime (umctl run --runtime) can order a discard with the program's stream "
                  "and its allocator")
        lines.append((f"  note         invalidation is {reason}; {cs.get('kept_not_invalidated', 0):,} victims in "
                      "freed allocator blocks were pre-evicted instead", True))
    inv = a.get("invalidator")
    if inv and inv["requests"]:
        kept = ", ".join(f"{k} {format_bytes(v)}" for k, v in inv["kept_bytes"].items() if v) or "nothing"
        lines.append((f"  invalidate   by the runtime: {inv['requests']:,} requests, "
                      f"{format_bytes(inv['discarded_bytes'])} dropped; kept and pre-evicted: {kept}"
                      + (f"; {inv['unanswered']:,} unanswered" if inv["unanswered"] else ""), True))
    b = c.budget
    if b:
        lines.append((f"  budget       {format_bytes(b['bytes'])}: peak estimate {format_bytes(b['peak_estimate_bytes'])} "
                      f"({format_bytes(b['peak_before_enforcement_bytes'])} within a control period), "
                      f"{b['overflow_blocks_evicted']:,} blocks evicted on overflow to "
                      f"{', '.join('CPU' if d < 0 else f'GPU {d}' for d in b['dst'])}"
                      + (f"; swept {b['swept_blocks']:,} blocks (every {b['sweep_ms']:g} ms)" if b.get("sweep_ms") else ""),
                      False))
        if b.get("hold") == "admit":
            lines.append((f"  admission    {b['admitted_blocks']:,} demanded blocks admitted, {b['room_evictions']:,} "
                          f"evicted to make room, {b['deferred_prefetches']:,} predictions deferred for want of room "
                          "(managed memory host-preferred: misses are read over the link)", True))
    if c.budget_check:
        lines.append((budget_check_line(c.budget_check), True))
    return lines


def budget_check_line(v: dict) -> str:
    """The budget check's verdict (umctl/loop/budget_check.py): true residency from the driver's
    migration events beside the keeper's estimate; 'budget NOT held' stands out (rich markup)."""
    lim = format_bytes(v["budget_bytes"] + v["slack_bytes"])
    head = "  budget check "
    if v["held"] is None:
        return (f"{head}on: budget unverified ({v['why']}); true peak {format_bytes(v['true_peak_bytes'])} "
                f"from what was seen")
    true = (f"true peak {format_bytes(v['true_peak_bytes'])} in 2 MiB blocks ({format_bytes(v['true_peak_page_bytes'])} "
            f"in pages) vs estimate {format_bytes(v['estimate_peak_bytes'] or 0)}; above {lim} (budget + slack) "
            f"{100 * v['time_over_frac']:.1f} % of {v['observed_s']:.1f} s")
    if v["held"]:
        return f"{head}on: budget held; {true} ({v['migrations_seen']:,} migration events)"
    why = ""
    if v.get("partial_blocks"):
        # what makes blocks exceed pages: first touches counted from faults, late records
        why = (f"; {v['partial_blocks']:,} blocks partly resident at the end, {v.get('fault_arrivals', 0):,} faults "
               f"counted as first touches, {v.get('late_records', 0):,} late records")
    return (f"{head}on: [bold red]budget NOT held[/bold red]: {true}, by up to {format_bytes(v['over_peak_bytes'])} "
            f"({v['over_gib_s']:.2f} GiB·s over){why}")


class SessionTextReporter:
    """The end-of-session summary as text lines (:func:`summary_lines`, then
    :func:`control_lines`)."""

    name = "table"
    to_file = False

    def render(self, result: SessionSummary, out: Out) -> None:
        console = out if isinstance(out, Console) else Console(file=out, width=160)
        for ln in summary_lines(result):
            console.print(ln, highlight=False, soft_wrap=True)
        for ln, whole in control_lines(result.control):
            console.print(ln, highlight=False, soft_wrap=whole)
