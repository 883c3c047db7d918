"""Source ``uprobes``: kernel-launch events of one running process, from BPF uprobes on libcuda.

The UVM tools API says which pages faulted but not which kernel touched them; DeepUM-style
policies key their prefetch tables on an *execution identity* (kernel + arguments). This source
supplies it without touching the target: ``bpf/launch.bpf.c`` (built into the package as
``umctl/bpf/launch.bpf.o``) is attached with uprobes to libcuda's launch entry points and with
return probes to the calls that hand out kernel handles, and streams records through a BPF ring
buffer that a background thread drains.

What is probed and why (measured on the GPU machine, docs/evaluation/measurements.md):
  * ``cuLaunchKernel`` (torch elementwise kernels, cupy) and ``cuLaunchKernelEx`` (cuBLAS) and
    their per-thread-default-stream ``_ptsz`` twins, plus ``cuLaunchCooperativeKernel(_ptsz)``:
    every kernel launch of the runtime and driver APIs ends in one of these.
  * return probes on ``cuModuleGetFunction`` / ``cuLibraryGetKernel`` map handle -> name, and on
    ``cuKernelGetFunction`` map a CUfunction to the CUkernel it came from. CUDA 13 loads lazily,
    so only kernels whose handles are fetched after :meth:`LaunchProbe.start` get names; the
    others are identified by their handle.
  * ``cudaLaunchKernel(_ptsz)`` in libcudart and ``cuGraphLaunch(_ptsz)`` only count (see
    :meth:`LaunchProbe.stats`): a runtime launch also fires ``cuLaunchKernel``, so turning it into
    an event would count it twice; a count that exceeds the driver's shows a gap. Kernels inside
    CUDA graphs are not seen one by one.
"""

from __future__ import annotations

import ctypes as C
import os
import platform
import re
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from .. import UmctlError
from ..bpf.reader import RingReader
from ..events.schema import DTYPES, EventBatch, Kind, drops_record, empty
from ..workload.workload import exec_hash as _exec_hash

# -- the record format of bpf/launch.bpf.c (struct event) -----------------------------------

MAX_PROBES = 64
CNT_RB_DROPS = MAX_PROBES
CNT_FILTERED = MAX_PROBES + 1
NARGS = 8
NAME_LEN = 128
EV_LAUNCH, EV_NAME, EV_ALIAS = 1, 2, 3
ARGS_NONE, ARGS_PARAMS, ARGS_BUFFER = 0, 1, 2
FLAG_ALIAS = 1 << 16   # bpf_cookie flag: the entry probe keeps argument 2 (cuKernelGetFunction)

RAW_DTYPE = np.dtype([
    ("t_ns", np.uint64), ("kind", np.uint32), ("probe", np.uint32), ("pid", np.uint32), ("tid", np.uint32),
    ("func", np.uint64), ("stream", np.uint64), ("grid", np.uint32, (3,)), ("block", np.uint32, (3,)),
    ("smem", np.uint32), ("args_mode", np.uint32), ("nargs", np.uint32), ("name_len", np.int32),
    ("name_ptr", np.uint64), ("args", np.uint64, (NARGS,)), ("name", f"S{NAME_LEN}"),
])
assert RAW_DTYPE.itemsize == 280, RAW_DTYPE.itemsize   # sizeof(struct event) in launch.bpf.c

MAX_NAME = 4096      # longest name read through /proc/PID/mem
_HASH_CACHE = 1 << 16


@dataclass(frozen=True)
class ProbeSpec:
    """One attachment: ``symbol`` of ``lib`` ("cuda" or "cudart") runs BPF program ``program``."""

    symbol: str
    program: str
    lib: str = "cuda"
    retprobe: bool = False
    flags: int = 0
    required: bool = False

    @property
    def label(self) -> str:
        return self.symbol + ("(ret)" if self.retprobe else "")


