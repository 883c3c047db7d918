"""The SnuRHAC runtime's launch decisions on a cluster (thesis §6.2, §6.4), and the SPMD loop
that runs a partitioned program on every node.

Every node runs the same host program (mpirun starts it on each node); at a kernel launch every
node's runtime makes the same decision from the same arguments, so no message is needed to agree:
the grid is cut into one slab per GPU of the cluster by :func:`partition` (node n's GPUs are
n*gpus .. n*gpus+gpus-1), or kept whole on GPU 0 when the kernel has atomics or its GPUs' write
ranges overlap by more than the threshold. Host code touches UM through node 0 only (the
program's CPU side runs there); the other nodes' host parts skip it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..controller.snurhac import hull_overlap_ratio, partition
from .agent import NodeAgent


@dataclass
class Plan:
    """Where a launch runs: per global GPU, its thread blocks (linear ids); why it was not split."""

    parts: list[np.ndarray]
    fallback: str | None      # None, "atomics" or "overlap"
    overlap: float


def plan_launch(grid: tuple[int, int, int], n_gpus: int, *, atomics: bool = False,
                write_hull: Callable[[np.ndarray], dict[int, tuple[int, int]]] | None = None,
                threshold: float = 0.5) -> Plan:
    """§6.2 and §6.4 for one launch over ``n_gpus`` GPUs (all nodes). ``write_hull(tbs)`` gives
    the byte range per buffer that those thread blocks write (the runtime's MAPA ranges)."""
    n_tb = int(np.prod(grid))
    whole = [np.arange(n_tb)] + [np.zeros(0, np.int64)] * (n_gpus - 1)
    if atomics:
        return Plan(whole, "atomics", 0.0)
    _, parts = partition(grid, n_gpus)
    ratio = 0.0
    if write_hull is not None and n_gpus > 1:
        hulls: dict[int, list[tuple[int, int]]] = {}
        for tbs in parts:
            if len(tbs):
                for aid, r in write_hull(tbs).items():
                    hulls.setdefault(aid, []).append(r)
        ratio = hull_overlap_ratio(hulls)
        if ratio > threshold:
            return Plan(whole, "overlap", ratio)
    return Plan(parts, None, ratio)


class ClusterRuntime:
    """One node's runtime: the agent, this node's GPUs, and the launch loop."""

    def __init__(self, agent: NodeAgent, gpus_per_node: int = 1, threshold: float = 0.5):
        self.agent = agent
        self.gpus = gpus_per_node
        self.threshold = threshold
        self.flagged: set[tuple[int, int]] = set()
        self.st = {"kernels": 0, "partitioned": 0, "fallback_atomics": 0, "fallback_overlap": 0, "thread_blocks": 0}

    @property
    def n_gpus(self) -> int:
        return self.agent.nodes * self.gpus

    def launch(self, kernel: Callable[[NodeAgent, np.ndarray], None], grid: tuple[int, int, int], *,
               read_only: list[tuple[int, int]] = (), written: list[tuple[int, int]] = (), atomics: bool = False,
               write_hull: Callable[[np.ndarray], dict[int, tuple[int, int]]] | None = None) -> Plan:
        """Run ``kernel(agent, thread_blocks)`` for this node's slabs, then the cluster-wide
        synchronisation. ``read_only`` / ``written``: (addr, bytes) of the buffers the kernel only
        reads / writes (the ro_mask's information): the first get the read-only flag, a flagged
        one in the second loses it."""
        self.st["kernels"] += 1
        self.flags(read_only, written)
        plan = plan_launch(grid, self.n_gpus, atomics=atomics, write_hull=write_hull, threshold=self.threshold)
        if plan.fallback:
            self.st["fallback_" + plan.fallback] += 1
        else:
            self.st["partitioned"] += 1
        me = self.agent.node
        for g in range(me * self.gpus, (me + 1) * self.gpus):
            if len(plan.parts[g]):
                self.st["thread_blocks"] += len(plan.parts[g])
                kernel(self.agent, plan.parts[g])
        self.agent.kernel_done()
        return plan

    def flags(self, read_only, written) -> bool:
        """§6.4 at a launch: buffers the kernel only reads get the read-only flag, flagged ones
        it writes lose it (collective: every node calls it with the same buffers). All changes go
        to the agent at once (one barrier); returns whether there were any (else no barrier)."""
        changes = []
        for buf in written:
            if buf in self.flagged:
                self.flagged.discard(buf)
                changes.append((*buf, False))
        for buf in read_only:
            if buf not in self.flagged:
                self.flagged.add(buf)
                changes.append((*buf, True))
        if changes:
            self.agent.set_flags(changes)
        return bool(changes)

    def host(self, fn: Callable[[NodeAgent], object]):
        """Host code that touches UM (copies in and out): node 0 runs it, every node waits (the
        next kernel must see the copy). Returns fn's result on node 0, None elsewhere."""
        out = fn(self.agent) if self.agent.node == 0 else None
        self.agent.kernel_done()
        return out
