"""``umctl capture``: a PyTorch training step, captured without a GPU, as a workload file that
``umctl replay`` runs under every mode (docs/guide/advise.md)."""

from __future__ import annotations

import json
from typing import Optional

import typer
from rich.table import Table

from .. import UmctlError
from ..units import format_bytes, parse_size
from .common import check_output_path, err, out

#: ``--iters``: steady steps in the workload (the first runs cold) and ``--warmup``
ITERS = (1, 100)
WARMUP = (1, 10)


def gpu_size(text: str, flag: str = "--gpu-mem") -> int:
    """A GPU size (80GiB, 512MiB); one line for a bad one."""
    try:
        n = parse_size(text)
    except ValueError as e:
        raise UmctlError(f"{flag} {text}: {e}") from None
    if n < 2 << 20:   # one 2 MiB block: the smallest GPU the allocator's segments can live on
        raise UmctlError(f"{flag} {text}: must be at least 2 MiB")
    return n


def batch_sizes(text: str) -> list[int]:
    """``--batch 8,16,32``: positive integers, each once, in the order given."""
    out_: list[int] = []
    for part in text.split(","):
        p = part.strip()
        if not p.isdigit() or int(p) < 1:
            raise UmctlError(f"--batch {text}: {p!r} is not a positive integer")
        if int(p) in out_:
            raise UmctlError(f"--batch {text}: {p} is given twice")
        out_.append(int(p))
    return out_


def in_range(value: int, bounds: tuple[int, int], flag: str) -> None:
    if not bounds[0] <= value <= bounds[1]:
        raise UmctlError(f"{flag} must be from {bounds[0]} to {bounds[1]} (got {value})")


def calibration_rates(name: Optional[str]):
    """The calibration (``--calibration``, else the built-in H100 one)."""
    from ..sim.calibration import DEFAULT, Calibration

    if name is not None and not name.strip():
        raise UmctlError("--calibration is empty: give a calibration file or a name such as h100-r580")
    return Calibration.load(name) if name else DEFAULT


def footprint_table(w, title: str) -> Table:
    fp = w.meta.get("footprint", {})
    t = Table(title=title, title_justify="left", show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    if w.meta.get("has_model", True):
        rows = [("parameters", fp.get("parameters")), ("gradients", fp.get("gradients")),
                ("optimizer state, buffers", fp.get("optimizer_state"))]
    else:   # make_step returned only the step: parameters are not told from the rest
        rows = [("persistent tensors (parameters, gradients, optimizer state)", fp.get("optimizer_state"))]
    rows += [("activations, temporaries (at peak)", fp.get("activations_peak")),
             ("allocated at peak", fp.get("peak_allocated")),
             ("reserved (allocator segments: the managed footprint)", fp.get("reserved"))]
    for label, v in rows:
        if v is not None:
            t.add_row(label, format_bytes(v))
    t.add_row("kernels per step", f"{w.meta.get('kernels_per_iteration', 0):,}")
    t.add_row("compute per step, all resident", f"{w.meta.get('compute_ns_per_iteration', 0) / 1e6:.2f} ms")
    return t


def assumption_lines(assumptions: dict) -> list[str]:
    """What the capture assumed where it could not see values (umctl/workload/capture/shadow.py)."""
    return [f"assumed: {what} ({n}×)" for what, n in sorted(assumptions.items())]


def capture_command(
    entry: str = typer.Argument(..., help="The step to capture: FILE.py:FUNCTION or MODULE:FUNCTION, a function "
                                "make_step(batch, device) returning the step (or (model, step)); docs/guide/advise.md."),
    batch: int = typer.Option(..., "--batch", "-b", help="Batch size given to make_step (a positive integer)."),
    output: str = typer.Option(..., "--output", "-o", help="Workload file to write (.umw), for umctl replay."),
    gpu_mem: str = typer.Option("80GiB", "--gpu-mem", help="GPU memory the workload replays on unless replay's "
                                "--gpu-mem/--oversub says otherwise."),
    iters: int = typer.Option(3, "--iters", help="Steady steps in the workload, 1 to 100 (the first runs cold)."),
    warmup: int = typer.Option(1, "--warmup", help="Steps run before the one kept, 1 to 10 (optimizer state "
                               "exists after the first)."),
    calibration: Optional[str] = typer.Option(None, "--calibration", help="Calibration whose HBM rate and GPU "
                                              "times the kernels (default: the built-in H100 one)."),
    as_json: bool = typer.Option(False, "--json", help="Print the workload's footprint and settings as JSON."),
) -> None:
    """Capture one training step of a PyTorch model on the meta device (no GPU, no memory of the
    model's size) as a workload file: the kernels, their bytes and estimated times, and the
    caching allocator's blocks in managed memory.

    Examples:

      [bold]umctl capture examples/torch/gpt2_step.py:make_step --batch 8 -o gpt2.umw[/bold]

      [bold]umctl replay gpt2.umw -m none,deepum,oracle --gpu-mem 40GiB[/bold]
    """
    check_output_path(output, "workload", ".umw")
    if batch < 1:
        raise UmctlError(f"--batch must be a positive integer (got {batch})")
    in_range(iters, ITERS, "--iters")
    in_range(warmup, WARMUP, "--warmup")
    size = gpu_size(gpu_mem)
    calib = calibration_rates(calibration)
    from ..workload.capture import capture_workload
    from ..workload.workfile import save
    from .progress import Progress as CliProgress

    with CliProgress(f"capture {entry}", console=err, transient=True) as prog, prog.phase(f"capturing batch {batch}"):
        w, cap = capture_workload(entry, batch, gpu_mem=size, iterations=iters, warmup=warmup,
                                  calibration=calib.name, hbm_Bps=calib.hbm_Bps)
    try:
        save(w, output)
    except OSError as e:
        raise UmctlError(f"{output}: cannot write the workload: {e.strerror or e}") from None
    if as_json:
        print(json.dumps({"file": output, "name": w.name, "batch": batch, "peak_managed_bytes": w.peak_managed_bytes,
                          "gpu_mem": size, "capture_s": cap.seconds, **{k: w.meta[k] for k in (
                              "footprint", "kernels_per_iteration", "flops_per_iteration",
                              "compute_ns_per_iteration", "iterations", "assumptions", "param_count")}},
                         indent=2, default=str))
        return
    out.print(footprint_table(w, f"{w.name}: {cap.param_count:,} parameters, captured in {cap.seconds:.1f} s"))
    for line in assumption_lines(w.meta.get("assumptions", {})):
        err.print(line, highlight=False, soft_wrap=True)
    err.print(f"wrote {output}: {format_bytes(w.peak_managed_bytes)} managed, {w.meta['footprint_oversub']:.2f}× "
              f"a {format_bytes(size)} GPU; next: umctl replay {output} -m none,deepum,oracle", highlight=False,
              soft_wrap=True)
