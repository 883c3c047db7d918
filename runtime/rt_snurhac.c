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

   With the convention's access information ("UMP2": umctl_part_ranges; what MAPA gives SnuRHAC)
   the runtime also
     - keeps on one GPU (the caller's: the original launch) a kernel with atomics or whose GPUs'
       write ranges overlap by more than UMCTL_RT_OVERLAP (default 0.5) of their total, the
       ratio of umctl.controller.snurhac.hull_overlap_ratio (§6.4, figure 6.4): a banded buffer
       is written in its slab's band, any other written buffer whole by every slab; such a
       kernel's buffers are prefetched whole to that GPU first (part_place_one);
     - places each buffer for the kernel (UMCTL_RT_PLACE, default on), once per role: a buffer
       only read and not banded is duplicated (READ_MOSTLY) and prefetched whole to every GPU;
       a banded buffer gets its band's preferred location on the band's GPU and is mapped on
       every GPU (accessed-by: a halo row is read over NVLink, not migrated to and fro), and each
       band is prefetched to its GPU; the prefetches go on the slab's stream after its wait on
       the caller's stream and before its launch (§6.5.1's static prefetching from the access
       ranges, the band standing in for the thread blocks' affine ranges).
   A buffer that becomes written loses READ_MOSTLY; a buffer changing role gets its new role's
   prefetches (nbody's two position buffers swap roles every step).

   The end of each slab, where kernel ends are tracked (UMCTL_RT_TRACK_END), is tracked on the
   caller's stream after its waits on the slabs, i.e. on the caller's device: the tracker's
   events come from one pool for all devices, an event belongs to the device it was created on,
   and an event of GPU 0 recorded on GPU 3's stream fails with cudaErrorInvalidResourceHandle,
   left as the program's last error (gesummv on 4 H100s: cudaGetLastError() after a launch).

   Across nodes (umctl/cluster, one process of the program a node under mpirun):
   UMCTL_RT_GPUS is the cluster's GPU count, UMCTL_RT_NODE_GPUS=M the GPUs of this node and
   UMCTL_RT_NODE=n its rank; the grid is cut into UMCTL_RT_GPUS slabs exactly as on one host and
   this process launches only slabs n*M .. n*M+M-1, slab n*M+k on its local GPU k. Without
   them, every slab is local (part_first 0, part_local UMCTL_RT_GPUS). */
struct umctl_part { unsigned off[3], grid[3], ro_mask, magic, wr_mask, band_mask, flags; };
#define UMCTL_PART_MAGIC 0x54504d55u
#define UMCTL_PART_MAGIC2 0x32504d55u   /* "UMP2": wr_mask, band_mask and flags follow magic */
#define UMCTL_PART_ATOMICS 1u
static int part_ok;
static int part_first, part_local;   /* this node's first slab and its GPU count */
static cudaStream_t part_stream[MAX_DEV];
static cudaEvent_t part_done[MAX_DEV], part_start[MAX_DEV];
#define MAX_RO 256
static uintptr_t ro_flagged[MAX_RO];
static int n_ro;
static int cfg_place = 1;            /* UMCTL_RT_PLACE */
/* UMCTL_RT_HALO_MAP: where a banded buffer is mapped on the GPUs next to each band (accessed-by),
   so that a slab's reads just past its band's edges go over NVLink instead of faulting:
   2 "window" (default) the 2 MiB-aligned windows of one slab block's share on each side of
   each of its band's inner edges, 1 "whole" the whole buffer on every GPU, 0 "off" none
   (a peer's fault on a page preferred elsewhere is then served by a remote mapping, not a
   migration). */
static int cfg_halo_map = 2;
static double cfg_overlap = 0.5;     /* UMCTL_RT_OVERLAP: §6.4's threshold */
static _Atomic u64 st_ranges, st_one_overlap, st_one_atomics, st_pref, st_accessed, st_pf, st_pf_bytes;
/* host time inside partitioned launches (UMCTL_RT_STATS): the whole interception, the placement
   advice, and the prefetch calls, which the driver serves largely in the calling thread */
static _Atomic u64 st_part_ns, st_place_ns, st_pf_ns;
static double st_overlap_max;        /* under part_mu */

/* cuMemAdvise's advice (CUmem_advise) */
enum { ADV_SET_READ_MOSTLY = 1, ADV_UNSET_READ_MOSTLY = 2, ADV_SET_PREFERRED = 3, ADV_UNSET_PREFERRED = 4,
       ADV_SET_ACCESSED_BY = 5 };


static void part_config(void)
{
    if (getenv("UMCTL_RT_PLACE"))
        cfg_place = env_on("UMCTL_RT_PLACE");
    const char *hm = getenv("UMCTL_RT_HALO_MAP");
    if (hm && *hm)
        cfg_halo_map = !strcmp(hm, "whole") ? 1 : !strcmp(hm, "off") ? 0 : 2;
    const char *v = getenv("UMCTL_RT_OVERLAP");
    if (v && *v) {
        char *end;
        double x = strtod(v, &end);
        if (end != v && !*end && x >= 0)
            cfg_overlap = x;
        else
            fprintf(stderr, "umctl runtime: UMCTL_RT_OVERLAP=%s is not a ratio >= 0: using %.2f\n", v, cfg_overlap);
    }
}

/* Streams, events and peer access on every GPU, once (the program's first cudaMalloc calls
   this, so context creation on the other GPUs happens outside its timed region). */
static void part_setup(void)
{
    part_config();
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

/* Host time in advice calls (UMCTL_RT_STATS): preferred location, accessed-by, read-mostly and
   the rest. The driver applies advice synchronously over every page already resident, so a
   whole-buffer accessed-by on a buffer another GPU holds costs mappings of all of it (gesummv's
   1 GiB matrix, 2 H200s: 185 ms of a 0.7 ms kernel). */
static _Atomic u64 st_adv_ns[4];

static int mem_advise(uintptr_t p, size_t n, int advice, int dev)
{
    pthread_once(&driver_once, load_driver);
    const int64_t t0 = now_ns();
    int r;
    if (cu_advise_v2) {
        cu_mem_location_t loc = {1 /* device */, dev};
        r = cu_advise_v2((u64)p, n, advice, loc);
    } else {
        r = cu_advise ? cu_advise((u64)p, n, advice, dev) : -1;
    }
    int k = advice == ADV_SET_PREFERRED ? 0 : advice == ADV_SET_ACCESSED_BY ? 1
          : (advice == ADV_SET_READ_MOSTLY || advice == ADV_UNSET_READ_MOSTLY) ? 2 : 3;
    atomic_fetch_add(&st_adv_ns[k], (u64)(now_ns() - t0));
    return r;
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
    int rc = mem_advise(base, n, ADV_SET_READ_MOSTLY, dev);
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
        mem_advise(base, n, ADV_UNSET_READ_MOSTLY, dev);
    ro_flagged[k] = ro_flagged[--n_ro];
    atomic_fetch_add(&st_ro_unset, 1);
}

/* §6.4: flag the buffers the kernel only reads, unflag the flagged ones it may write (a pointer
   argument into one of our managed allocations without its ro bit). Which arguments are
   pointers comes from the parameter sizes (cuFuncGetParamInfo), else from the ro_mask alone.
   Called under part_mu. (Kernels with the convention's access information: part_place.) */
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

/* ---------------------------------------------------------------- UMP2: ranges, §6.4, placement */

/* A buffer's role in a kernel (the highest of its parameters'): read whole, in bands (read or
   written), written whole; and, for the placement only, used by a kernel kept on one GPU. */
enum { ROLE_NONE = 0, ROLE_REPLICA = 1, ROLE_BAND = 2, ROLE_SHARED = 3, ROLE_ONE = 4 };
struct kbuf { uintptr_t base; size_t n; int role, written; };

/* The managed buffers a UMP2 launch passes, each once with its role. Pointers are the ro_mask
   and wr_mask parameters, and (parameter sizes known) any other pointer argument into a
   managed allocation, taken as written whole (the conservative reading). */
static int part_buffers(struct finfo *fi, void **args, const struct umctl_part *p, struct kbuf *out)
{
    int nb = 0, known = fi->nparams > 1 && fi->sizes;
    for (int i = 1; i < 32; i++) {
        int marked = ((p->ro_mask | p->wr_mask) >> i) & 1;
        int ptr = marked || (known && i < fi->nparams && fi->sizes[i] == sizeof(void *));
        if (!ptr || (known && i >= fi->nparams) || !args[i])
            continue;
        size_t n = 0;
        uintptr_t base = alloc_base(*(void **)args[i], &n);
        if (!base)
            continue;
        int ro = (p->ro_mask >> i) & 1 && !((p->wr_mask >> i) & 1), band = (p->band_mask >> i) & 1;
        int role = band ? ROLE_BAND : ro && marked ? ROLE_REPLICA : ROLE_SHARED;
        int k = 0;
        while (k < nb && out[k].base != base)
            k++;
        if (k == nb)
            out[nb++] = (struct kbuf){base, n, ROLE_NONE, 0};
        if (role > out[k].role)
            out[k].role = role;
        out[k].written |= !ro || !marked;
    }
    return nb;
}

/* Byte edge of band k of G of a buffer of n bytes along a dimension of `blocks` blocks: the
   slab's share rounded up to a page, so that the bands tile the buffer without overlap. */
static size_t band_edge(size_t n, unsigned blocks, unsigned first_block)
{
    size_t e = (size_t)(((unsigned __int128)n * first_block) / blocks);
    e = (e + 4095) & ~(size_t)4095;
    return e < n ? e : n;
}

/* §6.4, figure 6.4: what of each GPU's write range some other GPU's range also covers, summed
   over the written buffers, over the summed lengths (hull_overlap_ratio in
   umctl/controller/snurhac.py). A banded buffer is written in its slabs' exact shares, any
   other written buffer whole by every slab that has blocks. */
static double part_overlap(const struct kbuf *bufs, int nb, const unsigned *edges, int G)
{
    double total = 0, overlap = 0;
    for (int j = 0; j < nb; j++) {
        if (!bufs[j].written)
            continue;
        u64 lo[MAX_DEV], hi[MAX_DEV];
        int m = 0;
        for (int k = 0; k < G; k++) {
            if (edges[k + 1] <= edges[k])
                continue;
            if (bufs[j].role == ROLE_BAND) {
                lo[m] = (u64)(((unsigned __int128)bufs[j].n * edges[k]) / edges[G]);
                hi[m] = (u64)(((unsigned __int128)bufs[j].n * edges[k + 1]) / edges[G]);
            } else {
                lo[m] = 0, hi[m] = bufs[j].n;
            }
            m++;
        }
        for (int i = 0; i < m; i++) {
            total += (double)(hi[i] - lo[i]);
            /* the union of the others' ranges inside [lo_i, hi_i): sort their clipped starts */
            u64 a[MAX_DEV], b[MAX_DEV];
            int c = 0;
            for (int o = 0; o < m; o++) {
                if (o == i || lo[o] >= hi[i] || hi[o] <= lo[i])
                    continue;
                u64 s = lo[o] > lo[i] ? lo[o] : lo[i], e = hi[o] < hi[i] ? hi[o] : hi[i];
                int at = c++;
                while (at > 0 && a[at - 1] > s)
                    a[at] = a[at - 1], b[at] = b[at - 1], at--;
                a[at] = s, b[at] = e;
            }
            u64 end = lo[i];
            for (int o = 0; o < c; o++) {
                u64 s = a[o] > end ? a[o] : end;
                if (b[o] > s) {
                    overlap += (double)(b[o] - s);
                    end = b[o];
                }
            }
        }
    }
    return total > 0 ? overlap / total : 0.0;
}

/* Placement state of a buffer across launches: its role and the local GPUs that got the role's
   prefetch. Under part_mu. */
#define MAX_PLACE 256
struct place { uintptr_t base; size_t n; int role; unsigned fetched; int banded; };
static struct place places[MAX_PLACE];
static int n_places;

static struct place *place_of(uintptr_t base, size_t n)
{
    for (int k = 0; k < n_places; k++)
        if (places[k].base == base)
            return &places[k];
    if (n_places == MAX_PLACE)
        return NULL;
    places[n_places] = (struct place){base, n, ROLE_NONE, 0, 0};
    return &places[n_places++];
}

/* Accessed-by for the halos of a banded buffer: each local GPU's slab may read one slab
   block's share of bytes past each inner edge of its band (the convention's halo, as the
   cluster path assumes too); those windows, widened to whole 2 MiB blocks, are mapped on it. */
static void halo_map(const struct kbuf *bf, const unsigned *edges, int G)
{
    const size_t blk = (size_t)2 << 20;
    size_t share = (bf->n + edges[G] - 1) / (edges[G] ? edges[G] : 1);
    for (int k2 = part_first; k2 < part_first + part_local; k2++) {
        size_t lo = band_edge(bf->n, edges[G], edges[k2]), hi = band_edge(bf->n, edges[G], edges[k2 + 1]);
        if (hi <= lo)
            continue;   /* no band here (a buffer smaller than the slabs' pages) */
        size_t win[2][2] = {{lo > share ? lo - share : 0, lo}, {hi, hi + share < bf->n ? hi + share : bf->n}};
        for (int w = 0; w < 2; w++) {
            size_t a = win[w][0] & ~(blk - 1), b = (win[w][1] + blk - 1) & ~(blk - 1);
            if (b > bf->n)
                b = bf->n;
            if (w == 0 ? lo == 0 : hi >= bf->n)
                continue;   /* the buffer's own ends have no neighbour */
            if (b > a && mem_advise(bf->base + a, b - a, ADV_SET_ACCESSED_BY, k2 - part_first) == 0)
                atomic_fetch_add(&st_accessed, 1);
        }
    }
}

/* Up to this many prefetches wait for their slab's launch (bands and duplicates of every
   buffer of one kernel on one local GPU). */
#define MAX_PF 32
struct pf { uintptr_t p; size_t n; struct place *pl; };

/* Advice for each buffer's role (changed roles only) and, per local GPU with a slab, the
   prefetches to issue on its stream before its launch (those not issued yet in this role).
   `edges`: the G+1 slab edges. */
static void part_place(struct kbuf *bufs, int nb, const unsigned *edges, int G, int d,
                       struct pf pf[MAX_DEV][MAX_PF], int *npf)
{
    for (int j = 0; j < nb; j++) {
        struct kbuf *bf = &bufs[j];
        struct place *pl = place_of(bf->base, bf->n);
        if (!pl)
            continue;
        if (pl->role != bf->role) {
            int k;
            if (pl->role == ROLE_REPLICA && bf->written && (k = ro_find(bf->base)) < n_ro)
                ro_unset(k, d);   /* written now: a READ_MOSTLY page written bounces between the GPUs */
            pl->fetched = 0;
            pl->role = bf->role;
            if (bf->role == ROLE_REPLICA && cfg_ro && ro_find(bf->base) == n_ro && n_ro < MAX_RO)
                ro_set(bf->base, bf->n, d);
            /* the bands' preferred locations and the mappings hold for any later role (the bands
               of a buffer are the same at every launch): set once. They guide faults only; a
               prefetch (read copies of a READ_MOSTLY buffer, a kernel kept on one GPU) still
               moves or copies pages where it is asked to. */
            if (bf->role == ROLE_BAND && !pl->banded) {
                pl->banded = 1;
                for (int k2 = part_first; k2 < part_first + part_local; k2++) {
                    size_t lo = band_edge(bf->n, edges[G], edges[k2]), hi = band_edge(bf->n, edges[G], edges[k2 + 1]);
                    if (hi > lo && mem_advise(bf->base + lo, hi - lo, ADV_SET_PREFERRED, k2 - part_first) == 0)
                        atomic_fetch_add(&st_pref, 1);
                }
                if (cfg_halo_map == 1) {
                    for (int l = 0; l < part_local; l++)
                        if (mem_advise(bf->base, bf->n, ADV_SET_ACCESSED_BY, l) == 0)
                            atomic_fetch_add(&st_accessed, 1);
                } else if (cfg_halo_map == 2) {
                    halo_map(bf, edges, G);
                }
            }
        }
        for (int k2 = part_first; k2 < part_first + part_local; k2++) {
            int l = k2 - part_first;
            if (edges[k2 + 1] <= edges[k2] || (pl->fetched >> l) & 1 || npf[l] == MAX_PF)
                continue;
            if (bf->role == ROLE_REPLICA && ro_find(bf->base) < n_ro) {
                pf[l][npf[l]++] = (struct pf){bf->base, bf->n, pl};
            } else if (bf->role == ROLE_BAND) {
                size_t lo = band_edge(bf->n, edges[G], edges[k2]), hi = band_edge(bf->n, edges[G], edges[k2 + 1]);
                if (hi > lo)
                    pf[l][npf[l]++] = (struct pf){bf->base + lo, hi - lo, pl};
            }   /* (marked fetched for GPU l once issued on its stream) */
        }
    }
}

/* A kernel kept on one GPU (§6.4): its buffers, which earlier partitioned kernels may have
   left in bands on every GPU (and read there from afar: accessed-by), are prefetched whole to
   the caller's GPU on the caller's stream, before the original launch (covariance's
   covar_kernel reads the matrix its reduce kernel wrote in 4 bands); one it writes loses
   READ_MOSTLY. */
static void part_place_one(struct kbuf *bufs, int nb, int d, cudaStream_t s)
{
    pthread_once(&driver_once, load_driver);
    for (int j = 0; j < nb; j++) {
        struct place *pl = place_of(bufs[j].base, bufs[j].n);
        if (!pl)
            continue;
        if (pl->role != ROLE_ONE) {
            int k;
            if (pl->role == ROLE_REPLICA && (k = ro_find(bufs[j].base)) < n_ro && bufs[j].written)
                ro_unset(k, d);
            pl->role = ROLE_ONE;
            pl->fetched = 0;
        }
        if (!((pl->fetched >> d) & 1) && cu_prefetch && cu_prefetch((u64)bufs[j].base, bufs[j].n, d, s) == 0) {
            pl->fetched = 1u << d;
            atomic_fetch_add(&st_pf, 1);
            atomic_fetch_add(&st_pf_bytes, bufs[j].n);
        }
    }
}

/* A freed allocation loses its flag and its placement (its address may come back as another
   buffer). */
static void part_forget(const void *p)
{
    if (cfg_gpus < 2)
        return;
    pthread_mutex_lock(&part_mu);
    int k = ro_find((uintptr_t)p);
    if (k < n_ro)
        ro_flagged[k] = ro_flagged[--n_ro];
    for (k = 0; k < n_places; k++)
        if (places[k].base == (uintptr_t)p)
            places[k] = places[--n_places];
    pthread_mutex_unlock(&part_mu);
}


/* ---------------------------------------------------------------- SnuRHAC across nodes: the agent

   UMCTL_RT_CLUSTER_FD: a socket to this node's agent (umctl/cluster/live.py, one a rank under
   mpirun), which keeps the UM space coherent across nodes with the other agents. The runtime
   cannot see a GPU's page faults from user space, so it tells the agent what changed by twin and
   diff at the synchronisation points SnuRHAC has anyway:
     before a partitioned launch ('B'): the managed allocations (id, size, and whether this kernel
       only reads (1) or may write (2) each), and the pages the host changed since the last point
       (every node: each runs the same host code on the same data; node 0's changes are
       authoritative, another node's agent applies them to the pages it holds or nobody has
       touched yet, so that a buffer the host copied in need not come from node 0); the agent
       answers with the pages this node lacks, installed here.
       For a kernel with the convention's ranges (UMP2) the runtime also says which bytes this
       node's slabs touch (kind 4, then a kind 3 range per allocation: its band(s) with a block's
       share of halo on each side, or the whole buffer) and the agent brings only those;
     after this node's slabs ('E'): the pages they changed, new and old contents (the agent stores
       only the changed bytes, under the page's lock, so that two nodes writing one page merge);
       the agent answers once the cluster-wide synchronisation after the kernel is done. Buffers
       the kernel marks read-only are not compared (the convention: it only reads them), nor,
       under UMP2, buffers it is not passed;
     where the host waits for the GPU or copies managed data out ('S', cl_host_sync): as 'B',
       so that the host then reads current data.
   Records: {i64 id; u64 size; u32 page; u32 kind}: kind 0 an allocation (page = 0/1/2 above);
   kind 5 a run of `size` changed pages from `page`, followed by their new then their old bytes
   (4 KiB each); kind 6 the same whose old bytes are all zero, followed by the new bytes alone;
   kind 4 (no fields) "bring only the ranges listed"; kind 3 a range of `size`
   pages from `page`; kind 2 the end. Answer: u32 count of runs, then {i64 id; u32 first page;
   u32 pages} + 4 KiB a page. The diffs are taken after synchronising the caller's stream (before)
   and this node's slab streams (after).

   Reading managed memory for the diff: a host load of a GPU-resident managed page faults it to
   the host (a few GB/s, one fault group at a time) and the next kernel faults it back, so every
   compared page would make a round trip at every kernel (the likeliest reason gemm 4096 took 5 s
   over 4 ranks of one H200 host, 69 ms in one process). The diff instead copies the compared bytes with the real cudaMemcpy
   (cudaMemcpyDefault) into a pinned staging buffer, UMCTL_RT_CLUSTER_CHUNK bytes (default 64 MiB;
   less where no diff needs as much) at a time, and compares the stage with the twin: the copy
   engine reads the pages where they are and nothing migrates. Installed pages are written the same way (host to device). Without
   the entry point, with UMCTL_RT_CLUSTER_COPY=0, or after a copy failed, host loads and stores.
   What is compared:
     'E': under UMP2 a banded buffer only in the pages this node's slabs touch (cl_range, what
       'B' scopes): the convention says its slabs write nothing else, and after 'B' every twin
       equals the program's memory, so nothing else can differ; anything else the kernel may
       write whole. A node with no slab of the kernel compares nothing (kernels kept on one GPU
       run on node 0 alone);
     'B' and 'S': every twin whole, on every node. The host's writes into managed memory are
       plain stores the runtime does not see (initialisation on the host, a result read and
       rewritten), so there is no cheaper bound that stays correct: every node must find them to
       send them (and fold them into its twins, or a later 'E' would send them as the kernel's
       changes over newer bytes of other nodes). */
#define CL_PAGE 4096
#define CL_RUN 256   /* pages a run record carries at most */
struct cl_rec { int64_t id; uint64_t size; uint32_t page, kind; };
struct cl_twin { int64_t id; uintptr_t addr; size_t n; unsigned char *twin; int seen; };
static int cl_fd = -1, cl_node;
static int cl_behind;   /* a partitioned kernel ended since this node's data was last made current */
static struct cl_twin cl_tw[MAX_RO];
static int cl_ntw;
static unsigned char *cl_buf;   /* installed pages on their way (2 x CL_RUN pages), under part_mu */
static unsigned char *cl_stage; /* compared bytes copied out of managed memory (cl_stage_n), under part_mu */
static size_t cl_stage_n;       /* its bytes: at most cl_chunk, else what the largest diff needed */
static int cl_stage_pinned;
static size_t cl_chunk = (size_t)64 << 20;   /* UMCTL_RT_CLUSTER_CHUNK, whole pages */
static int cl_copy = 1;         /* UMCTL_RT_CLUSTER_COPY: read and write managed memory with cudaMemcpy */
/* per twin, the pages [cl_lo, cl_hi) the 'E' after this 'B' compares */
static size_t cl_lo[MAX_RO], cl_hi[MAX_RO];
static _Atomic u64 st_cl_compared, st_cl_sent, st_cl_installed;
/* UMCTL_RT_STATS: host time in 'B', 'E' and 'S', of it blocked on the agent's answer, and in the
   cudaMemcpy copies of managed memory (with their bytes: read for the diffs, written by installs;
   host loads and stores are not counted) */
static _Atomic u64 st_cl_ns[3], st_cl_wait_ns, st_cl_copy_ns, st_cl_rd_bytes, st_cl_wr_bytes;

static pthread_once_t cl_once = PTHREAD_ONCE_INIT;
static void cl_config(void)
{
    const char *v = getenv("UMCTL_RT_CLUSTER_FD");
    cl_fd = v && *v ? atoi(v) : -1;
    cl_node = (int)env_size("UMCTL_RT_NODE", 0);
    if (getenv("UMCTL_RT_CLUSTER_COPY"))
        cl_copy = env_on("UMCTL_RT_CLUSTER_COPY");
    size_t c = env_size("UMCTL_RT_CLUSTER_CHUNK", cl_chunk) / CL_PAGE * CL_PAGE;
    cl_chunk = c ? c : CL_PAGE;
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

/* A host buffer of n bytes for copies of managed memory: pinned where the copies go through
   cudaMemcpy (a copy from pageable memory is staged by the driver, at a fraction of the speed;
   portable: any of the node's GPUs copies), else ordinary memory (*pinned says which). Under
   part_mu. */
static unsigned char *cl_host_buf(size_t n, int *pinned)
{
    void *p = NULL;
    if (cl_copy && get_cudaHostAlloc()) {
        tl_internal++;
        if (get_cudaHostAlloc()(&p, n, 1 /* portable */) != 0)
            p = NULL;
        if (!p && get_cudaGetLastError())
            get_cudaGetLastError()();   /* our attempt must not leave an error behind */
        tl_internal--;
    }
    if (pinned)
        *pinned = p != NULL;
    if (!p && !(p = malloc(n))) {
        fprintf(stderr, "umctl runtime: out of memory for the cluster agent's pages\n");
        _exit(70);
    }
    return p;
}

static unsigned char *cl_run_buf(void)
{
    return cl_buf ? cl_buf : (cl_buf = cl_host_buf(2 * CL_RUN * CL_PAGE, NULL));
}

/* The stage for a diff of n bytes: as large as the largest diff so far (at least 1 MiB, doubling
   as it grows), at most cl_chunk. Not cl_chunk from the start: pinning 64 MiB costs milliseconds
   at the first launch (on the critical path of every node), which a program of small buffers
   (binomial's 0.5 MiB) never gets back. */
typedef cudaError_t (*free_host_t)(void *);
static free_host_t real_free_host;
static unsigned char *cl_stage_buf(size_t n)
{
    size_t want = n < cl_chunk ? (n + CL_PAGE - 1) / CL_PAGE * CL_PAGE : cl_chunk;
    if (cl_stage && cl_stage_n >= want)
        return cl_stage;
    if (want < 2 * cl_stage_n)
        want = 2 * cl_stage_n;
    if (want < ((size_t)1 << 20))
        want = (size_t)1 << 20;
    if (want > cl_chunk)
        want = cl_chunk;
    if (cl_stage) {
        free_host_t fh = cl_stage_pinned ? LAZY_SYM(real_free_host, next_sym("cudaFreeHost")) : NULL;
        if (!cl_stage_pinned)
            free(cl_stage);
        else if (fh) {
            tl_internal++;
            fh(cl_stage);
            tl_internal--;
        }   /* (no cudaFreeHost: the small old stage stays allocated) */
    }
    cl_stage = cl_host_buf(want, &cl_stage_pinned);
    cl_stage_n = want;
    return cl_stage;
}

/* n bytes between managed memory and one of our host buffers (`to_managed`: which way), through
   the real cudaMemcpy (the copy engine reads or writes GPU-resident pages in place; synchronous
   here: the staging buffer is pinned, and a copy out of pageable memory into the device is
   waited for below), else host loads and stores. A failing copy makes every later one a host
   access, once said. */
static void cl_move(void *dst, const void *src, size_t n, int to_managed)
{
    if (!n)
        return;
    if (cl_copy && get_cudaMemcpy()) {
        int64_t t0 = now_ns();
        tl_internal++;
        cudaError_t e = get_cudaMemcpy()(dst, src, n, cudaMemcpyDefault);
        if (e != 0 && get_cudaGetLastError())
            get_cudaGetLastError()();
        tl_internal--;
        atomic_fetch_add(&st_cl_copy_ns, (u64)(now_ns() - t0));
        if (e == 0) {
            atomic_fetch_add(to_managed ? &st_cl_wr_bytes : &st_cl_rd_bytes, n);
            return;
        }
        fprintf(stderr, "umctl runtime: cudaMemcpy of managed memory for the cluster agent failed (error %d): "
                        "host loads and stores from now on\n", e);
        cl_copy = 0;
    }
    memcpy(dst, src, n);
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

static const unsigned char cl_zeros[CL_PAGE];

/* One run of changed pages [p0, p0 + np) of twin t, one record: their new bytes (`cur`, the
   stage) then their old ones (the twin), each padded to whole pages; kind 6 and the new bytes
   alone where the old ones are all zero (a fresh allocation's copy-in: half the bytes). */
static void cl_send_run(struct cl_twin *t, size_t p0, size_t np, const unsigned char *cur)
{
    size_t off = p0 * CL_PAGE, len = t->n - off < np * CL_PAGE ? t->n - off : np * CL_PAGE, pad = np * CL_PAGE - len;
    int zero = 1;
    for (size_t o = 0; o < len && zero; o += CL_PAGE)
        zero = !memcmp(t->twin + off + o, cl_zeros, len - o < CL_PAGE ? len - o : CL_PAGE);
    struct cl_rec r = {t->id, np, (uint32_t)p0, zero ? 6 : 5};
    cl_io(1, &r, sizeof r);
    cl_io(1, (void *)cur, len);
    cl_io(1, (void *)cl_zeros, pad);
    if (!zero) {
        cl_io(1, t->twin + off, len);
        cl_io(1, (void *)cl_zeros, pad);
    }
    atomic_fetch_add(&st_cl_sent, np);
}

/* The pages [p0, p1) of twin t that differ from the program's memory: sent as runs (when `send`),
   and the twin updated. The pages come through the stage a chunk at a time; a run ends at a
   chunk's end (a run is any number of consecutive pages to the agent). */
static void cl_diff(struct cl_twin *t, size_t p0, size_t p1, int send)
{
    unsigned char *stage = cl_stage_buf((p1 - p0) * CL_PAGE);
    const size_t per = cl_stage_n / CL_PAGE;
    for (size_t c0 = p0; c0 < p1; c0 += per) {
        size_t c1 = p1 - c0 < per ? p1 : c0 + per;
        size_t off = c0 * CL_PAGE, end = c1 * CL_PAGE < t->n ? c1 * CL_PAGE : t->n;
        cl_move(stage, (unsigned char *)t->addr + off, end - off, 0);
        atomic_fetch_add(&st_cl_compared, c1 - c0);
        size_t run0 = 0, nrun = 0;
        for (size_t pg = c0; pg <= c1; pg++) {
            int changed = 0;
            if (pg < c1) {
                size_t o = pg * CL_PAGE, len = end - o < CL_PAGE ? end - o : CL_PAGE;
                changed = memcmp(stage + (o - off), t->twin + o, len) != 0;
            }
            if (changed && !nrun)
                run0 = pg;
            nrun += changed;
            if ((!changed || nrun == CL_RUN) && nrun) {
                size_t o = run0 * CL_PAGE, len = end - o < nrun * CL_PAGE ? end - o : nrun * CL_PAGE;
                if (send)
                    cl_send_run(t, run0, nrun, stage + (o - off));
                memcpy(t->twin + o, stage + (o - off), len);
                nrun = 0;
            }
        }
    }
}

/* The twins whose `skip` is 0, whole or (`scoped`) in their pages [cl_lo, cl_hi): cl_diff. */
static void cl_send_diff(int send, const unsigned char *skip, int scoped)
{
    for (int k = 0; k < cl_ntw; k++) {
        struct cl_twin *t = &cl_tw[k];
        if (!t->twin || (skip && skip[k]))
            continue;
        size_t pages = (t->n + CL_PAGE - 1) / CL_PAGE;
        size_t p0 = scoped ? cl_lo[k] : 0, p1 = scoped && cl_hi[k] < pages ? cl_hi[k] : pages;
        if (p1 > p0)
            cl_diff(t, p0, p1, send);
    }
}

/* Install the agent's runs of pages (into the buffer and its twin). */
static void cl_install(void)
{
    uint32_t count = 0;
    unsigned char *buf = cl_run_buf();
    int64_t t0 = now_ns();
    cl_io(0, &count, sizeof count);   /* the agent answers once the cluster is where we are */
    atomic_fetch_add(&st_cl_wait_ns, (u64)(now_ns() - t0));
    int copied = 0;
    for (uint32_t i = 0; i < count; i++) {
        struct { int64_t id; uint32_t page, n; } h;
        cl_io(0, &h, sizeof h);
        for (uint32_t done = 0; done < h.n;) {   /* in pieces of at most 2 x CL_RUN pages */
            uint32_t np = h.n - done < 2 * CL_RUN ? h.n - done : 2 * CL_RUN;
            cl_io(0, buf, (size_t)np * CL_PAGE);
            for (int k = 0; k < cl_ntw; k++)
                if (cl_tw[k].id == h.id && (size_t)(h.page + done) * CL_PAGE < cl_tw[k].n) {
                    size_t off = (size_t)(h.page + done) * CL_PAGE;
                    size_t len = cl_tw[k].n - off < (size_t)np * CL_PAGE ? cl_tw[k].n - off : (size_t)np * CL_PAGE;
                    memcpy(cl_tw[k].twin + off, buf, len);
                    cl_move((unsigned char *)cl_tw[k].addr + off, buf, len, 1);
                    copied = 1;
                }
            done += np;
        }
        atomic_fetch_add(&st_cl_installed, h.n);
    }
    /* a copy into the device from pageable memory (no pinned buffer) may return before its DMA
       ends, on the legacy stream, which the slabs' non-blocking streams do not wait for */
    if (copied && cl_copy && get_cudaStreamSynchronize()) {
        int64_t t1 = now_ns();
        tl_internal++;
        get_cudaStreamSynchronize()(NULL);
        tl_internal--;
        atomic_fetch_add(&st_cl_copy_ns, (u64)(now_ns() - t1));
    }
}

/* Per twin, this kernel's use of its allocation: 0 not passed (or not known to be), 1 only
   read, 2 written. UMP2 also gives each one's role (kbuf). */
static void cl_codes(struct finfo *fi, void **args, const struct umctl_part *p, unsigned char *code)
{
    memset(code, 0, MAX_RO);
    if (!args || !p)
        return;
    int v2 = p->magic == UMCTL_PART_MAGIC2;
    for (int i = 1; i < 32; i++) {
        int ptr = v2 ? ((p->ro_mask | p->wr_mask) >> i) & 1
                     : fi && fi->nparams > 1 && fi->sizes ? i < fi->nparams && fi->sizes[i] == sizeof(void *)
                                                          : (p->ro_mask >> i) & 1;
        if (!ptr || !args[i])
            continue;
        int ro = (p->ro_mask >> i) & 1 && !(v2 && (p->wr_mask >> i) & 1);
        size_t n = 0;
        uintptr_t base = alloc_base(*(void **)args[i], &n);
        for (int k = 0; base && k < cl_ntw; k++)
            if (cl_tw[k].addr == base)
                code[k] = ro && code[k] != 2 ? 1 : 2;
    }
}

/* UMP2: the pages of twin k this node's slabs touch: a banded buffer's bands of slabs
   [first, first + local) with a block's share of halo each side, anything else whole. */
static void cl_range(const struct cl_twin *t, int band, const unsigned *edges, int G, size_t *p0, size_t *p1)
{
    size_t pages = (t->n + CL_PAGE - 1) / CL_PAGE;
    *p0 = 0, *p1 = pages;
    if (!band)
        return;
    unsigned lo = edges[part_first], hi = edges[part_first + part_local], D = edges[G];
    if (hi <= lo) {
        *p1 = 0;
        return;
    }
    unsigned a = lo > 0 ? lo - 1 : 0, b = hi < D ? hi + 1 : D;
    size_t bl = (size_t)(((unsigned __int128)t->n * a) / D), bh = (size_t)(((unsigned __int128)t->n * b) / D);
    *p0 = bl / CL_PAGE, *p1 = (bh + CL_PAGE - 1) / CL_PAGE;
    if (*p1 > pages)
        *p1 = pages;
}

/* 'B' or 'S': allocations (with this kernel's read-only codes), the host's changes, what this
   node's slabs touch (UMP2), install. A 'B' also sets the pages its 'E' compares (cl_lo, cl_hi). */
static unsigned char cl_code[MAX_RO];
static void cl_begin(char type, struct finfo *fi, void **args, const struct umctl_part *p, const unsigned *edges)
{
    int64_t t0 = now_ns();
    cl_refresh();
    cl_codes(fi, args, p, cl_code);
    cl_io(1, &type, 1);
    for (int k = 0; k < cl_ntw; k++) {
        struct cl_rec r = {cl_tw[k].id, cl_tw[k].n, cl_code[k], 0};
        cl_io(1, &r, sizeof r);
    }
    cl_send_diff(1, NULL, 0);
    /* no slab of the kernel here (one kept on one GPU runs on node 0 alone): it changes nothing */
    int mine = edges && edges[part_first + part_local] > edges[part_first];
    for (int k = 0; k < cl_ntw; k++)
        cl_lo[k] = 0, cl_hi[k] = mine ? (cl_tw[k].n + CL_PAGE - 1) / CL_PAGE : 0;
    if (p && p->magic == UMCTL_PART_MAGIC2 && edges) {
        struct cl_rec scoped = {-1, 0, 0, 4};
        cl_io(1, &scoped, sizeof scoped);
        for (int k = 0; k < cl_ntw; k++) {
            if (!cl_code[k])
                continue;   /* not passed to this kernel */
            /* banded only if every pointer the kernel gets into it is: one passed whole as well
               may be read and written anywhere */
            int band = 0, whole = 0;
            for (int i = 1; i < 32 && args; i++) {
                size_t n = 0;
                if (!(((p->ro_mask | p->wr_mask) >> i) & 1) || !args[i] ||
                    alloc_base(*(void **)args[i], &n) != cl_tw[k].addr)
                    continue;
                if ((p->band_mask >> i) & 1)
                    band = 1;
                else
                    whole = 1;
            }
            size_t p0, p1;
            cl_range(&cl_tw[k], band && !whole, edges, cfg_gpus, &p0, &p1);
            if (p1 > p0) {
                struct cl_rec r = {cl_tw[k].id, p1 - p0, (uint32_t)p0, 3};
                cl_io(1, &r, sizeof r);
            }
            /* UMP2: the slabs write a banded buffer in their bands only, within what they touch */
            if (mine)
                cl_lo[k] = p0, cl_hi[k] = p1;
        }
    }
    struct cl_rec end = {-1, 0, 0, 2};
    cl_io(1, &end, sizeof end);
    cl_install();
    atomic_fetch_add(&st_cl_ns[type == 'B' ? 0 : 2], (u64)(now_ns() - t0));
}

/* 'E': what this node's slabs changed in the buffers the kernel may write, in the pages its 'B'
   said they may write (cl_lo, cl_hi). */
static void cl_end(const struct umctl_part *p)
{
    int64_t t0 = now_ns();
    unsigned char skip[MAX_RO];
    int v2 = p && p->magic == UMCTL_PART_MAGIC2;
    for (int k = 0; k < cl_ntw; k++)
        skip[k] = cl_code[k] == 1 || (v2 && cl_code[k] == 0);
    char type = 'E';
    cl_io(1, &type, 1);
    cl_send_diff(1, skip, 1);
    struct cl_rec end = {-1, 0, 0, 2};
    cl_io(1, &end, sizeof end);
    cl_install();
    atomic_fetch_add(&st_cl_ns[1], (u64)(now_ns() - t0));
}

/* The host is about to read what the kernels wrote: it waited for the GPU (cudaDeviceSynchronize,
   cudaStreamSynchronize, cudaEventSynchronize: PASS_SYNC / PASS_WAIT below) or copies managed
   data to the host (copy_host_sync). Brings the pages other nodes wrote in the partitioned kernels
   since the last time ('S'), once: further waits before the next partitioned kernel find nothing
   new and cost nothing (an 'S' copies every managed byte out to diff it against its twin, then
   the agent faults in every page the node lacks, a lock and a page request per 2 MiB block). Nor is there anything to bring before the
   first partitioned kernel, and an 'S' there would be wrong: node 0's copies in may not have
   reached its agent yet, and the agent would hand back zeros over this node's own copies in.
   Not collective: the agent fetches the pages from the nodes holding them, point to point, while
   the other agents serve whatever their programs do, so a wait reached on one rank and not on
   another (SPMD programs that wait differently per rank) is fine. Assumes, as the rest of the
   protocol does, that every node runs the same host code: host writes after the wait are made by
   each node itself; only node 0's reach the agents (at the next 'B' or 'S'). */
/* UMCTL_RT_STATS: the partitioning's own line (the runtime's line is rt_interpose.c's) */
__attribute__((destructor)) static void part_fini(void)
{
    if (cfg_stats && cfg_gpus >= 2)
        fprintf(stderr,
                "umctl_rt_snurhac: ranges=%llu single_overlap=%llu single_atomics=%llu overlap_max=%.2f preferred=%llu "
                "accessed_by=%llu prefetches=%llu prefetch_mib=%.1f cluster_pages=%llu,%llu,%llu part_ms=%.1f place_ms=%.1f "
                "prefetch_call_ms=%.1f advise_ms=%.1f,%.1f,%.1f,%.1f cl_ms=%.1f,%.1f,%.1f cl_wait_ms=%.1f cl_copy_ms=%.1f "
                "cl_copy_mib=%.1f,%.1f\n",
                (unsigned long long)st_ranges, (unsigned long long)st_one_overlap, (unsigned long long)st_one_atomics,
                st_overlap_max, (unsigned long long)st_pref, (unsigned long long)st_accessed, (unsigned long long)st_pf,
                st_pf_bytes / 1048576.0, (unsigned long long)st_cl_compared, (unsigned long long)st_cl_sent,
                (unsigned long long)st_cl_installed, st_part_ns / 1e6, st_place_ns / 1e6, st_pf_ns / 1e6,
                st_adv_ns[0] / 1e6, st_adv_ns[1] / 1e6, st_adv_ns[2] / 1e6, st_adv_ns[3] / 1e6, st_cl_ns[0] / 1e6,
                st_cl_ns[1] / 1e6, st_cl_ns[2] / 1e6, st_cl_wait_ns / 1e6, st_cl_copy_ns / 1e6, st_cl_rd_bytes / 1048576.0,
                st_cl_wr_bytes / 1048576.0);
}

static void cl_host_sync(void)
{
    if (tl_internal || cfg_gpus < 2 || !cl_on())
        return;
    pthread_mutex_lock(&part_mu);
    if (cl_behind) {
        cl_begin('S', NULL, NULL, NULL, NULL);
        cl_behind = 0;
    }
    pthread_mutex_unlock(&part_mu);
}

/* First block of slab k of G along a dimension of n blocks (partition()'s edges g*n//G). */
static unsigned slab_edge(unsigned n, int k, int G)
{
    return (unsigned)((u64)n * k / G);
}

typedef cudaError_t (*peek_t)(void);
static peek_t real_peek;

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
    int v2 = p->magic == UMCTL_PART_MAGIC2;
    if ((p->magic != UMCTL_PART_MAGIC && !v2) || p->off[0] || p->off[1] || p->off[2] || p->grid[0] != g.x ||
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
    unsigned edges[MAX_DEV + 1];
    for (int k = 0; k <= G; k++)
        edges[k] = slab_edge(dims[dim], k, G);
    /* whatever the program left as its last error is its own; ours are cleared below */
    peek_t peek = LAZY_SYM(real_peek, next_sym("cudaPeekAtLastError"));
    int had_error = peek ? peek() != 0 : 1;
    const int64_t t_part = now_ns();
    pthread_mutex_lock(&part_mu);
    struct kbuf bufs[32];
    int nb = 0;
    if (v2) {
        /* §6.4: atomics, or write ranges overlapping by more than the threshold: one GPU */
        atomic_fetch_add(&st_ranges, 1);
        nb = part_buffers(fi, args, p, bufs);
        double ratio = part_overlap(bufs, nb, edges, G);
        if (ratio > st_overlap_max)
            st_overlap_max = ratio;
        if ((p->flags & UMCTL_PART_ATOMICS) || ratio > cfg_overlap) {
            atomic_fetch_add((p->flags & UMCTL_PART_ATOMICS) ? &st_one_atomics : &st_one_overlap, 1);
            if (!cl_on()) {
                if (cfg_place) {
                    tl_internal++;
                    part_place_one(bufs, nb, d, s);
                    tl_internal--;
                }
                pthread_mutex_unlock(&part_mu);
                atomic_fetch_add(&st_part_ns, (u64)(now_ns() - t_part));
                return 0;   /* the original launch, on the caller's GPU */
            }
            /* on a cluster every node takes part in the kernel's exchange: the whole grid is
               slab 0 (node 0's first GPU), the other slabs are empty */
            for (int k = 1; k <= G; k++)
                edges[k] = dims[dim];
            nb = 0;
        }
    }
    int cluster = cl_on();
    tl_internal++;
    if (cluster && get_cudaStreamSynchronize())
        get_cudaStreamSynchronize()(s);   /* what the program queued before must be in memory for the diff */
    tl_internal--;
    if (cluster)
        cl_begin('B', fi, args, p, edges);
    tl_internal++;
    static struct pf pf[MAX_DEV][MAX_PF];   /* under part_mu */
    int npf[MAX_DEV] = {0};
    int64_t t_place = now_ns();
    if (v2 && cfg_place)
        part_place(bufs, nb, edges, G, d, pf, npf);
    else
        part_read_only(fi, args, p->ro_mask, d);   /* UMCTL_RT_PLACE=0: READ_MOSTLY alone */
    atomic_fetch_add(&st_place_ns, (u64)(now_ns() - t_place));
    int ok = get_cudaEventRecord()(part_start[d], s) == 0;
    for (int k = part_first; ok && k < part_first + part_local; k++) {
        int l = k - part_first;   /* the slab's local GPU */
        if (edges[k + 1] > edges[k])
            ok = get_cudaSetDevice()(l) == 0 && get_cudaStreamWaitEvent()(part_stream[l], part_start[d], 0) == 0;
    }
    cudaError_t r = 0;
    int launched = 0, done[MAX_DEV] = {0};
    int64_t seq[MAX_DEV];
    unsigned save[3] = {p->off[0], p->off[1], p->off[2]};   /* (a UMPT argument ends at magic) */
    for (int k = part_first; ok && k < part_first + part_local; k++) {
        unsigned lo = edges[k], hi = edges[k + 1];
        int l = k - part_first;
        seq[l] = -1;
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
        /* §6.5.1: this slab's data on its GPU, in stream order before its kernel */
        if (npf[l])
            pthread_once(&driver_once, load_driver);
        int64_t t_pf = now_ns();
        for (int i = 0; i < npf[l] && cu_prefetch; i++)
            if (cu_prefetch((u64)pf[l][i].p, pf[l][i].n, l, part_stream[l]) == 0) {
                pf[l][i].pl->fetched |= 1u << l;
                atomic_fetch_add(&st_pf, 1);
                atomic_fetch_add(&st_pf_bytes, pf[l][i].n);
            }
        atomic_fetch_add(&st_pf_ns, (u64)(now_ns() - t_pf));
        tl_internal--;
        seq[l] = report_launch(f, sg, b, args, smem, part_stream[l]);
        tl_internal++;
        cudaError_t e = get_cudaLaunchKernel()(f, sg, b, args, smem, part_stream[l]);
        if (e != 0) {
            /* nothing launched yet: the original launch instead; else the error is the launch's */
            ok = launched > 0;
            r = e;
            seq[l] = -1;
            break;
        }
        launched++;
        done[l] = get_cudaEventRecord()(part_done[l], part_stream[l]) == 0;
        if (!done[l])
            r = 1;
    }
    p->off[0] = save[0], p->off[1] = save[1], p->off[2] = save[2];
    get_cudaSetDevice()(d);
    for (int k = 0; k < part_local; k++)
        if (done[k] && get_cudaStreamWaitEvent()(s, part_done[k], 0) != 0)
            r = r ? r : 1;
    /* the slabs' ends, tracked on the caller's stream (its device's events: see above) */
    tl_internal--;
    for (int k = 0; ok && k < part_local; k++)
        if (done[k] && seq[k] >= 0)
            track_end(seq[k], s);
    tl_internal++;
    if ((!ok || (r == 0 && !had_error)) && get_cudaGetLastError())
        get_cudaGetLastError()();   /* nothing of ours is left as the program's last error */
    for (int k = 0; cluster && k < part_local && get_cudaStreamSynchronize(); k++)
        if (done[k])
            get_cudaStreamSynchronize()(part_stream[k]);   /* the slabs' writes, before the diff */
    tl_internal--;
    if (cluster) {
        cl_end(p);   /* (a launch that failed here still ends the kernel on every node) */
        cl_behind = 1;
    }
    pthread_mutex_unlock(&part_mu);
    atomic_fetch_add(&st_part_ns, (u64)(now_ns() - t_part));
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
        after_launch(q, s);
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
        after_launch(q, c->stream);
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
        after_launch(q, (cudaStream_t)(uintptr_t)h);
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
