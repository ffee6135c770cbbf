"""Build stage 5, write: one archive per arch (the selected code objects,
their records and the manifest) plus its manifest sidecar, each written
atomically; archives of other build inputs left in the directory are set
aside. Build-time only.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

from ... import _version
from ...common.archive import ARCHIVE_SUFFIX, Archive, ArchiveError, manifest_path_for
from .archive_writer import write_archive, write_manifest_sidecar
from .compile import Compiled
from .plan import BuildPlan
from .report import summarize_validation
from .validate import Validation, kernel_record
from .codeobject import ArchLimits
from ..common.targets import ArchSpec

__all__ = ["ArchResult", "write_archives", "arch_limits_dict", "set_aside_stale", "STALE_DIR"]


@dataclass
class ArchResult:
    arch: str
    archive: Path
    manifest: Path
    kernels: int
    compiled: int
    cached: int
    seconds: float
    archive_bytes: int


def arch_limits_dict(a: ArchSpec) -> Dict[str, Any]:
    """The limits the code-object validator uses for ``a`` (stored in each
    AMD archive's manifest so ``aotriton-rocm validate`` needs no checkout)."""
    return dict(ArchLimits.from_spec(a).__dict__)


STALE_DIR = "stale"


def set_aside_stale(arch_dir: Path, built: Sequence[str], inputs_hash: str) -> List[Path]:
    """Move archives in ``arch_dir`` that this build did not write and that
    come from other build inputs (or cannot be read) to ``arch_dir/stale/``,
    with their sidecars: a stale archive must not look current beside the
    new ones. Archives of the same inputs (an earlier build of other archs of
    this checkout) stay. Returns the new paths."""
    moved: List[Path] = []
    try:
        entries = sorted(arch_dir.glob("*" + ARCHIVE_SUFFIX))
    except OSError:
        return moved
    for ap in entries:
        arch = ap.name[: -len(ARCHIVE_SUFFIX)]
        if arch in built:
            continue
        try:
            their_hash = Archive.open(ap).manifest.get("build_inputs_hash")
        except ArchiveError:
            their_hash = None
        if their_hash == inputs_hash:
            continue
        stale = arch_dir / STALE_DIR
        stale.mkdir(exist_ok=True)
        for f in (ap, manifest_path_for(ap)):
            if os.path.lexists(f):
                os.replace(f, stale / f.name)
        moved.append(stale / ap.name)
    return moved


def _manifest(plan: BuildPlan, a: ArchSpec, selection: Dict[str, Any]) -> Dict[str, Any]:
    manifest = {
        "format_version": None,  # filled by write_archive
        "package_version": _version.__version__,
        "abi_version": _version.ABI_VERSION,
        "rocm_profile": plan.profile.name,
        "arch": a.name,
        "backend": a.backend,
        "family": a.family,
        "warp_size": a.warp_size,
        "compiler": "triton",
        "compiler_version": plan.triton_version,
        "build_inputs_hash": plan.inputs_hash,
        "blob_sha256": None,  # filled by write_archive
    }
    if plan.subset:  # `build --only`: not every kernel; package refuses it unless told
        manifest["subset"] = plan.subset
    if a.backend == "hip":
        manifest["code_object_version"] = plan.profile.code_object_version
        manifest["hip_soname"] = plan.profile.hip_soname
        manifest["arch_limits"] = arch_limits_dict(a)
    manifest["tuning"] = selection["manifest"]
    manifest["exceptions"] = selection["exceptions"]
    return manifest


def write_archives(plan: BuildPlan, compiled: Compiled, validation: Validation,
                   selection: Dict[str, Dict[str, Any]], out: Path
                   ) -> Tuple[Dict[str, ArchResult], Dict[str, Dict[str, Any]]]:
    """Write ``OUT/archives/<arch>.aotr`` + sidecar per arch; returns the
    results and the report's per-arch entries."""
    arch_dir = out / "archives"
    results: Dict[str, ArchResult] = {}
    report: Dict[str, Dict[str, Any]] = {}
    for a in plan.archs:
        t0 = time.monotonic()
        items = plan.items[a.name]
        sel = selection[a.name]
        pairs = [(kernel_record(v, compiled.results[t.cache_key][0],
                                validation.checked[(a.name, v.key)][0] or None),
                  compiled.results[t.cache_key][1]) for v, t in items if v.key in sel["chosen"]]
        ap = arch_dir / f"{a.name}{ARCHIVE_SUFFIX}"
        write_archive(ap, _manifest(plan, a, sel), pairs)
        mp = write_manifest_sidecar(ap)
        write_s = time.monotonic() - t0
        n_comp = sum(1 for _, t in items if t.cache_key in compiled.compiled_keys)
        seconds = compiled.seconds.get(a.name, 0.0)
        ar = ArchResult(arch=a.name, archive=ap, manifest=mp, kernels=len(pairs), compiled=n_comp,
                        cached=len(items) - n_comp, seconds=round(seconds + write_s, 3),
                        archive_bytes=ap.stat().st_size)
        results[a.name] = ar
        report[a.name] = {
            "kernels": ar.kernels, "candidates": len(items), "compiled": ar.compiled, "cached": ar.cached,
            "seconds": ar.seconds, "compile_cpu_seconds": round(seconds, 3),
            "compile_seconds_all": round(sum(float(compiled.results[t.cache_key][0].get("compile_seconds", 0))
                                                  for _, t in items), 3),
            "choices": sel["counts"], "rejected": sel["rejected"], "exceptions": sel["exceptions"],
            "write_seconds": round(write_s, 3), "archive": str(ap.relative_to(out)),
            "manifest": str(mp.relative_to(out)), "archive_bytes": ar.archive_bytes,
            "code_bytes": sum(len(c) for _, c in pairs),
            "warnings": plan.warnings[a.name] + sel["notes"],
            "validation": summarize_validation([r for r, _ in pairs]) if a.backend == "hip" else None,
            "selection": sel["points"],
        }
    return results, report
