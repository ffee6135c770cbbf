/* The GPU drivers, opened with dlopen (the CUDA driver, the HIP runtime;
 * their vendor-specific parts in driver_cuda.c and driver_hip.c, the host
 * backend's in driver_host.c): module loads and launches with a packed
 * argument buffer, stream-ordered memory, copies and queries. */
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

/* ------------------------------------------------------------------ open */

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

/* --------------------------------- stream-ordered memory, copies, queries */
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
