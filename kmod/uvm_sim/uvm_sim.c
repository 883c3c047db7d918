// SPDX-License-Identifier: GPL-2.0
/*
 * uvm_sim: a TEST-ONLY stand-in for nvidia_uvm's replayable-fault path, so that umctl's real BPF
 * programs (bpf/uvmfault.bpf.c) attach to real kernel functions and the real umctl module
 * (kmod/umctl) runs in a real kernel, in the VM test bed (tests/vm/). Never load it on a host
 * with the NVIDIA driver.
 *
 * What is real: the function names and argument lists of the 580.159.04 driver's
 *   uvm_parent_gpu_service_replayable_faults, preprocess_fault_batch, service_fault_batch,
 *   uvm_va_block_make_resident, evict_root_chunk, uvm_va_block_evict_chunks,
 * and the struct and member names (with the member order) of every field the BPF programs read:
 *   uvm_fault_service_batch_context_struct, uvm_fault_buffer_entry_struct (bitfields included),
 *   uvm_va_space_struct.va_space_mm.mm, uvm_va_block_struct, uvm_va_range_managed_struct,
 *   uvm_parent_gpu_struct.id, uvm_gpu_struct.id; processor ids are 1-based for GPUs as in UVM.
 * Offsets differ from the real driver (we carry fewer members) — which is the point of CO-RE: the
 * same object resolves against this module's BTF here and against the real one there
 * (tests/test_kprobes.py checks the latter).
 *
 * What is simulated: one GPU with `capacity_blocks` 2 MiB root chunks, evicted oldest-first.
 * A process registers by opening /dev/uvm_sim (its va_space's mm is the opener's); writing an
 * array of struct uvm_sim_fault {u64 addr; u32 access; u32 pad;} to that fd makes those accesses:
 * the ones to blocks not resident on the GPU fault, are queued, and are serviced at once, in the
 * writer's context, in batches of up to 256 (the real driver does it in its bottom half); a record
 * with access UVM_SIM_ACCESS_FREE frees that block instead (the range stops being managed until
 * touched again).
 *
 * The fd also answers the 580 driver's ioctls that kmod/umctl's backend issues (kmod/umctl/uvm_abi.h:
 * same numbers, same parameter structs, verdict in rmStatus):
 *   UVM_MIGRATE: to the GPU's UUID (module parameter gpu_uuid) makes the blocks resident through
 *     uvm_va_block_make_resident(cause UVM_MAKE_RESIDENT_CAUSE_API_MIGRATE), evicting oldest first
 *     as faults do; to the CPU (all-zero UUID) migrates resident blocks back;
 *   UVM_DISCARD: drops the blocks' GPU residency without write-back (reported through
 *     uvm_va_block_evict_chunks, which the eviction probe sees);
 *   UVM_MM_INITIALIZE (uvmFd = a va_space fd of ours): turns this fd into the per-process "mm fd"
 *     the real driver has, on which every other ioctl answers NV_ERR_ILLEGAL_ACTION.
 * Bad ranges answer NV_ERR_INVALID_ADDRESS as the real driver's checks do: unaligned, zero,
 * overflowing, beyond the 47-bit user address space, or touching a freed block; an unknown
 * destination NV_ERR_INVALID_DEVICE; flags/semaphores we do not simulate NV_ERR_INVALID_ARGUMENT.
 */
#include <linux/module.h>
#include <linux/kernel.h>
#include <linux/miscdevice.h>
#include <linux/fs.h>
#include <linux/slab.h>
#include <linux/sched.h>
#include <linux/sched/mm.h>
#include <linux/mutex.h>
#include <linux/rwsem.h>
#include <linux/xarray.h>
#include <linux/list.h>
#include <linux/uaccess.h>
#include <linux/ktime.h>
#include <linux/kref.h>
#include <linux/file.h>
#include "uvm_sim.h"
#include "../umctl/uvm_abi.h"

#define UVM_SIM_BATCH 256
#define BLOCK_SHIFT 21
#define PAGE_SHIFT_4K 12
#define PAGES_PER_BLOCK (1u << (BLOCK_SHIFT - PAGE_SHIFT_4K))

typedef unsigned int NvU32;
typedef unsigned short NvU16;
typedef unsigned long long NvU64;

