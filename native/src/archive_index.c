/* The kernel archive's index, parsed (json.c): the manifest, the archive's
 * identity (arch, ABI line) and the kernel records. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "archive_internal.h"

#define MAX_CODE_SIZE ((uint64_t)1 << 30)

static const char *const MANIFEST_KEYS[] = {
    "format_version", "package_version", "abi_version", "rocm_profile",     "arch",
    "backend",        "warp_size",       "compiler",    "compiler_version", "build_inputs_hash",
    "blob_sha256",
};

/* -------------------------------------------------------------- records */

static int get_int(const aotr_json *obj, const char *name, int64_t lo, int64_t hi, int64_t *out)
{
    int64_t v;
    if (!aotr_json_int(aotr_json_get(obj, name), &v) || v < lo || v > hi)
        return 0;
    *out = v;
    return 1;
}

/* A functional flag: true/false (or 0/1); -1 when absent. */
static int get_flag(const aotr_json *functional, const char *name, int32_t *out)
{
    const aotr_json *v = aotr_json_get(functional, name);
    int64_t i;
    if (v == NULL)
        *out = -1;
    else if (v->type == AOTR_JSON_TRUE)
        *out = 1;
    else if (v->type == AOTR_JSON_FALSE)
        *out = 0;
    else if (aotr_json_int(v, &i) && (i == 0 || i == 1))
        *out = (int32_t)i;
    else
        return 0;
    return 1;
}

static int arg_kind(const char *type, aotr_arg_kind *kind)
{
    if (type[0] == '*' && type[1] != '\0')
        *kind = AOTR_ARG_POINTER;
    else if (strcmp(type, "i32") == 0)
        *kind = AOTR_ARG_I32;
    else if (strcmp(type, "fp32") == 0)
        *kind = AOTR_ARG_FP32;
    else if (strcmp(type, "i64") == 0)
        *kind = AOTR_ARG_I64;
    else
        return 0;
    return 1;
}

/* Records of one kernel share their argument and divisible_16 lists in the
 * parsed index (json.c shares repeated containers); they share the checked
 * lists too. Direct-mapped by the JSON list's address; a miss only costs a
 * second check. */
#define SHARED_LISTS 64

typedef struct list_cursor {
    aotr_kernel_arg *args_next;
    const char **div_next;
    const aotr_json *args_json[SHARED_LISTS];
    const aotr_kernel_arg *args[SHARED_LISTS];
    const aotr_json *div_json[SHARED_LISTS];
    const char *const *div[SHARED_LISTS];
} list_cursor;

static size_t list_slot(const aotr_json *items) { return ((uintptr_t)items >> 4) % SHARED_LISTS; }

