/* umctl in-process runtime, loaded with LD_PRELOAD into a program started by `umctl run`.
 *
 * What it does (each part off unless its environment variable asks for it; runtime/README.md):
 *   - UMCTL_RT_MANAGED=1: cudaMalloc hands out managed memory (cudaMallocManaged), so DeepUM-style
 *     prefetch/pre-eviction/invalidation commands can act on the program's device memory. The
 *     PyTorch pluggable-allocator entry points umctl_rt_malloc/umctl_rt_free do the same for torch
 *     and keep freed blocks cached, reporting them BLOCK_INACTIVE / BLOCK_ACTIVE.
 *   - UMCTL_RT_HUM=1 (implies MANAGED): HUM (PPoPP'20 §4) for unmodified programs. A host->device
 *     cudaMemcpy(Async) from pageable memory into one of our managed allocations returns at once;
 *     a worker copies the data in 2 MiB chunks, one queue per copy command, served round-robin
 *     (§4.6), and prefetches each chunk to the GPU. The source pages are write-protected until
 *     their chunk is copied; a thread that writes one waits in our SIGSEGV handler (§4.2).
 *     Every CUDA call that could observe the destination (launches, copies, syncs, events, frees,
 *     at both the runtime and the driver API) first waits for the pending copies: without the HUM
 *     kernel driver, a kernel that read a page not yet copied would see stale data, so "early
 *     kernel start" here means the kernel starts while the chunks are still *migrating* to the
 *     GPU (they are already in managed memory; the driver faults in what the prefetch has not
 *     brought yet), never before the bytes are in place.
 *   - UMCTL_RT_SOCKET=PATH: launches (exact kernel name, grid, block, stream, argument hash),
 *     allocations and copies are reported as binary datagrams (umctl_rt.h) to PATH, batched and
 *     non-blocking: a full socket drops records and counts them, never stalls the program.
 *
 * Rule above all: never change a program's results. Anything the HUM path cannot prove safe
 * (pinned, managed or device source, a destination we did not allocate, a stream being captured,
 * an unusual mapping, a device without concurrent managed access, ...) takes the original call.
 *
 * Built by setup.py: gcc -O2 -shared -fPIC umctl_rt.c -o libumctl_rt.so -ldl -lpthread. No CUDA
 * headers: the runtime API is reached by symbol (dlsym RTLD_NEXT), the driver through dlopen of
 * libcuda.so.1 (UMCTL_RT_LIBCUDA overrides the path). Only programs that link libcudart
 * dynamically are interposed at the runtime level (torch, cupy, nvcc -cudart shared).
 */
#define _GNU_SOURCE
#include "umctl_rt.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))
#define LOCAL static __attribute__((visibility("hidden")))

typedef int cudaError_t;
typedef void *cudaStream_t;
typedef void *cudaEvent_t;
typedef struct { unsigned x, y, z; } dim3;
typedef uint64_t u64;

enum { cudaMemcpyHostToHost = 0, cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2,
       cudaMemcpyDeviceToDevice = 3, cudaMemcpyDefault = 4 };

#define CHUNK ((size_t)2 << 20)
#define MAX_COPIES 64
#define MAX_DEV 16

/* ---------------------------------------------------------------- configuration and stats */

static int cfg_managed, cfg_hum, cfg_stats, cfg_track_end;
static int cfg_evict_each;   /* UMCTL_RT_EVICT_EACH: rt_interpose.c, evict_each */
static _Atomic u64 st_evict_each, st_evict_each_failed;
static size_t cfg_hum_min = (size_t)1 << 20, cfg_cap;
static unsigned cfg_delay_us;
static const char *cfg_socket;
static int cfg_control;   /* UMCTL_RT_CONTROL: umctl may ask for safe discards (below) */
static struct sockaddr_un sock_addr;
static socklen_t sock_len;
static int sock_fd = -1;
static size_t page_sz = 4096;

static _Atomic u64 st_dma, st_pinned, st_stage_ns, st_dmawait_ns, st_populated;
/* where a HUM copy's time goes: write-protecting the source at the call, unprotecting it as it is
   staged, and issue -> last chunk landed (sum and worst) */
static _Atomic u64 st_protect_ns, st_unprot_ns, st_copy_ns, st_copy_max_ns, st_call_ns;
static _Atomic u64 st_drv_launch;   /* launches reported from the driver's entry point (cuBLAS, ...) */
static _Atomic u64 st_hum, st_fallback, st_waits, st_segv, st_launch, st_managed, st_wrapped, st_chunks,
    st_prefetch;

/* SnuRHAC grid partitioning (UMCTL_RT_GPUS, UMCTL_RT_READ_ONLY): see part_launch */
static int cfg_gpus, cfg_ro = 1;
static _Atomic u64 st_part, st_part_fallback, st_ro_set, st_ro_unset;
static _Atomic u64 st_disc_req, st_disc_bytes, st_disc_kept;   /* safe-discard requests, bytes dropped, kept */
static _Atomic u64 st_disc_ns, st_disc_max_ns;   /* time the discards held the cache lock: total, longest */
static pthread_mutex_t part_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t part_once = PTHREAD_ONCE_INIT;
static void part_setup(void);
static void part_forget(const void *p);

#define STREAM_PER_THREAD ((cudaStream_t)0x2)   /* cudaStreamPerThread: what stream 0 means in a _ptsz call */
static __thread int tl_internal;   /* >0: our own call or our worker: no barrier, no HUM, no report */
static __thread int tl_rt_launch;  /* >0: inside a reported runtime launch: its driver launch is not reported again */
static __thread uintptr_t tl_last_fault;

/* Entry points are looked up lazily, by whichever thread needs one first, often several at once:
   the first lookup is stored (compare-and-swap, once) and read with acquire loads, so no thread
   reads a pointer while another writes it. Evaluates to the pointer, NULL while none is found. */
#define LAZY_SYM(slot, lookup)                                                                      \
    ({                                                                                              \
        __typeof__(slot) p_ = __atomic_load_n(&(slot), __ATOMIC_ACQUIRE);                           \
        if (!p_) {                                                                                  \
            __typeof__(slot) none_ = NULL;                                                          \
            p_ = (__typeof__(slot))(lookup);                                                        \
            if (p_ && !__atomic_compare_exchange_n(&(slot), &none_, p_, 0, __ATOMIC_ACQ_REL,        \
                                                   __ATOMIC_ACQUIRE))                               \
                p_ = none_;                                                                         \
        }                                                                                           \
        p_;                                                                                         \
    })

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static size_t env_size(const char *name, size_t dflt)
{
    const char *v = getenv(name);
    return v && *v ? (size_t)strtoull(v, NULL, 0) : dflt;
}

static int env_on(const char *name)
{
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

/* The sections below are separate files compiled as this one translation unit: they share
 * file-static state (the configuration and counters above, the real entry points of
 * rt_resolve.c, the allocation table...), which stays private to the library, and the build
 * line stays one file. Order matters: each part uses what the earlier ones define. */
#include "rt_resolve.c"
#include "rt_reports.c"
#include "rt_alloc.c"
#include "rt_hum.c"
#include "rt_launch.c"
#include "rt_interpose.c"
#include "rt_snurhac.c"
#include "rt_guards.c"
#include "rt_torch.c"
