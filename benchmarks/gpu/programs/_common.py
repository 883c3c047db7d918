"""What the live-control benchmark programs share (benchmarks/gpu/live_control.py runs them).

Every program is a standalone script: it runs ``--steps`` steps of one PyTorch workload and
prints, in this order,

    STEP i ms              one line per step (the step ends on a device synchronisation)
    FOOTPRINT bytes reserved=bytes   torch.cuda.max_memory_allocated / max_memory_reserved
    TOUCHED bytes          the program's estimate of the bytes one steady step reads or writes
    DONE total_s checksum  the step loop's wall time; a hash of the results

The checksum is deterministic (fixed seeds, ``torch.use_deterministic_algorithms``,
``CUBLAS_WORKSPACE_CONFIG=:4096:8``, cuDNN deterministic, math attention): two runs of the same
program on the same GPU give the same checksum, with umctl or without (managed memory changes
where bytes live, not what kernels compute). Import this module BEFORE torch: it sets the cuBLAS
workspace configuration, which must be in the environment before cuBLAS starts.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402  (after the environment above)


def parser(doc: str, steps: int) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--allocator", choices=("torch", "umctl"), default="torch",
                    help="umctl: every tensor through the runtime's pluggable allocator (umctl_rt_malloc/free; "
                         "only under `umctl run --runtime`), so DeepUM may invalidate freed blocks")
    return ap


def setup(a: argparse.Namespace) -> torch.device:
    """Allocator, seeds and deterministic algorithms; returns the CUDA device."""
    if a.allocator == "umctl":
        preload = os.environ.get("LD_PRELOAD", "").split(":")
        lib = next((p for p in preload if os.path.basename(p) == "libumctl_rt.so"), None)
        if lib is None:
            raise SystemExit("--allocator umctl needs the runtime: run under `umctl run --runtime`")
        torch.cuda.memory.change_current_allocator(
            torch.cuda.memory.CUDAPluggableAllocator(lib, "umctl_rt_malloc", "umctl_rt_free"))
    torch.manual_seed(a.seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    for name in ("enable_flash_sdp", "enable_mem_efficient_sdp", "enable_cudnn_sdp"):
        fn = getattr(torch.backends.cuda, name, None)
        if fn is not None:
            fn(False)            # math attention: deterministic forward and backward
    dev = torch.device("cuda")
    torch.cuda.init()
    return dev


def cuda_gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(seed)


def run_steps(steps: int, body) -> float:
    """Call ``body(i)`` per step, synchronise, print ``STEP i ms``; returns the loop's seconds.
    The peak-memory statistics restart here: set-up transients are not the footprint."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t_all = time.perf_counter()
    for i in range(steps):
        t = time.perf_counter()
        body(i)
        torch.cuda.synchronize()
        print(f"STEP {i} {(time.perf_counter() - t) * 1e3:.2f}", flush=True)
    total = time.perf_counter() - t_all
    _PEAK[:] = [torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()]
    return total


_PEAK: list[int] = []   # the step loop's peaks, taken before the checksum allocates anything


def checksum(tensors, extra: bytes = b"", chunk: int = 1 << 22) -> str:
    """sha256 over each tensor's float64 sums (per chunk of 4 M elements: a float64 copy of a
    2 GiB table would double the footprint) and a strided sample of its raw values (at most
    ~256 K elements per tensor): any change to a result changes it, no full copy to the host."""
    h = hashlib.sha256(extra)
    for t in tensors:
        t = t.detach()
        h.update(repr((tuple(t.shape), str(t.dtype))).encode())
        flat = t.reshape(-1)
        sums = torch.stack([flat[i:i + chunk].sum(dtype=torch.float64) for i in range(0, flat.numel(), chunk)]
                           or [torch.zeros((), dtype=torch.float64, device=t.device)])
        h.update(sums.cpu().numpy().tobytes())
        stride = max(1, flat.numel() // (1 << 18))
        h.update(flat[::stride].float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def finish(total_s: float, digest: str, touched: int | None = None) -> None:
    """FOOTPRINT, TOUCHED and DONE lines (the footprint: the step loop's peaks, before the
    checksum's own allocations)."""
    peak, reserved = _PEAK if _PEAK else (torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved())
    print(f"FOOTPRINT {peak} reserved={reserved}", flush=True)
    print(f"TOUCHED {int(touched if touched is not None else peak)}", flush=True)
    print(f"DONE {total_s:.3f} {digest}", flush=True)



def finish_training(name: str, total_s: float, losses: list, tensors: list, touched: int | None = None) -> None:
    """End of a training program: a loss that went non-finite fails the run (exit status 1,
    no DONE line: the benchmark counts it as failed, never as a result), else :func:`finish`
    with the checksum of ``tensors`` and the losses."""
    lv = torch.stack(losses).cpu()
    if not bool(torch.isfinite(lv).all()):
        raise SystemExit(f"{name}: loss not finite")
    finish(total_s, checksum(list(tensors) + [lv]), touched=touched)
