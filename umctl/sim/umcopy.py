"""Asynchronous chunked copies into managed memory: the copy mechanism of HUM (PPoPP'20 §4.4-4.6).

A runtime that turns ``cudaMemcpy`` host->device copies into Unified Memory migrations does not
move the buffer as one DMA. It splits the copy into 2 MiB chunks (the most the driver's page
migration function moves at a time, §4.4), stages each chunk from the source host buffer into
the host side of the managed destination with a pool of threads (§4.5: the copy happens twice,
that is HUM's cost), and queues the chunk's migration on a *page-migration queue* of its own
copy command. One page-migration thread serves the non-empty queues round-robin, one chunk
(one synchronous migration) at a time (§4.6), so the first chunks of every copy issued back to
back arrive early, which is what lets a kernel that reads a slice of each buffer start work.

This module only schedules: it computes, per chunk, when it is staged and when its migration
starts and ends. The simulator (``engine.Simulator._um_copy``) owns the page state: each chunk
is one in-flight transfer entry, so a GPU access to a page whose chunk has not arrived faults
and waits for the chunk, and a host write to a source page not yet staged waits for it (the
runtime's write protection, §4.2). Because a later copy joins the round-robin, chunks of earlier
copies that had not started by then are rescheduled: ``issue`` first commits every migration
that started before the new copy's initiation (nothing the simulator has already observed
changes; see ``issue``) and then reschedules the rest, rewriting their entries' completion times.

Simplifications: staging is one first-come first-served pipe at the pool's aggregate rate;
the migrations of one GPU are serial and do not compete with that GPU's demand faults for the
link; a chunk's migration cost is the command start-up plus bytes over the prefetch rate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..units import BLOCK_SIZE


@dataclass
class ChunkedCopy:
    """One copy command's page-migration queue."""

    cid: int
    gpu: int
    init_ns: float                 # initiation: chunks queued, target pages unmapped
    chunk_bytes: np.ndarray        # bytes of each chunk
    staged_ns: np.ndarray          # when each chunk's staging (source read) ended
    entries: np.ndarray            # the simulator's transfer entry of each chunk
    start_ns: np.ndarray = field(default=None)  # migration start of each chunk (nan: not yet scheduled)
    done_ns: np.ndarray = field(default=None)
    committed: int = 0             # chunks whose schedule is final (a prefix: each queue is FIFO)
    #: when each chunk may migrate: staged, and its destination chunk free of the copies out of
    #: it (a chunk taken from an evicted block waits for that block's write-back)
    avail_ns: np.ndarray = field(default=None)

    def __post_init__(self) -> None:
        n = len(self.chunk_bytes)
        if self.avail_ns is None:
            self.avail_ns = self.staged_ns
        if self.start_ns is None:
            self.start_ns = np.full(n, np.nan)
        if self.done_ns is None:
            self.done_ns = np.full(n, np.nan)

    @property
    def n(self) -> int:
        return len(self.chunk_bytes)

    @property
    def end_ns(self) -> float:
        """When the last chunk arrives (final once every chunk is committed)."""
        return float(np.nanmax(self.done_ns)) if self.n else self.init_ns


