/* A small CUDA-runtime program for tests/test_runtime.py, linked against the fake libcudart
 * (fakecudart.c) and run with and without LD_PRELOAD of the umctl runtime. It prints one line
 * "RESULT {json}" whose values must not depend on the runtime (checksums, copy checks), plus what
 * the fake saw (which API allocated the buffers).
 *
 *   gcc -O1 -rdynamic rtprog.c -o DIR/rtprog -LDIR -lcudart -Wl,-rpath,DIR -ldl
 *   rtprog basic|race|driver
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <sys/types.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { unsigned x, y, z; } dim3;
int cudaMalloc(void **, size_t);
int cudaFree(void *);
int cudaMemcpy(void *, const void *, size_t, int);
int cudaMemcpyAsync(void *, const void *, size_t, int, void *);
int cudaLaunchKernel(const void *, dim3, dim3, void **, size_t, void *);
int __cudaLaunchKernel(const void *, dim3, dim3, void **, size_t, void *);
typedef struct { dim3 grid, block; size_t smem; void *stream; void *attrs; unsigned nattrs; } launch_config;
int cudaLaunchKernelExC(const launch_config *, const void *, void **);
int cudaDeviceSynchronize(void);
int cudaPointerGetAttributes(void *, const void *);
int fake_driver_launch(const void *, void **);
extern int fake_device_allocs, fake_managed_allocs, fake_copies, fake_launches;
int cudaGetDevice(int *);
int cudaStreamCreateWithFlags(void **, unsigned);
int cudaStreamSynchronize(void *);
int cudaMallocHost(void **, size_t);
extern __thread int fake_cur_device;
extern __thread dim3 fake_cur_grid;
const char *fake_log_text(void);
void fake_log_clear(void);

#define MB ((size_t)1 << 20)
enum { H2D = 1, D2H = 2 };

void vec_add(void **args)
{
    const uint32_t *a = *(uint32_t **)args[0], *b = *(uint32_t **)args[1];
    uint32_t *c = *(uint32_t **)args[2];
    uint64_t n = *(uint64_t *)args[3];
    for (uint64_t i = 0; i < n; i++)
        c[i] = a[i] + b[i];
}

static uint64_t sum_out;
void sum_bytes(void **args)
{
    const unsigned char *a = *(unsigned char **)args[0];
    uint64_t n = *(uint64_t *)args[1], s = 0;
    for (uint64_t i = 0; i < n; i++)
        s = s * 31 + a[i];
    sum_out = s;
}

static uint64_t checksum(const unsigned char *p, size_t n)
{
    uint64_t s = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++)
        s = (s ^ p[i]) * 1099511628211ULL;
    return s;
}

static int type_of(const void *p)
{
    int attr[64] = {0};
    cudaPointerGetAttributes(attr, p);
    return attr[0];
}

/* SnuRHAC convention (runtime/umctl_snurhac.h), by hand in C: the kernels' names are the
   mangled names nvcc would give `part_kern(umctl_part_t, unsigned*, int*, const unsigned*)` and
   `plain_kern(unsigned*, int*)`. A "thread block" here is one iteration over the launch grid. */
struct umctl_part { unsigned off[3], grid[3], ro_mask, magic; };
void part_kern(void **args) __asm__("_Z9part_kern12umctl_part_tPjPiPKj");
void part_kern(void **args)
{
    struct umctl_part p = *(struct umctl_part *)args[0];
    unsigned *hits = *(unsigned **)args[1];
    int *owner = *(int **)args[2];
    dim3 g = fake_cur_grid;
    for (unsigned z = 0; z < g.z; z++)
        for (unsigned y = 0; y < g.y; y++)
            for (unsigned x = 0; x < g.x; x++) {
                unsigned gx = x + p.off[0], gy = y + p.off[1], gz = z + p.off[2];
                if (gx >= p.grid[0] || gy >= p.grid[1] || gz >= p.grid[2])
                    continue;
                size_t t = gx + (size_t)p.grid[0] * (gy + (size_t)p.grid[1] * gz);
                hits[t]++;
                owner[t] = fake_cur_device;
            }
}
void plain_kern(void **args) __asm__("_Z10plain_kernPjPi");
void plain_kern(void **args)
{
    unsigned *hits = *(unsigned **)args[0];
    int *owner = *(int **)args[1];
    dim3 g = fake_cur_grid;
    for (size_t t = 0; t < (size_t)g.x * g.y * g.z; t++)
        hits[t]++, owner[t] = fake_cur_device;
}

