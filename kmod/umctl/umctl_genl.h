/* SPDX-License-Identifier: GPL-2.0 */
/* The umctl generic netlink protocol (family "umctl", version 1). Keep in sync with
 * umctl/actuators/kmod.py (ATTR_*, CMD_*). */
#ifndef UMCTL_GENL_H
#define UMCTL_GENL_H

#define UMCTL_GENL_NAME "umctl"
#define UMCTL_GENL_VERSION 1
#define UMCTL_MCGRP_EVENTS "events"

enum umctl_attr {
	UMCTL_A_UNSPEC,
	UMCTL_A_PID,        /* u32: target process (tgid), >= 1 */
	UMCTL_A_ADDR,       /* u64: first byte */
	UMCTL_A_LEN,        /* u64: bytes, 1 .. UMCTL_MAX_LEN */
	UMCTL_A_DST,        /* s32: destination processor, -1 = CPU, 0.. = GPU index */
	UMCTL_A_EXEC_ID,    /* s64: the controller's execution ID (for accounting) */
	UMCTL_A_CMD_ID,     /* u64: the controller's command id, echoed in the result */
	UMCTL_A_STATUS,     /* u32, results only: enum Status of umctl/events/schema.py */
	UMCTL_A_BYTES,      /* u64, results only */
	UMCTL_A_LATENCY_NS, /* u64, results only: queue + execution time */
	UMCTL_A_ERRNO,      /* s32, results only: the backend's errno (0 on success), see umctl.c */
	UMCTL_A_PAD,
	UMCTL_A_DST_UUID,   /* 16 bytes, optional: the destination processor's UUID (all zero: the CPU);
	                     * without it a DST >= 0 is looked up in the module's gpu_uuids table */
	UMCTL_A_NV_STATUS,  /* u32, results only: the driver's NV_STATUS (rmStatus) of the ioctl */
	__UMCTL_A_MAX,
};
#define UMCTL_A_MAX (__UMCTL_A_MAX - 1)

enum umctl_cmd {
	UMCTL_CMD_UNSPEC,
	UMCTL_CMD_PREFETCH,
	UMCTL_CMD_PREEVICT,
	UMCTL_CMD_INVALIDATE,
	UMCTL_CMD_RESULT,   /* kernel -> user: unicast to the submitter and multicast on "events" */
	UMCTL_CMD_FASTPATH_ENABLE,    /* PID: let BPF programs queue commands for this target (kfunc);
	                               * the sender's mm is where their ioctl parameters go */
	UMCTL_CMD_FASTPATH_DISABLE,   /* PID */
	__UMCTL_CMD_MAX,
};

/* enum Status of umctl/events/schema.py */
enum { UMCTL_ST_OK = 0, UMCTL_ST_FAILED = 1, UMCTL_ST_TARGET_GONE = 2, UMCTL_ST_RANGE_INVALID = 3,
       UMCTL_ST_SKIPPED = 4 };

#define UMCTL_MAX_LEN (1ULL << 40)
/* GPU indices a DST may name (0 .. UMCTL_MAX_GPUS - 1); the module's gpu_uuids table maps them */
#define UMCTL_MAX_GPUS 64

/* cmd_id of commands queued by the BPF kfunc bpf_umctl_enqueue (the low bits count them) */
#define UMCTL_FASTPATH_CMD_ID (1ULL << 63)
/* targets with the fast path enabled at once */
#define UMCTL_FASTPATH_SLOTS 16

#endif
