// SPDX-License-Identifier: GPL-2.0
// umctl kernel-launch probes: uprobes on libcuda's launch entry points and return probes on the
// calls that hand out kernel handles, so that user space (umctl/sources/uprobes.py) can turn every
// launch of one process into a LAUNCH event with grid, block, stream, function handle, kernel
// name and an execution identity.
//
// Why uprobes: they are the one BPF attach type that works both on the CI kernel and on the GPU
// machine (fentry is refused, kprobes are absent; docs/evaluation/measurements.md). Why libcuda and not
// libcudart: every runtime launch ends in cuLaunchKernel(Ex), and driver-API users (cupy,
// cuBLAS, Triton) never touch libcudart; libcudart's cudaLaunchKernel is attached only as a
// counter, so that a gap between the two counts shows launches that bypassed the driver probes.
//
// One program per calling convention; the bpf_cookie of each attachment is the probe id that
// user space assigned, so counters and events say which symbol fired.
//
// x86-64 SysV only: the first six integer arguments in rdi, rsi, rdx, rcx, r8, r9, the rest on
// the stack; at a uprobe on a function's first instruction sp points at the return address, so
// stack argument k (k = 7, 8, ...) is at sp + 8 * (k - 6).
//
// Build: clang -O2 -g -target bpf -D__TARGET_ARCH_x86 -I/usr/include/$(uname -m)-linux-gnu \
//        -c launch.bpf.c -o launch.bpf.o

#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "GPL";

typedef unsigned char u8;
typedef unsigned int u32;
typedef int s32;
typedef unsigned long long u64;

// Keep in sync with umctl/sources/uprobes.py (RAW_DTYPE and the EV_* / MAX_* constants).
#define MAX_PROBES 64
#define CNT_RB_DROPS MAX_PROBES        // counters[MAX_PROBES]: ring-buffer reservations that failed
#define CNT_FILTERED (MAX_PROBES + 1)  // hits from processes other than the targets
#define NCOUNTERS (MAX_PROBES + 2)
#define NARGS 8                        // kernel-argument words captured per launch
#define NAME_LEN 128                   // name bytes captured in the kernel (the rest via /proc/PID/mem)

#define EV_LAUNCH 1   // a kernel launch
#define EV_NAME 2     // handle -> name (cuModuleGetFunction / cuLibraryGetKernel returned)
#define EV_ALIAS 3    // CUfunction -> CUkernel (cuKernelGetFunction returned)

#define ARGS_NONE 0     // no kernel-argument words
#define ARGS_PARAMS 1   // args[i] = first 8 bytes of *kernelParams[i]
#define ARGS_BUFFER 2   // args = the first bytes of the CU_LAUNCH_PARAM_BUFFER_POINTER buffer

// One record size for every event kind, so that user space decodes a drain with one
// np.frombuffer instead of one Python object per record.
struct event {
    u64 t_ns;          // bpf_ktime_get_ns(): CLOCK_MONOTONIC
    u32 kind;          // EV_*
    u32 probe;         // probe id (bpf_cookie)
    u32 pid;           // tgid
    u32 tid;
    u64 func;          // launch: CUfunction; name: the handle; alias: the CUfunction
    u64 stream;        // launch: CUstream; alias: the CUkernel
    u32 grid[3];
    u32 block[3];
    u32 smem;          // dynamic shared memory bytes
    u32 args_mode;     // ARGS_*
    u32 nargs;         // ARGS_PARAMS: words read; ARGS_BUFFER: buffer size in bytes
    s32 name_len;      // name: bytes copied (with the NUL) or < 0 when unreadable in the kernel
    u64 name_ptr;      // name: user address of the string (user space reads it if needed)
    u64 args[NARGS];
    char name[NAME_LEN];
};

struct pending {
    u64 outp;   // where the callee stores the handle
    u64 arg;    // name pointer (get-function calls) or CUkernel (cuKernelGetFunction)
};

struct {
    __uint(type, BPF_MAP_TYPE_RINGBUF);
    __uint(max_entries, 1 << 22);   // 4 MiB: ~13 K records, ~0.1 s of a 100 K launches/s burst
} events SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, NCOUNTERS);
    __type(key, u32);
    __type(value, u64);
} counters SEC(".maps");

// tgid -> 1 for the processes being observed.
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 64);
    __type(key, u32);
    __type(value, u8);
} targets SEC(".maps");

// thread -> arguments of a get-function call in flight (entry probe -> return probe).
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 4096);
    __type(key, u64);
    __type(value, struct pending);
} pending SEC(".maps");

