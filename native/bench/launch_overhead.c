/* Host time of one aotr_attn_fwd call through the C API (CUDA driver),
 * at a tiny shape where the GPU work is negligible:
 *   launch_overhead ARCHIVE [calls]
 * Device memory comes from the CUDA driver opened with dlopen, like the
 * library itself does. Prints one JSON line. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "aotriton_rocm/aotriton_rocm.h"

static int (*cu_init)(unsigned);
static int (*cu_device_get)(int *, int);
static int (*cu_ctx_retain)(void **, int);
static int (*cu_ctx_set)(void *);
static int (*cu_alloc)(unsigned long long *, size_t);
static int (*cu_sync)(void);

static void bind(void *lib, const char *name, void *slot)
{
    void *p = dlsym(lib, name);
    if (!p) {
        fprintf(stderr, "launch_overhead: %s missing from the CUDA driver\n", name);
        exit(2);
    }
    memcpy(slot, &p, sizeof p);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static aotr_tensor dense(unsigned long long ptr, int dtype, int rank, const int64_t *sizes)
{
    aotr_tensor t;
    memset(&t, 0, sizeof t);
    t.data = (void *)(uintptr_t)ptr;
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

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: launch_overhead ARCHIVE [calls]\n");
        return 2;
    }
    int calls = argc > 2 ? atoi(argv[2]) : 2000;
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!cuda) {
        fprintf(stderr, "launch_overhead: no CUDA driver: %s\n", dlerror());
        return 2;
    }
    bind(cuda, "cuInit", &cu_init);
    bind(cuda, "cuDeviceGet", &cu_device_get);
    bind(cuda, "cuDevicePrimaryCtxRetain", &cu_ctx_retain);
    bind(cuda, "cuCtxSetCurrent", &cu_ctx_set);
    bind(cuda, "cuMemAlloc_v2", &cu_alloc);
    bind(cuda, "cuCtxSynchronize", &cu_sync);
    int dev = 0;
    void *ctx = NULL;
    if (cu_init(0) || cu_device_get(&dev, 0) || cu_ctx_retain(&ctx, dev) || cu_ctx_set(ctx)) {
        fprintf(stderr, "launch_overhead: cannot set up the CUDA context\n");
        return 2;
    }

    const int64_t qshape[4] = {1, 1, 128, 64}, lshape[3] = {1, 1, 128};
    unsigned long long q, k, v, o, lse;
    size_t bytes = 128 * 64 * 2;
    if (cu_alloc(&q, bytes) || cu_alloc(&k, bytes) || cu_alloc(&v, bytes) || cu_alloc(&o, bytes) ||
        cu_alloc(&lse, 128 * 4)) {
        fprintf(stderr, "launch_overhead: cuMemAlloc failed\n");
        return 2;
    }
    aotr_runtime *rt = NULL;
    aotr_runtime_options opts = {sizeof opts, NULL, NULL, AOTR_BACKEND_CUDA};
    if (aotr_runtime_create(&opts, &rt) || aotr_runtime_add_archive(rt, argv[1])) {
        fprintf(stderr, "launch_overhead: %s\n", aotr_last_error());
        return 1;
    }
    aotr_attn_fwd_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.problem.q = dense(q, AOTR_FP16, 4, qshape);
    p.problem.k = dense(k, AOTR_FP16, 4, qshape);
    p.problem.v = dense(v, AOTR_FP16, 4, qshape);
    p.problem.scale = 0.125f;
    p.problem.window_left = p.problem.window_right = -1;
    p.out = dense(o, AOTR_FP16, 4, qshape);
    p.lse = dense(lse, AOTR_FP32, 3, lshape);
    aotr_status st = aotr_attn_fwd(rt, &p); /* first call: loads the code object */
    if (st != AOTR_OK) {
        fprintf(stderr, "launch_overhead: %s: %s\n", aotr_status_name(st), aotr_last_error());
        return 1;
    }
    cu_sync();
    double best = 1e9, total = 0;
    for (int round = 0; round < 5; round++) {
        double t0 = now();
        for (int i = 0; i < calls; i++)
            aotr_attn_fwd(rt, &p);
        double host = (now() - t0) / calls;
        cu_sync();
        total += host;
        if (host < best)
            best = host;
    }
    double t0 = now();
    aotr_attn_check(&p.problem);
    double check = now() - t0;
    printf("{\"calls\": %d, \"host_us_per_call_best\": %.3f, \"host_us_per_call_mean\": %.3f, "
           "\"launches\": %llu, \"check_us_once\": %.3f}\n",
           calls, best * 1e6, total / 5 * 1e6,
           (unsigned long long)aotr_runtime_launch_count(rt, NULL), check * 1e6);
    aotr_runtime_destroy(rt);
    return 0;
}
