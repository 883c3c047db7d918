/* Rodinia hotspot-like stencil (n x n floats, two temperature grids and a power grid) as a
 * single-GPU program after SnuRHAC's compiler (see common.cuh): `steps` time steps, each one
 * kernel reading the current grid (5-point stencil: a band needs one halo row from each
 * neighbouring band) and the power grid, writing the next grid. Grid (n/32, n/8): partitioned
 * along y (row bands). The current grid and power are read-only for a step (§6.4), so the
 * temperature grids change flags every step, as in SnuRHAC; all three are accessed in row bands
 * (a halo row each side for `cur`), so under umctl_part_ranges each band stays on its GPU and the
 * halo rows are read from the neighbour's memory. The CPU reference recomputes a few
 * points from their dependence cone (steps rows and columns around them) in double precision.
 *     stencil [n=8192] [steps=20] */
#include <cmath>

#include "common.cuh"

#define BX 32
#define BY 8
#define CAP 0.5f
#define RX 0.1f
#define RY 0.1f
#define RZ 0.01f
#define AMB 80.0f

__global__ void calculate_temp(umctl_part_t p, const float *__restrict__ cur, float *__restrict__ nxt,
                               const float *__restrict__ power, int n)
{
    const int i = UMCTL_BLOCK_Y(p) * BY + threadIdx.y, j = UMCTL_BLOCK_X(p) * BX + threadIdx.x;
    if (i >= n || j >= n)
        return;
    const size_t c = (size_t)i * n + j;
    const float t = cur[c];
    const float tn = cur[c - (i > 0 ? n : 0)], ts = cur[c + (i < n - 1 ? n : 0)];
    const float tw = cur[c - (j > 0)], te = cur[c + (j < n - 1)];
    nxt[c] = t + CAP * (power[c] + (tn + ts - 2.f * t) * RY + (te + tw - 2.f * t) * RX + (AMB - t) * RZ);
}

static inline float t_at(long i, long j) { return 300.0f + (float)((i * 13 + j * 7) % 50); }
static inline float p_at(long i, long j) { return 0.1f * (float)((i * 3 + j * 5) % 11); }

/* temperature at (i, j) after `steps` steps, from its cone of dependence */
static double reference(long n, long i, long j, int steps)
{
    const long r0 = i - steps < 0 ? 0 : i - steps, r1 = i + steps >= n ? n - 1 : i + steps;
    const long c0 = j - steps < 0 ? 0 : j - steps, c1 = j + steps >= n ? n - 1 : j + steps;
    const long h = r1 - r0 + 1, w = c1 - c0 + 1;
    double *a = (double *)malloc(h * w * sizeof(double)), *b = (double *)malloc(h * w * sizeof(double));
    for (long y = 0; y < h; y++)
        for (long x = 0; x < w; x++)
            a[y * w + x] = t_at(r0 + y, c0 + x);
    for (int s = 0; s < steps; s++) {
        for (long y = 0; y < h; y++)
            for (long x = 0; x < w; x++) {
                /* a window edge that is not the grid's edge has no valid neighbour: its value
                   goes stale, which never reaches the centre within `steps` steps */
                const long gi = r0 + y, gj = c0 + x;
                const double t = a[y * w + x];
                const double tn = gi > 0 && y > 0 ? a[(y - 1) * w + x] : t;
                const double ts = gi < n - 1 && y < h - 1 ? a[(y + 1) * w + x] : t;
                const double tw = gj > 0 && x > 0 ? a[y * w + x - 1] : t;
                const double te = gj < n - 1 && x < w - 1 ? a[y * w + x + 1] : t;
                b[y * w + x] = t + CAP * (p_at(gi, gj) + (tn + ts - 2 * t) * RY + (te + tw - 2 * t) * RX + (AMB - t) * RZ);
            }
        double *tmp = a;
        a = b, b = tmp;
    }
    const double v = a[(i - r0) * w + (j - c0)];
    free(a);
    free(b);
    return v;
}

int main(int argc, char **argv)
{
    const long n = arg_or(argc, argv, 1, 8192);
    const int steps = (int)arg_or(argc, argv, 2, 20);
    if (n <= 0 || n % BX || n % BY || n > 32768 || steps < 1 || steps > 1000) {
        fprintf(stderr, "stencil: n must be a positive multiple of %d (at most 32768), 1 <= steps <= 1000\n", BX);
        return 2;
    }
    const size_t bytes = (size_t)n * n * sizeof(float);
    float *ht = (float *)malloc(bytes), *hp = (float *)malloc(bytes);
    if (!ht || !hp)
        return 2;
    for (long i = 0; i < n; i++)
        for (long j = 0; j < n; j++)
            ht[i * n + j] = t_at(i, j), hp[i * n + j] = p_at(i, j);
    float *temp_a, *temp_b, *power;
    CK(cudaMalloc(&temp_a, bytes));
    CK(cudaMalloc(&temp_b, bytes));
    CK(cudaMalloc(&power, bytes));
    CK(cudaDeviceSynchronize());
    Timer tk;
    const double t0 = now_ms();
    CK(cudaMemcpy(temp_a, ht, bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(power, hp, bytes, cudaMemcpyHostToDevice));
    dim3 grid(n / BX, n / BY), block(BX, BY);
    tk.start();
    for (int s = 0; s < steps; s++) {
        const float *cur = s % 2 ? temp_b : temp_a;
        float *nxt = s % 2 ? temp_a : temp_b;
        calculate_temp<<<grid, block>>>(umctl_part_ranges(grid, (1u << 1) | (1u << 3), 1u << 2, 7u << 1, 0), cur, nxt,
                                        power, (int)n);
    }
    CK(cudaGetLastError());
    const float kms = tk.stop();
    CK(cudaMemcpy(ht, steps % 2 ? temp_b : temp_a, bytes, cudaMemcpyDeviceToHost));
    const double t1 = now_ms();
    const uint64_t sum = checksum(ht, bytes);
    bool ok = true;
    const long pts[][2] = {{0, 0}, {n - 1, n - 1}, {n / 2, n / 3}, {n / 4 - 1, 5}, {n / 4, n - 2},
                           {n / 2 - 1, n / 2}, {3 * n / 4, 1}, {n - 1, 0}};
    for (const auto &pt : pts) {
        const double ref = reference(n, pt[0], pt[1], steps), got = ht[pt[0] * n + pt[1]];
        if (!(fabs(got - ref) <= 1e-4 * fabs(ref) + 1e-3)) {
            fprintf(stderr, "stencil: T[%ld][%ld] = %.6f, expected %.6f\n", pt[0], pt[1], got, ref);
            ok = false;
        }
    }
    CK(cudaFree(temp_a));
    CK(cudaFree(temp_b));
    CK(cudaFree(power));
    return report(t1 - t0, kms, sum, ok);
}
