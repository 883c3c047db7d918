"""Scenario registry and loader: declarative TOML files -> :class:`Workload`.

A scenario file holds one workload family::

    [family]
    generator = "dnn"                  # a key of umctl.workload.families.GENERATORS
    description = "..."
    [family.defaults]                  # parameters every scenario of the file starts from
    gpu_mem = "512MiB"

    [scenarios.gpt2-xl]
    description = "..."
    layers = 48                        # every other plain key is a parameter
    [scenarios.gpt2-xl.reference]      # facts from the paper, kept in Workload.meta
    params = 1.558e9

A scenario may start from another one with ``base = "gpt2-xl"`` (a scenario earlier in the
same file, or a built-in one), so a user file can change a built-in model in two lines.
Parameter types come from the defaults as written: integers, floats, booleans, strings,
lists, and *sizes* (a string with a unit, ``"512MiB"``), which resolve to bytes. Every
scenario has at least ``oversub``, ``gpu_mem``, ``iterations`` and ``seed``.

The built-in files live in the repository's ``scenarios/`` folder and ship as the package
``umctl.scenarios_data``; docs/reference/scenarios.md documents the format with an example per family.

A user's file is read as strictly as ``--param``: every key must be a parameter of its
generator (the parameters its built-in scenarios have; an unknown key is an error with a
did-you-mean, not silently ignored), of that parameter's type (``layers = "many"`` or
``gpu_mem = "-512MiB"`` used to reach the generator and crash it), finite, and within
:data:`BOUNDS`. Values from the command line get the same checks. Before a workload is
generated, its size is estimated (managed footprint x iterations, in pages) and refused above
:data:`MAX_PAGE_PASSES`, so an absurd size is an error instead of hours of work or an
exhausted machine.
"""

from __future__ import annotations

import difflib
import functools
import importlib.resources
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable


from .. import UmctlError
from ..units import PAGE_SIZE, GiB, KiB, Range, parse_size
from .families import GENERATORS, JOBS, ParamError, Params, tenants
from .workload import Workload

#: Parameters every scenario accepts, with the defaults used when a file does not set them.
COMMON_DEFAULTS: dict[str, Any] = {"oversub": 2.0, "gpu_mem": "512MiB", "iterations": 3, "seed": 0}
#: Other spellings the CLI may pass for a parameter.
ALIASES = {"iters": "iterations"}
#: Keys of a scenario table that are not parameters.
RESERVED = ("description", "base", "reference")

_SIZE = re.compile(r"^\s*[0-9]*\.?[0-9]+\s*[kmgt]i?b?\s*$", re.IGNORECASE)
_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}

TiB = 1 << 40
_RATE = Range(0, 1e6, lo_open=True)      # GB/s or TFLOP/s: > 0 (a rate of 0 never finishes)
_RATE0 = Range(0, 1e6)                   # ... where 0 means "none"
_FRAC = Range(0, 1, lo_open=True)        # a fraction of something: (0, 1]