static void print_int_list(const char *key, const int *v, size_t n)
{
    printf("\"%s\": [", key);
    for (size_t i = 0; i < n; i++)
        printf("%s%d", i ? ", " : "", v[i]);
    printf("]");
}

/* rtprog part GX GY GZ [plain|nomagic]: one partitionable launch (twice: first marking `in`
   read-only, then not), or a kernel without the convention, or with the convention but no
   magic; prints which device ran each block, how often, the fake's log and the device after. */
static int part(int argc, char **argv)
{
    if (argc < 5)
        return 2;
    dim3 g = {(unsigned)atoi(argv[2]), (unsigned)atoi(argv[3]), (unsigned)atoi(argv[4])};
    const char *variant = argc > 5 ? argv[5] : "part";
    size_t n = (size_t)g.x * g.y * g.z;
    void *hits, *owner, *in;
    if (cudaMalloc(&hits, n * 4) || cudaMalloc(&owner, n * 4) || cudaMalloc(&in, n * 4))
        return 1;
    memset(hits, 0, n * 4);
    memset(owner, 0xff, n * 4);
    dim3 b = {16, 16, 1};
    fake_log_clear();
    int rc = 0;
    if (!strcmp(variant, "plain")) {
        void *args[2] = {&hits, &owner};
        rc = cudaLaunchKernel((void *)plain_kern, g, b, args, 0, NULL);
    } else {
        struct umctl_part p = {{0, 0, 0}, {g.x, g.y, g.z}, 1u << 3, strcmp(variant, "nomagic") ? 0x54504d55u : 0};
        void *args[4] = {&p, &hits, &owner, &in};
        rc = cudaLaunchKernel((void *)part_kern, g, b, args, 0, NULL);
        int *own = owner;
        int first[4096];
        memcpy(first, own, (n < 4096 ? n : 4096) * 4);
        p.ro_mask = 0;   /* a second kernel writing `in` (as far as the runtime knows) */
        rc |= __cudaLaunchKernel((void *)part_kern, g, b, args, 0, NULL) << 8;   /* the <<<>>> stub's path */
        memcpy(owner, first, (n < 4096 ? n : 4096) * 4);
        if (p.off[0] || p.off[1] || p.off[2] || p.ro_mask)
            rc |= 1 << 16;   /* the caller's argument must be as it was */
    }
    int dev = -1;
    cudaGetDevice(&dev);
    printf("RESULT {\"rc\": %d, \"dev_after\": %d, ", rc, dev);
    print_int_list("owner", owner, n);
    printf(", ");
    print_int_list("hits", (int *)hits, n);
    printf(", \"log\": \"");
    for (const char *c = fake_log_text(); *c; c++)
        printf(*c == '\n' ? "\\n" : "%c", *c);
    printf("\"}\n");
    return 0;
}

static void register_params(void)
{
    const char *path = getenv("FAKE_LIBCUDA");
    void *h = path ? dlopen(path, RTLD_NOW | RTLD_GLOBAL) : NULL;
    void (*set)(void *, int, const size_t *) = h ? (void (*)(void *, int, const size_t *))dlsym(h, "fake_set_params") : NULL;
    size_t four[4] = {8, 8, 8, 8}, two[2] = {8, 8}, pk[4] = {32, 8, 8, 8};
    if (set) {
        set((void *)vec_add, 4, four);
        set((void *)sum_bytes, 2, two);
        set((void *)part_kern, 4, pk);
        set((void *)plain_kern, 2, two);
    }
}

