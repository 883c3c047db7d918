"""The nvidia-uvm tools ABI of driver 580 (open modules), as ctypes structs and numpy dtypes.

Written from the driver's public headers (uvm_ioctl.h, uvm_linux_ioctl.h, uvm_types.h) and
checked against what the 580.159.04 driver actually returned on an H100 and an H200 (see
docs/guide/observe.md). Two facts shape everything here:

* Linux UVM ioctl numbers are the raw command numbers (``UVM_IOCTL_BASE(i) == i``, no _IOWR
  encoding), and the ioctl syscall itself returns 0: the driver's verdict is the NV_STATUS in
  the last field (``rmStatus``) of every parameter struct.
* Events land in a ring of 72-byte ``UvmEventEntry_V2`` unions that *we* allocate and the
  driver pins. Decoding one Python object per event would cap us far below the ~1 M events/s
  a fault storm produces, so :data:`ENTRY_DTYPE` overlays every member of the union as a
  numpy field at its byte offset: a drained chunk is viewed (not parsed) as a structured
  array and each kind's columns are selected with a boolean mask on ``type``.

All system calls go through :class:`Ioctl`, the one seam tests replace with a fake driver.
"""

from __future__ import annotations

import ctypes as C
import errno
import mmap
import os
import select

import numpy as np

# ---- ioctl command numbers (uvm_ioctl.h) -------------------------------------------------
UVM_TOOLS_SET_NOTIFICATION_THRESHOLD = 57
UVM_TOOLS_EVENT_QUEUE_ENABLE_EVENTS = 58
UVM_TOOLS_EVENT_QUEUE_DISABLE_EVENTS = 59
UVM_TOOLS_ENABLE_COUNTERS = 60
UVM_TOOLS_DISABLE_COUNTERS = 61
UVM_TOOLS_FLUSH_EVENTS = 67
UVM_TOOLS_INIT_EVENT_TRACKER_V2 = 76
UVM_TOOLS_GET_PROCESSOR_UUID_TABLE_V2 = 77
# memory-management ioctls the actuator issues on the target's va_space fd
UVM_SET_PREFERRED_LOCATION = 42
UVM_UNSET_PREFERRED_LOCATION = 43
UVM_ENABLE_READ_DUPLICATION = 44
UVM_DISABLE_READ_DUPLICATION = 45
UVM_MIGRATE = 51
UVM_DISCARD = 80                 # new in 580: drop contents without write-back
UVM_DISCARD_FLAGS_UNMAP = 1      # and unmap, so the next touch faults and zero-fills

NV_OK = 0
#: What INIT_EVENT_TRACKER returns for a /dev/nvidia-uvm fd that is not a va_space (the
#: per-process mm fd CUDA also opens): the signal to try the next fd.
NV_ERR_ILLEGAL_ACTION = 0x16
NV_STATUS_NAMES = {
    0x00: "NV_OK", 0x16: "NV_ERR_ILLEGAL_ACTION", 0x1B: "NV_ERR_INSUFFICIENT_PERMISSIONS",
    0x1E: "NV_ERR_INVALID_ADDRESS", 0x1F: "NV_ERR_INVALID_ARGUMENT", 0x26: "NV_ERR_INVALID_DEVICE",
    0x38: "NV_ERR_INVALID_OPERATION", 0x40: "NV_ERR_INVALID_STATE", 0x51: "NV_ERR_NO_MEMORY",
    0x56: "NV_ERR_NOT_SUPPORTED",
}


def nv_status_name(code: int) -> str:
    return f"{NV_STATUS_NAMES.get(code, 'NV_STATUS')}(0x{code:x})"


# ---- event types (UvmEventType) ----------------------------------------------------------
EV_CPU_FAULT = 1
EV_MIGRATION = 2
EV_GPU_FAULT = 3
EV_GPU_FAULT_REPLAY = 4
EV_FAULT_BUFFER_OVERFLOW = 5
EV_FATAL_FAULT = 6
EV_READ_DUPLICATE = 7
EV_READ_DUPLICATE_INVALIDATE = 8
EV_PAGE_SIZE_CHANGE = 9
EV_THRASHING_DETECTED = 10
EV_THROTTLING_START = 11
EV_THROTTLING_END = 12
EV_MAP_REMOTE = 13
EV_EVICTION = 14
EVENT_NAMES = {
    1: "CpuFault", 2: "Migration", 3: "GpuFault", 4: "GpuFaultReplay", 5: "FaultBufferOverflow",
    6: "FatalFault", 7: "ReadDuplicate", 8: "ReadDuplicateInvalidate", 9: "PageSizeChange",
    10: "ThrashingDetected", 11: "ThrottlingStart", 12: "ThrottlingEnd", 13: "MapRemote", 14: "Eviction",
}
N_EVENT_TYPES = 15  # bits 1..14 of the enable mask are valid

