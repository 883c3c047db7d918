/* umctl in-process runtime, loaded with LD_PRELOAD into a program started by `umctl run`.
 *
 * What it does (each part off unless its environment variable asks for it; runtime/README.md):
 *   - UMCTL_RT_MANAGED=1: cudaMalloc hands out managed memory (cudaMallocManaged), so DeepUM-style
 *     prefetch/pre-eviction/invalidation commands can act on the program's device memory. The
 *     PyTorch pluggable-allocator entry points umctl_rt_malloc/umctl_rt_free do the same for torch
 *     and keep freed blocks cached, reporting them BLOCK_INACTIVE / BLOCK_ACTIVE.
 *   - UMCTL_RT_HUM=1 (implies MANAGED): HUM (PPoPP'20 §4) for unmodified programs. A host->device
 *     cudaMemcpy(Async) from pageable memory into one of our managed allocations returns at once;
 *     a worker copies the data in 2 MiB chunks, one queue per copy command, served round-robin
 *     (§4.6), and prefetches each chunk to the GPU. The source pages are write-protected until
 *     their chunk is copied; a thread that writes one waits in our SIGSEGV handler (§4.2).
 *     Every CUDA call that could observe the destination (launches, copies, syncs, events, frees,
 *     at both the runtime and the driver API) first waits for the pending copies: without the HUM
 *     kernel driver, a kernel that read a page not yet copied would see stale data, so "early
 *     kernel start" here means the kernel starts while the chunks are still *migrating* to the
 *     GPU (they are already in managed memory; the driver faults in what the prefetch has not
 *     brought yet), never before the bytes are in place.
 *   - UMCTL_RT_SOCKET=PATH: launches (exact kernel name, grid, block, stream, argument hash),
 *     allocations and copies are reported as binary datagrams (umctl_rt.h) to PATH, batched and
 *     non-blocking: a full socket drops records and counts them, never stalls the program.
 *
 * Rule above all: never change a program's results. Anything the HUM path cannot prove safe
 * (pinned, managed or device source, a destination we did not allocate, a stream being captured,
 * an unusual mapping, a device without concurrent managed access, ...) takes the original call.
 *
 * Built by setup.py: gcc -O2 -shared -fPIC umctl_rt.c -o libumctl_rt.so -ldl -lpthread. No CUDA
 * headers: the runtime API is reached by symbol (dlsym RTLD_NEXT), the driver through dlopen of
 * libcuda.so.1 (UMCTL_RT_LIBCUDA overrides the path). Only programs that link libcudart
 * dynamically are interposed at the runtime level (torch, cupy, nvcc -cudart shared).
 */
#define _GNU_SOURCE
#include "umctl_rt.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))
#define LOCAL static __attribute__((visibility("hidden")))

typedef int cudaError_t;
typedef void *cudaStream_t;
typedef void *cudaEvent_t;
typedef struct { unsigned x, y, z; } dim3;
typedef uint64_t u64;

enum { cudaMemcpyHostToHost = 0, cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2,
       cudaMemcpyDeviceToDevice = 3, cudaMemcpyDefault = 4 };

#define CHUNK ((size_t)2 << 20)
#define MAX_COPIES 64
#define MAX_DEV 16

/* ---------------------------------------------------------------- configuration and stats */

static int cfg_managed, cfg_hum, cfg_stats, cfg_track_end;
static size_t cfg_hum_min = (size_t)1 << 20, cfg_cap;
static unsigned cfg_delay_us;
static const char *cfg_socket;
static int cfg_control;   /* UMCTL_RT_CONTROL: umctl may ask for safe discards (below) */
static struct sockaddr_un sock_addr;
static socklen_t sock_len;
static int sock_fd = -1;
static size_t page_sz = 4096;

static _Atomic u64 st_dma, st_pinned, st_stage_ns, st_dmawait_ns, st_populated;
/* where a HUM copy's time goes: write-protecting the source at the call, unprotecting it as it is
   staged, and issue -> last chunk landed (sum and worst) */
static _Atomic u64 st_protect_ns, st_unprot_ns, st_copy_ns, st_copy_max_ns, st_call_ns;
static _Atomic u64 st_drv_launch;   /* launches reported from the driver's entry point (cuBLAS, ...) */
static _Atomic u64 st_hum, st_fallback, st_waits, st_segv, st_launch, st_managed, st_wrapped, st_chunks,
    st_prefetch;

/* SnuRHAC grid partitioning (UMCTL_RT_GPUS, UMCTL_RT_READ_ONLY): see part_launch */
static int cfg_gpus, cfg_ro = 1;
static _Atomic u64 st_part, st_part_fallback, st_ro_set, st_ro_unset;
static _Atomic u64 st_disc_req, st_disc_bytes, st_disc_kept;   /* safe-discard requests, bytes dropped, kept */
static _Atomic u64 st_disc_ns, st_disc_max_ns;   /* time the discards held the cache lock: total, longest */
static pthread_mutex_t part_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t part_once = PTHREAD_ONCE_INIT;
static void part_setup(void);
static void part_forget(const void *p);

#define STREAM_PER_THREAD ((cudaStream_t)0x2)   /* cudaStreamPerThread: what stream 0 means in a _ptsz call */
static __thread int tl_internal;   /* >0: our own call or our worker: no barrier, no HUM, no report */
static __thread int tl_rt_launch;  /* >0: inside a reported runtime launch: its driver launch is not reported again */
static __thread uintptr_t tl_last_fault;

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static size_t env_size(const char *name, size_t dflt)
{
    const char *v = getenv(name);
    return v && *v ? (size_t)strtoull(v, NULL, 0) : dflt;
}

static int env_on(const char *name)
{
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

/* ---------------------------------------------------------------- symbol resolution */

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn real_dlsym;

static void resolve_dlsym(void)
{
    if (real_dlsym)
        return;
    real_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!real_dlsym)
        real_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
}

static void *rdlsym(void *h, const char *name)
{
    resolve_dlsym();
    return real_dlsym ? real_dlsym(h, name) : NULL;
}

/* The next definition of `name` after this library; when we were dlopen'ed (torch's pluggable
   allocator) rather than preloaded, RTLD_NEXT may miss libcudart: take the global one then,
   unless that is our own. */
static int is_self(void *p)
{
    static void *self_base;
    Dl_info di;
    if (!self_base && dladdr((void *)&is_self, &di))
        self_base = di.dli_fbase;
    return p && dladdr(p, &di) && di.dli_fbase == self_base;
}

static void *next_sym(const char *name)
{
    void *p = rdlsym(RTLD_NEXT, name);
    if (!p) {
        p = rdlsym(RTLD_DEFAULT, name);
        if (is_self(p))
            p = NULL;
    }
    return p;
}

#define REAL(ret, name, ...)                                                     \
    typedef ret (*name##_t)(__VA_ARGS__);                                        \
    static name##_t real_##name;                                                 \
    static name##_t get_##name(void)                                             \
    {                                                                            \
        if (!real_##name)                                                        \
            real_##name = (name##_t)next_sym(#name);              \
        return real_##name;                                                      \
    }

REAL(cudaError_t, cudaMalloc, void **, size_t)
REAL(cudaError_t, cudaFree, void *)
REAL(cudaError_t, cudaMemcpy, void *, const void *, size_t, int)
REAL(cudaError_t, cudaMemcpyAsync, void *, const void *, size_t, int, cudaStream_t)
REAL(cudaError_t, cudaLaunchKernel, const void *, dim3, dim3, void **, size_t, cudaStream_t)
REAL(cudaError_t, cudaMallocManaged, void **, size_t, unsigned)
REAL(cudaError_t, cudaGetDevice, int *)
REAL(cudaError_t, cudaSetDevice, int)
REAL(cudaError_t, cudaGetLastError, void)
REAL(cudaError_t, cudaPointerGetAttributes, void *, const void *)
REAL(cudaError_t, cudaDeviceGetAttribute, int *, int, int)
REAL(cudaError_t, cudaEventCreateWithFlags, cudaEvent_t *, unsigned)
REAL(cudaError_t, cudaEventRecord, cudaEvent_t, cudaStream_t)
REAL(cudaError_t, cudaEventSynchronize, cudaEvent_t)
REAL(cudaError_t, cudaEventQuery, cudaEvent_t)
REAL(cudaError_t, cudaEventDestroy, cudaEvent_t)
REAL(cudaError_t, cudaStreamSynchronize, cudaStream_t)
REAL(cudaError_t, cudaStreamCreateWithFlags, cudaStream_t *, unsigned)
REAL(cudaError_t, cudaStreamIsCapturing, cudaStream_t, int *)
REAL(cudaError_t, cudaHostAlloc, void **, size_t, unsigned)
REAL(cudaError_t, cudaFuncGetName, const char **, const void *)
REAL(cudaError_t, cudaGetFuncBySymbol, void **, const void *)
REAL(cudaError_t, cudaGetDeviceCount, int *)
REAL(cudaError_t, cudaStreamWaitEvent, cudaStream_t, cudaEvent_t, unsigned)
REAL(cudaError_t, cudaDeviceCanAccessPeer, int *, int, int)
REAL(cudaError_t, cudaDeviceEnablePeerAccess, int, unsigned)

/* Driver API, from libcuda.so.1 (absent or broken: the features that need it are skipped). */
typedef int (*cuFuncGetParamInfo_t)(void *, size_t, size_t *, size_t *);
typedef int (*cuMemPrefetchAsync_t)(u64, size_t, int, void *);
typedef int (*cuGetProcAddress_t)(const char *, void **, int, u64);
typedef int (*cuGetProcAddress_v2_t)(const char *, void **, int, u64, void *);
static cuFuncGetParamInfo_t cu_param_info;
typedef int (*cuFuncGetName_t)(const char **, void *);
static cuFuncGetName_t cu_func_name, cu_kernel_name;   /* cuFuncGetName, cuKernelGetName (CUDA >= 12.3) */
static cuFuncGetParamInfo_t cu_kernel_param_info;      /* cuKernelGetParamInfo: a CUkernel passed as CUfunction */
static cuMemPrefetchAsync_t cu_prefetch;
static cuGetProcAddress_t real_getproc;
static cuGetProcAddress_v2_t real_getproc_v2;
/* cuMemAdvise (CUDA <= 12 ABI: int device) and cuMemAdvise_v2 (CUmemLocation by value) */
typedef struct { int type, id; } cu_mem_location_t;
typedef int (*cuMemAdvise_t)(u64, size_t, int, int);
typedef int (*cuMemAdvise_v2_t)(u64, size_t, int, cu_mem_location_t);
static cuMemAdvise_t cu_advise;
static cuMemAdvise_v2_t cu_advise_v2;

/* cuMemPrefetchAsync_v2(ptr, n, CUmemLocation {type, id} by value, flags, stream) */
typedef struct { int type, id; } cu_mem_location;
typedef int (*cuMemPrefetchAsync_v2_t)(u64, size_t, cu_mem_location, unsigned, void *);
static cuMemPrefetchAsync_v2_t cu_prefetch_v2;
static int prefetch_via_v2(u64 p, size_t n, int dev, void *stream)
{
    cu_mem_location loc = { dev < 0 ? 2 /* host */ : 1 /* device */, dev < 0 ? 0 : dev };
    return cu_prefetch_v2(p, n, loc, 0, stream);
}

static pthread_once_t driver_once = PTHREAD_ONCE_INIT;
static void load_driver(void)
{
    const char *path = getenv("UMCTL_RT_LIBCUDA");
    void *h = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h)
        return;
    cu_param_info = (cuFuncGetParamInfo_t)rdlsym(h, "cuFuncGetParamInfo");
    cu_kernel_param_info = (cuFuncGetParamInfo_t)rdlsym(h, "cuKernelGetParamInfo");
    cu_func_name = (cuFuncGetName_t)rdlsym(h, "cuFuncGetName");
    cu_kernel_name = (cuFuncGetName_t)rdlsym(h, "cuKernelGetName");
    cu_prefetch = (cuMemPrefetchAsync_t)rdlsym(h, "cuMemPrefetchAsync");
    cu_advise_v2 = (cuMemAdvise_v2_t)rdlsym(h, "cuMemAdvise_v2");
    if (!cu_advise_v2)
        cu_advise = (cuMemAdvise_t)rdlsym(h, "cuMemAdvise");
    if (!cu_prefetch) {   /* CUDA 13 drivers may keep only the location-based entry point */
        cu_prefetch_v2 = (cuMemPrefetchAsync_v2_t)rdlsym(h, "cuMemPrefetchAsync_v2");
        if (cu_prefetch_v2)
            cu_prefetch = prefetch_via_v2;
    }
}

/* ---------------------------------------------------------------- reports */

#define RBUF_BYTES 12288
struct rbuf {
    pthread_mutex_t mu;
    uint8_t kind;
    size_t recsz;
    uint32_t n;
    char data[RBUF_BYTES];
};
static struct rbuf rb[3] = {
    {PTHREAD_MUTEX_INITIALIZER, UMRT_LAUNCH, sizeof(struct umrt_launch), 0, {0}},
    {PTHREAD_MUTEX_INITIALIZER, UMRT_ALLOC, sizeof(struct umrt_alloc), 0, {0}},
    {PTHREAD_MUTEX_INITIALIZER, UMRT_COPY, sizeof(struct umrt_copy), 0, {0}},
};
static _Atomic u64 drops[3];
static int32_t my_pid;

static pthread_mutex_t names_mu = PTHREAD_MUTEX_INITIALIZER;
static char **names;
static uint16_t *name_lens;
static int n_names, cap_names, names_sent;

static int send_dgram(uint8_t kind, uint32_t count, const void *body, size_t len)
{
    struct umrt_header h = {UMRT_MAGIC, UMRT_VERSION, kind, 0, count, my_pid, {0, 0, 0}};
    for (int i = 0; i < 3; i++)
        h.drops[i] = atomic_load(&drops[i]);
    struct iovec iov[2] = {{&h, sizeof h}, {(void *)body, len}};
    struct msghdr m = {0};
    m.msg_name = &sock_addr;
    m.msg_namelen = sock_len;
    m.msg_iov = iov;
    m.msg_iovlen = 2;
    return sendmsg(sock_fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL) < 0 ? -1 : 0;
}

/* Names go before the launches that use them; a name that could not be sent is retried at the
   next flush (never dropped), since every later launch of that kernel needs it. */
static void flush_names(void)
{
    char buf[RBUF_BYTES];
    pthread_mutex_lock(&names_mu);
    while (names_sent < n_names) {
        size_t len = 0;
        uint32_t cnt = 0;
        int i = names_sent;
        while (i < n_names && len + 6 + name_lens[i] <= sizeof buf) {
            int32_t id = i;
            memcpy(buf + len, &id, 4);
            memcpy(buf + len + 4, &name_lens[i], 2);
            memcpy(buf + len + 6, names[i], name_lens[i]);
            len += 6 + name_lens[i];
            cnt++;
            i++;
        }
        if (!cnt || send_dgram(UMRT_NAMES, cnt, buf, len) < 0)
            break;
        names_sent = i;
    }
    pthread_mutex_unlock(&names_mu);
}

static void flush_kind(int k)
{
    char buf[RBUF_BYTES];
    struct rbuf *b = &rb[k];
    pthread_mutex_lock(&b->mu);
    uint32_t n = b->n;
    memcpy(buf, b->data, n * b->recsz);
    b->n = 0;
    pthread_mutex_unlock(&b->mu);
    if (n && send_dgram(b->kind, n, buf, n * b->recsz) < 0)
        atomic_fetch_add(&drops[k], n);
}

static void flush_all(void)
{
    if (sock_fd < 0)
        return;
    flush_names();
    for (int k = 0; k < 3; k++)
        flush_kind(k);
}

static void *flusher(void *arg)
{
    (void)arg;
    tl_internal = 1;
    struct timespec ts = {0, 2 * 1000 * 1000};
    for (;;) {
        nanosleep(&ts, NULL);
        flush_all();
    }
    return NULL;
}

/* Start one of the runtime's own threads, detached, with every signal blocked (the program's
   signals go to its own threads). Returns whether it started. */
static int spawn_detached(void *(*fn)(void *))
{
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int ok = pthread_create(&t, &a, fn, NULL) == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&a);
    return ok;
}

static pthread_once_t flusher_once = PTHREAD_ONCE_INIT;
static void start_flusher(void)
{
    spawn_detached(flusher);
}

