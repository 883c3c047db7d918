"""The doc tables generated from committed benchmark results (tools/gen_doc_tables.py) are
current: ``--check`` exits 0. A result file changed, a benchmark's table function changed or a
block edited by hand fails here until ``python3 tools/gen_doc_tables.py`` is run."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("gen_doc_tables", ROOT / "tools" / "gen_doc_tables.py")
gen = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(gen)


def test_generated_doc_tables_are_current():
    p = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_doc_tables.py"), "--check"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr


def test_every_committed_table_result_is_printed_in_the_docs():
    """Each result file a table function exists for appears in some generated block, itself or
    through a printed result merged from it (``live_control.py --merge`` records its inputs)."""
    import json
    from pathlib import Path

    named = {name for _, name in gen.blocks()}
    for name in list(named):
        f = gen.RESULTS / f"{name}.json"
        if f.exists():
            named |= {Path(m.partition(":")[0]).stem for m in json.loads(f.read_text()).get("merged", [])}
    results = {p.stem for p in gen.RESULTS.glob("*.json")}
    printable = {r for r in results if any(r.startswith(prefix) for prefix in gen.GENERATORS)}
    assert printable and printable <= named, printable - named


def test_a_stale_or_unknown_block_is_found():
    good = gen.regenerate("x\n<!-- generated: attach_overhead.h100 -->\nold\n<!-- end generated -->\ny\n")
    assert "old" not in good and "default kinds" in good and good.startswith("x\n") and good.endswith("y\n")
    assert gen.regenerate(good) == good
    try:
        gen.regenerate("<!-- generated: no_such_result -->\n<!-- end generated -->\n")
    except LookupError as e:
        assert "no_such_result" in str(e)
    else:
        raise AssertionError("an unknown result name must be an error")


def test_the_tables_are_the_benchmarks_own():
    """The live-control block is exactly what live_control.format_report prints for the file."""
    import json

    lc = gen._bench("live_control")
    d = json.loads((gen.RESULTS / "live_control.h100.json").read_text())
    printed = lc.format_report(d["summary"], d["goals"], d["conditions"])
    body = gen.table("live_control.h100")
    assert [ln.rstrip() for ln in printed.strip("\n").splitlines()] == body.splitlines()[1:-1]
