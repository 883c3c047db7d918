"""Unscaled scenarios and the seeds' testbed calibration (issue 23): the model at its real size on
the paper's GPU, and a calibration whose every constant says where it comes from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from umctl import UmctlError
from umctl.sim.calibration import Calibration
from umctl.workload.families import dnn
from umctl.workload.families.common import Params
from umctl.workload.scenario import find_scenario, load_scenario, resolve_params
from umctl.units import GiB, MiB

CALIBRATIONS = Path(__file__).resolve().parents[1] / "umctl" / "sim" / "calibrations"
TINY = {"layers": "2", "hidden": "64", "heads": "2", "seq_len": "32", "vocab": "1000", "batch": "2",
        "iterations": "1"}


def natural_footprint(name: str, overrides: dict) -> float:
    """The model's bytes as the generator plans them before any scaling (persistent + pool)."""
    p = Params(resolve_params(find_scenario(name), overrides))
    net = dnn.NETS[p["arch"]](p)
    steps = dnn.trace(net, p["optimizer"])
    owners = [i for i, op in enumerate(net.ops) if op.weight > 0]
    pers = [dnn.Ref(s, i) for i in owners for s in (dnn.Space.W, dnn.Space.G) + dnn.OPTIMIZERS[p["optimizer"]]]
    sizes = {r: dnn.natural_bytes(net, r) for r in dnn.lifetimes(steps)}
    _assign, blocks = dnn.plan_pool(steps, sizes)
    return sum(dnn.natural_bytes(net, r) for r in pers) + sum(blocks)


def test_full_scale_keeps_the_real_sizes_on_the_papers_gpu() -> None:
    w = load_scenario("gpt2-l", {**TINY, "scale": "full"})
    assert w.gpu_mem == [int(31.25 * GiB)]          # full_gpu_mem, not the 512 MiB default
    natural = natural_footprint("gpt2-l", TINY)
    # page rounding only: every tensor at least its natural size, at most one page more
    assert natural <= w.managed_bytes < natural * 1.05 + 64 * 4096
    assert w.meta["scale"] == 1.0
    assert w.meta["footprint_oversub"] == pytest.approx(w.managed_bytes / (31.25 * GiB))


def test_full_scale_gpu_mem_given_on_the_command_line_wins() -> None:
    w = load_scenario("gpt2-l", {**TINY, "scale": "full", "gpu_mem": "16GiB"})
    assert w.gpu_mem == [16 * GiB]


def test_full_scale_runs_the_kernels_at_the_papers_gpu_rates() -> None:
    """At scale = full every full_X parameter stands in for X (the V100's kernel rates as well as
    its memory); a rate given on the command line wins, and scaled scenarios keep their own."""
    full = load_scenario("gpt2-l", {**TINY, "scale": "full"}).params
    assert (full["peak_tflops"], full["hbm_gbps"]) == (full["full_peak_tflops"], full["full_hbm_gbps"]) == (8.67, 774.0)
    assert load_scenario("resnet152", {"scale": "full", "batch": "2", "iterations": "1"}).params["peak_tflops"] == 11.6
    given = load_scenario("gpt2-l", {**TINY, "scale": "full", "peak_tflops": "5"}).params
    assert (given["peak_tflops"], given["hbm_gbps"]) == (5.0, 774.0)
    fit = load_scenario("gpt2-l", TINY).params
    assert (fit["peak_tflops"], fit["hbm_gbps"]) == (12.0, 1500.0)


def _steady_iteration_s(name: str, overrides: dict) -> float:
    from umctl.controller import make_controller
    from umctl.sim.engine import simulate

    w = load_scenario(name, {"scale": "full", "iterations": "2", "gpu_mem": "200GiB", **overrides})
    r = simulate(w, make_controller("none"), calib=Calibration.load("v100-pcie3"))
    assert r.iteration_faults[-1] == 0          # everything resident: the kernels' time alone
    return (r.iteration_end_ns[-1] - r.iteration_end_ns[0]) / 1e9


