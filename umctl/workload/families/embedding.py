"""DLRM training (MLPerf's recommendation model; DeepUM §6, Table 2, batch 96K-224K on Criteo).

DeepUM reports that DLRM gains almost nothing from its correlation prefetching: "most of the
memory space is used to store embedding tables" and "its memory access pattern is irregular
because the embedding table lookups highly depend on the input data". This generator keeps
exactly that: 26 Criteo tables hold most of the footprint, every iteration looks up fresh
Zipf-popular rows (scattered pages, different every iteration), the sparse gradients update
only those rows (SGD, as DLRM's reference trains), and the small bottom/top MLPs around them
are regular. It reuses the DNN engine (:mod:`.dnn`) for everything but the model's shape.
"""

from __future__ import annotations

from typing import Iterator

from ..workload import Workload, WorkloadBuilder
from .common import Tick, at_least, check
from .dnn import F32, INDEX_BYTES, Net, job, single_gpu


def dlrm_net(p: dict) -> Net:
    """DLRM's dot-interaction architecture (Naumov et al.; the MLPerf reference): the dense
    features go through the bottom MLP, each sparse feature through its embedding table (one
    lookup per sample, as in Criteo), all 27 vectors are concatenated and their pairwise dot
    products (plus the dense vector) feed the top MLP and a sigmoid cross-entropy loss."""
    B, d, dense = p["batch"], p["emb_dim"], p["dense_features"]
    for key in ("batch", "emb_dim", "dense_features"):
        at_least(p, key, 1)
    check(len(p["table_rows"]) >= 1 and min(p["table_rows"]) >= 1, "table_rows must list positive row counts")
    check(len(p["top_mlp"]) >= 1, "top_mlp must list at least one layer width")
    net = Net()
    x = net.input("dense_features", B * dense * F32)
    indices = [net.input(f"sparse_indices_{t}", B * INDEX_BYTES) for t in range(len(p["table_rows"]))]

    def mlp(x: int, width: int, widths: list[int], name: str) -> int:
        for w in widths:
            net.next_layer()
            x = net.gemm(f"{name}_gemm", [x], B * w * F32, 2 * B * width * w, weight=(width * w + w) * F32)
            x = net.elem(f"{name}_relu", [x], B * w * F32)
            width = w
        return x

    bottom = mlp(x, dense, list(p["bottom_mlp"]) + [d], "bottom_mlp")
    vectors = [bottom]
    for rows, idx in zip(p["table_rows"], indices):
        net.next_layer()
        vectors.append(net.gather("embedding_bag", idx, rows=rows, row_bytes=d * F32, lookups=B, out=B * d * F32,
                                  sparse=True))
    n = len(vectors)
    stacked = net.elem("interaction_cat", vectors, B * n * d * F32)
    width = n * (n - 1) // 2 + d
    z = net.gemm("interaction_bmm", [stacked], B * width * F32, 2 * B * n * n * d)
    y = mlp(z, width, list(p["top_mlp"]), "top_mlp")
    net.elem("bce_loss", [y], B * F32)
    return net


def training_job(b: WorkloadBuilder, params: dict, *, footprint: int, pid: int = 0, gpu: int = 0,
                 meta: dict | None = None) -> Iterator[Tick]:
    """A tenant job training DLRM (see :func:`.dnn.job`)."""
    return job(b, params, dlrm_net(params), footprint=footprint, pid=pid, gpu=gpu, meta=meta)


def generate(params: dict) -> Workload:
    """The ``embedding`` family: DLRM's training loop on one GPU."""
    return single_gpu(params, training_job)
