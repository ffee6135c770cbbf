"""What a build reports: the per-arch validator summary stored in
``build-report.json``, the table printed at the end of ``build`` / ``merge``
and the PNG chart beside the report. Build-time only.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

from ...common.archive import KernelRecord
from ..common.tables import render_table

__all__ = ["summarize_validation", "format_arch_table", "arch_chart_png", "UPSTREAM_PER_ARCH"]


def summarize_validation(records: Sequence[KernelRecord]) -> Dict[str, Any]:
    """Per-arch validator numbers: worst registers, spills, scratch, LDS, occupancy, MFMA."""
    st = [r.stats or {} for r in records]

    def worst(key: str, fn=max) -> Optional[int]:
        vals = [int(s[key]) for s in st if s.get(key) is not None]
        return fn(vals) if vals else None
    return {
        "kernels": len(records),
        "max_vgpr": worst("vgpr_count"), "max_agpr": worst("agpr_count"), "max_sgpr": worst("sgpr_count"),
        "vgpr_spills": sum(int(s.get("vgpr_spill_count") or 0) for s in st),
        "sgpr_spills": sum(int(s.get("sgpr_spill_count") or 0) for s in st),
        "max_scratch": worst("private_segment_fixed_size"), "max_lds": worst("lds_bytes"),
        "min_occupancy": worst("occupancy", min),
        "mfma_kernels": sum(1 for s in st if s.get("mfma") or s.get("wmma")),  # matrix cores
        "allowed": sorted({a for s in st for a in (s.get("allowed") or [])}),
    }


# Upstream AOTriton's code objects for one arch (gfx942, at its head: fwd 6,598,
# dk/dv 3,670, dq 5,054, fused bwd 3,532), for the report's comparison.
UPSTREAM_PER_ARCH = 19000


def format_arch_table(report: Dict[str, Any]) -> str:
    """The per-arch build table: kernels shipped (of the candidates compiled),
    compiled/cached now, archive size, compile seconds (the sum of every
    candidate's compile time as recorded in the cache when it was compiled:
    wall time in a worker, so a loaded machine counts waiting for a core),
    worst register pressure, min occupancy, spills/scratch, matrix-core
    kernels, allowed exceptions, choices measured/static (AMD numbers from
    the code-object validator), then how the kernel count compares with
    upstream AOTriton."""
    def c(v: Any) -> str:
        return "-" if v is None else str(v)
    rows = [("arch", "shipped", "candidates", "compiled", "cached", "KiB", "compile s", "worst VGPR/AGPR/SGPR",
             "min occ", "spills", "scratch", "MFMA/WMMA", "exceptions", "measured/static", "archive")]
    shipped = []
    for a, r in (report.get("per_arch") or {}).items():
        val = r.get("validation") or {}
        regs = (f"{c(val.get('max_vgpr'))}/{c(val.get('max_agpr'))}/{c(val.get('max_sgpr'))}"
                if val else "-")
        ch = r.get("choices") or {}
        exc = r.get("exceptions")
        kib = r.get("archive_bytes")
        shipped.append(int(r.get("kernels") or 0))
        rows.append((a, str(r.get("kernels")), c(r.get("candidates")), str(r.get("compiled")),
                     str(r.get("cached")), "-" if kib is None else f"{kib / 1024:.0f}",
                     f"{r.get('compile_seconds_all', r.get('seconds', 0)):.0f}", regs,
                     c(val.get("min_occupancy")), c(val.get("vgpr_spills")), c(val.get("max_scratch")),
                     f"{val['mfma_kernels']}/{val['kernels']}" if val else "-",
                     "-" if exc is None else str(len(exc)),
                     f"{ch.get('measured', 0)}/{ch.get('static', 0)}" if ch else "-", str(r.get("archive", ""))))
    lines = [render_table(rows[0], rows[1:], left=(0, -1))]
    if shipped and max(shipped):
        lines.append(f"upstream AOTriton: ~{UPSTREAM_PER_ARCH:,} code objects per arch (gfx942); this build: "
                     f"{max(shipped):,} at most ({UPSTREAM_PER_ARCH / max(shipped):.0f}x fewer)")
    return "\n".join(lines)


def arch_chart_png(report: Dict[str, Any]) -> bytes:
    """The per-arch report as a PNG of bar plots (chart.py, matplotlib)."""
    from ..common.chart import ORANGE, BLUE, Panel, bar_chart_png
    per = report.get("per_arch") or {}
    archs = list(per)

    def col(key, fn=lambda v: v):
        return [None if per[a].get(key) is None else fn(per[a][key]) for a in archs]
    vgpr = [(per[a].get("validation") or {}).get("max_vgpr") for a in archs]
    exc = [len(per[a].get("exceptions") or ()) if per[a].get("exceptions") is not None else None for a in archs]
    colors = [ORANGE if e else BLUE for e in exc]
    panels = [
        Panel("Kernels shipped", col("kernels"), colors, ylabel="code objects", counts=True,
              note=f"upstream AOTriton: ~{UPSTREAM_PER_ARCH:,} per arch"),
        Panel("Archive size", col("archive_bytes", lambda b: b / 1024), colors, ylabel="KiB"),
        Panel("Compile time", col("compile_seconds_all"), colors, ylabel="seconds",
              note="sum of every candidate's compile"),
        Panel("Worst VGPR use per lane", vgpr, colors, ylabel="VGPRs (AMD only)"),
        Panel("Allowed exceptions", exc, colors, ylabel="kernels", counts=True, note="waived spills / scratch / LDS"),
    ]
    notes = [f"ROCm {report.get('profile')}, triton {report.get('compiler_version')}, "
             f"aotriton-rocm {report.get('package_version')}"]
    return bar_chart_png("aotriton-rocm: per-arch build report", archs, panels, notes,
                         legend=[(BLUE, "clean"), (ORANGE, "ships waived exceptions")])
