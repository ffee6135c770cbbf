"""Upstream AOTriton's tuning databases -> ``kernels/tuning/<arch>.json`` entries.

Build-time tooling, never shipped at run time::

    python -m aotriton_rocm.tooling.tune.upstream --db DIR [--tag 0.13b] [--commit SHA] \\
        [--drops kernels/tuning/upstream/drops.json] [--out kernels/tuning]
        [--arch gfx942 --only dtype=fp16 --check-spills BUILD_DIR]

``DIR`` holds upstream's ``<gpu>/flash/<kernel>.sqlite3`` files (or their
``.sqlite3.tar.xz``), as ``modules/database/amd/`` of ROCm/aotriton ships
them. Each database row is one best config that AMD measured for (dtype, head
dim, seqlen_q, seqlen_k, causal, dropout, bias, ...). Our kernels choose per
functional point and *one* seqlen bucket (along the grid axis), so for every
(point, bucket) the rows at that grid-axis length vote over the other length
and causal/non-causal; the config with most votes wins (ties: the square
non-causal problem's choice, then the smallest config). Consecutive buckets
with the same winner become one entry.

Mapping (where it is not one to one, see docs/BUILD.md "AMD tuning from AMD's
measurements"):

* attn_fwd <- attn_fwd; attn_bwd_dkdv <- bwd_kernel_dk_dv; attn_bwd_dq <-
  bwd_kernel_dq (the tiles mean the same: BLOCK_N the key tile of dK/dV's
  grid, BLOCK_M the query tile of the forward's and dQ's). bwd_kernel_fuse is
  not imported: no AMD fused backward here.
* pad_head = false at head dim D (64, 128) <- upstream rows at exactly D;
  pad_head = true at 64 and 128 <- rows with D/2 < d < D (upstream composes
  such head dims from power-of-two pieces; ours masks a padded tile); at the
  tiles that have only the masked variant (16, 32, 256, 512) <- rows at D.
* Only rows without ALiBi, int8 or P scaling (ALiBi and softcap are runtime
  arguments of our masked variants, untuned upstream). PERSISTENT_TYPE and
  GRID_CU_MULTIP (a persistent grid) have no counterpart and are ignored.
* gfx908 (no upstream data) takes gfx90a's rows: the nearest CDNA evidence.

Every entry records its provenance (``source`` = ``SOURCE``, ``upstream``:
whose kernel, which GPU, which database, tag and commit): apart from our own
``tune`` measurements, which carry ``measured`` and replace them point by
point. ``--drops`` lists the (arch, kernel, point, config)s that spill or
overflow in our kernel (``--check-spills`` compiles and validates them as
the build does, and updates that list; upstream_drops.py): those configs are left out (a
lower-voted config we compile, or the static choice, takes their buckets)
and listed in the file's ``dropped``. Only the CDNA points that matter most
compile upstream's own config (:func:`admitted_point`); elsewhere an entry
names our candidate of upstream's tile.
"""
from __future__ import annotations

import argparse
import json
import lzma
import sqlite3
import sys
import tarfile
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ...commands.cli import plain_text
from ..builder.tuning import SEQLEN_BUCKETS, dump_measured
from .upstream_drops import check_spills, drops_by_key, dropped_key, load_drops, merge_drops, point_key

__all__ = ["SOURCE", "KERNELS", "ARCHS", "HEAD_DIMS", "convert", "entries_for", "admitted_point",
           "our_candidates", "main"]

