/* A fake CUDA driver and HIP runtime in one shared library, for testing
 * libaotriton_rocm without a GPU. It exports the subset of both APIs the
 * library uses, records module loads and launches, and offers query and
 * failure-injection functions (aotr_stub_*) that tests reach with dlsym.
 *
 * Behaviour
 * - cuInit / hipInit return 100 (no device) when AOTR_STUB_NO_DEVICE=1.
 * - AOTR_STUB_DEVICES (default 2) devices; AOTR_STUB_CUDA_ARCH=major.minor
 *   (default 9.0); AOTR_STUB_HIP_ARCH (default gfx942:sramecc+:xnack-);
 *   AOTR_STUB_CUDA_SHARED_OPTIN (default 232448) bytes per block;
 *   AOTR_STUB_COMPUTE_UNITS multiprocessors (default 132 CUDA, 304 HIP).
 * - CUDA keeps a per-thread context stack like the real driver: module
 *   loads need a current context (201 otherwise), launches need the
 *   function's context current (201 with none, 400 with another one), and
 *   cuModuleUnload needs the module's context.
 * - A code object's length comes from its ELF64 headers (the section and
 *   program header tables and the sections' extents), or from an "AOTRSTUB"
 *   header: 8 magic bytes then the total length as a little-endian uint64.
 *   Anything else is refused as an invalid image (200).
 * - Launches must pass kernelParams = NULL and the argument buffer through
 *   `extra` (CUDA: pairs ended by 0; HIP: ended by 3); else 1 (invalid value).
 * - Dynamic shared memory above 48 KiB needs cuFuncSetAttribute (CUDA).
 * - cuMemAllocAsync / cuMemFreeAsync hand out host memory and count the
 *   live allocations (aotr_stub_scratch); cuMemAllocFromPoolAsync too, from
 *   pools cuMemPoolCreate hands out (aotr_stub_pools: the live ones, the
 *   device and release threshold of the last); hipMallocAsync / hipFreeAsync
 *   likewise. With AOTR_STUB_KEEP_SCRATCH=1 a freed block is counted but
 *   left readable (tests read what a launch was given).
 * - cuMemsetD8Async, cuMemcpy2DAsync_v2, hipMemsetAsync, hipMemcpy2DAsync
 *   run at once on host memory (device addresses are host addresses here);
 *   the copies take host, device or unified addresses (CUDA: memory types
 *   1, 2, 4, with a current context; HIP: kinds 3 and 4).
 * - cuCtxGetDevice, cu/hipStreamIsCapturing, cu/hipStreamSynchronize:
 *   AOTR_STUB_CAPTURING=1 reports every stream as capturing.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STUB_API __attribute__((visibility("default")))

typedef int stub_result;

#define MAX_DEVICES 16
#define SYMBOL_CAPACITY 256
#define MAX_PENDING_FAILURES 32
#define CONTEXT_STACK 16

/* ------------------------------------------------------------ prototypes */

STUB_API stub_result cuInit(unsigned flags);
STUB_API stub_result cuGetErrorName(stub_result error, const char **str);
STUB_API stub_result cuGetErrorString(stub_result error, const char **str);
STUB_API stub_result cuDeviceGet(int *device, int ordinal);
STUB_API stub_result cuDeviceGetAttribute(int *value, int attribute, int device);
STUB_API stub_result cuDevicePrimaryCtxRetain(void **ctx, int device);
STUB_API stub_result cuDevicePrimaryCtxRelease_v2(int device);
STUB_API stub_result cuCtxGetCurrent(void **ctx);
STUB_API stub_result cuCtxSetCurrent(void *ctx);
STUB_API stub_result cuCtxPushCurrent_v2(void *ctx);
STUB_API stub_result cuCtxPopCurrent_v2(void **ctx);
STUB_API stub_result cuModuleLoadData(void **module, const void *image);
STUB_API stub_result cuModuleUnload(void *module);
STUB_API stub_result cuModuleGetFunction(void **function, void *module, const char *name);
STUB_API stub_result cuFuncSetAttribute(void *function, int attribute, int value);
STUB_API stub_result cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                    unsigned by, unsigned bz, unsigned shared, void *stream,
                                    void **kernel_params, void **extra);
STUB_API stub_result cuMemAllocAsync(unsigned long long *ptr, size_t bytes, void *stream);
STUB_API stub_result cuMemFreeAsync(unsigned long long ptr, void *stream);
STUB_API stub_result cuMemPoolCreate(void **pool, const void *props);
STUB_API stub_result cuMemPoolSetAttribute(void *pool, int attribute, void *value);
STUB_API stub_result cuMemPoolDestroy(void *pool);
STUB_API stub_result cuMemsetD8Async(unsigned long long ptr, unsigned char value, size_t n,
                                     void *stream);
STUB_API stub_result cuMemcpy2DAsync_v2(const void *copy, void *stream);
STUB_API stub_result hipMallocAsync(void **ptr, size_t bytes, void *stream);
STUB_API stub_result hipFreeAsync(void *ptr, void *stream);
STUB_API stub_result hipMemsetAsync(void *ptr, int value, size_t n, void *stream);
STUB_API stub_result hipMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                                      size_t width, size_t height, int kind, void *stream);
STUB_API stub_result cuMemAllocFromPoolAsync(unsigned long long *ptr, size_t bytes, void *pool,
                                             void *stream);

