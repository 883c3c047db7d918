// SPDX-License-Identifier: GPL-2.0
/*
 * umctl: carries out a UVM controller's commands (PREFETCH, PREEVICT, INVALIDATE of a range of a
 * target process) received over generic netlink, after checking that the sender may steer that
 * process; the result of every accepted command goes back to the sender (and to the "events"
 * multicast group).
 *
 * Contexts:
 *   - doit handlers run in the SENDER's process context (its sendmsg), with the genl mutex held:
 *     they validate (the family policy has already rejected malformed attributes, strictly), check
 *     permission and the rate limit, and push onto a bounded queue. They never execute.
 *   - the worker (an ordered workqueue, process context, may sleep) pops commands and executes
 *     them through the backend, then sends the RESULT message (GFP_KERNEL).
 *   - backend (in the worker): the nvidia-uvm ioctl ABI itself, on the TARGET's own va_space
 *     file. Under the target's task_lock, iterate_fd() finds an open file whose dentry is named
 *     `uvm_dev` ("nvidia-uvm"; "uvm_sim" in the test bed) and whose file_operations belong to
 *     module `uvm_module` ("nvidia_uvm"), and takes a reference (the callback runs under
 *     files->file_lock: it only compares and get_file()s). Outside those locks the worker adopts
 *     an mm it holds with kthread_use_mm() — the command sender's (mmgrab'ed in the genl handler,
 *     which runs in the sender's context), or for kfunc commands the mm of whoever sent
 *     FASTPATH_ENABLE — maps a scratch page there (vm_mmap, per command, unmapped after), copies
 *     UVM_MIGRATE / UVM_DISCARD parameters into it and calls the file's ioctl; the driver copies
 *     them in and back as from any caller, and rmStatus says what it did. A file answering
 *     NV_ERR_ILLEGAL_ACTION is not a va_space (the real driver's per-process mm fd): the next
 *     matching file is tried. The driver works on the va_space's own mm (va_space_mm), not on
 *     the borrowed one, see docs/guide/kernel.md. PREFETCH = UVM_MIGRATE to the destination GPU's UUID,
 *     PREEVICT = UVM_MIGRATE to the CPU (all-zero UUID; or to the DST GPU), INVALIDATE =
 *     UVM_DISCARD (flags UNMAP). A DST index becomes a UUID through the request's DST_UUID or
 *     the module's gpu_uuids table (the only way for kfunc commands).
 *
 *   - the kfunc bpf_umctl_enqueue runs in the context of the BPF tracing program that calls it (the
 *     fast path: fentry on the driver's service_fault_batch, i.e. the fault-servicing thread, under
 *     RCU with migration disabled): it never sleeps, only pushes onto the same bounded queue under
 *     a spinlock with irqs off, for targets a controller enabled with FASTPATH_ENABLE (checked in
 *     that sender's context like a command); results go to the "events" group only.
 *
 * Permission (checked per command, in the sender's context): the sender has CAP_SYS_PTRACE, or
 * its uid owns the target (real, effective and saved uid) and the target is dumpable — what
 * ptrace_may_access(PTRACE_MODE_ATTACH_REALCREDS) grants without LSM hooks (it is not exported to
 * modules) — or the admin policy allows the target: its pid is in allow_pids or its uid in
 * allow_uids (module parameters, root-writable). rate_limit bounds accepted commands per second.
 *
 * Counters: /sys/module/umctl/parameters/{received,accepted,rejected_*,executed,ok,failed,...}.
 */
#include <linux/module.h>
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/sched.h>
#include <linux/sched/coredump.h>
#include <linux/sched/mm.h>
#include <linux/cred.h>
#include <linux/pid.h>
#include <linux/capability.h>
#include <linux/workqueue.h>
#include <linux/spinlock.h>
#include <linux/ktime.h>
#include <linux/rcupdate.h>
#include <linux/preempt.h>
#include <linux/bpf.h>
#include <linux/btf.h>
#include <linux/btf_ids.h>
#include <net/genetlink.h>
#include <net/net_namespace.h>
#include <linux/fs.h>
#include <linux/file.h>
#include <linux/fdtable.h>
#include <linux/dcache.h>
#include <linux/mman.h>
#include <linux/kthread.h>
#include <linux/uaccess.h>
#include <linux/string.h>
#include "umctl_genl.h"
#include "uvm_abi.h"

static unsigned int queue_depth = 4096;
module_param(queue_depth, uint, 0444);
MODULE_PARM_DESC(queue_depth, "commands waiting for execution at most (more are refused with ENOSPC)");
static unsigned int rate_limit;
module_param(rate_limit, uint, 0644);
MODULE_PARM_DESC(rate_limit, "accepted commands per second at most (0: no limit; more: EBUSY)");
static int allow_pids[16];
static int n_allow_pids;
module_param_array(allow_pids, int, &n_allow_pids, 0644);
MODULE_PARM_DESC(allow_pids, "target pids any sender may steer (admin policy)");
static unsigned int allow_uids[16];
static int n_allow_uids;
module_param_array(allow_uids, uint, &n_allow_uids, 0644);
MODULE_PARM_DESC(allow_uids, "target uids any sender may steer (admin policy)");

