/* All-pairs N-body (the CUDA Samples' Nbody of Table 7.10: kernel-time dominated, which the thesis
 * finds scales well), as a single-GPU program after SnuRHAC's compiler (see common.cuh): `steps`
 * time steps, each one kernel: a thread per body sums the gravitational pull of every body (the
 * positions read in shared-memory tiles), then integrates its velocity and position. Positions are
 * double-buffered: a step reads all of `cur` (read whole, duplicated on every GPU) and writes its
 * band of `nxt` and of the velocities (banded along x), so the two position buffers swap roles
 * every step. Every body's arithmetic is the same whatever the partition, so the results are
 * bitwise those of the plain run; the check recomputes the first step of 64 bodies in double
 * precision from the copy of the positions after it.
 *     nbody [n=131072] [steps=10] */
#include <cmath>

#include "common.cuh"

#define BLOCK 256
#define SOFT2 0.01f
#define DT 0.001f

__global__ void nbody_step(umctl_part_t p, const float4 *__restrict__ cur, float4 *__restrict__ nxt,
                           float4 *__restrict__ vel, int n)
{
    __shared__ float4 tile[BLOCK];
    const int i = UMCTL_BLOCK_X(p) * BLOCK + threadIdx.x;
    const float4 me = i < n ? cur[i] : make_float4(0.f, 0.f, 0.f, 0.f);
    float ax = 0.f, ay = 0.f, az = 0.f;
    for (int t0 = 0; t0 < n; t0 += BLOCK) {
        const int j = t0 + threadIdx.x;
        tile[threadIdx.x] = j < n ? cur[j] : make_float4(0.f, 0.f, 0.f, 0.f);
        __syncthreads();
#pragma unroll 8
        for (int k = 0; k < BLOCK; k++) {
            const float4 o = tile[k];
            const float dx = o.x - me.x, dy = o.y - me.y, dz = o.z - me.z;
            const float r2 = dx * dx + dy * dy + dz * dz + SOFT2;
            const float inv = rsqrtf(r2);
            const float s = o.w * inv * inv * inv;
            ax += dx * s, ay += dy * s, az += dz * s;
        }
        __syncthreads();
    }
    if (i >= n || (int)UMCTL_BLOCK_X(p) >= (int)UMCTL_GRID_X(p))
        return;
    float4 v = vel[i];
    v.x += ax * DT, v.y += ay * DT, v.z += az * DT;
    vel[i] = v;
    nxt[i] = make_float4(me.x + v.x * DT, me.y + v.y * DT, me.z + v.z * DT, me.w);
}

static inline float4 body(long i)
{
    /* a deterministic cloud in [-1, 1)^3, masses in [0.5, 1.5) */
    const uint64_t h = (uint64_t)(i + 1) * 0x9E3779B97F4A7C15ULL;
    auto u = [&](int s) { return (float)((h >> s) & 0xffff) / 32768.f - 1.f; };
    return make_float4(u(0), u(16), u(32), 1.f + 0.5f * u(48));
}

int main(int argc, char **argv)
{
    const long n = arg_or(argc, argv, 1, 131072);
    const long steps = arg_or(argc, argv, 2, 10);
    if (n <= 0 || n % BLOCK || n > (1L << 24) || steps < 1 || steps > 10000) {
        fprintf(stderr, "nbody: n must be a positive multiple of %d (at most 2^24), 1 <= steps <= 10000\n", BLOCK);
        return 2;
    }
    const size_t bytes = (size_t)n * sizeof(float4);
    float4 *h0 = (float4 *)malloc(bytes), *h1 = (float4 *)malloc(bytes), *hv = (float4 *)malloc(bytes);
    if (!h0 || !h1 || !hv)
        return 2;
    for (long i = 0; i < n; i++)
        h0[i] = body(i), hv[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    float4 *pa, *pb, *vel;
    CK(cudaMalloc(&pa, bytes));
    CK(cudaMalloc(&pb, bytes));
    CK(cudaMalloc(&vel, bytes));
    CK(cudaDeviceSynchronize());
    Timer tk;
    const double t0 = now_ms();
    CK(cudaMemcpy(pa, h0, bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(vel, hv, bytes, cudaMemcpyHostToDevice));
    const dim3 grid(n / BLOCK), block(BLOCK);
    /* bit 1 cur (read whole), bits 2, 3 nxt and vel (written, banded) */
    const umctl_part_t part = umctl_part_ranges(grid, 1u << 1, (1u << 2) | (1u << 3), (1u << 2) | (1u << 3), 0);
    tk.start();
    float kms = 0;
    for (long s = 0; s < steps; s++) {
        const float4 *cur = s % 2 ? pb : pa;
        float4 *nxt = s % 2 ? pa : pb;
        nbody_step<<<grid, block>>>(part, cur, nxt, vel, (int)n);
        if (s == 0) {   /* the first step's positions, for the check */
            CK(cudaGetLastError());
            kms += tk.stop();
            CK(cudaMemcpy(h1, nxt, bytes, cudaMemcpyDeviceToHost));
            tk.start();
        }
    }
    CK(cudaGetLastError());
    kms += tk.stop();
    CK(cudaMemcpy(hv, steps % 2 ? pb : pa, bytes, cudaMemcpyDeviceToHost));
    const double t1 = now_ms();
    const uint64_t sum = checksum(hv, bytes);
    bool ok = true;
    for (int sdx = 0; sdx < 64 && ok; sdx++) {
        const long i = (sdx * (n - 1)) / 63;
        const float4 me = h0[i];
        double ax = 0, ay = 0, az = 0;
        for (long j = 0; j < n; j++) {
            const float4 o = h0[j];
            const double dx = (double)o.x - me.x, dy = (double)o.y - me.y, dz = (double)o.z - me.z;
            const double r2 = dx * dx + dy * dy + dz * dz + SOFT2;
            const double s = o.w / (r2 * sqrt(r2));
            ax += dx * s, ay += dy * s, az += dz * s;
        }
        /* the step's displacement a dt^2 (velocities start at 0), to float summation's accuracy */
        const double want[3] = {ax * DT * DT, ay * DT * DT, az * DT * DT};
        const double got[3] = {(double)h1[i].x - me.x, (double)h1[i].y - me.y, (double)h1[i].z - me.z};
        const double tol = 1e-6 + 2e-3 * sqrt(want[0] * want[0] + want[1] * want[1] + want[2] * want[2]);
        for (int c = 0; c < 3; c++)
            if (!(fabs(got[c] - want[c]) <= tol)) {
                fprintf(stderr, "nbody: body %ld moved %.9f along %d in step 1, expected %.9f\n", i, got[c], c, want[c]);
                ok = false;
            }
        ok = ok && std::isfinite(hv[i].x) && std::isfinite(hv[i].y) && std::isfinite(hv[i].z);
    }
    CK(cudaFree(pa));
    CK(cudaFree(pb));
    CK(cudaFree(vel));
    return report(t1 - t0, kms, sum, ok);
}
