"""Small workloads and controllers shared by the simulator tests."""

from __future__ import annotations

import numpy as np

from umctl.controller.base import Controller
from umctl.events.schema import AllocOp, EventBatch, Kind, Op, commands
from umctl.workload.workload import Init, WorkloadBuilder
from umctl.units import BLOCK_SIZE, GiB, MiB


def sweep(nbytes: int = GiB, gpu_mem: int = 4 * GiB, compute_ns: int = 1_400_000):
    """One kernel reading a host-initialised buffer once (the calibration probe's pass)."""
    b = WorkloadBuilder("sweep", gpu_mem=gpu_mem)
    x = b.alloc("x", nbytes, init=Init.HOST)
    b.kernel("read", reads=[x], compute_ns=compute_ns)
    return b.build()


def mini_dnn(gpu_mem: int = 256 * MiB, oversub: float = 2.0, layers: int = 12, iters: int = 3):
    """A training-like loop: weights read forward and updated backward, activations written
    forward, read backward, then marked inactive (dead) until the next iteration."""
    foot = gpu_mem * oversub
    wl = int(foot * 0.5 / layers)
    b = WorkloadBuilder("mini-dnn", gpu_mem=gpu_mem)
    W = [b.alloc(f"w{i}", wl, init=Init.HOST) for i in range(layers)]
    A = [b.alloc(f"a{i}", wl) for i in range(layers)]
    for it in range(iters):
        b.iteration = it
        for i in range(layers):
            if it:
                b.mem(AllocOp.BLOCK_ACTIVE, A[i])
            b.kernel(f"fwd{i}", reads=[W[i]] + ([A[i - 1]] if i else []), writes=[A[i]], compute_ns=wl / 60)
        for i in reversed(range(layers)):
            b.kernel(f"bwd{i}", reads=[A[i], W[i]], writes=[W[i]], compute_ns=2 * wl / 60)
            b.mem(AllocOp.BLOCK_INACTIVE, A[i])
    return b.build()


class Scripted(Controller):
    """Sends given commands at given kernel launches (by launch ordinal)."""

    name = "scripted"
    subscribes = frozenset({Kind.LAUNCH})

    def __init__(self, at: dict[int, np.ndarray]):
        super().__init__()
        self.at = at
        self.launches = 0

    def on_events(self, batch: EventBatch):
        out = []
        for _ in batch[Kind.LAUNCH]:
            c = self.at.get(self.launches)
            if c is not None:
                out.append(c)
            self.launches += 1
        return np.concatenate(out) if out else None


class Chaos(Controller):
    """Random commands on every event batch: stresses the actuator side of the simulator."""

    name = "chaos"
    subscribes = frozenset({Kind.LAUNCH, Kind.FAULT, Kind.REPLAY})

    def __init__(self, seed: int = 0, n_gpus: int = 1):
        super().__init__()
        self.rng = np.random.default_rng(seed)
        self.n_gpus = n_gpus
        self.checks = 0

    def on_events(self, batch: EventBatch):
        res, _, free = self.ctx.residency(0)
        assert free >= 0
        assert int(res.sum()) <= self.ctx.gpu_mem[0] // BLOCK_SIZE
        self.checks += 1
        addrs = self.ctx.block_addr
        k = int(self.rng.integers(0, 4))
        pick = addrs[self.rng.integers(0, len(addrs), size=k)]
        ops = self.rng.integers(0, 4, size=k)
        out = [commands(int(o), int(a), BLOCK_SIZE, dst=int(self.rng.integers(-1, self.n_gpus)), advice=1)
               for o, a in zip(ops, pick) if int(o) != Op.ADVISE or self.rng.random() < 0.3]
        return np.concatenate(out) if out else None
