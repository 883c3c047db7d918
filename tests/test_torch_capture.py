"""umctl capture: a PyTorch step recorded on the meta device, laid out by the caching allocator,
saved as .umw and replayed (umctl/workload/capture/, umctl/workload/workfile.py)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from umctl import UmctlError  # noqa: E402
from umctl.cli.main import main  # noqa: E402
from umctl.events.schema import AllocOp  # noqa: E402
from umctl.workload import workfile  # noqa: E402
from umctl.workload.capture import capture, capture_workload  # noqa: E402
from umctl.workload.capture.allocator import CachingAllocator, round_size  # noqa: E402
from umctl.workload.capture.build import build_workload, plan  # noqa: E402
from umctl.workload.capture.cost import H100_SXM_PEAK, KernelCost  # noqa: E402
from umctl.workload.capture.recorder import ALLOC, OP  # noqa: E402
from umctl.workload.workload import OpType  # noqa: E402

MiB = 1 << 20
COST = KernelCost(H100_SXM_PEAK)


def linear_adam(batch: int, device):
    """One 1024 x 1024 fp32 weight (4 MiB), Adam; the step drops its activations before
    opt.step, so the peak is in Adam: weight, gradient, exp_avg, exp_avg_sq, and the CUDA (foreach)
    path's one parameter-sized temporary (_foreach_sqrt(v), divided in place): 5 x 4 MiB."""
    model = torch.nn.Linear(1024, 1024, bias=False).to(device)
    opt = torch.optim.Adam(model.parameters())

    def step():
        opt.zero_grad(set_to_none=True)
        x = torch.randn(batch, 1024, device=device)
        loss = (model(x) ** 2).sum()
        del x
        loss.backward()
        del loss
        opt.step()

    return model, step


def kept_step(log):
    return log.events[log.step_starts[-1]:log.end]


def test_footprint_of_a_linear_layer_under_adam_is_what_it_is_by_hand():
    cap = capture(linear_adam, 1)
    w = build_workload(cap.log, name="t", gpu_mem=1 << 30, cost=COST)
    P = 1024 * 1024 * 4
    fp = w.meta["footprint"]
    assert fp["parameters"] == P and fp["gradients"] == P
    assert fp["optimizer_state"] == 2 * P                  # exp_avg, exp_avg_sq (step counters live on the host)
    assert fp["activations_peak"] == P                     # _foreach_sqrt(v), then divided in place
    assert fp["peak_allocated"] == P + P + 2 * P + P
    # large-pool requests under 10 MiB take 20 MiB segments: 4 tensors in the first, the
    # gradient and Adam's temporaries in the next ones
    assert fp["reserved"] % (2 * MiB) == 0 and fp["reserved"] >= fp["peak_allocated"]
    assert w.peak_managed_bytes == fp["reserved"]
    assert cap.param_count == 1024 * 1024


def test_in_place_ops_are_recorded_as_writes_of_what_they_read():
    def make(batch, device):
        def step():
            x = torch.randn(batch, 256, device=device)
            x.add_(1.0)
            torch.relu_(x)
            return x.sum()
        return step

    log = capture(make, 64).log
    ops = {v.name: v for k, v in kept_step(log) if k == OP}
    for name in ("aten.add_.Tensor", "aten.relu_.default"):
        rec = ops[name]
        assert [s for s, *_ in rec.writes] == [s for s, *_ in rec.reads][:1], name
        assert rec.writes[0][2] - rec.writes[0][1] == 64 * 256 * 4
    # views move no data: no kernel for them
    assert not any(k == OP and v.name.startswith(("aten.view", "aten.t.", "aten.detach")) for k, v in kept_step(log))


def test_a_freed_activation_block_is_reused_best_fit():
    def make(batch, device):
        def step():
            a = torch.randn(batch, 1024, 1024, device=device)   # 4 MiB per batch row
            b = a * 2
            del a
            c = b + 1                                             # takes a's block back
            return c
        return step

    log = capture(make, 1).log
    step = kept_step(log)
    born = [sid for k, sid in step if k == ALLOC]
    _, _, where, _ = plan(log, 1)
    a, b, c = born[:3]
    assert where[(c, 0)] == where[(a, 0)] != where[(b, 0)]


