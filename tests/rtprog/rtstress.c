/* Many threads at once through the umctl runtime's report and launch paths, for the sanitizer
 * builds of tests/test_runtime_sanitizers.py. The runtime is compiled into this program, as one
 * translation unit with it, over the fake CUDA runtime and driver (fakecudart.c): so a sanitizer
 * instruments the runtime itself without a preloaded sanitizer library, and the harness can read
 * how many records the runtime pushed and dropped. Every thread launches kernels (runtime and
 * driver entry points, 32 kernels whose names and identities are looked up concurrently),
 * allocates and frees (cudaMalloc/cudaFree and the pluggable allocator's cache) and copies; the
 * kernel-end tracker (UMCTL_RT_TRACK_END=1) pushes into the launch buffer at the same time.
 *
 *   gcc -fsanitize=address|thread -g -O2 -rdynamic rtstress.c -o rtstress -LDIR -lcudart \
 *       -Wl,-rpath,DIR -ldl -lpthread
 *   rtstress THREADS ITERS
 *
 * Prints "RESULT {json}": the records the runtime pushed and dropped per kind (launch, alloc,
 * copy) once every thread and every kernel end is done and the buffers are flushed, and what the
 * harness itself did, so the test can check that every record was received or counted dropped.
 */
/* The runtime's libc and dlsym interposers must not interpose in this program: the sanitizer's
   start-up resolves its interceptors through dlsym, and glibc frees through free, before
   instrumented code can run. Renamed (the declarations in the system headers with them), they
   stay ordinary functions of the runtime; HUM, which needs them, is off here. dlsym renamed is
   still what the harness calls to reach the driver (as cuBLAS does), so driver launches go
   through the runtime's cuGetProcAddress and cuLaunchKernel wrappers. */
#define dlsym umctl_rt_dlsym
#define free umctl_rt_free_
#define realloc umctl_rt_realloc_
#define munmap umctl_rt_munmap_
#define mprotect umctl_rt_mprotect_
#define mremap umctl_rt_mremap_
#define madvise umctl_rt_madvise_
#define read umctl_rt_read_
#define pread umctl_rt_pread_
#define pread64 umctl_rt_pread64_
#define readv umctl_rt_readv_
#define recv umctl_rt_recv_
#define recvfrom umctl_rt_recvfrom_
#define fread umctl_rt_fread_
#define fork umctl_rt_fork_
#define sigaction umctl_rt_sigaction_
#include "../../runtime/umctl_rt.c"

typedef int (*getproc_v2_t)(const char *, void **, int, u64, void *);
static getproc_v2_t stress_getproc;

static int stress_driver_launch(const void *f, void **args)
{
    void *fn = NULL;
    if (stress_getproc("cuLaunchKernel", &fn, 13000, 0, NULL) != 0 || !fn)
        return 98;
    return ((cu_launch_t)fn)((void *)f, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL);
}

static _Atomic u64 kern_runs;
#define KERN(i)                                                                                    \
    API void stress_kern_##i(void **args) { atomic_fetch_add(&kern_runs, *(u64 *)args[0]); }
#define KERN4(i) KERN(i##0) KERN(i##1) KERN(i##2) KERN(i##3)
KERN4(0) KERN4(1) KERN4(2) KERN4(3) KERN4(4) KERN4(5) KERN4(6) KERN4(7)
#define NK 32
static void (*const kerns[NK])(void **) = {
    stress_kern_00, stress_kern_01, stress_kern_02, stress_kern_03, stress_kern_10, stress_kern_11, stress_kern_12,
    stress_kern_13, stress_kern_20, stress_kern_21, stress_kern_22, stress_kern_23, stress_kern_30, stress_kern_31,
    stress_kern_32, stress_kern_33, stress_kern_40, stress_kern_41, stress_kern_42, stress_kern_43, stress_kern_50,
    stress_kern_51, stress_kern_52, stress_kern_53, stress_kern_60, stress_kern_61, stress_kern_62, stress_kern_63,
    stress_kern_70, stress_kern_71, stress_kern_72, stress_kern_73,
};

static int iters;
static _Atomic u64 n_launch, n_drv_launch, n_alloc_reports, n_copies, n_failed;

