/* Shared by the HUM test programs: ordinary CUDA programs written the way Rodinia/PolyBench
 * ports are (host init, synchronous cudaMemcpy in, kernels, cudaMemcpy out), so that
 * `umctl run --mode hum` is measured on code that was not written for it.
 * Each prints one line: NAME TIME_MS <whole run> GPU_MS <device allocations, copies, kernels, result back: the whole run less input generation, as the paper times it (without file I/O)> HASH <fnv1a of
 * the result bytes>; the hash must be identical with and without umctl. */
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)

static inline double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static inline uint64_t fnv1a(const void *p, size_t n)
{
    const unsigned char *b = (const unsigned char *)p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* deterministic inputs in [0, 1) without libc's rand (whose sequence differs across libcs) */
static inline float val(size_t i, unsigned salt)
{
    uint32_t x = (uint32_t)(i * 2654435761u) ^ (salt * 0x9e3779b9u);
    x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15;
    return (x & 0xffffff) / 16777216.0f;
}

/* call with the result on the host: the time stops here, before the hash is computed */
static inline void report(const char *name, double t0, double g0, double g1, const void *res, size_t n)
{
    double t1 = now_ms();
    uint64_t h = fnv1a(res, n);
    printf("%s TIME_MS %.1f GPU_MS %.1f HASH %016llx\n", name, t1 - t0, g1 - g0, (unsigned long long)h);
}
