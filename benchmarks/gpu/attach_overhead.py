"""GPU benchmark: what attaching costs a running PyTorch loop, factor by factor, measured
inside ONE process of the loop.

Why this design: separate processes of the same loop differ by up to 40 % in step time (one
process ran 67 ms steps, the next 96 ms: allocation placement, clocks), which buried a 2 %
effect under noise in the per-process benchmark this one replaces. Here one
long-lived ``benchmarks/gpu/workloads/wl_torch.py`` runs throughout, and umctl attaches and detaches in
windows: off, config A, off, config B, off, ... in a shuffled order each round. Each attached
window is compared with the mean of the unattached windows on either side of it, so slow drift
cancels; steps that straddle a window edge, and the first ``--settle`` seconds of each window,
are left out.

Configurations separate what being attached consists of:

  dup fd only          the target's /dev/nvidia-uvm fd duplicated into us (pidfd_getfd)
  tracker, nothing on  + an event tracker on our ring, no event type and no counter enabled
  counters only        + the counters tracker (the driver's va_space "tools enabled" state)
  gpu faults only      one event type, no counters
  default kinds        the default kinds, every event (``--sample 1``): faults, replays, CPU
                       faults, thrashing and counters, no flush
  default, sampled 10% what ``umctl attach`` / ``umctl top`` collect by default (--sample 10%)
  umctl attach default the same plus the kernel-launch uprobes (``umctl attach --pid P`` as is)
  default + flush 5 ms the flush that migrations or a controller switch on
  all kinds            + migration events, flush every 5 ms (``--kinds all``)

  python3 benchmarks/gpu/attach_overhead.py [--window 3] [--rounds 4] [--no-touch] [--json F]

Issue 34 §6, what the default sampling costs a fault-heavy managed-memory program, and what
``--sample 1`` costs: ``--preset sampling`` (the two configurations "default, sampled 10%" and
"default kinds", at least 5 windows each, interleaved). The loop's memory is managed
(wl_torch.py allocates through cudaMallocManaged) and its host writes the batch every step, so
it faults on every page of it twice a step; ``--batch-mib`` scales the faults per step. The
table's last line gives the fault rate the counters saw while attached (goal: >= 100 k/s).

Prints one table (paired overhead per configuration: median, mean and its 95 % interval over
windows; events/s; CPU and GPU faults per step from the counters) and writes ``--json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OFF = "not attached"


@dataclass
class Window:
    config: str
    t0_ns: int
    t1_ns: int
    events: int = 0
    counters: dict = field(default_factory=dict)   # counter deltas over the window
    sampled: float | None = None


@dataclass
class Step:
    start_ns: int
    end_ns: int
    ms: float


def parse_steps(lines: list[str]) -> list[Step]:
    """``STEP i ms t_end_ns`` lines of the workload (lines without the stamp are skipped)."""
    out = []
    for ln in lines:
        f = ln.split()
        if len(f) >= 4 and f[0] == "STEP":
            ms, end = float(f[2]), int(f[3])
            out.append(Step(end - int(ms * 1e6), end, ms))
    return out


def window_steps(steps: list[Step], w: Window, settle_ns: int) -> list[float]:
    """Step times wholly inside the window, after its settle time."""
    return [s.ms for s in steps if s.start_ns >= w.t0_ns + settle_ns and s.end_ns <= w.t1_ns]


def paired_overheads(steps: list[Step], windows: list[Window], settle_s: float = 0.5,
                     min_steps: int = 5) -> dict[str, list[float]]:
    """Per attached configuration, one overhead (%) per window: its median step against the mean
    of the medians of the nearest unattached windows before and after it (either alone at the
    ends). Windows with fewer than ``min_steps`` steps are skipped."""
    settle = int(settle_s * 1e9)
    med = [statistics.median(v) if len(v) >= min_steps else None
           for v in (window_steps(steps, w, settle) for w in windows)]
    out: dict[str, list[float]] = {}
    for i, w in enumerate(windows):
        if w.config == OFF or med[i] is None:
            continue
        around = []
        for rng in (range(i - 1, -1, -1), range(i + 1, len(windows))):
            for j in rng:
                if windows[j].config == OFF:
                    if med[j] is not None:
                        around.append(med[j])
                    break
        if around:
            out.setdefault(w.config, []).append(100.0 * (med[i] / statistics.fmean(around) - 1.0))
    return out


def summarize(values: list[float]) -> dict:
    """Median, mean and a 95 % interval of the mean (normal approximation; reported with n)."""
    n = len(values)
    if not n:
        return {"n": 0}
    mean = statistics.fmean(values)
    half = 1.96 * statistics.stdev(values) / math.sqrt(n) if n > 1 else float("nan")
    return {"n": n, "median": statistics.median(values), "mean": mean, "ci95": [mean - half, mean + half],
            "min": min(values), "max": max(values)}


# -- attaching, one configuration at a time -----------------------------------------------------
class DupOnly:
    """Only the duplicated va_space fds (what every attachment holds first)."""

    def __init__(self, pid: int):
        from umctl.driver import abi
        from umctl.driver.process import uvm_fds

        self.io = abi.Ioctl()
        self.pidfd = self.io.pidfd_open(pid)
        self.fds = [self.io.pidfd_getfd(self.pidfd, fd) for fd in uvm_fds(pid)]

    def close(self) -> None:
        for fd in self.fds + [self.pidfd]:
            self.io.close(fd)


class WithLaunches:
    """A source plus the launch probe, as ``umctl attach`` runs them."""

    def __init__(self, src, pid: int):
        from umctl.sources.uprobes import LaunchProbe

        self.src, self.probe = src, LaunchProbe(pid)
        self.probe.start()
        self.launches = 0

    def counters(self):
        return self.src.counters()

    def sample_fraction(self):
        return self.src.sample_fraction()

    def drain(self):
        self.launches += len(self.probe.drain())
        return self.src.drain()

    def stop(self):
        self.src.stop()

    def close(self):
        self.src.close()
        self.probe.close()


def attach(config: str, pid: int):
    from umctl.events.schema import Kind
    from umctl.sources.uvmtools import ALL_KINDS, DEFAULT_KINDS, UvmToolsSource
    from umctl.sources.uvmtools.sampling import VIEW_SAMPLE

    if config == "dup fd only":
        return DupOnly(pid)
    if config == "umctl attach default":
        return WithLaunches(UvmToolsSource(pid, DEFAULT_KINDS, flush_ms=0.0, sample=VIEW_SAMPLE).start(), pid)
    kw = {"tracker, nothing on": dict(kinds=frozenset(), counters=False, flush_ms=0.0),
          "counters only": dict(kinds=frozenset(), counters=True, flush_ms=0.0),
          "gpu faults only": dict(kinds=frozenset({Kind.FAULT}), counters=False, flush_ms=0.0),
          "default kinds": dict(kinds=DEFAULT_KINDS, counters=True, flush_ms=0.0),
          "default, sampled 10%": dict(kinds=DEFAULT_KINDS, counters=True, flush_ms=0.0, sample=VIEW_SAMPLE),
          "default + flush 5 ms": dict(kinds=DEFAULT_KINDS, counters=True, flush_ms=5.0),
          "all kinds": dict(kinds=ALL_KINDS, counters=True, flush_ms=5.0)}[config]
    return UvmToolsSource(pid, **kw).start()


CONFIGS = ["dup fd only", "tracker, nothing on", "counters only", "gpu faults only", "default kinds",
           "default, sampled 10%", "umctl attach default", "default + flush 5 ms", "all kinds"]


def run_window(config: str, pid: int, seconds: float) -> Window:
    src = attach(config, pid) if config != OFF else None
    t0 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    c0 = src.counters() if hasattr(src, "counters") else {}
    events = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.1)   # a view's refresh: take and decode what the drain thread gathered
        if hasattr(src, "drain"):
            events += len(src.drain())
    t1 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    w = Window(config, t0, t1)
    if hasattr(src, "drain"):
        c1 = src.counters()
        w.counters = {k: c1[k] - c0.get(k, 0) for k in c1}
        w.sampled = src.sample_fraction()
        src.stop()
        events += len(src.drain())
    w.events = events
    if src is not None:
        src.close()
    return w


def start_loop(seconds: float, extra: list[str]) -> tuple[subprocess.Popen, int, list[str]]:
    """benchmarks/gpu/workloads/wl_torch.py running for ``seconds``: started, its READY pid read, its STEP
    lines gathered in the background into the returned list, and let go."""
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "gpu", "workloads", "wl_torch.py"), "--wait", "--seconds", str(seconds)]
    p = subprocess.Popen(cmd + list(extra), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
    pid = int(p.stdout.readline().split()[1])
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(p.stdout.readline, "")), daemon=True).start()
    p.stdin.write("GO\n")
    p.stdin.flush()
    return p, pid, lines


def interleaved_windows(configs: list[str], rounds: int, seed: int, window: Callable[[str], Window],
                        label: Callable[[Window], str]) -> list[Window]:
    """Unattached and attached windows alternated, the configurations shuffled per round and an
    unattached window last, so that the loop's drift falls on both sides of every pair."""
    rng = random.Random(seed)
    windows: list[Window] = []
    for r in range(rounds):
        order = configs[:]
        rng.shuffle(order)
        for c in order:
            windows.append(window(OFF))
            windows.append(window(c))
            print(f"round {r} {c}: {label(windows[-1])}", file=sys.stderr, flush=True)
    windows.append(window(OFF))
    return windows


