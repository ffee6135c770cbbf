/* Reader of the kernel archives (`<arch>.aotr`), byte-compatible with
 * src/aotriton_rocm/archive.py: an 80-byte header, a JSON index (manifest +
 * kernel records, sha256-checked) and one xz stream per code object. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

#define FORMAT_VERSION 1u
#define HEADER_SIZE 80u
#define MAX_CODE_SIZE ((uint64_t)1 << 30)
#define MAX_INDEX_SIZE ((uint64_t)256 << 20)

static const uint8_t MAGIC[8] = {'A', 'O', 'T', 'R', 'K', 'A', '\r', '\n'};

static const char *const MANIFEST_KEYS[] = {
    "format_version", "package_version", "abi_version", "rocm_profile",     "arch",
    "backend",        "warp_size",       "compiler",    "compiler_version", "build_inputs_hash",
    "blob_sha256",
};

struct aotr_archive {
    char *path;
    char *file_arch; /* the file name without ".aotr" (for messages) */
    int fd;
    uint32_t format_version;
    uint64_t file_size, blob_offset, blob_size;
    aotr_json *index;
    const aotr_json *manifest;
    size_t count;
    aotr_kernel_record *records;
    aotr_kernel_arg *args;  /* storage for every record's args */
    const char **divisible; /* storage for every record's divisible_16 */
    pthread_mutex_t lock;
    int lock_ready;
    uint8_t **code; /* per record: the checked code object, or NULL */
};

/* ------------------------------------------------------------ messages */

static const char *base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* "sm_90" -> "sm90": the image package suffix. */
static void arch_package_name(const char *arch, char *out, size_t cap)
{
    size_t n = 0;
    for (const char *p = arch; *p && n + 1 < cap; p++)
        if (*p != '_')
            out[n++] = *p;
    out[n] = '\0';
}

static aotr_status invalid(const aotr_archive *a, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* AOTR_ARCHIVE_INVALID: "<path>: <what>. <how to fix>" */
static aotr_status invalid(const aotr_archive *a, const char *fmt, ...)
{
    char what[1400];
    char pkg[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    arch_package_name(a->file_arch, pkg, sizeof pkg);
    return aotr_fail(AOTR_ARCHIVE_INVALID,
                     "%s: %s. Reinstall the kernel image wheel for this arch (pip install "
                     "--force-reinstall --no-deps aotriton-rocm-%s) or the conda package, or "
                     "rebuild the archive with `aotriton-rocm build`",
                     a->path, what, pkg);
}

/* ----------------------------------------------------------------- I/O */

/* Reads up to n bytes at off; returns the count (short only at end of file)
 * or -1 with errno. */
static ssize_t pread_full(int fd, void *buf, size_t n, uint64_t off)
{
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, (char *)buf + done, n - done, (off_t)(off + done));
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (r == 0)
            break;
        done += (size_t)r;
    }
    return (ssize_t)done;
}

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }

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
        return invalid(a, "kernel record %zu is not an object", index);
    r->key = aotr_json_str(aotr_json_get(j, "key"));
    if (r->key == NULL || r->key[0] == '\0')
        return invalid(a, "kernel record %zu has no key", index);
    const char *k = r->key;
#define BAD(what) invalid(a, "kernel '%s': %s", k, what)
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
        return invalid(a, "kernel '%s': unknown dtype '%s' (known: fp16, bf16, fp32)", k, dtype);
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
                return invalid(a, "kernel '%s': argument %zu is not a [name, type] pair", k, i);
            if (!arg_kind(arg->type, &arg->kind))
                return invalid(a,
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
                aotr_status st = invalid(a, "kernel key '%s' appears twice", sorted[i]->key);
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
    const char *base = base_name(a->path);
    size_t alen = arch ? strlen(arch) : 0;
    if (a->fd >= 0 && arch != NULL &&
        !(strlen(base) == alen + 5 && strncmp(base, arch, alen) == 0 &&
          strcmp(base + alen, ".aotr") == 0)) {
        arch_package_name(a->file_arch, pkg, sizeof pkg);
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
        arch_package_name(arch ? arch : a->file_arch, pkg, sizeof pkg);
        return aotr_fail(AOTR_IDENTITY_MISMATCH,
                         "%s: the archive was built for ABI line %s of aotriton-rocm, this "
                         "libaotriton_rocm is ABI line %s. Install matching versions, e.g. "
                         "pip install 'aotriton-rocm[%s]~=%s.0'",
                         a->path, lines[i], AOTR_ABI_LINE, pkg, AOTR_ABI_LINE);
    }
    return AOTR_OK;
}

