"""``aotriton-rocm report BUILD_DIR``: the AMD static speed report of a build.

Build-time only. For every shipped kernel of each AMD archive of a build
output (``OUT/archives``, ``OUT/build-report.json``, ``OUT/cache``) the
figures that predict its speed, read from the code objects themselves:
occupancy (waves per SIMD, from registers and LDS: codeobject.py), VGPR,
AGPR, LDS bytes, spills, and what one iteration of its hot loop issues (MFMA
instructions, all instructions, global loads, LDS reads/writes, waits:
amdgcn.py, recorded at compile time); beneath each, the candidate configs
it was chosen over, with the same figures and why they lost (the build
report's ``selection``; their code objects are in ``OUT/cache``).

``--against OTHER_BUILD_DIR`` compares the shipped choice of every
(arch, kernel, functional point, seqlen bucket) with another build's and
lists those whose occupancy, registers, LDS, spills or MFMA per iteration
changed: a change that hurts AMD is visible without AMD hardware.
``--fail-on-worse`` makes a worse figure the exit status (1).
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, TextIO, Tuple

from ...archive import ARCHIVE_SUFFIX, Archive, ArchiveError
from ...errors import CommandError, UsageError
from .plan import Subset
from .cache import CompileCache
from .codeobject import ArchLimits, CodeObjectError, estimate_occupancy, inspect_code_object
from ..common.tables import render_table

__all__ = ["Figures", "Candidate", "ShippedChoice", "ArchReport", "Change", "read_build",
           "code_object_figures", "format_report", "compare", "format_changes", "ReportOptions",
           "add_report_arguments", "run_report"]

REPORT_NAME = "build-report.json"


class ReportError(UsageError):
    """The directory is not a build output the report can read."""


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


def _read_json(path: Path) -> Dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ReportError(f"{path.parent} has no {path.name}: pass the --out directory of "
                          f"`aotriton-rocm build` (or merge)") from None
    except (OSError, ValueError) as e:
        raise ReportError(f"{path}: unreadable ({e})") from None
    if not isinstance(doc, dict):
        raise ReportError(f"{path}: not a build report")
    return doc


def _config_of(key: str) -> Dict[str, Any]:
    """The config part of a variant key (``...|BLOCK_M=128,BLOCK_N=64,num_warps=4``)."""
    out: Dict[str, Any] = {}
    for item in key.rsplit("|", 1)[-1].split(","):
        k, _, v = item.partition("=")
        out[k] = int(v) if v.lstrip("-").isdigit() else v
    return out


class _Sources:
    """Code objects of one arch: shipped ones from the archive, the other
    candidates from the build's cache."""

    def __init__(self, archive: Archive, cache: Optional[CompileCache], limits: ArchLimits):
        self.archive = archive
        self.records = {r.key: r for r in archive.kernels}
        self.cache = cache
        self.limits = limits

    def candidate(self, key: str, cache_key: Optional[str]) -> Candidate:
        r = self.records.get(key)
        if r is not None:
            fig = code_object_figures(self.archive.code_object(r), r.symbol, r.num_warps, r.shared,
                                      self.limits, r.stats or {})
            return Candidate(key=key, config=dict(r.config), figures=fig)
        hit = self.cache.get(cache_key) if self.cache is not None and cache_key else None
        if hit is None:
            return Candidate(key=key, config=_config_of(key), figures=None,
                             missing="not in the build's cache (cleaned?)")
        meta, code = hit
        fig = code_object_figures(code, str(meta["symbol"]), int(meta["num_warps"]),
                                  int(meta.get("shared", 0)), self.limits, meta.get("stats") or {})
        return Candidate(key=key, config=_config_of(key), figures=fig)


