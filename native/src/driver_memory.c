/* The drivers' stream-ordered memory, copies and queries (driver.c holds
 * the rest of an opened driver's operations). */
#include <stdint.h>
#include <string.h>

#include "driver_api.h"

/* For stage.c and the public aotr_copy_2d & co. (device_ops.c). CUDA: each
 * call runs in `device`'s primary context (pushed when another one is
 * current); HIP: the stream names the device. */

static aotr_status missing(const aotr_driver *d, const char *function)
{
    return aotr_fail(AOTR_DRIVER_UNAVAILABLE, "%s has no %s: update the %s", d->library, function,
                     d->backend == AOTR_BACKEND_CUDA ? "NVIDIA driver" : "ROCm runtime");
}

/* CUDA_ERROR_OUT_OF_MEMORY and hipErrorOutOfMemory are both 2. */
static aotr_status op_failed(aotr_driver *d, const char *function, drv_result rc)
{
    return aotr_driver_error(d, rc == 2 ? AOTR_OUT_OF_MEMORY : AOTR_DRIVER_ERROR, function, rc,
                             NULL, NULL);
}

static aotr_status enter(aotr_driver *d, int32_t device, int *pushed)
{
    *pushed = 0;
    if (device < 0)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "device index %d is negative", (int)device);
    return d->backend == AOTR_BACKEND_CUDA ? aotr_cuda_enter(d, device, pushed) : AOTR_OK;
}

static aotr_status leave(aotr_driver *d, int pushed, const char *function, drv_result rc)
{
    if (d->backend == AOTR_BACKEND_CUDA)
        aotr_cuda_leave(d, pushed);
    return rc == 0 ? AOTR_OK : op_failed(d, function, rc);
}

aotr_status aotr_driver_mem_alloc(aotr_driver *d, int32_t device, size_t bytes, void *stream,
                                  uint64_t *ptr)
{
    int pushed;
    drv_result rc;
    const char *function;
    *ptr = 0;
    if (d->backend == AOTR_BACKEND_HOST)
        return aotr_host_mem_alloc(bytes, ptr);
    if (d->backend == AOTR_BACKEND_CUDA) {
        if (!d->cu.MemAllocAsync || !d->cu.MemFreeAsync)
            return missing(d, "cuMemAllocAsync");
    } else if (!d->hip.MallocAsync || !d->hip.FreeAsync) {
        return missing(d, "hipMallocAsync");
    }
    aotr_status st = enter(d, device, &pushed);
    if (st != AOTR_OK)
        return st;
    if (d->backend == AOTR_BACKEND_CUDA) {
        drv_handle pool = aotr_cuda_scratch_pool(d, device);
        function = pool ? "cuMemAllocFromPoolAsync" : "cuMemAllocAsync";
        rc = aotr_cuda_alloc_from(d, pool, ptr, bytes, stream);
    } else {
        void *p = NULL;
        function = "hipMallocAsync";
        rc = d->hip.MallocAsync(&p, bytes, stream);
        *ptr = (uint64_t)(uintptr_t)p;
    }
    if (rc != 0)
        *ptr = 0;
    return leave(d, pushed, function, rc);
}

aotr_status aotr_driver_mem_free(aotr_driver *d, int32_t device, uint64_t ptr, void *stream)
{
    int pushed;
    if (!ptr)
        return AOTR_OK;
    if (d->backend == AOTR_BACKEND_HOST) {
        aotr_host_mem_free(ptr);
        return AOTR_OK;
    }
    aotr_status st = enter(d, device, &pushed);
    if (st != AOTR_OK)
        return st;
    /* (mem_alloc made sure that both functions are there) */
    if (d->backend == AOTR_BACKEND_CUDA)
        return leave(d, pushed, "cuMemFreeAsync", d->cu.MemFreeAsync(ptr, stream));
    return leave(d, pushed, "hipFreeAsync", d->hip.FreeAsync((void *)(uintptr_t)ptr, stream));
}

aotr_status aotr_driver_memset(aotr_driver *d, int32_t device, uint64_t ptr, int value,
                               size_t bytes, void *stream)
{
    int pushed;
    if (d->backend == AOTR_BACKEND_HOST) {
        aotr_host_memset(ptr, value, bytes);
        return AOTR_OK;
    }
    if (d->backend == AOTR_BACKEND_CUDA ? !d->cu.MemsetD8Async : !d->hip.MemsetAsync)
        return missing(d, d->backend == AOTR_BACKEND_CUDA ? "cuMemsetD8Async" : "hipMemsetAsync");
    aotr_status st = enter(d, device, &pushed);
    if (st != AOTR_OK)
        return st;
    if (d->backend == AOTR_BACKEND_CUDA)
        return leave(d, pushed, "cuMemsetD8Async",
                     d->cu.MemsetD8Async(ptr, (unsigned char)value, bytes, stream));
    return leave(d, pushed, "hipMemsetAsync",
                 d->hip.MemsetAsync((void *)(uintptr_t)ptr, value & 0xff, bytes, stream));
}

