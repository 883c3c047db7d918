"""The ``uvm`` actuator against a fake driver at the Ioctl seam: what ioctls it issues for each
command, coalescing per 2 MiB block, priorities, supersession, failures (never raised),
target exit, rate limiting, and that close() undoes the advice it set."""

from __future__ import annotations

import ctypes as C
import errno
import threading
import time

import numpy as np
import pytest

from umctl.actuators.uvm import UvmActuator
from umctl.events.schema import Advice, Op, Status, commands
from umctl.driver import abi
from umctl.units import BLOCK_SIZE, CPU

GPU0 = bytes(range(16))
CPU_UUID = bytes([0xA6] * 16)
BASE = 0x7F00_0000_0000


class FakeUvm(abi.Ioctl):
    """Records every ioctl as (cmd, base, length, uuid/flags); can fail on demand and can
    hold the worker on a gate so tests fill the queue before anything runs."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.status: dict[int, int] = {}       # cmd -> NV_STATUS to return
        self.raise_errno: int | None = None
        self.exited = False
        self.gate = threading.Event()
        self.gate.set()

    def ioctl(self, fd, cmd, p):
        self.gate.wait(5)
        if self.raise_errno is not None:
            raise OSError(self.raise_errno, "fake")
        if cmd == abi.UVM_MIGRATE:
            self.calls.append(("migrate", p.base, p.length, bytes(p.destinationUuid.uuid)))
        elif cmd == abi.UVM_DISCARD:
            self.calls.append(("discard", p.base, p.length, int(p.flags)))
        elif cmd == abi.UVM_SET_PREFERRED_LOCATION:
            self.calls.append(("set_pref", p.requestedBase, p.length, bytes(p.preferredLocation.uuid)))
        elif cmd == abi.UVM_UNSET_PREFERRED_LOCATION:
            self.calls.append(("unset_pref", p.requestedBase, p.length, None))
        elif cmd == abi.UVM_ENABLE_READ_DUPLICATION:
            self.calls.append(("read_dup", p.requestedBase, p.length, None))
        elif cmd == abi.UVM_DISABLE_READ_DUPLICATION:
            self.calls.append(("no_read_dup", p.requestedBase, p.length, None))
        return self.status.get(cmd, abi.NV_OK)

    def process_exited(self, pidfd):
        return self.exited


def act(io: FakeUvm, **kw) -> UvmActuator:
    kw.setdefault("workers", 1)  # one worker: the order of ioctls is the queue's order
    return UvmActuator(3, {0: GPU0}, CPU_UUID, io=io, pidfd=7, **kw)


def blk(i: int) -> int:
    return BASE + i * BLOCK_SIZE


def test_each_op_issues_its_ioctl_and_reports_results():
    io = FakeUvm()
    a = act(io)
    ids = a.submit(np.concatenate([
        commands(Op.PREFETCH, blk(0), BLOCK_SIZE, dst=0),
        commands(Op.PREEVICT, blk(10), BLOCK_SIZE, dst=CPU),
        commands(Op.INVALIDATE, blk(20) + 4096, 8192),
    ]))
    assert a.wait_idle()
    kinds = {c[0]: c for c in io.calls}
    assert kinds["migrate"][1:] in [(blk(0), BLOCK_SIZE, GPU0), (blk(10), BLOCK_SIZE, CPU_UUID)]
    assert ("migrate", blk(10), BLOCK_SIZE, CPU_UUID) in io.calls
    # discard keeps the exact sub-block range (widening would destroy live data) and unmaps
    assert ("discard", blk(20) + 4096, 8192, abi.UVM_DISCARD_FLAGS_UNMAP) in io.calls
    r = a.results()
    assert sorted(r["cmd_id"].tolist()) == sorted(ids.tolist())
    assert (r["status"] == Status.OK).all()
    assert r["bytes"].sum() == 2 * BLOCK_SIZE + 8192
    # room is made before it is filled: at equal priority discard/pre-evict precede prefetch
    assert [c[0] for c in io.calls][-1] == "migrate" and io.calls[-1][3] == GPU0
    a.close()


def test_contiguous_blocks_coalesce_into_one_ioctl_up_to_the_cap():
    io = FakeUvm()
    io.gate.clear()
    a = act(io, max_ioctl_bytes=4 * BLOCK_SIZE)
    a.submit(commands(Op.PREFETCH, blk(100), BLOCK_SIZE, dst=0))  # the worker blocks on this one
    time.sleep(0.05)
    a.submit(commands(Op.PREFETCH, [blk(i) for i in range(6)], BLOCK_SIZE, dst=0))
    io.gate.set()
    assert a.wait_idle()
    migr = [c for c in io.calls if c[0] == "migrate" and c[1] != blk(100)]
    assert migr == [("migrate", blk(0), 4 * BLOCK_SIZE, GPU0), ("migrate", blk(4), 2 * BLOCK_SIZE, GPU0)]
    assert len(a.results()) == 7  # one result per command, coalesced or not
    a.close()


def test_priority_zero_overtakes_queued_prefetch_and_newer_intent_wins():
    io = FakeUvm()
    io.gate.clear()
    a = act(io)
    a.submit(commands(Op.PREFETCH, blk(50), BLOCK_SIZE, dst=0))       # in flight, blocked
    time.sleep(0.05)
    a.submit(commands(Op.PREFETCH, [blk(1), blk(3)], BLOCK_SIZE, dst=0, priority=1))
    a.submit(commands(Op.PREFETCH, blk(2), BLOCK_SIZE, dst=0, priority=0))
    late = a.submit(commands(Op.PREEVICT, blk(3), BLOCK_SIZE, dst=CPU, priority=1))  # cancels the prefetch of 3
    io.gate.set()
    assert a.wait_idle()
    order = [(c[1] - BASE) // BLOCK_SIZE for c in io.calls]
    assert order[0] == 50 and order[1] == 2
    assert ("migrate", blk(3), BLOCK_SIZE, GPU0) not in io.calls
    assert ("migrate", blk(3), BLOCK_SIZE, CPU_UUID) in io.calls
    r = a.results()
    skipped = r[r["status"] == Status.SKIPPED]
    assert len(skipped) == 1 and a.stats()["counts"]["superseded"] == 1
    assert late[0] in r["cmd_id"][r["status"] == Status.OK].tolist()
    a.close()


def test_failures_are_counted_never_raised():
    io = FakeUvm()
    io.status[abi.UVM_MIGRATE] = 0x1E  # NV_ERR_INVALID_ADDRESS: the range was freed
    a = act(io)
    a.submit(commands(Op.PREFETCH, blk(0), BLOCK_SIZE, dst=0))
    a.submit(commands(Op.PREFETCH, blk(5), BLOCK_SIZE, dst=3))       # no such GPU
    assert a.wait_idle()
    r = a.results()
    assert sorted(r["status"].tolist()) == sorted([Status.RANGE_INVALID, Status.FAILED])
    s = a.stats()
    assert s["counts"]["failed"] == 2 and s["counts"]["range_invalid"] == 1
    assert any("INVALID_ADDRESS" in k for k in s["errors"]) and any("no GPU 3" in k for k in s["errors"])
    a.close()


def test_target_exit_stops_issuing():
    io = FakeUvm()
    a = act(io)
    io.exited = True
    io.raise_errno = errno.ESRCH
    a.submit(commands(Op.PREFETCH, blk(0), BLOCK_SIZE, dst=0))
    assert a.wait_idle()
    io.raise_errno = None
    a.submit(commands(Op.PREFETCH, blk(9), BLOCK_SIZE, dst=0))
    assert a.wait_idle()
    r = a.results()
    assert (r["status"] == Status.TARGET_GONE).all() and len(r) == 2
    assert not io.calls  # nothing reached the driver after it said the target is gone
    assert a.gone
    a.close()


def test_close_undoes_advice_it_set():
    io = FakeUvm()
    a = act(io)
    a.submit(commands(Op.ADVISE, blk(0), 4 * BLOCK_SIZE, dst=0, advice=Advice.PREFERRED_LOCATION))
    a.submit(commands(Op.ADVISE, blk(8), BLOCK_SIZE, advice=Advice.READ_MOSTLY))
    assert a.wait_idle()
    assert a.stats()["advice_set"] == 2
    a.close()
    assert ("unset_pref", blk(0), BLOCK_SIZE, None) in io.calls or ("unset_pref", blk(0), 4 * BLOCK_SIZE, None) in io.calls
    assert ("no_read_dup", blk(8), BLOCK_SIZE, None) in io.calls


def test_queue_bound_drops_stalest_prefetches():
    io = FakeUvm()
    io.gate.clear()
    a = act(io, max_pending_blocks=4)
    a.submit(commands(Op.PREFETCH, blk(99), BLOCK_SIZE, dst=0))
    time.sleep(0.05)
    a.submit(commands(Op.PREFETCH, [blk(i) for i in range(0, 20, 2)], BLOCK_SIZE, dst=0))
    assert a.stats()["counts"]["dropped"] == 6
    io.gate.set()
    assert a.wait_idle()
    done = sorted((c[1] - BASE) // BLOCK_SIZE for c in io.calls if c[1] != blk(99))
    assert done == [12, 14, 16, 18]  # the newest predictions survive
    a.close()


def test_rate_limit_spaces_out_migrations():
    io = FakeUvm()
    a = act(io, max_bytes_per_s=200 * BLOCK_SIZE)   # 20 blocks -> ~0.1 s beyond the burst
    t = time.monotonic()
    a.submit(commands(Op.PREFETCH, [blk(2 * i) for i in range(20)], BLOCK_SIZE, dst=0))
    assert a.wait_idle()
    assert time.monotonic() - t >= 0.07
    a.close()


def test_rejects_wrong_dtype():
    a = act(FakeUvm())
    with pytest.raises(TypeError):
        a.submit(np.zeros(2, dtype=np.int64))
    a.close()


def test_two_workers_prefetch_while_an_eviction_is_in_flight():
    """Opposite link directions overlap: with the default two workers a prefetch is issued
    while a long pre-eviction is still inside the driver."""
    io = FakeUvm()
    release = threading.Event()
    seen_prefetch_during_evict = []
    plain = io.ioctl

    def ioctl(fd, cmd, p):
        if cmd == abi.UVM_MIGRATE and bytes(p.destinationUuid.uuid) == CPU_UUID:
            release.wait(5)                       # the eviction takes "long"
        elif cmd == abi.UVM_MIGRATE:
            seen_prefetch_during_evict.append(not release.is_set())
            release.set()
        return plain(fd, cmd, p)

    io.ioctl = ioctl
    a = act(io, workers=2)
    a.submit(commands(Op.PREEVICT, blk(0), BLOCK_SIZE, dst=CPU))
    time.sleep(0.05)
    a.submit(commands(Op.PREFETCH, blk(5), BLOCK_SIZE, dst=0))
    assert a.wait_idle()
    assert seen_prefetch_during_evict == [True]
    a.close()


def test_a_preevict_waits_for_the_prefetch_of_its_block_in_flight():
    """An escape from the budget: a pre-eviction queued while another worker's prefetch of the
    same block is inside the driver ran at once, beside it; the prefetch then brought the block
    back after the eviction had moved it out, so the block stayed on the GPU while the budget
    keeper counted it gone (and no fault ever told it otherwise). A block's second command now
    starts only once the ioctl holding the block has returned; other blocks are not held up."""
    io = FakeUvm()
    release = threading.Event()
    log: list[str] = []
    plain = io.ioctl

    def ioctl(fd, cmd, p):
        to_cpu = cmd == abi.UVM_MIGRATE and bytes(p.destinationUuid.uuid) == CPU_UUID
        if cmd == abi.UVM_MIGRATE and not to_cpu:
            log.append("prefetch begins")
            release.wait(5)                       # the prefetch takes "long"
            log.append("prefetch ends")
        elif to_cpu:
            log.append(f"evict {(p.base - BASE) // BLOCK_SIZE}")
        return plain(fd, cmd, p)

    io.ioctl = ioctl
    a = act(io, workers=2)
    a.submit(commands(Op.PREFETCH, [blk(i) for i in range(4)], BLOCK_SIZE, dst=0))   # one run
    deadline = time.monotonic() + 5
    while "prefetch begins" not in log and time.monotonic() < deadline:
        time.sleep(0.005)
    a.submit(commands(Op.PREEVICT, [blk(2), blk(9)], BLOCK_SIZE, dst=CPU, priority=0))
    time.sleep(0.1)
    assert log == ["prefetch begins", "evict 9"]       # block 9 is free to go, block 2 waits
    release.set()
    assert a.wait_idle()
    assert log == ["prefetch begins", "evict 9", "prefetch ends", "evict 2"]
    assert (a.results()["status"] == Status.OK).all()
    a.close()


def test_idle_workers_do_not_spin():
    """Two idle workers once woke each other endlessly (~40 K wake-ups/s on the H100) and took
    the GIL from the control loop; idle now means asleep."""
    a = act(FakeUvm(), workers=2)
    a.submit(commands(Op.PREFETCH, blk(0), BLOCK_SIZE, dst=0))
    assert a.wait_idle()
    t = time.process_time()
    time.sleep(0.3)
    assert time.process_time() - t < 0.05
    a.close()


def test_invalidate_through_the_programs_runtime_pre_evicts_what_it_kept():
    """With an invalidator (the program's runtime), INVALIDATE issues no UVM_DISCARD from
    umctl: the runtime drops what is safe, and once it has answered the victim is pre-evicted to
    the CPU (dropped pages move without a copy; a dropped block left resident nowhere was
    populated fault by fault on the H100), so it leaves the GPU either way and no live data is
    lost. An invalidator that fails keeps everything (pre-evicted at once), never raises; an
    answer that comes after a newer command for the block leaves that command alone."""
    io = FakeUvm()
    a = act(io)
    asked = []

    def runtime(base, length, on_done):
        asked.append((base, length))
        on_done([(base + 4096, 8192), (base + BLOCK_SIZE // 2, BLOCK_SIZE // 2)])   # what it dropped
        return True

    a.invalidator = runtime
    a.submit(commands(Op.INVALIDATE, blk(3), BLOCK_SIZE))
    assert a.wait_idle()
    assert asked == [(blk(3), BLOCK_SIZE)]
    assert io.calls == [("migrate", blk(3), BLOCK_SIZE, CPU_UUID)]
    s = a.stats()
    assert s["bytes"]["invalidate"] == BLOCK_SIZE // 2 + 8192
    assert s["bytes"]["preevict"] == BLOCK_SIZE
    assert (a.results()["status"] == Status.OK).all()

    def broken(base, length, on_done):
        raise RuntimeError("socket gone")

    io.calls.clear()
    a.invalidator = broken
    a.submit(commands(Op.INVALIDATE, blk(5), BLOCK_SIZE))
    assert a.wait_idle()
    assert io.calls == [("migrate", blk(5), BLOCK_SIZE, CPU_UUID)]
    assert a.stats()["counts"]["failed"] == 1

    io.calls.clear()                       # the answer comes after a newer intent for the block
    later = []
    a.invalidator = lambda base, length, on_done: later.append(on_done) or True
    a.submit(commands(Op.INVALIDATE, blk(7), BLOCK_SIZE))
    assert not a.wait_idle(timeout=0.2) and io.calls == []   # the runtime's answer is still to come
    io.gate.clear()
    a.submit(commands(Op.PREFETCH, blk(7), BLOCK_SIZE, dst=0))
    later[0]([])                           # kept it all: but the block is wanted back now
    io.gate.set()
    assert a.wait_idle()
    assert io.calls == [("migrate", blk(7), BLOCK_SIZE, GPU0)]
    a.close()


def test_an_invalidation_answers_when_its_follow_up_pre_eviction_is_done():
    """The budget check's only evidence that discarded pages left the GPU is the INVALIDATE's
    RESULT (the driver reports no migration for them): it must come once, after the follow-up
    pre-eviction ran, and not while the runtime has not answered. Superseded by a newer prefetch,
    it answers SKIPPED (the block stays)."""
    io = FakeUvm()
    a = act(io)
    later = []
    a.invalidator = lambda base, length, on_done: later.append(on_done) or True
    ids = a.submit(commands(Op.INVALIDATE, [blk(2), blk(3)], [BLOCK_SIZE, BLOCK_SIZE]))
    # requested, not answered: not idle (a drain waits for it), no evidence yet
    assert not a.wait_idle(timeout=0.2) and io.calls == [] and len(later) == 1
    assert a.stats()["pending"] == 1 and len(a.results()) == 0
    later[0]([(blk(2), BLOCK_SIZE)])
    assert a.wait_idle()
    assert io.calls == [("migrate", blk(2), 2 * BLOCK_SIZE, CPU_UUID)]
    r = a.results()
    assert sorted(r["cmd_id"].tolist()) == sorted(ids.tolist())
    assert (r["status"] == Status.OK).all()
    assert len(a.results()) == 0              # once

    later.clear()
    (cid,) = a.submit(commands(Op.INVALIDATE, blk(9), BLOCK_SIZE)).tolist()
    assert not a.wait_idle(timeout=0.2)
    io.gate.clear()
    (pid_,) = a.submit(commands(Op.PREFETCH, blk(9), BLOCK_SIZE, dst=0)).tolist()
    later[0]([])
    io.gate.set()
    assert a.wait_idle()
    st = dict(zip(*(x.tolist() for x in (lambda r: (r["cmd_id"], r["status"]))(a.results()))))
    assert st == {cid: Status.SKIPPED, pid_: Status.OK}
    a.close()


def test_a_drain_waits_for_the_runtimes_answer_and_a_late_one_after_close_is_ignored():
    """close(drain=True) at the end of a session waits for invalidations the runtime has not
    answered (their RESULTs are the budget check's evidence); an answer after the close queues
    nothing on a stopped actuator."""
    io = FakeUvm()
    a = act(io)
    later = []
    a.invalidator = lambda base, length, on_done: later.append(on_done) or True
    a.submit(commands(Op.INVALIDATE, blk(5), BLOCK_SIZE))
    t = threading.Timer(0.3, lambda: later[0]([]))
    t.start()
    a.close(drain=True, timeout=5.0)
    t.join()
    r = a.results()
    assert len(r) == 1 and io.calls == [("migrate", blk(5), BLOCK_SIZE, CPU_UUID)]

    io2 = FakeUvm()
    b = act(io2)
    late = []
    b.invalidator = lambda base, length, on_done: late.append(on_done) or True
    b.submit(commands(Op.INVALIDATE, blk(6), BLOCK_SIZE))
    assert not b.wait_idle(timeout=0.2)
    b.close(drain=True, timeout=0.2)
    late[0]([])
    assert io2.calls == [] and b.stats()["pending"] == 0 and not b._heap