static __always_inline void bump(u32 idx)
{
    u64 *v = bpf_map_lookup_elem(&counters, &idx);
    if (v)
        __sync_fetch_and_add(v, 1);
}

// Count the hit and say whether the caller is one of the targets.
static __always_inline int hit(u32 probe, u32 tgid)
{
    if (!bpf_map_lookup_elem(&targets, &tgid)) {
        bump(CNT_FILTERED);
        return 0;
    }
    bump(probe < MAX_PROBES ? probe : MAX_PROBES - 1);
    return 1;
}

// The bpf_cookie holds the probe id in bits 0..15 and flags above.
static __always_inline u32 probe_id(struct pt_regs *ctx)
{
    return (u32)bpf_get_attach_cookie(ctx) & 0xffff;
}

static __always_inline struct event *reserve(u32 kind, u32 probe, u64 pid_tgid)
{
    struct event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
    if (!e) {
        bump(CNT_RB_DROPS);
        return 0;
    }
    __builtin_memset(e, 0, sizeof(*e));
    e->t_ns = bpf_ktime_get_ns();
    e->kind = kind;
    e->probe = probe;
    e->pid = pid_tgid >> 32;
    e->tid = (u32)pid_tgid;
    return e;
}

// Kernel arguments, for the execution identity. With kernelParams the number of arguments is
// not known here (it lives in the cubin), so the first 8 bytes behind each of the first NARGS
// pointers are read until a read fails; user space keeps only as many, and only as many bytes
// of each, as the demangled signature justifies. With `extra`, the packed argument buffer and
// its size are given, so its first bytes are taken as they are.
static __always_inline void read_args(struct event *e, u64 params, u64 extra)
{
    if (params) {
        u32 n = 0;
#pragma unroll
        for (int i = 0; i < NARGS; i++) {
            u64 p = 0;
            if (bpf_probe_read_user(&p, sizeof(p), (void *)(params + 8 * i)) || !p)
                break;
            if (bpf_probe_read_user(&e->args[i], sizeof(u64), (void *)p))
                break;
            n++;
        }
        e->args_mode = ARGS_PARAMS;
        e->nargs = n;
        return;
    }
    if (!extra)
        return;
    // extra = {CU_LAUNCH_PARAM_BUFFER_POINTER(1), buf, CU_LAUNCH_PARAM_BUFFER_SIZE(2), &size,
    //          CU_LAUNCH_PARAM_END(0)} in any order
    u64 kv[6] = {};
    if (bpf_probe_read_user(kv, sizeof(kv), (void *)extra))
        return;
    u64 buf = 0, sizep = 0;
#pragma unroll
    for (int i = 0; i < 6; i += 2) {
        if (kv[i] == 1)
            buf = kv[i + 1];
        else if (kv[i] == 2)
            sizep = kv[i + 1];
        else if (kv[i] == 0)
            break;
    }
    u64 size = 0;
    if (!buf || !sizep || bpf_probe_read_user(&size, sizeof(size), (void *)sizep))
        return;
    u32 take = size < 8 * NARGS ? (u32)size : 8 * NARGS;
    if (take == 0 || take > 8 * NARGS)   // explicit bound for the verifier
        return;
    if (bpf_probe_read_user(e->args, take, (void *)buf) == 0) {
        e->args_mode = ARGS_BUFFER;
        e->nargs = (u32)(size > 0xffffffffULL ? 0xffffffffULL : size);
    }
}

static __always_inline void launch(struct pt_regs *ctx, u64 f, u32 gx, u32 gy, u32 gz, u32 bx, u32 by,
                                   u32 bz, u32 smem, u64 stream, u64 params, u64 extra)
{
    u32 probe = probe_id(ctx);
    u64 pid_tgid = bpf_get_current_pid_tgid();
    if (!hit(probe, pid_tgid >> 32))
        return;
    struct event *e = reserve(EV_LAUNCH, probe, pid_tgid);
    if (!e)
        return;
    e->func = f;
    e->stream = stream;
    e->grid[0] = gx; e->grid[1] = gy; e->grid[2] = gz;
    e->block[0] = bx; e->block[1] = by; e->block[2] = bz;
    e->smem = smem;
    read_args(e, params, extra);
    bpf_ringbuf_submit(e, 0);
}

// CUresult cuLaunchKernel(CUfunction f, unsigned gx, gy, gz, bx, by, bz, unsigned smem,
//                         CUstream s, void **kernelParams, void **extra)          (and _ptsz)
SEC("uprobe")
int BPF_KPROBE(cu_launch, u64 f, u32 gx, u32 gy, u32 gz, u32 bx)
{
    u32 by = (u32)ctx->r9;   // 6th argument (BPF_KPROBE names five)
    u64 sp = PT_REGS_SP(ctx);
    u64 st[5] = {};   // bz, smem, stream, kernelParams, extra (8-byte stack slots)
    bpf_probe_read_user(st, sizeof(st), (void *)(sp + 8));
    launch(ctx, f, gx, gy, gz, bx, by, (u32)st[0], (u32)st[1], st[2], st[3], st[4]);
    return 0;
}

