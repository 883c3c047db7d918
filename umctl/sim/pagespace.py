"""Compact page numbering for the simulator.

Real address spaces are sparse (allocations gigabytes apart), but the simulator keeps dense
per-page state arrays. Every 2 MiB block that any allocation (or access) touches gets a
compact block number, so compact page = compact block * 512 + page-in-block and block
alignment is preserved (the density prefetcher and eviction work per block).
"""

from __future__ import annotations

import numpy as np

from ..units import BLOCK_SHIFT, PAGE_TO_BLOCK_SHIFT, PAGES_PER_BLOCK


class PageSpace:
    def __init__(self, alloc_addr: np.ndarray, alloc_bytes: np.ndarray, extra_pages: np.ndarray | None = None):
        starts = np.asarray(alloc_addr, dtype=np.int64) >> BLOCK_SHIFT
        ends = (np.asarray(alloc_addr, dtype=np.int64) + np.maximum(np.asarray(alloc_bytes, dtype=np.int64), 1) - 1) >> BLOCK_SHIFT
        parts = [np.concatenate([np.arange(s, e + 1) for s, e in zip(starts, ends)])] if len(starts) else []
        if extra_pages is not None and len(extra_pages):
            parts.append(np.unique(np.asarray(extra_pages, dtype=np.int64) >> PAGE_TO_BLOCK_SHIFT))
        #: global block number of each compact block, sorted
        self.global_blocks = np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.int64)
        self.nblocks = int(len(self.global_blocks))
        self.npages = self.nblocks * PAGES_PER_BLOCK
        # a dense lookup table when the address space is not too sparse (one gather per page
        # instead of a binary search: replays convert tens of millions of accesses)
        self._lut = None
        if self.nblocks:
            self._b0 = int(self.global_blocks[0])
            span = int(self.global_blocks[-1]) - self._b0 + 1
            if span <= (1 << 24):
                self._lut = np.full(span, -1, np.int64)
                self._lut[self.global_blocks - self._b0] = np.arange(self.nblocks)

    def to_local_pages(self, pages: np.ndarray) -> np.ndarray:
        """Compact page numbers of global page numbers (which must be mapped)."""
        pages = np.asarray(pages, dtype=np.int64)
        gb = pages >> PAGE_TO_BLOCK_SHIFT
        if len(gb) == 0:
            return gb
        if self._lut is not None:
            rel = gb - self._b0
            if rel.min() < 0 or rel.max() >= len(self._lut):
                raise ValueError("page outside the simulated address space")
            cb = self._lut[rel]
            if cb.min() < 0:
                raise ValueError("page outside the simulated address space")
        else:
            cb = np.searchsorted(self.global_blocks, gb)
            if (cb >= self.nblocks).any() or (self.global_blocks[np.minimum(cb, self.nblocks - 1)] != gb).any():
                raise ValueError("page outside the simulated address space")
        return (cb << PAGE_TO_BLOCK_SHIFT) | (pages & (PAGES_PER_BLOCK - 1))

    def to_global_pages(self, local: np.ndarray) -> np.ndarray:
        local = np.asarray(local, dtype=np.int64)
        return (self.global_blocks[local >> PAGE_TO_BLOCK_SHIFT] << PAGE_TO_BLOCK_SHIFT) | (local & (PAGES_PER_BLOCK - 1))

    def block_addr(self) -> np.ndarray:
        """Byte address of every compact block."""
        return self.global_blocks << BLOCK_SHIFT

    def local_range(self, addr: int, nbytes: int) -> list[tuple[int, int]]:
        """Compact page ranges [lo, hi) covering a byte range, clipped to mapped blocks
        (commands on unmapped addresses are ignored by the actuator, as UVM returns an error)."""
        if nbytes <= 0:
            return []
        first_page = addr >> 12
        last_page = (addr + nbytes - 1) >> 12
        b0, b1 = first_page >> PAGE_TO_BLOCK_SHIFT, last_page >> PAGE_TO_BLOCK_SHIFT
        if b0 == b1 and self._lut is not None:  # the common case: a command on one block
            rel = b0 - self._b0
            cb = int(self._lut[rel]) if 0 <= rel < len(self._lut) else -1
            if cb < 0:
                return []
            base = cb << PAGE_TO_BLOCK_SHIFT
            return [(base + (first_page & (PAGES_PER_BLOCK - 1)), base + (last_page & (PAGES_PER_BLOCK - 1)) + 1)]
        i0 = int(np.searchsorted(self.global_blocks, b0))
        i1 = int(np.searchsorted(self.global_blocks, b1, side="right"))
        out = []
        for cb in range(i0, i1):
            gb = int(self.global_blocks[cb])
            lo = max(first_page, gb << PAGE_TO_BLOCK_SHIFT) - (gb << PAGE_TO_BLOCK_SHIFT)
            hi = min(last_page + 1, (gb + 1) << PAGE_TO_BLOCK_SHIFT) - (gb << PAGE_TO_BLOCK_SHIFT)
            out.append(((cb << PAGE_TO_BLOCK_SHIFT) + lo, (cb << PAGE_TO_BLOCK_SHIFT) + hi))
        return out

    def local_span(self, addr: int, nbytes: int) -> tuple[int, int]:
        """The union of :meth:`local_range`'s ranges, as one compact page range: compact
        blocks are numbered without gaps, so the pieces of a byte range on consecutive compact
        blocks continue one another (an allocation of tens of thousands of blocks is one
        slice, not one per block). (0, 0) when nothing is mapped."""
        if nbytes <= 0:
            return 0, 0
        first_page, end_page = addr >> 12, ((addr + nbytes - 1) >> 12) + 1
        i0 = int(np.searchsorted(self.global_blocks, first_page >> PAGE_TO_BLOCK_SHIFT))
        i1 = int(np.searchsorted(self.global_blocks, (end_page - 1) >> PAGE_TO_BLOCK_SHIFT, side="right"))
        if i1 <= i0:
            return 0, 0
        g0, g1 = int(self.global_blocks[i0]), int(self.global_blocks[i1 - 1])
        lo = max(first_page, g0 << PAGE_TO_BLOCK_SHIFT) - (g0 << PAGE_TO_BLOCK_SHIFT)
        hi = min(end_page, (g1 + 1) << PAGE_TO_BLOCK_SHIFT) - (g1 << PAGE_TO_BLOCK_SHIFT)
        return (i0 << PAGE_TO_BLOCK_SHIFT) + lo, ((i1 - 1) << PAGE_TO_BLOCK_SHIFT) + hi
