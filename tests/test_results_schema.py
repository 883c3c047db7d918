"""The typed results (umctl/results.py) and their versioned JSON: the committed schema files are
the generated ones, real outputs of ``umctl replay --json``, ``umctl trace info --json`` and a
live session validate against them (and against a closed copy: no undeclared key), documents
round-trip, a reader refuses another version, and the versioning rule is enforced."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import jsonschema
import pytest

from umctl.cli.main import main
from umctl.results import (RESULTS, ControlAnalysis, ControlStats, LiveTotals, ReplayReport, ReplayResult, Result,
                           SchemaError, SessionSummary, TraceInfo, closed_schema, incompatible_changes)

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data" / "reporters"
_spec = importlib.util.spec_from_file_location("gen_schemas", ROOT / "tools" / "gen_schemas.py")
gen_schemas = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen_schemas)


def validator(cls, closed: bool = True) -> jsonschema.Draft202012Validator:
    """A validator of ``cls``' committed schema file (closed: every object of a dataclass
    rejects keys it does not declare)."""
    schema = json.loads(gen_schemas.schema_path(cls).read_text())
    return jsonschema.Draft202012Validator(closed_schema(schema) if closed else schema)


# ------------------------------------------------------------------ the committed files
def test_committed_schemas_are_current():
    """docs/reference/schema/ holds what tools/gen_schemas.py generates (run it after changing a
    result: this fails until the file is rewritten, and names it)."""
    assert gen_schemas.problems() == []


def test_check_mode_fails_on_a_stale_or_missing_file(tmp_path, capsys):
    assert gen_schemas.main(["--dir", str(tmp_path), "--check"]) == 1            # nothing there
    assert "missing" in capsys.readouterr().err
    assert gen_schemas.main(["--dir", str(tmp_path)]) == 0
    assert gen_schemas.main(["--dir", str(tmp_path), "--check"]) == 0
    path = gen_schemas.schema_path(ReplayResult, tmp_path)
    doc = json.loads(path.read_text())
    doc["properties"]["mode"]["description"] = "changed"                        # compatible, but stale
    path.write_text(json.dumps(doc))
    assert gen_schemas.main(["--dir", str(tmp_path), "--check"]) == 1
    assert "stale" in capsys.readouterr().err


def test_every_schema_is_a_valid_draft_2020_12_schema_with_the_schema_key():
    for cls in RESULTS:
        s = cls.json_schema()
        jsonschema.Draft202012Validator.check_schema(s)
        assert s["properties"]["schema"] == {"const": cls.schema_id(),
                                             "description": "Which result this is, and its schema version."}
        assert "schema" in s["required"] and s["$id"] == f"urn:umctl:{cls.SCHEMA_NAME}:{cls.SCHEMA_VERSION}"


# ------------------------------------------------------------------ real outputs validate
def _cli_json(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


@pytest.mark.parametrize("args", [("gpt2-l", "-m", "none,deepum,oracle", "--gpu-mem", "128MiB", "--iters", "2"),
                                  ("hum-mixed", "-m", "none,hum", "--iters", "1"),
                                  ("mgpu-gemm", "-m", "none,snurhac", "--iters", "1"),
                                  ("huvm-pair", "-m", "none,harvest", "--iters", "1")])
def test_replay_json_validates_and_round_trips(capsys, args):
    docs = _cli_json(capsys, "replay", *args, "--json")
    v = validator(ReplayResult)
    for d in docs:
        v.validate(d)
        assert d["schema"] == "umctl.replay-result/1"
    back = ReplayReport.from_json(docs)
    assert back.to_json() == docs and back.results[0].mode == "none"


def test_trace_info_and_control_json_validate_and_round_trip(capsys, tmp_path):
    trace = tmp_path / "r.parquet"
    assert main(["replay", "gpt2-l", "-m", "deepum", "--gpu-mem", "128MiB", "--iters", "2", "--record", str(trace)]) == 0
    capsys.readouterr()
    deepum = tmp_path / "r.deepum.parquet"   # with the controller's COMMAND and RESULT records
    doc = _cli_json(capsys, "trace", "info", str(deepum), "--json")
    validator(TraceInfo).validate(doc)
    info = TraceInfo.from_json(doc)
    assert info.to_json() == doc and doc["schema"] == "umctl.trace-info/1"
    assert isinstance(info.time_span_ns, tuple) and info.evictions.count == doc["evictions"]["count"]
    ctl = _cli_json(capsys, "trace", "control", str(deepum), "--json")
    validator(ControlAnalysis).validate(ctl)
    assert ControlAnalysis.from_json(ctl).to_json() == ctl and ctl["fault_blocks"] > 0


def _session(budget: str | None):
    sys.path.insert(0, str(DATA))
    try:
        from session_fakes import budgeted_session   # tests/data/reporters: the scripted session
    finally:
        sys.path.remove(str(DATA))
    return budgeted_session(budget)


def test_a_live_session_summary_validates_with_and_without_budget():
    """A real Session (scripted source and actuator) ends with a SessionSummary whose JSON
    validates; under a budget the check's verdict is repeated at the top and LiveControl.stats()'
    keys are there as they are (source.control: budget, budget_held, budget_check, actuator...)."""
    s = _session("8MiB").summary()
    doc = s.to_json()
    validator(SessionSummary).validate(doc)
    assert doc["budget_held"] == doc["source"]["control"]["budget_held"]
    assert doc["budget_check"] == doc["source"]["control"]["budget_check"] and "held" in doc["budget_check"]
    assert {"mode", "commands", "actuator", "controller", "controller_ms", "resident_bytes", "budget",
            "budget_held", "budget_check", "budget_series"} <= set(doc["source"]["control"])
    assert isinstance(s.control, ControlStats) and s.control.budget_held == doc["budget_held"]
    assert list(doc)[:4] == ["schema", "summary", "source", "end"]
    observe = _session(None).summary().to_json()
    validator(SessionSummary).validate(observe)
    assert "budget_held" not in observe and "budget_check" not in observe and "control" not in observe["source"]
    assert SessionSummary.from_json(json.loads(json.dumps(doc, default=str))).to_json() == json.loads(
        json.dumps(doc, default=str))


def test_the_live_summary_keeps_the_keys_it_had():
    """--json of attach kept every key of its summary object, in order; new keys come after."""
    old = ["pid", "comm", "faults", "batches", "cpu_faults", "thrashing", "dropped", "launches", "h2d", "d2h",
           "counters", "top_kernels", "top_blocks"]
    doc = _session(None).summary().to_json()
    assert list(doc["summary"])[:len(old)] == old


def test_validation_can_fail():
    """The validators reject what the schema says is wrong: an undeclared key (closed copy
    only), a wrong type, a missing required field, another version."""
    doc = json.loads((DATA / "session_observe.json").read_text())
    validator(SessionSummary).validate(doc)
    with pytest.raises(jsonschema.ValidationError):
        validator(SessionSummary).validate({**doc, "surprise": 1})
    validator(SessionSummary, closed=False).validate({**doc, "surprise": 1})   # readers ignore new keys
    with pytest.raises(jsonschema.ValidationError):
        validator(SessionSummary).validate({**doc, "end": 3})
    with pytest.raises(jsonschema.ValidationError):
        validator(SessionSummary).validate({k: v for k, v in doc.items() if k != "summary"})
    with pytest.raises(jsonschema.ValidationError):
        validator(SessionSummary).validate({**doc, "schema": "umctl.session-summary/2"})
    with pytest.raises(jsonschema.ValidationError):   # a top-kernels entry is [name, count]
        validator(SessionSummary).validate({**doc, "summary": {**doc["summary"], "top_kernels": [["k", 1, 2]]}})


# ------------------------------------------------------------------ reading documents back
def test_from_json_checks_the_schema_and_takes_defaults():
    doc = json.loads((DATA / "session_observe.json").read_text())
    s = SessionSummary.from_json(doc)
    assert isinstance(s.summary, LiveTotals) and s.summary.top_kernels[0] == ("softmax_kernel", 40)
    with pytest.raises(SchemaError, match="this umctl reads 'umctl.session-summary/1'"):
        SessionSummary.from_json({**doc, "schema": "umctl.session-summary/2"})
    with pytest.raises(SchemaError):
        ReplayResult.from_json(doc)
    legacy = {k: v for k, v in doc.items() if k not in ("schema", "command")}   # before the key existed
    legacy["summary"] = {k: v for k, v in doc["summary"].items() if k not in ("sample", "have_migrations")}
    old = SessionSummary.from_json(legacy)
    assert old.command == "attach" and old.summary.sample == 1.0 and old.summary.have_migrations is False
    assert SessionSummary.from_json({**doc, "from_a_newer_umctl": 1}) == s   # unknown keys ignored
    with pytest.raises(SchemaError, match="summary"):
        SessionSummary.from_json({k: v for k, v in doc.items() if k != "summary"})


def test_replay_result_round_trips_as_objects():
    r = ReplayResult.from_json(json.loads((DATA / "replay_result.json").read_text()))
    assert ReplayResult.from_json(r.to_json()) == r
    assert dataclasses.replace(r, faults=r.faults + 1).to_json()["faults"] == r.faults + 1


# ------------------------------------------------------------------ the versioning rule
def test_compatible_and_incompatible_changes():
    def version(**fields) -> dict:
        """The schema of a result "x/1" with these fields: name=(type, default) or name=type."""
        spec = [(n, f[0], dataclasses.field(default=f[1])) if isinstance(f, tuple) else (n, f)
                for n, f in fields.items()]
        spec.sort(key=len)   # fields without a default first
        cls = dataclasses.make_dataclass("X", spec, bases=(Result,))
        cls.SCHEMA_NAME, cls.SCHEMA_VERSION = "x", 1
        return cls.json_schema()

    old = version(a=(int, 0), b=(str, ""))

    assert incompatible_changes(old, old) == []
    assert incompatible_changes(old, version(a=(int, 0), b=(str, ""), c=(float, 0.0))) == []   # optional: fine
    assert incompatible_changes(old, version(a=(int, 0))) == ["(root).b: removed"]
    assert incompatible_changes(old, version(a=(float, 0.0), b=(str, ""))) == ["(root).a: its type changed"]
    required = incompatible_changes(old, version(a=(int, 0), b=(str, ""), c=float))
    assert len(required) == 1 and "required fields changed (+['c']" in required[0]


def test_the_tool_refuses_an_incompatible_rewrite_of_a_version(tmp_path, monkeypatch):
    gen_schemas.write(tmp_path)
    path = gen_schemas.schema_path(TraceInfo, tmp_path)
    committed = json.loads(path.read_text())
    committed["properties"]["retired_field"] = {"type": "integer"}     # a field the current code removed
    path.write_text(json.dumps(committed))
    with pytest.raises(SystemExit, match=r"retired_field: removed -- bump TraceInfo.SCHEMA_VERSION"):
        gen_schemas.write(tmp_path)
    assert "incompatible" in " ".join(gen_schemas.problems(tmp_path))
    monkeypatch.setattr(TraceInfo, "SCHEMA_VERSION", 2)               # bumped: a new file, the old one kept
    gen_schemas.write(tmp_path)
    assert json.loads(path.read_text()) == committed
    assert json.loads((tmp_path / "trace-info.v2.json").read_text())["properties"]["schema"]["const"] == \
        "umctl.trace-info/2"
