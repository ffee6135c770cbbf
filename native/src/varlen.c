/* Variable-length batches whose sequences do not lie end to end as
 * cu_seqlens says (seq_starts_q/k, seqlens_k of aotr_attn_fwd/bwd_params):
 * the kernels read sequence b at rows cu_seqlens[b] .. cu_seqlens[b + 1], so
 * the call runs on packed copies of its rows, with packed cu_seqlens, and
 * the outputs are copied back to the caller's rows.
 *
 * The per-sequence starts and lengths decide every copy, so they are read on
 * the host: the stream is synchronised once, which a graph capture does not
 * allow (refused there). The copies are 2D copies of one run of rows each
 * (per head where the heads of a row are not adjacent), in one block of
 * stream-ordered device memory freed after the call. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define BLOCK_ALIGN 256 /* bytes between the regions of the block */

typedef struct side {
    int32_t *start, *len; /* per sequence, on the host */
    int32_t *cu;          /* the packed cu_seqlens (B + 1) */
    int64_t longest;
} side;

typedef struct layout {
    aotr_runtime *rt;
    int32_t device;
    void *stream;
    int64_t b;          /* sequences */
    side q, k;
    int32_t *host;      /* one allocation behind the sides' vectors */
    char *block;        /* device memory of the packed copies */
    size_t used, size;
} layout;

static size_t elem(int32_t dtype)
{
    return dtype == AOTR_FP32 || dtype == AOTR_INT32 ? 4u : dtype == AOTR_INT64 ? 8u : 2u;
}

static int has(uint32_t struct_size, size_t end, const aotr_tensor *t)
{
    return struct_size >= end && aotr_present(t);
}

int aotr_varlen_fwd_gathers(const aotr_attn_fwd_params *p)
{
    const size_t end = offsetof(aotr_attn_fwd_params, seqlens_k) + sizeof(aotr_tensor);
    return has(p->struct_size, end, &p->seq_starts_q) || has(p->struct_size, end, &p->seq_starts_k) ||
           has(p->struct_size, end, &p->seqlens_k);
}

int aotr_varlen_bwd_gathers(const aotr_attn_bwd_params *p)
{
    const size_t end = offsetof(aotr_attn_bwd_params, seqlens_k) + sizeof(aotr_tensor);
    return has(p->struct_size, end, &p->seq_starts_q) || has(p->struct_size, end, &p->seq_starts_k) ||
           has(p->struct_size, end, &p->seqlens_k);
}

static aotr_status check_vector(const aotr_tensor *t, const char *name, int64_t n)
{
    if (!aotr_present(t))
        return AOTR_OK;
    if (t->dtype != AOTR_INT32 || t->rank != 1 || t->sizes[0] < n || t->strides[0] < 1)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "%s must be a 1-D int32 tensor of at least %lld "
                         "entries", name, (long long)n);
    return AOTR_OK;
}

/* Queue the copy of `n` entries of `t` into host memory `out`. */
static aotr_status read_vector(layout *l, const aotr_tensor *t, int64_t n, int32_t *out)
{
    return aotr_copy_2d(l->rt, l->device, l->stream, out, 4, t->data, (size_t)t->strides[0] * 4, 4,
                        (size_t)n);
}

/* One side's starts and lengths from the vectors given; the packed cu. */
static aotr_status side_rows(layout *l, side *s, const int32_t *cu, const int32_t *starts,
                             const int32_t *lens, int64_t rows, const char *name,
                             int32_t max_seqlen, int32_t *packed_max)
{
    int64_t total = 0;
    s->longest = 0;
    s->cu[0] = 0;
    for (int64_t b = 0; b < l->b; b++) {
        s->start[b] = starts ? starts[b] : cu[b];
        s->len[b] = lens ? lens[b] : cu[b + 1] - cu[b];
        if (s->start[b] < 0 || s->len[b] < 0 || (int64_t)s->start[b] + s->len[b] > rows)
            return aotr_fail(AOTR_INVALID_ARGUMENT, "sequence %lld of %s (rows %d + %d) lies "
                             "outside its %lld rows", (long long)b, name, s->start[b], s->len[b],
                             (long long)rows);
        total += s->len[b];
        if (total > 2147483647LL)
            return aotr_fail(AOTR_UNSUPPORTED, "more than 2**31 rows of %s", name);
        s->cu[b + 1] = (int32_t)total;
        if (s->len[b] > s->longest)
            s->longest = s->len[b];
    }
    if (max_seqlen > 0 && max_seqlen < s->longest)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "max_seqlen of %s is %d, its longest sequence "
                         "has %lld rows", name, max_seqlen, (long long)s->longest);
    *packed_max = max_seqlen > 0 ? max_seqlen : (int32_t)s->longest;
    return AOTR_OK;
}

