"""`umctl trace control`: each fault of a controlled run classified by what umctl had done to
its block before it (umctl/report/control.py), on a hand-built trace whose answer is known."""

from __future__ import annotations

import json

import numpy as np

from umctl.cli.main import main
from umctl.events.schema import EventBatch, Kind, Op, Status, commands, empty
from umctl.events.trace import TraceWriter
from umctl.report.control import analyze
from umctl.units import BLOCK_SHIFT, CPU

MS = 1_000_000


def _faults(items):
    """(t_ms, block, batch) -> FAULT records"""
    f = empty(Kind.FAULT, len(items))
    for i, (t, b, batch) in enumerate(items):
        f[i]["t_ns"], f[i]["addr"], f[i]["batch_id"] = t * MS, (b << BLOCK_SHIFT) + 4096 * i, batch
    return f


def _cmds(items):
    """(t_submit_ms, op, block, t_done_ms or None, priority) -> COMMAND and RESULT records"""
    cs, rs = [], []
    for i, (t, op, b, done, prio) in enumerate(items):
        c = commands(op, b << BLOCK_SHIFT, 2 << 20, dst=CPU if op == Op.PREEVICT else 0, t_ns=t * MS, priority=prio)
        c["cmd_id"] = i
        cs.append(c)
        if done is not None:
            r = empty(Kind.RESULT, 1)
            r["t_ns"], r["cmd_id"], r["status"], r["bytes"] = done * MS, i, Status.OK, 2 << 20
            rs.append(r)
    return np.concatenate(cs), (np.concatenate(rs) if rs else empty(Kind.RESULT))


CASE_FAULTS = [(10, 1, 1), (10, 1, 1),          # block 1: prefetch still in flight -> late (once per batch)
               (20, 2, 2),                       # block 2: prefetched, then evicted by the budget keeper
               (30, 3, 3),                       # block 3: evicted by the controller
               (40, 4, 4),                       # block 4: prefetched and done -> prefetched, resident
               (50, 5, 5),                       # block 5: no command -> never touched
               (80, 7, 6)]                       # block 7: re-evicted by the budget's sweep
CASE_CMDS = [(5, Op.PREFETCH, 1, 12, 1),
             (1, Op.PREFETCH, 2, 3, 1), (15, Op.PREEVICT, 2, 16, 0),
             (25, Op.PREEVICT, 3, 26, 1),
             (35, Op.PREFETCH, 4, 36, 1), (60, Op.PREEVICT, 4, 61, 0),   # evicted only after its fault
             (70, Op.PREFETCH, 6, 71, 1), (75, Op.PREEVICT, 7, 76, 2)]


def test_each_fault_is_classified_by_what_came_before():
    cmds, res = _cmds(CASE_CMDS)
    rep = analyze(_faults(CASE_FAULTS), cmds, res)
    assert rep.fault_blocks == 6
    assert rep.classes == {"late": 1, "prefetched, resident": 1, "evicted by the budget": 1,
                           "evicted by the controller": 1, "evicted by the sweep": 1, "never touched": 1}
    assert rep.late_submitted_before_ms == [5.0, 5.0] and rep.late_completed_after_ms == [2.0, 2.0]
    assert rep.commands == {"prefetch": 4, "preevict": 4}
    assert rep.evicted_refault_ms == [5.0, 5.0]       # 20-15, 30-25 and 80-75
    # predicted (a priority-1 prefetch since the block's previous fault): blocks 1, 2 and 4
    assert rep.predicted == 3
    later = analyze(_faults(CASE_FAULTS), cmds, res, since_ns=25 * MS)
    assert later.fault_blocks == 4 and later.classes["late"] == 0


def test_cli_reports_a_control_trace_and_refuses_one_without_commands(tmp_path, capsys):
    cmds, res = _cmds(CASE_CMDS)
    path = tmp_path / "c.parquet"
    with TraceWriter(path, {"gpu_mem": [64 << 20]}) as w:
        b = EventBatch()
        b.add(Kind.FAULT, _faults(CASE_FAULTS))
        b.add(Kind.COMMAND, cmds)
        b.add(Kind.RESULT, res)
        w.write(b)
    assert main(["trace", "control", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fault_blocks"] == 6 and out["classes"]["never touched"] == 1
    assert out["classes"]["evicted by the budget"] == 1
    assert main(["trace", "control", str(path)]) == 0
    text = capsys.readouterr().out
    assert "evicted by the controller" in text and "late prefetches: submitted p50 5.0 ms" in text
    plain = tmp_path / "p.parquet"
    with TraceWriter(plain, {"gpu_mem": [64 << 20]}) as w:
        b = EventBatch()
        b.add(Kind.FAULT, _faults(CASE_FAULTS))
        w.write(b)
    assert main(["trace", "control", str(plain)]) != 0
    err = capsys.readouterr().err
    assert "no COMMAND records" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