#: What LaunchProbe attaches, in probe-id order (the id is the index; the BPF side counts hits
#: per id). Only cuLaunchKernel is required: the others are absent in older drivers (and in our
#: test library some are), and a missing optional symbol only shows in stats()["not_attached"].
PROBES: tuple[ProbeSpec, ...] = (
    ProbeSpec("cuLaunchKernel", "cu_launch", required=True),
    ProbeSpec("cuLaunchKernel_ptsz", "cu_launch"),
    ProbeSpec("cuLaunchKernelEx", "cu_launch_ex"),
    ProbeSpec("cuLaunchKernelEx_ptsz", "cu_launch_ex"),
    ProbeSpec("cuLaunchCooperativeKernel", "cu_launch_coop"),
    ProbeSpec("cuLaunchCooperativeKernel_ptsz", "cu_launch_coop"),
    ProbeSpec("cuModuleGetFunction", "get_handle_entry"),
    ProbeSpec("cuModuleGetFunction", "get_handle_ret", retprobe=True),
    ProbeSpec("cuLibraryGetKernel", "get_handle_entry"),
    ProbeSpec("cuLibraryGetKernel", "get_handle_ret", retprobe=True),
    ProbeSpec("cuKernelGetFunction", "get_handle_entry", flags=FLAG_ALIAS),
    ProbeSpec("cuKernelGetFunction", "get_handle_ret", retprobe=True, flags=FLAG_ALIAS),
    ProbeSpec("cuGraphLaunch", "count_only"),
    ProbeSpec("cuGraphLaunch_ptsz", "count_only"),
    ProbeSpec("cudaLaunchKernel", "count_only", lib="cudart"),
    ProbeSpec("cudaLaunchKernel_ptsz", "count_only", lib="cudart"),
)
assert len(PROBES) <= MAX_PROBES

_LIBCUDA_RE = re.compile(r"/libcuda\.so(\.\d+)*$")
_LIBCUDART_RE = re.compile(r"/libcudart\.so(\.\d+)*$")


# -- pure helpers (tested without BPF) ----------------------------------------------------

def mapped_libraries(pid: int, pattern: re.Pattern[str]) -> list[str]:
    """Distinct file paths mapped by ``pid`` whose path matches ``pattern``, in map order."""
    try:
        text = Path(f"/proc/{pid}/maps").read_text()
    except FileNotFoundError:
        raise UmctlError(f"no such process: {pid}") from None
    except PermissionError:
        raise UmctlError(f"no permission to read /proc/{pid}/maps (run as root)") from None
    out: list[str] = []
    for line in text.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6:
            path = parts[5].removesuffix(" (deleted)")
            if pattern.search(path) and path not in out:
                out.append(path)
    return out


def _target_path(pid: int, path: str) -> str:
    """A path under which this process reaches the target's file: the path itself when it is the
    same file here, else through /proc/PID/root (a target in another mount namespace)."""
    alt = f"/proc/{pid}/root{path}"
    try:
        if os.path.samefile(path, alt):
            return path
    except OSError:
        pass
    return alt if os.path.exists(alt) else path


def read_cstring(pid: int, addr: int, limit: int = MAX_NAME) -> str | None:
    """The NUL-terminated string at ``addr`` in process ``pid`` (via /proc/PID/mem, which,
    unlike bpf_probe_read_user, faults non-resident pages in); None when unreadable."""
    if not addr:
        return None
    try:
        with open(f"/proc/{pid}/mem", "rb", buffering=0) as f:
            f.seek(addr)
            data = f.read(limit)
    except (OSError, OverflowError, ValueError):
        return None
    s = data.split(b"\0", 1)[0]
    return s.decode(errors="replace") if s else None


@lru_cache(maxsize=1)
def _cxa_demangle() -> Any:
    """libstdc++'s ``__cxa_demangle`` (the reference demangler for Itanium names), or None."""
    try:
        lib = C.CDLL("libstdc++.so.6")
        fn = lib.__cxa_demangle
    except (OSError, AttributeError):
        return None
    fn.restype = C.c_void_p
    fn.argtypes = [C.c_char_p, C.c_void_p, C.c_void_p, C.POINTER(C.c_int)]
    return fn


_libc = C.CDLL(None)
_libc.free.argtypes = [C.c_void_p]


def demangle(name: str) -> str | None:
    """The demangled C++ signature of ``name``; None for extern "C" names and failures."""
    fn = _cxa_demangle()
    if fn is None or not name.startswith("_Z"):
        return None
    status = C.c_int(0)
    p = fn(name.encode(), None, None, C.byref(status))
    if not p or status.value != 0:
        return None
    try:
        return C.string_at(p).decode(errors="replace")
    finally:
        _libc.free(p)


