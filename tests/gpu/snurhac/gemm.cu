/* PolyBench gemm, C = A B + C (n x n floats), as a single-GPU program after SnuRHAC's compiler
 * (see common.cuh). A shared-memory tiled kernel: a 32 x 32 tile of C per thread block, grid
 * (n/32, n/32): SnuRHAC partitions it along y (row bands; every band reads all of B, which is
 * why gemm scales sublinearly, §7.3). A and B are marked read-only (§6.4); A and C are read and
 * written in row bands that follow the grid's y, B is read whole (umctl_part_ranges).
 * Inputs are small integers, so every result is exact in float whatever the summation order:
 * sampled elements are compared exactly with an integer CPU reference.
 *     gemm [n=8192] */
#include "common.cuh"

#define TILE 32
#define ROWS 8   /* threads per block in y; each computes TILE/ROWS rows */

__global__ void gemm_kernel(umctl_part_t p, const float *__restrict__ A, const float *__restrict__ B,
                            float *__restrict__ C, int n)
{
    __shared__ float As[TILE][TILE + 1], Bs[TILE][TILE + 1];
    const int by = UMCTL_BLOCK_Y(p), bx = UMCTL_BLOCK_X(p);
    if (by >= (int)UMCTL_GRID_Y(p) || bx >= (int)UMCTL_GRID_X(p))
        return;
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int col = bx * TILE + tx;
    float acc[TILE / ROWS] = {0};
    for (int k0 = 0; k0 < n; k0 += TILE) {
        for (int r = ty; r < TILE; r += ROWS) {
            As[r][tx] = A[(size_t)(by * TILE + r) * n + k0 + tx];
            Bs[r][tx] = B[(size_t)(k0 + r) * n + col];
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < TILE; k++) {
            const float b = Bs[k][tx];
#pragma unroll
            for (int i = 0; i < TILE / ROWS; i++)
                acc[i] += As[ty + i * ROWS][k] * b;
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < TILE / ROWS; i++) {
        const size_t idx = (size_t)(by * TILE + ty + i * ROWS) * n + col;
        C[idx] += acc[i];
    }
}

static inline int a_at(long i, long j) { return (int)((i * 7 + j * 3) % 5) - 2; }
static inline int b_at(long i, long j) { return (int)((i * 5 + j * 11) % 7) - 3; }
static inline int c_at(long i, long j) { return (int)((i + j * 13) % 9) - 4; }

int main(int argc, char **argv)
{
    const long n = arg_or(argc, argv, 1, 8192);
    if (n <= 0 || n % TILE || n > 32768) {
        fprintf(stderr, "gemm: n must be a positive multiple of %d, at most 32768\n", TILE);
        return 2;
    }
    const size_t bytes = (size_t)n * n * sizeof(float);
    float *hA = (float *)malloc(bytes), *hB = (float *)malloc(bytes), *hC = (float *)malloc(bytes);
    if (!hA || !hB || !hC)
        return 2;
    for (long i = 0; i < n; i++)
        for (long j = 0; j < n; j++) {
            hA[i * n + j] = (float)a_at(i, j);
            hB[i * n + j] = (float)b_at(i, j);
            hC[i * n + j] = (float)c_at(i, j);
        }
    float *A, *B, *C;
    CK(cudaMalloc(&A, bytes));
    CK(cudaMalloc(&B, bytes));
    CK(cudaMalloc(&C, bytes));
    CK(cudaDeviceSynchronize());
    Timer tk;
    const double t0 = now_ms();
    CK(cudaMemcpy(A, hA, bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(B, hB, bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(C, hC, bytes, cudaMemcpyHostToDevice));
    dim3 grid(n / TILE, n / TILE), block(TILE, ROWS);
    tk.start();
    gemm_kernel<<<grid, block>>>(umctl_part_ranges(grid, (1u << 1) | (1u << 2), 1u << 3, (1u << 1) | (1u << 3), 0),
                                 A, B, C, (int)n);
    CK(cudaGetLastError());
    const float kms = tk.stop();
    CK(cudaMemcpy(hC, C, bytes, cudaMemcpyDeviceToHost));
    const double t1 = now_ms();
    const uint64_t sum = checksum(hC, bytes);   /* not timed (a byte-wise hash of 256 MiB: ~0.3 s) */
    /* exact check of 64 x 64 sampled elements (rows and columns spread over all bands) */
    bool ok = true;
    for (int si = 0; si < 64 && ok; si++)
        for (int sj = 0; sj < 64; sj++) {
            long i = (si * (n - 1)) / 63, j = (sj * 7919L + si * 31L) % n;
            long ref = c_at(i, j);
            for (long k = 0; k < n; k++)
                ref += (long)a_at(i, k) * b_at(k, j);
            if ((double)hC[i * n + j] != (double)ref) {
                fprintf(stderr, "gemm: C[%ld][%ld] = %.1f, expected %ld\n", i, j, hC[i * n + j], ref);
                ok = false;
                break;
            }
        }
    CK(cudaFree(A));
    CK(cudaFree(B));
    CK(cudaFree(C));
    return report(t1 - t0, kms, sum, ok);
}
