/* A device's kernel tables: the archive's records bound to argument slots by
 * name and grouped by functional key with the seqlen runs tuning chose, and
 * the pick of a call's kernel (functional key + seqlen bucket). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime_internal.h"
#include "slots.h"

int aotr_kernel_id_of(const char *name)
{
    for (int k = 0; k < AOTR_KERNEL_COUNT; k++)
        if (strcmp(name, aotr_kernel_names[k]) == 0)
            return k;
    return -1;
}

static int head_dim_step(int32_t head_dim)
{
    for (int i = 0; i < HEAD_DIM_STEPS; i++)
        if (head_dim == (16 << i))
            return i;
    return -1;
}

/* -1 when the functional key cannot be indexed (unknown kernel, dtype or head dim). */
static int group_slot(int kernel_id, aotr_dtype dtype, int32_t head_dim, int32_t pad, int32_t bias,
                      int32_t dropout)
{
    int step = head_dim_step(head_dim);
    if (kernel_id < 0 || dtype < AOTR_FP16 || dtype > AOTR_FP32 || step < 0)
        return -1;
    int flags = (pad + 1) * 9 + (bias + 1) * 3 + (dropout + 1);
    return ((kernel_id * 3 + (int)(dtype - AOTR_FP16)) * HEAD_DIM_STEPS + step) * 27 + flags;
}

static aotr_status bind_arguments(aotr_launchable *k, int kernel_id)
{
    const aotr_kernel_record *r = k->record;
    char why[512] = "";
    unsigned offset = 0;
    if (r->num_args > MAX_KERNEL_ARGS || r->num_args < 2) {
        snprintf(why, sizeof why, "%zu arguments (expected 2 to %d)", r->num_args, MAX_KERNEL_ARGS);
    }
    int seen[AOTR_ARG_SLOTS] = {0};
    for (size_t i = 0; !why[0] && i < r->num_args; i++) {
        const aotr_kernel_arg *a = &r->args[i];
        int slot = -1;
        if (i + 2 >= r->num_args) {
            /* the trailing global and profile scratch pointers (NULL, or
             * the launch's global scratch: aotr_device_launch) */
            if (a->kind != AOTR_ARG_POINTER)
                snprintf(why, sizeof why, "trailing argument %s is not a pointer", a->name);
        } else {
            slot = aotr_arg_slot(a->name);
            if (slot < 0)
                snprintf(why, sizeof why, "argument %s is unknown to this library", a->name);
            else if (aotr_arg_slot_kind(slot) != a->kind)
                snprintf(why, sizeof why,
                         "argument %s has type %s, this library passes "
                         "another kind",
                         a->name, a->type);
            else if (seen[slot]++)
                snprintf(why, sizeof why, "argument %s is declared twice", a->name);
        }
        unsigned size = a->kind == AOTR_ARG_I32 || a->kind == AOTR_ARG_FP32 ? 4u : 8u;
        offset = (offset + size - 1) & ~(size - 1);
        k->slots[i] = (int16_t)slot;
        k->offsets[i] = (uint16_t)offset;
        k->sizes[i] = (uint8_t)size;
        offset += size;
    }
    if (!why[0] && offset > MAX_ARGS_BYTES)
        snprintf(why, sizeof why, "%u bytes of arguments (at most %d)", offset, MAX_ARGS_BYTES);
    for (const int *req = aotr_kernel_required_slots(kernel_id); !why[0] && *req >= 0; req++)
        if (!seen[*req])
            snprintf(why, sizeof why, "argument %s is missing", aotr_arg_slot_name(*req));
    k->num_args = r->num_args;
    k->args_size = offset;
    for (size_t i = 0; !why[0] && i < r->num_divisible; i++) {
        int slot = aotr_arg_slot(r->divisible_16[i]);
        if (slot < 0 || !seen[slot])
            snprintf(why, sizeof why, "divisible_16 names %s, which is not an argument",
                     r->divisible_16[i]);
        else
            k->divisible[k->num_divisible++] = (int16_t)slot;
    }
    if (why[0]) {
        size_t n = strlen(r->key) + strlen(why) + 256;
        k->bind_error = malloc(n);
        if (!k->bind_error)
            return aotr_fail(AOTR_OUT_OF_MEMORY, "out of memory");
        snprintf(k->bind_error, n,
                 "kernel %s: %s; the archive and this library disagree on "
                 "the kernel ABI: install matching versions of aotriton-rocm and its kernel "
                 "images",
                 r->key, why);
    }
    return AOTR_OK;
}

