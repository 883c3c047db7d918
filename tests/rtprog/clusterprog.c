/* A single-GPU program in the SnuRHAC convention for the cluster tests (tests/test_cluster_live.py),
 * on the fake CUDA runtime (fakecudart.c: kernels are host functions run at the launch call).
 *
 *   clusterprog N STEPS [WAIT]
 *
 * cudaMalloc A, B, C (N x N ints) and two N x N grids; copies A, B and grid 0 in; launches
 * C = A x B (a thread block a row of C: every block reads all of B; A and B marked read-only),
 * then STEPS steps of a 5-point stencil between the grids (halo rows from the neighbouring bands;
 * rows of N ints do not end on page boundaries, so neighbouring slabs write the same pages),
 * copies A in again (the same bytes: a host-to-device copy after a kernel, which must not make
 * the runtime sync), then B = 3B + 1 in place by rows (B loses its read-only mark), reads C back
 * (no device synchronisation first), D = A x B into C's place; reads C and the last grid back and
 * prints `RESULT <checksum of C> <checksum of D> <checksum of the grid>`: equal with and without
 * the runtime, on one node or several, whatever WAIT is.
 *
 * WAIT: how the host waits for the kernels before it reads (read_back):
 *   device (default): cudaMemcpy back (the first read of C and the grid with cudaMemcpyDefault),
 *     cudaDeviceSynchronize before the last reads;
 *   stream: cudaStreamSynchronize, then the host reads the managed buffer itself;
 *   event: cudaEventRecord + cudaEventSynchronize, then the host reads the managed buffer itself;
 *   async: cudaMemcpyAsync to the host (same kinds as device), then cudaStreamSynchronize.
 * Besides device, the host also waits once right after the copies in, before any kernel.
 * CLUSTERPROG_NODE0_LAG_MS: node 0 (UMCTL_RT_NODE=0) sleeps that long before its copies in, so
 * that the other nodes reach that first wait before node 0's host data reached its agent. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct { unsigned x, y, z; } dim3;
int cudaMalloc(void **, size_t);
int cudaMemcpy(void *, const void *, size_t, int);
int cudaLaunchKernel(const void *, dim3, dim3, void **, size_t, void *);
int cudaDeviceSynchronize(void);
int cudaMemcpyAsync(void *, const void *, size_t, int, void *);
int cudaStreamSynchronize(void *);
int cudaEventCreateWithFlags(void **, unsigned);
int cudaEventRecord(void *, void *);
int cudaEventSynchronize(void *);
extern __thread dim3 fake_cur_grid;
enum { H2D = 1, D2H = 2, DEFAULT = 4 };   /* DEFAULT: the runtime tells the direction from the pointers */

struct umctl_part { unsigned off[3], grid[3], ro_mask, magic; };
static unsigned N;

/* rows of this launch: blockIdx.y + off over the launch's grid, bounded by the full grid */
#define ROWS(p, r) for (unsigned r = (p).off[1]; r < (p).off[1] + fake_cur_grid.y && r < (p).grid[1]; r++)

void gemm_k(void **args) __asm__("_Z6gemm_k12umctl_part_tPKiS1_Pi");
void gemm_k(void **args)
{
    struct umctl_part p = *(struct umctl_part *)args[0];
    const int *A = *(int **)args[1], *B = *(int **)args[2];
    int *C = *(int **)args[3];
    ROWS(p, i)
        for (unsigned j = 0; j < N; j++) {
            int s = 0;
            for (unsigned k = 0; k < N; k++)
                s += A[i * N + k] * B[k * N + j];
            C[i * N + j] = s;
        }
}

void stencil_k(void **args) __asm__("_Z9stencil_k12umctl_part_tPKiPi");
void stencil_k(void **args)
{
    struct umctl_part p = *(struct umctl_part *)args[0];
    const int *src = *(int **)args[1];
    int *dst = *(int **)args[2];
    ROWS(p, i)
        for (unsigned j = 0; j < N; j++) {
            int s = src[i * N + j];
            s += i > 0 ? src[(i - 1) * N + j] : 0;
            s += i + 1 < N ? src[(i + 1) * N + j] : 0;
            s += j > 0 ? src[i * N + j - 1] : 0;
            s += j + 1 < N ? src[i * N + j + 1] : 0;
            dst[i * N + j] = s % 1009;
        }
}

void scale_k(void **args) __asm__("_Z7scale_k12umctl_part_tPi");
void scale_k(void **args)
{
    struct umctl_part p = *(struct umctl_part *)args[0];
    int *B = *(int **)args[1];
    ROWS(p, i)
        for (unsigned j = 0; j < N; j++)
            B[i * N + j] = B[i * N + j] * 3 + 1;
}

static uint64_t checksum(const void *v, size_t n)
{
    const unsigned char *p = v;
    uint64_t s = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++)
        s = (s ^ p[i]) * 1099511628211ULL;
    return s;
}

static const char *wait_mode = "device";
static void *wait_ev;

