"""What the whole suite shares: optional tools, and the threads a test leaves behind.

Optional tools. The README's test command needs Python >= 3.11 and gcc only. Tests that need
more -- clang (building the BPF objects), a Prometheus server, MPI (``mpirun`` and mpi4py), or
root (BPF: root and libbpf1) -- ask for it through :func:`require` (or the ``requires`` marker),
which *skips* them with the reason when it is missing, unless ``UMCTL_REQUIRE_<X>=1`` is set
(X in CLANG, PROMETHEUS, MPI, ROOT): then its absence is a *failure*. .ci/run installs every
tool, runs as root and sets all four, so CI can never pass by skipping::

    @pytest.mark.requires("root", "clang")       # a test (or pytestmark = ... for a module)
    def test_x(): ...

    require("prometheus")                         # in a fixture or a test body
    require("mpi", module=True)                   # at a module's top level
    require("clang", why="umctl was built without clang: uvmfault.bpf.o missing")

Threads. A test that starts exporter or tools-source threads (``umctl-uvm-<pid>`` drain
threads, the exporter command's HTTP server and timer) must end them itself; the autouse
fixture below fails the test that leaves one running, instead of a later test that counts them.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

#: tool -> the environment variable that turns its absence into a failure
REQUIRE_ENV = {
    "clang": "UMCTL_REQUIRE_CLANG",
    "prometheus": "UMCTL_REQUIRE_PROMETHEUS",
    "mpi": "UMCTL_REQUIRE_MPI",
    "root": "UMCTL_REQUIRE_ROOT",
}


def _libbpf_missing() -> str | None:
    try:
        ctypes.CDLL(os.environ.get("UMCTL_LIBBPF") or "libbpf.so.1")
    except OSError:
        return "libbpf.so.1 not found (apt install libbpf1)"
    return None


def missing(tool: str) -> str | None:
    """Why ``tool`` cannot be used on this machine, or None when it can."""
    if tool == "clang":
        return None if shutil.which("clang") else "clang not found (apt install clang libbpf-dev)"
    if tool == "prometheus":
        return None if shutil.which("prometheus") else "the prometheus server binary not found (apt install prometheus)"
    if tool == "mpi":
        if not shutil.which("mpirun"):
            return "mpirun not found (apt install openmpi-bin libopenmpi-dev)"
        try:
            import mpi4py  # noqa: F401
        except ImportError:
            return "mpi4py not installed (pip install -e '.[mpi]')"
        return None
    if tool == "root":
        if os.geteuid() != 0:
            return "needs root (BPF)"
        return _libbpf_missing()
    raise ValueError(f"unknown tool {tool!r} (one of {', '.join(REQUIRE_ENV)})")


def required(tool: str) -> bool:
    """Whether ``UMCTL_REQUIRE_<TOOL>`` asks for ``tool`` to be present (CI)."""
    return os.environ.get(REQUIRE_ENV[tool], "").strip() not in ("", "0")


def require(tool: str, why: str | None = None, *, module: bool = False) -> None:
    """Skip the calling test, fixture or (``module=True``) module when ``tool`` is unusable --
    for the reason :func:`missing` gives, or ``why`` when the caller found one itself (None:
    usable) -- or fail it when ``UMCTL_REQUIRE_<TOOL>=1``."""
    if tool not in REQUIRE_ENV:
        raise ValueError(f"unknown tool {tool!r} (one of {', '.join(REQUIRE_ENV)})")
    reason = missing(tool) if why is None else why
    if reason is None:
        return
    env = REQUIRE_ENV[tool]
    if required(tool):
        pytest.fail(f"{reason}; {env}=1 says this machine must have it", pytrace=False)
    pytest.skip(f"{reason} (set {env}=1 to fail instead of skipping)", allow_module_level=module)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item) -> None:
    """The ``requires`` marker (registered in pyproject.toml)."""
    for mark in item.iter_markers("requires"):
        for tool in mark.args:
            require(tool)


# -- threads ------------------------------------------------------------------------------------

#: Threads of umctl's sources and exporter: drain threads (``umctl-uvm-<pid>``, launch/kprobe
#: sources), and what the exporter command starts (prometheus_client's HTTP server, its timer).
LEAK_PREFIXES = ("umctl-",)


def _ours(t: threading.Thread) -> bool:
    return t.name.startswith(LEAK_PREFIXES) or type(t).__name__ == "Timer" or "serve_forever" in repr(
        getattr(t, "_target", None))


@pytest.fixture(autouse=True)
def no_leftover_threads():
    """Every umctl/exporter thread a test started has ended when it is over (waited for up to
    10 s: a stopped HTTP server's thread or a cancelled timer ends soon after, not at once)."""
    before = set(threading.enumerate())
    yield
    end = time.monotonic() + 10.0
    while True:
        left = [t for t in threading.enumerate() if t not in before and t.is_alive() and _ours(t)]
        if not left or time.monotonic() > end:
            break
        time.sleep(0.02)
    assert not left, f"threads left running by this test: {sorted(t.name for t in left)}"


# -- the in-process runtime on the fake CUDA (tests/rtprog), built once for every module using it
_ROOT = Path(__file__).resolve().parent.parent
_RTSRC = _ROOT / "tests" / "rtprog"


def _gcc_rt(*args: str) -> None:
    subprocess.run(["gcc", *args], check=True, capture_output=True, text=True)


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("rt")
    _gcc_rt("-O2", "-shared", "-fPIC", "-Wall", str(_ROOT / "runtime" / "umctl_rt.c"), "-o", str(d / "libumctl_rt.so"),
         "-ldl", "-lpthread")
    _gcc_rt("-O1", "-shared", "-fPIC", str(_RTSRC / "fakecudart.c"), "-o", str(d / "libcudart.so"), "-ldl")
    _gcc_rt("-O1", "-shared", "-fPIC", "-DFAKE_LIBCUDA", str(_RTSRC / "fakecudart.c"), "-o", str(d / "libcuda.so.1"))
    _gcc_rt("-O1", "-rdynamic", str(_RTSRC / "rtprog.c"), "-o", str(d / "rtprog"), f"-L{d}", "-lcudart",
         f"-Wl,-rpath,{d}", "-ldl")
    return {"dir": d, "lib": d / "libumctl_rt.so", "prog": d / "rtprog", "libcuda": d / "libcuda.so.1"}
