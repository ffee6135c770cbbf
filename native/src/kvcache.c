/* Attention over a KV cache (attn_fwd_kvcache + attn_fwd_kvcache_combine):
 * request checks, the split choice, argument values by name, grids and the
 * launches. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "slots.h"

#define INT32_LIMIT 2147483647LL
#define KV_MAX_HEAD_DIM 256
#define KV_PAGE_MULTIPLE 16

/* -- argument names ------------------------------------------------------- */

/* The names only these kernels have (slots.h). */
enum {
    K_O_PART = AOTR_SLOT_O_PART,
    K_LSE_PART = AOTR_SLOT_LSE_PART,
    K_K_START = AOTR_SLOT_K_START,
    K_K_END = AOTR_SLOT_K_END,
    K_CACHE_BATCH_IDX = AOTR_SLOT_CACHE_BATCH_IDX,
    K_BLOCK_TABLE = AOTR_SLOT_BLOCK_TABLE,
    K_STRIDE_BTZ = AOTR_SLOT_stride_btz,
    K_PAGED = AOTR_SLOT_paged,
    K_PAGE_SIZE = AOTR_SLOT_page_size,
    K_HAS_BATCH_IDX = AOTR_SLOT_has_batch_idx,
    K_HAS_K_START = AOTR_SLOT_has_k_start,
    K_NUM_SPLITS = AOTR_SLOT_num_splits
};

/* The slots of the names these kernels share with the attention kernels. */
static const struct {
    int q, k, v, o, lse, cu_q;
    int sq[3], sk[3], sv[3], so[3], sl[2];
    int batch, num_heads, gqa_group, max_seqlen_q, varlen, head_dim, window_left, window_right,
        sm_scale, alibi, stride_az, has_alibi, softcap;
} S = {
    AOTR_SLOT_Q,
    AOTR_SLOT_K,
    AOTR_SLOT_V,
    AOTR_SLOT_O,
    AOTR_SLOT_LSE,
    AOTR_SLOT_CU_Q,
    {AOTR_SLOT_stride_qz, AOTR_SLOT_stride_qh, AOTR_SLOT_stride_qm},
    {AOTR_SLOT_stride_kz, AOTR_SLOT_stride_kh, AOTR_SLOT_stride_kn},
    {AOTR_SLOT_stride_vz, AOTR_SLOT_stride_vh, AOTR_SLOT_stride_vn},
    {AOTR_SLOT_stride_oz, AOTR_SLOT_stride_oh, AOTR_SLOT_stride_om},
    {AOTR_SLOT_stride_lz, AOTR_SLOT_stride_lh},
    AOTR_SLOT_batch,
    AOTR_SLOT_num_heads,
    AOTR_SLOT_gqa_group,
    AOTR_SLOT_max_seqlen_q,
    AOTR_SLOT_varlen,
    AOTR_SLOT_head_dim,
    AOTR_SLOT_window_left,
    AOTR_SLOT_window_right,
    AOTR_SLOT_sm_scale,
    AOTR_SLOT_ALIBI,
    AOTR_SLOT_stride_az,
    AOTR_SLOT_has_alibi,
    AOTR_SLOT_softcap,
};

/* -- the request ---------------------------------------------------------- */

typedef struct kv_dims {
    int64_t b, h, hk, sq, d, page, capacity;
    int varlen, paged;
} kv_dims;

static int rank_ok(const aotr_tensor *t)
{
    if (t->rank < 0 || t->rank > AOTR_MAX_RANK)
        return 0;
    for (int i = 0; i < t->rank; i++)
        if (t->sizes[i] < 0)
            return 0;
    return 1;
}

static aotr_status bad(const char *what)
{
    return aotr_fail(AOTR_UNSUPPORTED, "aotr_attn_fwd_kvcache: %s", what);
}

/* An int32 (B,) device vector (4-byte aligned). */
static aotr_status check_vector(const aotr_tensor *t, int64_t b, const char *name)
{
    if (!rank_ok(t) || t->dtype != AOTR_INT32 || t->rank != 1 || t->sizes[0] != b ||
        (b > 1 && t->strides[0] != 1) || ((uintptr_t)t->data & 3u))
        return aotr_fail(AOTR_UNSUPPORTED,
                         "aotr_attn_fwd_kvcache: %s must be a contiguous "
                         "int32 (batch,) = (%lld,) device vector",
                         name, (long long)b);
    return AOTR_OK;
}

