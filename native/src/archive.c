/* Reader of the kernel archives (`<arch>.aotr`), byte-compatible with
 * src/aotriton_rocm/archive.py: an 80-byte header, a JSON index (manifest +
 * kernel records, sha256-checked; parsed by archive_index.c) and one xz
 * stream per code object. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "archive_internal.h"

#define FORMAT_VERSION 1u
#define HEADER_SIZE 80u
#define MAX_INDEX_SIZE ((uint64_t)256 << 20)

static const uint8_t MAGIC[8] = {'A', 'O', 'T', 'R', 'K', 'A', '\r', '\n'};

/* ------------------------------------------------------------ messages */

const char *aotr_base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

void aotr_arch_package_name(const char *arch, char *out, size_t cap)
{
    size_t n = 0;
    for (const char *p = arch; *p && n + 1 < cap; p++)
        if (*p != '_')
            out[n++] = *p;
    out[n] = '\0';
}

aotr_status aotr_archive_invalid(const aotr_archive *a, const char *fmt, ...)
{
    char what[1400];
    char pkg[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    aotr_arch_package_name(a->file_arch, pkg, sizeof pkg);
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

/* ----------------------------------------------------------------- open */

static aotr_status open_fd(aotr_archive *a)
{
    a->fd = open(a->path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (a->fd < 0) {
        int e = errno;
        if (e == ENOENT || e == ENOTDIR)
            return aotr_fail(AOTR_NOT_FOUND, "%s: no such kernel archive (%s)", a->path,
                             strerror(e));
        return aotr_archive_invalid(a, "cannot open: %s", strerror(e));
    }
    struct statx st;
    if (statx(a->fd, "", AT_EMPTY_PATH, STATX_TYPE | STATX_SIZE, &st) != 0)
        return aotr_archive_invalid(a, "cannot stat: %s", strerror(errno));
    if (!S_ISREG(st.stx_mode))
        return aotr_archive_invalid(a, "not a regular file");
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
        return aotr_archive_invalid(a, "cannot read: %s", strerror(errno));
    if ((size_t)got < sizeof h)
        return aotr_archive_invalid(
            a, "truncated kernel archive (%llu bytes, shorter than its %u-byte header)",
            (unsigned long long)a->file_size, HEADER_SIZE);
    if (memcmp(h, MAGIC, sizeof MAGIC) != 0)
        return aotr_archive_invalid(a, "not an aotriton-rocm kernel archive (bad magic bytes)");
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
        return aotr_archive_invalid(a, "unsupported archive header (format %u, header %u bytes)",
                                    version, header_size);
    /* every sum below is guarded: the fields are untrusted 64-bit values */
    if (isize > a->file_size - HEADER_SIZE || HEADER_SIZE + isize > a->blob_offset ||
        a->blob_offset > a->file_size || a->blob_size > a->file_size - a->blob_offset)
        return aotr_archive_invalid(
            a,
            "truncated or corrupted kernel archive (file is %llu bytes, header says "
            "index of %llu bytes, blob region of %llu bytes at %llu)",
            (unsigned long long)a->file_size, (unsigned long long)isize,
            (unsigned long long)a->blob_size, (unsigned long long)a->blob_offset);
    if (isize > MAX_INDEX_SIZE)
        return aotr_archive_invalid(a, "index of %llu bytes is larger than the 256 MiB limit",
                                    (unsigned long long)isize);
    uint8_t *buf = malloc(isize ? (size_t)isize : 1);
    if (buf == NULL)
        return aotr_fail(AOTR_OUT_OF_MEMORY, "%s: out of memory for the index", a->path);
    got = pread_full(a->fd, buf, (size_t)isize, HEADER_SIZE);
    if (got < 0 || (uint64_t)got != isize) {
        aotr_status st = got < 0
                             ? aotr_archive_invalid(a, "cannot read the index: %s", strerror(errno))
                             : aotr_archive_invalid(a, "truncated index");
        free(buf);
        return st;
    }
    memcpy(sha256, h + 40, 32);
    *index_bytes = buf;
    *index_size = isize;
    return AOTR_OK;
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
        return aotr_archive_invalid(a, "kernel archive index is corrupted (sha256 mismatch)");
    }
    if (a->index == NULL)
        return aotr_archive_invalid(a, "kernel archive index is unreadable (%s)",
                                    aotr_last_error());
    return aotr_archive_parse_index(a);
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
    const char *base = aotr_base_name(path);
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
    st = a->index == NULL
             ? aotr_archive_invalid(a, "kernel index is unreadable (%s)", aotr_last_error())
             : aotr_archive_parse_index(a);
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
        st = aotr_archive_invalid(a, "cannot read kernel '%s': %s", r->key, strerror(errno));
    else if ((uint64_t)got != r->compressed_size)
        st = aotr_archive_invalid(a, "kernel '%s' is truncated", r->key);
    else if (aotr_xz_decode(blob, (size_t)r->compressed_size, code, (size_t)r->size) != AOTR_OK)
        st = aotr_archive_invalid(a, "kernel '%s' is corrupted (%s)", r->key, aotr_last_error());
    else {
        uint8_t digest[32];
        aotr_sha256_digest(code, (size_t)r->size, digest);
        if (memcmp(digest, r->sha256, 32) != 0)
            st = aotr_archive_invalid(
                a,
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
        return aotr_archive_invalid(a, "verify found %zu problem%s: %s", count,
                                    count > 1 ? "s" : "", problems);
    aotr_clear_error();
    return AOTR_OK;
}
