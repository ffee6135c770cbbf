/* The GPU drivers once opened (driver_open.c opens them; their
 * vendor-specific parts in driver_cuda.c and driver_hip.c, the host
 * backend's in driver_host.c): error messages, device queries, module loads
 * and launches with a packed argument buffer, global scratch, and closing.
 * Stream-ordered memory, copies and queries are in driver_memory.c. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver_api.h"

/* ---------------------------------------------------------------- errors */

const char aotr_cuda_no_driver_hint[] =
    "the CUDA backend needs an NVIDIA GPU and its driver (libcuda.so.1 comes with the "
    "NVIDIA driver, not with torch): install the NVIDIA driver, or load the process's "
    "CUDA (import torch) first";
const char aotr_hip_no_runtime_hint[] =
    "the HIP backend needs an AMD GPU and the HIP runtime (libamdhip64): install ROCm, put "
    "ROCm's lib directory on LD_LIBRARY_PATH, or load a ROCm build of torch first";
const char aotr_not_in_image_hint[] =
    "the kernel symbol is not in the code object: the archive's index does not match its "
    "code objects; reinstall the kernel archive";

static void error_name_string(const aotr_driver *d, drv_result code, const char **name,
                              const char **text)
{
    *name = NULL;
    *text = NULL;
    if (d->backend == AOTR_BACKEND_CUDA) {
        if (d->cu.GetErrorName(code, name) != CUDA_SUCCESS)
            *name = NULL;
        if (d->cu.GetErrorString(code, text) != CUDA_SUCCESS)
            *text = NULL;
        if (!*name)
            *name = "CUDA_ERROR_UNRECOGNIZED";
    } else {
        *name = d->hip.GetErrorName(code);
        *text = d->hip.GetErrorString(code);
        if (!*name)
            *name = "hipErrorUnknown";
    }
    if (!*text)
        *text = "no description";
}

/* "<function> failed: <name>: <string> (code N; <hint>)" plus, when given,
 * " [<context>]". `hint` NULL: the backend's hint for the code, if any. */
aotr_status aotr_driver_error(const aotr_driver *d, aotr_status status, const char *function,
                              drv_result code, const char *hint, const char *context)
{
    const char *name, *text;
    error_name_string(d, code, &name, &text);
    if (!hint)
        hint = d->backend == AOTR_BACKEND_CUDA ? aotr_cuda_hint(function, code)
                                               : aotr_hip_hint(function, code);
    return aotr_fail(status, "%s failed: %s: %s (code %d%s%s)%s%s%s", function, name, text,
                     (int)code, hint ? "; " : "", hint ? hint : "", context ? " [" : "",
                     context ? context : "", context ? "]" : "");
}

/* ------------------------------------------------------------------ arch */

