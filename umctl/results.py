"""What umctl's commands end with, as typed results with a versioned JSON form.

A result is a dataclass deriving from :class:`Result`. Its fields are its JSON keys, in
order, after a ``schema`` key naming the result and its version (``"umctl.replay-result/1"``):
``to_json()`` gives that object, ``from_json()`` reads it back, and ``json_schema()`` is the
JSON Schema (draft 2020-12) generated from the fields' types and ``doc`` texts.
``tools/gen_schemas.py`` writes those documents to ``docs/reference/schema/`` and checks, in
CI, that they are current (``--check``).

* :class:`ReplayResult`: one mode of ``umctl replay`` / ``umctl demo`` (``--json`` prints a
  list of them, one per mode).
* :class:`SessionSummary`: how a live session (``umctl attach / run / record``) ended; its
  ``summary`` is a :class:`LiveTotals` and ``source.control`` a :class:`ControlStats`.
* :class:`TraceInfo`: what ``umctl trace info`` says about a trace file.
* :class:`ControlAnalysis`: why a controlled run still faulted (``umctl trace control``).
* :class:`ReplayReport`: what the replay's reporters render (its results plus the context a
  table or a figure needs); it has no JSON form of its own.

Versioning. ``SCHEMA_VERSION`` is per result and is the only version a reader checks. Within
a version a field may be *added*, with a default (so it is optional in the schema and a
document without it still reads), and descriptions may change. Anything else -- removing or
renaming a field, changing its type, unit or meaning, making a field required -- is a new
version: bump ``SCHEMA_VERSION``; the old schema file stays beside the new one, and
``tools/gen_schemas.py`` refuses to overwrite a version's file with an incompatible change.
Readers ignore keys they do not know (a newer umctl of the same version may add some), so the
generated schemas leave ``additionalProperties`` open; :func:`closed_schema` closes them for
checking that a writer emits only declared keys.

This module depends on no other umctl module (it is data, not behaviour): the simulator, the
live session, the reporters and the CLI all import it, and it imports none of them.
"""

from __future__ import annotations

import copy
import dataclasses
import types
import typing
from dataclasses import MISSING, dataclass, field
from typing import Any, ClassVar, Union

#: draft of the generated JSON Schema documents
JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


class SchemaError(ValueError):
    """A document that is not the result asked for, or of another version of it."""


def doc(text: str, default: Any = MISSING, default_factory: Any = MISSING, *, omit_none: bool = False) -> Any:
    """A dataclass field with its description (the schema's ``description``); fields with a
    default are optional in the schema, so a field added within a version needs one.
    ``omit_none``: the key is left out of the JSON while the value is None (a field that only
    some runs have, so that the documents of the others stay as they were)."""
    kw: dict[str, Any] = {"metadata": {"doc": text, "omit_none": omit_none}}
    if default is not MISSING:
        kw["default"] = default
    if default_factory is not MISSING:
        kw["default_factory"] = default_factory
    return field(**kw)


def scaled_estimate(n: int, sample: float) -> int:
    """A count taken only while collecting, as a total: itself without sampling (``sample``
    >= 1), else over the measured on-time. One rule for every view of a sampled live total
    (:class:`umctl.live.stats.LiveStats` and :meth:`LiveTotals.counter`)."""
    return n if sample >= 1 else round(n / max(sample, 1e-6))


