"""GPU workload for replay fidelity: a small PyTorch transformer (nn.TransformerEncoder, causal
LM head) trained with AdamW. Run it under ``umctl run --runtime --managed``: every tensor torch
allocates (parameters, Adam's state, activations, cuBLAS's workspace) is managed memory.

The loop is a plain training loop: the host writes each step's token batch into a managed
buffer (a data loader writing into UVM), then forward, backward, optimizer step and the loss
read back. The first step touches everything for the first time (parameters copied in, Adam's
state and the activations created on the GPU); later steps run out of torch's block cache.
Prints ``STEP i ms loss``, then ``DONE ms t0=NS t1=NS checksum`` (span from before the model is
built to the last synchronisation, ends on CLOCK_MONOTONIC) and fails if the loss is not finite
or did not fall."""

import argparse
import hashlib
import math
import time

import numpy as np
import torch
from wl_span import Span, host_view, require_managed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args()
    require_managed("wl_transformer")
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    w = torch.ones(64, 64, device=dev, requires_grad=True)
    (w @ w).relu().sum().backward()        # cuBLAS handle and first kernels before the measured span,
    warm = torch.optim.AdamW([w], lr=1e-3)  # and the optimizer's first use (it imports torch._dynamo:
    warm.step()                             # seconds of host time, nothing of the GPU's)
    del warm
    span = Span()
    layer = torch.nn.TransformerEncoderLayer(a.d_model, a.heads, 4 * a.d_model, dropout=0.0, batch_first=True)
    model = torch.nn.ModuleDict({
        "emb": torch.nn.Embedding(a.vocab, a.d_model),
        "enc": torch.nn.TransformerEncoder(layer, a.layers, enable_nested_tensor=False),
        "head": torch.nn.Linear(a.d_model, a.vocab),
    }).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(a.seq, device=dev)
    tokens = torch.empty(a.batch, a.seq + 1, dtype=torch.int64, device=dev)
    host = host_view(tokens)
    rng = np.random.default_rng(1)
    losses = []
    for i in range(a.steps):
        t = time.perf_counter()
        torch.cuda.synchronize()             # the host may write the batch once the GPU is done with it
        # a learnable stream: each token is the previous one plus a small step, mod vocab
        start = rng.integers(0, a.vocab, (a.batch, 1))
        host[:] = (start + np.cumsum(rng.integers(1, 4, (a.batch, a.seq + 1)), axis=1)) % a.vocab
        x, y = tokens[:, :-1], tokens[:, 1:]
        h = model["enc"](model["emb"](x), mask=mask, is_causal=True)
        loss = torch.nn.functional.cross_entropy(model["head"](h).reshape(-1, a.vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        print(f"STEP {i} {(time.perf_counter() - t) * 1e3:.2f} {losses[-1]:.4f}", flush=True)
    hsh = hashlib.sha256(np.array(losses, np.float64).tobytes()).hexdigest()[:16]
    span.done(all(math.isfinite(v) for v in losses) and losses[-1] < losses[0], f"{hsh} ")


if __name__ == "__main__":
    main()
