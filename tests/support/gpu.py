"""What the GPU tests share: our launch count on this GPU's image, and the
variant an installed archive ships."""

from __future__ import annotations

import torch

from aotriton_rocm import archive, backends, device, images


def ours(kernel: str = "attn_fwd") -> int:
    """Launches of our `kernel` on the current GPU since the last reset."""
    name = f"aot:{device.arch_of(torch.cuda.current_device())}"
    return backends.launch_counts().get((name, kernel), 0)


def shipped_key(arch: str, kernel: str, point: dict, seqlen: int) -> str:
    """The variant key of `kernel` that the installed `arch` archive runs at
    this functional point and sequence length."""
    choices = archive.Archive.open(images.find_archives()[arch]).manifest["tuning"]["choices"]
    for choice in choices:
        if choice["kernel"] == kernel and choice["functional"] == point:
            return next(key for bound, key, *_ in choice["select"] if bound is None or seqlen <= bound)
    raise AssertionError(f"the {arch} manifest has no {kernel} choice for {point}")
