"""One interface for every output of a result: the :class:`Reporter` protocol and the table of
reporters by subject and name.

As memray's reporters do, an output format is an object with a ``render`` method, and a
command picks one by name and calls that one method, whatever the format: ``umctl replay
--json`` is ``get_reporter("replay", "json").render(report, out)``, the table is the same call
with ``"table"``, a figure with ``"png"`` and a path. The reporters are:

=============== =========================================== ===================================
subject         result                                      reporters
=============== =========================================== ===================================
``replay``      :class:`~umctl.results.ReplayReport`        table, json, png, timeline
``session``     :class:`~umctl.results.SessionSummary`      table, json
``trace-info``  :class:`~umctl.results.TraceInfo`           table, json
``trace``       :class:`~umctl.events.trace.Trace`          perfetto
``control``     :class:`~umctl.report.control.ControlReport` table, json
``exporter``    :class:`~umctl.exporter.metrics.ExporterState` prometheus
=============== =========================================== ===================================

A *stream* reporter (``to_file = False``) writes text to ``out``: a text stream, or a rich
Console (the CLI's, so a table is sized and coloured as the terminal allows). A *file*
reporter (``to_file = True``) writes the file named by ``out`` (a path) under exactly that
name, and an OSError is one UmctlError line naming it. ``render`` returns None, or for a file
reporter what it wrote when the caller has something to say about it (Perfetto: events and
tracks).

Reporters are imported only when asked for (a table must not load matplotlib).
"""

from __future__ import annotations

import importlib
import json
import os
from typing import IO, Any, Protocol, Union, runtime_checkable

#: Where a reporter writes: a text stream or rich Console (stream reporters), a path (file reporters).
Out = Union[IO[str], "os.PathLike[str]", str, Any]


@runtime_checkable
class Reporter(Protocol):
    """An output format of one kind of result."""

    #: what a command calls it (``--json`` picks "json", ``--png`` "png", the default "table")
    name: str
    #: True: ``out`` is a path, the reporter writes that file; False: ``out`` is a stream
    to_file: bool

    def render(self, result: Any, out: Out) -> Any:
        """Write ``result`` to ``out``."""
        ...


def text_stream(out: Out) -> IO[str]:
    """The text stream behind ``out``: a rich Console's file, or ``out`` itself."""
    return getattr(out, "file", out) if hasattr(out, "print") else out


class JsonReporter:
    """Any result (or list of results) with ``to_json()`` as JSON text: the ``schema`` key
    first, values as they are (numbers exactly as Python writes them), anything JSON cannot
    hold as its ``str`` (a trace header's odd values)."""

    name = "json"
    to_file = False

    def __init__(self, indent: int = 2):
        self.indent = indent

    def render(self, result: Any, out: Out) -> None:
        doc = [r.to_json() for r in result] if isinstance(result, (list, tuple)) else result.to_json()
        stream = text_stream(out)
        stream.write(json.dumps(doc, indent=self.indent, default=str) + "\n")
        stream.flush()


#: subject -> reporter name -> (module, class, constructor keywords)
REPORTERS: dict[str, dict[str, tuple[str, str, dict[str, Any]]]] = {
    "replay": {"table": ("umctl.report.table", "ReplayTableReporter", {}),
               "json": ("umctl.report.base", "JsonReporter", {}),
               "png": ("umctl.report.png", "ReplayPngReporter", {}),
               "timeline": ("umctl.report.png", "TimelinePngReporter", {})},
    "session": {"table": ("umctl.report.live", "SessionTextReporter", {}),
                "json": ("umctl.report.base", "JsonReporter", {"indent": 1})},
    "trace-info": {"table": ("umctl.report.trace_info", "TraceInfoTableReporter", {}),
                   "json": ("umctl.report.base", "JsonReporter", {})},
    "trace": {"perfetto": ("umctl.report.perfetto", "PerfettoReporter", {})},
    "control": {"table": ("umctl.report.control", "ControlTableReporter", {}),
                "json": ("umctl.report.control", "ControlJsonReporter", {})},
    "exporter": {"prometheus": ("umctl.report.prometheus", "PrometheusReporter", {})},
}


def reporter_names(subject: str) -> list[str]:
    """The reporters a subject has, by name."""
    return list(REPORTERS[subject])


def get_reporter(subject: str, name: str, **options: Any) -> Reporter:
    """The reporter ``name`` of ``subject`` (see the module's table), built with ``options``
    over its defaults (e.g. Perfetto's ``max_events``)."""
    try:
        module, cls, kw = REPORTERS[subject][name]
    except KeyError:
        known = ", ".join(f"{s}/{n}" for s, names in REPORTERS.items() for n in names)
        raise KeyError(f"no reporter {subject}/{name} (known: {known})") from None
    return getattr(importlib.import_module(module), cls)(**{**kw, **options})