STUB_API stub_result hipInit(unsigned flags);
STUB_API const char *hipGetErrorName(stub_result error);
STUB_API const char *hipGetErrorString(stub_result error);
STUB_API stub_result hipGetDevice(int *device);
STUB_API stub_result hipSetDevice(int device);
STUB_API stub_result hipGetDevicePropertiesR0600(void *props, int device);
STUB_API stub_result hipDeviceGetAttribute(int *value, int attribute, int device);
STUB_API stub_result hipModuleLoadData(void **module, const void *image);
STUB_API stub_result hipModuleUnload(void *module);
STUB_API stub_result hipModuleGetFunction(void **function, void *module, const char *name);
STUB_API stub_result hipModuleLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz,
                                           unsigned bx, unsigned by, unsigned bz, unsigned shared,
                                           void *stream, void **kernel_params, void **extra);

STUB_API int aotr_stub_launch_count(void);
STUB_API int aotr_stub_scratch(size_t *last_bytes, void **last_stream);
STUB_API int aotr_stub_pools(int *last_device, unsigned long long *last_threshold);
STUB_API int aotr_stub_launch_info(int i, char *symbol, size_t cap, unsigned grid[3],
                                   unsigned *block_x, unsigned *shared, void **stream,
                                   size_t *args_size);
STUB_API size_t aotr_stub_launch_args(int i, void *buf, size_t cap);
STUB_API int aotr_stub_launch_where(int i, int *device, unsigned block[3]);
STUB_API int aotr_stub_load_count(void);
STUB_API int aotr_stub_load_info(int i, int *device, size_t *size, uint64_t *checksum, char *symbol,
                                 size_t cap, unsigned *shared);
STUB_API int aotr_stub_live_modules(void);
STUB_API int aotr_stub_calls(const char *function);
STUB_API void aotr_stub_reset(void);
STUB_API void aotr_stub_fail_next(const char *function, int code);
STUB_API int aotr_stub_cuda_current(void);
STUB_API void aotr_stub_cuda_set_current(int device);
STUB_API int aotr_stub_cuda_retains(int device);
STUB_API uint64_t aotr_stub_checksum(const void *data, size_t size);

/* ------------------------------------------------------------------ state */

enum backend { CUDA, HIP };

struct stub_module;

struct stub_context {
    int device; /* -2: the foreign context */
    int retains;
};

struct stub_function {
    struct stub_module *module;
    char symbol[SYMBOL_CAPACITY];
    unsigned shared_optin;
    struct stub_function *next;
};

struct stub_module {
    enum backend backend;
    int index; /* load sequence number */
    int device;
    struct stub_context *context; /* CUDA */
    struct stub_function *functions;
    struct stub_module *next;
};

struct load_record {
    int index, device;
    size_t size;
    uint64_t checksum;
    char symbol[SYMBOL_CAPACITY];
    unsigned shared;
};

struct launch_record {
    int module, device;
    char symbol[SYMBOL_CAPACITY];
    unsigned grid[3], block[3], shared;
    void *stream;
    unsigned char *args;
    size_t args_size;
};

