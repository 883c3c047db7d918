"""Calibration constants of the UVM simulator: what each one means, its unit and its range.

The built-in values (:data:`H100`, named ``h100-pcie5-r580``) are the H100 figures of
docs/evaluation/measurements.md ("Calibration"), where each is given with the command that
measured it; benchmarks/gpu/calibrate.py re-measures them on another GPU and writes a
calibration file (docs/reference/calibration.md). A new measurement becomes a new
:class:`Calibration` (a shipped file in calibrations/), never a constant scattered elsewhere.

The fault-path model is fitted, not measured directly: per batch the driver spends
``batch_ns + fault_ns * faulted_pages + block_ns * (blocks - 1) + moved_bytes / fault_h2d_Bps``,
with the batch formed by the GPU's in-flight window (``fault_window_pages``).
tests/test_sim_calibration.py holds the fit against the measured cold pass.

The simulator counts *distinct pages* per batch. The tools API reports several GpuFault
entries per page (several uTLBs report the same page), so compare live fault counts with
``umctl`` replays in distinct pages, not entries.
"""

from __future__ import annotations

import math
import numbers
import os
from dataclasses import asdict, dataclass, replace

from ..units import Range

#: Values of Calibration.eviction_refresh.
EVICTION_REFRESH = ("migration", "access")

#: The built-in constants' name: what a replay prints for them and ``--calibration`` accepts.
BUILTIN_NAME = "h100-pcie5-r580"

_RATE = Range(0, 1e15, lo_open=True)      # bytes/s: > 0 (a rate of 0 is an infinite transfer time)
_NS = Range(0, 3600e9)                    # a cost or a period: 0 .. one hour
_COUNT = Range(0, 1 << 20)

#: Allowed values of each numeric constant, checked whenever a Calibration is made (the
#: defaults, a calibration file, ``--calib-set``). The lower bounds are what the model needs to
#: mean anything: a rate of 0 divides by zero (``d2h_Bps: 0`` crashed a replay), a batch of 0
#: faults never empties the fault buffer (``batch_max_faults=0`` looped forever), and the
#: density threshold is a fraction of a region's pages. Upper bounds are far beyond any GPU
#: (1 PB/s, an hour per operation) and only stop a typo from stalling a replay.
RANGES: dict[str, Range] = {
    "prefetch_h2d_Bps": _RATE, "d2h_Bps": _RATE, "pinned_copy_Bps": _RATE, "pageable_copy_Bps": _RATE,
    "nvlink_Bps": _RATE, "fault_h2d_Bps": _RATE, "um_stage_Bps": _RATE, "hbm_Bps": _RATE,
    "internode_Bps": _RATE,
    "transfer_latency_ns": _NS, "batch_ns": _NS, "fault_ns": _NS, "block_ns": _NS, "evict_chunk_ns": _NS,
    "discard_block_ns": _NS, "um_migrate_latency_ns": _NS, "thrashing_lapse_ns": _NS,
    "thrashing_nap_ns": _NS, "thrashing_epoch_ns": _NS, "thrashing_pin_ns": _NS, "internode_latency_ns": _NS,
    "cpu_fault_ns_per_GiB": Range(0, 3600e9),
    "batch_max_faults": Range(1, 1 << 16),        # uvm_perf_fault_batch_count: 1 .. a GPU's fault buffer
    "fault_window_pages": Range(1, 1 << 20),
    "window_jitter": Range(0, 1),                 # ± a fraction of the window
    # a fraction of a region's pages (0.51 = 51 %); 1 switches the prefetcher off (a region
    # prefetches when more than threshold x its pages faulted, which no count exceeds at 1)
    "density_threshold": Range(0, 1, lo_open=True),
    "fault_granularity_pages": Range(1, 64),      # and a power of two (below)
    "thrashing_threshold": _COUNT, "thrashing_max_resets": _COUNT, "thrashing_pin_threshold": _COUNT,
}


