"""Which GPU arch a torch device is, in the names the archives use."""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=None)
def arch_of(device_index: int) -> str:
    """``gfx942`` for a ROCm device (target features dropped), ``sm_90`` for CUDA."""
    props = torch.cuda.get_device_properties(device_index)
    if torch.version.hip:
        return props.gcnArchName.split(":")[0]
    return f"sm_{props.major}{props.minor}"


def gpu_available() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() > 0
