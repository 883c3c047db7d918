/*
 * umctl simulator core: the per-access fault path of the UVM model.
 *
 * Why C: a replay walks every page access of a workload and services ~40-60 faults per
 * batch; doing that with numpy costs dozens of small calls per batch (~130 K faults/s).
 * Here it is one pass over the access stream. Everything else (commands, host work,
 * copies, event building, controllers) stays in Python (umctl/sim/engine.py), which owns
 * all state arrays and hands their pointers to this code through SimState.
 *
 * The model is documented in engine.py; the constants in calibration.py.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PPB 512           /* pages per 2 MiB block */
#define PB_SHIFT 9
#define PAGE 4096.0
#define MAXB 1024         /* most faults in one batch we support */
/* A set of GPUs, one bit each (a page's valid copies, its remote mappings). This file is built
 * twice (umctl/sim/core.py picks one by GPU count): 8-bit masks, and MASK_BITS=32 for up to 32
 * GPUs (the thesis's 8 nodes x 4; _simcore_wide.c). The access walk reads a mask per page, so
 * the narrow build keeps replays of up to 8 GPUs as fast as before. */
#ifndef MASK_BITS
#define MASK_BITS 8
#endif
#if MASK_BITS == 8
typedef uint8_t mask_t;
#elif MASK_BITS == 32
typedef uint32_t mask_t;
#else
#error "MASK_BITS must be 8 or 32"
#endif
#define MAX_GPUS MASK_BITS
#define MBIT(g) ((mask_t)1 << (g))

typedef struct {
    int64_t npg, nbl, ngpu, max_pending, max_active;
    mask_t *gmask;                 /* npg: bit g, a valid copy on GPU g */
    uint8_t *cpu_valid, *managed, *pf_tag;
    int32_t *pf_entry;
    double *entry_done;
    uint8_t *read_mostly;
    int64_t any_read_mostly;
    uint8_t *has_chunk, *pinned;   /* ngpu x nbl */
    double *lru;                   /* ngpu x nbl: last migration into the block */
    double *evict_key;             /* ngpu x nbl or NULL: replay-only victim order (oracle) */
    int32_t *rescount;             /* ngpu x nbl */
    int64_t *used, *cap;           /* ngpu */
    int64_t *maxblocks;            /* ngpu: chunks not pinned by device memory */
    double *pending;               /* ngpu x max_pending: chunks being written back */
    int64_t *npending;
    int64_t *active;               /* ngpu x max_active: in-flight host->GPU entries */
    int64_t *nactive;
    double *h2d_tail, *d2h_tail;   /* ngpu */
    /* bandwidths in bytes per ns (the clock is in ns) */
    double batch_ns, fault_ns, fault_h2d_Bpns, nvlink_Bpns, d2h_Bpns, evict_chunk_ns;
    double density_threshold, window_jitter, transfer_latency_ns;
    double prefetch_Bpns, hbm_Bpns;
    int64_t n_entries, max_entries;  /* transfer entries used / allocated (entry 0: none) */
    int64_t window_pages, batch_max;
    uint64_t rng;
    int64_t *stats;
    uint8_t *seen;                 /* npg scratch, all zero between calls */
    /* HUVM (memHarvester, ATC'22) driver features. All zero / -1 on the stock driver, where
     * none of the code below changes anything. */
    uint8_t *harvested;            /* ngpu x nbl: the chunk holds another GPU's evicted data */
    double *removable_at;          /* ngpu x nbl: when its background write-back to the host ends */
    int64_t *spill_mask;           /* ngpu: neighbours g evicts into on the fault path (bits) */
    int64_t *spill_rr;             /* ngpu: round-robin cursor over spill_mask */
    int64_t *fetch_via;            /* ngpu: neighbour whose PCIe lane fetches part of each fault
                                    * batch in parallel (-1: none) */
    double *wb_Bpns;               /* ngpu: rate of g's write-backs to the host (0: d2h_Bpns) */
    double *p2p_tail;              /* ngpu: NVLink queue of prefetches into g */
    int64_t *nlent;                /* ngpu: chunks of g holding harvested data */
    int64_t *lend_cap;             /* ngpu: most chunks g lends (-1: any free chunk) */
    /* the driver services a batch block by block (lock, make resident, copy push, map): each
     * distinct 2 MiB block after the first costs this much more */
    double block_ns;
    /* why each page is not on the GPU that faults on it (GONE_*: the last way it left a GPU),
     * and the reason the next drop records; the engine sets it around its own drops */
    uint8_t *gone;
    int64_t drop_reason;
    /* LRU victim order as a tournament tree per GPU (ngpu x 2*lru_leaves; node 1 the root,
     * leaf lru_leaves + b; each node the block of least lru below it, the lower block on a tie,
     * -1: none), kept by lru_fix wherever has_chunk or lru changes; NULL: scan every block.
     * With lru_check, every tree answer is compared with the scan and differences counted. */
    int32_t *lru_tree;
    int64_t lru_leaves, lru_check, lru_mismatch;
    /* thrashing detection and throttling (nvidia-uvm's uvm_perf_thrashing.c): per-block state
     * the core allocates (sim_thr_init / sim_thr_free); thr_threshold 0 switches it off */
    void *thr;
    int64_t thr_threshold, thr_max_resets;
    double thr_lapse_ns, thr_nap_ns, thr_epoch_ns;
    /* 0: a prefetch into a full GPU is dropped instead of evicting (calibration.prefetch_evicts) */
    int64_t prefetch_evicts;
    /* pinning of thrashing pages: after thr_pin_threshold throttles (0: never) a page is pinned
     * on the host for thr_pin_ns and the GPUs map it remotely (bit g of remote[p]), reading it
     * over the link (remote_ns per access) without faults */
    int64_t thr_pin_threshold, any_remote;
    double thr_pin_ns, remote_ns;
    mask_t *remote;
    /* Nodes (a cluster: SnuRHAC's, thesis ch. 6). NULL node: one host, none of this applies.
     * GPU g sits on node node[g]; node_mask[g] holds the GPUs of its node. The host copy of a
     * page is in node 0's memory (the program's process). Crossing nodes costs the network leg at
     * net_host_Bpns[g] (node 0's memory to g's node) or net_peer_Bpns (a GPU of another node;
     * both with the link's share already taken out), and the protocol's round trips of
     * net_latency_ns each way; desc_node[b] is the node holding block b's descriptor. */
    int64_t *node;
    mask_t *node_mask;
    double *net_host_Bpns;
    double net_peer_Bpns, net_latency_ns;
    int32_t *desc_node;
    /* calibration.fault_granularity_pages: a fault migrates at least the aligned group of
     * this many pages around it (nvidia-uvm's grow_fault_granularity: the GPU's 64 KiB big
     * page, 16 pages, unless a page of it is thrashing); 1: page by page */
    int64_t fault_gran;
    /* calibration.eviction_refresh == "access": a kernel's accesses refresh the eviction
     * stamp (lru) of every block it touches that holds a chunk, as of the kernel's start: a
     * true LRU. 0 (the driver): only migrations into a block refresh it. */
    int64_t lru_on_access;
    /* Write-backs are awaited, as the driver's block tracker orders copies. wb_busy[g, b]: when
     * the copies out of the chunk block b holds on GPU g end (0: none pending); every way of
     * freeing or reusing that chunk (eviction, pre-eviction, a read-mostly collapse, a discard)
     * makes it available no earlier. host_ready[p]: when the latest queued write-back of page p
     * reaches the host (0: none); every copy of p out of the host (a fault batch, a prefetch, a
     * remote mapping) starts no earlier. Fault-path evictions write back inside the batch (its
     * stall), before anything later runs on that GPU, so they set neither. */
    double *wb_busy;               /* ngpu x nbl */
    double *host_ready;            /* npg */
} SimState;

/* Why a page left (or was never on) a GPU; a fault on it is charged to ST_FC0 + this. */
enum { GONE_COLD, GONE_EVICTED, GONE_EVICTED_FOR_PF, GONE_PREEVICTED, GONE_DISCARDED, GONE_MOVED, GONE_HOST };

/* The harvested flag of (g, b), keeping g's count of lent chunks. */
static void set_harvested(SimState *s, int g, int64_t b, uint8_t on) {
    uint8_t *h = &s->harvested[(int64_t)g * s->nbl + b];
    if (*h == on) return;
    *h = on;
    s->nlent[g] += on ? 1 : -1;
}

enum {
    ST_FAULTS, ST_BATCHES, ST_BYTES_H2D, ST_BYTES_D2H, ST_BYTES_P2P, ST_DEMAND, ST_DRIVER_PF,
    ST_EVICTIONS, ST_EVICTED_BYTES, ST_PREEVICTIONS, ST_PREEVICTED_BYTES, ST_PF_USED,
    ST_PF_WASTED, ST_EPOCH, ST_BATCH_ID, ST_USER_PF_BYTES, ST_PF_PAGES,
    ST_RECLAIMS, ST_SPILLS, ST_HARVEST_WB, ST_HARVEST_DROPS, ST_THRASHING, ST_THROTTLES, ST_PINS,
    ST_REMOTE_ACCESSES, ST_NET_BYTES, ST_NET_MSGS,
    /* faults by cause: the GONE_* reasons in order, then the page was on the GPU but not
     * usable yet (a controller's prefetch in flight; another transfer in flight; a write to
     * a read-duplicated page) */
    ST_FC0, ST_FC_LATE = ST_FC0 + GONE_HOST + 1, ST_FC_INFLIGHT, ST_FC_RM_WRITE, ST_N
};

/* Events of the batches serviced since the caller last emptied it (one "drain"). */
#define OUT_F 65536
#define OUT_B 4096
#define OUT_E 4096
#define OUT_M 8192
typedef struct {
    int64_t collect;               /* 0: count only; 1: record events */
    int64_t nf, nb, ne, nm;
    int64_t f_page[OUT_F];
    uint8_t f_write[OUT_F];
    int64_t f_batch[OUT_F];        /* index into the b_ arrays */
    int64_t b_id[OUT_B], b_nf[OUT_B];
    double b_t[OUT_B], b_end[OUT_B];
    int64_t e_block[OUT_E], e_written[OUT_E];
    double e_t[OUT_E];
    int64_t m_batch[OUT_M], m_block[OUT_M], m_bytes[OUT_M], m_pf_bytes[OUT_M];
} EventOut;

