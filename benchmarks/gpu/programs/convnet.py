"""Live-control program: bottleneck-ResNet training (NCHW fp32, cuDNN deterministic, batch norm,
SGD with momentum).

Default: ResNet-50 layout (3,4,6,3 bottlenecks), batch 24 at 224x224, 1000 classes: ~25 M
parameters (params + grads + momentum ~300 MB) plus the saved activations: ~2.5 GiB footprint,
every byte touched each step. Images come from a seeded CUDA generator."""

import _common as C
from _common import torch

nn = torch.nn


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
        return self.relu(y + idt)


def resnet(blocks, width: int, classes: int) -> nn.Module:
    layers = [nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
              nn.MaxPool2d(3, 2, 1)]
    cin = width
    for stage, n in enumerate(blocks):
        mid = width * 2 ** stage
        for i in range(n):
            layers.append(Bottleneck(cin, mid, 2 if (i == 0 and stage > 0) else 1))
            cin = 4 * mid
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


def main() -> None:
    ap = C.parser(__doc__, steps=10)
    ap.add_argument("--blocks", default="3,4,6,3", help="bottlenecks per stage")
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--batch", type=int, default=24)
    ap.add_argument("--image", type=int, default=224)
    ap.add_argument("--classes", type=int, default=1000)
    a = ap.parse_args()
    dev = C.setup(a)
    model = resnet([int(x) for x in a.blocks.split(",")], a.width, a.classes).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, foreach=False)
    lossf = nn.CrossEntropyLoss()
    gen = C.cuda_gen(a.seed + 1)
    losses = []

    def step(i: int) -> None:
        x = torch.randn(a.batch, 3, a.image, a.image, device=dev, generator=gen)
        y = torch.randint(0, a.classes, (a.batch,), device=dev, generator=gen)
        opt.zero_grad(set_to_none=False)
        loss = lossf(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())

    total = C.run_steps(a.steps, step)
    C.finish_training("convnet", total, losses, list(model.parameters()) + list(model.buffers()))


def make_step(batch: int, device, blocks: str = "3,4,6,3", width: int = 64, image: int = 224, classes: int = 1000):
    """The step main() runs, for ``umctl capture``/``umctl advise`` (the defaults are main()'s):
    ``umctl capture benchmarks/gpu/programs/convnet.py:make_step --batch 24 -o c.umw``. Images
    come from torch.randn (main() draws them from a seeded CUDA generator)."""
    model = resnet([int(x) for x in blocks.split(",")], width, classes).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, foreach=False)
    lossf = nn.CrossEntropyLoss()

    def step() -> None:
        x = torch.randn(batch, 3, image, image, device=device)
        y = torch.randint(0, classes, (batch,), device=device)
        opt.zero_grad(set_to_none=False)
        loss = lossf(model(x), y)
        loss.backward()
        opt.step()

    return model, step


if __name__ == "__main__":
    main()
