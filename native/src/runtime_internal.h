/* The runtime's structures, shared by runtime.c (the runtime, its drivers
 * and devices), kernel_tables.c (a device's kernel tables and the pick of a
 * call's kernel) and launch.c (code objects loaded on first use, launches). */
#ifndef AOTR_RUNTIME_INTERNAL_H
#define AOTR_RUNTIME_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "internal.h"
#include "slots.h"

#define MAX_KERNEL_ARGS 96
#define MAX_RUNS 16
#define MAX_ARGS_BYTES 1024
/* Direct index of functional keys: kernel x dtype x head dim (16..512) x
 * pad_head x has_bias x enable_dropout, each flag in {absent, false, true}. */
#define HEAD_DIM_STEPS 6
#define GROUP_SLOTS (AOTR_KERNEL_COUNT * 3 * HEAD_DIM_STEPS * 27)

struct aotr_launchable {
    const aotr_kernel_record *record;
    size_t index;                   /* in the archive */
    int16_t slots[MAX_KERNEL_ARGS]; /* value slot per parameter; -1: scratch (NULL) */
    uint16_t offsets[MAX_KERNEL_ARGS];
    uint8_t sizes[MAX_KERNEL_ARGS];
    size_t num_args;
    uint32_t args_size;
    int16_t divisible[MAX_KERNEL_ARGS];
    size_t num_divisible;
    char *bind_error;         /* why this kernel cannot be launched, or NULL */
    _Atomic(void *) function; /* loaded on first launch */
};

typedef struct aotr_group {
    size_t num_runs;
    int64_t bounds[MAX_RUNS]; /* runs[i] serves seqlens <= bounds[i]; the last the rest */
    aotr_launchable *runs[MAX_RUNS];
    int on_k;                /* bucket by seqlen_k (else seqlen_q) */
    aotr_launchable *decode; /* before the runs where seqlen_q <= decode_rows, or NULL */
    int64_t decode_rows;
} aotr_group;

struct aotr_device {
    int32_t index;
    char arch[64];
    aotr_archive *archive;
    int owns_archive;
    aotr_driver *driver;
    aotr_launchable *launchables;
    size_t num_launchables;
    aotr_group *groups[GROUP_SLOTS];
    pthread_mutex_t load_lock;
    _Atomic int32_t compute_units; /* queried on first use; -1: unknown */
};

/* The kernel's index in aotr_kernel_names, -1 if unknown. */
AOTR_HIDDEN int aotr_kernel_id_of(const char *name);
/* The device's launchables (bound to their argument slots) and groups (by
 * functional key, with the runs tuning chose) from its archive. */
AOTR_HIDDEN aotr_status aotr_build_tables(aotr_device *dev);
/* Counts a launch of kernel `kernel_id` (aotr_runtime_launch_count). */
AOTR_HIDDEN void aotr_runtime_count_launch(aotr_runtime *rt, int kernel_id);

#endif /* AOTR_RUNTIME_INTERNAL_H */
