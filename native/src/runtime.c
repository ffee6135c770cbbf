/* The runtime: per device its arch, archive, driver and kernel tables;
 * kernel selection (functional key + seqlen bucket), argument binding by
 * name, code-object loading on first use and launches. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "slots.h"

#define MAX_DEVICES 64
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

typedef struct group {
    size_t num_runs;
    int64_t bounds[MAX_RUNS]; /* runs[i] serves seqlens <= bounds[i]; the last the rest */
    aotr_launchable *runs[MAX_RUNS];
    int on_k;                /* bucket by seqlen_k (else seqlen_q) */
    aotr_launchable *decode; /* before the runs where seqlen_q <= decode_rows, or NULL */
    int64_t decode_rows;
} group;

struct aotr_device {
    int32_t index;
    char arch[64];
    aotr_archive *archive;
    int owns_archive;
    aotr_driver *driver;
    aotr_launchable *launchables;
    size_t num_launchables;
    group *groups[GROUP_SLOTS];
    pthread_mutex_t load_lock;
    _Atomic int32_t compute_units; /* queried on first use; -1: unknown */
};

struct aotr_runtime {
    pthread_mutex_t lock;
    char *archive_dir;
    char *driver_library;
    aotr_backend backend;
    aotr_archive **added;
    size_t num_added;
    aotr_driver *drivers[4]; /* by aotr_backend */
    aotr_host_launcher host; /* AOTR_BACKEND_HOST */
    _Atomic(aotr_device *) devices[MAX_DEVICES];
    aotr_status device_status[MAX_DEVICES];
    char *device_error[MAX_DEVICES];
    _Atomic uint64_t launches[AOTR_KERNEL_COUNT];
};

static const char *backend_name(aotr_backend b)
{
    return b == AOTR_BACKEND_HIP    ? "hip"
           : b == AOTR_BACKEND_CUDA ? "cuda"
           : b == AOTR_BACKEND_HOST ? "host"
                                    : "auto";
}

static aotr_backend backend_of_archive(const aotr_archive *a)
{
    const char *b = aotr_archive_manifest_string(a, "backend");
    if (b && strcmp(b, "hip") == 0)
        return AOTR_BACKEND_HIP;
    if (b && strcmp(b, "cuda") == 0)
        return AOTR_BACKEND_CUDA;
    if (b && strcmp(b, "host") == 0)
        return AOTR_BACKEND_HOST;
    return AOTR_BACKEND_AUTO;
}

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

aotr_status aotr_runtime_create(const aotr_runtime_options *options, aotr_runtime **out)
{
    if (!out)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "aotr_runtime_create: `out` is NULL");
    *out = NULL;
    aotr_runtime_options o = {0};
    if (options) {
        if (options->struct_size < sizeof(uint32_t) || options->struct_size > 4096)
            return aotr_fail(AOTR_INVALID_ARGUMENT,
                             "aotr_runtime_create: options->struct_size is %u; set it to "
                             "sizeof(aotr_runtime_options)",
                             options->struct_size);
        memcpy(&o, options, options->struct_size < sizeof o ? options->struct_size : sizeof o);
    }
    if (o.backend < AOTR_BACKEND_AUTO || o.backend > AOTR_BACKEND_HOST)
        return aotr_fail(AOTR_INVALID_ARGUMENT,
                         "aotr_runtime_create: unknown backend %d "
                         "(AOTR_BACKEND_AUTO, _HIP, _CUDA or _HOST)",
                         o.backend);
    if (o.backend == AOTR_BACKEND_HOST && (!o.host_launch || !o.host_index))
        return aotr_fail(AOTR_INVALID_ARGUMENT,
                         "aotr_runtime_create: the host backend needs host_index and "
                         "host_launch");
    aotr_runtime *rt = calloc(1, sizeof *rt);
    if (!rt)
        return aotr_fail(AOTR_OUT_OF_MEMORY, "aotr_runtime_create: out of memory");
    pthread_mutex_init(&rt->lock, NULL);
    rt->archive_dir = dup_or_null(o.archive_dir);
    rt->driver_library = dup_or_null(o.driver_library);
    rt->backend = (aotr_backend)o.backend;
    if ((o.archive_dir && !rt->archive_dir) || (o.driver_library && !rt->driver_library)) {
        aotr_runtime_destroy(rt);
        return aotr_fail(AOTR_OUT_OF_MEMORY, "aotr_runtime_create: out of memory");
    }
    if (rt->backend == AOTR_BACKEND_HOST) {
        rt->host = (aotr_host_launcher){o.host_launch, o.host_user, o.host_compute_units};
        aotr_archive *a = NULL;
        aotr_status st =
            aotr_archive_from_index("(host kernel index)", o.host_index, o.host_index_size, &a);
        if (st == AOTR_OK && backend_of_archive(a) != AOTR_BACKEND_HOST) {
            aotr_archive_close(a);
            st = aotr_fail(AOTR_INVALID_ARGUMENT,
                           "aotr_runtime_create: the host kernel index's manifest must name "
                           "backend \"host\"");
        }
        rt->added = st == AOTR_OK ? malloc(sizeof *rt->added) : NULL;
        if (st == AOTR_OK && !rt->added) {
            aotr_archive_close(a);
            st = aotr_fail(AOTR_OUT_OF_MEMORY, "aotr_runtime_create: out of memory");
        }
        if (st != AOTR_OK) {
            aotr_runtime_destroy(rt);
            return st;
        }
        rt->added[rt->num_added++] = a;
    }
    *out = rt;
    return AOTR_OK;
}

