// PolyBench gesummv: y = alpha*A*x + beta*B*x (one thread per row, as in PolyBench/GPU)
#include "hum_common.h"

__global__ void gesummv(const float *A, const float *B, const float *x, float *y, int n, float alpha, float beta)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float ta = 0.f, tb = 0.f;
    for (int j = 0; j < n; j++) {
        ta += A[(size_t)i * n + j] * x[j];
        tb += B[(size_t)i * n + j] * x[j];
    }
    y[i] = alpha * ta + beta * tb;
}

int main(int argc, char **argv)
{
    double t0 = now_ms();
    int n = argc > 1 ? atoi(argv[1]) : 16384;
    size_t mat = (size_t)n * n * sizeof(float), vec = (size_t)n * sizeof(float);
    float *A = (float *)malloc(mat), *B = (float *)malloc(mat), *x = (float *)malloc(vec), *y = (float *)malloc(vec);
    for (size_t i = 0; i < (size_t)n * n; i++) { A[i] = val(i, 5); B[i] = val(i, 6); }
    for (int i = 0; i < n; i++) x[i] = val(i, 7);
    CK(cudaFree(0));   /* create the context outside the timed region */
    double g0 = now_ms();
    float *dA, *dB, *dx, *dy;
    CK(cudaMalloc(&dA, mat)); CK(cudaMalloc(&dB, mat)); CK(cudaMalloc(&dx, vec)); CK(cudaMalloc(&dy, vec));
    CK(cudaMemcpy(dA, A, mat, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dB, B, mat, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dx, x, vec, cudaMemcpyHostToDevice));
    gesummv<<<(n + 255) / 256, 256>>>(dA, dB, dx, dy, n, 1.5f, 1.2f);
    CK(cudaGetLastError());
    CK(cudaMemcpy(y, dy, vec, cudaMemcpyDeviceToHost));
    double g1 = now_ms();
    report("gesummv", t0, g0, g1, y, vec);
    return 0;
}
