"""A scripted, budgeted session whose summary is the same on every run (no GPU)."""
import os
from umctl.events.schema import EventBatch, Kind, empty
from umctl.live.session import Session
from umctl.live.spec import ControlSpec
from umctl.units import CPU
from test_live_control import FakeActuator, faults
from test_budget_check import mig

MS = 1_000_000


class KernelSource:
    """Faults, migrations both ways and launches of two named kernels, 40 drains."""

    actuator = "none"

    def __init__(self, drains: int = 40):
        self.pid, self.gpus = os.getpid(), [{"gpu": 0, "memory_bytes": 1 << 30}]
        self.kinds = frozenset({Kind.FAULT, Kind.MIGRATION, Kind.LAUNCH})
        self._n, self._t = drains, 1_000_000

    def drain(self) -> EventBatch:
        self._t += 2 * MS
        b = EventBatch(now_ns=self._t)
        if self._n > 0:
            self._n -= 1
            la = empty(Kind.LAUNCH, 1)
            la["t_ns"], la["name_id"] = self._t - 2 * MS + 1, self._n % 2
            b.add(Kind.LAUNCH, la)
            b.names = ["gemm_kernel", "softmax_kernel"]
            b.add(Kind.FAULT, faults(self._t - MS, [self._n % 5, 1]))
            b.add(Kind.MIGRATION, mig(self._t - MS, range(64)))
            b.add(Kind.MIGRATION, mig(self._t - MS, range(3), src=0, dst=CPU))
        return b

    def counters(self):
        return {"bytes_htd": 123456789, "prefetch_bytes_htd": 4096}

    def sample_fraction(self):
        return 1.0

    def exited(self):
        return self._n <= 0

    def stats(self):
        return {"pid": self.pid, "kinds": "faults,migrations", "attach_ms": 12.34, "ring_entries": 262144,
                "flush_ms": 5.0, "sampled_fraction": 1.0, "dropped": 0,
                "lag_ring_ms": {"p50": 0.5, "p99": 2.25, "n": 10}, "lag_delivery_ms": {"p50": 0.75, "p99": 3.0},
                "lag_migration_ms": {"p50": 0.25, "p99": 1.5, "n": 4}, "ring_max_fill": 0.0123}

    def stop(self):
        pass

    def close(self):
        pass


class CountingActuator(FakeActuator):
    """FakeActuator with the figures the uvm actuator reports."""

    def stats(self):
        return {"counts": {"ioctls": 40, "ok": 38, "failed": 1, "target_gone": 1, "superseded": 0, "dropped": 0},
                "bytes": {"prefetch": 0, "preevict": 80 << 21}, "latency_ms": {"preevict": 33.5},
                "errors": {"EBUSY": 1}, "pending": 0, "advice_set": 0}


def budgeted_session(budget: str | None = "8MiB"):
    """Run it (under ``budget``, or observing only) and fix what varies per run: the pid, the
    elapsed time, the controller's time."""
    spec = ControlSpec("none", budget, None, None, 0, None) if budget else None
    r = Session(KernelSource(), command="attach", control=spec, actuator=CountingActuator() if spec else None,
                comm="fake").run()
    r.stats.pid = 4242
    r.source["elapsed_s"] = 2.0
    if spec:
        r.source["control"]["controller_ms"] = 1.0
    return r
