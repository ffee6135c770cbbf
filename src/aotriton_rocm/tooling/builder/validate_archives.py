"""``aotriton-rocm validate ARCHIVE...``: statically validate every AMD code
object of built kernel archives (see :mod:`aotriton_rocm.tooling.builder.codeobject`).

Limits per arch (LDS, register file, e_flags value) and the expected code
object version come from the archive's manifest (``arch_limits``,
``code_object_version``, written by ``aotriton-rocm build``); for archives
that lack them, from ``ci/targets.toml`` (``--targets`` or the checkout).
NVIDIA archives (cubins) are listed but not validated. Exit status: 0 when
every kernel passes, 1 on any failure, 2 for unreadable input.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, TextIO, Tuple

from ..._version import ABI_VERSION
from ...common.archive import Archive, ArchiveError, identity_fix
from ...common.archive_identity import identity_problems
from ...common.errors import CommandError, UsageError
from .codeobject import ArchLimits, validate_kernel
from ..common.tables import render_table

__all__ = ["ArchReport", "validate_archives", "format_table", "format_kernel_table", "draw_chart",
           "ValidateOptions", "add_validate_arguments", "run_validate"]


@dataclass
class ArchReport:
    arch: str
    archive: str
    backend: str
    profile: str
    kernels: int = 0
    archive_bytes: int = 0
    validated: bool = True
    max_vgpr: Optional[int] = None
    max_agpr: Optional[int] = None
    max_sgpr: Optional[int] = None
    vgpr_spills: int = 0
    max_scratch: Optional[int] = None
    max_lds: Optional[int] = None
    min_occupancy: Optional[int] = None
    mfma_kernels: int = 0
    mfma_known: bool = True
    failures: List[str] = field(default_factory=list)
    allowed: List[str] = field(default_factory=list)
    per_kernel: List[Dict[str, Any]] = field(default_factory=list)
    # the archive could not be read at all (the message); failures holds it too
    unreadable: Optional[str] = None

    def to_dict(self) -> Dict[str, Any]:
        return dict(self.__dict__)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _manifest_type_problem(m: Dict[str, Any]) -> Optional[str]:
    """Why the manifest fields only ``validate`` reads (arch_limits,
    code_object_version, exceptions) have the wrong JSON types, or None."""
    lim = m.get("arch_limits")
    if lim is not None and not isinstance(lim, dict):
        return "arch_limits is not an object"
    if lim:
        for k in ArchLimits.__dataclass_fields__:
            v = lim.get(k)
            want_str = k in ("name", "vgpr_mode")
            if (k == "name" or v is not None) and not (isinstance(v, str) if want_str else _is_int(v)):
                return f"arch_limits.{k} is not {'a string' if want_str else 'an integer'}"
    cov = m.get("code_object_version")
    if cov is not None and not _is_int(cov):
        return "code_object_version is not an integer"
    exc = m.get("exceptions")
    if exc is not None and not (isinstance(exc, list) and all(isinstance(e, dict) for e in exc)):
        return "exceptions is not a list of objects"
    return None


def _limits_for(archive: Archive, targets_path: Optional[str]):
    m = archive.manifest
    bad = _manifest_type_problem(m)
    if bad:
        raise ArchiveError(f"{archive.path}: the manifest's {bad}; "
                           f"{identity_fix(archive.arch, 'build', archive.path)}")
    lim = m.get("arch_limits")
    cov = m.get("code_object_version")
    if lim:
        return ArchLimits.from_dict(lim), cov
    from ..common.source_tree import SourceTreeError, find_source_root
    from ..common.targets import TargetError, load_targets
    try:
        path = Path(targets_path) if targets_path else find_source_root() / "ci" / "targets.toml"
        targets = load_targets(path)
    except (TargetError, SourceTreeError) as e:
        raise ArchiveError(f"{archive.path}: the manifest has no arch_limits (built by an older "
                           f"aotriton-rocm) and no targets file is available: {e}") from None
    spec = targets.archs.get(archive.arch)
    if spec is None:
        raise ArchiveError(f"{archive.path}: arch {archive.arch} is not in {targets.path}; "
                           f"valid archs: {', '.join(targets.archs)}")
    if cov is None:
        prof = targets.profiles.get(str(m.get("rocm_profile")))
        cov = prof.code_object_version if prof else None
    return ArchLimits.from_spec(spec), cov


def _unreadable(path: str, message: str) -> ArchReport:
    name = Path(path).name
    arch = name[: -len(".aotr")] if name.endswith(".aotr") else name
    return ArchReport(arch=arch or "?", archive=str(path), backend="?", profile="-", validated=False,
                      failures=[message], unreadable=message)


def validate_archives(paths: Sequence[str], targets_path: Optional[str] = None) -> List[ArchReport]:
    """One :class:`ArchReport` per archive, every archive (an unreadable one
    gets a report with ``unreadable`` set). Each archive's identity (file
    name, sidecar, this aotriton-rocm's ABI line: archive_identity.identity_problems)
    is checked before its code objects."""
    reports = []
    for p in paths:
        try:
            a = Archive.open(p)  # refuses FIFOs and other non-regular files before opening
        except ArchiveError as e:
            reports.append(_unreadable(p, str(e)))
            continue
        m = a.manifest
        rep = ArchReport(arch=a.arch, archive=str(p), backend=str(m.get("backend", "hip")),
                         profile=str(m.get("rocm_profile")), kernels=len(a.kernels),
                         archive_bytes=Path(p).stat().st_size)
        reports.append(rep)
        rep.failures.extend(f"identity: {msg}" for msg in
                            identity_problems(a, p, expected_abi=ABI_VERSION, context="build"))
        if rep.backend != "hip":
            rep.validated = False
            continue
        try:
            limits, cov = _limits_for(a, targets_path)
        except ArchiveError as e:
            rep.failures.append(str(e))
            continue
        if limits.name != a.arch:
            rep.failures.append(f"manifest arch_limits are for {limits.name}, the archive is {a.arch}")
        occs = []
        # The waivers the build applied (variants.toml allow = {...}), per kernel.
        allow: Dict[str, Dict[str, str]] = {}
        for e in m.get("exceptions") or ():
            allow.setdefault(str(e.get("key")), {})[str(e.get("kind"))] = str(e.get("reason"))
        for r in a.kernels:
            try:
                code = a.code_object(r)
            except ArchiveError as e:
                rep.failures.append(f"{r.key}: {e}")
                continue
            v = validate_kernel(code, r, limits, code_object_version=cov, allow=allow.get(r.key))
            s = v.stats
            rep.failures.extend(f"{r.key}: {msg}" for msg in v.problems)
            rep.allowed.extend(f"{r.key}: {msg}" for msg in v.allowed)
            if not s:
                continue
            for attr, key in (("max_vgpr", "vgpr_count"), ("max_agpr", "agpr_count"),
                              ("max_sgpr", "sgpr_count"), ("max_scratch", "private_segment_fixed_size"),
                              ("max_lds", "lds_bytes")):
                cur = getattr(rep, attr)
                setattr(rep, attr, s[key] if cur is None else max(cur, s[key]))
            rep.vgpr_spills += s["vgpr_spill_count"]
            occs.append(s["occupancy"])
            # MFMA use cannot be read from the metadata: it is recorded at build
            # time from triton's assembly text (stats["mfma"]).
            st = r.stats or {}
            mfma = st.get("mfma")
            matrix = bool(mfma) or bool(st.get("wmma"))
            if mfma is None:
                rep.mfma_known = False
            elif matrix:
                rep.mfma_kernels += 1
            rep.per_kernel.append({"key": r.key, "kernel": r.kernel, "functional": dict(r.functional),
                                   "ok": v.ok, "problems": v.problems, "allowed": v.allowed,
                                   "mfma": mfma, "wmma": st.get("wmma"), **s})
        rep.min_occupancy = min(occs) if occs else None
    for rep in reports:
        if not rep.failures:
            rep.failures.extend(c_reader_failures(Path(rep.archive)))
    return reports


def c_reader_failures(path: Path) -> List[str]:
    """What the runtime's C reader (libaotriton_rocm) refuses in an archive
    the Python checks passed; a library that does not load is a failure
    too: no archive passes unread by the reader the GPU calls use."""
    from ...commands.install_checks import library_error, native_problems

    problems = native_problems(path)
    if problems is None:
        return [f"C reader: not checked, libaotriton_rocm did not load ({library_error()}): "
                f"install aotriton-rocm with its native library (pip install -e . in a "
                f"checkout) or point AOTRITON_ROCM_NATIVE_LIB at a built libaotriton_rocm"]
    return [f"C reader: {msg}" for msg in problems]


def _cell(v: Any) -> str:
    return "-" if v is None else str(v)


def format_table(reports: Sequence[ArchReport]) -> str:
    rows = [("arch", "profile", "kernels", "worst VGPR", "worst AGPR", "worst SGPR", "spills",
             "scratch", "max LDS", "min occ", "MFMA/WMMA", "verdict")]
    for r in reports:
        if not r.validated:
            verdict = ("FAIL (unreadable)" if r.unreadable else
                       f"FAIL ({len(r.failures)}), not validated ({r.backend})" if r.failures else
                       f"not validated ({r.backend})")
            rows.append((r.arch, r.profile, str(r.kernels), "-", "-", "-", "-", "-", "-", "-", "-",
                         verdict))
            continue
        mfma = f"{r.mfma_kernels}/{r.kernels}" if r.mfma_known else f"{r.mfma_kernels}/{r.kernels}?"
        verdict = f"FAIL ({len(r.failures)})" if r.failures else "ok"
        if r.allowed:
            verdict += f", {len(r.allowed)} allowed"
        rows.append((r.arch, r.profile, str(r.kernels), _cell(r.max_vgpr), _cell(r.max_agpr),
                     _cell(r.max_sgpr), str(r.vgpr_spills), _cell(r.max_scratch), _cell(r.max_lds),
                     _cell(r.min_occupancy), mfma, verdict))
    return render_table(rows[0], rows[1:], left=(0, 1, -1))


def format_kernel_table(report: ArchReport) -> str:
    """One archive's kernels by (kernel, dtype, head dim): how many variants
    (pad_head, bias, dropout, configs...), how many use a matrix core (MFMA on
    CDNA, WMMA on RDNA), worst VGPR/AGPR, spilled VGPRs, scratch, min
    occupancy, verdict. E.g. the MI100 (gfx908) report: MFMA and no spills
    per head dim."""
    groups: Dict[tuple, List[Dict[str, Any]]] = {}
    for k in report.per_kernel:
        f = k.get("functional") or {}
        groups.setdefault((k.get("kernel", "?"), str(f.get("dtype", "-")), f.get("head_dim", "-")), []).append(k)
    rows = [("kernel", "dtype", "head_dim", "variants", "MFMA/WMMA", "worst VGPR", "worst AGPR", "spills",
             "scratch", "min occ", "verdict")]
    for (kernel, dtype, hd), ks in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], str(kv[0][2]).zfill(5))):
        fails = sum(1 for k in ks if not k["ok"])
        allowed = sum(1 for k in ks if k.get("allowed"))
        verdict = f"FAIL ({fails})" if fails else "ok"
        if allowed:
            verdict += f", {allowed} allowed"
        mat = sum(1 for k in ks if k.get("mfma") or k.get("wmma"))
        rows.append((kernel, dtype, str(hd), str(len(ks)), f"{mat}/{len(ks)}",
                     str(max(k["vgpr_count"] for k in ks)), str(max(k["agpr_count"] for k in ks)),
                     str(sum(k["vgpr_spill_count"] for k in ks)),
                     str(max(k["private_segment_fixed_size"] for k in ks)),
                     str(min(k["occupancy"] for k in ks)), verdict))
    return render_table(rows[0], rows[1:], left=(0, 1, -1))


def draw_chart(reports: Sequence[ArchReport], path: str, build_report: Optional[Dict[str, Any]] = None) -> None:
    """A PNG of per-arch bar plots (kernels, worst VGPR, min occupancy, archive
    KiB, allowed exceptions and, with a build report, compile time), drawn
    with matplotlib (chart.py); written atomically."""
    from ...common.files import atomic_write_bytes
    from ..common.chart import BLUE, ORANGE, RED, Panel, bar_chart_png
    reps = list(reports)
    archs = [r.arch for r in reps]
    colors = [RED if r.failures else ORANGE if r.allowed else BLUE for r in reps]
    panels = [Panel("Kernels", [r.kernels for r in reps], colors, ylabel="code objects", counts=True),
              Panel("Worst VGPR use per lane", [r.max_vgpr if r.validated else None for r in reps], colors,
                    ylabel="VGPRs (AMD only)"),
              Panel("Minimum occupancy", [r.min_occupancy if r.validated else None for r in reps], colors,
                    ylabel="waves per SIMD", counts=True),
              Panel("Archive size", [r.archive_bytes / 1024 for r in reps], colors, ylabel="KiB"),
              Panel("Allowed exceptions", [len(r.allowed) if r.validated else None for r in reps], colors,
                    ylabel="kernels", counts=True)]
    if build_report:
        per = build_report.get("per_arch") or {}
        panels.append(Panel("Compile time", [(per.get(a) or {}).get("compile_seconds_all") for a in archs],
                            colors, ylabel="seconds", note="sum over all candidates"))
    png = bar_chart_png("aotriton-rocm: per-arch code-object report", archs, panels,
                        legend=[(BLUE, "ok"), (ORANGE, "ok, with allowed exceptions"), (RED, "failed")])
    atomic_write_bytes(path, png)


# -- CLI wiring -----------------------------------------------------------

def add_validate_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("archives", nargs="+", metavar="ARCHIVE", help="kernel archive files (<arch>.aotr)")
    parser.add_argument("--json", dest="json", default=None, metavar="FILE",
                        help="write the per-arch and per-kernel results as JSON")
    parser.add_argument("--chart", dest="chart", default=None, metavar="FILE.png",
                        help="draw a per-arch bar chart (PNG)")
    parser.add_argument("--by-kernel", dest="by_kernel", action="store_true",
                        help="also print, per AMD archive, a table by kernel, dtype and head dim "
                             "(MFMA/WMMA use, registers, spills, scratch, occupancy)")
    parser.add_argument("--build-report", dest="build_report", default=None, metavar="FILE",
                        help="build-report.json to take compile times from for the chart "
                             "(default: next to the archives' directory, if present)")
    parser.add_argument("--targets", dest="targets", default=None, metavar="FILE",
                        help="targets file for archives whose manifest has no arch limits")
    parser.add_argument("--verbose", "-v", action="store_true", help="list every failure")
    return parser


@dataclass(frozen=True)
class ValidateOptions:
    archives: Tuple[str, ...]
    json: Optional[str] = None
    chart: Optional[str] = None
    by_kernel: bool = False
    build_report: Optional[str] = None
    targets: Optional[str] = None
    verbose: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "ValidateOptions":
        return cls(archives=tuple(args.archives), json=args.json, chart=args.chart,
                   by_kernel=args.by_kernel, build_report=args.build_report,
                   targets=args.targets, verbose=args.verbose)


def _directory_message(d: Path) -> str:
    """validate takes archive files; where a build's are (OUT/archives/)."""
    for where in (d / "archives", d):
        if any(where.glob("*.aotr")):
            return (f"{d} is a directory: validate takes archive files; pass "
                    f"{where / '*.aotr'}")
    return (f"{d} is a directory: validate takes archive files (<arch>.aotr; a build writes "
            f"them into OUT/archives/)")