/* ----------------------------------------------------------------- open */

static aotr_status open_fd(aotr_archive *a)
{
    a->fd = open(a->path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (a->fd < 0) {
        int e = errno;
        if (e == ENOENT || e == ENOTDIR)
            return aotr_fail(AOTR_NOT_FOUND, "%s: no such kernel archive (%s)", a->path,
                             strerror(e));
        return invalid(a, "cannot open: %s", strerror(e));
    }
    struct statx st;
    if (statx(a->fd, "", AT_EMPTY_PATH, STATX_TYPE | STATX_SIZE, &st) != 0)
        return invalid(a, "cannot stat: %s", strerror(errno));
    if (!S_ISREG(st.stx_mode))
        return invalid(a, "not a regular file");
    a->file_size = (uint64_t)st.stx_size;
    return AOTR_OK;
}

/* The index's sha256, computed on a second thread while the first parses
 * the index (the parser takes any bytes; a mismatch discards the parse). */
typedef struct index_hash {
    const uint8_t *bytes;
    size_t size;
    uint8_t digest[32];
    double ms; /* for the trace */
} index_hash;

static void *hash_index(void *arg)
{
    index_hash *job = arg;
    double t0 = aotr_trace_on() ? aotr_now_ms() : 0.0;
    aotr_sha256_digest(job->bytes, job->size, job->digest);
    job->ms = aotr_trace_on() ? aotr_now_ms() - t0 : 0.0;
    return NULL;
}

/* The index bytes and the sha256 the header records for them. */
static aotr_status read_index(aotr_archive *a, uint8_t **index_bytes, uint64_t *index_size,
                              uint8_t sha256[32])
{
    uint8_t h[HEADER_SIZE];
    ssize_t got = pread_full(a->fd, h, sizeof h, 0);
    if (got < 0)
        return invalid(a, "cannot read: %s", strerror(errno));
    if ((size_t)got < sizeof h)
        return invalid(a, "truncated kernel archive (%llu bytes, shorter than its %u-byte header)",
                       (unsigned long long)a->file_size, HEADER_SIZE);
    if (memcmp(h, MAGIC, sizeof MAGIC) != 0)
        return invalid(a, "not an aotriton-rocm kernel archive (bad magic bytes)");
    uint32_t version = le32(h + 8), header_size = le32(h + 12);
    uint64_t isize = le64(h + 16);
    a->blob_offset = le64(h + 24);
    a->blob_size = le64(h + 32);
    a->format_version = version;
    if (version > FORMAT_VERSION)
        return aotr_fail(AOTR_IDENTITY_MISMATCH,
                         "%s: archive format version %u is newer than this libaotriton_rocm "
                         "understands (format %u). Upgrade aotriton-rocm to the release the "
                         "kernel image was built for, or install the image that matches this "
                         "library",
                         a->path, version, FORMAT_VERSION);
    if (version < 1 || header_size != HEADER_SIZE)
        return invalid(a, "unsupported archive header (format %u, header %u bytes)", version,
                       header_size);
    /* every sum below is guarded: the fields are untrusted 64-bit values */
    if (isize > a->file_size - HEADER_SIZE || HEADER_SIZE + isize > a->blob_offset ||
        a->blob_offset > a->file_size || a->blob_size > a->file_size - a->blob_offset)
        return invalid(a,
                       "truncated or corrupted kernel archive (file is %llu bytes, header says "
                       "index of %llu bytes, blob region of %llu bytes at %llu)",
                       (unsigned long long)a->file_size, (unsigned long long)isize,
                       (unsigned long long)a->blob_size, (unsigned long long)a->blob_offset);
    if (isize > MAX_INDEX_SIZE)
        return invalid(a, "index of %llu bytes is larger than the 256 MiB limit",
                       (unsigned long long)isize);
    uint8_t *buf = malloc(isize ? (size_t)isize : 1);
    if (buf == NULL)
        return aotr_fail(AOTR_OUT_OF_MEMORY, "%s: out of memory for the index", a->path);
    got = pread_full(a->fd, buf, (size_t)isize, HEADER_SIZE);
    if (got < 0 || (uint64_t)got != isize) {
        aotr_status st = got < 0 ? invalid(a, "cannot read the index: %s", strerror(errno))
                                 : invalid(a, "truncated index");
        free(buf);
        return st;
    }
    memcpy(sha256, h + 40, 32);
    *index_bytes = buf;
    *index_size = isize;
    return AOTR_OK;
}

/* The parsed index: manifest, identity, records. */
static aotr_status parse_index(aotr_archive *a)
{
    a->manifest = aotr_json_get(a->index, "manifest");
    const aotr_json *kernels = aotr_json_get(a->index, "kernels");
    if (a->manifest == NULL || a->manifest->type != AOTR_JSON_OBJECT)
        return invalid(a, "kernel archive index has no manifest object");
    if (kernels == NULL || kernels->type != AOTR_JSON_ARRAY)
        return invalid(a, "kernel archive index has no kernels list");
    if (kernels->n == 0)
        return invalid(a, "kernel archive index lists no kernels (an empty image)");
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
        return invalid(a, "manifest lacks %s", missing);
    if (aotr_json_str(aotr_json_get(a->manifest, "arch")) == NULL ||
        aotr_json_str(aotr_json_get(a->manifest, "abi_version")) == NULL)
        return invalid(a, "manifest arch and abi_version must be strings");
    int trace = aotr_trace_on();
    double t0 = trace ? aotr_now_ms() : 0.0;
    st = parse_records(a, kernels);
    if (trace)
        aotr_trace("archive_records", aotr_now_ms() - t0, "%s (%zu kernel records)", a->path,
                   kernels->n);
    return st;
}

static aotr_status open_archive(aotr_archive *a)
{
    int trace = aotr_trace_on();
    double t0 = trace ? aotr_now_ms() : 0.0;
    aotr_status st = open_fd(a);
    if (st != AOTR_OK)
        return st;
    uint8_t *bytes = NULL;
    uint64_t size = 0;
    uint8_t want[32];
    st = read_index(a, &bytes, &size, want);
    if (st != AOTR_OK)
        return st;
    double t1 = trace ? aotr_now_ms() : 0.0;
    index_hash job = {.bytes = bytes, .size = (size_t)size};
    pthread_t hasher;
    int threaded = pthread_create(&hasher, NULL, hash_index, &job) == 0;
    if (!threaded)
        hash_index(&job);
    a->index = aotr_json_parse((const char *)bytes, (size_t)size);
    if (threaded)
        pthread_join(hasher, NULL);
    free(bytes);
    if (trace) {
        double t2 = aotr_now_ms();
        aotr_trace("archive_index_read", t1 - t0, "%s (%llu bytes: open, read)", a->path,
                   (unsigned long long)size);
        aotr_trace("archive_index_parse", t2 - t1, "%s (json; sha256 %.3f ms%s)", a->path, job.ms,
                   threaded ? " on a second thread, alongside" : "");
    }
    if (memcmp(job.digest, want, 32) != 0) {
        aotr_json_free(a->index);
        a->index = NULL;
        return invalid(a, "kernel archive index is corrupted (sha256 mismatch)");
    }
    if (a->index == NULL)
        return invalid(a, "kernel archive index is unreadable (%s)", aotr_last_error());
    return parse_index(a);
}

/* An archive of `path` (a file, or with `index` the name of an index held
 * in memory), its reading left to `read`. */
static aotr_status new_archive(const char *path, aotr_archive **out)
{
    aotr_archive *a = calloc(1, sizeof *a);
    if (a == NULL)
        return aotr_fail(AOTR_OUT_OF_MEMORY, "%s: out of memory", path);
    a->fd = -1;
    a->path = strdup(path);
    const char *base = base_name(path);
    size_t blen = strlen(base);
    a->file_arch =
        blen > 5 && strcmp(base + blen - 5, ".aotr") == 0 ? strndup(base, blen - 5) : strdup(base);
    if (a->path == NULL || a->file_arch == NULL) {
        aotr_archive_close(a);
        return aotr_fail(AOTR_OUT_OF_MEMORY, "%s: out of memory", path);
    }
    if (pthread_mutex_init(&a->lock, NULL) != 0) {
        aotr_archive_close(a);
        return aotr_fail(AOTR_OUT_OF_MEMORY, "%s: cannot create a mutex", path);
    }
    a->lock_ready = 1;
    *out = a;
    return AOTR_OK;
}

aotr_status aotr_archive_from_index(const char *name, const char *json, size_t size,
                                    aotr_archive **out)
{
    if (out != NULL)
        *out = NULL;
    if (name == NULL || json == NULL || out == NULL)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "aotr_archive_from_index: NULL argument");
    aotr_archive *a = NULL;
    aotr_status st = new_archive(name, &a);
    if (st != AOTR_OK)
        return st;
    a->format_version = FORMAT_VERSION;
    a->index = aotr_json_parse(json, size);
    st = a->index == NULL ? invalid(a, "kernel index is unreadable (%s)", aotr_last_error())
                          : parse_index(a);
    if (st != AOTR_OK) {
        aotr_archive_close(a);
        return st;
    }
    aotr_clear_error();
    *out = a;
    return AOTR_OK;
}

