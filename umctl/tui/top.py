"""What ``umctl top`` and ``umctl attach`` show: the rendering of per-process live statistics
(:class:`umctl.live.stats.LiveStats`) as rich renderables for a terminal or plain lines
otherwise, the keyboard reader, and top itself (:func:`run_top`): a view over a
:class:`~umctl.live.fleet.Fleet` that keeps one LiveStats per process."""

from __future__ import annotations

import os
import select
import sys
import time
from typing import TYPE_CHECKING, Callable

from ..live.fleet import Fleet, FleetEvents, Member
from ..live.stats import CAUSE_COLUMNS, LiveStats  # noqa: F401 - LiveStats: callers that import it from here
from ..report.live import sampled_tag, top_blocks_text, top_kernels_text

if TYPE_CHECKING:
    from rich.console import Console

GB = 1e9


def _si(x: float) -> str:
    for unit, div in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.1f}{unit}"
    return f"{x:.0f}"


def summary_line(s: LiveStats, elapsed: float, lag_p99_ms: float | None = None) -> str:
    """One status line (attach's live view, and the plain output when not a TTY)."""
    r = s.rates
    parts = [f"{elapsed:6.1f}s pid {s.pid}", f"faults {_si(s.faults)} ({_si(r.get('faults', 0))}/s)",
             f"batches {_si(s.batches)} ({_si(r.get('batches', 0))}/s)",
             f"H2D {r.get('h2d', 0) / GB:.2f} GB/s", f"D2H {r.get('d2h', 0) / GB:.2f} GB/s",
             f"cpu-faults {_si(s.cpu_faults)}", f"thrash {s.thrashing}", f"dropped {s.dropped}"]
    if s.launches:
        parts.append(f"launches {_si(s.launches)}")
    if s.sample < 1:
        parts.append(f"events sampled {100 * s.sample:.0f}%")
    if lag_p99_ms is not None:
        parts.append(f"lag p99 {lag_p99_ms:.1f} ms")
    return "  ".join(parts)


SORT_KEYS = {"f": "faults", "b": "batches", "h": "h2d", "d": "d2h", "t": "thrashing", "c": "cpu_faults",
             "p": "pid"}


def _sort_value(s: LiveStats, key: str) -> float:
    if key == "pid":
        return -s.pid
    return s.rates.get(key, 0.0)


def render_top(stats: list[LiveStats], sort: str = "faults", *, note: str = "", plain: bool = False):
    """The top view: a table of processes, then per process its top kernels and blocks.
    ``plain`` gives a str (for --once and non-terminals), else a rich renderable."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    rows = sorted(stats, key=lambda s: -_sort_value(s, sort))
    t = Table(title=None, box=None if plain else None, header_style="bold", pad_edge=False)
    cols = ["PID", "COMMAND", "faults/s", "batches/s", "H2D GB/s", "(dem/pf/evict/user)", "D2H GB/s",
            "(dem/pf/evict/user)", "cpu-flt/s", "thrash", "dropped", "status"]
    for c in cols:
        t.add_column(c, justify="left" if c in ("COMMAND", "status") else "right", no_wrap=True)
    for s in rows:
        r = s.rates

        def split(prefix: str) -> str:
            if not s.have_migrations:
                return "-"
            return "/".join(f"{r.get(f'{prefix}_{n}', 0) / GB:.2f}" for n, _ in CAUSE_COLUMNS)

        t.add_row(str(s.pid), (s.comm or "?")[:20], _si(r.get("faults", 0)), _si(r.get("batches", 0)),
                  f"{r.get('h2d', 0) / GB:.2f}", split("h2d"), f"{r.get('d2h', 0) / GB:.2f}", split("d2h"),
                  _si(r.get("cpu_faults", 0)), str(s.thrashing), str(s.dropped), s.status)
    details = []
    for s in rows:
        if s.status and not s.faults:
            continue
        tot = s.snapshot(3)   # the totals every view reads (umctl/report/live.py formats the shared parts)
        line = f"pid {tot.pid}: top kernels by faults{sampled_tag(tot)}: " + (
            top_kernels_text(tot, width=40, count=_si) or "(no launch events)")
        line += "   top 2 MiB blocks: " + (top_blocks_text(tot, count=_si) or "-")
        details.append(line)
    header = f"umctl top — {len(rows)} process(es) using UVM — sort: {sort}"
    keys = "keys: f faults  b batches  h H2D  d D2H  t thrashing  c cpu faults  p pid  m migrations on/off  q quit"
    if plain:
        from rich.console import Console
        import io
        buf = io.StringIO()
        Console(file=buf, width=200, no_color=True, highlight=False).print(t)
        out = [header, buf.getvalue().rstrip()] + details
        if note:
            out.append(note)
        return "\n".join(out)
    parts = [Text(header, style="bold"), t] + [Text(d) for d in details]
    if note:
        parts.append(Text(note, style="yellow"))
    parts.append(Text(keys, style="dim"))
    return Group(*parts)


class KeyReader:
    """Non-blocking single-key reader: puts the terminal in cbreak mode (keys arrive without
    Enter, output processing untouched so rich still renders) and restores it on exit. Works
    over ssh in any terminal; a no-op when stdin is not a TTY."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stdin
        self._saved = None
        try:
            self.fd = self.stream.fileno()
            self.active = os.isatty(self.fd)
        except (AttributeError, OSError, ValueError):
            self.fd, self.active = -1, False

    def __enter__(self) -> "KeyReader":
        if self.active:
            import termios
            import tty
            self._saved = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._saved is not None:
            import termios
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)
            self._saved = None

    def read(self, timeout: float = 0.0) -> str | None:
        """One key if one is waiting within ``timeout`` seconds, else None."""
        if not self.active:
            if timeout:
                time.sleep(timeout)
            return None
        r, _, _ = select.select([self.fd], [], [], timeout)
        if not r:
            return None
        data = os.read(self.fd, 32)
        return data[:1].decode("ascii", "ignore") or None


