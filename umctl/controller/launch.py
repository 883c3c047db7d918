"""Mode ``deepum-launch``: DeepUM, plus what the launch queue tells (issue 38 §4).

DeepUM predicts the next kernels and their UM blocks from history. Where the program's data
flow is redrawn every iteration -- a mixture-of-experts layer routes each batch to 2 of 8
experts -- history names last iteration's experts: DeepUM prefetches the wrong ones and, worse,
pre-evicts the right ones as "not expected", and those are the faults it keeps. Yet the host
issues a kernel's launch before the GPU runs it (the launch queue; the CUDA queue holds up to
~1024 launches, PyTorch's host runs some tens ahead), and a launch names its tensors: its pointer
arguments. So an expert the router chose is named by the launches queued for it before it runs.

What this mode adds to DeepUM, on every batch of ``Kind.LAUNCH_ARGS`` records (one per range a
launch's pointer arguments name, heard when the host issues the launch):

  * the launches still queued (issued, their kernel not started: LAUNCH, the kernel's start,
    has not come) form a window, in queue order, as far as the current kernel's and their named
    blocks fit in the GPU together less DeepUM's fault reserve (``watermark_blocks``):
    prefetching a launch further ahead would evict blocks the earlier ones need, the cliff
    DeepUM's ``fit`` horizon avoids for its own predictions;
  * the window's named ranges that DeepUM has not sent are prefetched first, in queue order,
    before the walk's predictions (they are certain, the walk's are guesses), as the named bytes
    rather than whole blocks (``_priority``); the step's block budget (``max_blocks_per_step``)
    and DeepUM's room-making pre-eviction cover both;
  * the window's blocks and the current kernel's (where its launch was heard while queued) are
    never pre-evicted, and a live budget keeper loses them last, until their kernel has run;
  * the queued kernels are the next kernels, known: DeepUM's walk follows them instead of its
    execution-ID prediction, and its next-use ranking (what pre-eviction spares) covers them
    first, predicting only beyond the queue;
  * a fault in a kernel whose launch was heard while queued completes, in the faulted block,
    the pieces that launch names, not the whole block (``_fault``). DeepUM completes a faulted
    block whole because the block is all it knows of what the kernel touches; this launch's
    ranges are known. The rest of the block is what no launch at hand names -- on a mixture of
    experts, the experts the router did not choose -- and every page migrated in is written
    back when evicted, whether the program wrote it or not (the driver moves pages; it does
    not copy them). The block's other named pieces stay to send: the window sends them as
    their launches come into it. Before the program has looped the rule is off and DeepUM
    decides (with ``adaptive_whole``: no completion), so the first iteration is as before; on
    there, completing the named pieces made bert-base's first iteration at Q = 8 3 % slower
    (86.4 against 83.9 ms) and Mixtral's no faster. Measured (``umctl replay mixtral-8x7b -m deepum-launch -O
    launch_queue=Q``, fit scale): 173.3, 122.5, 82.8 ms at Q = 8, 64, 1024 before, 155.6,
    107.8, 74.6 after, host-to-GPU 798/667/606 MiB -> 694/525/513 and GPU-to-host
    1067/910/830 -> 960/779/727; on the dense models at the same depths within 0.4 % either
    way (bert-base 243.4 -> 243.8 ms at Q = 8, gpt2-xl 219.2 -> 220.0 at Q = 64, 285.1 -> 284.0
    at Q = 8; docs/evaluation/cliffs.md, *Mixture of experts*).

Everything else is DeepUM's: tables, chaining, pre-eviction and invalidation of the blocks no
one names. A launch heard only once its kernel runs (no queue: Q = 0, or a source that sees
launches at kernel start) is not queued and changes nothing, so without lookahead this mode
*is* ``deepum``, command for command (tests/test_launch_prefetch.py holds it to that).

Why a mode of its own and not ``-O deepum.launch=on``: it needs an input DeepUM does not (the
launch's argument ranges, which live only a runtime inside the program can read: the launch
call's parameters), and the live path decides what a mode needs and refuses what it cannot give
from class attributes (``subscribes``, ``needs_runtime``, ``replay_only``), which an option
cannot change: ``deepum`` runs live today, this mode not yet. As its own row it runs beside
``deepum`` in one replay (``-m deepum,deepum-launch``) with DeepUM's options (``-O
deepum-launch.degree=8``). It adds no options of its own: the lookahead is the program's
(``-O launch_queue=Q`` in a replay), the window's bound the GPU's size.
"""

