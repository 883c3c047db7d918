"""Live-control program: Hugging Face transformers' GPT-2, trained as a language model (AdamW, fp32, eager attention).

A model umctl's code never defined: ``transformers.GPT2LMHeadModel`` built from a config (nothing
downloaded). Default: GPT-2 small's layer shape (12 layers, width 768, 12 heads) with a 16384-word
vocabulary, batch 4 x 512 tokens; ~98 M parameters (params + grads + Adam's two moments ~1.6 GB)
plus activations. Every steady step touches all of it. Token batches come from a seeded CUDA
generator. Needs ``transformers``."""

import _common as C
from _common import torch


def _build(device, layers: int, width: int, heads: int, seq: int, vocab: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=layers, n_embd=width, n_head=heads, n_positions=seq, vocab_size=vocab,
                     bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    cfg._attn_implementation = "eager"     # the math path: deterministic, and what the capture sees
    model = GPT2LMHeadModel(cfg).to(device)
    model.train()
    return model, torch.optim.AdamW(model.parameters(), lr=3e-4, foreach=False)


def main() -> None:
    ap = C.parser(__doc__, steps=10)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=16384)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    a = ap.parse_args()
    dev = C.setup(a)
    model, opt = _build(dev, a.layers, a.width, a.heads, a.seq, a.vocab)
    gen = C.cuda_gen(a.seed + 1)
    losses = []

    def step(i: int) -> None:
        start = torch.randint(0, a.vocab, (a.batch, 1), device=dev, generator=gen)
        inc = torch.randint(1, 4, (a.batch, a.seq), device=dev, generator=gen)
        tokens = (start + torch.cumsum(inc, 1)) % a.vocab          # a learnable stream
        loss = model(input_ids=tokens, labels=tokens).loss
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        losses.append(loss.detach())

    total = C.run_steps(a.steps, step)
    C.finish_training("hf_gpt2", total, losses, list(model.parameters()))


def make_step(batch: int, device, layers: int = 12, width: int = 768, heads: int = 12, vocab: int = 16384,
              seq: int = 512):
    """The step main() runs, for ``umctl capture``/``umctl advise`` (the defaults are main()'s):
    ``umctl capture benchmarks/gpu/programs/hf_gpt2.py:make_step --batch 4 -o g.umw``. Tokens
    come from torch.randint (main() draws them from a seeded CUDA generator)."""
    model, opt = _build(device, layers, width, heads, seq, vocab)

    def step() -> None:
        start = torch.randint(0, vocab, (batch, 1), device=device)
        inc = torch.randint(1, 4, (batch, seq), device=device)
        tokens = (start + torch.cumsum(inc, 1)) % vocab
        loss = model(input_ids=tokens, labels=tokens).loss
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()

    return model, step


if __name__ == "__main__":
    main()
