"""The ``kmod`` actuator's side of the umctl genetlink protocol, without the module (the module
itself runs in the VM test bed, tests/vm/): the hand-packed request equals pyroute2's encoding,
the constants match kmod/umctl/umctl_genl.h, results and refusals parse into RESULT records, and
a host without the module gets a one-line error saying to load it."""

from __future__ import annotations

import errno
import re
import struct
from pathlib import Path

import numpy as np
import pytest

from umctl import UmctlError
from umctl.actuators import kmod
from umctl.events.schema import Op, Status, commands

HDR = (Path(__file__).resolve().parents[1] / "kmod" / "umctl" / "umctl_genl.h").read_text()
pyroute2 = pytest.importorskip("pyroute2")


def _enum(name: str) -> list[str]:
    body = re.search(rf"enum {name} \{{(.*?)\}};", HDR, re.S).group(1)
    return re.findall(r"^\s*(UMCTL_\w+)", body, re.M)


def test_constants_match_the_module_header():
    attrs = _enum("umctl_attr")
    assert attrs.index("UMCTL_A_PID") == kmod.A_PID and attrs.index("UMCTL_A_CMD_ID") == kmod.A_CMD_ID
    assert attrs.index("UMCTL_A_STATUS") == kmod.A_STATUS and attrs.index("UMCTL_A_PAD") == kmod.A_PAD
    cmds = _enum("umctl_cmd")
    assert [cmds.index(f"UMCTL_CMD_{n}") for n in ("PREFETCH", "PREEVICT", "INVALIDATE", "RESULT")] == \
        [kmod.CMD_PREFETCH, kmod.CMD_PREEVICT, kmod.CMD_INVALIDATE, kmod.CMD_RESULT]
    names = [n for n, _ in kmod._umctl_msg_class().nla_map]
    assert names == attrs[:len(names)]
    for st in ("OK", "FAILED", "TARGET_GONE", "RANGE_INVALID", "SKIPPED"):
        assert re.search(rf"UMCTL_ST_{st} = (\d+)", HDR).group(1) == str(int(Status[st]))


def test_request_encoding_equals_pyroute2():
    msg = kmod._umctl_msg_class()()
    msg["cmd"], msg["version"] = kmod.CMD_PREFETCH, 1
    msg["attrs"] = [("UMCTL_A_PID", 4242), ("UMCTL_A_ADDR", 0x7F1234560000), ("UMCTL_A_LEN", 2 << 20),
                    ("UMCTL_A_DST", -1), ("UMCTL_A_EXEC_ID", -5), ("UMCTL_A_CMD_ID", 77)]
    msg["header"]["type"], msg["header"]["flags"], msg["header"]["sequence_number"] = 30, kmod.NLM_F_REQUEST, 77
    msg["header"]["pid"] = 0
    msg.encode()
    ours = kmod.encode(30, kmod.CMD_PREFETCH, 77, 4242, 0x7F1234560000, 2 << 20, -1, -5, 77)
    assert ours == bytes(msg.data) and len(ours) == kmod.REQ_LEN


def test_request_with_destination_uuid_equals_pyroute2():
    uuid = kmod.parse_uuid("GPU-75766d5f-7369-6d20-4750-553000000001")
    assert uuid == bytes.fromhex("75766d5f73696d204750553000000001")
    msg = kmod._umctl_msg_class()()
    msg["cmd"], msg["version"] = kmod.CMD_PREFETCH, 1
    msg["attrs"] = [("UMCTL_A_PID", 4242), ("UMCTL_A_ADDR", 0x7F1234560000), ("UMCTL_A_LEN", 2 << 20),
                    ("UMCTL_A_DST", 0), ("UMCTL_A_EXEC_ID", -5), ("UMCTL_A_CMD_ID", 77), ("UMCTL_A_DST_UUID", uuid)]
    msg["header"]["type"], msg["header"]["flags"], msg["header"]["sequence_number"] = 30, kmod.NLM_F_REQUEST, 77
    msg["header"]["pid"] = 0
    msg.encode()
    ours = kmod.encode(30, kmod.CMD_PREFETCH, 77, 4242, 0x7F1234560000, 2 << 20, 0, -5, 77, uuid)
    assert ours == bytes(msg.data) and len(ours) == kmod.REQ_LEN + kmod.UUID_LEN


