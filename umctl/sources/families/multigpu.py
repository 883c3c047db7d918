"""Single-GPU programs spread over several GPUs the way SnuRHAC does it (thesis ch. 6, §7.3).

SnuRHAC shows one virtual GPU: ``cudaMalloc`` becomes ``cudaMallocManaged`` (inputs start on
the host), and each kernel's grid is cut into one chunk of thread blocks per GPU along z, else
y, else x (§6.2); the 2-D grids here are cut along y, so GPU g owns a band of output rows. The
programs are from its evaluation (Table 7.10): PolyBench ``gemm`` and ``2mm`` (every GPU reads
its band of A but *all* of B, the reason §7.3 gives for their poor scaling) and Rodinia
``hotspot`` (a stencil: each GPU reads one halo row above and below its band from its
neighbours' partitions). Each step launches the kernel on every GPU, then synchronises all
of them. Inside a GPU's kernel the band is walked in ``tiles`` row blocks, each reading its A
rows and the whole of B (or its stencil rows), which gives the real reuse distance of B.
``gpu_mem`` is per GPU; the footprint is ``oversub x gpu_mem`` as for the one-GPU program.
"""

from __future__ import annotations

import math

import numpy as np

from ..workload import Buffer, Init, Workload, WorkloadBuilder
from .common import at_least, byte_pages, check, check_common, choice, first_page

#: Matrices of each program: (name, initialised by the host).
PROGRAMS: dict[str, tuple[tuple[str, bool], ...]] = {
    "gemm": (("A", True), ("B", True), ("C", False)),
    "2mm": (("A", True), ("B", True), ("C", True), ("D", True), ("tmp", False)),
    "stencil": (("temp_a", True), ("temp_b", False), ("power", True)),
}


def generate(params: dict) -> Workload:
    """The ``multigpu`` family: ``program`` over ``gpus`` GPUs."""
    check_common(params)
    program = choice(params, "program", tuple(PROGRAMS))
    G = params["gpus"]
    check(1 <= G <= 8, f"gpus must be between 1 and 8 (got {G})")
    at_least(params, "tiles", 1)
    check(params["tflops"] > 0 and params["hbm_gbps"] > 0, "tflops and hbm_gbps must be positive")
    mats = PROGRAMS[program]
    n = int(math.sqrt(params["oversub"] * params["gpu_mem"] / (len(mats) * 4)))
    check(n >= 16 * G, "footprint too small for this many GPUs: raise gpu_mem or oversub")
    b = WorkloadBuilder("scenario", n_gpus=G, gpu_mem=params["gpu_mem"])
    m = {name: b.alloc(name, n * n * 4, init=Init.HOST if host else Init.UNTOUCHED, emit=True) for name, host in mats}
    bands = np.linspace(0, n, G + 1).astype(np.int64)
    tiles = max(1, params["tiles"] // G)
    row = n * 4

    def rows(buf: Buffer, lo: int, hi: int) -> np.ndarray:
        return byte_pages(first_page(buf), np.array([lo * row]), np.array([hi * row]))

    def blocks(g: int) -> list[tuple[int, int]]:
        edges = np.linspace(bands[g], bands[g + 1], tiles + 1).astype(np.int64)
        return [(int(a), int(c)) for a, c in zip(edges[:-1], edges[1:]) if c > a]

    def launch(name: str, g: int, parts: list[tuple[np.ndarray, bool]], ns: float, bufs: tuple[Buffer, ...]) -> None:
        lo, hi = int(bands[g]), int(bands[g + 1])
        b.kernel(name, pages=parts, compute_ns=max(1, int(ns)), gpu=g, args=(lo, hi) + tuple(x.addr for x in bufs),
                 grid=(math.ceil(n / 16), math.ceil((hi - lo) / 16), 1), block=(16, 16, 1))

    def matmul(name: str, a: Buffer, bm: Buffer, c: Buffer, accumulate: bool) -> None:
        """c[band] (+)= a[band] x bm on every GPU: the y-partitioned grid of one kernel."""
        whole = bm.pages()
        for g in range(G):
            parts: list[tuple[np.ndarray, bool]] = []
            for lo, hi in blocks(g):
                parts += [(rows(a, lo, hi), False), (whole, False)]
                parts += ([(rows(c, lo, hi), False)] if accumulate else []) + [(rows(c, lo, hi), True)]
            flops = 2.0 * (bands[g + 1] - bands[g]) * n * n
            launch(name, g, parts, flops / params["tflops"] / 1e3, (a, bm, c))

    def stencil(cur: Buffer, nxt: Buffer, power: Buffer) -> None:
        for g in range(G):
            parts: list[tuple[np.ndarray, bool]] = []
            for lo, hi in blocks(g):
                parts += [(rows(cur, max(lo - 1, 0), min(hi + 1, n)), False), (rows(power, lo, hi), False),
                          (rows(nxt, lo, hi), True)]
            nbytes = 3.0 * (bands[g + 1] - bands[g]) * row
            launch("calculate_temp", g, parts, nbytes / params["hbm_gbps"], (cur, nxt, power))

    for it in range(params["iterations"]):
        b.iteration = it
        if program == "gemm":
            matmul("gemm_kernel", m["A"], m["B"], m["C"], accumulate=False)
        elif program == "2mm":
            matmul("mm2_kernel1", m["A"], m["B"], m["tmp"], accumulate=False)
            b.sync(-1)
            matmul("mm2_kernel2", m["tmp"], m["C"], m["D"], accumulate=True)
        else:
            cur, nxt = (m["temp_a"], m["temp_b"]) if it % 2 == 0 else (m["temp_b"], m["temp_a"])
            stencil(cur, nxt, m["power"])
        b.sync(-1)
    return b.build(meta={"n": n, "bands": bands.tolist()})
