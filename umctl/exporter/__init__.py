"""``umctl exporter``: a Prometheus node exporter for CUDA Unified Memory.

A long-running agent (agent.py) attaches the UVM tools-API source to every process using
Unified Memory, folds its events into per-process totals (metrics.py) and serves them on
``/metrics``; controllers started by ``umctl attach/run --mode`` publish their command counts
through small state files (control_state.py) that the exporter reads. docs/guide/exporter.md has the
metric names, the deployment and the cardinality."""
