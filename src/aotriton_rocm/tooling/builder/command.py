"""``aotriton-rocm build``: compile every variant for a ROCm profile x arch set.

Build-time only. The build is five stages with data between them, each in
its own module:

1. plan (plan.py): resolve targets (ci/targets.toml), enumerate the
   variants (kernels/variants.toml; ``--only`` keeps whole functional points)
   and their content-addressed compile tasks -> ``BuildPlan``;
2. compile (compile.py): cache lookup, the misses compiled in parallel
   worker processes (triton.compile, CPU only) -> ``Compiled``;
3. validate (validate.py): static checks of every code object ->
   ``Validation``;
4. select (select.py): the candidate configs that ship;
5. write (write.py): one archive per arch + manifest sidecar.

:func:`build` composes them; ``merge`` (merge.py) composes plan, the cache
of the shard outputs, validate, select and write. The report and chart are
build_report.py's.

Output layout::

    OUT/archives/<arch>.aotr
    OUT/archives/<arch>.manifest.json
    OUT/cache/                 compiled code objects by content hash
    OUT/build-report.json      per arch: kernels, compiled vs cached, seconds, bytes

Sharded (``--shard K/N``): the build compiles and validates only shard K of
the unique compile tasks and writes ``OUT/cache/`` plus ``OUT/shard.json``
(which keys it holds, the build inputs hash) instead of archives;
``aotriton-rocm merge`` assembles the archives from all N shard outputs.
Partition: the unique cache keys (sha256 of each compile's inputs, no paths,
no ROCm profile) sorted, task i -> shard i mod N. It depends only on the
build inputs, not on the machine, checkout path or enumeration order, shard
sizes differ by at most one, and since the keys are hashes each shard gets a
random mix of cheap and expensive kernels (contiguous ranges of the sorted
variant names would put e.g. every backward kernel in one shard).

Executors: ``local`` (a process pool, default), ``dask`` (a running Dask
scheduler, ``--scheduler tcp://HOST:PORT``) and ``dask-local`` (a LocalCluster
on 127.0.0.1); see dask_executor.py.

Archives are only written when every variant of the build compiled and
validated; each file is written atomically (temp file + rename), so a failed
build leaves no partial archive and previous archives untouched.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, TextIO, Tuple

from ... import _version
from ...common.archive import ARCHIVE_SUFFIX
from ...common.errors import INTERRUPTED, CommandError, UsageError
from ...common.files import atomic_write_bytes, atomic_write_json, parent_file_problem, pid_alive
from ...core.kernel_spec import VariantSpecError
from .compile import TRITON_CACHE_PREFIX, Compiled, Executor, compile_plan
from .plan import (BuildError, BuildPlan, Sources, Subset, build_inputs_hash, parse_shard,
                         plan_build, shard_keys)
from .report import arch_chart_png, format_arch_table
from .select import select_shipped
from .validate import validate_plan
from .write import ArchResult, set_aside_stale, write_archives
from .cache import CompileCache
from .triton_compile import COMPILE_ENV, scrubbed_env_names
from .dask_executor import EXECUTORS
from ..common.progress import format_seconds

__all__ = [
    "BuildError",
    "ArchResult",
    "BuildResult",
    "BuildOptions",
    "build",
    "assemble",
    "build_inputs_hash",
    "parse_shard",
    "shard_keys",
    "add_build_arguments",
    "run_build",
]

REPORT_NAME = "build-report.json"
SHARD_FILE = "shard.json"
SHARD_KIND = "aotriton-rocm-build-shard"
MAX_ERRORS_SHOWN = 10


class OutDirError(UsageError, OSError):
    """``--out`` is a file or cannot be written (checked before compiling)."""


@dataclass
class BuildResult:
    out_dir: Path
    profile: str
    archs: List[str]
    per_arch: Dict[str, ArchResult]
    report_path: Path
    report: Dict[str, Any]
    compiled: int
    cached: int
    seconds: float
    shard: Optional[Tuple[int, int]] = None
    shard_file: Optional[Path] = None

    @property
    def archives(self) -> Dict[str, Path]:
        return {a: r.archive for a, r in self.per_arch.items()}

    @property
    def manifests(self) -> Dict[str, Path]:
        return {a: r.manifest for a, r in self.per_arch.items()}


def check_out_dir(out: Path) -> None:
    """Refuse (OutDirError, before compiling anything) an ``--out`` that is a
    file or cannot be written."""
    if out.exists() and not out.is_dir():
        raise OutDirError(f"--out {out} is a file, not a directory: pass a directory (created if "
                          f"missing), or remove the file")
    why = parent_file_problem(out)
    if why:
        raise OutDirError(why)
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=out)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise OutDirError(f"--out {out} cannot be written ({e.strerror or e}): pass a writable "
                          f"directory with --out") from None


def clean_leftovers(out: Path) -> List[Path]:
    """Remove what interrupted builds left in ``OUT/.tmp`` (triton caches of
    processes that are gone; the name carries the pid). Returns what went."""
    tmp_root = out / ".tmp"
    removed: List[Path] = []
    try:
        entries = list(tmp_root.iterdir())
    except OSError:
        return removed
    for p in entries:
        if not p.name.startswith(TRITON_CACHE_PREFIX):
            continue
        pid = p.name[len(TRITON_CACHE_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and pid_alive(int(pid)):
            continue  # a build running now
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    try:
        tmp_root.rmdir()
    except OSError:
        pass
    return removed


def build(profile: Optional[str], archs: Optional[Sequence[str]], out_dir, source_root=None,
          jobs: Optional[int] = None, *, kernels_dir=None, targets_path=None,
          progress: bool = True, stream: Optional[TextIO] = None,
          shard: Optional[Tuple[int, int]] = None, executor: str = "local",
          scheduler: Optional[str] = None, only: Sequence[str] = ()) -> BuildResult:
    """Build one archive per arch for ROCm ``profile`` into ``out_dir``.

    ``archs``: arch names / families / "default" / "all" (comma lists allowed);
    None means targets.toml's default_archs. ``source_root``: the checkout
    (default: found by walking up from the cwd); ``kernels_dir`` and
    ``targets_path`` override ``<source_root>/kernels`` and
    ``<source_root>/ci/targets.toml``. ``jobs``: worker processes (default:
    all cores). ``only``: ``NAME=VALUE[|VALUE]`` texts (``--only``) keeping
    whole functional points, e.g. ``["dtype=fp16,head_dim=128"]``. Raises
    TargetError / VariantSpecError / UsageError for bad requests or specs
    (before compiling anything) and BuildError if any variant fails to
    compile or validate (no archive is written then).

    ``shard=(K, N)``: compile + validate shard K only and write
    ``OUT/shard.json`` instead of archives. ``executor``: "local", "dask"
    (needs ``scheduler``, tcp://HOST:PORT) or "dask-local" (LocalCluster on
    127.0.0.1 with ``jobs`` workers).
    """
    t_start = time.monotonic()
    ex = Executor(executor, scheduler, jobs)
    ex.check()
    if shard is not None:
        k, n = shard
        if n < 1 or not 1 <= k <= n:
            raise ValueError(f"shard {k}/{n}: need 1 <= K <= N")
    sources = Sources.find(source_root, kernels_dir, targets_path)
    out = Path(out_dir).resolve()
    plan = plan_build(profile, archs, sources, Subset.parse(only))
    check_out_dir(out)
    clean_leftovers(out)
    total_keys = len(plan.keys)
    mine: Optional[List[str]] = None
    if shard is not None:
        (out / SHARD_FILE).unlink(missing_ok=True)  # a failed rerun leaves no stale shard file
        mine = shard_keys(plan.keys, *shard)
        plan = plan.restricted_to(mine)
    compiled = compile_plan(plan, CompileCache(out / "cache"), out, ex, progress=progress,
                            stream=stream)
    return assemble(plan, compiled, out, executor=ex, started=t_start, stream=stream, shard=shard,
                    shard_key_list=mine, total_keys=total_keys)


def _compile_summary(plan: BuildPlan, compiled: Compiled, arch: str) -> Dict[str, Any]:
    items = plan.items[arch]
    return {
        "kernels": len(items),
        "candidates": len(items),
        "compiled": sum(1 for _, t in items if t.cache_key in compiled.compiled_keys),
        "failed": sum(1 for _, t in items if t.cache_key not in compiled.results),
        "compile_cpu_seconds": round(compiled.seconds.get(arch, 0.0), 3),
        "warnings": plan.warnings[arch],
    }


def assemble(plan: BuildPlan, compiled: Compiled, out: Path, *, executor: Executor, started: float,
             stream: Optional[TextIO] = None, shard: Optional[Tuple[int, int]] = None,
             shard_key_list: Optional[List[str]] = None, total_keys: int = 0) -> BuildResult:
    """Stages 3-5 and the report: validate the compiled code objects, then
    (unsharded) select and write the archives, or (a shard) write
    ``OUT/shard.json``; ``build-report.json`` either way. BuildError, after
    the report is written, if anything failed."""
    stream = stream if stream is not None else sys.stderr
    validation = validate_plan(plan, compiled)
    errors = compiled.errors + validation.errors
    selection: Dict[str, Dict[str, Any]] = {}
    if shard is None:  # a shard leaves the choice to merge
        selection, select_errors = select_shipped(plan, validation)
        errors += select_errors
    report: Dict[str, Any] = {
        "status": "failed" if errors else "ok",
        "profile": plan.profile.name,
        "archs": [a.name for a in plan.archs],
        "package_version": _version.__version__,
        "compiler": "triton",
        "compiler_version": plan.triton_version,
        "build_inputs_hash": plan.inputs_hash,
        "jobs": executor.workers,
        "executor": executor.kind,
        "shard": f"{shard[0]}/{shard[1]}" if shard else None,
        "kernels_dir": str(plan.sources.kernels_dir),
        "compile_env": dict(COMPILE_ENV),
        "ignored_env": scrubbed_env_names(),
        "per_arch": {},
        "errors": errors,
    }
    report_path = out / REPORT_NAME
    per_arch: Dict[str, ArchResult] = {}
    shard_path: Optional[Path] = None
    if shard is not None or errors:
        # No archives: a shard leaves its code objects in OUT/cache; a failed
        # build writes nothing but the report.
        report["per_arch"] = {a.name: _compile_summary(plan, compiled, a.name) for a in plan.archs}
    if shard is not None and not errors:
        # Written last: its presence means every listed key is in OUT/cache.
        shard_path = out / SHARD_FILE
        atomic_write_json(shard_path, {
            "kind": SHARD_KIND, "shard": shard[0], "shards": shard[1], "profile": plan.profile.name,
            "archs": [a.name for a in plan.archs], "compiler_version": plan.triton_version,
            "build_inputs_hash": plan.inputs_hash, "total_keys": total_keys, "keys": shard_key_list,
        })
    elif shard is None and not errors:
        per_arch, report["per_arch"] = write_archives(plan, compiled, validation, selection, out)
        _set_aside_stale(plan, out, report, stream)
        chart = out / "build-report.png"
        atomic_write_bytes(chart, arch_chart_png(report))
        report["chart"] = chart.name
    total_s = time.monotonic() - started
    report["seconds"] = round(total_s, 3)
    report["compiled"] = len(compiled.compiled_keys)
    report["cached"] = sum(len(items) for items in plan.items.values()) - len(compiled.compiled_keys)
    atomic_write_json(report_path, report)

    if errors:
        shown = "\n  ".join(errors[:MAX_ERRORS_SHOWN])
        more = f"\n  ... and {len(errors) - MAX_ERRORS_SHOWN} more" if len(errors) > MAX_ERRORS_SHOWN else ""
        raise BuildError(f"build failed: {len(errors)} problem(s); no archive written "
                         f"(report: {report_path}):\n  {shown}{more}", errors, report_path)

    return BuildResult(out_dir=out, profile=plan.profile.name, archs=[a.name for a in plan.archs],
                       per_arch=per_arch, report_path=report_path, report=report,
                       compiled=report["compiled"], cached=report["cached"], seconds=total_s,
                       shard=shard, shard_file=shard_path)


def _set_aside_stale(plan: BuildPlan, out: Path, report: Dict[str, Any], stream: TextIO) -> None:
    stale = set_aside_stale(out / "archives", [a.name for a in plan.archs], plan.inputs_hash)
    report["stale_archives"] = [str(p.relative_to(out)) for p in stale]
    for p in stale:
        print(f"note: {p.name} came from other build inputs (an older build?): moved to "
              f"{p.parent} so that it is not mistaken for part of this build; rebuild it with "
              f"--arch {p.name[: -len(ARCHIVE_SUFFIX)]} if you need it", file=stream)


# -- the command -----------------------------------------------------------

def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n}: the number of compile processes must be 1 or "
                                         f"more (leave -j out for one per core)")
    return n


@dataclass(frozen=True)
class BuildOptions:
    rocm: Optional[str] = None
    archs: Optional[Tuple[str, ...]] = None      # None: targets.toml's default_archs
    out: Path = Path("build")
    jobs: Optional[int] = None
    source_root: Optional[Path] = None
    kernels_dir: Optional[Path] = None
    targets: Optional[Path] = None
    progress: bool = True
    shard: Optional[Tuple[int, int]] = None
    executor: str = "local"
    scheduler: Optional[str] = None
    only: Tuple[str, ...] = ()

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "BuildOptions":
        try:
            shard = parse_shard(args.shard) if args.shard else None
        except ValueError as e:
            raise UsageError(str(e)) from None

        def path(v: Optional[str]) -> Optional[Path]:
            return Path(v) if v else None
        return cls(rocm=args.rocm, archs=tuple(args.arch) if args.arch else None, out=Path(args.out),
                   jobs=args.jobs, source_root=path(args.source_root),
                   kernels_dir=path(args.kernels_dir), targets=path(args.targets),
                   progress=args.progress, shard=shard, executor=args.executor,
                   scheduler=args.scheduler, only=tuple(args.only or ()))


def add_build_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``build`` subcommand's options to ``parser``."""
    parser.add_argument("--rocm", "--profile", dest="rocm", default=None, metavar="X.Y",
                        help="ROCm profile from ci/targets.toml (default: its default_profile)")
    parser.add_argument("--arch", dest="arch", action="append", default=None, metavar="ARCHS",
                        help="comma-separated archs (gfx942,gfx908,sm_90), families (cdna, rdna, "
                             "cuda), 'default' or 'all'; repeatable (default: default_archs)")
    parser.add_argument("--only", dest="only", action="append", default=None,
                        metavar="NAME=VALUE[|VALUE],...",
                        help="build only these functional points (whole points: every candidate "
                             "config of each), e.g. --only dtype=fp16,head_dim=128 or "
                             "--only dtype=fp16|bf16; names: dtype, head_dim, causal, ..., kernel; "
                             "repeatable (default: everything)")
    parser.add_argument("--out", "-o", dest="out", default="build", metavar="DIR",
                        help="output directory: archives/, cache/, build-report.json (default: build)")
    parser.add_argument("--jobs", "-j", dest="jobs", type=_positive_int, default=None, metavar="N",
                        help="parallel compile processes (default: all cores)")
    parser.add_argument("--source-root", dest="source_root", default=None, metavar="DIR",
                        help="aotriton-rocm checkout (default: found from the current directory)")
    parser.add_argument("--kernels-dir", dest="kernels_dir", default=None, metavar="DIR",
                        help="kernel sources + variants.toml (default: SOURCE_ROOT/kernels)")
    parser.add_argument("--targets", dest="targets", default=None, metavar="FILE",
                        help="targets file (default: SOURCE_ROOT/ci/targets.toml)")
    parser.add_argument("--no-progress", dest="progress", action="store_false",
                        help="no progress bar")
    parser.add_argument("--shard", dest="shard", default=None, metavar="K/N",
                        help="compile only shard K of N (1-based) into OUT/cache + OUT/shard.json; "
                             "assemble the archives with `aotriton-rocm merge`")
    parser.add_argument("--executor", dest="executor", choices=EXECUTORS, default="local",
                        help="where compiles run: local processes (default), a Dask cluster "
                             "(dask, with --scheduler) or a Dask LocalCluster on 127.0.0.1 (dask-local)")
    parser.add_argument("--scheduler", dest="scheduler", default=None, metavar="tcp://HOST:PORT",
                        help="Dask scheduler address for --executor dask")
    return parser


