/* HUM copies: pending copies, the copy workers, and the barriers that wait for them.
 * Part of umctl_rt.c's translation unit (included there, not compiled alone). */

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

/* Does [p, p+n) overlap a pending copy's source (any byte) or destination? Under hum_mu: a slot's
   fields are written while it is BUSY (being issued, nothing protected yet) and stay as they
   are while it is PENDING, and both changes of state into and out of PENDING take hum_mu, so a
   slot cannot be finished and issued again under the reader. */
static int hum_overlaps(const void *p, size_t n)
{
    uintptr_t a = (uintptr_t)p, b = a + n;
    int hit = 0;
    pthread_mutex_lock(&hum_mu);
    for (int i = 0; i < MAX_COPIES && !hit; i++) {
        struct hcopy *c = &slots[i];
        if (atomic_load(&c->state) != SLOT_PENDING)
            continue;
        uintptr_t s0 = (uintptr_t)c->src & ~(page_sz - 1), s1 = ((uintptr_t)c->src + c->n + page_sz - 1) & ~(page_sz - 1);
        uintptr_t d0 = (uintptr_t)c->dst, d1 = d0 + c->n;
        hit = (a < s1 && s0 < b) || (a < d1 && d0 < b);
    }
    pthread_mutex_unlock(&hum_mu);
    return hit;
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
        /* no lock here (a signal handler): only PENDING slots can have protected pages, and a0/a1
           are read atomically since another slot may be issued (rewritten) meanwhile */
        for (int i = 0; i < MAX_COPIES; i++) {
            struct hcopy *c = &slots[i];
            if (atomic_load(&c->state) != SLOT_PENDING || a < __atomic_load_n(&c->a0, __ATOMIC_RELAXED) ||
                a >= __atomic_load_n(&c->a1, __ATOMIC_RELAXED))
                continue;
            atomic_fetch_add(&st_segv, 1);
            atomic_fetch_add(&c->waiters, 1);   /* workers then unprotect what is staged at once */
            for (;;) {
                uint32_t d = atomic_load(&c->done);
                if (atomic_load(&c->state) != SLOT_PENDING || atomic_load(&c->unprot) > a ||
                    a < __atomic_load_n(&c->a0, __ATOMIC_RELAXED) || a >= __atomic_load_n(&c->a1, __ATOMIC_RELAXED))
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
static pthread_mutex_t prefetch_mu = PTHREAD_MUTEX_INITIALIZER;

/* Device d's prefetch stream (d current), created by the first thread that needs it: the
   program's threads (hum_populate) and the copy workers ask at once. NULL: none could be made. */
static void *prefetch_stream_of(int d)
{
    pthread_mutex_lock(&prefetch_mu);
    if (!prefetch_stream[d] && get_cudaStreamCreateWithFlags() &&
        get_cudaStreamCreateWithFlags()(&prefetch_stream[d], 1 /* non-blocking */) != 0)
        prefetch_stream[d] = NULL;
    void *s = prefetch_stream[d];
    pthread_mutex_unlock(&prefetch_mu);
    return s;
}

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
    return get_cudaMemcpyAsync()(c->dst + off, from, n, 1 /* H2D */, tl_dma_stream) != 0 ? -1 : 0;
}

static int wk_device(struct hum_wk *w, int dev)
{
    if (dev < 0 || dev >= MAX_DEV)
        return 0;
    if (w->cur_dev != dev && (!get_cudaSetDevice() || get_cudaSetDevice()(dev) != 0))
        return 0;
    w->cur_dev = dev;
    if (!w->stream[dev] && (!get_cudaStreamCreateWithFlags()
                            || get_cudaStreamCreateWithFlags()(&w->stream[dev], 1 /* non-blocking */) != 0)) {
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
    get_cudaEventSynchronize()(b->ev[b->dev]);
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
       (an nvcc sample uses cudaMemcpy only, so cudaMemcpyAsync might be unresolved yet) */
    if (!env_size("UMCTL_RT_HUM_PINNED", 1) || !get_cudaHostAlloc() || !get_cudaEventRecord()
        || !get_cudaEventCreateWithFlags() || !get_cudaEventSynchronize() || !get_cudaMemcpyAsync()
        || !get_cudaStreamSynchronize() || !get_cudaGetLastError())
        return 0;
    for (int i = 0; i < HUM_NBUF; i++) {
        void *p = NULL;
        if (get_cudaHostAlloc()(&p, CHUNK, 1 /* portable */) != 0 || !p) {
            if (get_cudaGetLastError())
                get_cudaGetLastError()();
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
    if (!b->ev[c->dev] && get_cudaEventCreateWithFlags()(&b->ev[c->dev], 2 /* disable timing */) != 0) {
        b->ev[c->dev] = NULL;
        return -1;
    }
    tl_stage_buf = b->pin, tl_stage_off = off;
    int64_t t = now_ns();
    for_pieces(c, off, len, put_stage);
    atomic_fetch_add(&st_stage_ns, (u64)(now_ns() - t));
    chunk_staged(c, k);
    if (get_cudaMemcpyAsync()(c->dst + off, b->pin, len, 1 /* H2D */, w->stream[c->dev]) != 0
        || get_cudaEventRecord()(b->ev[c->dev], w->stream[c->dev]) != 0) {
        /* the bytes are staged (and the source may already be written again): finish from the
           buffer, synchronously, by CPU */
        if (get_cudaGetLastError())
            get_cudaGetLastError()();
        get_cudaStreamSynchronize()(w->stream[c->dev]);
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
        dma = for_pieces(c, off, len, put_dma) == 0 && get_cudaStreamSynchronize()(tl_dma_stream) == 0;
    }
    if (dma) {
        atomic_fetch_add(&st_dma, 1);
    } else {
        if (get_cudaGetLastError())
            get_cudaGetLastError()();
        copy_piece(c, off, len);
        if (cu_prefetch && w->cur_dev == c->dev) {
            if (cu_prefetch((u64)(uintptr_t)(c->dst + off), len, c->dev, prefetch_stream_of(c->dev)) == 0)
                atomic_fetch_add(&st_prefetch, 1);
            if (get_cudaGetLastError())
                get_cudaGetLastError()();
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
            get_cudaEventSynchronize()(c->ev);
        size_t off = (size_t)k * CHUNK, len = c->n - off < CHUNK ? c->n - off : CHUNK;
        if (cfg_delay_us)
            usleep(cfg_delay_us);
        int on_dev = wk_device(&w, c->dev);
        if (!on_dev && get_cudaGetLastError())
            get_cudaGetLastError()();
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
    if (!get_cudaDeviceGetAttribute() || get_cudaDeviceGetAttribute()(&v, 89, d) != 0 || !v) {
        if (get_cudaGetLastError())
            get_cudaGetLastError()();
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
    if (get_cudaPointerGetAttributes() && get_cudaPointerGetAttributes()(attr, src) == 0 && *(int *)attr == 0 &&
        (!get_cudaStreamIsCapturing() || (get_cudaStreamIsCapturing()(stream, &cap_status) == 0 && cap_status == 0)))
        ok = 1;
    if (get_cudaGetLastError())
        get_cudaGetLastError()();
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
    c->dst = dst, c->src = src, c->n = n;
    __atomic_store_n(&c->a0, a0, __ATOMIC_RELAXED);   /* the SIGSEGV handler reads them without a lock */
    __atomic_store_n(&c->a1, a1, __ATOMIC_RELAXED);
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
    if (!fail && !c->ev && get_cudaEventCreateWithFlags()(&c->ev, 2 /* disable timing */) != 0)
        fail = 1;
    if (!fail && get_cudaEventRecord()(c->ev, stream) != 0)
        fail = 1;
    if (fail && get_cudaGetLastError())
        get_cudaGetLastError()();
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