aotr_status aotr_driver_device_arch(aotr_driver *d, int32_t device, char *arch, size_t capacity)
{
    char name[HIP_GCN_ARCH_NAME_SIZE];
    int w;
    if (!d || !arch || capacity == 0)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "aotr_driver_device_arch: NULL argument");
    if (device < 0)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "device index %d is negative", (int)device);
    if (d->backend == AOTR_BACKEND_HOST) {
        snprintf(arch, capacity, "host");
        return AOTR_OK;
    }
    if (d->backend == AOTR_BACKEND_CUDA) {
        int dev = 0, major = 0, minor = 0;
        drv_result rc = d->cu.DeviceGet(&dev, device);
        if (rc != CUDA_SUCCESS)
            return aotr_fail_prefix(
                aotr_driver_error(d, AOTR_DRIVER_ERROR, "cuDeviceGet", rc, NULL, NULL), "device %d",
                (int)device);
        rc = d->cu.DeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
        if (rc == CUDA_SUCCESS)
            rc =
                d->cu.DeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
        if (rc != CUDA_SUCCESS)
            return aotr_fail_prefix(aotr_driver_error(d, AOTR_DRIVER_ERROR, "cuDeviceGetAttribute",
                                                      rc, NULL, "compute capability"),
                                    "device %d", (int)device);
        w = snprintf(name, sizeof name, "sm_%d%d", major, minor);
    } else {
        const char *fn = d->hip.GetDevicePropertiesR0600 ? "hipGetDevicePropertiesR0600"
                                                         : "hipGetDeviceProperties";
        size_t offset = d->hip.GetDevicePropertiesR0600 ? HIP_PROPS_R0600_GCN_ARCH_NAME
                                                        : HIP_PROPS_R0000_GCN_ARCH_NAME;
        drv_result (*get)(void *, int) = d->hip.GetDevicePropertiesR0600
                                             ? d->hip.GetDevicePropertiesR0600
                                             : d->hip.GetDeviceProperties;
        unsigned char *props;
        const char *gcn;
        size_t len;
        drv_result rc;
        if (!get)
            return aotr_fail(AOTR_UNSUPPORTED,
                             "%s has neither hipGetDevicePropertiesR0600 nor "
                             "hipGetDeviceProperties: cannot read device %d's arch name; pass "
                             "the archive for it with aotr_runtime_add_archive",
                             d->library, (int)device);
        /* Larger than any known hipDeviceProp_t, in case a release grows it. */
        props = calloc(1, HIP_PROPS_BUFFER);
        if (!props)
            return aotr_fail(AOTR_OUT_OF_MEMORY, "out of memory");
        rc = get(props, device);
        if (rc != hipSuccess) {
            free(props);
            return aotr_fail_prefix(aotr_driver_error(d, AOTR_DRIVER_ERROR, fn, rc, NULL, NULL),
                                    "device %d", (int)device);
        }
        gcn = (const char *)props + offset;
        len = strnlen(gcn, HIP_GCN_ARCH_NAME_SIZE);
        if (len == HIP_GCN_ARCH_NAME_SIZE || strncmp(gcn, "gfx", 3) != 0) {
            free(props);
            return aotr_fail(AOTR_UNSUPPORTED,
                             "%s of %s returned no gfx arch name at byte %zu for device %d: "
                             "this HIP runtime's hipDeviceProp_t layout is not one this library "
                             "knows (ROCm 4.5 to 7.x); pass the archive for the device with "
                             "aotr_runtime_add_archive",
                             fn, d->library, offset, (int)device);
        }
        len = strcspn(gcn, ":");
        memcpy(name, gcn, len);
        name[len] = '\0';
        free(props);
        w = (int)len;
    }
    if (w < 0 || (size_t)w >= capacity)
        return aotr_fail(AOTR_INVALID_ARGUMENT,
                         "the arch name %s of device %d does not fit in %zu bytes", name,
                         (int)device, capacity);
    memcpy(arch, name, (size_t)w + 1);
    return AOTR_OK;
}

/* ------------------------------------------------------------------ load */

aotr_status aotr_driver_remember_module(aotr_driver *d, drv_handle module, int32_t device)
{
    struct loaded_module *m = malloc(sizeof *m);
    if (!m)
        return aotr_fail(AOTR_OUT_OF_MEMORY, "out of memory");
    m->module = module;
    m->device = device;
    pthread_mutex_lock(&d->lock);
    m->next = d->modules;
    d->modules = m;
    pthread_mutex_unlock(&d->lock);
    return AOTR_OK;
}

