"""tools/deepum_offline.py: a recorded live run's events replayed through a fresh DeepUM
controller. On a loop whose kernels fault the same blocks every step, with every block evicted
again after use, the walk must come to predict most uses once its tables have learnt a step,
and the per-drain classes must account for every faulted block."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np

from umctl.events.schema import EventBatch, Kind, Op, commands, empty
from umctl.events.trace import TraceWriter, read_trace
from umctl.units import BLOCK_SHIFT, CPU

ROOT = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("deepum_offline", ROOT / "tools" / "deepum_offline.py")
tool = importlib.util.module_from_spec(SPEC)
sys.modules[SPEC.name] = tool
SPEC.loader.exec_module(tool)

MS = 1_000_000
BASE = 0x7F00_0000_0000 >> BLOCK_SHIFT


def loop_trace(path: Path, steps: int = 40) -> None:
    """Kernels A, B, C per 90 ms step; kernel k faults its 3 blocks 1 ms after it starts, and
    the budget keeper evicts them 8 ms later."""
    la, fa, cm = [], [], []
    batch = 0
    for s in range(steps):
        for k in range(3):
            t = (s * 90 + k * 30 + 1) * MS
            rec = empty(Kind.LAUNCH, 1)
            rec["t_ns"], rec["exec_hash"], rec["name_id"], rec["seq"] = t, 1000 + k, 0, len(la)
            la.append(rec)
            blocks = [BASE + 3 * k + i for i in range(3)]
            f = empty(Kind.FAULT, 3)
            f["t_ns"] = t + MS + np.arange(3) * 1000
            f["addr"] = np.array(blocks, np.uint64) << BLOCK_SHIFT
            f["batch_id"] = batch
            batch += 1
            fa.append(f)
            c = commands(Op.PREEVICT, np.array(blocks, np.uint64) << BLOCK_SHIFT, 2 << 20, dst=CPU,
                         priority=0, t_ns=t + 8 * MS)
            c["cmd_id"] = np.arange(len(cm) * 3, len(cm) * 3 + 3)
            cm.append(c)
    b = EventBatch(names=["k"])
    b.add(Kind.LAUNCH, np.concatenate(la))
    b.add(Kind.FAULT, np.concatenate(fa))
    b.add(Kind.COMMAND, np.concatenate(cm))
    with TraceWriter(path, {"gpu_mem": [8 << 30]}, names=["k"]) as w:
        w.write(b)


def test_walk_learns_the_loop_and_every_use_is_classified(tmp_path):
    path = tmp_path / "live.parquet"
    loop_trace(path)
    with read_trace(path) as t:
        r = tool.replay(t, {"degree": 2}, budget_bytes=64 << 20, skip_s=0.9)
    assert r["uses"] > 0 and r["exec_ids"] == 3
    assert r["next_kernel_prediction_accuracy"] > 0.9
    assert r["classes_pct"]["predicted"] > 50   # the next kernel's blocks are walked before it starts
    assert abs(sum(r["classes_pct"].values()) - 100) < 0.5    # each use falls in exactly one class
