"""``umctl attach / record / run / top``: live observation of real processes through the UVM
tools API (umctl.sources.uvmtools) plus, when it loads, the BPF launch probe
(umctl.sources.uprobes).

One loop serves attach, record and run (:func:`_observe`): every ``--interval`` it drains the
source (and the launch probe), folds the batch into :class:`~umctl.tui.top.LiveStats`, writes
it to the trace if one is open and refreshes the display. It ends on ``--duration``, Ctrl-C,
SIGTERM or the target's exit; in every case it stops the source with a final flush and drain,
closes the trace (so it is complete and renamed) and prints the summary.
"""

from __future__ import annotations

import signal
import subprocess
import time
from typing import List, Optional

import typer
from rich.console import Console

from .. import UmctlError
from ..events.schema import EventBatch, Kind
from ..sources.uvmtools import (
    LiveError, NoUvm, TargetExited, UvmToolsSource, kinds_label, list_uvm_processes, parse_kinds,
)
from ..sources.uvmtools.process import comm_of, cmdline_of, nvidia_smi_gpus, process_alive, uvm_fds
from ..tui.top import KeyReader, LiveStats, render_top, summary_line

out = Console()
err = Console(stderr=True)

KINDS_HELP = ("Event kinds: 'default' (faults,replays,cpu_faults,thrashing: cheap), 'all' (adds migrations: "
              "~1.8x slower fault service), a list such as faults,migrations, or +migrations.")


# -- launch probe (optional) ----------------------------------------------------------------

def _start_launch_probe(pid: int, enabled: bool):
    """The BPF launch probe for ``pid``, or None (said once on stderr): it needs libbpf, root
    and the uprobes module, none of which may be present."""
    if not enabled:
        return None
    try:
        from ..sources.uprobes import LaunchProbe  # type: ignore[import-not-found]
    except Exception as e:  # noqa: BLE001 - missing module or a broken import: same outcome
        err.print(f"umctl: no kernel-launch events (launch probe unavailable: {type(e).__name__}: "
                  f"{str(e).splitlines()[0] if str(e) else ''}); continuing without them", highlight=False)
        return None
    try:
        probe = LaunchProbe(pid)
        probe.start()
        return probe
    except Exception as e:  # noqa: BLE001 - UmctlError or anything the loader raises
        err.print(f"umctl: no kernel-launch events ({str(e).splitlines()[0] if str(e) else type(e).__name__}); "
                  "continuing without them", highlight=False)
        return None


def _merge(batch: EventBatch, probe) -> EventBatch:
    if probe is None:
        return batch
    try:
        lb = probe.drain()
    except Exception as e:  # noqa: BLE001 - a probe failure must not end the recording
        err.print(f"umctl: launch probe stopped ({e}); continuing without launch events", highlight=False)
        return batch
    for kind, records in lb.arrays.items():  # launches; the runtime also reports allocations, copies
        if len(records):
            batch.add(kind, records)
    if lb.names:
        batch.names = lb.names
    return batch


# -- the observation loop -------------------------------------------------------------------

class _Stop:
    """Turns SIGTERM into a clean stop (the summary and the trace must survive `kill`)."""

    def __init__(self) -> None:
        self.reason = ""
        self._old = None

    def __enter__(self) -> "_Stop":
        try:
            self._old = signal.signal(signal.SIGTERM, self._handler)
        except ValueError:  # not the main thread
            self._old = None
        return self

    def _handler(self, signum, frame) -> None:
        self.reason = "SIGTERM"

    def __exit__(self, *exc: object) -> None:
        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)


def _trace_meta(src: UvmToolsSource, command: str, extra: dict) -> dict:
    from ..events.trace import collect_host_meta

    host = collect_host_meta()
    gpu_mem = [g.get("memory_bytes") for g in src.gpus]
    if not gpu_mem or not all(isinstance(v, int) and v > 0 for v in gpu_mem):
        smi = host.get("gpu")
        gpu_mem = [g.get("memory_bytes") for g in smi] if isinstance(smi, list) else []
    meta = {"source": f"umctl {command}", "pid": src.pid, "target_comm": comm_of(src.pid),
            "target_cmdline": cmdline_of(src.pid), "kinds": kinds_label(src.kinds),
            "uvm_gpus": src.gpus, "clock": "CLOCK_MONOTONIC", **extra}
    if gpu_mem and all(isinstance(v, int) and v > 0 for v in gpu_mem):
        meta["gpu_mem"] = gpu_mem
    return meta


def _feed(stats: LiveStats, src, batch: EventBatch) -> None:
    """One drained batch into a view's statistics, with the source's counters and sampling
    fraction as of now (what the estimates are scaled by)."""
    stats.counters = src.counters()
    stats.sample = src.sample_fraction()
    stats.update(batch)


