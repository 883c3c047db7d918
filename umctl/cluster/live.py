"""A node's agent for a live program: one MPI rank a node starts the program under the runtime
(LD_PRELOAD, its node's share of each partitioned grid) and keeps its UM space coherent with the
other nodes' through :class:`NodeAgent`.

The runtime talks to the agent over a socket at SnuRHAC's synchronisation points (the protocol
is in runtime/rt_snurhac.c, "SnuRHAC across nodes"): before a partitioned launch it lists the
managed allocations with the kernel's read-only marks and the pages the host changed (node 0),
and gets back the pages its node lacks; after its slabs it sends the pages they changed (new and
old bytes) and waits for the cluster-wide synchronisation after the kernel. Allocations are laid
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
import time

import numpy as np

from ..runtime import child_env
from ..units import BLOCK_SIZE, PAGE_SHIFT, PAGE_SIZE
from .agent import NodeAgent
from .runtime import ClusterRuntime

REC = struct.Struct("<qQII")          # id, size, page (or read-only code), kind
ANSWER = struct.Struct("<qII")        # id, page, pad


class LiveNode:
    """The agent side of one node's program."""

    def __init__(self, agent: NodeAgent, sock: socket.socket):
        self.agent = agent
        self.rt = ClusterRuntime(agent)
        self.sock = sock
        self.offset: dict[int, int] = {}
        self.size: dict[int, int] = {}
        self.next_off = 0
        self.st = {"launches": 0, "host_syncs": 0, "pages_sent": 0, "pages_written": 0}

    # -- socket ------------------------------------------------------------------------------
    def _recv(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            got = self.sock.recv(n - len(buf))
            if not got:
                raise EOFError
            buf += got
        return bytes(buf)

    def _records(self):
        while True:
            rid, size, page, kind = REC.unpack(self._recv(REC.size))
            if kind == 2:
                return
            data = self._recv(2 * PAGE_SIZE) if kind == 1 else b""
            yield rid, size, page, kind, data

    def _place(self, rid: int, size: int) -> int:
        if rid not in self.offset:
            self.offset[rid] = self.next_off
            self.size[rid] = size
            self.next_off += (size + BLOCK_SIZE - 1) // BLOCK_SIZE * BLOCK_SIZE
            if self.next_off > len(self.agent.mem):
                raise MemoryError(f"the program's managed memory passes the UM space of {len(self.agent.mem)} bytes "
                                  "(--um-space)")
        return self.offset[rid]

    def _store_all(self, records) -> list[tuple[int, int]]:
        """Store the bytes the program changed, one write (one fault per UM block) per run of
        consecutive pages; returns the pages whose agent copy then differs from the program's
        (another node's bytes of the same page came with the write fault): the program must
        get those back."""
        pages = [(rid, page, data) for rid, _, page, _, data in records]
        merged = []
        i = 0
        while i < len(pages):
            j = i + 1
            while j < len(pages) and pages[j][0] == pages[i][0] and pages[j][1] == pages[j - 1][1] + 1:
                j += 1
            rid, first = pages[i][0], pages[i][1]
            buf = np.frombuffer(b"".join(d for _, _, d in pages[i:j]), np.uint8).reshape(j - i, 2, PAGE_SIZE)
            new, old = buf[:, 0].ravel(), buf[:, 1].ravel()
            n = min((j - i) * PAGE_SIZE, self.size[rid] - first * PAGE_SIZE)
            mask = (new != old)[:n]
            if mask.any():
                addr = self.offset[rid] + first * PAGE_SIZE
                self.agent.write(addr, new[:n], mask)
                self.st["pages_written"] += j - i
                differs = np.zeros((j - i) * PAGE_SIZE, bool)
                differs[:n] = self.agent.mem[addr:addr + n] != new[:n]
                merged += [(rid, first + k) for k in np.flatnonzero(differs.reshape(-1, PAGE_SIZE).any(1)).tolist()]
            i = j
        return merged

    def _page(self, rid: int, page: int) -> bytes:
        a = self.offset[rid] + page * PAGE_SIZE
        return ANSWER.pack(rid, page, 0) + self.agent.mem[a:a + PAGE_SIZE].tobytes()

    # -- one message from the runtime ----------------------------------------------------------
    def handle(self) -> bool:
        """One message; False at the end of the program (its socket closed)."""
        try:
            kind = self._recv(1)
        except EOFError:
            return False
        if kind in (b"B", b"S"):
            allocs, ro, written, host = [], [], [], []
            for rid, size, code, k, data in self._records():
                if k == 0:
                    off = self._place(rid, size)
                    allocs.append(rid)
                    if code == 1:
                        ro.append((off, size))
                    elif code == 2:
                        written.append((off, size))
                else:
                    host.append((rid, size, code, k, data))
            self._store_all(host)
            if kind == b"B":
                self.st["launches"] += 1
                self.rt.flags(ro, written)
            else:
                self.st["host_syncs"] += 1
            self._send_missing(allocs)
        elif kind == b"E":
            merged = self._store_all(self._records())
            self.agent.kernel_done()
            # pages this node still maps whose agent copy carries other nodes' bytes too
            back = [self._page(rid, pg) for rid, pg in merged
                    if self.agent.mapping[(self.offset[rid] >> PAGE_SHIFT) + pg] > 0]
            self.st["pages_sent"] += len(back)
            self.sock.sendall(struct.pack("<I", len(back)) + b"".join(back))
        else:
            raise ValueError(f"unknown message {kind!r} from the runtime")
        return True

    def _send_missing(self, allocs: list[int]) -> None:
        """Fault in every page of these allocations this node lacks, and hand them over."""
        out = []
        for rid in allocs:
            off, size = self.offset[rid], self.size[rid]
            p0 = off >> PAGE_SHIFT
            before = self.agent.mapping[p0:p0 + (size + PAGE_SIZE - 1) // PAGE_SIZE].copy()
            self.agent.read(off, size)
            out += [self._page(rid, k) for k in np.flatnonzero(before == 0).tolist()]
        self.st["pages_sent"] += len(out)
        self.sock.sendall(struct.pack("<I", len(out)) + b"".join(out))


def run_node(cmd: list[str], *, gpus_per_node: int, um_space: int, timeout_s: float = 60.0,
             library: str | None = None, env: dict | None = None) -> tuple[int, dict]:
    """This rank's node: start ``cmd`` under the runtime, serve it and the other nodes until
    every node's program has ended. Returns the program's exit status and the statistics."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    agent = NodeAgent(comm, um_space, timeout_s=timeout_s)
    ours, theirs = socket.socketpair()
    kw = {"library": library} if library else {}
    e = child_env(env, managed=True, gpus=str(agent.nodes * gpus_per_node), node_gpus=str(gpus_per_node),
                  node=str(agent.node), cluster_fd=str(theirs.fileno()), **kw)
    proc = subprocess.Popen(cmd, env=e, pass_fds=[theirs.fileno()])
    theirs.close()
    node = LiveNode(agent, ours)
    try:
        while True:
            ready, _, _ = select.select([ours], [], [], 0)
            if ready:
                if not node.handle():
                    break
            elif not agent._poll():
                time.sleep(0.0002)
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
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        print("error: no program given (-- prog args)", file=sys.stderr)
        return 2
    try:
        rc, st = run_node(cmd, gpus_per_node=a.gpus, um_space=a.um_space, timeout_s=a.timeout, library=a.library)
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
