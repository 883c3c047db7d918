"""Replay a recorded live DeepUM run's events through a fresh DeepUM controller, offline, and
say what the controller knew about each block the GPU faulted on.

Why: tuning DeepUM live on the GPU costs device time per try, and the faults of a live run
depend on the policy. The event stream of one recorded run (``umctl run --mode deepum
--budget B -o FILE``: launches timed at kernel start, faults, allocator events, and the budget
keeper's evictions as COMMAND records) is enough to ask, per option set and without a GPU,
how many of those faulted uses the walk would have predicted, and for the rest whether the
block was in the current kernel's table, in the next N kernels' tables, in any table, or
believed resident (a walk never prefetches a block it thinks is on the GPU). The budget
keeper's evictions are replayed as EVICTION events, as the live loop delivers them.

    python3 tools/deepum_offline.py TRACE [-O degree=8] [-O whole_tables=true] [--skip 2] [--budget 512MiB]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from umctl.controller import make_controller  # noqa: E402
from umctl.controller.base import ControllerContext  # noqa: E402
from umctl.events.schema import EventBatch, Kind, Op, empty  # noqa: E402
from umctl.report.control import _fault_blocks  # noqa: E402
from umctl.units import BLOCK_SHIFT, BLOCK_SIZE, parse_size  # noqa: E402

RECENT_NS = 50_000_000   # a block faulted this recently is still being brought in


def replay(trace, options: dict, *, budget_bytes: int, skip_s: float = 2.0, drain_ns: int = 5_000_000) -> dict:
    f, la, al, c = (trace.events(k) for k in (Kind.FAULT, Kind.LAUNCH, Kind.ALLOC, Kind.COMMAND))
    ev = c[(c["op"] == Op.PREEVICT) & (c["priority"] == 0)] if len(c) else c
    evictions = empty(Kind.EVICTION, len(ev))
    evictions["t_ns"], evictions["addr"], evictions["bytes_written"] = ev["t_ns"], ev["addr"], ev["bytes"]
    ctl = make_controller("deepum", **options)
    cap = budget_bytes // BLOCK_SIZE
    ctl.attach(ControllerContext(n_gpus=1, gpu_mem=[budget_bytes],
                                 free_memory=lambda g: max(0, cap - len(ctl.resident)) * BLOCK_SIZE))
    if not len(f):
        return {"faulted_uses": 0}
    t0 = int(min(f["t_ns"].min(), la["t_ns"].min() if len(la) else f["t_ns"].min()))
    t1, skip = int(f["t_ns"].max()), t0 + int(skip_s * 1e9)
    walked: dict[int, list[int]] = defaultdict(list)
    known: dict[str, int] = defaultdict(int)
    last_fault: dict[int, int] = {}
    sources = ((Kind.FAULT, f), (Kind.LAUNCH, la), (Kind.ALLOC, al), (Kind.EVICTION, evictions))
    for w0 in range(t0, t1 + drain_ns, drain_ns):
        w1 = w0 + drain_ns
        window = {k: a[(a["t_ns"] >= w0) & (a["t_ns"] < w1)] for k, a in sources}
        blocks = np.unique(window[Kind.FAULT]["addr"].astype(np.int64) >> BLOCK_SHIFT).tolist()
        if w0 >= skip and blocks:
            # what the controller knew before it saw these faults
            exp = ctl._expected()
            cur = set(ctl.tables[ctl.cur].keys()) if ctl.cur in ctl.tables else set()
            anyt = set().union(*(t.keys() for t in ctl.tables.values())) if ctl.tables else set()
            for b in blocks:
                known["uses"] += 1
                res, recent = b in ctl.resident, last_fault.get(b, -1) > w0 - RECENT_NS
                known["believed resident, faulted < 50 ms before"] += res and recent
                known["believed resident, not faulted for 50 ms"] += res and not recent
                known["not resident, in the next N kernels' tables"] += not res and b in exp
                known["not resident, in a table beyond N"] += not res and b not in exp and b in anyt
                known["in no table"] += not res and b not in anyt
                known["(in the current kernel's table)"] += b in cur
        for b in blocks:
            last_fault[b] = w1
        batch = EventBatch(now_ns=w1, names=trace.names)
        for k, a in window.items():
            if len(a):
                batch.add(k, a)
        cmds = ctl.on_events(batch)
        if cmds is not None and len(cmds):
            for a in cmds["addr"][(cmds["op"] == Op.PREFETCH) & (cmds["priority"] >= 1)].tolist():
                walked[int(a) >> BLOCK_SHIFT].append(w1)
    fb, ft = _fault_blocks(f)
    faults_of: dict[int, list[int]] = defaultdict(list)
    for b, t in zip(fb.tolist(), ft.tolist()):
        faults_of[b].append(t)
    uses = predicted = 0
    for b, t in zip(fb.tolist(), ft.tolist()):
        if t < skip:
            continue
        uses += 1
        prev = [x for x in faults_of[b] if x < t - RECENT_NS]    # the block's previous use
        start = prev[-1] if prev else -1
        predicted += any(start < x <= t for x in walked.get(b, ()))
    n = max(known.pop("uses", 0), 1)
    st = ctl.stats()
    return {"options": options, "faulted_uses": uses, "predicted": predicted,
            "predicted_pct": round(100 * predicted / max(uses, 1), 1), "walk_blocks": sum(map(len, walked.values())),
            "per_drain_block_uses": {k: round(100 * v / n, 1) for k, v in known.items()},
            "next_kernel_prediction_accuracy": st["prediction_accuracy"], "exec_ids": st["exec_ids"],
            "chains": st["chains"], "paused": st["paused"]}


def main() -> None:
    from umctl.events.trace import read_trace

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("-O", "--option", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--skip", type=float, default=2.0, help="seconds of warm-up left out")
    ap.add_argument("--budget", default="512MiB")
    a = ap.parse_args()
    opts = {}
    for kv in a.option:
        k, _, v = kv.partition("=")
        opts[k] = int(v) if v.lstrip("-").isdigit() else {"true": True, "false": False}.get(v, v)
    with read_trace(a.trace) as t:
        print(json.dumps(replay(t, opts, budget_bytes=parse_size(a.budget), skip_s=a.skip), indent=1))


if __name__ == "__main__":
    main()
