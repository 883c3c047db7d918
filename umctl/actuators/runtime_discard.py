"""Invalidation carried out by the program's own runtime: the only safe way to drop the
contents of freed allocator blocks live.

A UVM_DISCARD issued from umctl's thread is ordered with nothing in the program: the host frees a
tensor right after *launching* the last kernel that reads it, and the allocator may hand the block
out again before the discard lands (measured on the H100: it changed a torch loop's trained
parameters). The runtime (``runtime/umctl_rt.c``, ``UMCTL_RT_CONTROL=1``) sees both: it discards
under its cache lock, only blocks still cached, only once an event recorded on the freeing stream
has completed. umctl asks over the runtime's socket and is told what was dropped; the ``uvm``
actuator then pre-evicts the victim (the dropped pages move without a copy, the rest with their
data), so a victim always leaves the GPU and no live data is lost."""

from __future__ import annotations

import threading
from typing import Callable

import numpy as np

from ..runtime import DISCARDED, KEPT_REASONS


class RuntimeDiscard:
    """The ``uvm`` actuator's invalidator for a program started under the runtime:
    ``(base, length, on_done) -> bool``. Sends the request and returns at once (True); the
    answer arrives on the runtime source's thread and ``on_done`` gets the ranges dropped
    (``[(addr, bytes), ...]``; empty when the runtime did not answer within ``timeout`` s).
    False: no request went out (no control channel yet), nothing was dropped. ``uvm_fd`` is the
    program's va_space fd number (the one the tools-API source borrowed)."""

    def __init__(self, source, pid: int, uvm_fd: int, timeout: float = 0.5):
        self.source = source
        self.pid = int(pid)
        self.uvm_fd = int(uvm_fd)
        self.timeout = float(timeout)
        self._lock = threading.Lock()
        self.requests = 0
        self.unanswered = 0
        self.discarded_bytes = 0
        self.kept_bytes = {why: 0 for why in KEPT_REASONS.values()}

    def __call__(self, base: int, length: int, on_done: Callable[[list[tuple[int, int]]], None]) -> bool:
        def answer(r: np.ndarray | None) -> None:
            done = [] if r is None else [(int(a), int(n)) for a, n, s in zip(r["addr"], r["bytes"], r["status"])
                                         if s == DISCARDED]
            on_done(done)   # first: once the stats show the answer, its follow-up work is queued
            with self._lock:
                if r is None:
                    self.unanswered += 1
                    return
                self.discarded_bytes += sum(n for _, n in done)
                for n, s in zip(r["bytes"].tolist(), r["status"].tolist()):
                    if s != DISCARDED and s in KEPT_REASONS:
                        self.kept_bytes[KEPT_REASONS[s]] += n

        sent = self.source.discard_async(self.pid, base, length, self.uvm_fd, answer, self.timeout)
        with self._lock:
            self.requests += sent
        return sent

    def stats(self) -> dict:
        with self._lock:
            return {"requests": self.requests, "unanswered": self.unanswered,
                    "discarded_bytes": self.discarded_bytes, "kept_bytes": dict(self.kept_bytes)}


__all__ = ["RuntimeDiscard"]