def _runs(select: Sequence[Sequence[Any]], buckets: Sequence[int]):
    """(lower, bounds, key, source) per run of a manifest choice: the run
    covers lower < seqlen <= bounds[-1] (None: no upper bound)."""
    every: List[Optional[int]] = list(buckets) + [None]
    start = 0
    for run in select:
        bound, key, source = run[0], run[1], run[2]
        end = every.index(bound) + 1
        lower = 0 if start == 0 else int(every[start - 1])
        yield lower, every[start:end], key, source
        start = end


def _point_choices(arch: str, choice: Mapping[str, Any], point: Mapping[str, Any], src: _Sources,
                   tuning: Mapping[str, Any]) -> List[ShippedChoice]:
    """One functional point: per run of its manifest choice the shipped
    config and the other candidates (``point``: the build report's record,
    empty for builds that did not record it) with why they lost there."""
    kernel, func = choice["kernel"], dict(choice["functional"])
    cands = list(point.get("candidates") or ())
    loaded = {c["key"]: src.candidate(c["key"], c.get("cache_key")) for c in cands}
    recorded = list(point.get("select") or ())
    out = []
    runs = _runs(choice["select"], tuning.get("seqlen_buckets") or [])
    for i, (lower, bounds, key, source) in enumerate(runs):
        same = i < len(recorded) and recorded[i][1] == key
        why = recorded[i][3] if same else [None] * len(cands)
        chosen = loaded.get(key) or src.candidate(key, None)
        others = [replace(loaded[c["key"]], why=w) for c, w in zip(cands, why) if c["key"] != key]
        out.append(ShippedChoice(arch=arch, kernel=kernel, functional=func,
                                 axis=str((tuning.get("axes") or {}).get(kernel, "seqlen_q")),
                                 lower=lower, bounds=list(bounds), source=source, chosen=chosen,
                                 others=others))
    return out


def _arch_report(arch: str, out: Path, per_arch: Mapping[str, Any], only: Subset) -> Optional[ArchReport]:
    """The report of one arch's archive; None for a non-AMD one."""
    ap = out / str(per_arch.get("archive") or f"archives/{arch}{ARCHIVE_SUFFIX}")
    try:
        archive = Archive.open(ap)
    except ArchiveError as e:
        raise ReportError(f"{arch}: {e}") from None
    m = archive.manifest
    if m.get("backend") != "hip" or not m.get("arch_limits"):
        return None
    cache_dir = out / "cache"
    src = _Sources(archive, CompileCache(cache_dir) if cache_dir.is_dir() else None,
                   ArchLimits.from_dict(m["arch_limits"]))
    tuning = m.get("tuning") or {}
    choices = list(tuning.get("choices") or ())
    if only:
        only.check_names([SimpleNamespace(kernel=c["kernel"], functional=c["functional"]) for c in choices])
        choices = [c for c in choices
                   if only.accepts(SimpleNamespace(kernel=c["kernel"], functional=c["functional"]))]
    selection = per_arch.get("selection")
    points = {(p["kernel"], functional_text(p["functional"])): p for p in selection or ()}
    rep = ArchReport(arch=arch, archive=str(ap), candidates_recorded=selection is not None)
    for ch in choices:
        point = points.get((ch["kernel"], functional_text(ch["functional"]))) or {}
        rep.choices.extend(_point_choices(arch, ch, point, src, tuning))
    return rep


def read_build(out_dir, archs: Optional[Sequence[str]] = None, only: Sequence[str] = ()) -> List[ArchReport]:
    """The report of every AMD archive of build output ``out_dir`` (or of
    ``archs``), limited to the functional points ``only`` accepts (``build
    --only`` syntax)."""
    out = Path(out_dir)
    doc = _read_json(out / REPORT_NAME)
    per = doc.get("per_arch") or {}
    if doc.get("status") != "ok" or not per:
        raise ReportError(f"{out / REPORT_NAME}: the build did not finish (status "
                          f"{doc.get('status')!r}): no archives to report on")
    subset = Subset.parse(only)
    wanted = list(per) if not archs else list(archs)
    unknown = [a for a in wanted if a not in per]
    if unknown:
        raise ReportError(f"{out} has no archive for {', '.join(unknown)}; it has {', '.join(per)}")
    reports = []
    for arch in wanted:
        rep = _arch_report(arch, out, per[arch], subset)
        if rep is not None:
            reports.append(rep)
        elif archs:
            raise ReportError(f"{arch} is not an AMD arch: the report reads AMD code objects only")
    if not reports:
        raise ReportError(f"{out} has no AMD archive (archs: {', '.join(per)})")
    if subset and not any(r.choices for r in reports):
        raise ReportError(f"--only {subset.text()} matches none of the shipped kernels in {out}")
    return reports


