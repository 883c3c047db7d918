"""The models people train now in the dnn family (issue 38 §3): mixture-of-experts routing,
U-Net skip connections, SwiGLU, untied LM heads, mixed precision with fp32 master weights, and
the shipped scenarios' published shapes. Each test fails when the behaviour it names breaks."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from umctl.events.schema import AllocOp
from umctl.workload.families import dnn
from umctl.workload.families.dnn import F32, OpKind, Ref, Space
from umctl.workload.scenario import find_scenario, load_scenario, resolve_params
from umctl.workload.workload import OpType, Workload, WorkloadBuilder

NEW = ["llama-7b", "mixtral-8x7b", "sd15-unet", "vit-l16"]
#: A Mixtral-shaped model small enough to check page by page (4 MoE layers of 8 experts, top-2).
TINY_MOE = {"layers": "4", "hidden": "256", "heads": "8", "kv_heads": "2", "intermediate": "512", "vocab": "1000",
            "seq_len": "64", "gpu_mem": "16MiB", "iterations": "4"}
TINY_UNET = {"channels": "32,64,64", "attention_levels": "true,true,false", "image": "16", "batch": "1",
             "heads": "2", "context_len": "8", "context_dim": "32", "layers": "1"}


def params_of(name: str, overrides: dict | None = None) -> dict:
    return resolve_params(find_scenario(name), overrides or {})


def net_of(name: str, overrides: dict | None = None) -> dnn.Net:
    p = params_of(name, overrides)
    return dnn.NETS[p["arch"]](p)


def replayed_layout(name: str, overrides: dict) -> tuple[Workload, dnn.Net, list[dnn.Step], dnn.Layout]:
    """The workload, and the layout its generator used, rebuilt the way single_gpu builds it
    (a fresh builder, the layout first), so tensors can be found by address."""
    w = load_scenario(name, overrides)
    p = w.params
    net = dnn.NETS[p["arch"]](p)
    steps = dnn.trace(net, p["optimizer"])
    b = WorkloadBuilder("scenario", gpu_mem=p["gpu_mem"])
    lay = dnn.layout(b, net, steps, p["optimizer"], int(p["oversub"] * p["gpu_mem"]), pid=0, gpu=0)
    arenas = {w.names[n]: int(a) for n, a in zip(w.allocations["name_id"], w.allocations["addr"])}
    assert arenas["weights"] == min(t.addr for r, t in lay.tensors.items() if r.space is Space.W), "layout rebuilt"
    assert arenas["allocator_blocks"] == min(blk.addr for blk in lay.blocks.values()), "layout rebuilt"
    return w, net, steps, lay


def pages_by_iteration(w: Workload) -> list[set[int]]:
    k = w.kernels
    out = []
    for it in range(w.params["iterations"]):
        sel = k[k["iteration"] == it]
        out.append(set(np.concatenate([w.acc_page[lo:hi] for lo, hi in zip(sel["acc_lo"], sel["acc_hi"])]).tolist()))
    return out


def page_set(buf) -> set[int]:
    lo = buf.addr >> 12
    return set(range(lo, lo + (buf.nbytes >> 12)))


# -- the existing models are unchanged ---------------------------------------------------------
#: sha256 of each DeepUM model's net (its ops' fields) and one iteration's program (steps and
#: their tensors), from the generator before issue 38 §3: the new options must leave them alone.
BEFORE = {
    "gpt2-xl": "40251c9a3dfdd8016181bda8cb345ac3",
    "gpt2-l": "e67d2f9b4753c7d7912c1c7517c8dfaf",
    "bert-large": "b0806f0857de138ab0060daaf1de8bb1",
    "bert-base": "0f1fac8d2911a9c0b414a30e1a81d972",
    "resnet152": "5f7b21198f7f5c6ecf832c8aa2e87a38",
    "resnet200": "399b6830d131d5de6855ca52f8658074",
}
FIELDS = ("name", "kind", "layer", "out", "inputs", "weight", "shares", "flops", "rows", "lookups", "sparse", "saved",
          "inplace", "keeps")


@pytest.mark.parametrize("name", sorted(BEFORE))
def test_deepum_models_program_unchanged(name: str) -> None:
    p = params_of(name)
    net = dnn.NETS[p["arch"]](p)
    h = hashlib.sha256()
    for op in net.ops:
        h.update(repr(tuple(getattr(op, f) if f != "kind" else op.kind.value for f in FIELDS)).encode())
        assert (op.experts, op.top_k, op.router, op.slot, op.backward) == (0, 0, -1, -1, 1.0)
    for st in dnn.trace(net, p["optimizer"]):
        refs = (tuple((r.space.value, r.op, r.rows) for r in st.reads) + ("|",)
                + tuple((r.space.value, r.op, r.rows) for r in st.writes))
        h.update(repr((int(st.type), st.name, st.op, refs, st.flops)).encode())
        assert all(r.slot == -1 and r.expert == -1 for r in st.reads + st.writes)
    assert h.hexdigest()[:32] == BEFORE[name]
    assert net.act == F32


def test_explicit_defaults_are_the_old_transformer() -> None:
    small = {"gpu_mem": "16MiB", "iterations": "1", "layers": "2"}
    base = load_scenario("gpt2-l", small)
    p = params_of("gpt2-l", small)
    p.update(norm="layernorm", mlp="gelu", attention="eager", position="learned", bias=True, tied=True,
             intermediate=0, kv_heads=0, experts=0, top_k=0, precision="fp32", embed="tokens")
    net = dnn.transformer_net(p)
    assert [op for op in net.ops] == [op for op in dnn.transformer_net(params_of("gpt2-l", small)).ops]
    w = dnn.generate(p)
    assert np.array_equal(w.acc_page, base.acc_page) and np.array_equal(w.ops, base.ops)


# -- published shapes, from the full-size nets -------------------------------------------------
@pytest.mark.parametrize("name, params, rel", [("llama-7b", 6.74e9, 0.01), ("mixtral-8x7b", 46.7e9, 0.01),
                                               ("vit-l16", 304e6, 0.01), ("sd15-unet", 860e6, 0.01)])
def test_published_param_counts(name: str, params: float, rel: float) -> None:
    net = net_of(name)
    assert net.param_count == pytest.approx(params, rel=rel)
    assert net.param_count == pytest.approx(find_scenario(name).reference["params"], rel=0.001)
    assert find_scenario(name).reference["source"]


def test_exact_param_counts() -> None:
    """The Hugging Face / diffusers / timm counts of the same configurations."""
    assert net_of("llama-7b").param_count == 6_738_415_616
    assert net_of("mixtral-8x7b").param_count == 46_702_792_704
    assert net_of("sd15-unet").param_count == 859_520_964
    assert net_of("vit-l16").param_count == 304_326_632


def test_swiglu_params_per_layer() -> None:
    p = params_of("llama-7b")
    h, i = p["hidden"], p["intermediate"]
    net = dnn.transformer_net(p)
    for layer in (1, p["layers"]):
        mlp = [op for op in net.ops if op.layer == layer and op.name.startswith("gemm_mlp_")]
        assert [op.name for op in mlp] == ["gemm_mlp_gate", "gemm_mlp_up", "gemm_mlp_down"]
        assert sum(op.weight for op in mlp) == 3 * h * i * F32
    # autograd keeps gate, silu(gate), up and their product: four intermediate-wide tensors a layer
    steps = dnn.trace(net, p["optimizer"])
    kept = {r.op for st in steps if st.name.endswith(("_backward", "_wgrad")) for r in st.reads if r.space is Space.A}
    wide = [j for j, op in enumerate(net.ops) if op.layer == 1 and op.out == p["batch"] * p["seq_len"] * i * net.act]
    assert len(wide) == 4 and set(wide) <= kept


def test_untied_head_adds_vocab_x_hidden() -> None:
    p = params_of("llama-7b")
    untied = dnn.transformer_net(p)
    tied = dnn.transformer_net({**p, "tied": True})
    assert untied.param_count - tied.param_count == p["vocab"] * p["hidden"]
    head = next(op for op in untied.ops if op.name == "gemm_lm_head")
    assert head.weight == p["vocab"] * p["hidden"] * F32 and head.shares == -1
    assert next(op for op in tied.ops if op.name == "gemm_vocab_head").shares >= 0


def test_grouped_query_attention_shrinks_kv() -> None:
    p = params_of("mixtral-8x7b")
    qkv = next(op for op in dnn.transformer_net(p).ops if op.name == "gemm_qkv")
    h, kv, a = p["hidden"], p["kv_heads"], p["heads"]
    assert qkv.weight == h * (h + 2 * h // a * kv) * F32


def test_vit_tokens_and_head() -> None:
    p = params_of("vit-l16")
    net = dnn.transformer_net(p)
    T = p["batch"] * ((224 // 16) ** 2 + 1)
    assert T == p["batch"] * 197
    qkv = next(op for op in net.ops if op.name == "gemm_qkv")
    assert qkv.out == T * 3 * p["hidden"] * net.act
    assert net.ops[-2].name == "gemm_classifier" and net.ops[-2].out == p["batch"] * 1000 * net.act
    assert not any(op.kind is OpKind.GATHER for op in net.ops)


# -- mixed precision ----------------------------------------------------------------------------
def test_half_activations_fp32_state_and_cast_copies() -> None:
    p = params_of("llama-7b", {"layers": "2", "hidden": "512", "heads": "8", "intermediate": "1376", "vocab": "4000",
                               "seq_len": "128"})
    half = dnn.transformer_net(p)
    full = dnn.transformer_net({**p, "precision": "fp32"})
    assert half.act == 2 and full.act == F32 and half.param_count == full.param_count
    for a, b in zip(half.ops, full.ops):
        assert a.weight == b.weight                       # fp32 master weights either way
        if a.kind is OpKind.GEMM:
            assert a.out * 2 == b.out                     # half-width activations
    steps = dnn.trace(half, "adam")
    gemm_owners = {dnn.owner(half, i) for i, op in enumerate(half.ops)
                   if op.kind is OpKind.GEMM and dnn.owner(half, i) >= 0}
    casts = [st for st in steps if st.name == "cast_to_bf16"]
    assert {st.writes[0].op for st in casts} == gemm_owners and len(casts) == len(gemm_owners)
    assert all(st.reads[0].space is Space.W and st.writes[0].space is Space.C for st in casts)
    # the half copy lives until the dgrad of its last use; the optimizer reads only fp32 tensors
    span = dnn.lifetimes(steps)
    for st in casts:
        copy = st.writes[0]
        op = half.ops[copy.op]
        assert dnn.natural_bytes(half, copy) == op.weight / 2
        last = max(k for k, s in enumerate(steps) for r in s.reads if r == copy)
        assert span[copy][1] == last and steps[last].name.endswith("_dgrad")
    opt = [st for st in steps if st.name == "adam_step"]
    assert opt and all(r.space in dnn.PARAMETER for st in opt for r in st.reads + st.writes)
    assert sum(st.name == "cast_to_fp32" for st in steps) == len(gemm_owners)

    # footprint at full size: weights, grads, m and v each 4 bytes a parameter
    b = WorkloadBuilder("t", gpu_mem=1 << 40)
    lay = dnn.layout(b, half, steps, "adam", None, pid=0, gpu=0)
    n = half.param_count
    for space in ("weights", "grads", "optimizer_state_1", "optimizer_state_2"):
        assert lay.footprint[space] == pytest.approx(4 * n, rel=0.01)
    # every activation half the bytes of fp32's, but the fp32 softmax/loss (autocast's fp32 ops)
    fp32_ops = {"log_softmax", "nll_loss"}
    for j, (a, b) in enumerate(zip(half.ops, full.ops)):
        if a.kind is not OpKind.INPUT and a.name not in fp32_ops:
            assert dnn.natural_bytes(half, Ref(Space.A, j)) * 2 == dnn.natural_bytes(full, Ref(Space.A, j))
    blocks_full = dnn.layout(WorkloadBuilder("t", gpu_mem=1 << 40), full, dnn.trace(full, "adam"), "adam", None,
                             pid=0, gpu=0).footprint["allocator_blocks"]
    assert lay.footprint["allocator_blocks"] < blocks_full


def test_half_gemms_run_at_the_half_rate() -> None:
    small = {"layers": "2", "gpu_mem": "16MiB", "iterations": "1"}
    w1 = load_scenario("llama-7b", small)
    w2 = load_scenario("llama-7b", {**small, "peak_tflops_half": "300"})
    w3 = load_scenario("llama-7b", {**small, "peak_tflops": "5"})
    names = np.array(w1.names)[w1.kernels["name_id"]]
    gemm = np.array([n.startswith(("gemm_", "flash_")) for n in names])
    t1, t2, t3 = (w.kernels["compute_ns"][gemm].sum() for w in (w1, w2, w3))
    assert t2 == pytest.approx(2 * t1, rel=0.15)
    assert t3 == t1


# -- mixture of experts -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def moe():
    return replayed_layout("mixtral-8x7b", TINY_MOE)


def test_moe_touches_exactly_the_routed_experts(moe) -> None:
    w, net, steps, lay = moe
    p = w.params
    routers = [i for i, op in enumerate(net.ops) if op.top_k > 0]
    assert len(routers) == p["layers"]
    touched = pages_by_iteration(w)
    routing = w.meta["routing"]
    assert len(routing) == p["iterations"]
    for it, chosen in enumerate(routing):
        n_touched = 0
        for r, picks in zip(routers, chosen):
            assert len(set(picks)) == p["top_k"]
            group = [j for j, op in enumerate(net.ops) if op.router == r and op.weight > 0]
            for e in range(p["experts"]):
                pages = set().union(*(page_set(lay.tensors[Ref(s, j, expert=e)])
                                      for j in group for s in dnn.PARAMETER))
                if e in picks:
                    assert pages <= touched[it], "a routed expert's weights, grads and Adam state are all updated"
                    n_touched += 1
                else:
                    assert not pages & touched[it], f"iteration {it}: un-routed expert {e} was touched"
        assert n_touched == p["top_k"] * p["layers"]


def test_moe_optimizer_skips_unrouted_experts(moe) -> None:
    w, net, steps, lay = moe
    k = w.kernels
    names = np.array(w.names)[k["name_id"]]
    for it, chosen in enumerate(w.meta["routing"]):
        sel = k[(names == "adam_step") & (k["iteration"] == it)]
        pages = set(np.concatenate([w.acc_page[lo:hi] for lo, hi in zip(sel["acc_lo"], sel["acc_hi"])]).tolist())
        routers = [i for i, op in enumerate(net.ops) if op.top_k > 0]
        for r, picks in zip(routers, chosen):
            j = next(j for j, op in enumerate(net.ops) if op.router == r and op.weight > 0)
            for e in range(net.ops[r].experts):
                m = page_set(lay.tensors[Ref(Space.M, j, expert=e)])
                assert (m <= pages) == (e in picks) and (bool(m & pages) == (e in picks))


def test_moe_routing_changes_per_iteration_and_is_seeded() -> None:
    a = load_scenario("mixtral-8x7b", TINY_MOE)
    b = load_scenario("mixtral-8x7b", TINY_MOE)
    c = load_scenario("mixtral-8x7b", {**TINY_MOE, "seed": "7"})
    routing = a.meta["routing"]
    assert routing == b.meta["routing"] and np.array_equal(a.acc_page, b.acc_page)
    assert routing != c.meta["routing"]
    for it in range(1, len(routing)):
        assert routing[it] != routing[it - 1]
    # the access stream changes with the routing: iterations touch different pages
    touched = pages_by_iteration(a)
    assert all(touched[it] != touched[it - 1] for it in range(1, len(touched)))


def test_expert_kernels_have_their_own_exec_identities(moe) -> None:
    """Kernel name + tensor addresses tell experts apart. At fp32 an expert's GEMMs read its
    own weight; under mixed precision they read the slot's half copy (the same allocator block
    whichever expert fills the slot, as in PyTorch), and the expert's identity is the cast
    kernel reading its fp32 weight (and the cast back writing its fp32 grad)."""
    w, net, steps, lay = moe
    n_layers, top_k = w.params["layers"], w.params["top_k"]
    # an identity per (layer, expert, slot): a slot's op and its blocks are part of the launch
    pairs = {(layer, e, slot) for chosen in w.meta["routing"] for layer, picks in enumerate(chosen)
             for slot, e in enumerate(picks)}
    k = w.kernels
    names = np.array(w.names)[k["name_id"]]
    casts = [k["exec_hash"][(names == "cast_to_bf16") & (k["iteration"] == it)] for it in range(w.params["iterations"])]
    dense = len(casts[0]) - 3 * n_layers * top_k            # the attention and head weights' casts
    assert len(set(np.concatenate(casts).tolist())) == dense + 3 * len(pairs)
    grads = k["exec_hash"][names == "cast_to_fp32"]
    assert len(set(grads.tolist())) == len(grads) // w.params["iterations"] - 3 * n_layers * top_k + 3 * len(pairs)

    w32 = load_scenario("mixtral-8x7b", {**TINY_MOE, "precision": "fp32"})
    k = w32.kernels
    names = np.array(w32.names)[k["name_id"]]
    gate = names == "gemm_expert_gate"
    for it in range(w32.params["iterations"]):
        hashes = k["exec_hash"][gate & (k["iteration"] == it)]
        assert len(hashes) == n_layers * top_k and len(set(hashes.tolist())) == len(hashes)
    pairs32 = {(layer, e, slot) for chosen in w32.meta["routing"] for layer, picks in enumerate(chosen)
               for slot, e in enumerate(picks)}
    assert len(set(k["exec_hash"][gate].tolist())) == len(pairs32)
    # and the dense parts of the program repeat exactly
    varying = [n for n in set(names.tolist()) if "expert" in n or n.startswith(("adam", "cast_"))]
    dense_ops = ~np.isin(names, varying)
    seqs = [k["exec_hash"][dense_ops & (k["iteration"] == it)] for it in range(w32.params["iterations"])]
    assert all(np.array_equal(seqs[0], s) for s in seqs[1:])


def test_moe_skew_concentrates_on_few_experts() -> None:
    rng = np.random.default_rng(0)
    pop = np.arange(8)
    uniform = np.bincount(np.concatenate([dnn.route(rng, pop, 2, 0.0) for _ in range(2000)]), minlength=8)
    skewed = np.bincount(np.concatenate([dnn.route(rng, pop, 2, 6.0) for _ in range(2000)]), minlength=8)
    assert uniform.min() > 0.8 * uniform.mean()
    assert skewed[:2].sum() > 0.95 * skewed.sum()
    w = load_scenario("mixtral-8x7b", {**TINY_MOE, "skew": "8"})
    per_layer = [{picks[i] for chosen in w.meta["routing"] for picks in [chosen[layer]] for i in range(2)}
                 for layer in range(w.params["layers"])]
    assert max(len(s) for s in per_layer) <= 3
    u = load_scenario("mixtral-8x7b", TINY_MOE)
    spread = [{e for chosen in u.meta["routing"] for e in chosen[layer]} for layer in range(u.params["layers"])]
    assert np.mean([len(s) for s in spread]) > np.mean([len(s) for s in per_layer])


def test_moe_param_count_counts_every_expert() -> None:
    p = params_of("mixtral-8x7b")
    net = dnn.transformer_net(p)
    dense = dnn.transformer_net({**p, "experts": 0, "top_k": 0})
    h, i, E = p["hidden"], p["intermediate"], p["experts"]
    assert net.param_count - dense.param_count == p["layers"] * ((E - 1) * 3 * h * i + h * E)


# -- U-Net skip connections -----------------------------------------------------------------------
def test_unet_skip_activation_lives_until_the_decoder_reads_it() -> None:
    w, net, steps, lay = replayed_layout("sd15-unet", {**TINY_UNET, "gpu_mem": "16MiB", "iterations": "2"})
    conv_in = next(j for j, op in enumerate(net.ops) if op.name == "conv_in")
    concat = [j for j, op in enumerate(net.ops) if op.name == "concat_skip" and conv_in in op.inputs]
    assert len(concat) == 1 and concat[0] > len(net.ops) * 0.8, "the last decoder stage reads conv_in's output"
    fwd_write = next(k for k, st in enumerate(steps) if Ref(Space.A, conv_in) in st.writes)
    fwd_read = next(k for k, st in enumerate(steps) if st.op == concat[0] and st.name == "concat_skip")
    # no other tensor is given conv_in's block while it is alive
    span = dnn.lifetimes(steps)
    mine = span[Ref(Space.A, conv_in)]
    assert mine[0] == fwd_write and mine[1] > fwd_read
    block = lay.blocks[Ref(Space.A, conv_in)]
    for r, (first, last) in span.items():
        if r != Ref(Space.A, conv_in) and lay.blocks[r].addr == block.addr:
            assert last < mine[0] or first > mine[1]
    # its gradient: first written by the concat's backward, early in the backward pass, and
    # alive until the encoder's backward at its end
    d = span[Ref(Space.D, conv_in)]
    backward = [k for k, st in enumerate(steps) if st.name.endswith(("_backward", "_dgrad", "_wgrad"))]
    assert d[0] < backward[len(backward) // 4] and d[1] > backward[-len(backward) // 10]
    # in the replayed stream: the block is never made inactive between the write and the read
    ops = w.ops
    it0 = ops[ops["iteration"] == 0]
    k_ids = np.flatnonzero(it0["type"] == OpType.KERNEL)
    names = np.array(w.names)[it0["name_id"]]
    write_at = k_ids[[i for i, x in enumerate(k_ids) if names[x] == "conv_in"][0]]
    read_at = k_ids[[i for i, x in enumerate(k_ids) if names[x] == "concat_skip"][-1]]
    between = it0[write_at:read_at + 1]
    inactive = between[(between["type"] == OpType.MEM) & (between["mem_op"] == AllocOp.BLOCK_INACTIVE)]
    assert block.addr not in set(inactive["addr"].tolist())


def test_unet_decoder_concatenates_every_encoder_output() -> None:
    p = params_of("sd15-unet")
    net = dnn.unet_net(p)
    concats = [op for op in net.ops if op.name == "concat_skip"]
    levels = len(p["channels"])
    assert len(concats) == levels * (p["layers"] + 1) == 1 + levels * p["layers"] + levels - 1
    # SD 1.5's first decoder stage: 1280 + 1280 channels at 8 x 8
    assert concats[0].out == p["batch"] * 2560 * 8 * 8 * net.act


# -- the scenarios replay quickly ----------------------------------------------------------------
@pytest.mark.parametrize("name", NEW)
def test_new_scenarios_generate_small_and_valid(name: str) -> None:
    w = load_scenario(name)
    w.validate()
    assert w.n_accesses < 6_000_000
    assert w.managed_bytes == pytest.approx(2 * (512 << 20), rel=0.02)
    assert w.meta["param_count"] == net_of(name).param_count
    names = set(np.array(w.names)[w.kernels["name_id"]].tolist())
    assert {"cast_to_bf16", "cast_to_fp16"} & names and "cast_to_fp32" in names
