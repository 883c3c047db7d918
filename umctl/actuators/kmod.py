"""Actuator ``kmod``: controller commands through the umctl kernel module (kmod/umctl).

Same interface as :class:`umctl.actuators.uvm.UvmActuator` — ``submit(COMMAND batch) -> cmd
ids``, ``results() -> RESULT records``, ``stats()``, ``close()`` — but the commands travel as
generic netlink messages (family ``umctl``, kmod/umctl/umctl_genl.h) to the module, which checks
that we may steer the target (ptrace-equivalent rights or the admin's policy), queues them
(bounded) and executes them in its worker; every accepted command's result comes back as a
``RESULT`` message, and every refused one as the netlink error of its request. So unlike the
``uvm`` actuator, this one needs no file descriptor of the target's, and a controller without
ptrace rights can steer the jobs the admin allowed.

pyroute2 resolves the family (id, multicast groups) and defines the message layout
(:class:`UmctlMsg`); the hot path packs and parses the fixed attribute layout with ``struct``
(tests check it byte for byte against pyroute2's encoder), because pyroute2 costs ~100 us per
message, more than the kernel's whole path.

The module executes a command with the driver's own ioctls (UVM_MIGRATE / UVM_DISCARD) on the
target's va_space file; UVM_MIGRATE names its destination by processor UUID. When this actuator
knows the GPUs' UUIDs (``gpu_uuids``: GPU index -> 16 bytes, e.g. from the tools API's processor
table) it sends the destination's UUID with each PREFETCH / PREEVICT (attribute DST_UUID);
otherwise the module maps the DST index through its ``gpu_uuids`` parameter (set by the admin).

Commands are sent without NLM_F_ACK: an accepted command is answered by its RESULT, a refused one
by an error ack (netlink always acks errors), matched back through the sequence number.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
import threading
import time

import numpy as np

from .. import UmctlError
from .base import ActuatorBase
from ..events.schema import COMMAND_DTYPE, Op, Status

# -- protocol (kmod/umctl/umctl_genl.h) ------------------------------------------------------
FAMILY, VERSION, MCGRP_EVENTS = "umctl", 1, "events"
(A_UNSPEC, A_PID, A_ADDR, A_LEN, A_DST, A_EXEC_ID, A_CMD_ID, A_STATUS, A_BYTES, A_LATENCY_NS, A_ERRNO,
 A_PAD, A_DST_UUID, A_NV_STATUS) = range(14)
CMD_PREFETCH, CMD_PREEVICT, CMD_INVALIDATE, CMD_RESULT = 1, 2, 3, 4
CMD_FASTPATH_ENABLE, CMD_FASTPATH_DISABLE = 5, 6   # umctl/actuators/fastpath.py
FASTPATH_CMD_ID = 1 << 63   # the CMD_ID bit of results of commands the kfunc queued
OP_CMD = {Op.PREFETCH: CMD_PREFETCH, Op.PREEVICT: CMD_PREEVICT, Op.INVALIDATE: CMD_INVALIDATE}

NETLINK_GENERIC = 16
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR, NLMSG_DONE = 2, 3
_NLH = struct.Struct("=IHHII")      # len, type, flags, seq, pid
_GENLH = struct.Struct("=BBH")      # cmd, version, reserved
_NLA = struct.Struct("=HH")
# the request's attributes, in this order: PID u32, ADDR u64, LEN u64, DST s32, EXEC_ID s64, CMD_ID u64
_REQ = struct.Struct("=HHI" "HHQ" "HHQ" "HHi" "HHq" "HHQ")
REQ_LEN = _NLH.size + _GENLH.size + _REQ.size
_UUID_NLA = struct.Struct("=HH16s")   # the optional DST_UUID, after the fixed part
UUID_LEN = _UUID_NLA.size

#: refusals (the request's errno) -> Status
_ERRNO_STATUS = {errno.ESRCH: Status.TARGET_GONE, errno.ERANGE: Status.RANGE_INVALID,
                 errno.EBUSY: Status.SKIPPED, errno.ENOSPC: Status.SKIPPED}


def _umctl_msg_class():
    """pyroute2's description of our messages (family resolution and the encoding cross-check)."""
    from pyroute2.netlink import genlmsg

    class UmctlMsg(genlmsg):
        nla_map = (("UMCTL_A_UNSPEC", "none"), ("UMCTL_A_PID", "uint32"), ("UMCTL_A_ADDR", "uint64"),
                   ("UMCTL_A_LEN", "uint64"), ("UMCTL_A_DST", "int32"), ("UMCTL_A_EXEC_ID", "int64"),
                   ("UMCTL_A_CMD_ID", "uint64"), ("UMCTL_A_STATUS", "uint32"), ("UMCTL_A_BYTES", "uint64"),
                   ("UMCTL_A_LATENCY_NS", "uint64"), ("UMCTL_A_ERRNO", "int32"), ("UMCTL_A_PAD", "none"),
                   ("UMCTL_A_DST_UUID", "cdata"), ("UMCTL_A_NV_STATUS", "uint32"))

    return UmctlMsg


