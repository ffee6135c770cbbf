/* A consumer of libaotriton_rocm on a real GPU (CUDA driver): attention
 * forward and backward through the C API, checked against a float32
 * reference computed here on the host. Written in the common subset of C
 * and C++: main.cpp compiles this file as C++ (the header's C++ use).
 *   gpu_attention_check ARCHIVE
 * Prints one JSON line per case and exits non-zero on any failure. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "aotriton_rocm/aotriton_rocm.h"

typedef unsigned long long devptr;
static int (*cu_init)(unsigned);
static int (*cu_device_get)(int *, int);
static int (*cu_ctx_retain)(void **, int);
static int (*cu_ctx_set)(void *);
static int (*cu_alloc)(devptr *, size_t);
static int (*cu_free)(devptr);
static int (*cu_htod)(devptr, const void *, size_t);
static int (*cu_dtoh)(void *, devptr, size_t);
static int (*cu_sync)(void);

static void bind(void *lib, const char *name, void *slot)
{
    void *p = dlsym(lib, name);
    if (!p) {
        fprintf(stderr, "gpu_attention_check: %s missing from the CUDA driver\n", name);
        exit(2);
    }
    memcpy(slot, &p, sizeof p);
}

static uint16_t to_half(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, mant = x & 0x7fffffu;
    int exp = (int)((x >> 23) & 0xff) - 127 + 15;
    if (exp <= 0)
        return (uint16_t)sign; /* inputs here are never that small */
    if (exp >= 31)
        return (uint16_t)(sign | 0x7c00u);
    uint32_t h = sign | ((uint32_t)exp << 10) | (mant >> 13);
    uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
        h++; /* round to nearest even */
    return (uint16_t)h;
}

