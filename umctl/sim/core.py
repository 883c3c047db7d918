"""ctypes binding of the simulator's C core (``_simcore.c``).

The engine owns every state array (numpy); :class:`CoreState` is the C view of them. Any
array that is reallocated (the growing transfer-entry table) must be re-pointed with
:meth:`CoreState.point`.
"""

from __future__ import annotations

import ctypes as C

import numpy as np

from .. import UmctlError

ST_NAMES = ("faults", "fault_batches", "bytes_h2d", "bytes_d2h", "bytes_p2p", "demand_bytes",
            "driver_prefetch_bytes", "evictions", "evicted_bytes", "preevictions", "preevicted_bytes",
            "prefetch_used", "prefetch_wasted", "epoch", "batch_id", "user_prefetch_bytes", "prefetch_pages",
            "reclaims", "spills", "harvest_writeback_bytes", "harvest_drops", "thrashing_pages", "throttles", "pins",
            "remote_accesses", "bytes_internode", "internode_messages")
#: why a page was not on the GPU that faulted on it: the last way it left a GPU (``Simulator.gone``
#: holds these per page, not per GPU: on several GPUs, a first touch on one GPU of a page another
#: GPU lost is charged to how it was lost; the order is the C core's GONE_* enum) ...
GONE = ("cold", "evicted", "evicted_for_prefetch", "preevicted", "discarded", "moved", "host")
#: ... or it was there but not usable yet. Every fault is charged to exactly one of these causes.
FAULT_CAUSES = GONE + ("late_prefetch", "in_flight", "read_mostly_write")
ST_NAMES = ST_NAMES + tuple("fc_" + c for c in FAULT_CAUSES)
ST = {n: i for i, n in enumerate(ST_NAMES)}
FC = slice(ST["fc_cold"], ST["fc_cold"] + len(FAULT_CAUSES))
MAXB = 1024  # most faults in one batch the core supports
#: A set of GPUs, one bit each (the core's mask_t): a page's valid copies, its remote mappings.
#: The core is built twice from one source: 8-bit masks (up to 8 GPUs, one host) and 32-bit ones
#: (up to 32, the thesis's 8 nodes of 4 for SnuRHAC). The access walk reads a mask per page, and
#: the wide build cost a quarter of the full-scale DeepUM replay's throughput, so replays of up to
#: 8 GPUs keep the narrow one.
WIDTHS = {8: ("_simcore", np.uint8), 32: ("_simcore_wide", np.uint32)}
MAX_GPUS = max(WIDTHS)


def width(n_gpus: int) -> int:
    """Mask bits of the core that replays ``n_gpus`` GPUs."""
    return min(w for w in WIDTHS if w >= n_gpus)


P = C.c_void_p
i64 = C.c_int64
f64 = C.c_double


class SimState(C.Structure):
    _fields_ = [
        ("npg", i64), ("nbl", i64), ("ngpu", i64), ("max_pending", i64), ("max_active", i64),
        ("gmask", P), ("cpu_valid", P), ("managed", P), ("pf_tag", P),
        ("pf_entry", P), ("entry_done", P), ("read_mostly", P), ("any_read_mostly", i64),
        ("has_chunk", P), ("pinned", P), ("lru", P), ("evict_key", P), ("rescount", P),
        ("used", P), ("cap", P), ("maxblocks", P), ("pending", P), ("npending", P), ("active", P), ("nactive", P),
        ("h2d_tail", P), ("d2h_tail", P),
        ("batch_ns", f64), ("fault_ns", f64), ("fault_h2d_Bpns", f64), ("nvlink_Bpns", f64),
        ("d2h_Bpns", f64), ("evict_chunk_ns", f64), ("density_threshold", f64), ("window_jitter", f64),
        ("transfer_latency_ns", f64), ("prefetch_Bpns", f64), ("hbm_Bpns", f64), ("n_entries", i64),
        ("max_entries", i64), ("window_pages", i64), ("batch_max", i64),
        ("rng", C.c_uint64), ("stats", P), ("seen", P),
        ("harvested", P), ("removable_at", P), ("spill_mask", P), ("spill_rr", P), ("fetch_via", P),
        ("wb_Bpns", P), ("p2p_tail", P), ("nlent", P), ("lend_cap", P), ("block_ns", f64),
        ("gone", P), ("drop_reason", i64),
        ("lru_tree", P), ("lru_leaves", i64), ("lru_check", i64), ("lru_mismatch", i64),
        ("thr", P), ("thr_threshold", i64), ("thr_max_resets", i64), ("thr_lapse_ns", f64), ("thr_nap_ns", f64),
        ("thr_epoch_ns", f64), ("prefetch_evicts", i64), ("thr_pin_threshold", i64), ("any_remote", i64),
        ("thr_pin_ns", f64), ("remote_ns", f64), ("remote", P),
        ("node", P), ("node_mask", P), ("net_host_Bpns", P), ("net_peer_Bpns", f64), ("net_latency_ns", f64),
        ("desc_node", P), ("fault_gran", i64), ("lru_on_access", i64),
        ("wb_busy", P), ("host_ready", P),
    ]


