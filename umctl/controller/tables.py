"""Correlation tables shared by the controller modes.

* :class:`PairCorrelationTable` — pair-based correlation prefetching (DeepUM §4.1, figure 5):
  rows selected by the missed address, ``assoc`` ways per row, ``num_levels`` levels of
  successor misses with ``num_succs`` entries each, MRU ordered. DeepUM uses it at UM-block
  granularity with one level (one table per execution ID); SnuRHAC at page granularity with
  three levels (thesis §6).
* :class:`ExecIdTable` — hash of kernel name + arguments → execution ID (DeepUM §3.1).
* :class:`ExecCorrelationTable` — per execution ID, records of (three previous IDs → next
  ID), a variable number per entry (DeepUM §4.2, figure 6).

They are plain Python containers on purpose: updates are scalar and sparse (a DNN kernel
touches a few blocks), where dict/list operations beat numpy element access, and memory
grows with what is recorded rather than with NumRows x Assoc for every table.
"""

from __future__ import annotations

from typing import Iterable


class PairCorrelationTable:
    """Pair-based correlation table (DeepUM figure 5; Assoc/NumSuccs/NumLevels/NumRows).

    A row holds up to ``assoc`` ways, most recently used first; a way is
    ``[tag, [level-1 successors], [level-2 successors], ...]``, each list MRU first and at
    most ``num_succs`` long. ``last`` is the history of recent misses, most recent first
    (``last[0]`` is *Last*, ``last[1]`` *SecondLast*).
    """

    __slots__ = ("num_rows", "assoc", "num_succs", "num_levels", "rows", "last", "n_entries", "n_evicted",
                 "version")

    def __init__(self, num_rows: int = 2048, assoc: int = 2, num_succs: int = 4, num_levels: int = 1):
        if min(num_rows, assoc, num_succs, num_levels) < 1:
            raise ValueError("table dimensions must be positive")
        self.num_rows = num_rows
        self.assoc = assoc
        self.num_succs = num_succs
        self.num_levels = num_levels
        self.rows: dict[int, list[list]] = {}
        self.last: list[int] = []
        self.n_entries = 0
        self.n_evicted = 0
        #: bumped whenever what ``successors`` returns may change (a successor list or a way
        #: allocated or evicted), so walkers can cache paths through the table
        self.version = 0

    def row_of(self, key: int) -> int:
        """Set index: a multiplicative hash, so that neighbouring blocks (one tensor) spread
        over the rows the way addresses do in a hardware table rather than filling them in
        order."""
        return (((key * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF) >> 32) % self.num_rows

    def _find(self, key: int, touch: bool = True) -> list | None:
        row = self.rows.get(self.row_of(key))
        if row is None:
            return None
        for i, way in enumerate(row):
            if way[0] == key:
                if touch and i:
                    row.insert(0, row.pop(i))
                return way
        return None

    def _allocate(self, key: int) -> list:
        row = self.rows.setdefault(self.row_of(key), [])
        way = [key] + [[] for _ in range(self.num_levels)]
        row.insert(0, way)
        self.version += 1
        if len(row) > self.assoc:
            row.pop()  # the least recently used way of the set
            self.n_evicted += 1
        else:
            self.n_entries += 1
        return way

    def record(self, key: int) -> None:
        """A miss on ``key``: it becomes a level-l successor of the miss l misses ago, gets an
        entry of its own, and becomes *Last*."""
        for level, prev in enumerate(self.last[: self.num_levels]):
            way = self._find(prev, touch=False)
            if way is None:
                continue
            succ = way[1 + level]
            if succ and succ[0] == key:
                continue
            if key in succ:
                succ.remove(key)
            succ.insert(0, key)
            del succ[self.num_succs:]
            self.version += 1
        if self._find(key) is None:
            self._allocate(key)
        self.last.insert(0, key)
        del self.last[self.num_levels:]

    def successors(self, key: int, level: int | None = None) -> list[int]:
        """Successors of ``key`` (MRU first): one level, or every level in order."""
        way = self._find(key, touch=False)
        if way is None:
            return []
        if level is not None:
            return list(way[1 + level])
        out: list[int] = []
        for lv in way[1:]:
            out.extend(k for k in lv if k not in out)
        return out

    def __contains__(self, key: int) -> bool:
        return self._find(key, touch=False) is not None

    def keys(self) -> Iterable[int]:
        for row in self.rows.values():
            for way in row:
                yield way[0]

    def nbytes(self) -> int:
        """Size of the table as a fixed array of 8-byte entries (what a driver would
        allocate: NumRows x Assoc x (1 + NumLevels x NumSuccs))."""
        return self.num_rows * self.assoc * (1 + self.num_levels * self.num_succs) * 8


class ExecIdTable:
    """Execution IDs: the same kernel name + arguments hash gets the same small ID."""

    __slots__ = ("ids",)

    def __init__(self):
        self.ids: dict[int, int] = {}

    def get(self, exec_hash: int) -> int:
        i = self.ids.get(exec_hash)
        if i is None:
            i = self.ids[exec_hash] = len(self.ids)
        return i

    def __len__(self) -> int:
        return len(self.ids)


class ExecCorrelationTable:
    """One table: per execution ID, records (p3, p2, p1) -> next, where p1..p3 are the three
    kernels that ran before it (p1 the most recent). The number of records per entry is not
    bounded, so the whole history of successors is kept (DeepUM §4.2)."""

    __slots__ = ("entries", "fallback")

    def __init__(self, fallback: bool = True):
        self.entries: dict[int, dict[tuple[int, int, int], int]] = {}
        #: predict from the entry's most recent record when no record matches the history
        self.fallback = fallback

    def record(self, prev3: tuple[int, int, int], cur: int, nxt: int) -> None:
        recs = self.entries.setdefault(cur, {})
        recs.pop(prev3, None)  # re-insert: dicts keep insertion order, last = most recent
        recs[prev3] = nxt

    def predict(self, prev3: tuple[int, int, int], cur: int) -> int | None:
        recs = self.entries.get(cur)
        if not recs:
            return None
        nxt = recs.get(prev3)
        if nxt is None and self.fallback:
            nxt = next(reversed(recs.values()))
        return nxt

    def records(self, cur: int) -> list[tuple[int, int, int, int]]:
        """The entry of ``cur`` as (p3, p2, p1, next) tuples, oldest first (figure 6 rows)."""
        return [(*k, v) for k, v in self.entries.get(cur, {}).items()]

    def __len__(self) -> int:
        return sum(len(r) for r in self.entries.values())