static aotr_status parse_record(aotr_archive *a, size_t index, const aotr_json *j,
                                list_cursor *lists)
{
    aotr_kernel_record *r = &a->records[index];
    int64_t v;
    memset(r, 0, sizeof *r);
    r->json = j;
    if (j->type != AOTR_JSON_OBJECT)
        return aotr_archive_invalid(a, "kernel record %zu is not an object", index);
    r->key = aotr_json_str(aotr_json_get(j, "key"));
    if (r->key == NULL || r->key[0] == '\0')
        return aotr_archive_invalid(a, "kernel record %zu has no key", index);
    const char *k = r->key;
#define BAD(what) aotr_archive_invalid(a, "kernel '%s': %s", k, what)
    r->kernel = aotr_json_str(aotr_json_get(j, "kernel"));
    if (r->kernel == NULL || r->kernel[0] == '\0')
        return BAD("no kernel name");
    r->symbol = aotr_json_str(aotr_json_get(j, "symbol"));
    if (r->symbol == NULL || r->symbol[0] == '\0')
        return BAD("no symbol");

    const aotr_json *f = aotr_json_get(j, "functional");
    if (f == NULL || f->type != AOTR_JSON_OBJECT)
        return BAD("no functional object");
    const char *dtype = aotr_json_str(aotr_json_get(f, "dtype"));
    if (dtype == NULL)
        return BAD("functional has no dtype");
    if (strcmp(dtype, "fp16") == 0)
        r->dtype = AOTR_FP16;
    else if (strcmp(dtype, "bf16") == 0)
        r->dtype = AOTR_BF16;
    else if (strcmp(dtype, "fp32") == 0)
        r->dtype = AOTR_FP32;
    else
        return aotr_archive_invalid(a, "kernel '%s': unknown dtype '%s' (known: fp16, bf16, fp32)",
                                    k, dtype);
    if (!get_int(f, "head_dim", 1, INT32_MAX, &v))
        return BAD("functional head_dim is missing or not a positive integer");
    r->head_dim = (int32_t)v;
    if (!get_flag(f, "pad_head", &r->pad_head) || !get_flag(f, "has_bias", &r->has_bias) ||
        !get_flag(f, "enable_dropout", &r->enable_dropout))
        return BAD("functional pad_head/has_bias/enable_dropout must be true or false");

    const aotr_json *c = aotr_json_get(j, "config");
    if (c == NULL || c->type != AOTR_JSON_OBJECT)
        return BAD("no config object");
    if (aotr_json_get(c, "BLOCK_M") != NULL) {
        if (!get_int(c, "BLOCK_M", 1, INT32_MAX, &v))
            return BAD("config BLOCK_M is not a positive integer");
        r->block_m = (int32_t)v;
    }
    if (aotr_json_get(c, "BLOCK_N") != NULL) {
        if (!get_int(c, "BLOCK_N", 1, INT32_MAX, &v))
            return BAD("config BLOCK_N is not a positive integer");
        r->block_n = (int32_t)v;
    }
    if (aotr_json_get(c, "MIN_SEQLEN") != NULL) {
        if (!get_int(c, "MIN_SEQLEN", 1, INT32_MAX, &v))
            return BAD("config MIN_SEQLEN is not a positive integer");
        r->min_seqlen = (int32_t)v;
    }
    if (!get_int(j, "num_warps", 1, 1024, &v))
        return BAD("num_warps is missing or out of range");
    r->num_warps = (int32_t)v;
    if (!get_int(j, "num_stages", 0, 1024, &v))
        return BAD("num_stages is missing or out of range");
    r->num_stages = (int32_t)v;
    if (!get_int(j, "warp_size", 1, 1024, &v))
        return BAD("warp_size is missing or out of range");
    r->warp_size = (int32_t)v;
    if (!get_int(j, "shared", 0, UINT32_MAX, &v))
        return BAD("shared is missing or out of range");
    r->shared = (uint32_t)v;
    if (!get_int(j, "global_scratch_size", 0, UINT32_MAX, &v))
        return BAD("global_scratch_size is missing or out of range");
    r->global_scratch_size = (uint32_t)v;

    const aotr_json *args = aotr_json_get(j, "args");
    if (args == NULL || args->type != AOTR_JSON_ARRAY)
        return BAD("no args list");
    r->num_args = args->n;
    size_t slot = list_slot(args->items);
    if (args->n > 0 && lists->args_json[slot] == args->items) {
        r->args = lists->args[slot];
    } else {
        r->args = lists->args_next;
        for (size_t i = 0; i < args->n; i++) {
            const aotr_json *pair = &args->items[i];
            aotr_kernel_arg *arg = &lists->args_next[i];
            if (pair->type != AOTR_JSON_ARRAY || pair->n != 2 ||
                (arg->name = aotr_json_str(&pair->items[0])) == NULL ||
                (arg->type = aotr_json_str(&pair->items[1])) == NULL)
                return aotr_archive_invalid(
                    a, "kernel '%s': argument %zu is not a [name, type] pair", k, i);
            if (!arg_kind(arg->type, &arg->kind))
                return aotr_archive_invalid(
                    a,
                    "kernel '%s': argument '%s' has type '%s', which this library "
                    "cannot pass (known: *<type>, i32, i64, fp32)",
                    k, arg->name, arg->type);
        }
        lists->args_next += args->n;
        lists->args_json[slot] = args->items;
        lists->args[slot] = r->args;
    }

    const aotr_json *div = aotr_json_get(j, "divisible_16");
    if (div == NULL || div->type != AOTR_JSON_ARRAY)
        return BAD("no divisible_16 list");
    r->num_divisible = div->n;
    slot = list_slot(div->items);
    if (div->n > 0 && lists->div_json[slot] == div->items) {
        r->divisible_16 = lists->div[slot];
    } else {
        r->divisible_16 = lists->div_next;
        for (size_t i = 0; i < div->n; i++)
            if ((lists->div_next[i] = aotr_json_str(&div->items[i])) == NULL)
                return BAD("divisible_16 holds a non-string");
        lists->div_next += div->n;
        lists->div_json[slot] = div->items;
        lists->div[slot] = r->divisible_16;
    }

    int64_t off, csize, size;
    if (!get_int(j, "offset", 0, INT64_MAX, &off) ||
        !get_int(j, "compressed_size", 0, INT64_MAX, &csize) ||
        !get_int(j, "size", 0, INT64_MAX, &size))
        return BAD("offset/compressed_size/size missing or negative");
    r->offset = (uint64_t)off;
    r->compressed_size = (uint64_t)csize;
    r->size = (uint64_t)size;
    if (r->offset > a->blob_size || r->compressed_size > a->blob_size - r->offset)
        return BAD("points outside the blob region");
    if (r->size > MAX_CODE_SIZE)
        return BAD("code object larger than 1 GiB");
    if (!aotr_hex_to_digest(aotr_json_str(aotr_json_get(j, "sha256")), r->sha256))
        return BAD("sha256 is not 64 lowercase hex digits");
#undef BAD
    return AOTR_OK;
}

