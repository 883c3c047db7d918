"""Source ``kprobe``: fault batches, migrations and evictions read inside nvidia_uvm's fault path.

The tools API (the default source, ``uvmtools``) reports what the driver chooses to log, after
the fact, through a ring the target's own va_space owns. The BPF programs of
``bpf/uvmfault.bpf.c`` read the driver's own structures instead, as it services each batch:
every fault of the batch (address, access type, GPU timestamp), every ``make_resident`` with its
cause, every eviction — with no tools-API session on the target, and for every process at once
(filtered by pid in the kernel). It needs what a stock distribution kernel has and our dev/CI
kernel and the GPU machine do not: kprobes (or fentry on module functions) and the nvidia_uvm
module's BTF for the CO-RE field offsets (docs/evaluation/measurements.md lists which machine has what). :func:`check_kernel` says so in one line.

Loading: fentry first (cheaper: a trampoline instead of an int3/ftrace detour, typed arguments),
then fentry for the functions with at most six arguments plus a kprobe for
``uvm_va_block_make_resident`` (x86-64 trampolines take more only on newer kernels), then
kprobes everywhere. :attr:`KprobeSource.flavour` says which one loaded.

va_space -> pid: read in BPF from ``va_space->va_space_mm.mm->owner`` (CONFIG_MEMCG); records
whose pid is unknown carry the va_space pointer, and :meth:`KprobeSource.map_vaspace` lets the
caller name its owner.
"""

from __future__ import annotations

import ctypes as C
import os
import time
from typing import Any, Iterable

import numpy as np

from .. import UmctlError
from ..events.schema import Access, Cause, EventBatch, Kind, drops_record, empty
from ..bpf.reader import RingReader
from ..units import CPU

# -- the record format of bpf/uvmfault.bpf.c (struct event) -----------------------------------

EV_BATCH, EV_MIGRATION, EV_EVICTION = 2, 3, 4
CNT_RB_DROPS, CNT_FILTERED, CNT_BATCHES, CNT_FAULTS, CNT_TRUNCATED = 0, 1, 2, 3, 4
CNT_MIGRATIONS, CNT_EVICTIONS, CNT_ROOT_EVICTIONS, CNT_FAULTS_DROPPED, NCOUNTERS = 5, 6, 7, 8, 9
COUNTER_NAMES = ("ringbuf_drops", "filtered", "batches", "faults", "truncated", "migrations", "evictions",
                 "root_chunk_evictions", "faults_dropped")

RAW_DTYPE = np.dtype([
    ("t_ns", np.uint64), ("kind", np.uint32), ("pid", np.int32), ("addr", np.uint64), ("a", np.uint64),
    ("vaspace", np.uint64), ("batch", np.uint32), ("gpu", np.uint16), ("access", np.uint8), ("type", np.uint8),
])
assert RAW_DTYPE.itemsize == 48, RAW_DTYPE.itemsize   # sizeof(struct event)
#: struct fault_ent: the faults that follow an EV_BATCH header (header "addr" says how many)
FAULT_DTYPE = np.dtype([("addr", np.uint64), ("ts", np.uint64), ("pid", np.int32), ("access", np.uint8),
                        ("type", np.uint8), ("pad", np.uint16)])
assert FAULT_DTYPE.itemsize == 24, FAULT_DTYPE.itemsize
MAX_FAULTS = 256

#: the driver's probed functions -> (kprobe program, fentry program)
FUNCTIONS: dict[str, tuple[str, str]] = {
    "service_fault_batch": ("kp_service_fault_batch", "fe_service_fault_batch"),
    "uvm_va_block_make_resident": ("kp_make_resident", "fe_make_resident"),
    "uvm_va_block_evict_chunks": ("kp_evict_chunks", "fe_evict_chunks"),
    "evict_root_chunk": ("kp_evict_root_chunk", "fe_evict_root_chunk"),
}
REQUIRED = "service_fault_batch"
#: load attempts in order: which functions get fentry (the rest kprobes)
FLAVOURS: dict[str, frozenset[str]] = {
    "fentry": frozenset(FUNCTIONS),
    "mixed": frozenset(FUNCTIONS) - {"uvm_va_block_make_resident"},
    "kprobe": frozenset(),
}

SRC_UNKNOWN = -2
# uvm_fault_access_type_t -> Access
_ACCESS = np.array([Access.PREFETCH, Access.READ, Access.WRITE, Access.ATOMIC, Access.ATOMIC]
                   + [Access.READ] * 11, dtype=np.uint8)
