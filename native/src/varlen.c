/* Variable-length batches whose sequences do not lie end to end as
 * cu_seqlens says (seq_starts_q/k, seqlens_k of aotr_attn_fwd/bwd_params).
 *
 * The kernels take each such side's sequences from one int32 vector of
 * 2 * (batch + 1) entries, lengths (cumulative, or one per sequence) then
 * starts, and from the STARTS/LENGTHS bits of their `varlen` word (see the
 * conventions in kernels/flash_attention.py). The vectors are put together
 * on the stream by device-to-device copies into stream-ordered memory freed
 * after the call: nothing is read on the host, so a graph capture records
 * the call like any other. As with cu_seqlens, the values are the caller's
 * to get right: the kernels read the rows they name. */
#include <stdint.h>
#include <string.h>

#include "internal.h"

enum { STARTS = 1, LENGTHS = 2 };
/* Q's bits sit at 1 << 1, K's at 1 << 3 (bit 0: a variable-length batch) */
#define SIDE_BITS(side, bits) ((bits) << (1 + 2 * (side)))

static int has(uint32_t struct_size, size_t end, const aotr_tensor *t)
{
    return struct_size >= end && aotr_present(t);
}

int aotr_varlen_fwd_places(const aotr_attn_fwd_params *p)
{
    const size_t end = offsetof(aotr_attn_fwd_params, seqlens_k) + sizeof(aotr_tensor);
    return has(p->struct_size, end, &p->seq_starts_q) ||
           has(p->struct_size, end, &p->seq_starts_k) || has(p->struct_size, end, &p->seqlens_k);
}

int aotr_varlen_bwd_places(const aotr_attn_bwd_params *p)
{
    const size_t end = offsetof(aotr_attn_bwd_params, seqlens_k) + sizeof(aotr_tensor);
    return has(p->struct_size, end, &p->seq_starts_q) ||
           has(p->struct_size, end, &p->seq_starts_k) || has(p->struct_size, end, &p->seqlens_k);
}

void aotr_placed_problem(aotr_attn_problem *p, const aotr_tensor *starts_k,
                         const aotr_tensor *lens_k)
{
    if (!aotr_present(&p->cu_seqlens_k) && aotr_present(starts_k) && aotr_present(lens_k))
        p->cu_seqlens_k = p->cu_seqlens_q;
    if (p->max_seqlen_q <= 0 && p->q.rank == 3)
        p->max_seqlen_q = (int32_t)(p->q.sizes[0] < INT32_MAX ? p->q.sizes[0] : INT32_MAX);
    if (p->max_seqlen_k <= 0 && p->k.rank == 3)
        p->max_seqlen_k = (int32_t)(p->k.sizes[0] < INT32_MAX ? p->k.sizes[0] : INT32_MAX);
}

static aotr_status check_vector(const aotr_tensor *t, const char *name, int64_t n)
{
    if (t->dtype != AOTR_INT32 || t->rank != 1 || t->sizes[0] < n || t->strides[0] < 1)
        return aotr_fail(AOTR_INVALID_ARGUMENT,
                         "%s must be a 1-D int32 tensor of at least %lld "
                         "entries",
                         name, (long long)n);
    return AOTR_OK;
}

/* Queue the copy of `n` entries of `t` to `dst`. */
static aotr_status put(const aotr_placement *pl, int32_t *dst, const aotr_tensor *t, int64_t n)
{
    return aotr_copy_2d(pl->rt, pl->device, pl->stream, dst, 4, t->data, (size_t)t->strides[0] * 4,
                        4, (size_t)n);
}

aotr_status aotr_placement_begin(aotr_runtime *rt, int32_t device, void *stream,
                                 const aotr_attn_problem *p, const aotr_tensor *starts_q,
                                 const aotr_tensor *starts_k, const aotr_tensor *lens_k,
                                 aotr_placement *pl)
{
    memset(pl, 0, sizeof *pl);
    pl->rt = rt;
    pl->device = device;
    pl->stream = stream;
    const int varlen = aotr_present(&p->cu_seqlens_q);
    pl->word = varlen;
    pl->cu_q = p->cu_seqlens_q.data;
    pl->cu_k = p->cu_seqlens_k.data;
    const int q_placed = starts_q && aotr_present(starts_q);
    const int k_starts = starts_k && aotr_present(starts_k),
              k_lens = lens_k && aotr_present(lens_k);
    if (!q_placed && !k_starts && !k_lens)
        return AOTR_OK;
    if (!varlen)
        return aotr_fail(AOTR_INVALID_ARGUMENT,
                         "seq_starts_q/k and seqlens_k place the sequences "
                         "of a variable-length batch: give cu_seqlens_q too");
    const int64_t b = p->cu_seqlens_q.sizes[0] - 1, n = b + 1;
    aotr_status st;
    if ((q_placed && (st = check_vector(starts_q, "seq_starts_q", b))) ||
        (k_starts && (st = check_vector(starts_k, "seq_starts_k", b))) ||
        (k_lens && (st = check_vector(lens_k, "seqlens_k", b))))
        return st;
    const int k_placed = k_starts || k_lens;
    const size_t bytes = (size_t)((q_placed + k_placed) * 2 * n) * sizeof(int32_t);
    if ((st = aotr_alloc_async(rt, device, stream, bytes, &pl->block)) != AOTR_OK) {
        pl->block = NULL;
        return st;
    }
    int32_t *at = pl->block;
    if (q_placed) {
        if ((st = put(pl, at, &p->cu_seqlens_q, n)) || (st = put(pl, at + n, starts_q, b)))
            return st;
        pl->cu_q = at;
        pl->word |= SIDE_BITS(0, STARTS);
        at += 2 * n;
    }
    if (k_placed) {
        /* K's lengths: seqlens_k, or cumulative in cu_seqlens_k; its starts:
         * seq_starts_k, or cu_seqlens_k's */
        const aotr_tensor *cu_k = &p->cu_seqlens_k;
        if ((st = put(pl, at, k_lens ? lens_k : cu_k, k_lens ? b : n)) ||
            (st = put(pl, at + n, k_starts ? starts_k : cu_k, b)))
            return st;
        pl->cu_k = at;
        pl->word |= SIDE_BITS(1, STARTS | (k_lens ? LENGTHS : 0));
    }
    return AOTR_OK;
}

aotr_status aotr_placement_end(aotr_placement *pl, aotr_status st)
{
    if (pl->block) {
        aotr_status freed = aotr_free_async(pl->rt, pl->device, pl->stream, pl->block);
        pl->block = NULL;
        if (st == AOTR_OK)
            st = freed;
    }
    return st;
}
