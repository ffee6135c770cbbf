/* FlashAttention forward and backward: the entry points, checked by
 * attention_check.c and bound by attention_values.c; head dims that are not
 * a multiple of 8 on staged copies (stage.c). */
#include <stddef.h>
#include <string.h>

#include "attention_internal.h"
#include "slots.h"

/* The caller's params, its struct_size kept, fields past it zero. */
static void params_copy(void *dst, const void *src, size_t size, uint32_t struct_size)
{
    memset(dst, 0, size);
    memcpy(dst, src, struct_size < size ? struct_size : size);
}

/* The head dim the staged copies run at: both dims' next multiple of 8. */
static int64_t staged_width(const aotr_attn_dims *d)
{
    return aotr_kernel_head_dim(d->d > d->dv ? d->d : d->dv);
}

/* A head dim that is not a multiple of 8: the same call on zero-padded
 * copies (stage.c) at the next multiple of 8. */
static aotr_status staged_fwd(aotr_runtime *rt, const aotr_attn_fwd_params *params,
                              const aotr_attn_dims *d)
{
    aotr_status st = aotr_shaped_like_out(&params->out, &params->problem, "out");
    aotr_device *dev = NULL;
    if (st == AOTR_OK)
        st = aotr_runtime_device(rt, params->device, &dev);
    if (st != AOTR_OK)
        return st;
    aotr_attn_fwd_params p;
    params_copy(&p, params, sizeof p, params->struct_size);
    int64_t width = staged_width(d);
    aotr_stage s;
    aotr_stage_init(&s, dev, params->stream);
    if ((st = aotr_stage_add(&s, &p.problem.q, "q", 0, width)) ||
        (st = aotr_stage_add(&s, &p.problem.k, "k", 0, width)) ||
        (st = aotr_stage_add(&s, &p.problem.v, "v", 0, width)) ||
        (st = aotr_stage_add(&s, &p.out, "out", aotr_varlen_fwd_places(params) ? 3 : 1, width)) ||
        (st = aotr_stage_begin(&s)))
        return st;
    return aotr_stage_end(&s, aotr_attn_fwd(rt, &p));
}

/* A field appended to a params struct, or NULL where struct_size ends
 * before it. */
static const aotr_tensor *appended(uint32_t struct_size, size_t at, const aotr_tensor *t)
{
    return struct_size >= at + sizeof(aotr_tensor) ? t : NULL;
}

/* The kernels' CU_Q, CU_K and varlen for the call (see aotr_placement). */
static aotr_status place(aotr_runtime *rt, int32_t device, void *stream, const aotr_attn_problem *p,
                         const aotr_tensor *const fields[3], aotr_placement *pl, aotr_arg_value *v)
{
    aotr_status st =
        aotr_placement_begin(rt, device, stream, p, fields[0], fields[1], fields[2], pl);
    if (st != AOTR_OK)
        return aotr_placement_end(pl, st);
    if (pl->word) {
        v[AOTR_SLOT_CU_Q].p = pl->cu_q;
        v[AOTR_SLOT_CU_K].p = pl->cu_k;
    }
    v[AOTR_SLOT_varlen].i32 = pl->word;
    return AOTR_OK;
}

static aotr_status attn_fwd(aotr_runtime *rt, const aotr_attn_fwd_params *params);

aotr_status aotr_attn_fwd(aotr_runtime *rt, const aotr_attn_fwd_params *params)
{
    if (rt && params && params->struct_size >= offsetof(aotr_attn_fwd_params, softcap) &&
        aotr_varlen_fwd_places(params)) {
        aotr_attn_fwd_params f;
        params_copy(&f, params, sizeof f, params->struct_size);
        aotr_placed_problem(&f.problem, &f.seq_starts_k, &f.seqlens_k);
        return attn_fwd(rt, &f);
    }
    return attn_fwd(rt, params);
}

