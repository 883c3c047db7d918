"""``UvmToolsSource``: live UVM events of one unmodified process, as umctl event batches.

Attach sequence (each step's failure is a distinct one-line error, see process.py):
pid exists -> /dev/nvidia-uvm-tools opens -> the target has /dev/nvidia-uvm fds -> pidfd
duplication -> V2 event tracker on our ring (tried on each fd until NV_OK) -> enable the
requested event types -> counters tracker (optional) -> UUID table -> drain thread.

``sample`` < 1 collects events and counters in time windows only (sampling.py: totals are
then estimates, scaled by the measured on-time); recording and control never sample.

Which kinds to enable is the caller's choice because their costs differ by an order of
magnitude (docs/evaluation/measurements.md has the measurements): GPU faults, replays, CPU faults, thrashing and
the counters are cheap, while Migration events made a fault-heavy pass ~1.8x slower, since the
driver then logs one event per copy on its fault-service path. :data:`DEFAULT_KINDS` is the
cheap set; views that need bytes by cause enable MIGRATION.
"""

from __future__ import annotations

import errno
import time
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

from ...events.schema import EventBatch, Kind
from ...driver import abi
from .decode import KIND_TYPE, Decoder
from ...driver.process import (
    LiveError, NoDriver, NoPermission, TargetExited, TrackerError, borrow_va_space, list_uvm_processes,  # noqa: F401
    nvidia_smi_gpus, processor_map, processor_uuid_table, uvm_fds,
)
from .ring import Drainer, LagHistogram, Ring
from .sampling import Sampler

#: Names accepted by ``--kinds`` (and their event kinds).
KIND_NAMES: dict[str, Kind] = {
    "faults": Kind.FAULT, "replays": Kind.REPLAY, "migrations": Kind.MIGRATION,
    "cpu_faults": Kind.CPU_FAULT, "thrashing": Kind.THRASHING,
}
#: The cheap kinds (overhead within noise on the measured fault-heavy sweeps).
DEFAULT_KINDS: frozenset[Kind] = frozenset({Kind.FAULT, Kind.REPLAY, Kind.CPU_FAULT, Kind.THRASHING})
ALL_KINDS: frozenset[Kind] = frozenset(KIND_NAMES.values())


def parse_kinds(text: str | None) -> frozenset[Kind]:
    """``default``, ``all``, or a comma list of :data:`KIND_NAMES` (``+migrations`` adds to
    the default set)."""
    if text is None or text.strip() in ("", "default"):
        return DEFAULT_KINDS
    text = text.strip()
    if text == "all":
        return ALL_KINDS
    base: set[Kind] = set(DEFAULT_KINDS) if text.startswith("+") else set()
    for part in text.lstrip("+").split(","):
        name = part.strip().replace("-", "_")
        if not name:
            continue
        if name not in KIND_NAMES:
            raise LiveError(f"unknown event kind {part.strip()!r} (choose from {', '.join(KIND_NAMES)}, default, all)")
        base.add(KIND_NAMES[name])
    if not base:
        raise LiveError("no event kinds selected")
    return frozenset(base)


def kinds_label(kinds: Iterable[Kind]) -> str:
    names = [n for n, k in KIND_NAMES.items() if k in set(kinds)]
    return ",".join(names)


_TIMELY_TYPES = np.array([abi.EV_GPU_FAULT, abi.EV_CPU_FAULT], dtype=np.uint8)


@dataclass(frozen=True)
class VaSpace:
    """A target's va_space as this attachment holds it: the duplicated fd, our GPU number ->
    16-byte UUID (a callable: a GPU the target registers later appears in the table then), the
    CPU's UUID, the ioctl layer and the target's pidfd (-1: none)."""

    va_fd: int
    gpu_uuid: Callable[[int], bytes | None]
    cpu_uuid: bytes
    io: abi.Ioctl
    pidfd: int