def _observe(src: UvmToolsSource, *, command: str, duration: float | None, output: str | None,
             interval: float, launches: bool, live: bool, child: subprocess.Popen | None = None,
             extra_meta: dict | None = None, control: "ControlSpec | None" = None,
             launch_source=None) -> tuple[LiveStats, dict, str]:
    """Run the loop until the end condition; returns (stats, source stats, end reason).
    ``launch_source`` (the in-process runtime's reports) replaces the BPF launch probe."""
    from rich.live import Live

    probe = launch_source if launch_source is not None else _start_launch_probe(src.pid, launches)
    ctl = None
    if control is not None:
        try:
            ctl = control.start(src, probe)
        except BaseException:
            if probe is not None:
                probe.close()
            src.close()
            raise
    stats = LiveStats(pid=src.pid, comm=comm_of(src.pid))
    writer = None
    if output:
        from ..events.trace import TraceWriter

        writer = TraceWriter(output, _trace_meta(src, command, extra_meta or {}))
    t0 = time.monotonic()
    reason = ""
    tty = err.is_terminal and live
    last_print = t0

    def step() -> None:
        batch = _merge(src.drain(), probe)
        _feed(stats, src, batch)
        if ctl is not None:
            for k, a in ctl.step(batch).arrays.items():
                batch.add(k, a)
        if writer is not None and len(batch):
            writer.write(batch)

    def line() -> str:
        text = summary_line(stats, time.monotonic() - t0, _lag_p99(src))
        return text + (f"  [{_control_line(ctl)}]" if ctl is not None else "")

    error: BaseException | None = None
    display = Live(console=err, refresh_per_second=4, transient=True) if tty else None
    try:
        with _Stop() as stopper:
            if display is not None:
                display.start()
            try:
                # controlling: react within a few ms of a fault (the ring drains every 2 ms);
                # observing: a display refresh every 50 ms is plenty
                period = 0.002 if ctl is not None else min(interval, 0.05)
                while True:
                    time.sleep(period)
                    step()
                    now = time.monotonic()
                    if now - last_print >= interval:
                        stats.tick()
                        last_print = now
                        if display is not None:
                            display.update(line())
                        elif live:
                            err.print(line(), highlight=False, soft_wrap=True)
                    if stopper.reason:
                        reason = stopper.reason
                        break
                    if duration is not None and now - t0 >= duration:
                        reason = f"duration {duration:g} s reached"
                        break
                    if (child is not None and child.poll() is not None) or src.exited():
                        reason = "target exited"
                        break
            except KeyboardInterrupt:
                reason = "interrupted"
            finally:
                if display is not None:
                    display.stop()
    except BaseException as e:  # noqa: BLE001 - closed below, re-raised after
        error = e
    finally:
        src.stop()
        try:
            step()
        except Exception as e:  # noqa: BLE001
            error = error or e
        stats.tick()
        if ctl is not None:
            # stop commanding before detaching: in-flight commands finish, advice is undone
            try:
                tail = ctl.finish()
                if writer is not None and len(tail):
                    writer.write(tail)
            except Exception as e:  # noqa: BLE001
                error = error or e
        if probe is not None:
            try:
                probe.close()
            except Exception:  # noqa: BLE001
                pass
        st = src.stats()
        if ctl is not None:
            st["control"] = ctl.stats()
        src.close()
        if writer is not None:
            if src.gpus:  # the UUID table may have filled in after attach
                writer.meta["uvm_gpus"] = src.gpus
            writer.meta.update({"attach": {k: v for k, v in st.items() if k != "gpus"},
                                "duration_s": round(time.monotonic() - t0, 3), "end": reason,
                                "launch_events": probe is not None})
            writer.close(error=error if isinstance(error, Exception) else None)
    if error is not None:
        raise error
    st["elapsed_s"] = round(time.monotonic() - t0, 3)
    st["trace"] = output
    st["trace_events"] = sum(writer.counts.values()) if writer is not None else None
    return stats, st, reason


def _lag_p99(src: UvmToolsSource) -> float | None:
    ring = getattr(src, "lag_ring", None)   # the kprobe source has no tools-API ring
    if ring is None:
        return None
    v = ring.percentile(99)
    return None if v is None else v / 1e6


def _fmt_bytes(n: float) -> str:
    from ..units import format_bytes

    return format_bytes(int(n))


