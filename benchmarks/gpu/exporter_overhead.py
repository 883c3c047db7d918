"""GPU benchmark: what ``umctl exporter`` costs a running PyTorch loop, and whether its fault
totals agree with ``umctl attach --sample 1`` on the same loop.

Two parts, one long-running ``benchmarks/gpu/workloads/wl_torch.py`` (managed memory, the host rewrites the
batch every step: ~18 K GPU faults a step) throughout:

1. **Overhead**, measured the way benchmarks/gpu/attach_overhead.py measures attaching (and
   with its window arithmetic): the exporter's agent starts and stops in windows -- off,
   exporter, off, exporter at --sample 1, ... shuffled per round -- while a scraper thread
   GETs /metrics every second as Prometheus would. Each exporter window's median step is
   compared with the unattached windows on either side, so the loop's drift cancels.
2. **Agreement**: the exporter (default: 10 % sample, 1 s interval) runs beside
   ``umctl attach --pid P --sample 1 --no-launches --duration D`` for D seconds (default 60);
   the exporter's fault and batch rates over that minute (from its /metrics, the way
   Prometheus's rate() would see them) are compared with attach's exact totals over D.

  python3 benchmarks/gpu/exporter_overhead.py [--window 5] [--rounds 6] [--compare 60] [--json F]

Prints two tables and writes ``--json``. Needs root (or CAP_SYS_PTRACE), the NVIDIA driver
with nvidia-uvm, torch and gcc (as attach_overhead.py does).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from attach_overhead import (  # noqa: E402
    OFF, Window, interleaved_windows, paired_overheads, parse_steps, start_loop, summarize, unattached_medians,
)

CONFIGS = {"exporter, sampled 10% (default)": 0.1, "exporter, --sample 1": 1.0}


class Exporter:
    """The exporter as ``umctl exporter`` runs it (agent thread + HTTP server), in this
    process so that it can start and stop at window edges without Python's start-up time."""

    def __init__(self, sample: float, interval_s: float = 1.0, scrape_s: float | None = 1.0):
        from prometheus_client import CollectorRegistry, start_http_server

        from umctl.exporter.agent import Agent
        from umctl.exporter.metrics import ExporterCollector, ExporterState
        from umctl.sources.uvmtools import DEFAULT_KINDS, kinds_label

        self.state = ExporterState(sample=sample, kinds=kinds_label(DEFAULT_KINDS), version="bench")
        reg = CollectorRegistry()
        reg.register(ExporterCollector(self.state))
        self.server, _ = start_http_server(0, addr="127.0.0.1", registry=reg)
        self.url = f"http://127.0.0.1:{self.server.server_port}/metrics"
        self.agent = Agent(self.state, kinds=DEFAULT_KINDS, sample=sample, interval_s=interval_s, grace_s=60.0,
                           log=lambda m: None)
        self.stop_ev = threading.Event()
        self.threads = [threading.Thread(target=self.agent.run, args=(self.stop_ev,), daemon=True)]
        if scrape_s:
            self.threads.append(threading.Thread(target=self._scrape, args=(scrape_s,), daemon=True))
        self.scrapes = 0
        for t in self.threads:
            t.start()

    def _scrape(self, period: float) -> None:
        while not self.stop_ev.wait(period):
            self.get()
            self.scrapes += 1

    def get(self) -> str:
        with urllib.request.urlopen(self.url, timeout=5) as r:
            return r.read().decode()

    def close(self) -> None:
        self.stop_ev.set()
        for t in self.threads:
            t.join(10)
        self.server.shutdown()
        self.server.server_close()


def metric_sum(text: str, name: str, pid: int) -> float:
    """Sum of a metric's samples for one pid (every GPU) in exposition text."""
    pat = re.compile(rf'^{name}\{{[^}}]*pid="{pid}"[^}}]*\}} (\S+)$', re.M)
    return sum(float(v) for v in pat.findall(text))


def overhead_window(config: str, seconds: float) -> Window:
    exp = Exporter(CONFIGS[config]) if config != OFF else None
    t0 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    time.sleep(seconds)
    t1 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    w = Window(config, t0, t1)
    if exp is not None:
        with exp.state.lock:
            w.events = int(sum(sum(t.faults.values()) for t in exp.state.processes.values()))
            w.sampled = exp.state.sample
        exp.close()
    return w


