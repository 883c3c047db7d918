"""The live control loop without a GPU: residency estimate, the soft budget (LRU overflow
eviction = mode none --budget), the same DeepUM controller a replay uses driving an actuator
from live-shaped event batches, and refusal of replay-only modes."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from umctl import UmctlError
from umctl.actuators.base import ActuatorBase
from umctl.controller.base import make_controller
from umctl.events.schema import AllocOp, EventBatch, Kind, Op, Status, empty
from umctl.live.control import LiveControl
from umctl.loop.residency import Budget, Residency
from umctl.units import BLOCK_SHIFT, BLOCK_SIZE, CPU

BASE = 0x7F00_0000_0000
GPUS = [{"gpu": 0, "uuid": "GPU-x", "memory_bytes": 80 << 30}]


class FakeActuator(ActuatorBase):
    """Executes everything at once, successfully (or not, per op)."""

    def __init__(self, fail_ops=()):
        super().__init__(threading.Lock())
        self.submitted: list[np.ndarray] = []
        self.fail_ops = set(fail_ops)
        self.closed = False

    def submit(self, cmds):
        ids = self._new_ids(len(cmds))
        self.submitted.append(cmds.copy())
        with self._lock:
            for c, i in zip(cmds, ids.tolist()):
                st = Status.RANGE_INVALID if int(c["op"]) in self.fail_ops else Status.OK
                self._result_row(i, st, int(c["bytes"]), 1000)
        return ids

    def _pending_locked(self):
        return 0

    def close(self, drain=False, timeout=0):
        self.closed = True

    def stats(self):
        return {}

    def all(self):
        return np.concatenate(self.submitted) if self.submitted else np.zeros(0)


def faults(t: int, blocks, gpu: int = 0) -> np.ndarray:
    f = empty(Kind.FAULT, len(blocks))
    f["t_ns"], f["gpu"], f["addr"] = t, gpu, BASE + np.asarray(blocks, np.uint64) * BLOCK_SIZE + 4096
    return f


def launch(t: int, h: int, seq: int) -> np.ndarray:
    la = empty(Kind.LAUNCH, 1)
    la["t_ns"], la["exec_hash"], la["seq"], la["name_id"] = t, h, seq, 0
    return la


def test_residency_from_faults_migrations_and_frees():
    r = Residency(1)
    b = EventBatch(now_ns=10)
    b.add(Kind.FAULT, faults(5, [3, 1, 3]))
    r.observe(b)
    assert r.resident_bytes(0) == 2 * BLOCK_SIZE
    m = empty(Kind.MIGRATION, 1)
    m["src"], m["dst"], m["addr"], m["bytes"] = 0, CPU, BASE + 3 * BLOCK_SIZE, BLOCK_SIZE
    m["t_ns"] = 15   # after the fault that brought it in (a departure older than it would not count)
    a = empty(Kind.ALLOC, 1)
    a["op"], a["addr"], a["bytes"] = AllocOp.FREE, BASE + BLOCK_SIZE, BLOCK_SIZE
    b2 = EventBatch(now_ns=20)
    b2.add(Kind.MIGRATION, m)
    b2.add(Kind.ALLOC, a)
    r.observe(b2)
    assert r.resident_bytes(0) == 0


def test_budget_evicts_least_recently_migrated_with_slack():
    r = Residency(1)
    r.arrive(0, range(100), 0)
    bud = Budget(64 * BLOCK_SIZE, r, slack=0.05)
    cmds = bud.enforce([0], 1)
    assert (cmds["op"] == Op.PREEVICT).all() and (cmds["dst"] == CPU).all()
    evicted = ((cmds["addr"] >> np.uint64(BLOCK_SHIFT))).tolist()
    assert evicted == list(range(36 + bud.slack_blocks))       # oldest first
    assert r.resident_bytes(0) <= 64 * BLOCK_SIZE
    assert bud.enforce([0], 2) is None                         # no repeat while in flight
    assert bud.free_memory(0) == (64 - 64 + bud.slack_blocks) * BLOCK_SIZE


def test_budget_to_spare_gpus_round_robin_in_coalescible_runs():
    r = Residency(3)
    r.arrive(0, list(range(40)) + [100, 101, 200], 0)
    bud = Budget(3 * BLOCK_SIZE, r, dst=[1, 2], slack=0.0)
    cmds = bud.enforce([0], 1)
    blocks = (cmds["addr"] >> np.uint64(BLOCK_SHIFT)).astype(np.int64)
    assert sorted(set(cmds["dst"].tolist())) == [1, 2]
    assert r.resident_bytes(1) + r.resident_bytes(2) == len(cmds) * BLOCK_SIZE
    # runs of contiguous blocks share a destination, at most SPREAD_RUN blocks each: the
    # actuator coalesces each run into one ioctl
    order = np.argsort(blocks)
    b, d = blocks[order], cmds["dst"][order]
    changes = np.flatnonzero(d[1:] != d[:-1]) + 1
    runs = np.split(b, changes)
    assert all(len(x) <= Budget.SPREAD_RUN and (np.diff(x) == 1).all() for x in runs)
    assert len(runs) >= 3 and len(runs[0]) == Budget.SPREAD_RUN   # 0-15, 16-31, 32-39, ...


def test_sweep_sends_away_again_what_came_back_unseen():
    """Fault events arrive late, so a block umctl evicted can be back on the GPU without the
    estimate knowing (measured on the H100: 16 of 20 steps ran fully resident under the
    budget). The sweep re-evicts such blocks once they have been away sweep_age_ms, skips
    those the estimate saw come back, forgets freed ones, and runs once per period."""
    ms = 1_000_000
    r = Residency(1)
    r.arrive(0, range(10), 0)
    bud = Budget(4 * BLOCK_SIZE, r, slack=0.0, sweep_ms=50, sweep_age_ms=100)
    ev = bud.enforce([0], 1 * ms)
    assert sorted((ev["addr"] >> np.uint64(BLOCK_SHIFT)).tolist()) == list(range(7))   # 6 over + 1 slack
    assert bud.sweep([0], 60 * ms) is None                 # too young to sweep
    r.arrive(0, [0], 70 * ms)                              # block 0 faulted back: seen
    bud.forget([5])                                        # block 5 freed
    sw = bud.sweep([0], 120 * ms)
    assert (sw["op"] == Op.PREEVICT).all() and (sw["dst"] == CPU).all() and (sw["priority"] == 2).all()
    assert sorted((sw["addr"] >> np.uint64(BLOCK_SHIFT)).tolist()) == [1, 2, 3, 4, 6]
    assert bud.sweep([0], 130 * ms) is None                # once per period
    assert bud.sweep([0], 180 * ms) is None                # swept at 120 ms: not due again yet
    assert len(bud.sweep([0], 230 * ms)) == 5 and bud.swept_blocks == 10
    off = Budget(4 * BLOCK_SIZE, Residency(1), sweep_ms=0)
    off.sent_away(0, [1, 2], 0)
    assert off.sweep([0], 10**12) is None


def test_live_loop_sweeps_and_counts_the_controllers_own_evictions():
    act = FakeActuator()
    lc = LiveControl(make_controller("none"), act, pid=42, gpus=GPUS, budget_bytes=4 * BLOCK_SIZE,
                     budget_sweep_ms=10)
    ms = 1_000_000
    b = EventBatch(now_ns=1 * ms)
    b.add(Kind.FAULT, faults(1 * ms, range(8)))
    lc.step(b)
    out = lc.step(EventBatch(now_ns=500 * ms))            # nothing new: only the sweep
    cmds = out[Kind.COMMAND]
    assert (cmds["priority"] == 2).all() and len(cmds) == 5       # 4 over the budget + 1 slack
    assert lc.stats()["budget"]["swept_blocks"] == 5
    with pytest.raises(UmctlError):
        Budget(4 * BLOCK_SIZE, Residency(1), sweep_ms=-1)


def test_none_with_budget_is_lru_eviction_only():
    act = FakeActuator()
    lc = LiveControl(make_controller("none"), act, pid=42, gpus=GPUS, budget_bytes=16 * BLOCK_SIZE)
    for step in range(4):
        b = EventBatch(now_ns=step * 1000)
        b.add(Kind.FAULT, faults(step * 1000, range(step * 8, step * 8 + 8)))
        out = lc.step(b)
        if step >= 2:
            assert Kind.COMMAND in out
    cmds = act.all()
    assert (cmds["op"] == Op.PREEVICT).all()           # no prefetch in the baseline
    assert (cmds["pid"] == 42).all()
    assert lc.res.resident_bytes(0) <= 16 * BLOCK_SIZE
    lc.finish()
    assert act.closed


def _three_kernel_cycle(lc: LiveControl, alloc_at: tuple[int, int, np.ndarray] | None = None) -> None:
    """Four iterations of three kernels (exec hashes 1, 2, 3) over their own blocks: every block
    faults in the first, then only each iteration's first kernel faults its first block (DeepUM
    learns the rest). ``alloc_at`` = (iteration, kernel, ALLOC records) adds allocator events."""
    kern = {1: [0, 1, 2, 3], 2: [10, 11, 12], 3: [20, 21, 22, 23]}
    t = seq = 0
    for it in range(4):
        for h, blocks in kern.items():
            b = EventBatch(now_ns=t + 500)
            b.add(Kind.LAUNCH, launch(t, h, seq))
            if it == 0 or h == 1:
                b.add(Kind.FAULT, faults(t + 100, blocks[:1] if it else blocks))
            if alloc_at is not None and alloc_at[:2] == (it, h):
                b.add(Kind.ALLOC, alloc_at[2])
            lc.step(b)
            t += 1000
            seq += 1


def test_deepum_live_prefetches_the_learned_sequence():
    """Two iterations of the same three kernels faulting the same blocks: in the second,
    DeepUM (the replay controller, unchanged) prefetches the blocks of the next kernels
    before they fault, and the commands go to the actuator with the target's pid."""
    act = FakeActuator()
    lc = LiveControl(make_controller("deepum", watermark_blocks=0, degree=1), act, pid=7, gpus=GPUS,
                     budget_bytes=8 * BLOCK_SIZE)
    lc.budget.slack_blocks = 0
    _three_kernel_cycle(lc)
    c = act.all()
    walk = c[(c["op"] == Op.PREFETCH) & (c["priority"] == 1)]   # predicted, not fault completion
    got = set(((walk["addr"] >> np.uint64(BLOCK_SHIFT)) - np.uint64(BASE >> BLOCK_SHIFT)).tolist())
    assert {1, 2} <= got                                  # the faulted kernel's successors
    assert got & {10, 11, 12} and got & {20, 21, 22, 23}   # chained into the next kernels
    assert lc.stats()["controller"]["prefetch_blocks"] == len(walk)
    assert (c["op"] == Op.PREEVICT).any()          # the budget made room


