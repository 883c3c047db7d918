// hotspot-like 5-point thermal stencil (Rodinia hotspot's update rule on a square grid)
#include "hum_common.h"

__global__ void step(const float *t, const float *p, float *o, int n, float cap, float rx, float ry, float rz)
{
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= n || y >= n) return;
    size_t i = (size_t)y * n + x;
    float c = t[i];
    float w = x > 0 ? t[i - 1] : c, e = x < n - 1 ? t[i + 1] : c;
    float s = y > 0 ? t[i - n] : c, nn = y < n - 1 ? t[i + n] : c;
    o[i] = c + cap * (p[i] + (e + w - 2.f * c) * rx + (nn + s - 2.f * c) * ry + (80.f - c) * rz);
}

int main(int argc, char **argv)
{
    double t0 = now_ms();
    int n = argc > 1 ? atoi(argv[1]) : 8192, iters = argc > 2 ? atoi(argv[2]) : 20;
    size_t cells = (size_t)n * n, bytes = cells * sizeof(float);
    float *temp = (float *)malloc(bytes), *power = (float *)malloc(bytes);
    for (size_t i = 0; i < cells; i++) { temp[i] = 320.f + 20.f * val(i, 3); power[i] = 1e-3f * val(i, 4); }
    CK(cudaFree(0));   /* create the context outside the timed region */
    double g0 = now_ms();
    float *dt, *dp, *dout;
    CK(cudaMalloc(&dt, bytes)); CK(cudaMalloc(&dp, bytes)); CK(cudaMalloc(&dout, bytes));
    CK(cudaMemcpy(dt, temp, bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dp, power, bytes, cudaMemcpyHostToDevice));
    dim3 blk(16, 16), grd((n + 15) / 16, (n + 15) / 16);
    for (int k = 0; k < iters; k++) {
        step<<<grd, blk>>>(dt, dp, dout, n, 0.5f, 0.1f, 0.1f, 0.0001f);
        float *x = dt; dt = dout; dout = x;
    }
    CK(cudaGetLastError());
    CK(cudaMemcpy(temp, dt, bytes, cudaMemcpyDeviceToHost));
    double g1 = now_ms();
    report("stencil", t0, g0, g1, temp, bytes);
    return 0;
}
