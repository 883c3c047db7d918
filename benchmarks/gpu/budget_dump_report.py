"""Why did a live run's budget check say "NOT held"? Read a check dump (``UMCTL_BUDGET_CHECK_DUMP``)
and print: the verdict re-judged, where the check's and the keeper's accounts of the resident
blocks part (:func:`umctl.loop.budget_check.keeper_disagreement`), and, for a few blocks only the
check counts at the worst snapshot, every record in the dump that touched them, in the order it
came. Run where the dump is (on the device: the dumps are large, this report is small).

    UMCTL_BUDGET_CHECK_DUMP=chk.pkl umctl run -q --runtime --managed --mode deepum --budget 1318MiB -- \\
        python3 benchmarks/gpu/programs/moe.py --steps 8
    python3 benchmarks/gpu/budget_dump_report.py chk.pkl [--blocks 6] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
from collections import Counter, defaultdict
from dataclasses import asdict

import numpy as np

from umctl.events.schema import AllocOp, Cause, Kind, Op, Status
from umctl.loop.budget_check import judge_dump, keeper_disagreement
from umctl.units import BLOCK_SHIFT


def _name(enum, v) -> str:
    try:
        return enum(int(v)).name
    except ValueError:
        return str(int(v))


def _blocks(addr: int, n: int) -> range:
    """The 2 MiB blocks [addr, addr + n) touches (one for an empty range)."""
    return range(addr >> BLOCK_SHIFT, ((addr + max(1, n) - 1) >> BLOCK_SHIFT) + 1)


def block_histories(path: str, blocks: set[int]) -> tuple[dict[int, list[str]], Counter]:
    """Every dumped record touching ``blocks`` (as lines, in arrival order) and, over the whole
    dump, the migrations onto a GPU counted by cause (is it umctl, the driver's own, or demand?)."""
    out: dict[int, list[str]] = defaultdict(list)
    causes: Counter = Counter()
    cmds: dict[int, tuple] = {}
    t0 = None
    with open(path, "rb") as fh:
        pickle.load(fh)
        n = 0
        while True:
            try:
                rec = pickle.load(fh)
            except EOFError:
                break
            if rec[0] in ("finish", "note"):
                if rec[0] == "finish":
                    break
                continue
            now, _rt, kinds, _mapped = rec
            n += 1
            t0 = now if t0 is None else t0
            rel = lambda t: f"{(int(t) - t0) / 1e6:9.1f} ms"   # noqa: E731
            m = kinds.get(Kind.MIGRATION)
            if m is not None:
                for r in m:
                    if r["dst"] >= 0:
                        causes[_name(Cause, r["cause"])] += 1
                    for b in _blocks(int(r["addr"]), int(r["bytes"])):
                        if b in blocks:
                            out[b].append(f"#{n} {rel(r['t_ns'])} MIGRATION {int(r['src'])}->{int(r['dst'])} "
                                          f"{int(r['bytes']) >> 10} KiB {_name(Cause, r['cause'])} "
                                          f"(end {rel(r['t_end_ns'])})")
            f = kinds.get(Kind.FAULT)
            if f is not None and len(f):
                fb = f["addr"].astype(np.int64) >> BLOCK_SHIFT
                for b in set(fb.tolist()) & blocks:
                    sel = f[fb == b]
                    out[b].append(f"#{n} {rel(sel['t_ns'].min())} FAULT x{len(sel)} gpu {int(sel['gpu'][0])} "
                                  f"(not yet known host-preferred)")
            for kind in (Kind.EVICTION,):
                e = kinds.get(kind)
                if e is not None:
                    for r in e:
                        if int(r["addr"]) >> BLOCK_SHIFT in blocks:
                            out[int(r["addr"]) >> BLOCK_SHIFT].append(f"#{n} {rel(r['t_ns'])} EVICTION gpu {int(r['gpu'])}")
            c = kinds.get(Kind.COMMAND)
            if c is not None:
                for r in c:
                    cmds[int(r["cmd_id"])] = (int(r["op"]), int(r["addr"]), int(r["bytes"]), int(r["dst"]))
                    for b in _blocks(int(r["addr"]), int(r["bytes"])):
                        if b in blocks:
                            out[b].append(f"#{n} {rel(r['t_ns'])} COMMAND {int(r['cmd_id'])} {_name(Op, r['op'])} "
                                          f"{int(r['bytes']) >> 10} KiB dst {int(r['dst'])}")
            res = kinds.get(Kind.RESULT)
            if res is not None:
                for r in res:
                    cmd = cmds.get(int(r["cmd_id"]))
                    if cmd is None:
                        continue
                    for b in _blocks(cmd[1], cmd[2]):
                        if b in blocks:
                            out[b].append(f"#{n} {rel(r['t_ns'])} RESULT {int(r['cmd_id'])} {_name(Op, cmd[0])} "
                                          f"{_name(Status, r['status'])} {int(r['bytes']) >> 10} KiB "
                                          f"lat {int(r['latency_ns']) / 1e6:.1f} ms")
            a = kinds.get(Kind.ALLOC)
            if a is not None:
                for r in a:
                    span = _blocks(int(r["addr"]), int(r["bytes"]))
                    for b in (b for b in blocks if b in span):
                        out[b].append(f"#{n} {rel(r['t_ns'])} ALLOC {_name(AllocOp, r['op'])} "
                                      f"{int(r['bytes']) >> 20} MiB managed={bool(r['managed'])}")
    return out, causes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("dump")
    ap.add_argument("--blocks", type=int, default=6, help="blocks whose records to print")
    ap.add_argument("--json", help="also write the figures as JSON")
    a = ap.parse_args(argv)
    try:
        v = judge_dump(a.dump)
        dis = keeper_disagreement(a.dump, examples=64)
    except (OSError, pickle.UnpicklingError, KeyError, EOFError) as e:
        print(f"budget_dump_report: cannot read {a.dump}: {e}", file=sys.stderr)
        return 1
    print(f"verdict re-judged: held={v.held} true peak {v.true_peak_bytes / 2**30:.3f} GiB (pages "
          f"{v.true_peak_page_bytes / 2**30:.3f}) budget {v.budget_bytes / 2**30:.3f} + slack "
          f"{v.slack_bytes / 2**30:.3f}; over {100 * v.time_over_frac:.1f} % of {v.observed_s:.1f} s; "
          f"late {v.late_records} fault arrivals {v.fault_arrivals} partial blocks {v.partial_blocks} {v.why}")
    for over in (50, 200):
        w = judge_dump(a.dump, reorder_ms=over)
        print(f"  with reorder {over} ms: held={w.held} over {100 * w.time_over_frac:.1f} % peak "
              f"{w.true_peak_bytes / 2**30:.3f} GiB")
    print(f"{len(dis)} keeper snapshots; check blocks / keeper blocks / only check / only keeper:")
    for d in dis[:: max(1, len(dis) // 24)]:
        print(f"  t {d['t_ns'] / 1e9:10.3f} s gpu {d['gpu']}: {d['check_blocks']:5d} {d['keeper_blocks']:5d} "
              f"{d['only_check']:5d} {d['only_keeper']:5d}")
    worst = max(dis, key=lambda d: d["only_check"], default=None)
    hist, causes = {}, Counter()
    if worst is not None and worst["only_check"]:
        pick = worst["only_check_examples"]
        step = max(1, len(pick) // a.blocks)
        blocks = set(pick[::step][: a.blocks])
        hist, causes = block_histories(a.dump, blocks)
        print(f"worst snapshot t {worst['t_ns'] / 1e9:.3f} s: {worst['only_check']} blocks only the check counts; "
              f"histories of {len(blocks)}:")
        for b in sorted(blocks):
            lines = hist.get(b, [])
            print(f"  block {b:#x} ({len(lines)} records; last 14):")
            for line in lines[-14:]:
                print("    " + line)
    else:
        _, causes = block_histories(a.dump, set())
    print("migrations onto a GPU by cause:", dict(causes))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"verdict": asdict(v), "disagreement": dis, "histories": {hex(k): v for k, v in hist.items()},
                       "arrival_causes": dict(causes)}, fh, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