#: Seconds between looks for new processes (a /proc scan); drains run every key poll (0.1 s).
SCAN_S = 2.0


class TopView(FleetEvents[LiveStats]):
    """One row per process of the fleet: its statistics, or in ``status`` why it is not
    attached. ``warn`` prints what degrades without failing (no launch probe)."""

    def __init__(self, warn: Callable[[str], None]):
        self.warn = warn

    def on_attach(self, m: Member[LiveStats]) -> None:
        m.data = LiveStats(pid=m.pid, comm=m.comm)   # a fresh source's counters start at zero

    def on_refuse(self, m: Member[LiveStats], error: Exception, first: bool) -> None:
        if m.data is None:
            m.data = LiveStats(pid=m.pid, comm=m.comm)
        m.data.status = str(error)[:60]

    def on_batch(self, m: Member[LiveStats], batch) -> None:
        m.data.feed(batch, m.source)

    def on_detach(self, m: Member[LiveStats]) -> None:
        if m.data is not None and m.error:
            m.data.status = m.error[:60]

    def on_warning(self, text: str) -> None:
        self.warn(text)

    def on_error(self, pid: int | None, error: Exception) -> None:
        if pid is None:   # a process's own failure is its row's status
            self.warn(f"looking for processes failed: {type(error).__name__}: {error}")

    @staticmethod
    def rows(fleet: Fleet[LiveStats]) -> list[LiveStats]:
        return [m.data for m in fleet.members.values() if m.data is not None]

    @staticmethod
    def note(fleet: Fleet[LiveStats]) -> str:
        hidden = fleet.hidden
        if not fleet.members:
            msg = "no process has /dev/nvidia-uvm open"
            return msg + (f" that this user can see ({hidden} hidden: run as root)" if hidden else "")
        return f"({hidden} processes hidden: run as root to see them)" if hidden else ""


def run_top(open_fleet: Callable[[TopView, bool], Fleet[LiveStats]], *, migrations: bool, once: bool,
            interval: float, sort: str, console: "Console", warn: Callable[[str], None]) -> None:
    """``umctl top``: ``open_fleet(view, migrations)`` gives the fleet to show (the m key asks
    for a new one with migration events toggled). ``once``: one plain snapshot sampled over
    ``interval``; else a live view on ``console`` (plain lines when it is not a terminal),
    refreshed every ``interval`` and on each key, until q or Ctrl-C. Drains run at every key
    poll (0.1 s), a /proc scan every :data:`SCAN_S`; the fleet is closed however it ends."""
    from rich.live import Live

    view = TopView(warn)
    fleet = open_fleet(view, migrations)

    def tick() -> None:
        for s in view.rows(fleet):
            s.tick()

    try:
        fleet.scan()
        if once:
            time.sleep(interval)
            fleet.drain()
            tick()
            print(render_top(view.rows(fleet), sort, note=view.note(fleet), plain=True))
            return
        last_scan = time.monotonic()
        with KeyReader() as keys:
            live = (Live(console=console, refresh_per_second=4, screen=False, auto_refresh=False)
                    if console.is_terminal else None)
            if live is not None:
                live.start()
            try:
                next_tick = time.monotonic() + interval
                while True:
                    key = keys.read(0.1)
                    if key in ("q", "Q", "\x1b"):
                        break
                    if key in SORT_KEYS:
                        sort = SORT_KEYS[key]
                    if key == "m":   # a tracker's event kinds are fixed: attach everything again
                        fleet.close()
                        migrations = not migrations
                        fleet = open_fleet(view, migrations)
                        fleet.scan()
                    fleet.drain()
                    now = time.monotonic()
                    if now - last_scan > SCAN_S:
                        fleet.scan()
                        last_scan = now
                    if now >= next_tick or key:
                        if now >= next_tick:
                            tick()
                            next_tick = now + interval
                        shown = render_top(view.rows(fleet), sort, note=view.note(fleet), plain=live is None)
                        if live is not None:
                            live.update(shown, refresh=True)
                        else:
                            print(shown, flush=True)
            finally:
                if live is not None:
                    live.stop()
    except KeyboardInterrupt:
        pass
    finally:
        fleet.close()
