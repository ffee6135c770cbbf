"""Build stage 4, select: per (arch, functional point, sequence-length
bucket) the candidate configs that ship (tuning.py: measured data where
there is some, the static cost model otherwise), among those that compiled
and passed validation. Build-time only.
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

from .plan import BuildPlan
from .validate import Validation
from .triton_compile import CompileTask
from ..common.targets import ArchSpec
from .tuning import (COST_MODEL, SEQLEN_BUCKETS, Candidate, TuningError, choose, choose_decode, grid_axis,
                     load_measured, losses)
from ...core.kernel_spec import Variant

__all__ = ["select_shipped"]


def select_shipped(plan: BuildPlan, validation: Validation) -> Tuple[Dict[str, Dict[str, Any]], List[str]]:
    """Per arch: the chosen keys, the manifest's "tuning" section, the
    shipped exceptions, the rejected candidates, how many choices were
    measured/static and every candidate with why it lost (``points``, for
    the build report); and one error per functional point where nothing can
    ship."""
    errors: List[str] = []
    selection = {a.name: _select(a, plan.items[a.name], validation.checked, plan.spec,
                                 load_measured(plan.sources.kernels_dir, a.name), errors)
                 for a in plan.archs}
    return selection, errors


def _functional_text(functional: Dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in functional.items())


def _select(a: ArchSpec, items: Sequence[Tuple[Variant, CompileTask]],
            checked: Dict[Tuple[str, str], Tuple[Dict[str, Any], List[Tuple[str, str]]]],
            spec, measured, errors: List[str]) -> Dict[str, Any]:
    """Choose the shipped candidates of one arch (tuning.choose per functional
    point); appends to ``errors`` where nothing can ship. Returns the chosen
    keys, the manifest's "tuning" section, the shipped exceptions, the
    rejected candidates, how many choices were measured/static and the
    candidates of every point with why each lost per run."""
    groups: Dict[Tuple[str, Tuple], List[Variant]] = {}
    cache_key_of: Dict[str, str] = {}
    for v, t in items:
        groups.setdefault((v.kernel, tuple(v.functional.items())), []).append(v)
        cache_key_of[v.key] = t.cache_key
    chosen: set = set()
    choices: List[Dict[str, Any]] = []
    points: List[Dict[str, Any]] = []
    rejected: List[Dict[str, Any]] = []
    counts = {"measured": 0, "static": 0}
    notes: List[str] = []
    axes: Dict[str, str] = {}
    cand_of: Dict[str, Candidate] = {}
    for (kname, _), vs in groups.items():
        axis, tile = grid_axis(spec.kernels[kname].grid)
        axes[kname] = axis or "seqlen_q"
        cands = []
        for i, v in enumerate(vs):
            if (a.name, v.key) not in checked:
                continue  # did not compile: already an error
            stats, resources = checked[(a.name, v.key)]
            rows = int(v.config.get(tile, 1)) if tile else 1
            cols = 1
            for k, val in v.config.items():
                if k.startswith("BLOCK_") and k != tile and isinstance(val, int):
                    cols *= val
            c = Candidate(key=v.key, config=dict(v.config), order=i, rows=rows, cols=cols,
                          num_warps=int(v.options.get("num_warps", 4)), occupancy=stats.get("occupancy"),
                          scratch=int(stats.get("private_segment_fixed_size") or 0),
                          findings=list(resources), waived=dict(v.allow), seqlen_max=v.seqlen_max)
            cands.append(c)
            cand_of[v.key] = c
        if not cands:
            continue
        func = vs[0].functional
        try:
            runs = choose(cands, kernel=kname, functional=func, measured=measured, notes=notes)
            decode = choose_decode(cands, kernel=kname, functional=func, measured=measured, notes=notes)
        except TuningError as e:
            errors.append(f"{a.name} {kname} [{_functional_text(func)}]: {e}")
            continue
        except ValueError:
            why = "; ".join(f"{c.key.rsplit('|', 1)[-1]}: {', '.join(m for _, m in c.unwaived)}" for c in cands)
            errors.append(
                f"{a.name} {kname} [{_functional_text(func)}]: no candidate config can ship ({why}); "
                f"add a config that fits to [[kernels.{kname}.configs]] for {a.name} in "
                f"kernels/variants.toml, or waive the finding on one with "
                f"allow = {{spills = true, reason = \"...\"}} (kinds: spills, scratch, lds)")
            continue
        for _, key, source in runs + ([decode] if decode else []):
            chosen.add(key)
            counts[source] += 1
        choice = {"kernel": kname, "functional": dict(func), "select": runs}
        point = _point(kname, func, cands, runs, cache_key_of)
        if decode:
            choice["decode"] = point["decode"] = decode
        choices.append(choice)
        points.append(point)
        for c in cands:
            if c.key not in chosen and c.findings:
                rejected.append({"key": c.key, "findings": [m for _, m in c.unwaived]})
    exceptions = [{"key": key, "kind": kind, "finding": msg, "reason": reason}
                  for key in sorted(chosen) for kind, msg, reason in cand_of[key].exceptions]
    manifest = {"schema": 1, "cost_model": COST_MODEL, "seqlen_buckets": list(SEQLEN_BUCKETS),
                "axes": axes, "measured": measured.how if measured.path else None, "choices": choices}
    return {"chosen": chosen, "manifest": manifest, "exceptions": exceptions, "rejected": rejected,
            "counts": counts, "points": points, "notes": notes}


def _point(kernel: str, functional: Dict[str, Any], cands: Sequence[Candidate],
           runs: Sequence[Sequence[Any]], cache_key_of: Dict[str, str]) -> Dict[str, Any]:
    """The build report's record of one functional point: its candidates
    (variant key, cache key: the report reads their code objects from
    OUT/cache) and per run of the choice, why each candidate lost (aligned
    with "candidates", null for the one chosen)."""
    why = losses(cands, runs)
    return {"kernel": kernel, "functional": dict(functional),
            "candidates": [{"key": c.key, "cache_key": cache_key_of[c.key]} for c in cands],
            "select": [[bound, key, source, [w.get(c.key) for c in cands]]
                       for (bound, key, source), w in zip(runs, why)]}
