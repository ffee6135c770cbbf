/* The packed rows a variable-length batch's offsets cover, read on the host.
 *
 * flash-attn's varlen functions trust cu_seqlens; offsets past the packed
 * rows would make the kernels read and write outside q, k and v. So the
 * flash-attn routes read both vectors back (one copy each and one stream
 * synchronisation) and check them before a launch. During a graph capture
 * nothing can be read back: the caller answers for the offsets there, as
 * with flash-attn. */
#include <stdint.h>
#include <stdlib.h>

#include "internal.h"

/* The checks of one side's offsets, `n` entries read into `at`. */
static aotr_status judge(const int32_t *at, int64_t n, const char *side, int64_t rows,
                         int32_t longest, int64_t *end)
{
    *end = 0;
    if (n == 0)
        return AOTR_OK;
    if (at[0] != 0)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "cu_seqlens_%s must start at 0, got %d", side,
                         (int)at[0]);
    int64_t most = 0;
    for (int64_t i = 1; i < n; ++i) {
        const int64_t len = (int64_t)at[i] - at[i - 1];
        if (len < 0)
            return aotr_fail(AOTR_INVALID_ARGUMENT, "cu_seqlens_%s must be non-decreasing", side);
        if (len > most)
            most = len;
    }
    if (at[n - 1] > rows)
        return aotr_fail(AOTR_INVALID_ARGUMENT,
                         "cu_seqlens_%s ends at %d, beyond the %lld packed rows", side,
                         (int)at[n - 1], (long long)rows);
    if (most > longest)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "a sequence of %lld rows exceeds max_seqlen_%s=%d",
                         (long long)most, side, (int)longest);
    *end = at[n - 1];
    return AOTR_OK;
}

aotr_status aotr_varlen_rows(aotr_runtime *rt, int32_t device, void *stream,
                             const aotr_attn_problem *p, int64_t *rows_q, int64_t *rows_k)
{
    if (!rt || !p || !rows_q || !rows_k)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "aotr_varlen_rows: a NULL argument");
    *rows_q = *rows_k = -1;
    const aotr_tensor *cu[2] = {&p->cu_seqlens_q, &p->cu_seqlens_k};
    const aotr_tensor *packed[2] = {&p->q, &p->k};
    for (int i = 0; i < 2; ++i) {
        const aotr_tensor *t = cu[i];
        if (!aotr_present(t) || t->dtype != AOTR_INT32 || t->rank != 1 || t->sizes[0] < 0 ||
            (t->sizes[0] > 1 && t->strides[0] < 1) || packed[i]->rank != 3)
            return aotr_fail(AOTR_INVALID_ARGUMENT,
                             "aotr_varlen_rows: a packed (total, heads, head_dim) problem with "
                             "1-D int32 cu_seqlens_q and cu_seqlens_k");
    }
    int capturing = 0;
    aotr_status st = aotr_stream_capturing(rt, device, stream, &capturing);
    if (st != AOTR_OK || capturing)
        return st;
    const int64_t n[2] = {cu[0]->sizes[0], cu[1]->sizes[0]};
    int32_t *host = malloc((size_t)(n[0] + n[1] + 1) * sizeof *host);
    if (!host)
        return aotr_fail(AOTR_OUT_OF_MEMORY, "aotr_varlen_rows: no host memory for the offsets");
    for (int i = 0; i < 2 && st == AOTR_OK; ++i) {
        const size_t pitch = (size_t)(n[i] > 1 ? cu[i]->strides[0] : 1) * sizeof *host;
        st = aotr_copy_2d(rt, device, stream, host + (i ? n[0] : 0), sizeof *host, cu[i]->data,
                          pitch, sizeof *host, (size_t)n[i]);
    }
    if (st == AOTR_OK)
        st = aotr_stream_synchronize(rt, device, stream);
    int64_t end[2] = {0, 0};
    if (st == AOTR_OK)
        st = judge(host, n[0], "q", p->q.sizes[0], p->max_seqlen_q, &end[0]);
    if (st == AOTR_OK)
        st = judge(host + n[0], n[1], "k", p->k.sizes[0], p->max_seqlen_k, &end[1]);
    free(host);
    if (st == AOTR_OK) {
        *rows_q = end[0];
        *rows_k = end[1];
    }
    return st;
}
