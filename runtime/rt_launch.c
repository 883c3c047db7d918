/* launch identity: kernel names and argument hashes.
 * Part of umctl_rt.c's translation unit (included there, not compiled alone). */

/* ---------------------------------------------------------------- launch identity */

struct finfo { const void *f; int32_t name_id; int nparams; uint32_t *sizes; uint64_t name_hash; int part; };
#define FTAB 8192
static struct finfo ftab[FTAB];
static pthread_mutex_t ftab_mu = PTHREAD_MUTEX_INITIALIZER;

static u64 fnv(u64 h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}
#define FNV0 0xcbf29ce484222325ULL


/* SnuRHAC convention (umctl_snurhac.h): the kernel's first parameter is a umctl_part_t. Read
   from the Itanium-mangled name: _Z[L]<len><id>12umctl_part_t..., _ZN...E12umctl_part_t... (in a
   namespace), or a template's ...Ev12umctl_part_t... (a template function's mangling carries its
   void return type before the parameters); a demangled name has "(umctl_part_t". */
#define PART_TYPE "12umctl_part_t"
static int part_kernel_name(const char *nm)
{
    if (!nm)
        return 0;
    if (strstr(nm, "(umctl_part_t"))
        return 1;
    if (nm[0] != '_' || nm[1] != 'Z')
        return 0;
    const char *p = nm + 2;
    if (*p == 'L')
        p++;
    int nested = *p == 'N';
    if (nested) {
        p++;
        while (*p == 'K' || *p == 'V' || *p == 'r')
            p++;
    }
    for (;;) {
        if (*p < '0' || *p > '9')
            break;
        char *end;
        unsigned long len = strtoul(p, &end, 10);
        if (strlen(end) < len)
            return 0;
        p = end + len;
        if (!nested)
            break;
    }
    if (nested) {
        if (*p != 'E')
            return 0;
        p++;
    }
    if (*p == 'I')   /* template arguments: not parsed; the void return type then the parameters */
        return strstr(p, "Ev" PART_TYPE) != NULL;
    return strncmp(p, PART_TYPE, strlen(PART_TYPE)) == 0;
}

/* What is known of a kernel: `f` is a host stub (drv = 0) or a driver CUfunction / CUkernel
   handle (drv = 1: a launch that reached the driver without a runtime entry point of ours). */
/* The entry of `f`, or else the empty slot where it belongs (NULL: table full); under ftab_mu. */
static struct finfo *ftab_probe(const void *f)
{
    size_t i = ((uintptr_t)f >> 4) * 0x9E3779B97F4A7C15ULL >> 51;   /* 13 bits */
    for (size_t k = 0; k < FTAB; k++, i = (i + 1) & (FTAB - 1))
        if (ftab[i].f == f || !ftab[i].f)
            return &ftab[i];
    return NULL;
}