# uvm_make_resident_cause_t -> Cause
_CAUSE = np.array([Cause.DEMAND, Cause.DEMAND, Cause.ACCESS_COUNTER, Cause.DRIVER_PREFETCH, Cause.EVICTION,
                   Cause.USER, Cause.USER, Cause.OTHER, Cause.OTHER] + [Cause.OTHER] * 7, dtype=np.uint8)


def _gpu(ids: np.ndarray) -> np.ndarray:
    """UVM processor ids (0 = CPU, GPU n = n + 1) -> our numbering (CPU = -1, GPUs from 0)."""
    g = ids.astype(np.int16) - 1
    g[ids == 0] = CPU
    return g


def split_records(chunks: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """Ring records -> (headers: RAW_DTYPE, faults: FAULT_DTYPE) — the faults of the EV_BATCH
    headers, in header order."""
    if not chunks:
        return np.zeros(0, RAW_DTYPE), np.zeros(0, FAULT_DTYPE)
    hs = RAW_DTYPE.itemsize
    heads = np.frombuffer(b"".join(c[:hs] for c in chunks), dtype=RAW_DTYPE)
    tails = b"".join(c[hs:] for c in chunks if len(c) > hs)
    return heads, np.frombuffer(tails, dtype=FAULT_DTYPE)


def decode(raw: np.ndarray, faults: np.ndarray | None = None, now_ns: int | None = None) -> EventBatch:
    """Headers (+ the faults of their EV_BATCH records) -> an EventBatch of FAULT, REPLAY,
    MIGRATION and EVICTION arrays (vectorised; kept apart from the BPF plumbing so it is tested
    on synthetic records)."""
    batch = EventBatch(now_ns=time.monotonic_ns() if now_ns is None else now_ns)
    k = raw["kind"]
    hb = raw[k == EV_BATCH]
    if faults is not None and len(faults) and len(hb):
        counts = hb["addr"].astype(np.int64)
        if int(counts.sum()) != len(faults):
            raise UmctlError(f"kprobe ring: {len(faults)} faults for batch headers announcing {int(counts.sum())}")
        out = empty(Kind.FAULT, len(faults))
        out["t_ns"] = np.repeat(hb["t_ns"].astype(np.int64), counts)
        out["gpu"] = np.repeat(_gpu(hb["gpu"]), counts)
        out["pid"] = faults["pid"]
        out["batch_id"] = np.repeat(hb["batch"].astype(np.int64), counts)
        out["addr"] = faults["addr"]
        out["access"] = _ACCESS[np.minimum(faults["access"], len(_ACCESS) - 1)]
        out["fault_type"] = faults["type"]
        batch.add(Kind.FAULT, out)
    b = raw[k == EV_BATCH]
    if len(b):
        out = empty(Kind.REPLAY, len(b))
        out["t_ns"] = b["t_ns"].astype(np.int64)
        out["t_start_ns"] = out["t_ns"]
        out["gpu"] = _gpu(b["gpu"])
        out["batch_id"] = b["batch"]
        out["nfaults"] = b["addr"]   # the faults of the target(s) in this batch
        batch.add(Kind.REPLAY, out)
    m = raw[k == EV_MIGRATION]
    if len(m):
        out = empty(Kind.MIGRATION, len(m))
        out["t_ns"] = out["t_end_ns"] = m["t_ns"].astype(np.int64)
        out["pid"] = m["pid"]
        out["src"] = SRC_UNKNOWN   # make_resident's arguments do not say where the pages were
        out["dst"] = _gpu(m["gpu"])
        out["addr"] = m["addr"]
        out["bytes"] = m["a"]
        out["cause"] = _CAUSE[np.minimum(m["access"], len(_CAUSE) - 1)]
        out["exec_id"] = -1
        batch.add(Kind.MIGRATION, out)
    e = raw[k == EV_EVICTION]
    if len(e):
        out = empty(Kind.EVICTION, len(e))
        out["t_ns"] = e["t_ns"].astype(np.int64)
        out["gpu"] = _gpu(e["gpu"])
        out["pid"] = e["pid"]
        out["addr"] = e["addr"]
        out["bytes_written"] = e["a"]
        out["pages"] = (e["a"] >> np.uint64(12)).astype(np.uint32)
        batch.add(Kind.EVICTION, out)
    return batch


def check_kernel(functions: Iterable[str] = (REQUIRED,)) -> None:
    """Raise a one-line UmctlError when this kernel cannot run the fault-path probes: no
    kprobe PMU (kprobes compiled out, as on our CI kernel and the GPU machine's), or none of the
    probed functions loaded (nvidia_uvm not loaded). Says which source to use instead."""
    if not os.path.exists("/sys/bus/event_source/devices/kprobe/type"):
        raise UmctlError("this kernel has no kprobes (no kprobe PMU in /sys/bus/event_source/devices); "
                         "use --source uvmtools (the default: the UVM tools API)")
    want = set(functions)
    try:
        with open("/proc/kallsyms") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 3 and parts[2] in want:
                    return
    except OSError as e:
        raise UmctlError(f"cannot read /proc/kallsyms ({e.strerror})") from None
    raise UmctlError(f"{', '.join(sorted(want))} not found in /proc/kallsyms: is nvidia_uvm loaded? "
                     "(or use --source uvmtools)")


class KprobeSource:
    """Fault-path events (of ``pids``, or of every process when empty) as EventBatches, with the
    interface of :class:`~umctl.sources.uvmtools.UvmToolsSource`: ``start()``, ``drain()``,
    ``stop()``, ``close()``, ``stats()``, ``exited()``. ``flavour``: "auto" (fentry, then
    mixed, then kprobe), or one of :data:`FLAVOURS`."""

    POLL_MS = 50

    def __init__(self, pids: Iterable[int] = (), *, flavour: str = "auto", btf_custom_path: str | None = None,
                 check: bool = True) -> None:
        self.pids = [int(p) for p in pids]
        self.pid = self.pids[0] if self.pids else 0
        for p in self.pids:
            if not os.path.exists(f"/proc/{p}"):
                raise UmctlError(f"no such process: {p}")
        if flavour != "auto" and flavour not in FLAVOURS:
            raise UmctlError(f"unknown probe flavour {flavour!r} (choose from auto, {', '.join(FLAVOURS)})")
        if check:
            check_kernel()
        from ..bpf import libbpf as _lb
        self._lb = _lb
        _lb.libbpf()
        self.flavour_wanted = flavour
        self.flavour: str | None = None
        self.btf_custom_path = btf_custom_path
        self.load_errors: dict[str, str] = {}
        self.attached: list[str] = []
        self.not_attached: dict[str, str] = {}
        self._obj: Any = None
        self._links: list[Any] = []
        self._ring: Any = None
        self._counters_fd = -1
        self._vaspace_fd = -1
        self._drops_reported = 0
        self._final: dict[str, int] = {}
        self.records = 0
        self.faults = 0
        self.attach_ms = 0.0
        self.started_ns = 0

    # lifecycle ------------------------------------------------------------------------------

    def _order(self) -> list[str]:
        return list(FLAVOURS) if self.flavour_wanted == "auto" else [self.flavour_wanted]

    def _load_flavour(self, name: str) -> None:
        from ..bpf import object_path
        fentry = FLAVOURS[name]
        obj = self._lb.BpfObject(object_path("uvmfault.bpf.o"), btf_custom_path=self.btf_custom_path)
        for fn, (kp, fe) in FUNCTIONS.items():
            obj.set_autoload(kp, fn not in fentry)
            obj.set_autoload(fe, fn in fentry)
        try:
            obj.load()
        except BaseException:
            obj.close()
            raise
        self._obj, self.flavour = obj, name

    def load(self) -> None:
        """Open and load the object in the first flavour the kernel accepts (no attach)."""
        for name in self._order():
            try:
                self._load_flavour(name)
                return
            except UmctlError as e:
                self.load_errors[name] = str(e)
        raise UmctlError("cannot load the fault-path BPF programs: "
                         + "; ".join(f"{k}: {v}" for k, v in self.load_errors.items()))

    def _attach_all(self) -> None:
        """Attach every program of the loaded flavour. An fentry that loads but does not attach
        (x86-64 trampolines of older kernels take at most six arguments) raises, so that start()
        moves on to the next flavour; a kprobe that fails is only recorded, except on the
        required function."""
        fentry = FLAVOURS[self.flavour or "kprobe"]
        for fn, (kp, fe) in FUNCTIONS.items():
            try:
                link = self._obj.attach(fe) if fn in fentry else self._obj.attach_kprobe(kp, fn)
            except UmctlError as e:
                if fn == REQUIRED or fn in fentry:
                    raise
                self.not_attached[fn] = str(e).split(": ", 1)[-1]
                continue
            self._links.append(link)
            self.attached.append(fn)

    def start(self) -> "KprobeSource":
        if self._links:
            raise UmctlError("KprobeSource already started")
        lb = self._lb
        t0 = time.monotonic_ns()
        errors: dict[str, str] = {}
        order = [self.flavour] if self._obj is not None else self._order()
        for name in order:
            try:
                if self._obj is None:
                    self._load_flavour(name)
                self._counters_fd = self._obj.map_fd("counters")
                self._vaspace_fd = self._obj.map_fd("vaspace_pid")
                if self.pids:
                    tf = self._obj.map_fd("targets")
                    for p in self.pids:
                        lb.map_update(tf, C.c_int32(p), C.c_uint8(1))
                    lb.map_update(self._obj.map_fd("filter_on"), C.c_uint32(0), C.c_uint32(1))
                self._attach_all()
                self._ring = RingReader(self._obj.map_fd("events"), name="umctl-kprobes", poll_ms=self.POLL_MS,
                                        what="kprobe source")
                break
            except UmctlError as e:
                errors[str(name)] = str(e)
                self._teardown()
                self.attached, self.not_attached = [], {}
        else:
            raise UmctlError("cannot attach the fault-path BPF programs: "
                             + "; ".join(f"{k}: {v}" for k, v in errors.items()))
        self.load_errors.update(errors)
        self.started_ns = time.monotonic_ns()
        self.attach_ms = (self.started_ns - t0) / 1e6
        self._ring.start()
        return self

    # what the live loop (umctl attach) asks of a source -------------------------------------
    kinds = frozenset({Kind.FAULT, Kind.REPLAY, Kind.MIGRATION, Kind.EVICTION})
    gpus: list[dict] = []   # the probes see UVM processor ids, not the GPUs' names or sizes
    #: the actuator that goes with this source (umctl.live.spec.ACTUATORS): the umctl kernel
    #: module, which finds the target's va_space itself (no fd of the target's is held here)
    actuator = "kmod"

    def map_vaspace(self, vaspace: int, pid: int) -> None:
        """Name the owner of a va_space the kernel side could not resolve."""
        self._lb.map_update(self._vaspace_fd, C.c_uint64(vaspace), C.c_int32(pid))

    def drain(self) -> EventBatch:
        """Events since the last call, plus a DROPS record when the ring lost some."""
        raw, faults = split_records(self._ring.take() if self._ring is not None else [])
        self.records += len(raw)
        self.faults += len(faults)
        batch = decode(raw, faults)
        drops = self.counters().get("faults_dropped", 0)
        if drops > self._drops_reported:
            batch.add(Kind.DROPS, drops_record(batch.now_ns, Kind.FAULT, drops - self._drops_reported))
            self._drops_reported = drops
        return batch

    def counters(self) -> dict[str, int]:
        """The BPF counters summed over CPUs (their last values after close())."""
        if self._counters_fd < 0:
            return dict(self._final)
        return self._lb.percpu_counters(self._counters_fd, COUNTER_NAMES)

    def sample_fraction(self) -> float:
        """Every batch record is kept (the interface's sampling hook: one record per fault
        batch is cheap enough to keep them all)."""
        return 1.0

    def exited(self) -> bool:
        """True when every target process has exited (never, when watching all processes)."""
        return bool(self.pids) and not any(os.path.exists(f"/proc/{p}") for p in self.pids)

    def stats(self) -> dict[str, Any]:
        return {"source": "kprobe", "flavour": self.flavour, "attach_ms": self.attach_ms,
                "kinds": f"faults,replays,migrations,evictions ({self.flavour})",
                "ring_entries": (1 << 22) // RAW_DTYPE.itemsize, "ring_max_fill": None, "flush_ms": 0, "pids": self.pids, "attached": list(self.attached),
                "not_attached": dict(self.not_attached), "records": self.records,
                "faults_decoded": self.faults, **self.counters(),
                "callback_errors": self._ring.callback_errors if self._ring is not None else 0}

    def stop(self) -> None:
        """Stop the drain thread after consuming what is in the ring (drain() once more)."""
        if self._ring is not None:
            self._ring.stop()

    def close(self) -> None:
        self.stop()
        self._teardown()

    def _teardown(self) -> None:
        for link in self._links:
            link.destroy()
        self._links = []
        if self._ring is not None:
            self._ring.stop()
            self._ring.free()   # kept: records taken off the ring before it closed are still drained
        if self._obj is not None:
            if self._counters_fd >= 0:
                self._final = self.counters()
            self._obj.close()
            self._obj = None
        self._counters_fd = -1

    def __enter__(self) -> "KprobeSource":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["KprobeSource", "RAW_DTYPE", "FAULT_DTYPE", "decode", "split_records", "check_kernel", "FUNCTIONS", "FLAVOURS"]