typedef struct { NvU32 val; } uvm_processor_id_t;
typedef uvm_processor_id_t uvm_gpu_id_t;
typedef struct { NvU32 val; } uvm_parent_processor_id_t;
typedef uvm_parent_processor_id_t uvm_parent_gpu_id_t;

typedef enum {
	UVM_FAULT_TYPE_INVALID_PDE = 0, UVM_FAULT_TYPE_INVALID_PTE = 1, UVM_FAULT_TYPE_ATOMIC = 2,
	UVM_FAULT_TYPE_WRITE = 3, UVM_FAULT_TYPE_READ = 4,
} uvm_fault_type_t;
typedef enum {
	UVM_FAULT_ACCESS_TYPE_PREFETCH = 0, UVM_FAULT_ACCESS_TYPE_READ = 1, UVM_FAULT_ACCESS_TYPE_WRITE = 2,
	UVM_FAULT_ACCESS_TYPE_ATOMIC_WEAK = 3, UVM_FAULT_ACCESS_TYPE_ATOMIC_STRONG = 4,
	UVM_FAULT_ACCESS_TYPE_COUNT = 5,
} uvm_fault_access_type_t;
typedef enum {
	UVM_MAKE_RESIDENT_CAUSE_REPLAYABLE_FAULT = 0, UVM_MAKE_RESIDENT_CAUSE_NON_REPLAYABLE_FAULT = 1,
	UVM_MAKE_RESIDENT_CAUSE_ACCESS_COUNTER = 2, UVM_MAKE_RESIDENT_CAUSE_PREFETCH = 3,
	UVM_MAKE_RESIDENT_CAUSE_EVICTION = 4, UVM_MAKE_RESIDENT_CAUSE_API_TOOLS = 5,
	UVM_MAKE_RESIDENT_CAUSE_API_MIGRATE = 6,
} uvm_make_resident_cause_t;
typedef enum { FAULT_SERVICE_MODE_REGULAR = 0, FAULT_SERVICE_MODE_CANCEL = 1 } fault_service_mode_t;

typedef struct { NvU16 first; NvU16 outer; } uvm_va_block_region_t;
typedef struct { unsigned long bitmap[PAGES_PER_BLOCK / BITS_PER_LONG]; } uvm_page_mask_t;

typedef struct uvm_parent_gpu_struct {
	char name[115];
	uvm_parent_gpu_id_t id;
} uvm_parent_gpu_t;

typedef struct uvm_gpu_struct {
	uvm_parent_gpu_t *parent;
	uvm_gpu_id_t id;
} uvm_gpu_t;

typedef struct uvm_va_space_mm_struct {
	struct mm_struct *mm;
	spinlock_t lock;
} uvm_va_space_mm_t;

typedef struct uvm_va_space_struct {
	struct rw_semaphore lock;
	uvm_va_space_mm_t va_space_mm;
	/* simulation only */
	pid_t pid;
	struct xarray blocks;            /* block index -> uvm_va_block_t */
	struct xarray freed;             /* block index -> freed (not managed until touched again) */
	bool mm_fd;                      /* UVM_MM_INITIALIZE made this fd the process's mm fd */
} uvm_va_space_t;

typedef struct uvm_va_range_struct {
	uvm_va_space_t *va_space;
} uvm_va_range_t;

typedef struct uvm_va_range_managed_struct {
	uvm_va_range_t va_range;
} uvm_va_range_managed_t;

typedef struct uvm_va_block_struct {
	struct kref kref;
	struct mutex lock;
	uvm_va_range_managed_t *managed_range;
	NvU64 start;
	NvU64 end;
	/* simulation only */
	uvm_va_range_managed_t range;    /* one managed range per block keeps ownership simple */
	bool on_gpu;
	struct list_head lru;
} uvm_va_block_t;

typedef struct uvm_fault_buffer_entry_struct {
	NvU64 fault_address;
	NvU64 timestamp;
	struct { NvU64 address; NvU32 aperture; } instance_ptr;
	NvU32 fault_source;
	uvm_fault_type_t fault_type: 6;
	uvm_fault_access_type_t fault_access_type: 4;
	uvm_va_space_t *va_space;
	uvm_gpu_t *gpu;
	bool is_fatal: 1;
	bool filtered: 1;
	NvU32 access_type_mask;
	NvU16 num_instances;
} uvm_fault_buffer_entry_t;

