"""SnuRHAC's runtime and driver rules (thesis ch. 6), on small hand-made cases."""

from __future__ import annotations

import numpy as np
import pytest

from umctl import UmctlError
from umctl.controller import make_controller
from umctl.controller.snurhac import (BlockDescriptors, partition, partition_dim, write_overlap_ratio)
from umctl.events.schema import Advice, Op
from umctl.sim.replay import run_modes
from umctl.workload.scenario import load_scenario
from umctl.workload.threadblocks import AccessRange, KernelBlocks
from umctl.workload.workload import OpType

SMALL = {"gpu_mem": "64MiB", "tiles": "8"}


@pytest.mark.parametrize("grid, gpus, dim", [
    ((16, 16, 1), 4, 1),   # figure 6.2 (a): 2-D grid, enough rows -> y
    ((16, 2, 1), 4, 0),    # figure 6.2 (b): too few rows -> x
    ((4, 4, 4), 4, 2),     # 3-D: z first
    ((4, 8, 2), 4, 1),     # too few z -> y
    ((64, 1, 1), 8, 0),    # 1-D grids are cut along x
])
def test_partition_dimension_z_then_y_then_x(grid, gpus, dim):
    assert partition_dim(grid, gpus) == dim


def test_partition_is_one_dimension_in_equal_slabs():
    dim, parts = partition((16, 16, 1), 4)
    assert dim == 1 and [len(p) for p in parts] == [64] * 4
    for g, p in enumerate(parts):
        rows = p // 16
        assert set(rows.tolist()) == set(range(4 * g, 4 * g + 4))  # whole rows: x stays contiguous
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(256))


def _kb(grid, ranges):
    return KernelBlocks(grid, np.arange(grid[0] * grid[1] * grid[2] + 1), ranges)


def test_write_overlap_ratio():
    band = AccessRange(0, 1 << 20, 0, True, coef=(0, 1 << 16, 0), hi=1 << 16)
    everything = AccessRange(1 << 21, 1 << 20, 1, True, hi=1 << 20)
    _, parts = partition((1, 16, 1), 4)
    assert write_overlap_ratio(_kb((1, 16, 1), [band]), parts) == 0.0
    assert write_overlap_ratio(_kb((1, 16, 1), [everything]), parts) == 1.0
    assert 0.5 < write_overlap_ratio(_kb((1, 16, 1), [band, everything]), parts) < 1.0
    reads = AccessRange(0, 1 << 20, 0, False, hi=1 << 20)
    indirect = AccessRange(0, 1 << 20, 0, True, affine=False)
    assert write_overlap_ratio(_kb((1, 16, 1), [reads, indirect]), parts) == 0.0


def test_block_descriptors_masks_and_owners():
    d = BlockDescriptors(4)
    assert [d.owner(b) for b in (0, 31, 32, 64, 127, 128)] == [0, 0, 1, 2, 3, 0]
    offs = np.array([1, 2])
    d.fault(1, 40, offs, np.array([False, False]))
    d.fault(2, 40, offs, np.array([False, False]))
    assert d.read[40][1:3, 1:3].all() and not d.write[40].any()
    d.fault(3, 40, np.array([2]), np.array([True]))
    assert d.write[40][3, 2] and d.write[40][:, 2].sum() == 1 and d.read[40][3, 2]
    d.fault(0, 40, np.array([2]), np.array([True]))   # the previous writer degrades to read
    assert d.write[40][0, 2] and not d.write[40][3, 2] and d.read[40][3, 2]
    assert d.kernel_done() == 3      # readers 1, 2, 3 of page 2 lose their copies; page 1 stays
    assert d.read[40][:, 2].tolist() == [True, False, False, False] and d.read[40][1:3, 1].all()
    assert d.lookups == 4 and d.remote_lookups == 3  # block 40's descriptor lives on node 1


def test_refuses_where_it_does_not_apply():
    one = load_scenario("mgpu-gemm", {**SMALL, "gpus": "1"})
    with pytest.raises(UmctlError, match="1 GPU"):
        run_modes(one, ["none", "snurhac"])
    assert make_controller("snurhac", single_gpu=True).applies_to(one) is None
    with pytest.raises(UmctlError, match="thread-block"):
        run_modes(load_scenario("hum-sync", {"gpu_mem": "64MiB"}), ["none", "snurhac-sp"])
    with pytest.raises(UmctlError, match="several GPUs"):
        run_modes(load_scenario("tenants", {"gpu_mem": "64MiB", "iterations": "1"}), ["none", "snurhac"])