def _print_summary(command: str, stats: LiveStats, st: dict, reason: str) -> None:
    el = max(st.get("elapsed_s", 0.0), 1e-9)
    est = "~" if stats.sample < 1 else ""   # sampled: every total is an estimate
    lines = [f"umctl {command}: pid {stats.pid} ({stats.comm}) observed {el:.1f} s, detached ({reason})",
             f"  GPU faults   {est}{stats.faults:,} in {est}{stats.batches:,} batches "
             f"({est}{stats.faults / el:,.0f}/s)", f"  CPU faults   {est}{stats.cpu_faults:,}"]
    if stats.sample < 1:
        lines.append(f"  sampling     events and counters collected {100 * stats.sample:.1f}% of the time (--sample): "
                     "totals are estimates scaled by that, top kernels/blocks ranked from the sample")
    if stats.have_migrations:
        def causes(d: dict) -> str:
            return ", ".join(f"{k} {_fmt_bytes(v)}" for k, v in d.items() if v)
        lines.append(f"  H2D          {est}{_fmt_bytes(stats.h2d_total())} ({causes(stats.h2d) or '-'})")
        lines.append(f"  D2H          {est}{_fmt_bytes(stats.d2h_total())} ({causes(stats.d2h) or '-'})")
    elif stats.counters:
        lines.append(f"  H2D          {est}{_fmt_bytes(stats.h2d_total())} (prefetch {_fmt_bytes(stats.counter('prefetch_bytes_htd'))};"
                     " --kinds +migrations splits by cause)")
        lines.append(f"  D2H          {est}{_fmt_bytes(stats.d2h_total())}")
    lines.append(f"  thrashing    {est}{stats.thrashing:,}")
    if stats.launches:
        ks = ", ".join(f"{n} {c:,}" for n, c in stats.top_kernels())
        lines.append(f"  launches     {stats.launches:,}; top kernels by faults: {ks}")
    lines.append(f"  dropped      {stats.dropped:,} events")
    lr, ld = st.get("lag_ring_ms", {}), st.get("lag_delivery_ms", {})
    if lr.get("p50") is not None:
        lines.append(f"  lag          event -> drained p50 {lr['p50']:.2f} ms, p99 {lr['p99']:.2f} ms; "
                     f"-> delivered p50 {ld['p50']:.2f} ms, p99 {ld['p99']:.2f} ms")
    lm = st.get("lag_migration_ms", {})
    if lm.get("n"):
        lines.append(f"  lag (migr.)  end -> drained p50 {lm['p50']:.2f} ms, p99 {lm['p99']:.2f} ms")
    lines.append(f"  attach       {st.get('attach_ms', 0):.1f} ms, kinds {st.get('kinds')}, ring {st.get('ring_entries'):,} "
                 f"entries (max fill {100 * (st.get('ring_max_fill') or 0):.1f} %), " + (f"flush every {st.get('flush_ms'):g} ms" if st.get('flush_ms') else "no flush"))
    if st.get("trace"):
        lines.append(f"  trace        {st['trace']} ({st.get('trace_events') or 0:,} events)")
    for ln in lines:
        out.print(ln, highlight=False, soft_wrap=True)


SOURCES = ("uvmtools", "kprobe")
SOURCE_HELP = ("Where events come from: uvmtools (the UVM tools API; works everywhere the driver runs) or "
               "kprobe (BPF on nvidia_uvm's fault path: needs a kernel with kprobes and the module's BTF; "
               "commands then go through the umctl kernel module).")


SAMPLE_HELP = ("Collect events and counters only this fraction of the time (e.g. 0.1 or 10%; 1 = every event). "
               "Default: 10% for a view (what attaching costs the target is per event in the driver: every event "
               "made a fault-heavy PyTorch loop ~16% slower on the H100, a 10% sample left it within noise; "
               "docs/live.md); every event with -o or --mode, which refuse less: a trace must replay and a "
               "controller must see every fault. Sampled totals are estimates, rankings are of the sample.")


def _resolve_sample(sample: str | None, *, recording: bool, control: bool) -> float:
    """The ``--sample`` fraction: unset is 10 % for a view and every event for a trace or a
    controller; an explicit value below 1 with -o or --mode is refused (it would lose data
    silently)."""
    from ..sources.uvmtools.sampling import VIEW_SAMPLE, parse_sample

    if sample is None:
        return 1.0 if (recording or control) else VIEW_SAMPLE
    v = parse_sample(sample)
    if v < 1 and (recording or control):
        raise UmctlError("--sample below 1 is for viewing only: a trace (-o) or a controller (--mode) needs "
                         "every event")
    return v


def _attach(pid: int, kinds: str, ring_entries: int, flush_ms: float | None,
            control: "ControlSpec | None" = None, source: str = "uvmtools", sample: float = 1.0):
    if source not in SOURCES:
        raise UmctlError(f"unknown source {source!r} (choose from {', '.join(SOURCES)})")
    if source == "kprobe":
        from ..sources.kprobes import KprobeSource

        return KprobeSource([pid]).start()
    kind_set = parse_kinds(kinds)
    if control is not None:
        kind_set = kind_set | control.source_kinds()
    if flush_ms is None:
        # The driver defers Migration events (100-400 ms late without a flush); fault events
        # reach the ring as they are recorded. A flush costs ~190 us of driver time (H100),
        # so it runs only where something needs it: migrations on, or a controller waiting.
        flush_ms = 5.0 if (Kind.MIGRATION in kind_set or control is not None) else 0.0
    return UvmToolsSource(pid, kind_set, ring_entries=ring_entries, flush_ms=flush_ms, sample=sample).start()