typedef struct uvm_fault_service_batch_context_struct {
	uvm_fault_buffer_entry_t *fault_cache;
	uvm_fault_buffer_entry_t **ordered_fault_cache;
	void *utlbs;
	NvU32 max_utlb_id;
	NvU32 num_cached_faults;
	NvU32 num_coalesced_faults;
	uvm_va_space_t *fatal_va_space;
	uvm_gpu_t *fatal_gpu;
	bool has_throttled_faults;
	NvU32 num_invalid_prefetch_faults;
	NvU32 num_duplicate_faults;
	NvU32 num_replays;
	NvU32 batch_id;
	uvm_fault_buffer_entry_t *last_fault;
} uvm_fault_service_batch_context_t;

typedef struct uvm_gpu_chunk_struct { NvU64 address; uvm_va_block_t *va_block; } uvm_gpu_chunk_t;
typedef struct uvm_gpu_root_chunk_struct { uvm_gpu_chunk_t chunk; } uvm_gpu_root_chunk_t;
typedef struct uvm_pmm_gpu_struct { uvm_gpu_t *gpu; } uvm_pmm_gpu_t;

static unsigned int capacity_blocks = 64;
module_param(capacity_blocks, uint, 0644);
MODULE_PARM_DESC(capacity_blocks, "simulated GPU memory in 2 MiB chunks");

static unsigned long long stat_hits, stat_faults, stat_batches, stat_migrations, stat_evictions, stat_commands;
module_param_named(faults, stat_faults, ullong, 0444);
module_param_named(hits, stat_hits, ullong, 0444);
module_param_named(batches, stat_batches, ullong, 0444);
module_param_named(migrations, stat_migrations, ullong, 0444);
module_param_named(evictions, stat_evictions, ullong, 0444);
module_param_named(commands, stat_commands, ullong, 0444);
static unsigned long long stat_ioctls;
module_param_named(ioctls, stat_ioctls, ullong, 0444);

/* the simulated GPU's UUID (fixed): "uvm_sim GPU0" + 1 */
static const u8 sim_gpu_uuid[16] = { 0x75, 0x76, 0x6d, 0x5f, 0x73, 0x69, 0x6d, 0x20,
				     0x47, 0x50, 0x55, 0x30, 0x00, 0x00, 0x00, 0x01 };
static int get_gpu_uuid(char *buf, const struct kernel_param *kp)
{
	return sysfs_emit(buf, "GPU-%pUb\n", sim_gpu_uuid);
}
static const struct kernel_param_ops gpu_uuid_ops = { .get = get_gpu_uuid };
module_param_cb(gpu_uuid, &gpu_uuid_ops, NULL, 0444);
MODULE_PARM_DESC(gpu_uuid, "the simulated GPU's UUID (UVM_MIGRATE destination), as nvidia-smi prints one");

static DEFINE_MUTEX(sim_lock);          /* serialises servicing, migration and registration */
static LIST_HEAD(sim_lru);              /* GPU-resident blocks, oldest arrival first */
static unsigned int sim_resident;
static uvm_parent_gpu_t sim_parent_gpu = { .name = "uvm_sim GPU0", .id = { 1 } };
static uvm_gpu_t sim_gpu = { .parent = &sim_parent_gpu, .id = { 1 } };
static uvm_pmm_gpu_t sim_pmm = { .gpu = &sim_gpu };
static uvm_fault_service_batch_context_t sim_batch;
static uvm_fault_buffer_entry_t sim_cache[UVM_SIM_BATCH];
static uvm_fault_buffer_entry_t *sim_ordered[UVM_SIM_BATCH];
static uvm_page_mask_t sim_page_mask;

/* ---- the functions the probes attach to (global + noinline so they exist under these names) ---- */

noinline int uvm_va_block_make_resident(uvm_va_block_t *va_block, void *va_block_retry, void *va_block_context,
					uvm_processor_id_t dest_id, uvm_va_block_region_t region,
					const uvm_page_mask_t *page_mask, const uvm_page_mask_t *prefetch_page_mask,
					uvm_make_resident_cause_t cause)
{
	stat_migrations++;
	if (dest_id.val != 0 && !va_block->on_gpu) {
		va_block->on_gpu = true;
		list_add_tail(&va_block->lru, &sim_lru);
		sim_resident++;
	} else if (dest_id.val == 0 && va_block->on_gpu) {
		va_block->on_gpu = false;
		list_del_init(&va_block->lru);
		sim_resident--;
	}
	barrier();
	return 0;
}

