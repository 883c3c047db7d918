"""A GPT-2 training step for ``umctl capture`` / ``umctl advise`` (docs/guide/advise.md).

``make_step(batch, device)`` builds the model and optimizer on ``device`` and returns
``(model, step)``; ``step()`` runs one training step. umctl calls it with the meta device (no
memory of the model's size is allocated, no GPU needed); on a GPU the same function trains:

    python3 examples/torch/gpt2_step.py --device cuda --batch 8 --steps 5

``make_step`` is a small GPT-2 (2 layers, width 128) so the documented commands run in seconds
on a CPU; ``make_step_124m`` is GPT-2 small's shape (12 layers, width 768, 1024 tokens).
Needs ``torch`` and ``transformers``; the model is built from a config, nothing is downloaded.
"""

from __future__ import annotations

import torch


def _gpt2_step(batch: int, device: torch.device, *, layers: int, width: int, heads: int, seq: int, vocab: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=layers, n_embd=width, n_head=heads, n_positions=seq, vocab_size=vocab,
                        bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config).to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)

    def step() -> None:
        tokens = torch.randint(0, vocab, (batch, seq), device=device)
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return model, step


def make_step(batch: int, device: torch.device):
    """A 2-layer GPT-2 of width 128 over 256 tokens and an 8192-word vocabulary (1.5 M parameters)."""
    return _gpt2_step(batch, device, layers=2, width=128, heads=4, seq=256, vocab=8192)


def make_step_124m(batch: int, device: torch.device):
    """GPT-2 small's shape: 12 layers, width 768, 12 heads, 1024 tokens, 50257 words (124 M parameters)."""
    return _gpt2_step(batch, device, layers=12, width=768, heads=12, seq=1024, vocab=50257)


if __name__ == "__main__":
    import argparse
    import time

    ap = argparse.ArgumentParser(description="Run the step for real (the model umctl captures).")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--small", action="store_true", help="GPT-2 small (124 M) instead of the 2-layer model")
    a = ap.parse_args()
    dev = torch.device(a.device)
    _, run = (make_step_124m if a.small else make_step)(a.batch, dev)
    for i in range(a.steps):
        t = time.perf_counter()
        run()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        print(f"step {i}: {(time.perf_counter() - t) * 1e3:.1f} ms", flush=True)