def compare(pid: int, seconds: float) -> dict:
    """The exporter (10 %) and ``umctl attach --sample 1`` on the same loop at once."""
    exp = Exporter(0.1, scrape_s=None)
    time.sleep(3.0)   # attached and past its first interval
    points: list[tuple[float, float, float]] = []
    stop = threading.Event()

    def scrape() -> None:
        while not stop.wait(1.0):
            text = exp.get()
            points.append((time.monotonic(), metric_sum(text, "umctl_gpu_faults_total", pid),
                           metric_sum(text, "umctl_gpu_fault_batches_total", pid)))

    th = threading.Thread(target=scrape, daemon=True)
    th.start()
    t_launch = time.monotonic()
    att = subprocess.run(["umctl", "attach", "--pid", str(pid), "--sample", "1", "--no-launches",
                          "--duration", f"{seconds:g}", "--interval", "5"], capture_output=True, text=True)
    t_done = time.monotonic()
    stop.set()
    th.join(5)
    exp.close()
    m = re.search(r"GPU faults\s+~?([\d,]+) in ~?([\d,]+) batches", att.stdout)
    if att.returncode != 0 or m is None:
        sys.exit(f"exporter_overhead: umctl attach failed (rc {att.returncode}): "
                 f"{(att.stderr or att.stdout).strip().splitlines()[-1:]}")
    a_faults, a_batches = (int(x.replace(",", "")) for x in m.groups())
    # the exporter's rate over the part of attach's minute its scrapes bracket (attach starts
    # after its own Python start-up, ~1-2 s after launch; its --duration is then exact)
    inside = [p for p in points if t_launch + 3.0 <= p[0] <= t_done - 1.0]
    if len(inside) < 2:
        sys.exit("exporter_overhead: too few scrapes inside attach's window")
    (ta, fa, ba), (tb, fb, bb) = inside[0], inside[-1]
    return {"seconds": seconds, "attach_faults": a_faults, "attach_batches": a_batches,
            "attach_faults_per_s": a_faults / seconds, "attach_batches_per_s": a_batches / seconds,
            "exporter_faults_per_s": (fb - fa) / (tb - ta), "exporter_batches_per_s": (bb - ba) / (tb - ta),
            "exporter_span_s": tb - ta, "attach_stdout": att.stdout[-2000:]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--window", type=float, default=5.0, help="seconds per window (the exporter's interval is 1 s)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--settle", type=float, default=1.0, help="seconds left out at each window's start")
    ap.add_argument("--warmup", type=float, default=8.0)
    ap.add_argument("--compare", type=float, default=60.0, help="seconds of exporter beside attach --sample 1 (0: skip)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    a = ap.parse_args()
    configs = list(CONFIGS)
    total = a.warmup + a.rounds * (2 * len(configs) + 1) * (a.window + 1.0) + a.compare + 60
    p, pid, lines = start_loop(total, [])
    time.sleep(a.warmup)
    cmp = None
    try:
        windows = interleaved_windows(configs, a.rounds, a.seed, lambda c: overhead_window(c, a.window),
                                      lambda w: f"~{w.events} faults")
        if a.compare > 0:
            cmp = compare(pid, a.compare)
    finally:
        p.kill()
        p.wait()
    steps = parse_steps(lines)
    per = paired_overheads(steps, windows, a.settle)
    off_ms = unattached_medians(steps, windows, a.settle)
    rows = [{"config": c, **summarize(per.get(c, [])), "overheads": per.get(c, [])} for c in configs]
    print(f"\nExporter overhead on one running PyTorch loop (host writes the batch every step); {a.rounds} rounds x "
          f"{a.window:g} s windows, /metrics scraped every 1 s; unattached step {statistics.median(off_ms):.2f} ms "
          f"median (windows {min(off_ms):.2f}-{max(off_ms):.2f})")
    print(f"{'configuration':34} {'n':>3} {'median %':>9} {'mean %':>8} {'95% interval':>17} {'step ratio':>10}")
    for r in rows:
        if not r["n"]:
            print(f"{r['config']:34} {0:>3}  (no complete windows)")
            continue
        ci = r["ci95"]
        print(f"{r['config']:34} {r['n']:>3} {r['median']:>+9.2f} {r['mean']:>+8.2f} "
              f"{f'{ci[0]:+.2f} .. {ci[1]:+.2f}':>17} {1 + r['mean'] / 100:>10.3f}")
    if cmp is not None:
        print(f"\nFault totals beside `umctl attach --sample 1` for {cmp['seconds']:g} s on the same loop")
        print(f"{'':28} {'exporter (10%)':>15} {'attach --sample 1':>18} {'ratio':>7}")
        for k in ("faults", "batches"):
            e, t = cmp[f"exporter_{k}_per_s"], cmp[f"attach_{k}_per_s"]
            print(f"{'GPU ' + k + '/s':28} {e:>15,.0f} {t:>18,.0f} {e / t if t else float('nan'):>7.3f}")
        print(f"(attach: {cmp['attach_faults']:,} faults in {cmp['attach_batches']:,} batches over {cmp['seconds']:g} s; "
              f"exporter rate over {cmp['exporter_span_s']:.1f} s of scrapes inside that window)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "unattached_ms": off_ms, "compare": cmp,
                       "windows": [w.__dict__ for w in windows]}, f, indent=1)


if __name__ == "__main__":
    main()
