"""The published numbers of benchmarks/papers/{hum,snurhac,huvm}.py against the papers' own words.

Each paper's sentences or table lines the scripts take numbers from are quoted below verbatim;
the tests parse the numbers out of the quotes and compare them with the scripts' rows, so a
mistyped value or a dropped row fails here. Where the seed texts are at hand (UMCTL_SEEDS, a
folder with hum-ppopp20.txt, thesis-hum-deepum-snurhac.txt and huvm-memharvester-atc22.txt),
one more test checks that every quote occurs in them."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from test_papers_common import _load

hum = _load("hum")
snurhac = _load("snurhac")
huvm = _load("huvm")

#: thesis-hum-deepum-snurhac.txt, Table 7.11 (single-GPU performance), every line.
TABLE_7_11 = """\
binomialOptions	1.005	1.002	1.002
MonteCarloMultiGPU	1.001	1.004	1.004
Nbody	1.002	1.002	1.003
mri-q	0.515	0.985	0.984
sgemm	0.114	1.095	1.080
tpacf	0.994	0.993	1.000
hotspot	0.260	1.856	1.875
lavaMD	0.483	0.511	0.920
myocyte	1.001	1.002	1.001
particlefilter	0.921	0.992	0.991
2mm	0.643	0.972	0.972
3mm	0.665	0.971	0.971
correlation	0.951	0.975	0.984
covariance	0.958	0.979	0.978
gemm	0.807	1.030	1.029
gesummv	0.117	1.635	1.671
syr2k	0.937	0.977	0.991
syrk	0.995	1.000	1.003
Geomean	0.628	1.023	1.059"""

#: hum-ppopp20.txt §5.2 and thesis §7.1.2.
HUM_QUOTES = [
    "the average speedup of HUM is 1.21x (1.20x for Parboil, 1.26x for Rodinia, and 1.13x for CUDA Code Samples)",
    "While CUDA-UM-opt achieves the average speedup of 1.22x for all applications",
    "there is no difference between CUDA-async and CUDA for Rodinia and CUDA Code Samples on average",
    "In SobolQRNG, CUDA-UM is 88 times slower than CUDA-async",
]

#: huvm-memharvester-atc22.txt §6.2.1 and §6.2.2.
HUVM_QUOTES = [
    "leading to $3.53 \\times$ and $1.31 \\times$ improvement over Base and Pre-ef-host, respectively",
    "Our memHarvester can increase the performance of BFS by $3.52 \\times$ and $2.1 \\times$ compared to Base and Pre-ef-host",
    "mance impact of yielding GPUs is around 7~9%",
    "Our memHarvester can increase the performance of WCC by $3.83 \\times$ and $2.71 \\times$, and that of BFS by "
    "$3.21 \\times$ and $2.67 \\times$ compared to Base and Pre-ef-host, respectively",
    "There is no performance degradation in Pagerank running on the yielding GPU",
    "it still outperforms pre-ef-host by $30\\sim40\\%$",
    "Compared to Base, the harvesters show around $2.1\\sim2.36\\times$ improvement while the performance impact of "
    "yielding GPU is around 7%",
    "This leads to the throughput in memHarvester 1.5~1.6× higher than that in Pre-ef-host for the two models",
    "memHarvester improves throughput over Pre-ef-host by $2.16 \\times$ and $1.24 \\times$ for GNMT8 and VGG16",
]


def _numbers(s: str) -> list[float]:
    return [float(x) for x in re.findall(r"\d+(?:\.\d+)?", s)]


def test_snurhac_rows_are_table_7_11():
    lines = [ln.split("\t") for ln in TABLE_7_11.splitlines()]
    rows = snurhac.paper_rows()
    assert len(rows) == 3 * len(lines) == 57      # 18 applications and the geomean, 3 variants each
    table = {(r.row.split(" / ")[0], r.row.split(" / ")[1]): r.paper_value for r in rows}
    for app, *vals in lines:
        for v, x in zip(snurhac.VARIANTS, vals):
            assert table[app, v] == float(x), (app, v)
    modelled = [r for r in rows if r.row.split(" / ")[0] in snurhac.STAND_INS]
    assert len(modelled) == 30 and all(r.umctl_value is None for r in rows)


def test_hum_rows_are_the_texts_numbers():
    rows = hum.paper_rows()
    assert len(rows) == 8
    stated = {n for q in HUM_QUOTES for n in _numbers(q)}
    assert {r.paper_value for r in rows if r.paper_value != 1.0} <= stated
    by = {r.row: r.paper_value for r in rows}
    assert (by["HUM, Parboil"], by["HUM, Rodinia"], by["HUM, CUDA Samples"], by["HUM, all 51"]) == (1.20, 1.26, 1.13, 1.21)
    # the applications the text names, in the suites of its Figure 9
    assert sum(1 for s, _, _ in hum.APPS.values() if s == "Parboil") == 7
    assert sum(1 for s, _, _ in hum.APPS.values() if s == "Rodinia") == 10
    assert sum(1 for s, _, _ in hum.APPS.values() if s == "CUDA Samples") == 12


def test_huvm_rows_are_the_texts_numbers():
    rows = huvm.paper_rows()
    assert len(rows) == 20
    stated = {n for q in HUVM_QUOTES for n in _numbers(q)}
    single = {r.paper_value for r in rows if "midpoint" not in r.note and r.paper_value != 1.0 and "7 %" not in r.note}
    assert single <= stated
    for r in rows:   # a range's midpoint lies inside the range the text gives
        if "midpoint" in r.note:
            lo, hi = _numbers(r.note.split(":")[1])[:2]
            if "%" in r.note:  # "30~40 %" over pre-ef-host, "7~9 %" impact: percentages
                lo, hi = 1 + lo / 100, 1 + hi / 100
            assert lo <= r.paper_value <= hi, r.row
    assert sum(r.metric.startswith("speedup") for r in rows) == 16


def test_case_studies_exist_at_paper_scale():
    from umctl.workload.scenario import load_scenario

    # the scripts' overrides resolve (no replay: the 16 GiB cases take minutes)
    for case in (1, 2, 3, 4):
        info = load_scenario(f"huvm-case{case}", {**huvm.PAPER_SCALE, "gpu_mem": "64MiB"})
        assert info.n_gpus == 4


def test_tenants_job_rate_override():
    from umctl import UmctlError
    from umctl.workload.scenario import load_scenario

    base = load_scenario("huvm-pair", {"gpu_mem": "64MiB"})
    slow = load_scenario("huvm-pair", {"gpu_mem": "64MiB", "job_hbm_gbps": "150"})
    assert slow.ops["compute_ns"].sum() > 2 * base.ops["compute_ns"].sum()   # memory-bound kernels 10x slower
    with pytest.raises(UmctlError, match="job_hbm_gbps"):
        load_scenario("huvm-pair", {"gpu_mem": "64MiB", "job_hbm_gbps": "-1"})


#: The papers' texts are not part of the repository: point UMCTL_SEEDS at a folder holding them.
SEEDS = Path(os.environ["UMCTL_SEEDS"]) if os.environ.get("UMCTL_SEEDS") else None


@pytest.mark.skipif(SEEDS is None or not (SEEDS / "huvm-memharvester-atc22.txt").exists(),
                    reason="seed texts not at hand (set UMCTL_SEEDS)")
def test_quotes_occur_in_the_seed_texts():
    def norm(s: str) -> str:
        return re.sub(r"\s+", " ", s)

    thesis = norm((SEEDS / "thesis-hum-deepum-snurhac.txt").read_text())
    hum_text = norm((SEEDS / "hum-ppopp20.txt").read_text())
    huvm_text = norm((SEEDS / "huvm-memharvester-atc22.txt").read_text())
    for ln in TABLE_7_11.splitlines():
        assert norm(ln) in thesis, ln
    for q in HUM_QUOTES:
        assert norm(q) in hum_text or norm(q) in thesis, q
    for q in HUVM_QUOTES:
        assert norm(q) in huvm_text, q