def test_failed_prefetch_is_taken_back_from_the_estimate():
    act = FakeActuator(fail_ops={Op.PREFETCH})
    lc = LiveControl(make_controller("none"), act, pid=1, gpus=GPUS)
    from umctl.events.schema import commands

    c = commands(Op.PREFETCH, BASE, BLOCK_SIZE, dst=0)
    lc._account(c, 0)
    ids = act.submit(c)
    lc._issued[int(ids[0])] = (Op.PREFETCH, BASE >> BLOCK_SHIFT, 0, 0, (0, BASE >> BLOCK_SHIFT) in lc._fresh)
    assert lc.res.resident_bytes(0) == BLOCK_SIZE
    lc._results(EventBatch())
    assert lc.res.resident_bytes(0) == 0


def test_failed_completion_of_a_faulted_block_keeps_it_counted():
    """DeepUM completes every faulted block with a prefetch; when that prefetch fails the
    faulted pages are on the GPU all the same. Taking the block out of the estimate (as a failed
    prefetch of a block nobody touched is) let the estimate fall below the truth."""
    act = FakeActuator(fail_ops={Op.PREFETCH})
    lc = LiveControl(make_controller("deepum"), act, pid=1, gpus=GPUS, budget_bytes=64 * BLOCK_SIZE)
    b = EventBatch(now_ns=1000)
    b.add(Kind.LAUNCH, launch(0, 1, 0))
    b.add(Kind.LAUNCH, launch(100, 1, 1))   # a repeat: DeepUM completes only a repeat's blocks
    b.add(Kind.FAULT, faults(500, [3]))
    out = lc.step(b)
    pf = out[Kind.COMMAND][out[Kind.COMMAND]["op"] == Op.PREFETCH]
    assert len(pf) and (out[Kind.RESULT]["status"] == Status.RANGE_INVALID).all()
    assert lc.res.resident_bytes(0) == BLOCK_SIZE           # the faulted block stays counted


