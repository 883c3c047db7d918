"""An independent check of a GPU-memory budget: the residency the driver actually produced,
from the driver's own events, never from the budget keeper's estimate.

Why a second account: the budget keeper (:mod:`umctl.loop.residency`) holds the budget against
its *estimate*, and clamps that estimate by its own enforcement; its "peak estimate" therefore
cannot disagree with itself. A run whose data stayed on the GPU while the estimate said it had
left would report the budget held. :class:`BudgetCheck` rebuilds residency from what the driver
reports, so the summary can say whether the budget was held.

Contract (what counts, and why):

* **Granularity.** Residency is kept per GPU, per 2 MiB block, as a bitmap of its 4 KiB pages.
  A block counts toward the budget while it holds *any* page on that GPU: the driver backs
  managed memory in 2 MiB root chunks, so one resident page holds a whole chunk of device
  memory. The verdict uses this block-granular residency; the page-granular sum is reported
  beside it.
* **Evidence.** Arrivals on a GPU: MIGRATION records with that GPU as ``dst`` (any cause: demand,
  the driver's density prefetcher, umctl's own prefetches), GPU FAULT records (the faulted 4 KiB
  page: a first touch is populated on the GPU without any migration event) except in ranges the
  runtime reported host-preferred (ALLOC records with op HOST_PREFERRED: the driver serves a GPU
  fault there by mapping the host page, populating and migrating nothing; see *Admission* in
  ``umctl/loop/residency.py``; PEER_PREFERRED likewise with a spare neighbour GPU as the
  preferred location: the page is populated or kept there and the budgeted GPU maps it over the
  GPU link, so the neighbour's arrivals are its own, not the budgeted GPU's), and umctl's own
  PREFETCH/STAGE commands whose RESULT is OK (a migrate of never-populated pages moves nothing
  and reports nothing; ``result_arrivals=False`` for a source that reports every page it brings
  in, as the simulator does). Departures: MIGRATION records with the GPU as ``src`` (our
  pre-evictions, the driver's evictions), EVICTION records (a replay's driver evictions: the
  whole chunk), ALLOC FREE records (every GPU), and umctl's own PREEVICT commands whose RESULT is
  OK (every GPU but the destination, from when the ioctl began: a migrate away leaves
  nothing behind, and live the pages the runtime discarded move without a copy and without a
  migration record; ``result_arrivals=False`` turns this off with the arrivals), and umctl's
  INVALIDATE commands whose RESULT is OK: live, that RESULT is the one of the pre-eviction that
  follows the runtime's discard, sent when it is done. Nothing else removes a page: a discard
  itself reports no event, so discarded pages stay counted until they move or are freed
  (the check errs towards "not held", never towards "held").
* **Time.** Every record is placed at its own ``t_ns`` (arrivals at the copy's begin, departures
  at its end: both err towards more residency). The driver defers migration records, so records
  are held back ``reorder_ms`` and applied in time order; a record later than that is applied at
  the oldest time still open (counted in ``late_records``), except for the pages a newer record of
  the other direction has already settled: a late arrival does not resurrect pages that the
  block's departures newer than it removed (all the records of its latest eviction: the driver
  reports one eviction in several, a run of pages each), and a late departure does not remove
  pages that an arrival newer than it brought (the union of the block's arrivals: when in doubt,
  residency stays). Residency is a step function whose
  value changes once per application (one per :meth:`observe`, i.e. per drain: the records
  applied together take effect at the earliest of their times); the peak, the share of time
  above ``budget + slack`` and the excess integrated over time (GiB·s) are taken from it over the
  observed time (first record to the last time applied). A block that comes and goes within one
  application is therefore not seen in the peak: the resolution is one drain.
* **Faults wait for the runtime's reports.** Whether a GPU fault brought a page in depends on an
  ALLOC HOST_PREFERRED record that comes on another stream (the runtime's datagrams, read by
  another thread of umctl) than the fault (the tools ring). Under load that thread fell behind the
  ring by more than the reorder window (MoE on an H100: deliveries up to 0.8 s late), and faults
  on ranges whose advice had not arrived yet counted as one-page arrivals: a block each, never
  departing (2.5 GiB of blocks holding 1.4 GiB of pages, a false "NOT held"). So where a batch
  says how far the runtime's stream is complete (``EventBatch.runtime_ns``), fault evidence newer
  than that, less :data:`RUNTIME_MARGIN_NS`, is held back, for at most :data:`FAULT_HOLD_MAX_NS`
  past the reorder window (a runtime that goes quiet must not hold the faults for ever).
  Sources without the runtime give no such time and their faults are not held.
* **Verdict.** ``held`` is None (unverified) when the source delivers no migration events
  (``migrations_on=False``; or, when not told, none was seen: events off, an old driver, a source
  without them) or migration records were dropped. A source that delivers them and reported none
  moved nothing between processors, so its faults alone are the residency. Else ``held`` is False when
  the block-granular residency of any budgeted GPU was above ``budget + slack`` for more than
  :data:`MAX_OVER_FRAC` of the observed time, else True.
* **Slack.** ``max(2 % of the budget, 2 blocks)`` plus an in-flight allowance, by default one
  full-size actuator migration (64 MiB, ``UvmActuator.max_ioctl_bytes``): a prefetch of that size
  may land while the eviction that makes room for it is still being copied out on the other
  worker. Transient overshoot between two control steps is not slack: it is what the 1 % of
  time absorbs.

The class imports only :mod:`umctl.events` and :mod:`umctl.units`, so a replay can feed it the
simulator's MIGRATION / EVICTION events as a live session feeds it the driver's.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import asdict, dataclass

import numpy as np

from ..events.schema import KIND_CODES, AllocOp, EventBatch, Kind, Op, Status
from ..units import BLOCK_SHIFT, BLOCK_SIZE, ranges

PAGE_SHIFT = 12
PAGES = BLOCK_SIZE >> PAGE_SHIFT          # 512 pages of 4 KiB in a block
WORDS = PAGES // 64                       # bitmap words per block
#: the budget is "not held" when the true residency is above budget + slack longer than this
#: share of the observed time
MAX_OVER_FRAC = 0.01
#: one full-size actuator migration (UvmActuator.max_ioctl_bytes): the in-flight allowance
IN_FLIGHT_BYTES = 64 << 20
#: time samples kept for the trace / JSON (pairs are merged, keeping the maxima, beyond this)
MAX_SAMPLES = 2048
_ALL = np.uint64(0xFFFF_FFFF_FFFF_FFFF)
#: the runtime flushes its reports every 2 ms (runtime/rt_reports.c): a record stamped this long
#: before the newest one received has been sent
RUNTIME_MARGIN_NS = 20_000_000
#: the longest fault evidence waits for the runtime's stream beyond the reorder window
FAULT_HOLD_MAX_NS = 3_000_000_000


def default_slack(budget_bytes: int, in_flight_bytes: int = IN_FLIGHT_BYTES) -> int:
    """``max(2 % of the budget, 2 blocks) + in_flight_bytes`` (module doc, *Slack*)."""
    return max(int(budget_bytes * 0.02), 2 * BLOCK_SIZE) + int(in_flight_bytes)


def _popcount(words: np.ndarray) -> np.ndarray:
    """Set bits per row of an (n, WORDS) uint64 array."""
    if hasattr(np, "bitwise_count"):
        return np.bitwise_count(words).sum(axis=-1).astype(np.int64)
    b = words.view(np.uint8).reshape(len(words), -1)
    return np.unpackbits(b, axis=1).sum(axis=1).astype(np.int64)


def _masks(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """(n, WORDS) bitmaps of the page ranges [lo, hi) (pages within one block)."""
    base = np.arange(WORDS, dtype=np.int64) * 64
    a = np.clip(lo[:, None] - base, 0, 64)
    b = np.clip(hi[:, None] - base, 0, 64)
    n = (b - a).astype(np.uint64)
    full = n >= 64
    ones = np.where(full, _ALL, (np.uint64(1) << np.where(full, 0, n).astype(np.uint64)) - np.uint64(1))
    out = np.where(n > 0, ones << a.astype(np.uint64), np.uint64(0))
    return out.astype(np.uint64)


class RangeSet:
    """Disjoint byte ranges [lo, hi) with vectorised membership: the target's host-preferred
    managed memory, where a GPU fault maps the host page instead of bringing it in."""

    #: how long a removed range is remembered (see :meth:`contains`): longer than any record
    #: waits (the reorder window plus FAULT_HOLD_MAX_NS) with room to spare
    GONE_KEEP_NS = 10_000_000_000

    def __init__(self) -> None:
        self.lo = np.zeros(0, np.int64)
        self.hi = np.zeros(0, np.int64)
        #: ranges removed at a known time: (lo, hi, t). A fault stamped before the removal was
        #: made while the range was still in the set, and its record may come after the FREE
        #: record that removed it (the two come on different streams): at a program's end the
        #: faults of its last kernels, delivered seconds late, followed the frees of everything
        #: and were counted as first touches of the whole footprint (a false "NOT held")
        self._gone: list[tuple[int, int, int]] = []

    def __len__(self) -> int:
        """Ranges to look in: those in the set and those remembered as removed (so that a
        caller who skips the lookup on an empty set does not skip faults older than a free)."""
        return len(self.lo) + len(self._gone)

    def add(self, lo: int, hi: int) -> None:
        if hi <= lo:
            return
        keep = (self.hi < lo) | (self.lo > hi)          # neither overlapping nor touching
        if not keep.all():
            lo = min(lo, int(self.lo[~keep].min()))
            hi = max(hi, int(self.hi[~keep].max()))
        los, his = np.append(self.lo[keep], lo), np.append(self.hi[keep], hi)
        order = np.argsort(los)
        self.lo, self.hi = los[order], his[order]

    def remove(self, lo: int, hi: int, t: int | None = None) -> None:
        """Take [lo, hi) out; with its time ``t``, remember it for faults older than that."""
        if hi <= lo or not len(self.lo):
            return
        if t is not None and ((self.lo < hi) & (self.hi > lo)).any():
            self._gone = [g for g in self._gone if g[2] > t - self.GONE_KEEP_NS]
            self._gone.append((lo, hi, int(t)))
        left = (self.lo < lo) & (self.hi > lo)            # a range sticking out on the left
        right = (self.lo < hi) & (self.hi > hi)           # ... on the right
        los = np.concatenate([self.lo[(self.hi <= lo) | (self.lo >= hi)], self.lo[left], np.full(int(right.sum()), hi)])
        his = np.concatenate([self.hi[(self.hi <= lo) | (self.lo >= hi)], np.full(int(left.sum()), lo), self.hi[right]])
        order = np.argsort(los)
        self.lo, self.hi = los[order], his[order]

    def contains(self, addr: np.ndarray, t: np.ndarray | None = None) -> np.ndarray:
        """Per address: whether it lies in one of the ranges; with per-address times ``t``,
        also in a range removed after that time (the set as it was when the address was used)."""
        addr = np.asarray(addr, np.int64)
        if not len(self.lo):
            out = np.zeros(len(addr), bool)
        else:
            i = np.searchsorted(self.lo, addr, side="right") - 1
            out = (i >= 0) & (addr < self.hi[np.maximum(i, 0)])
        if t is not None and self._gone:
            t = np.asarray(t, np.int64)
            for lo, hi, tg in self._gone:
                out |= (addr >= lo) & (addr < hi) & (t < tg)
        return out

    def observe(self, allocs: np.ndarray) -> None:
        """Fold a batch's ALLOC records: HOST_PREFERRED and PEER_PREFERRED add their range (a
        budgeted GPU's fault there maps the page where it is preferred), FREE removes it."""
        for t, op, addr, n in zip(allocs["t_ns"].tolist(), allocs["op"].tolist(), allocs["addr"].tolist(),
                                  allocs["bytes"].tolist()):
            if op in (AllocOp.HOST_PREFERRED, AllocOp.PEER_PREFERRED):
                self.add(addr, addr + n)
            elif op == AllocOp.FREE:
                self.remove(addr, addr + n, t)


