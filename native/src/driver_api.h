/* The CUDA driver and HIP runtime as libaotriton_rocm declares them (no
 * CUDA or ROCm header: the prototypes and constants follow cuda.h and
 * hip_runtime_api.h; handles are pointers, CUdevice and the result codes
 * ints), and the state of an opened driver. Private to driver*.c. */
#ifndef AOTR_DRIVER_API_H
#define AOTR_DRIVER_API_H

#include <pthread.h>

#include "internal.h"

typedef int drv_result;

/* ------------------------------------------------------------ constants */

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_INSUFFICIENT_DRIVER 35
#define CUDA_ERROR_NO_DEVICE 100
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_INVALID_IMAGE 200
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_NO_BINARY_FOR_GPU 209
#define CUDA_ERROR_UNSUPPORTED_PTX_VERSION 222
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_ILLEGAL_ADDRESS 700
#define CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES 701
#define CUDA_ERROR_LAUNCH_FAILED 719

#define CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT 16
#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR 75
#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR 76
#define CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN 97
#define CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES 8
#define CU_MEM_ALLOCATION_TYPE_PINNED 1
#define CU_MEM_LOCATION_TYPE_DEVICE 1
#define CU_MEMPOOL_ATTR_RELEASE_THRESHOLD 4

/* CUmemPoolProps (CUDA 11.2 on; later fields live in the zeroed tail). */
struct cu_mem_pool_props {
    int alloc_type;
    int handle_types;
    int location_type;
    int location_id;
    void *win32_security_attributes;
    unsigned char tail[64];
};

/* CUDA_MEMCPY2D (cuMemcpy2DAsync_v2): the enum fields are 4 bytes, padded
 * before the pointers. */
struct cu_memcpy2d {
    size_t src_x_bytes, src_y;
    int src_memory_type;
    const void *src_host;
    uint64_t src_device;
    void *src_array;
    size_t src_pitch;
    size_t dst_x_bytes, dst_y;
    int dst_memory_type;
    void *dst_host;
    uint64_t dst_device;
    void *dst_array;
    size_t dst_pitch;
    size_t width_bytes, height;
};

/* Bytes of freed global scratch the runtime's pool keeps mapped across
 * synchronisations. The device's default pool keeps none, so the first
 * launch after every synchronisation waited for its scratch to be mapped
 * again (0.1-0.15 ms on the H100). */
#define SCRATCH_POOL_KEEP ((uint64_t)64 << 20)
/* Dynamic shared memory above this needs the opt-in attribute. */
#define CUDA_DEFAULT_MAX_DYNAMIC_SHARED 49152u

#define CU_LAUNCH_PARAM_END ((void *)0)
#define CU_LAUNCH_PARAM_BUFFER_POINTER ((void *)1)
#define CU_LAUNCH_PARAM_BUFFER_SIZE ((void *)2)

#define hipSuccess 0
/* hipDeviceAttribute_t (hip_runtime_api.h, ROCm 5.x to 7.x) */
#define hipDeviceAttributeMultiprocessorCount 63
#define hipErrorInvalidValue 1
#define hipErrorInsufficientDriver 35
#define hipErrorInvalidDeviceFunction 98
#define hipErrorNoDevice 100
#define hipErrorInvalidDevice 101
#define hipErrorInvalidImage 200
#define hipErrorNoBinaryForGpu 209
#define hipErrorSharedObjectInitFailed 303
#define hipErrorInvalidHandle 400
#define hipErrorNotFound 500
#define hipErrorIllegalAddress 700
#define hipErrorLaunchOutOfResources 701
#define hipErrorLaunchFailure 719

#define HIP_LAUNCH_PARAM_BUFFER_POINTER ((void *)1)
#define HIP_LAUNCH_PARAM_BUFFER_SIZE ((void *)2)
#define HIP_LAUNCH_PARAM_END ((void *)3)

