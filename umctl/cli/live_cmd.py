"""``umctl attach / record / run``: the CLI of a live session (umctl.live.session.Session).

These commands parse arguments, build the session's parts (a source from umctl.live.attach, a
control spec from umctl.live.spec) and render: a status line while the session runs and the
summary after. The loop, its stop handling and the trace are the session's.
"""

from __future__ import annotations

import subprocess
from typing import Annotated, List, Optional

import typer

from .. import UmctlError
from ..exporter import control_state  # noqa: F401 - registers the exporter's observer of control loops
from ..live.attach import attach_child, attach_source, resolve_sample, start_program
from ..live.session import Session, SessionResult
from ..live.spec import ControlSpec, runtime_copies
from ..report.base import get_reporter
from ..report.live import budget_check_line  # noqa: F401 - the budget verdict's line, as the summary prints it
from ..sources.uvmtools import LiveError, NoUvm, TargetExited
from ..tui.top import summary_line
from ..units import format_bytes
from .common import KINDS_HELP, SAMPLE_HELP, check_output_path, err, out

SOURCE_HELP = ("Where events come from: uvmtools (the UVM tools API; works everywhere the driver runs) or "
               "kprobe (BPF on nvidia_uvm's fault path: needs a kernel with kprobes and the module's BTF; "
               "commands then go through the umctl kernel module).")

CONTROL_HELP = "Controller mode (none, deepum, deepum-prefetch, deepum-preevict, ...): observe and act."
BUDGET_HELP = ("Soft cap on the target's GPU-resident managed memory (e.g. 8GiB): umctl pre-evicts to stay "
               "under it, so oversubscription policies run without asking the driver for more than the card has. "
               "It turns the driver's migration events on (slower fault service) so that the summary can check it: "
               "'budget NOT held' when the true residency (2 MiB blocks holding any page) was above the budget plus "
               "slack -- max(2 %, 4 MiB) + 64 MiB in flight -- for more than 1 % of the run (docs/guide/control.md).")

HOLD_HELP = ("How --budget is held. admit (the default under umctl run's runtime): managed memory prefers the "
             "host, so the driver maps pages remotely on a GPU fault and only umctl moves blocks onto the GPU, "
             "admitting them while the budget has room: it holds by construction, but a miss is served over the "
             "link until umctl admits the block. evict (attach's only way): the driver migrates on every fault and "
             "umctl evicts afterwards; it does not hold against a program that faults faster than umctl evicts.")

SWEEP_HELP = ("With --budget: every this many ms, move out again the blocks umctl evicted (100 ms or more ago) "
              "and has not seen fault back -- a safeguard for a control loop that falls behind its events. "
              "Off (0) by default: on a loop that keeps up it evicts blocks in use (docs/evaluation/live-control.md).")


def _observe(src, *, command: str, live: bool, **kw) -> SessionResult:
    """Run a session on ``src``, rendering its status line once per interval on stderr (a
    transient line on a terminal, plain lines otherwise; none when not ``live``)."""
    from rich.live import Live

    display = Live(console=err, refresh_per_second=4, transient=True) if (err.is_terminal and live) else None

    def tick(s: Session) -> None:
        text = summary_line(s.stats, s.elapsed(), s.lag_p99_ms())
        if s.control is not None:
            text += f"  [{_control_line(s.control)}]"
        if display is not None:
            display.update(text)
        elif live:
            err.print(text, highlight=False, soft_wrap=True)

    def warn(text: str) -> None:
        err.print(f"umctl: {text}", highlight=False)

    session = Session(src, command=command, on_tick=tick, on_warning=warn, **kw)
    if display is not None:
        display.start()
    try:
        return session.run()
    finally:
        if display is not None:
            display.stop()


# The options that attach, record and run share, declared once (typer reads them from the
# annotation; each command gives its own default).
KindsOpt = Annotated[str, typer.Option("--kinds", "-k", help=KINDS_HELP)]
LaunchesOpt = Annotated[bool, typer.Option("--launches/--no-launches", help="Kernel launches through the BPF probe.")]
ModeOpt = Annotated[Optional[str], typer.Option("--mode", "-m", help=CONTROL_HELP)]
BudgetOpt = Annotated[Optional[str], typer.Option("--budget", "-b", help=BUDGET_HELP)]
SweepOpt = Annotated[float, typer.Option("--budget-sweep", help=SWEEP_HELP)]
HoldOpt = Annotated[Optional[str], typer.Option("--budget-hold", help=HOLD_HELP, metavar="admit|evict")]
ModeOptionOpt = Annotated[Optional[List[str]], typer.Option("--option", "-O", help="Mode option KEY=VALUE (e.g. degree=8).")]
DegreeOpt = Annotated[Optional[int], typer.Option("--degree", help="DeepUM's prefetch degree N (kernels ahead).")]
SpareOpt = Annotated[int, typer.Option("--spare-gpus", help="Evict over the budget into this many neighbour GPUs' "
                                       "memory instead of the host.")]