static int basic(void)
{
    size_t n = 2 * MB, bytes = n * 4;
    uint32_t *hA = malloc(bytes), *hB = malloc(bytes), *hC = malloc(bytes);
    for (size_t i = 0; i < n; i++)
        hA[i] = (uint32_t)(i * 2654435761u), hB[i] = (uint32_t)(i ^ 0x5a5a);
    void *dA, *dB, *dC;
    if (cudaMalloc(&dA, bytes) || cudaMalloc(&dB, bytes) || cudaMalloc(&dC, bytes))
        return 1;
    cudaMemcpy(dA, hA, bytes, H2D);
    cudaMemcpyAsync(dB, hB, bytes, H2D, NULL);
    dim3 g = {(unsigned)(n / 256), 1, 1}, b = {256, 1, 1};
    uint64_t nn = n;
    void *args[4] = {&dA, &dB, &dC, &nn};
    cudaLaunchKernel((void *)vec_add, g, b, args, 0, NULL);
    uint64_t half = n / 2;
    void *args2[4] = {&dA, &dB, &dC, &half};
    __cudaLaunchKernel((void *)vec_add, g, b, args2, 0, NULL);   /* what a <<<>>> stub calls */
    /* PyTorch on CUDA 13 launches through cudaLaunchKernelExC: same kernel, same identity */
    launch_config cfg = {g, b, 0, NULL, NULL, 0};
    cudaLaunchKernelExC(&cfg, (void *)vec_add, args2);
    cudaMemcpy(hC, dC, bytes, D2H);
    cudaDeviceSynchronize();
    printf("RESULT {\"checksum\": %llu, \"type_dA\": %d, \"device_allocs\": %d, \"managed_allocs\": %d, "
           "\"launches\": %d, \"dA\": %llu, \"dB\": %llu, \"dC\": %llu, \"hA\": %llu, \"bytes\": %zu}\n",
           (unsigned long long)checksum((unsigned char *)hC, bytes), type_of(dA), fake_device_allocs,
           fake_managed_allocs, fake_launches, (unsigned long long)(uintptr_t)dA, (unsigned long long)(uintptr_t)dB,
           (unsigned long long)(uintptr_t)dC, (unsigned long long)(uintptr_t)hA, bytes);
    cudaFree(dA), cudaFree(dB), cudaFree(dC);
    return 0;
}

static void fill(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(i * seed + (i >> 12));
}

/* HUM §4.2: the host rewrites (or frees) the source right after the copy returned; the device
   must still receive the bytes as they were at the call. */
static int race(int sync_only)
{
    size_t n = 16 * MB + 1000;
    unsigned char *base = malloc(n + 200), *src = base + 100, *exp = malloc(n), *out = malloc(n);
    void *dst;
    if (cudaMalloc(&dst, n))
        return 1;
    fill(src, n, 7);
    memcpy(exp, src, n);
    if (sync_only)   /* a program that never calls cudaMemcpyAsync itself (nvcc samples) */
        cudaMemcpy(dst, src, n, H2D);
    else
        cudaMemcpyAsync(dst, src, n, H2D, NULL);
    memset(src, 0xEE, n);                    /* the whole source, at once */
    cudaMemcpy(out, dst, n, D2H);
    int race_ok = memcmp(out, exp, n) == 0;

    fill(src, n, 13);
    memcpy(exp, src, n);
    cudaMemcpy(dst, src, n, H2D);
    src[n - 5000] ^= 0xFF;                   /* one page near the end, not yet copied */
    unsigned char after = src[n - 5000];
    cudaMemcpy(out, dst, n, D2H);
    int tail_ok = memcmp(out, exp, n) == 0 && src[n - 5000] == after;

    fill(src, n, 29);
    memcpy(exp, src, n);
    cudaMemcpy(dst, src, n, H2D);
    free(base);                              /* the source freed while its copy is pending */
    cudaMemcpy(out, dst, n, D2H);
    int free_ok = memcmp(out, exp, n) == 0;
    printf("RESULT {\"race_ok\": %d, \"tail_ok\": %d, \"free_ok\": %d, \"checksum\": %llu}\n", race_ok, tail_ok,
           free_ok, (unsigned long long)checksum(out, n));
    cudaFree(dst);
    return 0;
}

/* A launch that bypasses cudaLaunchKernel (like cuBLAS) must still see the copied bytes. */
static int driver(void)
{
    size_t n = 8 * MB;
    unsigned char *src = malloc(n);
    void *dst;
    if (cudaMalloc(&dst, n))
        return 1;
    fill(src, n, 3);
    cudaMemcpyAsync(dst, src, n, H2D, NULL);
    uint64_t nn = n;
    void *args[2] = {&dst, &nn};
    int r = fake_driver_launch((void *)sum_bytes, args);
    uint64_t got = sum_out;
    void *args2[2] = {&src, &nn};
    sum_bytes(args2);
    printf("RESULT {\"driver_rc\": %d, \"driver_ok\": %d, \"checksum\": %llu}\n", r, got == sum_out,
           (unsigned long long)got);
    return 0;
}

/* The PyTorch pluggable-allocator entry points of the runtime, as torch calls them. */
typedef void *(*malloc_fn)(ssize_t, int, void *);
typedef void (*free_fn)(void *, ssize_t, int, void *);
static int allocator_entries(malloc_fn *m, free_fn *f)
{
    *m = (malloc_fn)dlsym(RTLD_DEFAULT, "umctl_rt_malloc");
    *f = (free_fn)dlsym(RTLD_DEFAULT, "umctl_rt_free");
    return *m && *f;
}

