"""How many waves of a kernel one SIMD holds (occupancy), from its
registers and LDS, and the per-arch limits that decide it. Build-time
only; the figures come from codeobject.py's metadata reader (the
KernelMeta fields used: vgpr_count, agpr_count, group_segment_fixed_size).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional

__all__ = ["ArchLimits", "estimate_occupancy"]


@dataclass(frozen=True)
class ArchLimits:
    """What the validator needs to know about one arch (from ci/targets.toml)."""

    name: str
    mach: Optional[int] = None
    lds_bytes: int = 65536
    warp_size: int = 64
    vgpr_file: int = 512
    vgpr_mode: str = "unified"
    vgpr_granule: int = 8
    max_waves: int = 8
    simds_per_cu: int = 4

    @classmethod
    def from_spec(cls, spec: Any) -> "ArchLimits":
        """From a :class:`~aotriton_rocm.tooling.common.targets.ArchSpec` (duck-typed)."""
        kw = {"name": spec.name, "mach": getattr(spec, "mach", None), "warp_size": spec.warp_size}
        for k in ("lds_bytes", "vgpr_file", "vgpr_mode", "vgpr_granule", "max_waves", "simds_per_cu"):
            v = getattr(spec, k, None)
            if v is not None:
                kw[k] = v
        return cls(**kw)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ArchLimits":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


def _roundup(x: int, g: int) -> int:
    return (x + g - 1) // g * g


def estimate_occupancy(km: Any, limits: ArchLimits, num_warps: int,
                       lds_bytes: Optional[int] = None) -> Dict[str, int]:
    """Waves per SIMD, the smaller of the register and the LDS limit.

    Registers (per lane): ``regs`` = the wave's VGPR allocation, rounded up to
    the arch's granule; waves = min(max_waves, vgpr_file // regs).
      * unified (gfx90a/gfx942/gfx950): 512 VGPR+AGPR per lane; the metadata's
        .vgpr_count is already the unified total (arch VGPRs aligned to 4 plus
        AGPRs), granule 8, at most 8 waves.
      * split (gfx908): 256 arch VGPRs and 256 AGPRs, allocated alike, so the
        larger of .vgpr_count and .agpr_count counts; granule 4, at most 10 waves.
      * vgpr (RDNA wave32): .vgpr_count against the wave32 register file (1536
        or 1024 entries), granule 24/16, at most 16 waves.
    This reproduces LLVM's own "; Occupancy:" figure for every flash kernel
    compiled for gfx908/gfx942 (checked in tests/tooling/builder/test_codeobject.py).
    LDS: ``lds_bytes`` (default: .group_segment_fixed_size; triton allocates
    its LDS dynamically at launch, so pass static + dynamic) per workgroup;
    workgroups per CU = lds_per_cu // lds_bytes, each putting
    ceil(num_warps / simds_per_cu) waves on each SIMD. SGPRs are not limiting
    for these kernels (<= 106 per wave) and are ignored.
    """
    if limits.vgpr_mode == "split":
        used = max(km.vgpr_count, km.agpr_count)
    else:
        used = km.vgpr_count
    regs = _roundup(max(used, 1), limits.vgpr_granule)
    by_vgpr = min(limits.max_waves, limits.vgpr_file // regs)
    per_simd = max(1, -(-max(num_warps, 1) // limits.simds_per_cu))
    lds = km.group_segment_fixed_size if lds_bytes is None else lds_bytes
    by_lds = (limits.lds_bytes // lds) * per_simd if lds > 0 else limits.max_waves
    by_lds = min(by_lds, limits.max_waves)
    return {"occupancy": max(0, min(by_vgpr, by_lds)), "occupancy_vgpr": by_vgpr,
            "occupancy_lds": by_lds, "vgpr_alloc": regs}
