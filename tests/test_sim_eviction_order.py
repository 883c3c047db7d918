"""Which chunk the driver evicts: the least recently *migrated* (nvidia-uvm's eviction list,
``Calibration.eviction_refresh = "migration"``) or, as a what-if, the least recently used
(``"access"``). On a loop that touches a little more than the GPU holds, forward then back as
a training step does, the two differ most: the driver's order moves the whole footprint every
iteration, a true LRU only about twice the excess."""

from __future__ import annotations

import pytest

from umctl import UmctlError
from umctl.controller import make_controller
from umctl.sim.calibration import DEFAULT, Calibration
from umctl.sim.engine import simulate
from umctl.workload.workload import Init, WorkloadBuilder
from umctl.units import BLOCK_SIZE, MiB

TENSORS = 20


def palindrome(iters: int, gpu_blocks: int = 19):
    """``TENSORS`` one-block tensors read 0..n-1 then n-1..0, ``iters`` times, on a GPU of
    ``gpu_blocks`` chunks (20 / 19 = 1.05x)."""
    b = WorkloadBuilder("palindrome", gpu_mem=gpu_blocks * BLOCK_SIZE)
    t = [b.alloc(f"t{i}", BLOCK_SIZE, init=Init.HOST) for i in range(TENSORS)]
    for it in range(iters):
        b.iteration = it
        for i in list(range(TENSORS)) + list(reversed(range(TENSORS))):
            b.kernel(f"k{i}", reads=[t[i]], compute_ns=50_000)
    return b.build()


def steady_blocks_in(refresh: str) -> float:
    """Blocks migrated in per iteration once the loop is warm (iterations 3-5)."""
    calib = DEFAULT.with_overrides(eviction_refresh=refresh)
    r3, r6 = (simulate(palindrome(n), make_controller("none"), calib=calib) for n in (3, 6))
    return (r6.bytes_h2d - r3.bytes_h2d) / 3 / BLOCK_SIZE


def test_driver_order_moves_the_whole_footprint_a_true_lru_only_the_excess():
    driver, lru = steady_blocks_in("migration"), steady_blocks_in("access")
    assert driver >= TENSORS * 0.9          # every tensor comes back every iteration
    assert lru <= 3                         # one block over: about two come back per iteration
    assert DEFAULT.eviction_refresh == "migration"


def test_calib_set_parses_types_and_refuses_bad_input():
    c = Calibration().with_settings(["d2h_Bps=12.3e9", "eviction_refresh=access", "batch_ns=25000",
                                     "prefetch_evicts=false"])
    assert (c.d2h_Bps, c.eviction_refresh, c.batch_ns, c.prefetch_evicts) == (12.3e9, "access", 25000, False)
    assert c.name.startswith(Calibration().name + "+") and "eviction_refresh=access" in c.name
    assert Calibration().with_settings(None) == Calibration()
    for bad, msg in (("d2h=1", "did you mean d2h_Bps"), ("batch_ns=1.5", "not a valid int"),
                     ("eviction_refresh=lru", "must be one of"), ("d2h_Bps", "expected KEY=VALUE"),
                     ("name=x", "no calibration constant"), ("fault_ns=-3", "fault_ns must be from 0 to"),
                     ("prefetch_evicts=maybe", "not a valid bool")):
        with pytest.raises(UmctlError, match=msg):
            Calibration().with_settings([bad])


def test_a_calibration_file_with_an_unknown_eviction_order_is_refused(tmp_path):
    p = tmp_path / "c.json"
    p.write_text('{"calibration": {"eviction_refresh": "clock"}}')
    with pytest.raises(UmctlError, match="eviction_refresh must be one of migration, access"):
        Calibration.load(str(p))
