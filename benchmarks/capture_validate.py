"""A captured PyTorch step (``umctl capture``) against a real recording of the same program:
replayed time per step, and how much of the real run's faulted memory the capture's per-kernel
access sets predict (docs/evaluation/capture.md, "Not done yet").

Device part (one H100/H200 machine, in the repository root; one bash line per recording).
``--mode none`` attaches a controller that does nothing, so that the runtime times every
launch at its kernel's *start* (a plain ``umctl run`` records the host's issue time, up to a
launch queue ahead of the GPU: the faults would be charged to kernels not yet running). The
budgets are the live runs' (``benchmarks/results/live_control_admit.merged.h100.json``: 50 % of
the plain run's peak allocated). ``--slim`` rewrites a recording without the event kinds this
tool does not read (the budget turns the driver's migration records on, about as many as the
faults): a no-budget run faults each page once (~5 B a fault in the file, ~1 M faults: ~5 MiB);
the budget runs re-fault what was evicted every step, hence 4 steps. Check ``ls -l rec/``: each
file must be under 16 MiB to come back (if not, one step fewer)::

    mkdir -p rec && umctl run -q --runtime --managed --mode none -o rec/t.raw.parquet -- python3 benchmarks/gpu/programs/transformer.py --batch 8 --steps 6 && python3 benchmarks/capture_validate.py --slim rec/t.raw.parquet rec/transformer.nobudget.parquet && rm rec/t.raw.parquet
    mkdir -p rec && umctl run -q --runtime --managed --mode none -o rec/c.raw.parquet -- python3 benchmarks/gpu/programs/convnet.py --batch 24 --steps 6 && python3 benchmarks/capture_validate.py --slim rec/c.raw.parquet rec/convnet.nobudget.parquet && rm rec/c.raw.parquet
    mkdir -p rec && umctl run -q --runtime --managed --mode none -o rec/m.raw.parquet -- python3 benchmarks/gpu/programs/moe.py --tokens 2048 --steps 6 && python3 benchmarks/capture_validate.py --slim rec/m.raw.parquet rec/moe.nobudget.parquet && rm rec/m.raw.parquet
    mkdir -p rec && umctl run -q --runtime --managed --mode none --budget 953MiB --budget-hold evict -o rec/tb.raw.parquet -- python3 benchmarks/gpu/programs/transformer.py --batch 8 --steps 4 && python3 benchmarks/capture_validate.py --slim rec/tb.raw.parquet rec/transformer.budget.parquet && rm rec/tb.raw.parquet
    mkdir -p rec && umctl run -q --runtime --managed --mode none --budget 1193MiB --budget-hold evict -o rec/cb.raw.parquet -- python3 benchmarks/gpu/programs/convnet.py --batch 24 --steps 4 && python3 benchmarks/capture_validate.py --slim rec/cb.raw.parquet rec/convnet.budget.parquet && rm rec/cb.raw.parquet
    mkdir -p rec && umctl run -q --runtime --managed --mode none --budget 1318MiB --budget-hold evict -o rec/mb.raw.parquet -- python3 benchmarks/gpu/programs/moe.py --tokens 2048 --steps 4 && python3 benchmarks/capture_validate.py --slim rec/mb.raw.parquet rec/moe.budget.parquet && rm rec/mb.raw.parquet
    mkdir -p rec && umctl run -q --runtime --managed --mode none -o rec/g.raw.parquet -- python3 benchmarks/gpu/programs/hf_gpt2.py --steps 6 && python3 benchmarks/capture_validate.py --slim rec/g.raw.parquet rec/hf_gpt2.nobudget.parquet && rm rec/g.raw.parquet
    mkdir -p rec && umctl run -q --runtime --managed --mode none --budget 2279MiB --budget-hold evict -o rec/gb.raw.parquet -- python3 benchmarks/gpu/programs/hf_gpt2.py --steps 4 && python3 benchmarks/capture_validate.py --slim rec/gb.raw.parquet rec/hf_gpt2.budget.parquet && rm rec/gb.raw.parquet

Complete-access recordings (the like-for-like time check: every kernel's whole access set, from
what migrated onto the GPU while it ran; kernel times then come from ``--recording``), 3 steps,
about 1-2 min each on an H200; run this tool on the device too (the files are 50-100 MiB)::

    umctl run -q --complete-accesses --mode none -o rec/g.c.parquet -- python3 benchmarks/gpu/programs/hf_gpt2.py --steps 3
    python3 benchmarks/capture_validate.py --program benchmarks/gpu/programs/hf_gpt2.py --batch 4 --recording rec/hf_gpt2.nobudget.parquet --complete-recording rec/g.c.parquet --gpu-mem 2279MiB --json cv.hf_gpt2.json

(``--budget-hold evict``: the driver migrates on every fault and umctl evicts over the budget,
so the recording holds the re-faults of evicted pages, which a replay at the budget needs; the
default ``admit`` serves misses by remote mapping and records a different program.)

CPU part (any machine with torch: the captures are made on the fly, at ``--iters 4``; or give
``--capture X.umw``), one line per program, then the tables from the JSON files::

    python3 benchmarks/capture_validate.py --program benchmarks/gpu/programs/transformer.py --batch 8 --recording rec/transformer.nobudget.parquet --budget-recording rec/transformer.budget.parquet --gpu-mem 953MiB --json rec/transformer.validate.json
    python3 benchmarks/capture_validate.py --program benchmarks/gpu/programs/convnet.py --batch 24 --recording rec/convnet.nobudget.parquet --budget-recording rec/convnet.budget.parquet --gpu-mem 1193MiB --json rec/convnet.validate.json
    python3 benchmarks/capture_validate.py --program benchmarks/gpu/programs/moe.py --batch 2048 --recording rec/moe.nobudget.parquet --budget-recording rec/moe.budget.parquet --gpu-mem 1318MiB --json rec/moe.validate.json
    python3 benchmarks/capture_validate.py --program benchmarks/gpu/programs/hf_gpt2.py --batch 4 --recording rec/hf_gpt2.nobudget.parquet --budget-recording rec/hf_gpt2.budget.parquet --gpu-mem 2279MiB --json rec/hf_gpt2.validate.json
    python3 benchmarks/capture_validate.py --tables rec/transformer.validate.json rec/convnet.validate.json rec/moe.validate.json rec/hf_gpt2.validate.json

What it does:

* **Steps in a recording.** The runtime's trace holds every kernel launch (exact name, grid,
  block, host issue time), the managed allocations (``ALLOC`` records: under ``--managed`` each
  of PyTorch's cudaMalloc segments is one), and the GPU faults; it has no record of a
  synchronisation. The programs synchronise at the end of every step, so the host's next launch
  comes after the GPU drained: a step starts with the same few kernels after a long launch gap.
  :func:`detect_steps` takes a k-gram of (name, grid, block) that occurs exactly ``--steps``
  times (read from the recorded command line), cutting steps of near-equal length that fit in
  the recording and cover most of it, the earliest such by its second occurrence (the
  checksum's per-chunk kernels also repeat, but cover a sliver; a k-gram later in the step
  starts later; the first occurrence may be a coincidence in the set-up). Every launch then
  belongs to the set-up, a step, or the tail (the checksum after the loop). A step may still
  be shorter than the others where the runtime dropped launch records (``drops`` records;
  gaps in the launches' ``seq``).
* **Per-step replay.** The recording's workload (``umctl replay``'s) gets each op's
  ``iteration`` set to its step (set-up 0, step i -> i + 1, tail after), so the simulator's
  per-iteration end times give per-step times; the capture's iterations are its steps. Both
  replay under ``none`` and ``deepum`` on a GPU of ``--gpu-mem`` with one calibration (the
  recording's GPU's shipped one, else the default); steady step = median of the steps after
  the first.
* **Access sets.** Real faults are mapped to (managed allocation, 2 MiB chunk of it), the
  capture's pages to (allocator segment, chunk). Same-size segments are matched first by the
  faults of the steps *not* scored (real step 0 against the capture's warm-up, from its log when
  captured now; step s >= 2 against its repetition s - 1): a fault's aligned capture kernel
  (+-W) touching that chunk of a segment is evidence, paired greedily by weight; the rest by an
  LCS of sizes in creation order (the caching allocator creates them in program order in both). The kernels of
  the real step the capture keeps (step ``warmup_steps``, 1: the capture runs one warm-up
  step first, and the real first step is that warm-up, with other tensors in its new
  segments) and the capture's kept step are aligned by an LCS of name *classes*
  (GEMM, convolution, attention, softmax, norm, reduction, index/gather, random, scan,
  foreach, elementwise) -- names and order only, never addresses, so the alignment does not
  use what it is then scored on. Of that real step's faulted (kernel, chunk) pairs we
  report the share whose chunk the aligned capture kernel touches (exactly, and within +-W
  kernels), by position (kernel i of n to kernel i*m/n) as a baseline, and at step level (the
  capture step's union) as the upper reference.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
from dataclasses import dataclass, field

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from umctl import UmctlError  # noqa: E402
from umctl.units import BLOCK_SHIFT, PAGE_SHIFT  # noqa: E402

#: k-gram length of a step's start (kernels); the programs' steps start with distinct data kernels
KGRAM = 8
#: the programs' default --steps (benchmarks/gpu/programs/_common.py parser calls)
DEFAULT_STEPS = 10
CHUNK_BITS = 24   # a (segment, chunk) code: segment << 24 | chunk


class ValidateError(UmctlError):
    """One-line error of this tool."""


# -- inputs ---------------------------------------------------------------------------------

def load_recording(path: str):
    from umctl.events.trace import TraceError, read_trace

    if not os.path.exists(path):
        raise ValidateError(f"{path}: no such file")
    try:
        return read_trace(path)
    except TraceError as e:
        raise ValidateError(str(e).splitlines()[0]) from None
    except Exception as e:  # noqa: BLE001 - a corrupt file: one line
        raise ValidateError(f"{path}: not a readable umctl trace ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None


def load_capture(capture: str | None, program: str | None, batch: int | None, iters: int, gpu_mem: int, calib):
    """The capture: a .umw file, or ``program[:make_step]`` captured now at ``batch``; and the
    capture's log when captured now (its warm-up step: a .umw holds the kept step only), else None."""
    if capture:
        from umctl.workload.workfile import load

        if not os.path.exists(capture):
            raise ValidateError(f"{capture}: no such file")
        w = load(capture)
        w.gpu_mem = [int(gpu_mem)] * w.n_gpus
        return w, None
    if not program or batch is None:
        raise ValidateError("give --capture FILE.umw, or --program FILE.py and --batch N")
    entry = program if ":" in os.path.basename(program) else program + ":make_step"
    path = entry.rsplit(":", 1)[0]
    if not os.path.exists(path):
        raise ValidateError(f"{path}: no such file")
    from umctl.workload.capture import capture_workload

    w, cap = capture_workload(entry, int(batch), gpu_mem=int(gpu_mem), iterations=iters, calibration=calib.name,
                              hbm_Bps=calib.hbm_Bps)
    return w, cap.log


