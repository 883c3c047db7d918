"""benchmarks/capture_validate.py: a capture against a recording of the same program, on a
synthetic recording made from the capture itself, so that the steps, the segments, the kernel
alignment, the shares and the replayed step times are known by construction."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from umctl.events.schema import AllocOp, EventBatch, Kind, empty  # noqa: E402
from umctl.events.trace import TraceWriter  # noqa: E402
from umctl.sim.calibration import DEFAULT  # noqa: E402
from umctl.units import BLOCK_SIZE  # noqa: E402
from umctl.workload.capture import capture_workload  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("capture_validate", ROOT / "benchmarks" / "capture_validate.py")
cv = importlib.util.module_from_spec(spec)
sys.modules["capture_validate"] = cv
spec.loader.exec_module(cv)

MiB = 1 << 20
STEPS = 4
GAP_NS = 2_000_000          # the host's wait at a step's end (the next launch comes this much later)
WORKSPACE = 32 * MiB        # a real segment the capture does not have (cuBLAS's workspace)
EXTRA = 3                   # faults in the workspace, charged to the step's first kernel
MISCHARGED = 2              # first-touch chunks charged (again) to the step's last kernel
UNSEEN = 5                  # kernels a real step starts with that the capture lacks (softmax: none in it)
UNSEEN_NS = 1000
KEPT = 1                    # the recording's step the capture keeps (after its one warm-up step)

PROGRAM = '''
import torch

def make_step(batch, device):
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024)).to(device)
    opt = torch.optim.Adam(model.parameters(), foreach=False)

    def step():
        x = torch.randn(batch, 1024, device=device)
        loss = model(x).square().sum()
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()

    return model, step
'''

#: a CUDA kernel name of each class (what a real run's launches are called)
CUDA_NAME = {"gemm": "sm90_xmma_gemm_f32f32_f32f32_f32_tn_n", "elementwise": "vectorized_elementwise_kernel<4, Functor>",
             "reduce": "reduce_kernel<512, 1, ReduceOp<float, sum_functor>>",
             "random": "distribution_elementwise_grid_stride_kernel", "foreach": "multi_tensor_apply_kernel",
             "index": "vectorized_gather_kernel", "softmax": "cunn_SoftMaxForward", "norm": "vectorized_layer_norm_kernel",
             "scan": "tensor_kernel_scan_innermost_dim", "attention": "fmha_cutlassF", "conv": "implicit_convolve_kernel"}


@pytest.fixture(scope="module")
def program(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("prog") / "tiny.py"
    p.write_text(PROGRAM)
    return p


@pytest.fixture(scope="module")
def capture(program):
    w, _ = capture_workload(f"{program}:make_step", 64, gpu_mem=1 << 30, iterations=4)
    return w


def synthetic_recording(path: Path, w, *, script: str = "tiny.py", fault_step: int = 0,
                        warmup_elsewhere: bool = False, created: list[int] | None = None, slow: int = 1) -> dict:
    """A `umctl run --runtime --managed --mode none` recording of the captured program as the
    capture predicts it: the workspace segment first, then the capture's segments (at other
    addresses); a few set-up launches, STEPS steps of the capture's kept step (one launch per
    kernel, each running its capture time, GAP_NS before each step), a tail; each chunk
    faulted once, in step 0, by the first kernel that touches it, plus EXTRA faults in the
    workspace and MISCHARGED chunks faulted again by the step's last kernel. Each step starts
    with UNSEEN kernels of a class the capture does not have (they fault nothing): aligning by
    position is then off by up to UNSEEN kernels, by class not at all. ``fault_step``: the step
    whose kernels fault first touches as the capture's kept step predicts (a real run: 1, the
    step after the warm-up the capture keeps); ``warmup_elsewhere``: step 0 then faults every
    chunk from its last kernel (the warm-up, with another layout). ``created``: the order in
    which the run created the capture's segments (positions; default the capture's). ``slow``:
    every step kernel runs that many times its capture time (a --complete-accesses run, whose
    kernels are mostly fault service)."""
    names_cap, sets = cv._capture_kernel_sets(w, 0)
    seg_idx, _, seg_bytes = cv.capture_segments(w)
    base = 0x7F00_0000_0000
    real_addr = {}
    addr = base + WORKSPACE
    for i, b in zip(seg_idx.tolist(), seg_bytes.tolist()):
        real_addr[i] = addr
        addr += b
    allocs = empty(Kind.ALLOC, 1 + len(seg_idx))
    allocs["t_ns"] = np.r_[0, 1 + np.argsort(created)] if created is not None else np.arange(len(allocs))
    allocs["op"], allocs["managed"], allocs["pid"] = AllocOp.ALLOC, True, 7
    allocs["addr"] = [base] + [real_addr[i] for i in seg_idx.tolist()]
    allocs["bytes"] = [WORKSPACE] + seg_bytes.tolist()
    allocs["alloc_id"] = np.arange(len(allocs))

    ks = w.ops[(w.ops["type"] == 0) & (w.ops["iteration"] == 0)]
    compute = ks["compute_ns"].astype(np.int64)
    names = sorted(set(CUDA_NAME.values())) + ["setup_kernel", "checksum_kernel"]
    nid = {n: i for i, n in enumerate(names)}
    launches, faults = [], []
    t = 1_000_000

    def launch(name, grid, t_ns):
        launches.append((t_ns, nid[name], tuple(int(g) for g in grid)))

    for j in range(3):                      # set-up
        launch("setup_kernel", (j + 1, 1, 1), t)
        t += 10_000
    seen: set[int] = set()
    first_chunk_of0 = []
    for s in range(STEPS):
        t += GAP_NS
        for _ in range(UNSEEN):
            launch(CUDA_NAME["softmax"], (1, 1, 1), t)
            t += UNSEEN_NS
        for k in range(len(ks)):
            launch(CUDA_NAME[cv.kernel_class(names_cap[k])], ks["grid"][k], t)
            if warmup_elsewhere and s == 0 and fault_step != 0 and k == len(ks) - 1:
                for code in sorted(set().union(*[set(x.tolist()) for x in sets])):
                    seg, chunk = code >> cv.CHUNK_BITS, code & ((1 << cv.CHUNK_BITS) - 1)
                    faults.append((t + 1, real_addr[seg] + chunk * BLOCK_SIZE + 12288))
            if s == fault_step:
                for code in sets[k].tolist():
                    if code in seen:
                        continue
                    seen.add(code)
                    seg, chunk = code >> cv.CHUNK_BITS, code & ((1 << cv.CHUNK_BITS) - 1)
                    faults.append((t + 1, real_addr[seg] + chunk * BLOCK_SIZE + 4096))
                    if k == 0:
                        first_chunk_of0.append(code)
                if k == 0:
                    faults += [(t + 2, base + e * BLOCK_SIZE) for e in range(EXTRA)]
                if k == len(ks) - 1:
                    far = [c for c in sorted(seen) if not any(c in set(sets[x].tolist()) for x in range(k - 2, k + 1))]
                    for c in far[:MISCHARGED]:
                        seg, chunk = c >> cv.CHUNK_BITS, c & ((1 << cv.CHUNK_BITS) - 1)
                        faults.append((t + 3, real_addr[seg] + chunk * BLOCK_SIZE + 8192))
                    assert len(far) >= MISCHARGED
            t += int(compute[k]) * slow
    t += GAP_NS
    for j in range(2):                      # the checksum after the loop
        launch("checksum_kernel", (1, 1, 1), t)
        t += 10_000

    la = empty(Kind.LAUNCH, len(launches))
    la["t_ns"] = [x[0] for x in launches]
    la["name_id"] = [x[1] for x in launches]
    la["grid"] = [x[2] for x in launches]
    la["block"] = (256, 1, 1)
    la["pid"], la["seq"] = 7, np.arange(len(launches))
    fa = empty(Kind.FAULT, len(faults))
    fa["t_ns"] = [x[0] for x in faults]
    fa["addr"] = [x[1] for x in faults]
    fa["pid"], fa["batch_id"] = 7, np.arange(len(faults))
    b = EventBatch(names=names)
    for kind, arr in ((Kind.ALLOC, allocs), (Kind.LAUNCH, la), (Kind.FAULT, fa)):
        b.add(kind, arr)
    meta = {"command": ["python3", script, "--steps", str(STEPS)], "mode": "none", "gpu_mem": [80 << 30],
            "runtime": {"managed": True, "hum": False}}
    with TraceWriter(path, meta, names=names) as tw:
        tw.write(b)
    return {"pairs": len(seen), "kernels": len(ks), "compute_ns": int(compute.sum())}


def test_steps_segments_alignment_and_shares_are_what_was_built(tmp_path, capture):
    rec = tmp_path / "tiny.parquet"
    built = synthetic_recording(rec, capture, fault_step=KEPT)
    t = cv.load_recording(str(rec))
    launches = cv.launches_of(t)
    steps = cv.detect_steps(launches, cv.recorded_steps(t))
    n = built["kernels"]
    assert steps.starts.tolist() == [3 + s * (n + UNSEEN) for s in range(STEPS)]
    assert steps.end == 3 + STEPS * (n + UNSEEN)                      # the checksum is the tail, not a step
    r = cv.access_share(t, launches, steps, capture)
    sg = r["segments"]
    assert sg["real"] == sg["capture"] + 1 and sg["matched"] == sg["capture"]
    assert sg["unmatched_real_sizes"] == [WORKSPACE]
    fs = r["scored_step"]
    assert fs["real_step"] == KEPT
    assert fs["real_kernels"] == n + UNSEEN and fs["capture_kernels"] == fs["aligned_kernels"] == n
    assert r["faulted_pairs_per_step"][str(KEPT)] == built["pairs"] + EXTRA + MISCHARGED
    assert r["faulted_pairs_per_step"]["0"] == 0 and r["faulted_pairs_per_step"]["setup"] == 0
    total = built["pairs"] + EXTRA + MISCHARGED
    assert fs["pairs"] == total and fs["pairs_in_matched_segments"] == built["pairs"] + MISCHARGED
    assert r["share"]["aligned_kernel"] == pytest.approx(built["pairs"] / total)
    assert r["share"]["aligned_within_2"] == pytest.approx(built["pairs"] / total)
    assert r["share"]["step_level"] == pytest.approx((built["pairs"] + MISCHARGED) / total)
    assert r["share"]["step_level_of_matched_segments"] == pytest.approx(1.0)
    assert r["share"]["by_position"] < r["share"]["aligned_kernel"]


def test_replayed_step_times_differ_by_the_host_gap(tmp_path, capture):
    """At a GPU larger than the footprint nothing faults after the first step: the recording's
    steady step is the capture's kernels (their times were copied into the launch gaps) plus
    the host's wait before each step, which the replay charges to the step's last kernel, and
    the kernels the capture does not have."""
    rec = tmp_path / "tiny.parquet"
    synthetic_recording(rec, capture)
    t = cv.load_recording(str(rec))
    launches = cv.launches_of(t)
    steps = cv.detect_steps(launches, STEPS)
    gpu = 1 << 30
    w = capture
    w.gpu_mem = [gpu]
    cap = cv.replay(w, ["none"], DEFAULT)
    res = cv.time_comparison(t, launches, steps, cap, gpu, ["none"], DEFAULT)
    m = res["modes"]["none"]
    assert len(m["recording_steps_s"]) == STEPS and len(m["capture_steps_s"]) == 4
    assert m["recording_steps_s"][0] > m["recording_steps_s"][1]            # first touches
    expected = m["capture_steady_s"] + (GAP_NS + UNSEEN * UNSEEN_NS) / 1e9
    assert m["recording_steady_s"] == pytest.approx(expected, rel=0.02)
    assert m["capture_over_recording"] == pytest.approx(m["capture_steady_s"] / expected, rel=0.02)


def test_steps_of_varying_length_are_found_by_their_start():
    """Data-dependent steps (an MoE's per-expert loop) differ in length: the start k-gram after
    the longest gaps still finds them; a sequence without N equal starts is one clear error."""
    rng = np.random.default_rng(0)
    codes, gaps, starts = [100, 101], [0, 10], []
    for s in range(5):
        starts.append(len(codes))
        body = [1, 2, 3, 4, 5, 6, 7, 8, 9] + rng.integers(20, 30, size=5 + 3 * s).tolist() + [10, 11]
        codes += body
        gaps += [5_000_000] + [10] * (len(body) - 1)
    codes += [200, 201]
    gaps += [3_000_000, 10]
    la = empty(Kind.LAUNCH, len(codes))
    la["name_id"] = codes
    la["t_ns"] = np.cumsum(gaps)
    st = cv.detect_steps(la, 5)
    assert st.starts.tolist() == starts and st.end == len(codes) - 2
    with pytest.raises(cv.ValidateError, match="no kernel sequence starts exactly 7 steps"):
        cv.detect_steps(la, 7)


def test_steps_not_a_repeating_tail_nor_a_stall_inside_the_step():
    """The checksum after the loop repeats its per-chunk kernels, after longer gaps than a
    step's start (convnet: 6 steps of 29 launches found there), and a kernel stalled on faults
    leaves a longer gap than the host's wait at a step's end (transformer's budget run: steps
    started mid-step): the steps are the near-equal ones that cover the recording and fit in
    it, from their first kernels, and the last one ends before the checksum."""
    def recording(tail: list[tuple[int, int]]):
        codes, gaps, starts = list(range(100, 106)), [10_000] * 6, []
        for s in range(6):
            starts.append(len(codes))
            body = list(range(1, 41))
            if s == 0:
                body[30:30] = list(range(50, 60))           # the first step creates the optimizer state
            for i, c in enumerate(body):
                codes.append(c)
                gaps.append(300_000 if i == 0 else 5_000_000 if c == 21 else 10_000)
        end = len(codes)
        codes += [c for c, _ in tail]
        gaps += [g for _, g in tail]
        la = empty(Kind.LAUNCH, len(codes))
        la["name_id"] = codes
        la["t_ns"] = np.cumsum(gaps)
        return la, starts, end

    checksum = [(c, 20_000_000 if c == 200 else 10_000) for i in range(6) for c in [*range(200, 208), 300 + i]]
    for tail in (checksum, [(400, 10_000), (401, 10_000)]):
        la, starts, end = recording(tail)
        st = cv.detect_steps(la, 6)
        assert st.starts.tolist() == starts and st.end == end


def test_steps_not_a_later_phase_that_also_occurs_in_the_set_up():
    """transformers' GPT-2 fills each parameter on the GPU in the set-up: those Fill kernels match
    those of ``zero_grad(set_to_none=False)`` later in every step but the first (a no-op
    there), so that k-gram also occurs exactly N times and its first occurrence (in the set-up)
    is the earliest of all. The steps start at the step's first kernels all the same."""
    zero_grad = list(range(60, 70))
    codes, gaps, starts = list(zero_grad), [10_000] * len(zero_grad), []
    for s in range(6):
        starts.append(len(codes))
        body = [1, 2, 3, 4, 5, 6, 7, 8, 9] + list(range(20, 40)) + (zero_grad if s else []) + list(range(100, 180))
        if s == 0:
            body[-5:-5] = list(range(80, 92))               # the optimizer state's creation
        for i, c in enumerate(body):
            codes.append(c)
            gaps.append(800_000 if i == 0 else 10_000)
    end = len(codes)
    codes += list(range(200, 240))                         # the checksum: longer than zero_grad's phase
    gaps += [3_000_000] + [10_000] * 39
    la = empty(Kind.LAUNCH, len(codes))
    la["name_id"] = codes
    la["t_ns"] = np.cumsum(gaps)
    st = cv.detect_steps(la, 6)
    assert st.starts.tolist() == starts and st.end == end


def test_the_kept_step_is_scored_not_the_warm_up(tmp_path, capture):
    """The capture keeps the step after its warm-up: a real run's first step (the warm-up, its
    new segments holding other tensors from then on) faults another layout; the step the
    capture keeps is the one scored, unless --real-step says otherwise."""
    rec = tmp_path / "tiny.parquet"
    built = synthetic_recording(rec, capture, fault_step=KEPT, warmup_elsewhere=True)
    t = cv.load_recording(str(rec))
    launches = cv.launches_of(t)
    steps = cv.detect_steps(launches, STEPS)
    assert cv.kept_step(capture) == KEPT
    r = cv.access_share(t, launches, steps, capture)
    total = built["pairs"] + EXTRA + MISCHARGED
    assert r["scored_step"]["real_step"] == KEPT and r["scored_step"]["pairs"] == total
    assert r["share"]["aligned_kernel"] == pytest.approx(built["pairs"] / total)
    r0 = cv.access_share(t, launches, steps, capture, real_step=0)
    assert r0["scored_step"]["real_step"] == 0 and r0["share"]["aligned_kernel"] < 0.5


def run_tool(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "capture_validate.py"), *args],
                          capture_output=True, text=True, timeout=300)


