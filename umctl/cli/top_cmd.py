"""``umctl top``: every process using Unified Memory, live (like htop / nvtop)."""

from __future__ import annotations

import time
from typing import Optional

import typer

from .. import UmctlError
from ..events.schema import Kind
from ..live.attach import resolve_sample
from ..live.session import merge_launches, start_launch_probe
from ..live.stats import LiveStats
from ..sources.uvmtools import LiveError, UvmToolsSource, list_uvm_processes, parse_kinds
from ..driver.process import comm_of, process_alive
from ..tui.top import SORT_KEYS, KeyReader, render_top
from .common import KINDS_HELP, SAMPLE_HELP, TOP_INTERVAL_S, check_number, err, out


def top_command(
    pid: Optional[int] = typer.Option(None, "--pid", "-p", help="Only this process (default: every process using UVM)."),
    once: bool = typer.Option(False, "--once", help="Print one snapshot (sampled over --interval) and exit."),
    interval: float = typer.Option(1.0, "--interval", "-i", help="Seconds between refreshes (and the --once sample); above 0, at most 86400."),
    kinds: str = typer.Option("default", "--kinds", "-k", help=KINDS_HELP),
    sort: str = typer.Option("faults", "--sort", "-s", help="Sort by faults, batches, h2d, d2h, thrashing, cpu_faults or pid."),
    launches: bool = typer.Option(True, "--launches/--no-launches", help="Kernel launches (top kernels) through the BPF probe."),
    sample: Optional[str] = typer.Option(None, "--sample", help=SAMPLE_HELP),
) -> None:
    """Live per-process view of every process using CUDA Unified Memory (like htop / nvtop).

    Keys: f/b/h/d/t/c/p sort by faults, batches, H2D, D2H, thrashing, CPU faults, pid;
    m toggles migration events (bytes by cause; slows fault service); q quits.

    Examples:

      [bold]sudo umctl top[/bold]

      [bold]sudo umctl top --once --interval 2[/bold]

      [bold]sudo umctl top --sample 1[/bold]   (every event: exact counts, slows a fault-heavy target)
    """
    from rich.live import Live

    check_number(interval, "--interval", TOP_INTERVAL_S, " s")
    if sort not in SORT_KEYS.values():
        raise UmctlError(f"unknown sort key {sort!r} (choose from {', '.join(SORT_KEYS.values())})")
    if not any(w.strip() for w in kinds.lstrip("+").split(",")):
        raise UmctlError(f"--kinds {kinds!r} names no event kind (e.g. default, all, faults,migrations or +migrations)")
    kind_set = parse_kinds(kinds)
    frac = resolve_sample(sample, recording=False, control=False)

    def warn(text: str) -> None:
        err.print(f"umctl: {text}", highlight=False)

    sessions: dict[int, tuple[UvmToolsSource | None, object, LiveStats]] = {}
    hidden = 0

    def scan() -> None:
        nonlocal hidden
        if pid is not None:
            pids = [pid]
            hidden = 0
        else:
            procs, hidden = list_uvm_processes()
            pids = [p.pid for p in procs]
        for p in pids:
            if p in sessions:
                continue
            stats = LiveStats(pid=p, comm=comm_of(p))
            try:
                src = UvmToolsSource(p, kind_set, flush_ms=5.0 if Kind.MIGRATION in kind_set else 0.0,
                                     sample=frac).start()
                probe = start_launch_probe(p, warn) if launches else None
                stats.status = ""
            except LiveError as e:
                if pid is not None:
                    raise
                src, probe = None, None
                stats.status = str(e)[:60]
            sessions[p] = (src, probe, stats)
        for p in list(sessions):
            src, probe, stats = sessions[p]
            if (src is not None and src.exited()) or (src is None and not process_alive(p)):
                close(p)

    def close(p: int) -> None:
        src, probe, _ = sessions.pop(p)
        if probe is not None:
            try:
                probe.close()
            except Exception:  # noqa: BLE001
                pass
        if src is not None:
            src.close()

    def sample_all() -> None:
        for p, (src, probe, stats) in list(sessions.items()):
            if src is None:
                continue
            try:
                batch, still = merge_launches(src.drain(), probe, warn)
                if still is not probe:   # the probe failed (said once) and is closed
                    sessions[p] = (src, None, stats)
                stats.feed(batch, src)
            except UmctlError as e:
                stats.status = str(e)[:60]

    def note() -> str:
        if not sessions:
            msg = "no process has /dev/nvidia-uvm open"
            return msg + (f" that this user can see ({hidden} hidden: run as root)" if hidden else "")
        return f"({hidden} processes hidden: run as root to see them)" if hidden else ""

    try:
        scan()
        if once:
            time.sleep(interval)
            sample_all()
            for _, _, s in sessions.values():
                s.tick()
            print(render_top([s for _, _, s in sessions.values()], sort, note=note(), plain=True))
            return
        tty = out.is_terminal
        last_scan = time.monotonic()
        with KeyReader() as keys:
            live = Live(console=out, refresh_per_second=4, screen=False, auto_refresh=False) if tty else None
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
                    if key == "m":
                        kind_set = kind_set ^ {Kind.MIGRATION}
                        for p in list(sessions):
                            close(p)
                        scan()
                    sample_all()
                    now = time.monotonic()
                    if now - last_scan > 2.0:
                        scan()
                        last_scan = now
                    if now >= next_tick or key:
                        if now >= next_tick:
                            for _, _, s in sessions.values():
                                s.tick()
                            next_tick = now + interval
                        view = render_top([s for _, _, s in sessions.values()], sort, note=note(), plain=live is None)
                        if live is not None:
                            live.update(view, refresh=True)
                        else:
                            print(view, flush=True)
            finally:
                if live is not None:
                    live.stop()
    except KeyboardInterrupt:
        pass
    finally:
        for p in list(sessions):
            close(p)

