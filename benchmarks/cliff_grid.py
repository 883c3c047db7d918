"""No cliffs: every mode against ``none`` on every shipped DNN scenario at
oversubscription 1.25, 1.5, 2, 3 and 4, at fit scale.

Each cell is one scenario at one oversubscription, replayed under every mode that applies to
it (what ``umctl replay SCENARIO -m all`` runs) for ``--iters`` iterations (default 2). Per
mode the cell keeps the mode's time over ``none``'s (the *slowdown*: above 1 is slower than
``none``), its ``pct_of_bound`` (:mod:`umctl.sim.bound`), bytes moved host-to-GPU, the
prefetch accuracy and the fault causes. Prints a markdown table of the worst slowdown per mode
and scenario over the oversubscriptions (the ratio and where it happened); a cell worse than
``--limit`` (1.10: 10 % slower than ``none``) is marked ``**bold** ✗``, and the cliffs are
listed below the table with their numbers. Asserts nothing.

    python3 benchmarks/cliff_grid.py [--jobs 2] [--json out.json] [--iters 2]
                                     [--scenarios gpt2-xl,...] [--oversub 1.25,1.5,2,3,4]
                                     [-O deepum.degree=8] [--quick]

``--quick``: one small scenario (bert-base) at 1.25 and 3, one iteration: the test's subset.
Uses the public replay API (``run_modes``, ``result_rows``, ``workload_bound``), one process
per cell (``--jobs``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor

OVERSUBS = (1.25, 1.5, 2.0, 3.0, 4.0)
LIMIT = 1.10
QUICK = {"scenarios": ["bert-base"], "oversub": [1.25, 3.0], "iters": 1}


def dnn_scenarios() -> list[str]:
    from umctl.workload.scenario import list_scenarios

    return [i.name for i in list_scenarios("dnn")]


def run_cell(scenario: str, oversub: float, iters: int, options: dict | None = None) -> dict:
    """One scenario at one oversubscription under every mode that applies: a dict with the
    cell's key and one row per mode (``none`` first)."""
    from umctl.controller import make_controller
    from umctl.sim.replay import parse_modes, result_rows, run_modes, workload_bound
    from umctl.workload.scenario import load_scenario

    options = options or {}
    w = load_scenario(scenario, {"oversub": str(oversub), "iterations": str(iters), "scale": "fit"})
    modes = [m for m in parse_modes("all") if not make_controller(m, **options.get(m, {})).applies_to(w)]
    t0 = time.perf_counter()
    results = run_modes(w, modes, mode_options=options)
    rows = result_rows(results, workload_bound(w))
    wall = time.perf_counter() - t0
    base = rows[0]
    assert base["mode"] == "none"
    out = []
    for r in rows:
        out.append({
            "mode": r["mode"],
            "time_s": r["time_s"],
            "slowdown": r["time_s"] / base["time_s"] if base["time_s"] else None,
            "steady_slowdown": 1.0 / r["steady_speedup"] if r.get("steady_speedup") else None,
            "pct_of_bound": r.get("pct_of_bound"),
            "faults": r["faults"],
            "bytes_h2d": r["bytes_h2d"],
            "bytes_d2h": r["bytes_d2h"],
            "user_prefetch_bytes": r.get("user_prefetch_bytes"),
            "driver_prefetch_bytes": r.get("driver_prefetch_bytes"),
            "evictions": r["evictions"],
            "preevictions": r.get("preevictions"),
            "prefetch_accuracy": r.get("prefetch_accuracy"),
            "prefetch_coverage": r.get("prefetch_coverage"),
            "fault_causes": r.get("fault_causes"),
        })
    return {"scenario": scenario, "oversub": oversub, "iters": iters,
            "managed_bytes": int(w.managed_bytes), "gpu_mem": int(w.gpu_mem[0]),
            "wall_s": wall, "rows": out}


def _run_cell_args(args):
    return run_cell(*args)


# -- the table ---------------------------------------------------------------------------------
def worst(cells: list[dict]) -> dict[tuple[str, str], dict]:
    """(mode, scenario) -> the cell row with the largest slowdown over the oversubscriptions,
    with its ``oversub`` added."""
    out: dict[tuple[str, str], dict] = {}
    for c in cells:
        for r in c["rows"]:
            if r["mode"] == "none" or r["slowdown"] is None:
                continue
            key = (r["mode"], c["scenario"])
            if key not in out or r["slowdown"] > out[key]["slowdown"]:
                out[key] = dict(r, oversub=c["oversub"])
    return out


def fmt_cell(row: dict | None, limit: float = LIMIT) -> str:
    """'0.62× @3' (the worst slowdown and its oversubscription), '**12.60× @3** ✗' above the
    limit, '–' where the mode did not run."""
    if row is None:
        return "–"
    text = f"{row['slowdown']:.2f}× @{row['oversub']:g}"
    return f"**{text}** ✗" if is_cliff(row, limit) else text


def is_cliff(row: dict, limit: float = LIMIT) -> bool:
    return row["slowdown"] is not None and row["slowdown"] > limit


