"""Actuator-side fast path: DeepUM's prefetch walk at fault time, in the kernel.

The controller (``umctl/controller/deepum.py``) learns, per execution ID, a UM-block correlation
table (start block, end block, up to NumSuccs successors per block) and predicts the next
kernels. Acting on it from user space costs a trip: the fault reaches the ring, a drain, the
controller, a command, the module's queue. :class:`FastPath` mirrors the tables of the current
and the next predicted kernels into the BPF map that ``bpf/fastpath.bpf.c`` walks inside the
driver's fault-servicing thread, where each predicted block is queued through the umctl module's
kfunc ``bpf_umctl_enqueue`` while the faulting batch is being serviced. The learning stays in
Python; no controller policy changes — this module only reads the controller's tables.

What runs where (docs/guide/kernel.md has the whole table):
  * :meth:`FastPath.sync` — Python, the live loop's thread: a merged view (current kernel's table
    first, then the predicted kernels'; each kernel's end block linked to the next one's start
    block) written to the ``successors`` map, only the entries that changed;
  * the walk — BPF, fentry on ``service_fault_batch``, in the driver's fault thread;
  * the commands — the umctl module's worker (process context), results multicast on the
    module's ``events`` group, which :meth:`FastPath.results` reads here.

Permission is the module's: ``FASTPATH_ENABLE(pid)`` is checked like any command (ptrace rights
or the admin's policy) and the kfunc refuses every other pid.
"""

from __future__ import annotations

import ctypes as C
import errno
import os
import socket
import struct
import threading
import time
from typing import Any

import numpy as np

from .. import UmctlError
from . import kmod

NSUCCS = 4
CMD_FASTPATH_ENABLE, CMD_FASTPATH_DISABLE, FASTPATH_CMD_ID = (kmod.CMD_FASTPATH_ENABLE, kmod.CMD_FASTPATH_DISABLE,
                                                            kmod.FASTPATH_CMD_ID)
SOL_NETLINK, NETLINK_ADD_MEMBERSHIP = 270, 1
COUNTER_NAMES = ("batches", "starts", "steps", "enqueued", "refused", "failed", "recent")


class BlockKey(C.Structure):
    _fields_ = [("pid", C.c_int32), ("pad", C.c_uint32), ("block", C.c_uint64)]


class Succs(C.Structure):
    _fields_ = [("block", C.c_uint64 * NSUCCS)]


class Config(C.Structure):
    _fields_ = [("degree", C.c_uint32), ("pad", C.c_uint32), ("requeue_ns", C.c_uint64)]


def merged_successors(ctl: Any, kernels: int = 4) -> dict[int, tuple[int, ...]]:
    """The successor lists the walk needs, from a DeepUM controller's tables: the current
    kernel's table, then those of the next ``kernels - 1`` predicted kernels (a block in several
    tables keeps the earlier kernel's successors), each kernel's end block followed by the next
    kernel's start block (DeepUM's chaining across execution IDs). Block numbers, MRU first."""
    if ctl.cur is None:
        return {}
    order = [ctl.cur]
    hist = tuple(([-1, -1, -1] + ctl.history[:-1])[-3:])
    cur = ctl.cur
    while len(order) < kernels:
        nxt = ctl.exec_table.predict(hist, cur)
        if nxt is None or nxt in order:
            break
        order.append(nxt)
        hist, cur = (hist[1], hist[2], cur), nxt
    out: dict[int, list[int]] = {}
    for i, x in enumerate(order):
        t = ctl.tables.get(x)
        if t is None:
            continue
        for b in t.keys():
            if b not in out:
                out[b] = list(t.successors(b, 0))[:NSUCCS]
        nt = ctl.tables.get(order[i + 1]) if i + 1 < len(order) else None
        if t.end is not None and nt is not None and nt.start is not None:
            s = out.setdefault(t.end, [])
            if nt.start not in s:
                s[:] = [nt.start] + s[: NSUCCS - 1]   # the next kernel first: the walk follows it
    return {b: tuple(s) for b, s in out.items() if s}