struct call_count {
    char name[64];
    int count;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct stub_context contexts[MAX_DEVICES];
static struct stub_context foreign_context = {-2, 0};
static struct stub_module *modules;
static struct load_record *loads;
static size_t num_loads, loads_capacity, loads_base;
static struct launch_record *launches;
static size_t num_launches, launches_capacity;
static struct {
    char name[64];
    int code;
} pending[MAX_PENDING_FAILURES];
static size_t num_pending;
static struct call_count calls[64];
static size_t num_calls;
static int cuda_initialized, hip_initialized;

static _Thread_local struct stub_context *current_context;
static _Thread_local struct stub_context *context_stack[CONTEXT_STACK];
static _Thread_local int context_depth;
static _Thread_local int hip_device;

/* --------------------------------------------------------------- helpers */

static int env_int(const char *name, int fallback)
{
    const char *v = getenv(name);
    return v && v[0] ? atoi(v) : fallback;
}

static int device_count(void)
{
    int n = env_int("AOTR_STUB_DEVICES", 2);
    return n < 0 ? 0 : n > MAX_DEVICES ? MAX_DEVICES : n;
}

static int no_device(void) { return env_int("AOTR_STUB_NO_DEVICE", 0) != 0; }

/* Count the call and return the injected failure code for it, or 0. */
static stub_result enter(const char *function)
{
    stub_result code = 0;
    size_t i;
    pthread_mutex_lock(&lock);
    for (i = 0; i < num_calls; i++)
        if (strcmp(calls[i].name, function) == 0)
            break;
    if (i == num_calls && num_calls < sizeof calls / sizeof calls[0]) {
        snprintf(calls[i].name, sizeof calls[i].name, "%s", function);
        calls[i].count = 0;
        num_calls++;
    }
    if (i < num_calls)
        calls[i].count++;
    for (i = 0; i < num_pending; i++) {
        if (strcmp(pending[i].name, function) == 0) {
            code = pending[i].code;
            pending[i] = pending[--num_pending];
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    return code;
}

uint64_t aotr_stub_checksum(const void *data, size_t size)
{
    const unsigned char *p = data;
    uint64_t h = 14695981039346656037ull; /* FNV-1a 64 */
    for (size_t i = 0; i < size; i++) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    return h;
}

static uint64_t le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* The length of a code object, or 0 when it is neither ELF64 nor AOTRSTUB. */
static size_t image_size(const void *image)
{
    const unsigned char *p = image;
    uint64_t end, phoff, shoff, phentsize, phnum, shentsize, shnum;
    if (memcmp(p, "AOTRSTUB", 8) == 0) {
        end = le(p + 8, 8);
        return end >= 16 && end < (1ull << 32) ? (size_t)end : 0;
    }
    if (memcmp(p, "\177ELF", 4) != 0 || p[4] != 2 /* 64-bit */ || p[5] != 1 /* LE */)
        return 0;
    phoff = le(p + 32, 8);
    shoff = le(p + 40, 8);
    phentsize = le(p + 54, 2);
    phnum = le(p + 56, 2);
    shentsize = le(p + 58, 2);
    shnum = le(p + 60, 2);
    if (phoff >= (1ull << 32) || shoff >= (1ull << 32) || (shnum && shentsize < 64))
        return 0;
    end = 64;
    if (phnum && phoff + phnum * phentsize > end)
        end = phoff + phnum * phentsize;
    if (shnum && shoff + shnum * shentsize > end)
        end = shoff + shnum * shentsize;
    for (uint64_t i = 0; i < shnum; i++) {
        const unsigned char *sh = p + shoff + i * shentsize;
        uint64_t type = le(sh + 4, 4), offset = le(sh + 24, 8), size = le(sh + 32, 8);
        if (type != 8 /* SHT_NOBITS */ && type != 0 && offset + size > end)
            end = offset + size;
    }
    return end < (1ull << 32) ? (size_t)end : 0;
}

static int grow(void **array, size_t *capacity, size_t needed, size_t item)
{
    size_t n;
    void *grown;
    if (needed <= *capacity)
        return 1;
    n = *capacity ? *capacity * 2 : 64;
    while (n < needed)
        n *= 2;
    grown = realloc(*array, n * item);
    if (!grown)
        return 0;
    *array = grown;
    *capacity = n;
    return 1;
}

static stub_result load_module(enum backend backend, void **out, const void *image, int device,
                               struct stub_context *context)
{
    size_t size;
    struct stub_module *m;
    struct load_record *r;
    if (!out || !image)
        return 1;
    size = image_size(image);
    if (!size)
        return 200; /* invalid image */
    m = calloc(1, sizeof *m);
    if (!m)
        return 2;
    m->backend = backend;
    m->device = device;
    m->context = context;
    pthread_mutex_lock(&lock);
    if (!grow((void **)&loads, &loads_capacity, num_loads + 1, sizeof *loads)) {
        pthread_mutex_unlock(&lock);
        free(m);
        return 2;
    }
    m->index = (int)num_loads;
    r = &loads[num_loads++];
    memset(r, 0, sizeof *r);
    r->index = m->index;
    r->device = device;
    r->size = size;
    r->checksum = aotr_stub_checksum(image, size);
    m->next = modules;
    modules = m;
    pthread_mutex_unlock(&lock);
    *out = m;
    return 0;
}

/* Under the lock: the live module `handle` of `backend`, or NULL. */
static struct stub_module *find_module(void *handle, enum backend backend)
{
    for (struct stub_module *m = modules; m; m = m->next)
        if (m == handle && m->backend == backend)
            return m;
    return NULL;
}

static struct stub_function *find_function(void *handle, enum backend backend)
{
    for (struct stub_module *m = modules; m; m = m->next)
        if (m->backend == backend)
            for (struct stub_function *f = m->functions; f; f = f->next)
                if (f == handle)
                    return f;
    return NULL;
}

static stub_result unload_module(void *handle, enum backend backend)
{
    struct stub_module **link, *m;
    pthread_mutex_lock(&lock);
    m = find_module(handle, backend);
    if (!m) {
        pthread_mutex_unlock(&lock);
        return 400; /* invalid handle */
    }
    if (backend == CUDA && current_context != m->context) {
        pthread_mutex_unlock(&lock);
        return 201; /* invalid context */
    }
    for (link = &modules; *link != m; link = &(*link)->next)
        ;
    *link = m->next;
    pthread_mutex_unlock(&lock);
    while (m->functions) {
        struct stub_function *f = m->functions;
        m->functions = f->next;
        free(f);
    }
    free(m);
    return 0;
}

static stub_result get_function(void **out, void *handle, const char *name, enum backend backend)
{
    struct stub_module *m;
    struct stub_function *f;
    if (!out || !name)
        return 1;
    f = calloc(1, sizeof *f);
    if (!f)
        return 2;
    snprintf(f->symbol, sizeof f->symbol, "%s", name);
    pthread_mutex_lock(&lock);
    m = find_module(handle, backend);
    if (!m) {
        pthread_mutex_unlock(&lock);
        free(f);
        return 400;
    }
    f->module = m;
    f->next = m->functions;
    m->functions = f;
    if ((size_t)m->index >= loads_base)
        snprintf(loads[m->index].symbol, sizeof loads[m->index].symbol, "%s", name);
    pthread_mutex_unlock(&lock);
    *out = f;
    return 0;
}

/* Decode `extra`: 0 and the buffer on success, 1 when malformed. */
static stub_result decode_extra(void **kernel_params, void **extra, void *end, void **args,
                                size_t *size)
{
    int have_pointer = 0, have_size = 0;
    if (kernel_params || !extra)
        return 1;
    for (int i = 0; i < 8; i += 2) {
        if (extra[i] == end)
            return have_pointer && have_size ? 0 : 1;
        if (extra[i] == (void *)1) {
            *args = extra[i + 1];
            have_pointer = 1;
        } else if (extra[i] == (void *)2) {
            if (!extra[i + 1])
                return 1;
            memcpy(size, extra[i + 1], sizeof *size);
            have_size = 1;
        } else {
            return 1;
        }
    }
    return 1; /* no end marker among the first pairs */
}

static stub_result record_launch(enum backend backend, void *function, unsigned gx, unsigned gy,
                                 unsigned gz, unsigned bx, unsigned by, unsigned bz,
                                 unsigned shared, void *stream, void **kernel_params, void **extra)
{
    void *args = NULL;
    size_t size = 0;
    unsigned char *copy = NULL;
    struct stub_function *f;
    struct launch_record *r;
    stub_result rc =
        decode_extra(kernel_params, extra, backend == CUDA ? (void *)0 : (void *)3, &args, &size);
    if (rc)
        return rc;
    if (size && !args)
        return 1;
    if (!gx || !gy || !gz || !bx || !by || !bz || (size_t)bx * by * bz > 1024)
        return 1;
    if (backend == CUDA && !current_context)
        return 201;
    if (size) {
        copy = malloc(size);
        if (!copy)
            return 2;
        memcpy(copy, args, size);
    }
    pthread_mutex_lock(&lock);
    f = find_function(function, backend);
    if (!f) {
        rc = 400;
    } else if (backend == CUDA && f->module->context != current_context) {
        rc = 400; /* a function of another context */
    } else if (backend == CUDA && shared > 49152 && shared > f->shared_optin) {
        rc = 1;
    } else if (!grow((void **)&launches, &launches_capacity, num_launches + 1, sizeof *launches)) {
        rc = 2;
    }
    if (rc) {
        pthread_mutex_unlock(&lock);
        free(copy);
        return rc;
    }
    r = &launches[num_launches++];
    r->module = f->module->index;
    r->device = backend == CUDA ? current_context->device : hip_device;
    snprintf(r->symbol, sizeof r->symbol, "%s", f->symbol);
    r->grid[0] = gx;
    r->grid[1] = gy;
    r->grid[2] = gz;
    r->block[0] = bx;
    r->block[1] = by;
    r->block[2] = bz;
    r->shared = shared;
    r->stream = stream;
    r->args = copy;
    r->args_size = size;
    pthread_mutex_unlock(&lock);
    return 0;
}

/* ------------------------------------------------------------------- CUDA */

static const struct {
    int code;
    const char *name, *text;
} cuda_errors[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {200, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {209, "CUDA_ERROR_NO_BINARY_FOR_GPU",
     "no kernel image is available for execution on the "
     "device"},
    {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
    {719, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
};

stub_result cuGetErrorName(stub_result error, const char **str)
{
    for (size_t i = 0; i < sizeof cuda_errors / sizeof cuda_errors[0]; i++)
        if (cuda_errors[i].code == error) {
            *str = cuda_errors[i].name;
            return 0;
        }
    *str = NULL;
    return 1;
}

stub_result cuGetErrorString(stub_result error, const char **str)
{
    for (size_t i = 0; i < sizeof cuda_errors / sizeof cuda_errors[0]; i++)
        if (cuda_errors[i].code == error) {
            *str = cuda_errors[i].text;
            return 0;
        }
    *str = NULL;
    return 1;
}

stub_result cuInit(unsigned flags)
{
    stub_result rc = enter("cuInit");
    if (rc)
        return rc;
    if (flags != 0)
        return 1;
    if (no_device())
        return 100;
    pthread_mutex_lock(&lock);
    cuda_initialized = 1;
    pthread_mutex_unlock(&lock);
    return 0;
}

static stub_result cuda_enter(const char *function)
{
    stub_result rc = enter(function);
    int initialized;
    if (rc)
        return rc;
    pthread_mutex_lock(&lock);
    initialized = cuda_initialized;
    pthread_mutex_unlock(&lock);
    return initialized ? 0 : 3;
}

stub_result cuDeviceGet(int *device, int ordinal)
{
    stub_result rc = cuda_enter("cuDeviceGet");
    if (rc)
        return rc;
    if (!device)
        return 1;
    if (ordinal < 0 || ordinal >= device_count())
        return 101;
    *device = ordinal;
    return 0;
}

stub_result cuDeviceGetAttribute(int *value, int attribute, int device)
{
    stub_result rc = cuda_enter("cuDeviceGetAttribute");
    const char *arch;
    int major = 9, minor = 0;
    if (rc)
        return rc;
    if (!value)
        return 1;
    if (device < 0 || device >= device_count())
        return 101;
    arch = getenv("AOTR_STUB_CUDA_ARCH");
    if (arch && sscanf(arch, "%d.%d", &major, &minor) != 2)
        return 1;
    switch (attribute) {
    case 75: *value = major; return 0;
    case 76: *value = minor; return 0;
    case 97: *value = env_int("AOTR_STUB_CUDA_SHARED_OPTIN", 232448); return 0;
    case 16: *value = env_int("AOTR_STUB_COMPUTE_UNITS", 132); return 0;
    default: return 1;
    }
}

stub_result cuDevicePrimaryCtxRetain(void **ctx, int device)
{
    stub_result rc = cuda_enter("cuDevicePrimaryCtxRetain");
    if (rc)
        return rc;
    if (!ctx)
        return 1;
    if (device < 0 || device >= device_count())
        return 101;
    pthread_mutex_lock(&lock);
    contexts[device].device = device;
    contexts[device].retains++;
    pthread_mutex_unlock(&lock);
    *ctx = &contexts[device];
    return 0;
}

stub_result cuDevicePrimaryCtxRelease_v2(int device)
{
    stub_result rc = cuda_enter("cuDevicePrimaryCtxRelease_v2");
    if (rc)
        return rc;
    if (device < 0 || device >= device_count())
        return 101;
    pthread_mutex_lock(&lock);
    if (contexts[device].retains > 0)
        contexts[device].retains--;
    else
        rc = 201;
    pthread_mutex_unlock(&lock);
    return rc;
}

stub_result cuCtxGetCurrent(void **ctx)
{
    stub_result rc = cuda_enter("cuCtxGetCurrent");
    if (rc)
        return rc;
    if (!ctx)
        return 1;
    *ctx = current_context;
    return 0;
}

static int valid_context(const void *ctx)
{
    const struct stub_context *c = ctx;
    return c == &foreign_context || (c >= contexts && c < contexts + MAX_DEVICES);
}

stub_result cuCtxSetCurrent(void *ctx)
{
    stub_result rc = cuda_enter("cuCtxSetCurrent");
    if (rc)
        return rc;
    if (ctx && !valid_context(ctx))
        return 201;
    current_context = ctx;
    return 0;
}

stub_result cuCtxPushCurrent_v2(void *ctx)
{
    stub_result rc = cuda_enter("cuCtxPushCurrent_v2");
    if (rc)
        return rc;
    if (!ctx || !valid_context(ctx))
        return 201;
    if (context_depth == CONTEXT_STACK)
        return 2;
    context_stack[context_depth++] = current_context;
    current_context = ctx;
    return 0;
}

stub_result cuCtxPopCurrent_v2(void **ctx)
{
    stub_result rc = cuda_enter("cuCtxPopCurrent_v2");
    if (rc)
        return rc;
    if (!current_context)
        return 201;
    if (ctx)
        *ctx = current_context;
    current_context = context_depth ? context_stack[--context_depth] : NULL;
    return 0;
}

stub_result cuModuleLoadData(void **module, const void *image)
{
    stub_result rc = cuda_enter("cuModuleLoadData");
    if (rc)
        return rc;
    if (!current_context)
        return 201;
    return load_module(CUDA, module, image, current_context->device, current_context);
}

stub_result cuModuleUnload(void *module)
{
    stub_result rc = cuda_enter("cuModuleUnload");
    return rc ? rc : unload_module(module, CUDA);
}

stub_result cuModuleGetFunction(void **function, void *module, const char *name)
{
    stub_result rc = cuda_enter("cuModuleGetFunction");
    return rc ? rc : get_function(function, module, name, CUDA);
}

stub_result cuFuncSetAttribute(void *function, int attribute, int value)
{
    stub_result rc = cuda_enter("cuFuncSetAttribute");
    struct stub_function *f;
    if (rc)
        return rc;
    if (attribute != 8 /* MAX_DYNAMIC_SHARED_SIZE_BYTES */ || value < 0 ||
        value > env_int("AOTR_STUB_CUDA_SHARED_OPTIN", 232448))
        return 1;
    pthread_mutex_lock(&lock);
    f = find_function(function, CUDA);
    if (f) {
        f->shared_optin = (unsigned)value;
        if ((size_t)f->module->index >= loads_base)
            loads[f->module->index].shared = (unsigned)value;
    }
    pthread_mutex_unlock(&lock);
    return f ? 0 : 400;
}

stub_result cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                           unsigned bz, unsigned shared, void *stream, void **kernel_params,
                           void **extra)
{
    stub_result rc = cuda_enter("cuLaunchKernel");
    if (rc)
        return rc;
    return record_launch(CUDA, f, gx, gy, gz, bx, by, bz, shared, stream, kernel_params, extra);
}

/* Stream-ordered allocations (cuMemAllocAsync): host memory here, counted
 * so that tests see every allocation freed. */
static int scratch_live;
static size_t scratch_last_bytes;
static void *scratch_last_stream;

static stub_result stub_alloc(unsigned long long *ptr, size_t bytes, void *stream)
{
    void *p;
    if (!ptr || bytes == 0)
        return 1;
    if (!(p = malloc(bytes)))
        return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
    pthread_mutex_lock(&lock);
    scratch_live++;
    scratch_last_bytes = bytes;
    scratch_last_stream = stream;
    pthread_mutex_unlock(&lock);
    *ptr = (unsigned long long)(uintptr_t)p;
    return 0;
}

stub_result cuMemAllocAsync(unsigned long long *ptr, size_t bytes, void *stream)
{
    stub_result rc = cuda_enter("cuMemAllocAsync");
    return rc ? rc : stub_alloc(ptr, bytes, stream);
}

static stub_result stub_free(void *p)
{
    if (!p)
        return 1;
    if (!env_int("AOTR_STUB_KEEP_SCRATCH", 0))
        free(p);
    pthread_mutex_lock(&lock);
    scratch_live--;
    pthread_mutex_unlock(&lock);
    return 0;
}

stub_result cuMemFreeAsync(unsigned long long ptr, void *stream)
{
    stub_result rc = cuda_enter("cuMemFreeAsync");
    (void)stream;
    return rc ? rc : stub_free((void *)(uintptr_t)ptr);
}

/* 2D copies: rows of `width` bytes, `pitch` bytes apart (pitch >= width, as
 * both real APIs require). */
static stub_result copy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                           size_t height)
{
    if (!dst || !src || dpitch < width || spitch < width)
        return 1;
    for (size_t r = 0; r < height; r++)
        memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    return 0;
}

stub_result cuMemsetD8Async(unsigned long long ptr, unsigned char value, size_t n, void *stream)
{
    stub_result rc = cuda_enter("cuMemsetD8Async");
    (void)stream;
    if (rc)
        return rc;
    if (!ptr)
        return 1;
    memset((void *)(uintptr_t)ptr, value, n);
    return 0;
}

/* CUDA_MEMCPY2D */
struct stub_memcpy2d {
    size_t src_x, src_y;
    int src_type;
    const void *src_host;
    unsigned long long src_device;
    void *src_array;
    size_t src_pitch;
    size_t dst_x, dst_y;
    int dst_type;
    void *dst_host;
    unsigned long long dst_device;
    void *dst_array;
    size_t dst_pitch;
    size_t width, height;
};

/* CU_MEMORYTYPE_HOST 1, _DEVICE 2, _UNIFIED 4 (arrays: 3, refused) */
static int known_memory_type(int type) { return type == 1 || type == 2 || type == 4; }

stub_result cuMemcpy2DAsync_v2(const void *copy, void *stream)
{
    stub_result rc = cuda_enter("cuMemcpy2DAsync_v2");
    const struct stub_memcpy2d *c = copy;
    (void)stream;
    if (rc)
        return rc;
    if (!current_context)
        return 201; /* CUDA_ERROR_INVALID_CONTEXT */
    if (!c || !known_memory_type(c->src_type) || !known_memory_type(c->dst_type) || c->src_x ||
        c->src_y || c->dst_x || c->dst_y)
        return 1; /* host, device or unified addresses, no offsets */
    return copy_2d(c->dst_type == 1 ? c->dst_host : (void *)(uintptr_t)c->dst_device, c->dst_pitch,
                   c->src_type == 1 ? c->src_host : (const void *)(uintptr_t)c->src_device,
                   c->src_pitch, c->width, c->height);
}

/* Memory pools: a handle per pool; the location and release threshold of
 * the last one created / set. */
static int pools_live;
static int pool_last_device = -1;
static unsigned long long pool_last_threshold;

stub_result cuMemPoolCreate(void **pool, const void *props)
{
    stub_result rc = cuda_enter("cuMemPoolCreate");
    const int *p = props; /* alloc type, handle types, location type, location id */
    if (rc)
        return rc;
    if (!pool || !p || p[0] != 1 || p[2] != 1 || p[3] < 0 || p[3] >= device_count())
        return 1;
    if (!(*pool = malloc(1)))
        return 2;
    pthread_mutex_lock(&lock);
    pools_live++;
    pool_last_device = p[3];
    pthread_mutex_unlock(&lock);
    return 0;
}

stub_result cuMemPoolSetAttribute(void *pool, int attribute, void *value)
{
    stub_result rc = cuda_enter("cuMemPoolSetAttribute");
    if (rc)
        return rc;
    if (!pool || !value || attribute != 4) /* CU_MEMPOOL_ATTR_RELEASE_THRESHOLD only */
        return 1;
    pthread_mutex_lock(&lock);
    pool_last_threshold = *(const unsigned long long *)value;
    pthread_mutex_unlock(&lock);
    return 0;
}

stub_result cuMemPoolDestroy(void *pool)
{
    stub_result rc = enter("cuMemPoolDestroy");
    if (rc)
        return rc;
    if (!pool)
        return 1;
    free(pool);
    pthread_mutex_lock(&lock);
    pools_live--;
    pthread_mutex_unlock(&lock);
    return 0;
}

stub_result cuMemAllocFromPoolAsync(unsigned long long *ptr, size_t bytes, void *pool, void *stream)
{
    stub_result rc = cuda_enter("cuMemAllocFromPoolAsync");
    if (rc)
        return rc;
    if (!pool)
        return 1;
    return stub_alloc(ptr, bytes, stream);
}

int aotr_stub_pools(int *last_device, unsigned long long *last_threshold)
{
    int n;
    pthread_mutex_lock(&lock);
    n = pools_live;
    if (last_device)
        *last_device = pool_last_device;
    if (last_threshold)
        *last_threshold = pool_last_threshold;
    pthread_mutex_unlock(&lock);
    return n;
}

/* Live scratch allocations; the size and stream of the last one. */
int aotr_stub_scratch(size_t *last_bytes, void **last_stream)
{
    int n;
    pthread_mutex_lock(&lock);
    n = scratch_live;
    if (last_bytes)
        *last_bytes = scratch_last_bytes;
    if (last_stream)
        *last_stream = scratch_last_stream;
    pthread_mutex_unlock(&lock);
    return n;
}

/* -------------------------------------------------------------------- HIP */

static const struct {
    int code;
    const char *name, *text;
} hip_errors[] = {
    {0, "hipSuccess", "no error"},
    {1, "hipErrorInvalidValue", "invalid argument"},
    {2, "hipErrorOutOfMemory", "out of memory"},
    {3, "hipErrorNotInitialized", "initialization error"},
    {98, "hipErrorInvalidDeviceFunction", "invalid device function"},
    {100, "hipErrorNoDevice", "no ROCm-capable device is detected"},
    {101, "hipErrorInvalidDevice", "invalid device ordinal"},
    {200, "hipErrorInvalidImage", "device kernel image is invalid"},
    {209, "hipErrorNoBinaryForGpu",
     "no kernel image is available for execution on the "
     "device"},
    {303, "hipErrorSharedObjectInitFailed", "shared object initialization failed"},
    {400, "hipErrorInvalidHandle", "invalid resource handle"},
    {500, "hipErrorNotFound", "named symbol not found"},
    {700, "hipErrorIllegalAddress", "an illegal memory access was encountered"},
    {701, "hipErrorLaunchOutOfResources", "too many resources requested for launch"},
    {719, "hipErrorLaunchFailure", "unspecified launch failure"},
};

const char *hipGetErrorName(stub_result error)
{
    for (size_t i = 0; i < sizeof hip_errors / sizeof hip_errors[0]; i++)
        if (hip_errors[i].code == error)
            return hip_errors[i].name;
    return "hipErrorUnknown";
}

const char *hipGetErrorString(stub_result error)
{
    for (size_t i = 0; i < sizeof hip_errors / sizeof hip_errors[0]; i++)
        if (hip_errors[i].code == error)
            return hip_errors[i].text;
    return "unknown error";
}

stub_result hipInit(unsigned flags)
{
    stub_result rc = enter("hipInit");
    if (rc)
        return rc;
    if (flags != 0)
        return 1;
    if (no_device())
        return 100;
    pthread_mutex_lock(&lock);
    hip_initialized = 1;
    pthread_mutex_unlock(&lock);
    return 0;
}

static stub_result hip_enter(const char *function)
{
    stub_result rc = enter(function);
    int initialized;
    if (rc)
        return rc;
    pthread_mutex_lock(&lock);
    initialized = hip_initialized;
    pthread_mutex_unlock(&lock);
    return initialized ? 0 : 3;
}

stub_result hipMallocAsync(void **ptr, size_t bytes, void *stream)
{
    stub_result rc = hip_enter("hipMallocAsync");
    unsigned long long p = 0;
    if (rc)
        return rc;
    if (!ptr)
        return 1;
    rc = stub_alloc(&p, bytes, stream);
    *ptr = (void *)(uintptr_t)p;
    return rc;
}

stub_result hipFreeAsync(void *ptr, void *stream)
{
    stub_result rc = hip_enter("hipFreeAsync");
    (void)stream;
    return rc ? rc : stub_free(ptr);
}

stub_result hipMemsetAsync(void *ptr, int value, size_t n, void *stream)
{
    stub_result rc = hip_enter("hipMemsetAsync");
    (void)stream;
    if (rc)
        return rc;
    if (!ptr)
        return 1;
    memset(ptr, value, n);
    return 0;
}

stub_result hipMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                             size_t height, int kind, void *stream)
{
    stub_result rc = hip_enter("hipMemcpy2DAsync");
    (void)stream;
    if (rc)
        return rc;
    if (kind != 3 && kind != 4) /* hipMemcpyDeviceToDevice, hipMemcpyDefault */
        return 1;
    return copy_2d(dst, dpitch, src, spitch, width, height);
}

stub_result hipGetDevice(int *device)
{
    stub_result rc = hip_enter("hipGetDevice");
    if (rc)
        return rc;
    if (!device)
        return 1;
    *device = hip_device;
    return 0;
}

stub_result hipSetDevice(int device)
{
    stub_result rc = hip_enter("hipSetDevice");
    if (rc)
        return rc;
    if (device < 0 || device >= device_count())
        return 101;
    hip_device = device;
    return 0;
}

/* hipDeviceProp_tR0600 (ROCm 6/7): 1472 bytes, name at 0, gcnArchName at 1160. */
stub_result hipGetDevicePropertiesR0600(void *props, int device)
{
    stub_result rc = hip_enter("hipGetDevicePropertiesR0600");
    const char *arch = getenv("AOTR_STUB_HIP_ARCH");
    char *p = props;
    if (rc)
        return rc;
    if (!props)
        return 1;
    if (device < 0 || device >= device_count())
        return 101;
    memset(p, 0, 1472);
    snprintf(p, 256, "AOTR stub GPU %d", device);
    snprintf(p + 1160, 256, "%s", arch && arch[0] ? arch : "gfx942:sramecc+:xnack-");
    return 0;
}

/* hipDeviceAttributeMultiprocessorCount (63) only. */
stub_result hipDeviceGetAttribute(int *value, int attribute, int device)
{
    stub_result rc = hip_enter("hipDeviceGetAttribute");
    if (rc)
        return rc;
    if (!value)
        return 1;
    if (device < 0 || device >= device_count())
        return 101;
    if (attribute != 63)
        return 1;
    *value = env_int("AOTR_STUB_COMPUTE_UNITS", 304);
    return 0;
}

stub_result hipModuleLoadData(void **module, const void *image)
{
    stub_result rc = hip_enter("hipModuleLoadData");
    return rc ? rc : load_module(HIP, module, image, hip_device, NULL);
}

stub_result hipModuleUnload(void *module)
{
    stub_result rc = hip_enter("hipModuleUnload");
    return rc ? rc : unload_module(module, HIP);
}

stub_result hipModuleGetFunction(void **function, void *module, const char *name)
{
    stub_result rc = hip_enter("hipModuleGetFunction");
    return rc ? rc : get_function(function, module, name, HIP);
}

stub_result hipModuleLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                  unsigned by, unsigned bz, unsigned shared, void *stream,
                                  void **kernel_params, void **extra)
{
    stub_result rc = hip_enter("hipModuleLaunchKernel");
    if (rc)
        return rc;
    return record_launch(HIP, f, gx, gy, gz, bx, by, bz, shared, stream, kernel_params, extra);
}

/* ---------------------------------------------------------------- queries */

int aotr_stub_launch_count(void)
{
    int n;
    pthread_mutex_lock(&lock);
    n = (int)num_launches;
    pthread_mutex_unlock(&lock);
    return n;
}

int aotr_stub_launch_info(int i, char *symbol, size_t cap, unsigned grid[3], unsigned *block_x,
                          unsigned *shared, void **stream, size_t *args_size)
{
    const struct launch_record *r;
    int module;
    pthread_mutex_lock(&lock);
    if (i < 0 || (size_t)i >= num_launches) {
        pthread_mutex_unlock(&lock);
        return -1;
    }
    r = &launches[i];
    if (symbol && cap)
        snprintf(symbol, cap, "%s", r->symbol);
    if (grid)
        memcpy(grid, r->grid, sizeof r->grid);
    if (block_x)
        *block_x = r->block[0];
    if (shared)
        *shared = r->shared;
    if (stream)
        *stream = r->stream;
    if (args_size)
        *args_size = r->args_size;
    module = r->module;
    pthread_mutex_unlock(&lock);
    return module;
}

size_t aotr_stub_launch_args(int i, void *buf, size_t cap)
{
    size_t n = 0;
    pthread_mutex_lock(&lock);
    if (i >= 0 && (size_t)i < num_launches) {
        n = launches[i].args_size;
        if (buf && n)
            memcpy(buf, launches[i].args, n < cap ? n : cap);
    }
    pthread_mutex_unlock(&lock);
    return n;
}

int aotr_stub_launch_where(int i, int *device, unsigned block[3])
{
    int ok = 0;
    pthread_mutex_lock(&lock);
    if (i >= 0 && (size_t)i < num_launches) {
        if (device)
            *device = launches[i].device;
        if (block)
            memcpy(block, launches[i].block, sizeof launches[i].block);
        ok = 1;
    }
    pthread_mutex_unlock(&lock);
    return ok ? 0 : -1;
}

int aotr_stub_load_count(void)
{
    int n;
    pthread_mutex_lock(&lock);
    n = (int)(num_loads - loads_base);
    pthread_mutex_unlock(&lock);
    return n;
}

int aotr_stub_load_info(int i, int *device, size_t *size, uint64_t *checksum, char *symbol,
                        size_t cap, unsigned *shared)
{
    const struct load_record *r;
    int index;
    pthread_mutex_lock(&lock);
    if (i < 0 || (size_t)i >= num_loads - loads_base) {
        pthread_mutex_unlock(&lock);
        return -1;
    }
    r = &loads[loads_base + (size_t)i];
    if (device)
        *device = r->device;
    if (size)
        *size = r->size;
    if (checksum)
        *checksum = r->checksum;
    if (symbol && cap)
        snprintf(symbol, cap, "%s", r->symbol);
    if (shared)
        *shared = r->shared;
    index = r->index;
    pthread_mutex_unlock(&lock);
    return index;
}

int aotr_stub_live_modules(void)
{
    int n = 0;
    pthread_mutex_lock(&lock);
    for (struct stub_module *m = modules; m; m = m->next)
        n++;
    pthread_mutex_unlock(&lock);
    return n;
}

int aotr_stub_calls(const char *function)
{
    int n = 0;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < num_calls; i++)
        if (strcmp(calls[i].name, function) == 0)
            n = calls[i].count;
    pthread_mutex_unlock(&lock);
    return n;
}

/* Forget launches, call counts, pending failures and the load log (live
 * modules stay loaded and keep their indices). */
void aotr_stub_reset(void)
{
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < num_launches; i++)
        free(launches[i].args);
    free(launches);
    launches = NULL;
    num_launches = launches_capacity = 0;
    loads_base = num_loads;
    num_pending = 0;
    num_calls = 0;
    pthread_mutex_unlock(&lock);
}

