"""``umctl top``: every process using Unified Memory, live (like htop / nvtop). The options
are checked here; the fleet of sources is umctl.live.fleet's and the view umctl.tui.top's."""

from __future__ import annotations

from typing import Optional

import typer

from .. import UmctlError
from ..events.schema import Kind
from ..live.attach import resolve_sample
from ..live.fleet import Fleet, tools_source
from ..live.session import start_launch_probe
from ..sources.uvmtools import parse_kinds
from ..tui.top import SORT_KEYS, TopView, run_top
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
    check_number(interval, "--interval", TOP_INTERVAL_S, " s")
    if sort not in SORT_KEYS.values():
        raise UmctlError(f"unknown sort key {sort!r} (choose from {', '.join(SORT_KEYS.values())})")
    if not any(w.strip() for w in kinds.lstrip("+").split(",")):
        raise UmctlError(f"--kinds {kinds!r} names no event kind (e.g. default, all, faults,migrations or +migrations)")
    kind_set = parse_kinds(kinds)
    frac = resolve_sample(sample, recording=False, control=False)

    def warn(text: str) -> None:
        err.print(f"umctl: {text}", highlight=False)

    def open_fleet(view: TopView, migrations: bool) -> Fleet:
        ks = kind_set | {Kind.MIGRATION} if migrations else kind_set - {Kind.MIGRATION}
        return Fleet(lambda p: tools_source(p, ks, frac), view, pid=pid,
                     launches=start_launch_probe if launches else None)

    run_top(open_fleet, migrations=Kind.MIGRATION in kind_set, once=once, interval=interval, sort=sort,
            console=out, warn=warn)