noinline int uvm_va_block_evict_chunks(uvm_va_block_t *va_block, uvm_gpu_t *gpu, uvm_gpu_root_chunk_t *root_chunk,
				       void *tracker)
{
	stat_evictions++;
	if (va_block->on_gpu) {
		va_block->on_gpu = false;
		list_del_init(&va_block->lru);
		sim_resident--;
	}
	barrier();
	return 0;
}

noinline int evict_root_chunk(uvm_pmm_gpu_t *pmm, uvm_gpu_root_chunk_t *root_chunk, int pmm_context)
{
	return uvm_va_block_evict_chunks(root_chunk->chunk.va_block, pmm->gpu, root_chunk, NULL);
}

static void make_room(void)
{
	while (sim_resident >= capacity_blocks && !list_empty(&sim_lru)) {
		uvm_va_block_t *victim = list_first_entry(&sim_lru, uvm_va_block_t, lru);
		uvm_gpu_root_chunk_t root = { .chunk = { .address = 0, .va_block = victim } };

		evict_root_chunk(&sim_pmm, &root, 0);
	}
}

static uvm_va_block_t *block_get(uvm_va_space_t *vs, NvU64 addr, bool create)
{
	unsigned long idx = addr >> BLOCK_SHIFT;
	uvm_va_block_t *b = xa_load(&vs->blocks, idx);

	if (b || !create)
		return b;
	b = kzalloc(sizeof(*b), GFP_KERNEL);
	if (!b)
		return NULL;
	kref_init(&b->kref);
	mutex_init(&b->lock);
	b->range.va_range.va_space = vs;
	b->managed_range = &b->range;
	b->start = (NvU64)idx << BLOCK_SHIFT;
	b->end = b->start + (1ULL << BLOCK_SHIFT) - 1;
	INIT_LIST_HEAD(&b->lru);
	if (xa_err(xa_store(&vs->blocks, idx, b, GFP_KERNEL))) {
		kfree(b);
		return NULL;
	}
	return b;
}

/* the range was freed: the block goes (no write-back, no probe event) until touched again */
static void block_free(uvm_va_space_t *vs, NvU64 addr)
{
	unsigned long idx = addr >> BLOCK_SHIFT;
	uvm_va_block_t *b = xa_erase(&vs->blocks, idx);

	if (b) {
		if (b->on_gpu) {
			list_del(&b->lru);
			sim_resident--;
		}
		kfree(b);
	}
	xa_store(&vs->freed, idx, xa_mk_value(1), GFP_KERNEL);
}

static void block_to_gpu(uvm_va_block_t *b, uvm_va_block_region_t region, uvm_make_resident_cause_t cause)
{
	if (!b->on_gpu)
		make_room();
	uvm_va_block_make_resident(b, NULL, NULL, (uvm_processor_id_t){ sim_gpu.id.val }, region, &sim_page_mask,
				   NULL, cause);
}

/* translate instance pointers to va_spaces and count distinct pages (as the driver does) */
noinline int preprocess_fault_batch(uvm_parent_gpu_t *parent_gpu, uvm_fault_service_batch_context_t *batch_context)
{
	NvU32 i, n = 0;

	for (i = 0; i < batch_context->num_cached_faults; i++) {
		uvm_fault_buffer_entry_t *f = &batch_context->fault_cache[i];

		f->va_space = (uvm_va_space_t *)(unsigned long)f->instance_ptr.address;
		f->gpu = &sim_gpu;
		f->num_instances = 1;
		if (n && batch_context->ordered_fault_cache[n - 1]->va_space == f->va_space &&
		    (batch_context->ordered_fault_cache[n - 1]->fault_address >> PAGE_SHIFT_4K) ==
		    (f->fault_address >> PAGE_SHIFT_4K)) {
			batch_context->ordered_fault_cache[n - 1]->num_instances++;
			batch_context->num_duplicate_faults++;
			continue;
		}
		batch_context->ordered_fault_cache[n++] = f;
	}
	batch_context->num_coalesced_faults = n;
	barrier();
	return 0;
}

