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

REC = struct.Struct("<qQII")          # id, size (pages of a run or range), page, kind
RUN = struct.Struct("<qII")           # an answer's run: id, first page, pages
#: record kinds (runtime/rt_snurhac.c): an allocation, the end, a range to bring, "bring only the
#: ranges listed", a run of changed pages
ALLOC, END, RANGE, SCOPED, PAGES_RUN = 0, 2, 3, 4, 5


class LiveNode:
    """The agent side of one node's program."""

    def __init__(self, agent: NodeAgent, sock: socket.socket):
        self.agent = agent
        self.rt = ClusterRuntime(agent)
        self.sock = sock
        # buffered: a message is hundreds of small records and page runs; the runtime waits for
        # the answer after each message, so nothing is left in the buffer between messages
        self.rfile = sock.makefile("rb", buffering=1 << 20)
        self.offset: dict[int, int] = {}
        self.size: dict[int, int] = {}
        self.next_off = 0
        self.st = {"launches": 0, "host_syncs": 0, "pages_sent": 0, "pages_sent_at_launch": 0, "pages_written": 0,
                   "scoped_launches": 0}

    # -- socket ------------------------------------------------------------------------------
    def _recv(self, n: int) -> bytes:
        got = self.rfile.read(n)
        if got is None or len(got) < n:
            raise EOFError
        return got

    def _records(self):
        """(id, size, page, kind, data) until the end record; a run's data is its pages' new
        then old bytes."""
        while True:
            rid, size, page, kind = REC.unpack(self._recv(REC.size))
            if kind == END:
                return
            if kind not in (ALLOC, RANGE, SCOPED, PAGES_RUN):
                raise ValueError(f"unknown record kind {kind} from the runtime")
            data = self._recv(2 * size * PAGE_SIZE) if kind == PAGES_RUN else b""
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

    def _store_all(self, runs) -> list[tuple[int, int]]:
        """Store the bytes the program changed, one write (one fault per UM block) per run of
        consecutive pages; returns the pages whose agent copy then differs from the program's
        (another node's bytes of the same page came with the write fault): the program must
        get those back."""
        merged = []
        for rid, count, first, data in runs:
            buf = np.frombuffer(data, np.uint8).reshape(2, count * PAGE_SIZE)
            n = min(count * PAGE_SIZE, self.size[rid] - first * PAGE_SIZE)
            new, old = buf[0, :n], buf[1, :n]
            mask = new != old
            if mask.any():
                addr = self.offset[rid] + first * PAGE_SIZE
                self.agent.write(addr, new, mask)
                self.st["pages_written"] += count
                differs = np.zeros(count * PAGE_SIZE, bool)
                differs[:n] = self.agent.mem[addr:addr + n] != new
                merged += [(rid, first + k) for k in np.flatnonzero(differs.reshape(-1, PAGE_SIZE).any(1)).tolist()]
        return merged

    def _answer(self, pages: list[tuple[int, int]]) -> None:
        """Hand the program these (id, page)s, as runs of consecutive pages: u32 runs, then per
        run its header and its pages' bytes from the UM space."""
        parts = []
        runs = 0
        i = 0
        while i < len(pages):
            rid, first = pages[i]
            j = i + 1
            while j < len(pages) and pages[j] == (rid, first + (j - i)):
                j += 1
            a = self.offset[rid] + first * PAGE_SIZE
            parts += [RUN.pack(rid, first, j - i), self.agent.mem[a:a + (j - i) * PAGE_SIZE].tobytes()]
            runs += 1
            i = j
        self.st["pages_sent"] += len(pages)
        self.sock.sendall(struct.pack("<I", runs) + b"".join(parts))

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
                elif k == PAGES_RUN:
                    host.append((rid, size, code, data))
                elif k == SCOPED:
                    scoped = True
                else:
                    ranges.append((rid, code, code + size))
            self._store_all(host)
            if kind == b"B":
                self.st["launches"] += 1
                self.st["scoped_launches"] += scoped
                self.rt.flags(ro, written)
            else:
                self.st["host_syncs"] += 1
            if not scoped:
                ranges = [(rid, 0, (self.size[rid] + PAGE_SIZE - 1) // PAGE_SIZE) for rid in allocs]
            sent = self._send_missing(ranges)
            if kind == b"B":
                self.st["pages_sent_at_launch"] += sent
        elif kind == b"E":
            merged = self._store_all((rid, size, page, data) for rid, size, page, _, data in self._records())
            self.agent.kernel_done()
            # pages this node still maps whose agent copy carries other nodes' bytes too
            self._answer([(rid, pg) for rid, pg in merged
                          if self.agent.mapping[(self.offset[rid] >> PAGE_SHIFT) + pg] > 0])
        else:
            raise ValueError(f"unknown message {kind!r} from the runtime")
        return True

    def _send_missing(self, ranges: list[tuple[int, int, int]]) -> int:
        """Fault in every page of these (id, first page, end page) ranges this node lacks, and
        hand them over; returns how many."""
        out = []
        for rid, p_lo, p_hi in ranges:
            off, size = self.offset[rid], self.size[rid]
            p_hi = min(p_hi, (size + PAGE_SIZE - 1) // PAGE_SIZE)
            if p_hi <= p_lo:
                continue
            p0 = off >> PAGE_SHIFT
            before = self.agent.mapping[p0 + p_lo:p0 + p_hi].copy()
            lo = p_lo * PAGE_SIZE
            self.agent.read(off + lo, min(size, p_hi * PAGE_SIZE) - lo)
            out += [(rid, p_lo + k) for k in np.flatnonzero(before == 0).tolist()]
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
    last = time.monotonic()
    try:
        while True:
            ready, _, _ = select.select([ours], [], [], 0)
            if ready:
                if not node.handle():
                    break
                last = time.monotonic()
            elif agent._poll():
                last = time.monotonic()
            else:
                agent.idle(time.monotonic() - last)
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
