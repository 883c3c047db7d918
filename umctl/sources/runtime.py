"""Source ``runtime``: what the in-process runtime (``runtime/umctl_rt.c``, preloaded by
``umctl run``) reports from inside the program — launches with exact kernel names and argument
hashes, allocations (incl. allocator blocks going inactive/active) and copies.

The runtime sends unix datagrams (never blocking the program: a full socket drops records, and
the next datagram that gets through carries the cumulative drop counts, which become
Kind.DROPS records here). Each datagram is a header plus records laid out exactly like
``DTYPES[Kind.LAUNCH|ALLOC|COPY]``, so a datagram decodes with one ``np.frombuffer``. Kernel names
arrive in NAMES datagrams keyed by a per-process id, which this source maps into one
session-wide, append-only name list (``EventBatch.names``). Several processes (a program and its
exec'ed children) may share one socket.
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import time
from typing import Callable

import numpy as np

from .. import UmctlError
from ..events.schema import DTYPES, EventBatch, Kind, drops_record, empty

MAGIC = 0x54524D55
VERSION = 1
HEADER_DTYPE = np.dtype([("magic", "<u4"), ("version", "<u2"), ("kind", "u1"), ("pad", "u1"),
                         ("count", "<u4"), ("pid", "<i4"), ("drops", "<u8", (3,))])
assert HEADER_DTYPE.itemsize == 40   # struct umrt_header in runtime/umctl_rt.h
WIRE_KINDS: dict[int, Kind] = {1: Kind.LAUNCH, 2: Kind.ALLOC, 3: Kind.COPY}
NAMES_KIND = 4
DISCARD_KIND = 5        # umctl -> runtime: discard these ranges where safe (UMCTL_RT_CONTROL=1)
DISCARD_DONE_KIND = 6   # runtime -> umctl: what it discarded, and what it kept and why
#: struct umrt_discard / umrt_discard_done in runtime/umctl_rt.h
DISCARD_DTYPE = np.dtype([("id", "<i8"), ("addr", "<u8"), ("bytes", "<u8"), ("uvm_fd", "<i4"), ("pad", "<u4")])
DISCARD_DONE_DTYPE = np.dtype([("id", "<i8"), ("addr", "<u8"), ("bytes", "<u8"), ("status", "<i4"), ("pad", "<u4")])
assert DISCARD_DTYPE.itemsize == DISCARD_DONE_DTYPE.itemsize == 32
RECORD_SIZES = {Kind.LAUNCH: 82, Kind.ALLOC: 38, Kind.COPY: 56}   # _Static_assert-ed in umctl_rt.h
for _k, _n in RECORD_SIZES.items():
    assert DTYPES[_k].itemsize == _n, (_k, DTYPES[_k].itemsize)
MAX_DGRAM = 1 << 16


class RuntimeDecoder:
    """Datagrams -> event arrays. Kept apart from the socket so the decoding is tested on bytes."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self._index: dict[str, int] = {}
        self._ids: dict[tuple[int, int], int] = {}   # (pid, runtime name id) -> index in names
        self._drops: dict[tuple[int, int], int] = {}  # (pid, wire kind) -> cumulative drops seen
        self.bad = 0   # datagrams that were not ours (wrong magic/version/size)

    def _intern(self, name: str) -> int:
        i = self._index.get(name)
        if i is None:
            i = self._index[name] = len(self.names)
            self.names.append(name)
        return i

    def decode(self, data: bytes, now_ns: int = 0) -> list[tuple[Kind | int, np.ndarray]]:
        """The records of one datagram (plus DROPS records when its drop counters grew); a
        discard answer comes as (DISCARD_DONE_KIND, records)."""
        if len(data) < HEADER_DTYPE.itemsize:
            self.bad += 1
            return []
        h = np.frombuffer(data, HEADER_DTYPE, count=1)[0]
        if int(h["magic"]) != MAGIC or int(h["version"]) != VERSION:
            self.bad += 1
            return []
        pid, kind, count = int(h["pid"]), int(h["kind"]), int(h["count"])
        body = data[HEADER_DTYPE.itemsize:]
        out: list[tuple[Kind, np.ndarray]] = []
        for w, k in WIRE_KINDS.items():
            total = int(h["drops"][w - 1])
            prev = self._drops.get((pid, w), 0)
            if total > prev:
                out.append((Kind.DROPS, drops_record(now_ns, k, total - prev)))
                self._drops[(pid, w)] = total
        if kind == DISCARD_DONE_KIND:
            if len(body) != count * DISCARD_DONE_DTYPE.itemsize:
                self.bad += 1
                return out
            out.append((DISCARD_DONE_KIND, np.frombuffer(body, DISCARD_DONE_DTYPE, count=count).copy()))
            return out
        if kind == NAMES_KIND:
            off = 0
            for _ in range(count):
                if off + 6 > len(body):
                    self.bad += 1
                    break
                rid = int.from_bytes(body[off:off + 4], "little", signed=True)
                n = int.from_bytes(body[off + 4:off + 6], "little")
                name = body[off + 6:off + 6 + n].decode(errors="replace")
                self._ids[(pid, rid)] = self._intern(name)
                off += 6 + n
            return out
        k = WIRE_KINDS.get(kind)
        if k is None or len(body) != count * DTYPES[k].itemsize:
            self.bad += 1
            return out
        recs = np.frombuffer(body, DTYPES[k], count=count).copy()
        if k is Kind.LAUNCH and len(recs):
            ids = self._ids
            recs["name_id"] = [ids.get((pid, int(i)), -1) if i >= 0 else -1 for i in recs["name_id"]]
        out.append((k, recs))
        return out