def test_replay_only_modes_and_bad_budgets_are_refused():
    with pytest.raises(UmctlError, match="replay only"):
        LiveControl(make_controller("oracle"), FakeActuator(), pid=1, gpus=GPUS)
    with pytest.raises(UmctlError, match="at least 2 MiB"):
        LiveControl(make_controller("none"), FakeActuator(), pid=1, gpus=GPUS, budget_bytes=4096)
    with pytest.raises(UmctlError, match="memory size unknown"):
        LiveControl(make_controller("none"), FakeActuator(), pid=1, gpus=[{"gpu": 0}])


def test_budget_keeper_asks_the_controller_which_blocks_to_lose():
    """DeepUM ranks victims: blocks the next kernels do not expect go before expected ones,
    even when the expected ones are older (plain LRU would evict those first)."""
    ctl = make_controller("deepum")
    r = Residency(1)
    r.arrive(0, [1, 2, 3, 4], 0)
    ctl._horizon_cache = {1: 0, 2: 1}      # the next kernels touch blocks 1 and 2
    bud = Budget(2 * BLOCK_SIZE, r)
    bud.slack_blocks = 0
    cmds = bud.enforce([0], 1, order=ctl.eviction_order)
    assert sorted((cmds["addr"] >> np.uint64(BLOCK_SHIFT)).tolist()) == [3, 4]
    r2 = Residency(1)
    r2.arrive(0, [1, 2, 3, 4], 0)
    plain = Budget(2 * BLOCK_SIZE, r2)
    plain.slack_blocks = 0
    lru = plain.enforce([0], 1)
    assert sorted((lru["addr"] >> np.uint64(BLOCK_SHIFT)).tolist()) == [1, 2]


