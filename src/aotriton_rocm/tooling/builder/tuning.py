"""Which tuning config ships, per (arch, kernel variant, seqlen bucket). Build-time only.

Every ``[[kernels.NAME.configs]]`` table of ``kernels/variants.toml`` that
matches an arch and a functional point is a *candidate*: the build compiles
and validates all of them, then chooses per seqlen bucket, and ships only the
chosen ones. A choice is

* **measured** where ``kernels/tuning/<arch>.json`` names the config for that
  kernel, functional point and bucket (a timing on real hardware chose it);
* **static** everywhere else, by the cost model below over the code-object
  validator's numbers (AMD code cannot be run on the build hosts).

Static cost model, lexicographic, per bucket with upper bound ``U`` (the
seqlen along the kernel's grid axis: ``seqlen_q`` for fwd/dq/preprocess,
``seqlen_k`` for dK/dV; ``U`` is infinite for the last, open bucket), over
the eligible candidates whose ``seqlen_max`` (a config key: a tile meant
for short sequences, e.g. decoding's few query rows) is at least ``U``
(over all eligible ones where none is):

1. clean before waived: a candidate with an unwaived spill, scratch or LDS
   finding is never chosen; one whose findings are all waived by its
   ``allow`` ranks after every clean one, fewer scratch bytes first;
2. occupancy (waves per SIMD, the validator's estimate) counted up to
   ``OCCUPANCY_ENOUGH`` = 2: the kernels are software-pipelined dot loops,
   and from two waves per SIMD a larger tile (fewer loads per FLOP) is worth
   more than more waves;
3. tile size at this seqlen: first the padding a tile wastes
   (``rows - min(rows, U)``, rows = the tile along the grid axis), then the
   useful rows ``min(rows, U)`` (more is better), then the other tile side
   (the loop tile, more is better), then fewer warps;
4. declaration order in variants.toml.

sm_90 (the NVIDIA test target) has no occupancy figure; its candidates are
ranked by steps 1 (shared memory is its only resource check), 3 and 4, and
its tuning file records the H100 measurements.

Buckets: upper bounds ``SEQLEN_BUCKETS`` (16 .. 8192, the bins upstream
AOTriton's tuning database uses) and one open bucket above; a run-time seqlen
``s`` falls into the first bucket whose bound is >= s. Consecutive buckets
with the same choice are merged, so the manifest holds per functional point a
short list ``[[max_seqlen or null, variant key, "measured"|"static"], ...]``.

Decoding: a kernel bucketed by seqlen_k (dK/dV) cannot tell a few query rows
against a long context from a long square problem by its bucket. A tuning
entry with ``"seqlen_q_max": N`` names its tile for problems of at most N
query rows, whatever their key length; the manifest's choice then carries
``"decode": [N, variant key, "measured"]``, which the runtime takes before
the buckets. Only measured: the static cost model has no such choice.
"""
from __future__ import annotations

import itertools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ...core.kernel_spec import REQUIRED_OPTIONS, ConfigSpec, VariantSpec, VariantSpecError, parse_config

__all__ = [
    "SEQLEN_BUCKETS",
    "OCCUPANCY_ENOUGH",
    "COST_MODEL",
    "TuningError",
    "Candidate",
    "MeasuredEntry",
    "MeasuredData",
    "grid_axis",
    "load_measured",
    "load_measured_text",
    "measured_configs",
    "dump_measured",
    "with_choice",
    "choose",
    "choose_decode",
    "static_rank",
    "why_not_chosen",
    "losses",
]

SEQLEN_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
OCCUPANCY_ENOUGH = 2
COST_MODEL = ("static-v1: clean before waived (fewer scratch bytes first), occupancy up to "
              f"{OCCUPANCY_ENOUGH} waves/SIMD, least padding at the bucket's seqlen, more useful "
              "rows, larger loop tile, fewer warps, declaration order")
TUNING_SCHEMA = 1


class TuningError(ValueError):
    """Malformed tuning data, or tuning data that names a config no candidate has."""


