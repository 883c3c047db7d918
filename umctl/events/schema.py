"""The event and command model: one numpy structured dtype per kind.

Events travel as structured-array batches, never as one Python object per fault: the live
source sees up to ~1 M events/s and the simulator produces more, so everything downstream
(controllers, trace writer, reports) works on columns.

Conventions for every kind:
  * ``t_ns``   -- time in nanoseconds (CPU clock for live events, simulated clock in replay);
  * ``gpu``    -- GPU index (0..N-1); processors in ``src``/``dst`` use ``umctl.units.CPU`` (-1)
                  for the host;
  * ``pid``    -- process id (replay: the scenario's tenant id);
  * addresses are byte addresses (uint64), sizes are bytes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from ..units import BLOCK_SHIFT

SCHEMA_VERSION = 1


class Kind(str, enum.Enum):
    """Event (and command) kinds. The value is the name used in trace files."""

    FAULT = "fault"            # one GPU fault entry, grouped by batch_id
    REPLAY = "replay"          # end of servicing one fault batch (GpuFaultReplay)
    MIGRATION = "migration"    # data moved between processors, with cause
    EVICTION = "eviction"      # a 2 MiB chunk evicted from a GPU
    LAUNCH = "launch"          # kernel launch (with execution identity)
    ALLOC = "alloc"            # allocation / free / allocator-block (in)active
    COPY = "copy"              # explicit cudaMemcpy-style copy (HUM)
    THRASHING = "thrashing"    # driver's thrashing detection
    DROPS = "drops"            # events lost by a source, per kind
    ACCESS = "access"          # scripted traces only: the full page-access stream
    CPU_FAULT = "cpu_fault"    # host-side fault on managed memory
    COMMAND = "command"        # controller -> actuator command
    RESULT = "result"          # outcome of a command as executed by an actuator
    #: what a kernel launch names, as the host issues it: one record per pointer argument's
    #: address range (``seq`` ties it to the LAUNCH record of the same launch). A side channel
    #: beside LAUNCH, not new LAUNCH columns: LAUNCH stays the execution-ID transition at the
    #: kernel's start (what DeepUM's tables are keyed by), while these come when the host
    #: issues the launch, up to a launch queue ahead of the GPU. Appended last: KIND_CODES of
    #: the other kinds keep their values.
    LAUNCH_ARGS = "launch_args"


class Access(enum.IntEnum):
    READ = 0
    WRITE = 1
    ATOMIC = 2
    PREFETCH = 3


class Cause(enum.IntEnum):
    """Why data moved. DEMAND is the driver servicing a fault (the tools API calls it
    Coherence); DRIVER_PREFETCH is the stock density prefetcher; USER is an explicit migrate
    (cudaMemPrefetchAsync or a umctl command)."""

    DEMAND = 0
    DRIVER_PREFETCH = 1
    EVICTION = 2
    USER = 3
    ACCESS_COUNTER = 4
    COPY = 5
    OTHER = 6


class AllocOp(enum.IntEnum):
    ALLOC = 0
    FREE = 1
    BLOCK_INACTIVE = 2  # caching allocator keeps the memory but no tensor lives there
    BLOCK_ACTIVE = 3    # the block is handed out again
    #: the runtime set the range's preferred location to the host (a budget's admission control):
    #: the driver serves a GPU fault there by mapping the host page, and only explicit
    #: migrations (umctl's) bring it onto a GPU
    HOST_PREFERRED = 4
    #: the same with a neighbour GPU as the preferred location (admission with memHarvester's
    #: spare GPUs): a fault of the program's GPU maps the neighbour's page over the GPU link
    PEER_PREFERRED = 5


class CopyKind(enum.IntEnum):
    H2D = 0
    D2H = 1
    D2D = 2


class Op(enum.IntEnum):
    """Command operations a controller may emit."""

    PREFETCH = 0    # migrate range to dst (a GPU)
    PREEVICT = 1    # migrate range away from a GPU to dst (CPU or a neighbour GPU)
    INVALIDATE = 2  # drop the range's contents without write-back
    ADVISE = 3      # set advice (see Advice) on the range
    STAGE = 4       # prefetch range from the host into neighbour GPU dst's spare memory (HUVM)


class Advice(enum.IntEnum):
    NONE = 0
    READ_MOSTLY = 1
    PREFERRED_LOCATION = 2
    UNSET_READ_MOSTLY = 3
    UNSET_PREFERRED_LOCATION = 4


class Status(enum.IntEnum):
    OK = 0
    FAILED = 1
    TARGET_GONE = 2
    RANGE_INVALID = 3
    SKIPPED = 4  # nothing to do (already resident / already away)


i1, i2, i4, i8 = np.int8, np.int16, np.int32, np.int64
u1, u2, u4, u8 = np.uint8, np.uint16, np.uint32, np.uint64
f8 = np.float64

DTYPES: dict[Kind, np.dtype] = {
    Kind.FAULT: np.dtype([
        ("t_ns", i8), ("gpu", i2), ("pid", i4), ("batch_id", i8), ("addr", u8),
        ("access", u1), ("fault_type", u1), ("client", u2),
    ]),
    Kind.REPLAY: np.dtype([
        ("t_ns", i8), ("gpu", i2), ("batch_id", i8), ("nfaults", u4), ("t_start_ns", i8),
    ]),
    Kind.MIGRATION: np.dtype([
        ("t_ns", i8), ("t_end_ns", i8), ("pid", i4), ("src", i2), ("dst", i2),
        ("addr", u8), ("bytes", u8), ("cause", u1), ("exec_id", i8),
    ]),
    Kind.EVICTION: np.dtype([
        ("t_ns", i8), ("gpu", i2), ("pid", i4), ("addr", u8), ("bytes_written", u8),
        ("pages", u4), ("critical", np.bool_),
    ]),
    Kind.LAUNCH: np.dtype([
        ("t_ns", i8), ("t_end_ns", i8), ("gpu", i2), ("pid", i4), ("stream", u8),
        ("func", u8), ("grid", u4, (3,)), ("block", u4, (3,)), ("exec_hash", u8),
        ("name_id", i4), ("seq", i8),
    ]),
    Kind.ALLOC: np.dtype([
        ("t_ns", i8), ("pid", i4), ("op", u1), ("addr", u8), ("bytes", u8), ("alloc_id", i8),
        ("managed", np.bool_),
    ]),
    Kind.COPY: np.dtype([
        ("t_ns", i8), ("t_end_ns", i8), ("gpu", i2), ("pid", i4), ("stream", u8),
        ("kind", u1), ("src_addr", u8), ("dst_addr", u8), ("bytes", u8), ("is_async", np.bool_),
    ]),
    Kind.THRASHING: np.dtype([
        ("t_ns", i8), ("gpu", i2), ("pid", i4), ("addr", u8), ("bytes", u8),
    ]),
    Kind.DROPS: np.dtype([("t_ns", i8), ("kind", u1), ("count", u8)]),
    Kind.ACCESS: np.dtype([
        ("t_ns", i8), ("gpu", i2), ("pid", i4), ("seq", i8), ("addr", u8), ("access", u1),
    ]),
    Kind.CPU_FAULT: np.dtype([
        ("t_ns", i8), ("pid", i4), ("tid", i4), ("addr", u8), ("pc", u8), ("access", u1),
    ]),
    Kind.COMMAND: np.dtype([
        ("t_ns", i8), ("cmd_id", i8), ("op", u1), ("pid", i4), ("addr", u8), ("bytes", u8),
        ("dst", i2), ("advice", u1), ("exec_id", i8), ("priority", u1),
    ]),
    Kind.RESULT: np.dtype([
        ("t_ns", i8), ("cmd_id", i8), ("status", u1), ("bytes", u8), ("latency_ns", i8),
    ]),
    # t_ns: when the host issued the launch; one record per range, in the launch's argument
    # order; access: Access.WRITE if the kernel writes any of the range, else READ. Only
    # columns other kinds have (same names, same types): a trace file gains no column.
    Kind.LAUNCH_ARGS: np.dtype([
        ("t_ns", i8), ("gpu", i2), ("pid", i4), ("seq", i8), ("exec_hash", u8),
        ("addr", u8), ("bytes", u8), ("access", u1),
    ]),
}

#: Stable small integers for kinds, used where a kind is stored in a numeric column (DROPS).
KIND_CODES: dict[Kind, int] = {k: i for i, k in enumerate(Kind)}
KIND_BY_CODE: dict[int, Kind] = {i: k for k, i in KIND_CODES.items()}

COMMAND_DTYPE = DTYPES[Kind.COMMAND]


def empty(kind: Kind, n: int = 0) -> np.ndarray:
    """A zeroed batch of ``n`` records of ``kind``."""
    return np.zeros(n, dtype=DTYPES[kind])


def fault_block_firsts(faults: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The fault handler's unit: each 2 MiB block once per fault batch, at its first fault
    there. Returns (block of every record, indices of those first faults in record order)."""
    blocks = faults["addr"].astype(np.int64) >> BLOCK_SHIFT
    key = (faults["batch_id"].astype(np.int64) << 28) ^ (blocks & ((1 << 28) - 1))
    _, first = np.unique(key, return_index=True)
    first.sort()
    return blocks, first