def run_build(options: BuildOptions) -> int:
    """Run ``build`` and print the table; CommandError on failure (1: a
    compile or validation failed, 2: a bad request or spec)."""
    try:
        res = build(options.rocm, list(options.archs) if options.archs else None, options.out,
                    source_root=options.source_root, jobs=options.jobs,
                    kernels_dir=options.kernels_dir, targets_path=options.targets,
                    progress=options.progress, shard=options.shard, executor=options.executor,
                    scheduler=options.scheduler, only=options.only)
    except CommandError:
        raise
    except VariantSpecError as e:
        raise UsageError(str(e)) from e
    except OSError as e:
        raise CommandError(f"cannot write the output ({e}); pass a writable directory "
                           f"with --out") from e
    except KeyboardInterrupt:
        raise CommandError("interrupted; no archive written", INTERRUPTED) from None
    print_result(res)
    return 0


def _shown(p: Path) -> str:
    rel = os.path.relpath(p)
    return str(p) if rel.startswith("..") else rel


def print_result(res: BuildResult, what: str = "") -> None:
    """The table and the summary line of a finished build (or merge)."""
    if res.shard is not None:
        k, n = res.shard
        print(f"ROCm {res.profile}: shard {k}/{n}: {res.compiled} compiled, {res.cached} cached in "
              f"{format_seconds(res.seconds)}; shard output: {_shown(res.shard_file)} "
              f"(assemble with: aotriton-rocm merge SHARD_OUTPUTS... --out DIR)")
        return
    print(format_arch_table(res.report))
    print(f"ROCm {res.profile}: {what or f'{res.compiled} compiled, {res.cached} cached'} in "
          f"{format_seconds(res.seconds)}; report: {_shown(res.report_path)}")
