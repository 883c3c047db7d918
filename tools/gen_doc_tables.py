"""Regenerate the doc tables that come from committed benchmark results.

A table generated from a result file sits between two marker comments in any Markdown file of
the repository (docs/, README.md, benchmarks/README.md):

    <!-- generated: live_control.h100 -->
    ... (rewritten by this script) ...
    <!-- end generated -->

NAME is the result file's name under benchmarks/results/ without ``.json``. Its table is
printed by the benchmark's own table function, the one the benchmark prints with when it runs,
so a committed result reads exactly as the run printed it:

    live_control*     benchmarks/gpu/live_control.py     format_report(summary, goals, conditions)
    stress_runtime*   benchmarks/gpu/stress_runtime.py   run_line(run) per run, summary_line(...)
    attach_overhead*  benchmarks/gpu/attach_overhead.py  format_table(rows, faults_per_s)

    python3 tools/gen_doc_tables.py            # rewrite every generated block
    python3 tools/gen_doc_tables.py --check    # exit 1 if a block is stale or names no result
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
GPU_BENCH = ROOT / "benchmarks" / "gpu"

BLOCK = re.compile(r"(<!-- generated: (?P<name>[\w.+-]+) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.S)


def _bench(module: str):
    """A benchmark module of benchmarks/gpu/ (they import only the standard library at the top)."""
    if str(GPU_BENCH) not in sys.path:
        sys.path.insert(0, str(GPU_BENCH))
    return __import__(module)


def live_control(d: dict) -> str:
    lc = _bench("live_control")
    return lc.format_report(d["summary"], d["goals"], d["conditions"]).strip("\n")


def stress_runtime(d: dict) -> str:
    sr = _bench("stress_runtime")
    cmd = d["command"]
    mode = cmd[cmd.index("--mode") + 1] if "--mode" in cmd else "?"
    script = next((w for w in cmd[cmd.index("--") + 1:] if w.endswith(".py")), "?") if "--" in cmd else "?"
    program = os.path.splitext(os.path.basename(script))[0]
    lines = ["stress: " + " ".join(cmd), *(sr.run_line(r) for r in d["runs"]), "",
             sr.summary_line(program, mode, d["budget"], d["runs"], len(d["runs"]), d["identical"],
                             d["plain_checksum"])]
    return "\n".join(lines)


def attach_overhead(d: dict) -> str:
    ao = _bench("attach_overhead")
    return ao.format_table(d["rows"], d.get("faults_per_s"))


#: result-name prefix -> the function that prints its table (longest prefix wins)
GENERATORS: dict[str, Callable[[dict], str]] = {
    "live_control": live_control,
    "stress_runtime": stress_runtime,
    "attach_overhead": attach_overhead,
}


def table(name: str) -> str:
    """The generated block's body for result NAME (benchmarks/results/NAME.json)."""
    path = RESULTS / f"{name}.json"
    if not path.is_file():
        raise LookupError(f"no result file benchmarks/results/{name}.json")
    prefix = max((p for p in GENERATORS if name.startswith(p)), key=len, default=None)
    if prefix is None:
        raise LookupError(f"no table function for {name} (known: {', '.join(GENERATORS)})")
    with open(path) as f:
        data = json.load(f)
    # trailing blanks dropped (editors strip them, which would make a fresh block look stale)
    body = "\n".join(line.rstrip() for line in GENERATORS[prefix](data).splitlines())
    return f"```text\n{body}\n```\n"


def documents() -> list[Path]:
    """The Markdown files that may hold generated blocks."""
    docs = sorted((ROOT / "docs").rglob("*.md"))
    return [p for p in [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *docs] if p.is_file()]


def regenerate(text: str) -> str:
    return BLOCK.sub(lambda m: m.group(1) + table(m.group("name")) + m.group(4), text)


def blocks() -> list[tuple[Path, str]]:
    """Every generated block in the repository's docs, as (file, result name)."""
    return [(p, m.group("name")) for p in documents() for m in BLOCK.finditer(p.read_text())]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a generated block is stale; write nothing")
    a = ap.parse_args(argv)
    stale, errors, n = [], [], 0
    for path in documents():
        old = path.read_text()
        n += len(BLOCK.findall(old))
        try:
            new = regenerate(old)
        except LookupError as e:
            errors.append(f"{path.relative_to(ROOT)}: {e}")
            continue
        if new != old:
            stale.append(path)
            if not a.check:
                path.write_text(new)
                print(f"rewrote {path.relative_to(ROOT)}")
    for e in errors:
        print(f"gen_doc_tables: {e}", file=sys.stderr)
    if a.check and stale:
        print("stale generated tables in " + ", ".join(str(p.relative_to(ROOT)) for p in stale)
              + ": run python3 tools/gen_doc_tables.py", file=sys.stderr)
    if not a.check:
        print(f"{n} generated block(s), {len(stale)} file(s) rewritten")
    return 1 if errors or (a.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
