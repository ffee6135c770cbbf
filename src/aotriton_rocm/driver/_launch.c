/*
 * Native kernel launcher of aotriton-rocm.
 *
 * One job: turn a tuple of Python kernel arguments into the `void **kernelParams`
 * array of cuLaunchKernel / hipModuleLaunchKernel and call the launch function
 * whose address Python obtained from the driver library (ctypes). This module
 * links against nothing but libc: it never opens libcuda or libamdhip64 itself,
 * so the wheel stays manylinux-clean and works with whichever driver library
 * the process already uses.
 *
 * Built against the stable ABI (Py_LIMITED_API 0x03090000, abi3): one binary
 * for every CPython >= 3.9. METH_FASTCALL is not part of the 3.9 limited API,
 * so `launch` uses METH_VARARGS and reads its tuple directly.
 *
 * Signature codes (one byte per kernel parameter, in order):
 *   'p'  pointer / device address: int in [0, 2**64), or None for NULL
 *   'z'  NULL pointer that consumes no Python argument (Triton's scratch args)
 *   '?'  i1/u1 as one byte: int 0 or 1
 *   'b'  int8      'B'  uint8
 *   'h'  int16     'H'  uint16
 *   'i'  int32     'I'  uint32
 *   'l'  int64     'L'  uint64
 *   'f'  fp32 (from a Python float/int; rounded to nearest)
 *   'd'  fp64
 * Integers are range-checked (OverflowError, never truncated); integer codes
 * accept int or any object with __index__, not float. An fp32 value that is
 * finite as a double but does not fit a float raises OverflowError.
 */
#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x03090000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Largest number of kernel parameters (scratch slots included). CUDA and HIP
 * allow 4 KiB of parameters; 8-byte slots keep us far below that. */
#define AOT_MAX_ARGS 256

/* Version of the Python <-> C calling protocol of `launch`. */
#define AOT_LAUNCH_PROTOCOL 1

/* CUresult cuLaunchKernel(CUfunction f, unsigned gridDimX, unsigned gridDimY,
 *     unsigned gridDimZ, unsigned blockDimX, unsigned blockDimY,
 *     unsigned blockDimZ, unsigned sharedMemBytes, CUstream hStream,
 *     void **kernelParams, void **extra);
 * hipError_t hipModuleLaunchKernel(...) has the same parameter list. Both
 * results are C enums (int). */
typedef int (*aot_launch_fn)(void *f, unsigned int grid_x, unsigned int grid_y,
                             unsigned int grid_z, unsigned int block_x,
                             unsigned int block_y, unsigned int block_z,
                             unsigned int shared_mem_bytes, void *stream,
                             void **kernel_params, void **extra);

typedef union {
    int8_t i8;
    uint8_t u8;
    int16_t i16;
    uint16_t u16;
    int32_t i32;
    uint32_t u32;
    int64_t i64;
    uint64_t u64;
    float f32;
    double f64;
    void *ptr;
} aot_slot;

static const char *
code_name(char code)
{
    switch (code) {
    case 'p': return "pointer";
    case 'z': return "null pointer";
    case '?': return "i1";
    case 'b': return "int8";
    case 'B': return "uint8";
    case 'h': return "int16";
    case 'H': return "uint16";
    case 'i': return "int32";
    case 'I': return "uint32";
    case 'l': return "int64";
    case 'L': return "uint64";
    case 'f': return "fp32";
    case 'd': return "fp64";
    default: return NULL;
    }
}

/* Replace a pending OverflowError by one that names the argument. */
static void
reraise_overflow(Py_ssize_t index, char code, PyObject *value)
{
    if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
        PyErr_Clear();
        PyErr_Format(PyExc_OverflowError,
                     "kernel argument %zd (%s): %R is out of range",
                     index, code_name(code), value);
    }
}

static void
range_error(Py_ssize_t index, char code, PyObject *value)
{
    PyErr_Format(PyExc_OverflowError,
                 "kernel argument %zd (%s): %R is out of range", index,
                 code_name(code), value);
}

/* Fast conversions: on LP64 (Linux) `long` is 64-bit, and PyLong_AsLong /
 * PyLong_AsUnsignedLong walk the digits directly, while the long long
 * variants go through a byte-array copy for multi-digit values (pointers). */
static long long
as_long_long(PyObject *number)
{
#if defined(__LP64__) || defined(_LP64)
    return PyLong_AsLong(number);
#else
    return PyLong_AsLongLong(number);
#endif
}

