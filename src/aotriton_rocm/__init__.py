"""aotriton-rocm: ahead-of-time compiled FlashAttention for ROCm, plugged into PyTorch SDPA.

Importing registers the implementation with torch (>= 2.10) under
``"AOTRITON_ROCM"``; nothing is activated until you call :func:`enable` or
``torch.nn.attention.activate_flash_attention_impl("AOTRITON_ROCM")``.
"""

from ._version import ABI_VERSION, __version__

try:
    import torch  # noqa: F401
except ImportError:  # the build tooling runs without torch; the runtime cannot
    pass
else:
    from .backends import launch_counts, reset_launch_counts
    from .flash_attn_interface import flash_attn_func, flash_attn_varlen_func
    from .function_mode import AttentionMode
    from .torch_integration import IMPL_NAME, disable, enable, is_enabled, register

    register()

__all__ = ["ABI_VERSION", "AttentionMode", "IMPL_NAME", "__version__", "disable", "enable",
           "flash_attn_func", "flash_attn_varlen_func", "is_enabled", "launch_counts",
           "reset_launch_counts"]
