"""Launch probes: the record format, the decoding and execution identity (pure Python), and the
BPF object compiled from bpf/launch.bpf.c, loaded through our libbpf binding and firing on a
libcuda stand-in of ours (tests/bpfprog/fakecuda.c) on this kernel.

The BPF tests need root with libbpf1 and clang (tests/conftest.py's ``requires``): without
them they skip, unless UMCTL_REQUIRE_ROOT=1 / UMCTL_REQUIRE_CLANG=1 (.ci/run sets both),
which makes their absence a failure; a missing gcc is always a failure (the README needs it)."""

from __future__ import annotations

import ctypes as C
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from conftest import require

import umctl.bpf
from umctl import UmctlError
from umctl.bpf import libbpf as lb
from umctl.events.schema import DTYPES, KIND_CODES, Kind
from umctl.sources import uprobes as up
from umctl.sources.uprobes import (
    ARGS_BUFFER, ARGS_PARAMS, EV_ALIAS, EV_LAUNCH, EV_NAME, NAME_LEN, RAW_DTYPE, LaunchDecoder, LaunchProbe,
    NameTable, decode_name, launch_identity, param_sizes,
)

ROOT = Path(__file__).resolve().parent.parent
BPF_SRC = ROOT / "bpf" / "launch.bpf.c"
FAKE_SRC = ROOT / "tests" / "bpfprog" / "fakecuda.c"


# -- the record format matches the C struct ---------------------------------------------------

def _c_struct(name: str) -> str:
    m = re.search(r"struct " + name + r" \{(.*?)\n\};", BPF_SRC.read_text(), re.S)
    assert m, f"struct {name} not found in {BPF_SRC}"
    return re.sub(r"//[^\n]*", "", m.group(1))


def test_constants_match_bpf_source():
    text = BPF_SRC.read_text()
    defines = {m.group(1): m.group(2) for m in re.finditer(r"#define (\w+) (\w+)", text)}
    assert int(defines["MAX_PROBES"]) == up.MAX_PROBES
    assert int(defines["NARGS"]) == up.NARGS
    assert int(defines["NAME_LEN"]) == up.NAME_LEN
    assert (int(defines["EV_LAUNCH"]), int(defines["EV_NAME"]), int(defines["EV_ALIAS"])) == (EV_LAUNCH, EV_NAME,
                                                                                              EV_ALIAS)
    assert (int(defines["ARGS_PARAMS"]), int(defines["ARGS_BUFFER"])) == (ARGS_PARAMS, ARGS_BUFFER)
    assert len(up.PROBES) <= up.MAX_PROBES
    programs = set(re.findall(r"BPF_K(?:RET)?PROBE\((\w+)", text))
    assert {p.program for p in up.PROBES} <= programs


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is needed (README)")
def test_raw_dtype_matches_struct_event(tmp_path):
    """Offsets of every field of struct event, as gcc lays it out for x86-64 (the BPF target
    uses the same natural alignment), equal RAW_DTYPE's."""
    body = _c_struct("event")
    fields = [re.match(r"\s*\w+\s+(\w+)", line).group(1) for line in body.split(";") if line.strip()]
    assert fields == list(RAW_DTYPE.names)
    prog = textwrap.dedent("""
        #include <stdio.h>
        #include <stddef.h>
        typedef unsigned char u8; typedef unsigned int u32; typedef int s32; typedef unsigned long long u64;
        #define NARGS %d
        #define NAME_LEN %d
        struct event {%s};
        int main(void) {
            printf("size %%zu\\n", sizeof(struct event));
            %s
            return 0;
        }
    """) % (up.NARGS, NAME_LEN, body, "\n".join(f'printf("{f} %zu\\n", offsetof(struct event, {f}));' for f in fields))
    (tmp_path / "s.c").write_text(prog)
    subprocess.run(["gcc", "-o", str(tmp_path / "s"), str(tmp_path / "s.c")], check=True)
    out = dict(line.split() for line in subprocess.run([str(tmp_path / "s")], capture_output=True, text=True,
                                                       check=True).stdout.splitlines())
    assert int(out.pop("size")) == RAW_DTYPE.itemsize
    assert {k: int(v) for k, v in out.items()} == {f: RAW_DTYPE.fields[f][1] for f in fields}


# -- signatures, identities, decoding ----------------------------------------------------------

