"""Replay fidelity on real recordings: record workloads on the GPU with ``umctl run -o``, replay
each recording with mode ``none`` on the simulator, and compare the replayed time with the time
the program measured itself (issue 23, item 5).

    python3 benchmarks/gpu/fidelity_real.py record --out DIR [--only gemm,gather]   # GPU machine, root
    python3 benchmarks/gpu/fidelity_real.py probe --out DIR                         # GPU machine, root
    python3 benchmarks/gpu/fidelity_real.py replay DIR [DIR ...]                    # anywhere

``record`` runs each workload (benchmarks/gpu/workloads/wl_*.py) under ``umctl run --runtime --managed -o``,
writes ``NAME.parquet`` with the span the program timed itself over in its metadata
(``measured_span_ns``: what ``umctl replay NAME.parquet`` then replays, see
umctl/workload/tracefile.py) and ``NAME.json`` beside it (the measured time, the command, the
device), and prints the table. ``replay`` prints the table of recordings already made (the
shipped ones are tests/data/real/). ``probe`` records the access-pattern probes (``probe-run``,
run under umctl by ``probe``): one process, one phase per pattern, each phase timed on its own
and replayed over its own span; they are how the model was checked, never the validation runs.

Columns: measured (the program's own span), replayed (the simulator's time for that span),
error, and beside them the fault-batch service time the driver recorded in the span against
the simulator's stall, which is where a model error shows first.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: name -> (script, arguments): sized so each trace stays under 2 MB (faults are what it holds)
WORKLOADS: dict[str, tuple[str, list[str]]] = {
    "transformer": ("benchmarks/gpu/workloads/wl_transformer.py", ["--steps", "8"]),
    "gemm": ("benchmarks/gpu/workloads/wl_gemm_sweep.py", ["--sizes", "1024,2048,4096", "--reps", "3", "--passes", "2"]),
    "gather": ("benchmarks/gpu/workloads/wl_gather.py", ["--mib", "256", "--rows", "8192", "--steps", "12"]),
    "stencil": ("benchmarks/gpu/workloads/wl_stencil.py", ["--n2", "4096", "--n3", "256", "--sweeps", "12"]),
}

_DONE = re.compile(r"^DONE (\S+) t0=(\d+) t1=(\d+)", re.M)
_PHASE = re.compile(r"^PHASE (\S+) (\S+) t0=(\d+) t1=(\d+)", re.M)


def parse_done(stdout: str) -> tuple[float, int, int]:
    """(measured ms, t0 ns, t1 ns) from a workload's ``DONE ms t0=NS t1=NS ...`` line."""
    m = _DONE.search(stdout)
    if m is None:
        raise ValueError("no 'DONE ms t0=NS t1=NS' line in the workload's output")
    return float(m.group(1)), int(m.group(2)), int(m.group(3))


def annotate(src: Path, dst: Path, extra: dict) -> None:
    """Copy a trace with ``extra`` added to its metadata (events unchanged)."""
    from umctl.events.trace import TraceWriter, read_trace

    with read_trace(src) as tr:
        batch = tr.to_batch()
        meta = {**tr.meta, **extra}
        names = list(tr.names)
    with TraceWriter(dst, meta=meta, names=names) as w:
        w.write(batch)


