/* SnuRHAC partitioning: a partitionable kernel's grid spread over the GPUs.
 * Part of umctl_rt.c's translation unit (included there, not compiled alone). */

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
   taken back when a later partitioned kernel passes them without the mark.

   Across nodes (umctl/cluster, one process of the program a node under mpirun):
   UMCTL_RT_GPUS is the cluster's GPU count, UMCTL_RT_NODE_GPUS=M the GPUs of this node and
   UMCTL_RT_NODE=n its rank; the grid is cut into UMCTL_RT_GPUS slabs exactly as on one host and
   this process launches only slabs n*M .. n*M+M-1, slab n*M+k on its local GPU k. Without
   them, every slab is local (part_first 0, part_local UMCTL_RT_GPUS). */
struct umctl_part { unsigned off[3], grid[3], ro_mask, magic; };
#define UMCTL_PART_MAGIC 0x54504d55u
static int part_ok;
static int part_first, part_local;   /* this node's first slab and its GPU count */
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
    part_local = cfg_gpus;
    if (getenv("UMCTL_RT_NODE_GPUS")) {
        part_local = (int)env_size("UMCTL_RT_NODE_GPUS", 0);
        part_first = (int)env_size("UMCTL_RT_NODE", 0) * part_local;
        if (part_local < 1 || part_first + part_local > cfg_gpus) {
            fprintf(stderr, "umctl runtime: node %d of %d GPUs each is outside UMCTL_RT_GPUS=%d: kernels are not partitioned\n",
                    part_local ? part_first / part_local : 0, part_local, cfg_gpus);
            ok = 0;
        }
    }
    if (ok && (get_cudaGetDeviceCount()(&n) != 0 || n < part_local)) {
        fprintf(stderr, "umctl runtime: UMCTL_RT_GPUS=%d but %d GPUs visible: kernels are not partitioned\n", part_local, n);
        ok = 0;
    }
    for (int g = 0; ok && g < part_local; g++) {
        ok = get_cudaSetDevice()(g) == 0 && get_cudaStreamCreateWithFlags()(&part_stream[g], 1 /* non-blocking */) == 0 &&
             get_cudaEventCreateWithFlags()(&part_done[g], 2 /* disable timing */) == 0 &&
             get_cudaEventCreateWithFlags()(&part_start[g], 2) == 0;
        /* managed memory needs no peer mappings; a device buffer of GPU h (cudaMalloc beyond the
           managed cap) does, so map every pair that can be mapped */
        for (int h = 0; ok && h < part_local; h++) {
            int can = 0;
            if (h != g && get_cudaDeviceCanAccessPeer() && get_cudaDeviceEnablePeerAccess() &&
                get_cudaDeviceCanAccessPeer()(&can, g, h) == 0 && can)
                get_cudaDeviceEnablePeerAccess()(h, 0);   /* "already enabled" is fine */
        }
    }
    get_cudaSetDevice()(cur);
    if (get_cudaGetLastError())
        get_cudaGetLastError()();
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

/* ---------------------------------------------------------------- SnuRHAC across nodes: the agent

   UMCTL_RT_CLUSTER_FD: a socket to this node's agent (umctl/cluster/live.py, one a rank under
   mpirun), which keeps the UM space coherent across nodes with the other agents. The runtime
   cannot see a GPU's page faults from user space, so it tells the agent what changed by twin and
   diff at the synchronisation points SnuRHAC has anyway:
     before a partitioned launch ('B'): the managed allocations (id, size, and whether this kernel
       only reads (1) or may write (2) each), and the pages the host changed since the last point
       (node 0 only: the program's host side is authoritative there, the others run the same host
       code on the same data); the agent answers with the pages this node lacks, installed here;
     after this node's slabs ('E'): each page they changed, new and old contents (the agent stores
       only the changed bytes, under the page's lock, so that two nodes writing one page merge);
       the agent answers once the cluster-wide synchronisation after the kernel is done;
     where the host waits for the GPU or copies managed data out ('S', cl_host_sync): as 'B',
       so that the host then reads current data.
   Records: {i64 id; u64 size; u32 page; u32 kind} (kind 0: an allocation, page = 0/1/2 as above;
   kind 1: a page, followed by its new then old 4 KiB). Answer: u32 count, then {i64 id; u32 page;
   u32 pad} + 4 KiB each. The diffs are taken after synchronising the caller's stream (before)
   and this node's slab streams (after); the twins and diffs are host reads of managed memory,
   which on a real GPU migrates every page to the host and back at each kernel (tested on the
   fake CUDA runtime only). */
