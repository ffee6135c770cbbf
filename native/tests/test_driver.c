/* driver.c, driver_open.c and driver_memory.c against the stub driver
 * (AOTR_STUB_DRIVER): opening, device arch, loads and launches, error
 * messages, the CUDA context handling, and concurrent loads and launches;
 * for both backends. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

#ifndef AOTR_STUB_DRIVER
#error "AOTR_STUB_DRIVER must name the stub driver library"
#endif

static int failures;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);               \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

#define CHECK_OK(expr)                                                                             \
    do {                                                                                           \
        aotr_status st_ = (expr);                                                                  \
        if (st_ != AOTR_OK) {                                                                      \
            fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #expr,                    \
                    aotr_status_name(st_), aotr_last_error());                                     \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

/* `got` must be `want` and the message must contain every string given
 * (NULL-terminated list). */
static void expect_(const char *file, int line, aotr_status got, aotr_status want, ...)
{
    va_list ap;
    const char *s;
    const char *message = aotr_last_error();
    if (got != want) {
        fprintf(stderr, "%s:%d: status %s, expected %s (message: %s)\n", file, line,
                aotr_status_name(got), aotr_status_name(want), message);
        failures++;
    }
    va_start(ap, want);
    while ((s = va_arg(ap, const char *)) != NULL) {
        if (!strstr(message, s)) {
            fprintf(stderr, "%s:%d: message lacks \"%s\": %s\n", file, line, s, message);
            failures++;
        }
    }
    va_end(ap);
}
#define EXPECT(got, want, ...) expect_(__FILE__, __LINE__, (got), (want), __VA_ARGS__, NULL)

/* ------------------------------------------------------------ the stub */

struct stub {
    void *lib;
    int (*launch_count)(void);
    int (*launch_info)(int, char *, size_t, unsigned[3], unsigned *, unsigned *, void **, size_t *);
    size_t (*launch_args)(int, void *, size_t);
    int (*launch_where)(int, int *, unsigned[3]);
    int (*load_count)(void);
    int (*load_info)(int, int *, size_t *, uint64_t *, char *, size_t, unsigned *);
    int (*live_modules)(void);
    int (*calls)(const char *);
    void (*reset)(void);
    void (*fail_next)(const char *, int);
    int (*cuda_current)(void);
    void (*cuda_set_current)(int);
    int (*cuda_retains)(int);
    int (*hip_set_device)(int);
    int (*hip_get_device)(int *);
};

static void bind_(void *lib, const char *name, void *field, size_t size)
{
    void *p = dlsym(lib, name);
    if (!p) {
        fprintf(stderr, "the stub has no %s\n", name);
        exit(1);
    }
    memcpy(field, &p, size);
}
#define BIND(s, field, name) bind_((s)->lib, name, &(s)->field, sizeof(s)->field)

/* The stub instance at `path`, which must already be loaded. */
static void stub_bind(struct stub *s, const char *path)
{
    s->lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (!s->lib) {
        fprintf(stderr, "%s is not loaded: %s\n", path, dlerror());
        exit(1);
    }
    BIND(s, launch_count, "aotr_stub_launch_count");
    BIND(s, launch_info, "aotr_stub_launch_info");
    BIND(s, launch_args, "aotr_stub_launch_args");
    BIND(s, launch_where, "aotr_stub_launch_where");
    BIND(s, load_count, "aotr_stub_load_count");
    BIND(s, load_info, "aotr_stub_load_info");
    BIND(s, live_modules, "aotr_stub_live_modules");
    BIND(s, calls, "aotr_stub_calls");
    BIND(s, reset, "aotr_stub_reset");
    BIND(s, fail_next, "aotr_stub_fail_next");
    BIND(s, cuda_current, "aotr_stub_cuda_current");
    BIND(s, cuda_set_current, "aotr_stub_cuda_set_current");
    BIND(s, cuda_retains, "aotr_stub_cuda_retains");
    BIND(s, hip_set_device, "hipSetDevice");
    BIND(s, hip_get_device, "hipGetDevice");
}

static struct stub stub;

/* ------------------------------------------------------------ helpers */

static uint64_t fnv1a(const void *data, size_t size)
{
    const unsigned char *p = data;
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < size; i++) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    return h;
}