def resolve_family() -> tuple[int, dict[str, int]]:
    """(family id, multicast groups) of ``umctl``; one-line UmctlError when it is not there."""
    try:
        from pyroute2.netlink.generic import GenericNetlinkSocket
    except ImportError:
        raise UmctlError("the kmod actuator needs pyroute2 (pip install pyroute2)") from None
    s = GenericNetlinkSocket()
    try:
        s.bind(FAMILY, _umctl_msg_class())
        return int(s.prid), dict(s.mcast_groups or {})
    except Exception as e:  # noqa: BLE001 - pyroute2 raises NetlinkError(ENOENT) and others
        raise UmctlError(f"generic netlink family '{FAMILY}' not found ({e.__class__.__name__}): "
                         "load the umctl kernel module (kmod/umctl, insmod umctl.ko)") from None
    finally:
        s.close()


def encode(family: int, cmd: int, seq: int, pid: int, addr: int, nbytes: int, dst: int, exec_id: int,
           cmd_id: int, dst_uuid: bytes | None = None) -> bytes:
    """One request message (fixed layout: every attribute present, see _REQ; DST_UUID last, when
    given)."""
    tail = b"" if dst_uuid is None else _UUID_NLA.pack(UUID_LEN, A_DST_UUID, bytes(dst_uuid))
    return (_NLH.pack(REQ_LEN + len(tail), family, NLM_F_REQUEST, seq & 0xFFFFFFFF, 0) + _GENLH.pack(cmd, VERSION, 0)
            + _REQ.pack(8, A_PID, pid, 12, A_ADDR, addr, 12, A_LEN, nbytes, 8, A_DST, dst, 12, A_EXEC_ID,
                        exec_id, 12, A_CMD_ID, cmd_id) + tail)


def parse_uuid(text: str) -> bytes:
    """'GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx' (as nvidia-smi and the module parameters print
    one) -> 16 bytes; a one-line UmctlError otherwise."""
    t = text.strip()
    h = (t[4:] if t.upper().startswith("GPU-") else t).replace("-", "")
    try:
        b = bytes.fromhex(h)
    except ValueError:
        b = b""
    if len(b) != 16:
        raise UmctlError(f"not a GPU UUID: {text!r}")
    return b


def parse_attrs(buf: bytes, off: int, end: int) -> dict[int, bytes]:
    out = {}
    while off + 4 <= end:
        ln, typ = _NLA.unpack_from(buf, off)
        if ln < 4:
            break
        out[typ & 0x3FFF] = buf[off + 4: off + ln]
        off += (ln + 3) & ~3
    return out


