"""The torch fast path for torch >= 2.10: ``libaotriton_rocm_torch.so``
(native/torch/), the six attention ops of :mod:`.torch_integration` as C++
kernels on torch's stable ABI, launching through libaotriton_rocm.

Loading the library registers nothing. :func:`activate` registers, for each
op, ``aotriton_rocm::py_<op>`` (the op's schema, kernel: the Python route)
and then the C++ kernels on the op; the C++ kernels hand every call they do
not cover (dropout, debug masks, attention biases, anything libaotriton_rocm
reports unsupported, errors) to that op. :func:`deactivate` removes both.
``enable()`` activates the aten ops and ours; without it, the first GPU call
of one of our operators activates ours alone (flash_attn_ops.py).

The library leaves libtorch's symbols undefined: :func:`load` makes the
libtorch_cpu that ``import torch`` loaded global first, so one binary serves
CUDA, ROCm and CPU builds of torch.
"""

from __future__ import annotations

import ctypes
import os
import threading
from ctypes import POINTER, c_char_p, c_int, c_int32, c_int64, c_uint32, c_uint64
from pathlib import Path
from typing import Callable, Mapping, Sequence

from .device import arch_of
from ..common.images import find_archive, find_archives
from .native import BACKEND_AUTO, RuntimeOptions
from ..common.operator_schemas import FLASH_ATTN_BACKWARD, FLASH_ATTN_FORWARD, FLASH_ATTN_KVCACHE
from ..common.paths import install_root
from ..common.trace import span

ENV_VAR = "AOTRITON_ROCM_TORCH_LIB"
# "0" keeps every call on the Python route (ctypes into libaotriton_rocm).
NATIVE_ENV = "AOTRITON_ROCM_TORCH_NATIVE"
LIB_NAME = "libaotriton_rocm_torch.so"
NAMESPACE = "aotriton_rocm"
# aten's ops the C++ kernels override, then ours (operator_schemas.py), in the
# order of aotr_torch_config.arg_kinds.
ATEN_OPS = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
            "_flash_attention_forward", "_flash_attention_backward",
            "_scaled_dot_product_efficient_attention",
            "_scaled_dot_product_efficient_attention_backward")
OURS = {"flash_attn_forward": FLASH_ATTN_FORWARD, "flash_attn_backward": FLASH_ATTN_BACKWARD,
        "flash_attn_kvcache": FLASH_ATTN_KVCACHE}
OPS = ATEN_OPS + tuple(OURS)
MIN_TORCH = (2, 10)


class Config(ctypes.Structure):
    _fields_ = [("struct_size", c_uint32), ("dispatch_key", c_char_p),
                ("fallback_namespace", c_char_p), ("runtime", RuntimeOptions),
                ("archives", POINTER(c_char_p)), ("archive_count", c_int32),
                ("rng_seed_rank", c_int32), ("rng_seed_size", c_int64), ("rng_unsigned", c_int32),
                ("efficient_lse_align", c_int32), ("aten_ops", c_int32),
                ("arg_kinds", c_char_p * len(OPS))]


_lock = threading.RLock()
_lib: ctypes.CDLL | None = None
_defs = None  # the py_<op> schemas (defined once per process)
_active: "Activation | None" = None
# Calls that reached each py_<op> (the Python route) since import.
fallback_calls: dict[str, int] = {op: 0 for op in OPS}


