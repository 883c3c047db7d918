"""Every simulated GPU fault is charged to one cause: how the page had left the GPU (never
there, evicted by the driver, pre-evicted or discarded by a controller, written by the host,
moved to another GPU) or why it was there but not usable yet (a prefetch still in flight).
Each test builds the one situation a cause names and checks the fault lands there."""

import numpy as np
import pytest

from simkit import Scripted
from umctl.events.schema import Op, commands
from umctl.sim.core import FAULT_CAUSES
from umctl.sim.engine import Simulator, simulate
from umctl.sim.replay import result_rows, run_modes
from umctl.workload.scenario import load_scenario
from umctl.workload.workload import Init, WorkloadBuilder
from umctl.units import BLOCK_SIZE, CPU, MiB



def _causes(r) -> dict:
    assert sum(r.fault_causes.values()) == r.faults
    return {k: v for k, v in r.fault_causes.items() if v}


def _read_twice(gpu_mem=64 * MiB, between=None):
    """x read, (something in between), x read again; returns the workload and x."""
    b = WorkloadBuilder("twice", gpu_mem=gpu_mem)
    x = b.alloc("x", 8 * MiB, init=Init.HOST)
    b.kernel("first", reads=[x], compute_ns=1000)
    if between is not None:
        between(b, x)
    b.kernel("again", reads=[x], compute_ns=1000)
    return b.build(), x


def _second_kernel_causes(r) -> dict:
    """Causes of the faults after the first kernel (its own are all first touches)."""
    first = int(r.kernel_faults[0])
    assert first > 0 and _causes(r).get("cold", 0) >= first
    c = dict(_causes(r))
    c["cold"] = c.get("cold", 0) - first
    return {k: v for k, v in c.items() if v}


def test_first_touch_is_cold():
    b = WorkloadBuilder("cold", gpu_mem=64 * MiB)
    x = b.alloc("x", 8 * MiB, init=Init.HOST)
    b.kernel("read", reads=[x])
    r = simulate(b.build(), Scripted({}))
    assert _causes(r) == {"cold": r.faults}
    assert r.faults > 0


def test_driver_eviction():
    """Two buffers cycled through a GPU that holds one: LRU evicts what comes next."""
    b = WorkloadBuilder("lru", gpu_mem=8 * MiB)
    x = b.alloc("x", 8 * MiB, init=Init.HOST)
    y = b.alloc("y", 8 * MiB, init=Init.HOST)
    for _ in range(2):
        b.kernel("rx", reads=[x])
        b.kernel("ry", reads=[y])
    r = simulate(b.build(), Scripted({}))
    c = _causes(r)
    assert set(c) == {"cold", "evicted"}
    assert c["evicted"] == int(r.kernel_faults[2:].sum())


def test_controller_preevict():
    blocks = lambda x: np.arange(x.addr, x.addr + x.nbytes, BLOCK_SIZE, dtype=np.uint64)  # noqa: E731
    w, x = _read_twice()
    r = simulate(w, Scripted({1: commands(Op.PREEVICT, blocks(x), BLOCK_SIZE, dst=CPU)}))
    assert set(_second_kernel_causes(r)) == {"preevicted"}


def test_controller_discard():
    w, x = _read_twice()
    r = simulate(w, Scripted({1: commands(Op.INVALIDATE, x.addr, x.nbytes)}))
    assert set(_second_kernel_causes(r)) == {"discarded"}


def test_host_write_between_kernels():
    w, x = _read_twice(between=lambda b, x: b.host_write(x, 1000))
    r = simulate(w, Scripted({}))
    assert set(_second_kernel_causes(r)) == {"host"}


def test_free_then_new_memory_is_cold():
    """A program's free is not the controller's discard: touching new memory is a first touch."""
    from umctl.events.schema import AllocOp

    w, x = _read_twice(between=lambda b, x: (b.mem(AllocOp.FREE, x), b.mem(AllocOp.ALLOC, x)))
    r = simulate(w, Scripted({}))
    assert set(_second_kernel_causes(r)) == {"cold"}


def test_late_prefetch():
    """A 64 MiB prefetch sent at the launch of a kernel that reads it at once: the kernel
    catches up with the transfer and faults on pages still in flight."""
    b = WorkloadBuilder("late", gpu_mem=256 * MiB)
    y = b.alloc("y", 64 * MiB, init=Init.HOST)
    b.kernel("ry", reads=[y], compute_ns=0)
    sim = Simulator(b.build(), Scripted({0: commands(Op.PREFETCH, y.addr, y.nbytes, dst=0)}), controller_delay_ns=0)
    r = sim.run()
    c = _causes(r)
    assert c.get("late_prefetch", 0) > 0
    assert set(c) <= {"late_prefetch", "cold"}


def test_moved_to_another_gpu():
    """GPU 1 writes x, which takes the only copy away from GPU 0. The syncs order the kernels:
    without them the GPUs run side by side, and r0again may read x before w1 takes it."""
    b = WorkloadBuilder("two-gpus", n_gpus=2, gpu_mem=64 * MiB)
    x = b.alloc("x", 8 * MiB, init=Init.HOST)
    b.kernel("r0", reads=[x], gpu=0)
    b.sync()
    b.kernel("w1", writes=[x], gpu=1)
    b.sync()
    b.kernel("r0again", reads=[x], gpu=0)
    r = simulate(b.build(), Scripted({}))
    assert int(r.kernel_faults[2]) > 0
    c = _causes(r)
    assert c.get("moved", 0) == int(r.kernel_faults[2])


@pytest.mark.parametrize("mode", ["none", "deepum", "oracle"])
def test_every_fault_has_one_cause_in_a_dnn_replay(mode):
    w = load_scenario("gpt2-l", {"oversub": "2", "iterations": "2"})
    r = run_modes(w, [mode])[0]
    assert sum(r.fault_causes.values()) == r.faults > 0
    assert (r.iteration_fault_causes.sum(axis=1) == r.iteration_faults).all()
    assert r.kernel_fault_causes.shape == (len(r.kernel_faults), len(FAULT_CAUSES))
    assert (r.kernel_fault_causes.sum(axis=1) == r.kernel_faults).all()
    steady = r.steady_fault_causes_per_iter
    assert set(steady) == set(FAULT_CAUSES)
    assert sum(steady.values()) == pytest.approx(r.steady_faults_per_iter)
    if mode == "none":
        # the stock driver on a training loop: what faults in steady state was evicted by it
        assert steady["evicted"] > 0.9 * r.steady_faults_per_iter
    row = result_rows([r])[0]
    assert row["fault_causes"] == r.fault_causes
