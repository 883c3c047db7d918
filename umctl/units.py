"""Units of the UVM driver that every part of umctl shares.

The driver migrates and maps 4 KiB pages inside 2 MiB VA blocks, and evicts whole 2 MiB root
chunks; DeepUM correlates at block granularity. Keeping one definition avoids off-by-shift bugs
between the live path, the simulator and the controllers.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

PAGE_SHIFT = 12
PAGE_SIZE = 1 << PAGE_SHIFT  # 4 KiB
BLOCK_SHIFT = 21
BLOCK_SIZE = 1 << BLOCK_SHIFT  # 2 MiB UM block / root chunk
PAGES_PER_BLOCK = BLOCK_SIZE // PAGE_SIZE  # 512
PAGE_TO_BLOCK_SHIFT = BLOCK_SHIFT - PAGE_SHIFT  # 9

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

#: Processor id of the host in events and commands; GPUs are 0..N-1.
CPU = -1


def addr_to_block(addr):
    """UM block number (2 MiB) of a byte address."""
    return np.right_shift(addr, BLOCK_SHIFT) if isinstance(addr, np.ndarray) else addr >> BLOCK_SHIFT


def page_to_block(page):
    """UM block number of a page number."""
    return np.right_shift(page, PAGE_TO_BLOCK_SHIFT) if isinstance(page, np.ndarray) else page >> PAGE_TO_BLOCK_SHIFT


def block_range(addr: int, nbytes: int) -> tuple[int, int]:
    """Half-open range of UM blocks [first, last) covering the byte range."""
    if nbytes <= 0:
        return addr >> BLOCK_SHIFT, addr >> BLOCK_SHIFT
    return addr >> BLOCK_SHIFT, ((addr + nbytes - 1) >> BLOCK_SHIFT) + 1


def pages_in(addr: int, nbytes: int) -> np.ndarray:
    """Page numbers touched by a byte range."""
    if nbytes <= 0:
        return np.empty(0, dtype=np.int64)
    first = addr >> PAGE_SHIFT
    last = (addr + nbytes - 1) >> PAGE_SHIFT
    return np.arange(first, last + 1, dtype=np.int64)


def ranges(starts: np.ndarray | list[int], lengths: np.ndarray | list[int]) -> np.ndarray:
    """Concatenation of ``arange(s, s + n)`` over pairs, without a Python loop."""
    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    seg_start = np.cumsum(lengths) - lengths
    return np.repeat(starts - seg_start, lengths) + np.arange(total, dtype=np.int64)


_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?)b?\s*$", re.IGNORECASE)
_MULT = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}


def parse_size(text: str | int | float) -> int:
    """Parse '8GiB', '512M', '1.5g' or a number of bytes. Binary multiples either way,
    because GPU memory sizes are quoted in GiB whatever the suffix says. ValueError for
    anything that is not a size: a sign, a word, a bool, an infinite or NaN number (sizes are
    never negative, and ``int(inf)`` would be an OverflowError traceback further on)."""
    if isinstance(text, bool):
        raise ValueError(f"not a size: {text!r} (use e.g. 512MiB, 8GiB, 1.5G)")
    if isinstance(text, (int, float)):
        if not math.isfinite(text) or text < 0:
            raise ValueError(f"not a size: {text!r} (a size is a finite number of bytes, at least 0)")
        return int(text)
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"not a size: {text!r} (use e.g. 512MiB, 8GiB, 1.5G)")
    value, unit, _ = m.groups()
    return int(float(value) * (1024 ** _MULT[unit.lower()]))


@dataclass(frozen=True)
class Range:
    """Allowed values of a number: ``lo``..``hi``, either end open; None = unbounded. Every
    value must also be finite."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False

    def __contains__(self, v: float) -> bool:
        try:
            if isinstance(v, bool) or not math.isfinite(v):
                return False
        except (OverflowError, TypeError):   # an int beyond any float, or not a number
            return False
        if self.lo is not None and (v <= self.lo if self.lo_open else v < self.lo):
            return False
        if self.hi is not None and (v >= self.hi if self.hi_open else v > self.hi):
            return False
        return True

    def describe(self) -> str:
        """``at least 1``, ``in (0, 1]``, ``from 1 to 4096``: for one-line errors."""
        def g(x: float) -> str:
            return f"{int(x)}" if float(x).is_integer() and abs(x) < 1e10 else f"{x:g}"
        if self.lo is None and self.hi is None:
            return "finite"
        if self.hi is None:
            return f"{'above' if self.lo_open else 'at least'} {g(self.lo)}"
        if self.lo is None:
            return f"{'below' if self.hi_open else 'at most'} {g(self.hi)}"
        if not self.lo_open and not self.hi_open:
            return f"from {g(self.lo)} to {g(self.hi)}"
        return f"in {'(' if self.lo_open else '['}{g(self.lo)}, {g(self.hi)}{')' if self.hi_open else ']'}"


def format_bytes(n: float) -> str:
    """Human-readable binary size, e.g. '1.50 GiB'."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"
