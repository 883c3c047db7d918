"""Scenario registry, loader and generators (umctl.workload.scenario, umctl.workload.families)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from umctl import UmctlError
from umctl.events.schema import AllocOp, CopyKind
from umctl.workload.families.dnn import NETS
from umctl.workload.scenario import find_scenario, list_scenarios, load_scenario, parse_param, resolve_params
from umctl.workload.workload import OpType, Workload

SMALL = {"gpu_mem": "128MiB"}
DNN = ["gpt2-xl", "gpt2-l", "bert-large", "resnet152"]
#: Families whose managed footprint is oversub x gpu_mem (hum programs fit in device memory).
SCALED = DNN + ["dlrm", "pagerank", "bfs"]


def kernel_pages(w: Workload, mask: np.ndarray, written: bool = False) -> list[np.ndarray]:
    """Pages (or only the written pages) of the kernels selected by ``mask``."""
    k = w.kernels
    out = []
    for lo, hi in zip(k["acc_lo"][mask], k["acc_hi"][mask]):
        pages = w.acc_page[lo:hi]
        out.append(pages[w.acc_write[lo:hi]] if written else pages)
    return out


def test_registry_lists_every_family() -> None:
    infos = list_scenarios()
    assert {i.family for i in infos} == {"dnn", "embedding", "graph", "hum", "multigpu", "multitenant"}
    names = [i.name for i in infos]
    assert len(names) == len(set(names))
    for info in infos:
        assert info.description
        assert {"oversub", "gpu_mem", "iterations", "seed"} <= set(info.defaults())
    assert [i.name for i in list_scenarios("graph")] == ["pagerank", "bfs"]


@pytest.mark.parametrize("name", [i.name for i in list_scenarios()])
def test_every_scenario_loads_with_defaults(name: str) -> None:
    t0 = time.perf_counter()
    w = load_scenario(name)
    elapsed = time.perf_counter() - t0
    w.validate()
    assert w.name == name
    assert w.params["gpu_mem"] == w.gpu_mem[0]
    assert w.meta["family"] == find_scenario(name).family
    k = w.kernels
    assert len(k) > 0 and (k["compute_ns"] > 0).all()
    # ResNet-152, every BN and ReLU its own kernel as in PyTorch, is the largest (7.4 M: 1.5 s
    # for `umctl replay resnet152 -m none,deepum` on the 2-core development VM)
    assert w.n_accesses < 8_000_000, "defaults must replay in a few seconds"
    print(f"{name}: {w.n_accesses} accesses, {w.managed_bytes >> 20} MiB managed, {elapsed:.2f} s")


@pytest.mark.parametrize("name", ["gpt2-l", "dlrm", "pagerank", "bfs", "mgpu-stencil", "tenants", "hum-rewrite"])
def test_same_seed_same_workload(name: str) -> None:
    a, b = load_scenario(name, SMALL), load_scenario(name, SMALL)
    assert np.array_equal(a.ops, b.ops)
    assert np.array_equal(a.acc_page, b.acc_page) and np.array_equal(a.acc_write, b.acc_write)
    assert np.array_equal(a.allocations, b.allocations)


@pytest.mark.parametrize("name", ["dlrm", "pagerank", "bfs"])
def test_seed_changes_irregular_accesses(name: str) -> None:
    a = load_scenario(name, {**SMALL, "seed": "1"})
    b = load_scenario(name, {**SMALL, "seed": "2"})
    same = len(a.acc_page) == len(b.acc_page) and np.array_equal(a.acc_page, b.acc_page)
    assert not same


def test_dlrm_looks_up_different_rows_every_iteration() -> None:
    w = load_scenario("dlrm", SMALL)
    k = w.kernels
    names = np.array(w.names)[k["name_id"]]
    sets = [set(np.concatenate(kernel_pages(w, (names == "embedding_bag") & (k["iteration"] == it))).tolist())
            for it in range(3)]
    assert sets[0] != sets[1] != sets[2]
    tables = w.meta["footprint"]["weights"]
    assert tables > 0.5 * w.managed_bytes, "embedding tables are most of DLRM's footprint"


@pytest.mark.parametrize("name", DNN + ["dlrm"])
def test_training_exec_hashes_repeat_every_iteration(name: str) -> None:
    w = load_scenario(name, SMALL)
    k = w.kernels
    seqs = [k["exec_hash"][k["iteration"] == it] for it in range(w.params["iterations"])]
    assert len(seqs[0]) > 0
    for s in seqs[1:]:
        assert np.array_equal(seqs[0], s)


@pytest.mark.parametrize("name", DNN)
def test_dnn_blocks_go_inactive_and_active_again(name: str) -> None:
    w = load_scenario(name, SMALL)
    mem = w.ops[w.ops["type"] == OpType.MEM]
    active, inactive = mem[mem["mem_op"] == AllocOp.BLOCK_ACTIVE], mem[mem["mem_op"] == AllocOp.BLOCK_INACTIVE]
    assert len(inactive) > 0 and len(active) == len(inactive)
    # Every block freed in iteration i is handed out again, at the same address, in iteration i+1.
    freed0 = set(inactive["addr"][inactive["iteration"] == 0].tolist())
    reused1 = set(active["addr"][active["iteration"] == 1].tolist())
    assert freed0 == reused1
    # Kernels and input copies touch the allocator's segment only inside active blocks.
    ops = w.ops
    pool = w.allocations[np.array(w.names)[w.allocations["name_id"]] == "allocator_blocks"][0]
    lo_page, hi_page = int(pool["addr"]) >> 12, int(pool["addr"] + pool["bytes"]) >> 12
    starts = np.unique(np.concatenate([active["addr"], inactive["addr"]]) >> 12).astype(np.int64)
    live = np.zeros(len(starts), dtype=bool)
    for o in ops:
        if o["type"] == OpType.MEM and o["mem_op"] in (AllocOp.BLOCK_ACTIVE, AllocOp.BLOCK_INACTIVE):
            live[np.searchsorted(starts, int(o["addr"]) >> 12)] = o["mem_op"] == AllocOp.BLOCK_ACTIVE
        elif o["type"] in (OpType.KERNEL, OpType.COPY):
            pages = w.acc_page[o["acc_lo"]:o["acc_hi"]] if o["type"] == OpType.KERNEL else [int(o["dst_addr"]) >> 12]
            pages = np.asarray(pages, dtype=np.int64)
            pages = pages[(pages >= lo_page) & (pages < hi_page)]
            assert live[np.searchsorted(starts, pages, side="right") - 1].all()


def test_dnn_weights_start_on_host_activations_untouched() -> None:
    w = load_scenario("gpt2-l", SMALL)
    names = np.array(w.names)[w.allocations["name_id"]]
    init = dict(zip(names.tolist(), w.allocations["init"].tolist()))
    assert init["weights"] == 1 and init["allocator_blocks"] == 0


@pytest.mark.parametrize("name", DNN)
def test_dnn_shapes_match_published_models(name: str) -> None:
    info = find_scenario(name)
    params = resolve_params(info)
    net = NETS[params["arch"]](params)
    assert net.param_count == pytest.approx(info.reference["params"], rel=0.05)


@pytest.mark.parametrize("name", DNN)
def test_dnn_cost_model_rates(name: str) -> None:
    """GEMMs move their bytes at ~40-80 GB/s-equivalent, elementwise kernels at ~1-2 TB/s."""
    w = load_scenario(name, SMALL)
    k = w.kernels
    names = np.array(w.names)[k["name_id"]]
    nbytes = (k["acc_hi"] - k["acc_lo"]) * 4096
    gemm = np.array([n.startswith(("gemm", "conv", "bgemm")) for n in names])
    gemm_rate = nbytes[gemm].sum() / k["compute_ns"][gemm].sum()
    elem_rate = nbytes[~gemm].sum() / k["compute_ns"][~gemm].sum()
    assert 30 <= gemm_rate <= 110, gemm_rate
    assert 900 <= elem_rate <= 2100, elem_rate


@pytest.mark.parametrize("oversub", ["1.5", "2", "3"])
@pytest.mark.parametrize("name", SCALED)
def test_footprint_is_oversub_times_gpu_mem(name: str, oversub: str) -> None:
    w = load_scenario(name, {"gpu_mem": "128MiB", "oversub": oversub, "iterations": "1"})
    assert w.managed_bytes == pytest.approx(float(oversub) * (128 << 20), rel=0.10)


def test_tenant_footprints() -> None:
    w = load_scenario("tenants", {"gpu_mem": "128MiB", "oversub": "3", "spare": "0.25", "tenants": "4"})
    a = w.allocations
    by_pid = {pid: int(a["bytes"][a["managed"] & (a["pid"] == pid)].sum()) for pid in range(4)}
    assert by_pid[0] == pytest.approx(3 * (128 << 20), rel=0.10)
    for pid in (1, 2, 3):
        assert by_pid[pid] == pytest.approx(0.75 * (128 << 20), rel=0.10)
    k = w.kernels
    assert set(k["gpu"].tolist()) == {0, 1, 2, 3}
    assert (k["gpu"] == k["pid"]).all()
    assert [t["scenario"] for t in w.meta["tenants"]] == ["gpt2-l", "resnet152", "pagerank", "resnet152"]


@pytest.mark.parametrize("name", [i.name for i in list_scenarios("multigpu")])
@pytest.mark.parametrize("gpus", [1, 8])
def test_multigpu_programs_are_single_gpu_with_thread_blocks(name: str, gpus: int) -> None:
    """SnuRHAC's input: a program written for one GPU (cudaMalloc, copies, kernels on GPU 0)
    on a machine of ``gpus``, each kernel describing its thread blocks."""
    w = load_scenario(name, {**SMALL, "gpus": str(gpus)})
    assert w.n_gpus == gpus and len(w.gpu_mem) == gpus
    k = w.kernels
    assert (k["gpu"] == 0).all()
    dev = w.allocations[~w.allocations["managed"] & (w.allocations["gpu"] == 0)]
    assert dev["bytes"].sum() == pytest.approx(0.75 * (128 << 20), rel=0.10)
    kernel_ops = np.flatnonzero(w.ops["type"] == OpType.KERNEL)
    assert sorted(w.thread_blocks) == kernel_ops.tolist()
    for i in kernel_ops:
        kb, op = w.thread_blocks[i], w.ops[i]
        assert kb.tb_off[-1] == op["acc_hi"] - op["acc_lo"] and tuple(op["grid"]) == kb.grid
        # every affine range bounds what its thread blocks really touch
        bx, by, bz = kb.coords(np.arange(kb.n_blocks))
        bounds = [r.bounds(bx, by, bz) for r in kb.ranges]
        for t in range(kb.n_blocks):
            pages = w.acc_page[op["acc_lo"] + kb.tb_off[t]:op["acc_lo"] + kb.tb_off[t + 1]]
            lo = min(int(b[0][t]) for b in bounds) >> 12
            hi = (max(int(b[1][t]) for b in bounds) + 4095) >> 12
            assert lo <= pages.min() and pages.max() < hi


def test_hum_scenarios_copy_sync_async_and_rewrite_after_async() -> None:
    kinds = {}
    for info in list_scenarios("hum"):
        w = load_scenario(info.name)
        copies = w.ops[w.ops["type"] == OpType.COPY]
        h2d = copies[copies["copy_kind"] == CopyKind.H2D]
        kinds[info.name] = set(h2d["is_async"].tolist())
        dev = w.allocations[~w.allocations["managed"] & (w.allocations["gpu"] == 0)]
        assert set(h2d["dst_addr"].tolist()) <= set(dev["addr"].tolist()), "copies go to cudaMalloc memory"
        assert (w.ops["type"] == OpType.HOST_WRITE).any()
    assert {False} in kinds.values() and {True} in kinds.values()
    # HUM §4.2: the host writes a copy's source while the asynchronous copy may still run
    # (no cudaDeviceSynchronize and no synchronous cudaMemcpy since the copy was issued).
    ops = load_scenario("hum-rewrite").ops
    rewrites = 0
    for i in np.flatnonzero(ops["type"] == OpType.HOST_WRITE):
        copies = np.flatnonzero((ops["type"][:i] == OpType.COPY) & (ops["addr"][:i] == ops[i]["addr"]))
        if len(copies) and ops[copies[-1]]["is_async"]:
            between = ops[copies[-1] + 1:i]
            synced = (between["type"] == OpType.SYNC) | ((between["type"] == OpType.COPY) & ~between["is_async"])
            rewrites += not synced.any()
    assert rewrites == 3


def test_overrides_parse_types() -> None:
    info = find_scenario("dlrm")
    p = resolve_params(info, {"gpu_mem": "1.5GiB", "oversub": "2.5", "iters": "4", "seed": "7",
                              "top-mlp": "128,1", "zipf": "1"})
    assert p["gpu_mem"] == 1536 << 20 and p["oversub"] == 2.5 and p["iterations"] == 4 and p["seed"] == 7
    assert p["top_mlp"] == [128, 1] and p["zipf"] == 1.0
    p = resolve_params(find_scenario("hum-sync"), {"async_copy": "yes"})
    assert p["async_copy"] is True
    assert parse_param("batch = 5") == ("batch", "5")


@pytest.mark.parametrize("target, overrides, words", [
    ("gpt2xl", None, "gpt2-xl"),
    ("gpt2-xl", {"batchsize": "4"}, "batch"),
    ("gpt2-xl", {"batch": "four"}, "integer"),
    ("gpt2-xl", {"gpu_mem": "lots"}, "size"),
    ("gpt2-xl", {"oversub": "-1"}, "oversub"),
    ("gpt2-xl", {"optimizer": "lamb"}, "adam"),
    ("mgpu-gemm", {"gpus": "16"}, "gpus"),
    ("tenants", {"harvester": "nope"}, "unknown scenario"),
    ("hum-sync", {"async_copy": "maybe"}, "true or false"),
    ("missing.toml", None, "cannot read"),
    ("scenarios/dnn.toml:gpt3", None, "gpt2"),
])
def test_bad_targets_and_values_raise_one_line(target: str, overrides: dict | None, words: str) -> None:
    with pytest.raises(UmctlError) as e:
        load_scenario(target, overrides)
    assert "\n" not in str(e.value) and words in str(e.value)


def test_scenario_files_as_targets(tmp_path, monkeypatch) -> None:
    f = tmp_path / "mine.toml"
    f.write_text('[family]\ngenerator = "graph"\n\n'
                 '[scenarios.tiny-pr]\nalgorithm = "pagerank"\navg_degree = 8\nalpha = 2.0\nchunks = 4\n'
                 'hbm_gbps = 1000.0\ngpu_mem = "64MiB"\niterations = 2\n\n'
                 '[scenarios.tiny-bert]\nbase = "bert-large"\nlayers = 2\ngpu_mem = "64MiB"\n')
    first = load_scenario(str(f))
    assert first.name == "tiny-pr" and first.params["avg_degree"] == 8
    bert = load_scenario(f"{f}:tiny-bert", {"batch": "2"})
    assert bert.name == "tiny-bert" and bert.params["layers"] == 2 and bert.params["hidden"] == 1024
    assert bert.meta["generator"] == "dnn"
    monkeypatch.chdir(tmp_path)
    assert load_scenario("./mine.toml:tiny-pr").name == "tiny-pr"
    bad = tmp_path / "bad.toml"
    bad.write_text("[family\n")
    with pytest.raises(UmctlError, match="cannot read scenario file"):
        load_scenario(str(bad))
    incomplete = tmp_path / "incomplete.toml"
    incomplete.write_text('[family]\ngenerator = "dnn"\n[scenarios.half]\narch = "transformer"\n')
    with pytest.raises(UmctlError, match="scenario half: missing parameter 'batch'"):
        load_scenario(str(incomplete))


@pytest.mark.slow
def test_ten_million_access_dnn_generates_fast() -> None:
    t0 = time.perf_counter()
    w = load_scenario("gpt2-xl", {"gpu_mem": "1GiB", "oversub": "3"})
    elapsed = time.perf_counter() - t0
    assert w.n_accesses >= 9_000_000
    assert elapsed < 3.0, elapsed


def test_scenarios_command_table_and_json() -> None:
    import json

    import typer
    from typer.testing import CliRunner

    from umctl.cli.scenarios_cmd import scenarios_command

    app = typer.Typer()
    app.command("scenarios")(scenarios_command)
    app.command("other")(lambda: None)
    r = CliRunner().invoke(app, ["scenarios", "--family", "graph"])
    assert r.exit_code == 0 and "pagerank" in r.output and "bfs" in r.output
    r = CliRunner().invoke(app, ["scenarios", "--json"])
    data = json.loads(r.output)
    assert {d["name"] for d in data} == {i.name for i in list_scenarios()}
    assert data[0]["params"]["gpu_mem"].endswith("MiB")
