"""What the static report knows of one AMD kernel and one build: the
figures read from a code object (:class:`Figures`), the shipped choice of a
functional point over a run of seqlen buckets with the candidates it beat,
and their short texts. Build-time only; static_report.py reads builds into
these, report_diff.py compares two, reference_report.py sets AMD's kernels
beside them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .codeobject import ArchLimits, CodeObjectError, estimate_occupancy, inspect_code_object

__all__ = ["Figures", "code_object_figures", "Candidate", "ShippedChoice", "ArchReport", "functional_text",
           "config_text", "bucket_text"]


# -- figures of one code object ----------------------------------------------

@dataclass(frozen=True)
class Figures:
    """What predicts one AMD kernel's speed. ``vgpr``: architectural VGPRs
    (on the unified register file of gfx90a/gfx942/gfx950 the metadata's
    count less the AGPRs, i.e. rounded up to 4), ``registers``: VGPRs +
    AGPRs per lane. ``loop`` is the compile-time record of its hot loop
    (amdgcn.hot_loop_stats; None: no loop); ``loop_known`` is False for code
    objects compiled before it was recorded."""

    occupancy: int
    vgpr: int
    agpr: int
    registers: int
    sgpr: int
    lds: int
    vgpr_spills: int
    sgpr_spills: int
    scratch: int
    loop: Optional[Dict[str, Any]] = None
    loop_known: bool = True

    @property
    def matrix_per_iter(self) -> Optional[int]:
        """Matrix instructions (MFMA on CDNA, WMMA on RDNA) per hot-loop iteration."""
        m, w = self.per_iter("mfma"), self.per_iter("wmma")
        return None if m is None else m + (w or 0)

    def per_iter(self, kind: str) -> Optional[int]:
        """``kind`` (mfma, instructions, global_loads, ...) in one iteration of
        the hot loop; 0 without a loop, None where unknown."""
        if not self.loop_known:
            return None
        return int((self.loop or {}).get(kind, 0))


def code_object_figures(code: bytes, symbol: str, num_warps: int, shared: int, limits: ArchLimits,
                        stats: Mapping[str, Any]) -> Figures:
    """The figures of one code object: registers, spills, scratch and LDS
    from its AMDGPU metadata (plus the ``shared`` bytes triton allocates at
    launch), occupancy as the build's validator estimates it, the hot loop
    from the compile-time ``stats``."""
    info = inspect_code_object(code)
    km = info.kernel(symbol)
    if km is None:
        raise CodeObjectError(f"no kernel {symbol!r} in the code object")
    lds = km.group_segment_fixed_size + int(shared)
    occ = estimate_occupancy(km, limits, int(num_warps), lds)
    unified = limits.vgpr_mode == "unified"  # .vgpr_count includes the AGPRs
    return Figures(occupancy=occ["occupancy"],
                   vgpr=km.vgpr_count - km.agpr_count if unified else km.vgpr_count,
                   agpr=km.agpr_count,
                   registers=km.vgpr_count if unified else km.vgpr_count + km.agpr_count,
                   sgpr=km.sgpr_count, lds=lds, vgpr_spills=km.vgpr_spill_count,
                   sgpr_spills=km.sgpr_spill_count, scratch=km.private_segment_fixed_size,
                   loop=stats.get("loop"), loop_known="loop" in stats)


# -- one build's report ------------------------------------------------------

@dataclass
class Candidate:
    """One config of a functional point: its figures (None when its code
    object is gone from the cache: ``missing`` says why) and, beside a
    shipped choice, why it lost there."""

    key: str
    config: Dict[str, Any]
    figures: Optional[Figures]
    why: Optional[str] = None
    missing: Optional[str] = None


@dataclass
class ShippedChoice:
    """The config shipped for one run of seqlen buckets of one functional
    point (``bounds``: the buckets' upper bounds, None = the open one), and
    the other candidates of the point."""

    arch: str
    kernel: str
    functional: Dict[str, Any]
    axis: str
    lower: int  # the run covers lower < seqlen <= bounds[-1]
    bounds: List[Optional[int]]
    source: str  # "measured" | "static"
    chosen: Candidate
    others: List[Candidate] = field(default_factory=list)

    @property
    def point(self) -> Tuple[str, str, str]:
        return self.arch, self.kernel, functional_text(self.functional)


@dataclass
class ArchReport:
    arch: str
    archive: str
    candidates_recorded: bool  # False: the build report has no selection (an older build)
    choices: List[ShippedChoice] = field(default_factory=list)

    @property
    def shipped(self) -> int:
        return len({c.chosen.key for c in self.choices})


def functional_text(functional: Mapping[str, Any]) -> str:
    """``fp16 d128 pad_head``: dtype, head dim, the true flags, other values as k=v."""
    parts = []
    for k, v in functional.items():
        if k == "dtype":
            parts.append(str(v))
        elif k == "head_dim":
            parts.append(f"d{v}")
        elif isinstance(v, bool):
            if v:
                parts.append(k)
        else:
            parts.append(f"{k}={v}")
    return " ".join(parts) or "-"


# The AMD backend's options and the early V load, short (see LEGEND).
_SHORT = {"num_warps": "w", "num_stages": "s", "waves_per_eu": "wpe", "matrix_instr_nonkdim": "nk",
          "kpack": "kp"}


def config_text(config: Mapping[str, Any]) -> str:
    """``128x64 w4 s1 wpe2 nk16 kp2 preV``: the BLOCK_* tile, num_warps,
    num_stages, the AMD options, PRE_LOAD_V; other keys as k=v."""
    tile = [str(v) for k, v in config.items() if k.startswith("BLOCK")]
    rest = []
    for k, v in config.items():
        if k.startswith("BLOCK") or (k == "PRE_LOAD_V" and not v):
            continue
        rest.append(f"{_SHORT[k]}{v}" if k in _SHORT else "preV" if k == "PRE_LOAD_V" else f"{k}={v}")
    return " ".join((["x".join(tile)] if tile else []) + rest) or "-"


def bucket_text(axis: str, lower: int, upper: Optional[int]) -> str:
    a = {"seqlen_q": "q", "seqlen_k": "k"}.get(axis, axis)
    if upper is None:
        return f"{a} any" if lower == 0 else f"{a}>{lower}"
    return f"{a}<={upper}" if lower == 0 else f"{a} {lower + 1}..{upper}"