@dataclass
class BudgetVerdict:
    """What :class:`BudgetCheck` found (bytes; times in seconds). ``held``: True, False, or
    None when it could not be verified (no migration events, or some were dropped)."""

    budget_bytes: int
    slack_bytes: int
    true_peak_bytes: int             # block-granular (what the verdict uses)
    true_peak_page_bytes: int        # page-granular
    estimate_peak_bytes: int | None  # the keeper's own figure, for comparison (None: not given)
    time_over_frac: float            # share of observed time above budget + slack
    over_peak_bytes: int             # peak excess above budget + slack
    over_gib_s: float                # excess above budget + slack integrated over time
    held: bool | None
    observed_s: float
    migrations_seen: int
    late_records: int = 0
    dropped_migrations: int = 0
    #: GPU faults on host-preferred pages: served remotely, so not counted as arrivals
    faults_mapped_remote: int = 0
    #: GPU faults counted as arrivals (first touches of pages not reported host-preferred)
    fault_arrivals: int = 0
    #: blocks holding some but not all of their pages at the end of the run
    partial_blocks: int = 0
    why: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


class BudgetCheck:
    """Fed every drained batch (:meth:`observe`), keeps the GPUs' true managed residency and
    judges ``budget_bytes`` on ``gpus`` (the budgeted GPUs; others are tracked, not judged).
    ``slack_bytes`` defaults to :func:`default_slack`."""

    def __init__(self, budget_bytes: int, gpus=(0,), *, slack_bytes: int | None = None,
                 reorder_ms: float = 100.0, migrations_on: bool | None = None, result_arrivals: bool = True):
        self.budget = int(budget_bytes)
        #: whether the source delivers migration events (True / False; None: judge by whether any
        #: came). With them on, a run that moved nothing reports none and is judged from its
        #: faults alone; with them off, nothing that left the GPU could be seen
        self.migrations_on = migrations_on
        #: whether an OK PREFETCH/STAGE result counts its whole range as arrived (the live driver
        #: reports no event for a migrate of never-populated pages); False for a source that
        #: reports every page it brings in (the simulator), where the range may hold pages the
        #: model never brought
        self.result_arrivals = result_arrivals
        self.gpus = [int(g) for g in gpus] or [0]
        self.slack = default_slack(self.budget) if slack_bytes is None else int(slack_bytes)
        self.limit = self.budget + self.slack
        self.reorder_ns = int(reorder_ms * 1e6)
        self._slot: dict[int, int] = {}                 # (block << 8 | gpu) -> row
        self._bits = np.zeros((64, WORDS), np.uint64)
        self._slot_gpu = np.zeros(64, np.int64)
        self._slot_block = np.zeros(64, np.int64)
        # per slot: the newest arrival time and the union of arrived pages; the newest departure
        # time and the pages of every departure since the block last arrived (module doc, *Time*:
        # what a late record may not undo)
        self._set_t = np.full(64, np.iinfo(np.int64).min, np.int64)
        self._set_mask = np.zeros((64, WORDS), np.uint64)
        self._clr_t = np.full(64, np.iinfo(np.int64).min, np.int64)
        self._clr_mask = np.zeros((64, WORDS), np.uint64)
        self._pending: list[tuple[np.ndarray, ...]] = []   # (t, gpu, addr, end, set?, fault?) arrays
        #: how far the runtime's report stream is complete (module doc, *Faults wait*); None:
        #: no runtime stream, faults are judged at the reorder window like everything else
        self.runtime_ns: int | None = None
        self.fault_arrivals = 0         # fault records counted as arrivals (first touches)
        #: host-preferred ranges (module doc, *Evidence*): faults there bring nothing in
        self.host_preferred = RangeSet()
        self.fault_records_mapped = 0   # GPU faults on host-preferred pages (not arrivals)
        #: PREFETCH/STAGE/PREEVICT cmd_id -> (addr, bytes, dst, whether it moves data away)
        self._cmds: dict[int, tuple[int, int, int, bool]] = {}
        self.blocks: dict[int, int] = {}                  # gpu -> resident blocks
        self.pages: dict[int, int] = {}                   # gpu -> resident pages
        self.t0: int | None = None
        self.t_applied: int | None = None
        self.migrations = 0
        self.late = 0
        self.dropped_migrations = 0
        self.peak_blocks = 0
        self.peak_pages = 0
        self.over_ns = 0
        self.over_byte_ns = 0.0
        self.over_peak = 0
        self.series: list[list[float]] = []   # [t_s, block bytes, page bytes] of the judged GPUs (max)
        #: UMCTL_BUDGET_CHECK_DUMP=FILE: every batch's evidence, in the order it came, streamed
        #: to FILE (FILE.N for the N-th check of the process after the first). Why: a verdict
        #: depends on the order and grouping in which the streams arrive, which a recorded trace
        #: (written in time order, and whose writing slows the loop) does not keep; this is the
        #: check's own input, to judge again offline (:func:`judge_dump`)
        self._dump_path = os.environ.get("UMCTL_BUDGET_CHECK_DUMP") or None
        self._dump_fh = None

    # -- input ----------------------------------------------------------------------------
    def observe(self, batch: EventBatch) -> None:
        """Take one batch's evidence (module doc) and apply what is older than the reorder
        window."""
        rt = batch.runtime_ns
        if rt is not None:
            self.runtime_ns = max(self.runtime_ns or rt, rt)
        parts: list[tuple[np.ndarray, ...]] = []
        al = batch[Kind.ALLOC]
        if len(al):   # first: this batch's advice judges this batch's faults
            self.host_preferred.observe(al)
        m = batch[Kind.MIGRATION]
        if len(m):
            self.migrations += len(m)
            end = m["addr"].astype(np.int64) + m["bytes"].astype(np.int64)
            into = m["dst"] >= 0
            if into.any():
                parts.append((m["t_ns"][into], m["dst"][into].astype(np.int64), m["addr"][into].astype(np.int64),
                              end[into], np.ones(int(into.sum()), bool), np.zeros(int(into.sum()), bool)))
            out = m["src"] >= 0
            if out.any():
                t_end = np.where(m["t_end_ns"] > m["t_ns"], m["t_end_ns"], m["t_ns"])
                parts.append((t_end[out], m["src"][out].astype(np.int64), m["addr"][out].astype(np.int64),
                              end[out], np.zeros(int(out.sum()), bool), np.zeros(int(out.sum()), bool)))
        f = batch[Kind.FAULT]
        n_mapped = 0
        if len(f):
            f = f[f["gpu"] >= 0]
            fa = f["addr"].astype(np.int64) & ~np.int64(4095)
            if len(self.host_preferred) and len(fa):
                # advice already known: mapped, not arrivals (the rest is judged when applied,
                # after its advice has had time to come)
                mapped = self.host_preferred.contains(fa, f["t_ns"])
                n_mapped = int(mapped.sum())
                self.fault_records_mapped += n_mapped
                f, fa = f[~mapped], fa[~mapped]
            if len(f):
                parts.append((f["t_ns"], f["gpu"].astype(np.int64), fa, fa + 4096, np.ones(len(f), bool),
                              np.ones(len(f), bool)))
        if self._dump_path is not None:
            self._dump_batch(batch, f, n_mapped)
        e = batch[Kind.EVICTION]
        if len(e):
            a = (e["addr"].astype(np.int64) >> BLOCK_SHIFT) << BLOCK_SHIFT
            parts.append((e["t_ns"], e["gpu"].astype(np.int64), a, a + BLOCK_SIZE, np.zeros(len(e), bool),
                          np.zeros(len(e), bool)))
        c = batch[Kind.COMMAND]
        for cid, op, addr, n, dst in zip(c["cmd_id"].tolist(), c["op"].tolist(), c["addr"].tolist(),
                                         c["bytes"].tolist(), c["dst"].tolist()):
            if op in (Op.PREFETCH, Op.STAGE) and dst >= 0 and cid >= 0 and self.result_arrivals:
                self._cmds[cid] = (addr, n, dst, False)
            elif op == Op.PREEVICT and cid >= 0 and self.result_arrivals:
                self._cmds[cid] = (addr, n, dst, True)
            elif op == Op.INVALIDATE and cid >= 0 and self.result_arrivals:
                # live, its RESULT is that of the follow-up pre-eviction to the CPU, sent when the
                # block has left (actuators/uvm.py, _invalidate_elsewhere)
                self._cmds[cid] = (addr, n, -1, True)
        r = batch[Kind.RESULT]
        if len(r) and self._cmds:
            rows = []
            for t, cid, st, lat in zip(r["t_ns"].tolist(), r["cmd_id"].tolist(), r["status"].tolist(),
                                       r["latency_ns"].tolist()):
                cmd = self._cmds.pop(cid, None)
                if cmd is None:
                    continue
                if cmd[3]:
                    # a pre-eviction done: the range is on no GPU but its destination (SKIPPED
                    # is a pre-eviction that a newer command for the block superseded: the block
                    # stays where that command puts it). The driver reports no migration for pages the runtime had
                    # discarded (they move without a copy), so without this they would stay counted.
                    # Placed when the ioctl began (RESULT time less its latency): a page that came
                    # back while it ran keeps its newer arrival
                    if st == Status.OK:
                        # every GPU known, not only those with pages applied: the range's arrival
                        # may still be held back in the reorder window
                        n_slots = len(self._slot)
                        gpus = (set(self.gpus) | set(self._slot_gpu[:n_slots].tolist())) - {cmd[2]}
                        k = len(gpus)
                        if k:
                            parts.append((np.full(k, t - max(0, lat), np.int64), np.array(sorted(gpus), np.int64),
                                          np.full(k, cmd[0], np.int64), np.full(k, cmd[0] + cmd[1], np.int64),
                                          np.zeros(k, bool), np.zeros(k, bool)))
                elif st == Status.OK:
                    rows.append((t, cmd[2], cmd[0], cmd[0] + cmd[1]))
            if rows:
                x = np.array(rows, np.int64)
                parts.append((x[:, 0], x[:, 1], x[:, 2], x[:, 3], np.ones(len(x), bool), np.zeros(len(x), bool)))
        if len(al):
            for t, op, addr, n in zip(al["t_ns"].tolist(), al["op"].tolist(), al["addr"].tolist(), al["bytes"].tolist()):
                if op == AllocOp.FREE and n > 0:
                    parts += self._free_ops(t, addr, addr + n)
        d = batch[Kind.DROPS]
        if len(d):
            self.dropped_migrations += int(d["count"][d["kind"] == KIND_CODES[Kind.MIGRATION]].sum())
        if parts:
            t_min = min(int(p[0].min()) for p in parts if len(p[0]))
            if self.t_applied is None and (self.t0 is None or t_min < self.t0):
                self.t0 = t_min        # observed time starts at the first record
            self._pending.append(tuple(np.concatenate([p[i] for p in parts]) for i in range(6)))
        if self.t0 is None:
            return
        t_max = max([int(p[0].max()) for p in self._pending if len(p[0])] + [int(batch.now_ns)])
        self._apply(t_max - self.reorder_ns)

    def _free_ops(self, t: int, lo: int, hi: int) -> list[tuple[np.ndarray, ...]]:
        """Clear [lo, hi) on every GPU, for the blocks that have pages anywhere."""
        n = len(self._slot)
        if not n:
            return []
        blk = self._slot_block[:n]
        sel = np.flatnonzero((blk >= lo >> BLOCK_SHIFT) & (blk <= (hi - 1) >> BLOCK_SHIFT))
        if not len(sel):
            return []
        b = blk[sel]
        s = np.maximum(b << BLOCK_SHIFT, lo)
        e = np.minimum((b + 1) << BLOCK_SHIFT, hi)
        return [(np.full(len(sel), t, np.int64), self._slot_gpu[sel], s, e, np.zeros(len(sel), bool),
                 np.zeros(len(sel), bool))]

    def finish(self, now_ns: int | None = None) -> None:
        """Apply everything still held back (the end of the session: every stream is in)."""
        t = max([int(p[0].max()) for p in self._pending if len(p[0])] + [int(now_ns or 0), self.t_applied or 0])
        if self.runtime_ns is not None:
            self.runtime_ns = max(self.runtime_ns, t + 1 + RUNTIME_MARGIN_NS)
        self._apply(t + 1)
        if self._dump_fh is not None:
            pickle.dump(("finish", now_ns), self._dump_fh)
            self._dump_fh.close()
            self._dump_fh = None
            self._dump_path = None

    @property
    def dumping(self) -> bool:
        """Whether this check's input is being dumped (``UMCTL_BUDGET_CHECK_DUMP``)."""
        return self._dump_path is not None

    def note(self, rec: tuple) -> None:
        """Put ``rec`` in the dump between the batches (the control loop puts the keeper's
        resident blocks there, for :func:`keeper_disagreement`); nothing when not dumping."""
        if self._dump_fh is not None:
            pickle.dump(("note", rec), self._dump_fh)

    def _dump_batch(self, batch: EventBatch, faults: np.ndarray, n_mapped: int) -> None:
        """One batch of the check's input to the dump file (module attribute ``_dump_path``):
        its records, but of its faults only ``faults``, those :meth:`observe` kept; the
        ``n_mapped`` it dropped on ranges already known host-preferred are only counted (most of
        a run's records; fed again after the batch's own advice, the kept ones stay kept)."""
        global _DUMPS
        if self._dump_fh is None:
            path = self._dump_path if not _DUMPS else f"{self._dump_path}.{_DUMPS}"
            _DUMPS += 1
            self._dump_fh = open(path, "wb")
            pickle.dump({"budget": self.budget, "gpus": self.gpus, "slack": self.slack,
                         "reorder_ns": self.reorder_ns, "migrations_on": self.migrations_on,
                         "result_arrivals": self.result_arrivals}, self._dump_fh)
        kinds = {k: batch[k].copy() for k in (Kind.ALLOC, Kind.MIGRATION, Kind.EVICTION, Kind.COMMAND, Kind.RESULT,
                                              Kind.DROPS) if len(batch[k])}
        if len(faults):
            kinds[Kind.FAULT] = faults.copy()
        pickle.dump((int(batch.now_ns), batch.runtime_ns, kinds, n_mapped), self._dump_fh)

    # -- state ----------------------------------------------------------------------------
    def _rows(self, keys: np.ndarray) -> np.ndarray:
        uk, inv = np.unique(keys, return_inverse=True)
        rows = np.empty(len(uk), np.int64)
        for i, k in enumerate(uk.tolist()):
            r = self._slot.get(k)
            if r is None:
                r = self._slot[k] = len(self._slot)
                if r >= len(self._bits):
                    grow = len(self._bits)
                    self._bits = np.concatenate([self._bits, np.zeros((grow, WORDS), np.uint64)])
                    self._slot_gpu = np.concatenate([self._slot_gpu, np.zeros(grow, np.int64)])
                    self._slot_block = np.concatenate([self._slot_block, np.zeros(grow, np.int64)])
                    lo_t = np.full(grow, np.iinfo(np.int64).min, np.int64)
                    self._set_t = np.concatenate([self._set_t, lo_t])
                    self._clr_t = np.concatenate([self._clr_t, lo_t])
                    self._set_mask = np.concatenate([self._set_mask, np.zeros((grow, WORDS), np.uint64)])
                    self._clr_mask = np.concatenate([self._clr_mask, np.zeros((grow, WORDS), np.uint64)])
                self._slot_gpu[r], self._slot_block[r] = k & 0xFF, k >> 8
            rows[i] = r
        return rows[inv.reshape(-1)]

    def _apply(self, horizon: int) -> None:
        """Apply the held-back records up to ``horizon`` in time order, then account the time
        since the last application at the new residency."""
        if not self._pending:
            self._account(horizon)
            return
        t, g, lo, hi, up, fault = (np.concatenate([p[i] for p in self._pending]) for i in range(6))
        if fault.any() and len(self.host_preferred):
            # judged again at apply time: the runtime's HOST_PREFERRED record is stamped before
            # any fault on its range, and faults wait for its stream (module doc, *Faults wait*)
            mapped = fault & self.host_preferred.contains(lo, t)
            if mapped.any():
                self.fault_records_mapped += int(mapped.sum())
                keep = ~mapped
                t, g, lo, hi, up, fault = t[keep], g[keep], lo[keep], hi[keep], up[keep], fault[keep]
                if not len(t):
                    self._pending = []
                    self._account(horizon)
                    return
        torig = t
        wait = None
        if self.runtime_ns is not None and fault.any():
            # fault evidence waits until the runtime's reports of its time are in (module doc);
            # a record waiting is neither due nor late, and keeps its own time
            fault_horizon = min(horizon, max(self.runtime_ns - RUNTIME_MARGIN_NS, horizon - FAULT_HOLD_MAX_NS))
            wait = fault & (t > fault_horizon)
        if self.t_applied is not None:
            late = t < self.t_applied
            if wait is not None:
                late &= ~wait
            if late.any():
                self.late += int(late.sum())
                t = np.where(late, self.t_applied, t)
        now = t <= horizon
        if wait is not None:
            now &= ~wait
        # records held back keep their own time (a clamped one is due now, never held back)
        self._pending = [tuple(x[~now] for x in (t, g, lo, hi, up, fault))] if (~now).any() else []
        if not now.any():
            self._account(horizon)
            return
        self.fault_arrivals += int((now & fault).sum())
        t, g, lo, hi, up, torig = t[now], g[now], lo[now], hi[now], up[now], torig[now]
        # split every range at block boundaries
        b0, b1 = lo >> BLOCK_SHIFT, (hi - 1) >> BLOCK_SHIFT
        reps = (b1 - b0 + 1).astype(np.int64)
        idx = np.repeat(np.arange(len(t)), reps)
        blk = ranges(b0, reps)
        s = np.maximum(blk << BLOCK_SHIFT, lo[idx]) - (blk << BLOCK_SHIFT)
        e = np.minimum((blk + 1) << BLOCK_SHIFT, hi[idx]) - (blk << BLOCK_SHIFT)
        masks = _masks(s >> PAGE_SHIFT, (e + 4095) >> PAGE_SHIFT)
        rows = self._rows((blk << 8) | g[idx])
        tt, upp, to = t[idx], up[idx], torig[idx]
        late_piece = np.flatnonzero(to < tt)
        for k in late_piece.tolist():      # rare: records later than the reorder window
            r = rows[k]
            if upp[k] and to[k] < self._clr_t[r]:
                masks[k] &= ~self._clr_mask[r]      # a newer departure removed these already
            elif not upp[k] and to[k] < self._set_t[r]:
                masks[k] &= ~self._set_mask[r]      # a newer arrival brought these back
        self._remember(rows, to, upp, masks)
        order = np.lexsort((np.arange(len(rows)), tt, rows))
        rows, tt, upp, masks = rows[order], tt[order], upp[order], masks[order]
        start = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
        urows = rows[start]
        old = self._bits[urows].copy()
        any_set = np.logical_or.reduceat(upp, start)
        any_clr = np.logical_or.reduceat(~upp, start)
        orm = np.bitwise_or.reduceat(masks, start, axis=0)
        new = np.where(any_set[:, None], old | orm, old & ~orm)
        for j in np.flatnonzero(any_set & any_clr).tolist():   # both in one window: in time order
            stop = start[j + 1] if j + 1 < len(start) else len(rows)
            w = old[j].copy()
            for k in range(start[j], stop):
                w = (w | masks[k]) if upp[k] else (w & ~masks[k])
            new[j] = w
        self._account(int(t.min()))   # the residency before these records held until the first
        self._bits[urows] = new
        dp = _popcount(new) - _popcount(old)
        db = (_popcount(new) > 0).astype(np.int64) - (_popcount(old) > 0).astype(np.int64)
        gg = self._slot_gpu[urows]
        for gpu in np.unique(gg).tolist():
            sel = gg == gpu
            self.pages[gpu] = self.pages.get(gpu, 0) + int(dp[sel].sum())
            self.blocks[gpu] = self.blocks.get(gpu, 0) + int(db[sel].sum())
        self._account(horizon, changed=True)

    def _remember(self, rows: np.ndarray, t: np.ndarray, up: np.ndarray, masks: np.ndarray) -> None:
        """Per slot: newest arrival time and all arrived pages; newest departure time and the pages
        of every departure since the block last arrived."""
        if up.any():
            np.maximum.at(self._set_t, rows[up], t[up])
            np.bitwise_or.at(self._set_mask, rows[up], masks[up])
        down = np.flatnonzero(~up)
        for k in down[np.argsort(t[down], kind="stable")].tolist():
            r = rows[k]
            if t[k] >= self._clr_t[r]:
                # the driver reports one eviction of a block in several records (one per run of
                # resident pages): the departure on record is all of them since the block last
                # arrived, so a late arrival older than them cannot bring back the earlier pieces
                if self._set_t[r] > self._clr_t[r]:
                    self._clr_mask[r] = masks[k]
                else:
                    self._clr_mask[r] |= masks[k]
                self._clr_t[r] = t[k]

    def _account(self, horizon: int, changed: bool = False) -> None:
        """The residency now holds from the last application to ``horizon``."""
        if self.t0 is None:
            return
        prev = self.t_applied if self.t_applied is not None else self.t0
        if horizon < prev or (horizon == prev and not changed):
            return
        blocks = max((self.blocks.get(g, 0) for g in self.gpus), default=0) * BLOCK_SIZE
        pages = max((self.pages.get(g, 0) for g in self.gpus), default=0) << PAGE_SHIFT
        dt = max(0, horizon - prev)
        over = blocks - self.limit
        if over > 0:
            self.over_ns += dt
            self.over_byte_ns += over * dt
            self.over_peak = max(self.over_peak, over)
        self.peak_blocks = max(self.peak_blocks, blocks)
        self.peak_pages = max(self.peak_pages, pages)
        self.t_applied = max(prev, horizon)
        self._sample((self.t_applied - self.t0) / 1e9, blocks, pages)

    def _sample(self, t_s: float, blocks: int, pages: int) -> None:
        s = self.series
        if s and s[-1][1] == blocks and s[-1][2] == pages:
            s[-1][0] = t_s        # unchanged: extend the last sample
            return
        s.append([round(t_s, 6), blocks, pages])
        if len(s) > MAX_SAMPLES:   # merge pairs, keeping each pair's later time and maxima
            self.series = [[b[0], max(a[1], b[1]), max(a[2], b[2])] for a, b in zip(s[0::2], s[1::2])] + \
                          ([s[-1]] if len(s) % 2 else [])

    # -- output ---------------------------------------------------------------------------
    def resident_bytes(self, gpu: int = 0, *, pages: bool = False) -> int:
        """Applied residency of one GPU now (block-granular unless ``pages``)."""
        return (self.pages.get(gpu, 0) << PAGE_SHIFT) if pages else self.blocks.get(gpu, 0) * BLOCK_SIZE

    def verdict(self, estimate_peak_bytes: int | None = None) -> BudgetVerdict:
        observed = (self.t_applied - self.t0) if (self.t0 is not None and self.t_applied is not None) else 0
        frac = self.over_ns / observed if observed > 0 else 0.0
        if self.migrations_on is False or (self.migrations_on is None and not self.migrations):
            held, why = None, "no migration events seen (migration events off, or a driver or source without them)"
        elif self.dropped_migrations:
            held, why = None, f"{self.dropped_migrations:,} migration events were dropped"
        elif frac > MAX_OVER_FRAC:
            held, why = False, (f"resident above budget + slack for {100 * frac:.1f} % of the observed time "
                                f"(more than {100 * MAX_OVER_FRAC:g} %)")
        else:
            held, why = True, ""
        return BudgetVerdict(
            budget_bytes=self.budget, slack_bytes=self.slack, true_peak_bytes=self.peak_blocks,
            true_peak_page_bytes=self.peak_pages, estimate_peak_bytes=estimate_peak_bytes,
            time_over_frac=round(frac, 6), over_peak_bytes=self.over_peak,
            over_gib_s=round(self.over_byte_ns / 1e9 / (1 << 30), 6), held=held, observed_s=round(observed / 1e9, 6),
            migrations_seen=self.migrations, late_records=self.late, dropped_migrations=self.dropped_migrations,
            faults_mapped_remote=self.fault_records_mapped, fault_arrivals=self.fault_arrivals,
            partial_blocks=self.partial_blocks(), why=why)

    def partial_blocks(self) -> int:
        """Blocks on the judged GPUs holding some but not all of their pages now: what makes
        the block-granular residency exceed the page-granular one."""
        n = len(self._slot)
        if not n:
            return 0
        pop = _popcount(self._bits[:n])
        return int(((pop > 0) & (pop < PAGES) & np.isin(self._slot_gpu[:n], self.gpus)).sum())


