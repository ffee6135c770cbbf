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
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, List, Mapping, Optional, Sequence, TextIO, Tuple

from ...common.archive import ARCHIVE_SUFFIX, Archive, ArchiveError
from ...common.errors import CommandError, UsageError
from .plan import Subset
from .cache import CompileCache
from .codeobject import ArchLimits, CodeObjectError
from .report_diff import Change, changes_json, compare, format_changes
from .report_model import (ArchReport, Candidate, Figures, ShippedChoice, bucket_text, code_object_figures,
                           config_text, functional_text)
from ..common.tables import render_table

__all__ = ["Figures", "Candidate", "ShippedChoice", "ArchReport", "Change", "read_build",
           "code_object_figures", "format_report", "compare", "format_changes", "ReportOptions",
           "add_report_arguments", "run_report"]

REPORT_NAME = "build-report.json"


class ReportError(UsageError):
    """The directory is not a build output the report can read."""


def _read_json(path: Path) -> Dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        up = path.parent.parent / path.name
        hint = (f"pass {up.parent}, the --out of the build that wrote {path.parent}" if
                up.is_file() else "pass the --out directory of `aotriton-rocm build` (or merge)")
        raise ReportError(f"{path.parent} has no {path.name}: {hint}") from None
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


# -- the command ---------------------------------------------------------------

@dataclass(frozen=True)
class ReportOptions:
    build_dir: Path
    archs: Tuple[str, ...] = ()
    only: Tuple[str, ...] = ()
    json: Optional[Path] = None
    against: Optional[Path] = None
    fail_on_worse: bool = False
    reference: bool = False  # AMD's kernels beside ours (reference_report.py)
    reference_wheel: Optional[Path] = None  # a downloaded amd-aiter wheel; None: download into the cache
    reference_cache: Optional[Path] = None
    reference_jobs: int = 1

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "ReportOptions":
        archs = tuple(a.strip() for text in (args.arch or ()) for a in text.split(",") if a.strip())
        return cls(build_dir=Path(args.build_dir), archs=archs, only=tuple(args.only or ()),
                   json=Path(args.json) if args.json else None,
                   against=Path(args.against) if args.against else None,
                   fail_on_worse=args.fail_on_worse,
                   reference=bool(args.reference or args.reference_wheel),
                   reference_wheel=Path(args.reference_wheel) if args.reference_wheel else None,
                   reference_cache=Path(args.reference_cache) if args.reference_cache else None,
                   reference_jobs=max(1, int(args.reference_jobs)))


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
    ref = parser.add_argument_group("reference (AMD's kernels beside ours; build-time input, never shipped)")
    ref.add_argument("--reference", dest="reference", action="store_true",
                     help="add the reference column: AMD's Triton attention from the amd-aiter wheel "
                          "compiled by our triton at AMD's configs, and aiter's assembly FMHA v3, beside "
                          "our gfx942/gfx950 kernels for the standard shapes, with a calibrated MI300X "
                          "TFLOP/s estimate; downloads amd-aiter (pip download --no-deps) into the cache")
    ref.add_argument("--reference-wheel", dest="reference_wheel", default=None, metavar="WHEEL",
                     help="use this downloaded amd-aiter wheel (implies --reference; for offline hosts)")
    ref.add_argument("--reference-cache", dest="reference_cache", default=None, metavar="DIR",
                     help="where the wheel, its extracted members and the compiled reference kernels are "
                          "kept (default: $AOTRITON_ROCM_REFERENCE_CACHE or ~/.cache/aotriton-rocm/reference)")
    ref.add_argument("--reference-jobs", dest="reference_jobs", default=1, type=int, metavar="N",
                     help="parallel compiles of AMD's kernels (default 1; cached after the first run)")
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
    reference = _reference(options, reports) if options.reference else None
    if reference is not None:
        from .reference_report import format_reference
        print("\n" + format_reference(reference), file=out)
    changes = compare(older, reports) if older is not None else None
    if changes is not None:
        print("\n" + format_changes(changes, str(options.against)), file=out)
    if options.json:
        doc: Dict[str, Any] = {"build_dir": str(options.build_dir), "archs": report_json(reports)}
        if changes is not None:
            doc["against"] = str(options.against)
            doc["changes"] = changes_json(changes)
        if reference is not None:
            from .reference_report import reference_json
            doc["reference"] = reference_json(reference)
        options.json.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        print(f"json: {options.json}", file=out)
    if options.fail_on_worse and changes and any(c.worse for c in changes):
        raise CommandError(f"{sum(1 for c in changes if c.worse)} shipped kernel(s) got worse "
                           f"against {options.against} (see above)")
    return 0


def _reference(options: ReportOptions, reports: Sequence[ArchReport]):
    """The reference section (reference_report.py) for the archs reported;
    the arch limits from the build's manifests, else from ci/targets.toml."""
    from .reference import ReferenceWheel, default_cache_dir, download_wheel
    from .reference_report import ARCHS, STANDARD_SHAPES, build_reference
    cache = options.reference_cache or default_cache_dir()
    wheel = ReferenceWheel.open(options.reference_wheel or download_wheel(cache), cache)
    limits = {r.arch: ArchLimits.from_dict(Archive.open(r.archive).manifest["arch_limits"]) for r in reports
              if r.arch in ARCHS}
    if not options.archs:
        try:
            from .plan import Sources
            from ..common.targets import load_targets
            targets = load_targets(Sources.find().targets_path)
            for a in ARCHS:
                if a not in limits and a in targets.archs:
                    limits[a] = ArchLimits.from_spec(targets.archs[a])
        except (UsageError, OSError):
            pass
    if "gfx942" not in limits:
        raise ReportError("--reference needs gfx942's limits: report a build with gfx942, or run it in "
                          "a checkout (ci/targets.toml)")
    return build_reference(wheel, reports, limits, cache, STANDARD_SHAPES, options.reference_jobs)
