"""Re-measure the simulator's calibration on this machine's GPU and write a calibration file
(``umctl replay --calibration FILE`` uses it). Needs an NVIDIA GPU, cupy, and root for the
fault counts (the UVM tools API). Prints the measurements; asserts nothing.

    python3 benchmarks/gpu/calibrate.py -o h200.json [--mib 1024] [--reps 3]

Measured, on a managed buffer (docs/evaluation/measurements.md gives the figures): a cold GPU pass over
host-written memory (read-only and read-write kernels), cuMemPrefetchAsync host->GPU and
GPU->host, pinned and pageable cudaMemcpy host->GPU, and — with the tools API attached to
this process — fault batches and distinct faulted pages per pass. Link rates are taken as
measured; the per-batch cost of the fault path is fitted so the simulated cold pass takes the
measured read-write time (umctl.sim.fit.fit_fault_path); the cost of each extra 2 MiB
block in a batch is the least-squares slope over the batches of strided passes (one page every
32 KiB to 2 MiB). ``--refit FILE`` recomputes
the calibration of an existing file from its measurements, without a GPU."""

from __future__ import annotations

import argparse
import ctypes as C
import datetime as _dt
import json
import statistics
import time

import numpy as np


class CUmemLocation(C.Structure):
    _fields_ = [("type", C.c_int), ("id", C.c_int)]


LOC_DEVICE, LOC_HOST = 1, 2


