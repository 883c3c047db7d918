"""The access stream a replay runs: what a program does, in program order.

A :class:`Workload` is produced by a scenario generator (``umctl.workload.scenario``) or derived
from a trace file (``umctl.workload.tracefile``) and consumed by the simulator. It is columnar:
one structured array of operations (kernels, host work, copies, syncs, allocator events) and
one stream of page accesses that kernels index into by ``[acc_lo, acc_hi)``.

The stream is kept as runs of consecutive pages (:class:`AccessRuns`): generators build it from
tensors, i.e. contiguous page ranges, and at the DeepUM paper's scale a ResNet iteration makes
hundreds of millions of accesses in a few hundred thousand runs, so a flat int64 array per
access (and the simulator's per-access copy of it) would cost gigabytes. ``acc_page`` /
``acc_write`` still give the flat arrays (built on first use) for code that wants them; a
trace file's stream starts flat and is run-length encoded when the simulator asks for runs.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from ..events.schema import AllocOp, CopyKind
from ..units import BLOCK_SIZE, PAGE_SHIFT, PAGE_SIZE


class OpType(enum.IntEnum):
    KERNEL = 0      # GPU kernel on ops.gpu's stream, accessing acc[acc_lo:acc_hi]
    HOST = 1        # host computation for compute_ns
    HOST_WRITE = 2  # host writes pages acc[acc_lo:acc_hi] (takes compute_ns of host time)
    COPY = 3        # explicit copy of `bytes` from addr to dst_addr (copy_kind, is_async)
    SYNC = 4        # host waits for ops.gpu's stream (-1: every GPU)
    MEM = 5         # allocator event (mem_op) on allocation alloc_id
    #: A mode's runtime rewrite (never produced by a scenario): host->device copy of `bytes`
    #: from addr into *managed* dst_addr as chunked UM migrations (umctl/sim/umcopy.py); the
    #: host does not wait and the stream moves on once the copy is initiated.
    UM_COPY = 6
    #: ops.gpu's stream waits until every UM_COPY issued on it so far has arrived.
    STREAM_WAIT = 7


OP_DTYPE = np.dtype([
    ("type", np.uint8), ("gpu", np.int16), ("pid", np.int32), ("exec_hash", np.uint64),
    ("name_id", np.int32), ("compute_ns", np.int64), ("acc_lo", np.int64), ("acc_hi", np.int64),
    ("addr", np.uint64), ("dst_addr", np.uint64), ("bytes", np.uint64), ("copy_kind", np.uint8),
    ("is_async", np.bool_), ("mem_op", np.uint8), ("alloc_id", np.int64), ("iteration", np.int32),
    ("grid", np.uint32, (3,)), ("block", np.uint32, (3,)), ("atomics", np.bool_),
])


class Init(enum.IntEnum):
    UNTOUCHED = 0  # no pages populated yet: first touch zero-fills where it happens
    HOST = 1       # the host wrote it before the run: pages start resident on the CPU


ALLOCATION_DTYPE = np.dtype([
    ("alloc_id", np.int64), ("pid", np.int32), ("addr", np.uint64), ("bytes", np.uint64),
    ("managed", np.bool_), ("init", np.uint8), ("gpu", np.int16), ("name_id", np.int32),
])

#: Where the first allocation of a replayed address space starts (2 MiB aligned, looks like
#: a real CUDA VA so exported traces read naturally).
VA_BASE = 0x7F00_0000_0000


def exec_hash(name: str, args: Sequence | None = None) -> int:
    """DeepUM's execution identity: a stable 64-bit hash of kernel name + launch arguments.
    blake2b rather than hash() so identities are the same in every process and run."""
    h = hashlib.blake2b(digest_size=8)
    h.update(name.encode())
    if args is not None:
        h.update(repr(tuple(args)).encode())
    return int.from_bytes(h.digest(), "little")


class AccessRuns:
    """An access stream as runs: run k is pages ``page[k] .. page[k] + length[k] - 1``, in
    order, all reads or all writes (``write[k]``); it holds stream positions
    ``pos[k] .. pos[k + 1] - 1``. Runs are never empty."""

    __slots__ = ("page", "length", "write", "pos")

    def __init__(self, page: np.ndarray, length: np.ndarray, write: np.ndarray):
        self.page = np.ascontiguousarray(page, dtype=np.int64)
        self.length = np.ascontiguousarray(length, dtype=np.int64)
        self.write = np.ascontiguousarray(write, dtype=np.bool_)
        if not len(self.page) == len(self.length) == len(self.write):
            raise ValueError("run arrays differ in length")
        if len(self.length) and self.length.min() < 1:
            raise ValueError("an access run is empty")
        self.pos = np.zeros(len(self.page) + 1, np.int64)
        np.cumsum(self.length, out=self.pos[1:])

    def __len__(self) -> int:
        return len(self.page)

    @property
    def n_accesses(self) -> int:
        return int(self.pos[-1])

    @classmethod
    def from_flat(cls, pages: np.ndarray, writes: np.ndarray) -> "AccessRuns":
        """Run-length encode a flat stream: a run ends where the next page is not the next
        page number or the access kind changes."""
        pages = np.asarray(pages, dtype=np.int64)
        writes = np.asarray(writes, dtype=np.bool_)
        return cls._encode(pages, writes, (np.diff(pages) != 1) | (writes[1:] != writes[:-1]))

    @classmethod
    def of_pages(cls, pages: np.ndarray, write: bool) -> "AccessRuns":
        """Runs of one page array accessed one way (a tensor read or written by a kernel)."""
        pages = np.asarray(pages, dtype=np.int64)
        return cls._encode(pages, np.full(min(len(pages), 1), write), np.diff(pages) != 1)

    @classmethod
    def _encode(cls, pages: np.ndarray, writes: np.ndarray, breaks: np.ndarray) -> "AccessRuns":
        """Runs starting at 0 and after every true entry of ``breaks`` (between accesses i and
        i + 1); ``writes`` gives the kind at each run start (one entry suffices if uniform)."""
        if len(pages) == 0:
            return cls(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.bool_))
        starts = np.concatenate([[0], np.flatnonzero(breaks) + 1])
        kind = writes[starts] if len(writes) == len(pages) else np.repeat(writes, len(starts))
        return cls(pages[starts], np.diff(starts, append=len(pages)), kind)

    @classmethod
    def concat(cls, parts: Sequence["AccessRuns"]) -> "AccessRuns":
        if not parts:
            return cls.from_flat(np.zeros(0, np.int64), np.zeros(0, np.bool_))
        return cls(np.concatenate([p.page for p in parts]), np.concatenate([p.length for p in parts]),
                   np.concatenate([p.write for p in parts]))

    def expand(self, lo: int = 0, hi: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(pages, writes) of stream positions [lo, hi), flat."""
        hi = self.n_accesses if hi is None else hi
        if hi <= lo:
            return np.zeros(0, np.int64), np.zeros(0, np.bool_)
        r0 = int(np.searchsorted(self.pos, lo, "right")) - 1
        r1 = int(np.searchsorted(self.pos, hi, "left"))
        pos = self.pos[r0:r1 + 1]
        n = np.diff(pos)
        first = self.page[r0:r1] - pos[:-1]          # page of run k at position q: first[k] + q
        q = np.arange(pos[0], pos[-1], dtype=np.int64)
        pages = np.repeat(first, n) + q
        writes = np.repeat(self.write[r0:r1], n)
        return pages[lo - pos[0]:hi - pos[0]], writes[lo - pos[0]:hi - pos[0]]

    def cut_at(self, positions: np.ndarray) -> "AccessRuns":
        """The same stream with a run boundary at every stream position in ``positions``
        (e.g. where operations' access ranges start and end, so that no run spans two)."""
        q = np.asarray(positions, dtype=np.int64)
        q = q[(q > 0) & (q < self.n_accesses)]
        if len(q) == 0:
            return self
        starts = np.union1d(self.pos[:-1], q)
        if len(starts) == len(self.page):
            return self
        r = np.searchsorted(self.pos, starts, "right") - 1
        return AccessRuns(self.page[r] + (starts - self.pos[r]), np.diff(starts, append=self.n_accesses),
                          self.write[r])

    def split_blocks(self, shift: int) -> "AccessRuns":
        """The same stream with every run cut where it crosses a multiple of ``1 << shift``
        pages (the simulator's runs each lie in one 2 MiB block)."""
        first_b = self.page >> shift
        last_b = (self.page + self.length - 1) >> shift
        pieces = last_b - first_b + 1
        if len(pieces) == 0 or pieces.max() == 1:
            return self
        run = np.repeat(np.arange(len(self.page)), pieces)
        k = np.arange(len(run)) - np.repeat(np.cumsum(pieces) - pieces, pieces)   # piece index in its run
        start = np.maximum(self.page[run], (first_b[run] + k) << shift)
        end = np.minimum(self.page[run] + self.length[run], (first_b[run] + k + 1) << shift)
        return AccessRuns(start, end - start, self.write[run])


