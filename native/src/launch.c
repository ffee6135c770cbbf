/* Launches: a kernel's code object loaded on first use, its arguments packed
 * in its order (or handed to the host launcher), its global scratch. */
#include <stdint.h>
#include <string.h>

#include "runtime_internal.h"
#include "slots.h"

int32_t aotr_launchable_block_m(const aotr_launchable *k) { return k->record->block_m; }
int32_t aotr_launchable_block_n(const aotr_launchable *k) { return k->record->block_n; }

int aotr_launchable_declares(const aotr_launchable *k, int slot)
{
    for (size_t i = 0; i < k->num_args; i++)
        if (k->slots[i] == slot)
            return 1;
    return 0;
}

aotr_status aotr_launchable_check(const aotr_launchable *k, const aotr_arg_value *values)
{
    if (k->bind_error)
        return aotr_fail(AOTR_IDENTITY_MISMATCH, "%s", k->bind_error);
    for (size_t i = 0; i < k->num_divisible; i++) {
        int slot = k->divisible[i];
        uint64_t v = aotr_arg_slot_kind(slot) == AOTR_ARG_POINTER
                         ? (uint64_t)(uintptr_t)values[slot].p
                         : (uint64_t)(int64_t)values[slot].i32;
        if (v & 15u)
            return aotr_fail(AOTR_NEEDS_LAYOUT,
                             "%s: argument %s = %lld breaks the "
                             "divisible-by-16 assumption it was compiled with: pass a copy "
                             "that meets aotr_layout_ok()",
                             k->record->kernel, aotr_arg_slot_name(slot), (long long)v);
    }
    return AOTR_OK;
}

static aotr_status load_function(aotr_device *dev, const aotr_launchable *k, void **function)
{
    aotr_launchable *mk = (aotr_launchable *)k;
    pthread_mutex_lock(&dev->load_lock);
    void *f = atomic_load_explicit(&mk->function, memory_order_relaxed);
    aotr_status st = AOTR_OK;
    if (!f) {
        int trace = aotr_trace_on();
        double t0 = trace ? aotr_now_ms() : 0.0;
        const uint8_t *code = NULL;
        size_t size = 0;
        st = aotr_archive_code_object(dev->archive, k->index, &code, &size);
        double t1 = trace ? aotr_now_ms() : 0.0;
        if (st == AOTR_OK)
            st = aotr_driver_load(dev->driver, dev->index, code, size, k->record->symbol,
                                  k->record->shared, &f);
        if (st == AOTR_OK)
            atomic_store_explicit(&mk->function, f, memory_order_release);
        if (trace) {
            aotr_trace("code_object", t1 - t0, "%s %s (%zu bytes: read, xz, sha256)",
                       k->record->kernel, k->record->key, size);
            aotr_trace("module_load", aotr_now_ms() - t1, "%s %s", k->record->kernel,
                       k->record->key);
        }
    }
    pthread_mutex_unlock(&dev->load_lock);
    *function = f;
    return st;
}

/* The host launcher gets one 64-bit word per argument (aotr_host_launch_fn). */
static aotr_status host_launch(aotr_runtime *rt, const aotr_host_launcher *h,
                               const aotr_launchable *k, const uint32_t grid[3],
                               const aotr_arg_value *values)
{
    uint64_t words[MAX_KERNEL_ARGS];
    for (size_t i = 0; i < k->num_args; i++) {
        int slot = k->slots[i];
        aotr_arg_value v = {0};
        if (slot >= 0)
            v = values[slot];
        switch (slot >= 0 ? aotr_arg_slot_kind(slot) : AOTR_ARG_POINTER) {
        case AOTR_ARG_I32: words[i] = (uint64_t)(int64_t)v.i32; break;
        case AOTR_ARG_FP32: {
            uint32_t bits;
            memcpy(&bits, &v.f32, sizeof bits);
            words[i] = bits;
            break;
        }
        case AOTR_ARG_I64: words[i] = (uint64_t)v.i64; break;
        default: words[i] = (uint64_t)(uintptr_t)v.p;
        }
    }
    aotr_status st = aotr_host_launch(h, k->record->key, grid, words, k->num_args);
    if (st == AOTR_OK)
        aotr_runtime_count_launch(rt, aotr_kernel_id_of(k->record->kernel));
    return st;
}

aotr_status aotr_device_launch(aotr_runtime *rt, aotr_device *dev, const aotr_launchable *k,
                               const uint32_t grid[3], void *stream, const aotr_arg_value *values)
{
    const aotr_host_launcher *host = aotr_driver_host(dev->driver);
    if (host)
        return host_launch(rt, host, k, grid, values);
    void *function = atomic_load_explicit(&((aotr_launchable *)k)->function, memory_order_acquire);
    /* a kernel's first launch (its module just loaded) is timed when tracing */
    double traced = -1.0;
    if (!function) {
        aotr_status st = load_function(dev, k, &function);
        if (st != AOTR_OK)
            return st;
        if (aotr_trace_on())
            traced = aotr_now_ms();
    }
    _Alignas(16) uint8_t buffer[MAX_ARGS_BYTES];
    /* The alignment padding too: the same request packs the same bytes. */
    memset(buffer, 0, k->args_size);
    for (size_t i = 0; i < k->num_args; i++) {
        int slot = k->slots[i];
        aotr_arg_value v = {0};
        if (slot >= 0)
            v = values[slot];
        memcpy(buffer + k->offsets[i], &v, k->sizes[i]);
    }
    const aotr_kernel_record *r = k->record;
    uint32_t block_x = (uint32_t)(r->num_warps * r->warp_size);
    uint64_t scratch = 0;
    aotr_status st = AOTR_OK;
    if (r->global_scratch_size && grid[0] && grid[1] && grid[2]) {
        /* per program, the kernel indexes it by its linear program id */
        uint64_t programs = (uint64_t)grid[0] * grid[1] * grid[2];
        if (programs > SIZE_MAX / r->global_scratch_size)
            return aotr_fail(AOTR_INVALID_ARGUMENT,
                             "%s (%s): %llu programs of %u bytes of "
                             "global scratch overflow size_t",
                             r->kernel, r->key, (unsigned long long)programs,
                             (unsigned)r->global_scratch_size);
        st = aotr_driver_scratch_alloc(dev->driver, dev->index,
                                       (size_t)programs * r->global_scratch_size, stream, &scratch);
        if (st != AOTR_OK)
            return aotr_fail_prefix(st, "%s (%s)", r->kernel, r->key);
        memcpy(buffer + k->offsets[k->num_args - 2], &scratch, sizeof scratch);
    }
    double launched = traced >= 0.0 ? aotr_now_ms() : 0.0;
    st = aotr_driver_launch(dev->driver, dev->index, function, grid, block_x, r->shared, stream,
                            buffer, k->args_size);
    aotr_driver_scratch_free(dev->driver, scratch, stream);
    if (traced >= 0.0) {
        double done = aotr_now_ms();
        aotr_trace("scratch_alloc", launched - traced, "%s (%llu bytes)", r->kernel,
                   (unsigned long long)(scratch ? (uint64_t)grid[0] * grid[1] * grid[2] *
                                                      r->global_scratch_size
                                                : 0));
        aotr_trace("first_launch", done - launched, "%s %s (enqueue and scratch free)", r->kernel,
                   r->key);
    }
    if (st != AOTR_OK)
        return aotr_fail_prefix(st, "%s (%s)", r->kernel, r->key);
    aotr_runtime_count_launch(rt, aotr_kernel_id_of(r->kernel));
    return AOTR_OK;
}