def unattached_medians(steps: list[Step], windows: list[Window], settle_s: float) -> list[float]:
    """Median step (ms) of each unattached window: the baseline the tables print."""
    return [statistics.median(v) for v in (window_steps(steps, w, int(settle_s * 1e9)) for w in windows
                                           if w.config == OFF) if v]


def format_table(rows: list[dict], fault_rate: float | None, min_fault_rate: float = 100e3) -> str:
    """The table this benchmark prints: one line per configuration (``rows`` as in ``--json``),
    then the fault rate the counters saw while attached (``faults_per_s`` in ``--json``).
    tools/gen_doc_tables.py prints committed results with it."""
    lines = [f"{'configuration':24} {'n':>3} {'median %':>9} {'mean %':>8} {'95% interval':>17} {'events/s':>10} "
             f"{'CPU flt/step':>12} {'GPU flt/step':>12}"]
    for r in rows:
        if not r["n"]:
            lines.append(f"{r['config']:24} {0:>3}  (no complete windows)")
            continue
        ci = r["ci95"]
        cpu = r.get("cpu_page_faults_per_step")
        gpu = r.get("gpu_page_faults_per_step")
        lines.append(f"{r['config']:24} {r['n']:>3} {r['median']:>+9.2f} {r['mean']:>+8.2f} "
                     f"{f'{ci[0]:+.2f} .. {ci[1]:+.2f}':>17} {r['events_per_s'] or 0:>10.0f} "
                     f"{'' if cpu is None else f'{cpu:.0f}':>12} {'' if gpu is None else f'{gpu:.0f}':>12}")
    if fault_rate:
        lines.append(f"fault rate while attached (counters, CPU + GPU, unsampled windows): {fault_rate:,.0f}/s"
                     + ("" if fault_rate >= min_fault_rate
                        else f"  -- BELOW {min_fault_rate:,.0f}/s: raise --batch-mib"))
    else:
        lines.append("fault rate: no unsampled window with counters (add 'default kinds' or 'counters only')")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--window", type=float, default=3.0, help="seconds per window")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--settle", type=float, default=0.5, help="seconds left out at each window's start")
    ap.add_argument("--warmup", type=float, default=8.0, help="seconds of the loop before the first window")
    ap.add_argument("--configs", default=";".join(CONFIGS), help="list separated by ';' (default: all)")
    ap.add_argument("--no-touch", action="store_true", help="the loop's host never writes the batch: no CPU faults")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-mib", type=int, default=None, help="the loop's managed batch (wl_torch.py default 64)")
    ap.add_argument("--preset", choices=("sampling",), help="sampling: the default sampling against --sample 1 "
                    "(issue 34 §6): configs 'default, sampled 10%%;default kinds', >= 5 rounds")
    ap.add_argument("--min-fault-rate", type=float, default=100e3, help="warn when the loop faults less than this")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.preset == "sampling":
        a.configs = "default, sampled 10%;default kinds"
        a.rounds = max(a.rounds, 5)
    configs = [c.strip() for c in a.configs.split(";") if c.strip()]
    bad = [c for c in configs if c not in CONFIGS]
    if bad:
        sys.exit(f"attach_overhead: unknown configuration(s) {bad}; choose from {CONFIGS}")
    total = a.warmup + a.rounds * (2 * len(configs) + 1) * (a.window + 0.3) + 30
    extra = (["--no-touch"] if a.no_touch else []) + (["--batch-mib", str(a.batch_mib)] if a.batch_mib else [])
    p, pid, lines = start_loop(total, extra)
    time.sleep(a.warmup)
    try:
        windows = interleaved_windows(configs, a.rounds, a.seed, lambda c: run_window(c, pid, a.window),
                                      lambda w: f"{w.events} events")
    finally:
        p.kill()
        p.wait()
    steps = parse_steps(lines)
    per = paired_overheads(steps, windows, a.settle)
    off_ms = unattached_medians(steps, windows, a.settle)
    rows = []
    for c in configs:
        ws = [w for w in windows if w.config == c]
        secs = sum((w.t1_ns - w.t0_ns) / 1e9 for w in ws)
        nsteps = sum(len(window_steps(steps, w, 0)) for w in ws)
        cnt = [w.counters for w in ws if w.counters]
        row = {"config": c, **summarize(per.get(c, [])), "overheads": per.get(c, []),
               "events_per_s": sum(w.events for w in ws) / secs if secs else None,
               "sampled": [w.sampled for w in ws]}
        if cnt and nsteps:
            for k in ("cpu_page_faults", "gpu_page_faults"):
                if k in cnt[0]:
                    row[k + "_per_step"] = sum(x.get(k, 0) for x in cnt) / nsteps
        full = [w for w in ws if w.counters and (w.sampled is None or w.sampled >= 0.999)]
        fsecs = sum((w.t1_ns - w.t0_ns) / 1e9 for w in full)
        if fsecs:
            row["faults_per_s"] = sum(w.counters.get("cpu_page_faults", 0) + w.counters.get("gpu_page_faults", 0)
                                      for w in full) / fsecs
        rows.append(row)
    rates = [r["faults_per_s"] for r in rows if r.get("faults_per_s")]
    kind = "no host writes (GPU faults only)" if a.no_touch else "host writes the batch every step (CPU + GPU faults)"
    print(f"\nAttach overhead on one running PyTorch loop ({kind}); {a.rounds} rounds x {a.window:g} s windows; "
          f"unattached step {statistics.median(off_ms):.2f} ms median (windows {min(off_ms):.2f}-{max(off_ms):.2f})")
    print(format_table(rows, max(rates) if rates else None, a.min_fault_rate))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "unattached_ms": off_ms, "no_touch": a.no_touch, "batch_mib": a.batch_mib,
                       "faults_per_s": max(rates) if rates else None,
                       "windows": [w.__dict__ for w in windows]}, f, indent=1)


if __name__ == "__main__":
    main()
