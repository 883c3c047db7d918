"""The in-process runtime (runtime/umctl_rt.c) on a fake CUDA runtime and driver of ours
(tests/rtprog/fakecudart.c: "device" memory is host memory, kernels are host functions), so that
routing, HUM copies and reports are tested without a GPU. A missing gcc is a failure (CI has it)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from umctl.actuators.runtime_discard import RuntimeDiscard
from umctl.actuators.uvm import UvmActuator
from umctl.events.schema import KIND_CODES, AllocOp, CopyKind, Kind, Op, commands
from umctl.runtime import child_env
from umctl.sources.runtime import HEADER_DTYPE, MAGIC, RuntimeDecoder, RuntimeSource
from umctl.driver import abi

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "tests" / "rtprog"


def _gcc(*args: str) -> None:
    subprocess.run(["gcc", *args], check=True, capture_output=True, text=True)


# `built` (the runtime and the fake CUDA, compiled once per session) is in conftest.py


def run(built, mode: str, *, preload: bool = True, libcuda: str | None = None, **kw) -> tuple[dict, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("UMCTL_RT_", "LD_PRELOAD"))}
    base["FAKE_LIBCUDA"] = str(built["libcuda"])
    env = child_env(base, library=built["lib"], **kw) if preload else base
    env["UMCTL_RT_LIBCUDA"] = libcuda if libcuda is not None else str(built["libcuda"])
    env["UMCTL_RT_STATS"] = "1"
    return run_prog(built, [mode], env)


def run_prog(built, argv: list[str], env: dict) -> tuple[dict, str]:
    """rtprog with these arguments: its RESULT json and its stderr (the runtime's stats line)."""
    p = subprocess.run([str(built["prog"]), *argv], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):]), p.stderr


def stats(stderr: str) -> dict[str, str]:
    line = next(ln for ln in stderr.splitlines() if ln.startswith("umctl_rt:"))
    return dict(kv.split("=", 1) for kv in line.split()[1:])


# -- decoding -----------------------------------------------------------------------------------

def _dgram(kind: int, body: bytes, count: int, pid: int = 7, drops=(0, 0, 0)) -> bytes:
    h = np.zeros(1, HEADER_DTYPE)
    h["magic"], h["version"], h["kind"], h["count"], h["pid"], h["drops"] = MAGIC, 1, kind, count, pid, drops
    return h.tobytes() + body


def test_decoder_maps_names_per_process_and_counts_drops():
    dec = RuntimeDecoder()
    names = b"".join(i.to_bytes(4, "little") + len(n).to_bytes(2, "little") + n for i, n in [(0, b"k0"), (1, b"k1")])
    assert dec.decode(_dgram(4, names, 2, pid=7)) == []
    dec.decode(_dgram(4, (0).to_bytes(4, "little") + b"\x02\x00k1", 1, pid=8))   # pid 8's id 0 is "k1"
    from umctl.events.schema import empty
    la = empty(Kind.LAUNCH, 3)
    la["name_id"] = [1, 0, -1]
    out = dec.decode(_dgram(1, la.tobytes(), 3, pid=7, drops=(5, 0, 0)), now_ns=11)
    kinds = dict(out)
    assert list(kinds[Kind.LAUNCH]["name_id"]) == [1, 0, -1]
    assert dec.names == ["k0", "k1"]
    assert kinds[Kind.DROPS]["kind"][0] == KIND_CODES[Kind.LAUNCH] and kinds[Kind.DROPS]["count"][0] == 5
    la["name_id"] = [0, 0, 0]
    out = dict(dec.decode(_dgram(1, la.tobytes(), 3, pid=8, drops=(0, 0, 0))))
    assert list(out[Kind.LAUNCH]["name_id"]) == [1, 1, 1] and Kind.DROPS not in out
    assert dec.decode(b"garbage" * 10) == [] and dec.bad == 1


# -- the library on the fake runtime ---------------------------------------------------------

