"""Property-based CLI test (issue 35 §3): hypothesis generates invalid values for every option
of ``replay``, ``sweep``, ``trace info/export/control`` and ``top --once``, one bad option per
command line on top of a good tiny one, and every run must end in one stderr line starting
``umctl: error:`` with a non-zero exit: never a traceback, a hang or a zero exit.

Calls run in-process (``umctl.cli.main.main``) under an alarm: a subprocess each would cost
~1 s of interpreter start-up. Values are generated to be invalid for the option they go to
(outside its declared range, of the wrong type, non-finite, a path that cannot be written),
so that any acceptance is a bug, not a lucky valid value. Also here: the declarative ranges
cover every numeric option (so a new option cannot skip validation), and every example file in
docs/reference/scenarios.md loads and replays.
"""

from __future__ import annotations

import math
import re
import tomllib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_cli_badinput import TINY, assert_one_line_error, run_cli, write_files

from umctl.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
#: per-call guard: validation answers in well under a second; a replay of TINY in < 1 s
CALL_S = 15.0
FAST = settings(deadline=None, max_examples=100, derandomize=False, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """A directory with bad files, a good trace of a plain replay and one of a controlled run."""
    d = tmp_path_factory.mktemp("props")
    write_files(d)
    assert main(["replay", "gpt2-l", *TINY, "-m", "none", "--record", str(d / "plain.parquet")]) == 0
    assert main(["replay", "gpt2-l", *TINY, "-m", "deepum", "--record", str(d / "ctl.parquet")]) == 0
    return d


# -- strategies of invalid values -------------------------------------------------------------
_WORDS = st.sampled_from(["", " ", "abc", "1,2", "0x10", "--", "1e", "one", "1..2", "[1]", "∞", "1 2"])
_NONFINITE = st.sampled_from(["nan", "NaN", "inf", "-inf", "Infinity", "1e400", "-1e400"])


def _num(x: float | int) -> str:
    return repr(x) if isinstance(x, float) else str(x)


def bad_float(lo: float | None, hi: float | None, lo_open: bool = False, hi_open: bool = False):
    """Text of numbers outside [lo, hi] (either end open), non-finite numbers and words."""
    parts = [_NONFINITE, _WORDS]
    if lo is not None:
        below = st.floats(max_value=lo, exclude_max=not lo_open, allow_nan=False, allow_infinity=False)
        parts.append(below.filter(lambda v: v < lo or (lo_open and v == lo)).map(_num))
    if hi is not None:
        above = st.floats(min_value=hi, exclude_min=not hi_open, allow_nan=False, allow_infinity=False)
        parts.append(above.filter(lambda v: v > hi or (hi_open and v == hi)).map(_num))
    return st.one_of(*parts)


def bad_int(lo: int | None, hi: int | None, exponent_ok: bool = False):
    """Text of integers outside [lo, hi], fractions and words (for an int option; with
    ``exponent_ok`` an integral float such as 3e4 is valid, as --calib-set takes it)."""
    parts = [_NONFINITE, _WORDS, st.sampled_from(["1.5", "-0.5"] + ([] if exponent_ok else ["2.0e0", "1e3"]))]
    if lo is not None:
        parts.append(st.integers(max_value=lo - 1).map(str))
    if hi is not None:
        parts.append(st.integers(min_value=hi + 1).map(str))
    return st.one_of(*parts)


def bad_size():
    """Sizes: negative, words, below 64 KiB, above 64 TiB."""
    return st.one_of(
        _WORDS, _NONFINITE,
        st.sampled_from(["-1", "-512MiB", "-1G", "1e3", "12 parsecs", "0", "65TiB", "1000000TiB", "1.5.2GiB"]),
        st.integers(min_value=0, max_value=65535).map(str),
        st.integers(min_value=(64 << 40) + 1).map(str),
        st.integers(min_value=65, max_value=10**9).map(lambda n: f"{n}TiB"),
    )


def bad_output_path(env: Path, suffix: str = ".png"):
    return st.sampled_from([str(env), "/proc/x" + suffix, "/sys/x" + suffix, "/dev/null", "/dev/full",
                            str(env / "no" / "dir" / ("x" + suffix)), str(env / "x.txt"), str(env / "noext"),
                            "/", "/proc", "", " "])


def bad_mode_option():
    """(mode, -O item) out of its declared range, of the wrong type, or unknown."""
    from umctl.controller.options import mode_options
    from umctl.controller.base import available_modes

    items = []
    for m in ("deepum", "oracle", "harvest"):
        for name, spec in mode_options(m).items():
            if spec.type is bool:
                items.append(st.sampled_from(["maybe", "2", "nan", ""]).map(lambda v, m=m, n=name: (m, f"{m}.{n}={v}")))
            elif spec.type in (int, float):
                r = spec.range
                s = (bad_int(int(r.lo), int(r.hi)) if spec.type is int else
                     bad_float(r.lo, r.hi, r.lo_open, r.hi_open))
                items.append(s.map(lambda v, m=m, n=name: (m, f"{m}.{n}={v}")))
    items.append(st.sampled_from(available_modes()).map(lambda m: (m, f"{m}.no_such_option=1")))
    items.append(st.sampled_from([("deepum", "deepum.degree"), ("deepum", "=8"), ("deepum", "oracle.lookahead=8")]))
    return st.one_of(*items)


def bad_calib_set():
    from umctl.sim.calibration import RANGES, Calibration

    fields = Calibration.__dataclass_fields__
    parts = [st.sampled_from(["bogus=1", "name=x", "d2h_Bps", "=1", "eviction_refresh=never",
                              "prefetch_evicts=maybe", "fault_granularity_pages=3"])]
    for key, r in RANGES.items():
        s = (bad_int(int(r.lo), int(r.hi), exponent_ok=True) if type(fields[key].default) is int else
             bad_float(r.lo, r.hi, r.lo_open, r.hi_open))
        parts.append(s.filter(lambda v: v.strip() != "").map(lambda v, k=key: f"{k}={v}"))
    return st.one_of(*parts)


def bad_scenario_param():
    """--param for gpt2-l (a dnn model): out of range, wrong type, unknown."""
    from umctl.workload.scenario import BOUNDS, find_scenario

    info = find_scenario("gpt2-l")
    parts = [st.sampled_from(["bogus=1", "batch", "=3", "arch=lstm", "optimizer=lamb", "dropout=maybe",
                              "scale=huge", "blocks=0,1", "blocks=a,b"])]
    for p in info.params:
        r = BOUNDS.get(p.name)
        if r is None or p.kind not in ("int", "float"):
            continue
        s = bad_int(int(r.lo), int(r.hi)) if p.kind == "int" else bad_float(r.lo, r.hi, r.lo_open, r.hi_open)
        parts.append(s.filter(lambda v: v.strip() != "").map(lambda v, n=p.name: f"{n}={v}"))
    return st.one_of(*parts)


def bad_modes():
    return st.one_of(st.sampled_from(["bogus", ",", "", "none,none", "deepum,deepum", "all,none", "NONE",
                                      "oracle, oracle", "none,,bogus"]),
                     st.text(alphabet="abcxyz-", min_size=1, max_size=6).filter(lambda s: s.strip("-,") == s and
                                                                               s not in ("all",)))


def bad_trace_file(env: Path):
    return st.sampled_from([str(env / "missing.parquet"), str(env), str(env / "garbage.parquet"),
                            str(env / "notes.txt"), str(env / "empty.toml"), "/proc/self/nope.parquet", ""])


# -- the property tests -----------------------------------------------------------------------
def _check(capsys, argv: list[str]) -> None:
    code, out, err = run_cli(capsys, argv, CALL_S)
    assert_one_line_error(code, out, err, argv)


REPLAY = ["replay", "gpt2-l", *TINY, "-m", "none"]


@settings(FAST, max_examples=250)
@given(data=st.data())
def test_replay_refuses_every_bad_option(capsys, env, data):
    opt = data.draw(st.sampled_from(["--oversub", "--gpu-mem", "--iters", "--seed", "--drain-us", "-O",
                                     "--calib-set", "--param", "--png", "--timeline", "--record", "-m",
                                     "--calibration", "TARGET"]), label="option")
    if opt == "--oversub":
        argv = [*REPLAY, opt, data.draw(bad_float(0, 64, lo_open=True))]
    elif opt == "--gpu-mem":
        argv = ["replay", "gpt2-l", "--iters", "1", "-m", "none", opt, data.draw(bad_size())]
    elif opt == "--iters":
        argv = ["replay", "gpt2-l", "--gpu-mem", "16MiB", "-m", "none", opt, data.draw(bad_int(1, 10_000))]
    elif opt == "--seed":
        argv = [*REPLAY, opt, data.draw(st.integers(max_value=-1).map(str) | st.integers(min_value=2**32).map(str)
                                        | _WORDS.filter(lambda w: w.strip() != ""))]
    elif opt == "--drain-us":
        argv = [*REPLAY, opt, data.draw(bad_float(0, 1e7, lo_open=True))]
    elif opt == "-O":
        mode, item = data.draw(bad_mode_option())
        argv = ["replay", "gpt2-l", *TINY, "-m", mode if mode != "none" else "deepum", "-O", item]
    elif opt == "--calib-set":
        argv = [*REPLAY, opt, data.draw(bad_calib_set())]
    elif opt == "--param":
        argv = [*REPLAY, opt, data.draw(bad_scenario_param())]
    elif opt in ("--png", "--timeline"):
        argv = [*REPLAY, opt, data.draw(bad_output_path(env))]
    elif opt == "--record":
        argv = [*REPLAY, opt, data.draw(bad_output_path(env, ".parquet").filter(lambda p: not p.endswith(("noext", ".txt"))))]
    elif opt == "-m":
        argv = ["replay", "gpt2-l", *TINY, "-m", data.draw(bad_modes())]
    elif opt == "--calibration":
        argv = [*REPLAY, opt, data.draw(st.sampled_from([str(env / f) for f in
                                                          ("zero_d2h.json", "nan_rate.json", "str_rate.json",
                                                           "zero_batch.json", "frac7.json", "list_field.json",
                                                           "no_calibration.json", "empty.toml", "missing.json")]
                                                         + [str(env), "h100", "h100-r580+bogus=1", ""]))]
    else:  # TARGET: bad scenario files, names and traces
        argv = ["replay", data.draw(st.sampled_from(
            [str(env / f) for f in ("neg_mem.toml", "str_layers.toml", "float_layers.toml", "unknown_key.toml",
                                    "typo_key.toml", "huge_layers.toml", "inf_oversub.toml", "nan_fill.toml",
                                    "zero_iters.toml", "table_param.toml", "empty.toml", "no_generator.toml",
                                    "missing.toml", "garbage.parquet")]
            + ["gpt-9", "", str(env), f"{env}/neg_mem.toml:nope"])), *TINY, "-m", "none"]
    _check(capsys, argv)


@FAST
@given(data=st.data())
def test_sweep_refuses_every_bad_option(capsys, env, data):
    base = ["sweep", "gpt2-l", *TINY, "--what", "degree"]
    opt = data.draw(st.sampled_from(["--what", "-m", "--oversub", "--gpu-mem", "--iters", "--param", "--png"]))
    if opt == "--what":
        argv = ["sweep", "gpt2-l", *TINY, opt, data.draw(st.sampled_from(["", ",", "bogus", "table,bogus",
                                                                             "degree,degree", "Table"]))]
    elif opt == "-m":
        argv = [*base, opt, data.draw(st.sampled_from(["none", "oracle", "harvest", "bogus", "", "deepum,oracle"]))]
    elif opt == "--oversub":
        argv = [*base, opt, data.draw(bad_float(0, 64, lo_open=True))]
    elif opt == "--gpu-mem":
        argv = ["sweep", "gpt2-l", "--iters", "1", opt, data.draw(bad_size())]
    elif opt == "--iters":
        argv = ["sweep", "gpt2-l", "--gpu-mem", "16MiB", opt, data.draw(bad_int(1, 10_000))]
    elif opt == "--param":
        argv = [*base, opt, data.draw(bad_scenario_param())]
    else:
        argv = [*base, opt, data.draw(bad_output_path(env))]
    _check(capsys, argv)


@settings(FAST, max_examples=40)
@given(data=st.data())
def test_trace_commands_refuse_bad_files_and_options(capsys, env, data):
    cmd = data.draw(st.sampled_from(["info", "export", "control", "export-out", "export-max"]))
    plain = str(env / "plain.parquet")
    if cmd in ("info", "export", "control"):
        argv = ["trace", cmd, data.draw(bad_trace_file(env))]
        if cmd == "export":
            argv += ["--perfetto", str(env / "t.json")]
    elif cmd == "export-out":
        argv = ["trace", "export", plain, "--perfetto", data.draw(st.sampled_from(
            [str(env), "/proc/x.json", str(env / "no" / "dir" / "x.json")]))]
    else:
        argv = ["trace", "export", plain, "--perfetto", str(env / "t.json"), "--max-events",
                data.draw(st.integers(max_value=0).map(str) | _WORDS | _NONFINITE)]
    _check(capsys, argv)


@settings(FAST, max_examples=10)
@given(skip=bad_float(0, 1e6))
def test_trace_control_refuses_a_bad_skip(capsys, env, skip):
    _check(capsys, ["trace", "control", str(env / "ctl.deepum.parquet"), "--skip", skip])


@settings(FAST, max_examples=40)
@given(data=st.data())
def test_top_once_refuses_every_bad_option(capsys, data):
    opt = data.draw(st.sampled_from(["--interval", "--sort", "--sample", "--kinds", "--pid"]))
    if opt == "--interval":
        value = data.draw(bad_float(0, 86400, lo_open=True))
    elif opt == "--sort":
        value = data.draw(st.sampled_from(["", "bogus", "FAULTS", "h2d,d2h"]))
    elif opt == "--sample":
        value = data.draw(bad_float(0, 1, lo_open=True).filter(lambda v: not v.strip().endswith("%")))
    elif opt == "--kinds":
        value = data.draw(st.sampled_from(["bogus", "faults,bogus", "+", ",,", "-faults"]))
    else:
        value = data.draw(st.integers(max_value=0).map(str) | _WORDS | st.just(str(2**40)))
    # --interval is tiny where it is not the value under test: a valid --once would sample that long
    argv = ["top", "--once", opt, value] + ([] if opt == "--interval" else ["--interval", "0.01"])
    _check(capsys, argv)


# -- the declarations the edges check against ------------------------------------------------
def test_every_numeric_mode_option_has_a_range():
    from umctl.controller.base import available_modes
    from umctl.controller.options import mode_options

    for m in available_modes():
        for name, spec in mode_options(m).items():
            if spec.type in (int, float):
                assert spec.range is not None, f"{m}: option {name} has no range in controller/options.py BOUNDS"
                assert spec.default in spec.range, (m, name, spec.default, spec.range)


def test_every_numeric_calibration_constant_has_a_range():
    from umctl.sim.calibration import RANGES, Calibration, shipped_names

    for name, f in Calibration.__dataclass_fields__.items():
        if type(f.default) in (int, float):
            assert name in RANGES, f"calibration constant {name} has no range in RANGES"
    for n in shipped_names():   # every shipped file is valid under the ranges
        assert Calibration.load(n).name == n


def test_every_numeric_scenario_parameter_has_a_range():
    from umctl.workload.scenario import BOUNDS, check_value, list_scenarios

    for info in list_scenarios():
        for p in info.params:
            items = p.default if p.kind == "list" else [p.default]
            if any(isinstance(v, (int, float)) and not isinstance(v, bool) for v in items) or p.kind == "size":
                assert p.name in BOUNDS, f"{info.name}: parameter {p.name} has no range in scenario.py BOUNDS"
            check_value(p.name, p.kind, p.resolve(p.default))   # the defaults lie within their ranges


# -- docs/reference/scenarios.md ---------------------------------------------------------------
def _doc_examples() -> list[str]:
    text = (ROOT / "docs" / "reference" / "scenarios.md").read_text()
    blocks = re.findall(r"```toml\n(.*?)```", text, re.S)
    return [b for b in blocks if "[scenarios." in b and "[scenarios.NAME]" not in b]


def test_docs_have_an_example_per_family():
    from umctl.workload.families import GENERATORS

    gens = {tomllib.loads(b)["family"]["generator"] for b in _doc_examples()}
    assert gens == set(GENERATORS), gens


@pytest.mark.parametrize("block", _doc_examples(), ids=lambda b: tomllib.loads(b)["family"]["generator"])
def test_docs_scenario_examples_load_and_replay(capsys, tmp_path, block):
    f = tmp_path / "example.toml"
    f.write_text(block)
    for name in tomllib.loads(block)["scenarios"]:
        code, out, err = run_cli(capsys, ["replay", f"{f}:{name}", "-m", "none", "--json"], 60)
        assert code == 0, (name, err)
        assert '"mode": "none"' in out
