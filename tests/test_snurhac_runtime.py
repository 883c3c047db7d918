"""SnuRHAC's runtime on one host without a GPU (runtime/rt_snurhac.c on the fake CUDA of
tests/rtprog/fakecudart.c, 4 fake devices whose events and streams belong to a device, as on a
real GPU): the end tracking of partitioned launches (the gesummv failure on 4 H100s), and the
convention's access information (umctl_part_ranges: §6.4's write-overlap rule, the atomics
fallback, placement of each buffer and the per-slab prefetches).

The program (SNUPROG, below) and a fake driver that logs cuMemAdvise_v2 / cuMemPrefetchAsync with
their arguments (DRVLOG: tests/rtprog/fakecudart.c's driver part, those two wrapped) are built
here; the runtime is the session's (conftest's ``built``)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
from pathlib import Path

import pytest

from umctl.controller.snurhac import hull_overlap_ratio, partition
from umctl.runtime import child_env

RTPROG = Path(__file__).resolve().parent / "rtprog"

SNUPROG = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct { unsigned x, y, z; } dim3;
int cudaMalloc(void **, size_t);
int cudaFree(void *);
int cudaLaunchKernel(const void *, dim3, dim3, void **, size_t, void *);
int __cudaLaunchKernel(const void *, dim3, dim3, void **, size_t, void *);
int cudaMemcpy(void *, const void *, size_t, int);
int cudaGetLastError(void);
int cudaDeviceSynchronize(void);
extern __thread int fake_cur_device;
extern __thread dim3 fake_cur_grid;
const char *fake_log_text(void);

/* umctl_snurhac.h, in C: UMPT (v1) ends at magic; UMP2 adds wr_mask, band_mask, flags */
struct part { unsigned off[3], grid[3], ro_mask, magic, wr_mask, band_mask, flags; };
#define V1 0x54504d55u
#define V2 0x32504d55u

/* mark_kern(umctl_part_t p, int *owner, const float *A, const float *B, float *C): every
   block of the slab records the device that ran it, and block t writes element t of C's t-th of
   64 chunks (C in bands); A and B are only there for the runtime */
static size_t c_elems;
static unsigned kern_calls;
void mark_kern(void **args) __asm__("_Z9mark_kern12umctl_part_tPiPKfS2_Pf");
void mark_kern(void **args)
{
    struct part p = *(struct part *)args[0];
    int *owner = *(int **)args[1];
    float *C = *(float **)args[4];
    dim3 g = fake_cur_grid;
    size_t nt = (size_t)p.grid[0] * p.grid[1] * p.grid[2], per = c_elems / nt;
    for (unsigned z = 0; z < g.z; z++)
        for (unsigned y = 0; y < g.y; y++)
            for (unsigned x = 0; x < g.x; x++) {
                unsigned gx = x + p.off[0], gy = y + p.off[1], gz = z + p.off[2];
                if (gx < p.grid[0] && gy < p.grid[1] && gz < p.grid[2]) {
                    size_t t = gx + p.grid[0] * (gy + (size_t)p.grid[1] * gz);
                    owner[t] = fake_cur_device;
                    C[t * per + kern_calls % per] = (float)(t + 1 + kern_calls);
                }
            }
}

static void register_params(void)
{
    void *h = dlopen(getenv("FAKE_LIBCUDA"), RTLD_NOW | RTLD_GLOBAL);
    void (*set)(void *, int, const size_t *) = h ? (void (*)(void *, int, const size_t *))dlsym(h, "fake_set_params") : 0;
    size_t sz[5] = {44, 8, 8, 8, 8};
    if (set && !getenv("NO_PARAMS"))
        set((void *)mark_kern, 5, sz);
}

static int *owner;
static float *A, *B, *C;
static dim3 grid;
static int launch(unsigned magic, unsigned ro, unsigned wr, unsigned band, unsigned flags, int stub)
{
    struct part p = {{0, 0, 0}, {grid.x, grid.y, grid.z}, ro, magic, wr, band, flags};
    void *args[5] = {&p, &owner, &A, &B, &C};
    dim3 b = {32, 8, 1};
    memset(owner, 0xff, (size_t)grid.x * grid.y * grid.z * sizeof(int));
    int rc = stub ? __cudaLaunchKernel((void *)mark_kern, grid, b, args, 0, NULL)
                  : cudaLaunchKernel((void *)mark_kern, grid, b, args, 0, NULL);
    kern_calls++;
    if (p.off[0] || p.off[1] || p.off[2])
        rc |= 1 << 16;
    return rc;
}

static void print_owner(void)
{
    printf("[");
    for (unsigned t = 0; t < grid.x * grid.y * grid.z; t++)
        printf("%s%d", t ? ", " : "", owner[t]);
    printf("]");
}

/* snuprog track N: N partitioned launches (v1, the gesummv / gemm programs' form) with a pause
   between them, then the program's last error.
   snuprog ranges SCRIPT: one launch per letter, printing where each block ran:
     g gemm-like (A, C, owner banded; B read whole)   c written whole (covariance-like)
     a atomics                                         w B written in bands (B changes role)
     v the same as g through UMPT (v1) */
int main(int argc, char **argv)
{
    register_params();
    grid = (dim3){4, 16, 1};
    size_t nb = (size_t)grid.x * grid.y * sizeof(int), mb = (size_t)(getenv("SNU_MB") ? atoi(getenv("SNU_MB")) : 1) << 20;
    c_elems = mb / sizeof(float);
    if (cudaMalloc((void **)&owner, nb) || cudaMalloc((void **)&A, mb) || cudaMalloc((void **)&B, mb) ||
        cudaMalloc((void **)&C, mb))
        return 1;
    int rc = 0;
    printf("RESULT {\"bufs\": {\"owner\": %lu, \"A\": %lu, \"B\": %lu, \"C\": %lu}, \"sizes\": {\"owner\": %zu, "
           "\"A\": %zu, \"B\": %zu, \"C\": %zu}, \"launches\": [",
           (unsigned long)owner, (unsigned long)A, (unsigned long)B, (unsigned long)C, nb, mb, mb, mb);
    if (!strcmp(argv[1], "track")) {
        for (int i = 0; i < atoi(argv[2]); i++) {
            rc |= launch(V1, (1u << 2) | (1u << 3), 0, 0, 0, i % 2);
            printf("%s", i ? ", " : "");
            print_owner();
            usleep(20000);   /* the tracker sees the slabs' events end and pools them */
        }
    } else {
        for (const char *c = argv[2]; *c; c++) {
            unsigned R = 1u << 2 | 1u << 3, W = 1u << 1 | 1u << 4, BAND = 1u << 1 | 1u << 2 | 1u << 4;
            if (*c == 'g')
                rc |= launch(V2, R, W, BAND, 0, 0);
            else if (*c == 'v')
                rc |= launch(V1, R, 0, 0, 0, 0);
            else if (*c == 'c')
                rc |= launch(V2, R, W, 1u << 1 | 1u << 2, 0, 0);   /* C written, not banded */
            else if (*c == 'a')
                rc |= launch(V2, R, W, BAND, 1u, 0);
            else if (*c == 'w')
                rc |= launch(V2, 1u << 2, W | 1u << 3, BAND | 1u << 3, 0, 0);
            printf("%s", c != argv[2] ? ", " : "");
            print_owner();
        }
    }
    cudaDeviceSynchronize();
    int err = cudaGetLastError();
    /* C as the host reads it back (on a cluster, with every node's bands) */
    unsigned char *hc = malloc(mb);
    cudaMemcpy(hc, C, mb, 2);
    unsigned long long h = 1469598103934665603ULL;
    for (size_t i = 0; i < mb; i++)
        h = (h ^ hc[i]) * 1099511628211ULL;
    free(hc);
    fprintf(stderr, "CSUM %016llx\n", h);   /* one short write: ranks' lines do not interleave */
    printf("], \"rc\": %d, \"last_error\": %d, \"c_sum\": \"%016llx\", \"log\": \"", rc, err, h);
    for (const char *c = fake_log_text(); *c; c++)
        printf(*c == '\n' ? "\\n" : "%c", *c);
    printf("\"}\n");
    return 0;
}
"""

