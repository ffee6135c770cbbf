"""HIP runtime (libamdhip64) through ctypes: the AMD ROCm backend.

The library is the one the process already uses (ROCm torch loads its own
copy): found in /proc/self/maps first, then by name. Two HIP runtimes in one
process would not share streams, memory or modules.

Prototypes mirrored from hip_runtime_api.h (hipError_t is an int enum;
hipModule_t, hipFunction_t, hipStream_t are pointers):

    hipError_t hipInit(unsigned int flags);
    const char *hipGetErrorName(hipError_t hip_error);
    const char *hipGetErrorString(hipError_t hipError);
    hipError_t hipGetDevice(int *deviceId);
    hipError_t hipSetDevice(int deviceId);
    hipError_t hipModuleLoadData(hipModule_t *module, const void *image);
    hipError_t hipModuleUnload(hipModule_t module);
    hipError_t hipModuleGetFunction(hipFunction_t *function, hipModule_t module,
                                    const char *kname);
    hipError_t hipModuleLaunchKernel(hipFunction_t f, unsigned int gridDimX,
                                     unsigned int gridDimY, unsigned int gridDimZ,
                                     unsigned int blockDimX, unsigned int blockDimY,
                                     unsigned int blockDimZ, unsigned int sharedMemBytes,
                                     hipStream_t stream, void **kernelParams, void **extra);

hipModuleLaunchKernel itself is called from the native launcher (by address).
Modules are loaded on the current device: loading for another device switches
with hipSetDevice and switches back.
"""

from __future__ import annotations

from ctypes import POINTER, byref, c_char_p, c_int, c_uint, c_void_p
from typing import Tuple

from ._base import Driver, bind, function_address, mapped_library, open_library

CANDIDATES = ("libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6")

hipSuccess = 0
hipErrorInvalidValue = 1
hipErrorInsufficientDriver = 35
hipErrorInvalidDeviceFunction = 98
hipErrorNoDevice = 100
hipErrorInvalidDevice = 101
hipErrorInvalidImage = 200
hipErrorInvalidContext = 201
hipErrorNoBinaryForGpu = 209
hipErrorSharedObjectInitFailed = 303
hipErrorInvalidHandle = 400
hipErrorNotFound = 500
hipErrorIllegalAddress = 700
hipErrorLaunchOutOfResources = 701
hipErrorLaunchFailure = 719

_NO_RUNTIME_HINT = (
    "The HIP backend needs an AMD GPU and the HIP runtime a ROCm build of torch brings "
    "(import torch first), or ROCm's lib directory on LD_LIBRARY_PATH. On a machine without "
    "one, use the CPU (interpreter) backend; on an NVIDIA machine the backend is 'cuda'")

_LOAD_HINTS = {
    hipErrorNoBinaryForGpu: (
        "the code object was compiled for another GPU architecture: install the image wheel "
        "for this GPU's gfx arch (see `aotriton-rocm info`)"),
    hipErrorInvalidImage: (
        "the code object is not a valid HSACO for this runtime: the archive may be damaged, "
        "built for another arch or code object version; reinstall the image wheel"),
    hipErrorSharedObjectInitFailed: (
        "the runtime could not load the code object: it may target another arch or need a "
        "newer ROCm"),
    hipErrorNotFound: (
        "the kernel symbol is not in the code object: the archive's manifest does not match "
        "its code objects; reinstall the image wheel"),
    hipErrorInvalidDevice: (
        "no such device index (check HIP_VISIBLE_DEVICES and torch.cuda.device_count())"),
    hipErrorNoDevice: _NO_RUNTIME_HINT,
    hipErrorInsufficientDriver: "the amdgpu kernel driver is too old for this ROCm runtime",
}