/* the UVM file the backend looks for in the target's file table */
static char uvm_dev[64] = "nvidia-uvm";
module_param_string(uvm_dev, uvm_dev, sizeof(uvm_dev), 0444);
MODULE_PARM_DESC(uvm_dev, "name of the UVM device file in the target's file table (test bed: uvm_sim)");
static char uvm_module[MODULE_NAME_LEN] = "nvidia_uvm";
module_param_string(uvm_module, uvm_module, sizeof(uvm_module), 0444);
MODULE_PARM_DESC(uvm_module, "module that must own that file's operations (empty: not checked; test bed: uvm_sim)");

/* GPU index (DST) -> processor UUID, for commands without DST_UUID (kfunc commands always) */
static u8 gpu_uuid_tab[UMCTL_MAX_GPUS][16];
static unsigned int n_gpu_uuids;
static DEFINE_SPINLOCK(uuid_lock);

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" or 32 hex digits (dashes ignored) */
static int parse_uuid(const char *s, size_t n, u8 out[16])
{
	unsigned int i = 0;

	if (n >= 4 && !strncasecmp(s, "GPU-", 4)) {
		s += 4;
		n -= 4;
	}
	for (; n; s++, n--) {
		int h;

		if (*s == '-')
			continue;
		h = hex_to_bin(*s);
		if (h < 0 || i >= 32)
			return -EINVAL;
		if (i & 1)
			out[i / 2] |= h;
		else
			out[i / 2] = h << 4;
		i++;
	}
	return i == 32 ? 0 : -EINVAL;
}

static int set_gpu_uuids(const char *val, const struct kernel_param *kp)
{
	u8 (*tab)[16] = kcalloc(UMCTL_MAX_GPUS, 16, GFP_KERNEL);
	unsigned int n = 0;
	const char *p = val;
	size_t len = strlen(val);

	if (!tab)
		return -ENOMEM;
	while (len && (val[len - 1] == '\n' || val[len - 1] == ' '))
		len--;
	while (len && p < val + len) {
		const char *end = memchr(p, ',', val + len - p);
		size_t k = end ? end - p : val + len - p;

		if (n >= UMCTL_MAX_GPUS || parse_uuid(p, k, tab[n])) {
			kfree(tab);
			return -EINVAL;
		}
		n++;
		p += k + 1;
	}
	spin_lock(&uuid_lock);
	memcpy(gpu_uuid_tab, tab, sizeof(gpu_uuid_tab));
	n_gpu_uuids = n;
	spin_unlock(&uuid_lock);
	kfree(tab);
	return 0;
}

static int get_gpu_uuids(char *buf, const struct kernel_param *kp)
{
	unsigned int i;
	int len = 0;

	spin_lock(&uuid_lock);
	for (i = 0; i < n_gpu_uuids; i++)
		len += sysfs_emit_at(buf, len, "%sGPU-%pUb", i ? "," : "", gpu_uuid_tab[i]);
	spin_unlock(&uuid_lock);
	len += sysfs_emit_at(buf, len, "\n");
	return len;
}

static const struct kernel_param_ops gpu_uuids_ops = { .set = set_gpu_uuids, .get = get_gpu_uuids };
module_param_cb(gpu_uuids, &gpu_uuids_ops, NULL, 0644);
MODULE_PARM_DESC(gpu_uuids, "UUIDs of GPU 0, 1, ... (comma-separated GPU-... strings): DST index -> UVM_MIGRATE destination");

static bool gpu_uuid(s32 idx, u8 out[16])
{
	bool ok;

	spin_lock(&uuid_lock);
	ok = idx >= 0 && idx < n_gpu_uuids;
	if (ok)
		memcpy(out, gpu_uuid_tab[idx], 16);
	spin_unlock(&uuid_lock);
	return ok;
}

enum { OP_PREFETCH, OP_PREEVICT, OP_INVALIDATE };

enum { C_RECEIVED, C_ACCEPTED, C_INVALID, C_EPERM, C_ESRCH, C_EBUSY, C_ENOSPC, C_EXECUTED, C_OK, C_FAILED,
       C_RESULT_LOST, C_FP_ENQUEUED, C_FP_REFUSED, C_FP_INVALID, C_FP_DROPPED,
       C_UVM_FD_SKIPPED, C_NO_UVM_FILE, C_N };
static atomic64_t cnt[C_N];
static int get_cnt(char *buf, const struct kernel_param *kp)
{
	return sysfs_emit(buf, "%lld\n", (long long)atomic64_read(&cnt[(long)kp->arg]));
}
static const struct kernel_param_ops cnt_ops = { .get = get_cnt };
#define COUNTER(name, idx) module_param_cb(name, &cnt_ops, (void *)(long)(idx), 0444)
COUNTER(received, C_RECEIVED);
COUNTER(accepted, C_ACCEPTED);
COUNTER(rejected_invalid, C_INVALID);
COUNTER(rejected_eperm, C_EPERM);
COUNTER(rejected_esrch, C_ESRCH);
COUNTER(rejected_ebusy, C_EBUSY);
COUNTER(rejected_enospc, C_ENOSPC);
COUNTER(executed, C_EXECUTED);
COUNTER(ok, C_OK);
COUNTER(failed, C_FAILED);
COUNTER(results_lost, C_RESULT_LOST);
COUNTER(fastpath_enqueued, C_FP_ENQUEUED);   /* commands queued by the kfunc */
COUNTER(fastpath_refused, C_FP_REFUSED);     /* kfunc calls for a pid without the fast path enabled */
COUNTER(fastpath_invalid, C_FP_INVALID);     /* kfunc calls with a bad range or destination */
COUNTER(fastpath_dropped, C_FP_DROPPED);     /* kfunc calls refused for room (queue full, rate, NMI) */
COUNTER(uvm_fd_skipped, C_UVM_FD_SKIPPED);   /* matching files that were no va_space (NV_ERR_ILLEGAL_ACTION) */
COUNTER(no_uvm_file, C_NO_UVM_FILE);         /* commands whose target had no va_space file */
static bool fastpath_kfunc;
module_param(fastpath_kfunc, bool, 0444);
MODULE_PARM_DESC(fastpath_kfunc, "bpf_umctl_enqueue is registered for tracing programs (needs module BTF)");

