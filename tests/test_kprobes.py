"""The fault-path BPF programs (bpf/uvmfault.bpf.c) and their source (umctl.sources.kprobes).

On this kernel (no kprobes, no nvidia_uvm) the programs cannot attach; what is checked here:
the record layout and constants agree with the C source, decoding is right, every CO-RE field
access resolves against the real nvidia_uvm 580.159.04 BTF (libbpf loads the object with that
BTF as its CO-RE target), and the source refuses this kernel in one line naming the source to
use instead. Attaching and streaming run in the VM test bed (tests/vm/).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from conftest import require

from umctl import UmctlError
from umctl.events.schema import Access, Cause, Kind
from umctl.sources import kprobes as kp

ROOT = Path(__file__).resolve().parents[1]
SRC = (ROOT / "bpf" / "uvmfault.bpf.c").read_text()
REAL_BTF = ROOT / "tests" / "data" / "btf" / "nvidia_uvm-580.159.04.min.btf"


def _define(name: str) -> int:
    m = re.search(rf"#define {name} (\d+)", SRC)
    assert m, name
    return int(m.group(1))


def test_constants_match_bpf_source():
    for name in ("EV_BATCH", "EV_MIGRATION", "EV_EVICTION", "CNT_RB_DROPS", "CNT_FILTERED",
                 "CNT_BATCHES", "CNT_FAULTS", "CNT_TRUNCATED", "CNT_MIGRATIONS", "CNT_EVICTIONS",
                 "CNT_ROOT_EVICTIONS", "CNT_FAULTS_DROPPED", "NCOUNTERS", "MAX_FAULTS"):
        assert _define(name) == getattr(kp, name), name
    assert len(kp.COUNTER_NAMES) == kp.NCOUNTERS
    body = re.search(r"struct event \{(.*?)\};", SRC, re.S).group(1)
    fields = re.findall(r"^\s*(u64|u32|s32|u16|u8) (\w+);", body, re.M)
    assert [f for _, f in fields] == [n if n != "vaspace" else "vaspace" for n in kp.RAW_DTYPE.names]
    sizes = {"u64": 8, "u32": 4, "s32": 4, "u16": 2, "u8": 1}
    assert [sizes[t] for t, _ in fields] == [kp.RAW_DTYPE[n].itemsize for n in kp.RAW_DTYPE.names]
    body = re.search(r"struct fault_ent \{(.*?)\};", SRC, re.S).group(1)
    fields = re.findall(r"^\s*(u64|u32|s32|u16|u8) (\w+);", body, re.M)
    assert [f for _, f in fields] == list(kp.FAULT_DTYPE.names)
    assert [sizes[t] for t, _ in fields] == [kp.FAULT_DTYPE[n].itemsize for n in kp.FAULT_DTYPE.names]
    for fn, (kprobe, fentry) in kp.FUNCTIONS.items():
        assert f'SEC("kprobe/{fn}")' in SRC and f'SEC("fentry/{fn}")' in SRC
        assert re.search(rf"BPF_KPROBE\({kprobe}\b", SRC) and re.search(rf"BPF_PROG\({fentry}\b", SRC)


def _raw(rows: list[dict]) -> np.ndarray:
    a = np.zeros(len(rows), kp.RAW_DTYPE)
    for i, r in enumerate(rows):
        for k, v in r.items():
            a[i][k] = v
    return a


def test_decode_kinds_and_numbering():
    raw = _raw([
        dict(t_ns=12, kind=kp.EV_BATCH, pid=7, addr=2, a=5, batch=3, gpu=1),
        dict(t_ns=13, kind=kp.EV_MIGRATION, pid=7, addr=0x7f0000200000, a=2 << 20, gpu=1, access=0),
        dict(t_ns=14, kind=kp.EV_MIGRATION, pid=7, addr=0x7f0000000000, a=4096, gpu=0, access=6),
        dict(t_ns=15, kind=kp.EV_EVICTION, pid=7, addr=0x7f0000000000, a=2 << 20, gpu=1),
        dict(t_ns=16, kind=kp.EV_BATCH, pid=8, addr=1, a=1, batch=4, gpu=2),
    ])
    faults = np.zeros(3, kp.FAULT_DTYPE)
    faults["addr"] = [0x7f0000001000, 0x7f0000202000, 0x1000]
    faults["pid"] = [7, 7, 8]
    faults["access"] = [2, 3, 1]
    # as the ring delivers them: one bytes object per record, batch headers followed by faults
    chunks = [raw[0].tobytes() + faults[:2].tobytes(), raw[1].tobytes(), raw[2].tobytes(), raw[3].tobytes(),
              raw[4].tobytes() + faults[2:].tobytes()]
    heads, fl = kp.split_records(chunks)
    b = kp.decode(heads, fl, now_ns=20)
    f = b[Kind.FAULT]
    assert f["gpu"].tolist() == [0, 0, 1] and f["batch_id"].tolist() == [3, 3, 4] and f["pid"].tolist() == [7, 7, 8]
    assert f["access"].tolist() == [Access.WRITE, Access.ATOMIC, Access.READ] and f["addr"][0] == 0x7f0000001000
    assert f["t_ns"].tolist() == [12, 12, 16]
    assert b[Kind.REPLAY]["nfaults"].tolist() == [2, 1]
    m = b[Kind.MIGRATION]
    assert m["dst"].tolist() == [0, -1] and m["cause"].tolist() == [Cause.DEMAND, Cause.USER]
    e = b[Kind.EVICTION]
    assert e["gpu"].tolist() == [0] and e["pages"].tolist() == [512]
    with pytest.raises(UmctlError, match="announcing"):
        kp.decode(heads, fl[:2])


def _reason(fn) -> str | None:
    try:
        fn()
    except UmctlError as e:
        return str(e)
    return None


@pytest.fixture
def bpf():
    """Root with libbpf1, and the shipped uvmfault.bpf.o (built at install when clang is
    there): skips without them, fails instead under UMCTL_REQUIRE_ROOT=1 / UMCTL_REQUIRE_CLANG=1
    (tests/conftest.py; .ci/run sets both)."""
    from umctl.bpf import libbpf as lb
    import umctl.bpf

    require("root")
    require("root", why=_reason(lb.libbpf))
    require("clang", why=_reason(lambda: umctl.bpf.object_path("uvmfault.bpf.o")))


needs_bpf = pytest.mark.usefixtures("bpf")


@needs_bpf
def test_every_core_access_resolves_against_the_real_580_btf():
    """libbpf applies every CO-RE relocation of the kprobe programs against the real driver's BTF
    and the kernel verifies them: an access to a field the driver lacks is poisoned by libbpf and
    makes this load fail."""
    src = kp.KprobeSource(flavour="kprobe", btf_custom_path=str(REAL_BTF), check=False)
    src.load()
    assert src.flavour == "kprobe"
    src.close()


@needs_bpf
def test_core_check_fails_without_the_driver_types():
    """The control: against a BTF without the nvidia_uvm types (this kernel's own), the same
    load fails — so the test above can fail."""
    vmlinux = "/sys/kernel/btf/vmlinux"
    if not Path(vmlinux).exists():
        pytest.skip("no kernel BTF")
    src = kp.KprobeSource(flavour="kprobe", btf_custom_path=vmlinux, check=False)
    with pytest.raises(UmctlError, match="cannot load"):
        src.load()


def test_kernel_without_kprobes_names_the_other_source(monkeypatch):
    import os.path
    real = os.path.exists
    monkeypatch.setattr(os.path, "exists", lambda p: False if "kprobe/type" in str(p) else real(p))
    with pytest.raises(UmctlError, match="use --source uvmtools") as e:
        kp.check_kernel()
    assert "\n" not in str(e.value)


@pytest.mark.skipif(Path("/sys/bus/event_source/devices/kprobe/type").exists(), reason="this kernel has kprobes")
def test_attach_source_kprobe_on_this_kernel_says_which_source_to_use(capsys):
    """`umctl attach --source kprobe` on a kernel without kprobes (our CI and GPU machines): a
    one-line error naming the source to use instead, non-zero exit, before any attach."""
    import os

    from umctl.cli.main import main

    code = main(["attach", "--pid", str(os.getpid()), "--source", "kprobe"])
    out, err = capsys.readouterr()
    assert code != 0
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "--source uvmtools" in lines[0], err


def test_kprobe_source_has_the_interface_the_live_loop_calls():
    """`umctl attach --source kprobe` drives KprobeSource through the same session as the tools
    source: both have every method of the declared Source protocol (a method missing here was a
    traceback in the VM: sample_fraction) and name an actuator the session can build."""
    import inspect

    from umctl.live.interfaces import Source
    from umctl.live.spec import ACTUATORS
    from umctl.sources.kprobes import KprobeSource
    from umctl.sources.uvmtools import UvmToolsSource

    used = {n for n, _ in inspect.getmembers(Source, inspect.isfunction) if not n.startswith("_")}
    assert {"drain", "stop", "close", "stats", "exited", "counters", "sample_fraction"} <= used
    for cls in (UvmToolsSource, KprobeSource):
        assert sorted(n for n in used | {"start"} if not callable(getattr(cls, n, None))) == [], cls
        assert cls.actuator in ACTUATORS