@dataclass
class Candidate:
    """One compiled and validated candidate config of one (arch, kernel, functional point)."""

    key: str
    config: Dict[str, Any]
    order: int  # position among the candidates (declaration order)
    rows: int  # tile along the grid axis (e.g. BLOCK_M of attn_fwd)
    cols: int  # the other tile side (e.g. BLOCK_N of attn_fwd), 1 if none
    num_warps: int = 4
    occupancy: Optional[int] = None  # waves per SIMD (AMD), None where unknown
    scratch: int = 0  # bytes per lane
    findings: List[Tuple[str, str]] = field(default_factory=list)  # (kind, message)
    waived: Dict[str, str] = field(default_factory=dict)  # kind -> reason (the config's allow)
    seqlen_max: Optional[int] = None  # the config's limit on the buckets it ships for statically

    def serves(self, bound: Optional[int]) -> bool:
        """May the cost model ship it for the bucket with upper bound ``bound``?"""
        return self.seqlen_max is None or (bound is not None and bound <= self.seqlen_max)

    @property
    def unwaived(self) -> List[Tuple[str, str]]:
        return [(k, m) for k, m in self.findings if k not in self.waived]

    @property
    def eligible(self) -> bool:
        return not self.unwaived

    @property
    def exceptions(self) -> List[Tuple[str, str, str]]:
        """(kind, message, reason) of the waived findings."""
        return [(k, m, self.waived[k]) for k, m in self.findings if k in self.waived]


_CDIV = re.compile(r"^\s*cdiv\(\s*([A-Za-z_]\w*)\s*,\s*([A-Za-z_]\w*)\s*\)\s*$")


def grid_axis(grid: Sequence[str]) -> Tuple[Optional[str], Optional[str]]:
    """(seqlen axis, tile constexpr) of a grid whose first entry is
    ``cdiv(<arg>, <CONSTEXPR>)``: ("seqlen_q", "BLOCK_M") for
    ``cdiv(max_seqlen_q, BLOCK_M)``; the axis is "seqlen_k" if the argument
    names seqlen_k, "seqlen_q" if it names seqlen_q, else the argument's name.
    (None, None) for any other grid."""
    m = _CDIV.match(grid[0]) if grid else None
    if not m:
        return None, None
    arg, tile = m.group(1), m.group(2)
    axis = "seqlen_k" if "seqlen_k" in arg else "seqlen_q" if "seqlen_q" in arg else arg
    return axis, tile


def static_rank(c: Candidate, bound: Optional[int]) -> Tuple:
    """The cost model's sort key of ``c`` for a bucket with upper bound ``bound``
    (None: the open bucket). Lower sorts first."""
    u = math.inf if bound is None else bound
    useful = min(c.rows, u)
    occ = OCCUPANCY_ENOUGH if c.occupancy is None else min(c.occupancy, OCCUPANCY_ENOUGH)
    return (1 if c.exceptions else 0, c.scratch if c.exceptions else 0, -occ,
            c.rows - useful, -useful, -c.cols, c.num_warps, c.order)


