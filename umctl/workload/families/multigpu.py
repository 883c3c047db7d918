"""Single-GPU CUDA programs for a machine with several GPUs (SnuRHAC, thesis ch. 6, §7.3).

Each scenario is one program written for one GPU, as in SnuRHAC's evaluation (Table 7.10):
``cudaMalloc`` device buffers, ``cudaMemcpy`` of the inputs, kernels, ``cudaMemcpy`` of the
results back. It runs on GPU 0; ``gpus`` says how many (simulated) GPUs the machine has, which
is what a grid-partitioning mode (``snurhac``) may use. Under mode ``none`` the program runs as
written: the thesis's baseline (the original CUDA runtime on one GPU, no UM).

Every kernel carries its thread blocks (``umctl.workload.threadblocks``): its access stream in
thread-block order and, per memory operation, the affine range per thread block MAPA would
report (or "not analysable" for indirect accesses). Thread blocks are coarse tiles of the real
grid: a matrix kernel has a ``(2, tiles, 1)`` grid, a vector kernel ``(tiles, 1, 1)``.

Programs (the thesis's benchmarks, or the property they stand for):
  * ``gemm``, ``2mm``, ``3mm`` (PolyBench): row bands of the output; every thread block reads
    the whole of B (its column band of every row) -- §7.3's reason they scale poorly;
  * ``gesummv`` (PolyBench): matrix-vector, dominated by copying its two matrices;
  * ``stencil`` (Rodinia hotspot): time steps over two temperature grids, halo rows;
  * ``particles`` (particlefilter-like): one buffer under different patterns, kernel 1 by
    bands, kernel 2 gathering rows through a fixed index (not analysable) while updating its
    own band -- pages move between GPUs every step, in the same order every step;
  * ``lavamd`` (Rodinia lavaMD): each box reads its neighbour boxes through a neighbour list
    (not analysable, read-only);
  * ``histogram``: atomic updates of a shared histogram (SnuRHAC runs it on one GPU);
  * ``covariance`` (PolyBench): writes its symmetric result by rows *and* columns, so write
    ranges of all thread-block chunks overlap (SnuRHAC runs it on one GPU, §6.4).

The device footprint is ``fill x gpu_mem`` (the programs fit in one GPU, "the largest dataset
that fits", §7.3.1); ``oversub`` is accepted for uniformity and does not apply. With
``scale = "full"`` it is the program's device memory size in Table 7.10 instead.

``nodes`` makes the machine a cluster (the thesis's eight nodes of four V100s): ``nodes x gpus``
GPUs, ``gpus`` per node, node 0 holding the program's host memory (``meta["nodes"]``: the
simulator's topology). A kernel's grid gets at least as many thread-block rows as there are
GPUs (``tiles`` is raised to the GPU count), so that partitioning along y gives every GPU a slab.

``handwritten = true`` writes the program for all the GPUs of one node instead, as the CUDA
samples written for several GPUs do (the thesis's Figure 7.12 compares SnuRHAC with such
programs): each GPU gets its band of the banded inputs and outputs and a whole copy of the
inputs every band reads (B of gemm, B and C of 2mm, x of gesummv) in its own device memory,
copied with cudaMemcpyAsync from pinned host memory on a stream per GPU, and runs its band.
For gemm, 2mm and gesummv, whose bands need nothing from one another.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ...events.schema import CopyKind
from ...units import PAGE_SIZE
from ..threadblocks import AccessRange, KernelBlocks
from ..workload import Buffer, Workload, WorkloadBuilder
from .common import at_least, byte_pages, check, check_common, choice

#: Device buffers of each program: (name, copied in from the host, copied back), and the
#: shape of each buffer: "mat" (n x n floats) or "vec" (n floats).
PROGRAMS: dict[str, tuple[tuple[str, str, bool, bool], ...]] = {
    "gemm": (("A", "mat", True, False), ("B", "mat", True, False), ("C", "mat", True, True)),
    "2mm": (("A", "mat", True, False), ("B", "mat", True, False), ("C", "mat", True, False),
            ("D", "mat", True, True), ("tmp", "mat", False, False)),
    "3mm": (("A", "mat", True, False), ("B", "mat", True, False), ("C", "mat", True, False),
            ("D", "mat", True, False), ("E", "mat", False, False), ("F", "mat", False, False),
            ("G", "mat", False, True)),
    "gesummv": (("A", "mat", True, False), ("B", "mat", True, False), ("x", "vec", True, False),
                ("y", "vec", False, True), ("tmp", "vec", False, False)),
    "stencil": (("temp_a", "mat", True, True), ("temp_b", "mat", False, False), ("power", "mat", True, False)),
    "particles": (("X", "mat", True, True), ("W", "mat", True, False)),
    "lavamd": (("pos", "mat", True, False), ("charge", "mat", True, False), ("force", "mat", False, True)),
    "histogram": (("data", "mat", True, False), ("hist", "vec", False, True)),
    "covariance": (("data", "mat", True, False), ("symmat", "mat", False, True)),
}

#: Table 7.10's device memory size (MB) of the program each one stands for (``scale = "full"``).
FULL_MB: dict[str, float] = {
    "gemm": 3072, "2mm": 1280, "3mm": 1792, "gesummv": 8192, "stencil": 12288, "particles": 3360,
    "lavamd": 7492, "covariance": 128,
}
#: ``handwritten``: per program, each buffer's part on a GPU: "band" (rows n/G, or n/G elements of
#: a vector) or "all" (a whole copy on every GPU).
HANDWRITTEN: dict[str, dict[str, str]] = {
    "gemm": {"A": "band", "B": "all", "C": "band"},
    "2mm": {"A": "band", "B": "all", "C": "all", "D": "band", "tmp": "band"},
    "gesummv": {"A": "band", "B": "band", "x": "all", "y": "band", "tmp": "band"},
}
#: Most GPUs of one node, and of a cluster (the simulator's GPU masks).
MAX_NODE_GPUS, MAX_GPUS = 8, 32

Pages = Callable[[int, int, int], np.ndarray]


class _Program:
    """Emits one program's kernels with their thread blocks."""

    def __init__(self, b: WorkloadBuilder, n: int, tiles: int, params: dict):
        self.b, self.n, self.tiles, self.p = b, n, tiles, params
        self.row = n * 4

    # -- access helpers -----------------------------------------------------------------------
    def band(self, buf: Buffer, r0: int, r1: int, c0: int = 0, c1: int | None = None) -> np.ndarray:
        """Pages of rows [r0, r1) x columns [c0, c1) (floats) of a row-major n x n matrix."""
        r0, r1 = max(r0, 0), min(r1, self.n)
        c1 = self.n if c1 is None else c1
        if r1 <= r0:
            return np.zeros(0, np.int64)
        rows = np.arange(r0, r1, dtype=np.int64) * self.row
        if c0 == 0 and c1 == self.n:  # whole rows: one contiguous range
            return byte_pages(buf.addr // PAGE_SIZE, np.array([r0 * self.row]), np.array([r1 * self.row]))
        pages = byte_pages(buf.addr // PAGE_SIZE, rows + c0 * 4, rows + c1 * 4)
        return np.unique(pages)

    def op(self, buf: Buffer, write: bool, pages: Pages, *, coef=(0, 0, 0), lo: int = 0, hi: int = 0,
           affine: bool = True) -> tuple[AccessRange, Pages]:
        return AccessRange(buf.addr, buf.nbytes, buf.alloc_id, write, affine, tuple(coef), lo, hi), pages

    def kernel(self, name: str, grid: tuple[int, int, int], ops: list[tuple[AccessRange, Pages]], compute_ns: float,
               atomics: bool = False) -> None:
        """One launch: thread blocks in linear order, each touching its pages of every op."""
        gx, gy, gz = grid
        parts: list[tuple[np.ndarray, bool]] = []
        off = [0]
        for t in range(gx * gy * gz):
            bx, by, bz = t % gx, (t // gx) % gy, t // (gx * gy)
            n = 0
            for rng, pages in ops:
                pg = pages(bx, by, bz)
                parts.append((pg, rng.write))
                n += len(pg)
            off.append(off[-1] + n)
        kb = KernelBlocks(grid, np.array(off), [r for r, _ in ops])
        self.b.kernel(name, pages=parts, compute_ns=max(1, int(compute_ns)), grid=grid, block=(16, 16, 1),
                      args=tuple(r.addr for r, _ in ops), atomics=atomics, thread_blocks=kb)

    def ns_flops(self, flops: float) -> float:
        return flops / self.p["tflops"] / 1e3

    def ns_bytes(self, nbytes: float) -> float:
        return nbytes / self.p["hbm_gbps"]

    # -- kernels ------------------------------------------------------------------------------
    def matmul(self, name: str, a: Buffer, bm: Buffer, c: Buffer) -> None:
        """c (+)= a x bm: thread block (bx, by) computes rows band by, columns band bx."""
        n, row, T = self.n, self.row, self.tiles
        R, W = n // T, n // 2
        ops = [
            self.op(a, False, lambda bx, by, bz: self.band(a, by * R, (by + 1) * R), coef=(0, R * row, 0), hi=R * row),
            self.op(bm, False, lambda bx, by, bz: self.band(bm, 0, n, bx * W, (bx + 1) * W),
                    coef=(W * 4, 0, 0), hi=(n - 1) * row + W * 4),
            self.op(c, True, lambda bx, by, bz: self.band(c, by * R, (by + 1) * R, bx * W, (bx + 1) * W),
                    coef=(W * 4, R * row, 0), hi=(R - 1) * row + W * 4),
        ]
        self.kernel(name, (2, T, 1), ops, self.ns_flops(2.0 * n ** 3))

    def gesummv(self, A: Buffer, B: Buffer, x: Buffer, y: Buffer, tmp: Buffer) -> None:
        n, row, T = self.n, self.row, self.tiles
        R = n // T
        vec = lambda buf: lambda bx, by, bz: byte_pages(buf.addr // PAGE_SIZE, np.array([bx * R * 4]),  # noqa: E731
                                                        np.array([(bx + 1) * R * 4]))
        ops = [
            self.op(A, False, lambda bx, by, bz: self.band(A, bx * R, (bx + 1) * R), coef=(R * row, 0, 0), hi=R * row),
            self.op(B, False, lambda bx, by, bz: self.band(B, bx * R, (bx + 1) * R), coef=(R * row, 0, 0), hi=R * row),
            self.op(x, False, lambda bx, by, bz: x.pages(), hi=n * 4),
            self.op(tmp, True, vec(tmp), coef=(R * 4, 0, 0), hi=R * 4),
            self.op(y, True, vec(y), coef=(R * 4, 0, 0), hi=R * 4),
        ]
        self.kernel("gesummv_kernel", (T, 1, 1), ops, self.ns_bytes(2.0 * n * row))

    def stencil(self, cur: Buffer, nxt: Buffer, power: Buffer) -> None:
        n, row, T = self.n, self.row, self.tiles
        R, W = n // T, n // 2
        ops = [
            self.op(cur, False, lambda bx, by, bz: self.band(cur, by * R - 1, (by + 1) * R + 1, bx * W, (bx + 1) * W),
                    coef=(W * 4, R * row, 0), lo=-row, hi=R * row + W * 4),
            self.op(power, False, lambda bx, by, bz: self.band(power, by * R, (by + 1) * R, bx * W, (bx + 1) * W),
                    coef=(W * 4, R * row, 0), hi=(R - 1) * row + W * 4),
            self.op(nxt, True, lambda bx, by, bz: self.band(nxt, by * R, (by + 1) * R, bx * W, (bx + 1) * W),
                    coef=(W * 4, R * row, 0), hi=(R - 1) * row + W * 4),
        ]
        self.kernel("calculate_temp", (2, T, 1), ops, self.ns_bytes(3.0 * n * row))

    def gather_index(self, salt: int, fraction: float) -> list[np.ndarray]:
        """Per thread block, the page-rows it gathers through an index array: a fixed
        pseudo-random choice (the same every time the program runs it)."""
        rng = np.random.default_rng(self.p["seed"] * 7919 + salt)
        rows_per_page = max(1, PAGE_SIZE // self.row)
        k = max(1, int(fraction * self.n / self.tiles))
        return [np.sort(rng.choice(self.n, size=k, replace=False)) // rows_per_page * rows_per_page
                for _ in range(self.tiles)]

    def particles(self, X: Buffer, Wt: Buffer, idx: list[np.ndarray]) -> None:
        """Kernel 1 updates X by bands; kernel 2 updates each band from rows of X gathered
        through an index (indirect, so neither static analysis nor read-only duplication
        applies), the same rows every step."""
        n, row, T = self.n, self.row, self.tiles
        R = n // T
        own = lambda bx, by, bz: self.band(X, bx * R, (bx + 1) * R)  # noqa: E731
        self.kernel("propagate", (T, 1, 1), [
            self.op(Wt, False, lambda bx, by, bz: self.band(Wt, bx * R, (bx + 1) * R), coef=(R * row, 0, 0), hi=R * row),
            self.op(X, True, own, coef=(R * row, 0, 0), hi=R * row),
        ], self.ns_bytes(3.0 * n * row))

        def gathered(bx: int, by: int, bz: int) -> np.ndarray:
            rows = idx[bx]
            return np.unique(byte_pages(X.addr // PAGE_SIZE, rows * row, (rows + 1) * row))

        self.kernel("resample", (T, 1, 1), [
            self.op(X, False, gathered, affine=False),
            self.op(X, True, own, coef=(R * row, 0, 0), hi=R * row),
        ], self.ns_bytes(2.0 * n * row))

    def lavamd(self, pos: Buffer, charge: Buffer, force: Buffer, nbr: list[np.ndarray]) -> None:
        n, row, T = self.n, self.row, self.tiles
        R = n // T
        box = lambda buf: lambda bx, by, bz: self.band(buf, bx * R, (bx + 1) * R)  # noqa: E731

        def neighbours(buf: Buffer) -> Pages:
            return lambda bx, by, bz: np.unique(byte_pages(buf.addr // PAGE_SIZE, nbr[bx] * row, (nbr[bx] + 1) * row))

        self.kernel("kernel_gpu_cuda", (T, 1, 1), [
            self.op(pos, False, box(pos), coef=(R * row, 0, 0), hi=R * row),
            self.op(pos, False, neighbours(pos), affine=False),
            self.op(charge, False, neighbours(charge), affine=False),
            self.op(force, True, box(force), coef=(R * row, 0, 0), hi=R * row),
        ], self.ns_flops(200.0 * n * n))

    def histogram(self, data: Buffer, hist: Buffer) -> None:
        n, row, T = self.n, self.row, self.tiles
        R = n // T
        self.kernel("histogram256", (T, 1, 1), [
            self.op(data, False, lambda bx, by, bz: self.band(data, bx * R, (bx + 1) * R), coef=(R * row, 0, 0),
                    hi=R * row),
            self.op(hist, True, lambda bx, by, bz: hist.pages(), hi=hist.nbytes),
        ], self.ns_bytes(4.0 * n * row), atomics=True)

    def covariance(self, data: Buffer, sym: Buffer) -> None:
        """covar_kernel: thread block j computes symmat[j band][j..] and mirrors it into
        symmat[..][j band]: row writes are disjoint, column writes span the whole matrix."""
        n, row, T = self.n, self.row, self.tiles
        R = n // T
        self.kernel("covar_kernel", (T, 1, 1), [
            self.op(data, False, lambda bx, by, bz: self.band(data, 0, n, bx * R, n), hi=n * row),
            self.op(sym, True, lambda bx, by, bz: self.band(sym, bx * R, (bx + 1) * R, bx * R, n),
                    coef=(R * row + R * 4, 0, 0), hi=R * row),
            self.op(sym, True, lambda bx, by, bz: self.band(sym, bx * R, n, bx * R, (bx + 1) * R),
                    coef=(R * row + R * 4, 0, 0), hi=(n - 1) * row + R * 4),
        ], self.ns_flops(1.0 * n ** 3))


def generate(params: dict) -> Workload:
    """The ``multigpu`` family: ``program`` written for one GPU, on a machine of ``gpus``."""
    check_common(params)
    program = choice(params, "program", tuple(PROGRAMS))
    per, nodes = params["gpus"], params["nodes"]
    check(1 <= per <= MAX_NODE_GPUS, f"gpus must be between 1 and {MAX_NODE_GPUS} (got {per}): GPUs per node")
    check(nodes >= 1, f"nodes must be at least 1 (got {nodes})")
    G = nodes * per
    check(G <= MAX_GPUS, f"nodes x gpus must be at most {MAX_GPUS} (got {nodes} x {per} = {G})")
    at_least(params, "tiles", 8)
    check(0 < params["fill"] <= 0.95, f"fill must be in (0, 0.95] (got {params['fill']})")
    check(params["tflops"] > 0 and params["hbm_gbps"] > 0, "tflops and hbm_gbps must be positive")
    scale = choice(params, "scale", ("fit", "full"))
    bufs = PROGRAMS[program]
    n_mat = sum(1 for _, shape, _, _ in bufs if shape == "mat")
    if scale == "full":
        check(program in FULL_MB, f"scale=full: {program} stands for no program of Table 7.10")
        foot = FULL_MB[program] * 2 ** 20
        check(foot <= 0.95 * params["gpu_mem"], f"scale=full: {program} needs {FULL_MB[program]:g} MB of device "
              "memory; raise gpu_mem (the thesis's V100s have 32GiB)")
    else:
        foot = params["fill"] * params["gpu_mem"]
    tiles = max(int(params["tiles"]), G)
    if params["handwritten"]:
        check(program in HANDWRITTEN, f"handwritten: only {', '.join(HANDWRITTEN)} (got {program})")
        check(nodes == 1, "handwritten: the program spreads over the GPUs of one node (nodes = 1)")
    n = int(math.sqrt(foot / (n_mat * 4))) // tiles * tiles
    check(n >= 64 * tiles, "footprint too small for this many tiles: raise gpu_mem or fill, or lower tiles")
    if params["handwritten"]:
        return _handwritten(program, n, G, tiles, params)
    b = WorkloadBuilder("scenario", n_gpus=G, gpu_mem=params["gpu_mem"])
    dev: dict[str, Buffer] = {}
    host: dict[str, Buffer] = {}
    for name, shape, copy_in, copy_out in bufs:
        nbytes = n * n * 4 if shape == "mat" else n * 4
        if copy_in or copy_out:
            host[name] = b.alloc(f"h_{name}", nbytes, managed=False, gpu=-1, emit=True)   # malloc
        dev[name] = b.alloc(name, nbytes, managed=False, gpu=0, emit=True)               # cudaMalloc
    for name, _, copy_in, _ in bufs:
        if copy_in:
            b.copy(host[name], dev[name], kind=CopyKind.H2D)
    prog = _Program(b, n, tiles, params)
    idx = prog.gather_index(1, params["gather"]) if program in ("particles", "lavamd") else []
    for it in range(params["iterations"]):
        b.iteration = it
        if program == "gemm":
            prog.matmul("gemm_kernel", dev["A"], dev["B"], dev["C"])
        elif program == "2mm":
            prog.matmul("mm2_kernel1", dev["A"], dev["B"], dev["tmp"])
            prog.matmul("mm2_kernel2", dev["tmp"], dev["C"], dev["D"])
        elif program == "3mm":
            prog.matmul("mm3_kernel1", dev["A"], dev["B"], dev["E"])
            prog.matmul("mm3_kernel2", dev["C"], dev["D"], dev["F"])
            prog.matmul("mm3_kernel3", dev["E"], dev["F"], dev["G"])
        elif program == "gesummv":
            prog.gesummv(dev["A"], dev["B"], dev["x"], dev["y"], dev["tmp"])
        elif program == "stencil":
            cur, nxt = (dev["temp_a"], dev["temp_b"]) if it % 2 == 0 else (dev["temp_b"], dev["temp_a"])
            prog.stencil(cur, nxt, dev["power"])
        elif program == "particles":
            prog.particles(dev["X"], dev["W"], idx)
        elif program == "lavamd":
            prog.lavamd(dev["pos"], dev["charge"], dev["force"], idx)
        elif program == "histogram":
            prog.histogram(dev["data"], dev["hist"])
        else:
            prog.covariance(dev["data"], dev["symmat"])
    b.sync(0)
    for name, _, _, copy_out in bufs:
        if copy_out:
            src = dev["temp_b"] if program == "stencil" and params["iterations"] % 2 and name == "temp_a" else dev[name]
            b.copy(src, host[name], kind=CopyKind.D2H)
    return b.build(meta={"n": n, "program": program, "nodes": nodes, "tiles": tiles})


def _handwritten(program: str, n: int, G: int, tiles: int, params: dict) -> Workload:
    """The program written for G GPUs of one node (see the module docstring)."""
    b = WorkloadBuilder("scenario", n_gpus=G, gpu_mem=params["gpu_mem"])
    prog = _Program(b, n, tiles, params)
    roles = HANDWRITTEN[program]
    bufs = PROGRAMS[program]
    host = {name: b.alloc(f"h_{name}", n * n * 4 if shape == "mat" else n * 4, managed=False, gpu=-1, emit=True)
            for name, shape, copy_in, copy_out in bufs if copy_in or copy_out}
    rows = [(g * n // G, (g + 1) * n // G) for g in range(G)]   # each GPU's band of rows (elements)
    width = {name: (n * 4 if shape == "mat" else 4) for name, shape, _, _ in bufs}
    dev: list[dict[str, Buffer]] = []
    for g, (r0, r1) in enumerate(rows):
        dev.append({name: b.alloc(f"{name}{g}", (n if roles[name] == "all" else r1 - r0) * width[name], managed=False,
                                  gpu=g, emit=True) for name, _, _, _ in bufs})
    part = {name: lambda buf, r0, r1, name=name: buf if roles[name] == "all" else
            buf.slice(r0 * width[name], (r1 - r0) * width[name]) for name in roles}
    for g, (r0, r1) in enumerate(rows):
        for name, _, copy_in, _ in bufs:
            if copy_in:
                b.copy(part[name](host[name], r0, r1), dev[g][name], kind=CopyKind.H2D, is_async=True, gpu=g)
    for it in range(params["iterations"]):
        b.iteration = it
        for g, (r0, r1) in enumerate(rows):
            d, share = dev[g], (r1 - r0) / n
            if program == "gemm":
                b.kernel("gemm_kernel", reads=[d["A"], d["B"]], writes=[d["C"]], gpu=g,
                         compute_ns=max(1, int(share * prog.ns_flops(2.0 * n ** 3))))
            elif program == "2mm":
                b.kernel("mm2_kernel1", reads=[d["A"], d["B"]], writes=[d["tmp"]], gpu=g,
                         compute_ns=max(1, int(share * prog.ns_flops(2.0 * n ** 3))))
                b.kernel("mm2_kernel2", reads=[d["tmp"], d["C"]], writes=[d["D"]], gpu=g,
                         compute_ns=max(1, int(share * prog.ns_flops(2.0 * n ** 3))))
            else:
                b.kernel("gesummv_kernel", reads=[d["A"], d["B"], d["x"]], writes=[d["tmp"], d["y"]], gpu=g,
                         compute_ns=max(1, int(share * prog.ns_bytes(2.0 * n * prog.row))))
    for g, (r0, r1) in enumerate(rows):
        for name, _, _, copy_out in bufs:
            if copy_out:
                b.copy(dev[g][name], part[name](host[name], r0, r1), kind=CopyKind.D2H, is_async=True, gpu=g)
    b.sync(-1)
    return b.build(meta={"n": n, "program": program, "nodes": 1, "tiles": tiles, "handwritten": True})
