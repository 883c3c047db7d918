"""The package's shape, as ARCHITECTURE.md states it: imports run one way (no cycle, counting the
imports inside functions too, which is where cycles hide), the mode registry is the controller
package's own, and nothing outside the CLI leans on the CLI's private names."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "umctl"


def _modules() -> dict[str, tuple[Path, bool]]:
    mods = {}
    for p in PKG.rglob("*.py"):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        mods[".".join(parts[:-1] if is_pkg else parts)] = (p, is_pkg)
    return mods


def import_graph() -> dict[str, set[str]]:
    """module -> the umctl modules it imports anywhere in its text (``from a import b`` counts
    as importing ``a.b`` where that is a module, else ``a``)."""
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for m, (path, is_pkg) in mods.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = m.split(".")[: None if is_pkg else -1]
                    base = base[: len(base) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for a in node.names:
                    deps.add(f"{target}.{a.name}" if f"{target}.{a.name}" in mods else target)
        graph[m] = {d for d in deps if d in mods and d != m}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_the_package():
    assert cycles(import_graph()) == []


def _py_files(*dirs: str):
    for d in dirs:
        yield from (ROOT / d).rglob("*.py")


def test_the_mode_registry_is_read_only_inside_controller():
    outside = [str(p.relative_to(ROOT)) for p in _py_files("umctl", "tests", "benchmarks", "tools")
               if "_REGISTRY" in p.read_text() and p.parent != PKG / "controller"
               and p.name != "test_architecture.py"]
    assert outside == []


def test_nothing_imports_a_private_name_from_the_cli():
    private = re.compile(r"from umctl\.cli\.\w+ import [^\n]*\b_\w+|umctl\.cli\.\w+\._\w+|"
                         r"import umctl\.cli\.\w+ as")
    users = [str(p.relative_to(ROOT)) for p in _py_files("tests", "benchmarks", "tools", "umctl")
             if p.name != "test_architecture.py" and private.search(p.read_text())]
    assert users == []


def test_live_side_does_not_import_the_cli():
    graph = import_graph()
    assert [m for m, deps in graph.items() if not m.startswith("umctl.cli")
            and any(d.startswith("umctl.cli") for d in deps)] == []


def test_no_design_notes_outside_the_repository_are_cited():
    """DESIGN.md lives outside the repository: a fact it held is stated in docs/ instead
    (docs/evaluation/measurements.md), so a reader can follow every reference."""
    cite = re.compile(r"DESIGN(\.md| §)|\.\./shared/")
    files = [*_py_files("umctl", "tests", "benchmarks", "tools"), *(ROOT / "docs").rglob("*.md"),
             ROOT / "README.md", ROOT / "ARCHITECTURE.md", *(ROOT / "runtime").glob("*"), *(ROOT / "bpf").glob("*.c")]
    users = [str(p.relative_to(ROOT)) for p in files
             if p.is_file() and p.name != "test_architecture.py" and cite.search(p.read_text(errors="replace"))]
    assert users == []


#: Which umctl package may import which (beside ``umctl`` itself, ``umctl.units`` and
#: ``umctl.interrupts``, which every layer may use). Arrows run down the data path: workload and
#: live sources produce events, controllers turn events into commands, actuators carry them out.
#: An import not in this table is a new arrow: add it here only on purpose.
ALLOWED = {
    # the typed results (ReplayResult, SessionSummary, TraceInfo): data only, imports no umctl
    # module, so whoever produces a result (sim, live) and whoever renders it (report, cli) may
    "umctl.results": set(),
    "umctl.events": set(),
    "umctl.driver": set(),
    "umctl.runtime": set(),
    "umctl.bpf": set(),
    "umctl.workload": {"umctl.events"},
    "umctl.controller": {"umctl.events", "umctl.workload"},
    # the one control loop (subscriptions, residency estimate, budget and its check, COMMAND /
    # RESULT bookkeeping): below both of its drivers, a live session and the simulator, so that
    # neither reaches into the other; it knows a controller and events, never a source or an
    # actuator's implementation
    "umctl.loop": {"umctl.events", "umctl.controller"},
    # sim -> loop: the simulator is a source and an actuator of the loop. What a mode needs of
    # the simulator reaches it through the controller (ControllerContext, class attributes),
    # never by importing a mode: no sim -> controller.<mode> import (test below)
    "umctl.sim": {"umctl.events", "umctl.workload", "umctl.controller", "umctl.loop", "umctl.results"},
    "umctl.sources": {"umctl.events", "umctl.driver", "umctl.bpf", "umctl.workload"},
    "umctl.actuators": {"umctl.events", "umctl.driver", "umctl.bpf", "umctl.runtime"},
    "umctl.cluster": {"umctl.controller", "umctl.runtime"},
    "umctl.live": {"umctl.events", "umctl.driver", "umctl.runtime", "umctl.sources", "umctl.actuators",
                   "umctl.controller", "umctl.loop", "umctl.results"},
    # exporter -> live: the agent is a view over live.fleet's Fleet, and the control-state
    # publisher registers itself as an observer of control loops (live/observers.py)
    "umctl.exporter": {"umctl.events", "umctl.driver", "umctl.sources", "umctl.live"},
    # report -> exporter: the prometheus reporter renders the exporter's state with its collector
    "umctl.report": {"umctl.events", "umctl.live", "umctl.loop", "umctl.sim", "umctl.results", "umctl.exporter"},
    "umctl.tui": {"umctl.live", "umctl.report"},   # report.live: the shared summary formatters
    "umctl.cli": {"umctl.events", "umctl.driver", "umctl.workload", "umctl.controller", "umctl.sim",
                  "umctl.sources", "umctl.live", "umctl.exporter", "umctl.cluster", "umctl.report",
                  "umctl.tui", "umctl.results"},
}
EVERYWHERE = {"umctl", "umctl.units", "umctl.interrupts"}


def _package(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else parts[0]


def test_every_import_between_packages_is_in_the_allowed_table():
    graph = import_graph()
    found = {}
    for m, deps in graph.items():
        a = _package(m)
        for d in deps:
            b = _package(d)
            if b != a and b not in EVERYWHERE:
                found.setdefault((a, b), m)
    packages = {_package(m) for m in graph} - EVERYWHERE
    assert packages <= set(ALLOWED), sorted(packages - set(ALLOWED))   # a new package gets a row
    extra = {f"{a} -> {b} (in {m})" for (a, b), m in found.items() if b not in ALLOWED.get(a, set())}
    assert not extra, sorted(extra)


def test_the_allowed_table_has_no_cycle():
    assert cycles({a: set(bs) for a, bs in ALLOWED.items()}) == []


# ---------------------------------------------------------------------- the one control loop
def _arrows_in_architecture_md() -> dict[str, set[str]]:
    """The package table of ARCHITECTURE.md (the fenced block after "## Which package imports
    which"): one line per package, ``NAME → A, B`` or ``NAME → nothing``."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    block = text.split("## Which package imports which", 1)[1].split("```", 2)[1]
    out = {}
    for line in block.strip().splitlines():
        name, _, deps = line.partition("→")
        deps = deps.strip()
        out[f"umctl.{name.strip()}"] = (set() if deps == "nothing"
                                        else {f"umctl.{d.strip()}" for d in deps.split(",")})
    return out


def test_architecture_md_draws_the_allowed_table():
    assert _arrows_in_architecture_md() == ALLOWED


def test_the_simulator_has_no_loop_of_its_own():
    """The simulator hands its events to the ControlLoop and is its actuator: it filters no
    subscriptions, calls no controller's on_events, and imports no mode (what a mode needs
    reaches it through the controller: ControllerContext, class attributes)."""
    for p in (PKG / "sim").glob("*.py"):
        text = p.read_text()
        assert not re.search(r"\.subscribes\b|\.on_events\(", text), p.name
    graph = import_graph()
    modes = {d for m, deps in graph.items() if m.startswith("umctl.sim") for d in deps
             if d.startswith("umctl.controller.") and d not in ("umctl.controller.base", "umctl.controller.options")}
    assert modes == set()
    assert "self.loop.step(" in (PKG / "sim" / "engine.py").read_text()


def test_the_simulator_is_an_actuator():
    from simkit import sweep

    from umctl.controller.base import make_controller
    from umctl.loop.control import Actuator
    from umctl.sim.engine import Simulator
    from umctl.units import MiB

    sim = Simulator(sweep(64 * MiB, gpu_mem=128 * MiB), make_controller("none"))
    assert isinstance(sim, Actuator) and sim.loop.act is sim
