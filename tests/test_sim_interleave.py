"""GPUs that run side by side are replayed side by side: one process's kernels launched back
to back on several GPUs (SnuRHAC's split kernels, a hand-written multi-GPU program) run in
time order, a drain at a time, and every drain hands the controller what all GPUs did up to
then. Replayed one kernel after another, GPU 1's kernel ran after GPU 0's had finished, from
the same start time: the controller heard GPU 1's faults after GPU 0's later ones (deliveries
went back in time); and with several jobs interleaved, each delivery pushed the deadline on
for the others, so each GPU's events reached the controller about one drain in N."""

from __future__ import annotations

from simkit import Scripted

from umctl.controller import make_controller
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


class _Passive(Scripted):
    """Hears every fault and does nothing."""

    subscribes = frozenset({Kind.FAULT})

    def __init__(self):
        super().__init__({})

    def on_events(self, batch):
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


def test_no_fault_is_heard_before_it_happens():
    """A GPU that computes on resident data for 20 ms and only then faults runs ahead of the
    drain in one step (the core pauses only after a fault batch): its late faults wait for
    the drain of their own time instead of riding in an early one."""
    b = WorkloadBuilder("ahead", n_gpus=2, gpu_mem=512 * MiB)
    big = b.alloc("big", 96 * MiB, init=Init.HOST)
    x = b.alloc("x", 2 * MiB, init=Init.HOST)
    y = b.alloc("y", 2 * MiB, init=Init.HOST)
    b.kernel("warm", reads=[x], gpu=1)
    b.sync(gpu=-1)
    b.kernel("faults_all_along", reads=[big], gpu=0)
    b.kernel("faults_at_the_end", reads=[x] * 50 + [y], compute_ns=20_000_000, gpu=1)
    b.sync(gpu=-1)
    ctl = _Deliveries()
    r = simulate(b.build(), ctl)
    assert r.kernel_end_ns[2] > 15 * DRAIN_NS and 1 in ctl.lag   # premise: GPU 1 faults, late
    assert min(min(v) for v in ctl.lag.values()) >= 0, {g: min(v) for g, v in ctl.lag.items()}


def test_listening_does_not_change_the_replay():
    """How finely the GPUs interleave must not depend on whether a controller hears their
    faults: a controller that hears everything and does nothing replays as ``none``."""
    b = WorkloadBuilder("shared", n_gpus=2, gpu_mem=512 * MiB)
    buf = b.alloc("buf", 96 * MiB, init=Init.HOST)
    for g in range(2):
        b.kernel(f"piece{g}", reads=[buf], gpu=g)
    b.sync(gpu=-1)
    w = b.build()
    quiet, heard = simulate(w, make_controller("none")), simulate(w, _Passive())
    assert heard.time_ns == quiet.time_ns and heard.faults == quiet.faults
    assert list(heard.gpu_kernel_ns) == list(quiet.gpu_kernel_ns)


def test_gpus_run_side_by_side_across_iterations():
    """No sync between iterations: GPU 0's second-iteration kernel runs beside GPU 1's long
    first-iteration one, and is heard on time."""
    b = WorkloadBuilder("iters", n_gpus=2, gpu_mem=512 * MiB)
    a0 = b.alloc("a0", 4 * MiB, init=Init.HOST)
    a1 = b.alloc("a1", 96 * MiB, init=Init.HOST)
    c0 = b.alloc("c0", 96 * MiB, init=Init.HOST)
    b.kernel("short0", reads=[a0], gpu=0)
    b.kernel("long1", reads=[a1], gpu=1)
    b.iteration = 1
    b.kernel("long0", reads=[c0], gpu=0)
    b.kernel("short1", reads=[a0], gpu=1)
    b.sync(gpu=-1)
    ctl = _Deliveries()
    r = simulate(b.build(), ctl)
    assert r.kernel_start_ns[2] < r.kernel_end_ns[1]          # long0 starts before long1 ends
    assert ctl.now == sorted(ctl.now)
    for g in (0, 1):
        assert max(ctl.lag[g]) <= 3 * DRAIN_NS, (g, max(ctl.lag[g]))
