"""GPU workload for replay fidelity: a cuBLAS GEMM sweep (torch.matmul, FP32) over managed memory.

Run it under ``umctl run --runtime --managed`` (torch's cudaMalloc becomes cudaMallocManaged).
For each size the host fills A and B through their managed pointers (as a loader would), the
GPU multiplies them ``--reps`` times, then the host rewrites one float per 4 KiB page of A and
the GPU multiplies again (``--passes`` times): every pass faults A back in the order cuBLAS's
tiles read it. Prints ``DONE ms t0=NS t1=NS check ok``: the time from before the first GEMM
allocation to the last synchronisation, and its ends on CLOCK_MONOTONIC (the clock of umctl's
traces), so a replay can be cut to the same span. The result is checked exactly (constant
operands, FP32 without TF32: every product sums exactly representable terms)."""

import argparse

import torch
from wl_span import Span, host_view, require_managed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1024,2048,4096,6144")
    ap.add_argument("--reps", type=int, default=3, help="GEMMs per size on freshly written operands")
    ap.add_argument("--passes", type=int, default=2, help="host rewrites of A, each followed by a GEMM")
    a = ap.parse_args()
    require_managed("wl_gemm_sweep")
    sizes = [int(s) for s in a.sizes.split(",")]
    free, _ = torch.cuda.mem_get_info()
    if 3 * max(sizes) ** 2 * 4 > free // 4:
        raise SystemExit(f"wl_gemm_sweep: size {max(sizes)} needs more than a quarter of the free GPU memory")
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    w = torch.ones(64, 64, device=dev)
    (w @ w).sum().item()            # cuBLAS handle and kernels loaded before the measured span
    span = Span()
    ok = True
    for n in sizes:
        A = torch.empty(n, n, device=dev)
        B = torch.empty(n, n, device=dev)
        ha, hb = host_view(A), host_view(B)
        ha[:] = 0.5
        hb[:] = 0.25
        for _ in range(a.reps):
            Cm = A @ B
        torch.cuda.synchronize()
        ok &= float(Cm[n // 3, n // 2]) == n * 0.125
        for p in range(a.passes):
            ha.reshape(-1)[::1024] = 0.5 + (p + 1)          # one float per page: the page goes back to the host
            Cm = A @ B
            torch.cuda.synchronize()
            hit = len(range(0, n, 1024))        # row 0's elements the host rewrote
            ok &= float(Cm[0, 0]) == hit * (0.5 + (p + 1)) * 0.25 + (n - hit) * 0.125
        print(f"SIZE {n} {span.ms():.1f}", flush=True)
        del A, B, Cm
    span.done(ok)


if __name__ == "__main__":
    main()
