// vector add, as in CUDA samples: C = A + B (pass 2: C = C + A, reusing A on the GPU)
#include "hum_common.h"

__global__ void add(const float *a, const float *b, float *c, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        c[i] = a[i] + b[i];
}

int main(int argc, char **argv)
{
    double t0 = now_ms();
    size_t n = (argc > 1 ? strtoull(argv[1], 0, 0) : 256) << 20;   /* Mi elements */
    size_t bytes = n * sizeof(float);
    float *a = (float *)malloc(bytes), *b = (float *)malloc(bytes), *c = (float *)malloc(bytes);
    for (size_t i = 0; i < n; i++) { a[i] = val(i, 1); b[i] = val(i, 2); }
    CK(cudaFree(0));   /* create the context outside the timed region */
    double g0 = now_ms();
    float *da, *db, *dc;
    CK(cudaMalloc(&da, bytes)); CK(cudaMalloc(&db, bytes)); CK(cudaMalloc(&dc, bytes));
    CK(cudaMemcpy(da, a, bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db, b, bytes, cudaMemcpyHostToDevice));
    add<<<1024, 256>>>(da, db, dc, n);
    CK(cudaGetLastError());
    CK(cudaMemcpy(c, dc, bytes, cudaMemcpyDeviceToHost));
    double g1 = now_ms();
    report("vadd", t0, g0, g1, c, bytes);
    return 0;
}