def _netlink_request(family: int, cmd: int, pid: int) -> None:
    """One genl request with PID and an ack; a one-line UmctlError on refusal."""
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, kmod.NETLINK_GENERIC)
    try:
        s.bind((0, 0))
        s.settimeout(5)
        body = kmod._GENLH.pack(cmd, kmod.VERSION, 0) + struct.pack("=HHI", 8, kmod.A_PID, pid)
        s.send(kmod._NLH.pack(kmod._NLH.size + len(body), family, kmod.NLM_F_REQUEST | kmod.NLM_F_ACK, 1, 0) + body)
        buf = s.recv(4096)
    finally:
        s.close()
    _ln, typ, _f, _seq, _p = kmod._NLH.unpack_from(buf, 0)
    err = -struct.unpack_from("=i", buf, kmod._NLH.size)[0] if typ == kmod.NLMSG_ERROR else errno.EPROTO
    if err:
        what = "enable" if cmd == CMD_FASTPATH_ENABLE else "disable"
        hint = {errno.EPERM: " (needs the right to ptrace it, or the module's allow_pids/allow_uids)",
                errno.ESRCH: " (no such process)", errno.ENOSPC: " (every fast-path slot is taken)",
                errno.EOPNOTSUPP: " (the loaded umctl module has no fast path: rebuild it)"}.get(err, "")
        raise UmctlError(f"umctl fast path: cannot {what} pid {pid}: {errno.errorcode.get(err, err)}{hint}")


