"""Attach overhead on a PyTorch training loop on managed memory (issue 4's goal: <= 2 % with
the default event kinds), per enabled kind set, launch probes included. Prints a table and
writes OUTDIR/bench_torch.json; asserts nothing (it is a benchmark).

    python3 tests/gpu/bench_torch_overhead.py OUTDIR [--steps 40] [--reps 2] [--only "default kinds;..."]

Configurations run interleaved (the order reverses every repetition); besides the pooled
median, each row gives the paired overhead: per repetition, the configuration's median step
against the same repetition's unattached median, then the median and range over repetitions
(drift between repetitions cancels out of each pair).

The loop is tests/gpu/wl_torch.py: every step the host touches one float per page of the
64 MiB input batch (a data loader writing into managed memory), so each step faults the
batch back to the GPU — a fault-heavy case, not a best case."""

import json
import os
import statistics
import subprocess
import sys
import threading
import time

from umctl.sources.uvmtools import ALL_KINDS, DEFAULT_KINDS, UvmToolsSource

HERE = os.path.dirname(os.path.abspath(__file__))


def one(kinds, launches: bool, steps: int, flush_ms: float = 5.0, counters: bool = True,
        touch: bool = True, sample: float = 1.0) -> dict:
    p = subprocess.Popen([sys.executable, os.path.join(HERE, "wl_torch.py"), "--wait", "--steps", str(steps)]
                         + ([] if touch else ["--no-touch"]),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
    pid = int(p.stdout.readline().split()[1])
    src = (UvmToolsSource(pid, kinds, flush_ms=flush_ms, counters=counters, sample=sample).start()
           if kinds is not None else None)
    probe = None
    if launches:
        from umctl.sources.uprobes import LaunchProbe

        probe = LaunchProbe(pid)
        probe.start()
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(p.stdout.readline, "")), daemon=True)
    reader.start()
    p.stdin.write("GO\n")
    p.stdin.flush()
    events = 0
    while reader.is_alive():
        time.sleep(0.02)
        if src is not None:
            events += len(src.drain())
        if probe is not None:
            events += len(probe.drain())
    p.wait(timeout=60)
    steps_ms = [float(ln.split()[2]) for ln in lines if ln.startswith("STEP")]
    out = {"step_ms": steps_ms, "events": events}
    if src is not None:
        out["dropped"] = src.stats()["dropped"]
        out["sampled_fraction"] = src.sample_fraction()
        out["counter_faults"] = src.counters().get("gpu_page_faults")
        src.stop()
        src.close()
    if probe is not None:
        out["launch_stats"] = {k: v for k, v in probe.stats().items() if k in ("launches", "ringbuf_drops")}
        probe.close()
    return out


def main() -> None:
    from umctl.events.schema import Kind

    outdir = sys.argv[1]
    steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 40
    reps = int(sys.argv[sys.argv.index("--reps") + 1]) if "--reps" in sys.argv else 2
    faults = frozenset({Kind.FAULT, Kind.REPLAY})
    # (name, kinds, launches, flush_ms, counters, host touches the batch every step[, sample])
    configs = [("not attached", None, False, 5.0, True, True),
               ("counters only", frozenset(), False, 0.0, True, True),
               ("default, sampled 10%", DEFAULT_KINDS, False, 0.0, True, True, 0.1),
               ("default, sampled 5%", DEFAULT_KINDS, False, 0.0, True, True, 0.05),
               ("default + launches, sampled 10%", DEFAULT_KINDS, True, 0.0, True, True, 0.1),
               ("default kinds", DEFAULT_KINDS, False, 5.0, True, True),
               ("default, no flush", DEFAULT_KINDS, False, 0.0, True, True),
               ("faults+replays", faults, False, 5.0, True, True),
               ("faults+replays, no flush", faults, False, 0.0, True, True),
               ("default kinds + launches", DEFAULT_KINDS, True, 5.0, True, True),
               ("all kinds", ALL_KINDS, False, 5.0, True, True),
               ("few faults: not attached", None, False, 5.0, True, False),
               ("few faults: default kinds", DEFAULT_KINDS, False, 5.0, True, False),
               ("few faults: default + launches", DEFAULT_KINDS, True, 5.0, True, False)]
    if "--only" in sys.argv:
        keep = set(sys.argv[sys.argv.index("--only") + 1].split(";"))
        configs = [c for c in configs if c[0] in keep or c[0] in ("not attached", "few faults: not attached")
                   and any(k.startswith("few faults") == c[0].startswith("few faults") for k in keep)]
    runs = {c[0]: [] for c in configs}
    for rep in range(reps):
        order = configs if rep % 2 == 0 else configs[::-1]   # interleave: drift hits every config alike
        for name, kinds, launches, flush, counters, touch, *sample in order:
            try:
                runs[name].append(one(kinds, launches, steps, flush, counters, touch, *sample))
            except Exception as e:  # a probe that cannot load is reported, not fatal
                runs[name].append({"error": str(e).splitlines()[0], "step_ms": []})
            r = runs[name][-1]   # progress, so a run cut short by a timeout still leaves figures
            st = r["step_ms"][5:]
            print(f"RUN rep {rep} {name}: median step {statistics.median(st) if st else float('nan'):.2f} ms, "
                  f"events {r.get('events')}, sampled {r.get('sampled_fraction')}", flush=True)
    table = []

    def med(name):
        st = [s for r in runs[name] for s in r["step_ms"][5:]]
        return statistics.median(st) if st else None

    for name, *_ in configs:
        base = med("few faults: not attached" if name.startswith("few faults") else "not attached")
        m = med(name)
        per_rep = [statistics.median(r["step_ms"][5:]) for r in runs[name] if len(r["step_ms"]) > 5]
        base_name = "few faults: not attached" if name.startswith("few faults") else "not attached"
        base_rep = [statistics.median(r["step_ms"][5:]) if len(r["step_ms"]) > 5 else None for r in runs[base_name]]
        paired = [100 * (statistics.median(r["step_ms"][5:]) / b - 1)
                  for r, b in zip(runs[name], base_rep) if b and len(r["step_ms"]) > 5]
        row = {"config": name, "step_ms_median": m, "overhead_pct": 100 * (m / base - 1) if m and base else None,
               "paired_overhead_pct_median": statistics.median(paired) if paired else None,
               "paired_overhead_pct_range": [min(paired), max(paired)] if paired else None,
               "rep_medians": per_rep,
               "events": [r.get("events") for r in runs[name]], "dropped": [r.get("dropped") for r in runs[name]],
               "sampled_fraction": [r.get("sampled_fraction") for r in runs[name]],
               "counter_faults": [r.get("counter_faults") for r in runs[name]],
               "errors": [r["error"] for r in runs[name] if "error" in r]}
        table.append(row)
        print(json.dumps(row))
    with open(os.path.join(outdir, "bench_torch.json"), "w") as f:
        json.dump({"table": table, "runs": runs}, f)


if __name__ == "__main__":
    main()