#: dump files opened by this process (:meth:`BudgetCheck._dump_batch`)
_DUMPS = 0


def _replay_dump(path: str, on_note=None, **overrides) -> BudgetCheck:
    """A check fed a dump's batches again in the order they came (``on_note(check, rec)`` at
    each note), finished."""
    with open(path, "rb") as fh:
        d = pickle.load(fh)
        kw = {"slack_bytes": d["slack"], "reorder_ms": d["reorder_ns"] / 1e6, "migrations_on": d["migrations_on"],
              "result_arrivals": d["result_arrivals"]} | overrides
        chk = BudgetCheck(d["budget"], d["gpus"], **kw)
        chk._dump_path = None
        finish_ns = None
        while True:
            try:
                rec = pickle.load(fh)
            except EOFError:      # a run that ended before finish(): judged as far as it got
                break
            if rec[0] == "finish":
                finish_ns = rec[1]
                break
            if rec[0] == "note":
                if on_note is not None:
                    on_note(chk, rec[1])
                continue
            now, rt, kinds, mapped = rec
            b = EventBatch(now_ns=now)
            b.runtime_ns = rt
            for k, a in kinds.items():
                b.add(k, a)
            chk.fault_records_mapped += mapped
            chk.observe(b)
    chk.finish(finish_ns)
    return chk


