"""The footprint probe: how much memory do DeepUM's models really take (the paper's batch sizes
for the transformers, smaller ones for ResNet), against umctl's model of them (umctl/workload/families/dnn.py, ``--param scale=full``)?

    python3 benchmarks/gpu/footprint_probe.py run [--only gpt2-l:3,bert-base:29] [--json OUT]   # GPU machine
    python3 benchmarks/gpu/footprint_probe.py compare OUT.json                                  # anywhere

``run`` trains each model for three steps in a process of its own, as the paper's frameworks
run it (Hugging Face GPT-2 / BERT masked-LM with eager attention, fp32, AdamW; torchvision
ResNet with SGD + momentum, ``cudnn.benchmark`` as in PyTorch's ImageNet example), on plain
device memory, and records the caching allocator's peaks: ``max_memory_allocated`` (live
tensors) and ``max_memory_reserved`` (the pool the allocator took from CUDA, which DeepUM's
runtime turns into managed memory: the footprint UM has to page). Only rows that fit the GPU
run; nothing is oversubscribed. ``compare`` prints them beside umctl's footprint of the same
model and batch (weights, gradients, optimizer state and the allocator-block plan).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

#: rows that fit an 80 GB GPU: the paper's own batch sizes for the transformers, smaller ones for
#: ResNet (its growth per image is compared); tests/data/real/footprint-h100.json holds all of them
ROWS = ["bert-base:29", "bert-base:30", "bert-base:31", "bert-large:14", "bert-large:16", "bert-large:18",
        "gpt2-l:3", "gpt2-xl:1", "gpt2-xl:2", "resnet152:64", "resnet152:128", "resnet152:256", "resnet200:128"]
#: Hugging Face models: name -> (architecture, config, sequence length)
HF = {
    "gpt2-l": ("gpt2", dict(n_embd=1280, n_layer=36, n_head=20, n_positions=1024), 1024),
    "gpt2-xl": ("gpt2", dict(n_embd=1600, n_layer=48, n_head=25, n_positions=1024), 1024),
    "bert-large": ("bert", dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                                intermediate_size=4096), 512),
    "bert-base": ("bert", dict(), 512),
}
MODELS = (*HF, "resnet152", "resnet200")


def one(model: str, batch: int, steps: int = 3) -> dict:
    """Train ``model`` at ``batch`` for ``steps`` steps; the allocator's peaks (this process only)."""
    import torch

    dev = torch.device("cuda")
    torch.manual_seed(0)
    if model in HF:
        import transformers as T

        kind, cfg, seq = HF[model]
        conf = (T.GPT2Config if kind == "gpt2" else T.BertConfig)(**cfg)
        auto = T.AutoModelForCausalLM if kind == "gpt2" else T.AutoModelForMaskedLM
        with dev:   # the paper's era had no fused attention: eager keeps the probabilities
            net = auto.from_config(conf, attn_implementation="eager")
        vocab = conf.vocab_size
        attn = getattr(net.config, "_attn_implementation", None)
        ids = torch.randint(0, vocab, (batch, seq), device=dev)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-5, foreach=False)

        def loss():
            return net(input_ids=ids, labels=ids).loss
    else:
        import torchvision

        torch.backends.cudnn.benchmark = True
        with dev:   # torchvision has no resnet200: its Bottleneck ResNet with [3, 24, 36, 3] blocks
            net = (torchvision.models.resnet.ResNet(torchvision.models.resnet.Bottleneck, [3, 24, 36, 3])
                   if model == "resnet200" else getattr(torchvision.models, model)(weights=None))
        x = torch.randn(batch, 3, 224, 224, device=dev)
        y = torch.randint(0, 1000, (batch,), device=dev)
        lossf = torch.nn.CrossEntropyLoss()
        opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, foreach=False)

        def loss():
            return lossf(net(x), y)
        attn = None
    net.train()
    params = sum(p.numel() for p in net.parameters())
    t = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad(set_to_none=False)
        loss().backward()
        opt.step()
    torch.cuda.synchronize()
    return {"row": f"{model}:{batch}", "params": params, "max_allocated": torch.cuda.max_memory_allocated(),
            "max_reserved": torch.cuda.max_memory_reserved(), "reserved": torch.cuda.memory_reserved(),
            "step_s": (time.perf_counter() - t) / steps, "torch": torch.__version__, "attn": attn,
            "device": torch.cuda.get_device_name()}


def run(rows: list[str], out: Path | None) -> list[dict]:
    results = []
    for row in rows:
        model, batch = row.split(":")
        p = subprocess.run([sys.executable, __file__, "one", model, batch], capture_output=True, text=True, timeout=300)
        line = next((ln for ln in reversed(p.stdout.splitlines()) if ln.startswith("{")), None)
        if p.returncode != 0 or line is None:
            tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["no output"]
            print(f"{row}: failed: {tail[0]}", file=sys.stderr)
            continue
        results.append(json.loads(line))
        print(json.dumps(results[-1]), flush=True)
    if out is not None:
        out.write_text(json.dumps(results, indent=1) + "\n")
    return results


def compare(results: list[dict]) -> str:
    from umctl.workload.scenario import load_scenario

    lines = ["| model, batch | params: real | umctl | live tensors peak (GiB) | allocator pool peak (GiB) | "
             "umctl footprint (GiB) | umctl / pool |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        model, batch = r["row"].split(":")
        w = load_scenario(model, {"scale": "full", "batch": batch, "iterations": "1"})
        um = w.managed_bytes
        lines.append(f"| {model} batch {batch} | {r['params'] / 1e6:,.0f} M | {w.meta['param_count'] / 1e6:,.0f} M | "
                     f"{r['max_allocated'] / 2**30:.2f} | {r['max_reserved'] / 2**30:.2f} | {um / 2**30:.2f} | "
                     f"{um / r['max_reserved']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--only", default=",".join(ROWS))
    r.add_argument("--json")
    o = sub.add_parser("one")
    o.add_argument("model")
    o.add_argument("batch", type=int)
    c = sub.add_parser("compare")
    c.add_argument("json")
    a = ap.parse_args()
    if a.cmd == "one":
        print(json.dumps(one(a.model, a.batch)))
    elif a.cmd == "run":
        rows = a.only.split(",")
        bad = [r for r in rows if r.count(":") != 1 or not r.split(":")[1].isdigit() or r.split(":")[0] not in MODELS]
        if bad:
            raise SystemExit(f"footprint_probe: bad row {bad[0]!r}: MODEL:BATCH with MODEL one of {', '.join(MODELS)}")
        res = run(rows, Path(a.json) if a.json else None)
        if not res:
            raise SystemExit("footprint_probe: no row ran")
    else:
        from umctl import UmctlError

        path = Path(a.json)
        if not path.is_file():
            raise SystemExit(f"footprint_probe: no such file: {path}")
        try:
            rows = json.loads(path.read_text())
            print(compare(rows))
        except json.JSONDecodeError as e:
            raise SystemExit(f"footprint_probe: {path} is not JSON ({e.msg} at line {e.lineno}); 'run --json' writes it")
        except (KeyError, TypeError, ValueError) as e:
            raise SystemExit(f"footprint_probe: {path} is not a list of 'run' results ({type(e).__name__}: {e})")
        except UmctlError as e:
            raise SystemExit(f"footprint_probe: {path}: {e}")


if __name__ == "__main__":
    main()
