"""The convolution probe: does umctl's DNN model fault the way cuDNN's convolutions do?

    python3 benchmarks/gpu/conv_probe.py record --out DIR [--batch 32] [--blocks 2,2,2,2]   # GPU machine, root
    python3 benchmarks/gpu/conv_probe.py replay DIR/convnet.parquet                           # anywhere

``record`` runs benchmarks/gpu/workloads/wl_convnet.py (a torchvision-style bottleneck ResNet step) under
``umctl run --runtime --managed -o``: one warm step, then cold steps that start with every page
on the host. ``replay`` takes each phase of the recording and prints what the driver recorded
(fault entries, distinct pages, batches, 2 MiB blocks per batch) beside three replays of it with
mode ``none``:

- ``recorded``: the faulted pages in recorded order, grouped into the recorded batches;
- ``window``: the same order, batches formed by the calibrated fault window instead;
- ``sorted``: each kernel's pages in address order with the calibrated window: what the
  synthetic DNN scenarios (umctl/workload/families/dnn.py) assume, a kernel walking its tensors
  page by page.

A recording knows only the pages that faulted, not the ones the driver's density prefetcher
moved beside them (a quarter of the bytes here), so these replays under-charge every phase
alike; the three differ only in order. The check that counts comes last: the fault path's
time (cold phase less warm phase) against what umctl's synthetic ResNet (:func:`model`, the
generator behind DeepUM's ResNet rows) predicts for the same net and batch.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fidelity_real import _PHASE, annotate, calibration_for, umctl_run  # noqa: E402

SCRIPT = "benchmarks/gpu/workloads/wl_convnet.py"


def record(out: Path, batch: int, blocks: str, kinds: str = "default", timeout: float = 400) -> Path:
    """Record the probe into out/convnet.parquet (``kinds`` "+migrations" also records the bytes
    each fault batch moved; that slows fault service, so such a run's times are not the probe's)."""
    raw = out / "convnet.raw.parquet"
    p = umctl_run(raw, [SCRIPT, "--batch", str(batch), "--blocks", blocks], timeout, kinds)
    (out / "convnet.log").write_text(p.stdout + p.stderr)
    if p.returncode != 0:
        raise SystemExit(f"conv_probe: exit {p.returncode}: {(p.stderr or p.stdout).strip().splitlines()[-1:]}")
    phases = [{"name": m.group(1), "measured_ms": float(m.group(2)), "span_ns": [int(m.group(3)), int(m.group(4))]}
              for m in _PHASE.finditer(p.stdout)]
    trace = out / "convnet.parquet"
    annotate(raw, trace, {"workload": "convnet", "phases": phases, "batch": batch, "blocks": blocks, "kinds": kinds})
    raw.unlink()
    return trace


def sorted_by_kernel(w):
    """The workload with each kernel's accesses in page order and no recorded batch groups."""
    from umctl.workload.workload import OpType, Workload

    pages, writes = w.acc_page.copy(), w.acc_write.copy()
    for op in w.ops[w.ops["type"] == OpType.KERNEL]:
        lo, hi = int(op["acc_lo"]), int(op["acc_hi"])
        if hi - lo > 1:
            o = np.argsort(pages[lo:hi], kind="stable")
            pages[lo:hi], writes[lo:hi] = pages[lo:hi][o], writes[lo:hi][o]
    return Workload(w.name, w.ops, pages, writes, w.allocations, w.names, w.n_gpus, w.gpu_mem, w.params,
                    w.meta, w.thread_blocks, None)