def recorded_program(trace) -> tuple[str | None, list[str]]:
    """(basename of the recorded program's script, its argv) from the trace metadata."""
    cmd = trace.meta.get("command")
    if isinstance(cmd, str):
        cmd = shlex.split(cmd)
    if not isinstance(cmd, list):
        return None, []
    cmd = [str(c) for c in cmd]
    script = next((c for c in cmd if c.endswith(".py")), None)
    return (os.path.basename(script) if script else None), cmd


def recorded_steps(trace) -> int | None:
    _, argv = recorded_program(trace)
    for i, a in enumerate(argv):
        if a == "--steps" and i + 1 < len(argv) and argv[i + 1].isdigit():
            return int(argv[i + 1])
        if a.startswith("--steps=") and a[8:].isdigit():
            return int(a[8:])
    return DEFAULT_STEPS if argv else None


def capture_program(w) -> str | None:
    entry = str(w.meta.get("entry") or "")
    where = entry.rsplit(":", 1)[0] if ":" in entry else entry
    return os.path.basename(where) if where.endswith(".py") else None


def check_same_program(w, trace, path: str) -> None:
    rec, _ = recorded_program(trace)
    cap = capture_program(w)
    if rec and cap and rec != cap:
        raise ValidateError(f"{path}: recording of {rec}, but the capture is of {cap} (mismatched program)")


def check_runtime_recording(trace, path: str) -> None:
    from umctl.events.schema import AllocOp, Kind

    a = trace.events(Kind.ALLOC)
    if not ((a["op"] == AllocOp.ALLOC) & a["managed"]).any():
        raise ValidateError(f"{path}: no managed allocation records: record with `umctl run --runtime --managed -o`")
    if len(trace.events(Kind.LAUNCH)) == 0:
        raise ValidateError(f"{path}: no kernel launches in the recording")


# -- steps in a recording --------------------------------------------------------------------

def launches_of(trace) -> np.ndarray:
    """The recording's launches in program order (time, then record order), cut to the
    metadata's measured span where it has one (as the replay cuts them)."""
    from umctl.events.schema import Kind
    from umctl.workload.tracefile import _meta_span

    la = trace.events(Kind.LAUNCH)
    span = _meta_span(trace.meta)
    if span is not None:
        la = la[(la["t_ns"] >= span[0]) & (la["t_ns"] <= span[1])]
    return np.sort(la, order="t_ns", kind="stable")


def kernel_codes(launches: np.ndarray) -> np.ndarray:
    """One integer per distinct (name, grid, block)."""
    key = np.stack([launches["name_id"].astype(np.int64), *(launches["grid"].astype(np.int64).T),
                    *(launches["block"].astype(np.int64).T)], axis=1) if len(launches) else np.zeros((0, 7), np.int64)
    _, inv = np.unique(key, axis=0, return_inverse=True)
    return inv.reshape(-1).astype(np.int64)


@dataclass
class Steps:
    starts: np.ndarray      # launch index where each step starts
    end: int                # launch index one past the last step
    method: str
    gap_ms: float = 0.0     # median launch gap before a step's start

    @property
    def n(self) -> int:
        return len(self.starts)

    def step_of(self, n_launches: int) -> np.ndarray:
        """Per launch: -1 set-up, i step i, n tail."""
        idx = np.arange(n_launches)
        s = np.searchsorted(self.starts, idx, side="right") - 1
        s[idx >= self.end] = self.n
        return s


def _kgram_hash(codes: np.ndarray, k: int) -> np.ndarray:
    n = len(codes) - k + 1
    if n <= 0:
        return np.zeros(0, np.uint64)
    h = np.zeros(n, np.uint64)
    mult = np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        for j in range(k):
            h = h * mult + (codes[j:j + n].astype(np.uint64) + np.uint64(1))
    return h


def _step_candidates(h: np.ndarray, n_steps: int, kk: int) -> list[np.ndarray]:
    """Sorted start positions of every k-gram (hash ``h``) that occurs exactly ``n_steps``
    times without overlapping itself."""
    uniq, inv, counts = np.unique(h, return_inverse=True, return_counts=True)
    order = np.argsort(inv, kind="stable")
    bounds = np.r_[0, np.cumsum(counts)]
    out = []
    for c in np.flatnonzero(counts == n_steps).tolist():
        pos = np.sort(order[bounds[c]:bounds[c + 1]])
        if not np.any(np.diff(pos) < kk):
            out.append(pos)
    return out


def _pick_steps(cands: list[np.ndarray], gap: np.ndarray, n: int) -> tuple[np.ndarray, float] | None:
    """The step starts among k-gram candidates: steps of one program are near-equal in length
    (each within STEP_SPREAD of the median), the last one fits in the recording (a k-gram
    occurring once a step at a later phase puts the last step's end past the recording's end
    unless that phase is under the tail's length) and together they cover most of the
    recording (at least MIN_COVER of the best candidate's coverage: a k-gram of the checksum's
    per-chunk kernels that repeats ``n_steps`` times covers a sliver). Of those, the earliest
    *second* start (a step's first kernels; launch gaps do not tell, as a kernel stalled on
    faults leaves a longer gap than the host's wait at a step's end). The second, not the
    first: a k-gram of a later phase may occur once in the set-up by coincidence and be absent
    from the first step -- transformers' GPT-2 fills each parameter on the GPU in the set-up,
    Fill kernels that match those of ``zero_grad(set_to_none=False)``, a no-op in step 0 -- and
    its first occurrence is then the earliest. Ties broken by the longest median launch gap
    before the starts. Without a regular candidate, all compete."""
    rows = []
    for pos in cands:
        lens = np.diff(pos)
        med = float(np.median(lens))
        regular = bool(np.all((lens >= med / STEP_SPREAD) & (lens <= med * STEP_SPREAD)))
        regular = regular and int(pos[-1]) + int(lens.min()) <= n   # the last step fits
        cover = min(1.0, (float(pos[-1] - pos[0]) + med) / max(1, n))
        rows.append((pos, med, regular, cover, float(np.median(gap[pos]))))
    if not rows:
        return None
    if any(r[2] for r in rows):
        rows = [r for r in rows if r[2]]
    top = max(r[3] for r in rows)
    rows = [r for r in rows if r[3] >= MIN_COVER * top]
    second = min(int(r[0][1]) for r in rows)
    rows = [r for r in rows if int(r[0][1]) == second]
    best = max(rows, key=lambda r: r[4])
    return best[0], best[4]