static aotr_status attn_fwd(aotr_runtime *rt, const aotr_attn_fwd_params *params)
{
    const aotr_attn_problem *p = params ? &params->problem : NULL;
    aotr_attn_dims d;
    aotr_status st =
        aotr_attn_begin(rt, params, params ? params->struct_size : 0,
                        offsetof(aotr_attn_fwd_params, softcap), p, &d, "aotr_attn_fwd");
    if (st != AOTR_OK)
        return st;
    if (d.d % 8 || d.dv != d.d)
        return staged_fwd(rt, params, &d);
    if ((st = aotr_need_like(&params->out, &p->q, "out", "q")) != AOTR_OK)
        return st;
    aotr_arg_value v[AOTR_ARG_SLOTS];
    memset(v, 0, sizeof v);
    int64_t lse_s[2];
    if ((st = aotr_check_lse(&params->lse, &d, "lse", lse_s)) != AOTR_OK)
        return st;
    if (d.b * d.h * d.sq == 0)
        return AOTR_OK; /* nothing to compute */
    const aotr_tensor *dm = &params->debug_mask;
    int store_dmask = aotr_present(dm);
    if (store_dmask) {
        /* Variable-length batches too: (batch, heads, max_seqlen_q,
         * max_seqlen_k), sequence z at the top left of [z]. */
        int ok = dm->rank == 4 && dm->dtype == p->q.dtype && dm->sizes[0] == d.b &&
                 dm->sizes[1] == d.h && dm->sizes[2] == d.sq && dm->sizes[3] == d.sk &&
                 dm->strides[3] == 1 && dm->strides[2] == d.sk && dm->strides[1] == d.sq * d.sk &&
                 dm->strides[0] == d.h * d.sq * d.sk;
        if (!ok)
            return aotr_fail(AOTR_INVALID_ARGUMENT,
                             "debug_mask must be a contiguous (batch, "
                             "heads, seqlen_q, seqlen_k) tensor of the query's dtype");
    }
    int dropout = p->dropout_p > 0.0f || store_dmask;
    if ((st = aotr_common_values(p, &d, dropout, v)) != AOTR_OK)
        return st;
    aotr_score_mod mod = aotr_score_mod_of(
        params->struct_size, offsetof(aotr_attn_fwd_params, alibi_slopes),
        offsetof(aotr_attn_fwd_params, softcap), &params->alibi_slopes, params->softcap);
    if ((st = aotr_score_mod_values(&mod, &d, p->q.data, v)) != AOTR_OK)
        return st;
    v[AOTR_SLOT_O].p = params->out.data;
    v[AOTR_SLOT_LSE].p = params->lse.data;
    v[AOTR_SLOT_DMASK].p = store_dmask ? dm->data : p->q.data;
    v[AOTR_SLOT_store_dmask].i32 = store_dmask;
    if ((st = aotr_set_zhm(v, AOTR_SLOT_stride_oz, &params->out, d.varlen)) ||
        (st = aotr_set_strides(v, AOTR_SLOT_stride_lz, lse_s, 2)))
        return st;
    aotr_device *dev = NULL;
    if ((st = aotr_runtime_device(rt, params->device, &dev)) != AOTR_OK)
        return st;
    unsigned features = aotr_pick_features(aotr_present(&p->bias), dropout, &mod);
    const aotr_launchable *k = aotr_device_pick(dev, AOTR_KERNEL_FWD, (aotr_dtype)p->q.dtype,
                                                (int32_t)d.d, features, d.sq, d.sk);
    if (!k)
        return AOTR_UNSUPPORTED;
    if ((st = aotr_score_mod_declared(k, v)) != AOTR_OK)
        return st;
    const uint32_t n = params->struct_size;
    const aotr_tensor *const fields[3] = {
        appended(n, offsetof(aotr_attn_fwd_params, seq_starts_q), &params->seq_starts_q),
        appended(n, offsetof(aotr_attn_fwd_params, seq_starts_k), &params->seq_starts_k),
        appended(n, offsetof(aotr_attn_fwd_params, seqlens_k), &params->seqlens_k)};
    aotr_placement pl;
    if ((st = place(rt, params->device, params->stream, p, fields, &pl, v)) != AOTR_OK)
        return st;
    st = aotr_attn_launch(rt, dev, k, aotr_cdiv(d.sq, aotr_launchable_block_m(k)), d.b * d.h,
                          params->stream, v);
    return aotr_placement_end(&pl, st);
}

/* The fused route: Delta, then dK, dV and the fp32 sum of dQ in one pass
 * over the key blocks, then dQ from that sum. */