#: Allowed values of numeric scenario parameters (for a list: of each item), by name: a name
#: means the same in every family. Lower bounds are what a generator needs to mean anything;
#: upper bounds lie far above the published models (GPT-3 has 96 layers, 12288 hidden) and the
#: shipped scenarios, and stop a typo from generating a workload that cannot fit the machine.
#: tests/test_cli_badinput.py checks that every numeric parameter of every built-in scenario
#: has a range here and that the defaults lie within it.
BOUNDS: dict[str, Range] = {
    # every scenario
    "oversub": Range(0, 64, lo_open=True),
    "gpu_mem": Range(64 * KiB, 64 * TiB),         # a size, in bytes
    "full_gpu_mem": Range(64 * KiB, 64 * TiB),
    "iterations": Range(1, 10_000),
    "seed": Range(0, 2**32 - 1),
    # dnn and embedding models
    "layers": Range(1, 1000), "hidden": Range(1, 65536), "heads": Range(1, 1024),
    "seq_len": Range(1, 1 << 20), "vocab": Range(1, 1 << 24), "batch": Range(1, 1 << 20),
    "width": Range(1, 8192), "image": Range(1, 8192), "classes": Range(1, 1 << 20),
    "blocks": Range(1, 1000),                     # residual blocks per stage
    "emb_dim": Range(1, 65536), "dense_features": Range(1, 65536),
    "bottom_mlp": Range(1, 1 << 20), "top_mlp": Range(1, 1 << 20),
    "table_rows": Range(1, 1 << 32),
    "zipf": Range(0, 10), "alpha": Range(0, 10, lo_open=True),
    "intermediate": Range(0, 1 << 20), "kv_heads": Range(0, 1024), "experts": Range(0, 1024),
    "top_k": Range(0, 1024), "skew": Range(0, 10), "patch": Range(1, 8192), "peak_tflops_half": _RATE,
    "in_channels": Range(1, 65536), "channels": Range(1, 65536), "context_len": Range(1, 1 << 20),
    "context_dim": Range(1, 65536),
    "peak_tflops": _RATE, "full_peak_tflops": _RATE, "tflops": _RATE,
    "hbm_gbps": _RATE, "full_hbm_gbps": _RATE, "host_gbps": _RATE, "kernel_gbps": _RATE,
    "host_write_gbps": _RATE, "host_compute_gbps": _RATE0, "host_between_gbps": _RATE0,
    "job_hbm_gbps": _RATE0,
    # graph
    "avg_degree": Range(1, 1 << 16), "chunks": Range(1, 1 << 16),
    # hum
    "fill": _FRAC, "inputs": Range(1, 1024), "outputs": Range(1, 1024), "kernels": Range(1, 1024),
    # multigpu
    "gpus": Range(1, 32), "nodes": Range(1, 32), "tiles": Range(1, 1 << 16), "gather": _FRAC,
    # tenants
    "tenants": Range(1, 64), "neighbour_iterations": Range(1, 10_000), "spare": Range(0, 1, hi_open=True),
    "harvester_oversub": Range(0, 64, lo_open=True), "neighbour_spare": Range(0, 1, hi_open=True),
}
#: Most items a list parameter may have.
MAX_LIST = 4096
#: Most page-passes a workload may be generated with: managed footprint in 4 KiB pages times
#: iterations (a training iteration touches each page a few times: 4-12 accesses per
#: page-pass in the shipped scenarios). 2^27 is 512 GiB of footprint x iterations, ~1e9 page
#: accesses, several GB of arrays and hours of simulation; the largest documented run (GPT-2 XL
#: at its real size, batch 5, 2 iterations on a V100: ~65 M) is well inside it.
MAX_PAGE_PASSES = 1 << 27


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "size" if _SIZE.match(value) else "str"
    if isinstance(value, list):
        return "list"
    raise TypeError(type(value).__name__)


@dataclass(frozen=True)
class Param:
    """A scenario parameter: its default as written in the file and the type it implies."""

    name: str
    default: Any
    kind: str

    def resolve(self, value: Any) -> Any:
        """A value of this parameter's type as generators see it (sizes in bytes)."""
        return parse_size(value) if self.kind == "size" else value

    def parse(self, text: str) -> Any:
        """A command-line string -> the resolved value; ValueError with a reason if it is not one."""
        text = text.strip()
        if self.kind == "list":
            item = _kind(self.default[0]) if self.default else "str"
            items = [t for t in (s.strip() for s in text.split(",")) if t]
            return [Param(self.name, None, item).parse(t) for t in items]
        if self.kind == "int":
            try:
                return int(text.replace("_", ""))
            except ValueError:
                raise ValueError("expected an integer") from None
        if self.kind == "float":
            try:
                return float(text)
            except ValueError:
                raise ValueError("expected a number") from None
        if self.kind == "bool":
            if text.lower() in _TRUE | _FALSE:
                return text.lower() in _TRUE
            raise ValueError("expected true or false")
        if self.kind == "size":
            return parse_size(text)
        return text


