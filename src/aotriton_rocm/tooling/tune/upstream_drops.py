"""The drops of the upstream import (upstream.py): the (arch, kernel, point,
config)s of upstream's tuning that spill or overflow in our kernels, so are
left out. How they are keyed, read from and merged into the drops file, and
found: ``check_spills`` compiles and validates every candidate that sets an
AMD option, as the build does. Build-time only."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

__all__ = ["point_key", "dropped_key", "drops_by_key", "load_drops", "merge_drops", "AMD_OPTIONS",
           "uses_amd_options", "check_spills"]


def point_key(kernel: str, point: Mapping[str, Any]) -> str:
    return kernel + "|" + ",".join(f"{k}={point[k]}" for k in sorted(point))


def dropped_key(arch: str, kernel: str, point: Mapping[str, Any], config: Mapping[str, Any]) -> str:
    return f"{arch}|{point_key(kernel, point)}|" + ",".join(f"{k}={config[k]}" for k in sorted(config))


def drops_by_key(drops: Iterable[Mapping[str, Any]]) -> Dict[str, str]:
    """``{key: why}`` of drops in the file's form: ``{"arch", "kernel",
    "functional", "config", "why"}``."""
    out = {}
    for d in drops:
        point = {k: v[0] if isinstance(v, list) else v for k, v in d["functional"].items()}
        out[dropped_key(d["arch"], d["kernel"], point, d["config"])] = d["why"]
    return out


def load_drops(path: Optional[Path]) -> Dict[str, str]:
    """``{key: why}`` from a drops file (:func:`check_spills` finds them): a
    JSON list of ``{"arch", "kernel", "functional", "config", "why"}``."""
    if path is None or not Path(path).is_file():
        return {}
    return drops_by_key(json.loads(Path(path).read_text(encoding="utf-8")))


def merge_drops(earlier: Sequence[Dict[str, Any]], found: Sequence[Dict[str, Any]],
                archs: Sequence[str], only: Sequence[str]) -> List[Dict[str, Any]]:
    """The drops file after a check of ``archs`` (within ``only``): the
    earlier drops of what it did not check (other archs, or outside
    ``only``), then what it found; sorted."""
    merged = [d for d in earlier if d["arch"] not in archs or not _in_subset(d, only)]
    merged += [d for d in found if "error" not in d and d not in merged]
    merged.sort(key=lambda d: (d["arch"], d["kernel"], json.dumps(d["functional"], sort_keys=True),
                               json.dumps(d["config"], sort_keys=True)))
    return merged


def _in_subset(drop: Mapping[str, Any], only: Sequence[str]) -> bool:
    from ..builder.plan import Subset
    point = {k: v[0] for k, v in drop["functional"].items()}
    return Subset.parse(only).accepts_point(drop["kernel"], point)


AMD_OPTIONS = ("waves_per_eu", "matrix_instr_nonkdim", "kpack")


def uses_amd_options(config: Mapping[str, Any]) -> bool:
    """Does a config set one of the AMD backend's options or PRE_LOAD_V?"""
    return any(k in config for k in AMD_OPTIONS) or bool(config.get("PRE_LOAD_V"))


def check_spills(archs: Sequence[str], *, kernels_dir: Path, targets_path: Path, out: Path,
                 jobs: Optional[int] = None, only: Sequence[str] = ()) -> List[Dict[str, Any]]:
    """Compile and validate, per arch, every candidate (tuning file and
    variants.toml) that sets an AMD option or PRE_LOAD_V, as the build does;
    returns the ones with an unwaived validator finding (a spill, scratch,
    LDS), in the drops file's form; ``only``: ``build --only``'s subset.
    Build-time: needs the pinned triton."""
    from ..builder.cache import CompileCache
    from ..builder.compile import Executor, compile_plan
    from ..builder.plan import Sources, Subset, plan_build
    from ..builder.validate import validate_plan
    from ..common.targets import TargetError, load_targets
    sources = Sources.find(kernels_dir=kernels_dir, targets_path=targets_path)
    targets = load_targets(Path(targets_path))
    found: List[Dict[str, Any]] = []
    for arch in archs:
        try:
            targets.resolve(None, [arch])
            profile = None
        except TargetError:
            profile = "7.2"
        plan = plan_build(profile, [arch], sources, Subset.parse(only))
        declared = {v.key for v in plan.spec.variants_for(plan.archs[0])}  # variants.toml's own
        mine = [t.cache_key for v, t in plan.items[arch] if uses_amd_options(v.config)]
        plan = plan.restricted_to(mine)
        compiled = compile_plan(plan, CompileCache(Path(out) / "cache"), Path(out), Executor(jobs=jobs))
        validation = validate_plan(plan, compiled)
        for v, _ in plan.items[arch]:
            stats, resources = validation.checked.get((arch, v.key), ({}, []))
            bad = [m for k, m in resources if k not in v.allow]
            if bad and v.key in declared:
                found.append({"arch": arch, "error": f"{v.key}: a variants.toml config with AMD "
                              f"options does not ship here: {'; '.join(bad)}"})
            elif bad:
                found.append({"arch": arch, "kernel": v.kernel,
                              "functional": {k: [x] for k, x in v.functional.items()},
                              "config": dict(v.config), "why": "; ".join(bad)})
        found.extend({"arch": arch, "error": e} for e in validation.errors + compiled.errors
                     if isinstance(e, str))
        print(f"{arch}: {len(mine)} candidates with AMD options checked", file=sys.stderr)
    return found