static void put(unsigned char *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* A minimal ELF64 image: header, `payload` bytes, a null and a PROGBITS
 * section header. Returns its size (the buffer must hold payload + 192). */
static size_t make_elf(unsigned char *buf, size_t payload, unsigned seed)
{
    size_t shoff = 64 + payload;
    memset(buf, 0, shoff + 128);
    memcpy(buf, "\177ELF", 4);
    buf[4] = 2; /* ELFCLASS64 */
    buf[5] = 1; /* little endian */
    buf[6] = 1;
    put(buf + 16, 2, 2);     /* ET_EXEC */
    put(buf + 40, shoff, 8); /* e_shoff */
    put(buf + 52, 64, 2);    /* e_ehsize */
    put(buf + 58, 64, 2);    /* e_shentsize */
    put(buf + 60, 2, 2);     /* e_shnum */
    for (size_t i = 0; i < payload; i++)
        buf[64 + i] = (unsigned char)(seed * 31u + i * 7u);
    put(buf + shoff + 64 + 4, 1, 4);        /* SHT_PROGBITS */
    put(buf + shoff + 64 + 24, 64, 8);      /* sh_offset */
    put(buf + shoff + 64 + 32, payload, 8); /* sh_size */
    return shoff + 128;
}

/* Packed arguments of a kernel (void *q, int32_t n, float scale, int64_t x):
 * natural alignment, 24 bytes. */
static size_t pack_args(unsigned char *buf, void *q, int32_t n, float scale, int64_t x)
{
    memset(buf, 0, 24);
    memcpy(buf, &q, 8);
    memcpy(buf + 8, &n, 4);
    memcpy(buf + 12, &scale, 4);
    memcpy(buf + 16, &x, 8);
    return 24;
}

static const char *backend_name(aotr_backend b) { return b == AOTR_BACKEND_CUDA ? "cuda" : "hip"; }

static aotr_driver *open_stub(aotr_backend backend)
{
    aotr_driver *d = NULL;
    aotr_status st = aotr_driver_open(backend, AOTR_STUB_DRIVER, &d);
    if (st != AOTR_OK) {
        fprintf(stderr, "cannot open the stub as %s: %s\n", backend_name(backend),
                aotr_last_error());
        exit(1);
    }
    return d;
}

/* ------------------------------------------------------------- tests */

static void test_open_errors(void)
{
    aotr_driver *d = (aotr_driver *)1;
    EXPECT(aotr_driver_open(AOTR_BACKEND_CUDA, "/nonexistent/libcuda.so.1", &d),
           AOTR_DRIVER_UNAVAILABLE, "/nonexistent/libcuda.so.1", "install the NVIDIA driver");
    CHECK(d == NULL);
    EXPECT(aotr_driver_open(AOTR_BACKEND_HIP, "/nonexistent/libamdhip64.so", &d),
           AOTR_DRIVER_UNAVAILABLE, "the HIP runtime", "install ROCm");
    EXPECT(aotr_driver_open(AOTR_BACKEND_CUDA, "libm.so.6", &d), AOTR_DRIVER_UNAVAILABLE,
           "libm.so.6 has no function cuInit");
    EXPECT(aotr_driver_open(AOTR_BACKEND_HIP, "libm.so.6", &d), AOTR_DRIVER_UNAVAILABLE,
           "libm.so.6 has no function hipInit");
    EXPECT(aotr_driver_open(AOTR_BACKEND_AUTO, AOTR_STUB_DRIVER, &d), AOTR_INVALID_ARGUMENT,
           "backend 0");
    EXPECT(aotr_driver_open(AOTR_BACKEND_CUDA, AOTR_STUB_DRIVER, NULL), AOTR_INVALID_ARGUMENT,
           "out is NULL");

    /* No driver in the process or on the system (the usual CPU machine). */
    {
        void *real = dlopen("libcuda.so.1", RTLD_NOW);
        if (real) {
            dlclose(real);
            printf("  (libcuda.so.1 exists here: default-soname failure not checked)\n");
        } else {
            EXPECT(aotr_driver_open(AOTR_BACKEND_CUDA, NULL, &d), AOTR_DRIVER_UNAVAILABLE,
                   "cannot load the CUDA driver (", "libcuda.so.1", "install the NVIDIA driver");
        }
        real = dlopen("libamdhip64.so", RTLD_NOW);
        if (real) {
            dlclose(real);
            printf("  (libamdhip64.so exists here: default-soname failure not checked)\n");
        } else {
            EXPECT(aotr_driver_open(AOTR_BACKEND_HIP, NULL, &d), AOTR_DRIVER_UNAVAILABLE,
                   "cannot load the HIP runtime (", "libamdhip64.so.6", "install ROCm",
                   "load a ROCm build of torch first");
        }
    }

    /* No device: cuInit / hipInit fail. */
    setenv("AOTR_STUB_NO_DEVICE", "1", 1);
    EXPECT(aotr_driver_open(AOTR_BACKEND_CUDA, AOTR_STUB_DRIVER, &d), AOTR_DRIVER_UNAVAILABLE,
           "cuInit failed: CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected (code 100; "
           "the CUDA backend needs an NVIDIA GPU",
           "libaotr_stub_driver");
    CHECK(d == NULL);
    EXPECT(aotr_driver_open(AOTR_BACKEND_HIP, AOTR_STUB_DRIVER, &d), AOTR_DRIVER_UNAVAILABLE,
           "hipInit failed: hipErrorNoDevice: no ROCm-capable device is detected (code 100; "
           "the HIP backend needs an AMD GPU");
    unsetenv("AOTR_STUB_NO_DEVICE");
}

/* A copy of the stub loaded under the driver's file name is found without
 * being named (the copy a framework already loaded). */
static void test_open_loaded(aotr_backend backend, const char *file_name)
{
    char dir[] = "/tmp/aotr_test_driver_XXXXXX";
    char path[256], command[600];
    struct stub copy;
    aotr_driver *d = NULL;
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        failures++;
        return;
    }
    snprintf(path, sizeof path, "%s/%s", dir, file_name);
    snprintf(command, sizeof command, "cp '%s' '%s'", AOTR_STUB_DRIVER, path);
    if (system(command) != 0 || !dlopen(path, RTLD_NOW | RTLD_LOCAL)) {
        fprintf(stderr, "cannot copy and load the stub as %s\n", path);
        failures++;
        return;
    }
    stub_bind(&copy, path);
    copy.reset();
    CHECK_OK(aotr_driver_open(backend, NULL, &d));
    CHECK(copy.calls(backend == AOTR_BACKEND_CUDA ? "cuInit" : "hipInit") == 1);
    CHECK(stub.calls(backend == AOTR_BACKEND_CUDA ? "cuInit" : "hipInit") == 0);
    aotr_driver_close(d);
    unlink(path);
    rmdir(dir);
}

