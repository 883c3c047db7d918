"""``umctl advise``: "my model does not fit on my GPU at the batch size I want; will umctl help,
with which mode, by how much?" Capture the step at each batch size, replay it on the GPU under
each mode, and recommend one (docs/guide/advise.md)."""

from __future__ import annotations

import json
from typing import Optional

import typer
from rich.table import Table

from .. import UmctlError
from ..units import format_bytes
from .capture_cmd import ITERS, assumption_lines, batch_sizes, calibration_rates, gpu_size, in_range
from .common import check_output_path, err, out

DEFAULT_MODES = "none,deepum,deepum-prefetch,oracle"


def step_time_ns(r, iterations: int) -> float:
    """One step's time: the steady iterations' mean (after the cold first), else the one run."""
    steady = r.steady_time_ns
    return steady / (iterations - 1) if steady and iterations > 1 else r.time_ns / iterations


def recommend(fits: bool, times: dict[str, float], replay_only: set[str]) -> str:
    """``none`` where the model fits (nothing to control); else the fastest mode a live run
    can use (the oracle knows the future: a bound to compare with, not a choice)."""
    if fits:
        return "none"
    usable = {m: t for m, t in times.items() if m not in replay_only}
    return min(usable, key=usable.get) if usable else min(times, key=times.get)


