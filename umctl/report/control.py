"""Why a controlled run still faulted: each faulted 2 MiB block of a trace with COMMAND and
RESULT records, classified by the last thing umctl did to that block before the fault.

A controller that prefetches well removes faults; when it does not, the causes differ and so
do the fixes: a prefetch that was issued but had not finished (late: the controller trails the
GPU, or its queue is long), a block evicted (by the budget keeper or by the controller's own
pre-eviction) and not brought back before its use, a block umctl prefetched and the driver
evicted or never mapped, or a block umctl never touched. ``umctl trace control FILE`` prints it.

Definitions (t = the fault's timestamp; a "fault" is one block per fault batch, the unit
DeepUM's tables see); the class is that of the block's last command submitted before t:
- ``late``: a PREFETCH that had not completed at t;
- ``prefetched, resident``: a PREFETCH completed before t: the driver evicted the block or never
  mapped those pages;
- ``evicted by the budget``: a PREEVICT from the budget keeper (priority 0): the block was
  needed again before anything brought it back;
- ``evicted by the controller``: the controller's own PREEVICT or INVALIDATE (priority 1);
- ``evicted by the sweep``: the budget keeper's periodic re-eviction of blocks it had sent
  away and not seen come back (PREEVICT priority 2, ``--budget-sweep``);
- ``never touched``: no command for the block before t.
Whether a prefetched block was then used cannot be seen: a use that does not fault leaves no
event. For evicted blocks the report gives how long after the eviction they faulted.

Its reporters: :class:`ControlTableReporter` (the text ``umctl trace control`` prints) and
:class:`ControlJsonReporter` (``--json``: :meth:`ControlReport.as_dict`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
from rich.console import Console
from rich.table import Table

from ..events.schema import Kind, Op, fault_block_firsts
from ..loop.residency import SWEEP_PRIORITY
from ..results import ControlAnalysis
from ..units import BLOCK_SHIFT, BLOCK_SIZE

CLASSES = ("late", "prefetched, resident", "evicted by the budget", "evicted by the controller",
           "evicted by the sweep", "never touched")


@dataclass
class ControlReport:
    fault_blocks: int = 0
    classes: dict[str, int] = field(default_factory=lambda: {c: 0 for c in CLASSES})
    #: late prefetches: submitted this long before the fault, completed this long after (ms, p50/p90)
    late_submitted_before_ms: list[float] = field(default_factory=list)
    late_completed_after_ms: list[float] = field(default_factory=list)
    #: submission -> completion of every prefetch (queueing + ioctl), ms p50/p90
    prefetch_turnaround_ms: list[float] = field(default_factory=list)
    #: evicted blocks: eviction -> the fault that wanted them back (ms, p50/p90)
    evicted_refault_ms: list[float] = field(default_factory=list)
    #: faults whose use the controller had predicted: a prefetch of priority >= 1 (not the
    #: completion of a fault) since the block's previous use (see _predicted); the rest are
    #: prediction misses, whatever happened to the block meanwhile
    predicted: int = 0
    commands: dict[str, int] = field(default_factory=dict)

    def result(self) -> ControlAnalysis:
        """The typed, versioned form (``--json``); call after :func:`analyze` has reduced the
        timings to [p50, p90]."""
        return ControlAnalysis(fault_blocks=self.fault_blocks, classes=dict(self.classes),
                               late_submitted_before_ms_p50_p90=self.late_submitted_before_ms,
                               late_completed_after_ms_p50_p90=self.late_completed_after_ms,
                               prefetch_turnaround_ms_p50_p90=self.prefetch_turnaround_ms,
                               evicted_refault_ms_p50_p90=self.evicted_refault_ms,
                               predicted_since_previous_fault=self.predicted, commands=dict(self.commands))

    def as_dict(self) -> dict:
        """:meth:`result`'s fields as a dict (no ``schema`` key)."""
        d = self.result().to_json()
        d.pop("schema")
        return d


