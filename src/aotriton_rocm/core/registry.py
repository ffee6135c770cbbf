"""Our name in torch's flash-attention registry (torch >= 2.10), entered
without importing the runtime: torch calls the function registered here only
when someone activates ``IMPL_NAME``, and the runtime is imported then.

This module runs inside ``import torch`` (the backend autoload): it imports
nothing but ``torch.nn.attention``, which torch has already imported.
"""

from __future__ import annotations

from typing import Callable

IMPL_NAME = "AOTRITON_ROCM"


def _attention_module():
    import torch.nn.attention

    return torch.nn.attention


def has_registry() -> bool:
    return hasattr(_attention_module(), "register_flash_attention_impl")


def register(register_fn: Callable) -> bool:
    """Enter ``register_fn`` under ``IMPL_NAME``; activates nothing. False on a
    torch without the registry (torch < 2.10)."""
    attention = _attention_module()
    if not hasattr(attention, "register_flash_attention_impl"):
        return False
    attention.register_flash_attention_impl(IMPL_NAME, register_fn=register_fn)
    return True
