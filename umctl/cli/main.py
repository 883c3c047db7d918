"""``umctl``: entry point. Every user-facing failure is one line on stderr and a non-zero
exit; tracebacks are for bugs only (set UMCTL_DEBUG=1 to see them for any error)."""

from __future__ import annotations

import json
import os
import sys
from typing import List, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

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
)


_mounted = False


def _mount_subcommands() -> None:
    """Register the commands that live in their own modules (once: main() may run often,
    e.g. in tests)."""
    global _mounted
    if _mounted:
        return
    _mounted = True
    from .live_cmd import attach_command, record_command, run_command
    from .top_cmd import top_command
    from .exporter_cmd import exporter_command
    from .scenarios_cmd import scenarios_command
    from .sweep_cmd import sweep_command
    from .trace_cmd import app as trace_app

    app.command("attach")(attach_command)
    app.command("top")(top_command)
    app.command("exporter")(exporter_command)
    app.command("record")(record_command)
    app.command("run", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(run_command)
    app.command("sweep")(sweep_command)
    app.command("scenarios", help="List the built-in scenarios and their parameters.\n\n"
                "Example: [bold]umctl scenarios --family dnn[/bold]")(scenarios_command)
    app.add_typer(trace_app, name="trace", help="Inspect and export trace files.")


def _run_replay(target: str, modes: str, overrides: dict[str, str], seed: int, png: Optional[str],
                as_json: bool, record: Optional[str], mode_opts: Optional[List[str]] = None,
                drain_us: Optional[float] = None, calibration: Optional[str] = None,
                timeline: Optional[str] = None, calib_set: Optional[List[str]] = None) -> None:
    from ..report.table import fault_cause_table, replay_table
    from ..sim.calibration import DEFAULT as DEFAULT_CALIBRATION
    from ..sim.calibration import Calibration
    from ..controller.options import parse_mode_options
    from ..sim.replay import parse_modes, result_rows, run_modes
    from ..sources.target import resolve_target

    check_output_path(png, "figure")
    check_output_path(timeline, "timeline")
    check_output_path(record, "trace")
    mode_list = parse_modes(modes)
    options = parse_mode_options(mode_opts, mode_list)
    if drain_us is not None and drain_us <= 0:
        raise UmctlError("--drain-us must be positive")
    workload = resolve_target(target, overrides)
    if not calibration and workload.meta.get("derived_from"):
        # a recorded trace: the constants measured on its GPU and driver, when shipped
        from ..sim.calibration import shipped_for

        calibration = shipped_for(workload.meta)
    calib = (Calibration.load(calibration) if calibration else DEFAULT_CALIBRATION).with_settings(calib_set)
    if modes.strip() == "all":  # every mode that applies (a named mode that does not is refused)
        from ..controller import make_controller

        mode_list = [m for m in mode_list if not make_controller(m, **options[m]).applies_to(workload)]
    recorder_for = None
    if record:
        from ..events.trace import TraceWriter

        def recorder_for(mode: str):
            path = record if len(mode_list) == 1 else _suffix(record, mode)
            meta = {"source": "umctl replay", "scenario": workload.name, "params": _jsonable(workload.params),
                    "mode": mode, "seed": seed, "gpu_mem": list(workload.gpu_mem),
                    "calibration": calib.as_dict()}
            return TraceWriter(path, meta, names=workload.names)

    with Progress(TextColumn("[bold]{task.description:>10}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("ops"), TimeElapsedColumn(), console=err, transient=as_json,
                  disable=not os.environ.get("UMCTL_PROGRESS") and (  # a long replay on a terminal only
                      not err.is_terminal or workload.n_accesses * len(mode_list) < 20_000_000)) as prog:
        tasks = {m: prog.add_task(m, total=len(workload.ops)) for m in mode_list}

        def progress(mode: str, done: int, total: int) -> None:
            prog.update(tasks[mode], completed=done)

        results = run_modes(workload, mode_list, seed=seed, progress=progress, recorder_for=recorder_for,
                            mode_options=options, drain_ns=None if drain_us is None else int(drain_us * 1000),
                            calib=calib, timeline=bool(timeline))
    rows = result_rows(results)
    if as_json:
        keys = ("mode", "time_s", "speedup", "faults", "fault_batches", "bytes_h2d", "bytes_d2h",
                "evictions", "prefetch_accuracy", "prefetch_coverage")
        extra = ("time_ns", "steady_time_ns", "steady_speedup", "steady_faults_per_iter", "iteration_faults",
                 "workload", "demand_bytes", "driver_prefetch_bytes", "user_prefetch_bytes",
                 "bytes_p2p", "preevictions", "invalidated_bytes", "prefetch_pages", "stall_ns",
                 "compute_ns", "kernels", "accesses", "commands", "wall_s", "fault_causes",
                 "steady_fault_causes_per_iter", "nodes", "bytes_internode", "internode_messages", "controller")
        print(json.dumps([{**{k: r.get(k) for k in keys + extra}, "calibration": calib.name} for r in rows], indent=2))
    else:
        out.print(replay_table(rows, _describe(workload)))
        causes = fault_cause_table(rows)
        if causes is not None:
            out.print(causes)
        walls = ", ".join(f"{r.mode} {r.wall_s:.2f}s" for r in results)
        out.print(f"[dim]UVM simulator, calibration {calib.name} ({calibration or 'umctl/sim/calibration.py'}); "
                  f"wall time: {walls}[/dim]")
    if png:
        from ..report.png import replay_png

        replay_png(results, rows, png, f"umctl replay — {_describe(workload)}")
        err.print(f"wrote {png}")
    if timeline:
        from ..report.png import timeline_png

        timeline_png(results, timeline, f"umctl replay — {workload.name}: host, copy and kernel timelines")
        err.print(f"wrote {timeline}")


def _suffix(path: str, mode: str) -> str:
    root, ext = os.path.splitext(path)
    return f"{root}.{mode}{ext or '.parquet'}"


def _jsonable(d: dict) -> dict:
    return json.loads(json.dumps(d, default=str))


@app.command()
def replay(
    target: str = typer.Argument(..., help="Scenario name (see `umctl scenarios`), scenario file "
                                 "(file.toml or file.toml:name) or trace file (.parquet)."),
    mode: str = typer.Option("none,oracle", "--mode", "-m", help="Comma-separated controller modes, or 'all'."),
    oversub: Optional[float] = typer.Option(None, help="Oversubscription: managed footprint / GPU memory."),
    gpu_mem: Optional[str] = typer.Option(None, "--gpu-mem", help="Simulated GPU memory, e.g. 1GiB."),
    iters: Optional[int] = typer.Option(None, "--iters", help="Training iterations (loops)."),
    seed: int = typer.Option(0, help="Seed of the scenario and the simulator."),
    param: Optional[List[str]] = typer.Option(None, "--param", "-p", help="Scenario parameter key=value (repeatable)."),
    png: Optional[str] = typer.Option(None, help="Write a figure of the comparison to this PNG."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list (one object per mode) instead of the table."),
    record: Optional[str] = typer.Option(None, help="Write each mode's simulated events to a trace "
                                         "(out.parquet, or out.MODE.parquet for several modes)."),
    mode_opt: Optional[List[str]] = typer.Option(None, "--mode-opt", "-O",
                                                 help="Controller option MODE.KEY=VALUE or KEY=VALUE "
                                                      "(e.g. deepum.degree=8, deepum.num_rows=512); repeatable."),
    drain_us: Optional[float] = typer.Option(None, "--drain-us", help="How often (simulated µs) events reach the "
                                             "controller, as a live source drains its ring (default 1000)."),
    calibration: Optional[str] = typer.Option(None, "--calibration", help="Calibration file written by "
                                              "benchmarks/gpu/calibrate.py, or a shipped one by name (h100-r580, h200-r580); default: for a recorded trace "
                                              "the shipped one of its GPU and driver, else the H100 figures of docs/measurements.md."),
    timeline: Optional[str] = typer.Option(None, "--timeline", help="Write host / copy / kernel timelines of every mode "
                                           "to this PNG (HUM figure 8 style); for short programs."),
    calib_set: Optional[List[str]] = typer.Option(None, "--calib-set", help="Change one constant of the calibration, "
                                                  "KEY=VALUE (repeatable), e.g. d2h_Bps=12.3e9 or "
                                                  "eviction_refresh=access: a what-if without a calibration file."),
) -> None:
    """Replay a scenario or a recorded trace under controller modes, side by side.

    Examples:

      [bold]umctl replay gpt2-xl --mode none,oracle --oversub 2[/bold]

      [bold]umctl replay dlrm -m all --json[/bold]

      [bold]umctl replay gpt2-xl -m deepum-prefetch,deepum-preevict,deepum,oracle[/bold]  (DeepUM ablation)

      [bold]umctl replay bert-large -m deepum -O deepum.degree=8 -O deepum.num_rows=512[/bold]

      [bold]umctl replay trace.parquet --mode none,oracle --oversub 1.5 --png report.png[/bold]

      [bold]umctl replay bert-large -p scale=full --calibration v100-pcie3 -m none --calib-set eviction_refresh=access[/bold]  (what-if: a true LRU)
    """
    ov = _overrides(oversub, gpu_mem, iters, seed if seed else None, param)
    _run_replay(target, mode, ov, seed, png, as_json, record, mode_opt, drain_us, calibration, timeline, calib_set)


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
    """Run the CLI; returns the exit code. Usage errors and UmctlErrors are one line."""
    try:  # typer >= 0.2x vendors click; older ones use click itself
        from typer._click import exceptions as cx
    except ImportError:  # pragma: no cover
        from click import exceptions as cx

    _mount_subcommands()
    try:
        app(args=argv, standalone_mode=False)
        return 0
    except UmctlError as e:
        err.print(f"[red]umctl: error:[/red] {e}", highlight=False, soft_wrap=True, markup=True)
        if os.environ.get("UMCTL_DEBUG"):
            raise
        return e.exit_code
    except cx.NoArgsIsHelpError as e:
        out.print(e.ctx.get_help(), highlight=False)
        return 0
    except cx.ClickException as e:
        hint = f" (see umctl {e.ctx.info_name} --help)" if getattr(e, "ctx", None) is not None and e.ctx.info_name != "umctl" else " (see umctl --help)"
        err.print(f"[red]umctl: error:[/red] {e.format_message()}{hint}", highlight=False, soft_wrap=True)
        return e.exit_code
    except typer.Exit as e:
        return getattr(e, "exit_code", 0)
    except (typer.Abort, KeyboardInterrupt):
        err.print("umctl: interrupted")
        return 130
    except BrokenPipeError:
        return 0


def entry() -> None:
    """Console-script entry point."""
    sys.exit(main())


if __name__ == "__main__":
    entry()
