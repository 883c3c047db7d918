"""DNN training loops as PyTorch runs them on Unified Memory (DeepUM, ASPLOS'23, §3-§6).

A model is a list of operations in forward order (:class:`Net`). :func:`trace` turns it into
one training iteration's program: input copies, forward kernels, backward kernels in reverse
order (grad-input and grad-weight, reading saved activations and weights), an optimizer step
per layer, and a synchronisation. Activations, activation gradients and sparse embedding
gradients live in blocks of a small caching allocator (:func:`plan_pool`), planned in steady
state so every iteration hands out the same addresses, as PyTorch's allocator does after its
first iteration; that is what gives DeepUM's execution IDs (kernel name + arguments, §3.1) the
same sequence every iteration, and what its invalidation of inactive PT blocks (§5.2) feeds on:
a MEM BLOCK_INACTIVE after a tensor's last use, BLOCK_ACTIVE before the block's next write.

With ``scale = "fit"`` (the default) the full-size model's tensors are scaled by one factor so
the managed footprint is ``oversub x gpu_mem``; kernel times are computed on the full-size model
and scaled by the same factor, so the compute : transfer ratio is the real model's. With
``scale = "full"`` nothing is scaled: every tensor has the size it has in the real fp32 run (so
``oversub`` is whatever the model's footprint makes it on ``gpu_mem``), which is the regime the
papers' tables were measured in (docs/evaluation/fidelity.md).

Beyond DeepUM's fp32 models, the shapes people train now (issue 38 §3): decoder transformers
with RMSNorm, rotary positions, grouped-query and fused (FlashAttention) attention, SwiGLU MLPs
and an untied LM head (LLaMA); mixture-of-experts layers whose router sends each iteration's
batch to ``top_k`` of ``experts`` experts drawn per iteration (Mixtral), so the weights, grads
and optimizer state an iteration touches change from one iteration to the next; ViTs (patch
embedding, class token); a diffusion U-Net whose encoder activations stay alive until the
matching decoder stage concatenates them (:func:`unet_net`); and mixed precision as torch.amp
runs it (``precision = "bf16"`` or ``"fp16"``): fp32 weights, grads and Adam state, half-width
activations, and a half copy of every GEMM weight cast each forward and kept until its last
backward use. Every one is a parameter whose default is the DeepUM models' behaviour, so those
workloads are unchanged.
"""

from __future__ import annotations

import bisect
import enum
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from ...events.schema import AllocOp, CopyKind
from ...units import PAGE_SIZE
from ..workload import Buffer, Init, OpType, Workload, WorkloadBuilder
from .common import (CostModel, Tick, at_least, byte_pages, carve, check, check_common, choice, drain, first_page,
                     first_touch, fit_scale, grid_for, spread, to_pages, zipf_ranks)

#: fp32, as the Hugging Face and PyTorch-examples training scripts DeepUM ran use by default.
F32 = 4
INDEX_BYTES = 8
#: Bytes per activation element for ``precision``: torch.amp keeps fp32 master weights, grads
#: and optimizer state, and computes in a 2-byte type.
PRECISIONS: dict[str, int] = {"fp32": F32, "bf16": 2, "fp16": 2}


class OpKind(enum.Enum):
    INPUT = "input"    # a batch tensor the data loader copies in each iteration
    GEMM = "gemm"      # matmul / convolution: compute-bound
    ELEM = "elem"      # elementwise, normalisation, softmax, loss: bandwidth-bound
    GATHER = "gather"  # embedding lookup of rows chosen by the input (different every iteration)