def library_path() -> Path:
    """``AOTRITON_ROCM_TORCH_LIB``, else beside the installed libaotriton_rocm
    (the package's ``lib/`` in a wheel, ``<sys.prefix>/lib`` in conda)."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env)
    return install_root() / "lib" / LIB_NAME


def _torch_version_ok() -> bool:
    import torch

    parts = torch.__version__.split("+")[0].split(".")
    try:
        return (int(parts[0]), int(parts[1])) >= MIN_TORCH
    except (IndexError, ValueError):
        return False


def available() -> bool:
    """The extension is installed and this torch can load it."""
    return library_path().is_file() and _torch_version_ok()


def wanted() -> bool:
    """:func:`available`, unless ``AOTRITON_ROCM_TORCH_NATIVE=0``."""
    return os.environ.get(NATIVE_ENV, "") != "0" and available()


def process_archives() -> list[str]:
    """The archives the C++ runtime opens at activation (index read, checked
    and parsed). With CUDA already up: those of the visible GPUs' archs only
    (an install with every arch's image would otherwise open them all), found
    without a scan of every distribution's metadata where possible. Before
    CUDA is up, every installed one: asking a GPU's arch would initialise
    CUDA here, which a process that forks later must not have done."""
    import torch

    if torch.cuda.is_initialized():
        archs = sorted({arch_of(i) for i in range(torch.cuda.device_count())})
        return [str(p) for p in map(find_archive, archs) if p is not None]
    return [str(p) for p in find_archives().values()]


def _loaded_libtorch_cpu() -> str:
    """The path of the libtorch_cpu.so this process loaded (wheel or conda)."""
    import torch

    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = line.rstrip("\n").split(maxsplit=5)[-1]
                if os.path.basename(path) == "libtorch_cpu.so":
                    return path
    except OSError:
        pass
    return str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so")


def _promote_libtorch() -> None:
    # import torch loads libtorch_cpu RTLD_LOCAL; RTLD_NOLOAD | RTLD_GLOBAL
    # re-opens that very copy and adds it to the global scope, where the
    # extension's undefined aoti_torch_* symbols are then resolved. By its
    # soname first (the loader matches it against loaded objects: no file
    # read), else by the path /proc/self/maps gives (a build with another
    # soname).
    mode = os.RTLD_NOLOAD | os.RTLD_GLOBAL | os.RTLD_NOW
    try:
        ctypes.CDLL("libtorch_cpu.so", mode=mode)
    except OSError:
        ctypes.CDLL(_loaded_libtorch_cpu(), mode=mode)


def load() -> ctypes.CDLL:
    """The extension, loaded once (libtorch promoted first); OSError if it
    cannot be loaded."""
    global _lib
    with _lock:
        if _lib is None:
            import torch  # noqa: F401  (libtorch_cpu must be loaded)

            _promote_libtorch()
            path = library_path()
            try:
                lib = ctypes.CDLL(str(path))
            except OSError as e:
                raise OSError(f"cannot load {path}: {e}") from None
            lib.aotr_torch_activate.restype = c_int
            lib.aotr_torch_activate.argtypes = [POINTER(Config)]
            lib.aotr_torch_deactivate.restype = c_int
            lib.aotr_torch_deactivate.argtypes = []
            lib.aotr_torch_is_active.restype = c_int
            lib.aotr_torch_last_error.restype = c_char_p
            lib.aotr_torch_launch_count.restype = c_uint64
            lib.aotr_torch_launch_count.argtypes = [c_char_p]
            lib.aotr_torch_fallback_count.restype = c_uint64
            _lib = lib
        return _lib


def _arg_kinds(schema) -> str:
    import torch

    kinds = []
    for arg in schema.arguments:
        t = arg.type
        if isinstance(t, torch.OptionalType):
            kinds.append("t" if isinstance(t.getElementType(), torch.TensorType) else "o")
        elif isinstance(t, torch.TensorType):
            kinds.append("T")
        elif isinstance(t, torch.ListType):
            kinds.append("L")
        else:
            kinds.append("x")
    return "".join(kinds)


def _schema(op: str):
    import torch

    if op in OURS:
        return torch._C.parse_schema(f"{NAMESPACE}::{OURS[op]}")
    return getattr(torch.ops.aten, op).default._schema


def _define_fallback_ops() -> None:
    global _defs
    if _defs is not None:
        return
    import torch

    lib = torch.library.Library(NAMESPACE, "FRAGMENT")
    for op in OPS:
        # "<ns>::<op>(args) -> returns" as "py_<op>(args) -> tensor returns"
        schema = _schema(op)
        args = str(schema).split("::", 1)[1].rsplit(" -> ", 1)[0]
        returns = [f"Tensor {r.name}".rstrip() for r in schema.returns
                   if isinstance(r.type, torch.TensorType)]
        lib.define(f"py_{args} -> ({', '.join(returns)})")
    _defs = lib


def _tensor_returns(op: str) -> tuple[bool, ...] | None:
    """Which returns of ``op`` its py_<op> keeps: only the Tensor ones, since
    torch's boxed dispatcher call from C++ (torch_call_dispatcher, 2.10-2.13)
    converts return i with the type of return n-1-i, which breaks on mixed
    return types. The one op concerned, the flash forward, returns
    max_q/max_k; its C++ kernel puts them back (they are the seqlens)."""
    import torch

    keep = tuple(isinstance(r.type, torch.TensorType) for r in _schema(op).returns)
    return None if all(keep) else keep


def _rng_config(rng_layout) -> tuple[int, int, int]:
    import torch

    (seed_shape, seed_dtype), (offset_shape, offset_dtype) = rng_layout
    if len(seed_shape) > 1 or offset_shape != () or seed_dtype != offset_dtype or \
            seed_dtype not in (torch.int64, torch.uint64):
        raise RuntimeError(f"unexpected RNG-state layout {rng_layout}")
    return len(seed_shape), (seed_shape[0] if seed_shape else 0), int(seed_dtype == torch.uint64)


class Activation:
    """The registrations of one :func:`activate`; ``remove()`` takes them off."""

    def __init__(self, impls):
        self._impls = impls

    def remove(self) -> None:
        global _active
        with _lock:
            if self._impls is None:
                return
            load().aotr_torch_deactivate()
            self._impls._destroy()
            self._impls = None
            if _active is self:
                _active = None

    @property
    def active(self) -> bool:
        return self._impls is not None


def _counted(op: str, kernel: Callable) -> Callable:
    keep = _tensor_returns(op)

    def py_kernel(keyset, *args, **kwargs):
        fallback_calls[op] += 1
        out = kernel(keyset, *args, **kwargs)
        return out if keep is None else tuple(x for x, k in zip(out, keep) if k)
    return py_kernel


def _no_python_route(op: str) -> Callable:
    def kernel(keyset, *args, **kwargs):
        raise RuntimeError(f"{NAMESPACE}::{op}: this call needs the Python route, and activate() "
                           "was given none for it")
    return kernel


def activate(python_kernels: Mapping[str, Callable], *, rng_layout=None,
             efficient_lse_align: int = 1, aten: bool = True, dispatch_key: str = "CUDA",
             python_keys: Sequence[str] = ("CUDA",), archives: Sequence[str] = (),
             archive_dir: str | None = None, driver_library: str | None = None,
             backend: int = BACKEND_AUTO) -> Activation:
    """Put the C++ kernels on ``dispatch_key`` of the six aten ops (unless
    ``aten`` is False) and ours.

    ``python_kernels``: per op name (``OPS``), the Python route's kernel
    ``(keyset, *args, **kwargs)``, registered as ``aotriton_rocm::py_<op>``
    on ``python_keys`` (one of ``OURS`` left out: its calls that need the
    Python route raise). For the aten ops, ``rng_layout``: the flash ops'
    RNG-state outputs as ``torch_integration._rng_layout()`` gives them
    (torch's meta-kernel rule); ``efficient_lse_align``: the efficient op's
    logsumexp row rounding. The
    runtime options and ``archives`` go to the extension's aotr_runtime.
    Replaces an earlier activation. RuntimeError if the extension refuses.
    """
    global _active
    import torch

    with span("extension_load", f"({LIB_NAME}, libtorch promoted)"):
        lib = load()
    if _active is not None:
        _active.remove()
    served = OPS if aten else tuple(OURS)
    with _lock:
        with span("python_route_ops", "(aotriton_rocm::py_<op> defined and registered)"):
            _define_fallback_ops()
            impls = torch.library.Library(NAMESPACE, "IMPL")
            for op in served:
                kernel = _counted(op, python_kernels.get(op) or _no_python_route(op))
                for key in python_keys:
                    impls.impl("py_" + op, kernel, key, with_keyset=True)
        rank, size, unsigned = _rng_config(rng_layout) if aten else (0, 0, 0)
        paths = [os.fsencode(p) for p in archives]
        c_paths = (c_char_p * max(1, len(paths)))(*paths)
        cfg = Config()
        cfg.struct_size = ctypes.sizeof(Config)
        cfg.dispatch_key = dispatch_key.encode()
        cfg.fallback_namespace = NAMESPACE.encode()
        cfg.runtime = RuntimeOptions(
            ctypes.sizeof(RuntimeOptions),
            os.fsencode(archive_dir) if archive_dir else None,
            os.fsencode(driver_library) if driver_library else None, backend)
        cfg.archives = c_paths
        cfg.archive_count = len(paths)
        cfg.rng_seed_rank, cfg.rng_seed_size, cfg.rng_unsigned = rank, size, unsigned
        cfg.efficient_lse_align = efficient_lse_align
        cfg.aten_ops = int(aten)
        for i, op in enumerate(OPS):
            if op in served:
                cfg.arg_kinds[i] = _arg_kinds(_schema(op)).encode()
        with span("native_activate", f"(runtime, {len(paths)} archive(s) opened, aten "
                                     "registrations)"):
            status = lib.aotr_torch_activate(ctypes.byref(cfg))
        if status != 0:
            impls._destroy()
            raise RuntimeError("aotriton-rocm's torch extension: "
                               + lib.aotr_torch_last_error().decode(errors="replace"))
        _active = Activation(impls)
        return _active


def deactivate() -> None:
    if _active is not None:
        _active.remove()


def is_active() -> bool:
    return _lib is not None and bool(_lib.aotr_torch_is_active())


def launch_count(kernel: str | None = None) -> int:
    """Kernel launches through the extension's runtimes since it was loaded
    (0 before), active or not."""
    return load().aotr_torch_launch_count(kernel.encode() if kernel else None) if _lib else 0


def fallback_count() -> int:
    """Calls the extension handed to the Python route since activation."""
    return load().aotr_torch_fallback_count() if _lib else 0