/* The host waits for the kernels queued on the default stream, WAIT's way (never device-wide). */
static void host_wait(void)
{
    int e = 0;
    if (!strcmp(wait_mode, "event"))
        e = cudaEventRecord(wait_ev, NULL) || cudaEventSynchronize(wait_ev);
    else
        e = cudaStreamSynchronize(NULL);
    if (e) {
        fprintf(stderr, "wait failed\n");
        exit(1);
    }
}

/* n bytes of the managed buffer d into h, as WAIT says (kind: the copy's direction). */
static void read_back(void *h, const void *d, size_t n, int kind)
{
    if (!strcmp(wait_mode, "device")) {
        cudaMemcpy(h, d, n, kind);
    } else if (!strcmp(wait_mode, "async")) {
        cudaMemcpyAsync(h, d, n, kind, NULL);
        host_wait();
    } else {
        host_wait();
        memcpy(h, d, n);   /* the host reads managed memory itself */
    }
}

static void launch(void *k, unsigned ro_mask, void **args)
{
    dim3 g = {1, N, 1}, b = {32, 1, 1};
    struct umctl_part *p = args[0];
    *p = (struct umctl_part){{0, 0, 0}, {1, N, 1}, ro_mask, 0x54504d55u};
    if (cudaLaunchKernel(k, g, b, args, 0, NULL)) {
        fprintf(stderr, "launch failed\n");
        exit(1);
    }
}

int main(int argc, char **argv)
{
    N = argc > 1 ? (unsigned)atoi(argv[1]) : 96;
    int steps = argc > 2 ? atoi(argv[2]) : 4;
    wait_mode = argc > 3 ? argv[3] : "device";
    if (strcmp(wait_mode, "device") && strcmp(wait_mode, "stream") && strcmp(wait_mode, "event") &&
        strcmp(wait_mode, "async")) {
        fprintf(stderr, "WAIT: device, stream, event or async\n");
        return 2;
    }
    if (!strcmp(wait_mode, "event") && cudaEventCreateWithFlags(&wait_ev, 0))
        return 1;
    const char *path = getenv("FAKE_LIBCUDA");   /* parameter sizes, as cuFuncGetParamInfo gives them */
    void *h = path ? dlopen(path, RTLD_NOW | RTLD_GLOBAL) : NULL;
    void (*set)(void *, int, const size_t *) = h ? (void (*)(void *, int, const size_t *))dlsym(h, "fake_set_params") : NULL;
    size_t four[4] = {32, 8, 8, 8}, three[3] = {32, 8, 8}, two[2] = {32, 8};
    if (set) {
        set((void *)gemm_k, 4, four);
        set((void *)stencil_k, 3, three);
        set((void *)scale_k, 2, two);
    }
    size_t bytes = (size_t)N * N * sizeof(int);
    int *hA = malloc(bytes), *hB = malloc(bytes), *hG = malloc(bytes), *hC = malloc(bytes);
    for (size_t i = 0; i < (size_t)N * N; i++)
        hA[i] = (int)((i * 7 + 3) % 11) - 5, hB[i] = (int)((i * 5 + 1) % 13) - 6, hG[i] = (int)((i * 31 + 7) % 1009);
    int *A, *B, *C, *G[2];
    if (cudaMalloc((void **)&A, bytes) || cudaMalloc((void **)&B, bytes) || cudaMalloc((void **)&C, bytes) ||
        cudaMalloc((void **)&G[0], bytes) || cudaMalloc((void **)&G[1], bytes))
        return 1;
    const char *lag = getenv("CLUSTERPROG_NODE0_LAG_MS"), *node = getenv("UMCTL_RT_NODE");
    if (lag && node && atoi(node) == 0)
        usleep((useconds_t)atoi(lag) * 1000);
    cudaMemcpy(A, hA, bytes, H2D);
    cudaMemcpy(B, hB, bytes, DEFAULT);
    cudaMemcpy(G[0], hG, bytes, H2D);
    if (strcmp(wait_mode, "device"))
        host_wait();   /* before any kernel: nothing to bring, and the copies in must stay */
    struct umctl_part p;
    void *g3[4] = {&p, &A, &B, &C};
    launch((void *)gemm_k, 1u << 1 | 1u << 2, g3);
    for (int s = 0; s < steps; s++) {
        void *st[3] = {&p, &G[s & 1], &G[(s + 1) & 1]};
        launch((void *)stencil_k, 1u << 1, st);
    }
    cudaMemcpy(A, hA, bytes, H2D);   /* the same bytes again: host-to-device, no sync */
    void *sc[2] = {&p, &B};
    launch((void *)scale_k, 0, sc);
    uint64_t c1 = 0;
    read_back(hC, C, bytes, DEFAULT);   /* no cudaDeviceSynchronize first: the read's own wait brings C */
    c1 = checksum(hC, bytes);
    launch((void *)gemm_k, 1u << 1 | 1u << 2, g3);
    if (!strcmp(wait_mode, "device"))
        cudaDeviceSynchronize();
    read_back(hC, C, bytes, D2H);
    read_back(hG, G[steps & 1], bytes, DEFAULT);
    printf("RESULT %016llx %016llx %016llx\n", (unsigned long long)c1, (unsigned long long)checksum(hC, bytes),
           (unsigned long long)checksum(hG, bytes));
    return 0;
}
