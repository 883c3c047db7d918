"""``umctl sweep``: a controller's parameters swept on one workload."""

from __future__ import annotations

import json
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from .. import UmctlError
from ..units import format_bytes
from .common import check_output_path, describe, overrides


#: The mode options each sweep sets (umctl/sim/sweep.py).
SWEPT = {"table": ("num_rows", "assoc", "num_succs"), "degree": ("degree",)}


def sweep_command(
    target: str = typer.Argument(..., help="Scenario name, scenario file or trace file."),
    what: str = typer.Option("table,degree", help="Sweeps to run: table (DeepUM table 6), degree (figure 11)."),
    mode: str = typer.Option("deepum", "--mode", "-m", help="Controller mode to sweep (one that takes the swept options: DeepUM's)."),
    oversub: Optional[float] = typer.Option(None, help="Oversubscription ratio, in (0, 64]."),
    gpu_mem: Optional[str] = typer.Option(None, "--gpu-mem", help="Simulated GPU memory (64 KiB to 64 TiB)."),
    iters: Optional[int] = typer.Option(None, "--iters", help="Training iterations, 1 to 10000."),
    param: Optional[List[str]] = typer.Option(None, "--param", "-p", help="Scenario parameter key=value."),
    png: Optional[str] = typer.Option(None, help="Write the sweep figure to this PNG."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    """Sweep DeepUM's table configuration (Assoc, NumSuccs, NumRows of table 6) and degree of
    prefetching N (figure 11) on one workload; speedups over Config0 and N = 8.

    Example: [bold]umctl sweep resnet152 --iters 4 --png sweep.png[/bold]
    """
    from ..report.png import sweep_png

    check_output_path(png, "figure")
    from ..workload.target import resolve_target
    from ..sim.sweep import sweep

    from ..controller.options import mode_options

    kinds = [w.strip() for w in what.split(",") if w.strip()]
    bad = [k for k in kinds if k not in SWEPT]
    if bad or not kinds:
        raise UmctlError(f"unknown sweep {bad[0] if bad else what!r}: use table, degree or table,degree")
    if len(set(kinds)) != len(kinds):
        raise UmctlError(f"--what {what}: each sweep once (table, degree or table,degree)")
    have = mode_options(mode)   # a one-line error for an unknown mode
    for k in kinds:
        # a mode without the swept options would ignore them: every point the same run
        missing = [o for o in SWEPT[k] if o not in have]
        if missing:
            raise UmctlError(f"--mode {mode} has no {', '.join(missing)}: the {k} sweep needs a mode that "
                             f"takes {', '.join(SWEPT[k])} (DeepUM's modes do)")
    from .progress import Progress as CliProgress
    from .progress import generate

    err = Console(stderr=True)
    workload = generate(f"sweep {target}", resolve_target, target, overrides(oversub, gpu_mem, iters, None, param),
                        console=err)
    out = Console(width=140)
    results: dict[str, list[dict]] = {}
    # a bar on a terminal, else a line on stderr about every 10 s (umctl/cli/progress.py)
    with CliProgress(f"sweep {workload.name} ({mode})", console=err, unit="points", transient=as_json) as prog:
        for k in kinds:
            prog.add(k, 1)
            try:
                results[k] = sweep(workload, k, mode=mode, progress=lambda d, n, k=k: prog.update(k, d, n))
            except TypeError as e:
                raise UmctlError(f"mode {mode!r} has no parameter for the {k} sweep ({e})") from None
    if as_json:
        print(json.dumps(results, indent=2, default=float))
    else:
        for k, rows in results.items():
            t = Table(title=f"{mode} {k} sweep — {describe(workload)}", title_justify="left")
            for col in ("point", "sim time", "steady time", "speedup", "GPU faults", "table size", "pf accuracy"):
                t.add_column(col, justify="right")
            for r in rows:
                t.add_row(r["point"], f"{r['time_ns'] / 1e9:.3f} s",
                          f"{r['steady_time_ns'] / 1e9:.3f} s" if r["steady_time_ns"] else "—",
                          f"{r['speedup']:.3f}×", f"{r['faults']:,}",
                          format_bytes(r["table_bytes"]) if r.get("table_bytes") else "—",
                          f"{100 * r['prefetch_accuracy']:.1f} %" if r["prefetch_accuracy"] is not None else "—")
            out.print(t)
    if png:
        sweep_png(results, png, f"{mode} sweeps — {workload.name}")
        err.print(f"wrote {png}")