static unsigned long long
as_unsigned_long_long(PyObject *number)
{
#if defined(__LP64__) || defined(_LP64)
    return PyLong_AsUnsignedLong(number);
#else
    return PyLong_AsUnsignedLongLong(number);
#endif
}

/* Python integer (int or __index__) -> int64. Returns 0 on success. */
static int
to_i64(PyObject *value, Py_ssize_t index, char code, int64_t *out)
{
    PyObject *number;
    long long v;

    if (PyLong_Check(value)) {
        v = as_long_long(value);
    }
    else {
        number = PyNumber_Index(value);
        if (number == NULL) {
            if (PyErr_ExceptionMatches(PyExc_TypeError)) {
                PyErr_Clear();
                PyErr_Format(PyExc_TypeError,
                             "kernel argument %zd (%s) must be an int, not %R",
                             index, code_name(code), value);
            }
            return -1;
        }
        v = as_long_long(number);
        Py_DECREF(number);
    }
    if (v == -1 && PyErr_Occurred()) {
        reraise_overflow(index, code, value);
        return -1;
    }
    *out = (int64_t)v;
    return 0;
}

/* Python integer (int or __index__) -> uint64; negative is OverflowError. */
static int
to_u64(PyObject *value, Py_ssize_t index, char code, uint64_t *out)
{
    PyObject *number;
    unsigned long long v;

    if (PyLong_Check(value)) {
        v = as_unsigned_long_long(value);
    }
    else {
        number = PyNumber_Index(value);
        if (number == NULL) {
            if (PyErr_ExceptionMatches(PyExc_TypeError)) {
                PyErr_Clear();
                PyErr_Format(PyExc_TypeError,
                             "kernel argument %zd (%s) must be an int, not %R",
                             index, code_name(code), value);
            }
            return -1;
        }
        v = as_unsigned_long_long(number);
        Py_DECREF(number);
    }
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        reraise_overflow(index, code, value);
        return -1;
    }
    *out = (uint64_t)v;
    return 0;
}

static int
to_double(PyObject *value, Py_ssize_t index, char code, double *out)
{
    double v = PyFloat_AsDouble(value);
    if (v == -1.0 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError,
                         "kernel argument %zd (%s) must be a float, not %R",
                         index, code_name(code), value);
        }
        else {
            reraise_overflow(index, code, value);
        }
        return -1;
    }
    *out = v;
    return 0;
}

/* Bounds of the integer codes narrower than 64 bits. */
static void
small_int_range(char code, int64_t *lo, int64_t *hi)
{
    switch (code) {
    case '?': *lo = 0;         *hi = 1;          break;
    case 'b': *lo = INT8_MIN;  *hi = INT8_MAX;   break;
    case 'B': *lo = 0;         *hi = UINT8_MAX;  break;
    case 'h': *lo = INT16_MIN; *hi = INT16_MAX;  break;
    case 'H': *lo = 0;         *hi = UINT16_MAX; break;
    case 'i': *lo = INT32_MIN; *hi = INT32_MAX;  break;
    default:  *lo = 0;         *hi = (int64_t)UINT32_MAX; break; /* 'I' */
    }
}

/* Store an in-range value of a narrow integer code into its slot member. */
static void
store_small_int(char code, int64_t v, aot_slot *slot)
{
    switch (code) {
    case '?': case 'B': slot->u8 = (uint8_t)v;   break;
    case 'b':           slot->i8 = (int8_t)v;    break;
    case 'h':           slot->i16 = (int16_t)v;  break;
    case 'H':           slot->u16 = (uint16_t)v; break;
    case 'i':           slot->i32 = (int32_t)v;  break;
    default:            slot->u32 = (uint32_t)v; break; /* 'I' */
    }
}

