"""HUM (PPoPP'20) at its own scale: §5.2's average speedups of HUM over CUDA per benchmark suite
(Figure 10), replayed on a V100 PCIe 16 GB (``v100-pcie3`` calibration), paper value against
umctl value.

    python3 benchmarks/papers/hum.py [--json] [--png out.png] [--calibration v100-pcie3]

Figure 10's per-application bars are not in the paper's text; what the text states is the
average per suite (HUM 1.20x Parboil, 1.26x Rodinia, 1.13x CUDA Samples, 1.21x over all 51)
and, per application, *why* it gains little or much. So each application the text names is
put on the ``hum`` scenario shape of the reason it gives (kernel-, host- or D2H-dominated;
kernels long enough to hide the copy; host computation to overlap; copy-dominated; source
rewritten; copy scheduling), every shape at the same size (2 GiB of device data on a 16 GiB
GPU: "hundreds of megabytes to a few gigabytes", §5.1), and umctl's suite value is the mean
over the named applications of that suite: 29 of the 51 (the text names no reason for the
others). Rows: the four HUM averages; "no difference" between CUDA-async and CUDA on Rodinia
and CUDA Samples (read as 1.00); CUDA-UM-opt and CUDA-UM, which the family does not model.
Nothing is fitted. About a minute on two cores.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Progress, Row, run_main  # noqa: E402

PAPER = "HUM (PPoPP'20)"
CALIBRATION = "v100-pcie3"
#: Table 2: V100 PCIe with 16 GB; 2 GiB of device data per program (§5.1: "hundreds of
#: megabytes to a few gigabytes"); the speedups are ratios of rates, nearly size-free.
SIZE = {"gpu_mem": "16GiB", "fill": "0.125"}

#: Application -> (suite, scenario shape, the paper's words for it). Only applications §5.2
#: names, each on the shape of the reason it gives; an application named twice keeps the
#: reason that decides its speedup (spmv and b+tree: kernel time hides the copy).
APPS: dict[str, tuple[str, str, str]] = {
    "cutcp": ("Parboil", "hum-hostbound", "host computation dominates"),
    "mri-q": ("Parboil", "hum-kernelbound", "kernel execution dominates"),
    "sad": ("Parboil", "hum-d2hbound", "D2H copy dominates"),
    "sgemm": ("Parboil", "hum-gemm", "enough kernel time to hide the H2D copy"),
    "spmv": ("Parboil", "hum-gemm", "enough kernel time to hide the H2D copy"),
    "tpacf": ("Parboil", "hum-rewrite", "modifies the copy's source (no CPU/H2D overlap under HUM)"),
    "lbm": ("Parboil", "hum-rewrite", "modifies the copy's source (no CPU/H2D overlap under HUM)"),
    "gaussian": ("Rodinia", "hum-kernelbound", "kernel execution dominates"),
    "particlefilter": ("Rodinia", "hum-kernelbound", "kernel execution dominates"),
    "b+tree": ("Rodinia", "hum-gemm", "enough kernel time to hide the H2D copy"),
    "hybridsort": ("Rodinia", "hum-gemm", "enough kernel time to hide the H2D copy"),
    "leukocyte": ("Rodinia", "hum-gemm", "enough kernel time to hide the H2D copy"),
    "huffman": ("Rodinia", "hum-hostcompute", "overlaps the H2D copy with host computation"),
    "nn": ("Rodinia", "hum-copybound", "memory copy dominates"),
    "pathfinder": ("Rodinia", "hum-copybound", "memory copy dominates"),
    "srad": ("Rodinia", "hum-copybound", "memory copy dominates"),
    "cfd": ("Rodinia", "hum-rewrite", "modifies or frees the copy's source"),
    "MonteCarloMultiGPU": ("CUDA Samples", "hum-kernelbound", "kernel execution dominates"),
    "nbody": ("CUDA Samples", "hum-kernelbound", "kernel execution dominates"),
    "scan": ("CUDA Samples", "hum-kernelbound", "kernel execution dominates"),
    "transpose": ("CUDA Samples", "hum-kernelbound", "kernel execution dominates"),
    "SobolQRNG": ("CUDA Samples", "hum-d2hbound", "D2H copy dominates"),
    "BlackScholes": ("CUDA Samples", "hum-copybound", "memory copy dominates"),
    "mergeSort": ("CUDA Samples", "hum-copybound", "memory copy dominates"),
    "scalarProd": ("CUDA Samples", "hum-copybound", "memory copy dominates"),
    "threadFenceReduction": ("CUDA Samples", "hum-copybound", "memory copy dominates"),
    "warpAggregatedAtomicsCG": ("CUDA Samples", "hum-copybound", "copy much longer than the kernel"),
    "matrixMul": ("CUDA Samples", "hum-gemm", "kernel launch scheduled early (HUM > 1.10x, §5.2)"),
    "vectorAdd": ("CUDA Samples", "hum-vectoradd", "two copies back to back, copy scheduling (Fig. 7)"),
}
SUITES = ("Parboil", "Rodinia", "CUDA Samples")
SUITE_SIZE = {"Parboil": 11, "Rodinia": 22, "CUDA Samples": 18}

#: (row, metric, paper value, what the text says, umctl statistic or None)
CLAIMS: list[tuple[str, str, float, str, tuple[str, str] | None]] = [
    ("HUM, Parboil", "mean speedup over CUDA", 1.20, "§5.2: 1.20x for Parboil", ("hum", "Parboil")),
    ("HUM, Rodinia", "mean speedup over CUDA", 1.26, "§5.2: 1.26x for Rodinia", ("hum", "Rodinia")),
    ("HUM, CUDA Samples", "mean speedup over CUDA", 1.13, "§5.2: 1.13x for CUDA Code Samples", ("hum", "CUDA Samples")),
    ("HUM, all 51", "mean speedup over CUDA", 1.21, "abstract, §5.2: 1.21x on average", ("hum", "all")),
    ("CUDA-async, Rodinia", "mean speedup over CUDA", 1.00, "§5.2: 'no difference between CUDA-async and CUDA'",
     ("cuda_async", "Rodinia")),
    ("CUDA-async, CUDA Samples", "mean speedup over CUDA", 1.00, "§5.2: 'no difference between CUDA-async and CUDA'",
     ("cuda_async", "CUDA Samples")),
    ("CUDA-UM-opt, all 51", "mean speedup over CUDA", 1.22, "§5.2: 1.22x; managed memory with prefetch hints "
     "is not modelled by the hum family", None),
    ("CUDA-UM vs CUDA-async, SobolQRNG", "slowdown", 88.0, "§5.2: CUDA-UM 88x slower than CUDA-async; "
     "the naive UM port is not modelled", None),
]


def paper_rows() -> list[Row]:
    """The published numbers, without umctl values (what tests check against the seed)."""
    return [Row(PAPER, "Figure 10 / §5.2", row, metric, value, note=note) for row, metric, value, note, _ in CLAIMS]


def build(args) -> list[Row]:
    from umctl.controller import make_controller
    from umctl.sim.calibration import Calibration
    from umctl.sim.engine import simulate
    from umctl.workload.scenario import load_scenario

    calib = Calibration.load(args.calibration)
    shapes = sorted({s for _, s, _ in APPS.values()})
    progress = Progress(len(shapes))
    speed: dict[str, dict[str, float]] = {}
    for s in shapes:   # the synchronous program under CUDA and HUM, and its cudaMemcpyAsync version
        sync = load_scenario(s, {**SIZE, "async_copy": "false", "mixed_copies": "false"})
        hand = load_scenario(s, {**SIZE, "async_copy": "true"})
        cuda = simulate(sync, make_controller("none"), calib=calib).time_ns
        speed[s] = {"hum": cuda / simulate(sync, make_controller("hum"), calib=calib).time_ns,
                    "hum_no_sched": cuda / simulate(sync, make_controller("hum-no-sched"), calib=calib).time_ns,
                    "cuda_async": cuda / simulate(hand, make_controller("none"), calib=calib).time_ns,
                    "cuda_ms": cuda / 1e6}
        progress.step(s)

    def mean(stat: str, suite: str) -> float:
        return statistics.mean(speed[shape][stat] for _a, (su, shape, _w) in APPS.items() if suite in ("all", su))

    rows = paper_rows()
    for r, (_row, _m, _v, _n, stat) in zip(rows, CLAIMS):
        if stat is None:
            continue
        r.umctl_value = mean(*stat)
        suite = stat[1]
        named = [a for a, (su, _s, _w) in APPS.items() if suite in ("all", su)]
        total = sum(SUITE_SIZE.values()) if suite == "all" else SUITE_SIZE[suite]
        r.note += f"; umctl: mean over the {len(named)} of {total} applications §5.2 names"
        r.extra = {"group": r.row.split(",")[0], "applications": {a: {"shape": APPS[a][1], stat[0]: round(speed[APPS[a][1]][stat[0]], 4)}
                                    for a in named}}
    return rows


def configure(ap) -> None:
    ap.add_argument("--calibration", default=CALIBRATION, help="calibration file or shipped name")


if __name__ == "__main__":
    run_main(build, __doc__.splitlines()[0], f"{PAPER}: Figure 10 suite averages, paper vs umctl "
             f"({CALIBRATION}, V100 16 GB)", configure)
