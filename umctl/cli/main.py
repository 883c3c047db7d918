"""``umctl``: entry point. Every user-facing failure is one line on stderr and a non-zero
exit; tracebacks are for bugs only (set UMCTL_DEBUG=1 to see them for any error).

The exit status is the truth: a command's own status (``typer.Exit``), 2 for a usage error or
an UmctlError, 130 after Ctrl-C and 143 after SIGTERM (``umctl: interrupted`` on stderr, in
every phase: see :mod:`umctl.interrupts`), and for ``umctl run`` its program's status."""

from __future__ import annotations

import sys

if __name__ == "__main__":
    # python3 -m umctl.cli.main: umctl runs (and exits) from here, so that Ctrl-C is handled
    # from before the imports below; the CLI is this module imported again, under its name
    from umctl.interrupts import run_cli as _run_cli

    def _load_main():
        from umctl.cli.main import main

        return main

    _run_cli(_load_main)

import json
import os
from typing import List, Optional

import typer
from rich.markup import escape

from .. import UmctlError, __version__
from .common import check_output_path, err, out
from .common import describe as _describe
from .common import overrides as _overrides

app = typer.Typer(
    name="umctl",
    help="Observe and control CUDA Unified Memory: fault streams, prefetch/eviction policies, "
         "and replays on a calibrated UVM simulator.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},   # inherited by every subcommand
)


def _print_version(value: bool) -> None:
    if value:
        out.print(f"umctl {__version__}", highlight=False)
        raise typer.Exit(0)


@app.callback()
def _umctl(
    version: bool = typer.Option(False, "--version", "-V", callback=_print_version, is_eager=True,
                                 help="Print the umctl version and exit."),
) -> None:
    # the top level's own options (the group's help is the Typer's)
    pass


#: The commands that live in modules of their own, in the order ``umctl --help`` lists them:
#: name -> (module, function, settings). Each is imported only when the command line names
#: it (or for the full help): the live commands pull in numpy, the trace commands pyarrow,
#: and ``umctl version`` or ``umctl replay -h`` need neither (start-up time).
_SUBCOMMANDS: dict[str, tuple[str, str, dict]] = {
    "attach": ("live_cmd", "attach_command", {}),
    "top": ("top_cmd", "top_command", {}),
    "exporter": ("exporter_cmd", "exporter_command", {}),
    "record": ("live_cmd", "record_command", {}),
    "run": ("live_cmd", "run_command", {"context_settings": {"allow_extra_args": True,
                                                            "ignore_unknown_options": True}}),
    "sweep": ("sweep_cmd", "sweep_command", {}),
    "capture": ("capture_cmd", "capture_command", {}),
    "advise": ("advise_cmd", "advise_command", {}),
    "scenarios": ("scenarios_cmd", "scenarios_command",
                  {"help": "List the built-in scenarios and their parameters.\n\n"
                           "Example: [bold]umctl scenarios --family dnn[/bold]"}),
}
_GROUPS = {"trace": ("trace_cmd", "app", {"help": "Inspect and export trace files."})}
_mounted: set[str] = set()


def _mount_subcommands(names: set[str] | None = None) -> None:
    """Register the commands named (all of them by default) that live in their own modules;
    each once, since main() may run often (tests). Registration keeps ``_SUBCOMMANDS``'
    order, after the commands of this file, whatever order they were asked for in."""
    import importlib

    wanted = set(_SUBCOMMANDS) | set(_GROUPS) if names is None else names
    for name in [n for n in (*_SUBCOMMANDS, *_GROUPS) if n in wanted and n not in _mounted]:
        module, attr, settings = _SUBCOMMANDS.get(name) or _GROUPS[name]
        obj = getattr(importlib.import_module(f".{module}", __package__), attr)
        if name in _GROUPS:
            app.add_typer(obj, name=name, **settings)
        else:
            app.command(name, **settings)(obj)
        _mounted.add(name)
    order = {n: i for i, n in enumerate(_SUBCOMMANDS)}
    app.registered_commands.sort(key=lambda c: order.get(c.name or "", -1))   # stable: this file's first


def command_tree():
    """The whole ``umctl`` command as click sees it, every subcommand mounted: what a test or a
    documentation tool parses example command lines against without running them."""
    _mount_subcommands(None)
    return typer.main.get_command(app)