static void push(int k, const void *rec)
{
    struct rbuf *b = &rb[k];
    pthread_once(&flusher_once, start_flusher);
    int full;
    pthread_mutex_lock(&b->mu);
    memcpy(b->data + b->n * b->recsz, rec, b->recsz);
    b->n++;
    full = (b->n + 1) * b->recsz > RBUF_BYTES;
    pthread_mutex_unlock(&b->mu);
    if (full) {
        if (k == 0)
            flush_names();
        flush_kind(k);
    }
}

static int intern_name(const char *s)
{
    pthread_mutex_lock(&names_mu);
    for (int i = n_names - 1; i >= 0; i--)   /* called once per new kernel (cached by caller) */
        if (strcmp(names[i], s) == 0) {
            pthread_mutex_unlock(&names_mu);
            return i;
        }
    if (n_names == cap_names) {
        int nc = cap_names ? 2 * cap_names : 256;
        char **nn = realloc(names, nc * sizeof *nn);
        uint16_t *nl = realloc(name_lens, nc * sizeof *nl);
        if (!nn || !nl) {
            if (nn) names = nn;
            if (nl) name_lens = nl;
            pthread_mutex_unlock(&names_mu);
            return -1;
        }
        names = nn, name_lens = nl, cap_names = nc;
    }
    size_t len = strlen(s);
    if (len > 4000)
        len = 4000;
    names[n_names] = strndup(s, len);
    name_lens[n_names] = (uint16_t)len;
    int id = names[n_names] ? n_names++ : -1;
    pthread_mutex_unlock(&names_mu);
    return id;
}

static void report_alloc(uint8_t op, const void *p, size_t n, int64_t id, int managed)
{
    if (sock_fd < 0 || tl_internal)
        return;
    struct umrt_alloc r = {now_ns(), my_pid, op, (u64)(uintptr_t)p, n, id, (uint8_t)managed};
    push(1, &r);
}

static int current_device(void)
{
    int d = 0;
    if (get_cudaGetDevice())
        real_cudaGetDevice(&d);
    return d;
}

static void report_copy(int64_t t0, int64_t t1, int kind, const void *dst, const void *src, size_t n, void *s,
                        int is_async, int dev)
{
    if (sock_fd < 0)
        return;
    struct umrt_copy r = {t0, t1, (int16_t)dev, my_pid, (u64)(uintptr_t)s, (uint8_t)kind,
                          (u64)(uintptr_t)src, (u64)(uintptr_t)dst, n, (uint8_t)is_async};
    push(2, &r);
}

/* ---------------------------------------------------------------- allocations */

struct alloc { uintptr_t addr; size_t n; int64_t id; int managed; };
static pthread_mutex_t allocs_mu = PTHREAD_MUTEX_INITIALIZER;
static struct alloc *allocs;   /* sorted by addr */
static size_t n_allocs, cap_allocs;
static _Atomic int64_t next_alloc_id;
static _Atomic size_t managed_bytes;