aotr_status aotr_archive_open(const char *path, aotr_archive **out)
{
    if (out != NULL)
        *out = NULL;
    if (path == NULL || out == NULL)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "aotr_archive_open: path and out must not be NULL");
    aotr_archive *a = NULL;
    aotr_status st = new_archive(path, &a);
    if (st != AOTR_OK)
        return st;
    st = open_archive(a);
    if (st != AOTR_OK) {
        aotr_archive_close(a);
        return st;
    }
    aotr_clear_error();
    *out = a;
    return AOTR_OK;
}

void aotr_archive_close(aotr_archive *a)
{
    if (a == NULL)
        return;
    if (a->code != NULL)
        for (size_t i = 0; i < a->count; i++)
            free(a->code[i]);
    free(a->code);
    free(a->records);
    free(a->args);
    free(a->divisible);
    aotr_json_free(a->index);
    if (a->fd >= 0)
        close(a->fd);
    if (a->lock_ready)
        pthread_mutex_destroy(&a->lock);
    free(a->path);
    free(a->file_arch);
    free(a);
}

/* -------------------------------------------------------------- queries */

const char *aotr_archive_path(const aotr_archive *a) { return a ? a->path : NULL; }

const char *aotr_archive_manifest_string(const aotr_archive *a, const char *key)
{
    if (a == NULL || key == NULL)
        return NULL;
    return aotr_json_str(aotr_json_get(a->manifest, key));
}