/* Convert one Python value into `slot` according to `code`. */
static int
pack_one(char code, PyObject *value, Py_ssize_t index, aot_slot *slot)
{
    int64_t s = 0;
    uint64_t u = 0;
    double d = 0.0;

    slot->u64 = 0;
    switch (code) {
    case 'p':
        if (value == Py_None) {
            slot->ptr = NULL;
            return 0;
        }
        if (to_u64(value, index, code, &u))
            return -1;
        if (sizeof(void *) < sizeof(uint64_t) && u > (uint64_t)UINTPTR_MAX) {
            range_error(index, code, value);
            return -1;
        }
        slot->ptr = (void *)(uintptr_t)u;
        return 0;
    case '?': case 'b': case 'B': case 'h': case 'H': case 'i': case 'I': {
        int64_t lo, hi;
        small_int_range(code, &lo, &hi);
        if (to_i64(value, index, code, &s))
            return -1;
        if (s < lo || s > hi) {
            range_error(index, code, value);
            return -1;
        }
        store_small_int(code, s, slot);
        return 0;
    }
    case 'l':
        if (to_i64(value, index, code, &s))
            return -1;
        slot->i64 = s;
        return 0;
    case 'L':
        if (to_u64(value, index, code, &u))
            return -1;
        slot->u64 = u;
        return 0;
    case 'f': {
        float f;
        if (to_double(value, index, code, &d))
            return -1;
        f = (float)d;
        if (isinf(f) && !isinf(d)) {
            range_error(index, code, value);
            return -1;
        }
        slot->f32 = f;
        return 0;
    }
    case 'd':
        if (to_double(value, index, code, &d))
            return -1;
        slot->f64 = d;
        return 0;
    default: /* unreachable: aot_launch validates the signature first */
        PyErr_SetString(PyExc_SystemError, "unchecked signature code");
        return -1;
    }
}

/* One of the launch configuration values: an int in [0, 2**32). */
static int
launch_u32(PyObject *value, const char *what, unsigned int *out)
{
    unsigned long long v;

    if (!PyLong_Check(value)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, not %R", what, value);
        return -1;
    }
    v = as_unsigned_long_long(value);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_OverflowError,
                         "%s must be in [0, 2**32), got %R", what, value);
        }
        return -1;
    }
    if (v > 0xFFFFFFFFull) {
        PyErr_Format(PyExc_OverflowError, "%s must be in [0, 2**32), got %R",
                     what, value);
        return -1;
    }
    *out = (unsigned int)v;
    return 0;
}

/* A handle or address: an int in [0, 2**64) that fits a pointer. */
static int
launch_ptr(PyObject *value, const char *what, void **out)
{
    unsigned long long v;

    if (!PyLong_Check(value)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, not %R", what, value);
        return -1;
    }
    v = as_unsigned_long_long(value);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_OverflowError,
                         "%s must be an address in [0, 2**64), got %R", what,
                         value);
        }
        return -1;
    }
    if (sizeof(void *) < sizeof(unsigned long long) &&
        v > (unsigned long long)UINTPTR_MAX) {
        PyErr_Format(PyExc_OverflowError, "%s does not fit a pointer: %R",
                     what, value);
        return -1;
    }
    *out = (void *)(uintptr_t)v;
    return 0;
}

PyDoc_STRVAR(launch_doc,
"launch(launch_fn, function, grid_x, grid_y, grid_z, block_x, block_y, block_z,\n"
"       shared, stream, signature, args) -> int\n"
"\n"
"Pack `args` (a tuple) according to `signature` (bytes, one code per kernel\n"
"parameter) and call the C function at address `launch_fn`, which must have\n"
"the prototype of cuLaunchKernel / hipModuleLaunchKernel, with `function`\n"
"(CUfunction / hipFunction_t handle), the grid and block dimensions, `shared`\n"
"dynamic shared memory bytes, `stream` (handle as int), the packed\n"
"kernelParams and extra=NULL. Returns the driver's result code (0 = success).\n"
"A grid with a zero dimension launches nothing and returns 0. The GIL is\n"
"released during the call.");

