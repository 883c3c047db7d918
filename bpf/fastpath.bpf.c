// SPDX-License-Identifier: GPL-2.0
// umctl fast path: DeepUM's correlation prefetching at fault time, in the kernel, from the tables
// the Python controller learns (umctl/actuators/fastpath.py keeps them in the `successors` map).
//
// fentry on the driver's service_fault_batch(parent_gpu, mode, batch_context) — at entry the
// batch's faults are fetched and their va_spaces resolved (see uvmfault.bpf.c). Runs in the
// driver's fault-servicing thread (the simulated driver: the faulting writer's context), under
// RCU with migration disabled: nothing here sleeps, and the kfunc only queues.
//
//   1. the distinct faulted 2 MiB blocks of the served pids (`pids` map), in fault order, become
//      walk starts (up to MAX_STARTS a batch) and are marked in `recent` as faulted in this batch;
//   2. from each start not yet walked in this batch, follow the successor chain (DeepUM §4.2):
//      at each block, queue every successor not queued within `requeue_ns` nor faulted in this
//      batch with bpf_umctl_enqueue() (the umctl module's kfunc: a migration to the faulting GPU
//      on the module's bounded queue, executed by its worker, acknowledged on its multicast
//      group), then move to the first successor this step queued or that faulted in this batch,
//      for at most `degree` steps. The controller's mirror links each kernel's end block to the
//      predicted next kernel's start block, so the walk chains across kernels.
//
// The kfunc checks that a controller with the right to steer the pid enabled the fast path for
// it (genl FASTPATH_ENABLE); `pids` here only saves calls for processes nobody asked about.
// Loading needs the umctl module with its kfunc registered: without it the load fails (libbpf:
// unresolved ksym) and the loader says so; uvmfault.bpf.o is a separate object, unaffected.

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

char LICENSE[] SEC("license") = "GPL";

#include "uvm580.h"

extern int bpf_umctl_enqueue(u32 pid, u64 addr, u64 len, s32 dst) __ksym;

#define NSUCCS 4            // successors per block (DeepUM's NumSuccs)
#define MAX_FAULTS 256      // faults read per batch
#define MAX_STARTS 16       // walk starts per batch
#define MAX_STEPS 2048      // walk steps per batch (bpf_loop bound)
#define BLOCK_SHIFT 21
#define BLOCK_SIZE (1ULL << BLOCK_SHIFT)

// keep in sync with umctl/actuators/fastpath.py
struct block_key {
    s32 pid;
    u32 pad;
    u64 block;              // address >> 21
};
struct succs { u64 block[NSUCCS]; };    // 0: none (no managed block starts at address 0)
struct recent_val {
    u64 t_ns;               // when queued, faulted or walked (the batch's time)
    u8 faulted;             // faulted in the batch of t_ns
    u8 walked;              // the walk passed here in the batch of t_ns
    u8 pad[6];
};
struct config {
    u32 degree;             // walk steps per start
    u32 pad;
    u64 requeue_ns;         // do not queue a block again within this
};

#define FP_BATCHES 0
#define FP_STARTS 1
#define FP_STEPS 2
#define FP_ENQUEUED 3
#define FP_REFUSED 4        // the kfunc said -EPERM (not enabled for the pid)
#define FP_FAILED 5         // other kfunc errors (queue full, rate limit, bad range)
#define FP_RECENT 6         // successors skipped: queued within requeue_ns
#define FP_NCOUNTERS 7

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 1 << 16);
    __type(key, struct block_key);
    __type(value, struct succs);
} successors SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 1 << 14);
    __type(key, struct block_key);
    __type(value, struct recent_val);
} recent SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 256);
    __type(key, s32);
    __type(value, u8);
} pids SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, struct config);
} config SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, FP_NCOUNTERS);
    __type(key, u32);
    __type(value, u64);
} fp_counters SEC(".maps");

// The walk's mutable state lives in a per-CPU map value, not on the stack: the 6.1 verifier
// checks a bpf_loop callback once, with the caller's stack as it is at the call, so a field
// initialised to 0 there (say `cur`) would make the callback's `cur != 0` branch dead code — which
// it then removes. Map memory is unknown to it, so both branches are verified and kept.
struct state {
    u64 cur;                // the walk's block, 0: take the next start
    u64 last_block;
    u64 last_vs;
    s32 last_pid;
    s32 pid;                // the walk's pid
    u32 si;                 // next start
    u32 steps;
    u32 n;                  // starts collected
    u32 pad;
    s32 spid[MAX_STARTS];
    u64 sblock[MAX_STARTS];
};

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, struct state);
} scratch SEC(".maps");

static __always_inline void count(u32 idx, u64 n)
{
    u64 *c = bpf_map_lookup_elem(&fp_counters, &idx);
    if (c)
        *c += n;
}

// read-only during the loops (every field comes from a run-time read)
struct ctx {
    void *cache;
    u64 entry_size;
    u64 now;
    u64 requeue_ns;
    s32 dst;
    u32 n;
    u32 degree;
};

static __always_inline void mark(struct ctx *c, s32 pid, u64 block, u8 faulted, u8 walked)
{
    struct block_key k = { .pid = pid, .block = block };
    struct recent_val v = { .t_ns = c->now, .faulted = faulted, .walked = walked };
    struct recent_val *o = bpf_map_lookup_elem(&recent, &k);

    if (o && o->t_ns == c->now) {   // this batch's entry: keep its flags
        o->faulted |= faulted;
        o->walked |= walked;
        return;
    }
    bpf_map_update_elem(&recent, &k, &v, BPF_ANY);
}

