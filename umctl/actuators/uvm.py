"""Actuator ``uvm``: execute controller commands on another process's managed memory.

The commands go through the target's own va_space, duplicated into umctl (the tools-API
source already holds that fd): UVM_MIGRATE to a GPU's UUID prefetches, to the CPU's (or a
neighbour GPU's) pre-evicts, UVM_DISCARD invalidates, SET/UNSET_PREFERRED_LOCATION and
ENABLE/DISABLE_READ_DUPLICATION advise (each measured on driver 580: docs/evaluation/measurements.md).

Why a worker thread and a queue rather than calling ioctls from the controller:
  * a 64 MiB UVM_MIGRATE takes ~1.5 ms and the controller must keep draining the ring;
  * commands go stale: a prefetch queued behind 500 others is useless once the kernel faulted
    the block in, and a pre-evict followed by a prefetch of the same block cancels out. The
    queue is keyed by 2 MiB block, so a later command for a block replaces a pending one;
  * demand-related commands (priority 0) must overtake bulk prefetch (priority 1+), and room
    must be made (invalidate, pre-evict) before prefetches that need it.

Every executed command yields a RESULT record (status, bytes, latency); failures (target
exited, range freed, a driver error) are counted and never raise: the target must not notice
umctl beyond the data movement it asked for. ``close()`` undoes every piece of advice set
through it, so a detach leaves the target as it was.
"""

from __future__ import annotations

import ctypes as C
import errno
import heapq
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .base import ActuatorBase
from ..events.schema import COMMAND_DTYPE, Advice, Op, Status
from ..driver import abi
from ..units import BLOCK_SHIFT, BLOCK_SIZE, CPU

#: Execution order at equal priority: make room first, then fill it.
_OP_RANK = {Op.INVALIDATE: 0, Op.PREEVICT: 1, Op.PREFETCH: 2, Op.ADVISE: 3}


def _block_pieces(addr: int, end: int):
    """``[addr, end)`` split at 2 MiB block boundaries: (block, lo, hi) per block."""
    b = addr >> BLOCK_SHIFT
    while (b << BLOCK_SHIFT) < end:
        yield b, max(addr, b << BLOCK_SHIFT), min(end, (b + 1) << BLOCK_SHIFT)
        b += 1


@dataclass(order=True)
class _Item:
    """A pending range inside one 2 MiB block."""

    key: tuple                      # (priority, op rank, sequence): heap order
    block: int = field(compare=False)
    op: int = field(compare=False)
    dst: int = field(compare=False)
    advice: int = field(compare=False)
    lo: int = field(compare=False)  # byte range [lo, hi) inside the block
    hi: int = field(compare=False)
    ids: list = field(compare=False)      # the commands this item carries out
    t_submit: int = field(compare=False)
    live: bool = field(default=True, compare=False)