@dataclass(frozen=True)
class ScenarioInfo:
    """A named scenario: which generator builds it and with which parameters."""

    name: str
    family: str
    generator: str
    description: str
    params: tuple[Param, ...]
    source: str
    reference: dict = field(default_factory=dict)

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)

    def defaults(self) -> dict[str, Any]:
        """Parameters with their defaults as written in the file."""
        return {p.name: p.default for p in self.params}


# -- checking values ---------------------------------------------------------------------------
def _fmt_bound(name: str, x: float) -> str:
    if name.endswith("gpu_mem"):
        for unit, n in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
            if x >= n and x % n == 0:
                return f"{int(x // n)} {unit}"
    return f"{x:g}" if not float(x).is_integer() or abs(x) >= 1e10 else f"{int(x)}"


def describe_bounds(name: str) -> str:
    """``from 1 to 1000``, ``in (0, 64]``, ``from 64 KiB to 64 TiB``: the range of a parameter."""
    r = BOUNDS.get(name)
    if r is None:
        return "finite"
    lo, hi = _fmt_bound(name, r.lo), _fmt_bound(name, r.hi)
    if not r.lo_open and not r.hi_open:
        return f"from {lo} to {hi}"
    return f"in {'(' if r.lo_open else '['}{lo}, {hi}{')' if r.hi_open else ']'}"


def check_value(name: str, kind: str, value: Any) -> None:
    """ValueError (a reason naming the range) unless a resolved parameter value is finite and
    within :data:`BOUNDS` (for a list: each item, and at most :data:`MAX_LIST` of them)."""
    items = value if kind == "list" else [value]
    if kind == "list" and len(items) > MAX_LIST:
        raise ValueError(f"at most {MAX_LIST} items (got {len(items)})")
    rng = BOUNDS.get(name)
    for v in items:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if rng is None:
            ok = isinstance(v, int) or math.isfinite(v)
        else:
            ok = v in rng
        if not ok:
            each = "each item " if kind == "list" else ""
            raise ValueError(f"{each}must be {describe_bounds(name)} (got {v!r})")


_KIND_TEXT = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string",
              "size": 'a size such as "512MiB" or a number of bytes', "list": "a list"}


def _typed(kind: str, value: Any, item_kind: str | None = None) -> Any:
    """A value written in a scenario file as the parameter's type ``kind`` (an int where a float
    belongs is that float); ValueError with the expected type otherwise. Sizes stay as written
    (resolved to bytes later)."""
    ok: bool
    if kind == "float":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif kind == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind == "bool":
        ok = isinstance(value, bool)
    elif kind == "str":
        ok = isinstance(value, str)
    elif kind == "size":
        ok = ((isinstance(value, str) and bool(_SIZE.match(value)))
              or (isinstance(value, int) and not isinstance(value, bool) and value >= 0))
    elif kind == "list":
        ok = isinstance(value, list)
        if ok and item_kind is not None:
            try:
                value = [_typed(item_kind, v) for v in value]
            except ValueError:
                raise ValueError(f"expected a list of {_KIND_TEXT[item_kind].removeprefix('a ').removeprefix('an ')}s"
                                 f" (got {value!r})") from None
    else:  # pragma: no cover
        ok = True
    if not ok:
        raise ValueError(f"expected {_KIND_TEXT[kind]} (got {value!r})")
    return value


def _item_kind(p: Param) -> str | None:
    return _kind(p.default[0]) if p.kind == "list" and p.default else None


@functools.lru_cache(maxsize=None)
def generator_params(generator: str) -> dict[str, Param]:
    """What a generator takes: the parameters of its built-in scenarios (the first default of
    each) and the common ones. A scenario file is checked against this: its keys must be among
    them, of their types."""
    out: dict[str, Param] = {k: Param(k, v, _kind(v)) for k, v in COMMON_DEFAULTS.items()}
    for info in _registry().values():
        if info.generator == generator:
            for p in info.params:
                out.setdefault(p.name, p)
    return out


# -- reading files -----------------------------------------------------------------------------
def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


