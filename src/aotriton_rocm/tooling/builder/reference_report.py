"""The report's reference column: our shipped gfx942/gfx950 kernels beside
AMD's, for the standard shapes (fp16/bf16, head dims 64/128/256, causal or
not, forward and backward). Build-time only.

Three kinds of kernel per shape, all read by one reader (the code object's
metadata with codeobject.py, its machine code decoded by gcn_decode.py and
cut into loops by amdgcn.py):

* ours: the build's shipped choice for the open (longest) seqlen bucket;
  the forward (attn_fwd), the backward as its two kernels (attn_bwd_dkdv,
  attn_bwd_dq). Causal masking is a run-time argument of ours: one code
  object serves both rows. The kernels shipped for shorter buckets follow
  on the non-causal rows, named by their bucket (the pass estimate is the
  open bucket's);
* AMD's Triton FlashAttention from amd-aiter (forward ``_attn_fwd``,
  backward the one-kernel ``bwd_kernel_{noncausal,causal}``), compiled now
  by our pinned triton at AMD's configuration for the arch
  (reference_compile.py). A kernel our triton cannot compile is named with
  the compiler's reason, and our kernel is compiled at AMD's configuration
  instead ("ours @AMD cfg");
* AMD's assembly FMHA v3 (aiter's .co files), where the wheel has one.

Each row gets the cycle model's TFLOP/s on gfx942 (cycle_model.py).
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ...common.archive import Archive
from ..common.tables import render_table
from .amdgcn import find_loops, hot_loop_lines, hot_loop_stats, loop_lines
from .codeobject import ArchLimits, inspect_code_object
from .cycle_model import (CALIBRATION, PUBLISHED, SOURCES, TRITON_GAP, Calibration, Estimate, calibrate, estimate,
                          loop_mix)
from .gcn_decode import MFMA_SHAPES, code_object_text
from .reference import ReferenceWheel
from .reference_compile import RefShape, amd_config, amd_task, compile_reference
from .reference_gaps import REASONS_FILE, Gap, Reason, find_gaps, load_reasons
from .report_model import ArchReport, Figures, bucket_text, code_object_figures, config_text

__all__ = ["STANDARD_SHAPES", "RefRow", "ReferenceReport", "build_reference", "format_reference",
           "reference_json", "gaps"]

ARCHS = ("gfx942", "gfx950")
STANDARD_SHAPES = tuple(RefShape(a, d, t, h, c) for a in ARCHS for d in ("fwd", "bwd") for t in ("fp16", "bf16")
                        for h in (64, 128, 256) for c in (False, True))
# GEMMs per tile of each backward loop: dK/dV (QK^T, dP, dV, dK) and dQ
# (QK^T, dP, dQ) where a kernel splits them; the attention FLOP count
# credits 5 (and 2 forward), so a split backward's pass runs at
# 5 / (4 / rate_dkdv + 3 / rate_dq) of its loops' MFMA rates.
_GEMMS = {"dkdv": 4, "dq": 3}


@dataclass
class RefRow:
    shape: RefShape
    who: str  # "ours" | "amd-triton" | "aiter-asm" | "ours @AMD cfg"
    kernel: str
    config: str
    figures: Optional[Figures] = None
    estimate: Optional[Estimate] = None  # the hot loop's MFMA rate, calibrated
    note: str = ""
    loop: Optional[str] = None  # "dkdv" | "dq": which loop of a backward (None: the only one)
    pass_tflops: Optional[float] = None  # the whole pass (forward or backward) in attention FLOPs
    bucket: str = ""  # ours: the shorter seqlen bucket this kernel ships for ("": the open one)

    def per_mfma(self, kind: str) -> Optional[float]:
        f = self.figures
        if f is None or not f.loop or not f.loop.get("mfma"):
            return None
        n = f.loop[kind] - (f.loop["mfma"] if kind == "instructions" else 0)
        return n / f.loop["mfma"]

    @property
    def mfma_shape(self) -> str:
        """The hot loop's most frequent MFMA shape, e.g. ``32x32x8``."""
        ops = (self.figures.loop or {}).get("matrix_ops") if self.figures else None
        if not ops:
            return "-"
        shape = MFMA_SHAPES.get(max(ops, key=ops.get))
        return "x".join(map(str, shape[:3])) if shape else "?"

    def per_kflop(self, kind: str) -> Optional[float]:
        """Like per_mfma, per 16 KFLOP of MFMA work (one 32x32x8 or two
        16x16x16): comparable across MFMA shapes."""
        f, per = self.figures, self.per_mfma(kind)
        if per is None:
            return None
        ops = f.loop.get("matrix_ops") or {}
        flops = sum(2 * math.prod(MFMA_SHAPES.get(op, (32, 32, 8, 1))) * n for op, n in ops.items())
        return per * f.loop["mfma"] * 16384 / flops if flops else None


