/* Opening a driver: the CUDA driver or the HIP runtime with dlopen (the copy
 * already loaded in the process first) and its functions resolved into the
 * tables of driver_api.h, or the host backend over the caller's launcher.
 * The operations on an opened driver are in driver.c and driver_memory.c. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <link.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver_api.h"

_Static_assert(sizeof(void *) == sizeof(void (*)(void)),
               "function pointers are stored through void *");

struct symbol {
    const char *name;
    size_t offset;
    int optional;
};

#define CU(field, name)                                                                            \
    {                                                                                              \
        name, offsetof(struct cuda_api, field), 0                                                  \
    }
#define CU_OPTIONAL(field, name)                                                                   \
    {                                                                                              \
        name, offsetof(struct cuda_api, field), 1                                                  \
    }
static const struct symbol cuda_symbols[] = {
    CU(Init, "cuInit"),
    CU(GetErrorName, "cuGetErrorName"),
    CU(GetErrorString, "cuGetErrorString"),
    CU(DeviceGet, "cuDeviceGet"),
    CU(DeviceGetAttribute, "cuDeviceGetAttribute"),
    CU(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
    CU(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"),
    CU(CtxGetCurrent, "cuCtxGetCurrent"),
    CU(CtxSetCurrent, "cuCtxSetCurrent"),
    CU(CtxPushCurrent, "cuCtxPushCurrent_v2"),
    CU(CtxPopCurrent, "cuCtxPopCurrent_v2"),
    CU(ModuleLoadData, "cuModuleLoadData"),
    CU(ModuleUnload, "cuModuleUnload"),
    CU(ModuleGetFunction, "cuModuleGetFunction"),
    CU(FuncSetAttribute, "cuFuncSetAttribute"),
    CU(LaunchKernel, "cuLaunchKernel"),
    CU_OPTIONAL(MemAllocAsync, "cuMemAllocAsync"),
    CU_OPTIONAL(MemFreeAsync, "cuMemFreeAsync"),
    CU_OPTIONAL(MemPoolCreate, "cuMemPoolCreate"),
    CU_OPTIONAL(MemPoolSetAttribute, "cuMemPoolSetAttribute"),
    CU_OPTIONAL(MemPoolDestroy, "cuMemPoolDestroy"),
    CU_OPTIONAL(MemAllocFromPoolAsync, "cuMemAllocFromPoolAsync"),
    CU_OPTIONAL(MemsetD8Async, "cuMemsetD8Async"),
    CU_OPTIONAL(Memcpy2DAsync, "cuMemcpy2DAsync_v2"),
    CU_OPTIONAL(CtxGetDevice, "cuCtxGetDevice"),
    CU_OPTIONAL(StreamIsCapturing, "cuStreamIsCapturing"),
    CU_OPTIONAL(StreamSynchronize, "cuStreamSynchronize"),
};
#undef CU
#undef CU_OPTIONAL

#define HIP(field, name, optional)                                                                 \
    {                                                                                              \
        name, offsetof(struct hip_api, field), optional                                            \
    }
static const struct symbol hip_symbols[] = {
    HIP(Init, "hipInit", 0),
    HIP(GetErrorName, "hipGetErrorName", 0),
    HIP(GetErrorString, "hipGetErrorString", 0),
    HIP(GetDevice, "hipGetDevice", 0),
    HIP(SetDevice, "hipSetDevice", 0),
    HIP(ModuleLoadData, "hipModuleLoadData", 0),
    HIP(ModuleUnload, "hipModuleUnload", 0),
    HIP(ModuleGetFunction, "hipModuleGetFunction", 0),
    HIP(ModuleLaunchKernel, "hipModuleLaunchKernel", 0),
    HIP(GetDevicePropertiesR0600, "hipGetDevicePropertiesR0600", 1),
    HIP(GetDeviceProperties, "hipGetDeviceProperties", 1),
    HIP(DeviceGetAttribute, "hipDeviceGetAttribute", 1),
    HIP(MallocAsync, "hipMallocAsync", 1),
    HIP(FreeAsync, "hipFreeAsync", 1),
    HIP(MemsetAsync, "hipMemsetAsync", 1),
    HIP(Memcpy2DAsync, "hipMemcpy2DAsync", 1),
    HIP(StreamIsCapturing, "hipStreamIsCapturing", 1),
    HIP(StreamSynchronize, "hipStreamSynchronize", 1),
};
#undef HIP

struct find_loaded {
    const char *prefix;
    char path[512];
};

static int find_loaded_cb(struct dl_phdr_info *info, size_t size, void *data)
{
    struct find_loaded *f = data;
    const char *base;
    (void)size;
    if (!info->dlpi_name || !info->dlpi_name[0])
        return 0;
    base = strrchr(info->dlpi_name, '/');
    base = base ? base + 1 : info->dlpi_name;
    if (strncmp(base, f->prefix, strlen(f->prefix)) != 0)
        return 0;
    snprintf(f->path, sizeof f->path, "%s", info->dlpi_name);
    return 1;
}

static void *open_loaded(const char *const *sonames, size_t n, const char *prefix, char *opened,
                         size_t opened_size)
{
    struct find_loaded f;
    void *lib;
    for (size_t i = 0; i < n; i++) {
        lib = dlopen(sonames[i], RTLD_NOW | RTLD_NOLOAD);
        if (lib) {
            snprintf(opened, opened_size, "%s", sonames[i]);
            return lib;
        }
    }
    /* A copy loaded under another soname (e.g. bundled in a wheel). */
    f.prefix = prefix;
    f.path[0] = '\0';
    if (dl_iterate_phdr(find_loaded_cb, &f) && f.path[0]) {
        lib = dlopen(f.path, RTLD_NOW | RTLD_NOLOAD);
        if (lib) {
            snprintf(opened, opened_size, "%s", f.path);
            return lib;
        }
    }
    return NULL;
}