class Workload:
    """A program's behaviour as the simulator replays it.

    The access stream is given either flat (``acc_page``, ``acc_write``) or as ``acc_runs``;
    the other form is derived on first use."""

    def __init__(self, name: str, ops: np.ndarray, acc_page: np.ndarray | None, acc_write: np.ndarray | None,
                 allocations: np.ndarray, names: list[str], n_gpus: int = 1, gpu_mem: list[int] | None = None,
                 params: dict | None = None, meta: dict | None = None, thread_blocks: dict | None = None,
                 acc_win: np.ndarray | None = None, *, acc_runs: AccessRuns | None = None):
        if acc_runs is None and (acc_page is None or acc_write is None):
            raise ValueError("a workload needs its access stream (flat arrays or runs)")
        self.name = name
        self.ops = ops
        self._acc_page = acc_page
        self._acc_write = acc_write
        self._acc_runs = acc_runs
        self.allocations = allocations
        self.names = names
        self.n_gpus = n_gpus
        self.gpu_mem = list(gpu_mem) if gpu_mem is not None else []
        self.params = params if params is not None else {}
        self.meta = meta if meta is not None else {}
        #: per kernel (index into ``ops``): its thread blocks and their static access ranges
        #: (``threadblocks.KernelBlocks``), for grid-partitioning modes; empty when unknown
        self.thread_blocks = thread_blocks if thread_blocks is not None else {}
        #: per access, how many accesses from it to the end of the fault batch it was recorded in
        #: (0: not recorded). A recorded trace knows which pages the GPU faulted on together, which
        #: depends on the program's parallelism; the simulator then forms its batches from those
        #: groups instead of the calibrated fault window. None: no access was recorded so.
        self.acc_win = acc_win

    def __repr__(self) -> str:
        return (f"Workload({self.name!r}, {len(self.ops)} ops, {self.n_accesses} accesses, "
                f"{self.n_gpus} GPU(s))")

    @property
    def acc_page(self) -> np.ndarray:
        """Page of every access, flat (built from the runs on first use)."""
        if self._acc_page is None:
            self._acc_page, self._acc_write = self._acc_runs.expand()
        return self._acc_page

    @acc_page.setter
    def acc_page(self, pages: np.ndarray) -> None:
        self.acc_write  # the other half of the flat stream, before the runs go
        self._acc_page, self._acc_runs = pages, None

    @property
    def acc_write(self) -> np.ndarray:
        """Whether each access writes, flat (built from the runs on first use)."""
        if self._acc_write is None:
            self._acc_page, self._acc_write = self._acc_runs.expand()
        return self._acc_write

    @acc_write.setter
    def acc_write(self, writes: np.ndarray) -> None:
        self.acc_page
        self._acc_write, self._acc_runs = writes, None

    @property
    def acc_runs(self) -> AccessRuns:
        """The access stream as runs of consecutive pages (encoded on first use)."""
        if self._acc_runs is None:
            self._acc_runs = AccessRuns.from_flat(self._acc_page, self._acc_write)
        return self._acc_runs

    @property
    def kernels(self) -> np.ndarray:
        return self.ops[self.ops["type"] == OpType.KERNEL]

    @property
    def n_accesses(self) -> int:
        return len(self._acc_page) if self._acc_page is not None else self._acc_runs.n_accesses

    @property
    def managed_bytes(self) -> int:
        """Every managed allocation the program ever made, summed."""
        a = self.allocations
        return int(a["bytes"][a["managed"]].sum())

    @property
    def peak_managed_bytes(self) -> int:
        """Managed memory live at once, at most: what oversubscription is about. A program that
        frees and allocates again every step (a PyTorch loop under the runtime) allocates many
        times its footprint in all; allocations without an ALLOC op are live from the start."""
        a = self.allocations[self.allocations["managed"]]
        size = dict(zip(a["alloc_id"].tolist(), a["bytes"].tolist()))
        mem = self.ops[self.ops["type"] == OpType.MEM]
        later = set(mem["alloc_id"][mem["mem_op"] == AllocOp.ALLOC].tolist())
        live_ids = {i for i in size if i not in later}
        live = peak = sum(size[i] for i in live_ids)
        for op, i in zip(mem["mem_op"].tolist(), mem["alloc_id"].tolist()):
            if i not in size:
                continue
            if op == AllocOp.ALLOC and i not in live_ids:
                live_ids.add(i)
                live += size[i]
                peak = max(peak, live)
            elif op == AllocOp.FREE and i in live_ids:
                live_ids.discard(i)
                live -= size[i]
        return int(peak)

    def validate(self) -> None:
        """Check internal consistency; raises ValueError naming the first problem."""
        ops = self.ops
        if ops.dtype != OP_DTYPE:
            raise ValueError("ops has the wrong dtype")
        if self._acc_page is not None and len(self._acc_page) != len(self._acc_write):
            raise ValueError("acc_page and acc_write differ in length")
        if self.acc_win is not None and len(self.acc_win) != self.n_accesses:
            raise ValueError("acc_win and acc_page differ in length")
        k = ops[(ops["type"] == OpType.KERNEL) | (ops["type"] == OpType.HOST_WRITE)]
        if len(k) and ((k["acc_lo"] < 0).any() or (k["acc_hi"] > self.n_accesses).any()
                       or (k["acc_hi"] < k["acc_lo"]).any()):
            raise ValueError("an operation's access range is outside the access stream")
        if self.n_gpus < 1 or len(self.gpu_mem) != self.n_gpus:
            raise ValueError("gpu_mem must give one capacity per GPU")
        # -1 is "no GPU" (host work, allocator events from a trace) or "every GPU" (a SYNC); a
        # kernel runs on one of the workload's GPUs (the simulator indexes its state by it)
        if (ops["gpu"] >= self.n_gpus).any() or (ops["gpu"] < np.where(ops["type"] == OpType.KERNEL, 0, -1)).any():
            raise ValueError("an operation names a GPU the workload does not have")
        known = np.array([int(t) for t in OpType])
        if len(ops) and not np.isin(ops["type"], known).all():
            raise ValueError(f"an operation has an unknown type ({int(ops['type'][~np.isin(ops['type'], known)][0])})")
        mem = ops[ops["type"] == OpType.MEM]
        if len(mem) and not np.isin(mem["mem_op"], np.array([int(m) for m in AllocOp])).all():
            raise ValueError("an allocator event has an unknown operation")
        if self.acc_win is not None and (not isinstance(self.acc_win, np.ndarray)
                                         or not np.issubdtype(self.acc_win.dtype, np.integer)):
            raise ValueError("acc_win is not an integer array")