static void *worker(void *arg)
{
    int t = (int)(intptr_t)arg;
    char host[8192];
    memset(host, t, sizeof host);
    for (int i = 0; i < iters; i++) {
        u64 one = 1;
        void *dev = NULL;
        void *args[2] = {&one, &dev};
        void (*f)(void **) = kerns[(t * 7 + i) % NK];
        if (i % 4 == 3) {
            if (stress_driver_launch((const void *)f, args) == 0)
                atomic_fetch_add(&n_drv_launch, 1);
            else
                atomic_fetch_add(&n_failed, 1);
        } else {
            dim3 g = {1u + (unsigned)(i % 3), 1, 1}, b = {128, 1, 1};
            if (cudaLaunchKernel((const void *)f, g, b, args, 0, NULL) == 0)
                atomic_fetch_add(&n_launch, 1);
            else
                atomic_fetch_add(&n_failed, 1);
        }
        size_t n = 4096 * (1 + (size_t)(i % 2));
        if (cudaMalloc(&dev, n) == 0) {
            atomic_fetch_add(&n_alloc_reports, 1);
            if (cudaMemcpy(dev, host, n, cudaMemcpyHostToDevice) == 0)
                atomic_fetch_add(&n_copies, 1);
            if (cudaMemcpyAsync(host, dev, n, cudaMemcpyDeviceToHost, NULL) == 0)
                atomic_fetch_add(&n_copies, 1);
            if (cudaFree(dev) == 0)
                atomic_fetch_add(&n_alloc_reports, 1);
        } else {
            atomic_fetch_add(&n_failed, 1);
        }
        /* the pluggable allocator: cache hits and misses, evictions past UMCTL_RT_CACHE */
        size_t bn = 512 * (1 + (size_t)((t + i) % 8));
        void *p = umctl_rt_malloc((ssize_t)bn, 0, NULL);
        if (p) {
            atomic_fetch_add(&n_alloc_reports, 1);
            umctl_rt_free(p, (ssize_t)bn, 0, NULL);
            atomic_fetch_add(&n_alloc_reports, 1);
        } else {
            atomic_fetch_add(&n_failed, 1);
        }
    }
    return NULL;
}

/* every launch's end reported (or never to be: the ring was full) */
static int ends_drained(void)
{
    pthread_mutex_lock(&trk_mu);
    int done = trk_head == trk_tail;
    pthread_mutex_unlock(&trk_mu);
    return done;
}

int main(int argc, char **argv)
{
    int nt = argc > 1 ? atoi(argv[1]) : 8;
    iters = argc > 2 ? atoi(argv[2]) : 1000;
    if (nt < 1 || nt > 64 || iters < 1)
        return 2;
    /* half the kernels have argument sizes (hashed by argument bytes), half not (occurrences) */
    void *lc = dlopen(getenv("FAKE_LIBCUDA"), RTLD_NOW);
    void (*set_params)(void *, int, const size_t *) = lc ? (void (*)(void *, int, const size_t *))dlsym(lc, "fake_set_params") : NULL;
    if (!set_params) {
        fprintf(stderr, "rtstress: no fake libcuda (FAKE_LIBCUDA)\n");
        return 2;
    }
    const size_t sizes[2] = {sizeof(u64), sizeof(void *)};
    for (int k = 0; k < NK; k += 2)
        set_params((void *)kerns[k], 2, sizes);
    stress_getproc = (getproc_v2_t)dlsym(lc, "cuGetProcAddress_v2");
    if (!stress_getproc)
        return 2;

    pthread_t th[64];
    for (int t = 0; t < nt; t++)
        if (pthread_create(&th[t], NULL, worker, (void *)(intptr_t)t) != 0)
            return 3;
    for (int t = 0; t < nt; t++)
        pthread_join(th[t], NULL);
    for (int w = 0; w < 20000 && !ends_drained(); w++)
        usleep(1000);
    int drained = ends_drained();
    flush_final();
    u64 pushed[3], dropped[3], left[3];
    for (int k = 0; k < 3; k++) {
        pthread_mutex_lock(&rb[k].mu);
        pushed[k] = rb[k].pushed, left[k] = rb[k].n + rb[k].pending;
        dropped[k] = atomic_load(&drops[k]);
        pthread_mutex_unlock(&rb[k].mu);
    }
    printf("RESULT {\"threads\": %d, \"iters\": %d, \"launches\": %llu, \"driver_launches\": %llu, "
           "\"runtime_launches_reported\": %llu, \"kernel_runs\": %llu, \"alloc_reports\": %llu, \"copies\": %llu, "
           "\"failed\": %llu, \"ends_drained\": %d, \"end_drops\": %llu, \"pushed\": [%llu, %llu, %llu], "
           "\"drops\": [%llu, %llu, %llu], \"left\": [%llu, %llu, %llu]}\n",
           nt, iters, (unsigned long long)n_launch, (unsigned long long)n_drv_launch,
           (unsigned long long)atomic_load(&st_launch), (unsigned long long)kern_runs,
           (unsigned long long)n_alloc_reports, (unsigned long long)n_copies, (unsigned long long)n_failed, drained,
           (unsigned long long)atomic_load(&st_trk_drop), (unsigned long long)pushed[0], (unsigned long long)pushed[1],
           (unsigned long long)pushed[2], (unsigned long long)dropped[0], (unsigned long long)dropped[1],
           (unsigned long long)dropped[2], (unsigned long long)left[0], (unsigned long long)left[1],
           (unsigned long long)left[2]);
    fflush(stdout);
    return 0;
}
