"""A SnuRHAC node agent: one node's unified-memory space and its part of the cluster protocol.

Every node holds the whole UM space at the same addresses (SnuRHAC allocates it in every node,
§6.3) but only some pages of it are valid there: ``mapping`` is the node's page table, 0 (not
mapped), 1 (read) or 2 (write). An access to a page mapped too weakly is a page fault, handled
as the thesis's steps 3-11 for each faulted UM block, up to ``PIPELINE`` blocks in flight at once
(§6.3's pipelined fault handling: a range's blocks wait for their round trips together):

  lock request to the block's descriptor owner (``(block // 32) mod nodes``), which grants it
  or queues the node on the block's wait list -> the faulted access list -> the owner answers
  with the page owner node of each page the faulting node lacks and updates the read / write
  masks (a write clears every other node's write bit and degrades their mappings to read) ->
  page requests to the page owners, which send the pages -> the pages are installed (and the
  faulting write applied while the block is still locked, so the next writer fetches it) ->
  unlock.

A page's data comes from the node holding it for writing, else from any node with a read copy,
else it has never been touched (the space starts zeroed in every node, like fresh UM).

After a kernel (``kernel_done``, collective) each descriptor owner unmaps the read copies of
pages another node wrote (§6.3's synchronisation); the dropped pages are overwritten with
``POISON`` so that a missed fetch shows up as wrong data instead of passing silently.

Waiting never blocks the node: every wait serves the other nodes' requests in the meantime
(otherwise two nodes fetching from each other would deadlock), and gives up with
:class:`ClusterError` after ``timeout_s`` without progress (a dead peer).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ..controller.snurhac import DESCRIPTOR_RUN, BlockDescriptors
from ..units import BLOCK_SHIFT, PAGE_SHIFT, PAGE_SIZE, PAGES_PER_BLOCK

#: the byte an unmapped stale copy is overwritten with
POISON = 0xA5
#: seconds without a message after which an idle node sleeps between polls instead of yielding
SPIN_S = 0.002
#: faulted UM blocks a node services at once (lock requests out before the first answer)
PIPELINE = 32

# message tags
LOCK, GRANT, ACCESS, OWNERS, PAGE_REQ, PAGES, UNLOCK, DEGRADE, INVALIDATE, READ_ONLY = range(101, 111)


class ClusterError(RuntimeError):
    """The cluster cannot go on (a peer stopped answering, a bad request); one line, for users."""


@dataclass
class _Lock:
    held_by: int | None = None
    waiting: deque = field(default_factory=deque)


class NodeAgent:
    """One node of the cluster: its UM space (``mem``), page table and descriptor share.

    ``comm`` is an mpi4py communicator (one rank a node); ``nbytes`` the UM space's size;
    ``run`` the blocks per round-robin run of the descriptors (32 in SnuRHAC).
    """

    def __init__(self, comm, nbytes: int, *, run: int = DESCRIPTOR_RUN, timeout_s: float = 60.0):
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = comm
        self.node = comm.Get_rank()
        self.nodes = comm.Get_size()
        n_pages = (nbytes + PAGE_SIZE - 1) >> PAGE_SHIFT
        self.mem = np.zeros(n_pages << PAGE_SHIFT, np.uint8)
        self.mapping = np.zeros(n_pages, np.int8)
        self.desc = BlockDescriptors(self.nodes, run)     # used for the blocks this node owns
        self.locks: dict[int, _Lock] = {}
        self.timeout_s = timeout_s
        self._replies: dict[int, deque] = {}             # tag -> (source, payload) answers to us
        self._sending: list = []                         # (request, buffer) of pages on their way
        self.st = {k: 0 for k in ("read_faults", "write_faults", "pages_in", "bytes_in", "pages_out",
                                  "remote_descriptor_msgs", "lock_waits", "invalidated", "degraded",
                                  "ro_write_faults")}

    # ------------------------------------------------------------------ the program's side
    def read(self, addr: int, nbytes: int) -> np.ndarray:
        """The bytes at [addr, addr + nbytes) as this node sees them, faulting in what it lacks."""
        self._fault(addr, nbytes, write=False)
        return self.mem[addr:addr + nbytes]

    def write(self, addr: int, data, mask: np.ndarray | None = None) -> None:
        """Store ``data`` at addr, holding every page it touches for writing (a write fault where
        the node holds less). The store happens inside the fault, under the block's lock.
        ``mask`` (bytes): store only those bytes, the rest of the page staying as fetched (a slab
        that wrote part of a page another node also writes)."""
        b = np.ascontiguousarray(data).view(np.uint8).ravel()
        self._fault(addr, len(b), write=True, data=b, mask=mask)

    def kernel_done(self) -> None:
        """All nodes finished the kernel: descriptor owners unmap stale read copies (collective)."""
        self._barrier()
        msgs = []
        for block, stale in self.desc.stale():
            if self.desc.owner(block) != self.node or block in self.desc.read_only:
                continue                          # flagged read-only: its copies stay (§6.4)
            self.desc.read[block] &= ~stale
            msgs += [(n, (block, np.flatnonzero(stale[n]).astype(np.int32)))
                     for n in np.flatnonzero(stale.any(1)).tolist()]
        self._send_applied(msgs, INVALIDATE, "invalidations to be received")
        self._barrier()

    def set_read_only(self, addr: int, nbytes: int, flag: bool) -> None:
        """The runtime's read-only flag for a buffer (§6.4), set in the descriptors of its blocks
        by their owners. Collective: every node's runtime makes the same decision at a launch.
        Flagging degrades the buffer's writer (the host's copy-in) to a read copy like any other,
        so that the synchronisation after a kernel keeps every node's copy: pages of a flagged
        buffer move once, then stay."""
        msgs = []
        for block in range(addr >> BLOCK_SHIFT, ((addr + nbytes - 1) >> BLOCK_SHIFT) + 1):
            if self.desc.owner(block) != self.node:
                continue
            if not flag:
                self.desc.read_only.discard(block)
                continue
            self.desc.read_only.add(block)
            r, w = self.desc._masks(block)
            msgs += [(n, (block, np.flatnonzero(w[n]).astype(np.int32))) for n in np.flatnonzero(w.any(1)).tolist()]
            w[:] = False
        # no node leaves before its degradation is applied
        self._send_applied(msgs, DEGRADE, "degradations to be received")
        self._barrier()

    def stats(self) -> dict:
        d = dict(self.st)
        d["descriptor_lookups"] = self.desc.lookups
        d["remote_descriptor_lookups"] = self.desc.remote_lookups
        return d

    # ------------------------------------------------------------------ fault handling (P)
    def _fault(self, addr: int, nbytes: int, write: bool, data: np.ndarray | None = None,
               mask: np.ndarray | None = None) -> None:
        if nbytes <= 0:
            return
        if addr < 0 or addr + nbytes > len(self.mem):
            raise ClusterError(f"access [{addr:#x}, {addr + nbytes:#x}) outside the UM space of {len(self.mem)} bytes")
        p0, p1 = addr >> PAGE_SHIFT, (addr + nbytes - 1) >> PAGE_SHIFT
        need = 2 if write else 1
        todo = []
        for block in range(p0 >> (BLOCK_SHIFT - PAGE_SHIFT), (p1 >> (BLOCK_SHIFT - PAGE_SHIFT)) + 1):
            b0 = max(p0, block * PAGES_PER_BLOCK)
            b1 = min(p1 + 1, (block + 1) * PAGES_PER_BLOCK)
            pages = np.arange(b0, b1)
            if (self.mapping[pages] < need).any():
                todo.append((block, pages))
            elif write:
                self._store(addr, data, mask, b0, b1)
        if todo:
            self._service(todo, need, write, lambda b0, b1: self._store(addr, data, mask, b0, b1))

    def _store(self, addr: int, data: np.ndarray, mask: np.ndarray | None, b0: int, b1: int) -> None:
        """The part of a write in pages [b0, b1) (the node holds them for writing)."""
        lo, hi = max(addr, b0 << PAGE_SHIFT), min(addr + len(data), b1 << PAGE_SHIFT)
        if mask is None:
            self.mem[lo:hi] = data[lo - addr:hi - addr]
        else:
            m = mask[lo - addr:hi - addr]
            self.mem[lo:hi][m] = data[lo - addr:hi - addr][m]

    def _service(self, todo: list[tuple[int, np.ndarray]], need: int, write: bool, store) -> None:
        """Steps 3-11 for faulted blocks, PIPELINE of them in flight at once ("multiple faulted
        UM blocks can be serviced simultaneously", §6.3): each block's lock request, access list,
        page requests and pages are its own exchange, so a range of N blocks waits for about three
        round trips instead of 3N. What is missing is decided once a block's lock is held (while
        waiting for it this node may have been degraded on pages it held for writing); a write's
        store happens before the block's unlock. A node holding a block's lock only ever waits
        for answers the other nodes give from their polls (never for a second lock), so blocks in
        flight together cannot deadlock."""
        pending = deque(todo)
        flight: dict[int, dict] = {}
        fifo: dict[int, deque] = {}       # src -> (block, offsets) whose pages from src are due, in order
        base_of = lambda block: block * PAGES_PER_BLOCK  # noqa: E731

        def finish(block: int) -> None:
            f = flight.pop(block)
            offs = f["offs"]
            self.mapping[base_of(block) + offs] = 2 if write else np.maximum(self.mapping[base_of(block) + offs], 1)
            if write:
                store(int(f["pages"][0]), int(f["pages"][-1]) + 1)
            self._send(f["owner"], (block,), UNLOCK)

        while pending or flight:
            while pending and len(flight) < PIPELINE:
                block, pages = pending.popleft()
                self.st["write_faults" if write else "read_faults"] += 1
                owner = self.desc.owner(block)
                flight[block] = {"pages": pages, "owner": owner, "offs": None, "due": 0}
                self._send(owner, (block, self.node), LOCK)
            moved = False
            grants = self._replies.get(GRANT)
            while grants:
                _, block = grants.popleft()
                f = flight[block]
                f["offs"] = (f["pages"][self.mapping[f["pages"]] < need] & (PAGES_PER_BLOCK - 1)).astype(np.int32)
                self._send(f["owner"], (block, self.node, f["offs"], write), ACCESS)
                moved = True
            owners = self._replies.get(OWNERS)
            while owners:
                _, (block, sources) = owners.popleft()
                for src, so in sources.items():
                    self._send(src, (block, self.node, so), PAGE_REQ)
                    fifo.setdefault(src, deque()).append((block, so))
                flight[block]["due"] = len(sources)
                if not sources:
                    finish(block)
                moved = True
            got = self._replies.get(PAGES)
            while got:
                src, buf = got.popleft()
                block, so = fifo[src].popleft()
                pg = base_of(block) + so
                self.mem.reshape(-1, PAGE_SIZE)[pg] = buf.reshape(-1, PAGE_SIZE)
                self.st["pages_in"] += len(so)
                self.st["bytes_in"] += len(buf)
                flight[block]["due"] -= 1
                if flight[block]["due"] == 0:
                    finish(block)
                moved = True
            if not moved and flight:
                self._wait(lambda: any(self._replies.get(t) for t in (GRANT, OWNERS, PAGES)),
                           f"answers for {len(flight)} faulted block(s)")

    # ------------------------------------------------------------------ serving (every node)
    def _handle(self, src: int, tag: int, msg) -> None:
        if tag == LOCK:
            block, who = msg
            lk = self.locks.setdefault(block, _Lock())
            if lk.held_by is None:
                lk.held_by = who
                self._send(who, block, GRANT)
            else:
                self.st["lock_waits"] += 1
                lk.waiting.append(who)
        elif tag == UNLOCK:
            (block,) = msg
            lk = self.locks[block]
            lk.held_by = lk.waiting.popleft() if lk.waiting else None
            if lk.held_by is not None:
                self._send(lk.held_by, block, GRANT)
        elif tag == ACCESS:
            self._access(*msg)
        elif tag == PAGE_REQ:
            block, who, offs = msg
            pages = block * PAGES_PER_BLOCK + offs
            out = self.mem.reshape(-1, PAGE_SIZE)[pages].ravel()
            self.st["pages_out"] += len(offs)
            # non-blocking: two nodes sending each other pages large enough for the rendezvous
            # protocol would otherwise both wait in Send, neither receiving (seen at 1.4 MB)
            self._sending.append((self.comm.Isend(out, dest=who, tag=PAGES), out))
        elif tag == DEGRADE:
            block, offs = msg
            pages = block * PAGES_PER_BLOCK + offs
            self.mapping[pages] = np.minimum(self.mapping[pages], 1)
            self.st["degraded"] += len(offs)
        elif tag == INVALIDATE:
            self._invalidate(*msg)
        else:
            self._replies.setdefault(tag, deque()).append((src, msg))

    def _access(self, block: int, who: int, offs: np.ndarray, write: bool) -> None:
        """Step 7 at the descriptor owner: where each faulted page's data is, then the masks."""
        d = self.desc
        r, w = d._masks(block)
        if write and block in d.read_only:
            # flagged read-only, yet written: the flag goes (its copies must be unmapped after
            # the kernel like any written page's, or other nodes would keep stale data)
            self.st["ro_write_faults"] += 1
            d.read_only.discard(block)
        sources: dict[int, list[int]] = {}
        degrade: dict[int, list[int]] = {}
        for off in offs.tolist():
            writer = np.flatnonzero(w[:, off])
            if len(writer) and writer[0] != who:
                src = int(writer[0])
                if write:
                    degrade.setdefault(src, []).append(off)
            elif r[who, off] or len(writer):
                src = None                    # its own copy is current
            else:
                readers = np.flatnonzero(r[:, off])
                src = int(readers[0]) if len(readers) else None
            if src is not None:
                sources.setdefault(src, []).append(off)
        d.fault(who, block, offs, np.full(len(offs), write))
        # the old writer must stop storing locally before the new one gets the page: a store it
        # made after the page moved would be lost (synchronous sends; the receiver applies a
        # message as it receives it, and serves while it waits, so this cannot deadlock)
        self._send_applied([(n, (block, np.array(o, np.int32))) for n, o in degrade.items()], DEGRADE,
                           "a writer to give up its pages")
        self._send(who, (block, {s: np.array(o, np.int32) for s, o in sources.items()}), OWNERS)

    def _invalidate(self, block: int, offs: np.ndarray) -> None:
        pages = block * PAGES_PER_BLOCK + offs
        self.mapping[pages] = 0
        self.mem.reshape(-1, PAGE_SIZE)[pages] = POISON
        self.st["invalidated"] += len(offs)

    # ------------------------------------------------------------------ transport
    def _send_applied(self, msgs: list[tuple[int, object]], tag: int, what: str) -> None:
        """(node, message) pairs that must be applied before this node goes on: synchronous sends
        (a receiver applies a message as it receives it), ours handled in place; requests are
        served while waiting, so two nodes doing this at once cannot deadlock."""
        sends = []
        for n, msg in msgs:
            if n == self.node:
                self._handle(n, tag, msg)
            else:
                sends.append(self.comm.issend(msg, dest=n, tag=tag))
        self._wait(lambda: all(q.Test() for q in sends), what)

    def _send(self, dest: int, msg, tag: int) -> None:
        """To another node over MPI; to ourselves, handled in place (no loopback message)."""
        if dest == self.node:
            self._handle(dest, tag, msg)
            return
        if tag in (LOCK, ACCESS, UNLOCK):
            self.st["remote_descriptor_msgs"] += 1
        self.comm.send(msg, dest=dest, tag=tag)

    def _poll(self) -> bool:
        if self._sending:
            self._sending = [(q, b) for q, b in self._sending if not q.Test()]
        st = self.MPI.Status()
        if not self.comm.Iprobe(source=self.MPI.ANY_SOURCE, tag=self.MPI.ANY_TAG, status=st):
            return False
        src, tag = st.Get_source(), st.Get_tag()
        if tag == PAGES:
            buf = np.empty(st.Get_count(self.MPI.BYTE), np.uint8)
            self.comm.Recv(buf, source=src, tag=tag)
            self._replies.setdefault(tag, deque()).append((src, buf))
        else:
            self._handle(src, tag, self.comm.recv(source=src, tag=tag))
        return True

    def idle(self, quiet_s: float) -> None:
        """Nothing came in for ``quiet_s`` seconds: give the CPU up. MPI moves a large message only
        inside MPI calls of both ends (over TCP a fragment at a time), so while pages are on their
        way from us, or just after a message (an answer is likely coming), only yield; a sleep per
        poll there (0.2 ms asked, 0.4 ms had) stretched every 2 MiB block of pages and every round
        trip of the protocol. Otherwise sleep 0.2 ms between polls."""
        time.sleep(0 if self._sending or quiet_s < SPIN_S else 0.0002)

    def _wait(self, done, what: str) -> None:
        """Serve requests until ``done()``; a ClusterError after timeout_s without a message."""
        last = time.monotonic()
        while not done():
            if self._poll():
                last = time.monotonic()
                continue
            quiet = time.monotonic() - last
            if quiet > self.timeout_s:
                raise ClusterError(f"node {self.node}: no message for {self.timeout_s:g} s while waiting for "
                                   f"{what} (a node stopped?)")
            self.idle(quiet)

    def _barrier(self) -> None:
        req = self.comm.Ibarrier()
        self._wait(lambda: req.Test() and not self._sending, "the other nodes to finish the kernel")
