"""ctypes view of libaotriton_rocm, the native core (native/include/aotriton_rocm/aotriton_rocm.h).

Runtime module: standard library at import time; torch only in
:func:`tensor_view`. The library is found at ``AOTRITON_ROCM_NATIVE_LIB``, in this package
(``aotriton_rocm/lib/``, wheels) or in ``<sys.prefix>/lib`` (conda); nothing is
loaded on import.
"""

from __future__ import annotations

import ctypes
import os
import re
import threading
from ctypes import POINTER, c_char_p, c_double, c_float, c_int32, c_int64, c_size_t, c_uint32, c_uint64, c_void_p
from pathlib import Path

from ..common.paths import install_root
from .._version import ABI_VERSION

__all__ = ["ENV_VAR", "NativeError", "library", "library_path", "Tensor", "Problem", "FwdParams",
           "BwdParams", "KvcacheParams", "DropoutUniformParams", "RuntimeOptions", "Runtime", "OK",
           "UNSUPPORTED", "NEEDS_LAYOUT", "refusal",
           "BACKEND_AUTO", "BACKEND_HIP", "BACKEND_CUDA", "BACKEND_HOST", "HOST_LAUNCH", "DTYPES"]

ENV_VAR = "AOTRITON_ROCM_NATIVE_LIB"
SONAME = f"libaotriton_rocm.so.{ABI_VERSION}"

OK, INVALID_ARGUMENT, UNSUPPORTED, NEEDS_LAYOUT = 0, 1, 2, 3
BACKEND_AUTO, BACKEND_HIP, BACKEND_CUDA, BACKEND_HOST = 0, 1, 2, 3
NEED_BACKWARD, NEED_DEBUG_MASK, NEED_DQ_ACCUM = 1, 2, 4
CAUSAL_BOTTOM_RIGHT, CAUSAL_TOP_LEFT = 0, 1
# aotr_dtype by torch dtype name
DTYPES = {"float16": 1, "bfloat16": 2, "float32": 3, "int32": 4, "int64": 5, "uint64": 5}
MAX_RANK = 4
INT32_MAX = 2**31 - 1


class NativeError(RuntimeError):
    """A libaotriton_rocm call failed; ``status`` is its aotr_status."""

    def __init__(self, status: int, name: str, message: str):
        super().__init__(f"{name}: {message}" if message else name)
        self.status = status
        self.name = name
        self.message = message


class Tensor(ctypes.Structure):
    _fields_ = [("data", c_void_p), ("dtype", c_int32), ("rank", c_int32),
                ("sizes", c_int64 * MAX_RANK), ("strides", c_int64 * MAX_RANK)]


class Problem(ctypes.Structure):
    _fields_ = [("q", Tensor), ("k", Tensor), ("v", Tensor), ("cu_seqlens_q", Tensor),
                ("cu_seqlens_k", Tensor), ("max_seqlen_q", c_int32), ("max_seqlen_k", c_int32),
                ("bias", Tensor), ("scale", c_float), ("dropout_p", c_float),
                ("philox_seed", Tensor), ("philox_offset", Tensor), ("causal", c_int32),
                ("causal_alignment", c_int32), ("window_left", c_int32), ("window_right", c_int32)]


class FwdParams(ctypes.Structure):
    _fields_ = [("struct_size", c_uint32), ("device", c_int32), ("stream", c_void_p),
                ("problem", Problem), ("out", Tensor), ("lse", Tensor), ("debug_mask", Tensor),
                # appended in 0.1: flash-attn's softcap and ALiBi slopes
                ("softcap", c_float), ("alibi_slopes", Tensor),
                # appended in 0.1: sequences placed apart from cu_seqlens
                ("seq_starts_q", Tensor), ("seq_starts_k", Tensor), ("seqlens_k", Tensor)]


class BwdParams(ctypes.Structure):
    _fields_ = [("struct_size", c_uint32), ("device", c_int32), ("stream", c_void_p),
                ("problem", Problem), ("out", Tensor), ("lse", Tensor), ("grad_out", Tensor),
                ("grad_q", Tensor), ("grad_k", Tensor), ("grad_v", Tensor),
                ("grad_bias", Tensor), ("delta", Tensor),
                # appended in 0.1: the forward's softcap and ALiBi slopes
                ("softcap", c_float), ("alibi_slopes", Tensor),
                # appended in 0.1: the fused backward's fp32 dQ workspace (optional)
                ("grad_q_accum", Tensor),
                # appended in 0.1: the forward's sequence layout
                ("seq_starts_q", Tensor), ("seq_starts_k", Tensor), ("seqlens_k", Tensor)]