def test_expected_blocks_are_lost_furthest_need_first():
    """When the budget needs more room than the unexpected blocks give, DeepUM gives up the
    expected blocks needed furthest ahead: migration age would pick the block prefetched first,
    which is the one the next kernel needs (on the H100 torch loop most faults left under
    deepum were such blocks, prefetched and evicted again before their use)."""
    ctl = make_controller("deepum")
    r = Residency(1)
    r.arrive(0, [10, 11, 12, 13, 14], 0)   # 10 oldest: prefetched first, for the current kernel
    ctl._horizon_cache = {10: 0, 11: 1, 12: 2, 13: 3}   # 14: no predicted kernel touches it
    bud = Budget(2 * BLOCK_SIZE, r)
    bud.slack_blocks = 0
    cmds = bud.enforce([0], 1, order=ctl.eviction_order)
    # the victims, in address order (the actuator coalesces ascending runs into one ioctl)
    assert (cmds["addr"] >> np.uint64(BLOCK_SHIFT)).tolist() == [12, 13, 14]
    assert list(r.blocks[0]) == [10, 11]      # what the next two kernels need stays


def test_budget_keeper_ranks_by_deepums_predicted_next_use_beyond_n():
    """Past the N kernels DeepUM prefetches for, the budget keeper still follows DeepUM's own
    prediction of the kernel sequence: of the blocks the next N kernels do not expect, those
    needed furthest ahead go first (LRU would take the oldest arrival, which on a training
    loop's cycle is the block needed soonest)."""
    ctl = make_controller("deepum", degree=1)
    seq = [1, 2, 3, 4, 5] * 3                          # a 5-kernel "step", seen three times
    for i in range(3, len(seq) - 1):
        ctl.exec_table.record(tuple(seq[i - 3:i]), seq[i], seq[i + 1])
    for k in range(1, 6):
        ctl._table(k).record(100 + k)                  # kernel k touches block 100 + k
    ctl.history = [3, 4, 5, 1]
    ctl.cur = 1
    ranks = ctl._next_use(10)
    assert ranks == {101: 0, 102: 1, 103: 2, 104: 3, 105: 4}
    r = Residency(1)
    r.arrive(0, [102, 103, 104, 105, 999], 0)          # 102 arrived first: LRU would lose it first
    bud = Budget(2 * BLOCK_SIZE, r)
    bud.slack_blocks = 0
    cmds = bud.enforce([0], 1, order=ctl.eviction_order)
    assert (cmds["addr"] >> np.uint64(BLOCK_SHIFT)).tolist() == [104, 105, 999]   # 102, 103 stay


