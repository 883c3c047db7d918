/* The simulator core with 32-bit GPU masks (up to 32 GPUs: nodes x GPUs for SnuRHAC's cluster).
 * The same code as _simcore.c; umctl/sim/core.py loads this build for replays of more than 8 GPUs. */
#define MASK_BITS 32
#define SIMCORE_MODULE _simcore_wide
#include "_simcore.c"