static void device_free(aotr_device *dev)
{
    if (!dev)
        return;
    for (size_t g = 0; g < GROUP_SLOTS; g++)
        free(dev->groups[g]);
    for (size_t i = 0; i < dev->num_launchables; i++)
        free(dev->launchables[i].bind_error);
    free(dev->launchables);
    if (dev->owns_archive)
        aotr_archive_close(dev->archive);
    pthread_mutex_destroy(&dev->load_lock);
    free(dev);
}

void aotr_runtime_destroy(aotr_runtime *rt)
{
    if (!rt)
        return;
    for (size_t i = 0; i < MAX_DEVICES; i++) {
        device_free(atomic_load(&rt->devices[i]));
        free(rt->device_error[i]);
    }
    for (size_t i = 0; i < 4; i++)
        if (rt->drivers[i])
            aotr_driver_close(rt->drivers[i]);
    for (size_t i = 0; i < rt->num_added; i++)
        aotr_archive_close(rt->added[i]);
    free(rt->added);
    free(rt->archive_dir);
    free(rt->driver_library);
    pthread_mutex_destroy(&rt->lock);
    free(rt);
}

aotr_status aotr_runtime_add_archive(aotr_runtime *rt, const char *path)
{
    if (!rt || !path)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "aotr_runtime_add_archive: NULL argument");
    aotr_archive *a = NULL;
    aotr_status st = aotr_archive_open(path, &a);
    if (st != AOTR_OK)
        return st;
    if (backend_of_archive(a) == AOTR_BACKEND_AUTO) {
        aotr_archive_close(a);
        return aotr_fail(AOTR_ARCHIVE_INVALID,
                         "%s: the manifest names no known backend "
                         "(\"hip\" or \"cuda\"); rebuild it with `aotriton-rocm build`",
                         path);
    }
    pthread_mutex_lock(&rt->lock);
    aotr_archive **grown = realloc(rt->added, (rt->num_added + 1) * sizeof *grown);
    if (!grown) {
        pthread_mutex_unlock(&rt->lock);
        aotr_archive_close(a);
        return aotr_fail(AOTR_OUT_OF_MEMORY, "aotr_runtime_add_archive: out of memory");
    }
    rt->added = grown;
    rt->added[rt->num_added++] = a;
    pthread_mutex_unlock(&rt->lock);
    return AOTR_OK;
}

uint64_t aotr_runtime_launch_count(const aotr_runtime *rt, const char *kernel)
{
    if (!rt)
        return 0;
    uint64_t n = 0;
    for (int k = 0; k < AOTR_KERNEL_COUNT; k++)
        if (!kernel || strcmp(kernel, aotr_kernel_names[k]) == 0)
            n += atomic_load_explicit(&rt->launches[k], memory_order_relaxed);
    return n;
}

/* -- drivers (called with rt->lock held) -------------------------------- */

static int library_loaded(const char *const *names)
{
    for (; *names; names++) {
        void *h = dlopen(*names, RTLD_NOW | RTLD_NOLOAD);
        if (h) {
            dlclose(h);
            return 1;
        }
    }
    return 0;
}

