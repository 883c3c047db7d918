"""The simulator waits for write-backs, so the replay lower bound (umctl/sim/bound.py) can count
the write-back that capacity forces.

Data written on the GPU that no longer fits must cross back to the host before its memory is
reused. The simulator used to let a policy leave those copies unawaited, three ways: a
pre-eviction of part of a block queued its copy on the GPU->host engine while the chunk stayed
with the block, and the chunk could then be freed or reused at once; an ``UNSET_READ_MOSTLY``
advice freed a chunk of read-duplicates at once, though a write-back out of it was still queued;
a prefetch or a fault read a page back from the host before its write-back had landed. A
hand-written policy (``HideWriteBack`` below) used the first two to run 28 dirty blocks through a
4-chunk GPU in 1.8 ms where writing them back takes 4.5 ms.

Now, as the driver's block tracker orders copies, a chunk becomes free only when the copies out
of it end (``wb_busy`` in _simcore.c), and a read from the host waits for the page's write-back
(``host_ready``); and a partial ``UNSET_READ_MOSTLY`` collapses the whole block's duplicates
(a fourth way, found on the way). One test per loophole (each failed on the old core), and the
policy's replay, which now takes at least the write-back of the 28 blocks; tests/test_bound.py
checks the bound's write-back term against it.
"""

from __future__ import annotations

import numpy as np

from umctl.controller.base import Controller, make_controller
from umctl.events.schema import Advice, Kind, Op, commands
from umctl.sim.bound import replay_bound
from umctl.sim.calibration import DEFAULT
from umctl.sim.engine import simulate
from umctl.units import BLOCK_SIZE, CPU, PAGE_SIZE, PAGES_PER_BLOCK
from umctl.workload.workload import Init, WorkloadBuilder

N_BLOCKS, GPU_CHUNKS, COMPUTE_NS = 32, 4, 50_000


def wb_ns(pages: int) -> float:
    """Writing ``pages`` back on the GPU->host engine (one command's start-up included)."""
    return DEFAULT.transfer_latency_ns + pages * PAGE_SIZE / DEFAULT.d2h_Bps * 1e9


def dirty_stream():
    """Kernel i writes block i of a never-populated buffer: every block is dirty once written,
    no allocator event frees any, and 8x the GPU's memory is written in all."""
    b = WorkloadBuilder("dirty-stream", gpu_mem=GPU_CHUNKS * BLOCK_SIZE)
    x = b.alloc("x", N_BLOCKS * BLOCK_SIZE)
    for i in range(N_BLOCKS):
        b.kernel("write", writes=[x.slice(i * BLOCK_SIZE, BLOCK_SIZE)], compute_ns=COMPUTE_NS, args=(i,))
    return b.build(), x.addr


class HideWriteBack(Controller):
    """At kernel i's launch: free block i-1's chunk without waiting for its write-back, and
    zero-fill block i+1 into it (a prefetch of never-populated pages crosses no link)."""

    name = "hide-write-back"
    subscribes = frozenset({Kind.LAUNCH})
    launch_sync = True

    def __init__(self, base: int, **options):
        super().__init__(**options)
        self.base, self.k = base, -1

    def on_events(self, batch):
        out = []
        for _ in range(len(batch[Kind.LAUNCH])):
            self.k += 1
            if self.k >= 1:
                a = self.base + (self.k - 1) * BLOCK_SIZE
                out += [commands(Op.ADVISE, a, BLOCK_SIZE, advice=Advice.READ_MOSTLY),
                        # all but page 0 out: written back on the queue, the chunk stays
                        commands(Op.PREEVICT, a + PAGE_SIZE, BLOCK_SIZE - PAGE_SIZE, dst=CPU),
                        # page 1 back as a read-duplicate (clean), page 0 out
                        commands(Op.PREFETCH, a + PAGE_SIZE, PAGE_SIZE, dst=0),
                        commands(Op.PREEVICT, a, PAGE_SIZE, dst=CPU),
                        # the duplicate dropped: the block holds no page, the chunk is free now
                        commands(Op.ADVISE, a, BLOCK_SIZE, advice=Advice.UNSET_READ_MOSTLY)]
            if self.k + 1 < N_BLOCKS:
                out.append(commands(Op.PREFETCH, self.base + (self.k + 1) * BLOCK_SIZE, BLOCK_SIZE, dst=0))
        return np.concatenate(out) if out else None


