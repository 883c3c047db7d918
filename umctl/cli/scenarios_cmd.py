"""``umctl scenarios``: the built-in scenarios, their families and parameters."""

from __future__ import annotations

import json
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from ..workload.scenario import ScenarioInfo, list_scenarios

#: Parameters every scenario has: shown dimmed, above the scenario's own.
_COMMON = ("oversub", "gpu_mem", "iterations", "seed")


def _fmt(value: object) -> str:
    if isinstance(value, list):
        text = ",".join(map(str, value))
        return text if len(text) <= 40 else text[:37] + "..."
    return str(value)


def _as_json(info: ScenarioInfo) -> dict:
    return {"name": info.name, "family": info.family, "generator": info.generator,
            "description": info.description, "source": info.source, "params": info.defaults(),
            "reference": info.reference}


def scenarios_command(
    family: Optional[str] = typer.Option(None, "--family", "-f", help="Only this family (dnn, embedding, graph, "
                                         "hum, multigpu, multitenant)."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON (one object per scenario) instead of a table."),
) -> None:
    """List the built-in scenarios with their parameters and defaults.

    Change any parameter of a replay with --param key=value (sizes like 1GiB; lists comma-separated).

    Example: umctl scenarios --family dnn, then umctl replay gpt2-xl --gpu-mem 1GiB --oversub 3 --param batch=5
    """
    infos = list_scenarios(family)
    console = Console()
    if json_out:
        console.print_json(json.dumps([_as_json(i) for i in infos]))
        return
    table = Table(title="umctl scenarios", show_lines=False)
    table.add_column("name", style="bold")
    table.add_column("family")
    table.add_column("description")
    table.add_column("parameters (defaults)", overflow="fold")
    for info in infos:
        d = info.defaults()
        common = " ".join(f"{k}={_fmt(d[k])}" for k in _COMMON)
        own = " ".join(f"{k}={_fmt(v)}" for k, v in d.items() if k not in _COMMON)
        table.add_row(info.name, info.family, info.description, f"[dim]{common}[/dim]\n{own}")
    console.print(table)
