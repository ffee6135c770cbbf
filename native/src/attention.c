/* FlashAttention forward and backward: request checks, the kernels'
 * argument values by name, grids, and the launches. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "slots.h"

#define INT32_LIMIT 2147483647LL
#define MAX_HEAD_DIM 512
#define MAX_BLOCK 256 /* the largest BLOCK_M / BLOCK_N of any config */
#define MAX_GRID_Y 65535

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

typedef struct dims {
    int64_t b, h, hk, sq, sk, d;
    int64_t dv; /* value's head dim (d unless V's differs) */
    int varlen;
} dims;

static int64_t numel(const aotr_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++)
        n *= t->sizes[i];
    return n;
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

static aotr_status check_tensor(const aotr_tensor *t, const char *name)
{
    if (t->rank < 0 || t->rank > AOTR_MAX_RANK)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "%s: rank %d is outside 0..%d", name, t->rank,
                         AOTR_MAX_RANK);
    for (int i = 0; i < t->rank; i++)
        if (t->sizes[i] < 0)
            return aotr_fail(AOTR_INVALID_ARGUMENT, "%s: negative size", name);
    return AOTR_OK;
}

static int same_shape(const aotr_tensor *a, const aotr_tensor *b)
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

static aotr_status problem_dims(const aotr_attn_problem *p, dims *d)
{
    aotr_status st;
    if ((st = check_tensor(&p->q, "q")) || (st = check_tensor(&p->k, "k")) ||
        (st = check_tensor(&p->v, "v")))
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
static void zhm(const aotr_tensor *t, int varlen, int64_t out[3])
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

void aotr_attn_window(int64_t left, int64_t right, int32_t causal, int64_t seqlen_k, int32_t *out)
{
    const int64_t side[2] = {left, right};
    for (int i = 0; i < 2; i++)
        out[i] = side[i] < 0 || side[i] >= seqlen_k ? -1 : (int32_t)side[i];
    if (causal)
        out[1] = 0;
}

aotr_status aotr_attn_check(const aotr_attn_problem *p)
{
    if (!p)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "aotr_attn_check: `problem` is NULL");
    dims d;
    aotr_status st = problem_dims(p, &d);
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
        if ((st = check_tensor(&p->bias, "bias")) != AOTR_OK)
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
        zhm(qkv[i], d.varlen, s);
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

/* softcap and ALiBi: the fields appended to the params structs, read only
 * when the caller's struct_size covers them. */
typedef struct score_mod {
    const aotr_tensor *alibi; /* NULL: absent */
    float softcap;
} score_mod;

static unsigned pick_features(int bias, int dropout, const score_mod *mod)
{
    return (bias ? AOTR_PICK_BIAS : 0u) | (dropout ? AOTR_PICK_DROPOUT : 0u) |
           (mod && (mod->alibi || mod->softcap > 0.0f) ? AOTR_PICK_SCORE_MODS : 0u);
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
    dims d;
    problem_dims(p, &d);
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
                              pick_features(aotr_present(&p->bias), dropout, NULL), d.sq, d.sk))
            return AOTR_UNSUPPORTED;
    return AOTR_OK;
}

/* -- argument values ------------------------------------------------------ */

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

static aotr_status like(const aotr_tensor *t, const aotr_tensor *model, const char *name,
                        const char *model_name)
{
    aotr_status st = check_tensor(t, name);
    if (st != AOTR_OK)
        return st;
    if (!aotr_present(t) || !same_shape(t, model) || t->dtype != model->dtype)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "%s must be given, shaped and typed like %s", name,
                         model_name);
    return aotr_need_layout(t, name);
}

static aotr_status set_i32(aotr_arg_value *v, int slot, int64_t x)
{
    if (x > INT32_LIMIT || x < -INT32_LIMIT - 1)
        return aotr_fail(AOTR_UNSUPPORTED,
                         "%s = %lld does not fit the kernels' 32-bit "
                         "argument",
                         aotr_arg_slot_name(slot), (long long)x);
    v[slot].i32 = (int32_t)x;
    return AOTR_OK;
}

static aotr_status set_strides(aotr_arg_value *v, int first, const int64_t s[], int count)
{
    aotr_status st = AOTR_OK;
    for (int i = 0; i < count && st == AOTR_OK; i++)
        st = set_i32(v, first + i, s[i]);
    return st;
}