class KernelStarts:
    """Launch records re-timed to when their kernel *started* on the GPU.

    With ``UMCTL_RT_TRACK_END=1`` the runtime also reports each kernel's end (a LAUNCH record
    with ``t_ns == -1``, ``t_end_ns`` and the launch's ``seq``). Kernels on one stream run in
    launch order, so a kernel starts when the one before it on its stream ended: a launch is
    held back until then and released with ``t_ns`` = that end (or its own launch time if its
    stream was idle). That is the execution-ID transition DeepUM's driver sees (its runtime
    reports it from a stream callback); a host that queues a whole step ahead otherwise makes
    every launch look current at once. A launch whose predecessor's end never arrives (the
    runtime dropped it) is released after ``hold_ns`` with its launch time."""

    def __init__(self, hold_ns: int = 500_000_000):
        self.hold_ns = hold_ns
        self._stream_of: dict[tuple[int, int], tuple[int, int]] = {}   # (pid, seq) -> (pid, stream)
        self._open: dict[tuple[int, int], list[int]] = {}               # stream -> seqs not ended
        self._held: dict[tuple[int, int], list[np.void]] = {}           # stream -> launches held
        self._last_end: dict[tuple[int, int], int] = {}

    def feed(self, recs: np.ndarray, now_ns: int) -> np.ndarray:
        out: list[np.ndarray] = []
        for r in recs:
            pid, seq = int(r["pid"]), int(r["seq"])
            if int(r["t_ns"]) == -1:                     # an end notice
                key = self._stream_of.pop((pid, seq), None)
                if key is None:
                    continue
                opened = self._open.get(key, [])
                if seq in opened:
                    opened.remove(seq)
                t_end = int(r["t_end_ns"])
                self._last_end[key] = t_end
                self._release(key, t_end, out)
                continue
            key = (pid, int(r["stream"]))
            self._stream_of[(pid, seq)] = key
            opened = self._open.setdefault(key, [])
            opened.append(seq)
            if len(opened) == 1:                          # the stream was idle: starts now
                rec = r.copy()
                rec["t_ns"] = max(int(r["t_ns"]), self._last_end.get(key, 0))
                out.append(np.array([rec]))
            else:
                self._held.setdefault(key, []).append(r.copy())
        for key, held in self._held.items():             # a lost end notice must not stall us
            while held and now_ns - int(held[0]["t_ns"]) > self.hold_ns:
                rec = held.pop(0)
                opened = self._open.get(key, [])
                while opened and opened[0] != int(rec["seq"]):
                    self._stream_of.pop((key[0], opened.pop(0)), None)
                out.append(np.array([rec]))
        if not out:
            return recs[:0]
        res = np.concatenate(out)
        return res[np.argsort(res["t_ns"], kind="stable")]

    def _release(self, key, t_end: int, out: list) -> None:
        held = self._held.get(key)
        opened = self._open.get(key, [])
        while held and opened and int(held[0]["seq"]) == opened[0]:
            rec = held.pop(0)
            rec["t_ns"] = max(int(rec["t_ns"]), t_end)
            out.append(np.array([rec]))
            break   # the next one starts when this one ends