# ---------------------------------------------------------------------- the base
class Result:
    """Base of the typed results (always used with ``@dataclass``). Subclasses set
    ``SCHEMA_NAME`` (the document's kind, also its schema file's name) and ``SCHEMA_VERSION``."""

    SCHEMA_NAME: ClassVar[str] = ""
    SCHEMA_VERSION: ClassVar[int] = 0
    #: dataclasses that a field's hand-written schema (``field(metadata={"schema": ...})``)
    #: refers to as ``#/$defs/NAME``: their definitions are generated too
    SCHEMA_DEFS: ClassVar[tuple[type, ...]] = ()

    @classmethod
    def schema_id(cls) -> str:
        """The ``schema`` key of every document of this result: ``umctl.NAME/VERSION``."""
        return f"umctl.{cls.SCHEMA_NAME}/{cls.SCHEMA_VERSION}"

    def to_json(self) -> dict[str, Any]:
        """This result as a JSON-able dict: ``schema`` first, then every field in order."""
        return {"schema": self.schema_id(), **_fields_json(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]):
        """Read a document :meth:`to_json` wrote (or json.loads of it). Its ``schema`` must
        name this result at this version (a document without one is taken as version 1,
        the layout before the key existed); keys this umctl does not know are ignored,
        fields it lacks take their defaults."""
        if not isinstance(data, dict):
            raise SchemaError(f"{cls.SCHEMA_NAME}: expected a JSON object, got {type(data).__name__}")
        sid = data.get("schema", f"umctl.{cls.SCHEMA_NAME}/1")
        if sid != cls.schema_id():
            raise SchemaError(f"document is {sid!r}; this umctl reads {cls.schema_id()!r}")
        return _from_json(cls, data)

    @classmethod
    def json_schema(cls) -> dict[str, Any]:
        """The JSON Schema of :meth:`to_json`'s documents, generated from the fields."""
        defs: dict[str, Any] = {}
        root = _object_schema(cls, defs, top=True)
        for extra in cls.SCHEMA_DEFS:
            _type_schema(extra, defs)
        out: dict[str, Any] = {"$schema": JSON_SCHEMA_DIALECT,
                               "$id": f"urn:umctl:{cls.SCHEMA_NAME}:{cls.SCHEMA_VERSION}",
                               "title": f"{cls.__name__} ({cls.schema_id()})", **root}
        if defs:
            out["$defs"] = dict(sorted(defs.items()))
        return out


def _fields_json(obj: Any) -> dict[str, Any]:
    return {f.name: _to_json(v) for f in dataclasses.fields(obj) if f.init
            for v in (getattr(obj, f.name),) if v is not None or not f.metadata.get("omit_none")}


def _to_json(v: Any) -> Any:
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return _fields_json(v)
    if isinstance(v, (list, tuple)):
        return [_to_json(x) for x in v]
    if isinstance(v, dict):
        return {k: _to_json(x) for k, x in v.items()}
    return v


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _from_json(cls: type, data: dict[str, Any]) -> Any:
    hints = _hints(cls)
    kw = {}
    for f in dataclasses.fields(cls):
        if f.init and f.name in data:
            kw[f.name] = _convert(hints[f.name], data[f.name])
    try:
        return cls(**kw)
    except TypeError as e:   # a required field missing
        raise SchemaError(f"{getattr(cls, 'SCHEMA_NAME', '') or cls.__name__}: {e}") from None


def _convert(tp: Any, v: Any) -> Any:
    """A JSON value as the field's type: nested dataclasses built, arrays of fixed shape
    (``tuple[...]``) back to tuples; anything else as it came."""
    origin = typing.get_origin(tp)
    if v is None:
        return None
    if origin in (Union, types.UnionType):
        for arm in typing.get_args(tp):
            if arm is type(None):
                continue
            if dataclasses.is_dataclass(arm) and isinstance(v, dict):
                return _convert(arm, v)
            if typing.get_origin(arm) in (list, tuple, dict) and isinstance(v, (list, dict)):
                return _convert(arm, v)
        return v
    if dataclasses.is_dataclass(tp) and isinstance(v, dict):
        return _from_json(tp, v)
    if origin is list and isinstance(v, list):
        (item,) = typing.get_args(tp) or (Any,)
        return [_convert(item, x) for x in v]
    if origin is tuple and isinstance(v, list):
        args = typing.get_args(tp)
        return tuple(_convert(a, x) for a, x in zip(args, v))
    if origin is dict and isinstance(v, dict):
        args = typing.get_args(tp)
        return {k: _convert(args[1], x) for k, x in v.items()} if len(args) == 2 else v
    return v