def markdown_table(cells: list[dict], limit: float = LIMIT) -> str:
    """Rows: modes (in the order they ran); columns: scenarios; each entry the worst slowdown
    over ``none`` and the oversubscription where it was."""
    w = worst(cells)
    scenarios = list(dict.fromkeys(c["scenario"] for c in cells))
    modes = list(dict.fromkeys(r["mode"] for c in cells for r in c["rows"] if r["mode"] != "none"))
    lines = ["| mode | " + " | ".join(scenarios) + " |",
             "| --- |" + " --- |" * len(scenarios)]
    for m in modes:
        lines.append(f"| `{m}` | " + " | ".join(fmt_cell(w.get((m, s)), limit) for s in scenarios) + " |")
    return "\n".join(lines)


def parse_table(text: str) -> dict[tuple[str, str], tuple[float, float, bool]]:
    """The inverse of :func:`markdown_table`: (mode, scenario) -> (slowdown, oversub, marked)."""
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    head = [h.strip() for h in lines[0].strip("|").split("|")]
    out = {}
    for ln in lines[2:]:
        parts = [p.strip() for p in ln.strip().strip("|").split("|")]
        mode = parts[0].strip("`")
        for s, p in zip(head[1:], parts[1:]):
            if p == "–":
                continue
            marked = p.endswith("✗")
            core = p.replace("✗", "").replace("**", "").strip()
            ratio, at = core.split("× @")
            out[(mode, s)] = (float(ratio), float(at), marked)
    return out


def cliffs(cells: list[dict], limit: float = LIMIT) -> list[dict]:
    """Every (cell, mode) slower than ``limit`` × none, worst first."""
    out = []
    for c in cells:
        base = c["rows"][0]
        for r in c["rows"]:
            if r["mode"] != "none" and is_cliff(r, limit):
                out.append(dict(r, scenario=c["scenario"], oversub=c["oversub"],
                                managed_bytes=c["managed_bytes"], none=base))
    return sorted(out, key=lambda r: -r["slowdown"])


def _top_causes(causes: dict | None, n: int = 3) -> str:
    if not causes:
        return "-"
    tot = sum(causes.values()) or 1
    items = sorted(causes.items(), key=lambda kv: -kv[1])[:n]
    return ", ".join(f"{k} {100 * v / tot:.0f}%" for k, v in items if v)


def cliff_lines(cl: list[dict]) -> str:
    if not cl:
        return "No cell is slower than the limit."
    lines = ["| scenario | oversub | mode | × none | % of bound | H2D (× none) | H2D / footprint | "
             "prefetch acc. | faults (× none) | top fault causes |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in cl:
        n = r["none"]
        acc = "-" if r["prefetch_accuracy"] is None else f"{100 * r['prefetch_accuracy']:.1f}%"
        pob = "-" if r["pct_of_bound"] is None else f"{r['pct_of_bound']:.0f}%"
        lines.append(
            f"| {r['scenario']} | {r['oversub']:g} | `{r['mode']}` | {r['slowdown']:.2f} | {pob} | "
            f"{r['bytes_h2d'] / 2**30:.2f} GiB ({r['bytes_h2d'] / max(n['bytes_h2d'], 1):.2f}) | "
            f"{r['bytes_h2d'] / r['managed_bytes']:.1f} | {acc} | "
            f"{r['faults']:,} ({r['faults'] / max(n['faults'], 1):.2f}) | {_top_causes(r['fault_causes'])} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenarios", help="comma-separated (default: every shipped dnn scenario)")
    ap.add_argument("--oversub", help="comma-separated ratios (default 1.25,1.5,2,3,4)")
    ap.add_argument("--iters", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json", help="write every cell (every mode's row) to this file")
    ap.add_argument("--limit", type=float, default=LIMIT)
    ap.add_argument("-O", dest="options", action="append", default=[], help="mode option, e.g. deepum.degree=8")
    ap.add_argument("--quick", action="store_true", help="the test's subset: bert-base at 1.25 and 3, 1 iteration")
    a = ap.parse_args(argv)

    from umctl.controller.options import parse_mode_options

    scenarios = QUICK["scenarios"] if a.quick else (a.scenarios.split(",") if a.scenarios else dnn_scenarios())
    ratios = QUICK["oversub"] if a.quick else ([float(x) for x in a.oversub.split(",")] if a.oversub else list(OVERSUBS))
    iters = QUICK["iters"] if a.quick else a.iters
    from umctl.sim.replay import parse_modes

    options = parse_mode_options(a.options, parse_modes("all")) if a.options else {}
    jobs = [(s, x, iters, options) for s in scenarios for x in ratios]
    t0 = time.perf_counter()
    if a.jobs > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(a.jobs) as ex:
            cells = list(ex.map(_run_cell_args, jobs))
    else:
        cells = [run_cell(*j) for j in jobs]
    wall = time.perf_counter() - t0

    print(f"Worst slowdown over `none` per mode and scenario (time ÷ none's time, {iters} iterations, "
          f"fit scale, oversubscription {', '.join(f'{x:g}' for x in ratios)}; "
          f"**bold** ✗ = more than {a.limit:.2f}× none)\n")
    print(markdown_table(cells, a.limit))
    print("\nCells slower than the limit:\n")
    print(cliff_lines(cliffs(cells, a.limit)))
    print(f"\n{len(cells)} cells in {wall:.0f} s wall, {a.jobs} jobs, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, Python {platform.python_version()}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"iters": iters, "limit": a.limit, "options": a.options, "wall_s": wall,
                       "jobs": a.jobs, "cells": cells}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
