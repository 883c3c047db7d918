"""Closing the loop on a live process: the shared :class:`~umctl.loop.control.ControlLoop` with
what only a live target needs around it.

The loop (residency estimate, soft budget, its check, command bookkeeping) is the one a replay
runs (``umctl/loop/``); live adds three things: a mode that needs the future is refused, the GPU
memory the controller is told of comes from the source (or the budget), and the loop's steps
are published to whoever observes control loops on this node (``live/observers.py``: the
exporter's state file).
"""

from __future__ import annotations

from .. import UmctlError
from ..controller.base import Controller, ControllerContext
from ..loop.control import Actuator, ControlLoop
from .observers import control_observer


class LiveControl(ControlLoop):
    """One controller driving one live process through an actuator, under an optional budget.

    ``gpus``: what the source knows of the target's GPUs (``memory_bytes`` each, None when
    unknown: then a budget is needed); ``safe_invalidate``: the program's runtime carries out
    INVALIDATE (``actuators/runtime_discard.py``). The rest is :class:`ControlLoop`'s."""

    def __init__(self, controller: Controller, actuator: Actuator, *, pid: int, gpus: list[dict],
                 budget_bytes: int | None = None, spare_gpus: int = 0, budget_sweep_ms: float = 0.0,
                 safe_invalidate: bool = False, migrations_on: bool | None = None, admission: bool = False):
        if controller.replay_only:
            raise UmctlError(f"mode {controller.name} needs the future (replay only); live modes: "
                             "none, deepum, deepum-prefetch, deepum-preevict, ...")
        n = max(1, len(gpus))
        super().__init__(controller, actuator, n_gpus=n, pid=pid, budget_bytes=budget_bytes,
                         spare_gpus=spare_gpus, budget_sweep_ms=budget_sweep_ms, admission=admission,
                         migrations_on=migrations_on)
        mem = self.controlled_memory([int(g.get("memory_bytes") or 0) for g in gpus] or [0])
        if not all(m > 0 for m in mem):
            raise UmctlError("GPU memory size unknown (nvidia-smi gave none): pass --budget")
        ctx = ControllerContext(n_gpus=n, gpu_mem=mem, free_memory=self.free_memory)
        ctx.options["live"] = True
        # the actuator's INVALIDATE is carried out by the program's runtime, which discards only
        # what the program can no longer use (actuators/runtime_discard.py)
        ctx.options["safe_invalidate"] = bool(safe_invalidate)
        controller.attach(ctx)
        self.publisher = control_observer(pid, controller.name, budget_bytes)