struct umctl_item {
	u64 addr, len, cmd_id, t_submit;
	s64 exec_id;
	s32 dst;
	pid_t pid;
	u32 op;         /* OP_* */
	u32 portid;     /* the submitter's netlink port; 0: queued by the kfunc (results multicast only) */
	struct net *net;   /* referenced when portid is 0 (the enabling controller's netns) */
	/* genl commands only (the kfunc's come from the fast-path slot at execution): */
	struct pid *tpid;          /* the target, referenced (resolved in the sender's pid namespace) */
	struct mm_struct *mm;      /* the sender's mm, mmgrab'ed: where the ioctl parameters go */
	bool has_uuid;
	u8 uuid[16];               /* DST_UUID of the request */
};

static struct umctl_item *ring;
static unsigned int ring_head, ring_tail;   /* head: next to pop, tail: next free; under ring_lock */
static DEFINE_SPINLOCK(ring_lock);
static struct workqueue_struct *umctl_wq;
static void umctl_work_fn(struct work_struct *w);
static DECLARE_WORK(umctl_work, umctl_work_fn);
static DEFINE_SPINLOCK(rate_lock);
static u64 rate_window_start;
static unsigned int rate_count;

static struct genl_family umctl_family;

static const struct nla_policy umctl_policy[UMCTL_A_MAX + 1] = {
	[UMCTL_A_PID] = NLA_POLICY_MIN(NLA_U32, 1),
	[UMCTL_A_ADDR] = { .type = NLA_U64 },
	[UMCTL_A_LEN] = { .type = NLA_U64 },
	[UMCTL_A_DST] = NLA_POLICY_RANGE(NLA_S32, -1, 63),
	[UMCTL_A_EXEC_ID] = { .type = NLA_S64 },
	[UMCTL_A_CMD_ID] = { .type = NLA_U64 },
	/* result attributes are never accepted from user space */
	[UMCTL_A_STATUS] = { .type = NLA_REJECT },
	[UMCTL_A_BYTES] = { .type = NLA_REJECT },
	[UMCTL_A_LATENCY_NS] = { .type = NLA_REJECT },
	[UMCTL_A_ERRNO] = { .type = NLA_REJECT },
	[UMCTL_A_PAD] = { .type = NLA_REJECT },
	[UMCTL_A_DST_UUID] = NLA_POLICY_EXACT_LEN(16),
	[UMCTL_A_NV_STATUS] = { .type = NLA_REJECT },
};

static const struct genl_multicast_group umctl_mcgrps[] = {
	{ .name = UMCTL_MCGRP_EVENTS },
};

static bool uid_in(kuid_t uid)
{
	int i;

	for (i = 0; i < n_allow_uids && i < ARRAY_SIZE(allow_uids); i++)
		if (uid_eq(uid, make_kuid(&init_user_ns, allow_uids[i])))
			return true;
	return false;
}

/* may the sender (current) steer @task? see the header comment */
static bool may_steer(struct task_struct *task)
{
	const struct cred *me = current_cred(), *tcred;
	bool ok = false;
	int i;

	if (capable(CAP_SYS_PTRACE))
		return true;
	for (i = 0; i < n_allow_pids && i < ARRAY_SIZE(allow_pids); i++)
		if (allow_pids[i] == task->tgid)
			return true;
	rcu_read_lock();
	tcred = __task_cred(task);
	if (uid_in(tcred->uid)) {
		ok = true;
	} else if (uid_eq(me->uid, tcred->euid) && uid_eq(me->uid, tcred->suid) && uid_eq(me->uid, tcred->uid) &&
		   gid_eq(me->gid, tcred->egid) && gid_eq(me->gid, tcred->sgid) && gid_eq(me->gid, tcred->gid)) {
		struct mm_struct *mm;

		rcu_read_unlock();
		task_lock(task);
		mm = task->mm;
		ok = mm && get_dumpable(mm) == SUID_DUMP_USER;
		task_unlock(task);
		return ok;
	}
	rcu_read_unlock();
	return ok;
}

static bool rate_ok(void)
{
	unsigned int limit = READ_ONCE(rate_limit);
	u64 now = ktime_get_ns();
	unsigned long flags;
	bool ok;

	if (!limit)
		return true;
	spin_lock_irqsave(&rate_lock, flags);
	if (now - rate_window_start >= NSEC_PER_SEC) {
		rate_window_start = now;
		rate_count = 0;
	}
	ok = rate_count < limit;
	if (ok)
		rate_count++;
	spin_unlock_irqrestore(&rate_lock, flags);
	return ok;
}