static size_t alloc_pos(uintptr_t a)   /* first index with addr >= a */
{
    size_t lo = 0, hi = n_allocs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (allocs[mid].addr < a)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int64_t track(const void *p, size_t n, int managed)
{
    int64_t id = atomic_fetch_add(&next_alloc_id, 1);
    pthread_mutex_lock(&allocs_mu);
    if (n_allocs == cap_allocs) {
        size_t nc = cap_allocs ? 2 * cap_allocs : 1024;
        struct alloc *na = realloc(allocs, nc * sizeof *na);
        if (!na) {
            pthread_mutex_unlock(&allocs_mu);
            return id;   /* untracked: such memory is never a HUM destination */
        }
        allocs = na, cap_allocs = nc;
    }
    size_t i = alloc_pos((uintptr_t)p);
    memmove(allocs + i + 1, allocs + i, (n_allocs - i) * sizeof *allocs);
    allocs[i] = (struct alloc){(uintptr_t)p, n, id, managed};
    n_allocs++;
    pthread_mutex_unlock(&allocs_mu);
    return id;
}

static int untrack(const void *p, struct alloc *out)
{
    int found = 0;
    pthread_mutex_lock(&allocs_mu);
    size_t i = alloc_pos((uintptr_t)p);
    if (i < n_allocs && allocs[i].addr == (uintptr_t)p) {
        *out = allocs[i];
        memmove(allocs + i, allocs + i + 1, (n_allocs - i - 1) * sizeof *allocs);
        n_allocs--;
        found = 1;
    }
    pthread_mutex_unlock(&allocs_mu);
    return found;
}

/* 1: [p, p+n) lies inside one allocation of ours (managed ones only when `managed`);
   -1: it overlaps one; 0: it touches none. */
/* A new allocation of the program's: tracked, counted against the managed cap, reported. */
static void remember_alloc(const void *p, size_t n, int managed)
{
    if (managed)
        atomic_fetch_add(&managed_bytes, n);
    report_alloc(0, p, n, track(p, n, managed), managed);
}

/* An allocation going away, if it is one we track: untracked, uncounted, reported. */
static void forget_alloc(const void *p)
{
    struct alloc a;
    if (!untrack(p, &a))
        return;
    if (a.managed)
        atomic_fetch_sub(&managed_bytes, a.n);
    report_alloc(1, p, a.n, a.id, a.managed);
}

static int alloc_lookup(const void *p, size_t n, int managed)
{
    uintptr_t a = (uintptr_t)p;
    int r = 0;
    pthread_mutex_lock(&allocs_mu);
    size_t i = alloc_pos(a + 1);   /* allocations starting at or before a are at i-1 */
    if (i > 0) {
        struct alloc *x = &allocs[i - 1];
        if (a < x->addr + x->n)
            r = (a + n <= x->addr + x->n && (!managed || x->managed)) ? 1 : -1;
    }
    if (!r && i < n_allocs && allocs[i].addr < a + n)
        r = -1;
    pthread_mutex_unlock(&allocs_mu);
    return r;
}

/* ---------------------------------------------------------------- HUM: pending copies */

enum { SLOT_FREE = 0, SLOT_PENDING = 1, SLOT_BUSY = 2 };
struct hcopy {
    _Atomic int state;
    char *dst;
    const char *src;
    size_t n;
    uintptr_t a0, a1;              /* the source's whole pages [a0, a1): what may be write-protected */
    _Atomic uintptr_t unprot;      /* [a0, unprot) is writable (never protected, or unprotected again) */
    _Atomic uint32_t done;         /* chunks staged, as a prefix (source read); futex word */
    uint32_t claimed;              /* chunks taken by a worker (under hum_mu) */
    _Atomic int prot_final;        /* the call has returned: [unprot, a1) is the protected rest */
    _Atomic int unprot_busy;       /* a worker is unprotecting (one at a time, outside hum_mu) */
    _Atomic uint32_t waiters;      /* program threads in the SIGSEGV wait on this copy */
    _Atomic int finished;          /* completion ran (last chunk landed and nothing left protected) */
    _Atomic uint32_t landed;       /* chunks whose bytes are in the destination */
    unsigned char *bits;           /* per chunk: staged (under hum_mu) */
    size_t nchunks;
    char *head, *tail;             /* snapshots of the partial pages at either end */
    size_t head_n, tail_n;
    cudaEvent_t ev;                /* the stream's earlier work, which the copy must follow */
    int ev_ok, dev, is_async;
    void *stream;
    int64_t t_issue;
};
static struct hcopy slots[MAX_COPIES];
static _Atomic int hum_pending;
static pthread_mutex_t hum_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hum_done_cv = PTHREAD_COND_INITIALIZER, hum_work_cv = PTHREAD_COND_INITIALIZER;
static int hum_ready;   /* worker running, handler installed */
static int rr_next;

/* Wait until every pending copy is in managed memory. Called first by every interposed call that
   could observe a destination (or a source) of a pending copy. */
static void hum_barrier(void)
{
    if (!atomic_load_explicit(&hum_pending, memory_order_acquire) || tl_internal)
        return;
    atomic_fetch_add(&st_waits, 1);
    pthread_mutex_lock(&hum_mu);
    while (atomic_load(&hum_pending))
        pthread_cond_wait(&hum_done_cv, &hum_mu);
    pthread_mutex_unlock(&hum_mu);
}

/* Does [p, p+n) overlap a pending copy's source (any byte) or destination? */
static int hum_overlaps(const void *p, size_t n)
{
    uintptr_t a = (uintptr_t)p, b = a + n;
    for (int i = 0; i < MAX_COPIES; i++) {
        struct hcopy *c = &slots[i];
        if (atomic_load(&c->state) == SLOT_FREE)
            continue;
        uintptr_t s0 = (uintptr_t)c->src & ~(page_sz - 1), s1 = ((uintptr_t)c->src + c->n + page_sz - 1) & ~(page_sz - 1);
        uintptr_t d0 = (uintptr_t)c->dst, d1 = d0 + c->n;
        if ((a < s1 && s0 < b) || (a < d1 && d0 < b))
            return 1;
    }
    return 0;
}

static void hum_wait_range(const void *p, size_t n)
{
    if (atomic_load_explicit(&hum_pending, memory_order_acquire) && !tl_internal && hum_overlaps(p, n))
        hum_barrier();
}

static long futex(_Atomic uint32_t *w, int op, uint32_t v)
{
    return syscall(SYS_futex, (uint32_t *)w, op, v, NULL, NULL, 0);
}

static struct sigaction prev_segv;
static int prev_segv_set;

static void chain_segv(int sig, siginfo_t *si, void *ctx)
{
    struct sigaction p = prev_segv;
    if ((p.sa_flags & SA_SIGINFO) && p.sa_sigaction) {
        p.sa_sigaction(sig, si, ctx);
    } else if (p.sa_handler != SIG_DFL && p.sa_handler != SIG_IGN && p.sa_handler) {
        p.sa_handler(sig);
    } else {
        /* default action: restore it and return; the access faults again and kills as usual */
        struct sigaction d;
        memset(&d, 0, sizeof d);
        d.sa_handler = SIG_DFL;
        syscall(SYS_rt_sigaction, SIGSEGV, &d, NULL, 8);
    }
}

/* A write to a protected source page: wait (futex, async-signal-safe) until the worker has copied
   the chunk that holds the page and made it writable, then retry the access. A fault that is not
   ours goes to the handler that was there before us. A fault in a range no pending copy holds
   any more is retried once (the worker may have unprotected it between the fault and now). */
static void segv_handler(int sig, siginfo_t *si, void *ctx)
{
    int saved = errno;
    uintptr_t a = (uintptr_t)si->si_addr;
    if (si->si_code == SEGV_ACCERR) {
        for (int i = 0; i < MAX_COPIES; i++) {
            struct hcopy *c = &slots[i];
            if (atomic_load(&c->state) == SLOT_FREE || a < c->a0 || a >= c->a1)
                continue;
            atomic_fetch_add(&st_segv, 1);
            atomic_fetch_add(&c->waiters, 1);   /* workers then unprotect what is staged at once */
            for (;;) {
                uint32_t d = atomic_load(&c->done);
                if (atomic_load(&c->state) == SLOT_FREE || atomic_load(&c->unprot) > a || a < c->a0 || a >= c->a1)
                    break;
                futex(&c->done, FUTEX_WAIT, d);
            }
            atomic_fetch_sub(&c->waiters, 1);
            tl_last_fault = 0;
            errno = saved;
            return;
        }
        if (tl_last_fault != a) {
            tl_last_fault = a;
            errno = saved;
            return;
        }
    }
    tl_last_fault = 0;
    errno = saved;
    chain_segv(sig, si, ctx);
}

/* The bytes of [off, off + len) of a copy come from up to three places: [0, head_n) from the
   head saved at the call, [n - tail_n, n) from the saved tail, the rest from the (protected)
   source. Calls put(c, off, from, bytes) for each piece in order; stops at the first failure. */
typedef int (*piece_fn)(struct hcopy *c, size_t off, const char *from, size_t n);

static int for_pieces(struct hcopy *c, size_t off, size_t len, piece_fn put)
{
    size_t end = off + len;
    while (off < end) {
        size_t stop;
        const char *from;
        if (off < c->head_n) {
            stop = end < c->head_n ? end : c->head_n;
            from = c->head + off;
        } else if (off >= c->n - c->tail_n) {
            stop = end;
            from = c->tail + (off - (c->n - c->tail_n));
        } else {
            stop = end < c->n - c->tail_n ? end : c->n - c->tail_n;
            from = c->src + off;
        }
        if (put(c, off, from, stop - off) != 0)
            return -1;
        off = stop;
    }
    return 0;
}

/* ---- the copy workers (PPoPP'20 §4.4-4.5, in user space)
 *
 * UMCTL_RT_HUM_THREADS workers (default 8, the paper's memory-copy thread count) take chunks round-robin over the pending copies
 * (§4.6). A chunk goes through two steps:
 *   1. staging: the worker memcpy's the source bytes into one of its two pinned buffers
 *      (cudaHostAlloc). The source pages of the chunk may be written again once every chunk up
 *      to it is staged: the staged prefix is unprotected in order, so the SIGSEGV wait and the
 *      protection stay a simple [a0, unprot) interval.
 *   2. DMA: cudaMemcpyAsync from the pinned buffer into the managed destination on the worker's
 *      own non-blocking stream, an event after it. The buffer is reused only after that event,
 *      so one worker stages chunk k+1 while chunk k is on the link.
 * A copy is done (hum_pending drops, barriers pass) when every chunk has *landed*, i.e. its DMA
 * event completed. Why pinned staging: the driver stages a pageable source itself with one
 * thread (~9.6 GB/s on the H100), while several threads memcpy-ing into pinned buffers feed the
 * copy engine at ~55 GB/s; this is where HUM's copies gain on the link, the asynchrony gains on
 * the host. Without pinned buffers (UMCTL_RT_HUM_PINNED=0, or cudaHostAlloc unavailable) a
 * chunk is one pageable cudaMemcpyAsync waited for at once; without the runtime's copy calls, a
 * CPU memcpy into the managed destination and a prefetch. */
#define HUM_NBUF 2
static void *prefetch_stream[MAX_DEV];

static void finish_copy(struct hcopy *c)
{
    int64_t t = now_ns();
    u64 d = (u64)(t - c->t_issue), m = atomic_load(&st_copy_max_ns);
    atomic_fetch_add(&st_copy_ns, d);
    while (d > m && !atomic_compare_exchange_weak(&st_copy_max_ns, &m, d))
        ;
    report_copy(c->t_issue, t, 0 /* H2D */, c->dst, c->src, c->n, c->stream, c->is_async, c->dev);
}

/* our own protection changes bypass the interposed mprotect (which waits and drops the maps cache) */
static int sys_mprotect(uintptr_t a, size_t n, int prot) { return (int)syscall(SYS_mprotect, a, n, prot); }

struct hum_buf {
    char *pin;                     /* CHUNK bytes, pinned and portable */
    cudaEvent_t ev[MAX_DEV];       /* after the DMA from this buffer, on the worker's stream */
    struct hcopy *c;               /* the chunk in flight from this buffer (NULL: none) */
    int dev;
};
struct hum_wk {
    cudaStream_t stream[MAX_DEV];
    struct hum_buf buf[HUM_NBUF];
    int next, cur_dev, pinned;
};

static int put_memcpy(struct hcopy *c, size_t off, const char *from, size_t n)
{
    memcpy(c->dst + off, from, n);
    return 0;
}

static void copy_piece(struct hcopy *c, size_t off, size_t len)
{
    for_pieces(c, off, len, put_memcpy);
}

/* staging into a pinned buffer: the piece callback sees the copy's offset; the buffer holds
   [chunk_off, chunk_off + CHUNK) */
static __thread char *tl_stage_buf;
static __thread size_t tl_stage_off;
static int put_stage(struct hcopy *c, size_t off, const char *from, size_t n)
{
    (void)c;
    memcpy(tl_stage_buf + (off - tl_stage_off), from, n);
    return 0;
}

static __thread cudaStream_t tl_dma_stream;
static int put_dma(struct hcopy *c, size_t off, const char *from, size_t n)
{
    return real_cudaMemcpyAsync(c->dst + off, from, n, 1 /* H2D */, tl_dma_stream) != 0 ? -1 : 0;
}

static int wk_device(struct hum_wk *w, int dev)
{
    if (dev < 0 || dev >= MAX_DEV)
        return 0;
    if (w->cur_dev != dev && (!get_cudaSetDevice() || real_cudaSetDevice(dev) != 0))
        return 0;
    w->cur_dev = dev;
    if (!w->stream[dev] && (!get_cudaStreamCreateWithFlags()
                            || real_cudaStreamCreateWithFlags(&w->stream[dev], 1 /* non-blocking */) != 0)) {
        w->stream[dev] = NULL;
        return 0;
    }
    return 1;
}

/* The copy is complete when its last chunk has landed and no source page is protected any more
   (after the call returned): then, once, the slot is freed and barriers pass. */
static void try_finish(struct hcopy *c)
{
    if (atomic_load(&c->landed) != c->nchunks || !atomic_load(&c->prot_final) || atomic_load(&c->unprot) != c->a1)
        return;
    int z = 0;
    if (!atomic_compare_exchange_strong(&c->finished, &z, 1))
        return;
    finish_copy(c);
    free(c->head);
    free(c->tail);
    free(c->bits);
    c->head = c->tail = NULL;
    c->bits = NULL;
    pthread_mutex_lock(&hum_mu);
    atomic_store(&c->state, SLOT_FREE);
    futex(&c->done, FUTEX_WAKE, 0x7fffffff);
    atomic_fetch_sub(&hum_pending, 1);
    pthread_cond_broadcast(&hum_done_cv);
    pthread_mutex_unlock(&hum_mu);
}

/* a chunk's bytes are in place on the GPU (or in managed memory) */
static void chunk_landed(struct hcopy *c)
{
    if (atomic_fetch_add(&c->landed, 1) + 1 == c->nchunks)
        try_finish(c);
}

/* The page boundary at chunk k of the source: chunks [0, k) hold the source pages [a0, this). */
static uintptr_t chunk_addr(const struct hcopy *c, size_t k)
{
    if (k >= c->nchunks)
        return c->a1;
    uintptr_t x = ((uintptr_t)c->src + k * CHUNK) & ~(page_sz - 1);
    return x < c->a0 ? c->a0 : x > c->a1 ? c->a1 : x;
}

/* Can [unprot, the staged prefix) be made writable now? In steps of UMCTL_RT_HUM_UNPROT_STEP,
   at once when a writer waits for its page or when the whole source is staged. */
static size_t cfg_unprot_step = (size_t)32 << 20, cfg_protect_group = (size_t)16 << 20;
static int unprotect_due(struct hcopy *c, uintptr_t u, uintptr_t upto)
{
    return upto > u && (upto == c->a1 || atomic_load(&c->waiters) || upto - u >= cfg_unprot_step);
}

/* Make the staged prefix of the protected source writable again. mprotect costs per page
   (~80 ns per 4 KiB page measured, whatever the call size), and each call also splits a VMA and
   shoots down the TLBs of the process's threads: so this runs outside hum_mu, one thread at a
   time, in large steps. Only once the call has returned (prot_final): until then the caller is
   still choosing what to protect. */
static void unprotect_staged(struct hcopy *c)
{
    for (;;) {
        if (!atomic_load(&c->prot_final))
            return;
        int z = 0;
        if (!atomic_compare_exchange_strong(&c->unprot_busy, &z, 1))
            return;   /* the thread at it looks again after it lets go */
        uintptr_t u = atomic_load(&c->unprot), upto = chunk_addr(c, atomic_load(&c->done));
        if (unprotect_due(c, u, upto)) {
            int64_t t = now_ns();
            sys_mprotect(u, upto - u, PROT_READ | PROT_WRITE);
            atomic_fetch_add(&st_unprot_ns, (u64)(now_ns() - t));
            atomic_store(&c->unprot, upto);
            futex(&c->done, FUTEX_WAKE, 0x7fffffff);
        }
        atomic_store(&c->unprot_busy, 0);
        u = atomic_load(&c->unprot);
        if (u == c->a1) {
            try_finish(c);
            return;
        }
        /* staged meanwhile by a thread that found us busy? */
        if (!unprotect_due(c, u, chunk_addr(c, atomic_load(&c->done))))
            return;
    }
}

/* chunk k's source bytes have been read: extend the staged prefix, wake the caller and the
   writers waiting on it, unprotect */
static void chunk_staged(struct hcopy *c, uint32_t k)
{
    pthread_mutex_lock(&hum_mu);
    c->bits[k] = 1;
    uint32_t p = atomic_load(&c->done);
    while (p < c->nchunks && c->bits[p])
        p++;
    int moved = p != atomic_load(&c->done);
    if (moved) {
        atomic_store(&c->done, p);
        futex(&c->done, FUTEX_WAKE, 0x7fffffff);
    }
    pthread_mutex_unlock(&hum_mu);
    if (moved)
        unprotect_staged(c);
}

/* wait for the DMA out of buffer b, then count its chunk as landed */
static void buf_retire(struct hum_buf *b)
{
    if (!b->c)
        return;
    struct hcopy *c = b->c;
    b->c = NULL;
    int64_t t = now_ns();
    real_cudaEventSynchronize(b->ev[b->dev]);
    atomic_fetch_add(&st_dmawait_ns, (u64)(now_ns() - t));
    atomic_fetch_add(&st_pinned, 1);
    chunk_landed(c);
}

static void wk_retire_all(struct hum_wk *w)
{
    for (int i = 0; i < HUM_NBUF; i++)
        buf_retire(&w->buf[(w->next + i) % HUM_NBUF]);
}

static int wk_pinned(struct hum_wk *w)
{
    if (w->pinned)
        return w->pinned > 0;
    w->pinned = -1;
    /* resolve every call the pinned path makes: the program itself may never have called them
       (an nvcc sample uses cudaMemcpy only, so real_cudaMemcpyAsync would still be NULL) */
    if (!env_size("UMCTL_RT_HUM_PINNED", 1) || !get_cudaHostAlloc() || !get_cudaEventRecord()
        || !get_cudaEventCreateWithFlags() || !get_cudaEventSynchronize() || !get_cudaMemcpyAsync()
        || !get_cudaStreamSynchronize() || !get_cudaGetLastError())
        return 0;
    for (int i = 0; i < HUM_NBUF; i++) {
        void *p = NULL;
        if (real_cudaHostAlloc(&p, CHUNK, 1 /* portable */) != 0 || !p) {
            if (get_cudaGetLastError())
                real_cudaGetLastError();
            return 0;   /* (a buffer already allocated stays: a few MiB, for the process's life) */
        }
        w->buf[i].pin = p;
    }
    w->pinned = 1;
    return 1;
}

/* one chunk through a pinned buffer; 0 when it was issued (it lands later) */
static int chunk_pinned(struct hum_wk *w, struct hcopy *c, uint32_t k, size_t off, size_t len)
{
    struct hum_buf *b = &w->buf[w->next];
    buf_retire(b);
    if (!b->ev[c->dev] && real_cudaEventCreateWithFlags(&b->ev[c->dev], 2 /* disable timing */) != 0) {
        b->ev[c->dev] = NULL;
        return -1;
    }
    tl_stage_buf = b->pin, tl_stage_off = off;
    int64_t t = now_ns();
    for_pieces(c, off, len, put_stage);
    atomic_fetch_add(&st_stage_ns, (u64)(now_ns() - t));
    chunk_staged(c, k);
    if (real_cudaMemcpyAsync(c->dst + off, b->pin, len, 1 /* H2D */, w->stream[c->dev]) != 0
        || real_cudaEventRecord(b->ev[c->dev], w->stream[c->dev]) != 0) {
        /* the bytes are staged (and the source may already be written again): finish from the
           buffer, synchronously, by CPU */
        if (get_cudaGetLastError())
            real_cudaGetLastError();
        real_cudaStreamSynchronize(w->stream[c->dev]);
        memcpy(c->dst + off, b->pin, len);
        chunk_landed(c);
        return 0;
    }
    b->c = c, b->dev = c->dev;
    w->next = (w->next + 1) % HUM_NBUF;
    return 0;
}

/* one chunk by pageable DMA (waited for) or by CPU memcpy + prefetch; lands at once */
static void chunk_plain(struct hum_wk *w, struct hcopy *c, uint32_t k, size_t off, size_t len)
{
    int dma = 0;
    if (w->cur_dev == c->dev && get_cudaMemcpyAsync() && get_cudaStreamSynchronize()) {
        tl_dma_stream = w->stream[c->dev];
        dma = for_pieces(c, off, len, put_dma) == 0 && real_cudaStreamSynchronize(tl_dma_stream) == 0;
    }
    if (dma) {
        atomic_fetch_add(&st_dma, 1);
    } else {
        if (get_cudaGetLastError())
            real_cudaGetLastError();
        copy_piece(c, off, len);
        if (cu_prefetch && w->cur_dev == c->dev) {
            if (!prefetch_stream[c->dev] && get_cudaStreamCreateWithFlags())
                real_cudaStreamCreateWithFlags(&prefetch_stream[c->dev], 1 /* non-blocking */);
            if (cu_prefetch((u64)(uintptr_t)(c->dst + off), len, c->dev, prefetch_stream[c->dev]) == 0)
                atomic_fetch_add(&st_prefetch, 1);
            if (get_cudaGetLastError())
                real_cudaGetLastError();
        }
    }
    chunk_staged(c, k);
    chunk_landed(c);
}

static void *hum_worker(void *arg)
{
    (void)arg;
    tl_internal = 1;
    struct hum_wk w;
    memset(&w, 0, sizeof w);
    w.cur_dev = -1;
    for (;;) {
        struct hcopy *c = NULL;
        uint32_t k = 0;
        pthread_mutex_lock(&hum_mu);
        for (;;) {
            for (int j = 0; j < MAX_COPIES; j++) {   /* round-robin over the copy queues (§4.6) */
                int i = (rr_next + j) % MAX_COPIES;
                if (atomic_load(&slots[i].state) == SLOT_PENDING && slots[i].claimed < slots[i].nchunks) {
                    c = &slots[i];
                    k = c->claimed++;
                    rr_next = (i + 1) % MAX_COPIES;
                    break;
                }
            }
            if (c)
                break;
            int busy = 0;
            for (int i = 0; i < HUM_NBUF; i++)
                busy |= w.buf[i].c != NULL;
            if (busy) {   /* nothing to stage: let the chunks in flight land first */
                pthread_mutex_unlock(&hum_mu);
                wk_retire_all(&w);
                pthread_mutex_lock(&hum_mu);
                continue;
            }
            pthread_cond_wait(&hum_work_cv, &hum_mu);
        }
        pthread_mutex_unlock(&hum_mu);

        if (c->ev_ok)   /* the copy follows the earlier work of its stream */
            real_cudaEventSynchronize(c->ev);
        size_t off = (size_t)k * CHUNK, len = c->n - off < CHUNK ? c->n - off : CHUNK;
        if (cfg_delay_us)
            usleep(cfg_delay_us);
        int on_dev = wk_device(&w, c->dev);
        if (!on_dev && get_cudaGetLastError())
            real_cudaGetLastError();
        atomic_fetch_add(&st_chunks, 1);
        if (!(on_dev && wk_pinned(&w) && chunk_pinned(&w, c, k, off, len) == 0))
            chunk_plain(&w, c, k, off, len);
    }
    return NULL;
}

static void install_segv(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = segv_handler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    struct sigaction old;
    /* through the syscall wrapper of libc, not our interposed sigaction */
    typedef int (*sa_t)(int, const struct sigaction *, struct sigaction *);
    sa_t real_sa = (sa_t)rdlsym(RTLD_NEXT, "sigaction");
    if (real_sa && real_sa(SIGSEGV, &sa, &old) == 0) {
        prev_segv = old;
        prev_segv_set = 1;
    }
}

static pthread_once_t hum_once = PTHREAD_ONCE_INIT;
static void hum_start(void)
{
    int v = 0, d = current_device();
    tl_internal++;
    /* host writes to managed memory while kernels run need concurrent managed access */
    if (!get_cudaDeviceGetAttribute() || real_cudaDeviceGetAttribute(&v, 89, d) != 0 || !v) {
        if (get_cudaGetLastError())
            real_cudaGetLastError();
        tl_internal--;
        return;
    }
    tl_internal--;
    if (!get_cudaEventCreateWithFlags() || !get_cudaEventRecord() || !get_cudaEventSynchronize())
        return;
    pthread_once(&driver_once, load_driver);
    install_segv();
    if (!prev_segv_set)
        return;
    /* copy workers (UMCTL_RT_HUM_THREADS, default 8 as in the paper's evaluation; measured on
       the H100: one thread stages ~8.7 GB/s, so 8 keep ahead of the 55 GB/s pinned link less
       the unprotect/fault overheads): HUM is on if at least one started */
    size_t nw = env_size("UMCTL_RT_HUM_THREADS", 8);
    for (size_t i = 0; i < (nw < 1 ? 1 : nw > 32 ? 32 : nw); i++)
        hum_ready |= spawn_detached(hum_worker);
}

/* /proc/self/maps, cached: ranges of private writable mappings that are not stacks. Refreshed
   on a miss and dropped whenever the program maps, unmaps or reprotects memory through libc. */
struct rng { uintptr_t lo, hi; };
static pthread_mutex_t maps_mu = PTHREAD_MUTEX_INITIALIZER;
static struct rng *maps;
static size_t n_maps;
static _Atomic int maps_valid;

static void maps_refresh(void)
{
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf)
            break;
        if (len + 4096 > cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) { free(buf); buf = NULL; break; }
            buf = nb, cap *= 2;
        }
        ssize_t r = read(fd, buf + len, cap - len - 1);
        if (r <= 0)
            break;
        len += r;
    }
    close(fd);
    if (!buf)
        return;
    buf[len] = 0;
    size_t n = 0, ncap = 256;
    struct rng *out = malloc(ncap * sizeof *out);
    for (char *line = buf; out && line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = 0;
        unsigned long lo, hi;
        char perms[8] = {0};
        int pos = 0;
        if (sscanf(line, "%lx-%lx %7s %*s %*s %*s%n", &lo, &hi, perms, &pos) >= 3) {
            char *path = line + pos;
            while (*path == ' ')
                path++;
            int ok = perms[0] == 'r' && perms[1] == 'w' && perms[3] == 'p' &&
                     (*path == 0 || *path == '/' || strcmp(path, "[heap]") == 0);
            if (ok) {
                if (n && out[n - 1].hi == lo) {
                    out[n - 1].hi = hi;
                } else {
                    if (n == ncap) {
                        struct rng *no = realloc(out, 2 * ncap * sizeof *out);
                        if (!no) { free(out); out = NULL; break; }
                        out = no, ncap *= 2;
                    }
                    out[n++] = (struct rng){lo, hi};
                }
            }
        }
        line = nl ? nl + 1 : NULL;
    }
    free(buf);
    if (!out)
        return;
    free(maps);
    maps = out;
    n_maps = n;
    atomic_store(&maps_valid, 1);
}

static int maps_covers(uintptr_t lo, uintptr_t hi)
{
    for (size_t i = 0; i < n_maps; i++)
        if (maps[i].lo <= lo && hi <= maps[i].hi)
            return 1;
    return 0;
}

static int plain_rw(uintptr_t lo, uintptr_t hi)
{
    pthread_mutex_lock(&maps_mu);
    int ok = atomic_load(&maps_valid) && maps_covers(lo, hi);
    if (!ok) {
        maps_refresh();
        ok = maps_covers(lo, hi);
    }
    pthread_mutex_unlock(&maps_mu);
    if (ok) {   /* never the calling thread's own stack: the handler could not run on it */
        pthread_attr_t at;
        void *sa;
        size_t ss;
        if (pthread_getattr_np(pthread_self(), &at) == 0) {
            if (pthread_attr_getstack(&at, &sa, &ss) == 0 && lo < (uintptr_t)sa + ss && (uintptr_t)sa < hi)
                ok = 0;
            pthread_attr_destroy(&at);
        }
    }
    return ok;
}

static void maps_invalidate(void) { atomic_store(&maps_valid, 0); }

/* Take the HUM path for this copy? Returns 1 when the copy was queued (the caller returns
   success at once), 0 when the original call must run. */
static pthread_mutex_t issue_mu = PTHREAD_MUTEX_INITIALIZER;
static int hum_issue(void *dst, const void *src, size_t n, void *stream, int is_async, uintptr_t s, uintptr_t a0,
                     uintptr_t a1);