def advise_command(
    entry: str = typer.Argument(..., help="The step: FILE.py:FUNCTION or MODULE:FUNCTION, make_step(batch, device) "
                                "returning the step (or (model, step)); docs/guide/advise.md."),
    gpu_mem: str = typer.Option(..., "--gpu-mem", help="Memory of the GPU to advise for, e.g. 80GiB."),
    batch: str = typer.Option("8", "--batch", "-b", help="Batch sizes to try, comma-separated (e.g. 8,16,32,64)."),
    mode: str = typer.Option(DEFAULT_MODES, "--mode", "-m", help="Modes to compare, comma-separated (none always runs)."),
    iters: int = typer.Option(3, "--iters", help="Steps replayed per batch size, 1 to 100 (the first runs cold; "
                              "the step time is the mean of the others)."),
    calibration: Optional[str] = typer.Option(None, "--calibration", help="Calibration of the simulated GPU and "
                                              "link (default: the built-in H100 one)."),
    png: Optional[str] = typer.Option(None, "--png", help="Also write a figure of step time and % of bound per batch."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (one object per batch size) instead of the table."),
) -> None:
    """Capture the step at each batch size (no GPU), replay it on a GPU of --gpu-mem under each
    mode, and say which mode to run: predicted step time, % of the replay's lower bound,
    footprint and oversubscription, recommended mode (none where the model fits).

    Examples:

      [bold]umctl advise examples/torch/gpt2_step.py:make_step --gpu-mem 80GiB --batch 8,16,32,64[/bold]

      [bold]umctl advise train.py:make_step --gpu-mem 24GiB --batch 16 --png advise.png --json[/bold]
    """
    check_output_path(png, "figure")
    size = gpu_size(gpu_mem)
    batches = batch_sizes(batch)
    in_range(iters, ITERS, "--iters")
    from ..controller import make_controller
    from ..sim.replay import parse_modes, result_rows, run_modes, workload_bound

    modes = parse_modes(mode)
    calib = calibration_rates(calibration)
    replay_only = {m for m in modes if make_controller(m).replay_only}
    from ..workload.capture import capture_workload
    from .progress import Progress as CliProgress

    rows: list[dict] = []
    name = entry
    with CliProgress(f"advise {entry}", console=err, transient=as_json) as prog:
        for b in batches:
            with prog.phase(f"capturing batch {b}"):
                w, cap = capture_workload(entry, b, gpu_mem=size, iterations=iters, calibration=calib.name,
                                          hbm_Bps=calib.hbm_Bps)
            name = w.name.rsplit("@", 1)[0]
            with prog.phase(f"batch {b}: lower bound"):
                lower = workload_bound(w, calib)
            for m in modes:
                prog.add(f"b{b} {m}", len(w.ops))
            results = run_modes(w, modes, calib=calib, max_rss="auto",
                                progress=lambda m, d, t, b=b: prog.update(f"b{b} {m}", d, t))
            table = {r["mode"]: r for r in result_rows(results, lower)}
            peak = w.peak_managed_bytes
            per_mode = {}
            for r in results:
                t = step_time_ns(r, iters)
                per_mode[r.mode] = {"step_s": t / 1e9, "samples_per_s": b / (t / 1e9) if t else None,
                                    "time_s": r.time_ns / 1e9, "pct_of_bound": table[r.mode].get("pct_of_bound"),
                                    "speedup": table[r.mode].get("speedup"), "faults": r.faults}
            fits = peak <= size
            rows.append({"batch": b, "footprint_bytes": int(peak), "gpu_mem": size, "oversub": peak / size,
                         "fits": fits, "param_count": cap.param_count, "capture_s": round(cap.seconds, 3),
                         "compute_s_per_step": w.meta.get("compute_ns_per_iteration", 0) / 1e9,
                         "bound_s": lower.time_ns / 1e9 if lower is not None else None,
                         "recommended": recommend(fits, {m: v["step_s"] for m, v in per_mode.items()}, replay_only),
                         "modes": per_mode, "assumptions": w.meta.get("assumptions", {})})
            del w, results
    if as_json:
        print(json.dumps(rows, indent=2, default=float))
    else:
        advise_table(rows, modes, name, size, calib.name)
        notes = {line for r in rows for line in assumption_lines(r["assumptions"])}
        for line in sorted(notes):
            err.print(line, highlight=False, soft_wrap=True)
    if png:
        advise_png(rows, modes, png, f"umctl advise {name} on a {format_bytes(size)} GPU ({calib.name})")
        err.print(f"wrote {png}")


def advise_table(rows: list[dict], modes: list[str], name: str, size: int, calib: str) -> None:
    t = Table(title=f"{name} on a {format_bytes(size)} GPU ({calib}): predicted steady step time",
              title_justify="left",
              caption="(%): the whole replay's time as % of its lower bound, cold first step included "
                      "(first touches cost faults the bound does not count)",
              caption_justify="left")
    t.add_column("batch", justify="right")
    t.add_column("footprint", justify="right")
    t.add_column("oversub", justify="right")
    for m in modes:
        t.add_column(m, justify="right")
    t.add_column("recommended", justify="left")
    t.add_column("samples/s", justify="right")
    for r in rows:
        cells = []
        for m in modes:
            v = r["modes"][m]
            pct = f" ({v['pct_of_bound']:.0f} %)" if v["pct_of_bound"] is not None else ""
            cells.append(f"{_ms(v['step_s'])}{pct}")
        rec = r["recommended"]
        if r["fits"]:
            why = " (fits)"
        elif rec == "none":   # oversubscribed, and no mode a live run can use beats none
            why = " (no mode faster)"
        else:
            why = f" ({r['modes']['none']['step_s'] / r['modes'][rec]['step_s']:.2f}× none)"
        sps = r["modes"][rec]["samples_per_s"]
        t.add_row(str(r["batch"]), format_bytes(r["footprint_bytes"]), f"{r['oversub']:.2f}×", *cells,
                  f"[bold]{rec}[/bold]{why}", f"{sps:,.1f}" if sps else "—")
    out.print(t)


def _ms(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s < 10 else f"{s:.2f} s"


def advise_png(rows: list[dict], modes: list[str], path: str, title: str) -> None:
    """Step time per batch size and mode (the recommended one marked), % of the lower bound,
    and footprint against the GPU's memory: the replay figure's style."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from ..units import GiB

    batches = [str(r["batch"]) for r in rows]
    x = np.arange(len(rows))
    colors = plt.cm.tab10(np.arange(len(modes)) % 10)
    wdt = 0.8 / max(1, len(modes))
    fig, ax = plt.subplots(1, 3, figsize=(15, 4.8))
    fig.suptitle(title, fontsize=11)
    a = ax[0]
    for k, (m, c) in enumerate(zip(modes, colors)):
        a.bar(x + (k - (len(modes) - 1) / 2) * wdt, [r["modes"][m]["step_s"] * 1e3 for r in rows], wdt, label=m,
              color=c)
    for i, r in enumerate(rows):
        k = modes.index(r["recommended"])
        a.annotate("★", (i + (k - (len(modes) - 1) / 2) * wdt, r["modes"][r["recommended"]]["step_s"] * 1e3),
                   ha="center", va="bottom", fontsize=10)
    a.set_xticks(x, batches)
    a.set_xlabel("batch size")
    a.set_ylabel("predicted step time (ms)")
    a.set_title("step time (★ recommended)")
    a.legend(fontsize=8)
    a = ax[1]
    for k, (m, c) in enumerate(zip(modes, colors)):
        a.bar(x + (k - (len(modes) - 1) / 2) * wdt, [r["modes"][m]["pct_of_bound"] or 0 for r in rows], wdt,
              label=m, color=c)
    a.axhline(100, color="#444444", lw=0.8, ls="--")
    a.set_xticks(x, batches)
    a.set_xlabel("batch size")
    a.set_ylabel("whole replay, % of lower bound (100 % = optimal)")
    a.set_title("distance from the bound")
    a = ax[2]
    a.bar(x, [r["footprint_bytes"] / GiB for r in rows], color="#4c72b0", label="managed footprint")
    a.axhline(rows[0]["gpu_mem"] / GiB if rows else 0, color="#dd8452", lw=1.5, label="GPU memory")
    a.set_xticks(x, batches)
    a.set_xlabel("batch size")
    a.set_ylabel("GiB")
    a.set_title("footprint")
    a.legend(fontsize=8)
    fig.tight_layout()
    from ..report.png import save_figure

    save_figure(fig, path)
