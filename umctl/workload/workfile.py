"""``.umw``: a :class:`~umctl.workload.workload.Workload` in a file, exactly as built.

A captured model (``umctl capture``) is a workload with kernel times, the allocator's blocks
and MEM events, which a Parquet trace would turn back into events and lose (kernel times of
recorded traces are re-derived, allocator blocks become allocations). This format keeps every
array of the workload as it is: an uncompressed-zip ``.npz`` (numpy's own container, no pickle)
holding the op table, the allocations, the access stream as runs, the name table and the
metadata as JSON, plus a format tag and version. Loading checks all of it and the workload's own
consistency (``Workload.validate``); anything wrong is one line naming the file.
"""

from __future__ import annotations

import json
import os
import zipfile

import numpy as np

from .. import UmctlError
from .workload import ALLOCATION_DTYPE, OP_DTYPE, AccessRuns, Workload

SUFFIX = ".umw"
FORMAT = "umctl-workload"
VERSION = 1
_MAGIC = b"PK\x03\x04"
#: the smallest GPU a captured workload replays on (one 2 MiB block: the allocator's segments)
MIN_GPU_MEM = 2 << 20


def is_workfile(target: str) -> bool:
    """A workload file by its suffix (what ``umctl replay`` takes for one)."""
    return target.lower().endswith(SUFFIX)


def _text(obj) -> np.ndarray:
    return np.frombuffer(json.dumps(obj, default=_jsonable).encode(), dtype=np.uint8)


def _jsonable(x):
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, (set, tuple)):
        return list(x)
    return str(x)


def save(w: Workload, path: str) -> None:
    """Write ``w`` to ``path`` (written to ``path.partial`` and renamed, so a reader never sees
    half a file). Thread-block tables (multi-GPU scenarios) are not kept: refused."""
    if w.thread_blocks:
        raise ValueError("a workload with thread-block tables cannot be saved as .umw")
    runs = w.acc_runs
    arrays = {
        "format": _text({"format": FORMAT, "version": VERSION}),
        "ops": w.ops, "allocations": w.allocations,
        "run_page": runs.page, "run_length": runs.length, "run_write": runs.write,
        "names": _text(list(w.names)),
        "info": _text({"name": w.name, "n_gpus": int(w.n_gpus), "gpu_mem": [int(x) for x in w.gpu_mem],
                       "params": w.params, "meta": w.meta}),
    }
    if w.acc_win is not None:
        arrays["acc_win"] = np.asarray(w.acc_win)
    tmp = path + ".partial"
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
    os.replace(tmp, path)


def load(path: str) -> Workload:
    """The workload in ``path``; UmctlError (one line) for a file that is missing, not a
    workload file, of another version, or inconsistent."""
    if not os.path.exists(path):
        raise UmctlError(f"{path}: no such file")
    if os.path.isdir(path) or not os.path.isfile(path):
        raise UmctlError(f"{path}: not a regular file")
    try:
        with open(path, "rb") as f:
            if f.read(4) != _MAGIC:
                raise UmctlError(f"{path}: not a umctl workload file (made by `umctl capture`)")
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
    except UmctlError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError, KeyError) as e:
        raise UmctlError(f"{path}: not a readable umctl workload file ({_why(e)})") from None
    try:
        return _from_arrays(data)
    except (KeyError, ValueError, TypeError, AttributeError, IndexError, OverflowError) as e:
        raise UmctlError(f"{path}: corrupt umctl workload file ({_why(e)})") from None


