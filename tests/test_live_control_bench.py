"""The live-control benchmark's arithmetic (benchmarks/gpu/live_control.py, stress_runtime.py) on
canned outputs, CPU only: parsing the programs' lines and umctl's summary (a 'budget NOT held'
verdict gives no speedup), the bound, the goals, the round-robin order, the time limit."""

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

GPU_BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, GPU_BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod   # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


lc = _load("live_control")
GiB = 1 << 30

PROGRAM_OUT = "\n".join([f"STEP {i} {ms}" for i, ms in enumerate([700.0, 40.0, 30.0, 31.0, 29.0])]
                        + ["FOOTPRINT 2000000000 reserved=2264924160", "TOUCHED 1900000000",
                           "DONE 0.830 08cb096fe48a1b95"])

# the summary `umctl run --kinds all --mode deepum --budget 3940MiB` printed on the H100 (2026-11-28)
SUMMARY_NOW = """umctl run: pid 790 (python3) observed 3.8 s, detached (target exited)
  GPU faults   1,034,808 in 8,107 batches (269,762/s)
  CPU faults   0
  H2D          3.65 GiB (demand 355.34 MiB, prefetch 3.30 GiB, user 12.00 MiB)
  D2H          9.84 GiB (user 9.84 GiB)
  thrashing    0
  control      mode deepum: 12,165 commands -> 405 ioctls (338 ok, 67 failed, 0 after exit, 918 superseded, 0 dropped); moved prefetch 8.23 GiB, preevict 9.84 GiB; controller 1463 ms
  budget       3.85 GiB: peak estimate 3.78 GiB (7.14 GiB within a control period), 5,098 blocks evicted on overflow to CPU
"""
NOT_HELD = SUMMARY_NOW + "  verdict      budget NOT held: true peak 5.20 GiB, over the budget 37.5 % of the time\n"
HELD = SUMMARY_NOW + "  verdict      budget held (true peak 3.80 GiB, over budget 0.0 % of the time)\n"
UNVERIFIED = SUMMARY_NOW + "  verdict      budget unverified: no residency counters\n"


def test_program_lines():
    o = lc.parse_program_output(PROGRAM_OUT)
    assert o.steps == [700.0, 40.0, 30.0, 31.0, 29.0]
    assert (o.footprint, o.reserved, o.touched) == (2000000000, 2264924160, 1900000000)
    assert (o.done_s, o.checksum) == (0.83, "08cb096fe48a1b95")
    assert lc.steady_ms(o.steps) == 30.0             # steps 2.. : 30, 31, 29
    assert lc.steady_ms([5.0, 6.0]) == 5.5            # too few: all of them
    assert lc.steady_ms([]) is None


def test_umctl_summary_today_has_no_verdict():
    s = lc.parse_umctl_summary(SUMMARY_NOW)
    assert s["gpu_faults"] == 1034808 and s["cpu_faults"] == 0
    assert s["h2d_bytes"] == int(3.65 * GiB) and s["d2h_bytes"] == int(9.84 * GiB)
    assert s["moved"] == {"prefetch": int(8.23 * GiB), "preevict": int(9.84 * GiB)}
    assert s["budget_held"] is None and s["verdict"] is None


@pytest.mark.parametrize("text,held,peak,over", [
    (NOT_HELD, False, 5.20, 0.375), (HELD, True, 3.80, 0.0), (UNVERIFIED, None, None, None)])
def test_umctl_budget_verdict(text, held, peak, over):
    s = lc.parse_umctl_summary(text)
    assert s["budget_held"] is held
    assert s["verdict"].startswith("verdict")
    assert s["true_peak_bytes"] == (None if peak is None else int(peak * GiB))
    assert s["over_share"] == over


def test_json_summary_wins_over_text():
    s = lc.parse_umctl_summary(HELD, {"budget": {"budget_held": False, "true_peak_bytes": 123, "over_share": 12.5}})
    assert s["budget_held"] is False and s["true_peak_bytes"] == 123 and s["over_share"] == 0.125
    s = lc.parse_umctl_summary(HELD, {"budget_held": None})
    assert s["budget_held"] is None


