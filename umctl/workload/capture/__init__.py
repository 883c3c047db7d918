"""Capture a PyTorch training step without a GPU and turn it into a replayable workload.

``capture(entry, batch)`` runs the user's ``make_step(batch, device)`` (:mod:`.entry`) on the
meta device under a recording dispatch mode (:mod:`.recorder`), with attention and dropout
taking their CUDA kernels (:mod:`.cudalike`): one or more warm-up steps, then the step kept.
``capture_workload`` lays it out with PyTorch's caching allocator (:mod:`.allocator`) and times
its kernels (:mod:`.cost`), giving a :class:`~umctl.workload.workload.Workload` that ``umctl
replay`` runs under every mode (:mod:`.build`). Nothing here allocates memory of the model's
size; PyTorch is imported only when a capture runs.

What a capture cannot see is listed in docs/guide/advise.md: tensor values (routing is assumed
uniform, see :mod:`.shadow`), kernels PyTorch would fuse or pick differently on a GPU beyond
attention and dropout, the cuBLAS/cuDNN workspaces, and host-side work between kernels.
"""

from __future__ import annotations

import gc
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Callable, Iterator

from .errors import CaptureError

__all__ = ["Capture", "CaptureError", "capture", "capture_workload", "import_torch"]


@dataclass
class Capture:
    """A captured program: the log and what it took."""

    log: object
    entry: str
    batch: int
    seconds: float
    param_count: int = 0
    torch_version: str = ""
    settings: dict = field(default_factory=dict)


def import_torch():
    try:
        import torch
    except ImportError:
        raise CaptureError("PyTorch is not installed: umctl capture and advise run the model with it "
                           "(on its meta device, no GPU needed): pip install torch") from None
    return torch


def _unpack(result, entry: str):
    """``make_step``'s result: a step, or ``(model, step)``."""
    if callable(result) and not isinstance(result, tuple):
        return None, result
    if isinstance(result, (tuple, list)) and result and callable(result[-1]):
        return (result[0] if len(result) > 1 else None), result[-1]
    raise CaptureError(f"{entry}: make_step must return the step function, or (model, step); "
                    f"it returned {type(result).__name__}")


def capture(entry: str | Callable, batch: int, *, warmup: int = 1, seed: int = 0) -> Capture:
    """Run ``entry``'s make_step at ``batch`` on the meta device: ``warmup`` steps, then the
    step kept. CaptureError (one line) for a missing torch, a bad entry or a failing step."""
    torch = import_torch()
    from .cudalike import cuda_kernel_choices
    from .entry import entry_scope

    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise CaptureError(f"batch must be a positive integer (got {batch!r})")
    label = entry if isinstance(entry, str) else getattr(entry, "__name__", "make_step")
    # the kernel choices (autocast among them) apply from the import of the entry's file on
    # (``from torch import autocast`` binds at import); its folder stays on sys.path throughout
    with cuda_kernel_choices(), (entry_scope(entry) if isinstance(entry, str) else nullcontext(entry)) as fn:
        return _capture(torch, fn, label, batch, warmup, seed)


@contextmanager
def _user_code(exits: str, raises: str) -> Iterator[None]:
    """Around the user's make_step and step: their exceptions and sys.exit() as one-line
    CaptureErrors (``exits`` / ``raises`` name the call), ours passed on."""
    from .entry import _one_line

    try:
        yield
    except CaptureError:
        raise
    except SystemExit as e:
        raise CaptureError(f"{exits} called sys.exit({e.code!r})") from None
    except Exception as e:
        raise CaptureError(f"{raises} raised {type(e).__name__}: {_one_line(e)}") from None


