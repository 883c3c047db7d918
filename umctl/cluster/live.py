"""A node's agent for a live program: one MPI rank a node starts the program under the runtime
(LD_PRELOAD, its node's share of each partitioned grid) and keeps its UM space coherent with the
other nodes' through :class:`NodeAgent`.

The runtime talks to the agent over a socket at SnuRHAC's synchronisation points (the protocol
is in runtime/rt_snurhac.c, "SnuRHAC across nodes"): before a partitioned launch it lists the
managed allocations with the kernel's read-only marks and the pages the host changed (every node:
each stores them into the copies it holds, see NodeAgent.write_many), and gets back the pages its
node lacks; after its slabs it sends the pages they changed (new and old bytes) and waits for the
cluster-wide synchronisation after the kernel. Runs of pages are stored as they arrive, a fault
batch every STREAM_PAGES pages, and while the runtime is still comparing (no bytes on the socket)
the agent serves the other nodes instead of blocking on the read. Allocations are laid
out in the UM space in the order the runtime numbered them, each at a 2 MiB boundary, which is
the same on every node because every node runs the same host code.

Granularity: the runtime cannot see a GPU's page faults from user space, so a node fetches every
page of every managed allocation it lacks before each launch (SnuRHAC fetches what its GPUs
fault on), and finds what its slabs wrote by comparing each page with a copy taken before.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import subprocess
import sys

import numpy as np

from ..runtime import child_env
from ..units import BLOCK_SIZE, PAGE_SHIFT, PAGE_SIZE
from .agent import NodeAgent
from .runtime import ClusterRuntime

REC = struct.Struct("<qQII")          # id, size (pages of a run or range), page, kind
RUN = struct.Struct("<qII")           # an answer's run: id, first page, pages
#: record kinds (runtime/rt_snurhac.c): an allocation, the end, a range to bring, "bring only the
#: ranges listed", a run of changed pages (new then old bytes), a run of changed pages whose old
#: bytes are all zero (new bytes only: a fresh allocation's copy-in)
ALLOC, END, RANGE, SCOPED, PAGES_RUN, PAGES_NEW = 0, 2, 3, 4, 5, 6
#: pages of changed runs stored at once (one fault batch) while the rest of a message comes
STREAM_PAGES = 8192


class LiveNode:
    """The agent side of one node's program."""

    def __init__(self, agent: NodeAgent, sock: socket.socket):
        self.agent = agent
        self.rt = ClusterRuntime(agent)
        self.sock = sock
        # read buffer (a message is hundreds of small records and page runs; the runtime waits
        # for the answer after each message, so nothing is left in it between messages)
        self._rb, self._rpos = bytearray(), 0
        # page runs of the batch being read, until stored (reused: no fresh memory to fault in)
        self._arena: np.ndarray | None = None
        self._arena_at = 0
        self.wfile = sock.makefile("wb", buffering=1 << 16)
        self.offset: dict[int, int] = {}
        self.size: dict[int, int] = {}
        self.next_off = 0
        self.st = {"launches": 0, "host_syncs": 0, "pages_sent": 0, "pages_sent_at_launch": 0, "pages_written": 0,
                   "scoped_launches": 0}

    # -- socket ------------------------------------------------------------------------------
    def wait_readable(self) -> None:
        """Serve the other nodes until the runtime has sent something. Not a blocking read: while
        the runtime compares its twins (hundreds of MiB for a large program's copy-in) the other
        nodes' faults on blocks this node owns or holds would wait for it; and a poll between
        any two reads, since a stream of page runs keeps the socket readable for hundreds of
        milliseconds. The socket is watched in the select that pauses between polls, so its bytes
        are taken at once; no spinning (but while pages are on their way from us: see
        NodeAgent.idle), which would take the CPU from the program comparing its twins."""
        while True:
            self.agent._poll()
            if select.select([self.sock], [], [], 0 if self.agent._sending else 0.0002)[0]:
                return

    def _fill(self, mv: memoryview) -> int:
        self.wait_readable()
        k = self.sock.recv_into(mv)
        if k == 0:
            raise EOFError
        return k

    def _recv(self, n: int) -> bytearray:
        """The runtime's next n bytes (see wait_readable)."""
        rb, pos = self._rb, self._rpos
        if len(rb) - pos >= n:
            self._rpos = pos + n
            return rb[pos:pos + n]
        out = bytearray(n)
        self._recv_into(memoryview(out))
        return out

    def _take(self, n: int) -> np.ndarray:
        """A page run's n bytes, read into the arena while it has room (handle() empties it after
        each batch it stores), else into a buffer of their own."""
        if self._arena is None:
            self._arena = np.empty(2 * (STREAM_PAGES + 1024) * PAGE_SIZE, np.uint8)
        at = self._arena_at
        out = self._arena[at:at + n] if at + n <= len(self._arena) else np.empty(n, np.uint8)
        self._arena_at += n if at + n <= len(self._arena) else 0
        self._recv_into(memoryview(out))
        return out

    def _recv_into(self, mv: memoryview) -> None:
        """Fill mv with the runtime's next bytes: small reads through a 1 MiB buffer, large ones
        straight into mv."""
        n = len(mv)
        rb, pos = self._rb, self._rpos
        have = min(len(rb) - pos, n)
        mv[:have] = rb[pos:pos + have]
        self._rpos = pos + have
        if self._rpos == len(rb):
            self._rb, self._rpos = bytearray(), 0
        while have < n:
            if n - have >= 1 << 20:
                have += self._fill(mv[have:])
                continue
            chunk = bytearray(1 << 20)
            k = self._fill(memoryview(chunk))
            take = min(k, n - have)
            mv[have:have + take] = chunk[:take]
            have += take
            if k > take:
                self._rb, self._rpos = chunk[take:k], 0

    def _records(self):
        """(id, size, page, kind, data) until the end record; a run's data is its pages' new
        then old bytes (PAGES_RUN) or new bytes alone (PAGES_NEW)."""
        while True:
            rid, size, page, kind = REC.unpack(self._recv(REC.size))
            if kind == END:
                return
            if kind not in (ALLOC, RANGE, SCOPED, PAGES_RUN, PAGES_NEW):
                raise ValueError(f"unknown record kind {kind} from the runtime")
            n = {PAGES_RUN: 2, PAGES_NEW: 1}.get(kind, 0) * size * PAGE_SIZE
            yield rid, size, page, kind, self._take(n) if n else b""

    def _place(self, rid: int, size: int) -> int:
        if rid not in self.offset:
            self.offset[rid] = self.next_off
            self.size[rid] = size
            self.next_off += (size + BLOCK_SIZE - 1) // BLOCK_SIZE * BLOCK_SIZE
            if self.next_off > len(self.agent.mem):
                raise MemoryError(f"the program's managed memory passes the UM space of {len(self.agent.mem)} bytes "
                                  "(--um-space)")
        return self.offset[rid]

    def _store_all(self, runs, host: bool = False) -> list[tuple[int, int]]:
        """Store the bytes the program changed, the runs' blocks faulted in together (one batch;
        ``host``: the host's changes, see NodeAgent.write_many); returns the pages whose agent
        copy then differs from the program's (another node's bytes of the same page came with the
        write fault): the program must get those back (not looked for in the host's changes: a
        page the host wrote is fetched, if the node lacks it, when a kernel needs it)."""
        items, where = [], []
        for rid, count, first, kind, data in runs:
            n = min(count * PAGE_SIZE, self.size[rid] - first * PAGE_SIZE)
            buf = np.frombuffer(data, np.uint8)
            addr = self.offset[rid] + first * PAGE_SIZE
            items.append((addr, buf[:n], buf[count * PAGE_SIZE:count * PAGE_SIZE + n] if kind == PAGES_RUN else 0))
            where.append((rid, first, count, addr))
            self.st["pages_written"] += count
        if not items:
            return []
        self.agent.write_many(items, host=host)
        merged = []
        for (rid, first, count, addr), (_, new, _) in zip(where, [] if host else items):
            n = len(new)
            if np.array_equal(self.agent.mem[addr:addr + n], new):
                continue
            differs = np.zeros(count * PAGE_SIZE, bool)
            differs[:n] = self.agent.mem[addr:addr + n] != new
            merged += [(rid, first + k) for k in np.flatnonzero(differs.reshape(-1, PAGE_SIZE).any(1)).tolist()]
        self._arena_at = 0     # the runs' bytes are no longer needed
        return merged

    def _answer(self, pages: list[tuple[int, int]]) -> None:
        """Hand the program these (id, page)s, as runs of consecutive pages: u32 runs, then per
        run its header and its pages' bytes, written from the UM space without a copy."""
        runs = []
        i = 0
        while i < len(pages):
            rid, first = pages[i]
            j = i + 1
            while j < len(pages) and pages[j] == (rid, first + (j - i)):
                j += 1
            runs.append((rid, first, j - i))
            i = j
        self.wfile.write(struct.pack("<I", len(runs)))
        for rid, first, n in runs:
            a = self.offset[rid] + first * PAGE_SIZE
            self.wfile.write(RUN.pack(rid, first, n))
            self.wfile.write(memoryview(self.agent.mem[a:a + n * PAGE_SIZE]))
        self.wfile.flush()
        self.st["pages_sent"] += len(pages)

    # -- one message from the runtime ----------------------------------------------------------
    def handle(self) -> bool:
        """One message; False at the end of the program (its socket closed)."""
        try:
            kind = self._recv(1)
        except EOFError:
            return False
        if kind in (b"B", b"S"):
            allocs, ro, written, host, ranges = [], [], [], [], []
            scoped = False
            for rid, size, code, k, data in self._records():
                if k == ALLOC:
                    off = self._place(rid, size)
                    allocs.append(rid)
                    if code == 1:
                        ro.append((off, size))
                    elif code == 2:
                        written.append((off, size))
                elif k in (PAGES_RUN, PAGES_NEW):
                    host.append((rid, size, code, k, data))
                    if sum(r[1] for r in host) >= STREAM_PAGES:   # stored while the runtime compares on
                        self._store_all(host, host=True)
                        host = []
                elif k == SCOPED:
                    scoped = True
                else:
                    ranges.append((rid, code, code + size))
            self._store_all(host, host=True)
            if kind == b"B":
                self.st["launches"] += 1
                self.st["scoped_launches"] += scoped
                # collective: node 0's host changes are stored before any node fetches (the
                # flags' barrier, else one of its own)
                if not self.rt.flags(ro, written):
                    self.agent._barrier()
            else:
                self.st["host_syncs"] += 1
            if not scoped:
                ranges = [(rid, 0, (self.size[rid] + PAGE_SIZE - 1) // PAGE_SIZE) for rid in allocs]
            sent = self._send_missing(ranges)
            if kind == b"B":
                self.st["pages_sent_at_launch"] += sent
        elif kind == b"E":
            merged, runs = [], []
            for rec in self._records():
                runs.append(rec)
                if sum(r[1] for r in runs) >= STREAM_PAGES:
                    merged += self._store_all(runs)
                    runs = []
            merged += self._store_all(runs)
            self.agent.kernel_done()
            # pages this node still maps whose agent copy carries other nodes' bytes too
            self._answer([(rid, pg) for rid, pg in merged
                          if self.agent.mapping[(self.offset[rid] >> PAGE_SHIFT) + pg] > 0])
        else:
            raise ValueError(f"unknown message {kind!r} from the runtime")
        return True

    def _send_missing(self, ranges: list[tuple[int, int, int]]) -> int:
        """Fault in every page of these (id, first page, end page) ranges this node lacks, all
        together, and hand over those that came from other nodes (the rest were never touched:
        zeros, as in the program); returns how many."""
        spans = []
        for rid, p_lo, p_hi in ranges:
            off, size = self.offset[rid], self.size[rid]
            p_hi = min(p_hi, (size + PAGE_SIZE - 1) // PAGE_SIZE)
            if p_hi > p_lo:
                p0 = off >> PAGE_SHIFT
                spans.append((rid, p_lo, p_hi, self.agent.mapping[p0 + p_lo:p0 + p_hi] == 0))
        got = self.agent.read_many([(self.offset[rid] + lo * PAGE_SIZE,
                                     min(self.size[rid], hi * PAGE_SIZE) - lo * PAGE_SIZE) for rid, lo, hi, _ in spans])
        came = np.zeros(len(self.agent.mapping), bool)
        came[got] = True
        out = []
        for rid, p_lo, p_hi, lacked in spans:
            p0 = (self.offset[rid] >> PAGE_SHIFT) + p_lo
            out += [(rid, p_lo + k) for k in np.flatnonzero(lacked & came[p0:p0 + p_hi - p_lo]).tolist()]
        self._answer(out)
        return len(out)


def host_gpus() -> int:
    """GPUs of this host, without CUDA: the driver's /proc entries, else ``nvidia-smi -L``."""
    d = "/proc/driver/nvidia/gpus"
    if os.path.isdir(d):
        n = len(os.listdir(d))
        if n:
            return n
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for ln in out.splitlines() if ln.startswith("GPU "))


def local_devices(local_rank: int, local_size: int, gpus_per_node: int, visible: str | None,
                  present: int) -> str | None:
    """CUDA_VISIBLE_DEVICES for this rank's program when several ranks share a host: its own
    ``gpus_per_node`` GPUs (of those CUDA_VISIBLE_DEVICES already lists, if set), so that ranks
    one a GPU are one a GPU (each runtime uses its local GPUs 0..M-1). None (leave it) for one rank
    a host, or when the host has too few GPUs for a share each (ranks then share GPUs, as two
    ranks on one GPU do)."""
    if local_size <= 1:
        return None
    ids = [v.strip() for v in visible.split(",") if v.strip()] if visible is not None else \
        [str(i) for i in range(present)]
    if len(ids) < local_size * gpus_per_node:
        return None
    return ",".join(ids[local_rank * gpus_per_node:(local_rank + 1) * gpus_per_node])


def run_node(cmd: list[str], *, gpus_per_node: int, um_space: int, timeout_s: float = 60.0,
             library: str | None = None, env: dict | None = None, bind: bool = True) -> tuple[int, dict]:
    """This rank's node: start ``cmd`` under the runtime, serve it and the other nodes until
    every node's program has ended. Returns the program's exit status and the statistics.
    ``bind``: ranks sharing a host get a GPU share each (:func:`local_devices`)."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    agent = NodeAgent(comm, um_space, timeout_s=timeout_s)
    ours, theirs = socket.socketpair()
    for sk in (ours, theirs):     # fewer, larger reads and writes of page runs
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            sk.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)
    kw = {"library": library} if library else {}
    e = child_env(env, managed=True, gpus=str(agent.nodes * gpus_per_node), node_gpus=str(gpus_per_node),
                  node=str(agent.node), cluster_fd=str(theirs.fileno()), **kw)
    if bind:
        local = comm.Split_type(MPI.COMM_TYPE_SHARED)
        vis = local_devices(local.Get_rank(), local.Get_size(), gpus_per_node, e.get("CUDA_VISIBLE_DEVICES"),
                            host_gpus())
        local.Free()
        if vis is not None:
            e["CUDA_VISIBLE_DEVICES"] = vis
    proc = subprocess.Popen(cmd, env=e, pass_fds=[theirs.fileno()])
    theirs.close()
    node = LiveNode(agent, ours)
    try:
        while True:
            node.wait_readable()
            if not node.handle():
                break
    except BaseException:
        proc.kill()
        raise
    rc = proc.wait()
    agent._barrier()          # serve the others until every node's program has ended
    st = {"node": agent.node, "rc": rc, **node.st, **agent.stats(), **node.rt.st}
    return rc, st


def mpirun_command(hosts: str, cmd: list[str], *, gpus_per_node: int = 1, mpirun: str = "mpirun",
                   um_space: int | None = None) -> list[str]:
    """The mpirun line that runs ``cmd`` as one node a host: ``hosts`` is host[:slots],... as
    mpirun's -H takes it (a host with k slots is k nodes)."""
    from .. import UmctlError

    n = 0
    for h in hosts.split(","):
        name, _, slots = h.strip().partition(":")
        if not name or (slots and not (slots.isdigit() and int(slots) > 0)):
            raise UmctlError(f"--hosts: {h!r} is not host[:slots]")
        n += int(slots or 1)
    line = [mpirun, "-H", hosts, "-n", str(n)]
    if os.geteuid() == 0:
        line.append("--allow-run-as-root")
    line += [sys.executable, "-m", "umctl.cluster.live", "--gpus", str(gpus_per_node)]
    if um_space:
        line += ["--um-space", str(um_space)]
    return line + ["--", *cmd]


def main(argv: list[str] | None = None) -> int:
    """`mpirun -n N python3 -m umctl.cluster.live [--gpus M] [--um-space BYTES] -- prog args`."""
    import argparse
    import json

    from .agent import ClusterError

    ap = argparse.ArgumentParser(prog="umctl.cluster.live")
    ap.add_argument("--gpus", type=int, default=1, help="GPUs of each node")
    ap.add_argument("--um-space", type=int, default=1 << 30, help="bytes of managed memory the program may use")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds without a message before giving up")
    ap.add_argument("--stats", help="write each node's statistics to STATS.<rank>.json")
    ap.add_argument("--library", help="the runtime library to preload (default: the package's)")
    ap.add_argument("--no-bind", action="store_true", help="leave CUDA_VISIBLE_DEVICES alone where several ranks "
                    "share a host (default: each rank's program gets its own --gpus GPUs)")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        print("error: no program given (-- prog args)", file=sys.stderr)
        return 2
    try:
        rc, st = run_node(cmd, gpus_per_node=a.gpus, um_space=a.um_space, timeout_s=a.timeout, library=a.library,
                          bind=not a.no_bind)
    except (ClusterError, MemoryError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        from mpi4py import MPI
        MPI.COMM_WORLD.Abort(3)
        return 3
    if a.stats:
        with open(f"{a.stats}.{st['node']}.json", "w") as f:
            json.dump(st, f)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
