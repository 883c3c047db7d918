// SPDX-License-Identifier: GPL-2.0
// umctl fault-path probes: kprobes (or fentry, where the kernel allows it) on the replayable-fault
// path of nvidia_uvm, streaming every serviced fault batch, every make_resident migration and every
// eviction to user space (umctl/sources/kprobes.py) through one BPF ring buffer.
//
// Probed functions (all static in nvidia_uvm 580; kallsyms lists them as 't'):
//   service_fault_batch(parent_gpu, service_mode, batch_context)
//       at entry preprocess_fault_batch has run: fault_cache[0 .. num_cached_faults) holds the
//       fetched faults with their va_space resolved. One EV_BATCH record per batch: its id, size,
//       GPU, and every fault (address, GPU timestamp, access type, fault type, owner pid).
//   uvm_va_block_make_resident(va_block, retry, context, dest_id, region, page_mask, prefetch, cause)
//       one EV_MIGRATION per call: block start + region (pages), destination, cause.
//   uvm_va_block_evict_chunks(va_block, gpu, root_chunk, tracker)
//       one EV_EVICTION per call: the evicted va_block range and the GPU.
//   evict_root_chunk(pmm, root_chunk, pmm_context)
//       counted only (the root chunk's physical address says nothing about the process).
//
// Field access is CO-RE: the struct definitions below carry only the fields we read, with the real
// 580 names; libbpf resolves their offsets at load time against the nvidia_uvm module BTF (or a
// custom BTF, which is how tests/test_kprobes.py checks every access against the real driver's BTF).
// Bitfields (fault_type, fault_access_type) are read with BPF_CORE_READ_BITFIELD_PROBED.
//
// va_space -> pid: va_space->va_space_mm.mm->owner->tgid (mm->owner exists with CONFIG_MEMCG);
// when that is missing or zero, the vaspace_pid map (user space may fill it) is consulted.
// Records are filtered by the targets map when filter_on[0] is set.
//
// Two flavours of each program: SEC("kprobe/...") and SEC("fentry/..."). fentry needs the module's
// BTF for the attach target and a kernel that allows tracing programs on module functions; the
// loader tries fentry first and falls back to kprobes (umctl/sources/kprobes.py).

#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

char LICENSE[] SEC("license") = "GPL";

#include "uvm580.h"

// ---- records (keep in sync with umctl/sources/kprobes.py RAW_DTYPE and EV_*) -------------------

#define EV_BATCH 2
#define EV_MIGRATION 3
#define EV_EVICTION 4

#define MAX_FAULTS 256   // faults read per batch (the driver's default batch is 256)
#define PAGE_SHIFT 12

#define CNT_RB_DROPS 0
#define CNT_FILTERED 1
#define CNT_BATCHES 2
#define CNT_FAULTS 3
#define CNT_TRUNCATED 4     // faults beyond MAX_FAULTS in a batch
#define CNT_MIGRATIONS 5
#define CNT_EVICTIONS 6
#define CNT_ROOT_EVICTIONS 7
#define CNT_FAULTS_DROPPED 8   // faults in batch records the ring had no room for
#define NCOUNTERS 9

// One 48-byte header for every kind, so a drain decodes the headers with one np.frombuffer.
// EV_BATCH records carry the batch's faults after the header: addr = entries that follow, a =
// faults in the driver's batch (num_cached_faults), vaspace = the first fault's va_space.
struct event {
    u64 t_ns;      // bpf_ktime_get_ns() (CLOCK_MONOTONIC)
    u32 kind;      // EV_*
    s32 pid;       // owner of the va_space, 0 when unknown
    u64 addr;      // fault address / first byte migrated / va_block start
    u64 a;         // FAULT: GPU timestamp; BATCH: faults in batch; MIGRATION, EVICTION: bytes
    u64 vaspace;   // the va_space pointer (user space maps unknown ones)
    u32 batch;     // FAULT, BATCH: batch_id
    u16 gpu;       // FAULT, BATCH: parent GPU id (1-based as UVM numbers them); EVICTION: GPU id; MIGRATION: dest id
    u8 access;     // FAULT: fault_access_type; MIGRATION: cause
    u8 type;       // FAULT: fault_type
};

struct fault_ent {
    u64 addr;      // fault_address
    u64 ts;        // the GPU's timestamp of the fault
    s32 pid;       // owner of the fault's va_space
    u8 access;     // fault_access_type
    u8 type;       // fault_type
    u16 pad;
};

struct batch_rec {
    struct event h;
    struct fault_ent f[MAX_FAULTS];
};

