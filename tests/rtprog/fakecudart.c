/* A stand-in for libcudart.so (and, built with -DFAKE_LIBCUDA, for libcuda.so.1) so that the
 * umctl runtime (runtime/umctl_rt.c) is tested without a GPU. "Device" memory is host memory;
 * a "kernel" is a host function void k(void **args) that cudaLaunchKernel calls at once; a copy
 * is a memcpy, done at once, except an asynchronous copy out of pinned memory (cudaHostAlloc /
 * cudaMallocHost), which is a fake copy engine: it happens only when its stream is synchronised
 * (cudaEventSynchronize on a later event, cudaStreamSynchronize, cudaDeviceSynchronize), as a
 * real DMA may read the pinned buffer any time until then, so a caller that reuses the buffer
 * too early copies the wrong bytes. The library records which API allocated each pointer, so a test can see
 * whether cudaMalloc was routed to cudaMallocManaged.
 *
 *   gcc -O1 -shared -fPIC fakecudart.c -o DIR/libcudart.so -ldl
 *   gcc -O1 -shared -fPIC -DFAKE_LIBCUDA fakecudart.c -o DIR/libcuda.so.1
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>

#define API __attribute__((visibility("default")))
typedef void (*kernel_fn)(void **);

/* FAKE_PREFETCH_LOG: one line per prefetch ("prefetch ADDR BYTES DEVICE") and per
   cudaDeviceSynchronize ("sync"), in call order */
static void fake_file_log(const char *fmt, unsigned long long a, unsigned long long b, int c)
{
    const char *path = getenv("FAKE_PREFETCH_LOG");
    FILE *f = path ? fopen(path, "a") : NULL;
    if (f) {
        fprintf(f, fmt, a, b, c);
        fclose(f);
    }
}
#ifdef FAKE_LIBCUDA
/* -- the driver: launches, parameter sizes, prefetch, cuGetProcAddress ------------------------ */
API int fake_prefetches;
static struct { void *f; int n; size_t sizes[16]; } params[64];
static int n_params;

API void fake_set_params(void *f, int n, const size_t *sizes)
{
    params[n_params].f = f;
    params[n_params].n = n;
    memcpy(params[n_params].sizes, sizes, n * sizeof *sizes);
    n_params++;
}

API int cuFuncGetParamInfo(void *f, size_t i, size_t *off, size_t *size)
{
    if (getenv("FAKE_NO_PARAM_INFO"))   /* as driver 580 / CUDA 13 answered for nvcc-built kernels */
        return 1;
    for (int k = 0; k < n_params; k++)
        if (params[k].f == f) {
            if ((int)i >= params[k].n)
                return 1;
            *off = 0;
            for (size_t j = 0; j < i; j++)
                *off += params[k].sizes[j];
            *size = params[k].sizes[i];
            return 0;
        }
    return 1;
}

API int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                       unsigned smem, void *stream, void **args, void **extra)
{
    (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)smem, (void)stream, (void)extra;
    ((kernel_fn)f)(args);
    return 0;
}

/* a CUfunction here is the host function itself: its symbol is its name */
API int cuFuncGetName(const char **name, void *f)
{
    Dl_info di;
    if (getenv("FAKE_NO_FUNC_NAME") || !dladdr(f, &di) || !di.dli_sname)
        return 500;
    *name = di.dli_sname;
    return 0;
}

API int cuMemPrefetchAsync(uint64_t p, size_t n, int dev, void *stream)
{
    (void)stream;
    __sync_fetch_and_add(&fake_prefetches, 1);
    fake_file_log("prefetch %llu %llu %d\n", (unsigned long long)p, (unsigned long long)n, dev);
    return 0;
}

API int cuMemAllocManaged(uint64_t *p, size_t n, unsigned flags)
{
    (void)flags;
    void *q = NULL;
    if (posix_memalign(&q, 4096, n ? n : 1))
        return 2;
    *p = (uint64_t)(uintptr_t)q;
    return 0;
}

/* cuMemAdvise_v2(ptr, n, advice, CUmemLocation {type, id}): counted per advice (1 set / 2 unset
   READ_MOSTLY) */
API int fake_advises[8];
typedef struct { int type, id; } fake_location;
API int cuMemAdvise_v2(uint64_t p, size_t n, int advice, fake_location loc)
{
    if (advice >= 0 && advice < 8)
        __sync_fetch_and_add(&fake_advises[advice], 1);
    const char *path = getenv("FAKE_ADVISE_LOG");   /* one line per advice: what, where, to whom */
    if (path) {
        FILE *f = fopen(path, "a");
        if (f) {
            fprintf(f, "%d %llu %zu %d %d\n", advice, (unsigned long long)p, n, loc.type, loc.id);
            fclose(f);
        }
    }
    return 0;
}

