"""Build stage 3, validate: every code object of a plan checked statically
(cached ones too): the compile metadata, then, for AMD, the ELF + AMDGPU
metadata (codeobject.py), whose numbers go into each record's stats. A
broken code object fails the build; a resource finding (spills, scratch,
LDS) only makes that candidate ineligible unless its config waives it
(``allow = {...}``). Build-time only.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ...common.archive import KernelRecord
from ...core.kernel_spec import SCRATCH_ARGS, Variant
from .compile import Compiled
from .plan import BuildPlan
from .triton_compile import shared_memory_finding, validate_output

__all__ = ["Validation", "validate_plan", "kernel_record"]

# (arch, variant key) -> (validator stats, resource findings [(kind, message)])
Checked = Dict[Tuple[str, str], Tuple[Dict[str, Any], List[Tuple[str, str]]]]


@dataclass
class Validation:
    checked: Checked = field(default_factory=dict)
    errors: List[str] = field(default_factory=list)


def kernel_record(v: Variant, meta: Dict[str, Any],
                  extra_stats: Optional[Dict[str, Any]] = None) -> KernelRecord:
    """The archive's record of variant ``v`` compiled to ``meta``."""
    stats = dict(meta.get("stats") or {})
    if extra_stats and "occupancy" in stats:  # LLVM's figure from the assembly text
        stats["llvm_occupancy"] = stats["occupancy"]
    stats.update(extra_stats or {})
    return KernelRecord(
        key=v.key, kernel=v.kernel, functional=dict(v.functional), config=dict(v.config),
        constexprs=dict(v.constexprs), symbol=str(meta["symbol"]), num_warps=int(meta["num_warps"]),
        num_stages=int(meta["num_stages"]), warp_size=int(meta["warp_size"]), shared=int(meta["shared"]),
        global_scratch_size=int(meta["global_scratch_size"]),
        profile_scratch_size=int(meta["profile_scratch_size"]),
        args=tuple(v.args) + SCRATCH_ARGS, divisible_16=tuple(v.divisible_16), grid=tuple(v.grid),
        stats=stats)


def validate_plan(plan: BuildPlan, compiled: Compiled) -> Validation:
    """Every compiled variant of the plan against the compiler the plan
    names; AMD code objects through the ELF validator (imported only then:
    its ELF and MessagePack readers are the build extra's)."""
    out = Validation()
    for arch_spec in plan.archs:
        limits = None
        if arch_spec.backend == "hip":
            from .codeobject import ArchLimits
            limits = ArchLimits.from_spec(arch_spec)
        for v, t in plan.items[arch_spec.name]:
            if t.cache_key not in compiled.results:
                continue  # did not compile: already an error
            meta, code = compiled.results[t.cache_key]
            problems = validate_output(meta, code, backend=arch_spec.backend, arch=arch_spec.name,
                                       triton_version=plan.triton_version)
            stats: Dict[str, Any] = {}
            resources: List[Tuple[str, str]] = []
            if limits is not None and not any("not an ELF" in p for p in problems):
                from .codeobject import validate_kernel
                val = validate_kernel(code, kernel_record(v, meta), limits,
                                      code_object_version=plan.profile.code_object_version,
                                      allow=v.allow)
                found = {m for _, m in val.resources}
                problems.extend(p for p in val.problems if p not in found)
                resources = val.resources
                stats = dict(val.stats, allowed=val.allowed) if val.allowed else val.stats
            elif limits is None:
                finding = shared_memory_finding(meta, arch_spec.name, arch_spec.max_shared_bytes)
                if finding:
                    resources = [("lds", finding)]
            out.checked[(arch_spec.name, v.key)] = (stats, resources)
            out.errors.extend(f"{arch_spec.name} {v.key}: {p}" for p in problems)
    return out
