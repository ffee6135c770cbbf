/* Stream-ordered copies, fills and allocations for callers that stage
 * tensors themselves (the public aotr_copy_2d & co.): argument checks over
 * the driver's own functions (driver_memory.c; the compute units driver.c). */
#include <stdint.h>

#include "internal.h"

static aotr_status driver_of(aotr_runtime *rt, const char *what, aotr_driver **d)
{
    if (!rt)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "%s: `runtime` is NULL", what);
    return aotr_runtime_driver(rt, d);
}

aotr_status aotr_current_device(aotr_runtime *rt, int32_t *device)
{
    aotr_driver *d;
    if (!device)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "aotr_current_device: `device` is NULL");
    aotr_status st = driver_of(rt, "aotr_current_device", &d);
    return st != AOTR_OK ? st : aotr_driver_current_device(d, device);
}

aotr_status aotr_stream_capturing(aotr_runtime *rt, int32_t device, void *stream, int *capturing)
{
    aotr_driver *d;
    if (!capturing)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "aotr_stream_capturing: `capturing` is NULL");
    *capturing = 0;
    aotr_status st = driver_of(rt, "aotr_stream_capturing", &d);
    return st != AOTR_OK ? st : aotr_driver_stream_capturing(d, device, stream, capturing);
}

aotr_status aotr_stream_synchronize(aotr_runtime *rt, int32_t device, void *stream)
{
    aotr_driver *d;
    aotr_status st = driver_of(rt, "aotr_stream_synchronize", &d);
    return st != AOTR_OK ? st : aotr_driver_stream_synchronize(d, device, stream);
}

aotr_status aotr_copy_2d(aotr_runtime *rt, int32_t device, void *stream, void *dst,
                         size_t dst_pitch, const void *src, size_t src_pitch, size_t width,
                         size_t rows)
{
    aotr_driver *d;
    if (rows == 0 || width == 0)
        return AOTR_OK;
    if (!dst || !src || width > dst_pitch || width > src_pitch)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "aotr_copy_2d: null address, or a row wider "
                                                "than its pitch");
    aotr_status st = driver_of(rt, "aotr_copy_2d", &d);
    return st != AOTR_OK
               ? st
               : aotr_driver_copy_2d(d, device, (uint64_t)(uintptr_t)dst, dst_pitch,
                                     (uint64_t)(uintptr_t)src, src_pitch, width, rows, stream);
}

aotr_status aotr_fill(aotr_runtime *rt, int32_t device, void *stream, void *dst, int value,
                      size_t bytes)
{
    aotr_driver *d;
    if (bytes == 0)
        return AOTR_OK;
    if (!dst)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "aotr_fill: `dst` is NULL");
    aotr_status st = driver_of(rt, "aotr_fill", &d);
    return st != AOTR_OK
               ? st
               : aotr_driver_memset(d, device, (uint64_t)(uintptr_t)dst, value, bytes, stream);
}

aotr_status aotr_alloc_async(aotr_runtime *rt, int32_t device, void *stream, size_t bytes,
                             void **ptr)
{
    aotr_driver *d;
    uint64_t p = 0;
    if (!ptr)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "aotr_alloc_async: `ptr` is NULL");
    *ptr = NULL;
    aotr_status st = driver_of(rt, "aotr_alloc_async", &d);
    if (st == AOTR_OK)
        st = aotr_driver_mem_alloc(d, device, bytes ? bytes : 1, stream, &p);
    *ptr = (void *)(uintptr_t)p;
    return st;
}

aotr_status aotr_free_async(aotr_runtime *rt, int32_t device, void *stream, void *ptr)
{
    aotr_driver *d;
    if (!ptr)
        return AOTR_OK;
    aotr_status st = driver_of(rt, "aotr_free_async", &d);
    return st != AOTR_OK ? st : aotr_driver_mem_free(d, device, (uint64_t)(uintptr_t)ptr, stream);
}

aotr_status aotr_compute_units(aotr_runtime *rt, int32_t device, int32_t *count)
{
    aotr_driver *d;
    if (!count)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "aotr_compute_units: `count` is NULL");
    aotr_status st = driver_of(rt, "aotr_compute_units", &d);
    return st != AOTR_OK ? st : aotr_driver_compute_units(d, device, count);
}