/* The tuning choices (manifest "tuning".choices[]) by the keys their run
 * lists ("select") name: open addressing over twice as many slots. */
typedef struct choice_index {
    size_t size;
    const char **keys;
    const aotr_json **choices;
} choice_index;

static const aotr_json *run_key_json(const aotr_json *run)
{
    return run->type == AOTR_JSON_ARRAY && run->n >= 2 ? &run->items[1] : NULL;
}

static aotr_status index_choices(const aotr_json *choices, choice_index *ix)
{
    memset(ix, 0, sizeof *ix);
    if (!choices || choices->type != AOTR_JSON_ARRAY)
        return AOTR_OK;
    size_t runs = 0;
    for (size_t c = 0; c < choices->n; c++) {
        const aotr_json *sel = aotr_json_get(&choices->items[c], "select");
        runs += sel && sel->type == AOTR_JSON_ARRAY ? sel->n : 0;
    }
    ix->size = 2 * runs + 1;
    ix->keys = calloc(ix->size, sizeof *ix->keys);
    ix->choices = calloc(ix->size, sizeof *ix->choices);
    if (!ix->keys || !ix->choices)
        return aotr_fail(AOTR_OUT_OF_MEMORY, "out of memory building the kernel tables");
    for (size_t c = 0; c < choices->n; c++) {
        const aotr_json *sel = aotr_json_get(&choices->items[c], "select");
        for (size_t i = 0; sel && sel->type == AOTR_JSON_ARRAY && i < sel->n; i++) {
            const char *key = aotr_json_str(run_key_json(&sel->items[i]));
            if (!key)
                continue;
            size_t h = aotr_str_hash(key) % ix->size;
            while (ix->keys[h] && strcmp(ix->keys[h], key) != 0)
                h = (h + 1) % ix->size;
            if (!ix->keys[h]) { /* the first choice naming a key wins */
                ix->keys[h] = key;
                ix->choices[h] = &choices->items[c];
            }
        }
    }
    return AOTR_OK;
}

static const aotr_json *choice_naming(const choice_index *ix, const char *key)
{
    if (ix->size == 0)
        return NULL;
    for (size_t h = aotr_str_hash(key) % ix->size; ix->keys[h]; h = (h + 1) % ix->size)
        if (strcmp(ix->keys[h], key) == 0)
            return ix->choices[h];
    return NULL;
}

static void free_choice_index(choice_index *ix)
{
    free(ix->keys);
    free(ix->choices);
}

static aotr_launchable *find_in(aotr_launchable **members, size_t n, const char *key)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(members[i]->record->key, key) == 0)
            return members[i];
    return NULL;
}

/* Fill one group from its members (archive order) and the tuning data: the
 * runs the build chose for some seqlen bucket (and its decoding tile, if
 * any), else the first member. */