class UvmActuator(ActuatorBase):
    """Runs command batches against one target's va_space, asynchronously.

    ``gpu_uuids`` maps our GPU numbers (0..N-1, as the source numbers them) to their 16-byte
    UUIDs; ``cpu_uuid`` is the UUID table's entry 0. ``max_bytes_per_s`` rate-limits data
    movement (0: as fast as the driver goes); ``max_ioctl_bytes`` bounds one ioctl so a
    demand-related command never waits behind a huge migration; ``max_pending_blocks`` bounds
    the queue (the oldest lowest-priority work is dropped and counted, never the newest)."""

    def __init__(self, va_fd: int, gpu_uuids: dict[int, bytes] | Callable[[int], bytes | None],
                 cpu_uuid: bytes = bytes(16), *,
                 io: abi.Ioctl | None = None, pidfd: int = -1, max_bytes_per_s: float = 0.0,
                 max_ioctl_bytes: int = 64 << 20, max_pending_blocks: int = 1 << 16, workers: int = 2,
                 start: bool = True):
        self.va_fd = va_fd
        # a callable lets the source answer from its current UUID table (a GPU the target
        # starts using after attach appears there later)
        self.gpu_uuid = gpu_uuids if callable(gpu_uuids) else dict(gpu_uuids).get
        self.cpu_uuid = bytes(cpu_uuid)
        self.io = io if io is not None else abi.Ioctl()
        self.pidfd = pidfd
        self.rate = float(max_bytes_per_s)
        self.max_ioctl = max(BLOCK_SIZE, int(max_ioctl_bytes))
        self.max_pending = int(max_pending_blocks)
        self._heap: list[_Item] = []
        self._by_block: dict[int, _Item] = {}
        #: blocks inside an ioctl now (a worker's run): no second command for one of them starts
        #: until it returns (see :meth:`_pop_run`)
        self._inflight: set[int] = set()
        self._seq = 0
        lock = threading.Lock()
        super().__init__(lock)
        self._cv = threading.Condition(lock)        # workers wait for work on this one
        self._idle_cv = threading.Condition(lock)   # wait_idle waits on this one
        self._stop = False
        self._busy = 0
        #: invalidator requests sent and not answered yet: their follow-up work (and the
        #: INVALIDATE commands' RESULTs) is still to come, so the actuator is not idle
        self._awaiting = 0
        self._tokens_t = time.monotonic()
        self._tokens = 0.0
        self.gone = False
        #: advice we set, to undo on close: (op advice, lo, length)
        self._advised: dict[tuple[int, int, int], None] = {}
        self.counts = {"submitted": 0, "superseded": 0, "dropped": 0, "ioctls": 0, "ok": 0, "failed": 0,
                       "target_gone": 0, "range_invalid": 0, "skipped": 0}
        self.bytes = {op.name.lower(): 0 for op in Op}
        self.latency_ns = {op.name.lower(): 0 for op in Op}
        self.errors: dict[str, int] = {}
        #: Who carries out INVALIDATE: None = UVM_DISCARD from here (safe only for data nothing
        #: in the program can still use); else a callable (base, length, on_done) -> sent, whose
        #: on_done later gets the ranges it dropped (the program's runtime:
        #: actuators/runtime_discard.py); the victim is then pre-evicted
        self.invalidator: Callable[..., bool] | None = None
        # Two workers by default: a pre-eviction (GPU->host) and a prefetch (host->GPU) use
        # opposite directions of the link and run together; one worker would serialise them
        # (evictions then delayed the prefetches they made room for).
        self._threads = [threading.Thread(target=self._run, name=f"umctl-actuator-{i}", daemon=True)
                         for i in range(max(1, int(workers)))]
        if start:
            for t in self._threads:
                t.start()

    # ------------------------------------------------------------------ submit
    def submit(self, cmds: np.ndarray) -> np.ndarray:
        """Queue a COMMAND batch (never blocks on the driver). Returns the cmd_ids given."""
        if cmds is None or len(cmds) == 0:
            return np.zeros(0, np.int64)
        if cmds.dtype != COMMAND_DTYPE:
            raise TypeError("commands must be a COMMAND batch")
        now = time.monotonic_ns()
        ids = self._new_ids(len(cmds))
        with self._cv:
            for c, cid in zip(cmds, ids.tolist()):
                self.counts["submitted"] += 1
                op, addr, nbytes = int(c["op"]), int(c["addr"]), int(c["bytes"])
                if nbytes <= 0:
                    self._result(cid, Status.SKIPPED, 0, 0)
                    continue
                end = addr + nbytes
                if op == Op.ADVISE:  # advice is a property of the range: one ioctl, unsplit
                    self._push(addr >> BLOCK_SHIFT, op, int(c["dst"]), int(c["advice"]), addr, end,
                               int(c["priority"]), cid, now)
                    continue
                for b, lo, hi in _block_pieces(addr, end):
                    self._push(b, op, int(c["dst"]), int(c["advice"]), lo, hi, int(c["priority"]), cid, now)
            self._trim()
            self._cv.notify()
        return ids

    def _push(self, block, op, dst, advice, lo, hi, prio, cid, now) -> None:
        """``cid``: the command id this item carries out, or a list of them."""
        old = self._by_block.get(block) if op != Op.ADVISE else None
        ids = list(cid) if isinstance(cid, list) else [cid]
        if old is not None and old.live:
            if old.op == op and old.dst == dst:
                # the same intent again: one item covering both ranges, at the more urgent
                # of the two priorities
                old.lo, old.hi = min(old.lo, lo), max(old.hi, hi)
                old.ids.extend(ids)
                if prio >= old.key[0]:
                    return
                lo, hi, ids = old.lo, old.hi, old.ids
                old.live = False
            else:
                # the newer intent for this block wins: a prefetch after a pre-evict (or the
                # other way round) makes the older one pointless
                old.live = False
                self.counts["superseded"] += len(old.ids)
                for i in old.ids:
                    self._result(i, Status.SKIPPED, 0, 0)
        self._seq += 1
        it = _Item((prio, _OP_RANK.get(Op(op), 9), self._seq), block, op, dst, advice, lo, hi, ids, now)
        heapq.heappush(self._heap, it)
        if op != Op.ADVISE:
            self._by_block[block] = it

    def _trim(self) -> None:
        """Bound the queue: the oldest, least urgent prefetches are the stalest predictions,
        so they go first (pre-evictions and invalidations are never dropped)."""
        live = len(self._by_block)
        if live <= self.max_pending:
            return
        victims = sorted((it for it in self._by_block.values() if it.op == Op.PREFETCH),
                         key=lambda it: (-it.key[0], it.key[2]))
        for it in victims[: live - self.max_pending]:
            it.live = False
            del self._by_block[it.block]
            self.counts["dropped"] += len(it.ids)
            for i in it.ids:
                self._result(i, Status.SKIPPED, 0, 0)

    # ------------------------------------------------------------------ worker
    def _pop_run(self) -> list[_Item]:
        """The next item, plus the queued items that continue it contiguously with the same
        op and destination (one ioctl for the whole run, up to max_ioctl_bytes).

        An item whose block is inside another worker's ioctl waits for it: two ioctls on one
        block from two workers run in either order, and a pre-eviction queued while a prefetch of
        the block is in flight could run first and be undone by it -- the block back on the GPU,
        the budget keeper's estimate (which took it out when it queued the eviction) none the
        wiser, and no fault ever to tell it (tests/test_actuator_uvm.py)."""
        waiting: list[_Item] = []
        first = None
        while self._heap:
            it = heapq.heappop(self._heap)
            if not it.live:
                continue
            if it.op != Op.ADVISE and it.block in self._inflight:
                waiting.append(it)
                continue
            first = it
            break
        for it in waiting:
            heapq.heappush(self._heap, it)
        if first is None:
            return []
        first.live = False
        if self._by_block.get(first.block) is first:
            del self._by_block[first.block]
        run = [first]
        if first.op == Op.ADVISE:
            return run
        while run[-1].hi - first.lo < self.max_ioctl and run[-1].hi % BLOCK_SIZE == 0:
            nxt = self._by_block.get(run[-1].block + 1)
            if (nxt is None or not nxt.live or nxt.op != first.op or nxt.dst != first.dst
                    or nxt.lo != run[-1].hi or nxt.key[0] != first.key[0] or nxt.block in self._inflight):
                break
            nxt.live = False
            del self._by_block[nxt.block]
            run.append(nxt)
        self._inflight.update(it.block for it in run if it.op != Op.ADVISE)
        return run

    def _run(self) -> None:
        # Idle workers only wait: waking each other on every pass (notify_all from an idle
        # worker) made two idle workers ping-pong and starved the control loop of the GIL
        # (docs/evaluation/live-control.md, the layer loop).
        while True:
            with self._cv:
                while True:
                    if self._stop:
                        self._idle_cv.notify_all()
                        return
                    run = self._pop_run() if self._live_any() else []
                    if run:
                        break
                    # nothing, or only work waiting for a block in flight: sleep until a
                    # worker finishes or work comes
                    self._idle_cv.notify_all()
                    self._cv.wait()
                self._busy += 1
                if self._live_any():
                    self._cv.notify()   # more work: let another worker take it
            try:
                self._execute(run)
            finally:
                with self._cv:
                    self._busy -= 1
                    self._inflight.difference_update(it.block for it in run if it.op != Op.ADVISE)
                    if self._live_any():
                        self._cv.notify()   # work that waited for these blocks may go now
                    elif not self._busy:
                        self._idle_cv.notify_all()

    def _live_any(self) -> bool:
        while self._heap and not self._heap[0].live:
            heapq.heappop(self._heap)
        return bool(self._heap)

    def _throttle(self, nbytes: int) -> None:
        if self.rate <= 0:
            return
        now = time.monotonic()
        self._tokens = min(self.rate * 0.05, self._tokens + (now - self._tokens_t) * self.rate)
        self._tokens_t = now
        self._tokens -= nbytes
        if self._tokens < 0:
            time.sleep(-self._tokens / self.rate)

    def _execute(self, run: list[_Item]) -> None:
        first = run[0]
        lo, hi = first.lo, run[-1].hi
        op = Op(first.op)
        evicted = -1   # INVALIDATE through the invalidator: bytes pre-evicted here at once
        deferred = False   # ... whose results come with its follow-up pre-eviction
        if self.gone:
            status, moved, lat = Status.TARGET_GONE, 0, 0
        else:
            if op in (Op.PREFETCH, Op.PREEVICT):
                self._throttle(hi - lo)
            t0 = time.monotonic_ns()
            if op == Op.INVALIDATE and self.invalidator is not None:
                status, evicted, deferred = self._invalidate_elsewhere(lo, hi, run)
            else:
                status = self._ioctl(op, first.dst, first.advice, lo, hi - lo)
            lat = time.monotonic_ns() - t0
            moved = hi - lo if status == Status.OK and op != Op.ADVISE else 0
        with self._cv:
            self.counts["ioctls"] += 1
            name = op.name.lower()
            if evicted >= 0:   # what is dropped is counted when the runtime answers
                self.bytes["preevict"] += evicted
                moved = 0
            self.bytes[name] += moved
            self.latency_ns[name] += lat
            for it in ([] if deferred else run):
                for i, cid in enumerate(it.ids):  # bytes counted once, on the item's first command
                    self._result(cid, status, (it.hi - it.lo) if moved and i == 0 else 0, lat)

    def _invalidate_elsewhere(self, lo: int, hi: int, run: list[_Item]) -> tuple[Status, int, bool]:
        """INVALIDATE through ``invalidator`` (the program's runtime), without waiting for it.
        When it has answered, the whole victim is queued here as a pre-eviction: what the runtime
        dropped then moves to the CPU without a copy, what it kept (in use, its last kernel still
        queued, ...) with its data, so the victim leaves the GPU either way and no live data is
        lost -- unless a newer command for a block is queued by then (the newer intent wins, as
        in :meth:`submit`). Why evict what was dropped: left unmapped and resident nowhere, a
        dropped block's next use is populated by the GPU fault by fault, which cost more than the
        invalidation saved (docs/evaluation/live-control.md has the H100 figures). No request possible:
        everything is pre-evicted at once. Returns (status, bytes pre-evicted now, whether the
        commands' results wait for the follow-up).

        The INVALIDATE commands' RESULTs are those of the follow-up pre-eviction, sent when it is
        done: only then has the block surely left the GPU. The driver reports no migration for
        the pages the runtime dropped, so that RESULT is the budget check's only evidence that
        they left (``umctl/loop/budget_check.py``); a RESULT at the request would have said so
        before it was true, and none at all (as before) kept them resident in the check for the
        rest of the run. A newer command for the block that wins over the follow-up answers
        SKIPPED: the block stays where that command puts it."""
        ids_by_block = {it.block: list(it.ids) for it in run}
        called = []

        def answered(done: list[tuple[int, int]]) -> None:
            now = time.monotonic_ns()
            with self._cv:
                called.append(True)
                self._awaiting -= 1
                self._idle_cv.notify_all()
                if self._stop:   # closed meanwhile: nothing runs the follow-up any more
                    return
                self.bytes["invalidate"] += sum(n for _, n in done)
                for b, s_, e_ in _block_pieces(lo, hi):
                    ids = ids_by_block.get(b) or [-1]
                    old = self._by_block.get(b)
                    if old is None or not old.live or (old.op == Op.PREEVICT and old.dst == CPU):
                        self._push(b, Op.PREEVICT, CPU, 0, s_, e_, 0, ids, now)
                    else:
                        for i in ids:
                            self._result(i, Status.SKIPPED, 0, 0)
                self._cv.notify()

        with self._cv:
            self._awaiting += 1   # before the request: its answer may come at once
        try:
            sent = self.invalidator(lo, hi - lo, answered)
        except Exception as e:   # never fatal: keep the data, evict it
            self._fail(f"invalidator: {type(e).__name__}: {e}", Status.FAILED)
            sent = False
        if sent:
            return Status.OK, 0, True
        with self._cv:
            if not called:
                self._awaiting -= 1
        return self._ioctl(Op.PREEVICT, CPU, 0, lo, hi - lo), hi - lo, False

    def _ioctl(self, op: Op, dst: int, advice: int, base: int, length: int) -> Status:
        try:
            if op in (Op.PREFETCH, Op.PREEVICT):
                uuid = self.cpu_uuid if dst == CPU else self.gpu_uuid(dst)
                if uuid is None:
                    return self._fail(f"no GPU {dst} in the target's processor table", Status.FAILED)
                p = abi.MigrateParams(base=base, length=length, cpuNumaNode=-1)
                C.memmove(p.destinationUuid.uuid, uuid, 16)
                st = self.io.ioctl(self.va_fd, abi.UVM_MIGRATE, p)
            elif op == Op.INVALIDATE:
                st = self.io.ioctl(self.va_fd, abi.UVM_DISCARD,
                                   abi.DiscardParams(base=base, length=length, flags=abi.UVM_DISCARD_FLAGS_UNMAP))
            else:
                st = self._advise(Advice(advice), dst, base, length)
        except OSError as e:
            if e.errno in (errno.ESRCH, errno.EBADF) or self._target_exited():
                return self._gone()
            return self._fail(f"{abi.errno_name(e)}", Status.FAILED)
        if st == abi.NV_OK:
            self.counts["ok"] += 1
            return Status.OK
        if self._target_exited():
            return self._gone()
        if st == 0x1E:  # NV_ERR_INVALID_ADDRESS: the range was freed or is not managed
            self.counts["range_invalid"] += 1
            return self._fail(abi.nv_status_name(st), Status.RANGE_INVALID)
        return self._fail(abi.nv_status_name(st), Status.FAILED)

    def _advise(self, advice: Advice, dst: int, base: int, length: int) -> int:
        if advice == Advice.PREFERRED_LOCATION:
            uuid = self.cpu_uuid if dst == CPU else (self.gpu_uuid(dst) or bytes(16))
            p = abi.PreferredLocationParams(requestedBase=base, length=length, preferredCpuNumaNode=-1)
            C.memmove(p.preferredLocation.uuid, uuid, 16)
            st = self.io.ioctl(self.va_fd, abi.UVM_SET_PREFERRED_LOCATION, p)
            if st == abi.NV_OK:
                self._advised[(int(Advice.PREFERRED_LOCATION), base, length)] = None
            return st
        if advice == Advice.READ_MOSTLY:
            st = self.io.ioctl(self.va_fd, abi.UVM_ENABLE_READ_DUPLICATION, abi.RangeParams(requestedBase=base, length=length))
            if st == abi.NV_OK:
                self._advised[(int(Advice.READ_MOSTLY), base, length)] = None
            return st
        if advice == Advice.UNSET_PREFERRED_LOCATION:
            self._advised.pop((int(Advice.PREFERRED_LOCATION), base, length), None)
            return self.io.ioctl(self.va_fd, abi.UVM_UNSET_PREFERRED_LOCATION, abi.RangeParams(requestedBase=base, length=length))
        if advice == Advice.UNSET_READ_MOSTLY:
            self._advised.pop((int(Advice.READ_MOSTLY), base, length), None)
            return self.io.ioctl(self.va_fd, abi.UVM_DISABLE_READ_DUPLICATION, abi.RangeParams(requestedBase=base, length=length))
        return abi.NV_OK

    def _target_exited(self) -> bool:
        if self.pidfd < 0:
            return False
        try:
            return self.io.process_exited(self.pidfd)
        except OSError:
            return True

    def _gone(self) -> Status:
        self.gone = True
        self.counts["target_gone"] += 1
        return Status.TARGET_GONE

    def _fail(self, why: str, status: Status) -> Status:
        self.counts["failed"] += 1
        self.errors[why] = self.errors.get(why, 0) + 1
        return status

    def _result(self, cmd_id: int, status: Status, nbytes: int, latency_ns: int) -> None:
        if cmd_id < 0:   # our own follow-up work (what an invalidator kept), no command of the caller's
            return
        self._result_row(cmd_id, status, nbytes, latency_ns)
        if status == Status.SKIPPED:
            self.counts["skipped"] += 1

    # ------------------------------------------------------------------ results / lifecycle
    def _pending_locked(self) -> int:
        return sum(1 for it in self._heap if it.live) + self._awaiting

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Block until the queue is empty and nothing is executing (tests, detach)."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while self._busy or self._live_any() or self._awaiting:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle_cv.wait(left)
        return True

    def stats(self) -> dict:
        with self._cv:
            extra = {"invalidator": self.invalidator.stats()} if hasattr(self.invalidator, "stats") else {}
            return {**extra, "counts": dict(self.counts), "bytes": dict(self.bytes),
                    "latency_ms": {k: round(v / 1e6, 2) for k, v in self.latency_ns.items()},
                    "errors": dict(self.errors), "pending": self._pending_locked(),
                    "advice_set": len(self._advised)}

    def close(self, drain: bool = False, timeout: float = 5.0) -> None:
        """Stop the worker (after the queue empties if ``drain``), then undo the advice set
        through this actuator so the target is left as it was. Pending work is dropped."""
        if drain:
            self.wait_idle(timeout)
        with self._cv:
            for it in self._heap:
                if it.live:
                    it.live = False
                    self.counts["dropped"] += len(it.ids)
            self._heap.clear()
            self._by_block.clear()
            self._stop = True
            self._cv.notify_all()
            self._idle_cv.notify_all()
        for t in self._threads:
            if t.is_alive():
                t.join(timeout)
        if not self.gone:
            for (advice, base, length) in list(self._advised):
                undo = Advice.UNSET_PREFERRED_LOCATION if advice == Advice.PREFERRED_LOCATION else Advice.UNSET_READ_MOSTLY
                try:
                    self._advise(undo, CPU, base, length)
                except OSError:
                    pass
        self._advised.clear()
