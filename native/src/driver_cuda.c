/* The CUDA driver's side of driver.c and driver_memory.c: its error hints,
 * primary contexts, module loads and the scratch pool. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver_api.h"

AOTR_HIDDEN const char *aotr_cuda_hint(const char *function, drv_result code)
{
    if (strcmp(function, "cuLaunchKernel") == 0) {
        switch (code) {
        case CUDA_ERROR_INVALID_CONTEXT:
            return "no CUDA context of the kernel's device is current on this thread: make "
                   "the device current (torch.cuda.device(index)) before the call";
        case CUDA_ERROR_INVALID_HANDLE:
            return "the stream or function belongs to another device: pass that device's "
                   "stream and make it current";
        case CUDA_ERROR_INVALID_VALUE:
            return "invalid launch configuration (grid y/z above 65535, block above 1024 "
                   "threads, or shared memory above the function's limit)";
        case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES:
            return "the kernel needs more registers or shared memory than the GPU offers for "
                   "this block size: the kernel variant does not fit this GPU";
        case CUDA_ERROR_ILLEGAL_ADDRESS:
            return "a kernel accessed invalid memory; the CUDA context is now unusable, "
                   "restart the process. Please report it with the shapes, dtypes and strides";
        case CUDA_ERROR_LAUNCH_FAILED:
            return "a kernel failed; the CUDA context is now unusable, restart the process";
        default: return NULL;
        }
    }
    switch (code) {
    case CUDA_ERROR_NO_BINARY_FOR_GPU:
        return "the cubin was compiled for another GPU architecture: install the kernel "
               "archive built for this GPU";
    case CUDA_ERROR_INVALID_IMAGE:
        return "the code object is not a valid cubin for this driver: the archive may be "
               "damaged or built for another backend; reinstall it";
    case CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
        return "the code object needs a newer NVIDIA driver: update the driver";
    case CUDA_ERROR_NOT_FOUND: return aotr_not_in_image_hint;
    case CUDA_ERROR_INVALID_DEVICE: return "no such device index (check CUDA_VISIBLE_DEVICES)";
    case CUDA_ERROR_NO_DEVICE: return aotr_cuda_no_driver_hint;
    case CUDA_ERROR_INSUFFICIENT_DRIVER: return "the installed NVIDIA driver is too old: update it";
    default: return strcmp(function, "cuInit") == 0 ? aotr_cuda_no_driver_hint : NULL;
    }
}

/* -------------------------------------------------------- CUDA contexts */

/* The primary context of `device`, retained on first use. */
AOTR_HIDDEN aotr_status aotr_cuda_primary_context(aotr_driver *d, int32_t device, drv_handle *ctx)
{
    aotr_status st = AOTR_OK;
    pthread_mutex_lock(&d->lock);
    if ((size_t)device >= d->num_contexts) {
        size_t n = (size_t)device + 1;
        drv_handle *grown = realloc(d->contexts, n * sizeof *grown);
        if (grown)
            d->contexts = grown;
        drv_handle *pools = grown ? realloc(d->pools, n * sizeof *pools) : NULL;
        if (!pools) {
            pthread_mutex_unlock(&d->lock);
            return aotr_fail(AOTR_OUT_OF_MEMORY, "out of memory");
        }
        for (size_t i = d->num_contexts; i < n; i++)
            grown[i] = pools[i] = NULL;
        d->pools = pools;
        d->num_contexts = n;
    }
    *ctx = d->contexts[device];
    if (!*ctx) {
        int dev = 0;
        drv_result rc = d->cu.DeviceGet(&dev, device);
        if (rc != CUDA_SUCCESS) {
            st = aotr_driver_error(d, AOTR_DRIVER_ERROR, "cuDeviceGet", rc, NULL, NULL);
        } else {
            rc = d->cu.DevicePrimaryCtxRetain(ctx, dev);
            if (rc != CUDA_SUCCESS)
                st = aotr_driver_error(d, AOTR_DRIVER_ERROR, "cuDevicePrimaryCtxRetain", rc, NULL,
                                       NULL);
            else
                d->contexts[device] = *ctx;
        }
    }
    pthread_mutex_unlock(&d->lock);
    return st;
}