aotr_status aotr_driver_compute_units(aotr_driver *d, int32_t device, int32_t *out)
{
    int n = 0;
    drv_result rc;
    if (!d || !out || device < 0)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "aotr_driver_compute_units: bad argument");
    if (d->backend == AOTR_BACKEND_HOST) {
        n = d->host.compute_units;
    } else if (d->backend == AOTR_BACKEND_CUDA) {
        int dev = 0;
        rc = d->cu.DeviceGet(&dev, device);
        if (rc == CUDA_SUCCESS)
            rc = d->cu.DeviceGetAttribute(&n, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
        if (rc != CUDA_SUCCESS)
            return aotr_driver_error(d, AOTR_DRIVER_ERROR, "cuDeviceGetAttribute", rc, NULL,
                                     "multiprocessor count");
    } else {
        if (!d->hip.DeviceGetAttribute)
            return aotr_fail(AOTR_UNSUPPORTED, "%s has no hipDeviceGetAttribute", d->library);
        rc = d->hip.DeviceGetAttribute(&n, hipDeviceAttributeMultiprocessorCount, device);
        if (rc != hipSuccess)
            return aotr_driver_error(d, AOTR_DRIVER_ERROR, "hipDeviceGetAttribute", rc, NULL,
                                     "multiprocessor count");
    }
    *out = n;
    return AOTR_OK;
}

aotr_status aotr_driver_load(aotr_driver *d, int32_t device, const void *image, size_t size,
                             const char *symbol, uint32_t shared, void **function)
{
    if (!d || !image || size == 0 || !symbol || !symbol[0] || !function)
        return aotr_fail(AOTR_INVALID_ARGUMENT,
                         "aotr_driver_load: NULL or empty argument (image %p, %zu bytes, "
                         "symbol %s)",
                         image, size, symbol ? symbol : "(null)");
    if (device < 0)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "device index %d is negative", (int)device);
    *function = NULL;
    if (d->backend == AOTR_BACKEND_CUDA)
        return aotr_cuda_load(d, device, image, size, symbol, shared, function);
    return aotr_hip_load(d, device, image, size, symbol, function);
}

/* ---------------------------------------------------------------- launch */

static aotr_status launch_failed(aotr_driver *d, int32_t device, const char *function,
                                 drv_result rc, const uint32_t grid[3], uint32_t block_x,
                                 uint32_t shared, void *stream, size_t args_size)
{
    char context[256];
    snprintf(context, sizeof context,
             "grid (%u, %u, %u), block (%u, 1, 1), shared %u bytes, stream %p, %zu argument "
             "bytes, device %d",
             (unsigned)grid[0], (unsigned)grid[1], (unsigned)grid[2], (unsigned)block_x,
             (unsigned)shared, stream, args_size, (int)device);
    return aotr_driver_error(d, AOTR_DRIVER_ERROR, function, rc, NULL, context);
}

aotr_status aotr_driver_launch(aotr_driver *d, int32_t device, void *function,
                               const uint32_t grid[3], uint32_t block_x, uint32_t shared,
                               void *stream, void *args, size_t args_size)
{
    size_t size = args_size;
    drv_result rc;
    if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0)
        return AOTR_OK; /* an empty problem: nothing to run */
    if (d->backend == AOTR_BACKEND_CUDA) {
        void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, args, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                         CU_LAUNCH_PARAM_END};
        rc = d->cu.LaunchKernel(function, grid[0], grid[1], grid[2], block_x, 1, 1, shared, stream,
                                NULL, extra);
        if (rc == CUDA_SUCCESS)
            return AOTR_OK;
        if (rc == CUDA_ERROR_INVALID_CONTEXT && aotr_cuda_recover(d, device)) {
            size = args_size;
            rc = d->cu.LaunchKernel(function, grid[0], grid[1], grid[2], block_x, 1, 1, shared,
                                    stream, NULL, extra);
            if (rc == CUDA_SUCCESS)
                return AOTR_OK;
        }
        return launch_failed(d, device, "cuLaunchKernel", rc, grid, block_x, shared, stream,
                             args_size);
    }
    {
        void *extra[] = {HIP_LAUNCH_PARAM_BUFFER_POINTER, args, HIP_LAUNCH_PARAM_BUFFER_SIZE, &size,
                         HIP_LAUNCH_PARAM_END};
        rc = d->hip.ModuleLaunchKernel(function, grid[0], grid[1], grid[2], block_x, 1, 1, shared,
                                       stream, NULL, extra);
        if (rc == hipSuccess)
            return AOTR_OK;
        return launch_failed(d, device, "hipModuleLaunchKernel", rc, grid, block_x, shared, stream,
                             args_size);
    }
}

