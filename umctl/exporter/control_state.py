"""How a running controller tells the exporter what it did: one small JSON file per
controlled process in a state directory, rewritten at most once a second.

Why files: the controller lives in another umctl process (``attach --mode`` / ``run --mode``)
that may start before or after the exporter and must never slow down or fail because of it.
A file written by atomic rename costs the controller one write a second, needs no socket
either side must keep alive, and survives an exporter restart; a controller that crashes
leaves a file whose writer pid is gone, which the reader treats as ended.

The control loop does not import this module: :func:`publisher_for` is registered as an
observer factory of umctl.live.observers when this module is imported, which the commands that
control a process do.

Publishing is opt-in by the directory's existence: the exporter creates it (or systemd's
``RuntimeDirectory=umctl``), so without an exporter on the node a controller writes nothing.
The directory is world-writable and sticky (like /tmp) so that ``umctl run`` without root can
publish too; the reader accepts a file only when its owner is root or owns the controlled
process, so one user cannot put numbers on another's process.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

from ..events.schema import EventBatch, Kind, Op, Status
from ..live.observers import register_control_observer

#: Where controllers publish and the exporter reads (``UMCTL_STATE_DIR`` overrides).
DEFAULT_STATE_DIR = "/run/umctl"
FORMAT = 1
_OP_NAMES = {int(o): o.name.lower() for o in Op}
_FAILED = (int(Status.FAILED), int(Status.TARGET_GONE), int(Status.RANGE_INVALID))
#: commands whose result has not come back yet, kept at most (older ones are forgotten)
_MAX_INFLIGHT = 1 << 17


def state_dir() -> str:
    return os.environ.get("UMCTL_STATE_DIR") or DEFAULT_STATE_DIR


@dataclass
class ControlPublisher:
    """Counts one controller's commands and results and writes them to ``path``."""

    path: str
    target_pid: int
    mode: str
    budget_bytes: int
    period_s: float = 1.0
    sent: dict[tuple[str, str], int] = field(default_factory=dict)
    failed: dict[tuple[str, str], int] = field(default_factory=dict)
    moved: dict[str, int] = field(default_factory=dict)
    _inflight: dict[int, tuple[str, str]] = field(default_factory=dict)
    _last_write: float = 0.0
    _enforced: int = 0
    broken: bool = False

    def record(self, ctl, out: EventBatch) -> None:
        """One ``LiveControl.step``'s output. The budget state of a command is ``none``
        without a budget, ``enforcing`` when the budget keeper evicted in that step, else
        ``under``: what an operator needs to tell policy traffic from budget pressure."""
        if self.broken:
            return
        budget = getattr(ctl, "budget", None)
        state = "none"
        if budget is not None:
            state = "enforcing" if budget.enforced_blocks > self._enforced else "under"
            self._enforced = budget.enforced_blocks
        cmds = out[Kind.COMMAND]
        for op, cid in zip(cmds["op"].tolist(), cmds["cmd_id"].tolist()):
            key = (_OP_NAMES.get(op, str(op)), state)
            self.sent[key] = self.sent.get(key, 0) + 1
            if len(self._inflight) < _MAX_INFLIGHT:
                self._inflight[cid] = key
        res = out[Kind.RESULT]
        for cid, st, n in zip(res["cmd_id"].tolist(), res["status"].tolist(), res["bytes"].tolist()):
            key = self._inflight.pop(cid, None)
            if key is None:
                continue
            if st in _FAILED:
                self.failed[key] = self.failed.get(key, 0) + 1
            elif st == Status.OK and n:
                self.moved[key[0]] = self.moved.get(key[0], 0) + int(n)
        now = time.monotonic()
        if now - self._last_write >= self.period_s:
            self._last_write = now
            self.write(ctl)

    def write(self, ctl=None) -> None:
        resident = 0
        if ctl is not None and getattr(ctl, "res", None) is not None:
            resident = sum(ctl.res.resident_bytes(g) for g in range(len(ctl.res.blocks)))
        doc = {"format": FORMAT, "umctl_pid": os.getpid(), "target_pid": self.target_pid, "mode": self.mode,
               "budget_bytes": self.budget_bytes, "resident_bytes": resident,
               "sent": [[op, b, n] for (op, b), n in self.sent.items()],
               "failed": [[op, b, n] for (op, b), n in self.failed.items()],
               "moved": self.moved}
        tmp = f"{self.path}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(doc, f)
            os.replace(tmp, self.path)
        except OSError:
            self.broken = True   # never fatal to the controller: it just stops publishing

    def close(self) -> None:
        """The controller detached: its series end (the exporter keeps them for its grace)."""
        try:
            os.unlink(self.path)
        except OSError:
            pass


@register_control_observer
def publisher_for(target_pid: int, mode: str, budget_bytes: int | None,
                  directory: str | None = None) -> ControlPublisher | None:
    """A publisher when an exporter's state directory exists and is writable, else None (every
    control loop asks, through umctl.live.observers)."""
    d = directory or state_dir()
    if not os.path.isdir(d) or not os.access(d, os.W_OK):
        return None
    path = os.path.join(d, f"control-{os.getpid()}-{int(target_pid)}.json")
    return ControlPublisher(path, int(target_pid), mode, int(budget_bytes or 0))


def ensure_state_dir(directory: str | None = None) -> str | None:
    """Create the state directory (sticky, world-writable) if we may; None when we cannot,
    which only means controllers' commands are not exported."""
    d = directory or state_dir()
    try:
        os.makedirs(d, exist_ok=True)
        if os.stat(d).st_uid == os.geteuid():
            os.chmod(d, 0o1777)
    except OSError:
        return None
    return d


@dataclass
class Published:
    target_pid: int
    umctl_pid: int
    mode: str
    budget_bytes: int
    resident_bytes: int
    sent: dict[tuple[str, str], int]
    failed: dict[tuple[str, str], int]
    moved: dict[str, int]


def read_published(directory: str, proc_root: str = "/proc") -> list[Published]:
    """Every live controller's file. Files of a writer that is gone, unreadable or foreign
    files, and files whose owner may not speak for the target are skipped."""
    out: list[Published] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return out
    for name in names:
        if not (name.startswith("control-") and name.endswith(".json")):
            continue
        path = os.path.join(directory, name)
        try:
            with open(path, encoding="utf-8") as f:
                owner = os.fstat(f.fileno()).st_uid
                doc = json.loads(f.read(1 << 20))
            if doc.get("format") != FORMAT:
                continue
            target, writer = int(doc["target_pid"]), int(doc["umctl_pid"])
            if not os.path.isdir(f"{proc_root}/{writer}"):
                continue
            if owner != 0 and owner != os.stat(f"{proc_root}/{target}").st_uid:
                continue
            out.append(Published(target, writer, str(doc["mode"])[:64], int(doc.get("budget_bytes") or 0),
                                 int(doc.get("resident_bytes") or 0),
                                 {(str(o)[:32], str(b)[:16]): int(n) for o, b, n in doc.get("sent", [])},
                                 {(str(o)[:32], str(b)[:16]): int(n) for o, b, n in doc.get("failed", [])},
                                 {str(o)[:32]: int(n) for o, n in (doc.get("moved") or {}).items()}))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out