class Script(Controller):
    """Issues ``plan[k]`` (a list of command batches) at kernel k's launch, before it runs."""

    name = "script"
    subscribes = frozenset({Kind.LAUNCH})
    launch_sync = True

    def __init__(self, plan: dict, **options):
        super().__init__(**options)
        self.plan, self.k = plan, -1

    def on_events(self, batch):
        out = []
        for _ in range(len(batch[Kind.LAUNCH])):
            self.k += 1
            out += self.plan.get(self.k, [])
        return np.concatenate(out) if out else None


def kernel_ns(r, k: int) -> float:
    return float(r.kernel_end_ns[k] - r.kernel_start_ns[k])


# ---------------------------------------------------------------------- one test per loophole
def test_a_partly_preevicted_chunk_is_not_reused_before_its_copy_ends():
    """Loophole 1. A one-chunk GPU; kernel 0 writes block A. At kernel 1's launch all of A but
    page 0 is pre-evicted (511 pages queued on the GPU->host engine; the chunk stays with A's
    page 0). Kernel 1 writes a page of block B: its fault evicts A on the fault path, and B may
    take the chunk only once the queued copy out of it has ended (the old core handed it over
    after writing page 0: kernel 1 took 0.06 ms, the copy takes 0.17 ms)."""
    b = WorkloadBuilder("partial", gpu_mem=BLOCK_SIZE)
    x = b.alloc("x", 2 * BLOCK_SIZE)
    A, B = x.split(2)
    b.kernel("write-a", writes=[A], compute_ns=10_000)
    b.kernel("write-b", writes=[B.slice(0, PAGE_SIZE)], compute_ns=10_000)
    w = b.build()
    plan = {1: [commands(Op.PREEVICT, x.addr + PAGE_SIZE, BLOCK_SIZE - PAGE_SIZE, dst=CPU)]}
    r = simulate(w, Script(plan))
    assert r.preevicted_bytes == (PAGES_PER_BLOCK - 1) * PAGE_SIZE
    assert kernel_ns(r, 1) >= wb_ns(PAGES_PER_BLOCK - 1)


def test_a_read_mostly_collapse_frees_its_chunk_only_after_the_copies_out_of_it():
    """Loophole 2. A one-chunk GPU; kernel 0 writes block A. At kernel 1's launch a
    read-mostly prefetch of block B (host data, duplicated) takes A's chunk, so A's 512 dirty
    pages are written back on the queue; an ``UNSET_READ_MOSTLY`` of B then drops B's
    duplicates and frees the chunk. Kernel 1 writes a page of block C, and C's chunk is that
    one: it is free only when A's write-back ends (the old core freed it at once: kernel 1 took
    0.04 ms, the write-back takes 0.17 ms)."""
    b = WorkloadBuilder("collapse", gpu_mem=BLOCK_SIZE)
    x = b.alloc("x", BLOCK_SIZE)
    y = b.alloc("y", BLOCK_SIZE, init=Init.HOST)
    z = b.alloc("z", BLOCK_SIZE)
    b.kernel("write-x", writes=[x], compute_ns=10_000)
    b.kernel("write-z", writes=[z.slice(0, PAGE_SIZE)], compute_ns=10_000)
    w = b.build()
    plan = {1: [commands(Op.ADVISE, y.addr, BLOCK_SIZE, advice=Advice.READ_MOSTLY),
                commands(Op.PREFETCH, y.addr, BLOCK_SIZE, dst=0),
                commands(Op.ADVISE, y.addr, BLOCK_SIZE, advice=Advice.UNSET_READ_MOSTLY)]}
    r = simulate(w, Script(plan))
    assert r.bytes_d2h >= BLOCK_SIZE        # A was written back
    assert kernel_ns(r, 1) >= wb_ns(PAGES_PER_BLOCK)


