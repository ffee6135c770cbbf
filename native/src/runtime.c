/* The runtime: its options and added archives, the drivers, and per device
 * its arch, archive, driver and kernel tables (kernel_tables.c), set up on
 * first use; launch.c launches. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime_internal.h"
#include "slots.h"

#define MAX_DEVICES 64

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

void aotr_runtime_count_launch(aotr_runtime *rt, int kernel_id)
{
    atomic_fetch_add_explicit(&rt->launches[kernel_id], 1, memory_order_relaxed);
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
    st = aotr_build_tables(dev);
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

aotr_driver *aotr_device_driver(aotr_device *dev, int32_t *index)
{
    *index = dev->index;
    return dev->driver;
}
