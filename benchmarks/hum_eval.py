"""HUM (PPoPP'20 §5.2, Fig. 10) on the ``hum`` scenario family: each program shape run as plain
synchronous CUDA (``cudaMemcpy``), as the hand-written asynchronous version (CUDA-async:
``cudaMemcpyAsync``), and under HUM and HUM-no-sched (the synchronous program, unchanged: HUM's
runtime does the rest). Prints simulated times and speedups over CUDA, and their averages next
to the paper's (HUM 1.21x over CUDA; the hand-optimised UM version CUDA-UM-opt 1.22x; CUDA-async
"a little better than CUDA" on Parboil, no difference on Rodinia and the CUDA samples).

    python3 benchmarks/hum_eval.py [--stage-gbps 10] [--timeline hum.png]

``--stage-gbps`` overrides the staging rate of HUM's copy (calibration um_stage_Bps, measured
~10 GB/s with 8 threads on the H100) to show how the copy-scheduling gain depends on it.
"""

from __future__ import annotations

import argparse
import statistics

from umctl.controller import make_controller
from umctl.sim.calibration import DEFAULT
from umctl.sim.engine import simulate
from umctl.sim.replay import workload_bound
from umctl.workload.scenario import load_scenario

#: program shapes of the family (hum-async is hum-sync's CUDA-async version, so not a shape)
SHAPES = ["hum-sync", "hum-gemm", "hum-hostcompute", "hum-copybound", "hum-vectoradd", "hum-mixed", "hum-rewrite"]


def run_shape(name: str, calib, timeline: bool = False) -> dict:
    sync = load_scenario(name, {"async_copy": "false", "mixed_copies": "false"})
    hand = load_scenario(name, {"async_copy": "true"})
    out = {"shape": name, "bound": workload_bound(sync, calib)}
    for label, w, mode in (("cuda", sync, "none"), ("cuda_async", hand, "none"),
                           ("hum_no_sched", sync, "hum-no-sched"), ("hum", sync, "hum")):
        r = simulate(w, make_controller(mode), calib=calib, timeline=timeline)
        out[label] = r
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stage-gbps", type=float, default=None, help="HUM staging rate (GB/s)")
    ap.add_argument("--timeline", default=None, help="write HUM figure 8-style timelines of hum-vectoradd here")
    a = ap.parse_args()
    calib = DEFAULT if a.stage_gbps is None else DEFAULT.with_overrides(um_stage_Bps=a.stage_gbps * 1e9)
    print(f"staging {calib.um_stage_Bps / 1e9:.1f} GB/s, migration {calib.um_migrate_latency_ns / 1e3:.0f} us + "
          f"2 MiB at {calib.prefetch_h2d_Bps / 1e9:.1f} GB/s per chunk, cudaMemcpy pageable "
          f"{calib.pageable_copy_Bps / 1e9:.1f} GB/s, pinned {calib.pinned_copy_Bps / 1e9:.1f} GB/s\n")
    hdr = (f"| {'program':<16} | {'CUDA':>9} | {'CUDA-async':>10} | {'HUM-no-sched':>12} | {'HUM':>9} "
           f"| {'async ×':>7} | {'no-sched ×':>10} | {'HUM ×':>6} | {'HUM/async':>9} | {'wp wait':>8} | {'HUM % of bound':>14} |")
    print(hdr)
    print("|" + "|".join("-" * (len(c)) for c in hdr.split("|")[1:-1]) + "|")
    sp: dict[str, list[float]] = {"async": [], "nosched": [], "hum": [], "vs_async": []}
    for name in SHAPES:
        r = run_shape(name, calib)
        c, h, n, u = (r[k].time_ns / 1e6 for k in ("cuda", "cuda_async", "hum_no_sched", "hum"))
        sp["async"].append(c / h)
        sp["nosched"].append(c / n)
        sp["hum"].append(c / u)
        sp["vs_async"].append(h / u)
        wp = r["hum"].write_protect_wait_ns / 1e6
        b = r["bound"]
        pct = f"{100 * r['hum'].time_ns / b.time_ns:.0f} %" if b is not None and b.time_ns else "—"
        print(f"| {name:<16} | {c:7.1f}ms | {h:8.1f}ms | {n:10.1f}ms | {u:7.1f}ms | {c / h:6.2f}× | {c / n:9.2f}× "
              f"| {c / u:5.2f}× | {h / u:8.2f}× | {wp:6.1f}ms | {pct:>14} |")
    m = {k: statistics.mean(v) for k, v in sp.items()}
    g = {k: statistics.geometric_mean(v) for k, v in sp.items()}
    print(f"\naverage speedup over CUDA (arithmetic / geometric): CUDA-async {m['async']:.2f}× / {g['async']:.2f}×, "
          f"HUM-no-sched {m['nosched']:.2f}× / {g['nosched']:.2f}×, HUM {m['hum']:.2f}× / {g['hum']:.2f}×; "
          f"HUM over CUDA-async {m['vs_async']:.2f}× / {g['vs_async']:.2f}×")
    print("paper (V100, 51 programs, Fig. 10): HUM 1.21×, CUDA-UM-opt (hand-optimised UM) 1.22×, CUDA-async ≈ 1.0×"
          "–'a little better' than CUDA; HUM-no-sched slower than HUM throughout")
    if a.timeline:
        from umctl.report.png import timeline_png

        w = load_scenario("hum-vectoradd", {"iterations": "1"})
        rs = [simulate(w, make_controller(m), calib=calib, timeline=True) for m in ("none", "hum-no-sched", "hum")]
        timeline_png(rs, a.timeline, "hum-vectoradd (HUM Fig. 7): (a) CUDA, (b) HUM-no-sched, (c) HUM",
                     titles=["(a) CUDA", "(b) HUM without copy scheduling", "(c) HUM"])
        print(f"wrote {a.timeline}")


if __name__ == "__main__":
    main()