@dataclass
class ReferenceReport:
    wheel: str
    rows: List[RefRow] = field(default_factory=list)
    calibration: Calibration = CALIBRATION
    notes: List[str] = field(default_factory=list)
    reasons: List[Reason] = field(default_factory=list)  # kernels/tuning/gap-reasons.toml


def _figures(code: bytes, symbol: str, arch: str, num_warps: int, shared: int,
             limits: ArchLimits) -> Tuple[Figures, List[str]]:
    text = code_object_text(code, symbol, arch)
    fig = code_object_figures(code, symbol, num_warps, shared, limits, {"loop": hot_loop_stats(text)})
    return fig, hot_loop_lines(text)


def _two_loops(code: bytes, symbol: str, arch: str, num_warps: int, shared: int,
               limits: ArchLimits) -> List[Tuple[str, Figures, List[str]]]:
    """A one-kernel backward's dK/dV loop (the innermost loop with the most
    MFMAs) and dQ loop (the next MFMA count down), each the leanest of its
    count, as (loop, figures, lines)."""
    text = code_object_text(code, symbol, arch)
    fig = code_object_figures(code, symbol, num_warps, shared, limits, {"loop": hot_loop_stats(text)})
    inner = [lp for lp in find_loops(text) if lp.innermost and lp.mfma]
    counts = sorted({lp.mfma for lp in inner}, reverse=True)[:2]
    out = []
    for name, n in zip(("dkdv", "dq"), counts):
        lp = min((x for x in inner if x.mfma == n), key=lambda x: x.instructions)
        stats = {k: v for k, v in asdict(lp).items() if k != "innermost"}
        out.append((name, replace(fig, loop=dict(stats, loops=len(inner))), loop_lines(text, lp)))
    return out


def _estimate(shape: RefShape, fig: Figures, lines: List[str], factor: float) -> Optional[Estimate]:
    if shape.arch != "gfx942" or not lines:
        return None
    return estimate(loop_mix(lines), fig.occupancy, 1.0, factor)


def _set_pass(rows: Sequence[RefRow]) -> None:
    """The pass estimate of one kernel family's rows for a shape: the
    forward's or the one-loop backward's own, a split backward's from its
    two loops (_GEMMS)."""
    ests = [r.estimate for r in rows]
    if not rows or any(e is None for e in ests):
        return
    if len(rows) == 1:
        rows[0].pass_tflops = ests[0].tflops
        return
    rate = {r.loop: e.tflops for r, e in zip(rows, ests)}
    if set(rate) == set(_GEMMS):
        rows[-1].pass_tflops = 5 / sum(g / rate[loop] for loop, g in _GEMMS.items())


def _asm_figures(code: bytes, arch: str, limits: ArchLimits) -> Tuple[str, Figures, List[str]]:
    km = inspect_code_object(code).kernels[0]
    warps = int(km.raw.get(".max_flat_workgroup_size", 256)) // 64
    fig, lines = _figures(code, km.name, arch, warps, 0, limits)
    return km.name, fig, lines