static int hum_try(void *dst, const void *src, size_t n, int kind, void *stream, int is_async)
{
    if (!cfg_hum || tl_internal || n < cfg_hum_min || (kind != cudaMemcpyHostToDevice && kind != cudaMemcpyDefault))
        return 0;
    if (alloc_lookup(dst, n, 1) != 1 || alloc_lookup(src, n, 0) != 0)
        return 0;
    uintptr_t s = (uintptr_t)src, a0 = (s + page_sz - 1) & ~(page_sz - 1), a1 = (s + n) & ~(page_sz - 1);
    if (a1 <= a0 + page_sz)
        return 0;
    pthread_once(&hum_once, hum_start);
    if (!hum_ready)
        return 0;
    tl_internal++;
    int ok = 0;
    unsigned char attr[256];
    memset(attr, 0, sizeof attr);
    int cap_status = 0;
    if (get_cudaPointerGetAttributes() && real_cudaPointerGetAttributes(attr, src) == 0 && *(int *)attr == 0 &&
        (!get_cudaStreamIsCapturing() || (real_cudaStreamIsCapturing(stream, &cap_status) == 0 && cap_status == 0)))
        ok = 1;
    if (get_cudaGetLastError())
        real_cudaGetLastError();
    tl_internal--;
    if (!ok || !plain_rw(s & ~(page_sz - 1), (s + n + page_sz - 1) & ~(page_sz - 1))) {
        atomic_fetch_add(&st_fallback, 1);
        return 0;
    }
    /* one issue at a time: the overlap check and the protection must not interleave with another's */
    int64_t t0 = now_ns();
    pthread_mutex_lock(&issue_mu);
    int queued = hum_issue(dst, src, n, stream, is_async, s, a0, a1);
    pthread_mutex_unlock(&issue_mu);
    atomic_fetch_add(&st_call_ns, (u64)(now_ns() - t0));
    if (queued)
        atomic_fetch_add(&st_hum, 1);
    else
        atomic_fetch_add(&st_fallback, 1);
    return queued;
}

static int hum_issue(void *dst, const void *src, size_t n, void *stream, int is_async, uintptr_t s, uintptr_t a0,
                     uintptr_t a1)
{
    /* a copy that shares bytes or pages with a pending one waits for it (simple and safe) */
    hum_wait_range(dst, n);
    hum_wait_range((void *)(s & ~(page_sz - 1)), ((s + n + page_sz - 1) & ~(page_sz - 1)) - (s & ~(page_sz - 1)));

    struct hcopy *c = NULL;
    pthread_mutex_lock(&hum_mu);
    for (int i = 0; i < MAX_COPIES && !c; i++)
        if (atomic_load(&slots[i].state) == SLOT_FREE) {
            c = &slots[i];
            atomic_store(&c->state, SLOT_BUSY);
        }
    pthread_mutex_unlock(&hum_mu);
    if (!c) {
        hum_barrier();
        return 0;
    }
    c->dst = dst, c->src = src, c->n = n, c->a0 = a0, c->a1 = a1;
    c->head_n = a0 - s, c->tail_n = s + n - a1;
    c->head = c->head_n ? malloc(c->head_n) : NULL;
    c->tail = c->tail_n ? malloc(c->tail_n) : NULL;
    c->nchunks = (n + CHUNK - 1) / CHUNK;
    c->dev = current_device();
    c->stream = stream, c->is_async = is_async, c->t_issue = now_ns();
    atomic_store(&c->unprot, a0);
    atomic_store(&c->done, 0);
    atomic_store(&c->landed, 0);
    atomic_store(&c->prot_final, 0);
    atomic_store(&c->unprot_busy, 0);
    atomic_store(&c->waiters, 0);
    atomic_store(&c->finished, 0);
    c->claimed = 0;
    c->bits = calloc(c->nchunks, 1);
    tl_internal++;
    int fail = (c->head_n && !c->head) || (c->tail_n && !c->tail) || !c->bits;
    if (!fail && !c->ev && real_cudaEventCreateWithFlags(&c->ev, 2 /* disable timing */) != 0)
        fail = 1;
    if (!fail && real_cudaEventRecord(c->ev, stream) != 0)
        fail = 1;
    if (fail && get_cudaGetLastError())
        real_cudaGetLastError();
    tl_internal--;
    if (fail) {
        free(c->head);
        free(c->tail);
        free(c->bits);
        c->head = c->tail = NULL;
        c->bits = NULL;
        atomic_store(&c->state, SLOT_FREE);
        return 0;
    }
    /* snapshot the partial pages now: they are never protected (they hold other data too) */
    if (c->head_n)
        memcpy(c->head, src, c->head_n);
    if (c->tail_n)
        memcpy(c->tail, (const char *)src + n - c->tail_n, c->tail_n);
    c->ev_ok = 1;
    pthread_mutex_lock(&hum_mu);
    atomic_fetch_add(&hum_pending, 1);
    atomic_store(&c->state, SLOT_PENDING);
    pthread_cond_broadcast(&hum_work_cv);
    pthread_mutex_unlock(&hum_mu);

    /* Protect from the end while the workers stage from the start (PPoPP'20 §4.3's write
       protection, made cheaper): a chunk the workers reach before the call returns needs no
       protection, because its bytes are read before the program can write them again. So the
       call write-protects UMCTL_RT_HUM_PROTECT_GROUP bytes at a time, from the last chunk down,
       until it meets the chunks the workers have taken; waits until those are staged; and
       returns. mprotect costs per page, so this halves the protection work at the call and
       the unprotection after it when staging keeps pace, and changes nothing when the workers
       cannot start yet (the stream is busy): then the whole source is protected, as before. */
    int64_t tp = now_ns();
    uint32_t lo = (uint32_t)c->nchunks, group = (uint32_t)(cfg_protect_group / CHUNK);
    int all = 0;   /* a protection failed: stage everything before returning instead */
    if (!group)
        group = 1;
    for (;;) {
        pthread_mutex_lock(&hum_mu);
        uint32_t cl = c->claimed;
        pthread_mutex_unlock(&hum_mu);
        if (lo <= cl)
            break;
        uint32_t g0 = lo > cl + group ? lo - group : cl;
        uintptr_t p0 = chunk_addr(c, g0), p1 = chunk_addr(c, lo);
        if (p1 > p0 && sys_mprotect(p0, p1 - p0, PROT_READ) != 0) {
            all = 1;
            break;
        }
        lo = g0;
    }
    atomic_fetch_add(&st_protect_ns, (u64)(now_ns() - tp));
    /* chunks below lo are unprotected: their bytes must be read before the program runs on */
    uint32_t need = all ? (uint32_t)c->nchunks : lo;
    for (uint32_t d; (d = atomic_load(&c->done)) < need;)
        futex(&c->done, FUTEX_WAIT, d);
    atomic_store(&c->unprot, chunk_addr(c, lo));
    atomic_store(&c->prot_final, 1);
    futex(&c->done, FUTEX_WAKE, 0x7fffffff);
    unprotect_staged(c);   /* if the workers are done already, nobody else will */
    return 1;
}

/* ---------------------------------------------------------------- driver-level barriers */

/* Work that reaches the driver without the runtime symbols we interpose (cuBLAS's private
   cudart, Triton, a program using the driver API) must wait for pending copies too. libcudart
   and the others find driver entry points through dlsym(libcuda, ...) and cuGetProcAddress; while
   HUM is on, both hand out, for every entry point that enqueues GPU work, synchronises or
   touches memory, a trampoline that runs the barrier and then the real function. The
   trampolines pass 12 integer-class arguments through unchanged (x86-64 SysV: six registers and
   six stack slots), which covers every such entry point (none takes floating-point arguments or
   more than 48 bytes of stack arguments). */
static const char *const barrier_prefixes[] = {
    "cuLaunch", "cuGraphLaunch", "cuMemcpy", "cuMemset", "cuMemFree", "cuMemPrefetch", "cuMemAdvise",
    "cuMemDiscard", "cuMemHostUnregister", "cuMemUnmap", "cuMemRelease", "cuStreamSynchronize", "cuStreamQuery",
    "cuStreamWait", "cuStreamWrite", "cuStreamBatchMemOp", "cuStreamAddCallback", "cuStreamDestroy",
    "cuStreamBeginCapture", "cuEventRecord", "cuEventSynchronize", "cuEventQuery", "cuCtxSynchronize",
    "cuCtxDestroy", "cuDevicePrimaryCtxReset", "cuDevicePrimaryCtxRelease", "cuSignalExternalSemaphores",
    "cuWaitExternalSemaphores", "cuIpcGetMemHandle", "cuModuleUnload", "cuLibraryUnload", NULL,
};

static int needs_barrier(const char *name)
{
    if (!name)
        return 0;
    for (int i = 0; barrier_prefixes[i]; i++)
        if (strncmp(name, barrier_prefixes[i], strlen(barrier_prefixes[i])) == 0)
            return 1;
    return 0;
}

typedef u64 (*fn12)(u64, u64, u64, u64, u64, u64, u64, u64, u64, u64, u64, u64);
#define NSLOTS 512
static void *slot_real[NSLOTS];
static int n_slots;
static pthread_mutex_t slots_mu = PTHREAD_MUTEX_INITIALIZER;