def run_validate(args: ValidateOptions, stream: Optional[TextIO] = None) -> int:
    """Validate, print the tables (and write the JSON / chart); CommandError
    when an archive failed (exit 1) or could not be read (exit 2)."""
    out = stream or sys.stdout
    for a in args.archives:
        if Path(a).is_dir():
            raise UsageError(_directory_message(Path(a)))
    try:
        reports = validate_archives(args.archives, args.targets)
    except OSError as e:
        raise UsageError(str(e)) from e
    print(format_table(reports), file=out)
    for r in reports:
        if r.unreadable:
            print(f"aotriton-rocm validate: error: {r.unreadable}", file=sys.stderr)
    if args.by_kernel:
        for r in reports:
            if r.validated:
                print(f"\n{r.arch} ({r.archive}):", file=out)
                print(format_kernel_table(r), file=out)
    failed = [r for r in reports if r.failures and not r.unreadable]
    for r in failed:
        shown = r.failures if args.verbose else r.failures[:10]
        for f in shown:
            print(f"FAIL {r.arch} {f}", file=out)
        if len(r.failures) > len(shown):
            print(f"... and {len(r.failures) - len(shown)} more for {r.arch} (--verbose)", file=out)
    for r in reports:
        for a in r.allowed:
            print(f"allowed {r.arch} {a}", file=out)
    n = sum(r.kernels for r in reports if r.validated)
    print(f"{n} AMD kernels validated in {sum(1 for r in reports if r.validated)} archive(s): "
          f"{sum(len(r.failures) for r in reports)} failure(s)", file=out)
    if args.json:
        Path(args.json).write_text(json.dumps([r.to_dict() for r in reports], indent=2) + "\n")
    if args.chart:
        br = None
        brp = args.build_report
        cand = Path(brp) if brp else Path(args.archives[0]).resolve().parent.parent / "build-report.json"
        if cand.is_file():
            try:
                br = json.loads(cand.read_text())
            except (OSError, ValueError):
                br = None
        draw_chart(reports, args.chart, br)
        print(f"chart: {args.chart}", file=out)
    unreadable = sum(1 for r in reports if r.unreadable)
    if unreadable:
        raise UsageError(f"{unreadable} of {len(reports)} archive(s) could not be read (see above)")
    if failed:
        raise CommandError(f"{len(failed)} archive(s) failed validation (FAIL lines above)")
    return 0