class WorkloadBuilder:
    """Imperative helper for scenario generators: allocate, launch, copy, in program order."""

    def __init__(self, name: str, *, n_gpus: int = 1, gpu_mem: Iterable[int] | int = 0):
        self.name = name
        self.n_gpus = n_gpus
        self.gpu_mem = [int(gpu_mem)] * n_gpus if isinstance(gpu_mem, (int, np.integer)) else [int(x) for x in gpu_mem]
        self._ops: list[tuple] = []
        self._acc_runs: list[AccessRuns] = []
        self._n_acc = 0
        self._allocs: list[tuple] = []
        self._names: dict[str, int] = {}
        self._next_addr = VA_BASE
        self.iteration = 0
        self._thread_blocks: dict = {}

    # -- names and allocations -------------------------------------------------------------
    def name_id(self, name: str) -> int:
        if name not in self._names:
            self._names[name] = len(self._names)
        return self._names[name]

    def alloc(self, name: str, nbytes: int, *, init: Init = Init.UNTOUCHED, managed: bool = True,
              pid: int = 0, gpu: int = 0, emit: bool = False) -> "Buffer":
        """Reserve a 2 MiB-aligned range (as cudaMallocManaged does for large sizes)."""
        nbytes = max(int(nbytes), PAGE_SIZE)
        nbytes = (nbytes + PAGE_SIZE - 1) // PAGE_SIZE * PAGE_SIZE
        aid = len(self._allocs)
        addr = self._next_addr
        self._next_addr += (nbytes + BLOCK_SIZE - 1) // BLOCK_SIZE * BLOCK_SIZE
        self._allocs.append((aid, pid, addr, nbytes, managed, int(init), gpu, self.name_id(name)))
        buf = Buffer(aid, addr, nbytes, name, pid)
        if emit:
            self.mem(AllocOp.ALLOC, buf)
        return buf

    # -- operations ------------------------------------------------------------------------
    def _op(self, type_: OpType, **kw) -> None:
        rec = dict(type=int(type_), gpu=0, pid=0, exec_hash=0, name_id=-1, compute_ns=0, acc_lo=0,
                   acc_hi=0, addr=0, dst_addr=0, bytes=0, copy_kind=0, is_async=False, mem_op=0,
                   alloc_id=-1, iteration=self.iteration, grid=(1, 1, 1), block=(1, 1, 1), atomics=False)
        rec.update(kw)
        self._ops.append(tuple(rec[n] for n in OP_DTYPE.names))

    def _accesses(self, parts: Sequence[tuple[np.ndarray | range, bool]]) -> tuple[int, int]:
        """Append parts (page array or ``range`` of pages, is_write) to the stream. A range
        (a tensor, ``Buffer.page_range``) becomes one run without its pages ever being listed:
        at the papers' scale a model's tensors are tens of millions of pages."""
        lo = self._n_acc
        for pages, write in parts:
            if isinstance(pages, range) and pages.step == 1:
                if len(pages):
                    self._acc_runs.append(AccessRuns(np.array([pages.start], np.int64), np.array([len(pages)], np.int64),
                                                     np.array([bool(write)])))
                    self._n_acc += len(pages)
                continue
            pages = np.asarray(pages, dtype=np.int64)
            if len(pages):
                self._acc_runs.append(AccessRuns.of_pages(pages, bool(write)))
                self._n_acc += len(pages)
        return lo, self._n_acc

    def kernel(self, name: str, *, reads: Sequence = (), writes: Sequence = (), compute_ns: int = 0,
               gpu: int = 0, pid: int = 0, args: Sequence | None = None, grid=(1, 1, 1),
               block=(128, 1, 1), atomics: bool = False, pages: Sequence[tuple[np.ndarray, bool]] = (),
               thread_blocks=None) -> None:
        """Launch a kernel. ``reads``/``writes`` are Buffers or Buffer slices (touched in
        order, each page once); ``pages`` gives explicit (page array, is_write) parts;
        ``thread_blocks`` (a ``threadblocks.KernelBlocks``) says which of them each thread
        block makes."""
        parts = [(r.page_range(), False) for r in reads] + [(w.page_range(), True) for w in writes] + list(pages)
        lo, hi = self._accesses(parts)
        if thread_blocks is not None:
            if int(thread_blocks.tb_off[-1]) != hi - lo:
                raise ValueError("thread-block offsets do not cover the kernel's accesses")
            self._thread_blocks[len(self._ops)] = thread_blocks
        self._op(OpType.KERNEL, gpu=gpu, pid=pid, exec_hash=exec_hash(name, args), name_id=self.name_id(name),
                 compute_ns=int(compute_ns), acc_lo=lo, acc_hi=hi, grid=tuple(grid), block=tuple(block),
                 atomics=atomics)

    def host(self, duration_ns: int, pid: int = 0) -> None:
        self._op(OpType.HOST, compute_ns=int(duration_ns), pid=pid)

    def host_write(self, buf: "Buffer", duration_ns: int = 0, pid: int = 0) -> None:
        lo, hi = self._accesses([(buf.page_range(), True)])
        self._op(OpType.HOST_WRITE, compute_ns=int(duration_ns), acc_lo=lo, acc_hi=hi, pid=pid,
                 addr=buf.addr, bytes=buf.nbytes, alloc_id=buf.alloc_id)

    def copy(self, src: "Buffer", dst: "Buffer", *, kind: CopyKind = CopyKind.H2D, is_async: bool = False,
             gpu: int = 0, pid: int = 0) -> None:
        n = min(src.nbytes, dst.nbytes)
        self._op(OpType.COPY, gpu=gpu, pid=pid, addr=src.addr, dst_addr=dst.addr, bytes=n,
                 copy_kind=int(kind), is_async=is_async)

    def sync(self, gpu: int = -1, pid: int = 0) -> None:
        self._op(OpType.SYNC, gpu=gpu, pid=pid)

    def mem(self, op: AllocOp, buf: "Buffer") -> None:
        self._op(OpType.MEM, pid=buf.pid, mem_op=int(op), addr=buf.addr, bytes=buf.nbytes, alloc_id=buf.alloc_id)

    def build(self, params: dict | None = None, meta: dict | None = None) -> Workload:
        ops = np.array(self._ops, dtype=OP_DTYPE) if self._ops else np.zeros(0, OP_DTYPE)
        runs = AccessRuns.concat(self._acc_runs)
        allocs = np.array(self._allocs, dtype=ALLOCATION_DTYPE) if self._allocs else np.zeros(0, ALLOCATION_DTYPE)
        names = [None] * len(self._names)
        for n, i in self._names.items():
            names[i] = n
        w = Workload(self.name, ops, None, None, allocs, names, self.n_gpus, list(self.gpu_mem),
                     dict(params or {}), dict(meta or {}), dict(self._thread_blocks), acc_runs=runs)
        w.validate()
        return w