noinline int service_fault_batch(uvm_parent_gpu_t *parent_gpu, fault_service_mode_t service_mode,
				 uvm_fault_service_batch_context_t *batch_context)
{
	NvU32 i = 0;

	while (i < batch_context->num_coalesced_faults) {
		uvm_fault_buffer_entry_t *f = batch_context->ordered_fault_cache[i];
		NvU64 blk = f->fault_address >> BLOCK_SHIFT;
		uvm_va_block_region_t region;
		uvm_va_block_t *b;
		NvU32 j = i;
		NvU16 lo = PAGES_PER_BLOCK - 1, hi = 0;

		/* faults of one block in a row are serviced together, as the driver does */
		while (j < batch_context->num_coalesced_faults) {
			uvm_fault_buffer_entry_t *g = batch_context->ordered_fault_cache[j];
			NvU16 page = (g->fault_address >> PAGE_SHIFT_4K) & (PAGES_PER_BLOCK - 1);

			if (g->va_space != f->va_space || (g->fault_address >> BLOCK_SHIFT) != blk)
				break;
			lo = min(lo, page);
			hi = max(hi, page);
			j++;
		}
		i = j;
		b = block_get(f->va_space, f->fault_address, true);
		if (!b)
			return -ENOMEM;
		region.first = lo;
		region.outer = hi + 1;
		block_to_gpu(b, region, UVM_MAKE_RESIDENT_CAUSE_REPLAYABLE_FAULT);
	}
	batch_context->num_replays++;
	barrier();
	return 0;
}

noinline int uvm_parent_gpu_service_replayable_faults(uvm_parent_gpu_t *parent_gpu)
{
	int ret = preprocess_fault_batch(parent_gpu, &sim_batch);

	if (!ret)
		ret = service_fault_batch(parent_gpu, FAULT_SERVICE_MODE_REGULAR, &sim_batch);
	return ret;
}

/* ---- the fault generator: /dev/uvm_sim ---- */

static int sim_open(struct inode *inode, struct file *file)
{
	uvm_va_space_t *vs = kzalloc(sizeof(*vs), GFP_KERNEL);

	if (!vs)
		return -ENOMEM;
	init_rwsem(&vs->lock);
	spin_lock_init(&vs->va_space_mm.lock);
	mmgrab(current->mm);
	vs->va_space_mm.mm = current->mm;
	vs->pid = current->tgid;
	xa_init(&vs->blocks);
	xa_init(&vs->freed);
	file->private_data = vs;
	return 0;
}

static int sim_release(struct inode *inode, struct file *file)
{
	uvm_va_space_t *vs = file->private_data;
	uvm_va_block_t *b;
	unsigned long idx;

	mutex_lock(&sim_lock);
	xa_for_each(&vs->blocks, idx, b) {
		if (b->on_gpu) {
			list_del(&b->lru);
			sim_resident--;
		}
		kfree(b);
	}
	xa_destroy(&vs->blocks);
	xa_destroy(&vs->freed);
	mutex_unlock(&sim_lock);
	mmdrop(vs->va_space_mm.mm);
	kfree(vs);
	return 0;
}