def test_command_line_prints_the_table_and_json(tmp_path, program):
    rec = tmp_path / "tiny.parquet"
    w, _ = capture_workload(f"{program}:make_step", 64, gpu_mem=1 << 30, iterations=4)
    built = synthetic_recording(rec, w, fault_step=KEPT)
    out = tmp_path / "v.json"
    p = run_tool("--program", str(program), "--batch", "64", "--recording", str(rec), "--gpu-mem", "1GiB",
                 "--modes", "none", "--json", str(out))
    assert p.returncode == 0, p.stderr
    assert "share predicted, aligned kernel" in p.stdout and "capture/recording" in p.stdout
    res = json.loads(out.read_text())
    a = res["recordings"]["nobudget"]["access"]
    assert a["scored_step"]["pairs"] == built["pairs"] + EXTRA + MISCHARGED
    assert res["recordings"]["nobudget"]["time"]["modes"]["none"]["capture_over_recording"] < 1
    tab = run_tool("--tables", str(out))
    assert tab.returncode == 0 and "| tiny@b64 |" in tab.stdout


def test_bad_inputs_are_one_line_errors(tmp_path, program, capture):
    missing = run_tool("--program", str(program), "--batch", "4", "--recording", str(tmp_path / "nope.parquet"),
                       "--gpu-mem", "1GiB")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "no such file" in missing.stderr
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not a parquet file at all")
    corrupt = run_tool("--program", str(program), "--batch", "4", "--recording", str(bad), "--gpu-mem", "1GiB")
    assert corrupt.returncode == 2 and corrupt.stderr.count("\n") == 1 and str(bad) in corrupt.stderr
    other = tmp_path / "other.parquet"
    synthetic_recording(other, capture, script="benchmarks/gpu/programs/convnet.py")
    mism = run_tool("--program", str(program), "--batch", "64", "--recording", str(other), "--gpu-mem", "1GiB",
                    "--no-replay")
    assert mism.returncode == 2 and "mismatched program" in mism.stderr and mism.stderr.count("\n") == 1