#define CL_PAGE 4096
struct cl_rec { int64_t id; uint64_t size; uint32_t page, kind; };
struct cl_twin { int64_t id; uintptr_t addr; size_t n; unsigned char *twin; int seen; };
static int cl_fd = -1, cl_node;
static int cl_behind;   /* a partitioned kernel ended since this node's data was last made current */
static struct cl_twin cl_tw[MAX_RO];
static int cl_ntw;

static pthread_once_t cl_once = PTHREAD_ONCE_INIT;
static void cl_config(void)
{
    const char *v = getenv("UMCTL_RT_CLUSTER_FD");
    cl_fd = v && *v ? atoi(v) : -1;
    cl_node = (int)env_size("UMCTL_RT_NODE", 0);
}

/* once: host syncs ask from any thread, outside part_mu */
static int cl_on(void)
{
    pthread_once(&cl_once, cl_config);
    return cl_fd >= 0;
}

static int cl_io(int wr, void *p, size_t n)
{
    char *c = p;
    while (n) {
        ssize_t k = wr ? write(cl_fd, c, n) : read(cl_fd, c, n);
        if (k <= 0) {
            fprintf(stderr, "umctl runtime: lost the cluster agent's socket\n");
            _exit(70);
        }
        c += k, n -= (size_t)k;
    }
    return 0;
}

/* The managed allocations now, with their twins (a new one's twin is zeros: fresh UM). */
static void cl_refresh(void)
{
    for (int k = 0; k < cl_ntw; k++)
        cl_tw[k].seen = 0;
    pthread_mutex_lock(&allocs_mu);
    for (size_t i = 0; i < n_allocs; i++) {
        if (!allocs[i].managed)
            continue;
        int k = 0;
        while (k < cl_ntw && cl_tw[k].id != allocs[i].id)
            k++;
        if (k == cl_ntw && cl_ntw < MAX_RO) {
            cl_tw[k].id = allocs[i].id, cl_tw[k].addr = allocs[i].addr, cl_tw[k].n = allocs[i].n;
            cl_tw[k].twin = calloc(1, allocs[i].n);
            cl_ntw++;
        }
        if (k < cl_ntw)
            cl_tw[k].seen = 1;
    }
    pthread_mutex_unlock(&allocs_mu);
    for (int k = cl_ntw - 1; k >= 0; k--)
        if (!cl_tw[k].seen) {   /* freed */
            free(cl_tw[k].twin);
            cl_tw[k] = cl_tw[--cl_ntw];
        }
}

/* Send the pages that differ from their twins (and update the twins). */
static void cl_send_diff(int send)
{
    for (int k = 0; k < cl_ntw; k++) {
        struct cl_twin *t = &cl_tw[k];
        if (!t->twin)
            continue;
        for (size_t off = 0; off < t->n; off += CL_PAGE) {
            size_t len = t->n - off < CL_PAGE ? t->n - off : CL_PAGE;
            unsigned char *cur = (unsigned char *)t->addr + off;
            if (!memcmp(cur, t->twin + off, len))
                continue;
            if (send) {
                unsigned char page[2 * CL_PAGE] = {0};
                memcpy(page, cur, len);
                memcpy(page + CL_PAGE, t->twin + off, len);
                struct cl_rec r = {t->id, t->n, (uint32_t)(off / CL_PAGE), 1};
                cl_io(1, &r, sizeof r);
                cl_io(1, page, sizeof page);
            }
            memcpy(t->twin + off, cur, len);
        }
    }
}

