"""workload_from_trace: scripted access traces and recorded fault traces."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from umctl import UmctlError
from umctl.events.schema import Access, AllocOp, CopyKind, EventBatch, Kind, empty
from umctl.events.trace import Trace, TraceError, TraceWriter, read_trace
from umctl.workload.tracefile import BEFORE_FIRST_LAUNCH, MAX_INFERRED_COMPUTE_NS, NO_LAUNCH_RECORD, workload_from_trace
from umctl.workload.workload import Init, OpType, exec_hash
from umctl.units import BLOCK_SIZE, MiB, PAGE_SHIFT, PAGE_SIZE

BASE = 0x7F00_0000_0000
BASE_PAGE = BASE >> PAGE_SHIFT


def make(path: Path, arrays: dict[Kind, np.ndarray], names: list[str] = (), meta: dict | None = None) -> Trace:
    b = EventBatch(names=list(names))
    for k, a in arrays.items():
        b.add(k, a)
    with TraceWriter(path, meta or {}) as w:
        w.write(b)
    return read_trace(path)


def launches(t, gpu=0, t_end=None, name_id=None, seq=None) -> np.ndarray:
    n = len(t)
    out = empty(Kind.LAUNCH, n)
    out["t_ns"] = t
    out["t_end_ns"] = 0 if t_end is None else t_end
    out["gpu"] = gpu
    out["pid"] = 42
    out["name_id"] = np.arange(n) if name_id is None else name_id
    out["seq"] = np.arange(n) if seq is None else seq
    out["exec_hash"] = 1000 + np.arange(n)
    out["func"] = 0xBEEF
    out["grid"], out["block"] = (4, 2, 1), (256, 1, 1)
    return out


def faults(t, page, access=Access.READ, gpu=0) -> np.ndarray:
    out = empty(Kind.FAULT, len(t))
    out["t_ns"], out["addr"], out["access"], out["gpu"], out["pid"] = t, (BASE_PAGE + np.asarray(page)) << PAGE_SHIFT, access, gpu, 42
    out["batch_id"] = t   # faults at one time were fetched in one batch
    return out


def kernel_pages(w, i: int) -> list[int]:
    k = w.kernels[i]
    return (w.acc_page[k["acc_lo"]:k["acc_hi"]] - BASE_PAGE).tolist()


def kernel_writes(w, i: int) -> list[bool]:
    k = w.kernels[i]
    return w.acc_write[k["acc_lo"]:k["acc_hi"]].tolist()


# -- scripted traces ------------------------------------------------------------------------

def test_access_trace(tmp_path: Path) -> None:
    acc = empty(Kind.ACCESS, 7)
    # seq 2 listed first in the file: kernels still follow seq order, accesses file order.
    acc["seq"] = [2, 0, 0, 1, 0, 2, 1]
    acc["addr"] = (BASE_PAGE + np.array([9, 1, 2, 5, 1, 8, 6])) << PAGE_SHIFT
    acc["access"] = [Access.READ, Access.READ, Access.WRITE, Access.ATOMIC, Access.READ, Access.WRITE, Access.READ]
    acc["t_ns"] = [300, 100, 110, 220, 120, 310, 230]
    acc["gpu"], acc["pid"] = 0, 5
    lau = launches([100, 300, 500], t_end=[150, 400, 0], seq=[0, 2, 3], name_id=[0, 1, 0])  # seq 1 unlaunched
    t = make(tmp_path / "s.parquet", {Kind.ACCESS: acc, Kind.LAUNCH: lau}, names=["fwd", "bwd"],
             meta={"scenario": "scripted", "params": {"layers": 3}})
    w = workload_from_trace(t, gpu_mem=64 * MiB)
    w.validate()
    ks = w.kernels
    assert len(ks) == 4  # seq 0, 1 (no launch), 2, and 3 (launched, no accesses)
    assert [w.names[i] for i in ks["name_id"]] == ["fwd", NO_LAUNCH_RECORD, "bwd", "fwd"]
    assert kernel_pages(w, 0) == [1, 2, 1] and kernel_writes(w, 0) == [False, True, False]
    assert kernel_pages(w, 1) == [5, 6] and kernel_writes(w, 1) == [True, False]
    assert kernel_pages(w, 2) == [9, 8] and kernel_pages(w, 3) == []
    assert ks["atomics"].tolist() == [False, True, False, False]
    assert ks["exec_hash"][0] == 1000 and ks["exec_hash"][2] == 1001
    assert ks["exec_hash"][1] == exec_hash(NO_LAUNCH_RECORD, (1,))
    assert ks["pid"].tolist() == [42, 5, 42, 42]
    # recorded durations, else the gap to the next launch (the trace end for the last)
    assert ks["compute_ns"].tolist() == [50, 0, 100, 0]
    assert tuple(ks["grid"][0]) == (4, 2, 1)
    assert w.name == "scripted" and w.params == {"layers": 3}
    assert w.meta["source"] == str(tmp_path / "s.parquet") and w.meta["derived_from"] == "access events"


# -- recorded traces ------------------------------------------------------------------------

def test_fault_trace_kernels_and_pages(tmp_path: Path) -> None:
    lau = np.concatenate([launches([1000, 2000, 5000], gpu=0, t_end=[1500, 0, 0]),
                          launches([1500], gpu=1, name_id=[7], seq=[3])])  # name_id 7: unknown name
    f = np.concatenate([
        faults([500, 600], [100, 101]),                                  # before GPU 0's first launch
        faults([1100, 1200, 1300, 1250], [3, 1, 3, 2], access=[Access.READ, Access.READ, Access.WRITE, Access.ATOMIC]),
        faults([2100, 2200], [1, 1]),
        faults([1600, 1700], [50, 51], gpu=1),
        faults([1400], [60], gpu=1),                                     # before GPU 1's first launch
    ])
    f = f[np.random.default_rng(0).permutation(len(f))]  # file order must not matter
    t = make(tmp_path / "f.parquet", {Kind.LAUNCH: lau, Kind.FAULT: f}, names=["a", "b", "c"])
    w = workload_from_trace(t, gpu_mem=64 * MiB)
    w.validate()
    ks = w.kernels
    names = [w.names[i] for i in ks["name_id"]]
    assert names == [BEFORE_FIRST_LAUNCH, "a", BEFORE_FIRST_LAUNCH, "func 0xbeef", "b", "c"]
    assert ks["gpu"].tolist() == [0, 0, 1, 1, 0, 0]
    assert w.n_gpus == 2 and w.gpu_mem == [64 * MiB] * 2
    assert kernel_pages(w, 0) == [100, 101]
    # first occurrence in time order; page 3 read then written -> one written access
    assert kernel_pages(w, 1) == [3, 1, 2] and kernel_writes(w, 1) == [True, False, True]
    assert kernel_pages(w, 2) == [60] and kernel_pages(w, 3) == [50, 51]
    assert kernel_pages(w, 4) == [1] and kernel_pages(w, 5) == []
    assert ks["atomics"].tolist() == [False, True, False, False, False, False]
    # recorded 500; else the gap to the next launch on the same GPU, the last one up to the
    # trace's end (5000, the last event): GPU 1's only launch runs 1500 -> 5000
    assert ks["compute_ns"][[1, 4, 5, 3]].tolist() == [500, 3000, 0, 3500]
    # synthetic kernels run until their GPU's first launch (500 -> 1000, 1400 -> 1500): that
    # time passed in the recorded run (copies, host work, a kernel launched before recording)
    assert ks["compute_ns"][[0, 2]].tolist() == [500, 100]
    assert w.meta["derived_from"] == "fault events"


def test_inferred_compute_is_capped(tmp_path: Path) -> None:
    lau = launches([0, 5_000_000_000])
    t = make(tmp_path / "c.parquet", {Kind.LAUNCH: lau, Kind.FAULT: faults([10], [0])})
    assert workload_from_trace(t, gpu_mem=BLOCK_SIZE).kernels["compute_ns"][0] == MAX_INFERRED_COMPUTE_NS


def test_inferred_allocations_are_block_runs(tmp_path: Path) -> None:
    ppb = BLOCK_SIZE // PAGE_SIZE
    pages = [0, 5, ppb + 3, 3 * ppb + 1, 3 * ppb + 2]  # blocks 0, 1, 3
    t = make(tmp_path / "a.parquet", {Kind.LAUNCH: launches([0]), Kind.FAULT: faults([1, 2, 3, 4, 5], pages)})
    w = workload_from_trace(t, gpu_mem=BLOCK_SIZE)
    a = w.allocations
    assert (a["addr"] - BASE).tolist() == [0, 3 * BLOCK_SIZE]
    assert a["bytes"].tolist() == [2 * BLOCK_SIZE, BLOCK_SIZE]
    assert a["managed"].all() and (a["init"] == Init.HOST).all() and a["alloc_id"].tolist() == [0, 1]
    assert a["pid"].tolist() == [42, 42]


def test_recorded_allocations_mem_ops_and_copies(tmp_path: Path) -> None:
    alloc = empty(Kind.ALLOC, 4)
    alloc["t_ns"] = [10, 20, 1500, 3500]
    alloc["op"] = [AllocOp.ALLOC, AllocOp.ALLOC, AllocOp.FREE, AllocOp.BLOCK_INACTIVE]
    alloc["addr"] = [BASE, BASE + 4 * MiB, BASE, BASE + 4 * MiB + PAGE_SIZE]
    alloc["bytes"] = [4 * MiB, 4 * MiB, 4 * MiB, PAGE_SIZE]
    alloc["alloc_id"] = [10, 11, 10, -1]  # the last is found by its address
    alloc["managed"] = True
    copy = empty(Kind.COPY, 1)
    copy["t_ns"], copy["kind"], copy["bytes"], copy["src_addr"], copy["dst_addr"] = 2500, CopyKind.D2H, 4096, 1, 2
    lau = launches([1000, 2000, 3000])
    page_beyond = (8 * MiB) // PAGE_SIZE + 2  # outside both allocations
    f = faults([1100, 2100, 2200], [1, 1025, page_beyond])
    t = make(tmp_path / "r.parquet", {Kind.LAUNCH: lau, Kind.FAULT: f, Kind.ALLOC: alloc, Kind.COPY: copy})
    w = workload_from_trace(t, gpu_mem=BLOCK_SIZE * 8)
    w.validate()
    a = w.allocations
    assert a["alloc_id"].tolist() == [10, 11, 12]
    assert (a["addr"] - BASE).tolist() == [0, 4 * MiB, page_beyond * PAGE_SIZE]
    assert a["bytes"].tolist() == [4 * MiB, 4 * MiB, PAGE_SIZE]  # uncovered pages: page-granular
    types = w.ops["type"].tolist()
    assert types == [OpType.MEM, OpType.MEM, OpType.KERNEL, OpType.MEM, OpType.KERNEL, OpType.COPY,
                     OpType.KERNEL, OpType.MEM]
    mem = w.ops[w.ops["type"] == OpType.MEM]
    assert mem["mem_op"].tolist() == [AllocOp.ALLOC, AllocOp.ALLOC, AllocOp.FREE, AllocOp.BLOCK_INACTIVE]
    assert mem["alloc_id"].tolist() == [10, 11, 10, 11]
    c = w.ops[w.ops["type"] == OpType.COPY][0]
    assert (c["copy_kind"], c["bytes"], c["addr"], c["dst_addr"]) == (CopyKind.D2H, 4096, 1, 2)


def test_capacity_sources(tmp_path: Path) -> None:
    ppb = BLOCK_SIZE // PAGE_SIZE
    arrays = {Kind.LAUNCH: launches([0]), Kind.FAULT: faults(np.arange(4), [0, 1, ppb, 5 * ppb])}  # 3 blocks
    t = make(tmp_path / "n.parquet", arrays, meta={"gpu": "none"})  # as recorded on a host without a GPU
    with pytest.raises(TraceError) as exc:
        workload_from_trace(t)
    assert "pass --gpu-mem or --oversub" in str(exc.value) and str(tmp_path / "n.parquet") in str(exc.value)
    assert workload_from_trace(t, oversub=1.0).gpu_mem == [3 * BLOCK_SIZE]
    assert workload_from_trace(t, oversub=1.5).gpu_mem == [2 * BLOCK_SIZE]
    assert workload_from_trace(t, oversub=100).gpu_mem == [BLOCK_SIZE]
    assert workload_from_trace(t, gpu_mem=123 * MiB, oversub=2).gpu_mem == [123 * MiB]
    with pytest.raises(UmctlError, match="positive"):
        workload_from_trace(t, oversub=0)
    with pytest.raises(UmctlError, match="positive"):
        workload_from_trace(t, gpu_mem=-1)
    assert workload_from_trace(make(tmp_path / "m.parquet", arrays, meta={"gpu_mem": 8 * MiB})).gpu_mem == [8 * MiB]
    assert workload_from_trace(make(tmp_path / "p.parquet", arrays, meta={"params": {"gpu_mem": "16MiB"}})).gpu_mem == [16 * MiB]
    host = {"gpu": [{"index": 0, "name": "H100", "memory_bytes": 80 * MiB}]}
    assert workload_from_trace(make(tmp_path / "h.parquet", arrays, meta=host)).gpu_mem == [80 * MiB]


def test_nothing_to_replay(tmp_path: Path) -> None:
    t = make(tmp_path / "e.parquet", {Kind.LAUNCH: launches([0])})
    with pytest.raises(TraceError, match="nothing to replay"):
        workload_from_trace(t, gpu_mem=BLOCK_SIZE)


def test_many_faults_is_fast(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    n = 500_000
    f = faults(np.sort(rng.integers(0, 10**9, n)), rng.integers(0, 1 << 18, n),
               access=rng.integers(0, 3, n))
    t = make(tmp_path / "big.parquet", {Kind.LAUNCH: launches(np.arange(0, 10**9, 10**6)), Kind.FAULT: f})
    start = time.perf_counter()
    w = workload_from_trace(t, oversub=1.5)
    assert time.perf_counter() - start < 5
    w.validate()
    assert len(w.kernels) == 1000
    assert len(w.acc_page) == len(np.unique(np.stack([np.searchsorted(np.arange(0, 10**9, 10**6), f["t_ns"], "right"),
                                                      f["addr"].astype(np.int64)]), axis=1)[0])


def test_recorded_fault_stalls_are_taken_out_of_kernel_time(tmp_path):
    """A recorded kernel's duration includes its fault batches; the replay models those
    itself, so compute is the duration less the batches serviced during the kernel."""
    import numpy as np

    from umctl.events.schema import DTYPES, EventBatch, Kind
    from umctl.events.trace import TraceWriter, read_trace
    from umctl.workload.tracefile import workload_from_trace

    la = np.zeros(2, DTYPES[Kind.LAUNCH])
    la["t_ns"] = [1_000_000, 11_000_000]
    la["exec_hash"] = [1, 2]
    la["seq"] = [0, 1]
    f = np.zeros(3, DTYPES[Kind.FAULT])
    f["t_ns"] = [2_000_000, 3_000_000, 12_000_000]
    f["addr"] = [0x7F0000000000, 0x7F0000001000, 0x7F0000200000]
    f["batch_id"] = [1, 2, 3]
    rp = np.zeros(3, DTYPES[Kind.REPLAY])
    rp["t_start_ns"] = [2_000_000, 3_000_000, 12_000_000]
    rp["t_ns"] = [2_500_000, 4_000_000, 12_250_000]
    rp["batch_id"] = [1, 2, 3]
    b = EventBatch(arrays={Kind.LAUNCH: la, Kind.FAULT: f, Kind.REPLAY: rp})
    path = tmp_path / "t.parquet"
    with TraceWriter(path, {"gpu_mem": 64 << 20}) as tw:
        tw.write(b)
    w = workload_from_trace(read_trace(path))
    k = w.kernels
    # first kernel: 10 ms until the next launch, 1.5 ms of it servicing two batches
    assert int(k["compute_ns"][0]) == 10_000_000 - 1_500_000
    assert int(k["compute_ns"][1]) == 1_250_000 - 250_000  # ends with the trace: last event at 12.25 ms


def cpu_faults(t, page, pid=42) -> np.ndarray:
    out = empty(Kind.CPU_FAULT, len(t))
    out["t_ns"], out["addr"], out["pid"], out["access"] = t, (BASE_PAGE + np.asarray(page)) << PAGE_SHIFT, pid, Access.WRITE
    return out


def test_host_writes_between_launches_become_host_ops(tmp_path: Path) -> None:
    """A loop whose host rewrites its input between steps: each step's kernel faults the
    input back. CPU faults between two launches become SYNC, HOST_WRITE of their distinct
    pages, then HOST until the next launch; the kernel before them ends at the burst."""
    from umctl.controller.none import NoneController
    from umctl.sim.engine import simulate
    from umctl.workload.workload import OpType

    ms = 1_000_000
    la = launches([0, 10 * ms, 20 * ms])
    f = faults([ms, 2 * ms, 11 * ms, 12 * ms, 21 * ms, 22 * ms], [0, 1, 0, 1, 0, 1])
    cf = cpu_faults([5 * ms, 5 * ms + 10, 5 * ms + 20, 15 * ms, 15 * ms + 10], [0, 1, 0, 0, 1])
    tr = make(tmp_path / "t.parquet", {Kind.LAUNCH: la, Kind.FAULT: f, Kind.CPU_FAULT: cf},
              names=["k0", "k1", "k2"], meta={"gpu_mem": 64 << 20})
    w = workload_from_trace(tr)
    types = w.ops["type"].tolist()
    K, S, HW, H = OpType.KERNEL, OpType.SYNC, OpType.HOST_WRITE, OpType.HOST
    assert types == [K, S, HW, H, K, S, HW, H, K]
    hw = w.ops[w.ops["type"] == HW]
    # faults at pages 0 and 1: the first moves its 64 KiB region, pages 0..15 (see _fill_host_runs)
    assert (w.acc_page[hw["acc_lo"][0]:hw["acc_hi"][0]] - BASE_PAGE).tolist() == list(range(16))
    assert w.acc_write[hw["acc_lo"][0]:hw["acc_hi"][0]].all()
    host = w.ops[w.ops["type"] == H]["compute_ns"].tolist()
    assert host == [10 * ms - (5 * ms + 20), 20 * ms - (15 * ms + 10)]
    assert w.kernels["compute_ns"][0] == 5 * ms       # capped at the burst, not 10 ms
    # the replay faults the input back every step, as the recorded run did
    r = simulate(w, NoneController())
    # the first step's fault on page 0 moves its 64 KiB big page, page 1 with it (the driver's
    # fault granularity); every later step faults the burst's pages back (the 16 the burst
    # moved, in one window; the prefetcher may bring the last of them)
    assert r.kernel_faults.tolist()[:2] == [1, 15] and r.kernel_faults[2] >= 2
    no_host = workload_from_trace(make(tmp_path / "u.parquet", {Kind.LAUNCH: la, Kind.FAULT: f},
                                       names=["k0", "k1", "k2"], meta={"gpu_mem": 64 << 20}))
    assert simulate(no_host, NoneController()).faults == 1   # page 0's big page brings page 1


def test_cpu_fault_runs_cover_what_the_driver_moved():
    """The H100 pattern: a host sweeping a GPU-resident block faults at page offsets 0, 16, 32,
    64, 128, 256 and the driver moves the whole block; a scattered fault moves its 64 KiB region
    (a page inside a region already moved does not fault)."""
    from umctl.workload.tracefile import _fill_host_runs

    blk = 7 << 9
    got = _fill_host_runs(np.array([blk + o for o in (0, 16, 32, 64, 128, 256)], np.int64))
    assert got.tolist() == list(range(blk, blk + 512))
    two = _fill_host_runs(np.array([blk, blk + 4, (blk + 512) + 100], np.int64))
    assert two.tolist() == list(range(blk, blk + 16)) + list(range(blk + 608, blk + 624))


def test_first_kernel_after_a_burst_rereads_the_written_blocks(tmp_path: Path) -> None:
    """Only some pages of a host-written block fault when the GPU reads it back (the driver's
    prefetcher brings the rest); the replay gives the first kernel that faults the block all
    of the burst's pages in it, so it moves the block back as the recorded run did."""
    ms = 1_000_000
    la = launches([0, 10 * ms, 20 * ms])
    f = faults([ms, 11 * ms, 21 * ms], [0, 0, 0])
    cf = cpu_faults([5 * ms + i for i in range(6)], [0, 16, 32, 64, 128, 256])
    w = workload_from_trace(make(tmp_path / "t.parquet", {Kind.LAUNCH: la, Kind.FAULT: f, Kind.CPU_FAULT: cf},
                                 names=["k0", "k1", "k2"], meta={"gpu_mem": 64 << 20}))
    assert len(kernel_pages(w, 0)) == 1 and len(kernel_pages(w, 1)) == 512 and len(kernel_pages(w, 2)) == 1


