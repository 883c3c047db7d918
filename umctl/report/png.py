"""The replay figure (per-mode time, faults, traffic, and faults over time) and HUM-style
timelines: the ``png`` and ``timeline`` reporters of a replay; the sweep's figure."""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")  # no display on servers and in CI
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .. import UmctlError  # noqa: E402
from ..results import ReplayReport, ReplayResult  # noqa: E402
from ..sim.engine import SimResult  # noqa: E402
from ..units import GiB  # noqa: E402


def save_figure(fig, path: str, what: str = "figure") -> None:
    """Write ``fig`` to ``path`` as a PNG, under exactly that name (an explicit format: matplotlib
    appends ".png" to a name without an ending otherwise), and close it. An OSError (a full
    disk, a directory that went away) is one line naming the file: the replay before it may
    have taken minutes, and a traceback would bury why the figure is missing."""
    try:
        fig.savefig(path, dpi=110, format="png")
    except OSError as e:
        raise UmctlError(f"{path}: cannot write the {what}: {e.strerror or e}") from None
    finally:
        plt.close(fig)


def replay_png(results: list[SimResult], rows: list[ReplayResult], path: str, title: str) -> None:
    """Four panels: run time split into compute, fault stalls and the rest (with the speedup
    over none), GPU faults, traffic each way, and cumulative faults over simulated time."""
    modes = [r.mode for r in results]
    colors = plt.cm.tab10(np.arange(len(modes)) % 10)
    fig, ax = plt.subplots(2, 2, figsize=(12, 8))
    fig.suptitle(title, fontsize=11)

    a = ax[0, 0]
    compute = np.array([r.compute_ns / 1e9 for r in results])
    total = np.array([r.time_s for r in results])
    stall = np.minimum(np.array([r.stall_ns / 1e9 for r in results]), total - np.minimum(compute, total))
    other = np.maximum(0.0, total - compute - stall)
    a.bar(modes, compute, color="#4c72b0", label="kernels computing")
    a.bar(modes, stall, bottom=compute, color="#dd8452", label="stalled on faults")
    a.bar(modes, other, bottom=compute + stall, color="#bbbbbb", label="copies / host")
    for x, (t, row) in enumerate(zip(total, rows)):
        a.annotate(f"{row.speedup:.2f}×", (x, t), ha="center", va="bottom", fontsize=9)
    a.set_ylabel("simulated time (s)")
    a.set_title("run time (speedup over none)")
    a.legend(fontsize=8)

    a = ax[0, 1]
    a.bar(modes, [r.faults for r in results], color=colors)
    a.set_ylabel("GPU faults (distinct pages per batch)")
    a.set_title("GPU page faults")

    a = ax[1, 0]
    x = np.arange(len(modes))
    wdt = 0.38
    a.bar(x - wdt / 2, [r.bytes_h2d / GiB for r in results], wdt, label="host→GPU")
    a.bar(x + wdt / 2, [r.bytes_d2h / GiB for r in results], wdt, label="GPU→host")
    a.set_xticks(x, modes)
    a.set_ylabel("GiB moved")
    a.set_title("traffic")
    a.legend()

    a = ax[1, 1]
    for r, col in zip(results, colors):
        if r.kernel_end_ns is None or len(r.kernel_end_ns) == 0:
            continue
        order = np.argsort(r.kernel_end_ns, kind="stable")
        a.plot(r.kernel_end_ns[order] / 1e9, np.cumsum(r.kernel_faults[order]), label=r.mode, color=col)
    a.set_xlabel("simulated time (s)")
    a.set_ylabel("cumulative GPU faults")
    a.set_title("faults over time")
    a.legend()
    fig.tight_layout()
    save_figure(fig, path)