/* Make `device`'s primary context current: set when the thread has none,
 * pushed (*pushed = 1) when another one is current. */
AOTR_HIDDEN aotr_status aotr_cuda_enter(aotr_driver *d, int32_t device, int *pushed)
{
    drv_handle ctx, current = NULL;
    drv_result rc;
    aotr_status st = aotr_cuda_primary_context(d, device, &ctx);
    *pushed = 0;
    if (st != AOTR_OK)
        return st;
    rc = d->cu.CtxGetCurrent(&current);
    if (rc != CUDA_SUCCESS)
        return aotr_driver_error(d, AOTR_DRIVER_ERROR, "cuCtxGetCurrent", rc, NULL, NULL);
    if (current == ctx)
        return AOTR_OK;
    if (!current) {
        rc = d->cu.CtxSetCurrent(ctx);
        if (rc != CUDA_SUCCESS)
            return aotr_driver_error(d, AOTR_DRIVER_ERROR, "cuCtxSetCurrent", rc, NULL, NULL);
        return AOTR_OK;
    }
    rc = d->cu.CtxPushCurrent(ctx);
    if (rc != CUDA_SUCCESS)
        return aotr_driver_error(d, AOTR_DRIVER_ERROR, "cuCtxPushCurrent", rc, NULL, NULL);
    *pushed = 1;
    return AOTR_OK;
}

AOTR_HIDDEN void aotr_cuda_leave(aotr_driver *d, int pushed)
{
    drv_handle popped = NULL;
    if (pushed)
        (void)d->cu.CtxPopCurrent(&popped);
}

AOTR_HIDDEN aotr_status aotr_cuda_load(aotr_driver *d, int32_t device, const void *image,
                                       size_t size, const char *symbol, uint32_t shared,
                                       void **function)
{
    char context[512];
    drv_handle module = NULL, fn = NULL;
    drv_result rc;
    int pushed;
    aotr_status st = aotr_cuda_enter(d, device, &pushed);
    if (st != AOTR_OK)
        return aotr_fail_prefix(st, "loading %s on device %d", symbol, (int)device);
    snprintf(context, sizeof context, "%s, %zu bytes, device %d", symbol, size, (int)device);
    rc = d->cu.ModuleLoadData(&module, image);
    if (rc != CUDA_SUCCESS) {
        st = aotr_driver_error(d, AOTR_DRIVER_ERROR, "cuModuleLoadData", rc, NULL, context);
        goto done;
    }
    rc = d->cu.ModuleGetFunction(&fn, module, symbol);
    if (rc != CUDA_SUCCESS) {
        st = aotr_driver_error(d, AOTR_DRIVER_ERROR, "cuModuleGetFunction", rc,
                               rc == CUDA_ERROR_NOT_FOUND ? aotr_not_in_image_hint : NULL, context);
        goto done;
    }
    if (shared > CUDA_DEFAULT_MAX_DYNAMIC_SHARED) {
        rc = d->cu.FuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                    (int)shared);
        if (rc != CUDA_SUCCESS) {
            char hint[256];
            int dev = 0, limit = 0;
            if (d->cu.DeviceGet(&dev, device) == CUDA_SUCCESS &&
                d->cu.DeviceGetAttribute(&limit,
                                         CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                                         dev) == CUDA_SUCCESS)
                snprintf(hint, sizeof hint,
                         "the kernel needs %u bytes of shared memory, device %d allows at most "
                         "%d per block: the kernel variant does not fit this GPU",
                         (unsigned)shared, (int)device, limit);
            else
                snprintf(hint, sizeof hint,
                         "the kernel needs %u bytes of shared memory, more than this GPU "
                         "allows per block",
                         (unsigned)shared);
            st = aotr_driver_error(d, AOTR_DRIVER_ERROR, "cuFuncSetAttribute", rc, hint, context);
            goto done;
        }
    }
    st = aotr_driver_remember_module(d, module, device);
done:
    if (st != AOTR_OK && module)
        (void)d->cu.ModuleUnload(module);
    aotr_cuda_leave(d, pushed);
    if (st == AOTR_OK)
        *function = fn;
    return st;
}