@dataclass(frozen=True)
class Calibration:
    name: str = BUILTIN_NAME

    # -- host <-> GPU link (PCIe 5 x16) -----------------------------------------------------
    #: Rate of a host->GPU migration command (cuMemPrefetchAsync / UVM_MIGRATE), bytes/s.
    prefetch_h2d_Bps: float = 49.5e9
    #: Rate of a GPU->host migration (a prefetch to the CPU, and the write-back of an
    #: eviction), bytes/s.
    d2h_Bps: float = 13.0e9
    #: Fixed start-up of one migration command on a copy engine (ioctl + DMA setup).
    transfer_latency_ns: int = 10_000
    #: cudaMemcpy from pinned host memory (and every cudaMemcpyAsync), and from pageable host
    #: memory, bytes/s.
    pinned_copy_Bps: float = 54.9e9
    pageable_copy_Bps: float = 7.7e9
    #: GPU<->GPU migration over NVLink, bytes/s. The built-in value assumes UVM peer migrations
    #: in 2 MiB chunks reach about a third of NVLink 4's 450 GB/s per direction; not measured.
    nvlink_Bps: float = 150e9

    # -- fault servicing (fitted to the measured cold pass) ---------------------------------
    #: Most fault entries the driver fetches per batch (uvm_perf_fault_batch_count default).
    batch_max_faults: int = 256
    #: Fixed cost of one fault batch: fetch, sort, replay, TLB invalidate.
    batch_ns: int = 30_000
    #: Cost per distinct faulted page in a batch (service, map).
    fault_ns: int = 400
    #: Cost of each distinct 2 MiB block of a batch after the first: the driver services a batch
    #: block by block (block lock, make resident with its own copy push, map), so a batch spread
    #: over many blocks costs more than one of as many pages in one block. calibrate.py fits it
    #: by least squares over strided passes (:func:`fit_block_ns`); the shipped h100-r580 file,
    #: which recorded traces use, has it. The built-in value stays 0: with it the scenarios'
    #: irregular DLRM lookups cost the stock driver so much that DeepUM gains more there than on
    #: the regular models, against the paper's finding, and the scenario's batch shapes need a
    #: look before it changes.
    block_ns: int = 0
    #: Rate of the copies made while servicing faults (4 K-64 K pieces, under locks).
    fault_h2d_Bps: float = 25.0e9
    #: How far (in page accesses) the GPU runs ahead of a fault before the driver fetches the
    #: batch: many warps fault concurrently, so one batch covers a window of the stream. The
    #: window length varies per batch by ±window_jitter (seeded) because warps drift apart.
    fault_window_pages: int = 40
    window_jitter: float = 0.5
    #: Density prefetcher (uvm_perf_prefetch_threshold default 51 %).
    density_threshold: float = 0.51
    #: A fault migrates at least the aligned group of this many 4 KiB pages around it, and the
    #: density tree counts them as faulted: nvidia-uvm grows every fault to the GPU's 64 KiB big
    #: page (16) unless a page of it is thrashing (grow_fault_granularity in uvm_perf_prefetch.c,
    #: driver 390.48 as in 515-595). 1: page by page (a what-if).
    fault_granularity_pages: int = 16
    #: Per-chunk cost of an eviction on the fault path, beside its write-back.
    evict_chunk_ns: int = 20_000
    #: UVM_DISCARD per 2 MiB block (no copies).
    discard_block_ns: int = 8_000
    #: Host touching GPU-resident managed memory, per GiB: its CPU faults and the copy back.
    cpu_fault_ns_per_GiB: float = 110e6
    #: HUM's copy (PPoPP'20 §4.4-4.5): the rate at which the copy threads stage 2 MiB chunks from
    #: the program's buffer into host-side managed pages (benchmarks/gpu/hum_probe.py measures it).
    um_stage_Bps: float = 10e9
    #: HUM's copy: per-chunk start-up and synchronisation of one chunk's synchronous migration,
    #: beyond its bytes at prefetch_h2d_Bps.
    um_migrate_latency_ns: int = 53_000

    # -- GPU ---------------------------------------------------------------------------------
    #: Device memory rate (a device-to-device copy, read + write): bounds memory-bound kernels.
    hbm_Bps: float = 2.87e12

    # -- thrashing detection and throttling (nvidia-uvm uvm_perf_thrashing.c module defaults,
    #    open-gpu-kernel-modules; the model is in _simcore.c) ----------------------------------
    #: uvm_perf_thrashing_threshold: consecutive fault migrations of a page, each within the
    #: lapse of the previous one, that make it thrashing. 0 switches detection and throttling off.
    thrashing_threshold: int = 3
    #: uvm_perf_thrashing_lapse_usec = 500.
    thrashing_lapse_ns: int = 500_000
    #: uvm_perf_thrashing_nap = 1 (a multiple of the lapse): a throttled processor waits this long.
    thrashing_nap_ns: int = 500_000
    #: uvm_perf_thrashing_epoch = 2000 lapses: a block's tracking resets this long after its last
    #: thrashing event, uvm_perf_thrashing_max_resets = 4 times at most.
    thrashing_epoch_ns: int = 1_000_000_000
    thrashing_max_resets: int = 4
    #: uvm_perf_thrashing_pin_threshold: throttling periods of a page before it is pinned (on the
    #: host, mapped remotely by the GPUs: see _simcore.c); 0: throttle only, never pin.
    thrashing_pin_threshold: int = 10
    #: uvm_perf_thrashing_pin = 300 lapses: how long a page stays pinned.
    thrashing_pin_ns: int = 150_000_000
    #: A controller's prefetch (UVM_MIGRATE) into a full GPU evicts the least recently migrated root
    #: chunk to make room, as the driver's chunk allocator does for any migration (possibly one
    #: the next kernels need). False: such a prefetch is dropped instead.
    prefetch_evicts: bool = True
    #: What moves a root chunk to the tail of the driver's eviction list. "migration": pages
    #: migrating into its block (nvidia-uvm's block_mark_memory_used, called when a block
    #: first becomes resident and at the end of every make_resident into it, in every release
    #: read: 390.48, and the open modules 515.43 to 595.45; a GPU's accesses to resident data
    #: never reach the driver), so the chunk evicted is the least recently *migrated*.
    #: "access": every kernel's access refreshes the chunks it touches (a true LRU), which no
    #: driver does; it bounds what the eviction order can explain (docs/evaluation/fidelity.md).
    eviction_refresh: str = "migration"

    # -- nodes: a cluster of hosts (SnuRHAC, thesis ch. 6); only replays with nodes > 1 use these
    #: Inter-node link rate, each direction, of one node's port. The built-in value is the
    #: thesis's cluster (Table 7.9: InfiniBand EDR, 100 Gb/s = 12.5 GB/s of data, large RDMA
    #: transfers a little below it); snurhac-v100-edr.json gives the sources.
    internode_Bps: float = 12.0e9
    #: One message between the drivers of two nodes, one way (SnuRHAC's lock, faulted-list and
    #: page requests, §6.3): EDR's small-message latency; the drivers' own handling is not in it.
    internode_latency_ns: int = 1_000

    def __post_init__(self) -> None:
        """Every constant of its type and in its range (:data:`RANGES`); ValueError naming the
        first that is not, which the loaders turn into one line naming the file or the option."""
        for key, rng in RANGES.items():
            v = getattr(self, key)
            kind = type(self.__dataclass_fields__[key].default)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral if kind is int else numbers.Real):
                raise ValueError(f"{key} must be {'an int' if kind is int else 'a number'} {rng.describe()}, "
                                 f"not {v!r}")
            if v not in rng:
                raise ValueError(f"{key} must be {rng.describe()}, not {v!r}")
        if not isinstance(self.prefetch_evicts, bool):
            raise ValueError(f"prefetch_evicts must be true or false, not {self.prefetch_evicts!r}")
        if self.fault_granularity_pages not in (1, 2, 4, 8, 16, 32, 64):
            raise ValueError(f"fault_granularity_pages must be a power of two from 1 to 64, "
                             f"not {self.fault_granularity_pages}")
        if self.eviction_refresh not in EVICTION_REFRESH:
            raise ValueError(f"eviction_refresh must be one of {', '.join(EVICTION_REFRESH)}, "
                             f"not {self.eviction_refresh!r}")

    def with_overrides(self, **kw) -> "Calibration":
        return replace(self, **kw)

    def with_settings(self, items: list[str] | None) -> "Calibration":
        """This calibration with ``KEY=VALUE`` settings applied (``--calib-set``): a what-if
        on one constant (a faster link, another eviction order) without writing a file. The
        name records what was changed, so a report says it is not the shipped calibration."""
        kw = self.settings(items)
        if not kw:
            return self
        tag = ",".join(f"{k}={kw[k]}" for k in kw)
        return replace(self, **kw, name=f"{self.name}+{tag}")

    def settings(self, items: list[str] | None) -> dict:
        """``KEY=VALUE`` texts as typed constants of this calibration, checked together (the
        types and ranges of :data:`RANGES`); a bad one is a one-line UmctlError naming the
        constant and its range."""
        from .. import UmctlError

        if not items:
            return {}
        fields = self.__dataclass_fields__
        kw: dict = {}
        for item in items:
            key, sep, raw = item.partition("=")
            key, raw = key.strip(), raw.strip()
            if not sep or not key or not raw:
                raise UmctlError(f"--calib-set {item!r}: expected KEY=VALUE, e.g. d2h_Bps=12.3e9")
            if key == "name" or key not in fields:
                import difflib

                near = difflib.get_close_matches(key, [f for f in fields if f != "name"], n=1)
                hint = f" (did you mean {near[0]}?)" if near else "; see umctl/sim/calibration.py"
                raise UmctlError(f"--calib-set: no calibration constant {key!r}{hint}")
            kind = type(fields[key].default)
            try:
                if kind is bool:
                    low = raw.lower()
                    if low not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                        raise ValueError(raw)
                    kw[key] = low in ("1", "true", "yes", "on")
                elif kind is int:
                    v = float(raw)
                    if v != int(v):
                        raise ValueError(raw)
                    kw[key] = int(v)
                else:
                    kw[key] = kind(raw)
            except (ValueError, OverflowError):
                rng = f" {RANGES[key].describe()}" if key in RANGES else ""
                raise UmctlError(f"--calib-set {key}={raw}: not a valid {kind.__name__}{rng}") from None
        try:
            replace(self, **kw)
        except ValueError as e:
            raise UmctlError(f"--calib-set: {e}") from None
        return kw

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_fields(cls, fields: dict, where: str) -> "Calibration":
        """A calibration from a file's "calibration" table: every field known, of its type and
        in its range (an int written as 30000.0 is that int); UmctlError naming ``where`` (the
        file) and the field otherwise. Missing fields keep their defaults."""
        from .. import UmctlError

        if not isinstance(fields, dict):
            raise UmctlError(f"{where}: not a umctl calibration file (\"calibration\" must be a table of constants)")
        known = cls.__dataclass_fields__
        unknown = sorted(set(fields) - set(known))
        if unknown:
            raise UmctlError(f"{where}: not a umctl calibration file (unknown field(s) {', '.join(unknown)})")
        kw: dict = {}
        for key, v in fields.items():
            if key == "name":
                continue   # a calibration is named by its file (see load)
            kind = type(known[key].default)
            if kind is int and isinstance(v, float) and math.isfinite(v) and v.is_integer():
                v = int(v)
            ok = (isinstance(v, bool) if kind is bool else isinstance(v, str) if kind is str else
                  not isinstance(v, bool) and isinstance(v, int if kind is int else (int, float)))
            if not ok:
                what = {bool: "true or false", str: "a string", int: "an int", float: "a number"}[kind]
                rng = f" {RANGES[key].describe()}" if key in RANGES else ""
                raise UmctlError(f"{where}: calibration field {key} must be {what}{rng}, not {v!r}")
            kw[key] = float(v) if kind is float else v
        try:
            return replace(cls(), **kw)
        except ValueError as e:
            raise UmctlError(f"{where}: calibration field {e}") from None

    @classmethod
    def load(cls, path: str) -> "Calibration":
        """A calibration by name or file. Names are those a replay prints: the built-in
        constants' (``h100-pcie5-r580``), a shipped file's stem (``h100-r580``, ``h200-r580``:
        :func:`shipped_names`; their former internal names are aliases), a what-if
        ``NAME+KEY=VALUE,...`` as ``--calib-set`` names it. A path is a file written by
        benchmarks/gpu/calibrate.py: JSON with the fields of this class under "calibration"
        (missing ones keep their defaults) and the raw measurements beside them. A shipped file
        is named by its stem, so the name a replay prints is the one to pass again; a user's
        file keeps the name written in it (else its stem)."""
        import json
        import os

        from .. import UmctlError

        if not os.path.exists(path):
            name = ALIASES.get(path, path)
            if name == BUILTIN_NAME:
                return cls()
            bundled = os.path.join(CALIBRATION_DIR, os.path.basename(name))
            for candidate in (bundled, bundled + ".json"):
                if os.path.isfile(candidate) and os.path.basename(name) == name:
                    path = candidate
                    break
            else:
                base, plus, tag = name.partition("+")
                if plus and tag:   # a what-if, as a replay with --calib-set names it
                    return cls.load(base).with_settings(tag.split(","))
                raise UmctlError(f"{path}: cannot read calibration (no such file, and not a calibration name: "
                                 f"{', '.join([BUILTIN_NAME, *shipped_names()])})")
        try:
            with open(path) as f:
                data = json.load(f)
        except OSError as e:
            raise UmctlError(f"{path}: cannot read calibration ({e.strerror or e})") from None
        except (ValueError, UnicodeDecodeError) as e:
            raise UmctlError(f"{path}: not a umctl calibration file (not JSON: {' '.join(str(e).split())})") from None
        if not isinstance(data, dict) or "calibration" not in data:
            raise UmctlError(f"{path}: not a umctl calibration file (no \"calibration\" table)")
        cal = cls.from_fields(data["calibration"], path)
        stem = os.path.splitext(os.path.basename(path))[0]
        own = data["calibration"].get("name")
        shipped = os.path.dirname(os.path.abspath(path)) == os.path.abspath(CALIBRATION_DIR)
        # a shipped file is named by its stem; a user's file by the name written in it, if any
        return replace(cal, name=stem if shipped or not isinstance(own, str) or not own.strip() else own)


