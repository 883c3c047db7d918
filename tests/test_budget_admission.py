"""Admission control (``--budget-hold admit``, umctl/live/control.py *Admission*) without a GPU.

A small model of the driver stands in for the real one: managed memory the runtime made
host-preferred is never brought onto the GPU by a fault (the driver maps the host page), only
by a PREFETCH the actuator executes, and leaves only by an executed PREEVICT. The actuator
executes each command a few control steps after it was issued (as the real one does, on its
own threads) and reports the moves as MIGRATION events. What is checked is the contract: at no
moment does the GPU hold more than the budget, the program's demand is admitted, and the budget
check, fed the same events, says `held` -- and says `NOT held` when the runtime never reported
the range host-preferred (its faults then count as arrivals).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from umctl.actuators.base import ActuatorBase
from umctl.controller.base import make_controller
from umctl.events.schema import AllocOp, EventBatch, Kind, Op, Status, empty
from umctl.loop.budget_check import BudgetCheck, RangeSet
from umctl.live.control import LiveControl
from umctl.units import BLOCK_SHIFT, BLOCK_SIZE

BASE = 0x7F00_0000_0000
GPUS = [{"gpu": 0, "uuid": "GPU-x", "memory_bytes": 80 << 30}]
STEP_NS = 1_000_000


class DelayedDriver(ActuatorBase):
    """Executes each command ``delay`` control steps after it was submitted, in submission
    order, and keeps the GPU's true block set."""

    def __init__(self, delay: int, rng: np.random.Generator):
        super().__init__(threading.Lock())
        self.delay, self.rng = delay, rng
        self.queue: list[tuple[int, int, int, int, int]] = []   # (due step, cmd id, op, addr, dst)
        self.on_gpu: set[int] = set()
        self.step_no = 0
        self.moves: list[tuple[int, int, int, int]] = []        # (t, block, src, dst) this step

    def submit(self, cmds):
        if hasattr(self, "submitted"):
            self.submitted.append(cmds.copy())
        ids = self._new_ids(len(cmds))
        for c, i in zip(cmds, ids.tolist()):
            due = self.step_no + self.delay + int(self.rng.integers(0, 2))
            self.queue.append((due, i, int(c["op"]), int(c["addr"]), int(c["dst"])))
        return ids

    def tick(self, t: int) -> None:
        """Carry out what is due at this step."""
        self.step_no += 1
        self.moves = []
        due = [q for q in self.queue if q[0] <= self.step_no]
        self.queue = [q for q in self.queue if q[0] > self.step_no]
        with self._lock:
            for _, cid, op, addr, dst in due:
                b = (addr - BASE) >> BLOCK_SHIFT
                if op == Op.PREFETCH and dst >= 0 and b not in self.on_gpu:
                    self.on_gpu.add(b)
                    self.moves.append((t, b, -1, dst))
                elif op in (Op.PREEVICT, Op.INVALIDATE) and b in self.on_gpu:
                    self.on_gpu.discard(b)
                    self.moves.append((t, b, 0, dst if op == Op.PREEVICT else -1))   # dst: host or a neighbour
                self._results.append((t, cid, int(Status.OK), BLOCK_SIZE, 1000))   # stamped in model time

    def migrations(self) -> np.ndarray:
        m = empty(Kind.MIGRATION, len(self.moves))
        for i, (t, b, src, dst) in enumerate(self.moves):
            m[i]["t_ns"], m[i]["t_end_ns"], m[i]["addr"] = t, t + 1000, BASE + b * BLOCK_SIZE
            m[i]["bytes"], m[i]["src"], m[i]["dst"] = BLOCK_SIZE, src, dst
        return m

    def _pending_locked(self):
        return len(self.queue)

    def close(self, drain=False, timeout=0):
        pass

    def stats(self):
        return {}


def host_preferred(t: int, n_blocks: int, op: AllocOp = AllocOp.HOST_PREFERRED) -> np.ndarray:
    a = empty(Kind.ALLOC, 2)
    a["t_ns"], a["addr"], a["bytes"], a["alloc_id"], a["managed"] = t, BASE, n_blocks * BLOCK_SIZE, 1, True
    a["op"] = [AllocOp.ALLOC, op]
    return a


def faults(t: int, blocks) -> np.ndarray:
    f = empty(Kind.FAULT, len(blocks))
    f["t_ns"], f["gpu"], f["addr"] = t, 0, BASE + np.asarray(blocks, np.uint64) * BLOCK_SIZE + 4096
    return f


def launch(t: int, h: int, seq: int) -> np.ndarray:
    la = empty(Kind.LAUNCH, 1)
    la["t_ns"], la["exec_hash"], la["seq"], la["name_id"] = t, h, seq, 0
    return la


