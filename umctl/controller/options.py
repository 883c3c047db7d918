"""Typed mode options: what ``-O MODE.KEY=VALUE`` and ``--degree`` may set, parsed once.

A mode declares its options as the typed keyword parameters of its controller's ``__init__``
(``degree: int = 32``): the annotation is the option's type, the default its default. There is
no second list to keep in step with the constructor, and a test checks that every registered
mode's options have one of the types below. Text from the command line is converted here, once,
against that declaration; a value that does not fit is a one-line error naming the option and
its type (``-O deepum.degree=x`` used to reach the constructor as a string).

Numbers also have a range, declared once in :data:`BOUNDS` (by option name: an option means
the same in every mode that has it; :data:`MODE_BOUNDS` overrides one mode's). A value outside
it is refused here with the range in the message: ``-O deepum.degree=0`` used to replay a
prefetcher that never prefetches, ``-O deepum.num_rows=0`` crashed inside the table. Every
number is finite; upper bounds keep a typo (``num_rows=2048000000000``) from becoming a run
that exhausts the machine. A test checks that every int/float option of every registered mode
has a range here, so a new option cannot skip it.

Scenario parameters (``--param``) and ``--calibration`` are not mode options and are parsed by
the scenario and calibration code.
"""

from __future__ import annotations

import inspect
import typing
from dataclasses import dataclass

from .. import UmctlError
from ..units import Range
from .base import Controller, available_modes, controller_class

#: the types an option may have: what a command-line word can be turned into without guessing
TYPES: tuple[type, ...] = (bool, int, float, str)
_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


_BIG = float(1 << 20)   # counts of blocks / kernels / uses: 2 TiB of 2 MiB blocks

#: Ranges of the modes' numeric options, by option name. Lower bounds are what the code needs to
#: mean anything (a table of 0 rows, a degree of 0 kernels ahead); upper bounds are far above
#: any configuration in the papers or the docs (DeepUM table 6 / figure 11 sweep NumRows up to
#: 2048 x scale and N up to 64) and only stop a typo from exhausting memory or time.
BOUNDS: dict[str, Range] = {
    # correlation tables (DeepUM, SnuRHAC)
    "num_rows": Range(1, 1 << 24),
    "assoc": Range(1, 64),
    "num_succs": Range(1, 64),
    "num_levels": Range(1, 16),
    "degree": Range(1, 4096),                 # kernels ahead (DeepUM's N)
    "watermark_blocks": Range(0, _BIG),
    "max_blocks_per_step": Range(1, _BIG),
    "evict_horizon": Range(0, _BIG),
    # memHarvester
    "threshold_chunks": Range(0, _BIG),
    "prefetch_bytes": Range(0, float(1 << 40)),
    "stride_bytes": Range(0, float(1 << 40)),
    "active_window_ns": Range(0, 3600e9),
    # the oracle
    "lookahead": Range(1, _BIG),
    "replan_uses": Range(1, _BIG),
    "reserve_frac": Range(0, 1, hi_open=True),   # a fraction of GPU memory kept free
    "prefetch_blocks": Range(0, _BIG),
    # SnuRHAC
    "overlap_threshold": Range(0, 1),             # a fraction of a kernel's blocks
    "host_copy_gbps": Range(0, 1e4, lo_open=True),
}
#: Options of the replay itself rather than of one policy, which every mode takes (``-O KEY=V``
#: or ``-O MODE.KEY=V``): they reach the simulator in the controller's options
#: (``Controller.options``, read by :class:`umctl.sim.engine.Simulator`), so that one replay's
#: modes all run the same program. ``launch_queue``: how many kernel launches the host may have
#: issued ahead of the GPU (engine.py, "The launch queue"); unset, launches are seen as their
#: kernels start (the default: every result as before the queue was modelled). The CUDA queue
#: holds up to ~1024 launches; PyTorch's host usually runs fewer ahead. A mode whose controller
#: takes no options beyond its own (``harvest``'s) runs without them where ``-O KEY=V`` names no
#: mode (so ``-m all`` works), and refuses ``-O MODE.KEY=V``.
REPLAY_OPTIONS: dict[str, "OptionSpec"] = {}

#: Per-mode exceptions to :data:`BOUNDS`: mode name -> option -> range.
MODE_BOUNDS: dict[str, dict[str, Range]] = {}
#: What an int option without a declared range may be (booleans and strings have none).
INT_RANGE = Range(-(1 << 62), 1 << 62)


@dataclass(frozen=True)
class OptionSpec:
    """One declared option of one mode."""

    name: str
    type: type
    default: object
    range: Range | None = None

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
                v = t(text.strip().replace("_", ""))
            except (ValueError, OverflowError):
                pass
            else:
                rng = self.range or (INT_RANGE if t is int else Range())
                if v not in rng:
                    raise UmctlError(f"{label}: option {self.name} must be {_a(t)} {rng.describe()} "
                                     f"(default {self.default!r}), got {text.strip()!r}")
                return v
        raise UmctlError(f"{label}: option {self.name} takes {_a(t)} (default {self.default!r}), got {text!r}")


REPLAY_OPTIONS["launch_queue"] = OptionSpec("launch_queue", int, None, Range(0, 1 << 20))


def _takes_any(cls: type[Controller]) -> bool:
    """Whether ``cls``'s constructor passes unknown keywords on to Controller (``**options``),
    as a replay option needs."""
    return any(p.kind is p.VAR_KEYWORD for p in inspect.signature(cls.__init__).parameters.values())


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
        rng = None
        if t in (int, float):
            rng = MODE_BOUNDS.get(getattr(cls, "name", ""), {}).get(p.name) or BOUNDS.get(p.name)
        out[p.name] = OptionSpec(p.name, t, p.default, rng)
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
    twice = sorted({m for m in modes if modes.count(m) > 1})
    if twice:  # it would replay the mode twice and print two identical rows
        raise UmctlError(f"--mode: {', '.join(twice)} given twice; name each mode once")
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
        if name in REPLAY_OPTIONS and not any(name in specs[m] for m in targets):
            able = [m for m in targets if _takes_any(controller_class(m))]
            if mode and not able:
                raise UmctlError(f"-O {item}: mode {mode} cannot run with replay option {name}")
            parsed = REPLAY_OPTIONS[name].parse(value, f"-O {item}")
            for m in able:
                out[m][name] = parsed
            continue
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