#define TRAMP(n)                                                                                           \
    static u64 tramp_##n(u64 a, u64 b, u64 c, u64 d, u64 e, u64 f, u64 g, u64 h, u64 i, u64 j, u64 k, u64 l) \
    {                                                                                                      \
        hum_barrier();                                                                                     \
        return ((fn12)slot_real[0b##n])(a, b, c, d, e, f, g, h, i, j, k, l);                               \
    }
#define T2(n) TRAMP(n##0) TRAMP(n##1)
#define T4(n) T2(n##0) T2(n##1)
#define T8(n) T4(n##0) T4(n##1)
#define T16(n) T8(n##0) T8(n##1)
#define T32(n) T16(n##0) T16(n##1)
#define T64(n) T32(n##0) T32(n##1)
#define T128(n) T64(n##0) T64(n##1)
#define T256(n) T128(n##0) T128(n##1)
#define T512(n) T256(n##0) T256(n##1)
T512()
#define P1(n) (void *)tramp_##n,
#define P2(n) P1(n##0) P1(n##1)
#define P4(n) P2(n##0) P2(n##1)
#define P8(n) P4(n##0) P4(n##1)
#define P16(n) P8(n##0) P8(n##1)
#define P32(n) P16(n##0) P16(n##1)
#define P64(n) P32(n##0) P32(n##1)
#define P128(n) P64(n##0) P64(n##1)
#define P256(n) P128(n##0) P128(n##1)
#define P512(n) P256(n##0) P256(n##1)
static void *const tramps[NSLOTS] = {P512()};

static void *wrap_entry(void *real)
{
    if (!real)
        return real;
    void *out = real;
    pthread_mutex_lock(&slots_mu);
    int i;
    for (i = 0; i < n_slots; i++)
        if (slot_real[i] == real)
            break;
    if (i == n_slots && n_slots < NSLOTS)
        slot_real[n_slots++] = real;
    if (i < n_slots) {
        out = tramps[i];
        atomic_fetch_add(&st_wrapped, 1);
    }
    pthread_mutex_unlock(&slots_mu);
    return out;
}

/* Managed memory the program takes from the driver API itself (a PyTorch pluggable allocator
   over cuMemAllocManaged, cudart's cudaMallocManaged): reported like the runtime's own, so a
   recorded trace knows which ranges were freed and allocated again (their pages start over). */
typedef int (*cu_alloc_managed_t)(u64 *, size_t, unsigned);
typedef int (*cu_free_t)(u64);
static _Atomic(cu_alloc_managed_t) real_cu_alloc_managed;
static _Atomic(cu_free_t) real_cu_free;

static int cu_alloc_managed_wrapper(u64 *p, size_t n, unsigned flags)
{
    cu_alloc_managed_t f = atomic_load(&real_cu_alloc_managed);
    if (!f)
        return 1;
    int r = f(p, n, flags);
    if (r == 0 && p && *p && n && !tl_internal && alloc_lookup((void *)(uintptr_t)*p, n, 0) == 0)
        remember_alloc((void *)(uintptr_t)*p, n, 1);
    return r;
}

static int cu_free_wrapper(u64 p)
{
    cu_free_t f = atomic_load(&real_cu_free);
    if (!f)
        return 1;
    hum_barrier();
    if (p && !tl_internal)
        forget_alloc((void *)(uintptr_t)p);
    return f(p);
}

/* The wrapper for an allocation entry point of the driver, or NULL when `sym` is none. */
static void *wrap_alloc_entry(const char *sym, void *real)
{
    if (!real || sock_fd < 0)
        return NULL;
    if (strcmp(sym, "cuMemAllocManaged") == 0) {
        atomic_store(&real_cu_alloc_managed, (cu_alloc_managed_t)real);
        return (void *)cu_alloc_managed_wrapper;
    }
    if (strcmp(sym, "cuMemFree") == 0 || strcmp(sym, "cuMemFree_v2") == 0) {
        atomic_store(&real_cu_free, (cu_free_t)real);
        return (void *)cu_free_wrapper;
    }
    return NULL;
}

static int wrap_getproc(const char *sym, void **pfn, u64 flags);
static void *wrap_launch_entry(const char *sym, void *real, int ptsz);

static int getproc_wrapper(const char *sym, void **pfn, int ver, u64 flags)
{
    if (!real_getproc)
        return 1;
    int r = real_getproc(sym, pfn, ver, flags);
    if (r == 0)
        wrap_getproc(sym, pfn, flags);
    return r;
}

static int getproc_v2_wrapper(const char *sym, void **pfn, int ver, u64 flags, void *status)
{
    if (!real_getproc_v2)
        return 1;
    int r = real_getproc_v2(sym, pfn, ver, flags, status);
    if (r == 0)
        wrap_getproc(sym, pfn, flags);
    return r;
}

static int wrap_getproc(const char *sym, void **pfn, u64 flags)
{
    if (!pfn || !*pfn || !sym)
        return 0;
    if (strcmp(sym, "cuGetProcAddress") == 0) {
        /* cuGetProcAddress itself, asked through cuGetProcAddress: the version decides the ABI */
        if (*pfn == (void *)real_getproc || *pfn == (void *)real_getproc_v2)
            *pfn = *pfn == (void *)real_getproc ? (void *)getproc_wrapper : (void *)getproc_v2_wrapper;
        return 0;
    }
    void *w = wrap_alloc_entry(sym, *pfn);
    if (!w)   /* CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM (2): the _ptsz form */
        w = wrap_launch_entry(sym, *pfn, (flags & 2) != 0);
    if (w)
        *pfn = w;
    else if (cfg_hum && needs_barrier(sym))
        *pfn = wrap_entry(*pfn);
    return 0;
}

static void *dlsym_hum(void *h, const char *name)
{
    void *p = real_dlsym(h, name);
    if (!p || !name || name[0] != 'c' || name[1] != 'u' || name[2] == 'd')
        return p;
    if (strcmp(name, "cuGetProcAddress") == 0) {
        real_getproc = (cuGetProcAddress_t)p;
        return (void *)getproc_wrapper;
    }
    if (strncmp(name, "cuGetProcAddress_v2", 19) == 0) {
        real_getproc_v2 = (cuGetProcAddress_v2_t)p;
        return (void *)getproc_v2_wrapper;
    }
    void *w = wrap_alloc_entry(name, p);
    if (!w) {
        size_t nl = strlen(name);
        int ptsz = nl > 5 && strcmp(name + nl - 5, "_ptsz") == 0;
        char base[64];
        if (ptsz && nl - 5 < sizeof base) {
            memcpy(base, name, nl - 5);
            base[nl - 5] = 0;
            w = wrap_launch_entry(base, p, 1);
        } else if (!ptsz) {
            w = wrap_launch_entry(name, p, 0);
        }
    }
    if (w)
        return w;
    return cfg_hum && needs_barrier(name) ? wrap_entry(p) : p;
}

/* glibc resolves RTLD_NEXT relative to dlsym's return address: the plain case must therefore be
   a tail call (a jump), so that the real dlsym sees our caller's address, not ours. */
API void *dlsym(void *h, const char *name)
{
    if (__builtin_expect(!real_dlsym, 0))
        resolve_dlsym();
    if (h == RTLD_NEXT || !(cfg_hum || sock_fd >= 0))
        return real_dlsym(h, name);
    return dlsym_hum(h, name);
}

/* ---------------------------------------------------------------- launch identity */

struct finfo { const void *f; int32_t name_id; int nparams; uint32_t *sizes; uint64_t name_hash; int part; };
#define FTAB 8192
static struct finfo ftab[FTAB];
static pthread_mutex_t ftab_mu = PTHREAD_MUTEX_INITIALIZER;

static u64 fnv(u64 h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}
#define FNV0 0xcbf29ce484222325ULL


/* SnuRHAC convention (umctl_snurhac.h): the kernel's first parameter is a umctl_part_t. Read
   from the Itanium-mangled name: _Z[L]<len><id>12umctl_part_t..., _ZN...E12umctl_part_t... (in a
   namespace), or a template's ...Ev12umctl_part_t... (a template function's mangling carries its
   void return type before the parameters); a demangled name has "(umctl_part_t". */
#define PART_TYPE "12umctl_part_t"
static int part_kernel_name(const char *nm)
{
    if (!nm)
        return 0;
    if (strstr(nm, "(umctl_part_t"))
        return 1;
    if (nm[0] != '_' || nm[1] != 'Z')
        return 0;
    const char *p = nm + 2;
    if (*p == 'L')
        p++;
    int nested = *p == 'N';
    if (nested) {
        p++;
        while (*p == 'K' || *p == 'V' || *p == 'r')
            p++;
    }
    for (;;) {
        if (*p < '0' || *p > '9')
            break;
        char *end;
        unsigned long len = strtoul(p, &end, 10);
        if (strlen(end) < len)
            return 0;
        p = end + len;
        if (!nested)
            break;
    }
    if (nested) {
        if (*p != 'E')
            return 0;
        p++;
    }
    if (*p == 'I')   /* template arguments: not parsed; the void return type then the parameters */
        return strstr(p, "Ev" PART_TYPE) != NULL;
    return strncmp(p, PART_TYPE, strlen(PART_TYPE)) == 0;
}

/* What is known of a kernel: `f` is a host stub (drv = 0) or a driver CUfunction / CUkernel
   handle (drv = 1: a launch that reached the driver without a runtime entry point of ours). */
static struct finfo *func_info(const void *f, int drv)
{
    size_t i = ((uintptr_t)f >> 4) * 0x9E3779B97F4A7C15ULL >> 51;   /* 13 bits */
    pthread_mutex_lock(&ftab_mu);
    for (size_t k = 0; k < FTAB; k++, i = (i + 1) & (FTAB - 1)) {
        if (ftab[i].f == f) {
            pthread_mutex_unlock(&ftab_mu);
            return &ftab[i];
        }
        if (!ftab[i].f)
            break;
    }
    struct finfo *e = ftab[i].f ? NULL : &ftab[i];
    pthread_mutex_unlock(&ftab_mu);
    struct finfo fi = {f, -1, -1, NULL, FNV0, 0};
    tl_internal++;
    const char *name = NULL;
    pthread_once(&driver_once, load_driver);
    int named = drv ? (cu_func_name && cu_func_name(&name, (void *)f) == 0) ||
                          (cu_kernel_name && cu_kernel_name(&name, (void *)f) == 0)
                    : get_cudaFuncGetName() && real_cudaFuncGetName(&name, f) == 0;
    if (named && name && *name) {
        fi.name_id = intern_name(name);
        fi.name_hash = fnv(FNV0, name, strlen(name));
        fi.part = part_kernel_name(name);
    } else {
        fi.name_hash = fnv(FNV0, &f, sizeof f);   /* unnamed: the host stub's address */
    }
    void *cf = drv ? (void *)f : NULL;
    if (cu_param_info && (drv || (get_cudaGetFuncBySymbol() && real_cudaGetFuncBySymbol(&cf, f) == 0)) && cf) {
        uint32_t tmp[256];
        int np = 0;
        size_t off, sz;
        while (np < 256 && cu_param_info(cf, np, &off, &sz) == 0)
            tmp[np++] = (uint32_t)sz;
        if (drv && !np && cu_kernel_param_info)
            while (np < 256 && cu_kernel_param_info(cf, np, &off, &sz) == 0)
                tmp[np++] = (uint32_t)sz;
        fi.nparams = np;
        if (np) {
            fi.sizes = malloc(np * sizeof *fi.sizes);
            if (fi.sizes)
                memcpy(fi.sizes, tmp, np * sizeof *tmp);
            else
                fi.nparams = -1;
        }
    }
    if (!drv && get_cudaGetLastError())
        real_cudaGetLastError();
    tl_internal--;
    if (!e)
        return NULL;   /* table full: not cached, identity without arguments */
    pthread_mutex_lock(&ftab_mu);
    if (!e->f)
        *e = fi;
    else
        free(fi.sizes);
    pthread_mutex_unlock(&ftab_mu);
    return e;
}

/* Occurrences of each argument-less identity since the host last waited for the GPU to drain
   (cudaDeviceSynchronize / cudaStreamSynchronize): see exec_hash. An epoch per slot instead of
   clearing the table at every synchronisation. */
#define OCC_SLOTS 4096
static struct occ { u64 key; uint32_t n, epoch; } occ_tab[OCC_SLOTS];
static uint32_t occ_epoch = 1;
static pthread_mutex_t occ_mu = PTHREAD_MUTEX_INITIALIZER;

static void occ_reset(void)
{
    pthread_mutex_lock(&occ_mu);
    occ_epoch++;
    pthread_mutex_unlock(&occ_mu);
}

static uint32_t occ_next(u64 key)
{
    uint32_t n = 0;
    pthread_mutex_lock(&occ_mu);
    for (uint32_t i = 0; i < 64; i++) {   /* linear probing; a full neighbourhood counts as 0 */
        struct occ *o = &occ_tab[(key + i) % OCC_SLOTS];
        if (o->epoch != occ_epoch) {
            o->key = key, o->n = 0, o->epoch = occ_epoch;
        } else if (o->key != key) {
            continue;
        }
        n = o->n++;
        break;
    }
    pthread_mutex_unlock(&occ_mu);
    return n;
}

/* Execution identity (DeepUM §3.1: kernel + arguments): FNV-1a 64 over the kernel name, grid,
   block, dynamic shared memory and each argument's bytes, with sizes from cuFuncGetParamInfo
   (CUDA >= 12.4). Without sizes the argument bytes cannot be read (bytes past an argument are
   not the argument and would make repeated launches differ), and then the identity is the
   kernel and geometry plus which occurrence of them this is since the host last synchronised:
   a training step launches the same GEMM once per layer with different tensors, which the
   arguments would tell apart, and the occurrence index does it the same way every step
   (measured: a PyTorch loop on driver 580 / CUDA 13 gave 14 identities for 60 launches a step
   without it, and DeepUM's tables and chains merged the layers). */
static u64 exec_hash(struct finfo *fi, const void *f, dim3 g, dim3 b, void **args, size_t smem)
{
    u64 h = fi ? fi->name_hash : fnv(FNV0, &f, sizeof f);
    h = fnv(h, &g, sizeof g);
    h = fnv(h, &b, sizeof b);
    h = fnv(h, &smem, sizeof smem);
    if (fi && fi->nparams > 0 && fi->sizes && args) {
        for (int i = 0; i < fi->nparams; i++)
            if (args[i])
                h = fnv(h, args[i], fi->sizes[i]);
    } else {
        uint32_t k = occ_next(h);
        h = fnv(h, &k, sizeof k);
    }
    return h;
}

static _Atomic int64_t launch_seq;

/* ---------------------------------------------------------------- init */

__attribute__((constructor)) static void rt_init(void)
{
    resolve_dlsym();
    long ps = sysconf(_SC_PAGESIZE);
    if (ps > 0)
        page_sz = (size_t)ps;
    my_pid = (int32_t)getpid();
    cfg_hum = env_on("UMCTL_RT_HUM");
    cfg_managed = cfg_hum || env_on("UMCTL_RT_MANAGED");
    cfg_stats = env_on("UMCTL_RT_STATS");
    cfg_track_end = env_on("UMCTL_RT_TRACK_END");
    cfg_hum_min = env_size("UMCTL_RT_HUM_MIN", cfg_hum_min);
    cfg_unprot_step = env_size("UMCTL_RT_HUM_UNPROT_STEP", cfg_unprot_step);
    cfg_protect_group = env_size("UMCTL_RT_HUM_PROTECT_GROUP", cfg_protect_group);
    cfg_cap = env_size("UMCTL_RT_MANAGED_CAP", 0);
    cfg_delay_us = (unsigned)env_size("UMCTL_RT_HUM_DELAY_US", 0);
    cfg_gpus = (int)env_size("UMCTL_RT_GPUS", 0);
    if (getenv("UMCTL_RT_READ_ONLY"))
        cfg_ro = env_on("UMCTL_RT_READ_ONLY");
    cfg_socket = getenv("UMCTL_RT_SOCKET");
    if (cfg_socket && *cfg_socket && strlen(cfg_socket) < sizeof sock_addr.sun_path) {
        memset(&sock_addr, 0, sizeof sock_addr);
        sock_addr.sun_family = AF_UNIX;
        strcpy(sock_addr.sun_path, cfg_socket);
        sock_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(cfg_socket) + 1);
        sock_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        cfg_control = env_on("UMCTL_RT_CONTROL");
        if (cfg_control && sock_fd >= 0) {
            /* autobind an abstract address: umctl learns it from our reports and sends its
               requests (UMRT_DISCARD) back to it */
            struct sockaddr_un me = {.sun_family = AF_UNIX};
            if (bind(sock_fd, (struct sockaddr *)&me, sizeof(sa_family_t)) != 0)
                cfg_control = 0;
        }
    }
}

__attribute__((destructor)) static void rt_fini(void)
{
    flush_all();
    if (cfg_stats)
        fprintf(stderr,
                "umctl_rt: pid=%d hum_copies=%llu fallbacks=%llu barrier_waits=%llu segv_waits=%llu launches=%llu driver_launches=%llu "
                "managed_allocs=%llu driver_wrapped=%llu chunks=%llu pinned_chunks=%llu stage_ms=%.1f dma_wait_ms=%.1f populated=%llu "
                "dma_chunks=%llu prefetches=%llu drops=%llu,%llu,%llu partitioned=%llu part_fallbacks=%llu "
                "read_mostly=%llu,%llu discards=%llu,%llu,%llu discard_lock_ms=%.1f,%.2f call_ms=%.1f protect_ms=%.1f unprotect_ms=%.1f copy_ms=%.1f copy_max_ms=%.1f\n",
                (int)getpid(), (unsigned long long)st_hum, (unsigned long long)st_fallback,
                (unsigned long long)st_waits, (unsigned long long)st_segv, (unsigned long long)st_launch,
                (unsigned long long)st_drv_launch,
                (unsigned long long)st_managed, (unsigned long long)st_wrapped, (unsigned long long)st_chunks,
                (unsigned long long)st_pinned, st_stage_ns / 1e6, st_dmawait_ns / 1e6, (unsigned long long)st_populated,
                (unsigned long long)st_dma, (unsigned long long)st_prefetch, (unsigned long long)drops[0], (unsigned long long)drops[1],
                (unsigned long long)drops[2], (unsigned long long)st_part, (unsigned long long)st_part_fallback,
                (unsigned long long)st_ro_set, (unsigned long long)st_ro_unset, (unsigned long long)st_disc_req,
                (unsigned long long)st_disc_bytes, (unsigned long long)st_disc_kept, st_disc_ns / 1e6, st_disc_max_ns / 1e6,
                st_call_ns / 1e6, st_protect_ns / 1e6, st_unprot_ns / 1e6,
                st_copy_ns / 1e6, st_copy_max_ns / 1e6);
}

/* ---------------------------------------------------------------- the runtime API we interpose */

/* HUM only: give a managed allocation that stands in for cudaMalloc its pages on the GPU at
   once, as cudaMalloc would. Otherwise a kernel's first write to an output buffer (never copied
   into) takes a GPU page fault per page: measured on a 20-step stencil, 0.74x of plain CUDA.
   DeepUM-style managed routing keeps lazy placement: there the point is oversubscription. */
static void hum_populate(void *p, size_t n)
{
    pthread_once(&driver_once, load_driver);
    int d = current_device();
    if (!cu_prefetch || d < 0 || d >= MAX_DEV || !get_cudaStreamCreateWithFlags() || !get_cudaStreamSynchronize())
        return;
    tl_internal++;
    if (!prefetch_stream[d])
        real_cudaStreamCreateWithFlags(&prefetch_stream[d], 1 /* non-blocking */);
    if (prefetch_stream[d] && cu_prefetch((u64)(uintptr_t)p, n, d, prefetch_stream[d]) == 0
        && real_cudaStreamSynchronize(prefetch_stream[d]) == 0)
        atomic_fetch_add(&st_populated, 1);
    if (get_cudaGetLastError())
        real_cudaGetLastError();
    tl_internal--;
}

API cudaError_t cudaMalloc(void **p, size_t n)
{
    if (!get_cudaMalloc())
        return 1;   /* cudaErrorInvalidValue: no runtime below us (cannot happen when linked) */
    if (cfg_gpus >= 2 && !tl_internal)
        pthread_once(&part_once, part_setup);
    if (cfg_managed && !tl_internal && p && n && get_cudaMallocManaged() &&
        (!cfg_cap || atomic_load(&managed_bytes) + n <= cfg_cap)) {
        tl_internal++;   /* the driver-API wrapper below must not track it a second time */
        cudaError_t rm = real_cudaMallocManaged(p, n, 1 /* cudaMemAttachGlobal */);
        tl_internal--;
        if (rm == 0) {
            atomic_fetch_add(&st_managed, 1);
            remember_alloc(*p, n, 1);
            if (cfg_hum)
                hum_populate(*p, n);
            return 0;
        }
        if (get_cudaGetLastError())
            real_cudaGetLastError();   /* our attempt must not leave an error behind */
    }
    cudaError_t r = real_cudaMalloc(p, n);
    if (r == 0 && p && *p && !tl_internal && (sock_fd >= 0 || cfg_managed))
        remember_alloc(*p, n, 0);
    return r;
}

API cudaError_t cudaFree(void *p)
{
    if (!get_cudaFree())
        return 1;
    hum_barrier();
    if (p && !tl_internal) {
        forget_alloc(p);
        part_forget(p);
    }
    tl_internal++;
    cudaError_t r = real_cudaFree(p);
    tl_internal--;
    return r;
}

static int copy_kind(int kind, const void *dst, const void *src)
{
    switch (kind) {
    case cudaMemcpyHostToDevice: return 0;
    case cudaMemcpyDeviceToHost: return 1;
    case cudaMemcpyDeviceToDevice: return 2;
    case cudaMemcpyDefault: {
        int d = alloc_lookup(dst, 1, 0) != 0, s = alloc_lookup(src, 1, 0) != 0;
        return d && s ? 2 : s ? 1 : d ? 0 : -1;
    }
    default: return -1;
    }
}

API cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, int kind)
{
    if (!get_cudaMemcpy())
        return 1;
    if (hum_try(dst, src, n, kind, NULL, 0))
        return 0;
    hum_barrier();
    int64_t t0 = sock_fd >= 0 ? now_ns() : 0;
    cudaError_t r = real_cudaMemcpy(dst, src, n, kind);
    if (sock_fd >= 0 && !tl_internal && r == 0) {
        int k = copy_kind(kind, dst, src);
        if (k >= 0)
            report_copy(t0, now_ns(), k, dst, src, n, NULL, 0, current_device());
    }
    return r;
}

API cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, cudaStream_t s)
{
    if (!get_cudaMemcpyAsync())
        return 1;
    if (hum_try(dst, src, n, kind, s, 1))
        return 0;
    hum_barrier();
    int64_t t0 = sock_fd >= 0 ? now_ns() : 0;
    cudaError_t r = real_cudaMemcpyAsync(dst, src, n, kind, s);
    if (sock_fd >= 0 && !tl_internal && r == 0) {
        int k = copy_kind(kind, dst, src);
        if (k >= 0)
            report_copy(t0, 0, k, dst, src, n, s, 1, current_device());
    }
    return r;
}

/* ---------------------------------------------------------------- kernel ends (UMCTL_RT_TRACK_END)

   DeepUM's runtime tells its driver which kernel is *executing* (a stream callback before each
   launch); a host that queues a whole training step ahead makes launch times useless for that.
   A stream callback would stall the stream on the host, so instead an event is recorded after
   each reported launch and a tracker thread polls the pending events (in order, ~50 us apart)
   and reports each kernel's end as a LAUNCH record with t_ns = -1, t_end_ns = when the end was
   seen and the launch's seq. umctl.sources.runtime turns those into start times (a kernel
   starts when the one before it on its stream ended). Costs one cudaEventRecord per launch. */
#define TRK 8192
struct trk { int64_t seq; int dev; cudaEvent_t ev; };
static struct trk trk_q[TRK];
static unsigned trk_head, trk_tail;          /* ring: [head, tail) pending */
static cudaEvent_t trk_pool[TRK];
static int trk_npool;
static pthread_mutex_t trk_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic u64 st_trk_drop;

static void report_end(const struct trk *t)
{
    struct umrt_launch r;
    memset(&r, 0, sizeof r);
    r.t_ns = -1;
    r.t_end_ns = now_ns();
    r.gpu = (int16_t)t->dev;
    r.pid = my_pid;
    r.name_id = -1;
    r.seq = t->seq;
    push(0, &r);
}