def test_recorded_batches_become_fault_windows(tmp_path: Path) -> None:
    """Each access carries the rest of the fault batch it was recorded in, cut at kernel ends."""
    la = launches([0, 10_000])
    f = faults([100, 110, 120, 130, 140, 10_100, 10_200], [0, 600, 1200, 5, 7, 9, 10])
    f["batch_id"] = [1, 1, 1, 2, 2, 2, 3]   # batch 2 spans the kernel boundary
    w = workload_from_trace(make(tmp_path / "b.parquet", {Kind.LAUNCH: la, Kind.FAULT: f}, names=["a", "b"]),
                            gpu_mem=64 * MiB)
    assert kernel_pages(w, 0) == [0, 600, 1200, 5, 7] and kernel_pages(w, 1) == [9, 10]
    assert w.acc_win.tolist() == [3, 2, 1, 2, 1, 1, 1]


def test_a_page_faulted_again_after_a_burst_is_not_reread_early(tmp_path: Path) -> None:
    """A burst page that a later kernel faults on before the next burst was evidently not
    brought back by the first kernel: its own recorded fault places it."""
    ms = 1_000_000
    la = launches([0, 10 * ms, 20 * ms])
    f = faults([ms, 11 * ms, 21 * ms], [0, 0, 64])
    cf = cpu_faults([5 * ms + i for i in range(6)], [0, 16, 32, 64, 128, 256])
    w = workload_from_trace(make(tmp_path / "t.parquet", {Kind.LAUNCH: la, Kind.FAULT: f, Kind.CPU_FAULT: cf},
                                 names=["k0", "k1", "k2"], meta={"gpu_mem": 64 << 20}))
    assert 64 not in kernel_pages(w, 1) and kernel_pages(w, 2) == [64]
    assert len(kernel_pages(w, 1)) == 511


