"""The launch queue in the simulator and mode ``deepum-launch`` (issue 38 §4).

The workload here is a mixture-of-experts training loop built by hand (``moe_workload``): per
layer a dense kernel, a router, a SYNC for the host's read of the routing (``.tolist()``), the
top-2 of 8 experts (each reading its own weight buffer), redrawn every iteration with a seeded
RNG; a backward pass and an Adam step touching only the chosen experts.
"""

from __future__ import annotations

import numpy as np
import pytest

from umctl import UmctlError
from umctl.controller import make_controller
from umctl.controller.base import Controller
from umctl.controller.launch import DeepUMLaunchController
from umctl.controller.options import parse_mode_options
from umctl.events.schema import Access, AllocOp, EventBatch, Kind, Op
from umctl.sim.engine import Simulator, simulate
from umctl.units import BLOCK_SHIFT, MiB, PAGE_SIZE
from umctl.workload.workload import Init, OpType, WorkloadBuilder


def moe_workload(*, layers: int = 2, experts: int = 8, top_k: int = 2, iters: int = 4, expert_mib: int = 4,
                 dense_mib: int = 2, act_mib: int = 2, gpu_mib: int = 96, us_per_mib: float = 40.0, seed: int = 0):
    """A MoE training loop (module doc). Compute is ``us_per_mib`` µs per MiB a kernel's main
    operand holds; activations and gradients are allocator blocks handed out each step and
    given back after it (PyTorch's caching allocator, ``zero_grad(set_to_none=True)``).
    ``meta["chosen"][it][layer]`` is the routing."""
    b = WorkloadBuilder("moe-test", gpu_mem=gpu_mib * MiB)

    def ns(mib: float, f: float = 1.0) -> int:
        return int(mib * us_per_mib * 1000 * f)

    L = []
    for l in range(layers):
        L.append(dict(
            wd=b.alloc(f"l{l}.attn.w", dense_mib * MiB, init=Init.HOST), gd=b.alloc(f"l{l}.attn.g", dense_mib * MiB),
            md=b.alloc(f"l{l}.attn.m", dense_mib * MiB), vd=b.alloc(f"l{l}.attn.v", dense_mib * MiB),
            wr=b.alloc(f"l{l}.router.w", MiB // 2, init=Init.HOST), gr=b.alloc(f"l{l}.router.g", MiB // 2),
            x=b.alloc(f"l{l}.x", act_mib * MiB), h=b.alloc(f"l{l}.h", act_mib * MiB),
            logits=b.alloc(f"l{l}.logits", 64 << 10),
            y=[b.alloc(f"l{l}.y{k}", act_mib * MiB) for k in range(top_k)],
            dy=[b.alloc(f"l{l}.dy{k}", act_mib * MiB) for k in range(top_k)], dh=b.alloc(f"l{l}.dh", act_mib * MiB),
            we=[b.alloc(f"l{l}.e{e}.w", expert_mib * MiB, init=Init.HOST) for e in range(experts)],
            ge=[b.alloc(f"l{l}.e{e}.g", expert_mib * MiB) for e in range(experts)],
            me=[b.alloc(f"l{l}.e{e}.m", expert_mib * MiB) for e in range(experts)],
            ve=[b.alloc(f"l{l}.e{e}.v", expert_mib * MiB) for e in range(experts)],
        ))
    out, dout = b.alloc("out", act_mib * MiB), b.alloc("dout", act_mib * MiB)
    rng = np.random.default_rng(seed)
    routing = []

    def transient(l: int, chosen: list[int]) -> list:
        d = L[l]
        return [d["h"], d["logits"], *d["y"], *d["dy"], d["dh"], d["gd"], d["gr"], *(d["ge"][e] for e in chosen)]

    for it in range(iters):
        b.iteration = it
        chosen = [sorted(rng.choice(experts, top_k, replace=False).tolist()) for _ in range(layers)]
        routing.append(chosen)
        for l in range(layers):
            for buf in transient(l, chosen[l]):
                b.mem(AllocOp.BLOCK_ACTIVE, buf)
        for l, d in enumerate(L):
            nxt = L[l + 1]["x"] if l + 1 < layers else out
            b.kernel("attn_fwd", reads=[d["x"], d["wd"]], writes=[d["h"]], compute_ns=ns(dense_mib, 2),
                     args=(d["x"].addr, d["wd"].addr, d["h"].addr))
            b.kernel("router_fwd", reads=[d["h"], d["wr"]], writes=[d["logits"]], compute_ns=ns(1),
                     args=(d["h"].addr, d["wr"].addr))
            b.sync(0)   # the host reads the routing before it can launch the experts
            for k, e in enumerate(chosen[l]):
                b.kernel("expert_fwd", reads=[d["h"], d["we"][e]], writes=[d["y"][k]], compute_ns=ns(expert_mib, 2),
                         args=(d["h"].addr, d["we"][e].addr, d["y"][k].addr))
            b.kernel("combine_fwd", reads=d["y"], writes=[nxt], compute_ns=ns(act_mib), args=(l,))
        b.kernel("loss", reads=[out], writes=[dout], compute_ns=ns(act_mib), args=())
        for l in reversed(range(layers)):
            d = L[l]
            dnext = L[l + 1]["x"] if l + 1 < layers else dout
            b.kernel("combine_bwd", reads=[dnext], writes=d["dy"], compute_ns=ns(act_mib), args=(l,))
            for k, e in enumerate(chosen[l]):
                b.kernel("expert_bwd", reads=[d["dy"][k], d["h"], d["we"][e]], writes=[d["ge"][e], d["dh"]],
                         compute_ns=ns(expert_mib, 4), args=(d["we"][e].addr, d["ge"][e].addr))
            b.kernel("router_bwd", reads=[d["dh"], d["wr"]], writes=[d["gr"]], compute_ns=ns(1), args=(l,))
            b.kernel("attn_bwd", reads=[d["dh"], d["x"], d["wd"]], writes=[d["gd"], d["x"]],
                     compute_ns=ns(dense_mib, 4), args=(d["wd"].addr,))
        for l, d in enumerate(L):
            b.kernel("adam", reads=[d["wd"], d["gd"], d["md"], d["vd"]], writes=[d["wd"], d["md"], d["vd"]],
                     compute_ns=ns(dense_mib), args=(d["wd"].addr,))
            for e in chosen[l]:
                b.kernel("adam", reads=[d["we"][e], d["ge"][e], d["me"][e], d["ve"][e]],
                         writes=[d["we"][e], d["me"][e], d["ve"][e]], compute_ns=ns(expert_mib),
                         args=(d["we"][e].addr,))
        for l in range(layers):
            for buf in transient(l, chosen[l]):
                b.mem(AllocOp.BLOCK_INACTIVE, buf)
        b.sync(0)   # loss.item()
    w = b.build(meta={"chosen": routing})
    return w


@pytest.fixture(scope="module")
def moe():
    return moe_workload()


class Listener(Controller):
    """Hears launches (start and issue) and nothing else; keeps every batch's (now, records)."""

    name = "listener"
    subscribes = frozenset({Kind.LAUNCH, Kind.LAUNCH_ARGS})

    def __init__(self, **options):
        super().__init__(**options)
        self.args: list[tuple[int, np.ndarray]] = []
        self.starts: list[tuple[int, np.ndarray]] = []

    def on_events(self, batch: EventBatch):
        if Kind.LAUNCH_ARGS in batch:
            self.args.append((batch.now_ns, batch[Kind.LAUNCH_ARGS].copy()))
        if Kind.LAUNCH in batch:
            self.starts.append((batch.now_ns, batch[Kind.LAUNCH].copy()))
        return None


def listen(w, q, drain_ns=1):
    ctl = Listener()
    r = Simulator(w, ctl, launch_queue=q, drain_ns=drain_ns).run()
    args = np.concatenate([a for _, a in ctl.args])
    heard = np.concatenate([np.full(len(a), t, np.int64) for t, a in ctl.args])
    return r, args, heard


def kernel_ops(w) -> np.ndarray:
    return np.flatnonzero(w.ops["type"] == OpType.KERNEL)


def after_sync(w) -> dict[int, int]:
    """Kernel op -> index of the last SYNC before it (-1: none)."""
    last, out = -1, {}
    for i, t in enumerate(w.ops["type"].tolist()):
        if t == OpType.SYNC:
            last = i
        elif t == OpType.KERNEL:
            out[i] = last
    return out


# ---------------------------------------------------------------------- default: unchanged
#: time_ns of shipped scenarios' replays recorded before the launch queue existed (DeepUM's since
#: its first iteration completes no block: umctl/controller/deepum.py, *Whole faulted blocks*;
#: all but ``none`` and gpt2-l's oracle re-recorded since the simulator waits for write-backs,
#: tests/test_bound_writeback.py: +0.08 % gpt2-l deepum; bert-base deepum +1.25 %, deepum-prefetch
#: +0.07 %, deepum-preevict +1.18 %, pre-ef-host +1.23 %, oracle +1.38 %)
#: (``umctl replay gpt2-l -m none,deepum,oracle --json``, ``umctl replay bert-base -m all --json``)
BEFORE = {
    "gpt2-l": {"none": 849270042, "deepum": 429868633, "oracle": 200985109},
    "bert-base": {"none": 881826750, "deepum": 465397304, "deepum-prefetch": 542288427,
                  "deepum-preevict": 537741704, "pre-ef-host": 381657448, "oracle": 245420108},
}


@pytest.mark.parametrize("target,mode", [(t, m) for t, ms in BEFORE.items() for m in ms])
def test_default_replays_unchanged(target, mode):
    from umctl.workload.target import resolve_target

    w = resolve_target(target)
    assert simulate(w, make_controller(mode)).time_ns == BEFORE[target][mode]


def test_no_queue_means_kernel_start(moe):
    """Off (None) and Q = 0 hear each launch at its kernel's start: no lookahead."""
    for q in (None, 0):
        r, args, heard = listen(moe, q)
        kops = kernel_ops(moe)
        start = dict(zip(kops.tolist(), r.kernel_start_ns.tolist()))
        assert np.array_equal(args["t_ns"], [start[s] for s in args["seq"].tolist()])
        assert (heard >= args["t_ns"]).all()


@pytest.fixture(scope="module")
def moe_big():
    """Four layers of 8 MiB experts on a 256 MiB GPU: DeepUM pre-evicts here (on ``moe`` its
    next 32 kernels expect every resident block, so it has no victim and prefetches nothing)."""
    return moe_workload(layers=4, expert_mib=8, dense_mib=4, gpu_mib=256, iters=5)


@pytest.mark.parametrize("q", [None, 0])
@pytest.mark.parametrize("which", ["moe", "moe_big"])
def test_no_lookahead_is_deepum(request, which, q):
    """Without lookahead the mode is DeepUM, to the fault and the byte."""
    w = request.getfixturevalue(which)
    a = simulate(w, make_controller("deepum"), launch_queue=q)
    b = simulate(w, make_controller("deepum-launch"), launch_queue=q)
    if which == "moe_big":
        assert a.preevictions > 0
    for f in ("time_ns", "faults", "bytes_h2d", "bytes_d2h", "commands", "preevictions", "prefetch_pages"):
        assert getattr(a, f) == getattr(b, f), f
    assert a.fault_causes == b.fault_causes
    assert b.controller["launch_offered_blocks"] == 0


def test_queue_is_host_timing_only(moe):
    """The queue changes when launches are heard and when the host waits, never what a
    controller that does not listen sees: DeepUM's replay is the same at any Q here (no host
    work between kernels for the wait to delay)."""
    base = simulate(moe, make_controller("deepum")).time_ns
    for q in (0, 8, 1024):
        assert simulate(moe, make_controller("deepum"), launch_queue=q).time_ns == base


# ---------------------------------------------------------------------- the queue
def test_launches_heard_before_their_kernel(moe):
    q = 8
    r, args, heard = listen(moe, q)
    kops = kernel_ops(moe)
    start = dict(zip(kops.tolist(), r.kernel_start_ns.tolist()))
    sync = after_sync(moe)
    pos = {int(i): k for k, i in enumerate(kops)}
    first = {}
    for s, t, h in zip(args["seq"].tolist(), args["t_ns"].tolist(), heard.tolist()):
        first.setdefault(s, (t, h))
    assert set(first) == set(start)           # every launch heard, a bare one too
    ahead = 0
    for s, (t, h) in first.items():
        assert t <= start[s] and h <= max(start[s], t)
        # a launch with a kernel before it since the last sync is issued while that one runs
        prev = kops[pos[s] - 1] if pos[s] else -1
        if prev > sync[s]:
            assert t < start[s] and h < start[s], s
            ahead += 1
    assert ahead > len(first) // 2


def test_queue_depth_bounds_the_lookahead(moe):
    """At most Q launches are issued and not started: launch k waits for kernel k - Q."""
    for q in (1, 4):
        r, args, _ = listen(moe, q)
        kops = kernel_ops(moe)
        t_issue = dict(zip(args["seq"].tolist(), args["t_ns"].tolist()))
        issue = np.array([t_issue[int(i)] for i in kops])
        assert (issue[q:] >= r.kernel_start_ns[:-q]).all()
        assert (issue[q:] == r.kernel_start_ns[:-q]).mean() > 0.5   # mostly the wait itself


def test_sync_drains_the_queue(moe):
    """No launch after a SYNC is issued (or heard) before the SYNC completes: every kernel
    before it has ended."""
    r, args, heard = listen(moe, 1024)
    kops = kernel_ops(moe)
    end = dict(zip(kops.tolist(), r.kernel_end_ns.tolist()))
    sync = after_sync(moe)
    checked = 0
    for s, t, h in zip(args["seq"].tolist(), args["t_ns"].tolist(), heard.tolist()):
        if sync[s] < 0:
            continue
        done = max(e for k, e in end.items() if k < sync[s])
        assert t >= done and h >= done, s
        checked += 1
    assert checked


def test_launch_names_its_tensors(moe):
    """An expert's launch names exactly its input, its expert's weights and its output."""
    _, args, _ = listen(moe, 8)
    a = moe.allocations
    by_name = {moe.names[n]: (int(ad), int(nb)) for n, ad, nb in zip(a["name_id"], a["addr"], a["bytes"])}
    ops = moe.ops
    chosen = moe.meta["chosen"]
    it_of = ops["iteration"]
    seen = 0
    for s in np.unique(args["seq"]).tolist():
        if moe.names[int(ops["name_id"][s])] != "expert_fwd":
            continue
        it = int(it_of[s])
        rec = args[args["seq"] == s]
        got = [(int(x), int(n), int(acc)) for x, n, acc in zip(rec["addr"], rec["bytes"], rec["access"])]
        # which expert and slot: the weight range tells
        w_addr = got[1][0]
        layer, e = next((l, e) for l in range(2) for e in chosen[it][l] if by_name[f"l{l}.e{e}.w"][0] == w_addr)
        k = chosen[it][layer].index(e)
        want = [(*by_name[f"l{layer}.h"], Access.READ), (*by_name[f"l{layer}.e{e}.w"], Access.READ),
                (*by_name[f"l{layer}.y{k}"], Access.WRITE)]
        assert got == want
        seen += 1
    assert seen == 4 * 2 * 2


def test_gather_names_one_range():
    """A kernel touching one allocation in many pieces gathers from one tensor: one range."""
    b = WorkloadBuilder("gather", gpu_mem=64 * MiB)
    table = b.alloc("table", 8 * MiB, init=Init.HOST)
    outb = b.alloc("out", MiB)
    rows = np.arange(0, 2048, 97) + (table.addr >> 12)
    b.kernel("gather", pages=[(rows, False)], writes=[outb], compute_ns=1000)
    b.kernel("dense", reads=[table.slice(0, 3 * PAGE_SIZE), table.slice(10 * PAGE_SIZE, PAGE_SIZE)], compute_ns=1000)
    w = b.build()
    _, args, _ = listen(w, 4)
    g = args[args["seq"] == 0]
    assert [(int(x), int(n)) for x, n in zip(g["addr"], g["bytes"])] == [   # the builder's order: writes, pages
        (outb.addr, outb.nbytes), (int(rows[0]) << 12, int(rows[-1] - rows[0] + 1) << 12)]
    d = args[args["seq"] == 1]
    assert [(int(x), int(n)) for x, n in zip(d["addr"], d["bytes"])] == [
        (table.addr, 3 * PAGE_SIZE), (table.addr + 10 * PAGE_SIZE, PAGE_SIZE)]


# ---------------------------------------------------------------------- the mode
class Watched(DeepUMLaunchController):
    """deepum-launch, keeping what it heard and what it commanded, per step."""

    def attach(self, ctx):
        super().attach(ctx)
        self.log: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []

    def on_events(self, batch):
        out = super().on_events(batch)
        self.log.append((batch.now_ns, batch[Kind.LAUNCH_ARGS].copy(), batch[Kind.LAUNCH].copy(),
                         out.copy() if out is not None else None))
        return out


def test_mode_prefetches_chosen_experts_and_spares_queued_blocks(moe):
    ctl = Watched()
    r = Simulator(moe, ctl, launch_queue=4).run()
    kops = kernel_ops(moe)
    start = dict(zip(kops.tolist(), r.kernel_start_ns.tolist()))
    queued: dict[int, set[int]] = {}      # seq -> blocks, heard while its kernel had not started
    running = -1
    prefetched: dict[int, list[int]] = {}  # block -> when prefetches covering it were asked for
    for now, la, starts, out in ctl.log:
        for s in np.unique(la["seq"]).tolist():
            rec = la[(la["seq"] == s) & (la["bytes"] > 0)]
            queued[s] = {b for x, n in zip(rec["addr"].tolist(), rec["bytes"].tolist())
                         for b in range(x >> BLOCK_SHIFT, ((x + n - 1) >> BLOCK_SHIFT) + 1)}
        if len(starts):
            running = max(running, int(starts["seq"].max()))
        if out is None:
            continue
        # the queued launches the GPU can hold with the running kernel are never pre-evicted
        live = {s: bl for s, bl in queued.items() if s >= running}
        named = set().union(*live.values()) if live else set()
        pre = out[out["op"] == Op.PREEVICT]
        if len(named) <= ctl.capacity[0] - ctl.watermark:
            assert not ({int(x) >> BLOCK_SHIFT for x in pre["addr"]} & named), now
        for c in out[out["op"] == Op.PREFETCH]:
            x, n = int(c["addr"]), int(c["bytes"])
            for b in range(x >> BLOCK_SHIFT, ((x + n - 1) >> BLOCK_SHIFT) + 1):
                prefetched.setdefault(b, []).append(now)
    # the second expert of every layer (its launch is queued behind the first's): its weights
    # are asked for before it starts, and it hardly faults, where DeepUM's faults there are many
    names = [moe.names[int(i)] for i in moe.ops["name_id"]]
    second = [i for k, i in enumerate(kops.tolist()) if k and names[i] == "expert_fwd" and
              names[kops[k - 1]] == "expert_fwd" and moe.ops["iteration"][i] > 0]
    asked = 0
    for i in second:
        rec = next(la[la["seq"] == i] for _, la, _, _ in ctl.log if (la["seq"] == i).any())
        wb = int(rec["addr"][1]) >> BLOCK_SHIFT     # the expert's weights: the launch's 2nd range
        asked += any(t < start[i] for t in prefetched.get(wb, []))
    assert asked >= 0.75 * len(second)
    d = simulate(moe, make_controller("deepum"), launch_queue=4)
    pos = {int(i): k for k, i in enumerate(kops)}
    mine = sum(int(r.kernel_faults[pos[i]]) for i in second)
    theirs = sum(int(d.kernel_faults[pos[i]]) for i in second)
    assert mine < theirs / 4
    assert r.controller["launch_offered_blocks"] > 0


def test_mode_beats_deepum_on_moe(moe):
    """With lookahead the mode knows the experts DeepUM cannot predict: most of the way to the
    oracle, and no worse with a deeper queue."""
    none = simulate(moe, make_controller("none"), launch_queue=64).time_ns
    deepum = simulate(moe, make_controller("deepum"), launch_queue=64)
    oracle = simulate(moe, make_controller("oracle"), launch_queue=64).time_ns
    times = {}
    for q in (4, 64):
        r = simulate(moe, make_controller("deepum-launch"), launch_queue=q)
        times[q] = r.time_ns
        assert r.faults < deepum.faults / 4
    assert times[64] <= times[4]
    assert (none - times[64]) >= 0.85 * (none - oracle)
    assert times[64] < 0.5 * deepum.time_ns


# ---------------------------------------------------------------------- options
def test_launch_queue_option():
    out = parse_mode_options(["launch_queue=8"], ["none", "deepum-launch"])
    assert out == {"none": {"launch_queue": 8}, "deepum-launch": {"launch_queue": 8}}
    assert parse_mode_options(["deepum.launch_queue=0"], ["none", "deepum"])["deepum"] == {"launch_queue": 0}
    for bad in ("launch_queue=-1", "launch_queue=x", "launch_queue=2000000"):
        with pytest.raises(UmctlError, match="launch_queue"):
            parse_mode_options([bad], ["none"])
    with pytest.raises(UmctlError, match="harvest"):
        parse_mode_options(["harvest.launch_queue=8"], ["none", "harvest"])
    # its controller cannot carry it: where no mode is named, the others still get it
    assert parse_mode_options(["launch_queue=8"], ["none", "harvest"]) == {"none": {"launch_queue": 8}, "harvest": {}}
    # the mode's DeepUM options are its own
    assert parse_mode_options(["deepum-launch.degree=8"], ["deepum-launch"]) == {"deepum-launch": {"degree": 8}}


def test_launch_queue_reaches_the_simulator(moe):
    a = simulate(moe, make_controller("deepum-launch", launch_queue=4))
    b = simulate(moe, make_controller("deepum-launch"), launch_queue=4)
    assert a.time_ns == b.time_ns and a.faults == b.faults
    with pytest.raises(ValueError, match="launch_queue"):
        Simulator(moe, make_controller("none"), launch_queue=-1)


def test_the_queue_stays_in_launch_order_when_records_arrive_out_of_order():
    """A launch issued after a kernel started is delivered after records emitted at once, so a
    batch can list later launches first (host work between launches, Q = 2): the mode's queue,
    which its window and walk follow, must still be in launch order."""
    from umctl.controller.launch import DeepUMLaunchController
    from umctl.sim.engine import Simulator
    from umctl.units import MiB
    from umctl.workload.workload import Init, WorkloadBuilder

    b = WorkloadBuilder("q", gpu_mem=64 * MiB)
    bufs = [b.alloc(f"b{k}", 2 * MiB, init=Init.HOST) for k in range(8)]
    for k in range(8):
        b.kernel("k", reads=[bufs[k]], writes=[], compute_ns=100_000, args=(k,))
        b.host(30_000)
    orders: list[list[int]] = []
    arrivals: list[list[int]] = []

    class Spy(DeepUMLaunchController):
        name = "spy-launch"

        def _enqueue(self, a):
            arrivals.append(a["seq"].tolist())
            super()._enqueue(a)
            orders.append(list(self._queue))

    Simulator(b.build(), Spy(), launch_queue=2).run()
    assert any(x != sorted(x) for x in arrivals)          # the records did come out of order
    assert orders and all(o == sorted(o) for o in orders)


def test_queued_launches_do_not_hide_novel_ones_from_deepums_completion_rule():
    """deepum-launch numbers a queued launch's execution ID before its kernel starts; DeepUM's
    novel-launch rule (no whole-block completion for a repeating kernel's unseen arguments) must
    judge by launches that ran, so it sees the same novel launches with or without a queue."""
    from umctl.controller.deepum import DeepUMController

    w = moe_workload(iters=6)

    def novel_count(ctl_cls, q):
        seen = []

        class Spy(ctl_cls):
            name = f"spy-{ctl_cls.name}"

            def _launch(self, ev):
                super()._launch(ev)
                seen.append(self._novel)

        Simulator(w, Spy(), launch_queue=q).run()
        return sum(seen)

    base = novel_count(DeepUMController, None)
    assert base > 0
    assert novel_count(DeepUMLaunchController, 8) == base


def test_fault_in_a_queued_launch_completes_only_what_it_names():
    """launch.py, the fault rule: where experts share 2 MiB blocks (packed as a module packs its
    parameters), a fault in a kernel whose launch was heard queued completes the pieces that
    launch names, not the whole block, whose rest is experts the router did not choose. Against
    DeepUM's whole-block completion in the same mode: fewer bytes both ways and faster at a
    shallow queue; before the program loops (one iteration) nothing changes."""
    from test_deepum_adaptive import packed_moe

    from umctl.controller.deepum import DeepUMController

    class WholeBlocks(DeepUMLaunchController):
        name = "deepum-launch-whole-blocks"
        _fault = DeepUMController._fault   # the rule off: DeepUM's completion

    w = packed_moe(iters=3)
    new = simulate(w, make_controller("deepum-launch"), launch_queue=8)
    old = simulate(w, WholeBlocks(), launch_queue=8)
    assert new.controller["launch_fault_pieces"] > 0
    assert new.bytes_h2d < 0.8 * old.bytes_h2d and new.bytes_d2h < 0.9 * old.bytes_d2h
    assert new.time_ns < old.time_ns
    one = packed_moe(iters=1)
    a, b = simulate(one, make_controller("deepum-launch"), launch_queue=8), simulate(one, WholeBlocks(), launch_queue=8)
    assert (a.time_ns, a.bytes_h2d, a.commands) == (b.time_ns, b.bytes_h2d, b.commands)
    assert a.controller["launch_fault_pieces"] == 0
