"""Ring entries -> umctl event batches, one vectorized pass per drained chunk.

A drained chunk is a structured array of :data:`abi.ENTRY_DTYPE` (the 72-byte union viewed at
every member's offset). Each kind is picked out with one boolean mask on ``type`` and its
columns are copied into our schema (:mod:`umctl.events.schema`) with numpy operations only:
at ~1 M events/s a per-event Python loop would be the bottleneck of the whole live path.

Conversions, and why:

* **Time.** The driver stamps events with CLOCK_MONOTONIC_RAW. Launch events from the BPF
  uprobes (``bpf_ktime_get_ns``) and everything else on the host use CLOCK_MONOTONIC, which
  NTP slews away from RAW by up to hundreds of ppm: over a day of uptime the two differ by
  seconds, enough to attribute faults to the wrong kernel. The source measures the offset
  between the clocks at every drain and the decoder adds it, so ``t_ns`` is CLOCK_MONOTONIC.
* **Processors.** The tools API numbers processors by UVM id: 0 is the CPU, GPUs are 1..
  (V2 table, up to 256). We map them through the UUID table to GPU ordinals (0..N-1, in the
  order nvidia-smi lists the GPUs when it can be asked, else UVM id order) and the CPU to
  :data:`umctl.units.CPU`.
* **Access** types shift by one (the tools enum has 0 = invalid); migration causes map to
  :class:`~umctl.events.schema.Cause` (Coherence, i.e. a fault being served, is DEMAND).
* **Fault batches.** GpuFault entries carry the driver's per-GPU batch id; the matching
  GpuFaultReplay closes the batch. A batch's faults may arrive in one drain and its replay in
  the next, so the decoder keeps per-batch counts and first-fault times across chunks and
  fills REPLAY ``nfaults`` and ``t_start_ns`` from them.
* **Drops.** The control block counts dropped entries per event type, cumulatively; the
  decoder turns increases into DROPS records (kind = our KIND_CODES of the mapped kind).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ...events.schema import KIND_CODES, Cause, EventBatch, Kind, empty
from ...units import CPU
from ...driver import abi

#: UVM event type -> our kind, for the types the decoder understands.
TYPE_KIND: dict[int, Kind] = {
    abi.EV_GPU_FAULT: Kind.FAULT,
    abi.EV_GPU_FAULT_REPLAY: Kind.REPLAY,
    abi.EV_MIGRATION: Kind.MIGRATION,
    abi.EV_CPU_FAULT: Kind.CPU_FAULT,
    abi.EV_THRASHING_DETECTED: Kind.THRASHING,
}
KIND_TYPE: dict[Kind, int] = {k: t for t, k in TYPE_KIND.items()}

_CAUSE_LUT = np.full(256, Cause.OTHER, dtype=np.uint8)
_CAUSE_LUT[abi.MIG_CAUSE_USER] = Cause.USER
_CAUSE_LUT[abi.MIG_CAUSE_COHERENCE] = Cause.DEMAND
_CAUSE_LUT[abi.MIG_CAUSE_PREFETCH] = Cause.DRIVER_PREFETCH
_CAUSE_LUT[abi.MIG_CAUSE_EVICTION] = Cause.EVICTION
_CAUSE_LUT[abi.MIG_CAUSE_ACCESS_COUNTERS] = Cause.ACCESS_COUNTER

# tools access enum (0 invalid, 1 read, 2 write, 3 atomic, 4 prefetch) -> Access
_ACCESS_LUT = np.zeros(256, dtype=np.uint8)
_ACCESS_LUT[1:5] = np.arange(4)

#: Pending (gpu, batch) fault statistics kept for REPLAY records; a batch whose replay never
#: comes (replay events disabled, or dropped) must not grow the table without bound.
MAX_PENDING_BATCHES = 1 << 16


def default_processor_map(n: int = abi.UVM_ID_MAX_PROCESSORS) -> np.ndarray:
    """UVM processor id -> our processor number when no UUID table is known: id 0 is the
    CPU, GPU ids count from 1."""
    m = np.arange(-1, n - 1, dtype=np.int16)
    m[abi.UVM_CPU_INDEX] = CPU
    return m


def _lowest_gpu(procs: np.ndarray) -> np.ndarray:
    """Lowest GPU UVM id set in each row of a (n, 5) uint64 processor bitmap, -1 if none."""
    out = np.full(len(procs), -1, dtype=np.int64)
    one = np.uint64(1)
    for word in range(procs.shape[1]):
        w = procs[:, word].astype(np.uint64)
        if word == 0:
            w = w & ~one  # bit 0 is the CPU
        low = w & (~w + one)  # isolate the lowest set bit
        has = (low != 0) & (out < 0)
        if has.any():
            out[has] = np.log2(low[has].astype(np.float64)).astype(np.int64) + 64 * word
    return out


class Decoder:
    """Decodes the chunks of one tracker (one target process). Stateful only for the fault
    batches still waiting for their replay and for the last dropped counters."""

    def __init__(self, pid: int, processor_map: np.ndarray | None = None,
                 refresh: Callable[[], np.ndarray | None] | None = None):
        self.pid = int(pid)
        self.processor_map = default_processor_map() if processor_map is None else processor_map.astype(np.int16)
        #: Called when an event names a processor the map lacks: a GPU registers with the
        #: va_space only when the program first uses it, which can be after we attached
        #: (``umctl run`` attaches at the first CUDA call), so the UUID table read at attach
        #: may not list it yet. Returns a fresh map, or None.
        self.refresh = refresh
        self._pend_key = np.empty(0, dtype=np.int64)   # sorted (gpu << 32 | batch)
        self._pend_n = np.empty(0, dtype=np.int64)
        self._pend_t = np.empty(0, dtype=np.int64)
        self._last_dropped = np.zeros(64, dtype=np.uint64)
        #: Entries of types we do not decode, by UVM type (they were enabled by someone else
        #: on a shared queue, or the driver added kinds).
        self.unknown: dict[int, int] = {}

    def _proc(self, uvm_ids: np.ndarray) -> np.ndarray:
        ids = uvm_ids.astype(np.int64)
        ok = (ids >= 0) & (ids < len(self.processor_map))
        out = np.full(len(ids), -2, dtype=np.int16)
        out[ok] = self.processor_map[ids[ok]]
        if (out == -2).any() and self.refresh is not None:
            fresh = self.refresh()
            if fresh is not None:
                self.processor_map = fresh.astype(np.int16)
                out[ok] = self.processor_map[ids[ok]]
        missing = out == -2
        if missing.any():  # still unknown: UVM id order (id 1 is the first GPU)
            out[missing] = default_processor_map(max(int(ids.max()) + 1, 2))[np.maximum(ids[missing], 0)]
            self.processor_map[ids[missing & ok]] = out[missing & ok]
        return out

    def decode(self, raw: np.ndarray, *, clock_offset_ns: int = 0, now_ns: int = 0,
               dropped: np.ndarray | None = None) -> EventBatch:
        """One chunk of ring entries (``abi.ENTRY_DTYPE``) -> an EventBatch. ``dropped`` is the
        control block's cumulative per-type counter array at the time of the drain."""
        raw = abi.as_entries(raw)
        off = np.int64(clock_offset_ns)
        batch = EventBatch(now_ns=int(now_ns))
        types = raw["type"]

        g = raw[types == abi.EV_GPU_FAULT]
        if len(g):
            f = empty(Kind.FAULT, len(g))
            f["t_ns"] = g["g_ts"].astype(np.int64) + off
            f["gpu"] = self._proc(g["g_gpu"])
            f["pid"] = self.pid
            f["batch_id"] = g["g_batch"]
            f["addr"] = g["g_addr"]
            f["access"] = _ACCESS_LUT[g["g_access"]]
            f["fault_type"] = g["g_fault_type"]
            f["client"] = g["g_client_id"]
            batch.add(Kind.FAULT, f)
            self._note_faults(f)

        r = raw[types == abi.EV_GPU_FAULT_REPLAY]
        if len(r):
            rp = empty(Kind.REPLAY, len(r))
            rp["t_ns"] = r["r_ts"].astype(np.int64) + off
            rp["gpu"] = self._proc(r["r_gpu"])
            rp["batch_id"] = r["r_batch"]
            self._close_batches(rp)
            batch.add(Kind.REPLAY, rp)

        m = raw[types == abi.EV_MIGRATION]
        if len(m):
            mg = empty(Kind.MIGRATION, len(m))
            mg["t_ns"] = m["m_begin"].astype(np.int64) + off
            mg["t_end_ns"] = m["m_end"].astype(np.int64) + off
            mg["pid"] = self.pid
            mg["src"] = self._proc(m["m_src"])
            mg["dst"] = self._proc(m["m_dst"])
            mg["addr"] = m["m_addr"]
            mg["bytes"] = m["m_bytes"]
            mg["cause"] = _CAUSE_LUT[m["m_cause"]]
            mg["exec_id"] = -1
            batch.add(Kind.MIGRATION, mg)

        c = raw[types == abi.EV_CPU_FAULT]
        if len(c):
            cf = empty(Kind.CPU_FAULT, len(c))
            cf["t_ns"] = c["c_ts"].astype(np.int64) + off
            cf["pid"] = c["c_pid"].astype(np.int64)
            cf["tid"] = c["c_tid"].astype(np.int64)
            cf["addr"] = c["c_addr"]
            cf["pc"] = c["c_pc"]
            cf["access"] = _ACCESS_LUT[c["c_access"]]
            batch.add(Kind.CPU_FAULT, cf)

        t = raw[types == abi.EV_THRASHING_DETECTED]
        if len(t):
            th = empty(Kind.THRASHING, len(t))
            th["t_ns"] = t["t_ts"].astype(np.int64) + off
            gpu_id = _lowest_gpu(t["t_procs"])
            th["gpu"] = np.where(gpu_id >= 0, self._proc(np.maximum(gpu_id, 0)), -1)
            th["pid"] = self.pid
            th["addr"] = t["t_addr"]
            th["bytes"] = t["t_size"]
            batch.add(Kind.THRASHING, th)

        known = np.isin(types, np.fromiter(TYPE_KIND, dtype=np.uint8))
        if not known.all():
            u, n = np.unique(types[~known], return_counts=True)
            for ty, cnt in zip(u.tolist(), n.tolist()):
                self.unknown[ty] = self.unknown.get(ty, 0) + cnt

        if dropped is not None:
            d = self.drops(dropped, now_ns)
            if len(d):
                batch.add(Kind.DROPS, d)
        return batch

    def drops(self, dropped: np.ndarray, now_ns: int) -> np.ndarray:
        """DROPS records for the increase of the cumulative per-type counters since the last
        call (types we do not decode are reported under the kind they would have had: none,
        so they are skipped)."""
        cur = np.asarray(dropped, dtype=np.uint64)
        delta = cur - self._last_dropped
        # a counter that went backwards (a new tracker) restarts from its new value
        delta = np.where(cur >= self._last_dropped, delta, cur)
        self._last_dropped = cur.copy()
        rows = [(ty, int(delta[ty])) for ty in np.flatnonzero(delta).tolist() if ty in TYPE_KIND]
        out = empty(Kind.DROPS, len(rows))
        for i, (ty, n) in enumerate(rows):
            out[i] = (now_ns, KIND_CODES[TYPE_KIND[ty]], n)
        return out

    # -- fault batches ------------------------------------------------------------------
    @staticmethod
    def _keys(gpu: np.ndarray, batch_id: np.ndarray) -> np.ndarray:
        return (gpu.astype(np.int64) << 32) | (batch_id.astype(np.int64) & 0xFFFFFFFF)

    def _note_faults(self, f: np.ndarray) -> None:
        keys = np.concatenate([self._pend_key, self._keys(f["gpu"], f["batch_id"])])
        n = np.concatenate([self._pend_n, np.ones(len(f), dtype=np.int64)])
        t = np.concatenate([self._pend_t, f["t_ns"]])
        uk, inv = np.unique(keys, return_inverse=True)
        inv = inv.reshape(-1)
        cnt = np.bincount(inv, weights=n, minlength=len(uk)).astype(np.int64)
        tmin = np.full(len(uk), np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(tmin, inv, t)
        if len(uk) > MAX_PENDING_BATCHES:  # keep the most recent batches (largest first-fault times)
            keep = np.sort(np.argsort(tmin, kind="stable")[-MAX_PENDING_BATCHES:])
            uk, cnt, tmin = uk[keep], cnt[keep], tmin[keep]
        self._pend_key, self._pend_n, self._pend_t = uk, cnt, tmin

    def _close_batches(self, rp: np.ndarray) -> None:
        keys = self._keys(rp["gpu"], rp["batch_id"])
        if len(self._pend_key) == 0:
            rp["t_start_ns"] = rp["t_ns"]
            return
        pos = np.searchsorted(self._pend_key, keys)
        posc = np.minimum(pos, len(self._pend_key) - 1)
        hit = self._pend_key[posc] == keys
        rp["nfaults"] = np.where(hit, self._pend_n[posc], 0)
        rp["t_start_ns"] = np.where(hit, self._pend_t[posc], rp["t_ns"])
        if hit.any():
            drop = np.zeros(len(self._pend_key), dtype=bool)
            drop[posc[hit]] = True
            self._pend_key = self._pend_key[~drop]
            self._pend_n = self._pend_n[~drop]
            self._pend_t = self._pend_t[~drop]

    @property
    def pending_batches(self) -> int:
        return len(self._pend_key)
