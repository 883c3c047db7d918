"""nvidia-uvm grows every GPU fault to its 64 KiB big page before the density prefetcher
looks at the block (grow_fault_granularity, uvm_perf_prefetch.c), so a kernel that reads one
4 KiB page per 64 KiB still moves whole big pages; and the tree, counting the grown pages as
faulted, takes the whole 2 MiB block. Page by page (``fault_granularity_pages=1``) the same
kernel moves only what it reads."""

from __future__ import annotations

import numpy as np
import pytest

from umctl.controller import make_controller
from umctl.sim.calibration import DEFAULT
from umctl.sim.engine import simulate
from umctl.workload.workload import Init, WorkloadBuilder
from umctl.units import BLOCK_SIZE, MiB, PAGE_SIZE


def strided(stride_pages: int, nbytes: int = 8 * MiB):
    b = WorkloadBuilder("strided", gpu_mem=64 * MiB)
    x = b.alloc("x", nbytes, init=Init.HOST)
    b.kernel("gather", pages=[(x.pages()[::stride_pages], False)], compute_ns=100_000)
    return b.build()


def run(w, gran: int):
    return simulate(w, make_controller("none"), calib=DEFAULT.with_overrides(fault_granularity_pages=gran))


def test_one_page_per_big_page_moves_whole_big_pages_and_faults_less():
    w = strided(16)
    touched = w.n_accesses
    page, grown = run(w, 1), run(w, 16)
    assert page.bytes_h2d == touched * PAGE_SIZE and page.faults == touched   # below the 51 % tree
    assert grown.bytes_h2d == 8 * MiB                  # big pages, then the whole blocks
    assert grown.faults <= page.faults                 # each window still faults on what it reads
    assert DEFAULT.fault_granularity_pages == 16


def test_sequential_reads_are_unchanged():
    """A sweep already faults whole runs: growing each fault adds nothing (the calibration's
    cold passes were fitted on such sweeps)."""
    w = strided(1, 4 * BLOCK_SIZE)
    assert run(w, 1).fault_batches == run(w, 16).fault_batches
    assert run(w, 1).bytes_h2d == run(w, 16).bytes_h2d == 4 * BLOCK_SIZE


@pytest.mark.parametrize("bad, why", [(0, "from 1 to 64"), (3, "power of two"), (128, "from 1 to 64")])
def test_only_powers_of_two_up_to_64(bad, why):
    with pytest.raises(ValueError, match=why):
        DEFAULT.with_overrides(fault_granularity_pages=bad)