def test_prepare_partitions_kernels_and_keeps_every_access():
    w = load_scenario("mgpu-stencil", {**SMALL, "gpus": "4", "iterations": "2"})
    ctl = make_controller("snurhac-sp")
    p = ctl.prepare(w)
    k, k0 = p.kernels, w.kernels
    assert set(k["gpu"].tolist()) == {0, 1, 2, 3} and len(k) == 4 * len(k0)
    assert k["compute_ns"].sum() == pytest.approx(k0["compute_ns"].sum(), rel=1e-3)
    # the pieces make exactly the original kernels' accesses
    def acc(wl, ks):
        return np.sort(np.concatenate([wl.acc_page[a:b] * 2 + wl.acc_write[a:b] for a, b in zip(ks["acc_lo"], ks["acc_hi"])]))
    assert np.array_equal(acc(p, k), acc(w, k0))
    # device memory became managed, copies became host writes, a barrier ends each kernel
    assert p.allocations["managed"][p.allocations["gpu"] >= 0].all()
    assert not (p.ops["type"] == OpType.COPY).any() and (p.ops["type"] == OpType.HOST_WRITE).sum() == 3
    after = p.ops[np.flatnonzero(p.ops["type"] == OpType.KERNEL)[3::4] + 1]
    assert (after["type"] == OpType.SYNC).all() and (after["gpu"] == -1).all()
    # static prefetch covers each GPU's accesses (affine ranges bound them)
    for seq, ln in ctl.launches.items():
        op = p.ops[seq]
        touched = set(p.acc_page[op["acc_lo"]:op["acc_hi"]].tolist())
        cmds = ln.static
        assert (cmds["op"] == Op.PREFETCH).all() and (cmds["dst"] == ln.gpu).all()
        pre = set()
        for a, n in zip(cmds["addr"].tolist(), cmds["bytes"].tolist()):
            pre.update(range(a >> 12, (a + n) >> 12))
        assert touched <= pre


def test_read_only_flag_follows_the_kernels():
    w = load_scenario("mgpu-stencil", {**SMALL, "gpus": "2", "iterations": "3"})
    ctl = make_controller("snurhac")
    ctl.prepare(w)
    firsts = [ln for _, ln in sorted(ctl.launches.items()) if ln.first]
    temp_a, temp_b, power = (int(w.allocations[w.allocations["name_id"] == w.names.index(n)]["addr"][0])
                             for n in ("temp_a", "temp_b", "power"))
    flags = [{(int(c["addr"]), int(c["advice"])) for c in ln.advise} for ln in firsts]
    assert flags[0] == {(temp_a, Advice.READ_MOSTLY), (power, Advice.READ_MOSTLY)}
    assert flags[1] == {(temp_b, Advice.READ_MOSTLY), (temp_a, Advice.UNSET_READ_MOSTLY)}
    assert flags[2] == {(temp_a, Advice.READ_MOSTLY), (temp_b, Advice.UNSET_READ_MOSTLY)}


@pytest.mark.parametrize("name, reason", [("mgpu-histogram", "fallback_atomics"),
                                          ("mgpu-covariance", "fallback_overlap")])
def test_single_gpu_fallbacks(name, reason):
    w = load_scenario(name, {**SMALL, "gpus": "4", "iterations": "1"})
    ctl = make_controller("snurhac")
    p = ctl.prepare(w)
    assert (p.kernels["gpu"] == 0).all() and ctl.stats()[reason] == len(w.kernels)
    assert ctl.stats()["partitioned"] == 0
    # the threshold decides: above every ratio, covariance is split after all
    if name == "mgpu-covariance":
        ctl = make_controller("snurhac", overlap_threshold=1.0)
        assert set(ctl.prepare(w).kernels["gpu"].tolist()) == {0, 1, 2, 3}


def test_unset_read_mostly_collapses_duplicates():
    """cudaMemAdviseUnsetReadMostly collapses read-duplicated copies into one."""
    from umctl.events.schema import commands as cmd
    from umctl.sim.engine import Simulator
    from umctl.controller.base import Controller
    from umctl.workload.workload import Init, WorkloadBuilder
    b = WorkloadBuilder("rm", n_gpus=2, gpu_mem=64 << 20)
    x = b.alloc("x", 2 << 20, init=Init.HOST)
    b.kernel("r0", reads=[x], gpu=0, compute_ns=1000)
    b.kernel("r1", reads=[x], gpu=1, compute_ns=1000)
    sim = Simulator(b.build(), Controller())
    sim.apply_commands(cmd(Op.ADVISE, x.addr, x.nbytes, advice=Advice.READ_MOSTLY), 0.0)
    sim.run()
    assert (sim.gmask == 3).all() and sim.cpu_valid.all()          # duplicated everywhere
    sim.apply_commands(cmd(Op.ADVISE, x.addr, x.nbytes, advice=Advice.UNSET_READ_MOSTLY), sim.host)
    assert (sim.gmask == 0).all() and sim.cpu_valid.all() and sim.used.sum() == 0