SOURCE = "upstream-aotriton"
REPO = "ROCm/aotriton"
DB_PATH = "modules/database/amd/{gpu}/flash/{kernel}.sqlite3.tar.xz"
# our kernel -> (upstream kernel, grid-axis column, other-length column)
KERNELS = {
    "attn_fwd": ("attn_fwd", "inputs$Max_seqlen_q", "inputs$Max_seqlen_k"),
    "attn_bwd_dkdv": ("bwd_kernel_dk_dv", "inputs$max_seqlen_k", "inputs$max_seqlen_q"),
    "attn_bwd_dq": ("bwd_kernel_dq", "inputs$max_seqlen_q", "inputs$max_seqlen_k"),
}
# our arch -> (upstream database, its GPU in words, note)
ARCHS = {
    "gfx908": ("gfx90a", "AMD Instinct MI200 (gfx90a)",
               "gfx908 (MI100) has no upstream database: gfx90a's, the nearest CDNA evidence "
               "(same 64-wide waves and MFMA; gfx908 has half the unified VGPR file: 256 VGPRs "
               "+ 256 AGPRs)"),
    "gfx90a": ("gfx90a", "AMD Instinct MI200 (gfx90a)", ""),
    "gfx942": ("gfx942", "AMD Instinct MI300X (gfx942)", ""),
    "gfx950": ("gfx950", "AMD Instinct MI350 (gfx950)", ""),
    "gfx1100": ("gfx1100", "AMD Radeon RX 7900 (gfx1100)", ""),
    "gfx1201": ("gfx1201", "AMD Radeon RX 9070 (gfx1201)", ""),
}
DTYPES = {"fp16": "torch.float16", "bf16": "torch.bfloat16", "fp32": "torch.float32"}
HEAD_DIMS = (16, 32, 64, 128, 256, 512)
UNMASKED = (64, 128)  # the head dims with an unmasked (pad_head = false) variant
_FLAGS = ("inputs$USE_ALIBI", "inputs$INT8", "inputs$INT8_KV", "inputs$USE_P_SCALE")
# upstream column -> our config key (compile options and constexprs)
_CONFIG = (("tuned_kernel$BLOCK_M", "BLOCK_M"), ("tuned_kernel$BLOCK_N", "BLOCK_N"),
           ("tuned_kernel$PRE_LOAD_V", "PRE_LOAD_V"), ("compiler_options$waves_per_eu", "waves_per_eu"),
           ("compiler_options$num_warps", "num_warps"), ("compiler_options$num_stages", "num_stages"))


def _open_db(path: Path, tmp: Path) -> sqlite3.Connection:
    """A database file, or the one sqlite3 file inside a .tar.xz."""
    if path.name.endswith(".tar.xz"):
        with lzma.open(path) as xz, tarfile.open(fileobj=xz, mode="r|") as tar:
            for member in tar:
                if member.isfile() and member.name.endswith(".sqlite3"):
                    out = tmp / (path.name[:-len(".tar.xz")])
                    out.write_bytes(tar.extractfile(member).read())
                    path = out
                    break
            else:
                raise ValueError(f"{path}: no .sqlite3 file inside")
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def _find_db(root: Path, gpu: str, kernel: str) -> Optional[Path]:
    for sub in (Path(gpu) / "flash", Path(gpu)):
        for name in (f"{kernel}.sqlite3", f"{kernel}.sqlite3.tar.xz"):
            if (root / sub / name).is_file():
                return root / sub / name
    return None


def _rows(conn: sqlite3.Connection, kernel: str) -> List[Dict[str, Any]]:
    table = f"FLASH${kernel}"
    cur = conn.execute(f'SELECT * FROM "{table}"')
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur]


def _config(row: Mapping[str, Any], kernel: str) -> Tuple[Tuple[str, Any], ...]:
    out = []
    for col, key in _CONFIG:
        if col not in row or row[col] is None:
            continue
        value = int(row[col])
        if key == "PRE_LOAD_V":
            if kernel != "attn_fwd" or not value:
                continue  # false is the kernel's default (its variant key leaves it out)
            value = True
        out.append((key, value))
    return tuple(out)