def _dead_block_run(allow_invalidate: bool) -> tuple[np.ndarray, dict]:
    """Kernels 1, 2, 3 cycle over their own blocks under a budget; kernel 1's blocks lie in an
    allocator block reported inactive (a freed tensor), so they are the victims DeepUM's next
    kernels do not expect. ``allow_invalidate``: the program's runtime carries invalidations
    out (``umctl run``: actuators/runtime_discard.py). Returns every command sent to the
    actuator and DeepUM's stats."""
    dead = empty(Kind.ALLOC, 1)
    dead["op"], dead["addr"], dead["bytes"] = AllocOp.BLOCK_INACTIVE, BASE, 4 * BLOCK_SIZE
    act = FakeActuator()
    lc = LiveControl(make_controller("deepum", watermark_blocks=0, degree=1), act, pid=7, gpus=GPUS,
                     budget_bytes=8 * BLOCK_SIZE, safe_invalidate=allow_invalidate)
    lc.budget.slack_blocks = 0
    assert lc.ctl.live_invalidate_off != allow_invalidate
    _three_kernel_cycle(lc, alloc_at=(2, 2, dead))
    st = lc.stats()["controller"]
    assert bool(st.get("invalidate_off_live")) != allow_invalidate
    return act.all(), st


def test_deepum_live_never_discards_freed_allocator_blocks():
    """A discard from umctl is ordered neither with the program's stream (kernels queued before
    the free may still read the block) nor with the allocator reusing it; on the H100 torch loop
    it changed the trained parameters. Under the runtime (which discards only what is safe) the
    dead block is invalidated; without it, it is pre-evicted instead, so its data stays."""
    allowed, _ = _dead_block_run(allow_invalidate=True)
    assert (allowed["op"] == Op.INVALIDATE).any()
    live, st = _dead_block_run(allow_invalidate=False)
    assert not (live["op"] == Op.INVALIDATE).any()
    dead_blocks = set(range(BASE >> BLOCK_SHIFT, (BASE >> BLOCK_SHIFT) + 4))
    pre = live[live["op"] == Op.PREEVICT]
    assert dead_blocks & set((pre["addr"] >> np.uint64(BLOCK_SHIFT)).tolist())
    assert st["kept_not_invalidated"] > 0


def test_budget_keeper_invalidates_dead_victims_only_when_deepum_may():
    """DeepUM's driver invalidates any eviction victim lying wholly in inactive allocator blocks
    (§5.2), the fault path's too: live, the budget keeper's. A block only partly dead, or a
    mode without invalidation, or invalidation off live, keeps the plain pre-eviction."""
    def keeper(mode: str, safe: bool, **opts) -> np.ndarray:
        dead = empty(Kind.ALLOC, 2)
        dead["op"] = AllocOp.BLOCK_INACTIVE
        dead["addr"] = [BASE, BASE + 2 * BLOCK_SIZE]
        dead["bytes"] = [2 * BLOCK_SIZE, BLOCK_SIZE // 2]     # blocks 0, 1 wholly dead, 2 half
        act = FakeActuator()
        lc = LiveControl(make_controller(mode, **opts), act, pid=7, gpus=GPUS, budget_bytes=2 * BLOCK_SIZE,
                         safe_invalidate=safe)
        lc.budget.slack_blocks = 0
        b0 = BASE >> BLOCK_SHIFT
        lc.res.arrive(0, [b0, b0 + 1, b0 + 2, b0 + 3, b0 + 4], 0)
        lc.step(EventBatch(now_ns=1, arrays={Kind.ALLOC: dead}))
        cmds = act.all()
        return {int(a) >> BLOCK_SHIFT: Op(int(o)).name for a, o in zip(cmds["addr"], cmds["op"])}

    b0 = BASE >> BLOCK_SHIFT
    got = keeper("deepum", safe=True, live_invalidate=True)
    assert got == {b0: "INVALIDATE", b0 + 1: "INVALIDATE", b0 + 2: "PREEVICT"}
    assert set(keeper("deepum", safe=False, live_invalidate=True).values()) == {"PREEVICT"}
    assert set(keeper("deepum", safe=True, live_invalidate=False).values()) == {"PREEVICT"}
    assert set(keeper("deepum-preevict", safe=True, live_invalidate=True).values()) == {"PREEVICT"}
    assert set(keeper("deepum", safe=True, live_invalidate=True, keeper_invalidate=False).values()) == {"PREEVICT"}