/* Read the vectors (one synchronisation) and derive both sides. */
static aotr_status read_layout(layout *l, const aotr_attn_problem *p, const aotr_tensor *starts_q,
                               const aotr_tensor *starts_k, const aotr_tensor *lens_k,
                               aotr_attn_problem *packed)
{
    aotr_status st;
    const aotr_tensor *cu_q = &p->cu_seqlens_q, *cu_k = &p->cu_seqlens_k;
    if (p->q.rank != 3 || p->k.rank != 3 || p->v.rank != 3)
        return aotr_fail(AOTR_UNSUPPORTED, "query/key/value must be 3-D (total, heads, head_dim)");
    const aotr_tensor *qkv[3] = {&p->q, &p->k, &p->v};
    const char *const names[3] = {"q", "k", "v"};
    for (int i = 0; i < 3; i++)
        if (qkv[i]->strides[2] != 1 && qkv[i]->sizes[2] > 1)
            return aotr_fail(AOTR_NEEDS_LAYOUT, "%s needs a unit last stride: pass a copy that has "
                             "one", names[i]);
    if (!aotr_present(cu_q) || cu_q->dtype != AOTR_INT32 || cu_q->rank != 1 || cu_q->sizes[0] < 2)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "cu_seqlens_q must be a 1-D int32 tensor "
                         "(batch + 1)");
    l->b = cu_q->sizes[0] - 1;
    if (!aotr_present(cu_k) && !(aotr_present(starts_k) && aotr_present(lens_k)))
        return aotr_fail(AOTR_INVALID_ARGUMENT, "cu_seqlens_k may be absent only with "
                         "seq_starts_k and seqlens_k");
    if ((st = check_vector(cu_q, "cu_seqlens_q", l->b + 1)) ||
        (st = check_vector(cu_k, "cu_seqlens_k", l->b + 1)) ||
        (st = check_vector(starts_q, "seq_starts_q", l->b)) ||
        (st = check_vector(starts_k, "seq_starts_k", l->b)) ||
        (st = check_vector(lens_k, "seqlens_k", l->b)))
        return st;
    int capturing = 0;
    if ((st = aotr_stream_capturing(l->rt, l->device, l->stream, &capturing)) != AOTR_OK)
        return st;
    if (capturing)
        return aotr_fail(AOTR_UNSUPPORTED, "sequences placed by seq_starts_q/k or seqlens_k are "
                         "read on the host, which a graph capture does not allow: run the call "
                         "outside the capture");
    const int64_t n = l->b + 1;
    /* cu_q, cu_k, starts_q, starts_k, lens_k; then per side start, len, cu */
    l->host = calloc((size_t)(11 * n), sizeof(int32_t));
    if (!l->host)
        return aotr_fail(AOTR_OUT_OF_MEMORY, "no host memory for %lld sequences", (long long)l->b);
    int32_t *in[5];
    for (int i = 0; i < 5; i++)
        in[i] = l->host + i * n;
    side *sides[2] = {&l->q, &l->k};
    for (int i = 0; i < 2; i++) {
        sides[i]->start = l->host + (5 + 3 * i) * n;
        sides[i]->len = sides[i]->start + n;
        sides[i]->cu = sides[i]->len + n;
    }
    const aotr_tensor *vec[5] = {cu_q, cu_k, starts_q, starts_k, lens_k};
    const int64_t count[5] = {n, n, l->b, l->b, l->b};
    for (int i = 0; i < 5; i++)
        if (aotr_present(vec[i]) && (st = read_vector(l, vec[i], count[i], in[i])) != AOTR_OK)
            return st;
    if ((st = aotr_stream_synchronize(l->rt, l->device, l->stream)) != AOTR_OK)
        return st;
    if ((st = side_rows(l, &l->q, in[0], aotr_present(starts_q) ? in[2] : NULL, NULL,
                        p->q.sizes[0], "q", p->max_seqlen_q, &packed->max_seqlen_q)) ||
        (st = side_rows(l, &l->k, in[1], aotr_present(starts_k) ? in[3] : NULL,
                        aotr_present(lens_k) ? in[4] : NULL, p->k.sizes[0], "k",
                        p->max_seqlen_k, &packed->max_seqlen_k)))
        return st;
    return AOTR_OK;
}

static size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

/* A packed (rows, heads, head_dim) tensor like `t` (rows of heads * a
 * multiple of 16 elements), or an fp32 (heads, rows) one; carved from the
 * block (sizing pass: l->block NULL). */
