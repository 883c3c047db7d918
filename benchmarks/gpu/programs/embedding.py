"""Live-control program: an embedding-heavy recommender (DLRM-style) training step.

One EmbeddingBag table (default 3.8 M rows x 128 fp32 = 1.81 GiB, dense gradient) summed over
bags of random row ids, a small MLP on top, BCE loss, plain SGD. Default batch: 8192 bags x 512
ids = 4.2 M lookups a step, which reads ~67 % of the table's rows; the dense gradient (a
table-sized tensor zeroed and scattered into every step) and SGD's update then touch every row
of both: ~3.8 GiB footprint, all of it touched each step (H100: ~15 ms a step when it fits).
This is the case that escaped umctl's budget: each step fills a fresh table-sized gradient (one
fill kernel faulting ~2 GiB in), faster than a control period can evict ahead of it."""

import _common as C
from _common import torch


def main() -> None:
    ap = C.parser(__doc__, steps=8)
    ap.add_argument("--rows", type=int, default=3_800_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--bags", type=int, default=8192)
    ap.add_argument("--per-bag", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=512)
    a = ap.parse_args()
    dev = C.setup(a)
    nn = torch.nn
    table = nn.EmbeddingBag(a.rows, a.dim, mode="sum", sparse=False, device=dev)
    with torch.no_grad():
        table.weight.mul_(0.01)
    mlp = nn.Sequential(nn.Linear(a.dim, a.hidden), nn.ReLU(), nn.Linear(a.hidden, a.hidden), nn.ReLU(),
                        nn.Linear(a.hidden, 1)).to(dev)
    params = list(table.parameters()) + list(mlp.parameters())
    opt = torch.optim.SGD(params, lr=0.05, foreach=False)
    gen = C.cuda_gen(a.seed + 1)
    offsets = torch.arange(0, a.bags * a.per_bag, a.per_bag, device=dev)
    losses = []

    def step(i: int) -> None:
        ids = torch.randint(0, a.rows, (a.bags * a.per_bag,), device=dev, generator=gen)
        y = torch.randint(0, 2, (a.bags, 1), device=dev, generator=gen).float()
        opt.zero_grad(set_to_none=True)      # the table's gradient is allocated anew each step
        logit = mlp(table(ids, offsets))
        loss = nn.functional.binary_cross_entropy_with_logits(logit, y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())

    total = C.run_steps(a.steps, step)
    C.finish_training("embedding", total, losses, params)


if __name__ == "__main__":
    main()
