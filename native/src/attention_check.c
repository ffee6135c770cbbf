/* FlashAttention requests: the checks of the problem (aotr_attn_check, and
 * aotr_attn_supported, which asks the device's kernel tables too) and of the
 * tensors a call passes, before any argument value is bound. aotr_attn_check's
 * callers stay in this file: abidw keeps the record of a function from the
 * first file by path that names it, and a call from attention.c would make
 * that a declaration without its symbol (abi-check: "aotr_attn_check
 * removed"). */
#include <math.h>
#include <stdio.h>

#include "attention_internal.h"
#include "slots.h"

#define INT32_LIMIT 2147483647LL
#define MAX_HEAD_DIM 512
#define MAX_BLOCK 256 /* the largest BLOCK_M / BLOCK_N of any config */

/* -- tensors and problems --------------------------------------------------- */

int aotr_layout_ok(const aotr_tensor *t)
{
    if (!t || t->rank < 0 || t->rank > AOTR_MAX_RANK)
        return 0;
    uint64_t bits = (uint64_t)(uintptr_t)t->data;
    if (t->rank == 0)
        return !(bits & 15u);
    if (t->strides[t->rank - 1] != 1)
        return 0;
    for (int i = 0; i < t->rank - 1; i++)
        bits |= (uint64_t)t->strides[i];
    return !(bits & 15u);
}

static const char *dtype_text(int32_t dtype)
{
    switch (dtype) {
    case AOTR_FP16: return "fp16";
    case AOTR_BF16: return "bf16";
    case AOTR_FP32: return "fp32";
    case AOTR_INT32: return "int32";
    case AOTR_INT64: return "int64";
    default: return "an unknown dtype";
    }
}

aotr_status aotr_check_tensor(const aotr_tensor *t, const char *name)
{
    if (t->rank < 0 || t->rank > AOTR_MAX_RANK)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "%s: rank %d is outside 0..%d", name, t->rank,
                         AOTR_MAX_RANK);
    for (int i = 0; i < t->rank; i++)
        if (t->sizes[i] < 0)
            return aotr_fail(AOTR_INVALID_ARGUMENT, "%s: negative size", name);
    return AOTR_OK;
}

int aotr_same_shape(const aotr_tensor *a, const aotr_tensor *b)
{
    if (a->rank != b->rank)
        return 0;
    for (int i = 0; i < a->rank; i++)
        if (a->sizes[i] != b->sizes[i])
            return 0;
    return 1;
}

/* Shaped alike but for the last (head) dim. */
static int same_rows(const aotr_tensor *a, const aotr_tensor *b)
{
    if (a->rank != b->rank || a->rank < 1)
        return 0;
    for (int i = 0; i < a->rank - 1; i++)
        if (a->sizes[i] != b->sizes[i])
            return 0;
    return 1;
}

