"""Where our kernels are below AMD's Triton kernel in the report's reference
column, and the written reason for each figure that is below, or
"unexplained".

Reasons live in ``kernels/tuning/gap-reasons.toml``, one ``[[reason]]``
table each::

    [[reason]]
    arch = "gfx942"
    kernel = "attn_fwd"          # attn_fwd | attn_bwd_dkdv | attn_bwd_dq
    dtypes = ["fp16", "bf16"]
    head_dims = [64, 128]
    metrics = ["occupancy"]      # occupancy | instructions | global_loads | ds_reads
    configs = ["64x16 wpe2 w4 s1"]   # optional: only these shipped configs (report text)
    text = "why, from what the decoded loop or the config shows"

A reason covers a gap's figure when arch, kernel, dtype, head dim, the
figure and (where the reason names configs) the config all match; the
first matching entry wins. A gap is explained only when every figure
below AMD's has a reason.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from ...common.errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib  # type: ignore[no-redef]

__all__ = ["METRICS", "Reason", "Gap", "ReasonsError", "load_reasons", "find_gaps", "REASONS_FILE"]

REASONS_FILE = Path("tuning") / "gap-reasons.toml"  # under the kernels directory
# figure id -> label; the per-16-KFLOP figures compared with 5% slack
METRICS = {"occupancy": "occupancy", "instructions": "other instr", "global_loads": "global loads",
           "ds_reads": "LDS reads"}
_SLACK = 1.05


class ReasonsError(UsageError):
    """The reasons file is malformed."""


@dataclass(frozen=True)
class Reason:
    arch: str
    kernel: str
    dtypes: Tuple[str, ...]
    head_dims: Tuple[int, ...]
    metrics: Tuple[str, ...]
    text: str
    configs: Tuple[str, ...] = ()  # () = any config

    def covers(self, arch: str, kernel: str, dtype: str, head_dim: int, metric: str,
               config: str = "") -> bool:
        return (self.arch == arch and self.kernel == kernel and dtype in self.dtypes
                and head_dim in self.head_dims and metric in self.metrics
                and (not self.configs or config in self.configs))


def load_reasons(path: Optional[Path]) -> List[Reason]:
    """The reasons in ``path``; none when it is None or absent."""
    if path is None or not Path(path).is_file():
        return []
    try:
        doc = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, OSError) as e:
        raise ReasonsError(f"{path}: {e}") from None
    out = []
    for i, t in enumerate(doc.get("reason", [])):
        where = f"{path}: reason {i + 1}"
        missing = [k for k in ("arch", "kernel", "dtypes", "head_dims", "metrics", "text") if k not in t]
        if missing:
            raise ReasonsError(f"{where} lacks {', '.join(missing)}")
        bad = [m for m in t["metrics"] if m not in METRICS]
        if bad:
            raise ReasonsError(f"{where}: unknown metric(s) {', '.join(bad)} (known: {', '.join(METRICS)})")
        if not str(t["text"]).strip():
            raise ReasonsError(f"{where}: empty text")
        out.append(Reason(str(t["arch"]), str(t["kernel"]), tuple(t["dtypes"]), tuple(int(h) for h in t["head_dims"]),
                          tuple(t["metrics"]), " ".join(str(t["text"]).split()),
                          tuple(str(c) for c in t.get("configs", ()))))
    return out


@dataclass
class Gap:
    """One of our kernels (one loop of a backward) below AMD's Triton kernel
    for a shape: the figures below AMD's, each with its reason or None."""

    shape: Any  # RefShape
    kernel: str
    config: str
    mfma: str
    amd_mfma: str
    worse: List[Tuple[str, str]] = field(default_factory=list)  # (metric, "ours > AMD's" text)
    reasons: Dict[str, Optional[str]] = field(default_factory=dict)
    bucket: str = ""  # the shorter seqlen bucket the kernel ships for ("": the open one)

    @property
    def unexplained(self) -> List[str]:
        return [m for m, _ in self.worse if self.reasons.get(m) is None]

    @property
    def text(self) -> str:
        where = f" [{self.bucket}]" if self.bucket else ""
        return (f"{self.shape.text} {self.kernel}{where} ({self.config}; {self.mfma} vs AMD {self.amd_mfma}): "
                + "; ".join(t for _, t in self.worse))

    def lines(self) -> List[str]:
        """The gap, then each distinct reason, and the unexplained figures."""
        out = [self.text]
        seen: List[str] = []
        for m, _ in self.worse:
            r = self.reasons.get(m)
            if r is not None and r not in seen:
                seen.append(r)
                names = ", ".join(METRICS[x] for x, _ in self.worse if self.reasons.get(x) == r)
                out.append(f"  reason ({names}): {r}")
        if self.unexplained:
            out.append("  UNEXPLAINED: " + ", ".join(METRICS[m] for m in self.unexplained))
        return out

    def to_json(self) -> Dict[str, Any]:
        return {"text": self.text, "arch": self.shape.arch, "direction": self.shape.direction,
                "dtype": self.shape.dtype, "head_dim": self.shape.head_dim, "kernel": self.kernel,
                "config": self.config, "bucket": self.bucket, "worse": {m: t for m, t in self.worse},
                "reasons": {m: self.reasons.get(m) for m, _ in self.worse}, "unexplained": self.unexplained}


def find_gaps(rows: Sequence[Any], reasons: Iterable[Reason] = ()) -> List[Gap]:
    """Our rows (every shipped bucket's kernel) below AMD's Triton row of
    the same shape (and loop of a backward), non-causal, head dims 64 and
    128: lower occupancy, or more other instructions, global or LDS loads
    per 16 KFLOP of MFMA work (so that 16x16x16 and 32x32x8 MFMAs compare),
    with 5% slack."""
    reasons = list(reasons)
    by_shape: Dict[Any, List[Any]] = {}
    for r in rows:
        by_shape.setdefault(r.shape, []).append(r)
    out = []
    for s, srows in by_shape.items():
        if s.head_dim not in (64, 128) or s.causal:
            continue
        for r in srows:
            amd = next((a for a in srows if a.who == "amd-triton" and a.figures and a.loop == r.loop), None)
            if r.who != "ours" or r.figures is None or amd is None:
                continue
            worse = []
            if r.figures.occupancy < amd.figures.occupancy:
                worse.append(("occupancy", f"occupancy {r.figures.occupancy} < {amd.figures.occupancy}"))
            for kind in ("instructions", "global_loads", "ds_reads"):
                a, b = r.per_kflop(kind), amd.per_kflop(kind)
                if a is not None and b is not None and a > b * _SLACK:
                    worse.append((kind, f"{METRICS[kind]} {a:.2f} > {b:.2f}"))
            if not worse:
                continue
            gap = Gap(s, r.kernel, r.config, r.mfma_shape, amd.mfma_shape, worse,
                      bucket=r.bucket)
            for m, _ in worse:
                gap.reasons[m] = next((x.text for x in reasons
                                       if x.covers(s.arch, r.kernel, s.dtype, s.head_dim, m, r.config)), None)
            out.append(gap)
    return out