def test_bound():
    b = lc.bound_ms(30.0, touched=3 * 10**9, budget=10**9, h2d_bps=50e9, d2h_bps=20e9)
    assert b["forced_bytes"] == 2 * 10**9
    # the lower bound: 2 GB beyond the budget come in once (40 ms at 50 GB/s); nothing forced out
    assert b["h2d_ms"] == pytest.approx(40.0) and b["d2h_ms"] == 0.0
    assert b["bound_ms"] == pytest.approx(70.0)
    assert lc.bound_ms(30.0, 10**9, 2 * 10**9)["bound_ms"] == 30.0          # fits: compute only
    w = lc.bound_ms(30.0, 3 * 10**9, 10**9, 50e9, 20e9, with_d2h=True)     # migrate in and out
    assert w["d2h_ms"] == pytest.approx(100.0) and w["bound_ms"] == pytest.approx(170.0)


def test_rotation_is_round_robin():
    c = lc.CONDITIONS
    assert [lc.SHORT[x] for x in lc.rotation(c, 0)] == ["P", "N", "D", "DP"]
    assert [lc.SHORT[x] for x in lc.rotation(c, 1)] == ["N", "D", "DP", "P"]
    assert lc.rotation(c, 4) == c


def _run(prog, cond, ms, held=True, checksum="aa", rep=0, budget=GiB, touched=2 * GiB):
    r = lc.Run(prog, cond, rep, rc=0, step_ms=ms, checksum=checksum, budget=budget,
               footprint=2 * GiB if cond == "plain" else None, touched=touched if cond == "plain" else None)
    if cond != "plain":
        r.umctl = {"budget_held": held, "gpu_faults": 1000}
    return r


def test_speedup_only_where_the_budget_held():
    runs = [_run("transformer", "plain", 30.0), _run("transformer", "none", 600.0),
            _run("transformer", "deepum", 200.0, held=False), _run("transformer", "deepum-prefetch", 300.0)]
    s = lc.summarize(runs, lc.CONDITIONS, h2d_bps=50e9, d2h_bps=17e9)["transformer"]
    d, dp = s["conditions"]["deepum"], s["conditions"]["deepum-prefetch"]
    assert d["speedup"] is None and d["speedup_note"] == "n/a (budget not held)" and d["bound_share"] is None
    assert dp["speedup"] == pytest.approx(2.0)
    assert dp["bound_share"] == pytest.approx(s["bound"]["bound_ms"] / 300.0)
    report = lc.format_report({"transformer": s}, [], lc.CONDITIONS)
    deepum_line = next(ln for ln in report.splitlines() if ln.strip().startswith("deepum "))
    assert "n/a (budget not held)" in deepum_line and "x" not in deepum_line.split("NOT held")[1].split("n/a")[0]
    assert "2.00x" in report


def test_unverified_budget_gives_no_speedup_and_an_unverified_goal():
    runs = [_run("decoder", "plain", 5.0), _run("decoder", "none", 600.0, held=None),
            _run("decoder", "deepum", 200.0, held=None)]
    s = lc.summarize(runs, ["plain", "none", "deepum"])
    assert s["decoder"]["conditions"]["deepum"]["speedup_note"] == "n/a (budget unverified)"
    goals = {g["goal"]: g["met"] for g in lc.evaluate_goals(s, ["decoder"])}
    assert goals["every run held its budget"] is None
    assert goals["deepum >= 2x none on transformer, convnet, decoder"] is None


