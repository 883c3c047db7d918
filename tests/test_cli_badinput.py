"""Bad input at the command line (issue 35 §2-3): every case below is one line on stderr that
starts ``umctl: error:``, a non-zero exit, no traceback, and no hang.

The cases are the ones an outside tester found (tracebacks, silently accepted nonsense, runs
with no bound) plus their neighbours. They run in-process (``umctl.cli.main.main``) under an
alarm, which is ~50x faster than a subprocess each; ``CASES`` and ``FILES`` are plain data so
that the same list can be run against another build with subprocesses (that is how the
before/after counts of the issue were taken).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from umctl.cli.main import main

#: a replay small enough to finish in well under a second when its input is good
TINY = ["--gpu-mem", "16MiB", "--iters", "1"]
R = ["replay", "gpt2-l", *TINY]          # replay of a tiny model under mode 'none'

_DNN = '[family]\ngenerator = "dnn"\n\n[scenarios.mine]\nbase = "bert-base"\n'
#: scenario / calibration files the cases name as {tmp}/NAME
FILES: dict[str, str] = {
    "zero_d2h.json": json.dumps({"calibration": {"d2h_Bps": 0}}),
    "nan_rate.json": '{"calibration": {"prefetch_h2d_Bps": NaN}}',
    "str_rate.json": json.dumps({"calibration": {"d2h_Bps": "fast"}}),
    "zero_batch.json": json.dumps({"calibration": {"batch_max_faults": 0}}),
    "frac7.json": json.dumps({"calibration": {"density_threshold": 7}}),
    "list_field.json": json.dumps({"calibration": {"fault_ns": [1, 2]}}),
    "no_calibration.json": json.dumps({"measured": {}}),
    "neg_mem.toml": _DNN + 'gpu_mem = "-512MiB"\n',
    "str_layers.toml": _DNN + 'layers = "many"\n',
    "float_layers.toml": _DNN + 'layers = 2.5\n',
    "unknown_key.toml": _DNN + 'bogus = 1\n',
    "typo_key.toml": _DNN + 'layer = 2\n',
    "huge_layers.toml": _DNN + 'layers = 100000000\n',
    "inf_oversub.toml": _DNN + 'oversub = inf\n',
    "nan_fill.toml": '[family]\ngenerator = "hum"\n\n[scenarios.mine]\nbase = "hum-sync"\nfill = nan\n',
    "zero_iters.toml": _DNN + 'iterations = 0\n',
    "table_param.toml": _DNN + '[scenarios.mine.extra]\nx = 1\n',
    "empty.toml": "",
    "no_generator.toml": '[family]\n\n[scenarios.mine]\nlayers = 2\n',
    "garbage.parquet": "this is not a parquet file\n",
    "notes.txt": "x",
}

#: (id, argv): {tmp} is a fresh directory holding FILES, {trace} a small recorded trace
CASES: list[tuple[str, list[str]]] = [
    # -- the outside tester's tracebacks
    ("oversub-inf", [*R, "--oversub", "inf"]),
    ("num-rows-0", [*R, "-m", "deepum", "-O", "deepum.num_rows=0"]),
    ("calib-file-d2h-0", [*R, "--calibration", "{tmp}/zero_d2h.json"]),
    ("drain-nan", [*R, "--drain-us", "nan"]),
    ("png-proc", [*R, "--png", "/proc/x.png"]),
    ("png-txt", [*R, "--png", "{tmp}/out.txt"]),
    ("record-dir", [*R, "--record", "{tmp}"]),
    ("toml-neg-gpu-mem", ["replay", "{tmp}/neg_mem.toml", "--iters", "1"]),
    ("toml-str-for-int", ["replay", "{tmp}/str_layers.toml", *TINY]),
    ("top-interval-neg", ["top", "--once", "--interval", "-1"]),
    # -- the outside tester's silent nonsense
    ("degree-0", [*R, "-m", "deepum", "-O", "deepum.degree=0"]),
    ("degree-neg", [*R, "-m", "deepum", "-O", "deepum.degree=-5"]),
    ("calib-set-frac-7", [*R, "--calib-set", "density_threshold=7"]),
    ("png-dir", [*R, "--png", "{tmp}"]),
    ("png-no-ext", [*R, "--png", "{tmp}/figure"]),
    ("toml-unknown-key", ["replay", "{tmp}/unknown_key.toml", *TINY]),
    ("modes-dup", [*R, "-m", "none,none"]),
    ("exporter-state-dir", ["exporter", "--state-dir", "/proc/nope", "--listen", "127.0.0.1:0", "--duration", "1s"]),
    # -- the outside tester's hangs
    ("calib-set-batch-0", [*R, "--calib-set", "batch_max_faults=0"]),
    ("gpu-mem-huge", ["replay", "gpt2-l", "--gpu-mem", "1000000TiB", "--iters", "1"]),
    ("iters-huge", ["replay", "gpt2-l", "--gpu-mem", "16MiB", "--iters", "1000000000"]),
    ("toml-huge-layers", ["replay", "{tmp}/huge_layers.toml", *TINY]),
    # -- neighbours: replay's own options
    ("oversub-nan", [*R, "--oversub", "nan"]),
    ("oversub-0", [*R, "--oversub", "0"]),
    ("oversub-neg", [*R, "--oversub", "-2"]),
    ("oversub-huge", [*R, "--oversub", "1e12"]),
    ("gpu-mem-neg", ["replay", "gpt2-l", "--gpu-mem", "-1GiB", "--iters", "1"]),
    ("gpu-mem-word", ["replay", "gpt2-l", "--gpu-mem", "lots", "--iters", "1"]),
    ("gpu-mem-0", ["replay", "gpt2-l", "--gpu-mem", "0", "--iters", "1"]),
    ("budget-word", [*R, "--budget", "lots"]),
    ("budget-neg", [*R, "--budget", "-8MiB"]),
    ("budget-nan", [*R, "--budget", "nan"]),
    ("budget-under-a-block", [*R, "--budget", "1MiB"]),
    ("budget-0", [*R, "--budget", "0"]),
    ("budget-not-below-the-gpu", [*R, "--budget", "16MiB"]),
    ("budget-over-the-gpu", [*R, "--budget", "1TiB"]),
    ("iters-0", ["replay", "gpt2-l", "--gpu-mem", "16MiB", "--iters", "0"]),
    ("iters-neg", ["replay", "gpt2-l", "--gpu-mem", "16MiB", "--iters", "-3"]),
    ("seed-neg", [*R, "--seed", "-1"]),
    ("drain-inf", [*R, "--drain-us", "inf"]),
    ("drain-neg", [*R, "--drain-us", "-1"]),
    ("drain-huge", [*R, "--drain-us", "1e300"]),
    ("mode-unknown", [*R, "-m", "bogus"]),
    ("mode-empty", [*R, "-m", ","]),
    ("mode-dup-all", [*R, "-m", "all,none"]),
    ("opt-no-eq", [*R, "-m", "deepum", "-O", "deepum.degree"]),
    ("opt-nan-float", [*R, "-m", "oracle", "-O", "oracle.reserve_frac=nan"]),
    ("opt-frac-2", [*R, "-m", "oracle", "-O", "oracle.reserve_frac=2"]),
    ("opt-lookahead-0", [*R, "-m", "oracle", "-O", "oracle.lookahead=0"]),
    ("opt-num-rows-huge", [*R, "-m", "deepum", "-O", "deepum.num_rows=10000000000000"]),
    ("opt-snurhac-threshold", ["replay", "mgpu-gemm", "--iters", "1", "-m", "snurhac", "-O", "snurhac.overlap_threshold=-1"]),
    ("opt-harvest-window-neg", ["replay", "huvm-case3", "--iters", "1", "-m", "harvest", "-O", "harvest.active_window_ns=-1"]),
    ("param-batch-0", [*R, "--param", "batch=0"]),
    ("param-batch-neg", [*R, "--param", "batch=-4"]),
    ("param-layers-huge", [*R, "--param", "layers=100000000"]),
    ("param-inf-float", [*R, "--param", "peak_tflops=inf"]),
    ("param-nan-oversub", [*R, "--param", "oversub=nan"]),
    ("param-bogus", [*R, "--param", "bogus=1"]),
    ("param-no-eq", [*R, "--param", "batch"]),
    ("param-zipf-nan", ["replay", "dlrm", *TINY, "--param", "zipf=nan"]),
    ("param-table-rows-0", ["replay", "dlrm", *TINY, "--param", "table_rows=0,5"]),
    ("param-fill-2", ["replay", "hum-sync", "--iters", "1", "--param", "fill=2"]),
    ("param-alpha-0", ["replay", "pagerank", *TINY, "--param", "alpha=0"]),
    ("param-gpus-0", ["replay", "mgpu-gemm", "--iters", "1", "--param", "gpus=0"]),
    # calibration files and --calib-set
    ("calib-missing", [*R, "--calibration", "{tmp}/nope.json"]),
    ("calib-file-nan", [*R, "--calibration", "{tmp}/nan_rate.json"]),
    ("calib-file-str", [*R, "--calibration", "{tmp}/str_rate.json"]),
    ("calib-file-batch-0", [*R, "--calibration", "{tmp}/zero_batch.json"]),
    ("calib-file-frac-7", [*R, "--calibration", "{tmp}/frac7.json"]),
    ("calib-file-list", [*R, "--calibration", "{tmp}/list_field.json"]),
    ("calib-file-no-table", [*R, "--calibration", "{tmp}/no_calibration.json"]),
    ("calib-file-toml", [*R, "--calibration", "{tmp}/empty.toml"]),
    ("calib-file-dir", [*R, "--calibration", "{tmp}"]),
    ("calib-set-d2h-0", [*R, "--calib-set", "d2h_Bps=0"]),
    ("calib-set-inf", [*R, "--calib-set", "d2h_Bps=inf"]),
    ("calib-set-nan", [*R, "--calib-set", "fault_h2d_Bps=nan"]),
    ("calib-set-jitter-nan", [*R, "--calib-set", "window_jitter=nan"]),
    ("calib-set-int-huge", [*R, "--calib-set", "batch_ns=1e30"]),
    ("calib-set-unknown", [*R, "--calib-set", "bogus=1"]),
    ("calib-set-name", [*R, "--calib-set", "name=x"]),
    ("calib-set-refresh", [*R, "--calib-set", "eviction_refresh=never"]),
    # scenario files
    ("toml-float-for-int", ["replay", "{tmp}/float_layers.toml", *TINY]),
    ("toml-typo-key", ["replay", "{tmp}/typo_key.toml", *TINY]),
    ("toml-inf-oversub", ["replay", "{tmp}/inf_oversub.toml", *TINY]),
    ("toml-nan-fill", ["replay", "{tmp}/nan_fill.toml", "--iters", "1"]),
    ("toml-iters-0", ["replay", "{tmp}/zero_iters.toml", "--gpu-mem", "16MiB"]),
    ("toml-table-param", ["replay", "{tmp}/table_param.toml", *TINY]),
    ("toml-empty", ["replay", "{tmp}/empty.toml"]),
    ("toml-no-generator", ["replay", "{tmp}/no_generator.toml"]),
    ("toml-missing", ["replay", "{tmp}/missing.toml"]),
    ("toml-no-such-scenario", ["replay", "{tmp}/neg_mem.toml:other"]),
    ("scenario-unknown", ["replay", "gpt-9"]),
    ("scenarios-family", ["scenarios", "--family", "bogus"]),
    # outputs
    ("timeline-proc", [*R, "--timeline", "/proc/x.png"]),
    ("timeline-dir", [*R, "--timeline", "{tmp}"]),
    ("png-no-parent", [*R, "--png", "{tmp}/no/such/dir/x.png"]),
    ("png-dev-full", [*R, "--png", "/dev/full"]),
    ("record-no-parent", [*R, "--record", "{tmp}/no/such/x.parquet"]),
    ("record-dev-full", [*R, "--record", "/dev/full"]),
    # trace targets
    ("trace-garbage", ["replay", "{tmp}/garbage.parquet"]),
    ("trace-missing", ["replay", "{tmp}/missing.parquet"]),
    ("trace-param", ["replay", "{trace}", "--param", "batch=2"]),
    ("trace-oversub-inf", ["replay", "{trace}", "-m", "none", "--oversub", "inf"]),
    ("trace-gpu-mem-neg", ["replay", "{trace}", "-m", "none", "--gpu-mem", "-5MiB"]),
    # sweep
    ("sweep-what", ["sweep", "gpt2-l", *TINY, "--what", "bogus"]),
    ("sweep-png-dir", ["sweep", "gpt2-l", *TINY, "--png", "{tmp}"]),
    ("sweep-png-txt", ["sweep", "gpt2-l", *TINY, "--png", "{tmp}/s.txt"]),
    ("sweep-oversub-inf", ["sweep", "gpt2-l", *TINY, "--oversub", "inf"]),
    ("sweep-iters-huge", ["sweep", "gpt2-l", "--gpu-mem", "16MiB", "--iters", "1000000000"]),
    ("sweep-mode-none", ["sweep", "gpt2-l", *TINY, "-m", "none", "--what", "degree"]),
    ("sweep-mode-unknown", ["sweep", "gpt2-l", *TINY, "-m", "bogus"]),
    # trace subcommands
    ("trace-info-missing", ["trace", "info", "{tmp}/missing.parquet"]),
    ("trace-info-garbage", ["trace", "info", "{tmp}/garbage.parquet"]),
    ("trace-info-dir", ["trace", "info", "{tmp}"]),
    ("trace-export-none", ["trace", "export", "{trace}"]),
    ("trace-export-proc", ["trace", "export", "{trace}", "--perfetto", "/proc/x.json"]),
    ("trace-export-dir", ["trace", "export", "{trace}", "--perfetto", "{tmp}"]),
    ("trace-export-max-0", ["trace", "export", "{trace}", "--perfetto", "{tmp}/t.json", "--max-events", "0"]),
    ("trace-control-nan", ["trace", "control", "{trace}", "--skip", "nan"]),
    ("trace-control-plain", ["trace", "control", "{trace}"]),
    # top
    ("top-interval-nan", ["top", "--once", "--interval", "nan"]),
    ("top-interval-inf", ["top", "--once", "--interval", "inf"]),
    ("top-interval-0", ["top", "--once", "--interval", "0"]),
    ("top-sort", ["top", "--once", "--sort", "bogus"]),
    ("top-sample", ["top", "--once", "--sample", "7"]),
    ("top-kinds", ["top", "--once", "--kinds", "bogus"]),
    ("top-pid-neg", ["top", "--once", "--pid", "-1", "--interval", "0.01"]),
    # exporter
    ("exporter-ring", ["exporter", "--ring-entries", "3", "--duration", "1s"]),
    ("exporter-ring-huge", ["exporter", "--ring-entries", str(1 << 40), "--listen", "127.0.0.1:0", "--duration", "1s"]),
    ("exporter-interval", ["exporter", "--interval", "-1s", "--duration", "1s"]),
    ("exporter-listen", ["exporter", "--listen", "nowhere", "--duration", "1s"]),
    ("exporter-state-file", ["exporter", "--state-dir", "{tmp}/notes.txt", "--listen", "127.0.0.1:0", "--duration", "1s"]),
]


def expand(argv: list[str], tmp: str, trace: str) -> list[str]:
    return [a.replace("{tmp}", tmp).replace("{trace}", trace) for a in argv]


def write_files(d: Path) -> None:
    for name, text in FILES.items():
        (d / name).write_text(text)


class Hang(Exception):
    pass


@contextmanager
def time_limit(seconds: float):
    """Raise Hang in the main thread after ``seconds`` (SIGALRM; POSIX only)."""
    def on_alarm(signum, frame):
        raise Hang(f"no answer in {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_cli(capsys, argv: list[str], seconds: float = 20.0) -> tuple[int, str, str]:
    """Exit code, stdout, stderr of ``umctl ARGV`` run in-process; a traceback or a hang fails
    the calling test with the argv in the message."""
    try:
        with time_limit(seconds):
            code = main(argv)
    except Hang:
        out, err = capsys.readouterr()
        pytest.fail(f"umctl {' '.join(argv)}: hung (> {seconds} s); stderr: {err[-500:]}")
    except SystemExit as e:  # pragma: no cover - main() returns codes
        code = e.code if isinstance(e.code, int) else 1
    except BaseException as e:  # noqa: BLE001 - anything escaping main() is a traceback for the user
        pytest.fail(f"umctl {' '.join(argv)}: traceback: {type(e).__name__}: {e}")
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, out: str, err: str, argv: list[str]) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    what = f"umctl {' '.join(argv)}"
    assert code != 0, f"{what}: exit 0 (accepted); stdout: {out[-300:]!r} stderr: {err[-300:]!r}"
    assert "Traceback" not in err, f"{what}: {err}"
    assert len(lines) == 1, f"{what}: {len(lines)} lines on stderr: {err!r}"
    assert lines[0].startswith("umctl: error:"), f"{what}: {lines[0]!r}"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("badinput")
    write_files(d)
    trace = d / "run.parquet"
    assert main(["replay", "gpt2-l", *TINY, "-m", "none", "--record", str(trace)]) == 0
    return str(d), str(trace)


@pytest.mark.parametrize("argv", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_error(capsys, files, argv):
    tmp, trace = files
    argv = expand(argv, tmp, trace)
    code, out, err = run_cli(capsys, argv)
    assert_one_line_error(code, out, err, argv)


# -- what the messages say --------------------------------------------------------------------
def _err(capsys, files, argv) -> str:
    tmp, trace = files
    argv = expand(argv, tmp, trace)
    code, out, err = run_cli(capsys, argv)
    assert_one_line_error(code, out, err, argv)
    return err


@pytest.mark.parametrize("argv, words", [
    ([*R, "-m", "deepum", "-O", "deepum.degree=0"], ["-O deepum.degree=0", "from 1 to 4096"]),
    ([*R, "--calib-set", "density_threshold=7"], ["density_threshold", "(0, 1]"]),
    ([*R, "--calib-set", "batch_max_faults=0"], ["--calib-set", "batch_max_faults", "from 1 to 65536"]),
    ([*R, "--calibration", "{tmp}/zero_d2h.json"], ["zero_d2h.json", "d2h_Bps"]),
    (["replay", "{tmp}/unknown_key.toml", *TINY], ["unknown_key.toml", "bogus"]),
    (["replay", "{tmp}/typo_key.toml", *TINY], ["layer", "did you mean layers"]),
    (["replay", "{tmp}/empty.toml"], ["[family]", "[scenarios.NAME]"]),
    (["replay", "{tmp}/neg_mem.toml", "--iters", "1"], ["gpu_mem", "size"]),
    (["replay", "gpt2-l", "--gpu-mem", "1000000TiB", "--iters", "1"], ["gpu_mem", "64 TiB"]),
    (["replay", "gpt2-l", "--gpu-mem", "16MiB", "--iters", "1000000000"], ["iterations", "10000"]),
    ([*R, "-m", "none,none"], ["none", "twice"]),
    ([*R, "--png", "{tmp}"], ["directory"]),
    ([*R, "--png", "{tmp}/figure"], [".png"]),
    ([*R, "--oversub", "inf"], ["oversub"]),
    ([*R, "--drain-us", "nan"], ["--drain-us", "(0, 10000000]"]),
    (["top", "--once", "--interval", "-1"], ["--interval", "(0, 86400]"]),
    (["run", "--mode", "deepum", "-O", "launch_queue=8", "--", "true"], ["launch_queue", "umctl replay"]),
    (["run", "--complete-accesses", "--", "true"], ["--complete-accesses", "-o TRACE"]),
    (["run", "--complete-accesses", "--budget", "1GiB", "-o", "{tmp}/t.parquet", "--", "true"],
     ["--complete-accesses", "--budget"]),
])
def test_messages_name_the_option_and_the_range(capsys, files, argv, words):
    err = _err(capsys, files, argv)
    for w in words:
        assert w in err, (w, err)


def test_png_disk_full_is_one_line(capsys, files, monkeypatch):
    """ENOSPC while the figure is written (the replay's last step) is one line, not a traceback."""
    import matplotlib.figure

    def full(self, *a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", full)
    tmp, _ = files
    for opt in ("--png", "--timeline"):
        argv = [*R, opt, f"{tmp}/full.png"]
        code, out, err = run_cli(capsys, argv)
        assert_one_line_error(code, out, err, argv)
        assert "No space left on device" in err and "full.png" in err


def test_good_input_still_runs(capsys, files):
    """The edges refuse nonsense, not the documented uses: a replay with a PNG, a calibration
    by its printed name, every option at its bound."""
    tmp, _ = files
    png = f"{tmp}/ok.PNG"
    code, out, err = run_cli(capsys, [*R, "-m", "none,deepum", "-O", "deepum.degree=1", "--png", png,
                                      "--calib-set", "density_threshold=1", "--calib-set", "batch_max_faults=1",
                                      "--drain-us", "0.5"])
    assert code == 0, err
    assert Path(png).read_bytes()[:4] == b"\x89PNG" and f"wrote {png}" in err


def test_one_name_per_calibration(capsys):
    """The name a replay prints for a calibration is one ``--calibration`` accepts, and the
    shipped files print their file name."""
    from umctl.sim.calibration import Calibration, shipped_names

    names = shipped_names()
    assert "h100-r580" in names and "h200-r580" in names
    for name in names:
        assert Calibration.load(name).name == name
    code, out, err = run_cli(capsys, [*R, "--json"])
    assert code == 0, err
    default = json.loads(out)[0]["calibration"]
    code, out, err = run_cli(capsys, [*R, "--json", "--calibration", default])
    assert code == 0, err
    assert json.loads(out)[0]["calibration"] == default
    code, out, err = run_cli(capsys, [*R, "--json", "--calibration", "h100-r580"])
    assert code == 0, err
    assert json.loads(out)[0]["calibration"] == "h100-r580"
    assert Calibration.load("h100-80gb-hbm3-measured").name == "h100-r580"   # the old internal name


if __name__ == "__main__":  # pragma: no cover - the subprocess runner used for the before/after counts
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        write_files(Path(d))
        trace = f"{d}/run.parquet"
        subprocess.run([sys.executable, "-m", "umctl.cli.main", "replay", "gpt2-l", *TINY, "-m", "none",
                        "--record", trace], check=True, capture_output=True)
        verdicts: dict[str, list[str]] = {}
        for cid, argv in CASES:
            argv = expand(argv, d, trace)
            cmd = ["prlimit", "--as=4000000000", sys.executable, "-m", "umctl.cli.main", *argv]
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
                lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
                if "Traceback" in p.stderr or "MemoryError" in p.stderr:
                    v = "traceback"
                elif p.returncode == 0:
                    v = "silent"
                elif len(lines) == 1 and lines[0].startswith("umctl: error:"):
                    v = "one-line"
                else:
                    v = "other"
                detail = (lines[-1] if lines else "")[:150]
            except subprocess.TimeoutExpired:
                v, detail = "hang", "> 30 s"
            verdicts.setdefault(v, []).append(cid)
            print(f"{v:9s} {cid:24s} {detail}", flush=True)
        print({k: len(v) for k, v in verdicts.items()}, f"of {len(CASES)}")