def gpus_present() -> int:
    """GPUs this process could use, without touching CUDA: the driver's /proc entries (or
    nvidia-smi), limited by CUDA_VISIBLE_DEVICES."""
    import os
    from pathlib import Path

    d = Path("/proc/driver/nvidia/gpus")
    n = len(list(d.iterdir())) if d.is_dir() else 0
    if not n:
        n = len(nvidia_smi_gpus())
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        n = min(n, len([v for v in vis.split(",") if v.strip()]))
    return n


def check_snurhac(mode: str, gpus: int | None, *, live_run: bool) -> int:
    """The live SnuRHAC variants and their --gpus, checked before anything starts; returns the
    GPU count. Static prefetching needs the compiler's per-thread-block access ranges (MAPA),
    which a live program does not hand over, so the -sp variants stay on replay."""
    if "-sp" in mode:
        raise UmctlError(f"{mode} prefetches from the compiler's access ranges, which a live program does not give "
                         "umctl: use --mode snurhac or snurhac-dp live, or umctl replay mgpu-gemm --mode " + mode)
    if mode not in ("snurhac", "snurhac-dp"):
        raise UmctlError(f"unknown SnuRHAC variant {mode!r} (live: snurhac, snurhac-dp)")
    if not live_run:
        raise UmctlError("snurhac partitions the program's kernels inside the program, so it must start under umctl: "
                         f"umctl run --mode {mode} --gpus N -- CMD")
    if gpus is None:
        raise UmctlError(f"--mode {mode} needs --gpus N (the GPUs to spread the program over)")
    if gpus < 1:
        raise UmctlError(f"--gpus must be 1 or more (got {gpus})")
    have = gpus_present()
    if gpus > have:
        raise UmctlError(f"--gpus {gpus} but this machine has {have} GPU{'s' if have != 1 else ''}")
    return gpus


class ControlSpec:
    """What ``--mode/--budget/-O`` asked for, checked before attaching (a typo must not cost
    an attach), turned into a running :class:`~umctl.live.control.LiveControl` once the
    source is attached."""

    def __init__(self, mode: str | None, budget: str | None, options: list[str] | None, degree: int | None,
                 spare_gpus: int, rate: str | None, gpus: int | None = None, live_run: bool = False,
                 budget_sweep: float = 0.0):
        from ..controller.base import make_controller
        from ..controller.options import parse_mode_options
        from ..units import parse_size

        self.mode = mode or "none"
        self.label = self.mode
        self.gpus: int | None = None
        if self.mode.startswith("snurhac"):
            # Live SnuRHAC: the runtime partitions the grids (UMCTL_RT_GPUS); the controller sees
            # the faults of every GPU (descriptors, and with -dp dynamic prefetching)
            self.gpus = check_snurhac(self.mode, gpus, live_run=live_run)
            if budget or spare_gpus:
                raise UmctlError("--mode snurhac takes no --budget/--spare-gpus (the program fits in one GPU)")
        elif gpus is not None:
            raise UmctlError("--gpus is for --mode snurhac / snurhac-dp (the GPUs to spread the program over)")
        if self.mode.startswith("hum"):
            raise UmctlError("hum changes how the program copies, so it must start under umctl: "
                             "umctl run --mode hum -- CMD")
        if self.mode.startswith("harvest"):
            # Live, with the stock driver, memHarvester is its victim cache: what the budget
            # evicts goes to the neighbours' spare memory (round-robin) and faults fetch it
            # back over NVLink. The HUVM driver features (parallel fetch, large-page
            # write-back, multi-path prefetch) exist only on replay.
            if not spare_gpus:
                raise UmctlError("--mode harvest needs --spare-gpus N (the neighbour GPUs whose spare memory it uses) "
                                 "and --budget")
            self.label, self.mode = self.mode, "none"
        parsed = parse_mode_options(options, [self.mode], degree=degree)
        self.controller = make_controller(self.mode, **parsed[self.mode])
        if self.controller.replay_only:
            raise UmctlError(f"mode {self.mode} needs the future and runs only on replay (umctl replay ... --mode {self.mode})")
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

    def source_kinds(self) -> frozenset:
        from ..sources.uvmtools import ALL_KINDS

        return frozenset(self.controller.subscribes) & ALL_KINDS

    def start(self, src: UvmToolsSource, probe):
        from ..live.control import LiveControl

        if Kind.LAUNCH in self.controller.subscribes and probe is None:
            raise UmctlError(f"mode {self.mode} needs kernel-launch events and the launch probe is unavailable "
                             "(see the message above; docs/launch-probes.md)")
        gpus = src.gpus or [{"gpu": 0, "memory_bytes": None}]
        if self.gpus is not None:
            # SnuRHAC's controller keeps per-GPU tables for every GPU the program is spread over,
            # including those the target has not registered with UVM yet
            mem = next((g.get("memory_bytes") for g in gpus if g.get("memory_bytes")), None)
            if mem is None:
                # the target registers its GPUs with UVM only as it creates contexts, so at
                # attach time there may be none yet: the machine's GPUs say how big they are
                mem = next((g["memory_bytes"] for g in nvidia_smi_gpus() if g.get("memory_bytes")), None)
            gpus = [dict(g, memory_bytes=g.get("memory_bytes") or mem) for g in gpus]
            gpus += [{"gpu": i, "memory_bytes": mem} for i in range(len(gpus), self.gpus)]
        act = src.actuator(max_bytes_per_s=float(self.rate))
        # Under the runtime (umctl run), invalidations are carried out by the program itself,
        # the only place that knows when a freed block's last kernel has run
        safe = (self.controller.live_invalidates() and hasattr(probe, "discard_async")
                and getattr(src, "target_fd", -1) >= 0)
        if safe:
            from ..actuators.runtime_discard import RuntimeDiscard

            act.invalidator = RuntimeDiscard(probe, src.pid, src.target_fd)
        try:
            return LiveControl(self.controller, act, pid=src.pid, gpus=gpus, budget_bytes=self.budget,
                               spare_gpus=self.spare_gpus, budget_sweep_ms=self.budget_sweep,
                               safe_invalidate=safe)
        except BaseException:
            act.close()
            raise