static inline double rng_unit(SimState *s) {
    /* splitmix64: tiny, and the same sequence on every platform */
    uint64_t z = (s->rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

#define GB(s, g, b) ((int64_t)(g) * (s)->nbl + (b))

/* ------------------------------------------------------------------ chunks */

static void sim_reclaim(SimState *s, int g, double t) {
    double *p = s->pending + (int64_t)g * s->max_pending;
    int64_t n = s->npending[g], k = 0;
    for (int64_t i = 0; i < n; i++) {
        if (p[i] <= t) s->used[g]--;
        else p[k++] = p[i];
    }
    s->npending[g] = k;
}

/* earliest pending free, removed; returns -1 if none */
static double pop_pending(SimState *s, int g) {
    double *p = s->pending + (int64_t)g * s->max_pending;
    int64_t n = s->npending[g];
    if (n == 0) return -1.0;
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++) if (p[i] < p[best]) best = i;
    double v = p[best];
    p[best] = p[n - 1];
    s->npending[g] = n - 1;
    return v;
}

static double min_pending(SimState *s, int g) {
    double *p = s->pending + (int64_t)g * s->max_pending;
    double m = INFINITY;
    for (int64_t i = 0; i < s->npending[g]; i++) if (p[i] < m) m = p[i];
    return m;
}

/* ------------------------------------------------------------------ LRU order
 * The driver evicts the least recently migrated-into root chunk; a scan of every block per
 * eviction made a full-scale replay (40 K blocks, tens of thousands of evictions) spend most
 * of its time here. The tree gives the same block (least lru, lowest block on a tie). */

static inline int32_t lru_min(const double *key, int32_t a, int32_t b) {   /* a: the left one */
    if (a < 0) return b;
    if (b < 0) return a;
    return key[b] < key[a] ? b : a;
}

static inline int32_t lru_leaf(SimState *s, int g, int64_t b) {
    int64_t ix = GB(s, g, b);
    return s->has_chunk[ix] && !s->pinned[ix] && s->lru[ix] < INFINITY ? (int32_t)b : -1;
}

static void lru_set_leaf(SimState *s, int g, int64_t b, int32_t v) {
    int64_t L = s->lru_leaves, i = L + b;
    int32_t *t = s->lru_tree + (int64_t)g * 2 * L;
    const double *key = s->lru + GB(s, g, 0);
    t[i] = v;
    for (i >>= 1; i >= 1; i >>= 1) t[i] = lru_min(key, t[2 * i], t[2 * i + 1]);
}

/* has_chunk, pinned or lru of (g, b) changed. */
void sim_lru_fix(SimState *s, int g, int64_t b) {
    if (s->lru_tree) lru_set_leaf(s, g, b, lru_leaf(s, g, b));
}

/* Build every GPU's tree from has_chunk, pinned and lru. */
void sim_lru_build(SimState *s) {
    int64_t L = s->lru_leaves;
    for (int g = 0; g < s->ngpu; g++) {
        int32_t *t = s->lru_tree + (int64_t)g * 2 * L;
        const double *key = s->lru + GB(s, g, 0);
        for (int64_t b = 0; b < L; b++) t[L + b] = b < s->nbl ? lru_leaf(s, g, b) : -1;
        for (int64_t i = L - 1; i >= 1; i--) t[i] = lru_min(key, t[2 * i], t[2 * i + 1]);
    }
}

static inline void set_chunk(SimState *s, int g, int64_t b, uint8_t on) {
    s->has_chunk[GB(s, g, b)] = on;
    sim_lru_fix(s, g, b);
}

static inline void set_lru(SimState *s, int g, int64_t b, double t) {
    s->lru[GB(s, g, b)] = t;
    sim_lru_fix(s, g, b);
}

/* When the chunk block b holds on g is free of copies out of it, at `t` or later; it leaves
 * the block (the wait goes with the chunk). */
static inline double chunk_free_at(SimState *s, int g, int64_t b, double t) {
    int64_t ix = GB(s, g, b);
    double busy = s->wb_busy[ix];
    s->wb_busy[ix] = 0;
    return busy > 0 && busy > t ? busy : t;
}

/* A chunk leaves block b on GPU g; it is free at `done` (<0: now), and not before the copies
 * out of it end (wb_busy): until then it is pending, as an evicted chunk being written back. */
void sim_release_chunk(SimState *s, int g, int64_t b, double done) {
    done = chunk_free_at(s, g, b, done);
    set_chunk(s, g, b, 0);
    set_harvested(s, g, b, 0);
    if (done < 0) {
        s->used[g]--;
    } else {
        s->pending[(int64_t)g * s->max_pending + s->npending[g]++] = done;
    }
}

/* Least recently migrated-into block holding a chunk on g, not pinned, not excluded (or
 * the smallest evict_key when a replay-only controller supplies one). */
static int64_t lru_scan(SimState *s, int g, const int64_t *exclude, int64_t nex) {
    const uint8_t *hc = s->has_chunk + GB(s, g, 0), *pin = s->pinned + GB(s, g, 0);
    const double *lru = (s->evict_key ? s->evict_key : s->lru) + GB(s, g, 0);
    int64_t best = -1;
    double bl = INFINITY;
    for (int64_t b = 0; b < s->nbl; b++) {
        if (!hc[b] || pin[b] || lru[b] >= bl) continue;
        int skip = 0;
        for (int64_t i = 0; i < nex; i++) if (exclude[i] == b) { skip = 1; break; }
        if (skip) continue;
        best = b;
        bl = lru[b];
    }
    return best;
}

static int64_t sim_lru_victim(SimState *s, int g, const int64_t *exclude, int64_t nex) {
    if (s->evict_key || !s->lru_tree) return lru_scan(s, g, exclude, nex);
    static int64_t out[MAXB + 1];
    int64_t nout = 0, best;
    const int32_t *root = s->lru_tree + (int64_t)g * 2 * s->lru_leaves + 1;
    for (;;) {   /* the least one not excluded: take excluded ones out while looking */
        best = *root;
        int skip = 0;
        for (int64_t i = 0; best >= 0 && i < nex; i++) if (exclude[i] == best) { skip = 1; break; }
        if (!skip) break;
        lru_set_leaf(s, g, best, -1);
        out[nout++] = best;
    }
    for (int64_t i = 0; i < nout; i++) sim_lru_fix(s, g, out[i]);
    if (s->lru_check && lru_scan(s, g, exclude, nex) != best) s->lru_mismatch++;
    return best;
}

/* Drop GPU g's copy of pages [lo, hi) (inside one block); returns pages written back to the
 * host. With `discard` nothing is written back (the caller moves the data elsewhere or
 * drops it). The chunk itself is released by the caller when no page is left on it. */
int64_t sim_drop_range(SimState *s, int g, int64_t lo, int64_t hi, int discard) {
    mask_t bit = MBIT(g);
    int64_t written = 0, on = 0;
    for (int64_t p = lo; p < hi; p++) {
        mask_t m = s->gmask[p];
        if (!(m & bit)) continue;
        on++;
        if (!discard && !s->cpu_valid[p] && !(m & (mask_t)~bit)) {
            s->cpu_valid[p] = 1;   /* the only copy: write it back */
            written++;
        }
        s->gmask[p] = m & (mask_t)~bit;
        s->gone[p] = (uint8_t)s->drop_reason;
        if (s->pf_tag[p]) {
            s->pf_tag[p] = 0;
            s->stats[ST_PF_WASTED]++;
        }
        s->pf_entry[p] = 0;
    }
    int64_t ix = GB(s, g, lo >> PB_SHIFT);
    s->rescount[ix] -= (int32_t)on;
    if (s->rescount[ix] < 0) s->rescount[ix] = 0;
    if (on) s->stats[ST_EPOCH]++;
    return written;
}

static int64_t sim_drop_block(SimState *s, int g, int64_t b, int discard) {
    return sim_drop_range(s, g, b * PPB, (b + 1) * PPB, discard);
}

/* Pages of [lo, hi) whose only copy is on g: what dropping them writes back. */
static int64_t dirty_pages(SimState *s, int g, int64_t lo, int64_t hi) {
    mask_t bit = MBIT(g);
    int64_t n = 0;
    for (int64_t p = lo; p < hi; p++) {
        mask_t m = s->gmask[p];
        n += (m & bit) && !s->cpu_valid[p] && !(m & (mask_t)~bit);
    }
    return n;
}

/* Drop g's copy of block b, writing back its dirty pages on a queue that ends at `done`: those
 * pages are on the host from then on (host_ready). */
static int64_t drop_block_queued(SimState *s, int g, int64_t b, double done) {
    mask_t bit = MBIT(g);
    for (int64_t p = b * PPB; p < (b + 1) * PPB; p++) {
        mask_t m = s->gmask[p];
        if ((m & bit) && !s->cpu_valid[p] && !(m & (mask_t)~bit)) s->host_ready[p] = done;
    }
    return sim_drop_block(s, g, b, 0);
}

/* ------------------------------------------------------------------ harvested memory (HUVM) */

static inline double wb_rate(SimState *s, int g) { return s->wb_Bpns[g] > 0 ? s->wb_Bpns[g] : s->d2h_Bpns; }

/* ------------------------------------------------------------------ nodes */

/* The network leg of `pages` pages between node 0's host memory and GPU g: 0 on node 0. */
double sim_host_net_ns(SimState *s, int g, int64_t pages) {
    if (!s->node || s->node[g] == 0 || pages <= 0) return 0.0;
    s->stats[ST_NET_BYTES] += pages * 4096;
    return (double)pages * PAGE / s->net_host_Bpns[g];
}

/* Blocks among blocks[0..nb) whose descriptor another node than g's holds. */
static int64_t desc_remote(SimState *s, int g, const int64_t *blocks, int64_t nb) {
    if (!s->node || !s->desc_node) return 0;
    int64_t n = 0;
    for (int64_t i = 0; i < nb; i++) n += s->desc_node[blocks[i]] != s->node[g];
    return n;
}

/* SnuRHAC's fault protocol (§6.3) for blocks serviced together: a block whose descriptor is on
 * another node costs a round trip for its lock and one for the faulted-page list (the owner
 * answers with the page owners); a block with pages on another node one more for the page
 * request (the pages' own transfer is counted apart); the unlock is not waited for. Blocks are
 * serviced in a pipeline, so the round trips are waited for once; messages are counted per
 * block. Returns the wait. */
static double net_protocol(SimState *s, int64_t n_desc, int64_t n_src) {
    if (!n_desc && !n_src) return 0.0;
    s->stats[ST_NET_MSGS] += 5 * n_desc + 2 * n_src;
    return 2.0 * s->net_latency_ns * ((n_desc ? 2 : 0) + (n_src ? 1 : 0));
}

/* Where GPU g gets page p (not valid on g; others: the GPUs holding it) across nodes: 0 from
 * where the one-host model says (the host copy, or a GPU of g's node), 1 from node 0's host
 * memory over the network, 2 from a GPU of another node. A copy on a GPU of g's own node is
 * nearer than node 0's memory for a GPU of another node. *from_cpu is updated. */
static inline int net_source(SimState *s, int g, int64_t p, mask_t others, int *from_cpu) {
    if (!s->node) return 0;
    int away = s->node[g] != 0;
    if ((others & s->node_mask[g]) && (away || !*from_cpu)) { *from_cpu = 0; return 0; }
    if (*from_cpu) return away;
    return others ? 2 : 0;
}

/* Does any GPU in `gpus` hold block b as a harvested (lent) chunk? */
static inline int harvested_on(SimState *s, mask_t gpus, int64_t b) {
    for (int h = 0; gpus; h++, gpus >>= 1)
        if ((gpus & 1) && s->harvested[GB(s, h, b)]) return 1;
    return 0;
}

/* The harvested chunk on h to give up first: removable ones (written back by t) before the
 * others, earliest placed first (memHarvester reclaims "the pages that come first"). */
static int64_t harvest_victim(SimState *s, int h, double t) {
    if (!s->nlent[h]) return -1;   /* h holds no harvested chunk (always, on the stock driver) */
    const uint8_t *hv = s->harvested + GB(s, h, 0);
    const double *lru = s->lru + GB(s, h, 0), *rm = s->removable_at + GB(s, h, 0);
    int64_t best = -1;
    int best_rm = 0;
    for (int64_t b = 0; b < s->nbl; b++) {
        if (!hv[b]) continue;
        int r = rm[b] <= t;
        if (best < 0 || r > best_rm || (r == best_rm && lru[b] < lru[best])) { best = b; best_rm = r; }
    }
    return best;
}

/* Drop harvested chunk v from h at t: its data is (or is being) written back by the
 * background thread, so nothing is copied here; returns when the chunk is free (after the
 * write-back if it has not finished). Pages still dirty (none, unless the write-back was never
 * scheduled) are written back on h's lane. */
static double harvest_drop(SimState *s, int h, int64_t v, double t) {
    int64_t ix = GB(s, h, v);
    double rm = s->removable_at[ix];   /* INFINITY: no write-back scheduled, write back now */
    double ready = rm > t && rm < INFINITY ? rm : t;
    int64_t w = dirty_pages(s, h, v * PPB, (v + 1) * PPB);
    if (w) {
        double st = ready > s->d2h_tail[h] ? ready : s->d2h_tail[h];
        ready = st + s->transfer_latency_ns + (double)w * PAGE / wb_rate(s, h);
        s->d2h_tail[h] = ready;
        s->stats[ST_BYTES_D2H] += w * 4096;
    }
    drop_block_queued(s, h, v, ready);
    ready = chunk_free_at(s, h, v, ready);
    set_chunk(s, h, v, 0);
    set_harvested(s, h, v, 0);
    s->stats[ST_HARVEST_DROPS]++;
    return ready;
}

/* A chunk of neighbour h's spare memory for block b of another GPU: a free chunk, else the
 * first removable harvested chunk there (the victim cache replaces its own entries). Never
 * one of h's own chunks, never a wait for a write-back. Returns when it is usable, or -1 if
 * h lends nothing now. */
/* May h lend one more free chunk? A lender lends free chunks only up to its cap (the memory
 * its own job will not use); beyond that the victim cache replaces its own entries. */
static int lends_free_chunk(SimState *s, int h) {
    return (s->lend_cap[h] < 0 || s->nlent[h] < s->lend_cap[h]) && s->cap[h] - s->used[h] > 0;
}

double sim_take_spare(SimState *s, int h, int64_t b, double t) {
    sim_reclaim(s, h, t);
    double ready = t;
    if (lends_free_chunk(s, h)) {
        s->used[h]++;
    } else {
        int64_t v = harvest_victim(s, h, t);
        if (v < 0 || s->removable_at[GB(s, h, v)] > t) return -1.0;
        ready = harvest_drop(s, h, v, t);
    }
    s->wb_busy[GB(s, h, b)] = ready > t ? ready : 0;   /* copies out of the chunk still running */
    set_chunk(s, h, b, 1);
    set_harvested(s, h, b, 1);
    s->removable_at[GB(s, h, b)] = INFINITY;
    return ready;
}

/* Pages of block b just placed on h as harvested data (arriving at `arrive`): if h runs the
 * background write-back (wb_Bpns[h] > 0), it writes the dirty ones back to the host on h's PCIe lane; the chunk is removable (may
 * be dropped without a copy) when that ends. The host copy counts as valid from now on: the
 * owner fetches from h over NVLink while h holds it, and reclaim waits for removable_at. */
void sim_harvest_writeback(SimState *s, int h, int64_t b, double arrive) {
    int64_t lo = b * PPB, dirty = 0, ix = GB(s, h, b);
    mask_t bit = MBIT(h);
    for (int64_t p = lo; p < lo + PPB; p++)
        if ((s->gmask[p] & bit) && !s->cpu_valid[p]) dirty++;
    if (!dirty) { s->removable_at[ix] = arrive; return; }
    if (s->wb_Bpns[h] <= 0) return;   /* no background write-back on this lender */
    double st = arrive > s->d2h_tail[h] ? arrive : s->d2h_tail[h];
    double done = st + s->transfer_latency_ns + (double)dirty * PAGE / s->wb_Bpns[h];
    for (int64_t p = lo; p < lo + PPB; p++) {
        if (!(s->gmask[p] & bit)) continue;
        if (!s->cpu_valid[p]) s->host_ready[p] = done;   /* on the host once the write-back lands */
        s->cpu_valid[p] = 1;
    }
    s->d2h_tail[h] = done;
    s->removable_at[ix] = done;
    s->stats[ST_HARVEST_WB] += dirty * 4096;
    s->stats[ST_BYTES_D2H] += dirty * 4096;
}

/* Move g's chunk v into neighbour h's spare memory over NVLink, starting at t. Returns the
 * time the copy ends (g's chunk is free then), or -1 if h lends nothing now. */
static double spill_block(SimState *s, int g, int h, int64_t v, double t) {
    double ready = sim_take_spare(s, h, v, t);
    if (ready < 0) return -1.0;
    mask_t hbit = MBIT(h), bit = MBIT(g);
    int64_t lo = v * PPB, moved = 0;
    for (int64_t p = lo; p < lo + PPB; p++) {
        if (!(s->gmask[p] & bit) || (s->gmask[p] & hbit)) continue;
        s->gmask[p] |= hbit;
        s->pf_entry[p] = 0;
        moved++;
    }
    s->rescount[GB(s, h, v)] += (int32_t)moved;
    int64_t why = s->drop_reason;
    s->drop_reason = GONE_MOVED;
    sim_drop_block(s, g, v, 1);
    s->drop_reason = why;
    double done = ready + (double)moved * PAGE / s->nvlink_Bpns;
    set_lru(s, h, v, done);
    s->stats[ST_BYTES_P2P] += moved * 4096;
    s->stats[ST_SPILLS]++;
    sim_harvest_writeback(s, h, v, done);
    return done;
}

/* Next neighbour in g's round robin that lends a chunk now, or -1. */
static int spill_target(SimState *s, int g, double t) {
    int64_t mask = s->spill_mask[g];
    if (!mask) return -1;
    for (int k = 1; k <= s->ngpu; k++) {
        int h = (int)((s->spill_rr[g] + k) % s->ngpu);
        if (!(mask & (1ll << h)) || h == g) continue;
        sim_reclaim(s, h, t);
        /* the same test sim_take_spare makes: a target that then refused would leave the
         * spilled block's pages on g without a chunk */
        int free_ok = lends_free_chunk(s, h);
        int64_t v = free_ok ? -1 : harvest_victim(s, h, t);
        if (free_ok || (v >= 0 && s->removable_at[GB(s, h, v)] <= t)) {
            s->spill_rr[g] = h;
            return h;
        }
    }
    return -1;
}

/* Chunk for a command's transfer into block b (off the fault path). Returns when it is
 * usable, or -1 if the GPU has no evictable chunk. `victim` and `written` report an eviction. */
double sim_take_chunk_async(SimState *s, int g, int64_t b, double t, int64_t *victim, int64_t *written) {
    *victim = -1;
    *written = 0;
    /* No sim_reclaim here: a command runs at its own time, up to the controller's delay ahead of
     * the kernel's clock, and a chunk it freed from the pending list would be free for a fault
     * batch at an earlier time, before the copy out of it ended. It takes the earliest pending
     * chunk for itself instead; the fault path reclaims at its own time. */
    double ready = t;
    if (s->cap[g] - s->used[g] > 0) {
        s->used[g]++;
    } else if (s->npending[g] > 0) {
        ready = pop_pending(s, g);
        if (ready < t) ready = t;
    } else {
        int64_t v = sim_lru_victim(s, g, &b, 1);
        if (v < 0) return -1.0;
        int64_t why = s->drop_reason;
        s->drop_reason = GONE_EVICTED_FOR_PF;
        int64_t w = dirty_pages(s, g, v * PPB, (v + 1) * PPB);
        double start = t > s->d2h_tail[g] ? t : s->d2h_tail[g];
        ready = start + s->transfer_latency_ns + (double)w * PAGE / s->d2h_Bpns + sim_host_net_ns(s, g, w);
        s->d2h_tail[g] = ready;
        drop_block_queued(s, g, v, ready);
        s->drop_reason = why;
        ready = chunk_free_at(s, g, v, ready);
        set_chunk(s, g, v, 0);
        set_harvested(s, g, v, 0);
        s->stats[ST_PREEVICTIONS]++;
        s->stats[ST_PREEVICTED_BYTES] += w * 4096;
        s->stats[ST_BYTES_D2H] += w * 4096;
        *victim = v;
        *written = w;
    }
    /* the copies out of the chunk (the victim's write-back, or a pending one's) end at ready:
     * the chunk cannot be freed before, whatever happens to block b meanwhile */
    s->wb_busy[GB(s, g, b)] = ready > t ? ready : 0;
    set_chunk(s, g, b, 1);
    return ready;
}

/* Demand transfer of duration d at t pushes back every in-flight prefetch on g's link. */
static void preempt(SimState *s, int g, double t, double d) {
    if (d <= 0) return;
    int64_t *a = s->active + (int64_t)g * s->max_active;
    int64_t n = s->nactive[g], k = 0;
    for (int64_t i = 0; i < n; i++) {
        double *done = &s->entry_done[a[i]];
        if (*done > t) {
            *done += d;
            a[k++] = a[i];
        }
    }
    s->nactive[g] = k;
    if (s->h2d_tail[g] > t) s->h2d_tail[g] += d;
}

/* ------------------------------------------------------------------ thrashing
 * nvidia-uvm's thrashing detection (uvm_perf_thrashing.c, defaults in calibration.py). A
 * page thrashes when migrations into it by faults (demand or the fault path's prefetch) come
 * within `lapse` of one another `threshold` times in a row; evictions are not such events,
 * and per-page tracking starts only in a block whose previous migration went to another
 * processor within the lapse, so one GPU evicting and re-faulting its own data never thrashes.
 * A processor faulting on a thrashing page, other than the one spared in the current
 * throttling period, is throttled: it waits until the period ends (`nap` after it began). A
 * block's tracking is reset `epoch` after its last thrashing event (at most max_resets
 * times). Explicit migrations (UVM_MIGRATE) and discards reset the pages they touch.
 * Pinning: once a page's throttling periods reach pin_threshold, the spared processor's next
 * fault pins it. Between the host and GPUs over PCIe the one place every party can map is host
 * memory, where the driver's pins end up after it alternates: the simulator pins the page on
 * the host at once, the thrashing GPUs map it remotely (each access read over the link, no
 * fault) until `pin` has passed, then the page faults and migrates again with a fresh
 * history. Not modelled: pinning among GPUs alone (NVLink with native atomics: the driver
 * pins at once on the current location and maps the peers), so thrashing among GPUs only is
 * detected and not mitigated. Times are stored plus 1 ns so that 0 keeps the driver's
 * meaning "none". */
#define THR_CPU MAX_GPUS

typedef struct {
    double ts;              /* last migration by a fault, + 1 (0: none) */
    double throttle_end;    /* end of the current throttling period, + 1 (0: none) */
    uint64_t procs;         /* processors that took it (bit THR_CPU: the host) */
    uint64_t throttled;     /* processors throttled in the current period */
    double pin_until;       /* pinned on the host until then, + 1 (0: not pinned) */
    uint8_t n;              /* consecutive migrations within the lapse (saturates at 7) */
    uint8_t throttles;      /* throttling periods begun while not pinned (saturates at 255) */
    int8_t spared;          /* processor not throttled in the current period (-1: none) */
} ThrPage;

typedef struct {
    ThrPage *pages;         /* NULL until the block looks thrashing */
    double last_ts, last_thr_ts;   /* + 1; 0: none */
    int16_t last_proc;
    uint8_t resets;
} ThrBlock;

int64_t sim_thr_init(SimState *s) {
    s->thr = calloc((size_t)(s->nbl > 0 ? s->nbl : 1), sizeof(ThrBlock));
    return s->thr != NULL;
}

void sim_thr_free(SimState *s) {
    ThrBlock *B = (ThrBlock *)s->thr;
    if (!B) return;
    for (int64_t b = 0; b < s->nbl; b++) free(B[b].pages);
    free(B);
    s->thr = NULL;
}

static void thr_reset_page(ThrPage *P) {
    memset(P, 0, sizeof(*P));
    P->spared = -1;
}

/* Unpin page p (its remote mappings go) and forget its history. */
static void thr_unpin(SimState *s, ThrPage *P, int64_t p) {
    if (s->remote) s->remote[p] = 0;
    thr_reset_page(P);
}

/* GPU g reads page p, not valid on g, at t: through a remote mapping of a page pinned on the
 * host? A pin past its time is undone here (the driver's unpin timer): the access faults. */
static int remote_ok(SimState *s, int64_t p, mask_t bit, double t) {
    if (!(s->remote[p] & bit)) return 0;
    ThrBlock *B = s->thr ? &((ThrBlock *)s->thr)[p >> PB_SHIFT] : NULL;
    ThrPage *P = B && B->pages ? &B->pages[p & (PPB - 1)] : NULL;
    if (P && P->pin_until && t + 1.0 <= P->pin_until && s->cpu_valid[p]) return 1;
    if (P) thr_unpin(s, P, p);
    else s->remote[p] = 0;
    return 0;
}

/* Migration of pages[0..n) (all in block b) into processor pr at t, by a fault. */
static void thr_event(SimState *s, int pr, int64_t b, const int64_t *pages, int64_t n, double t) {
    if (!s->thr_threshold || !s->thr || n == 0) return;
    ThrBlock *B = &((ThrBlock *)s->thr)[b];
    double now = t + 1.0;
    if (!B->pages) {
        if (B->last_ts == 0 || B->last_proc == pr || now - B->last_ts > s->thr_lapse_ns) goto done;
        B->pages = malloc(PPB * sizeof(ThrPage));
        if (!B->pages) goto done;
        for (int i = 0; i < PPB; i++) thr_reset_page(&B->pages[i]);
    }
    for (int64_t i = 0; i < n; i++) {
        ThrPage *P = &B->pages[pages[i] & (PPB - 1)];
        double last = P->ts;
        P->procs |= 1ull << pr;
        P->ts = now;
        if (last == 0) continue;
        if (now - last <= s->thr_lapse_ns) {
            if (P->n < 7) P->n++;
            if (P->n == s->thr_threshold) s->stats[ST_THRASHING]++;
            if (P->n >= s->thr_threshold) B->last_thr_ts = now;
        } else if (P->n >= s->thr_threshold) {
            thr_reset_page(P);
        }
    }
done:
    B->last_ts = now;
    B->last_proc = (int16_t)pr;
}

/* An explicit migration of [lo, hi) (one block): the driver drops its thrashing history. */
static void thr_reset_range(SimState *s, int64_t lo, int64_t hi) {
    if (!s->thr) return;
    ThrBlock *B = &((ThrBlock *)s->thr)[lo >> PB_SHIFT];
    if (!B->pages) return;
    for (int64_t p = lo; p < hi; p++) {
        ThrPage *P = &B->pages[p & (PPB - 1)];
        if (P->pin_until) thr_unpin(s, P, p);
        else if (P->n >= s->thr_threshold) thr_reset_page(P);
    }
}

/* Processor pr faults on page p at t: until when it is throttled (0: not throttled); *pin
 * is set when the page is to be pinned on the host now. */
static double thr_hint(SimState *s, int pr, int64_t p, double t, int *pin) {
    *pin = 0;
    if (!s->thr_threshold || !s->thr) return 0;
    ThrBlock *B = &((ThrBlock *)s->thr)[p >> PB_SHIFT];
    if (!B->pages) return 0;
    double now = t + 1.0;
    if (B->last_thr_ts != 0 && now - B->last_thr_ts > s->thr_epoch_ns && B->resets < s->thr_max_resets) {
        B->resets++;   /* thrashing is over in this block: start afresh */
        free(B->pages);
        B->pages = NULL;
        B->last_proc = -1;
        B->last_ts = B->last_thr_ts = 0;
        return 0;
    }
    ThrPage *P = &B->pages[p & (PPB - 1)];
    uint64_t bit = 1ull << pr;
    if (P->n < s->thr_threshold) return 0;
    if (P->throttled & bit) {
        if (now < P->throttle_end && pr != P->spared) {
            s->stats[ST_THROTTLES]++;
            return P->throttle_end - 1.0;
        }
        P->throttled &= ~bit;
        if (!P->throttled) P->throttle_end = 0;
    }
    if (now - P->ts > s->thr_lapse_ns) return 0;
    P->procs |= bit;
    if (now > P->throttle_end) {   /* a new throttling period; spare another processor than last time */
        P->throttle_end = now + s->thr_nap_ns;
        P->spared = P->spared == pr ? -1 : (int8_t)pr;
    } else if (P->spared < 0) {
        P->spared = (int8_t)pr;
    }
    /* Between GPUs alone (NVLink, native atomics) the driver pins instead: not modelled. */
    if (!(P->procs & (1ull << THR_CPU))) return 0;
    if (pr == P->spared) {
        if (s->thr_pin_threshold && P->throttles >= s->thr_pin_threshold) {
            *pin = 1;
            P->pin_until = now + s->thr_pin_ns;
            P->throttles = 0;
            P->throttled = 0;
            P->throttle_end = 0;
            s->stats[ST_PINS]++;
        }
        return 0;
    }
    if (!(P->throttled & bit)) {
        P->throttled |= bit;
        if (P->throttles < 255) P->throttles++;
    }
    s->stats[ST_THROTTLES]++;
    return P->throttle_end - 1.0;
}

/* Map page p (pinned on the host) remotely on the GPUs that took part in its thrashing. */
static void thr_map_remote(SimState *s, int64_t p) {
    ThrPage *P = &((ThrBlock *)s->thr)[p >> PB_SHIFT].pages[p & (PPB - 1)];
    mask_t gpus = (mask_t)P->procs;   /* the GPUs' bits (THR_CPU is above them) */
    if (gpus && s->remote) {
        s->remote[p] |= gpus;
        s->any_remote = 1;
    }
}

/* The host writes pages[0..n) (sorted) at t: CPU faults on those a GPU holds. Returns when the
 * host may go on (t if not throttled); records the migrations to the host. */
double sim_thr_host(SimState *s, const int64_t *pages, int64_t n, double t) {
    double until = t;
    for (int64_t i = 0; i < n; i++) {
        int pin;
        double w = thr_hint(s, THR_CPU, pages[i], t, &pin);
        if (w > until) until = w;
        if (pin) thr_map_remote(s, pages[i]);   /* the host takes it, the GPUs map it */
    }
    for (int64_t i = 0; i < n;) {
        int64_t j = i;
        while (j < n && (pages[j] >> PB_SHIFT) == (pages[i] >> PB_SHIFT)) j++;
        thr_event(s, THR_CPU, pages[i] >> PB_SHIFT, pages + i, j - i, until);
        i = j;
    }
    return until;
}

/* ------------------------------------------------------------------ commands */

static int64_t new_entry(SimState *s, double done) {
    if (s->n_entries >= s->max_entries) return 0;  /* caller keeps room; 0 = untracked */
    int64_t e = s->n_entries++;
    s->entry_done[e] = done;
    return e;
}

static void drop_remote(SimState *s, int64_t p, mask_t others);

/*
 * UVM_MIGRATE of pages [lo, hi) (one block) to GPU g at time t: queued behind earlier
 * prefetches on g's host->GPU copy engine; never-populated pages are zeroed on the GPU
 * without using the link. `first`: this block starts a command (pays the start-up).
 * Returns the completion time; -2 if nothing to move; -1 if g has no evictable chunk.
 * out[0..4] = start, pages moved from the host, from other GPUs, pages prefetched,
 * victim block evicted to make room (-1: none), and out[5] its written pages.
 */
double sim_prefetch(SimState *s, int g, int64_t lo, int64_t hi, double t, int first, double *out) {
    mask_t bit = MBIT(g);
    int64_t b = lo >> PB_SHIFT, ix = GB(s, g, b), npages = 0, n_cpu = 0, n_gpu = 0, n_net[3] = {0, 0, 0};
    int peer = 0;
    double host_at = 0;   /* the latest write-back to the host of a page read from there */
    for (int64_t p = lo; p < hi; p++) {
        if (!s->managed[p] || (s->gmask[p] & bit)) continue;
        npages++;
        mask_t m = s->gmask[p];
        int from_cpu = s->cpu_valid[p];
        if (m && harvested_on(s, m, b)) { n_gpu++; peer = 1; continue; }  /* from a neighbour's spare */
        n_net[net_source(s, g, p, m, &from_cpu)]++;
        if (from_cpu) {
            n_cpu++;
            if (s->host_ready[p] > host_at) host_at = s->host_ready[p];
        } else if (m) n_gpu++;
    }
    out[4] = -1;
    out[5] = 0;
    if (!npages) return -2.0;
    double ready = t;
    if (!s->has_chunk[ix]) {
        int64_t victim, written;
        if (!s->prefetch_evicts && s->cap[g] - s->used[g] <= 0 && s->npending[g] == 0) return -1.0;
        ready = sim_take_chunk_async(s, g, b, t, &victim, &written);
        out[4] = (double)victim;
        out[5] = (double)written;
        if (ready < 0) return -1.0;
    }
    double latency = first ? s->transfer_latency_ns : 0.0, start, done;
    int64_t e;
    if (peer && !n_cpu) {
        /* all of it from harvested memory: its own NVLink queue, beside the PCIe one */
        start = ready > s->p2p_tail[g] ? ready : s->p2p_tail[g];
        done = start + latency + (double)n_gpu * PAGE / s->nvlink_Bpns;
        s->p2p_tail[g] = done;
        e = new_entry(s, done);
    } else if (n_cpu || n_gpu) {
        start = ready > s->h2d_tail[g] ? ready : s->h2d_tail[g];
        if (host_at > start) start = host_at;   /* the copy waits for the write-back it reads */
        /* across nodes the prefetcher streams 2 MiB blocks through a pipeline (the owner's copy
         * to its memory, the network, the copy into g): the slowest leg sets the pace */
        double pcie = (double)n_cpu * PAGE / s->prefetch_Bpns + (double)(n_gpu - n_net[2]) * PAGE / s->nvlink_Bpns +
                      (double)n_net[2] * PAGE / s->prefetch_Bpns;
        double net = sim_host_net_ns(s, g, n_net[1]), own = 0.0;
        if (n_net[2]) {
            net += (double)n_net[2] * PAGE / s->net_peer_Bpns;
            own = (double)n_net[2] * PAGE / s->d2h_Bpns;
            s->stats[ST_NET_BYTES] += n_net[2] * 4096;
        }
        double legs = pcie > net ? pcie : net;
        if (own > legs) legs = own;
        done = start + latency + legs + net_protocol(s, desc_remote(s, g, &b, 1), n_net[1] || n_net[2]);
        s->h2d_tail[g] = done;
        e = new_entry(s, done);
        if (e && s->nactive[g] < s->max_active) s->active[(int64_t)g * s->max_active + s->nactive[g]++] = e;
    } else {  /* never-populated pages are zeroed in GPU memory: nothing crosses the link */
        start = ready;
        done = start + latency + (double)npages * PAGE / s->hbm_Bpns;
        e = new_entry(s, done);
    }
    int rm = s->any_read_mostly && s->read_mostly[b];
    thr_reset_range(s, lo, hi);
    for (int64_t p = lo; p < hi; p++) {
        mask_t m = s->gmask[p];
        if (!s->managed[p] || (m & bit)) continue;
        if (!rm) {
            if (m && (!s->cpu_valid[p] || harvested_on(s, m, b))) drop_remote(s, p, m);
            s->cpu_valid[p] = 0;
        }
        s->gmask[p] |= bit;
        s->pf_entry[p] = (int32_t)e;
        s->pf_tag[p] = 1;
    }
    s->rescount[ix] += (int32_t)npages;
    set_lru(s, g, b, done);
    s->stats[ST_PF_PAGES] += npages;
    s->stats[ST_USER_PF_BYTES] += n_cpu * 4096;
    s->stats[ST_BYTES_H2D] += n_cpu * 4096;
    s->stats[ST_BYTES_P2P] += n_gpu * 4096;
    out[0] = start;
    out[1] = (double)n_cpu;
    out[2] = (double)n_gpu;
    out[3] = (double)npages;
    return done;
}

/* UVM_DISCARD of pages [lo, hi) (one block): dropped everywhere without write-back; the
 * next touch zero-fills without a transfer. Returns the populated pages dropped. */
int64_t sim_invalidate(SimState *s, int64_t lo, int64_t hi) {
    int64_t b = lo >> PB_SHIFT, populated = 0;
    int32_t on[MAX_GPUS] = {0};
    thr_reset_range(s, lo, hi);
    for (int64_t p = lo; p < hi; p++) {
        if (!s->managed[p]) continue;
        mask_t m = s->gmask[p];
        if (m || s->cpu_valid[p]) populated++;
        for (int g = 0; g < s->ngpu; g++) if (m & MBIT(g)) on[g]++;
        if (s->pf_tag[p]) {
            s->pf_tag[p] = 0;
            s->stats[ST_PF_WASTED]++;
        }
        s->gmask[p] = 0;
        s->cpu_valid[p] = 0;
        s->pf_entry[p] = 0;
        s->gone[p] = (uint8_t)s->drop_reason;
    }
    for (int g = 0; g < s->ngpu; g++) {
        int64_t ix = GB(s, g, b);
        if (!on[g] || s->pinned[ix]) continue;
        s->rescount[ix] -= on[g];
        if (s->rescount[ix] <= 0) {
            s->rescount[ix] = 0;
            if (s->has_chunk[ix]) sim_release_chunk(s, g, b, -1.0);
        }
    }
    s->stats[ST_EPOCH]++;
    return populated;
}

/* ------------------------------------------------------------------ fault batches */

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static inline int is_miss(SimState *s, int64_t p, uint8_t w, mask_t bit, double t) {
    if (!s->managed[p]) return 0;
    mask_t m = s->gmask[p];
    if (!(m & bit)) return !(s->any_remote && remote_ok(s, p, bit, t));
    int32_t e = s->pf_entry[p];
    if (e && s->entry_done[e] > t) return 1;
    if (s->any_read_mostly && w && s->read_mostly[p >> PB_SHIFT] &&
        (s->cpu_valid[p] || (m & (mask_t)~bit))) return 1;
    return 0;
}

/* The cause a fault on page p (a miss at t) is charged to: ST_FC_* */
static inline int fault_cause(SimState *s, int64_t p, mask_t bit, double t) {
    if (!(s->gmask[p] & bit)) return ST_FC0 + s->gone[p];
    int32_t e = s->pf_entry[p];
    if (e && s->entry_done[e] > t) return s->pf_tag[p] ? ST_FC_LATE : ST_FC_INFLIGHT;
    return ST_FC_RM_WRITE;
}

#define ONES8 0x0101010101010101ull

static inline uint64_t load8(const void *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Pages p..p+7 (one run inside a block, so one read/write kind) all hit on GPU g at t with
 * nothing to count: every managed one valid on g, none prefetched and unused, and none still
 * arriving (no transfer entry, or all eight brought by one transfer that has landed by t, as a
 * controller's prefetch of a block leaves them). The per-access test (is_miss) then says
 * "hit" for each of them, also at any later time; anything else goes the per-access way.
 * Word-wide, as the access walk spends its time on pages that hit. */
/* Bit g of masks m[0..8) as one byte each (the layout of the byte-per-page arrays). */
static inline uint64_t valid8(const mask_t *m, int g) {
#if MASK_BITS == 8
    return load8(m) >> g & ONES8;   /* one word: the eight masks are the eight bytes */
#else
    if ((m[0] & m[1] & m[2] & m[3] & m[4] & m[5] & m[6] & m[7]) & MBIT(g)) return ONES8;   /* the usual case */
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)((m[i] >> g) & 1) << (8 * i);
    return v;
#endif
}

static inline int clean8(const SimState *s, int64_t p, int g, double t) {
    uint64_t absent = load8(s->managed + p) & ~valid8(s->gmask + p, g) & ONES8;
    if (absent | load8(s->pf_tag + p)) return 0;
    const int32_t *e = s->pf_entry + p;
    uint64_t w0 = load8(e), w1 = load8(e + 2), w2 = load8(e + 4), w3 = load8(e + 6);
    if (!(w0 | w1 | w2 | w3)) return 1;
    if (w0 != w1 || w0 != w2 || w0 != w3 || e[0] != e[1]) return 0;
    return !(s->entry_done[e[0]] > t);
}

static inline int popcount64(uint64_t x) { return __builtin_popcountll(x); }

/* Whether a page of block b in [off, off + n) is thrashing (the driver's thrashing_pages: at
 * least `threshold` migrations in a row within the lapse). */
static int thr_any_thrashing(SimState *s, int64_t b, int64_t off, int64_t n) {
    ThrBlock *B = s->thr ? &((ThrBlock *)s->thr)[b] : NULL;
    if (!B || !B->pages || !s->thr_threshold) return 0;
    for (int64_t i = off; i < off + n; i++)
        if (B->pages[i].n >= s->thr_threshold) return 1;
    return 0;
}

/* Pages the density prefetcher adds in block b given the faulted pages (offsets, ascending)
 * there: for each faulted page the largest aligned subregion whose resident+faulted share
 * exceeds the threshold. Marks them in s->seen (value 2) and appends to out.
 * The counts come from a bitmap of the block's resident+faulted pages (as the driver's own
 * page masks), and a subregion is walked once when several faulted pages pick it: prefix
 * sums and a walk per faulted page cost up to 512 steps per faulted page. */
static int64_t density(SimState *s, int g, int64_t b, const int64_t *offs, int64_t nf, int64_t *out) {
    mask_t bit = MBIT(g);
    int64_t lo = b * PPB;
    uint64_t map[PPB / 64];
    int words[PPB / 64];
    for (int w = 0; w < PPB / 64; w++) {
        uint64_t m = 0;
        for (int j = 0; j < 8; j++) {
            int64_t p = lo + w * 64 + j * 8;
            uint64_t sn = load8(s->seen + p);
            uint64_t f = (valid8(s->gmask + p, g) | (sn & ~(sn >> 1))) & ONES8;   /* valid on g, or seen == 1 */
            m |= ((f * 0x0102040810204080ull) >> 56) << (j * 8);
        }
        map[w] = m;
    }
    /* the driver grows each fault to its big page before the tree (grow_fault_granularity):
     * those pages count as faulted, so the big page itself always passes and moves whole */
    int64_t gsz = s->fault_gran;
    if (gsz > 1 && gsz <= 64 && (gsz & (gsz - 1)) == 0) {
        uint64_t gmask = gsz == 64 ? ~0ull : ((1ull << gsz) - 1);
        int64_t last = -1;
        for (int64_t k = 0; k < nf; k++) {
            int64_t st = offs[k] & ~(gsz - 1);
            if (st == last || thr_any_thrashing(s, b, st, gsz)) continue;
            last = st;
            map[st >> 6] |= gmask << (st & 63);
        }
    }
    for (int w = 0; w < PPB / 64; w++) words[w] = popcount64(map[w]);
    /* a count c passes at size 2^sh when c > threshold * 2^sh, i.e. when c > floor(that) */
    int64_t need[PB_SHIFT + 1];
    for (int sh = 1; sh <= PB_SHIFT; sh++) need[sh] = (int64_t)floor(s->density_threshold * (double)((int64_t)1 << sh));
    int64_t n = 0, done_lo = 0, done_hi = 0;   /* the last subregion added */
    for (int64_t k = 0; k < nf; k++) {
        int64_t off = offs[k];
        int64_t best_start = -1, best_size = 0;
        /* the largest passing subregion; those no larger than the last one added and holding
         * off lie inside it, where every page is resident, faulted or added already */
        int inside = off >= done_lo && off < done_hi, stop = 0;
        if (inside) while (((int64_t)1 << (stop + 1)) <= done_hi - done_lo) stop++;
        for (int sh = PB_SHIFT; sh > stop; sh--) {
            int64_t size = (int64_t)1 << sh, st = off & ~(size - 1);
            int64_t cnt = 0;
            if (size < 64) {
                cnt = popcount64((map[st >> 6] >> (st & 63)) & ((1ull << size) - 1));
            } else {
                for (int64_t w = st >> 6; w < (st + size) >> 6; w++) cnt += words[w];
            }
            if (cnt > need[sh]) {
                best_start = st;
                best_size = size;
                break;
            }
        }
        if (best_size == 0) continue;
        done_lo = best_start;
        done_hi = best_start + best_size;
        for (int64_t i = best_start; i < best_start + best_size; i++) {
            int64_t p = lo + i;
            if (s->seen[p] || (s->gmask[p] & bit) || !s->managed[p]) continue;
            s->seen[p] = 2;
            out[n++] = p;
        }
    }
    return n;
}

static void drop_remote(SimState *s, int64_t p, mask_t others) {
    for (int h = 0; h < s->ngpu; h++) {
        mask_t hb = MBIT(h);
        if (!(others & hb)) continue;
        s->gmask[p] &= (mask_t)~hb;
        s->gone[p] = GONE_MOVED;
        int64_t ix = GB(s, h, p >> PB_SHIFT);
        if (--s->rescount[ix] <= 0) {
            s->rescount[ix] = 0;
            if (s->has_chunk[ix] && !s->pinned[ix]) sim_release_chunk(s, h, p >> PB_SHIFT, -1.0);
        }
        s->stats[ST_EPOCH]++;
    }
}

/* Service one fault batch (distinct pages fp[0..nf)) on GPU g at time t; returns duration. */
static double service(SimState *s, int g, const int64_t *fp, const uint8_t *fw, int64_t nf, double t, EventOut *out) {
    mask_t bit = MBIT(g);
    static int64_t need[MAXB], blocks[MAXB], move[MAXB * PPB], offs[MAXB];
    double wait_until = t;
    int64_t nn = 0;
    for (int64_t i = 0; i < nf; i++) {
        int64_t p = fp[i];
        if (s->gmask[p] & bit) {
            int32_t e = s->pf_entry[p];
            if (e && s->entry_done[e] > wait_until) wait_until = s->entry_done[e];
            if (s->any_read_mostly && fw[i] && s->read_mostly[p >> PB_SHIFT]) {
                /* write to a duplicated page: collapse the other copies */
                mask_t others = s->gmask[p] & (mask_t)~bit;
                s->cpu_valid[p] = 0;
                if (others) drop_remote(s, p, others);
            }
        } else {
            need[nn++] = p;
        }
    }
    double stall = s->batch_ns + s->fault_ns * (double)nf, throttled = 0;
    if (nn) {
        int64_t kept = 0;
        for (int64_t i = 0; i < nn; i++) {   /* thrashing pages: this GPU may be throttled */
            int pin;
            double w = thr_hint(s, g, need[i], t, &pin);
            if (w > throttled) throttled = w;
            if (pin && s->cpu_valid[need[i]] && !s->gmask[need[i]]) {
                thr_map_remote(s, need[i]);   /* pinned on the host: mapped, not migrated */
                /* read remotely once its write-back has landed */
                if (s->host_ready[need[i]] > wait_until) wait_until = s->host_ready[need[i]];
                continue;
            }
            need[kept++] = need[i];
        }
        nn = kept;
    }
    if (nn) {
        int64_t sorted = 1;   /* a window walks runs upwards: usually in order already */
        for (int64_t i = 1; i < nn && sorted; i++) sorted = need[i - 1] < need[i];
        if (!sorted) qsort(need, (size_t)nn, sizeof(int64_t), cmp_i64);
        for (int64_t i = 0; i < nn; i++) s->seen[need[i]] = 1;
        /* distinct blocks, and the density prefetcher per block */
        int64_t nb = 0, nmove = 0;
        for (int64_t i = 0; i < nn;) {
            int64_t b = need[i] >> PB_SHIFT, j = i, k = 0;
            while (j < nn && (need[j] >> PB_SHIFT) == b) offs[k++] = need[j++] & (PPB - 1);
            blocks[nb++] = b;
            for (int64_t q = i; q < j; q++) move[nmove++] = need[q];
            nmove += density(s, g, b, offs, k, move + nmove);
            i = j;
        }
        stall += s->block_ns * (double)(nb - 1);
        /* chunks for blocks new on this GPU; evict LRU on the critical path if none free */
        sim_reclaim(s, g, t);
        for (int64_t i = 0; i < nb; i++) {
            int64_t b = blocks[i], ix = GB(s, g, b);
            if (s->has_chunk[ix]) continue;
            if (s->cap[g] - s->used[g] > 0) {
                s->used[g]++;
            } else {
                int64_t v = sim_lru_victim(s, g, blocks, nb);
                double est = v >= 0 ? s->evict_chunk_ns + s->rescount[GB(s, g, v)] * PAGE / wb_rate(s, g) : INFINITY;
                double pmin = min_pending(s, g);
                int64_t hv = harvest_victim(s, g, t + stall);
                int spill = -1;
                double spill_done = -1.0;
                if (hv < 0 && v >= 0 && !(s->npending[g] > 0 && pmin - (t + stall) <=
                                          s->evict_chunk_ns + s->rescount[GB(s, g, v)] * PAGE / s->nvlink_Bpns))
                    spill = spill_target(s, g, t + stall);
                if (hv >= 0) {
                    /* a yielding GPU's own demand reclaims lent memory first; a chunk whose
                     * background write-back has not run yet is written back right here */
                    int64_t hix = GB(s, g, hv);
                    if (s->removable_at[hix] > t + stall && s->removable_at[hix] < INFINITY)
                        s->removable_at[hix] = t + stall + s->transfer_latency_ns +
                                               (double)s->rescount[hix] * PAGE / wb_rate(s, g);
                    double ready = harvest_drop(s, g, hv, t + stall);
                    stall = ready - t + s->evict_chunk_ns;
                    s->stats[ST_RECLAIMS]++;
                } else if (spill >= 0 && (spill_done = spill_block(s, g, spill, v, t + stall)) >= 0) {
                    /* evicted into a neighbour's spare memory over NVLink (victim cache); a
                     * neighbour that refused falls through to the host path below */
                    double done = chunk_free_at(s, g, v, spill_done);
                    set_chunk(s, g, v, 0);
                    stall = done - t + s->evict_chunk_ns;
                    s->stats[ST_EVICTIONS]++;
                    if (out->collect && out->ne < OUT_E) {
                        out->e_block[out->ne] = v;
                        out->e_written[out->ne] = 0;
                        out->e_t[out->ne] = t + stall;
                        out->ne++;
                    }
                } else if (s->npending[g] > 0 && pmin - (t + stall) <= est) {
                    double d = pop_pending(s, g) - t;
                    if (d > stall) stall = d;
                } else if (v >= 0) {
                    int64_t w = sim_drop_block(s, g, v, 0);
                    double busy = s->wb_busy[GB(s, g, v)];
                    s->wb_busy[GB(s, g, v)] = 0;
                    set_chunk(s, g, v, 0);
                    stall += s->evict_chunk_ns + (double)w * PAGE / wb_rate(s, g) + sim_host_net_ns(s, g, w);
                    if (busy > t + stall) stall = busy - t;   /* and the copies already out of it */
                    s->stats[ST_EVICTIONS]++;
                    s->stats[ST_EVICTED_BYTES] += w * 4096;
                    s->stats[ST_BYTES_D2H] += w * 4096;
                    if (out->collect && out->ne < OUT_E) {
                        out->e_block[out->ne] = v;
                        out->e_written[out->ne] = w;
                        out->e_t[out->ne] = t + stall;
                        out->ne++;
                    }
                } else {
                    for (int64_t q = 0; q < nmove; q++) s->seen[move[q]] = 0;
                    return -1.0; /* one batch needs more chunks than the GPU has */
                }
            }
            s->wb_busy[ix] = 0;   /* whatever it waited for is in the batch's stall */
            set_chunk(s, g, b, 1);
        }
        /* the moves (per-block host->GPU bytes by cause, for migration events) */
        int64_t m0 = out->nm, rec = out->collect && out->nm + nb <= OUT_M;
        if (rec) {
            for (int64_t i = 0; i < nb; i++) {
                out->m_batch[m0 + i] = out->nb;
                out->m_block[m0 + i] = blocks[i];
                out->m_bytes[m0 + i] = 0;
                out->m_pf_bytes[m0 + i] = 0;
            }
            out->nm += nb;
        }
        int64_t n_cpu = 0, n_gpu = 0, n_dem = 0, n_net[3] = {0, 0, 0}, src_blocks = 0, last_src = -1;
        double host_at = 0;   /* the latest write-back to the host of a page read from there */
        for (int64_t q = 0; q < nmove; q++) {
            int64_t p = move[q], b = p >> PB_SHIFT;
            mask_t m = s->gmask[p], others = m & (mask_t)~bit;
            /* a copy in a neighbour's harvested memory is nearer than the host's */
            int from_cpu = s->cpu_valid[p] && !(others && harvested_on(s, others, b));
            int src = net_source(s, g, p, others, &from_cpu);
            n_net[src]++;
            if (src && b != last_src) { src_blocks++; last_src = b; }
            int rm = s->any_read_mostly && s->read_mostly[b];
            if (from_cpu) {
                int64_t lo = 0, hi = nb - 1;   /* blocks[] is sorted */
                while (lo < hi) {
                    int64_t mid = (lo + hi) / 2;
                    if (blocks[mid] < b) lo = mid + 1; else hi = mid;
                }
                n_cpu++;
                if (s->host_ready[p] > host_at) host_at = s->host_ready[p];
                if (s->seen[p] == 1) {
                    n_dem++;
                    if (rec) out->m_bytes[m0 + lo] += 4096;
                } else if (rec) {
                    out->m_pf_bytes[m0 + lo] += 4096;
                }
            } else if (others) {
                n_gpu++;
                if (!rm) drop_remote(s, p, others);
            }
            if (!rm) s->cpu_valid[p] = 0;
            s->gmask[p] |= bit;
            s->pf_entry[p] = 0;
            s->rescount[GB(s, g, b)]++;
            s->seen[p] = 0;
        }
        if (s->any_read_mostly) {
            /* a write fault on a read-mostly page takes the only copy */
            for (int64_t i = 0; i < nf; i++) if (fw[i] && s->read_mostly[fp[i] >> PB_SHIFT]) {
                s->cpu_valid[fp[i]] = 0;
                mask_t others = s->gmask[fp[i]] & (mask_t)~bit;
                if (others) drop_remote(s, fp[i], others);
            }
        }
        /* across nodes (SnuRHAC, §6.3 steps 8-10) a batch's pages are stored and forwarded: the
         * owner copies a GPU's page to its memory, P reads it over the network, then copies it in */
        double xfer = (double)n_cpu * PAGE / s->fault_h2d_Bpns + (double)(n_gpu - n_net[2]) * PAGE / s->nvlink_Bpns;
        if (s->node) {
            xfer += sim_host_net_ns(s, g, n_net[1]);
            if (n_net[2]) {
                xfer += (double)n_net[2] * PAGE * (1.0 / s->d2h_Bpns + 1.0 / s->net_peer_Bpns + 1.0 / s->fault_h2d_Bpns);
                s->stats[ST_NET_BYTES] += n_net[2] * 4096;
            }
            xfer += net_protocol(s, desc_remote(s, g, blocks, nb), src_blocks);
        }
        int via = (int)s->fetch_via[g];
        if (via >= 0 && via != g && n_cpu > 1) {
            /* parallel fetch: a second thread serves the batch from its tail through the
             * neighbour's own PCIe lane into its memory, then over NVLink; both lanes run at once */
            int64_t n_rem = n_cpu / 2, n_loc = n_cpu - n_rem;
            double loc = (double)n_loc * PAGE / s->fault_h2d_Bpns;
            double rem = (double)n_rem * PAGE / s->fault_h2d_Bpns + (double)n_rem * PAGE / s->nvlink_Bpns;
            xfer = (loc > rem ? loc : rem) + (double)n_gpu * PAGE / s->nvlink_Bpns;
            s->stats[ST_BYTES_P2P] += n_rem * 4096;
        }
        for (int64_t q = 0; q < nmove;) {   /* the migrations, block by block, for thrashing detection */
            int64_t r = q;
            while (r < nmove && (move[r] >> PB_SHIFT) == (move[q] >> PB_SHIFT)) r++;
            thr_event(s, g, move[q] >> PB_SHIFT, move + q, r - q, throttled > t ? throttled : t);
            q = r;
        }
        preempt(s, g, t, (double)n_cpu * PAGE / s->fault_h2d_Bpns);
        if (host_at > t + stall) stall = host_at - t;   /* the copy waits for the write-back it reads */
        stall += xfer;
        for (int64_t i = 0; i < nb; i++) set_lru(s, g, blocks[i], t + stall);
        s->stats[ST_DEMAND] += n_dem * 4096;
        s->stats[ST_DRIVER_PF] += (n_cpu - n_dem) * 4096;
        s->stats[ST_BYTES_H2D] += n_cpu * 4096;
        s->stats[ST_BYTES_P2P] += n_gpu * 4096;
    }
    for (int64_t i = 0; i < nf; i++) {
        if (s->pf_tag[fp[i]]) {   /* a prefetch that arrived late: still useful */
            s->pf_tag[fp[i]] = 0;
            s->stats[ST_PF_USED]++;
        }
    }
    double end = t + stall;
    if (wait_until + s->batch_ns > end) end = wait_until + s->batch_ns;
    if (throttled > t && throttled + stall > end) {   /* replayed after the nap, then serviced */
        end = throttled + stall;
    }
    s->stats[ST_FAULTS] += nf;
    s->stats[ST_BATCHES]++;
    s->stats[ST_BATCH_ID]++;
    return end - t;
}

/* A position in the access stream, kept as runs of consecutive pages: run r holds stream
 * positions rpos[r] .. rpos[r+1]-1, pages rpage[r] + (position - rpos[r]), all in one 2 MiB
 * block, all reads or all writes (rwrite[r]). */
typedef struct {
    const int64_t *rpage, *rpos;
    const uint8_t *rwrite;
    int64_t r;
} Cursor;

/* Run holding position pos (rpos[0] == 0 <= pos < rpos[nruns]). */
static int64_t run_of(const int64_t *rpos, int64_t nruns, int64_t pos) {
    int64_t lo = 0, hi = nruns - 1;
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (rpos[mid] <= pos) lo = mid; else hi = mid - 1;
    }
    return lo;
}

static inline int64_t cur_page(const Cursor *c, int64_t pos) {
    return c->rpage[c->r] + (pos - c->rpos[c->r]);
}

/* Advance c to the run holding pos (pos >= the current run's start). */
static inline void cur_seek(Cursor *c, int64_t pos) {
    while (pos >= c->rpos[c->r + 1]) c->r++;
}

/* A GPU's access to page p that hit without the page being on it: a remote mapping, read
 * over the link. */
static inline void remote_read(SimState *s, int64_t p, mask_t bit, double *stall, double *t) {
    if (s->any_remote && !(s->gmask[p] & bit) && s->managed[p]) {
        *stall += s->remote_ns;
        if (t) *t += s->remote_ns;
        s->stats[ST_REMOTE_ACCESSES]++;
    }
}

/* The accesses of positions [a, b) pass (hit or served): Belady keys, prefetch use, remote reads. */
/* Belady's key of the access at pos of run c->r: minus the position of the next access to its
 * block on this GPU. A run lies in one block and one kernel, so that is pos + 1 inside the
 * run, and next[r] (per run, computed by the caller) after its last access: one entry per
 * run instead of one per access (a paper-scale replay makes hundreds of millions). */
static inline double next_key(const Cursor *c, const int64_t *next, int64_t pos) {
    return -(double)(pos + 1 < c->rpos[c->r + 1] ? pos + 1 : next[c->r]);
}

static void pass_range(SimState *s, Cursor c, int64_t a, int64_t b, double *key, const int64_t *next, mask_t bit,
                       double *stall) {
    for (int64_t i = a; i < b; ) {
        cur_seek(&c, i);
        int64_t end = c.rpos[c.r + 1] < b ? c.rpos[c.r + 1] : b;
        int64_t p = cur_page(&c, i);
        if (!key && !s->any_remote)   /* nothing to do for pages without a prefetch tag */
            while (end - i >= 8 && !load8(s->pf_tag + p)) { i += 8; p += 8; }
        for (; i < end; i++, p++) {
            remote_read(s, p, bit, stall, NULL);
            if (key) key[p >> PB_SHIFT] = next_key(&c, next, i);
            if (s->pf_tag[p]) {
                s->pf_tag[p] = 0;
                s->stats[ST_PF_USED]++;
            }
        }
    }
}

/*
 * Run kernel accesses [pos, hi) of stream positions [lo, hi) on GPU g (runs rpage/rwrite/rpos,
 * nruns of them). t(pos) = start + compute*(pos-lo)/(hi-lo) + *stall.
 * `next` (or NULL) gives, per run, the position of the next access to its block on g after
 * the run's last access (every run lies in one block and one kernel: see next_key).
 * `win` (or NULL) gives, per access, the accesses left in its recorded fault batch (0: none).
 * With out->collect the events of each batch are appended to `out`, and it returns after
 * the first batch that ends at or after `deadline` (or when a buffer is nearly full) so the
 * caller can deliver them; otherwise it runs to the end. Returns the position reached;
 * -1 if the GPU has no chunk for managed data at all.
 */
int64_t sim_kernel(SimState *s, int g, const int64_t *rpage, const uint8_t *rwrite, const int64_t *rpos,
                   int64_t nruns, const int64_t *next, const int32_t *win, int64_t lo, int64_t hi, int64_t pos,
                   double start, double compute, double *stall, double deadline, EventOut *out) {
    mask_t bit = MBIT(g);
    /* replay-only Belady order: as access i passes, its block's key becomes minus the
     * position of the block's next access on this GPU (farthest next use evicted first) */
    double *key = next ? s->evict_key + GB(s, g, 0) : NULL;
    int64_t n = hi - lo;
    double rate = n > 0 ? compute / (double)n : 0.0;
    int64_t bmax = s->batch_max < MAXB ? s->batch_max : MAXB;
    static int64_t bk[MAXB], fp[MAXB];
    static uint8_t fw[MAXB];
    if (s->maxblocks[g] < 1) return -1;
    if (pos >= hi) return pos;
    Cursor c = {rpage, rpos, rwrite, run_of(rpos, nruns, pos)};
    if (s->lru_on_access && pos == lo) {
        for (int64_t r = c.r; r < nruns && rpos[r] < hi; r++) {
            int64_t a = rpos[r] > lo ? rpos[r] : lo, e = rpos[r + 1] < hi ? rpos[r + 1] : hi;
            if (e <= a) continue;
            int64_t b0 = (rpage[r] + (a - rpos[r])) >> PB_SHIFT, b1 = (rpage[r] + (e - 1 - rpos[r])) >> PB_SHIFT;
            for (int64_t b = b0; b <= b1; b++) {
                int64_t ix = GB(s, g, b);
                if (s->has_chunk[ix] && s->lru[ix] < start) set_lru(s, g, b, start);
            }
        }
    }
    while (pos < hi) {
        double t = start + rate * (double)(pos - lo) + *stall;
        /* skip to the next access that misses; count prefetched pages used on the way */
        for (;;) {
            int64_t end = rpos[c.r + 1] < hi ? rpos[c.r + 1] : hi;
            int64_t p = cur_page(&c, pos);
            uint8_t w = rwrite[c.r];
            int fast = !key && !(s->any_read_mostly && w && s->read_mostly[p >> PB_SHIFT]);
            for (; pos < end; pos++, p++) {
                if (fast && end - pos >= 8 && clean8(s, p, g, t)) {   /* eight hits */
                    for (int i = 0; i < 8; i++) t += rate;
                    pos += 7;
                    p += 7;
                    continue;
                }
                if (is_miss(s, p, w, bit, t)) goto miss;
                remote_read(s, p, bit, stall, &t);
                if (key) key[p >> PB_SHIFT] = next_key(&c, next, pos);
                if (s->pf_tag[p]) {
                    s->pf_tag[p] = 0;
                    s->stats[ST_PF_USED]++;
                }
                t += rate;
            }
            if (pos >= hi) break;
            c.r++;
        }
        break;
    miss:;
        /* the window: the rest of the fault batch this access was recorded in, else the
         * calibrated window with its jitter */
        int64_t wlen = win && win[pos] > 0 ? (int64_t)win[pos]
                     : (int64_t)((double)s->window_pages * (1.0 + s->window_jitter * (2.0 * rng_unit(s) - 1.0)));
        if (wlen < 1) wlen = 1;
        int64_t wend = pos + wlen < hi ? pos + wlen : hi;
        int64_t nf = 0, nbk = 0, lastb = -1;
        int64_t q = pos;
        Cursor wc = c;
        while (q < wend) {
            cur_seek(&wc, q);
            int64_t end = wc.rpos[wc.r + 1] < wend ? wc.rpos[wc.r + 1] : wend;
            int64_t p = cur_page(&wc, q);
            uint8_t w = rwrite[wc.r];
            int fast = !(s->any_read_mostly && w && s->read_mostly[p >> PB_SHIFT]);
            for (; q < end; q++, p++) {
                if (fast && end - q >= 8 && clean8(s, p, g, t)) {   /* eight hits */
                    q += 7;
                    p += 7;
                    continue;
                }
                if (s->seen[p] || !is_miss(s, p, w, bit, t)) continue;
                if (nf == bmax) goto window_done;   /* batch full: it covers up to here */
                int64_t b = p >> PB_SHIFT;
                if (b != lastb) {
                    /* every block of a batch holds a chunk at once: never more than the GPU has */
                    int known = 0;
                    for (int64_t i = 0; i < nbk; i++) if (bk[i] == b) { known = 1; break; }
                    if (!known) {
                        if (nbk == s->maxblocks[g]) goto window_done;
                        bk[nbk++] = b;
                    }
                    lastb = b;
                }
                s->seen[p] = 1;
                s->stats[fault_cause(s, p, bit, t)]++;
                fp[nf] = p;
                fw[nf] = w;
                nf++;
            }
        }
    window_done:
        wend = q;
        for (int64_t i = 0; i < nf; i++) s->seen[fp[i]] = 0;
        double d = service(s, g, fp, fw, nf, t, out);
        if (d < 0) return -1;
        *stall += d;
        pass_range(s, c, pos, wend, key, next, bit, stall);   /* other accesses of the window go through */
        pos = wend;
        if (pos < hi) cur_seek(&c, pos);
        if (out->collect) {
            int64_t b = out->nb++;
            out->b_id[b] = s->stats[ST_BATCH_ID];
            out->b_nf[b] = nf;
            out->b_t[b] = t;
            out->b_end[b] = t + d;
            for (int64_t i = 0; i < nf; i++) {
                out->f_page[out->nf + i] = fp[i];
                out->f_write[out->nf + i] = fw[i];
                out->f_batch[out->nf + i] = b;
            }
            out->nf += nf;
            /* hand the drain back at the deadline, or before a buffer could overflow */
            if (t + d >= deadline || out->nb >= OUT_B - 1 || out->nf > OUT_F - MAXB ||
                out->ne > OUT_E - MAXB || out->nm > OUT_M - MAXB)
                return pos;
        }
    }
    return pos;
}

int64_t sim_eventout_size(void) { return (int64_t)sizeof(EventOut); }
int64_t sim_state_size(void) { return (int64_t)sizeof(SimState); }
_Static_assert(MAX_GPUS <= 8 * sizeof(mask_t), "mask_t holds a bit per GPU");
int64_t sim_max_gpus(void) { return MAX_GPUS; }

/* A minimal Python module so the build system can build, install and locate this file like
 * any extension; the functions above are called through ctypes (umctl/sim/core.py). */
#ifndef SIMCORE_MODULE
#define SIMCORE_MODULE _simcore
#endif
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define STR_(a) #a
#define STR(a) STR_(a)
static struct PyModuleDef simcore_module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = STR(SIMCORE_MODULE),
    .m_doc = "umctl simulator core (C functions called through ctypes)",
    .m_size = -1,
};
PyMODINIT_FUNC CAT(PyInit_, SIMCORE_MODULE)(void) { return PyModule_Create(&simcore_module); }