@pytest.mark.parametrize("name,sizes", [
    ("_Z5scalePfi", [8, 4]),
    ("_Z3addPKfS0_Pfm", [8, 8, 8, 8]),
    ("_Z1fv", []),
    ("_Z1fcsbd", [1, 2, 1, 8]),
    ("_Z1fRKiPPv", [8, 8]),
    ("_Z1fN2ns4Dim3EPf", [None, 8]),                                 # a struct: size unknown
    ("_Z6kernelILi4EEvN2at6detail5ArrayIPcLi2EEEi", [None, 4]),     # template, struct, int
    ("plain_c_kernel", None),                                        # extern "C": no signature
    ("_Znot_a_valid_name", None),
])
def test_param_sizes(name, sizes):
    if up._cxa_demangle() is None:
        pytest.skip("libstdc++ (__cxa_demangle) not available")
    assert param_sizes(name) == sizes


def test_launch_identity_uses_only_what_is_certain():
    g, b = (4, 2, 1), (128, 1, 1)
    sizes = [8, 4]   # scale(float*, int)
    args = (0x7F0000100000, 0xDEAD_0000_0001_0000) + (0,) * 6   # the int's upper bytes are not the int
    h = launch_identity("_Z5scalePfi", 1, g, b, 0, ARGS_PARAMS, 2, args, sizes)
    # stable, and independent of the bytes beyond a 4-byte argument and of words past the signature
    args2 = (0x7F0000100000, 0xBEEF_0000_0001_0000, 123, 456) + (0,) * 4
    assert launch_identity("_Z5scalePfi", 1, g, b, 0, ARGS_PARAMS, 4, args2, sizes) == h
    # a different pointer, grid, block or shared memory is a different execution
    assert launch_identity("_Z5scalePfi", 1, g, b, 0, ARGS_PARAMS, 2, (0x7F0000200000,) + args[1:], sizes) != h
    assert launch_identity("_Z5scalePfi", 1, (8, 2, 1), b, 0, ARGS_PARAMS, 2, args, sizes) != h
    assert launch_identity("_Z5scalePfi", 1, g, (64, 1, 1), 0, ARGS_PARAMS, 2, args, sizes) != h
    assert launch_identity("_Z5scalePfi", 1, g, b, 256, ARGS_PARAMS, 2, args, sizes) != h
    # the handle does not matter when the name is known (same kernel in another run)
    assert launch_identity("_Z5scalePfi", 2, g, b, 0, ARGS_PARAMS, 2, args, sizes) == h
    # no signature: arguments are left out entirely
    hc = launch_identity("plain", 1, g, b, 0, ARGS_PARAMS, 2, args, None)
    assert launch_identity("plain", 1, g, b, 0, ARGS_PARAMS, 2, (7, 8) + (0,) * 6, None) == hc
    # unknown name: the handle is the identity
    assert launch_identity(None, 1, g, b, 0, ARGS_PARAMS, 2, args, None) != launch_identity(None, 2, g, b, 0,
                                                                                             ARGS_PARAMS, 2, args, None)
    # packed `extra` buffer: exactly its size in bytes
    buf = (0x1122334455667788, 0x00000000_0000002A) + (0xFFFF,) * 6
    hb = launch_identity("plain", 1, g, b, 0, ARGS_BUFFER, 12, buf, None)
    assert launch_identity("plain", 1, g, b, 0, ARGS_BUFFER, 12, buf[:2] + (0,) * 6, None) == hb
    assert launch_identity("plain", 1, g, b, 0, ARGS_BUFFER, 12, (buf[0] + 1,) + buf[1:], None) != hb
    assert 0 <= h < 2 ** 64


def _rec(kind: int, **kw) -> np.ndarray:
    r = np.zeros(1, RAW_DTYPE)
    r["kind"] = kind
    for k, v in kw.items():
        r[k] = v
    return r