def sweep_png(sweeps: dict[str, list[dict]], path: str, title: str) -> None:
    """One bar panel per sweep: speedup of each point over the paper's reference point."""
    fig, axes = plt.subplots(1, len(sweeps), figsize=(6.5 * len(sweeps), 4.2), squeeze=False)
    refs = {"table": "speedup over Config0 (DeepUM table 6 / figure 12)",
            "degree": "speedup over N = 8 (DeepUM figure 11)"}
    for a, (what, rows) in zip(axes[0], sweeps.items()):
        labels = [r["point"] for r in rows]
        vals = [r["speedup"] for r in rows]
        best = int(np.argmax(vals))
        colors = ["#dd8452" if i == best else "#4c72b0" for i in range(len(vals))]
        a.bar(labels, vals, color=colors)
        a.axhline(1.0, color="grey", lw=0.8)
        lo = min(vals)
        a.set_ylim(max(0.0, lo - (max(vals) - lo) * 0.5 - 0.02), max(vals) * 1.02 + 0.01)
        a.set_ylabel(refs.get(what, "speedup"))
        a.tick_params(axis="x", rotation=45)
        a.set_title(what)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    save_figure(fig, path)


def timeline_png(results: list[SimResult], path: str, title: str, *, titles: list[str] | None = None) -> None:
    """HUM figure 8-style timelines, one panel per run: host, staging (chunked copies only),
    copy-engine and kernel lanes, bars coloured by the buffer they belong to. Needs results
    simulated with ``timeline=True``."""
    lanes = ["host", "stage", "copy", "kernel"]
    lane_names = {"host": "host", "stage": "staging\n(host→UM)", "copy": "H2D / D2H\ncopies", "kernel": "kernels"}
    end = max(r.time_ns for r in results) / 1e6
    fig, axes = plt.subplots(len(results), 1, figsize=(13, 1.9 + 1.25 * len(results)), sharex=True, squeeze=False)
    fig.suptitle(title, fontsize=11)
    groups = sorted({g for r in results for *_, g in (r.timeline or []) if g >= 0})
    palette = plt.cm.tab10(np.arange(max(1, len(groups))) % 10)
    color = {g: palette[i] for i, g in enumerate(groups)}
    for a, r, name in zip(axes[:, 0], results, titles or [r.mode for r in results]):
        if r.timeline is None:
            raise ValueError("timeline_png needs results simulated with timeline=True")
        used = [ln for ln in lanes if any(t[0] == ln for t in r.timeline)]
        y = {ln: len(used) - 1 - i for i, ln in enumerate(used)}
        for lane, label, t0, t1, grp in r.timeline:
            c = color.get(grp, "#999999" if "wait" not in label else "#d62728")
            if lane == "kernel":
                c = "#4c72b0"
            a.broken_barh([(t0 / 1e6, max(t1 - t0, 1.0) / 1e6)], (y[lane] - 0.38, 0.76), facecolors=c,
                          edgecolors="white" if lane != "copy" else "none", linewidth=0.3)
        a.set_yticks([y[ln] for ln in used], [lane_names[ln] for ln in used], fontsize=8)
        a.set_ylim(-0.6, len(used) - 0.4)
        a.set_title(f"{name}: {r.time_ns / 1e6:.1f} ms", fontsize=9, loc="left")
        a.set_xlim(0, end * 1.01)
        a.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("simulated time (ms); colours: buffers; red: host waiting on a write-protected page")
    fig.tight_layout()
    save_figure(fig, path, "timeline")


def _needs_sims(report: ReplayReport, what: str) -> list[SimResult]:
    if len(report.sims) != len(report.results):
        raise UmctlError(f"the replay {what} needs the simulator's own results (per-kernel series); "
                         "a replay read back from JSON has none")
    return report.sims


class ReplayPngReporter:
    """The replay figure (:func:`replay_png`), titled after the workload."""

    name = "png"
    to_file = True

    def render(self, result: ReplayReport, out) -> None:
        replay_png(_needs_sims(result, "figure"), result.results, os.fspath(out), f"umctl replay — {result.title}")


class TimelinePngReporter:
    """HUM figure 8-style timelines of every mode (:func:`timeline_png`); the replay must have
    been simulated with ``timeline=True``."""

    name = "timeline"
    to_file = True

    def render(self, result: ReplayReport, out) -> None:
        timeline_png(_needs_sims(result, "timeline"), os.fspath(out),
                     f"umctl replay — {result.workload_name}: host, copy and kernel timelines")