/* Install the agent's pages (into the buffer and its twin). */
static void cl_install(void)
{
    uint32_t count = 0;
    cl_io(0, &count, sizeof count);
    for (uint32_t i = 0; i < count; i++) {
        struct { int64_t id; uint32_t page, pad; } h;
        unsigned char page[CL_PAGE];
        cl_io(0, &h, sizeof h);
        cl_io(0, page, sizeof page);
        for (int k = 0; k < cl_ntw; k++)
            if (cl_tw[k].id == h.id && (size_t)h.page * CL_PAGE < cl_tw[k].n) {
                size_t off = (size_t)h.page * CL_PAGE, len = cl_tw[k].n - off < CL_PAGE ? cl_tw[k].n - off : CL_PAGE;
                memcpy((unsigned char *)cl_tw[k].addr + off, page, len);
                memcpy(cl_tw[k].twin + off, page, len);
            }
    }
}

/* 'B' or 'S': allocations (with this kernel's read-only codes), the host's changes, install. */
static void cl_begin(char type, struct finfo *fi, void **args, unsigned mask)
{
    cl_refresh();
    unsigned char code[MAX_RO] = {0};
    for (int i = 1; args && i < 32; i++) {
        int ptr = fi && fi->nparams > 1 && fi->sizes ? i < fi->nparams && fi->sizes[i] == sizeof(void *) : (mask >> i) & 1;
        if (!ptr || !args[i])
            continue;
        size_t n = 0;
        uintptr_t base = alloc_base(*(void **)args[i], &n);
        for (int k = 0; base && k < cl_ntw; k++)
            if (cl_tw[k].addr == base)
                code[k] = (mask >> i) & 1 && code[k] != 2 ? 1 : 2;
    }
    cl_io(1, &type, 1);
    for (int k = 0; k < cl_ntw; k++) {
        struct cl_rec r = {cl_tw[k].id, cl_tw[k].n, code[k], 0};
        cl_io(1, &r, sizeof r);
    }
    cl_send_diff(cl_node == 0);
    struct cl_rec end = {-1, 0, 0, 2};
    cl_io(1, &end, sizeof end);
    cl_install();
}

static void cl_end(void)
{
    char type = 'E';
    cl_io(1, &type, 1);
    cl_send_diff(1);
    struct cl_rec end = {-1, 0, 0, 2};
    cl_io(1, &end, sizeof end);
    cl_install();
}

/* The host is about to read what the kernels wrote: it waited for the GPU (cudaDeviceSynchronize,
   cudaStreamSynchronize, cudaEventSynchronize: PASS_SYNC / PASS_WAIT below) or copies managed
   data to the host (copy_host_sync). Brings the pages other nodes wrote in the partitioned kernels
   since the last time ('S'), once: further waits before the next partitioned kernel find nothing
   new and cost nothing (an 'S' reads every managed byte on the host to diff it against its twin,
   which on a real GPU migrates every managed page to the host, then faults in every page the node
   lacks, a lock and a page request per 2 MiB block). Nor is there anything to bring before the
   first partitioned kernel, and an 'S' there would be wrong: node 0's copies in may not have
   reached its agent yet, and the agent would hand back zeros over this node's own copies in.
   Not collective: the agent fetches the pages from the nodes holding them, point to point, while
   the other agents serve whatever their programs do, so a wait reached on one rank and not on
   another (SPMD programs that wait differently per rank) is fine. Assumes, as the rest of the
   protocol does, that every node runs the same host code: host writes after the wait are made by
   each node itself; only node 0's reach the agents (at the next 'B' or 'S'). */