size_t aotr_archive_kernel_count(const aotr_archive *a) { return a ? a->count : 0; }

size_t aotr_archive_records(const aotr_archive *a, const aotr_kernel_record **records)
{
    if (records != NULL)
        *records = a ? a->records : NULL;
    return a ? a->count : 0;
}

const aotr_json *aotr_archive_manifest(const aotr_archive *a) { return a ? a->manifest : NULL; }

/* ---------------------------------------------------------- code objects */

/* Read, decompress and check record `r` from the file into a new buffer. */
static aotr_status load_code(const aotr_archive *a, const aotr_kernel_record *r, uint8_t **out)
{
    *out = NULL;
    uint8_t *blob = malloc(r->compressed_size ? (size_t)r->compressed_size : 1);
    uint8_t *code = malloc(r->size ? (size_t)r->size : 1);
    if (blob == NULL || code == NULL) {
        free(blob);
        free(code);
        return aotr_fail(AOTR_OUT_OF_MEMORY, "%s: kernel '%s': out of memory", a->path, r->key);
    }
    aotr_status st = AOTR_OK;
    ssize_t got = pread_full(a->fd, blob, (size_t)r->compressed_size, a->blob_offset + r->offset);
    if (got < 0)
        st = invalid(a, "cannot read kernel '%s': %s", r->key, strerror(errno));
    else if ((uint64_t)got != r->compressed_size)
        st = invalid(a, "kernel '%s' is truncated", r->key);
    else if (aotr_xz_decode(blob, (size_t)r->compressed_size, code, (size_t)r->size) != AOTR_OK)
        st = invalid(a, "kernel '%s' is corrupted (%s)", r->key, aotr_last_error());
    else {
        uint8_t digest[32];
        aotr_sha256_digest(code, (size_t)r->size, digest);
        if (memcmp(digest, r->sha256, 32) != 0)
            st = invalid(a,
                         "kernel '%s' is corrupted (sha256 of its code object does not match "
                         "the index)",
                         r->key);
    }
    free(blob);
    if (st != AOTR_OK)
        free(code);
    else
        *out = code;
    return st;
}