def test_the_allocator_rounds_splits_and_merges_like_pytorch():
    al = CachingAllocator()
    assert round_size(1) == 512 and round_size(513) == 1024
    p1, new = al.malloc("a", 100)          # small pool: a 2 MiB segment
    assert new and al.segments[0].size == 2 * MiB and p1.offset == 0 and p1.size == 512
    p2, new = al.malloc("b", 3 * MiB)      # large, under 10 MiB: a 20 MiB segment
    assert new and al.segments[1].size == 20 * MiB
    p3, new = al.malloc("c", 3 * MiB)
    assert not new and p3.segment == p2.segment and p3.offset == 3 * MiB
    al.free("b")
    p4, new = al.malloc("d", 2 * MiB)      # best fit: the freed 3 MiB block (smaller than the tail)
    assert not new and p4.offset == 0 and p4.size == 3 * MiB   # 1 MiB remainder is not split off
    big, new = al.malloc("e", 30 * MiB + 1)
    assert new and al.segments[-1].size == 32 * MiB
    al.free("c"), al.free("d")
    assert al.segments[1].sizes == {0: 20 * MiB}   # merged back into one free block


def test_the_steady_step_has_the_same_addresses_every_iteration():
    w = capture_workload(linear_adam, 8, gpu_mem=1 << 30, iterations=3)[0]
    k = w.ops[w.ops["type"] == OpType.KERNEL]
    per = [k["exec_hash"][k["iteration"] == i] for i in range(3)]
    assert len(per[0]) > 0 and all(np.array_equal(per[0], p) for p in per[1:])
    mem = w.ops[w.ops["type"] == OpType.MEM]
    assert (mem["mem_op"] == AllocOp.BLOCK_INACTIVE).any() and (mem["mem_op"] == AllocOp.BLOCK_ACTIVE).any()
    # MEM ALLOC of segments only before the first iteration (the plan is steady)
    assert set(mem["iteration"][mem["mem_op"] == AllocOp.ALLOC].tolist()) == {0}


def test_the_workload_file_round_trips(tmp_path):
    w = capture_workload(linear_adam, 4, gpu_mem=64 * MiB)[0]
    path = str(tmp_path / "lin.umw")
    workfile.save(w, path)
    v = workfile.load(path)
    assert np.array_equal(v.ops, w.ops) and np.array_equal(v.allocations, w.allocations)
    for a in ("page", "length", "write"):
        assert np.array_equal(getattr(v.acc_runs, a), getattr(w.acc_runs, a))
    assert v.names == w.names and v.gpu_mem == w.gpu_mem and v.name == w.name
    assert v.meta["footprint"] == w.meta["footprint"] and v.params == w.params