def chunk_sizes(nbytes: int, chunk: int = BLOCK_SIZE) -> np.ndarray:
    """2 MiB pieces of a copy (the last one takes the remainder)."""
    n = max(1, -(-int(nbytes) // chunk))
    sizes = np.full(n, chunk, np.int64)
    sizes[-1] = int(nbytes) - chunk * (n - 1)
    return sizes


class ChunkedCopies:
    """Staging pool and page-migration thread of one GPU."""

    def __init__(self, *, stage_Bps: float, migrate_Bps: float, latency_ns: float,
                 set_done: Callable[[int, float], None] | None = None):
        self.stage_Bps = float(stage_Bps)
        self.migrate_Bps = float(migrate_Bps)
        self.latency_ns = float(latency_ns)
        self.set_done = set_done
        self.copies: list[ChunkedCopy] = []     # every copy issued, in order
        self._live: list[ChunkedCopy] = []      # queues with uncommitted chunks, in creation order
        self._stage_tail = 0.0
        self._pmt_free = 0.0                    # when the migration thread finished its last committed chunk
        self._rr_last = -1                      # cid of the queue served last (round-robin pointer)

    def migrate_ns(self, nbytes: float) -> float:
        """One synchronous migration of a chunk by the driver."""
        return self.latency_ns + nbytes / self.migrate_Bps * 1e9

    def issue(self, gpu: int, init_ns: float, nbytes: int, entries: np.ndarray,
              dest_ready_ns: np.ndarray | None = None) -> ChunkedCopy:
        """A copy initiated at ``init_ns`` with one transfer entry per chunk (``dest_ready_ns``:
        when each chunk's destination memory is free to be written, default at once). Migrations
        that began before ``init_ns`` keep their schedule (the new queue cannot have taken their
        turn); the rest are rescheduled with the new queue in the rotation. Callers issue in
        non-decreasing ``init_ns`` (program order on the host), so no completion time the
        simulator has already acted upon (a kernel waited for it, a host write waited for a
        staging) moves."""
        if self.copies and init_ns < self.copies[-1].init_ns:
            raise ValueError("chunked copies must be issued in time order")
        sizes = chunk_sizes(nbytes)
        if len(entries) != len(sizes):
            raise ValueError("one transfer entry per 2 MiB chunk")
        t = max(init_ns, self._stage_tail)
        staged = t + np.cumsum(sizes) / self.stage_Bps * 1e9
        self._stage_tail = float(staged[-1])
        self._schedule(until=init_ns, commit=True)
        avail = staged if dest_ready_ns is None else np.maximum(staged, np.asarray(dest_ready_ns, np.float64))
        c = ChunkedCopy(len(self.copies), gpu, float(init_ns), sizes, staged, np.asarray(entries, np.int64),
                        avail_ns=avail)
        self.copies.append(c)
        self._live.append(c)
        self._schedule(until=np.inf, commit=False)
        return c

    def tail_ns(self) -> float:
        """When every chunk issued so far has arrived (tentative while later copies may come;
        a later copy can only delay chunks that start after its own initiation)."""
        ends = [c.end_ns for c in self._live]
        return max(ends + [self._pmt_free]) if ends else self._pmt_free

    def _schedule(self, until: float, commit: bool) -> None:
        """Run the migration thread over the live queues: at each step serve the head of the
        next non-empty queue after the one served last (round-robin in creation order); a
        queue is non-empty once its head chunk is staged and its destination free. With
        ``commit`` stop before the first migration that would start at or after ``until`` and
        keep the state."""
        live = self._live
        if not live:
            return
        nxt = [c.committed for c in live]
        t = t_commit = self._pmt_free
        last = self._rr_last
        while True:
            heads = [i for i, c in enumerate(live) if nxt[i] < c.n]
            if not heads:
                break
            ready = [i for i in heads if live[i].avail_ns[nxt[i]] <= t]
            if not ready:
                t = min(live[i].avail_ns[nxt[i]] for i in heads)
                continue
            after = [i for i in ready if live[i].cid > last]
            i = after[0] if after else ready[0]
            if commit and t >= until:
                break
            c, k = live[i], nxt[i]
            done = t + self.migrate_ns(float(c.chunk_bytes[k]))
            c.start_ns[k], c.done_ns[k] = t, done
            if self.set_done is not None:
                self.set_done(int(c.entries[k]), done)
            nxt[i] = k + 1
            last = c.cid
            t = t_commit = done
        if commit:
            for c, k in zip(live, nxt):
                c.committed = k
            self._pmt_free = t_commit
            self._rr_last = last
            self._live = [c for c in live if c.committed < c.n]
