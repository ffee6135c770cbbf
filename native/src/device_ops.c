/* Stream-ordered copies, fills and allocations through the runtime's driver
 * (the public aotr_copy_2d & co.). The driver functions are looked up by
 * name on first use: only callers that stage tensors need them. */
#include <stdint.h>
#include <string.h>

#include "internal.h"

typedef int drv_result;

#define HIP_MEMCPY_DEFAULT 4 /* hipMemcpyDefault: direction from the addresses */
#define CU_MEMORYTYPE_UNIFIED 4

/* CUDA_MEMCPY2D (cuda.h): the enum fields are 4 bytes, padded before pointers. */
struct cu_memcpy2d {
    size_t src_x, src_y;
    int src_type;
    const void *src_host;
    uint64_t src_device;
    void *src_array;
    size_t src_pitch;
    size_t dst_x, dst_y;
    int dst_type;
    void *dst_host;
    uint64_t dst_device;
    void *dst_array;
    size_t dst_pitch;
    size_t width, height;
};

typedef struct op {
    aotr_driver *driver;
    int pushed;
    int cuda;
} op;

static aotr_status op_begin(aotr_runtime *rt, int32_t device, op *o, const char *what)
{
    if (!rt)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "%s: `runtime` is NULL", what);
    aotr_status st = aotr_runtime_driver(rt, &o->driver);
    if (st != AOTR_OK)
        return st;
    o->cuda = aotr_driver_backend(o->driver) == AOTR_BACKEND_CUDA;
    return aotr_driver_enter(o->driver, device, &o->pushed);
}

static aotr_status op_end(op *o, const char *function, drv_result rc)
{
    aotr_driver_leave(o->driver, o->pushed);
    if (rc == 0)
        return AOTR_OK;
    return aotr_fail(rc == 2 ? AOTR_OUT_OF_MEMORY : AOTR_DRIVER_ERROR, "%s failed with error %d",
                     function, rc);
}

/* Store the driver function `name` into the function pointer at `fn`
 * (memcpy: ISO C has no object-to-function pointer cast); 0 with an
 * AOTR_UNSUPPORTED message (and the context bracket closed) if absent. */
static int need(op *o, const char *name, void *fn, size_t size, aotr_status *st)
{
    void *f = aotr_driver_symbol(o->driver, name);
    if (!f) {
        aotr_driver_leave(o->driver, o->pushed);
        *st = aotr_fail(AOTR_UNSUPPORTED, "the driver has no %s", name);
        return 0;
    }
    memcpy(fn, &f, size);
    return 1;
}

#define CALL(o, type, name, ...)                                  \
    do {                                                          \
        aotr_status st_ = AOTR_OK;                                \
        type f_;                                                  \
        if (!need(o, name, &f_, sizeof f_, &st_))                 \
            return st_;                                           \
        return op_end(o, name, f_(__VA_ARGS__));                  \
    } while (0)

aotr_status aotr_current_device(aotr_runtime *rt, int32_t *device)
{
    op o;
    if (!device)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "aotr_current_device: `device` is NULL");
    if (!rt)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "aotr_current_device: `runtime` is NULL");
    aotr_status st = aotr_runtime_driver(rt, &o.driver);
    if (st != AOTR_OK)
        return st;
    o.pushed = 0; /* the thread's own context decides */
    int d = 0;
    if (aotr_driver_backend(o.driver) == AOTR_BACKEND_CUDA) {
        typedef drv_result (*fn)(int *);
        fn f;
        if (!need(&o, "cuCtxGetDevice", &f, sizeof f, &st))
            return st;
        drv_result rc = f(&d);
        if (rc == 201) /* no current context: torch has not touched CUDA yet */
            d = 0, rc = 0;
        st = op_end(&o, "cuCtxGetDevice", rc);
    } else {
        typedef drv_result (*fn)(int *);
        fn f;
        if (!need(&o, "hipGetDevice", &f, sizeof f, &st))
            return st;
        st = op_end(&o, "hipGetDevice", f(&d));
    }
    *device = d;
    return st;
}

aotr_status aotr_stream_capturing(aotr_runtime *rt, int32_t device, void *stream, int *capturing)
{
    op o;
    int status = 0;
    aotr_status st;
    if (!capturing)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "aotr_stream_capturing: `capturing` is NULL");
    if ((st = op_begin(rt, device, &o, "aotr_stream_capturing")) != AOTR_OK)
        return st;
    typedef drv_result (*fn)(void *, int *);
    const char *name = o.cuda ? "cuStreamIsCapturing" : "hipStreamIsCapturing";
    fn f;
    if (!need(&o, name, &f, sizeof f, &st))
        return st;
    st = op_end(&o, name, f(stream, &status));
    *capturing = status != 0; /* 0: none; 1: active; 2: invalidated */
    return st;
}

