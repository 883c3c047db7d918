"""Actuator ``stream``: the controller's prefetches and pre-evictions executed *in stream order*
inside the program, by the in-process runtime (``umctl run --runtime --actuator stream``).

Why a second actuator: the ``uvm`` actuator migrates from outside the process, racing the GPU.
On the H100 torch loop under a budget the GPU reached the next kernel before umctl's migrations
for it were done and faulted on them whatever DeepUM predicted; a launch gate that made the GPU
wait on umctl cost more than it saved (docs/control.md). The runtime instead enqueues each
command as ``cuMemPrefetchAsync`` on the launching stream, before the next kernel: that kernel
cannot start before the data it was given is in, and an eviction cannot run before the kernels
queued ahead of it are done. Nothing on the GPU waits for umctl, so a dead umctl costs nothing.

The channel is a memfd the program inherits (``struct umrt_cmdq`` in runtime/umctl_rt.h): a
header and a ring that umctl alone writes (entries, then ``head``) and the runtime alone
consumes (status, then ``tail``). The queue in front of it is the ``uvm`` actuator's (keyed by
2 MiB block, a newer intent replaces a pending one, priorities, contiguous blocks coalesced to
one range of up to 64 MiB); what cannot run in stream order -- invalidation (UVM_DISCARD) and
advice -- still goes through the target's va_space as with ``uvm``.

A RESULT's ``latency_ns`` here is how long a command waited in the ring for the program's next
launch, and ``bytes`` what was enqueued: the transfer itself runs later, on the GPU's clock.
"""

from __future__ import annotations

import mmap
import os
import time

import numpy as np

from .. import UmctlError
from ..events.schema import Op, Status
from ..units import CPU
from .uvm import UvmActuator, _Item

#: struct umrt_cmdq (runtime/umctl_rt.h)
HEADER_DTYPE = np.dtype([("head", "<u8"), ("tail", "<u8"), ("cap", "<u8"), ("closed", "<u8"),
                         ("batches", "<u8"), ("lead_waits", "<u8"), ("lead_wait_ns", "<u8"),
                         ("lead_timeouts", "<u8"), ("acked", "<u8"), ("sync_waits", "<u8"),
                         ("sync_wait_ns", "<u8"), ("sync_timeouts", "<u8"), ("pad", "<u8", (4,))])
#: struct umrt_cmd
CMD_DTYPE = np.dtype([("addr", "<u8"), ("bytes", "<u8"), ("dst", "<i4"), ("status", "<i4"),
                      ("cmd_id", "<i8"), ("t_submit_ns", "<i8"), ("t_done_ns", "<i8"), ("seq", "<i8")])
assert HEADER_DTYPE.itemsize == 128 and CMD_DTYPE.itemsize == 56   # _Static_assert-ed in umctl_rt.h
PENDING, ENQUEUED, REFUSED, NO_DRIVER = -1, 0, 1, 2


