/* Shared by the SnuRHAC test programs (gemm, gesummv, stencil, nbody, binomial, covariance: the
 * thesis's Table 7.10 programs or stand-ins for them): each is written as a single-GPU CUDA
 * program looks after SnuRHAC's compiler (runtime/umctl_snurhac.h convention, with the access
 * information of umctl_part_ranges): cudaMalloc'd buffers, cudaMemcpy of the inputs, kernels
 * taking a umctl_part_t first, results copied back and checked against a CPU reference. It prints
 *     KERNEL_MS <ms>                       (kernels only, cudaEvents on the program's stream)
 *     TIME_MS <ms> CHECK <checksum> OK     (copy-in + kernels + copy-back, host clock)
 * or "... FAIL" and exit status 1 when the check fails. Run as written (one GPU, no umctl) or
 * under `umctl run --mode snurhac --gpus N`. Build: nvcc -O3 -arch=sm_90 -cudart shared. */
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>

#include "../../../runtime/umctl_snurhac.h"

#define CK(call)                                                                                    \
    do {                                                                                            \
        cudaError_t e_ = (call);                                                                    \
        if (e_ != cudaSuccess) {                                                                    \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(2);                                                                                \
        }                                                                                           \
    } while (0)

static inline double now_ms()
{
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/* FNV-1a over the bytes of the results: equal for every run that computed the same bits */
static inline uint64_t checksum(const void *p, size_t n, uint64_t h = 1469598103934665603ULL)
{
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}

static inline long arg_or(int argc, char **argv, int i, long dflt)
{
    return argc > i ? strtol(argv[i], nullptr, 0) : dflt;
}

struct Timer {
    cudaEvent_t a, b;
    Timer() { CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b)); }
    void start() { CK(cudaEventRecord(a, 0)); }
    float stop()
    {
        float ms = 0;
        CK(cudaEventRecord(b, 0));
        CK(cudaEventSynchronize(b));
        CK(cudaEventElapsedTime(&ms, a, b));
        return ms;
    }
};

/* time_ms: copy-in to copy-back (the check is not timed) */
static inline int report(double time_ms, float kernel_ms, uint64_t sum, bool ok)
{
    const double t = time_ms;
    printf("KERNEL_MS %.3f\n", kernel_ms);
    printf("TIME_MS %.3f CHECK %016llx %s\n", t, (unsigned long long)sum, ok ? "OK" : "FAIL");
    fflush(stdout);
    return ok ? 0 : 1;
}
