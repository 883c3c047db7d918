"""SnuRHAC across nodes with a live program: `mpirun -n N python3 -m umctl.cluster.live --gpus M
-- prog` on the fake CUDA runtime. Each rank's agent starts the program under the runtime, which
runs its node's slabs of every partitioned kernel and hands its changes to the agent at each
launch; the agents keep the managed buffers coherent over MPI (TCP here). The program
(tests/rtprog/clusterprog.c: gemm reading all of B, a stencil whose bands share pages, B rewritten
in place then read by every node) must print the same checksums as without umctl, on every node.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from test_cluster import MPI_ENV, MPIRUN
from test_runtime import SRC, _gcc


@pytest.fixture(scope="module")
def prog(built):
    d = built["dir"]
    _gcc("-O1", "-Wall", "-rdynamic", str(SRC / "clusterprog.c"), "-o", str(d / "clusterprog"), f"-L{d}", "-lcudart",
         f"-Wl,-rpath,{d}", "-ldl")
    return d / "clusterprog"


def results(out: str) -> list[str]:
    return [ln for ln in out.splitlines() if ln.startswith("RESULT ")]


def run_cluster(built, prog, tmp_path, nodes: int, gpus: int, args=("100", "4"), timeout: float = 90,
                extra: dict | None = None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UMCTL_RT_", "LD_PRELOAD", "FAKE_"))}
    env.update(MPI_ENV, FAKE_LIBCUDA=str(built["libcuda"]), FAKE_DEVICES=str(gpus),
               UMCTL_RT_LIBCUDA=str(built["libcuda"]), UMCTL_RT_STATS="1", **(extra or {}))
    p = subprocess.run([MPIRUN, "--oversubscribe", "-n", str(nodes), sys.executable, "-m", "umctl.cluster.live",
                        "--gpus", str(gpus), "--um-space", str(64 << 20), "--timeout", "20", "--stats",
                        str(tmp_path / "st"), "--library", str(built["lib"]), "--", str(prog), *args],
                       env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stderr[-3000:]
    st = [json.loads((tmp_path / f"st.{r}.json").read_text()) for r in range(nodes)]
    return p, st


def plain(built, prog, args=("100", "4")) -> str:
    env = dict(os.environ, FAKE_LIBCUDA=str(built["libcuda"]))
    env.pop("LD_PRELOAD", None)
    p = subprocess.run([str(prog), *args], env=env, capture_output=True, text=True, timeout=60, check=True)
    return results(p.stdout)[0]


@pytest.mark.parametrize("nodes,gpus", [(2, 1), (3, 1), (2, 2)])
def test_partitioned_program_over_nodes_equals_one_gpu(built, prog, tmp_path, nodes, gpus):
    want = plain(built, prog)
    p, st = run_cluster(built, prog, tmp_path, nodes, gpus)
    assert results(p.stdout) == [want] * nodes
    # every node ran its share of all 7 partitioned kernels (gemm, 4 steps, scale, gemm)
    for line in (ln for ln in p.stderr.splitlines() if ln.startswith("umctl_rt:")):
        assert "partitioned=7 " in line and "part_fallbacks=0 " in line
    for s in st:
        # the first host read after a partitioned kernel syncs (the copy of C back after the scale,
        # cudaDeviceSynchronize after the last gemm); the copies back after it find nothing new,
        # and copies in (before the kernels, and A again after the stencil) never sync
        assert s["rc"] == 0 and s["launches"] == 7 and s["host_syncs"] == 2
        assert s["pages_written"] > 0 and s["invalidated"] > 0
    # pages crossed nodes as MPI messages, and the shared pages' writers were degraded
    assert all(s["pages_in"] > 0 for s in st[1:]) and sum(s["pages_out"] for s in st) > 0
    assert sum(s["degraded"] for s in st) > 0


@pytest.mark.parametrize("wait", ["stream", "event", "async"])
def test_host_waiting_on_a_stream_or_an_event_reads_every_nodes_results(built, prog, tmp_path, wait):
    """The host waits only with cudaStreamSynchronize, with cudaEventSynchronize, or with a
    cudaMemcpyAsync to the host then cudaStreamSynchronize (no cudaDeviceSynchronize, no cudaMemcpy
    back), then reads: node 1 must see every node's slabs, not its own alone. Node 0 starts its
    copies in 0.3 s late: node 1's wait before the first kernel must not fetch the buffers from the
    agents before node 0's host data reached them (it would overwrite node 1's own copies in)."""
    args = ("100", "4", wait)
    want = plain(built, prog)
    assert plain(built, prog, args) == want
    p, st = run_cluster(built, prog, tmp_path, 2, 1, args=args, extra={"CLUSTERPROG_NODE0_LAG_MS": "300"})
    assert results(p.stdout) == [want] * 2
    for s in st:
        # one sync after the scale and one after the last gemm, whatever the number of waits
        assert s["rc"] == 0 and s["launches"] == 7 and s["host_syncs"] == 2


def test_pages_large_enough_for_the_rendezvous_protocol(built, prog, tmp_path):
    """600 x 600 ints: 1.4 MB buffers, so a page reply is a large MPI message in each direction at
    once (two blocking sends of that size waited on each other forever on the H100 run)."""
    args = ("600", "2")
    p, _ = run_cluster(built, prog, tmp_path, 2, 1, args=args, timeout=120)
    assert results(p.stdout) == [plain(built, prog, args)] * 2


def test_a_failing_program_on_one_node_stops_the_cluster(built, prog, tmp_path):
    """A node whose program cannot start: mpirun exits non-zero, no hang."""
    env = dict(os.environ, **MPI_ENV)
    p = subprocess.run([MPIRUN, "--oversubscribe", "-n", "2", sys.executable, "-m", "umctl.cluster.live",
                        "--timeout", "10", "--library", str(built["lib"]), "--", str(tmp_path / "missing")],
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "Traceback" not in p.stderr


def test_umctl_run_hosts_runs_the_program_on_every_node(built, prog, tmp_path):
    """`umctl run --mode snurhac --hosts localhost:2 -- prog`: mpirun with one node agent a slot
    (the package's runtime library, built at install)."""
    from umctl.runtime import library_path

    if library_path().stat().st_mtime < (SRC.parent.parent / "runtime" / "rt_snurhac.c").stat().st_mtime:
        pytest.fail("the package's libumctl_rt.so is older than runtime/: reinstall (pip install -e .)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UMCTL_RT_", "LD_PRELOAD", "FAKE_"))}
    env.update(MPI_ENV, FAKE_LIBCUDA=str(built["libcuda"]), FAKE_DEVICES="1", UMCTL_RT_LIBCUDA=str(built["libcuda"]))
    p = subprocess.run([sys.executable, "-c", "from umctl.cli.main import entry; entry()", "run", "--mode", "snurhac",
                        "--hosts", "localhost:2", "--", str(prog), "100", "4"],
                       env=env, capture_output=True, text=True, timeout=90)
    assert p.returncode == 0, p.stderr[-2000:]
    assert results(p.stdout) == [plain(built, prog)] * 2