class CommandQueue:
    """umctl's end of the shared ring. ``fd`` goes to the program (``pass_fds``) and its number
    into ``UMCTL_RT_CMD_FD``. Writes are plain stores in program order -- entries before
    ``head`` -- which x86-64 keeps in order for the reader (the runtime loads ``head`` with
    acquire semantics)."""

    def __init__(self, capacity: int = 1 << 14):
        if capacity < 1:
            raise UmctlError("the command ring needs at least one entry")
        size = HEADER_DTYPE.itemsize + capacity * CMD_DTYPE.itemsize
        try:
            self.fd = os.memfd_create("umctl-cmdq", 0)
            os.ftruncate(self.fd, size)
        except (AttributeError, OSError) as e:
            raise UmctlError(f"cannot create the in-stream command ring (memfd): {e}") from None
        self._mm = mmap.mmap(self.fd, size)
        self.hdr = np.frombuffer(self._mm, HEADER_DTYPE, 1)
        self.ring = np.frombuffer(self._mm, CMD_DTYPE, capacity, HEADER_DTYPE.itemsize)
        self.hdr["cap"] = capacity
        self.capacity = capacity
        self.reported = 0   # entries whose outcome umctl has read
        self.written = 0    # entries written (published up to ``head``)
        self._closed = False

    @property
    def head(self) -> int:
        return int(self.hdr["head"][0])

    @property
    def tail(self) -> int:
        return int(self.hdr["tail"][0])

    def room(self) -> int:
        return self.capacity - (self.written - self.reported)

    def put(self, addr: int, nbytes: int, dst: int, cmd_id: int, now_ns: int) -> int:
        """Write one entry (the caller checked :meth:`room`); it is the runtime's once
        :meth:`publish` has run. Returns its index."""
        i = self.written
        self.written += 1
        e = self.ring[i % self.capacity]
        e["addr"], e["bytes"], e["dst"], e["status"] = addr, nbytes, dst, PENDING
        e["cmd_id"], e["t_submit_ns"], e["t_done_ns"], e["seq"] = cmd_id, now_ns, 0, -1
        return i

    def publish(self) -> None:
        self.hdr["head"] = self.written

    def ack(self, launches: int) -> None:
        """umctl has planned from the reports of the first ``launches`` launches (with
        UMCTL_RT_CMD_SYNC_US the runtime's next launch waits for this, on the host)."""
        if not self._closed and launches > int(self.hdr["acked"][0]):
            self.hdr["acked"] = launches

    def taken(self) -> np.ndarray:
        """Entries the runtime took since the last call (copies, in ring order)."""
        t = min(self.tail, self.head)
        if t <= self.reported:
            return self.ring[:0].copy()
        idx = np.arange(self.reported, t) % self.capacity
        self.reported = t
        return self.ring[idx].copy()

    def runtime_stats(self) -> dict:
        h = self.hdr[0]
        return {"batches": int(h["batches"]), "lead_waits": int(h["lead_waits"]),
                "lead_wait_ms": round(int(h["lead_wait_ns"]) / 1e6, 1), "lead_timeouts": int(h["lead_timeouts"]),
                "sync_waits": int(h["sync_waits"]), "sync_wait_ms": round(int(h["sync_wait_ns"]) / 1e6, 1),
                "sync_timeouts": int(h["sync_timeouts"])}

    @property
    def closed(self) -> bool:
        return self._closed

    def stop(self) -> None:
        """Tell the runtime to take nothing more."""
        if not self._closed:
            self.hdr["closed"] = 1
            time.sleep(0.002)   # a launch that read ``closed`` just before may still be taking entries

    def close(self) -> range:
        """Let go of the ring (after :meth:`stop`); returns the indices of the entries the
        runtime never took."""
        if self._closed:
            return range(0)
        self._closed = True
        left = range(min(self.tail, self.head), self.head)
        self.hdr = self.hdr.copy()   # what it said stays readable
        self.ring = self.ring.copy()
        try:
            self._mm.close()
        except BufferError:   # a caller still holds a view: the mapping goes with the last one
            pass
        os.close(self.fd)
        return left


