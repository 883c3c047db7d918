"""Typed mode options: what ``-O MODE.KEY=VALUE`` and ``--degree`` may set, parsed once.

A mode declares its options as the typed keyword parameters of its controller's ``__init__``
(``degree: int = 32``): the annotation is the option's type, the default its default. There is
no second list to keep in step with the constructor, and a test checks that every registered
mode's options have one of the types below. Text from the command line is converted here, once,
against that declaration; a value that does not fit is a one-line error naming the option and
its type (``-O deepum.degree=x`` used to reach the constructor as a string).

Scenario parameters (``--param``) and ``--calibration`` are not mode options and are parsed by
the scenario and calibration code.
"""

from __future__ import annotations

import inspect
import typing
from dataclasses import dataclass

from .. import UmctlError
from .base import Controller, available_modes, controller_class

#: the types an option may have: what a command-line word can be turned into without guessing
TYPES: tuple[type, ...] = (bool, int, float, str)
_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


@dataclass(frozen=True)
class OptionSpec:
    """One declared option of one mode."""

    name: str
    type: type
    default: object

    def parse(self, text: str, label: str) -> object:
        """``text`` as this option's type; ``label`` names the option in the error (e.g.
        ``-O deepum.degree=x`` or ``--degree``)."""
        t = self.type
        if t is bool:
            low = text.strip().lower()
            if low in _TRUE or low in _FALSE:
                return low in _TRUE
        elif t is str:
            return text
        else:
            try:
                return t(text.strip())
            except ValueError:
                pass
        raise UmctlError(f"{label}: option {self.name} takes {_a(t)} (default {self.default!r}), got {text!r}")


def _a(t: type) -> str:
    name = {bool: "a bool (true/false)", int: "an int", float: "a float", str: "a string"}
    return name[t]


def declared(cls: type[Controller]) -> dict[str, OptionSpec]:
    """The options ``cls`` declares (its typed keyword parameters), by name. Raises TypeError for
    a parameter without a default or with a type outside :data:`TYPES`: a declaration bug that
    the test over every registered mode catches, not a user error."""
    hints = typing.get_type_hints(cls.__init__)
    out: dict[str, OptionSpec] = {}
    for p in list(inspect.signature(cls.__init__).parameters.values())[1:]:
        if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
            continue
        t = hints.get(p.name)
        if t not in TYPES or p.default is p.empty:
            raise TypeError(f"{cls.__name__}.__init__: option {p.name} must be declared as "
                            f"'{p.name}: bool|int|float|str = default' (got {t!r})")
        out[p.name] = OptionSpec(p.name, t, p.default)
    return out


def mode_options(mode: str) -> dict[str, OptionSpec]:
    """The options of a registered mode (UmctlError for an unknown mode)."""
    return declared(controller_class(mode))


def parse_mode_options(items: list[str] | None, modes: list[str], *,
                       degree: int | None = None) -> dict[str, dict]:
    """``-O`` items (``deepum.degree=8`` for one mode, ``degree=8`` for every mode being run that
    declares it) and ``--degree N`` -> per-mode keyword arguments of the declared types."""
    known = available_modes()
    bad = [m for m in modes if m not in known]
    if bad:
        raise UmctlError(f"unknown mode {bad[0]!r}; available: {', '.join(known)}")
    specs = {m: mode_options(m) for m in modes}
    out: dict[str, dict] = {m: {} for m in modes}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UmctlError(f"bad mode option {item!r}: use MODE.KEY=VALUE or KEY=VALUE (e.g. deepum.degree=8)")
        mode, _, name = key.rpartition(".")
        targets = [mode] if mode else modes
        for m in targets:
            if m not in out:
                raise UmctlError(f"mode option {item!r} names mode {m!r}, which is not being run")
        taking = [m for m in targets if name in specs[m]]
        if not taking:
            have = sorted({n for m in targets for n in specs[m]})
            raise UmctlError(f"no mode among {', '.join(targets)} takes option {name!r}"
                             + (f" (options: {', '.join(have)})" if have else " (it has no options)"))
        for m in taking:
            out[m][name] = specs[m][name].parse(value, f"-O {item}")
    if degree is not None:
        taking = [m for m in modes if "degree" in specs[m]]
        if not taking:
            raise UmctlError(f"--degree: mode {', '.join(modes)} has no prefetch degree (DeepUM's modes do)")
        for m in taking:
            out[m]["degree"] = specs[m]["degree"].parse(str(degree), "--degree")
    return out