static void *trk_worker(void *arg)
{
    (void)arg;
    tl_internal = 1;
    int cur_dev = -1;
    for (;;) {
        pthread_mutex_lock(&trk_mu);
        unsigned n = trk_tail - trk_head;
        /* scan the pending window: kernels on different streams end out of order */
        for (unsigned i = 0; i < n && i < 512; i++) {
            struct trk *t = &trk_q[(trk_head + i) % TRK];
            if (!t->ev)
                continue;
            if (t->dev != cur_dev && real_cudaSetDevice(t->dev) == 0)
                cur_dev = t->dev;
            if (real_cudaEventQuery(t->ev) == 0) {
                report_end(t);
                trk_pool[trk_npool++] = t->ev;
                t->ev = NULL;
            }
        }
        while (trk_head != trk_tail && !trk_q[trk_head % TRK].ev)
            trk_head++;
        pthread_mutex_unlock(&trk_mu);
        usleep(50);
    }
    return NULL;
}

static pthread_once_t trk_once = PTHREAD_ONCE_INIT;
static int trk_ok;
static void trk_start(void)
{
    if (!get_cudaEventCreateWithFlags() || !get_cudaEventRecord() || !get_cudaEventQuery() || !get_cudaSetDevice())
        return;
    trk_ok = spawn_detached(trk_worker);
}

static void track_end(int64_t seq, cudaStream_t s)
{
    if (seq < 0 || !cfg_track_end)
        return;
    pthread_once(&trk_once, trk_start);
    if (!trk_ok)
        return;
    tl_internal++;
    pthread_mutex_lock(&trk_mu);
    if (trk_tail - trk_head >= TRK) {
        atomic_fetch_add(&st_trk_drop, 1);   /* the kernel's end is not reported: never block */
    } else {
        cudaEvent_t ev = trk_npool ? trk_pool[--trk_npool] : NULL;
        if (!ev && real_cudaEventCreateWithFlags(&ev, 2 /* disable timing */) != 0)
            ev = NULL;
        if (ev && real_cudaEventRecord(ev, s) == 0) {
            struct trk *t = &trk_q[trk_tail++ % TRK];
            t->seq = seq, t->dev = current_device(), t->ev = ev;
        } else if (ev) {
            trk_pool[trk_npool++] = ev;
        }
    }
    pthread_mutex_unlock(&trk_mu);
    tl_internal--;
}

static int64_t report_launch_as(const void *f, int drv, dim3 g, dim3 b, void **args, size_t smem, cudaStream_t s)
{
    int64_t seq = -1;
    if (sock_fd >= 0 && !tl_internal && !tl_rt_launch) {
        struct finfo *fi = func_info(f, drv);
        struct umrt_launch r;
        memset(&r, 0, sizeof r);
        r.t_ns = now_ns();
        r.gpu = (int16_t)current_device();
        r.pid = my_pid;
        r.stream = (u64)(uintptr_t)s;
        r.func = (u64)(uintptr_t)f;
        r.grid[0] = g.x, r.grid[1] = g.y, r.grid[2] = g.z;
        r.block[0] = b.x, r.block[1] = b.y, r.block[2] = b.z;
        r.exec_hash = exec_hash(fi, f, g, b, args, smem);
        r.name_id = fi ? fi->name_id : -1;
        r.seq = seq = atomic_fetch_add(&launch_seq, 1);
        push(0, &r);
        atomic_fetch_add(&st_launch, 1);
        if (drv)
            atomic_fetch_add(&st_drv_launch, 1);
    }
    return seq;
}

static int64_t report_launch(const void *f, dim3 g, dim3 b, void **args, size_t smem, cudaStream_t s)
{
    return report_launch_as(f, 0, g, b, args, smem, s);
}

/* ---------------------------------------------------------------- driver-level launches

   cuBLAS and cuBLASLt carry a private static cudart that reaches cuLaunchKernel(Ex) through
   cuGetProcAddress, so none of their launches pass the runtime entry points above. Measured on
   the H100 (torch 2.11, CUDA 13, 8 Linear layers): 61 launches reported a training step and not
   one GEMM, so DeepUM's execution IDs lumped each GEMM's faults into the elementwise kernel
   before it, and the kernel-start tracking took that kernel to be running through the GEMM.
   While launches are reported, the driver's launch entry points handed out by dlsym and
   cuGetProcAddress are wrapped: a launch that did not come through a reported runtime launch
   (tl_rt_launch; torch's own cudart also ends in the driver's entry point) is reported with the
   name from cuFuncGetName / cuKernelGetName and argument sizes from cuFuncGetParamInfo, and
   its end is tracked like any other. LSLOTS distinct real entry points per form are wrapped
   (legacy and per-thread stream, a few libraries' tables); beyond that launches pass
   unreported. */
typedef int (*cu_launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                           void **, void **);
typedef struct {   /* CUlaunchConfig */
    unsigned gx, gy, gz, bx, by, bz, smem;
    void *stream;
    void *attrs;
    unsigned nattrs;
} cu_launch_cfg;
typedef int (*cu_launch_ex_t)(const cu_launch_cfg *, void *, void **, void **);
#define LSLOTS 4
static void *lslot_real[2][LSLOTS];   /* [0] cuLaunchKernel, [1] cuLaunchKernelEx */
static int lslot_ptsz[2][LSLOTS];
static pthread_mutex_t lslot_mu = PTHREAD_MUTEX_INITIALIZER;

static int drv_launch(int k, void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                      unsigned smem, void *s, void **args, void **extra)
{
    cu_launch_t real = (cu_launch_t)lslot_real[0][k];
    hum_barrier();
    cudaStream_t rs = !s && lslot_ptsz[0][k] ? STREAM_PER_THREAD : (cudaStream_t)s;
    dim3 g = {gx, gy, gz}, b = {bx, by, bz};
    int64_t q = report_launch_as(f, 1, g, b, args, smem, rs);   /* -1 inside a reported launch: no end tracked */
    int r = real(f, gx, gy, gz, bx, by, bz, smem, s, args, extra);
    if (r == 0)
        track_end(q, rs);
    return r;
}

static int drv_launch_ex(int k, const cu_launch_cfg *c, void *f, void **args, void **extra)
{
    cu_launch_ex_t real = (cu_launch_ex_t)lslot_real[1][k];
    hum_barrier();
    if (!c)
        return real(c, f, args, extra);
    cudaStream_t rs = !c->stream && lslot_ptsz[1][k] ? STREAM_PER_THREAD : (cudaStream_t)c->stream;
    dim3 g = {c->gx, c->gy, c->gz}, b = {c->bx, c->by, c->bz};
    int64_t q = report_launch_as(f, 1, g, b, args, c->smem, rs);
    int r = real(c, f, args, extra);
    if (r == 0)
        track_end(q, rs);
    return r;
}

#define DRV_LAUNCH(k)                                                                                       \
    static int drv_launch_##k(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,     \
                              unsigned bz, unsigned smem, void *s, void **args, void **extra)               \
    {                                                                                                       \
        return drv_launch(k, f, gx, gy, gz, bx, by, bz, smem, s, args, extra);                              \
    }                                                                                                       \
    static int drv_launch_ex_##k(const cu_launch_cfg *c, void *f, void **args, void **extra)                \
    {                                                                                                       \
        return drv_launch_ex(k, c, f, args, extra);                                                         \
    }
DRV_LAUNCH(0)
DRV_LAUNCH(1)
DRV_LAUNCH(2)
DRV_LAUNCH(3)
static void *const lslot_wrappers[2][LSLOTS] = {
    {(void *)drv_launch_0, (void *)drv_launch_1, (void *)drv_launch_2, (void *)drv_launch_3},
    {(void *)drv_launch_ex_0, (void *)drv_launch_ex_1, (void *)drv_launch_ex_2, (void *)drv_launch_ex_3},
};

/* The reporting wrapper for a driver launch entry point (`sym` without its _ptsz suffix), or
   NULL when `sym` is none, launches are not reported, or the slots are taken. */
static void *wrap_launch_entry(const char *sym, void *real, int ptsz)
{
    if (!real || !sym || sock_fd < 0)
        return NULL;
    int ex = strcmp(sym, "cuLaunchKernelEx") == 0;
    if (!ex && strcmp(sym, "cuLaunchKernel") != 0)
        return NULL;
    void *out = NULL;
    pthread_mutex_lock(&lslot_mu);
    for (int k = 0; k < LSLOTS && !out; k++) {
        if (lslot_real[ex][k] == real && lslot_ptsz[ex][k] == ptsz) {
            out = lslot_wrappers[ex][k];
        } else if (!lslot_real[ex][k]) {
            lslot_real[ex][k] = real;
            lslot_ptsz[ex][k] = ptsz;
            out = lslot_wrappers[ex][k];
        }
    }
    pthread_mutex_unlock(&lslot_mu);
    return out;
}


/* ---------------------------------------------------------------- SnuRHAC: grid partitioning

   UMCTL_RT_GPUS=N (N >= 2; `umctl run --mode snurhac --gpus N`): each launch of a kernel that
   follows the umctl_snurhac.h convention is cut into N contiguous slabs of thread blocks along
   one dimension, by the rule of umctl.controller.snurhac.partition (thesis §6.2): z if the grid
   has at least N blocks there, else y, else x; slab g is [dim*g/N, dim*(g+1)/N). Slab g runs on
   GPU g, on a non-blocking stream of ours, with the kernel's umctl_part_t offset set to the
   slab's first block. Stream order is kept without host syncs: the slab streams wait on an
   event recorded on the caller's stream, and the caller's stream waits on an event recorded
   after each slab, so whatever the program issues next on its stream follows all slabs (which
   is SnuRHAC's "all GPUs finish a kernel before the next starts"). The caller's current device
   is restored. Anything not set up (fewer GPUs than N, a stream being captured, a setup call
   failing, a launch on a device >= N) takes the original single launch. With
   UMCTL_RT_READ_ONLY (default on), the buffers the convention marks read-only are advised
   READ_MOSTLY for the kernel (duplicated on every GPU that reads them, §6.4) and the advice is
   taken back when a later partitioned kernel passes them without the mark. */
struct umctl_part { unsigned off[3], grid[3], ro_mask, magic; };
#define UMCTL_PART_MAGIC 0x54504d55u
static int part_ok;
static cudaStream_t part_stream[MAX_DEV];
static cudaEvent_t part_done[MAX_DEV], part_start[MAX_DEV];
#define MAX_RO 256
static uintptr_t ro_flagged[MAX_RO];
static int n_ro;

/* Streams, events and peer access on every GPU, once (the program's first cudaMalloc calls
   this, so context creation on the other GPUs happens outside its timed region). */
static void part_setup(void)
{
    if (cfg_gpus < 2 || cfg_gpus > MAX_DEV || !get_cudaGetDeviceCount() || !get_cudaSetDevice() ||
        !get_cudaGetDevice() || !get_cudaStreamCreateWithFlags() || !get_cudaEventCreateWithFlags() ||
        !get_cudaEventRecord() || !get_cudaStreamWaitEvent() || !get_cudaLaunchKernel())
        return;
    tl_internal++;
    int n = 0, cur = current_device(), ok = 1;
    if (real_cudaGetDeviceCount(&n) != 0 || n < cfg_gpus) {
        fprintf(stderr, "umctl runtime: UMCTL_RT_GPUS=%d but %d GPUs visible: kernels are not partitioned\n", cfg_gpus, n);
        ok = 0;
    }
    for (int g = 0; ok && g < cfg_gpus; g++) {
        ok = real_cudaSetDevice(g) == 0 && real_cudaStreamCreateWithFlags(&part_stream[g], 1 /* non-blocking */) == 0 &&
             real_cudaEventCreateWithFlags(&part_done[g], 2 /* disable timing */) == 0 &&
             real_cudaEventCreateWithFlags(&part_start[g], 2) == 0;
        /* managed memory needs no peer mappings; a device buffer of GPU h (cudaMalloc beyond the
           managed cap) does, so map every pair that can be mapped */
        for (int h = 0; ok && h < cfg_gpus; h++) {
            int can = 0;
            if (h != g && get_cudaDeviceCanAccessPeer() && get_cudaDeviceEnablePeerAccess() &&
                real_cudaDeviceCanAccessPeer(&can, g, h) == 0 && can)
                real_cudaDeviceEnablePeerAccess(h, 0);   /* "already enabled" is fine */
        }
    }
    real_cudaSetDevice(cur);
    if (get_cudaGetLastError())
        real_cudaGetLastError();
    part_ok = ok;
    tl_internal--;
}

/* The allocation of ours holding p: its start and size (0 if none). */
static uintptr_t alloc_base(const void *p, size_t *n)
{
    uintptr_t a = (uintptr_t)p, base = 0;
    pthread_mutex_lock(&allocs_mu);
    size_t i = alloc_pos(a + 1);
    if (i > 0 && a < allocs[i - 1].addr + allocs[i - 1].n && allocs[i - 1].managed)
        base = allocs[i - 1].addr, *n = allocs[i - 1].n;
    pthread_mutex_unlock(&allocs_mu);
    return base;
}

static int mem_advise(uintptr_t p, size_t n, int advice, int dev)
{
    pthread_once(&driver_once, load_driver);
    if (cu_advise_v2) {
        cu_mem_location_t loc = {1 /* device */, dev};
        return cu_advise_v2((u64)p, n, advice, loc);
    }
    return cu_advise ? cu_advise((u64)p, n, advice, dev) : -1;
}

/* Index of a READ_MOSTLY-flagged allocation in ro_flagged, or n_ro when it is not flagged. */
static int ro_find(uintptr_t base)
{
    int k = 0;
    while (k < n_ro && ro_flagged[k] != base)
        k++;
    return k;
}

static void ro_set(uintptr_t base, size_t n, int dev)
{
    int rc = mem_advise(base, n, 1 /* SET_READ_MOSTLY */, dev);
    if (rc == 0) {
        ro_flagged[n_ro++] = base;
        atomic_fetch_add(&st_ro_set, 1);
    } else if (getenv("UMCTL_RT_DEBUG")) {
        static int told;
        if (!told++)
            fprintf(stderr, "umctl_rt: READ_MOSTLY advice failed (CUresult %d)\n", rc);
    }
}

static void ro_unset(int k, int dev)
{
    size_t n = 0;
    uintptr_t base = ro_flagged[k];
    if (alloc_base((void *)base, &n) == base)
        mem_advise(base, n, 2 /* UNSET_READ_MOSTLY */, dev);
    ro_flagged[k] = ro_flagged[--n_ro];
    atomic_fetch_add(&st_ro_unset, 1);
}

/* §6.4: flag the buffers the kernel only reads, unflag the flagged ones it may write (a pointer
   argument into one of our managed allocations without its ro bit). Which arguments are
   pointers comes from the parameter sizes (cuFuncGetParamInfo), else from the ro_mask alone.
   Called under part_mu. */
static void part_read_only(struct finfo *fi, void **args, unsigned mask, int dev)
{
    if (!cfg_ro || !fi)
        return;
    int known = fi->nparams > 1 && fi->sizes;
    static int said;
    if (getenv("UMCTL_RT_DEBUG") && !said) {
        said = 1;
        fprintf(stderr, "umctl_rt: read-only advice: %s\n", known ? "parameter sizes known" : "from ro_mask only");
    }
    if (!known) {
        /* Without parameter sizes (no cuFuncGetParamInfo for this function) only the arguments
           the program marked read-only are known to be pointers (the convention); any other
           argument might be a pointer the kernel writes through, so every flagged buffer this
           launch does not mark read-only loses its flag (a written READ_MOSTLY buffer makes
           every GPU's copy bounce: 100x slower on the stencil over 2 H200s). */
        uintptr_t keep[32];
        int nk = 0;
        for (int i = 1; i < 32; i++) {
            if (!((mask >> i) & 1) || !args[i])
                continue;
            size_t n = 0;
            uintptr_t base = alloc_base(*(void **)args[i], &n);
            if (!base)
                continue;
            keep[nk++] = base;
            if (ro_find(base) == n_ro && n_ro < MAX_RO)
                ro_set(base, n, dev);
        }
        for (int k = n_ro - 1; k >= 0; k--) {
            int kept = 0;
            for (int j = 0; j < nk; j++)
                kept |= keep[j] == ro_flagged[k];
            if (!kept)
                ro_unset(k, dev);
        }
        return;
    }
    for (int i = 1; i < fi->nparams && i < 32; i++) {
        if (fi->sizes[i] != sizeof(void *) || !args[i])
            continue;
        size_t n = 0;
        uintptr_t base = alloc_base(*(void **)args[i], &n);
        if (!base)
            continue;
        int k = ro_find(base);
        int flagged = k < n_ro, ro = (mask >> i) & 1;
        if (ro && !flagged && n_ro < MAX_RO)
            ro_set(base, n, dev);
        else if (!ro && flagged)
            ro_unset(k, dev);
    }
}

