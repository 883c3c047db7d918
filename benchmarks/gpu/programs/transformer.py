"""Live-control program: TransformerEncoder language-model training (AdamW, fp32, math attention).

Default: d_model 1024, 16 heads, 4 layers, ff 4096, vocab 8192, batch 8 x seq 256; ~67 M
parameters (params + grads + Adam's two moments ~1.1 GB) plus activations: ~2 GiB footprint.
Every steady step touches all of it. Token batches come from a seeded CUDA generator."""

import _common as C
from _common import torch


def main() -> None:
    ap = C.parser(__doc__, steps=10)
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--ff", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    a = ap.parse_args()
    dev = C.setup(a)
    layer = torch.nn.TransformerEncoderLayer(a.d_model, a.heads, a.ff, dropout=0.0, batch_first=True)
    model = torch.nn.ModuleDict({
        "emb": torch.nn.Embedding(a.vocab, a.d_model),
        "enc": torch.nn.TransformerEncoder(layer, a.layers, enable_nested_tensor=False),
        "head": torch.nn.Linear(a.d_model, a.vocab),
    }).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, foreach=False)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(a.seq, device=dev)
    gen = C.cuda_gen(a.seed + 1)
    losses = []

    def step(i: int) -> None:
        start = torch.randint(0, a.vocab, (a.batch, 1), device=dev, generator=gen)
        inc = torch.randint(1, 4, (a.batch, a.seq + 1), device=dev, generator=gen)
        tokens = (start + torch.cumsum(inc, 1)) % a.vocab          # a learnable stream
        x, y = tokens[:, :-1], tokens[:, 1:]
        h = model["enc"](model["emb"](x), mask=mask, is_causal=True)
        loss = torch.nn.functional.cross_entropy(model["head"](h).reshape(-1, a.vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        losses.append(loss.detach())

    total = C.run_steps(a.steps, step)
    C.finish_training("transformer", total, losses, list(model.parameters()))


def make_step(batch: int, device, d_model: int = 1024, heads: int = 16, layers: int = 4, ff: int = 4096,
              vocab: int = 8192, seq: int = 256):
    """The step main() runs, for ``umctl capture``/``umctl advise`` (the defaults are main()'s):
    ``umctl capture benchmarks/gpu/programs/transformer.py:make_step --batch 8 -o t.umw``.
    Token batches come from torch.randint (main() draws them from a seeded CUDA generator), and
    attention is the math path, as main() sets it (C.setup)."""
    for name in ("enable_flash_sdp", "enable_mem_efficient_sdp", "enable_cudnn_sdp"):
        fn = getattr(torch.backends.cuda, name, None)
        if fn is not None:
            fn(False)
    layer = torch.nn.TransformerEncoderLayer(d_model, heads, ff, dropout=0.0, batch_first=True)
    model = torch.nn.ModuleDict({
        "emb": torch.nn.Embedding(vocab, d_model),
        "enc": torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False),
        "head": torch.nn.Linear(d_model, vocab),
    }).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, foreach=False)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(seq, device=device)

    def step() -> None:
        start = torch.randint(0, vocab, (batch, 1), device=device)
        inc = torch.randint(1, 4, (batch, seq + 1), device=device)
        tokens = (start + torch.cumsum(inc, 1)) % vocab
        x, y = tokens[:, :-1], tokens[:, 1:]
        h = model["enc"](model["emb"](x), mask=mask, is_causal=True)
        loss = torch.nn.functional.cross_entropy(model["head"](h).reshape(-1, vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()

    return model, step


if __name__ == "__main__":
    main()
