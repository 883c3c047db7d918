"""Nodes in the simulator (issue 26): GPU sets wider than 8, GPUs spread over nodes with an
inter-node link of its own, the thesis's cluster calibration, and the scenario's bounds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from test_sim_invariants import _check_conservation
from umctl import UmctlError
from umctl.controller import make_controller
from umctl.sim import core
from umctl.sim.calibration import DEFAULT, Calibration
from umctl.sim.engine import Simulator, simulate
from umctl.workload.scenario import load_scenario

SMALL = {"gpu_mem": "64MiB", "tiles": "32"}


def gemm(nodes: int, gpus: int, **params):
    return load_scenario("mgpu-gemm", {**SMALL, "nodes": str(nodes), "gpus": str(gpus), **params})


@pytest.mark.parametrize("nodes, gpus", [(4, 4), (8, 4)])
def test_16_and_32_gpus_replay_and_keep_the_invariants(nodes, gpus):
    """Masks wider than 8 bits: every GPU, the last one too, holds its slab's pages, bookkeeping
    matches residency, and every page the program wrote is still somewhere."""
    w = gemm(nodes, gpus)
    assert w.n_gpus == nodes * gpus
    sim = Simulator(w, make_controller("snurhac-sp-dp"))
    r = sim.run()
    _check_conservation(sim, r)
    top = sim._bit(w.n_gpus - 1)
    assert (sim.gmask & top).any() and sim.rescount[w.n_gpus - 1].sum() > 0
    assert np.all((sim.gmask[sim.managed] != 0) | sim.cpu_valid[sim.managed])
    assert r.nodes == nodes and r.bytes_internode > 0 and r.internode_messages > 0
    assert r.controller["partitioned"] == 1 and r.gpu_kernel_ns.min() > 0   # every GPU ran a slab


def test_inter_node_transfers_are_slower_and_follow_the_link():
    """Two nodes of two GPUs against one node of four: same program and partition, but half
    the GPUs fetch through the network; a slower link or a longer latency costs more."""
    one, two = gemm(1, 4), gemm(2, 2)
    t_one = simulate(one, make_controller("snurhac")).time_ns
    r_two = simulate(two, make_controller("snurhac"))
    assert r_two.time_ns > t_one and r_two.bytes_internode > 0
    assert simulate(one, make_controller("snurhac")).bytes_internode == 0
    slow = DEFAULT.with_overrides(internode_Bps=DEFAULT.internode_Bps / 4)
    assert simulate(two, make_controller("snurhac"), calib=slow).time_ns > r_two.time_ns
    far = DEFAULT.with_overrides(internode_latency_ns=DEFAULT.internode_latency_ns * 20)
    assert simulate(two, make_controller("snurhac"), calib=far).time_ns > r_two.time_ns
    # static prefetching streams the slabs across the network: the link bounds it too
    sp = simulate(two, make_controller("snurhac-sp")).time_ns
    assert simulate(two, make_controller("snurhac-sp"), calib=slow).time_ns > sp


def test_descriptors_are_kept_per_node():
    """The controller's block descriptors have a mask per node, not per GPU (Table 6.1)."""
    r = simulate(gemm(2, 2), make_controller("snurhac"))
    assert r.controller["remote_descriptor_lookups"] > 0
    assert r.controller["descriptor_lookups"] > r.controller["remote_descriptor_lookups"]
    one = simulate(gemm(1, 4), make_controller("snurhac"))
    assert one.controller["remote_descriptor_lookups"] == 0 and one.internode_messages == 0


@pytest.mark.parametrize("params, words", [
    ({"nodes": "0"}, "nodes: must be from 1 to 32"),
    ({"gpus": "9", "nodes": "2"}, "gpus must be between 1 and 8"),
    ({"gpus": "8", "nodes": "5"}, "at most 32"),
    ({"scale": "full"}, "raise gpu_mem"),
])
def test_bad_topologies_are_one_line_errors(params, words):
    with pytest.raises(UmctlError) as e:
        load_scenario("mgpu-gemm", params)
    assert "\n" not in str(e.value) and words in str(e.value)


def test_the_engine_refuses_uneven_nodes():
    w = gemm(2, 2)
    w.meta["nodes"] = 3
    with pytest.raises(ValueError, match="spread evenly"):
        Simulator(w, make_controller("none"))


def test_tiles_follow_the_gpus_so_every_gpu_gets_a_slab():
    w = gemm(8, 4, tiles="16")
    assert w.meta["tiles"] == 32 and w.n_gpus == 32


def test_full_scale_uses_table_7_10_sizes():
    w = load_scenario("mgpu-2mm", {"scale": "full", "gpu_mem": "32GiB", "gpus": "1"})
    dev = w.allocations[w.allocations["gpu"] == 0]["bytes"].sum()
    assert dev == pytest.approx(1280 * 2**20, rel=0.02)


