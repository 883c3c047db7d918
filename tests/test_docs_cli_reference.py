"""docs/reference/cli.md is generated from the real command line (tools/gen_cli_reference.py)
and must match it: a new command, option, help text or default fails here until the page is
regenerated with ``python3 tools/gen_cli_reference.py``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("gen_cli_reference", ROOT / "tools" / "gen_cli_reference.py")
gen = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(gen)


def test_the_command_reference_is_current():
    page = ROOT / "docs" / "reference" / "cli.md"
    assert page.read_text() == gen.render(), "docs/reference/cli.md is stale: run python3 tools/gen_cli_reference.py"


def test_every_command_and_option_is_on_the_page():
    """The page is not merely equal to the generator's output: it names every command and every
    option of the real CLI, so a generator that dropped some would fail here."""
    from umctl.cli.main import command_tree

    text = gen.render()
    tree = command_tree()
    ctx = tree.context_class(tree, info_name="umctl")
    seen = 0
    todo = [(tree, ctx, "umctl")]
    while todo:
        cmd, c, path = todo.pop()
        assert f"#### {path}\n" in text or f"### {path}\n" in text or f"## {path}\n" in text, path
        for p in cmd.params:
            for opt in p.opts:
                assert opt in text, (path, opt)
                seen += 1
        if hasattr(cmd, "list_commands"):
            for name in cmd.list_commands(c):
                sub = cmd.get_command(c, name)
                todo.append((sub, sub.context_class(sub, info_name=name, parent=c), f"{path} {name}"))
    assert seen > 50


def test_the_check_mode_reports_a_stale_page(tmp_path):
    stale = tmp_path / "cli.md"
    stale.write_text("# Command reference\n")
    assert gen.main(["--check", "-o", str(stale)]) == 1
    assert gen.main(["-o", str(stale)]) == 0
    assert gen.main(["--check", "-o", str(stale)]) == 0


def test_rich_markup_becomes_markdown():
    paras, examples = gen._help("Do it.\n\nExamples:\n\n  [bold]umctl x --y[/bold]   (why)\n\n"
                                "Needs [bold]umctl attach[/bold] rights.")
    assert paras == ["Do it.", "Needs `umctl attach` rights."]
    assert examples == ["umctl x --y   # why"]