# UvmEventMigrationCause
MIG_CAUSE_INVALID, MIG_CAUSE_USER, MIG_CAUSE_COHERENCE, MIG_CAUSE_PREFETCH = 0, 1, 2, 3
MIG_CAUSE_EVICTION, MIG_CAUSE_ACCESS_COUNTERS = 4, 5
# UvmEventMemoryAccessType: 0 invalid, 1 read, 2 write, 3 atomic, 4 prefetch
# UvmEventFaultClientType: 0 invalid, 1 GPC, 2 HUB
CLIENT_GPC, CLIENT_HUB = 1, 2

# ---- counters (UvmCounterName) -----------------------------------------------------------
COUNTER_NAMES = {0: "bytes_htd", 1: "bytes_dth", 2: "cpu_page_faults", 7: "prefetch_bytes_htd",
                 8: "prefetch_bytes_dth", 9: "gpu_page_faults"}
N_COUNTERS = 10
#: Enable mask of the counters above (bit i = counter i).
COUNTER_MASK = sum(1 << i for i in COUNTER_NAMES)

#: Processor index of the CPU in events and the UUID table (GPUs are 1..).
UVM_CPU_INDEX = 0
#: V2 UUID table length: NV_MAX_DEVICES * NV_MAX_SUBDEVICES + 1.
UVM_ID_MAX_PROCESSORS = 257

ENTRY_SIZE = 72      # sizeof(UvmEventEntry_V2)
CONTROL_SIZE = 528   # sizeof(UvmToolsEventControlData)


class NvProcessorUuid(C.Structure):
    _fields_ = [("uuid", C.c_uint8 * 16)]


class InitEventTrackerParams(C.Structure):
    """UVM_TOOLS_INIT_EVENT_TRACKER(_V2)_PARAMS, 56 bytes. ``queueBufferSize`` counts entries;
    0 makes a counters tracker whose ``controlBuffer`` holds the counter array."""

    _fields_ = [("queueBuffer", C.c_uint64), ("queueBufferSize", C.c_uint64), ("controlBuffer", C.c_uint64),
                ("processor", NvProcessorUuid), ("allProcessors", C.c_uint32), ("uvmFd", C.c_uint32),
                ("rmStatus", C.c_uint32)]


class U64Params(C.Structure):
    """ENABLE/DISABLE_EVENTS, ENABLE/DISABLE_COUNTERS, GET_PROCESSOR_UUID_TABLE_V2 (16 bytes)."""

    _fields_ = [("value", C.c_uint64), ("rmStatus", C.c_uint32)]


class U32Params(C.Structure):
    """SET_NOTIFICATION_THRESHOLD (8 bytes)."""

    _fields_ = [("value", C.c_uint32), ("rmStatus", C.c_uint32)]


class StatusParams(C.Structure):
    """FLUSH_EVENTS (4 bytes)."""

    _fields_ = [("rmStatus", C.c_uint32)]


class MigrateParams(C.Structure):
    """UVM_MIGRATE_PARAMS (80 bytes). Synchronous unless flags has UVM_MIGRATE_FLAG_ASYNC;
    ``cpuNumaNode`` -1 lets the driver pick the node when the destination is the CPU."""

    _fields_ = [("base", C.c_uint64), ("length", C.c_uint64), ("destinationUuid", NvProcessorUuid),
                ("flags", C.c_uint32), ("semaphoreAddress", C.c_uint64), ("semaphorePayload", C.c_uint32),
                ("cpuNumaNode", C.c_int32), ("userSpaceStart", C.c_uint64), ("userSpaceLength", C.c_uint64),
                ("rmStatus", C.c_uint32)]


class DiscardParams(C.Structure):
    """UVM_DISCARD_PARAMS (32 bytes)."""

    _fields_ = [("base", C.c_uint64), ("length", C.c_uint64), ("flags", C.c_uint64), ("rmStatus", C.c_uint32)]


