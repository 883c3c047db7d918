/* umctl SnuRHAC convention: what SnuRHAC's compiler would produce, written by hand.
 *
 * SnuRHAC (thesis ch. 6, §6.2) rewrites each kernel so that a launch can cover a slab of the
 * original grid: the kernel takes a block offset and adds it to blockIdx. We stand in for that
 * compiler output with a convention: a kernel whose FIRST parameter is a `umctl_part_t` (passed
 * by value) is partitionable. The program fills it with umctl_part(grid, ro_mask) (or
 * umctl_part_ranges, below) and launches the whole grid, so it runs unchanged without umctl.
 * Under `umctl run --mode snurhac --gpus N` the runtime (umctl_rt.c) recognises the parameter
 * type in the kernel's mangled name (`12umctl_part_t`) and launches N slabs of the grid on GPUs
 * 0..N-1, each with `off` set to the slab's first block and `grid` left at the full grid
 * (kernels bound-check against it).
 *
 * The kernel must compute a block's result from its global block index alone (no grid-wide
 * reductions through gridDim): use UMCTL_BLOCK_X/Y/Z(p) and UMCTL_GRID_X/Y/Z(p) instead of
 * blockIdx/gridDim.
 *
 * ro_mask (§6.4, read-only duplication): bit i set says kernel parameter i is a pointer to a
 * buffer this kernel only reads; the runtime then advises the buffer READ_MOSTLY (each GPU gets
 * its own copy) until a later partitioned kernel passes it without the bit.
 *
 * umctl_part_ranges(grid, ro_mask, wr_mask, band_mask, flags) adds what SnuRHAC's MAPA finds
 * (§6.4, §6.5.1), in the coarse form the runtime uses ("UMP2"):
 *   wr_mask:   bit i: parameter i is a pointer to a buffer this kernel writes (and may read);
 *              every pointer parameter is in ro_mask or wr_mask.
 *   band_mask: bit i: parameter i is accessed in bands that follow the partitioned dimension:
 *              the thread blocks [lo, hi) of the D blocks along the dimension the runtime cuts
 *              (z, else y, else x: the first with at least N blocks) read or write only bytes
 *              [S*lo/D, S*hi/D) of the allocation the pointer lies in (S its size), reads
 *              reaching at most S/D bytes beyond either end (a halo). A row-major matrix whose
 *              rows follow the cut dimension is banded; a buffer every block reads (gemm's B)
 *              is not.
 *   flags:     UMCTL_PART_ATOMICS: the kernel updates global memory with atomics.
 * With them the runtime places each buffer for the kernel (a read-only whole buffer duplicated
 * on every GPU, a banded one's bands on their GPUs, prefetched on each GPU's stream before its
 * slab) and runs on one GPU a kernel with atomics or whose GPUs' write ranges overlap by more
 * than half (§6.4's rule; a written buffer that is not banded counts as written whole by every
 * GPU). None of it changes results: bands only place data; what a kernel touches outside them
 * still works (remotely or by a page fault).
 */
#ifndef UMCTL_SNURHAC_H
#define UMCTL_SNURHAC_H

/* "UMPT": the runtime partitions a launch only when magic is set, the offsets are 0 and grid
   equals the launch's grid (a program that partitions by itself is left alone). "UMP2": the
   same, and wr_mask, band_mask and flags are set. */
#define UMCTL_PART_MAGIC 0x54504d55u
#define UMCTL_PART_MAGIC2 0x32504d55u
#define UMCTL_PART_ATOMICS 1u

struct umctl_part_t {
    unsigned off_x, off_y, off_z;      /* this launch's first block in the full grid */
    unsigned grid_x, grid_y, grid_z;   /* the full grid */
    unsigned ro_mask;                  /* bit i: parameter i is a pointer only read */
    unsigned magic;                    /* UMCTL_PART_MAGIC or UMCTL_PART_MAGIC2 */
    unsigned wr_mask;                  /* UMP2: bit i: parameter i is a pointer written */
    unsigned band_mask;                /* UMP2: bit i: parameter i is accessed in bands */
    unsigned flags;                    /* UMP2: UMCTL_PART_ATOMICS */
};
typedef struct umctl_part_t umctl_part_t;

#ifdef __CUDACC__
static inline __host__ umctl_part_t umctl_part(dim3 grid, unsigned ro_mask)
{
    umctl_part_t p = {0u, 0u, 0u, grid.x, grid.y, grid.z, ro_mask, UMCTL_PART_MAGIC, 0u, 0u, 0u};
    return p;
}
static inline __host__ umctl_part_t umctl_part_ranges(dim3 grid, unsigned ro_mask, unsigned wr_mask,
                                                      unsigned band_mask, unsigned flags)
{
    umctl_part_t p = {0u, 0u, 0u, grid.x, grid.y, grid.z, ro_mask, UMCTL_PART_MAGIC2, wr_mask, band_mask, flags};
    return p;
}
#define UMCTL_BLOCK_X(p) (blockIdx.x + (p).off_x)
#define UMCTL_BLOCK_Y(p) (blockIdx.y + (p).off_y)
#define UMCTL_BLOCK_Z(p) (blockIdx.z + (p).off_z)
#define UMCTL_GRID_X(p) ((p).grid_x)
#define UMCTL_GRID_Y(p) ((p).grid_y)
#define UMCTL_GRID_Z(p) ((p).grid_z)
#endif

#endif
