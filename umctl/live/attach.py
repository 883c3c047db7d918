"""Getting a live session's parts: a source attached to a process, the sampling rule, and a
program started under umctl (optionally with its in-process runtime, which then is the launch
source)."""

from __future__ import annotations

import subprocess
import time

from .. import UmctlError
from ..events.schema import Kind
from .spec import ControlSpec

#: the live sources ``--source`` names
SOURCES = ("uvmtools", "kprobe")


def resolve_sample(sample: str | None, *, recording: bool, control: bool) -> float:
    """The ``--sample`` fraction: unset is 10 % for a view and every event for a trace or a
    controller; an explicit value below 1 with a trace or a controller is refused (it would lose
    data silently)."""
    from ..sources.uvmtools.sampling import VIEW_SAMPLE, parse_sample

    if sample is None:
        return 1.0 if (recording or control) else VIEW_SAMPLE
    v = parse_sample(sample)
    if v < 1 and (recording or control):
        raise UmctlError("--sample below 1 is for viewing only: a trace (-o) or a controller (--mode) needs "
                         "every event")
    return v


def attach_source(pid: int, kinds: str = "default", ring_entries: int = 2 ** 18, flush_ms: float | None = None,
                  control: ControlSpec | None = None, source: str = "uvmtools", sample: float = 1.0):
    """A started source on ``pid``: the tools API with ``kinds`` (plus what the controller
    subscribes to), or BPF on the fault path."""
    if source not in SOURCES:
        raise UmctlError(f"unknown source {source!r} (choose from {', '.join(SOURCES)})")
    if source == "kprobe":
        from ..sources.kprobes import KprobeSource

        return KprobeSource([pid]).start()
    from ..sources.uvmtools import UvmToolsSource, parse_kinds

    kind_set = parse_kinds(kinds)
    if control is not None:
        kind_set = kind_set | control.source_kinds()
    if flush_ms is None:
        # The driver defers Migration events (100-400 ms late without a flush); fault events
        # reach the ring as they are recorded. A flush costs ~190 us of driver time (H100),
        # so it runs only where something needs it: migrations on, or a controller waiting.
        flush_ms = 5.0 if (Kind.MIGRATION in kind_set or control is not None) else 0.0
    return UvmToolsSource(pid, kind_set, ring_entries=ring_entries, flush_ms=flush_ms, sample=sample).start()


def wait_for_cuda(child: subprocess.Popen, timeout: float | None) -> None:
    """Poll the child's fd table until /dev/nvidia-uvm appears (its first CUDA use) or it exits."""
    from ..sources.uvmtools import LiveError, NoUvm
    from ..driver.process import uvm_fds

    t0 = time.monotonic()
    while True:
        if child.poll() is not None:
            raise NoUvm(f"{child.args[0] if isinstance(child.args, list) else child.args} exited (status "
                        f"{child.returncode}) without using CUDA Unified Memory; nothing recorded")
        try:
            if uvm_fds(child.pid):
                return
        except LiveError:
            pass
        if timeout is not None and time.monotonic() - t0 > timeout:
            raise NoUvm(f"process {child.pid} did not open /dev/nvidia-uvm within {timeout:g} s")
        time.sleep(0.001)


def attach_child(child: subprocess.Popen, kinds: str, control: ControlSpec | None, wait_cuda: float | None):
    """A tools-API source on a program umctl started, from its first CUDA use."""
    from ..sources.uvmtools import NoUvm

    wait_for_cuda(child, wait_cuda)
    deadline = time.monotonic() + 5.0
    while True:  # the fd exists a moment before CUDA has set up its va_space
        try:
            return attach_source(child.pid, kinds, 2 ** 18, None, control)
        except NoUvm:
            if child.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.002)


def start_program(cmd: list[str], *, control: ControlSpec | None, runtime: bool, managed: bool, hum: bool,
                  evict_each: bool = False):
    """Start ``cmd``; under umctl's runtime (``runtime``/``managed``/``hum``, or a mode that
    spreads over GPUs) also the runtime's report socket, returned as the launch source.
    ``evict_each``: all managed memory goes home after every kernel (runtime/rt_interpose.c,
    *complete access sets*). Returns (child, runtime source or None)."""
    rt_extra: dict[str, str] = {"evict_each": "1"} if evict_each else {}
    if control is not None and control.gpus is not None:
        # SnuRHAC's runtime: cudaMalloc becomes managed memory that every GPU reaches, and the
        # runtime partitions the convention's kernels over the GPUs
        runtime = managed = True
        rt_extra["gpus"] = str(control.gpus)
    if control is not None and control.use_runtime_admission(runtime or managed or hum):
        # the budget holds by admission (loop/residency.py, *Admission*): misses are read from
        # the host, or with --spare-gpus from the neighbours' memory (runtime/rt_alloc.c)
        spare = control.prefer_gpus()
        if spare:
            rt_extra["prefer_gpus"] = ",".join(map(str, spare))
        else:
            rt_extra["prefer_host"] = "1"
    rt_source = None
    env = None
    if runtime or managed or hum:
        from ..runtime import child_env
        from ..sources.runtime import RuntimeSource

        # A controller wants launches when the kernel starts (DeepUM's execution-ID
        # transitions): the runtime then also reports kernel ends (runtime/README.md)
        starts = control is not None or evict_each   # --complete-accesses: kernel durations, not gaps
        # (the gap after a kernel there is mostly the eviction that follows it)
        rt_source = RuntimeSource(kernel_starts=starts)
        rt_source.start()
        if control is not None and control.controller.live_invalidates():
            rt_extra["control"] = "1"   # the runtime takes umctl's safe-discard requests
        env = child_env(socket=rt_source.path, managed=managed, hum=hum, **({"track_end": "1"} if starts else {}),
                        **rt_extra)
    try:
        return subprocess.Popen(cmd, env=env), rt_source
    except OSError as e:
        if rt_source is not None:
            rt_source.close()
        raise UmctlError(f"cannot start {cmd[0]}: {e.strerror or e}") from e
