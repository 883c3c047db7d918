"""Build glue that pyproject.toml cannot express: the simulator's C core, the mapping of
the top-level scenarios/ folder into the package, and the BPF objects. Metadata lives in
pyproject.toml."""

import os
import platform
import shutil
import subprocess
import sys

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
BPF_SOURCES = ["launch.bpf.c", "uvmfault.bpf.c", "fastpath.bpf.c"]   # bpf/NAME.c -> umctl/bpf/NAME.o
RUNTIME_SOURCES = ["runtime/umctl_rt.c"]   # -> umctl/runtime/libumctl_rt.so (LD_PRELOAD runtime)


def _compile(cmd: list[str], what: str, hint: str = "") -> bool:
    """Run one compiler command; a failure is a warning on stderr, never a failed install."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        print(f"umctl: {what} not built ({e})", file=sys.stderr)
        return False
    if r.returncode:
        print(f"umctl: {what} not built{hint}:\n{r.stderr[-2000:]}", file=sys.stderr)
        return False
    return True


class build_ext_and_bpf(build_ext):
    """build_ext, plus ``clang -O2 -g -target bpf`` of bpf/*.bpf.c into umctl/bpf/.

    Hooked on build_ext because it runs for both wheels (into build_lib) and editable installs
    (in place), which build_py does not. A missing clang or a failed BPF compile is a warning,
    never a failed install: everything but the launch probes works without the object, and
    umctl.sources.uprobes says what is missing when asked to probe."""

    def run(self) -> None:
        super().run()
        out_dir = os.path.join(HERE if self.inplace else self.build_lib, "umctl", "bpf")
        self._build_bpf(out_dir)
        self._build_runtime(os.path.join(HERE if self.inplace else self.build_lib, "umctl", "runtime"))

    def _build_runtime(self, out_dir: str) -> None:
        """gcc the in-process runtime; no CUDA headers needed (it reaches CUDA through dlsym). A
        failure is a warning: only `umctl run` needs the library, and it says so."""
        cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
        if not cc:
            print("umctl: gcc not found; the in-process runtime (libumctl_rt.so) is not built", file=sys.stderr)
            return
        os.makedirs(out_dir, exist_ok=True)
        cmd = [cc, "-O2", "-g", "-shared", "-fPIC", "-Wall", "-o", os.path.join(out_dir, "libumctl_rt.so"),
               *[os.path.join(HERE, s) for s in RUNTIME_SOURCES], "-ldl", "-lpthread"]
        _compile(cmd, "runtime library")

    def _build_bpf(self, out_dir: str) -> None:
        clang = os.environ.get("BPF_CLANG") or shutil.which("clang")
        if not clang:
            print("umctl: clang not found; BPF launch probes are not built (install clang and libbpf-dev)",
                  file=sys.stderr)
            return
        arch = {"x86_64": "x86", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
        multiarch = f"/usr/include/{platform.machine()}-linux-gnu"
        os.makedirs(out_dir, exist_ok=True)
        for src in BPF_SOURCES:
            obj = os.path.join(out_dir, src[:-2] + ".o")
            cmd = [clang, "-O2", "-g", "-target", "bpf", f"-D__TARGET_ARCH_{arch}", "-Wall",
                   *(["-I", multiarch] if os.path.isdir(multiarch) else []),
                   "-c", os.path.join(HERE, "bpf", src), "-o", obj]
            _compile(cmd, f"BPF object {src}", hint=" (is libbpf-dev installed?)")


setup(
    packages=find_packages(include=["umctl", "umctl.*"]) + ["umctl.scenarios_data"],
    package_dir={"umctl": "umctl", "umctl.scenarios_data": "scenarios"},
    package_data={"umctl.scenarios_data": ["*.toml"], "umctl.bpf": ["*.bpf.o"], "umctl.runtime": ["*.so"],
                  "umctl.sim": ["calibrations/*.json"]},
    ext_modules=[Extension(f"umctl.sim.{name}", [f"umctl/sim/{name}.c"], depends=["umctl/sim/_simcore.c"],
                           extra_compile_args=["-O2", "-fvisibility=default"])
                 for name in ("_simcore", "_simcore_wide")],   # 8- and 32-bit GPU masks (umctl/sim/core.py)
    cmdclass={"build_ext": build_ext_and_bpf},
)