def test_peak_managed_bytes_counts_what_is_live_at_once():
    """A loop that frees and allocates again every step allocates many times its footprint in
    all; replay's header (and oversubscription) is about what is live at once."""
    from umctl.workload.workload import ALLOCATION_DTYPE, OP_DTYPE, Workload

    allocs = np.zeros(4, ALLOCATION_DTYPE)
    allocs["alloc_id"] = [0, 1, 2, 3]
    allocs["bytes"] = [100, 10, 10, 7]
    allocs["managed"] = [True, True, True, False]
    ops = np.zeros(5, OP_DTYPE)
    ops["type"] = OpType.MEM
    ops["alloc_id"] = [1, 1, 2, 2, 3]                  # 0: live from the start (no ALLOC op)
    ops["mem_op"] = [AllocOp.ALLOC, AllocOp.FREE, AllocOp.ALLOC, AllocOp.FREE, AllocOp.ALLOC]
    w = Workload("w", ops, np.zeros(0, np.int64), np.zeros(0, bool), allocs, [], gpu_mem=[1 << 30])
    assert w.managed_bytes == 120 and w.peak_managed_bytes == 110


def _migrations(t, page, npages, dst, cause) -> np.ndarray:
    from umctl.events.schema import Cause

    out = empty(Kind.MIGRATION, len(t))
    out["t_ns"], out["t_end_ns"], out["pid"] = t, np.asarray(t) + 50, 42
    out["addr"] = (BASE_PAGE + np.asarray(page)) << PAGE_SHIFT
    out["bytes"] = np.asarray(npages) * PAGE_SIZE
    out["dst"], out["src"], out["cause"] = dst, -1, [Cause[c] for c in cause]
    return out