def _command_named(args: list[str]) -> str | None:
    """The subcommand an argument list names: its first word that is not an option (the top
    level takes only flags: --help/-h, --version/-V)."""
    return next((a for a in args if not a.startswith("-")), None)


def _run_replay(target: str, modes: str, overrides: dict[str, str], seed: int, png: Optional[str],
                as_json: bool, record: Optional[str], mode_opts: Optional[List[str]] = None,
                drain_us: Optional[float] = None, calibration: Optional[str] = None,
                timeline: Optional[str] = None, calib_set: Optional[List[str]] = None,
                max_rss: Optional[str] = None, budget: Optional[str] = None, bound: bool = True) -> None:
    from ..controller.options import parse_mode_options
    from ..report.base import get_reporter
    from ..results import ReplayReport
    from ..sim.calibration import DEFAULT as DEFAULT_CALIBRATION
    from ..sim.calibration import Calibration
    from ..sim.replay import parse_modes, replay_results, result_rows, run_modes
    from ..workload.workfile import resolve as resolve_target   # scenarios, traces and .umw captures

    check_output_path(png, "figure")
    check_output_path(timeline, "timeline")
    check_output_path(record, "trace")
    if record:
        from ..events.trace import check_trace_path

        check_trace_path(record)   # --record DIR: one line now, not DIR.partial after the replay
    mode_list = parse_modes(modes)
    options = parse_mode_options(mode_opts, mode_list)
    from .common import DRAIN_US, check_number

    check_number(drain_us, "--drain-us", DRAIN_US, " µs")   # nan/inf/0 used to be tracebacks or a stall
    budget_bytes = parse_budget(budget)
    if calibration is not None and not calibration.strip():
        raise UmctlError("--calibration is empty: give a calibration file or a name such as h100-r580")
    from .progress import generate

    workload = generate(f"replay {target}", resolve_target, target, overrides, console=err)
    if not calibration and workload.meta.get("derived_from"):
        # a recorded trace: the constants measured on its GPU and driver, when shipped
        from ..sim.calibration import shipped_for

        calibration = shipped_for(workload.meta)
    calib = (Calibration.load(calibration) if calibration else DEFAULT_CALIBRATION).with_settings(calib_set)
    if modes.strip() == "all":  # every mode that applies (a named mode that does not is refused)
        from ..controller import make_controller

        mode_list = [m for m in mode_list if not make_controller(m, **options[m]).applies_to(workload)]
    recorder_for = None
    recorded: list[str] = []
    if record:
        from ..events.trace import TraceWriter

        def recorder_for(mode: str):
            path = record if len(mode_list) == 1 else _suffix(record, mode)
            recorded.append(path)
            meta = {"source": "umctl replay", "scenario": workload.name, "params": _jsonable(workload.params),
                    "mode": mode, "seed": seed, "gpu_mem": list(workload.gpu_mem),
                    "calibration": calib.as_dict()}
            return TraceWriter(path, meta, names=workload.names)

    from ..sim.replay import parse_max_rss, workload_bound
    from .progress import Progress as CliProgress


    # a bar on a terminal, else a line on stderr about every 10 s (umctl/cli/progress.py);
    # a replay that would not fit in memory is refused before it starts (--max-rss)
    with CliProgress(f"replay {workload.name}", console=err, transient=as_json) as prog:
        lower = None
        if bound:
            # the lower bound every mode is measured against (umctl/sim/bound.py): on the
            # workload as given, before any mode prepares it, at the GPU's own size (a soft
            # --budget only adds evictions)
            with prog.phase("computing the lower bound"):
                lower = workload_bound(workload, calib)
        for m in mode_list:
            prog.add(m, len(workload.ops))
        results = run_modes(workload, mode_list, seed=seed, progress=prog.update, recorder_for=recorder_for,
                            mode_options=options, drain_ns=None if drain_us is None else int(drain_us * 1000),
                            calib=calib, timeline=bool(timeline), max_rss=parse_max_rss(max_rss),
                            budget_bytes=budget_bytes)
    title = _describe(workload)
    if budget_bytes is not None:   # which limit ran: the GPU's size (--gpu-mem) or the loop's budget
        from ..units import format_bytes

        title += (f"; under a soft budget of {format_bytes(budget_bytes)} (the live keeper evicts over it, "
                  "the GPU keeps its size)")
    # one typed report, rendered by the reporter each option picks (umctl/report/base.py)
    report = ReplayReport(replay_results(result_rows(results, lower), calib.name), title=title,
                          workload_name=workload.name,
                          calibration_from=calibration or "umctl/sim/calibration.py", sims=results)
    get_reporter("replay", "json" if as_json else "table").render(report, out)
    if recorded:   # with several modes the names are not the one given: say which they are
        err.print(f"wrote {', '.join(recorded)}", highlight=False, soft_wrap=True)
    for fmt, path in (("png", png), ("timeline", timeline)):
        if path:
            get_reporter("replay", fmt).render(report, path)
            err.print(f"wrote {path}")


