"""Units of the UVM driver that every part of umctl shares.

The driver migrates and maps 4 KiB pages inside 2 MiB VA blocks, and evicts whole 2 MiB root
chunks; DeepUM correlates at block granularity. Keeping one definition avoids off-by-shift bugs
between the live path, the simulator and the controllers.
"""

from __future__ import annotations

import re

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


def addr_to_page(addr):
    """Page number of a byte address (works on scalars and numpy arrays)."""
    return np.right_shift(addr, PAGE_SHIFT) if isinstance(addr, np.ndarray) else addr >> PAGE_SHIFT


def addr_to_block(addr):
    """UM block number (2 MiB) of a byte address."""
    return np.right_shift(addr, BLOCK_SHIFT) if isinstance(addr, np.ndarray) else addr >> BLOCK_SHIFT


def page_to_block(page):
    """UM block number of a page number."""
    return np.right_shift(page, PAGE_TO_BLOCK_SHIFT) if isinstance(page, np.ndarray) else page >> PAGE_TO_BLOCK_SHIFT


def block_base(block):
    """First byte address of a UM block."""
    return np.left_shift(block, BLOCK_SHIFT) if isinstance(block, np.ndarray) else block << BLOCK_SHIFT


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
    because GPU memory sizes are quoted in GiB whatever the suffix says."""
    if isinstance(text, (int, float)):
        return int(text)
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"not a size: {text!r} (use e.g. 512MiB, 8GiB, 1.5G)")
    value, unit, _ = m.groups()
    return int(float(value) * (1024 ** _MULT[unit.lower()]))


def format_bytes(n: float) -> str:
    """Human-readable binary size, e.g. '1.50 GiB'."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"
