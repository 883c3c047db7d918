"""Parameter sweeps of a controller mode on one workload (DeepUM table 6 / figure 12 and
figure 11 shapes). Speedups are over the paper's reference point (Config0, N = 8) and use
the steady-state time (iterations after the first) when the workload has several.

Scenarios are the real models scaled down (``workload.meta['scale']``): a kernel touches
``scale`` times as many UM blocks as on the full-size model, so a table of NumRows rows is
swept as ``NumRows x scale`` rows — it then holds the same share of a kernel's blocks as the
paper's table did. Without a scale (traces, hand-written scenarios) rows are used as given."""

from __future__ import annotations

from typing import Callable

from ..workload.workload import Workload
from .replay import run_modes

#: DeepUM table 6: (name, Assoc, NumSuccs, NumRows)
TABLE6 = [("Config0", 2, 4, 128), ("Config1", 2, 8, 128), ("Config2", 4, 4, 128), ("Config3", 2, 4, 512),
          ("Config4", 2, 8, 512), ("Config5", 4, 4, 512), ("Config6", 2, 4, 1024), ("Config7", 2, 8, 1024),
          ("Config8", 4, 4, 1024), ("Config9", 2, 4, 2048), ("Config10", 2, 8, 2048), ("Config11", 4, 4, 2048),
          ("Config12", 2, 4, 4096)]
#: DeepUM figure 11: degrees of prefetching (kernels ahead)
DEGREES = [1, 2, 4, 8, 16, 32, 64]


def _time(r) -> int:
    return r.steady_time_ns or r.time_ns


def sweep(workload: Workload, what: str, *, mode: str = "deepum", scale_rows: bool = True,
          progress: Callable[[int, int], None] | None = None) -> list[dict]:
    """Run ``mode`` once per point of the sweep ``what`` ('table' or 'degree')."""
    if what == "table":
        scale = float(workload.meta.get("scale", 1.0)) if scale_rows else 1.0
        points = [({"assoc": a, "num_succs": s, "num_rows": max(1, round(n * scale))}, name)
                  for name, a, s, n in TABLE6]
        ref = "Config0"
    elif what == "degree":
        points = [({"degree": n}, f"N={n}") for n in DEGREES]
        ref = "N=8"
    else:
        raise ValueError(f"unknown sweep {what!r}: use table or degree")
    rows = []
    for j, (opts, label) in enumerate(points):
        (r,) = run_modes(workload, [mode], mode_options={mode: opts})
        rows.append({"point": label, **opts, "time_ns": r.time_ns, "steady_time_ns": r.steady_time_ns,
                     "faults": r.faults, "table_bytes": r.controller.get("table_bytes"),
                     "prefetch_accuracy": r.prefetch_accuracy, "_t": _time(r)})
        if progress:
            progress(j + 1, len(points))
    base = next(r["_t"] for r in rows if r["point"] == ref)
    for r in rows:
        r["speedup"] = base / r.pop("_t")
    return rows
