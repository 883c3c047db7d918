"""Finding a process's UVM state and borrowing it: /proc scanning, pidfd duplication of the
target's /dev/nvidia-uvm fds, and the processor UUID table.

Why duplication: a tools event tracker is bound to a va_space, and the only handle on a
va_space is an open /dev/nvidia-uvm file of the process that created it. pidfd_getfd
(Linux 5.6) gives us our own fd on that same open file -- without stopping, ptracing or
modifying the target -- and needs PTRACE_MODE_ATTACH rights over it, hence ``sudo`` (or
CAP_SYS_PTRACE, or being its parent under Yama ptrace_scope 1, which is how ``umctl run``
works unprivileged). CUDA opens /dev/nvidia-uvm more than once (the va_space and an mm fd);
the tracker init returns NV_ERR_ILLEGAL_ACTION for fds that are not a va_space, so we try
each until one returns NV_OK.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Callable, Container

import numpy as np

from .. import UmctlError
from ..units import CPU
from . import abi

UVM_DEVICE = "/dev/nvidia-uvm"
#: Where /proc is (tests point it at a fake tree).
PROC_ROOT = "/proc"


class LiveError(UmctlError):
    """Attaching to or observing a live process failed."""

    exit_code = 2


class NoSuchProcess(LiveError):
    exit_code = 3


class NoUvm(LiveError):
    exit_code = 4


class NoPermission(LiveError):
    exit_code = 5


class NoDriver(LiveError):
    exit_code = 6


class TargetExited(LiveError):
    exit_code = 7


class TrackerError(LiveError):
    """The driver refused a tracker operation for a reason other than the ones above."""

    exit_code = 8


def _is_root() -> bool:
    return os.geteuid() == 0


def permission_hint() -> str:
    return "run as root (sudo umctl ...) or grant CAP_SYS_PTRACE" if not _is_root() else \
        "ptrace access was denied (Yama ptrace_scope 3, a container without CAP_SYS_PTRACE, or an LSM)"


def process_alive(pid: int, proc_root: str | None = None) -> bool:
    """Exists and is not a zombie."""
    proc_root = proc_root or PROC_ROOT
    try:
        with open(f"{proc_root}/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return False
    except OSError:
        return True
    state = stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3]
    return state not in (b"Z", b"X")


def uvm_fds(pid: int, proc_root: str | None = None) -> list[int]:
    """Target fds that point at /dev/nvidia-uvm (not -tools), ascending. Raises NoSuchProcess,
    NoPermission (cannot read the fd table); an empty list means CUDA is not (yet) set up."""
    proc_root = proc_root or PROC_ROOT
    if pid <= 0 or not os.path.isdir(f"{proc_root}/{pid}"):
        raise NoSuchProcess(f"no process with pid {pid}")
    d = f"{proc_root}/{pid}/fd"
    try:
        names = os.listdir(d)
    except PermissionError as e:
        raise NoPermission(f"cannot read {d}: {permission_hint()}") from e
    except FileNotFoundError as e:
        raise TargetExited(f"process {pid} exited") from e
    out = []
    for name in names:
        try:
            if os.readlink(f"{d}/{name}") == UVM_DEVICE:
                out.append(int(name))
        except (OSError, ValueError):
            continue  # closed meanwhile
    return sorted(out)


def comm_of(pid: int, proc_root: str | None = None) -> str:
    proc_root = proc_root or PROC_ROOT
    try:
        with open(f"{proc_root}/{pid}/comm", encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return "?"


def cmdline_of(pid: int, proc_root: str | None = None) -> str:
    proc_root = proc_root or PROC_ROOT
    try:
        with open(f"{proc_root}/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return ""


@dataclass
class UvmProcess:
    pid: int
    comm: str
    cmdline: str
    fds: list[int] = field(default_factory=list)


def list_uvm_processes(proc_root: str | None = None, skip: Container[int] = ()) -> tuple[list[UvmProcess], int]:
    """Every process with /dev/nvidia-uvm open, and how many processes' fd tables could not
    be read (non-root sees only its own: top says so rather than showing an empty list).
    ``skip``: pids not to look at (the exporter's attached ones: their fd tables are the
    scan's cost, and it knows them already)."""
    proc_root = proc_root or PROC_ROOT
    found: list[UvmProcess] = []
    hidden = 0
    me = os.getpid()
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return [], 0
    for name in entries:
        if not name.isdigit() or int(name) == me or int(name) in skip:
            continue
        pid = int(name)
        try:
            fds = uvm_fds(pid, proc_root)
        except NoPermission:
            hidden += 1
            continue
        except LiveError:
            continue
        if fds:
            found.append(UvmProcess(pid, comm_of(pid, proc_root), cmdline_of(pid, proc_root), fds))
    return sorted(found, key=lambda p: p.pid), hidden


@dataclass
class Borrowed:
    """The target's va_space fd, duplicated into this process, and its pidfd."""

    pid: int
    pidfd: int
    va_fd: int
    target_fd: int
    tried: list[tuple[int, str]]


def borrow_va_space(pid: int, io: abi.Ioctl, try_fd: Callable[[int], int], proc_root: str | None = None) -> Borrowed:
    """Duplicate each of the target's /dev/nvidia-uvm fds and call ``try_fd(dup)`` (it
    initialises a tracker and returns the NV_STATUS) until one returns NV_OK; the other
    duplicates are closed. Raises NoSuchProcess / NoUvm / NoPermission / TargetExited /
    TrackerError with a one-line reason."""
    proc_root = proc_root or PROC_ROOT
    fds = uvm_fds(pid, proc_root)
    if not fds:
        raise NoUvm(f"process {pid} ({comm_of(pid, proc_root)}) has no {UVM_DEVICE} open: it has not "
                    "initialised CUDA (or uses no UVM); try again after its first CUDA call")
    try:
        pidfd = io.pidfd_open(pid)
    except OSError as e:
        if e.errno == errno.ESRCH:
            raise TargetExited(f"process {pid} exited") from e
        if e.errno in (errno.EPERM, errno.EACCES):
            raise NoPermission(f"pidfd_open({pid}) refused: {permission_hint()}") from e
        if e.errno == errno.ENOSYS:
            raise LiveError("this kernel has no pidfd_open (Linux >= 5.6 needed)") from e
        raise LiveError(f"pidfd_open({pid}) failed: {e.strerror or e}") from e
    tried: list[tuple[int, str]] = []
    try:
        for fd in fds:
            try:
                dup = io.pidfd_getfd(pidfd, fd)
            except OSError as e:
                if e.errno in (errno.EPERM, errno.EACCES):
                    raise NoPermission(f"cannot duplicate fd {fd} of process {pid} (pidfd_getfd: "
                                       f"{os.strerror(e.errno)}): {permission_hint()}") from e
                if e.errno == errno.ESRCH:
                    raise TargetExited(f"process {pid} exited while attaching") from e
                if e.errno == errno.ENOSYS:
                    raise LiveError("this kernel has no pidfd_getfd (Linux >= 5.6 needed)") from e
                tried.append((fd, f"pidfd_getfd: {os.strerror(e.errno or 0)}"))
                continue  # EBADF: closed meanwhile
            try:
                status = try_fd(dup)
            except BaseException:
                io.close(dup)
                raise
            tried.append((fd, abi.nv_status_name(status)))
            if status == abi.NV_OK:
                return Borrowed(pid, pidfd, dup, fd, tried)
            io.close(dup)
    except BaseException:
        io.close(pidfd)
        raise
    exited = io.process_exited(pidfd)
    io.close(pidfd)
    if exited:
        raise TargetExited(f"process {pid} exited while attaching")
    detail = ", ".join(f"fd {fd}: {s}" for fd, s in tried)
    raise NoUvm(f"process {pid} has {UVM_DEVICE} open but the driver accepted no event tracker on it ({detail})")


def processor_uuid_table(io: abi.Ioctl, va_fd: int) -> dict[int, bytes]:
    """UVM processor id -> 16-byte UUID (ioctl 77 on the va_space fd); id 0 is the CPU."""
    import ctypes as C

    table = (abi.NvProcessorUuid * abi.UVM_ID_MAX_PROCESSORS)()
    p = abi.U64Params(value=C.addressof(table))
    try:
        status = io.ioctl(va_fd, abi.UVM_TOOLS_GET_PROCESSOR_UUID_TABLE_V2, p)
    except OSError as e:
        raise TrackerError(f"processor UUID table: {e}") from e
    if status != abi.NV_OK:
        raise TrackerError(f"processor UUID table: {abi.nv_status_name(status)}")
    return {i: bytes(table[i].uuid) for i in range(abi.UVM_ID_MAX_PROCESSORS)
            if i == abi.UVM_CPU_INDEX or any(table[i].uuid)}


def uuid_str(b: bytes) -> str:
    h = b.hex()
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def nvidia_smi_gpus() -> list[dict]:
    """[{index, uuid, name, memory_bytes}] from nvidia-smi, [] when it is missing or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        p = subprocess.run([exe, "--query-gpu=index,uuid,name,memory.total", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return []
    out = []
    for line in p.stdout.splitlines() if p.returncode == 0 else []:
        parts = [x.strip() for x in line.split(",")]
        if len(parts) < 4:
            continue
        try:
            out.append({"index": int(parts[0]), "uuid": parts[1], "name": ",".join(parts[2:-1]),
                        "memory_bytes": int(float(parts[-1])) << 20})  # nounits: MiB
        except ValueError:
            continue
    return out


def processor_map(table: dict[int, bytes], smi: list[dict] | None = None) -> tuple[np.ndarray, list[dict]]:
    """UVM processor id -> our processor number (CPU -> -1, GPUs -> 0..N-1), and the GPUs in
    our numbering ({gpu, uvm_id, uuid, name?, memory_bytes?}). GPUs are numbered as nvidia-smi
    numbers them when their UUIDs are found there, so ``gpu`` agrees with the tools users
    already know; the rest follow in UVM id order."""
    m = np.full(abi.UVM_ID_MAX_PROCESSORS, -2, dtype=np.int16)
    m[abi.UVM_CPU_INDEX] = CPU
    by_uuid = {g["uuid"].lower(): g for g in smi or []}
    gpu_ids = sorted(i for i in table if i != abi.UVM_CPU_INDEX)
    known = sorted((by_uuid[uuid_str(table[i]).lower()]["index"], i) for i in gpu_ids
                   if uuid_str(table[i]).lower() in by_uuid)
    order = [i for _, i in known] + [i for i in gpu_ids if i not in {j for _, j in known}]
    gpus = []
    for n, i in enumerate(order):
        m[i] = n
        info = by_uuid.get(uuid_str(table[i]).lower(), {})
        gpus.append({"gpu": n, "uvm_id": i, "uuid": uuid_str(table[i]), "name": info.get("name"),
                     "memory_bytes": info.get("memory_bytes")})
    return m, gpus