def _ours(arch_reports: Sequence[ArchReport], shape: RefShape) -> List[Tuple[str, Any, str]]:
    """(kernel, ShippedChoice, bucket) of our shipped kernels for the shape:
    per kernel the open bucket's (bucket ""), then, on a non-causal shape,
    each other kernel shipped for a shorter bucket, once."""
    kernels = ("attn_fwd",) if shape.direction == "fwd" else ("attn_bwd_dkdv", "attn_bwd_dq")
    out = []
    for rep in arch_reports:
        if rep.arch != shape.arch:
            continue
        for k in kernels:
            runs = [c for c in rep.choices
                    if c.kernel == k and c.functional.get("dtype") == shape.dtype
                    and c.functional.get("head_dim") == shape.head_dim
                    and not c.functional.get("has_bias") and not c.functional.get("enable_dropout")
                    and bool(c.functional.get("pad_head")) == (shape.head_dim == 256)]
            runs.sort(key=lambda c: c.bounds[-1] is not None)  # the open bucket first
            seen = set()
            for c in runs:
                if c.chosen.key in seen or (shape.causal and c.bounds[-1] is not None):
                    continue
                seen.add(c.chosen.key)
                out.append((k, c, "" if c.bounds[-1] is None else bucket_text(c.axis, c.lower, c.bounds[-1])))
    return out


def _fallback_tasks(shape: RefShape, cfg: Dict[str, Any], source_root: Optional[Path]):
    """Our kernel(s) for the shape at AMD's configuration (when AMD's does not compile)."""
    from .plan import Sources, Subset, plan_build
    from ..common.targets import load_targets
    sources = Sources.find(source_root)
    targets = load_targets(sources.targets_path)
    profile = next(p for p in targets.profiles if shape.arch in targets.profile(p).archs)
    kernels = ["attn_fwd"] if shape.direction == "fwd" else ["attn_bwd_dkdv", "attn_bwd_dq"]
    only = (f"kernel={'|'.join(kernels)},dtype={shape.dtype},head_dim={shape.head_dim},has_bias=false,"
            f"enable_dropout=false,pad_head={'true' if shape.head_dim == 256 else 'false'}")
    plan = plan_build(profile, [shape.arch], sources, Subset.parse([only]))
    tiles = {"attn_fwd": ("BLOCK_M", "BLOCK_N"), "attn_bwd_dkdv": ("BLOCK_M1", "BLOCK_N1"),
             "attn_bwd_dq": ("BLOCK_M2", "BLOCK_N2")}
    out = []
    for k in kernels:
        v, task = next((v, t) for v, t in plan.items[shape.arch] if v.kernel == k)
        cx = dict(task.constexprs)
        cx["BLOCK_M"], cx["BLOCK_N"] = (cfg[t] for t in tiles[k])
        if "PRE_LOAD_V" in cx:
            cx["PRE_LOAD_V"] = bool(cfg.get("PRELOAD_V", False))
        opts = tuple(sorted((o, cfg[o]) for o in ("num_warps", "num_stages", "waves_per_eu",
                                                  "matrix_instr_nonkdim") if o in cfg))
        tag = hashlib.sha256(repr((sorted(cx.items()), opts)).encode()).hexdigest()[:16]
        out.append((k, replace(task, cache_key=f"{task.cache_key}-amdcfg-{tag}",
                               constexprs=tuple(cx.items()), options=opts)))
    return out


