"""Where do GPU pages come from under admission? Reads a trace recorded with
``umctl run -o T.parquet --kinds all --runtime --managed --mode M --budget B`` and tallies the
migrations onto the GPU by cause and size, inside and outside the runtime's host-preferred
ranges, plus the GPU faults outside them: what the budget check counts that admission did not
bring in.

    python3 benchmarks/gpu/admission_diag.py T.parquet
"""

from __future__ import annotations

import sys
from collections import Counter

import numpy as np

from umctl.events.schema import AllocOp, Cause, Kind, Op
from umctl.events.trace import Trace
from umctl.loop.budget_check import RangeSet
from umctl.units import BLOCK_SIZE


def main(path: str) -> None:
    with Trace(path) as t:
        a, m, f, c = (t.events(k) for k in (Kind.ALLOC, Kind.MIGRATION, Kind.FAULT, Kind.COMMAND))
    hp = RangeSet()
    for op, addr, n in zip(a["op"].tolist(), a["addr"].tolist(), a["bytes"].tolist()):
        if op == AllocOp.HOST_PREFERRED:
            hp.add(addr, addr + n)
    ops = Counter(int(x) for x in a["op"])
    print(f"allocs: {dict(ops)}; host-preferred ranges {len(hp)}, {int((hp.hi - hp.lo).sum()) / 2**30:.2f} GiB")
    sizes = a[a["op"] == AllocOp.ALLOC]["bytes"]
    print(f"alloc sizes: min {sizes.min() if len(sizes) else 0}, <2MiB {(sizes < BLOCK_SIZE).sum()}, "
          f"unaligned addr {((a[a['op'] == AllocOp.ALLOC]['addr'] % BLOCK_SIZE) != 0).sum()}")
    into = m[m["dst"] >= 0]
    inside = hp.contains(into["addr"].astype(np.int64))
    print(f"migrations onto a GPU: {len(into)}, {into['bytes'].sum() / 2**30:.2f} GiB")
    for cause in sorted(set(into["cause"].tolist())):
        s = into["cause"] == cause
        for where, sel in (("host-pref", s & inside), ("other", s & ~inside)):
            if sel.any():
                b = into["bytes"][sel]
                print(f"  cause {Cause(cause).name:16} {where:9} n={sel.sum():8} {b.sum() / 2**30:7.2f} GiB  "
                      f"partial(<2MiB) n={(b < BLOCK_SIZE).sum():8} {b[b < BLOCK_SIZE].sum() / 2**20:9.1f} MiB")
    out = m[m["src"] >= 0]
    print(f"migrations off a GPU: {len(out)}, {out['bytes'].sum() / 2**30:.2f} GiB; causes "
          f"{dict(Counter(Cause(x).name for x in out['cause'].tolist()))}")
    fin = hp.contains(f["addr"].astype(np.int64)) if len(f) else np.zeros(0, bool)
    print(f"GPU faults: {len(f)}, outside host-preferred ranges {int((~fin).sum())}")
    if (~fin).any():
        print("  sample outside:", [hex(int(x)) for x in f["addr"][~fin][:8]])
    cmd = c[c["op"] == Op.PREFETCH]
    print(f"prefetch commands: {len(cmd)}; outside host-pref {int((~hp.contains(cmd['addr'].astype(np.int64))).sum())}")
    # user migrations onto the GPU that are partial: which blocks, how many pages
    u = into[(into["cause"] == Cause.USER) & (into["bytes"] < BLOCK_SIZE)]
    if len(u):
        print("  sample partial USER migrations (addr, bytes):", [(hex(int(x)), int(y)) for x, y in zip(u["addr"][:8], u["bytes"][:8])])
    o = into[into["cause"] != Cause.USER]
    if len(o):
        print("  sample non-USER migrations (cause, addr, bytes, src):",
              [(Cause(int(z)).name, hex(int(x)), int(y), int(s)) for z, x, y, s in zip(o["cause"][:8], o["addr"][:8], o["bytes"][:8], o["src"][:8])])


if __name__ == "__main__":
    main(sys.argv[1])