#define CU_MEMORYTYPE_UNIFIED 4
#define HIP_MEMCPY_DEFAULT 4 /* hipMemcpyDefault: the direction from the addresses */

aotr_status aotr_driver_copy_2d(aotr_driver *d, int32_t device, uint64_t dst, size_t dst_pitch,
                                uint64_t src, size_t src_pitch, size_t width, size_t height,
                                void *stream)
{
    int pushed;
    if (d->backend == AOTR_BACKEND_HOST) {
        aotr_host_copy_2d(dst, dst_pitch, src, src_pitch, width, height);
        return AOTR_OK;
    }
    if (d->backend == AOTR_BACKEND_CUDA ? !d->cu.Memcpy2DAsync : !d->hip.Memcpy2DAsync)
        return missing(d,
                       d->backend == AOTR_BACKEND_CUDA ? "cuMemcpy2DAsync_v2" : "hipMemcpy2DAsync");
    aotr_status st = enter(d, device, &pushed);
    if (st != AOTR_OK)
        return st;
    if (d->backend == AOTR_BACKEND_CUDA) {
        struct cu_memcpy2d c;
        memset(&c, 0, sizeof c);
        c.src_memory_type = c.dst_memory_type = CU_MEMORYTYPE_UNIFIED;
        c.src_device = src;
        c.src_pitch = src_pitch;
        c.dst_device = dst;
        c.dst_pitch = dst_pitch;
        c.width_bytes = width;
        c.height = height;
        return leave(d, pushed, "cuMemcpy2DAsync_v2", d->cu.Memcpy2DAsync(&c, stream));
    }
    return leave(d, pushed, "hipMemcpy2DAsync",
                 d->hip.Memcpy2DAsync((void *)(uintptr_t)dst, dst_pitch,
                                      (const void *)(uintptr_t)src, src_pitch, width, height,
                                      HIP_MEMCPY_DEFAULT, stream));
}

aotr_status aotr_driver_current_device(aotr_driver *d, int32_t *device)
{
    int dev = 0;
    drv_result rc;
    if (d->backend == AOTR_BACKEND_HOST) {
        /* one host: device 0 */
    } else if (d->backend == AOTR_BACKEND_CUDA) {
        if (!d->cu.CtxGetDevice)
            return missing(d, "cuCtxGetDevice");
        rc = d->cu.CtxGetDevice(&dev);
        if (rc == CUDA_ERROR_INVALID_CONTEXT) /* none current: CUDA not touched yet */
            dev = 0, rc = CUDA_SUCCESS;
        if (rc != CUDA_SUCCESS)
            return op_failed(d, "cuCtxGetDevice", rc);
    } else if ((rc = d->hip.GetDevice(&dev)) != hipSuccess) {
        return op_failed(d, "hipGetDevice", rc);
    }
    *device = dev;
    return AOTR_OK;
}

aotr_status aotr_driver_stream_capturing(aotr_driver *d, int32_t device, void *stream,
                                         int *capturing)
{
    int pushed, status = 0;
    int cuda = d->backend == AOTR_BACKEND_CUDA;
    if (d->backend == AOTR_BACKEND_HOST) {
        *capturing = 0;
        return AOTR_OK;
    }
    drv_result (*is_capturing)(drv_handle, int *) =
        cuda ? d->cu.StreamIsCapturing : d->hip.StreamIsCapturing;
    const char *function = cuda ? "cuStreamIsCapturing" : "hipStreamIsCapturing";
    if (!is_capturing)
        return missing(d, function);
    aotr_status st = enter(d, device, &pushed);
    if (st != AOTR_OK)
        return st;
    st = leave(d, pushed, function, is_capturing(stream, &status));
    *capturing = status != 0; /* 0: none; 1: active; 2: invalidated */
    return st;
}

aotr_status aotr_driver_stream_synchronize(aotr_driver *d, int32_t device, void *stream)
{
    int pushed;
    int cuda = d->backend == AOTR_BACKEND_CUDA;
    if (d->backend == AOTR_BACKEND_HOST)
        return AOTR_OK; /* every launch has run when it returns */
    drv_result (*synchronize)(drv_handle) =
        cuda ? d->cu.StreamSynchronize : d->hip.StreamSynchronize;
    const char *function = cuda ? "cuStreamSynchronize" : "hipStreamSynchronize";
    if (!synchronize)
        return missing(d, function);
    aotr_status st = enter(d, device, &pushed);
    if (st != AOTR_OK)
        return st;
    return leave(d, pushed, function, synchronize(stream));
}