/* the target exists and the sender (current) may steer it: 0, -ESRCH or -EPERM (counted).
 * On 0, *out (when given) holds a reference on the target's struct pid. */
static int check_target(pid_t nr, struct pid **out)
{
	struct task_struct *task;
	struct pid *pid;
	bool allowed;

	pid = find_get_pid(nr);
	task = pid ? get_pid_task(pid, PIDTYPE_TGID) : NULL;
	if (!task) {
		put_pid(pid);
		atomic64_inc(&cnt[C_ESRCH]);
		return -ESRCH;
	}
	allowed = may_steer(task);
	put_task_struct(task);
	if (!allowed) {
		put_pid(pid);
		atomic64_inc(&cnt[C_EPERM]);
		return -EPERM;
	}
	if (out)
		*out = pid;
	else
		put_pid(pid);
	return 0;
}

/* onto the bounded queue and kick the worker; -ENOSPC when full. Any context but NMI. */
static int push(const struct umctl_item *it)
{
	unsigned long flags;
	int ret = 0;

	spin_lock_irqsave(&ring_lock, flags);
	if (ring_tail - ring_head >= queue_depth) {
		ret = -ENOSPC;
	} else {
		ring[ring_tail % queue_depth] = *it;
		ring_tail++;
	}
	spin_unlock_irqrestore(&ring_lock, flags);
	if (!ret)
		queue_work(umctl_wq, &umctl_work);
	return ret;
}

static int umctl_submit(struct sk_buff *skb, struct genl_info *info, u32 op)
{
	struct nlattr **a = info->attrs;
	struct umctl_item it = {};
	int ret;

	atomic64_inc(&cnt[C_RECEIVED]);
	if (!a[UMCTL_A_PID] || !a[UMCTL_A_ADDR] || !a[UMCTL_A_LEN] ||
	    (op != OP_INVALIDATE && !a[UMCTL_A_DST])) {
		NL_SET_ERR_MSG(info->extack, "umctl: PID, ADDR, LEN (and DST to migrate) are required");
		atomic64_inc(&cnt[C_INVALID]);
		return -EINVAL;
	}
	it.pid = nla_get_u32(a[UMCTL_A_PID]);
	it.addr = nla_get_u64(a[UMCTL_A_ADDR]);
	it.len = nla_get_u64(a[UMCTL_A_LEN]);
	it.dst = a[UMCTL_A_DST] ? nla_get_s32(a[UMCTL_A_DST]) : -1;
	it.exec_id = a[UMCTL_A_EXEC_ID] ? nla_get_s64(a[UMCTL_A_EXEC_ID]) : -1;
	it.cmd_id = a[UMCTL_A_CMD_ID] ? nla_get_u64(a[UMCTL_A_CMD_ID]) : 0;
	it.op = op;
	if (a[UMCTL_A_DST_UUID]) {
		nla_memcpy(it.uuid, a[UMCTL_A_DST_UUID], sizeof(it.uuid));
		it.has_uuid = true;
	}
	if (!it.len || it.len > UMCTL_MAX_LEN || it.addr + it.len < it.addr || it.addr + it.len > (1ULL << 57) ||
	    (op == OP_PREFETCH && it.dst < 0)) {
		NL_SET_ERR_MSG(info->extack, "umctl: bad range or destination");
		atomic64_inc(&cnt[C_INVALID]);
		return -ERANGE;
	}
	if (!current->mm) {   /* a kernel socket: no mm for the ioctl parameters */
		atomic64_inc(&cnt[C_INVALID]);
		return -EINVAL;
	}
	ret = check_target(it.pid, &it.tpid);
	if (ret)
		return ret;
	if (!rate_ok()) {
		put_pid(it.tpid);
		atomic64_inc(&cnt[C_EBUSY]);
		return -EBUSY;
	}
	it.portid = info->snd_portid;
	it.net = genl_info_net(info);
	it.t_submit = ktime_get_ns();
	it.mm = current->mm;
	mmgrab(it.mm);
	ret = push(&it);
	if (ret) {
		put_pid(it.tpid);
		mmdrop(it.mm);
		atomic64_inc(&cnt[C_ENOSPC]);
		return ret;
	}
	atomic64_inc(&cnt[C_ACCEPTED]);
	return 0;
}

static int umctl_prefetch(struct sk_buff *skb, struct genl_info *info)
{
	return umctl_submit(skb, info, OP_PREFETCH);
}
static int umctl_preevict(struct sk_buff *skb, struct genl_info *info)
{
	return umctl_submit(skb, info, OP_PREEVICT);
}
static int umctl_invalidate(struct sk_buff *skb, struct genl_info *info)
{
	return umctl_submit(skb, info, OP_INVALIDATE);
}

