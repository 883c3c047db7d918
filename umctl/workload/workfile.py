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
    except (KeyError, ValueError, TypeError) as e:
        raise UmctlError(f"{path}: corrupt umctl workload file ({_why(e)})") from None


def _why(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text[:200]


def _json(data: dict, key: str):
    a = data[key]
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
    if tag.get("version") != VERSION:
        raise ValueError(f"format version {tag.get('version')!r}, this umctl reads {VERSION}")
    ops, allocs = data["ops"], data["allocations"]
    if ops.dtype != OP_DTYPE or ops.ndim != 1:
        raise ValueError("the op table has the wrong columns")
    if allocs.dtype != ALLOCATION_DTYPE or allocs.ndim != 1:
        raise ValueError("the allocation table has the wrong columns")
    page, length, write = data["run_page"], data["run_length"], data["run_write"]
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
    if not isinstance(n_gpus, int) or not isinstance(gpu_mem, list) or not all(isinstance(x, int) and x > 0 for x in gpu_mem):
        raise ValueError("bad GPU count or sizes")
    acc_win = data.get("acc_win")
    w = Workload(info["name"], ops, None, None, allocs, names, n_gpus, gpu_mem, dict(info.get("params") or {}),
                 dict(info.get("meta") or {}), None, acc_win, acc_runs=runs)
    w.validate()
    return w


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
            if size < 16 * 4096:
                raise ValueError("must be at least 64 KiB")
            w.gpu_mem = [size] * w.n_gpus
        elif oversub is not None:
            ratio = float(oversub)
            if not 0 < ratio <= 64:
                raise ValueError("must be in (0, 64]")
            w.gpu_mem = [max(16 * 4096, int(w.peak_managed_bytes / ratio))] * w.n_gpus
    except ValueError as e:
        flag = "--gpu-mem" if gpu_mem is not None else "--oversub"
        raise UmctlError(f"{flag} {gpu_mem if gpu_mem is not None else oversub}: {e}") from None
    w.meta["footprint_oversub"] = w.peak_managed_bytes / max(1, w.gpu_mem[0])
    return w
