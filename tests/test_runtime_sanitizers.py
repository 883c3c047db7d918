"""The in-process runtime's shared buffers under AddressSanitizer and ThreadSanitizer (gcc's
-fsanitize=address / -fsanitize=thread; Debian/Ubuntu ship their runtimes, libasan and libtsan,
with gcc). tests/rtprog/rtstress.c compiles the runtime into one sanitized program over the fake
CUDA of tests/rtprog/fakecudart.c and drives launches (runtime and driver entry points, with the
kernel-end tracker pushing into the same buffer), allocations and copies from many threads at once.

Why: a report buffer that noticed it was full only after copying a record, and was flushed outside
its lock, let a second thread write past its end; a PyTorch run under `--runtime --managed` died
with glibc's "buffer overflow detected". The receiver here counts every record that arrives: with
the counted drops it must add up to what the runtime pushed, so no record is lost silently."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "tests" / "rtprog"
HEADER = struct.Struct("<IHBBIiQQQ")   # umctl_rt.h's struct umrt_header
KIND_INDEX = {1: 0, 2: 1, 3: 2}          # LAUNCH, ALLOC, COPY -> drops[] index
SANITIZER_REPORTS = ("ERROR: AddressSanitizer", "WARNING: ThreadSanitizer", "ERROR: LeakSanitizer")


def _gcc(*args: str) -> None:
    p = subprocess.run(["gcc", *args], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


@pytest.fixture(scope="module")
def fake(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("rtsan")
    _gcc("-O1", "-shared", "-fPIC", str(SRC / "fakecudart.c"), "-o", str(d / "libcudart.so"), "-ldl")
    _gcc("-O1", "-shared", "-fPIC", "-DFAKE_LIBCUDA", str(SRC / "fakecudart.c"), "-o", str(d / "libcuda.so.1"))
    return d


_built: dict[str, Path] = {}


def stress_program(fake: Path, sanitizer: str) -> Path:
    if sanitizer not in _built:
        exe = fake / f"rtstress_{sanitizer}"
        _gcc(f"-fsanitize={sanitizer}", "-g", "-O2", "-Wall", "-Werror", "-rdynamic", str(SRC / "rtstress.c"),
             "-o", str(exe), f"-L{fake}", "-lcudart", f"-Wl,-rpath,{fake}", "-ldl", "-lpthread")
        _built[sanitizer] = exe
    return _built[sanitizer]


class Receiver:
    """A datagram socket standing in for umctl: counts the records of each kind that arrive."""

    def __init__(self, path: Path, pause: float = 0.0):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.05)
        self.pause = pause
        self.records = [0, 0, 0]
        self.datagrams = 0
        self.bad = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _take(self, data: bytes) -> None:
        magic, version, kind, _pad, count, _pid, *_drops = HEADER.unpack_from(data)
        if magic != 0x54524D55 or version != 1:
            self.bad += 1
            return
        self.datagrams += 1
        if kind in KIND_INDEX:
            self.records[KIND_INDEX[kind]] += count

    def _run(self) -> None:
        if self.pause:
            time.sleep(self.pause)      # a reader behind: the socket's queue fills
        while not self._stop.is_set():
            try:
                self._take(self.sock.recv(1 << 17))
            except (socket.timeout, BlockingIOError):
                continue

    def close(self) -> None:
        """Stop, then take what is still queued on the socket."""
        self._stop.set()
        self._thread.join()
        self.sock.setblocking(False)
        while True:
            try:
                self._take(self.sock.recv(1 << 17))
            except BlockingIOError:
                break
        self.sock.close()


def run_stress(fake: Path, sanitizer: str, threads: int, iters: int, sock: Path, timeout: float = 90):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UMCTL_RT_", "LD_PRELOAD", "ASAN_", "TSAN_"))}
    env.update(FAKE_LIBCUDA=str(fake / "libcuda.so.1"), UMCTL_RT_LIBCUDA=str(fake / "libcuda.so.1"),
               UMCTL_RT_SOCKET=str(sock), UMCTL_RT_MANAGED="1", UMCTL_RT_TRACK_END="1",
               UMCTL_RT_CACHE="8192")   # a small cache: pluggable frees both cache and free
    # the runtime's threads are detached and still running at exit: not leaks, and not reports
    env["ASAN_OPTIONS"] = "detect_leaks=0:abort_on_error=0"
    env["TSAN_OPTIONS"] = "halt_on_error=0:report_thread_leaks=0"
    p = subprocess.run([str(stress_program(fake, sanitizer)), str(threads), str(iters)], env=env,
                       capture_output=True, text=True, timeout=timeout)
    found = [s for s in SANITIZER_REPORTS if s in p.stderr]
    assert not found, p.stderr[-6000:]
    assert p.returncode == 0, p.stderr[-6000:]
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def check_counts(res: dict, threads: int, iters: int, received: list[int]) -> None:
    launches = threads * iters
    assert res["failed"] == 0 and res["launches"] + res["driver_launches"] == launches
    assert res["runtime_launches_reported"] == launches and res["kernel_runs"] == launches
    assert res["ends_drained"] == 1 and res["left"] == [0, 0, 0]
    # one LAUNCH each, plus each kernel's end unless the tracker's ring was full
    assert res["pushed"][0] == 2 * launches - res["end_drops"]
    assert res["pushed"][1] == res["alloc_reports"] == 4 * launches
    assert res["pushed"][2] == res["copies"] == 2 * launches
    for k in range(3):
        assert received[k] + res["drops"][k] == res["pushed"][k], (k, received, res)


@pytest.mark.parametrize("sanitizer", ["address", "thread"])
def test_reports_from_many_threads_never_overflow_and_never_vanish(fake, tmp_path, sanitizer):
    threads, iters = 16, 3000
    rx = Receiver(tmp_path / "rx.sock")
    try:
        res = run_stress(fake, sanitizer, threads, iters, rx.path)
    finally:
        rx.close()
    assert rx.bad == 0 and rx.datagrams > 0
    check_counts(res, threads, iters, rx.records)


@pytest.mark.parametrize("sanitizer", ["address", "thread"])
def test_reports_to_a_missing_listener_are_all_counted_dropped(fake, tmp_path, sanitizer):
    threads, iters = 16, 3000
    res = run_stress(fake, sanitizer, threads, iters, tmp_path / "nobody.sock")
    check_counts(res, threads, iters, [0, 0, 0])
    assert res["drops"] == res["pushed"]


@pytest.mark.slow
@pytest.mark.parametrize("sanitizer", ["address", "thread"])
def test_reports_long_stress(fake, tmp_path, sanitizer):
    threads, iters = 16, 20000
    rx = Receiver(tmp_path / "rx.sock")
    try:
        res = run_stress(fake, sanitizer, threads, iters, rx.path, timeout=900)
    finally:
        rx.close()
    check_counts(res, threads, iters, rx.records)


@pytest.mark.parametrize("sanitizer", ["address"])
def test_a_reader_that_stalls_loses_no_report(fake, tmp_path, sanitizer):
    """A unix datagram socket takes only a few datagrams (net.unix.max_dgram_qlen: 10 on this
    VM) before the runtime's non-blocking send is refused; a reader that stalls for a moment
    (umctl's, behind a busy control loop: 221 launch records of a convnet run on an H200 were
    lost) must lose nothing: refused batches wait in order and go first at the next flush."""
    threads, iters = 4, 400
    stress_program(fake, sanitizer)     # built first: the reader's stall must fall in the run
    rx = Receiver(tmp_path / "rx.sock", pause=0.6)
    try:
        res = run_stress(fake, sanitizer, threads, iters, rx.path)
    finally:
        rx.close()
    check_counts(res, threads, iters, rx.records)
    assert res["drops"] == [0, 0, 0] and rx.records == res["pushed"]