@dataclass(frozen=True)
class NetOp:
    """One forward operation of the full-size model (sizes in bytes, before scaling)."""

    name: str
    kind: OpKind
    layer: int
    out: float                      # its output activation
    inputs: tuple[int, ...] = ()    # producers (indices of earlier ops)
    weight: float = 0.0             # its own parameters
    shares: int = -1                # op whose parameters it uses instead (tied embeddings)
    flops: float = 0.0              # forward flops
    rows: int = 0                   # GATHER: table rows (row bytes = weight / rows)
    lookups: int = 0                # GATHER: rows looked up per iteration
    sparse: bool = False            # GATHER: sparse gradient, only looked-up rows updated (DLRM)
    saved: float = 0.0              # what autograd keeps besides the output (dropout masks, the
                                    # intermediates of a GELU written as Python ops), read by backward
    inplace: bool = False           # writes its first input's tensor (torchvision's relu_, out += x)
    keeps: bool = True              # backward reads its inputs' activations (an add's does not)
    backward: float = 1.0           # GEMM without weight: backward flops per input / forward flops
                                    # (FlashAttention recomputes the scores: 2.5x over one input)
    experts: int = 0                # router: experts it chooses among (its own weight is plain)
    top_k: int = 0                  # router: experts chosen per iteration (> 0 marks a router)
    router: int = -1                # expert op: the router whose choice binds its weight
    slot: int = -1                  # expert op: which of the router's top_k choices it computes

    @property
    def row_bytes(self) -> int:
        return int(self.weight // self.rows)


@dataclass
class Net:
    """A model in forward order. Layer numbers group parameters for the optimizer step.
    ``act``: bytes per activation element (weights are always fp32: torch.amp's master
    weights); ``dtype``: its name, which the weight-cast kernels carry."""

    ops: list[NetOp] = field(default_factory=list)
    layer: int = 0
    act: int = F32
    dtype: str = "fp32"

    def add(self, name: str, kind: OpKind, out: float, inputs: tuple[int, ...] | list[int] = (), **kw) -> int:
        self.ops.append(NetOp(name, kind, self.layer, float(out), tuple(inputs), **kw))
        return len(self.ops) - 1

    def input(self, name: str, nbytes: float) -> int:
        return self.add(name, OpKind.INPUT, nbytes)

    def gemm(self, name: str, inputs: list[int], out: float, flops: float, weight: float = 0.0,
             shares: int = -1, **kw) -> int:
        return self.add(name, OpKind.GEMM, out, inputs, weight=float(weight), shares=shares, flops=float(flops),
                        **kw)

    def elem(self, name: str, inputs: list[int], out: float, weight: float = 0.0, saved: float = 0.0) -> int:
        return self.add(name, OpKind.ELEM, out, inputs, weight=float(weight), saved=float(saved))

    def pure(self, name: str, inputs: list[int], out: float) -> int:
        """An elementwise op whose backward needs none of its inputs (an add, a concatenation,
        a nearest upsample, an index gather): autograd saves nothing for it."""
        return self.add(name, OpKind.ELEM, out, inputs, keeps=False)

    def inplace(self, name: str, inputs: list[int], keeps: bool = True) -> int:
        """An elementwise op overwriting its first input (its bytes, no new tensor), as autograd
        lets ``relu_`` and ``+=`` do where no backward needs the old value; ``keeps``: its
        backward reads the inputs' activations."""
        return self.add(name, OpKind.ELEM, self.ops[inputs[0]].out, inputs, inplace=True, keeps=keeps)

    def gather(self, name: str, index: int, rows: int, row_bytes: int, lookups: int, out: float,
               sparse: bool = False) -> int:
        return self.add(name, OpKind.GATHER, out, (index,), weight=float(rows * row_bytes), rows=int(rows),
                        lookups=int(lookups), sparse=sparse)

    def next_layer(self) -> None:
        self.layer += 1

    def copies(self, op: NetOp) -> int:
        """How many tensors an op's weight stands for: an expert op's weight is one of its
        router's ``experts`` (the one routed to its slot), every other weight is itself."""
        return self.ops[op.router].experts if op.router >= 0 else 1

    @property
    def param_count(self) -> int:
        return int(sum(op.weight * self.copies(op) for op in self.ops) // F32)


# -- model shapes ----------------------------------------------------------------------------
def precision_of(p: dict) -> tuple[str, int]:
    """``precision`` (fp32 unless given) and its bytes per activation element."""
    name = p.get("precision", "fp32")
    check(name in PRECISIONS, f"precision must be one of {', '.join(PRECISIONS)} (got {name!r})")
    return name, PRECISIONS[name]


def option(p: dict, key: str, default: str, options: tuple[str, ...]) -> str:
    """A string parameter that older scenarios leave out (their behaviour is ``default``)."""
    return choice({key: p.get(key, default)}, key, options)


def transformer_net(p: dict) -> Net:
    """GPT-2 / BERT as the Hugging Face models run them (DeepUM Table 2): token + position
    embeddings, ``layers`` blocks (LN, QKV, attention scores and context as batched GEMMs with
    the b x heads x s x s probabilities saved, projection, residual, LN, 4h MLP with GELU), a
    final LN and the vocabulary head tied to the token embedding; log-softmax and NLL over all
    tokens (BERT's MLM head adds a dense + LN transform first).

    Saved tensors follow the Hugging Face implementations in fp32: with ``dropout`` each dropout
    keeps a one-byte mask per element (a quarter of an fp32 activation), the attention dropout
    also its output; ``gelu = "gelu_new"`` (GPT-2's tanh approximation, written as Python
    tensor ops) keeps three more 4h-wide intermediates for backward (tanh, 0.5x, 1 + tanh), where
    BERT's fused ``gelu`` keeps only its input.

    The options below default to GPT-2/BERT, whose programs they leave unchanged:

    * ``norm = "rmsnorm"`` (a weight, no bias), ``bias = false`` (no linear biases),
      ``position = "rope"`` (no position table; rotary embedding applied to q and k in place,
      as fused rotary kernels do), ``kv_heads`` (grouped-query attention: K and V for fewer
      heads), ``intermediate`` (MLP width, 0: 4 x hidden), ``tied = false`` (an LM head with
      its own vocab x hidden weight): LLaMA, Mistral.
    * ``attention = "sdpa"``: fused attention (FlashAttention through
      F.scaled_dot_product_attention) that saves its output and the fp32 log-sum-exp instead of
      the s x s probabilities, at half the flops when causal (an ``lm`` head), and recomputes
      the scores in backward (2.5 x the forward flops).
    * ``mlp = "swiglu"``: gate and up projections, SiLU, product, down projection; autograd
      keeps the gate output (SiLU's input), the SiLU output and the up output (the product's
      inputs) and the product (the down projection's input), four intermediate-wide tensors.
    * ``experts`` > 0: every block's MLP is a mixture of SwiGLU experts (Mixtral): a router
      GEMM (hidden x experts), softmax + top-k (saving the chosen indices and weights), and per
      chosen expert a dispatch (index gather of the tokens), the expert's own gate/up/down
      GEMMs, and a combine (the routing-weighted scatter-add). The router sends the batch to
      ``top_k`` experts drawn per iteration (see :func:`route`), so each chosen expert runs on
      the whole batch and the others stay untouched that iteration.
    * ``embed = "patches"``: a ViT: ``image`` x ``image`` RGB inputs cut into ``patch`` x
      ``patch`` patches by a strided convolution, a class token and learned position
      embeddings (seq_len = patches + 1); ``head = "cls"`` classifies the class token.
    * ``precision = "bf16"`` / ``"fp16"``: activations of 2 bytes (torch.amp; see :func:`trace`
      for the weight casts). Autocast keeps softmax, the loss' log-softmax and, in real models,
      the norms and the residual stream in fp32; here only the softmaxes and the loss are fp32,
      every other activation is half-width (as in a model run under FSDP's or Megatron's mixed
      precision), which slightly understates the activations of an autocast run."""
    b, h, a, L = p["batch"], p["hidden"], p["heads"], p["layers"]
    head = choice(p, "head", ("lm", "mlm", "cls"))
    embed = option(p, "embed", "tokens", ("tokens", "patches"))
    kinds = {"gelu": p.get("gelu", "gelu"), "dropout": p.get("dropout", True)}
    gelu_saved = {"gelu": 0.0, "gelu_new": 3.0}[choice(kinds, "gelu", ("gelu", "gelu_new"))]
    dtype, e = precision_of(p)
    mask = 1.0 / e if kinds["dropout"] else 0.0   # bool mask per element
    norm = option(p, "norm", "layernorm", ("layernorm", "rmsnorm"))
    mlp = option(p, "mlp", "gelu", ("gelu", "swiglu"))
    attention = option(p, "attention", "eager", ("eager", "sdpa"))
    position = option(p, "position", "learned", ("learned", "rope"))
    bias = bool(p.get("bias", True))
    tied = bool(p.get("tied", True))
    for key in ("batch", "hidden", "heads", "layers"):
        at_least(p, key, 1)
    inter = int(p.get("intermediate", 0)) or 4 * h
    kv = int(p.get("kv_heads", 0)) or a
    experts, top_k = int(p.get("experts", 0)), int(p.get("top_k", 0))
    check(inter >= 1 and 1 <= kv <= a and a % kv == 0, f"kv_heads must divide heads (got {kv} of {a})")
    check(kv == a or h % a == 0, f"grouped-query attention needs hidden divisible by heads (got {h}, {a})")
    check(experts == 0 or 1 <= top_k <= experts, f"top_k must be from 1 to experts (got {top_k} of {experts})")
    if embed == "tokens":
        at_least(p, "seq_len", 1)
        at_least(p, "vocab", 1)
        s, V = p["seq_len"], p["vocab"]
    else:
        for key in ("image", "patch", "classes"):
            at_least(p, key, 1)
        img, patch = p["image"], p["patch"]
        check(img % patch == 0, f"image must be a multiple of patch (got {img}, {patch})")
        s = (img // patch) ** 2 + 1
    check(head == "cls" or embed == "tokens", "a ViT (embed = patches) needs head = cls")
    T = b * s
    act = T * h * e
    net = Net(act=e, dtype=dtype)
    norm_name, norm_weight = ("layer_norm", 2 * h * F32) if norm == "layernorm" else ("rms_norm", h * F32)

    def residual(y: int, x: int) -> int:
        if kinds["dropout"]:
            return net.elem("dropout_add_residual", [y, x], act, saved=mask * act)
        return net.pure("add_residual", [y, x], act)

    def swiglu(x: int, prefix: str, own: tuple[int, int, int] | None = None, **kw) -> tuple[int, tuple[int, ...]]:
        """Gate, SiLU, up, product, down (Hugging Face's LlamaMLP order); ``own``: the ops whose
        weights these use (an expert's later slots use the first slot's). Returns the down
        projection and the three weight ops."""
        width = T * inter * e
        w_in, w_out = h * inter * F32, inter * h * F32

        def lin(name: str, inputs: list[int], out: float, flops: float, weight: float, k: int) -> int:
            if own is None:
                return net.gemm(name, inputs, out, flops, weight=weight, **kw)
            return net.gemm(name, inputs, out, flops, shares=own[k], **kw)

        gate = lin(f"gemm_{prefix}_gate", [x], width, 2 * T * h * inter, w_in, 0)
        act_ = net.elem("silu", [gate], width)
        up = lin(f"gemm_{prefix}_up", [x], width, 2 * T * h * inter, w_in, 1)
        prod = net.elem("mul", [act_, up], width)
        down = lin(f"gemm_{prefix}_down", [prod], act, 2 * T * inter * h, w_out, 2)
        return down, (gate, up, down)

    if embed == "tokens":
        tokens = net.input("input_ids", T * INDEX_BYTES)
        emb = net.gather("embedding_lookup", tokens, rows=V, row_bytes=h * F32, lookups=T, out=act)
        x = emb
        if position == "learned":
            x = net.elem("add_position_embedding", [emb], act, weight=s * h * F32, saved=mask * act)
    else:
        images = net.input("images", b * 3 * img * img * F32)
        n = s - 1
        x = net.gemm("conv_patch_embed", [images], b * n * h * e, 2 * b * n * 3 * patch * patch * h,
                     weight=(3 * patch * patch * h + h) * F32)
        # the class token (h) is concatenated in front, then the learned positions (s x h) added
        x = net.elem("add_cls_position_embedding", [x], act, weight=(s * h + h) * F32, saved=mask * act)
    qkv_width = 3 * h if kv == a else h + 2 * (h // a) * kv
    for _ in range(L):
        net.next_layer()
        ln1 = net.elem(norm_name, [x], act, weight=norm_weight)
        qkv = net.gemm("gemm_qkv", [ln1], T * qkv_width * e, 2 * T * h * qkv_width,
                       weight=(h * qkv_width + (qkv_width if bias else 0)) * F32)
        if position == "rope":
            qkv = net.inplace("apply_rotary", [qkv], keeps=False)
        if attention == "eager":
            scores = net.gemm("bgemm_attn_scores", [qkv], b * a * s * s * e, 2 * b * s * s * h)
            probs = net.elem("softmax_dropout", [scores], b * a * s * s * e, saved=mask * b * a * s * s * e)
            ctx = net.gemm("bgemm_attn_context", [probs, qkv], act, 2 * b * s * s * h)
        else:
            flops = 4 * b * s * s * h * (0.5 if head == "lm" else 1.0)
            ctx = net.gemm("flash_attention", [qkv], act, flops, saved=b * a * s * F32, backward=2.5)
        proj = net.gemm("gemm_attn_proj", [ctx], act, 2 * T * h * h, weight=(h * h + (h if bias else 0)) * F32)
        r1 = residual(proj, x)
        ln2 = net.elem(norm_name, [r1], act, weight=norm_weight)
        if experts:
            router = net.gemm("gemm_router", [ln2], T * experts * e, 2 * T * h * experts, weight=h * experts * F32,
                              experts=experts, top_k=top_k)
            # Mixtral: softmax in fp32 over the experts, top-k, renormalised weights
            routing = net.elem("softmax_topk", [router], T * experts * F32, saved=T * top_k * (INDEX_BYTES + F32))
            outs: list[int] = []
            first: tuple[int, ...] | None = None
            for slot in range(top_k):
                tokens_in = net.pure("moe_dispatch", [ln2], act)
                down, weights = swiglu(tokens_in, "expert", first, router=router, slot=slot)
                first = first or weights
                outs.append(down)
            y = net.elem("moe_combine", outs + [routing], act)
        elif mlp == "swiglu":
            y, _ = swiglu(ln2, "mlp")
        else:
            fc1 = net.gemm("gemm_mlp_fc1", [ln2], T * inter * e, 2 * T * h * inter,
                           weight=(h * inter + (inter if bias else 0)) * F32)
            gelu = net.elem("gelu", [fc1], T * inter * e, saved=gelu_saved * (T * inter * e))
            y = net.gemm("gemm_mlp_fc2", [gelu], act, 2 * T * inter * h, weight=(inter * h + (h if bias else 0)) * F32)
        x = residual(y, r1)
    net.next_layer()
    x = net.elem(norm_name, [x], act, weight=norm_weight)
    if head == "mlm":
        x = net.gemm("gemm_mlm_transform", [x], act, 2 * T * h * h, weight=(h * h + h) * F32)
        x = net.elem("gelu_layer_norm", [x], act, weight=2 * h * F32)
    if head == "cls":
        C = p["classes"]
        logits = net.gemm("gemm_classifier", [x], b * C * e, 2 * b * h * C, weight=(h * C + C) * F32)
        net.elem("cross_entropy_loss", [logits], b * C * F32)
        return net
    if tied:
        logits = net.gemm("gemm_vocab_head", [x], T * V * e, 2 * T * h * V, shares=emb)
    else:
        logits = net.gemm("gemm_lm_head", [x], T * V * e, 2 * T * h * V, weight=V * h * F32)
    # Hugging Face returns the logits, so they stay alive next to the saved log-probabilities.
    logp = net.elem("log_softmax", [logits], T * V * F32)
    net.elem("nll_loss", [logp], T * F32)
    return net


def resnet_net(p: dict) -> Net:
    """Bottleneck ResNet as torchvision builds it (DeepUM runs ResNet-152/200 from the PyTorch
    ImageNet example): 7x7 stem, max-pool, stages of 1x1-3x3-1x1 bottlenecks (stride in the 3x3,
    projection shortcut, a 1x1 conv and BN without ReLU, on each stage's first block), global
    pool, classifier. Every op is its own kernel, as PyTorch launches them: conv, BN, then
    ``relu_`` in place on BN's output; a block ends ``out = bn3(...); out += identity;
    out = relu_(out)``, both in place, so a block keeps conv and BN outputs only (the shortcut's
    BN output dies at the add, whose backward needs no activation)."""
    B, img, width, classes = p["batch"], p["image"], p["width"], p["classes"]
    for key in ("batch", "image", "width", "classes"):
        at_least(p, key, 1)
    check(len(p["blocks"]) >= 1 and min(p["blocks"]) >= 1, "blocks must list at least one block per stage")
    net = Net()

    def conv_bn(x: int, cin: int, cout: int, k: int, hw: int, name: str, relu: bool = True) -> int:
        c = net.gemm(name, [x], B * cout * hw * hw * F32, 2 * B * hw * hw * cin * cout * k * k,
                     weight=cin * cout * k * k * F32)
        y = net.elem("batch_norm", [c], B * cout * hw * hw * F32, weight=2 * cout * F32)
        return net.inplace("relu_", [y]) if relu else y

    x = net.input("images", B * 3 * img * img * F32)
    hw = img // 2
    x = conv_bn(x, 3, width, 7, hw, "conv7x7_stem")
    hw //= 2
    # max_pool2d_with_indices keeps an int64 index per output element for its backward
    x = net.elem("max_pool", [x], B * width * hw * hw * F32, saved=2 * B * width * hw * hw * F32)
    cin = width
    for stage, blocks in enumerate(p["blocks"]):
        mid = width * 2 ** stage
        for i in range(blocks):
            net.next_layer()
            stride = 2 if (i == 0 and stage > 0) else 1
            y = conv_bn(x, cin, mid, 1, hw, "conv1x1_reduce")
            hw_out = hw // stride
            y = conv_bn(y, mid, mid, 3, hw_out, "conv3x3")
            y = conv_bn(y, mid, 4 * mid, 1, hw_out, "conv1x1_expand", relu=False)
            shortcut = conv_bn(x, cin, 4 * mid, 1, hw_out, "conv1x1_shortcut", relu=False) if i == 0 else x
            y = net.inplace("add_", [y, shortcut], keeps=False)
            x = net.inplace("relu_", [y])
            cin, hw = 4 * mid, hw_out
    net.next_layer()
    x = net.elem("avg_pool", [x], B * cin * F32)
    x = net.gemm("gemm_classifier", [x], B * classes * F32, 2 * B * cin * classes,
                 weight=(cin * classes + classes) * F32)
    net.elem("cross_entropy_loss", [x], B * classes * F32)
    return net


def unet_net(p: dict) -> Net:
    """A latent-diffusion U-Net as diffusers' UNet2DConditionModel builds it (Stable Diffusion
    1.5): ``conv_in``; per level of ``channels``, ``layers`` ResNet blocks (GroupNorm, SiLU,
    3x3 conv, the timestep embedding projected and added, GroupNorm, SiLU, 3x3 conv, a 1x1
    shortcut where the width changes, residual add), each followed by a spatial transformer
    where ``attention_levels`` says so (GroupNorm, 1x1 proj_in, self-attention, cross-attention over
    the ``context_len`` x ``context_dim`` text embedding, GEGLU feed-forward, 1x1 proj_out,
    residual), and a stride-2 3x3 conv down to the next level; a middle ResNet-transformer-
    ResNet; the decoder mirrors it with ``layers + 1`` ResNet blocks per level and nearest
    upsampling + 3x3 conv between levels; GroupNorm, SiLU, ``conv_out``, and the MSE against
    the noise. The timestep is embedded by a sinusoid and a two-layer MLP (4 x channels[0]).

    Skip connections: the output of conv_in, of every encoder block and of every downsample is
    kept until the decoder block that concatenates it (``torch.cat([x, skip], dim=1)``), so
    those activations live from early in the forward to late in it and their gradients, first
    written by the decoder's concatenation backward at the start of the backward pass, live
    until the encoder's backward at its end.

    Simplified: the VAE and the CLIP text encoder are frozen and run outside the step (their
    outputs, the latents, the noise and the text embedding, come in as inputs, as with
    precomputed embeddings); attention is the fused kernel (xformers / SDPA, as diffusers'
    training scripts enable); dropout is 0 (SD 1.5's); GroupNorm and LayerNorm save only their
    input; the (input + h) / 1 of a ResNet block is one add; the layout copies around the
    transformer (NCHW to tokens and back) are not separate kernels."""
    B, hw, cin0, heads = p["batch"], p["image"], p["in_channels"], p["heads"]
    chans, attn, L = list(p["channels"]), list(p["attention_levels"]), p["layers"]
    ctx_len, ctx_dim = p["context_len"], p["context_dim"]
    for key in ("batch", "image", "in_channels", "heads", "layers", "context_len", "context_dim"):
        at_least(p, key, 1)
    check(len(chans) >= 1 and min(chans) >= 1 and len(attn) == len(chans),
          "channels needs one width per level and attention_levels one flag per level")
    check(hw % 2 ** (len(chans) - 1) == 0, f"image must halve {len(chans) - 1} times (got {hw})")
    dtype, e = precision_of(p)
    net = Net(act=e, dtype=dtype)
    tdim = 4 * chans[0]

    def size(c: int, side: int) -> int:
        return B * c * side * side * e

    def conv(name: str, x: int, ci: int, co: int, side: int, k: int) -> int:
        """A k x k convolution with bias producing ``co`` channels at ``side`` x ``side``."""
        return net.gemm(name, [x], size(co, side), 2 * B * side * side * ci * co * k * k,
                        weight=(ci * co * k * k + co) * F32)

    def linear(name: str, x: int, tokens: int, ci: int, co: int, with_bias: bool = True) -> int:
        return net.gemm(name, [x], tokens * co * e, 2 * tokens * ci * co,
                        weight=(ci * co + (co if with_bias else 0)) * F32)

    def resnet(x: int, ci: int, co: int, side: int) -> int:
        net.next_layer()
        y = net.elem("group_norm", [x], size(ci, side), weight=2 * ci * F32)
        y = net.elem("silu", [y], size(ci, side))
        y = conv("conv3x3", y, ci, co, side, 3)
        t = net.elem("silu", [temb], B * tdim * e)
        t = linear("gemm_time_emb_proj", t, B, tdim, co)
        y = net.pure("add_time_emb", [y, t], size(co, side))
        y = net.elem("group_norm", [y], size(co, side), weight=2 * co * F32)
        y = net.elem("silu", [y], size(co, side))
        y = conv("conv3x3", y, co, co, side, 3)
        short = conv("conv1x1_shortcut", x, ci, co, side, 1) if ci != co else x
        return net.pure("add_residual", [y, short], size(co, side))

    def transformer(x: int, c: int, side: int) -> int:
        net.next_layer()
        n = side * side
        T = B * n
        y = net.elem("group_norm", [x], size(c, side), weight=2 * c * F32)
        y = conv("conv1x1_proj_in", y, c, c, side, 1)
        r = y
        y = net.elem("layer_norm", [r], T * c * e, weight=2 * c * F32)
        y = linear("gemm_qkv", y, T, c, 3 * c, with_bias=False)
        y = net.gemm("flash_attention", [y], T * c * e, 4 * B * n * n * c, saved=B * heads * n * F32, backward=2.5)
        y = linear("gemm_attn_out", y, T, c, c)
        r = net.pure("add_residual", [y, r], T * c * e)
        y = net.elem("layer_norm", [r], T * c * e, weight=2 * c * F32)
        q = linear("gemm_cross_q", y, T, c, c, with_bias=False)
        kv = linear("gemm_cross_kv", context, B * ctx_len, ctx_dim, 2 * c, with_bias=False)
        # two inputs: each one's backward recomputes half of the 2.5 x
        y = net.gemm("flash_attention_cross", [q, kv], T * c * e, 4 * B * n * ctx_len * c,
                     saved=B * heads * n * F32, backward=1.25)
        y = linear("gemm_attn_out", y, T, c, c)
        r = net.pure("add_residual", [y, r], T * c * e)
        y = net.elem("layer_norm", [r], T * c * e, weight=2 * c * F32)
        y = linear("gemm_geglu_proj", y, T, c, 8 * c)
        # hidden * gelu(gate): keeps the projection (both halves) and gelu(gate)
        y = net.elem("geglu", [y], T * 4 * c * e, saved=T * 4 * c * e)
        y = linear("gemm_ff_out", y, T, 4 * c, c)
        r = net.pure("add_residual", [y, r], T * c * e)
        y = conv("conv1x1_proj_out", r, c, c, side, 1)
        return net.pure("add_residual", [y, x], size(c, side))

    latents = net.input("noisy_latents", size(cin0, hw) // e * F32)
    noise = net.input("noise", size(cin0, hw) // e * F32)
    timesteps = net.input("timesteps", B * INDEX_BYTES)
    context = net.input("text_embedding", B * ctx_len * ctx_dim * e)
    t = net.elem("timestep_sinusoid", [timesteps], B * chans[0] * F32)
    t = linear("gemm_time_linear_1", t, B, chans[0], tdim)
    t = net.elem("silu", [t], B * tdim * e)
    temb = linear("gemm_time_linear_2", t, B, tdim, tdim)

    x = conv("conv_in", latents, cin0, chans[0], hw, 3)
    skips: list[tuple[int, int]] = [(x, chans[0])]
    c = chans[0]
    for level, width in enumerate(chans):
        for _ in range(L):
            x = resnet(x, c, width, hw)
            c = width
            if attn[level]:
                x = transformer(x, c, hw)
            skips.append((x, c))
        if level < len(chans) - 1:
            net.next_layer()
            x = net.gemm("conv3x3_downsample", [x], size(c, hw // 2), 2 * B * (hw // 2) ** 2 * c * c * 9,
                         weight=(c * c * 9 + c) * F32)
            hw //= 2
            skips.append((x, c))
    x = resnet(x, c, c, hw)
    x = transformer(x, c, hw)
    x = resnet(x, c, c, hw)
    for level in range(len(chans) - 1, -1, -1):
        width = chans[level]
        for _ in range(L + 1):
            skip, sc = skips.pop()
            x = net.pure("concat_skip", [x, skip], size(c + sc, hw))
            x = resnet(x, c + sc, width, hw)
            c = width
            if attn[level]:
                x = transformer(x, c, hw)
        if level > 0:
            net.next_layer()
            x = net.pure("upsample_nearest", [x], size(c, 2 * hw))
            hw *= 2
            x = conv("conv3x3_upsample", x, c, c, hw, 3)
    net.next_layer()
    x = net.elem("group_norm", [x], size(c, hw), weight=2 * c * F32)
    x = net.elem("silu", [x], size(c, hw))
    x = conv("conv_out", x, c, cin0, hw, 3)
    net.elem("mse_loss", [x, noise], B * F32)
    return net


NETS: dict[str, Callable[[dict], Net]] = {"transformer": transformer_net, "resnet": resnet_net, "unet": unet_net}


# -- one iteration's program -----------------------------------------------------------------
class Space(enum.Enum):
    """Where a tensor a step touches lives."""

    W = "weights"
    G = "grads"
    M = "optimizer_state_1"   # Adam's m, SGD's momentum buffer
    V = "optimizer_state_2"   # Adam's v
    A = "activation"          # forward output, saved for backward (transient)
    D = "activation_grad"     # gradient of an activation (transient)
    S = "sparse_grad"         # sparse embedding gradient values (transient)
    X = "saved_for_backward"  # an op's saved intermediates besides its output (transient)
    H = "host_staging"        # pinned host buffer the data loader fills
    C = "weight_half"         # mixed precision: a GEMM weight's half copy, cast every forward (transient)
    Q = "weight_grad_half"    # mixed precision: its half gradient, before the cast back to fp32 (transient)


TRANSIENT = (Space.A, Space.D, Space.S, Space.X, Space.C, Space.Q)
PARAMETER = (Space.W, Space.G, Space.M, Space.V)


@dataclass(frozen=True)
class Ref:
    """A tensor (space, owning op); ``rows``: only the table rows looked up this iteration.
    An expert's parameters are named two ways: ``slot`` in the program (the tensors of the
    expert the router picks for that slot, which change per iteration) and ``expert`` in the
    layout (expert number ``expert``'s own tensors, which one slot binds to each iteration)."""

    space: Space
    op: int
    rows: bool = False
    slot: int = -1
    expert: int = -1


@dataclass(frozen=True)
class Step:
    type: OpType
    name: str
    op: int
    reads: tuple[Ref, ...] = ()
    writes: tuple[Ref, ...] = ()
    flops: float = 0.0


#: Optimizer -> state tensors per parameter (Adam: m and v; SGD with momentum: one buffer).
OPTIMIZERS: dict[str, tuple[Space, ...]] = {"adam": (Space.M, Space.V), "momentum": (Space.M,), "sgd": ()}


def owner(net: Net, i: int) -> int:
    """The op whose parameters op ``i`` uses (-1: none)."""
    op = net.ops[i]
    return i if op.weight > 0 else op.shares


def dense_grad(op: NetOp) -> bool:
    return op.weight > 0 and not (op.kind is OpKind.GATHER and op.sparse)


def slots(net: Net, i: int) -> range:
    """The slots whose tensors stand for owner ``i``'s parameters: its router's ``top_k``
    choices for an expert's weight, the one tensor (slot -1) otherwise."""
    op = net.ops[i]
    return range(net.ops[op.router].top_k) if op.router >= 0 else range(-1, 0)


def trace(net: Net, optimizer: str) -> list[Step]:
    """One training iteration, in program order. An in-place op's activation is its first
    input's tensor (followed to the op that allocated it); its gradient is its own.

    An expert op names its parameters by slot (:class:`Ref`), so the program is the same every
    iteration while the tensors behind the slots change with the routing; the optimizer step
    of a layer takes only the slots' tensors, as PyTorch's Adam skips parameters whose .grad is
    None. Under mixed precision (``net.act`` < 4) a GEMM reads a half copy of its weight, cast
    from the fp32 weight just before its first use in the forward (autocast casts each weight
    once per forward) and kept until its dgrad; its wgrad writes a half gradient that a cast
    kernel turns into the fp32 .grad (ToCopyBackward), which the optimizer reads."""
    ops = net.ops
    half = net.act < F32
    steps: list[Step] = []
    root = list(range(len(ops)))
    for i, op in enumerate(ops):
        if op.inplace:
            root[i] = root[op.inputs[0]]

    def act(j: int) -> Ref:
        return Ref(Space.A, root[j])

    def param(space: Space, j: int) -> Ref:
        """The tensor in ``space`` of the parameters op ``j`` uses (its slot's, for an expert)."""
        return Ref(space, owner(net, j), slot=ops[j].slot)

    for i, op in enumerate(ops):
        if op.kind is OpKind.INPUT:
            steps.append(Step(OpType.HOST_WRITE, "load_batch", i, writes=(Ref(Space.H, i),)))
            steps.append(Step(OpType.COPY, "copy_batch", i, reads=(Ref(Space.H, i),), writes=(Ref(Space.A, i),)))
    cast: set[Ref] = set()
    for i, op in enumerate(ops):
        if op.kind is OpKind.INPUT:
            continue
        reads = tuple(act(j) for j in op.inputs)
        w = owner(net, i)
        if op.kind is OpKind.GATHER:
            reads += (Ref(Space.W, i, rows=True),)
        elif w >= 0 and half and op.kind is OpKind.GEMM:
            copy = param(Space.C, i)
            if copy not in cast:
                cast.add(copy)
                steps.append(Step(OpType.KERNEL, f"cast_to_{net.dtype}", i, (param(Space.W, i),), (copy,)))
            reads = (copy,) + reads
        elif w >= 0:
            reads = (param(Space.W, i),) + reads
        saved = (Ref(Space.X, i),) if op.saved > 0 else ()
        steps.append(Step(OpType.KERNEL, op.name, i, reads, (act(i),) + saved, op.flops))

    consumed = {j for op in ops for j in op.inputs}
    born: set[int] = set()  # activations whose gradient exists already (later writers accumulate)

    def grad_of(j: int) -> tuple[tuple[Ref, ...], Ref]:
        acc = (Ref(Space.D, j),) if j in born else ()
        born.add(j)
        return acc, Ref(Space.D, j)

    for i in range(len(ops) - 1, -1, -1):
        op = ops[i]
        if op.kind is OpKind.INPUT:
            continue
        gout = (Ref(Space.D, i),) if i in consumed else ()
        targets = [j for j in op.inputs if ops[j].kind is not OpKind.INPUT]
        w = owner(net, i)
        if op.kind is OpKind.GATHER:
            dst = Ref(Space.S, i) if op.sparse else Ref(Space.G, i, rows=True)
            steps.append(Step(OpType.KERNEL, f"{op.name}_backward", i, gout + (act(op.inputs[0]),), (dst,)))
        elif op.kind is OpKind.GEMM and w >= 0:
            if targets:
                acc, d = grad_of(targets[0])
                weight = param(Space.C if half else Space.W, i)
                steps.append(Step(OpType.KERNEL, f"{op.name}_dgrad", i, gout + (weight,) + acc, (d,), op.flops))
            grad = param(Space.Q if half else Space.G, i)
            steps.append(Step(OpType.KERNEL, f"{op.name}_wgrad", i, gout + (act(op.inputs[0]),), (grad,), op.flops))
            if half:
                steps.append(Step(OpType.KERNEL, "cast_to_fp32", i, (grad,), (param(Space.G, i),)))
        elif op.kind is OpKind.GEMM:
            saved = (Ref(Space.X, i),) if op.saved > 0 else ()
            for k, j in enumerate(targets):
                others = tuple(act(o) for o in op.inputs if o != j) or (act(j),)
                acc, d = grad_of(j)
                steps.append(Step(OpType.KERNEL, f"{op.name}_backward{k}", i, gout + others + saved + acc, (d,),
                                  op.flops * op.backward))
        else:
            reads = gout + (tuple(act(j) for j in op.inputs) if op.keeps else ())
            reads += (param(Space.W, i),) if w >= 0 else ()
            reads += (Ref(Space.X, i),) if op.saved > 0 else ()
            writes: tuple[Ref, ...] = ()
            for j in targets:
                acc, d = grad_of(j)
                reads += acc
                writes += (d,)
            writes += (param(Space.G, i),) if w >= 0 else ()
            steps.append(Step(OpType.KERNEL, f"{op.name}_backward", i, reads, writes))

    states = OPTIMIZERS[optimizer]
    by_layer: dict[int, list[int]] = defaultdict(list)
    for i, op in enumerate(ops):
        if op.weight > 0:
            by_layer[op.layer].append(i)
    for layer in sorted(by_layer):
        dense = [i for i in by_layer[layer] if dense_grad(ops[i])]
        if dense:
            reads = tuple(Ref(s, i, slot=k) for i in dense for k in slots(net, i) for s in (Space.W, Space.G) + states)
            writes = tuple(Ref(s, i, slot=k) for i in dense for k in slots(net, i) for s in (Space.W,) + states)
            steps.append(Step(OpType.KERNEL, f"{optimizer}_step", dense[0], reads, writes))
        for i in by_layer[layer]:
            if not dense_grad(ops[i]):
                steps.append(Step(OpType.KERNEL, "sparse_sgd_step", i, (Ref(Space.S, i), Ref(Space.W, i, rows=True)),
                                  (Ref(Space.W, i, rows=True),)))
    steps.append(Step(OpType.SYNC, "synchronize", -1))
    return steps


def natural_bytes(net: Net, ref: Ref) -> float:
    """Full-size bytes of a tensor (or of the rows a lookup touches)."""
    op = net.ops[ref.op]
    if ref.rows or ref.space is Space.S:
        return float(op.lookups * op.row_bytes)
    if ref.space in (Space.W, Space.G, Space.M, Space.V):
        return op.weight
    if ref.space in (Space.C, Space.Q):
        return op.weight * net.act / F32
    if ref.space is Space.X:
        return op.saved
    return op.out


def lifetimes(steps: list[Step]) -> dict[Ref, tuple[int, int]]:
    """First and last step touching each transient tensor: the allocator hands its block out
    before the first and takes it back after the last (where PyTorch frees it)."""
    span: dict[Ref, tuple[int, int]] = {}
    for k, st in enumerate(steps):
        for r in st.reads + st.writes:
            if r.space in TRANSIENT:
                span[r] = (span[r][0], k) if r in span else (k, k)
    return span


def births_and_deaths(steps: list[Step]) -> tuple[dict[int, list[Ref]], dict[int, list[Ref]]]:
    """Transient tensors handed out before step k, and taken back after it."""
    born: dict[int, list[Ref]] = defaultdict(list)
    dies: dict[int, list[Ref]] = defaultdict(list)
    for r, (first, last) in lifetimes(steps).items():
        born[first].append(r)
        dies[last].append(r)
    return born, dies


def plan_pool(steps: list[Step], sizes: dict[Ref, float]) -> tuple[dict[Ref, int], list[float]]:
    """A caching allocator's steady state: best-fit reuse of free blocks (at most twice the
    request, standing in for PyTorch's block splitting), a new block otherwise. Replays the
    iteration on the blocks the previous one left until no block is added, so the returned
    assignment is the one every iteration after warm-up repeats."""
    born, dies = births_and_deaths(steps)
    blocks: list[float] = []
    for _ in range(16):
        n_blocks = len(blocks)
        free = sorted((size, bid) for bid, size in enumerate(blocks))
        assign: dict[Ref, int] = {}
        for k in range(len(steps)):
            for r in born[k]:
                need = sizes[r]
                pos = bisect.bisect_left(free, (need, -1))
                if pos < len(free) and free[pos][0] <= 2 * need:
                    assign[r] = free.pop(pos)[1]
                else:
                    assign[r] = len(blocks)
                    blocks.append(need)
            for r in dies[k]:
                bisect.insort(free, (blocks[assign[r]], assign[r]))
        if len(blocks) == n_blocks:
            return assign, blocks
    raise AssertionError("caching allocator plan did not reach a steady state")


# -- emitting the program ----------------------------------------------------------------------
@dataclass
class Layout:
    """Where every tensor of one job lives after scaling."""

    scale: float
    tensors: dict[Ref, Buffer]      # persistent tensors, host staging, and transient tensors
    blocks: dict[Ref, Buffer]       # transient tensor -> its allocator block (what MEM ops name)
    footprint: dict[str, int]       # managed bytes per space


def layout(b: WorkloadBuilder, net: Net, steps: list[Step], optimizer: str, footprint: int | None, *,
           pid: int, gpu: int) -> Layout:
    """Scale the model to ``footprint`` managed bytes (None: keep its real size) and allocate it:
    weights (host-initialised, loaded by the script), gradients and optimizer state (zero-filled
    on first touch), one segment of allocator blocks for the transient tensors, and pinned host
    staging buffers."""
    ops = net.ops
    owners = [i for i, op in enumerate(ops) if op.weight > 0]
    persistent: list[Ref] = [r for i in owners for r in physical(net, Space.W, i, owners)]
    persistent += [r for i in owners if dense_grad(ops[i]) for r in physical(net, Space.G, i, owners)]
    for s in OPTIMIZERS[optimizer]:
        persistent += [r for i in owners if dense_grad(ops[i]) for r in physical(net, s, i, owners)]
    transient = sorted(lifetimes(steps), key=lambda r: (r.space.value, r.op))
    sizes = {r: natural_bytes(net, r) for r in transient}
    assign, block_sizes = plan_pool(steps, sizes)
    natural = [natural_bytes(net, r) for r in persistent] + block_sizes
    scale = 1.0 if footprint is None else fit_scale(natural, footprint)

    tensors: dict[Ref, Buffer] = {}
    fp: dict[str, int] = {}
    for space, init in ((Space.W, Init.HOST), (Space.G, Init.UNTOUCHED), (Space.M, Init.UNTOUCHED),
                        (Space.V, Init.UNTOUCHED)):
        refs = [r for r in persistent if r.space is space]
        if refs:
            pages = to_pages([natural_bytes(net, r) for r in refs], scale)
            tensors.update(zip(refs, carve(b, space.value, pages, init=init, pid=pid, gpu=gpu)))
            fp[space.value] = int(pages.sum()) * PAGE_SIZE
    block_pages = to_pages(block_sizes, scale)
    pool = carve(b, "allocator_blocks", block_pages, pid=pid, gpu=gpu)
    fp["allocator_blocks"] = int(block_pages.sum()) * PAGE_SIZE
    blocks = {r: pool[assign[r]] for r in transient}
    for r in transient:
        tensors[r] = blocks[r].slice(0, int(to_pages(sizes[r], scale)) * PAGE_SIZE)
    # Routing is per iteration and never part of the steady-state allocator plan: an expert's
    # activations are its slot's, the same blocks whichever expert fills the slot.
    for i, op in enumerate(ops):
        if op.kind is OpKind.INPUT:
            tensors[Ref(Space.H, i)] = b.alloc(f"staging_{op.name}", int(to_pages(op.out, scale)) * PAGE_SIZE,
                                               managed=False, gpu=-1, pid=pid, emit=True)
    return Layout(scale, tensors, blocks, fp)


def physical(net: Net, space: Space, i: int, owners: list[int]) -> list[Ref]:
    """The tensors behind owner ``i``'s parameters in ``space``, in the order a model's
    modules allocate them: one for a plain weight; for the first expert op of a router, every
    expert's tensors of all that router's expert ops, expert by expert (Mixtral's ``experts``
    ModuleList: expert 0's w1, w2, w3, then expert 1's); none for its other expert ops."""
    op = net.ops[i]
    if op.router < 0:
        return [Ref(space, i)]
    group = [j for j in owners if net.ops[j].router == op.router]
    if i != group[0]:
        return []
    return [Ref(space, j, expert=e) for e in range(net.ops[op.router].experts) for j in group]


def route(rng: np.random.Generator, popularity: np.ndarray, k: int, skew: float) -> np.ndarray:
    """One iteration's choice of ``k`` distinct experts for a router: drawn without
    replacement with P(rank r) ~ (r+1)^-skew over the experts ranked by ``popularity`` (a
    permutation of the experts, fixed per layer: which experts are hot differs by layer);
    ``skew`` 0 is uniform, a large one picks the same few experts every iteration."""
    n = len(popularity)
    p = np.power(np.arange(1, n + 1, dtype=np.float64), -float(skew))
    return popularity[rng.choice(n, size=k, replace=False, p=p / p.sum())]


def lookup_pages(rng: np.random.Generator, op: NetOp, table: Buffer, scale: float, alpha: float) -> np.ndarray:
    """Pages of the table rows one iteration looks up: ``lookups`` draws of Zipf-popular rows
    (word frequencies, categorical feature values), new draws every iteration."""
    rows = max(1, table.nbytes // op.row_bytes)
    count = max(1, int(round(op.lookups * scale)))
    lo = spread(zipf_ranks(rng, rows, count, alpha), rows, salt=rows) * op.row_bytes
    return first_touch(byte_pages(first_page(table), lo, lo + op.row_bytes))


def job(b: WorkloadBuilder, params: dict, net: Net, *, footprint: int | None, pid: int = 0, gpu: int = 0,
        meta: dict | None = None) -> Iterator[Tick]:
    """Emit ``params['iterations']`` training iterations of ``net`` into ``b``, one operation per
    tick (the multi-tenant generator interleaves several jobs this way). ``meta`` receives the
    scaled layout (footprint per space, scale factor, kernels per iteration)."""
    optimizer = choice(params, "optimizer", tuple(OPTIMIZERS))
    at_least(params, "host_gbps", 1e-3)
    costs = CostModel.from_params(params)
    if net.act < F32:
        # GEMMs at the half-precision (tensor core) rate; elementwise kernels move half the bytes
        costs = CostModel.from_params({"peak_tflops": params["peak_tflops_half"], "hbm_gbps": params["hbm_gbps"]})
    steps = trace(net, optimizer)
    lay = layout(b, net, steps, optimizer, footprint, pid=pid, gpu=gpu)
    if meta is not None:
        meta.update(footprint=lay.footprint, scale=float(lay.scale), param_count=net.param_count,
                    kernels_per_iteration=sum(st.type is OpType.KERNEL for st in steps))
    born, dies = births_and_deaths(steps)
    static = {r: buf.page_range() for r, buf in lay.tensors.items()}   # ranges: nothing listed
    durations: list[int] = []
    launches: list[tuple[tuple, tuple[int, int, int]]] = []
    routed: list[int] = []   # steps touching an expert's parameters: their tensors change per iteration
    for k, st in enumerate(steps):
        nbytes = sum(natural_bytes(net, r) for r in st.reads + st.writes)
        if st.type is OpType.HOST_WRITE:
            durations.append(int(nbytes / params["host_gbps"] * lay.scale))
        elif st.type is OpType.KERNEL:
            durations.append(max(1, int(costs.ns(st.flops, nbytes) * lay.scale)))
        else:
            durations.append(0)
        # Launch identity: the op, the tensors' addresses (the same every iteration), and a
        # grid covering the full-size output, as cuBLAS (128x128 tiles) or a 1-D kernel would.
        gemm = st.op >= 0 and net.ops[st.op].kind is OpKind.GEMM
        out_elements = sum(natural_bytes(net, r) for r in st.writes) / net.act
        if any(r.slot >= 0 and r.space in PARAMETER for r in st.reads + st.writes):
            routed.append(k)
            args: tuple = (st.op,)   # completed per iteration with the routed experts' addresses
        else:
            args = (st.op,) + tuple(lay.tensors[Ref(r.space, r.op, slot=r.slot)].addr for r in st.reads + st.writes)
        launches.append((args, grid_for(out_elements, 16384 if gemm else 1024)))

    # Routing: its own random stream, so the embedding lookups are the same with or without it.
    routers = [i for i, op in enumerate(net.ops) if op.top_k > 0]
    if routers:
        skew = float(params.get("skew", 0.0))
        check(skew >= 0, f"skew must be at least 0 (got {skew})")
        route_rng = np.random.default_rng([params["seed"], 0x6D6F65])
        popularity = {i: route_rng.permutation(net.ops[i].experts) for i in routers}
        bound = sorted({r for k in routed for r in steps[k].reads + steps[k].writes if r.slot >= 0 and
                        r.space in PARAMETER}, key=lambda r: (r.space.value, r.op, r.slot))
        if meta is not None:
            meta["routing"] = []
    gathers = [i for i, op in enumerate(net.ops) if op.kind is OpKind.GATHER]
    rng = np.random.default_rng(params["seed"])
    for it in range(params["iterations"]):
        pages = dict(static)
        if routers:
            chosen = {i: route(route_rng, popularity[i], net.ops[i].top_k, skew) for i in routers}
            if meta is not None:
                meta["routing"].append([chosen[i].tolist() for i in routers])
            where: dict[Ref, Buffer] = {}
            for r in bound:
                expert = int(chosen[net.ops[r.op].router][r.slot])
                where[r] = lay.tensors[Ref(r.space, r.op, expert=expert)]
                pages[r] = static[Ref(r.space, r.op, expert=expert)]
            for k in routed:
                st = steps[k]
                args = (st.op,) + tuple((where[r] if r in where else lay.tensors[Ref(r.space, r.op, slot=r.slot)]).addr
                                        for r in st.reads + st.writes)
                launches[k] = (args, launches[k][1])
        for i in gathers:
            table = lay.tensors[Ref(Space.W, i)]
            rows = lookup_pages(rng, net.ops[i], table, lay.scale, params["zipf"])
            pages[Ref(Space.W, i, rows=True)] = rows
            if dense_grad(net.ops[i]):
                pages[Ref(Space.G, i, rows=True)] = rows - first_page(table) + first_page(lay.tensors[Ref(Space.G, i)])
        for k, st in enumerate(steps):
            b.iteration = it
            for r in born[k]:
                b.mem(AllocOp.BLOCK_ACTIVE, lay.blocks[r])
            if st.type is OpType.KERNEL:
                parts = [(pages[r], False) for r in st.reads] + [(pages[r], True) for r in st.writes]
                args, grid = launches[k]
                b.kernel(st.name, pages=parts, compute_ns=durations[k], gpu=gpu, pid=pid, args=args, grid=grid,
                         block=(256, 1, 1))
            elif st.type is OpType.HOST_WRITE:
                b.host_write(lay.tensors[st.writes[0]], durations[k], pid=pid)
            elif st.type is OpType.COPY:
                b.copy(lay.tensors[st.reads[0]], lay.tensors[st.writes[0]], kind=CopyKind.H2D, is_async=True,
                       gpu=gpu, pid=pid)
            else:
                b.sync(gpu, pid=pid)
            for r in dies[k]:
                b.mem(AllocOp.BLOCK_INACTIVE, lay.blocks[r])
            yield durations[k]


def training_job(b: WorkloadBuilder, params: dict, *, footprint: int, pid: int = 0, gpu: int = 0,
                 meta: dict | None = None) -> Iterator[Tick]:
    """A tenant job running this family's model (see :func:`job`)."""
    net = NETS[choice(params, "arch", tuple(NETS))](params)
    return job(b, params, net, footprint=footprint, pid=pid, gpu=gpu, meta=meta)


def single_gpu(params: dict, make_job: Callable[..., Iterator[Tick]]) -> Workload:
    """A one-GPU workload from a job sized to ``oversub x gpu_mem`` (``scale = "fit"``) or at the
    model's real size (``scale = "full"``)."""
    check_common(params)
    full = choice({"scale": params.get("scale", "fit")}, "scale", ("fit", "full")) == "full"
    b = WorkloadBuilder("scenario", gpu_mem=params["gpu_mem"])
    meta: dict = {}
    drain(make_job(b, params, footprint=None if full else int(params["oversub"] * params["gpu_mem"]), meta=meta))
    w = b.build(meta=meta)
    w.meta["footprint_oversub"] = w.managed_bytes / params["gpu_mem"]
    return w


def generate(params: dict) -> Workload:
    """The ``dnn`` family: one model's training loop on one GPU."""
    return single_gpu(params, training_job)