static void test_arch(void)
{
    char arch[64];
    aotr_driver *d = open_stub(AOTR_BACKEND_CUDA);
    CHECK(aotr_driver_backend(d) == AOTR_BACKEND_CUDA);
    CHECK_OK(aotr_driver_device_arch(d, 0, arch, sizeof arch));
    CHECK(strcmp(arch, "sm_90") == 0);
    setenv("AOTR_STUB_CUDA_ARCH", "8.6", 1);
    CHECK_OK(aotr_driver_device_arch(d, 1, arch, sizeof arch));
    CHECK(strcmp(arch, "sm_86") == 0);
    unsetenv("AOTR_STUB_CUDA_ARCH");
    EXPECT(aotr_driver_device_arch(d, 0, arch, 5), AOTR_INVALID_ARGUMENT, "sm_90",
           "does not fit in 5 bytes");
    CHECK_OK(aotr_driver_device_arch(d, 0, arch, 6));
    EXPECT(aotr_driver_device_arch(d, 7, arch, sizeof arch), AOTR_DRIVER_ERROR,
           "device 7: cuDeviceGet failed: CUDA_ERROR_INVALID_DEVICE: invalid device ordinal "
           "(code 101; no such device index");
    EXPECT(aotr_driver_device_arch(d, -1, arch, sizeof arch), AOTR_INVALID_ARGUMENT, "negative");
    aotr_driver_close(d);

    d = open_stub(AOTR_BACKEND_HIP);
    CHECK(aotr_driver_backend(d) == AOTR_BACKEND_HIP);
    CHECK_OK(aotr_driver_device_arch(d, 0, arch, sizeof arch));
    CHECK(strcmp(arch, "gfx942") == 0);
    setenv("AOTR_STUB_HIP_ARCH", "gfx90a", 1);
    CHECK_OK(aotr_driver_device_arch(d, 1, arch, sizeof arch));
    CHECK(strcmp(arch, "gfx90a") == 0);
    setenv("AOTR_STUB_HIP_ARCH", "gfx1100:xnack-", 1);
    CHECK_OK(aotr_driver_device_arch(d, 0, arch, 8));
    CHECK(strcmp(arch, "gfx1100") == 0);
    EXPECT(aotr_driver_device_arch(d, 0, arch, 7), AOTR_INVALID_ARGUMENT, "gfx1100");
    setenv("AOTR_STUB_HIP_ARCH", "not-an-arch", 1);
    EXPECT(aotr_driver_device_arch(d, 0, arch, sizeof arch), AOTR_UNSUPPORTED,
           "hipGetDevicePropertiesR0600", "at byte 1160", "aotr_runtime_add_archive");
    unsetenv("AOTR_STUB_HIP_ARCH");
    EXPECT(aotr_driver_device_arch(d, 2, arch, sizeof arch), AOTR_DRIVER_ERROR,
           "device 2: hipGetDevicePropertiesR0600 failed: hipErrorInvalidDevice");
    aotr_driver_close(d);
}

