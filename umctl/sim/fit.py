"""Fitting the simulator's free parameter to a measurement. Apart from calibration.py because it
runs the simulator, which itself reads the calibration: the imports then run one way
(fit -> engine -> calibration)."""

from __future__ import annotations

from ..controller import make_controller
from ..workload.workload import Init, WorkloadBuilder
from ..units import GiB
from .calibration import DEFAULT, Calibration
from .engine import simulate


def fit_fault_path(measured_ns_per_GiB: float, base: Calibration | None = None, *, tol: float = 0.01) -> Calibration:
    """The calibration whose simulated cold 1 GiB pass (host-written managed memory read by one
    kernel) takes the measured time: the per-batch cost is the free parameter (the driver's
    fixed work per batch is what varies most between machines); everything else is measured
    directly. Bisection on batch_ns; the simulated pass is monotonic in it."""
    base = base or DEFAULT
    b = WorkloadBuilder("calibration-sweep", gpu_mem=4 * GiB)
    x = b.alloc("x", GiB, init=Init.HOST)
    b.kernel("read", reads=[x], compute_ns=0)
    w = b.build()

    def sim_ns(batch_ns: float) -> float:
        return simulate(w, make_controller("none"), calib=base.with_overrides(batch_ns=int(batch_ns))).time_ns

    lo, hi = 0.0, 1e6
    if sim_ns(lo) > measured_ns_per_GiB:
        return base.with_overrides(batch_ns=0)
    for _ in range(40):
        mid = (lo + hi) / 2
        if sim_ns(mid) < measured_ns_per_GiB:
            lo = mid
        else:
            hi = mid
        if hi - lo < tol * max(1.0, mid):
            break
    return base.with_overrides(batch_ns=int(round((lo + hi) / 2)))