/* ---- the fast path: BPF programs queue commands for targets a controller enabled ----
 *
 * FASTPATH_ENABLE(pid) runs in the sender's context with the same checks as a command
 * (check_target: may_steer); it records the target's struct pid (so a recycled pid number is not
 * mistaken for it), the sender's netns (where the results go, multicast) and the sender's mm
 * (mmgrab: the backend stages the kfunc commands' ioctl parameters there). The kfunc runs in
 * the calling BPF program's context — for the fast path an fentry program on the driver's
 * service_fault_batch, i.e. the fault-servicing thread with migration disabled under RCU — so it
 * never sleeps: a scan of FASTPATH_SLOTS entries under a spinlock, the rate limit, a push on the
 * bounded queue (spinlock, irqs off) and queue_work(). Refusals are counted and returned.
 */
struct fp_slot {
	pid_t nr;               /* 0: free */
	struct pid *pid;        /* referenced */
	struct net *net;        /* referenced */
	struct mm_struct *mm;   /* the enabling sender's, mmgrab'ed: where kfunc commands' ioctl parameters go */
};
static struct fp_slot fp_slots[UMCTL_FASTPATH_SLOTS];
static DEFINE_SPINLOCK(fp_lock);
static atomic64_t fp_seq;

/* empty @s into @old (released with fp_release once fp_lock is dropped) */
static void fp_clear(struct fp_slot *s, struct fp_slot *old)
{
	*old = *s;
	memset(s, 0, sizeof(*s));
}

static void fp_release(struct fp_slot *old)
{
	put_pid(old->pid);
	if (old->net)
		put_net(old->net);
	if (old->mm)
		mmdrop(old->mm);
	memset(old, 0, sizeof(*old));
}

/* for the worker: the enabled target @nr's struct pid (referenced) and the enabling sender's mm
 * (mmget, users held) — false when the fast path was disabled since or the sender's mm is gone */
static bool fp_resolve(pid_t nr, struct pid **pid, struct mm_struct **mm)
{
	bool ok = false;
	unsigned long flags;
	int i;

	spin_lock_irqsave(&fp_lock, flags);
	for (i = 0; i < ARRAY_SIZE(fp_slots); i++) {
		struct fp_slot *s = &fp_slots[i];

		if (s->nr == nr && s->mm && mmget_not_zero(s->mm)) {
			*pid = get_pid(s->pid);
			*mm = s->mm;
			ok = true;
			break;
		}
	}
	spin_unlock_irqrestore(&fp_lock, flags);
	return ok;
}

/* the netns (referenced) to report to when @nr is enabled and alive, else NULL */
static struct net *fp_lookup(pid_t nr)
{
	struct net *net = NULL;
	unsigned long flags;
	int i;

	rcu_read_lock();
	spin_lock_irqsave(&fp_lock, flags);
	for (i = 0; i < ARRAY_SIZE(fp_slots); i++) {
		if (fp_slots[i].nr == nr && pid_task(fp_slots[i].pid, PIDTYPE_TGID)) {
			net = get_net(fp_slots[i].net);
			break;
		}
	}
	spin_unlock_irqrestore(&fp_lock, flags);
	rcu_read_unlock();
	return net;
}

__diag_push();
__diag_ignore_all("-Wmissing-prototypes", "a kfunc: called from BPF programs, declared in BTF");
/**
 * bpf_umctl_enqueue - queue a migration of [@addr, @addr + @len) of process @pid to @dst
 * (a GPU index, 0..63: PREFETCH; -1: the CPU, PREEVICT), from a BPF tracing program.
 * Returns 0 when queued; -EPERM when the fast path is not enabled for @pid (or it exited),
 * -ERANGE for a bad range or destination, -ENOSPC / -EBUSY when the queue or the rate limit has
 * no room (and always in NMI). Never sleeps. The result is multicast on the "events" group with
 * CMD_ID = UMCTL_FASTPATH_CMD_ID | sequence.
 */
noinline int bpf_umctl_enqueue(u32 pid, u64 addr, u64 len, s32 dst)
{
	struct umctl_item it = {};
	struct net *net;
	int ret;

	if (!len || len > UMCTL_MAX_LEN || addr + len < addr || addr + len > (1ULL << 57) || dst < -1 || dst > 63 ||
	    !pid || pid > PID_MAX_LIMIT) {
		atomic64_inc(&cnt[C_FP_INVALID]);
		return -ERANGE;
	}
	if (in_nmi()) {
		atomic64_inc(&cnt[C_FP_DROPPED]);
		return -EBUSY;
	}
	net = fp_lookup(pid);
	if (!net) {
		atomic64_inc(&cnt[C_FP_REFUSED]);
		return -EPERM;
	}
	if (!rate_ok()) {
		put_net(net);
		atomic64_inc(&cnt[C_FP_DROPPED]);
		return -EBUSY;
	}
	it.pid = pid;
	it.addr = addr;
	it.len = len;
	it.dst = dst;
	it.op = dst >= 0 ? OP_PREFETCH : OP_PREEVICT;
	it.exec_id = -1;
	it.cmd_id = UMCTL_FASTPATH_CMD_ID | (u64)atomic64_inc_return(&fp_seq);
	it.portid = 0;
	it.net = net;
	it.t_submit = ktime_get_ns();
	ret = push(&it);
	if (ret) {
		put_net(net);
		atomic64_inc(&cnt[C_FP_DROPPED]);
		return ret;
	}
	atomic64_inc(&cnt[C_FP_ENQUEUED]);
	return 0;
}
__diag_pop();

BTF_SET8_START(umctl_kfunc_ids)
BTF_ID_FLAGS(func, bpf_umctl_enqueue)
BTF_SET8_END(umctl_kfunc_ids)