// scratch for building a batch record (too big for the stack); sent with its used length
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, struct batch_rec);
} scratch SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_RINGBUF);
    __uint(max_entries, 1 << 22);
} events SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, NCOUNTERS);
    __type(key, u32);
    __type(value, u64);
} counters SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 1024);
    __type(key, u64);     // va_space pointer
    __type(value, s32);   // pid
} vaspace_pid SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 256);
    __type(key, s32);     // pid
    __type(value, u8);
} targets SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, u32);
} filter_on SEC(".maps");

static __always_inline void count(u32 idx, u64 n)
{
    u64 *c = bpf_map_lookup_elem(&counters, &idx);
    if (c)
        *c += n;
}

static __always_inline s32 vaspace_to_pid(struct uvm_va_space_struct *vs)
{
    s32 pid = 0;
    u64 key = (u64)vs;
    s32 *known;

    if (!vs)
        return 0;
    known = bpf_map_lookup_elem(&vaspace_pid, &key);
    if (known)
        return *known;
    if (bpf_core_field_exists(((struct mm_struct *)0)->owner))
        pid = BPF_CORE_READ(vs, va_space_mm.mm, owner, tgid);
    if (pid > 0)
        bpf_map_update_elem(&vaspace_pid, &key, &pid, BPF_ANY);
    return pid;
}

// false when filtering is on and pid is not a target
static __always_inline int wanted(s32 pid)
{
    u32 zero = 0;
    u32 *on = bpf_map_lookup_elem(&filter_on, &zero);

    if (!on || !*on)
        return 1;
    if (bpf_map_lookup_elem(&targets, &pid))
        return 1;
    count(CNT_FILTERED, 1);
    return 0;
}

static __always_inline int emit(struct event *src)
{
    if (bpf_ringbuf_output(&events, src, sizeof(*src), 0)) {
        count(CNT_RB_DROPS, 1);
        return -1;
    }
    return 0;
}

struct walk {
    void *cache;
    u64 entry_size;   // the driver's sizeof(uvm_fault_buffer_entry_t): a CO-RE relocation
    u32 n;            // faults to read
    u32 m;            // faults copied
    u64 vaspace;      // the first copied fault's va_space
    s32 pid;
};

// bpf_loop callback: copy fault i into the scratch record (verified once, not once per iteration)
static long copy_fault(u32 i, void *arg)
{
    struct walk *w = arg;
    struct uvm_fault_buffer_entry_struct *f;
    struct uvm_va_space_struct *vs;
    struct fault_ent *o;
    struct batch_rec *r;
    u32 zero = 0;
    s32 pid;

    if (i >= w->n)
        return 1;
    r = bpf_map_lookup_elem(&scratch, &zero);
    if (!r)
        return 1;
    f = w->cache + (u64)i * w->entry_size;
    vs = BPF_CORE_READ(f, va_space);
    pid = vaspace_to_pid(vs);
    if (!wanted(pid))
        return 0;
    if (!w->m)
        w->vaspace = (u64)vs;
    o = &r->f[w->m & (MAX_FAULTS - 1)];
    o->addr = BPF_CORE_READ(f, fault_address);
    o->ts = BPF_CORE_READ(f, timestamp);
    o->pid = pid;
    o->access = BPF_CORE_READ_BITFIELD_PROBED(f, fault_access_type);
    o->type = BPF_CORE_READ_BITFIELD_PROBED(f, fault_type);
    o->pad = 0;
    w->pid = pid;
    w->m++;
    return 0;
}

static __always_inline int on_service_fault_batch(struct uvm_parent_gpu_struct *parent_gpu,
                                                   struct uvm_fault_service_batch_context_struct *batch)
{
    u32 zero = 0, n = BPF_CORE_READ(batch, num_cached_faults);
    struct batch_rec *r;
    struct walk w = {};
    u64 size;

    count(CNT_BATCHES, 1);
    count(CNT_FAULTS, n);
    if (n > MAX_FAULTS)
        count(CNT_TRUNCATED, n - MAX_FAULTS);
    w.cache = BPF_CORE_READ(batch, fault_cache);
    w.entry_size = bpf_core_type_size(struct uvm_fault_buffer_entry_struct);
    w.n = n < MAX_FAULTS ? n : MAX_FAULTS;
    bpf_loop(MAX_FAULTS, copy_fault, &w, 0);
    r = bpf_map_lookup_elem(&scratch, &zero);
    if (!r || !w.m)
        return 0;
    r->h.t_ns = bpf_ktime_get_ns();
    r->h.kind = EV_BATCH;
    r->h.pid = w.pid;
    r->h.addr = w.m;
    r->h.a = n;
    r->h.vaspace = w.vaspace;
    r->h.batch = BPF_CORE_READ(batch, batch_id);
    r->h.gpu = BPF_CORE_READ(parent_gpu, id.val);
    r->h.access = r->h.type = 0;
    size = sizeof(struct event) + (u64)(w.m <= MAX_FAULTS ? w.m : MAX_FAULTS) * sizeof(struct fault_ent);
    if (size > sizeof(*r))
        return 0;
    if (bpf_ringbuf_output(&events, r, size, 0)) {
        count(CNT_RB_DROPS, 1);
        count(CNT_FAULTS_DROPPED, w.m);
    }
    return 0;
}