static void check_launch(int i, const char *symbol, const uint32_t grid[3], uint32_t block_x,
                         uint32_t shared, void *stream, const unsigned char *args, size_t args_size,
                         int module)
{
    char got_symbol[64];
    unsigned got_grid[3], got_block_x = 0, got_shared = 0, block[3];
    void *got_stream = NULL;
    size_t got_size = 0;
    unsigned char got_args[64];
    int device;
    int got_module = stub.launch_info(i, got_symbol, sizeof got_symbol, got_grid, &got_block_x,
                                      &got_shared, &got_stream, &got_size);
    CHECK(got_module == module);
    CHECK(strcmp(got_symbol, symbol) == 0);
    CHECK(got_grid[0] == grid[0] && got_grid[1] == grid[1] && got_grid[2] == grid[2]);
    CHECK(got_block_x == block_x);
    CHECK(got_shared == shared);
    CHECK(got_stream == stream);
    CHECK(got_size == args_size);
    CHECK(stub.launch_args(i, got_args, sizeof got_args) == args_size);
    CHECK(memcmp(got_args, args, args_size) == 0);
    CHECK(stub.launch_where(i, &device, block) == 0);
    CHECK(block[0] == block_x && block[1] == 1 && block[2] == 1);
}

static void test_load_launch(aotr_backend backend)
{
    const int cuda = backend == AOTR_BACKEND_CUDA;
    unsigned char image[1300], image2[600], args[24];
    size_t size = make_elf(image, 1000, 1), size2 = make_elf(image2, 300, 2), nargs, got_size;
    void *fn = NULL, *fn_big = NULL, *fn1 = NULL;
    const uint32_t grid[3] = {4, 2, 3}, empty[3] = {4, 0, 1};
    char symbol[64];
    uint64_t checksum;
    unsigned shared;
    int device, index0, index;
    int before_live = stub.live_modules();
    aotr_driver *d = open_stub(backend);

    stub.reset();
    CHECK_OK(aotr_driver_load(d, 0, image, size, "attn_fwd", 16384, &fn));
    CHECK(fn != NULL);
    CHECK(stub.load_count() == 1);
    index0 = stub.load_info(0, &device, &got_size, &checksum, symbol, sizeof symbol, &shared);
    CHECK(index0 >= 0);
    CHECK(device == 0);
    CHECK(got_size == size);
    CHECK(checksum == fnv1a(image, size));
    CHECK(strcmp(symbol, "attn_fwd") == 0);
    CHECK(shared == 0);
    if (cuda) {
        CHECK(stub.cuda_current() == 0); /* the thread had none: left set */
        CHECK(stub.calls("cuCtxSetCurrent") == 1);
        CHECK(stub.calls("cuFuncSetAttribute") == 0);
        CHECK(stub.cuda_retains(0) == 1);
    }

    /* Above 48 KiB of shared memory: CUDA opts in. */
    CHECK_OK(aotr_driver_load(d, 0, image2, size2, "attn_bwd_dq", 98304, &fn_big));
    CHECK(stub.load_info(1, NULL, NULL, NULL, symbol, sizeof symbol, &shared) == index0 + 1);
    CHECK(strcmp(symbol, "attn_bwd_dq") == 0);
    CHECK(shared == (cuda ? 98304u : 0u));
    CHECK(stub.calls("cuFuncSetAttribute") == (cuda ? 1 : 0));
    if (cuda)
        CHECK(stub.cuda_retains(0) == 1); /* retained once per device */

    nargs = pack_args(args, (void *)0x7f0000001000, -5, 0.125f, (int64_t)1 << 40);
    CHECK_OK(aotr_driver_launch(d, 0, fn, grid, 256, 16384, (void *)0x1234, args, nargs));
    CHECK(stub.launch_count() == 1);
    check_launch(0, "attn_fwd", grid, 256, 16384, (void *)0x1234, args, nargs, index0);
    CHECK_OK(aotr_driver_launch(d, 0, fn_big, grid, 128, 98304, NULL, args, nargs));
    check_launch(1, "attn_bwd_dq", grid, 128, 98304, NULL, args, nargs, index0 + 1);
    /* An empty grid launches nothing. */
    CHECK_OK(aotr_driver_launch(d, 0, fn, empty, 256, 0, NULL, args, nargs));
    CHECK(stub.launch_count() == 2);
    /* No arguments at all. */
    CHECK_OK(aotr_driver_launch(d, 0, fn, grid, 64, 0, NULL, NULL, 0));
    CHECK(stub.launch_count() == 3);
    CHECK(stub.launch_args(2, NULL, 0) == 0);

    /* Another device: HIP switches and restores; CUDA pushes device 1's
     * primary context over the current one and pops it. */
    CHECK_OK(aotr_driver_load(d, 1, image, size, "attn_fwd", 0, &fn1));
    index = stub.load_info(2, &device, NULL, NULL, NULL, 0, NULL);
    CHECK(index == index0 + 2);
    CHECK(device == 1);
    if (cuda) {
        CHECK(stub.cuda_current() == 0);
        CHECK(stub.calls("cuCtxPushCurrent_v2") == 1);
        CHECK(stub.calls("cuCtxPopCurrent_v2") == 1);
        CHECK(stub.cuda_retains(1) == 1);
        /* Launching device 1's function with device 0's context current is
         * the caller's mistake; the driver reports it. */
        EXPECT(aotr_driver_launch(d, 1, fn1, grid, 256, 0, NULL, args, nargs), AOTR_DRIVER_ERROR,
               "cuLaunchKernel failed: CUDA_ERROR_INVALID_HANDLE", "belongs to another device",
               "device 1]");
        stub.cuda_set_current(1);
        CHECK_OK(aotr_driver_launch(d, 1, fn1, grid, 256, 0, NULL, args, nargs));
        stub.cuda_set_current(0);
    } else {
        int current = -1;
        CHECK(stub.hip_get_device(&current) == 0 && current == 0);
        CHECK(stub.calls("hipSetDevice") == 2);
        CHECK_OK(aotr_driver_launch(d, 1, fn1, grid, 256, 0, NULL, args, nargs));
    }
    CHECK(stub.launch_info(stub.launch_count() - 1, symbol, sizeof symbol, NULL, NULL, NULL, NULL,
                           NULL) == index0 + 2);

    /* A thread with a context of its own (not a primary one): the load
     * pushes and pops, leaving it current. */
    if (cuda) {
        stub.cuda_set_current(-2);
        CHECK_OK(aotr_driver_load(d, 0, image, size, "attn_fwd", 0, &fn));
        CHECK(stub.load_info(3, &device, NULL, NULL, NULL, 0, NULL) == index0 + 3);
        CHECK(device == 0);
        CHECK(stub.cuda_current() == -2);
        CHECK(stub.calls("cuCtxPushCurrent_v2") == 2);
        CHECK(stub.calls("cuCtxPopCurrent_v2") == 2);
        stub.cuda_set_current(0);
    }

    CHECK(stub.live_modules() == before_live + (cuda ? 4 : 3));
    aotr_driver_close(d);
    CHECK(stub.live_modules() == before_live);
    if (cuda) {
        CHECK(stub.cuda_retains(0) == 0);
        CHECK(stub.cuda_retains(1) == 0);
        CHECK(stub.calls("cuModuleUnload") == 4);
        stub.cuda_set_current(-1);
    } else {
        CHECK(stub.calls("hipModuleUnload") == 3);
    }
}