def drive(mode: str, *, budget_blocks: int, steps: int, seed: int, delay: int, report_preferred: bool = True,
          fit_steps: int = 0, spare: int = 0):
    """A program under admission: for ``fit_steps`` kernels that all touch the same 8 blocks (a
    working set that fits), then a cycle of kernels touching overlapping windows of a 48-block
    allocation (four times the budget). Returns (peak true GPU blocks, the loop, the driver,
    per step the number of blocks the program faulted on)."""
    rng = np.random.default_rng(seed)
    drv = DelayedDriver(delay, rng)
    gpus = GPUS + [{"gpu": g, "uuid": f"GPU-{g}", "memory_bytes": 80 << 30} for g in range(1, 1 + spare)]
    lc = LiveControl(make_controller(mode), drv, pid=1, gpus=gpus, budget_bytes=budget_blocks * BLOCK_SIZE,
                     admission=True, migrations_on=True, spare_gpus=spare)
    drv.submitted = []
    n = 48
    kernels = [np.arange(k * 6, k * 6 + 10) % n for k in range(8)]   # overlapping windows
    peak, missed = 0, []
    for step in range(steps):
        t = (step + 1) * STEP_NS
        drv.tick(t)
        b = EventBatch(now_ns=t)
        if step == 0:
            pref = host_preferred(t - 10, n, AllocOp.PEER_PREFERRED if spare else AllocOp.HOST_PREFERRED)
            b.add(Kind.ALLOC, pref if report_preferred else pref[:1])
        k = step % len(kernels)
        want = np.arange(8) if step < fit_steps else kernels[k]
        # the program faults on what it touches and is not on the GPU (a remote mapping each time)
        missing = [int(x) for x in rng.permutation(want) if int(x) not in drv.on_gpu]
        missed.append(len(missing))
        if missing:
            b.add(Kind.FAULT, faults(t, missing))
        b.add(Kind.LAUNCH, launch(t, 100 + k, step))
        m = drv.migrations()
        if len(m):
            b.add(Kind.MIGRATION, m)
        lc.step(b)
        peak = max(peak, len(drv.on_gpu))
    lc.finish()
    return peak, lc, drv, missed


@pytest.mark.parametrize("mode", ["none", "deepum", "deepum-prefetch"])
@pytest.mark.parametrize("seed,delay", [(0, 1), (1, 2), (2, 4)])
def test_admission_never_lets_the_gpu_hold_more_than_the_budget(mode, seed, delay):
    peak, lc, drv, missed = drive(mode, budget_blocks=12, steps=200, seed=seed, delay=delay, fit_steps=30)
    assert peak <= 12, f"true GPU residency reached {peak} blocks over a 12-block budget"
    b = lc.stats()["budget"]
    assert b["hold"] == "admit" and b["admitted_blocks"] > 0 and b["room_evictions"] > 0
    # the demand is served: a working set that fits stops missing once its blocks are admitted
    assert missed[0] == 8 and sum(missed[delay + 3:30]) == 0, missed[:30]
    v = lc.check.verdict()
    assert v.held is True and v.true_peak_bytes <= 12 * BLOCK_SIZE, v
    assert v.faults_mapped_remote > 0


def test_admission_with_spare_gpus_evicts_into_the_neighbour_and_holds_the_budget():
    """memHarvester under admission: the runtime made the neighbour the preferred location
    (PEER_PREFERRED), so GPU 0's faults map the neighbour's pages and bring nothing in; the
    keeper admits demand onto GPU 0 and makes room by evicting into GPU 1, never to the host;
    GPU 0 never holds more than the budget and the check, judging GPU 0 alone, says held."""
    peak, lc, drv, missed = drive("none", budget_blocks=12, steps=200, seed=0, delay=2, fit_steps=30, spare=1)
    assert peak <= 12
    cmds = np.concatenate(drv.submitted)
    ev = cmds[cmds["op"] == Op.PREEVICT]
    assert len(ev) > 0 and set(ev["dst"].tolist()) == {1}, set(ev["dst"].tolist())
    pf = cmds[cmds["op"] == Op.PREFETCH]
    assert len(pf) > 0 and set(pf["dst"].tolist()) == {0}
    assert missed[0] == 8 and sum(missed[5:30]) == 0
    v = lc.check.verdict()
    assert v.held is True and v.faults_mapped_remote > 0 and v.fault_arrivals == 0, v
    assert lc.stats()["budget"]["hold"] == "admit"


