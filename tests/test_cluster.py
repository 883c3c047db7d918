"""SnuRHAC across nodes (umctl/cluster): several MPI ranks on this machine, one a node, over TCP
(mpirun --oversubscribe), running the partitioned programs of tests/cluster_prog.py through the
node agents. The results must equal the one-process numpy result; the agents' counters must show
the thesis's rules at work (pages fetched from their owners, duplication of read-only buffers,
unmapping of stale copies, degradation of writers, single-GPU fallbacks). Every mpirun is bounded
in time: a hang fails the test. Needs OpenMPI and mpi4py (the `mpi` extra; .ci/run installs both).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import require

from umctl.cluster.runtime import plan_launch
from umctl.controller.snurhac import partition

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import cluster_prog as prog  # noqa: E402

MPIRUN = shutil.which("mpirun")
#: OpenMPI as these tests run it: as root in containers, over TCP on one machine; the ranks import
#: umctl from this checkout whatever the installed package points at
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_btl": "self,tcp",
           "PYTHONPATH": os.pathsep.join([str(HERE.parent), *filter(None, [os.environ.get("PYTHONPATH")])])}


# mpirun and mpi4py: a skip without them, a failure under UMCTL_REQUIRE_MPI=1 (.ci/run installs
# both and sets it; tests/conftest.py). test_cluster_live.py imports this module: the same for it
require("mpi", module=True)


def mpirun(case: str, ranks: int, out: Path, gpus: int = 1, timeout: float = 90) -> subprocess.CompletedProcess:
    env = dict(os.environ, **MPI_ENV, OMPI_MCA_rmaps_base_oversubscribe="1", CLUSTER_TIMEOUT_S="20")
    return subprocess.run([MPIRUN, "--oversubscribe", "-n", str(ranks), sys.executable, str(HERE / "cluster_prog.py"),
                           case, str(out), str(gpus)], env=env, capture_output=True, text=True, timeout=timeout)


def run_ok(case: str, ranks: int, tmp_path: Path, gpus: int = 1) -> tuple[dict, list[dict]]:
    p = mpirun(case, ranks, tmp_path, gpus)
    assert p.returncode == 0, p.stderr[-3000:]
    res = dict(np.load(tmp_path / "result.npz"))
    return res, [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(ranks)]


@pytest.mark.parametrize("ranks,gpus", [(3, 1), (2, 2)])
def test_gemm_bands_over_nodes_equal_one_gpu(tmp_path, ranks, gpus):
    """Each node computes its GPUs' bands of C from its band of A and all of B, fetched from
    node 0 (where the host copied them in); node 0 reads C back from the nodes that wrote it."""
    res, st = run_ok("gemm", ranks, tmp_path, gpus)
    a, b = prog.inputs()
    assert np.array_equal(res["C"], a @ b)
    per_node = prog.N // ranks
    for r in range(1, ranks):
        ag = st[r]["agent"]
        # all of B and its band of A came in over MPI, and its band of C went back to node 0
        assert ag["pages_in"] >= (prog.N * prog.N * 8 + per_node * prog.N * 8) // 4096
        assert ag["pages_out"] > 0 and ag["remote_descriptor_lookups"] > 0
        assert st[r]["runtime"]["thread_blocks"] == prog.N // ranks
    assert sum(s["runtime"]["thread_blocks"] for s in st) == prog.N
    assert all(s["runtime"]["partitioned"] == 1 for s in st)


def test_halo_rows_and_shared_pages_between_nodes(tmp_path):
    """A page written on one node is read on another (halo rows every step), and bands that end
    mid-page are written by two nodes in one kernel: writers are degraded and the page moves
    with its writes; after each step the stale copies are unmapped (poisoned), so a read that
    skipped a fetch would give a wrong grid."""
    res, st = run_ok("stencil", 3, tmp_path)
    x = prog.inputs(100)[0] % 1009
    assert np.array_equal(res["X"], prog.stencil_ref(x, prog.STEPS))
    assert sum(s["agent"]["degraded"] for s in st) > 0
    assert sum(s["agent"]["invalidated"] for s in st) > 0


def test_read_only_duplication_then_a_write(tmp_path):
    """§6.4: B flagged read-only is duplicated on every node and no copy is unmapped after the
    kernel; a kernel that writes B takes the flag away and the other nodes' copies of the pages
    it wrote are unmapped after it; the next kernel reads the new B everywhere."""
    res, st = run_ok("rodup", 3, tmp_path)
    a, b = prog.inputs()
    assert np.array_equal(res["C1"], a @ b)
    assert np.array_equal(res["C2"], a @ (b * 3 + 1))
    for s in st:
        assert s["after_read"]["invalidated"] == 0
    # every node held all of B, and B's pages written by the other two nodes lose their copies
    assert all(s["after_write"]["invalidated"] >= 2 * (prog.N * prog.N * 8 // 4096) // 3 - 2 for s in st)
    # ... so the third kernel fetches them again
    assert all(s["agent"]["pages_in"] > s["after_write"]["pages_in"] for s in st[1:])


def test_a_large_range_is_faulted_in_with_a_few_messages(tmp_path):
    """Every node reads a 16 MiB input whole (8 UM blocks, their descriptors spread over the
    3 nodes): the 8 blocks are faulted in together, one FAULT to each other owner, the pages in
    one PAGES message from node 0 for each owner's share; the messages a node sends for the
    whole kernel (its fault, its band's write, the synchronisations) stay under 20, where a block
    at a time took 7 a block (lock, grant, access list, owners, page request, pages, unlock)."""
    res, st = run_ok("bulk", 3, tmp_path)
    x = np.arange(prog.BULK // 8, dtype=np.int64) % 1000
    assert np.array_equal(res["T"], int(x.sum()) + np.arange(prog.N))
    for s in st[1:]:
        a = s["after"]
        assert a["read_faults"] == 8 and a["pages_in"] >= 8 * 512
        assert a["fault_msgs"] <= 3 and a["msgs"] <= 20


def test_fallbacks_run_on_one_gpu(tmp_path):
    """Atomics, and write overlap 1.0 > 0.5 (every GPU writes all column sums), run on GPU 0 of
    node 0 only; the results equal the one-GPU ones."""
    res, st = run_ok("fallback", 3, tmp_path)
    a, _ = prog.inputs()
    assert np.array_equal(res["H"], np.bincount((a % 16).ravel(), minlength=16))
    assert np.array_equal(res["S"], a.sum(0))
    assert all(s["fallbacks"] == ["atomics", "overlap"] and s["overlap"] == 1.0 for s in st)
    assert st[0]["thread_blocks"] == 2 * prog.N and st[1]["thread_blocks"] == st[2]["thread_blocks"] == 0


def test_a_node_killed_mid_run_stops_every_rank(tmp_path):
    """The last rank is killed inside a kernel: mpirun names it and exits non-zero, the others
    exit too (no hang, no rank left behind)."""
    p = mpirun("kill", 3, tmp_path, timeout=60)
    assert p.returncode != 0
    err = p.stdout + p.stderr
    assert "rank 2" in err and ("signal 9" in err or "Killed" in err)
    left = subprocess.run(["pgrep", "-f", f"cluster_prog.py kill {tmp_path}"], capture_output=True, text=True)
    assert left.stdout.strip() == ""


# -- the runtime's decisions, without MPI ----------------------------------------------------

def test_plan_follows_partition_and_the_fallback_rules():
    grid = (1, 96, 1)
    p = plan_launch(grid, 8, write_hull=prog.row_hull(0, 96))
    _, parts = partition(grid, 8)
    assert p.fallback is None and p.overlap == 0.0
    assert all(np.array_equal(x, y) for x, y in zip(p.parts, parts))
    assert plan_launch(grid, 8, atomics=True).fallback == "atomics"
    every = plan_launch(grid, 4, write_hull=lambda tbs: {0: (0, 800)})
    assert every.fallback == "overlap" and len(every.parts[0]) == 96 and every.overlap == 1.0
    # half of each GPU's range shared with a neighbour: 0.5 is not above the threshold
    half = plan_launch((1, 2, 1), 2, write_hull=lambda tbs: {0: (int(tbs[0]) * 100, int(tbs[0]) * 100 + 200)})
    assert half.fallback is None and half.overlap == 0.5
