"""Pieces every scenario generator shares: parameter checks, fitting a model's proportions to
a target footprint, the kernel cost model, power-law sampling and page-range arithmetic.

Generators scale real programs down to a simulated GPU of a few hundred MiB. They keep the
*proportions* (weights : activations, tables : MLPs, edges : vertices) and the *ratio of compute
to bytes*, so a scaled replay stresses UVM the way the full-size program does on a real GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator, NoReturn, Sequence

import numpy as np

from ...units import PAGE_SIZE, ranges  # noqa: F401 - ranges: the generators use it from here
from ..workload import Buffer, Init, WorkloadBuilder

#: What a job yields between the operations it emits: the estimated time in ns (compute only,
#: no faults) of what it emitted since the last tick. The multi-tenant generator interleaves
#: jobs by these estimates.
Tick = int


class ParamError(ValueError):
    """A scenario parameter has a value its generator cannot use. The loader reports it as one
    line naming the scenario; any other exception from a generator is a bug."""


class Params(dict):
    """Resolved parameters as generators see them. A missing one (a scenario file that leaves
    out something its generator needs) is a ParamError naming it, not a KeyError traceback."""

    def __missing__(self, key: str) -> NoReturn:
        raise ParamError(f"missing parameter {key!r}, which this generator needs")


def check(ok: bool, message: str) -> None:
    if not ok:
        raise ParamError(message)


def choice(params: dict, key: str, options: Sequence[str]) -> str:
    value = params[key]
    check(value in options, f"{key} must be one of {', '.join(options)} (got {value!r})")
    return value


def at_least(params: dict, key: str, low: float) -> None:
    check(params[key] >= low, f"{key} must be at least {low:g} (got {params[key]})")


def check_common(params: dict) -> None:
    """Bounds of the parameters every scenario has."""
    check(params["oversub"] > 0, f"oversub must be positive (got {params['oversub']})")
    check(params["gpu_mem"] >= 16 * PAGE_SIZE, f"gpu_mem must be at least 64 KiB (got {params['gpu_mem']} bytes)")
    at_least(params, "iterations", 1)
    at_least(params, "seed", 0)


# -- sizes -------------------------------------------------------------------------------------
def to_pages(natural: np.ndarray | float, scale: float) -> np.ndarray:
    """Pages of a tensor of ``natural`` bytes in a model scaled by ``scale`` (at least one).
    Monotonic in ``natural``, so a tensor never outgrows a block planned for a larger one."""
    return np.maximum(1, np.rint(np.asarray(natural, dtype=np.float64) * scale / PAGE_SIZE)).astype(np.int64)


def fit_scale(natural: Sequence[float] | np.ndarray, target_bytes: int) -> float:
    """The factor that shrinks tensors of ``natural`` bytes so their page-rounded sizes add up
    to ``target_bytes`` (oversub x gpu_mem). Tiny tensors stay one page, so the factor is
    solved iteratively over the tensors above that floor."""
    natural = np.asarray(natural, dtype=np.float64)
    check(len(natural) * PAGE_SIZE <= 0.9 * target_bytes,
          f"footprint {target_bytes} bytes is too small for {len(natural)} tensors: raise gpu_mem or oversub")
    scale = target_bytes / natural.sum()
    for _ in range(20):
        pages = to_pages(natural, scale)
        total = float(pages.sum()) * PAGE_SIZE
        if abs(total - target_bytes) <= 0.002 * target_bytes:
            break
        floor = float((pages == 1).sum()) * PAGE_SIZE
        scale *= max(target_bytes - floor, PAGE_SIZE) / max(total - floor, PAGE_SIZE)
    return scale


def carve(b: WorkloadBuilder, name: str, pages: Sequence[int] | np.ndarray, *, init: Init = Init.UNTOUCHED,
          managed: bool = True, pid: int = 0, gpu: int = 0) -> list[Buffer]:
    """One allocation holding tensors of ``pages`` pages back to back, like a caching
    allocator's segment: tensors share UM blocks as they do in a real process."""
    pages = np.asarray(pages, dtype=np.int64)
    arena = b.alloc(name, int(pages.sum()) * PAGE_SIZE, init=init, managed=managed, pid=pid, gpu=gpu, emit=True)
    starts = np.concatenate([[0], np.cumsum(pages)[:-1]])
    return [arena.slice(int(s) * PAGE_SIZE, int(n) * PAGE_SIZE) for s, n in zip(starts, pages)]