static int compare_keys(const void *x, const void *y)
{
    const aotr_kernel_record *const *a = x, *const *b = y;
    return strcmp((*a)->key, (*b)->key);
}

static aotr_status parse_records(aotr_archive *a, const aotr_json *kernels)
{
    size_t total_args = 0, total_div = 0;
    for (size_t i = 0; i < kernels->n; i++) {
        const aotr_json *r = &kernels->items[i];
        const aotr_json *args = aotr_json_get(r, "args");
        const aotr_json *div = aotr_json_get(r, "divisible_16");
        if (args != NULL && args->type == AOTR_JSON_ARRAY)
            total_args += args->n;
        if (div != NULL && div->type == AOTR_JSON_ARRAY)
            total_div += div->n;
    }
    a->count = kernels->n;
    a->records = calloc(kernels->n ? kernels->n : 1, sizeof *a->records);
    a->args = calloc(total_args ? total_args : 1, sizeof *a->args);
    a->divisible = calloc(total_div ? total_div : 1, sizeof *a->divisible);
    a->code = calloc(kernels->n ? kernels->n : 1, sizeof *a->code);
    if (!a->records || !a->args || !a->divisible || !a->code)
        return aotr_fail(AOTR_OUT_OF_MEMORY, "%s: out of memory", a->path);
    list_cursor *lists = calloc(1, sizeof *lists);
    if (lists == NULL)
        return aotr_fail(AOTR_OUT_OF_MEMORY, "%s: out of memory", a->path);
    lists->args_next = a->args;
    lists->div_next = a->divisible;
    for (size_t i = 0; i < kernels->n; i++) {
        aotr_status st = parse_record(a, i, &kernels->items[i], lists);
        if (st != AOTR_OK) {
            free(lists);
            return st;
        }
    }
    free(lists);
    if (a->count > 1) {
        const aotr_kernel_record **sorted = malloc(a->count * sizeof *sorted);
        if (sorted == NULL)
            return aotr_fail(AOTR_OUT_OF_MEMORY, "%s: out of memory", a->path);
        for (size_t i = 0; i < a->count; i++)
            sorted[i] = &a->records[i];
        qsort(sorted, a->count, sizeof *sorted, compare_keys);
        for (size_t i = 1; i < a->count; i++)
            if (strcmp(sorted[i - 1]->key, sorted[i]->key) == 0) {
                aotr_status st =
                    aotr_archive_invalid(a, "kernel key '%s' appears twice", sorted[i]->key);
                free(sorted);
                return st;
            }
        free(sorted);
    }
    return AOTR_OK;
}

/* ------------------------------------------------------------- identity */

