"""Replays of every scenario under the modes, and the orderings they must keep."""

import json

import pytest

from umctl.sim.replay import parse_modes, result_rows, run_modes
from umctl.workload.scenario import list_scenarios, load_scenario

SMALL = {"gpu_mem": "128MiB", "iterations": "2"}


def _small(name: str) -> dict:
    params = {p.name for p in next(s for s in list_scenarios() if s.name == name).params}
    return {k: v for k, v in SMALL.items() if k in params}


@pytest.mark.parametrize("name", [s.name for s in list_scenarios()])
def test_oracle_never_slower_than_none(name):
    w = load_scenario(name, _small(name))
    none, oracle = run_modes(w, ["none", "oracle"])
    assert oracle.time_ns <= none.time_ns * 1.001, (name, none.time_s, oracle.time_s)
    # a write to a page the oracle discarded as dead faults too, but moves nothing (a zero-fill):
    # only the faults that bring data back must not outnumber the stock driver's
    assert oracle.faults - oracle.fault_causes["discarded"] <= none.faults
    assert none.kernels == oracle.kernels == len(w.kernels)


@pytest.mark.parametrize("name", ["gpt2-xl", "bert-large"])
def test_dnn_at_2x_oracle_far_faster(name):
    w = load_scenario(name, {"oversub": "2", "gpu_mem": "256MiB"})
    rows = result_rows(run_modes(w, ["none", "oracle"]))
    none, oracle = rows
    assert none["faults"] > 50_000 and none["evictions"] > 100
    assert oracle["speedup"] > 2.0
    assert oracle["faults"] < none["faults"] / 3
    assert oracle["prefetch_accuracy"] > 0.8


def test_more_oversubscription_costs_more():
    t = []
    for ratio in ("1.5", "2", "3"):
        (r,) = run_modes(load_scenario("gpt2-l", {"oversub": ratio, "gpu_mem": "128MiB", "iterations": "2"}), ["none"])
        t.append(r.time_ns / r.compute_ns)
    assert t[0] < t[1] < t[2]


def test_parse_modes_puts_none_first():
    assert parse_modes("oracle,none") == ["none", "oracle"]
    assert parse_modes("oracle") == ["none", "oracle"]
    assert "oracle" in parse_modes("all")


@pytest.mark.parametrize("target, modes", [("gpt2-l", ["none", "deepum", "oracle"]), ("hum-mixed", ["none", "hum"]),
                                           ("mgpu-gemm", ["none", "snurhac"]), ("huvm-pair", ["none", "harvest"])])
def test_every_replay_result_field_is_a_result_key(target, modes):
    """`umctl replay --json` prints ReplayResult's fields; each must be a key the results really
    have (a renamed one would print null for every mode): ReplayResult.from_row refuses a row
    without one, and the JSON keeps the fields' order after the schema key."""
    import dataclasses

    from umctl.results import ReplayResult
    from umctl.sim.replay import replay_results, result_rows, run_modes
    from umctl.workload.target import resolve_target

    w = resolve_target(target, {"iterations": "1"})
    rows = result_rows(run_modes(w, modes, seed=0))
    # the budget's fields are there only under --budget (tests/test_replay_budget.py)
    fields = [f.name for f in dataclasses.fields(ReplayResult) if not f.metadata.get("omit_none")]
    for r in rows:
        assert [k for k in fields if k not in r and k != "calibration"] == [], r["mode"]
    out = [r.to_json() for r in replay_results(rows, "c")]
    assert [list(o) for o in out] == [["schema", *fields]] * len(rows) and out[0]["calibration"] == "c"
    with pytest.raises(KeyError, match="lacks"):
        ReplayResult.from_row({k: v for k, v in rows[0].items() if k != "faults"}, "c")


def test_replay_json_gives_each_mode_its_share_of_the_bound(capsys):
    """Every single-GPU replay row carries the workload's lower bound (umctl/sim/bound.py) and
    the mode's time as a share of it, never below 100 %; several GPUs get none (the bound does
    not cover them)."""
    from umctl.cli.main import main

    assert main(["replay", "gpt2-l", "--iters", "2", "-m", "none,deepum,oracle", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    bound = {r["bound_s"] for r in rows}
    assert len(bound) == 1 and bound.pop() > 0
    for r in rows:
        assert r["pct_of_bound"] >= 100.0 and abs(r["pct_of_bound"] - 100 * r["time_s"] / r["bound_s"]) < 1e-6
    assert main(["replay", "mgpu-gemm", "--param", "gpus=2", "-m", "none", "--json"]) == 0
    assert all("bound_s" not in r for r in json.loads(capsys.readouterr().out))


def test_no_bound_leaves_the_bound_out(capsys):
    from umctl.cli.main import main

    assert main(["replay", "gpt2-l", "--iters", "1", "-m", "none", "--no-bound", "--json"]) == 0
    assert all("pct_of_bound" not in r for r in json.loads(capsys.readouterr().out))