def first_page(buf: Buffer) -> int:
    return buf.addr // PAGE_SIZE


def npages(buf: Buffer) -> int:
    return (buf.nbytes + PAGE_SIZE - 1) // PAGE_SIZE


# -- cost model -------------------------------------------------------------------------------
@dataclass(frozen=True)
class CostModel:
    """Kernel time with all data resident: the larger of compute at an effective peak and
    bytes at HBM bandwidth. Generators evaluate it on the full-size program and multiply by the
    footprint scale, so compute : transfer stays what it is on the real GPU."""

    flops_per_s: float
    bytes_per_s: float

    @classmethod
    def from_params(cls, params: dict) -> "CostModel":
        check(params["peak_tflops"] > 0 and params["hbm_gbps"] > 0, "peak_tflops and hbm_gbps must be positive")
        return cls(params["peak_tflops"] * 1e12, params["hbm_gbps"] * 1e9)

    def ns(self, flops: float = 0.0, nbytes: float = 0.0) -> float:
        return max(flops / self.flops_per_s, nbytes / self.bytes_per_s) * 1e9


def grid_for(elements: float, per_block: int) -> tuple[int, int, int]:
    """A plausible 1-D launch grid: one thread block per ``per_block`` output elements."""
    return (int(min(2**31 - 1, max(1, math.ceil(elements / per_block)))), 1, 1)


# -- power laws -------------------------------------------------------------------------------
def zipf_ranks(rng: np.random.Generator, n: int, count: int, alpha: float) -> np.ndarray:
    """``count`` popularity ranks in [0, n) with P(rank r) ~ (r+1)^-alpha: the inverse CDF of
    the continuous bounded power law, so it is vectorised and exact enough for page traffic."""
    u = rng.random(count)
    if abs(alpha - 1.0) < 1e-9:
        x = np.power(float(n + 1), u)
    else:
        x = np.power(1.0 + u * (float(n + 1) ** (1.0 - alpha) - 1.0), 1.0 / (1.0 - alpha))
    return np.minimum(x.astype(np.int64) - 1, n - 1).clip(0)


#: A prime above any row count we generate: ``rank * _SPREAD mod n`` is then a bijection.
_SPREAD = 2_654_435_761


def spread(ranks: np.ndarray, n: int, salt: int) -> np.ndarray:
    """Map popularity ranks to row ids with a fixed bijection, so hot rows lie scattered over a
    table (categorical ids are hashed in DLRM) instead of packed at its start."""
    return (ranks.astype(np.int64) * _SPREAD + salt * 40_503) % n


def pareto_weights(rng: np.random.Generator, n: int, alpha: float) -> np.ndarray:
    """Heavy-tailed shares summing to 1 (power-law degrees of vertex groups)."""
    w = rng.pareto(alpha, n) + 1.0
    return w / w.sum()


# -- page ranges ------------------------------------------------------------------------------
def byte_pages(base_page: int, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Pages covering byte ranges [lo, hi) of a buffer starting at ``base_page``."""
    lo = np.asarray(lo, dtype=np.int64)
    hi = np.asarray(hi, dtype=np.int64)
    first = lo // PAGE_SIZE
    last = (np.maximum(hi, lo + 1) - 1) // PAGE_SIZE
    return base_page + ranges(first, last - first + 1)


def first_touch(pages: np.ndarray) -> np.ndarray:
    """Distinct pages in order of first access (a kernel's accesses, each page once)."""
    _, idx = np.unique(pages, return_index=True)
    return pages[np.sort(idx)]


def drain(ticks: Iterator[Tick]) -> None:
    """Run a job to completion (single-tenant generators)."""
    for _ in ticks:
        pass
