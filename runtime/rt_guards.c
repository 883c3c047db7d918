/* HUM's write protection: libc calls that would write a protected source.
 * Part of umctl_rt.c's translation unit (included there, not compiled alone). */

/* ---------------------------------------------------------------- libc: the sources' guards */

/* Freeing, unmapping, reprotecting or reading into (through the kernel, where a write to a
   protected page would be EFAULT rather than a signal) a pending copy's source first waits. */
#define LIBC(ret, name, ...)                                                          \
    typedef ret (*name##_lt)(__VA_ARGS__);                                            \
    static name##_lt libc_##name;                                                     \
    static inline name##_lt get_libc_##name(void)                                     \
    {                                                                                 \
        return LAZY_SYM(libc_##name, rdlsym(RTLD_NEXT, #name));                       \
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
    free_lt real = __atomic_load_n(&libc_free, __ATOMIC_ACQUIRE);
    if (!real) {
        if (tl_resolving) {
            __libc_free(p);
            return;
        }
        tl_resolving = 1;
        real = get_libc_free();
        tl_resolving = 0;
        if (!real) {
            __libc_free(p);
            return;
        }
    }
    if (p && pending())
        hum_wait_range(p, malloc_usable_size(p));
    real(p);
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
    /* the child has only this thread: a report lock another thread held at the fork would stay
       locked there for good, so they are held across it (in push's order: buffers, then names) */
    for (int k = 0; k < 3; k++)
        pthread_mutex_lock(&rb[k].mu);
    pthread_mutex_lock(&names_mu);
    pid_t r = get_libc_fork()();
    if (r == 0) {   /* no worker and no flusher in the child: HUM off there, flusher restarted */
        my_pid = (int32_t)getpid();
        cfg_hum = 0;
        for (int k = 0; k < 3; k++) {   /* the parent's records (and counts) are the parent's */
            rb[k].n = 0, rb[k].count = 0, rb[k].pending = 0, rb[k].pushed = 0;
            atomic_store(&drops[k], 0);
        }
        pthread_once_t fresh = PTHREAD_ONCE_INIT;
        flusher_once = fresh;
    }
    pthread_mutex_unlock(&names_mu);
    for (int k = 3; k-- > 0;)
        pthread_mutex_unlock(&rb[k].mu);
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