class RuntimeSource:
    """Listens on a unix datagram socket for the runtime's reports. Usage::

        with RuntimeSource() as src:                 # binds a fresh socket path
            env = umctl.runtime.child_env(socket=src.path, hum=True)
            subprocess.Popen(cmd, env=env)
            batch = src.drain()                      # records since the last drain

    ``path`` None: a fresh path in a private temporary directory. The receive buffer is enlarged
    (``rcvbuf`` bytes) so that bursts of launches are not dropped while the drain thread sleeps.
    """

    def __init__(self, path: str | os.PathLike | None = None, *, rcvbuf: int = 8 << 20,
                 kernel_starts: bool = False) -> None:
        self._tmpdir: str | None = None
        if path is None:
            self._tmpdir = tempfile.mkdtemp(prefix="umctl-rt-")
            path = os.path.join(self._tmpdir, "rt.sock")
        self.path = str(path)
        if len(self.path.encode()) >= 108:
            raise UmctlError(f"runtime socket path is too long for a unix socket: {self.path}")
        self.decoder = RuntimeDecoder()
        self.names = self.decoder.names
        self._lock = threading.Lock()
        self._pending: dict[Kind, list[np.ndarray]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self._rcvbuf = rcvbuf
        self.datagrams = 0
        #: the newest record time received (target's CLOCK_MONOTONIC, as the tools API's): the
        #: runtime flushes every 2 ms, so its stream is complete up to about here. The budget
        #: check holds fault evidence back to it (umctl/loop/budget_check.py, *Faults wait*)
        self.watermark_ns: int | None = None
        #: pid -> the address its runtime sends from (autobound when UMCTL_RT_CONTROL=1): where
        #: requests for that process go
        self.peers: dict[int, bytes | str] = {}
        #: discard requests awaiting their answer: id -> (deadline, callback)
        self._waiting: dict[int, tuple[float, Callable[[np.ndarray | None], None]]] = {}
        self._next_request = 1
        #: with the runtime's end tracking on (UMCTL_RT_TRACK_END=1): launches at kernel start
        self.starts = KernelStarts() if kernel_starts else None

    def start(self) -> None:
        if self._sock is not None:
            raise UmctlError("RuntimeSource already started")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._rcvbuf)
            if os.path.exists(self.path):
                os.unlink(self.path)
            s.bind(self.path)
        except OSError as e:
            s.close()
            raise UmctlError(f"cannot listen on {self.path}: {e.strerror or e}") from None
        s.settimeout(0.05)
        self._sock = s
        self._thread = threading.Thread(target=self._loop, name="umctl-runtime-source", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            try:
                data, addr = self._sock.recvfrom(MAX_DGRAM)
            except TimeoutError:
                self._expire()
                continue
            except OSError:
                return
            self._take(data, addr)
            self._expire()

    def _take(self, data: bytes, addr: bytes | str | None = None) -> None:
        parts = self.decoder.decode(data, time.monotonic_ns())
        answered = []
        with self._lock:
            self.datagrams += 1
            if addr and len(data) >= HEADER_DTYPE.itemsize:
                self.peers[int(np.frombuffer(data, HEADER_DTYPE, count=1)[0]["pid"])] = addr
            for k, a in parts:
                if k in (Kind.LAUNCH, Kind.ALLOC, Kind.COPY) and len(a):
                    t = int(a["t_ns"].max())
                    if t > 0 and (self.watermark_ns is None or t > self.watermark_ns):
                        self.watermark_ns = t
                if k == DISCARD_DONE_KIND:   # one datagram answers one request
                    w = self._waiting.pop(int(a["id"][0]), None) if len(a) else None
                    if w is not None:
                        answered.append((w[1], a))
                else:
                    self._pending.setdefault(k, []).append(a)
        for cb, a in answered:
            cb(a)

    def _expire(self) -> None:
        if not self._waiting:   # the common case, checked per datagram: no request pending
            return
        now = time.monotonic()
        with self._lock:
            late = [rid for rid, (t, _) in self._waiting.items() if t <= now]
            cbs = [self._waiting.pop(rid)[1] for rid in late]
        for cb in cbs:
            cb(None)

    def discard_async(self, pid: int, addr: int, nbytes: int, uvm_fd: int,
                      callback: Callable[[np.ndarray | None], None], timeout: float = 0.5) -> bool:
        """Ask process ``pid``'s runtime to discard ``[addr, addr + nbytes)`` where that is safe
        (runtime/umctl_rt.h: UMRT_DISCARD); ``callback`` gets its DISCARD_DONE records, or None
        if no answer came within ``timeout`` s (then nothing may be taken as discarded), on this
        source's thread. False (no callback) when the process has no control channel yet or
        the request could not be sent. Asynchronous because the answer needs this source's
        thread, and under the control loop's GIL pressure a wait for it took milliseconds."""
        with self._lock:
            peer = self.peers.get(pid)
            rid = self._next_request
            self._next_request += 1
            if peer is None or self._sock is None:
                return False
            self._waiting[rid] = (time.monotonic() + timeout, callback)
        h = np.zeros(1, HEADER_DTYPE)
        h["magic"], h["version"], h["kind"], h["count"], h["pid"] = MAGIC, VERSION, DISCARD_KIND, 1, os.getpid()
        r = np.zeros(1, DISCARD_DTYPE)
        r["id"], r["addr"], r["bytes"], r["uvm_fd"] = rid, addr, nbytes, uvm_fd
        try:
            self._sock.sendto(h.tobytes() + r.tobytes(), peer)
        except OSError:   # the process is gone (or its queue is full): keep everything
            with self._lock:
                self._waiting.pop(rid, None)
            return False
        return True

    def drain(self) -> EventBatch:
        """Records received since the last call, by kind, with ``names`` = the session's names."""
        with self._lock:
            pend, self._pending = self._pending, {}
        now = time.monotonic_ns()
        batch = EventBatch(now_ns=now, names=self.names, runtime_ns=self.watermark_ns)
        for k, parts in pend.items():
            recs = np.concatenate(parts) if len(parts) > 1 else parts[0]
            if k is Kind.LAUNCH:
                recs = self.starts.feed(recs, now) if self.starts is not None else recs[recs["t_ns"] != -1]
            if len(recs):
                batch.add(k, recs)
        if self.starts is not None and Kind.LAUNCH not in pend:
            late = self.starts.feed(empty(Kind.LAUNCH), now)   # held launches past their time
            if len(late):
                batch.add(Kind.LAUNCH, late)
        return batch

    def close(self) -> None:
        """Stop listening (idempotent); datagrams already queued in the socket are read first."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._sock is not None:
            self._sock.setblocking(False)
            while True:
                try:
                    self._take(*self._sock.recvfrom(MAX_DGRAM))
                except OSError:
                    break
            self._sock.close()
            self._sock = None
        for p in (self.path,):
            try:
                os.unlink(p)
            except OSError:
                pass
        if self._tmpdir is not None:
            try:
                os.rmdir(self._tmpdir)
            except OSError:
                pass
            self._tmpdir = None

    def __enter__(self) -> RuntimeSource:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["RuntimeSource", "RuntimeDecoder", "HEADER_DTYPE", "MAGIC", "DISCARD_DTYPE", "DISCARD_DONE_DTYPE"]