DRVLOG = r"""
#define cuMemAdvise_v2 fake_inner_cuMemAdvise_v2
#define cuMemPrefetchAsync fake_inner_cuMemPrefetchAsync
#include "FAKECUDART"
#undef cuMemAdvise_v2
#undef cuMemPrefetchAsync
#include <stdarg.h>
#include <stdio.h>

static void drv_log(const char *fmt, ...)
{
    const char *path = getenv("FAKE_DRV_LOG");
    const char *(*txt)(void) = (const char *(*)(void))dlsym(RTLD_DEFAULT, "fake_log_text");
    FILE *f = path ? fopen(path, "a") : NULL;
    if (!f)
        return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fprintf(f, " pos=%zu\n", txt ? strlen(txt()) : 0);   /* where the runtime API's log was then */
    fclose(f);
}

API int cuMemAdvise_v2(uint64_t p, size_t n, int advice, fake_location loc)
{
    drv_log("advise %d %lu %zu dev=%d", advice, (unsigned long)p, n, loc.id);
    return fake_inner_cuMemAdvise_v2(p, n, advice, loc);
}

/* a fake stream is {int id, dev} (fakecudart.c's runtime part) */
API int cuMemPrefetchAsync(uint64_t p, size_t n, int dev, void *stream)
{
    int *st = stream && stream != (void *)0x2 ? (int *)stream : NULL;
    drv_log("prefetch %lu %zu dev=%d stream=%d sdev=%d", (unsigned long)p, n, dev, st ? st[0] : 0, st ? st[1] : -1);
    return fake_inner_cuMemPrefetchAsync(p, n, dev, stream);
}
"""