static aotr_status open_library(aotr_driver *d, const char *library)
{
    static const char *const cuda_sonames[] = {"libcuda.so.1"};
    static const char *const hip_sonames[] = {"libamdhip64.so.7", "libamdhip64.so.6",
                                              "libamdhip64.so.5", "libamdhip64.so"};
    static const char *const hip_defaults[] = {"libamdhip64.so", "libamdhip64.so.7",
                                               "libamdhip64.so.6", "libamdhip64.so.5"};
    const int cuda = d->backend == AOTR_BACKEND_CUDA;
    const char *what = cuda ? "the CUDA driver" : "the HIP runtime";
    const char *hint = cuda ? aotr_cuda_no_driver_hint : aotr_hip_no_runtime_hint;
    const char *const *defaults = cuda ? cuda_sonames : hip_defaults;
    size_t num_defaults = cuda ? 1 : sizeof hip_defaults / sizeof hip_defaults[0];
    char failures[1024];
    size_t used = 0;

    if (library && library[0]) {
        d->lib = dlopen(library, RTLD_NOW | RTLD_LOCAL);
        if (!d->lib) {
            const char *e = dlerror();
            return aotr_fail(AOTR_DRIVER_UNAVAILABLE, "cannot load %s from %s (%s): %s", what,
                             library, e ? e : "unknown error", hint);
        }
        snprintf(d->library, sizeof d->library, "%s", library);
        return AOTR_OK;
    }
    d->lib = cuda ? open_loaded(cuda_sonames, 1, "libcuda.so", d->library, sizeof d->library)
                  : open_loaded(hip_sonames, sizeof hip_sonames / sizeof hip_sonames[0],
                                "libamdhip64", d->library, sizeof d->library);
    if (d->lib)
        return AOTR_OK;
    failures[0] = '\0';
    for (size_t i = 0; i < num_defaults; i++) {
        const char *e;
        int w;
        d->lib = dlopen(defaults[i], RTLD_NOW | RTLD_LOCAL);
        if (d->lib) {
            snprintf(d->library, sizeof d->library, "%s", defaults[i]);
            return AOTR_OK;
        }
        e = dlerror();
        if (used < sizeof failures) {
            w = snprintf(failures + used, sizeof failures - used, "%s%s", used ? "; " : "",
                         e ? e : defaults[i]);
            if (w > 0)
                used += (size_t)w;
        }
    }
    return aotr_fail(AOTR_DRIVER_UNAVAILABLE, "cannot load %s (%s): %s", what, failures, hint);
}