static void test_errors_cuda(void)
{
    unsigned char image[400], args[24], garbage[64];
    size_t size = make_elf(image, 200, 3);
    size_t nargs = pack_args(args, NULL, 1, 1.0f, 2);
    const uint32_t grid[3] = {4, 2, 3};
    void *fn = NULL;
    int live;
    aotr_driver *d = open_stub(AOTR_BACKEND_CUDA);
    stub.reset();
    live = stub.live_modules();

    stub.fail_next("cuModuleGetFunction", 500);
    EXPECT(aotr_driver_load(d, 0, image, size, "attn_fwd_missing", 0, &fn), AOTR_DRIVER_ERROR,
           "cuModuleGetFunction failed: CUDA_ERROR_NOT_FOUND: named symbol not found (code "
           "500; the kernel symbol is not in the code object",
           "[attn_fwd_missing, 392 bytes, device 0]");
    CHECK(fn == NULL);
    CHECK(stub.live_modules() == live); /* the module was unloaded again */

    stub.fail_next("cuModuleLoadData", 209);
    EXPECT(aotr_driver_load(d, 0, image, size, "k", 0, &fn), AOTR_DRIVER_ERROR,
           "cuModuleLoadData failed: CUDA_ERROR_NO_BINARY_FOR_GPU", "another GPU architecture");

    memset(garbage, 'x', sizeof garbage);
    EXPECT(aotr_driver_load(d, 0, garbage, sizeof garbage, "k", 0, &fn), AOTR_DRIVER_ERROR,
           "cuModuleLoadData failed: CUDA_ERROR_INVALID_IMAGE: device kernel image is invalid",
           "not a valid cubin");

    EXPECT(aotr_driver_load(d, 0, image, size, "big", 300000, &fn), AOTR_DRIVER_ERROR,
           "cuFuncSetAttribute failed: CUDA_ERROR_INVALID_VALUE",
           "needs 300000 bytes of shared memory, device 0 allows at most 232448 per block");
    CHECK(stub.live_modules() == live);

    stub.fail_next("cuDevicePrimaryCtxRetain", 2);
    EXPECT(aotr_driver_load(d, 1, image, size, "k", 0, &fn), AOTR_DRIVER_ERROR,
           "loading k on device 1: cuDevicePrimaryCtxRetain failed: CUDA_ERROR_OUT_OF_MEMORY: "
           "out of memory (code 2)");
    EXPECT(aotr_driver_load(d, 5, image, size, "k", 0, &fn), AOTR_DRIVER_ERROR,
           "cuDeviceGet failed: CUDA_ERROR_INVALID_DEVICE");
    EXPECT(aotr_driver_load(d, 0, image, size, NULL, 0, &fn), AOTR_INVALID_ARGUMENT, "NULL");
    EXPECT(aotr_driver_load(d, 0, image, 0, "k", 0, &fn), AOTR_INVALID_ARGUMENT, "0 bytes");

    CHECK_OK(aotr_driver_load(d, 0, image, size, "attn_fwd", 16384, &fn));
    stub.fail_next("cuLaunchKernel", 701);
    EXPECT(aotr_driver_launch(d, 0, fn, grid, 256, 16384, (void *)0xabc, args, nargs),
           AOTR_DRIVER_ERROR,
           "cuLaunchKernel failed: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: too many resources "
           "requested for launch (code 701; the kernel needs more registers",
           "[grid (4, 2, 3), block (256, 1, 1), shared 16384 bytes, stream 0xabc, 24 argument "
           "bytes, device 0]");
    /* INVALID_CONTEXT with a context current: not retried. */
    stub.fail_next("cuLaunchKernel", 201);
    EXPECT(aotr_driver_launch(d, 0, fn, grid, 256, 16384, NULL, args, nargs), AOTR_DRIVER_ERROR,
           "cuLaunchKernel failed: CUDA_ERROR_INVALID_CONTEXT", "make the device current");
    CHECK(stub.calls("cuLaunchKernel") == 2);
    /* An unknown code. */
    stub.fail_next("cuLaunchKernel", 12345);
    EXPECT(aotr_driver_launch(d, 0, fn, grid, 256, 16384, NULL, args, nargs), AOTR_DRIVER_ERROR,
           "cuLaunchKernel failed: CUDA_ERROR_UNRECOGNIZED: no description (code 12345)");
    /* Shared memory above what the function opted in to. */
    EXPECT(aotr_driver_launch(d, 0, fn, grid, 256, 65536, NULL, args, nargs), AOTR_DRIVER_ERROR,
           "CUDA_ERROR_INVALID_VALUE", "invalid launch configuration", "shared 65536 bytes");
    CHECK(stub.launch_count() == 0);
    aotr_driver_close(d);
    stub.cuda_set_current(-1);
}

