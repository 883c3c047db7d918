"""Probe: what the stock driver does with managed memory whose preferred location is the host.

The live budget can only hold if GPU residency grows through umctl's own migrations. This
probe checks the driver behaviour that relies on: with SET_PREFERRED_LOCATION = host, a GPU
first touch and later GPU accesses map the host pages remotely (GPU free memory does not drop),
repeated remote passes do not pull pages in (access counters), and an explicit prefetch to the
GPU still moves them (free memory drops, passes get local speed).

    python3 benchmarks/gpu/prefer_host_probe.py [--mib 1024] [--passes 5]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import time

import torch

CU_MEM_ATTACH_GLOBAL = 1
ADVISE_SET_PREFERRED = 3
LOC_DEVICE, LOC_HOST = 1, 2


class Loc(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--passes", type=int, default=5)
    a = ap.parse_args()
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    cu = ctypes.CDLL("libcuda.so.1")
    cu.cuMemAdvise_v2.argtypes = [ctypes.c_uint64, ctypes.c_size_t, ctypes.c_int, Loc]
    cu.cuMemPrefetchAsync_v2.argtypes = [ctypes.c_uint64, ctypes.c_size_t, Loc, ctypes.c_uint, ctypes.c_void_p]
    n = a.mib << 20
    out: dict = {"gpu": torch.cuda.get_device_name(), "mib": a.mib}

    def alloc():
        p = ctypes.c_uint64()
        assert cu.cuMemAllocManaged(ctypes.byref(p), ctypes.c_size_t(n), CU_MEM_ATTACH_GLOBAL) == 0
        class A:  # noqa: N801
            __cuda_array_interface__ = {"shape": (n // 4,), "typestr": "<f4", "data": (p.value, False), "version": 3}
        return p.value, torch.as_tensor(A(), device="cuda")

    def free_mib() -> float:
        torch.cuda.synchronize()
        return torch.cuda.mem_get_info()[0] / 2**20

    def passes(t, k):
        ms = []
        for _ in range(k):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            float(t.sum())
            ms.append(round((time.perf_counter() - t0) * 1e3, 2))
        return ms

    def case(name, advise, cpu_first=False, prefetch=False, extra=0):
        f0 = free_mib()
        p, t = alloc()
        if advise:
            assert cu.cuMemAdvise_v2(p, n, ADVISE_SET_PREFERRED, Loc(LOC_HOST, 0)) == 0
        if cpu_first:
            ctypes.memset(p, 0, n)
        else:
            t.fill_(1.0)
        f1 = free_mib()
        r = {"after_first_touch_mib_used": round(f0 - f1), "pass_ms": passes(t, a.passes)}
        r["after_passes_mib_used"] = round(f0 - free_mib())
        if extra:
            passes(t, extra)
            r[f"after_{extra}_more_passes_mib_used"] = round(f0 - free_mib())
        if prefetch:
            t0 = time.perf_counter()
            assert cu.cuMemPrefetchAsync_v2(p, n, Loc(LOC_DEVICE, 0), 0, None) == 0
            torch.cuda.synchronize()
            r["prefetch_ms"] = round((time.perf_counter() - t0) * 1e3, 2)
            r["after_prefetch_mib_used"] = round(f0 - free_mib())
            r["pass_ms_after_prefetch"] = passes(t, a.passes)
            t0 = time.perf_counter()
            assert cu.cuMemPrefetchAsync_v2(p, n, Loc(LOC_HOST, 0), 0, None) == 0
            torch.cuda.synchronize()
            r["evict_ms"] = round((time.perf_counter() - t0) * 1e3, 2)
            r["after_evict_mib_used"] = round(f0 - free_mib())
            r["pass_ms_after_evict"] = passes(t, 2)
            r["after_evict_passes_mib_used"] = round(f0 - free_mib())
        del t
        assert cu.cuMemFree_v2(ctypes.c_uint64(p)) == 0
        out[name] = r
        print(name, json.dumps(r), flush=True)

    case("plain_gpu_touch", advise=False)
    case("host_pref_gpu_touch", advise=True, extra=30)
    case("host_pref_cpu_touch", advise=True, cpu_first=True, prefetch=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