class FastPath:
    """The fast path for one target: the BPF walk attached, the module told, the map in sync."""

    def __init__(self, pid: int, *, degree: int = 64, requeue_ms: float = 50.0, kernels: int = 4,
                 enable: bool = True) -> None:
        if degree < 1 or degree > 4096:
            raise UmctlError(f"fast path degree {degree} out of range (1..4096)")
        if requeue_ms < 0:
            raise UmctlError(f"fast path requeue_ms {requeue_ms} must be >= 0")
        if not os.path.exists(f"/proc/{pid}"):
            raise UmctlError(f"no such process: {pid}")
        from ..bpf import libbpf as lb
        from ..bpf import object_path

        self.pid, self.kernels = int(pid), int(kernels)
        self._lb = lb
        self.family, groups = kmod.resolve_family()
        if not os.path.exists("/sys/module/umctl/parameters/fastpath_kfunc") or \
                open("/sys/module/umctl/parameters/fastpath_kfunc").read().strip() != "Y":
            raise UmctlError("umctl fast path: the loaded umctl module has no kfunc bpf_umctl_enqueue "
                             "(module BTF or its .BTF_ids missing: build it as tests/vm/run.sh does)")
        self._obj = lb.BpfObject(object_path("fastpath.bpf.o"))
        self._link = None
        self._mirror: dict[int, tuple[int, ...]] = {}
        self._results: list[tuple] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.enabled = False
        try:
            try:
                self._obj.load()
            except UmctlError as e:
                raise UmctlError(f"umctl fast path: cannot load fastpath.bpf.o ({e}); "
                                 "observation (--source kprobe) works without it") from None
            self._succ_fd = self._obj.map_fd("successors")
            self._counters_fd = self._obj.map_fd("fp_counters")
            lb.map_update(self._obj.map_fd("config"), C.c_uint32(0),
                          Config(degree=int(degree), requeue_ns=int(requeue_ms * 1e6)))
            self.serve(self.pid)
            # results of kfunc-queued commands come only on the multicast group
            self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, kmod.NETLINK_GENERIC)
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            self._sock.bind((0, 0))
            self._sock.setsockopt(SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, groups[kmod.MCGRP_EVENTS])
            self._sock.settimeout(0.1)
            self._thread = threading.Thread(target=self._recv_loop, name="umctl-fastpath", daemon=True)
            self._thread.start()
            if enable:
                self.enable()
            self._link = self._obj.attach("fp_service_fault_batch")
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ module / BPF side
    def enable(self, pid: int | None = None) -> None:
        """Ask the module to accept kfunc commands for ``pid`` (default: the target)."""
        _netlink_request(self.family, CMD_FASTPATH_ENABLE, self.pid if pid is None else pid)
        self.enabled = True

    def disable(self, pid: int | None = None) -> None:
        _netlink_request(self.family, CMD_FASTPATH_DISABLE, self.pid if pid is None else pid)
        self.enabled = False

    def serve(self, pid: int) -> None:
        """Let the BPF walk run for ``pid``'s faults (the module still decides: tests use this to
        show that it refuses pids nobody enabled)."""
        self._lb.map_update(self._obj.map_fd("pids"), C.c_int32(pid), C.c_uint8(1))

    def set_successors(self, pid: int, table: dict[int, tuple[int, ...]]) -> None:
        """Write successor lists for ``pid`` as they are (no mirror bookkeeping; tests)."""
        for b, s in table.items():
            v = Succs()
            for i, x in enumerate(s[:NSUCCS]):
                v.block[i] = x
            self._lb.map_update(self._succ_fd, BlockKey(pid=pid, block=b), v)

    def sync(self, ctl: Any) -> int:
        """Mirror the controller's current and predicted kernels' tables into the map; returns
        how many entries were written or deleted."""
        want = merged_successors(ctl, self.kernels)
        changed = {b: s for b, s in want.items() if self._mirror.get(b) != s}
        gone = [b for b in self._mirror if b not in want]
        self.set_successors(self.pid, changed)
        for b in gone:
            self._lb.map_delete(self._succ_fd, BlockKey(pid=self.pid, block=b))
        self._mirror = want
        return len(changed) + len(gone)

    def counters(self) -> dict[str, int]:
        return self._lb.percpu_counters(self._counters_fd, COUNTER_NAMES)

    # ------------------------------------------------------------------ results
    def _recv_loop(self) -> None:
        while not self._stop.is_set():
            try:
                buf = self._sock.recv(1 << 16)
            except socket.timeout:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                continue
            off, rows = 0, []
            while off + kmod._NLH.size <= len(buf):
                ln, typ = kmod._NLH.unpack_from(buf, off)[:2]
                if ln < kmod._NLH.size:
                    break
                if typ == self.family and buf[off + kmod._NLH.size] == kmod.CMD_RESULT:
                    a = kmod.parse_attrs(buf, off + kmod._NLH.size + kmod._GENLH.size, off + ln)
                    cid = struct.unpack("=Q", a.get(kmod.A_CMD_ID, bytes(8))[:8])[0]
                    if cid & FASTPATH_CMD_ID:
                        rows.append((time.monotonic_ns(), cid & ~FASTPATH_CMD_ID,
                                     struct.unpack("=I", a[kmod.A_STATUS][:4])[0],
                                     struct.unpack("=I", a[kmod.A_PID][:4])[0],
                                     struct.unpack("=Q", a[kmod.A_ADDR][:8])[0],
                                     struct.unpack("=Q", a[kmod.A_BYTES][:8])[0],
                                     struct.unpack("=Q", a[kmod.A_LATENCY_NS][:8])[0]))
                off += (ln + 3) & ~3
            if rows:
                with self._lock:
                    self._results += rows

    RESULT_DTYPE = np.dtype([("t_ns", np.int64), ("seq", np.int64), ("status", np.uint32), ("pid", np.int32),
                             ("addr", np.uint64), ("bytes", np.uint64), ("latency_ns", np.uint64)])

    def results(self) -> np.ndarray:
        """Results of kfunc-queued commands since the last call (``latency_ns``: from the kfunc
        call, i.e. the faulting batch's service, to the command executed)."""
        with self._lock:
            rows, self._results = self._results, []
        return np.array(rows, dtype=self.RESULT_DTYPE) if rows else np.zeros(0, self.RESULT_DTYPE)

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Detach, tell the module, stop listening; the BPF object is unloaded (which releases
        the module reference the kfunc call holds, so umctl can be unloaded)."""
        if getattr(self, "_link", None) is not None:
            self._link.destroy()
            self._link = None
        if self.enabled:
            try:
                self.disable()
            except UmctlError:
                pass
        self._stop.set()
        t = getattr(self, "_thread", None)
        if t is not None and t.is_alive():
            t.join(1.0)
        if getattr(self, "_sock", None) is not None:
            self._sock.close()
            self._sock = None
        if self._obj is not None:
            self._obj.close()
            self._obj = None

    def __enter__(self) -> "FastPath":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["FastPath", "merged_successors"]
