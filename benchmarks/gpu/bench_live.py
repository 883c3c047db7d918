"""Live-source benchmark on the GPU machine: attach overhead per enabled kind set on a
fault-heavy sweep, sustained events/s and drops, delivery lag; and capture of real ring bytes
for the CI decoder tests. Usage: python3 benchmarks/gpu/bench_live.py OUTDIR [--capture FILE]
Prints a table and writes OUTDIR/bench_live.json. Never asserts on time (it is a benchmark)."""

import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

from umctl.events.schema import Kind
from umctl.sources.uvmtools import ALL_KINDS, DEFAULT_KINDS, UvmToolsSource

HERE = os.path.dirname(os.path.abspath(__file__))
MIB, PASSES = 512, 6


def one(kinds, capture=None, thrash=False):
    args = [sys.executable, os.path.join(HERE, "workloads", "wl_sweep.py"), "--wait", "--mib", str(MIB), "--passes", str(PASSES)]
    if thrash:
        args.append("--thrash")
    p = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
    _, pid, base, nbytes = p.stdout.readline().split()
    src = UvmToolsSource(int(pid), kinds).start() if kinds is not None else None
    if src is not None and capture is not None:
        src.raw_sink = capture
    samples = []
    lines = []
    import threading
    reader = threading.Thread(target=lambda: lines.extend(iter(p.stdout.readline, "")), daemon=True)
    reader.start()
    p.stdin.write("GO\n")
    p.stdin.flush()
    while reader.is_alive():
        time.sleep(0.02)
        if src is not None:
            b = src.drain()
            samples.append((time.perf_counter(), len(b)))
    reader.join()
    p.wait(timeout=60)
    res = {"kernel_ms": [float(ln.split()[2]) for ln in lines if ln.startswith("PASS")],
           "host_ms": [float(ln.split()[3]) for ln in lines if ln.startswith("PASS")]}
    if src is not None:
        src.stop()
        b = src.drain()
        samples.append((time.perf_counter(), len(b)))
        st = src.stats()
        src.close()
        ts = np.array([t for t, _ in samples])
        ns = np.array([n for _, n in samples])
        win = np.bincount(((ts - ts[0]) / 0.1).astype(int), weights=ns)
        busy = sum(res["kernel_ms"]) / 1e3 + sum(res["host_ms"]) / 1e3
        res.update(events=int(ns.sum()), dropped=st["dropped"], lag_ring_ms=st["lag_ring_ms"],
                   lag_delivery_ms=st["lag_delivery_ms"], lag_migration_ms=st["lag_migration_ms"],
                   peak_events_per_s_100ms=float(win.max() * 10), mean_events_per_s=float(ns.sum() / busy),
                   ring_max_fill=st["ring_max_fill"], flush_us_mean=st["flush_us_mean"], attach_ms=st["attach_ms"],
                   by_kind=st["events"], base=int(base), nbytes=int(nbytes), pid=int(pid))
    return res


def main():
    outdir = sys.argv[1]
    capture_file = sys.argv[sys.argv.index("--capture") + 1] if "--capture" in sys.argv else None
    configs = [("no tracker", None), ("default kinds", DEFAULT_KINDS), ("all kinds", ALL_KINDS)]
    runs = {name: [] for name, _ in configs}
    for rep in range(2):
        for name, kinds in configs:
            runs[name].append(one(kinds))
    table = []
    base_k = statistics.median(k for r in runs["no tracker"] for k in r["kernel_ms"][1:])
    base_h = statistics.median(k for r in runs["no tracker"] for k in r["host_ms"][1:])
    for name, _ in configs:
        ks = [k for r in runs[name] for k in r["kernel_ms"][1:]]
        hs = [k for r in runs[name] for k in r["host_ms"][1:]]
        row = {"config": name, "kernel_ms_median": statistics.median(ks), "host_ms_median": statistics.median(hs),
               "kernel_overhead_pct": 100 * (statistics.median(ks) / base_k - 1),
               "pass_overhead_pct": 100 * ((statistics.median(ks) + statistics.median(hs)) / (base_k + base_h) - 1)}
        if runs[name][0].get("events") is not None:
            for key in ("events", "dropped", "peak_events_per_s_100ms", "mean_events_per_s", "lag_ring_ms",
                        "lag_delivery_ms", "lag_migration_ms", "ring_max_fill", "flush_us_mean", "attach_ms", "by_kind"):
                row[key] = [r[key] for r in runs[name]]
        table.append(row)
    print(f"sweep: {MIB} MiB managed, {PASSES} passes of host write + GPU kernel; medians over passes 2..{PASSES} of 2 runs")
    for row in table:
        print(json.dumps(row, default=str))
    out = {"table": table, "runs": runs}
    if capture_file:
        cap = []
        r = one(ALL_KINDS, capture=cap, thrash=True)
        from umctl.driver.abi import concat_entries
        raw = concat_entries(cap)
        keep = []
        for ty in np.unique(raw["type"]):
            idx = np.flatnonzero(raw["type"] == ty)
            keep.append(idx[:1200])
        sel = np.sort(np.concatenate(keep))
        raw[sel].tofile(capture_file)
        meta = {"pid": r["pid"], "base": r["base"], "nbytes": r["nbytes"], "entries": int(len(sel)),
                "types": {int(t): int((raw[sel]["type"] == t).sum()) for t in np.unique(raw[sel]["type"])},
                "dropped": r["dropped"], "driver": open("/proc/driver/nvidia/version").readline().strip()}
        json.dump(meta, open(capture_file + ".json", "w"), indent=1)
        print("captured", meta)
    json.dump(out, open(os.path.join(outdir, "bench_live.json"), "w"), indent=1, default=str)


if __name__ == "__main__":
    main()
