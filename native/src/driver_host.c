/* AOTR_BACKEND_HOST: the caller runs each planned launch (the CPU
 * interpreter of the kernel sources); memory is the process's own. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

aotr_status aotr_host_mem_alloc(size_t bytes, uint64_t *ptr)
{
    /* the kernels' 16-byte alignment, with room to spare */
    size_t size = (bytes + 255) / 256 * 256;
    void *p = aligned_alloc(256, size ? size : 256);
    if (!p)
        return aotr_fail(AOTR_OUT_OF_MEMORY, "out of host memory (%zu bytes)", bytes);
    *ptr = (uint64_t)(uintptr_t)p;
    return AOTR_OK;
}

void aotr_host_mem_free(uint64_t ptr) { free((void *)(uintptr_t)ptr); }

void aotr_host_memset(uint64_t ptr, int value, size_t bytes)
{
    memset((void *)(uintptr_t)ptr, value, bytes);
}

void aotr_host_copy_2d(uint64_t dst, size_t dst_pitch, uint64_t src, size_t src_pitch, size_t width,
                       size_t height)
{
    for (size_t row = 0; row < height; row++)
        memmove((char *)(uintptr_t)dst + row * dst_pitch,
                (const char *)(uintptr_t)src + row * src_pitch, width);
}

aotr_status aotr_host_launch(const aotr_host_launcher *h, const char *key, const uint32_t grid[3],
                             const uint64_t *args, size_t num_args)
{
    if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0)
        return AOTR_OK; /* an empty problem: nothing to run */
    if (h->launch(h->user, key, grid, args, num_args) != 0)
        return aotr_fail(AOTR_DRIVER_ERROR,
                         "the host launcher failed to run %s, grid (%u, %u, %u): see the "
                         "launcher's own error",
                         key, (unsigned)grid[0], (unsigned)grid[1], (unsigned)grid[2]);
    return AOTR_OK;
}