static struct finfo *func_info(const void *f, int drv)
{
    pthread_mutex_lock(&ftab_mu);
    struct finfo *e = ftab_probe(f);
    int hit = e && e->f == f;
    pthread_mutex_unlock(&ftab_mu);
    if (hit)
        return e;   /* filled once under the lock, never changed after */
    struct finfo fi = {f, -1, -1, NULL, FNV0, 0};
    tl_internal++;
    const char *name = NULL;
    pthread_once(&driver_once, load_driver);
    int named = drv ? (cu_func_name && cu_func_name(&name, (void *)f) == 0) ||
                          (cu_kernel_name && cu_kernel_name(&name, (void *)f) == 0)
                    : get_cudaFuncGetName() && get_cudaFuncGetName()(&name, f) == 0;
    if (named && name && *name) {
        fi.name_id = intern_name(name);
        fi.name_hash = fnv(FNV0, name, strlen(name));
        fi.part = part_kernel_name(name);
    } else {
        fi.name_hash = fnv(FNV0, &f, sizeof f);   /* unnamed: the host stub's address */
    }
    void *cf = drv ? (void *)f : NULL;
    if (cu_param_info && (drv || (get_cudaGetFuncBySymbol() && get_cudaGetFuncBySymbol()(&cf, f) == 0)) && cf) {
        uint32_t tmp[256];
        int np = 0;
        size_t off, sz;
        while (np < 256 && cu_param_info(cf, np, &off, &sz) == 0)
            tmp[np++] = (uint32_t)sz;
        if (drv && !np && cu_kernel_param_info)
            while (np < 256 && cu_kernel_param_info(cf, np, &off, &sz) == 0)
                tmp[np++] = (uint32_t)sz;
        fi.nparams = np;
        if (np) {
            fi.sizes = malloc(np * sizeof *fi.sizes);
            if (fi.sizes)
                memcpy(fi.sizes, tmp, np * sizeof *tmp);
            else
                fi.nparams = -1;
        }
    }
    if (!drv && get_cudaGetLastError())
        get_cudaGetLastError()();
    tl_internal--;
    /* Probe again: while the lock was let go (the name and sizes take driver calls), other
       threads may have filled the slot found above, with this kernel or another one. Handing
       back another kernel's entry would hash that kernel's argument sizes over this one's
       arguments, reading past them. */
    pthread_mutex_lock(&ftab_mu);
    e = ftab_probe(f);
    if (e && !e->f)
        *e = fi;
    else
        free(fi.sizes);   /* cached meanwhile, or the table is full */
    pthread_mutex_unlock(&ftab_mu);
    return e;   /* NULL (table full): not cached, identity without arguments */
}

/* Occurrences of each argument-less identity since the host last waited for the GPU to drain
   (cudaDeviceSynchronize / cudaStreamSynchronize): see exec_hash. An epoch per slot instead of
   clearing the table at every synchronisation. */
#define OCC_SLOTS 4096
static struct occ { u64 key; uint32_t n, epoch; } occ_tab[OCC_SLOTS];
static uint32_t occ_epoch = 1;
static pthread_mutex_t occ_mu = PTHREAD_MUTEX_INITIALIZER;

static void occ_reset(void)
{
    pthread_mutex_lock(&occ_mu);
    occ_epoch++;
    pthread_mutex_unlock(&occ_mu);
}

static uint32_t occ_next(u64 key)
{
    uint32_t n = 0;
    pthread_mutex_lock(&occ_mu);
    for (uint32_t i = 0; i < 64; i++) {   /* linear probing; a full neighbourhood counts as 0 */
        struct occ *o = &occ_tab[(key + i) % OCC_SLOTS];
        if (o->epoch != occ_epoch) {
            o->key = key, o->n = 0, o->epoch = occ_epoch;
        } else if (o->key != key) {
            continue;
        }
        n = o->n++;
        break;
    }
    pthread_mutex_unlock(&occ_mu);
    return n;
}

/* Execution identity (DeepUM §3.1: kernel + arguments): FNV-1a 64 over the kernel name, grid,
   block, dynamic shared memory and each argument's bytes, with sizes from cuFuncGetParamInfo
   (CUDA >= 12.4). Without sizes the argument bytes cannot be read (bytes past an argument are
   not the argument and would make repeated launches differ), and then the identity is the
   kernel and geometry plus which occurrence of them this is since the host last synchronised:
   a training step launches the same GEMM once per layer with different tensors, which the
   arguments would tell apart, and the occurrence index does it the same way every step
   (measured: a PyTorch loop on driver 580 / CUDA 13 gave 14 identities for 60 launches a step
   without it, and DeepUM's tables and chains merged the layers). */
static u64 exec_hash(struct finfo *fi, const void *f, dim3 g, dim3 b, void **args, size_t smem)
{
    u64 h = fi ? fi->name_hash : fnv(FNV0, &f, sizeof f);
    h = fnv(h, &g, sizeof g);
    h = fnv(h, &b, sizeof b);
    h = fnv(h, &smem, sizeof smem);
    if (fi && fi->nparams > 0 && fi->sizes && args) {
        for (int i = 0; i < fi->nparams; i++)
            if (args[i])
                h = fnv(h, args[i], fi->sizes[i]);
    } else {
        uint32_t k = occ_next(h);
        h = fnv(h, &k, sizeof k);
    }
    return h;
}

static _Atomic int64_t launch_seq;