static aotr_tensor carve(layout *l, int32_t dtype, int rank, int64_t rows, int64_t heads,
                         int64_t d)
{
    aotr_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = dtype;
    t.rank = rank;
    size_t bytes;
    if (rank == 3) {
        const int64_t dp = (int64_t)round_up((size_t)d, 16);
        t.sizes[0] = rows, t.sizes[1] = heads, t.sizes[2] = d;
        t.strides[0] = heads * dp, t.strides[1] = dp, t.strides[2] = 1;
        bytes = (size_t)(rows * heads * dp) * elem(dtype);
    } else if (rank == 2) {
        t.sizes[0] = heads, t.sizes[1] = rows;
        t.strides[0] = rows, t.strides[1] = 1;
        bytes = (size_t)(rows * heads) * elem(dtype);
    } else {
        t.sizes[0] = rows;
        t.strides[0] = 1;
        bytes = (size_t)rows * elem(dtype);
    }
    if (l->block)
        t.data = l->block + l->used;
    l->used += round_up(bytes ? bytes : 1, BLOCK_ALIGN);
    return t;
}

/* Rows of a (rows, heads, head_dim) tensor, sequence by sequence, between
 * the caller's rows (`user`, placed by `s->start`) and the packed ones. */
static aotr_status move_rows(layout *l, const side *s, const aotr_tensor *user,
                             const aotr_tensor *packed, int to_user)
{
    const size_t e = elem(user->dtype);
    const int64_t heads = user->sizes[1], d = user->sizes[2];
    const int merged = user->strides[1] == d && packed->strides[1] == d;
    for (int64_t b = 0; b < l->b; b++) {
        if (s->len[b] == 0)
            continue;
        for (int64_t h = 0; h < (merged ? 1 : heads); h++) {
            char *u = (char *)user->data + (s->start[b] * user->strides[0] + h * user->strides[1]) * (int64_t)e;
            char *p = (char *)packed->data + (s->cu[b] * packed->strides[0] + h * packed->strides[1]) * (int64_t)e;
            const size_t width = (size_t)(merged ? heads * d : d) * e;
            aotr_status st = to_user
                ? aotr_copy_2d(l->rt, l->device, l->stream, u, (size_t)user->strides[0] * e, p,
                               (size_t)packed->strides[0] * e, width, (size_t)s->len[b])
                : aotr_copy_2d(l->rt, l->device, l->stream, p, (size_t)packed->strides[0] * e, u,
                               (size_t)user->strides[0] * e, width, (size_t)s->len[b]);
            if (st != AOTR_OK)
                return st;
        }
    }
    return AOTR_OK;
}

/* A (heads, rows) fp32 tensor (lse, delta), likewise: one copy per sequence
 * where the rows are adjacent, else per sequence and head. */
static aotr_status move_lse(layout *l, const aotr_tensor *user, const aotr_tensor *packed,
                            int to_user)
{
    const int64_t heads = user->sizes[0];
    for (int64_t b = 0; b < l->b; b++) {
        const int64_t n = l->q.len[b];
        if (n == 0)
            continue;
        const int rows_adjacent = user->strides[1] == 1;
        for (int64_t h = 0; h < (rows_adjacent ? 1 : heads); h++) {
            char *u = (char *)user->data + (h * user->strides[0] + l->q.start[b] * user->strides[1]) * 4;
            char *p = (char *)packed->data + (h * packed->strides[0] + l->q.cu[b]) * 4;
            /* adjacent rows: `heads` rows of n values; else n rows of one value */
            const size_t width = rows_adjacent ? (size_t)n * 4 : 4;
            const size_t rows = rows_adjacent ? (size_t)heads : (size_t)n;
            const size_t up = rows_adjacent ? (size_t)user->strides[0] * 4 : (size_t)user->strides[1] * 4;
            const size_t pp = rows_adjacent ? (size_t)packed->strides[0] * 4 : 4;
            aotr_status st = to_user
                ? aotr_copy_2d(l->rt, l->device, l->stream, u, up, p, pp, width, rows)
                : aotr_copy_2d(l->rt, l->device, l->stream, p, pp, u, up, width, rows);
            if (st != AOTR_OK)
                return st;
        }
    }
    return AOTR_OK;
}

static aotr_status check_lse_view(const aotr_tensor *t, const aotr_tensor *q, const char *name)
{
    if (t->dtype != AOTR_FP32 || t->rank != 2 || t->sizes[0] != q->sizes[1] ||
        t->sizes[1] < q->sizes[0] || !aotr_present(t))
        return aotr_fail(AOTR_INVALID_ARGUMENT, "%s must be an fp32 (heads, rows of q) tensor",
                         name);
    return AOTR_OK;
}