aotr_status aotr_problem_dims(const aotr_attn_problem *p, aotr_attn_dims *d)
{
    aotr_status st;
    if ((st = aotr_check_tensor(&p->q, "q")) || (st = aotr_check_tensor(&p->k, "k")) ||
        (st = aotr_check_tensor(&p->v, "v")))
        return st;
    d->varlen = aotr_present(&p->cu_seqlens_q) || aotr_present(&p->cu_seqlens_k);
    int rank = d->varlen ? 3 : 4;
    if (p->q.rank != rank || p->k.rank != rank || p->v.rank != rank)
        return aotr_fail(AOTR_UNSUPPORTED, "query/key/value must be %d-D %s", rank,
                         d->varlen ? "(total, heads, head_dim)"
                                   : "(batch, heads, seqlen, head_dim)");
    if (d->varlen) {
        if (!aotr_present(&p->cu_seqlens_q) || !aotr_present(&p->cu_seqlens_k))
            return aotr_fail(AOTR_UNSUPPORTED, "cu_seqlens_q and cu_seqlens_k must be "
                                               "given together");
        const aotr_tensor *cu[2] = {&p->cu_seqlens_q, &p->cu_seqlens_k};
        for (int i = 0; i < 2; i++)
            if (cu[i]->dtype != AOTR_INT32 || cu[i]->rank != 1)
                return aotr_fail(AOTR_UNSUPPORTED, "%s must be a 1-D int32 tensor",
                                 i ? "cu_seqlens_k" : "cu_seqlens_q");
        if (p->cu_seqlens_q.sizes[0] != p->cu_seqlens_k.sizes[0] || p->cu_seqlens_q.sizes[0] < 1)
            return aotr_fail(AOTR_UNSUPPORTED, "cu_seqlens_q and cu_seqlens_k must have the "
                                               "same length (batch + 1)");
        if (p->max_seqlen_q < 0 || p->max_seqlen_k < 0)
            return aotr_fail(AOTR_INVALID_ARGUMENT, "max_seqlen_q/k must be >= 0");
        d->b = p->cu_seqlens_q.sizes[0] - 1;
        d->h = p->q.sizes[1];
        d->hk = p->k.sizes[1];
        d->sq = p->max_seqlen_q;
        d->sk = p->max_seqlen_k;
        d->d = p->q.sizes[2];
        d->dv = p->v.sizes[2];
    } else {
        d->b = p->q.sizes[0];
        d->h = p->q.sizes[1];
        d->hk = p->k.sizes[1];
        d->sq = p->q.sizes[2];
        d->sk = p->k.sizes[2];
        d->d = p->q.sizes[3];
        d->dv = p->v.sizes[3];
    }
    return AOTR_OK;
}

/* (z, h, row) strides of q/k/v-like tensors; a packed batch has no z stride. */
void aotr_zhm(const aotr_tensor *t, int varlen, int64_t out[3])
{
    if (varlen) {
        out[0] = 0;
        out[1] = t->strides[1];
        out[2] = t->strides[0];
    } else {
        out[0] = t->strides[0];
        out[1] = t->strides[1];
        out[2] = t->strides[2];
    }
}