static const struct btf_kfunc_id_set umctl_kfunc_set = {
	.owner = THIS_MODULE,
	.set = &umctl_kfunc_ids,
};

static int umctl_fastpath(struct sk_buff *skb, struct genl_info *info, bool on)
{
	struct fp_slot old = {}, *free = NULL;
	struct pid *pid = NULL;
	bool found = false;
	unsigned long flags;
	pid_t nr;
	int i, ret;

	atomic64_inc(&cnt[C_RECEIVED]);
	if (!info->attrs[UMCTL_A_PID]) {
		NL_SET_ERR_MSG(info->extack, "umctl: PID is required");
		atomic64_inc(&cnt[C_INVALID]);
		return -EINVAL;
	}
	if (on && !current->mm) {   /* a kernel socket: no mm for the ioctl parameters */
		atomic64_inc(&cnt[C_INVALID]);
		return -EINVAL;
	}
	nr = nla_get_u32(info->attrs[UMCTL_A_PID]);
	ret = check_target(nr, on ? &pid : NULL);
	if (ret)
		return ret;
	if (on)
		mmgrab(current->mm);
	ret = on ? -ENOSPC : -ENOENT;
	spin_lock_irqsave(&fp_lock, flags);
	for (i = 0; i < ARRAY_SIZE(fp_slots); i++) {
		struct fp_slot *s = &fp_slots[i];

		if (s->nr == nr) {
			fp_clear(s, &old);
			free = s;
			found = true;
			break;
		}
		if (!free && (!s->nr || !pid_task(s->pid, PIDTYPE_TGID)))   /* free, or its target exited */
			free = s;
	}
	if (free && on) {
		if (free->nr && !found)
			fp_clear(free, &old);
		free->nr = nr;
		free->pid = pid;
		free->net = get_net(genl_info_net(info));
		free->mm = current->mm;   /* the reference taken above */
		pid = NULL;
		ret = 0;
	} else if (found) {
		ret = 0;
	}
	spin_unlock_irqrestore(&fp_lock, flags);
	if (on && ret)
		mmdrop(current->mm);
	put_pid(pid);
	fp_release(&old);
	if (!ret)
		atomic64_inc(&cnt[C_ACCEPTED]);
	return ret;
}

static int umctl_fastpath_enable(struct sk_buff *skb, struct genl_info *info)
{
	return umctl_fastpath(skb, info, true);
}
static int umctl_fastpath_disable(struct sk_buff *skb, struct genl_info *info)
{
	return umctl_fastpath(skb, info, false);
}

static void send_result(struct umctl_item *it, u32 status, u64 bytes, s32 err, u32 nv)
{
	struct sk_buff *skb = genlmsg_new(NLMSG_GOODSIZE, GFP_KERNEL), *mc;
	void *hdr;

	if (!skb)
		goto lost;
	hdr = genlmsg_put(skb, 0, 0, &umctl_family, 0, UMCTL_CMD_RESULT);
	if (!hdr ||
	    nla_put_u32(skb, UMCTL_A_PID, it->pid) ||
	    nla_put_u64_64bit(skb, UMCTL_A_CMD_ID, it->cmd_id, UMCTL_A_PAD) ||
	    nla_put_u64_64bit(skb, UMCTL_A_ADDR, it->addr, UMCTL_A_PAD) ||
	    nla_put_u64_64bit(skb, UMCTL_A_LEN, it->len, UMCTL_A_PAD) ||
	    nla_put_u32(skb, UMCTL_A_STATUS, status) ||
	    nla_put_u64_64bit(skb, UMCTL_A_BYTES, bytes, UMCTL_A_PAD) ||
	    nla_put_u64_64bit(skb, UMCTL_A_LATENCY_NS, ktime_get_ns() - it->t_submit, UMCTL_A_PAD) ||
	    nla_put_s32(skb, UMCTL_A_ERRNO, err) ||
	    nla_put_u32(skb, UMCTL_A_NV_STATUS, nv)) {
		nlmsg_free(skb);
		goto lost;
	}
	genlmsg_end(skb, hdr);
	if (!it->portid) {   /* queued by the kfunc: nobody to answer but the group */
		if (genl_has_listeners(&umctl_family, it->net, 0))
			genlmsg_multicast_netns(&umctl_family, it->net, skb, 0, 0, GFP_KERNEL);
		else
			nlmsg_free(skb);
		return;
	}
	if (genl_has_listeners(&umctl_family, it->net, 0)) {
		mc = skb_clone(skb, GFP_KERNEL);
		if (mc)
			genlmsg_multicast_netns(&umctl_family, it->net, mc, 0, 0, GFP_KERNEL);
	}
	if (genlmsg_unicast(it->net, skb, it->portid))   /* frees skb; fails when the sender is gone */
		goto lost;
	return;
lost:
	atomic64_inc(&cnt[C_RESULT_LOST]);
}

/* ---- the backend: the UVM ioctl ABI on the target's own va_space file ---- */

struct exec_out {
	u32 status;   /* UMCTL_ST_* */
	s32 err;      /* 0, or: ESRCH target gone, ENODEV no va_space file, ENXIO no such destination,
		       * ECANCELED the mm owner (controller) exited or the fast path was disabled,
		       * EFAULT NV_ERR_INVALID_ADDRESS, EIO another NV_STATUS; or the ioctl's own errno */
	u32 nv;       /* rmStatus of the ioctl that decided */
	u64 bytes;
};