# ---------------------------------------------------------------------- schema generation
_SIMPLE = {int: "integer", float: "number", str: "string", bool: "boolean", type(None): "null"}


def _type_schema(tp: Any, defs: dict[str, Any]) -> dict[str, Any]:
    if tp is Any:
        return {}
    if tp in _SIMPLE:
        return {"type": _SIMPLE[tp]}
    if dataclasses.is_dataclass(tp):
        if tp.__name__ not in defs:
            defs[tp.__name__] = {}   # placeholder: a recursive type refers to itself
            defs[tp.__name__] = _object_schema(tp, defs, top=False)
        return {"$ref": f"#/$defs/{tp.__name__}"}
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        arms = [_type_schema(a, defs) for a in args]
        if all(set(a) == {"type"} for a in arms):
            kinds: list[str] = []
            for a in arms:
                kinds += a["type"] if isinstance(a["type"], list) else [a["type"]]
            return {"type": kinds}
        return {"anyOf": arms}
    if tp is dict or origin is dict:
        out: dict[str, Any] = {"type": "object"}
        if len(args) == 2 and args[1] is not Any:
            out["additionalProperties"] = _type_schema(args[1], defs)
        return out
    if tp is list or origin is list:
        return {"type": "array", **({"items": _type_schema(args[0], defs)} if args and args[0] is not Any else {})}
    if origin is tuple:
        return {"type": "array", "prefixItems": [_type_schema(a, defs) for a in args], "items": False,
                "minItems": len(args)}
    raise TypeError(f"no JSON Schema for the type {tp!r}")


def _object_schema(cls: type, defs: dict[str, Any], *, top: bool) -> dict[str, Any]:
    hints = _hints(cls)
    props: dict[str, Any] = {}
    required: list[str] = []
    if top:
        props["schema"] = {"const": cls.schema_id(), "description": "Which result this is, and its schema version."}
        required.append("schema")
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        s = dict(f.metadata.get("schema") or _type_schema(hints[f.name], defs))
        if f.metadata.get("doc"):
            s["description"] = f.metadata["doc"]
        props[f.name] = s
        if f.default is MISSING and f.default_factory is MISSING:
            required.append(f.name)
    out: dict[str, Any] = {"type": "object"}
    text = (cls.__doc__ or "").strip()
    if text:
        out["description"] = " ".join(text.split())
    # open either way (readers ignore keys they do not know); ``{}`` rather than ``true`` marks an
    # object whose writer may add keys at any time, which closed_schema leaves open
    out.update(properties=props, required=required,
               additionalProperties={} if getattr(cls, "OPEN_KEYS", False) else True)
    return out


def closed_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with every object of a dataclass closed (``additionalProperties: false``):
    for checking that a writer emits only declared keys. Open dicts, and objects marked open
    (``additionalProperties: {}``: a source's figures, a controller's stats), stay open."""
    s = copy.deepcopy(schema)

    def close(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node and node.get("additionalProperties") is True:
                node["additionalProperties"] = False
            for v in node.values():
                close(v)
        elif isinstance(node, list):
            for v in node:
                close(v)

    close(s)
    return s


def incompatible_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What makes ``new`` (a generated schema) unreadable to a reader of ``old`` at the same
    version: a property removed, a property's schema changed (descriptions aside), or the
    required properties changed. Empty when ``new`` only adds optional properties."""
    problems: list[str] = []

    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if k != "description"}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    def objects(s: dict[str, Any]) -> dict[str, dict[str, Any]]:
        return {"(root)": s, **{f"$defs/{k}": v for k, v in s.get("$defs", {}).items()}}

    old_objs, new_objs = objects(old), objects(new)
    for where, o in old_objs.items():
        n = new_objs.get(where)
        if n is None:
            problems.append(f"{where}: removed")
            continue
        for name, ps in o.get("properties", {}).items():
            if name not in n.get("properties", {}):
                problems.append(f"{where}.{name}: removed")
            elif strip(ps) != strip(n["properties"][name]):
                problems.append(f"{where}.{name}: its type changed")
        if sorted(o.get("required", [])) != sorted(n.get("required", [])):
            added = sorted(set(n.get("required", [])) - set(o.get("required", [])))
            gone = sorted(set(o.get("required", [])) - set(n.get("required", [])))
            problems.append(f"{where}: required fields changed (+{added} -{gone})")
    return problems


