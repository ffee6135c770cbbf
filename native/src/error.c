/* Status names and the thread-local error message. */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

#define MESSAGE_CAPACITY 2048

static _Thread_local char message[MESSAGE_CAPACITY];

const char *aotr_last_error(void) { return message; }

void aotr_clear_error(void) { message[0] = '\0'; }

aotr_status aotr_fail(aotr_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    return status;
}

aotr_status aotr_fail_prefix(aotr_status status, const char *fmt, ...)
{
    char prefix[MESSAGE_CAPACITY];
    char previous[MESSAGE_CAPACITY];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(previous, message, sizeof previous);
    /* truncation is fine here; using the result keeps -Wformat-truncation quiet */
    if (snprintf(message, sizeof message, "%s: %s", prefix, previous) < 0)
        message[0] = '\0';
    return status;
}

const char *aotr_status_name(aotr_status status)
{
    switch (status) {
    case AOTR_OK: return "AOTR_OK";
    case AOTR_INVALID_ARGUMENT: return "AOTR_INVALID_ARGUMENT";
    case AOTR_UNSUPPORTED: return "AOTR_UNSUPPORTED";
    case AOTR_NEEDS_LAYOUT: return "AOTR_NEEDS_LAYOUT";
    case AOTR_NOT_FOUND: return "AOTR_NOT_FOUND";
    case AOTR_ARCHIVE_INVALID: return "AOTR_ARCHIVE_INVALID";
    case AOTR_IDENTITY_MISMATCH: return "AOTR_IDENTITY_MISMATCH";
    case AOTR_DRIVER_UNAVAILABLE: return "AOTR_DRIVER_UNAVAILABLE";
    case AOTR_DRIVER_ERROR: return "AOTR_DRIVER_ERROR";
    case AOTR_OUT_OF_MEMORY: return "AOTR_OUT_OF_MEMORY";
    }
    return "AOTR_UNKNOWN_STATUS";
}

#define STR2(x) #x
#define STR(x) STR2(x)

const char *aotr_version(void)
{
    return STR(AOTR_VERSION_MAJOR) "." STR(AOTR_VERSION_MINOR) "." STR(AOTR_VERSION_PATCH);
}

const char *aotr_abi_line(void) { return AOTR_ABI_LINE; }

/* -------------------------------------------------------- cold-start trace */

int aotr_trace_on(void)
{
    static atomic_int state = -1; /* -1: not read yet */
    int on = atomic_load_explicit(&state, memory_order_relaxed);
    if (on < 0) {
        const char *env = getenv("AOTRITON_ROCM_TRACE");
        on = env != NULL && strcmp(env, "1") == 0;
        atomic_store_explicit(&state, on, memory_order_relaxed);
    }
    return on;
}

double aotr_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

void aotr_trace(const char *phase, double ms, const char *fmt, ...)
{
    char detail[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    fprintf(stderr, "aotriton-rocm: trace: %s %.3f ms %s\n", phase, ms, detail);
}