def _why(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text[:200]


def _array(data: dict, key: str) -> np.ndarray:
    a = data[key]
    if not isinstance(a, np.ndarray) or a.ndim != 1:
        raise ValueError(f"{key} is not an array")
    return a


def _json(data: dict, key: str):
    a = _array(data, key)
    if a.dtype != np.uint8:
        raise ValueError(f"{key} is not text")
    try:
        return json.loads(a.tobytes().decode())
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError(f"{key} is not JSON") from None


def _from_arrays(data: dict) -> Workload:
    tag = _json(data, "format")
    if not isinstance(tag, dict) or tag.get("format") != FORMAT:
        raise ValueError("no umctl workload format tag")
    if type(tag.get("version")) is not int or tag.get("version") != VERSION:
        raise ValueError(f"format version {tag.get('version')!r}, this umctl reads {VERSION}")
    ops, allocs = _array(data, "ops"), _array(data, "allocations")
    if ops.dtype != OP_DTYPE or ops.ndim != 1:
        raise ValueError("the op table has the wrong columns")
    if allocs.dtype != ALLOCATION_DTYPE or allocs.ndim != 1:
        raise ValueError("the allocation table has the wrong columns")
    page, length, write = _array(data, "run_page"), _array(data, "run_length"), _array(data, "run_write")
    if page.dtype != np.int64 or length.dtype != np.int64 or write.dtype != np.bool_:
        raise ValueError("the access runs have the wrong types")
    runs = AccessRuns(page, length, write)   # ValueError: lengths differ, an empty run
    if len(page) and page.min() < 0:
        raise ValueError("an access run starts at a negative page")
    names = _json(data, "names")
    info = _json(data, "info")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError("the name table is not a list of names")
    if not isinstance(info, dict) or not isinstance(info.get("name"), str):
        raise ValueError("no workload name")
    for col in ("name_id",):
        ids = np.concatenate([ops[col], allocs[col]])
        if len(ids) and (ids.max() >= len(names) or ids.min() < -1):
            raise ValueError("an op or allocation names no entry of the name table")
    gpu_mem = info.get("gpu_mem")
    n_gpus = info.get("n_gpus")
    if (type(n_gpus) is not int or not isinstance(gpu_mem, list)
            or not all(type(x) is int and x > 0 for x in gpu_mem)):
        raise ValueError("bad GPU count or sizes")
    for key in ("params", "meta"):
        if not isinstance(info.get(key) or {}, dict):
            raise ValueError(f"the {key} are not a mapping")
    acc_win = data.get("acc_win")
    if acc_win is not None:
        acc_win = _array(data, "acc_win")
        if not np.issubdtype(acc_win.dtype, np.integer) or len(acc_win) != runs.n_accesses:
            raise ValueError("acc_win is not one integer per access")
    _check_references(ops, allocs, runs)
    w = Workload(info["name"], ops, None, None, allocs, names, n_gpus, gpu_mem, dict(info.get("params") or {}),
                 dict(info.get("meta") or {}), None, acc_win, acc_runs=runs)
    w.validate()
    return w


def _check_references(ops: np.ndarray, allocs: np.ndarray, runs: AccessRuns) -> None:
    """Every allocator event names an allocation, every access lies in one, and no
    allocation reaches past the address space."""
    from ..units import PAGE_SHIFT
    from .workload import OpType

    if len(allocs) and (allocs["bytes"] >= 1 << 56).any():
        raise ValueError("an allocation is larger than an address space")
    mem = ops[ops["type"] == OpType.MEM]
    if len(mem) and not np.isin(mem["alloc_id"], allocs["alloc_id"]).all():
        raise ValueError("an allocator event names no allocation of the file")
    if not len(runs.page):
        return
    lo = (allocs["addr"] >> np.uint64(PAGE_SHIFT)).astype(np.int64)
    hi = lo + ((allocs["bytes"] + np.uint64((1 << PAGE_SHIFT) - 1)) >> np.uint64(PAGE_SHIFT)).astype(np.int64)
    if not len(lo):
        raise ValueError("the file has accesses but no allocations")
    order = np.argsort(lo, kind="stable")
    lo, hi = lo[order], np.maximum.accumulate(hi[order])
    # one interval per stretch of touching allocations (a run may cross from one into the next)
    start = np.ones(len(lo), bool)
    start[1:] = lo[1:] > hi[:-1]
    first = np.flatnonzero(start)
    lo, hi = lo[first], np.maximum.reduceat(hi, first)
    i = np.searchsorted(lo, runs.page, side="right") - 1
    ok = (i >= 0) & (runs.page + runs.length <= hi[np.maximum(i, 0)])
    if not ok.all():
        raise ValueError(f"an access (page {int(runs.page[~ok][0]):#x}) lies outside every allocation")


def resolve(target: str, overrides: dict[str, str] | None = None) -> Workload:
    """What ``umctl replay`` replays for ``target``: a ``.umw`` file here (``--gpu-mem`` sets
    the GPU's size, ``--oversub`` sizes it from the peak footprint; nothing else applies: the
    capture fixed the rest), anything else by :func:`~umctl.workload.target.resolve_target`."""
    from .target import resolve_target

    if not is_workfile(target):
        return resolve_target(target, overrides)
    from ..units import parse_size

    ov = dict(overrides or {})
    gpu_mem, oversub = ov.pop("gpu_mem", None), ov.pop("oversub", None)
    ov.pop("seed", None)
    if ov:
        raise UmctlError(f"{', '.join(ov)}: does not apply to a captured workload (give it to umctl capture: "
                         "--batch, --iters)")
    w = load(target)
    try:
        if gpu_mem is not None:
            size = parse_size(gpu_mem)
            if size < MIN_GPU_MEM:
                raise ValueError("must be at least 2 MiB")
            w.gpu_mem = [size] * w.n_gpus
        elif oversub is not None:
            ratio = float(oversub)
            if not 0 < ratio <= 64:
                raise ValueError("must be in (0, 64]")
            size = int(w.peak_managed_bytes / ratio)
            if size < MIN_GPU_MEM:
                raise ValueError(f"gives a GPU of {size:,} bytes for a {w.peak_managed_bytes:,}-byte footprint; "
                                 "it must be at least 2 MiB")
            w.gpu_mem = [size] * w.n_gpus
    except ValueError as e:
        flag = "--gpu-mem" if gpu_mem is not None else "--oversub"
        raise UmctlError(f"{flag} {gpu_mem if gpu_mem is not None else oversub}: {e}") from None
    w.meta["footprint_oversub"] = w.peak_managed_bytes / max(1, w.gpu_mem[0])
    return w