/* --------------------------------------------------------------- scratch */

aotr_status aotr_driver_scratch_alloc(aotr_driver *d, int32_t device, size_t bytes, void *stream,
                                      uint64_t *ptr)
{
    drv_result rc;
    *ptr = 0;
    if (d->backend == AOTR_BACKEND_HOST)
        return aotr_host_mem_alloc(bytes, ptr);
    if (d->backend != AOTR_BACKEND_CUDA)
        return aotr_fail(AOTR_UNSUPPORTED,
                         "a kernel of this image needs %zu bytes of global scratch, which the "
                         "HIP path does not allocate: rebuild the image with this release's "
                         "aotriton-rocm (its build refuses such kernels for AMD archs)",
                         bytes);
    if (!d->cu.MemAllocAsync || !d->cu.MemFreeAsync)
        return aotr_fail(AOTR_DRIVER_UNAVAILABLE,
                         "%s has no cuMemAllocAsync, which this kernel's global scratch needs: "
                         "update the NVIDIA driver (CUDA 11.2 or newer)",
                         d->library);
    drv_handle pool = aotr_cuda_scratch_pool(d, device);
    rc = aotr_cuda_alloc_from(d, pool, ptr, bytes, stream);
    if (rc == CUDA_ERROR_INVALID_CONTEXT && aotr_cuda_recover(d, device))
        rc = aotr_cuda_alloc_from(d, pool, ptr, bytes, stream);
    if (rc == CUDA_SUCCESS)
        return AOTR_OK;
    *ptr = 0; /* the caller frees nothing after a failure */
    char context[128];
    snprintf(context, sizeof context, "%zu bytes of global scratch, stream %p, device %d", bytes,
             stream, (int)device);
    return aotr_driver_error(d, AOTR_DRIVER_ERROR,
                             pool ? "cuMemAllocFromPoolAsync" : "cuMemAllocAsync", rc, NULL,
                             context);
}

void aotr_driver_scratch_free(aotr_driver *d, uint64_t ptr, void *stream)
{
    /* stream-ordered: the memory returns to the pool after the launch runs;
     * only the CUDA and host paths ever allocate (ptr 0 otherwise) */
    if (ptr && d->backend == AOTR_BACKEND_HOST)
        aotr_host_mem_free(ptr);
    else if (ptr)
        (void)d->cu.MemFreeAsync(ptr, stream);
}

/* ----------------------------------------------------------------- close */

void aotr_driver_close(aotr_driver *d)
{
    struct loaded_module *m, *next;
    if (!d)
        return;
    /* Errors are ignored: at process exit the driver may already be shut
     * down (CUDA_ERROR_DEINITIALIZED), and nothing can be done anyway. */
    for (m = d->modules; m; m = next) {
        next = m->next;
        if (d->backend == AOTR_BACKEND_CUDA) {
            int pushed = 0;
            drv_handle ctx = (size_t)m->device < d->num_contexts ? d->contexts[m->device] : NULL;
            /* cuModuleUnload works on the module's context: push it. */
            if (ctx && d->cu.CtxPushCurrent(ctx) == CUDA_SUCCESS)
                pushed = 1;
            (void)d->cu.ModuleUnload(m->module);
            aotr_cuda_leave(d, pushed);
        } else {
            (void)d->hip.ModuleUnload(m->module);
        }
        free(m);
    }
    if (d->backend == AOTR_BACKEND_CUDA)
        aotr_cuda_release(d);
    free(d->contexts);
    free(d->pools);
    pthread_mutex_destroy(&d->lock);
    if (d->lib)
        dlclose(d->lib);
    free(d);
}