def _amd_config_text(cfg: Dict[str, Any]) -> str:
    """AMD's config in the report's notation: the forward's tile, the
    backward's dK/dV and dQ tiles, then the options (config_text)."""
    rest = {k: v for k, v in cfg.items() if not k.startswith("BLOCK") and k not in ("num_ctas", "PRELOAD_V",
                                                                                     "BLK_SLICE_FACTOR")}
    if "BLOCK_M1" in cfg:
        head = (f"dkdv {cfg['BLOCK_M1']}x{cfg['BLOCK_N1']} dq {cfg['BLOCK_M2']}x{cfg['BLOCK_N2']} "
                f"slice{cfg.get('BLK_SLICE_FACTOR', 1)}")
    else:
        head = f"{cfg.get('BLOCK_M')}x{cfg.get('BLOCK_N')}" + (" preV" if cfg.get("PRELOAD_V") else "")
    return f"{head} {config_text(rest)}".strip()


def build_reference(wheel: ReferenceWheel, arch_reports: Sequence[ArchReport], limits: Dict[str, ArchLimits],
                    cache_dir: Path, shapes: Sequence[RefShape] = STANDARD_SHAPES, jobs: int = 1,
                    source_root: Optional[Path] = None) -> ReferenceReport:
    """Every shape's rows: ours (from ``arch_reports``), AMD's Triton kernel
    (compiled now, cached), aiter's assembly kernel; and the calibration
    recomputed from the wheel's assembly kernels."""
    triton_version = importlib.metadata.version("triton")
    report = ReferenceReport(wheel=f"{wheel.wheel.name}", reasons=_reasons(source_root))
    report.calibration = calibration_from_wheel(wheel, limits["gfx942"])
    k = report.calibration.factor
    shapes = [s for s in shapes if s.arch in limits]
    compiled = compile_reference([amd_task(wheel, s, triton_version) for s in shapes], cache_dir, jobs)
    fallbacks: List[Tuple[int, RefShape, str, Any]] = []
    archives = {r.arch: Archive.open(r.archive) for r in arch_reports if r.arch in limits}
    for s, res in zip(shapes, compiled):
        lim = limits[s.arch]
        for kern, c, bucket in _ours(arch_reports, s):
            archive = archives[s.arch]
            rec = archive.get(c.chosen.key)
            fig, lines = _figures(archive.code_object(rec), rec.symbol, s.arch, rec.num_warps, rec.shared, lim)
            note = "same code object causal or not" if s.causal else f"ships for {bucket}" if bucket else ""
            report.rows.append(RefRow(s, "ours", kern, config_text(c.chosen.config), fig,
                                      _estimate(s, fig, lines, k), note,
                                      loop={"attn_bwd_dkdv": "dkdv", "attn_bwd_dq": "dq"}.get(kern),
                                      bucket=bucket))
        cfg = amd_config(wheel, s)
        if res.error is None and s.direction == "fwd":
            fig, lines = _figures(res.code, res.meta["symbol"], s.arch, res.meta["num_warps"],
                                  res.meta["shared"], lim)
            report.rows.append(RefRow(s, "amd-triton", res.task.function, _amd_config_text(cfg), fig,
                                      _estimate(s, fig, lines, k)))
        elif res.error is None:
            for loop, fig, lines in _two_loops(res.code, res.meta["symbol"], s.arch, res.meta["num_warps"],
                                               res.meta["shared"], lim):
                report.rows.append(RefRow(s, "amd-triton", f"{res.task.function} [{loop} loop]",
                                          _amd_config_text(cfg), fig, _estimate(s, fig, lines, k), loop=loop))
        else:
            report.rows.append(RefRow(s, "amd-triton", res.task.function, _amd_config_text(cfg),
                                      note=f"does not compile with triton {triton_version}: {res.error}"))
            for kern, task in _fallback_tasks(s, cfg, source_root):
                fallbacks.append((len(report.rows), s, kern, task))
        asm = wheel.asm(s.arch, s.direction, s.head_dim, s.dtype, s.causal)
        if asm is not None:
            name, fig, lines = _asm_figures(asm.code, s.arch, lim)
            report.rows.append(RefRow(s, "aiter-asm", asm.member.rsplit("/", 1)[-1], "-", fig,
                                      _estimate(s, fig, lines, k)))
    if fallbacks:
        done = compile_reference([t for *_, t in fallbacks], cache_dir, jobs)
        for (pos, s, kern, task), res in reversed(list(zip(fallbacks, done))):
            row = RefRow(s, "ours @AMD cfg", kern, config_text(dict(task.constexprs)), note=res.error or "",
                         loop={"attn_bwd_dkdv": "dkdv", "attn_bwd_dq": "dq"}.get(kern))
            if res.error is None:
                fig, lines = _figures(res.code, res.meta["symbol"], s.arch, res.meta["num_warps"],
                                      res.meta["shared"], limits[s.arch])
                row.figures, row.estimate = fig, _estimate(s, fig, lines, k)
            report.rows.insert(pos + 1, row)
    for s in shapes:
        for who in ("ours", "amd-triton", "ours @AMD cfg", "aiter-asm"):
            _set_pass([r for r in report.rows if r.shape == s and r.who == who and not r.bucket])
    return report


