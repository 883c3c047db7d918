/* PolyBench gesummv, y = alpha A x + beta B x (n x n floats), as a single-GPU program after
 * SnuRHAC's compiler (see common.cuh): one warp per row (coalesced row reads, a shuffle
 * reduction), 8 rows per thread block, grid (n/8): partitioned along x. Dominated by copying
 * its two matrices in (§7.3). A, B and x are read-only (§6.4); A, B, tmp and y are accessed in
 * row bands that follow the grid's x, x is read whole (umctl_part_ranges). Inputs are small
 * integers, so the sampled rows are compared exactly with an integer CPU reference.
 *     gesummv [n=16384] [repeat=1]   (repeat: kernel launches, each recomputing y) */
#include "common.cuh"

#define WARPS 8

__global__ void gesummv_kernel(umctl_part_t p, const float *__restrict__ A, const float *__restrict__ B,
                               const float *__restrict__ x, float *__restrict__ tmp, float *__restrict__ y,
                               int n, float alpha, float beta)
{
    const long row = (long)UMCTL_BLOCK_X(p) * WARPS + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= n)
        return;
    float sa = 0.f, sb = 0.f;
    for (int j = lane; j < n; j += 32) {
        const float xj = x[j];
        sa += A[row * n + j] * xj;
        sb += B[row * n + j] * xj;
    }
    for (int o = 16; o; o >>= 1) {
        sa += __shfl_down_sync(0xffffffffu, sa, o);
        sb += __shfl_down_sync(0xffffffffu, sb, o);
    }
    if (lane == 0) {
        tmp[row] = sa;
        y[row] = alpha * sa + beta * sb;
    }
}

static inline int a_at(long i, long j) { return (int)((i + 2 * j) % 9) - 4; }
static inline int b_at(long i, long j) { return (int)((3 * i + j) % 7) - 3; }
static inline int x_at(long j) { return (int)(j % 5) - 2; }

int main(int argc, char **argv)
{
    const long n = arg_or(argc, argv, 1, 16384);
    const long repeat = arg_or(argc, argv, 2, 1);
    if (n <= 0 || n % WARPS || n > 65536 || repeat < 1) {
        fprintf(stderr, "gesummv: n must be a positive multiple of %d, at most 65536; repeat >= 1\n", WARPS);
        return 2;
    }
    const size_t mb = (size_t)n * n * sizeof(float), vb = (size_t)n * sizeof(float);
    float *hA = (float *)malloc(mb), *hB = (float *)malloc(mb), *hx = (float *)malloc(vb), *hy = (float *)malloc(vb);
    if (!hA || !hB || !hx || !hy)
        return 2;
    for (long i = 0; i < n; i++) {
        hx[i] = (float)x_at(i);
        for (long j = 0; j < n; j++) {
            hA[i * n + j] = (float)a_at(i, j);
            hB[i * n + j] = (float)b_at(i, j);
        }
    }
    float *A, *B, *x, *y, *tmp;
    CK(cudaMalloc(&A, mb));
    CK(cudaMalloc(&B, mb));
    CK(cudaMalloc(&x, vb));
    CK(cudaMalloc(&y, vb));
    CK(cudaMalloc(&tmp, vb));
    CK(cudaDeviceSynchronize());
    Timer tk;
    const double t0 = now_ms();
    CK(cudaMemcpy(A, hA, mb, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(B, hB, mb, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(x, hx, vb, cudaMemcpyHostToDevice));
    dim3 grid(n / WARPS), block(32 * WARPS);
    tk.start();
    for (long r = 0; r < repeat; r++)
        gesummv_kernel<<<grid, block>>>(umctl_part_ranges(grid, (1u << 1) | (1u << 2) | (1u << 3), (1u << 4) | (1u << 5),
                                                          (1u << 1) | (1u << 2) | (1u << 4) | (1u << 5), 0),
                                        A, B, x, tmp, y, (int)n, 2.0f, 3.0f);
    CK(cudaGetLastError());
    const float kms = tk.stop();
    CK(cudaMemcpy(hy, y, vb, cudaMemcpyDeviceToHost));
    const double t1 = now_ms();
    const uint64_t sum = checksum(hy, vb);
    bool ok = true;
    for (int s = 0; s < 256 && ok; s++) {
        const long i = (s * (n - 1)) / 255;
        long sa = 0, sb = 0;
        for (long j = 0; j < n; j++)
            sa += (long)a_at(i, j) * x_at(j), sb += (long)b_at(i, j) * x_at(j);
        const long ref = 2 * sa + 3 * sb;
        if ((double)hy[i] != (double)ref) {
            fprintf(stderr, "gesummv: y[%ld] = %.1f, expected %ld\n", i, hy[i], ref);
            ok = false;
        }
    }
    CK(cudaFree(A));
    CK(cudaFree(B));
    CK(cudaFree(x));
    CK(cudaFree(y));
    CK(cudaFree(tmp));
    return report(t1 - t0, kms, sum, ok);
}
