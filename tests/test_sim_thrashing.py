"""The stock driver's thrashing heuristics (nvidia-uvm uvm_perf_thrashing.c) and its eviction
for a prefetch into a full GPU, each switchable off through the calibration."""

import pytest

from umctl.controller import make_controller
from umctl.sim.calibration import DEFAULT
from umctl.sim.engine import simulate
from umctl.workload.scenario import load_scenario
from umctl.workload.workload import Init, WorkloadBuilder
from umctl.units import MiB

OFF = DEFAULT.with_overrides(thrashing_threshold=0)


def ping_pong(rounds: int = 10, host_ns: int = 20_000, kernel_ns: int = 20_000):
    """The host writes a buffer, a kernel reads and writes it, the host waits, again: every
    page goes host -> GPU -> host, each migration `host_ns + kernel_ns` apart or so."""
    b = WorkloadBuilder("ping-pong", gpu_mem=64 * MiB)
    x = b.alloc("x", 256 * 1024, init=Init.HOST)    # 64 pages, one block
    for i in range(rounds):
        b.iteration = i
        b.host_write(x, host_ns)
        b.kernel("touch", reads=[x], writes=[x], compute_ns=kernel_ns)
        b.sync()
    return b.build()


def test_host_gpu_ping_pong_thrashes_and_throttles():
    w = ping_pong()
    on = simulate(w, make_controller("none"))
    off = simulate(w, make_controller("none"), calib=OFF)
    # every page of the buffer, again after each reset of its history (a migration more than a
    # lapse after the previous one, as a throttled wait makes): the driver counts detections
    assert on.thrashing_pages >= 64 and on.thrashing_pages % 64 == 0
    assert on.throttles > 0
    assert off.thrashing_pages == 0 and off.throttles == 0
    # a throttled processor waits out the nap (500 us): the loop takes longer
    assert on.time_ns >= off.time_ns + DEFAULT.thrashing_nap_ns
    assert on.faults == off.faults                  # throttling delays faults, it does not add any


def test_migrations_further_apart_than_the_lapse_do_not_thrash():
    w = ping_pong(host_ns=700_000, kernel_ns=700_000)   # > 500 us between a page's migrations
    r = simulate(w, make_controller("none"))
    assert r.thrashing_pages == 0 and r.throttles == 0


def test_one_gpu_evicting_its_own_data_never_thrashes():
    """Evictions are not thrashing events and every fault migration goes to the same GPU, so
    the oversubscribed training loops of the papers' tables never engage the heuristics."""
    w = load_scenario("gpt2-l", {"oversub": "3", "iterations": "2"})
    r = simulate(w, make_controller("none"))
    assert r.evictions > 0 and r.thrashing_pages == 0 and r.throttles == 0


def test_prefetch_into_a_full_gpu_evicts_unless_switched_off():
    # DeepUM's prefetching without its pre-eviction (the paper's prefetch-only ablation) makes room
    # only through the driver's evictions
    w = load_scenario("gpt2-l", {"oversub": "2", "iterations": "2"})
    on = simulate(w, make_controller("deepum-prefetch"))
    off = simulate(w, make_controller("deepum-prefetch"), calib=DEFAULT.with_overrides(prefetch_evicts=False))
    assert on.fault_causes["evicted_for_prefetch"] > 0
    assert off.fault_causes["evicted_for_prefetch"] == 0
    assert off.prefetch_pages < on.prefetch_pages   # prefetches into a full GPU were dropped


@pytest.mark.parametrize("field", ["thrashing_threshold", "prefetch_evicts"])
def test_switches_are_calibration_fields(field):
    assert field in DEFAULT.as_dict()


#: A nap shorter than the lapse. With the driver's defaults (nap = lapse) a throttled processor
#: migrates the page a full lapse or more after its previous migration, which resets the page's
#: history (uvm_perf_thrashing.c does the same), so a program that alternates host and GPU in
#: turn is throttled again and again and never reaches the pin threshold (see the first test).
SHORT_NAP = DEFAULT.with_overrides(thrashing_nap_ns=100_000)


def test_a_page_throttled_often_enough_is_pinned_on_the_host_and_read_remotely():
    w = ping_pong(rounds=40)
    pin = simulate(w, make_controller("none"), calib=SHORT_NAP)
    nopin = simulate(w, make_controller("none"), calib=SHORT_NAP.with_overrides(thrashing_pin_threshold=0))
    assert pin.pins == 64 and pin.remote_accesses > 0
    assert nopin.pins == 0 and nopin.remote_accesses == 0 and nopin.throttles > 0
    # pinned pages stop migrating: fewer faults and bytes, fewer throttles, less time
    assert pin.faults < nopin.faults and pin.bytes_h2d < nopin.bytes_h2d
    assert pin.throttles < nopin.throttles and pin.time_ns < nopin.time_ns


def test_a_pin_ends_after_its_time():
    """Past uvm_perf_thrashing_pin the remote mappings go: the page faults and migrates again."""
    w = ping_pong(rounds=40)
    long_pin = simulate(w, make_controller("none"), calib=SHORT_NAP)
    short_pin = simulate(w, make_controller("none"), calib=SHORT_NAP.with_overrides(thrashing_pin_ns=1_000_000))
    assert short_pin.pins > long_pin.pins
    assert short_pin.faults > long_pin.faults


def test_default_nap_resets_rather_than_pins_a_host_gpu_alternation():
    r = simulate(ping_pong(rounds=40), make_controller("none"))
    assert r.throttles > 0 and r.pins == 0