static aotr_status set_zhm(aotr_arg_value *v, int first, const aotr_tensor *t, int varlen)
{
    int64_t s[3];
    zhm(t, varlen, s);
    return set_strides(v, first, s, 3);
}

/* set_zhm and set_strides fill consecutive slots: each tensor's strides are
 * listed together in variants.toml, whose order numbers the slots. */
#define CONSECUTIVE(a, b)                                                                          \
    _Static_assert(b == a + 1, "variants.toml: " #b " must follow " #a " (set_zhm, set_strides)")
#define ZHM(z, h, m)                                                                               \
    CONSECUTIVE(z, h);                                                                             \
    CONSECUTIVE(h, m)
ZHM(AOTR_SLOT_stride_qz, AOTR_SLOT_stride_qh, AOTR_SLOT_stride_qm);
ZHM(AOTR_SLOT_stride_kz, AOTR_SLOT_stride_kh, AOTR_SLOT_stride_kn);
ZHM(AOTR_SLOT_stride_vz, AOTR_SLOT_stride_vh, AOTR_SLOT_stride_vn);
ZHM(AOTR_SLOT_stride_bz, AOTR_SLOT_stride_bh, AOTR_SLOT_stride_bm);
ZHM(AOTR_SLOT_stride_oz, AOTR_SLOT_stride_oh, AOTR_SLOT_stride_om);
ZHM(AOTR_SLOT_stride_doz, AOTR_SLOT_stride_doh, AOTR_SLOT_stride_dom);
ZHM(AOTR_SLOT_stride_dkz, AOTR_SLOT_stride_dkh, AOTR_SLOT_stride_dkn);
ZHM(AOTR_SLOT_stride_dvz, AOTR_SLOT_stride_dvh, AOTR_SLOT_stride_dvn);
ZHM(AOTR_SLOT_stride_dqz, AOTR_SLOT_stride_dqh, AOTR_SLOT_stride_dqm);
ZHM(AOTR_SLOT_stride_dbz, AOTR_SLOT_stride_dbh, AOTR_SLOT_stride_dbm);
ZHM(AOTR_SLOT_stride_dqaz, AOTR_SLOT_stride_dqah, AOTR_SLOT_stride_dqam);
CONSECUTIVE(AOTR_SLOT_stride_lz, AOTR_SLOT_stride_lh);
CONSECUTIVE(AOTR_SLOT_stride_az, AOTR_SLOT_stride_ah);

/* (z, h) strides of the logsumexp (and Delta): (B, H, >= Sq) dense, (H, total) packed. */
static aotr_status check_lse(const aotr_tensor *lse, const dims *d, const char *name,
                             int64_t out[2])
{
    aotr_status st = check_tensor(lse, name);
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
    /* (a last dim of one row is never strided over) */
    int last = lse->rank - 1;
    if ((lse->sizes[last] > 1 && lse->strides[last] != 1) || ((uintptr_t)lse->data & 15u))
        return aotr_fail(AOTR_NEEDS_LAYOUT,
                         "%s needs a unit last stride and a 16-byte "
                         "aligned base: pass a contiguous copy",
                         name);
    out[0] = d->varlen ? 0 : lse->strides[0];
    out[1] = d->varlen ? lse->strides[0] : lse->strides[1];
    return AOTR_OK;
}

/* Everything the forward and the backward kernels share. */
static aotr_status common_values(const aotr_attn_problem *p, const dims *d, int needs_rng,
                                 aotr_arg_value *v)
{
    aotr_status st;
    if ((st = aotr_need_layout(&p->q, "q")) || (st = aotr_need_layout(&p->k, "k")) ||
        (st = aotr_need_layout(&p->v, "v")))
        return st;
    /* Pointers a launch never dereferences (a feature it does not use) get
     * q's address: valid device memory, aligned like every other input. */
    void *spare = p->q.data;
    v[AOTR_SLOT_Q].p = p->q.data;
    v[AOTR_SLOT_K].p = p->k.data;
    v[AOTR_SLOT_V].p = p->v.data;
    v[AOTR_SLOT_CU_Q].p = d->varlen ? p->cu_seqlens_q.data : spare;
    v[AOTR_SLOT_CU_K].p = d->varlen ? p->cu_seqlens_k.data : spare;
    if (needs_rng) {
        const aotr_tensor *r[2] = {&p->philox_seed, &p->philox_offset};
        for (int i = 0; i < 2; i++)
            if (!aotr_present(r[i]) || r[i]->dtype != AOTR_INT64 || numel(r[i]) < 1 ||
                ((uintptr_t)r[i]->data & 7u))
                return aotr_fail(AOTR_INVALID_ARGUMENT,
                                 "dropout needs philox_%s: an "
                                 "8-byte aligned int64 device scalar",
                                 i ? "offset" : "seed");
    }
    v[AOTR_SLOT_RNG_SEED].p = needs_rng ? p->philox_seed.data : spare;
    v[AOTR_SLOT_RNG_OFFSET].p = needs_rng ? p->philox_offset.data : spare;
    if (aotr_present(&p->bias)) {
        if ((st = aotr_need_layout(&p->bias, "bias")) != AOTR_OK)
            return st;
        v[AOTR_SLOT_BIAS].p = p->bias.data;
        if ((st = set_strides(v, AOTR_SLOT_stride_bz, p->bias.strides, 3)) != AOTR_OK)
            return st;
    } else {
        v[AOTR_SLOT_BIAS].p = spare;
        v[AOTR_SLOT_stride_bz].i32 = v[AOTR_SLOT_stride_bh].i32 = v[AOTR_SLOT_stride_bm].i32 = 0;
    }
    if ((st = set_zhm(v, AOTR_SLOT_stride_qz, &p->q, d->varlen)) ||
        (st = set_zhm(v, AOTR_SLOT_stride_kz, &p->k, d->varlen)) ||
        (st = set_zhm(v, AOTR_SLOT_stride_vz, &p->v, d->varlen)))
        return st;
    int32_t window[2];
    aotr_attn_window(p->window_left, p->window_right, p->causal, d->sk, window);
    if ((st = set_i32(v, AOTR_SLOT_batch, d->b)) || (st = set_i32(v, AOTR_SLOT_num_heads, d->h)) ||
        (st = set_i32(v, AOTR_SLOT_gqa_group, d->hk ? d->h / d->hk : 1)) ||
        (st = set_i32(v, AOTR_SLOT_max_seqlen_q, d->sq)) ||
        (st = set_i32(v, AOTR_SLOT_max_seqlen_k, d->sk)) ||
        (st = set_i32(v, AOTR_SLOT_window_left, window[0])) ||
        (st = set_i32(v, AOTR_SLOT_window_right, window[1])))
        return st;
    v[AOTR_SLOT_varlen].i32 = d->varlen;
    v[AOTR_SLOT_head_dim].i32 = (int32_t)d->d;
    v[AOTR_SLOT_bottom_right].i32 = p->causal_alignment == AOTR_CAUSAL_BOTTOM_RIGHT;
    v[AOTR_SLOT_sm_scale].f32 = p->scale;
    v[AOTR_SLOT_dropout_p].f32 = p->dropout_p;
    return AOTR_OK;
}

static score_mod score_mod_of(uint32_t struct_size, size_t alibi_at, size_t softcap_at,
                              const aotr_tensor *alibi, float softcap)
{
    score_mod m = {NULL, 0.0f};
    if (struct_size >= alibi_at + sizeof(aotr_tensor) && aotr_present(alibi))
        m.alibi = alibi;
    if (struct_size >= softcap_at + sizeof(float))
        m.softcap = softcap;
    return m;
}

aotr_status aotr_alibi_strides(const aotr_tensor *a, int64_t batch, int64_t heads,
                               int64_t strides[2])
{
    aotr_status st = check_tensor(a, "alibi_slopes");
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

static aotr_status score_mod_values(const score_mod *m, const dims *d, const void *spare,
                                    aotr_arg_value *v)
{
    if (!(isfinite(m->softcap) && m->softcap >= 0.0f))
        return aotr_fail(AOTR_INVALID_ARGUMENT, "softcap=%g: must be finite and >= 0 (0: off)",
                         (double)m->softcap);
    v[AOTR_SLOT_softcap].f32 = m->softcap;
    v[AOTR_SLOT_ALIBI].p = (void *)spare;
    v[AOTR_SLOT_stride_az].i32 = v[AOTR_SLOT_stride_ah].i32 = v[AOTR_SLOT_has_alibi].i32 = 0;
    const aotr_tensor *a = m->alibi;
    if (!a)
        return AOTR_OK;
    int64_t s[2];
    aotr_status st = aotr_alibi_strides(a, d->b, d->h, s);
    if (st == AOTR_OK)
        st = set_strides(v, AOTR_SLOT_stride_az, s, 2);
    if (st != AOTR_OK)
        return st;
    v[AOTR_SLOT_ALIBI].p = a->data;
    v[AOTR_SLOT_has_alibi].i32 = 1;
    return AOTR_OK;
}

/* A kernel of an image built before softcap/ALiBi cannot apply them: refuse
 * rather than ignore them. */
static aotr_status score_mod_declared(const aotr_launchable *k, const aotr_arg_value *v)
{
    if (v[AOTR_SLOT_has_alibi].i32 && !aotr_launchable_declares(k, AOTR_SLOT_ALIBI))
        return aotr_fail(AOTR_UNSUPPORTED, "the installed kernel image predates ALiBi: "
                                           "install matching aotriton-rocm kernel images");
    if (v[AOTR_SLOT_softcap].f32 > 0.0f && !aotr_launchable_declares(k, AOTR_SLOT_softcap))
        return aotr_fail(AOTR_UNSUPPORTED, "the installed kernel image predates softcap: "
                                           "install matching aotriton-rocm kernel images");
    return AOTR_OK;
}

static uint64_t cdiv(int64_t a, int64_t b) { return (uint64_t)((a + b - 1) / b); }

aotr_status aotr_launch_grid(uint64_t blocks, int64_t programs, uint32_t grid[3])
{
    int64_t y = programs < MAX_GRID_Y ? programs : MAX_GRID_Y;
    if (y < 1)
        y = 1;
    uint64_t z = cdiv(programs, y);
    if (blocks > 0x7fffffffu || z > MAX_GRID_Y)
        return aotr_fail(AOTR_UNSUPPORTED, "the launch grid (%llu, %lld, %llu) is too large",
                         (unsigned long long)blocks, (long long)y, (unsigned long long)z);
    grid[0] = (uint32_t)blocks;
    grid[1] = (uint32_t)y;
    grid[2] = (uint32_t)z;
    return AOTR_OK;
}

static aotr_status launch(aotr_runtime *rt, aotr_device *dev, const aotr_launchable *k,
                          uint64_t blocks, int64_t programs, void *stream, const aotr_arg_value *v)
{
    uint32_t grid[3];
    aotr_status st = aotr_launch_grid(blocks, programs, grid);
    if (st == AOTR_OK)
        st = aotr_launchable_check(k, v);
    if (st == AOTR_OK)
        st = aotr_device_launch(rt, dev, k, grid, stream, v);
    return st;
}

/* What every entry point checks first: the runtime and the params given, and
 * their struct_size at least `minimum`. */
static aotr_status check_call(const aotr_runtime *rt, const void *params, uint32_t struct_size,
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

/* check_call, then the problem; fills `d`. */
static aotr_status begin(aotr_runtime *rt, const void *params, uint32_t struct_size, size_t minimum,
                         const aotr_attn_problem *p, dims *d, const char *what)
{
    aotr_status st = check_call(rt, params, struct_size, minimum, what);
    if (st == AOTR_OK)
        st = aotr_attn_check(p);
    if (st == AOTR_OK)
        problem_dims(p, d);
    return st;
}

/* The caller's params, its struct_size kept, fields past it zero. */
static void params_copy(void *dst, const void *src, size_t size, uint32_t struct_size)
{
    memset(dst, 0, size);
    memcpy(dst, src, struct_size < size ? struct_size : size);
}

static aotr_status shaped_like(const aotr_tensor *t, const aotr_tensor *model, const char *name,
                               const char *model_name)
{
    aotr_status st = check_tensor(t, name);
    if (st == AOTR_OK && (!aotr_present(t) || !same_shape(t, model) || t->dtype != model->dtype))
        st = aotr_fail(AOTR_INVALID_ARGUMENT, "%s must be given, shaped and typed like %s", name,
                       model_name);
    return st;
}

/* out and grad_out: q's rows, the value's head dim. */
static aotr_status shaped_like_out(const aotr_tensor *t, const aotr_attn_problem *p,
                                   const char *name)
{
    aotr_status st = check_tensor(t, name);
    if (st == AOTR_OK && (!aotr_present(t) || !same_rows(t, &p->q) || t->dtype != p->q.dtype ||
                          t->sizes[t->rank - 1] != p->v.sizes[p->v.rank - 1]))
        st = aotr_fail(AOTR_INVALID_ARGUMENT,
                       "%s must be given, shaped like q with the value's "
                       "head_dim, typed like q",
                       name);
    return st;
}

/* The head dim the staged copies run at: both dims' next multiple of 8. */
static int64_t staged_width(const dims *d)
{
    return aotr_kernel_head_dim(d->d > d->dv ? d->d : d->dv);
}

/* A head dim that is not a multiple of 8: the same call on zero-padded
 * copies (stage.c) at the next multiple of 8. */
static aotr_status staged_fwd(aotr_runtime *rt, const aotr_attn_fwd_params *params, const dims *d)
{
    aotr_status st = shaped_like_out(&params->out, &params->problem, "out");
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
    dims d;
    aotr_status st = begin(rt, params, params ? params->struct_size : 0,
                           offsetof(aotr_attn_fwd_params, softcap), p, &d, "aotr_attn_fwd");
    if (st != AOTR_OK)
        return st;
    if (d.d % 8 || d.dv != d.d)
        return staged_fwd(rt, params, &d);
    if ((st = like(&params->out, &p->q, "out", "q")) != AOTR_OK)
        return st;
    aotr_arg_value v[AOTR_ARG_SLOTS];
    memset(v, 0, sizeof v);
    int64_t lse_s[2];
    if ((st = check_lse(&params->lse, &d, "lse", lse_s)) != AOTR_OK)
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
    if ((st = common_values(p, &d, dropout, v)) != AOTR_OK)
        return st;
    score_mod mod = score_mod_of(params->struct_size, offsetof(aotr_attn_fwd_params, alibi_slopes),
                                 offsetof(aotr_attn_fwd_params, softcap), &params->alibi_slopes,
                                 params->softcap);
    if ((st = score_mod_values(&mod, &d, p->q.data, v)) != AOTR_OK)
        return st;
    v[AOTR_SLOT_O].p = params->out.data;
    v[AOTR_SLOT_LSE].p = params->lse.data;
    v[AOTR_SLOT_DMASK].p = store_dmask ? dm->data : p->q.data;
    v[AOTR_SLOT_store_dmask].i32 = store_dmask;
    if ((st = set_zhm(v, AOTR_SLOT_stride_oz, &params->out, d.varlen)) ||
        (st = set_strides(v, AOTR_SLOT_stride_lz, lse_s, 2)))
        return st;
    aotr_device *dev = NULL;
    if ((st = aotr_runtime_device(rt, params->device, &dev)) != AOTR_OK)
        return st;
    unsigned features = pick_features(aotr_present(&p->bias), dropout, &mod);
    const aotr_launchable *k = aotr_device_pick(dev, AOTR_KERNEL_FWD, (aotr_dtype)p->q.dtype,
                                                (int32_t)d.d, features, d.sq, d.sk);
    if (!k)
        return AOTR_UNSUPPORTED;
    if ((st = score_mod_declared(k, v)) != AOTR_OK)
        return st;
    const uint32_t n = params->struct_size;
    const aotr_tensor *const fields[3] = {
        appended(n, offsetof(aotr_attn_fwd_params, seq_starts_q), &params->seq_starts_q),
        appended(n, offsetof(aotr_attn_fwd_params, seq_starts_k), &params->seq_starts_k),
        appended(n, offsetof(aotr_attn_fwd_params, seqlens_k), &params->seqlens_k)};
    aotr_placement pl;
    if ((st = place(rt, params->device, params->stream, p, fields, &pl, v)) != AOTR_OK)
        return st;
    st = launch(rt, dev, k, cdiv(d.sq, aotr_launchable_block_m(k)), d.b * d.h, params->stream, v);
    return aotr_placement_end(&pl, st);
}

/* The fused route: Delta, then dK, dV and the fp32 sum of dQ in one pass
 * over the key blocks, then dQ from that sum. */
static aotr_status fused_backward(aotr_runtime *rt, aotr_device *dev, const aotr_launchable *pre,
                                  const aotr_launchable *fused, const aotr_launchable *conv,
                                  const aotr_tensor *acc, const dims *d, void *stream,
                                  aotr_arg_value *v)
{
    aotr_status st;
    v[AOTR_SLOT_DQ_ACC].p = acc->data;
    if ((st = set_zhm(v, AOTR_SLOT_stride_dqaz, acc, d->varlen)) ||
        (st = aotr_launchable_check(pre, v)) || (st = aotr_launchable_check(fused, v)) ||
        (st = aotr_launchable_check(conv, v)))
        return st;
    if ((st = launch(rt, dev, pre, cdiv(d->sq, aotr_launchable_block_m(pre)), d->b * d->h, stream,
                     v)) != AOTR_OK)
        return st;
    if ((st = launch(rt, dev, fused, cdiv(d->sk, aotr_launchable_block_n(fused)), d->b * d->hk,
                     stream, v)) != AOTR_OK)
        return st;
    return launch(rt, dev, conv, cdiv(d->sq, aotr_launchable_block_m(conv)), d->b * d->h, stream,
                  v);
}

/* See staged_fwd; the split backward (a dQ accumulator shaped like the
 * caller's q would not fit the copies). */
static aotr_status staged_bwd(aotr_runtime *rt, const aotr_attn_bwd_params *params, const dims *d)
{
    const aotr_attn_problem *q = &params->problem;
    aotr_status st;
    if ((st = shaped_like_out(&params->out, q, "out")) ||
        (st = shaped_like_out(&params->grad_out, q, "grad_out")) ||
        (st = shaped_like(&params->grad_q, &q->q, "grad_q", "q")) ||
        (st = shaped_like(&params->grad_k, &q->k, "grad_k", "k")) ||
        (st = shaped_like(&params->grad_v, &q->v, "grad_v", "v")))
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
                                const dims *d, unsigned features, const aotr_tensor *acc,
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
        (st = aotr_launchable_check(dq, v)) || (st = score_mod_declared(dkdv, v)) ||
        (st = score_mod_declared(dq, v)))
        return st;
    if ((st = launch(rt, dev, pre, cdiv(d->sq, aotr_launchable_block_m(pre)), d->b * d->h, stream,
                     v)) != AOTR_OK)
        return st;
    if ((st = launch(rt, dev, dkdv, cdiv(d->sk, aotr_launchable_block_n(dkdv)), d->b * d->hk,
                     stream, v)) != AOTR_OK)
        return st;
    return launch(rt, dev, dq, cdiv(d->sq, aotr_launchable_block_m(dq)), d->b * d->h, stream, v);
}

static aotr_status attn_bwd(aotr_runtime *rt, const aotr_attn_bwd_params *params)
{
    const aotr_attn_problem *p = params ? &params->problem : NULL;
    dims d;
    aotr_status st = begin(rt, params, params ? params->struct_size : 0,
                           offsetof(aotr_attn_bwd_params, softcap), p, &d, "aotr_attn_bwd");
    if (st != AOTR_OK)
        return st;
    if (d.d % 8 || d.dv != d.d)
        return staged_bwd(rt, params, &d);
    if ((st = like(&params->out, &p->q, "out", "q")) ||
        (st = like(&params->grad_out, &p->q, "grad_out", "q")) ||
        (st = like(&params->grad_q, &p->q, "grad_q", "q")) ||
        (st = like(&params->grad_k, &p->k, "grad_k", "k")) ||
        (st = like(&params->grad_v, &p->v, "grad_v", "v")))
        return st;
    int64_t lse_s[2], delta_s[2];
    if ((st = check_lse(&params->lse, &d, "lse", lse_s)) ||
        (st = check_lse(&params->delta, &d, "delta", delta_s)))
        return st;
    if (delta_s[0] != lse_s[0] || delta_s[1] != lse_s[1] ||
        !same_shape(&params->delta, &params->lse))
        return aotr_fail(AOTR_INVALID_ARGUMENT, "delta must be shaped and strided like lse");
    if (numel(&p->q) == 0 || numel(&p->k) == 0) {
        if (numel(&params->grad_k) == 0 && numel(&params->grad_q) == 0)
            return AOTR_OK;
        return aotr_fail(AOTR_UNSUPPORTED,
                         "an empty query or key/value: the gradients are "
                         "zeros, which this library does not write (it allocates and clears "
                         "no device memory)");
    }
    const aotr_tensor *db = &params->grad_bias;
    int store_dbias = aotr_present(db);
    if (store_dbias) {
        if (!aotr_present(&p->bias) || !same_shape(db, &p->bias) || db->dtype != p->bias.dtype)
            return aotr_fail(AOTR_INVALID_ARGUMENT, "grad_bias needs a bias, and must be "
                                                    "shaped and typed like it");
        if ((st = aotr_need_layout(db, "grad_bias")) != AOTR_OK)
            return st;
    }
    aotr_arg_value v[AOTR_ARG_SLOTS];
    memset(v, 0, sizeof v);
    int dropout = p->dropout_p > 0.0f;
    if ((st = common_values(p, &d, dropout, v)) != AOTR_OK)
        return st;
    score_mod mod = score_mod_of(params->struct_size, offsetof(aotr_attn_bwd_params, alibi_slopes),
                                 offsetof(aotr_attn_bwd_params, softcap), &params->alibi_slopes,
                                 params->softcap);
    if ((st = score_mod_values(&mod, &d, p->q.data, v)) != AOTR_OK)
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
    if ((st = set_zhm(v, AOTR_SLOT_stride_oz, &params->out, d.varlen)) ||
        (st = set_zhm(v, AOTR_SLOT_stride_doz, &params->grad_out, d.varlen)) ||
        (st = set_zhm(v, AOTR_SLOT_stride_dqz, &params->grad_q, d.varlen)) ||
        (st = set_zhm(v, AOTR_SLOT_stride_dkz, &params->grad_k, d.varlen)) ||
        (st = set_zhm(v, AOTR_SLOT_stride_dvz, &params->grad_v, d.varlen)) ||
        (st = set_strides(v, AOTR_SLOT_stride_lz, lse_s, 2)))
        return st;
    if (store_dbias && (st = set_strides(v, AOTR_SLOT_stride_dbz, db->strides, 3)) != AOTR_OK)
        return st;
    const aotr_tensor *acc = NULL;
    if (params->struct_size >= offsetof(aotr_attn_bwd_params, grad_q_accum) + sizeof(aotr_tensor) &&
        aotr_present(&params->grad_q_accum)) {
        acc = &params->grad_q_accum;
        if ((st = check_tensor(acc, "grad_q_accum")) != AOTR_OK)
            return st;
        if (acc->dtype != AOTR_FP32 || !same_shape(acc, &p->q))
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
    st = bwd_launches(rt, dev, p, &d, pick_features(aotr_present(&p->bias), dropout, &mod), acc,
                      params->stream, v);
    return aotr_placement_end(&pl, st);
}

/* -- dropout draws ---------------------------------------------------------- */

static aotr_status check_philox(const aotr_tensor *t, const char *name)
{
    aotr_status st = check_tensor(t, name);
    if (st != AOTR_OK)
        return st;
    if (!aotr_present(t) || t->dtype != AOTR_INT64 || numel(t) < 1 || ((uintptr_t)t->data & 7u))
        return aotr_fail(AOTR_INVALID_ARGUMENT,
                         "%s must be an 8-byte aligned int64 device "
                         "scalar (the forward's)",
                         name);
    return AOTR_OK;
}

/* A contiguous fp32 (B, H, Sq, Sk) tensor whose sizes fit the kernel's 32-bit arguments. */
static aotr_status check_draws_out(const aotr_tensor *t)
{
    aotr_status st = check_tensor(t, "out");
    if (st != AOTR_OK)
        return st;
    if ((!aotr_present(t) && numel(t) > 0) || t->rank != 4 || t->dtype != AOTR_FP32)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "out must be an fp32 (batch, heads, seqlen_q, "
                                                "seqlen_k) tensor");
    const int64_t *n = t->sizes;
    if (numel(t) == 0)
        return AOTR_OK; /* nothing is written: any strides, any address */
    if (t->strides[3] != 1 || t->strides[2] != n[3] || t->strides[1] != n[2] * n[3] ||
        t->strides[0] != n[1] * n[2] * n[3])
        return aotr_fail(AOTR_NEEDS_LAYOUT, "out must be contiguous: pass a contiguous tensor "
                                            "and copy from it");
    if (n[0] * n[1] > INT32_LIMIT || n[2] > INT32_LIMIT || n[3] > INT32_LIMIT)
        return aotr_fail(AOTR_UNSUPPORTED, "sizes beyond 32 bits are not covered");
    return AOTR_OK;
}

aotr_status aotr_dropout_uniform(aotr_runtime *rt, const aotr_dropout_uniform_params *params)
{
    aotr_status st;
    if ((st = check_call(rt, params, params ? params->struct_size : 0, sizeof *params,
                         "aotr_dropout_uniform")) ||
        (st = check_draws_out(&params->out)) ||
        (st = check_philox(&params->philox_seed, "philox_seed")) ||
        (st = check_philox(&params->philox_offset, "philox_offset")))
        return st;
    if (!(params->dropout_p >= 0.0f && params->dropout_p <= 1.0f))
        return aotr_fail(AOTR_INVALID_ARGUMENT, "dropout_p=%g is outside [0, 1]",
                         (double)params->dropout_p);
    if (params->encode_keep != 0 && params->encode_keep != 1)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "encode_keep must be 0 or 1, not %d",
                         params->encode_keep);
    const int64_t *n = params->out.sizes;
    if (numel(&params->out) == 0)
        return AOTR_OK; /* nothing to write */
    aotr_arg_value v[AOTR_ARG_SLOTS];
    memset(v, 0, sizeof v);
    v[AOTR_SLOT_R].p = params->out.data;
    v[AOTR_SLOT_RNG_SEED].p = params->philox_seed.data;
    v[AOTR_SLOT_RNG_OFFSET].p = params->philox_offset.data;
    v[AOTR_SLOT_batch].i32 = (int32_t)n[0];
    v[AOTR_SLOT_num_heads].i32 = (int32_t)n[1];
    v[AOTR_SLOT_max_seqlen_q].i32 = (int32_t)n[2];
    v[AOTR_SLOT_max_seqlen_k].i32 = (int32_t)n[3];
    v[AOTR_SLOT_dropout_p].f32 = params->dropout_p;
    v[AOTR_SLOT_encode_keep].i32 = params->encode_keep;
    aotr_device *dev = NULL;
    if ((st = aotr_runtime_device(rt, params->device, &dev)) != AOTR_OK)
        return st;
    const aotr_launchable *k =
        aotr_device_pick(dev, AOTR_KERNEL_DROPOUT_UNIFORM, AOTR_FP32, 16, 0, n[2], n[3]);
    if (!k)
        return AOTR_UNSUPPORTED;
    return launch(rt, dev, k, cdiv(n[2], aotr_launchable_block_m(k)), n[0] * n[1], params->stream,
                  v);
}

aotr_status aotr_philox_state(aotr_runtime *rt, const aotr_philox_state_params *params)
{
    aotr_status st;
    if ((st = check_call(rt, params, params ? params->struct_size : 0, sizeof *params,
                         "aotr_philox_state")) ||
        (st = check_philox(&params->philox_seed, "philox_seed")) ||
        (st = check_philox(&params->philox_offset, "philox_offset")) ||
        (st = check_philox(&params->seed_out, "seed_out")) ||
        (st = check_philox(&params->offset_out, "offset_out")))
        return st;
    aotr_arg_value v[AOTR_ARG_SLOTS];
    memset(v, 0, sizeof v);
    v[AOTR_SLOT_RNG_SEED].p = params->philox_seed.data;
    v[AOTR_SLOT_RNG_OFFSET].p = params->philox_offset.data;
    v[AOTR_SLOT_offset_add].i64 = params->offset_add;
    v[AOTR_SLOT_SEED_OUT].p = params->seed_out.data;
    v[AOTR_SLOT_OFFSET_OUT].p = params->offset_out.data;
    aotr_device *dev = NULL;
    if ((st = aotr_runtime_device(rt, params->device, &dev)) != AOTR_OK)
        return st;
    const aotr_launchable *k =
        aotr_device_pick(dev, AOTR_KERNEL_PHILOX_STATE, AOTR_FP32, 16, 0, 1, 1);
    if (!k)
        return AOTR_UNSUPPORTED;
    return launch(rt, dev, k, 1, 1, params->stream, v);
}