def parse_budget(text: Optional[str]) -> Optional[int]:
    """``replay --budget``: a size (8GiB, 512MiB) or nothing; a bad one is a one-line error here,
    before the workload is generated (whether it is below the GPU is checked against it)."""
    if text is None:
        return None
    from ..units import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise UmctlError(f"--budget: {e}") from None


def _suffix(path: str, mode: str) -> str:
    root, ext = os.path.splitext(path)
    return f"{root}.{mode}{ext or '.parquet'}"


def _jsonable(d: dict) -> dict:
    return json.loads(json.dumps(d, default=str))


@app.command()
def replay(
    target: str = typer.Argument(..., help="Scenario name (see `umctl scenarios`), scenario file "
                                 "(file.toml or file.toml:name), trace file (.parquet) or captured model (.umw, umctl capture)."),
    mode: str = typer.Option("none,oracle", "--mode", "-m", help="Comma-separated controller modes, or 'all'."),
    oversub: Optional[float] = typer.Option(None, help="Oversubscription: managed footprint / GPU memory, in (0, 64]."),
    gpu_mem: Optional[str] = typer.Option(None, "--gpu-mem", help="Simulated GPU memory, e.g. 1GiB (64 KiB to 64 TiB)."),
    budget: Optional[str] = typer.Option(None, "--budget", "-b", help="Replay under the live soft budget, e.g. 256MiB "
                                         "(at least 2 MiB, below the GPU's memory): the GPU keeps its size and the "
                                         "control loop's keeper evicts what goes over the budget, as a live --budget "
                                         "does (--budget-hold evict); --gpu-mem instead makes the GPU smaller."),
    iters: Optional[int] = typer.Option(None, "--iters", help="Training iterations (loops), 1 to 10000."),
    seed: int = typer.Option(0, help="Seed of the scenario and the simulator."),
    param: Optional[List[str]] = typer.Option(None, "--param", "-p", help="Scenario parameter key=value (repeatable)."),
    png: Optional[str] = typer.Option(None, help="Write a figure of the comparison to this PNG."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list (one object per mode) instead of the table."),
    record: Optional[str] = typer.Option(None, help="Write each mode's simulated events to a trace file: "
                                         "out.parquet, or with several modes out.MODE.parquet each "
                                         "(the names written are printed on stderr). Written as "
                                         "NAME.partial and renamed when the replay finishes; an "
                                         "interrupted one keeps NAME.partial, marked incomplete."),
    mode_opt: Optional[List[str]] = typer.Option(None, "--mode-opt", "-O",
                                                 help="Controller option MODE.KEY=VALUE or KEY=VALUE "
                                                      "(e.g. deepum.degree=8, deepum.num_rows=512); repeatable."),
    drain_us: Optional[float] = typer.Option(None, "--drain-us", help="How often (simulated µs) events reach the "
                                             "controller, as a live source drains its ring (default 1000; above 0, at most 1e7)."),
    calibration: Optional[str] = typer.Option(None, "--calibration", help="Calibration file written by "
                                              "benchmarks/gpu/calibrate.py, or a shipped one by name (h100-r580, h200-r580); default: for a recorded trace "
                                              "the shipped one of its GPU and driver, else the H100 figures of docs/evaluation/measurements.md."),
    timeline: Optional[str] = typer.Option(None, "--timeline", help="Write host / copy / kernel timelines of every mode "
                                           "to this PNG (HUM figure 8 style); for short programs."),
    calib_set: Optional[List[str]] = typer.Option(None, "--calib-set", help="Change one constant of the calibration, "
                                                  "KEY=VALUE (repeatable), e.g. d2h_Bps=12.3e9 or "
                                                  "eviction_refresh=access: a what-if without a calibration file."),
    max_rss: Optional[str] = typer.Option(None, "--max-rss", help="Refuse up front a replay whose estimated peak "
                                          "memory is over this size (e.g. 4GiB); default: 80% of the memory "
                                          "available now."),
    bound: bool = typer.Option(True, "--bound/--no-bound", help="Compute the workload's lower bound and each mode's "
                               "'% of bound' (one GPU; umctl/sim/bound.py). Usually a fraction of one mode's "
                               "replay; irregular workloads (bfs) take a few times one."),
) -> None:
    """Replay a scenario or a recorded trace under controller modes, side by side.

    Examples:

      [bold]umctl replay gpt2-xl --mode none,oracle --oversub 2[/bold]

      [bold]umctl replay dlrm -m all --json[/bold]

      [bold]umctl replay gpt2-xl -m deepum-prefetch,deepum-preevict,deepum,oracle[/bold]  (DeepUM ablation)

      [bold]umctl replay bert-large -m deepum -O deepum.degree=8 -O deepum.num_rows=512[/bold]

      [bold]umctl replay trace.parquet --mode none,oracle --oversub 1.5 --png report.png[/bold]

      [bold]umctl replay bert-large -p scale=full --calibration v100-pcie3 -m none --calib-set eviction_refresh=access[/bold]  (what-if: a true LRU)

      [bold]umctl replay gpt2-l -m none,deepum --budget 256MiB[/bold]  (the live soft budget on a 512 MiB GPU)
    """
    ov = _overrides(oversub, gpu_mem, iters, seed if seed else None, param)
    _run_replay(target, mode, ov, seed, png, as_json, record, mode_opt, drain_us, calibration, timeline, calib_set,
                max_rss, budget, bound)


@app.command()
def demo(
    png: Optional[str] = typer.Option(None, help="Also write the comparison figure to this PNG."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of the table."),
) -> None:
    """Replay a built-in DNN training loop (GPT-2 XL-shaped, 2× oversubscribed) under every mode. No GPU needed.

    Example: [bold]umctl demo --png demo.png[/bold]
    """
    err.print("[bold]umctl demo[/bold]: GPT-2 XL-shaped training loop, 2× oversubscribed GPU, every mode")
    _run_replay("gpt2-xl", "all", {"oversub": "2"}, 0, png, as_json, None)


@app.command()
def version() -> None:
    """Print the umctl version."""
    out.print(f"umctl {__version__}")


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit status; never raises for a user-facing failure or an
    interrupt. Usage errors and UmctlErrors are one line (status 2, or the error's own);
    Ctrl-C and SIGTERM are ``umctl: interrupted`` and 130 / 143, and any trace the command
    left unfinished is closed as ``NAME.partial`` and named."""
    from .. import interrupts

    args = sys.argv[1:] if argv is None else list(argv)
    if args in (["version"], ["--version"], ["-V"]):
        # without building the click command: typer's adapters import pydantic where it is
        # installed, ~0.2 s of the <= 0.3 s `umctl version` may take
        print(f"umctl {__version__}")
        return 0
    try:
        return _main(args, interrupts)
    finally:
        # read, then forgotten: a signal noted before main() (the imports) counts for this run,
        # and none leaks into the next in-process call (tests)
        interrupts.reset()


def _main(args: list[str], interrupts) -> int:
    _forget_traces()
    failure: BaseException | None = None
    try:
        code = _invoke(args)
    except KeyboardInterrupt as e:   # interrupts.Interrupted too: SIGTERM
        failure, code = e, getattr(e, "exit_code", 130)
        if interrupts.last_signal() is None:   # a KeyboardInterrupt nobody's handler noted
            interrupts.note(getattr(e, "signum", 2))
    except _Failed as e:
        failure, code = e.error, e.code
    except BaseException as e:   # a bug (traceback below) or sys.exit: partial traces are closed first
        _close_traces(e)
        raise
    signum = interrupts.last_signal()
    if signum is not None:   # also when the command caught the interrupt and ended cleanly
        code = interrupts.exit_code(signum)
        failure = failure or interrupts.Interrupted(signum)
        sys.stderr.write("umctl: interrupted\n" if signum == 2 else f"umctl: {interrupts.describe(signum)}\n")
    if failure is not None:
        _close_traces(failure)
        _report_traces(interrupted=signum is not None)
    sys.stderr.flush()
    return code


class _Failed(Exception):
    """A failure already reported on stderr, with the status to exit with."""

    def __init__(self, error: BaseException, code: int):
        super().__init__(str(error))
        self.error, self.code = error, code


def _invoke(args: list[str]) -> int:
    """Parse and run the command. The click command is run here rather than through
    ``app(standalone_mode=False)``, which returns (not raises) the status of ``typer.Exit``
    and turns every KeyboardInterrupt, SIGTERM's included, into 130: here each exit status
    and each interrupt reaches :func:`main` as it was raised."""
    try:  # typer >= 0.2x vendors click; older ones use click itself
        from typer._click import exceptions as cx
    except ImportError:  # pragma: no cover
        from click import exceptions as cx

    name = _command_named(args)
    own = {c.name or c.callback.__name__ for c in app.registered_commands if c.callback.__module__ == __name__}
    # only the command named; all of them for the help, or to tell a mistyped name apart
    _mount_subcommands(set() if name in own else {name} if name in _SUBCOMMANDS or name in _GROUPS else None)
    try:
        command = typer.main.get_command(app)
        with command.make_context("umctl", args) as ctx:
            command.invoke(ctx)
        return 0
    except UmctlError as e:
        # the message is text, not markup: a "[family]" in it must print as written
        err.print(f"[red]umctl: error:[/red] {escape(str(e))}", highlight=False, soft_wrap=True, markup=True)
        if os.environ.get("UMCTL_DEBUG"):
            raise
        raise _Failed(e, e.exit_code) from None
    except cx.NoArgsIsHelpError as e:
        # the error was built from ctx.get_help(), which typer's rich help has printed already
        if e.format_message().strip():
            out.print(e.format_message(), highlight=False)
        return 0
    except cx.ClickException as e:
        ctx = getattr(e, "ctx", None)
        hint = f" (see {ctx.command_path} --help)" if ctx is not None else " (see umctl --help)"
        err.print(f"[red]umctl: error:[/red] {escape(e.format_message() + hint)}", highlight=False, soft_wrap=True)
        raise _Failed(e, e.exit_code) from None
    except typer.Exit as e:   # typer.Exit(n), ctx.exit(n), --help and --version (0)
        code = int(getattr(e, "exit_code", 0) or 0)
        if code:
            raise _Failed(e, code) from None
        return 0
    except typer.Abort as e:   # older click's form of a KeyboardInterrupt
        raise KeyboardInterrupt() from e
    except BrokenPipeError:   # `umctl ... | head`: the reader has what it wanted
        _quiet_stdout()
        return 0


def _quiet_stdout() -> None:
    """After a broken pipe: the interpreter's last flush of stdout must not fail again."""
    try:
        sys.stdout = open(os.devnull, "w")
    except OSError:  # pragma: no cover
        pass


def _forget_traces() -> None:
    trace = sys.modules.get("umctl.events.trace")   # never imported just for this (pyarrow)
    if trace is not None:
        trace.forget_closed_traces()


def _close_traces(error: BaseException) -> None:
    """Close, as incomplete, any trace the failed command left open (an interrupt between a
    writer's creation and the ``try`` that closes it), so its ``.partial`` is readable."""
    trace = sys.modules.get("umctl.events.trace")
    if trace is not None:
        trace.close_open_traces(error)


def _report_traces(interrupted: bool) -> None:
    """Name the ``.partial`` traces a failed or interrupted command kept, which hold the
    events up to the failure, and after an interrupt (which may have cut the command's own
    report short) the complete ones too."""
    trace = sys.modules.get("umctl.events.trace")
    if trace is None:
        return
    for path, complete in trace.closed_traces():
        if complete and interrupted:
            sys.stderr.write(f"umctl: wrote {path} (complete)\n")
        elif not complete:
            why = "was interrupted" if interrupted else "failed"
            sys.stderr.write(f"umctl: partial trace kept in {path} (incomplete: the run {why}; "
                             f"umctl trace info {path})\n")


def entry() -> None:
    """Run umctl and exit with its status, as the console script does (:mod:`umctl.cli.entry`,
    lighter: this module's imports come before any signal handling)."""
    from ..interrupts import run_cli

    run_cli(lambda: main)


if __name__ == "__main__":
    entry()