_SCALAR_SIZES = {
    "bool": 1, "char": 1, "signed char": 1, "unsigned char": 1,
    "short": 2, "unsigned short": 2, "wchar_t": 4, "char16_t": 2, "char32_t": 4,
    "int": 4, "unsigned int": 4, "float": 4,
    "long": 8, "unsigned long": 8, "long long": 8, "unsigned long long": 8, "double": 8,
    "decltype(nullptr)": 8,
}


def _split_params(sig: str) -> list[str] | None:
    """The parameter types of a demangled function signature ``name<...>(T1, T2, ...)``."""
    s = sig.rstrip()
    for q in (" const", " volatile"):
        s = s.removesuffix(q)
    if not s.endswith(")"):
        return None
    depth = 0
    start = -1
    for i in range(len(s) - 1, -1, -1):   # find the '(' matching the final ')'
        c = s[i]
        if c in ")>]":
            depth += 1
        elif c in "(<[":
            depth -= 1
            if depth == 0:
                start = i
                break
    if start < 0 or s[start] != "(":
        return None
    body = s[start + 1:-1]
    params, depth, cur = [], 0, []
    for c in body:
        if c in "(<[":
            depth += 1
        elif c in ")>]":
            depth -= 1
        if c == "," and depth == 0:
            params.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
    last = "".join(cur).strip()
    if last and last != "void":
        params.append(last)
    return params


def param_sizes(name: str) -> list[int | None] | None:
    """Byte size of each kernel parameter whose size the mangled ``name`` makes certain
    (scalars, pointers, references), None for the others (structs: size and padding unknown);
    None when the name carries no signature (extern "C" kernels). The execution identity uses
    only arguments of known size, because bytes beyond an argument are not the argument and
    would make the identity of repeated launches differ."""
    sig = demangle(name)
    if sig is None:
        return None
    params = _split_params(sig)
    if params is None:
        return None
    out: list[int | None] = []
    for p in params:
        t = p
        for q in ("const ", "volatile "):
            while t.startswith(q):
                t = t[len(q):]
        t = t.removesuffix(" const").removesuffix(" volatile").strip()
        if t.endswith("*") or t.endswith("&"):
            out.append(8)
        else:
            out.append(_SCALAR_SIZES.get(t))
    return out


def launch_identity(name: str | None, func: int, grid: tuple[int, ...], block: tuple[int, ...], smem: int,
                    args_mode: int, nargs: int, args: tuple[int, ...], sizes: list[int | None] | None) -> int:
    """DeepUM's execution ID (§3.1: kernel name + arguments), from what a uprobe can read.

    Always: the launch geometry (grid, block, dynamic shared memory). Kernel arguments: with
    ``kernelParams``, argument i is in when the signature gives its size (see
    :func:`param_sizes`), masked to that size; with the ``extra`` buffer, its first bytes as given.
    An unknown name (handle fetched before attach) hashes the handle instead — stable for the
    life of the target, not across runs."""
    geometry = (tuple(int(x) for x in grid), tuple(int(x) for x in block), int(smem))
    if name is None:
        return _exec_hash(f"func 0x{func:x}", geometry)
    argv: tuple = ()
    if args_mode == ARGS_PARAMS and sizes:
        vals = []
        for i, size in enumerate(sizes[:min(nargs, NARGS)]):
            if size:
                vals.append((i, int(args[i]) & ((1 << (8 * size)) - 1)))
        argv = tuple(vals)
    elif args_mode == ARGS_BUFFER:
        n = min(int(nargs), 8 * NARGS)
        argv = (np.asarray(args, dtype=np.uint64).tobytes()[:n],)
    return _exec_hash(name, geometry + argv)