static void fill_group(aotr_group *g, aotr_launchable **members, size_t n, const aotr_json *tuning,
                       const choice_index *ix)
{
    const aotr_json *axes = aotr_json_get(tuning, "axes");
    const aotr_json *choice = NULL;
    for (size_t i = 0; i < n && !choice; i++)
        choice = choice_naming(ix, members[i]->record->key);
    const aotr_json *sel = aotr_json_get(choice, "select");
    g->num_runs = 1;
    g->runs[0] = members[0];
    g->on_k = 0;
    if (!sel || sel->type != AOTR_JSON_ARRAY || sel->n == 0 || sel->n > MAX_RUNS)
        return;
    aotr_group t = {0};
    t.num_runs = sel->n;
    for (size_t i = 0; i < sel->n; i++) {
        const aotr_json *run = &sel->items[i];
        const char *key = aotr_json_str(run_key_json(run));
        t.runs[i] = key ? find_in(members, n, key) : NULL;
        if (!t.runs[i])
            return;
        if (i + 1 < sel->n && !aotr_json_int(&run->items[0], &t.bounds[i]))
            return;
    }
    const char *axis = aotr_json_str(aotr_json_get(axes, members[0]->record->kernel));
    t.on_k = axis && strcmp(axis, "seqlen_k") == 0;
    /* "decode": [seqlen_q_max, key, source] */
    const aotr_json *decode = aotr_json_get(choice, "decode");
    if (decode && decode->type == AOTR_JSON_ARRAY && decode->n >= 2 &&
        aotr_json_int(&decode->items[0], &t.decode_rows) && t.decode_rows > 0) {
        const char *key = aotr_json_str(&decode->items[1]);
        t.decode = key ? find_in(members, n, key) : NULL;
        if (!t.decode)
            return;
    }
    *g = t;
}

/* What bind_arguments decided for `from`, for a record with the same lists. */
static void copy_binding(aotr_launchable *k, const aotr_launchable *from)
{
    memcpy(k->slots, from->slots, sizeof k->slots);
    memcpy(k->offsets, from->offsets, sizeof k->offsets);
    memcpy(k->sizes, from->sizes, sizeof k->sizes);
    memcpy(k->divisible, from->divisible, sizeof k->divisible);
    k->num_args = from->num_args;
    k->args_size = from->args_size;
    k->num_divisible = from->num_divisible;
}

#define BIND_MEMO 64

aotr_status aotr_build_tables(aotr_device *dev)
{
    const aotr_kernel_record *records = NULL;
    size_t n = aotr_archive_records(dev->archive, &records);
    dev->launchables = calloc(n ? n : 1, sizeof *dev->launchables);
    aotr_launchable **order = calloc(n ? n : 1, sizeof *order);
    int *slot_of = calloc(n ? n : 1, sizeof *slot_of);
    aotr_launchable *bound[BIND_MEMO] = {0};
    aotr_status st = AOTR_OK;
    if (!dev->launchables || !order || !slot_of) {
        st = aotr_fail(AOTR_OUT_OF_MEMORY, "out of memory building the kernel tables");
        goto done;
    }
    dev->num_launchables = n;
    for (size_t i = 0; i < n; i++) {
        const aotr_kernel_record *r = &records[i];
        aotr_launchable *k = &dev->launchables[i];
        k->record = r;
        k->index = i;
        int kid = aotr_kernel_id_of(r->kernel);
        slot_of[i] =
            group_slot(kid, r->dtype, r->head_dim, r->pad_head, r->has_bias, r->enable_dropout);
        if (slot_of[i] < 0)
            continue;
        /* records sharing their argument lists (archive.c) bind alike */
        aotr_launchable **same = &bound[((uintptr_t)r->args >> 4) % BIND_MEMO];
        if (*same && (*same)->record->args == r->args &&
            (*same)->record->divisible_16 == r->divisible_16 &&
            strcmp((*same)->record->kernel, r->kernel) == 0 && !(*same)->bind_error) {
            copy_binding(k, *same);
        } else {
            if ((st = bind_arguments(k, kid)) != AOTR_OK)
                goto done;
            *same = k;
        }
    }
    const aotr_json *tuning = aotr_json_get(aotr_archive_manifest(dev->archive), "tuning");
    choice_index ix;
    if ((st = index_choices(aotr_json_get(tuning, "choices"), &ix)) != AOTR_OK)
        goto done_index;
    for (size_t i = 0; i < n; i++) {
        int slot = slot_of[i];
        if (slot < 0 || dev->groups[slot])
            continue;
        size_t m = 0;
        for (size_t j = i; j < n; j++)
            if (slot_of[j] == slot)
                order[m++] = &dev->launchables[j];
        aotr_group *g = calloc(1, sizeof *g);
        if (!g) {
            st = aotr_fail(AOTR_OUT_OF_MEMORY, "out of memory building the kernel tables");
            goto done_index;
        }
        fill_group(g, order, m, tuning, &ix);
        dev->groups[slot] = g;
    }
done_index:
    free_choice_index(&ix);
done:
    free(order);
    free(slot_of);
    return st;
}