def _p50_p90(v: list[float]) -> list[float]:
    return [round(float(np.percentile(v, 50)), 3), round(float(np.percentile(v, 90)), 3)] if v else []


def _fault_blocks(faults: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct blocks per fault batch at the batch's first fault on them, in time order."""
    if not len(faults):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    blocks, first = fault_block_firsts(faults)
    fb, ft = blocks[first], faults["t_ns"][first].astype(np.int64)
    order = np.argsort(ft, kind="stable")
    return fb[order], ft[order]


def _predicted(before: list, fault_times: list[int], t: int) -> bool:
    """Did the controller prefetch this block for the use that faulted at t? The use's window
    opens at the block's previous use: its last fault before its last eviction before t (or
    its last fault before t, when it was never evicted). A prefetch of priority >= 1 (a
    prediction, not the completion of a fault) inside the window counts, even if the block
    was evicted again after it."""
    evictions = [ts for ts, op, _, _ in before if op != Op.PREFETCH]
    until = evictions[-1] if evictions else t
    prev = [f for f in fault_times if f < until]
    start = prev[-1] if prev else -1
    return any(op == Op.PREFETCH and prio >= 1 and ts > start for ts, op, _, prio in before)


def analyze(faults: np.ndarray, cmds: np.ndarray, results: np.ndarray, *, since_ns: int | None = None) -> ControlReport:
    """Classify the faulted blocks (after ``since_ns``, e.g. past a warm-up) by the last
    command for the same block submitted before them."""
    rep = ControlReport()
    done_at = dict(zip(results["cmd_id"].tolist(), results["t_ns"].tolist())) if len(results) else {}
    # per block, its commands in submission order: (t_submit, op, t_done or None, priority)
    per_block: dict[int, list[tuple[int, int, int | None, int]]] = {}
    for c in cmds[np.argsort(cmds["t_ns"], kind="stable")] if len(cmds) else ():
        op = int(c["op"])
        if op not in (Op.PREFETCH, Op.PREEVICT, Op.INVALIDATE):
            continue
        name = Op(op).name.lower()
        rep.commands[name] = rep.commands.get(name, 0) + 1
        t_done = done_at.get(int(c["cmd_id"]))
        if op == Op.PREFETCH and t_done is not None:
            rep.prefetch_turnaround_ms.append((t_done - int(c["t_ns"])) / 1e6)
        if op == Op.INVALIDATE and int(c["bytes"]) < BLOCK_SIZE:
            continue   # a partial discard leaves the block's other pages where they were
        b0 = int(c["addr"]) >> BLOCK_SHIFT
        b1 = (int(c["addr"]) + max(int(c["bytes"]), 1) - 1) >> BLOCK_SHIFT
        for b in range(b0, b1 + 1):
            per_block.setdefault(b, []).append((int(c["t_ns"]), op, t_done, int(c["priority"])))
    times = {b: np.array([x[0] for x in v], np.int64) for b, v in per_block.items()}
    fb, ft = _fault_blocks(faults)
    faults_of: dict[int, list[int]] = {}
    for b, t in zip(fb.tolist(), ft.tolist()):
        faults_of.setdefault(b, []).append(t)
    for b, t in zip(fb.tolist(), ft.tolist()):
        if since_ns is not None and t < since_ns:
            continue
        rep.fault_blocks += 1
        hist = per_block.get(b)
        k = int(np.searchsorted(times[b], t, side="right")) if hist else 0
        if k and _predicted(hist[:k], faults_of[b], t):
            rep.predicted += 1
        if not k:
            rep.classes["never touched"] += 1
            continue
        ts, op, td, prio = hist[k - 1]
        if op == Op.PREFETCH:
            if td is None or td > t:
                rep.classes["late"] += 1
                rep.late_submitted_before_ms.append((t - ts) / 1e6)
                if td is not None:
                    rep.late_completed_after_ms.append((td - t) / 1e6)
            else:
                rep.classes["prefetched, resident"] += 1
        else:
            rep.classes["evicted by the budget" if prio == 0 else
                        "evicted by the sweep" if prio == SWEEP_PRIORITY and op == Op.PREEVICT else
                        "evicted by the controller"] += 1
            rep.evicted_refault_ms.append((t - ts) / 1e6)
    rep.late_submitted_before_ms = _p50_p90(rep.late_submitted_before_ms)
    rep.late_completed_after_ms = _p50_p90(rep.late_completed_after_ms)
    rep.prefetch_turnaround_ms = _p50_p90(rep.prefetch_turnaround_ms)
    rep.evicted_refault_ms = _p50_p90(rep.evicted_refault_ms)
    return rep


def from_trace(trace, *, skip_s: float = 0.0) -> ControlReport:
    """:func:`analyze` on a trace file's events, leaving out the first ``skip_s`` seconds."""
    f = trace.events(Kind.FAULT)
    since = None
    if skip_s > 0 and len(f):
        since = int(f["t_ns"].min()) + int(skip_s * 1e9)
    return analyze(f, trace.events(Kind.COMMAND), trace.events(Kind.RESULT), since_ns=since)


class ControlTableReporter:
    """The classes of a :class:`ControlReport` as a table (blocks and shares), then the
    prediction rate, the commands, and the prefetch / eviction timings. ``title`` names the
    trace; ``skip_s`` the warm-up left out (said in the title)."""

    name = "table"
    to_file = False

    def __init__(self, title: str = "", skip_s: float = 0.0):
        self.title, self.skip_s = title, skip_s

    def render(self, result: ControlReport, out) -> None:
        rep, skip = result, self.skip_s
        console = out if isinstance(out, Console) else Console(file=out, highlight=False)
        t = Table(title=f"{self.title}: {rep.fault_blocks:,} faulted blocks (one per block per fault batch)"
                  + (f" after the first {skip:g} s" if skip else ""))
        t.add_column("umctl's last command for the block")
        t.add_column("blocks", justify="right")
        t.add_column("share", justify="right")
        for c in CLASSES:
            n = rep.classes[c]
            t.add_row(c, f"{n:,}", f"{100 * n / max(rep.fault_blocks, 1):.1f} %")
        console.print(t)
        console.print(f"faults whose use the controller had predicted (prefetched since the block's previous use): "
                      f"{rep.predicted:,} ({100 * rep.predicted / max(rep.fault_blocks, 1):.1f} %); "
                      "the rest it did not predict")
        cmds = ", ".join(f"{k} {v:,}" for k, v in rep.commands.items())
        console.print(f"commands: {cmds or 'none'}")
        if rep.prefetch_turnaround_ms:
            console.print(f"prefetch submitted -> completed: p50 {rep.prefetch_turnaround_ms[0]} ms, "
                          f"p90 {rep.prefetch_turnaround_ms[1]} ms")
        if rep.late_submitted_before_ms:
            msg = (f"late prefetches: submitted p50 {rep.late_submitted_before_ms[0]} ms before the fault"
                   + (f", completed p50 {rep.late_completed_after_ms[0]} ms after it"
                      if rep.late_completed_after_ms else ""))
            console.print(msg)
        if rep.evicted_refault_ms:
            console.print(f"evicted blocks faulted again p50 {rep.evicted_refault_ms[0]} ms, "
                          f"p90 {rep.evicted_refault_ms[1]} ms after their eviction")


class ControlJsonReporter:
    """A :class:`ControlReport` as its versioned JSON document (:meth:`ControlReport.result`)."""

    name = "json"
    to_file = False

    def __init__(self, title: str = "", skip_s: float = 0.0):
        pass   # the JSON carries no title; the same options as the table's, so a caller need not tell

    def render(self, result: ControlReport, out) -> None:
        stream = getattr(out, "file", out) if hasattr(out, "print") else out
        stream.write(json.dumps(result.result().to_json(), indent=2) + "\n")
        stream.flush()