void aotr_stub_fail_next(const char *function, int code)
{
    pthread_mutex_lock(&lock);
    if (num_pending < MAX_PENDING_FAILURES) {
        snprintf(pending[num_pending].name, sizeof pending[num_pending].name, "%s", function);
        pending[num_pending].code = code;
        num_pending++;
    }
    pthread_mutex_unlock(&lock);
}

/* This thread's current CUDA context: its device, -1 for none, -2 for the
 * foreign context. */
int aotr_stub_cuda_current(void) { return current_context ? current_context->device : -1; }

/* Make a context current on this thread (replacing the top of its stack):
 * -1 none, -2 a foreign context (not a primary one), else the primary
 * context of that device. */
void aotr_stub_cuda_set_current(int device)
{
    if (device == -2) {
        current_context = &foreign_context;
    } else if (device >= 0 && device < MAX_DEVICES) {
        pthread_mutex_lock(&lock);
        contexts[device].device = device;
        pthread_mutex_unlock(&lock);
        current_context = &contexts[device];
    } else {
        current_context = NULL;
    }
}

int aotr_stub_cuda_retains(int device)
{
    int n;
    if (device < 0 || device >= MAX_DEVICES)
        return -1;
    pthread_mutex_lock(&lock);
    n = contexts[device].retains;
    pthread_mutex_unlock(&lock);
    return n;
}

