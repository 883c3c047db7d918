"""The in-process runtime (``runtime/umctl_rt.c``, built by setup.py into this package as
``libumctl_rt.so``): what ``umctl run --mode ... -- CMD`` preloads into the program. This module
only finds the library and builds the child's environment; the reports it sends are received by
:mod:`umctl.sources.runtime`."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from .. import UmctlError

LIBRARY = "libumctl_rt.so"

#: DISCARD_DONE statuses (enum umrt_discard_status in runtime/umctl_rt.h): 0 = the range was
#: dropped; the others say why bytes were kept (their data is intact and umctl evicts them
#: normally). Here, with the library, because both the source that receives the answers and the
#: actuator that asks need them, and neither should import the other.
DISCARDED = 0
KEPT_REASONS = {1: "in_use", 2: "busy", 3: "unsafe", 4: "small", 5: "failed"}


def library_path() -> Path:
    """Path of the shipped runtime library; UmctlError when the package was built without gcc."""
    p = Path(str(resources.files(__name__) / LIBRARY))
    if not p.is_file():
        raise UmctlError(f"{LIBRARY} is missing from the umctl package (it was built without gcc); "
                         "install gcc and reinstall umctl")
    return p


def child_env(base: dict[str, str] | None = None, *, socket: str | None = None, managed: bool = False,
              hum: bool = False, library: str | os.PathLike | None = None, **extra: str) -> dict[str, str]:
    """The environment for a program run under the runtime: LD_PRELOAD (prepended to any the
    caller has) and the UMCTL_RT_* switches (runtime/README.md). ``extra`` adds UMCTL_RT_<KEY>."""
    env = dict(os.environ if base is None else base)
    lib = str(library or library_path())
    env["LD_PRELOAD"] = lib + (":" + env["LD_PRELOAD"] if env.get("LD_PRELOAD") else "")
    for key in ("UMCTL_RT_SOCKET", "UMCTL_RT_MANAGED", "UMCTL_RT_HUM", "UMCTL_RT_GPUS", "UMCTL_RT_CONTROL"):
        env.pop(key, None)
    if socket:
        env["UMCTL_RT_SOCKET"] = str(socket)
    if managed:
        env["UMCTL_RT_MANAGED"] = "1"
    if hum:
        env["UMCTL_RT_HUM"] = "1"
    for k, v in extra.items():
        env["UMCTL_RT_" + k.upper()] = str(v)
    return env


__all__ = ["LIBRARY", "library_path", "child_env"]