def _capture(torch, fn: Callable, label: str, batch: int, warmup: int, seed: int) -> Capture:
    from .cudalike import AutocastRequests, autocast_notes
    from .recorder import ALLOC, OP, Recorder

    t0 = time.perf_counter()
    torch.manual_seed(seed)
    rec = Recorder()
    meta = torch.device("meta")
    settings = {"tf32_matmul": torch.get_float32_matmul_precision() != "highest"
                or bool(torch.backends.cuda.matmul.allow_tf32),
                "tf32_conv": bool(torch.backends.cudnn.allow_tf32)}
    model = None
    try:
        with rec:
            with _user_code(f"{label}: make_step", f"{label}: make_step({batch}, device)"), meta:
                result = fn(batch, meta)   # everything make_step builds defaults to meta
            model, step = _unpack(result, label)
            del result
            hooks = _grad_hooks(torch, model, rec, warmup)
            for k in range(warmup + 1):
                if k == warmup:
                    gc.collect()   # the warm-up's garbage cycles go before the step kept
                rec.mark_step(k)
                where = f"{label}: step {k + 1} at batch {batch}"
                with _user_code(where, where):
                    out = step()
                del out
            rec.close()
    finally:
        rec.closed = True
        for h in locals().get("hooks", ()):
            h.remove()
    log = rec.log
    if not any(kind in (ALLOC, OP) for kind, _ in log.events[log.step_starts[-1]:log.end]):
        raise CaptureError(f"{label}: the step put nothing on the device: does make_step create its tensors "
                           "on `device`?")
    log.notes.update(autocast_notes(AutocastRequests.seen))
    # what to call parameters and gradients in the report (tensors on meta only)
    params, count = set(), 0
    log.has_model = isinstance(model, torch.nn.Module)
    if log.has_model:
        for p in model.parameters():
            count += p.numel()
            if p.is_meta:
                params.add(rec.sid_of(p))
    log.params = params
    # the tensors the step kept alive stay so until the capture is dropped; the settings of
    # the kernels' precision are the program's, as make_step left them
    settings = {"tf32_matmul": torch.get_float32_matmul_precision() != "highest"
                or bool(torch.backends.cuda.matmul.allow_tf32),
                "tf32_conv": bool(torch.backends.cudnn.allow_tf32)} | {"before_make_step": settings}
    return Capture(log, label, batch, time.perf_counter() - t0, count, torch.__version__, settings)


def _grad_hooks(torch, model, rec, kept: int) -> list:
    """Hooks noting the storage of each parameter's gradient as backward of the kept step
    accumulates it (``zero_grad(set_to_none=True)`` may have dropped it by the step's end)."""
    if not isinstance(model, torch.nn.Module):
        return []

    def note(p) -> None:
        if rec.step == kept and p.grad is not None and p.grad.is_meta:
            rec.log.grads.add(rec.sid_of(p.grad))

    return [p.register_post_accumulate_grad_hook(note) for p in model.parameters() if p.requires_grad]


def capture_workload(entry: str | Callable, batch: int, *, gpu_mem: int, iterations: int = 3, warmup: int = 1,
                     calibration: str = "h100-pcie5-r580", hbm_Bps: float | None = None, name: str | None = None):
    """Capture ``entry`` at ``batch`` and build its workload on a GPU of ``gpu_mem`` bytes;
    returns (workload, capture)."""
    from .build import build_workload
    from .cost import DEFAULT_HBM_BPS, KernelCost, peaks_for

    cap = capture(entry, batch, warmup=warmup)
    cost = KernelCost(peaks_for(calibration), hbm_Bps or DEFAULT_HBM_BPS, cap.settings["tf32_matmul"],
                      cap.settings["tf32_conv"])
    meta = {"source": "umctl capture", "entry": cap.entry, "batch": batch, "capture_s": round(cap.seconds, 3),
            "param_count": cap.param_count, "torch": cap.torch_version, "calibration": calibration,
            "hbm_Bps": cost.hbm_Bps, "tf32_matmul": cost.tf32_matmul, "tf32_conv": cost.tf32_conv,
            "warmup_steps": warmup}
    w = build_workload(cap.log, name=name or f"{_short(cap.entry)}@b{batch}", gpu_mem=gpu_mem,
                       iterations=iterations, cost=cost, meta=meta)
    w.params = {"batch": batch, "iterations": iterations}
    return w, cap


def _short(entry: str) -> str:
    import os

    where, _, fn = entry.rpartition(":")
    base = os.path.splitext(os.path.basename(where))[0] if where else entry
    return f"{base}:{fn}" if fn and fn != "make_step" else base