static aotr_backend auto_backend(const aotr_runtime *rt)
{
    static const char *const hip[] = {"libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5",
                                      "libamdhip64.so", NULL};
    static const char *const cuda[] = {"libcuda.so.1", "libcuda.so", NULL};
    if (rt->backend != AOTR_BACKEND_AUTO)
        return rt->backend;
    for (size_t i = 0; i < rt->num_added; i++)
        if (backend_of_archive(rt->added[i]) != AOTR_BACKEND_AUTO)
            return backend_of_archive(rt->added[i]);
    if (library_loaded(hip))
        return AOTR_BACKEND_HIP;
    if (library_loaded(cuda))
        return AOTR_BACKEND_CUDA;
    return AOTR_BACKEND_AUTO;
}

static aotr_status open_driver_for(aotr_runtime *rt, aotr_backend b, aotr_driver **out)
{
    if (!rt->drivers[b]) {
        aotr_status st = b == AOTR_BACKEND_HOST
                             ? aotr_driver_open_host(&rt->host, &rt->drivers[b])
                             : aotr_driver_open(b, rt->driver_library, &rt->drivers[b]);
        if (st != AOTR_OK)
            return st;
    }
    *out = rt->drivers[b];
    return AOTR_OK;
}

static aotr_status open_driver(aotr_runtime *rt, aotr_driver **out)
{
    aotr_backend b = auto_backend(rt);
    if (b != AOTR_BACKEND_AUTO)
        return open_driver_for(rt, b, out);
    /* Nothing loaded yet: the HIP runtime, else the CUDA driver. */
    if (open_driver_for(rt, AOTR_BACKEND_HIP, out) == AOTR_OK)
        return AOTR_OK;
    return open_driver_for(rt, AOTR_BACKEND_CUDA, out);
}

aotr_status aotr_runtime_driver(aotr_runtime *rt, aotr_driver **out)
{
    pthread_mutex_lock(&rt->lock);
    aotr_status st = open_driver(rt, out);
    pthread_mutex_unlock(&rt->lock);
    return st;
}

/* -- kernel tables -------------------------------------------------------- */

