"""Time-sampled event collection (sampling.py): the duty cycle, the measured fraction, the
source toggling the driver's event queue, totals from counters in the view, and the CLI rules
(a trace or a controller never samples)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from umctl.events.schema import EventBatch, Kind, empty
from umctl.driver import abi
from umctl.sources.uvmtools import LiveError, UvmToolsSource
from umctl.sources.uvmtools.sampling import Sampler, parse_sample
from umctl.live.stats import LiveStats

from test_uvmtools_source import PID, fake_io, gpu_faults, run_cli, target  # noqa: F401


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_duty_cycle_toggles_at_window_edges_and_measures_on_time():
    import random

    clock, calls = Clock(), []
    s = Sampler(calls.append, 0.25, period_ms=100, clock=clock, rng=random.Random(1))
    on_ticks = 0
    for _ in range(40_000):       # 400 periods in 1 ms steps
        clock.t += 0.001
        s.tick()
        on_ticks += s.on
    assert calls[0] is False                                    # starts on, so the first edge turns it off
    assert all(a != b for a, b in zip(calls, calls[1:]))        # strictly alternating
    assert s.toggles == len(calls) >= 400                       # about one window per period (some merge)
    assert s.fraction() == pytest.approx(on_ticks / 40_000, abs=0.005)   # what was measured
    assert s.fraction() == pytest.approx(0.25, abs=0.03)        # and the duty, on average


def test_failed_toggle_is_retried_and_counted():
    clock, calls = Clock(), []

    def toggle(on: bool) -> None:
        calls.append(on)
        if len(calls) == 1:
            raise OSError(0, "NV_ERR_BUSY_RETRY")

    s = Sampler(toggle, 0.5, period_ms=10, clock=clock)
    clock.t += 0.006
    s.tick()                       # fails: still on
    assert s.on and s.errors == 1
    clock.t += 0.001
    s.tick()                       # retried
    assert not s.on and calls == [False, False]


def test_full_duty_never_toggles():
    calls = []
    s = Sampler(calls.append, 1.0)
    for _ in range(10):
        s.tick()
    assert calls == [] and s.fraction() == 1.0


@pytest.mark.parametrize("text, want", [("0.1", 0.1), ("10%", 0.1), ("1", 1.0), (None, 1.0)])
def test_parse_sample(text, want):
    assert parse_sample(text) == pytest.approx(want)


@pytest.mark.parametrize("bad", ["0", "1.5", "-3", "ten", "%"])
def test_parse_sample_rejects(bad):
    with pytest.raises(LiveError, match="--sample"):
        parse_sample(bad)


def test_source_turns_the_queue_off_between_windows(fake_io):
    drv = fake_io
    src = UvmToolsSource(PID, {Kind.FAULT}, flush_ms=0, drain_ms=1.0, sample=0.2, sample_period_ms=50).start()
    try:
        offs = 0
        seen = produced = 0
        t_end = time.monotonic() + 1.0
        while time.monotonic() < t_end:
            drv.pending.append(gpu_faults(10, batch=1))
            drv.deliver(flush=False)          # the "driver" produces 10 faults every ms
            produced += 10
            seen += len(src.drain()[Kind.FAULT])
            offs += drv.enabled_mask == 0
            time.sleep(0.001)
        time.sleep(0.01)
        seen += len(src.drain()[Kind.FAULT])
        total = produced
        assert drv.calls.count(abi.UVM_TOOLS_EVENT_QUEUE_DISABLE_EVENTS) >= 10
        # counters go off with the events: the driver's tools state is then off entirely
        assert drv.calls.count(abi.UVM_TOOLS_DISABLE_COUNTERS) == drv.calls.count(abi.UVM_TOOLS_EVENT_QUEUE_DISABLE_EVENTS)
        assert offs > 0
        frac = src.sample_fraction()
        assert 0.1 < frac < 0.35
        # what reached the ring is the sampled share of every fault the driver produced
        assert 0.05 * total < seen < 0.45 * total
        assert src.stats()["sampled_fraction"] == pytest.approx(frac, abs=0.05)
    finally:
        src.close()


def test_view_scales_window_counts_by_the_measured_fraction():
    s = LiveStats(pid=1)
    s.counters = {"bytes_htd": 1 << 20}
    s.sample = 0.1
    b = EventBatch()
    f = empty(Kind.FAULT, 1000)
    f["addr"] = 0x200000
    f["batch_id"] = np.arange(1000) // 100
    b.add(Kind.FAULT, f)
    s.update(b)
    assert s.faults == 10_000 and s.batches == 100     # 1000 faults in 10 batches seen in 10 %
    assert s.h2d_total() == 10 << 20                   # counters ran in the windows only
    assert s.top_blocks() == [(1, 1000)]               # rankings: the sample itself
    s.sample = 1.0
    s.update(EventBatch())
    assert s.faults == 1000 and s.batches == 10 and s.h2d_total() == 1 << 20


def test_cli_refuses_sampling_a_trace_or_a_controller(fake_io, capsys, tmp_path):
    rc, out, err = run_cli(capsys, "attach", "--pid", str(PID), "--no-launches", "--sample", "0.1",
                           "-o", str(tmp_path / "t.parquet"))
    assert rc != 0 and "--sample below 1 is for viewing only" in err and "Traceback" not in err
    assert len([ln for ln in err.splitlines() if ln.strip()]) == 1
    rc, out, err = run_cli(capsys, "attach", "--pid", str(PID), "--no-launches", "--sample", "2")
    assert rc != 0 and "--sample must be in (0, 1]" in err


def test_attach_sample_option_says_so(fake_io, capsys):
    drv = fake_io
    drv.pending.append(gpu_faults(300, batch=1))
    rc, out, err = run_cli(capsys, "attach", "--pid", str(PID), "--no-launches", "--duration", "0.4",
                           "--sample", "10%")
    assert rc == 0, err
    assert "sampling     events and counters collected" in out
    assert "GPU faults   ~" in out and "GPU faults   ~0 in" not in out   # the window's 300 faults, scaled up


def test_random_window_placement_is_not_fooled_by_a_workload_in_step_with_the_period():
    """A loop whose faults all fall in the same 10 ms of every 100 ms (its step time equals the
    sampling period) would be always caught or always missed by a fixed window; with the
    window placed at random in each period the estimate converges to the truth."""
    import random

    clock, state = Clock(), {"on": True}
    s = Sampler(lambda on: state.update(on=on), 0.1, period_ms=100, clock=clock, rng=random.Random(5))
    seen = truth = 0
    for ms in range(200_000):                     # 2000 periods in 1 ms ticks
        clock.t += 0.001
        s.tick()
        if ms % 100 < 10:                         # the workload's burst, locked to the period
            truth += 100
            seen += 100 if state["on"] else 0
    assert seen / s.fraction() == pytest.approx(truth, rel=0.1)


def test_views_sample_by_default_traces_and_controllers_never(fake_io, capsys, tmp_path):
    """A view (attach without -o/--mode, top) takes a 10 % sample unless told otherwise; a
    trace takes every event without being asked."""
    from umctl.live.attach import resolve_sample

    assert resolve_sample(None, recording=False, control=False) == pytest.approx(0.1)
    assert resolve_sample(None, recording=True, control=False) == 1.0
    assert resolve_sample(None, recording=False, control=True) == 1.0
    assert resolve_sample("1", recording=False, control=False) == 1.0
    rc, out, err = run_cli(capsys, "attach", "--pid", str(PID), "--no-launches", "--duration", "0.3")
    assert rc == 0, err
    assert "sampling     events and counters collected" in out
    before = fake_io.calls.count(abi.UVM_TOOLS_EVENT_QUEUE_DISABLE_EVENTS)
    assert before > 2                                        # windows closed, not just the detach
    rc, out, err = run_cli(capsys, "attach", "--pid", str(PID), "--no-launches", "--duration", "0.3",
                           "-o", str(tmp_path / "t.parquet"))
    assert rc == 0, err
    assert "sampling" not in out
    assert fake_io.calls.count(abi.UVM_TOOLS_EVENT_QUEUE_DISABLE_EVENTS) - before <= 1   # only the detach


def test_top_kernels_keep_unnamed_kernels_apart():
    """Attached to a running process, the kernels it loaded before umctl came have no names (the
    name probes fire on cuModuleGetFunction/cuLibraryGetKernel): each still gets its own row,
    by function handle, instead of all of them being lumped into one unknown kernel."""
    s = LiveStats(pid=1)
    b = EventBatch(names=["gemm"])
    la = empty(Kind.LAUNCH, 3)
    la["t_ns"] = [100, 200, 300]
    la["name_id"] = [-1, 0, -1]
    la["func"] = [0xAA00, 0xBB00, 0xCC00]
    b.add(Kind.LAUNCH, la)
    f = empty(Kind.FAULT, 7)
    f["t_ns"] = [50, 150, 150, 250, 350, 350, 350]
    f["batch_id"] = np.arange(7)
    b.add(Kind.FAULT, f)
    s.update(b)
    top = s.top_kernels(4)
    assert top[:2] == [("<kernel 0xcc00, loaded before attach>", 3), ("<kernel 0xaa00, loaded before attach>", 2)]
    assert sorted(top[2:]) == [("<before first launch>", 1), ("gemm", 1)]
