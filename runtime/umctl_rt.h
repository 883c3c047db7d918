/* umctl in-process runtime: the wire format of its reports (shared with umctl/sources/runtime.py).
 *
 * Reports travel as unix datagrams to the socket named by UMCTL_RT_SOCKET. Each datagram is one
 * header followed by `count` records of one kind. The LAUNCH, ALLOC and COPY records are laid out
 * byte for byte like umctl.events.schema.DTYPES[...] (numpy packs structured dtypes without
 * padding), so the receiver decodes a datagram with one np.frombuffer. A NAMES datagram carries
 * `count` entries {int32 name_id; uint16 len; char name[len]} (no NUL) that give LAUNCH.name_id
 * its kernel name; name ids are per process.
 */
#ifndef UMCTL_RT_H
#define UMCTL_RT_H

#include <stdint.h>

#define UMRT_MAGIC 0x54524d55u /* "UMRT" little endian */
#define UMRT_VERSION 1

enum umrt_kind { UMRT_LAUNCH = 1, UMRT_ALLOC = 2, UMRT_COPY = 3, UMRT_NAMES = 4 };

struct __attribute__((packed)) umrt_header {
    uint32_t magic;
    uint16_t version;
    uint8_t kind;        /* enum umrt_kind */
    uint8_t pad;
    uint32_t count;      /* records (or names) that follow */
    int32_t pid;
    uint64_t drops[3];   /* cumulative records dropped so far: launch, alloc, copy */
};

/* == DTYPES[Kind.LAUNCH] */
struct __attribute__((packed)) umrt_launch {
    int64_t t_ns, t_end_ns;
    int16_t gpu;
    int32_t pid;
    uint64_t stream, func;
    uint32_t grid[3], block[3];
    uint64_t exec_hash;
    int32_t name_id;
    int64_t seq;
};

/* == DTYPES[Kind.ALLOC] */
struct __attribute__((packed)) umrt_alloc {
    int64_t t_ns;
    int32_t pid;
    uint8_t op;          /* AllocOp: 0 ALLOC, 1 FREE, 2 BLOCK_INACTIVE, 3 BLOCK_ACTIVE */
    uint64_t addr, bytes;
    int64_t alloc_id;
    uint8_t managed;
};

/* == DTYPES[Kind.COPY] */
struct __attribute__((packed)) umrt_copy {
    int64_t t_ns, t_end_ns;
    int16_t gpu;
    int32_t pid;
    uint64_t stream;
    uint8_t kind;        /* CopyKind: 0 H2D, 1 D2H, 2 D2D */
    uint64_t src_addr, dst_addr, bytes;
    uint8_t is_async;
};

/* In-stream commands (UMCTL_RT_CMD_FD, `umctl run --actuator stream`): a memfd shared with umctl
   holding one header and a ring of `cap` data-movement commands. umctl is the only producer
   (it writes entries, then advances head), the runtime the only consumer: before each reported
   launch it enqueues the entries [tail, head) as cuMemPrefetchAsync on the launch's stream (or,
   with UMCTL_RT_CMD_LAG > 0, on a side stream that the kernel LAG launches later waits for),
   fills in status / t_done_ns / seq and advances tail. With UMCTL_RT_CMD_SYNC_US the launch
   first waits (on the host, at most that long) until umctl has acked the previous launch's
   report, so commands planned from it land right before this launch. Nothing on the GPU ever
   waits on umctl, so killing umctl leaves the program running. (umctl/actuators/stream.py: same layout.) */
struct umrt_cmdq {
    uint64_t head;           /* umctl: entries written so far */
    uint64_t tail;           /* runtime: entries taken so far (each with its status) */
    uint64_t cap;            /* entries in the ring (umctl, at creation) */
    uint64_t closed;         /* umctl: 1 = take nothing more */
    uint64_t batches;        /* runtime: launches that got commands enqueued before them */
    uint64_t lead_waits;     /* runtime: launches held back by UMCTL_RT_LEAD */
    uint64_t lead_wait_ns;   /* runtime: host time spent holding them */
    uint64_t lead_timeouts;  /* runtime: holds given up (no kernel ended for UMCTL_RT_LEAD_WAIT_MS) */
    uint64_t acked;          /* umctl: launches whose report it has planned for (seq + 1 of the last) */
    uint64_t sync_waits;     /* runtime: launches that waited for umctl's ack (UMCTL_RT_CMD_SYNC_US) */
    uint64_t sync_wait_ns;   /* runtime: host time spent waiting for it */
    uint64_t sync_timeouts;  /* runtime: waits given up */
    uint64_t pad[4];
};

struct umrt_cmd {
    uint64_t addr, bytes;
    int32_t dst;             /* -1 the host, >= 0 the GPU of the launching context */
    int32_t status;          /* -1 pending; runtime: 0 enqueued in stream order, 1 the driver refused it,
                                2 skipped (no driver entry point) */
    int64_t cmd_id;          /* umctl's */
    int64_t t_submit_ns;     /* umctl: when it was written (CLOCK_MONOTONIC) */
    int64_t t_done_ns;       /* runtime: when it was enqueued */
    int64_t seq;             /* runtime: the launch it was enqueued before */
};

_Static_assert(sizeof(struct umrt_cmdq) == 128, "command queue header");
_Static_assert(sizeof(struct umrt_cmd) == 56, "command");

_Static_assert(sizeof(struct umrt_header) == 40, "header");
_Static_assert(sizeof(struct umrt_launch) == 82, "launch record");
_Static_assert(sizeof(struct umrt_alloc) == 38, "alloc record");
_Static_assert(sizeof(struct umrt_copy) == 56, "copy record");

#endif
