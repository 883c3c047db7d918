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
 *   - backend: in the test bed, uvm_sim_migrate() of the simulated driver (kmod/uvm_sim), found
 *     with symbol_get() so this module loads without it; without a backend every command fails
 *     with ENODEV (status FAILED). Executing against the real nvidia_uvm needs an in-kernel entry
 *     point to uvm_migrate() that the driver does not export; see kmod/README.md.
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
#include "umctl_genl.h"
#include "../uvm_sim/uvm_sim.h"

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

enum { C_RECEIVED, C_ACCEPTED, C_INVALID, C_EPERM, C_ESRCH, C_EBUSY, C_ENOSPC, C_EXECUTED, C_OK, C_FAILED,
       C_RESULT_LOST, C_FP_ENQUEUED, C_FP_REFUSED, C_FP_INVALID, C_FP_DROPPED, C_N };
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
static bool fastpath_kfunc;
module_param(fastpath_kfunc, bool, 0444);
MODULE_PARM_DESC(fastpath_kfunc, "bpf_umctl_enqueue is registered for tracing programs (needs module BTF)");

struct umctl_item {
	u64 addr, len, cmd_id, t_submit;
	s64 exec_id;
	s32 dst;
	pid_t pid;
	u32 op;         /* UVM_SIM_OP_* */
	u32 portid;     /* the submitter's netlink port; 0: queued by the kfunc (results multicast only) */
	struct net *net;   /* referenced when portid is 0 (the enabling controller's netns) */
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

/* the target exists and the sender (current) may steer it: 0, -ESRCH or -EPERM (counted) */
static int check_target(pid_t nr)
{
	struct task_struct *task;
	struct pid *pid;
	bool allowed;

	pid = find_get_pid(nr);
	task = pid ? get_pid_task(pid, PIDTYPE_TGID) : NULL;
	put_pid(pid);
	if (!task) {
		atomic64_inc(&cnt[C_ESRCH]);
		return -ESRCH;
	}
	allowed = may_steer(task);
	put_task_struct(task);
	if (!allowed) {
		atomic64_inc(&cnt[C_EPERM]);
		return -EPERM;
	}
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
	    (op != UVM_SIM_OP_INVALIDATE && !a[UMCTL_A_DST])) {
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
	if (!it.len || it.len > UMCTL_MAX_LEN || it.addr + it.len < it.addr || it.addr + it.len > (1ULL << 57) ||
	    (op == UVM_SIM_OP_PREFETCH && it.dst < 0)) {
		NL_SET_ERR_MSG(info->extack, "umctl: bad range or destination");
		atomic64_inc(&cnt[C_INVALID]);
		return -ERANGE;
	}
	ret = check_target(it.pid);
	if (ret)
		return ret;
	if (!rate_ok()) {
		atomic64_inc(&cnt[C_EBUSY]);
		return -EBUSY;
	}
	it.portid = info->snd_portid;
	it.net = genl_info_net(info);
	it.t_submit = ktime_get_ns();
	ret = push(&it);
	if (ret) {
		atomic64_inc(&cnt[C_ENOSPC]);
		return ret;
	}
	atomic64_inc(&cnt[C_ACCEPTED]);
	return 0;
}

static int umctl_prefetch(struct sk_buff *skb, struct genl_info *info)
{
	return umctl_submit(skb, info, UVM_SIM_OP_PREFETCH);
}
static int umctl_preevict(struct sk_buff *skb, struct genl_info *info)
{
	return umctl_submit(skb, info, UVM_SIM_OP_PREEVICT);
}
static int umctl_invalidate(struct sk_buff *skb, struct genl_info *info)
{
	return umctl_submit(skb, info, UVM_SIM_OP_INVALIDATE);
}

/* ---- the fast path: BPF programs queue commands for targets a controller enabled ----
 *
 * FASTPATH_ENABLE(pid) runs in the sender's context with the same checks as a command
 * (check_target: may_steer); it records the target's struct pid (so a recycled pid number is not
 * mistaken for it) and the sender's netns (where the results go, multicast). The kfunc runs in
 * the calling BPF program's context — for the fast path an fentry program on the driver's
 * service_fault_batch, i.e. the fault-servicing thread with migration disabled under RCU — so it
 * never sleeps: a scan of FASTPATH_SLOTS entries under a spinlock, the rate limit, a push on the
 * bounded queue (spinlock, irqs off) and queue_work(). Refusals are counted and returned.
 */
struct fp_slot {
	pid_t nr;               /* 0: free */
	struct pid *pid;        /* referenced */
	struct net *net;        /* referenced */
};
static struct fp_slot fp_slots[UMCTL_FASTPATH_SLOTS];
static DEFINE_SPINLOCK(fp_lock);
static atomic64_t fp_seq;

static void fp_clear(struct fp_slot *s, struct pid **pid, struct net **net)
{
	*pid = s->pid;
	*net = s->net;
	s->nr = 0;
	s->pid = NULL;
	s->net = NULL;
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
	it.op = dst >= 0 ? UVM_SIM_OP_PREFETCH : UVM_SIM_OP_PREEVICT;
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
	struct pid *old_pid = NULL, *pid = NULL;
	struct net *old_net = NULL;
	struct fp_slot *free = NULL;
	unsigned long flags;
	pid_t nr;
	int i, ret;

	atomic64_inc(&cnt[C_RECEIVED]);
	if (!info->attrs[UMCTL_A_PID]) {
		NL_SET_ERR_MSG(info->extack, "umctl: PID is required");
		atomic64_inc(&cnt[C_INVALID]);
		return -EINVAL;
	}
	nr = nla_get_u32(info->attrs[UMCTL_A_PID]);
	ret = check_target(nr);
	if (ret)
		return ret;
	if (on) {
		pid = find_get_pid(nr);
		if (!pid)
			return -ESRCH;
	}
	ret = on ? -ENOSPC : -ENOENT;
	spin_lock_irqsave(&fp_lock, flags);
	for (i = 0; i < ARRAY_SIZE(fp_slots); i++) {
		struct fp_slot *s = &fp_slots[i];

		if (s->nr == nr) {
			fp_clear(s, &old_pid, &old_net);
			free = s;
			break;
		}
		if (!free && (!s->nr || !pid_task(s->pid, PIDTYPE_TGID)))   /* free, or its target exited */
			free = s;
	}
	if (free && on) {
		if (free->nr && !old_pid)
			fp_clear(free, &old_pid, &old_net);
		free->nr = nr;
		free->pid = pid;
		free->net = get_net(genl_info_net(info));
		pid = NULL;
		ret = 0;
	} else if (old_pid) {
		ret = 0;
	}
	spin_unlock_irqrestore(&fp_lock, flags);
	put_pid(pid);
	put_pid(old_pid);
	if (old_net)
		put_net(old_net);
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

static void send_result(struct umctl_item *it, u32 status, u64 bytes, s32 err)
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
	    nla_put_s32(skb, UMCTL_A_ERRNO, err)) {
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

static void umctl_work_fn(struct work_struct *w)
{
	long (*backend)(pid_t, u64, u64, s32, u32);
	struct umctl_item it;

	backend = symbol_get(uvm_sim_migrate);
	for (;;) {
		long r;
		u32 st;

		spin_lock_irq(&ring_lock);
		if (ring_head == ring_tail) {
			spin_unlock_irq(&ring_lock);
			break;
		}
		it = ring[ring_head % queue_depth];
		ring_head++;
		spin_unlock_irq(&ring_lock);
		r = backend ? backend(it.pid, it.addr, it.len, it.dst, it.op) : -ENODEV;
		atomic64_inc(&cnt[C_EXECUTED]);
		if (r >= 0) {
			st = r ? UMCTL_ST_OK : UMCTL_ST_SKIPPED;
			atomic64_inc(&cnt[C_OK]);
		} else {
			st = r == -ESRCH ? UMCTL_ST_TARGET_GONE : r == -EFAULT ? UMCTL_ST_RANGE_INVALID : UMCTL_ST_FAILED;
			atomic64_inc(&cnt[C_FAILED]);
		}
		send_result(&it, st, r > 0 ? r : 0, r < 0 ? r : 0);
		if (!it.portid)
			put_net(it.net);
		cond_resched();
	}
	if (backend)
		symbol_put(uvm_sim_migrate);
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
	pr_info("umctl: genl family %s id %u, queue %u, kfunc %s\n", UMCTL_GENL_NAME, umctl_family.id, queue_depth,
		fastpath_kfunc ? "bpf_umctl_enqueue" : "none");
	return 0;
}

static void __exit umctl_exit(void)
{
	int i;

	/* no BPF program can still call the kfunc: one that does holds a reference on this module */
	genl_unregister_family(&umctl_family);
	destroy_workqueue(umctl_wq);   /* flushes the worker */
	kvfree(ring);
	for (i = 0; i < ARRAY_SIZE(fp_slots); i++) {
		put_pid(fp_slots[i].pid);
		if (fp_slots[i].net)
			put_net(fp_slots[i].net);
	}
}

module_init(umctl_init);
module_exit(umctl_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("umctl: UVM controller commands over generic netlink");