static int allocator(void)
{
    malloc_fn m;
    free_fn f;
    if (!allocator_entries(&m, &f))
        return 3;
    size_t n = (size_t)3 << 20;            /* rounded to 4 MiB blocks by the runtime */
    void *a = m((ssize_t)n, 0, NULL);      /* ALLOC */
    f(a, (ssize_t)n, 0, NULL);             /* cached: BLOCK_INACTIVE */
    void *b = m((ssize_t)n, 0, NULL);      /* the cached block again: BLOCK_ACTIVE */
    void *c = m((ssize_t)n, 0, NULL);      /* ALLOC */
    f(b, (ssize_t)n, 0, NULL);             /* cached (the cache holds 4 MiB): BLOCK_INACTIVE */
    f(c, (ssize_t)n, 0, NULL);             /* cache full: FREE */
    printf("RESULT {\"a\": %llu, \"b\": %llu, \"c\": %llu, \"managed_allocs\": %d}\n",
           (unsigned long long)(uintptr_t)a, (unsigned long long)(uintptr_t)b, (unsigned long long)(uintptr_t)c,
           fake_managed_allocs);
    return 0;
}

/* Safe invalidation (UMCTL_RT_CONTROL): the test plays umctl and asks, over the control
   socket, for discards of blocks freed into the runtime's cache. The runtime's UVM_DISCARD
   ioctls on fd 1000 (no such fd: the test's stand-in for the va_space) land in this program's
   ioctl below, which logs them. Steps wait for a line on stdin so the test can ask in between. */
#define FAKE_UVM_FD 1000
static char discard_log[8192];
int ioctl(int fd, unsigned long req, ...)
{
    va_list ap;
    va_start(ap, req);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    if (fd == FAKE_UVM_FD && req == 80) {
        struct { uint64_t base, length, flags; uint32_t status, pad; } *p = arg;
        size_t l = strlen(discard_log);
        snprintf(discard_log + l, sizeof discard_log - l, "%s[%llu, %llu, %llu]", l ? ", " : "",
                 (unsigned long long)p->base, (unsigned long long)p->length, (unsigned long long)p->flags);
        p->status = 0;
        return 0;
    }
    int (*real)(int, unsigned long, ...) = (int (*)(int, unsigned long, ...))dlsym(RTLD_NEXT, "ioctl");
    return real(fd, req, arg);
}

static void step(const char *say)
{
    char line[64];
    printf("%s\n", say);
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin))
        exit(4);
}

static int discard(void)
{
    malloc_fn m;
    free_fn f;
    if (!allocator_entries(&m, &f))
        return 3;
    size_t n = 4 * MB;
    void *s = NULL, *h = NULL;
    if (cudaStreamCreateWithFlags(&s, 1) || cudaMallocHost(&h, n))
        return 5;
    memset(h, 7, n);
    void *a = m((ssize_t)n, 0, s), *b = m((ssize_t)n, 0, NULL), *c = m((ssize_t)n, 0, NULL);
    cudaMemcpyAsync(a, h, n, 1, s);        /* deferred: still pending on s when a is freed */
    f(a, (ssize_t)n, 0, s);                /* cached, its free event not complete */
    f(b, (ssize_t)n, 0, NULL);             /* cached, idle; c stays in use */
    printf("BLOCKS {\"a\": %llu, \"b\": %llu, \"c\": %llu}\n", (unsigned long long)(uintptr_t)a,
           (unsigned long long)(uintptr_t)b, (unsigned long long)(uintptr_t)c);
    step("READY");
    cudaStreamSynchronize(s);              /* a's last use is done */
    step("SYNCED");
    void *x = m((ssize_t)n, 0, NULL), *y = m((ssize_t)n, 0, NULL);   /* a and b handed out again */
    step("REUSED");
    int same = (x == a || x == b) && (y == a || y == b) && x != y;
    printf("RESULT {\"discards\": [%s], \"reused\": %d}\n", discard_log, same);
    return 0;
}

/* A pluggable allocator over the driver API (benchmarks/gpu/workloads/managed_alloc.c): cuMemAllocManaged and
   cuMemFree_v2 reached with dlsym, and once through cuGetProcAddress as cudart does. */