def test_a_page_is_read_back_only_after_its_write_back_lands():
    """Loophole 3. A two-chunk GPU; kernel 0 writes block A. At kernel 1's launch A is
    pre-evicted (512 pages, 0.17 ms on the queue) and read back at once: by a prefetch of the
    block, or by kernel 1's fault on its first page (the fault path moves the page's 64 KiB big
    page). Either copy out of the host starts when the write-back has landed; the old core read
    the pages back at once (kernel 1 took 0.11 ms after the prefetch, 0.04 ms after the fault)."""
    for prefetch in (True, False):
        b = WorkloadBuilder("reread", gpu_mem=2 * BLOCK_SIZE)
        x = b.alloc("x", BLOCK_SIZE)
        b.kernel("write", writes=[x], compute_ns=10_000)
        b.kernel("read", reads=[x.slice(0, PAGE_SIZE)], compute_ns=10_000)
        w = b.build()
        cmds = [commands(Op.PREEVICT, x.addr, BLOCK_SIZE, dst=CPU)]
        if prefetch:
            cmds.append(commands(Op.PREFETCH, x.addr, BLOCK_SIZE, dst=0))
        r = simulate(w, Script({1: cmds}))
        assert r.preevicted_bytes == BLOCK_SIZE and r.bytes_h2d > 0
        moved = r.bytes_h2d / (DEFAULT.prefetch_h2d_Bps if prefetch else DEFAULT.fault_h2d_Bps) * 1e9
        assert kernel_ns(r, 1) >= wb_ns(PAGES_PER_BLOCK) + moved, prefetch


def test_a_page_written_after_a_partial_unset_read_mostly_is_dirty():
    """A fourth way, found while proving the bound's write-back term. The model keeps
    read-mostly per block: an ``UNSET_READ_MOSTLY`` of part of a block cleared the flag for all
    of it but collapsed only that part, so the other duplicates stayed on the GPU with their host
    copies, and a GPU write to one of them left it "clean": evicted, it was never written back.
    Now the whole block's duplicates collapse, and the written page comes back to the GPU as its
    only copy (the old core wrote back nothing here)."""
    b = WorkloadBuilder("stale-duplicate", gpu_mem=BLOCK_SIZE)
    y = b.alloc("y", BLOCK_SIZE, init=Init.HOST)
    z = b.alloc("z", BLOCK_SIZE)
    b.kernel("write-y", writes=[y.slice(100 * PAGE_SIZE, PAGE_SIZE)], compute_ns=10_000)
    b.kernel("write-z", writes=[z.slice(0, PAGE_SIZE)], compute_ns=10_000)
    w = b.build()
    plan = {0: [commands(Op.ADVISE, y.addr, BLOCK_SIZE, advice=Advice.READ_MOSTLY),
                commands(Op.PREFETCH, y.addr, BLOCK_SIZE, dst=0),
                commands(Op.ADVISE, y.addr, PAGE_SIZE, advice=Advice.UNSET_READ_MOSTLY)]}
    r = simulate(w, Script(plan))
    assert r.bytes_d2h >= PAGE_SIZE       # y's page 100 is written back when z takes the chunk


# ---------------------------------------------------------------------- the policy, and the bound
def test_the_policy_that_hid_its_write_backs_now_pays_them():
    w, base = dirty_stream()
    compute = N_BLOCKS * COMPUTE_NS
    must_leave = (N_BLOCKS - GPU_CHUNKS) * BLOCK_SIZE
    write_back_ns = must_leave / DEFAULT.d2h_Bps * 1e9                # 4.5 ms
    r = simulate(w, HideWriteBack(base))
    assert r.bytes_d2h >= must_leave
    assert r.time_ns >= write_back_ns         # 5.4 ms (1.8 ms on the old core)
    assert r.time_ns >= replay_bound(w).time_ns     # 3.06 ms, the write-back term
    # the stock driver pays it too: its fault path evicts, and writes back as stall
    none = simulate(w, make_controller("none"))
    assert none.time_ns > compute + write_back_ns