// bpf_loop callback 1: collect the distinct faulted blocks of served pids
static long collect(u32 i, void *arg)
{
    struct ctx *c = arg;
    struct uvm_fault_buffer_entry_struct *f;
    struct uvm_va_space_struct *vs;
    struct state *st;
    u32 zero = 0;
    u64 block;
    s32 pid;

    st = bpf_map_lookup_elem(&scratch, &zero);
    if (!st || i >= c->n)
        return 1;
    f = c->cache + (u64)i * c->entry_size;
    vs = BPF_CORE_READ(f, va_space);
    if ((u64)vs == st->last_vs) {
        pid = st->last_pid;
    } else {
        pid = 0;
        if (vs && bpf_core_field_exists(((struct mm_struct *)0)->owner))
            pid = BPF_CORE_READ(vs, va_space_mm.mm, owner, tgid);
        st->last_vs = (u64)vs;
        st->last_pid = pid;
    }
    if (pid <= 0 || !bpf_map_lookup_elem(&pids, &pid))
        return 0;
    block = BPF_CORE_READ(f, fault_address) >> BLOCK_SHIFT;
    if (block == st->last_block)
        return 0;
    st->last_block = block;
    mark(c, pid, block, 1, 0);
    if (st->n >= MAX_STARTS)
        return 0;
    st->spid[st->n & (MAX_STARTS - 1)] = pid;
    st->sblock[st->n & (MAX_STARTS - 1)] = block;
    st->n++;
    return 0;
}

// one successor: 1 if the walk may continue there (queued now, or faulted in this batch)
static __always_inline int visit(struct ctx *c, s32 pid, u64 s)
{
    struct block_key k = { .pid = pid, .block = s };
    struct recent_val *r;
    int ret;

    if (!s)
        return 0;
    r = bpf_map_lookup_elem(&recent, &k);
    if (r && r->t_ns == c->now)
        return !r->walked && r->faulted;   // served by demand in this batch: walk through, no command
    if (r && c->now - r->t_ns < c->requeue_ns) {
        count(FP_RECENT, 1);
        return 0;
    }
    ret = bpf_umctl_enqueue(pid, s << BLOCK_SHIFT, BLOCK_SIZE, c->dst);
    if (ret == 0)
        count(FP_ENQUEUED, 1);
    else
        count(ret == -1 ? FP_REFUSED : FP_FAILED, 1);   // -EPERM
    mark(c, pid, s, 0, 0);
    return ret != -1;   // refused (-EPERM): not enabled for this pid, no point walking on
}

// bpf_loop callback 2: one step of a walk (or the start of the next one)
static long walk(u32 i, void *arg)
{
    struct ctx *c = arg;
    struct block_key k = {};
    struct recent_val *r;
    struct state *st;
    struct succs *sc;
    u32 zero = 0;
    u64 next = 0, s;
    s32 pid;

    st = bpf_map_lookup_elem(&scratch, &zero);
    if (!st)
        return 1;
    if (!st->cur) {
        if (st->si >= st->n || st->si >= MAX_STARTS)
            return 1;
        st->pid = st->spid[st->si & (MAX_STARTS - 1)];
        st->cur = st->sblock[st->si & (MAX_STARTS - 1)];
        st->si++;
        st->steps = 0;
        k.pid = st->pid;
        k.block = st->cur;
        r = bpf_map_lookup_elem(&recent, &k);
        if (r && r->t_ns == c->now && r->walked) {   // an earlier walk of this batch covered it
            st->cur = 0;
            return 0;
        }
        count(FP_STARTS, 1);
        mark(c, st->pid, st->cur, 0, 1);
        return 0;
    }
    count(FP_STEPS, 1);
    pid = st->pid;
    k.pid = pid;
    k.block = st->cur;
    sc = bpf_map_lookup_elem(&successors, &k);
    if (!sc || ++st->steps > c->degree) {
        st->cur = 0;
        return 0;
    }
    s = sc->block[0];
    if (visit(c, pid, s) && !next)
        next = s;
    s = sc->block[1];
    if (visit(c, pid, s) && !next)
        next = s;
    s = sc->block[2];
    if (visit(c, pid, s) && !next)
        next = s;
    s = sc->block[3];
    if (visit(c, pid, s) && !next)
        next = s;
    if (next)
        mark(c, pid, next, 0, 1);
    st->cur = next;
    return 0;
}

SEC("fentry/service_fault_batch")
int BPF_PROG(fp_service_fault_batch, struct uvm_parent_gpu_struct *parent_gpu, int mode,
             struct uvm_fault_service_batch_context_struct *batch)
{
    struct ctx c = {};
    struct state *st;
    struct config *cfg;
    u32 zero = 0, n;

    st = bpf_map_lookup_elem(&scratch, &zero);
    cfg = bpf_map_lookup_elem(&config, &zero);
    if (!st || !cfg || !cfg->degree)
        return 0;
    __builtin_memset(st, 0, sizeof(*st));
    count(FP_BATCHES, 1);
    n = BPF_CORE_READ(batch, num_cached_faults);
    c.cache = BPF_CORE_READ(batch, fault_cache);
    c.entry_size = bpf_core_type_size(struct uvm_fault_buffer_entry_struct);
    c.n = n < MAX_FAULTS ? n : MAX_FAULTS;
    c.now = bpf_ktime_get_ns();
    c.requeue_ns = cfg->requeue_ns;
    c.degree = cfg->degree;
    c.dst = (s32)BPF_CORE_READ(parent_gpu, id.val) - 1;   // UVM numbers GPUs from 1
    if (c.dst < 0)
        return 0;
    bpf_loop(MAX_FAULTS, collect, &c, 0);
    bpf_loop(MAX_STEPS, walk, &c, 0);
    return 0;
}