def replay(trace: Path) -> tuple[list[dict], dict]:
    """Each cold phase of a recording: what the driver recorded and the three replays; and the
    recording's metadata."""
    from umctl.controller.base import make_controller
    from umctl.events.schema import Kind
    from umctl.events.trace import read_trace
    from umctl.sim.engine import simulate
    from umctl.workload.tracefile import workload_from_trace
    from umctl.units import CPU

    rows = []
    with read_trace(trace) as tr:
        meta = dict(tr.meta)
        phases = meta.get("phases") or []
        if not phases:
            raise SystemExit(f"conv_probe: {trace} has no phases in its metadata (record it with 'record')")
        calib = calibration_for(meta)
        faults, rp, mig = tr.events(Kind.FAULT), tr.events(Kind.REPLAY), tr.events(Kind.MIGRATION)
        for ph in phases:
            t0, t1 = ph["span_ns"]
            f = faults[(faults["t_ns"] >= t0) & (faults["t_ns"] <= t1)]
            if not len(f):
                continue   # the warm step: nothing faulted, nothing to compare
            w = workload_from_trace(tr, span=(t0, t1))
            r = rp[(rp["t_ns"] >= t0) & (rp["t_ns"] <= t1)]
            batches = len(np.unique(f["batch_id"]))
            pairs = np.unique((f["batch_id"].astype(np.int64) << 28) ^ (f["addr"] >> np.uint64(21)).astype(np.int64))
            row = {"phase": ph["name"], "measured_ms": ph["measured_ms"], "entries": int(len(f)),
                   "pages": int(len(np.unique(f["addr"] >> np.uint64(12)))), "batches": int(batches),
                   "blocks_per_batch": len(pairs) / max(batches, 1),
                   "rec_service_ms": float(np.maximum(r["t_ns"] - r["t_start_ns"], 0).sum()) / 1e6}
            m = mig[(mig["t_ns"] >= t0) & (mig["t_ns"] <= t1) & (mig["src"] == CPU) & (mig["dst"] != CPU)]
            row["rec_h2d_bytes"] = int(m["bytes"].sum()) if len(m) else None   # None: not recorded
            windowed = copy.copy(w)
            windowed.acc_win = None
            for name, v in (("recorded", w), ("window", windowed), ("sorted", sorted_by_kernel(w))):
                s = simulate(v, make_controller("none"), calib=calib)
                row[name] = {"ms": s.time_ns / 1e6, "stall_ms": s.stall_ns / 1e6, "batches": s.fault_batches,
                             "faults": s.faults, "h2d_bytes": s.bytes_h2d}
            rows.append(row)
    return rows, meta


def model(batch: int, blocks: str, calibration: str = "h100-r580", gpu_mem: int = 79 << 30) -> dict:
    """What umctl's synthetic ResNet (umctl/workload/families/dnn.py, the model behind DeepUM's
    ResNet rows) predicts for the probe's step: four iterations of the same net at full size,
    the host touching every managed page between the third and the fourth (as the probe's
    to_host does; the replay counts that host time into the third); ``warm`` is the second
    iteration, ``cold`` the fourth. Compute comes from the
    scenario's cost model, not from the H100, so compare ``cold - warm`` (the fault path)."""
    from umctl.controller.base import make_controller
    from umctl.sim.calibration import Calibration
    from umctl.sim.engine import simulate
    from umctl.workload.families import dnn
    from umctl.workload.families.common import Params
    from umctl.workload.scenario import find_scenario, resolve_params
    from umctl.workload.workload import Buffer, WorkloadBuilder

    params = resolve_params(find_scenario("resnet152"), {"batch": str(batch), "iterations": "4", "scale": "full"})
    params.update(blocks=[int(x) for x in blocks.split(",")], gpu_mem=gpu_mem)
    p = Params(params)
    net = dnn.NETS["resnet"](p)
    per_iteration = len(dnn.trace(net, p["optimizer"]))
    # the generator lays the model out the same way every time: a first build names the buffers
    first = WorkloadBuilder("convnet-layout", gpu_mem=gpu_mem)
    for _ in dnn.job(first, Params({**params, "iterations": 1}), net, footprint=None):
        pass
    managed = [a for a in first.build().allocations if a["managed"]]
    b = WorkloadBuilder("convnet-model", gpu_mem=gpu_mem)
    for i, _ in enumerate(dnn.job(b, p, net, footprint=None)):
        if i + 1 == 3 * per_iteration:   # before the cold iteration
            for a in managed:
                b.host_write(Buffer(int(a["alloc_id"]), int(a["addr"]), int(a["bytes"]), pid=int(a["pid"])))
    w = b.build()
    calib = Calibration.load(calibration if calibration.endswith(".json") else f"{calibration}.json")
    r = simulate(w, make_controller("none"), calib=calib)
    ends = r.iteration_end_ns
    return {"footprint_bytes": int(w.managed_bytes), "warm_ms": (ends[1] - ends[0]) / 1e6,
            "cold_ms": (ends[3] - ends[2]) / 1e6, "cold_faults": int(r.iteration_faults[3]),
            "calibration": calib.name}