RateOpt = Annotated[Optional[str], typer.Option("--rate", help="Cap on the data umctl itself moves, per second "
                                                "(e.g. 20GB).")]


def _control_spec(mode, budget, option, degree, spare_gpus, rate, gpus=None, *, live_run=False,
                  budget_sweep=0.0, hold=None) -> ControlSpec | None:
    """A control spec when any control flag is given, else None (observe only)."""
    if not (mode or budget or option or degree is not None or spare_gpus or rate or gpus is not None
            or hold is not None):
        return None
    return ControlSpec(mode, budget, option, degree, spare_gpus, rate, gpus, live_run=live_run,
                       budget_sweep=budget_sweep, hold=hold)


def _print_summary(r: SessionResult, as_json: bool = False) -> None:
    """The end-of-session summary, as text or (``--json``) the versioned JSON document: one
    reporter of the session's typed summary either way (umctl/report/live.py)."""
    get_reporter("session", "json" if as_json else "table").render(r.summary(), out)


def _control_line(ctl) -> str:
    s = ctl.act.stats()["counts"]
    res = ctl.res.resident_bytes(0)
    bud = f"/{format_bytes(ctl.budget.nbytes)}" if ctl.budget is not None else ""
    return (f"{ctl.ctl.name}: {ctl.commands:,} cmds, {s['ok']:,} ok, {s['failed'] + s['target_gone']:,} failed, "
            f"resident~{format_bytes(res)}{bud}")


# -- commands -------------------------------------------------------------------------------