def test_replay_runs_a_captured_file_and_refuses_a_corrupt_one(tmp_path, capsys):
    w = capture_workload(linear_adam, 4, gpu_mem=64 * MiB)[0]
    path = str(tmp_path / "lin.umw")
    workfile.save(w, path)
    assert main(["replay", path, "-m", "none,deepum", "--gpu-mem", "16MiB", "--json"]) == 0
    assert '"deepum"' in capsys.readouterr().out
    data = open(path, "rb").read()
    for name, blob in (("cut.umw", data[: len(data) // 2]), ("junk.umw", b"not a workload")):
        bad = tmp_path / name
        bad.write_bytes(blob)
        capsys.readouterr()
        assert main(["replay", str(bad), "-m", "none"]) == 2
        errtext = capsys.readouterr().err.strip()
        assert errtext.startswith("umctl: error:") and len(errtext.splitlines()) == 1, errtext
    with pytest.raises(UmctlError, match="does not apply"):
        workfile.resolve(path, {"iterations": "2"})


def test_routing_of_unknown_scores_is_uniform_and_data_dependent_sizes_follow():
    """A top-2 mixture of 8 experts, routed as Mixtral's eager path does (one_hot, where,
    index): every expert gets tokens * 2 / 8 rows."""
    T, D, E, K = 64, 48, 8, 2

    def make(batch, device):
        router = torch.nn.Linear(D, E).to(device)
        experts = torch.nn.ModuleList(torch.nn.Linear(D, D) for _ in range(E)).to(device)

        def step():
            x = torch.randn(batch, D, device=device)
            _, idx = torch.topk(router(x).softmax(-1), K, dim=-1)
            mask = torch.nn.functional.one_hot(idx, num_classes=E).permute(2, 1, 0)
            out = torch.zeros_like(x)
            for e in torch.unique(idx).tolist():
                pos, tok = torch.where(mask[e])
                out.index_add_(0, tok, experts[e](x[tok]))
            out.sum().backward()
        return (router, step)

    log = capture(make, T).log
    mm = [v for k, v in kept_step(log) if k == OP and v.name == "aten.addmm.default"]
    sizes = Counter(v.writes[0][2] - v.writes[0][1] for v in mm)
    assert sizes[T * K // E * D * 4] == E            # one expert GEMM per expert, each T*K/E rows
    assert sizes[T * E * 4] == 1                     # and the router
    assert any("uniform" in n for n in log.notes)


def test_attention_and_dropout_take_the_cuda_kernels():
    def make(batch, device):
        q = torch.randn(batch, 4, 128, 32, device=device, requires_grad=True)

        def step():
            y = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True, dropout_p=0.1)
            torch.nn.functional.dropout(y, 0.1, True).sum().backward()
        return step

    names = {v.name for k, v in kept_step(capture(make, 2).log) if k == OP}
    assert "aten._scaled_dot_product_efficient_attention.default" in names
    assert "aten.native_dropout.default" in names and "aten.bmm.default" not in names


def test_errors_are_one_line():
    with pytest.raises(UmctlError, match="no such file"):
        capture("/nonexistent/model.py:make_step", 1)
    with pytest.raises(UmctlError, match="expected FILE.py:FUNCTION"):
        capture("model.py", 1)

    def broken(batch, device):
        raise RuntimeError("boom\nsecond line")

    with pytest.raises(UmctlError, match="raised RuntimeError: boom second line"):
        capture(broken, 1)
    with pytest.raises(UmctlError, match="positive integer"):
        capture(linear_adam, 0)


def test_a_tiny_gpt2_from_transformers_captures():
    pytest.importorskip("transformers")
    w, cap = capture_workload("examples/torch/gpt2_step.py:make_step", 2, gpu_mem=1 << 30, iterations=1)
    assert cap.param_count == 1_478_144
    fp = w.meta["footprint"]
    assert fp["parameters"] >= cap.param_count * 4 and fp["gradients"] == fp["parameters"]
    assert fp["optimizer_state"] == 2 * fp["parameters"]
    names = set(w.names)
    assert "aten._scaled_dot_product_efficient_attention.default" in names
    assert "aten.native_dropout.default" in names and "aten.mm.default" in names
    assert w.meta["kernels_per_iteration"] > 100 and w.meta["flops_per_iteration"] > 0


@pytest.mark.parametrize("experts", ["grouped_mm", "eager"])
def test_a_tiny_mixtral_routes_uniformly(experts):
    """transformers' Mixtral, both expert implementations: the grouped GEMM (one kernel for all
    experts; its meta kernel takes bf16 only) and the eager loop over the experts hit."""
    pytest.importorskip("transformers")
    from transformers import MixtralConfig, MixtralForCausalLM

    def make(batch, device, seq=32):
        cfg = MixtralConfig(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                            num_experts_per_tok=2, max_position_embeddings=seq)
        cfg._experts_implementation = experts
        model = MixtralForCausalLM(cfg).to(device)
        opt = torch.optim.AdamW(model.parameters())

        def step():
            x = torch.randint(0, 256, (batch, seq), device=device)
            model(input_ids=x, labels=x).loss.backward()
            opt.step()
            opt.zero_grad()
        return model, step

    log = capture(make, 2).log
    assert any("uniform" in n for n in log.notes)
    ops = [v for k, v in kept_step(log) if k == OP]
    if experts == "grouped_mm":
        assert any(v.name == "aten._grouped_mm.default" and v.flops > 0 for v in ops)
    else:   # 64 tokens x top-2 over 4 experts: 32 rows per expert, each expert's GEMMs
        rows = Counter((v.writes[0][2] - v.writes[0][1]) // (2 * 96 * 4) for v in ops if v.name == "aten.mm.default")
        assert rows[32] >= 4 * 2


def two_layer_adam(batch: int, device):
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).to(device)
    opt = torch.optim.Adam(model.parameters())

    def step():
        model(torch.randn(batch, 1024, device=device)).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None] or
                                       list(model.parameters())[:1], 1.0)
    return model, step


def test_optimizers_and_clip_grad_norm_take_the_foreach_kernels_as_on_cuda():
    """On meta PyTorch would take the per-tensor loop (meta is no foreach device); CUDA runs the
    multi-tensor path, whose _foreach_sqrt holds sqrt(v) of every parameter at once."""
    cap = capture(two_layer_adam, 8)
    names = Counter(v.name for k, v in kept_step(cap.log) if k == OP)
    assert names["aten._foreach_sqrt.default"] == 1 and names["aten._foreach_addcdiv_.ScalarList"] == 1
    assert not names["aten.sqrt.default"] and not names["aten.addcdiv_.default"]   # not the per-tensor loop
    w = build_workload(cap.log, name="t", gpu_mem=1 << 30, cost=COST)
    fp = w.meta["footprint"]
    P = sum(round_size(p.numel() * 4) for p in torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).parameters())
    assert fp["parameters"] == P and fp["optimizer_state"] == 2 * P
    # Adam's peak: weights, gradients, exp_avg, exp_avg_sq and sqrt(v) of all parameters at once
    assert fp["peak_allocated"] >= 5 * P
    # the patch is undone afterwards
    from torch.optim.optimizer import _get_foreach_kernels_supported_devices as dev
    assert "meta" not in dev()