static aotr_status resolve(aotr_driver *d)
{
    const int cuda = d->backend == AOTR_BACKEND_CUDA;
    const struct symbol *table = cuda ? cuda_symbols : hip_symbols;
    size_t n = cuda ? sizeof cuda_symbols / sizeof cuda_symbols[0]
                    : sizeof hip_symbols / sizeof hip_symbols[0];
    char *base = cuda ? (char *)&d->cu : (char *)&d->hip;
    for (size_t i = 0; i < n; i++) {
        void *p;
        dlerror();
        p = dlsym(d->lib, table[i].name);
        if (!p && !table[i].optional)
            return aotr_fail(AOTR_DRIVER_UNAVAILABLE,
                             "%s has no function %s: it is not %s or it is too old; %s", d->library,
                             table[i].name, cuda ? "the CUDA driver" : "the HIP runtime",
                             cuda ? "update the NVIDIA driver" : "update ROCm");
        memcpy(base + table[i].offset, &p, sizeof p);
    }
    if (!cuda && d->hip.GetDevicePropertiesR0600)
        d->hip.GetDeviceProperties = NULL; /* that one is the old layout */
    return AOTR_OK;
}

aotr_status aotr_driver_open(aotr_backend backend, const char *library, aotr_driver **out)
{
    aotr_driver *d;
    aotr_status st;
    drv_result rc;
    if (!out)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "aotr_driver_open: out is NULL");
    *out = NULL;
    if (backend != AOTR_BACKEND_CUDA && backend != AOTR_BACKEND_HIP)
        return aotr_fail(AOTR_INVALID_ARGUMENT,
                         "aotr_driver_open: backend %d is neither HIP (1) nor CUDA (2)",
                         (int)backend);
    d = calloc(1, sizeof *d);
    if (!d)
        return aotr_fail(AOTR_OUT_OF_MEMORY, "aotr_driver_open: out of memory");
    d->backend = backend;
    if (pthread_mutex_init(&d->lock, NULL) != 0) {
        free(d);
        return aotr_fail(AOTR_OUT_OF_MEMORY, "aotr_driver_open: cannot create a mutex");
    }
    st = open_library(d, library);
    if (st == AOTR_OK)
        st = resolve(d);
    if (st == AOTR_OK) {
        const char *fn = backend == AOTR_BACKEND_CUDA ? "cuInit" : "hipInit";
        rc = backend == AOTR_BACKEND_CUDA ? d->cu.Init(0) : d->hip.Init(0);
        if (rc != 0) {
            char context[600];
            snprintf(context, sizeof context, "%s", d->library);
            st = aotr_driver_error(d, AOTR_DRIVER_UNAVAILABLE, fn, rc, NULL, context);
        }
    }
    if (st != AOTR_OK) {
        if (d->lib)
            dlclose(d->lib);
        pthread_mutex_destroy(&d->lock);
        free(d);
        return st;
    }
    *out = d;
    return AOTR_OK;
}

aotr_backend aotr_driver_backend(const aotr_driver *d) { return d->backend; }

aotr_status aotr_driver_open_host(const aotr_host_launcher *launcher, aotr_driver **out)
{
    *out = NULL;
    if (!launcher || !launcher->launch)
        return aotr_fail(AOTR_INVALID_ARGUMENT,
                         "the host backend needs a launcher (aotr_runtime_options.host_launch)");
    aotr_driver *d = calloc(1, sizeof *d);
    if (!d)
        return aotr_fail(AOTR_OUT_OF_MEMORY, "aotr_driver_open_host: out of memory");
    d->backend = AOTR_BACKEND_HOST;
    d->host = *launcher;
    snprintf(d->library, sizeof d->library, "the host launcher");
    if (pthread_mutex_init(&d->lock, NULL) != 0) {
        free(d);
        return aotr_fail(AOTR_OUT_OF_MEMORY, "aotr_driver_open_host: cannot create a mutex");
    }
    *out = d;
    return AOTR_OK;
}

const aotr_host_launcher *aotr_driver_host(const aotr_driver *d)
{
    return d->backend == AOTR_BACKEND_HOST ? &d->host : NULL;
}