static PyObject *
aot_launch(PyObject *self, PyObject *args)
{
    aot_slot slots[AOT_MAX_ARGS];
    void *params[AOT_MAX_ARGS];
    void *launch_fn_addr, *function, *stream;
    unsigned int gx, gy, gz, bx, by, bz, shared;
    PyObject *signature, *kargs;
    char *sig;
    Py_ssize_t nsig, nargs, nexpected, i, k;
    aot_launch_fn launch_fn;
    int rc;

    (void)self;
    if (PyTuple_Size(args) != 12) {
        PyErr_Format(PyExc_TypeError,
                     "launch() takes 12 arguments (%zd given)",
                     PyTuple_Size(args));
        return NULL;
    }
    if (launch_ptr(PyTuple_GetItem(args, 0), "launch_fn", &launch_fn_addr) ||
        launch_ptr(PyTuple_GetItem(args, 1), "function", &function) ||
        launch_u32(PyTuple_GetItem(args, 2), "grid_x", &gx) ||
        launch_u32(PyTuple_GetItem(args, 3), "grid_y", &gy) ||
        launch_u32(PyTuple_GetItem(args, 4), "grid_z", &gz) ||
        launch_u32(PyTuple_GetItem(args, 5), "block_x", &bx) ||
        launch_u32(PyTuple_GetItem(args, 6), "block_y", &by) ||
        launch_u32(PyTuple_GetItem(args, 7), "block_z", &bz) ||
        launch_u32(PyTuple_GetItem(args, 8), "shared", &shared) ||
        launch_ptr(PyTuple_GetItem(args, 9), "stream", &stream))
        return NULL;
    if (launch_fn_addr == NULL) {
        PyErr_SetString(PyExc_ValueError, "launch_fn is NULL");
        return NULL;
    }
    if (function == NULL) {
        PyErr_SetString(PyExc_ValueError, "function handle is NULL");
        return NULL;
    }
    signature = PyTuple_GetItem(args, 10);
    if (!PyBytes_Check(signature)) {
        PyErr_Format(PyExc_TypeError, "signature must be bytes, not %R",
                     signature);
        return NULL;
    }
    if (PyBytes_AsStringAndSize(signature, &sig, &nsig) < 0)
        return NULL;
    if (nsig > AOT_MAX_ARGS) {
        PyErr_Format(PyExc_ValueError,
                     "kernel has %zd parameters; the launcher supports at most %d",
                     nsig, AOT_MAX_ARGS);
        return NULL;
    }
    kargs = PyTuple_GetItem(args, 11);
    if (!PyTuple_Check(kargs)) {
        PyErr_Format(PyExc_TypeError, "args must be a tuple, not %R", kargs);
        return NULL;
    }
    nargs = PyTuple_Size(kargs);
    nexpected = 0;
    for (i = 0; i < nsig; i++) {
        if (code_name(sig[i]) == NULL) {
            PyObject *bad = PyBytes_FromStringAndSize(sig + i, 1);
            if (bad != NULL) {
                PyErr_Format(PyExc_ValueError,
                             "unknown kernel signature code %R at position %zd",
                             bad, i);
                Py_DECREF(bad);
            }
            return NULL;
        }
        if (sig[i] != 'z')
            nexpected++;
    }
    if (nargs != nexpected) {
        PyErr_Format(PyExc_TypeError,
                     "kernel takes %zd arguments (%zd given)", nexpected, nargs);
        return NULL;
    }

    for (i = 0, k = 0; i < nsig; i++) {
        params[i] = &slots[i];
        if (sig[i] == 'z') {
            slots[i].u64 = 0;
            slots[i].ptr = NULL;
            continue;
        }
        if (pack_one(sig[i], PyTuple_GetItem(kargs, k), k, &slots[i]))
            return NULL;
        k++;
    }

    if (gx == 0 || gy == 0 || gz == 0)
        return PyLong_FromLong(0);

    launch_fn = (aot_launch_fn)(uintptr_t)launch_fn_addr;
    Py_BEGIN_ALLOW_THREADS
    rc = launch_fn(function, gx, gy, gz, bx, by, bz, shared, stream,
                   nsig ? params : NULL, NULL);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong((long)rc);
}

/* A C function with the launch prototype that does nothing: lets benchmarks
 * measure the launcher's own cost without a driver. */
static int
aot_noop_launch(void *f, unsigned int gx, unsigned int gy, unsigned int gz,
                unsigned int bx, unsigned int by, unsigned int bz,
                unsigned int shared, void *stream, void **params, void **extra)
{
    (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz;
    (void)shared; (void)stream; (void)params; (void)extra;
    return 0;
}

static PyObject *
aot_noop_launch_address(PyObject *self, PyObject *unused)
{
    aot_launch_fn fn = aot_noop_launch;
    (void)self;
    (void)unused;
    return PyLong_FromVoidPtr((void *)(uintptr_t)fn);
}

static PyMethodDef aot_methods[] = {
    {"launch", aot_launch, METH_VARARGS, launch_doc},
    {"noop_launch_address", aot_noop_launch_address, METH_NOARGS,
     "noop_launch_address() -> int\n\nAddress of a C function with the "
     "cuLaunchKernel prototype that does nothing and returns 0 (benchmarks)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef aot_module = {
    PyModuleDef_HEAD_INIT,
    "_launch",
    "Native kernel launcher of aotriton-rocm (stable ABI, libc only).",
    -1,
    aot_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__launch(void)
{
    PyObject *m = PyModule_Create(&aot_module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "MAX_ARGS", AOT_MAX_ARGS) < 0 ||
        PyModule_AddIntConstant(m, "PROTOCOL", AOT_LAUNCH_PROTOCOL) < 0 ||
        PyModule_AddStringConstant(m, "CODES", "pz?bBhHiIlLfd") < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