def test_admission_with_spare_gpus_is_a_runtime_option():
    """--spare-gpus no longer forces the evict-after keeper: under the runtime the budget is
    admitted and the runtime is asked to prefer the neighbours (UMCTL_RT_PREFER_GPUS)."""
    from umctl.live.spec import ControlSpec

    s = ControlSpec("harvest", "1GiB", None, None, 2, None, live_run=True, hold="admit")
    assert s.use_runtime_admission(True) and s.prefer_gpus() == [1, 2]
    s = ControlSpec("none", "1GiB", None, None, 0, None, live_run=True)
    assert s.use_runtime_admission(True) and s.prefer_gpus() == []
    s = ControlSpec("harvest", "1GiB", None, None, 1, None, live_run=True, hold="evict")
    assert not s.use_runtime_admission(True) and s.prefer_gpus() == []


def test_without_the_runtimes_host_preferred_record_the_check_counts_faults_as_arrivals():
    """The check trusts no mechanism it has no evidence of: the same run, but the runtime never
    reported the range host-preferred (advice failed), so every fault counts as an arrival and
    the residency it sees is above what the GPU held (until the keeper's pre-evictions, done,
    take those blocks away again)."""
    peak, lc, _, _ = drive("none", budget_blocks=12, steps=120, seed=0, delay=2, report_preferred=False)
    v = lc.check.verdict()
    assert v.faults_mapped_remote == 0 and v.fault_arrivals > 0
    assert v.true_peak_bytes > max(peak, 12) * BLOCK_SIZE