def _config_text(config: Mapping[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in config.items())


def why_not_chosen(loser: Candidate, winner: Candidate, bound: Optional[int], source: str) -> str:
    """Why ``loser`` did not ship where ``winner`` did (bucket ``bound``,
    chosen by ``source``), in words: its unwaived findings, the measured
    choice, or the first step of the static cost model it loses on."""
    if not loser.eligible:
        return "rejected: " + "; ".join(m for _, m in loser.unwaived)
    if source == "measured":
        return f"measured: the tuning file names {_config_text(winner.config)}"
    if not loser.serves(bound):
        return f"a tile for sequences of up to {loser.seqlen_max} only (its seqlen_max)"
    lr, wr = static_rank(loser, bound), static_rank(winner, bound)
    step = next(i for i, (a, b) in enumerate(zip(lr, wr)) if a != b)
    return [
        lambda: "ships only under a waiver (ranks after clean candidates)",
        lambda: f"more scratch under its waiver ({loser.scratch} > {winner.scratch} bytes per lane)",
        lambda: f"lower occupancy ({loser.occupancy} < {winner.occupancy} waves/SIMD)",
        lambda: f"pads more rows at these seqlens ({loser.rows}-row tile vs {winner.rows})",
        lambda: f"fewer useful rows ({loser.rows}-row tile vs {winner.rows})",
        lambda: f"smaller loop tile ({loser.cols} < {winner.cols})",
        lambda: f"more warps ({loser.num_warps} > {winner.num_warps})",
        lambda: "declared later in variants.toml (ties otherwise)",
    ][step]()


def losses(candidates: Sequence[Candidate], runs: Sequence[Sequence[Any]],
           buckets: Sequence[int] = SEQLEN_BUCKETS) -> List[Dict[str, str]]:
    """Per run of :func:`choose` (same order): candidate key -> why it was not
    chosen there, for every other candidate; where the reason differs between
    the buckets of a run, the distinct reasons joined by "; "."""
    by_key = {c.key: c for c in candidates}
    bounds: List[Optional[int]] = list(buckets) + [None]
    out: List[Dict[str, str]] = []
    start = 0
    for bound, key, source in runs:
        end = bounds.index(bound) + 1
        winner = by_key[key]
        why: Dict[str, str] = {}
        for c in candidates:
            if c.key == key:
                continue
            texts = [why_not_chosen(c, winner, b, source) for b in bounds[start:end]]
            why[c.key] = "; ".join(dict.fromkeys(texts))
        out.append(why)
        start = end
    return out


@dataclass(frozen=True)
class MeasuredEntry:
    kernel: str
    functional: Tuple[Tuple[str, Tuple[Any, ...]], ...]  # axis -> values it applies to
    seqlen_max: Optional[int]  # applies to buckets with bound <= this (None: all)
    config: Tuple[Tuple[str, Any], ...]
    index: int
    seqlen_q_max: Optional[int] = None  # a decoding tile: problems of at most this many query rows

    def applies(self, kernel: str, functional: Mapping[str, Any], bound: Optional[int]) -> bool:
        """Does it choose the tile of this bucket (never a decoding entry)?"""
        return self.seqlen_q_max is None and self._names(kernel, functional, bound)

    def decodes(self, kernel: str, functional: Mapping[str, Any]) -> bool:
        """Does it give this point its decoding tile?"""
        return self.seqlen_q_max is not None and self._names(kernel, functional, None)

    def _names(self, kernel: str, functional: Mapping[str, Any], bound: Optional[int]) -> bool:
        if kernel != self.kernel:
            return False
        # A filter on an axis the point does not have is ignored (a new axis
        # added to variants.toml later does not void older measurements).
        if any(axis in functional and functional[axis] not in values for axis, values in self.functional):
            return False
        if self.seqlen_max is None:
            return True
        return bound is not None and bound <= self.seqlen_max

    def picks(self, c: Candidate) -> bool:
        return all(c.config.get(k) == v for k, v in self.config)


@dataclass
class MeasuredData:
    """``kernels/tuning/<arch>.json``."""

    path: Optional[Path]
    arch: str
    how: str = ""
    entries: Tuple[MeasuredEntry, ...] = ()

    def entry_for(self, kernel: str, functional: Mapping[str, Any],
                  bound: Optional[int]) -> Optional[MeasuredEntry]:
        return next((e for e in self.entries if e.applies(kernel, functional, bound)), None)

    def decode_entry_for(self, kernel: str, functional: Mapping[str, Any]) -> Optional[MeasuredEntry]:
        """The point's decoding entry (``seqlen_q_max``), if any."""
        return next((e for e in self.entries if e.decodes(kernel, functional)), None)


def load_measured(kernels_dir, arch: str, path: Optional[Path] = None) -> MeasuredData:
    """The measured tuning data for ``arch`` (empty if it has no file).

    Format (JSON)::

        {"schema": 1, "arch": "sm_90", "how": "what was measured, where, how",
         "choices": [{"kernel": "attn_fwd",
                      "functional": {"dtype": ["fp16", "bf16"], "head_dim": [64, 128]},
                      "seqlen_max": null,
                      "config": {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3}}]}

    The first entry that applies to (kernel, functional point, bucket) names
    the config (a subset of its keys is enough) of the candidate to ship.
    """
    p = Path(path) if path is not None else Path(kernels_dir) / "tuning" / f"{arch}.json"
    if not p.is_file():
        return MeasuredData(path=None, arch=arch)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise TuningError(f"{p}: unreadable tuning data: {e}") from None
    return load_measured_text(text, arch, p)


def load_measured_text(text: str, arch: str, p) -> MeasuredData:
    """:func:`load_measured` of a file's text (``p``: its path, for messages)."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise TuningError(f"{p}: unreadable tuning data: {e}") from None
    if not isinstance(doc, dict) or doc.get("schema") != TUNING_SCHEMA:
        raise TuningError(f"{p}: expected a JSON object with \"schema\": {TUNING_SCHEMA}")
    if doc.get("arch") != arch:
        raise TuningError(f"{p}: \"arch\" is {doc.get('arch')!r}, the file name says {arch!r}")
    entries = []
    for i, ch in enumerate(doc.get("choices") or ()):
        where = f"{p}: choices[{i}]"
        if not isinstance(ch, dict) or not isinstance(ch.get("kernel"), str) \
                or not isinstance(ch.get("config"), dict) or not ch["config"]:
            raise TuningError(f"{where}: needs \"kernel\" (a name) and \"config\" (a non-empty object)")
        func = ch.get("functional") or {}
        if not isinstance(func, dict) or not all(isinstance(v, list) and v for v in func.values()):
            raise TuningError(f"{where}: \"functional\" maps axes to non-empty lists of values")
        smax, qmax = ch.get("seqlen_max"), ch.get("seqlen_q_max")
        for name, value in (("seqlen_max", smax), ("seqlen_q_max", qmax)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise TuningError(f"{where}: \"{name}\" is a positive integer or null")
        if qmax is not None and smax is not None:
            raise TuningError(f"{where}: a decoding entry (\"seqlen_q_max\") serves every key "
                              "length: its \"seqlen_max\" must be null")
        entries.append(MeasuredEntry(kernel=ch["kernel"],
                                     functional=tuple((k, tuple(v)) for k, v in func.items()),
                                     seqlen_max=smax, config=tuple(ch["config"].items()), index=i,
                                     seqlen_q_max=qmax))
    return MeasuredData(path=Path(p), arch=arch, how=str(doc.get("how", "")), entries=tuple(entries))


def _static_best(ok: Sequence[Candidate], bound: Optional[int]) -> Candidate:
    """The cost model's choice among eligible candidates for one bucket: of
    those whose seqlen_max admits it (all of them if none does)."""
    pool = [c for c in ok if c.serves(bound)] or ok
    return min(pool, key=lambda c: static_rank(c, bound))


def _measured_pick(entry: MeasuredEntry, candidates: Sequence[Candidate], kernel: str,
                   functional: Mapping[str, Any], measured: MeasuredData,
                   notes: Optional[List[str]], instead: str) -> Optional[Candidate]:
    """The candidate a tuning entry names, or None where it cannot ship here
    (a validator finding; a line in ``notes`` says so and what ships
    ``instead``). TuningError where no candidate has its config."""
    picked = [c for c in candidates if entry.picks(c)]
    if not picked:
        cfg = ", ".join(f"{k}={v}" for k, v in entry.config)
        raise TuningError(
            f"{measured.path}: choices[{entry.index}] names {cfg} for {kernel} "
            f"{dict(functional)}, but no candidate config has it (candidates: "
            f"{'; '.join(c.key for c in candidates)}); fix the tuning file or add the "
            f"config to kernels/variants.toml")
    best = picked[0]
    if best.eligible:
        return best
    note = (f"{measured.path}: choices[{entry.index}] names {best.key}, which cannot "
            f"ship here ({'; '.join(m for _, m in best.unwaived)}); {instead}")
    if notes is not None and note not in notes:
        notes.append(note)
    return None


def choose(candidates: Sequence[Candidate], *, kernel: str, functional: Mapping[str, Any],
           measured: Optional[MeasuredData] = None,
           buckets: Sequence[int] = SEQLEN_BUCKETS,
           notes: Optional[List[str]] = None) -> List[List[Any]]:
    """Per bucket the candidate to ship; returns the merged runs
    ``[[max_seqlen or None, key, "measured"|"static"], ...]`` (the last run's
    bound is None). A measured config that cannot ship here (a validator
    finding) falls back to the static choice, with a line in ``notes``.
    Raises TuningError when measured data names a config that no candidate
    has, and ValueError when no candidate can ship at all (the caller
    reports the findings)."""
    ok = [c for c in candidates if c.eligible]
    if not ok:
        raise ValueError("no eligible candidate")
    runs: List[List[Any]] = []
    for bound in list(buckets) + [None]:
        entry = measured.entry_for(kernel, functional, bound) if measured else None
        best = _measured_pick(entry, candidates, kernel, functional, measured, notes,
                              "the static choice ships instead") if entry else None
        source = "measured"
        if best is None:
            best, source = _static_best(ok, bound), "static"
        if runs and runs[-1][1] == best.key and runs[-1][2] == source:
            runs[-1][0] = bound
        else:
            runs.append([bound, best.key, source])
    return runs


def choose_decode(candidates: Sequence[Candidate], *, kernel: str, functional: Mapping[str, Any],
                  measured: Optional[MeasuredData] = None,
                  notes: Optional[List[str]] = None) -> Optional[List[Any]]:
    """The point's decoding choice ``[seqlen_q_max, key, "measured"]``, or
    None where the tuning file has none (or its tile cannot ship here)."""
    entry = measured.decode_entry_for(kernel, functional) if measured else None
    best = _measured_pick(entry, candidates, kernel, functional, measured, notes,
                          "the key-length buckets serve decoding instead") if entry else None
    return None if best is None else [entry.seqlen_q_max, best.key, "measured"]


def measured_configs(measured: MeasuredData, spec: VariantSpec) -> Dict[str, Tuple[ConfigSpec, ...]]:
    """The configs the tuning file names, per kernel, as candidates of the
    points each entry applies to: the build compiles them besides the
    configs of variants.toml (which give the static fallback), so a tuned
    winner needs no table of its own there. An entry whose config lacks
    the compile options (``num_warps``, ``num_stages``) only picks among
    the variants.toml configs."""
    out: Dict[str, List[ConfigSpec]] = {}
    for e in measured.entries:
        if not all(k in dict(e.config) for k in REQUIRED_OPTIONS):
            continue
        where = f"{measured.path}: choices[{e.index}]"
        ks = spec.kernels.get(e.kernel)
        if ks is None:
            raise TuningError(f"{where}: kernel {e.kernel!r} is not in {spec.path}")
        axes = dict(ks.functional)
        table: Dict[str, Any] = {"archs": [measured.arch], **dict(e.config)}
        when = {k: list(v) for k, v in e.functional if k in axes}
        if when:
            table["when"] = when
        try:
            out.setdefault(e.kernel, []).append(parse_config(table, ks.constexprs, axes, where))
        except VariantSpecError as exc:
            raise TuningError(f"{exc} (a tuned config needs every tile constexpr, num_warps and "
                              f"num_stages)") from None
    return {k: tuple(v) for k, v in out.items()}


def dump_measured(doc: Mapping[str, Any]) -> str:
    """A tuning file's text: the header fields one per line, then one line
    per choice (a re-tune shows in a diff as the lines of the points that
    changed)."""
    lines = ["{"]
    for k, v in doc.items():
        if k != "choices":
            lines.append(f"  {json.dumps(k)}: {json.dumps(v)},")
    choices = list(doc.get("choices") or ())
    lines.append('  "choices": [')
    lines.extend(f"    {json.dumps(ch)}{',' if i < len(choices) - 1 else ''}"
                 for i, ch in enumerate(choices))
    lines.extend(["  ]", "}"])
    return "\n".join(lines) + "\n"


def with_choice(doc: Mapping[str, Any], matches, config: Mapping[str, Any], note: str) -> Dict[str, Any]:
    """A copy of a tuning document (``kernels/tuning/<arch>.json``) in which
    the points that ``matches(kernel, point)`` accepts ship ``config`` at
    every length: each group of their entries with the same functional
    values becomes one entry (``seqlen_max`` null, ``note``) where the group
    began. An entry that covers both matched and unmatched points, or no
    match at all, is a TuningError (split the entry, or widen the match)."""
    out: List[Dict[str, Any]] = []
    replaced: set = set()
    for ch in doc.get("choices") or ():
        func = ch.get("functional") or {}
        names = sorted(func)
        points = [dict(zip(names, vals)) for vals in itertools.product(*(func[n] for n in names))]
        hits = [matches(ch["kernel"], pt) for pt in points]
        if not any(hits):
            out.append(ch)
            continue
        if not all(hits):
            raise TuningError(f"a choice of {ch['kernel']} covers {func}, of which only some "
                              "points match: split that entry first")
        key = (ch["kernel"], json.dumps(func, sort_keys=True))
        if key not in replaced:
            replaced.add(key)
            out.append({"kernel": ch["kernel"], "functional": func, "seqlen_max": None,
                        "config": dict(config), "note": note})
    if not replaced:
        raise TuningError("no choice in the tuning file matches")
    return dict(doc, choices=out)