def _reasons(source_root: Optional[Path]) -> List[Reason]:
    """The checkout's written gap reasons; none outside a checkout (every gap
    is then unexplained)."""
    from .plan import Sources
    from ...common.errors import UsageError
    try:
        return load_reasons(Sources.find(source_root).kernels_dir / REASONS_FILE)
    except UsageError:
        return []


def calibration_from_wheel(wheel: ReferenceWheel, limits: ArchLimits) -> Calibration:
    """The cycle model's factor refitted on the wheel's gfx942 assembly
    kernels (bf16, head dim 128, non-causal) against their published figures."""
    points = []
    for name, published in PUBLISHED.items():
        direction = "fwd" if " fwd " in name else "bwd"
        asm = wheel.asm("gfx942", direction, 128, "bf16", False)
        if asm is None:
            continue
        _, fig, lines = _asm_figures(asm.code, "gfx942", limits)
        raw = estimate(loop_mix(lines), fig.occupancy, 1.0, 1.0)
        points.append((name, raw.raw_tflops, published))
    return calibrate(points, SOURCES) if points else CALIBRATION


# -- output ------------------------------------------------------------------

_HEADER = ("shape", "who", "kernel", "config", "MFMA", "occ", "VGPR", "AGPR", "LDS", "spills", "MFMA/it",
           "oth/MFMA", "gld/MFMA", "dsr/MFMA", "dsw/MFMA", "waits", "bar", "loop TF/s", "pass TF/s", "note")