/* Byte offset of `char gcnArchName[256]` in hipDeviceProp_t on LP64:
 * - hipDeviceProp_tR0600 (hipGetDevicePropertiesR0600, ROCm 6.0 to 7.x): 1160
 *   (the struct is 1472 bytes);
 * - the older layout (hipGetDeviceProperties, ROCm 4.5 to 5.7): 396 (792).
 * Both computed with offsetof from the public hip_runtime_api.h (ROCm/HIP
 * tags rocm-4.5.0 .. rocm-6.2.0 and amd-staging; ROCm 7's copy in
 * ROCm/rocm-systems has the same members before gcnArchName). */
#define HIP_PROPS_R0600_GCN_ARCH_NAME 1160
#define HIP_PROPS_R0000_GCN_ARCH_NAME 396
#define HIP_GCN_ARCH_NAME_SIZE 256
#define HIP_PROPS_BUFFER 4096

/* ---------------------------------------------------------------- tables */

typedef void *drv_handle;

struct cuda_api {
    drv_result (*Init)(unsigned);
    drv_result (*GetErrorName)(drv_result, const char **);
    drv_result (*GetErrorString)(drv_result, const char **);
    drv_result (*DeviceGet)(int *, int);
    drv_result (*DeviceGetAttribute)(int *, int, int);
    drv_result (*DevicePrimaryCtxRetain)(drv_handle *, int);
    drv_result (*DevicePrimaryCtxRelease)(int);
    drv_result (*CtxGetCurrent)(drv_handle *);
    drv_result (*CtxSetCurrent)(drv_handle);
    drv_result (*CtxPushCurrent)(drv_handle);
    drv_result (*CtxPopCurrent)(drv_handle *);
    drv_result (*ModuleLoadData)(drv_handle *, const void *);
    drv_result (*ModuleUnload)(drv_handle);
    drv_result (*ModuleGetFunction)(drv_handle *, drv_handle, const char *);
    drv_result (*FuncSetAttribute)(drv_handle, int, int);
    drv_result (*LaunchKernel)(drv_handle, unsigned, unsigned, unsigned, unsigned, unsigned,
                               unsigned, unsigned, drv_handle, void **, void **);
    /* Optional (CUDA 11.2+): only kernels that need global scratch use them. */
    drv_result (*MemAllocAsync)(uint64_t *, size_t, drv_handle);
    drv_result (*MemFreeAsync)(uint64_t, drv_handle);
    /* Optional (CUDA 11.2+): the scratch pool; without it, the default one. */
    drv_result (*MemPoolCreate)(drv_handle *, const struct cu_mem_pool_props *);
    drv_result (*MemPoolSetAttribute)(drv_handle, int, void *);
    drv_result (*MemPoolDestroy)(drv_handle);
    drv_result (*MemAllocFromPoolAsync)(uint64_t *, size_t, drv_handle, drv_handle);
    /* Optional: stream-ordered fills, copies and queries (stage.c,
     * device_ops.c); their callers fail without them. */
    drv_result (*MemsetD8Async)(uint64_t, unsigned char, size_t, drv_handle);
    drv_result (*Memcpy2DAsync)(const struct cu_memcpy2d *, drv_handle);
    drv_result (*CtxGetDevice)(int *);
    drv_result (*StreamIsCapturing)(drv_handle, int *);
    drv_result (*StreamSynchronize)(drv_handle);
};

struct hip_api {
    drv_result (*Init)(unsigned);
    const char *(*GetErrorName)(drv_result);
    const char *(*GetErrorString)(drv_result);
    drv_result (*GetDevice)(int *);
    drv_result (*SetDevice)(int);
    drv_result (*ModuleLoadData)(drv_handle *, const void *);
    drv_result (*ModuleUnload)(drv_handle);
    drv_result (*ModuleGetFunction)(drv_handle *, drv_handle, const char *);
    drv_result (*ModuleLaunchKernel)(drv_handle, unsigned, unsigned, unsigned, unsigned, unsigned,
                                     unsigned, unsigned, drv_handle, void **, void **);
    /* Optional: at most one is used (see HIP_PROPS_*). */
    drv_result (*GetDevicePropertiesR0600)(void *, int);
    drv_result (*GetDeviceProperties)(void *, int);
    drv_result (*DeviceGetAttribute)(int *, int, int); /* optional */
    /* Optional: stream-ordered memory, fills, copies and queries (stage.c,
     * device_ops.c); their callers fail without them. */
    drv_result (*MallocAsync)(void **, size_t, drv_handle);
    drv_result (*FreeAsync)(void *, drv_handle);
    drv_result (*MemsetAsync)(void *, int, size_t, drv_handle);
    drv_result (*Memcpy2DAsync)(void *, size_t, const void *, size_t, size_t, size_t, int,
                                drv_handle);
    drv_result (*StreamIsCapturing)(drv_handle, int *);
    drv_result (*StreamSynchronize)(drv_handle);
};