def attach_command(
    pid: int = typer.Option(..., "--pid", "-p", help="Process to observe (needs ptrace rights: sudo)."),
    duration: Optional[float] = typer.Option(None, "--duration", "-d", help="Stop after this many seconds."),
    output: Optional[str] = typer.Option(None, "--output", "-o", help="Also record the events to this trace file."),
    kinds: KindsOpt = "default",
    interval: float = typer.Option(1.0, "--interval", "-i", help="Seconds between live updates."),
    ring_entries: int = typer.Option(2 ** 18, "--ring-entries", help="Event ring size (a power of two)."),
    flush_ms: Optional[float] = typer.Option(None, "--flush-ms", help="Force the driver to deliver pending events this often (0: never; default: 5 ms with migrations or --mode, else never)."),
    launches: LaunchesOpt = True,
    as_json: bool = typer.Option(False, "--json", help="Print the final summary as JSON."),
    mode: ModeOpt = None,
    budget: BudgetOpt = None,
    budget_sweep: SweepOpt = 0.0,
    budget_hold: HoldOpt = None,
    option: ModeOptionOpt = None,
    degree: DegreeOpt = None,
    spare_gpus: SpareOpt = 0,
    rate: RateOpt = None,
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
    check_output_path(output, "trace")
    control = _control_spec(mode, budget, option, degree, spare_gpus, rate, budget_sweep=budget_sweep,
                            hold=budget_hold)
    frac = resolve_sample(sample, recording=output is not None, control=control is not None)
    src = attach_source(pid, kinds, ring_entries, flush_ms, control, source, sample=frac)
    r = _observe(src, command="attach", duration=duration, output=output, interval=interval,
                 probe_launches=launches, live=not as_json, control=control)
    _print_summary(r, as_json)


def record_command(
    pid: int = typer.Option(..., "--pid", "-p", help="Process to record (needs ptrace rights: sudo)."),
    output: str = typer.Option(..., "--output", "-o", help="Trace file to write (.parquet)."),
    duration: Optional[float] = typer.Option(None, "--duration", "-d", help="Stop after this many seconds."),
    kinds: KindsOpt = "default",
    ring_entries: int = typer.Option(2 ** 18, "--ring-entries", help="Event ring size (a power of two)."),
    flush_ms: Optional[float] = typer.Option(None, "--flush-ms", help="Force event delivery this often (0: never; default: 5 ms with migrations, else never)."),
    launches: LaunchesOpt = True,
) -> None:
    """Record a running process's UVM events to a trace file that [bold]umctl replay[/bold] can replay.

    Examples:

      [bold]sudo umctl record --pid 4242 -o run.parquet --duration 60[/bold]

      [bold]umctl replay run.parquet --mode none,oracle[/bold]
    """
    check_output_path(output, "trace")
    src = attach_source(pid, kinds, ring_entries, flush_ms)
    r = _observe(src, command="record", duration=duration, output=output, interval=1.0, probe_launches=launches,
                 live=True)
    _print_summary(r)


def _run_on_hosts(hosts: str, mode: Optional[str], gpus: Optional[int], cmd: List[str]) -> None:
    """SnuRHAC over nodes (umctl/cluster): mpirun starts a node agent a node, each runs the
    program under the runtime; exits with mpirun's status."""
    import shutil

    from ..cluster.live import mpirun_command

    if mode != "snurhac":
        raise UmctlError("--hosts is for --mode snurhac (the cluster has no live prefetching yet)")
    if not shutil.which("mpirun"):
        raise UmctlError("--hosts needs mpirun (e.g. apt-get install openmpi-bin) and mpi4py (pip install 'umctl[mpi]')")
    code, line = program_exit_status(subprocess.run(mpirun_command(hosts, cmd, gpus_per_node=gpus or 1)).returncode)
    if line:
        err.print(f"umctl: {line}", highlight=False)
    raise typer.Exit(code)


def program_exit_status(returncode: int) -> tuple[int, str | None]:
    """``umctl run``'s exit status for its program's ``returncode`` (Popen's: -N when signal N
    killed it), and the line that says so on stderr (None for a clean exit). 128 + N for a
    signal, as a shell reports it: a negative status would reach the shell as 256 - N."""
    import signal

    if returncode == 0:
        return 0, None
    if returncode > 0:
        return returncode, f"program exited with status {returncode}"
    n = -returncode
    try:
        name = f" ({signal.Signals(n).name})"
    except ValueError:
        name = ""
    return 128 + n, f"program killed by signal {n}{name}"


def _wait_program(child: subprocess.Popen, signum: int | None) -> int:
    """The program's status once it has exited. After a signal stopped the session: SIGTERM
    (sent to umctl alone, as a service manager does) is passed on; Ctrl-C from a terminal has
    reached the program already (same process group) and is not sent twice, which would cut
    short a program's own clean shutdown -- umctl says it is waiting, and one more Ctrl-C
    stops the program (run_command's cleanup)."""
    import signal

    if signum is None:
        return child.wait()
    if signum == signal.SIGTERM and child.poll() is None:
        child.send_signal(signal.SIGTERM)
    try:
        return child.wait(timeout=1.0)
    except subprocess.TimeoutExpired:
        err.print(f"umctl: waiting for the program (pid {child.pid}) to exit; Ctrl-C again to stop it",
                  highlight=False)
        return child.wait()


def run_command(
    cmd: List[str] = typer.Argument(..., help="The program and its arguments (after --)."),
    output: Optional[str] = typer.Option(None, "--output", "-o", help="Trace file to write (.parquet)."),
    kinds: KindsOpt = "default",
    duration: Optional[float] = typer.Option(None, "--duration", "-d", help="Stop recording after this many seconds (the program keeps running)."),
    wait_cuda: Optional[float] = typer.Option(None, "--wait-cuda", help="Give up if the program has not used CUDA after this many seconds."),
    launches: LaunchesOpt = True,
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No live status line."),
    mode: ModeOpt = None,
    budget: BudgetOpt = None,
    budget_sweep: SweepOpt = 0.0,
    budget_hold: HoldOpt = None,
    option: ModeOptionOpt = None,
    degree: DegreeOpt = None,
    spare_gpus: SpareOpt = 0,
    rate: RateOpt = None,
    runtime: bool = typer.Option(False, "--runtime", help="Preload umctl's in-process runtime: exact kernel names and "
                                 "argument hashes, allocator events (replaces the BPF launch probe)."),
    managed: bool = typer.Option(False, "--managed", help="Runtime: cudaMalloc becomes cudaMallocManaged (DeepUM's runtime), "
                                 "so the program can use more memory than the GPU has."),
    hum: bool = typer.Option(False, "--hum", help="Runtime: host-to-device cudaMemcpy(Async) become HUM's asynchronous "
                             "chunked migrations with write-protected sources (same as --mode hum)."),
    gpus: Optional[int] = typer.Option(None, "--gpus", help="--mode snurhac/snurhac-dp: spread the program's "
                                       "partitionable kernels (runtime/umctl_snurhac.h) over GPUs 0..N-1."),
    hosts: Optional[str] = typer.Option(None, "--hosts", help="--mode snurhac: one program over these nodes "
                                        "(host[:slots],..., through mpirun and mpi4py; --gpus per node)."),
    complete_accesses: bool = typer.Option(False, "--complete-accesses", help="Record every kernel's whole "
                                           "access set: after each kernel the runtime sends all managed memory "
                                           "back to the host, so the next kernel faults all it touches (implies "
                                           "--runtime --managed; slow: for a replay at any GPU size)."),
) -> None:
    """Start a program and record or control it from its first CUDA use; exits with its status.

    As the program's parent umctl may duplicate its fds without sudo (Yama ptrace_scope <= 1).

    Exit status: the program's, or 128+N when signal N killed it, said in one line on stderr
    (umctl's own errors before the program runs: 2). Ctrl-C or SIGTERM to umctl stop the
    recording cleanly (the trace is complete up to that moment) and, once the program has
    exited, exit 130 / 143 whatever its status: Ctrl-C from a terminal reaches the program
    too, SIGTERM is passed on to it. A program that exits before using CUDA leaves no trace:
    with -o that is an error when it exited 0.

    Examples:

      [bold]umctl run -o train.parquet -- python3 train.py --epochs 1[/bold]

      [bold]umctl run -o sweep.parquet --kinds all -- ./sweep 1GiB[/bold]

      [bold]umctl run --mode deepum --budget 8GiB --runtime --managed -- python3 train.py[/bold]

      [bold]umctl run --mode hum -- ./app[/bold]   (HUM: copies overlap host work; results unchanged)

      [bold]umctl run --complete-accesses -o full.parquet -- python3 train.py --steps 2[/bold]   (every access faults: replay at any GPU size)

      [bold]umctl run --mode snurhac-dp --gpus 4 -- ./gemm[/bold]   (SnuRHAC: one program over 4 GPUs)

      [bold]umctl run --mode snurhac --hosts n1:1,n2:1 --gpus 4 -- ./gemm[/bold]   (over 2 nodes of 4 GPUs, MPI)
    """
    if not cmd:
        raise UmctlError("no program given (umctl run -o trace.parquet -- CMD ...)")
    if hosts is not None:
        _run_on_hosts(hosts, mode, gpus, cmd)
    check_output_path(output, "trace")   # before the program starts
    if output:
        from ..events.trace import check_trace_path

        check_trace_path(output)
    if runtime_copies(mode):
        # the runtime is the whole mode (the program's copies change): nothing to steer, unless
        # a budget is asked for too
        hum, mode = True, None
    control = _control_spec(mode, budget, option, degree, spare_gpus, rate, gpus, live_run=True,
                            budget_sweep=budget_sweep, hold=budget_hold)
    if complete_accesses:
        if hum or (control is not None and (control.budget is not None or control.gpus is not None)):
            raise UmctlError("--complete-accesses records a program's accesses: it takes no --budget, "
                             "--gpus or HUM (it moves all managed memory home after every kernel)")
        if not output:
            raise UmctlError("--complete-accesses is for recording: give -o TRACE")
        runtime = managed = True
        if kinds == "default":
            kinds = "+migrations"   # what moved onto the GPU is the access set (workload/tracefile.py)
    managed = managed or (control is not None and control.gpus is not None)
    if output is None and control is None and not (hum or runtime or managed):
        raise UmctlError("nothing to do: give -o TRACE to record, --mode/--budget to control, "
                         "--runtime/--managed/--hum to run under the runtime, or several")
    child, rt_source = start_program(cmd, control=control, runtime=runtime, managed=managed, hum=hum,
                                     evict_each=complete_accesses)
    rc: int | None = None
    before_cuda: LiveError | None = None
    try:
        try:
            src = attach_child(child, kinds, control, wait_cuda)
        except (NoUvm, TargetExited) as e:
            if child.poll() is None:   # --wait-cuda ran out: umctl's failure, the program is stopped below
                raise
            rc, src, before_cuda = child.returncode, None, e   # it exited before umctl could observe it
        if src is not None:
            meta = {"command": cmd, "mode": "hum" if hum else (control.mode if control else None),
                    "gpus": control.gpus if control else None,
                    "runtime": {"managed": managed, "hum": hum, "complete_accesses": complete_accesses}
                    if rt_source else None}
            r = _observe(src, command="run", duration=duration, output=output, interval=1.0, probe_launches=launches,
                         live=not quiet, child=child, meta=meta, control=control, launches=rt_source)
            _print_summary(r)
            rc = _wait_program(child, r.signal)
    finally:
        if rt_source is not None:
            rt_source.close()  # idempotent: the session closes it too
        if rc is None and child.poll() is None:   # umctl failed or was interrupted: the program goes too
            child.terminate()
            try:
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                child.kill()
    code, line = program_exit_status(rc)
    if before_cuda is not None:
        if code == 0 and output:   # the trace asked for does not exist: that is umctl's failure
            raise before_cuda
        if output or control is not None:
            line = (f"{line or 'program exited with status 0'} before umctl saw it use CUDA Unified Memory; "
                    f"nothing {'recorded' if output else 'controlled'}")
    if line:
        err.print(f"umctl: {line}", highlight=False, soft_wrap=True)
    if code:
        raise typer.Exit(code)
