"""Calibration files: loading, errors, and the fit of the fault path to a measured pass."""

import json

import pytest

from simkit import sweep
from umctl import UmctlError
from umctl.controller import make_controller
from umctl.sim.calibration import DEFAULT, Calibration
from umctl.sim.fit import fit_fault_path
from umctl.sim.engine import simulate
from umctl.units import GiB


def test_fit_reproduces_the_measured_cold_pass():
    for ms in (120, 200):
        cal = fit_fault_path(ms * 1e6)
        r = simulate(sweep(GiB), make_controller("none"), calib=cal)
        assert r.time_ns == pytest.approx(ms * 1e6, rel=0.02)
    assert fit_fault_path(200e6).batch_ns > DEFAULT.batch_ns > fit_fault_path(120e6).batch_ns


def test_load_round_trip_and_errors(tmp_path):
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"calibration": {**DEFAULT.as_dict(), "name": "test", "d2h_Bps": 20e9},
                             "measured": {"fault_ro_ms": [1.0]}}))
    cal = Calibration.load(str(p))
    assert cal.name == "test" and cal.d2h_Bps == 20e9 and cal.batch_ns == DEFAULT.batch_ns
    p.write_text(json.dumps({"calibration": {"warp_speed": 9}}))
    with pytest.raises(UmctlError, match="not a umctl calibration file"):
        Calibration.load(str(p))
    p.write_text("{")
    with pytest.raises(UmctlError, match="not a umctl calibration file"):
        Calibration.load(str(p))
    with pytest.raises(UmctlError, match="cannot read"):
        Calibration.load(str(tmp_path / "missing.json"))


def test_replay_uses_a_calibration_file(tmp_path, capsys):
    from umctl.cli.main import main

    p = tmp_path / "slow.json"
    p.write_text(json.dumps({"calibration": {"name": "slow-link", "fault_h2d_Bps": 2e9}}))
    args = ["replay", "gpt2-l", "-m", "none", "--gpu-mem", "64MiB", "--iters", "1", "--json"]
    assert main(args) == 0
    fast = json.loads(capsys.readouterr().out)[0]["time_s"]
    assert main(args + ["--calibration", str(p)]) == 0
    slow = json.loads(capsys.readouterr().out)[0]["time_s"]
    assert slow > fast


def test_the_measured_h200_calibration_ships_and_loads():
    """benchmarks/gpu/calibrate.py on an H200 (driver 580.159.04): link rates as measured."""
    cal = Calibration.load("h200-r580")
    assert 45e9 < cal.prefetch_h2d_Bps < 56e9 and 10e9 < cal.d2h_Bps < 20e9
    assert 0 < cal.batch_ns < 200_000


def test_a_recorded_trace_gets_the_calibration_of_its_gpu():
    from umctl.sim.calibration import shipped_for

    drv = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build"
    assert shipped_for({"gpu": [{"name": "NVIDIA H100 80GB HBM3"}], "driver": drv}) == "h100-r580"
    assert shipped_for({"gpu": [{"name": "NVIDIA H200"}], "driver": drv}) == "h200-r580"
    assert shipped_for({"gpu": [{"name": "NVIDIA A100-SXM4-80GB"}], "driver": drv}) is None
    assert shipped_for({"gpu": [{"name": "NVIDIA H100"}], "driver": drv.replace("580.", "550.")}) is None
    assert shipped_for({}) is None and shipped_for({"gpu": "none", "driver": drv}) is None
    assert Calibration.load("h100-r580").block_ns > 0   # measured by the scattered-access probe