static aotr_status fused_backward(aotr_runtime *rt, aotr_device *dev, const aotr_launchable *pre,
                                  const aotr_launchable *fused, const aotr_launchable *conv,
                                  const aotr_tensor *acc, const aotr_attn_dims *d, void *stream,
                                  aotr_arg_value *v)
{
    aotr_status st;
    v[AOTR_SLOT_DQ_ACC].p = acc->data;
    if ((st = aotr_set_zhm(v, AOTR_SLOT_stride_dqaz, acc, d->varlen)) ||
        (st = aotr_launchable_check(pre, v)) || (st = aotr_launchable_check(fused, v)) ||
        (st = aotr_launchable_check(conv, v)))
        return st;
    if ((st = aotr_attn_launch(rt, dev, pre, aotr_cdiv(d->sq, aotr_launchable_block_m(pre)),
                               d->b * d->h, stream, v)) != AOTR_OK)
        return st;
    if ((st = aotr_attn_launch(rt, dev, fused, aotr_cdiv(d->sk, aotr_launchable_block_n(fused)),
                               d->b * d->hk, stream, v)) != AOTR_OK)
        return st;
    return aotr_attn_launch(rt, dev, conv, aotr_cdiv(d->sq, aotr_launchable_block_m(conv)),
                            d->b * d->h, stream, v);
}

/* See staged_fwd; the split backward (a dQ accumulator shaped like the
 * caller's q would not fit the copies). */
static aotr_status staged_bwd(aotr_runtime *rt, const aotr_attn_bwd_params *params,
                              const aotr_attn_dims *d)
{
    const aotr_attn_problem *q = &params->problem;
    aotr_status st;
    if ((st = aotr_shaped_like_out(&params->out, q, "out")) ||
        (st = aotr_shaped_like_out(&params->grad_out, q, "grad_out")) ||
        (st = aotr_shaped_like(&params->grad_q, &q->q, "grad_q", "q")) ||
        (st = aotr_shaped_like(&params->grad_k, &q->k, "grad_k", "k")) ||
        (st = aotr_shaped_like(&params->grad_v, &q->v, "grad_v", "v")))
        return st;
    aotr_device *dev = NULL;
    if ((st = aotr_runtime_device(rt, params->device, &dev)) != AOTR_OK)
        return st;
    aotr_attn_bwd_params p;
    params_copy(&p, params, sizeof p, params->struct_size);
    memset(&p.grad_q_accum, 0, sizeof p.grad_q_accum);
    int64_t width = staged_width(d);
    const int out = aotr_varlen_bwd_places(params) ? 3 : 1;
    aotr_stage s;
    aotr_stage_init(&s, dev, params->stream);
    if ((st = aotr_stage_add(&s, &p.problem.q, "q", 0, width)) ||
        (st = aotr_stage_add(&s, &p.problem.k, "k", 0, width)) ||
        (st = aotr_stage_add(&s, &p.problem.v, "v", 0, width)) ||
        (st = aotr_stage_add(&s, &p.out, "out", 0, width)) ||
        (st = aotr_stage_add(&s, &p.grad_out, "grad_out", 0, width)) ||
        (st = aotr_stage_add(&s, &p.grad_q, "grad_q", out, width)) ||
        (st = aotr_stage_add(&s, &p.grad_k, "grad_k", out, width)) ||
        (st = aotr_stage_add(&s, &p.grad_v, "grad_v", out, width)) || (st = aotr_stage_begin(&s)))
        return st;
    return aotr_stage_end(&s, aotr_attn_bwd(rt, &p));
}

static aotr_status attn_bwd(aotr_runtime *rt, const aotr_attn_bwd_params *params);

aotr_status aotr_attn_bwd(aotr_runtime *rt, const aotr_attn_bwd_params *params)
{
    if (rt && params && params->struct_size >= offsetof(aotr_attn_bwd_params, softcap) &&
        aotr_varlen_bwd_places(params)) {
        aotr_attn_bwd_params g;
        params_copy(&g, params, sizeof g, params->struct_size);
        aotr_placed_problem(&g.problem, &g.seq_starts_k, &g.seqlens_k);
        return attn_bwd(rt, &g);
    }
    return attn_bwd(rt, params);
}

/* The backward's launches once its values are bound: the fused route where
 * a dQ accumulator is given and the image has its kernels, else the split. */