def test_full_scale_gemm_rate_is_the_one_fitted_row() -> None:
    """dnn.toml's full_peak_tflops was fitted on DeepUM Figure 9(b)'s BERT-Base batch 29 (1.29 s
    per iteration under DeepUM); a change to the transformer model's kernels moves this row,
    and then the constant must be re-fitted (benchmarks/papers/deepum.py --fit-compute)."""
    assert _steady_iteration_s("bert-base", {"batch": "29"}) == pytest.approx(1.29, rel=0.01)


def test_full_scale_convolution_rate_is_the_public_resnet50_figure() -> None:
    """dnn.toml's ResNet full_peak_tflops: NVIDIA's ResNet-50 v1.5 FP32 training, 367 images/s
    on a V100 SXM2 (DeepLearningExamples, NGC 21.03), is umctl's ResNet-50 at 13.0 TFLOP/s, and
    11.6 is that times the V100 PCIe's peak over the SXM2's (14.0 / 15.7)."""
    s = _steady_iteration_s("resnet152", {"blocks": "3,4,6,3", "batch": "256", "peak_tflops": "13.0"})
    assert 256 / s == pytest.approx(367, rel=0.01)
    assert find_scenario("resnet152").defaults()["full_peak_tflops"] == pytest.approx(13.0 * 14.0 / 15.7, abs=0.05)


def test_fit_scale_is_the_default_and_shrinks_to_oversub_x_gpu_mem() -> None:
    w = load_scenario("gpt2-l", {**TINY, "gpu_mem": "64MiB", "oversub": "2"})
    assert w.meta["scale"] != 1.0        # the tiny model is blown up to the target, as any is fitted
    assert w.managed_bytes == pytest.approx(128 * MiB, rel=0.02)


def test_bad_scale_is_one_line() -> None:
    with pytest.raises(UmctlError, match="scale must be one of fit, full"):
        load_scenario("gpt2-l", {**TINY, "scale": "huge"})


def test_gpt2_keeps_gelu_new_intermediates_and_dropout_masks() -> None:
    """GPT-2's tanh GELU keeps three 4h-wide tensors more than BERT's fused GELU, and a dropout
    keeps a byte mask per element: Hugging Face's autograd, which sets the paper's footprints."""
    base = natural_footprint("gpt2-l", TINY)
    plain = natural_footprint("gpt2-l", {**TINY, "gelu": "gelu"})
    nodrop = natural_footprint("gpt2-l", {**TINY, "gelu": "gelu", "dropout": "false"})
    assert base > plain > nodrop


@pytest.mark.parametrize("name", ["v100-pcie3", "p3-v100-nvlink"])
def test_paper_testbed_calibrations_give_a_source_for_every_constant(name: str) -> None:
    path = CALIBRATIONS / f"{name}.json"
    if not path.exists():
        pytest.skip(f"{name} not shipped")
    doc = json.loads(path.read_text())
    fields = set(doc["calibration"])
    assert fields == set(Calibration.__dataclass_fields__), "a paper calibration sets every constant"
    sources = doc["sources"]
    assert fields <= set(sources), f"no source for {sorted(fields - set(sources))}"
    assert all(len(str(sources[f])) > 20 for f in fields)
    Calibration.load(name)   # loads by name