def test_segments_matched_by_access_in_another_step_not_by_size_order():
    """An MoE's capture creates more same-size segments than the real run, in another order
    (its routing is not the real one): an LCS of sizes in creation order pairs the wrong ones;
    evidence from a step other than the scored one (the aligned kernels' chunks) pairs the
    right ones, and the segments without evidence still go by the size LCS."""
    real = [2, 16, 16, 20, 16, 2]                    # MiB, the real run's creation order
    cap = [2, 16, 20, 16, 16, 16, 16, 2]             # the capture's: two more 16 MiB, 20 MiB earlier
    truth = {1: 5, 2: 6, 3: 2, 4: 3}                 # real -> capture, what touched them in step 0
    old = dict(cv.lcs_pairs(real, cap))
    assert any(old.get(i) != j for i, j in truth.items())   # the old matching pairs wrong segments
    evidence = {(i, j): 3.0 for i, j in truth.items()} | {(1, 1): 0.5, (2, 3): 0.5}   # weaker, ambiguous hits
    new = dict(cv.match_segments(real, cap, evidence))
    assert all(new[i] == j for i, j in truth.items())
    assert new[0] == 0 and new[5] == 7                # no evidence: the size LCS of the rest
    assert all(real[i] == cap[j] for i, j in new.items()) and len(set(new.values())) == len(new)
    assert dict(cv.match_segments(real, cap)) == old  # without evidence: the old matching


