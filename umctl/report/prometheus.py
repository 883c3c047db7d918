"""The exporter's state as Prometheus text: the ``prometheus`` reporter.

An adapter, not a second exporter: the metric families are
:class:`umctl.exporter.metrics.ExporterCollector`'s, rendered once in the text exposition
format (``generate_latest``), exactly what ``umctl exporter``'s ``/metrics`` serves for the
same state (without the exporter process's own ``process_*`` metrics, which describe the
serving process, not the state). For a node_exporter textfile collector, a test, or a one-off
snapshot.
"""

from __future__ import annotations

from ..exporter.metrics import ExporterCollector, ExporterState
from .base import Out, text_stream


class PrometheusReporter:
    """An :class:`~umctl.exporter.metrics.ExporterState` in the Prometheus text format."""

    name = "prometheus"
    to_file = False

    def render(self, result: ExporterState, out: Out) -> None:
        from prometheus_client import CollectorRegistry, generate_latest

        registry = CollectorRegistry(auto_describe=False)
        registry.register(ExporterCollector(result))
        stream = text_stream(out)
        stream.write(generate_latest(registry).decode())
        stream.flush()
