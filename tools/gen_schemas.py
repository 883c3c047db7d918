"""Write the JSON Schema of every typed result (umctl/results.py) to docs/reference/schema/, or
check that the committed ones are current.

    python3 tools/gen_schemas.py           # write NAME.vVERSION.json for each result
    python3 tools/gen_schemas.py --check   # exit 1, naming them, if any is missing or stale

Why a tool and a committed copy: a reader of ``umctl ... --json`` (a dashboard, a notebook, a
benchmark script) validates against a file, and a change to a result must show in review as
a change to that file. The versioning rule (umctl/results.py) is enforced here: a version's
file is rewritten only with a compatible change (fields added with defaults, descriptions);
removing, renaming or retyping a field, or making one required, needs ``SCHEMA_VERSION``
bumped, which writes a new file and leaves the old version's file as it was, so documents of
the old version still validate against it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from umctl.results import RESULTS, Result, incompatible_changes  # noqa: E402

SCHEMA_DIR = ROOT / "docs" / "reference" / "schema"


def schema_path(cls: type[Result], directory: Path = SCHEMA_DIR) -> Path:
    """Where a result's schema of its current version lives."""
    return directory / f"{cls.SCHEMA_NAME}.v{cls.SCHEMA_VERSION}.json"


def render(cls: type[Result]) -> str:
    """The schema file's text: stable (sorted $defs, two-space indent, a final newline)."""
    return json.dumps(cls.json_schema(), indent=2, ensure_ascii=False) + "\n"


def problems(directory: Path = SCHEMA_DIR) -> list[str]:
    """What ``--check`` reports: each result whose current version's file is missing or
    differs from the generated one, and (worse) differs incompatibly."""
    out = []
    for cls in RESULTS:
        path = schema_path(cls, directory)
        if not path.exists():
            out.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: missing")
            continue
        text = path.read_text()
        if text != render(cls):
            bad = incompatible_changes(json.loads(text), cls.json_schema())
            why = (f"incompatible with the committed {cls.schema_id()} ({'; '.join(bad)}): bump "
                   f"{cls.__name__}.SCHEMA_VERSION" if bad else "stale: run python3 tools/gen_schemas.py")
            out.append(f"{path.name}: {why}")
    return out


def write(directory: Path = SCHEMA_DIR) -> list[str]:
    """Write every current version's file; refuse (SystemExit naming the fields) a change that
    is incompatible with that version's committed file. Returns the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    refused, written = [], []
    for cls in RESULTS:
        path = schema_path(cls, directory)
        if path.exists():
            bad = incompatible_changes(json.loads(path.read_text()), cls.json_schema())
            if bad:
                refused.append(f"{path.name}: {'; '.join(bad)} -- bump {cls.__name__}.SCHEMA_VERSION")
                continue
        text = render(cls)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            written.append(path.name)
    if refused:
        raise SystemExit("gen_schemas: refused, incompatible within a version:\n  " + "\n  ".join(refused))
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a schema file is missing or stale")
    ap.add_argument("--dir", type=Path, default=SCHEMA_DIR, help="where the schema files live (default: %(default)s)")
    a = ap.parse_args(argv)
    if a.check:
        bad = problems(a.dir)
        for line in bad:
            print(f"gen_schemas: {line}", file=sys.stderr)
        return 1 if bad else 0
    for name in write(a.dir):
        print(f"wrote {a.dir / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