@pytest.mark.parametrize("args,msg", [
    (["--mode", "snurhac-dp", "--hosts", "localhost:2"], "--hosts is for --mode snurhac"),
    (["--mode", "snurhac", "--hosts", "a:x"], "not host[:slots]"),
])
def test_umctl_run_hosts_refusals_are_one_line(capsys, args, msg):
    from umctl.cli.main import main

    code = main(["run", *args, "--", "true"])
    err = capsys.readouterr().err
    assert code != 0 and msg in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


# -- what changed for one rank a GPU: page runs, read-only buffers not compared, ranges ----------

from test_snurhac_runtime import snu  # noqa: E402,F401 - the fake-CUDA program with the UMP2 convention


def run_snu_cluster(snu, tmp_path, script: str, nodes: int = 2, mb: int = 2, extra: dict | None = None,
                    err: list | None = None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UMCTL_RT_", "LD_PRELOAD", "FAKE_"))}
    env.update(MPI_ENV, FAKE_LIBCUDA=str(snu["libcuda"]), FAKE_DEVICES="1", UMCTL_RT_LIBCUDA=str(snu["libcuda"]),
               UMCTL_RT_STATS="1", SNU_MB=str(mb), **(extra or {}))
    p = subprocess.run([MPIRUN, "--oversubscribe", "-n", str(nodes), sys.executable, "-m", "umctl.cluster.live",
                        "--gpus", "1", "--um-space", str(64 << 20), "--timeout", "20", "--stats", str(tmp_path / "st"),
                        "--library", str(built_lib(snu)), "--", str(snu["snuprog"]), "ranges", script],
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    if err is not None:
        err.append(p.stderr)
    sums = [ln.split()[1] for ln in p.stderr.splitlines() if ln.startswith("CSUM ")]
    rt = [dict(kv.split("=", 1) for kv in ln.split()[1:]) for ln in p.stderr.splitlines()
          if ln.startswith("umctl_rt_snurhac:")]
    st = [json.loads((tmp_path / f"st.{r}.json").read_text()) for r in range(nodes)]
    return sums, rt, st


def built_lib(snu):
    return snu["lib"]


P = (2 << 20) // 4096   # pages of A, B and C (SNU_MB=2); owner is one page
#: pages of C a node's slabs touch under UMP2: 8 of the grid's 16 block rows, and one row of halo
BAND = 9 * P // 16


def compared(rt) -> list[int]:
    return [int(r["cluster_pages"].split(",")[0]) for r in rt]


def snu_plain_sum(snu, script: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UMCTL_RT_", "LD_PRELOAD", "FAKE_"))}
    env.update(FAKE_LIBCUDA=str(snu["libcuda"]), SNU_MB="2")
    plain = subprocess.run([str(snu["snuprog"]), "ranges", script], env=env, capture_output=True, text=True,
                           timeout=60, check=True)
    return json.loads(next(ln for ln in plain.stdout.splitlines() if ln.startswith("RESULT "))[7:])["c_sum"]


def test_ranges_bring_a_node_only_what_its_slabs_touch(snu, tmp_path):
    """The same kernels over 2 nodes, without (UMPT) and with (UMP2) the convention's ranges:
    the host reads back the same C as the run without umctl on both nodes. With the ranges a node
    is sent (and installs) only its slabs' bands of A, C and owner, B whole: fewer pages than the
    UMPT node, which gets every page of every buffer it lacks. After each kernel only the buffers
    it may write are compared with their twins (A and B are marked read-only): per launch the 'B'
    compares every buffer, the 'E' owner and C, and the host's read after the last kernel every
    buffer once. With the ranges the 'E' compares owner and C only in the node's band (C's half
    and a block row of halo), not whole: it fails if a page outside the band is compared."""
    want = snu_plain_sum(snu, "vvvv")
    s1, rt1, st1 = run_snu_cluster(snu, tmp_path, "vvvv")
    s2, rt2, st2 = run_snu_cluster(snu, tmp_path, "gggg")
    assert s1 == [want] * 2 and s2 == [want] * 2
    assert [s["scoped_launches"] for s in st1] == [0, 0] and [s["scoped_launches"] for s in st2] == [4, 4]
    # before each kernel, the UMPT node is brought every page it lacks (the other node's half of
    # C, written by the kernel before); with the ranges its own band (+ a block's share of halo)
    # is all it needs, and it has it
    assert st2[1]["pages_sent_at_launch"] < 0.8 * st1[1]["pages_sent_at_launch"]
    assert compared(rt1) == [4 * (1 + 3 * P) + 4 * (1 + P) + (1 + 3 * P)] * 2
    assert compared(rt2) == [4 * (1 + 3 * P) + 4 * (1 + BAND) + (1 + 3 * P)] * 2


@pytest.mark.parametrize("mode", ["copy", "small-chunks", "host", "copy-fails"])
def test_the_diff_copies_managed_memory_out_with_cudamemcpy(snu, tmp_path, mode):
    """The twins are compared with copies of the managed bytes the runtime makes with the real
    cudaMemcpy into a pinned stage (on a GPU: the copy engine reads GPU-resident pages where they
    are, no page migrates to the host), and installed pages are written back the same way: every
    compared byte is copied out once. In chunks of 3 pages (runs end at a chunk's end), with the
    copies turned off (UMCTL_RT_CLUSTER_COPY=0) or failing (the fake runtime's copies to pinned
    memory fail: the runtime says so once and uses host loads and stores), the same results and
    the same pages compared, and no copy counted. The stats line gives the time in each phase."""
    extra = {"copy": {}, "small-chunks": {"UMCTL_RT_CLUSTER_CHUNK": str(3 * 4096)},
             "host": {"UMCTL_RT_CLUSTER_COPY": "0"}, "copy-fails": {"FAKE_PINNED_COPY_FAILS": "1"}}[mode]
    err: list[str] = []
    sums, rt, st = run_snu_cluster(snu, tmp_path, "gggg", extra=extra, err=err)
    assert sums == [snu_plain_sum(snu, "gggg")] * 2
    assert compared(rt) == [4 * (1 + 3 * P) + 4 * (1 + BAND) + (1 + 3 * P)] * 2
    failed = err[0].count("cudaMemcpy of managed memory for the cluster agent failed")
    assert failed == (2 if mode == "copy-fails" else 0)     # once a node
    for r in rt:
        b, e, s_ = map(float, r["cl_ms"].split(","))
        assert b > 0 and e > 0 and s_ > 0 and float(r["cl_wait_ms"]) <= b + e + s_
        rd, wr = map(float, r["cl_copy_mib"].split(","))
        installed = int(r["cluster_pages"].split(",")[2])
        if mode in ("copy", "small-chunks"):
            # owner's 256 bytes and 3 x 2 MiB at each 'B' and at the 'S', owner and C's band at each 'E'
            want = (5 * (256 + 3 * (2 << 20)) + 4 * (256 + BAND * 4096)) / 2**20
            assert abs(rd - want) < 0.06, (rd, want)
            assert (wr > 0) == (installed > 0) and wr <= installed * 4096 / 2**20 + 0.05
            assert float(r["cl_copy_ms"]) >= 0
        else:
            assert (rd, wr) == (0.0, 0.0)
    assert sum(int(r["cluster_pages"].split(",")[2]) for r in rt) > 0   # pages did cross


def test_a_rank_a_gpu_gets_its_own_gpus():
    """Ranks sharing a host (mpirun -n 4 on one 4-GPU machine) each see their own GPUs; one rank a
    host, or too few GPUs for a share each (two ranks on one GPU), leaves CUDA_VISIBLE_DEVICES."""
    from umctl.cluster.live import local_devices

    assert [local_devices(r, 4, 1, None, 4) for r in range(4)] == ["0", "1", "2", "3"]
    assert [local_devices(r, 2, 2, None, 4) for r in range(2)] == ["0,1", "2,3"]
    assert [local_devices(r, 2, 1, "5,7,9", 8) for r in range(2)] == ["5", "7"]
    assert local_devices(0, 1, 4, None, 4) is None
    assert local_devices(1, 2, 1, None, 1) is None
    assert local_devices(1, 4, 1, "0,1", 8) is None