/* Shaped like `model` (rows, heads) with head dim `d` (0: model's). */
static aotr_status like_rows_d(const aotr_tensor *t, const aotr_tensor *model, int64_t d,
                               const char *name)
{
    if (!aotr_present(t) || t->rank != 3 || t->dtype != model->dtype ||
        t->sizes[0] != model->sizes[0] || t->sizes[1] != model->sizes[1] ||
        t->sizes[2] != (d ? d : model->sizes[2]) || t->strides[2] != 1)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "%s must be shaped and typed like its input, "
                         "with a unit last stride", name);
    return AOTR_OK;
}

static aotr_status like_rows(const aotr_tensor *t, const aotr_tensor *model, const char *name)
{
    return like_rows_d(t, model, 0, name);
}

/* The packed problem's tensors: cu_seqlens, q, k, v (sizing pass: the
 * block not yet allocated). */
static void carve_problem(layout *l, const aotr_attn_problem *p, aotr_attn_problem *packed)
{
    const int64_t tq = l->q.cu[l->b], tk = l->k.cu[l->b];
    packed->cu_seqlens_q = carve(l, AOTR_INT32, 1, l->b + 1, 0, 0);
    packed->cu_seqlens_k = carve(l, AOTR_INT32, 1, l->b + 1, 0, 0);
    packed->q = carve(l, p->q.dtype, 3, tq, p->q.sizes[1], p->q.sizes[2]);
    packed->k = carve(l, p->k.dtype, 3, tk, p->k.sizes[1], p->k.sizes[2]);
    packed->v = carve(l, p->v.dtype, 3, tk, p->v.sizes[1], p->v.sizes[2]);
}

static void carve_fwd(layout *l, const aotr_attn_problem *p, aotr_attn_fwd_params *f)
{
    const int64_t tq = l->q.cu[l->b];
    carve_problem(l, p, &f->problem);
    f->out = carve(l, p->q.dtype, 3, tq, p->q.sizes[1], p->v.sizes[2]);
    f->lse = carve(l, AOTR_FP32, 2, tq, p->q.sizes[1], 0);
}

static void carve_bwd(layout *l, const aotr_attn_problem *p, aotr_attn_bwd_params *g)
{
    const int64_t tq = l->q.cu[l->b], tk = l->k.cu[l->b];
    carve_problem(l, p, &g->problem);
    g->out = carve(l, p->q.dtype, 3, tq, p->q.sizes[1], p->v.sizes[2]);
    g->grad_out = carve(l, p->q.dtype, 3, tq, p->q.sizes[1], p->v.sizes[2]);
    g->grad_q = carve(l, p->q.dtype, 3, tq, p->q.sizes[1], p->q.sizes[2]);
    g->grad_k = carve(l, p->k.dtype, 3, tk, p->k.sizes[1], p->k.sizes[2]);
    g->grad_v = carve(l, p->v.dtype, 3, tk, p->v.sizes[1], p->v.sizes[2]);
    g->lse = carve(l, AOTR_FP32, 2, tq, p->q.sizes[1], 0);
    g->delta = carve(l, AOTR_FP32, 2, tq, p->q.sizes[1], 0);
}

/* Allocate the block of l->size bytes (the sizing pass's l->used). */
static aotr_status alloc_block(layout *l)
{
    l->size = l->used;
    l->used = 0;
    aotr_status st = aotr_alloc_async(l->rt, l->device, l->stream, l->size, (void **)&l->block);
    if (st != AOTR_OK)
        l->block = NULL;
    return st;
}

/* Queue the packed cu_seqlens and the packed copies of q, k, v. */
static aotr_status copy_problem(layout *l, const aotr_attn_problem *p,
                                const aotr_attn_problem *packed)
{
    aotr_status st;
    if ((st = aotr_copy_2d(l->rt, l->device, l->stream, packed->cu_seqlens_q.data, 4, l->q.cu, 4, 4,
                           (size_t)(l->b + 1))) ||
        (st = aotr_copy_2d(l->rt, l->device, l->stream, packed->cu_seqlens_k.data, 4, l->k.cu, 4, 4,
                           (size_t)(l->b + 1))) ||
        (st = move_rows(l, &l->q, &p->q, &packed->q, 0)) ||
        (st = move_rows(l, &l->k, &p->k, &packed->k, 0)) ||
        (st = move_rows(l, &l->k, &p->v, &packed->v, 0)))
        return st;
    return AOTR_OK;
}