struct loaded_module {
    drv_handle module;
    int32_t device;
    struct loaded_module *next;
};

struct aotr_driver {
    aotr_backend backend;
    aotr_host_launcher host; /* AOTR_BACKEND_HOST */
    void *lib;
    char library[512]; /* what was opened, for messages */
    struct cuda_api cu;
    struct hip_api hip;
    pthread_mutex_t lock; /* guards modules and contexts */
    struct loaded_module *modules;
    /* CUDA: the primary context of device i (retained once), or NULL;
     * the scratch pool of device i (created on first use), or NULL. */
    drv_handle *contexts;
    drv_handle *pools;
    size_t num_contexts; /* entries of both */
};

/* driver.c (the errors and module list; opened in driver_open.c) */
AOTR_HIDDEN extern const char aotr_cuda_no_driver_hint[];
AOTR_HIDDEN extern const char aotr_hip_no_runtime_hint[];
AOTR_HIDDEN extern const char aotr_not_in_image_hint[];
/* "<function> failed: <name>: <string> (code N; <hint>)" plus, when given,
 * " [<context>]". `hint` NULL: the backend's hint for the code, if any. */
AOTR_HIDDEN aotr_status aotr_driver_error(const aotr_driver *d, aotr_status status,
                                          const char *function, drv_result code, const char *hint,
                                          const char *context);
AOTR_HIDDEN aotr_status aotr_driver_remember_module(aotr_driver *d, drv_handle module,
                                                    int32_t device);

/* driver_cuda.c */
AOTR_HIDDEN const char *aotr_cuda_hint(const char *function, drv_result code);
/* The primary context of `device` (retained once per driver). */
AOTR_HIDDEN aotr_status aotr_cuda_primary_context(aotr_driver *d, int32_t device, drv_handle *ctx);
/* Make `device`'s primary context current (pushed when another one is). */
AOTR_HIDDEN aotr_status aotr_cuda_enter(aotr_driver *d, int32_t device, int *pushed);
AOTR_HIDDEN void aotr_cuda_leave(aotr_driver *d, int pushed);
AOTR_HIDDEN aotr_status aotr_cuda_load(aotr_driver *d, int32_t device, const void *image,
                                       size_t size, const char *symbol, uint32_t shared,
                                       void **function);
/* After CUDA_ERROR_INVALID_CONTEXT: 1 when the thread had no current
 * context and now has `device`'s primary context (retry the call). */
AOTR_HIDDEN int aotr_cuda_recover(aotr_driver *d, int32_t device);
/* The runtime's scratch pool of `device`, or NULL (the default pool). */
AOTR_HIDDEN drv_handle aotr_cuda_scratch_pool(aotr_driver *d, int32_t device);
AOTR_HIDDEN drv_result aotr_cuda_alloc_from(aotr_driver *d, drv_handle pool, uint64_t *ptr,
                                            size_t bytes, void *stream);
/* Destroy the scratch pools and release the primary contexts. */
AOTR_HIDDEN void aotr_cuda_release(aotr_driver *d);

/* driver_hip.c */
AOTR_HIDDEN const char *aotr_hip_hint(const char *function, drv_result code);
AOTR_HIDDEN aotr_status aotr_hip_load(aotr_driver *d, int32_t device, const void *image,
                                      size_t size, const char *symbol, void **function);

#endif /* AOTR_DRIVER_API_H */
