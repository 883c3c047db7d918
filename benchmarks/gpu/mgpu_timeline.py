"""Where does a multi-GPU run's time go? Reads a trace recorded with
``umctl run -o T.parquet --kinds all --mode snurhac --gpus N -- PROGRAM`` and prints, per GPU,
what moved onto it (bytes by cause and source: host or a peer GPU), when (first and last
migration, relative to the first kernel launch), the rate, the GPU faults, and the CPU faults:
enough to tell a prefetch that came late or slow from faults a prefetch did not cover.

    python3 benchmarks/gpu/mgpu_timeline.py T.parquet [--bins 20]
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np

from umctl.events.schema import Cause, Kind
from umctl.events.trace import Trace


def _ms(t: int, t0: int) -> str:
    return f"{(t - t0) / 1e6:8.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--bins", type=int, default=20, help="time bins of the per-GPU migration profile")
    a = ap.parse_args()
    with Trace(a.trace) as t:
        m, f, la, cf, cmd, res = (t.events(k) for k in (Kind.MIGRATION, Kind.FAULT, Kind.LAUNCH, Kind.CPU_FAULT,
                                                         Kind.COMMAND, Kind.RESULT))
    t0 = int(la["t_ns"].min()) if len(la) else int(m["t_ns"].min())
    t_last = max(int(x.max()) for x in (m["t_end_ns"], f["t_ns"], la["t_ns"]) if len(x))
    print(f"launches {len(la)} (first at 0 ms, per GPU {dict(zip(*np.unique(la['gpu'], return_counts=True)))}); "
          f"span to last event {_ms(t_last, t0)} ms; commands {len(cmd)}, results {len(res)}")
    if len(res):
        lat = res["latency_ns"] / 1e6
        print(f"  command latency ms: median {np.median(lat):.2f}, max {lat.max():.2f}, sum {lat.sum():.1f}")
    for g in sorted(set(la["gpu"].tolist())):
        lg = la[la["gpu"] == g]
        ends = lg["t_end_ns"][lg["t_end_ns"] > 0]
        print(f"  GPU {g} launches at ms: " + " ".join(_ms(int(x), t0).strip() for x in lg["t_ns"][:8])
              + (f"; last kernel end {_ms(int(ends.max()), t0).strip()} ms" if len(ends) else "; no kernel ends"))
    print(f"CPU faults {len(cf)}" + (f" from {_ms(int(cf['t_ns'].min()), t0)} to {_ms(int(cf['t_ns'].max()), t0)} ms" if len(cf) else ""))
    for g in sorted(set(m["dst"].tolist()) | set(f["gpu"].tolist())):
        if g < 0:
            continue
        into = m[m["dst"] == g]
        ff = f[f["gpu"] == g]
        print(f"GPU {g}: faults {len(ff)}" + (f" ({_ms(int(ff['t_ns'].min()), t0)}..{_ms(int(ff['t_ns'].max()), t0)} ms)" if len(ff) else ""))
        groups = defaultdict(list)
        for i, (c, s) in enumerate(zip(into["cause"].tolist(), into["src"].tolist())):
            groups[(Cause(c).name, "host" if s < 0 else f"gpu{s}")].append(i)
        for (cause, src), idx in sorted(groups.items()):
            sel = into[np.asarray(idx)]
            gib = sel["bytes"].sum() / 2**30
            lo, hi = int(sel["t_ns"].min()), int(sel["t_end_ns"].max())
            busy = np.sum(sel["t_end_ns"] - sel["t_ns"]) / 1e6
            rate = gib * 2**30 / max(hi - lo, 1)
            print(f"  <- {src:5} {cause:15} n={len(sel):7} {gib:6.2f} GiB  {_ms(lo, t0)}..{_ms(hi, t0)} ms  "
                  f"{rate:6.1f} GB/s over the span, record time sum {busy:8.1f} ms")
        if len(into):
            edges = np.linspace(t0, t_last, a.bins + 1)
            h, _ = np.histogram(into["t_ns"], bins=edges, weights=into["bytes"] / 2**20)
            print("  MiB per bin of", f"{(t_last - t0) / a.bins / 1e6:.1f} ms:", " ".join(f"{x:.0f}" for x in h))
        out = m[m["src"] == g]
        if len(out):
            print(f"  -> off GPU {g}: n={len(out)} {out['bytes'].sum() / 2**30:.2f} GiB to "
                  f"{dict(zip(*np.unique(out['dst'], return_counts=True)))}")


if __name__ == "__main__":
    main()