#: the steps of one program differ in length by at most this factor from their median (an MoE's
#: data-dependent expert loop: ~12 %; a first step with the optimizer state's creation: ~11 %)
STEP_SPREAD = 1.5
#: candidates covering at least this share of the best one's coverage are kept
MIN_COVER = 0.75


#: consecutive kernels matching the step before that can end the last step
END_RUN = 2


def _last_step_end(codes: np.ndarray, starts: np.ndarray) -> int | None:
    """Where the last step ends: its kernels aligned (LCS of codes) with the step before it,
    the end of the last run of ``END_RUN`` consecutive kernels that match consecutive kernels of
    that step (the checksum after the loop matches only here and there: a lone reduction
    against one of the step's). None without such a run."""
    a, b = int(starts[-2]), int(starts[-1])
    tmpl = codes[a:b].tolist()
    win = codes[b:min(len(codes), b + int(1.5 * len(tmpl)) + 1)].tolist()
    pairs = lcs_pairs(tmpl, win)
    end, run = None, 0
    for q in range(len(pairs)):
        run = run + 1 if q and pairs[q][0] == pairs[q - 1][0] + 1 and pairs[q][1] == pairs[q - 1][1] + 1 else 1
        if run >= END_RUN:
            end = b + pairs[q][1] + 1
    return end


