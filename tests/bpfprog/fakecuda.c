/* A stand-in for libcuda.so.1 and a program that launches "kernels" through it, so that the
 * launch uprobes can be tested on a machine without a GPU (CI).
 *
 * Built twice by tests/test_uprobes.py:
 *   gcc -O1 -shared -fPIC -DFAKECUDA_LIB fakecuda.c -o DIR/libcuda.so.1
 *   gcc -O1 fakecuda.c -o DIR/fakecuda DIR/libcuda.so.1 -Wl,-rpath,DIR -lpthread
 *
 * The library exports the launch and handle entry points with the real CUDA signatures (so the
 * uprobes read the same registers and stack slots as on libcuda) and trivial bodies. The program
 * prints "READY <pid>", waits for a line on stdin (the test attaches meanwhile), fetches kernel
 * handles, makes N rounds of launches with known arguments (plus T launches from a second
 * thread), prints "DONE <json>" describing them, waits for another line and exits.
 */
#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef struct CUfunc_st *CUfunction;
typedef struct CUmod_st *CUmodule;
typedef struct CUlib_st *CUlibrary;
typedef struct CUkern_st *CUkernel;
typedef struct CUstream_st *CUstream;
typedef struct CUlaunchAttribute_st { int id; char pad[4]; char value[64]; } CUlaunchAttribute;
typedef struct CUlaunchConfig_st {
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

#define API __attribute__((visibility("default"), noinline))

#ifdef FAKECUDA_LIB

/* Handles are derived from the name so that the program can predict them. */
static uintptr_t handle_of(const char *name, uintptr_t base)
{
    uintptr_t h = 5381;
    while (*name)
        h = h * 33 + (unsigned char)*name++;
    return base | ((h & 0xffffff) << 4);
}

volatile unsigned long long fake_sink;   /* keeps the bodies from being folded together */

#define LAUNCH_BODY(tag) do { fake_sink += (tag); return 0; } while (0)

API CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                            unsigned int by, unsigned int bz, unsigned int smem, CUstream s, void **params,
                            void **extra)
{ (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)smem; (void)s; (void)params;
  (void)extra; LAUNCH_BODY(1); }

API CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                                 unsigned int by, unsigned int bz, unsigned int smem, CUstream s, void **params,
                                 void **extra)
{ (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)smem; (void)s; (void)params;
  (void)extra; LAUNCH_BODY(2); }

API CUresult cuLaunchKernelEx(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra)
{ (void)cfg; (void)f; (void)params; (void)extra; LAUNCH_BODY(3); }

API CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                       unsigned int bx, unsigned int by, unsigned int bz, unsigned int smem,
                                       CUstream s, void **params)
{ (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)smem; (void)s; (void)params;
  LAUNCH_BODY(4); }

API CUresult cuModuleGetFunction(CUfunction *out, CUmodule m, const char *name)
{ (void)m; if (!name || !*name) return 500; *out = (CUfunction)handle_of(name, 0x10000000); return 0; }

API CUresult cuLibraryGetKernel(CUkernel *out, CUlibrary l, const char *name)
{ (void)l; if (!name || !*name) return 500; *out = (CUkernel)handle_of(name, 0x20000000); return 0; }

API CUresult cuKernelGetFunction(CUfunction *out, CUkernel k)
{ *out = (CUfunction)((uintptr_t)k ^ 0x70000000); return 0; }

#else /* the program */

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

CUresult cuLaunchKernel(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
                        unsigned int, unsigned int, CUstream, void **, void **);
CUresult cuLaunchKernel_ptsz(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
                             unsigned int, unsigned int, CUstream, void **, void **);
CUresult cuLaunchKernelEx(const CUlaunchConfig *, CUfunction, void **, void **);
CUresult cuLaunchCooperativeKernel(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
                                   unsigned int, unsigned int, unsigned int, CUstream, void **);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLibraryGetKernel(CUkernel *, CUlibrary, const char *);
CUresult cuKernelGetFunction(CUfunction *, CUkernel);

static CUfunction f_thread;
static int n_thread;

static void *launcher(void *arg)
{
    (void)arg;
    float *p = (float *)0x7f0000001000;
    int n = 7;
    void *params[] = {&p, &n};
    for (int i = 0; i < n_thread; i++)
        cuLaunchKernel(f_thread, 3, 3, 3, 32, 2, 1, 0, (CUstream)0x3000, params, NULL);
    return NULL;
}