def _parse_file(data: bytes, source: str, family: str,
                lookup: Callable[[str], ScenarioInfo | None], strict: bool = False) -> list[ScenarioInfo]:
    """The scenarios of one file. ``lookup`` finds ``base`` scenarios outside the file.
    ``strict`` (a user's file): every key a parameter of the generator, of its type and range
    (the built-in files define those types, so they are read as written)."""
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UmctlError(f"cannot read scenario file {source}: {_one_line(e)}") from None
    fam = doc.get("family", {})
    tables = doc.get("scenarios")
    if not isinstance(fam, dict) or not isinstance(tables, dict) or not tables:
        raise UmctlError(f"scenario file {source} needs a [family] table (generator = ...) and at least "
                         f"one [scenarios.NAME] table")
    fam_defaults = fam.get("defaults", {})
    if not isinstance(fam_defaults, dict):
        raise UmctlError(f"{source}: family.defaults must be a table")
    out: dict[str, ScenarioInfo] = {}
    for name, table in tables.items():
        if not isinstance(table, dict):
            raise UmctlError(f"{source}: scenarios.{name} must be a table")
        base = None
        if "base" in table:
            base = out.get(table["base"]) or lookup(table["base"])
            if base is None:
                raise UmctlError(f"{source}: scenario {name} has unknown base {table['base']!r}")
        generator = base.generator if base else fam.get("generator")
        if generator not in GENERATORS:
            what = f"generator {generator!r} is" if generator is not None else "[family] has no generator:"
            raise UmctlError(f"{source}: {what} not one of {', '.join(GENERATORS)}"
                             if generator is not None else f"{source}: {what} give one of {', '.join(GENERATORS)}")
        own = {k: v for k, v in table.items() if k not in RESERVED}
        schema = generator_params(generator) if strict else {}
        if strict:
            fam_defaults = _strict_values(fam_defaults, schema, f"{source}: family.defaults")
            own = _strict_values(own, schema, f"{source}: scenario {name}")
        layers: list[dict] = [COMMON_DEFAULTS, base.defaults() if base else {}, fam_defaults, own]
        values: dict[str, Any] = {}
        for layer in layers:
            for key, value in layer.items():
                # An integer written where the defaults hold a float (oversub = 3) is that float.
                if isinstance(values.get(key), float) and isinstance(value, int) and not isinstance(value, bool):
                    value = float(value)
                values[key] = value
        params = []
        for key, value in values.items():
            try:
                kind = schema[key].kind if key in schema else _kind(value)
            except TypeError:
                raise UmctlError(f"{source}: scenario {name}: parameter {key} cannot be a table") from None
            params.append(Param(key, value, kind))
        if not isinstance(table.get("reference", {}), dict):
            raise UmctlError(f"{source}: scenarios.{name}.reference must be a table")
        reference = {**(base.reference if base else {}), **table.get("reference", {})}
        description = table.get("description") or (base.description if base else fam.get("description", ""))
        out[name] = ScenarioInfo(name, family, generator, description, tuple(params), source, reference)
    return list(out.values())


def _strict_values(values: dict, schema: dict[str, Param], where: str) -> dict:
    """``values`` written in a user's file, each a known parameter of its type and range."""
    out = {}
    for key, value in values.items():
        p = schema.get(key)
        if p is None:
            raise UmctlError(f"{where}: unknown parameter {key!r}{_hint(key, schema)}")
        try:
            v = _typed(p.kind, value, _item_kind(p))
            check_value(key, p.kind, p.resolve(v) if p.kind == "size" else v)
        except ValueError as e:
            raise UmctlError(f"{where}: {key} = {_short(value)}: {_one_line(e)}") from None
        out[key] = v
    return out