_LAUNCH_HINTS = {
    hipErrorInvalidValue: (
        "invalid launch configuration (block above 1024 threads, or shared memory above the "
        "LDS per workgroup: 64 KiB, 160 KiB on gfx950)"),
    hipErrorInvalidDeviceFunction: (
        "the function does not belong to the stream's device or this GPU's arch: launch under "
        "torch.cuda.device(index) with that device's current stream"),
    hipErrorInvalidHandle: (
        "the stream or function belongs to another device: launch under "
        "torch.cuda.device(index) with that device's current stream"),
    hipErrorLaunchOutOfResources: (
        "the kernel needs more registers or LDS than the GPU offers for this block size: the "
        "kernel variant does not fit this GPU"),
    hipErrorIllegalAddress: (
        "a kernel accessed invalid memory; the HIP context is now unusable, restart the "
        "process. Please report it with the shapes, dtypes and strides used"),
    hipErrorLaunchFailure: "a kernel failed; restart the process",
}


class HipDriver(Driver):
    backend = "hip"

    def __init__(self) -> None:
        super().__init__()
        candidates = list(CANDIDATES)
        mapped = mapped_library("libamdhip64")
        if mapped:
            candidates.insert(0, mapped)
        lib, self.library = open_library(candidates, backend="hip",
                                         what="HIP runtime library", hint=_NO_RUNTIME_HINT)
        self._lib = lib

        def f(name, *argtypes):
            return bind(lib, self.library, "hip", name, c_int, list(argtypes))

        self._hipInit = f("hipInit", c_uint)
        self._hipGetErrorName = bind(lib, self.library, "hip", "hipGetErrorName", c_char_p,
                                     [c_int])
        self._hipGetErrorString = bind(lib, self.library, "hip", "hipGetErrorString", c_char_p,
                                       [c_int])
        self._hipGetDevice = f("hipGetDevice", POINTER(c_int))
        self._hipSetDevice = f("hipSetDevice", c_int)
        self._hipModuleLoadData = f("hipModuleLoadData", POINTER(c_void_p), c_char_p)
        self._hipModuleUnload = f("hipModuleUnload", c_void_p)
        self._hipModuleGetFunction = f("hipModuleGetFunction", POINTER(c_void_p), c_void_p,
                                       c_char_p)
        launch = f("hipModuleLaunchKernel", c_void_p, c_uint, c_uint, c_uint, c_uint, c_uint,
                   c_uint, c_uint, c_void_p, POINTER(c_void_p), POINTER(c_void_p))
        self.launch_fn = function_address(launch)

        self.check(self._hipInit(0), "hipInit")

    # -- errors --------------------------------------------------------------
    def error_name_and_string(self, code: int) -> Tuple[str, str]:
        name = self._hipGetErrorName(code)
        text = self._hipGetErrorString(code)
        return ((name or b"hipErrorUnknown").decode(errors="replace"),
                (text or b"no description").decode(errors="replace"))

    def hint_for(self, function: str, code: int) -> str:
        if function == "hipModuleLaunchKernel":
            return _LAUNCH_HINTS.get(code, "")
        if function == "hipInit":
            return _LOAD_HINTS.get(code, _NO_RUNTIME_HINT)
        return _LOAD_HINTS.get(code, "")

    # -- loading -------------------------------------------------------------
    def _load_module_function(self, device_index: int, image: bytes, symbol: str,
                              shared: int) -> int:
        # No shared memory opt-in on HIP: dynamic LDS up to the hardware limit
        # is accepted at launch.
        current = c_int()
        self.check(self._hipGetDevice(byref(current)), "hipGetDevice")
        switched = current.value != device_index
        if switched:
            self.check(self._hipSetDevice(device_index), "hipSetDevice")
        try:
            module = c_void_p()
            self.check(self._hipModuleLoadData(byref(module), image), "hipModuleLoadData")
            function = c_void_p()
            rc = self._hipModuleGetFunction(byref(function), module, symbol.encode())
            if rc:
                self._hipModuleUnload(module)
                raise self.error("hipModuleGetFunction", rc,
                                 _LOAD_HINTS[hipErrorNotFound] + f" (symbol {symbol!r})")
        finally:
            if switched:
                self._hipSetDevice(current.value)
        self._modules.append((module.value or 0, image))
        return function.value or 0