def test_decoder_names_aliases_and_sequence():
    d = LaunchDecoder()
    d.handle_meta(_rec(EV_NAME, func=0x100, name=b"_Z5scalePfi", name_len=12, pid=os.getpid())[0])
    d.handle_meta(_rec(EV_NAME, func=0x200, name=b"_Z3addPKfS0_Pfm", name_len=16, pid=os.getpid())[0])
    d.handle_meta(_rec(EV_ALIAS, func=0x300, stream=0x200)[0])   # CUfunction 0x300 is CUkernel 0x200
    raw = np.concatenate([
        _rec(EV_LAUNCH, t_ns=10, pid=7, func=0x100, stream=0x5000, grid=[4, 2, 1], block=[128, 1, 1],
             args_mode=ARGS_PARAMS, nargs=2, args=[0x1000, 5, 0, 0, 0, 0, 0, 0]),
        _rec(EV_LAUNCH, t_ns=11, pid=7, func=0x300, grid=[8, 1, 1], block=[256, 1, 1]),
        _rec(EV_NAME, func=0x999, name=b"ignored_here"),                # not a launch
        _rec(EV_LAUNCH, t_ns=12, pid=7, func=0x400, grid=[1, 1, 1], block=[32, 1, 1]),
        _rec(EV_LAUNCH, t_ns=13, pid=7, func=0x100, stream=0x5000, grid=[4, 2, 1], block=[128, 1, 1],
             args_mode=ARGS_PARAMS, nargs=2, args=[0x1000, 5 | (77 << 32), 0, 0, 0, 0, 0, 0]),
    ])
    out = d.launches_from(raw)
    assert out.dtype == DTYPES[Kind.LAUNCH]
    assert out["t_ns"].tolist() == [10, 11, 12, 13]
    assert out["pid"].tolist() == [7] * 4
    assert out["seq"].tolist() == [0, 1, 2, 3]
    assert out["name_id"].tolist() == [0, 1, -1, 0]
    assert d.names.names == ["_Z5scalePfi", "_Z3addPKfS0_Pfm"]
    assert out["grid"][1].tolist() == [8, 1, 1] and out["block"][0].tolist() == [128, 1, 1]
    assert int(out["stream"][0]) == 0x5000 and int(out["func"][2]) == 0x400
    assert (out["t_end_ns"] == 0).all()
    # same kernel, same pointer, same int (garbage above it ignored): same identity
    assert out["exec_hash"][0] == out["exec_hash"][3]
    assert int(out["exec_hash"][2]) == launch_identity(None, 0x400, (1, 1, 1), (32, 1, 1), 0, 0, 0, (0,) * 8, None)
    # the sequence continues across drains; the name list only grows
    more = d.launches_from(_rec(EV_LAUNCH, func=0x200))
    assert more["seq"].tolist() == [4] and more["name_id"].tolist() == [1]
    assert d.launches == 5


def test_decode_name_reads_long_names_from_process_memory():
    long = b"_Z300" + b"k" * 300 + b"Pfi"
    buf = C.create_string_buffer(long)
    rec = _rec(EV_NAME, pid=os.getpid(), name=long[:NAME_LEN], name_len=NAME_LEN, name_ptr=C.addressof(buf))[0]
    assert decode_name(rec) == long.decode()
    # unreadable in the kernel (name_len < 0) and in /proc: nothing
    bad = _rec(EV_NAME, pid=os.getpid(), name_len=-14, name_ptr=8)[0]
    assert decode_name(bad) is None
    # complete copy: used as is
    ok = _rec(EV_NAME, pid=os.getpid(), name=b"short", name_len=6, name_ptr=0)[0]
    assert decode_name(ok) == "short"


def test_name_table_is_append_only():
    t = NameTable()
    assert t.bind(1, "a") == 0 and t.bind(2, "b") == 1 and t.bind(3, "a") == 0
    names = t.names
    t.bind(4, "c")
    assert names is t.names and names == ["a", "b", "c"]
    assert t.lookup(3) == 0 and t.lookup(99) == -1


def test_mapped_libraries_and_errors():
    libs = up.mapped_libraries(os.getpid(), re.compile(r"/libc\.so\.6$"))
    assert len(libs) == 1 and libs[0].endswith("libc.so.6")
    with pytest.raises(UmctlError, match="no such process"):
        up.mapped_libraries(2 ** 22 + 12345, re.compile("x"))
    with pytest.raises(UmctlError, match="no such process"):
        LaunchProbe(2 ** 22 + 12345)


def test_no_libcuda_in_target():
    p = subprocess.Popen(["sleep", "30"])
    try:
        with pytest.raises(UmctlError, match="libcuda"):
            LaunchProbe(p.pid)
    finally:
        p.kill()
        p.wait()


