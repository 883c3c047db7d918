"""GPU workload for live control: a PyTorch training loop of several layers whose memory is
managed (run it under `umctl run --runtime --managed`, which routes torch's cudaMalloc to
cudaMallocManaged). Default: 8 Linear(3072) layers + ReLU, batch 4096, SGD: ~290 MB of
parameters, ~290 MB of gradients, ~400 MB of activations. Prints ``STEP i ms`` per step and
``DONE total_ms checksum`` (a hash of the final parameters: with and without umctl it must be
identical)."""

import argparse
import hashlib
import os
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=3072)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--allocator", choices=("torch", "umctl"), default="torch",
                    help="umctl: the runtime's pluggable allocator (umctl_rt_malloc/free; run under "
                         "`umctl run --runtime`), which reports freed blocks to DeepUM as inactive")
    a = ap.parse_args()
    if a.allocator == "umctl":
        from umctl.runtime import LIBRARY   # the preloaded copy: the one umctl run reports from

        lib = next((p for p in os.environ.get("LD_PRELOAD", "").split(":") if os.path.basename(p) == LIBRARY), None)
        if lib is None:
            raise SystemExit("--allocator umctl needs the runtime: run under `umctl run --runtime`")
        torch.cuda.memory.change_current_allocator(
            torch.cuda.memory.CUDAPluggableAllocator(lib, "umctl_rt_malloc", "umctl_rt_free"))
    torch.manual_seed(0)
    dev = torch.device("cuda")
    layers = []
    for _ in range(a.layers):
        layers += [torch.nn.Linear(a.width, a.width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    g = torch.Generator(device="cpu").manual_seed(1)
    x = torch.randn(a.batch, a.width, generator=g).to(dev)
    y = torch.randn(a.batch, a.width, generator=g).to(dev)
    torch.cuda.synchronize()
    t_all = time.perf_counter()
    for i in range(a.steps):
        t = time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        lv = loss.item()
        print(f"STEP {i} {(time.perf_counter() - t) * 1e3:.2f} {lv:.6f}", flush=True)
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().numpy().tobytes())
    print(f"DONE {(time.perf_counter() - t_all) * 1e3:.1f} {h.hexdigest()[:16]}", flush=True)


if __name__ == "__main__":
    main()