static int kernel_id_of(const char *name)
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
static void fill_group(group *g, aotr_launchable **members, size_t n, const aotr_json *tuning,
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
    group t = {0};
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

static aotr_status build_tables(aotr_device *dev)
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
        int kid = kernel_id_of(r->kernel);
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
        group *g = calloc(1, sizeof *g);
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

/* -- devices ---------------------------------------------------------------- */

static aotr_status device_init(aotr_runtime *rt, int32_t index, aotr_device **out)
{
    int trace = aotr_trace_on();
    double t0 = trace ? aotr_now_ms() : 0.0;
    aotr_driver *driver = NULL;
    aotr_status st = open_driver(rt, &driver);
    if (st != AOTR_OK)
        return st;
    double t1 = trace ? aotr_now_ms() : 0.0;
    aotr_device *dev = calloc(1, sizeof *dev);
    if (!dev)
        return aotr_fail(AOTR_OUT_OF_MEMORY, "out of memory");
    pthread_mutex_init(&dev->load_lock, NULL);
    dev->index = index;
    dev->driver = driver;
    st = aotr_driver_device_arch(driver, index, dev->arch, sizeof dev->arch);
    if (st != AOTR_OK)
        goto fail;
    for (size_t i = 0; i < rt->num_added && !dev->archive; i++) {
        const char *arch = aotr_archive_manifest_string(rt->added[i], "arch");
        if (arch && strcmp(arch, dev->arch) == 0)
            dev->archive = rt->added[i];
    }
    if (!dev->archive) {
        char path[4096];
        st = aotr_find_archive(dev->arch, rt->archive_dir, path, sizeof path);
        if (st == AOTR_OK)
            st = aotr_archive_open(path, &dev->archive);
        if (st != AOTR_OK)
            goto fail;
        dev->owns_archive = 1;
    }
    const char *arch = aotr_archive_manifest_string(dev->archive, "arch");
    if (!arch || strcmp(arch, dev->arch) != 0) {
        st = aotr_fail(AOTR_IDENTITY_MISMATCH,
                       "%s: the archive is for %s, device %d is %s: "
                       "install the kernel image for %s (pip install 'aotriton-rocm[%s]')",
                       aotr_archive_path(dev->archive), arch ? arch : "(none)", index, dev->arch,
                       dev->arch, dev->arch);
        goto fail;
    }
    if (backend_of_archive(dev->archive) != aotr_driver_backend(driver)) {
        st = aotr_fail(AOTR_IDENTITY_MISMATCH,
                       "%s: the archive's kernels are for the %s "
                       "backend, device %d runs on %s",
                       aotr_archive_path(dev->archive),
                       backend_name(backend_of_archive(dev->archive)), index,
                       backend_name(aotr_driver_backend(driver)));
        goto fail;
    }
    double t2 = trace ? aotr_now_ms() : 0.0;
    st = build_tables(dev);
    if (st != AOTR_OK)
        goto fail;
    if (trace) {
        double t3 = aotr_now_ms();
        aotr_trace("driver_open", t1 - t0, "(device %d)", index);
        aotr_trace("device_archive", t2 - t1, "device %d %s: %s%s", index, dev->arch,
                   aotr_archive_path(dev->archive),
                   dev->owns_archive ? " (found and opened)" : " (added)");
        aotr_trace("kernel_tables", t3 - t2, "device %d (%zu kernels)", index,
                   dev->num_launchables);
    }
    *out = dev;
    return AOTR_OK;
fail:
    device_free(dev);
    return st;
}

aotr_status aotr_runtime_device(aotr_runtime *rt, int32_t index, aotr_device **out)
{
    if (index < 0 || index >= MAX_DEVICES)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "device index %d is outside 0..%d", index,
                         MAX_DEVICES - 1);
    aotr_device *dev = atomic_load_explicit(&rt->devices[index], memory_order_acquire);
    if (dev) {
        *out = dev;
        return AOTR_OK;
    }
    pthread_mutex_lock(&rt->lock);
    aotr_status st = AOTR_OK;
    dev = atomic_load_explicit(&rt->devices[index], memory_order_relaxed);
    if (!dev) {
        if (rt->device_error[index]) {
            st = aotr_fail(rt->device_status[index], "%s", rt->device_error[index]);
        } else {
            st = device_init(rt, index, &dev);
            if (st == AOTR_OK) {
                atomic_store_explicit(&rt->devices[index], dev, memory_order_release);
            } else {
                rt->device_status[index] = st;
                rt->device_error[index] = strdup(aotr_last_error());
            }
        }
    }
    pthread_mutex_unlock(&rt->lock);
    *out = dev;
    return st;
}

aotr_status aotr_runtime_device_arch(aotr_runtime *rt, int32_t device, char *arch, size_t capacity)
{
    if (!rt || !arch || capacity == 0)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "aotr_runtime_device_arch: NULL argument");
    pthread_mutex_lock(&rt->lock);
    aotr_driver *driver = NULL;
    aotr_status st = open_driver(rt, &driver);
    pthread_mutex_unlock(&rt->lock);
    if (st != AOTR_OK)
        return st;
    return aotr_driver_device_arch(driver, device, arch, capacity);
}

/* -- selection and launch ------------------------------------------------- */

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
        const group *g = slots[i] >= 0 ? dev->groups[slots[i]] : NULL;
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

int32_t aotr_device_compute_units(aotr_device *dev)
{
    int32_t n = atomic_load_explicit(&dev->compute_units, memory_order_relaxed);
    if (n == 0) {
        /* a failed query means "unknown" (-1), not an error: callers then
         * choose no split, which is always correct */
        if (aotr_driver_compute_units(dev->driver, dev->index, &n) != AOTR_OK || n <= 0)
            n = -1;
        atomic_store_explicit(&dev->compute_units, n, memory_order_relaxed);
    }
    return n > 0 ? n : 0;
}

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

aotr_driver *aotr_device_driver(aotr_device *dev, int32_t *index)
{
    *index = dev->index;
    return dev->driver;
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
        atomic_fetch_add_explicit(&rt->launches[kernel_id_of(k->record->kernel)], 1,
                                  memory_order_relaxed);
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
    int kid = kernel_id_of(r->kernel);
    atomic_fetch_add_explicit(&rt->launches[kid], 1, memory_order_relaxed);
    return AOTR_OK;
}