aotr_status aotr_attn_check(const aotr_attn_problem *p)
{
    if (!p)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "aotr_attn_check: `problem` is NULL");
    aotr_attn_dims d;
    aotr_status st = aotr_problem_dims(p, &d);
    if (st != AOTR_OK)
        return st;
    int32_t dtype = p->q.dtype;
    if (p->k.dtype != dtype || p->v.dtype != dtype)
        return aotr_fail(AOTR_UNSUPPORTED, "query, key and value must share a dtype");
    if (dtype != AOTR_FP16 && dtype != AOTR_BF16 && dtype != AOTR_FP32)
        return aotr_fail(AOTR_UNSUPPORTED, "dtype %s is not covered (fp16, bf16 and fp32 are)",
                         dtype_text(dtype));
    if (!same_rows(&p->k, &p->v) || p->q.sizes[p->q.rank - 1] != p->k.sizes[p->k.rank - 1])
        return aotr_fail(AOTR_UNSUPPORTED, "key and value must have one shape but for the "
                                           "head_dim, and query the key's head_dim");
    if (!d.varlen && p->k.sizes[0] != d.b)
        return aotr_fail(AOTR_UNSUPPORTED, "query and key/value batch sizes differ");
    if ((d.hk == 0 && d.h > 0) || (d.hk && d.h % d.hk))
        return aotr_fail(AOTR_UNSUPPORTED,
                         "query heads (%lld) must be a multiple of "
                         "key/value heads (%lld) (GQA/MQA)",
                         (long long)d.h, (long long)d.hk);
    if (d.d < 1 || d.d > MAX_HEAD_DIM)
        return aotr_fail(AOTR_UNSUPPORTED, "head_dim %lld is not covered (1 to %d are)",
                         (long long)d.d, MAX_HEAD_DIM);
    if (d.dv < 1 || d.dv > MAX_HEAD_DIM)
        return aotr_fail(AOTR_UNSUPPORTED,
                         "the value's head_dim %lld is not covered (1 to %d "
                         "are)",
                         (long long)d.dv, MAX_HEAD_DIM);
    if (!(p->dropout_p >= 0.0f && p->dropout_p < 1.0f))
        return aotr_fail(AOTR_UNSUPPORTED, "dropout_p=%g is outside [0, 1)", (double)p->dropout_p);
    if (p->dropout_p > 0.0f && MAX_BLOCK * d.sk > INT32_LIMIT)
        return aotr_fail(AOTR_UNSUPPORTED, "dropout with seqlen_k > 2**23 is not covered");
    if (!isfinite(p->scale))
        return aotr_fail(AOTR_UNSUPPORTED, "scale=%g is not finite", (double)p->scale);
    if (p->causal != 0 && p->causal != 1)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "causal must be 0 or 1, not %d", p->causal);
    if (p->causal_alignment != AOTR_CAUSAL_BOTTOM_RIGHT &&
        p->causal_alignment != AOTR_CAUSAL_TOP_LEFT)
        return aotr_fail(AOTR_INVALID_ARGUMENT,
                         "causal_alignment must be "
                         "AOTR_CAUSAL_BOTTOM_RIGHT or AOTR_CAUSAL_TOP_LEFT, not %d",
                         p->causal_alignment);
    if (d.varlen) {
        if (d.b > INT32_LIMIT || p->q.sizes[0] > INT32_LIMIT || p->k.sizes[0] > INT32_LIMIT)
            return aotr_fail(AOTR_UNSUPPORTED, "more than 2**31 packed rows");
        if (aotr_present(&p->bias))
            return aotr_fail(AOTR_UNSUPPORTED, "an attn_mask with a variable-length batch "
                                               "is not covered");
    }
    if (aotr_present(&p->bias)) {
        if ((st = aotr_check_tensor(&p->bias, "bias")) != AOTR_OK)
            return st;
        if (p->bias.dtype != dtype)
            return aotr_fail(AOTR_UNSUPPORTED,
                             "the bias must have the query's dtype (%s), "
                             "not %s",
                             dtype_text(dtype), dtype_text(p->bias.dtype));
        if (p->bias.rank != 4 || p->bias.sizes[0] != d.b || p->bias.sizes[1] != d.h ||
            p->bias.sizes[2] != d.sq || p->bias.sizes[3] != d.sk)
            return aotr_fail(AOTR_UNSUPPORTED,
                             "the bias must be a (batch, heads, seqlen_q, "
                             "seqlen_k) = (%lld, %lld, %lld, %lld) view (stride 0 where it "
                             "broadcasts)",
                             (long long)d.b, (long long)d.h, (long long)d.sq, (long long)d.sk);
    }
    if (d.sk == 0 && d.sq > 0 && d.b * d.h > 0)
        return aotr_fail(AOTR_UNSUPPORTED, "seqlen_k = 0 (no keys)");
    if (d.b > INT32_LIMIT || d.h > INT32_LIMIT || d.sq > INT32_LIMIT || d.sk > INT32_LIMIT)
        return aotr_fail(AOTR_UNSUPPORTED, "sizes beyond 32 bits are not covered");
    const aotr_tensor *qkv[3] = {&p->q, &p->k, &p->v};
    for (int i = 0; i < 3; i++) {
        int64_t s[3];
        aotr_zhm(qkv[i], d.varlen, s);
        int64_t largest = 0;
        for (int j = 0; j < qkv[i]->rank; j++)
            if (qkv[i]->strides[j] > largest)
                largest = qkv[i]->strides[j];
        /* Strides are 32-bit kernel arguments; offsets inside one block of up
         * to MAX_BLOCK rows are 32-bit too (blocks are offset in 64-bit). */
        if (largest > INT32_LIMIT || s[2] > INT32_LIMIT / MAX_BLOCK)
            return aotr_fail(AOTR_UNSUPPORTED, "strides too large for the kernels' 32-bit "
                                               "stride arguments");
    }
    return AOTR_OK;
}