# -- tables ------------------------------------------------------------------

_HEADER = ("kernel", "point", "bucket", "config", "occ", "VGPR", "AGPR", "LDS", "spills v/s",
           "scratch", "MFMA/iter", "instr/iter", "gload", "ds r/w", "waits", "choice / why not")

LEGEND = """\
config: BLOCK_* tile, w = num_warps, s = num_stages; AMD options: wpe = waves_per_eu, nk =
matrix_instr_nonkdim, kp = kpack, preV = V loaded before the QK dot (PRE_LOAD_V). occ: waves per SIMD (the lower of the
register and the LDS limit). VGPR: architectural VGPRs (rounded up to 4 on gfx90a/gfx942/gfx950,
whose VGPRs and AGPRs share one 512-entry file); AGPR: accumulation registers. spills v/s: VGPRs
spilled (on CDNA into AGPRs first) / SGPRs spilled (into VGPR lanes); scratch: bytes per lane.
MFMA/iter (WMMA on RDNA), instr/iter, gload (global/buffer loads), ds r/w (LDS reads/writes),
waits (s_waitcnt): one iteration of the hot loop, the innermost loop with the most MFMAs (?:
compiled before the build recorded it)."""


def _n(v: Optional[int]) -> str:
    return "?" if v is None else str(v)


def _figure_cells(f: Optional[Figures]) -> Tuple[str, ...]:
    if f is None:
        return ("-",) * 11
    return (str(f.occupancy), str(f.vgpr), str(f.agpr), str(f.lds), f"{f.vgpr_spills}/{f.sgpr_spills}",
            str(f.scratch), _n(f.matrix_per_iter), _n(f.per_iter("instructions")),
            _n(f.per_iter("global_loads")),
            "?" if not f.loop_known else f"{f.per_iter('ds_reads')}/{f.per_iter('ds_writes')}",
            _n(f.per_iter("waitcnt")))


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def format_arch(rep: ArchReport) -> str:
    rows = []
    for c in rep.choices:
        rows.append((c.kernel, functional_text(c.functional), bucket_text(c.axis, c.lower, c.bounds[-1]),
                     config_text(c.chosen.config), *_figure_cells(c.chosen.figures),
                     f"chosen ({c.source})"))
        for o in c.others:
            rows.append(("", "", "", "vs " + config_text(o.config), *_figure_cells(o.figures),
                         o.missing or o.why or "-"))
    n_cands = len({o.key for c in rep.choices for o in c.others} | {c.chosen.key for c in rep.choices})
    head = (f"{rep.arch} ({rep.archive}): {_count(rep.shipped, 'shipped kernel')} in "
            f"{_count(len(rep.choices), 'bucket run')}, {_count(n_cands, 'candidate')}")
    if not rep.candidates_recorded:
        head += " (the build report lists no candidates: built before they were recorded)"
    return head + "\n" + render_table(_HEADER, rows, left=(0, 1, 2, 3, -1))


def format_report(reports: Sequence[ArchReport]) -> str:
    return "\n\n".join([format_arch(r) for r in reports] + [LEGEND])


