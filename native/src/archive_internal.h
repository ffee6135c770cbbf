/* The kernel archive reader's state, shared by archive.c (the file: header,
 * index bytes, code objects, verification) and archive_index.c (the parsed
 * index: manifest, identity, kernel records). */
#ifndef AOTR_ARCHIVE_INTERNAL_H
#define AOTR_ARCHIVE_INTERNAL_H

#include <pthread.h>

#include "internal.h"

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

AOTR_HIDDEN const char *aotr_base_name(const char *path);
/* "sm_90" -> "sm90": the image package suffix. */
AOTR_HIDDEN void aotr_arch_package_name(const char *arch, char *out, size_t cap);
/* AOTR_ARCHIVE_INVALID: "<path>: <what>. <how to fix>" */
AOTR_HIDDEN aotr_status aotr_archive_invalid(const aotr_archive *a, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* The parsed index (a->index): manifest, identity, records. */
AOTR_HIDDEN aotr_status aotr_archive_parse_index(aotr_archive *a);

#endif /* AOTR_ARCHIVE_INTERNAL_H */