@dataclass(frozen=True)
class Buffer:
    """A byte range of an allocation; slicing gives sub-ranges (e.g. one layer's rows)."""

    alloc_id: int
    addr: int
    nbytes: int
    name: str = ""
    pid: int = 0

    def pages(self) -> np.ndarray:
        return np.arange(self.page_range().start, self.page_range().stop, dtype=np.int64)

    def page_range(self) -> range:
        """The buffer's pages as a range (nothing listed: a full-size tensor has millions)."""
        first = self.addr >> PAGE_SHIFT
        return range(first, first + (self.nbytes + PAGE_SIZE - 1) // PAGE_SIZE)

    def slice(self, offset: int, nbytes: int) -> "Buffer":
        offset = max(0, min(int(offset), self.nbytes))
        nbytes = max(0, min(int(nbytes), self.nbytes - offset))
        return Buffer(self.alloc_id, self.addr + offset, nbytes, self.name, self.pid)

    def split(self, parts: int) -> list["Buffer"]:
        """Split into ``parts`` page-aligned pieces (the last takes the remainder)."""
        pages = (self.nbytes + PAGE_SIZE - 1) // PAGE_SIZE
        step = max(1, pages // parts)
        out = []
        for i in range(parts):
            lo = i * step
            hi = pages if i == parts - 1 else min(pages, (i + 1) * step)
            out.append(self.slice(lo * PAGE_SIZE, (hi - lo) * PAGE_SIZE))
        return out