def test_newest_demand_first_predictions_beyond_room_deferred_room_made_once():
    """Demand is admitted newest first up to the room; older demand than a budget's worth is
    dropped; a controller prefetch that does not fit is dropped (counted), never sent; demand
    that waits gets room by evicting the oldest arrivals, once: the evictions under way count
    until their results come."""
    drv = DelayedDriver(100, np.random.default_rng(0))      # nothing completes during the test
    lc = LiveControl(make_controller("none"), drv, pid=1, gpus=GPUS, budget_bytes=4 * BLOCK_SIZE, admission=True)
    b = EventBatch(now_ns=1)
    b.add(Kind.ALLOC, host_preferred(0, 64))
    b.add(Kind.FAULT, faults(1, [5, 6, 7, 8, 9, 10]))
    c = lc.step(b)[Kind.COMMAND]
    assert sorted((c["addr"][c["op"] == Op.PREFETCH] - BASE) // BLOCK_SIZE) == [7, 8, 9, 10]
    assert not lc.budget.wanted[0]
    b = EventBatch(now_ns=2)
    b.add(Kind.FAULT, faults(2, [11, 12]))
    c = lc.step(b)[Kind.COMMAND]
    assert not (c["op"] == Op.PREFETCH).any()
    ev = c[c["op"] == Op.PREEVICT]
    assert len(ev) == 2 and [b - (BASE >> BLOCK_SHIFT) for b in lc.budget.wanted[0]] == [11, 12]
    assert len(lc.budget.evicting[0]) == 2
    cmds = np.zeros(3, dtype=c.dtype)
    cmds["op"], cmds["dst"], cmds["bytes"] = Op.PREFETCH, 0, BLOCK_SIZE
    kept_block = int(next(iter(lc.res.blocks[0])))
    cmds["addr"] = [kept_block * BLOCK_SIZE, BASE + 20 * BLOCK_SIZE, BASE + 21 * BLOCK_SIZE]
    kept, demand, evict = lc.budget.admit(cmds, [0], 3)
    assert len(kept) == 1 and int(kept["addr"][0]) == kept_block * BLOCK_SIZE    # already there: passes
    assert demand is None and evict is None and lc.budget.deferred_prefetches == 2


def test_rangeset_add_remove_contains():
    r = RangeSet()
    r.add(100, 200)
    r.add(300, 400)
    r.add(200, 250)                  # touching: merged
    assert list(zip(r.lo.tolist(), r.hi.tolist())) == [(100, 250), (300, 400)]
    r.remove(120, 130)
    r.remove(350, 500)
    assert list(zip(r.lo.tolist(), r.hi.tolist())) == [(100, 120), (130, 250), (300, 350)]
    got = r.contains(np.array([99, 100, 119, 120, 129, 130, 249, 250, 300, 349, 350]))
    assert got.tolist() == [False, True, True, False, False, True, True, False, True, True, False]


def test_budget_hold_options_are_checked():
    from umctl import UmctlError
    from umctl.live.spec import ControlSpec

    with pytest.raises(UmctlError, match="admit or evict"):
        ControlSpec("none", "1GiB", None, None, 0, None, live_run=True, hold="maybe")
    with pytest.raises(UmctlError, match="needs --budget"):
        ControlSpec("none", None, None, None, 0, None, live_run=True, hold="admit")
    with pytest.raises(UmctlError, match="runtime"):
        ControlSpec("none", "1GiB", None, None, 0, None, live_run=False, hold="admit")
    s = ControlSpec("none", "1GiB", None, None, 0, None, live_run=True)
    assert s.use_runtime_admission(True) and s.admission
    assert not ControlSpec("none", "1GiB", None, None, 0, None, live_run=True).use_runtime_admission(False)
    assert not ControlSpec("none", "1GiB", None, None, 0, None, live_run=True,
                           hold="evict").use_runtime_admission(True)
    with pytest.raises(UmctlError, match="--runtime"):
        ControlSpec("none", "1GiB", None, None, 0, None, live_run=True, hold="admit").use_runtime_admission(False)


def test_the_summary_says_how_the_budget_was_held():
    """`umctl run`'s summary names admission and its counts (report/live.py)."""
    from umctl.report.live import control_lines
    from umctl.results import ControlStats, _from_json

    _, lc, _, _ = drive("none", budget_blocks=12, steps=60, seed=0, delay=2, fit_steps=10)
    st = lc.stats()
    assert st["budget"]["hold"] == "admit"
    st["actuator"] = {"counts": dict.fromkeys(("ioctls", "ok", "failed", "target_gone", "superseded", "dropped"), 0),
                      "bytes": {}, "latency_ms": {}, "errors": {}}   # the stand-in driver keeps none
    text = "\n".join(t for t, _ in control_lines(_from_json(ControlStats, st)))
    assert f"admission    {st['budget']['admitted_blocks']:,} demanded blocks admitted" in text
    assert "budget check on: budget held" in text


def test_a_mode_without_budget_starts_before_the_program_registers_its_gpus(monkeypatch):
    """`umctl run --mode deepum` without --budget: when the loop starts, the program has not
    created its CUDA context, so the source knows no GPU yet. The machine's GPUs say how big it
    is (before: 'GPU memory size unknown (nvidia-smi gave none): pass --budget', measured on an
    H200 whose nvidia-smi answered)."""
    from types import SimpleNamespace

    from umctl import UmctlError
    from umctl.driver import process
    from umctl.live.spec import ControlSpec
    from test_live_control import FakeActuator

    monkeypatch.setattr(process, "nvidia_smi_gpus", lambda: [
        {"index": 0, "uuid": "GPU-aaa", "name": "H200", "memory_bytes": 141 << 30}])
    src = SimpleNamespace(gpus=[], pid=1, kinds=frozenset(), target_fd=-1)
    lc = ControlSpec("deepum", None, None, None, 0, None, live_run=True).start(src, SimpleNamespace(), FakeActuator())
    assert lc.ctl.ctx.gpu_mem == [141 << 30]
    src.gpus = [{"gpu": 0, "uuid": "GPU-AAA", "memory_bytes": None}]
    lc = ControlSpec("none", None, None, None, 0, None, live_run=True).start(src, None, FakeActuator())
    assert lc.ctl.ctx.gpu_mem == [141 << 30]
    monkeypatch.setattr(process, "nvidia_smi_gpus", lambda: [])
    with pytest.raises(UmctlError, match="GPU memory size unknown"):
        ControlSpec("none", None, None, None, 0, None, live_run=True).start(src, None, FakeActuator())
    # GPUs of two sizes, the program's not known to nvidia-smi (e.g. CUDA_VISIBLE_DEVICES), or a
    # MIG slice: no guess
    monkeypatch.setattr(process, "nvidia_smi_gpus", lambda: [
        {"index": 0, "uuid": "GPU-aaa", "name": "H200", "memory_bytes": 141 << 30},
        {"index": 1, "uuid": "GPU-bbb", "name": "L4", "memory_bytes": 24 << 30}])
    src.gpus = [{"gpu": 0, "uuid": "GPU-ccc", "memory_bytes": None}]
    with pytest.raises(UmctlError, match="GPU memory size unknown"):
        ControlSpec("none", None, None, None, 0, None, live_run=True).start(src, None, FakeActuator())
    src.gpus = [{"gpu": 0, "uuid": "GPU-bbb", "memory_bytes": None}]
    lc = ControlSpec("none", None, None, None, 0, None, live_run=True).start(src, None, FakeActuator())
    assert lc.ctl.ctx.gpu_mem == [24 << 30]
    monkeypatch.setattr(process, "nvidia_smi_gpus", lambda: [
        {"index": 0, "uuid": "GPU-aaa", "name": "H200", "memory_bytes": 141 << 30}])
    src.gpus = [{"gpu": 0, "uuid": "MIG-1234", "memory_bytes": None}]
    with pytest.raises(UmctlError, match="GPU memory size unknown"):
        ControlSpec("none", None, None, None, 0, None, live_run=True).start(src, None, FakeActuator())