def test_uuid_sent_only_for_known_gpus_and_migrations():
    a = kmod.KmodActuator(family=999, start=False, gpu_uuids={0: bytes(range(16))})
    sent: list[bytes] = []
    a.sock.close()
    a.sock = type("S", (), {"send": lambda self, m: sent.append(m), "close": lambda self: None})()
    try:
        a.submit(np.concatenate([commands(Op.PREFETCH, 0x200000, 2 << 20, dst=0, pid=1),
                                 commands(Op.PREFETCH, 0x200000, 2 << 20, dst=1, pid=1),
                                 commands(Op.PREEVICT, 0x200000, 2 << 20, dst=-1, pid=1),
                                 commands(Op.INVALIDATE, 0x200000, 2 << 20, pid=1)]))
        assert [len(m) for m in sent] == [kmod.REQ_LEN + kmod.UUID_LEN] + [kmod.REQ_LEN] * 3
        assert sent[0].endswith(bytes(range(16)))
    finally:
        a.close()
    with pytest.raises(UmctlError):
        kmod.parse_uuid("GPU-1234")
    with pytest.raises(UmctlError):
        kmod.KmodActuator(family=999, start=False, gpu_uuids={0: b"short"})


def _actuator() -> kmod.KmodActuator:
    return kmod.KmodActuator(family=999, start=False)


def _result_msg(family: int, cmd_id: int, status: int, nbytes: int) -> bytes:
    def nla(t, fmt, v):
        p = struct.pack(fmt, v)
        return struct.pack("=HH", 4 + len(p), t) + p
    attrs = (nla(kmod.A_PID, "=I", 1) + nla(kmod.A_CMD_ID, "=Q", cmd_id) + nla(kmod.A_STATUS, "=I", status)
             + nla(kmod.A_BYTES, "=Q", nbytes) + nla(kmod.A_LATENCY_NS, "=Q", 1000)
             + nla(kmod.A_ERRNO, "=i", 0 if status == Status.OK else -errno.ENODEV))
    return struct.pack("=IHHII", 20 + len(attrs), family, 0, 0, 0) + struct.pack("=BBH", kmod.CMD_RESULT, 1, 0) + attrs


def _error_msg(seq: int, err: int) -> bytes:
    return struct.pack("=IHHII", 36, kmod.NLMSG_ERROR, 0, 0, 0) + struct.pack("=i", -err) + \
        struct.pack("=IHHII", kmod.REQ_LEN, 999, 1, seq, 0)


def test_results_and_refusals_become_result_records():
    a = _actuator()
    try:
        # pretend three commands were sent (the socket is not connected to a module here)
        for cid in range(3):
            a._seq_to_id[cid] = cid
        a._outstanding = 3
        a._seq_to_id[3] = 3
        a._outstanding = 4
        a._parse(_result_msg(999, 0, int(Status.OK), 2 << 20) + _error_msg(1, errno.ESRCH) + _error_msg(2, errno.ERANGE)
                 + _result_msg(999, 3, int(Status.TARGET_GONE), 0)   # executed: no va_space file
                 + _result_msg(999, 12345, int(Status.OK), 1))   # not ours: ignored
        r = a.results()
        assert dict(zip(r["cmd_id"].tolist(), r["status"].tolist())) == {
            0: Status.OK, 1: Status.TARGET_GONE, 2: Status.RANGE_INVALID, 3: Status.TARGET_GONE}
        assert r["bytes"].tolist() == [2 << 20, 0, 0, 0] and a.pending() == 0
        assert a.stats()["refusals"] == {"ESRCH": 1, "ERANGE": 1}
        assert a.stats()["result_errnos"] == {"ENODEV": 1}
    finally:
        a.close()


def test_advise_is_skipped_not_sent():
    a = _actuator()
    try:
        ids = a.submit(commands(Op.ADVISE, 0x1000, 4096, pid=1))
        r = a.results()
        assert r["cmd_id"].tolist() == ids.tolist() and r["status"].tolist() == [Status.SKIPPED]
        assert a.stats()["counts"]["sent"] == 0
    finally:
        a.close()


def test_missing_module_is_one_line():
    try:
        kmod.resolve_family()
    except UmctlError as e:
        assert "umctl kernel module" in str(e) and "\n" not in str(e)
    else:
        pytest.skip("the umctl module is loaded here")
