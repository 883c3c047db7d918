"""Mode ``hum``: HUM (PPoPP'20 §4; thesis ch. 4) — host-to-device copies overlapped with host
and kernel computation through Unified Memory, without changing the program.

HUM is a runtime (CUDA API wrappers, here ``prepare``) plus a driver. Its policy, as the paper
states it:
  * every ``cudaMemcpy``/``cudaMemcpyAsync`` host->device copy into ``cudaMalloc``'d memory
    becomes a non-blocking copy into managed memory: 2 MiB chunks staged by 8 threads and
    migrated by the page-migration thread, one page-migration queue per copy, served
    round-robin (§4.4-4.6);
  * a kernel K may start as early as the three conditions of §4.6 allow (:func:`may_start_early`);
    otherwise the stream keeps its ordinary order and K waits for the copy to finish;
  * consecutive copies are migrated together only if their destinations do not overlap (§4.6:
    "there must not exist any dependence between destination locations");
  * a GPU access to a page not yet copied faults and waits for the page (§4.3), and a host
    write to a source page not yet copied waits for it (mprotect, §4.2): both are what the
    simulator's chunked copy does (``umctl/sim/umcopy.py``), so results equal plain CUDA's.

``hum-no-sched`` is the paper's HUM-no-sched ablation (§5.2, Fig. 8(b)): no copy scheduling, so
a copy is initiated only after the previous one completed.

The rewrite is expressed in the program (``OpType.UM_COPY``, ``OpType.STREAM_WAIT``) so that the
same decisions drive the simulator here and the LD_PRELOAD runtime on the live path.
"""

from __future__ import annotations

import numpy as np

from ..events.schema import CopyKind
from ..workload.workload import OpType, Workload
from ..units import PAGE_SHIFT
from .base import Controller, register

#: operations that are commands of a GPU stream (host-only operations are not)
STREAM_OPS = (OpType.KERNEL, OpType.COPY, OpType.UM_COPY)


def _alloc_index(allocations: np.ndarray, addr: int) -> int:
    a = allocations
    hit = np.nonzero((a["addr"] <= addr) & (addr < a["addr"] + a["bytes"]))[0]
    return int(hit[0]) if len(hit) else -1


def hum_copies(workload: Workload) -> np.ndarray:
    """Indices of the operations HUM takes over: host->device copies from host memory into a
    ``cudaMalloc``'d device buffer (copies into managed memory or between devices stay as they are)."""
    ops, a = workload.ops, workload.allocations
    idx = np.nonzero((ops["type"] == OpType.COPY) & (ops["copy_kind"] == CopyKind.H2D))[0]
    out = []
    for i in idx.tolist():
        s, d = _alloc_index(a, int(ops["addr"][i])), _alloc_index(a, int(ops["dst_addr"][i]))
        if s < 0 or d < 0 or a["managed"][s] or a["managed"][d] or a["gpu"][d] < 0:
            continue
        out.append(i)
    return np.array(out, np.int64)


def depends_on(kernel_op, copy_op, workload: Workload) -> bool:
    """Condition 1's dependence: K's arguments (the buffers it touches) include C's destination
    buffer. The live runtime compares pointer arguments with the copy's destination allocation;
    a replay knows the pages a kernel touches, which is the same test at allocation grain."""
    a = workload.allocations
    d = _alloc_index(a, int(copy_op["dst_addr"]))
    if d < 0:
        return False
    lo = int(a["addr"][d]) >> PAGE_SHIFT
    hi = (int(a["addr"][d]) + int(a["bytes"][d]) + (1 << PAGE_SHIFT) - 1) >> PAGE_SHIFT
    pages = workload.acc_page[int(kernel_op["acc_lo"]):int(kernel_op["acc_hi"])]
    return bool(((pages >= lo) & (pages < hi)).any())


