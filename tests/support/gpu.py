"""What the GPU tests share: our launch count on this GPU's image."""

from __future__ import annotations

import torch

from aotriton_rocm import backends, device


def ours(kernel: str = "attn_fwd") -> int:
    """Launches of our `kernel` on the current GPU since the last reset."""
    name = f"aot:{device.arch_of(torch.cuda.current_device())}"
    return backends.launch_counts().get((name, kernel), 0)
