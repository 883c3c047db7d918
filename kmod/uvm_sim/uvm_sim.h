/* SPDX-License-Identifier: GPL-2.0 */
/* uvm_sim's interface: the fault record written to /dev/uvm_sim. Its ioctls are the real driver's
 * (kmod/umctl/uvm_abi.h). */
#ifndef UVM_SIM_H
#define UVM_SIM_H
#include <linux/types.h>

struct uvm_sim_fault {
	__u64 addr;
	__u32 access;   /* uvm_fault_access_type_t: 1 read, 2 write, 3/4 atomic, 0 prefetch; or UVM_SIM_ACCESS_FREE */
	__u32 pad;
};

/* not an access: the block of addr is freed (its range stops being managed until touched again) */
#define UVM_SIM_ACCESS_FREE 0xF7EEu
#endif