def _control_line(ctl) -> str:
    s = ctl.act.stats()["counts"]
    res = ctl.res.resident_bytes(0)
    bud = f"/{_fmt_bytes(ctl.budget.nbytes)}" if ctl.budget is not None else ""
    return (f"{ctl.ctl.name}: {ctl.commands:,} cmds, {s['ok']:,} ok, {s['failed'] + s['target_gone']:,} failed, "
            f"resident~{_fmt_bytes(res)}{bud}")


def _print_control(st: dict) -> None:
    c = st.get("control")
    if not c:
        return
    a = c["actuator"]
    n = a["counts"]
    moved = ", ".join(f"{k} {_fmt_bytes(v)}" for k, v in a["bytes"].items() if v) or "nothing"
    out.print(f"  control      mode {c['mode']}: {c['commands']:,} commands -> {n['ioctls']:,} ioctls "
              f"({n['ok']:,} ok, {n['failed']:,} failed, {n['target_gone']:,} after exit, {n['superseded']:,} superseded, "
              f"{n['dropped']:,} dropped); moved {moved}; controller {c['controller_ms']:.0f} ms", highlight=False,
              soft_wrap=True)
    lat = [f"{k} {a['latency_ms'][k] / max(1, a['bytes'][k] / (2 << 20)):.2f} ms/2MiB"
           for k in ("prefetch", "preevict") if a["bytes"].get(k)]
    if lat:
        out.print("  actuator     " + ", ".join(lat), highlight=False)
    if a["errors"]:
        out.print("  errors       " + ", ".join(f"{k} x{v}" for k, v in a["errors"].items()), highlight=False)
    cs = c.get("controller") or {}
    why = cs.get("invalidate_off_live")
    if why:
        reason = ("off (-O deepum.live_invalidate=false)" if why == "option" else
                  "off: only umctl's runtime (umctl run --runtime) can order a discard with the program's stream "
                  "and its allocator")
        out.print(f"  note         invalidation is {reason}; {cs.get('kept_not_invalidated', 0):,} victims in freed "
                  "allocator blocks were pre-evicted instead", highlight=False, soft_wrap=True)
    inv = a.get("invalidator")
    if inv and inv["requests"]:
        kept = ", ".join(f"{k} {_fmt_bytes(v)}" for k, v in inv["kept_bytes"].items() if v) or "nothing"
        out.print(f"  invalidate   by the runtime: {inv['requests']:,} requests, {_fmt_bytes(inv['discarded_bytes'])} "
                  f"dropped; kept and pre-evicted: {kept}"
                  + (f"; {inv['unanswered']:,} unanswered" if inv["unanswered"] else ""), highlight=False,
                  soft_wrap=True)
    b = c.get("budget")
    if b:
        out.print(f"  budget       {_fmt_bytes(b['bytes'])}: peak estimate {_fmt_bytes(b['peak_estimate_bytes'])} "
                  f"({_fmt_bytes(b['peak_before_enforcement_bytes'])} within a control period), "
                  f"{b['overflow_blocks_evicted']:,} blocks evicted on overflow to "
                  f"{', '.join('CPU' if d < 0 else f'GPU {d}' for d in b['dst'])}"
                  + (f"; swept {b['swept_blocks']:,} blocks (every {b['sweep_ms']:g} ms)" if b.get("sweep_ms") else ""),
                  highlight=False)