static ssize_t sim_write(struct file *file, const char __user *buf, size_t len, loff_t *off)
{
	uvm_va_space_t *vs = file->private_data;
	struct uvm_sim_fault in[32];
	size_t n = len / sizeof(in[0]), done = 0;
	int ret = 0;

	if (!n || n > (1u << 20))
		return -EINVAL;
	if (vs->mm_fd)
		return -EBADFD;
	mutex_lock(&sim_lock);
	while (done < n && !ret) {
		size_t k = min_t(size_t, n - done, ARRAY_SIZE(in)), i;

		if (copy_from_user(in, buf + done * sizeof(in[0]), k * sizeof(in[0]))) {
			ret = -EFAULT;
			break;
		}
		for (i = 0; i < k; i++) {
			uvm_va_block_t *res = block_get(vs, in[i].addr, false);
			uvm_fault_buffer_entry_t *f;

			if (in[i].access == UVM_SIM_ACCESS_FREE) {
				block_free(vs, in[i].addr);
				continue;
			}
			xa_erase(&vs->freed, in[i].addr >> BLOCK_SHIFT);   /* touched: managed again */
			if (res && res->on_gpu) {   /* resident: the access does not fault */
				stat_hits++;
				continue;
			}
			f = &sim_cache[sim_batch.num_cached_faults++];

			memset(f, 0, sizeof(*f));
			f->fault_address = in[i].addr & ~0xfffULL;
			f->timestamp = ktime_get_ns();
			f->instance_ptr.address = (unsigned long)vs;
			f->fault_access_type = in[i].access < UVM_FAULT_ACCESS_TYPE_COUNT ? in[i].access : 1;
			f->fault_type = f->fault_access_type == UVM_FAULT_ACCESS_TYPE_WRITE ? UVM_FAULT_TYPE_WRITE
											     : UVM_FAULT_TYPE_INVALID_PTE;
			stat_faults++;
			if (sim_batch.num_cached_faults == UVM_SIM_BATCH) {
				sim_batch.batch_id++;
				stat_batches++;
				ret = uvm_parent_gpu_service_replayable_faults(&sim_parent_gpu);
				sim_batch.num_cached_faults = 0;
				sim_batch.num_duplicate_faults = 0;
			}
		}
		done += k;
	}
	if (!ret && sim_batch.num_cached_faults) {   /* the last, partial batch */
		sim_batch.batch_id++;
		stat_batches++;
		ret = uvm_parent_gpu_service_replayable_faults(&sim_parent_gpu);
		sim_batch.num_cached_faults = 0;
		sim_batch.num_duplicate_faults = 0;
	}
	mutex_unlock(&sim_lock);
	return ret ? ret : (ssize_t)(n * sizeof(in[0]));
}


static const struct file_operations sim_fops;

/* ---- the driver's ioctls that kmod/umctl issues (kmod/umctl/uvm_abi.h) ---- */

/* uvm_api_range_invalid() + "a managed range": 0 or NV_ERR_INVALID_ADDRESS */
static NvU32 range_check(uvm_va_space_t *vs, NvU64 base, NvU64 length)
{
	unsigned long first, last;

	if (!IS_ALIGNED(base, PAGE_SIZE) || !IS_ALIGNED(length, PAGE_SIZE) || !base || !length || base + length < base ||
	    base + length > (1ULL << 47))
		return UMCTL_NV_ERR_INVALID_ADDRESS;
	first = base >> BLOCK_SHIFT;
	last = (base + length - 1) >> BLOCK_SHIFT;
	if (xa_find(&vs->freed, &first, last, XA_PRESENT))
		return UMCTL_NV_ERR_INVALID_ADDRESS;
	return UMCTL_NV_OK;
}

/* each block of [base, base + length) with the page region the range covers in it */
#define for_each_block_region(a, lo, hi, region, base, length)                                       \
	for (a = (base) & ~((1ULL << BLOCK_SHIFT) - 1);                                              \
	     a < (base) + (length) && (lo = max(a, (NvU64)(base)),                                   \
				       hi = min(a + (1ULL << BLOCK_SHIFT), (NvU64)(base) + (length)),  \
				       region.first = (lo - a) >> PAGE_SHIFT_4K,                      \
				       region.outer = (hi - a + 4095) >> PAGE_SHIFT_4K, 1);           \
	     a += 1ULL << BLOCK_SHIFT)

static NvU32 sim_migrate(uvm_va_space_t *vs, const struct umctl_uvm_migrate_params *p)
{
	static const u8 cpu[16];
	uvm_va_block_region_t region;
	bool to_gpu;
	NvU64 a, lo, hi;
	NvU32 st = range_check(vs, p->base, p->length);

	if (st)
		return st;
	if (p->flags || p->semaphoreAddress || p->semaphorePayload)
		return UMCTL_NV_ERR_INVALID_ARGUMENT;   /* async migration and semaphores: not simulated */
	if (!memcmp(p->destinationUuid.uuid, sim_gpu_uuid, 16))
		to_gpu = true;
	else if (!memcmp(p->destinationUuid.uuid, cpu, 16))
		to_gpu = false;
	else
		return UMCTL_NV_ERR_INVALID_DEVICE;
	stat_commands++;
	for_each_block_region(a, lo, hi, region, p->base, p->length) {
		uvm_va_block_t *b = block_get(vs, a, to_gpu);

		if (!b)
			continue;
		if (to_gpu)
			block_to_gpu(b, region, UVM_MAKE_RESIDENT_CAUSE_API_MIGRATE);
		else if (b->on_gpu)   /* to the CPU (processor id 0) */
			uvm_va_block_make_resident(b, NULL, NULL, (uvm_processor_id_t){ 0 }, region, &sim_page_mask,
						   NULL, UVM_MAKE_RESIDENT_CAUSE_API_MIGRATE);
	}
	return UMCTL_NV_OK;
}