/* -- selection ------------------------------------------------------------ */

static const char *dtype_name(aotr_dtype t)
{
    return t == AOTR_FP16 ? "fp16" : t == AOTR_BF16 ? "bf16" : t == AOTR_FP32 ? "fp32" : "?";
}

const aotr_launchable *aotr_device_pick(aotr_device *dev, int kernel_id, aotr_dtype dtype,
                                        int32_t head_dim, unsigned features, int64_t seqlen_q,
                                        int64_t seqlen_k)
{
    if (head_dim % 8) {
        /* The kernels read head dims in runs of 8 (stage.c pads the rest). */
        aotr_fail(AOTR_UNSUPPORTED, "the kernels take head dims that are multiples of 8, not %d",
                  (int)head_dim);
        return NULL;
    }
    int32_t block_d = 16;
    while (block_d < head_dim)
        block_d *= 2;
    int bias = !!(features & AOTR_PICK_BIAS), dropout = !!(features & AOTR_PICK_DROPOUT);
    int slots[2], n = 0;
    if (kernel_id == AOTR_KERNEL_DROPOUT_UNIFORM || kernel_id == AOTR_KERNEL_PHILOX_STATE) {
        /* One variant, dtype fp32 and head_dim 16 fixed labels (variants.toml). */
        slots[n++] = group_slot(kernel_id, AOTR_FP32, 16, -1, -1, -1);
    } else if (kernel_id == AOTR_KERNEL_BWD_PRE || kernel_id == AOTR_KERNEL_KVCACHE ||
               kernel_id == AOTR_KERNEL_KVCACHE_COMBINE ||
               kernel_id == AOTR_KERNEL_BWD_DQ_CONVERT) {
        /* always masked along the head dim; no bias or dropout axis */
        slots[n++] = group_slot(kernel_id, dtype, block_d, -1, -1, -1);
    } else {
        if (block_d == head_dim && !(features & AOTR_PICK_SCORE_MODS))
            slots[n++] = group_slot(kernel_id, dtype, block_d, 0, bias, dropout);
        slots[n++] = group_slot(kernel_id, dtype, block_d, 1, bias, dropout);
    }
    for (int i = 0; i < n; i++) {
        const aotr_group *g = slots[i] >= 0 ? dev->groups[slots[i]] : NULL;
        if (!g)
            continue;
        aotr_launchable *run = g->decode && seqlen_q <= g->decode_rows ? g->decode : NULL;
        if (!run) {
            int64_t s = g->on_k ? seqlen_k : seqlen_q;
            size_t r = 0;
            while (r + 1 < g->num_runs && g->bounds[r] < s)
                r++;
            run = g->runs[r];
        }
        int32_t min_seqlen = run->record->min_seqlen;
        if (seqlen_q < min_seqlen || seqlen_k < min_seqlen) {
            aotr_fail(AOTR_UNSUPPORTED,
                      "the %s image's %s kernel serves sequences of %d and "
                      "more",
                      dev->arch, aotr_kernel_names[kernel_id], (int)min_seqlen);
            return NULL;
        }
        return run;
    }
    aotr_fail(AOTR_UNSUPPORTED, "the %s image has no %s kernel for dtype=%s, head_dim=%d%s%s",
              dev->arch, aotr_kernel_names[kernel_id], dtype_name(dtype), (int)head_dim,
              bias ? ", with a bias" : "", dropout ? ", with dropout" : "");
    return NULL;
}