static int driver_alloc(void)
{
    const char *path = getenv("FAKE_LIBCUDA");
    void *h = dlopen(path ? path : "libcuda.so.1", RTLD_NOW);
    if (!h)
        return 99;
    int (*am)(uint64_t *, size_t, unsigned) = (int (*)(uint64_t *, size_t, unsigned))dlsym(h, "cuMemAllocManaged");
    int (*fr)(uint64_t) = (int (*)(uint64_t))dlsym(h, "cuMemFree_v2");
    int (*gpa)(const char *, void **, int, uint64_t, void *) =
        (int (*)(const char *, void **, int, uint64_t, void *))dlsym(h, "cuGetProcAddress_v2");
    void *am2 = NULL;
    if (!am || !fr || !gpa || gpa("cuMemAllocManaged", &am2, 13000, 0, NULL) || !am2)
        return 98;
    uint64_t a = 0, b = 0, c = 0;
    if (am(&a, 2 * MB, 1) || am(&b, 4 * MB, 1) || fr(a) ||
        ((int (*)(uint64_t *, size_t, unsigned))am2)(&c, 2 * MB, 1) || fr(b) || fr(c))
        return 97;
    printf("RESULT {\"a\": %llu, \"b\": %llu, \"c\": %llu}\n", (unsigned long long)a, (unsigned long long)b,
           (unsigned long long)c);
    return 0;
}

/* Many HUM copies of random sizes and alignments, each followed at once by writes into its
   source (all of it, a few random pages, its first or last page, or none): the device must get
   the bytes as they were at the call, every time. */
static int stress(void)
{
    size_t cap = 40 * MB;
    unsigned char *buf = malloc(cap + 8192), *exp = malloc(cap), *out = malloc(cap);
    void *dst;
    if (!buf || !exp || !out || cudaMalloc(&dst, cap))
        return 1;
    uint64_t r = 0x9E3779B97F4A7C15ULL;
#define RND() (r ^= r << 13, r ^= r >> 7, r ^= r << 17, r)
    int ok = 1, n = 24;
    for (int it = 0; it < n; it++) {
        size_t len = MB + RND() % (cap - 2 * MB), off = RND() % 4096;
        unsigned char *src = buf + off;
        fill(src, len, (unsigned)(it * 7 + 3));
        memcpy(exp, src, len);
        if (RND() % 2)
            cudaMemcpyAsync(dst, src, len, H2D, NULL);
        else
            cudaMemcpy(dst, src, len, H2D);
        switch (RND() % 5) {
        case 0: memset(src, 0xA5, len); break;
        case 1: for (int k = 0; k < 8; k++) src[RND() % len] ^= 0xFF; break;
        case 2: src[0] ^= 0x0F; src[len - 1] ^= 0xF0; break;
        case 3: src[len / 2] = 1; break;
        default: break;
        }
        cudaMemcpy(out, dst, len, D2H);
        ok &= memcmp(out, exp, len) == 0;
    }
#undef RND
    printf("RESULT {\"stress_ok\": %d, \"copies\": %d}\n", ok, n);
    cudaFree(dst);
    free(buf), free(exp), free(out);
    return 0;
}

/* The same kernel with the same arguments twice per "step", three steps, the host waiting for
   the GPU after each: launch identities must repeat step to step. */
static int steps(void)
{
    size_t n = 1024;
    void *d;
    if (cudaMalloc(&d, n * 4))
        return 1;
    dim3 g = {4, 1, 1}, b = {256, 1, 1};
    uint64_t nn = n;
    void *args[4] = {&d, &d, &d, &nn};
    for (int s = 0; s < 3; s++) {
        cudaLaunchKernel((void *)vec_add, g, b, args, 0, NULL);
        cudaLaunchKernel((void *)vec_add, g, b, args, 0, NULL);
        if (s == 1)
            cudaStreamSynchronize(NULL);
        else
            cudaDeviceSynchronize();
    }
    printf("RESULT {\"steps\": 3}\n");
    cudaFree(d);
    return 0;
}

int main(int argc, char **argv)
{
    register_params();
    const char *mode = argc > 1 ? argv[1] : "basic";
    if (!strcmp(mode, "basic"))
        return basic();
    if (!strcmp(mode, "race"))
        return race(0);
    if (!strcmp(mode, "race-sync"))
        return race(1);
    if (!strcmp(mode, "driver"))
        return driver();
    if (!strcmp(mode, "allocator"))
        return allocator();
    if (!strcmp(mode, "discard"))
        return discard();
    if (!strcmp(mode, "driver-alloc"))
        return driver_alloc();
    if (!strcmp(mode, "part"))
        return part(argc, argv);
    if (!strcmp(mode, "steps"))
        return steps();
    if (!strcmp(mode, "stress"))
        return stress();
    return 2;
}
