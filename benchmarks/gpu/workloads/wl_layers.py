"""GPU test workload for live control: a "training loop" of L layers over cupy managed memory.

Each iteration runs one kernel per layer, in order, over that layer's buffer (read and
write, like a layer's forward+update), then synchronises. The footprint (layers x MiB) fits
the GPU, so the driver never evicts; umctl's soft budget (--budget) makes it behave like a
GPU with less memory, which is how prefetch/pre-eviction policies are measured on a real GPU
without asking the driver for more than the card has. Prints ``ITER i ms`` and ``DONE ms``;
the data is checked at the end (results must not change under umctl).
"""

import argparse
import os
import time

import cupy as cp


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--mib", type=int, default=128, help="per layer")
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--register-gpus", type=int, default=1,
                    help="also create a context on GPUs 1..N-1 (registers them in the UVM va_space, so umctl may "
                         "move this process's data into their memory); the layers still run on GPU 0")
    ap.add_argument("--sync-each", action="store_true",
                    help="synchronise after every layer (the host does not queue kernels ahead)")
    ap.add_argument("--repeat", type=int, default=40, help="passes over the buffer inside one kernel")
    a = ap.parse_args()
    for g in range(1, a.register_gpus):
        with cp.cuda.Device(g):
            cp.zeros(1).sum()
    total = a.layers * (a.mib << 20)
    free, _ = cp.cuda.runtime.memGetInfo()
    assert total <= min(8 << 30, free // 2), (total, free)
    n = (a.mib << 20) // 4
    k = cp.RawKernel(r'''extern "C" __global__ void layer(float* x, long n, int rep) {
        for (int r = 0; r < rep; r++)
            for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
                x[i] = x[i] + 1.0f; }''', "layer")
    bufs = []
    for i in range(a.layers):
        mem = cp.cuda.malloc_managed(a.mib << 20)
        x = cp.ndarray((n,), dtype=cp.float32, memptr=mem)
        x.fill(float(i))
        bufs.append(x)
    cp.cuda.Device().synchronize()
    print(f"READY {os.getpid()} {total}", flush=True)
    t_all = time.perf_counter()
    for it in range(a.iters):
        t = time.perf_counter()
        for x in bufs:
            k((264,), (256,), (x, cp.int64(n), cp.int32(a.repeat)))
            if a.sync_each:
                cp.cuda.Device().synchronize()
        cp.cuda.Device().synchronize()
        # the end on CLOCK_MONOTONIC: a co-running job's log can be cut to this iteration's window
        print(f"ITER {it} {(time.perf_counter() - t) * 1e3:.2f} {time.monotonic_ns()}", flush=True)
    # +1 per pass from x0 = layer index: exact in float32, so any lost or stale page shows
    steps = a.iters * a.repeat
    for i, x in enumerate(bufs):
        lo, hi = float(x.min()), float(x.max())
        assert lo == hi == float(i + steps), (i, lo, hi, i + steps)
    print(f"DONE {(time.perf_counter() - t_all) * 1e3:.1f} check ok", flush=True)


if __name__ == "__main__":
    main()