def _head_dims(tile: int, pad_head: bool) -> range:
    """Upstream's head dims that vote for our point: ``tile`` itself where it
    runs this variant (the unmasked one; the masked one at the tiles without
    an unmasked variant: 16, 32, 256, 512), the head dims between half the
    tile and it for the masked variant at 64 and 128."""
    if not pad_head or tile not in UNMASKED:
        return range(tile, tile + 1)
    return range(tile // 2 + 1, tile)


def _ranked(voters: Sequence[Mapping[str, Any]], kernel: str, other: str,
            length: int) -> Tuple[List[Tuple[Tuple[str, Any], ...]], Counter]:
    """Upstream's configs at one length, most votes first (ties: the square
    non-causal problem's choice, then the smallest config)."""
    votes = Counter(_config(r, kernel) for r in voters)
    square = Counter(_config(r, kernel) for r in voters
                     if int(r[other]) == length and not r["inputs$CAUSAL_TYPE"])
    return sorted(votes, key=lambda c: (-votes[c], -square[c], sorted(c))), votes


def entries_for(rows: Sequence[Mapping[str, Any]], kernel: str, points: Iterable[Mapping[str, Any]],
                ours=None) -> List[Tuple[Dict[str, Any], List[Dict[str, Any]]]]:
    """Per functional point of ``kernel`` (ours), the runs of buckets with one
    choice: ``(point, [{"seqlen_max", "config", "votes", "rows", "rank"}, ...])``.

    Per bucket upstream's configs are taken in vote order; ``ours(point,
    config)`` says what entry config (if any) names it among our candidates
    (None: every config as it is). The first config ours() accepts is the
    bucket's choice; a bucket with none ends the point's entries there (the
    buckets above stay static: an entry serves every bucket up to its bound).
    Points with no row at all are left out. A bucket beyond upstream's
    longest length takes the longest length's rows."""
    _, axis, other = KERNELS[kernel]
    usable = [r for r in rows if not any(r.get(f) for f in _FLAGS)]
    index: Dict[Tuple, List[Mapping[str, Any]]] = {}
    for r in usable:
        key = (r["inputs$Q_dtype"], int(r["inputs$BLOCK_DMODEL"]), bool(r["inputs$BIAS_TYPE"]),
               bool(r["inputs$ENABLE_DROPOUT"]), int(r[axis]))
        index.setdefault(key, []).append(r)
    lengths = sorted({int(r[axis]) for r in usable})
    out = []
    for point in points:
        dims = _head_dims(int(point["head_dim"]), bool(point.get("pad_head", True)))
        runs: List[Dict[str, Any]] = []
        for bound in list(SEQLEN_BUCKETS) + [None]:
            fit = [n for n in lengths if bound is None or n <= bound]
            if not fit:
                break
            length = fit[-1]
            voters = [r for d in dims for r in index.get(
                (DTYPES[point["dtype"]], d, bool(point.get("has_bias")),
                 bool(point.get("enable_dropout")), length), ())]
            ranked, votes = _ranked(voters, kernel, other, length)
            pick = next(((i, c, ours(point, c) if ours else c) for i, c in enumerate(ranked)
                         if ours is None or ours(point, c) is not None), None)
            if pick is None:
                break
            rank, up, config = pick
            if runs and runs[-1]["config"] == config:
                runs[-1]["seqlen_max"] = bound
                runs[-1]["votes"] += votes[up]
                runs[-1]["rows"] += len(voters)
                runs[-1]["rank"] = max(runs[-1]["rank"], rank)
            else:
                runs.append({"seqlen_max": bound, "config": config, "votes": votes[up],
                             "rows": len(voters), "rank": rank, "upstream": up})
        if runs:
            out.append((dict(point), runs))
    return out


def _points(kernel: str) -> List[Dict[str, Any]]:
    """Our functional points with an upstream counterpart (fp16/bf16/fp32,
    head dims 16..512; pad_head = false only at 64 and 128, no bias or
    dropout, as variants.toml compiles it)."""
    out = []
    for dtype in DTYPES:
        for hd in HEAD_DIMS:
            for pad in (False, True):
                if not pad and (hd not in UNMASKED or dtype == "fp32"):
                    continue
                for bias in (False, True):
                    for drop in (False, True):
                        if not pad and (bias or drop):
                            continue
                        out.append({"dtype": dtype, "head_dim": hd, "pad_head": pad,
                                    "has_bias": bias, "enable_dropout": drop})
    return out


def admitted_point(arch: str, point: Mapping[str, Any]) -> bool:
    """Points whose upstream config is compiled as a candidate of its own (with
    its waves_per_eu and PRE_LOAD_V): the CDNA archs' fp16/bf16 points without
    bias or dropout at head dims 64 and 128, and 256 (masked). Elsewhere an
    entry only names one of our own candidates with upstream's tile: each
    admitted point costs one compile per arch, and the default build's compile
    count may grow by 15% at most."""
    return (ARCHS[arch][0] in ("gfx90a", "gfx942", "gfx950") and point["dtype"] in ("fp16", "bf16")
            and not point.get("has_bias") and not point.get("enable_dropout")
            and (point["head_dim"] in (64, 128) or (point["head_dim"] == 256 and point["pad_head"])))


def admitted_configs(rows: Sequence[Mapping[str, Any]], kernel: str, arch: str,
                     points: Iterable[Mapping[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """Per admitted point (its :func:`point_key`) the one upstream config
    compiled for it: the one most of the point's rows chose, over every
    length and causal or not."""
    out = {}
    for point in points:
        if not admitted_point(arch, point):
            continue
        dims = _head_dims(int(point["head_dim"]), bool(point["pad_head"]))
        voters = [r for r in rows if not any(r.get(f) for f in _FLAGS)
                  and r["inputs$Q_dtype"] == DTYPES[point["dtype"]]
                  and int(r["inputs$BLOCK_DMODEL"]) in dims
                  and bool(r["inputs$BIAS_TYPE"]) == bool(point["has_bias"])
                  and bool(r["inputs$ENABLE_DROPOUT"]) == bool(point["enable_dropout"])]
        if voters:
            _, axis, other = KERNELS[kernel]
            ranked, _ = _ranked(voters, kernel, other, max(int(r[axis]) for r in voters))
            out[point_key(kernel, point)] = dict(ranked[0])
    return out


def our_candidates(kernels_dir: Path, targets_path: Path, arch: str) -> Dict[str, List[Dict[str, Any]]]:
    """Per (kernel, point) key the configs variants.toml compiles for ``arch``."""
    from ...core.kernel_spec import load_variants
    from ..common.targets import load_targets
    from ..common.targets import TargetError
    targets = load_targets(Path(targets_path))
    try:
        _, specs = targets.resolve(None, [arch])
    except TargetError:  # not in the default profile (gfx950): the newest that has it
        _, specs = targets.resolve("7.2", [arch])
    out: Dict[str, List[Dict[str, Any]]] = {}
    for v in load_variants(Path(kernels_dir)).variants_for(specs[0]):
        if v.kernel in KERNELS:
            out.setdefault(point_key(v.kernel, v.functional), []).append(dict(v.config))
    return out


def _chooser(arch: str, kernel: str, admitted: Mapping[str, Mapping[str, Any]],
             candidates: Mapping[str, Sequence[Mapping[str, Any]]], drops: Mapping[str, str]):
    def ours(point, up):
        config = dict(up)
        pk = point_key(kernel, point)
        if admitted.get(pk) == config and dropped_key(arch, kernel, point, config) not in drops:
            return config
        tile = {k: config[k] for k in ("BLOCK_M", "BLOCK_N")}
        if any(all(c.get(k) == v for k, v in tile.items()) for c in candidates.get(pk, ())):
            return tile
        return None
    return ours


def convert(db_root: Path, arch: str, *, tag: str, commit: str = "",
            candidates: Mapping[str, Sequence[Mapping[str, Any]]],
            drops: Mapping[str, str] = (), kernels: Sequence[str] = tuple(KERNELS),
            points_of=_points) -> Dict[str, Any]:
    """The tuning document of ``arch`` from the databases under ``db_root``;
    ``candidates``: :func:`our_candidates`; ``drops``: :func:`load_drops`."""
    gpu, gpu_words, arch_note = ARCHS[arch]
    drops = dict(drops)
    choices: List[Dict[str, Any]] = []
    dropped: List[Dict[str, Any]] = []
    counts: Dict[str, Dict[str, int]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kernel in kernels:
            up = KERNELS[kernel][0]
            path = _find_db(Path(db_root), gpu, up)
            if path is None:
                continue
            conn = _open_db(path, Path(tmp))
            try:
                rows = _rows(conn, up)
            finally:
                conn.close()
            gpu_ids = sorted({str(r.get("gpu")) for r in rows})
            prov = {"kernel": f"{REPO} {tag} {up} (AMD's Triton kernel)",
                    "gpu": f"{gpu_words}, measured as {'/'.join(gpu_ids)}",
                    "database": DB_PATH.format(gpu=gpu, kernel=up), "tag": tag}
            if commit:
                prov["commit"] = commit
            if arch_note:
                prov["note"] = arch_note
            points = points_of(kernel)
            admitted = admitted_configs(rows, kernel, arch, points)
            for pk, config in sorted(admitted.items()):
                point = next(p for p in points if point_key(kernel, p) == pk)
                why = drops.get(dropped_key(arch, kernel, point, config))
                if why is not None:
                    dropped.append({"kernel": kernel, "functional": {k: [v] for k, v in point.items()},
                                    "config": config, "why": why})
            n = counts.setdefault(kernel, {"entries": 0, "points": 0, "own_config": 0, "tile_only": 0})
            ours = _chooser(arch, kernel, admitted, candidates, drops)
            for point, runs in entries_for(rows, kernel, points, ours):
                n["points"] += 1
                for run in runs:
                    config = dict(run["config"])
                    full = "num_warps" in config
                    n["own_config" if full else "tile_only"] += 1
                    n["entries"] += 1
                    how = dict(prov, votes=f"{run['votes']} of {run['rows']} rows")
                    if not full:
                        how["config"] = ("upstream chose " + ",".join(
                            f"{k}={v}" for k, v in run["upstream"]) + "; ours names our candidate "
                            "of that tile (its own warps, stages and options)")
                    if run["rank"]:
                        how["rank"] = (f"upstream's choice {run['rank'] + 1} by votes (those above it "
                                       "have no candidate here)")
                    choices.append({"kernel": kernel, "functional": {k: [v] for k, v in point.items()},
                                    "seqlen_max": run["seqlen_max"], "config": config,
                                    "source": SOURCE, "upstream": how,
                                    "device": f"{gpu_words} (upstream AOTriton's tuning)"})
    how = (f"Imported from upstream AOTriton's tuning databases ({REPO} tag {tag}"
           f"{', commit ' + commit if commit else ''}): the configs AMD measured fastest for "
           f"AMD's own Triton kernels on {gpu_words}, mapped onto our kernels' configs and "
           "seqlen buckets by `python -m aotriton_rocm.tooling.tune.upstream` (per point and "
           "bucket, the config most rows at that length chose, over the other length and "
           "causal or not). Not timed with our kernels: every entry says so (\"source\": "
           f"\"{SOURCE}\", \"upstream\"); `aotriton-rocm tune` on the GPU replaces them point by "
           "point. docs/BUILD.md, \"AMD tuning from AMD's measurements\", says where the mapping "
           "is not one to one." + (f" {arch_note}." if arch_note else ""))
    doc: Dict[str, Any] = {"schema": 1, "arch": arch, "how": how,
                           "imported": {"source": SOURCE, "tag": tag, "database_gpu": gpu,
                                        "counts": counts, "dropped": len(dropped)}}
    if dropped:
        doc["dropped"] = dropped
    doc["choices"] = choices
    return doc


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m aotriton_rocm.tooling.tune.upstream",
                                description=plain_text(__doc__.split("\n\n")[0]))
    p.add_argument("--db", required=True, type=Path, help="folder of <gpu>/flash/<kernel>.sqlite3[.tar.xz]")
    p.add_argument("--tag", default="0.13b")
    p.add_argument("--commit", default="")
    p.add_argument("--arch", action="append", default=None, choices=sorted(ARCHS))
    p.add_argument("--drops", type=Path, default=None,
                   help="configs found to spill in our kernels (JSON), left out")
    p.add_argument("--kernels-dir", type=Path, default=Path("kernels"))
    p.add_argument("--targets", type=Path, default=Path("ci/targets.toml"))
    p.add_argument("--out", type=Path, default=None, help="default: KERNELS_DIR/tuning")
    p.add_argument("--check-spills", type=Path, default=None, metavar="BUILD_DIR",
                   help="after writing, compile and validate every candidate with an AMD option "
                        "in BUILD_DIR and write the ones that spill to --drops")
    p.add_argument("--jobs", "-j", type=int, default=None)
    p.add_argument("--only", action="append", default=[], help="with --check-spills: build --only's subset")
    args = p.parse_args(argv)
    archs = args.arch or sorted(ARCHS)
    out_dir = args.out or args.kernels_dir / "tuning"
    if args.check_spills is None:
        _write_all(args, archs, out_dir, load_drops(args.drops))
        return 0
    # every upstream config a candidate again, so that earlier drops are checked anew
    _write_all(args, archs, out_dir, {})
    found = check_spills(archs, kernels_dir=args.kernels_dir, targets_path=args.targets,
                         out=args.check_spills, jobs=args.jobs, only=args.only)
    errors = [d for d in found if "error" in d]
    earlier = json.loads(args.drops.read_text(encoding="utf-8")) if args.drops and args.drops.is_file() else []
    merged = merge_drops(earlier, found, archs, args.only)
    if args.drops is not None:
        args.drops.parent.mkdir(parents=True, exist_ok=True)
        args.drops.write_text(json.dumps(merged, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    _write_all(args, archs, out_dir, drops_by_key(merged))
    for e in errors:
        print(f"error: {e['arch']}: {e['error']}", file=sys.stderr)
    return 1 if errors else 0


def _write_all(args, archs: Sequence[str], out_dir: Path, drops: Mapping[str, str]) -> None:
    for arch in archs:
        doc = convert(args.db, arch, tag=args.tag, commit=args.commit, drops=drops,
                      candidates=our_candidates(args.kernels_dir, args.targets, arch))
        if not doc["choices"] and not doc.get("dropped"):
            print(f"{arch}: no upstream rows", file=sys.stderr)
            continue
        out = out_dir / f"{arch}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(dump_measured(doc), encoding="utf-8")
        print(f"{arch}: {json.dumps(doc['imported']['counts'])}, {len(doc.get('dropped', ()))} "
              f"dropped -> {out}")


if __name__ == "__main__":
    raise SystemExit(main())
