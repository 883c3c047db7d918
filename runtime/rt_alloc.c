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
/* UMCTL_RT_PREFER_HOST (umctl's budget admission, umctl/live/control.py): every managed
 * allocation gets the host as its preferred location before the program can touch it, so a GPU
 * fault maps the host page instead of migrating it and only umctl's own migrations bring memory
 * onto a GPU. Set here, synchronously, because advice given later from outside would race the
 * program's first touch. Success is reported (op 4, HOST_PREFERRED): umctl's budget check counts
 * GPU faults in such a range as remote mappings, not arrivals, only on that evidence. */
static _Atomic u64 st_prefer_host, st_prefer_host_failed;
static int prefer_host_on(void)
{
    static _Atomic int on = -1;
    int v = atomic_load(&on);
    if (v < 0) {
        v = env_on("UMCTL_RT_PREFER_HOST");
        atomic_store(&on, v);
    }
    return v;
}

static void prefer_host(const void *p, size_t n, int64_t id)
{
    pthread_once(&driver_once, load_driver);
    int rc = -1;
    tl_internal++;
    if (cu_advise_v2) {
        cu_mem_location_t host = {2 /* CU_MEM_LOCATION_TYPE_HOST */, 0};
        rc = cu_advise_v2((u64)(uintptr_t)p, n, 3 /* SET_PREFERRED_LOCATION */, host);
    } else if (cu_advise) {
        rc = cu_advise((u64)(uintptr_t)p, n, 3 /* SET_PREFERRED_LOCATION */, -1 /* CU_DEVICE_CPU */);
    }
    tl_internal--;
    if (rc == 0) {
        atomic_fetch_add(&st_prefer_host, 1);
        report_alloc(4, p, n, id, 1);
    } else {
        atomic_fetch_add(&st_prefer_host_failed, 1);
    }
}

/* A new allocation of the program's: tracked, counted against the managed cap, reported. */
static void remember_alloc(const void *p, size_t n, int managed)
{
    if (managed)
        atomic_fetch_add(&managed_bytes, n);
    int64_t id = track(p, n, managed);
    report_alloc(0, p, n, id, managed);
    if (managed && prefer_host_on())
        prefer_host(p, n, id);
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