API int cuMemFree_v2(uint64_t p)
{
    free((void *)(uintptr_t)p);
    return 0;
}

API int cuGetProcAddress_v2(const char *sym, void **pfn, int ver, uint64_t flags, void *status)
{
    (void)ver, (void)flags, (void)status;
    if (strcmp(sym, "cuLaunchKernel") == 0) *pfn = (void *)cuLaunchKernel;
    else if (strcmp(sym, "cuMemPrefetchAsync") == 0) *pfn = (void *)cuMemPrefetchAsync;
    else if (strcmp(sym, "cuMemAllocManaged") == 0) *pfn = (void *)cuMemAllocManaged;
    else if (strcmp(sym, "cuMemFree") == 0) *pfn = (void *)cuMemFree_v2;
    else { *pfn = NULL; return 500; }
    return 0;
}

#else
/* -- the runtime ------------------------------------------------------------------------------- */
enum { T_UNREG = 0, T_HOST = 1, T_DEVICE = 2, T_MANAGED = 3 };
static struct { char *p; size_t n; int type; } tab[4096];
static int n_tab, last_error;
API int fake_device_allocs, fake_managed_allocs, fake_copies, fake_launches;

static pthread_mutex_t tab_mu = PTHREAD_MUTEX_INITIALIZER;
static int put(void **out, size_t n, int type)
{
    void *p = NULL;
    if (posix_memalign(&p, 4096, n ? n : 1))
        return (last_error = 2);
    /* a freed entry is reused: the stress harness (rtstress.c) allocates and frees far more
       often than the table has entries */
    pthread_mutex_lock(&tab_mu);
    int i = 0;
    while (i < n_tab && tab[i].p)
        i++;
    if (i == (int)(sizeof tab / sizeof *tab)) {
        pthread_mutex_unlock(&tab_mu);
        free(p);
        return (last_error = 2);
    }
    tab[i].p = p, tab[i].n = n, tab[i].type = type;
    if (i == n_tab)
        n_tab++;
    pthread_mutex_unlock(&tab_mu);
    *out = p;
    return 0;
}

static int find(const void *p)
{
    for (int i = 0; i < n_tab; i++)
        if (tab[i].p && (const char *)p >= tab[i].p && (const char *)p < tab[i].p + tab[i].n)
            return i;
    return -1;
}

API int cudaMalloc(void **p, size_t n) { fake_device_allocs++; return put(p, n, T_DEVICE); }
API int cudaMallocManaged(void **p, size_t n, unsigned flags) { (void)flags; fake_managed_allocs++; return put(p, n, T_MANAGED); }
API int cudaMallocHost(void **p, size_t n) { return put(p, n, T_HOST); }
API int cudaHostAlloc(void **p, size_t n, unsigned flags) { (void)flags; return put(p, n, T_HOST); }
static int drop(void *p)
{
    pthread_mutex_lock(&tab_mu);
    int i = find(p);
    int ok = i >= 0 && tab[i].p == p;
    if (ok)
        tab[i].p = NULL;
    pthread_mutex_unlock(&tab_mu);
    if (!ok)
        return (last_error = 1);
    free(p);
    return 0;
}
API int cudaFree(void *p) { return p ? drop(p) : 0; }
API int cudaFreeHost(void *p) { return drop(p); }

static int copy(void *d, const void *s, size_t n) { __sync_fetch_and_add(&fake_copies, 1); memmove(d, s, n); return 0; }
/* FAKE_PINNED_COPY_FAILS: a synchronous copy to or from pinned memory fails (cudaErrorInvalidValue,
   left as the last error), so that a caller's fallback for a copy it cannot make is tested */
static int pinned(const void *p) { int i = find(p); return i >= 0 && tab[i].type == T_HOST; }
API int cudaMemcpy(void *d, const void *s, size_t n, int kind)
{
    (void)kind;
    if (getenv("FAKE_PINNED_COPY_FAILS") && (pinned(d) || pinned(s)))
        return (last_error = 1);
    return copy(d, s, n);
}

/* the fake copy engine: deferred copies out of pinned memory, in order per stream */
static pthread_mutex_t ce_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ce { void *d; const void *s; size_t n; void *stream; unsigned long seq; } ceq[1024];
static int n_ceq;
static unsigned long ce_seq;
API int fake_deferred_copies;

/* run the queued copies of @stream (NULL: all) up to @seq */
static void ce_run(void *stream, int all, unsigned long seq)
{
    pthread_mutex_lock(&ce_mu);
    int j = 0;
    for (int i = 0; i < n_ceq; i++) {
        if ((all || ceq[i].stream == stream) && ceq[i].seq <= seq)
            memmove(ceq[i].d, ceq[i].s, ceq[i].n);
        else
            ceq[j++] = ceq[i];
    }
    n_ceq = j;
    pthread_mutex_unlock(&ce_mu);
}