def judge_dump(path: str, **overrides) -> BudgetVerdict:
    """The verdict on a check's own input dumped by a live run (``UMCTL_BUDGET_CHECK_DUMP``),
    fed again batch by batch in the order it came; ``overrides`` change the check's settings
    (e.g. ``reorder_ms``) to see what the verdict depends on."""
    return _replay_dump(path, **overrides).verdict()


def keeper_disagreement(path: str, examples: int = 16) -> list[dict]:
    """At each of the keeper's snapshots in a dump (every 25 control steps), the blocks the
    check counts resident on that GPU and the keeper does not, and the other way round (counts
    and a few block numbers): where a "NOT held" comes from, and whose account is wrong. The
    check's view lags the keeper's by its reorder window."""
    out: list[dict] = []

    def at(chk: BudgetCheck, rec: tuple) -> None:
        if rec[0] != "keeper":
            return
        _, g, t, keeper = rec
        n = len(chk._slot)
        pop = _popcount(chk._bits[:n]) if n else np.zeros(0, np.int64)
        mine = set(chk._slot_block[:n][(pop > 0) & (chk._slot_gpu[:n] == g)].tolist()) if n else set()
        theirs = set(keeper)
        only_check, only_keeper = sorted(mine - theirs), sorted(theirs - mine)
        out.append({"gpu": g, "t_ns": t, "check_applied_ns": chk.t_applied, "check_blocks": len(mine),
                    "keeper_blocks": len(theirs), "only_check": len(only_check), "only_keeper": len(only_keeper),
                    "only_check_examples": only_check[:examples], "only_keeper_examples": only_keeper[:examples]})

    _replay_dump(path, on_note=at)
    return out


__all__ = ["BudgetCheck", "BudgetVerdict", "RangeSet", "default_slack", "judge_dump", "keeper_disagreement",
           "MAX_OVER_FRAC", "IN_FLIGHT_BYTES"]