static aotr_status check_shapes(const aotr_attn_kvcache_params *p, kv_dims *d)
{
    const aotr_tensor *q = &p->q, *kc = &p->k_cache, *vc = &p->v_cache;
    if (!rank_ok(q) || !rank_ok(kc) || !rank_ok(vc) || !rank_ok(&p->cu_seqlens_q) ||
        !rank_ok(&p->block_table) || !rank_ok(&p->alibi_slopes) || !rank_ok(&p->out) ||
        !rank_ok(&p->lse))
        return aotr_fail(AOTR_INVALID_ARGUMENT,
                         "aotr_attn_fwd_kvcache: a tensor has a rank "
                         "outside 0..%d or a negative size",
                         AOTR_MAX_RANK);
    d->varlen = aotr_present(&p->cu_seqlens_q);
    if (q->rank != (d->varlen ? 3 : 4))
        return bad(d->varlen ? "q must be packed (total_q, heads, head_dim) with cu_seqlens_q"
                             : "q must be (batch, seqlen_q, heads, head_dim)");
    if (q->dtype != AOTR_FP16 && q->dtype != AOTR_BF16)
        return bad("dtype not covered (fp16 and bf16 are)");
    if (kc->rank != 4 || vc->rank != 4)
        return bad("k_cache and v_cache must be 4-D: (batch_cache, seqlen_cache, heads_k, "
                   "head_dim), or (num_blocks, page_size, heads_k, head_dim) with block_table");
    for (int i = 0; i < 4; i++)
        if (kc->sizes[i] != vc->sizes[i])
            return bad("k_cache and v_cache must have one shape");
    if (kc->dtype != q->dtype || vc->dtype != q->dtype)
        return bad("q, k_cache and v_cache must share a dtype");
    if (d->varlen) {
        const aotr_tensor *cu = &p->cu_seqlens_q;
        if (cu->dtype != AOTR_INT32 || cu->rank != 1 || cu->sizes[0] < 1 ||
            (cu->sizes[0] > 1 && cu->strides[0] != 1))
            return bad("cu_seqlens_q must be a contiguous int32 (batch + 1,) vector");
        if (p->max_seqlen_q < 0)
            return aotr_fail(AOTR_INVALID_ARGUMENT, "aotr_attn_fwd_kvcache: max_seqlen_q < 0");
        d->b = cu->sizes[0] - 1;
        d->sq = p->max_seqlen_q;
    } else {
        d->b = q->sizes[0];
        d->sq = q->sizes[1];
    }
    d->h = q->sizes[q->rank - 2];
    d->d = q->sizes[q->rank - 1];
    d->hk = kc->sizes[2];
    if (kc->sizes[3] != d->d)
        return bad("the caches' head_dim differs from q's");
    if (d->d < 1 || d->d > KV_MAX_HEAD_DIM)
        return aotr_fail(AOTR_UNSUPPORTED,
                         "aotr_attn_fwd_kvcache: head_dim %lld is not covered "
                         "(1 to %d are)",
                         (long long)d->d, KV_MAX_HEAD_DIM);
    if (d->hk == 0 || d->h % d->hk)
        return aotr_fail(AOTR_UNSUPPORTED,
                         "aotr_attn_fwd_kvcache: query heads (%lld) must be a "
                         "multiple of key/value heads (%lld)",
                         (long long)d->h, (long long)d->hk);
    d->paged = aotr_present(&p->block_table);
    d->page = kc->sizes[1];
    d->capacity = d->page;
    if (d->paged) {
        const aotr_tensor *bt = &p->block_table;
        if (aotr_present(&p->cache_batch_idx))
            return bad("cache_batch_idx cannot be used with block_table (a paged cache)");
        if (bt->dtype != AOTR_INT32 || bt->rank != 2 || bt->sizes[0] != d->b ||
            (bt->sizes[1] > 1 && bt->strides[1] != 1) || ((uintptr_t)bt->data & 3u))
            return bad("block_table must be an int32 (batch, max_blocks) tensor with a unit "
                       "stride along its blocks");
        if (d->page <= 0 || d->page % KV_PAGE_MULTIPLE)
            return aotr_fail(AOTR_UNSUPPORTED,
                             "aotr_attn_fwd_kvcache: the page size "
                             "(k_cache.sizes[1] = %lld) must be a positive multiple of %d",
                             (long long)d->page, KV_PAGE_MULTIPLE);
        d->capacity = bt->sizes[1] * d->page;
    } else if (!aotr_present(&p->cache_batch_idx) && kc->sizes[0] < d->b) {
        return bad("the dense cache holds fewer batch rows than q (pass cache_batch_idx)");
    }
    aotr_status st;
    if ((st = check_vector(&p->k_end, d->b, "k_end")) != AOTR_OK)
        return st;
    if (aotr_present(&p->k_start) && (st = check_vector(&p->k_start, d->b, "k_start")) != AOTR_OK)
        return st;
    if (aotr_present(&p->cache_batch_idx) &&
        (st = check_vector(&p->cache_batch_idx, d->b, "cache_batch_idx")) != AOTR_OK)
        return st;
    if (aotr_present(&p->alibi_slopes)) {
        /* the KV-cache kernel steps through the heads' slopes one by one */
        int64_t strides[2];
        if (aotr_alibi_strides(&p->alibi_slopes, d->b, d->h, strides) != AOTR_OK)
            return aotr_fail_prefix(AOTR_UNSUPPORTED, "aotr_attn_fwd_kvcache");
        if (d->h > 1 && strides[1] != 1)
            return bad("alibi_slopes must have a unit stride along the heads");
    }
    if (!isfinite(p->scale) || !isfinite(p->softcap) || p->softcap < 0.0f)
        return bad("scale must be finite and softcap finite and >= 0");
    if (p->causal != 0 && p->causal != 1)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "aotr_attn_fwd_kvcache: causal must be 0 or 1");
    if (p->num_splits < 0 || p->num_splits > AOTR_MAX_SPLITS)
        return aotr_fail(AOTR_INVALID_ARGUMENT,
                         "aotr_attn_fwd_kvcache: num_splits = %d is "
                         "outside 0..%d",
                         p->num_splits, AOTR_MAX_SPLITS);
    const aotr_tensor *t3[4] = {q, kc, vc, &p->out};
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < t3[i]->rank; j++)
            if (t3[i]->strides[j] > INT32_LIMIT || t3[i]->strides[j] < 0)
                return bad("strides beyond the kernels' 32-bit stride arguments");
    if (d->b > INT32_LIMIT || d->h > INT32_LIMIT || d->sq * (d->h / d->hk) > INT32_LIMIT ||
        d->capacity + d->sq > INT32_LIMIT || (d->varlen && q->sizes[0] > INT32_LIMIT))
        return bad("sizes beyond 32 bits are not covered");
    return AOTR_OK;
}

