"""What the GPU tests share: our launch count on this GPU's image, the
variant an installed archive ships, and CUDA-graph capture."""

from __future__ import annotations

import functools

import pytest
import torch

from aotriton_rocm.common import archive, images
from aotriton_rocm.core import backends, device


@functools.lru_cache(maxsize=None)
def missing(arch: str | None = None, image: bool = True) -> str | None:
    """Why a test marked ``gpu`` cannot run here (None: it can): no GPU
    visible to torch; with ``image``, no installed kernel image for the GPU's
    arch; with ``arch``, another GPU (or no image of that arch). Asked once per
    session (the image search scans the installed distributions)."""
    if not device.gpu_available():
        return "no GPU visible to torch"
    here = device.arch_of(torch.cuda.current_device())
    if arch is not None and (here != arch or arch not in images.find_archives()):
        return f"needs an {arch} GPU and the installed {arch} image"
    if image and here not in images.find_archives():
        return "no kernel image installed for this GPU's arch"
    return None


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


def require_sm90_function(kernel: str, function: str, dtype: torch.dtype, head_dim: int, seqlen: int) -> None:
    """Skip unless the installed sm_90 archive runs `function` ("module:name")
    for `kernel` at the unmasked fast-path point of (dtype, head_dim) and this
    sequence length: a case meant for that kernel cannot pass on another."""
    point = {"dtype": {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype], "head_dim": head_dim,
             "pad_head": False, "has_bias": False, "enable_dropout": False}
    key = shipped_key("sm_90", kernel, point, seqlen)
    if f"function={function}" not in key:
        pytest.skip(f"the installed archive runs {key} here, not {function}")


def randn(*shape, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """A seeded standard-normal CUDA tensor."""
    gen = torch.Generator("cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", generator=gen).to(dtype)


def captured(call):
    """(graph, outputs) of `call` recorded in a CUDA graph, after one run on a
    side stream that loads the modules (a capture cannot load them)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = call()
    return graph, outputs