CONTROL_HELP = "Controller mode (none, deepum, deepum-prefetch, deepum-preevict, ...): observe and act."
BUDGET_HELP = ("Soft cap on the target's GPU-resident managed memory (e.g. 8GiB): umctl pre-evicts to stay "
               "under it, so oversubscription policies run without asking the driver for more than the card has.")

SWEEP_HELP = ("With --budget: every this many ms, move out again the blocks umctl evicted (100 ms or more ago) "
              "and has not seen fault back -- a safeguard for a control loop that falls behind its events. "
              "Off (0) by default: on a loop that keeps up it evicts blocks in use (docs/live.md).")

# -- commands -------------------------------------------------------------------------------

def attach_command(
    pid: int = typer.Option(..., "--pid", "-p", help="Process to observe (needs ptrace rights: sudo)."),
    duration: Optional[float] = typer.Option(None, "--duration", "-d", help="Stop after this many seconds."),
    output: Optional[str] = typer.Option(None, "--output", "-o", help="Also record the events to this trace file."),
    kinds: str = typer.Option("default", "--kinds", "-k", help=KINDS_HELP),
    interval: float = typer.Option(1.0, "--interval", "-i", help="Seconds between live updates."),
    ring_entries: int = typer.Option(2 ** 18, "--ring-entries", help="Event ring size (a power of two)."),
    flush_ms: Optional[float] = typer.Option(None, "--flush-ms", help="Force the driver to deliver pending events this often (0: never; default: 5 ms with migrations or --mode, else never)."),
    launches: bool = typer.Option(True, "--launches/--no-launches", help="Kernel launches through the BPF probe."),
    as_json: bool = typer.Option(False, "--json", help="Print the final summary as JSON."),
    mode: Optional[str] = typer.Option(None, "--mode", "-m", help=CONTROL_HELP),
    budget: Optional[str] = typer.Option(None, "--budget", "-b", help=BUDGET_HELP),
    budget_sweep: float = typer.Option(0.0, "--budget-sweep", help=SWEEP_HELP),
    option: Optional[List[str]] = typer.Option(None, "--option", "-O", help="Mode option KEY=VALUE (e.g. degree=8)."),
    degree: Optional[int] = typer.Option(None, "--degree", help="DeepUM's prefetch degree N (kernels ahead)."),
    spare_gpus: int = typer.Option(0, "--spare-gpus", help="Evict over the budget into this many neighbour GPUs' memory instead of the host."),
    rate: Optional[str] = typer.Option(None, "--rate", help="Cap on the data umctl itself moves, per second (e.g. 20GB)."),
    source: str = typer.Option("uvmtools", "--source", help=SOURCE_HELP),
    sample: Optional[str] = typer.Option(None, "--sample", help=SAMPLE_HELP),
) -> None:
    """Observe a running process's Unified Memory live, and with --mode control it.

    Attaches to an unmodified process through the UVM tools API (no restart, no LD_PRELOAD);
    Ctrl-C or the target's exit detaches cleanly and leaves the target as it was.

    Examples:

      [bold]sudo umctl attach --pid 4242[/bold]

      [bold]sudo umctl attach --pid 4242 --duration 30 -o run.parquet --kinds all[/bold]

      [bold]sudo umctl attach --pid 4242 --mode deepum --degree 32 --budget 8GiB[/bold]

      [bold]sudo umctl attach --pid 4242 --mode none --budget 8GiB[/bold]   (LRU baseline)

      [bold]sudo umctl attach --pid 4242 --sample 1[/bold]   (every event, not a 10% sample: exact totals)
    """
    from .main import check_output_path

    check_output_path(output, "trace")
    control = (ControlSpec(mode, budget, option, degree, spare_gpus, rate, budget_sweep=budget_sweep)
               if (mode or budget or option or degree is not None or spare_gpus or rate) else None)
    frac = _resolve_sample(sample, recording=output is not None, control=control is not None)
    src = _attach(pid, kinds, ring_entries, flush_ms, control, source, sample=frac)
    stats, st, reason = _observe(src, command="attach", duration=duration, output=output, interval=interval,
                                 launches=launches, live=not as_json, control=control)
    if as_json:
        import json
        print(json.dumps({"summary": _summary_dict(stats), "source": st, "end": reason}, indent=1, default=str))
    else:
        _print_summary("attach", stats, st, reason)
        _print_control(st)


def _summary_dict(s: LiveStats) -> dict:
    return {"pid": s.pid, "comm": s.comm, "faults": s.faults, "batches": s.batches, "cpu_faults": s.cpu_faults,
            "thrashing": s.thrashing, "dropped": s.dropped, "launches": s.launches, "h2d": s.h2d, "d2h": s.d2h,
            "counters": s.counters, "top_kernels": s.top_kernels(5),
            "top_blocks": [(f"0x{b << 21:x}", c) for b, c in s.top_blocks(5)]}


