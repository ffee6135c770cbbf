"""Launch precompiled Triton kernels: `Kernel`.

A `Kernel` holds one code object (cubin or HSACO) and its recorded launch
data. On the first launch on a device it loads the module through the driver
(`get_driver(backend)`), then every launch is one dict lookup and one call
into the native launcher (`_launch.launch`, a C extension that packs the
arguments and calls cuLaunchKernel / hipModuleLaunchKernel by address). If
the extension cannot be imported, a ctypes implementation of the same call
is used instead (about 10 us more per launch; warned once).

Triton (3.9) kernel ABI: the non-constexpr arguments in order, then two
trailing pointers (global scratch, profile scratch), passed here as NULL (the
build refuses kernels that need scratch). Block = num_warps * warp_size
threads (x only); dynamic shared memory = the recorded `shared` bytes.

Environment: AOTRITON_ROCM_LAUNCHER=native|ctypes forces one implementation
(default: native when importable).
"""

from __future__ import annotations

import ctypes
import hashlib
import operator
import os
import struct
import threading
import warnings
from ctypes import POINTER, c_int, c_uint, c_uint64, c_void_p
from typing import Callable, Dict, Optional, Sequence, Tuple

from ._base import DriverError

try:
    from . import _launch as _native
except ImportError as e:  # not built, or built for another platform
    _native = None
    _NATIVE_IMPORT_ERROR: Optional[str] = f"{type(e).__name__}: {e}"
else:
    _NATIVE_IMPORT_ERROR = None

__all__ = ["DriverError", "Kernel", "signature_for", "ctypes_launch", "native_launch",
           "native_available", "select_launch", "MAX_ARGS", "TYPE_CODES"]

# Triton type string -> signature code of the launcher (see _launch.c).
TYPE_CODES: Dict[str, str] = {
    "i1": "?", "u1": "?",
    "i8": "b", "u8": "B",
    "i16": "h", "u16": "H",
    "i32": "i", "u32": "I",
    "i64": "l", "u64": "L",
    "fp32": "f", "f32": "f",
    "fp64": "d",
}

_CODE_NAMES = {
    "p": "pointer", "z": "null pointer", "?": "i1", "b": "int8", "B": "uint8", "h": "int16",
    "H": "uint16", "i": "int32", "I": "uint32", "l": "int64", "L": "uint64", "f": "fp32",
    "d": "fp64",
}
_INT_RANGES = {
    "p": (0, 2**64 - 1), "?": (0, 1), "b": (-2**7, 2**7 - 1), "B": (0, 2**8 - 1),
    "h": (-2**15, 2**15 - 1), "H": (0, 2**16 - 1), "i": (-2**31, 2**31 - 1),
    "I": (0, 2**32 - 1), "l": (-2**63, 2**63 - 1), "L": (0, 2**64 - 1),
}

MAX_ARGS: int = _native.MAX_ARGS if _native is not None else 256

native_launch: Optional[Callable[..., int]] = _native.launch if _native is not None else None


def native_available() -> bool:
    """Whether the native launcher extension is importable."""
    return _native is not None


