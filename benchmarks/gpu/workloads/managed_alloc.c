/* PyTorch pluggable allocator that hands out CUDA managed memory, so a stock PyTorch program
   runs on Unified Memory (torch.cuda.memory.CUDAPluggableAllocator). It calls the driver API
   from libcuda.so.1 (always present where a GPU is) through dlsym, so it builds with plain gcc
   and no CUDA headers. A soft cap (UMCTL_MANAGED_CAP bytes, default 2 GiB) keeps tests from
   ever asking for more managed memory than the GPU has free. */
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>

typedef int (*alloc_fn)(uint64_t *, size_t, unsigned int);
typedef int (*free_fn)(uint64_t);
typedef int (*getctx_fn)(void **);
typedef int (*retain_fn)(void **, int);
typedef int (*setctx_fn)(void *);
static alloc_fn p_alloc;
static free_fn p_free;
static getctx_fn p_getctx;
static retain_fn p_retain;
static setctx_fn p_setctx;
static size_t in_use, cap;

static int load(void) {
    if (p_alloc) return 0;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) return -1;
    p_alloc = (alloc_fn)dlsym(h, "cuMemAllocManaged");
    p_free = (free_fn)dlsym(h, "cuMemFree_v2");
    p_getctx = (getctx_fn)dlsym(h, "cuCtxGetCurrent");
    p_retain = (retain_fn)dlsym(h, "cuDevicePrimaryCtxRetain");
    p_setctx = (setctx_fn)dlsym(h, "cuCtxSetCurrent");
    const char *c = getenv("UMCTL_MANAGED_CAP");
    cap = c ? strtoull(c, NULL, 0) : ((size_t)2 << 30);
    return p_alloc && p_free && p_getctx && p_retain && p_setctx ? 0 : -1;
}

/* torch calls the allocator from threads (autograd) that may have no current context: the
   driver API needs one, so make the device's primary context current (what the runtime does). */
static void ensure_ctx(int device) {
    void *ctx = NULL;
    if (p_getctx(&ctx) == 0 && ctx) return;
    if (p_retain(&ctx, device) == 0) p_setctx(ctx);
}

void *umctl_managed_malloc(ssize_t size, int device, void *stream) {
    (void)stream;
    uint64_t p = 0;
    if (load() != 0 || in_use + (size_t)size > cap) return NULL;
    ensure_ctx(device);
    if (p_alloc(&p, (size_t)size, 1 /* CU_MEM_ATTACH_GLOBAL */) != 0) return NULL;
    __sync_fetch_and_add(&in_use, (size_t)size);
    return (void *)(uintptr_t)p;
}

void umctl_managed_free(void *ptr, ssize_t size, int device, void *stream) {
    (void)stream;
    if (ptr && p_free) { ensure_ctx(device); p_free((uint64_t)(uintptr_t)ptr); __sync_fetch_and_sub(&in_use, (size_t)size); }
}
