/* consumer_c DRIVER_LIBRARY [ARCHIVE]
 *
 * Creates a runtime on DRIVER_LIBRARY, adds ARCHIVE (without it, the library
 * finds the installed kernel image of the device's arch), runs the attention
 * forward and backward of one fixed problem, and prints what was launched as
 * JSON. DRIVER_LIBRARY is the test suite's stub driver (native/tests/
 * stub_driver.c): it records launches instead of running them, and the
 * addresses below stand in for device buffers (it never dereferences them).
 * The launches are read back from its aotr_stub_* functions. */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <aotriton_rocm/aotriton_rocm.h>

enum { B = 2, HQ = 4, HKV = 2, SQ = 128, SK = 192, D = 64 };

static void check(aotr_status status, const char *what)
{
    if (status != AOTR_OK) {
        fprintf(stderr, "consumer_c: %s: %s: %s\n", what, aotr_status_name(status),
                aotr_last_error());
        exit(1);
    }
}

/* A contiguous tensor of `rank` sizes at a fixed address. */
static aotr_tensor tensor(uint64_t address, aotr_dtype dtype, int rank, const int64_t *sizes)
{
    aotr_tensor t;
    memset(&t, 0, sizeof t);
    t.data = (void *)(uintptr_t)address;
    t.dtype = dtype;
    t.rank = rank;
    int64_t stride = 1;
    for (int i = rank - 1; i >= 0; i--) {
        t.sizes[i] = sizes[i];
        t.strides[i] = stride;
        stride *= sizes[i];
    }
    return t;
}

typedef int (*count_fn)(void);
typedef int (*info_fn)(int, char *, size_t, unsigned[3], unsigned *, unsigned *, void **, size_t *);
typedef size_t (*args_fn)(int, void *, size_t);

static void *symbol(void *handle, const char *name)
{
    void *f = dlsym(handle, name);
    if (f == NULL) {
        fprintf(stderr, "consumer_c: %s: %s\n", name, dlerror());
        exit(1);
    }
    return f;
}

int main(int argc, char **argv)
{
    if (argc != 2 && argc != 3) {
        fprintf(stderr, "usage: %s DRIVER_LIBRARY [ARCHIVE]\n", argv[0]);
        return 2;
    }
    aotr_runtime_options options;
    memset(&options, 0, sizeof options);
    options.struct_size = sizeof options;
    options.driver_library = argv[1];
    options.backend = AOTR_BACKEND_CUDA;
    aotr_runtime *runtime = NULL;
    check(aotr_runtime_create(&options, &runtime), "aotr_runtime_create");
    if (argc == 3)
        check(aotr_runtime_add_archive(runtime, argv[2]), "aotr_runtime_add_archive");

    const int64_t q_shape[] = {B, HQ, SQ, D}, kv_shape[] = {B, HKV, SK, D},
                  lse_shape[] = {B, HQ, SQ};
    aotr_attn_problem problem;
    memset(&problem, 0, sizeof problem);
    problem.q = tensor(0x100000000, AOTR_FP16, 4, q_shape);
    problem.k = tensor(0x200000000, AOTR_FP16, 4, kv_shape);
    problem.v = tensor(0x300000000, AOTR_FP16, 4, kv_shape);
    problem.scale = 0.125f;
    problem.causal = 1;
    problem.causal_alignment = AOTR_CAUSAL_BOTTOM_RIGHT;
    problem.window_left = problem.window_right = -1;
    check(aotr_attn_check(&problem), "aotr_attn_check");
    check(aotr_attn_supported(runtime, 0, &problem, AOTR_NEED_BACKWARD), "aotr_attn_supported");

    aotr_attn_fwd_params fwd;
    memset(&fwd, 0, sizeof fwd);
    fwd.struct_size = sizeof fwd;
    fwd.stream = (void *)(uintptr_t)0x5000;
    fwd.problem = problem;
    fwd.out = tensor(0x400000000, AOTR_FP16, 4, q_shape);
    fwd.lse = tensor(0x500000000, AOTR_FP32, 3, lse_shape);
    check(aotr_attn_fwd(runtime, &fwd), "aotr_attn_fwd");

    aotr_attn_bwd_params bwd;
    memset(&bwd, 0, sizeof bwd);
    bwd.struct_size = sizeof bwd;
    bwd.stream = fwd.stream;
    bwd.problem = problem;
    bwd.out = fwd.out;
    bwd.lse = fwd.lse;
    bwd.grad_out = tensor(0x600000000, AOTR_FP16, 4, q_shape);
    bwd.grad_q = tensor(0x700000000, AOTR_FP16, 4, q_shape);
    bwd.grad_k = tensor(0x800000000, AOTR_FP16, 4, kv_shape);
    bwd.grad_v = tensor(0x900000000, AOTR_FP16, 4, kv_shape);
    bwd.delta = tensor(0xa00000000, AOTR_FP32, 3, lse_shape);
    check(aotr_attn_bwd(runtime, &bwd), "aotr_attn_bwd");

    /* RTLD_NOLOAD: the handle of the copy the library already loaded. */
    void *stub = dlopen(argv[1], RTLD_NOW | RTLD_NOLOAD);
    if (stub == NULL) {
        fprintf(stderr, "consumer_c: %s is not loaded: %s\n", argv[1], dlerror());
        return 1;
    }
    count_fn launch_count = (count_fn)symbol(stub, "aotr_stub_launch_count");
    info_fn launch_info = (info_fn)symbol(stub, "aotr_stub_launch_info");
    args_fn launch_args = (args_fn)symbol(stub, "aotr_stub_launch_args");

    printf("{\"version\": \"%s\", \"runtime_launch_count\": %llu, \"launches\": [", aotr_version(),
           (unsigned long long)aotr_runtime_launch_count(runtime, NULL));
    for (int i = 0; i < launch_count(); i++) {
        char name[256];
        unsigned grid[3], block, shared;
        void *stream;
        size_t size;
        if (launch_info(i, name, sizeof name, grid, &block, &shared, &stream, &size) < 0) {
            fprintf(stderr, "consumer_c: aotr_stub_launch_info(%d) failed\n", i);
            return 1;
        }
        unsigned char *args = malloc(size ? size : 1);
        if (args == NULL || launch_args(i, args, size) != size) {
            fprintf(stderr, "consumer_c: aotr_stub_launch_args(%d) failed\n", i);
            return 1;
        }
        printf("%s{\"symbol\": \"%s\", \"grid\": [%u, %u, %u], \"block\": %u, \"shared\": %u, "
               "\"stream\": %llu, \"args\": \"",
               i ? ", " : "", name, grid[0], grid[1], grid[2], block, shared,
               (unsigned long long)(uintptr_t)stream);
        for (size_t j = 0; j < size; j++)
            printf("%02x", args[j]);
        printf("\"}");
        free(args);
    }
    printf("]}\n");
    aotr_runtime_destroy(runtime);
    return 0;
}