def signature_for(arg_types: Sequence[str], num_scratch: int = 2) -> bytes:
    """Launcher signature codes for a kernel's full argument type list (Triton
    type strings, the ``num_scratch`` trailing scratch pointers included):
    ``*...`` -> 'p', ints -> sized int codes, fp32 -> 'f', fp64 -> 'd'; the
    scratch pointers become 'z' (NULL, no Python argument)."""
    types = list(arg_types)
    if num_scratch < 0 or len(types) < num_scratch:
        raise ValueError(f"kernel argument list {types} has fewer than {num_scratch} "
                         "trailing scratch pointers")
    codes = []
    for i, t in enumerate(types):
        if not isinstance(t, str):
            raise TypeError(f"kernel argument type {i} must be a str, not {t!r}")
        scratch = i >= len(types) - num_scratch
        if t.startswith("*"):
            codes.append("z" if scratch else "p")
        elif scratch:
            raise ValueError(f"kernel argument {i} ({t}) should be a trailing scratch pointer: "
                             f"the argument list must end with {num_scratch} pointer types")
        elif t in TYPE_CODES:
            codes.append(TYPE_CODES[t])
        elif t == "constexpr":
            raise ValueError(f"kernel argument {i} is a constexpr: list only the kernel's "
                             "runtime parameters")
        else:
            raise ValueError(f"kernel argument {i} has type {t!r}, which the launcher does not "
                             f"support (supported: pointers, {', '.join(TYPE_CODES)})")
    if len(codes) > MAX_ARGS:
        raise ValueError(f"kernel has {len(codes)} parameters; the launcher supports at most "
                         f"{MAX_ARGS}")
    return "".join(codes).encode("ascii")


# -- ctypes fallback ------------------------------------------------------------------------

# cuLaunchKernel / hipModuleLaunchKernel
_LAUNCH_PROTO = ctypes.CFUNCTYPE(c_int, c_void_p, c_uint, c_uint, c_uint, c_uint, c_uint,
                                 c_uint, c_uint, c_void_p, POINTER(c_void_p),
                                 POINTER(c_void_p))
_launch_protos: Dict[int, Callable[..., int]] = {}


def _config_u32(value, what: str) -> int:
    if not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {value!r}")
    if not 0 <= value <= 0xFFFFFFFF:
        raise OverflowError(f"{what} must be in [0, 2**32), got {value!r}")
    return int(value)


def _config_ptr(value, what: str) -> int:
    if not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {value!r}")
    if not 0 <= value <= 2**64 - 1:
        raise OverflowError(f"{what} must be an address in [0, 2**64), got {value!r}")
    return int(value)


def _convert(code: str, value, index: int):
    name = _CODE_NAMES[code]
    if code in "fd":
        if type(value) is float:
            d = value
        elif isinstance(value, (str, bytes, bytearray)):
            raise TypeError(f"kernel argument {index} ({name}) must be a float, not {value!r}")
        else:
            try:
                d = float(value)
            except TypeError:
                raise TypeError(f"kernel argument {index} ({name}) must be a float, "
                                f"not {value!r}") from None
            except OverflowError:
                raise OverflowError(f"kernel argument {index} ({name}): {value!r} is out of "
                                    "range") from None
        if code == "f":
            try:
                struct.pack("=f", d)
            except OverflowError:
                raise OverflowError(f"kernel argument {index} ({name}): {value!r} is out of "
                                    "range") from None
        return d
    if code == "p" and value is None:
        return 0
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"kernel argument {index} ({name}) must be an int, "
                        f"not {value!r}") from None
    lo, hi = _INT_RANGES[code]
    if not lo <= v <= hi:
        raise OverflowError(f"kernel argument {index} ({name}): {value!r} is out of range")
    return v


# Whole-slot struct formats: the value in the slot's first bytes, zero padding
# after it (struct zeroes pad bytes); 'z' slots are all zero.
_SLOT_FORMATS = {
    "p": "Q", "z": "8x", "?": "B7x", "b": "b7x", "B": "B7x", "h": "h6x", "H": "H6x",
    "i": "i4x", "I": "I4x", "l": "q", "L": "Q", "f": "f4x", "d": "d",
}