aotr_status aotr_stream_synchronize(aotr_runtime *rt, int32_t device, void *stream)
{
    op o;
    aotr_status st = op_begin(rt, device, &o, "aotr_stream_synchronize");
    if (st != AOTR_OK)
        return st;
    typedef drv_result (*fn)(void *);
    if (o.cuda)
        CALL(&o, fn, "cuStreamSynchronize", stream);
    CALL(&o, fn, "hipStreamSynchronize", stream);
}

aotr_status aotr_copy_2d(aotr_runtime *rt, int32_t device, void *stream, void *dst,
                         size_t dst_pitch, const void *src, size_t src_pitch, size_t width,
                         size_t rows)
{
    if (rows == 0 || width == 0)
        return AOTR_OK;
    if (!dst || !src || width > dst_pitch || width > src_pitch)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "aotr_copy_2d: null address, or a row wider "
                         "than its pitch");
    op o;
    aotr_status st = op_begin(rt, device, &o, "aotr_copy_2d");
    if (st != AOTR_OK)
        return st;
    if (o.cuda) {
        struct cu_memcpy2d c;
        memset(&c, 0, sizeof c);
        c.src_type = c.dst_type = CU_MEMORYTYPE_UNIFIED;
        c.src_device = (uint64_t)(uintptr_t)src;
        c.dst_device = (uint64_t)(uintptr_t)dst;
        c.src_pitch = src_pitch;
        c.dst_pitch = dst_pitch;
        c.width = width;
        c.height = rows;
        typedef drv_result (*fn)(const struct cu_memcpy2d *, void *);
        CALL(&o, fn, "cuMemcpy2DAsync_v2", &c, stream);
    }
    typedef drv_result (*fn)(void *, size_t, const void *, size_t, size_t, size_t, int, void *);
    CALL(&o, fn, "hipMemcpy2DAsync", dst, dst_pitch, src, src_pitch, width, rows,
         HIP_MEMCPY_DEFAULT, stream);
}

aotr_status aotr_fill(aotr_runtime *rt, int32_t device, void *stream, void *dst, int value,
                      size_t bytes)
{
    if (bytes == 0)
        return AOTR_OK;
    op o;
    aotr_status st = op_begin(rt, device, &o, "aotr_fill");
    if (st != AOTR_OK)
        return st;
    if (o.cuda) {
        typedef drv_result (*fn)(uint64_t, unsigned char, size_t, void *);
        CALL(&o, fn, "cuMemsetD8Async", (uint64_t)(uintptr_t)dst, (unsigned char)value, bytes,
             stream);
    }
    typedef drv_result (*fn)(void *, int, size_t, void *);
    CALL(&o, fn, "hipMemsetAsync", dst, value & 0xff, bytes, stream);
}

aotr_status aotr_alloc_async(aotr_runtime *rt, int32_t device, void *stream, size_t bytes,
                             void **ptr)
{
    if (!ptr)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "aotr_alloc_async: `ptr` is NULL");
    *ptr = NULL;
    op o;
    aotr_status st = op_begin(rt, device, &o, "aotr_alloc_async");
    if (st != AOTR_OK)
        return st;
    if (o.cuda) {
        uint64_t p = 0;
        typedef drv_result (*fn)(uint64_t *, size_t, void *);
        fn f;
        if (!need(&o, "cuMemAllocAsync", &f, sizeof f, &st))
            return st;
        st = op_end(&o, "cuMemAllocAsync", f(&p, bytes ? bytes : 1, stream));
        *ptr = (void *)(uintptr_t)p;
        return st;
    }
    typedef drv_result (*fn)(void **, size_t, void *);
    CALL(&o, fn, "hipMallocAsync", ptr, bytes ? bytes : 1, stream);
}

aotr_status aotr_free_async(aotr_runtime *rt, int32_t device, void *stream, void *ptr)
{
    if (!ptr)
        return AOTR_OK;
    op o;
    aotr_status st = op_begin(rt, device, &o, "aotr_free_async");
    if (st != AOTR_OK)
        return st;
    if (o.cuda) {
        typedef drv_result (*fn)(uint64_t, void *);
        CALL(&o, fn, "cuMemFreeAsync", (uint64_t)(uintptr_t)ptr, stream);
    }
    typedef drv_result (*fn)(void *, void *);
    CALL(&o, fn, "hipFreeAsync", ptr, stream);
}

aotr_status aotr_compute_units(aotr_runtime *rt, int32_t device, int32_t *count)
{
    aotr_driver *d = NULL;
    if (!rt || !count)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "aotr_compute_units: NULL argument");
    aotr_status st = aotr_runtime_driver(rt, &d);
    return st == AOTR_OK ? aotr_driver_compute_units(d, device, count) : st;
}