static uint32_t kernels_needed(uint32_t needs, int kernels[AOTR_KERNEL_COUNT])
{
    uint32_t n = 0;
    kernels[n++] = AOTR_KERNEL_FWD;
    if (needs & AOTR_NEED_BACKWARD) {
        kernels[n++] = AOTR_KERNEL_BWD_PRE;
        kernels[n++] = AOTR_KERNEL_BWD_DKDV;
        kernels[n++] = AOTR_KERNEL_BWD_DQ;
    }
    if (needs & AOTR_NEED_DQ_ACCUM) {
        kernels[n++] = AOTR_KERNEL_BWD_FUSED;
        kernels[n++] = AOTR_KERNEL_BWD_DQ_CONVERT;
    }
    if (needs & AOTR_NEED_PHILOX_STATE)
        kernels[n++] = AOTR_KERNEL_PHILOX_STATE;
    return n;
}

aotr_status aotr_attn_supported(aotr_runtime *rt, int32_t device, const aotr_attn_problem *p,
                                uint32_t needs)
{
    if (!rt)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "aotr_attn_supported: `runtime` is NULL");
    aotr_status st = aotr_attn_check(p);
    if (st != AOTR_OK)
        return st;
    aotr_device *dev = NULL;
    if ((st = aotr_runtime_device(rt, device, &dev)) != AOTR_OK)
        return st;
    aotr_attn_dims d;
    aotr_problem_dims(p, &d);
    int dropout = p->dropout_p > 0.0f || (needs & AOTR_NEED_DEBUG_MASK);
    if ((d.d % 8 || d.dv != d.d) && (needs & AOTR_NEED_DQ_ACCUM))
        return aotr_fail(AOTR_UNSUPPORTED,
                         "head_dim %lld (value %lld): the fused backward (a dQ "
                         "accumulator) serves one head dim, a multiple of 8",
                         (long long)d.d, (long long)d.dv);
    int kernels[AOTR_KERNEL_COUNT];
    uint32_t n = kernels_needed(needs, kernels);
    for (uint32_t i = 0; i < n; i++)
        if (!aotr_device_pick(dev, kernels[i], (aotr_dtype)p->q.dtype,
                              (int32_t)aotr_kernel_head_dim(d.d > d.dv ? d.d : d.dv),
                              aotr_pick_features(aotr_present(&p->bias), dropout, NULL), d.sq,
                              d.sk))
            return AOTR_UNSUPPORTED;
    return AOTR_OK;
}

/* -- the tensors of a call ------------------------------------------------- */

aotr_status aotr_need_layout(const aotr_tensor *t, const char *name)
{
    if (aotr_layout_ok(t))
        return AOTR_OK;
    return aotr_fail(AOTR_NEEDS_LAYOUT,
                     "%s does not meet the kernels' layout assumptions "
                     "(unit last stride, 16-byte aligned base, other strides multiples of 16): "
                     "pass a copy that does",
                     name);
}

aotr_status aotr_need_like(const aotr_tensor *t, const aotr_tensor *model, const char *name,
                           const char *model_name)
{
    aotr_status st = aotr_check_tensor(t, name);
    if (st != AOTR_OK)
        return st;
    if (!aotr_present(t) || !aotr_same_shape(t, model) || t->dtype != model->dtype)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "%s must be given, shaped and typed like %s", name,
                         model_name);
    return aotr_need_layout(t, name);
}

/* (z, h) strides of the logsumexp (and Delta): (B, H, >= Sq) dense, (H, total) packed. */
aotr_status aotr_check_lse(const aotr_tensor *lse, const aotr_attn_dims *d, const char *name,
                           int64_t out[2])
{
    aotr_status st = aotr_check_tensor(lse, name);
    if (st != AOTR_OK)
        return st;
    int ok = aotr_present(lse) && lse->dtype == AOTR_FP32;
    if (ok && d->varlen)
        ok = lse->rank == 2 && lse->sizes[0] == d->h && lse->sizes[1] >= 0;
    else if (ok)
        ok = lse->rank == 3 && lse->sizes[0] == d->b && lse->sizes[1] == d->h &&
             lse->sizes[2] >= d->sq;
    if (!ok)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "%s must be an fp32 %s tensor", name,
                         d->varlen ? "(heads, total_q)" : "(batch, heads, >= seqlen_q)");
    if (!aotr_lse_layout(lse, d->varlen, out))
        return aotr_fail(AOTR_NEEDS_LAYOUT,
                         "%s needs a unit last stride and a 16-byte "
                         "aligned base: pass a contiguous copy",
                         name);
    return AOTR_OK;
}