def record_command(
    pid: int = typer.Option(..., "--pid", "-p", help="Process to record (needs ptrace rights: sudo)."),
    output: str = typer.Option(..., "--output", "-o", help="Trace file to write (.parquet)."),
    duration: Optional[float] = typer.Option(None, "--duration", "-d", help="Stop after this many seconds."),
    kinds: str = typer.Option("default", "--kinds", "-k", help=KINDS_HELP),
    ring_entries: int = typer.Option(2 ** 18, "--ring-entries", help="Event ring size (a power of two)."),
    flush_ms: Optional[float] = typer.Option(None, "--flush-ms", help="Force event delivery this often (0: never; default: 5 ms with migrations, else never)."),
    launches: bool = typer.Option(True, "--launches/--no-launches", help="Kernel launches through the BPF probe."),
) -> None:
    """Record a running process's UVM events to a trace file that [bold]umctl replay[/bold] can replay.

    Examples:

      [bold]sudo umctl record --pid 4242 -o run.parquet --duration 60[/bold]

      [bold]umctl replay run.parquet --mode none,oracle[/bold]
    """
    from .main import check_output_path

    check_output_path(output, "trace")
    src = _attach(pid, kinds, ring_entries, flush_ms)
    stats, st, reason = _observe(src, command="record", duration=duration, output=output, interval=1.0,
                                 launches=launches, live=True)
    _print_summary("record", stats, st, reason)


def _wait_for_cuda(child: subprocess.Popen, timeout: float | None) -> None:
    """Poll the child's fd table until /dev/nvidia-uvm appears (its first CUDA use) or it exits."""
    t0 = time.monotonic()
    while True:
        if child.poll() is not None:
            raise NoUvm(f"{child.args[0] if isinstance(child.args, list) else child.args} exited (status "
                        f"{child.returncode}) without using CUDA Unified Memory; nothing recorded")
        try:
            if uvm_fds(child.pid):
                return
        except LiveError:
            pass
        if timeout is not None and time.monotonic() - t0 > timeout:
            raise NoUvm(f"process {child.pid} did not open /dev/nvidia-uvm within {timeout:g} s")
        time.sleep(0.001)


