"""Shared format of the paper-vs-replay benchmarks (issue 23): one :class:`Row` per published
number, its umctl value, the relative error, a rich table, ``--json`` and a ``--png`` figure.

A paper's number is a check, not a target: at most two rows per paper may be *fitted* (a
constant was chosen so that row comes out right; the row says so), every other row is a
*prediction*, and only predictions count in the median |error| that the issue's goal
("median |error| <= 25 %") is judged on. A row whose number umctl cannot produce (the paper's
configuration is not modelled) keeps ``umctl_value=None`` and its reason in ``note``: it stays
visible in the table instead of silently vanishing, and counts in no statistic.

Each paper script is ``python3 benchmarks/papers/X.py [--json] [--png out.png]``; progress goes
to stderr so that ``--json`` output stays one JSON document on stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import textwrap
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, Sequence

#: The issue's goal for each paper's predicted rows.
GOAL = 0.25


@dataclass
class Row:
    """One published number and what umctl's replay gives for the same configuration."""

    paper: str           # seed, e.g. "HUM (PPoPP'20)"
    table: str           # where in the paper: "Table 7.11", "Figure 6 / §6.2.1 text"
    row: str             # the configuration: application, case, variant
    metric: str          # what the number is: "speedup over CUDA", "speedup over Base"
    paper_value: float
    umctl_value: float | None = None
    fitted: bool = False  # a constant was chosen to make this row right: not a prediction
    note: str = ""
    extra: dict = field(default_factory=dict)  # umctl-side detail worth keeping in --json

    @property
    def error(self) -> float | None:
        """Relative error of umctl against the paper, (umctl - paper) / paper; None without a
        umctl value. Speedups near 1 make small absolute misses look small, which is why the
        figure also shows the y = x line: a row's distance from it is the miss."""
        if self.umctl_value is None or not self.paper_value:
            return None
        return (self.umctl_value - self.paper_value) / self.paper_value

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(error=self.error)
        if not d["extra"]:
            del d["extra"]
        return d


def predicted(rows: Iterable[Row]) -> list[Row]:
    """The rows that judge the model: not fitted, with a umctl value."""
    return [r for r in rows if not r.fitted and r.error is not None]


def median_abs_error(rows: Iterable[Row]) -> float | None:
    """Median |relative error| over the predicted rows (fitted rows would flatter it)."""
    errs = [abs(r.error) for r in predicted(rows)]
    return statistics.median(errs) if errs else None


def summary(rows: Sequence[Row]) -> str:
    """One line: how many rows, fitted, not modelled, and the median |error| against the goal."""
    pred = predicted(rows)
    fitted = [r for r in rows if r.fitted]
    missing = [r for r in rows if r.umctl_value is None]
    med = median_abs_error(rows)
    verdict = "n/a" if med is None else (f"{med * 100:.1f} % ({'meets' if med <= GOAL else 'misses'} "
                                          f"the {GOAL * 100:.0f} % goal)")
    return (f"{len(rows)} rows: {len(pred)} predicted, {len(fitted)} fitted"
            f"{' (' + ', '.join(dict.fromkeys(r.row for r in fitted)) + ')' if fitted else ''}, "
            f"{len(missing)} not modelled; median |error| over predicted rows: {verdict}")


def _fmt(x: float | None, digits: int = 3) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def print_table(rows: Sequence[Row], title: str, file=None) -> None:
    """The rows as a rich table: paper value, umctl value, error, fitted, note."""
    from rich.console import Console
    from rich.table import Table

    con = Console(file=file or sys.stdout, width=200)
    t = Table(title=title, title_justify="left")
    for col, just in (("table", "left"), ("row", "left"), ("metric", "left"), ("paper", "right"),
                      ("umctl", "right"), ("error", "right"), ("fit", "center"), ("note", "left")):
        t.add_column(col, justify=just, overflow="fold")
    for r in rows:
        err = r.error
        style = "" if err is None else ("green" if abs(err) <= GOAL else "red")
        t.add_row(r.table, r.row, r.metric, _fmt(r.paper_value), _fmt(r.umctl_value),
                  "" if err is None else f"[{style}]{err * 100:+.1f} %[/]", "fitted" if r.fitted else "",
                  r.note)
    con.print(t)
    con.print(summary(rows))