def drops_record(t_ns: int, lost: Kind, count: int) -> np.ndarray:
    """One DROPS record: ``count`` events of kind ``lost`` a source could not deliver (sources
    keep cumulative counters and report the growth since their last report)."""
    d = empty(Kind.DROPS, 1)
    d["t_ns"], d["kind"], d["count"] = t_ns, KIND_CODES[lost], count
    return d


def commands(op, addr, nbytes, *, dst=0, pid=0, exec_id=-1, priority=1, advice=0, t_ns=0) -> np.ndarray:
    """Build a command batch from scalars or equal-length arrays (broadcast)."""
    addr = np.atleast_1d(np.asarray(addr, dtype=np.uint64))
    out = np.zeros(addr.shape[0], dtype=COMMAND_DTYPE)
    out["addr"] = addr
    out["op"] = op
    out["bytes"] = nbytes
    out["dst"] = dst
    out["pid"] = pid
    out["exec_id"] = exec_id
    out["priority"] = priority
    out["advice"] = advice
    out["t_ns"] = t_ns
    out["cmd_id"] = -1
    return out


@dataclass
class EventBatch:
    """Events of several kinds delivered together (one drain of a live ring, or one step of
    the simulator). ``now_ns`` is the source's clock when the batch was cut; ``names`` maps
    LAUNCH.name_id to kernel names (shared, append-only, for the whole session)."""

    now_ns: int = 0
    arrays: dict[Kind, np.ndarray] = field(default_factory=dict)
    names: list[str] = field(default_factory=list)
    #: where the batch holds the runtime's reports (umctl run --runtime): the time up to which
    #: that stream is complete (RuntimeSource.watermark_ns); None without one
    runtime_ns: int | None = None

    def __getitem__(self, kind: Kind) -> np.ndarray:
        a = self.arrays.get(kind)
        return a if a is not None else empty(kind)

    def __contains__(self, kind: Kind) -> bool:
        a = self.arrays.get(kind)
        return a is not None and len(a) > 0

    def add(self, kind: Kind, records: np.ndarray) -> None:
        if records.dtype != DTYPES[kind]:
            raise TypeError(f"{kind.value} records must have dtype {DTYPES[kind]}")
        prev = self.arrays.get(kind)
        self.arrays[kind] = records if prev is None or len(prev) == 0 else np.concatenate([prev, records])

    def __len__(self) -> int:
        return sum(len(a) for a in self.arrays.values())
