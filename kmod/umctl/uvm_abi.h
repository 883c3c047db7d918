/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The subset of the nvidia-uvm ioctl ABI (driver 580, Linux) that umctl's backend issues on a
 * target's va_space file, and that the test bed's simulated driver (kmod/uvm_sim) answers.
 * Written from umctl/driver/abi.py (itself checked against the 580.159.04 driver on an
 * H100/H200): Linux UVM ioctl numbers are the raw command numbers (no _IOWR encoding), the
 * ioctl returns 0 once the parameters were copied, and the driver's verdict is the NV_STATUS in
 * the struct's last member (rmStatus). Sizes are checked with BUILD_BUG_ON by both users.
 */
#ifndef UMCTL_UVM_ABI_H
#define UMCTL_UVM_ABI_H
#include <linux/types.h>

#define UMCTL_UVM_MIGRATE        51
#define UMCTL_UVM_MM_INITIALIZE  75
#define UMCTL_UVM_DISCARD        80
#define UMCTL_UVM_DISCARD_FLAGS_UNMAP 1ULL

/* NV_STATUS values (nvstatuscodes.h) the backend tells apart */
#define UMCTL_NV_OK                    0x00
#define UMCTL_NV_ERR_ILLEGAL_ACTION    0x16   /* not a va_space fd (the per-process mm fd), or not initialised */
#define UMCTL_NV_ERR_INVALID_ADDRESS   0x1E   /* unaligned, zero, overflowing, or not a managed range */
#define UMCTL_NV_ERR_INVALID_ARGUMENT  0x1F
#define UMCTL_NV_ERR_INVALID_DEVICE    0x26   /* destination UUID not a GPU of this va_space */

struct umctl_nv_uuid {
	__u8 uuid[16];   /* all zero: the CPU */
};

/* UVM_MIGRATE_PARAMS, 80 bytes: synchronous when flags == 0; cpuNumaNode -1: the driver picks */
struct umctl_uvm_migrate_params {
	__u64 base;
	__u64 length;
	struct umctl_nv_uuid destinationUuid;
	__u32 flags;
	__u64 semaphoreAddress;
	__u32 semaphorePayload;
	__s32 cpuNumaNode;
	__u64 userSpaceStart;
	__u64 userSpaceLength;
	__u32 rmStatus;
};

/* UVM_DISCARD_PARAMS, 32 bytes (new in 580: drop the contents without write-back) */
struct umctl_uvm_discard_params {
	__u64 base;
	__u64 length;
	__u64 flags;
	__u32 rmStatus;
};

/* UVM_MM_INITIALIZE_PARAMS, 8 bytes: issued on the second (mm) fd with the va_space fd */
struct umctl_uvm_mm_initialize_params {
	__s32 uvmFd;
	__u32 rmStatus;
};

#define UMCTL_UVM_ABI_CHECK_SIZES()                                                 \
	do {                                                                        \
		BUILD_BUG_ON(sizeof(struct umctl_uvm_migrate_params) != 80);        \
		BUILD_BUG_ON(sizeof(struct umctl_uvm_discard_params) != 32);        \
		BUILD_BUG_ON(sizeof(struct umctl_uvm_mm_initialize_params) != 8);   \
	} while (0)

#endif