def test_autocast_is_modelled_and_reported():
    def make(batch, device, dev_type="cuda"):
        lin = torch.nn.Linear(64, 64).to(device)

        def step():
            with torch.autocast(dev_type, dtype=torch.bfloat16):
                y = lin(torch.randn(batch, 64, device=device))
            with torch.amp.autocast("cuda", enabled=False):   # a disabled one is nothing to report
                y = y.float()
            y.sum().backward()
        return lin, step

    for dev_type in ("cuda", "meta"):    # torch.autocast(device.type) on meta used to fail outright
        log = capture(lambda b, d: make(b, d, dev_type), 2).log
        notes = [n for n in log.notes if "autocast" in n]
        assert notes == ["autocast(bfloat16) modelled at the function level: CUDA autocast's lower-precision "
                         "and fp32 op lists, parameters cast once per region; other ops keep their inputs' "
                         "precision"], log.notes
        w = build_workload(log, name="t", gpu_mem=1 << 30, cost=COST)
        assert any("autocast(bfloat16)" in a for a in w.meta["assumptions"])
    assert torch.autocast.__module__.startswith("torch")   # restored
    assert not any("autocast" in n for n in capture(linear_adam, 1).log.notes)



def test_autocast_on_meta_casts_as_cuda_autocast_does():
    """Under the capture, torch.autocast casts what CUDA's autocast casts: GEMMs, convolutions
    (and attention) to the autocast dtype, its fp32 list (norms, softmax, losses) to float32,
    other ops keep their input's precision; a disabled region inside turns it off; a parameter
    is cast once per region; the casts are seen by autograd, so gradients of the float32 master
    weights are float32. The lower-precision and pass-through results agree with PyTorch's real
    autocast on the CPU (whose fp32 list differs from CUDA's, so that half is checked against
    CUDA's documented list)."""
    import torch.nn.functional as F

    from umctl.workload.capture.cudalike import AutocastRequests, cuda_kernel_choices

    def run(device):
        torch.manual_seed(0)
        lin = torch.nn.Linear(16, 16).to(device)
        x = torch.randn(4, 16, device=device)
        img, k = torch.randn(1, 3, 8, 8, device=device), torch.randn(4, 3, 3, 3, device=device)
        a, b = torch.randn(2, 4, 4, device=device), torch.randn(2, 4, 4, device=device)
        amp = torch.autocast("cpu" if device == "cpu" else "cuda", dtype=torch.bfloat16)
        with amp:
            y = lin(x)
            low = {"linear": y.dtype, "matmul": (x @ lin.weight).dtype, "conv2d": F.conv2d(img, k).dtype,
                   "bmm": torch.bmm(a, b).dtype, "gelu": F.gelu(y).dtype}
            fp32 = {"layer_norm": F.layer_norm(y, (16,)).dtype, "softmax": torch.softmax(y, -1).dtype,
                    "cross_entropy": F.cross_entropy(y, torch.zeros(4, dtype=torch.long, device=device)).dtype}
            with torch.autocast("cuda", enabled=False):
                off = F.linear(x, lin.weight).dtype
            if device == "meta":
                w1 = AutocastRequests.cast(lin.weight, torch.bfloat16)
                assert AutocastRequests.cast(lin.weight, torch.bfloat16) is w1     # cast once per region
        (F.layer_norm(y, (16,)).sum()).backward()
        return low, fp32, off, lin.weight.grad.dtype

    with cuda_kernel_choices():
        low, fp32, off, grad = run("meta")
    real_low, _, _, _ = run("cpu")
    assert low == real_low == {"linear": torch.bfloat16, "matmul": torch.bfloat16, "conv2d": torch.bfloat16,
                               "bmm": torch.bfloat16, "gelu": torch.bfloat16}
    assert set(fp32.values()) == {torch.float32}
    assert off == torch.float32 and grad == torch.float32
    assert torch.autocast.__module__.startswith("torch")      # restored