# ---------------------------------------------------------------------- replay
@dataclass
class ReplayResult(Result):
    """One mode's outcome in a replay of a workload on the UVM simulator. Speedups are over
    the mode ``none`` of the same replay (the stock driver)."""

    SCHEMA_NAME: ClassVar[str] = "replay-result"
    SCHEMA_VERSION: ClassVar[int] = 1

    mode: str = doc("Controller mode (none: the stock driver).")
    time_s: float = doc("Simulated run time, seconds.")
    speedup: float | None = doc("none's time over this mode's; null when this mode took no time.")
    faults: int = doc("GPU page faults (distinct pages per fault batch).")
    fault_batches: int = doc("Fault batches the driver serviced.")
    bytes_h2d: int = doc("Bytes migrated host to GPU.")
    bytes_d2h: int = doc("Bytes migrated GPU to host.")
    evictions: int = doc("2 MiB blocks the driver evicted on the fault path (or spilled to a neighbour GPU).")
    prefetch_accuracy: float | None = doc("Of the pages the controller prefetched, the share used before eviction; "
                                          "null when nothing was prefetched.")
    prefetch_coverage: float | None = doc("Prefetched-and-used pages over those plus the pages that still "
                                          "faulted; null when nothing was prefetched.")
    time_ns: int = doc("Simulated run time, ns.")
    steady_time_ns: int | None = doc("Time of the iterations after the first, ns; null with one iteration.")
    steady_speedup: float | None = doc("Speedup over none on the steady iterations; null with one iteration.")
    steady_faults_per_iter: float | None = doc("Mean faults per iteration after the first; null with one.")
    iteration_faults: list[int] | None = doc("Faults per iteration; null for a workload without iterations.")
    workload: str = doc("The workload's name (scenario or trace).")
    demand_bytes: int = doc("Bytes migrated to serve faults.")
    driver_prefetch_bytes: int = doc("Bytes the driver's own prefetcher migrated.")
    user_prefetch_bytes: int = doc("Bytes migrated by the controller's prefetches.")
    bytes_p2p: int = doc("Bytes migrated between GPUs.")
    preevictions: int = doc("2 MiB blocks evicted off the fault path: the controller's pre-evictions and "
                             "evictions that made room for its prefetches.")
    invalidated_bytes: int = doc("Bytes the controller invalidated (discarded).")
    prefetch_pages: int = doc("Pages the controller prefetched.")
    stall_ns: int = doc("Time kernels waited on faults, ns.")
    compute_ns: int = doc("Time kernels computed, ns.")
    kernels: int = doc("Kernels run.")
    accesses: int = doc("Page accesses simulated.")
    commands: int = doc("Commands the controller issued.")
    wall_s: float = doc("Wall-clock time of this mode's simulation, seconds (not a result: it varies per run).")
    fault_causes: dict[str, int] = doc("Every fault charged to one cause (cold, evicted, late_prefetch, ...).")
    steady_fault_causes_per_iter: dict[str, float] | None = doc(
        "Faults per steady iteration by cause; null with one iteration.")
    nodes: int = doc("Nodes simulated (SnuRHAC across nodes; 1 otherwise).")
    bytes_internode: int = doc("Bytes that crossed the network between nodes.")
    internode_messages: int = doc("Messages of SnuRHAC's fault protocol between nodes.")
    controller: dict[str, Any] = doc("The mode's own figures (its table sizes, hits, ...); keys differ per mode.")
    calibration: str = doc("The calibration the simulator ran with (name, plus any --calib-set).")
    budget: dict[str, Any] | None = doc(
        "With replay --budget: the live soft budget the control loop kept on a GPU of full size (bytes, "
        "hold, peak estimate, blocks its keeper evicted); absent when the GPU's size was the limit.",
        default=None, omit_none=True)
    budget_held: bool | None = doc("With replay --budget: the budget check's verdict from the simulator's "
                                   "migration and eviction events (null: unverified).", default=None, omit_none=True)
    budget_check: dict[str, Any] | None = doc("With replay --budget: the budget check's figures "
                                              "(umctl/loop/budget_check.py).", default=None, omit_none=True)
    bound_s: float | None = doc("A lower bound on any single-GPU replay's time of this workload at this "
                                "calibration (umctl/sim/bound.py), seconds; absent for several GPUs.",
                                default=None, omit_none=True)
    pct_of_bound: float | None = doc("This mode's time over the bound, percent (never below 100).",
                                     default=None, omit_none=True)

    @classmethod
    def from_row(cls, row: dict[str, Any], calibration: str) -> "ReplayResult":
        """From one of :func:`umctl.sim.replay.result_rows`' dicts. Every field without a
        default must be a key of the row: a renamed one fails here instead of printing null."""
        fields = [f for f in dataclasses.fields(cls) if f.name != "calibration"]
        missing = [f.name for f in fields if f.name not in row
                   and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        if missing:
            raise KeyError(f"replay row of mode {row.get('mode')!r} lacks {missing}")
        return cls(**{f.name: row[f.name] for f in fields if f.name in row}, calibration=calibration)


@dataclass
class ReplayReport:
    """What a replay's reporters render: the modes' results in order (``none`` first), the
    workload's one-line description (the table's title) and name, where the calibration came
    from, and the simulator's own results (``SimResult``: the per-kernel series a figure
    draws), which have no JSON form; a report read back from JSON has none."""

    results: list[ReplayResult]
    title: str = ""
    workload_name: str = ""
    calibration_from: str = ""
    sims: list[Any] = field(default_factory=list)

    def to_json(self) -> list[dict[str, Any]]:
        """``umctl replay --json``: a list of the results' documents, one per mode."""
        return [r.to_json() for r in self.results]

    @classmethod
    def from_json(cls, docs: list[dict[str, Any]]) -> "ReplayReport":
        """Read ``umctl replay --json``'s list back (no title, no simulator results)."""
        if not isinstance(docs, list):
            raise SchemaError(f"a replay's JSON is a list of {ReplayResult.schema_id()} objects")
        return cls([ReplayResult.from_json(d) for d in docs])


# ---------------------------------------------------------------------- live
@dataclass
class LiveTotals:
    """Running totals of one observed process when the session ended. Sampled (``sample``
    below 1): counts and byte totals are estimates scaled by the measured on-time; ``h2d`` /
    ``d2h`` by cause, ``counters``, top kernels and top blocks are the sample's own."""

    pid: int = doc("The observed process.")
    comm: str = doc("Its command name.")
    faults: int = doc("GPU faults (estimated when sampled).")
    batches: int = doc("Fault batches (estimated when sampled).")
    cpu_faults: int = doc("CPU faults on managed memory (estimated when sampled).")
    thrashing: int = doc("The driver's thrashing detections (estimated when sampled).")
    dropped: int = doc("Events lost to ring overflow.")
    launches: int = doc("Kernel launches seen.")
    h2d: dict[str, int] = doc("Bytes host to GPU by cause (demand, prefetch, evict, user, other), from "
                              "migration events as collected.")
    d2h: dict[str, int] = doc("Bytes GPU to host by cause, as h2d.")
    counters: dict[str, int] = doc("The driver's counters as read (not scaled).")
    top_kernels: list[tuple[str, int]] = doc("Kernels by the faults under them: [name, faults], most first.")
    top_blocks: list[tuple[str, int]] = doc("2 MiB blocks by faults: [address (hex), faults], most first.")
    sample: float = doc("Measured fraction of the time events and counters were collected (1: every event).",
                        default=1.0)
    have_migrations: bool = doc("Whether migration events were collected (bytes by cause).", default=False)
    h2d_total: int = doc("Bytes host to GPU (estimated when sampled; from the counters without migration "
                         "events).", default=0)
    d2h_total: int = doc("Bytes GPU to host, as h2d_total.", default=0)

    def counter(self, name: str) -> int:
        """A driver counter as a total (scaled up when sampled)."""
        return scaled_estimate(self.counters.get(name, 0), self.sample)


@dataclass
class ControlStats:
    """What a live controller reports at the end (``LiveControl.stats()``), under
    ``source.control``. The budget's keys are there only under ``--budget``; the controller
    may report more than these (open keys)."""

    OPEN_KEYS: ClassVar[bool] = True

    mode: str = doc("Controller mode.")
    commands: int = doc("Commands the controller issued.")
    actuator: dict[str, Any] = doc("The actuator's figures: counts, bytes, latency_ms, errors, ...")
    controller: dict[str, Any] = doc("The mode's own figures.")
    controller_ms: float = doc("Time spent in the controller, ms.")
    resident_bytes: list[int] = doc("Estimated GPU-resident managed bytes per GPU at the end.")
    budget: dict[str, Any] | None = doc("The soft budget: bytes, peak_estimate_bytes, overflow_blocks_evicted, "
                                        "dst, swept_blocks, sweep_ms, ...", default=None)
    budget_held: bool | None = doc("Whether the driver's own residency stayed within budget + slack "
                                   "(null: unverified).", default=None)
    budget_check: dict[str, Any] | None = doc("The budget check's verdict (umctl/loop/budget_check.py).",
                                              default=None)
    budget_series: dict[str, Any] | None = doc("The true residency over time: columns and rows.", default=None)


#: ``source`` of a session summary: the source's own figures (they differ per source), with
#: the keys every session adds described
_SOURCE_SCHEMA = {
    "type": "object",
    "properties": {
        "elapsed_s": {"type": "number", "description": "Seconds observed."},
        "trace": {"type": ["string", "null"], "description": "The trace written, if any."},
        "trace_events": {"type": ["integer", "null"], "description": "Events written to the trace."},
        "control": {"$ref": "#/$defs/ControlStats"},
    },
    "required": ["elapsed_s", "trace", "trace_events"],
    "additionalProperties": {},
}


@dataclass
class SessionSummary(Result):
    """How a live session (umctl attach / run / record) ended: the process's totals, the
    source's and the controller's figures, why it ended, and under --budget whether the
    budget held."""

    SCHEMA_NAME: ClassVar[str] = "session-summary"
    SCHEMA_VERSION: ClassVar[int] = 1
    SCHEMA_DEFS: ClassVar[tuple[type, ...]] = (ControlStats,)   # referenced by source's schema

    summary: LiveTotals = doc("The observed process's totals.")
    source: dict[str, Any] = field(metadata={
        "doc": "The source's own figures (they differ per source: attach_ms, kinds, ring_entries, lags, ...), "
               "elapsed_s, trace, trace_events and, when controlled, control.",
        "schema": _SOURCE_SCHEMA})
    end: str = doc("Why the session ended (target exited, duration reached, interrupted, ...).")
    budget_held: bool | None = doc("Under --budget: source.control.budget_held, repeated here (null: "
                                   "unverified). Absent without a budget.", default=None)
    budget_check: dict[str, Any] | None = doc("Under --budget: source.control.budget_check. Absent without "
                                              "a budget.", default=None)
    command: str = doc("The command that ran the session: attach, run or record.", default="attach")

    def to_json(self) -> dict[str, Any]:
        """As :meth:`Result.to_json`, except that the budget keys are left out without a
        budget check (a session without --budget has no verdict, not an unverified one)."""
        d = super().to_json()
        if self.budget_check is None:
            d.pop("budget_held")
            d.pop("budget_check")
        return d

    @property
    def control(self) -> ControlStats | None:
        """``source.control`` typed, or None for a session that only observed."""
        c = self.source.get("control")
        return _from_json(ControlStats, c) if c else None


# ---------------------------------------------------------------------- traces
@dataclass
class EvictionTotals:
    """The trace's eviction events, summed."""

    count: int = doc("Eviction events.")
    bytes_written: int = doc("Bytes written back to the host.")
    pages: int = doc("Pages evicted.")
    critical: int = doc("Evictions the driver marked critical.")


@dataclass
class TraceInfo(Result):
    """What ``umctl trace info`` shows of a trace file. H2D is data moved from the CPU to a GPU,
    D2H from a GPU to the CPU, P2P between GPUs."""

    SCHEMA_NAME: ClassVar[str] = "trace-info"
    SCHEMA_VERSION: ClassVar[int] = 1

    file: str = doc("The trace file.")
    complete: bool = doc("False for a recording that was interrupted or failed (NAME.partial): its events "
                         "stop there.")
    meta: dict[str, Any] = doc("The trace's header: source, host, GPUs, driver, scenario, mode, ...")
    kernel_names: int = doc("Kernel names in the trace's table.")
    events: dict[str, int] = doc("Events by kind (kinds with none left out).")
    total_events: int = doc("Events of every kind.")
    time_span_ns: tuple[int, int] = doc("First and last event time, ns (CLOCK_MONOTONIC for live recordings).")
    duration_ns: int = doc("Last minus first event time, ns.")
    gpu_faults: int = doc("GPU fault events.")
    fault_batches: int = doc("Fault batches (replay events, else distinct batch ids).")
    migrated_bytes: dict[str, dict[str, int]] = doc("Bytes migrated by direction (H2D, D2H, P2P), then cause.")
    copied_bytes: dict[str, int] = doc("Bytes of explicit copies by kind.")
    evictions: EvictionTotals = doc("Eviction events, summed.")
    dropped_events: dict[str, int] = doc("Events the source dropped, by kind.")


@dataclass
class ControlAnalysis(Result):
    """Why a controlled run still faulted (``umctl trace control``): each faulted 2 MiB block
    (one per block per fault batch) classed by umctl's last command for it before the fault
    (umctl/report/control.py). Timings are [p50, p90] in ms, empty when there were none."""

    SCHEMA_NAME: ClassVar[str] = "control-analysis"
    SCHEMA_VERSION: ClassVar[int] = 1

    fault_blocks: int = doc("Faulted blocks classified (after --skip).")
    classes: dict[str, int] = doc("Faulted blocks by class: late, prefetched, resident, evicted by the budget, "
                                  "evicted by the controller, evicted by the sweep, never touched.")
    late_submitted_before_ms_p50_p90: list[float] = doc("Late prefetches: submitted this long before the fault.")
    late_completed_after_ms_p50_p90: list[float] = doc("Late prefetches: completed this long after the fault.")
    prefetch_turnaround_ms_p50_p90: list[float] = doc("Every prefetch: submission to completion.")
    evicted_refault_ms_p50_p90: list[float] = doc("Evicted blocks: eviction to the fault that wanted them back.")
    predicted_since_previous_fault: int = doc("Faults whose use the controller had predicted (a prefetch since "
                                              "the block's previous use).")
    commands: dict[str, int] = doc("Commands by operation (prefetch, preevict, invalidate).")


#: Every result with a JSON form, in the order the schema documents are listed.
RESULTS: tuple[type[Result], ...] = (ReplayResult, SessionSummary, TraceInfo, ControlAnalysis)