def test_goals():
    runs = []
    for p, none_ms, d_ms in [("transformer", 600, 250), ("convnet", 500, 240), ("decoder", 900, 300),
                             ("embedding", 400, 410), ("moe", 300, 330)]:
        runs += [_run(p, "plain", 30.0), _run(p, "none", float(none_ms)), _run(p, "deepum", float(d_ms))]
    runs.append(_run("moe", "deepum", 330.0, checksum="bb", rep=1))
    progs = ["transformer", "convnet", "decoder", "embedding", "moe"]
    s = lc.summarize(runs, ["plain", "none", "deepum"], h2d_bps=50e9, d2h_bps=17e9)
    g = {x["goal"]: x for x in lc.evaluate_goals(s, progs)}
    assert g["deepum >= 2x none on transformer, convnet, decoder"]["met"] is True
    assert g["no program slower under deepum than none by > 5 %"]["met"] is False    # moe +10 %
    assert g["every run held its budget"]["met"] is True
    # bound: 30 ms + 1 GiB in at 50 GB/s = 30 + 21.5 = 51.5 ms: share >= 50 % only where deepum
    # took <= 103 ms: none of these
    assert s["transformer"]["bound"]["bound_ms"] == pytest.approx(30 + 1e3 * GiB / 50e9)
    assert g["deepum >= 50 % of the bound on >= 3 programs"]["met"] is False
    assert g["results identical to the plain run"]["met"] is False and "moe/deepum" in \
        g["results identical to the plain run"]["evidence"]


def test_replay_compare():
    rows = [{"mode": "none", "time_s": 10.0}, {"mode": "deepum", "time_s": 4.0}]
    assert lc.replay_compare(2.2, rows)["within"] is True      # 2.5 vs 2.2: +14 %
    assert lc.replay_compare(1.5, rows)["within"] is False     # +67 %
    assert lc.replay_compare(None, rows)["within"] is None
    assert lc.replay_compare(2.0, [])["replay_speedup"] is None


def _args(**kw):
    a = lc.parse_args(["--reps", "3", "--max-seconds", "100", "--summary-option", ""])
    for k, v in kw.items():
        setattr(a, k, v)
    return a


def test_loop_measures_the_footprint_first_and_respects_the_time_limit():
    clock = [0.0]
    calls = []

    def runner(cmd, timeout):
        calls.append(cmd)
        clock[0] += 10.0
        if cmd[1].endswith("transformer.py"):
            return 0, PROGRAM_OUT, "", 10.0
        return 0, PROGRAM_OUT + "\n" + HELD, "", 10.0

    b = lc.Bench(_args(), runner=runner, clock=lambda: clock[0])
    b.run_all(["transformer"], lc.CONDITIONS)
    assert calls[0][1].endswith("transformer.py")                       # the plain run first
    assert b.budget["transformer"] == (int(0.5 * 2000000000) >> 20) << 20
    umctl_calls = [c for c in calls if c[0] == "umctl"]
    assert umctl_calls[0][:8] == ["umctl", "run", "-q", "--runtime", "--managed", "--mode", "none", "--budget"]
    assert [r.condition for r in b.runs][:5] == ["plain", "none", "deepum", "deepum-prefetch", "none"]
    assert len(b.runs) == 10 and b.skipped                              # 100 s: 10 runs of 10 s
    s = lc.summarize(b.runs, lc.CONDITIONS)
    assert s["transformer"]["conditions"]["deepum"]["speedup"] == pytest.approx(1.0)


def test_failed_run_is_reported_with_its_reason():
    crash = (134, "STEP 0 5.0\n", "*** buffer overflow detected ***: terminated", 1.0)
    b = lc.Bench(_args(), runner=lambda cmd, t: crash)
    b.budget["transformer"] = GiB
    r = b.one("transformer", "deepum", 0)
    assert r.rc == 134 and "buffer overflow" in r.error and "no DONE line" in r.error


def test_stress_crash_detection():
    st = _load("stress_runtime")
    assert st.crash_reason(0, "") is None
    assert st.crash_reason(0, "*** buffer overflow detected ***: terminated") == "buffer overflow"
    assert st.crash_reason(0, "==12==ERROR: AddressSanitizer: heap-buffer-overflow") == "AddressSanitizer"
    assert st.crash_reason(1, "") == "exit 1"
    assert st.crash_reason(None, "") == "timed out"


def test_parse_args_program_args_and_calibration():
    a = lc.parse_args(["--program-args", "embedding=--rows 3000000", "--program-args", "embedding=--dim 64",
                       "--calibration", str(Path(lc.ROOT) / "umctl" / "sim" / "calibrations" / "h100-r580.json")])
    assert a.program_args == {"embedding": ["--rows", "3000000", "--dim", "64"]}
    assert 40 < a.h2d_gbps < 60 and 10 < a.d2h_gbps < 25
    assert isinstance(a, argparse.Namespace)