class StreamActuator(UvmActuator):
    """The ``uvm`` actuator's queue, drained synchronously into the in-stream ring on every
    submit (the program takes the entries at its next launch). Invalidations and advice run
    through the va_space exactly as in :class:`UvmActuator`."""

    def __init__(self, queue: CommandQueue, va_fd: int, gpu_uuids, cpu_uuid: bytes = bytes(16), *,
                 evict_in_stream: bool = True, **kw):
        #: ``evict_in_stream`` False: pre-evictions go through the va_space from umctl's own
        #: workers (as with ``uvm``), overlapping the GPU's work, and only prefetches go in stream
        #: order (the controller then keeps every queued kernel's blocks: stream_position)
        self.out = None if evict_in_stream else UvmActuator(va_fd, gpu_uuids, cpu_uuid, **kw)
        kw["workers"], kw["start"] = 1, False   # no worker thread: submit() drains the queue itself
        super().__init__(va_fd, gpu_uuids, cpu_uuid, **kw)
        self.q = queue
        self._carried: dict[int, list[tuple[int, int]]] = {}   # ring index -> [(cmd_id, bytes)]
        self.counts.update({"in_stream": 0, "refused": 0})

    def submit(self, cmds: np.ndarray) -> np.ndarray:
        if self.out is not None and cmds is not None and len(cmds):
            away = cmds["op"] == Op.PREEVICT
            if away.any():   # one cmd_id space: the two queues number in turn
                ids = np.empty(len(cmds), np.int64)
                self.out._next_id = self._next_id
                ids[away] = self.out.submit(cmds[away])
                self._next_id = self.out._next_id
                ids[~away] = self.submit(cmds[~away]) if (~away).any() else []
                return ids
        ids = super().submit(cmds)
        runs = []
        with self._cv:
            while True:
                run = self._pop_run()
                if not run:
                    break
                runs.append(run)
        for run in runs:
            op, dst = Op(run[0].op), run[0].dst
            if self.q.closed:
                self._drop(run)
            elif op == Op.PREFETCH or (op == Op.PREEVICT and dst == CPU):
                self._enqueue(run)
            else:
                # UVM_DISCARD, advice, and evictions into a neighbour GPU (the runtime knows
                # only its own context's GPU) go through the va_space
                self._execute(run)
        if not self.q.closed:
            self.q.publish()
        return ids

    def _drop(self, run: list[_Item]) -> None:
        with self._cv:
            for it in run:
                self.counts["dropped"] += len(it.ids)
                for cid in it.ids:
                    self._result(cid, Status.SKIPPED, 0, 0)

    def _enqueue(self, run: list[_Item]) -> None:
        if self.q.room() <= 0:   # the program has not launched for a while: newer work is dropped
            self._drop(run)
            return
        lo, hi = run[0].lo, run[-1].hi
        i = self.q.put(lo, hi - lo, run[0].dst, run[0].ids[0], run[0].t_submit)
        self._carried[i] = [(cid, (it.hi - it.lo) if k == 0 else 0) for it in run for k, cid in enumerate(it.ids)]

    def results(self) -> np.ndarray:
        self._collect()
        r = super().results()
        if self.out is not None:
            o = self.out.results()
            if len(o):
                r = np.concatenate([r, o]) if len(r) else o
        return r

    def _collect(self) -> None:
        """The outcomes of the entries the program took since the last call."""
        if self.q.closed:
            return
        taken = self.q.taken()
        base = self.q.reported - len(taken)
        with self._cv:
            for k, e in enumerate(taken):
                self._outcome(base + k, e)

    def _outcome(self, index: int, e) -> None:
        carried = self._carried.pop(index, [])
        st = int(e["status"])
        status = Status.OK if st == ENQUEUED else (Status.FAILED if st == REFUSED else Status.SKIPPED)
        lat = max(0, int(e["t_done_ns"]) - int(e["t_submit_ns"]))
        if status == Status.OK:
            self.counts["ok"] += 1
            self.counts["in_stream"] += 1
            name = "prefetch" if int(e["dst"]) >= 0 else "preevict"
            self.bytes[name] += int(e["bytes"])
            self.latency_ns[name] += lat
        elif status == Status.FAILED:
            self.counts["refused"] += 1
            self._fail("cuMemPrefetchAsync refused", Status.FAILED)
        for cid, nbytes in carried:
            self._result(cid, status, nbytes if status == Status.OK else 0, lat)

    def stats(self) -> dict:
        s = super().stats()
        if self.out is not None:   # what umctl's own workers did, counted in the same totals
            o = self.out.stats()
            for part in ("counts", "bytes", "latency_ms", "errors"):
                for k, v in o.get(part, {}).items():
                    s[part][k] = s[part].get(k, 0) + v
        s["in_stream"] = self.q.runtime_stats()
        return s

    def close(self, drain: bool = False, timeout: float = 5.0) -> None:
        """Stop the program taking commands; what it never took is reported as dropped (the
        program is left as it was: nothing umctl asked for runs after this)."""
        self.q.stop()
        self._collect()
        untaken = self.q.close()
        with self._cv:
            for i in untaken:
                for cid, _ in self._carried.pop(i, []):
                    self.counts["dropped"] += 1
                    self._result(cid, Status.SKIPPED, 0, 0)
        if self.out is not None:
            self.out.close(drain=drain, timeout=timeout)
        super().close(drain=False, timeout=timeout)
