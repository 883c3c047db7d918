"""GPU test workload: a small PyTorch training loop whose tensors live in CUDA managed memory
(CUDAPluggableAllocator over benchmarks/gpu/workloads/managed_alloc.c, built here with gcc).

Each step first touches the input batch on the host through its managed pointer (as a data
loader writing into UVM would), so every step faults the batch back to the GPU. Prints
``READY pid``, then ``STEP i ms t_end_ns`` (t_end_ns: CLOCK_MONOTONIC, so a benchmark can place
each step in its attach windows) and ``DONE total_ms``; managed memory stays under 2 GiB.
"""

import argparse
import ctypes as C
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def build_allocator() -> str:
    so = os.path.join(tempfile.gettempdir(), "umctl_managed_alloc.so")
    src = os.path.join(HERE, "managed_alloc.c")
    if not os.path.exists(so) or os.path.getmtime(so) < os.path.getmtime(src):
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", so, src, "-ldl"], check=True)
    return so


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch-mib", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=0.0, help="run until this long has passed (overrides --steps)")
    ap.add_argument("--wait", action="store_true")
    ap.add_argument("--no-touch", action="store_true", help="the host never touches the batch: few faults")
    a = ap.parse_args()
    import torch

    alloc = torch.cuda.memory.CUDAPluggableAllocator(build_allocator(), "umctl_managed_malloc", "umctl_managed_free")
    torch.cuda.memory.change_current_allocator(alloc)
    dev = torch.device("cuda")
    width = 2048
    rows = (a.batch_mib << 20) // (width * 4)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                                torch.nn.ReLU(), torch.nn.Linear(width, 16)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.empty(rows, width, device=dev)
    y = torch.randint(0, 16, (rows,), device=dev)
    host = (C.c_float * (rows * width)).from_address(x.data_ptr())
    import numpy as np
    hx = np.ctypeslib.as_array(host)
    print(f"READY {os.getpid()} {x.data_ptr()} {x.numel() * 4}", flush=True)
    if a.wait:
        sys.stdin.readline()
    t_all = time.perf_counter()
    i = 0
    while (time.perf_counter() - t_all < a.seconds) if a.seconds > 0 else i < a.steps:
        t = time.perf_counter()
        torch.cuda.synchronize()
        if not a.no_touch:
            hx[::1024] = float(i % 7)  # host writes one float per 4 KiB page of the batch
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        print(f"STEP {i} {(time.perf_counter() - t) * 1e3:.2f} {time.clock_gettime_ns(time.CLOCK_MONOTONIC)}", flush=True)
        i += 1
    print(f"DONE {(time.perf_counter() - t_all) * 1e3:.1f}", flush=True)


if __name__ == "__main__":
    main()