/* ------------------------------------------- current device, capture */

STUB_API stub_result cuCtxGetDevice(int *device);
STUB_API stub_result cuStreamIsCapturing(void *stream, int *status);
STUB_API stub_result cuStreamSynchronize(void *stream);
STUB_API stub_result hipStreamIsCapturing(void *stream, int *status);
STUB_API stub_result hipStreamSynchronize(void *stream);

stub_result cuCtxGetDevice(int *device)
{
    stub_result rc = cuda_enter("cuCtxGetDevice");
    if (rc)
        return rc;
    if (!current_context)
        return 201;
    *device = current_context->device < 0 ? 0 : current_context->device;
    return 0;
}

stub_result cuStreamIsCapturing(void *stream, int *status)
{
    stub_result rc = cuda_enter("cuStreamIsCapturing");
    (void)stream;
    if (rc)
        return rc;
    *status = env_int("AOTR_STUB_CAPTURING", 0) ? 1 : 0;
    return 0;
}

stub_result cuStreamSynchronize(void *stream)
{
    (void)stream;
    return cuda_enter("cuStreamSynchronize");
}

stub_result hipStreamIsCapturing(void *stream, int *status)
{
    stub_result rc = hip_enter("hipStreamIsCapturing");
    (void)stream;
    if (rc)
        return rc;
    *status = env_int("AOTR_STUB_CAPTURING", 0) ? 1 : 0;
    return 0;
}

stub_result hipStreamSynchronize(void *stream)
{
    (void)stream;
    return hip_enter("hipStreamSynchronize");
}

/* Free the records when the stub is unloaded (the leak checkers would see
 * them orphaned once its globals are unmapped). */
__attribute__((destructor)) static void stub_unload(void)
{
    aotr_stub_reset();
    free(loads);
    loads = NULL;
    num_loads = loads_capacity = loads_base = 0;
    while (modules) {
        struct stub_module *m = modules;
        modules = m->next;
        while (m->functions) {
            struct stub_function *f = m->functions;
            m->functions = f->next;
            free(f);
        }
        free(m);
    }
}