static void cl_host_sync(void)
{
    if (tl_internal || cfg_gpus < 2 || !cl_on())
        return;
    pthread_mutex_lock(&part_mu);
    if (cl_behind) {
        cl_begin('S', NULL, NULL, 0);
        cl_behind = 0;
    }
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
    if (!part_ok || d < 0 || d >= part_local ||
        (get_cudaStreamIsCapturing() && (get_cudaStreamIsCapturing()(s, &capturing) != 0 || capturing))) {
        if (get_cudaGetLastError())
            get_cudaGetLastError()();
        atomic_fetch_add(&st_part_fallback, 1);
        return 0;
    }
    const int G = cfg_gpus;
    unsigned dims[3] = {g.x, g.y, g.z};
    int dim = g.z >= (unsigned)G ? 2 : g.y >= (unsigned)G ? 1 : 0;
    pthread_mutex_lock(&part_mu);
    int cluster = cl_on();
    tl_internal++;
    if (cluster && get_cudaStreamSynchronize())
        get_cudaStreamSynchronize()(s);   /* what the program queued before must be in memory for the diff */
    tl_internal--;
    if (cluster)
        cl_begin('B', fi, args, p->ro_mask);
    tl_internal++;
    part_read_only(fi, args, p->ro_mask, d);
    int ok = get_cudaEventRecord()(part_start[d], s) == 0;
    for (int k = part_first; ok && k < part_first + part_local; k++) {
        unsigned lo = slab_edge(dims[dim], k, G), hi = slab_edge(dims[dim], k + 1, G);
        int l = k - part_first;   /* the slab's local GPU */
        if (hi > lo)
            ok = get_cudaSetDevice()(l) == 0 && get_cudaStreamWaitEvent()(part_stream[l], part_start[d], 0) == 0;
    }
    cudaError_t r = 0;
    int launched = 0, done[MAX_DEV] = {0};
    struct umctl_part save = *p;
    for (int k = part_first; ok && k < part_first + part_local; k++) {
        unsigned lo = slab_edge(dims[dim], k, G), hi = slab_edge(dims[dim], k + 1, G);
        int l = k - part_first;
        if (hi <= lo)
            continue;
        unsigned sd[3] = {g.x, g.y, g.z};
        sd[dim] = hi - lo;
        dim3 sg = {sd[0], sd[1], sd[2]};
        p->off[dim] = lo;   /* the runtime copies argument values at the launch call */
        if (get_cudaSetDevice()(l) != 0) {
            ok = launched > 0;
            r = 1;
            break;
        }
        tl_internal--;
        int64_t q = report_launch(f, sg, b, args, smem, part_stream[l]);
        tl_internal++;
        cudaError_t e = get_cudaLaunchKernel()(f, sg, b, args, smem, part_stream[l]);
        if (e != 0) {
            /* nothing launched yet: the original launch instead; else the error is the launch's */
            ok = launched > 0;
            r = e;
            break;
        }
        launched++;
        tl_internal--;
        track_end(q, part_stream[l]);
        tl_internal++;
        done[l] = get_cudaEventRecord()(part_done[l], part_stream[l]) == 0;
        if (!done[l])
            r = 1;
    }
    *p = save;
    get_cudaSetDevice()(d);
    for (int k = 0; k < part_local; k++)
        if (done[k] && get_cudaStreamWaitEvent()(s, part_done[k], 0) != 0)
            r = r ? r : 1;
    if (!ok && get_cudaGetLastError())
        get_cudaGetLastError()();
    for (int k = 0; cluster && k < part_local && get_cudaStreamSynchronize(); k++)
        if (done[k])
            get_cudaStreamSynchronize()(part_stream[k]);   /* the slabs' writes, before the diff */
    tl_internal--;
    if (cluster) {
        cl_end();   /* (a launch that failed here still ends the kernel on every node) */
        cl_behind = 1;
    }
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
    return launch_plain(get_cudaLaunchKernel(), f, g, b, args, smem, s, 0);
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
    launch_exc_t fn = LAZY_SYM(*real, next_sym(name));
    if (!fn)
        return 1;
    hum_barrier();
    cudaError_t pr;   /* launch attributes (clusters, ...) are not carried over to slabs: never split those */
    if (c && !c->numAttrs && part_launch(f, c->gridDim, c->blockDim, args, c->dynamicSmemBytes, c->stream, ptsz, &pr))
        return pr;
    int64_t q = c ? report_launch(f, c->gridDim, c->blockDim, args, c->dynamicSmemBytes, c->stream) : -1;
    tl_rt_launch++;
    cudaError_t r = fn(c, f, args);
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
    fn12 fn = LAZY_SYM(*real, next_sym(name));
    if (!fn)
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
    u64 r = fn(a, b, c, d, e, f, g, h, i, j, k, l);
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
    static launch_plain_t real_ptsz;
    launch_plain_t real = LAZY_SYM(real_ptsz, next_sym("cudaLaunchKernel_ptsz"));
    if (!real)
        return 1;
    return launch_plain(real, f, g, b, args, smem, s, 1);
}