static aotr_status check_outputs(const aotr_attn_kvcache_params *p, const kv_dims *d,
                                 int64_t lse_strides[2])
{
    const aotr_tensor *o = &p->out, *l = &p->lse;
    int same = aotr_present(o) && o->rank == p->q.rank && o->dtype == p->q.dtype;
    for (int i = 0; same && i < o->rank; i++)
        same = o->sizes[i] == p->q.sizes[i];
    if (!same)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "aotr_attn_fwd_kvcache: out must be given, "
                                                "shaped and typed like q");
    int ok = aotr_present(l) && l->dtype == AOTR_FP32;
    if (ok && d->varlen)
        ok = l->rank == 2 && l->sizes[0] == d->h && l->sizes[1] >= p->q.sizes[0];
    else if (ok)
        ok = l->rank == 3 && l->sizes[0] == d->b && l->sizes[1] == d->h && l->sizes[2] >= d->sq;
    if (!ok)
        return aotr_fail(AOTR_INVALID_ARGUMENT,
                         "aotr_attn_fwd_kvcache: lse must be an fp32 %s "
                         "tensor",
                         d->varlen ? "(heads, total_q)" : "(batch, heads, >= seqlen_q)");
    if (!aotr_lse_layout(l, d->varlen, lse_strides))
        return aotr_fail(AOTR_NEEDS_LAYOUT, "aotr_attn_fwd_kvcache: lse needs a unit last "
                                            "stride and a 16-byte aligned base");
    if (d->d % 8)
        return AOTR_OK; /* zero-padded copies take their place (staged) */
    aotr_status st;
    if ((st = aotr_need_layout(&p->q, "q")) || (st = aotr_need_layout(&p->k_cache, "k_cache")) ||
        (st = aotr_need_layout(&p->v_cache, "v_cache")) || (st = aotr_need_layout(o, "out")))
        return st;
    return AOTR_OK;
}

