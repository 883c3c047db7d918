"""The launch gate: umctl holds a kernel on the GPU until the blocks it will touch have landed.

Why: under a soft budget the working set must stream through the link every step, and on the
H100 a GPU->host eviction runs at ~17.6 GB/s while a GEMM of the torch loop computes in ~1.5 ms
on ~136 MB. Whatever the prefetcher predicts, the GPU reaches the next kernel before its blocks
are in and faults on them: without a way to make the GPU wait, "late" is the steady state. The
in-process runtime (``UMCTL_RT_GATE_FD``) enqueues ``cuStreamWaitValue64(&release >= seq)``
before each reported launch, so the kernel waits *on the GPU*; the host keeps queueing, and
umctl sees those launches before they run (:class:`GateKeeper` keeps them in order).

The page (``struct umrt_gate`` in runtime/umctl_rt.h) is a memfd the child inherits: umctl
writes ``release`` and ``heartbeat_ns``; the runtime's watchdog opens the gate for good when
the heartbeat goes stale (umctl killed or hung), so the program never waits on a dead umctl.
"""

from __future__ import annotations

import mmap
import os
import time
from collections import deque

import numpy as np

from .. import UmctlError

#: release value meaning "everything may run" (runtime/umctl_rt.h UMRT_GATE_OPEN)
OPEN = 1 << 62
RELEASE, HEARTBEAT, OPENED, GATED = range(4)


class Gate:
    """umctl's side of the shared page. ``fd`` goes to the child (``pass_fds``)."""

    def __init__(self) -> None:
        try:
            self.fd = os.memfd_create("umctl-gate", 0)
        except (AttributeError, OSError) as e:
            raise UmctlError(f"cannot create the launch gate (memfd): {e}") from None
        os.ftruncate(self.fd, mmap.PAGESIZE)
        self._mm = mmap.mmap(self.fd, mmap.PAGESIZE)
        self._w = np.frombuffer(self._mm, np.uint64, 4)   # aligned 8-byte words: single stores
        self.beat()

    def beat(self, now_ns: int | None = None) -> None:
        self._w[HEARTBEAT] = time.monotonic_ns() if now_ns is None else now_ns

    @property
    def release_seq(self) -> int:
        return int(self._w[RELEASE])

    def release(self, seq: int) -> None:
        """Let launches up to ``seq`` start (never lowers the gate)."""
        if seq > int(self._w[RELEASE]):
            self._w[RELEASE] = seq

    def open(self) -> None:
        """Let everything run, now and later (umctl stops controlling)."""
        self._w[RELEASE] = OPEN

    @property
    def opened_by_runtime(self) -> bool:
        return bool(self._w[OPENED])

    @property
    def gated(self) -> int:
        """How many launches the runtime has made wait (highest gated seq + 1)."""
        return int(self._w[GATED])

    def close(self) -> None:
        """Open the gate and let go of the page (what it said stays readable)."""
        if self._mm.closed:
            return
        self.open()
        self._w = self._w.copy()
        self._mm.close()
        os.close(self.fd)


class GateKeeper:
    """Releases queued launches in order once the controller's blocks for them have landed.

    ``blocks_for(exec_hash)`` (the controller's :meth:`~umctl.controller.base.Controller.gate_blocks`)
    says which 2 MiB blocks a kernel will touch, or None when it has no prediction (such a kernel
    is released at once). ``landed(block)`` says whether a block is on the GPU with no prefetch
    of it in flight. A kernel held ``hold_ns`` after the one before it started is released
    anyway (counted as a timeout): a prediction that cannot be met must not stall the program."""

    def __init__(self, gate: Gate, *, hold_ms: float = 25.0):
        if hold_ms <= 0:
            raise UmctlError("--gate-hold must be more than 0 ms")
        self.gate = gate
        self.hold_ns = int(hold_ms * 1e6)
        self.queue: deque[tuple[int, int]] = deque()   # (seq, exec_hash) queued, not released
        self.started = -1           # highest seq known to have started on the GPU
        self._pred_started = 0      # when ``started`` last moved
        self._head: tuple[int, int] | None = None   # (seq, when it became the first held launch)
        self.stats = {"queued": 0, "released": 0, "ready": 0, "unpredicted": 0, "timeouts": 0}

    def queued(self, launches: np.ndarray) -> None:
        """Launch reports as the host made them (before the kernels ran)."""
        for seq, h in zip(launches["seq"].tolist(), launches["exec_hash"].tolist()):
            if seq > self.gate.release_seq:
                self.queue.append((seq, h))
                self.stats["queued"] += 1

    def started_upto(self, seq: int, now_ns: int) -> None:
        """Kernels up to ``seq`` are known to have started on the GPU."""
        if seq <= self.started:
            return
        self.started = seq
        self._pred_started = now_ns
        while self.queue and self.queue[0][0] <= seq:   # released already, or the runtime opened the gate
            self.queue.popleft()

    def step(self, now_ns: int, blocks_for, landed, held=None) -> None:
        q = self.queue
        while q:
            seq, h = q[0]
            need = blocks_for(h)
            if need is None:
                self.stats["unpredicted"] += 1
            elif all(landed(b) for b in need):
                self.stats["ready"] += 1
            else:
                if self._head is None or self._head[0] != seq:
                    self._head = (seq, now_ns)
                    if held is not None:
                        held(h)
                # the hold counts from its predecessor's start (from when it became the head if
                # that start is not known yet, with more patience: the report may be late)
                if self.started >= seq - 1:
                    if now_ns - max(self._head[1], self._pred_started) < self.hold_ns:
                        break
                elif now_ns - self._head[1] < 10 * self.hold_ns:
                    break
                self.stats["timeouts"] += 1
            q.popleft()
            self.gate.release(seq)
            self.stats["released"] += 1
        self.gate.beat(now_ns)
