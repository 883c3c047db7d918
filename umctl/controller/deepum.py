"""Mode ``deepum``: DeepUM's correlation prefetching, pre-eviction and invalidation
(Jung et al., ASPLOS'23, §3-§5; thesis ch. 5), driven by umctl's event stream.

Tables (``tables.py``):
  * execution-ID table: kernel name + arguments hash -> execution ID;
  * execution-ID correlation table: per ID, records (three previous IDs -> next ID);
  * one UM-block correlation table per execution ID (NumRows 2048, Assoc 2, NumSuccs 4,
    one level, MRU), with the *start* block (first fault after the execution-ID transition)
    and the *end* block (last fault before the next transition).

Prefetching with chaining (§4.2): on a fault, prefetch the successors of the faulted block
in the current kernel's table and keep walking; at the end block, predict the next kernel
and continue from its start block; stop at a new fault (which restarts the walk) or a failed
prediction; pause once the next ``degree`` kernels are covered and resume when the current
kernel finishes (its successor's launch). Where the walk has nowhere left to go before the
end block, it moves on to the next kernel (a table trained on one iteration always reaches
its end; one trained on a partial iteration may not).

Horizon (``horizon``; not in the paper). ``fit``: the walk covers at most ``degree`` (N = 32)
predicted kernels, and goes on to the next predicted kernel only while the blocks of the
current kernel and of every kernel it covers -- the union of their UM-block tables, which is
what those kernels will touch -- fit in the GPU together, less the fault reserve
(``watermark_blocks``); the first kernel ahead is always walked. The rule: a block prefetched
for kernel k+j is used only after kernels k .. k+j-1 have run; if their blocks and it cannot be
on the GPU at once, something needed before it is evicted to make its room and moved twice, or
it is evicted itself before use. ``fixed``: always N (the paper). ``auto`` (the default): fit
where pre-eviction is off (``deepum-prefetch``), fixed where it is on. Pre-eviction bounds the
walk already: it prefetches no more than it can make room for among blocks the next N kernels
do not expect (§5.1). Without either bound, ``deepum-prefetch`` falls off a cliff where 32
kernels outgrow the GPU: bert-base at 4x moved 13.5 GiB host-to-GPU for a 2 GiB footprint,
prefetch accuracy 34 %, 1.15x slower than ``none``; at 6x 435 GiB, 1.5 %, 14.9x
(docs/evaluation/cliffs.md). ``fit`` with pre-eviction helps a little at fit scale (bert-base 4x)
but costs ``deepum`` on ResNet-152 at the paper's scale (batch 1280, 3 iterations: 201 s per
steady iteration against 121 s, 3.0 TB moved against 1.7 TB; not yet explained).

Pre-eviction (§5.1): before prefetches would need memory the GPU no longer has, evict blocks
that are least recently migrated AND not in the tables of the current and next ``degree``
predicted kernels. Invalidation (§5.2): a victim inside allocator blocks marked inactive is
dropped without write-back.

Deviations from the paper, because umctl runs beside the driver instead of inside it: the
fault queue's priority over the prefetch queue is the driver's (demand traffic pre-empts our
migrations); we see faults in drains rather than per interrupt; "free GPU memory" comes from
the context (the driver's count in replay, the device's free memory or budget live).

Where the paper is silent: once a kernel's table is trained, its first fault is usually a late
prefetch somewhere inside the kernel, not where the kernel starts. Taken literally (the first
fault after the transition is the start block, the last before the next is the end block),
such a fault moves the start and end into the middle of the kernel, the next walk covers only
that stretch, the kernel faults throughout, which restores the pointers, and the iteration
after is good again: DeepUM's faults alternate between iterations (GPT-2 L batch 3 at full
scale: 103 K, 392 K, 175 K, 405 K). With ``trained_ends`` (the default) a fault on a block
DeepUM already has on its way or resident (prefetched, or faulted in, and not evicted since)
leaves the start and end blocks where they are: it is a late prefetch, not news about where
the kernel starts. A fault on a block DeepUM does not hold (the walk missed it) still sets
them, so a wrong start learned early is corrected. (Keeping them for every block the table
knows did as well at full scale but let a wrong start stand for good: ResNet-152 scaled at
``peak_tflops=2`` kept 5-10x more faults.) ``-O deepum.trained_ends=false`` is the literal
reading.

Whole faulted blocks (``whole_fault_blocks``; the paper's fault queue holds UM blocks, so a
faulted block comes whole). Completing a block is a prefetch of the pages the fault did not
name: a bet that they are used while the block stays. DeepUM's other prefetches rest on history,
and with ``adaptive_whole`` (the default) this one does too: only a launch that repeats an
execution ID already run completes its faulted blocks. Why: a repeat is the same kernel on the
same arguments in a program that has shown it loops, and what lies around its data in a block
was used around it before. A launch never run before has no such history. In the first
iteration every launch is one, and nothing yet tells a dense model, whose blocks hold the
tensors the next kernels read, from a mixture of experts, whose blocks hold experts the router
did not choose (mixtral-8x7b at fit scale: about 9 expert matrices per block); once in the loop,
unseen arguments of a known kernel are a routing choice, and the rest of its block is what was
not chosen. Without history DeepUM knows no more about a block than the driver, so it leaves the
block to the driver (what faulted, plus its density prefetcher's share: ``none``) rather than
bet against the baseline. Dense models give up the first iteration's completions, which sped
that iteration up by 7-11 % (worst cells over ``none`` across oversubscription 1.25-4: gpt2-l
under deepum 0.59x -> 0.63x, bert-base under deepum-prefetch 0.72x -> 0.77x). On mixtral-8x7b,
completion in the first iteration sped that iteration up but left the GPU full of experts
nobody touched, which the second iteration paid to write back when it evicted them
(deepum-prefetch at 1.5: 1.11x ``none``, now 1.03x; 968 MiB written back against 664;
docs/evaluation/cliffs.md). Once the program has looped, a kernel none of whose execution IDs
ever repeats keeps completing: live, the runtime's execution ID hashes the launch's argument
bytes, so a kernel given a per-step scalar (a dropout seed, an optimizer's step count) never
repeats one, and its blocks are dense data, not a routing choice. Live, where the runtime does
not name a kernel (name_id -1), the rule stays off.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import islice

import numpy as np

from .. import UmctlError
from ..events.schema import AllocOp, EventBatch, Kind, Op, commands, fault_block_firsts
from ..units import BLOCK_SHIFT, BLOCK_SIZE, CPU, block_range
from .base import Controller, ControllerContext, register
from .tables import ExecCorrelationTable, ExecIdTable, PairCorrelationTable


class BlockTable(PairCorrelationTable):
    """A UM-block correlation table of one execution ID, with its chaining pointers."""

    __slots__ = ("start", "end")

    def __init__(self, num_rows: int, assoc: int, num_succs: int):
        super().__init__(num_rows, assoc, num_succs, num_levels=1)
        self.start: int | None = None
        self.end: int | None = None

    def row_of(self, key: int) -> int:
        """Set index: the UM block number's low bits, as a driver keyed by block address (and
        the original correlation prefetcher, by the miss address) indexes its table. A
        kernel's tensors are runs of consecutive blocks, so a run of up to NumRows x Assoc
        blocks (8 GiB at the paper's 2048 x 2) fits without one conflict, where a hash
        evicts ways at random long before the table is full."""
        return key % self.num_rows


def _whole(parts: list[tuple[int, int]]) -> bool:
    """Whether a block's inactive parts (``_inactive_parts``) cover all of it: only then may
    the whole block be dropped instead of evicted."""
    return sum(n for _, n in parts) >= BLOCK_SIZE


@dataclass(eq=False)
class Segment:
    """The walk through one kernel's table from one block, traced once and reused while the
    table is unchanged (``key``). Hop k visits ``blocks[k]`` and emits ``emit[hop_end[k-1]:
    hop_end[k]]``; after the last hop the walk leaves the table. Residency does not steer the
    walk, only what it emits, so the path can be cached: on a mostly resident GPU every fault
    restarts a walk that crosses up to ``degree`` kernels' tables of resident blocks (ResNet-152
    at batch 1280: ~16 K hops per fault), which per hop in Python made replays take hours."""

    key: tuple                  # (version, start, end) of the table when traced
    blocks: list[int]           # the block each hop visits
    emit: np.ndarray            # blocks offered, in walk order (repeats included)
    dense: np.ndarray           # their dense ids (DeepUMController._ids)
    prev: np.ndarray            # index of the previous offer of the same block in ``emit``, or -1
    hop_end: np.ndarray         # end of each hop's offers in ``emit``
    from_start: bool            # began at the table's start block (which is offered first)
    visited0: frozenset         # blocks already visited in this table when the trace began


@dataclass
class Chain:
    """The prefetching thread's position: walking ``exec_id``'s table at ``block``."""

    exec_id: int
    hist: tuple[int, int, int]          # the three kernels before exec_id
    block: int | None                   # None: begin at the table's start block
    path: list[int] = field(default_factory=list)  # predicted kernels after the current one
    paused: bool = False
    seg: Segment | None = None          # the traced walk through exec_id's table ...
    hop: int = 0                        # ... and the hop at ``block``
    redo: bool = False                  # hop already walked (paused on leaving): offer again,
                                        # without the table's start block


@register
class DeepUMController(Controller):
    name = "deepum"
    subscribes = frozenset({Kind.LAUNCH, Kind.FAULT, Kind.ALLOC, Kind.EVICTION})
    #: the three DeepUM techniques; the ablation modes switch them off one by one
    features = ("prefetch", "preevict", "invalidate")

    def __init__(self, num_rows: int = 2048, assoc: int = 2, num_succs: int = 4, degree: int = 32,
                 exec_fallback: bool = True, watermark_blocks: int = 4, max_blocks_per_step: int = 256,
                 whole_fault_blocks: bool = True, whole_tables: bool = False, evict_horizon: int = 512,
                 keeper_invalidate: bool = True, live_invalidate: bool = True, trained_ends: bool = True,
                 horizon: str = "auto", adaptive_whole: bool = True, **options):
        super().__init__(**options)
        self.num_rows, self.assoc, self.num_succs = int(num_rows), int(assoc), int(num_succs)
        self.degree = int(degree)
        self.watermark = int(watermark_blocks)       # free chunks kept in reserve for faults
        self.max_blocks = int(max_blocks_per_step)   # prefetch commands per event batch at most
        self.whole_fault_blocks = bool(whole_fault_blocks)  # migrate a faulted block whole
        self.whole_tables = bool(whole_tables)  # also prefetch blocks the walk did not reach
        #: whole-block completion only for a launch that repeats an execution ID already run
        #: (module doc, *Whole faulted blocks*)
        self.adaptive_whole = bool(adaptive_whole)
        self._novel = False                 # the current launch has not run before: no completion
        self._launched: set[int] = set()    # execution hashes launched so far
        self._looped = False                # some execution hash has been launched again
        self._repeating: set[int] = set()   # kernel names one of whose execution hashes repeated
        #: how many predicted kernels ahead the live budget keeper looks to rank its victims
        self.evict_horizon = int(evict_horizon)
        #: live: the budget keeper's dead victims are invalidated too (the driver's evictions)
        self.keeper_invalidate = bool(keeper_invalidate)
        #: live: invalidate at all (only ever through the program's runtime, umctl run)
        self.live_invalidate = bool(live_invalidate)
        #: a fault on a block DeepUM has on its way keeps the table's start/end (module doc)
        self.trained_ends = bool(trained_ends)
        #: "fit": the walk goes on to the next predicted kernel only while the kernels it covers
        #: fit in the GPU together; "fixed": always ``degree`` kernels (the paper); "auto": fit
        #: without pre-eviction, fixed with it (module doc, "Horizon")
        if horizon not in ("auto", "fit", "fixed"):
            raise UmctlError(f"-O {self.name}.horizon: must be auto, fit or fixed, got {horizon!r}")
        self.horizon = horizon
        self.fit_horizon = horizon == "fit" or (horizon == "auto" and "preevict" not in self.features)
        self._wcnt = np.zeros(1024, np.int32)     # per dense id: kernels of the window needing it
        self._win: list[np.ndarray] = []          # dense ids of each kernel in the window
        self._win_size = 0                        # distinct blocks in the window
        self._win_owner: Chain | None = None      # the chain the window belongs to
        self._tkeys: dict[int, tuple[int, np.ndarray]] = {}   # exec id -> (table version, ids)
        self.capacity: list[int] = []             # blocks per GPU (attach); none known: no fitting
        self.exec_ids = ExecIdTable()
        self.exec_table = ExecCorrelationTable(fallback=exec_fallback)
        self.tables: dict[int, BlockTable] = {}
        self.history: list[int] = []      # execution IDs in launch order (last 4 kept)
        self.cur: int | None = None
        self.gpu = 0
        self.first_fault = False          # next fault is the current kernel's start block
        self.last_block: int | None = None
        self.last_known = False           # last_block's fault was a late prefetch (trained_ends)
        self.chain: Chain | None = None
        self.resident: dict[int, float] = {}   # block -> when it migrated in (oldest first)
        # the walk's vectorised view of ``resident``: blocks get dense ids on first sight
        self._ids: dict[int, int] = {}
        self._res = np.zeros(1024, np.bool_)
        self._seen = np.zeros(1024, np.bool_)      # offered in the current step
        self._segs: dict[tuple[int, int | None], Segment] = {}
        self._seg_elems = 0
        self.inactive: dict[int, int] = {}     # inactive allocator blocks: addr -> bytes
        self._inactive_sorted: tuple[np.ndarray, np.ndarray] | None = None
        self.predicted_next: int | None = None
        self.live_invalidate_off = False
        self._expected_cache: set[int] | None = None
        #: resident blocks outside ``_expected_cache``, least recently migrated first: the
        #: pre-eviction's candidates, kept in step so that it does not rescan every resident
        #: block the next kernels expect on each call (None: rebuild after a launch)
        self._unexpected: dict[int, None] | None = None
        self._horizon_cache: dict[int, int] | None = None
        self.fault_queue: dict[int, None] = {}   # faulted blocks to complete, served first
        #: blocks a subclass knows the next kernels need for certain (``deepum-launch``: named by
        #: queued launches): never pre-evicted, kept last by the budget keeper; empty here
        self._protected: set[int] = set()
        self.stats_ = {k: 0 for k in ("launches", "predictions", "predicted_right", "chains", "faulted_blocks",
                                       "prefetch_blocks", "preevict_blocks", "invalidate_blocks",
                                       "paused", "prediction_failures", "kept_not_invalidated",
                                       "keeper_invalidate_blocks", "horizon_paused")}

    # ------------------------------------------------------------------ set-up
    def applies_to(self, workload) -> str | None:
        """DeepUM steers one process on one GPU: its execution-ID history is that process's
        kernel sequence. On a multi-GPU or multi-tenant program the interleaved kernels of
        the other GPUs would pollute it."""
        n = getattr(workload, "n_gpus", 1)
        if n > 1:
            return (f"DeepUM controls one process on one GPU; this program runs on {n} GPUs "
                    "(one controller per tenant is not modelled)")
        return None

    def attach(self, ctx: ControllerContext) -> None:
        super().attach(ctx)
        self.capacity = [int(m) // BLOCK_SIZE for m in ctx.gpu_mem]
        # Live, an invalidation from umctl's thread (UVM_DISCARD on the borrowed fd) is ordered
        # neither with the program's stream (the allocator reports a block free as soon as the
        # host drops the tensor, while kernels queued before may still read it) nor with the
        # allocator handing the block out again before the discard lands: on a torch loop it
        # changed the trained parameters (docs/evaluation/live-control.md). So live, DeepUM invalidates only
        # when the program's runtime carries the discard out itself (ctx.options
        # "safe_invalidate": actuators/runtime_discard.py), unless -O live_invalidate=false;
        # otherwise it pre-evicts those victims (their data is kept).
        self.live_invalidate_off = (bool(ctx.options.get("live")) and "invalidate" in self.features
                                    and not (ctx.options.get("safe_invalidate") and self.live_invalidates()))

    def live_invalidates(self) -> bool:
        return self.live_invalidate and "invalidate" in self.features

    def enabled(self, feature: str) -> bool:
        if feature == "invalidate" and self.live_invalidate_off:
            return False
        return feature in self.features

    # ------------------------------------------------------------------ events
    def on_events(self, batch: EventBatch) -> np.ndarray | None:
        if Kind.ALLOC in batch:
            self._allocator(batch[Kind.ALLOC])
        if Kind.EVICTION in batch:
            for a in batch[Kind.EVICTION]["addr"].tolist():
                self._unmark(a >> BLOCK_SHIFT)
        # launches and faults in time order: a drain may span a kernel boundary
        launches = batch[Kind.LAUNCH]
        seq_t, seq_b = self._fault_blocks(batch[Kind.FAULT])
        li = 0
        restart = None
        for t, b in zip(seq_t.tolist(), seq_b.tolist()):
            while li < len(launches) and int(launches["t_ns"][li]) <= t:
                self._launch(launches[li])
                restart = None
                li += 1
            if self._fault(b, t):
                restart = b
        while li < len(launches):
            self._launch(launches[li])
            restart = None
            li += 1
        if restart is not None and self.cur is not None:
            # a new fault ends the old walk and starts one at the faulted block
            self.chain = Chain(self.cur, self._hist3(), restart)
            self.stats_["chains"] += 1
        if not self.enabled("prefetch") or (self.chain is None and not self.fault_queue and not self._has_priority()):
            return None
        return self._step(batch.now_ns)

    # -- hooks for modes that know part of the future for certain (launch.py); none here
    def _has_priority(self) -> bool:
        """Whether :meth:`_priority` has blocks to offer (a step is due even without a walk)."""
        return False

    def _priority(self, limit: int) -> tuple[np.ndarray, np.ndarray]:
        """Blocks to prefetch before the walk's, in order, with the execution ID each is for."""
        return np.zeros(0, np.int64), np.zeros(0, np.int64)

    @staticmethod
    def _fault_blocks(f: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The fault handler's view: per batch the distinct UM blocks in fault order, then
        without repeats across consecutive batches (vectorised: drains hold many faults)."""
        if len(f) == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        blocks, first = fault_block_firsts(f)
        b, t = blocks[first], f["t_ns"][first]
        keep = np.ones(len(b), np.bool_)
        keep[1:] = b[1:] != b[:-1]
        return t[keep], b[keep]

    def _allocator(self, a: np.ndarray) -> None:
        for op, addr, nbytes in zip(a["op"].tolist(), a["addr"].tolist(), a["bytes"].tolist()):
            if op == AllocOp.BLOCK_INACTIVE:
                self.inactive[addr] = nbytes
            elif self.inactive.pop(addr, None) is None:
                continue
            self._inactive_sorted = None
            if op == AllocOp.FREE:
                for b in range(*block_range(addr, max(nbytes, 1))):
                    self._unmark(b)

    def _hist3(self) -> tuple[int, int, int]:
        h = self.history[-4:-1]
        return tuple([-1] * (3 - len(h)) + h)  # type: ignore[return-value]

    def _table(self, exec_id: int) -> BlockTable:
        t = self.tables.get(exec_id)
        if t is None:
            t = self.tables[exec_id] = BlockTable(self.num_rows, self.assoc, self.num_succs)
        return t

    def _launch(self, ev) -> None:
        """Execution-ID transition: close the previous kernel's table (end block), record
        the execution history, follow or correct the walk."""
        self.stats_["launches"] += 1
        self._expected_cache = None
        self._unexpected = None
        self._horizon_cache = None
        h = int(ev["exec_hash"])
        x = self.exec_ids.get(h)
        # launched before (not merely looked up: deepum-launch numbers queued launches early)
        name = int(ev["name_id"])
        seen = h in self._launched
        if seen:
            self._looped = True
            if name >= 0:
                self._repeating.add(name)
        # no history: before the program has shown it loops, or unseen arguments of a kernel
        # that does repeat (a routing choice); a kernel that never repeats (live, a per-step
        # scalar in its arguments: a dropout seed, an optimizer step) has its own history
        self._novel = (self.adaptive_whole and name >= 0 and not seen
                       and (not self._looped or name in self._repeating))
        self._launched.add(h)
        self.gpu = int(ev["gpu"])
        if self.cur is not None and self.last_block is not None:
            t = self._table(self.cur)
            if not (self.trained_ends and self.last_known and t.end is not None):
                t.end = self.last_block
        if self.predicted_next is not None:
            self.stats_["predictions"] += 1
            self.stats_["predicted_right"] += int(self.predicted_next == x)
        if self.cur is not None:
            self.exec_table.record(self._hist3(), self.cur, x)
        self.history.append(x)
        del self.history[:-4]
        self.cur = x
        self.first_fault = True
        self.last_block = None
        self.predicted_next = self.exec_table.predict(self._hist3(), x)
        c = self.chain
        if c is not None:
            if c.path and c.path[0] == x:
                c.path.pop(0)
                c.paused = False      # the current kernel finished: resume
                if self._win_owner is c and len(self._win) > 1:
                    self._win_drop(self._win.pop(0))
            elif c.exec_id != x:
                # the walk was on a path the program did not take: start over at this kernel
                self.stats_["prediction_failures"] += 1
                self.chain = Chain(x, self._hist3(), None)

    def _fault(self, b: int, t: int) -> bool:
        """A faulted UM block of the current kernel: train its table. True if it may
        restart the walk."""
        if self.cur is None:
            return False
        self.stats_["faulted_blocks"] += 1
        table = self._table(self.cur)
        known = self.trained_ends and b in self.resident   # a late prefetch (module doc)
        if self.first_fault:
            if not (known and table.start is not None):
                table.start = b
            table.last.clear()  # pairs do not cross execution-ID transitions
            self.first_fault = False
        table.record(b)
        self.last_block = b
        self.last_known = known
        self._unmark(b)
        self._mark(b, t)
        if self.whole_fault_blocks and not self._novel:
            self.fault_queue[b] = None  # DeepUM's fault queue holds UM blocks: the whole block comes
        return True

    # ------------------------------------------------------------------ chaining
    def _mark(self, b: int, t: float) -> None:
        """Block b migrated in at t (the most recently migrated)."""
        self.resident[b] = t
        if self._unexpected is not None and b not in self._expected_cache:  # type: ignore[operator]
            self._unexpected[b] = None
        i = self._ids.get(b)
        if i is not None:
            self._res[i] = True

    def _unmark(self, b: int) -> None:
        if self.resident.pop(b, None) is not None:
            if self._unexpected is not None:
                self._unexpected.pop(b, None)
            i = self._ids.get(b)
            if i is not None:
                self._res[i] = False

    def _dense(self, blocks: list[int]) -> np.ndarray:
        """Dense ids of ``blocks``, numbering new ones (and noting whether they are resident)."""
        ids = self._ids
        out = np.empty(len(blocks), np.int64)
        for k, b in enumerate(blocks):
            i = ids.get(b)
            if i is None:
                i = ids[b] = len(ids)
                if i >= len(self._res):
                    self._res = np.concatenate([self._res, np.zeros(len(self._res), np.bool_)])
                    self._seen = np.concatenate([self._seen, np.zeros(len(self._seen), np.bool_)])
                    self._wcnt = np.concatenate([self._wcnt, np.zeros(len(self._wcnt), np.int32)])
                self._res[i] = b in self.resident
            out[k] = i
        return out

    def _trace(self, t: BlockTable, block: int, visited: set[int], from_start: bool) -> Segment:
        """Follow ``t`` from ``block`` as the walk does: offer the block's successors, leave at
        the end block (or when it is among them), else go on to the first successor not yet
        visited, leave when there is none."""
        visited0 = frozenset(visited)
        blocks: list[int] = []
        emit: list[int] = []
        hop_end: list[int] = []
        end = t.end
        b = block
        if from_start:
            emit.append(b)
        while True:
            blocks.append(b)
            if b == end:
                hop_end.append(len(emit))
                break
            succ = t.successors(b, 0)
            emit += succ
            hop_end.append(len(emit))
            if end is not None and end in succ:
                break
            nxt = next((x for x in succ if x not in visited), None)
            if nxt is None:
                break
            visited.add(nxt)
            b = nxt
        last: dict[int, int] = {}
        prev = np.empty(len(emit), np.int64)
        for k, x in enumerate(emit):
            prev[k] = last.get(x, -1)
            last[x] = k
        return Segment((t.version, t.start, end), blocks, np.array(emit, np.int64), self._dense(emit), prev,
                       np.array(hop_end, np.int64), from_start, visited0)

    def _segment(self, c: Chain, t: BlockTable) -> tuple[Segment, int]:
        """The traced walk for the chain's position and the hop to go on at."""
        key = (t.version, t.start, t.end)
        seg = c.seg
        if seg is not None:
            if seg.key == key:
                return seg, c.hop
            # the table changed under a walk in progress: go on from where it stands, with the
            # blocks this visit of the table has been through so far
            visited = set(seg.visited0).union(seg.blocks[1:c.hop + 1])
            c.seg = self._trace(t, seg.blocks[c.hop], visited, False)
            return c.seg, 0
        at = c.block
        seg = self._segs.get((c.exec_id, at))
        if seg is None or seg.key != key:
            if at is None:
                seg = self._trace(t, t.start, {t.start}, True)  # type: ignore[arg-type]
            else:
                seg = self._trace(t, at, set(), False)
            if self._seg_elems > 4_000_000:      # bound the cache (restart points are many)
                self._segs.clear()
                self._seg_elems = 0
            self._segs[(c.exec_id, at)] = seg
            self._seg_elems += len(seg.emit) + len(seg.blocks)
        c.seg, c.hop = seg, 0
        c.block = seg.blocks[0]
        return seg, 0

    def _walk(self, limit: int) -> tuple[np.ndarray, np.ndarray]:
        """Advance the walk; returns the blocks to prefetch and the execution ID each is
        predicted for. Offers already resident or offered in this step are skipped; the walk
        stops at the end of the hop where ``limit`` is reached."""
        blocks: list[np.ndarray] = []
        execs: list[np.ndarray] = []
        marked: list[np.ndarray] = []
        n = 0
        c = self.chain
        while c is not None and not c.paused and n < limit:
            t = self.tables.get(c.exec_id)
            if t is None or (c.block is None and t.start is None):
                c = self._next_kernel(c)
                continue
            seg, h0 = self._segment(c, t)
            lo = int(seg.hop_end[h0 - 1]) if h0 else int(c.redo and seg.from_start)
            c.redo = False
            cand = seg.dense[lo:]
            ok = ~(self._res[cand] | self._seen[cand]) & (seg.prev[lo:] < lo)
            cum = np.concatenate(([0], np.cumsum(ok)))[seg.hop_end[h0:] - lo]
            j = int(np.searchsorted(cum, limit - n))   # the hop where the limit is reached
            last_hop = min(j, len(cum) - 1)
            upto = int(seg.hop_end[h0 + last_hop]) - lo
            idx = np.flatnonzero(ok[:upto])
            if len(idx):
                blocks.append(seg.emit[lo + idx])
                execs.append(np.full(len(idx), c.exec_id, np.int64))
                ids = cand[idx]
                self._seen[ids] = True
                marked.append(ids)
                n += len(idx)
            if h0 + last_hop + 1 < len(seg.blocks):
                c.hop = h0 + last_hop + 1
                c.block = seg.blocks[c.hop]
                continue                            # the limit stopped the walk inside the table
            c = self._leave(c, blocks, execs, marked)
            if c is not None and c.paused and c.seg is seg:
                # paused at the table's last hop: on resuming, the walk takes that hop again
                c.hop, c.redo = len(seg.blocks) - 1, True
            n = sum(len(b) for b in blocks)
        self.chain = c
        for ids in marked:
            self._seen[ids] = False
        if not blocks:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(blocks), np.concatenate(execs)

    def _leave(self, c: Chain, blocks: list, execs: list, marked: list) -> Chain | None:
        """The walk is done with ``c.exec_id``'s table: with ``whole_tables``, first offer the
        blocks recorded for the kernel that the successor walk did not reach (tables can hold
        several chains when a kernel's faults came in different orders); then chain on."""
        t = self.tables.get(c.exec_id) if self.whole_tables else None
        if t is not None:
            keys = list(t.keys())     # each recorded block once
            ids = self._dense(keys)
            ok = ~(self._res[ids] | self._seen[ids])
            if ok.any():
                blocks.append(np.array(keys, np.int64)[ok])
                execs.append(np.full(int(ok.sum()), c.exec_id, np.int64))
                self._seen[ids[ok]] = True
                marked.append(ids[ok])
        return self._next_kernel(c)

    def _next_kernel(self, c: Chain) -> Chain | None:
        """Chaining across kernels: predict the kernel after ``c.exec_id``."""
        if len(c.path) >= self.degree:
            c.paused = True
            self.stats_["paused"] += 1
            return c
        n = self._predict_next(c)
        if n is None:
            return None  # cannot predict: the walk ends until the next fault
        if self.fit_horizon and self.capacity and not self._win_fits(c, n, force=not c.path):
            # the kernels up to n would not fit in the GPU together: prefetching n's blocks
            # now would evict blocks needed before them; wait until the current kernel ends
            c.paused = True
            self.stats_["paused"] += 1
            self.stats_["horizon_paused"] += 1
            return c
        c.hist = (c.hist[1], c.hist[2], c.exec_id)
        c.exec_id = n
        c.block = None
        c.seg, c.hop = None, 0
        c.path.append(n)
        return c

    def _predict_next(self, c: Chain) -> int | None:
        """The kernel after ``c.exec_id`` on the walk's path: the execution-ID table's guess
        (a mode that knows the queued launches says instead, launch.py)."""
        return self.exec_table.predict(c.hist, c.exec_id)

    # ------------------------------------------------------------------ horizon
    def _table_ids(self, exec_id: int) -> np.ndarray:
        """Dense ids of the blocks in ``exec_id``'s table (cached while the table is unchanged)."""
        t = self.tables.get(exec_id)
        if t is None:
            return np.zeros(0, np.int64)
        hit = self._tkeys.get(exec_id)
        if hit is None or hit[0] != t.version:
            hit = self._tkeys[exec_id] = (t.version, np.unique(self._dense(list(t.keys()))))
        return hit[1]

    def _win_add(self, ids: np.ndarray) -> None:
        self._win_size += int(np.count_nonzero(self._wcnt[ids] == 0))
        self._wcnt[ids] += 1
        self._win.append(ids)

    def _win_drop(self, ids: np.ndarray) -> None:
        self._wcnt[ids] -= 1
        self._win_size -= int(np.count_nonzero(self._wcnt[ids] == 0))

    def _win_fits(self, c: Chain, n: int, force: bool = False) -> bool:
        """Would the blocks of the current kernel, the kernels on ``c``'s path and kernel ``n``
        (from their tables) fit in the GPU together, less the fault reserve? Adds ``n`` to the
        window when they do, or with ``force`` (the first kernel ahead is always walked). The
        window follows ``c``: a new chain rebuilds it."""
        if self._win_owner is not c:
            for ids in self._win:
                self._wcnt[ids] -= 1
            self._win, self._win_size, self._win_owner = [], 0, c
            for x in ([self.cur] if self.cur is not None else []) + c.path:
                self._win_add(self._table_ids(x))
        ids = self._table_ids(n)
        new = int(np.count_nonzero(self._wcnt[ids] == 0))
        if not force and self._win_size + new > self.capacity[self.gpu] - self.watermark:
            return False
        self._win_add(ids)
        return True

    def _predict_on(self, ids: list[int], hist: tuple[int, int, int], cur: int | None, limit: int) -> list[int]:
        """Extend ``ids`` with the kernels the execution-ID table predicts after ``cur`` (its
        three predecessors ``hist``), until ``limit`` kernels or a repeat."""
        seen = set(ids)
        while cur is not None and len(ids) < limit:
            nxt = self.exec_table.predict(hist, cur)
            if nxt is None or nxt in seen:
                break
            ids.append(nxt)
            seen.add(nxt)
            hist, cur = (hist[1], hist[2], cur), nxt
        return ids

    def _first_need(self, ids: list[int]) -> dict[int, int]:
        """Each block in the tables of ``ids`` -> the position of the first kernel needing it."""
        out: dict[int, int] = {}
        for rank, i in enumerate(ids):
            t = self.tables.get(i)
            if t is not None:
                for b in t.keys():
                    out.setdefault(b, rank)
        return out

    def _expected(self) -> set[int]:
        """Blocks the current kernel and the next ``degree`` predicted ones may touch: the
        pre-eviction spares them (cached until the next launch: the tables of those kernels
        change little meanwhile)."""
        if self._expected_cache is None:
            self._expected_cache = set(self._next_use(self.degree + 1))
        return self._expected_cache

    def _next_use(self, horizon: int) -> dict[int, int]:
        """Each block of the current kernel and the predicted ones after it, up to ``horizon``
        kernels (or until the prediction repeats itself) -> how many kernels ahead it is first
        needed (0: the current kernel). The walk's path is taken as predicted and the
        prediction goes on from its end: the path alone may be shorter than the horizon (a
        walk restarted by a fault), and the paper's "next N kernels" are N all the same."""
        ids = [self.cur] if self.cur is not None else []
        if self.chain is not None:
            ids += self.chain.path[: max(0, horizon - 1)]
        hist = tuple((list(self._hist3()) + ids[:-1])[-3:]) if len(ids) >= 2 else self._hist3()
        return self._first_need(self._predict_on(ids, hist, ids[-1] if ids else None, horizon))  # type: ignore[arg-type]

    # ------------------------------------------------------------------ commands
    def _step(self, now: int) -> np.ndarray | None:
        g = self.gpu
        out = []
        if self.fault_queue:
            # the fault queue before the prefetch queue: complete the faulted blocks (already
            # holding their chunks, so no room is needed)
            fq = np.fromiter(self.fault_queue, np.int64, len(self.fault_queue))
            self.fault_queue.clear()
            cur = self.cur if self.cur is not None else -1
            out.append(commands(Op.PREFETCH, fq << BLOCK_SHIFT, BLOCK_SIZE, dst=g, exec_id=cur, priority=0))
        first, first_x = self._priority(self.max_blocks) if self._has_priority() else (None, None)
        if first is not None and len(first):
            # certain blocks first, then the walk's guesses in what the step has left
            if self.chain is not None and self.max_blocks > len(first):
                blocks, execs = self._walk(self.max_blocks - len(first))
                fresh = ~np.isin(blocks, first)
                blocks, execs = np.concatenate([first, blocks[fresh]]), np.concatenate([first_x, execs[fresh]])
            else:
                blocks, execs = first, first_x
        elif self.chain is not None:
            blocks, execs = self._walk(self.max_blocks)
        else:
            blocks = execs = np.zeros(0, np.int64)
        if not len(blocks):
            return np.concatenate(out) if out else None
        if self.enabled("preevict"):
            free = (self.ctx.free_memory(g) // BLOCK_SIZE if self.ctx.free_memory is not None
                    else self.capacity[g] - len(self.resident))
            short = len(blocks) + self.watermark - int(free)
            if short > 0:
                evict, keep = self._victims(short)
                out += evict
                if keep < short:  # no more victims the next kernels can spare: prefetch less
                    k = max(0, len(blocks) - (short - keep))
                    blocks, execs = blocks[:k], execs[:k]
        if len(blocks):
            out.append(self._prefetch_commands(blocks, execs, g))
            for b in blocks.tolist():
                self._mark(b, now)
            self.stats_["prefetch_blocks"] += len(blocks)
        return np.concatenate(out) if out else None

    def _pick_victims(self, n: int) -> list[int]:
        """The pre-eviction's choice among resident blocks the next kernels do not expect: the
        least recently migrated first (§5.1), never a protected one."""
        if self._protected:
            prot = self._protected
            return list(islice((b for b in self._unexpected if b not in prot), n))  # type: ignore[union-attr]
        return list(islice(self._unexpected, n))  # type: ignore[arg-type]

    def _prefetch_commands(self, blocks: np.ndarray, execs: np.ndarray, g: int) -> np.ndarray:
        """The step's prefetches: each block whole (DeepUM's unit; a mode that knows which
        ranges a kernel names may move less, launch.py)."""
        return commands(Op.PREFETCH, blocks << BLOCK_SHIFT, BLOCK_SIZE, dst=g, exec_id=execs, priority=1)

    def _victims(self, n: int) -> tuple[list[np.ndarray], int]:
        """Up to n least recently migrated blocks that the next kernels do not expect:
        pre-evicted to the host, or invalidated where they hold inactive allocator blocks."""
        if self._unexpected is None:
            expected = self._expected()
            self._unexpected = {b: None for b in self.resident if b not in expected}
        victims = self._pick_victims(n)
        if not victims:
            return [], 0
        out = []
        pre = []
        for b in victims:
            self._unmark(b)
            parts = self._inactive_parts(b)
            if self.live_invalidate_off and parts:
                self.stats_["kept_not_invalidated"] += 1
            if parts and self.enabled("invalidate"):
                out.append(commands(Op.INVALIDATE, [a for a, _ in parts], [n_ for _, n_ in parts]))
                self.stats_["invalidate_blocks"] += 1
                if _whole(parts):
                    continue
            pre.append(b)
        if pre:
            out.append(commands(Op.PREEVICT, np.array(pre, np.int64) << BLOCK_SHIFT, BLOCK_SIZE, dst=CPU))
            self.stats_["preevict_blocks"] += len(pre)
        return out, len(victims)

    def eviction_order(self, gpu: int, blocks: list[int]) -> list[int]:
        """Which blocks a live budget keeper loses first (it stands for the driver's eviction
        when DeepUM's own pre-eviction did not make room). Ranked by DeepUM's own prediction of
        the next use, looking ``evict_horizon`` kernels ahead: blocks no predicted kernel touches
        first (least recently migrated first among them), then those needed furthest ahead.
        Why not the paper's "least recently migrated and not expected by the next N": for the
        budget keeper that is LRU over everything beyond N kernels, and on a training loop's
        cycle LRU loses exactly the blocks needed soonest (docs/evaluation/live-control.md)."""
        if not self.enabled("preevict"):
            return blocks
        if self._horizon_cache is None:
            self._horizon_cache = self._next_use(max(self.evict_horizon, self.degree + 1))
        rank = self._horizon_cache
        unexpected = [b for b in blocks if b not in rank]
        expected = sorted((b for b in blocks if b in rank), key=lambda b: -rank[b])   # stable: LRU within a rank
        if self._protected:   # what is known for certain goes last
            prot = self._protected
            return ([b for b in unexpected if b not in prot] + [b for b in expected if b not in prot]
                    + [b for b in blocks if b in prot])
        return unexpected + expected

    def eviction_commands(self, cmds: np.ndarray) -> np.ndarray:
        """DeepUM's driver invalidates *any* eviction victim that lies wholly in inactive
        allocator blocks (§5.2), the fault path's too: live, the budget keeper's."""
        if not self.keeper_invalidate or not self.enabled("invalidate") or not self.inactive or not len(cmds):
            return cmds
        dead = np.array([int(c["op"]) == Op.PREEVICT and int(c["dst"]) == CPU and
                         _whole(self._inactive_parts(int(c["addr"]) >> BLOCK_SHIFT)) for c in cmds], bool)
        if dead.any():
            cmds = cmds.copy()
            cmds["op"][dead] = Op.INVALIDATE
            self.stats_["keeper_invalidate_blocks"] += int(dead.sum())
        return cmds

    def _inactive_parts(self, b: int) -> list[tuple[int, int]]:
        """The byte ranges of block b that lie in inactive allocator blocks."""
        if not self.inactive:
            return []
        if self._inactive_sorted is None:
            addr = np.array(sorted(self.inactive), np.int64)
            self._inactive_sorted = (addr, np.array([self.inactive[a] for a in addr.tolist()], np.int64))
        addr, size = self._inactive_sorted
        lo, hi = b << BLOCK_SHIFT, (b + 1) << BLOCK_SHIFT
        i = int(np.searchsorted(addr, lo, side="right")) - 1
        parts = []
        i = max(i, 0)
        while i < len(addr) and addr[i] < hi:
            s, e = max(int(addr[i]), lo), min(int(addr[i] + size[i]), hi)
            if e > s:
                parts.append((s, e - s))
            i += 1
        return parts

    # ------------------------------------------------------------------ report
    def stats(self) -> dict:
        s = dict(self.stats_)
        s["exec_ids"] = len(self.exec_ids)
        s["exec_records"] = len(self.exec_table)
        s["block_tables"] = len(self.tables)
        s["table_entries"] = sum(t.n_entries for t in self.tables.values())
        s["table_bytes"] = sum(t.nbytes() for t in self.tables.values())
        s["prediction_accuracy"] = s["predicted_right"] / s["predictions"] if s["predictions"] else None
        if self.live_invalidate_off:
            s["invalidate_off_live"] = "no_runtime" if self.live_invalidate else "option"
        return s


@register
class DeepUMPrefetchOnly(DeepUMController):
    """Ablation: correlation prefetching only (DeepUM figure 10, "Prefetching")."""

    name = "deepum-prefetch"
    features = ("prefetch",)


@register
class DeepUMPreevict(DeepUMController):
    """Ablation: prefetching + pre-eviction, no invalidation ("Prefetching+Preeviction")."""

    name = "deepum-preevict"
    features = ("prefetch", "preevict")