/* A contiguous fp32 workspace tensor of exactly `sizes`. */
static aotr_status check_workspace(const aotr_tensor *t, const int64_t *sizes, int rank,
                                   const char *name)
{
    int ok = aotr_present(t) && rank_ok(t) && t->dtype == AOTR_FP32 && t->rank == rank &&
             !((uintptr_t)t->data & 15u);
    int64_t stride = 1;
    for (int i = rank - 1; ok && i >= 0; i--) {
        ok = t->sizes[i] == sizes[i] && (sizes[i] == 1 || t->strides[i] == stride);
        stride *= sizes[i];
    }
    if (!ok)
        return aotr_fail(AOTR_INVALID_ARGUMENT,
                         "aotr_attn_fwd_kvcache: with %lld splits %s "
                         "must be a contiguous, 16-byte aligned fp32 tensor (batch * heads, "
                         "splits, seqlen_q%s) = (%lld, %lld, %lld%s)",
                         (long long)sizes[1], name, rank == 4 ? ", head_dim" : "",
                         (long long)sizes[0], (long long)sizes[1], (long long)sizes[2],
                         rank == 4 ? ", head_dim" : "");
    return AOTR_OK;
}

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The automatic split count (see aotr_attn_fwd_kvcache_splits). */
static int32_t auto_splits(const kv_dims *d, int32_t block_m, int32_t block_n, int32_t cus)
{
    int64_t programs = d->b * d->hk * cdiv(d->sq * (d->h / d->hk), block_m);
    if (cus <= 0 || programs == 0 || programs * 5 >= (int64_t)cus * 4)
        return 1;
    int64_t want = cdiv(2 * (int64_t)cus, programs);
    int64_t by_keys = cdiv(d->capacity, block_n) / 4;
    int64_t n = want < by_keys ? want : by_keys;
    if (n > AOTR_MAX_SPLITS)
        n = AOTR_MAX_SPLITS;
    return n < 1 ? 1 : (int32_t)n;
}

typedef struct kv_call {
    kv_dims d;
    aotr_device *dev;
    const aotr_launchable *main, *combine;
    int32_t splits;
    int64_t lse_strides[2];
} kv_call;

/* Everything up to the launches: checks, kernels, the split count. */
static aotr_status prepare(aotr_runtime *rt, const aotr_attn_kvcache_params *p, kv_call *c,
                           const char *what)
{
    if (!p)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "%s: `params` is NULL", what);
    if (!rt)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "%s: `runtime` is NULL", what);
    if (p->struct_size < sizeof *p)
        return aotr_fail(AOTR_INVALID_ARGUMENT,
                         "%s: params->struct_size is %u, at least %zu "
                         "(set it to sizeof(aotr_attn_kvcache_params))",
                         what, p->struct_size, sizeof *p);
    memset(c, 0, sizeof *c);
    aotr_status st;
    if ((st = check_shapes(p, &c->d)) || (st = check_outputs(p, &c->d, c->lse_strides)))
        return st;
    if ((st = aotr_runtime_device(rt, p->device, &c->dev)) != AOTR_OK)
        return st;
    aotr_dtype dtype = (aotr_dtype)p->q.dtype;
    int32_t kd = (int32_t)aotr_kernel_head_dim(c->d.d);
    c->main = aotr_device_pick(c->dev, AOTR_KERNEL_KVCACHE, dtype, kd, 0, c->d.sq, c->d.capacity);
    if (!c->main)
        return AOTR_UNSUPPORTED;
    c->combine =
        aotr_device_pick(c->dev, AOTR_KERNEL_KVCACHE_COMBINE, dtype, kd, 0, c->d.sq, c->d.capacity);
    if (!c->combine)
        return AOTR_UNSUPPORTED;
    c->splits = p->num_splits;
    if (c->splits == 0)
        c->splits =
            auto_splits(&c->d, aotr_launchable_block_m(c->main), aotr_launchable_block_n(c->main),
                        aotr_device_compute_units(c->dev));
    return AOTR_OK;
}