OUT_F, OUT_B, OUT_E, OUT_M = 65536, 4096, 4096, 8192


class EventOut(C.Structure):
    """Events of the fault batches serviced since the engine last emptied it."""

    _fields_ = [
        ("collect", i64), ("nf", i64), ("nb", i64), ("ne", i64), ("nm", i64),
        ("f_page", i64 * OUT_F), ("f_write", C.c_uint8 * OUT_F), ("f_batch", i64 * OUT_F),
        ("b_id", i64 * OUT_B), ("b_nf", i64 * OUT_B), ("b_t", f64 * OUT_B), ("b_end", f64 * OUT_B),
        ("e_block", i64 * OUT_E), ("e_written", i64 * OUT_E), ("e_t", f64 * OUT_E),
        ("m_batch", i64 * OUT_M), ("m_block", i64 * OUT_M), ("m_bytes", i64 * OUT_M), ("m_pf_bytes", i64 * OUT_M),
    ]

    def views(self) -> dict[str, np.ndarray]:
        """numpy views (no copy) of the whole buffers, made once."""
        views = self.__dict__.get("_views")
        if views is None:
            views = self.__dict__["_views"] = {f: np.ctypeslib.as_array(getattr(self, f))
                                                for f, _ in self._fields_ if f[1] == "_"}
        return views

    def view(self, name: str) -> np.ndarray:
        """numpy view (no copy) of the filled part of one buffer."""
        return self.views()[name][: getattr(self, "n" + name[0])]

    def clear(self) -> None:
        self.nf = self.nb = self.ne = self.nm = 0


def _load(bits: int) -> C.CDLL:
    import importlib

    try:
        mod = importlib.import_module(f".{WIDTHS[bits][0]}", __package__)
    except ImportError as e:  # pragma: no cover - only on a broken install
        raise UmctlError(f"the simulator core is not built ({e}); reinstall with `pip install .` "
                         "on a machine with a C compiler (gcc)") from None
    lib = C.CDLL(mod.__file__)
    PS = C.POINTER(SimState)
    lib.sim_kernel.argtypes = [PS, C.c_int, P, P, P, i64, P, P, i64, i64, i64, f64, f64, C.POINTER(f64), f64,
                               C.POINTER(EventOut)]
    lib.sim_kernel.restype = i64
    lib.sim_release_chunk.argtypes = [PS, C.c_int, i64, f64]
    lib.sim_release_chunk.restype = None
    lib.sim_drop_range.argtypes = [PS, C.c_int, i64, i64, C.c_int]
    lib.sim_drop_range.restype = i64
    lib.sim_take_chunk_async.argtypes = [PS, C.c_int, i64, f64, C.POINTER(i64), C.POINTER(i64)]
    lib.sim_take_chunk_async.restype = f64
    lib.sim_prefetch.argtypes = [PS, C.c_int, i64, i64, f64, C.c_int, C.POINTER(f64)]
    lib.sim_prefetch.restype = f64
    lib.sim_take_spare.argtypes = [PS, C.c_int, i64, f64]
    lib.sim_take_spare.restype = f64
    lib.sim_harvest_writeback.argtypes = [PS, C.c_int, i64, f64]
    lib.sim_harvest_writeback.restype = None
    lib.sim_invalidate.argtypes = [PS, i64, i64]
    lib.sim_invalidate.restype = i64
    lib.sim_lru_fix.argtypes = [PS, C.c_int, i64]
    lib.sim_lru_fix.restype = None
    lib.sim_thr_init.argtypes = [PS]
    lib.sim_thr_init.restype = i64
    lib.sim_thr_free.argtypes = [PS]
    lib.sim_thr_free.restype = None
    lib.sim_thr_host.argtypes = [PS, P, i64, f64]
    lib.sim_thr_host.restype = f64
    lib.sim_lru_build.argtypes = [PS]
    lib.sim_lru_build.restype = None
    lib.sim_host_net_ns.argtypes = [PS, C.c_int, i64]
    lib.sim_host_net_ns.restype = f64
    lib.sim_state_size.restype = i64
    lib.sim_eventout_size.restype = i64
    lib.sim_max_gpus.restype = i64
    if lib.sim_state_size() != C.sizeof(SimState) or lib.sim_eventout_size() != C.sizeof(EventOut) \
            or lib.sim_max_gpus() != bits:
        raise UmctlError("the simulator core does not match this umctl version; reinstall umctl")
    return lib


_LIBS: dict[int, C.CDLL] = {}


def lib(n_gpus: int = 1) -> C.CDLL:
    """The core for ``n_gpus`` GPUs (its masks' dtype: ``WIDTHS[width(n_gpus)][1]``)."""
    bits = width(n_gpus)
    if bits not in _LIBS:
        _LIBS[bits] = _load(bits)
    return _LIBS[bits]


def ptr(a: np.ndarray) -> int:
    assert a.flags.c_contiguous
    return a.ctypes.data
