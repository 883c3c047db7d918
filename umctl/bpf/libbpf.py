"""A minimal ctypes binding of libbpf 1.x: what umctl needs to run prebuilt BPF objects.

Why our own binding: bcc compiles at run time and needs kernel headers (absent on the GPU
machine and in CI), and the libbpf Python packages are either bcc or unmaintained. libbpf 1.x
is a stable C ABI shipped by the distributions (Debian/Ubuntu ``libbpf1``), so a few dozen
ctypes declarations give us open/load/attach/ring buffer with no build step.

Scope: open an object file (optionally with a custom BTF for CO-RE), choose which programs load,
load it, find programs and maps by name, attach uprobes by symbol name
(``bpf_program__attach_uprobe_opts`` with ``func_name``, ``retprobe`` and ``bpf_cookie``),
kprobes by kernel function name and any program by its section (fentry/fexit),
BPF ring buffers, map lookup/update, and destroying links and objects. Every failure becomes a
one-line :class:`umctl.UmctlError` naming the errno (``EPERM``, ``ENOENT``...), with libbpf's
own last warning attached when it printed one.

libbpf 1.x reports failures by returning NULL / a negative errno and setting ``errno``
("libbpf 1.0 mode", the default since 1.0), which is what the checks below rely on.
"""

from __future__ import annotations

import ctypes as C
import errno as _errno
import os
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path

from .. import UmctlError

INSTALL_HINT = "install libbpf1 (Debian/Ubuntu) or point UMCTL_LIBBPF at a libbpf.so.1"

_lib: C.CDLL | None = None
_lib_lock = threading.Lock()
_messages: deque[str] = deque(maxlen=16)   # libbpf's recent warnings, for error messages


class UprobeOpts(C.Structure):
    """``struct bpf_uprobe_opts`` as of libbpf 1.1 (sz = 40). Newer libbpf versions append
    fields and accept the older, smaller ``sz`` — which is why we pass ours and no more."""

    _fields_ = [("sz", C.c_size_t), ("ref_ctr_offset", C.c_size_t), ("bpf_cookie", C.c_uint64),
                ("retprobe", C.c_bool), ("func_name", C.c_char_p)]


class ObjectOpenOpts(C.Structure):
    """``struct bpf_object_open_opts`` as of libbpf 1.1 (sz = 80); the fields after
    ``btf_custom_path`` (kernel log buffer) are left zero."""

    _fields_ = [("sz", C.c_size_t), ("object_name", C.c_char_p), ("relaxed_maps", C.c_bool),
                ("pin_root_path", C.c_char_p), ("_removed_attach_prog_fd", C.c_uint32),
                ("kconfig", C.c_char_p), ("btf_custom_path", C.c_char_p),
                ("kernel_log_buf", C.c_char_p), ("kernel_log_size", C.c_size_t),
                ("kernel_log_level", C.c_uint32)]


#: int (*ring_buffer_sample_fn)(void *ctx, void *data, size_t size)
SAMPLE_FN = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_void_p, C.c_size_t)
#: int (*libbpf_print_fn_t)(enum libbpf_print_level, const char *fmt, va_list ap)
PRINT_FN = C.CFUNCTYPE(C.c_int, C.c_int, C.c_char_p, C.c_void_p)

_libc = C.CDLL(None, use_errno=True)
_libc.vsnprintf.argtypes = [C.c_char_p, C.c_size_t, C.c_char_p, C.c_void_p]
_libc.vsnprintf.restype = C.c_int


#: kernel-internal errnos that reach user space from bpf() (not in the errno module)
_KERNEL_ERRNOS = {524: ("ENOTSUPP", "operation not supported by this kernel")}


def errno_name(err: int) -> str:
    """``EPERM`` for 1, etc.; the number when the errno is unknown."""
    if abs(err) in _KERNEL_ERRNOS:
        return _KERNEL_ERRNOS[abs(err)][0]
    return _errno.errorcode.get(abs(err), f"errno {abs(err)}")


def error(what: str, err: int) -> UmctlError:
    """One-line UmctlError for a failed libbpf call: what failed, the errno name, its meaning,
    a hint where one helps (permission), and libbpf's last warning, if any."""
    err = abs(err) or _errno.EIO
    why = _KERNEL_ERRNOS[err][1] if err in _KERNEL_ERRNOS else os.strerror(err)
    msg = f"{what}: {errno_name(err)} ({why})"
    if err in (_errno.EPERM, _errno.EACCES):
        msg += "; BPF needs root (or CAP_BPF + CAP_PERFMON)"
    last = _messages[-1] if _messages else ""
    if last and err not in (_errno.EPERM, _errno.EACCES):
        msg += f" [{last if last.startswith('libbpf') else 'libbpf: ' + last}]"
    _messages.clear()
    return UmctlError(msg)


