"""Why the replay lower bound (umctl/sim/bound.py) counts no write-back of evicted data.

Data written on the GPU that no longer fits must cross back to the host, and on mixtral-8x7b at
fit scale that is most of the best mode's time (docs/evaluation/cliffs.md, *Mixture of
experts*). Yet a write-back term is not a lower bound on the simulator's time, because the
simulator lets a policy leave its write-backs unawaited: a pre-eviction of part of a block
queues its copy on the GPU->host engine and counts the pages valid on the host at once, while
the chunk stays with the block; once what is left in the block is read-duplicated (clean), an
``UNSET_READ_MOSTLY`` advice drops it and frees the chunk at once. Nothing ever waits for the
queue, and the replay ends with it still busy.

The test below is that policy, by hand, on a stream of kernels each writing a fresh 2 MiB block
onto a 4-chunk GPU: 28 blocks must leave dirty (56 MiB, 4.5 ms at the built-in 13 GB/s), and
the replay takes 1.8 ms, 0.2 ms over the compute. It must keep passing while the bound holds
no write-back term; if the simulator comes to make a chunk's release (and a page's reload) wait
for the write-backs out of it, it fails, and a write-back term can be proved (bound.py's
docstring says how large it would be).
"""

from __future__ import annotations

import numpy as np

from umctl.controller.base import Controller, make_controller
from umctl.events.schema import Advice, Kind, Op, commands
from umctl.sim.bound import replay_bound
from umctl.sim.calibration import DEFAULT
from umctl.sim.engine import simulate
from umctl.units import BLOCK_SIZE, CPU, PAGE_SIZE
from umctl.workload.workload import WorkloadBuilder

N_BLOCKS, GPU_CHUNKS, COMPUTE_NS = 32, 4, 50_000


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


def test_a_policy_leaves_its_write_backs_unawaited():
    w, base = dirty_stream()
    bound = replay_bound(w)
    compute = N_BLOCKS * COMPUTE_NS
    assert bound.time_ns == compute and bound.transfer_pages == 0   # nothing comes from the host
    must_leave = (N_BLOCKS - GPU_CHUNKS) * BLOCK_SIZE
    write_back_ns = must_leave / DEFAULT.d2h_Bps * 1e9                # 4.5 ms
    r = simulate(w, HideWriteBack(base))
    assert r.bytes_d2h >= must_leave          # the data did go back ...
    assert r.time_ns >= bound.time_ns         # ... the bound holds ...
    assert r.time_ns < compute + 0.1 * write_back_ns < write_back_ns   # ... and nothing waited for it
    # the stock driver pays it: its fault path evicts, and writes back as stall
    none = simulate(w, make_controller("none"))
    assert none.time_ns > compute + write_back_ns
