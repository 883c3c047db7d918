/* European call options priced on binomial trees (the CUDA Samples' binomialOptions of Table
 * 7.10: kernel-time dominated, which the thesis finds scales well), as a single-GPU program after
 * SnuRHAC's compiler (see common.cuh): a thread block per option walks its tree of `steps` levels
 * back from the leaves in shared memory. The option parameters are read and the prices written in
 * bands along x (one element per block). Every option's arithmetic is the same whatever the
 * partition, so the prices are bitwise those of the plain run; the check prices 16 options on the
 * same tree in double precision.
 *     binomial [options=32768] [steps=2048] */
#include <cmath>

#include "common.cuh"

#define THREADS 256
#define MAX_STEPS 4096
#define RISKFREE 0.02f
#define VOLATILITY 0.30f

struct Option { float S, X, T; };

__global__ void binomial_kernel(umctl_part_t p, const Option *__restrict__ opt, float *__restrict__ price, int steps)
{
    __shared__ float v[MAX_STEPS + 1];
    const int o = UMCTL_BLOCK_X(p);
    if (o >= (int)UMCTL_GRID_X(p))
        return;
    const Option op = opt[o];
    const float dt = op.T / steps, vdt = VOLATILITY * sqrtf(dt), rdt = RISKFREE * dt;
    const float u = expf(vdt), d = 1.f / u, disc = expf(-rdt);
    const float pu = (expf(rdt) - d) / (u - d), pd = 1.f - pu;
    for (int j = threadIdx.x; j <= steps; j += THREADS) {   /* leaves: S u^j d^(steps-j) */
        const float s = op.S * expf(vdt * (2.f * j - steps));
        v[j] = fmaxf(s - op.X, 0.f);
    }
    __syncthreads();
    for (int i = steps; i > 0; i--) {   /* level i -> i-1: node j from j and j+1 */
        float nv[MAX_STEPS / THREADS];
        int c = 0;
        for (int j = threadIdx.x; j < i; j += THREADS)
            nv[c++] = disc * (pu * v[j + 1] + pd * v[j]);
        __syncthreads();
        c = 0;
        for (int j = threadIdx.x; j < i; j += THREADS)
            v[j] = nv[c++];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        price[o] = v[0];
}

static Option option(long i)
{
    const uint64_t h = (uint64_t)(i + 7) * 0x9E3779B97F4A7C15ULL;
    auto u = [&](int s) { return (float)((h >> s) & 0xffff) / 65536.f; };
    return Option{5.f + 25.f * u(0), 1.f + 99.f * u(16), 0.25f + 9.75f * u(32)};
}

/* the same tree in double precision */
static double reference(const Option &op, int steps)
{
    const double dt = (double)op.T / steps, vdt = VOLATILITY * sqrt(dt), rdt = RISKFREE * dt;
    const double u = exp(vdt), d = 1 / u, disc = exp(-rdt), pu = (exp(rdt) - d) / (u - d), pd = 1 - pu;
    double *v = (double *)malloc((steps + 1) * sizeof(double));
    for (int j = 0; j <= steps; j++)
        v[j] = fmax(op.S * exp(vdt * (2.0 * j - steps)) - op.X, 0.0);
    for (int i = steps; i > 0; i--)
        for (int j = 0; j < i; j++)
            v[j] = disc * (pu * v[j + 1] + pd * v[j]);
    const double r = v[0];
    free(v);
    return r;
}

int main(int argc, char **argv)
{
    const long n = arg_or(argc, argv, 1, 32768);
    const long steps = arg_or(argc, argv, 2, 2048);
    if (n <= 0 || n > 65535L * 16 || steps < THREADS || steps > MAX_STEPS || steps % THREADS) {
        fprintf(stderr, "binomial: options in 1..%ld, steps a multiple of %d in %d..%d\n", 65535L * 16, THREADS,
                THREADS, MAX_STEPS);
        return 2;
    }
    Option *ho = (Option *)malloc(n * sizeof(Option));
    float *hp = (float *)malloc(n * sizeof(float));
    if (!ho || !hp)
        return 2;
    for (long i = 0; i < n; i++)
        ho[i] = option(i);
    Option *opt;
    float *price;
    CK(cudaMalloc(&opt, n * sizeof(Option)));
    CK(cudaMalloc(&price, n * sizeof(float)));
    CK(cudaDeviceSynchronize());
    Timer tk;
    const double t0 = now_ms();
    CK(cudaMemcpy(opt, ho, n * sizeof(Option), cudaMemcpyHostToDevice));
    const dim3 grid(n), block(THREADS);
    tk.start();
    /* bit 1 the options (read, banded), bit 2 the prices (written, banded) */
    binomial_kernel<<<grid, block>>>(umctl_part_ranges(grid, 1u << 1, 1u << 2, (1u << 1) | (1u << 2), 0), opt, price,
                                     (int)steps);
    CK(cudaGetLastError());
    const float kms = tk.stop();
    CK(cudaMemcpy(hp, price, n * sizeof(float), cudaMemcpyDeviceToHost));
    const double t1 = now_ms();
    const uint64_t sum = checksum(hp, n * sizeof(float));
    bool ok = true;
    for (int s = 0; s < 16; s++) {
        const long i = (s * (n - 1)) / 15;
        const double want = reference(ho[i], (int)steps);
        if (!(fabs(hp[i] - want) <= 2e-3 + 1e-3 * fabs(want))) {
            fprintf(stderr, "binomial: option %ld = %.6f, expected %.6f\n", i, hp[i], want);
            ok = false;
        }
    }
    CK(cudaFree(opt));
    CK(cudaFree(price));
    return report(t1 - t0, kms, sum, ok);
}