def test_main_end_to_end_with_a_fake_runner(monkeypatch, tmp_path, capsys):
    def fake(cmd, timeout, env=None):
        if cmd[0] == "true" and cmd[1] == "replay":
            return 0, '[{"mode": "none", "time_s": 6.0}, {"mode": "deepum", "time_s": 3.0}]', "", 1.0
        if cmd[0] == "true":
            if "-o" in cmd:
                Path(cmd[cmd.index("-o") + 1]).write_bytes(b"trace")
            ms = {"none": 600.0, "deepum": 250.0, "deepum-prefetch": 400.0}[cmd[cmd.index("--mode") + 1]]
            out = PROGRAM_OUT.replace("STEP 3 31.0", f"STEP 3 {ms}").replace("STEP 2 30.0", f"STEP 2 {ms}") \
                .replace("STEP 4 29.0", f"STEP 4 {ms}")
            return 0, out + "\n" + HELD, "", 2.0
        return 0, PROGRAM_OUT, "", 1.0

    monkeypatch.setattr(lc, "run_cmd", fake)
    js = tmp_path / "live.json"
    assert lc.main(["--programs", "transformer,decoder", "--reps", "2", "--umctl", "true", "--summary-option", "",
                    "--replay", "--workdir", str(tmp_path), "--json", str(js)]) == 0
    out = capsys.readouterr().out
    assert "2.40x" in out and "Goals:" in out and "within 25 %: yes" in out
    import json
    d = json.loads(js.read_text())
    assert len(d["runs"]) == 16 and d["summary"]["decoder"]["conditions"]["deepum"]["speedup"] == pytest.approx(2.4)
    assert [r["within"] for r in d["replay"]] == [True, True]   # replay 2.0x against live 2.4x: -17 %


def test_merge_of_split_invocations(tmp_path, capsys):
    def dump(name, runs, programs):
        p = tmp_path / name
        p.write_text(__import__("json").dumps({"programs": programs, "conditions": ["plain", "none", "deepum"],
                                               "runs": [__import__("dataclasses").asdict(r) for r in runs]}))
        return str(p)
    a = dump("a.json", [_run("transformer", "plain", 30.0), _run("transformer", "none", 600.0),
                        _run("transformer", "deepum", 100.0)], ["transformer"])
    b = dump("b.json", [_run("moe", "plain", 30.0), _run("moe", "none", 600.0), _run("moe", "deepum", 100.0)],
             ["moe"])
    assert lc.main(["--merge", a, b]) == 0
    out = capsys.readouterr().out
    assert "transformer:" in out and "moe:" in out and "6.00x" in out
    # 2 of 5 programs reach the bound's 50 %: the other 3 were not run, so the goal is open
    assert "[UNVERIFIED] deepum >= 50 % of the bound on >= 3 programs: 2 programs" in out


def test_harvest_tenants_prints_no_speedup_over_a_baseline_whose_budget_was_not_held():
    """memHarvester's table (benchmarks/gpu/harvest_tenants.py): a speedup over host-only counts
    only where both budgets were verified held."""
    ht = _load("harvest_tenants")

    def rows(none_held, harvest_held):
        return [{"config": "plain", "steady_ms": 200.0},
                {"config": "none --budget", "steady_ms": 4000.0, "budget_held": none_held},
                {"config": "harvest --budget", "steady_ms": 800.0, "budget_held": harvest_held}]

    r = rows(True, True)
    ht.speedups_vs_host(r)
    assert [x["speedup_vs_host"] for x in r] == [20.0, 1.0, 5.0]
    for none_held, harvest_held in ((False, True), (True, False), (None, True)):
        r = rows(none_held, harvest_held)
        ht.speedups_vs_host(r)
        assert r[2]["speedup_vs_host"] != r[2]["speedup_vs_host"], (none_held, harvest_held)   # NaN
