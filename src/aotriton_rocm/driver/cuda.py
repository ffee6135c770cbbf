"""CUDA driver API (libcuda.so.1) through ctypes: the NVIDIA test target.

Prototypes mirrored from cuda.h (CUresult is an int enum; CUdevice an int;
CUcontext, CUmodule, CUfunction, CUstream are pointers):

    CUresult cuInit(unsigned int Flags);
    CUresult cuGetErrorName(CUresult error, const char **pStr);
    CUresult cuGetErrorString(CUresult error, const char **pStr);
    CUresult cuDeviceGet(CUdevice *device, int ordinal);
    CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev);
    CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
    CUresult cuCtxGetCurrent(CUcontext *pctx);
    CUresult cuCtxSetCurrent(CUcontext ctx);
    CUresult cuCtxPushCurrent_v2(CUcontext ctx);     /* cuCtxPushCurrent */
    CUresult cuCtxPopCurrent_v2(CUcontext *pctx);    /* cuCtxPopCurrent */
    CUresult cuModuleLoadData(CUmodule *module, const void *image);
    CUresult cuModuleUnload(CUmodule hmod);
    CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name);
    CUresult cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value);
    CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                            unsigned int gridDimZ, unsigned int blockDimX,
                            unsigned int blockDimY, unsigned int blockDimZ,
                            unsigned int sharedMemBytes, CUstream hStream,
                            void **kernelParams, void **extra);

cuLaunchKernel itself is called from the native launcher (by address).
"""

from __future__ import annotations

import contextlib
import ctypes
from ctypes import POINTER, byref, c_char_p, c_int, c_uint, c_void_p
from typing import Dict, Iterator, Tuple

from ._base import Driver, DriverError, bind, function_address, mapped_library, open_library

LIBRARY = "libcuda.so.1"

CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_NOT_INITIALIZED = 3
CUDA_ERROR_DEINITIALIZED = 4
CUDA_ERROR_INSUFFICIENT_DRIVER = 35
CUDA_ERROR_NO_DEVICE = 100
CUDA_ERROR_INVALID_DEVICE = 101
CUDA_ERROR_INVALID_IMAGE = 200
CUDA_ERROR_INVALID_CONTEXT = 201
CUDA_ERROR_NO_BINARY_FOR_GPU = 209
CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222
CUDA_ERROR_INVALID_HANDLE = 400
CUDA_ERROR_NOT_FOUND = 500
CUDA_ERROR_ILLEGAL_ADDRESS = 700
CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701
CUDA_ERROR_LAUNCH_FAILED = 719

# CUfunction_attribute
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
# CUdevice_attribute
CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97
# Dynamic shared memory above this needs the opt-in attribute.
DEFAULT_MAX_DYNAMIC_SHARED = 49152

_NO_DRIVER_HINT = (
    "The CUDA backend needs an NVIDIA GPU with its driver installed (libcuda.so.1 comes with "
    "the driver, not with torch). On a machine without one, use the CPU (interpreter) "
    "backend; on a ROCm machine the backend is 'hip'")

_LOAD_HINTS = {
    CUDA_ERROR_NO_BINARY_FOR_GPU: (
        "the cubin was compiled for another GPU architecture: install the image wheel built "
        "for this GPU (see `aotriton-rocm info`)"),
    CUDA_ERROR_INVALID_IMAGE: (
        "the code object is not a valid cubin for this driver: the archive may be damaged or "
        "built for another backend; reinstall the image wheel"),
    CUDA_ERROR_UNSUPPORTED_PTX_VERSION: (
        "the code object needs a newer NVIDIA driver: update the driver"),
    CUDA_ERROR_NOT_FOUND: (
        "the kernel symbol is not in the code object: the archive's manifest does not match "
        "its code objects; reinstall the image wheel"),
    CUDA_ERROR_INVALID_DEVICE: (
        "no such device index (check CUDA_VISIBLE_DEVICES and torch.cuda.device_count())"),
    CUDA_ERROR_NO_DEVICE: _NO_DRIVER_HINT,
    CUDA_ERROR_INSUFFICIENT_DRIVER: "the installed NVIDIA driver is too old: update it",
}

