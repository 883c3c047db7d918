"""What the replay-fidelity workloads (wl_gemm_sweep, wl_gather, wl_stencil, wl_transformer)
share: the measured span and the host's view of torch's managed memory.

A workload measures itself over a span that starts after its warm-up (CUDA context, cuBLAS
handle, first kernels loaded) and ends at its last synchronisation, and prints
``DONE ms t0=NS t1=NS ...`` with the span's ends on CLOCK_MONOTONIC, the clock of umctl's
traces: benchmarks/gpu/fidelity_real.py stores the span in the recorded trace so the replay
covers exactly what the program timed."""

import ctypes as C
import os
import time

import numpy as np
import torch


def require_managed(name: str) -> None:
    """The host writes torch's memory through its pointers: only safe when it is managed."""
    if os.environ.get("UMCTL_RT_MANAGED") != "1":
        raise SystemExit(f"{name}: run under `umctl run --runtime --managed` (the host writes torch's memory)")


def host_view(t: torch.Tensor) -> np.ndarray:
    """The host's view of a managed tensor, in its shape (float32, int64 or int32)."""
    ctype = {torch.float32: C.c_float, torch.int64: C.c_int64, torch.int32: C.c_int32}[t.dtype]
    return np.ctypeslib.as_array((ctype * t.numel()).from_address(t.data_ptr())).reshape(tuple(t.shape))


class Span:
    """Start after the warm-up (synchronises first); ``done`` synchronises, prints the DONE line
    and exits 1 when the workload's own check failed."""

    def __init__(self) -> None:
        torch.cuda.synchronize()
        self.t0_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        self.t0 = time.perf_counter()

    def ms(self) -> float:
        return (time.perf_counter() - self.t0) * 1e3

    def done(self, ok: bool, extra: str = "") -> None:
        torch.cuda.synchronize()
        t1_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        print(f"DONE {self.ms():.1f} t0={self.t0_ns} t1={t1_ns} {extra}{'check ok' if ok else 'check FAILED'}",
              flush=True)
        raise SystemExit(0 if ok else 1)
