"""GPU benchmark (issue 34, §4–§5): live control of real PyTorch programs under a budget of half
their footprint, against the bound the budget allows.

For each program of benchmarks/gpu/programs/ (transformer, convnet, embedding, decoder, moe):

1. a plain run (no umctl) measures its footprint (``FOOTPRINT``: peak torch.cuda memory);
2. the budget is ``--budget-frac`` (50 %) of it;
3. conditions, in interleaved repetitions (round-robin order: P N D DP, N D DP P, D DP P N, …):
   ``plain`` (no umctl), ``none`` (``umctl run --runtime --managed --mode none --budget B``),
   ``deepum``, ``deepum-prefetch``.

Per program × condition it reports the median and min–max of the runs' steady step times (the
median of each run's steps after the first ``--skip`` (2)), GPU faults (umctl's summary),
whether every result is identical to the plain run's (``DONE … checksum``), ``budget_held``
(umctl's verdict: ``parse_umctl_summary``), the speedup over ``none`` -- printed only where
both runs held the budget -- and deepum's share of THE BOUND:

    bound = plain step time (the program fits: pure compute)
          + forced / H2D rate,   forced = max(0, touched per step - budget)

A lower bound on any mechanism: what lies beyond the budget must cross the link into the GPU at
least once a step, whether it is migrated in or read remotely; writing it back is not forced
(clean data needs none, and a run under ``--budget-hold admit`` reads over the link instead of
migrating). ``--with-d2h`` adds forced / D2H rate: the bound of a mechanism that must migrate
everything in and out (evict-after), which a remote-reading run may beat.

(``TOUCHED`` is the program's own estimate of the bytes one steady step reads or writes; H2D
50 GB/s and D2H 17 GB/s by default, or ``--calibration`` umctl/sim/calibrations/h100-r580.json).

Goals, each printed met / NOT met / unverified: deepum ≥ 2× none on transformer, convnet and
decoder; no program slower under deepum than under none by more than 5 %; every budget run
held its budget; deepum reaches ≥ 50 % of the bound on ≥ 3 programs; results identical.

``--replay`` (§5): each program's ``none`` run is also recorded (``umctl run -o X.parquet
--runtime --managed --mode none --budget B``) and replayed (``umctl replay X.parquet -m
none,deepum --gpu-mem B --json``); the replayed deepum/none speedup is compared with the live
one (within 25 % or not).

Everything stays inside ``--max-seconds`` (default 500): a run is started only if its expected
time (from earlier runs of the same program) fits; what was skipped is printed and kept in
``--json``.  This module imports no torch (the programs do), so its parsing, statistics, bound
and goals are unit-tested on the CPU (tests/test_live_control_bench.py).

  python3 benchmarks/gpu/live_control.py [--programs transformer,convnet] [--reps 3] [--replay]
                                         [--max-seconds 500] [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PROG_DIR = os.path.join(HERE, "programs")

#: name -> (script, default arguments). Footprints and plain steady steps seen on an H100 (2026-11-28,
#: smoke): transformer 1.86 GiB / 29 ms, convnet 2.33 GiB / 65 ms, embedding ~3.8 GiB / 15 ms,
#: decoder 2.84 GiB / 5 ms a token, moe 2.57 GiB / 55 ms (touched 2.1 GiB a step). A run costs
#: ~8-13 s of start-up (torch import, CUDA context, first kernels) on top of its steps.
PROGRAMS: dict[str, tuple[str, list[str]]] = {
    "transformer": ("transformer.py", ["--steps", "8"]),
    "convnet": ("convnet.py", ["--steps", "8"]),
    "embedding": ("embedding.py", ["--steps", "6"]),
    "decoder": ("decoder.py", ["--steps", "8"]),
    "moe": ("moe.py", ["--steps", "8"]),
}
CONDITIONS = ["plain", "none", "deepum", "deepum-prefetch"]
SHORT = {"plain": "P", "none": "N", "deepum": "D", "deepum-prefetch": "DP"}
GOAL_2X = ("transformer", "convnet", "decoder")
H2D_BPS, D2H_BPS = 50e9, 17e9


# -- parsing ---------------------------------------------------------------------------------

_UNITS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}
_SIZE = r"([0-9][0-9,]*\.?[0-9]*)\s*([KMGT]?)i?B\b"


def parse_size_text(text: str) -> int | None:
    """'1.50 GiB', '512 MiB', '3 GB', '12 B' -> bytes (binary multiples, as umctl prints them)."""
    m = re.search(_SIZE, text)
    return _size_of(m) if m else None


def _size_of(m: re.Match, first: int = 1) -> int:
    """Bytes of a match of ``_SIZE`` whose number and unit are groups ``first`` and ``first + 1``."""
    return int(float(m.group(first).replace(",", "")) * 1024 ** _UNITS[m.group(first + 1).lower()])


@dataclass
class ProgramOutput:
    steps: list[float] = field(default_factory=list)   # ms per step
    done_s: float | None = None
    checksum: str | None = None
    footprint: int | None = None                      # peak allocated bytes
    reserved: int | None = None
    touched: int | None = None


def parse_program_output(text: str) -> ProgramOutput:
    """The programs' ``STEP i ms``, ``FOOTPRINT b reserved=b``, ``TOUCHED b``, ``DONE s sum``."""
    o = ProgramOutput(steps=[float(x) for x in re.findall(r"^STEP \d+ ([\d.]+)", text, re.M)])
    if m := re.search(r"^DONE ([\d.]+) (\w+)", text, re.M):
        o.done_s, o.checksum = float(m.group(1)), m.group(2)
    if m := re.search(r"^FOOTPRINT (\d+)(?: reserved=(\d+))?", text, re.M):
        o.footprint = int(m.group(1))
        o.reserved = int(m.group(2)) if m.group(2) else None
    if m := re.search(r"^TOUCHED ([\d.]+)", text, re.M):
        o.touched = int(float(m.group(1)))
    return o