class _Packer:
    """Per-signature packing state of the ctypes fallback: one struct for all
    slots, and per thread a slot buffer and the kernelParams array pointing
    into it (the driver copies the values during the launch call)."""

    __slots__ = ("signature", "codes", "n", "expected", "whole", "fast", "local")

    def __init__(self, signature: bytes):
        self.signature = signature
        self.codes = signature.decode("latin-1")
        self.n = len(signature)
        self.expected = self.n - self.codes.count("z")
        self.whole = struct.Struct("=" + "".join(_SLOT_FORMATS[c] for c in self.codes))
        # struct's own range check for '?' would be [0, 255]: check it by hand.
        self.fast = "?" not in self.codes
        self.local = threading.local()

    def buffers(self):
        try:
            return self.local.buffers
        except AttributeError:
            slots = (c_uint64 * max(self.n, 1))()
            params = None
            if self.n:
                base = ctypes.addressof(slots)
                params = (c_void_p * self.n)(*range(base, base + 8 * self.n, 8))
            self.local.buffers = (slots, params)
            return self.local.buffers

    def pack(self, slots, args: tuple) -> None:
        if self.fast:
            try:
                self.whole.pack_into(slots, 0, *args)
                return
            except (struct.error, TypeError, OverflowError, ValueError):
                pass  # None pointers, or an error to report precisely below
        k = 0
        for i, c in enumerate(self.codes):
            if c == "z":
                struct.pack_into("=Q", slots, 8 * i, 0)
                continue
            struct.pack_into("=" + _SLOT_FORMATS[c], slots, 8 * i, _convert(c, args[k], k))
            k += 1


_packers: Dict[bytes, _Packer] = {}


def _packer_for(signature) -> _Packer:
    if not isinstance(signature, bytes):
        raise TypeError(f"signature must be bytes, not {signature!r}")
    packer = _packers.get(signature)
    if packer is None:
        n = len(signature)
        if n > MAX_ARGS:
            raise ValueError(f"kernel has {n} parameters; the launcher supports at most "
                             f"{MAX_ARGS}")
        for pos, c in enumerate(signature.decode("latin-1")):
            if c not in _CODE_NAMES:
                raise ValueError(f"unknown kernel signature code {signature[pos:pos + 1]!r} "
                                 f"at position {pos}")
        packer = _packers.setdefault(signature, _Packer(signature))
    return packer


def ctypes_launch(launch_fn: int, function: int, grid_x: int, grid_y: int, grid_z: int,
                  block_x: int, block_y: int, block_z: int, shared: int, stream: int,
                  signature: bytes, args: tuple) -> int:
    """Pure-ctypes implementation of the native `launch` (same arguments,
    checks, errors and result); the fallback when the extension is missing."""
    launch_fn = _config_ptr(launch_fn, "launch_fn")
    function = _config_ptr(function, "function")
    dims = [_config_u32(v, w) for v, w in ((grid_x, "grid_x"), (grid_y, "grid_y"),
                                           (grid_z, "grid_z"), (block_x, "block_x"),
                                           (block_y, "block_y"), (block_z, "block_z"),
                                           (shared, "shared"))]
    stream = _config_ptr(stream, "stream")
    if launch_fn == 0:
        raise ValueError("launch_fn is NULL")
    if function == 0:
        raise ValueError("function handle is NULL")
    packer = _packer_for(signature)
    if not isinstance(args, tuple):
        raise TypeError(f"args must be a tuple, not {args!r}")
    if len(args) != packer.expected:
        raise TypeError(f"kernel takes {packer.expected} arguments ({len(args)} given)")
    slots, params = packer.buffers()
    packer.pack(slots, args)
    if 0 in dims[:3]:
        return 0
    proto = _launch_protos.get(launch_fn)
    if proto is None:
        proto = _launch_protos.setdefault(launch_fn, _LAUNCH_PROTO(launch_fn))
    return proto(function, *dims, stream or None, params, None)


# -- implementation choice ------------------------------------------------------------------

_warned_fallback = False
_warn_lock = threading.Lock()