def test_resnet_runs_bn_and_relu_as_pytorch_does_and_keeps_only_what_autograd_keeps() -> None:
    """torchvision's bottleneck: conv, BN, ``relu_`` in place; the block ends with ``out +=
    identity`` and ``relu_``, both in place. So each op is a kernel of its own, but only conv
    and BN outputs are activations (relu_ and += write BN's tensor), and the projection
    shortcut's BN output dies at the add, whose backward needs no activation."""
    p = Params(resolve_params(find_scenario("resnet152"), {"batch": "2", "image": "64"}))
    net = dnn.resnet_net(p)
    steps = dnn.trace(net, p["optimizer"])
    fwd = [s.name for s in steps if s.type is dnn.OpType.KERNEL][: len([o for o in net.ops if o.kind is not dnn.OpKind.INPUT])]
    # stem conv-BN-ReLU-pool, then per block 3 x (conv, BN[, relu_]) + shortcut conv-BN + add_ + relu_
    assert fwd[:4] == ["conv7x7_stem", "batch_norm", "relu_", "max_pool"]
    assert fwd[4:16] == ["conv1x1_reduce", "batch_norm", "relu_", "conv3x3", "batch_norm", "relu_",
                         "conv1x1_expand", "batch_norm", "conv1x1_shortcut", "batch_norm", "add_", "relu_"]
    inplace = {i for i, op in enumerate(net.ops) if op.inplace}
    acts = {r.op for r in dnn.lifetimes(steps) if r.space is dnn.Space.A}
    assert inplace and not acts & inplace, "an in-place op allocates no tensor of its own"
    for i in inplace:   # it reads and writes the tensor of the op that allocated it
        k = next(s for s in steps if s.op == i and s.type is dnn.OpType.KERNEL)
        assert k.writes[0] in k.reads and k.writes[0].op not in inplace
    add = next(i for i, op in enumerate(net.ops) if op.name == "add_")
    shortcut_bn = net.ops[add].inputs[1]
    bwd = next(s for s in steps if s.name == "add__backward")
    assert not any(r.space is dnn.Space.A for r in bwd.reads)
    last = max(k for k, s in enumerate(steps) for r in s.reads + s.writes if r == dnn.Ref(dnn.Space.A, shortcut_bn))
    assert steps[last].name == "add_", "the shortcut's BN output is freed after the add"


def _measured_footprints() -> dict[str, dict]:
    """PyTorch's own peaks for DeepUM's models on an H100 (benchmarks/gpu/footprint_probe.py run,
    2026-11-25: torch 2.11, transformers 5.17 with eager attention, torchvision 0.26)."""
    rows = json.loads((Path(__file__).parent / "data" / "real" / "footprint-h100.json").read_text())
    return {r["row"]: r for r in rows}


@pytest.mark.parametrize("row", ["bert-base:29", "bert-base:31", "bert-large:14", "bert-large:18", "gpt2-l:3",
                                 "gpt2-xl:1", "gpt2-xl:2"])
def test_transformer_footprint_is_pytorchs_allocator_pool(row: str) -> None:
    """The full-scale model is the memory PyTorch really takes: the caching allocator's peak
    pool for Hugging Face's model at that batch, within 6 % (measured: -3 ... +5 %)."""
    real = _measured_footprints()[row]
    model, batch = row.split(":")
    w = load_scenario(model, {"scale": "full", "batch": batch, "iterations": "1"})
    assert w.meta["param_count"] == pytest.approx(real["params"], rel=0.01)
    assert w.managed_bytes == pytest.approx(real["max_reserved"], rel=0.06)


def test_resnet_footprint_grows_per_image_as_pytorchs_does() -> None:
    """ResNet-152's footprint per image matches PyTorch's pool between batch 64 and 256 within
    3 % (measured: 0.177 against 0.176 GiB); PyTorch's pool also holds about 4 GiB of cuDNN
    autotuning workspace that does not grow with the batch (2 % of batch 1280's footprint), which
    the model leaves out."""
    real = _measured_footprints()
    size = {b: load_scenario("resnet152", {"scale": "full", "batch": str(b), "iterations": "1"}).managed_bytes
            for b in (64, 256)}
    slope = (size[256] - size[64]) / 192
    real_slope = (real["resnet152:256"]["max_reserved"] - real["resnet152:64"]["max_reserved"]) / 192
    assert slope == pytest.approx(real_slope, rel=0.03)
    offset = real["resnet152:256"]["max_reserved"] - size[256]
    assert 0 < offset < 5 * GiB


def test_deepum_script_admits_every_figure9_row_at_ten_iterations(monkeypatch) -> None:
    """fidelity.md replays Figure 9(b)'s rows for 10 iterations; the size bound that stops a
    typo must not stop them (it did: ResNet-152 1536 and ResNet-200 1024 were refused)."""
    import umctl.workload.scenario as sc
    from umctl.workload.scenario import check_size, run_params
    from test_papers_common import _load

    monkeypatch.setattr(sc, "MAX_PAGE_PASSES", sc.MAX_PAGE_PASSES)   # the script raises it; restored after
    deepum = _load("deepum")
    for model, batch in deepum.FIG9B:
        info = find_scenario(model)
        check_size(info, run_params(info, deepum.scenario_overrides(batch, 10)))