class NameTable:
    """The append-only kernel-name list a probe hands out with every batch, plus handle -> id.

    Handles come from cuModuleGetFunction / cuLibraryGetKernel (name known) and from
    cuKernelGetFunction (a CUfunction standing for a CUkernel: inherits its name, possibly
    learned later, hence resolved at lookup)."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self._index: dict[str, int] = {}
        self._by_handle: dict[int, int] = {}
        self._alias: dict[int, int] = {}
        self._sizes: dict[int, list[int | None] | None] = {}

    def intern(self, name: str) -> int:
        i = self._index.get(name)
        if i is None:
            i = self._index[name] = len(self.names)
            self.names.append(name)
        return i

    def bind(self, handle: int, name: str) -> int:
        i = self._by_handle[handle] = self.intern(name)
        return i

    def alias(self, func: int, kernel: int) -> None:
        self._alias[func] = kernel

    def lookup(self, handle: int) -> int:
        """name_id of ``handle``, -1 when unknown."""
        i = self._by_handle.get(handle)
        if i is None:
            k = self._alias.get(handle)
            if k is not None:
                i = self._by_handle.get(k)
        return -1 if i is None else i

    def sizes(self, name_id: int) -> list[int | None] | None:
        if name_id not in self._sizes:
            self._sizes[name_id] = param_sizes(self.names[name_id])
        return self._sizes[name_id]


def decode_name(rec: np.void, pid: int | None = None) -> str | None:
    """The kernel name of an EV_NAME record: the kernel's copy when complete, else the string
    read through /proc/PID/mem (truncated or non-resident copies), else the truncated copy."""
    n = int(rec["name_len"])
    raw = bytes(rec["name"])
    if 0 < n < NAME_LEN:
        s = raw.split(b"\0", 1)[0]
        if s:
            return s.decode(errors="replace")
    full = read_cstring(int(rec["pid"]) if pid is None else pid, int(rec["name_ptr"]))
    if full:
        return full
    s = raw.split(b"\0", 1)[0]
    return s.decode(errors="replace") if s else None


class LaunchDecoder:
    """Raw ring records -> LAUNCH event arrays. Kept apart from the BPF plumbing so that the
    decoding is tested on synthetic records."""

    def __init__(self, names: NameTable | None = None) -> None:
        self.names = names or NameTable()
        self.seq = 0
        self.launches = 0
        self._hash_cache: dict[tuple, int] = {}

    def handle_meta(self, rec: np.void) -> None:
        """Apply an EV_NAME / EV_ALIAS record (names must be read while the target still has the
        string, so this runs as the record arrives)."""
        kind = int(rec["kind"])
        if kind == EV_NAME:
            name = decode_name(rec)
            if name:
                self.names.bind(int(rec["func"]), name)
        elif kind == EV_ALIAS:
            self.names.alias(int(rec["func"]), int(rec["stream"]))

    def launches_from(self, raw: np.ndarray) -> np.ndarray:
        """LAUNCH records (dtype DTYPES[Kind.LAUNCH]) for the EV_LAUNCH rows of ``raw``."""
        raw = raw[raw["kind"] == EV_LAUNCH]
        out = empty(Kind.LAUNCH, len(raw))
        if not len(raw):
            return out
        out["t_ns"] = raw["t_ns"].astype(np.int64)
        out["t_end_ns"] = 0          # a uprobe sees the call, not the kernel's end
        out["gpu"] = 0               # the context's device is not visible at the call
        out["pid"] = raw["pid"].astype(np.int32)
        out["stream"] = raw["stream"]
        out["func"] = raw["func"]
        out["grid"] = raw["grid"]
        out["block"] = raw["block"]
        out["seq"] = np.arange(self.seq, self.seq + len(raw), dtype=np.int64)
        self.seq += len(raw)
        self.launches += len(raw)
        ids = np.fromiter((self.names.lookup(int(f)) for f in raw["func"]), dtype=np.int32, count=len(raw))
        out["name_id"] = ids
        hashes = np.empty(len(raw), dtype=np.uint64)
        cache = self._hash_cache
        for j in range(len(raw)):
            r = raw[j]
            nid = int(ids[j])
            key = (nid, int(r["func"]), r["grid"].tobytes(), r["block"].tobytes(), int(r["smem"]),
                   int(r["args_mode"]), int(r["nargs"]), r["args"].tobytes())
            h = cache.get(key)
            if h is None:
                name = self.names.names[nid] if nid >= 0 else None
                sizes = self.names.sizes(nid) if nid >= 0 else None
                h = launch_identity(name, int(r["func"]), tuple(r["grid"]), tuple(r["block"]), int(r["smem"]),
                                    int(r["args_mode"]), int(r["nargs"]), tuple(int(a) for a in r["args"]), sizes)
                if len(cache) >= _HASH_CACHE:
                    cache.clear()
                cache[key] = h
            hashes[j] = h
        out["exec_hash"] = hashes
        return out


# -- the probe -----------------------------------------------------------------------------

class LaunchProbe:
    """Kernel launches of process ``pid`` as LAUNCH event batches.

    ``libcuda`` / ``libcudart``: the library files to probe; found in /proc/PID/maps when not
    given (give ``libcuda`` to attach before the target has loaded it, e.g. right after
    starting it: uprobes sit on the file and arm when the target maps it). libcudart's
    ``cudaLaunchKernel`` is only counted (stats()["hits"]), and only when ``libcudart`` is given
    or ``count_runtime=True``: it costs a second trap per runtime launch. Usage::

        with LaunchProbe(pid) as p:        # start() on enter, close() on exit
            batch = p.drain()              # LAUNCH records since the last drain
            batch.names                    # kernel names, indexed by name_id

    Raises UmctlError (one line) when BPF cannot be used: no libbpf, no permission, no BPF object
    in the package, no libcuda in the target, not x86-64.
    """

    POLL_MS = 50

    def __init__(self, pid: int, libcuda: str | None = None, libcudart: str | None = None, *,
                 count_runtime: bool | None = None) -> None:
        if platform.machine() not in ("x86_64", "AMD64"):
            raise UmctlError(f"launch probes read x86-64 registers; this machine is {platform.machine()}")
        self.pid = int(pid)
        if not os.path.exists(f"/proc/{self.pid}"):
            raise UmctlError(f"no such process: {self.pid}")
        if libcuda is None:
            found = mapped_libraries(self.pid, _LIBCUDA_RE)
            if not found:
                raise UmctlError(f"process {self.pid} has not loaded libcuda.so.1 (no CUDA context yet?); "
                                 "pass the libcuda path to probe it before it does")
            libcuda = found[0]
        elif not os.path.exists(libcuda) and not os.path.exists(f"/proc/{self.pid}/root{libcuda}"):
            raise UmctlError(f"libcuda not found: {libcuda}")
        self.libcuda = libcuda
        if libcudart is not None:
            self.libcudart = [libcudart]
        else:
            try:   # optional: with libcuda given, an unreadable map is for start() to report
                self.libcudart = mapped_libraries(self.pid, _LIBCUDART_RE)
            except UmctlError:
                self.libcudart = []
        # Every runtime launch also traps in cuLaunchKernel, so the libcudart counters double the
        # per-launch cost (~3-6 us a trap on the GPU machine) to buy a cross-check: on when the
        # caller names libcudart or asks for it, off for the libcudart copies found in the maps.
        self.count_runtime = (libcudart is not None) if count_runtime is None else bool(count_runtime)
        from ..bpf import libbpf as _lb   # fail here, before any work, when libbpf is missing
        self._lb = _lb
        _lb.libbpf()

        self.decoder = LaunchDecoder()
        self.names = self.decoder.names.names   # append-only, shared by every batch
        self._obj: Any = None
        self._links: list[tuple[int, Any]] = []
        self.attached: list[str] = []
        self.not_attached: dict[str, str] = {}
        self._ring: Any = None
        self._counters_fd = -1
        self._drops_reported = 0
        self._started = False
        self._attached_ids: set[int] = set()
        self._final_counters: dict[int, int] = {}

    # lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Load the BPF object, set the pid filter, attach every probe, start the drain thread."""
        if self._started:
            raise UmctlError("LaunchProbe already started")
        from ..bpf import object_path
        lb = self._lb
        try:
            self._obj = lb.BpfObject(object_path("launch.bpf.o"))
            self._obj.load()
            targets = self._obj.map_fd("targets")
            lb.map_update(targets, C.c_uint32(self.pid), C.c_uint8(1))
            self._counters_fd = self._obj.map_fd("counters")
            for pid_, spec in enumerate(PROBES):
                libs = [self.libcuda] if spec.lib == "cuda" else (self.libcudart if self.count_runtime else [])
                for path in libs:
                    self._attach(pid_, spec, path)
            if not any(spec.required and spec.label in self.attached for spec in PROBES):
                raise UmctlError(f"cannot probe {self.libcuda}: "
                                 + "; ".join(f"{k}: {v}" for k, v in self.not_attached.items() if "cuLaunchKernel" in k))
            self._ring = RingReader(self._obj.map_fd("events"), name=f"umctl-uprobes-{self.pid}",
                                    poll_ms=self.POLL_MS, what="launch probe", keep=self._keep)
        except BaseException:
            self._teardown()
            raise
        self._started = True
        self._ring.start()

    def _attach(self, probe_id: int, spec: ProbeSpec, path: str) -> None:
        try:
            link = self._obj.attach_uprobe(spec.program, _target_path(self.pid, path), spec.symbol, pid=self.pid,
                                           retprobe=spec.retprobe, cookie=probe_id | spec.flags)
        except UmctlError as e:
            msg = str(e)
            if spec.required and ("EPERM" in msg or "EACCES" in msg):
                raise
            self.not_attached[spec.label] = msg.split(": ", 1)[-1]
            return
        self._links.append((probe_id, link))
        self._attached_ids.add(probe_id)
        if spec.label not in self.attached:
            self.attached.append(spec.label)

    def _keep(self, data: bytes) -> bool:
        """Ring callback (poll thread, under the reader's lock): keep launches raw for vectorised
        decoding at drain(); apply names at once, while the target still holds the strings."""
        if int.from_bytes(data[8:12], "little") == EV_LAUNCH:
            return True
        self.decoder.handle_meta(np.frombuffer(data[:RAW_DTYPE.itemsize], dtype=RAW_DTYPE)[0])
        return False

    def drain(self) -> EventBatch:
        """LAUNCH records that arrived since the last call (plus a DROPS record when the ring
        buffer lost some), with ``names`` = the probe's name list."""
        def decode(chunks: list[bytes]) -> np.ndarray:
            raw = np.frombuffer(b"".join(chunks), dtype=RAW_DTYPE) if chunks else np.zeros(0, RAW_DTYPE)
            return self.decoder.launches_from(raw)

        launches = self._ring.take(decode) if self._ring is not None else self.decoder.launches_from(
            np.zeros(0, RAW_DTYPE))
        batch = EventBatch(now_ns=time.monotonic_ns(), names=self.names)
        batch.add(Kind.LAUNCH, launches)
        if self._counters_fd >= 0:
            drops = self._counter(CNT_RB_DROPS)
            if drops > self._drops_reported:
                batch.add(Kind.DROPS, drops_record(batch.now_ns, Kind.LAUNCH, drops - self._drops_reported))
                self._drops_reported = drops
        return batch

    def _counter(self, idx: int) -> int:
        """BPF counter ``idx``; after close(), its last value."""
        if self._counters_fd < 0:
            return self._final_counters.get(idx, 0)
        v = C.c_uint64(0)
        self._lb.map_lookup(self._counters_fd, C.c_uint32(idx), v)
        return int(v.value)

    def stats(self) -> dict[str, Any]:
        """Hits per probe (by symbol; "(ret)" for return probes; libcudart copies summed), ring
        buffer drops, hits from other processes, launches decoded, names known, and which
        optional probes did not attach (with the reason)."""
        hits: dict[str, int] = {}
        for pid_ in sorted(self._attached_ids):
            label = PROBES[pid_].label
            hits[label] = hits.get(label, 0) + self._counter(pid_)
        return {
            "pid": self.pid,
            "hits": hits,
            "ringbuf_drops": self._counter(CNT_RB_DROPS),
            "filtered": self._counter(CNT_FILTERED),
            "launches": self.decoder.launches,
            "names": len(self.names),
            "attached": list(self.attached),
            "not_attached": dict(self.not_attached),
            "callback_errors": self._ring.callback_errors if self._ring is not None else 0,
        }

    def close(self) -> None:
        """Stop the drain thread and detach everything (idempotent). Records still in the ring
        are consumed first, so a drain() after close() returns the last launches."""
        if self._ring is not None:
            self._ring.stop()
        self._teardown()

    def _teardown(self) -> None:
        for _pid, link in self._links:
            link.destroy()
        self._links = []
        if self._ring is not None:
            self._ring.stop()
            self._ring.free()   # kept: records taken off the ring before it closed are still drained
        # keep the counters readable for a final stats(): copy them before closing the object
        if self._obj is not None and self._counters_fd >= 0:
            ids = list(range(len(PROBES))) + [CNT_RB_DROPS, CNT_FILTERED]
            self._final_counters = {i: self._counter(i) for i in ids}
        if self._obj is not None:
            self._obj.close()
            self._obj = None
        self._counters_fd = -1

    def __enter__(self) -> LaunchProbe:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


__all__ = ["LaunchProbe", "LaunchDecoder", "NameTable", "PROBES", "RAW_DTYPE", "launch_identity", "param_sizes",
           "demangle", "decode_name", "read_cstring", "mapped_libraries", "DTYPES"]