def test_an_amp_step_captures_smaller_activations_than_fp32():
    """A wide MLP at a large batch: under autocast(bfloat16) its activations are half the bytes,
    so the captured step's peak is lower than the same step in fp32."""
    def make(batch, device, amp):
        m = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).to(device)

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
                loss = m(torch.randn(batch, 1024, device=device)).float().pow(2).mean()
            loss.backward()
        return m, step

    peaks = {}
    for amp in (False, True):
        log = capture(lambda b, d: make(b, d, amp), 8192).log
        peaks[amp] = build_workload(log, name="t", gpu_mem=8 << 30, cost=COST).peak_managed_bytes
    assert peaks[True] < 0.75 * peaks[False], peaks


ENTRY_DATACLASS = """from __future__ import annotations
from dataclasses import dataclass
import torch

@dataclass
class Cfg:
    width: int = 64

def make_step(batch, device):
    from neighbour import scale          # imported late: the file's folder must still be on sys.path
    w = torch.zeros(Cfg().width, device=device, requires_grad=True)
    def step():
        from neighbour import scale as s2
        (w * s2(batch)).sum().backward()
    return step

def exits(batch, device):
    import sys
    sys.exit(3)

def step_exits(batch, device):
    def step():
        raise SystemExit(2)
    return step

def nothing(batch, device):
    w = torch.randn(4, 4, device="cpu", requires_grad=True)
    def step():
        (w @ w).sum().backward()
    return step

def zero_sized(batch, device):
    w = torch.zeros(4, device=device, requires_grad=True)
    def step():
        keep = [torch.empty(0, device=device) for _ in range(batch)]
        (w * 2).sum().backward()
        return keep
    return step
"""


@pytest.fixture
def entry_file(tmp_path):
    d = tmp_path / "proj"
    d.mkdir()
    (d / "neighbour.py").write_text("def scale(b):\n    return float(b)\n")
    (d / "train.py").write_text(ENTRY_DATACLASS)
    return str(d / "train.py")


def test_the_entry_file_imports_like_a_script(entry_file):
    import os
    import sys

    folder = os.path.dirname(entry_file)
    cap = capture(f"{entry_file}:make_step", 2)   # a dataclass under string annotations, late neighbour imports
    assert any(k == OP for k, _ in kept_step(cap.log))
    assert folder not in sys.path


def test_exits_and_empty_steps_are_capture_errors(entry_file):
    with pytest.raises(UmctlError, match=r"make_step called sys.exit\(3\)"):
        capture(f"{entry_file}:exits", 1)
    with pytest.raises(UmctlError, match=r"step 1 at batch 1 called sys.exit\(2\)"):
        capture(f"{entry_file}:step_exits", 1)
    with pytest.raises(UmctlError, match="the step put nothing on the device"):
        capture(f"{entry_file}:nothing", 1)


def test_zero_byte_storages_take_no_block(entry_file):
    log = capture(f"{entry_file}:zero_sized", 16).log
    assert sum(1 for s in log.storages if s.nbytes == 0) >= 16
    alloc, planned, where, _ = plan(log, 2)
    empty = {s.sid for s in log.storages if s.nbytes == 0}
    assert not any(k[0] in empty for k in where)
    assert all(p.value.size > 0 for p in planned if p.kind == "active")
    w = build_workload(log, name="t", gpu_mem=1 << 30, cost=COST)
    # w, its gradient and the step's few small temporaries: not 16 more 512 B blocks
    assert w.meta["footprint"]["peak_allocated"] <= 6 * 512


