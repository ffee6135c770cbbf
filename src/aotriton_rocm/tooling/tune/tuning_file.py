"""The tuning file ``aotriton-rocm tune`` writes (``kernels/tuning/<arch>.json``):
a point's result, the sequence-length buckets a run times, the file's header
(how and where it was measured) and this run's choices merged with the
entries of the file already there. Build-time only."""
from __future__ import annotations

import datetime
import importlib.metadata
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ...common.errors import UsageError
from ..builder.tuning import SEQLEN_BUCKETS, load_measured_text

__all__ = ["PointResult", "bucket_of", "file_header", "PreviousFile", "merged_file"]


@dataclass
class PointResult:
    kernel: str
    functional: Dict[str, Any]
    runs: List[Dict[str, Any]] = field(default_factory=list)  # the file's choices
    error: Optional[str] = None


def bucket_of(seqlen: int) -> Optional[int]:
    """The dispatcher bucket (its bound) a timed seqlen stands for; None: the open one."""
    if seqlen > SEQLEN_BUCKETS[-1]:
        return None
    if seqlen not in SEQLEN_BUCKETS:
        raise UsageError(f"--seqlens: {seqlen} is not a bucket bound ({', '.join(map(str, SEQLEN_BUCKETS))}) "
                         f"nor above {SEQLEN_BUCKETS[-1]} (the open bucket)")
    return seqlen


def _device_record(torch, device) -> Dict[str, Any]:
    rec: Dict[str, Any] = {"torch": torch.__version__}
    try:
        rec["triton"] = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        pass
    if device.type == "cuda":
        rec["name"] = torch.cuda.get_device_name(device)
        rec["runtime"] = f"HIP {torch.version.hip}" if torch.version.hip else f"CUDA {torch.version.cuda}"
    else:
        rec["name"] = "CPU (Triton interpreter: timings are not meaningful)"
    rec["date"] = datetime.date.today().isoformat()
    return rec


def file_header(command: str, torch, device, arch: str) -> Dict[str, Any]:
    rec = _device_record(torch, device)
    timed = ("compiled as the build compiles them and timed in CUDA graphs" if device.type == "cuda"
             else "run by Triton's interpreter (timings not meaningful)")
    return {
        "schema": 1, "arch": arch,
        "how": ("Measured by `aotriton-rocm tune` on the GPU each choice names (\"device\"; "
                "the file's \"device\" is the latest run's): per functional point and "
                "sequence-length bucket, the fastest of the candidates (variants.toml + "
                f"tuning/space.toml), {timed} (the shape in each choice's \"measured\"; "
                "causal and non-causal times added); each winner checked against float64 math "
                "(\"check\")."),
        "device": rec,
        "commands": [command],
    }


def _point_of(choice: Dict[str, Any]) -> Optional[Tuple[str, Tuple]]:
    """The one functional point an entry names, or None if it names several."""
    func = choice.get("functional") or {}
    if not all(len(v) == 1 for v in func.values()):
        return None
    return choice["kernel"], tuple(sorted((k, v[0]) for k, v in func.items()))


@dataclass(frozen=True)
class PreviousFile:
    """The tuning file that was at ``--out`` when the run started, read once."""
    raw: Dict[str, Any]
    entries: Tuple[Tuple[Any, Dict[str, Any]], ...]  # (MeasuredEntry, its JSON object)

    @classmethod
    def read(cls, out: Path, arch: str) -> Optional["PreviousFile"]:
        if not out.is_file():
            return None
        text = out.read_text(encoding="utf-8")
        raw = json.loads(text)
        return cls(raw, tuple(zip(load_measured_text(text, arch, out).entries, raw.get("choices") or ())))


def merged_file(results: List[PointResult], points: Sequence[Tuple[str, Dict[str, Any]]],
            header: Dict[str, Any], previous: Optional[PreviousFile]) -> Dict[str, Any]:
    """The new file: this run's choices first, then the entries of the
    previous file that still decide a bucket of some point of ``points``
    ((kernel, functional) pairs): one this run did not time and the entries
    before it do not cover. A point timed up to bucket ``b`` only (no length
    in the open bucket) keeps its earlier entries above ``b``; where it has
    none, its last winner covers the rest. A point's decoding entry
    (``seqlen_q_max``) is kept unless this run timed its decoding. Each
    choice names the GPU that measured it (``device``; earlier entries
    without one: the previous file's)."""
    doc = dict(header)
    gpu = header["device"]["name"]
    choices: List[Dict[str, Any]] = []
    # per point tuned now: the largest bucket bound timed (OPEN: every bucket is decided)
    reach: Dict[Any, Any] = {}
    decoded = set()  # the points whose decoding this run timed
    for r in results:
        if r.error:
            continue
        runs = [dict(c, device=gpu) for c in r.runs]
        choices += runs
        point = _point_of(runs[0])
        if any("seqlen_q_max" in c for c in runs):
            decoded.add(point)
        runs = [c for c in runs if "seqlen_q_max" not in c]
        if not runs:
            continue
        timed = [row["seqlen"] for c in runs for row in c["measured"]]
        top = _OPEN if "open" in timed else max(timed)
        if top is not _OPEN and previous is not None and not any(
                entry.applies(point[0], dict(point[1]), b)
                for entry, _ in previous.entries for b in _buckets_above(top)):
            top = _OPEN
        if top is not _OPEN:
            runs[-1]["seqlen_max"] = top
        reach[point] = top
    if previous is None:
        doc["choices"] = choices
        return doc
    kept_how = ""
    earlier_gpu = (previous.raw.get("device") or {}).get("name")
    for entry, old in previous.entries:
        decides = False
        for kernel, func in points:
            if kernel != entry.kernel:
                continue
            point = (kernel, tuple(sorted(func.items())))
            if entry.seqlen_q_max is not None:
                if point not in decoded and entry.decodes(kernel, func):
                    decides = True
                    decoded.add(point)
                continue
            top = reach.get(point)
            if top is _OPEN:
                continue
            undecided = list(SEQLEN_BUCKETS) + [None] if top is None else _buckets_above(top)
            if any(entry.applies(kernel, func, b) for b in undecided):
                decides = True
                if old.get("seqlen_max") is None:
                    reach[point] = _OPEN
        if decides:
            choices.append(old if "device" in old or not earlier_gpu else dict(old, device=earlier_gpu))
            if "measured" not in old:
                kept_how = previous.raw.get("how", "")
    raw = previous.raw
    earlier = raw.get("commands") or ([raw["command"]] if "command" in raw else [])
    doc["commands"] = [c for c in earlier if c not in header["commands"]] + header["commands"]
    if kept_how and kept_how != header["how"]:
        doc["how"] = f"{header['how']} Entries without \"measured\": {kept_how}"
    doc["choices"] = choices
    return doc


_OPEN = object()  # merged_file: every bucket of a point is decided


def _buckets_above(bound: int) -> List[Optional[int]]:
    return [b for b in SEQLEN_BUCKETS if b > bound] + [None]