@pytest.fixture(scope="module")
def snu(built, tmp_path_factory):
    d = tmp_path_factory.mktemp("snu")
    (d / "snuprog.c").write_text(SNUPROG)
    (d / "drvlog.c").write_text(DRVLOG.replace("FAKECUDART", str(RTPROG / "fakecudart.c")))
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-Wl,--no-undefined", "-DFAKE_LIBCUDA", str(d / "drvlog.c"),
                    "-o", str(d / "libcuda.so.1"), "-ldl"], check=True, capture_output=True, text=True)
    subprocess.run(["gcc", "-O1", "-Wall", "-rdynamic", str(d / "snuprog.c"), "-o", str(d / "snuprog"),
                    f"-L{built['dir']}", "-lcudart", f"-Wl,-rpath,{built['dir']}", "-ldl"],
                   check=True, capture_output=True, text=True)
    return {**built, "snuprog": d / "snuprog", "libcuda": d / "libcuda.so.1", "dir_snu": d}


def run_snu(snu, tmp_path, argv, *, gpus=4, devices=4, extra=None, track=False):
    base = {k: v for k, v in os.environ.items() if not k.startswith(("UMCTL_RT_", "LD_PRELOAD", "FAKE_"))}
    drv_log = tmp_path / "drv.log"
    drv_log.unlink(missing_ok=True)
    base.update(FAKE_LIBCUDA=str(snu["libcuda"]), FAKE_DEVICES=str(devices), FAKE_DRV_LOG=str(drv_log))
    kw = {}
    sock = None
    if track:
        # what `umctl run --mode snurhac` sets: launch reports to a socket, kernel ends tracked
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(str(tmp_path / "rt.sock"))
        kw = {"socket": str(tmp_path / "rt.sock"), "track_end": "1"}
    env = child_env(base, library=snu["lib"], managed=True, gpus=str(gpus), libcuda=str(snu["libcuda"]),
                    stats="1", **kw)
    env.update(extra or {})
    try:
        p = subprocess.run([str(snu["snuprog"]), *argv], env=env, capture_output=True, text=True, timeout=60)
    finally:
        if sock is not None:
            sock.close()
    assert p.returncode == 0, p.stderr
    res = json.loads(next(ln for ln in p.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    drv = drv_log.read_text().splitlines() if drv_log.exists() else []
    res["drv"] = drv
    return res, p.stderr, drv


def stats_line(stderr: str, prefix: str) -> dict[str, str]:
    line = next(ln for ln in stderr.splitlines() if ln.startswith(prefix + ":"))
    return dict(kv.split("=", 1) for kv in line.split()[1:])


def owners_of(gpus: int, grid=(4, 16, 1)) -> list[int]:
    _, parts = partition(grid, gpus)
    out = [-1] * (grid[0] * grid[1] * grid[2])
    for g, tbs in enumerate(parts):
        for t in tbs.tolist():
            out[t] = g
    return out


# -- the gesummv failure ------------------------------------------------------------------------

@pytest.mark.parametrize("gpus", [2, 4])
def test_tracked_partitioned_launches_leave_no_error(snu, tmp_path, gpus):
    """Under `umctl run --mode snurhac` kernel ends are tracked (UMCTL_RT_TRACK_END) with events
    from one pool; the slabs' events used to be recorded on each slab's stream, so once the
    tracker had pooled a GPU 3 event, the next partitioned launch recorded it on GPU 0's stream:
    cudaErrorInvalidResourceHandle (400), left as the program's last error, which gesummv checks
    after its launch (`gesummv.cu:75: cudaGetLastError(): invalid resource handle` on 4 H100s).
    Every launch still runs each block once, on the GPU partition() gives it."""
    res, err, _ = run_snu(snu, tmp_path, ["track", "4"], gpus=gpus, track=True)
    assert res["last_error"] == 0 and res["rc"] == 0
    assert res["launches"] == [owners_of(gpus)] * 4
    st = stats_line(err, "umctl_rt")
    assert st["partitioned"] == "4" and st["part_fallbacks"] == "0"
    # the ends were tracked (an event recorded after each launch), all on the caller's stream 0
    log = res["log"].splitlines()
    tracked = [ln for ln in log if re.fullmatch(r"record event=\d+ stream=0", ln)]
    assert len(tracked) >= 4 * (1 + gpus)   # each launch's start event and one end per slab


# -- §6.4: write overlap and atomics ----------------------------------------------------------

def test_write_overlap_and_atomics_keep_a_kernel_on_one_gpu(snu, tmp_path):
    """A kernel whose written buffer is not banded (every GPU writes all of it: covariance's
    mirrored writes) has a write-overlap ratio above 0.5 and runs whole on the caller's GPU, as
    does one with atomics; banded writes (gemm's C) are partitioned. The ratio is the replay's
    (hull_overlap_ratio) for the same ranges."""
    res, err, _ = run_snu(snu, tmp_path, ["ranges", "gcag"])
    four, one = owners_of(4), [0] * 64
    assert res["launches"] == [four, one, one, four] and res["last_error"] == 0
    st = stats_line(err, "umctl_rt_snurhac")
    assert st["ranges"] == "4" and st["single_overlap"] == "1" and st["single_atomics"] == "1"
    S, So = res["sizes"]["C"], res["sizes"]["owner"]
    want = hull_overlap_ratio({0: [(0, S)] * 4, 1: [(So * g // 4, So * (g + 1) // 4) for g in range(4)]})
    assert float(st["overlap_max"]) == pytest.approx(want, abs=0.006) and want > 0.5
    launches = [ln for ln in res["log"].splitlines() if ln.startswith("launch ")]
    assert sum("grid=4,16,1" in ln and "dev=0" in ln for ln in launches) == 2   # the two single launches
    # the first single-GPU kernel brings every buffer it is passed whole to its GPU, on the
    # caller's stream (0), before its launch; the second finds them there; the last partitioned
    # kernel puts the bands back on their GPUs
    ev = parse_drv(res.pop("drv"), res["bufs"])
    log = res["log"]
    single = log.index("launch _Z9mark_kern12umctl_part_tPiPKfS2_Pf dev=0 stream=0 grid=4,16,1")
    whole = [e for e in ev if e[0] == "prefetch" and e[5] == 0]
    assert sorted((e[1], e[2], e[3], e[4]) for e in whole) == sorted((n, 0, res["sizes"][n], 0) for n in res["bufs"])
    assert all(e[-1] <= single for e in whole)
    last = [e for e in ev if e[0] == "prefetch" and e[-1] > single and e[5] != 0]
    assert {e[4] for e in last} == {0, 1, 2, 3} and {e[1] for e in last} == {"A", "B", "C", "owner"}


def test_overlap_threshold_is_configurable(snu, tmp_path):
    res, err, _ = run_snu(snu, tmp_path, ["ranges", "c"], extra={"UMCTL_RT_OVERLAP": "2"})
    assert res["launches"] == [owners_of(4)]
    assert stats_line(err, "umctl_rt_snurhac")["single_overlap"] == "0"


# -- placement -------------------------------------------------------------------------------

def parse_drv(drv: list[str], bufs: dict[str, int]) -> list[tuple]:
    """(op, buffer name, offset, bytes, device, stream, stream's device, runtime-log position)."""
    out = []
    for ln in drv:
        f = ln.split()
        pos = int(f[-1].split("=")[1])
        if f[0] == "advise":
            adv, addr, n, dev = int(f[1]), int(f[2]), int(f[3]), int(f[4].split("=")[1])
            name = next(k for k, a in bufs.items() if a <= addr < a + (1 << 30))
            out.append(("advise", adv, name, addr - bufs[name], n, dev, pos))
        else:
            addr, n = int(f[1]), int(f[2])
            kv = dict(x.split("=") for x in f[3:6])
            name = next(k for k, a in bufs.items() if a <= addr < a + (1 << 30))
            out.append(("prefetch", name, addr - bufs[name], n, int(kv["dev"]), int(kv["stream"]), int(kv["sdev"]), pos))
    return out


def test_placement_follows_the_ranges_once(snu, tmp_path):
    """gemm-like launch over 4 GPUs: B (read whole) is duplicated (READ_MOSTLY) and prefetched
    whole to every GPU; A, C and owner (banded) get their bands' preferred location on the
    band's GPU, are mapped on the GPUs next to each band over its halo (accessed-by, one block
    row's share past each inner edge, whole 2 MiB blocks), and each band is prefetched to its GPU.
    Each prefetch is on the slab's stream (of its GPU), after the slab stream's wait on the
    caller's stream and before the slab's launch. The same launch again adds nothing; B then
    written in bands loses READ_MOSTLY and gets its bands placed."""
    res, err, drv = run_snu(snu, tmp_path, ["ranges", "ggw"])
    assert res["launches"] == [owners_of(4)] * 3 and res["last_error"] == 0
    bufs, sizes = res["bufs"], res["sizes"]
    ev = parse_drv(drv, bufs)
    log = res["log"]
    launches = [m.start() for m in re.finditer(r"^launch ", log, re.M)]   # 4 slabs a kernel
    # where each kernel's log begins (its event on the caller's stream 0): its advice is given
    # just before, its prefetches come after
    starts = [m.start() for m in re.finditer(r"^record event=\d+ stream=0\nwait stream=[1-9]", log, re.M)]
    assert len(starts) == 3

    def of_kernel(i: int) -> list[tuple]:
        return [e for e in ev if starts[i] <= e[-1] < (starts[i + 1] if i < 2 else len(log) + 1)]

    def bands(S: int) -> list[tuple[int, int]]:
        """[lo, hi) of each GPU's band: its share of the 16 block rows, rounded up to a page"""
        e = [min(S, (S * g // 4 + 4095) // 4096 * 4096) for g in range(5)]
        return [(e[g], e[g + 1]) for g in range(4)]

    first = of_kernel(0)
    assert len(first) == len(ev) - len(of_kernel(1)) - len(of_kernel(2))
    adv = [e for e in first if e[0] == "advise"]
    assert [(e[2], e[1]) for e in adv if e[1] == 1] == [("B", 1)]                      # READ_MOSTLY on B
    for name in ("A", "C", "owner"):
        pref = sorted((e[3], e[4], e[5]) for e in adv if e[1] == 3 and e[2] == name)
        assert pref == [(lo, hi - lo, g) for g, (lo, hi) in enumerate(bands(sizes[name])) if hi > lo], name
        # accessed-by: each GPU maps only the halo windows next to its band's inner edges (one
        # block row's share each side, widened to whole 2 MiB blocks), not the whole buffer
        S, blk, share = sizes[name], 2 << 20, -(-sizes[name] // 16)
        want_acc = []
        for g, (lo, hi) in enumerate(bands(S)):
            if hi <= lo:
                continue
            if lo > 0:
                a, b = max(0, lo - share) // blk * blk, min(S, -(-lo // blk) * blk)
                want_acc.append((a, b - a, g))
            if hi < S:
                a, b = hi // blk * blk, min(S, -(-min(S, hi + share) // blk) * blk)
                want_acc.append((a, b - a, g))
        assert sorted((e[3], e[4], e[5]) for e in adv if e[1] == 5 and e[2] == name) == sorted(want_acc), name
    pf = [e for e in first if e[0] == "prefetch"]
    for g in range(4):
        mine = [e for e in pf if e[4] == g]
        assert all(e[6] == g and e[5] != 0 for e in mine)            # on a stream of GPU g, not the caller's
        want = {("B", 0, sizes["B"])} | {(n, lo, hi - lo) for n in ("A", "C", "owner")
                                         for lo, hi in [bands(sizes[n])[g]] if hi > lo}
        assert sorted((e[1], e[2], e[3]) for e in mine) == sorted(want)
        # after its stream's wait on the caller's stream, before its launch
        wait_at = log.index(f"wait stream={mine[0][5]} ")
        assert all(wait_at < e[-1] <= launches[g] for e in mine)
    # the same kernel again: nothing new
    assert of_kernel(1) == []
    # B written in bands: it leaves READ_MOSTLY (2), gets its bands (3) and their prefetches
    third = of_kernel(2)
    assert {e[:3] for e in third if e[0] == "advise"} == {("advise", 2, "B"), ("advise", 3, "B"), ("advise", 5, "B")}
    assert sorted(e[4] for e in third if e[0] == "prefetch") == [0, 1, 2, 3]
    assert {e[1] for e in third if e[0] == "prefetch"} == {"B"}
    st = stats_line(err, "umctl_rt_snurhac")
    assert st["prefetches"] == str(len([e for e in ev if e[0] == "prefetch"]))
    assert stats_line(err, "umctl_rt")["read_mostly"] == "1,1"


def test_without_ranges_or_with_placement_off_only_read_mostly(snu, tmp_path):
    """UMPT kernels (no access information) and UMCTL_RT_PLACE=0 keep the READ_MOSTLY advice
    alone: no preferred location, no accessed-by, no prefetch."""
    for argv, extra in ((["ranges", "vv"], None), (["ranges", "gg"], {"UMCTL_RT_PLACE": "0"})):
        res, err, drv = run_snu(snu, tmp_path, argv, extra=extra)
        assert res["launches"] == [owners_of(4)] * 2
        ev = parse_drv(drv, res["bufs"])
        assert sorted({(e[1], e[2]) for e in ev if e[0] == "advise"}) == [(1, "A"), (1, "B")]
        assert not [e for e in ev if e[0] == "prefetch"]


def test_unknown_parameter_sizes_use_the_masks(snu, tmp_path):
    """Driver 580 / CUDA 13 gave no parameter sizes: the UMP2 masks say which arguments are
    pointers, so the placement and the overlap rule are the same."""
    res, err, drv = run_snu(snu, tmp_path, ["ranges", "gc"], extra={"NO_PARAMS": "1"})
    assert res["launches"] == [owners_of(4), [0] * 64]
    ev = parse_drv(drv, res["bufs"])
    assert {e[1] for e in ev if e[0] == "prefetch"} == {"A", "B", "C", "owner"}
