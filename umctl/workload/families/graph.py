"""Graph analytics on a synthetic power-law CSR graph (the cuGraph jobs of memHarvester, ATC'22
§2.1 and Table 2: PageRank and BFS on social/web graphs that do not fit one GPU).

The graph is modelled at page granularity: vertices come in groups of 1024 (one page of a
4-byte per-vertex array); each group has a power-law share of the edges stored in its CSR rows
(``deg``) and of the edges pointing at it (``pop``), so col_idx is swept sequentially while the
per-vertex array it indexes is gathered irregularly, hot groups on every pass and cold ones
rarely. The sweep is cut into ``chunks`` waves of thread blocks; each wave reads its row_ptr
and col_idx pages, then the gathered pages in no particular order, then writes its outputs.
PageRank repeats the same sweep every iteration (the same graph); BFS expands a frontier level
by level from a new source each iteration, touching only the rows of frontier vertices.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ...units import PAGE_SIZE
from ..workload import Buffer, Init, Workload, WorkloadBuilder
from .common import (Tick, at_least, check, check_common, choice, drain, first_page, grid_for, npages,
                     pareto_weights, ranges)

#: Vertices per group: one page of a 4-byte per-vertex array (rank, dist, queue entries).
GROUP = PAGE_SIZE // 4
#: row_ptr pages per group (8-byte offsets).
ROWPTR_PAGES = 2
#: Bytes a kernel moves per gathered edge: one 32-byte sector of a random access.
SECTOR = 32
#: Per-vertex bytes besides col_idx: PageRank keeps row_ptr, out-degree, two rank vectors and
#: the contributions; BFS keeps row_ptr, distances and two frontier queues.
VERTEX_BYTES = {"pagerank": 8 + 4 + 4 + 4 + 4, "bfs": 8 + 4 + 4 + 4}


@dataclass(frozen=True)
class Graph:
    groups: int
    edges: int
    deg: np.ndarray     # share of edges stored in each group's rows
    pop: np.ndarray     # share of edges pointing into each group
    col_lo: np.ndarray  # first col_idx page of each group's rows
    col_n: np.ndarray   # col_idx pages of each group's rows


def make_graph(rng: np.random.Generator, groups: int, avg_degree: float, alpha: float) -> Graph:
    edges = int(groups * GROUP * avg_degree)
    deg = pareto_weights(rng, groups, alpha)
    pop = pareto_weights(rng, groups, alpha)
    end = np.cumsum(deg) * edges * 4
    start = end - deg * edges * 4
    col_lo = (start // PAGE_SIZE).astype(np.int64)
    col_n = np.maximum(1, np.ceil(end / PAGE_SIZE).astype(np.int64) - col_lo)
    return Graph(groups, edges, deg, pop, col_lo, col_n)


@dataclass
class Arrays:
    row_ptr: Buffer
    col_idx: Buffer
    vertex: dict[str, Buffer]


def sweep(g: Graph, arr: Arrays, order: np.ndarray, frac: np.ndarray, chunks: int, rng: np.random.Generator,
          gathered: Buffer, written: Buffer | None) -> tuple[list[tuple[np.ndarray, bool]], float]:
    """Access parts of a CSR sweep over the groups ``order`` (scanning ``frac`` of each group's
    edges) gathering from ``gathered`` and, if given, writing each group's page of ``written``.
    Returns the parts and the bytes the kernel moves (for its time)."""
    scanned = frac * g.deg[order] * g.edges
    cum = np.cumsum(scanned)
    cuts = np.searchsorted(cum, np.linspace(0.0, cum[-1], chunks + 1)[1:-1]) if len(cum) else []
    k = np.minimum(g.col_n[order], np.maximum(1, np.ceil(frac * g.col_n[order]).astype(np.int64)))
    offset = (rng.random(len(order)) * (g.col_n[order] - k + 1)).astype(np.int64)
    rp = first_page(arr.row_ptr) + ROWPTR_PAGES * order
    col = first_page(arr.col_idx) + g.col_lo[order] + offset
    parts: list[tuple[np.ndarray, bool]] = []
    seq_pages = 0
    for lo, hi in zip(np.concatenate([[0], cuts]).astype(int), np.concatenate([cuts, [len(order)]]).astype(int)):
        if hi <= lo:
            continue
        starts = np.stack([rp[lo:hi], col[lo:hi]], axis=1).ravel()
        lengths = np.stack([np.full(hi - lo, ROWPTR_PAGES), k[lo:hi]], axis=1).ravel()
        seq = ranges(starts, lengths)
        hit = np.flatnonzero(rng.random(g.groups) < -np.expm1(-scanned[lo:hi].sum() * g.pop))
        parts += [(seq, False), (first_page(gathered) + rng.permutation(hit), False)]
        if written is not None:
            parts.append((first_page(written) + order[lo:hi], True))
        seq_pages += len(seq) + (hi - lo if written is not None else 0)
    return parts, seq_pages * PAGE_SIZE + SECTOR * float(scanned.sum())


def graph_job(b: WorkloadBuilder, params: dict, *, footprint: int, pid: int = 0, gpu: int = 0,
              meta: dict | None = None) -> Iterator[Tick]:
    """Emit the algorithm's iterations (PageRank iterations, or one BFS per iteration) on a
    graph sized to ``footprint`` managed bytes."""
    algo = choice(params, "algorithm", tuple(VERTEX_BYTES))
    at_least(params, "avg_degree", 1)
    at_least(params, "chunks", 1)
    check(params["alpha"] > 0, f"alpha must be positive (got {params['alpha']})")
    check(params["hbm_gbps"] > 0, "hbm_gbps must be positive")
    groups = int(footprint // (GROUP * (VERTEX_BYTES[algo] + 4 * params["avg_degree"])))
    check(groups >= 2, "footprint too small for a graph: raise gpu_mem or oversub")
    seed = params["seed"]
    g = make_graph(np.random.default_rng([seed, 0]), groups, params["avg_degree"], params["alpha"])
    V = groups * GROUP

    def alloc(name: str, nbytes: int, init: Init = Init.UNTOUCHED) -> Buffer:
        return b.alloc(name, nbytes, init=init, pid=pid, gpu=gpu, emit=True)

    names = ("out_degree", "rank_a", "rank_b", "contrib") if algo == "pagerank" else ("dist", "queue_a", "queue_b")
    arr = Arrays(alloc("row_ptr", (V + 1) * 8, Init.HOST), alloc("col_idx", g.edges * 4, Init.HOST),
                 {n: alloc(n, V * 4, Init.HOST if n == "out_degree" else Init.UNTOUCHED) for n in names})
    scalar = alloc("reduction", PAGE_SIZE)
    if meta is not None:
        meta.update(vertices=V, edges=g.edges, algorithm=algo)
    bps = params["hbm_gbps"]
    grid = grid_for(V, 256)

    # Jobs interleave in one builder (multi-tenant), so every emission sets its own iteration.
    now = {"iteration": 0}

    def kernel(name: str, parts: list[tuple[np.ndarray, bool]], nbytes: float, *bufs: Buffer) -> Tick:
        ns = max(1, int(nbytes / bps))
        b.iteration = now["iteration"]
        b.kernel(name, pages=parts, compute_ns=ns, gpu=gpu, pid=pid, args=tuple(x.addr for x in bufs), grid=grid)
        return ns

    def stream(name: str, reads: tuple[Buffer, ...], writes: tuple[Buffer, ...]) -> Tick:
        parts = [(x.pages(), False) for x in reads] + [(x.pages(), True) for x in writes]
        return kernel(name, parts, sum(x.nbytes for x in reads + writes), *reads, *writes)

    def sync() -> Tick:
        b.iteration = now["iteration"]
        b.sync(gpu, pid=pid)
        return 0

    v = arr.vertex
    rng = np.random.default_rng([seed, 1])
    if algo == "pagerank":
        yield stream("pagerank_init", (), (v["rank_a"],))
        sweeps: dict[int, tuple[list[tuple[np.ndarray, bool]], float]] = {}
        for it in range(params["iterations"]):
            now["iteration"] = it
            cur, nxt = (v["rank_a"], v["rank_b"]) if it % 2 == 0 else (v["rank_b"], v["rank_a"])
            yield stream("pagerank_contrib", (cur, v["out_degree"]), (v["contrib"],))
            if nxt.addr not in sweeps:  # the same graph, so the same gathers, every iteration
                sweeps[nxt.addr] = sweep(g, arr, np.arange(groups), np.ones(groups), params["chunks"],
                                         np.random.default_rng([seed, 2]), v["contrib"], nxt)
            parts, nbytes = sweeps[nxt.addr]
            yield kernel("spmv_csr_pull", parts, nbytes, arr.row_ptr, arr.col_idx, v["contrib"], nxt)
            yield stream("pagerank_residual", (cur, nxt), (scalar,))
            yield sync()  # the host reads the residual to test convergence
        return
    queue_pages = npages(v["queue_a"])
    for it in range(params["iterations"]):
        now["iteration"] = it
        source = int(rng.choice(groups, p=g.deg))
        qin, qout = v["queue_a"], v["queue_b"]
        yield kernel("bfs_init", [(v["dist"].pages(), True), (qin.pages()[:1], True)], v["dist"].nbytes, v["dist"], qin)
        front = np.zeros(groups)
        front[source] = 1.0 / GROUP
        visited = front.copy()
        for _ in range(64):  # levels
            hit = rng.random(groups) < -np.expm1(-GROUP * front)
            hit[np.argmax(front)] = True  # the group holding most of the frontier has some of it
            order = rng.permutation(np.flatnonzero(hit))
            scanned = float((front * g.deg).sum() * g.edges)
            chunks = max(1, int(round(params["chunks"] * scanned / g.edges)))
            parts, nbytes = sweep(g, arr, order, np.minimum(1.0, front[order]), chunks, rng, v["dist"], None)
            new = (1.0 - visited) * -np.expm1(-scanned * g.pop / GROUP)
            found = np.flatnonzero(rng.random(groups) < -np.expm1(-GROUP * new))
            n_in = min(queue_pages, int(np.ceil(front.sum() * GROUP * 4 / PAGE_SIZE)))
            n_out = min(queue_pages, int(np.ceil(new.sum() * GROUP * 4 / PAGE_SIZE)))
            parts = [(qin.pages()[:n_in], False)] + parts + [(first_page(v["dist"]) + found, True),
                                                             (qout.pages()[:n_out], True)]
            yield kernel("bfs_expand_top_down", parts, nbytes, qin, qout, v["dist"], arr.row_ptr, arr.col_idx)
            visited += new
            front = new
            qin, qout = qout, qin
            yield sync()  # the host reads the next frontier's size
            if front.sum() * GROUP < 1:
                break


def generate(params: dict) -> Workload:
    """The ``graph`` family: PageRank or BFS on one GPU, footprint ``oversub x gpu_mem``."""
    check_common(params)
    b = WorkloadBuilder("scenario", gpu_mem=params["gpu_mem"])
    meta: dict = {}
    drain(graph_job(b, params, footprint=int(params["oversub"] * params["gpu_mem"]), meta=meta))
    return b.build(meta=meta)