def _short(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _bundled() -> list[tuple[str, bytes]]:
    """(name, contents) of the built-in scenario files, sorted by name."""
    # a source tree's own files first: an editable install elsewhere must not shadow them
    root: Any = Path(__file__).resolve().parents[2] / "scenarios"
    if not (root / "__init__.py").is_file():
        root = importlib.resources.files("umctl.scenarios_data")
    return sorted((f.name, f.read_bytes()) for f in root.iterdir() if f.name.endswith(".toml"))


@functools.lru_cache(maxsize=1)
def _registry() -> dict[str, ScenarioInfo]:
    reg: dict[str, ScenarioInfo] = {}
    for fname, data in _bundled():
        for info in _parse_file(data, f"scenarios/{fname}", fname.removesuffix(".toml"), lambda _name: None):
            if info.name in reg:
                raise UmctlError(f"scenario {info.name} is defined in both {reg[info.name].source} and {info.source}")
            reg[info.name] = info
    return reg


def _from_file(path: str, name: str | None) -> ScenarioInfo:
    try:
        data = Path(path).read_bytes()
    except IsADirectoryError:
        raise UmctlError(f"cannot read scenario file {path}: it is a directory") from None
    except OSError as e:
        raise UmctlError(f"cannot read scenario file {path}: {e.strerror or e}") from None
    infos = _parse_file(data, path, Path(path).stem, _registry().get, strict=True)
    if name is None:
        return infos[0]
    for info in infos:
        if info.name == name:
            return info
    raise UmctlError(f"{path} has no scenario {name!r}{_hint(name, [i.name for i in infos])}")


def _hint(word: str, names: Iterable[str]) -> str:
    names = sorted(names)
    close = difflib.get_close_matches(word, names, n=3, cutoff=0.5)
    if close:
        return f" (did you mean {' or '.join(close)}?)"
    return f" (valid: {', '.join(names)})"


# -- public API --------------------------------------------------------------------------------
def list_scenarios(family: str | None = None) -> list[ScenarioInfo]:
    """Built-in scenarios in file order, optionally of one family (the file's name)."""
    infos = list(_registry().values())
    if family is None:
        return infos
    families = {i.family for i in infos}
    if family not in families:
        raise UmctlError(f"unknown scenario family {family!r}{_hint(family, families)}")
    return [i for i in infos if i.family == family]


def find_scenario(target: str) -> ScenarioInfo:
    """A scenario name, a TOML file (its first scenario) or ``file.toml:name``."""
    path, sep, name = target.rpartition(":")
    if sep and path.endswith(".toml"):
        return _from_file(path, name)
    if target.endswith(".toml") or "/" in target:
        return _from_file(target, None)
    reg = _registry()
    if target in reg:
        return reg[target]
    raise UmctlError(f"unknown scenario {target!r}{_hint(target, reg)}; `umctl scenarios` lists them")


def resolve_params(info: ScenarioInfo, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The scenario's parameters with command-line ``overrides`` (strings) applied."""
    params = {p.name: p.resolve(p.default) for p in info.params}
    for key, text in (overrides or {}).items():
        name = key.strip().replace("-", "_")
        name = ALIASES.get(name, name)
        p = info.param(name)
        if p is None:
            raise UmctlError(f"scenario {info.name} has no parameter {key!r}{_hint(name, params)}")
        try:
            params[name] = p.parse(",".join(map(str, text)) if isinstance(text, list) else str(text))
            check_value(name, p.kind, params[name])
        except ValueError as e:
            raise UmctlError(f"scenario {info.name}: bad value {text!r} for {name}: {_one_line(e)}") from None
    return params


def _tenant_job(name: str):
    """A tenant of a ``tenants`` scenario, by its scenario's name (families.tenants.find_job)."""
    info = find_scenario(name)
    if info.generator not in JOBS:
        raise ParamError(f"{name} cannot run as a tenant (only {', '.join(JOBS)} scenarios can)")
    return JOBS[info.generator], resolve_params(info, {})


tenants.find_job = _tenant_job


def run_params(info: ScenarioInfo, overrides: dict[str, str] | None = None) -> dict[str, Any]:
    """The parameters ``info``'s generator runs with: the resolved ones, and at ``scale=full``
    the paper's GPU in place of the scaled defaults."""
    params = resolve_params(info, overrides)
    given = {ALIASES.get(k.strip().replace("-", "_"), k.strip().replace("-", "_")) for k in (overrides or {})}
    if params.get("scale") == "full":
        # At the model's real size the simulated GPU is the one the paper ran on: its memory
        # (full_gpu_mem, not the small default that scaled scenarios are shrunk to fit) and its
        # kernel rates (full_peak_tflops, full_hbm_gbps), each unless given on the command line.
        for name in [k for k in params if k.startswith("full_")]:
            base = name.removeprefix("full_")
            if base in params and base not in given:
                params[base] = params[name]
    return params


def load_scenario(target: str, overrides: dict[str, str] | None = None) -> Workload:
    """Generate the workload of ``target`` (see :func:`find_scenario`) with ``overrides``
    (``--param key=value``, ``--oversub``, ``--gpu-mem``, ``--iters``, ``--seed``) applied."""
    info = find_scenario(target)
    params = run_params(info, overrides)
    check_size(info, params)
    try:
        w = GENERATORS[info.generator](Params(params))
    except ParamError as e:
        raise UmctlError(f"scenario {info.name}: {_one_line(e)}") from None
    w.name = info.name
    w.params = params
    w.meta.update(scenario=info.name, family=info.family, generator=info.generator,
                  description=info.description, source=info.source)
    if info.reference:
        w.meta["reference"] = dict(info.reference)
    return w


def footprint_estimate(info: ScenarioInfo, params: dict[str, Any]) -> float:
    """The managed bytes a scenario will allocate, estimated before generating it: oversub x
    gpu_mem (per tenant) for a fitted model, the full-size model's weights (with gradient
    and two optimizer states) and activations at ``scale = "full"``. 0 when the parameters are
    too incomplete to tell (the generator then says what is missing)."""
    if params.get("scale") == "full" and info.generator in ("dnn", "embedding"):
        from .families import dnn, embedding

        try:
            p = Params(params)
            net = embedding.dlrm_net(p) if info.generator == "embedding" else dnn.NETS[p["arch"]](p)
        except (ParamError, KeyError, TypeError, ValueError, ZeroDivisionError):
            return 0.0
        copies = getattr(net, "copies", lambda op: 1)   # an expert op stands for its router's experts
        return float(sum(4 * op.weight * copies(op) + op.out + op.saved for op in net.ops))
    # a multigpu program is a single-GPU program (its footprint fits one GPU, however many the
    # machine has); tenants run one job per GPU
    v = params.get("tenants") if info.generator == "tenants" else 1
    n = v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 1
    oversub = params.get("oversub", 1.0)
    gpu_mem = params.get("gpu_mem", 0)
    if not isinstance(oversub, (int, float)) or not isinstance(gpu_mem, int):
        return 0.0
    return max(1.0, float(oversub)) * gpu_mem * n


def check_size(info: ScenarioInfo, params: dict[str, Any]) -> None:
    """Refuse a workload too large to generate and replay (:data:`MAX_PAGE_PASSES`), before
    any of it is generated: a size typo must not take the machine's memory or hours."""
    from ..units import format_bytes

    iters = max(v for v in (params.get("iterations", 1), params.get("neighbour_iterations", 1), 1)
                if isinstance(v, int))
    footprint = footprint_estimate(info, params)
    passes = footprint / PAGE_SIZE * iters
    if passes > MAX_PAGE_PASSES:
        raise UmctlError(f"scenario {info.name}: too large to replay: ~{format_bytes(footprint)} managed x {iters} "
                         f"iteration(s) is {passes:.3g} page-passes, above the bound of {MAX_PAGE_PASSES:.3g} "
                         f"(512 GiB x 1 iteration); lower gpu_mem, oversub, iterations or the model's size")


def parse_param(s: str) -> tuple[str, str]:
    """``key=value`` from ``--param`` -> (key, value)."""
    key, sep, value = s.partition("=")
    if not sep or not key.strip():
        raise UmctlError(f"--param expects key=value (got {s!r})")
    return key.strip(), value.strip()
