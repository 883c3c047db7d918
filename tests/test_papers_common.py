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
