"""The ``stream`` actuator: umctl's queue written into the ring the runtime shares with the
program (umctl/actuators/stream.py), and the runtime enqueueing the entries in stream order
before the next launch (runtime/umctl_rt.c, cmdq_before_launch) -- on the fake CUDA runtime and
driver of tests/rtprog, whose device-call log shows the order of prefetches, events, waits
and launches."""

from __future__ import annotations

import json
import os
import re
import subprocess

import numpy as np
import pytest

from umctl.actuators.stream import CMD_DTYPE, HEADER_DTYPE, CommandQueue, StreamActuator
from umctl.events.schema import Op, Status, commands
from umctl.runtime import child_env
from umctl.sources.runtime import RuntimeSource
from umctl.units import BLOCK_SIZE, CPU

from test_actuator_uvm import CPU_UUID, GPU0, FakeUvm, blk
from test_runtime import built  # noqa: F401 - the module-scoped build fixture


def stream_act(q: CommandQueue, io: FakeUvm | None = None) -> StreamActuator:
    return StreamActuator(q, 3, {0: GPU0}, CPU_UUID, io=io or FakeUvm(), pidfd=7)


def run_stream(built, q: CommandQueue, n: int, between=None, **rt) -> tuple[dict, list[str]]:  # noqa: F811
    """rtprog's stream mode with the ring ``q`` (and a report socket: commands go before
    reported launches): ``between(i)`` runs before launch i."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("UMCTL_RT_", "LD_PRELOAD"))}
    base["FAKE_LIBCUDA"] = str(built["libcuda"])
    base.update({k: v for k, v in rt.items() if k.startswith("FAKE_")})
    with RuntimeSource() as src:
        env = child_env(base, library=built["lib"], socket=src.path, libcuda=str(built["libcuda"]), cmd_fd=str(q.fd),
                        stats="1", **{k: str(v) for k, v in rt.items() if not k.startswith("FAKE_")})
        p = subprocess.Popen([str(built["prog"]), "stream", str(n)], env=env, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, pass_fds=(q.fd,))
        for i in range(n):
            if between is not None:
                between(i)
            p.stdin.write("go\n")
            p.stdin.flush()
            line = p.stdout.readline()
            assert line.strip() == f"LAUNCHED {i}", line
        p.stdin.close()
        out = p.stdout.read()
        err = p.stderr.read()
        assert p.wait(timeout=30) == 0 and "RESULT " in out, (out, err)
    res = json.loads(next(ln for ln in out.splitlines() if ln.startswith("RESULT "))[7:])
    return res, [ln for ln in res["log"].split("\n") if ln]


def test_layouts_match_the_runtime_header():
    h = open(os.path.join(os.path.dirname(__file__), "..", "runtime", "umctl_rt.h")).read()
    assert "sizeof(struct umrt_cmdq) == 128" in h and "sizeof(struct umrt_cmd) == 56" in h
    assert HEADER_DTYPE.itemsize == 128 and CMD_DTYPE.itemsize == 56


def test_submit_coalesces_orders_and_publishes_ranges():
    """The uvm actuator's queue in front of the ring: contiguous blocks become one range,
    evictions (priority 0) go before prefetches, a later intent for a block replaces the
    earlier one; nothing is visible to the runtime before publish (head)."""
    q = CommandQueue(64)
    a = stream_act(q)
    ids = a.submit(np.concatenate([
        commands(Op.PREFETCH, [blk(i) for i in range(4)], BLOCK_SIZE, dst=0, priority=1),
        commands(Op.PREEVICT, [blk(10), blk(11)], BLOCK_SIZE, dst=CPU, priority=0),
        commands(Op.PREFETCH, blk(11), BLOCK_SIZE, dst=0, priority=1),   # replaces the eviction of 11
    ]))
    assert len(ids) == 7 and q.head == q.written == 3
    ring = q.ring[:3]
    assert ring["addr"].tolist() == [blk(10), blk(0), blk(11)]
    assert ring["bytes"].tolist() == [BLOCK_SIZE, 4 * BLOCK_SIZE, BLOCK_SIZE]
    assert ring["dst"].tolist() == [CPU, 0, 0] and (ring["status"] == -1).all()
    r = a.results()
    assert r["cmd_id"].tolist() == [5] and r["status"].tolist() == [Status.SKIPPED]   # the superseded one
    a.close()


def test_results_follow_what_the_runtime_took_and_close_drops_the_rest():
    q = CommandQueue(8)
    a = stream_act(q)
    a.submit(commands(Op.PREFETCH, [blk(0), blk(5)], BLOCK_SIZE, dst=0))
    # the runtime took the first entry (enqueued it before launch 3) and nothing else yet
    q.ring[0]["status"], q.ring[0]["t_done_ns"], q.ring[0]["seq"] = 0, int(q.ring[0]["t_submit_ns"]) + 5000, 3
    q.hdr["tail"] = 1
    r = a.results()
    assert r["cmd_id"].tolist() == [0] and r["status"].tolist() == [Status.OK]
    assert r["bytes"].tolist() == [BLOCK_SIZE] and r["latency_ns"].tolist() == [5000]
    a.close()
    r = a.results()
    assert r["cmd_id"].tolist() == [1] and r["status"].tolist() == [Status.SKIPPED]
    assert q.closed and a.stats()["counts"]["dropped"] == 1
    a.submit(commands(Op.PREFETCH, blk(9), BLOCK_SIZE, dst=0))   # after close: dropped, never written
    assert a.results()["status"].tolist() == [Status.SKIPPED]


def test_a_full_ring_drops_newer_work_and_counts_it():
    q = CommandQueue(2)
    a = stream_act(q)
    a.submit(commands(Op.PREFETCH, [blk(0), blk(2), blk(4)], BLOCK_SIZE, dst=0))
    assert q.written == 2
    r = a.results()
    assert r["status"].tolist() == [Status.SKIPPED] and a.stats()["counts"]["dropped"] == 1
    a.close()


def test_invalidation_and_neighbour_evictions_go_through_the_va_space():
    io = FakeUvm()
    q = CommandQueue(8)
    a = stream_act(q, io)
    a.submit(np.concatenate([commands(Op.INVALIDATE, blk(1), BLOCK_SIZE),
                             commands(Op.PREEVICT, blk(2), BLOCK_SIZE, dst=0)]))
    assert q.written == 0
    assert [c[0] for c in io.calls] == ["discard", "migrate"]
    assert sorted(a.results()["status"].tolist()) == [Status.OK, Status.OK]
    a.close()


def _prefetches(log: list[str]) -> list[str]:
    return [ln for ln in log if ln.startswith("prefetch")]


def test_runtime_enqueues_commands_before_the_next_launch_on_its_stream(built):  # noqa: F811
    """Lag 0: the entries written before launch i are enqueued on the launch's stream right
    before kernel i (so the kernel cannot start before they are done); results say so."""
    q = CommandQueue(16)
    a = stream_act(q)

    def between(i: int) -> None:
        if i == 1:
            a.submit(np.concatenate([commands(Op.PREEVICT, blk(7), BLOCK_SIZE, dst=CPU, priority=0),
                                     commands(Op.PREFETCH, [blk(0), blk(1)], BLOCK_SIZE, dst=0)]))

    res, log = run_stream(built, q, 3, between, cmd_lag=0)
    assert res["rc"] == 0 and res["ok"] == 1
    launches = [i for i, ln in enumerate(log) if ln.startswith("launch vec_add")]
    pf = [i for i, ln in enumerate(log) if ln.startswith("prefetch")]
    assert len(launches) == 3 and launches[0] < pf[0] < pf[1] < launches[1]
    assert log[pf[0]] == f"prefetch {blk(7):x}+{BLOCK_SIZE} dev=-1 stream=0"
    assert log[pf[1]] == f"prefetch {blk(0):x}+{2 * BLOCK_SIZE} dev=0 stream=0"
    r = a.results()
    assert sorted(r["status"].tolist()) == [Status.OK] * 3
    assert q.ring[:2]["seq"].tolist() == [1, 1] and int(q.hdr["batches"][0]) == 1
    a.close()


def test_with_a_lag_commands_run_on_a_side_stream_the_later_kernel_waits_for(built):  # noqa: F811
    """Lag 1: the side stream first waits for the work already on the launch's stream, takes
    the commands and records an event; the kernel one launch later waits for that event."""
    q = CommandQueue(16)
    a = stream_act(q)

    def between(i: int) -> None:
        if i == 0:
            a.submit(commands(Op.PREFETCH, blk(3), BLOCK_SIZE, dst=0))

    res, log = run_stream(built, q, 3, between, cmd_lag=1)
    assert res["ok"] == 1
    rec_a = re.fullmatch(r"record event=(\d+) stream=0", log[0])
    wait_a = re.fullmatch(r"wait stream=(\d+) event=(\d+)", log[1])
    assert rec_a and wait_a and wait_a.group(2) == rec_a.group(1)
    side = wait_a.group(1)
    assert log[2] == f"prefetch {blk(3):x}+{BLOCK_SIZE} dev=0 stream={side}"
    rec_b = re.fullmatch(rf"record event=(\d+) stream={side}", log[3])
    assert rec_b and log[4].startswith("launch vec_add")          # kernel 0 does not wait
    assert log[5] == f"wait stream=0 event={rec_b.group(1)}"       # kernel 1 waits for the batch
    assert log[6].startswith("launch vec_add") and log[7].startswith("launch vec_add")
    a.close()


def test_refused_prefetch_is_a_counted_failure_and_the_program_is_unchanged(built):  # noqa: F811
    q = CommandQueue(4)
    a = stream_act(q)
    a.submit(commands(Op.PREFETCH, blk(0), BLOCK_SIZE, dst=0))
    res, _ = run_stream(built, q, 2, None, cmd_lag=0, FAKE_PREFETCH_FAIL="1")
    assert res["rc"] == 0 and res["ok"] == 1
    assert a.results()["status"].tolist() == [Status.FAILED]
    assert a.stats()["counts"]["refused"] == 1
    a.close()


def test_a_closed_ring_is_left_alone_and_a_child_takes_nothing(built):  # noqa: F811
    q = CommandQueue(4)
    a = stream_act(q)
    a.submit(commands(Op.PREFETCH, blk(0), BLOCK_SIZE, dst=0))
    q.hdr["closed"] = 1
    res, log = run_stream(built, q, 2, None, cmd_lag=0)
    assert res["ok"] == 1 and not _prefetches(log) and q.tail == 0
    a.close()


def test_lead_hold_gives_up_on_a_gpu_that_makes_no_progress(built):  # noqa: F811
    """UMCTL_RT_LEAD holds a launch while kernels are queued, waiting for the GPU only: with a
    GPU whose kernels never end (a kernel waiting on the host) each hold gives up after
    UMCTL_RT_LEAD_WAIT_MS and the program runs to the end."""
    q = CommandQueue(4)
    res, _ = run_stream(built, q, 4, None, lead=1, lead_wait_ms=20, track_end="1", FAKE_GPU_STUCK="1")
    assert res["rc"] == 0 and res["ok"] == 1
    h = q.hdr[0]
    assert int(h["lead_timeouts"]) >= 2 and int(h["lead_waits"]) == int(h["lead_timeouts"])
    q.close()


def test_lead_hold_lets_launches_through_once_kernels_end(built):  # noqa: F811
    q = CommandQueue(4)
    res, _ = run_stream(built, q, 6, None, lead=1, lead_wait_ms=5000, track_end="1")
    assert res["ok"] == 1 and int(q.hdr["lead_timeouts"][0]) == 0
    q.close()


def test_sync_makes_a_launch_wait_for_umctls_plan_from_the_one_before(built):  # noqa: F811
    """UMCTL_RT_CMD_SYNC_US: launch 1 waits (on the host) until umctl acks launch 0's report;
    the commands umctl writes meanwhile -- here 100 ms later -- go in right before launch 1,
    not a launch later."""
    import threading

    q = CommandQueue(16)
    a = stream_act(q)
    late: list[threading.Thread] = []

    def plan_late() -> None:
        import time

        time.sleep(0.1)
        a.submit(commands(Op.PREFETCH, blk(4), BLOCK_SIZE, dst=0))
        q.ack(1)

    def between(i: int) -> None:
        if i == 1:
            late.append(threading.Thread(target=plan_late))
            late[0].start()
        elif i > 1:
            q.ack(i)

    res, log = run_stream(built, q, 3, between, cmd_lag=0, cmd_sync_us=5_000_000)
    late[0].join()
    launches = [i for i, ln in enumerate(log) if ln.startswith("launch vec_add")]
    pf = [i for i, ln in enumerate(log) if ln.startswith("prefetch")]
    assert res["ok"] == 1 and len(pf) == 1 and launches[0] < pf[0] < launches[1]
    h = q.hdr[0]
    assert int(h["sync_waits"]) >= 1 and int(h["sync_timeouts"]) == 0 and int(h["sync_wait_ns"]) >= 50_000_000
    a.close()


def test_sync_stops_waiting_for_a_silent_umctl(built):  # noqa: F811
    """An umctl that never acks (killed, or stuck) costs three timed-out waits, then the
    program runs unsynchronised."""
    q = CommandQueue(4)
    res, _ = run_stream(built, q, 8, None, cmd_lag=0, cmd_sync_us=20_000)
    assert res["rc"] == 0 and res["ok"] == 1
    h = q.hdr[0]
    assert int(h["sync_timeouts"]) == 3 and int(h["sync_waits"]) == 3
    q.close()


def test_evictions_outside_the_stream_run_from_umctls_workers_with_one_id_space():
    """evict_in_stream=False: pre-evictions go through the va_space at once (umctl's workers),
    prefetches into the ring; cmd_ids stay unique and in input order, results come from both."""
    io = FakeUvm()
    q = CommandQueue(8)
    a = StreamActuator(q, 3, {0: GPU0}, CPU_UUID, io=io, pidfd=7, evict_in_stream=False)
    ids = a.submit(np.concatenate([commands(Op.PREFETCH, blk(0), BLOCK_SIZE, dst=0),
                                   commands(Op.PREEVICT, [blk(5), blk(6)], BLOCK_SIZE, dst=CPU, priority=0),
                                   commands(Op.PREFETCH, blk(1), BLOCK_SIZE, dst=0)]))
    ids2 = a.submit(commands(Op.PREEVICT, blk(9), BLOCK_SIZE, dst=CPU))
    assert len(set(ids.tolist() + ids2.tolist())) == 5
    assert q.written == 1 and q.ring[0]["addr"] == blk(0) and q.ring[0]["bytes"] == 2 * BLOCK_SIZE
    assert a.out.wait_idle(5)
    assert [c[0] for c in io.calls] == ["migrate", "migrate"]   # 5+6 coalesced, then 9
    r = a.results()
    assert sorted(r["cmd_id"].tolist()) == sorted([ids[1], ids[2], ids2[0]])
    assert a.stats()["counts"]["ok"] == 2
    a.close()
    assert sorted(a.results()["cmd_id"].tolist()) == [ids[0], ids[3]]   # never taken: dropped
