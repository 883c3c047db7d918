"""Scenario registry and loader: declarative TOML files -> :class:`Workload`.

A scenario file holds one workload family::

    [family]
    generator = "dnn"                  # a key of umctl.sources.families.GENERATORS
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
``umctl.scenarios_data``.
"""

from __future__ import annotations

import difflib
import functools
import importlib.resources
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from .. import UmctlError
from ..units import parse_size
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


# -- reading files -----------------------------------------------------------------------------
def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


def _parse_file(data: bytes, source: str, family: str,
                lookup: Callable[[str], ScenarioInfo | None]) -> list[ScenarioInfo]:
    """The scenarios of one file. ``lookup`` finds ``base`` scenarios outside the file."""
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UmctlError(f"cannot read scenario file {source}: {_one_line(e)}") from None
    fam = doc.get("family", {})
    tables = doc.get("scenarios")
    if not isinstance(fam, dict) or not isinstance(tables, dict) or not tables:
        raise UmctlError(f"scenario file {source} needs a [family] table and at least one [scenarios.NAME] table")
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
            raise UmctlError(f"{source}: generator {generator!r} is not one of {', '.join(GENERATORS)}")
        layers: list[dict] = [COMMON_DEFAULTS, base.defaults() if base else {}, fam_defaults,
                              {k: v for k, v in table.items() if k not in RESERVED}]
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
                kind = _kind(value)
            except TypeError:
                raise UmctlError(f"{source}: scenario {name}: parameter {key} cannot be a table") from None
            params.append(Param(key, value, kind))
        if not isinstance(table.get("reference", {}), dict):
            raise UmctlError(f"{source}: scenarios.{name}.reference must be a table")
        reference = {**(base.reference if base else {}), **table.get("reference", {})}
        description = table.get("description") or (base.description if base else fam.get("description", ""))
        out[name] = ScenarioInfo(name, family, generator, description, tuple(params), source, reference)
    return list(out.values())


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
    except OSError as e:
        raise UmctlError(f"cannot read scenario file {path}: {e.strerror or e}") from None
    infos = _parse_file(data, path, Path(path).stem, _registry().get)
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


def load_scenario(target: str, overrides: dict[str, str] | None = None) -> Workload:
    """Generate the workload of ``target`` (see :func:`find_scenario`) with ``overrides``
    (``--param key=value``, ``--oversub``, ``--gpu-mem``, ``--iters``, ``--seed``) applied."""
    info = find_scenario(target)
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


def parse_param(s: str) -> tuple[str, str]:
    """``key=value`` from ``--param`` -> (key, value)."""
    key, sep, value = s.partition("=")
    if not sep or not key.strip():
        raise UmctlError(f"--param expects key=value (got {s!r})")
    return key.strip(), value.strip()