static __always_inline struct uvm_va_space_struct *block_vaspace(struct uvm_va_block_struct *b)
{
    return BPF_CORE_READ(b, managed_range, va_range.va_space);
}

static __always_inline int on_make_resident(struct uvm_va_block_struct *blk, u32 dest_id, u32 region, u32 cause)
{
    struct event e = {};
    u32 first = region & 0xffff, outer = region >> 16;   // uvm_va_block_region_t {u16 first, outer} by value

    count(CNT_MIGRATIONS, 1);
    e.vaspace = (u64)block_vaspace(blk);
    e.pid = vaspace_to_pid((struct uvm_va_space_struct *)e.vaspace);
    if (!wanted(e.pid))
        return 0;
    e.t_ns = bpf_ktime_get_ns();
    e.kind = EV_MIGRATION;
    e.addr = BPF_CORE_READ(blk, start) + ((u64)first << PAGE_SHIFT);
    e.a = outer > first ? (u64)(outer - first) << PAGE_SHIFT : 0;
    e.gpu = dest_id;
    e.access = cause;
    emit(&e);
    return 0;
}

static __always_inline int on_evict_chunks(struct uvm_va_block_struct *blk, struct uvm_gpu_struct *gpu)
{
    struct event e = {};

    count(CNT_EVICTIONS, 1);
    e.vaspace = (u64)block_vaspace(blk);
    e.pid = vaspace_to_pid((struct uvm_va_space_struct *)e.vaspace);
    if (!wanted(e.pid))
        return 0;
    e.t_ns = bpf_ktime_get_ns();
    e.kind = EV_EVICTION;
    e.addr = BPF_CORE_READ(blk, start);
    e.a = BPF_CORE_READ(blk, end) + 1 - e.addr;
    e.gpu = BPF_CORE_READ(gpu, id.val);
    emit(&e);
    return 0;
}

// ---- kprobe flavour -------------------------------------------------------------------------

SEC("kprobe/service_fault_batch")
int BPF_KPROBE(kp_service_fault_batch, struct uvm_parent_gpu_struct *parent_gpu, int mode,
               struct uvm_fault_service_batch_context_struct *batch)
{
    return on_service_fault_batch(parent_gpu, batch);
}

SEC("kprobe/uvm_va_block_make_resident")
int BPF_KPROBE(kp_make_resident, struct uvm_va_block_struct *blk, void *retry, void *context, u32 dest_id,
               u32 region)
{
    // the 8th argument (cause) is on the stack: sp + 8 * (8 - 6) at function entry
    u64 cause = 0;

    bpf_probe_read_kernel(&cause, sizeof(cause), (void *)(PT_REGS_SP(ctx) + 16));
    return on_make_resident(blk, dest_id, region, (u32)cause);
}

SEC("kprobe/uvm_va_block_evict_chunks")
int BPF_KPROBE(kp_evict_chunks, struct uvm_va_block_struct *blk, struct uvm_gpu_struct *gpu)
{
    return on_evict_chunks(blk, gpu);
}

SEC("kprobe/evict_root_chunk")
int BPF_KPROBE(kp_evict_root_chunk)
{
    count(CNT_ROOT_EVICTIONS, 1);
    return 0;
}

// ---- fentry flavour (typed arguments from the attach target's BTF) ---------------------------

SEC("fentry/service_fault_batch")
int BPF_PROG(fe_service_fault_batch, struct uvm_parent_gpu_struct *parent_gpu, int mode,
             struct uvm_fault_service_batch_context_struct *batch)
{
    return on_service_fault_batch(parent_gpu, batch);
}

SEC("fentry/uvm_va_block_make_resident")
int BPF_PROG(fe_make_resident, struct uvm_va_block_struct *blk, void *retry, void *context, u32 dest_id,
             u32 region, void *page_mask, void *prefetch_mask, u32 cause)
{
    return on_make_resident(blk, dest_id, region, cause);
}

SEC("fentry/uvm_va_block_evict_chunks")
int BPF_PROG(fe_evict_chunks, struct uvm_va_block_struct *blk, struct uvm_gpu_struct *gpu)
{
    return on_evict_chunks(blk, gpu);
}

SEC("fentry/evict_root_chunk")
int BPF_PROG(fe_evict_root_chunk)
{
    count(CNT_ROOT_EVICTIONS, 1);
    return 0;
}