/* A freed allocation loses its flag (its address may come back as another buffer). */
static void part_forget(const void *p)
{
    if (cfg_gpus < 2)
        return;
    pthread_mutex_lock(&part_mu);
    int k = ro_find((uintptr_t)p);
    if (k < n_ro)
        ro_flagged[k] = ro_flagged[--n_ro];
    pthread_mutex_unlock(&part_mu);
}

/* First block of slab k of G along a dimension of n blocks (partition()'s edges g*n//G). */
static unsigned slab_edge(unsigned n, int k, int G)
{
    return (unsigned)((u64)n * k / G);
}

/* 1: the launch was taken (partitioned; *res its result); 0: launch it as it is. `ptsz`: a
   per-thread-default-stream entry point (stream 0 means cudaStreamPerThread there). */
static int part_launch(const void *f, dim3 g, dim3 b, void **args, size_t smem, cudaStream_t s, int ptsz,
                       cudaError_t *res)
{
    if (cfg_gpus < 2 || tl_internal || !args || !args[0])
        return 0;
    struct finfo *fi = func_info(f, 0);
    if (!fi || fi->part != 1)
        return 0;
    struct umctl_part *p = args[0];
    if (p->magic != UMCTL_PART_MAGIC || p->off[0] || p->off[1] || p->off[2] || p->grid[0] != g.x ||
        p->grid[1] != g.y || p->grid[2] != g.z) {
        atomic_fetch_add(&st_part_fallback, 1);
        return 0;
    }
    pthread_once(&part_once, part_setup);
    int d = current_device(), capturing = 0;
    if (!s && ptsz)
        s = STREAM_PER_THREAD;
    if (!part_ok || d < 0 || d >= cfg_gpus ||
        (get_cudaStreamIsCapturing() && (real_cudaStreamIsCapturing(s, &capturing) != 0 || capturing))) {
        if (get_cudaGetLastError())
            real_cudaGetLastError();
        atomic_fetch_add(&st_part_fallback, 1);
        return 0;
    }
    const int G = cfg_gpus;
    unsigned dims[3] = {g.x, g.y, g.z};
    int dim = g.z >= (unsigned)G ? 2 : g.y >= (unsigned)G ? 1 : 0;
    pthread_mutex_lock(&part_mu);
    tl_internal++;
    part_read_only(fi, args, p->ro_mask, d);
    int ok = real_cudaEventRecord(part_start[d], s) == 0;
    for (int k = 0; ok && k < G; k++) {
        unsigned lo = slab_edge(dims[dim], k, G), hi = slab_edge(dims[dim], k + 1, G);
        if (hi > lo)
            ok = real_cudaSetDevice(k) == 0 && real_cudaStreamWaitEvent(part_stream[k], part_start[d], 0) == 0;
    }
    cudaError_t r = 0;
    int launched = 0, done[MAX_DEV] = {0};
    struct umctl_part save = *p;
    for (int k = 0; ok && k < G; k++) {
        unsigned lo = slab_edge(dims[dim], k, G), hi = slab_edge(dims[dim], k + 1, G);
        if (hi <= lo)
            continue;
        unsigned sd[3] = {g.x, g.y, g.z};
        sd[dim] = hi - lo;
        dim3 sg = {sd[0], sd[1], sd[2]};
        p->off[dim] = lo;   /* the runtime copies argument values at the launch call */
        if (real_cudaSetDevice(k) != 0) {
            ok = launched > 0;
            r = 1;
            break;
        }
        tl_internal--;
        int64_t q = report_launch(f, sg, b, args, smem, part_stream[k]);
        tl_internal++;
        cudaError_t e = real_cudaLaunchKernel(f, sg, b, args, smem, part_stream[k]);
        if (e != 0) {
            /* nothing launched yet: the original launch instead; else the error is the launch's */
            ok = launched > 0;
            r = e;
            break;
        }
        launched++;
        tl_internal--;
        track_end(q, part_stream[k]);
        tl_internal++;
        done[k] = real_cudaEventRecord(part_done[k], part_stream[k]) == 0;
        if (!done[k])
            r = 1;
    }
    *p = save;
    real_cudaSetDevice(d);
    for (int k = 0; k < G; k++)
        if (done[k] && real_cudaStreamWaitEvent(s, part_done[k], 0) != 0)
            r = r ? r : 1;
    if (!ok && get_cudaGetLastError())
        real_cudaGetLastError();
    tl_internal--;
    pthread_mutex_unlock(&part_mu);
    if (!ok) {
        atomic_fetch_add(&st_part_fallback, 1);
        return 0;
    }
    atomic_fetch_add(&st_part, 1);
    *res = r;
    return 1;
}

typedef cudaError_t (*launch_plain_t)(const void *, dim3, dim3, void **, size_t, cudaStream_t);

/* A launch through an entry point with cudaLaunchKernel's signature: wait for pending HUM
   copies, report it, launch, and track its end. */
static cudaError_t launch_plain(launch_plain_t real, const void *f, dim3 g, dim3 b, void **args, size_t smem,
                                cudaStream_t s, int ptsz)
{
    hum_barrier();
    cudaError_t pr;
    if (part_launch(f, g, b, args, smem, s, ptsz, &pr))
        return pr;
    int64_t q = report_launch(f, g, b, args, smem, s);
    tl_rt_launch++;   /* its driver launch is this one */
    cudaError_t r = real(f, g, b, args, smem, s);
    tl_rt_launch--;
    if (r == 0)
        track_end(q, s);
    return r;
}

API cudaError_t cudaLaunchKernel(const void *f, dim3 g, dim3 b, void **args, size_t smem, cudaStream_t s)
{
    if (!get_cudaLaunchKernel())
        return 1;
    return launch_plain(real_cudaLaunchKernel, f, g, b, args, smem, s, 0);
}

/* cudaLaunchConfig_t of cuda_runtime_api.h (CUDA >= 11.8): the layout the ExC entry points
   take. PyTorch 2.11 on CUDA 13 launches every kernel through cudaLaunchKernelExC (measured on
   the H100: libtorch_cuda imports it and not cudaLaunchKernel), so it must be reported too. */
typedef struct {
    dim3 gridDim;
    dim3 blockDim;
    size_t dynamicSmemBytes;
    cudaStream_t stream;
    void *attrs;
    unsigned int numAttrs;
} umrt_launch_config;

typedef cudaError_t (*launch_exc_t)(const umrt_launch_config *, const void *, void **);

static cudaError_t launch_exc(const char *name, launch_exc_t *real, const umrt_launch_config *c, const void *f,
                              void **args, int ptsz)
{
    if (!*real)
        *real = (launch_exc_t)next_sym(name);
    if (!*real)
        return 1;
    hum_barrier();
    cudaError_t pr;   /* launch attributes (clusters, ...) are not carried over to slabs: never split those */
    if (c && !c->numAttrs && part_launch(f, c->gridDim, c->blockDim, args, c->dynamicSmemBytes, c->stream, ptsz, &pr))
        return pr;
    int64_t q = c ? report_launch(f, c->gridDim, c->blockDim, args, c->dynamicSmemBytes, c->stream) : -1;
    tl_rt_launch++;
    cudaError_t r = (*real)(c, f, args);
    tl_rt_launch--;
    if (r == 0 && c)
        track_end(q, c->stream);
    return r;
}

API cudaError_t cudaLaunchKernelExC(const umrt_launch_config *c, const void *f, void **args)
{
    static launch_exc_t real;
    return launch_exc("cudaLaunchKernelExC", &real, c, f, args, 0);
}

API cudaError_t cudaLaunchKernelExC_ptsz(const umrt_launch_config *c, const void *f, void **args)
{
    static launch_exc_t real;
    return launch_exc("cudaLaunchKernelExC_ptsz", &real, c, f, args, 1);
}

/* The <<<>>> stub of CUDA >= 12.8 calls __cudaLaunchKernel(func, grid, block, args, smem, stream)
   (PyTorch 2.11 on CUDA 13 launches its kernels this way: on the H100 the runtime saw 0 launches
   through the public entry points). It is forwarded with the generic trampoline, so the call
   is exact whatever the signature; the report decodes the registers as the header declares
   them: rdi func, rsi grid.x|grid.y<<32, rdx grid.z, rcx block.x|block.y<<32, r8 block.z,
   r9 args, then smem and stream on the stack. */
static u64 stub_launch(const char *name, fn12 *real, u64 a, u64 b, u64 c, u64 d, u64 e, u64 f, u64 g, u64 h,
                       u64 i, u64 j, u64 k, u64 l, int ptsz)
{
    if (!*real)
        *real = (fn12)next_sym(name);
    if (!*real)
        return 1;
    hum_barrier();
    dim3 gd = {(unsigned)b, (unsigned)(b >> 32), (unsigned)c};
    dim3 bd = {(unsigned)d, (unsigned)(d >> 32), (unsigned)e};
    cudaError_t pr;
    if (part_launch((const void *)(uintptr_t)a, gd, bd, (void **)(uintptr_t)f, (size_t)g, (cudaStream_t)(uintptr_t)h,
                    ptsz, &pr))
        return (u64)(unsigned)pr;
    int64_t q = report_launch((const void *)(uintptr_t)a, gd, bd, (void **)(uintptr_t)f, (size_t)g,
                              (cudaStream_t)(uintptr_t)h);
    tl_rt_launch++;
    u64 r = (*real)(a, b, c, d, e, f, g, h, i, j, k, l);
    tl_rt_launch--;
    if ((cudaError_t)r == 0)
        track_end(q, (cudaStream_t)(uintptr_t)h);
    return r;
}

API u64 __cudaLaunchKernel(u64 a, u64 b, u64 c, u64 d, u64 e, u64 f, u64 g, u64 h, u64 i, u64 j, u64 k, u64 l)
{
    static fn12 real;
    return stub_launch("__cudaLaunchKernel", &real, a, b, c, d, e, f, g, h, i, j, k, l, 0);
}

API u64 __cudaLaunchKernel_ptsz(u64 a, u64 b, u64 c, u64 d, u64 e, u64 f, u64 g, u64 h, u64 i, u64 j, u64 k, u64 l)
{
    static fn12 real;
    return stub_launch("__cudaLaunchKernel_ptsz", &real, a, b, c, d, e, f, g, h, i, j, k, l, 1);
}

API cudaError_t cudaLaunchKernel_ptsz(const void *f, dim3 g, dim3 b, void **args, size_t smem, cudaStream_t s)
{
    static launch_plain_t real;
    if (!real)
        real = (launch_plain_t)next_sym("cudaLaunchKernel_ptsz");
    if (!real)
        return 1;
    return launch_plain(real, f, g, b, args, smem, s, 1);
}

/* Everything else that enqueues work, synchronises or touches memory: barrier, then the real
   call, arguments passed through unchanged (see the trampolines above for why this is exact). */
