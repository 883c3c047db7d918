/* allocations: cudaMalloc routed to managed memory, and the table of what we allocated.
 * Part of umctl_rt.c's translation unit (included there, not compiled alone). */

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
/* UMCTL_RT_PREFER_HOST (umctl's budget admission, umctl/loop/residency.py, *Admission*): every
 * managed allocation gets the host as its preferred location before the program can touch it, so a
 * GPU fault maps the host page instead of migrating it and only umctl's own migrations bring
 * memory onto a GPU. Set here, synchronously, because advice given later from outside would race
 * the program's first touch. Success is reported (op 4, HOST_PREFERRED): umctl's budget check
 * counts GPU faults in such a range as remote mappings, not arrivals, only on that evidence.
 *
 * UMCTL_RT_PREFER_GPUS=1,2,3 (admission with memHarvester's spare GPUs, --spare-gpus): the
 * preferred location is one of those neighbour GPUs instead, in slices of PREFER_SLICE bytes
 * dealt round-robin. A fault of the program's GPU then maps the neighbour's page over the
 * GPU-to-GPU link (NVLink) instead of the host's over PCIe/C2C, the first touch populates the
 * neighbour's memory, and the blocks umctl evicts there are read remotely until admitted again:
 * the neighbours' spare memory is the victim cache, and a miss costs a remote read from it
 * rather than from the host. Reported as op 5, PEER_PREFERRED. The neighbours are registered
 * first (a context on each), since the driver can only place pages on a GPU of the address space. */
#define PREFER_SLICE ((size_t)32 << 20)
static _Atomic u64 st_prefer_host, st_prefer_host_failed;
static int prefer_gpus[16], n_prefer_gpus;
static _Atomic u64 prefer_rr;
/* Parsed once for the process: threads allocating at once must not race on the table (every
 * thread read the variable unset and wrote the table: a data race ThreadSanitizer reports). */
static int prefer_mode_v;
static pthread_once_t prefer_mode_once = PTHREAD_ONCE_INIT;
static void parse_prefer_mode(void)
{
    const char *g = getenv("UMCTL_RT_PREFER_GPUS");
    int n = 0;
    for (const char *q = g; q && *q && n < 16;) {
        char *end;
        long d = strtol(q, &end, 10);
        if (end == q || d < 0)
            break;
        prefer_gpus[n++] = (int)d;
        q = *end == ',' ? end + 1 : end;
        if (*end != ',')
            break;
    }
    n_prefer_gpus = n;
    prefer_mode_v = n ? 2 : env_on("UMCTL_RT_PREFER_HOST") ? 1 : 0;
}
static int prefer_mode(void)   /* 0 off, 1 host, 2 neighbour GPUs */
{
    pthread_once(&prefer_mode_once, parse_prefer_mode);
    return prefer_mode_v;
}

static pthread_once_t prefer_reg_once = PTHREAD_ONCE_INIT;
static void register_prefer_gpus(void)
{
    int cur = -1;
    if (!get_cudaGetDevice() || !get_cudaSetDevice() || !get_cudaFree() || get_cudaGetDevice()(&cur) != 0)
        return;
    tl_internal++;
    for (int i = 0; i < n_prefer_gpus; i++)
        if (prefer_gpus[i] != cur && get_cudaSetDevice()(prefer_gpus[i]) == 0)
            get_cudaFree()(NULL);    /* creates the primary context: the GPU joins the address space */
    get_cudaSetDevice()(cur);
    tl_internal--;
}

static int advise_preferred(const void *p, size_t n, int dev)   /* dev < 0: the host */
{
    if (cu_advise_v2) {
        cu_mem_location_t loc = {dev < 0 ? 2 /* CU_MEM_LOCATION_TYPE_HOST */ : 1 /* DEVICE */, dev < 0 ? 0 : dev};
        return cu_advise_v2((u64)(uintptr_t)p, n, 3 /* SET_PREFERRED_LOCATION */, loc);
    }
    return cu_advise ? cu_advise((u64)(uintptr_t)p, n, 3, dev < 0 ? -1 /* CU_DEVICE_CPU */ : dev) : -1;
}

static void prefer_location(const void *p, size_t n, int64_t id, int mode)
{
    pthread_once(&driver_once, load_driver);
    if (mode == 2)
        pthread_once(&prefer_reg_once, register_prefer_gpus);
    for (size_t off = 0; off < n; off += mode == 1 ? n : PREFER_SLICE) {
        size_t len = mode == 1 || n - off < PREFER_SLICE ? n - off : PREFER_SLICE;
        int dev = mode == 1 ? -1 : prefer_gpus[atomic_fetch_add(&prefer_rr, 1) % (u64)n_prefer_gpus];
        tl_internal++;
        int rc = advise_preferred((const char *)p + off, len, dev);
        tl_internal--;
        if (rc == 0) {   /* reported outside the internal section: internal calls are not reported */
            atomic_fetch_add(&st_prefer_host, 1);
            report_alloc(mode == 1 ? 4 : 5, (const char *)p + off, len, id, 1);
        } else {
            atomic_fetch_add(&st_prefer_host_failed, 1);
        }
    }
}

/* A new allocation of the program's: tracked, counted against the managed cap, reported. */
static void remember_alloc(const void *p, size_t n, int managed)
{
    if (managed)
        atomic_fetch_add(&managed_bytes, n);
    int64_t id = track(p, n, managed);
    report_alloc(0, p, n, id, managed);
    int mode = managed ? prefer_mode() : 0;
    if (mode)
        prefer_location(p, n, id, mode);
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
