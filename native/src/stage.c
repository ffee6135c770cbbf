/* Zero-padded copies for head dims that are not multiples of 8.
 *
 * The kernels read the head dim in runs of 8 elements (16-byte vectors), so
 * a call at head dim d runs at the next multiple of 8 on copies whose extra
 * columns are zero: they add nothing to Q K^T, dP or Delta, and the columns
 * the kernels write past d are dropped when the outputs are copied back.
 * The copies live in one block of stream-ordered device memory; rows are
 * moved with 2D copies (one per run of rows at a single pitch: one in all
 * for dense tensors, whichever their dim order). */
#include <string.h>

#include "internal.h"

#define ROW_ALIGN 16    /* elements: every copy's row stride is a multiple */
#define BLOCK_ALIGN 256 /* bytes between the copies in the block */

typedef struct row_dim {
    int64_t size, stride, staged;
} row_dim;

static size_t element_size(int32_t dtype) { return dtype == AOTR_FP32 ? 4u : 2u; }

void aotr_stage_init(aotr_stage *s, aotr_device *dev, void *stream)
{
    memset(s, 0, sizeof *s);
    s->dev = dev;
    s->stream = stream;
}

/* The row dims (all but the last) in memory order, outermost first. */
static int row_dims(const aotr_tensor *t, int order[AOTR_MAX_RANK])
{
    int n = t->rank - 1;
    for (int i = 0; i < n; i++)
        order[i] = i;
    for (int i = 1; i < n; i++) /* insertion sort, stable: by stride, descending */
        for (int j = i; j > 0 && t->strides[order[j - 1]] < t->strides[order[j]]; j--) {
            int x = order[j];
            order[j] = order[j - 1];
            order[j - 1] = x;
        }
    return n < 0 ? 0 : n;
}

aotr_status aotr_stage_add(aotr_stage *s, aotr_tensor *slot, const char *name, int output,
                           int64_t width)
{
    const aotr_tensor *t = slot;
    if (s->count == AOTR_STAGE_MAX)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "stage: more than %d tensors", AOTR_STAGE_MAX);
    if (t->rank < 1 || t->rank > AOTR_MAX_RANK || !aotr_present(t))
        return aotr_fail(AOTR_INVALID_ARGUMENT, "%s must be given", name);
    if (t->dtype != AOTR_FP16 && t->dtype != AOTR_BF16 && t->dtype != AOTR_FP32)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "%s: the dtype must be fp16, bf16 or fp32", name);
    int64_t d = t->sizes[t->rank - 1];
    for (int i = 0; i < t->rank; i++)
        if (t->sizes[i] < 0 || (t->strides[i] < 0 && t->sizes[i] > 1))
            return aotr_fail(AOTR_INVALID_ARGUMENT, "%s: negative sizes or strides", name);
    if (d > 1 && t->strides[t->rank - 1] != 1)
        return aotr_fail(AOTR_NEEDS_LAYOUT,
                         "%s needs a unit last stride: pass a copy that has "
                         "one",
                         name);
    if (width < d)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "%s: padded width %lld < %lld", name,
                         (long long)width, (long long)d);
    /* scratch (output 2): contiguous, as the callers' workspaces are */
    int64_t pitch = output == 2 ? width : (width + ROW_ALIGN - 1) / ROW_ALIGN * ROW_ALIGN;
    aotr_tensor v = *t;
    v.data = NULL; /* set by begin() */
    v.sizes[t->rank - 1] = width;
    v.strides[t->rank - 1] = 1;
    int order[AOTR_MAX_RANK];
    int n = row_dims(t, order);
    int64_t rows = 1;
    for (int j = n - 1; j >= 0; j--) {
        v.strides[order[j]] = pitch * rows;
        rows *= t->sizes[order[j]];
    }
    size_t bytes = (size_t)rows * (size_t)pitch * element_size(t->dtype);
    s->t[s->count].slot = slot;
    s->t[s->count].orig = *t;
    s->t[s->count].output = output;
    s->t[s->count].offset = s->bytes;
    s->bytes += (bytes + BLOCK_ALIGN - 1) / BLOCK_ALIGN * BLOCK_ALIGN;
    s->count++;
    *slot = v;
    return AOTR_OK;
}