def _f(v: Optional[float], digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _cells(r: RefRow) -> Tuple[str, ...]:
    f = r.figures
    if f is None:
        return ("-",) * 12
    loop = f.loop or {}
    return (str(f.occupancy), str(f.vgpr), str(f.agpr), str(f.lds), f"{f.vgpr_spills}/{f.sgpr_spills}",
            str(loop.get("mfma", 0)), _f(r.per_mfma("instructions")), _f(r.per_mfma("global_loads")),
            _f(r.per_mfma("ds_reads")), _f(r.per_mfma("ds_writes")), str(loop.get("waitcnt", 0)),
            str(loop.get("barriers", 0)))


def format_reference(rep: ReferenceReport) -> str:
    rows, last = [], None
    for r in rep.rows:
        shape = r.shape.text if r.shape != last else ""
        last = r.shape
        rows.append((shape, r.who, r.kernel, r.config, r.mfma_shape, *_cells(r),
                     "-" if r.estimate is None else f"{r.estimate.tflops:.0f}",
                     "" if r.pass_tflops is None else f"{r.pass_tflops:.0f}", r.note))
    cal = rep.calibration
    errs = ", ".join(f"{n} {e:+.0%}" for n, e in cal.errors.items())
    text = [f"reference: AMD's kernels from {rep.wheel}, compiled by our triton where Triton "
            f"(amd-triton), read from the wheel where assembly (aiter-asm)",
            render_table(_HEADER, rows, left=(0, 1, 2, 3, 4, 19)),
            "MFMA: the hot loop's MFMA shape (MxNxK). oth/MFMA: other instructions per MFMA in the "
            "hot loop; gld, dsr, dsw: global loads, LDS reads, "
            "LDS writes per MFMA; waits, bar: s_waitcnt, s_barrier per iteration. aiter-asm VGPR: the "
            "metadata's unified count (its AGPRs are not reported apart).",
            f"loop TF/s: the hot loop's MFMA rate by the cycle model on MI300X (gfx942 only); pass TF/s: "
            f"the forward or backward pass in attention FLOPs (a split backward from its dK/dV and dQ "
            f"loops: 5 / (4 / dkdv + 3 / dq)). Calibration factor {cal.factor:.3f}, "
            f"error on the calibration kernels: {errs or 'none'} (max {cal.max_error:.0%}). "
            f"Sources: {'; '.join(cal.sources)}."]
    check = triton_check(rep)
    if check:
        text.append(check)
    text.extend(rep.notes)
    found = gaps(rep)
    if found:
        text.append("ours below AMD's Triton kernel (occupancy; other instructions, global or LDS loads per "
                    "16 KFLOP of MFMA work, i.e. per 32x32x8-equivalent MFMA), gfx942/gfx950, head dims 64/128; "
                    f"reasons from kernels/{REASONS_FILE.as_posix()}:")
        text.extend(f"  {line}" for g in found for line in g.lines())
        n = sum(1 for g in found if g.unexplained)
        text.append(f"{len(found)} gap(s), {n} with unexplained figures")
    return "\n".join(text)


def triton_check(rep: ReferenceReport) -> Optional[str]:
    """The model's AITER / AMD-Triton forward ratio (gfx942 bf16 d128,
    non-causal) against the published range (not fitted)."""
    shape = RefShape("gfx942", "fwd", "bf16", 128, False)
    est = {r.who: r.pass_tflops for r in rep.rows if r.shape == shape and r.pass_tflops is not None}
    if "aiter-asm" not in est or "amd-triton" not in est:
        return None
    ratio = est["aiter-asm"] / est["amd-triton"]
    lo, hi, source = TRITON_GAP
    miss = min(abs(ratio - lo), abs(ratio - hi))
    verdict = "inside" if lo <= ratio <= hi else f"outside (the model misses {miss:.2f})"
    return (f"check (not fitted): AITER asm / AMD Triton forward, gfx942 bf16 d128, predicted "
            f"{ratio:.2f}x, published {lo:.2f}-{hi:.2f}x ({source}): {verdict}")


def gaps(rep: ReferenceReport) -> List[Gap]:
    """Where our kernel is below AMD's Triton kernel (reference_gaps.py),
    each figure with its written reason or unexplained."""
    return find_gaps(rep.rows, rep.reasons)


def reference_json(rep: ReferenceReport) -> Dict[str, Any]:
    def row(r: RefRow) -> Dict[str, Any]:
        return {"shape": asdict(r.shape), "who": r.who, "kernel": r.kernel, "config": r.config,
                "figures": asdict(r.figures) if r.figures else None,
                "per_mfma": {k: r.per_mfma(k) for k in ("instructions", "global_loads", "ds_reads", "ds_writes")},
                "mfma_shape": r.mfma_shape,
                "per_16kflop": {k: r.per_kflop(k) for k in ("instructions", "global_loads", "ds_reads", "ds_writes")},
                "estimate": asdict(r.estimate) if r.estimate else None, "loop": r.loop,
                "pass_tflops": r.pass_tflops, "note": r.note}
    cal = rep.calibration
    return {"wheel": rep.wheel, "rows": [row(r) for r in rep.rows], "gaps": [g.to_json() for g in gaps(rep)],
            "check": triton_check(rep),
            "calibration": {"factor": cal.factor, "errors": cal.errors, "max_error": cal.max_error,
                            "sources": list(cal.sources), "published": PUBLISHED}}