def _find_key(obj, names: tuple[str, ...]):
    """First value under any of ``names`` anywhere in a nested JSON object (None if absent)."""
    if isinstance(obj, dict):
        for n in names:
            if n in obj:
                return obj[n]
        for v in obj.values():
            r = _find_key(v, names)
            if r is not None:
                return r
    elif isinstance(obj, list):
        for v in obj:
            r = _find_key(v, names)
            if r is not None:
                return r
    return None


def parse_umctl_summary(text: str, summary_json: dict | None = None) -> dict:
    """What umctl's run summary says. THE one place that knows its format: adapt here.

    Keys: gpu_faults, cpu_faults, h2d_bytes, d2h_bytes, moved (umctl's own commands, by kind),
    budget_held (True / False / None = unverified or not said), true_peak_bytes, over_share
    (fraction of the time over the budget), verdict (the line it came from). A machine-readable
    summary (``summary_json``), when umctl wrote one, wins over the text for the budget keys."""
    r: dict = {"gpu_faults": None, "cpu_faults": None, "h2d_bytes": None, "d2h_bytes": None, "moved": {},
               "budget_held": None, "true_peak_bytes": None, "over_share": None, "verdict": None}
    if m := re.search(r"GPU faults\s+~?([\d,]+)", text):
        r["gpu_faults"] = int(m.group(1).replace(",", ""))
    if m := re.search(r"CPU faults\s+~?([\d,]+)", text):
        r["cpu_faults"] = int(m.group(1).replace(",", ""))
    if m := re.search(r"^\s*H2D\s+~?(.*)$", text, re.M):
        r["h2d_bytes"] = parse_size_text(m.group(1))
    if m := re.search(r"^\s*D2H\s+~?(.*)$", text, re.M):
        r["d2h_bytes"] = parse_size_text(m.group(1))
    if m := re.search(r"moved (.*?); controller", text):
        for part in m.group(1).split(","):
            kv = part.strip().split(None, 1)
            if len(kv) == 2 and (b := parse_size_text(kv[1])) is not None:
                r["moved"][kv[0]] = b
    # the verdict: "budget NOT held ...", "budget held ...", "budget unverified ..." (any case)
    for ln in text.splitlines():
        m = re.search(r"budget\b.*?\b(NOT held|not held|unverified|held)\b", ln, re.I)
        if m:
            word = m.group(1).lower()
            r["verdict"] = ln.strip()
            r["budget_held"] = {"not held": False, "held": True}.get(word)
            break
    flat = " ".join(text.split())
    if m := re.search(r"true peak\D{0,20}?" + _SIZE, flat, re.I):
        r["true_peak_bytes"] = _size_of(m)
    if m := (re.search(r"over (?:the )?budget\D{0,30}?([\d.]+)\s*%", flat, re.I)
             or re.search(r"([\d.]+)\s*%\s*of (?:the )?(?:time|run)\s*over", flat, re.I)
             or re.search(r"time[- ]over\D{0,20}?([\d.]+)\s*%", flat, re.I)):
        r["over_share"] = float(m.group(1)) / 100
    if summary_json:
        held = _find_key(summary_json, ("budget_held",))
        if held is not None or "budget_held" in json.dumps(summary_json):
            r["budget_held"] = held if held in (True, False) else None
        peak = _find_key(summary_json, ("true_peak_bytes", "true_peak", "peak_true_bytes"))
        if isinstance(peak, (int, float)):
            r["true_peak_bytes"] = int(peak)
        over = _find_key(summary_json, ("over_share", "time_over_share", "over_budget_share", "time_over"))
        if isinstance(over, (int, float)):
            r["over_share"] = float(over) if over <= 1 else float(over) / 100
        faults = _find_key(summary_json, ("gpu_faults", "faults"))
        if isinstance(faults, int) and r["gpu_faults"] is None:
            r["gpu_faults"] = faults
    return r


