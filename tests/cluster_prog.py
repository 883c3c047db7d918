"""Partitioned programs on the SnuRHAC cluster agents, one MPI rank a node (run under mpirun by
tests/test_cluster.py): `python3 tests/cluster_prog.py CASE OUTDIR [GPUS_PER_NODE]`.

Each kernel is written as SnuRHAC's rewritten kernel would run: it gets the thread blocks of one
GPU and touches unified memory only through the node agent (read / write: page faults), so the
data it sees is exactly what the coherence protocol delivered. Buffers sit in separate 2 MiB UM
blocks and descriptors are spread one block a node (run=1), so descriptor owners, page owners and
faulting nodes differ. Rank 0 saves the results (OUTDIR/result.npz); every rank its statistics
(OUTDIR/rank<r>.json).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import numpy as np

from umctl.cluster.agent import ClusterError, NodeAgent
from umctl.cluster.runtime import ClusterRuntime
from umctl.units import BLOCK_SIZE

N = 96          # matrix side: a row band of 32 rows is 24 KiB, 6 pages
STEPS = 4
BULK = 8 * BLOCK_SIZE   # the bulk case's input
I8 = np.int64().itemsize


def buf(k: int) -> int:
    """Address of buffer k: its own UM block."""
    return k * BLOCK_SIZE


def rows_of(tbs: np.ndarray) -> tuple[int, int]:
    return int(tbs.min()), int(tbs.max()) + 1


def inputs(n: int = N) -> tuple[np.ndarray, np.ndarray]:
    """Small integers: every product exact."""
    i = np.arange(n * n, dtype=np.int64).reshape(n, n)
    return (i * 7 + 3) % 11 - 5, (i * 5 + 1) % 13 - 6


def host_in(rt: ClusterRuntime, *arrays: tuple[int, np.ndarray]) -> None:
    rt.host(lambda a: [a.write(addr, x) for addr, x in arrays])


def host_out(rt: ClusterRuntime, addr: int, shape, dtype=np.int64):
    return rt.host(lambda a: a.read(addr, int(np.prod(shape)) * np.dtype(dtype).itemsize).view(dtype).reshape(shape).copy())


def gemm_kernel(A: int, B: int, C: int, n: int):
    """C = A x B, one thread block a row of C: a GPU reads its band of A and all of B."""
    def k(agent: NodeAgent, tbs: np.ndarray) -> None:
        r0, r1 = rows_of(tbs)
        a = agent.read(A + r0 * n * I8, (r1 - r0) * n * I8).view(np.int64).reshape(-1, n)
        b = agent.read(B, n * n * I8).view(np.int64).reshape(n, n)
        agent.write(C + r0 * n * I8, a @ b)
    return k


def row_hull(base: int, n: int):
    return lambda tbs: {base: (base + int(tbs.min()) * n * I8, base + (int(tbs.max()) + 1) * n * I8)}


def stencil_kernel(src: int, dst: int, n: int):
    """dst[i, j] = src's 5-point sum mod 1009 (exact); a GPU reads its rows and one halo row on
    each side, written by its neighbours in the step before."""
    def k(agent: NodeAgent, tbs: np.ndarray) -> None:
        r0, r1 = rows_of(tbs)
        h0, h1 = max(r0 - 1, 0), min(r1 + 1, n)
        x = agent.read(src + h0 * n * I8, (h1 - h0) * n * I8).view(np.int64).reshape(-1, n)
        p = np.pad(x, ((1 if h0 == r0 else 0, 1 if h1 == r1 else 0), (1, 1)))
        out = (p[1:-1, 1:-1] + p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:]) % 1009
        agent.write(dst + r0 * n * I8, out)
    return k


def stencil_ref(x: np.ndarray, steps: int) -> np.ndarray:
    for _ in range(steps):
        p = np.pad(x, 1)
        x = (p[1:-1, 1:-1] + p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:]) % 1009
    return x


def case_gemm(rt: ClusterRuntime, out: dict) -> None:
    a, b = inputs()
    host_in(rt, (buf(0), a), (buf(1), b))
    plan = rt.launch(gemm_kernel(buf(0), buf(1), buf(2), N), (1, N, 1), read_only=[(buf(0), a.nbytes), (buf(1), b.nbytes)],
                     written=[(buf(2), a.nbytes)], write_hull=row_hull(buf(2), N))
    out["C"] = host_out(rt, buf(2), (N, N))
    out["fallback"] = str(plan.fallback)


def case_stencil(rt: ClusterRuntime, out: dict) -> None:
    """Bands of 100 rows over the nodes do not end on page boundaries: neighbours write the same
    page in the same kernel (false sharing), and read halo rows the other wrote."""
    n = 100
    x = inputs(n)[0] % 1009
    host_in(rt, (buf(0), x))
    src, dst = buf(0), buf(1)
    for _ in range(STEPS):
        rt.launch(stencil_kernel(src, dst, n), (1, n, 1), read_only=[(src, x.nbytes)], written=[(dst, x.nbytes)],
                  write_hull=row_hull(dst, n))
        src, dst = dst, src
    out["X"] = host_out(rt, src, (n, n))


def case_rodup(rt: ClusterRuntime, out: dict) -> None:
    """Read-only duplication, then a write: B is read by every node (flagged: copies stay), then
    scaled in place by each node's band (the flag goes; every other node's copy of a written page
    is unmapped after the kernel), then read whole by every node again (must see the new B)."""
    a, b = inputs()
    host_in(rt, (buf(0), a), (buf(1), b))
    g = gemm_kernel(buf(0), buf(1), buf(2), N)
    rt.launch(g, (1, N, 1), read_only=[(buf(0), a.nbytes), (buf(1), b.nbytes)], written=[(buf(2), a.nbytes)],
              write_hull=row_hull(buf(2), N))
    out["after_read"] = dict(rt.agent.st)

    def scale(agent: NodeAgent, tbs: np.ndarray) -> None:
        r0, r1 = rows_of(tbs)
        x = agent.read(buf(1) + r0 * N * I8, (r1 - r0) * N * I8).view(np.int64)
        agent.write(buf(1) + r0 * N * I8, x * 3 + 1)
    rt.launch(scale, (1, N, 1), written=[(buf(1), b.nbytes)], write_hull=row_hull(buf(1), N))
    out["after_write"] = dict(rt.agent.st)
    rt.launch(gemm_kernel(buf(0), buf(1), buf(3), N), (1, N, 1), read_only=[(buf(1), b.nbytes)],
              written=[(buf(3), a.nbytes)], write_hull=row_hull(buf(3), N))
    out["C1"] = host_out(rt, buf(2), (N, N))
    out["C2"] = host_out(rt, buf(3), (N, N))


def case_fallback(rt: ClusterRuntime, out: dict) -> None:
    """A histogram with atomics runs on GPU 0 only; a kernel whose every GPU writes every column
    sum (write overlap 1.0 > 0.5, like covariance) too; a row-band kernel is split."""
    a, _ = inputs()
    host_in(rt, (buf(0), a))

    def hist(agent: NodeAgent, tbs: np.ndarray) -> None:
        r0, r1 = rows_of(tbs)
        x = agent.read(buf(0) + r0 * N * I8, (r1 - r0) * N * I8).view(np.int64)
        h = agent.read(buf(1), 16 * I8).view(np.int64).copy()
        np.add.at(h, x % 16, 1)
        agent.write(buf(1), h)

    def colsum(agent: NodeAgent, tbs: np.ndarray) -> None:
        r0, r1 = rows_of(tbs)
        x = agent.read(buf(0) + r0 * N * I8, (r1 - r0) * N * I8).view(np.int64).reshape(-1, N)
        s = agent.read(buf(2), N * I8).view(np.int64).copy()
        agent.write(buf(2), s + x.sum(0))

    plans = [rt.launch(hist, (1, N, 1), atomics=True, read_only=[(buf(0), a.nbytes)]),
             rt.launch(colsum, (1, N, 1), read_only=[(buf(0), a.nbytes)], written=[(buf(2), N * I8)],
                       write_hull=lambda tbs: {buf(2): (buf(2), buf(2) + N * I8)})]
    out["fallbacks"] = [str(p.fallback) for p in plans]
    out["overlap"] = plans[1].overlap
    out["thread_blocks"] = rt.st["thread_blocks"]
    out["H"] = host_out(rt, buf(1), (16,))
    out["S"] = host_out(rt, buf(2), (N,))


def case_bulk(rt: ClusterRuntime, out: dict) -> None:
    """A 16 MiB input (8 UM blocks, their descriptors on every node in turn) that every node's
    slabs read whole: each node faults in the 8 blocks together, one FAULT an owner and the pages
    from node 0 (where the host wrote them) in a message an owner's share, not 7 messages a block."""
    x = np.arange(BULK // I8, dtype=np.int64) % 1000
    host_in(rt, (0, x))

    def total(agent: NodeAgent, tbs: np.ndarray) -> None:
        s = int(agent.read(0, BULK).view(np.int64).sum())
        r0, r1 = rows_of(tbs)
        agent.write(buf(8) + r0 * I8, s + np.arange(r0, r1, dtype=np.int64))
    rt.launch(total, (1, N, 1), read_only=[(0, BULK)], written=[(buf(8), N * I8)],
              write_hull=lambda tbs: {buf(8): (buf(8) + int(tbs.min()) * I8, buf(8) + (int(tbs.max()) + 1) * I8)})
    out["after"] = dict(rt.agent.st)
    out["T"] = host_out(rt, buf(8), (N,))


def case_kill(rt: ClusterRuntime, out: dict) -> None:
    """The last rank dies in the middle of the second kernel (after faulting in its band)."""
    a, b = inputs()
    host_in(rt, (buf(0), a), (buf(1), b))
    rt.launch(gemm_kernel(buf(0), buf(1), buf(2), N), (1, N, 1), write_hull=row_hull(buf(2), N))

    def dying(agent: NodeAgent, tbs: np.ndarray) -> None:
        agent.read(buf(2) + int(tbs.min()) * N * I8, N * I8)
        if agent.node == agent.nodes - 1:
            os.kill(os.getpid(), signal.SIGKILL)
    rt.launch(dying, (1, N, 1))


CASES = {"gemm": case_gemm, "stencil": case_stencil, "rodup": case_rodup, "fallback": case_fallback, "kill": case_kill,
         "bulk": case_bulk}
#: UM blocks of a case's space (default 4)
SPACE = {"bulk": 9}


def main() -> int:
    case, outdir = sys.argv[1], Path(sys.argv[2])
    gpus = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    agent = NodeAgent(comm, SPACE.get(case, 4) * BLOCK_SIZE, run=1,
                      timeout_s=float(os.environ.get("CLUSTER_TIMEOUT_S", "20")))
    rt = ClusterRuntime(agent, gpus_per_node=gpus)
    out: dict = {}
    try:
        CASES[case](rt, out)
    except ClusterError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        comm.Abort(3)
    arrays = {k: v for k, v in out.items() if isinstance(v, np.ndarray) and v is not None}
    if comm.Get_rank() == 0:
        np.savez(outdir / "result.npz", **arrays)
    info = {k: v for k, v in out.items() if k not in arrays}
    info.update(agent=agent.stats(), runtime=rt.st)
    (outdir / f"rank{comm.Get_rank()}.json").write_text(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
