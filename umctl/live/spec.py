"""What a mode needs to run live, checked before anything attaches (a typo must not cost an
attach), and the actuator that goes with a source.

Every rule here reads an attribute the controller class declares (``replay_only``,
``needs_runtime``, ``runtime_copies``, ``live_gpus``, ``live_as``, ``needs_spare_gpus``: see
:class:`umctl.controller.base.Controller`); none names a mode, so a new mode states what it needs
live in its own file.

Actuators are chosen by name: a source declares ``actuator = "uvm"`` (it holds the target's
va_space) or ``"kmod"`` (the kernel module finds it), and :data:`ACTUATORS` builds one; a new
actuator is one :func:`register_actuator` call, or an instance handed to
:meth:`ControlSpec.start` / :class:`~umctl.live.session.Session`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from .. import UmctlError
from ..controller.base import Controller, controller_class, make_controller
from ..controller.options import REPLAY_OPTIONS, parse_mode_options
from ..events.schema import Kind
from .interfaces import Actuator, LaunchSource, Source


# -- actuators ------------------------------------------------------------------------------

def _uvm(src: Source, rate: float) -> Actuator:
    from ..actuators.uvm import UvmActuator

    v = src.va_space()  # type: ignore[attr-defined]
    return UvmActuator(v.va_fd, v.gpu_uuid, v.cpu_uuid, io=v.io, pidfd=v.pidfd, max_bytes_per_s=rate)


def _kmod(src: Source, rate: float) -> Actuator:
    from ..actuators.kmod import KmodActuator

    return KmodActuator()


#: actuator name -> builder(source, max bytes per second umctl may move; 0: no cap)
ACTUATORS: dict[str, Callable[[Source, float], Actuator]] = {"uvm": _uvm, "kmod": _kmod}


def register_actuator(name: str, build: Callable[[Source, float], Actuator]) -> None:
    """Make ``name`` an actuator a source may declare (``actuator = name``)."""
    ACTUATORS[name] = build


def actuator_for(src: Source, rate: float = 0.0) -> Actuator:
    """The actuator the source declares, built on it."""
    name = getattr(src, "actuator", None)
    build = ACTUATORS.get(name) if isinstance(name, str) else None
    if build is None:
        raise UmctlError(f"source {type(src).__name__} names no known actuator ({name!r}; known: "
                         f"{', '.join(ACTUATORS)}): it can observe but not control")
    return build(src, float(rate))


# -- modes ----------------------------------------------------------------------------------

def gpus_present() -> int:
    """GPUs this process could use, without touching CUDA: the driver's /proc entries (or
    nvidia-smi), limited by CUDA_VISIBLE_DEVICES."""
    from ..driver.process import nvidia_smi_gpus

    d = Path("/proc/driver/nvidia/gpus")
    n = len(list(d.iterdir())) if d.is_dir() else 0
    if not n:
        n = len(nvidia_smi_gpus())
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        n = min(n, len([v for v in vis.split(",") if v.strip()]))
    return n


def runtime_copies(mode: str | None) -> bool:
    """Whether ``mode`` is carried out wholly by the runtime's copies (``umctl run --mode hum``
    then needs no controller)."""
    return mode is not None and controller_class(mode).runtime_copies


def _check_gpus(mode: str, gpus: int | None) -> int:
    if gpus is None:
        raise UmctlError(f"--mode {mode} needs --gpus N (the GPUs to spread the program over)")
    if gpus < 1:
        raise UmctlError(f"--gpus must be 1 or more (got {gpus})")
    have = gpus_present()
    if gpus > have:
        raise UmctlError(f"--gpus {gpus} but this machine has {have} GPU{'s' if have != 1 else ''}")
    return gpus


class ControlSpec:
    """What ``--mode/--budget/-O/--degree`` asked for, checked against what the mode declares it
    needs live, turned into a running :class:`~umctl.live.control.LiveControl` once the source is
    attached (:meth:`start`). ``live_run``: the program starts under ``umctl run`` (its runtime
    can be preloaded)."""

    def __init__(self, mode: str | None, budget: str | None, options: list[str] | None, degree: int | None,
                 spare_gpus: int, rate: str | None, gpus: int | None = None, live_run: bool = False,
                 budget_sweep: float = 0.0, hold: str | None = None):
        from ..units import parse_size

        self.label = mode or "none"
        cls = controller_class(self.label)
        live_cls: type[Controller] = controller_class(cls.live_as) if cls.live_as else cls
        self.mode = live_cls.name
        if live_cls.replay_only:
            raise UmctlError(f"mode {self.label} {cls.replay_only_why} and runs only on replay "
                             f"(umctl replay ... --mode {self.label})")
        if cls.needs_runtime and not live_run:
            raise UmctlError(f"{self.label} {cls.runtime_why}, so it must start under umctl: umctl run --mode "
                             f"{self.label}{' --gpus N' if cls.live_gpus else ''} -- CMD")
        self.gpus: int | None = None
        if cls.live_gpus:
            # the runtime partitions the grids (UMCTL_RT_GPUS); the controller sees the faults of
            # every GPU
            self.gpus = _check_gpus(self.label, gpus)
            if budget or spare_gpus:
                raise UmctlError(f"--mode {self.label} takes no --budget/--spare-gpus (the program fits in one GPU)")
        elif gpus is not None:
            raise UmctlError(f"--gpus is for --mode {' / '.join(_live_gpu_modes())} (the GPUs to spread the "
                             "program over)")
        if cls.needs_spare_gpus and not spare_gpus:
            raise UmctlError(f"--mode {self.label} needs --spare-gpus N (the neighbour GPUs whose spare memory it "
                             "uses) and --budget")
        parsed = parse_mode_options(options, [self.mode], degree=degree)
        replay_only = sorted(set(parsed[self.mode]) & set(REPLAY_OPTIONS))
        if replay_only:   # options of the simulator (the launch queue): a live program has its own
            raise UmctlError(f"-O {replay_only[0]} is an option of umctl replay's simulator, not of a live run")
        self.controller = make_controller(self.mode, **parsed[self.mode])
        try:
            self.budget = parse_size(budget) if budget else None
            self.rate = parse_size(rate) if rate else 0
        except ValueError as e:
            raise UmctlError(str(e)) from None
        if spare_gpus < 0:
            raise UmctlError("--spare-gpus must be 0 or more")
        if spare_gpus and self.budget is None:
            raise UmctlError("--spare-gpus needs --budget (spare memory holds what the budget evicts)")
        self.spare_gpus = spare_gpus
        if budget_sweep < 0:
            raise UmctlError("--budget-sweep must be 0 (off) or more milliseconds")
        self.budget_sweep = float(budget_sweep)
        if hold not in (None, "admit", "evict"):
            raise UmctlError(f"--budget-hold must be admit or evict (got {hold!r})")
        if hold is not None and self.budget is None:
            raise UmctlError("--budget-hold needs --budget")
        if hold == "admit" and not live_run:
            raise UmctlError("--budget-hold admit needs the program to start under umctl's runtime: "
                             "umctl run --runtime --budget B -- CMD (attach holds a budget by evicting only)")
        self.hold = hold
        #: whether the budget is held by admission (decided when the program starts: it needs
        #: the runtime, which makes managed memory host-preferred; control.py, *Admission*)
        self.admission = False

    def use_runtime_admission(self, runtime: bool) -> bool:
        """Decide, as the program starts (``runtime``: under umctl's runtime), whether the budget
        is held by admission: by default whenever it can be (a budget and the runtime); with
        ``--spare-gpus`` the runtime makes the neighbours, not the host, the preferred location
        (``prefer_gpus``), so a miss reads the victim cache over the GPU link; ``--budget-hold
        admit`` without the runtime is an error before anything starts."""
        if self.budget is None or self.hold == "evict":
            return False
        if not runtime:
            if self.hold == "admit":
                raise UmctlError("--budget-hold admit needs umctl's runtime: add --runtime (or --managed)")
            return False
        self.admission = True
        return self.admission

    def prefer_gpus(self) -> list[int]:
        """Under admission with ``--spare-gpus N``: the neighbour GPUs (CUDA ordinals 1..N, the
        keeper's eviction targets) the runtime makes the preferred location of managed memory."""
        return list(range(1, 1 + self.spare_gpus)) if self.admission else []

    def source_kinds(self) -> frozenset[Kind]:
        """The event kinds the controller needs from a tools-API source, plus MIGRATION under a
        budget: the budget check (umctl/loop/budget_check.py) judges the budget from the driver's
        migration records, and the keeper learns from them what arrived without a fault. That is
        the price of a budget one can check: migration events slow the driver's fault service
        (~1.8x on a fault-bound kernel, docs/evaluation/measurements.md)."""
        from ..sources.uvmtools import ALL_KINDS

        kinds = frozenset(self.controller.subscribes) & ALL_KINDS
        if self.budget is not None:
            kinds |= {Kind.MIGRATION}
        return kinds

    def start(self, src: Source, probe: LaunchSource | None, actuator: Actuator | None = None):
        """The running control loop on an attached source: ``actuator`` or the one the source
        declares (closed again if the loop cannot start)."""
        from .control import LiveControl

        if Kind.LAUNCH in self.controller.subscribes and probe is None:
            raise UmctlError(f"mode {self.mode} needs kernel-launch events and the launch probe is unavailable "
                             "(see the message above; docs/guide/launch-probes.md)")
        gpus = src.gpus or [{"gpu": 0, "memory_bytes": None}]
        if self.gpus is not None:
            gpus = self._spread_gpus(gpus)
        elif not all(g.get("memory_bytes") for g in gpus):
            gpus = _with_memory(gpus)
        act = actuator if actuator is not None else actuator_for(src, float(self.rate))
        # Under the runtime (umctl run), invalidations are carried out by the program itself,
        # the only place that knows when a freed block's last kernel has run
        safe = (self.controller.live_invalidates() and hasattr(probe, "discard_async")
                and getattr(src, "target_fd", -1) >= 0)
        if safe:
            from ..actuators.runtime_discard import RuntimeDiscard

            act.invalidator = RuntimeDiscard(probe, src.pid, src.target_fd)  # type: ignore[attr-defined]
        try:
            return LiveControl(self.controller, act, pid=src.pid, gpus=gpus, budget_bytes=self.budget,
                               spare_gpus=self.spare_gpus, budget_sweep_ms=self.budget_sweep,
                               safe_invalidate=safe,
                               migrations_on=Kind.MIGRATION in getattr(src, "kinds", frozenset()),
                               admission=self.admission)
        except BaseException:
            act.close()
            raise

    def _spread_gpus(self, gpus: list[dict]) -> list[dict]:
        """Every GPU the program is spread over, including those it has not registered with UVM
        yet (the controller keeps per-GPU tables for each)."""
        gpus = _with_memory(gpus)
        mem = next((g.get("memory_bytes") for g in gpus if g.get("memory_bytes")), None)
        return gpus + [{"gpu": i, "memory_bytes": mem} for i in range(len(gpus), self.gpus or 0)]


def _with_memory(gpus: list[dict]) -> list[dict]:
    """``gpus`` with every unknown ``memory_bytes`` filled in. The target registers its GPUs with
    UVM only as it creates contexts, so when the control loop starts (``umctl run`` starts it
    with the program) there may be none yet: the machine's GPUs say how big they are (the one of
    the same UUID, else the first). Without this, ``umctl run --mode deepum`` without
    ``--budget`` stopped with 'GPU memory size unknown'."""
    from ..driver.process import nvidia_smi_gpus

    mem = next((g.get("memory_bytes") for g in gpus if g.get("memory_bytes")), None)
    smi = nvidia_smi_gpus() if mem is None or not all(g.get("memory_bytes") for g in gpus) else []
    by_uuid = {str(g.get("uuid", "")).lower(): g.get("memory_bytes") for g in smi}
    sizes = {g.get("memory_bytes") for g in smi}
    mig = any(str(g.get("uuid", "")).upper().startswith("MIG-") for g in gpus)
    if mem is None and len(sizes) == 1 and not mig:
        # only when it cannot be the wrong GPU: every GPU the same size, no MIG slice (whose
        # size nvidia-smi's whole-GPU total is not)
        mem = next(iter(sizes))
    return [dict(g, memory_bytes=g.get("memory_bytes") or by_uuid.get(str(g.get("uuid", "")).lower()) or mem)
            for g in gpus]


def _live_gpu_modes() -> list[str]:
    from ..controller.base import available_modes

    return [m for m in available_modes()
            if controller_class(m).live_gpus and not controller_class(m).replay_only]
