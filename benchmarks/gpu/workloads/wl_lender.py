"""GPU test workload: a neighbour GPU's own job, for memHarvester's multi-tenant case.

Runs on one GPU (``--gpu``) with ordinary device memory (cupy's default allocator, i.e.
``cudaMalloc``): nothing of it is managed, so a harvester's data moved into this GPU's spare
memory can only slow it through shared resources (HBM bandwidth, NVLink, the copy engines,
the driver), which is what HUVM's "slowdown of the yielding jobs" measures. Two kinds:

  gemm    FP32 matrix products (compute-bound)
  stream  ``x = a * x + y`` over a large buffer (HBM-bandwidth-bound: the most exposed to
          another process's copies landing in the same memory)

Each iteration is a fixed amount of work then a synchronisation; it prints
``IT <end CLOCK_MONOTONIC ns> <ms>`` so the benchmark can cut the log to a harvester's
window. Runs for ``--duration`` seconds or until ``--stop-file`` exists, then checks its
result (a wrong result exits 1).
"""

import argparse
import os
import time

import cupy as cp


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu", type=int, required=True)
    ap.add_argument("--kind", choices=("gemm", "stream"), default="gemm")
    ap.add_argument("--gib", type=float, default=4.0, help="device memory the job holds")
    ap.add_argument("--duration", type=float, default=120.0)
    ap.add_argument("--stop-file", default=None)
    a = ap.parse_args()
    with cp.cuda.Device(a.gpu):
        free, _ = cp.cuda.runtime.memGetInfo()
        nbytes = int(a.gib * (1 << 30))
        assert nbytes <= free // 2, (nbytes, free)
        if a.kind == "gemm":
            n = 8192
            A = cp.full((n, n), 1.0, cp.float32)
            B = cp.full((n, n), 0.5, cp.float32)
            pad = cp.zeros(max(0, nbytes - 3 * A.nbytes) // 4, cp.float32)   # the job's footprint
            def work():
                for _ in range(4):
                    C = A @ B
                return C
        else:
            x = cp.zeros(nbytes // 8, cp.float32)
            y = cp.ones(nbytes // 8, cp.float32)
            def work():
                for _ in range(4):
                    cp.multiply(x, 1.0, out=x)
                    cp.add(x, y, out=x)
                return x
        work()
        cp.cuda.Device().synchronize()
        print(f"READY {os.getpid()} gpu {a.gpu} {a.kind}", flush=True)
        end = time.monotonic() + a.duration
        its = 0
        while time.monotonic() < end and not (a.stop_file and os.path.exists(a.stop_file)):
            t = time.perf_counter()
            r = work()
            cp.cuda.Device().synchronize()
            its += 1
            print(f"IT {time.monotonic_ns()} {(time.perf_counter() - t) * 1e3:.3f}", flush=True)
        if a.kind == "gemm":
            ok = float(r[0, 0]) == n * 0.5 and float(r[-1, -1]) == n * 0.5
        else:
            ok = float(x[0]) == float(x[-1]) == float(4 * (its + 1))
        print(f"DONE {its} {'check ok' if ok else 'check FAILED'}", flush=True)
        raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
