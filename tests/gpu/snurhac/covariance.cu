/* PolyBench covariance (m variables, n samples) as a single-GPU program after SnuRHAC's compiler
 * (see common.cuh): column means (a thread per column: reads all of data, writes its band of mean),
 * centring (2-D grid, partitioned along y: data in row bands, mean read whole), then covar_kernel:
 * a thread per column j1 computes symmat[j1][j2] for j2 >= j1 and mirrors it into symmat[j2][j1],
 * so every GPU's writes span the whole of symmat: §6.4's write-overlap rule keeps it on one GPU
 * (the thesis runs covariance on a single GPU for this reason). Every entry's arithmetic is the
 * same whatever the partition, so the results are bitwise those of the plain run; the check
 * compares sampled entries with a double-precision reference, to float summation's accuracy.
 *     covariance [m=1024] [n=1024] */
#include <cmath>

#include "common.cuh"

#define T1 256
#define T3 64   /* covar: a thread per column, small blocks so that more SMs take part */
#define TX 32
#define TY 8

__global__ void mean_kernel(umctl_part_t p, float *__restrict__ mean, const float *__restrict__ data, int m, int n)
{
    const int j = UMCTL_BLOCK_X(p) * T1 + threadIdx.x;
    if (j >= m)
        return;
    float s = 0.f;
    for (int i = 0; i < n; i++)
        s += data[(size_t)i * m + j];
    mean[j] = s;   /* the sum: PolyBench divides by the float factor; sums keep it exact here */
}

__global__ void reduce_kernel(umctl_part_t p, float *__restrict__ data, const float *__restrict__ mean, int m, int n)
{
    const int j = UMCTL_BLOCK_X(p) * TX + threadIdx.x, i = UMCTL_BLOCK_Y(p) * TY + threadIdx.y;
    if (i < n && j < m)
        data[(size_t)i * m + j] = data[(size_t)i * m + j] * (float)n - mean[j];   /* n (x - mean) */
}

__global__ void covar_kernel(umctl_part_t p, float *__restrict__ symmat, const float *__restrict__ data, int m, int n)
{
    const int j1 = UMCTL_BLOCK_X(p) * T3 + threadIdx.x;
    if (j1 >= m)
        return;
    for (int j2 = j1; j2 < m; j2++) {
        float s = 0.f;
        for (int i = 0; i < n; i++)
            s += data[(size_t)i * m + j1] * data[(size_t)i * m + j2];
        symmat[(size_t)j1 * m + j2] = s;
        symmat[(size_t)j2 * m + j1] = s;
    }
}

static inline int d_at(long i, long j) { return (int)((i * 3 + j * 7) % 5) - 2; }

int main(int argc, char **argv)
{
    const long m = arg_or(argc, argv, 1, 1024), n = arg_or(argc, argv, 2, 1024);
    if (m <= 0 || n <= 0 || m % T1 || n % TY || m > 16384 || n > 16384) {
        fprintf(stderr, "covariance: m a multiple of %d, n of %d, both at most 16384\n", T1, TY);
        return 2;
    }
    const size_t db = (size_t)n * m * sizeof(float), sb = (size_t)m * m * sizeof(float);
    float *hd = (float *)malloc(db), *hs = (float *)malloc(sb);
    if (!hd || !hs)
        return 2;
    for (long i = 0; i < n; i++)
        for (long j = 0; j < m; j++)
            hd[i * m + j] = (float)d_at(i, j);
    float *data, *mean, *symmat;
    CK(cudaMalloc(&data, db));
    CK(cudaMalloc(&mean, m * sizeof(float)));
    CK(cudaMalloc(&symmat, sb));
    CK(cudaDeviceSynchronize());
    Timer tk;
    const double t0 = now_ms();
    CK(cudaMemcpy(data, hd, db, cudaMemcpyHostToDevice));
    tk.start();
    const dim3 g1(m / T1), g2(m / TX, n / TY), g3(m / T3);
    /* mean: bit 1 mean (written, banded along x), bit 2 data (read whole: a column per thread) */
    mean_kernel<<<g1, T1>>>(umctl_part_ranges(g1, 1u << 2, 1u << 1, 1u << 1, 0), mean, data, (int)m, (int)n);
    /* centring: bit 1 data (read and written in row bands), bit 2 mean (read whole) */
    reduce_kernel<<<g2, dim3(TX, TY)>>>(umctl_part_ranges(g2, 1u << 2, 1u << 1, 1u << 1, 0), data, mean, (int)m, (int)n);
    /* covar: bit 1 symmat (written by rows and by columns: not banded), bit 2 data (read whole) */
    covar_kernel<<<g3, T3>>>(umctl_part_ranges(g3, 1u << 2, 1u << 1, 0, 0), symmat, data, (int)m, (int)n);
    CK(cudaGetLastError());
    const float kms = tk.stop();
    CK(cudaMemcpy(hs, symmat, sb, cudaMemcpyDeviceToHost));
    const double t1 = now_ms();
    const uint64_t sum = checksum(hs, sb);
    long *colsum = (long *)calloc(m, sizeof(long));
    for (long i = 0; i < n; i++)
        for (long j = 0; j < m; j++)
            colsum[j] += d_at(i, j);
    bool ok = true;
    for (int s = 0; s < 32; s++) {
        const long a = (s * 7919L) % m, b = (s * 104729L + 13) % m;
        double ref = 0, aa = 0, bb = 0;
        for (long i = 0; i < n; i++) {
            const double x = (double)d_at(i, a) * n - colsum[a], y = (double)d_at(i, b) * n - colsum[b];
            ref += x * y, aa += x * x, bb += y * y;
        }
        if (!(fabs(hs[a * m + b] - ref) <= 1e-4 * sqrt(aa * bb) + 1e-3) || hs[a * m + b] != hs[b * m + a]) {
            fprintf(stderr, "covariance: symmat[%ld][%ld] = %.1f, expected %.1f\n", a, b, hs[a * m + b], ref);
            ok = false;
        }
    }
    free(colsum);
    CK(cudaFree(data));
    CK(cudaFree(mean));
    CK(cudaFree(symmat));
    return report(t1 - t0, kms, sum, ok);
}