class KvcacheParams(ctypes.Structure):
    """aotr_attn_kvcache_params (attention over a KV cache)."""
    _fields_ = [("struct_size", c_uint32), ("device", c_int32), ("stream", c_void_p),
                ("q", Tensor), ("cu_seqlens_q", Tensor), ("max_seqlen_q", c_int32),
                ("k_cache", Tensor), ("v_cache", Tensor), ("k_end", Tensor), ("k_start", Tensor),
                ("cache_batch_idx", Tensor), ("block_table", Tensor), ("alibi_slopes", Tensor),
                ("scale", c_float), ("softcap", c_float), ("causal", c_int32),
                ("window_left", c_int32), ("window_right", c_int32), ("num_splits", c_int32),
                ("out", Tensor), ("lse", Tensor), ("out_partial", Tensor),
                ("lse_partial", Tensor)]
class DropoutUniformParams(ctypes.Structure):
    _fields_ = [("struct_size", c_uint32), ("device", c_int32), ("stream", c_void_p),
                ("out", Tensor), ("philox_seed", Tensor), ("philox_offset", Tensor),
                ("dropout_p", c_float), ("encode_keep", c_int32)]


# aotr_host_launch_fn: (user, record key, grid[3], one word per argument, count) -> 0 if it ran
HOST_LAUNCH = ctypes.CFUNCTYPE(c_int32, c_void_p, c_char_p, POINTER(c_uint32), POINTER(c_uint64),
                               c_size_t)


class RuntimeOptions(ctypes.Structure):
    _fields_ = [("struct_size", c_uint32), ("archive_dir", c_char_p),
                ("driver_library", c_char_p), ("backend", c_int32),
                ("host_index", c_char_p), ("host_index_size", c_size_t),
                ("host_launch", HOST_LAUNCH), ("host_user", c_void_p),
                ("host_compute_units", c_int32)]


_lock = threading.Lock()
_lib = None