# -- statistics, bound, goals ----------------------------------------------------------------

def steady_ms(steps: list[float], skip: int = 2) -> float | None:
    """Median step time after the first ``skip`` steps (all steps if there are no more)."""
    s = steps[skip:] if len(steps) > skip else steps
    return statistics.median(s) if s else None


def rotation(conditions: list[str], rep: int) -> list[str]:
    """Round-robin order of repetition ``rep``: P N D DP, N D DP P, D DP P N, ..."""
    k = rep % len(conditions)
    return conditions[k:] + conditions[:k]


def bound_ms(plain_ms: float, touched: int, budget: int, h2d_bps: float = H2D_BPS, d2h_bps: float = D2H_BPS,
             with_d2h: bool = False) -> dict:
    """Compute time plus the link time of the bytes the budget forces into the GPU per step (the
    module doc's lower bound); ``with_d2h``: and out again (a migrate-everything mechanism)."""
    forced = max(0, touched - budget)
    h2d, d2h = 1e3 * forced / h2d_bps, 1e3 * forced / d2h_bps
    link = h2d + (d2h if with_d2h else 0.0)
    return {"forced_bytes": forced, "h2d_ms": h2d, "d2h_ms": d2h if with_d2h else 0.0, "compute_ms": plain_ms,
            "bound_ms": plain_ms + link}


@dataclass
class Run:
    program: str
    condition: str
    rep: int
    rc: int | None = None
    wall_s: float = 0.0
    step_ms: float | None = None
    steps: list[float] = field(default_factory=list)
    checksum: str | None = None
    footprint: int | None = None
    reserved: int | None = None
    touched: int | None = None
    budget: int | None = None
    umctl: dict = field(default_factory=dict)
    error: str | None = None
    tail: str = ""


def _held_all(runs: list[Run]) -> bool | None:
    """True if every run held its budget, False if any did not, else None (unverified)."""
    vals = [r.umctl.get("budget_held") for r in runs]
    if any(v is False for v in vals):
        return False
    if vals and all(v is True for v in vals):
        return True
    return None


def summarize(runs: list[Run], conditions: list[str], *, h2d_bps: float = H2D_BPS, d2h_bps: float = D2H_BPS,
              with_d2h: bool = False) -> dict:
    """Per program: reference checksum and footprint, budget, bound; per condition: n, median
    and min–max of run medians, faults, identical, budget held, speedup over none (held only),
    share of the bound."""
    out: dict = {}
    for prog in dict.fromkeys(r.program for r in runs):
        pr = [r for r in runs if r.program == prog]
        plain = [r for r in pr if r.condition == "plain" and r.rc == 0 and r.checksum]
        ref = plain[0].checksum if plain else None
        budget = next((r.budget for r in pr if r.budget), None)
        footprint = next((r.footprint for r in plain if r.footprint), None)
        touched_vals = [r.touched for r in plain if r.touched]
        touched = int(statistics.median(touched_vals)) if touched_vals else footprint
        ps: dict = {"reference_checksum": ref, "footprint": footprint, "touched": touched, "budget": budget,
                    "plain_deterministic": len({r.checksum for r in plain}) <= 1 if plain else None,
                    "conditions": {}}
        for cond in conditions:
            cr = [r for r in pr if r.condition == cond]
            ok = [r for r in cr if r.rc == 0 and r.step_ms is not None]
            meds = [r.step_ms for r in ok]
            faults = [r.umctl.get("gpu_faults") for r in ok if r.umctl.get("gpu_faults") is not None]
            ps["conditions"][cond] = {
                "n": len(ok), "failed": len(cr) - len(ok),
                "median_ms": statistics.median(meds) if meds else None,
                "min_ms": min(meds) if meds else None, "max_ms": max(meds) if meds else None,
                "gpu_faults": statistics.median(faults) if faults else None,
                "identical": (all(r.checksum == ref for r in ok) if ok and ref else None),
                "errors": sorted({r.error for r in cr if r.error}),
                "budget_held": None if cond == "plain" else _held_all(ok),
            }
        cs = ps["conditions"]
        plain_ms = cs.get("plain", {}).get("median_ms")
        ps["bound"] = (bound_ms(plain_ms, touched, budget, h2d_bps, d2h_bps, with_d2h)
                       if plain_ms and touched and budget else None)
        none = cs.get("none", {})
        for cond, c in cs.items():
            c["speedup"], c["speedup_note"], c["bound_share"] = None, None, None
            if cond in ("plain", "none") or c["median_ms"] is None:
                continue
            if none.get("median_ms"):   # kept in --json only: not a speedup unless both held the budget
                c["ratio_raw"] = none["median_ms"] / c["median_ms"]
            if none.get("median_ms") is None:
                c["speedup_note"] = "n/a (no none run)"
            elif c["budget_held"] is True and none.get("budget_held") is True:
                c["speedup"] = none["median_ms"] / c["median_ms"]
            elif c["budget_held"] is False or none.get("budget_held") is False:
                c["speedup_note"] = "n/a (budget not held)"
            else:
                c["speedup_note"] = "n/a (budget unverified)"
            if ps["bound"] and c["budget_held"] is True:
                c["bound_share"] = ps["bound"]["bound_ms"] / c["median_ms"]
        out[prog] = ps
    return out


