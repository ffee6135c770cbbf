/* .xz decoding through liblzma, opened at run time (no link-time dependency). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

#define LZMA_SONAME "liblzma.so.5"
#define MAX_OUT ((size_t)1 << 30)

/* lzma_ret lzma_stream_buffer_decode(uint64_t *memlimit, uint32_t flags,
 *     const lzma_allocator *allocator, const uint8_t *in, size_t *in_pos,
 *     size_t in_size, uint8_t *out, size_t *out_pos, size_t out_size) */
typedef int (*stream_buffer_decode_fn)(uint64_t *memlimit, uint32_t flags, const void *allocator,
                                       const uint8_t *in, size_t *in_pos, size_t in_size,
                                       uint8_t *out, size_t *out_pos, size_t out_size);
enum { LZMA_OK_ = 0, LZMA_STREAM_END_ = 1 };

static pthread_once_t once = PTHREAD_ONCE_INIT;
static stream_buffer_decode_fn decode_fn;
static char load_error[512];

static void load(void)
{
    void *h = dlopen(LZMA_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        const char *e = dlerror();
        snprintf(load_error, sizeof load_error, "%s", e ? e : "not found");
        return;
    }
    void *sym = dlsym(h, "lzma_stream_buffer_decode");
    if (sym == NULL) {
        const char *e = dlerror();
        snprintf(load_error, sizeof load_error, "%s", e ? e : "lzma_stream_buffer_decode missing");
        dlclose(h);
        return;
    }
    /* POSIX guarantees a data pointer from dlsym converts to a function pointer. */
    memcpy(&decode_fn, &sym, sizeof decode_fn);
}

aotr_status aotr_xz_decode(const uint8_t *in, size_t in_size, uint8_t *out, size_t out_size)
{
    if ((in == NULL && in_size > 0) || (out == NULL && out_size > 0))
        return aotr_fail(AOTR_INVALID_ARGUMENT, "xz: NULL buffer");
    if (out_size > MAX_OUT)
        return aotr_fail(AOTR_ARCHIVE_INVALID,
                         "xz: code object of %zu bytes is larger than the 1 GiB limit", out_size);
    pthread_once(&once, load);
    if (decode_fn == NULL)
        return aotr_fail(AOTR_ARCHIVE_INVALID,
                         "xz: cannot load " LZMA_SONAME " (%s), needed to decompress kernel "
                         "code objects. It ships with every Linux distribution: install it "
                         "(apt install liblzma5, dnf install xz-libs, ...)",
                         load_error);
    uint8_t in_dummy = 0, out_dummy = 0;
    uint64_t memlimit = UINT64_MAX;
    size_t in_pos = 0, out_pos = 0;
    int ret = decode_fn(&memlimit, 0, NULL, in ? in : &in_dummy, &in_pos, in_size,
                        out ? out : &out_dummy, &out_pos, out_size);
    if (ret != LZMA_OK_ && ret != LZMA_STREAM_END_)
        return aotr_fail(AOTR_ARCHIVE_INVALID,
                         "xz: cannot decompress (liblzma error %d: corrupt, truncated or "
                         "larger than the recorded %zu bytes)",
                         ret, out_size);
    if (in_pos != in_size)
        return aotr_fail(AOTR_ARCHIVE_INVALID,
                         "xz: %zu bytes of trailing data after the compressed stream",
                         in_size - in_pos);
    if (out_pos != out_size)
        return aotr_fail(AOTR_ARCHIVE_INVALID,
                         "xz: decompressed to %zu bytes, the index records %zu", out_pos, out_size);
    return AOTR_OK;
}
