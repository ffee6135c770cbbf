/* The HIP runtime's side of driver.c: its error hints and module loads. */
#include <stdio.h>
#include <string.h>

#include "driver_api.h"

AOTR_HIDDEN const char *aotr_hip_hint(const char *function, drv_result code)
{
    if (strcmp(function, "hipModuleLaunchKernel") == 0) {
        switch (code) {
        case hipErrorInvalidValue:
            return "invalid launch configuration (block above 1024 threads, or shared memory "
                   "above the LDS per workgroup: 64 KiB, 160 KiB on gfx950)";
        case hipErrorInvalidDeviceFunction:
            return "the function does not belong to the stream's device or this GPU's arch: "
                   "make the device current (torch.cuda.device(index)) and pass its stream";
        case hipErrorInvalidHandle:
            return "the stream or function belongs to another device: pass that device's "
                   "stream and make it current";
        case hipErrorLaunchOutOfResources:
            return "the kernel needs more registers or LDS than the GPU offers for this block "
                   "size: the kernel variant does not fit this GPU";
        case hipErrorIllegalAddress:
            return "a kernel accessed invalid memory; the HIP context is now unusable, "
                   "restart the process. Please report it with the shapes, dtypes and strides";
        case hipErrorLaunchFailure: return "a kernel failed; restart the process";
        default: return NULL;
        }
    }
    switch (code) {
    case hipErrorNoBinaryForGpu:
        return "the code object was compiled for another GPU architecture: install the "
               "kernel archive for this GPU's gfx arch";
    case hipErrorInvalidImage:
        return "the code object is not a valid HSACO for this runtime: the archive may be "
               "damaged, or built for another arch or code object version; reinstall it";
    case hipErrorSharedObjectInitFailed:
        return "the runtime could not load the code object: it may target another arch or "
               "need a newer ROCm";
    case hipErrorNotFound: return aotr_not_in_image_hint;
    case hipErrorInvalidDevice: return "no such device index (check HIP_VISIBLE_DEVICES)";
    case hipErrorNoDevice: return aotr_hip_no_runtime_hint;
    case hipErrorInsufficientDriver:
        return "the amdgpu kernel driver is too old for this ROCm runtime";
    default: return strcmp(function, "hipInit") == 0 ? aotr_hip_no_runtime_hint : NULL;
    }
}

AOTR_HIDDEN aotr_status aotr_hip_load(aotr_driver *d, int32_t device, const void *image,
                                      size_t size, const char *symbol, void **function)
{
    char context[512];
    drv_handle module = NULL, fn = NULL;
    int current = 0, switched = 0;
    drv_result rc;
    aotr_status st;
    snprintf(context, sizeof context, "%s, %zu bytes, device %d", symbol, size, (int)device);
    rc = d->hip.GetDevice(&current);
    if (rc != hipSuccess)
        return aotr_driver_error(d, AOTR_DRIVER_ERROR, "hipGetDevice", rc, NULL, context);
    if (current != device) {
        rc = d->hip.SetDevice(device);
        if (rc != hipSuccess)
            return aotr_driver_error(d, AOTR_DRIVER_ERROR, "hipSetDevice", rc, NULL, context);
        switched = 1;
    }
    rc = d->hip.ModuleLoadData(&module, image);
    if (rc != hipSuccess) {
        st = aotr_driver_error(d, AOTR_DRIVER_ERROR, "hipModuleLoadData", rc, NULL, context);
        goto done;
    }
    rc = d->hip.ModuleGetFunction(&fn, module, symbol);
    if (rc != hipSuccess) {
        st = aotr_driver_error(d, AOTR_DRIVER_ERROR, "hipModuleGetFunction", rc,
                               rc == hipErrorNotFound ? aotr_not_in_image_hint : NULL, context);
        goto done;
    }
    /* No opt-in on HIP: dynamic LDS up to the hardware limit is accepted at
     * launch. */
    st = aotr_driver_remember_module(d, module, device);
done:
    if (st != AOTR_OK && module)
        (void)d->hip.ModuleUnload(module);
    if (switched)
        (void)d->hip.SetDevice(current);
    if (st == AOTR_OK)
        *function = fn;
    return st;
}
