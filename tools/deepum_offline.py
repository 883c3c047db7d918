"""Replay a recorded live DeepUM run's events through a fresh DeepUM controller, offline, and
say, for each use of a block that faulted, whether the walk had predicted it and if not what
the controller knew.

Why: tuning DeepUM live on the GPU costs device time per try, and the faults of a live run
depend on the policy. The event stream of one recorded run (``umctl run --mode deepum
--budget B -o FILE``: launches timed at kernel start, faults, allocator events, and the budget
keeper's evictions as COMMAND records) is enough to ask, per option set and without a GPU,
how many of those faulted uses the walk would have predicted, and for the rest whether the
block was believed resident (a walk never prefetches a block it thinks is on the GPU), in the
next N kernels' tables, only in tables further ahead, or in none. Offline the controller's
own prefetches are taken as done, while the recorded evictions are those of the live run. The budget
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
from umctl.events.schema import EventBatch, Kind, Op  # noqa: E402
from umctl.loop.residency import keeper_evictions  # noqa: E402
from umctl.units import BLOCK_SHIFT, BLOCK_SIZE, parse_size  # noqa: E402

RECENT_NS = 50_000_000   # a block faulted this recently is still being brought in


def replay(trace, options: dict, *, budget_bytes: int, skip_s: float = 2.0, drain_ns: int = 5_000_000) -> dict:
    """Feed the trace to a fresh controller drain by drain; classify each *use* of a block (its
    first fault after RECENT_NS without one: later faults of the same episode follow from the
    first) as predicted -- the walk emitted the block since its previous use -- or, if not, by
    what the controller knew just before the fault."""
    f, la, al, c = (trace.events(k) for k in (Kind.FAULT, Kind.LAUNCH, Kind.ALLOC, Kind.COMMAND))
    ev = c[(c["op"] == Op.PREEVICT) & (c["priority"] == 0)] if len(c) else c
    evictions = keeper_evictions(ev)
    ctl = make_controller("deepum", **options)
    cap = budget_bytes // BLOCK_SIZE
    ctl.attach(ControllerContext(n_gpus=1, gpu_mem=[budget_bytes],
                                 free_memory=lambda g: max(0, cap - len(ctl.resident)) * BLOCK_SIZE))
    if not len(f):
        return {"options": options, "uses": 0}
    t0 = int(min(f["t_ns"].min(), la["t_ns"].min() if len(la) else f["t_ns"].min()))
    t1, skip = int(f["t_ns"].max()), t0 + int(skip_s * 1e9)
    walked: dict[int, list[int]] = defaultdict(list)
    classes: dict[str, int] = defaultdict(int)
    last_fault: dict[int, int] = {}
    sources = ((Kind.FAULT, f), (Kind.LAUNCH, la), (Kind.ALLOC, al), (Kind.EVICTION, evictions))
    for w0 in range(t0, t1 + drain_ns, drain_ns):
        w1 = w0 + drain_ns
        window = {k: a[(a["t_ns"] >= w0) & (a["t_ns"] < w1)] for k, a in sources}
        blocks = np.unique(window[Kind.FAULT]["addr"].astype(np.int64) >> BLOCK_SHIFT).tolist()
        if w0 >= skip and blocks:
            exp = ctl._expected()
            anyt = set().union(*(t.keys() for t in ctl.tables.values())) if ctl.tables else set()
            for b in blocks:
                prev = last_fault.get(b, -1)
                if prev > w0 - RECENT_NS:
                    continue   # the same episode as an earlier fault
                if any(prev < x <= w0 for x in walked.get(b, ())):
                    classes["predicted"] += 1
                elif b in ctl.resident:
                    classes["missed: believed resident"] += 1
                elif b in exp:
                    classes["missed: in the next N kernels' tables, not walked"] += 1
                elif b in anyt:
                    classes["missed: only in tables beyond N kernels"] += 1
                else:
                    classes["missed: in no table (not faulted before)"] += 1
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
    n = sum(classes.values())
    st = ctl.stats()
    return {"options": options, "uses": n,
            "classes_pct": {k: round(100 * v / max(n, 1), 1) for k, v in sorted(classes.items())},
            "walk_blocks": sum(map(len, walked.values())),
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
