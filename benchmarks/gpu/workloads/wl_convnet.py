"""A torchvision-style bottleneck ResNet training step (NCHW fp32, cuDNN convolutions, batch
norm, in-place ReLU, SGD with momentum), timed cold and warm: the access-pattern probe of the
convolutions DeepUM's ResNet rows run (benchmarks/gpu/conv_probe.py records and replays it).

Run under ``umctl run --runtime --managed`` so every tensor is managed memory. Phases, each
printed as ``PHASE name ms t0=NS t1=NS`` (CLOCK_MONOTONIC):

- ``warm``: one step with everything resident on the GPU (kernel time only);
- ``cold``: one step after every page of torch's memory was moved to the host by a host read
  of one byte per page, so each page the step touches faults back in (the UM baseline's
  regime, without oversubscription: the device rules here forbid allocating more managed
  memory than the GPU has).
"""

from __future__ import annotations

import argparse
import ctypes as C
import os
import time

import numpy as np
import torch
import torch.nn as nn


class Bottleneck(nn.Module):
    def __init__(self, cin: int, mid: int, stride: int):
        super().__init__()
        out = 4 * mid
        self.conv1, self.bn1 = nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid)
        self.conv2, self.bn2 = nn.Conv2d(mid, mid, 3, stride, 1, bias=False), nn.BatchNorm2d(mid)
        self.conv3, self.bn3 = nn.Conv2d(mid, out, 1, bias=False), nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        self.down = None
        if stride != 1 or cin != out:
            self.down = nn.Sequential(nn.Conv2d(cin, out, 1, stride, bias=False), nn.BatchNorm2d(out))

    def forward(self, x):
        idt = x if self.down is None else self.down(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        y += idt
        return self.relu(y)


def resnet(blocks: list[int], classes: int = 1000) -> nn.Module:
    layers: list[nn.Module] = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                               nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for stage, n in enumerate(blocks):
        mid = 64 * 2 ** stage
        for i in range(n):
            layers.append(Bottleneck(cin, mid, 2 if (i == 0 and stage > 0) else 1))
            cin = 4 * mid
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


def to_host() -> int:
    """Read one byte of every page of every segment torch holds: each GPU-resident page faults
    to the host. Returns the bytes covered."""
    total = 0
    for seg in torch.cuda.memory_snapshot():
        addr, size = int(seg["address"]), int(seg["total_size"])
        arr = np.frombuffer((C.c_ubyte * size).from_address(addr), dtype=np.uint8)
        int(arr[::4096].sum())
        total += size
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--blocks", default="2,2,2,2", help="bottlenecks per stage")
    ap.add_argument("--image", type=int, default=224)
    ap.add_argument("--cold", type=int, default=2, help="cold steps (each after moving everything to the host)")
    a = ap.parse_args()
    if os.environ.get("UMCTL_RT_MANAGED") != "1":
        raise SystemExit("wl_convnet: run under `umctl run --runtime --managed`")
    torch.backends.cudnn.benchmark = False
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = resnet([int(x) for x in a.blocks.split(",")]).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(a.batch, 3, a.image, a.image, device=dev)
    y = torch.randint(0, 1000, (a.batch,), device=dev)
    lossf = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=False)
        loss = lossf(model(x), y)
        loss.backward()
        opt.step()
        return loss

    def phase(name, body):
        torch.cuda.synchronize()
        t0n = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        t = time.perf_counter()
        out = body()
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t) * 1e3
        print(f"PHASE {name} {ms:.2f} t0={t0n} t1={time.clock_gettime_ns(time.CLOCK_MONOTONIC)}", flush=True)
        return out

    losses = [float(step()) for _ in range(3)]   # warm-up: cuDNN heuristics, momentum buffers
    torch.cuda.synchronize()
    print(f"MEM allocated={torch.cuda.memory_allocated()} reserved={torch.cuda.memory_reserved()}", flush=True)
    phase("warm", step)
    for i in range(a.cold):
        torch.cuda.synchronize()
        moved = to_host()
        print(f"TOHOST {moved}", flush=True)
        losses.append(float(phase(f"cold{i}", step)))
    ok = all(np.isfinite(losses))
    print("CHECK", "ok" if ok else "FAILED", " ".join(f"{v:.4f}" for v in losses), flush=True)
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