def figure(rows: Sequence[Row], path: str, title: str) -> None:
    """Paper value against umctl value, one point per row with both, the y = x line and the
    ±25 % band: a point's distance from the line is its miss, whatever the metric's scale.
    Points are coloured by metric, or by ``extra["group"]`` where a script sets one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    have = [r for r in rows if r.umctl_value is not None]
    if not have:
        raise SystemExit(f"error: no row has a umctl value to draw in {path}")
    def group(r: Row) -> str:   # a script may colour by something finer than the metric
        return str(r.extra.get("group", r.metric))

    metrics = sorted({group(r) for r in have})
    markers = "osD^v<>p*h"
    fig, ax = plt.subplots(figsize=(6.4, 6.0))
    xs = [r.paper_value for r in have] + [r.umctl_value for r in have]
    lo, hi = min(xs) * 0.8, max(xs) * 1.2
    line = [lo, hi]
    ax.plot(line, line, color="0.3", lw=1, label="y = x")
    ax.fill_between(line, [v * (1 - GOAL) for v in line], [v * (1 + GOAL) for v in line], color="0.85",
                    label=f"±{GOAL * 100:.0f} %")
    for i, m in enumerate(metrics):
        for fitted in (False, True):
            pts = [r for r in have if group(r) == m and r.fitted == fitted]
            if pts:
                ax.scatter([r.paper_value for r in pts], [r.umctl_value for r in pts],
                           marker=markers[i % len(markers)], s=36,
                           facecolors="none" if fitted else f"C{i}", edgecolors=f"C{i}",
                           label=f"{m}{' (fitted)' if fitted else ''}")
    if hi / max(lo, 1e-9) > 20:
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("paper")
    ax.set_ylabel("umctl replay")
    med = median_abs_error(rows)
    ax.set_title(f"{textwrap.fill(title, 64)}\nmedian |error| (predicted rows) = {'n/a' if med is None else f'{med * 100:.1f} %'}",
                 fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    ax.set_aspect("equal", adjustable="box")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


class ResultCache:
    """Replay results kept in a JSON file as soon as each replay ends and reused after: the
    full-scale replays take minutes to an hour each on two cores, so a run can be split over
    processes (each caching into the same file) or resumed after a stop, then printed whole.
    A key holds everything the result depends on that a caller can name (configuration,
    parameters, calibration); a change to the simulator's code is not in it, so start a new
    file after one. ``path=None`` caches nothing."""

    def __init__(self, path: str | None) -> None:
        self.path = path

    def _stored(self) -> dict:
        import os

        if not self.path or not os.path.exists(self.path):
            return {}
        try:
            with open(self.path) as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            raise SystemExit(f"error: cache {self.path}: not a readable JSON file ({e})") from None
        if not isinstance(data, dict):
            raise SystemExit(f"error: cache {self.path}: not a cache this script wrote")
        return data

    @staticmethod
    def key(*parts) -> str:
        return json.dumps(parts, sort_keys=True, default=str)

    def get(self, key: str):
        return self._stored().get(key)

    def put(self, key: str, value) -> None:
        """Add one result. Under a lock, re-read first: another process may have added its own
        meanwhile; the file is replaced whole, so a reader never sees half of it."""
        import fcntl
        import os

        if not self.path:
            return
        with open(self.path + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            kept = self._stored()
            kept[key] = value
            tmp = f"{self.path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump(kept, f)
            os.replace(tmp, self.path)


def parser(description: str) -> argparse.ArgumentParser:
    """The arguments every paper script takes."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--json", action="store_true", help="print the rows as a JSON list instead of a table")
    ap.add_argument("--png", metavar="PATH", default=None, help="draw paper vs umctl (y = x) to PATH")
    return ap


def emit(rows: Sequence[Row], args: argparse.Namespace, title: str,
         drawn: Callable[[Row], bool] | None = None) -> None:
    """Print the rows (table or JSON) and draw the figure when asked: of the rows ``drawn``
    selects (all by default; a paper whose rows mix seconds and fault ratios draws one kind)."""
    if args.json:
        json.dump([r.as_dict() for r in rows], sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print_table(rows, title)
    if args.png:
        figure([r for r in rows if drawn is None or drawn(r)], args.png, title)
        print(f"wrote {args.png}", file=sys.stderr)


class Progress:
    """'[3/12] what' lines on stderr: replays at a paper's own size take minutes on two cores,
    and stdout must stay clean for --json."""

    def __init__(self, total: int):
        self.total, self.done = total, 0

    def step(self, what: str) -> None:
        self.done += 1
        print(f"[{self.done}/{self.total}] {what}", file=sys.stderr, flush=True)


def run_main(build: Callable[[argparse.Namespace], list[Row]], description: str, title: str,
             configure: Callable[[argparse.ArgumentParser], None] | None = None,
             drawn: Callable[[Row], bool] | None = None) -> None:
    """A paper script's main: parse, build the rows, emit them; a UmctlError (bad calibration
    name, bad scenario parameter) is one line on stderr and exit status 1, not a traceback."""
    from umctl import UmctlError

    ap = parser(description)
    if configure:
        configure(ap)
    args = ap.parse_args()
    try:
        rows = build(args)
    except UmctlError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    emit(rows, args, title, drawn)


def geomean(xs: Iterable[float]) -> float:
    xs = list(xs)
    return math.exp(sum(math.log(x) for x in xs) / len(xs))
