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

    @property
    def row_bytes(self) -> int:
        return int(self.weight // self.rows)


@dataclass
class Net:
    """A model in forward order. Layer numbers group parameters for the optimizer step."""

    ops: list[NetOp] = field(default_factory=list)
    layer: int = 0

    def add(self, name: str, kind: OpKind, out: float, inputs: tuple[int, ...] | list[int] = (), **kw) -> int:
        self.ops.append(NetOp(name, kind, self.layer, float(out), tuple(inputs), **kw))
        return len(self.ops) - 1

    def input(self, name: str, nbytes: float) -> int:
        return self.add(name, OpKind.INPUT, nbytes)

    def gemm(self, name: str, inputs: list[int], out: float, flops: float, weight: float = 0.0,
             shares: int = -1) -> int:
        return self.add(name, OpKind.GEMM, out, inputs, weight=float(weight), shares=shares, flops=float(flops))

    def elem(self, name: str, inputs: list[int], out: float, weight: float = 0.0, saved: float = 0.0) -> int:
        return self.add(name, OpKind.ELEM, out, inputs, weight=float(weight), saved=float(saved))

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

    @property
    def param_count(self) -> int:
        return int(sum(op.weight for op in self.ops) // F32)


# -- model shapes ----------------------------------------------------------------------------
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
    BERT's fused ``gelu`` keeps only its input."""
    b, s, h, a, L, V = p["batch"], p["seq_len"], p["hidden"], p["heads"], p["layers"], p["vocab"]
    head = choice(p, "head", ("lm", "mlm"))
    kinds = {"gelu": p.get("gelu", "gelu"), "dropout": p.get("dropout", True)}
    gelu_saved = {"gelu": 0.0, "gelu_new": 3.0}[choice(kinds, "gelu", ("gelu", "gelu_new"))]
    mask = 0.25 if kinds["dropout"] else 0.0   # bool mask per fp32 element
    for key in ("batch", "seq_len", "hidden", "heads", "layers", "vocab"):
        at_least(p, key, 1)
    T = b * s
    act = T * h * F32
    net = Net()
    tokens = net.input("input_ids", T * INDEX_BYTES)
    emb = net.gather("embedding_lookup", tokens, rows=V, row_bytes=h * F32, lookups=T, out=act)
    x = net.elem("add_position_embedding", [emb], act, weight=s * h * F32, saved=mask * act)
    for _ in range(L):
        net.next_layer()
        ln1 = net.elem("layer_norm", [x], act, weight=2 * h * F32)
        qkv = net.gemm("gemm_qkv", [ln1], 3 * act, 2 * T * h * 3 * h, weight=(3 * h * h + 3 * h) * F32)
        scores = net.gemm("bgemm_attn_scores", [qkv], b * a * s * s * F32, 2 * b * s * s * h)
        probs = net.elem("softmax_dropout", [scores], b * a * s * s * F32, saved=mask * b * a * s * s * F32)
        ctx = net.gemm("bgemm_attn_context", [probs, qkv], act, 2 * b * s * s * h)
        proj = net.gemm("gemm_attn_proj", [ctx], act, 2 * T * h * h, weight=(h * h + h) * F32)
        r1 = net.elem("dropout_add_residual", [proj, x], act, saved=mask * act)
        ln2 = net.elem("layer_norm", [r1], act, weight=2 * h * F32)
        fc1 = net.gemm("gemm_mlp_fc1", [ln2], 4 * act, 8 * T * h * h, weight=(4 * h * h + 4 * h) * F32)
        gelu = net.elem("gelu", [fc1], 4 * act, saved=gelu_saved * 4 * act)
        fc2 = net.gemm("gemm_mlp_fc2", [gelu], act, 8 * T * h * h, weight=(4 * h * h + h) * F32)
        x = net.elem("dropout_add_residual", [fc2, r1], act, saved=mask * act)
    net.next_layer()
    x = net.elem("layer_norm", [x], act, weight=2 * h * F32)
    if head == "mlm":
        x = net.gemm("gemm_mlm_transform", [x], act, 2 * T * h * h, weight=(h * h + h) * F32)
        x = net.elem("gelu_layer_norm", [x], act, weight=2 * h * F32)
    logits = net.gemm("gemm_vocab_head", [x], T * V * F32, 2 * T * h * V, shares=emb)
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


NETS: dict[str, Callable[[dict], Net]] = {"transformer": transformer_net, "resnet": resnet_net}


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


TRANSIENT = (Space.A, Space.D, Space.S, Space.X)


@dataclass(frozen=True)
class Ref:
    """A tensor (space, owning op); ``rows``: only the table rows looked up this iteration."""

    space: Space
    op: int
    rows: bool = False


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


def trace(net: Net, optimizer: str) -> list[Step]:
    """One training iteration, in program order. An in-place op's activation is its first
    input's tensor (followed to the op that allocated it); its gradient is its own."""
    ops = net.ops
    steps: list[Step] = []
    root = list(range(len(ops)))
    for i, op in enumerate(ops):
        if op.inplace:
            root[i] = root[op.inputs[0]]

    def act(j: int) -> Ref:
        return Ref(Space.A, root[j])

    for i, op in enumerate(ops):
        if op.kind is OpKind.INPUT:
            steps.append(Step(OpType.HOST_WRITE, "load_batch", i, writes=(Ref(Space.H, i),)))
            steps.append(Step(OpType.COPY, "copy_batch", i, reads=(Ref(Space.H, i),), writes=(Ref(Space.A, i),)))
    for i, op in enumerate(ops):
        if op.kind is OpKind.INPUT:
            continue
        reads = tuple(act(j) for j in op.inputs)
        w = owner(net, i)
        if op.kind is OpKind.GATHER:
            reads += (Ref(Space.W, i, rows=True),)
        elif w >= 0:
            reads = (Ref(Space.W, w),) + reads
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
                steps.append(Step(OpType.KERNEL, f"{op.name}_dgrad", i, gout + (Ref(Space.W, w),) + acc, (d,),
                                  op.flops))
            steps.append(Step(OpType.KERNEL, f"{op.name}_wgrad", i, gout + (act(op.inputs[0]),),
                              (Ref(Space.G, w),), op.flops))
        elif op.kind is OpKind.GEMM:
            for k, j in enumerate(targets):
                others = tuple(act(o) for o in op.inputs if o != j) or (act(j),)
                acc, d = grad_of(j)
                steps.append(Step(OpType.KERNEL, f"{op.name}_backward{k}", i, gout + others + acc, (d,), op.flops))
        else:
            reads = gout + (tuple(act(j) for j in op.inputs) if op.keeps else ())
            reads += (Ref(Space.W, w),) if w >= 0 else ()
            reads += (Ref(Space.X, i),) if op.saved > 0 else ()
            writes: tuple[Ref, ...] = ()
            for j in targets:
                acc, d = grad_of(j)
                reads += acc
                writes += (d,)
            writes += (Ref(Space.G, w),) if w >= 0 else ()
            steps.append(Step(OpType.KERNEL, f"{op.name}_backward", i, reads, writes))

    states = OPTIMIZERS[optimizer]
    by_layer: dict[int, list[int]] = defaultdict(list)
    for i, op in enumerate(ops):
        if op.weight > 0:
            by_layer[op.layer].append(i)
    for layer in sorted(by_layer):
        dense = [i for i in by_layer[layer] if dense_grad(ops[i])]
        if dense:
            reads = tuple(Ref(s, i) for i in dense for s in (Space.W, Space.G) + states)
            writes = tuple(Ref(s, i) for i in dense for s in (Space.W,) + states)
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
    persistent: list[Ref] = [Ref(Space.W, i) for i in owners]
    persistent += [Ref(Space.G, i) for i in owners if dense_grad(ops[i])]
    for s in OPTIMIZERS[optimizer]:
        persistent += [Ref(s, i) for i in owners if dense_grad(ops[i])]
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
    for i, op in enumerate(ops):
        if op.kind is OpKind.INPUT:
            tensors[Ref(Space.H, i)] = b.alloc(f"staging_{op.name}", int(to_pages(op.out, scale)) * PAGE_SIZE,
                                               managed=False, gpu=-1, pid=pid, emit=True)
    return Layout(scale, tensors, blocks, fp)


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
    steps = trace(net, optimizer)
    lay = layout(b, net, steps, optimizer, footprint, pid=pid, gpu=gpu)
    if meta is not None:
        meta.update(footprint=lay.footprint, scale=float(lay.scale), param_count=net.param_count,
                    kernels_per_iteration=sum(st.type is OpType.KERNEL for st in steps))
    born, dies = births_and_deaths(steps)
    static = {r: buf.page_range() for r, buf in lay.tensors.items()}   # ranges: nothing listed
    durations: list[int] = []
    launches: list[tuple[tuple, tuple[int, int, int]]] = []
    for st in steps:
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
        out_elements = sum(natural_bytes(net, r) for r in st.writes) / F32
        args = (st.op,) + tuple(lay.tensors[Ref(r.space, r.op)].addr for r in st.reads + st.writes)
        launches.append((args, grid_for(out_elements, 16384 if gemm else 1024)))

    gathers = [i for i, op in enumerate(net.ops) if op.kind is OpKind.GATHER]
    rng = np.random.default_rng(params["seed"])
    for it in range(params["iterations"]):
        pages = dict(static)
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