def test_segments_matched_by_another_runs_faults(tmp_path, capture):
    """The scored step's segments may be touched in no other step of its run (an MoE's, created
    in that step): another run of the program (the budget recording, same segments in the same
    order): the faults of its steps are the evidence. Here the run created
    the two same-size segments in the other order than the capture, faults only in the scored
    step: the size LCS alone pairs them wrongly; the other run's faults pair them right."""
    seg_idx, _, seg_bytes = cv.capture_segments(capture)
    sizes = seg_bytes.tolist()
    same = [k for k in range(len(sizes)) if sizes.count(sizes[k]) > 1][:2]
    assert len(same) == 2                                     # the capture has two same-size segments
    created = list(range(len(sizes)))
    created[same[0]], created[same[1]] = created[same[1]], created[same[0]]
    rec, other = tmp_path / "nobudget.parquet", tmp_path / "budget.parquet"
    built = synthetic_recording(rec, capture, fault_step=KEPT, created=created)
    synthetic_recording(other, capture, fault_step=KEPT, created=created)
    t, o = cv.load_recording(str(rec)), cv.load_recording(str(other))
    la, lo = cv.launches_of(t), cv.launches_of(o)
    st, so = cv.detect_steps(la, STEPS), cv.detect_steps(lo, STEPS)
    assert cv.map_run_segments(cv.real_segments(t), la, st, cv.real_segments(o), lo, so).tolist() == \
        list(range(len(sizes) + 1))                            # same sizes, same order: the identity
    total = built["pairs"] + EXTRA + MISCHARGED
    alone = cv.access_share(t, la, st, capture)
    assert alone["segments"]["matched_by_access"] == 0       # no fault outside the scored step
    assert alone["share"]["aligned_kernel"] < built["pairs"] / total - 0.05
    r = cv.access_share(t, la, st, capture, other=(o, lo, so))
    sg = r["segments"]
    assert sg["other_recording"]["same_size_sequence"] and sg["other_recording"]["steps"] == [KEPT]
    assert sg["matched_by_access"] == sg["capture"]
    assert r["share"]["aligned_kernel"] == pytest.approx(built["pairs"] / total)