def test_missing_libbpf_says_how_to_install(monkeypatch):
    monkeypatch.setattr(lb, "_lib", None)
    monkeypatch.setenv("UMCTL_LIBBPF", "/nonexistent/libbpf.so.1")
    with pytest.raises(UmctlError, match="install libbpf1") as e:
        lb.libbpf()
    assert "\n" not in str(e.value)


def test_missing_bpf_object_says_why():
    with pytest.raises(UmctlError, match="clang"):
        umctl.bpf.object_path("no-such.bpf.o")


def test_errno_names():
    assert lb.errno_name(-1) == "EPERM" and lb.errno_name(2) == "ENOENT"
    msg = str(lb.error("cannot load BPF object x", -1))
    assert msg.startswith("cannot load BPF object x: EPERM") and "root" in msg and "\n" not in msg


# -- the BPF object on this kernel -------------------------------------------------------------

def _libbpf_unavailable() -> str | None:
    try:
        lb.libbpf()
    except UmctlError as e:
        return str(e)
    return None


def _root_with_libbpf() -> None:
    require("root")
    require("root", why=_libbpf_unavailable())


#: root with libbpf1, and clang for the object (the fixture below builds it)
needs_bpf = pytest.mark.requires("root", "clang")


@pytest.fixture(scope="module")
def bpf_object(tmp_path_factory) -> Path:
    """bpf/launch.bpf.c compiled now (the shipped object may be stale in a source checkout)."""
    _root_with_libbpf()
    require("clang")
    clang = shutil.which("clang")
    out = tmp_path_factory.mktemp("bpf") / "launch.bpf.o"
    multiarch = f"/usr/include/{os.uname().machine}-linux-gnu"
    r = subprocess.run([clang, "-O2", "-g", "-target", "bpf", "-D__TARGET_ARCH_x86", "-Wall", "-Werror",
                        "-I", multiarch, "-c", str(BPF_SRC), "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture(scope="module")
def fake_cuda(tmp_path_factory) -> Path:
    gcc = shutil.which("gcc")
    assert gcc, "gcc is needed (README)"
    d = tmp_path_factory.mktemp("fakecuda")
    subprocess.run([gcc, "-O1", "-Wall", "-Werror", "-shared", "-fPIC", "-DFAKECUDA_LIB", str(FAKE_SRC), "-o",
                    str(d / "libcuda.so.1")], check=True)
    subprocess.run([gcc, "-O1", "-Wall", "-Werror", str(FAKE_SRC), "-o", str(d / "fakecuda"), str(d / "libcuda.so.1"),
                    f"-Wl,-rpath,{d}", "-lpthread"], check=True)
    return d


class Fake:
    """A running fakecuda: READY -> (go) -> launches -> DONE json -> (go) -> exit."""

    def __init__(self, d: Path, n: int, n_thread: int) -> None:
        self.p = subprocess.Popen([str(d / "fakecuda"), str(n), str(n_thread)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, bufsize=1)
        line = self.p.stdout.readline().split()
        assert line and line[0] == "READY", line
        self.pid = int(line[1])

    def run(self) -> dict:
        self.p.stdin.write("go\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        assert line.startswith("DONE "), line
        return json.loads(line[5:])

    def finish(self) -> None:
        try:
            self.p.stdin.write("go\n")
            self.p.stdin.flush()
        except BrokenPipeError:
            pass
        self.p.wait(timeout=10)


def _drain_until(probe: LaunchProbe, n: int, timeout: float = 5.0) -> np.ndarray:
    """Launch records until ``n`` arrived (the drain thread polls every 50 ms) or the timeout."""
    import time
    parts, got, t0 = [], 0, time.monotonic()
    while got < n and time.monotonic() - t0 < timeout:
        b = probe.drain()
        parts.append(b[Kind.LAUNCH])
        got += len(parts[-1])
        if got < n:
            time.sleep(0.05)
    time.sleep(0.2)
    parts.append(probe.drain()[Kind.LAUNCH])   # nothing more may arrive
    return np.concatenate(parts)


@needs_bpf
def test_uprobes_fire_on_fake_libcuda(bpf_object, fake_cuda, monkeypatch):
    monkeypatch.setattr(umctl.bpf, "object_path", lambda name: bpf_object)
    n, n_thread = 100, 50
    target = Fake(fake_cuda, n, n_thread)
    other = Fake(fake_cuda, n, n_thread)   # same library, not observed
    try:
        probe = LaunchProbe(target.pid)
        assert probe.libcuda == str(fake_cuda / "libcuda.so.1")
        probe.start()
        try:
            assert len(probe.drain()[Kind.LAUNCH]) == 0
            info = target.run()
            other.run()
            total = 5 * n + n_thread
            ev = _drain_until(probe, total)
            stats = probe.stats()
        finally:
            probe.close()
    finally:
        target.finish()
        other.finish()

    assert len(ev) == total, stats
    assert set(ev["pid"].tolist()) == {target.pid}
    assert stats["ringbuf_drops"] == 0 and stats["callback_errors"] == 0
    hits = stats["hits"]
    assert hits["cuLaunchKernel"] == 2 * n + n_thread
    assert hits["cuLaunchKernel_ptsz"] == n
    assert hits["cuLaunchKernelEx"] == n
    assert hits["cuLaunchCooperativeKernel"] == n
    assert hits["cuModuleGetFunction"] == hits["cuModuleGetFunction(ret)"] == 4
    assert hits["cuLibraryGetKernel"] == hits["cuLibraryGetKernel(ret)"] == 1
    assert hits["cuKernelGetFunction"] == hits["cuKernelGetFunction(ret)"] == 1
    assert "cuLaunchKernelEx_ptsz" in stats["not_attached"]   # absent from the fake: optional
    assert stats["launches"] == total

    names = probe.names
    by_func = {f: ev[ev["func"] == info[f]] for f in ("f_scale", "f_ex", "f_long", "f_plain", "f_thread",
                                                       "f_unknown")}
    assert {k: len(v) for k, v in by_func.items()} == {"f_scale": n, "f_ex": n, "f_long": n, "f_plain": n,
                                                       "f_thread": n_thread, "f_unknown": n}

    def one(rows, field):
        vals = {tuple(np.atleast_1d(v).tolist()) for v in rows[field]}
        assert len(vals) == 1, (field, vals)
        return vals.pop()

    expect = {  # func: (grid, block, stream, name)
        "f_scale": ((4, 2, 1), (128, 1, 1), 0x5000, "_Z5scalePfi"),
        "f_ex": ((8, 1, 1), (256, 1, 1), 0x6000, "_Z3addPKfS0_Pfm"),   # named through cuKernelGetFunction
        "f_long": ((16, 16, 1), (16, 16, 1), 0x7000, info["long_name"]),   # read through /proc/PID/mem
        "f_plain": ((1, 1, 1), (64, 1, 1), 0, "plain_c_kernel"),
        "f_thread": ((3, 3, 3), (32, 2, 1), 0x3000, "_Z8threadedPfi"),   # launched from a second thread
        "f_unknown": ((2, 1, 1), (32, 1, 1), 0x8000, None),
    }
    for f, (grid, block, stream, name) in expect.items():
        rows = by_func[f]
        assert one(rows, "grid") == grid and one(rows, "block") == block, f
        assert one(rows, "stream") == (stream,), f
        nid = one(rows, "name_id")[0]
        assert (names[nid] if nid >= 0 else None) == name, f
    assert len(info["long_name"]) == 308

    # identities: scale and the long kernel alternate two buffers -> two identities, n/2 each;
    # the others are one identity; the unnamed kernel is identified by its handle
    hashes = {f: Counter(rows["exec_hash"].tolist()) for f, rows in by_func.items()}
    assert sorted(hashes["f_scale"].values()) == [n // 2, n // 2]
    assert sorted(hashes["f_long"].values()) == [n // 2, n // 2]
    for f in ("f_ex", "f_plain", "f_thread", "f_unknown"):
        assert list(hashes[f].values()) == [len(by_func[f])], f
    assert list(hashes["f_unknown"]) == [launch_identity(None, info["f_unknown"], (2, 1, 1), (32, 1, 1), 512, 0, 0,
                                                         (0,) * 8, None)]
    # the `extra` buffer (pointer 0x7f0000600000, int 42) is part of plain_c_kernel's identity
    buf = (0x7F0000600000, 42) + (0,) * 6
    assert list(hashes["f_plain"]) == [launch_identity("plain_c_kernel", 0, (1, 1, 1), (64, 1, 1), 0, ARGS_BUFFER,
                                                       16, buf, None)]
    # scale's identities are exactly name + geometry + (float* buffer, int 65536)
    want = {launch_identity("_Z5scalePfi", 0, (4, 2, 1), (128, 1, 1), 0, ARGS_PARAMS, 2, (p, 1 << 16) + (0,) * 6,
                            [8, 4]) for p in (0x7F0000100000, 0x7F0000200000)}
    assert set(hashes["f_scale"]) == want
    # timestamps are CLOCK_MONOTONIC and in order per thread
    import time
    main = ev[ev["func"] != info["f_thread"]]
    assert (np.diff(main["t_ns"]) >= 0).all()
    assert 0 < time.monotonic_ns() - int(ev["t_ns"].max()) < 60e9
    assert sorted(ev["seq"].tolist()) == list(range(total))
    assert KIND_CODES[Kind.LAUNCH] >= 0


@needs_bpf
def test_probe_before_the_target_loads_libcuda(bpf_object, fake_cuda, monkeypatch, tmp_path):
    """With the libcuda path given, the probe arms for a process that has not mapped it yet
    (how `umctl run` records from the first CUDA call)."""
    monkeypatch.setattr(umctl.bpf, "object_path", lambda name: bpf_object)
    loader = tmp_path / "late.py"
    loader.write_text(textwrap.dedent(f"""
        import ctypes, sys
        print("READY", flush=True); sys.stdin.readline()
        lib = ctypes.CDLL({str(fake_cuda / 'libcuda.so.1')!r})
        lib.cuLaunchKernelEx.argtypes = [ctypes.c_void_p] * 4
        cfg = (ctypes.c_uint32 * 14)(7, 1, 1, 64, 1, 1, 0, 0, 0x11, 0, 0, 0, 0, 0)
        for _ in range(25):
            lib.cuLaunchKernelEx(ctypes.addressof(cfg), 0xF00, None, None)
        print("DONE", flush=True); sys.stdin.readline()
    """))
    p = subprocess.Popen([sys.executable, str(loader)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "READY"
        with LaunchProbe(p.pid, libcuda=str(fake_cuda / "libcuda.so.1")) as probe:
            p.stdin.write("go\n")
            p.stdin.flush()
            assert p.stdout.readline().strip() == "DONE"
            ev = _drain_until(probe, 25)
        assert len(ev) == 25
        assert ev["grid"][0].tolist() == [7, 1, 1] and ev["block"][0].tolist() == [64, 1, 1]
        assert set(ev["stream"].tolist()) == {0x11} and set(ev["func"].tolist()) == {0xF00}
        assert (ev["name_id"] == -1).all() and len(set(ev["exec_hash"].tolist())) == 1
    finally:
        p.stdin.write("go\n")
        p.stdin.flush()
        p.wait(timeout=10)


@needs_bpf
def test_unprivileged_load_is_a_one_line_error(bpf_object, fake_cuda):
    """Without root, loading fails with EPERM, said in one line with the remedy."""
    import tempfile
    target = Fake(fake_cuda, 1, 1)
    pub = Path(tempfile.mkdtemp(prefix="umctl-uprobes-"))   # pytest's tmp dirs are 0700
    pub.chmod(0o755)
    shutil.copy(bpf_object, pub / "launch.bpf.o")
    shutil.copy(fake_cuda / "libcuda.so.1", pub / "libcuda.so.1")
    bpf_object, fake_cuda = pub / "launch.bpf.o", pub
    code = textwrap.dedent(f"""
        import os, umctl.bpf
        from pathlib import Path
        umctl.bpf.object_path = lambda name: Path({str(bpf_object)!r})
        from umctl import UmctlError
        from umctl.sources.uprobes import LaunchProbe
        os.setgid(65534); os.setuid(65534)
        try:
            LaunchProbe({target.pid}, libcuda={str(fake_cuda / 'libcuda.so.1')!r}).start()
            print("NO ERROR")
        except UmctlError as e:
            print("UMCTL", e)
    """)
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    finally:
        target.run()
        target.finish()
        shutil.rmtree(pub, ignore_errors=True)
    out = r.stdout.strip()
    assert out.startswith("UMCTL "), (out, r.stderr[-2000:])
    assert "\n" not in out
    assert ("EPERM" in out or "EACCES" in out) and "root" in out, out