def report_json(reports: Sequence[ArchReport]) -> List[Dict[str, Any]]:
    def cand(c: Candidate) -> Dict[str, Any]:
        d = {"key": c.key, "config": c.config, "why": c.why, "missing": c.missing,
             "figures": asdict(c.figures) if c.figures else None}
        return d
    return [{"arch": r.arch, "archive": r.archive, "shipped": r.shipped,
             "candidates_recorded": r.candidates_recorded,
             "choices": [{"kernel": c.kernel, "functional": c.functional, "axis": c.axis,
                          "lower": c.lower, "bounds": c.bounds, "source": c.source,
                          "chosen": cand(c.chosen), "others": [cand(o) for o in c.others]}
                         for c in r.choices]} for r in reports]


# -- diff between two builds -------------------------------------------------

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


# -- the command ---------------------------------------------------------------

@dataclass(frozen=True)
class ReportOptions:
    build_dir: Path
    archs: Tuple[str, ...] = ()
    only: Tuple[str, ...] = ()
    json: Optional[Path] = None
    against: Optional[Path] = None
    fail_on_worse: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "ReportOptions":
        archs = tuple(a.strip() for text in (args.arch or ()) for a in text.split(",") if a.strip())
        return cls(build_dir=Path(args.build_dir), archs=archs, only=tuple(args.only or ()),
                   json=Path(args.json) if args.json else None,
                   against=Path(args.against) if args.against else None,
                   fail_on_worse=args.fail_on_worse)


def add_report_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("build_dir", metavar="BUILD_DIR",
                        help="output directory of `aotriton-rocm build` or `merge` (archives/, cache/, "
                             "build-report.json)")
    parser.add_argument("--arch", dest="arch", action="append", default=None, metavar="ARCHS",
                        help="comma-separated AMD archs to report (default: every AMD archive)")
    parser.add_argument("--only", dest="only", action="append", default=None,
                        metavar="NAME=VALUE[|VALUE],...",
                        help="only these functional points (build --only syntax), e.g. "
                             "kernel=attn_fwd,head_dim=128")
    parser.add_argument("--json", dest="json", default=None, metavar="FILE",
                        help="also write the report (and the diff) as JSON")
    parser.add_argument("--against", dest="against", default=None, metavar="OTHER_BUILD_DIR",
                        help="list the shipped kernels whose occupancy, VGPR+AGPR, LDS, spills or "
                             "MFMA/iter differ from another build's")
    parser.add_argument("--fail-on-worse", dest="fail_on_worse", action="store_true",
                        help="with --against: exit 1 if a figure got worse (occupancy dropped, "
                             "registers, LDS or spills grew)")
    return parser


def run_report(options: ReportOptions, stream: Optional[TextIO] = None) -> int:
    """Print the report (and the diff); CommandError for an unreadable build
    output (2) or, with --fail-on-worse, a worse figure (1)."""
    out = stream or sys.stdout
    if options.fail_on_worse and options.against is None:
        raise UsageError("--fail-on-worse needs --against OTHER_BUILD_DIR")
    try:
        reports = read_build(options.build_dir, options.archs, options.only)
        older = None
        if options.against is not None:
            mine = {r.arch for r in reports}
            older = [r for r in read_build(options.against, None, options.only) if r.arch in mine]
    except (ArchiveError, CodeObjectError) as e:
        raise ReportError(str(e)) from None
    print(format_report(reports), file=out)
    changes = compare(older, reports) if older is not None else None
    if changes is not None:
        print("\n" + format_changes(changes, str(options.against)), file=out)
    if options.json:
        doc: Dict[str, Any] = {"build_dir": str(options.build_dir), "archs": report_json(reports)}
        if changes is not None:
            doc["against"] = str(options.against)
            doc["changes"] = changes_json(changes)
        options.json.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        print(f"json: {options.json}", file=out)
    if options.fail_on_worse and changes and any(c.worse for c in changes):
        raise CommandError(f"{sum(1 for c in changes if c.worse)} shipped kernel(s) got worse "
                           f"against {options.against} (see above)")
    return 0