static void test_errors_hip(void)
{
    unsigned char image[400], args[24], garbage[64];
    size_t size = make_elf(image, 200, 3);
    size_t nargs = pack_args(args, NULL, 1, 1.0f, 2);
    const uint32_t grid[3] = {1, 1, 7};
    void *fn = NULL;
    int live, current = -1;
    aotr_driver *d = open_stub(AOTR_BACKEND_HIP);
    stub.reset();
    live = stub.live_modules();

    stub.fail_next("hipModuleGetFunction", 500);
    EXPECT(aotr_driver_load(d, 1, image, size, "attn_fwd_missing", 0, &fn), AOTR_DRIVER_ERROR,
           "hipModuleGetFunction failed: hipErrorNotFound: named symbol not found (code 500; "
           "the kernel symbol is not in the code object",
           "[attn_fwd_missing, 392 bytes, device 1]");
    CHECK(stub.live_modules() == live);
    CHECK(stub.hip_get_device(&current) == 0 && current == 0); /* restored */
    CHECK(stub.calls("hipSetDevice") == 2);

    stub.fail_next("hipModuleLoadData", 303);
    EXPECT(aotr_driver_load(d, 0, image, size, "k", 0, &fn), AOTR_DRIVER_ERROR,
           "hipModuleLoadData failed: hipErrorSharedObjectInitFailed", "newer ROCm");
    memset(garbage, 'x', sizeof garbage);
    EXPECT(aotr_driver_load(d, 0, garbage, sizeof garbage, "k", 0, &fn), AOTR_DRIVER_ERROR,
           "hipModuleLoadData failed: hipErrorInvalidImage", "not a valid HSACO");
    EXPECT(aotr_driver_load(d, 3, image, size, "k", 0, &fn), AOTR_DRIVER_ERROR,
           "hipSetDevice failed: hipErrorInvalidDevice: invalid device ordinal (code 101; no "
           "such device index");
    stub.fail_next("hipGetDevice", 3);
    EXPECT(aotr_driver_load(d, 0, image, size, "k", 0, &fn), AOTR_DRIVER_ERROR,
           "hipGetDevice failed: hipErrorNotInitialized");

    /* The thread's device stays what it was, also when it is not 0. */
    CHECK(stub.hip_set_device(1) == 0);
    CHECK_OK(aotr_driver_load(d, 0, image, size, "attn_fwd", 100000, &fn));
    CHECK(stub.hip_get_device(&current) == 0 && current == 1);
    CHECK(stub.hip_set_device(0) == 0);

    stub.fail_next("hipModuleLaunchKernel", 701);
    EXPECT(aotr_driver_launch(d, 0, fn, grid, 512, 100000, NULL, args, nargs), AOTR_DRIVER_ERROR,
           "hipModuleLaunchKernel failed: hipErrorLaunchOutOfResources: too many resources "
           "requested for launch (code 701; the kernel needs more registers or LDS",
           "[grid (1, 1, 7), block (512, 1, 1), shared 100000 bytes, stream (nil), 24 argument "
           "bytes, device 0]");
    stub.fail_next("hipModuleLaunchKernel", 4242);
    EXPECT(aotr_driver_launch(d, 0, fn, grid, 512, 0, NULL, args, nargs), AOTR_DRIVER_ERROR,
           "hipModuleLaunchKernel failed: hipErrorUnknown: unknown error (code 4242)");
    EXPECT(aotr_driver_launch(d, 0, fn, grid, 2048, 0, NULL, args, nargs), AOTR_DRIVER_ERROR,
           "hipErrorInvalidValue", "block above 1024 threads");
    CHECK(stub.launch_count() == 0);
    aotr_driver_close(d);
}

