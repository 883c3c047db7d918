"""benchmarks/papers/common.py: the error arithmetic that judges replay against the papers, the
JSON rows other tools read, and the figure."""

from __future__ import annotations

import importlib.util
import json
import sys
from argparse import Namespace
from pathlib import Path

import pytest

PAPERS = Path(__file__).resolve().parents[1] / "benchmarks" / "papers"


def _load(name: str):
    sys.path.insert(0, str(PAPERS))
    try:
        spec = importlib.util.spec_from_file_location(f"papers_{name}", PAPERS / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod   # dataclasses look their module up there
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(PAPERS))


common = _load("common")
Row = common.Row


def rows():
    return [Row("P", "T", "a", "speedup", 2.0, 1.5),                   # -25 %
            Row("P", "T", "b", "speedup", 1.0, 1.1),                   # +10 %
            Row("P", "T", "c", "speedup", 4.0, 6.0),                   # +50 %
            Row("P", "T", "d", "speedup", 3.0, 3.0, fitted=True),      # fitted: not judged
            Row("P", "T", "e", "speedup", 1.2, None, note="not modelled")]


def test_relative_error_is_against_the_paper():
    r = rows()
    assert r[0].error == pytest.approx(-0.25)
    assert r[1].error == pytest.approx(0.10)
    assert r[2].error == pytest.approx(0.50)
    assert r[4].error is None


def test_median_counts_only_predicted_rows():
    # |errors| of the predicted rows: 0.25, 0.10, 0.50 -> 0.25; the fitted row's 0 and the
    # unmodelled row stay out, else fitting would flatter the median
    assert common.median_abs_error(rows()) == pytest.approx(0.25)
    assert [r.row for r in common.predicted(rows())] == ["a", "b", "c"]
    assert common.median_abs_error([Row("P", "T", "x", "m", 1.0, None)]) is None


def test_summary_names_fitted_rows_and_the_goal():
    s = common.summary(rows())
    assert "3 predicted, 1 fitted (d), 1 not modelled" in s
    assert "25.0 % (meets the 25 % goal)" in s
    assert "misses" in common.summary([Row("P", "T", "x", "m", 1.0, 2.0)])


def test_json_rows_have_the_issue_keys(capsys):
    common.emit(rows(), Namespace(json=True, png=None), "t")
    out = json.loads(capsys.readouterr().out)
    assert len(out) == 5
    need = {"paper", "table", "row", "metric", "paper_value", "umctl_value", "error", "fitted"}
    assert all(need <= set(d) for d in out)
    assert out[0]["error"] == pytest.approx(-0.25) and out[3]["fitted"] is True
    assert out[4]["umctl_value"] is None and out[4]["error"] is None


def test_table_and_figure(tmp_path, capsys):
    common.print_table(rows(), "title")
    text = capsys.readouterr().out
    assert "-25.0 %" in text and "fitted" in text and "not modelled" in text
    png = tmp_path / "f.png"
    common.figure(rows(), str(png), "title")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_emit_draws_only_the_rows_the_script_selects(tmp_path, monkeypatch, capsys):
    drawn = []
    monkeypatch.setattr(common, "figure", lambda rs, path, title: drawn.extend(r.row for r in rs))
    common.emit(rows(), Namespace(json=True, png=str(tmp_path / "f.png")), "t", lambda r: r.row in ("a", "c"))
    assert drawn == ["a", "c"]
    assert len(json.loads(capsys.readouterr().out)) == 5   # the JSON keeps every row


def test_figure_without_values_is_a_one_line_error(tmp_path):
    with pytest.raises(SystemExit, match="no row has a umctl value"):
        common.figure([Row("P", "T", "x", "m", 1.0, None)], str(tmp_path / "f.png"), "t")


def test_geomean():
    assert common.geomean([1.0, 4.0]) == pytest.approx(2.0)


def test_summary_names_a_fitted_configuration_once():
    fitted = [Row("P", "T", "bert 29", m, 1.0, 1.0, fitted=True) for m in ("UM", "DeepUM", "speedup")]
    assert "3 fitted (bert 29)," in common.summary(fitted + rows()[:1])