aotr_status aotr_attn_fwd_kvcache_splits(aotr_runtime *rt, const aotr_attn_kvcache_params *p,
                                         int32_t *num_splits)
{
    if (!num_splits)
        return aotr_fail(AOTR_INVALID_ARGUMENT,
                         "aotr_attn_fwd_kvcache_splits: `num_splits` is NULL");
    kv_call c;
    aotr_status st = prepare(rt, p, &c, "aotr_attn_fwd_kvcache_splits");
    if (st == AOTR_OK)
        *num_splits = c.splits;
    return st;
}

/* -- argument values and launches ----------------------------------------- */

static void bshd(const aotr_tensor *t, int varlen, const int slots[3], aotr_arg_value *v)
{
    /* (z, h, row) strides: (B, S, H, D) or packed (total, H, D) */
    v[slots[0]].i32 = varlen ? 0 : (int32_t)t->strides[0];
    v[slots[1]].i32 = (int32_t)t->strides[t->rank - 2];
    v[slots[2]].i32 = (int32_t)t->strides[t->rank - 3];
}

static void fill_values(const aotr_attn_kvcache_params *p, const kv_call *c, aotr_arg_value *v)
{
    const kv_dims *d = &c->d;
    void *spare = p->q.data; /* pointers a launch never dereferences */
    v[S.q].p = p->q.data;
    v[S.k].p = p->k_cache.data;
    v[S.v].p = p->v_cache.data;
    v[S.o].p = p->out.data;
    v[S.lse].p = p->lse.data;
    v[S.cu_q].p = d->varlen ? p->cu_seqlens_q.data : spare;
    v[K_O_PART].p = c->splits > 1 ? p->out_partial.data : spare;
    v[K_LSE_PART].p = c->splits > 1 ? p->lse_partial.data : spare;
    v[K_K_START].p = aotr_present(&p->k_start) ? p->k_start.data : spare;
    v[K_K_END].p = p->k_end.data;
    v[K_CACHE_BATCH_IDX].p = aotr_present(&p->cache_batch_idx) ? p->cache_batch_idx.data : spare;
    v[K_BLOCK_TABLE].p = d->paged ? p->block_table.data : spare;
    v[S.alibi].p = aotr_present(&p->alibi_slopes) ? p->alibi_slopes.data : spare;
    bshd(&p->q, d->varlen, S.sq, v);
    bshd(&p->out, d->varlen, S.so, v);
    /* caches: (block or cache row, head, row) */
    const aotr_tensor *caches[2] = {&p->k_cache, &p->v_cache};
    const int *cache_slots[2] = {S.sk, S.sv};
    for (int i = 0; i < 2; i++) {
        v[cache_slots[i][0]].i32 = (int32_t)caches[i]->strides[0];
        v[cache_slots[i][1]].i32 = (int32_t)caches[i]->strides[2];
        v[cache_slots[i][2]].i32 = (int32_t)caches[i]->strides[1];
    }
    v[S.sl[0]].i32 = (int32_t)c->lse_strides[0];
    v[S.sl[1]].i32 = (int32_t)c->lse_strides[1];
    v[K_STRIDE_BTZ].i32 = d->paged ? (int32_t)p->block_table.strides[0] : 0;
    v[S.stride_az].i32 = aotr_present(&p->alibi_slopes) && p->alibi_slopes.rank == 2
                             ? (int32_t)p->alibi_slopes.strides[0]
                             : 0;
    v[S.batch].i32 = (int32_t)d->b;
    v[S.num_heads].i32 = (int32_t)d->h;
    v[S.gqa_group].i32 = (int32_t)(d->h / d->hk);
    v[S.max_seqlen_q].i32 = (int32_t)d->sq;
    v[S.varlen].i32 = d->varlen;
    v[S.head_dim].i32 = (int32_t)d->d;
    v[K_PAGED].i32 = d->paged;
    v[K_PAGE_SIZE].i32 = d->paged ? (int32_t)d->page : 1;
    v[K_HAS_BATCH_IDX].i32 = aotr_present(&p->cache_batch_idx);
    v[K_HAS_K_START].i32 = aotr_present(&p->k_start);
    v[S.has_alibi].i32 = aotr_present(&p->alibi_slopes);
    int32_t window[2];
    aotr_attn_window(p->window_left, p->window_right, p->causal, d->capacity, window);
    v[S.window_left].i32 = window[0];
    v[S.window_right].i32 = window[1];
    v[S.sm_scale].f32 = p->scale;
    v[S.softcap].f32 = p->softcap;
    v[K_NUM_SPLITS].i32 = c->splits;
}

