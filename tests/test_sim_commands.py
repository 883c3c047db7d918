"""The simulator as actuator: prefetch, pre-evict, invalidate and advise commands."""

import numpy as np

from simkit import Scripted
from umctl.events.schema import Advice, Op, commands
from umctl.sim.engine import Simulator, simulate
from umctl.workload.workload import Init, WorkloadBuilder
from umctl.units import BLOCK_SIZE, CPU, MiB


def _two_buffers(gpu_mem=64 * MiB, size=64 * MiB):
    b = WorkloadBuilder("two", gpu_mem=gpu_mem)
    x = b.alloc("x", size, init=Init.HOST)
    y = b.alloc("y", size, init=Init.HOST)
    b.kernel("wx", writes=[x], compute_ns=1000)
    b.kernel("ry", reads=[y], compute_ns=10_000_000)
    b.kernel("rx", reads=[x], compute_ns=1000)
    return b.build(), x, y


def test_invalidate_drops_without_write_back():
    w, x, y = _two_buffers()
    base = simulate(w, Scripted({}))
    inv = simulate(w, Scripted({1: commands(Op.INVALIDATE, x.addr, x.nbytes)}))
    # stock UVM keeps one copy: whatever is evicted is written back, read or written
    assert base.evicted_bytes == x.nbytes + y.nbytes
    assert base.bytes_h2d == 2 * x.nbytes + y.nbytes
    # invalidated x needs no write-back, and its next touch zero-fills without a copy
    assert inv.invalidated_bytes == x.nbytes
    assert inv.evicted_bytes == y.nbytes
    assert inv.bytes_h2d == x.nbytes + y.nbytes


def test_preevict_frees_chunks_off_the_fault_path():
    w, x, y = _two_buffers()
    blocks = np.arange(x.addr, x.addr + x.nbytes, BLOCK_SIZE, dtype=np.uint64)
    pre = simulate(w, Scripted({1: commands(Op.PREEVICT, blocks, BLOCK_SIZE, dst=CPU)}))
    base = simulate(w, Scripted({}))
    assert pre.evictions < base.evictions
    assert pre.preevictions >= len(blocks)
    assert pre.preevicted_bytes == x.nbytes


def test_prefetch_ahead_removes_faults():
    w, x, y = _two_buffers(gpu_mem=256 * MiB)
    r = simulate(w, Scripted({0: commands(Op.PREFETCH, y.addr, y.nbytes, dst=0)}))
    assert r.kernel_faults[1] == 0
    assert r.prefetch_used == y.nbytes // 4096


def test_prefetch_wasted_when_evicted_before_use():
    w, x, y = _two_buffers(gpu_mem=64 * MiB)
    r = simulate(w, Scripted({0: commands(Op.PREFETCH, y.addr, y.nbytes, dst=0)}))
    assert r.prefetch_pages == y.nbytes // 4096
    assert r.prefetch_used + r.prefetch_wasted <= r.prefetch_pages


def test_demand_preempts_prefetch():
    """Faults go first: an in-flight prefetch finishes later when demand traffic arrives."""
    b = WorkloadBuilder("pre", gpu_mem=512 * MiB)
    x = b.alloc("x", 128 * MiB, init=Init.HOST)
    y = b.alloc("y", 128 * MiB, init=Init.HOST)
    b.kernel("rx", reads=[x], compute_ns=0)
    w = b.build()
    alone = Simulator(w, Scripted({0: commands(Op.PREFETCH, y.addr, y.nbytes, dst=0)}), controller_delay_ns=0)
    alone.run()
    # without the demand traffic the prefetch would finish at 128 MiB / 49.5 GB/s
    unloaded = y.nbytes / alone.c.prefetch_h2d_Bps * 1e9
    assert alone.h2d_tail[0] > unloaded * 1.2


def test_read_mostly_duplicates_and_write_collapses():
    b = WorkloadBuilder("rm", n_gpus=2, gpu_mem=64 * MiB)
    x = b.alloc("x", 8 * MiB, init=Init.HOST)
    b.kernel("r0", reads=[x], gpu=0)
    b.kernel("r1", reads=[x], gpu=1)
    w = b.build()
    sim = Simulator(w, Scripted({0: commands(Op.ADVISE, x.addr, x.nbytes, advice=Advice.READ_MOSTLY)}))
    sim.run()
    lo, hi = sim.space.local_range(x.addr, BLOCK_SIZE)[0]
    assert np.all(sim.gmask[lo:hi] == 0b11) and np.all(sim.cpu_valid[lo:hi])


def test_preevict_to_neighbour_gpu():
    b = WorkloadBuilder("harvest", n_gpus=2, gpu_mem=64 * MiB)
    x = b.alloc("x", 32 * MiB, init=Init.HOST)
    b.kernel("r0", reads=[x], gpu=0)
    b.kernel("again", reads=[x], gpu=0, compute_ns=10)
    w = b.build()
    blocks = np.arange(x.addr, x.addr + x.nbytes, BLOCK_SIZE, dtype=np.uint64)
    sim = Simulator(w, Scripted({1: commands(Op.PREEVICT, blocks, BLOCK_SIZE, dst=1)}))
    r = sim.run()
    assert r.bytes_p2p >= x.nbytes  # to GPU 1 and back over NVLink
    assert r.bytes_d2h == 0
