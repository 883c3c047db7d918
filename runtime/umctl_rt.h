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

enum umrt_kind { UMRT_LAUNCH = 1, UMRT_ALLOC = 2, UMRT_COPY = 3, UMRT_NAMES = 4,
                 UMRT_DISCARD = 5, UMRT_DISCARD_DONE = 6 };

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
    uint8_t op;          /* AllocOp: 0 ALLOC, 1 FREE, 2 BLOCK_INACTIVE, 3 BLOCK_ACTIVE, 4 HOST_PREFERRED, 5 PEER_PREFERRED */
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

/* The control channel (UMCTL_RT_CONTROL=1): umctl -> runtime. A DISCARD datagram asks the
   runtime to drop the contents of [addr, addr + bytes) where that is safe: only pages of blocks
   its allocator cache holds, freed, whose freeing stream has finished the work queued before the
   free. `uvm_fd` is the program's own /dev/nvidia-uvm va_space fd (umctl knows its number). */
struct __attribute__((packed)) umrt_discard {
    int64_t id;
    uint64_t addr, bytes;
    int32_t uvm_fd;
    uint32_t pad;
};

/* runtime -> umctl, one DISCARD_DONE datagram per request: status UMRT_DISCARDED records are the
   ranges dropped (pages the driver no longer holds anywhere); the other statuses carry, with
   addr 0, how many bytes of the request were kept and why. Whatever no DISCARDED record covers
   still holds its data, and umctl evicts it normally. */
enum umrt_discard_status { UMRT_DISCARDED = 0, UMRT_KEPT_IN_USE = 1, UMRT_KEPT_BUSY = 2, UMRT_KEPT_UNSAFE = 3,
                           UMRT_KEPT_SMALL = 4, UMRT_KEPT_FAILED = 5 };
struct __attribute__((packed)) umrt_discard_done {
    int64_t id;
    uint64_t addr, bytes;
    int32_t status;
    uint32_t pad;
};

_Static_assert(sizeof(struct umrt_header) == 40, "header");
_Static_assert(sizeof(struct umrt_discard) == 32, "discard request");
_Static_assert(sizeof(struct umrt_discard_done) == 32, "discard reply");
_Static_assert(sizeof(struct umrt_launch) == 82, "launch record");
_Static_assert(sizeof(struct umrt_alloc) == 38, "alloc record");
_Static_assert(sizeof(struct umrt_copy) == 56, "copy record");

#endif