def test_no_runtime_results_unchanged_and_routing(built):
    plain, _ = run(built, "basic", preload=False)
    quiet, err = run(built, "basic")                       # preloaded, nothing asked for
    assert quiet["checksum"] == plain["checksum"] and quiet["type_dA"] == 2 and quiet["managed_allocs"] == 0
    assert stats(err)["launches"] == "0"                   # no socket: no reports
    managed, _ = run(built, "basic", managed=True)
    assert managed["checksum"] == plain["checksum"]
    assert managed["type_dA"] == 3 and managed["managed_allocs"] == 3 and managed["device_allocs"] == 0


def test_reports_decode_to_launch_alloc_copy(built):
    with RuntimeSource() as src:
        res, err = run(built, "basic", socket=src.path, managed=True)
    batch = src.drain()
    la, al, cp = batch[Kind.LAUNCH], batch[Kind.ALLOC], batch[Kind.COPY]
    assert len(la) == 3 and list(la["seq"]) == [0, 1, 2]
    assert {batch.names[i] for i in la["name_id"]} == {"vec_add"}
    assert list(la["grid"][0]) == [2 * (1 << 20) // 256, 1, 1] and list(la["block"][0]) == [256, 1, 1]
    # same kernel, same geometry: the argument bytes (n vs n/2) make the identity
    assert la["exec_hash"][0] != la["exec_hash"][1] and la["exec_hash"][1] == la["exec_hash"][2]
    allocs = al[al["op"] == AllocOp.ALLOC]
    frees = al[al["op"] == AllocOp.FREE]
    assert sorted(allocs["addr"]) == sorted([res["dA"], res["dB"], res["dC"]]) and allocs["managed"].all()
    assert set(frees["alloc_id"]) == set(allocs["alloc_id"]) and (allocs["bytes"] == res["bytes"]).all()
    kinds = sorted(int(k) for k in cp["kind"])
    assert kinds == [CopyKind.H2D, CopyKind.H2D, CopyKind.D2H]
    h2d = cp[(cp["kind"] == CopyKind.H2D) & (cp["is_async"] == 0)][0]
    assert h2d["dst_addr"] == res["dA"] and h2d["src_addr"] == res["hA"] and h2d["bytes"] == res["bytes"]
    assert Kind.DROPS not in batch and stats(err)["drops"] == "0,0,0"
    # the stream is complete up to its newest record (the budget check holds faults back to it)
    newest = max(int(a["t_ns"].max()) for a in (la, al, cp))
    assert batch.runtime_ns == src.watermark_ns == newest > 0


@pytest.mark.parametrize("param_info", [True, False])
def test_launch_identity_repeats_every_step(built, param_info):
    """DeepUM's execution ID: kernel + arguments. With argument sizes, two launches with equal
    arguments are the same execution. Without them (driver 580 / CUDA 13 for nvcc and torch
    kernels) the runtime tells them apart by occurrence since the host last waited for the GPU
    (cudaDeviceSynchronize / cudaStreamSynchronize): the first and second launch of a step differ,
    and every step repeats the same identities."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("UMCTL_RT_", "LD_PRELOAD"))}
    base["FAKE_LIBCUDA"] = str(built["libcuda"])
    if not param_info:
        base["FAKE_NO_PARAM_INFO"] = "1"
    with RuntimeSource() as src:
        env = child_env(base, library=built["lib"], socket=src.path, managed=True)
        env["UMCTL_RT_LIBCUDA"] = str(built["libcuda"])
        res, _ = run_prog(built, ["steps"], env)
    assert res == {"steps": 3}
    h = src.drain()[Kind.LAUNCH]["exec_hash"].tolist()
    assert len(h) == 6
    if param_info:
        assert len(set(h)) == 1
    else:
        assert h[0] != h[1] and h[0::2] == [h[0]] * 3 and h[1::2] == [h[1]] * 3


@pytest.mark.parametrize("mode,threads,pinned", [("race", 1, 1), ("race", 4, 1), ("race", 3, 0), ("race-sync", 4, 1)])
def test_hum_copies_equal_plain_even_when_source_is_rewritten(built, mode, threads, pinned):
    """PPoPP'20 §4.2: the host rewrites the whole source right after the asynchronous copy,
    rewrites one not-yet-copied page, and frees the source: the device gets the old bytes each
    time. The workers are slowed down so that the writes really meet protected pages. With
    pinned staging, the fake's copy engine reads a pinned buffer only when its stream is
    synchronised, so a worker that reused a buffer before its DMA finished would copy the next
    chunk's bytes and fail the comparison; several workers stage chunks out of order, which the
    in-order unprotection must absorb. ``race-sync`` never calls cudaMemcpyAsync itself, as
    nvcc-built programs do not: the workers must resolve every runtime call they make."""
    plain, _ = run(built, mode, preload=False)
    assert plain["race_ok"] == plain["tail_ok"] == plain["free_ok"] == 1
    hum, err = run(built, mode, hum=True, hum_delay_us=3000, hum_threads=threads, hum_pinned=pinned)
    assert hum == plain
    st = stats(err)
    assert int(st["hum_copies"]) == 3 and int(st["segv_waits"]) > 0 and int(st["barrier_waits"]) > 0
    # every chunk through a pinned buffer, or (without) by pageable DMA on the worker's stream;
    # never a CPU copy + prefetch
    assert int(st["chunks"]) == 3 * 9 and int(st["prefetches"]) == 0
    assert int(st["pinned_chunks" if pinned else "dma_chunks"]) == int(st["chunks"])


@pytest.mark.parametrize("delay_us,group,step", [(0, 2 << 20, 2 << 20), (0, 64 << 20, 64 << 20),
                                                 (1000, 2 << 20, 64 << 20), (20000, 4 << 20, 2 << 20)])
def test_hum_protection_is_split_between_the_call_and_the_workers(built, delay_us, group, step):
    """The call write-protects the source from its end while the workers stage from its start,
    and returns once they meet; what the workers read first is never protected. Whatever the
    split (fast workers that stage most before the call returns, slow ones that leave it all
    protected, protection and unprotection in one chunk or in large steps), the device gets the
    bytes as they were at the call, writers wait only for their own pages, and every copy
    completes (the program's later copies and the final checks pass)."""
    plain, _ = run(built, "race", preload=False)
    hum, err = run(built, "race", hum=True, hum_delay_us=delay_us, hum_threads=4,
                   hum_protect_group=group, hum_unprot_step=step)
    assert hum == plain
    st = stats(err)
    assert int(st["hum_copies"]) == 3 and int(st["chunks"]) == 3 * 9
    if delay_us >= 20000:   # workers far behind: the call protected (nearly) everything, writers waited
        assert int(st["segv_waits"]) > 0 and float(st["protect_ms"]) > 0


@pytest.mark.parametrize("threads,delay_us,group,step", [(8, 0, 16 << 20, 32 << 20), (3, 200, 2 << 20, 2 << 20),
                                                       (1, 0, 4 << 20, 64 << 20), (4, 1000, 64 << 20, 2 << 20)])
def test_hum_stress_random_copies_and_rewrites(built, threads, delay_us, group, step):
    """24 HUM copies of random sizes (1-39 MiB) at random source alignments, each followed at
    once by writes into its source (all of it, random pages, the partial first and last pages,
    the middle, or none), under several worker counts, speeds and protection/unprotection
    steps: the device gets the bytes of the call every time."""
    plain, _ = run(built, "stress", preload=False)
    assert plain == {"stress_ok": 1, "copies": 24}
    hum, err = run(built, "stress", hum=True, hum_threads=threads, hum_delay_us=delay_us,
                   hum_protect_group=group, hum_unprot_step=step)
    assert hum == plain
    assert int(stats(err)["hum_copies"]) == 24


def test_hum_basic_results_and_copy_reports(built):
    plain, _ = run(built, "basic", preload=False)
    with RuntimeSource() as src:
        hum, err = run(built, "basic", hum=True, socket=src.path, hum_delay_us=500)
    assert hum["checksum"] == plain["checksum"]
    assert int(stats(err)["hum_copies"]) == 2
    # HUM gives each of the 3 cudaMalloc stand-ins its GPU pages at once (as cudaMalloc would);
    # plain managed routing (DeepUM) keeps placement lazy
    assert stats(err)["populated"] == "3"
    assert stats(run(built, "basic", managed=True)[1])["populated"] == "0"
    cp = src.drain()[Kind.COPY]
    h2d = cp[cp["kind"] == CopyKind.H2D]
    assert len(h2d) == 2 and (h2d["t_end_ns"] >= h2d["t_ns"]).all() and (h2d["t_end_ns"] > 0).all()


def test_driver_launch_waits_for_pending_copies(built):
    """A launch through cuGetProcAddress (as cuBLAS does) bypasses cudaLaunchKernel: the runtime's
    trampoline must still make it wait for the copy, or the kernel reads stale bytes."""
    plain, _ = run(built, "driver", preload=False)
    hum, err = run(built, "driver", hum=True, hum_delay_us=3000)
    assert hum == plain and hum["driver_ok"] == 1
    assert int(stats(err)["driver_wrapped"]) >= 1 and int(stats(err)["hum_copies"]) == 1


def test_driver_launches_are_reported_by_name(built):
    """cuBLAS's private cudart reaches cuLaunchKernel through cuGetProcAddress: without the
    driver-level wrapper its GEMMs are never reported (measured on the H100: 61 launches a torch
    training step and no GEMM). The launch is reported with the CUfunction's name, and its end
    is tracked like a runtime launch's."""
    with RuntimeSource(kernel_starts=True) as src:
        res, err = run(built, "driver", socket=src.path, track_end="1")
    batch = src.drain()
    la = batch[Kind.LAUNCH]
    assert res["driver_ok"] == 1 and res["driver_rc"] == 0
    assert [batch.names[i] for i in la["name_id"]] == ["sum_bytes"] and (la["t_ns"] > 0).all()
    assert stats(err)["driver_launches"] == "1"
    with RuntimeSource() as src:          # not reporting: the entry point is handed out unwrapped
        res2, err2 = run(built, "driver")
    assert res2 == res and stats(err2)["driver_launches"] == "0" and stats(err2)["launches"] == "0"


def test_runtime_launch_ending_in_the_driver_is_reported_once(built, monkeypatch):
    """libcudart itself launches through the driver's entry point: the runtime launch is
    reported, the driver launch inside it is not reported again."""
    monkeypatch.setenv("FAKE_RT_VIA_DRIVER", "1")
    plain, _ = run(built, "basic", preload=False)
    with RuntimeSource() as src:
        res, err = run(built, "basic", socket=src.path)
    la = src.drain()[Kind.LAUNCH]
    addrs = ("dA", "dB", "dC", "hA")
    assert {k: v for k, v in res.items() if k not in addrs} == {k: v for k, v in plain.items() if k not in addrs}
    assert sorted(la["seq"].tolist()) == [0, 1, 2] and stats(err)["driver_launches"] == "0"


def test_small_copies_and_no_concurrent_access_fall_back(built):
    plain, _ = run(built, "basic", preload=False)
    res, err = run(built, "basic", hum=True, hum_min=1 << 30)
    assert res["checksum"] == plain["checksum"] and stats(err)["hum_copies"] == "0"
    base_env = os.environ.copy()
    os.environ["FAKE_NO_CONCURRENT"] = "1"
    try:
        res, err = run(built, "race", hum=True)
    finally:
        os.environ.clear()
        os.environ.update(base_env)
    assert res["race_ok"] == 1 and stats(err)["hum_copies"] == "0"


@pytest.mark.parametrize("libcuda", ["/nonexistent/libcuda.so.1", "/etc/hostname"])
def test_absent_or_broken_libcuda_is_a_clean_fallback(built, libcuda):
    plain, _ = run(built, "race", preload=False)
    with RuntimeSource() as src:
        res, err = run(built, "race", hum=True, libcuda=libcuda, socket=src.path)
    assert res == plain
    st = stats(err)
    assert st["prefetches"] == "0" and int(st["hum_copies"]) == 3   # copies still asynchronous, just not prefetched


def test_program_without_cuda_runs_unchanged(built, tmp_path):
    env = child_env({"PATH": os.environ.get("PATH", "")}, library=built["lib"], hum=True, socket=str(tmp_path / "s"))
    p = subprocess.run(["sh", "-c", "echo hello; cat /etc/hostname > /dev/null"], env=env, capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 0 and p.stdout == "hello\n" and p.stderr == ""


def test_unreachable_socket_drops_and_counts_never_blocks(built, tmp_path):
    """No listener (or a full one): sends fail at once, records are dropped and counted, and the
    program finishes with the same results."""
    res, err = run(built, "basic", socket=str(tmp_path / "nobody.sock"), managed=True)
    assert res["checksum"] == run(built, "basic", preload=False)[0]["checksum"]
    launch, alloc, copy = (int(x) for x in stats(err)["drops"].split(","))
    assert launch == 3 and alloc == 6 and copy == 3


def _launch(seq, t, stream=7, pid=5):
    from umctl.events.schema import empty
    r = empty(Kind.LAUNCH, 1)
    r["seq"], r["t_ns"], r["stream"], r["pid"] = seq, t, stream, pid
    return r


def _end(seq, t, pid=5):
    from umctl.events.schema import empty
    r = empty(Kind.LAUNCH, 1)
    r["seq"], r["t_ns"], r["t_end_ns"], r["pid"] = seq, -1, t, pid
    return r


def test_kernel_starts_follow_the_previous_kernels_end_on_its_stream():
    """A host that queues three kernels at once: each is released when the one before it on
    its stream ended, with that end as its start; another stream is independent; end notices
    themselves are never passed on."""
    import numpy as np

    from umctl.sources.runtime import KernelStarts

    ks = KernelStarts()
    out = ks.feed(np.concatenate([_launch(0, 100), _launch(1, 101), _launch(2, 102), _launch(3, 103, stream=9)]), 200)
    assert out["seq"].tolist() == [0, 3] and out["t_ns"].tolist() == [100, 103]
    out = ks.feed(_end(0, 500), 600)
    assert out["seq"].tolist() == [1] and out["t_ns"].tolist() == [500]
    assert len(ks.feed(_end(3, 550), 700)) == 0          # stream 9 had nothing waiting
    out = ks.feed(np.concatenate([_end(1, 900), _launch(4, 950)]), 1000)
    assert out["seq"].tolist() == [2] and out["t_ns"].tolist() == [900]
    out = ks.feed(_end(2, 1200), 1300)
    assert out["seq"].tolist() == [4] and out["t_ns"].tolist() == [1200]
    assert (out["t_ns"] != -1).all()


def test_kernel_starts_never_stall_on_a_lost_end_notice():
    import numpy as np

    from umctl.sources.runtime import KernelStarts

    ks = KernelStarts(hold_ns=1000)
    assert ks.feed(np.concatenate([_launch(0, 100), _launch(1, 101)]), 200)["seq"].tolist() == [0]
    late = ks.feed(_launch(2, 5000)[:0], 2000)            # the end of 0 never came
    assert late["seq"].tolist() == [1] and late["t_ns"].tolist() == [101]


def test_runtime_reports_kernel_ends_when_asked(built):
    """UMCTL_RT_TRACK_END=1: one end notice per launch reaches the socket (the fake's events
    complete at once), and the source turns them into starts, passing every launch once."""
    from umctl.sources.runtime import RuntimeSource

    with RuntimeSource(kernel_starts=True) as src:
        res, err = run(built, "basic", socket=src.path, track_end="1")
    batch = src.drain()
    la = batch[Kind.LAUNCH]
    assert sorted(la["seq"].tolist()) == [0, 1, 2] and (la["t_ns"] > 0).all()
    with RuntimeSource() as src:                          # without tracking: no end notices
        run(built, "basic", socket=src.path)
    assert sorted(src.drain()[Kind.LAUNCH]["seq"].tolist()) == [0, 1, 2]


def test_pluggable_allocator_bookkeeping(built):
    """torch's pluggable-allocator path: a freed block is cached and reported BLOCK_INACTIVE
    (DeepUM may invalidate it), handed out again as BLOCK_ACTIVE with the same address and
    allocation id, and really freed (FREE) once the cache (UMCTL_RT_CACHE) is full."""
    with RuntimeSource() as src:
        res, _ = run(built, "allocator", socket=src.path, cache=str(4 << 20))
    al = src.drain()[Kind.ALLOC]
    assert res["a"] == res["b"] != res["c"] and res["managed_allocs"] == 2
    ops = [(int(o), int(a)) for o, a in zip(al["op"], al["addr"])]
    a, c = res["a"], res["c"]
    assert ops == [(AllocOp.ALLOC, a), (AllocOp.BLOCK_INACTIVE, a), (AllocOp.BLOCK_ACTIVE, a),
                   (AllocOp.ALLOC, c), (AllocOp.BLOCK_INACTIVE, a), (AllocOp.FREE, c)]
    ids = dict(zip(al["addr"].tolist(), al["alloc_id"].tolist()))
    assert len({int(i) for i, x in zip(al["alloc_id"], al["addr"]) if x == a}) == 1   # one id for a's life
    assert ids[a] != ids[c] and (al["bytes"] == 4 << 20).all() and al["managed"].all()


def test_driver_api_managed_allocations_are_reported(built):
    """A pluggable allocator over the driver API (cuMemAllocManaged / cuMemFree_v2 through dlsym
    or cuGetProcAddress, as benchmarks/gpu/workloads/managed_alloc.c and cudart reach them): when the runtime
    reports to umctl, each allocation and free is an ALLOC event, so a recorded trace knows the
    freed range's pages start over. Without a socket nothing is wrapped."""
    with RuntimeSource() as src:
        res, _ = run(built, "driver-alloc", socket=src.path)
    al = src.drain()[Kind.ALLOC]
    ops = [(int(o), int(a), int(n)) for o, a, n in zip(al["op"], al["addr"], al["bytes"])]
    a, b, c = res["a"], res["b"], res["c"]
    assert ops == [(AllocOp.ALLOC, a, 2 << 20), (AllocOp.ALLOC, b, 4 << 20), (AllocOp.FREE, a, 2 << 20),
                   (AllocOp.ALLOC, c, 2 << 20), (AllocOp.FREE, b, 4 << 20), (AllocOp.FREE, c, 2 << 20)]
    assert al["managed"].all()
    plain, err = run(built, "driver-alloc")   # no socket: runs unchanged, nothing wrapped
    assert set(plain) == {"a", "b", "c"} and stats(err)["driver_wrapped"] == "0"


def _discard(src: RuntimeSource, pid: int, addr: int, n: int):
    """RuntimeSource.discard_async waited for: the answer's records, or None."""
    import threading

    got, done = [], threading.Event()
    if not src.discard_async(pid, addr, n, 1000, lambda a: (got.append(a), done.set()), timeout=5.0):
        return None
    done.wait(10.0)
    return got[0] if got else None


class _MigrateLog(abi.Ioctl):
    """The uvm actuator's driver seam: logs UVM_MIGRATE (base, length), issues nothing."""

    def __init__(self):
        self.calls: list[tuple[int, int]] = []

    def ioctl(self, fd, cmd, p):
        assert cmd == abi.UVM_MIGRATE, cmd       # never a discard from umctl's side
        self.calls.append((int(p.base), int(p.length)))
        return abi.NV_OK


def test_safe_discard_drops_only_idle_cached_blocks(built):
    """UMCTL_RT_CONTROL: umctl asks, the runtime decides. Of three 4 MiB blocks -- a freed while
    a copy queued before its free is still pending on its stream, b freed and idle, c in use --
    only b is discarded (one UVM_DISCARD+UNMAP ioctl on the fd umctl named); a follows once its
    stream has finished, a ragged range is rounded inward to whole pages, a range outside the
    cache is kept, and blocks handed out again are never touched."""
    import json as _json
    from umctl.runtime import DISCARDED, KEPT_REASONS

    base = {k: v for k, v in os.environ.items() if not k.startswith(("UMCTL_RT_", "LD_PRELOAD"))}
    base["FAKE_LIBCUDA"] = str(built["libcuda"])
    mb4 = 4 << 20

    def ask(src, pid, addr, n):
        r = _discard(src, pid, addr, n)
        assert r is not None, "the runtime did not answer"
        done = [(int(a), int(b)) for a, b, s in zip(r["addr"], r["bytes"], r["status"]) if s == DISCARDED]
        kept = {KEPT_REASONS[int(s)]: int(b) for b, s in zip(r["bytes"], r["status"]) if s != DISCARDED and b}
        return done, kept

    with RuntimeSource() as src:
        env = child_env(base, library=built["lib"], socket=src.path, control="1")
        env["UMCTL_RT_LIBCUDA"] = str(built["libcuda"])
        env["UMCTL_RT_STATS"] = "1"
        p = subprocess.Popen([str(built["prog"]), "discard"], env=env, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            blocks = _json.loads(p.stdout.readline().split(" ", 1)[1])
            assert p.stdout.readline().strip() == "READY"
            a, b, c = blocks["a"], blocks["b"], blocks["c"]
            for _ in range(500):                  # the address comes with the first report
                if p.pid in src.peers:
                    break
                time.sleep(0.01)
            assert p.pid in src.peers
            assert _discard(src, p.pid + 1, b, mb4) is None       # no such runtime: no answer
            # through the uvm actuator, as `umctl run` wires it: the runtime drops b, not a (its
            # last use still queued); then umctl pre-evicts both (b's pages move without a copy)
            io = _MigrateLog()
            act = UvmActuator(3, {0: bytes(16)}, bytes([1] * 16), io=io, workers=1)
            act.invalidator = RuntimeDiscard(src, p.pid, 1000, timeout=5.0)
            act.submit(np.concatenate([commands(Op.INVALIDATE, a, mb4), commands(Op.INVALIDATE, b, mb4)]))
            for _ in range(500):                  # the answers come on the source's thread
                st = act.invalidator.stats()
                if st["discarded_bytes"] + sum(st["kept_bytes"].values()) >= 2 * mb4:
                    break
                time.sleep(0.01)
            assert act.wait_idle(10)
            act.close()
            assert sorted(io.calls) == sorted([(a, mb4), (b, mb4)])
            assert act.invalidator.stats() == {"requests": 2, "unanswered": 0, "discarded_bytes": mb4,
                                               "kept_bytes": {"in_use": 0, "busy": mb4, "unsafe": 0, "small": 0,
                                                              "failed": 0}}
            assert ask(src, p.pid, c, mb4) == ([], {"in_use": mb4})
            p.stdin.write("go\n"); p.stdin.flush()
            assert p.stdout.readline().strip() == "SYNCED"
            assert ask(src, p.pid, a + 100, mb4 - 200) == ([(a + 4096, mb4 - 8192)], {"small": 8192 - 200})
            p.stdin.write("go\n"); p.stdin.flush()
            assert p.stdout.readline().strip() == "REUSED"
            assert ask(src, p.pid, a, mb4) == ([], {"in_use": mb4})
            assert ask(src, p.pid, b, mb4) == ([], {"in_use": mb4})
            p.stdin.write("go\n"); p.stdin.flush()
            res = _json.loads(p.stdout.readline().split(" ", 1)[1])
            err = p.stderr.read()
            assert p.wait(timeout=30) == 0, err
        finally:
            if p.poll() is None:
                p.kill()
    assert res == {"discards": [[b, mb4, 1], [a + 4096, mb4 - 8192, 1]], "reused": 1}
    assert stats(err)["discards"] == f"6,{2 * mb4 - 8192},{4 * mb4 + 8192 - 200}"


@pytest.mark.parametrize("prefer", [True, False])
def test_prefer_host_advises_every_managed_allocation_and_reports_it(built, prefer):
    """UMCTL_RT_PREFER_HOST (the budget's admission control): every managed allocation gets the
    host as preferred location before the program can touch it, and each success is reported
    as a HOST_PREFERRED record over exactly the allocation's range; without it, no advice."""
    extra = {"prefer_host": "1"} if prefer else {}
    with RuntimeSource() as src:
        res, err = run(built, "basic", socket=src.path, managed=True, **extra)
    al = src.drain()[Kind.ALLOC]
    allocs = al[al["op"] == AllocOp.ALLOC]
    pref = al[al["op"] == AllocOp.HOST_PREFERRED]
    assert len(allocs) == 3
    st = stats(err)["prefer_host"].split(",")
    if prefer:
        assert sorted(zip(pref["addr"].tolist(), pref["bytes"].tolist())) == \
            sorted(zip(allocs["addr"].tolist(), allocs["bytes"].tolist()))
        assert set(pref["alloc_id"]) == set(allocs["alloc_id"])
        assert st == ["3", "0"]
    else:
        assert len(pref) == 0 and st == ["0", "0"]


def test_prefer_gpus_advises_neighbour_gpus_round_robin_and_reports_it(built, tmp_path, monkeypatch):
    """UMCTL_RT_PREFER_GPUS (admission with --spare-gpus): each managed allocation's preferred
    location is a neighbour GPU (a device location, never the host), dealt round-robin in
    slices, and each advised slice is reported PEER_PREFERRED; together the slices cover exactly
    the allocations."""
    log = tmp_path / "advise.log"
    monkeypatch.setenv("FAKE_ADVISE_LOG", str(log))
    with RuntimeSource() as src:
        res, err = run(built, "basic", socket=src.path, managed=True, prefer_gpus="1,2")
    al = src.drain()[Kind.ALLOC]
    allocs = al[al["op"] == AllocOp.ALLOC]
    pref = al[al["op"] == AllocOp.PEER_PREFERRED]
    assert len(allocs) == 3 and not (al["op"] == AllocOp.HOST_PREFERRED).any()
    covered = {}
    for a, n, i in zip(pref["addr"].tolist(), pref["bytes"].tolist(), pref["alloc_id"].tolist()):
        covered.setdefault(i, []).append((a, n))
    for a, n, i in zip(allocs["addr"].tolist(), allocs["bytes"].tolist(), allocs["alloc_id"].tolist()):
        parts = sorted(covered[i])
        assert parts[0][0] == a and sum(x[1] for x in parts) == n
        assert all(p[0] + p[1] == q[0] for p, q in zip(parts, parts[1:]))
    advised = [tuple(map(int, ln.split())) for ln in log.read_text().splitlines()]
    preferred = [x for x in advised if x[0] == 3]
    assert len(preferred) == len(pref)
    assert {(t, d) for _, _, _, t, d in preferred} <= {(1, 1), (1, 2)}        # device locations only
    assert [d for *_, d in preferred][:2] == [1, 2]                          # dealt round-robin
    assert stats(err)["prefer_host"] == f"{len(pref)},0"


def test_prefer_host_failure_is_counted_not_reported(built, tmp_path):
    """A driver without the advice entry point: the allocation still works, no HOST_PREFERRED
    record claims what did not happen (the budget check then counts faults as arrivals)."""
    with RuntimeSource() as src:
        res, err = run(built, "basic", socket=src.path, managed=True, prefer_host="1",
                       libcuda=str(tmp_path / "missing-libcuda.so"))
    al = src.drain()[Kind.ALLOC]
    assert (al["op"] == AllocOp.ALLOC).sum() == 3 and not (al["op"] == AllocOp.HOST_PREFERRED).any()
    assert stats(err)["prefer_host"] == "0,3"


def test_evict_each_migrates_all_managed_memory_home_after_every_kernel(built, tmp_path, monkeypatch):
    """UMCTL_RT_EVICT_EACH (umctl run --complete-accesses): after each reported kernel the
    runtime waits for the GPU, then sends every managed allocation to the host (device -1) and
    waits again, so the next kernel faults all it touches; the program's results are unchanged,
    and without the switch nothing is prefetched."""
    log = tmp_path / "prefetch.log"
    monkeypatch.setenv("FAKE_PREFETCH_LOG", str(log))
    with RuntimeSource() as src:
        res, err = run(built, "basic", socket=src.path, managed=True, evict_each="1")
    allocs = src.drain()[Kind.ALLOC]
    allocs = allocs[allocs["op"] == AllocOp.ALLOC]
    ranges = sorted(zip(allocs["addr"].tolist(), allocs["bytes"].tolist()))
    lines = log.read_text().splitlines()
    log.unlink()
    per_kernel = ["sync"] + ["prefetch"] * 3 + ["sync"]
    assert [ln.split()[0] for ln in lines] == per_kernel * 3 + ["sync"]   # the program's own sync last
    for k in range(3):
        block = [ln.split() for ln in lines[5 * k + 1:5 * k + 4]]
        assert sorted((int(a), int(n)) for _, a, n, _ in block) == ranges
        assert {int(d) for *_, d in block} == {-1}
    assert stats(err)["evict_each"] == "3,0"
    plain, err0 = run(built, "basic", socket=None, managed=True)
    assert res["checksum"] == plain["checksum"]
    assert [ln for ln in log.read_text().splitlines() if ln.startswith("prefetch")] == []
    assert stats(err0)["evict_each"] == "0,0"