static aotr_status bwd_launches(aotr_runtime *rt, aotr_device *dev, const aotr_attn_problem *p,
                                const aotr_attn_dims *d, unsigned features, const aotr_tensor *acc,
                                void *stream, aotr_arg_value *v)
{
    aotr_dtype dtype = (aotr_dtype)p->q.dtype;
    const aotr_launchable *pre =
        aotr_device_pick(dev, AOTR_KERNEL_BWD_PRE, dtype, (int32_t)d->d, 0, d->sq, d->sk);
    if (!pre)
        return AOTR_UNSUPPORTED;
    if (acc) {
        const aotr_launchable *fused = aotr_device_pick(dev, AOTR_KERNEL_BWD_FUSED, dtype,
                                                        (int32_t)d->d, features, d->sq, d->sk);
        const aotr_launchable *conv = fused
                                          ? aotr_device_pick(dev, AOTR_KERNEL_BWD_DQ_CONVERT, dtype,
                                                             (int32_t)d->d, 0, d->sq, d->sk)
                                          : NULL;
        if (conv)
            return fused_backward(rt, dev, pre, fused, conv, acc, d, stream, v);
        aotr_clear_error(); /* no fused kernels for this problem: the split ones below */
    }
    const aotr_launchable *dkdv =
        aotr_device_pick(dev, AOTR_KERNEL_BWD_DKDV, dtype, (int32_t)d->d, features, d->sq, d->sk);
    const aotr_launchable *dq = dkdv ? aotr_device_pick(dev, AOTR_KERNEL_BWD_DQ, dtype,
                                                        (int32_t)d->d, features, d->sq, d->sk)
                                     : NULL;
    if (!dq)
        return AOTR_UNSUPPORTED;
    /* Check all three before the first launch, so a refusal launches nothing. */
    aotr_status st;
    if ((st = aotr_launchable_check(pre, v)) || (st = aotr_launchable_check(dkdv, v)) ||
        (st = aotr_launchable_check(dq, v)) || (st = aotr_score_mod_declared(dkdv, v)) ||
        (st = aotr_score_mod_declared(dq, v)))
        return st;
    if ((st = aotr_attn_launch(rt, dev, pre, aotr_cdiv(d->sq, aotr_launchable_block_m(pre)),
                               d->b * d->h, stream, v)) != AOTR_OK)
        return st;
    if ((st = aotr_attn_launch(rt, dev, dkdv, aotr_cdiv(d->sk, aotr_launchable_block_n(dkdv)),
                               d->b * d->hk, stream, v)) != AOTR_OK)
        return st;
    return aotr_attn_launch(rt, dev, dq, aotr_cdiv(d->sq, aotr_launchable_block_m(dq)), d->b * d->h,
                            stream, v);
}

