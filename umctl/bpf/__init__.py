"""BPF side of umctl: the compiled BPF objects shipped as package data (built from ``bpf/*.bpf.c``
by ``setup.py`` when clang is present) and :mod:`umctl.bpf.libbpf`, our small ctypes binding of
the distribution's libbpf, used instead of bcc because bcc needs kernel headers and a compiler
on the target (neither exists on the GPU machine) and libbpf loads a prebuilt object."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from .. import UmctlError


def object_path(name: str) -> Path:
    """Path of the shipped BPF object ``name`` (e.g. ``"launch.bpf.o"``); UmctlError when the
    package was built without clang, so that callers fail with a reason instead of ENOENT."""
    p = Path(str(resources.files(__name__) / name))
    if not p.is_file():
        raise UmctlError(f"BPF object {name} is missing from the umctl package (it was built without clang); "
                         "install clang and libbpf-dev and reinstall umctl")
    return p
