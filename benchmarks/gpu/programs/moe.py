"""Live-control program: a mixture-of-experts stack whose routing changes every step.

Default: 3 layers of 16 experts (each a d 1024 -> 4096 -> 1024 GELU MLP, fp32: 33.5 MB), top-1
routing with a learned router, residual connections, SGD (lr 1e-3, gradients clipped to norm 1). Each step's 2048 tokens come from 8
tight random clusters (fresh centres every step), so a step uses a different handful of experts
per layer: ~1.6 GB of expert weights of which each step reads and updates a varying part, and
which part is not known before the router has run. Experts a step did not use get no gradient
(zero_grad(set_to_none=True)). Prints TOUCHED as the mean bytes of the experts used per steady
step (weights + gradients, read and written) plus the dense parts."""

import _common as C
from _common import torch

F = torch.nn.functional


def main() -> None:
    ap = C.parser(__doc__, steps=10)
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--noise", type=float, default=0.25, help="token spread around its cluster centre")
    ap.add_argument("--clusters", type=int, default=8)
    a = ap.parse_args()
    dev = C.setup(a)
    nn = torch.nn
    d, E = a.d_model, a.experts

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.router = nn.Linear(d, E, bias=False, device=dev)
            self.norm = nn.LayerNorm(d, device=dev)
            self.up = nn.ParameterList([nn.Parameter(torch.randn(a.hidden, d, device=dev) / d ** 0.5)
                                        for _ in range(E)])
            self.down = nn.ParameterList([nn.Parameter(torch.randn(d, a.hidden, device=dev) / a.hidden ** 0.5)
                                          for _ in range(E)])

        def forward(self, x, used):
            h = self.norm(x)
            gate = self.router(h).softmax(-1)
            p, e = gate.max(-1)
            out = torch.zeros_like(x)
            for j in torch.unique(e).tolist():          # the host learns the routing here
                idx = (e == j).nonzero().squeeze(1)
                y = F.gelu(h[idx] @ self.up[j].t()) @ self.down[j].t()
                out = out.index_copy(0, idx, y * p[idx, None])
                used.append(self.up[j].numel() + self.down[j].numel())
            return x + out

    model = nn.ModuleList([Layer() for _ in range(a.layers)])
    head = nn.Linear(d, 1).to(dev)
    params = list(model.parameters()) + list(head.parameters())
    # a small step and clipped gradients: the residual stack on clustered inputs diverged at 0.01
    opt = torch.optim.SGD(params, lr=1e-3, foreach=False)
    gen = C.cuda_gen(a.seed + 1)
    losses, touched = [], []
    dense = sum(p.numel() for n, p in model.named_parameters() if ".up." not in n and ".down." not in n)

    def step(i: int) -> None:
        centres = torch.randn(a.clusters, d, device=dev, generator=gen) * 3
        which = torch.randint(0, a.clusters, (a.tokens,), device=dev, generator=gen)
        x = centres[which] + a.noise * torch.randn(a.tokens, d, device=dev, generator=gen)
        y = torch.randn(a.tokens, 1, device=dev, generator=gen)
        used: list[int] = []
        opt.zero_grad(set_to_none=True)
        h = x
        for layer in model:
            h = layer(h, used)
        loss = F.mse_loss(head(h), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=False)
        opt.step()
        losses.append(loss.detach())
        # the used weights and their gradients (fp32), plus the activations of every layer
        touched.append(2 * 4 * (sum(used) + dense) + 4 * a.tokens * (4 * d + 2 * a.hidden) * a.layers)

    total = C.run_steps(a.steps, step)
    steady = touched[2:] or touched
    C.finish_training("moe", total, losses, params, touched=sum(steady) / len(steady))


def make_step(batch: int, device, d_model: int = 1024, hidden: int = 4096, experts: int = 16, layers: int = 3,
              noise: float = 0.25, clusters: int = 8):
    """The step main() runs, for ``umctl capture``/``umctl advise``, with ``batch`` tokens (main()'s
    --tokens, default 2048): ``umctl capture benchmarks/gpu/programs/moe.py:make_step --batch 2048
    -o m.umw``. The other defaults are main()'s. A capture cannot see the clustered routing that
    main() produces (a handful of experts per step): it routes tokens uniformly over all experts
    (docs/guide/advise.md)."""
    nn = torch.nn
    d, E = d_model, experts

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.router = nn.Linear(d, E, bias=False, device=device)
            self.norm = nn.LayerNorm(d, device=device)
            self.up = nn.ParameterList([nn.Parameter(torch.randn(hidden, d, device=device) / d ** 0.5)
                                        for _ in range(E)])
            self.down = nn.ParameterList([nn.Parameter(torch.randn(d, hidden, device=device) / hidden ** 0.5)
                                          for _ in range(E)])

        def forward(self, x):
            h = self.norm(x)
            gate = self.router(h).softmax(-1)
            p, e = gate.max(-1)
            out = torch.zeros_like(x)
            for j in torch.unique(e).tolist():
                idx = (e == j).nonzero().squeeze(1)
                y = F.gelu(h[idx] @ self.up[j].t()) @ self.down[j].t()
                out = out.index_copy(0, idx, y * p[idx, None])
            return x + out

    model = nn.ModuleList([Layer() for _ in range(layers)])
    head = nn.Linear(d, 1).to(device)
    params = list(model.parameters()) + list(head.parameters())
    opt = torch.optim.SGD(params, lr=1e-3, foreach=False)

    def step() -> None:
        centres = torch.randn(clusters, d, device=device) * 3
        which = torch.randint(0, clusters, (batch,), device=device)
        x = centres[which] + noise * torch.randn(batch, d, device=device)
        y = torch.randn(batch, 1, device=device)
        opt.zero_grad(set_to_none=True)
        h = x
        for layer in model:
            h = layer(h)
        loss = F.mse_loss(head(h), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=False)
        opt.step()

    return nn.ModuleDict({"layers": model, "head": head}), step


if __name__ == "__main__":
    main()