#define PASS_THEN(name, after)                                                                         \
    API u64 name(u64 a, u64 b, u64 c, u64 d, u64 e, u64 f, u64 g, u64 h, u64 i, u64 j, u64 k, u64 l)   \
    {                                                                                                  \
        static fn12 real;                                                                              \
        if (!real)                                                                                     \
            real = (fn12)next_sym(#name);                                                              \
        if (!real)                                                                                     \
            return 1;                                                                                  \
        hum_barrier();                                                                                 \
        u64 r = real(a, b, c, d, e, f, g, h, i, j, k, l);                                              \
        after;                                                                                         \
        return r;                                                                                      \
    }
#define PASS(name) PASS_THEN(name, (void)0)
/* the host waited for the GPU to drain: an iteration boundary for exec_hash's occurrence counts */
#define PASS_SYNC(name) PASS_THEN(name, if (!tl_internal) occ_reset())
PASS_SYNC(cudaDeviceSynchronize)
PASS_SYNC(cudaStreamSynchronize)
PASS(cudaStreamQuery)
PASS(cudaStreamWaitEvent)
PASS(cudaStreamAddCallback)
PASS(cudaStreamDestroy)
PASS(cudaStreamBeginCapture)
PASS(cudaEventRecord)
PASS(cudaEventRecordWithFlags)
PASS(cudaEventSynchronize)
PASS(cudaEventQuery)
PASS(cudaLaunchHostFunc)
PASS(cudaLaunchCooperativeKernel)
PASS(cudaGraphLaunch)
PASS(cudaMemset)
PASS(cudaMemsetAsync)
PASS(cudaMemset2D)
PASS(cudaMemset2DAsync)
PASS(cudaMemcpy2D)
PASS(cudaMemcpy2DAsync)
PASS(cudaMemcpy3D)
PASS(cudaMemcpy3DAsync)
PASS(cudaMemcpyPeer)
PASS(cudaMemcpyPeerAsync)
PASS(cudaMemcpyToSymbol)
PASS(cudaMemcpyFromSymbol)
PASS(cudaMemcpyToSymbolAsync)
PASS(cudaMemcpyFromSymbolAsync)
PASS(cudaMemPrefetchAsync)
PASS(cudaMemAdvise)
PASS(cudaFreeAsync)
PASS(cudaDeviceReset)
PASS(cudaHostUnregister)
PASS(cudaIpcGetMemHandle)
PASS(cudaMemcpy_ptds)
PASS(cudaMemcpyAsync_ptsz)
PASS(cudaMemset_ptds)
PASS(cudaMemsetAsync_ptsz)
PASS_SYNC(cudaStreamSynchronize_ptsz)
PASS(cudaStreamQuery_ptsz)
PASS(cudaStreamWaitEvent_ptsz)
PASS(cudaEventRecord_ptsz)
PASS(cudaGraphLaunch_ptsz)
PASS(cudaMemcpy2D_ptds)
PASS(cudaMemcpy2DAsync_ptsz)
PASS(cudaMemPrefetchAsync_ptsz)

/* ---------------------------------------------------------------- libc: the sources' guards */

/* Freeing, unmapping, reprotecting or reading into (through the kernel, where a write to a
   protected page would be EFAULT rather than a signal) a pending copy's source first waits. */
#define LIBC(ret, name, ...)                                                          \
    typedef ret (*name##_lt)(__VA_ARGS__);                                            \
    static name##_lt libc_##name;                                                     \
    static inline name##_lt get_libc_##name(void)                                     \
    {                                                                                 \
        if (!libc_##name)                                                             \
            libc_##name = (name##_lt)rdlsym(RTLD_NEXT, #name);                        \
        return libc_##name;                                                           \
    }
LIBC(void, free, void *)
LIBC(void *, realloc, void *, size_t)
LIBC(int, munmap, void *, size_t)
LIBC(int, mprotect, void *, size_t, int)
LIBC(void *, mremap, void *, size_t, size_t, int, ...)
LIBC(int, madvise, void *, size_t, int)
LIBC(ssize_t, read, int, void *, size_t)
LIBC(ssize_t, pread, int, void *, size_t, off_t)
LIBC(ssize_t, pread64, int, void *, size_t, off_t)
LIBC(ssize_t, readv, int, const struct iovec *, int)
LIBC(ssize_t, recv, int, void *, size_t, int)
LIBC(ssize_t, recvfrom, int, void *, size_t, int, struct sockaddr *, socklen_t *)
LIBC(size_t, fread, void *, size_t, size_t, FILE *)
LIBC(pid_t, fork, void)
LIBC(int, sigaction, int, const struct sigaction *, struct sigaction *)

extern void __libc_free(void *);
static __thread int tl_resolving;

static inline int pending(void) { return atomic_load_explicit(&hum_pending, memory_order_acquire) != 0; }

API void free(void *p)
{
    if (!libc_free) {
        if (tl_resolving) {
            __libc_free(p);
            return;
        }
        tl_resolving = 1;
        get_libc_free();
        tl_resolving = 0;
        if (!libc_free) {
            __libc_free(p);
            return;
        }
    }
    if (p && pending())
        hum_wait_range(p, malloc_usable_size(p));
    libc_free(p);
}

API void *realloc(void *p, size_t n)
{
    if (p && pending())
        hum_wait_range(p, malloc_usable_size(p));
    return get_libc_realloc()(p, n);
}

API int munmap(void *p, size_t n)
{
    if (pending())
        hum_wait_range(p, n);
    maps_invalidate();
    return get_libc_munmap()(p, n);
}

API int mprotect(void *p, size_t n, int prot)
{
    if (pending() && !tl_internal)
        hum_wait_range(p, n);
    if (!tl_internal)
        maps_invalidate();
    return get_libc_mprotect()(p, n, prot);
}

API void *mremap(void *p, size_t o, size_t n, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    void *na = va_arg(ap, void *);
    va_end(ap);
    if (pending())
        hum_wait_range(p, o);
    maps_invalidate();
    return get_libc_mremap()(p, o, n, flags, na);
}

API int madvise(void *p, size_t n, int adv)
{
    if (pending())
        hum_wait_range(p, n);
    return get_libc_madvise()(p, n, adv);
}

API ssize_t read(int fd, void *b, size_t n)
{
    if (pending())
        hum_wait_range(b, n);
    return get_libc_read()(fd, b, n);
}

API ssize_t pread(int fd, void *b, size_t n, off_t o)
{
    if (pending())
        hum_wait_range(b, n);
    return get_libc_pread()(fd, b, n, o);
}

API ssize_t pread64(int fd, void *b, size_t n, off_t o)
{
    if (pending())
        hum_wait_range(b, n);
    return get_libc_pread64()(fd, b, n, o);
}

API ssize_t readv(int fd, const struct iovec *v, int cnt)
{
    if (pending())
        for (int i = 0; i < cnt; i++)
            hum_wait_range(v[i].iov_base, v[i].iov_len);
    return get_libc_readv()(fd, v, cnt);
}

API ssize_t recv(int fd, void *b, size_t n, int fl)
{
    if (pending())
        hum_wait_range(b, n);
    return get_libc_recv()(fd, b, n, fl);
}

API ssize_t recvfrom(int fd, void *b, size_t n, int fl, struct sockaddr *a, socklen_t *al)
{
    if (pending())
        hum_wait_range(b, n);
    return get_libc_recvfrom()(fd, b, n, fl, a, al);
}

API size_t fread(void *b, size_t sz, size_t n, FILE *f)
{
    if (pending())
        hum_wait_range(b, sz * n);
    return get_libc_fread()(b, sz, n, f);
}

/* A child would inherit protected pages without the worker that unprotects them. */
API pid_t fork(void)
{
    hum_barrier();
    flush_all();
    pid_t r = get_libc_fork()();
    if (r == 0) {   /* no worker and no flusher in the child: HUM off there, flusher restarted */
        my_pid = (int32_t)getpid();
        cfg_hum = 0;
        for (int k = 0; k < 3; k++)
            rb[k].n = 0;
        pthread_once_t fresh = PTHREAD_ONCE_INIT;
        flusher_once = fresh;
    }
    return r;
}

/* A SIGSEGV handler installed after ours becomes the one we chain to; ours stays first. */
API int sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
    if (sig == SIGSEGV && prev_segv_set) {
        if (old)
            *old = prev_segv;
        if (act)
            prev_segv = *act;
        return 0;
    }
    return get_libc_sigaction()(sig, act, old);
}

/* ---------------------------------------------------------------- PyTorch pluggable allocator */

/* torch.cuda.memory.CUDAPluggableAllocator(path, "umctl_rt_malloc", "umctl_rt_free"): managed
   memory for every tensor, with a small exact-size cache so that freed blocks are kept and
   reported BLOCK_INACTIVE (their contents are dead: DeepUM may invalidate them) and BLOCK_ACTIVE
   when handed out again. UMCTL_RT_CACHE bytes (default 1 GiB) bound what the cache holds. */
struct cblock {
    void *p;
    size_t n;
    int dev;
    int64_t id;
    cudaEvent_t ev;   /* recorded on the freeing stream at the free (UMCTL_RT_CONTROL only) */
};
static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static struct cblock *cache;
static size_t n_cache, cap_cache, cache_bytes, cache_cap = (size_t)1 << 30;
static int cache_cfg;

static size_t round_block(size_t n)
{
    size_t q = n >= ((size_t)1 << 20) ? CHUNK : 512;
    return (n + q - 1) / q * q;
}

/* ---- safe invalidation (UMCTL_RT_CONTROL=1; umctl_rt.h: UMRT_DISCARD)
   DeepUM drops the pages of freed allocator blocks instead of writing them back. From umctl's
   side that is unsafe (measured: it changed a torch loop's trained parameters): the host frees a
   tensor right after *launching* the last kernel that reads it, and the cache may hand the block
   out again before a discard lands. So umctl only asks, and the runtime discards under the cache
   lock (reuse takes the same lock), only blocks still cached, and only once an event recorded on
   the freeing stream at the free has completed; a ragged edge is rounded inward to whole pages. */
#define EV_POOL 64
static pthread_mutex_t evpool_mu = PTHREAD_MUTEX_INITIALIZER;
static cudaEvent_t ev_pool[MAX_DEV][EV_POOL];
static int n_ev_pool[MAX_DEV];

static void event_put(int dev, cudaEvent_t ev)
{
    if (!ev)
        return;
    pthread_mutex_lock(&evpool_mu);
    if (dev >= 0 && dev < MAX_DEV && n_ev_pool[dev] < EV_POOL) {
        ev_pool[dev][n_ev_pool[dev]++] = ev;
        ev = NULL;
    }
    pthread_mutex_unlock(&evpool_mu);
    if (ev && get_cudaEventDestroy())
        real_cudaEventDestroy(ev);
}

/* An event after everything queued on @stream so far, or NULL (no control channel, a stream
   being captured, any CUDA error): a block without one is never discarded. */
static cudaEvent_t free_event(int dev, void *stream)
{
    if (!cfg_control || dev < 0 || dev >= MAX_DEV || !get_cudaEventCreateWithFlags() || !get_cudaEventRecord() ||
        !get_cudaEventQuery() || !get_cudaGetDevice() || !get_cudaSetDevice())
        return NULL;
    int capturing = 0;
    if (get_cudaStreamIsCapturing() && (real_cudaStreamIsCapturing(stream, &capturing) != 0 || capturing)) {
        if (get_cudaGetLastError())
            real_cudaGetLastError();
        return NULL;
    }
    cudaEvent_t ev = NULL;
    pthread_mutex_lock(&evpool_mu);
    if (n_ev_pool[dev])
        ev = ev_pool[dev][--n_ev_pool[dev]];
    pthread_mutex_unlock(&evpool_mu);
    int prev = -1;
    tl_internal++;
    real_cudaGetDevice(&prev);
    if (prev != dev)
        real_cudaSetDevice(dev);
    int ok = (ev || real_cudaEventCreateWithFlags(&ev, 2 /* disable timing */) == 0) &&
             real_cudaEventRecord(ev, stream) == 0;
    if (prev != dev && prev >= 0)
        real_cudaSetDevice(prev);
    tl_internal--;
    if (!ok) {
        if (get_cudaGetLastError())
            real_cudaGetLastError();
        event_put(dev, ev);
        return NULL;
    }
    return ev;
}

static int cmp_cblock(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)((const struct cblock *)a)->p, y = (uintptr_t)((const struct cblock *)b)->p;
    return x < y ? -1 : x > y;
}

#define UVM_DISCARD_IOCTL 80          /* nvidia-uvm 580+, UVM_DISCARD_PARAMS */
#define UVM_DISCARD_FLAGS_UNMAP 1     /* also unmap: the next touch populates afresh, no copy */
struct uvm_discard_params { uint64_t base, length, flags; uint32_t rm_status; uint32_t pad; };

static int uvm_discard(int fd, uintptr_t a, size_t n)
{
    struct uvm_discard_params prm = {a, n, UVM_DISCARD_FLAGS_UNMAP, 0, 0};
    return ioctl(fd, UVM_DISCARD_IOCTL, &prm) == 0 && prm.rm_status == 0;
}

#define DONE_MAX 256
struct done_list { struct umrt_discard_done r[DONE_MAX]; uint32_t n; u64 kept[UMRT_KEPT_FAILED + 1]; };

/* One request, under the cache lock: discard the safe pages of the cached blocks in the range,
   one ioctl per contiguous run of them; account the rest by why it was kept. */
static void discard_range(const struct umrt_discard *q, struct done_list *d)
{
    uintptr_t lo = q->addr, hi = q->addr + q->bytes;
    size_t pg = page_sz;
    pthread_mutex_lock(&cache_mu);
    int64_t t0 = now_ns();
    size_t m = 0;
    struct cblock *hit = NULL;
    for (size_t i = 0; i < n_cache; i++) {
        uintptr_t p = (uintptr_t)cache[i].p;
        if (p < hi && p + cache[i].n > lo) {
            struct cblock *nh = realloc(hit, (m + 1) * sizeof *hit);
            if (!nh)
                break;
            hit = nh;
            hit[m++] = cache[i];
        }
    }
    if (m > 1)
        qsort(hit, m, sizeof *hit, cmp_cblock);
    size_t covered = 0;
    uintptr_t run_a = 0, run_b = 0;   /* a contiguous run of safe pages not yet discarded */
    int failed = 0;
    for (size_t i = 0; i <= m; i++) {
        uintptr_t s = 0, e = 0, a = 0, b = 0;
        int st = -1;
        if (i < m) {
            s = (uintptr_t)hit[i].p > lo ? (uintptr_t)hit[i].p : lo;
            e = (uintptr_t)hit[i].p + hit[i].n < hi ? (uintptr_t)hit[i].p + hit[i].n : hi;
            covered += e - s;
            a = (s + pg - 1) / pg * pg, b = e / pg * pg;
            if (!hit[i].ev)
                st = UMRT_KEPT_UNSAFE;
            else {
                int r = real_cudaEventQuery(hit[i].ev);
                st = r == 0 ? (b > a ? UMRT_DISCARDED : UMRT_KEPT_SMALL) : r == 600 /* not ready */ ? UMRT_KEPT_BUSY
                                                                                            : UMRT_KEPT_UNSAFE;
                if (r != 0 && r != 600 && get_cudaGetLastError())
                    real_cudaGetLastError();
            }
            if (st == UMRT_DISCARDED) {
                d->kept[UMRT_KEPT_SMALL] += (a - s) + (e - b);
                if (failed) {
                    d->kept[UMRT_KEPT_FAILED] += b - a;
                    continue;
                }
                if (run_b == a && run_b) {
                    run_b = b;
                    continue;
                }
            } else
                d->kept[st] += e - s;
        }
        if (run_b > run_a && !failed) {   /* the run ends here: drop it */
            if (d->n < DONE_MAX - 6 && uvm_discard(q->uvm_fd, run_a, run_b - run_a))
                d->r[d->n++] = (struct umrt_discard_done){q->id, run_a, run_b - run_a, UMRT_DISCARDED, 0};
            else
                failed = 1, d->kept[UMRT_KEPT_FAILED] += run_b - run_a;
        }
        run_a = run_b = 0;
        if (st == UMRT_DISCARDED && !failed)
            run_a = a, run_b = b;
    }
    u64 held = (u64)(now_ns() - t0);
    pthread_mutex_unlock(&cache_mu);
    atomic_fetch_add(&st_disc_ns, held);
    for (u64 mx = atomic_load(&st_disc_max_ns); held > mx && !atomic_compare_exchange_weak(&st_disc_max_ns, &mx, held);)
        ;
    free(hit);
    d->kept[UMRT_KEPT_IN_USE] += (hi - lo) - covered;
}

static void *control_main(void *arg)
{
    (void)arg;
    static char in[1 << 16];
    static struct done_list d;
    for (;;) {
        struct pollfd pf = {sock_fd, POLLIN, 0};
        if (poll(&pf, 1, -1) < 0) {
            if (errno == EINTR)
                continue;
            return NULL;
        }
        ssize_t len = get_libc_recv()(sock_fd, in, sizeof in, MSG_DONTWAIT);
        if (len < (ssize_t)sizeof(struct umrt_header))
            continue;
        struct umrt_header h;
        memcpy(&h, in, sizeof h);
        if (h.magic != UMRT_MAGIC || h.version != UMRT_VERSION || h.kind != UMRT_DISCARD ||
            (size_t)len != sizeof h + (size_t)h.count * sizeof(struct umrt_discard))
            continue;
        for (uint32_t i = 0; i < h.count; i++) {
            struct umrt_discard q;
            memcpy(&q, in + sizeof h + i * sizeof q, sizeof q);
            memset(&d, 0, sizeof d);
            if (q.bytes && q.addr + q.bytes > q.addr)
                discard_range(&q, &d);
            atomic_fetch_add(&st_disc_req, 1);
            for (uint32_t k = 0; k < d.n; k++)
                atomic_fetch_add(&st_disc_bytes, d.r[k].bytes);
            for (int st = UMRT_KEPT_IN_USE; st <= UMRT_KEPT_FAILED; st++)
                if (d.kept[st] && d.n < DONE_MAX) {
                    d.r[d.n++] = (struct umrt_discard_done){q.id, 0, d.kept[st], st, 0};
                    atomic_fetch_add(&st_disc_kept, d.kept[st]);
                }
            if (!d.n)   /* an empty request still gets its answer */
                d.r[d.n++] = (struct umrt_discard_done){q.id, 0, 0, UMRT_KEPT_IN_USE, 0};
            send_dgram(UMRT_DISCARD_DONE, d.n, d.r, d.n * sizeof *d.r);
        }
    }
}

static pthread_once_t control_once = PTHREAD_ONCE_INIT;
static void start_control(void)
{
    spawn_detached(control_main);
}

API void *umctl_rt_malloc(ssize_t size, int device, void *stream)
{
    (void)stream;
    if (size <= 0)
        return NULL;
    size_t n = round_block((size_t)size);
    pthread_mutex_lock(&cache_mu);
    if (!cache_cfg) {
        cache_cap = env_size("UMCTL_RT_CACHE", cache_cap);
        cache_cfg = 1;
    }
    for (size_t i = n_cache; i-- > 0;)
        if (cache[i].n == n && cache[i].dev == device) {
            struct cblock b = cache[i];
            cache[i] = cache[--n_cache];
            cache_bytes -= n;
            pthread_mutex_unlock(&cache_mu);
            event_put(b.dev, b.ev);
            report_alloc(3, b.p, b.n, b.id, 1);
            return b.p;
        }
    pthread_mutex_unlock(&cache_mu);
    if (!get_cudaMallocManaged() || !get_cudaGetDevice() || !get_cudaSetDevice())
        return NULL;
    if (cfg_cap && atomic_load(&managed_bytes) + n > cfg_cap)
        return NULL;
    int prev = -1;
    real_cudaGetDevice(&prev);
    if (prev != device)
        real_cudaSetDevice(device);
    void *p = NULL;
    tl_internal++;
    cudaError_t r = real_cudaMallocManaged(&p, n, 1);
    tl_internal--;
    if (prev != device && prev >= 0)
        real_cudaSetDevice(prev);
    if (r != 0) {
        if (get_cudaGetLastError())
            real_cudaGetLastError();
        return NULL;
    }
    atomic_fetch_add(&st_managed, 1);
    remember_alloc(p, n, 1);
    return p;
}

API void umctl_rt_free(void *p, ssize_t size, int device, void *stream)
{
    if (!p)
        return;
    size_t n = round_block((size_t)size);
    struct alloc a = {0};
    int known = alloc_lookup(p, 1, 1) == 1;
    pthread_mutex_lock(&allocs_mu);
    size_t i = alloc_pos((uintptr_t)p);
    if (known && i < n_allocs && allocs[i].addr == (uintptr_t)p)
        a = allocs[i];
    pthread_mutex_unlock(&allocs_mu);
    cudaEvent_t ev = free_event(device, stream);
    if (ev && sock_fd >= 0)
        pthread_once(&control_once, start_control);
    pthread_mutex_lock(&cache_mu);
    if (cache_bytes + n <= cache_cap) {
        if (n_cache == cap_cache) {
            size_t nc = cap_cache ? 2 * cap_cache : 256;
            struct cblock *ncb = realloc(cache, nc * sizeof *ncb);
            if (ncb)
                cache = ncb, cap_cache = nc;
        }
        if (n_cache < cap_cache) {
            cache[n_cache++] = (struct cblock){p, n, device, a.id, ev};
            cache_bytes += n;
            pthread_mutex_unlock(&cache_mu);
            report_alloc(2, p, n, a.id, 1);
            return;
        }
    }
    pthread_mutex_unlock(&cache_mu);
    event_put(device, ev);
    forget_alloc(p);
    hum_barrier();
    tl_internal++;
    if (get_cudaFree())
        real_cudaFree(p);
    tl_internal--;
}
