"""GPUs that run side by side are replayed side by side: one process's kernels launched back
to back on several GPUs (SnuRHAC's split kernels, a hand-written multi-GPU program) run in
time order, a drain at a time, and every drain hands the controller what all GPUs did up to
then. Replayed one kernel after another, GPU 1's kernel ran after GPU 0's had finished, from
the same start time: the controller heard GPU 1's faults after GPU 0's later ones (deliveries
went back in time); and with several jobs interleaved, each delivery pushed the deadline on
for the others, so each GPU's events reached the controller about one drain in N."""

from __future__ import annotations

from simkit import Scripted

from umctl.events.schema import Kind
from umctl.sim.engine import simulate
from umctl.units import MiB
from umctl.workload.workload import Init, WorkloadBuilder

DRAIN_NS = 1_000_000   # the simulator's default drain interval


class _Deliveries(Scripted):
    """Each delivery's time, and per GPU which deliveries held its faults and how late."""

    subscribes = frozenset({Kind.FAULT})

    def __init__(self):
        super().__init__({})
        self.now: list[int] = []
        self.lag: dict[int, list[int]] = {}
        self.holds: dict[int, int] = {}

    def on_events(self, batch):
        self.now.append(batch.now_ns)
        f = batch[Kind.FAULT]
        for g in set(f["gpu"].tolist()):
            self.holds[g] = self.holds.get(g, 0) + 1
        for g, t in zip(f["gpu"].tolist(), f["t_ns"].tolist()):
            self.lag.setdefault(g, []).append(batch.now_ns - t)
        return None


def _one_process_on(gpus: int):
    """One process, one kernel per GPU launched back to back, each reading 96 MiB of its own
    that the host wrote: each faults for many milliseconds."""
    b = WorkloadBuilder("split", n_gpus=gpus, gpu_mem=512 * MiB)
    bufs = [b.alloc(f"part{g}", 96 * MiB, init=Init.HOST) for g in range(gpus)]
    for g in range(gpus):
        b.kernel(f"piece{g}", reads=[bufs[g]], gpu=g)
    b.sync(gpu=-1)
    return b.build()


def test_one_process_gpus_are_heard_in_time_order():
    ctl = _Deliveries()
    r = simulate(_one_process_on(2), ctl)
    assert min(r.gpu_kernel_ns) > 10 * DRAIN_NS            # the premise: kernels span many drains
    assert ctl.now == sorted(ctl.now)                       # no delivery goes back in time
    for g in (0, 1):
        assert max(ctl.lag[g]) <= 3 * DRAIN_NS, (g, max(ctl.lag[g]))


def test_every_gpu_is_heard_at_every_drain():
    """Four GPUs fault side by side for the same time: each one's faults are in (nearly) every
    delivery, not in one of every four."""
    ctl = _Deliveries()
    r = simulate(_one_process_on(4), ctl)
    drains = min(r.gpu_kernel_ns) // DRAIN_NS
    assert drains > 10
    for g in range(4):
        assert ctl.holds[g] >= 0.8 * drains, (g, ctl.holds[g], drains)