API int cudaMemcpyAsync(void *d, const void *s, size_t n, int kind, void *st)
{
    (void)kind;
    int i = find(s);
    if (i < 0 || tab[i].type != T_HOST)
        return copy(d, s, n);
    pthread_mutex_lock(&ce_mu);
    if (n_ceq == (int)(sizeof ceq / sizeof *ceq)) {
        pthread_mutex_unlock(&ce_mu);
        ce_run(NULL, 1, ~0ul);
        pthread_mutex_lock(&ce_mu);
    }
    ceq[n_ceq++] = (struct ce){ d, s, n, st, ++ce_seq };
    pthread_mutex_unlock(&ce_mu);
    __sync_fetch_and_add(&fake_copies, 1);
    __sync_fetch_and_add(&fake_deferred_copies, 1);
    return 0;
}
API int cudaMemset(void *d, int v, size_t n) { memset(d, v, n); return 0; }

typedef struct { unsigned x, y, z; } dim3;

/* Several fake GPUs (FAKE_DEVICES, default 1) with a per-thread current device, streams and
   events that belong to the device current at their creation, and the rules of the real runtime
   that SnuRHAC partitioning must respect: a launch goes to a stream of the current device, an
   event is recorded on a stream of its own device; a stream may wait on any device's event.
   Every device-side call is appended to a log (fake_log_text) so a test sees the order. The
   kernel running now can read fake_cur_device and fake_cur_grid. */
struct fake_stream { int id, dev; };
struct fake_event { void *stream; unsigned long seq; int id, dev; };
static __thread int cur_dev;
API __thread int fake_cur_device;
API __thread dim3 fake_cur_grid;
static int n_streams, n_events;
static char fake_log[1 << 16];
static size_t fake_log_len;
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
#include <stdarg.h>
#include <stdio.h>
static void logf_(const char *fmt, ...)
{
    va_list ap;
    pthread_mutex_lock(&log_mu);
    va_start(ap, fmt);
    if (fake_log_len < sizeof fake_log - 128)
        fake_log_len += vsnprintf(fake_log + fake_log_len, sizeof fake_log - fake_log_len, fmt, ap);
    va_end(ap);
    pthread_mutex_unlock(&log_mu);
}
API const char *fake_log_text(void) { return fake_log; }
API void fake_log_clear(void) { fake_log_len = 0; fake_log[0] = 0; }
static int n_devices(void) { const char *v = getenv("FAKE_DEVICES"); return v ? atoi(v) : 1; }
/* legacy default stream (NULL) and cudaStreamPerThread (0x2) belong to the current device */
static int stream_dev(void *s) { return s && s != (void *)0x2 ? ((struct fake_stream *)s)->dev : cur_dev; }
static int stream_id(void *s) { return !s ? 0 : s == (void *)0x2 ? -2 : ((struct fake_stream *)s)->id; }

API int fake_driver_launch(const void *f, void **args);

static int launch(const void *f, dim3 g, void **args, void *stream)
{
    if (stream_dev(stream) != cur_dev)
        return (last_error = 400);   /* cudaErrorInvalidResourceHandle */
    ce_run(stream, 0, ~0ul);   /* a stream runs in order: its queued copies first */
    __sync_fetch_and_add(&fake_launches, 1);
    Dl_info di;
    logf_("launch %s dev=%d stream=%d grid=%u,%u,%u\n", dladdr(f, &di) && di.dli_sname ? di.dli_sname : "?", cur_dev,
          stream_id(stream), g.x, g.y, g.z);
    fake_cur_device = cur_dev, fake_cur_grid = g;
    if (getenv("FAKE_RT_VIA_DRIVER"))   /* as libcudart does: the launch ends in the driver's entry point */
        return fake_driver_launch(f, args);
    ((kernel_fn)f)(args);
    return 0;
}
API int cudaLaunchKernel(const void *f, dim3 g, dim3 b, void **args, size_t smem, void *s)
{
    (void)b, (void)smem;
    return launch(f, g, args, s);
}

