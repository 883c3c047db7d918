"""``umctl exporter``: serve every UVM process's faults and migrations on /metrics for
Prometheus (umctl.exporter; docs/guide/exporter.md)."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from typing import Optional

import typer

from .. import UmctlError, __version__

_DURATION_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h)?\s*$")
_DURATION_UNIT = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
#: Most ring entries per attached process (72 bytes each): 1.2 GiB of ring, per process, is
#: already far more than any drain interval needs; 2^40 was accepted and would be 72 TiB.
MAX_RING_ENTRIES = 1 << 24


#: Longest duration an option takes (a year): beyond it, timers and waits overflow.
MAX_DURATION_S = 365 * 86400.0


def parse_duration(text: str, what: str) -> float:
    """'1s', '500ms', '2m', '1h' or plain seconds, > 0 and at most a year."""
    m = _DURATION_RE.match(str(text))
    if not m or float(m.group(1)) <= 0 or float(m.group(1)) * _DURATION_UNIT[m.group(2)] > MAX_DURATION_S:
        raise UmctlError(f"{what} must be a positive duration up to 365 days, such as 1s, 500ms or 2m "
                         f"(got {text!r})")
    return float(m.group(1)) * _DURATION_UNIT[m.group(2)]


def parse_listen(text: str) -> tuple[str, int]:
    """HOST:PORT or [IPv6]:PORT. The host is required: binding every interface is a choice
    the operator writes out (0.0.0.0:9464), never a default."""
    m = re.match(r"^\[([0-9a-fA-F:.]+)\]:(\d+)$", text.strip()) or re.match(r"^([^:\[\]\s]+):(\d+)$", text.strip())
    if not m:
        raise UmctlError(f"--listen must be HOST:PORT or [IPv6]:PORT, e.g. 127.0.0.1:9464 or 0.0.0.0:9464 "
                         f"(got {text!r})")
    port = int(m.group(2))
    if not 0 <= port <= 65535:
        raise UmctlError(f"--listen port must be 0..65535 (got {port})")
    return m.group(1), port


def exporter_command(
    listen: str = typer.Option("127.0.0.1:9464", "--listen", "-l",
                               help="HOST:PORT to serve /metrics on (localhost unless told otherwise; "
                                    "0.0.0.0:9464 for every interface)."),
    sample: str = typer.Option("0.1", "--sample", help="Fraction of the time events are collected, or a "
                               "percentage (10%); 1 = every event. Counters are scaled by the measured on-time."),
    interval: str = typer.Option("1s", "--interval", "-i", help="How often processes are scanned, drained and "
                                 "folded into the metrics (1s, 500ms)."),
    kinds: str = typer.Option("default", "--kinds", "-k", help="Event kinds: default (cheap), or +migrations for "
                              "bytes by cause and evictions (costlier in the driver)."),
    grace: str = typer.Option("2m", "--grace", help="How long an ended process's series stay before they are "
                              "dropped (at least two scrape intervals)."),
    ring_entries: Optional[int] = typer.Option(None, "--ring-entries", help="Ring entries per process "
                                               "(power of two up to 2^24, 72 bytes each; default 32768). Larger: less CPU (drained less often), more memory."),
    state_dir: Optional[str] = typer.Option(None, "--state-dir", help="Where umctl controllers publish their "
                                            "command counts (default /run/umctl or $UMCTL_STATE_DIR)."),
    duration: Optional[str] = typer.Option(None, "--duration", "-d", help="Stop after this long (default: "
                                           "until SIGTERM/Ctrl-C)."),
) -> None:
    """Prometheus exporter: every process using Unified Memory, its GPU faults, fault batches,
    migrations, evictions and thrashing, umctl controllers' commands, on /metrics.

    Needs the rights of [bold]umctl attach[/bold] (root or CAP_SYS_PTRACE) to see other users'
    processes. Metrics and deployment (systemd, Kubernetes): docs/guide/exporter.md.

    Examples:

      [bold]sudo umctl exporter[/bold]   (127.0.0.1:9464, 10% sample, 1 s interval)

      [bold]sudo umctl exporter --listen 0.0.0.0:9464 --sample 1 --kinds +migrations[/bold]
    """
    from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server

    from ..exporter.agent import RING_ENTRIES, Agent, _stderr_log
    from ..exporter.control_state import ensure_state_dir
    from ..exporter.metrics import ExporterCollector, ExporterState
    from ..sources.uvmtools import kinds_label, parse_kinds
    from ..sources.uvmtools.sampling import parse_sample

    host, port = parse_listen(listen)
    frac = parse_sample(sample)
    interval_s = parse_duration(interval, "--interval")
    grace_s = parse_duration(grace, "--grace")
    stop_after = parse_duration(duration, "--duration") if duration is not None else None
    kind_set = parse_kinds(kinds)
    ring = RING_ENTRIES if ring_entries is None else ring_entries
    if ring < 2 or ring & (ring - 1) or ring > MAX_RING_ENTRIES:
        raise UmctlError(f"--ring-entries must be a power of two from 2 to {MAX_RING_ENTRIES} "
                         f"({MAX_RING_ENTRIES * 72 >> 20} MiB per process) (got {ring})")
    if state_dir is not None and ensure_state_dir(state_dir) is None:
        # the default directory may be missing (commands are then not exported); one the
        # operator names must work, or the dashboard's command panels stay silently empty
        raise UmctlError(f"--state-dir {state_dir}: cannot create or use it as a directory")

    state = ExporterState(sample=frac, kinds=kinds_label(kind_set), version=__version__)
    registry = CollectorRegistry()
    registry.register(ExporterCollector(state))
    ProcessCollector(registry=registry)   # the exporter's own memory and CPU (process_*)
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as e:
        raise UmctlError(f"cannot listen on {listen}: {e.strerror or e}") from None
    sdir = ensure_state_dir(state_dir)
    agent = Agent(state, kinds=kind_set, sample=frac, interval_s=interval_s, grace_s=grace_s, ring_entries=ring,
                  state_dir=sdir)
    stop = threading.Event()

    def on_signal(signum, frame) -> None:
        stop.set()

    old = {}
    for s in (signal.SIGTERM, signal.SIGINT):
        try:
            old[s] = signal.signal(s, on_signal)
        except ValueError:   # not the main thread (embedded): the caller stops us with --duration
            pass
    shown = f"[{host}]" if ":" in host else host
    _stderr_log(f"serving http://{shown}:{server.server_port}/metrics; sample {frac:g}, interval {interval_s:g} s, "
                f"kinds {kinds_label(kind_set)}, grace {grace_s:g} s"
                + ("" if sdir else "; controllers' commands not exported (no state directory)"))
    if os.geteuid() != 0:
        _stderr_log("not root: only this user's processes can be attached (sudo, or CAP_SYS_PTRACE)")
    timer = None
    if stop_after is not None:
        timer = threading.Timer(stop_after, stop.set)
        timer.daemon = True
        timer.start()
    t0 = time.monotonic()
    try:
        agent.run(stop)
    finally:
        if timer is not None:
            timer.cancel()
        for s, h in old.items():
            signal.signal(s, h)
        server.shutdown()
        server.server_close()
        _stderr_log(f"stopped after {time.monotonic() - t0:.1f} s; {state.attaches} attaches, {state.errors} errors")