def _combine(vals: list[bool | None]) -> bool | None:
    if any(v is False for v in vals):
        return False
    if not vals or any(v is None for v in vals):
        return None
    return True


def evaluate_goals(summary: dict, programs: list[str]) -> list[dict]:
    """The issue's goals: met (True), not met (False) or unverified (None), with the evidence."""
    goals = []

    def cond(p, c):
        return summary.get(p, {}).get("conditions", {}).get(c, {})

    vals, ev = [], []
    for p in GOAL_2X:
        if p not in programs:
            continue
        d = cond(p, "deepum")
        if d.get("speedup") is not None:
            vals.append(d["speedup"] >= 2.0)
            ev.append(f"{p} {d['speedup']:.2f}x")
        else:
            note = d.get("speedup_note") or "not measured"
            vals.append(False if "not held" in note else None)
            ev.append(f"{p} {note}")
    goals.append({"goal": "deepum >= 2x none on transformer, convnet, decoder", "met": _combine(vals),
                  "evidence": "; ".join(ev)})

    vals, ev = [], []
    for p in programs:
        d, n = cond(p, "deepum").get("median_ms"), cond(p, "none").get("median_ms")
        if d is None or n is None:
            vals.append(None)
            ev.append(f"{p} not measured")
        else:
            vals.append(d <= 1.05 * n)
            ev.append(f"{p} {100 * (d / n - 1):+.0f}%")
    goals.append({"goal": "no program slower under deepum than none by > 5 %", "met": _combine(vals),
                  "evidence": "; ".join(ev)})

    vals, ev = [], []
    for p in programs:
        for c, cs in summary.get(p, {}).get("conditions", {}).items():
            if c == "plain" or not cs.get("n"):
                continue
            vals.append(cs.get("budget_held"))
            if cs.get("budget_held") is not True:
                ev.append(f"{p}/{c} {'NOT held' if cs.get('budget_held') is False else 'unverified'}")
    goals.append({"goal": "every run held its budget", "met": _combine(vals) if vals else None,
                  "evidence": "; ".join(ev) or ("all held" if vals else "no budget runs")})

    hit, unknown, ev = 0, len(set(PROGRAMS) - set(programs)), []   # programs not in this run: unknown
    for p in programs:
        s = cond(p, "deepum").get("bound_share")
        if s is None:
            unknown += 1
            ev.append(f"{p} n/a")
        else:
            hit += s >= 0.5
            ev.append(f"{p} {100 * s:.0f}%")
    goals.append({"goal": "deepum >= 50 % of the bound on >= 3 programs",
                  "met": True if hit >= 3 else (None if hit + unknown >= 3 else False),
                  "evidence": f"{hit} programs; " + "; ".join(ev)})

    vals = [cs.get("identical") for p in programs for c, cs in summary.get(p, {}).get("conditions", {}).items()
            if cs.get("n")]
    bad = [f"{p}/{c}" for p in programs for c, cs in summary.get(p, {}).get("conditions", {}).items()
           if cs.get("identical") is False]
    goals.append({"goal": "results identical to the plain run", "met": _combine(vals) if vals else None,
                  "evidence": ("differ: " + ", ".join(bad)) if bad else "all equal" if vals else "none"})
    return goals


def replay_compare(live_speedup: float | None, replay_rows: list[dict], tol: float = 0.25) -> dict:
    """Replayed deepum/none speedup (``umctl replay --json`` rows) against the live one."""
    t = {r.get("mode"): r.get("time_s") for r in replay_rows}
    rs = t["none"] / t["deepum"] if t.get("none") and t.get("deepum") else None
    within = None if rs is None or not live_speedup else abs(rs / live_speedup - 1) <= tol
    return {"replay_speedup": rs, "live_speedup": live_speedup, "within": within, "tolerance": tol,
            "replay_time_s": t}


