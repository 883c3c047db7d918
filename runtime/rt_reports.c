/* reports: the datagrams to umctl (launches, allocations, copies), batched and non-blocking.
 * Part of umctl_rt.c's translation unit (included there, not compiled alone). */

/* ---------------------------------------------------------------- reports */

#define RBUF_BYTES 12288
/* Batches the socket refused for want of room (umctl's reader behind: a unix datagram socket
   takes only net.unix.max_dgram_qlen datagrams, 10 on some kernels, before EAGAIN), kept in
   order and sent first at the next flush, so a reader that stalls for a moment loses nothing.
   Allocated on the first refusal; what does not fit is dropped and counted. */
#define PENDING_MAX 256
struct pbatch { uint32_t n; char data[RBUF_BYTES]; };
struct rbuf {
    pthread_mutex_t mu;
    uint8_t kind;
    size_t recsz;
    uint32_t n;
    u64 pushed;   /* records ever pushed: sent + dropped + still here (tests/rtprog/rtstress.c) */
    char data[RBUF_BYTES];
    struct pbatch *ring;      /* PENDING_MAX refused batches, oldest at head */
    uint32_t head, count;
    u64 pending;              /* records in the ring ("still here" too) */
};
static struct rbuf rb[3] = {
    {PTHREAD_MUTEX_INITIALIZER, UMRT_LAUNCH, sizeof(struct umrt_launch), 0, 0, {0}},
    {PTHREAD_MUTEX_INITIALIZER, UMRT_ALLOC, sizeof(struct umrt_alloc), 0, 0, {0}},
    {PTHREAD_MUTEX_INITIALIZER, UMRT_COPY, sizeof(struct umrt_copy), 0, 0, {0}},
};
static _Atomic u64 drops[3];
static int32_t my_pid;

static pthread_mutex_t names_mu = PTHREAD_MUTEX_INITIALIZER;
static char **names;
static uint16_t *name_lens;
static int n_names, cap_names, names_sent;

/* 0: sent; 1: no room now (the reader is behind: worth another try); -1: not sent (no reader) */
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
    int saved = errno;   /* this runs on the program's threads: its errno is its own */
    int r = sendmsg(sock_fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL) >= 0 ? 0
            : errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS ? 1 : -1;
    errno = saved;
    return r;
}

/* Names go before the launches that use them; a name that could not be sent is retried at the
   next flush (never dropped), since every later launch of that kernel needs it. The batch is
   built in a static buffer that names_mu guards: this runs on the program's threads, whose
   stacks may be small. Returns whether every name interned so far has been sent. */
static int flush_names(void)
{
    static char buf[RBUF_BYTES];
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
        if (!cnt || send_dgram(UMRT_NAMES, cnt, buf, len) != 0)
            break;
        names_sent = i;
    }
    int all = names_sent >= n_names;
    pthread_mutex_unlock(&names_mu);
    return all;
}

/* Send what rb[k] holds and empty it; called with b->mu held, so the records of one kind leave in
   the order they were pushed and no thread can write into the buffer while it is read. A batch
   the socket does not take is counted in drops[] (never silently lost). Launch records name
   kernels that were interned before the records were pushed, so the names go first. */
static void send_locked(int k)
{
    struct rbuf *b = &rb[k];
    if (!b->n && !b->count)
        return;
    /* launches name kernels: while their names wait, so do they (the reader would take an
       unknown name for good) */
    int held = k == 0 && !flush_names();
    while (b->count && !held) {   /* older batches first: one kind's records leave in push order */
        struct pbatch *p = &b->ring[b->head];
        int r = send_dgram(b->kind, p->n, p->data, p->n * b->recsz);
        if (r > 0)
            break;
        if (r < 0)
            atomic_fetch_add(&drops[k], p->n);
        b->pending -= p->n;
        b->head = (b->head + 1) % PENDING_MAX;
        b->count--;
    }
    if (!b->n)
        return;
    int r = b->count || held ? 1 : send_dgram(b->kind, b->n, b->data, b->n * b->recsz);
    if (r > 0) {
        if (!b->ring) {
            int saved = errno;   /* the program's thread: its errno is its own */
            b->ring = calloc(PENDING_MAX, sizeof *b->ring);
            errno = saved;
        }
        if (b->ring && b->count < PENDING_MAX) {
            struct pbatch *p = &b->ring[(b->head + b->count) % PENDING_MAX];
            p->n = b->n;
            memcpy(p->data, b->data, (size_t)b->n * b->recsz);
            b->count++;
            b->pending += b->n;
        } else {
            atomic_fetch_add(&drops[k], b->n);
        }
    } else if (r < 0) {
        atomic_fetch_add(&drops[k], b->n);
    }
    b->n = 0;
}

static void flush_kind(int k)
{
    struct rbuf *b = &rb[k];
    pthread_mutex_lock(&b->mu);
    send_locked(k);
    pthread_mutex_unlock(&b->mu);
}

static void flush_all(void)
{
    if (sock_fd < 0)
        return;
    flush_names();
    for (int k = 0; k < 3; k++)
        flush_kind(k);
}

/* At exit: flush, and give a reader that is behind up to a second to take the refused batches;
   what it still has not taken is dropped and counted. */
static void flush_final(void)
{
    if (sock_fd < 0)
        return;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        flush_all();
        uint32_t left = 0;
        for (int k = 0; k < 3; k++) {
            pthread_mutex_lock(&rb[k].mu);
            left += rb[k].count;
            pthread_mutex_unlock(&rb[k].mu);
        }
        if (!left)
            return;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((t.tv_sec - t0.tv_sec) * 1000000000LL + (t.tv_nsec - t0.tv_nsec) > 1000000000LL)
            break;
        usleep(1000);
    }
    for (int k = 0; k < 3; k++) {
        pthread_mutex_lock(&rb[k].mu);
        atomic_fetch_add(&drops[k], rb[k].pending);
        rb[k].pending = 0, rb[k].count = 0;
        pthread_mutex_unlock(&rb[k].mu);
    }
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

/* Room is checked under the lock before the copy: any number of threads (the program's, the
   kernel-end tracker, the flusher) may push and flush at once, and none can write past data[]. */
static void push(int k, const void *rec)
{
    struct rbuf *b = &rb[k];
    pthread_once(&flusher_once, start_flusher);
    pthread_mutex_lock(&b->mu);
    if ((size_t)(b->n + 1) * b->recsz > sizeof b->data)
        send_locked(k);
    memcpy(b->data + (size_t)b->n * b->recsz, rec, b->recsz);
    b->n++;
    b->pushed++;
    if ((size_t)(b->n + 1) * b->recsz > sizeof b->data)   /* a full batch leaves at once */
        send_locked(k);
    pthread_mutex_unlock(&b->mu);
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
        get_cudaGetDevice()(&d);
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
