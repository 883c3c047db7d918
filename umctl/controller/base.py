"""The controller interface shared by replay and live control.

A controller consumes :class:`~umctl.events.EventBatch` es and returns command batches
(``Kind.COMMAND`` records). It never talks to the simulator or the GPU directly: the source
decides when to deliver events, the actuator executes commands. That is what lets the same
controller code run on a replay and on a live process.

Replay-only controllers (``oracle``) may ask the :class:`ControllerContext` for the future
access stream and the residency state; live sources leave those ``None``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, ClassVar

import numpy as np

from ..events.schema import COMMAND_DTYPE, EventBatch, Kind

#: Block descriptors are distributed over nodes in runs of this many 2 MiB blocks (SnuRHAC
#: §6.3): the cluster runtime's layout, which every mode of a multi-node replay runs on
DESCRIPTOR_RUN = 32


@dataclass
class ControllerContext:
    """What a controller may know about the system it controls."""

    n_gpus: int
    gpu_mem: list[int]
    #: ``free_memory(gpu) -> bytes`` the driver could hand out now without evicting (replay:
    #: the simulator's count; live: the GPU's free memory or what is left of a budget).
    free_memory: Callable[[int], int] | None = None
    #: Replay only: the whole workload (the future), for oracle-style upper bounds.
    workload: object | None = None
    #: Replay only: ``residency(gpu) -> (holds_chunk, complete, free_chunks)``: per block of
    #: the simulator's compact block space, whether it holds a chunk on that GPU and whether
    #: all its pages are there; ``block_addr`` maps compact blocks to addresses.
    residency: Callable[[int], tuple[np.ndarray, np.ndarray, int]] | None = None
    block_addr: np.ndarray | None = None
    #: Replay only: ``belady(next_access) -> keys (GPUs x blocks)``: make the simulated
    #: driver evict by Belady's MIN (see Simulator._belady).
    belady: Callable[[np.ndarray], np.ndarray] | None = None
    #: HUVM driver (memHarvester's mechanism; None on the stock driver):
    #: ``spare_memory(gpu) -> bytes`` that GPU can lend another now (free chunks plus chunks
    #: already lent, which the victim cache may replace), and
    #: ``harvest(gpu, spill_to=(), fetch_via=-1, writeback_Bps=0.0)``: GPU ``gpu`` evicts on
    #: its fault path into the ``spill_to`` neighbours' spare memory (round robin), fetches part
    #: of each fault batch through neighbour ``fetch_via``'s PCIe lane, and writes evictions
    #: back to the host at ``writeback_Bps`` (0: the stock rate).
    spare_memory: Callable[[int], int] | None = None
    harvest: Callable[..., None] | None = None
    options: dict = field(default_factory=dict)


class Controller:
    """Base class: a controller that does nothing. Subclasses override ``on_events``."""

    name: ClassVar[str] = "base"
    #: Event kinds the controller needs; sources skip building the others (cheaper replays,
    #: and live sources enable only these tracker event types).
    subscribes: ClassVar[frozenset[Kind]] = frozenset()
    #: True if the mode cannot run live (it needs perfect future knowledge, or inputs a live
    #: program does not give); ``replay_only_why`` is the refusal's reason.
    replay_only: ClassVar[bool] = False
    replay_only_why: ClassVar[str] = "needs the future"
    # -- what the mode needs live (umctl.live.spec reads these; no rule there names a mode) --
    #: Part of the mode runs inside the program, in umctl's runtime (runtime/, LD_PRELOAD): the
    #: program must start under ``umctl run``; ``runtime_why`` says what the runtime does.
    needs_runtime: ClassVar[bool] = False
    runtime_why: ClassVar[str] = ""
    #: The runtime turns host-to-device copies into chunked migrations and that is the whole
    #: mode: no controller steers (a --budget adds mode none's keeper).
    runtime_copies: ClassVar[bool] = False
    #: The runtime spreads the program's partitionable kernels over ``--gpus N`` GPUs.
    live_gpus: ClassVar[bool] = False
    #: Live, the mode is this other mode's controller plus the budget keeper (None: itself).
    live_as: ClassVar[str | None] = None
    #: Live, the mode needs ``--spare-gpus N`` (neighbour GPUs' memory; and so ``--budget``).
    needs_spare_gpus: ClassVar[bool] = False
    #: True if the mode's in-process runtime wraps the launch call, so it sees every launch
    #: before the kernel runs (SnuRHAC issues its static prefetches there): replay then hands
    #: LAUNCH events over at each launch instead of in the next drain.
    launch_sync: ClassVar[bool] = False
    #: Where part of the mode runs inside the driver's fault handler (a kernel module), it
    #: sees fault batches as they are serviced: replay then delivers events at most this
    #: many ns apart instead of at the source's drain interval. None: the source's interval.
    drain_ns: ClassVar[int | None] = None
    #: In a replay over several nodes: consecutive 2 MiB blocks whose descriptors one node
    #: holds before the next node's turn (SnuRHAC's round robin, §6.3); the simulator reads it
    #: here rather than importing a mode
    descriptor_run: ClassVar[int] = DESCRIPTOR_RUN

    def __init__(self, **options):
        self.options = options
        self.ctx: ControllerContext | None = None

    def applies_to(self, workload) -> str | None:
        """Why this mode cannot run on ``workload`` (e.g. a multi-GPU mode on a one-GPU
        program), or None when it can. Replay refuses with this reason instead of running."""
        return None

    def prepare(self, workload):
        """What the mode's in-process runtime does to the program before it runs (HUM turns
        copies into chunked UM migrations, SnuRHAC partitions kernel grids over GPUs); the
        live path does the same in runtime/. Policies that only observe and command keep the
        program as it is."""
        return workload

    def attach(self, ctx: ControllerContext) -> None:
        self.ctx = ctx

    def on_events(self, batch: EventBatch) -> np.ndarray | None:
        """React to events; return a COMMAND batch or None."""
        return None

    def eviction_order(self, gpu: int, blocks: list[int]) -> list[int]:
        """The given resident blocks (UM block numbers, least recently migrated first) in the
        order this policy would rather lose them. A live budget keeper that must evict on
        overflow asks this, so a policy's knowledge of what comes next is not undone by plain
        LRU. Default: keep the order (LRU)."""
        return blocks

    def live_invalidates(self) -> bool:
        """Whether, live, this policy wants INVALIDATE carried out (by the program's runtime:
        ``umctl run`` then opens the runtime's control channel). Default: no."""
        return False

    def eviction_commands(self, cmds: np.ndarray) -> np.ndarray:
        """What becomes of a live budget keeper's PREEVICT commands (it stands for the driver's
        eviction): a policy whose driver drops dead data instead of writing it back (DeepUM's
        invalidation of inactive allocator blocks) turns those into INVALIDATE. Default: as is."""
        return cmds

    def stats(self) -> dict:
        """Controller-side counters for reports (table sizes, predictions...)."""
        return {}


NO_COMMANDS = np.zeros(0, dtype=COMMAND_DTYPE)

_REGISTRY: dict[str, type[Controller]] = {}


def register(cls: type[Controller]) -> type[Controller]:
    """Class decorator: make a controller available as ``--mode NAME``."""
    _REGISTRY[cls.name] = cls
    return cls


def available_modes() -> list[str]:
    _load_builtin()
    return list(_REGISTRY)


def controller_class(mode: str) -> type[Controller]:
    """The class registered as ``mode`` (what ``--mode`` names); UmctlError if none is."""
    from .. import UmctlError

    _load_builtin()
    cls = _REGISTRY.get(mode)
    if cls is None:
        raise UmctlError(f"unknown mode {mode!r}; available: {', '.join(_REGISTRY)}")
    return cls


def make_controller(mode: str, **options) -> Controller:
    from .. import UmctlError

    cls = controller_class(mode)
    try:
        return cls(**options)
    except (ValueError, TypeError) as e:  # e.g. -O deepum.degree=x
        given = ", ".join(f"{k}={v!r}" for k, v in options.items())
        raise UmctlError(f"bad option for mode {mode} ({given}): {e}") from None


def _load_builtin() -> None:
    """Import every module of this package once: importing a mode module registers it, so a
    new mode is one new file and nothing else to edit. Done lazily to keep the interface cheap."""
    global _LOADED
    if _LOADED:
        return
    import importlib
    import os
    import pkgutil

    pkg = __name__.rpartition(".")[0]
    for info in pkgutil.iter_modules([os.path.dirname(__file__)]):
        if info.name not in ("base", "tables", "options"):
            importlib.import_module(f"{pkg}.{info.name}")
    _LOADED = True


_LOADED = False
