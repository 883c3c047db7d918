"""Scenario generators, one module per workload family. A scenario file's ``[family]
generator`` names one of :data:`GENERATORS`; each takes the resolved parameters and returns a
validated :class:`~umctl.workload.workload.Workload`, deterministic for a given ``seed``."""

from __future__ import annotations

from typing import Callable, Iterator

from ..workload import Workload
from . import dnn, embedding, graph, hum, multigpu, tenants
from .common import ParamError, Params, Tick

__all__ = ["GENERATORS", "JOBS", "ParamError", "Params"]

GENERATORS: dict[str, Callable[[dict], Workload]] = {
    "dnn": dnn.generate,
    "embedding": embedding.generate,
    "graph": graph.generate,
    "hum": hum.generate,
    "multigpu": multigpu.generate,
    "tenants": tenants.generate,
}

#: Generators whose programs can run as one tenant among several on a shared machine:
#: ``job(builder, params, footprint=, pid=, gpu=, meta=)`` emits into a shared builder.
JOBS: dict[str, Callable[..., Iterator[Tick]]] = {
    "dnn": dnn.training_job,
    "embedding": embedding.training_job,
    "graph": graph.graph_job,
}