#: The shipped calibration files' directory.
CALIBRATION_DIR = os.path.join(os.path.dirname(__file__), "calibrations")
#: Names the shipped calibrations had inside their files before a calibration was named by its
#: file (still accepted by ``--calibration``).
ALIASES = {"h100-80gb-hbm3-measured": "h100-r580", "h200-measured": "h200-r580",
           "p3.8xlarge-v100-16gb-nvlink2-pcie3": "p3-v100-nvlink", "v100-pcie3-r460": "v100-pcie3"}


def shipped_names() -> list[str]:
    """The names of the calibrations shipped in umctl/sim/calibrations/ (file stems)."""
    return sorted(f[:-5] for f in os.listdir(CALIBRATION_DIR) if f.endswith(".json"))


def shipped_for(meta: dict) -> str | None:
    """The shipped calibration measured on the GPU and driver a recorded trace ran on (its
    metadata's ``gpu`` names and ``driver`` line), or None. A trace replays best with the
    constants of the machine it was recorded on."""
    import os
    import re

    gpus = meta.get("gpu")
    driver = str(meta.get("driver") or "")
    m = re.search(r"\b(\d{3})\.\d+", driver)
    if not isinstance(gpus, list) or not gpus or not m:
        return None
    name = str(gpus[0].get("name", "") if isinstance(gpus[0], dict) else "").lower()
    model = next((g for g in ("h100", "h200") if g in name), None)
    if model is None:
        return None
    cand = f"{model}-r{m.group(1)}"
    return cand if cand in shipped_names() else None


def fit_block_ns(shapes) -> int:
    """``block_ns`` from measured fault batches, each (distinct 2 MiB blocks, distinct pages,
    service ns): the least-squares coefficient of the extra blocks in service time on
    (1, blocks - 1, pages). 0 when the batches cannot separate it (too few, or all in one or
    two blocks), so a probe that failed leaves the model as it was."""
    import numpy as np

    sh = np.array(shapes, dtype=np.float64).reshape(-1, 3)
    if len(sh) < 10 or np.ptp(sh[:, 0]) < 2:
        return 0
    A = np.stack([np.ones(len(sh)), sh[:, 0] - 1, sh[:, 1]], axis=1)
    coef, *_ = np.linalg.lstsq(A, sh[:, 2], rcond=None)
    return max(0, int(round(coef[1])))


H100 = Calibration()
DEFAULT = H100