// CUresult cuLaunchCooperativeKernel(CUfunction f, gx, gy, gz, bx, by, bz, smem, CUstream s,
//                                    void **kernelParams)                          (and _ptsz)
// Same as cuLaunchKernel without `extra`: the slot after kernelParams is the caller's frame.
SEC("uprobe")
int BPF_KPROBE(cu_launch_coop, u64 f, u32 gx, u32 gy, u32 gz, u32 bx)
{
    u32 by = (u32)ctx->r9;   // 6th argument (BPF_KPROBE names five)
    u64 sp = PT_REGS_SP(ctx);
    u64 st[4] = {};
    bpf_probe_read_user(st, sizeof(st), (void *)(sp + 8));
    launch(ctx, f, gx, gy, gz, bx, by, (u32)st[0], (u32)st[1], st[2], st[3], 0);
    return 0;
}

// CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
//                           void **extra)                                          (and _ptsz)
// CUlaunchConfig: gridDimX..Z @0, blockDimX..Z @12, sharedMemBytes @24, hStream @32.
SEC("uprobe")
int BPF_KPROBE(cu_launch_ex, u64 cfg, u64 f, u64 params, u64 extra)
{
    u32 d[8] = {};
    u64 stream = 0;
    bpf_probe_read_user(d, sizeof(d), (void *)cfg);
    bpf_probe_read_user(&stream, sizeof(stream), (void *)(cfg + 32));
    launch(ctx, f, d[0], d[1], d[2], d[3], d[4], d[5], d[6], stream, params, extra);
    return 0;
}

// Any signature: count only (libcudart's cudaLaunchKernel, cuGraphLaunch).
SEC("uprobe")
int BPF_KPROBE(count_only)
{
    hit(probe_id(ctx), bpf_get_current_pid_tgid() >> 32);
    return 0;
}

// CUresult cuModuleGetFunction(CUfunction *out, CUmodule m, const char *name)
// CUresult cuLibraryGetKernel(CUkernel *out, CUlibrary l, const char *name)
// CUresult cuKernelGetFunction(CUfunction *out, CUkernel k)
// Entry: remember where the handle will be stored and the name (or CUkernel) per thread.
SEC("uprobe")
int BPF_KPROBE(get_handle_entry, u64 outp, u64 a1, u64 a2)
{
    u32 probe = probe_id(ctx);
    u64 pid_tgid = bpf_get_current_pid_tgid();
    if (!hit(probe, pid_tgid >> 32))
        return 0;
    // the cookie's bit 16 says which argument is wanted: set for cuKernelGetFunction (a1)
    struct pending p = {outp, (bpf_get_attach_cookie(ctx) >> 16) & 1 ? a1 : a2};
    bpf_map_update_elem(&pending, &pid_tgid, &p, BPF_ANY);
    return 0;
}

// Return: on CUDA_SUCCESS read the handle and send handle -> name (or CUfunction -> CUkernel).
SEC("uretprobe")
int BPF_KRETPROBE(get_handle_ret, long ret)
{
    u64 cookie = bpf_get_attach_cookie(ctx);
    u32 probe = (u32)cookie & 0xffff;
    u64 pid_tgid = bpf_get_current_pid_tgid();
    struct pending *p = bpf_map_lookup_elem(&pending, &pid_tgid);
    if (!p)
        return 0;
    struct pending pv = *p;
    bpf_map_delete_elem(&pending, &pid_tgid);
    if (!hit(probe, pid_tgid >> 32))
        return 0;
    u64 handle = 0;
    if ((int)ret != 0 || bpf_probe_read_user(&handle, sizeof(handle), (void *)pv.outp) || !handle)
        return 0;
    int alias = (cookie >> 16) & 1;
    struct event *e = reserve(alias ? EV_ALIAS : EV_NAME, probe, pid_tgid);
    if (!e)
        return 0;
    e->func = handle;
    if (alias) {
        e->stream = pv.arg;
    } else {
        e->name_ptr = pv.arg;
        // fails when the string's page is not resident yet: user space reads /proc/PID/mem
        e->name_len = bpf_probe_read_user_str(e->name, sizeof(e->name), (void *)pv.arg);
    }
    bpf_ringbuf_submit(e, 0);
    return 0;
}
