"""``aotriton-rocm report --against OTHER_BUILD``: the shipped kernels whose
figures changed between two builds (occupancy, registers, LDS, spills,
scratch, MFMA per iteration), and whether for the worse. Build-time only.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from ..common.tables import render_table
from .report_model import ArchReport, Candidate, Figures, ShippedChoice, bucket_text, config_text

__all__ = ["Change", "compare", "format_changes", "changes_json"]


# (name, Figures -> value, worse when it ...): the figures the diff watches
_WATCHED: Tuple[Tuple[str, Any, str], ...] = (
    ("occupancy", lambda f: f.occupancy, "drops"),
    ("VGPR+AGPR", lambda f: f.registers, "grows"),
    ("LDS", lambda f: f.lds, "grows"),
    ("VGPR spills", lambda f: f.vgpr_spills, "grows"),
    ("scratch", lambda f: f.scratch, "grows"),
    ("MFMA/iter", lambda f: f.matrix_per_iter, "changes"),
)


@dataclass
class Change:
    """One (arch, kernel, point) over a run of buckets whose shipped choice's
    figures differ between the two builds. ``old``/``new``: None where the
    point (or bucket) exists in one build only."""

    arch: str
    kernel: str
    point: str
    axis: str
    lower: int
    upper: Optional[int]
    old: Optional[Candidate]
    new: Optional[Candidate]
    changes: List[str] = field(default_factory=list)
    worse: bool = False


BucketKey = Tuple[str, str, str, Optional[int]]  # arch, kernel, point, bucket bound


def _by_bucket(reports: Iterable[ArchReport]) -> Dict[BucketKey, Tuple[ShippedChoice, int]]:
    """Each bucket's shipped choice and the bucket's lower bound."""
    out = {}
    for r in reports:
        for c in r.choices:
            lower = c.lower
            for b in c.bounds:
                out[(*c.point, b)] = (c, lower)
                lower = b if b is not None else lower
    return out


def _compare_figures(old: Optional[Figures], new: Optional[Figures]) -> Tuple[List[str], bool]:
    if old is None or new is None:
        return (["figures unknown (code object not in the cache)"], False) if old is not new else ([], False)
    texts, worse = [], False
    for name, get, bad in _WATCHED:
        a, b = get(old), get(new)
        if a == b or a is None or b is None:
            continue
        is_worse = (bad == "drops" and b < a) or (bad == "grows" and b > a)
        worse = worse or is_worse
        texts.append(f"{name} {a} -> {b}" + (" (worse)" if is_worse else ""))
    return texts, worse


def compare(old: Sequence[ArchReport], new: Sequence[ArchReport]) -> List[Change]:
    """Every bucket whose shipped figures changed from ``old`` to ``new``
    (watched: occupancy, VGPR+AGPR, LDS, VGPR spills, scratch, MFMA/iter), or whose point
    exists in one build only; consecutive buckets with the same change
    merged."""
    a, b = _by_bucket(old), _by_bucket(new)
    order = sorted(set(a) | set(b), key=lambda k: (k[0], k[1], k[2], float("inf") if k[3] is None else k[3]))
    out: List[Change] = []
    for key in order:
        oc, nc = a.get(key), b.get(key)
        ref, lower = (nc or oc)
        if oc is None or nc is None:
            texts, worse = ["only in this build" if oc is None else "gone from this build"], False
        else:
            texts, worse = _compare_figures(oc[0].chosen.figures, nc[0].chosen.figures)
        if not texts:
            continue
        oldc = oc[0].chosen if oc else None
        newc = nc[0].chosen if nc else None
        prev = out[-1] if out else None
        if (prev is not None and (prev.arch, prev.kernel, prev.point) == key[:3] and prev.upper == lower
                and prev.changes == texts and _same_key(prev.old, oldc) and _same_key(prev.new, newc)):
            prev.upper = key[3]
            continue
        out.append(Change(arch=key[0], kernel=key[1], point=key[2], axis=ref.axis, lower=lower,
                          upper=key[3], old=oldc, new=newc, changes=texts, worse=worse))
    return out


def _same_key(x: Optional[Candidate], y: Optional[Candidate]) -> bool:
    return (x.key if x else None) == (y.key if y else None)


def format_changes(changes: Sequence[Change], old_dir: str) -> str:
    if not changes:
        return (f"against {old_dir}: no shipped kernel's occupancy, registers, LDS, spills or "
                f"MFMA/iter changed")
    rows = []
    for c in changes:
        cfg_old = config_text(c.old.config) if c.old else "-"
        cfg_new = config_text(c.new.config) if c.new else "-"
        rows.append((c.arch, c.kernel, c.point, bucket_text(c.axis, c.lower, c.upper),
                     cfg_new if cfg_old == cfg_new else f"{cfg_old} -> {cfg_new}",
                     "worse" if c.worse else "changed", "; ".join(c.changes)))
    worse = sum(1 for c in changes if c.worse)
    return (f"against {old_dir}: {len(changes)} change(s), {worse} worse\n"
            + render_table(("arch", "kernel", "point", "bucket", "config (old -> new)", "verdict", "what"),
                           rows, left=(0, 1, 2, 3, 4, 5, 6)))


def changes_json(changes: Sequence[Change]) -> List[Dict[str, Any]]:
    def side(c: Optional[Candidate]) -> Optional[Dict[str, Any]]:
        return None if c is None else {"key": c.key, "config": c.config,
                                       "figures": asdict(c.figures) if c.figures else None}
    return [{"arch": c.arch, "kernel": c.kernel, "point": c.point, "axis": c.axis, "lower": c.lower,
             "upper": c.upper, "old": side(c.old), "new": side(c.new), "changes": c.changes,
             "worse": c.worse} for c in changes]