static aotr_status finish(layout *l, aotr_status st)
{
    if (l->block) {
        aotr_status freed = aotr_free_async(l->rt, l->device, l->stream, l->block);
        if (st == AOTR_OK)
            st = freed;
    }
    free(l->host);
    return st;
}

static void layout_init(layout *l, aotr_runtime *rt, int32_t device, void *stream)
{
    memset(l, 0, sizeof *l);
    l->rt = rt;
    l->device = device;
    l->stream = stream;
}

aotr_status aotr_attn_fwd_gathered(aotr_runtime *rt, const aotr_attn_fwd_params *params)
{
    layout l;
    layout_init(&l, rt, params->device, params->stream);
    aotr_attn_fwd_params f;
    memset(&f, 0, sizeof f);
    memcpy(&f, params, params->struct_size < sizeof f ? params->struct_size : sizeof f);
    f.struct_size = (uint32_t)offsetof(aotr_attn_fwd_params, seq_starts_q);
    memset(&f.seq_starts_q, 0, sizeof f.seq_starts_q * 3);
    const aotr_attn_problem *p = &params->problem;
    aotr_status st = read_layout(&l, p, &params->seq_starts_q, &params->seq_starts_k,
                                 &params->seqlens_k, &f.problem);
    if (st == AOTR_OK)
        st = like_rows_d(&params->out, &p->q, p->v.sizes[2], "out");
    if (st == AOTR_OK && aotr_present(&params->lse))
        st = check_lse_view(&params->lse, &p->q, "lse");
    if (st != AOTR_OK)
        return finish(&l, st);
    carve_fwd(&l, p, &f); /* sizing */
    if ((st = alloc_block(&l)) == AOTR_OK) {
        carve_fwd(&l, p, &f);
        if ((st = copy_problem(&l, p, &f.problem)) == AOTR_OK)
            st = aotr_attn_fwd(rt, &f);
    }
    if (st == AOTR_OK)
        st = move_rows(&l, &l.q, &params->out, &f.out, 1);
    if (st == AOTR_OK && aotr_present(&params->lse))
        st = move_lse(&l, &params->lse, &f.lse, 1);
    return finish(&l, st);
}

aotr_status aotr_attn_bwd_gathered(aotr_runtime *rt, const aotr_attn_bwd_params *params)
{
    layout l;
    layout_init(&l, rt, params->device, params->stream);
    aotr_attn_bwd_params g;
    memset(&g, 0, sizeof g);
    memcpy(&g, params, params->struct_size < sizeof g ? params->struct_size : sizeof g);
    g.struct_size = (uint32_t)offsetof(aotr_attn_bwd_params, seq_starts_q);
    memset(&g.seq_starts_q, 0, sizeof g.seq_starts_q * 3);
    memset(&g.grad_q_accum, 0, sizeof g.grad_q_accum);
    const aotr_attn_problem *p = &params->problem;
    aotr_status st = read_layout(&l, p, &params->seq_starts_q, &params->seq_starts_k,
                                 &params->seqlens_k, &g.problem);
    if (st != AOTR_OK || (st = like_rows_d(&params->out, &p->q, p->v.sizes[2], "out")) ||
        (st = like_rows_d(&params->grad_out, &p->q, p->v.sizes[2], "grad_out")) ||
        (st = like_rows(&params->grad_q, &p->q, "grad_q")) ||
        (st = like_rows(&params->grad_k, &p->k, "grad_k")) ||
        (st = like_rows(&params->grad_v, &p->v, "grad_v")) ||
        (st = check_lse_view(&params->lse, &p->q, "lse")))
        return finish(&l, st);
    carve_bwd(&l, p, &g); /* sizing */
    if ((st = alloc_block(&l)) == AOTR_OK) {
        carve_bwd(&l, p, &g);
        if ((st = copy_problem(&l, p, &g.problem)) ||
            (st = move_rows(&l, &l.q, &params->out, &g.out, 0)) ||
            (st = move_rows(&l, &l.q, &params->grad_out, &g.grad_out, 0)) ||
            (st = move_lse(&l, &params->lse, &g.lse, 0)))
            return finish(&l, st);
        st = aotr_attn_bwd(rt, &g);
    }
    if (st == AOTR_OK)
        st = move_rows(&l, &l.q, &params->grad_q, &g.grad_q, 1);
    if (st == AOTR_OK)
        st = move_rows(&l, &l.k, &params->grad_k, &g.grad_k, 1);
    if (st == AOTR_OK)
        st = move_rows(&l, &l.k, &params->grad_v, &g.grad_v, 1);
    return finish(&l, st);
}