static void wait_line(void)
{
    char buf[64];
    if (!fgets(buf, sizeof(buf), stdin))
        exit(3);
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 100;
    n_thread = argc > 2 ? atoi(argv[2]) : 50;
    printf("READY %d\n", (int)getpid());
    fflush(stdout);
    wait_line();

    /* names: a long mangled one (longer than the BPF copy: read through /proc/PID/mem) */
    static char long_name[400];
    {   /* _Z300kkkk...kPfi : void kkk...k(float*, int) */
        int len = snprintf(long_name, sizeof(long_name), "_Z300");
        for (int i = 0; i < 300; i++)
            long_name[len++] = 'k';
        snprintf(long_name + len, sizeof(long_name) - len, "Pfi");
    }
    CUfunction f_scale = 0, f_ex = 0, f_long = 0, f_plain = 0;
    CUkernel k_add = 0;
    cuModuleGetFunction(&f_scale, 0, "_Z5scalePfi");             /* scale(float*, int) */
    cuModuleGetFunction(&f_long, 0, long_name);
    cuModuleGetFunction(&f_plain, 0, "plain_c_kernel");          /* extern "C": no signature */
    cuLibraryGetKernel(&k_add, 0, "_Z3addPKfS0_Pfm");            /* add(const float*, const float*, float*, unsigned long) */
    cuKernelGetFunction(&f_ex, k_add);                           /* CUfunction standing for k_add */
    CUfunction f_thread_local = 0;
    cuModuleGetFunction(&f_thread_local, 0, "_Z8threadedPfi");
    f_thread = f_thread_local;
    CUfunction f_unknown = (CUfunction)0x5eed0000;               /* never named: handle fetched "before attach" */

    float *bufs[2] = {(float *)0x7f0000100000, (float *)0x7f0000200000};
    const float *a = (const float *)0x7f0000300000, *b = (const float *)0x7f0000400000;
    float *c = (float *)0x7f0000500000;
    unsigned long count = 1UL << 20;
    int small = 1 << 16;
    /* a packed argument buffer for the `extra` form */
    struct { void *p; int n; int pad; } packed = {(void *)0x7f0000600000, 42, 0};
    size_t packed_size = sizeof(packed);
    void *extra[] = {(void *)1, &packed, (void *)2, &packed_size, (void *)0};

    pthread_t th;
    pthread_create(&th, NULL, launcher, NULL);
    for (int i = 0; i < n; i++) {
        float *p = bufs[i & 1];                                  /* two argument sets, alternating */
        void *params_scale[] = {&p, &small};
        cuLaunchKernel(f_scale, 4, 2, 1, 128, 1, 1, 0, (CUstream)0x5000, params_scale, NULL);

        void *params_add[] = {&a, &b, &c, &count};
        CUlaunchConfig cfg = {8, 1, 1, 256, 1, 1, 1024, (CUstream)0x6000, NULL, 0};
        cuLaunchKernelEx(&cfg, f_ex, params_add, NULL);

        cuLaunchKernel_ptsz(f_long, 16, 16, 1, 16, 16, 1, 0, (CUstream)0x7000, params_scale, NULL);
        cuLaunchKernel(f_plain, 1, 1, 1, 64, 1, 1, 0, (CUstream)0, NULL, extra);
        cuLaunchCooperativeKernel(f_unknown, 2, 1, 1, 32, 1, 1, 512, (CUstream)0x8000, params_scale);
    }
    pthread_join(th, NULL);
    printf("DONE {\"n\": %d, \"n_thread\": %d, \"f_scale\": %lu, \"f_ex\": %lu, \"k_add\": %lu, "
           "\"f_long\": %lu, \"f_plain\": %lu, \"f_thread\": %lu, \"f_unknown\": %lu, \"long_name\": \"%s\"}\n",
           n, n_thread, (unsigned long)f_scale, (unsigned long)f_ex, (unsigned long)k_add, (unsigned long)f_long,
           (unsigned long)f_plain, (unsigned long)f_thread, (unsigned long)f_unknown, long_name);
    fflush(stdout);
    wait_line();
    return 0;
}

#endif