class UvmToolsSource:
    """Events of one process through the UVM tools API.

    ``start()`` attaches (raises a :class:`LiveError` subclass), ``drain()`` returns the
    events gathered since the last call as one EventBatch (``t_ns`` in CLOCK_MONOTONIC),
    ``stop()`` ends collection after a final flush and drain (call ``drain()`` once more to
    get those), ``close()`` releases the driver objects. ``exited()`` says whether the target
    has exited; its events up to then are still drained."""

    #: the actuator that reaches this source's target (umctl.live.spec.ACTUATORS builds it from
    #: :meth:`va_space`): UVM ioctls on the borrowed va_space fd
    actuator = "uvm"

    def __init__(self, pid: int, kinds: Iterable[Kind] = DEFAULT_KINDS, ring_entries: int = 2 ** 18,
                 flush_ms: float = 5.0, *, drain_ms: float = 2.0, counters: bool = True, sample: float = 1.0,
                 sample_period_ms: float = 100.0,
                 io: abi.Ioctl | None = None, proc_root: str | None = None, smi: list[dict] | None = None):
        if ring_entries < 2 or ring_entries & (ring_entries - 1):
            raise LiveError(f"ring_entries must be a power of two (got {ring_entries})")
        self.pid = int(pid)
        self.kinds = frozenset(Kind(k) for k in kinds)
        unknown = self.kinds - ALL_KINDS
        if unknown:
            raise LiveError(f"the UVM tools source cannot produce {', '.join(k.value for k in unknown)} events")
        self.ring_entries = int(ring_entries)
        self.flush_ms = float(flush_ms)
        self.drain_ms = float(drain_ms)
        self.want_counters = counters
        if not 0 < sample <= 1:
            raise LiveError(f"sample must be in (0, 1] (got {sample})")
        #: fraction of the time the event queue is on (sampling.py); 1 = every event
        self.sample = float(sample)
        self.sample_period_ms = float(sample_period_ms)
        self.sampler: Sampler | None = None
        self.io = io if io is not None else abi.Ioctl()
        from ...driver import process as _process

        self.proc_root = proc_root if proc_root is not None else _process.PROC_ROOT
        self._smi = smi
        self._tools_fd = -1
        self._counters_fd = -1
        self._borrowed = None
        self._queue: abi.PageBuffer | None = None
        self._control: abi.PageBuffer | None = None
        self._counters_buf: abi.PageBuffer | None = None
        self._counters_view: np.ndarray | None = None
        self.drainer: Drainer | None = None
        self.decoder: Decoder | None = None
        self.gpus: list[dict] = []
        #: UVM processor id -> UUID bytes (0: the CPU), for the actuator's UVM_MIGRATE targets
        self.processor_uuids: dict[int, bytes] = {}
        self.target_fd = -1
        self.attach_ms = 0.0
        self.totals: dict[Kind, int] = {k: 0 for k in Kind}
        self.dropped_total = 0
        self.lag_ring = LagHistogram()       # event time -> taken off the ring by the drain thread
        self.lag_delivery = LagHistogram()   # event time -> handed to the caller by drain()
        self.lag_migration = LagHistogram()  # migration end time -> taken off the ring
        self.t_start_ns = 0
        self._stopped = False
        self._last_refresh = 0.0
        #: When set to a list, every drained raw chunk (ENTRY_DTYPE) is appended to it: how the
        #: CI fixtures of real ring bytes were captured.
        self.raw_sink: list[np.ndarray] | None = None

    # -- attach ---------------------------------------------------------------------------
    def start(self) -> "UvmToolsSource":
        t0 = time.perf_counter()
        uvm_fds(self.pid, self.proc_root)  # NoSuchProcess / NoPermission before anything else
        self._tools_fd = self._open_tools()
        try:
            self._attach()
        except BaseException:
            self.close()
            raise
        self.attach_ms = (time.perf_counter() - t0) * 1e3
        self.t_start_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        self.drainer.start()
        return self

    def _open_tools(self) -> int:
        try:
            return self.io.open_tools()
        except FileNotFoundError as e:
            raise NoDriver("no NVIDIA UVM driver: /dev/nvidia-uvm-tools does not exist "
                           "(is nvidia-uvm loaded? modprobe nvidia-uvm)") from e
        except PermissionError as e:
            raise NoPermission("cannot open /dev/nvidia-uvm-tools: permission denied (run as root)") from e
        except OSError as e:
            if e.errno == errno.ENXIO or e.errno == errno.ENODEV:
                raise NoDriver(f"no NVIDIA UVM driver behind /dev/nvidia-uvm-tools ({e.strerror})") from e
            raise LiveError(f"cannot open /dev/nvidia-uvm-tools ({e.strerror or e})") from e

    def _attach(self) -> None:
        n = self.ring_entries
        self._queue = abi.PageBuffer(n * abi.ENTRY_SIZE)
        self._control = abi.PageBuffer(abi.CONTROL_SIZE)

        def try_fd(fd: int) -> int:
            p = abi.InitEventTrackerParams(queueBuffer=self._queue.addr, queueBufferSize=n,
                                           controlBuffer=self._control.addr, allProcessors=0, uvmFd=fd)
            try:
                return self.io.ioctl(self._tools_fd, abi.UVM_TOOLS_INIT_EVENT_TRACKER_V2, p)
            except OSError as e:
                if e.errno in (errno.EPERM, errno.EACCES):
                    raise NoPermission(f"the driver refused an event tracker: {e.strerror}") from e
                raise TrackerError(f"UVM_TOOLS_INIT_EVENT_TRACKER_V2 failed: {e.strerror or e}") from e

        self._borrowed = borrow_va_space(self.pid, self.io, try_fd, self.proc_root)
        self.target_fd = self._borrowed.target_fd
        mask = abi.event_mask(KIND_TYPE[k] for k in self.kinds)
        if self.want_counters:   # first: a sampled view's totals must cover every event it saw
            self._start_counters()
        self._check(self.io.ioctl(self._tools_fd, abi.UVM_TOOLS_EVENT_QUEUE_ENABLE_EVENTS, abi.U64Params(value=mask)),
                    "enable events")
        try:
            table = processor_uuid_table(self.io, self._borrowed.va_fd)
        except TrackerError:
            table = {}
        self.processor_uuids = table
        pmap, self.gpus = processor_map(table, self._smi_gpus()) if table else (None, [])
        self.decoder = Decoder(self.pid, pmap, refresh=self._refresh_processors)
        ring = Ring(self._queue.view(abi.ENTRY_DTYPE, n), self._control.view(abi.CONTROL_DTYPE, 1))
        va_fd = self._borrowed.va_fd

        def flush() -> None:
            st = self.io.ioctl(va_fd, abi.UVM_TOOLS_FLUSH_EVENTS, abi.StatusParams())
            if st != abi.NV_OK:
                raise OSError(0, abi.nv_status_name(st))

        if self.sample < 1:
            tools_fd = self._tools_fd

            def toggle(on: bool) -> None:
                # Events AND counters: the driver's va_space "tools enabled" state is on while
                # either is, and in that state every CPU fault waits for the tools kthread
                # queue (uvm_va_space_cpu_fault -> uvm_tools_flush_events) and every GPU fault
                # runs the tools callback; between windows the driver is tool-free.
                req = abi.UVM_TOOLS_EVENT_QUEUE_ENABLE_EVENTS if on else abi.UVM_TOOLS_EVENT_QUEUE_DISABLE_EVENTS
                st = self.io.ioctl(tools_fd, req, abi.U64Params(value=mask))
                if st == abi.NV_OK and self._counters_fd >= 0:
                    creq = abi.UVM_TOOLS_ENABLE_COUNTERS if on else abi.UVM_TOOLS_DISABLE_COUNTERS
                    st = self.io.ioctl(self._counters_fd, creq, abi.U64Params(value=abi.COUNTER_MASK))
                if st != abi.NV_OK:
                    raise OSError(0, abi.nv_status_name(st))

            self.sampler = Sampler(toggle, self.sample, self.sample_period_ms)
        self.drainer = Drainer(ring, flush=flush if self.flush_ms > 0 else None, flush_ms=self.flush_ms,
                               drain_ms=self.drain_ms, name=f"umctl-uvm-{self.pid}",
                               tick=self.sampler.tick if self.sampler is not None else None)

    def _smi_gpus(self) -> list[dict]:
        if self._smi is None:
            self._smi = nvidia_smi_gpus()
        return self._smi

    def _refresh_processors(self) -> np.ndarray | None:
        """Re-read the UUID table (a GPU the program started using after we attached);
        at most once a second, since an unknown id in every batch must not cost an ioctl each."""
        now = time.monotonic()
        if self._borrowed is None or now - self._last_refresh < 1.0:
            return None
        self._last_refresh = now
        try:
            table = processor_uuid_table(self.io, self._borrowed.va_fd)
        except TrackerError:
            return None
        if len(table) <= 1:
            return None
        self.processor_uuids = table
        pmap, self.gpus = processor_map(table, self._smi_gpus())
        return pmap

    def _start_counters(self) -> None:
        """A second tracker with no queue: the driver keeps the counters in our buffer. Cheap
        and independent of the enabled events, so top shows traffic even without Migration
        events. Failure leaves counters off (not fatal)."""
        try:
            self._counters_fd = self.io.open_tools()
            self._counters_buf = abi.PageBuffer(abi.N_COUNTERS * 8)
            p = abi.InitEventTrackerParams(queueBuffer=0, queueBufferSize=0, controlBuffer=self._counters_buf.addr,
                                           allProcessors=1, uvmFd=self._borrowed.va_fd)
            ok = self.io.ioctl(self._counters_fd, abi.UVM_TOOLS_INIT_EVENT_TRACKER_V2, p) == abi.NV_OK and \
                self.io.ioctl(self._counters_fd, abi.UVM_TOOLS_ENABLE_COUNTERS,
                              abi.U64Params(value=abi.COUNTER_MASK)) == abi.NV_OK
        except OSError:
            ok = False
        if ok:
            self._counters_view = self._counters_buf.view(np.dtype("<u8"), abi.N_COUNTERS)
        elif self._counters_fd >= 0:
            self.io.close(self._counters_fd)
            self._counters_fd = -1

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != abi.NV_OK:
            raise TrackerError(f"{what}: the driver returned {abi.nv_status_name(status)}")

    def va_space(self) -> VaSpace:
        """What an actuator needs to act on the target's va_space: the same duplicated fd, and
        GPUs numbered as this source numbers them in events."""
        if self._borrowed is None:
            raise LiveError("not attached")

        def gpu_uuid(g: int) -> bytes | None:
            for attempt in range(2):
                for info in self.gpus:
                    if int(info["gpu"]) == g:
                        return self.processor_uuids.get(int(info["uvm_id"]))
                if attempt == 0:  # a GPU the target registered after we attached
                    pmap = self._refresh_processors()
                    if pmap is not None and self.decoder is not None:
                        self.decoder.processor_map = pmap.astype(np.int16)
            return None

        return VaSpace(self._borrowed.va_fd, gpu_uuid, self.processor_uuids.get(abi.UVM_CPU_INDEX, bytes(16)),
                       self.io, self._borrowed.pidfd)

    # -- running --------------------------------------------------------------------------
    def drain(self) -> EventBatch:
        """Everything drained since the last call, decoded, as one batch."""
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        if self.drainer is None or self.decoder is None:
            return EventBatch(now_ns=now)
        chunks = self.drainer.take()
        if not chunks:
            return EventBatch(now_ns=now)
        for ch in chunks:
            e = ch.entries
            if len(e):
                timely = np.isin(e["type"], _TIMELY_TYPES)
                ts = e["g_ts"][timely].astype(np.int64) + ch.clock_offset_ns  # c_ts shares the offset
                self.lag_ring.add(ch.drained_ns - ts)
                self.lag_delivery.add(now - ts)
                mig = e["type"] == abi.EV_MIGRATION
                if mig.any():
                    self.lag_migration.add(ch.drained_ns - (e["m_end"][mig].astype(np.int64) + ch.clock_offset_ns))
        raw = chunks[0].entries if len(chunks) == 1 else abi.concat_entries([c.entries for c in chunks])
        if self.raw_sink is not None and len(raw):
            self.raw_sink.append(raw)
        batch = self.decoder.decode(raw, clock_offset_ns=chunks[-1].clock_offset_ns, now_ns=now,
                                    dropped=chunks[-1].dropped)
        for k, a in batch.arrays.items():
            self.totals[k] += len(a)
        if Kind.DROPS in batch:
            self.dropped_total += int(batch[Kind.DROPS]["count"].sum())
        return batch

    def sample_fraction(self) -> float:
        """Measured fraction of the time events were collected (1.0 without sampling)."""
        return self.sampler.fraction() if self.sampler is not None else 1.0

    def counters(self) -> dict[str, int]:
        """Driver counters of the target ({} when the counters tracker is off)."""
        if self._counters_view is None:
            return {}
        v = self._counters_view
        return {name: int(v[i]) for i, name in abi.COUNTER_NAMES.items()}

    def exited(self) -> bool:
        """Whether the target has exited (its pidfd polls readable)."""
        if self._borrowed is None:
            return True
        return self.io.process_exited(self._borrowed.pidfd)

    def stats(self) -> dict:
        """Counters of the attachment itself: totals, drops, lags, drain-thread figures."""
        d = self.drainer.stats if self.drainer else None

        def ms(h: LagHistogram, p: float) -> float | None:
            v = h.percentile(p)
            return None if v is None else round(v / 1e6, 3)

        return {
            "pid": self.pid, "kinds": kinds_label(self.kinds), "attach_ms": round(self.attach_ms, 2),
            "ring_entries": self.ring_entries, "flush_ms": self.flush_ms, "target_fd": self.target_fd,
            "sample": self.sample, "sampled_fraction": round(self.sample_fraction(), 4),
            "events": {k.value: n for k, n in self.totals.items() if n},
            "dropped": self.dropped_total,
            "lag_ring_ms": {"p50": ms(self.lag_ring, 50), "p99": ms(self.lag_ring, 99), "n": self.lag_ring.n},
            "lag_delivery_ms": {"p50": ms(self.lag_delivery, 50), "p99": ms(self.lag_delivery, 99)},
            "lag_migration_ms": {"p50": ms(self.lag_migration, 50), "p99": ms(self.lag_migration, 99),
                                 "n": self.lag_migration.n},
            "ring_max_fill": round(d.max_fill, 4) if d else None,
            "max_chunk": d.max_chunk if d else None,
            "flushes": d.flushes if d else 0,
            "flush_us_mean": round(d.flush_ns_total / d.flushes / 1e3, 1) if d and d.flushes else None,
            "errors": list(d.errors) if d else [],
            "unknown_types": dict(self.decoder.unknown) if self.decoder else {},
            "gpus": self.gpus,
        }

    # -- detach ---------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop collecting: the drain thread ends after one last flush and drain."""
        if self.drainer is not None and not self._stopped:
            self._stopped = True
            self.drainer.stop(final_flush=True)

    def close(self) -> None:
        """Disable events and release every fd; the driver then unpins our buffers."""
        if self.drainer is not None and not self._stopped:
            self.stop()
        if self._tools_fd >= 0:
            try:
                self.io.ioctl(self._tools_fd, abi.UVM_TOOLS_EVENT_QUEUE_DISABLE_EVENTS,
                              abi.U64Params(value=abi.event_mask(KIND_TYPE[k] for k in self.kinds)))
            except OSError:
                pass
            self.io.close(self._tools_fd)
            self._tools_fd = -1
        if self._counters_fd >= 0:
            self.io.close(self._counters_fd)
            self._counters_fd = -1
        if self._borrowed is not None:
            self.io.close(self._borrowed.va_fd)
            self.io.close(self._borrowed.pidfd)
            self._borrowed = None
        self._counters_view = None

    def __enter__(self) -> "UvmToolsSource":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["UvmToolsSource", "DEFAULT_KINDS", "ALL_KINDS", "KIND_NAMES", "parse_kinds", "kinds_label",
           "list_uvm_processes", "LiveError", "NoDriver", "NoPermission", "TargetExited", "TrackerError"]
