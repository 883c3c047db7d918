"""Live-control program: LLM-style token decoding (fp16, inference) whose weights exceed the budget.

A stack of pre-norm decoder blocks (attention with a KV cache, GELU MLP; plain matmuls, no fused
kernels): default d_model 4096, 6 layers, 32 heads, MLP 4x: 12 d^2 fp16 weights a layer, ~2.25
GiB of weights, plus an output head over a 32 K vocabulary (256 MiB) and a KV cache of batch 4
x 512 positions (~200 MiB). Step 0 runs the prompt (prefill); each later step generates one
token greedily for every sequence, reading every weight once: the whole footprint per step,
almost all of it read-only. The checksum hashes the generated tokens and the last logits."""

import math

import _common as C
from _common import torch

F = torch.nn.functional


def main() -> None:
    ap = C.parser(__doc__, steps=24)
    ap.add_argument("--d-model", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=64)
    a = ap.parse_args()
    dev = C.setup(a)
    d, H = a.d_model, a.heads
    hd = d // H
    T = a.prompt + a.steps
    dt = torch.float16

    def w(*shape):   # scaled so activations stay O(1) through the stack
        return torch.randn(*shape, device=dev, dtype=dt).mul_(1 / math.sqrt(shape[-1]))

    layers = [dict(qkv=w(3 * d, d), o=w(d, d), up=w(4 * d, d), down=w(d, 4 * d),
                   n1=torch.ones(d, device=dev, dtype=dt), n2=torch.ones(d, device=dev, dtype=dt))
              for _ in range(a.layers)]
    emb = w(a.vocab, d)
    head = w(a.vocab, d)
    kc = [torch.zeros(a.batch, H, T, hd, device=dev, dtype=dt) for _ in range(a.layers)]
    vc = [torch.zeros(a.batch, H, T, hd, device=dev, dtype=dt) for _ in range(a.layers)]
    gen = C.cuda_gen(a.seed + 1)
    prompt = torch.randint(0, a.vocab, (a.batch, a.prompt), device=dev, generator=gen)
    out_tokens = []
    state = {"pos": 0, "next": prompt, "logits": None}

    def block(x, L, k_cache, v_cache, pos):
        B, n, _ = x.shape
        h = F.layer_norm(x, (d,), L["n1"])
        q, k, v = (h @ L["qkv"].t()).view(B, n, 3, H, hd).permute(2, 0, 3, 1, 4)
        k_cache[:, :, pos:pos + n] = k
        v_cache[:, :, pos:pos + n] = v
        keys, vals = k_cache[:, :, :pos + n], v_cache[:, :, :pos + n]
        s = (q @ keys.transpose(-1, -2)).float() / math.sqrt(hd)
        if n > 1:   # causal inside the prompt
            s = s + torch.full((n, pos + n), float("-inf"), device=dev).triu(pos + 1)
        att = (s.softmax(-1).to(dt) @ vals).transpose(1, 2).reshape(B, n, d)
        x = x + att @ L["o"].t()
        h = F.layer_norm(x, (d,), L["n2"])
        return x + F.gelu(h @ L["up"].t()) @ L["down"].t()

    @torch.no_grad()
    def step(i: int) -> None:
        toks = state["next"]
        x = emb[toks]
        pos = state["pos"]
        for L, k_cache, v_cache in zip(layers, kc, vc):
            x = block(x, L, k_cache, v_cache, pos)
        logits = (x[:, -1] @ head.t()).float()
        state["pos"] = pos + toks.shape[1]
        state["next"] = logits.argmax(-1, keepdim=True)
        state["logits"] = logits
        out_tokens.append(state["next"])

    total = C.run_steps(a.steps, step)
    toks = torch.cat(out_tokens, 1).cpu()
    if not bool(torch.isfinite(state["logits"]).all()):
        raise SystemExit("decoder: logits not finite")
    wbytes = sum(t.numel() * t.element_size() for L in layers for t in L.values()) + 2 * emb.numel() * 2
    print(f"WEIGHTS {wbytes}", flush=True)
    C.finish(total, C.checksum([toks, state["logits"]]))


if __name__ == "__main__":
    main()
