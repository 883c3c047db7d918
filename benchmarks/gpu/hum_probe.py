"""Measure the two steps of HUM's copy (PPoPP'20 §4.4-4.5) on this machine's GPU, for the
simulator's chunked-copy constants: (1) staging, a pool of threads memcpy-ing 2 MiB chunks from
a malloc'd buffer into host-side managed pages (fresh pages, and pages that live on the GPU
from an earlier copy); (2) migration, one synchronous cuMemPrefetchAsync of a 2 MiB chunk at a
time, as HUM's page-migration thread does; beside them pageable and pinned cudaMemcpy.
Needs cupy and an NVIDIA GPU; prints JSON; asserts nothing.

    python3 benchmarks/gpu/hum_probe.py [--mib 512] [--threads 1,4,8]
"""

from __future__ import annotations

import argparse
import ctypes as C
import json
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np


class CUmemLocation(C.Structure):
    _fields_ = [("type", C.c_int), ("id", C.c_int)]


LOC_DEVICE = 1
CHUNK = 2 << 20


def main() -> None:
    import cupy as cp

    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--threads", default="1,4,8,16")
    a = ap.parse_args()
    nb = a.mib << 20
    cuda = C.CDLL("libcuda.so.1")
    cuda.cuMemPrefetchAsync_v2.argtypes = [C.c_uint64, C.c_size_t, CUmemLocation, C.c_uint, C.c_void_p]
    cuda.cuMemPrefetchAsync_v2.restype = C.c_int
    sync = cp.cuda.runtime.deviceSynchronize
    src = np.ones(nb, np.uint8)          # malloc'd, written (pageable)
    out: dict = {"mib": a.mib}

    def managed():
        mem = cp.cuda.malloc_managed(nb)
        view = np.ctypeslib.as_array((C.c_uint8 * nb).from_address(mem.ptr))
        return mem, view

    def stage(view, threads: int) -> float:
        def one(k: int) -> None:
            np.copyto(view[k * CHUNK:(k + 1) * CHUNK], src[k * CHUNK:(k + 1) * CHUNK])
        t = time.perf_counter()
        with ThreadPoolExecutor(threads) as ex:
            list(ex.map(one, range(nb // CHUNK)))
        return time.perf_counter() - t

    def migrate(mem) -> float:
        sync()
        t = time.perf_counter()
        for k in range(nb // CHUNK):
            rc = cuda.cuMemPrefetchAsync_v2(mem.ptr + k * CHUNK, CHUNK, CUmemLocation(LOC_DEVICE, 0), 0, None)
            if rc:
                raise SystemExit(f"cuMemPrefetchAsync_v2 failed ({rc})")
            sync()
        return time.perf_counter() - t

    for th in [int(x) for x in a.threads.split(",")]:
        mem, view = managed()
        fresh = stage(view, th)
        again = stage(view, th)               # pages already populated on the host
        m = migrate(mem)
        on_gpu = stage(view, th)              # pages resident on the GPU (CPU faults them back)
        out[f"threads{th}"] = {"stage_fresh_GBps": nb / fresh / 1e9, "stage_populated_GBps": nb / again / 1e9,
                               "stage_from_gpu_GBps": nb / on_gpu / 1e9, "migrate_2MiB_serial_GBps": nb / m / 1e9,
                               "migrate_us_per_chunk": m / (nb // CHUNK) * 1e6}
        del view, mem
    d = cp.empty(nb, cp.uint8)
    for name, buf in (("pageable", src), ("pinned", None)):
        if buf is None:
            pin = cp.cuda.alloc_pinned_memory(nb)
            buf = np.frombuffer(pin, np.uint8, nb)
            buf[:] = 1
        sync()
        t = time.perf_counter()
        for _ in range(3):
            cp.cuda.runtime.memcpy(d.data.ptr, buf.ctypes.data, nb, 1)
        sync()
        out[f"memcpy_{name}_GBps"] = 3 * nb / (time.perf_counter() - t) / 1e9
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