static float from_half(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    uint32_t x;
    if (exp == 0 && mant == 0)
        x = sign;
    else if (exp == 0) { /* subnormal */
        exp = 1;
        while (!(mant & 0x400u)) {
            mant <<= 1;
            exp--;
        }
        x = sign | ((exp + 112u) << 23) | ((mant & 0x3ffu) << 13);
    } else if (exp == 31)
        x = sign | 0x7f800000u | (mant << 13);
    else
        x = sign | ((exp + 112u) << 23) | (mant << 13);
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static aotr_tensor view(devptr p, int dtype, int rank, const int64_t *sizes)
{
    aotr_tensor t;
    memset(&t, 0, sizeof t);
    t.data = (void *)(uintptr_t)p;
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

static devptr upload(const float *x, size_t n)
{
    uint16_t *h = (uint16_t *)malloc(n * 2);
    for (size_t i = 0; i < n; i++)
        h[i] = to_half(x[i]);
    devptr d = 0;
    if (cu_alloc(&d, n * 2) || cu_htod(d, h, n * 2)) {
        fprintf(stderr, "gpu_attention_check: device allocation/copy failed\n");
        exit(2);
    }
    free(h);
    return d;
}

static float *download(devptr d, size_t n)
{
    uint16_t *h = (uint16_t *)malloc(n * 2);
    float *x = (float *)malloc(n * sizeof *x);
    if (cu_dtoh(h, d, n * 2)) {
        fprintf(stderr, "gpu_attention_check: copy back failed\n");
        exit(2);
    }
    for (size_t i = 0; i < n; i++)
        x[i] = from_half(h[i]);
    free(h);
    return x;
}

static float max_err(const float *a, const float *b, size_t n)
{
    float m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmaxf(m, fabsf(a[i] - b[i]));
    return m;
}

/* float32 reference of one (batch, head): forward and backward. */
static void reference(int S, int D, int causal, float scale, const float *q, const float *k,
                      const float *v, const float *dout, float *out, float *dq, float *dk,
                      float *dv)
{
    float *p = (float *)calloc((size_t)S * S, sizeof *p);
    for (int i = 0; i < S; i++) {
        float m = -INFINITY, sum = 0;
        for (int j = 0; j < S; j++) {
            float s = 0;
            for (int c = 0; c < D; c++)
                s += q[i * D + c] * k[j * D + c];
            s = (causal && j > i) ? -INFINITY : s * scale;
            p[i * S + j] = s;
            m = fmaxf(m, s);
        }
        for (int j = 0; j < S; j++)
            sum += p[i * S + j] = expf(p[i * S + j] - m);
        for (int j = 0; j < S; j++)
            p[i * S + j] /= sum;
        for (int c = 0; c < D; c++) {
            float o = 0;
            for (int j = 0; j < S; j++)
                o += p[i * S + j] * v[j * D + c];
            out[i * D + c] = o;
        }
    }
    memset(dq, 0, sizeof(float) * (size_t)S * D);
    memset(dk, 0, sizeof(float) * (size_t)S * D);
    memset(dv, 0, sizeof(float) * (size_t)S * D);
    for (int i = 0; i < S; i++) {
        float delta = 0;
        for (int c = 0; c < D; c++)
            delta += dout[i * D + c] * out[i * D + c];
        for (int j = 0; j < S; j++) {
            float dp = 0;
            for (int c = 0; c < D; c++)
                dp += dout[i * D + c] * v[j * D + c];
            float ds = p[i * S + j] * (dp - delta) * scale;
            for (int c = 0; c < D; c++) {
                dq[i * D + c] += ds * k[j * D + c];
                dk[j * D + c] += ds * q[i * D + c];
                dv[j * D + c] += p[i * S + j] * dout[i * D + c];
            }
        }
    }
    free(p);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: gpu_attention_check ARCHIVE\n");
        return 2;
    }
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!cuda) {
        fprintf(stderr, "gpu_attention_check: no CUDA driver (%s)\n", dlerror());
        return 2;
    }
    bind(cuda, "cuInit", &cu_init);
    bind(cuda, "cuDeviceGet", &cu_device_get);
    bind(cuda, "cuDevicePrimaryCtxRetain", &cu_ctx_retain);
    bind(cuda, "cuCtxSetCurrent", &cu_ctx_set);
    bind(cuda, "cuMemAlloc_v2", &cu_alloc);
    bind(cuda, "cuMemFree_v2", &cu_free);
    bind(cuda, "cuMemcpyHtoD_v2", &cu_htod);
    bind(cuda, "cuMemcpyDtoH_v2", &cu_dtoh);
    bind(cuda, "cuCtxSynchronize", &cu_sync);
    int dev = 0;
    void *ctx = NULL;
    if (cu_init(0) || cu_device_get(&dev, 0) || cu_ctx_retain(&ctx, dev) || cu_ctx_set(ctx)) {
        fprintf(stderr, "gpu_attention_check: cannot set up the CUDA context\n");
        return 2;
    }
    aotr_runtime *rt = NULL;
    aotr_runtime_options opts = {(uint32_t)sizeof opts, NULL, NULL, AOTR_BACKEND_CUDA};
    if (aotr_runtime_create(&opts, &rt) || aotr_runtime_add_archive(rt, argv[1])) {
        fprintf(stderr, "gpu_attention_check: %s\n", aotr_last_error());
        return 1;
    }
    enum { B = 2, H = 3, S = 96, D = 64 };
    const size_t n = (size_t)B * H * S * D;
    const int64_t shape[4] = {B, H, S, D}, lshape[3] = {B, H, S};
    int failures = 0;
    for (int causal = 0; causal < 2; causal++) {
        float *x[4];
        srand(1234 + causal);
        for (int t = 0; t < 4; t++) {
            x[t] = (float *)malloc(n * sizeof(float));
            for (size_t i = 0; i < n;
                 i++) /* fp16-exact inputs: the reference sees what the GPU sees */
                x[t][i] = from_half(to_half((float)rand() / (float)RAND_MAX * 2.0f - 1.0f));
        }
        devptr dq_ = upload(x[0], n), dk_ = upload(x[1], n), dv_ = upload(x[2], n);
        devptr ddo = upload(x[3], n), dout = 0, dlse = 0, ddelta = 0, gq = 0, gk = 0, gv = 0;
        cu_alloc(&dout, n * 2);
        cu_alloc(&gq, n * 2);
        cu_alloc(&gk, n * 2);
        cu_alloc(&gv, n * 2);
        cu_alloc(&dlse, (size_t)B * H * S * 4);
        cu_alloc(&ddelta, (size_t)B * H * S * 4);
        float scale = 1.0f / sqrtf((float)D);
        aotr_attn_fwd_params f;
        memset(&f, 0, sizeof f);
        f.struct_size = sizeof f;
        f.problem.q = view(dq_, AOTR_FP16, 4, shape);
        f.problem.k = view(dk_, AOTR_FP16, 4, shape);
        f.problem.v = view(dv_, AOTR_FP16, 4, shape);
        f.problem.scale = scale;
        f.problem.causal = causal;
        f.problem.window_left = f.problem.window_right = -1;
        f.out = view(dout, AOTR_FP16, 4, shape);
        f.lse = view(dlse, AOTR_FP32, 3, lshape);
        aotr_attn_bwd_params b;
        memset(&b, 0, sizeof b);
        b.struct_size = sizeof b;
        b.problem = f.problem;
        b.out = f.out;
        b.lse = f.lse;
        b.grad_out = view(ddo, AOTR_FP16, 4, shape);
        b.grad_q = view(gq, AOTR_FP16, 4, shape);
        b.grad_k = view(gk, AOTR_FP16, 4, shape);
        b.grad_v = view(gv, AOTR_FP16, 4, shape);
        b.delta = view(ddelta, AOTR_FP32, 3, lshape);
        aotr_status st = aotr_attn_fwd(rt, &f);
        if (st == AOTR_OK)
            st = aotr_attn_bwd(rt, &b);
        if (st != AOTR_OK || cu_sync()) {
            fprintf(stderr, "gpu_attention_check: %s: %s\n", aotr_status_name(st),
                    aotr_last_error());
            return 1;
        }
        float *got[4] = {download(dout, n), download(gq, n), download(gk, n), download(gv, n)};
        float *want[4];
        for (int t = 0; t < 4; t++)
            want[t] = (float *)malloc(n * sizeof(float));
        for (int bh = 0; bh < B * H; bh++) {
            size_t o = (size_t)bh * S * D;
            reference(S, D, causal, scale, x[0] + o, x[1] + o, x[2] + o, x[3] + o, want[0] + o,
                      want[1] + o, want[2] + o, want[3] + o);
        }
        const char *names[4] = {"out", "dq", "dk", "dv"};
        printf("{\"case\": \"fp16 B%d H%d S%d D%d causal=%d\"", B, H, S, D, causal);
        for (int t = 0; t < 4; t++) {
            float err = max_err(got[t], want[t], n);
            /* fp16 outputs and fp16 inputs to the dots: errors of a few 1e-3 */
            int ok = err < 2e-2f;
            failures += !ok;
            printf(", \"%s_max_err\": %.2e, \"%s_ok\": %s", names[t], (double)err, names[t],
                   ok ? "true" : "false");
            free(got[t]);
            free(want[t]);
        }
        printf(", \"launches\": %llu}\n", (unsigned long long)aotr_runtime_launch_count(rt, NULL));
        for (int t = 0; t < 4; t++)
            free(x[t]);
        devptr all[] = {dq_, dk_, dv_, ddo, dout, dlse, ddelta, gq, gk, gv};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            cu_free(all[i]);
    }
    aotr_runtime_destroy(rt);
    return failures ? 1 : 0;
}