def _put_from_another_process(path: str, key: str, value: int) -> None:
    common.ResultCache(path).put(key, value)


def test_result_cache_keeps_what_every_process_put(tmp_path):
    """Processes splitting one run share the file: each put re-reads under a lock, so no
    process's result is lost, and a key names everything the result depends on."""
    from concurrent.futures import ProcessPoolExecutor

    path = str(tmp_path / "cache.json")
    c = common.ResultCache(path)
    keys = [c.key("gpt2-xl", 3, "none", {"peak_tflops": 8.67}, i) for i in range(8)]
    assert len(set(keys)) == 8 and c.key("m", {"b": 1, "a": 2}) == c.key("m", {"a": 2, "b": 1})
    with ProcessPoolExecutor(4) as ex:
        list(ex.map(_put_from_another_process, [path] * 8, keys, range(8)))
    assert [c.get(k) for k in keys] == list(range(8))
    assert common.ResultCache(None).get(keys[0]) is None        # no file: nothing cached
    common.ResultCache(None).put(keys[0], 1)


def test_result_cache_that_is_not_json_is_a_one_line_error(tmp_path):
    bad = tmp_path / "cache.json"
    bad.write_text("{not json")
    with pytest.raises(SystemExit, match="not a readable JSON file"):
        common.ResultCache(str(bad)).get("k")
    bad.write_text("[1, 2]")
    with pytest.raises(SystemExit, match="not a cache this script wrote"):
        common.ResultCache(str(bad)).get("k")


def test_deepum_partial_prints_the_cached_rows_and_names_the_rest(tmp_path, monkeypatch, capsys):
    """--partial replays nothing: a cached row is printed, a missing one stays visible as not
    modelled; without --cache it is a one-line error."""
    deepum = _load("deepum")
    cache = str(tmp_path / "c.json")
    monkeypatch.setattr(deepum, "replay", lambda m, b, mode, iters, **kw: {
        "iter_s": 1.0 if mode == "deepum" else 2.0, "faults": 10.0 if mode == "deepum" else 1000.0,
        "late_faults": 5.0, "fault_causes": {}, "oversub": 1.5, "wall_s": 0.0})
    args = Namespace(fit=False, fit_compute=False, models="gpt2-l", rows="gpt2-l:3", iters=3, skip=1, jobs=1,
                     ablation=False, degree="", cache=cache, partial=False, calib_set=[])
    first = deepum.build(args)
    monkeypatch.setattr(deepum, "replay", lambda *a, **kw: pytest.fail("--partial must not replay"))
    again = deepum.build(Namespace(**{**vars(args), "rows": "", "partial": True}))
    speedups = {r.row: r.umctl_value for r in again if r.metric == "speedup UM/DeepUM"}
    assert speedups == {"gpt2-l batch 3": 2.0, "gpt2-l batch 5": None, "gpt2-l batch 7": None}
    assert [r.umctl_value for r in first] == [r.umctl_value for r in again if r.row == "gpt2-l batch 3"]
    with pytest.raises(SystemExit, match="--partial needs --cache"):
        deepum.build(Namespace(**{**vars(args), "cache": None, "partial": True}))
    # a what-if on the calibration is another replay (another cache key), and the rows say so
    what_if = Namespace(**{**vars(args), "partial": True, "calib_set": ["eviction_refresh=access"]})
    assert all(r.umctl_value is None for r in deepum.build(what_if) if r.metric == "speedup UM/DeepUM")


def test_deepum_calib_set_is_typed_and_bad_settings_are_one_line():
    deepum = _load("deepum")
    assert deepum.calib_settings(["eviction_refresh=access", "d2h_Bps=12.3e9"]) == {
        "eviction_refresh": "access", "d2h_Bps": 12.3e9}
    assert deepum.calib_settings([]) == {}
    with pytest.raises(SystemExit, match="no calibration constant 'd2h'"):
        deepum.calib_settings(["d2h=1"])