/* After CUDA_ERROR_INVALID_CONTEXT: 1 when the thread had no current
 * context and now has `device`'s primary context (the launch is retried). */
AOTR_HIDDEN int aotr_cuda_recover(aotr_driver *d, int32_t device)
{
    drv_handle current = NULL, ctx = NULL;
    if (d->cu.CtxGetCurrent(&current) != CUDA_SUCCESS || current)
        return 0;
    /* The message of a failure here is replaced by the launch's. */
    if (aotr_cuda_primary_context(d, device, &ctx) != AOTR_OK)
        return 0;
    return d->cu.CtxSetCurrent(ctx) == CUDA_SUCCESS;
}

/* The runtime's own pool of device memory for `device`, which keeps up to
 * SCRATCH_POOL_KEEP freed bytes mapped; NULL (use the default pool) where
 * the driver has no pools or creating one failed. Created once: after a
 * failure the slot holds the pool-less marker and nothing is retried. */
static char no_pool; /* a pools[] slot's marker: no pool for this device */

AOTR_HIDDEN drv_handle aotr_cuda_scratch_pool(aotr_driver *d, int32_t device)
{
    drv_handle ctx, pool = NULL;
    int dev = 0;
    pthread_mutex_lock(&d->lock); /* every launch after the first: made already */
    if ((size_t)device < d->num_contexts && d->pools[device])
        pool = d->pools[device];
    pthread_mutex_unlock(&d->lock);
    if (pool)
        return pool == (drv_handle)&no_pool ? NULL : pool;
    if (!d->cu.MemPoolCreate || !d->cu.MemPoolSetAttribute || !d->cu.MemPoolDestroy ||
        !d->cu.MemAllocFromPoolAsync || aotr_cuda_primary_context(d, device, &ctx) != AOTR_OK)
        return NULL; /* (the context also sizes the pools' slots) */
    pthread_mutex_lock(&d->lock);
    if (!d->pools[device] && d->cu.DeviceGet(&dev, device) == CUDA_SUCCESS) {
        struct cu_mem_pool_props props;
        uint64_t keep = SCRATCH_POOL_KEEP;
        memset(&props, 0, sizeof props);
        props.alloc_type = CU_MEM_ALLOCATION_TYPE_PINNED;
        props.location_type = CU_MEM_LOCATION_TYPE_DEVICE;
        props.location_id = dev;
        if (d->cu.MemPoolCreate(&pool, &props) == CUDA_SUCCESS) {
            if (d->cu.MemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep) !=
                CUDA_SUCCESS) {
                (void)d->cu.MemPoolDestroy(pool);
                pool = NULL;
            }
        } else {
            pool = NULL;
        }
        d->pools[device] = pool ? pool : (drv_handle)&no_pool;
    }
    pool = d->pools[device] == (drv_handle)&no_pool ? NULL : d->pools[device];
    pthread_mutex_unlock(&d->lock);
    return pool;
}

/* pool: the runtime's (aotr_cuda_scratch_pool), or NULL for the device's default one */
AOTR_HIDDEN drv_result aotr_cuda_alloc_from(aotr_driver *d, drv_handle pool, uint64_t *ptr,
                                            size_t bytes, void *stream)
{
    return pool ? d->cu.MemAllocFromPoolAsync(ptr, bytes, pool, stream)
                : d->cu.MemAllocAsync(ptr, bytes, stream);
}

void aotr_cuda_release(aotr_driver *d)
{
    for (size_t i = 0; i < d->num_contexts; i++) {
        /* outstanding allocations keep a destroyed pool alive until freed */
        if (d->pools[i] && d->pools[i] != (drv_handle)&no_pool)
            (void)d->cu.MemPoolDestroy(d->pools[i]);
    }
    for (size_t i = 0; i < d->num_contexts; i++) {
        int dev = 0;
        if (d->contexts[i] && d->cu.DeviceGet(&dev, (int)i) == CUDA_SUCCESS)
            (void)d->cu.DevicePrimaryCtxRelease(dev);
    }
}