/* A thread that never touched CUDA launches a function loaded elsewhere:
 * the launch gets INVALID_CONTEXT, the driver makes the device's primary
 * context current and retries. */
struct retry_job {
    aotr_driver *d;
    void *fn;
    int device;
    aotr_status status;
    int current_before, current_after;
};

static void *retry_thread(void *arg)
{
    struct retry_job *job = arg;
    const uint32_t grid[3] = {1, 1, 1};
    unsigned char args[24];
    size_t n = pack_args(args, NULL, 0, 0.0f, 0);
    job->current_before = stub.cuda_current();
    job->status = aotr_driver_launch(job->d, job->device, job->fn, grid, 32, 0, NULL, args, n);
    job->current_after = stub.cuda_current();
    return NULL;
}

static void test_context_retry(void)
{
    unsigned char image[400];
    size_t size = make_elf(image, 100, 9);
    struct retry_job job;
    pthread_t t;
    aotr_driver *d = open_stub(AOTR_BACKEND_CUDA);
    stub.reset();
    memset(&job, 0, sizeof job);
    job.d = d;
    job.device = 1;
    CHECK_OK(aotr_driver_load(d, 1, image, size, "attn_fwd", 0, &job.fn));
    stub.reset();
    CHECK(pthread_create(&t, NULL, retry_thread, &job) == 0);
    pthread_join(t, NULL);
    CHECK_OK(job.status);
    CHECK(job.current_before == -1);
    CHECK(job.current_after == 1);
    CHECK(stub.calls("cuLaunchKernel") == 2);
    CHECK(stub.launch_count() == 1);
    aotr_driver_close(d);
    stub.cuda_set_current(-1);
}

/* 16 threads, each loading its own kernel and launching it 1000 times. */
#define THREADS 16
#define LAUNCHES 1000

struct worker {
    aotr_driver *d;
    int id;
    int failed;
};

static void *worker_thread(void *arg)
{
    struct worker *w = arg;
    unsigned char image[600], args[24];
    char symbol[32];
    size_t size = make_elf(image, 100 + 10 * (size_t)w->id, (unsigned)w->id);
    void *fn = NULL;
    const uint32_t grid[3] = {(uint32_t)w->id + 1, 1, 1};
    aotr_status st;
    snprintf(symbol, sizeof symbol, "kernel_%d", w->id);
    st = aotr_driver_load(w->d, w->id % 2, image, size, symbol, 0, &fn);
    if (st != AOTR_OK) {
        fprintf(stderr, "worker %d: load: %s\n", w->id, aotr_last_error());
        w->failed++;
        return NULL;
    }
    for (int i = 0; i < LAUNCHES; i++) {
        size_t n = pack_args(args, (void *)(uintptr_t)(0x1000 * (w->id + 1)), w->id, 0.5f, i);
        st = aotr_driver_launch(w->d, w->id % 2, fn, grid, 64, 0, NULL, args, n);
        if (st != AOTR_OK) {
            fprintf(stderr, "worker %d: launch %d: %s\n", w->id, i, aotr_last_error());
            w->failed++;
            return NULL;
        }
    }
    return NULL;
}

