"""aotriton-rocm: ahead-of-time compiled FlashAttention for ROCm, plugged into PyTorch SDPA.

Importing registers the implementation with torch (>= 2.10) under
``"AOTRITON_ROCM"``; nothing is activated until you call :func:`enable` or
``torch.nn.attention.activate_flash_attention_impl("AOTRITON_ROCM")``.

Importing is cheap (torch's backend autoload imports this package inside
every ``import torch``): the runtime modules load on first use of a name
below (:data:`_LAZY`) or on activation.
"""

import os as _os
import sys as _sys

from ._version import ABI_VERSION, __version__

# Processes that never touch torch skip importing it (seconds): `aotriton-rocm
# config` / `python -m aotriton_rocm config` (paths for C and C++ builds; while
# -m imports the package, sys.argv[0] is "-m"), `torch-dropin` (it locates
# torch's files, and must not load the library it replaces), and the build's compile
# workers, started with AOTRITON_ROCM_NO_TORCH=1 (one process per compile).
_NO_TORCH = (_os.environ.get("AOTRITON_ROCM_NO_TORCH") == "1"
             or (_sys.argv[1:2] in (["config"], ["torch-dropin"])
                 and _os.path.basename(_sys.argv[0] or "") in ("aotriton-rocm", "-m")))

# module -> the public names it defines, imported on first access to one
_LAZY_MODULES = {
    "core.backends": ["launch_counts", "reset_launch_counts"],
    "flash_attn_interface": ["flash_attn_func", "flash_attn_kvpacked_func",
                             "flash_attn_qkvpacked_func", "flash_attn_varlen_func",
                             "flash_attn_varlen_kvpacked_func", "flash_attn_varlen_qkvpacked_func"],
    "integrations.kvcache_api": ["flash_attn_with_kvcache"],
    "integrations.function_mode": ["AttentionMode"],
    "integrations.torch_integration": ["disable", "enable", "register"],
}
_LAZY = {name: module for module, names in _LAZY_MODULES.items() for name in names}


def _activate():
    # What torch's registry calls on activate_flash_attention_impl(IMPL_NAME).
    from .integrations.torch_integration import _register_fn

    return _register_fn()


def is_enabled() -> bool:
    """Whether our kernels are active (an import of the runtime is not needed
    to tell: nothing was enabled before it was imported)."""
    integration = _sys.modules.get(__name__ + ".integrations.torch_integration")
    return integration is not None and integration.is_enabled()


try:
    if _NO_TORCH:
        raise ImportError("torch not wanted in this process")
    import torch  # noqa: F401
except ImportError:  # the build tooling runs without torch; the runtime cannot
    _HAS_TORCH = False
else:
    _HAS_TORCH = True
    from .core.registry import IMPL_NAME, register as _register_lazily

    _register_lazily(_activate)


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None or not _HAS_TORCH:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | (set(_LAZY) if _HAS_TORCH else set()))


__all__ = ["ABI_VERSION", "AttentionMode", "IMPL_NAME", "__version__", "disable", "enable",
           "flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func",
           "flash_attn_varlen_func", "flash_attn_varlen_kvpacked_func",
           "flash_attn_varlen_qkvpacked_func", "flash_attn_with_kvcache", "is_enabled",
           "launch_counts",
           "reset_launch_counts"]
