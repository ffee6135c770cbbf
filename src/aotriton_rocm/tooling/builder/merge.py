"""``aotriton-rocm merge SHARD_OUTPUTS... --out DIR``: archives from a sharded build.

Build-time only. Each ``aotriton-rocm build --shard K/N --out SHARD_DIR``
leaves ``SHARD_DIR/cache/`` (its code objects, content-addressed) and
``SHARD_DIR/shard.json`` (shard K of N, profile, archs, build inputs hash,
the cache keys it holds). Merge checks that exactly shards 1..N of one build
are given (none missing, none twice, same inputs), copies their cache entries
(sha256-checked) into ``DIR/cache`` and then runs the ordinary archive step
of ``build`` over them (plan, the cache in place of compiling, validate,
select, write). The archives and
manifests are therefore produced by the same writer from the same code
objects as an unsharded build: byte-identical (nothing in them records a
path, a shard or a time). Merge needs the same checkout (kernels/, ci/) the
shards were built from; a different one is refused by the inputs hash.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, TextIO, Tuple

from ...common.errors import UsageError
from ...common.files import atomic_write_json
from ...core.kernel_spec import VariantSpecError
from .command import (SHARD_FILE, SHARD_KIND, BuildResult, assemble, check_out_dir, clean_leftovers,
                    print_result)
from .compile import Executor, require_cached
from .plan import BuildError, Sources, plan_build
from .cache import CompileCache

__all__ = ["ShardError", "MergeOptions", "read_shard", "check_shards", "merge", "add_merge_arguments",
           "run_merge"]

_SAME = ("profile", "archs", "build_inputs_hash", "compiler_version", "total_keys")


class ShardError(UsageError, RuntimeError):
    """The shard outputs given to merge are incomplete, duplicated or inconsistent."""


def read_shard(shard_dir) -> Dict[str, Any]:
    d = Path(shard_dir)
    f = d / SHARD_FILE
    try:
        doc = json.loads(f.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ShardError(f"{d}: not a complete shard output (no {SHARD_FILE}); build it with "
                         f"`aotriton-rocm build --shard K/N --out {d}` and wait for it to finish") from None
    except (OSError, ValueError) as e:
        raise ShardError(f"{f}: unreadable shard file: {e}") from None
    if not isinstance(doc, dict) or doc.get("kind") != SHARD_KIND:
        raise ShardError(f"{f}: not an aotriton-rocm shard file")
    return doc


def check_shards(dirs: Sequence[Path], docs: Sequence[Dict[str, Any]]) -> int:
    """Refuse anything but shards 1..N of one build, each given once; returns N."""
    if not docs:
        raise ShardError("no shard outputs given")
    first = docs[0]
    n = int(first["shards"])
    for d, doc in zip(dirs[1:], docs[1:]):
        if int(doc["shards"]) != n:
            raise ShardError(f"{d} is shard {doc['shard']}/{doc['shards']}, {dirs[0]} is "
                             f"{first['shard']}/{n}: shards of different partitions cannot be merged")
        for k in _SAME:
            if doc.get(k) != first.get(k):
                raise ShardError(f"{d} and {dirs[0]} come from different builds ({k}: "
                                 f"{doc.get(k)!r} vs {first.get(k)!r})")
    by_index: Dict[int, List[Path]] = {}
    for d, doc in zip(dirs, docs):
        by_index.setdefault(int(doc["shard"]), []).append(d)
    twice = {k: ds for k, ds in by_index.items() if len(ds) > 1}
    if twice:
        k, ds = min(twice.items())
        raise ShardError(f"shard {k}/{n} given more than once: {', '.join(map(str, ds))}")
    missing = sorted(set(range(1, n + 1)) - set(by_index))
    if missing:
        got = ", ".join(f"{k}/{n}" for k in sorted(by_index))
        raise ShardError(f"missing shard(s) {', '.join(f'{k}/{n}' for k in missing)} "
                         f"(got {got}); merge needs all {n} shard outputs")
    keys = [k for doc in docs for k in doc["keys"]]
    if len(set(keys)) != len(keys) or len(keys) != int(first["total_keys"]):
        raise ShardError(f"the shard files list {len(set(keys))} distinct of {len(keys)} keys, the build "
                         f"has {first['total_keys']}: corrupted shard files")
    return n


def merge(shard_dirs: Sequence, out_dir, source_root=None, *, kernels_dir=None, targets_path=None,
          progress: bool = False, stream: Optional[TextIO] = None) -> BuildResult:
    """Assemble the archives of a sharded build into ``out_dir`` (see module doc):
    the build's plan, the code objects from the shards' caches instead of
    compiling, then the build's validate, select and write stages.

    Raises ShardError for missing/duplicate/inconsistent shards or a broken
    cache entry, BuildError if validation fails or the checkout differs.
    """
    started = time.monotonic()
    dirs = [Path(d).resolve() for d in shard_dirs]
    docs = [read_shard(d) for d in dirs]
    n = check_shards(dirs, docs)
    out = Path(out_dir).resolve()
    dest = CompileCache(out / "cache")
    for d, doc in zip(dirs, docs):
        src = CompileCache(d / "cache")
        for key in doc["keys"]:
            hit = src.get(key)
            if hit is None:
                raise ShardError(f"{d}: cache entry {key} of shard {doc['shard']}/{n} is missing or "
                                 f"corrupted; rebuild that shard")
            if src.root != dest.root and dest.get(key) is None:
                dest.put(key, hit[0], hit[1])
    first = docs[0]
    sources = Sources.find(source_root, kernels_dir, targets_path)
    plan = plan_build(first["profile"], list(first["archs"]), sources)
    if plan.inputs_hash != first["build_inputs_hash"]:
        raise BuildError(f"the shards were built from other inputs (build inputs hash "
                         f"{first['build_inputs_hash'][:16]}...) than {sources.kernels_dir} + "
                         f"{sources.targets_path} ({plan.inputs_hash[:16]}...): merge with the same "
                         f"checkout the shards used")
    check_out_dir(out)
    clean_leftovers(out)
    compiled = require_cached(plan, dest)
    res = assemble(plan, compiled, out, executor=Executor(jobs=1), started=started, stream=stream)
    res.report["merged_from"] = [{"shard": f"{doc['shard']}/{n}", "keys": len(doc["keys"])}
                                 for doc in sorted(docs, key=lambda x: x["shard"])]
    atomic_write_json(res.report_path, res.report)
    return res


@dataclass(frozen=True)
class MergeOptions:
    shards: Tuple[Path, ...]
    out: Path
    source_root: Optional[Path] = None
    kernels_dir: Optional[Path] = None
    targets: Optional[Path] = None
    progress: bool = True

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "MergeOptions":
        def path(v: Optional[str]) -> Optional[Path]:
            return Path(v) if v else None
        return cls(shards=tuple(Path(s) for s in args.shards), out=Path(args.out),
                   source_root=path(args.source_root), kernels_dir=path(args.kernels_dir),
                   targets=path(args.targets), progress=args.progress)


def add_merge_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("shards", nargs="+", metavar="SHARD_OUTPUT",
                        help="output directories of `aotriton-rocm build --shard K/N` (all N of them)")
    parser.add_argument("--out", "-o", dest="out", required=True, metavar="DIR",
                        help="output directory: archives/, cache/, build-report.json")
    parser.add_argument("--source-root", dest="source_root", default=None, metavar="DIR",
                        help="the checkout the shards were built from (default: found from the cwd)")
    parser.add_argument("--kernels-dir", dest="kernels_dir", default=None, metavar="DIR")
    parser.add_argument("--targets", dest="targets", default=None, metavar="FILE")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    return parser


def run_merge(options: MergeOptions) -> int:
    """CommandError: 1 validation failure, 2 bad/missing/duplicate shards or bad request."""
    try:
        res = merge(options.shards, options.out, source_root=options.source_root,
                    kernels_dir=options.kernels_dir, targets_path=options.targets,
                    progress=options.progress)
    except VariantSpecError as e:
        raise UsageError(str(e)) from e
    print_result(res, f"merged {len(options.shards)} shard(s) into {os.path.relpath(res.out_dir)}")
    return 0