def main() -> None:
    import cupy as cp

    from umctl.events.schema import Kind
    from umctl.events.trace import collect_host_meta
    from umctl.sim.calibration import DEFAULT
    from umctl.sources.uvmtools import DEFAULT_KINDS, UvmToolsSource

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    nb = a.mib << 20
    free, total = cp.cuda.runtime.memGetInfo()
    if nb > free // 2:
        raise SystemExit(f"calibrate: {a.mib} MiB is more than half the GPU's free memory; use --mib")
    cuda = C.CDLL("libcuda.so.1")
    cuda.cuMemPrefetchAsync_v2.argtypes = [C.c_uint64, C.c_size_t, CUmemLocation, C.c_uint, C.c_void_p]
    cuda.cuMemPrefetchAsync_v2.restype = C.c_int
    mem = cp.cuda.malloc_managed(nb)
    x = cp.ndarray((nb // 4,), cp.float32, mem)  # malloc_managed returns a MemoryPointer
    host = np.ctypeslib.as_array((C.c_float * (nb // 4)).from_address(mem.ptr))
    sync = cp.cuda.runtime.deviceSynchronize

    def timed(f) -> float:
        sync()
        t = time.perf_counter()
        f()
        sync()
        return (time.perf_counter() - t) * 1e3

    def prefetch(loc: int) -> None:
        rc = cuda.cuMemPrefetchAsync_v2(mem.ptr, nb, CUmemLocation(loc, 0), 0, None)
        if rc:
            raise SystemExit(f"calibrate: cuMemPrefetchAsync_v2 failed ({rc})")

    x.sum()  # load the kernels before timing
    rows: dict[str, list[float]] = {k: [] for k in ("fault_ro_ms", "fault_rw_ms", "prefetch_h2d_ms", "prefetch_d2h_ms",
                                                      "pinned_h2d_ms", "pageable_h2d_ms")}
    pinned = cp.cuda.alloc_pinned_memory(nb)
    pinned_np = np.frombuffer(pinned, np.float32, nb // 4)
    pageable = np.ones(nb // 4, np.float32)
    dev = cp.empty(nb // 4, cp.float32)
    for _ in range(a.reps):
        host[:] = 1.0
        rows["fault_ro_ms"].append(timed(lambda: x.sum()))
        host[:] = 1.0
        rows["fault_rw_ms"].append(timed(lambda: x.__iadd__(1.0)))
        host[:] = 1.0
        rows["prefetch_h2d_ms"].append(timed(lambda: prefetch(LOC_DEVICE)))
        x += 1.0
        rows["prefetch_d2h_ms"].append(timed(lambda: prefetch(LOC_HOST)))
        rows["pinned_h2d_ms"].append(timed(lambda: dev.set(pinned_np)))
        rows["pageable_h2d_ms"].append(timed(lambda: dev.set(pageable)))
    med = {k: statistics.median(v) for k, v in rows.items()}

    # fault batches and distinct pages of one cold read-only pass, seen through the tools API
    counts = {}
    try:
        src = UvmToolsSource(__import__("os").getpid(), DEFAULT_KINDS).start()
        host[:] = 1.0
        src.drain()
        timed(lambda: x.sum())
        time.sleep(0.05)
        b = src.drain()
        f = b[Kind.FAULT]
        counts = {"fault_entries": int(len(f)), "fault_batches": int(len(b[Kind.REPLAY])),
                  "distinct_pages": int(len(np.unique(f["addr"] >> 12)))}
        # scattered access: one page every `stride` bytes, so batches span many 2 MiB blocks
        # (nothing for the density prefetcher); per batch: blocks, pages, service time
        rows_b: list[tuple[int, int, int]] = batch_shapes(b)
        for stride in (2 << 20, 1 << 20, 512 << 10, 128 << 10, 32 << 10):
            for _ in range(a.reps):
                host[:] = 1.0
                src.drain()
                timed(lambda: x[::stride // 4].sum())
                time.sleep(0.05)
                rows_b += batch_shapes(src.drain())
        src.close()
        counts["batch_shapes"] = rows_b
    except Exception as e:  # no root / no tools device: the rates still calibrate
        counts = {"error": str(e).splitlines()[0]}

    meta = collect_host_meta()
    measured = {"mib": a.mib, "reps": a.reps, **rows, **counts}
    cal = calibration_from(measured, meta)
    out = {"calibration": cal.as_dict(), "measured": measured,
           "host": meta, "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    with open(a.out, "w") as fh:
        json.dump(out, fh, indent=1)
    print(f"{'measurement':<18} {'median':>10}  rate")
    for k, v in med.items():
        rate = f"{nb / (v / 1e3) / 1e9:6.1f} GB/s"
        print(f"{k:<18} {v:8.2f} ms  {rate}")
    print("tools API:", {k: v for k, v in counts.items() if k != "batch_shapes"})
    if counts.get("batch_shapes"):
        sh = np.array(counts["batch_shapes"], dtype=np.float64)
        print(f"{'blocks/batch':<14} {'batches':>8} {'pages':>7} {'service us':>11}")
        for lo, hi in ((1, 1), (2, 2), (3, 4), (5, 8), (9, 16), (17, 64), (65, 4096)):
            m = (sh[:, 0] >= lo) & (sh[:, 0] <= hi)
            if m.any():
                print(f"{lo:>5}-{hi:<8} {int(m.sum()):>8} {sh[m, 1].mean():>7.1f} {sh[m, 2].mean() / 1e3:>11.1f}")
    print(f"fitted batch_ns = {cal.batch_ns} (default {DEFAULT.batch_ns}), "
          f"block_ns = {cal.block_ns} (least squares over the probes' batches); wrote {a.out}")


def batch_shapes(batch) -> list[tuple[int, int, int]]:
    """(distinct 2 MiB blocks, distinct pages, service ns) of each fault batch in an event
    batch from the tools API (service = the replay event's end minus its start)."""
    from umctl.events.schema import Kind

    f, r = batch[Kind.FAULT], batch[Kind.REPLAY]
    r = r[(r["t_start_ns"] > 0) & (r["t_ns"] > r["t_start_ns"])]
    if len(f) == 0 or len(r) == 0:
        return []
    pages = (f["addr"] >> np.uint64(12)).astype(np.int64)
    pairs = np.unique(np.stack([f["batch_id"].astype(np.int64), pages], axis=1), axis=0)  # distinct pages a batch
    ids, n_pages = np.unique(pairs[:, 0], return_counts=True)
    block_batch = np.unique(np.stack([pairs[:, 0], pairs[:, 1] >> 9], axis=1), axis=0)[:, 0]
    _, n_blocks = np.unique(block_batch, return_counts=True)   # same batch order as ids
    at = np.searchsorted(ids, r["batch_id"])
    ok = (at < len(ids)) & (ids[np.minimum(at, len(ids) - 1)] == r["batch_id"])
    at, r = at[ok], r[ok]
    return [(int(b), int(n), int(d)) for b, n, d in zip(n_blocks[at], n_pages[at], r["t_ns"] - r["t_start_ns"])]


def calibration_from(measured: dict, meta: dict):
    """Link rates as measured; the fault path fitted to the read-write cold pass (training
    kernels write most of what they fault in, and write faults cost more than reads)."""
    from umctl.sim.calibration import DEFAULT, fit_block_ns
    from umctl.sim.fit import fit_fault_path

    nb = measured["mib"] << 20
    med = {k: statistics.median(v) for k, v in measured.items() if k.endswith("_ms")}
    rate = {k: nb / (v / 1e3) for k, v in med.items()}
    gpu = meta.get("gpu")
    name = (gpu[0]["name"] if isinstance(gpu, list) and gpu else "gpu").replace("NVIDIA ", "").lower().replace(" ", "-")
    cal = DEFAULT.with_overrides(name=f"{name}-measured", prefetch_h2d_Bps=rate["prefetch_h2d_ms"],
                                 d2h_Bps=rate["prefetch_d2h_ms"], pinned_copy_Bps=rate["pinned_h2d_ms"],
                                 pageable_copy_Bps=rate["pageable_h2d_ms"],
                                 block_ns=fit_block_ns(measured.get("batch_shapes", [])))
    return fit_fault_path(med["fault_rw_ms"] * 1e6 * (1 << 30) / nb, cal)


def refit(path: str) -> None:
    """Recompute the calibration of an existing file from its measurements (no GPU needed)."""
    with open(path) as fh:
        data = json.load(fh)
    data["calibration"] = calibration_from(data["measured"], data.get("host", {})).as_dict()
    with open(path, "w") as fh:
        json.dump(data, fh, indent=1)
    print(f"refitted {path}: batch_ns = {data['calibration']['batch_ns']}")


if __name__ == "__main__":
    import sys

    if len(sys.argv) == 3 and sys.argv[1] == "--refit":
        refit(sys.argv[2])
    else:
        main()
