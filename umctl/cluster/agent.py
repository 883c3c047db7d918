"""A SnuRHAC node agent: one node's unified-memory space and its part of the cluster protocol.

Every node holds the whole UM space at the same addresses (SnuRHAC allocates it in every node,
§6.3) but only some pages of it are valid there: ``mapping`` is the node's page table, 0 (not
mapped), 1 (read) or 2 (write). An access to a page mapped too weakly is a page fault, handled
as the thesis's steps 3-11 for each faulted UM block: the block's lock at its descriptor owner
(``(block // 32) mod nodes``), the faulted access list, the pages from the nodes holding them,
the read / write masks updated (a write clears every other node's write bit and degrades their
mappings to read), the pages installed (and the faulting write applied while the block is still
locked, so the next writer fetches it), unlock.

Batched (§6.3's pipelined fault handling, taken further): a node faults up to ``PIPELINE`` blocks
at once and every step of the exchange carries all of them, one message a peer, so that a range
of any size costs about one round trip instead of three a block:

  FAULT (faulting node -> owner: its blocks, each with the pages it accesses there) -> the owner
  takes each free lock (queues the node on a held one), decides from the masks which pages the
  node lacks and where each one's data is, updates the masks, and sends FORWARD to each node
  holding data (its own share it serves in place) and GRANTED to the faulting node (per block,
  the nodes whose pages are on their way) -> each holder sends PAGES (one message: a header of
  blocks and pages, then the pages) straight to the faulting node, after degrading its own copy
  (a write takes the writer's write bit: it must stop storing before the page leaves, and the
  snapshot and the degradation happen in one step there) -> the faulting node installs, stores,
  and sends UNLOCK (one message an owner; no answer awaited), which hands each lock to the next
  waiting node.

A page's data comes from the node holding it for writing, else from any node with a read copy,
else it has never been touched (the space starts zeroed in every node, like fresh UM).

The host's changes (``write_many(host=True)``: the program copied data in or stored into managed
memory between kernels) are read faults, not writes: every node runs the same host code, so every
node makes the same change to its own copy. Node 0's changes are authoritative: it fetches a page
it lacks and applies them (``HOST``). Another node applies them only to pages it holds and to pages
whose every copy came from host stores (no kernel wrote them since they were zeros everywhere, so
its program's bytes are the page's: a fresh allocation's copy-in), and fetches nothing (``COPY``;
node 0 fetches none of those either); the pages it skips it fetches when a kernel needs them. So
a buffer the host copied in moves between nodes only as far as the kernels write it, and no node
holds it for writing: a writer would make every later kernel unmap every other node's copy of it
(the synchronisation after a kernel cannot tell which pages a writer changed), and a node writing
its band of it would fetch the band from the writer first, to merge. A host store into pages the
node holds needs no fault at all: between kernels nobody writes, and a copy served meanwhile gets
the same change on its new node.

After a kernel (``kernel_done``, collective) each descriptor owner unmaps the read copies of
pages another node holds for writing (§6.3's synchronisation); the dropped pages are overwritten
with ``POISON`` so that a missed fetch shows up as wrong data instead of passing silently.

Waiting never blocks the node: every wait serves the other nodes' requests in the meantime
(otherwise two nodes fetching from each other would deadlock), and gives up with
:class:`ClusterError` after ``timeout_s`` without progress (a dead peer). A node holding some of
its blocks' locks waits only for answers the others give from their polls, never for a lock
before going on with the blocks it holds, so blocks in flight together cannot deadlock.
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
#: faulted UM blocks a node has in flight at once (128 MiB: a PAGES message is at most that)
PIPELINE = 64

# message tags
FAULT, GRANTED, FORWARD, PAGES, UNLOCK, DEGRADE, INVALIDATE = range(101, 108)
# what a fault asks for: a read copy, the write bit, the host's store on node 0 (a read copy), the
# host's store elsewhere (a copy of what it holds or of pages only host stores made; nothing fetched)
READ, WRITE, HOST, COPY = 1, 2, 3, 4


class ClusterError(RuntimeError):
    """The cluster cannot go on (a peer stopped answering, a bad request); one line, for users."""


@dataclass
class _Lock:
    held_by: int | None = None
    waiting: deque = field(default_factory=deque)     # (node, mode, offsets) in arrival order


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
        self.pages = self.mem.reshape(-1, PAGE_SIZE)
        self.mapping = np.zeros(n_pages, np.int8)
        self.desc = BlockDescriptors(self.nodes, run)     # used for the blocks this node owns
        self.locks: dict[int, _Lock] = {}
        self.host_made: dict[int, np.ndarray] = {}         # block -> pages only host stores wrote (owner)
        self.timeout_s = timeout_s
        self._replies: dict[int, deque] = {}             # tag -> (source, payload) answers to us
        self._sending: list = []                         # (request, buffer) of messages on their way
        self._invalidations = 0                          # INVALIDATE messages of this kernel_done so far
        self._got: list | None = None                    # pages installed during read_many
        # msgs: MPI messages this node sent (every kind); fault_msgs: of them FAULT requests (one
        # an owner a batch); fault_waits: times a fault service waited for an answer (round trips)
        self.st = {k: 0 for k in ("read_faults", "write_faults", "pages_in", "bytes_in", "pages_out",
                                  "remote_descriptor_msgs", "lock_waits", "invalidated", "degraded",
                                  "ro_write_faults", "msgs", "fault_msgs", "fault_waits", "barriers")}

    # ------------------------------------------------------------------ the program's side
    def read(self, addr: int, nbytes: int) -> np.ndarray:
        """The bytes at [addr, addr + nbytes) as this node sees them, faulting in what it lacks."""
        self._acquire([(addr, nbytes)], READ)
        return self.mem[addr:addr + nbytes]

    def read_many(self, ranges: list[tuple[int, int]]) -> np.ndarray:
        """Fault in every page of these (addr, bytes) ranges this node lacks, all together.
        Returns the pages whose data came from other nodes (a page it lacked and got no data
        for has never been touched: zeros, in its program too)."""
        self._got = []
        try:
            self._acquire(ranges, READ)
            return np.concatenate(self._got) if self._got else np.zeros(0, np.int64)
        finally:
            self._got = None

    def write(self, addr: int, data, old=None) -> None:
        """Store ``data`` at addr, holding every page it touches for writing (a write fault where
        the node holds less). The store happens inside the fault, under the block's lock.
        ``old``: the bytes the program had there before (an array like data's bytes, or a
        scalar): store only the bytes that differ from it, the rest of the page staying as
        fetched (a slab that wrote part of a page another node also writes)."""
        self.write_many([(addr, data, old)])

    def write_many(self, items, *, host: bool = False) -> None:
        """Every (addr, data, old) of ``items`` as :meth:`write` stores it, the blocks any of
        them lacks faulted in together. ``host``: the host's changes between kernels, stored
        into read copies (see the module's docstring): on node 0 into every page (fetched where
        it lacks them), elsewhere into those the node holds or nobody has touched."""
        stores = [(addr, np.ascontiguousarray(data).view(np.uint8).ravel(), old) for addr, data, old in items]
        mode = WRITE if not host else HOST if self.node == 0 else COPY
        self._acquire([(addr, len(b)) for addr, b, _ in stores], mode, stores)

    def kernel_done(self) -> None:
        """All nodes finished the kernel: descriptor owners unmap stale read copies (collective).
        Every owner sends every other node one INVALIDATE (empty if it has nothing for it) and a
        node goes on once it has one from each: then every copy it must drop is dropped, and every
        owner's masks are past the kernel (a second barrier would cost two more message delays)."""
        self._barrier()
        msgs: dict[int, list] = {n: [] for n in range(self.nodes)}
        for block, stale in self.desc.stale():
            if self.desc.owner(block) != self.node or block in self.desc.read_only:
                continue                          # flagged read-only: its copies stay (§6.4)
            self.desc.read[block] &= ~stale
            for n in np.flatnonzero(stale.any(1)).tolist():
                msgs[n].append((block, np.flatnonzero(stale[n]).astype(np.int32)))
        for n, items in msgs.items():
            self._send(n, items, INVALIDATE)
        self._wait(lambda: self._invalidations >= self.nodes, "the other nodes' invalidations")
        self._invalidations -= self.nodes

    def set_read_only(self, addr: int, nbytes: int, flag: bool) -> None:
        """The runtime's read-only flag for one buffer: :meth:`set_flags`."""
        self.set_flags([(addr, nbytes, flag)])

    def set_flags(self, changes: list[tuple[int, int, bool]]) -> None:
        """The runtime's read-only flags (§6.4) for these (addr, bytes, flag) buffers, set in the
        descriptors of their blocks by their owners. Collective: every node's runtime makes the
        same decision at a launch; one barrier for all of them. Flagging degrades the buffer's
        writer (the host's copy-in) to a read copy like any other, so that the synchronisation
        after a kernel keeps every node's copy: pages of a flagged buffer move once, then stay."""
        msgs: dict[int, list] = {}
        for addr, nbytes, flag in changes:
            for block in range(addr >> BLOCK_SHIFT, ((addr + nbytes - 1) >> BLOCK_SHIFT) + 1):
                if self.desc.owner(block) != self.node:
                    continue
                if not flag:
                    self.desc.read_only.discard(block)
                    continue
                self.desc.read_only.add(block)
                r, w = self.desc._masks(block)
                for n in np.flatnonzero(w.any(1)).tolist():
                    msgs.setdefault(n, []).append((block, np.flatnonzero(w[n]).astype(np.int32)))
                w[:] = False
        # no node leaves before its degradation is applied
        self._send_applied(list(msgs.items()), DEGRADE, "degradations to be received")
        self._barrier()

    def stats(self) -> dict:
        d = dict(self.st)
        d["descriptor_lookups"] = self.desc.lookups
        d["remote_descriptor_lookups"] = self.desc.remote_lookups
        return d

    # ------------------------------------------------------------------ fault handling (P)
    def _acquire(self, ranges, mode: int, stores=None) -> None:
        """Fault in the blocks of ``ranges`` this node holds too weakly for ``mode``, together,
        and apply ``stores`` (the (addr, bytes, old) of each range, when writing) block by block:
        at once where the node holds the block well enough (for writing; a host's store: at all),
        else inside its fault."""
        need = 2 if mode == WRITE else 1
        touched: dict[int, tuple[np.ndarray, list]] = {}     # block -> its pages the ranges touch, their stores
        for i, (addr, nbytes) in enumerate(ranges):
            if nbytes <= 0:
                continue
            if addr < 0 or addr + nbytes > len(self.mem):
                raise ClusterError(f"access [{addr:#x}, {addr + nbytes:#x}) outside the UM space of "
                                   f"{len(self.mem)} bytes")
            p0, p1 = addr >> PAGE_SHIFT, (addr + nbytes - 1) >> PAGE_SHIFT
            for block in range(p0 >> (BLOCK_SHIFT - PAGE_SHIFT), (p1 >> (BLOCK_SHIFT - PAGE_SHIFT)) + 1):
                base = block * PAGES_PER_BLOCK
                if block not in touched:
                    touched[block] = (np.zeros(PAGES_PER_BLOCK, bool), [])
                m, its = touched[block]
                m[max(p0, base) - base:min(p1 + 1, base + PAGES_PER_BLOCK) - base] = True
                if stores:
                    its.append(stores[i])
        todo = []
        for block in sorted(touched):
            m, its = touched[block]
            pages = block * PAGES_PER_BLOCK + np.flatnonzero(m)
            if (self.mapping[pages] < need).any():
                todo.append((block, pages, its))
            else:
                self._store(its, block)
        if todo:
            self._service(todo, mode)

    def _store(self, stores, block: int, skip: np.ndarray | None = None) -> None:
        """The parts of ``stores`` in ``block`` (the node holds what they touch there), but the
        pages of ``skip`` (offsets in the block). Where the node's copy still equals the
        program's old bytes (nobody else wrote there: the usual case) the new bytes are copied
        whole, else only those that changed (a byte-masked copy is ten times slower)."""
        if skip is not None and len(skip):
            keep = np.ones(PAGES_PER_BLOCK + 1, bool)
            keep[skip] = False
            keep[-1] = False
            edges = np.flatnonzero(np.diff(np.concatenate([[False], keep]).astype(np.int8)))
            base = block * PAGES_PER_BLOCK
            for k0, k1 in zip(edges[::2].tolist(), edges[1::2].tolist()):
                self._store_span(stores, (base + k0) << PAGE_SHIFT, (base + k1) << PAGE_SHIFT)
        else:
            self._store_span(stores, block << BLOCK_SHIFT, (block + 1) << BLOCK_SHIFT)

    def _store_span(self, stores, b0: int, b1: int) -> None:
        for addr, data, old in stores:
            lo, hi = max(addr, b0), min(addr + len(data), b1)
            if lo >= hi:
                continue
            cur, new = self.mem[lo:hi], data[lo - addr:hi - addr]
            if old is not None:
                if isinstance(old, np.ndarray):
                    was = old[lo - addr:hi - addr]
                    same = np.array_equal(cur, was)
                else:
                    was = old
                    same = not cur.any() if was == 0 else bool((cur == was).all())   # (any: 6x faster)
                if not same:
                    np.copyto(cur, new, where=new != was)
                    continue
            cur[:] = new

    def _service(self, todo: list[tuple[int, np.ndarray, list]], mode: int) -> None:
        """Steps 3-11 for faulted blocks, PIPELINE of them in flight at once, batched: one FAULT
        an owner for the blocks that entered together, the owners' GRANTED and the holders' PAGES
        as they come, one UNLOCK an owner for the blocks finished together. A block is done when
        its GRANTED and the PAGES of every node it names have arrived (in either order); a write's
        stores (``todo``'s third item, a block's) happen before its unlock."""
        pending = deque(todo)
        flight: dict[int, dict] = {}
        unlock: dict[int, list[int]] = {}

        def finish(block: int) -> None:
            f = flight.pop(block)
            pages = f["pages"]
            if f["skip"] is not None and len(f["skip"]):
                keep = np.ones(PAGES_PER_BLOCK, bool)
                keep[f["skip"]] = False
                pages = pages[keep[pages & (PAGES_PER_BLOCK - 1)]]
            self.mapping[pages] = 2 if mode == WRITE else np.maximum(self.mapping[pages], 1)
            self._store(f["stores"], block, f["skip"])
            unlock.setdefault(f["owner"], []).append(block)

        def check(block: int) -> None:
            f = flight[block]
            if f["srcs"] is not None and f["srcs"] <= f["got"]:
                finish(block)

        while pending or flight:
            out: dict[int, list] = {}
            while pending and len(flight) < PIPELINE:
                block, pages, its = pending.popleft()
                self.st["read_faults" if mode == READ else "write_faults"] += 1
                owner = self.desc.owner(block)
                flight[block] = {"pages": pages, "stores": its, "owner": owner, "srcs": None, "skip": None,
                                 "got": set()}
                out.setdefault(owner, []).append((block, (pages & (PAGES_PER_BLOCK - 1)).astype(np.int32)))
            for owner, items in out.items():
                self.st["fault_msgs"] += owner != self.node
                self._send(owner, (self.node, mode, items), FAULT)
            moved = False
            grants = self._replies.get(GRANTED)
            while grants:
                _, items = grants.popleft()
                for block, srcs, skip in items:
                    flight[block]["srcs"], flight[block]["skip"] = set(srcs), skip
                    check(block)
                moved = True
            got = self._replies.get(PAGES)
            while got:
                src, buf = got.popleft()
                for block in self._install(buf):
                    flight[block]["got"].add(src)
                    check(block)
                moved = True
            for owner, blocks in unlock.items():
                self._send(owner, (self.node, blocks), UNLOCK)
            unlock.clear()
            if not moved and flight:
                self.st["fault_waits"] += 1
                self._wait(lambda: any(self._replies.get(t) for t in (GRANTED, PAGES)),
                           f"answers for {len(flight)} faulted block(s)")

    # ------------------------------------------------------------------ pages on the wire
    def _pack(self, items: list[tuple[int, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
        """A PAGES message of these (block, offsets): int64 header length, the header (items,
        then each one's block and page count, then every offset), the pages' bytes. Also the
        pages (global numbers)."""
        blocks = np.array([b for b, _ in items], np.int64)
        counts = np.array([len(o) for _, o in items], np.int64)
        offs = np.concatenate([o for _, o in items]).astype(np.int64)
        pages = np.repeat(blocks * PAGES_PER_BLOCK, counts) + offs
        hdr = np.concatenate([[len(items)], np.stack([blocks, counts], 1).ravel(), offs]).astype(np.int64)
        start = 8 * (1 + len(hdr))
        buf = np.empty(start + len(pages) * PAGE_SIZE, np.uint8)
        buf[:start].view(np.int64)[:] = np.concatenate([[len(hdr)], hdr])
        np.take(self.pages, pages, axis=0, out=buf[start:].reshape(-1, PAGE_SIZE), mode="clip")   # unbuffered
        return buf, pages

    def _install(self, buf: np.ndarray) -> list[int]:
        """Install a PAGES message's pages; returns its blocks."""
        n_hdr = int(buf[:8].view(np.int64)[0])
        hdr = buf[8:8 * (1 + n_hdr)].view(np.int64)
        n = int(hdr[0])
        blocks, counts = hdr[1:1 + 2 * n:2], hdr[2:2 + 2 * n:2]
        pages = np.repeat(blocks * PAGES_PER_BLOCK, counts) + hdr[1 + 2 * n:]
        self.pages[pages] = buf[8 * (1 + n_hdr):].reshape(-1, PAGE_SIZE)
        if self._got is not None:
            self._got.append(pages)
        self.st["pages_in"] += len(pages)
        self.st["bytes_in"] += len(pages) * PAGE_SIZE
        return blocks.tolist()

    # ------------------------------------------------------------------ serving (every node)
    def _handle(self, src: int, tag: int, msg) -> None:
        if tag == FAULT:
            who, mode, items = msg
            grant = []
            for block, offs in items:
                lk = self.locks.setdefault(block, _Lock())
                if lk.held_by is None:
                    lk.held_by = who
                    grant.append((block, offs))
                else:
                    self.st["lock_waits"] += 1
                    lk.waiting.append((who, mode, offs))
            if grant:
                self._grant(who, mode, grant)
        elif tag == UNLOCK:
            who, blocks = msg
            nxt: dict[tuple[int, int], list] = {}
            for block in blocks:
                lk = self.locks[block]
                lk.held_by = None
                if lk.waiting:
                    w, mode, offs = lk.waiting.popleft()
                    lk.held_by = w
                    nxt.setdefault((w, mode), []).append((block, offs))
            for (w, mode), items in nxt.items():
                self._grant(w, mode, items)
        elif tag == FORWARD:
            who, mode, items = msg
            buf, pages = self._pack(items)
            # the snapshot and the degradation in one step: a writer stops storing before the
            # page leaves (a write fault)
            if mode == WRITE:
                self.st["degraded"] += int((self.mapping[pages] == 2).sum())
                self.mapping[pages] = np.minimum(self.mapping[pages], 1)
            self.st["pages_out"] += len(pages)
            # non-blocking: two nodes sending each other pages large enough for the rendezvous
            # protocol would otherwise both wait in Send, neither receiving (seen at 1.4 MB)
            self.st["msgs"] += 1
            self._sending.append((self.comm.Isend(buf, dest=who, tag=PAGES), buf))
        elif tag == DEGRADE:
            for block, offs in msg:
                pages = block * PAGES_PER_BLOCK + offs
                self.mapping[pages] = np.minimum(self.mapping[pages], 1)
                self.st["degraded"] += len(offs)
        elif tag == INVALIDATE:
            for block, offs in msg:
                self._drop(block * PAGES_PER_BLOCK + offs)
            self._invalidations += 1
        else:
            self._replies.setdefault(tag, deque()).append((src, msg))

    def _grant(self, who: int, mode: int, items: list[tuple[int, np.ndarray]]) -> None:
        """Step 7 at the descriptor owner for blocks whose locks ``who`` now holds: where each
        faulted page's data is, then the masks; FORWARD to the holders, GRANTED to ``who`` (per
        block the holders, and for a COPY the pages it must skip)."""
        d = self.desc
        granted, fwd = [], {}
        for block, offs in items:
            r, w = d._masks(block)
            if mode == WRITE and block in d.read_only:
                # flagged read-only, yet written: the flag goes (its copies must be unmapped after
                # the kernel like any written page's, or other nodes would keep stale data)
                self.st["ro_write_faults"] += 1
                d.read_only.discard(block)
            wcol, rcol = w[:, offs], r[:, offs]
            has_w, has_r = wcol.any(0), rcol.any(0)
            made = self.host_made.setdefault(block, np.zeros(PAGES_PER_BLOCK, bool))
            if mode == WRITE:
                made[offs] = False
            same = None
            if mode in (HOST, COPY):
                # the faulting program's bytes are the page's: every copy so far came from host
                # stores (every node's host makes the same ones), or there is none (zeros)
                fresh = ~(has_w | has_r)
                same = made[offs] & ~has_w | fresh
                made[offs[fresh]] = True
            if mode == COPY:
                keep = r[who, offs] | w[who, offs] | same
                d.fault(who, block, offs[keep], np.zeros(int(keep.sum()), bool))
                granted.append((block, [], offs[~keep]))
                continue
            writer = wcol.argmax(0)
            theirs = has_w & (writer != who)              # another node holds it for writing
            current = ~theirs & (r[who, offs] | has_w)    # its own copy is current
            if same is not None:
                current |= same
            fetch = ~theirs & ~current & has_r            # from a read copy (never touched: zeros)
            src = np.where(theirs, writer, np.where(fetch, rcol.argmax(0), -1))
            srcs = sorted(set(src[src >= 0].tolist()))    # (not np.unique: it imports numpy.ma, 10 ms)
            for s in srcs:
                fwd.setdefault(s, []).append((block, offs[src == s]))
            d.fault(who, block, offs, np.full(len(offs), mode == WRITE))
            granted.append((block, srcs, None))
        for s, its in fwd.items():
            self._send(s, (who, mode, its), FORWARD)
        self._send(who, granted, GRANTED)

    def _drop(self, pages: np.ndarray) -> None:
        self.mapping[pages] = 0
        self.pages[pages] = POISON
        self.st["invalidated"] += len(pages)

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
                self.st["msgs"] += 1
                sends.append(self.comm.issend(msg, dest=n, tag=tag))
        if sends:
            self._wait(lambda: all(q.Test() for q in sends), what)

    def _send(self, dest: int, msg, tag: int) -> None:
        """To another node over MPI; to ourselves, handled in place (no loopback message).
        Non-blocking, like the pages: a batch's FAULT or FORWARD (offsets of up to PIPELINE
        blocks, 128 KiB) is past the eager limit, and two nodes sending each other one at once
        would both wait in a blocking send."""
        if dest == self.node:
            self._handle(dest, tag, msg)
            return
        if tag in (FAULT, UNLOCK):
            self.st["remote_descriptor_msgs"] += 1
        self.st["msgs"] += 1
        self._sending.append((self.comm.isend(msg, dest=dest, tag=tag), None))

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
        self.st["barriers"] += 1
        req = self.comm.Ibarrier()
        self._wait(lambda: req.Test() and not self._sending, "the other nodes to finish the kernel")