class KmodActuator(ActuatorBase):
    """Runs COMMAND batches through the umctl kernel module (see the module docstring)."""

    def __init__(self, *, family: int | None = None, rcvbuf: int = 8 << 20, start: bool = True,
                 gpu_uuids: dict[int, bytes] | None = None) -> None:
        self.family = resolve_family()[0] if family is None else int(family)
        #: GPU index -> UUID (16 bytes): sent as DST_UUID with PREFETCH / PREEVICT to that GPU
        self.gpu_uuids = {int(k): bytes(v) for k, v in (gpu_uuids or {}).items()}
        for k, v in self.gpu_uuids.items():
            if len(v) != 16:
                raise UmctlError(f"GPU {k}: a UUID has 16 bytes, not {len(v)}")
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_GENERIC)
        for opt in (33, socket.SO_RCVBUF):   # SO_RCVBUFFORCE (root) first
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, opt, rcvbuf)
                break
            except OSError:
                continue
        self.sock.bind((0, 0))
        super().__init__(threading.Lock())
        self._cv = threading.Condition(self._lock)
        self._seq_to_id: dict[int, int] = {}
        self._outstanding = 0
        self._stop = False
        self.counts = {"submitted": 0, "sent": 0, "results": 0, "ok": 0, "failed": 0, "target_gone": 0,
                       "range_invalid": 0, "skipped": 0, "refused": 0, "unsupported": 0, "send_errors": 0,
                       "recv_overruns": 0}
        self.refusals: dict[str, int] = {}
        #: errno names of executed commands that failed (module's ERRNO attribute), e.g. ENODEV:
        #: the target has no UVM va_space file; EFAULT: the driver said NV_ERR_INVALID_ADDRESS
        self.result_errnos: dict[str, int] = {}
        self.bytes = 0
        self.latency_ns = 0
        self._thread = threading.Thread(target=self._recv_loop, name="umctl-kmod", daemon=True)
        if start:
            self._thread.start()

    # ------------------------------------------------------------------ submit
    def submit(self, cmds: np.ndarray) -> np.ndarray:
        """Send a COMMAND batch (blocks only for the kernel's validation, never for execution).
        Returns the cmd_ids given; ADVISE / STAGE are not carried by the module (SKIPPED)."""
        if cmds is None or len(cmds) == 0:
            return np.zeros(0, np.int64)
        if cmds.dtype != COMMAND_DTYPE:
            raise TypeError("commands must be a COMMAND batch")
        ids = self._new_ids(len(cmds))
        msgs = []
        with self._lock:
            for c, cid in zip(cmds.tolist(), ids.tolist()):
                _t, _id, op, pid, addr, nbytes, dst, _adv, exec_id, _prio = c
                self.counts["submitted"] += 1
                cmd = OP_CMD.get(op)
                if cmd is None:
                    self.counts["unsupported"] += 1
                    self._result(cid, Status.SKIPPED, 0, 0)
                    continue
                seq = cid & 0xFFFFFFFF   # the request's sequence number is its cmd id's low half
                self._seq_to_id[seq] = cid
                self._outstanding += 1
                d = dst if dst >= -1 else -1
                uuid = self.gpu_uuids.get(d) if cmd != CMD_INVALIDATE and d >= 0 else None
                msgs.append((cid, seq, encode(self.family, cmd, seq, pid, addr, nbytes, d, exec_id, cid, uuid)))
        for cid, seq, m in msgs:
            try:
                self.sock.send(m)
                self.counts["sent"] += 1
            except OSError as e:
                with self._lock:
                    self.counts["send_errors"] += 1
                    if self._seq_to_id.pop(seq, None) is not None:
                        self._outstanding -= 1
                    self._refused(cid, e.errno or errno.EIO)
        return ids

    # ------------------------------------------------------------------ receive
    def _recv_loop(self) -> None:
        self.sock.settimeout(0.1)
        while not self._stop:
            try:
                buf = self.sock.recv(1 << 16)
            except socket.timeout:
                continue
            except OSError as e:
                if e.errno == errno.ENOBUFS:   # results dropped by the kernel: our buffer overflowed
                    self.counts["recv_overruns"] += 1
                    continue
                if self._stop:
                    return
                continue
            self._parse(buf)

    def _parse(self, buf: bytes) -> None:
        off = 0
        with self._cv:
            while off + _NLH.size <= len(buf):
                ln, typ, _flags, seq, _pid = _NLH.unpack_from(buf, off)
                if ln < _NLH.size:
                    break
                if typ == NLMSG_ERROR:
                    err = -struct.unpack_from("=i", buf, off + _NLH.size)[0]
                    oseq = _NLH.unpack_from(buf, off + _NLH.size + 4)[3]
                    cid = self._seq_to_id.pop(oseq, None)
                    if cid is not None and err:
                        self._outstanding -= 1
                        self._refused(cid, err)
                elif typ == self.family and ln >= _NLH.size + _GENLH.size:
                    cmd = buf[off + _NLH.size]
                    if cmd == CMD_RESULT:
                        a = parse_attrs(buf, off + _NLH.size + _GENLH.size, off + ln)
                        self._on_result(a)
                off += (ln + 3) & ~3
            self._cv.notify_all()

    def _on_result(self, a: dict[int, bytes]) -> None:
        def u(k: int, fmt: str = "=Q", default: int = 0) -> int:
            v = a.get(k)
            return struct.unpack(fmt, v[:struct.calcsize(fmt)])[0] if v and len(v) >= struct.calcsize(fmt) else default

        cid = u(A_CMD_ID)
        if self._seq_to_id.pop(cid & 0xFFFFFFFF, None) is None:
            return   # not ours (another controller's result on the multicast group) or answered
        self._outstanding -= 1
        status = u(A_STATUS, "=I", int(Status.FAILED))
        nbytes, lat = u(A_BYTES), u(A_LATENCY_NS)
        err = -u(A_ERRNO, "=i", 0)
        if err > 0:
            name = errno.errorcode.get(err, str(err))
            self.result_errnos[name] = self.result_errnos.get(name, 0) + 1
        self._result(cid, Status(status) if status in Status._value2member_map_ else Status.FAILED, nbytes, lat)

    def _refused(self, cid: int, err: int) -> None:
        name = errno.errorcode.get(err, str(err))
        self.refusals[name] = self.refusals.get(name, 0) + 1
        self.counts["refused"] += 1
        self._result(cid, _ERRNO_STATUS.get(err, Status.FAILED), 0, 0)

    def _result(self, cid: int, status: Status, nbytes: int, lat: int) -> None:
        self._result_row(cid, status, nbytes, lat)
        self.counts["results"] += 1
        key = {Status.OK: "ok", Status.FAILED: "failed", Status.TARGET_GONE: "target_gone",
               Status.RANGE_INVALID: "range_invalid", Status.SKIPPED: "skipped"}[status]
        self.counts[key] += 1
        self.bytes += nbytes
        self.latency_ns += lat

    # ------------------------------------------------------------------ results / lifecycle
    def _pending_locked(self) -> int:
        return self._outstanding

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Block until every sent command has been answered."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while self._outstanding > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(min(left, 0.1))
        return True

    def stats(self) -> dict:
        with self._lock:
            return {"counts": dict(self.counts), "refusals": dict(self.refusals),
                    "result_errnos": dict(self.result_errnos), "bytes": self.bytes,
                    "latency_ms": round(self.latency_ns / 1e6, 2), "pending": self._outstanding,
                    "family": self.family}

    def close(self, drain: bool = False, timeout: float = 5.0) -> None:
        if drain:
            self.wait_idle(timeout)
        self._stop = True
        if self._thread.is_alive():
            self._thread.join(1.0)
        self.sock.close()


__all__ = ["KmodActuator", "encode", "resolve_family", "parse_attrs", "parse_uuid", "REQ_LEN"]