def library_path() -> Path:
    """``AOTRITON_ROCM_NATIVE_LIB``, else the installed library: the package's
    ``lib/`` (wheel), else ``<sys.prefix>/lib`` (conda; see :mod:`.paths`)."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env)
    return install_root() / "lib" / SONAME


def _declare(lib: ctypes.CDLL) -> None:
    def f(name, restype, *argtypes):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, list(argtypes)

    f("aotr_last_error", c_char_p)
    f("aotr_status_name", c_char_p, c_int32)
    f("aotr_version", c_char_p)
    f("aotr_abi_line", c_char_p)
    f("aotr_layout_ok", c_int32, POINTER(Tensor))
    f("aotr_archive_open", c_int32, c_char_p, POINTER(c_void_p))
    f("aotr_archive_close", None, c_void_p)
    f("aotr_archive_verify", c_int32, c_void_p)
    f("aotr_archive_kernel_count", c_size_t, c_void_p)
    f("aotr_runtime_create", c_int32, POINTER(RuntimeOptions), POINTER(c_void_p))
    f("aotr_runtime_destroy", None, c_void_p)
    f("aotr_runtime_add_archive", c_int32, c_void_p, c_char_p)
    f("aotr_runtime_device_arch", c_int32, c_void_p, c_int32, c_char_p, c_size_t)
    f("aotr_runtime_launch_count", c_uint64, c_void_p, c_char_p)
    f("aotr_attn_check", c_int32, POINTER(Problem))
    f("aotr_attn_window", None, c_int64, c_int64, c_int32, c_int64, POINTER(c_int32))
    f("aotr_attn_default_scale", c_double, c_int64)
    f("aotr_attn_supported", c_int32, c_void_p, c_int32, POINTER(Problem), c_uint32)
    f("aotr_attn_fwd", c_int32, c_void_p, POINTER(FwdParams))
    f("aotr_attn_bwd", c_int32, c_void_p, POINTER(BwdParams))
    f("aotr_varlen_rows", c_int32, c_void_p, c_int32, c_void_p, POINTER(Problem),
      POINTER(c_int64), POINTER(c_int64))
    f("aotr_attn_fwd_kvcache_splits", c_int32, c_void_p, POINTER(KvcacheParams), POINTER(c_int32))
    f("aotr_attn_fwd_kvcache", c_int32, c_void_p, POINTER(KvcacheParams))
    if hasattr(lib, "aotr_dropout_uniform"):  # absent from older builds
        f("aotr_dropout_uniform", c_int32, c_void_p, POINTER(DropoutUniformParams))


def attn_window(left: int | None, right: int | None, causal: bool,
                seqlen_k: int) -> tuple[int, int]:
    """The window sides the kernels run with, from libaotriton_rocm's
    ``aotr_attn_window`` (flash-attn's rule, kept in that one place): None,
    a negative size or one >= ``seqlen_k`` is unbounded, -1; causal sets the
    right side to 0."""
    out = (c_int32 * 2)()
    sides = (-1 if w is None else max(-1, min(int(w), _INT64_MAX)) for w in (left, right))
    library().aotr_attn_window(*sides, int(bool(causal)), max(0, min(int(seqlen_k), _INT64_MAX)),
                               out)
    return out[0], out[1]


# A pure function of ints: torch.compile runs it while tracing and keeps the
# result as a constant (what torch._dynamo.assume_constant_result marks),
# rather than breaking the graph at the ctypes call.
attn_window._dynamo_marked_constant = True
_INT64_MAX = 2**63 - 1


def default_scale(head_dim: int) -> float:
    """The softmax scale of a call that gives none, from libaotriton_rocm's
    ``aotr_attn_default_scale`` (1/sqrt(head_dim), in that one place)."""
    return library().aotr_attn_default_scale(max(-1, min(int(head_dim), _INT64_MAX)))


default_scale._dynamo_marked_constant = True  # as attn_window's


def library() -> ctypes.CDLL:
    """The loaded library (once); OSError with the path tried when it is missing."""
    global _lib
    with _lock:
        if _lib is None:
            path = library_path()
            try:
                lib = ctypes.CDLL(str(path))
            except OSError as e:
                raise OSError(f"cannot load {path}: {e}. Reinstall aotriton-rocm, or point "
                              f"{ENV_VAR} at a built libaotriton_rocm") from None
            _declare(lib)
            line = lib.aotr_abi_line().decode()
            if line != ABI_VERSION:
                raise OSError(f"{path} is ABI line {line}, this package is {ABI_VERSION}: "
                              "install matching versions")
            _lib = lib
        return _lib


def error(status: int) -> NativeError:
    lib = library()
    return NativeError(status, lib.aotr_status_name(status).decode(),
                       lib.aotr_last_error().decode(errors="replace"))


def refusal(exc: NativeError) -> str | None:
    """The reason libaotriton_rocm gave for refusing a request (a call it
    judged out of its rules launches nothing), without the C function's
    name; None for any other failure."""
    if exc.status not in (UNSUPPORTED, INVALID_ARGUMENT):
        return None
    return re.sub(r"^aotr_\w+: ", "", exc.message or exc.args[0])


def check(status: int) -> None:
    if status != OK:
        raise error(status)


_DTYPE_CODES: dict = {}


def dtype_code(dtype) -> int:
    """libaotriton_rocm's code of a torch dtype (0: none)."""
    code = _DTYPE_CODES.get(dtype)
    if code is None:
        code = _DTYPE_CODES[dtype] = DTYPES.get(str(dtype).replace("torch.", ""), 0)
    return code


def verify_archive(path: "str | os.PathLike[str]") -> int:
    """Open and fully verify an archive with the C reader (identity, index,
    every code object); returns its kernel count, NativeError otherwise."""
    lib = library()
    handle = c_void_p()
    check(lib.aotr_archive_open(os.fsencode(path), ctypes.byref(handle)))
    try:
        check(lib.aotr_archive_verify(handle))
        return lib.aotr_archive_kernel_count(handle)
    finally:
        lib.aotr_archive_close(handle)


def tensor_view(t, code: int | None = None) -> Tensor:
    """The aotr_tensor of a torch tensor (None: an absent tensor)."""
    view = Tensor()
    if t is None:
        return view
    rank = t.dim()
    if rank > MAX_RANK:
        raise ValueError(f"rank {rank} is above {MAX_RANK}")
    view.data = t.data_ptr()
    view.dtype = dtype_code(t.dtype) if code is None else code
    view.rank = rank
    view.sizes[:rank] = t.shape
    view.strides[:rank] = t.stride()
    return view


class Runtime:
    """An aotr_runtime (destroyed with the object)."""

    def __init__(self, *, archive_dir: str | None = None, driver_library: str | None = None,
                 backend: int = BACKEND_AUTO, options: RuntimeOptions | None = None):
        lib = library()
        opts = options or RuntimeOptions(ctypes.sizeof(RuntimeOptions),
                                         archive_dir.encode() if archive_dir else None,
                                         driver_library.encode() if driver_library else None,
                                         backend)
        handle = c_void_p()
        check(lib.aotr_runtime_create(ctypes.byref(opts), ctypes.byref(handle)))
        self._lib, self.handle = lib, handle

    @classmethod
    def host(cls, index: bytes, launch, compute_units: int) -> "Runtime":
        """A runtime on the host backend: ``index`` holds the kernel records
        (JSON), ``launch`` (a :data:`HOST_LAUNCH`) runs each planned launch;
        device 0 is the host."""
        opts = RuntimeOptions(struct_size=ctypes.sizeof(RuntimeOptions), backend=BACKEND_HOST,
                              host_index=index, host_index_size=len(index), host_launch=launch,
                              host_compute_units=compute_units)
        runtime = cls(options=opts)
        runtime._keep = launch  # the callback must outlive the runtime
        return runtime

    def __del__(self):
        handle = getattr(self, "handle", None)
        if handle:
            self._lib.aotr_runtime_destroy(handle)
            self.handle = None

    def add_archive(self, path: "str | os.PathLike[str]") -> None:
        check(self._lib.aotr_runtime_add_archive(self.handle, os.fsencode(path)))

    def device_arch(self, device: int) -> str:
        buf = ctypes.create_string_buffer(64)
        check(self._lib.aotr_runtime_device_arch(self.handle, device, buf, len(buf)))
        return buf.value.decode()

    def launch_count(self, kernel: str | None = None) -> int:
        return self._lib.aotr_runtime_launch_count(self.handle, kernel.encode() if kernel else None)

    def supported(self, device: int, problem: Problem, needs: int = NEED_BACKWARD) -> int:
        return self._lib.aotr_attn_supported(self.handle, device, ctypes.byref(problem), needs)

    def fwd(self, params: FwdParams) -> int:
        params.struct_size = ctypes.sizeof(FwdParams)
        return self._lib.aotr_attn_fwd(self.handle, ctypes.byref(params))

    def bwd(self, params: BwdParams) -> int:
        params.struct_size = ctypes.sizeof(BwdParams)
        return self._lib.aotr_attn_bwd(self.handle, ctypes.byref(params))

    def varlen_rows(self, device: int, stream: int, problem: Problem) -> tuple[int, int] | None:
        """The packed rows (q, k) a variable-length problem's offsets cover,
        checked (``aotr_varlen_rows``: NativeError names a broken rule); None
        while ``stream`` is being captured (nothing is read then)."""
        rows_q, rows_k = c_int64(), c_int64()
        check(self._lib.aotr_varlen_rows(self.handle, device, stream, ctypes.byref(problem),
                                         ctypes.byref(rows_q), ctypes.byref(rows_k)))
        return None if rows_q.value < 0 else (rows_q.value, rows_k.value)

    def kvcache_splits(self, params: KvcacheParams) -> int:
        """The split count aotr_attn_fwd_kvcache will use (NativeError if refused)."""
        params.struct_size = ctypes.sizeof(KvcacheParams)
        n = c_int32()
        check(self._lib.aotr_attn_fwd_kvcache_splits(self.handle, ctypes.byref(params),
                                                     ctypes.byref(n)))
        return n.value

    def fwd_kvcache(self, params: KvcacheParams) -> int:
        params.struct_size = ctypes.sizeof(KvcacheParams)
        return self._lib.aotr_attn_fwd_kvcache(self.handle, ctypes.byref(params))

    def dropout_uniform(self, params: DropoutUniformParams) -> int:
        params.struct_size = ctypes.sizeof(DropoutUniformParams)
        return self._lib.aotr_dropout_uniform(self.handle, ctypes.byref(params))


def make_problem(q, k, v, *, scale: float, causal: bool = False, bottom_right: bool = True,
                 window: tuple[int, int] = (-1, -1), bias=None, dropout_p: float = 0.0,
                 rng=None, cu_seqlens=None, max_seqlens=(0, 0)) -> Problem:
    """An aotr_attn_problem of torch tensors: (B, H, S, D) q/k/v, or packed
    (total, H, D) with ``cu_seqlens = (cu_q, cu_k)``; ``rng`` the Philox
    (seed, offset) int64 device scalars; ``bias`` a (B, H, Sq, Sk) view."""
    p = Problem()
    p.q, p.k, p.v = tensor_view(q), tensor_view(k), tensor_view(v)
    if cu_seqlens is not None:
        p.cu_seqlens_q, p.cu_seqlens_k = (tensor_view(t) for t in cu_seqlens)
        p.max_seqlen_q, p.max_seqlen_k = max_seqlens
    if bias is not None:
        p.bias = tensor_view(bias)
    p.scale = scale
    p.dropout_p = dropout_p
    if rng is not None:
        p.philox_seed, p.philox_offset = (tensor_view(t, DTYPES["int64"]) for t in rng)
    p.causal = int(causal)
    p.causal_alignment = CAUSAL_BOTTOM_RIGHT if bottom_right else CAUSAL_TOP_LEFT
    p.window_left, p.window_right = window_sides(window)
    return p


def window_sides(window) -> tuple[int, int]:
    """flash-attn's window sides as the C structs take them: as given (None:
    -1), saturated to int32 (sides that large either way are unbounded);
    ``aotr_attn_window`` applies the rule."""
    left, right = (-1 if w is None else max(-INT32_MAX - 1, min(int(w), INT32_MAX))
                   for w in window)
    return left, right
