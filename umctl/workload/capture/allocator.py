"""PyTorch's CUDA caching allocator, as a plan: where each tensor storage of a captured program
lives, in which segment (one cudaMalloc, here one managed allocation) at which offset.

The rules are those of c10/cuda/CUDACachingAllocator.cpp with its default settings (no
``max_split_size_mb``, no expandable segments, one stream): requests rounded up to 512 B; a
*small* pool for requests up to 1 MiB, carved from 2 MiB segments, and a *large* pool whose
segments are 20 MiB for requests under 10 MiB and the request rounded up to 2 MiB above; a
request takes the smallest free block of its pool that fits (best fit, lowest address among
equals) and splits it when the remainder is worth keeping (at least 512 B in the small pool,
more than 1 MiB in the large one); a freed block merges with free neighbours of its segment.
Segments are never returned (no ``empty_cache``; under managed memory cudaMalloc never fails,
so the allocator never frees its cache to retry). The plan is why a steady training step hands
out the same addresses every iteration, which is what DeepUM's execution IDs and the oracle's
dead-block invalidation rely on.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20
SMALL_BUFFER = 2 << 20
LARGE_BUFFER = 20 << 20
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20


def round_size(nbytes: int) -> int:
    return MIN_BLOCK if nbytes < MIN_BLOCK else (nbytes + MIN_BLOCK - 1) // MIN_BLOCK * MIN_BLOCK


def segment_size(size: int) -> int:
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return (size + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE


@dataclass
class Segment:
    index: int
    size: int
    small: bool
    #: offsets of its blocks, in order; block sizes and states by offset
    offsets: list[int] = field(default_factory=list)
    sizes: dict[int, int] = field(default_factory=dict)
    used: dict[int, bool] = field(default_factory=dict)


@dataclass(frozen=True)
class Placement:
    """Where an allocation landed: segment, byte offset in it, and the block's size (the
    rounded request, or more where the remainder was too small to split off)."""

    segment: int
    offset: int
    size: int


class CachingAllocator:
    """The allocator's state over a sequence of ``malloc(key, nbytes)`` / ``free(key)``."""

    def __init__(self) -> None:
        self.segments: list[Segment] = []
        self._free = {True: [], False: []}     # pool (small?) -> sorted [(size, segment, offset)]
        self.live: dict[object, Placement] = {}
        self.allocated = 0                     # bytes in blocks handed out now
        self.peak_allocated = 0

    @property
    def reserved(self) -> int:
        return sum(s.size for s in self.segments)

    def malloc(self, key: object, nbytes: int) -> tuple[Placement, bool]:
        """Place ``key``; returns its placement and whether a new segment was made for it."""
        if key in self.live:
            raise ValueError(f"allocation {key!r} is live already")
        size = round_size(int(nbytes))
        small = size <= SMALL_SIZE
        pool = self._free[small]
        i = bisect.bisect_left(pool, (size, -1, -1))
        new_segment = i == len(pool)
        if new_segment:
            seg = Segment(len(self.segments), segment_size(size), small)
            self.segments.append(seg)
            seg.offsets.append(0)
            seg.sizes[0], seg.used[0] = seg.size, False
            block_size, si, off = seg.size, seg.index, 0
        else:
            block_size, si, off = pool.pop(i)
        seg = self.segments[si]
        rest = block_size - size
        if rest >= MIN_BLOCK if small else rest > SMALL_SIZE:
            seg.sizes[off] = size
            k = bisect.bisect_left(seg.offsets, off)
            seg.offsets.insert(k + 1, off + size)
            seg.sizes[off + size], seg.used[off + size] = rest, False
            bisect.insort(pool, (rest, si, off + size))
        else:
            size = block_size
        seg.used[off] = True
        p = Placement(si, off, size)
        self.live[key] = p
        self.allocated += size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return p, new_segment

    def free(self, key: object) -> Placement:
        p = self.live.pop(key)
        self.allocated -= p.size
        seg = self.segments[p.segment]
        pool = self._free[seg.small]
        off, size = p.offset, p.size
        seg.used[off] = False
        k = bisect.bisect_left(seg.offsets, off)
        # merge with the next block, then with the previous one, where free
        if k + 1 < len(seg.offsets):
            nxt = seg.offsets[k + 1]
            if not seg.used[nxt]:
                pool.remove((seg.sizes[nxt], seg.index, nxt))
                size += seg.sizes.pop(nxt)
                del seg.used[nxt], seg.offsets[k + 1]
        if k > 0:
            prv = seg.offsets[k - 1]
            if not seg.used[prv]:
                pool.remove((seg.sizes[prv], seg.index, prv))
                size += seg.sizes[prv]
                del seg.sizes[off], seg.used[off], seg.offsets[k]
                off = prv
        seg.sizes[off] = size
        bisect.insort(pool, (size, seg.index, off))
        return p