@pytest.mark.parametrize("complete", [True, False])
def test_complete_access_recordings_count_what_migrated_onto_the_gpu(tmp_path: Path, complete) -> None:
    """umctl run --complete-accesses: each kernel starts with nothing on the GPU, so the pages
    the driver moved onto it while the kernel ran (its faults, and the rest of their regions
    the density prefetcher brought) are the kernel's accesses; the eviction home after it
    (to the CPU) and moves outside any kernel are not. A trace recorded without the switch
    keeps the faulted pages only."""
    lau = launches([1000, 2000], t_end=[1900, 2900])
    f = np.concatenate([faults([1100], [0], access=Access.WRITE), faults([2100], [40])])
    mig = np.concatenate([
        _migrations([1110], [0], [16], 0, ["DEMAND"]),                      # the faulted page's 64 KiB
        _migrations([1120], [16], [16], 0, ["DRIVER_PREFETCH"]),            # the prefetcher's next region
        _migrations([1950], [0], [32], -1, ["USER"]),                       # the eviction home
        _migrations([2110], [40], [1], 0, ["DEMAND"]),
    ])
    meta = {"runtime": {"managed": True, "hum": False, "complete_accesses": complete}}
    t = make(tmp_path / "c.parquet", {Kind.LAUNCH: lau, Kind.FAULT: f, Kind.MIGRATION: mig}, names=["a", "b"], meta=meta)
    w = workload_from_trace(t, gpu_mem=64 * MiB)
    w.validate()
    if complete:
        assert kernel_pages(w, 0) == list(range(32)) and kernel_writes(w, 0) == [True] + [False] * 31
        assert kernel_pages(w, 1) == [40]
        assert w.meta["derived_from"] == "fault and migration events"
    else:
        assert kernel_pages(w, 0) == [0] and kernel_pages(w, 1) == [40]