def run_command(
    cmd: List[str] = typer.Argument(..., help="The program and its arguments (after --)."),
    output: Optional[str] = typer.Option(None, "--output", "-o", help="Trace file to write (.parquet)."),
    kinds: str = typer.Option("default", "--kinds", "-k", help=KINDS_HELP),
    duration: Optional[float] = typer.Option(None, "--duration", "-d", help="Stop recording after this many seconds (the program keeps running)."),
    wait_cuda: Optional[float] = typer.Option(None, "--wait-cuda", help="Give up if the program has not used CUDA after this many seconds."),
    launches: bool = typer.Option(True, "--launches/--no-launches", help="Kernel launches through the BPF probe."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No live status line."),
    mode: Optional[str] = typer.Option(None, "--mode", "-m", help=CONTROL_HELP),
    budget: Optional[str] = typer.Option(None, "--budget", "-b", help=BUDGET_HELP),
    budget_sweep: float = typer.Option(0.0, "--budget-sweep", help=SWEEP_HELP),
    option: Optional[List[str]] = typer.Option(None, "--option", "-O", help="Mode option KEY=VALUE (e.g. degree=8)."),
    degree: Optional[int] = typer.Option(None, "--degree", help="DeepUM's prefetch degree N (kernels ahead)."),
    spare_gpus: int = typer.Option(0, "--spare-gpus", help="Evict over the budget into this many neighbour GPUs' memory."),
    rate: Optional[str] = typer.Option(None, "--rate", help="Cap on the data umctl itself moves, per second."),
    runtime: bool = typer.Option(False, "--runtime", help="Preload umctl's in-process runtime: exact kernel names and "
                                 "argument hashes, allocator events (replaces the BPF launch probe)."),
    managed: bool = typer.Option(False, "--managed", help="Runtime: cudaMalloc becomes cudaMallocManaged (DeepUM's runtime), "
                                 "so the program can use more memory than the GPU has."),
    hum: bool = typer.Option(False, "--hum", help="Runtime: host-to-device cudaMemcpy(Async) become HUM's asynchronous "
                             "chunked migrations with write-protected sources (same as --mode hum)."),
    gpus: Optional[int] = typer.Option(None, "--gpus", help="--mode snurhac/snurhac-dp: spread the program's "
                                       "partitionable kernels (runtime/umctl_snurhac.h) over GPUs 0..N-1."),
) -> None:
    """Start a program and record or control it from its first CUDA use; exits with its status.

    As the program's parent umctl may duplicate its fds without sudo (Yama ptrace_scope <= 1).

    Examples:

      [bold]umctl run -o train.parquet -- python3 train.py --epochs 1[/bold]

      [bold]umctl run -o sweep.parquet --kinds all -- ./sweep 1GiB[/bold]

      [bold]umctl run --mode deepum --budget 8GiB --runtime --managed -- python3 train.py[/bold]

      [bold]umctl run --mode hum -- ./app[/bold]   (HUM: copies overlap host work; results unchanged)

      [bold]umctl run --mode snurhac-dp --gpus 4 -- ./gemm[/bold]   (SnuRHAC: one program over 4 GPUs)
    """
    if not cmd:
        raise UmctlError("no program given (umctl run -o trace.parquet -- CMD ...)")
    from .main import check_output_path

    check_output_path(output, "trace")   # before the program starts
    if mode is not None and mode.startswith("hum"):
        # HUM is a runtime mechanism (the program's copies change): nothing to steer, unless
        # a budget is asked for too
        hum, mode = True, None
    control = (ControlSpec(mode, budget, option, degree, spare_gpus, rate, gpus, live_run=True, budget_sweep=budget_sweep)
               if (mode or budget or option or degree is not None or spare_gpus or rate or gpus is not None) else None)
    rt_extra: dict[str, str] = {}
    if control is not None and control.gpus is not None:
        # SnuRHAC's runtime: cudaMalloc becomes managed memory that every GPU reaches, and the
        # runtime partitions the convention's kernels over the GPUs
        runtime = managed = True
        rt_extra["gpus"] = str(control.gpus)
    if output is None and control is None and not (hum or runtime or managed):
        raise UmctlError("nothing to do: give -o TRACE to record, --mode/--budget to control, "
                         "--runtime/--managed/--hum to run under the runtime, or several")
    rt_source = None
    env = None
    if runtime or managed or hum:
        from ..runtime import child_env
        from ..sources.runtime import RuntimeSource

        # A controller wants launches when the kernel starts (DeepUM's execution-ID
        # transitions): the runtime then also reports kernel ends (runtime/README.md)
        starts = control is not None
        rt_source = RuntimeSource(kernel_starts=starts)
        rt_source.start()
        if control is not None and control.controller.live_invalidates():
            rt_extra["control"] = "1"   # the runtime takes umctl's safe-discard requests
        env = child_env(socket=rt_source.path, managed=managed, hum=hum, **({"track_end": "1"} if starts else {}),
                        **rt_extra)
    try:
        child = subprocess.Popen(cmd, env=env)
    except OSError as e:
        if rt_source is not None:
            rt_source.close()
        raise UmctlError(f"cannot start {cmd[0]}: {e.strerror or e}") from e
    rc: int | None = None
    try:
        _wait_for_cuda(child, wait_cuda)
        src = None
        deadline = time.monotonic() + 5.0
        while src is None:  # the fd exists a moment before CUDA has set up its va_space
            try:
                src = _attach(child.pid, kinds, 2 ** 18, None, control)
            except NoUvm:
                if child.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.002)
        stats, st, reason = _observe(src, command="run", duration=duration, output=output, interval=1.0,
                                     launches=launches, live=not quiet, child=child,
                                     extra_meta={"command": cmd, "mode": "hum" if hum else (control.mode if control else None),
                                                 "gpus": control.gpus if control else None,
                                                 "runtime": {"managed": managed, "hum": hum} if rt_source else None},
                                     control=control, launch_source=rt_source)
        _print_summary("run", stats, st, reason)
        _print_control(st)
        rc = child.wait()
    except TargetExited:
        rc = child.wait()
        raise
    finally:
        if rt_source is not None:
            rt_source.close()  # idempotent: _observe closes it too
        if rc is None and child.poll() is None:
            child.terminate()
            try:
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                child.kill()
    if rc:
        raise typer.Exit(rc if rc > 0 else 128 - rc)


def top_command(
    pid: Optional[int] = typer.Option(None, "--pid", "-p", help="Only this process (default: every process using UVM)."),
    once: bool = typer.Option(False, "--once", help="Print one snapshot (sampled over --interval) and exit."),
    interval: float = typer.Option(1.0, "--interval", "-i", help="Seconds between refreshes (and the --once sample)."),
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

    from ..tui.top import SORT_KEYS

    if sort not in SORT_KEYS.values():
        raise UmctlError(f"unknown sort key {sort!r} (choose from {', '.join(SORT_KEYS.values())})")
    kind_set = parse_kinds(kinds)
    frac = _resolve_sample(sample, recording=False, control=False)
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
                probe = _start_launch_probe(p, launches)
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
                _feed(stats, src, _merge(src.drain(), probe))
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
                        from ..events.schema import Kind as _K
                        kind_set = kind_set - {_K.MIGRATION} if _K.MIGRATION in kind_set else kind_set | {_K.MIGRATION}
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

