"""Actuators execute controller commands: ``uvm`` on a live process's managed memory
through its va_space (``umctl.actuators.uvm``); the simulator is the replay actuator."""

import numpy as np

from ..events.schema import Kind, empty


def result_records(rows: list[tuple]) -> np.ndarray:
    """RESULT records from (t_ns, cmd_id, status, bytes, latency_ns) tuples: how every
    actuator hands its outcomes back to the control loop."""
    out = empty(Kind.RESULT, len(rows))
    if rows:
        a = np.array(rows, dtype=np.int64)
        out["t_ns"], out["cmd_id"], out["status"], out["bytes"], out["latency_ns"] = a.T
    return out