def test_complete_recording_takes_kernel_times_from_the_full_speed_run(tmp_path, capture):
    """A --complete-accesses recording's kernels run slow (every access a fault): replayed with
    the kernel times of a full-speed recording of the same program, paired per step by name,
    its steady step is the full-speed one's; with its own times it is several times longer."""
    fast, slow = tmp_path / "fast.parquet", tmp_path / "slow.parquet"
    built = synthetic_recording(fast, capture)
    synthetic_recording(slow, capture, slow=5)
    gpu = 1 << 30
    capture.gpu_mem = [gpu]
    cap = cv.replay(capture, ["none"], DEFAULT)
    tf, ts = cv.load_recording(str(fast)), cv.load_recording(str(slow))
    lf, ls = cv.launches_of(tf), cv.launches_of(ts)
    sf, ss = cv.detect_steps(lf, STEPS), cv.detect_steps(ls, STEPS)
    ref = cv.time_comparison(tf, lf, sf, cap, gpu, ["none"], DEFAULT)["modes"]["none"]["recording_steady_s"]
    own = cv.time_comparison(ts, ls, ss, cap, gpu, ["none"], DEFAULT)["modes"]["none"]["recording_steady_s"]
    res = cv.time_comparison(ts, ls, ss, cap, gpu, ["none"], DEFAULT, compute_from=(tf, lf, sf))
    assert res["compute"]["paired"] == res["compute"]["kernels"] == len(ls)
    assert res["modes"]["none"]["recording_steady_s"] == pytest.approx(ref, rel=1e-6)
    assert own - ref == pytest.approx(4 * built["compute_ns"] / 1e9, rel=0.05)   # 4 x the kernels' time more
    # a kernel the full-speed run did not run at that place takes its name's median time there
    ls2 = ls.copy()
    ls2["name_id"][int(ss.starts[1]) + 5] = ts.names.index("setup_kernel")
    c = cv.time_comparison(ts, ls2, ss, cap, gpu, ["none"], DEFAULT, compute_from=(tf, lf, sf))["compute"]
    assert (c["paired"], c["by_name"], c["own"]) == (len(ls2) - 1, 1, 0)