static aotr_status check_identity(aotr_archive *a)
{
    const aotr_json *m = a->manifest;
    const char *arch = aotr_json_str(aotr_json_get(m, "arch"));
    const char *abi = aotr_json_str(aotr_json_get(m, "abi_version"));
    const aotr_json *fv = aotr_json_get(m, "format_version");
    char pkg[64];
    if (fv != NULL) {
        int64_t v;
        if (!aotr_json_int(fv, &v) || v != (int64_t)a->format_version)
            return aotr_fail(AOTR_IDENTITY_MISMATCH,
                             "%s: the manifest's format_version does not match the header's "
                             "(format %u): the archive was not written by aotriton-rocm. "
                             "Reinstall the kernel image wheel or rebuild the archive with "
                             "`aotriton-rocm build`",
                             a->path, a->format_version);
    }
    const char *base = aotr_base_name(a->path);
    size_t alen = arch ? strlen(arch) : 0;
    if (a->fd >= 0 && arch != NULL &&
        !(strlen(base) == alen + 5 && strncmp(base, arch, alen) == 0 &&
          strcmp(base + alen, ".aotr") == 0)) {
        aotr_arch_package_name(a->file_arch, pkg, sizeof pkg);
        return aotr_fail(AOTR_IDENTITY_MISMATCH,
                         "%s: the archive holds kernels for %s but its file name says %s (an "
                         "archive must be named <arch>.aotr, here %s.aotr). Reinstall the image "
                         "wheel for %s: pip install --force-reinstall --no-deps aotriton-rocm-%s "
                         "(or the conda package), or rebuild with `aotriton-rocm build`",
                         a->path, arch, a->file_arch, arch, a->file_arch, pkg);
    }
    const char *lines[2] = {abi, NULL};
    const aotr_json *abi_obj = aotr_json_get(m, "abi");
    if (abi_obj != NULL && abi_obj->type == AOTR_JSON_OBJECT)
        lines[1] = aotr_json_str(aotr_json_get(abi_obj, "abi_line"));
    for (int i = 0; i < 2; i++) {
        if (lines[i] == NULL || strcmp(lines[i], AOTR_ABI_LINE) == 0)
            continue;
        aotr_arch_package_name(arch ? arch : a->file_arch, pkg, sizeof pkg);
        return aotr_fail(AOTR_IDENTITY_MISMATCH,
                         "%s: the archive was built for ABI line %s of aotriton-rocm, this "
                         "libaotriton_rocm is ABI line %s. Install matching versions, e.g. "
                         "pip install 'aotriton-rocm[%s]~=%s.0'",
                         a->path, lines[i], AOTR_ABI_LINE, pkg, AOTR_ABI_LINE);
    }
    return AOTR_OK;
}

aotr_status aotr_archive_parse_index(aotr_archive *a)
{
    a->manifest = aotr_json_get(a->index, "manifest");
    const aotr_json *kernels = aotr_json_get(a->index, "kernels");
    if (a->manifest == NULL || a->manifest->type != AOTR_JSON_OBJECT)
        return aotr_archive_invalid(a, "kernel archive index has no manifest object");
    if (kernels == NULL || kernels->type != AOTR_JSON_ARRAY)
        return aotr_archive_invalid(a, "kernel archive index has no kernels list");
    if (kernels->n == 0)
        return aotr_archive_invalid(a, "kernel archive index lists no kernels (an empty image)");
    aotr_status st = check_identity(a);
    if (st != AOTR_OK)
        return st;
    char missing[512] = "";
    size_t n = 0;
    for (size_t i = 0; i < sizeof MANIFEST_KEYS / sizeof *MANIFEST_KEYS; i++)
        if (aotr_json_get(a->manifest, MANIFEST_KEYS[i]) == NULL)
            n += (size_t)snprintf(missing + n, sizeof missing - n, "%s%s", n ? ", " : "",
                                  MANIFEST_KEYS[i]);
    if (n > 0)
        return aotr_archive_invalid(a, "manifest lacks %s", missing);
    if (aotr_json_str(aotr_json_get(a->manifest, "arch")) == NULL ||
        aotr_json_str(aotr_json_get(a->manifest, "abi_version")) == NULL)
        return aotr_archive_invalid(a, "manifest arch and abi_version must be strings");
    int trace = aotr_trace_on();
    double t0 = trace ? aotr_now_ms() : 0.0;
    st = parse_records(a, kernels);
    if (trace)
        aotr_trace("archive_records", aotr_now_ms() - t0, "%s (%zu kernel records)", a->path,
                   kernels->n);
    return st;
}