int aotr_lse_layout(const aotr_tensor *lse, int varlen, int64_t strides[2])
{
    /* (a last dim of one row is never strided over) */
    int last = lse->rank - 1;
    if ((lse->sizes[last] > 1 && lse->strides[last] != 1) || ((uintptr_t)lse->data & 15u))
        return 0;
    strides[0] = varlen ? 0 : lse->strides[0];
    strides[1] = varlen ? lse->strides[0] : lse->strides[1];
    return 1;
}

aotr_status aotr_alibi_strides(const aotr_tensor *a, int64_t batch, int64_t heads,
                               int64_t strides[2])
{
    aotr_status st = aotr_check_tensor(a, "alibi_slopes");
    if (st != AOTR_OK)
        return st;
    if (a->dtype != AOTR_FP32)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "alibi_slopes must be fp32, not %s",
                         dtype_text(a->dtype));
    int per_head = a->rank == 1 && a->sizes[0] == heads;
    int per_batch = a->rank == 2 && a->sizes[0] == batch && a->sizes[1] == heads;
    if (!per_head && !per_batch)
        return aotr_fail(AOTR_INVALID_ARGUMENT,
                         "alibi_slopes must be (heads,) = (%lld,) or "
                         "(batch, heads) = (%lld, %lld)",
                         (long long)heads, (long long)batch, (long long)heads);
    if ((uintptr_t)a->data & 3u)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "alibi_slopes: the address is not 4-byte "
                                                "aligned");
    strides[0] = per_head ? 0 : a->strides[0];
    strides[1] = a->strides[a->rank - 1];
    return AOTR_OK;
}

/* What every entry point checks first: the runtime and the params given, and
 * their struct_size at least `minimum`. */
aotr_status aotr_check_call(const aotr_runtime *rt, const void *params, uint32_t struct_size,
                            size_t minimum, const char *what)
{
    if (!params)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "%s: `params` is NULL", what);
    if (!rt)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "%s: `runtime` is NULL", what);
    if (struct_size < minimum)
        return aotr_fail(AOTR_INVALID_ARGUMENT,
                         "%s: params->struct_size is %u, at least %zu "
                         "(set it to sizeof the params struct)",
                         what, struct_size, minimum);
    return AOTR_OK;
}

aotr_status aotr_attn_begin(aotr_runtime *rt, const void *params, uint32_t struct_size,
                            size_t minimum, const aotr_attn_problem *p, aotr_attn_dims *d,
                            const char *what)
{
    aotr_status st = aotr_check_call(rt, params, struct_size, minimum, what);
    if (st == AOTR_OK)
        st = aotr_attn_check(p);
    if (st == AOTR_OK)
        aotr_problem_dims(p, d);
    return st;
}

aotr_status aotr_shaped_like(const aotr_tensor *t, const aotr_tensor *model, const char *name,
                             const char *model_name)
{
    aotr_status st = aotr_check_tensor(t, name);
    if (st == AOTR_OK &&
        (!aotr_present(t) || !aotr_same_shape(t, model) || t->dtype != model->dtype))
        st = aotr_fail(AOTR_INVALID_ARGUMENT, "%s must be given, shaped and typed like %s", name,
                       model_name);
    return st;
}

/* out and grad_out: q's rows, the value's head dim. */
aotr_status aotr_shaped_like_out(const aotr_tensor *t, const aotr_attn_problem *p, const char *name)
{
    aotr_status st = aotr_check_tensor(t, name);
    if (st == AOTR_OK && (!aotr_present(t) || !same_rows(t, &p->q) || t->dtype != p->q.dtype ||
                          t->sizes[t->rank - 1] != p->v.sizes[p->v.rank - 1]))
        st = aotr_fail(AOTR_INVALID_ARGUMENT,
                       "%s must be given, shaped like q with the value's "
                       "head_dim, typed like q",
                       name);
    return st;
}
