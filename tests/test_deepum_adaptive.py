"""DeepUM's whole-block completion skips novel launches (umctl/controller/deepum.py, *Whole
faulted blocks*): on a mixture of experts, a launch of a repeating kernel with arguments never
seen before is a routing choice, and completing its faulted blocks brings in the experts not
chosen. Dense models launch none and are unchanged."""

from __future__ import annotations

from umctl.sim.replay import run_modes
from umctl.workload.scenario import load_scenario


def _times(name: str, params: dict, modes: list[str], **opts) -> dict[str, float]:
    w = load_scenario(name, params)
    options = {m: dict(opts) for m in modes if m.startswith("deepum")}
    return {r.mode: r.time_ns for r in run_modes(w, modes, mode_options=options)}


def test_novel_launches_keep_deepum_near_none_on_a_mixture_of_experts():
    p = {"oversub": "1.5", "iterations": "2"}
    on = _times("mixtral-8x7b", p, ["none", "deepum"])
    off = _times("mixtral-8x7b", p, ["none", "deepum"], adaptive_whole=False)
    assert on["deepum"] <= 1.05 * on["none"]            # 1.01x
    assert off["deepum"] > 1.05 * off["none"]           # what the rule removes (1.08x without it)


def test_dense_models_are_unchanged_bit_for_bit():
    p = {"oversub": "2", "iterations": "2"}
    modes = ["none", "deepum", "deepum-prefetch"]
    assert _times("gpt2-l", p, modes) == _times("gpt2-l", p, modes, adaptive_whole=False)
