"""The attach-overhead benchmark's window arithmetic (benchmarks/gpu/attach_overhead.py): steps
are placed in attach windows by their CLOCK_MONOTONIC stamps and each attached window is paired
with the unattached windows around it, so a known slowdown must come back out, drift or not."""

import importlib.util
import sys
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location(
    "attach_overhead", Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "attach_overhead.py")
bench = importlib.util.module_from_spec(SPEC)
sys.modules[SPEC.name] = bench   # dataclasses look their module up
SPEC.loader.exec_module(bench)


def synth(plan, step_ms=80.0, drift_per_window=0.0, window_s=3.0):
    """Windows of ``window_s`` back to back; each config in ``plan`` slows steps by its factor;
    the base step time drifts linearly. Returns (STEP lines, windows)."""
    lines, windows, t, i = [], [], 1_000_000_000, 0
    for k, (cfg, slow) in enumerate(plan):
        w0 = t
        base = step_ms * (1 + drift_per_window * k)
        while t + base * slow * 1e6 <= w0 + window_s * 1e9:
            t += int(base * slow * 1e6)
            lines.append(f"STEP {i} {base * slow:.2f} {t}")
            i += 1
        windows.append(bench.Window(cfg, w0, t))
        t += 50_000_000   # the gap an attach/detach takes: the straddling step is left out
        lines.append(f"STEP {i} 50.00 {t}")
        i += 1
    return lines, windows


def test_known_slowdown_comes_back_despite_drift():
    plan = [(bench.OFF, 1.0), ("counters only", 1.10), (bench.OFF, 1.0), ("dup fd only", 1.0), (bench.OFF, 1.0)]
    lines, windows = synth(plan, drift_per_window=0.01)
    per = bench.paired_overheads(bench.parse_steps(lines), windows, settle_s=0.2)
    # drift of 1 %/window is cancelled by pairing with both neighbours
    assert per["counters only"] == [pytest.approx(10.0, abs=0.3)]
    assert per["dup fd only"] == [pytest.approx(0.0, abs=0.3)]


def test_edges_short_windows_and_unstamped_lines():
    steps = bench.parse_steps(["READY 1 2 3", "STEP 0 80.0", "STEP 1 80.00 2000000000", "DONE 5"])
    assert len(steps) == 1 and steps[0].start_ns == 2_000_000_000 - 80_000_000
    lines, windows = synth([("all kinds", 1.2), (bench.OFF, 1.0)])
    per = bench.paired_overheads(bench.parse_steps(lines), windows, settle_s=0.2)
    assert per["all kinds"] == [pytest.approx(20.0, abs=0.3)]     # only a neighbour after it
    per = bench.paired_overheads(bench.parse_steps(lines), windows, settle_s=2.9)
    assert per == {}    # too few steps left after the settle time: no figure rather than a noisy one


def test_summary():
    s = bench.summarize([1.0, 2.0, 3.0])
    assert s["n"] == 3 and s["median"] == 2.0 and s["ci95"][0] < 2.0 < s["ci95"][1]
    assert bench.summarize([]) == {"n": 0}


def test_interleaved_windows_alternate_and_shuffle():
    """Every attached window sits between two unattached ones, each configuration once per round."""
    made = []

    def window(cfg):
        made.append(cfg)
        return bench.Window(cfg, len(made), len(made) + 1)

    ws = bench.interleaved_windows(["a", "b", "c"], rounds=3, seed=1, window=window, label=lambda w: "")
    cfgs = [w.config for w in ws]
    assert cfgs[::2] == [bench.OFF] * 10 and len(cfgs) == 19
    rounds = [sorted(cfgs[1 + 6 * r: 7 + 6 * r: 2]) for r in range(3)]
    assert rounds == [["a", "b", "c"]] * 3
    assert len({tuple(cfgs[1 + 6 * r: 7 + 6 * r: 2]) for r in range(3)}) > 1   # shuffled per round