/* the <<<>>> stub's entry point of CUDA >= 12.8 */
API int __cudaLaunchKernel(const void *f, dim3 g, dim3 b, void **args, size_t smem, void *s)
{
    (void)b, (void)smem;
    return launch(f, g, args, s);
}
typedef struct { dim3 grid, block; size_t smem; void *stream; void *attrs; unsigned nattrs; } launch_config;
API int cudaLaunchKernelExC(const launch_config *c, const void *f, void **args)
{
    /* an internal call, as in libcudart: not through the exported (interposed) symbol */
    return launch(f, c->grid, args, c->stream);
}
API int cudaStreamWaitEvent(void *s, void *e, unsigned flags)
{
    (void)flags;
    if (!e)
        return (last_error = 400);
    logf_("wait stream=%d event=%d\n", stream_id(s), ((struct fake_event *)e)->id);
    return 0;
}
API int cudaGetDeviceCount(int *n) { *n = n_devices(); return 0; }
API int cudaDeviceCanAccessPeer(int *can, int d, int p) { *can = d != p; return 0; }
API int cudaDeviceEnablePeerAccess(int p, unsigned flags) { (void)flags; logf_("peer %d->%d\n", cur_dev, p); return 0; }

API int cudaFuncGetName(const char **name, const void *f)
{
    Dl_info di;
    if (!dladdr(f, &di) || !di.dli_sname)
        return (last_error = 98);
    *name = di.dli_sname;
    return 0;
}
API int cudaGetFuncBySymbol(void **out, const void *f) { *out = (void *)f; return 0; }

API int cudaPointerGetAttributes(void *attr, const void *p)
{
    int i = find(p);
    memset(attr, 0, 64);
    *(int *)attr = i < 0 ? T_UNREG : tab[i].type;
    return 0;
}

API int cudaDeviceGetAttribute(int *v, int attr, int dev)
{
    (void)dev;
    *v = attr == 89 ? !getenv("FAKE_NO_CONCURRENT") : 0;
    return 0;
}
API int cudaGetDevice(int *d) { *d = cur_dev; return 0; }
API int cudaSetDevice(int d)
{
    if (d < 0 || d >= n_devices())
        return (last_error = 101);   /* cudaErrorInvalidDevice */
    cur_dev = d;
    return 0;
}
API int cudaGetLastError(void) { int e = last_error; last_error = 0; return e; }
API int cudaEventCreateWithFlags(void **e, unsigned f)
{
    (void)f;
    struct fake_event *ev = calloc(1, sizeof(struct fake_event));
    ev->id = __sync_add_and_fetch(&n_events, 1), ev->dev = cur_dev;
    *e = ev;
    return 0;
}
API int cudaEventRecord(void *e, void *s)
{
    struct fake_event *ev = e;
    if (ev->dev != stream_dev(s))
        return (last_error = 400);
    logf_("record event=%d stream=%d\n", ev->id, stream_id(s));
    pthread_mutex_lock(&ce_mu);
    ev->stream = s, ev->seq = ce_seq;
    pthread_mutex_unlock(&ce_mu);
    return 0;
}
API int cudaEventSynchronize(void *e) { struct fake_event *ev = e; ce_run(ev->stream, 0, ev->seq); return 0; }
API int cudaStreamCreateWithFlags(void **s, unsigned f)
{
    (void)f;
    struct fake_stream *st = calloc(1, sizeof *st);
    st->id = __sync_add_and_fetch(&n_streams, 1), st->dev = cur_dev;
    *s = st;
    return 0;
}
API int cudaStreamIsCapturing(void *s, int *st) { (void)s; *st = 0; return 0; }
API int cudaStreamSynchronize(void *s) { ce_run(s, 0, ~0ul); return 0; }
API int cudaDeviceSynchronize(void)
{
    ce_run(NULL, 1, ~0ul);
    fake_file_log("sync\n", 0, 0, 0);
    return 0;
}

/* What cuBLAS does: reach the driver's launch through dlsym(libcuda, cuGetProcAddress). */
API int fake_driver_launch(const void *f, void **args)
{
    const char *path = getenv("FAKE_LIBCUDA");
    void *h = dlopen(path ? path : "libcuda.so.1", RTLD_NOW);
    if (!h)
        return 99;
    int (*gpa)(const char *, void **, int, uint64_t, void *) = (int (*)(const char *, void **, int, uint64_t, void *))dlsym(h, "cuGetProcAddress_v2");
    void *fn = NULL;
    if (!gpa || gpa("cuLaunchKernel", &fn, 13000, 0, NULL) || !fn)
        return 98;
    int (*launch)(const void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **, void **) =
        (int (*)(const void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **, void **))fn;
    return launch(f, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL);
}
/* The fake "GPU" runs every kernel inside the launch call, so an event is complete unless a
   deferred copy queued before it on its stream is still pending (cudaErrorNotReady). */
API int cudaEventQuery(void *e)
{
    struct fake_event *ev = e;
    int pending = 0;
    pthread_mutex_lock(&ce_mu);
    for (int i = 0; i < n_ceq; i++)
        pending |= ceq[i].stream == ev->stream && ceq[i].seq <= ev->seq;
    pthread_mutex_unlock(&ce_mu);
    return pending ? 600 : 0;
}
API int cudaEventDestroy(void *e) { free(e); return 0; }
#endif