def select_launch() -> Callable[..., int]:
    """The launch implementation to use: native unless unavailable or
    AOTRITON_ROCM_LAUNCHER=ctypes. Warns once when falling back."""
    global _warned_fallback
    choice = os.environ.get("AOTRITON_ROCM_LAUNCHER", "").strip().lower()
    if choice not in ("", "auto", "native", "ctypes"):
        raise ValueError(f"AOTRITON_ROCM_LAUNCHER={choice!r}: use 'native' or 'ctypes'")
    if choice == "ctypes":
        return ctypes_launch
    if native_launch is not None:
        return native_launch
    if choice == "native":
        raise ImportError("AOTRITON_ROCM_LAUNCHER=native but the native launcher "
                          f"aotriton_rocm.driver._launch cannot be imported "
                          f"({_NATIVE_IMPORT_ERROR})")
    with _warn_lock:
        if not _warned_fallback:
            _warned_fallback = True
            warnings.warn(
                "aotriton_rocm: the native kernel launcher (aotriton_rocm.driver._launch) "
                f"cannot be imported ({_NATIVE_IMPORT_ERROR}); using the ctypes fallback, "
                "which adds about 10 microseconds per kernel launch. Reinstall aotriton-rocm "
                "from a wheel for this platform to get it back.", RuntimeWarning, stacklevel=3)
    return ctypes_launch


# -- Kernel ---------------------------------------------------------------------------------

def _normalize_backend(backend: str) -> str:
    b = str(backend).lower()
    if b in ("hip", "rocm", "amd"):
        return "hip"
    if b in ("cuda", "nvidia"):
        return "cuda"
    raise ValueError(f"unknown backend {backend!r}: 'hip' (AMD ROCm) or 'cuda' (NVIDIA)")