from __future__ import annotations

import numpy as np

from ..events.schema import EventBatch, Kind, Op, commands
from ..units import BLOCK_SHIFT
from .base import ControllerContext, register
from .deepum import DeepUMController


class _Queued:
    """One issued launch not yet run: when it was issued, its execution hash, the UM blocks its
    ranges cover (in the order the launch names them, each once), and its ranges cut at block
    boundaries as (block, first byte, end byte)."""

    __slots__ = ("t_issue", "exec_hash", "blocks", "pieces")

    def __init__(self, t_issue: int, exec_hash: int, blocks: list[int], pieces: list[tuple[int, int, int]]):
        self.t_issue, self.exec_hash, self.blocks, self.pieces = t_issue, exec_hash, blocks, pieces


#: ``_sent`` value of a block DeepUM brought whole (its walk, a fault): nothing left to send
_WHOLE: frozenset = frozenset()


@register
class DeepUMLaunchController(DeepUMController):
    name = "deepum-launch"
    subscribes = DeepUMController.subscribes | {Kind.LAUNCH_ARGS}
    #: live it needs what only a runtime inside the program sees (each launch call's pointer
    #: arguments, as the host issues it); umctl's runtime hashes those arguments but does not
    #: report them yet, and without them this mode would be DeepUM under another name
    replay_only = True
    replay_only_why = ("needs each launch's pointer arguments as the host issues it, which umctl's runtime "
                       "does not report yet")
    needs_runtime = True
    runtime_why = "reads each launch's pointer arguments in the launch call, ahead of the GPU running it"

    def attach(self, ctx: ControllerContext) -> None:
        super().attach(ctx)
        #: seq -> the launch, for every launch heard and not yet over (dicts keep issue order)
        self._queue: dict[int, _Queued] = {}
        self._started = -1                 # seq of the kernel running now (its LAUNCH)
        self._window: list[int] = []       # the queued launches prefetched for, in queue order
        self._dirty = False                # queue or current kernel changed: recompute the window
        self._qids: list[int] | None = None   # execution IDs of the queued launches (cache)
        #: per block DeepUM holds: the named pieces sent to it (byte ranges), or _WHOLE
        self._sent: dict[int, frozenset | set] = {}
        self._pf_pieces: dict[int, list[tuple[int, int]]] = {}   # this step's range prefetches
        #: faulted block -> the pieces its (queued) launch names there, to complete next step
        self._fault_pieces: dict[int, list[tuple[int, int]]] = {}
        for k in ("launch_heard", "launch_windows", "launch_offered_blocks", "launch_window_full",
                  "launch_fault_pieces"):
            self.stats_[k] = 0

    # ------------------------------------------------------------------ events
    def on_events(self, batch: EventBatch) -> np.ndarray | None:
        args = batch[Kind.LAUNCH_ARGS]
        if len(args):
            self._enqueue(args)
        out = super().on_events(batch)
        if out is None and self._fault_pieces and self.enabled("prefetch"):
            out = self._step(batch.now_ns)   # nothing else due this drain: the completions are
        return out

    def _enqueue(self, a: np.ndarray) -> None:
        seq = a["seq"].astype(np.int64)
        cut = np.flatnonzero(np.diff(seq)) + 1
        starts = np.concatenate(([0], cut)).tolist()
        ends = cut.tolist() + [len(a)]
        addr, nbytes = a["addr"].astype(np.int64), a["bytes"].astype(np.int64)
        first_b = (addr >> BLOCK_SHIFT).tolist()
        last_b = ((addr + np.maximum(nbytes, 1) - 1) >> BLOCK_SHIFT).tolist()
        nb = nbytes.tolist()
        heard = False
        for s, e in zip(starts, ends):
            q = int(seq[s])
            if q < self._started or q in self._queue:
                continue   # over already (heard late), or heard twice
            blocks: dict[int, None] = {}
            pieces = []
            for k in range(s, e):
                if nb[k] <= 0:   # an empty record: a launch naming no managed memory
                    continue
                lo, hi = int(addr[k]), int(addr[k]) + nb[k]
                for b in range(first_b[k], last_b[k] + 1):
                    blocks[b] = None
                    pieces.append((b, max(lo, b << BLOCK_SHIFT), min(hi, (b + 1) << BLOCK_SHIFT)))
            self._queue[q] = _Queued(int(a["t_ns"][s]), int(a["exec_hash"][s]), list(blocks), pieces)
            self.stats_["launch_heard"] += 1
            heard = True
        if heard:
            # in launch order: a launch issued later than a kernel's start is delivered after
            # records emitted at once, so a batch may list later launches first
            self._queue = dict(sorted(self._queue.items()))
            self._queue_changed()

    def _queue_changed(self) -> None:
        """What DeepUM derived from its predictions of the next kernels is stale now: the
        window, the queued kernels' IDs, and the expected blocks (which the pre-eviction spares)."""
        self._dirty = True
        self._qids = None
        self._expected_cache = None
        self._unexpected = None
        self._horizon_cache = None

    def _launch(self, ev) -> None:
        """The kernel ``ev`` starts: launches before it are over; its own stays protected while
        it runs if it was heard while queued (issued before its start), and is forgotten if it
        was heard only as it started (no lookahead: then this mode is DeepUM)."""
        super()._launch(ev)
        s, t = int(ev["seq"]), int(ev["t_ns"])
        self._started = max(self._started, s)
        q = self._queue
        for k in [k for k in q if k < self._started]:
            del q[k]
        cur = q.get(self._started)
        if cur is not None and cur.t_issue >= t:
            del q[self._started]
        self._dirty = True
        self._qids = None

    # ------------------------------------------------------------------ the window
    def _refresh(self) -> None:
        """The window (module doc): queued launches in order while their blocks and the current
        kernel's fit in the GPU less the fault reserve; its blocks and the current kernel's are
        the protected set."""
        self._dirty = False
        room = (self.capacity[self.gpu] if self.capacity else 1 << 62) - self.watermark
        prot: set[int] = set()
        cur = self._queue.get(self._started)
        if cur is not None:
            prot.update(cur.blocks)
        window = []
        for s, ql in self._queue.items():
            if s <= self._started:
                continue
            new = [b for b in ql.blocks if b not in prot]
            if len(prot) + len(new) > room:
                self.stats_["launch_window_full"] += 1
                break
            prot.update(new)
            window.append(s)
        self._window = window
        self._protected = prot
        self.stats_["launch_windows"] += 1

    def _has_priority(self) -> bool:
        if self._dirty:
            self._refresh()
        return bool(self._window)

    def _priority(self, limit: int) -> tuple[np.ndarray, np.ndarray]:
        """The window's named pieces not yet sent, by block in queue order, up to ``limit``
        blocks; each block with the execution ID of the launch it is first for. What moves is
        the named bytes, not the whole block: at 2 MiB a block holds pieces of several tensors
        (a scaled model's are small), and moving a block whole for one of them carries its
        neighbours in and, once written, back out."""
        out: dict[int, int] = {}
        pieces: dict[int, list[tuple[int, int]]] = {}
        get = self.exec_ids.get
        for s in self._window:
            ql = self._queue[s]
            if not ql.pieces:
                continue
            x = get(ql.exec_hash)
            for b, lo, hi in ql.pieces:
                sent = self._sent.get(b)
                if sent is _WHOLE or (sent is not None and (lo, hi) in sent):
                    continue
                if b not in out:
                    if len(out) >= limit:
                        break
                    out[b] = x
                pieces.setdefault(b, []).append((lo, hi))
            if len(out) >= limit:
                break
        self._pf_pieces = pieces
        self.stats_["launch_offered_blocks"] += len(out)
        return np.fromiter(out.keys(), np.int64, len(out)), np.fromiter(out.values(), np.int64, len(out))

    def _prefetch_commands(self, blocks: np.ndarray, execs: np.ndarray, g: int) -> np.ndarray:
        pieces = self._pf_pieces
        if not pieces:
            return super()._prefetch_commands(blocks, execs, g)
        addr: list[int] = []
        nbytes: list[int] = []
        xs: list[int] = []
        for b, x in zip(blocks.tolist(), execs.tolist()):
            for lo, hi in pieces.get(b, ((b << BLOCK_SHIFT, (b + 1) << BLOCK_SHIFT),)):
                addr.append(lo)
                nbytes.append(hi - lo)
                xs.append(x)
        return commands(Op.PREFETCH, np.array(addr, np.uint64), np.array(nbytes, np.uint64), dst=g,
                        exec_id=np.array(xs, np.int64), priority=1)

    def _step(self, now: int) -> np.ndarray | None:
        fp, self._fault_pieces = self._fault_pieces, {}
        try:
            out = super()._step(now)
        finally:
            self._pf_pieces = {}
        if not fp:
            return out
        # the faulted blocks' named pieces first, as DeepUM's fault queue goes before its walk
        addr: list[int] = []
        nbytes: list[int] = []
        for b, pieces in fp.items():
            sent = self._sent.get(b)
            for lo, hi in pieces:
                addr.append(lo)
                nbytes.append(hi - lo)
            if sent is not None and sent is not _WHOLE:
                sent.update(pieces)   # type: ignore[union-attr]
        self.stats_["launch_fault_pieces"] += len(addr)
        cmds = commands(Op.PREFETCH, np.array(addr, np.uint64), np.array(nbytes, np.uint64), dst=self.gpu,
                        exec_id=self.cur if self.cur is not None else -1, priority=0)
        return cmds if out is None else np.concatenate([cmds, out])

    def _fault(self, b: int, t: int) -> bool:
        """DeepUM's fault handling; where the current kernel's launch was heard while queued and
        DeepUM completes faulted blocks at all (the program has looped), complete only the pieces
        of ``b`` that launch names (module doc), not the whole block."""
        cur = self._queue.get(self._started) if self._looped and self.whole_fault_blocks else None
        if cur is None:
            return super()._fault(b, t)
        queued = b in self.fault_queue
        had = self._sent.get(b)
        restart = super()._fault(b, t)
        if not queued:
            self.fault_queue.pop(b, None)
        # the fault brought part of the block, which part is not known here: what was sent
        # there before stays sent, and the block is not whole (its named pieces stay to send)
        sent = self._sent[b] = set() if had is None or had is _WHOLE else had
        pieces = [(lo, hi) for bb, lo, hi in cur.pieces if bb == b and (lo, hi) not in sent]
        if pieces:
            self._fault_pieces.setdefault(b, []).extend(pieces)
        return restart

    def _mark(self, b: int, t: float) -> None:
        """A block DeepUM now holds: the pieces this step sent there, or all of it (the walk's
        prefetch, a fault, which DeepUM completes)."""
        super()._mark(b, t)
        sent = self._pf_pieces.get(b)
        if sent is None:
            self._sent[b] = _WHOLE
        elif self._sent.get(b) is not _WHOLE:
            self._sent.setdefault(b, set()).update(sent)   # type: ignore[union-attr]

    def _unmark(self, b: int) -> None:
        super()._unmark(b)
        self._sent.pop(b, None)

    # ------------------------------------------------------------------ the known sequence
    def _queued_ids(self) -> list[int]:
        """Execution IDs of the queued launches (after the current kernel), in queue order:
        the kernels that come next, known instead of predicted. IDs are DeepUM's (a new kernel
        gets its ID here rather than at its start; the numbering differs, not the tables)."""
        if self._qids is None:
            get = self.exec_ids.get
            self._qids = [get(ql.exec_hash) for s, ql in self._queue.items() if s > self._started]
        return self._qids

    def _predict_next(self, c) -> int | None:
        """The walk follows the queued launches while they last, then DeepUM's predictions from
        there: an expert the router chose is walked, not last iteration's."""
        q = self._queued_ids()
        k = len(c.path)
        if k < len(q) and c.exec_id == (q[k - 1] if k else self.cur):
            return q[k]
        return super()._predict_next(c)

    def _next_use(self, horizon: int) -> dict[int, int]:
        """DeepUM's next-use ranking (what pre-eviction spares, the budget keeper's order) over
        the queued kernels first, then its predictions beyond them."""
        q = self._queued_ids()
        if not q:
            return super()._next_use(horizon)
        ids = ([self.cur] if self.cur is not None else []) + q[: max(0, horizon - 1)]
        hist = tuple((list(self._hist3()) + ids[:-1])[-3:]) if len(ids) >= 2 else self._hist3()
        return self._first_need(self._predict_on(ids, hist, ids[-1], horizon))  # type: ignore[arg-type]