/* Everything else that enqueues work, synchronises or touches memory: barrier, `before`, the real
   call, `after`, arguments passed through unchanged (see the trampolines above for why this is
   exact). */
#define PASS_AROUND(name, before, after)                                                               \
    API u64 name(u64 a, u64 b, u64 c, u64 d, u64 e, u64 f, u64 g, u64 h, u64 i, u64 j, u64 k, u64 l)   \
    {                                                                                                  \
        static fn12 real_fn;                                                                           \
        fn12 real = LAZY_SYM(real_fn, next_sym(#name));                                                \
        if (!real)                                                                                     \
            return 1;                                                                                  \
        hum_barrier();                                                                                 \
        before;                                                                                        \
        u64 r = real(a, b, c, d, e, f, g, h, i, j, k, l);                                              \
        after;                                                                                         \
        return r;                                                                                      \
    }
#define PASS_THEN(name, after) PASS_AROUND(name, (void)0, after)
#define PASS(name) PASS_THEN(name, (void)0)
/* the host waited for the GPU: on a cluster, the node's managed data is made current */
#define PASS_WAIT(name) PASS_THEN(name, cl_host_sync())
/* ... and it waited for the GPU to drain: an iteration boundary for exec_hash's occurrence counts */
#define PASS_SYNC(name) PASS_THEN(name, if (!tl_internal) { occ_reset(); cl_host_sync(); })
/* a copy whose destination, source and cudaMemcpyKind are these arguments: copy_host_sync */
#define PASS_COPY(name, dst, src, kind)                                                                \
    PASS_AROUND(name, copy_host_sync((int)(kind), (const void *)(uintptr_t)(dst),                      \
                                     (const void *)(uintptr_t)(src)), (void)0)
PASS_SYNC(cudaDeviceSynchronize)
PASS_SYNC(cudaStreamSynchronize)
PASS(cudaStreamQuery)
PASS(cudaStreamWaitEvent)
PASS(cudaStreamAddCallback)
PASS(cudaStreamDestroy)
PASS(cudaStreamBeginCapture)
PASS(cudaEventRecord)
PASS(cudaEventRecordWithFlags)
PASS_WAIT(cudaEventSynchronize)
PASS(cudaEventQuery)
PASS(cudaLaunchHostFunc)
PASS(cudaLaunchCooperativeKernel)
PASS(cudaGraphLaunch)
PASS(cudaMemset)
PASS(cudaMemsetAsync)
PASS(cudaMemset2D)
PASS(cudaMemset2DAsync)
PASS_COPY(cudaMemcpy2D, a, c, g)   /* dst, dpitch, src, spitch, width, height, kind */
PASS_COPY(cudaMemcpy2DAsync, a, c, g)
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
PASS_COPY(cudaMemcpy_ptds, a, b, d)   /* dst, src, count, kind */
PASS_COPY(cudaMemcpyAsync_ptsz, a, b, d)
PASS(cudaMemset_ptds)
PASS(cudaMemsetAsync_ptsz)
PASS_SYNC(cudaStreamSynchronize_ptsz)
PASS(cudaStreamQuery_ptsz)
PASS(cudaStreamWaitEvent_ptsz)
PASS(cudaEventRecord_ptsz)
PASS(cudaGraphLaunch_ptsz)
PASS_COPY(cudaMemcpy2D_ptds, a, c, g)
PASS_COPY(cudaMemcpy2DAsync_ptsz, a, c, g)
PASS(cudaMemPrefetchAsync_ptsz)