_LAUNCH_HINTS = {
    CUDA_ERROR_INVALID_CONTEXT: (
        "no CUDA context of the kernel's device is current on this thread: launch under "
        "torch.cuda.device(index)"),
    CUDA_ERROR_INVALID_HANDLE: (
        "the stream or function belongs to another device: launch under "
        "torch.cuda.device(index) with that device's current stream"),
    CUDA_ERROR_INVALID_VALUE: (
        "invalid launch configuration (grid y/z above 65535, block above 1024 threads, or "
        "shared memory above the function's limit)"),
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: (
        "the kernel needs more registers or shared memory than the GPU offers for this block "
        "size: the kernel variant does not fit this GPU"),
    CUDA_ERROR_ILLEGAL_ADDRESS: (
        "a kernel accessed invalid memory; the CUDA context is now unusable, restart the "
        "process. Please report it with the shapes, dtypes and strides used"),
    CUDA_ERROR_LAUNCH_FAILED: (
        "a kernel failed; the CUDA context is now unusable, restart the process"),
}


class CudaDriver(Driver):
    backend = "cuda"

    def __init__(self) -> None:
        super().__init__()
        # libcuda.so.1 is the soname: dlopen returns the copy already loaded.
        candidates = [LIBRARY]
        mapped = mapped_library(LIBRARY)
        if mapped:
            candidates.insert(0, mapped)
        lib, self.library = open_library(candidates, backend="cuda",
                                         what="CUDA driver library", hint=_NO_DRIVER_HINT)
        self._lib = lib

        def f(name, *argtypes):
            return bind(lib, self.library, "cuda", name, c_int, list(argtypes))

        self._cuInit = f("cuInit", c_uint)
        self._cuGetErrorName = f("cuGetErrorName", c_int, POINTER(c_char_p))
        self._cuGetErrorString = f("cuGetErrorString", c_int, POINTER(c_char_p))
        self._cuDeviceGet = f("cuDeviceGet", POINTER(c_int), c_int)
        self._cuDeviceGetAttribute = f("cuDeviceGetAttribute", POINTER(c_int), c_int, c_int)
        self._cuDevicePrimaryCtxRetain = f("cuDevicePrimaryCtxRetain", POINTER(c_void_p), c_int)
        self._cuCtxGetCurrent = f("cuCtxGetCurrent", POINTER(c_void_p))
        self._cuCtxSetCurrent = f("cuCtxSetCurrent", c_void_p)
        self._cuCtxPushCurrent = f("cuCtxPushCurrent_v2", c_void_p)
        self._cuCtxPopCurrent = f("cuCtxPopCurrent_v2", POINTER(c_void_p))
        self._cuModuleLoadData = f("cuModuleLoadData", POINTER(c_void_p), c_char_p)
        self._cuModuleUnload = f("cuModuleUnload", c_void_p)
        self._cuModuleGetFunction = f("cuModuleGetFunction", POINTER(c_void_p), c_void_p,
                                      c_char_p)
        self._cuFuncSetAttribute = f("cuFuncSetAttribute", c_void_p, c_int, c_int)
        launch = f("cuLaunchKernel", c_void_p, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint,
                   c_uint, c_void_p, POINTER(c_void_p), POINTER(c_void_p))
        self.launch_fn = function_address(launch)
        # Primary context per device index (retained once, never released).
        self._contexts: Dict[int, int] = {}

        self.check(self._cuInit(0), "cuInit")

    # -- errors --------------------------------------------------------------
    def error_name_and_string(self, code: int) -> Tuple[str, str]:
        name, text = c_char_p(), c_char_p()
        if self._cuGetErrorName(code, byref(name)) != CUDA_SUCCESS or not name.value:
            return "CUDA_ERROR_UNRECOGNIZED", "unrecognized error code"
        if self._cuGetErrorString(code, byref(text)) != CUDA_SUCCESS or not text.value:
            return name.value.decode(errors="replace"), "no description"
        return name.value.decode(errors="replace"), text.value.decode(errors="replace")

    def hint_for(self, function: str, code: int) -> str:
        if function == "cuLaunchKernel":
            return _LAUNCH_HINTS.get(code, "")
        if function == "cuInit":
            return _LOAD_HINTS.get(code, _NO_DRIVER_HINT)
        return _LOAD_HINTS.get(code, "")

    # -- contexts ------------------------------------------------------------
    def _primary_context(self, device_index: int) -> int:
        ctx = self._contexts.get(device_index)
        if ctx is None:
            dev = c_int()
            self.check(self._cuDeviceGet(byref(dev), device_index), "cuDeviceGet")
            handle = c_void_p()
            self.check(self._cuDevicePrimaryCtxRetain(byref(handle), dev.value),
                       "cuDevicePrimaryCtxRetain")
            ctx = self._contexts[device_index] = handle.value or 0
        return ctx

    def _current_context(self) -> int:
        cur = c_void_p()
        self.check(self._cuCtxGetCurrent(byref(cur)), "cuCtxGetCurrent")
        return cur.value or 0

    @contextlib.contextmanager
    def device_context(self, device_index: int) -> Iterator[None]:
        """Run the body with device ``device_index``'s primary context current:
        made current if the thread has none, pushed and popped if the thread
        has another one."""
        ctx = self._primary_context(device_index)
        cur = self._current_context()
        if cur == 0:
            self.check(self._cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
            yield
        elif cur == ctx:
            yield
        else:
            self.check(self._cuCtxPushCurrent(ctx), "cuCtxPushCurrent")
            try:
                yield
            finally:
                popped = c_void_p()
                self._cuCtxPopCurrent(byref(popped))

    # -- loading -------------------------------------------------------------
    def _load_module_function(self, device_index: int, image: bytes, symbol: str,
                              shared: int) -> int:
        with self.device_context(device_index):
            module = c_void_p()
            self.check(self._cuModuleLoadData(byref(module), image), "cuModuleLoadData")
            try:
                function = c_void_p()
                self.check(self._cuModuleGetFunction(byref(function), module,
                                                     symbol.encode()),
                           "cuModuleGetFunction", _LOAD_HINTS[CUDA_ERROR_NOT_FOUND]
                           + f" (symbol {symbol!r})")
                if shared > DEFAULT_MAX_DYNAMIC_SHARED:
                    rc = self._cuFuncSetAttribute(function,
                                                  CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                  shared)
                    if rc:
                        raise self.error("cuFuncSetAttribute", rc,
                                         self._shared_hint(device_index, shared))
            except BaseException:
                self._cuModuleUnload(module)
                raise
        self._modules.append((module.value or 0, image))
        return function.value or 0

    def _shared_hint(self, device_index: int, shared: int) -> str:
        limit = c_int()
        dev = c_int()
        if (self._cuDeviceGet(byref(dev), device_index) == CUDA_SUCCESS
                and self._cuDeviceGetAttribute(
                    byref(limit), CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                    dev.value) == CUDA_SUCCESS):
            return (f"the kernel needs {shared} bytes of shared memory, device {device_index} "
                    f"allows at most {limit.value} per block: the kernel variant does not fit "
                    "this GPU")
        return f"the kernel needs {shared} bytes of shared memory, more than this GPU allows"

    # -- launching -----------------------------------------------------------
    def recover_launch(self, code: int, device_index: int) -> bool:
        # A thread that never touched CUDA has no current context.
        if code != CUDA_ERROR_INVALID_CONTEXT:
            return False
        try:
            if self._current_context() != 0:
                return False
            self.check(self._cuCtxSetCurrent(self._primary_context(device_index)),
                       "cuCtxSetCurrent")
        except DriverError:
            return False
        return True