class Kernel:
    """One compiled kernel, launchable on any device of its backend.

    ``Kernel(backend, code_object, symbol, num_warps, warp_size, shared,
    arg_types)``: ``code_object`` the cubin/HSACO bytes, ``symbol`` the kernel
    function name in it, ``shared`` the dynamic shared memory bytes,
    ``arg_types`` the full Triton type list including the trailing scratch
    pointers. ``sha256`` (hex) of the code object identifies it in the
    driver's per-device cache (computed when not given). ``driver`` and
    ``launch_impl`` replace the backend's driver / the launch implementation
    (tests, benchmarks).
    """

    __slots__ = ("backend", "symbol", "num_warps", "warp_size", "shared", "arg_types",
                 "signature", "num_args", "block", "name", "num_scratch", "_code_object",
                 "_sha256", "_driver", "_launch_impl", "_per_device")

    def __init__(self, backend: str, code_object: bytes, symbol: str, num_warps: int,
                 warp_size: int, shared: int, arg_types: Sequence[str], *,
                 sha256: Optional[str] = None, name: Optional[str] = None,
                 num_scratch: int = 2, driver=None,
                 launch_impl: Optional[Callable[..., int]] = None):
        self.backend = _normalize_backend(backend)
        if not isinstance(code_object, (bytes, bytearray, memoryview)) or not len(code_object):
            raise ValueError("code_object must be non-empty bytes")
        if not isinstance(symbol, str) or not symbol:
            raise ValueError(f"symbol must be a non-empty str, not {symbol!r}")
        for what, v in (("num_warps", num_warps), ("warp_size", warp_size), ("shared", shared)):
            if not isinstance(v, int) or isinstance(v, bool):
                raise TypeError(f"{what} must be an int, not {v!r}")
        if num_warps < 1:
            raise ValueError(f"num_warps must be >= 1, not {num_warps}")
        allowed = (32,) if self.backend == "cuda" else (32, 64)
        if warp_size not in allowed:
            raise ValueError(f"warp_size {warp_size} is not valid for backend {self.backend} "
                             f"(allowed: {allowed})")
        if num_warps * warp_size > 1024:
            raise ValueError(f"block of {num_warps} warps x {warp_size} threads exceeds 1024")
        if not 0 <= shared <= 0xFFFFFFFF:
            raise ValueError(f"shared must be in [0, 2**32), not {shared}")
        self._code_object = bytes(code_object)
        self.symbol = symbol
        self.num_warps = num_warps
        self.warp_size = warp_size
        self.shared = shared
        self.arg_types = tuple(arg_types)
        self.num_scratch = num_scratch
        self.signature = signature_for(self.arg_types, num_scratch)
        self.num_args = len(self.signature) - self.signature.count(b"z")
        self.block = (num_warps * warp_size, 1, 1)
        self.name = name or symbol
        self._sha256 = sha256
        self._driver = driver
        self._launch_impl = launch_impl
        # device index -> (impl, launch_fn, function, block_x, shared, signature)
        self._per_device: Dict[int, Tuple] = {}

    @property
    def code_object(self) -> bytes:
        return self._code_object

    @property
    def sha256(self) -> str:
        if self._sha256 is None:
            self._sha256 = hashlib.sha256(self._code_object).hexdigest()
        return self._sha256

    @property
    def driver(self):
        if self._driver is None:
            from . import get_driver

            self._driver = get_driver(self.backend)
        return self._driver

    def __repr__(self) -> str:
        return (f"Kernel({self.name!r}, backend={self.backend!r}, num_warps={self.num_warps}, "
                f"warp_size={self.warp_size}, shared={self.shared}, "
                f"signature={self.signature.decode()!r})")

    def load(self, device_index: int) -> int:
        """Load the code object on device ``device_index`` now (normally done
        by the first launch there); returns the function handle."""
        return self._prepare(device_index)[2]

    def _prepare(self, device_index: int) -> Tuple:
        entry = self._per_device.get(device_index)
        if entry is not None:
            return entry
        if not isinstance(device_index, int) or isinstance(device_index, bool) \
                or device_index < 0:
            raise ValueError(f"device_index must be an int >= 0, not {device_index!r}")
        impl = self._launch_impl or select_launch()
        driver = self.driver
        function = driver.load_function(device_index, self._code_object, self.symbol,
                                        self.shared, self.sha256)
        entry = (impl, driver.launch_fn, function, self.block[0], self.shared, self.signature)
        self._per_device[device_index] = entry
        return entry

    def launch(self, grid, stream: int, device_index: int, *args) -> None:
        """Launch on ``grid`` (up to 3 ints, in blocks) on ``stream`` (the raw
        stream handle as int, e.g. torch.cuda.current_stream().cuda_stream),
        on device ``device_index`` (whose context/device must be current, as
        under torch.cuda.device(device_index)). ``args``: the kernel's
        non-scratch arguments in order (data_ptr() ints, ints, floats)."""
        try:
            impl, launch_fn, function, block_x, shared, signature = \
                self._per_device[device_index]
        except KeyError:
            impl, launch_fn, function, block_x, shared, signature = \
                self._prepare(device_index)
        try:
            gx, gy, gz = grid
        except (TypeError, ValueError):
            gx, gy, gz = _grid3(grid)
        rc = impl(launch_fn, function, gx, gy, gz, block_x, 1, 1, shared, stream, signature,
                  args)
        if rc:
            self._launch_failed(rc, (gx, gy, gz), stream, device_index, args)

    def _launch_failed(self, rc: int, grid: Tuple[int, int, int], stream: int,
                       device_index: int, args: tuple) -> None:
        impl, launch_fn, function, block_x, shared, signature = self._per_device[device_index]
        driver = self.driver
        if driver.recover_launch(rc, device_index):
            rc = impl(launch_fn, function, *grid, block_x, 1, 1, shared, stream, signature, args)
            if not rc:
                return
        raise driver.launch_error(
            rc, device_index=device_index,
            what=f"{self.name} grid={grid} block={self.block} shared={shared} stream={stream:#x}")


def _grid3(grid) -> Tuple[int, int, int]:
    if isinstance(grid, int):
        return (grid, 1, 1)
    g = tuple(grid)
    if not 1 <= len(g) <= 3:
        raise ValueError(f"grid must have 1 to 3 dimensions, not {grid!r}")
    return (g + (1, 1))[:3]  # type: ignore[return-value]