def _crafted(tmp_path, w, name, change):
    import json as _json
    import zipfile

    src = str(tmp_path / "src.umw")
    workfile.save(w, src)
    d = dict(np.load(src))
    d = {k: v.copy() for k, v in d.items()}
    raw = change(d)
    path = str(tmp_path / name)
    with open(path, "wb") as f:
        np.savez(f, **d)
    if raw:
        with zipfile.ZipFile(path, "a") as z:
            for k, v in raw.items():
                z.writestr(k, v)
    del _json
    return path


def test_crafted_workload_files_are_refused_in_one_line(tmp_path, capsys):
    import json as _json

    w = capture_workload(linear_adam, 4, gpu_mem=64 * MiB)[0]

    def txt(o):
        return np.frombuffer(_json.dumps(o).encode(), dtype=np.uint8)

    def info(d, **kw):
        i = _json.loads(d["info"].tobytes())
        i.update(kw)
        d["info"] = txt(i)

    def set_col(col, value, where=None):
        def f(d):
            ops = d["ops"]
            idx = np.flatnonzero(where(ops)) [:1] if where else slice(None)
            ops[col][idx] = value
        return f

    cases = {
        "gpuneg": (set_col("gpu", -1), "names a GPU"),
        "type": (set_col("type", 99, lambda o: np.ones(len(o), bool)), "unknown type"),
        "allocid": (set_col("alloc_id", 99999, lambda o: o["alloc_id"] >= 0), "names no allocation"),
        "memop": (set_col("mem_op", 77, lambda o: o["type"] == OpType.MEM), "unknown operation"),
        "page": (lambda d: d["run_page"].__setitem__(0, 5), "outside every allocation"),
        "rawnames": (lambda d: (d.pop("names"), {"names.npy": b"hello world"})[1], "corrupt"),
        "accwin": (lambda d: d.__setitem__("acc_win", np.array(["x"] * int(d["run_length"].sum()))), "acc_win"),
        "gpubool": (lambda d: info(d, gpu_mem=[True]), "GPU count or sizes"),
        "meta": (lambda d: info(d, meta=[1, 2]), "not a mapping"),
        "ops0d": (lambda d: d.__setitem__("ops", d["ops"][0]), "not an array"),
        "verbool": (lambda d: d.__setitem__("format", txt({"format": "umctl-workload", "version": True})), "version"),
    }
    for name, (change, pattern) in cases.items():
        path = _crafted(tmp_path, w, f"{name}.umw", change)
        with pytest.raises(UmctlError, match=pattern):
            workfile.load(path)
        capsys.readouterr()
        assert main(["replay", path, "-m", "none"]) == 2, name
        errtext = capsys.readouterr().err.strip()
        assert errtext.startswith("umctl: error:") and len(errtext.splitlines()) == 1, (name, errtext)
    ok = _crafted(tmp_path, w, "ok.umw", lambda d: None)
    assert workfile.load(ok).ops.shape == w.ops.shape


def test_autocast_left_open_by_a_failing_step_does_not_outlive_the_capture():
    """A framework that enters autocast in one hook and leaves it in another, with the step
    raising in between: after the capture, ordinary ops run in their own precision again."""
    from umctl.workload.capture.cudalike import cuda_kernel_choices

    with pytest.raises(RuntimeError):
        with cuda_kernel_choices():
            torch.autocast("cuda", dtype=torch.float16).__enter__()
            raise RuntimeError("the step failed")
    a = torch.randn(4, 4)
    assert torch.mm(a, a).dtype == torch.float32
    with cuda_kernel_choices():
        x64 = torch.randn(4, 4, dtype=torch.float64, device="meta")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            assert torch.mm(x64, x64).dtype == torch.float64        # autocast leaves float64 alone
            q = torch.randn(2, 5, 16, device="meta")
            mha = torch.nn.MultiheadAttention(16, 2, batch_first=True).to("meta")
            assert mha(q, q, q)[0].dtype == torch.bfloat16          # its GEMMs run inside, in Python
            assert torch.einsum("ij,jk->ik", a.to("meta"), a.to("meta")).dtype == torch.bfloat16