def detect_steps(launches: np.ndarray, n_steps: int, k: int = KGRAM) -> Steps:
    """The ``n_steps`` step starts of a recording: of the k-grams of (name, grid, block) codes
    that occur exactly ``n_steps`` times, non-overlapping, the one whose occurrences cut steps
    of near-equal length covering most launches, earliest (by its second occurrence), then
    with the longest median launch gap before its occurrences (:func:`_pick_steps`). The last
    step ends where its kernels stop matching the step before it (:func:`_last_step_end`: what
    follows is the program's checksum); failing that, at the longest launch gap 0.5 to 1.5
    median step lengths after its start (the loop's end), or at the recording's end."""
    n = len(launches)
    if n_steps < 2:
        raise ValidateError(f"need at least 2 steps in the recording (got --steps {n_steps})")
    codes = kernel_codes(launches)
    t = launches["t_ns"].astype(np.int64)
    gap = np.r_[np.int64(0), np.diff(t)] if n else t
    for kk in (k, max(3, k // 2), 2 * k):
        h = _kgram_hash(codes, kk)
        if len(h) == 0:
            continue
        picked = _pick_steps(_step_candidates(h, n_steps, kk), gap, n)
        if picked is None:
            continue
        starts, best_score = picked
        lens = np.diff(starts)
        med = int(np.median(lens)) if len(lens) else n - starts[-1]
        lo, hi = int(starts[-1]) + max(1, med // 2), min(n, int(starts[-1]) + int(1.5 * med) + 1)
        end = _last_step_end(codes, starts)
        if end is None:
            end = lo + int(np.argmax(gap[lo:hi])) if lo < hi else n
            if hi >= n and (lo >= hi or gap[end] < 0.5 * best_score):
                end = n   # the recording ends with the last step
        end = max(end, int(starts[-1]) + 1)
        return Steps(starts.astype(np.int64), int(end), f"{kk}-gram x {n_steps}: near-equal steps over most launches",
                     best_score / 1e6)
    raise ValidateError(f"no kernel sequence starts exactly {n_steps} steps in the recording "
                        f"({n} launches): pass the program's --steps with --steps N")


# -- per-step replay -------------------------------------------------------------------------

def recording_workload(trace, gpu_mem: int):
    from umctl.workload.tracefile import workload_from_trace

    try:
        return workload_from_trace(trace, gpu_mem=int(gpu_mem))
    except UmctlError as e:
        raise ValidateError(str(e).splitlines()[0]) from None


def set_step_iterations(w, steps: Steps, n_launches: int) -> None:
    """Each op's ``iteration`` := its step (set-up 0, step i -> i + 1, tail n + 1): the
    simulator then reports per-step end times. Ops between kernels go with the kernel before.
    In place. The workload's kernels are the launches in order, after one synthetic kernel per
    GPU for faults before the first launch (umctl.workload.tracefile)."""
    from umctl.workload.tracefile import BEFORE_FIRST_LAUNCH
    from umctl.workload.workload import OpType

    ops = w.ops
    kpos = np.flatnonzero(ops["type"] == OpType.KERNEL)
    names = np.array(w.names + [""], dtype=object)
    early = np.array([names[i] == BEFORE_FIRST_LAUNCH for i in ops["name_id"][kpos]], bool)
    if len(kpos) - int(early.sum()) != n_launches:
        raise ValidateError(f"the replayed workload has {len(kpos) - int(early.sum())} kernels for "
                            f"{n_launches} launches: cannot map steps")
    step = np.full(len(kpos), -1, np.int64)
    step[~early] = steps.step_of(n_launches)
    it_k = step + 1
    it = np.zeros(len(ops), np.int64)
    if len(kpos):
        k_before = np.searchsorted(kpos, np.arange(len(ops)), side="right") - 1
        it = np.where(k_before >= 0, it_k[np.maximum(k_before, 0)], 0)
    ops["iteration"] = np.maximum.accumulate(it).astype(np.int32)


#: what a replay's totals show of where its time went (SimResult fields)
TOTALS = ("time_ns", "compute_ns", "stall_ns", "faults", "fault_batches", "bytes_h2d", "bytes_d2h",
          "demand_bytes", "driver_prefetch_bytes", "user_prefetch_bytes", "evicted_bytes", "preevicted_bytes",
          "accesses", "kernels")


def compute_per_iteration(w) -> list[float]:
    """Seconds of kernel compute per iteration of ``w`` (a recording's: set-up 0, step i -> i + 1)."""
    from umctl.workload.workload import OpType

    k = w.ops[w.ops["type"] == OpType.KERNEL]
    n = int(w.ops["iteration"].max()) + 1 if len(w.ops) else 0
    return (np.bincount(k["iteration"], weights=k["compute_ns"], minlength=n) / 1e9).tolist()


def replay(w, modes: list[str], calib, totals: dict | None = None) -> dict[str, np.ndarray]:
    """Per mode, the end time (s) of each iteration; ``totals`` (if given) gets per mode the
    whole replay's :data:`TOTALS` and its iteration count, to tell what the time is made of."""
    from umctl.sim.replay import run_modes

    out = {}
    for r in run_modes(w, modes, calib=calib):
        out[r.mode] = np.asarray(r.iteration_end_ns, np.float64) / 1e9
        if totals is not None:
            totals[r.mode] = {k: int(getattr(r, k)) for k in TOTALS} | {"iterations": len(out[r.mode])}
    return out


def step_times_recording(ends: np.ndarray, n_steps: int) -> list[float]:
    """Per step (its iteration i + 1 ends minus the iteration before)."""
    e = np.asarray(ends)
    return [float(e[i + 1] - e[i]) for i in range(n_steps) if i + 1 < len(e)]


def step_times_capture(ends: np.ndarray) -> list[float]:
    e = np.r_[0.0, np.asarray(ends)]
    return np.diff(e).tolist()


def steady(times: list[float]) -> float | None:
    return float(np.median(times[1:])) if len(times) > 1 else None


# -- access sets -----------------------------------------------------------------------------

def real_segments(trace) -> np.ndarray:
    """The recording's managed allocations (ALLOC records), in time order."""
    from umctl.events.schema import AllocOp, Kind

    a = trace.events(Kind.ALLOC)
    a = a[(a["op"] == AllocOp.ALLOC) & a["managed"]]
    return np.sort(a, order="t_ns", kind="stable")


_SEG = re.compile(r"^(small|large)_segment_(\d+)$")


def capture_segments(w) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(segment index, addr, bytes) of the capture's allocator segments, by index."""
    rows = []
    for a in w.allocations:
        m = _SEG.match(w.names[int(a["name_id"])] if 0 <= int(a["name_id"]) < len(w.names) else "")
        if m:
            rows.append((int(m.group(2)), int(a["addr"]), int(a["bytes"])))
    rows.sort()
    if not rows:
        raise ValidateError(f"{w.name}: the workload has no allocator segments: not a capture (umctl capture)")
    r = np.array(rows, np.int64)
    return r[:, 0], r[:, 1], r[:, 2]


def lcs_pairs(a: list, b: list) -> list[tuple[int, int]]:
    """Index pairs of a longest common subsequence of ``a`` and ``b`` (equal items), in order;
    rows of the table in numpy (the step's kernels: a few thousand a side)."""
    n, m = len(a), len(b)
    if n == 0 or m == 0:
        return []
    _, codes = np.unique(np.array([str(x) for x in a] + [str(x) for x in b], dtype=object), return_inverse=True)
    ca, cb = codes[:n], codes[n:]
    L = np.zeros((n + 1, m + 1), np.int32)
    for i in range(1, n + 1):
        eq = (cb == ca[i - 1])
        prev = L[i - 1]
        diag = np.where(eq, prev[:-1] + 1, 0)
        row = np.maximum(prev[1:], diag)
        L[i, 1:] = np.maximum.accumulate(row)   # L[i][j] >= L[i][j-1]
    pairs = []
    i, j = n, m
    while i > 0 and j > 0:
        if ca[i - 1] == cb[j - 1] and L[i, j] == L[i - 1, j - 1] + 1:
            pairs.append((i - 1, j - 1))
            i, j = i - 1, j - 1
        elif L[i - 1, j] >= L[i, j - 1]:
            i -= 1
        else:
            j -= 1
    return pairs[::-1]


_CLASSES = [
    ("conv", r"conv|cudnn|fprop|dgrad|wgrad|winograd|implicit_?gemm|im2col|col2im"),
    ("attention", r"fmha|attention|flash"),
    ("gemm", r"gemm|cutlass|xmma|cublas|splitkreduce|gemv|\bmm\b|addmm|bmm|baddbmm|_grouped_mm|matmul|dot_kernel"),
    ("softmax", r"softmax"),
    ("norm", r"layer[_ ]?norm|batch[_ ]?norm|group[_ ]?norm|rms[_ ]?norm|welford"),
    ("foreach", r"foreach|multi_tensor|fused_adam"),
    ("random", r"curand|distribution|random|philox|randint|randn|\brand\b|normal_|uniform_|bernoulli|randperm"),
    ("scan", r"scan|cumsum|cumprod"),
    ("index", r"gather|scatter|index|embedding|nll[_ ]?loss|\btake\b|sort|radix|unique|nonzero|topk|bincount|histc|masked"),
    ("reduce", r"reduce|\bsum\b|\bmean\b|amax|amin|\bmax\b|\bmin\b|\bvar\b|\bstd\b|\bnorm\b|argmax|argmin|\bany\b|\ball\b"),
]
_CLASS_RE = [(c, re.compile(p, re.I)) for c, p in _CLASSES]


def kernel_class(name: str) -> str:
    """A kernel's class from its name: a CUDA kernel's (mangled) name or a capture's aten op."""
    s = name
    if s.startswith("aten."):
        s = " " + s.split(".")[1].strip("_").replace("_backward", "").replace("_data", "").replace("_", " ") + " "
    for c, rx in _CLASS_RE:
        if rx.search(s):
            return c
    return "elementwise"


def _capture_kernel_sets(w, iteration: int) -> tuple[list[str], list[np.ndarray]]:
    """The capture's kernels of one iteration, in order: names and (segment, chunk) codes."""
    from umctl.workload.workload import OpType

    seg_idx, seg_addr, seg_bytes = capture_segments(w)
    order = np.argsort(seg_addr)
    s_addr, s_idx = seg_addr[order], seg_idx[order]
    ops = w.ops
    ks = ops[(ops["type"] == OpType.KERNEL) & (ops["iteration"] == iteration)]
    runs = w.acc_runs
    starts = np.r_[0, np.cumsum(runs.length)]
    names, sets = [], []
    for k in ks:
        lo, hi = int(k["acc_lo"]), int(k["acc_hi"])
        names.append(w.names[int(k["name_id"])])
        if hi <= lo:
            sets.append(np.zeros(0, np.int64))
            continue
        i0 = int(np.searchsorted(starts, lo, side="right") - 1)
        i1 = int(np.searchsorted(starts, hi, side="left"))
        p0 = runs.page[i0:i1] + np.maximum(0, lo - starts[i0:i1])
        p1 = runs.page[i0:i1] + np.minimum(runs.length[i0:i1], hi - starts[i0:i1])
        b0 = p0 >> (BLOCK_SHIFT - PAGE_SHIFT)
        b1 = (p1 - 1) >> (BLOCK_SHIFT - PAGE_SHIFT)
        blocks = np.unique(np.concatenate([np.arange(x, y + 1) for x, y in zip(b0.tolist(), b1.tolist())]))
        addr = blocks << BLOCK_SHIFT
        j = np.searchsorted(s_addr, addr, side="right") - 1
        sets.append(np.unique((s_idx[j] << CHUNK_BITS) | ((addr - s_addr[j]) >> BLOCK_SHIFT)))
    return names, sets


def _real_first_step_pairs(trace, launches: np.ndarray, steps: Steps, segs: np.ndarray):
    """The real run's faulted (launch, chunk) pairs, per step: (launch index, segment position,
    chunk) arrays of unique pairs, plus counts of faults outside every managed allocation."""
    from umctl.events.schema import Kind

    f = trace.events(Kind.FAULT)
    if len(f) == 0 or len(launches) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), 0
    kernel_of = np.full(len(f), -1, np.int64)
    for g in np.unique(f["gpu"]).tolist():
        on = np.flatnonzero(f["gpu"] == g)
        li = np.flatnonzero(launches["gpu"] == g)
        pos = np.searchsorted(launches["t_ns"][li], f["t_ns"][on], side="right") - 1
        kernel_of[on[pos >= 0]] = li[pos[pos >= 0]]
    addr = f["addr"].astype(np.int64)
    order = np.argsort(segs["addr"], kind="stable")
    s_addr = segs["addr"][order].astype(np.int64)
    s_end = s_addr + segs["bytes"][order].astype(np.int64)
    j = np.searchsorted(s_addr, addr, side="right") - 1
    inside = (j >= 0) & (addr < s_end[np.maximum(j, 0)])
    seg_pos = np.where(inside, order[np.maximum(j, 0)], -1)
    chunk = np.where(inside, (addr - s_addr[np.maximum(j, 0)]) >> BLOCK_SHIFT, -1)
    outside = int((~inside & (kernel_of >= 0)).sum())
    keep = inside & (kernel_of >= 0)
    key = np.unique(np.stack([kernel_of[keep], seg_pos[keep], chunk[keep]], axis=1), axis=0) \
        if keep.any() else np.zeros((0, 3), np.int64)
    return key[:, 0], key[:, 1], key[:, 2], outside


def kept_step(w) -> int:
    """The recording's step (0-based) that the capture's kept step stands for: the capture ran
    ``warmup_steps`` steps before the one it keeps (umctl.workload.capture), so its kept step's
    layout -- the optimizer state allocated, the caching allocator past its first step -- is
    the program's step ``warmup_steps``. The first step of a real run is the warm-up: its new
    activation segments hold, from the next step on, other tensors, so its faults are not the
    kept step's."""
    try:
        return max(0, int(w.meta.get("warmup_steps", 0) or 0))
    except (TypeError, ValueError):
        return 0


def capture_warmup_sets(log, step: int = 0) -> tuple[list[str], list[np.ndarray]]:
    """The capture's warm-up step ``step`` (the cold first step, which the workload does not
    hold): its kernels in order, names and (segment, chunk) codes, the segments numbered as in
    the workload (the caching allocator replayed over the capture's history, as
    umctl.workload.capture.build.plan does)."""
    from umctl.workload.capture.allocator import CachingAllocator
    from umctl.workload.capture.recorder import ALLOC, FREE, OP

    if log is None or len(log.step_starts) < 2 or step + 1 >= len(log.step_starts):
        return [], []
    alloc, where = CachingAllocator(), {}
    empty = {s.sid for s in log.storages if s.nbytes == 0}
    a0, a1 = log.step_starts[step], log.step_starts[step + 1]
    names, sets = [], []
    for e, (kind, v) in enumerate(log.events[:a1]):
        if kind in (ALLOC, FREE) and v in empty:
            continue
        if kind == ALLOC:
            where[v], _ = alloc.malloc((v, 0), log.storages[v].nbytes)
        elif kind == FREE and (v, 0) in alloc.live:
            alloc.free((v, 0))
        elif kind == OP and e >= a0:
            codes = set()
            for sid, lo, hi in list(v.reads) + list(v.writes):
                pl = where.get(sid)
                if pl is None or hi <= lo:
                    continue
                c0, c1 = (pl.offset + lo) >> BLOCK_SHIFT, (pl.offset + hi - 1) >> BLOCK_SHIFT
                codes.update((pl.segment << CHUNK_BITS) | c for c in range(c0, c1 + 1))
            names.append(v.name)
            sets.append(np.array(sorted(codes), np.int64))
    return names, sets


def _align(real_names: list[str], cap_names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Real kernel -> capture kernel by an LCS of name classes (names and order only); a real
    kernel the LCS left out takes the capture kernel of the aligned real kernel before it.
    Returns (that mapping, which real kernels the LCS aligned)."""
    align = lcs_pairs([kernel_class(n) for n in real_names], [kernel_class(n) for n in cap_names])
    a_of = np.full(len(real_names), -1, np.int64)
    for i, j in align:
        a_of[i] = j
    filled = a_of.copy()
    last = -1
    for i in range(len(filled)):
        if filled[i] >= 0:
            last = filled[i]
        else:
            filled[i] = max(last, 0) if cap_names else -1
    return filled, a_of >= 0


def match_segments(real_sizes: list[int], cap_sizes: list[int], evidence: dict | None = None) -> list[tuple[int, int]]:
    """Real segment -> capture segment (index pairs), one to one, same size only. ``evidence``
    ({(real, capture): weight}, from steps other than the scored one) pairs segments first,
    greedily by weight (ties: the nearer in creation order); the rest by an LCS of sizes in
    creation order. Without evidence: that LCS alone (the allocators create them in program
    order -- unless, as in an MoE, the two create different numbers of them)."""
    pairs: dict[int, int] = {}
    used: set[int] = set()
    for (i, j), v in sorted((evidence or {}).items(), key=lambda kv: (-kv[1], abs(kv[0][0] - kv[0][1]), kv[0])):
        if v > 0 and i not in pairs and j not in used and real_sizes[i] == cap_sizes[j]:
            pairs[i] = j
            used.add(j)
    ri = [i for i in range(len(real_sizes)) if i not in pairs]
    ci = [j for j in range(len(cap_sizes)) if j not in used]
    for a, b in lcs_pairs([real_sizes[i] for i in ri], [cap_sizes[j] for j in ci]):
        pairs[ri[a]] = ci[b]
    return sorted(pairs.items())


def _launch_names(trace, launches: np.ndarray, lo: int = 0, hi: int | None = None) -> list[str]:
    """The kernel names of ``launches[lo:hi]`` (an unnamed one by its function's address)."""
    return [trace.names[int(i)] if 0 <= int(i) < len(trace.names) else f"func 0x{int(fn):x}"
            for i, fn in zip(launches["name_id"][lo:hi], launches["func"][lo:hi])]


def _step_names(trace, launches: np.ndarray, steps: Steps, s: int) -> tuple[int, list[str]]:
    s0 = int(steps.starts[s])
    s1 = int(steps.starts[s + 1]) if s + 1 < steps.n else steps.end
    return s0, _launch_names(trace, launches, s0, s1)


def segment_phases(segs: np.ndarray, launches: np.ndarray, steps: Steps) -> np.ndarray:
    """Per segment: the part of the run that created it (-1 set-up, i step i, n tail), from
    the last launch issued before its ALLOC record."""
    pos = np.searchsorted(launches["t_ns"], segs["t_ns"], side="right") - 1 if len(launches) else \
        np.full(len(segs), -1, np.int64)
    step_of = steps.step_of(len(launches))
    return np.where(pos >= 0, step_of[np.maximum(pos, 0)] if len(launches) else -1, -1).astype(np.int64)


def map_run_segments(segs: np.ndarray, launches: np.ndarray, steps: Steps,
                     o_segs: np.ndarray, o_launches: np.ndarray, o_steps: Steps) -> np.ndarray:
    """Another run's segments -> this run's (position, -1 if none): an LCS of (the part of the
    run that created it, size) in creation order -- the identity where the two runs created
    the same sizes in the same order (the caching allocator, the same program); an MoE's
    routing may create a few segments more in one run."""
    a = list(zip(segment_phases(segs, launches, steps).tolist(), segs["bytes"].astype(np.int64).tolist()))
    b = list(zip(segment_phases(o_segs, o_launches, o_steps).tolist(), o_segs["bytes"].astype(np.int64).tolist()))
    out = np.full(len(b), -1, np.int64)
    for i, j in lcs_pairs(a, b):
        out[j] = i
    return out


def _add_evidence(evidence: dict, trace, launches: np.ndarray, steps: Steps, li, sp, ch, pstep, skip,
                  capture_of, pos_of: dict, cap_sizes: list[int], real_sizes: list[int], to_scored: np.ndarray,
                  window: int) -> list[int]:
    """Adds to ``evidence`` ({(scored run's segment, capture segment position): weight}) the
    faults of ``trace``'s steps but ``skip``: a fault's aligned capture kernel (+-window)
    touching that chunk of a same-size capture segment; ``to_scored`` maps ``trace``'s segment
    positions to the scored run's (-1: none). Returns the steps used."""
    used = []
    for s in range(steps.n):
        on = pstep == s
        if s == skip or not on.any():
            continue
        cap = capture_of(s)
        if cap is None or not cap[0]:
            continue
        used.append(s)
        s0, names = _step_names(trace, launches, steps, s)
        filled, _ = _align(names, cap[0])
        by_chunk = []   # per capture kernel: chunk -> capture segment positions
        for x in cap[1]:
            d: dict[int, list[int]] = {}
            for code in x.tolist():
                d.setdefault(code & ((1 << CHUNK_BITS) - 1), []).append(pos_of.get(code >> CHUNK_BITS, -1))
            by_chunk.append(d)
        for p, sg, c in zip((li[on] - s0).tolist(), sp[on].tolist(), ch[on].tolist()):
            j = int(filled[p])
            r = int(to_scored[sg])
            if j < 0 or r < 0:
                continue
            cands = {q for x in range(max(0, j - window), min(len(by_chunk), j + window + 1))
                     for q in by_chunk[x].get(c, ()) if q >= 0 and cap_sizes[q] == real_sizes[r]}
            for q in cands:
                evidence[(r, q)] = evidence.get((r, q), 0.0) + 1.0 / len(cands)
    return used


def access_share(trace, launches: np.ndarray, steps: Steps, w, *, window: int = 2,
                 capture_iteration: int = 0, real_step: int | None = None, warmup=None, other=None) -> dict:
    """Of the faulted (kernel, 2 MiB chunk) pairs of the real step the capture keeps
    (``real_step``, default :func:`kept_step`, at most the last step), the share the capture's
    access sets predict (see the module's docstring). ``warmup``: the capture's warm-up step
    (:func:`capture_warmup_sets`), which stands for real step 0: then real step 0 is evidence
    for the segments' correspondence when a later step is scored, and is scored against it
    (the cold step) when ``real_step`` is 0. ``other``: (trace, launches, steps) of another run
    of the program (the budget recording): the faults of all its steps are evidence too, its
    segments mapped to these by :func:`map_run_segments` (another run: not the faults scored),
    for the segments that this run's other steps leave without evidence."""
    segs = real_segments(trace)
    seg_idx, _, seg_bytes = capture_segments(w)
    real_sizes = segs["bytes"].astype(np.int64).tolist()
    cap_sizes = seg_bytes.tolist()
    li, sp, ch, outside = _real_first_step_pairs(trace, launches, steps, segs)
    step_of = steps.step_of(len(launches))
    pstep = step_of[li] if len(li) else li
    per_step = {"setup": int((pstep < 0).sum()), **{str(s): int((pstep == s).sum()) for s in range(steps.n)},
                "tail": int((pstep >= steps.n).sum())}
    rs = min(kept_step(w) if real_step is None else max(0, int(real_step)), steps.n - 1)
    warm_names, warm_sets = warmup if warmup else ([], [])
    kept = kept_step(w)

    def capture_of(s: int) -> tuple[list[str], list[np.ndarray]] | None:
        """The capture's kernels standing for real step s: its warm-up (step < kept), or the
        kept step's repetition s - kept (the last one past the end)."""
        if s < kept:
            return (warm_names, warm_sets) if warm_names and kept == 1 else None
        it = min(capture_iteration + s - kept, int(w.ops["iteration"].max()) if len(w.ops) else 0)
        return _capture_kernel_sets(w, it)

    # segment correspondence: evidence from the faults of every step but the scored one, and
    # from every step of another run of the program (``other``), its segments mapped to these,
    # for the segments without the former
    pos_of = {int(i): k for k, i in enumerate(seg_idx.tolist())}
    evidence: dict[tuple[int, int], float] = {}
    ev_steps = _add_evidence(evidence, trace, launches, steps, li, sp, ch, pstep, rs, capture_of, pos_of,
                             cap_sizes, real_sizes, np.arange(len(segs)), window)
    cross = None
    if other is not None:
        o_trace, o_launches, o_steps = other
        o_segs = real_segments(o_trace)
        to_here = map_run_segments(segs, launches, steps, o_segs, o_launches, o_steps)
        o_li, o_sp, o_ch, _ = _real_first_step_pairs(o_trace, o_launches, o_steps, o_segs)
        o_pstep = o_steps.step_of(len(o_launches))[o_li] if len(o_li) else o_li
        o_evidence: dict[tuple[int, int], float] = {}
        o_ev = _add_evidence(o_evidence, o_trace, o_launches, o_steps, o_li, o_sp, o_ch, o_pstep, None, capture_of,
                             pos_of, cap_sizes, real_sizes, to_here, window)
        # only for the segments this run's own other steps leave without evidence (its own come first)
        own = {i for i, _ in evidence}
        n_before = len(evidence)
        evidence.update({k: v for k, v in o_evidence.items() if k[0] not in own})
        cross = {"segments": len(o_segs), "mapped": int((to_here >= 0).sum()),
                 "same_size_sequence": o_segs["bytes"].astype(np.int64).tolist() == real_sizes,
                 "steps": o_ev, "new_evidence_pairs": len(evidence) - n_before}
    pairs = match_segments(real_sizes, cap_sizes, evidence)
    seg_map = np.full(len(segs), -1, np.int64)
    for i, j in pairs:
        seg_map[i] = int(seg_idx[j])
    seg_info = {"real": len(segs), "capture": len(seg_idx), "matched": len(pairs),
                "method": (f"same size, by the aligned kernels' chunks in real step(s) {ev_steps} (not the scored one)"
                           + (f" and the other recording's step(s) {cross['steps']}" if cross and cross["steps"] else "")
                           + ", then an LCS of sizes in creation order") if evidence else "LCS of sizes in creation order",
                "matched_by_access": len({i for i, _ in evidence} & {i for i, _ in pairs}) if evidence else 0,
                "real_bytes": int(sum(real_sizes)), "capture_bytes": int(sum(cap_sizes)),
                "matched_bytes": int(sum(real_sizes[i] for i, _ in pairs)),
                "unmatched_real_sizes": sorted({int(real_sizes[i]) for i in range(len(segs)) if seg_map[i] < 0})[:20]}
    if cross is not None:
        seg_info["other_recording"] = cross

    first = pstep == rs
    kpos = li[first] - int(steps.starts[rs])
    cseg = seg_map[sp[first]] if first.any() else np.zeros(0, np.int64)
    mapped = cseg >= 0
    code = np.where(mapped, (np.maximum(cseg, 0) << CHUNK_BITS) | ch[first], -1)

    _, real_names = _step_names(trace, launches, steps, rs)
    cap = capture_of(rs)
    cold = rs < kept and cap is not None
    cap_names, cap_sets = cap if cap is not None else _capture_kernel_sets(w, capture_iteration)
    rc = [kernel_class(n) for n in real_names]
    cc = [kernel_class(n) for n in cap_names]
    filled, direct = _align(real_names, cap_names)
    n_cap = len(cap_sets)
    union = np.unique(np.concatenate(cap_sets)) if cap_sets else np.zeros(0, np.int64)

    py_sets = [set(x.tolist()) for x in cap_sets]

    def hits(mapping: np.ndarray, w_: int) -> int:
        h = 0
        for p, c in zip(kpos.tolist(), code.tolist()):
            j = int(mapping[p]) if n_cap else -1
            if c < 0 or j < 0:
                continue
            if any(c in py_sets[x] for x in range(max(0, j - w_), min(n_cap, j + w_ + 1))):
                h += 1
        return h

    by_pos = (np.arange(len(rc)) * n_cap // max(1, len(rc))).astype(np.int64)
    total = int(len(code))
    n_mapped = int(mapped.sum())
    step_hits = int(np.isin(code[mapped], union).sum()) if n_mapped else 0
    r = {
        "segments": seg_info,
        "faulted_pairs_per_step": per_step,
        "faults_outside_managed_allocations": outside,
        "scored_step": {
            "real_step": rs,
            "capture_step": "warm-up (cold)" if cold else "kept",
            "real_kernels": len(rc), "capture_kernels": n_cap, "aligned_kernels": int(direct.sum()),
            "alignment": "LCS of kernel classes (names and order only)",
            "class_counts_real": _counts(rc), "class_counts_capture": _counts(cc),
            "pairs": total, "pairs_in_matched_segments": n_mapped,
            "pairs_of_aligned_kernels": int(direct[kpos].sum()) if total else 0,
        },
        "share": {},
    }
    if total:
        r["share"] = {
            "aligned_kernel": hits(filled, 0) / total,
            f"aligned_within_{window}": hits(filled, window) / total,
            "by_position": hits(by_pos, 0) / total,
            "step_level": step_hits / total,
            "step_level_of_matched_segments": step_hits / n_mapped if n_mapped else None,
        }
    return r


def _counts(xs: list[str]) -> dict:
    out: dict[str, int] = {}
    for x in xs:
        out[x] = out.get(x, 0) + 1
    return dict(sorted(out.items()))


# -- the comparison --------------------------------------------------------------------------

def calibration_for(trace, name: str | None):
    from umctl.sim.calibration import DEFAULT, Calibration, shipped_for

    if name:
        return Calibration.load(name)
    shipped = shipped_for(trace.meta) if trace is not None else None
    return Calibration.load(shipped) if shipped else DEFAULT


def _kernel_positions(w) -> np.ndarray:
    """Indices in ``w.ops`` of the kernels that are launches (in launch order: the synthetic
    kernel for faults before the first launch left out)."""
    from umctl.workload.tracefile import BEFORE_FIRST_LAUNCH
    from umctl.workload.workload import OpType

    kpos = np.flatnonzero(w.ops["type"] == OpType.KERNEL)
    names = w.names + [""]
    return np.array([k for k in kpos if names[int(w.ops["name_id"][k])] != BEFORE_FIRST_LAUNCH], np.int64)


def _phase_ranges(steps: Steps, n_launches: int) -> list[tuple[int, int]]:
    """Launch index ranges: the set-up, each step, the tail."""
    cuts = [0, *map(int, steps.starts), int(steps.end), n_launches]
    return list(zip(cuts[:-1], cuts[1:]))


def transplant_compute(w, trace, launches: np.ndarray, steps: Steps, src, gpu_mem: int) -> dict:
    """Give the kernels of ``w`` (the workload of ``trace``, a --complete-accesses recording)
    the compute times of the same kernels in ``src`` = (trace, launches, steps) of a recording
    of the same program that ran at full speed (no budget), in place.

    Why: under --complete-accesses every kernel faults all it touches and the GPU is drained
    after it, so its recorded time is mostly fault service, not compute (the replay would then
    charge the faults twice). The kernel sequence is the program's and repeats run to run:
    kernels are paired per phase (set-up, step i, tail) by name, by position where the phase's
    names agree, else by a longest common subsequence. An unpaired kernel (cuDNN may pick
    other algorithms run to run) takes the median time of its name in ``src``; one whose name
    ``src`` never ran keeps its recorded time less the recorded fault service. Returns how
    many kernels took which."""
    s_trace, s_launches, s_steps = src
    w_src = recording_workload(s_trace, gpu_mem)
    k_dst, k_src = _kernel_positions(w), _kernel_positions(w_src)
    if len(k_dst) != len(launches) or len(k_src) != len(s_launches):
        raise ValidateError("a recording's workload and its launches disagree: cannot pair kernels")

    dst_names, src_names = _launch_names(trace, launches), _launch_names(s_trace, s_launches)
    done = np.zeros(len(launches), bool)
    d_ph, s_ph = _phase_ranges(steps, len(launches)), _phase_ranges(s_steps, len(s_launches))
    for (d0, d1), (s0, s1) in zip(d_ph, s_ph):
        a, b = dst_names[d0:d1], src_names[s0:s1]
        pairs = [(i, i) for i in range(len(a))] if a == b else lcs_pairs(a, b)
        if not pairs:
            continue
        di = np.array([d0 + i for i, _ in pairs]); si = np.array([s0 + j for _, j in pairs])
        w.ops["compute_ns"][k_dst[di]] = w_src.ops["compute_ns"][k_src[si]]
        done[di] = True
    by_name: dict[str, list[int]] = {}
    for nm, c in zip(src_names, w_src.ops["compute_ns"][k_src].tolist()):
        by_name.setdefault(nm, []).append(c)
    n_name = 0
    for i in np.flatnonzero(~done):
        cs = by_name.get(dst_names[i])
        if cs:
            w.ops["compute_ns"][k_dst[i]] = int(np.median(cs))
            n_name += 1
    return {"kernels": int(len(launches)), "paired": int(done.sum()), "by_name": n_name,
            "own": int(len(launches) - done.sum() - n_name), "from": "no-budget recording"}


def time_comparison(trace, launches: np.ndarray, steps: Steps, cap: dict[str, np.ndarray], gpu_mem: int,
                    modes: list[str], calib, compute_from=None) -> dict:
    """Per-step replayed times of the recording (``steps`` of ``launches``) beside the capture's
    (``cap``: :func:`replay` of the capture), per mode. ``compute_from``: (trace, launches,
    steps) of a full-speed recording whose kernels' times replace the recording's
    (:func:`transplant_compute`)."""
    w_rec = recording_workload(trace, gpu_mem)
    set_step_iterations(w_rec, steps, len(launches))
    paired = None
    if compute_from is not None:
        paired = transplant_compute(w_rec, trace, launches, steps, compute_from, gpu_mem)
    totals: dict = {}
    rec = replay(w_rec, modes, calib, totals)
    out = {"steps": {"n": steps.n, "method": steps.method, "gap_ms": steps.gap_ms,
                     "launches_per_step": np.diff(np.r_[steps.starts, steps.end]).tolist()},
           "modes": {}, "recording_totals": totals, "recording_compute_s": compute_per_iteration(w_rec)}
    if paired is not None:
        out["compute"] = paired
    for m in modes:
        rs = step_times_recording(rec[m], steps.n)
        cs = step_times_capture(cap[m])
        r_st, c_st = steady(rs), steady(cs)
        out["modes"][m] = {"recording_steps_s": rs, "capture_steps_s": cs, "recording_steady_s": r_st,
                           "capture_steady_s": c_st,
                           "capture_over_recording": (c_st / r_st) if r_st and c_st is not None else None}
    return out


def validate(args) -> dict:
    from umctl.sim.replay import parse_modes
    from umctl.units import parse_size

    if not args.recording and not args.budget_recording and not args.complete_recording:
        raise ValidateError("give --recording (no budget), --budget-recording (at the budget) and/or "
                            "--complete-recording (umctl run --complete-accesses)")
    try:
        gpu_mem = parse_size(args.gpu_mem)
    except ValueError as e:
        raise ValidateError(f"--gpu-mem {args.gpu_mem}: {e}") from None
    if gpu_mem < 2 << 20:
        raise ValidateError(f"--gpu-mem {args.gpu_mem}: must be at least 2 MiB")
    recs = {}
    for label, path in (("nobudget", args.recording), ("budget", args.budget_recording),
                        ("complete", args.complete_recording)):
        if path:
            t = load_recording(path)
            check_runtime_recording(t, path)
            recs[label] = (path, t)
    first = next(iter(recs.values()))[1]
    calib = calibration_for(first, args.calibration)
    w, log = load_capture(args.capture, args.program, args.batch, args.iters, gpu_mem, calib)
    warmup = capture_warmup_sets(log) if log is not None and kept_step(w) == 1 else None
    for path, t in recs.values():
        check_same_program(w, t, path)
    modes = parse_modes(args.modes)
    out = {"capture": {"name": w.name, "entry": w.meta.get("entry"), "batch": w.meta.get("batch"),
                       "iterations": int(w.ops["iteration"].max()) + 1 if len(w.ops) else 0,
                       "peak_managed_bytes": int(w.peak_managed_bytes)},
           "gpu_mem": int(gpu_mem), "calibration": calib.name, "recordings": {}}
    found = {}
    for label, (path, t) in recs.items():   # steps first: a recording without them fails before any replay
        n_steps = args.steps or recorded_steps(t)
        if not n_steps:
            raise ValidateError(f"{path}: the recorded command line has no --steps: pass --steps N")
        launches = launches_of(t)
        try:
            found[label] = (n_steps, launches, detect_steps(launches, n_steps))
        except ValidateError as e:
            raise ValidateError(f"{path}: {e}") from None
    cap_totals: dict = {}
    cap = None if args.no_replay else replay(w, modes, calib, cap_totals)
    if cap is not None:
        out["capture_totals"], out["capture_compute_s"] = cap_totals, compute_per_iteration(w)
    for label, (path, t) in recs.items():
        n_steps, launches, steps = found[label]
        row: dict = {"file": path, "command": t.meta.get("command"), "steps_expected": n_steps,
                     "launch_times": launch_timing(t)}
        if cap is not None:
            src = None
            if label == "complete" and "nobudget" in recs:   # its kernel times are fault service
                src = (recs["nobudget"][1], found["nobudget"][1], found["nobudget"][2])
            row["time"] = time_comparison(t, launches, steps, cap, gpu_mem, modes, calib, compute_from=src)
        if label == "nobudget" or len(recs) == 1:
            other = None
            if label == "nobudget" and "budget" in recs and args.cross_evidence:
                other = (recs["budget"][1], found["budget"][1], found["budget"][2])
            row["access"] = access_share(t, launches, steps, w, window=args.window, real_step=args.real_step,
                                         warmup=warmup, other=other)
            if warmup and args.real_step is None:   # the cold step: real step 0 against the capture's warm-up
                row["access_cold"] = access_share(t, launches, steps, w, window=args.window, real_step=0,
                                                  warmup=warmup, other=other)
        out["recordings"][label] = row
    return out


# -- slim recordings and tables ---------------------------------------------------------------

#: what this tool and the replay read of a recording
SLIM_KINDS = ("fault", "replay", "launch", "alloc", "copy", "cpu_fault", "drops", "access")


def slim(src: str, dst: str) -> dict:
    """Rewrite recording ``src`` as ``dst`` with only :data:`SLIM_KINDS` (metadata and names
    kept; ``slimmed`` in the metadata counts what was left out). Returns the counts kept."""
    from umctl.events.schema import EventBatch, Kind
    from umctl.events.trace import TraceWriter

    t = load_recording(src)
    keep = {Kind(k) for k in SLIM_KINDS}
    meta = dict(t.meta)
    meta.pop("names", None)
    meta["slimmed"] = {k.value: len(t.events(k)) for k in Kind if k not in keep and len(t.events(k))}
    kept = {}
    with TraceWriter(dst, meta, names=list(t.names)) as w:
        for k in keep:
            e = t.events(k)
            if len(e):
                b = EventBatch(names=list(t.names))
                b.add(k, e)
                w.write(b)
                kept[k.value] = len(e)
    return kept


def launch_timing(trace) -> str:
    """How the recording timed its launches: a controller attached (``--mode``) makes the
    runtime report each at its kernel's start; without one it is the host's issue time."""
    return "kernel start" if trace.meta.get("mode") else "host issue"


def tables(paths: list[str]) -> str:
    """The doc's two markdown tables from this tool's JSON files."""
    rows = []
    for p in paths:
        try:
            with open(p) as f:
                rows.append(json.load(f))
        except (OSError, ValueError) as e:
            raise ValidateError(f"{p}: cannot read this tool's JSON ({e})") from None
    out = ["| program | GPU memory | recording | capture none s/step | recording none s/step | capture / recording "
           "| capture deepum s/step | recording deepum s/step | capture / recording |",
           "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        for label, rec in r["recordings"].items():
            t = rec.get("time")
            if not t:
                continue
            m = t["modes"]
            n, d = m.get("none", {}), m.get("deepum", {})
            out.append(f"| {r['capture']['name']} | {r['gpu_mem'] / 2**30:.2f} GiB | {label} "
                       f"| {_f(n.get('capture_steady_s'))} | {_f(n.get('recording_steady_s'))} "
                       f"| {_f(n.get('capture_over_recording'), '{:.2f}×')} | {_f(d.get('capture_steady_s'))} "
                       f"| {_f(d.get('recording_steady_s'))} | {_f(d.get('capture_over_recording'), '{:.2f}×')} |")
    out += ["", "| program | segments matched (real / captured) | kept-step faulted pairs (in matched segments) "
            "| real / captured / aligned kernels | aligned kernel | within ±W | by position | step level |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        for label, rec in r["recordings"].items():
            a = rec.get("access")
            if not a:
                continue
            sg, fs, sh = a["segments"], a["scored_step"], a["share"]
            within = next((v for k, v in sh.items() if k.startswith("aligned_within")), None)
            out.append(f"| {r['capture']['name']} | {sg['matched']} of {sg['real']} / {sg['capture']} "
                       f"| {fs['pairs']} ({fs['pairs_in_matched_segments']}) "
                       f"| {fs['real_kernels']} / {fs['capture_kernels']} / {fs['aligned_kernels']} "
                       f"| {_f(sh.get('aligned_kernel'), '{:.1%}')} | {_f(within, '{:.1%}')} "
                       f"| {_f(sh.get('by_position'), '{:.1%}')} | {_f(sh.get('step_level'), '{:.1%}')} |")
    return "\n".join(out)


# -- output ----------------------------------------------------------------------------------

def _f(x, fmt="{:.3f}") -> str:
    return "-" if x is None else fmt.format(x)


def render(res: dict) -> str:
    lines = [f"capture {res['capture']['name']} (batch {res['capture']['batch']}, "
             f"{res['capture']['iterations']} iterations, peak {res['capture']['peak_managed_bytes'] / 2**30:.3f} GiB); "
             f"GPU {res['gpu_mem'] / 2**30:.3f} GiB; calibration {res['calibration']}"]
    for label, row in res["recordings"].items():
        lines.append(f"\nrecording [{label}] {row['file']} (launches timed at {row['launch_times']})")
        if row["launch_times"] != "kernel start":
            lines.append("  (no controller was attached: faults are charged to the kernel the host issued last, which "
                         "may run well after them; per-kernel shares are a lower bound -- record with --mode none)")
        t = row.get("time")
        if t:
            s = t["steps"]
            lines.append(f"  steps: {s['n']} found ({s['method']}; median gap before a step "
                         f"{s['gap_ms']:.2f} ms; launches per step {s['launches_per_step']})")
            lines.append(f"  {'mode':10} {'capture s/step':>15} {'recording s/step':>17} {'capture/recording':>18}")
            for m, r in t["modes"].items():
                lines.append(f"  {m:10} {_f(r['capture_steady_s'], '{:.4f}'):>15} "
                             f"{_f(r['recording_steady_s'], '{:.4f}'):>17} {_f(r['capture_over_recording'], '{:.2f}x'):>18}")
            if label == "nobudget":
                lines.append("  (a no-budget recording holds first touches only: its replay at a smaller GPU "
                             "misses every later access; the complete recording is the like-for-like one)")
            if t.get("compute"):
                c = t["compute"]
                lines.append(f"  kernel times from the {c['from']}: {c['paired']} of {c['kernels']} kernels paired, "
                             f"{c.get('by_name', 0)} by their name's median, {c.get('own', 0)} their own")
        for key in ("access", "access_cold"):
            a = row.get(key)
            if not a:
                continue
            sg, fs = a["segments"], a["scored_step"]
            lines.append(f"  segments matched ({sg.get('method', 'LCS of sizes in creation order')}): {sg['matched']} "
                         f"of {sg['real']} real ({sg.get('matched_by_access', 0)} by access), "
                         f"{sg['capture']} captured; {sg['matched_bytes'] / 2**20:.0f} of "
                         f"{sg['real_bytes'] / 2**20:.0f} MiB real; unmatched real sizes {sg['unmatched_real_sizes']}")
            if key == "access":
                lines.append(f"  faulted (kernel, 2 MiB chunk) pairs per step: {a['faulted_pairs_per_step']}; "
                             f"faults outside managed allocations: {a['faults_outside_managed_allocations']}")
            what = "the capture's warm-up, cold" if fs.get("capture_step", "").startswith("warm") else "the capture's kept step"
            lines.append(f"  step {fs['real_step']} ({what}): {fs['real_kernels']} real kernels, {fs['capture_kernels']} captured, "
                         f"{fs['aligned_kernels']} aligned ({fs['alignment']}); {fs['pairs']} faulted pairs, "
                         f"{fs['pairs_in_matched_segments']} in matched segments")
            for k, v in a["share"].items():
                lines.append(f"    share predicted, {k.replace('_', ' '):32} {_f(v, '{:.1%}')}")
    return "\n".join(lines)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="A capture against a real recording of the same program "
                                 "(docs/evaluation/capture.md).")
    ap.add_argument("--capture", help="the capture (.umw from umctl capture)")
    ap.add_argument("--program", help="or capture this program now: FILE.py[:make_step]")
    ap.add_argument("--batch", type=int, help="--program's batch")
    ap.add_argument("--iters", type=int, default=4, help="--program: steady steps in the capture (default 4)")
    ap.add_argument("--recording", help="umctl run --runtime --managed -o trace, no budget (access sets)")
    ap.add_argument("--budget-recording", help="the same at the budget (per-step time)")
    ap.add_argument("--complete-recording", help="umctl run --complete-accesses -o trace: every kernel's whole "
                    "access set (per-step time like for like; kernel times from --recording when given)")
    ap.add_argument("--gpu-mem", help="the budget: the replayed GPU's memory (e.g. 953MiB)")
    ap.add_argument("--steps", type=int, help="steps the recorded program ran (default: its command line's --steps)")
    ap.add_argument("--modes", default="none,deepum")
    ap.add_argument("--calibration", help="calibration for both replays (default: the recording GPU's shipped one)")
    ap.add_argument("--real-step", type=int, default=None,
                    help="the recording's step scored for access sets (default: the capture's warm-up steps, 1)")
    ap.add_argument("--window", type=int, default=2, help="kernels either side counted as 'within' (default 2)")
    ap.add_argument("--no-replay", action="store_true", help="access sets only")
    ap.add_argument("--cross-evidence", action="store_true", help="match the no-budget recording's segments "
                    "also by the budget recording's faults (another run), for those its own other steps do not "
                    "touch (off: it lowers the transformer's share, 79.7 -> 51.1 %%, and lifts the MoE's only "
                    "0.0 -> 2.3 %%)")
    ap.add_argument("--json", help="also write the figures as JSON to this file ('-': stdout only)")
    ap.add_argument("--slim", nargs=2, metavar=("IN", "OUT"), help="rewrite a recording with only the kinds "
                    "this tool reads (on the device, to keep files small), and exit")
    ap.add_argument("--tables", nargs="+", metavar="JSON", help="print the doc's markdown tables from "
                    "this tool's --json files, and exit")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    a = parse_args(argv)
    try:
        if a.slim:
            kept = slim(*a.slim)
            print(f"{a.slim[1]}: {os.path.getsize(a.slim[1]) / 2**20:.1f} MiB, " +
                  ", ".join(f"{v:,} {k}" for k, v in sorted(kept.items())))
            return 0
        if a.tables:
            print(tables(a.tables))
            return 0
        if not a.gpu_mem:
            raise ValidateError("--gpu-mem is required (the budget: the replayed GPU's memory)")
        res = validate(a)
    except UmctlError as e:
        print(f"capture_validate: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return 2
    if a.json == "-":
        print(json.dumps(res, indent=1, default=str))
        return 0
    print(render(res))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
