"""aotriton-rocm: ahead-of-time compiled FlashAttention for ROCm, plugged into PyTorch SDPA.

Importing registers the implementation with torch (>= 2.10) under
``"AOTRITON_ROCM"``; nothing is activated until you call :func:`enable` or
``torch.nn.attention.activate_flash_attention_impl("AOTRITON_ROCM")``.
"""

import os as _os
import sys as _sys

from ._version import ABI_VERSION, __version__

# Processes that never touch torch skip importing it (seconds): `aotriton-rocm
# config` / `python -m aotriton_rocm config` (paths for C and C++ builds; while
# -m imports the package, sys.argv[0] is "-m"), and the build's compile
# workers, started with AOTRITON_ROCM_NO_TORCH=1 (one process per compile).
_NO_TORCH = (_os.environ.get("AOTRITON_ROCM_NO_TORCH") == "1"
             or (_sys.argv[1:2] == ["config"]
                 and _os.path.basename(_sys.argv[0] or "") in ("aotriton-rocm", "-m")))

try:
    if _NO_TORCH:
        raise ImportError("torch not wanted in this process")
    import torch  # noqa: F401
except ImportError:  # the build tooling runs without torch; the runtime cannot
    pass
else:
    from .backends import launch_counts, reset_launch_counts
    from .flash_attn_interface import (flash_attn_func, flash_attn_kvpacked_func,
                                       flash_attn_qkvpacked_func, flash_attn_varlen_func,
                                       flash_attn_varlen_kvpacked_func,
                                       flash_attn_varlen_qkvpacked_func)
    from .kvcache_api import flash_attn_with_kvcache
    from .function_mode import AttentionMode
    from .torch_integration import IMPL_NAME, disable, enable, is_enabled, register

    register()

__all__ = ["ABI_VERSION", "AttentionMode", "IMPL_NAME", "__version__", "disable", "enable",
           "flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func",
           "flash_attn_varlen_func", "flash_attn_varlen_kvpacked_func",
           "flash_attn_varlen_qkvpacked_func", "flash_attn_with_kvcache", "is_enabled",
           "launch_counts",
           "reset_launch_counts"]