# -- running ---------------------------------------------------------------------------------

def run_cmd(cmd: list[str], timeout: float, env: dict | None = None) -> tuple[int | None, str, str, float]:
    """Run in its own process group; on timeout the whole group is killed (rc None)."""
    t = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True, cwd=ROOT)
    try:
        so, se = p.communicate(timeout=max(1.0, timeout))
        rc = p.returncode
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        so, se = p.communicate()
        rc, se = None, se + f"\n[killed after {timeout:.0f} s]"
    return rc, so, se, time.monotonic() - t


def umctl_summary_option(umctl: str) -> str | None:
    """The option through which ``umctl run`` writes a machine-readable summary, if it has one."""
    try:
        h = subprocess.run([umctl, "run", "--help"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    h = re.sub(r"\x1b\[[0-9;]*m", "", h)
    m = re.search(r"(--json-summary|--summary-json|--summary-file|--json-out)\b", h)
    return m.group(1) if m else None


class Bench:
    """The measurement loop; ``runner(cmd, timeout) -> (rc, stdout, stderr, wall_s)`` is
    injectable so the loop is testable without a GPU."""

    def __init__(self, a: argparse.Namespace, runner: Callable | None = None, clock: Callable = time.monotonic):
        self.a, self.clock = a, clock
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
        self.runner = runner or (lambda cmd, timeout: run_cmd(cmd, timeout, self.env))
        self.deadline = clock() + a.max_seconds
        self.runs: list[Run] = []
        self.skipped: list[str] = []
        self.budget: dict[str, int] = {}
        self.json_opt = a.summary_option
        self.workdir = a.workdir or tempfile.mkdtemp(prefix="umctl_live_")

    def program_cmd(self, prog: str) -> list[str]:
        script, args = PROGRAMS[prog]
        extra = self.a.program_args.get(prog, [])
        return [sys.executable, os.path.join(PROG_DIR, script), *args, *extra]

    def umctl_cmd(self, mode: str, budget: int, prog: str, *, output: str | None = None,
                  summary: str | None = None) -> list[str]:
        cmd = [self.a.umctl, "run", "-q", "--runtime", "--managed", "--mode", mode, "--budget", f"{budget}"]
        if output:
            cmd += ["-o", output]
        if summary and self.json_opt:
            cmd += [self.json_opt, summary]
        pcmd = self.program_cmd(prog)
        if self.a.allocator == "umctl":
            pcmd += ["--allocator", "umctl"]
        return cmd + list(self.a.umctl_args) + ["--"] + pcmd

    def remaining(self) -> float:
        return self.deadline - self.clock()

    def expected_s(self, prog: str, cond: str) -> float:
        same = [r.wall_s for r in self.runs if r.program == prog and r.condition == cond]
        if same:
            return max(same)
        budget_runs = [r.wall_s for r in self.runs if r.program == prog and r.condition != "plain"]
        if cond != "plain" and budget_runs:
            return max(budget_runs)
        anyp = [r.wall_s for r in self.runs if r.program == prog]
        return (3 * max(anyp)) if anyp and cond != "plain" else (max(anyp) if anyp else self.a.first_run_s)

    def one(self, prog: str, cond: str, rep: int) -> Run | None:
        need = self.expected_s(prog, cond)
        if self.remaining() < need:
            self.skipped.append(f"{prog}/{cond} rep {rep} (expected {need:.0f} s, {self.remaining():.0f} s left)")
            return None
        r = Run(prog, cond, rep)
        summary_file = None
        if cond == "plain":
            cmd = self.program_cmd(prog)
        else:
            r.budget = self.budget[prog]
            summary_file = os.path.join(self.workdir, f"{prog}_{cond}_{rep}.summary.json")
            cmd = self.umctl_cmd(cond, r.budget, prog, summary=summary_file)
        rc, so, se, wall = self.runner(cmd, min(self.a.run_timeout, max(5.0, self.remaining())))
        self.fill(r, rc, so, se, wall, summary_file)
        self.runs.append(r)
        held = r.umctl.get("budget_held")
        print(f"[{self.a.max_seconds - self.remaining():5.0f} s] {prog:11} {cond:15} rep {rep} rc={rc} "
              f"{'' if r.step_ms is None else f'{r.step_ms:8.1f} ms'} {wall:5.1f} s "
              f"faults={r.umctl.get('gpu_faults')} held={held} sum={r.checksum}"
              + (f" ERROR {r.error}" if r.error else ""), flush=True)
        return r

    def fill(self, r: Run, rc, so: str, se: str, wall: float, summary_file: str | None) -> None:
        o = parse_program_output(so)
        r.rc, r.wall_s, r.steps, r.checksum = rc, wall, o.steps, o.checksum
        r.footprint, r.reserved, r.touched = o.footprint, o.reserved, o.touched
        r.step_ms = steady_ms(o.steps, self.a.skip)
        sj = None
        if summary_file and os.path.exists(summary_file):
            try:
                with open(summary_file) as f:
                    sj = json.load(f)
            except (OSError, ValueError):
                sj = None
        if r.condition != "plain":
            r.umctl = parse_umctl_summary(so + "\n" + se, sj)
        if rc != 0 or o.checksum is None:
            bad = re.search(r"(buffer overflow|AddressSanitizer|stack smashing|Segmentation fault|Traceback)", se)
            r.error = f"rc={rc}" + (f", {bad.group(1)}" if bad else "") + ("" if o.checksum else ", no DONE line")
            r.tail = (so[-1500:] + "\n---\n" + se[-2500:])

    def set_budget(self, prog: str, r: Run) -> bool:
        basis = r.reserved if self.a.footprint_basis == "reserved" and r.reserved else r.footprint
        if r.rc != 0 or not basis:
            self.skipped.append(f"{prog}: no footprint (plain run failed: {r.error})")
            return False
        mib = max(1, int(self.a.budget_frac * basis) >> 20)
        self.budget[prog] = mib << 20
        return True

    def run_all(self, programs: list[str], conditions: list[str]) -> None:
        broken: set[str] = set()
        for rep in range(self.a.reps):
            for prog in programs:
                if prog in broken:
                    continue
                if prog not in self.budget:           # the footprint comes first (a plain run)
                    r = self.one(prog, "plain", rep)
                    if r is None or not self.set_budget(prog, r):
                        broken.add(prog)
                        continue
                    order = [c for c in rotation(conditions, rep) if c != "plain"]
                else:
                    order = rotation(conditions, rep)
                for cond in order:
                    self.one(prog, cond, rep)

    def replay(self, programs: list[str], summary: dict) -> list[dict]:
        out = []
        for prog in programs:
            if prog not in self.budget:
                continue
            need = 2 * self.expected_s(prog, "none") + self.a.replay_timeout
            if self.remaining() < need:
                self.skipped.append(f"{prog}: replay (needs ~{need:.0f} s, {self.remaining():.0f} s left)")
                continue
            trace = os.path.join(self.workdir, f"{prog}_none.parquet")
            b = self.budget[prog]
            rc, so, se, wall = self.runner(self.umctl_cmd("none", b, prog, output=trace),
                                           min(self.a.run_timeout, self.remaining()))
            row = {"program": prog, "record_rc": rc, "record_s": wall}
            if rc == 0 and os.path.exists(trace):
                rc2, so2, se2, wall2 = self.runner(
                    [self.a.umctl, "replay", trace, "-m", "none,deepum", "--gpu-mem", str(b), "--json"],
                    min(self.a.replay_timeout, self.remaining()))
                row.update(replay_rc=rc2, replay_s=wall2)
                try:
                    rows = json.loads(so2[so2.index("["):]) if rc2 == 0 else []
                except ValueError:
                    rows = []
                live = summary.get(prog, {}).get("conditions", {})
                n, d = live.get("none", {}).get("median_ms"), live.get("deepum", {}).get("median_ms")
                row.update(replay_compare(n / d if n and d else None, rows))
                if rc2 != 0:
                    row["error"] = se2[-800:]
            else:
                row["error"] = se[-800:]
            if not self.a.keep_traces and os.path.exists(trace):
                os.remove(trace)
            out.append(row)
            rs, ls = row.get("replay_speedup"), row.get("live_speedup")
            print(f"replay {prog}: replayed deepum/none {'-' if rs is None else f'{rs:.2f}x'}, live "
                  f"{'-' if ls is None else f'{ls:.2f}x'}, within 25 %: {row.get('within')}", flush=True)
        return out


# -- output ------------------------------------------------------------------------------------

def _gib(b) -> str:
    return "-" if b is None else f"{b / 2 ** 30:.2f} GiB"


def _tri(v) -> str:
    return {True: "yes", False: "NO", None: "?"}[v]


def format_report(summary: dict, goals: list[dict], conditions: list[str]) -> str:
    lines = []
    for prog, ps in summary.items():
        b = ps.get("bound")
        lines.append(f"\n{prog}: footprint {_gib(ps['footprint'])}, touched/step {_gib(ps['touched'])}, budget "
                     f"{_gib(ps['budget'])}; " + (f"bound {b['bound_ms']:.1f} ms = compute {b['compute_ms']:.1f} + "
                                                  f"{_gib(b['forced_bytes'])} in ({b['h2d_ms']:.1f} ms H2D"
                                                  + (f" + {b['d2h_ms']:.1f} ms D2H" if b['d2h_ms'] else "") + ")"
                                                  if b else "bound n/a")
                     + ("" if ps.get("plain_deterministic") in (True, None) else "; PLAIN RUNS DISAGREE"))
        lines.append(f"  {'condition':16}{'n':>3} {'step ms median (min-max)':>27} {'GPU faults':>11} "
                     f"{'identical':>9} {'budget':>9} {'speedup vs none':>24} {'bound/time':>10}")
        for cond in conditions:
            c = ps["conditions"].get(cond)
            if not c:
                continue
            med = "-" if c["median_ms"] is None else f"{c['median_ms']:.1f} ({c['min_ms']:.1f}-{c['max_ms']:.1f})"
            held = "-" if cond == "plain" else {True: "held", False: "NOT held", None: "unverif."}[c["budget_held"]]
            sp = ("" if cond in ("plain", "none") else
                  f"{c['speedup']:.2f}x" if c["speedup"] is not None else (c["speedup_note"] or "-"))
            share = "" if c["bound_share"] is None else f"{100 * c['bound_share']:.0f}%"
            flt = "-" if c["gpu_faults"] is None else f"{c['gpu_faults']:,.0f}"
            lines.append(f"  {cond:16}{c['n']:>3} {med:>27} {flt:>11} {_tri(c['identical']):>9} {held:>9} "
                         f"{sp:>24} {share:>10}" + (f"  ({c['failed']} failed)" if c["failed"] else ""))
    lines.append("\nGoals:")
    for g in goals:
        state = {True: "MET", False: "NOT MET", None: "UNVERIFIED"}[g["met"]]
        lines.append(f"  [{state:10}] {g['goal']}: {g['evidence']}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--programs", default=",".join(PROGRAMS), help="comma-separated, of: " + ", ".join(PROGRAMS))
    ap.add_argument("--conditions", default=",".join(CONDITIONS))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--skip", type=int, default=2, help="steps left out of each run's median")
    ap.add_argument("--budget-frac", type=float, default=0.5)
    ap.add_argument("--footprint-basis", choices=("allocated", "reserved"), default="allocated")
    ap.add_argument("--h2d-gbps", type=float, default=H2D_BPS / 1e9)
    ap.add_argument("--d2h-gbps", type=float, default=D2H_BPS / 1e9)
    ap.add_argument("--calibration", help="take H2D/D2H rates from a umctl calibration file "
                    "(e.g. umctl/sim/calibrations/h100-r580.json)")
    ap.add_argument("--with-d2h", action="store_true", help="the bound also moves the forced bytes out (D2H): "
                    "a migrate-everything mechanism's bound, not a lower bound")
    ap.add_argument("--max-seconds", type=float, default=500.0)
    ap.add_argument("--run-timeout", type=float, default=120.0, help="seconds one run may take")
    ap.add_argument("--first-run-s", type=float, default=20.0, help="expected seconds of a program's first run")
    ap.add_argument("--replay", action="store_true", help="§5: record each none run, replay none,deepum, compare")
    ap.add_argument("--replay-timeout", type=float, default=120.0)
    ap.add_argument("--keep-traces", action="store_true")
    ap.add_argument("--workdir")
    ap.add_argument("--umctl", default="umctl")
    ap.add_argument("--umctl-args", default="", help="extra `umctl run` arguments for the budget runs")
    ap.add_argument("--summary-option", default="auto",
                    help="umctl run's machine-readable summary option (auto: looked up in --help; '' none)")
    ap.add_argument("--allocator", choices=("torch", "umctl"), default="torch",
                    help="umctl: programs under umctl use the runtime's pluggable allocator")
    ap.add_argument("--program-args", action="append", default=[], metavar="PROG=ARGS",
                    help="extra arguments for one program, e.g. 'embedding=--rows 3000000' (repeatable)")
    ap.add_argument("--json")
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="no runs: summarize the --json files of earlier "
                    "(split) invocations together, e.g. two device calls' live.json")
    a = ap.parse_args(argv)
    a.umctl_args = a.umctl_args.split()
    pa: dict[str, list[str]] = {}
    for item in a.program_args:
        k, _, v = item.partition("=")
        pa.setdefault(k.strip(), []).extend(v.split())
    a.program_args = pa
    if a.calibration:
        with open(a.calibration) as f:
            cal = json.load(f).get("calibration", {})
        a.h2d_gbps = cal.get("prefetch_h2d_Bps", a.h2d_gbps * 1e9) / 1e9
        a.d2h_gbps = cal.get("d2h_Bps", a.d2h_gbps * 1e9) / 1e9
    return a


def merge(files: list[str], a: argparse.Namespace) -> int:
    """Summarize the runs of several --json files (split invocations) as one benchmark.
    ``FILE:prog,prog`` takes only those programs' runs from FILE (a later call re-measured the
    others)."""
    runs, programs, conditions, replay, skipped = [], [], [], [], []
    for spec in files:
        fn, _, only = spec.partition(":")
        keep = set(only.split(",")) if only else None
        with open(fn) as f:
            d = json.load(f)
        runs += [Run(**r) for r in d["runs"] if keep is None or r["program"] in keep]
        programs += [p for p in d["programs"] if p not in programs and (keep is None or p in keep)]
        if keep is not None:
            d["replay"] = [r for r in d.get("replay", []) if r.get("program") in keep]
            d["skipped"] = [s_ for s_ in d.get("skipped", []) if s_.split("/")[0].split(":")[0] in keep]
        conditions += [c for c in d["conditions"] if c not in conditions]
        replay += d.get("replay", [])
        skipped += d.get("skipped", [])
    summary = summarize(runs, conditions, h2d_bps=a.h2d_gbps * 1e9, d2h_bps=a.d2h_gbps * 1e9, with_d2h=a.with_d2h)
    goals = evaluate_goals(summary, [p for p in programs if p in summary])
    print(format_report(summary, goals, conditions))
    for r in replay:
        print(f"  replay {r['program']:12} {r.get('replay_speedup')} live {r.get('live_speedup')} "
              f"within 25 %: {_tri(r.get('within'))}")
    for s_ in skipped:
        print(f"  skipped: {s_}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"merged": files, "programs": programs, "conditions": conditions,
                       "runs": [asdict(r) for r in runs], "summary": summary, "goals": goals, "replay": replay,
                       "skipped": skipped}, f, indent=1, default=str)
    return 0


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.merge:
        return merge(a.merge, a)
    programs = [p.strip() for p in a.programs.split(",") if p.strip()]
    conditions = [c.strip() for c in a.conditions.split(",") if c.strip()]
    bad = [p for p in programs if p not in PROGRAMS] + [c for c in conditions if c not in CONDITIONS]
    if bad:
        sys.exit(f"live_control: unknown program/condition {bad}")
    if shutil.which(a.umctl) is None and conditions != ["plain"]:
        sys.exit(f"live_control: {a.umctl} not found (pip install --no-build-isolation --no-deps -e .)")
    if a.summary_option == "auto":
        a.summary_option = umctl_summary_option(a.umctl)
    a.summary_option = a.summary_option or None
    print(f"live_control: programs {programs}, conditions {conditions}, {a.reps} reps, budget "
          f"{100 * a.budget_frac:.0f}% of the footprint, limit {a.max_seconds:.0f} s; umctl summary option "
          f"{a.summary_option or '(none: parsing the summary text)'}", flush=True)
    b = Bench(a)
    b.run_all(programs, conditions)
    kw = dict(h2d_bps=a.h2d_gbps * 1e9, d2h_bps=a.d2h_gbps * 1e9, with_d2h=a.with_d2h)
    summary = summarize(b.runs, conditions, **kw)
    replay = b.replay(programs, summary) if a.replay else []
    goals = evaluate_goals(summary, [p for p in programs if p in summary])
    print(format_report(summary, goals, conditions))
    if replay:
        print("\nReplay predicts live (deepum/none speedup; replay of the whole recorded none run):")
        for r in replay:
            rs, ls = r.get("replay_speedup"), r.get("live_speedup")
            print(f"  {r['program']:12} replay {'-' if rs is None else f'{rs:.2f}x':>7}  live "
                  f"{'-' if ls is None else f'{ls:.2f}x':>7}  within 25 %: {_tri(r.get('within'))}"
                  + (f"  error: {r['error'][-200:]!r}" if r.get("error") else ""))
    failed = [r for r in b.runs if r.error]
    if failed:
        print("\nFailed runs:")
        for r in failed:
            print(f"  {r.program}/{r.condition} rep {r.rep}: {r.error}\n    " + r.tail[-600:].replace("\n", "\n    "))
    if b.skipped:
        print(f"\nSkipped ({len(b.skipped)}, time limit {a.max_seconds:.0f} s):")
        for s in b.skipped:
            print(f"  {s}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"config": {k: v for k, v in vars(a).items()}, "programs": programs,
                       "conditions": conditions, "runs": [asdict(r) for r in b.runs], "summary": summary,
                       "goals": goals, "replay": replay, "skipped": b.skipped}, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