def may_start_early(prev_op, kernel_op, workload: Workload, *, initiated: bool = True,
                    unmapped: bool = True) -> bool:
    """HUM §4.6: kernel K may start once all hold: (1) the last command before K in its stream is
    a host->device copy C on which K's arguments depend; (2) C's execution has been initiated;
    (3) every target page of C has been unmapped from the GPU once since C was initiated (so an
    access before the page arrives faults and waits). The chunked copy establishes (2) and (3)
    at initiation; the flags exist for the rule's own tests."""
    if prev_op is None or int(prev_op["type"]) != OpType.UM_COPY:
        return False
    return depends_on(kernel_op, prev_op, workload) and initiated and unmapped


def _ranges_overlap(a_op, b_op) -> bool:
    a0, a1 = int(a_op["dst_addr"]), int(a_op["dst_addr"]) + int(a_op["bytes"])
    b0, b1 = int(b_op["dst_addr"]), int(b_op["dst_addr"]) + int(b_op["bytes"])
    return a0 < b1 and b0 < a1


def rewrite(workload: Workload, *, schedule: bool = True) -> tuple[Workload, dict]:
    """HUM's runtime applied to a program: H2D copies into cudaMalloc'd buffers become UM_COPY
    (their destinations managed memory), and a STREAM_WAIT goes before every stream command
    that may not overlap the copy before it. Returns the new workload and counts."""
    ops = workload.ops.copy()
    allocs = workload.allocations.copy()
    idx = hum_copies(workload)
    for i in idx.tolist():
        d = _alloc_index(allocs, int(ops["dst_addr"][i]))
        allocs["managed"][d] = True
        allocs["init"][d] = 0   # untouched: the copy fills it
        ops["type"][i] = OpType.UM_COPY
    waits: list[int] = []
    early = 0
    last: dict[int, int] = {}   # per GPU stream: index of its last command
    for i in range(len(ops)):
        t = int(ops["type"][i])
        if t not in STREAM_OPS:
            continue
        g = max(0, int(ops["gpu"][i]))
        p = last.get(g)
        last[g] = i
        if p is None or int(ops["type"][p]) != OpType.UM_COPY:
            continue
        if t == OpType.KERNEL:
            if may_start_early(ops[p], ops[i], workload):
                early += 1
            else:
                waits.append(i)
        elif t == OpType.UM_COPY:
            if not schedule or _ranges_overlap(ops[p], ops[i]):
                waits.append(i)
        else:   # a plain copy (D2H, D2D) keeps the stream order
            waits.append(i)
    if waits:
        w = np.zeros(len(waits), ops.dtype)
        w["type"] = OpType.STREAM_WAIT
        w["gpu"] = ops["gpu"][waits]
        w["pid"] = ops["pid"][waits]
        w["iteration"] = ops["iteration"][waits]
        w["name_id"] = -1
        w["alloc_id"] = -1
        ops = np.insert(ops, waits, w)
    out = Workload(workload.name, ops, workload.acc_page, workload.acc_write, allocs, list(workload.names),
                   workload.n_gpus, list(workload.gpu_mem), dict(workload.params), dict(workload.meta),
                   acc_win=workload.acc_win)
    out.validate()
    return out, {"copies": int(len(idx)), "early_starts": early, "stream_waits": len(waits)}


@register
class HumController(Controller):
    """HUM: asynchronous chunked copies with round-robin page-migration queues (§4.6)."""

    name = "hum"
    schedule = True
    needs_runtime = True
    runtime_why = "changes how the program copies"
    runtime_copies = True

    def __init__(self, **options):
        super().__init__(**options)
        self._counts: dict = {}

    def applies_to(self, workload) -> str | None:
        if not len(hum_copies(workload)):
            return ("it has no host-to-device copies into cudaMalloc'd memory "
                    "(HUM overlaps explicit cudaMemcpy H2D copies; try a hum-* scenario)")
        return None

    def prepare(self, workload):
        out, self._counts = rewrite(workload, schedule=self.schedule)
        return out

    def stats(self) -> dict:
        return dict(self._counts)


@register
class HumNoSchedController(HumController):
    """HUM-no-sched (§5.2): no copy scheduling; a copy starts after the previous one finished."""

    name = "hum-no-sched"
    schedule = False
