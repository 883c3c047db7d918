/* interposition: init, the runtime API we wrap, kernel ends, driver-level launches.
 * Part of umctl_rt.c's translation unit (included there, not compiled alone). */

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
    cfg_evict_each = env_on("UMCTL_RT_EVICT_EACH");
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
    flush_final();
    if (cfg_stats)
        fprintf(stderr,
                "umctl_rt: pid=%d hum_copies=%llu fallbacks=%llu barrier_waits=%llu segv_waits=%llu launches=%llu driver_launches=%llu "
                "managed_allocs=%llu driver_wrapped=%llu chunks=%llu pinned_chunks=%llu stage_ms=%.1f dma_wait_ms=%.1f populated=%llu "
                "dma_chunks=%llu prefetches=%llu drops=%llu,%llu,%llu partitioned=%llu part_fallbacks=%llu "
                "read_mostly=%llu,%llu discards=%llu,%llu,%llu discard_lock_ms=%.1f,%.2f call_ms=%.1f protect_ms=%.1f unprotect_ms=%.1f copy_ms=%.1f copy_max_ms=%.1f "
                "prefer_host=%llu,%llu evict_each=%llu,%llu\n",
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
                st_copy_ns / 1e6, st_copy_max_ns / 1e6, (unsigned long long)st_prefer_host,
                (unsigned long long)st_prefer_host_failed, (unsigned long long)st_evict_each,
                (unsigned long long)st_evict_each_failed);
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
    void *ps = prefetch_stream_of(d);
    if (ps && cu_prefetch((u64)(uintptr_t)p, n, d, ps) == 0 && get_cudaStreamSynchronize()(ps) == 0)
        atomic_fetch_add(&st_populated, 1);
    if (get_cudaGetLastError())
        get_cudaGetLastError()();
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
        cudaError_t rm = get_cudaMallocManaged()(p, n, 1 /* cudaMemAttachGlobal */);
        tl_internal--;
        if (rm == 0) {
            atomic_fetch_add(&st_managed, 1);
            remember_alloc(*p, n, 1);
            if (cfg_hum)
                hum_populate(*p, n);
            return 0;
        }
        if (get_cudaGetLastError())
            get_cudaGetLastError()();   /* our attempt must not leave an error behind */
    }
    cudaError_t r = get_cudaMalloc()(p, n);
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
    cudaError_t r = get_cudaFree()(p);
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

static void cl_host_sync(void);   /* rt_snurhac.c: the node's agent brings current data first */

/* Before a copy (synchronous or not): one out of managed memory to the host (copy_kind 1) reads
   what the kernels wrote, so on a cluster the node's copy is made current first; host-to-device
   and device-to-device copies do not sync (the host reads nothing there). An asynchronous copy
   syncs at its call, not at the wait after it (by then it would have copied stale data): on a
   cluster a partitioned kernel has ended on every node when its launch returns. Returns
   copy_kind(). */
static int copy_host_sync(int kind, const void *dst, const void *src)
{
    int k = copy_kind(kind, dst, src);
    if (k == 1)
        cl_host_sync();
    return k;
}

API cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, int kind)
{
    if (!get_cudaMemcpy())
        return 1;
    if (hum_try(dst, src, n, kind, NULL, 0))
        return 0;
    hum_barrier();
    int k = copy_host_sync(kind, dst, src);
    int64_t t0 = sock_fd >= 0 ? now_ns() : 0;
    cudaError_t r = get_cudaMemcpy()(dst, src, n, kind);
    if (sock_fd >= 0 && !tl_internal && r == 0 && k >= 0)
        report_copy(t0, now_ns(), k, dst, src, n, NULL, 0, current_device());
    return r;
}

API cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, cudaStream_t s)
{
    if (!get_cudaMemcpyAsync())
        return 1;
    if (hum_try(dst, src, n, kind, s, 1))
        return 0;
    hum_barrier();
    int k = copy_host_sync(kind, dst, src);
    int64_t t0 = sock_fd >= 0 ? now_ns() : 0;
    cudaError_t r = get_cudaMemcpyAsync()(dst, src, n, kind, s);
    if (sock_fd >= 0 && !tl_internal && r == 0 && k >= 0)
        report_copy(t0, 0, k, dst, src, n, s, 1, current_device());
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
/* ended events for reuse, with the device each was created on: an event can be recorded only on
   a stream of its own device (cudaErrorInvalidResourceHandle otherwise, left as the program's
   last error) */
static struct { cudaEvent_t ev; int dev; } trk_pool[TRK];
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

/* This thread is the ring's only consumer: track_end writes an entry only at the tail, and only
   while the ring has room, so the entries in [head, tail) as read under the lock stay this
   thread's until it moves head past them. The events are queried and the ends reported outside
   the lock, which the program's launches take: they never wait for the driver calls or a report
   flush of this thread. */
#define TRK_SCAN 512
static void *trk_worker(void *arg)
{
    (void)arg;
    tl_internal = 1;
    int cur_dev = -1;
    struct trk ended[TRK_SCAN];
    for (;;) {
        pthread_mutex_lock(&trk_mu);
        unsigned head = trk_head, n = trk_tail - trk_head;
        pthread_mutex_unlock(&trk_mu);
        if (n > TRK_SCAN)
            n = TRK_SCAN;
        unsigned n_ended = 0;
        /* scan the pending window: kernels on different streams end out of order */
        for (unsigned i = 0; i < n; i++) {
            struct trk *t = &trk_q[(head + i) % TRK];
            if (!t->ev)
                continue;
            if (t->dev != cur_dev && get_cudaSetDevice()(t->dev) == 0)
                cur_dev = t->dev;
            if (get_cudaEventQuery()(t->ev) == 0) {
                report_end(t);
                ended[n_ended++] = *t;
                t->ev = NULL;
            }
        }
        pthread_mutex_lock(&trk_mu);
        for (unsigned i = 0; i < n_ended; i++)
            trk_pool[trk_npool].ev = ended[i].ev, trk_pool[trk_npool++].dev = ended[i].dev;   /* <= TRK: below */
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
    int dev = current_device(), k = trk_npool;
    while (k > 0 && trk_pool[k - 1].dev != dev)
        k--;
    /* every event is in the ring or the pool (or being moved from one to the other): a new one
       only while they hold fewer than TRK, so that the pool never overflows */
    if (trk_tail - trk_head >= TRK || (!k && trk_tail - trk_head + trk_npool >= TRK)) {
        atomic_fetch_add(&st_trk_drop, 1);   /* the kernel's end is not reported: never block */
    } else {
        cudaEvent_t ev = NULL;
        if (k) {
            ev = trk_pool[k - 1].ev;
            trk_pool[k - 1] = trk_pool[--trk_npool];
        } else if (get_cudaEventCreateWithFlags()(&ev, 2 /* disable timing */) != 0) {
            ev = NULL;
        }
        if (ev && get_cudaEventRecord()(ev, s) == 0) {
            struct trk *t = &trk_q[trk_tail++ % TRK];
            t->seq = seq, t->dev = dev, t->ev = ev;
        } else if (ev) {
            trk_pool[trk_npool].ev = ev, trk_pool[trk_npool++].dev = dev;
        }
    }
    pthread_mutex_unlock(&trk_mu);
    tl_internal--;
}

/* ---------------------------------------------------------------- complete access sets (UMCTL_RT_EVICT_EACH)

   umctl run --complete-accesses. A recording holds only the accesses that faulted: once a page
   is on the GPU, the kernels after the one that brought it leave no trace of touching it, so
   a recording made where the program fits cannot be replayed at a smaller GPU (every later
   access is missing), and one made under a budget holds whatever that budget's keeper let
   fault. Here every reported kernel is followed by a wait for the GPU and a migration of all
   managed memory back to the host: the next kernel then faults every page it touches, and the
   trace holds each kernel's whole access set (less the pages the driver's density prefetcher
   brought along with a faulting neighbour), the input a replay at any GPU size needs. Slow by
   design (every access a fault, every kernel a round trip); the program's results are
   unchanged. The waits use the real entry points: the program's own synchronisation
   bookkeeping (exec_hash's occurrence epochs) does not see them. */
static void evict_each(void)
{
    if (!cfg_evict_each || tl_internal)
        return;
    pthread_once(&driver_once, load_driver);
    if (!cu_prefetch || !get_cudaDeviceSynchronize())
        return;
    tl_internal++;
    get_cudaDeviceSynchronize()();   /* the kernel's faults are all made before this returns */
    pthread_mutex_lock(&allocs_mu);
    struct alloc *v = n_allocs ? malloc(n_allocs * sizeof *v) : NULL;
    size_t n = 0;
    for (size_t i = 0; v && i < n_allocs; i++)
        if (allocs[i].managed)
            v[n++] = allocs[i];
    pthread_mutex_unlock(&allocs_mu);
    int failed = 0;
    for (size_t i = 0; i < n; i++)
        failed |= cu_prefetch((u64)v[i].addr, v[i].n, -1 /* CU_DEVICE_CPU */, NULL) != 0;
    free(v);
    get_cudaDeviceSynchronize()();
    atomic_fetch_add(failed ? &st_evict_each_failed : &st_evict_each, 1);
    tl_internal--;
}

/* After a reported launch was accepted: its end tracked, its accesses made complete. */
static void after_launch(int64_t seq, cudaStream_t s)
{
    track_end(seq, s);
    if (seq >= 0)
        evict_each();
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
        after_launch(q, rs);
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
        after_launch(q, rs);
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
