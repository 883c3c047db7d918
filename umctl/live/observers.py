"""Who else hears what a live control loop does, without the loop knowing who.

A :class:`~umctl.live.control.LiveControl` hands each step's COMMAND and RESULT records to one
:class:`ControlObserver`, made for it by the factories registered here; the exporter's
control-state publisher (umctl/exporter/control_state.py) registers itself when imported, and
the commands that control a process import it. The loop thus depends on this module only, and
an observer that is not wanted on a node (no exporter running) answers None and costs nothing.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from ..events.schema import EventBatch


class ControlObserver(Protocol):
    """Hears one control loop: each step's output, then the end of the loop."""

    def record(self, ctl: Any, out: EventBatch) -> None:
        """One step's COMMAND and RESULT records; ``ctl`` is the loop (its budget and residency
        estimate). Must not raise, nor slow the loop down."""
        ...

    def close(self) -> None:
        """The loop ended (the controller detached)."""
        ...


#: (target pid, mode, budget bytes or None) -> an observer of that loop, or None
ObserverFactory = Callable[[int, str, "int | None"], "ControlObserver | None"]

_FACTORIES: list[ObserverFactory] = []


def register_control_observer(factory: ObserverFactory) -> ObserverFactory:
    """Have ``factory`` asked for an observer of every control loop started from now on
    (once, however often a module registering it is imported)."""
    if factory not in _FACTORIES:
        _FACTORIES.append(factory)
    return factory


def control_observer(pid: int, mode: str, budget_bytes: int | None) -> ControlObserver | None:
    """The observer of a loop controlling ``pid``: what the registered factories give, as one
    object (None when none wants it)."""
    found = [o for f in _FACTORIES if (o := f(pid, mode, budget_bytes)) is not None]
    if len(found) > 1:
        return _Observers(found)
    return found[0] if found else None


class _Observers:
    """Several observers as one."""

    def __init__(self, observers: list[ControlObserver]):
        self.observers = observers

    def record(self, ctl: Any, out: EventBatch) -> None:
        for o in self.observers:
            o.record(ctl, out)

    def close(self) -> None:
        for o in self.observers:
            o.close()