/* iterate_fd() callback, under files->file_lock (a spinlock): compare and get_file() only */
static int match_uvm_file(const void *p, struct file *f, unsigned int fd)
{
	struct file **out = (struct file **)p;
	const struct module *owner = f->f_op ? f->f_op->owner : NULL;
	bool match;

	if (!f->f_op || !f->f_op->unlocked_ioctl || !S_ISCHR(file_inode(f)->i_mode))
		return 0;
	if (uvm_module[0] && (!owner || strcmp(owner->name, uvm_module)))
		return 0;
	rcu_read_lock();   /* the dentry's name may change under rename; old names are RCU-freed */
	match = !strcmp((const char *)READ_ONCE(f->f_path.dentry->d_name.name), uvm_dev);
	rcu_read_unlock();
	if (!match)
		return 0;
	*out = get_file(f);
	return fd + 1;   /* nonzero stops the walk; the next walk starts after this fd */
}

#define UMCTL_MAX_UVM_FILES 8   /* matching files tried per command at most */

/* execute @it on @tpid's va_space; @mm (users held) is where the parameters are staged */
static void execute(const struct umctl_item *it, struct pid *tpid, struct mm_struct *mm, struct exec_out *o)
{
	union {
		struct umctl_uvm_migrate_params m;
		struct umctl_uvm_discard_params d;
	} p;
	u64 lo = it->addr & PAGE_MASK, hi = PAGE_ALIGN(it->addr + it->len);   /* the driver wants pages */
	unsigned int cmd, next = 0, tried = 0;
	struct task_struct *task;
	unsigned long scratch;
	size_t psz, rm_off;
	bool decided = false;

	memset(&p, 0, sizeof(p));
	if (it->op == OP_INVALIDATE) {
		cmd = UMCTL_UVM_DISCARD;
		p.d.base = lo;
		p.d.length = hi - lo;
		p.d.flags = UMCTL_UVM_DISCARD_FLAGS_UNMAP;   /* the next touch faults (as the uvm actuator) */
		psz = sizeof(p.d);
		rm_off = offsetof(struct umctl_uvm_discard_params, rmStatus);
	} else {
		cmd = UMCTL_UVM_MIGRATE;
		p.m.base = lo;
		p.m.length = hi - lo;
		p.m.cpuNumaNode = -1;   /* flags 0: synchronous, no semaphore */
		if (it->has_uuid) {
			memcpy(p.m.destinationUuid.uuid, it->uuid, 16);
		} else if (it->dst >= 0 && !gpu_uuid(it->dst, p.m.destinationUuid.uuid)) {
			o->status = UMCTL_ST_FAILED;
			o->err = -ENXIO;   /* no UUID known for that GPU index */
			return;
		}   /* else dst -1: all zero, the CPU */
		psz = sizeof(p.m);
		rm_off = offsetof(struct umctl_uvm_migrate_params, rmStatus);
	}

	task = get_pid_task(tpid, PIDTYPE_TGID);
	if (!task) {
		o->status = UMCTL_ST_TARGET_GONE;
		o->err = -ESRCH;
		return;
	}
	kthread_use_mm(mm);
	scratch = vm_mmap(NULL, 0, PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, 0);
	if (IS_ERR_VALUE(scratch)) {
		o->status = UMCTL_ST_FAILED;
		o->err = (s32)scratch;
		goto out;
	}
	while (!decided && tried < UMCTL_MAX_UVM_FILES) {
		struct file *file = NULL;
		long ret;
		u32 nv;
		int r;

		task_lock(task);   /* keeps task->files alive (exit_files clears it under this lock) */
		r = task->files ? iterate_fd(task->files, next, match_uvm_file, &file) : 0;
		task_unlock(task);
		if (r <= 0 || !file)
			break;
		next = r;
		tried++;
		if (copy_to_user((void __user *)scratch, &p, psz)) {
			fput(file);
			o->status = UMCTL_ST_FAILED;
			o->err = -EFAULT;
			decided = true;
			break;
		}
		ret = vfs_ioctl(file, cmd, scratch);
		fput(file);
		if (ret) {   /* the parameters never reached the driver's verdict (EFAULT, EAGAIN, ENOTTY) */
			o->status = UMCTL_ST_FAILED;
			o->err = ret;
			decided = true;
			break;
		}
		if (copy_from_user(&nv, (void __user *)(scratch + rm_off), sizeof(nv))) {
			o->status = UMCTL_ST_FAILED;
			o->err = -EFAULT;
			decided = true;
			break;
		}
		o->nv = nv;
		if (nv == UMCTL_NV_ERR_ILLEGAL_ACTION) {   /* not a va_space (the mm fd): the next one */
			atomic64_inc(&cnt[C_UVM_FD_SKIPPED]);
			continue;
		}
		decided = true;
		switch (nv) {
		case UMCTL_NV_OK:
			o->status = UMCTL_ST_OK;
			o->bytes = it->len;
			break;
		case UMCTL_NV_ERR_INVALID_ADDRESS:
			o->status = UMCTL_ST_RANGE_INVALID;
			o->err = -EFAULT;
			break;
		case UMCTL_NV_ERR_INVALID_DEVICE:
			o->status = UMCTL_ST_FAILED;
			o->err = -ENXIO;
			break;
		default:
			o->status = UMCTL_ST_FAILED;
			o->err = -EIO;
		}
	}
	if (!decided) {   /* no va_space file: never opened, closed, or only mm fds */
		atomic64_inc(&cnt[C_NO_UVM_FILE]);
		o->status = UMCTL_ST_TARGET_GONE;
		o->err = -ENODEV;
	}
	vm_munmap(scratch, PAGE_SIZE);
out:
	kthread_unuse_mm(mm);
	put_task_struct(task);
}