/* Copy the first d elements of every row between the caller's tensor and
 * its copy (to_copy: into the copy). */
static aotr_status copy_rows(aotr_stage *s, const aotr_tensor *orig, const aotr_tensor *staged,
                             int to_copy)
{
    aotr_driver *drv;
    int32_t device;
    drv = aotr_device_driver(s->dev, &device);
    size_t es = element_size(orig->dtype);
    size_t width = (size_t)orig->sizes[orig->rank - 1] * es;
    int order[AOTR_MAX_RANK];
    int n = row_dims(orig, order);
    row_dim dims[AOTR_MAX_RANK];
    int m = 0;
    for (int j = 0; j < n; j++) {
        int i = order[j];
        if (orig->sizes[i] == 0 || width == 0)
            return AOTR_OK; /* nothing to copy */
        if (orig->sizes[i] == 1)
            continue;
        row_dim r = {orig->sizes[i], orig->strides[i], staged->strides[i]};
        /* rows of this dim continue those of the one outside it at one pitch */
        if (m > 0 && dims[m - 1].stride == r.size * r.stride &&
            dims[m - 1].staged == r.size * r.staged) {
            r.size *= dims[m - 1].size;
            m--;
        }
        dims[m++] = r;
    }
    /* The innermost run is one 2D copy, unless its rows overlap (stride 0). */
    row_dim inner = {1, 0, 0};
    if (m > 0 && (size_t)dims[m - 1].stride * es >= width)
        inner = dims[--m];
    int64_t idx[AOTR_MAX_RANK] = {0};
    uint64_t user = (uint64_t)(uintptr_t)orig->data;
    uint64_t copy = (uint64_t)(uintptr_t)staged->data;
    for (;;) {
        int64_t uo = 0, so = 0;
        for (int j = 0; j < m; j++) {
            uo += idx[j] * dims[j].stride;
            so += idx[j] * dims[j].staged;
        }
        uint64_t u = user + (uint64_t)uo * es;
        uint64_t c = copy + (uint64_t)so * es;
        size_t up = (size_t)inner.stride * es, cp = (size_t)inner.staged * es;
        if (inner.size == 1)
            up = cp = width;
        aotr_status st = to_copy ? aotr_driver_copy_2d(drv, device, c, cp, u, up, width,
                                                       (size_t)inner.size, s->stream)
                                 : aotr_driver_copy_2d(drv, device, u, up, c, cp, width,
                                                       (size_t)inner.size, s->stream);
        if (st != AOTR_OK)
            return st;
        int j = m - 1;
        while (j >= 0 && ++idx[j] == dims[j].size)
            idx[j--] = 0;
        if (j < 0)
            return AOTR_OK;
    }
}

aotr_status aotr_stage_begin(aotr_stage *s)
{
    aotr_driver *drv;
    int32_t device;
    drv = aotr_device_driver(s->dev, &device);
    size_t bytes = s->bytes ? s->bytes : BLOCK_ALIGN;
    aotr_status st = aotr_driver_mem_alloc(drv, device, bytes, s->stream, &s->base);
    if (st == AOTR_OK)
        st = aotr_driver_memset(drv, device, s->base, 0, bytes, s->stream);
    for (int i = 0; i < s->count && st == AOTR_OK; i++) {
        s->t[i].slot->data = (void *)(uintptr_t)(s->base + s->t[i].offset);
        if (s->t[i].output == 0 || s->t[i].output == 3)
            st = copy_rows(s, &s->t[i].orig, s->t[i].slot, 1);
    }
    if (st != AOTR_OK) {
        (void)aotr_driver_mem_free(drv, device, s->base, s->stream);
        s->base = 0;
    }
    return st;
}

aotr_status aotr_stage_end(aotr_stage *s, aotr_status st)
{
    aotr_driver *drv;
    int32_t device;
    drv = aotr_device_driver(s->dev, &device);
    for (int i = 0; i < s->count && st == AOTR_OK; i++)
        if (s->t[i].output == 1 || s->t[i].output == 3)
            st = copy_rows(s, &s->t[i].orig, s->t[i].slot, 0);
    aotr_status freed = aotr_driver_mem_free(drv, device, s->base, s->stream);
    s->base = 0;
    return st != AOTR_OK ? st : freed;
}