def umctl_run(trace: Path, argv: list[str], timeout: float, kinds: str = "default") -> subprocess.CompletedProcess:
    cmd = ["umctl", "run", "-q", "--runtime", "--managed", "--kinds", kinds, "-o", str(trace), "--", sys.executable, *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def bare_run(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    """The same program under the runtime (managed memory) but without umctl attached: no
    tools-API events are delivered, so this is the program's time without the recording."""
    from umctl.runtime import child_env

    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=child_env(managed=True))


def record(name: str, out: Path, timeout: float = 300, bare: int = 1) -> Path:
    """Record one workload into out/NAME.parquet (+ NAME.json); returns the trace path."""
    script, args = WORKLOADS[name]
    raw = out / f"{name}.raw.parquet"
    p = umctl_run(raw, [script, *args], timeout)
    (out / f"{name}.log").write_text(p.stdout + p.stderr)
    if _DONE.search(p.stdout) is None:
        raise RuntimeError(f"{name}: exit {p.returncode}: {(p.stderr or p.stdout).strip().splitlines()[-1:]}")
    ms, t0, t1 = parse_done(p.stdout)   # a failed result check is reported, the timing still kept
    info = {"workload": name, "check": "ok" if p.returncode == 0 else f"FAILED (exit {p.returncode})", "command": " ".join(["umctl run --runtime --managed -o", f"{name}.parquet --",
                                                    "python3", script, *args]),
            "measured_ms": ms, "span_ns": [t0, t1], "recorded": time.strftime("%Y-%m-%d", time.gmtime())}
    trace = out / f"{name}.parquet"
    annotate(raw, trace, {"measured_span_ns": [t0, t1], "measured_ms": ms, "workload": name})
    raw.unlink()
    from umctl.events.trace import read_trace

    with read_trace(trace) as tr:
        gpu = tr.meta.get("gpu")
        info["device"] = gpu[0]["name"] if isinstance(gpu, list) and gpu and isinstance(gpu[0], dict) else None
        info["driver"] = tr.meta.get("driver")
    info["bare_ms"] = []
    for _ in range(bare):
        b = bare_run([script, *args], timeout)
        if _DONE.search(b.stdout):
            info["bare_ms"].append(parse_done(b.stdout)[0])
    (out / f"{name}.json").write_text(json.dumps(info, indent=1) + "\n")
    return trace


def calibration_for(meta: dict):
    """The calibration ``umctl replay`` picks for a recording: the shipped constants of the GPU
    and driver it ran on, else the built-in ones."""
    from umctl.sim.calibration import DEFAULT, Calibration, shipped_for

    cal = shipped_for(meta)
    return Calibration.load(cal) if cal else DEFAULT


def replay(trace: Path, span: tuple[int, int] | None = None) -> dict:
    """Replay a recording (over its measured span, or ``span``) with mode none and the
    calibration ``umctl replay`` would pick; the replayed and recorded figures of that span."""
    import numpy as np

    from umctl.controller.base import make_controller
    from umctl.events.schema import Kind
    from umctl.events.trace import read_trace
    from umctl.sim.engine import simulate
    from umctl.workload.tracefile import workload_from_trace

    with read_trace(trace) as tr:
        w = workload_from_trace(tr, span=span)
        t0, t1 = w.meta["replayed_span_ns"]
        rp = tr.events(Kind.REPLAY)
        rp = rp[(rp["t_ns"] >= t0) & (rp["t_ns"] <= t1)]
        f = tr.events(Kind.FAULT)
        f = f[(f["t_ns"] >= t0) & (f["t_ns"] <= t1)]
    calib = calibration_for(w.meta)
    r = simulate(w, make_controller("none"), calib=calib)
    return {"trace": trace.name, "span_ms": (t1 - t0) / 1e6, "replayed_ms": r.time_ns / 1e6,
            "sim_stall_ms": r.stall_ns / 1e6, "sim_batches": r.fault_batches, "sim_faults": r.faults,
            "rec_stall_ms": float(np.maximum(rp["t_ns"] - rp["t_start_ns"], 0).sum()) / 1e6,
            "rec_batches": int(len(rp)), "rec_pages": int(len(np.unique(f["addr"] >> np.uint64(12)))),
            "calibration": calib.name}


def error_pct(row: dict) -> float:
    """Replayed against the recorded run's own measurement, in %."""
    return (row["replayed_ms"] - row["measured_ms"]) / row["measured_ms"] * 100


def table(rows: list[dict]) -> str:
    head = (f"{'run':<32} {'measured':>10} {'replayed':>10} {'error':>7} {'unrecorded':>10}   {'rec. stall':>10}"
            f" {'sim stall':>10} {'rec. batches':>12} {'sim batches':>11}")
    lines = [head, "-" * len(head)]
    for r in rows:
        bare = f"{min(r['bare_ms']):>8.1f}ms" if r.get("bare_ms") else f"{'-':>10}"
        lines.append(f"{r['name']:<32} {r['measured_ms']:>8.1f}ms {r['replayed_ms']:>8.1f}ms {error_pct(r):>+6.1f}% {bare}   "
                     f"{r['rec_stall_ms']:>8.1f}ms {r['sim_stall_ms']:>8.1f}ms {r['rec_batches']:>12,} {r['sim_batches']:>11,}")
    return "\n".join(lines)


def replay_dir(d: Path) -> list[dict]:
    """Rows for every NAME.json + NAME.parquet pair in a folder."""
    rows = []
    for js in sorted(d.glob("*.json")):
        trace = js.with_suffix(".parquet")
        if not trace.exists():
            continue
        info = json.loads(js.read_text())
        if "phases" in info:   # a probe recording: one row per phase, each over its own span
            from umctl.events.trace import TraceError

            for ph in info["phases"]:
                try:
                    row = replay(trace, tuple(ph["span_ns"]))
                except TraceError:   # a phase without GPU faults (resident data) has nothing to replay
                    continue
                rows.append({"name": f"probe {ph['name']}", "measured_ms": ph["measured_ms"],
                             "bare_ms": ph.get("bare_ms", []), **row})
        else:
            rows.append({"name": info["workload"], "measured_ms": info["measured_ms"], "bare_ms": info.get("bare_ms", []),
                         **replay(trace)})
    return rows


# -- access-pattern probes ----------------------------------------------------------------

def probe_run(mib: int) -> None:
    """The probes, one phase each (run under ``umctl run --runtime --managed``; prints
    ``PHASE name ms t0=NS t1=NS`` per phase). Each phase uses fresh buffers of ``mib`` MiB."""
    import ctypes as C

    import numpy as np
    import torch

    if os.environ.get("UMCTL_RT_MANAGED") != "1":
        raise SystemExit("probe-run: run under `umctl run --runtime --managed`")
    dev = torch.device("cuda")
    n = (mib << 20) // 4

    def host(t):
        return np.ctypeslib.as_array((C.c_float * t.numel()).from_address(t.data_ptr()))

    def phase(name, body):
        torch.cuda.synchronize()
        t0n = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        t = time.perf_counter()
        body()
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t) * 1e3
        print(f"PHASE {name} {ms:.2f} t0={t0n} t1={time.clock_gettime_ns(time.CLOCK_MONOTONIC)}", flush=True)

    w = torch.ones(1024, device=dev)
    (w + 1).sum().item()
    w.add_(1.0)
    w.fill_(0.0)
    torch.cuda.synchronize()
    bufs = []

    def fresh(host_write: bool):
        x = torch.empty(n, device=dev)
        if host_write:
            host(x)[:] = 1.0
        bufs.append(x)
        torch.cuda.synchronize()
        return x

    # 1. the GPU writes memory nobody touched yet (torch's fresh blocks: activations, Adam state)
    x = fresh(False)
    phase("gpu-first-write", lambda: x.fill_(2.0))
    # 2. the GPU reads host-written memory (the calibrated cold pass)
    x2 = fresh(True)
    phase("host-then-gpu-read", lambda: x2.sum())
    # 3. the GPU reads and writes host-written memory
    x3 = fresh(True)
    phase("host-then-gpu-rw", lambda: x3.add_(1.0))
    # 4. many small kernels, each on its own 64 KiB of host-written memory (small tensors per block)
    x4 = fresh(True)
    step = 16 << 10

    def small():
        for i in range(0, min(n, 2048 * step), step):
            x4[i:i + step].add_(1.0)
    phase("small-kernels-64k", small)
    # 5. the host writes one float per page of GPU-resident memory, then the GPU reads it again
    x5 = fresh(True)
    x5.add_(1.0)
    torch.cuda.synchronize()
    h5 = host(x5)
    phase("host-touch-resident", lambda: h5.__setitem__(slice(None, None, 1024), 3.0))
    phase("gpu-reread-after-touch", lambda: x5.sum())

    def touch_reread():
        h5[::1024] = 4.0
        x5.sum()
    phase("host-touch-then-gpu-read", touch_reread)
    # 6. repeated passes over resident data: no faults, only kernel time
    phase("resident-passes", lambda: [x5.add_(1.0) for _ in range(20)])
    # 7. host traffic inside the span (a replayed span starts with nothing on the GPU, so
    # whatever the host touches must have come to the GPU within it):
    # the host fills fresh memory, then the GPU reads all of it / gathers 1/8 of its pages
    x6 = fresh(False)
    h6 = host(x6)
    phase("host-fill-then-gpu-read", lambda: (h6.__setitem__(slice(None), 5.0), x6.sum()))
    x7 = fresh(False)
    h7 = host(x7)
    rows = x7.view(-1, 256)
    idx = torch.randint(0, rows.shape[0], (rows.shape[0] // 32,), device=dev, generator=torch.Generator(device=dev).manual_seed(3))
    phase("host-fill-then-gpu-gather", lambda: (h7.__setitem__(slice(None), 6.0), rows.index_select(0, idx).sum()))
    # the GPU reads fresh host-filled memory, the host rewrites it (densely / one float per
    # page), the GPU reads it again
    for name, stride in (("gpu-read-host-rewrite-gpu-read", 1), ("gpu-read-host-touch-gpu-read", 1024)):
        x8 = fresh(True)
        h8 = host(x8)

        def body(x8=x8, h8=h8, stride=stride):
            x8.sum()
            torch.cuda.synchronize()
            h8[::stride] = 7.0
            x8.sum()
        phase(name, body)
    # ... or updates 512 random rows of 1 KiB (a sparse optimizer on the host, as wl_gather)
    x9 = fresh(True)
    h9 = host(x9).reshape(-1, 256)
    upd = np.random.default_rng(9).choice(len(h9), 512, replace=False)

    def update():
        x9.sum()
        torch.cuda.synchronize()
        h9[upd] = 8.0
        x9.sum()
    phase("gpu-read-host-update-gpu-read", update)


def probe(out: Path, mib: int, timeout: float = 300, kinds: str = "default") -> Path:
    """Record the probe phases (``kinds`` "+migrations" also records the bytes each CPU fault
    and fault batch moved; it slows fault service, so its times are not the probe's)."""
    name = "probe" if kinds == "default" else "probe-migrations"
    raw = out / f"{name}.raw.parquet"
    p = umctl_run(raw, [str(Path(__file__).resolve()), "probe-run", "--mib", str(mib)], timeout, kinds)
    (out / f"{name}.log").write_text(p.stdout + p.stderr)
    if p.returncode != 0:
        raise RuntimeError(f"probe: exit {p.returncode}: {(p.stderr or p.stdout).strip().splitlines()[-1:]}")
    phases = [{"name": m.group(1), "measured_ms": float(m.group(2)), "span_ns": [int(m.group(3)), int(m.group(4))]}
              for m in _PHASE.finditer(p.stdout)]
    if kinds == "default":
        b = bare_run([str(Path(__file__).resolve()), "probe-run", "--mib", str(mib)], timeout)
        bare_ms = {m.group(1): float(m.group(2)) for m in _PHASE.finditer(b.stdout)}
        for ph in phases:
            ph["bare_ms"] = [bare_ms[ph["name"]]] if ph["name"] in bare_ms else []
    trace = out / f"{name}.parquet"
    annotate(raw, trace, {"workload": name})
    raw.unlink()
    (out / f"{name}.json").write_text(json.dumps({"workload": name, "mib": mib, "kinds": kinds, "phases": phases},
                                                 indent=1) + "\n")
    return trace


#: probe phases the fault path is fitted on, and the ones that check the fit
FIT_PHASES = ("gpu-first-write", "host-then-gpu-read")
CHECK_PHASES = ("host-then-gpu-rw", "gpu-reread-after-touch", "small-kernels-64k", "host-touch-then-gpu-read")


def _bisect(f, lo: float, hi: float, want: float, increasing: bool, steps: int = 40) -> float:
    for _ in range(steps):
        mid = (lo + hi) / 2
        if (f(mid) < want) == increasing:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def fit(probe_dir: Path) -> dict:
    """The recorded fault path from the probe recording alone (never the validation runs), to
    see whether the calibration's constants explain the probes (docs/evaluation/fidelity-h100.md: they do
    not transfer between phases, so the shipped calibration keeps its values):
    ``batch_ns`` so the simulated stall of ``gpu-first-write`` (zero-fill, nothing moves)
    equals the batch service the driver recorded, then ``fault_h2d_Bps`` so that of
    ``host-then-gpu-read`` (every page moves) does; ``cpu_fault_ns_per_GiB`` is the measured
    ``host-touch-resident`` phase (one float per page of GPU-resident memory) per GiB. Returns
    the fitted fields, and prints the check phases under them."""
    from umctl.controller.base import make_controller
    from umctl.events.trace import read_trace
    from umctl.sim.calibration import Calibration
    from umctl.sim.engine import simulate
    from umctl.workload.tracefile import workload_from_trace

    info = json.loads((probe_dir / "probe.json").read_text())
    phases = {ph["name"]: ph for ph in info["phases"]}
    base = Calibration.load("h100-r580")
    with read_trace(probe_dir / "probe.parquet") as tr:
        wl = {n: workload_from_trace(tr, span=tuple(phases[n]["span_ns"])) for n in FIT_PHASES + CHECK_PHASES}
    rec = {n: replay(probe_dir / "probe.parquet", tuple(phases[n]["span_ns"]))["rec_stall_ms"] * 1e6 for n in wl}

    def stall(name, cal):
        return simulate(wl[name], make_controller("none"), calib=cal).stall_ns

    batch_ns = _bisect(lambda v: stall(FIT_PHASES[0], base.with_overrides(batch_ns=int(v))), 0, 1e6,
                       rec[FIT_PHASES[0]], True)
    cal = base.with_overrides(batch_ns=int(round(batch_ns)))
    inv = _bisect(lambda v: stall(FIT_PHASES[1], cal.with_overrides(fault_h2d_Bps=1e9 / v)), 1e-3, 1.0,
                  rec[FIT_PHASES[1]], True)   # ns per byte
    cal = cal.with_overrides(fault_h2d_Bps=round(1e9 / inv, -6))
    touch = phases["host-touch-resident"]
    cal = cal.with_overrides(cpu_fault_ns_per_GiB=round(touch["measured_ms"] * 1e6 * 1024 / info["mib"], -5))
    print(f"{'phase':<28} {'recorded':>9} {'before':>9} {'fitted':>9}")
    for n in FIT_PHASES + CHECK_PHASES:
        print(f"{n:<28} {rec[n] / 1e6:>7.1f}ms {stall(n, base) / 1e6:>7.1f}ms {stall(n, cal) / 1e6:>7.1f}ms"
              f"{'   (fitted on)' if n in FIT_PHASES else ''}")
    keys = ("batch_ns", "fault_h2d_Bps", "cpu_fault_ns_per_GiB")
    out = {k: getattr(cal, k) for k in keys}
    print("fitted:", out, "(was", {k: getattr(base, k) for k in keys}, ")")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("--out", required=True)
    r.add_argument("--only", default=",".join(WORKLOADS))
    p = sub.add_parser("probe")
    p.add_argument("--out", required=True)
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--kinds", default="default", help="event kinds to record (+migrations: bytes moved)")
    pr = sub.add_parser("probe-run")
    pr.add_argument("--mib", type=int, default=256)
    rp = sub.add_parser("replay")
    rp.add_argument("dirs", nargs="+")
    ft = sub.add_parser("fit")
    ft.add_argument("dir", help="folder with probe.json and probe.parquet")
    a = ap.parse_args()
    if a.cmd == "fit":
        if not (Path(a.dir) / "probe.json").is_file() or not (Path(a.dir) / "probe.parquet").is_file():
            raise SystemExit(f"fidelity_real: no probe.json + probe.parquet in {a.dir} (record them with 'probe')")
        fit(Path(a.dir))
        return
    if a.cmd == "probe-run":
        probe_run(a.mib)
        return
    if a.cmd == "replay":
        rows = [row for d in a.dirs for row in replay_dir(Path(d))]
        if not rows:
            raise SystemExit("fidelity_real: no NAME.json + NAME.parquet recordings in " + ", ".join(a.dirs))
        print(table(rows))
        return
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.cmd == "probe":
        probe(out, a.mib, kinds=a.kinds)
    else:
        bad = [n for n in a.only.split(",") if n not in WORKLOADS]
        if bad:
            raise SystemExit(f"fidelity_real: unknown workload {bad[0]!r}; known: {', '.join(WORKLOADS)}")
        for name in a.only.split(","):
            try:
                record(name, out)
            except (RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
                print(f"{name}: {e}", file=sys.stderr)
    print(table(replay_dir(out)))


if __name__ == "__main__":
    main()