static NvU32 sim_discard(uvm_va_space_t *vs, const struct umctl_uvm_discard_params *p)
{
	uvm_va_block_region_t region;
	NvU64 a, lo, hi;
	NvU32 st = range_check(vs, p->base, p->length);

	if (st)
		return st;
	if (p->flags & ~UMCTL_UVM_DISCARD_FLAGS_UNMAP)
		return UMCTL_NV_ERR_INVALID_ARGUMENT;
	stat_commands++;
	for_each_block_region(a, lo, hi, region, p->base, p->length) {
		uvm_va_block_t *b = block_get(vs, a, false);

		if (b && b->on_gpu)
			uvm_va_block_evict_chunks(b, &sim_gpu, NULL, NULL);
	}
	return UMCTL_NV_OK;
}

static NvU32 sim_mm_initialize(uvm_va_space_t *vs, const struct umctl_uvm_mm_initialize_params *p)
{
	struct fd va = fdget(p->uvmFd);
	NvU32 st = UMCTL_NV_ERR_INVALID_ARGUMENT;

	if (va.file && va.file->f_op == &sim_fops && va.file->private_data != vs &&
	    !((uvm_va_space_t *)va.file->private_data)->mm_fd) {
		vs->mm_fd = true;
		st = UMCTL_NV_OK;
	}
	fdput(va);
	return st;
}

/* the driver's calling convention: params copied in, rmStatus set, copied back; ioctl returns 0 */
#define SIM_IOCTL(type, fn)                                                              \
	do {                                                                             \
		type p;                                                                  \
		if (copy_from_user(&p, (void __user *)arg, sizeof(p)))                   \
			return -EFAULT;                                                  \
		mutex_lock(&sim_lock);                                                   \
		stat_ioctls++;                                                           \
		p.rmStatus = vs->mm_fd ? UMCTL_NV_ERR_ILLEGAL_ACTION : fn(vs, &p);       \
		mutex_unlock(&sim_lock);                                                 \
		return copy_to_user((void __user *)arg, &p, sizeof(p)) ? -EFAULT : 0;    \
	} while (0)

static long sim_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	uvm_va_space_t *vs = file->private_data;

	switch (cmd) {
	case UMCTL_UVM_MIGRATE:
		SIM_IOCTL(struct umctl_uvm_migrate_params, sim_migrate);
	case UMCTL_UVM_DISCARD:
		SIM_IOCTL(struct umctl_uvm_discard_params, sim_discard);
	case UMCTL_UVM_MM_INITIALIZE:
		SIM_IOCTL(struct umctl_uvm_mm_initialize_params, sim_mm_initialize);
	}
	return -ENOTTY;
}

static const struct file_operations sim_fops = {
	.owner = THIS_MODULE,
	.open = sim_open,
	.release = sim_release,
	.write = sim_write,
	.unlocked_ioctl = sim_ioctl,
	.compat_ioctl = sim_ioctl,
};

static struct miscdevice sim_dev = { .minor = MISC_DYNAMIC_MINOR, .name = "uvm_sim", .fops = &sim_fops,
				     .mode = 0666 };

static int __init uvm_sim_init(void)
{
	UMCTL_UVM_ABI_CHECK_SIZES();
	sim_batch.fault_cache = sim_cache;
	sim_batch.ordered_fault_cache = sim_ordered;
	bitmap_fill(sim_page_mask.bitmap, PAGES_PER_BLOCK);
	return misc_register(&sim_dev);
}

static void __exit uvm_sim_exit(void)
{
	misc_deregister(&sim_dev);
}

module_init(uvm_sim_init);
module_exit(uvm_sim_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("umctl test bed: simulated nvidia_uvm replayable-fault path (test only)");
