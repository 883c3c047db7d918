"""What every actuator shares: the :class:`~umctl.live.interfaces.Actuator` bookkeeping of
command ids and RESULT records.

An actuator hands every outcome back to the control loop as a RESULT record in its own time
(commands run on worker threads or in the kernel), so the loop collects them with ``results()``
at its next step; ``pending()`` is what has been accepted and not answered yet. Subclasses say
how to count pending work and call :meth:`ActuatorBase._result_row` under their lock.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from ..events.schema import Kind, Status, empty


def result_records(rows: list[tuple]) -> np.ndarray:
    """RESULT records from (t_ns, cmd_id, status, bytes, latency_ns) tuples: how every
    actuator hands its outcomes back to the control loop."""
    out = empty(Kind.RESULT, len(rows))
    if rows:
        a = np.array(rows, dtype=np.int64)
        out["t_ns"], out["cmd_id"], out["status"], out["bytes"], out["latency_ns"] = a.T
    return out


class ActuatorBase:
    """Command ids, the RESULT queue and ``results()`` / ``pending()`` for a subclass whose
    workers and ``submit`` share ``lock``."""

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self._results: list[tuple] = []
        self._next_id = 0

    def _new_ids(self, n: int) -> np.ndarray:
        """The cmd_ids of the next ``n`` commands submitted (ids are never reused)."""
        ids = np.arange(self._next_id, self._next_id + n, dtype=np.int64)
        self._next_id += n
        return ids

    def _result_row(self, cmd_id: int, status: Status, nbytes: int, latency_ns: int) -> None:
        """Queue one outcome for the next ``results()`` (the caller holds the lock)."""
        self._results.append((time.clock_gettime_ns(time.CLOCK_MONOTONIC), cmd_id, int(status), nbytes, latency_ns))

    def _pending_locked(self) -> int:
        """Commands accepted and not answered yet (the caller holds the lock)."""
        raise NotImplementedError

    def results(self) -> np.ndarray:
        """RESULT records of everything finished since the last call."""
        with self._lock:
            rows, self._results = self._results, []
        return result_records(rows)

    def pending(self) -> int:
        with self._lock:
            return self._pending_locked()
