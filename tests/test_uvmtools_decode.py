"""Decoder: ring entries -> our event batches. Checked two ways: on synthetic entries built
field by field, and on real ring bytes captured once from driver 580.159.04 on an H200
(tests/data/uvm_ring_580.bin, see benchmarks/gpu/bench_live.py --capture), decoded independently
here with struct.unpack as the oracle."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from umctl.events.schema import DTYPES, KIND_CODES, Access, Cause, Kind
from umctl.driver import abi
from umctl.sources.uvmtools.decode import Decoder, default_processor_map
from test_uvmtools_source import entries

DATA = Path(__file__).parent / "data" / "uvm_ring_580.bin"


def test_entry_dtype_offsets_match_the_c_layout():
    f = abi.ENTRY_DTYPE.fields
    assert abi.ENTRY_DTYPE.itemsize == 72
    assert f["g_addr"][1] == 8 and f["g_batch"][1] == 32 and f["g_access"][1] == 37
    assert f["m_bytes"][1] == 24 and f["m_end_gpu"][1] == 64
    assert f["c_pid"][1] == 24 and f["c_pc"][1] == 32
    assert f["r_batch"][1] == 4 and f["r_ts"][1] == 8
    assert f["t_procs"][1] == 32


def test_every_kind_is_decoded_with_our_conventions():
    raw = entries(
        {"type": abi.EV_GPU_FAULT, "g_gpu": 1, "g_addr": 0x7000_0000_1000, "g_ts": 1000, "g_batch": 9,
         "g_access": 2, "g_fault_type": 2, "g_client_id": 17},
        {"type": abi.EV_GPU_FAULT, "g_gpu": 1, "g_addr": 0x7000_0000_2000, "g_ts": 1001, "g_batch": 9,
         "g_access": 3, "g_fault_type": 4, "g_client_id": 17},
        {"type": abi.EV_GPU_FAULT_REPLAY, "r_gpu": 1, "r_batch": 9, "r_ts": 1500},
        {"type": abi.EV_MIGRATION, "m_cause": abi.MIG_CAUSE_EVICTION, "m_src": 1, "m_dst": 0,
         "m_addr": 0x7000_0020_0000, "m_bytes": 2 << 20, "m_begin": 2000, "m_end": 2600},
        {"type": abi.EV_MIGRATION, "m_cause": abi.MIG_CAUSE_COHERENCE, "m_src": 0, "m_dst": 1,
         "m_addr": 0x7000_0000_0000, "m_bytes": 65536, "m_begin": 2100, "m_end": 2200},
        {"type": abi.EV_CPU_FAULT, "c_access": 1, "c_addr": 0x7000_0000_3000, "c_ts": 3000, "c_pid": 77,
         "c_tid": 78, "c_pc": 0x401000},
        {"type": abi.EV_THRASHING_DETECTED, "t_addr": 0x7000_0004_0000, "t_size": 4096, "t_ts": 4000,
         "t_procs": [0b11, 0, 0, 0, 0]},
        {"type": abi.EV_MAP_REMOTE},
    )
    dec = Decoder(pid=77)
    b = dec.decode(raw, clock_offset_ns=10_000, now_ns=99)
    for k, a in b.arrays.items():
        assert a.dtype == DTYPES[k]
    f = b[Kind.FAULT]
    assert f["t_ns"].tolist() == [11_000, 11_001] and f["gpu"].tolist() == [0, 0]
    assert f["access"].tolist() == [Access.WRITE, Access.ATOMIC] and f["batch_id"].tolist() == [9, 9]
    assert f["client"].tolist() == [17, 17] and (f["pid"] == 77).all()
    r = b[Kind.REPLAY]
    assert r[0]["nfaults"] == 2 and r[0]["t_start_ns"] == 11_000 and r[0]["t_ns"] == 11_500
    m = b[Kind.MIGRATION]
    assert m["cause"].tolist() == [Cause.EVICTION, Cause.DEMAND]
    assert m["src"].tolist() == [0, -1] and m["dst"].tolist() == [-1, 0]
    assert m["t_end_ns"].tolist() == [12_600, 12_200] and (m["exec_id"] == -1).all()
    c = b[Kind.CPU_FAULT]
    assert (c["pid"][0], c["tid"][0], c["pc"][0], c["access"][0]) == (77, 78, 0x401000, Access.READ)
    t = b[Kind.THRASHING]
    assert t["gpu"].tolist() == [0] and t["bytes"].tolist() == [4096] and t["t_ns"].tolist() == [14_000]
    assert dec.unknown == {abi.EV_MAP_REMOTE: 1}


def test_a_batch_split_across_drains_gets_its_full_count():
    dec = Decoder(pid=1)
    first = entries(*[{"type": 3, "g_gpu": 1, "g_batch": 5, "g_ts": 100 + i} for i in range(3)])
    second = entries(*[{"type": 3, "g_gpu": 1, "g_batch": 5, "g_ts": 200 + i} for i in range(2)],
                     {"type": 3, "g_gpu": 1, "g_batch": 6, "g_ts": 300},
                     {"type": 4, "r_gpu": 1, "r_batch": 5, "r_ts": 250})
    assert len(dec.decode(first)[Kind.REPLAY]) == 0
    r = dec.decode(second)[Kind.REPLAY]
    assert r["nfaults"].tolist() == [5] and r["t_start_ns"].tolist() == [100]
    assert dec.pending_batches == 1  # batch 6 waits for its replay
    r6 = dec.decode(entries({"type": 4, "r_gpu": 1, "r_batch": 6, "r_ts": 400}))[Kind.REPLAY]
    assert r6["nfaults"].tolist() == [1] and dec.pending_batches == 0


def test_drops_are_reported_as_increments_per_kind():
    dec = Decoder(pid=1)
    d = np.zeros(64, dtype=np.uint64)
    d[abi.EV_GPU_FAULT] = 10
    d[abi.EV_MIGRATION] = 2
    out = dec.decode(entries(), dropped=d, now_ns=5)[Kind.DROPS]
    got = {int(k): int(c) for k, c in zip(out["kind_code"] if "kind_code" in out.dtype.names else out["kind"], out["count"])}
    assert got == {KIND_CODES[Kind.FAULT]: 10, KIND_CODES[Kind.MIGRATION]: 2}
    d[abi.EV_GPU_FAULT] = 15
    out = dec.decode(entries(), dropped=d)[Kind.DROPS]
    assert out["count"].tolist() == [5]
    assert len(dec.decode(entries(), dropped=d)[Kind.DROPS]) == 0


def test_unknown_processor_triggers_a_table_refresh_then_falls_back():
    empty_map = np.full(abi.UVM_ID_MAX_PROCESSORS, -2, dtype=np.int16)
    empty_map[0] = -1
    fresh = empty_map.copy()
    fresh[1] = 3
    calls = []

    def refresh():
        calls.append(1)
        return fresh if len(calls) == 1 else None

    dec = Decoder(pid=1, processor_map=empty_map, refresh=refresh)
    f = dec.decode(entries({"type": 3, "g_gpu": 1}))[Kind.FAULT]
    assert f["gpu"].tolist() == [3] and len(calls) == 1
    f = dec.decode(entries({"type": 3, "g_gpu": 2}))[Kind.FAULT]  # still unknown: UVM id order
    assert f["gpu"].tolist() == [1]
    assert default_processor_map()[0] == -1 and default_processor_map()[1] == 0


# -- real bytes ------------------------------------------------------------------------------

needs_capture = pytest.mark.skipif(not DATA.exists(), reason="no captured ring bytes")


def _oracle(raw: bytes) -> list[tuple]:
    """Independent struct.unpack decoding of each 72-byte entry (layouts from uvm_types.h)."""
    out = []
    for off in range(0, len(raw), 72):
        e = raw[off:off + 72]
        t = e[0]
        if t == 3:
            ft, gi, gpc, cl, addr, ts, tsg, batch, ctype, acc = struct.unpack_from("<xBHHHQQQIBB", e)
            out.append(("fault", gi, addr, ts, batch, acc, ft))
        elif t == 4:
            ctype, gi, batch, ts, tsg = struct.unpack_from("<xBHIQQ", e)
            out.append(("replay", gi, batch, ts))
        elif t == 2:
            cause, src, dst, snid, dnid, addr, nbytes, bts, ets = struct.unpack_from("<xBxxHHiiQQQQ", e)
            out.append(("migration", cause, src, dst, addr, nbytes, bts, ets))
        elif t == 1:
            acc, cpu, addr, ts, pid, tid, pc = struct.unpack_from("<xBxxIQQIIQ", e)
            out.append(("cpu_fault", acc, addr, ts, pid, tid, pc))
        elif t == 10:
            addr, size, ts = struct.unpack_from("<8xQQQ", e)
            out.append(("thrashing", addr, size, ts))
    return out


@needs_capture
def test_recorded_ring_bytes_decode_like_the_oracle():
    raw = DATA.read_bytes()
    meta = json.loads(Path(str(DATA) + ".json").read_text())
    assert len(raw) == 72 * meta["entries"]
    dec = Decoder(pid=meta["pid"])
    b = dec.decode(np.frombuffer(raw, dtype=np.uint8))
    ref = _oracle(raw)
    rf = [r for r in ref if r[0] == "fault"]
    f = b[Kind.FAULT]
    assert len(f) == len(rf) > 0
    assert f["addr"].tolist() == [r[2] for r in rf]
    assert f["t_ns"].tolist() == [r[3] for r in rf]
    assert f["batch_id"].tolist() == [r[4] for r in rf]
    assert f["access"].tolist() == [r[5] - 1 for r in rf]
    assert f["gpu"].tolist() == [r[1] - 1 for r in rf]
    # the real facts of that run: every GPU fault is inside the managed buffers the workload
    # allocated (the sweep buffer, and the 4 MiB thrash buffer right after it in VA)
    lo = meta["base"]
    assert ((f["addr"] >= lo) & (f["addr"] < lo + meta["nbytes"] + (64 << 20))).mean() > 0.99
    rm = [r for r in ref if r[0] == "migration"]
    m = b[Kind.MIGRATION]
    assert len(m) == len(rm) > 0
    assert m["bytes"].tolist() == [r[5] for r in rm]
    lut = {1: Cause.USER, 2: Cause.DEMAND, 3: Cause.DRIVER_PREFETCH, 4: Cause.EVICTION, 5: Cause.ACCESS_COUNTER}
    assert m["cause"].tolist() == [lut[r[1]] for r in rm]
    assert m["src"].tolist() == [-1 if r[2] == 0 else r[2] - 1 for r in rm]
    assert (m["t_end_ns"] >= m["t_ns"]).all()
    assert ((m["bytes"] > 0) & (m["bytes"] <= 2 << 20)).all()
    rc = [r for r in ref if r[0] == "cpu_fault"]
    c = b[Kind.CPU_FAULT]
    assert len(c) == len(rc) > 0 and (c["pid"] == meta["pid"]).all()
    assert c["addr"].tolist() == [r[2] for r in rc]
    rr = [r for r in ref if r[0] == "replay"]
    assert b[Kind.REPLAY]["batch_id"].tolist() == [r[2] for r in rr]
    assert len(b[Kind.THRASHING]) == len([r for r in ref if r[0] == "thrashing"])
