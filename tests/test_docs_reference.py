"""The hand-written reference pages name everything the code defines: every calibration
constant (docs/reference/calibration.md), every event kind, field and code
(docs/reference/events.md). A new constant or field fails here until it is documented."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REF = ROOT / "docs" / "reference"


def test_every_calibration_constant_is_documented():
    from umctl.sim.calibration import Calibration

    text = (REF / "calibration.md").read_text()
    missing = [f.name for f in fields(Calibration) if f.name != "name" and f"| `{f.name}` |" not in text]
    assert missing == []


def test_every_event_kind_and_field_is_documented():
    from umctl.events import schema

    text = (REF / "events.md").read_text()
    rows = {line.split("|")[1].strip().strip("`"): line for line in text.splitlines()
            if line.startswith("| `")}
    for kind, dtype in schema.DTYPES.items():
        assert kind.value in rows, kind
        missing = [f for f in dtype.names if f"`{f}`" not in rows[kind.value]]
        assert missing == [], (kind.value, missing)


def test_every_code_is_documented():
    from umctl.events import schema

    text = (REF / "events.md").read_text()
    for enum in (schema.Access, schema.Cause, schema.AllocOp, schema.CopyKind, schema.Op, schema.Advice,
                 schema.Status):
        row = next((ln for ln in text.splitlines() if ln.startswith(f"| {enum.__name__} |")), "")
        assert row, enum.__name__
        missing = [m.name for m in enum if f"{m.name} {m.value}" not in row]
        assert missing == [], (enum.__name__, missing)