@PRINT_FN
def _print(level: int, fmt: bytes, ap: int) -> int:
    """libbpf's log goes to stderr by default; keep it instead (libbpf is chatty about optional
    probes that do not attach) and quote the last warning in our error messages. On x86-64 and
    arm64 a va_list argument arrives as a pointer, which vsnprintf takes as is."""
    buf = C.create_string_buffer(512)
    _libc.vsnprintf(buf, len(buf), fmt, ap)
    text = buf.value.decode(errors="replace").strip()
    if text and level <= 1:   # LIBBPF_WARN = 0, LIBBPF_INFO = 1, LIBBPF_DEBUG = 2
        _messages.append(text)
    return 0


def _declare(lib: C.CDLL) -> None:
    vp, cp, i, u32, u64, sz = C.c_void_p, C.c_char_p, C.c_int, C.c_uint32, C.c_uint64, C.c_size_t
    sigs: dict[str, tuple[object, list]] = {
        "libbpf_set_print": (vp, [PRINT_FN]),
        "libbpf_major_version": (u32, []),
        "libbpf_minor_version": (u32, []),
        "bpf_object__open_file": (vp, [cp, vp]),
        "bpf_object__next_program": (vp, [vp, vp]),
        "bpf_program__name": (cp, [vp]),
        "bpf_program__section_name": (cp, [vp]),
        "bpf_program__set_autoload": (i, [vp, C.c_bool]),
        "bpf_program__attach": (vp, [vp]),
        "bpf_program__attach_kprobe": (vp, [vp, C.c_bool, cp]),
        "bpf_object__load": (i, [vp]),
        "bpf_object__close": (None, [vp]),
        "bpf_object__find_program_by_name": (vp, [vp, cp]),
        "bpf_object__find_map_fd_by_name": (i, [vp, cp]),
        "bpf_program__attach_uprobe_opts": (vp, [vp, i, cp, sz, C.POINTER(UprobeOpts)]),
        "bpf_link__destroy": (i, [vp]),
        "bpf_map_update_elem": (i, [i, vp, vp, u64]),
        "bpf_map_lookup_elem": (i, [i, vp, vp]),
        "bpf_map_delete_elem": (i, [i, vp]),
        "ring_buffer__new": (vp, [i, SAMPLE_FN, vp, vp]),
        "ring_buffer__poll": (i, [vp, i]),
        "ring_buffer__consume": (i, [vp]),
        "ring_buffer__free": (None, [vp]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args


def libbpf() -> C.CDLL:
    """The process-wide libbpf handle, loaded on first use.

    ``UMCTL_LIBBPF`` may name the library file (e.g. one carried to a machine where libbpf is
    not installed); a ``libelf.so.1`` next to it is loaded first so that its dependency resolves
    without LD_LIBRARY_PATH. Raises UmctlError with the install hint when none can be loaded."""
    global _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        path = os.environ.get("UMCTL_LIBBPF") or "libbpf.so.1"
        if os.sep in path:
            elf = Path(path).parent / "libelf.so.1"
            if elf.is_file():
                try:
                    C.CDLL(str(elf), mode=C.RTLD_GLOBAL)
                except OSError:
                    pass
        try:
            lib = C.CDLL(path, use_errno=True)
        except OSError as e:
            raise UmctlError(f"cannot load {path} ({str(e).split(':')[-1].strip()}): {INSTALL_HINT}") from None
        try:
            _declare(lib)
        except AttributeError as e:
            raise UmctlError(f"{path} is not libbpf >= 1.1 (missing {e.args[0].split()[-1]}): {INSTALL_HINT}") from None
        lib.libbpf_set_print(_print)
        _lib = lib
        return lib


def _last_errno() -> int:
    return C.get_errno() or _errno.EIO


class Link:
    """An attached program (a bpf_link); :meth:`destroy` detaches it."""

    def __init__(self, ptr: int, what: str) -> None:
        self._ptr: int | None = ptr
        self.what = what

    def destroy(self) -> None:
        if self._ptr:
            libbpf().bpf_link__destroy(self._ptr)
            self._ptr = None


class BpfObject:
    """One opened (and, after :meth:`load`, loaded) BPF object file."""

    def __init__(self, path: str | os.PathLike[str], *, btf_custom_path: str | None = None) -> None:
        """``btf_custom_path``: resolve CO-RE relocations against this BTF file instead of the
        running kernel's (a test against a driver's BTF that this kernel does not have)."""
        lib = libbpf()
        self.path = str(path)
        if not os.path.isfile(self.path):
            raise UmctlError(f"BPF object {self.path} not found")
        opts = None
        if btf_custom_path is not None:
            if not os.path.isfile(btf_custom_path):
                raise UmctlError(f"BTF file {btf_custom_path} not found")
            self._opts = ObjectOpenOpts(sz=C.sizeof(ObjectOpenOpts), btf_custom_path=str(btf_custom_path).encode())
            opts = C.byref(self._opts)
        C.set_errno(0)
        ptr = lib.bpf_object__open_file(self.path.encode(), opts)
        if not ptr:
            raise error(f"cannot open BPF object {os.path.basename(self.path)}", _last_errno())
        self._ptr: int | None = ptr
        self.loaded = False

    def _obj(self) -> int:
        if not self._ptr:
            raise UmctlError(f"BPF object {os.path.basename(self.path)} is closed")
        return self._ptr

    def load(self) -> None:
        """Verify and load every program and create the maps (needs root / CAP_BPF)."""
        C.set_errno(0)
        rc = libbpf().bpf_object__load(self._obj())
        if rc:
            raise error(f"cannot load BPF object {os.path.basename(self.path)}", rc if rc < 0 else _last_errno())
        self.loaded = True

    def program(self, name: str) -> int:
        """The ``struct bpf_program *`` called ``name`` (the C function name)."""
        p = libbpf().bpf_object__find_program_by_name(self._obj(), name.encode())
        if not p:
            raise UmctlError(f"BPF object {os.path.basename(self.path)} has no program {name}")
        return p

    def programs(self) -> list[tuple[str, str]]:
        """(name, section) of every program in the object."""
        lib, out, p = libbpf(), [], None
        while True:
            p = lib.bpf_object__next_program(self._obj(), p)
            if not p:
                return out
            out.append((lib.bpf_program__name(p).decode(), lib.bpf_program__section_name(p).decode()))

    def set_autoload(self, name: str, autoload: bool) -> None:
        """Whether :meth:`load` loads program ``name`` (before load only)."""
        rc = libbpf().bpf_program__set_autoload(self.program(name), autoload)
        if rc:
            raise error(f"cannot set autoload of {name}", rc)

    def attach(self, program: str) -> Link:
        """Attach ``program`` as its section says (fentry/fexit/kprobe with a target name)."""
        C.set_errno(0)
        ptr = libbpf().bpf_program__attach(self.program(program))
        if not ptr:
            raise error(f"cannot attach {program}", _last_errno())
        return Link(ptr, program)

    def attach_kprobe(self, program: str, func_name: str, *, retprobe: bool = False) -> Link:
        """Attach ``program`` as a kprobe (or kretprobe) on kernel function ``func_name``
        (vmlinux or any loaded module)."""
        C.set_errno(0)
        ptr = libbpf().bpf_program__attach_kprobe(self.program(program), retprobe, func_name.encode())
        what = f"{'kretprobe' if retprobe else 'kprobe'} {func_name}"
        if not ptr:
            raise error(f"cannot attach {what}", _last_errno())
        return Link(ptr, what)

    def map_fd(self, name: str) -> int:
        """File descriptor of the map ``name`` (the object must be loaded)."""
        fd = libbpf().bpf_object__find_map_fd_by_name(self._obj(), name.encode())
        if fd < 0:
            raise error(f"BPF map {name}", fd)
        return fd

    def attach_uprobe(self, program: str, binary: str, func_name: str, *, pid: int = -1,
                      retprobe: bool = False, cookie: int = 0) -> Link:
        """Attach ``program`` as a uprobe (or uretprobe) on symbol ``func_name`` of the ELF file
        ``binary``; ``pid`` -1 means every process mapping it, else only that one. ``cookie`` is
        what the program reads with bpf_get_attach_cookie()."""
        opts = UprobeOpts(sz=C.sizeof(UprobeOpts), ref_ctr_offset=0, bpf_cookie=cookie,
                          retprobe=retprobe, func_name=func_name.encode())
        C.set_errno(0)
        ptr = libbpf().bpf_program__attach_uprobe_opts(self.program(program), pid, binary.encode(), 0,
                                                       C.byref(opts))
        what = f"{'uretprobe' if retprobe else 'uprobe'} {os.path.basename(binary)}:{func_name}"
        if not ptr:
            raise error(f"cannot attach {what}", _last_errno())
        return Link(ptr, what)

    def close(self) -> None:
        """Unload programs and maps (links must be destroyed first)."""
        if self._ptr:
            libbpf().bpf_object__close(self._ptr)
            self._ptr = None


def map_update(fd: int, key: C._CData, value: C._CData, flags: int = 0) -> None:
    rc = libbpf().bpf_map_update_elem(fd, C.byref(key), C.byref(value), flags)
    if rc:
        raise error("BPF map update", rc)


def map_lookup(fd: int, key: C._CData, value: C._CData) -> bool:
    """Fill ``value`` with the entry for ``key``; False when there is none."""
    return libbpf().bpf_map_lookup_elem(fd, C.byref(key), C.byref(value)) == 0


def map_delete(fd: int, key: C._CData) -> bool:
    return libbpf().bpf_map_delete_elem(fd, C.byref(key)) == 0


def possible_cpus() -> int:
    """Slots in a per-CPU map value: the kernel sizes them by *possible* CPUs, which may exceed
    the online count that os.cpu_count() gives."""
    n = os.cpu_count() or 1
    try:
        with open("/sys/devices/system/cpu/possible") as fh:
            n = max(int(r.split("-")[-1]) for r in fh.read().strip().split(",")) + 1
    except (OSError, ValueError):
        pass
    return n


def percpu_counters(fd: int, names: tuple[str, ...]) -> dict[str, int]:
    """A BPF_MAP_TYPE_PERCPU_ARRAY of u64 counters, summed over CPUs, index i named names[i]."""
    ncpu = possible_cpus()
    out = {}
    for i, name in enumerate(names):
        vals = (C.c_uint64 * ncpu)()
        libbpf().bpf_map_lookup_elem(fd, C.byref(C.c_uint32(i)), vals)
        out[name] = int(sum(vals))
    return out


class RingBuffer:
    """A BPF_MAP_TYPE_RINGBUF reader. ``callback(data: bytes)`` runs once per record inside
    :meth:`poll` / :meth:`consume`, on the calling thread (ctypes drops the GIL while libbpf
    waits in epoll, so a polling thread does not stall the interpreter)."""

    def __init__(self, map_fd: int, callback: Callable[[bytes], None]) -> None:
        def sample(_ctx: int | None, data: int, size: int) -> int:
            try:
                callback(C.string_at(data, size))
            except Exception:  # noqa: BLE001 - an exception must not cross the C frame
                self.callback_errors += 1
            return 0

        self.callback_errors = 0
        self._cb = SAMPLE_FN(sample)   # keep a reference: libbpf holds the raw pointer
        C.set_errno(0)
        ptr = libbpf().ring_buffer__new(map_fd, self._cb, None, None)
        if not ptr:
            raise error("cannot create BPF ring buffer", _last_errno())
        self._ptr: int | None = ptr

    def poll(self, timeout_ms: int) -> int:
        """Wait up to ``timeout_ms`` for records and consume what is there; returns the count
        (EINTR counts as 0: a signal to our process is not an error of the ring)."""
        if not self._ptr:
            return 0
        n = libbpf().ring_buffer__poll(self._ptr, timeout_ms)
        if n == -_errno.EINTR:
            return 0
        if n < 0:
            raise error("BPF ring buffer poll", n)
        return n

    def poll_until(self, stop, timeout_ms: int) -> BaseException | None:
        """Poll until ``stop`` (a threading.Event) is set: the body of a source's poll thread.
        Returns the exception that ended it instead of raising, so the source can report it
        from its next drain() on the caller's thread."""
        try:
            while not stop.is_set():
                self.poll(timeout_ms)
        except BaseException as e:  # noqa: BLE001
            return e
        return None

    def finish(self, stop, thread) -> None:
        """End the poll thread running :meth:`poll_until` (set ``stop``, join ``thread``), then
        consume what the ring still holds, so the source's next drain() has the last records."""
        stop.set()
        if thread is not None:
            thread.join()
        try:
            self.consume()
        except Exception:  # noqa: BLE001 - closing: the records are lost either way
            pass

    def consume(self) -> int:
        """Consume what is there now, without waiting."""
        if not self._ptr:
            return 0
        n = libbpf().ring_buffer__consume(self._ptr)
        if n < 0:
            raise error("BPF ring buffer consume", n)
        return n

    def free(self) -> None:
        if self._ptr:
            libbpf().ring_buffer__free(self._ptr)
            self._ptr = None
