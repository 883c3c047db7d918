"""The declared interfaces of the live data path: source -> events -> controller -> commands
-> actuator (ARCHITECTURE.md draws it).

These are :class:`typing.Protocol` s: a source or an actuator implements one by having the
methods, without importing anything from here. :class:`~umctl.live.session.Session` is written
against them only, so a new source or actuator plugs into a controlled session without touching
the CLI (``tests/test_live_session.py`` does it with fakes). The controller side of the loop is
:class:`umctl.controller.base.Controller`, the same class a replay drives.

Times are CLOCK_MONOTONIC nanoseconds throughout; GPUs are numbered 0..N-1 as the source
numbers them in its events.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from ..events.schema import EventBatch, Kind
from ..loop.control import Actuator  # noqa: F401 - the actuator's protocol is the loop's (umctl/loop/control.py)


@runtime_checkable
class Source(Protocol):
    """A stream of one target's UVM events (the tools API, BPF on the fault path, a fake).

    ``drain`` is called every few ms by the session and must not block; everything happened
    since the previous call comes back as one batch (empty arrays when nothing did)."""

    #: the target process
    pid: int
    #: what the source knows of the target's GPUs: dicts with at least ``gpu`` (our number)
    #: and ``memory_bytes`` (None when unknown); may fill in after attach
    gpus: list[dict]
    #: the event kinds it delivers (a controller's ``subscribes`` must be among them)
    kinds: frozenset[Kind]

    def drain(self) -> EventBatch: ...

    def counters(self) -> dict[str, int]:
        """The driver's cumulative counters (bytes moved by cause...), {} if none."""
        ...

    def sample_fraction(self) -> float:
        """Fraction of the time events were collected (1.0: every event)."""
        ...

    def exited(self) -> bool:
        """Whether the target is gone (the session then ends)."""
        ...

    def stats(self) -> dict:
        """The source's own figures for the summary (attach time, lag, ring fill...)."""
        ...

    def stop(self) -> None:
        """Stop collecting; a final ``drain`` still returns what was collected."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class LaunchSource(Protocol):
    """Kernel launches (and from the in-process runtime also allocations and copies) of the
    same target: the BPF launch probe or the runtime's socket. Merged into the source's batch
    at every step; ``names`` of the batch resolve the launch records' ``name_id``."""

    def drain(self) -> EventBatch: ...

    def close(self) -> None: ...