class PreferredLocationParams(C.Structure):
    """UVM_SET_PREFERRED_LOCATION_PARAMS (40 bytes)."""

    _fields_ = [("requestedBase", C.c_uint64), ("length", C.c_uint64), ("preferredLocation", NvProcessorUuid),
                ("preferredCpuNumaNode", C.c_int32), ("rmStatus", C.c_uint32)]


class RangeParams(C.Structure):
    """UVM_UNSET_PREFERRED_LOCATION, UVM_ENABLE/DISABLE_READ_DUPLICATION (24 bytes)."""

    _fields_ = [("requestedBase", C.c_uint64), ("length", C.c_uint64), ("rmStatus", C.c_uint32)]


for _t, _n in ((InitEventTrackerParams, 56), (U64Params, 16), (U32Params, 8), (StatusParams, 4),
               (MigrateParams, 80), (DiscardParams, 32), (PreferredLocationParams, 40), (RangeParams, 24)):
    assert C.sizeof(_t) == _n, (_t.__name__, C.sizeof(_t), _n)


def _union_dtype(fields: list[tuple[str, str | tuple, int]], itemsize: int) -> np.dtype:
    names = [f[0] for f in fields]
    formats = [f[1] for f in fields]
    offsets = [f[2] for f in fields]
    return np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": itemsize})


#: One ring entry, every union member overlaid at its offset. Prefixes: ``g_`` GpuFault,
#: ``m_`` Migration, ``c_`` CpuFault, ``r_`` GpuFaultReplay, ``t_`` ThrashingDetected.
#: Timestamps without ``_gpu`` are CPU CLOCK_MONOTONIC_RAW ns; ``_gpu`` ones are the GPU's
#: globaltimer (close to CLOCK_REALTIME; not used for ordering).
ENTRY_DTYPE = _union_dtype([
    ("type", "u1", 0),
    # GpuFault
    ("g_fault_type", "u1", 1), ("g_gpu", "<u2", 2), ("g_gpc", "<u2", 4), ("g_client_id", "<u2", 6),
    ("g_addr", "<u8", 8), ("g_ts", "<u8", 16), ("g_ts_gpu", "<u8", 24), ("g_batch", "<u4", 32),
    ("g_client_type", "u1", 36), ("g_access", "u1", 37),
    # Migration
    ("m_cause", "u1", 1), ("m_src", "<u2", 4), ("m_dst", "<u2", 6), ("m_src_nid", "<i4", 8),
    ("m_dst_nid", "<i4", 12), ("m_addr", "<u8", 16), ("m_bytes", "<u8", 24), ("m_begin", "<u8", 32),
    ("m_end", "<u8", 40), ("m_range_group", "<u8", 48), ("m_begin_gpu", "<u8", 56), ("m_end_gpu", "<u8", 64),
    # CpuFault
    ("c_access", "u1", 1), ("c_cpu", "<u4", 4), ("c_addr", "<u8", 8), ("c_ts", "<u8", 16),
    ("c_pid", "<u4", 24), ("c_tid", "<u4", 28), ("c_pc", "<u8", 32),
    # GpuFaultReplay
    ("r_client_type", "u1", 1), ("r_gpu", "<u2", 2), ("r_batch", "<u4", 4), ("r_ts", "<u8", 8),
    ("r_ts_gpu", "<u8", 16),
    # ThrashingDetected (processors: bitmap of UVM_ID_MAX_PROCESSORS bits)
    ("t_addr", "<u8", 8), ("t_size", "<u8", 16), ("t_ts", "<u8", 24), ("t_procs", ("<u8", (5,)), 32),
], ENTRY_SIZE)

#: UvmToolsEventControlData: the ring's indices and the per-event-type dropped counters.
#: The driver masks every index with (entries - 1) and drops (counting in ``dropped[type]``)
#: when one free slot would remain, so a ring of N entries holds N - 1 events.
CONTROL_DTYPE = np.dtype([("get_ahead", "<u4"), ("get_behind", "<u4"), ("put_ahead", "<u4"),
                          ("put_behind", "<u4"), ("dropped", "<u8", (64,))])
assert ENTRY_DTYPE.itemsize == ENTRY_SIZE and CONTROL_DTYPE.itemsize == CONTROL_SIZE


