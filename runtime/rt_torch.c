/* PyTorch pluggable allocator and the safe invalidation umctl asks for.
 * Part of umctl_rt.c's translation unit (included there, not compiled alone). */

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
        get_cudaEventDestroy()(ev);
}

/* An event after everything queued on @stream so far, or NULL (no control channel, a stream
   being captured, any CUDA error): a block without one is never discarded. */
static cudaEvent_t free_event(int dev, void *stream)
{
    if (!cfg_control || dev < 0 || dev >= MAX_DEV || !get_cudaEventCreateWithFlags() || !get_cudaEventRecord() ||
        !get_cudaEventQuery() || !get_cudaGetDevice() || !get_cudaSetDevice())
        return NULL;
    int capturing = 0;
    if (get_cudaStreamIsCapturing() && (get_cudaStreamIsCapturing()(stream, &capturing) != 0 || capturing)) {
        if (get_cudaGetLastError())
            get_cudaGetLastError()();
        return NULL;
    }
    cudaEvent_t ev = NULL;
    pthread_mutex_lock(&evpool_mu);
    if (n_ev_pool[dev])
        ev = ev_pool[dev][--n_ev_pool[dev]];
    pthread_mutex_unlock(&evpool_mu);
    int prev = -1;
    tl_internal++;
    get_cudaGetDevice()(&prev);
    if (prev != dev)
        get_cudaSetDevice()(dev);
    int ok = (ev || get_cudaEventCreateWithFlags()(&ev, 2 /* disable timing */) == 0) &&
             get_cudaEventRecord()(ev, stream) == 0;
    if (prev != dev && prev >= 0)
        get_cudaSetDevice()(prev);
    tl_internal--;
    if (!ok) {
        if (get_cudaGetLastError())
            get_cudaGetLastError()();
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
                int r = get_cudaEventQuery()(hit[i].ev);
                st = r == 0 ? (b > a ? UMRT_DISCARDED : UMRT_KEPT_SMALL) : r == 600 /* not ready */ ? UMRT_KEPT_BUSY
                                                                                            : UMRT_KEPT_UNSAFE;
                if (r != 0 && r != 600 && get_cudaGetLastError())
                    get_cudaGetLastError()();
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
    get_cudaGetDevice()(&prev);
    if (prev != device)
        get_cudaSetDevice()(device);
    void *p = NULL;
    tl_internal++;
    cudaError_t r = get_cudaMallocManaged()(&p, n, 1);
    tl_internal--;
    if (prev != device && prev >= 0)
        get_cudaSetDevice()(prev);
    if (r != 0) {
        if (get_cudaGetLastError())
            get_cudaGetLastError()();
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
        get_cudaFree()(p);
    tl_internal--;
}