def against_model(meta: dict, rows: list[dict]) -> dict | None:
    """The fault path's time (each cold phase less the warm one), measured and as umctl's
    synthetic model of the recorded net and batch (the recording's metadata) predicts it
    (:func:`model`)."""
    warm = next((p["measured_ms"] for p in meta.get("phases") or [] if p["name"] == "warm"), None)
    if warm is None or "batch" not in meta or "blocks" not in meta:
        return None
    m = model(int(meta["batch"]), str(meta["blocks"]))
    pred = m["cold_ms"] - m["warm_ms"]
    phases = [{"phase": r["phase"], "measured_ms": r["measured_ms"] - warm, "model_ms": pred,
               "error_pct": 100.0 * (pred / (r["measured_ms"] - warm) - 1.0)} for r in rows]
    return {"batch": int(meta["batch"]), "blocks": str(meta["blocks"]), "model": m, "phases": phases}


def table(rows: list[dict]) -> str:
    out = ["| phase | measured ms | entries | pages | batches | blocks/batch | recorded service ms | recorded H2D MiB | "
           "replay recorded ms (stall, H2D MiB) | window | sorted |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        cells = [f"{r[k]['ms']:.1f} ({r[k]['stall_ms']:.1f}, {r[k]['h2d_bytes'] / 2**20:,.0f})"
                 for k in ("recorded", "window", "sorted")]
        h2d = "—" if r["rec_h2d_bytes"] is None else f"{r['rec_h2d_bytes'] / 2**20:,.0f}"
        out.append(f"| {r['phase']} | {r['measured_ms']:.1f} | {r['entries']:,} | {r['pages']:,} | {r['batches']:,} | "
                   f"{r['blocks_per_batch']:.2f} | {r['rec_service_ms']:.1f} | {h2d} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("--out", required=True)
    r.add_argument("--batch", type=int, default=32)
    r.add_argument("--blocks", default="2,2,2,2")
    r.add_argument("--kinds", default="default", help="event kinds to record (+migrations: bytes moved)")
    rp = sub.add_parser("replay")
    rp.add_argument("trace")
    rp.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.cmd == "record":
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        trace = record(out, a.batch, a.blocks, a.kinds)
    else:
        trace = Path(a.trace)
        if not trace.is_file():
            raise SystemExit(f"conv_probe: no such trace: {trace}")
    from umctl import UmctlError

    try:
        rows, meta = replay(trace)
        cmp = against_model(meta, rows)
    except UmctlError as e:   # TraceError included: not a trace, corrupt, nothing to replay
        raise SystemExit(f"conv_probe: {e}")
    if getattr(a, "json", False):
        print(json.dumps({"phases": rows, "model": cmp}, indent=1))
    else:
        print(table(rows))
        if cmp:
            m = cmp["model"]
            print(f"\numctl's ResNet model of the same net ({cmp['blocks']} blocks, batch {cmp['batch']}, "
                  f"{m['calibration']}): footprint {m['footprint_bytes'] / 2**30:.2f} GiB, warm {m['warm_ms']:.1f} ms, "
                  f"cold {m['cold_ms']:.1f} ms")
            for ph in cmp["phases"]:
                print(f"  {ph['phase']}: fault path (cold - warm) measured {ph['measured_ms']:.1f} ms, "
                      f"umctl {ph['model_ms']:.1f} ms, error {ph['error_pct']:+.1f} %")


if __name__ == "__main__":
    main()