def concat_entries(parts: list[np.ndarray]) -> np.ndarray:
    """Concatenate ENTRY_DTYPE arrays. np.concatenate would promote the overlapping-field
    union dtype to a packed one (itemsize > 72), so copy into a preallocated array."""
    out = np.empty(sum(len(p) for p in parts), dtype=ENTRY_DTYPE)
    i = 0
    for p in parts:
        out[i:i + len(p)] = p
        i += len(p)
    return out


def as_entries(raw: np.ndarray | bytes) -> np.ndarray:
    """Raw ring bytes (bytes, uint8 array, or ENTRY_DTYPE array) as an ENTRY_DTYPE array."""
    if isinstance(raw, np.ndarray) and raw.dtype == ENTRY_DTYPE:
        return raw
    buf = raw if isinstance(raw, (bytes, bytearray, memoryview)) else np.ascontiguousarray(raw).view(np.uint8)
    return np.frombuffer(buf, dtype=ENTRY_DTYPE)


def event_mask(types: set[int] | list[int]) -> int:
    """The ENABLE_EVENTS bit mask of a set of UvmEventType values."""
    m = 0
    for t in types:
        if not 1 <= t < N_EVENT_TYPES:
            raise ValueError(f"invalid UVM event type {t}")
        m |= 1 << t
    return m


class PageBuffer:
    """Page-aligned zeroed anonymous memory: the driver pins user buffers by pages and
    refuses unaligned ones, and an mmap is the simplest way to get alignment from Python."""

    def __init__(self, size: int):
        self.size = max(mmap.PAGESIZE, -(-size // mmap.PAGESIZE) * mmap.PAGESIZE)
        self.mm = mmap.mmap(-1, self.size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self._c = (C.c_char * self.size).from_buffer(self.mm)
        self.addr = C.addressof(self._c)

    def view(self, dtype: np.dtype, count: int) -> np.ndarray:
        return np.frombuffer(self.mm, dtype=dtype, count=count)

    def close(self) -> None:
        """Unmap (only once nothing, the driver included, uses the memory any more)."""
        self._c = None
        try:
            self.mm.close()
        except BufferError:  # a numpy view is still alive; the GC will unmap it
            pass


_SYS_pidfd_open = 434
_SYS_pidfd_getfd = 438


class Ioctl:
    """Every system call the live source makes: the seam tests replace with a fake driver
    (no real device is ever touched in CI). Methods raise OSError with the errno as the
    kernel reported it; the callers turn those into :class:`umctl.UmctlError` subclasses."""

    TOOLS_PATH = "/dev/nvidia-uvm-tools"

    def __init__(self) -> None:
        self._libc = C.CDLL(None, use_errno=True)
        self._libc.ioctl.argtypes = [C.c_int, C.c_ulong, C.c_void_p]
        self._libc.ioctl.restype = C.c_int
        self._libc.syscall.restype = C.c_long

    def ioctl(self, fd: int, cmd: int, params: C.Structure) -> int:
        """Issue a UVM ioctl; returns the driver's NV_STATUS (``params.rmStatus``)."""
        rc = self._libc.ioctl(fd, cmd, C.byref(params))
        if rc != 0:
            e = C.get_errno()
            raise OSError(e, f"ioctl {cmd}: {os.strerror(e)}")
        return int(params.rmStatus)

    def open_tools(self) -> int:
        return os.open(self.TOOLS_PATH, os.O_RDWR | os.O_CLOEXEC)

    def close(self, fd: int) -> None:
        os.close(fd)

    def pidfd_open(self, pid: int) -> int:
        r = self._libc.syscall(_SYS_pidfd_open, C.c_int(pid), C.c_uint(0))
        if r < 0:
            e = C.get_errno()
            raise OSError(e, f"pidfd_open({pid}): {os.strerror(e)}")
        return int(r)

    def pidfd_getfd(self, pidfd: int, targetfd: int) -> int:
        r = self._libc.syscall(_SYS_pidfd_getfd, C.c_int(pidfd), C.c_int(targetfd), C.c_uint(0))
        if r < 0:
            e = C.get_errno()
            raise OSError(e, f"pidfd_getfd(fd {targetfd}): {os.strerror(e)}")
        return int(r)

    def process_exited(self, pidfd: int) -> bool:
        """A pidfd polls readable once its process has exited (zombie included), which
        /proc cannot tell us for a child we have not reaped."""
        p = select.poll()
        p.register(pidfd, select.POLLIN)
        return bool(p.poll(0))


def errno_name(e: OSError) -> str:
    return errno.errorcode.get(e.errno or 0, str(e.errno))