static aotr_status attn_bwd(aotr_runtime *rt, const aotr_attn_bwd_params *params)
{
    const aotr_attn_problem *p = params ? &params->problem : NULL;
    aotr_attn_dims d;
    aotr_status st =
        aotr_attn_begin(rt, params, params ? params->struct_size : 0,
                        offsetof(aotr_attn_bwd_params, softcap), p, &d, "aotr_attn_bwd");
    if (st != AOTR_OK)
        return st;
    if (d.d % 8 || d.dv != d.d)
        return staged_bwd(rt, params, &d);
    if ((st = aotr_need_like(&params->out, &p->q, "out", "q")) ||
        (st = aotr_need_like(&params->grad_out, &p->q, "grad_out", "q")) ||
        (st = aotr_need_like(&params->grad_q, &p->q, "grad_q", "q")) ||
        (st = aotr_need_like(&params->grad_k, &p->k, "grad_k", "k")) ||
        (st = aotr_need_like(&params->grad_v, &p->v, "grad_v", "v")))
        return st;
    int64_t lse_s[2], delta_s[2];
    if ((st = aotr_check_lse(&params->lse, &d, "lse", lse_s)) ||
        (st = aotr_check_lse(&params->delta, &d, "delta", delta_s)))
        return st;
    if (delta_s[0] != lse_s[0] || delta_s[1] != lse_s[1] ||
        !aotr_same_shape(&params->delta, &params->lse))
        return aotr_fail(AOTR_INVALID_ARGUMENT, "delta must be shaped and strided like lse");
    if (aotr_numel(&p->q) == 0 || aotr_numel(&p->k) == 0) {
        if (aotr_numel(&params->grad_k) == 0 && aotr_numel(&params->grad_q) == 0)
            return AOTR_OK;
        return aotr_fail(AOTR_UNSUPPORTED,
                         "an empty query or key/value: the gradients are "
                         "zeros, which this library does not write (it allocates and clears "
                         "no device memory)");
    }
    const aotr_tensor *db = &params->grad_bias;
    int store_dbias = aotr_present(db);
    if (store_dbias) {
        if (!aotr_present(&p->bias) || !aotr_same_shape(db, &p->bias) || db->dtype != p->bias.dtype)
            return aotr_fail(AOTR_INVALID_ARGUMENT, "grad_bias needs a bias, and must be "
                                                    "shaped and typed like it");
        if ((st = aotr_need_layout(db, "grad_bias")) != AOTR_OK)
            return st;
    }
    aotr_arg_value v[AOTR_ARG_SLOTS];
    memset(v, 0, sizeof v);
    int dropout = p->dropout_p > 0.0f;
    if ((st = aotr_common_values(p, &d, dropout, v)) != AOTR_OK)
        return st;
    aotr_score_mod mod = aotr_score_mod_of(
        params->struct_size, offsetof(aotr_attn_bwd_params, alibi_slopes),
        offsetof(aotr_attn_bwd_params, softcap), &params->alibi_slopes, params->softcap);
    if ((st = aotr_score_mod_values(&mod, &d, p->q.data, v)) != AOTR_OK)
        return st;
    v[AOTR_SLOT_O].p = params->out.data;
    v[AOTR_SLOT_DO].p = params->grad_out.data;
    v[AOTR_SLOT_LSE].p = params->lse.data;
    v[AOTR_SLOT_Delta].p = params->delta.data;
    v[AOTR_SLOT_DQ].p = params->grad_q.data;
    v[AOTR_SLOT_DK].p = params->grad_k.data;
    v[AOTR_SLOT_DV].p = params->grad_v.data;
    v[AOTR_SLOT_DBIAS].p = store_dbias ? db->data : p->q.data;
    v[AOTR_SLOT_store_dbias].i32 = store_dbias;
    if ((st = aotr_set_zhm(v, AOTR_SLOT_stride_oz, &params->out, d.varlen)) ||
        (st = aotr_set_zhm(v, AOTR_SLOT_stride_doz, &params->grad_out, d.varlen)) ||
        (st = aotr_set_zhm(v, AOTR_SLOT_stride_dqz, &params->grad_q, d.varlen)) ||
        (st = aotr_set_zhm(v, AOTR_SLOT_stride_dkz, &params->grad_k, d.varlen)) ||
        (st = aotr_set_zhm(v, AOTR_SLOT_stride_dvz, &params->grad_v, d.varlen)) ||
        (st = aotr_set_strides(v, AOTR_SLOT_stride_lz, lse_s, 2)))
        return st;
    if (store_dbias && (st = aotr_set_strides(v, AOTR_SLOT_stride_dbz, db->strides, 3)) != AOTR_OK)
        return st;
    const aotr_tensor *acc = NULL;
    if (params->struct_size >= offsetof(aotr_attn_bwd_params, grad_q_accum) + sizeof(aotr_tensor) &&
        aotr_present(&params->grad_q_accum)) {
        acc = &params->grad_q_accum;
        if ((st = aotr_check_tensor(acc, "grad_q_accum")) != AOTR_OK)
            return st;
        if (acc->dtype != AOTR_FP32 || !aotr_same_shape(acc, &p->q))
            return aotr_fail(AOTR_INVALID_ARGUMENT, "grad_q_accum must be an fp32 tensor shaped "
                                                    "like q");
        if ((st = aotr_need_layout(acc, "grad_q_accum")) != AOTR_OK)
            return st;
    }
    aotr_device *dev = NULL;
    if ((st = aotr_runtime_device(rt, params->device, &dev)) != AOTR_OK)
        return st;
    const uint32_t n = params->struct_size;
    const aotr_tensor *const fields[3] = {
        appended(n, offsetof(aotr_attn_bwd_params, seq_starts_q), &params->seq_starts_q),
        appended(n, offsetof(aotr_attn_bwd_params, seq_starts_k), &params->seq_starts_k),
        appended(n, offsetof(aotr_attn_bwd_params, seqlens_k), &params->seqlens_k)};
    aotr_placement pl;
    if ((st = place(rt, params->device, params->stream, p, fields, &pl, v)) != AOTR_OK)
        return st;
    st = bwd_launches(rt, dev, p, &d, aotr_pick_features(aotr_present(&p->bias), dropout, &mod),
                      acc, params->stream, v);
    return aotr_placement_end(&pl, st);
}