aotr_status aotr_archive_code_object(aotr_archive *a, size_t index, const uint8_t **code,
                                     size_t *size)
{
    if (a == NULL || code == NULL || size == NULL)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "aotr_archive_code_object: NULL argument");
    if (index >= a->count)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "%s: no kernel record %zu (the archive has %zu)",
                         a->path, index, a->count);
    if (a->fd < 0)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "%s: a kernel index holds no code objects",
                         a->path);
    aotr_status st = AOTR_OK;
    pthread_mutex_lock(&a->lock);
    if (a->code[index] == NULL)
        st = load_code(a, &a->records[index], &a->code[index]);
    if (st == AOTR_OK) {
        *code = a->code[index];
        *size = (size_t)a->records[index].size;
    }
    pthread_mutex_unlock(&a->lock);
    return st;
}

/* Appends "; <message>" of the current error to a problem list. */
static void add_problem(char *buf, size_t cap, size_t *len, size_t *count, const char *path)
{
    const char *msg = aotr_last_error();
    size_t plen = strlen(path);
    /* drop the "<path>: " prefix and the fix hint every message repeats */
    if (strncmp(msg, path, plen) == 0 && strncmp(msg + plen, ": ", 2) == 0)
        msg += plen + 2;
    const char *hint = strstr(msg, ". Reinstall the kernel image wheel");
    int n = hint ? (int)(hint - msg) : (int)strlen(msg);
    if (*len < cap)
        *len += (size_t)snprintf(buf + *len, cap - *len, "%s%.*s", *count ? "; " : "", n, msg);
    if (*len > cap)
        *len = cap;
    (*count)++;
}

aotr_status aotr_archive_verify(aotr_archive *a)
{
    if (a == NULL)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "aotr_archive_verify: NULL archive");
    if (a->fd < 0)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "%s: a kernel index holds no code objects",
                         a->path);
    char problems[1500] = "";
    size_t len = 0, count = 0;
    struct statx st;
    if (statx(a->fd, "", AT_EMPTY_PATH, STATX_SIZE, &st) != 0 ||
        (uint64_t)st.stx_size != a->file_size) {
        aotr_fail(AOTR_ARCHIVE_INVALID, "file size changed since it was opened");
        add_problem(problems, sizeof problems, &len, &count, a->path);
    }
    uint8_t digest[32], want[32];
    const size_t chunk = (size_t)1 << 20;
    uint8_t *buf = malloc(chunk);
    if (buf == NULL)
        return aotr_fail(AOTR_OUT_OF_MEMORY, "%s: out of memory", a->path);
    aotr_sha256 h;
    aotr_sha256_init(&h);
    uint64_t done = 0;
    while (done < a->blob_size) {
        size_t n = a->blob_size - done < chunk ? (size_t)(a->blob_size - done) : chunk;
        ssize_t got = pread_full(a->fd, buf, n, a->blob_offset + done);
        if (got <= 0)
            break;
        aotr_sha256_update(&h, buf, (size_t)got);
        done += (uint64_t)got;
    }
    free(buf);
    aotr_sha256_final(&h, digest);
    if (done != a->blob_size) {
        aotr_fail(AOTR_ARCHIVE_INVALID, "blob region is truncated");
        add_problem(problems, sizeof problems, &len, &count, a->path);
    } else if (!aotr_hex_to_digest(aotr_archive_manifest_string(a, "blob_sha256"), want) ||
               memcmp(digest, want, 32) != 0) {
        aotr_fail(AOTR_ARCHIVE_INVALID, "blob region sha256 does not match the manifest");
        add_problem(problems, sizeof problems, &len, &count, a->path);
    }
    for (size_t i = 0; i < a->count; i++) {
        uint8_t *code;
        if (load_code(a, &a->records[i], &code) != AOTR_OK)
            add_problem(problems, sizeof problems, &len, &count, a->path);
        else
            free(code);
    }
    if (count > 0)
        return invalid(a, "verify found %zu problem%s: %s", count, count > 1 ? "s" : "", problems);
    aotr_clear_error();
    return AOTR_OK;
}