static void test_concurrency(aotr_backend backend)
{
    pthread_t threads[THREADS];
    struct worker workers[THREADS];
    int launches_per[THREADS] = {0};
    long sum_per[THREADS] = {0};
    int load_device[THREADS];
    int module_of[THREADS];
    aotr_driver *d = open_stub(backend);
    int count;
    stub.reset();
    for (int i = 0; i < THREADS; i++) {
        workers[i].d = d;
        workers[i].id = i;
        workers[i].failed = 0;
        CHECK(pthread_create(&threads[i], NULL, worker_thread, &workers[i]) == 0);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(threads[i], NULL);
        CHECK(workers[i].failed == 0);
    }
    CHECK(stub.load_count() == THREADS);
    count = stub.launch_count();
    CHECK(count == THREADS * LAUNCHES);
    for (int i = 0; i < THREADS; i++)
        module_of[i] = -1;
    for (int i = 0; i < THREADS; i++) {
        char symbol[32];
        int device, id;
        int index = stub.load_info(i, &device, NULL, NULL, symbol, sizeof symbol, NULL);
        CHECK(sscanf(symbol, "kernel_%d", &id) == 1 && id >= 0 && id < THREADS);
        if (id < 0 || id >= THREADS)
            continue;
        CHECK(module_of[id] == -1);
        module_of[id] = index;
        load_device[id] = device;
        CHECK(device == id % 2);
    }
    for (int i = 0; i < count; i++) {
        char symbol[32];
        unsigned grid[3];
        unsigned char args[24];
        int32_t id;
        int64_t iteration;
        int module = stub.launch_info(i, symbol, sizeof symbol, grid, NULL, NULL, NULL, NULL);
        stub.launch_args(i, args, sizeof args);
        memcpy(&id, args + 8, 4);
        memcpy(&iteration, args + 16, 8);
        if (id < 0 || id >= THREADS) {
            CHECK(0);
            continue;
        }
        launches_per[id]++;
        sum_per[id] += (long)iteration;
        if (module != module_of[id] || grid[0] != (unsigned)id + 1) {
            CHECK(module == module_of[id]);
            CHECK(grid[0] == (unsigned)id + 1);
            break;
        }
        if (backend == AOTR_BACKEND_CUDA) {
            int device;
            stub.launch_where(i, &device, NULL);
            if (device != load_device[id]) {
                CHECK(device == load_device[id]);
                break;
            }
        }
    }
    for (int i = 0; i < THREADS; i++) {
        CHECK(launches_per[i] == LAUNCHES);
        CHECK(sum_per[i] == (long)LAUNCHES * (LAUNCHES - 1) / 2);
    }
    aotr_driver_close(d);
    if (backend == AOTR_BACKEND_CUDA) {
        CHECK(stub.calls("cuModuleUnload") == THREADS);
        CHECK(stub.cuda_retains(0) == 0 && stub.cuda_retains(1) == 0);
    } else {
        CHECK(stub.calls("hipModuleUnload") == THREADS);
    }
}

int main(void)
{
    aotr_driver *d;
    printf("open errors\n");
    test_open_errors();
    /* Keep the stub loaded (and its state) from here on. */
    d = open_stub(AOTR_BACKEND_CUDA);
    stub_bind(&stub, AOTR_STUB_DRIVER);
    aotr_driver_close(d);
    printf("open the loaded copy\n");
    stub.reset();
    test_open_loaded(AOTR_BACKEND_CUDA, "libcuda.so.1");
    stub.reset();
    test_open_loaded(AOTR_BACKEND_HIP, "libamdhip64.so.6");
    printf("device arch\n");
    test_arch();
    for (int b = 0; b < 2; b++) {
        aotr_backend backend = b ? AOTR_BACKEND_HIP : AOTR_BACKEND_CUDA;
        printf("load and launch (%s)\n", backend_name(backend));
        test_load_launch(backend);
    }
    printf("errors (cuda)\n");
    test_errors_cuda();
    printf("errors (hip)\n");
    test_errors_hip();
    printf("context retry (cuda)\n");
    test_context_retry();
    for (int b = 0; b < 2; b++) {
        aotr_backend backend = b ? AOTR_BACKEND_HIP : AOTR_BACKEND_CUDA;
        printf("concurrency (%s)\n", backend_name(backend));
        test_concurrency(backend);
    }
    CHECK(stub.live_modules() == 0);
    dlclose(stub.lib);
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("all driver tests passed\n");
    return 0;
}
