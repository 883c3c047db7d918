"""GPU test workload: a fault-heavy sweep over cupy managed memory.

Each pass writes the whole buffer on the host (pages go to the CPU) and then runs one GPU
kernel over it (every page faults back to the GPU). Prints ``READY pid base nbytes`` once the
buffer exists, waits for a line on stdin when --wait is given (so an observer can attach
first), then ``PASS i kernel_ms host_ms`` per pass and ``DONE total_ms``.
--thrash adds a phase where CPU and GPU hammer one 4 MiB buffer at once (ThrashingDetected).
"""

import argparse
import ctypes as C
import sys
import time

import cupy as cp
import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--passes", type=int, default=4)
    ap.add_argument("--wait", action="store_true")
    ap.add_argument("--thrash", action="store_true")
    ap.add_argument("--seconds", type=float, default=0.0, help="repeat passes for at least this long")
    a = ap.parse_args()
    nbytes = a.mib << 20
    assert nbytes <= (2 << 30), "keep managed allocations <= 2 GiB"
    free, _ = cp.cuda.runtime.memGetInfo()
    assert nbytes < free // 2, (nbytes, free)
    w = cp.zeros(1024, dtype=cp.float32)
    w += 1.0  # compile the elementwise kernel before the timed part
    cp.cuda.Device().synchronize()
    mem = cp.cuda.malloc_managed(nbytes)
    n = nbytes // 4
    g = cp.ndarray((n,), dtype=cp.float32, memptr=mem)
    h = np.ctypeslib.as_array((C.c_float * n).from_address(mem.ptr))
    h[:] = 0.0
    print(f"READY {__import__('os').getpid()} {mem.ptr} {nbytes}", flush=True)
    if a.wait:
        sys.stdin.readline()
    t_all = time.perf_counter()
    i = 0
    while i < a.passes or time.perf_counter() - t_all < a.seconds:
        t = time.perf_counter()
        h[:] = float(i)
        th = time.perf_counter() - t
        t = time.perf_counter()
        cp.add(g, 1.0, out=g)
        cp.cuda.Device().synchronize()
        tk = time.perf_counter() - t
        assert float(h[12345]) == float(i) + 1.0
        print(f"PASS {i} {tk * 1e3:.2f} {th * 1e3:.2f}", flush=True)
        i += 1
    if a.thrash:
        tn = 1 << 20
        tmem = cp.cuda.malloc_managed(tn * 4)
        tg = cp.ndarray((tn,), dtype=cp.float32, memptr=tmem)
        th_ = np.ctypeslib.as_array((C.c_float * tn).from_address(tmem.ptr))
        th_[:] = 0.0
        k = cp.RawKernel(r'''extern "C" __global__ void umctl_thrash(float* x, int n, int passes) {
            for (int p = 0; p < passes; p++)
                for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
                    x[i] = x[i] + 1.0f; }''', "umctl_thrash")
        t = time.perf_counter()
        k((256,), (256,), (tg, cp.int32(tn), cp.int32(3000)))
        while time.perf_counter() - t < 0.3:
            th_[::1024] += 1.0
        cp.cuda.Device().synchronize()
        print(f"THRASH {tmem.ptr} {tn * 4}", flush=True)
    print(f"DONE {(time.perf_counter() - t_all) * 1e3:.1f}", flush=True)


if __name__ == "__main__":
    main()