static void umctl_work_fn(struct work_struct *w)
{
	struct umctl_item it;

	for (;;) {
		struct exec_out o = { .status = UMCTL_ST_FAILED, .err = -ECANCELED };
		struct mm_struct *mm = NULL;
		struct pid *tpid = NULL;

		spin_lock_irq(&ring_lock);
		if (ring_head == ring_tail) {
			spin_unlock_irq(&ring_lock);
			break;
		}
		it = ring[ring_head % queue_depth];
		ring_head++;
		spin_unlock_irq(&ring_lock);
		if (it.portid) {   /* genl: the target resolved and the sender's mm grabbed at submit */
			tpid = it.tpid;
			if (mmget_not_zero(it.mm))
				mm = it.mm;
		} else if (!fp_resolve(it.pid, &tpid, &mm)) {   /* kfunc: from the fast-path slot, now */
			tpid = NULL;
			mm = NULL;
		}
		if (tpid && mm)
			execute(&it, tpid, mm, &o);
		if (mm)
			mmput(mm);
		if (it.mm)
			mmdrop(it.mm);
		put_pid(tpid);
		atomic64_inc(&cnt[C_EXECUTED]);
		atomic64_inc(&cnt[o.status == UMCTL_ST_OK ? C_OK : C_FAILED]);
		send_result(&it, o.status, o.bytes, o.err, o.nv);
		if (!it.portid)
			put_net(it.net);
		cond_resched();
	}
}

static const struct genl_small_ops umctl_ops[] = {
	{ .cmd = UMCTL_CMD_PREFETCH, .doit = umctl_prefetch },
	{ .cmd = UMCTL_CMD_PREEVICT, .doit = umctl_preevict },
	{ .cmd = UMCTL_CMD_INVALIDATE, .doit = umctl_invalidate },
	{ .cmd = UMCTL_CMD_FASTPATH_ENABLE, .doit = umctl_fastpath_enable },
	{ .cmd = UMCTL_CMD_FASTPATH_DISABLE, .doit = umctl_fastpath_disable },
};

static struct genl_family umctl_family = {
	.name = UMCTL_GENL_NAME,
	.version = UMCTL_GENL_VERSION,
	.maxattr = UMCTL_A_MAX,
	.policy = umctl_policy,
	.module = THIS_MODULE,
	.small_ops = umctl_ops,
	.n_small_ops = ARRAY_SIZE(umctl_ops),
	.resv_start_op = __UMCTL_CMD_MAX,   /* strict validation for every op, unknown ops refused */
	.mcgrps = umctl_mcgrps,
	.n_mcgrps = ARRAY_SIZE(umctl_mcgrps),
};

static int __init umctl_init(void)
{
	int ret;

	UMCTL_UVM_ABI_CHECK_SIZES();
	if (!queue_depth || queue_depth > (1u << 20))
		return -EINVAL;
	ring = kvcalloc(queue_depth, sizeof(*ring), GFP_KERNEL);
	if (!ring)
		return -ENOMEM;
	umctl_wq = alloc_ordered_workqueue("umctl", 0);
	if (!umctl_wq) {
		kvfree(ring);
		return -ENOMEM;
	}
	ret = genl_register_family(&umctl_family);
	if (ret) {
		destroy_workqueue(umctl_wq);
		kvfree(ring);
		return ret;
	}
	/* without module BTF (or its .BTF_ids resolved) there is no kfunc: the rest works */
	ret = register_btf_kfunc_id_set(BPF_PROG_TYPE_TRACING, &umctl_kfunc_set);
	fastpath_kfunc = !ret;
	if (ret)
		pr_info("umctl: kfunc bpf_umctl_enqueue not registered (%d): no BPF fast path\n", ret);
	pr_info("umctl: genl family %s id %u, queue %u, kfunc %s, backend: ioctls on '%s' files of module '%s'\n",
		UMCTL_GENL_NAME, umctl_family.id, queue_depth, fastpath_kfunc ? "bpf_umctl_enqueue" : "none", uvm_dev,
		uvm_module[0] ? uvm_module : "(any)");
	return 0;
}

static void __exit umctl_exit(void)
{
	int i;

	/* no BPF program can still call the kfunc: one that does holds a reference on this module */
	genl_unregister_family(&umctl_family);
	destroy_workqueue(umctl_wq);   /* flushes the worker */
	kvfree(ring);
	for (i = 0; i < ARRAY_SIZE(fp_slots); i++)
		fp_release(&fp_slots[i]);
}

module_init(umctl_init);
module_exit(umctl_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("umctl: UVM controller commands over generic netlink");
