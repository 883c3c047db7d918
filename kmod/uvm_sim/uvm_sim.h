/* SPDX-License-Identifier: GPL-2.0 */
/* uvm_sim's interface: the fault record written to /dev/uvm_sim, and the execution backend that
 * kmod/umctl calls (through symbol_get, so umctl loads without uvm_sim). */
#ifndef UVM_SIM_H
#define UVM_SIM_H
#include <linux/types.h>

struct uvm_sim_fault {
	__u64 addr;
	__u32 access;   /* uvm_fault_access_type_t: 1 read, 2 write, 3/4 atomic, 0 prefetch */
	__u32 pad;
};

enum { UVM_SIM_OP_PREFETCH = 0, UVM_SIM_OP_PREEVICT = 1, UVM_SIM_OP_INVALIDATE = 2 };

#ifdef __KERNEL__
long uvm_sim_migrate(pid_t pid, u64 addr, u64 len, s32 dst, u32 op);
#endif
#endif
