"""Every link in the docs leads somewhere, every doc path named in the code exists, and the
docs read as documentation, not as a lab notebook (no dated entries, no issue numbers, no
"superseded" tables, no commit hashes)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").rglob("*.md"))
PAGES = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", ROOT / "benchmarks" / "README.md", *DOCS]
#: pages moved in unchanged while their owners rewrite them: the notebook check skips them
NOTEBOOK_PENDING: set[str] = set()
#: files whose doc links their owners are changing at the same time (umctl/live/): skipped by
#: the code check until then; delete an entry once its file points at docs/guide|evaluation/
LINKS_PENDING: set[str] = set()

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    out: set[str] = set()
    for line in FENCE.sub("", page.read_text()).splitlines():
        m = re.match(r"^#{1,6} (.*)$", line)
        if m:
            base = slug(m.group(1))
            name, n = base, 0
            while name in out:
                n += 1
                name = f"{base}-{n}"
            out.add(name)
    return out


def test_the_docs_are_split_into_guide_reference_and_evaluation():
    tops = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert tops == {"README.md"}, tops
    for part in ("guide", "reference", "evaluation"):
        assert list((ROOT / "docs" / part).glob("*.md")), part


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_relative_link_resolves(page):
    text = FENCE.sub("", page.read_text())
    bad = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(target)
    assert bad == []


def test_every_doc_page_is_in_the_index():
    index = (ROOT / "docs" / "README.md").read_text()
    missing = [_rel(p) for p in DOCS if p.name != "README.md" and str(p.relative_to(ROOT / "docs")) not in index]
    assert missing == []


def _code_files():
    for folder in ("umctl", "tests", "benchmarks", "tools", "deploy", "kmod", "bpf", "runtime", ".ci"):
        for p in (ROOT / folder).rglob("*"):
            if p.is_file() and "__pycache__" not in p.parts and p.suffix in (
                    ".py", ".sh", ".c", ".h", ".json", ".md", ".service", "") and p.stat().st_size < 2_000_000:
                yield p


def test_every_docs_path_named_in_code_exists():
    """Comments, docstrings, CLI help and scripts point at docs/ pages that exist."""
    pat = re.compile(r"\bdocs/[\w./-]*\w")
    bad = []
    for p in [*_code_files(), ROOT / "README.md", ROOT / "ARCHITECTURE.md"]:
        if _rel(p) in LINKS_PENDING:
            continue
        for m in pat.findall(p.read_text(errors="replace")):
            if not (ROOT / m).exists():
                bad.append(f"{_rel(p)}: {m}")
    assert bad == []


@pytest.mark.parametrize("page", [p for p in DOCS if _rel(p) not in NOTEBOOK_PENDING], ids=_rel)
def test_docs_are_not_a_lab_notebook(page):
    text = FENCE.sub("", page.read_text())
    found = []
    for what, pat in (("a date", r"\b20\d\d-\d\d-\d\d\b"), ("an issue number", r"\b[Ii]ssue \d+|(?<![\w&])#\d{2,}\b"),
                      ("a superseded table", r"[Ss]upersed"), ("a commit hash", r"\bcommits? [0-9a-f]{7,}\b|\([0-9a-f]{7}\)")):
        found += [f"{what}: {m}" for m in re.findall(pat, text)]
    assert found == []