/* A head dim that is not a multiple of 8: the same call on zero-padded
 * copies (stage.c) of q, the caches (whole: every call copies them) and out
 * at the next multiple of 8, with a workspace of that width of its own. */
static aotr_status staged(aotr_runtime *rt, const aotr_attn_kvcache_params *params,
                          const kv_call *c)
{
    aotr_attn_kvcache_params p = *params;
    int64_t width = aotr_kernel_head_dim(c->d.d);
    p.num_splits = c->splits;
    aotr_status st;
    aotr_stage s;
    aotr_stage_init(&s, c->dev, p.stream);
    if ((st = aotr_stage_add(&s, &p.q, "q", 0, width)) ||
        (st = aotr_stage_add(&s, &p.k_cache, "k_cache", 0, width)) ||
        (st = aotr_stage_add(&s, &p.v_cache, "v_cache", 0, width)) ||
        (st = aotr_stage_add(&s, &p.out, "out", 1, width)))
        return st;
    if (c->splits > 1) {
        aotr_tensor *w = &p.out_partial; /* its sizes with the padded width */
        w->sizes[3] = width;
        w->strides[3] = 1;
        w->strides[2] = width;
        w->strides[1] = width * w->sizes[2];
        w->strides[0] = w->strides[1] * w->sizes[1];
        if ((st = aotr_stage_add(&s, w, "out_partial", 2, width)) != AOTR_OK)
            return st;
    }
    if ((st = aotr_stage_begin(&s)) != AOTR_OK)
        return st;
    return aotr_stage_end(&s, aotr_attn_fwd_kvcache(rt, &p));
}

aotr_status aotr_attn_fwd_kvcache(aotr_runtime *rt, const aotr_attn_kvcache_params *p)
{
    kv_call c;
    aotr_status st = prepare(rt, p, &c, "aotr_attn_fwd_kvcache");
    if (st != AOTR_OK)
        return st;
    const kv_dims *d = &c.d;
    if (d->b * d->h * d->sq == 0)
        return AOTR_OK; /* nothing to compute */
    if (c.splits > 1) {
        int64_t o_sizes[4] = {d->b * d->h, c.splits, d->sq, d->d};
        if ((st = check_workspace(&p->out_partial, o_sizes, 4, "out_partial")) ||
            (st = check_workspace(&p->lse_partial, o_sizes, 3, "lse_partial")))
            return st;
    }
    if (d->d % 8)
        return staged(rt, p, &c);
    aotr_arg_value v[AOTR_ARG_SLOTS];
    memset(v, 0, sizeof v);
    fill_values(p, &c, v);
    uint32_t main_grid[3], combine_grid[3];
    int64_t rows = d->sq * (d->h / d->hk);
    if ((st = aotr_launch_grid((uint64_t)(cdiv(rows, aotr_launchable_block_m(c.main)) * c.splits),
                               d->b * d->hk, main_grid)) ||
        (st = aotr_launch_grid((uint64_t)cdiv(d->sq, aotr_launchable_block_m(c.combine)),
                               d->b * d->h, combine_grid)))
        return st;
    /* Check both before the first launch, so a refusal launches nothing. */
    if ((st = aotr_launchable_check(c.main, v)) ||
        (c.splits > 1 && (st = aotr_launchable_check(c.combine, v))))
        return st;
    if ((st = aotr_device_launch(rt, c.dev, c.main, main_grid, p->stream, v)) != AOTR_OK)
        return st;
    if (c.splits > 1)
        st = aotr_device_launch(rt, c.dev, c.combine, combine_grid, p->stream, v);
    return st;
}
