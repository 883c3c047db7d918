"""What a kernel's thread blocks touch: the description a grid-partitioning runtime needs.

A single-GPU program carries, per kernel launch, two things a runtime such as SnuRHAC (thesis
ch. 6) uses to spread it over several GPUs:

  * the *thread-block layout of its access stream*: the kernel's accesses are ordered by
    thread block (linear id, x fastest, then y, then z) and ``tb_off[t]:tb_off[t+1]`` are
    thread block t's accesses, relative to the kernel's ``acc_lo``. A runtime that gives a
    GPU a set of thread blocks gives it exactly those accesses (on the real system the
    partitioned kernel skips the other blocks);
  * the *access ranges MAPA would derive* (thesis §6.5.1): per memory operation of the kernel,
    either an affine range per thread block -- thread block ``(bx, by, bz)`` touches bytes
    ``[lo + a . b, hi + a . b)`` of its buffer, the bounds evaluated at the representative
    threads and the loop bounds -- or "not analysable" (indirect, data-dependent), for which
    static prefetching has nothing to go on.

A scenario builds both (it knows its program); traces and the other families carry none, so
a partitioning mode does not apply to them. Thread blocks here are coarse: one stands for a
tile of the real grid's blocks, which keeps replays small while the partitioning rules still
see a grid of the right shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class AccessRange:
    """One memory operation of a kernel as a static analyser reports it."""

    #: the buffer (allocation) it touches: base address, size, allocation id
    addr: int
    nbytes: int
    alloc_id: int
    write: bool
    #: False when the analyser cannot bound it (indirect or data-dependent index)
    affine: bool = True
    #: bytes the range moves per blockIdx step in x, y, z
    coef: tuple[int, int, int] = (0, 0, 0)
    #: byte range of thread block (0, 0, 0), relative to ``addr``; [lo, hi)
    lo: int = 0
    hi: int = 0

    def bounds(self, bx: np.ndarray, by: np.ndarray, bz: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Byte ranges [lo, hi) (absolute addresses, clamped to the buffer) of thread blocks;
        an unanalysable operation spans its whole buffer (it could touch any of it)."""
        n = len(bx)
        if not self.affine:
            return np.full(n, self.addr, np.int64), np.full(n, self.addr + self.nbytes, np.int64)
        off = bx * self.coef[0] + by * self.coef[1] + bz * self.coef[2]
        lo = np.clip(self.lo + off, 0, self.nbytes)
        hi = np.clip(self.hi + off, 0, self.nbytes)
        return self.addr + lo, self.addr + np.maximum(hi, lo)


@dataclass
class KernelBlocks:
    """One kernel launch's thread blocks: grid, per-block slices of its access stream, and
    the static access ranges of its memory operations."""

    grid: tuple[int, int, int]
    tb_off: np.ndarray
    ranges: list[AccessRange] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.grid = tuple(int(g) for g in self.grid)  # type: ignore[assignment]
        self.tb_off = np.asarray(self.tb_off, dtype=np.int64)
        if len(self.tb_off) != self.n_blocks + 1:
            raise ValueError(f"tb_off needs {self.n_blocks + 1} offsets for grid {self.grid}")

    @property
    def n_blocks(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]

    def coords(self, tb: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(bx, by, bz) of linear thread-block ids."""
        gx, gy, _ = self.grid
        tb = np.asarray(tb, dtype=np.int64)
        return tb % gx, (tb // gx) % gy, tb // (gx * gy)
