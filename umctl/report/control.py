"""Why a controlled run still faulted: each faulted 2 MiB block of a trace with COMMAND and
RESULT records, classified by what umctl had done to that block before the fault.

A controller that prefetches well removes faults; when it does not, the causes differ and so
do the fixes: a prefetch that was issued but had not finished (late: the controller trails the
GPU, or its queue is long), a prefetch that finished but umctl evicted the block again before
it was used (the budget or pre-eviction chose the wrong victim), a block umctl never
prefetched (the prediction missed it), or a block the driver took away by itself. This is the
live counterpart of the simulator's per-cause counters; ``umctl trace control FILE`` prints it.

Definitions (t = the fault's timestamp; a "fault" is one block per fault batch, the unit
DeepUM's tables see):
- ``late``: the last PREFETCH of the block before t had not completed at t;
- ``evicted after prefetch``: it had completed, and a PREEVICT/INVALIDATE of the block was
  submitted after that prefetch and before t;
- ``evicted, not prefetched back``: umctl evicted the block before t and issued no prefetch
  after that eviction (the budget keeper's or the controller's victim was needed again);
- ``prefetched, resident``: the last command was a completed prefetch and umctl did not evict
  it since: the driver evicted or never mapped those pages (or the fault is a first touch of
  pages the migration did not cover);
- ``never touched``: umctl issued no command for the block before t.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..events.schema import Kind, Op, Status
from ..units import BLOCK_SHIFT, BLOCK_SIZE

CLASSES = ("late", "evicted after prefetch", "evicted, not prefetched back", "prefetched, resident",
           "never touched")


@dataclass
class ControlReport:
    fault_blocks: int = 0
    classes: dict[str, int] = field(default_factory=lambda: {c: 0 for c in CLASSES})
    #: for late prefetches: how long before the fault it was submitted, and how long after the
    #: fault it completed (ms, percentiles 50/90)
    late_submitted_before_ms: list[float] = field(default_factory=list)
    late_completed_after_ms: list[float] = field(default_factory=list)
    #: submission -> completion of every prefetch (queueing + ioctl), ms p50/p90
    prefetch_turnaround_ms: list[float] = field(default_factory=list)
    commands: dict[str, int] = field(default_factory=dict)
    #: prefetched blocks that were used (faulted or not) is not observable; this counts the
    #: prefetches followed by an eviction of the same block with no fault between: moved twice
    #: for nothing visible
    prefetch_then_evicted_unfaulted: int = 0

    def as_dict(self) -> dict:
        return {"fault_blocks": self.fault_blocks, "classes": dict(self.classes),
                "late_submitted_before_ms_p50_p90": self.late_submitted_before_ms,
                "late_completed_after_ms_p50_p90": self.late_completed_after_ms,
                "prefetch_turnaround_ms_p50_p90": self.prefetch_turnaround_ms,
                "commands": dict(self.commands),
                "prefetch_then_evicted_unfaulted": self.prefetch_then_evicted_unfaulted}


def _p50_p90(v: list[float]) -> list[float]:
    return [round(float(np.percentile(v, 50)), 3), round(float(np.percentile(v, 90)), 3)] if v else []


def analyze(faults: np.ndarray, cmds: np.ndarray, results: np.ndarray, *, since_ns: int | None = None) -> ControlReport:
    """Classify the faulted blocks (after ``since_ns``, e.g. past a warm-up) by the commands
    for the same block that came before them."""
    rep = ControlReport()
    done_at = {}
    ok = {}
    if len(results):
        for cid, t, st in zip(results["cmd_id"].tolist(), results["t_ns"].tolist(), results["status"].tolist()):
            done_at[cid] = t
            ok[cid] = st in (Status.OK, Status.SKIPPED)
    # per block, its commands in submission order: (t_submit, op, t_done or None, ok)
    per_block: dict[int, list[tuple[int, int, int | None]]] = {}
    for c in cmds[np.argsort(cmds["t_ns"], kind="stable")] if len(cmds) else ():
        op = int(c["op"])
        if op not in (Op.PREFETCH, Op.PREEVICT, Op.INVALIDATE):
            continue
        name = Op(op).name.lower()
        rep.commands[name] = rep.commands.get(name, 0) + 1
        b0 = int(c["addr"]) >> BLOCK_SHIFT
        b1 = (int(c["addr"]) + max(int(c["bytes"]), 1) - 1) >> BLOCK_SHIFT
        cid = int(c["cmd_id"])
        t_done = done_at.get(cid)
        if op == Op.PREFETCH and t_done is not None:
            rep.prefetch_turnaround_ms.append((t_done - int(c["t_ns"])) / 1e6)
        if op == Op.INVALIDATE and int(c["bytes"]) < BLOCK_SIZE:
            continue   # a partial discard leaves the block's other pages where they were
        for b in range(b0, b1 + 1):
            per_block.setdefault(b, []).append((int(c["t_ns"]), op, t_done))
    # the fault handler's unit: distinct blocks per fault batch, at the batch's first fault
    if len(faults):
        blocks = faults["addr"].astype(np.int64) >> BLOCK_SHIFT
        key = (faults["batch_id"].astype(np.int64) << 28) ^ (blocks & ((1 << 28) - 1))
        _, first = np.unique(key, return_index=True)
        fb, ft = blocks[first], faults["t_ns"][first].astype(np.int64)
        order = np.argsort(ft, kind="stable")
        fb, ft = fb[order], ft[order]
    else:
        fb = ft = np.zeros(0, np.int64)
    times = {b: np.array([x[0] for x in v], np.int64) for b, v in per_block.items()}
    for b, t in zip(fb.tolist(), ft.tolist()):
        if since_ns is not None and t < since_ns:
            continue
        rep.fault_blocks += 1
        hist = per_block.get(b)
        k = int(np.searchsorted(times[b], t, side="right")) if hist else 0
        if not k:
            rep.classes["never touched"] += 1
        else:
            before = hist[:k]
            last_pf = max((i for i, x in enumerate(before) if x[1] == Op.PREFETCH), default=None)
            last_ev = max((i for i, x in enumerate(before) if x[1] != Op.PREFETCH), default=None)
            if last_pf is not None and (last_ev is None or last_pf > last_ev):
                ts, _, td = before[last_pf]
                if td is None or td > t:
                    rep.classes["late"] += 1
                    rep.late_submitted_before_ms.append((t - ts) / 1e6)
                    if td is not None:
                        rep.late_completed_after_ms.append((td - t) / 1e6)
                else:
                    rep.classes["prefetched, resident"] += 1
            elif last_pf is not None:
                rep.classes["evicted after prefetch"] += 1
            else:
                rep.classes["evicted, not prefetched back"] += 1
    # prefetched, then evicted with no fault on the block in between
    fault_times: dict[int, np.ndarray] = {}
    if len(fb):
        srt = np.lexsort((ft, fb))
        fbs, fts = fb[srt], ft[srt]
        bounds = np.flatnonzero(np.diff(fbs)) + 1
        for part_b, part_t in zip(np.split(fbs, bounds), np.split(fts, bounds)):
            fault_times[int(part_b[0])] = part_t
    for b, hist in per_block.items():
        ftb = fault_times.get(b, np.zeros(0, np.int64))
        for (t0, op0, _), (t1, op1, _) in zip(hist, hist[1:]):
            if op0 == Op.PREFETCH and op1 != Op.PREFETCH:
                if since_ns is not None and t0 < since_ns:
                    continue
                i = int(np.searchsorted(ftb, t0, side="left"))
                if i >= len(ftb) or ftb[i] > t1:
                    rep.prefetch_then_evicted_unfaulted += 1
    rep.late_submitted_before_ms = _p50_p90(rep.late_submitted_before_ms)
    rep.late_completed_after_ms = _p50_p90(rep.late_completed_after_ms)
    rep.prefetch_turnaround_ms = _p50_p90(rep.prefetch_turnaround_ms)
    return rep


def from_trace(trace, *, skip_s: float = 0.0) -> ControlReport:
    """:func:`analyze` on a trace file's events, leaving out the first ``skip_s`` seconds."""
    f = trace.events(Kind.FAULT)
    since = None
    if skip_s > 0 and len(f):
        since = int(f["t_ns"].min()) + int(skip_s * 1e9)
    return analyze(f, trace.events(Kind.COMMAND), trace.events(Kind.RESULT), since_ns=since)