def test_the_thesis_cluster_calibration_has_a_source_for_every_constant():
    path = Path(core.__file__).parent / "calibrations" / "snurhac-v100-edr.json"
    doc = json.loads(path.read_text())
    assert set(doc["calibration"]) == set(Calibration.__dataclass_fields__)
    assert set(doc["sources"]) == set(doc["calibration"])
    assert all(len(str(v)) > 20 for v in doc["sources"].values())
    cal = Calibration.load("snurhac-v100-edr")
    v100 = Calibration.load("v100-pcie3")
    assert cal.internode_Bps == pytest.approx(12e9) and cal.prefetch_h2d_Bps == v100.prefetch_h2d_Bps


def test_the_wide_core_replays_as_the_narrow_one(monkeypatch):
    """Up to 8 GPUs the 8-bit build runs; the 32-bit build must give the same replay."""
    w = gemm(2, 2)
    narrow = simulate(w, make_controller("snurhac-sp-dp")).summary()
    monkeypatch.setattr(core, "width", lambda n_gpus: 32)
    sim = Simulator(w, make_controller("snurhac-sp-dp"))
    assert sim.gmask.dtype == np.uint32
    wide = sim.run().summary()
    for k in ("time_ns", "faults", "fault_batches", "bytes_h2d", "bytes_p2p", "bytes_internode", "internode_messages"):
        assert wide[k] == narrow[k], k


def test_handwritten_versions_split_the_work_over_one_node():
    """Figure 7.12's comparison: the program written for the GPUs of one node copies each GPU its
    band and a whole B, runs a band per GPU, and needs no UM (no faults)."""
    one = load_scenario("mgpu-gemm", {**SMALL, "gpus": "1", "handwritten": "true"})
    four = load_scenario("mgpu-gemm", {**SMALL, "gpus": "4", "handwritten": "true"})
    r1, r4 = simulate(one, make_controller("none")), simulate(four, make_controller("none"))
    assert r1.faults == r4.faults == 0 and r4.time_ns < r1.time_ns / 2
    assert (r4.gpu_kernel_ns > 0).all()
    n = four.meta["n"]
    assert r4.copy_bytes - r1.copy_bytes == 3 * n * n * 4   # three more whole copies of B
    for params, words in (({"nodes": "2"}, "nodes = 1"), ({"program": "stencil"}, "only gemm")):
        with pytest.raises(UmctlError, match=words):
            load_scenario("mgpu-gemm", {**SMALL, "handwritten": "true", **params})


def test_a_prefetch_across_nodes_runs_at_the_network_rate():
    """A pipelined prefetch from node 0's memory into a GPU of node 1: the slower leg, the link
    (12 GB/s here, against 49.5 GB/s of PCIe), sets its pace; on node 0 the same prefetch runs at
    the PCIe rate. Every byte crosses the network once."""
    from simkit import Scripted
    from umctl.events.schema import Op, commands
    from umctl.workload.workload import Init, WorkloadBuilder
    from umctl.units import MiB

    def run(nodes: int):
        b = WorkloadBuilder("net", n_gpus=2, gpu_mem=256 * MiB)
        y = b.alloc("y", 64 * MiB, init=Init.HOST)
        b.kernel("ry", reads=[y], compute_ns=1000, gpu=1)
        return simulate(b.build(meta={"nodes": nodes}), Scripted({0: commands(Op.PREFETCH, y.addr, y.nbytes, dst=1)}))

    one, two = run(1), run(2)
    assert one.bytes_internode == 0 and two.bytes_internode == 64 * MiB
    link = 64 * MiB / DEFAULT.internode_Bps * 1e9
    assert two.time_ns == pytest.approx(link, rel=0.1)
    assert one.time_ns == pytest.approx(64 * MiB / DEFAULT.prefetch_h2d_Bps * 1e9, rel=0.15)
    assert two.internode_messages > 0


def test_the_cli_replays_the_thesis_cluster_and_refuses_bad_topologies(capsys):
    from umctl.cli.main import main

    args = ["replay", "mgpu-gemm", "-m", "snurhac-sp-dp", "--param", "gpu_mem=64MiB", "--json"]
    assert main(args + ["--param", "nodes=8", "--param", "gpus=4"]) == 0
    row = [r for r in json.loads(capsys.readouterr().out) if r["mode"] == "snurhac-sp-dp"][0]
    assert row["nodes"] == 8 and row["bytes_internode"] > 0
    assert main(args + ["--param", "nodes=0"]) != 0
    err = capsys.readouterr().err
    assert "nodes: must be from 1 to 32" in err and "Traceback" not in err
