/* symbol resolution: the real runtime and driver entry points behind ours.
 * Part of umctl_rt.c's translation unit (included there, not compiled alone). */

/* ---------------------------------------------------------------- symbol resolution */

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn real_dlsym;

static void resolve_dlsym(void)
{
    if (real_dlsym)
        return;
    real_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!real_dlsym)
        real_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
}

static void *rdlsym(void *h, const char *name)
{
    resolve_dlsym();
    return real_dlsym ? real_dlsym(h, name) : NULL;
}

/* The next definition of `name` after this library; when we were dlopen'ed (torch's pluggable
   allocator) rather than preloaded, RTLD_NEXT may miss libcudart: take the global one then,
   unless that is our own. */
static void *self_base_of(void)
{
    Dl_info di;
    return dladdr((void *)&self_base_of, &di) ? di.dli_fbase : NULL;
}

static int is_self(void *p)
{
    static void *self_base;
    void *self = LAZY_SYM(self_base, self_base_of());
    Dl_info di;
    return p && dladdr(p, &di) && di.dli_fbase == self;
}

static void *next_sym(const char *name)
{
    void *p = rdlsym(RTLD_NEXT, name);
    if (!p) {
        p = rdlsym(RTLD_DEFAULT, name);
        if (is_self(p))
            p = NULL;
    }
    return p;
}

/* get_X() resolves X once and returns it; call X as get_X()(...): the slot is written by
   whichever thread resolves it first, so every read goes through the getter's atomic load */
#define REAL(ret, name, ...)                                                     \
    typedef ret (*name##_t)(__VA_ARGS__);                                        \
    static name##_t real_##name##_slot;                                          \
    static name##_t get_##name(void)                                             \
    {                                                                            \
        return LAZY_SYM(real_##name##_slot, next_sym(#name));                    \
    }

REAL(cudaError_t, cudaMalloc, void **, size_t)
REAL(cudaError_t, cudaFree, void *)
REAL(cudaError_t, cudaMemcpy, void *, const void *, size_t, int)
REAL(cudaError_t, cudaMemcpyAsync, void *, const void *, size_t, int, cudaStream_t)
REAL(cudaError_t, cudaLaunchKernel, const void *, dim3, dim3, void **, size_t, cudaStream_t)
REAL(cudaError_t, cudaMallocManaged, void **, size_t, unsigned)
REAL(cudaError_t, cudaGetDevice, int *)
REAL(cudaError_t, cudaSetDevice, int)
REAL(cudaError_t, cudaGetLastError, void)
REAL(cudaError_t, cudaPointerGetAttributes, void *, const void *)
REAL(cudaError_t, cudaDeviceGetAttribute, int *, int, int)
REAL(cudaError_t, cudaEventCreateWithFlags, cudaEvent_t *, unsigned)
REAL(cudaError_t, cudaEventRecord, cudaEvent_t, cudaStream_t)
REAL(cudaError_t, cudaEventSynchronize, cudaEvent_t)
REAL(cudaError_t, cudaDeviceSynchronize, void)
REAL(cudaError_t, cudaEventQuery, cudaEvent_t)
REAL(cudaError_t, cudaEventDestroy, cudaEvent_t)
REAL(cudaError_t, cudaStreamSynchronize, cudaStream_t)
REAL(cudaError_t, cudaStreamCreateWithFlags, cudaStream_t *, unsigned)
REAL(cudaError_t, cudaStreamIsCapturing, cudaStream_t, int *)
REAL(cudaError_t, cudaHostAlloc, void **, size_t, unsigned)
REAL(cudaError_t, cudaFuncGetName, const char **, const void *)
REAL(cudaError_t, cudaGetFuncBySymbol, void **, const void *)
REAL(cudaError_t, cudaGetDeviceCount, int *)
REAL(cudaError_t, cudaStreamWaitEvent, cudaStream_t, cudaEvent_t, unsigned)
REAL(cudaError_t, cudaDeviceCanAccessPeer, int *, int, int)
REAL(cudaError_t, cudaDeviceEnablePeerAccess, int, unsigned)

/* Driver API, from libcuda.so.1 (absent or broken: the features that need it are skipped). */
typedef int (*cuFuncGetParamInfo_t)(void *, size_t, size_t *, size_t *);
typedef int (*cuMemPrefetchAsync_t)(u64, size_t, int, void *);
typedef int (*cuGetProcAddress_t)(const char *, void **, int, u64);
typedef int (*cuGetProcAddress_v2_t)(const char *, void **, int, u64, void *);
static cuFuncGetParamInfo_t cu_param_info;
typedef int (*cuFuncGetName_t)(const char **, void *);
static cuFuncGetName_t cu_func_name, cu_kernel_name;   /* cuFuncGetName, cuKernelGetName (CUDA >= 12.3) */
static cuFuncGetParamInfo_t cu_kernel_param_info;      /* cuKernelGetParamInfo: a CUkernel passed as CUfunction */
static cuMemPrefetchAsync_t cu_prefetch;
static cuGetProcAddress_t real_getproc;
static cuGetProcAddress_v2_t real_getproc_v2;
/* cuMemAdvise (CUDA <= 12 ABI: int device) and cuMemAdvise_v2 (CUmemLocation by value) */
typedef struct { int type, id; } cu_mem_location_t;
typedef int (*cuMemAdvise_t)(u64, size_t, int, int);
typedef int (*cuMemAdvise_v2_t)(u64, size_t, int, cu_mem_location_t);
static cuMemAdvise_t cu_advise;
static cuMemAdvise_v2_t cu_advise_v2;

/* cuMemPrefetchAsync_v2(ptr, n, CUmemLocation {type, id} by value, flags, stream) */
typedef struct { int type, id; } cu_mem_location;
typedef int (*cuMemPrefetchAsync_v2_t)(u64, size_t, cu_mem_location, unsigned, void *);
static cuMemPrefetchAsync_v2_t cu_prefetch_v2;
static int prefetch_via_v2(u64 p, size_t n, int dev, void *stream)
{
    cu_mem_location loc = { dev < 0 ? 2 /* host */ : 1 /* device */, dev < 0 ? 0 : dev };
    return cu_prefetch_v2(p, n, loc, 0, stream);
}

static pthread_once_t driver_once = PTHREAD_ONCE_INIT;
static void load_driver(void)
{
    const char *path = getenv("UMCTL_RT_LIBCUDA");
    void *h = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h)
        return;
    cu_param_info = (cuFuncGetParamInfo_t)rdlsym(h, "cuFuncGetParamInfo");
    cu_kernel_param_info = (cuFuncGetParamInfo_t)rdlsym(h, "cuKernelGetParamInfo");
    cu_func_name = (cuFuncGetName_t)rdlsym(h, "cuFuncGetName");
    cu_kernel_name = (cuFuncGetName_t)rdlsym(h, "cuKernelGetName");
    cu_prefetch = (cuMemPrefetchAsync_t)rdlsym(h, "cuMemPrefetchAsync");
    cu_advise_v2 = (cuMemAdvise_v2_t)rdlsym(h, "cuMemAdvise_v2");
    if (!cu_advise_v2)
        cu_advise = (cuMemAdvise_t)rdlsym(h, "cuMemAdvise");
    if (!cu_prefetch) {   /* CUDA 13 drivers may keep only the location-based entry point */
        cu_prefetch_v2 = (cuMemPrefetchAsync_v2_t)rdlsym(h, "cuMemPrefetchAsync_v2");
        if (cu_prefetch_v2)
            cu_prefetch = prefetch_via_v2;
    }
}
