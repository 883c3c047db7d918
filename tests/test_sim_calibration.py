"""The simulator reproduces the figures measured on the H100/H200 (docs/evaluation/measurements.md)."""

import numpy as np
import pytest

from simkit import Scripted, sweep
from umctl.controller import make_controller
from umctl.events.schema import Op, commands
from umctl.sim.calibration import DEFAULT
from umctl.sim.engine import Simulator, simulate
from umctl.units import GiB, MiB


def test_cold_sweep_matches_on_demand_measurements():
    """1 GiB managed, host-written, read by one kernel: 6.2-8.1 GB/s, ~2 K fault batches,
    most bytes brought by the density prefetcher (docs/evaluation/measurements.md, Calibration)."""
    r = simulate(sweep(GiB), make_controller("none"))
    gbps = GiB / r.time_ns
    assert 6.2 <= gbps <= 8.1
    assert 1700 <= r.fault_batches <= 2500
    assert r.faults / r.fault_batches <= DEFAULT.batch_max_faults
    demand = r.demand_bytes / (r.demand_bytes + r.driver_prefetch_bytes)
    assert 0.15 <= demand <= 0.45
    assert r.bytes_h2d == GiB


def test_prefetch_then_run_matches_measured_prefetch_rate():
    """cuMemPrefetchAsync / UVM_MIGRATE of 1 GiB: 21.4-21.9 ms (docs/evaluation/measurements.md)."""
    w = sweep(GiB, compute_ns=1_400_000)
    addr = int(w.allocations["addr"][0])
    ctl = Scripted({0: commands(Op.PREFETCH, addr, GiB, dst=0)})
    sim = Simulator(w, ctl, controller_delay_ns=0)
    r = sim.run()
    prefetch_ms = sim.h2d_tail[0] / 1e6
    assert 20.5 <= prefetch_ms <= 23.0
    # the kernel follows the migration block by block, waiting where it overtakes it
    assert r.time_ns < 1.3 * sim.h2d_tail[0]
    assert r.prefetch_used == GiB // 4096
    assert r.prefetch_accuracy == 1.0


def test_resident_data_runs_at_compute_speed():
    w = sweep(256 * MiB, compute_ns=1_000_000)
    addr = int(w.allocations["addr"][0])
    # prefetch, then a second identical kernel that finds everything resident
    from umctl.workload.workload import Init, WorkloadBuilder

    b = WorkloadBuilder("twice", gpu_mem=GiB)
    x = b.alloc("x", 256 * MiB, init=Init.HOST)
    b.kernel("a", reads=[x], compute_ns=1_000_000)
    b.kernel("b", reads=[x], compute_ns=1_000_000)
    r = simulate(b.build(), make_controller("none"))
    assert r.kernel_faults[1] == 0
    assert r.kernel_end_ns[1] - r.kernel_start_ns[1] == 1_000_000


def test_eviction_write_back_rate():
    """Evicting written data runs at the GPU->host rate (11-15 GB/s)."""
    from umctl.workload.workload import Init, WorkloadBuilder

    b = WorkloadBuilder("evict", gpu_mem=256 * MiB)
    x = b.alloc("x", 256 * MiB, init=Init.HOST)
    y = b.alloc("y", 256 * MiB, init=Init.HOST)
    b.kernel("wx", writes=[x], compute_ns=0)
    b.kernel("ry", reads=[y], compute_ns=0)
    r = simulate(b.build(), make_controller("none"))
    assert r.evicted_bytes == 256 * MiB
    assert r.evictions == 128
    t_evict = r.evicted_bytes / DEFAULT.d2h_Bps * 1e9
    assert r.kernel_end_ns[1] - r.kernel_start_ns[1] > t_evict


def test_batches_spread_over_blocks_cost_block_ns_each_beyond_the_first():
    """The driver services a batch block by block: 32 faults in 32 blocks cost 31 block_ns
    more than 32 faults in one block; recorded batch windows decide which pages go together."""
    from umctl.controller import make_controller
    from umctl.sim.calibration import DEFAULT
    from umctl.sim.engine import simulate
    from umctl.workload.workload import Init, WorkloadBuilder
    from umctl.units import GiB

    def run(block_ns: int, spread: bool):
        b = WorkloadBuilder("scatter", gpu_mem=4 * GiB)
        x = b.alloc("x", 64 << 20, init=Init.HOST)
        first = x.addr >> 12
        pages = first + (np.arange(32) * 512 if spread else np.arange(32) * 8)
        b.kernel("k", pages=[(pages, False)], compute_ns=0)
        w = b.build()
        w.acc_win = np.arange(32, 0, -1, dtype=np.int32)   # all 32 were recorded in one batch
        cal = DEFAULT.with_overrides(block_ns=block_ns, density_threshold=1.0)  # no prefetcher (no count exceeds 1 x a region)
        return simulate(w, make_controller("none"), calib=cal)

    one, spread = run(15_000, False), run(15_000, True)
    assert one.fault_batches == spread.fault_batches == 1
    assert spread.stall_ns - one.stall_ns == pytest.approx(31 * 15_000, rel=0.01)
    assert run(0, True).stall_ns == pytest.approx(one.stall_ns, rel=0.01)


def test_block_ns_fit_recovers_a_known_slope():
    from umctl.sim.calibration import fit_block_ns

    rng = np.random.default_rng(0)
    blocks = rng.integers(1, 64, 500)
    pages = rng.integers(1, 256, 500)
    shapes = np.stack([blocks, pages, 40_000 + 14_000 * (blocks - 1) + 400 * pages + rng.normal(0, 3000, 500)], 1)
    assert fit_block_ns(shapes.tolist()) == pytest.approx(14_000, rel=0.03)
    assert fit_block_ns([(1, 30, 60_000)] * 50) == 0   # one block per batch: no slope to fit
    assert fit_block_ns([]) == 0
