"""``aotriton-rocm build``: compile every variant for a ROCm profile x arch set.

Build-time only. Pipeline: resolve targets (ci/targets.toml) -> enumerate
variants (kernels/variants.toml) -> content-addressed cache lookup -> compile
the misses in parallel worker processes (triton.compile, CPU only) -> static
validation of every code object -> one archive per arch + manifest sidecar.

Output layout::

    OUT/archives/<arch>.aotr
    OUT/archives/<arch>.manifest.json
    OUT/cache/                 compiled code objects by content hash
    OUT/build-report.json      per arch: kernels, compiled vs cached, seconds, bytes

Sharded (``--shard K/N``): the build compiles and validates only shard K of
the unique compile tasks and writes ``OUT/cache/`` plus ``OUT/shard.json``
(which keys it holds, the build inputs hash) instead of archives;
``aotriton-rocm merge`` (merge.py) assembles the archives from all N shard
outputs. Partition: the unique cache keys (sha256 of each compile's inputs,
no paths, no ROCm profile) sorted, task i -> shard i mod N. It depends only
on the build inputs, not on the machine, checkout path or enumeration order,
shard sizes differ by at most one, and since the keys are hashes each shard
gets a random mix of cheap and expensive kernels (contiguous ranges of the
sorted variant names would put e.g. every backward kernel in one shard).

Executors: ``local`` (a process pool, default), ``dask`` (a running Dask
scheduler, ``--scheduler tcp://HOST:PORT``) and ``dask-local`` (a LocalCluster
on 127.0.0.1); see dask_executor.py.

Archives are only written when every variant of the build compiled and
validated; each file is written atomically (temp file + rename), so a failed
build leaves no partial archive and previous archives untouched.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import hashlib
import importlib.metadata
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, TextIO, Tuple

from .. import _version
from ..archive import (ARCHIVE_SUFFIX, Archive, ArchiveError, KernelRecord, manifest_path_for,
                       write_archive, write_manifest_sidecar)
from .codeobject import ArchLimits, validate_kernel
from ..files import atomic_write_bytes, atomic_write_json, pid_alive
from .cache import CompileCache, cache_key, kernel_sources_hash
from .compile import (COMPILE_ENV, CompileOutput, CompileTask, compile_variant, scrubbed_env_names,
                      shared_memory_finding, validate_output, worker_init)
from .dask_executor import EXECUTORS, ExecutorError
from .progress import Progress, format_seconds
from .source_tree import find_source_root
from .tables import render_table
from .targets import ArchSpec, TargetError, load_targets
from .tuning import (COST_MODEL, SEQLEN_BUCKETS, Candidate, TuningError, choose, grid_axis, load_measured,
                     tuning_files_bytes)
from ..kernel_spec import SCRATCH_ARGS, Variant, VariantSpecError, load_variants

__all__ = [
    "BuildError",
    "ArchResult",
    "BuildResult",
    "build",
    "build_inputs_hash",
    "add_build_arguments",
    "run_build_command",
]

REPORT_NAME = "build-report.json"
SHARD_FILE = "shard.json"
SHARD_KIND = "aotriton-rocm-build-shard"
MAX_ERRORS_SHOWN = 10


class OutDirError(OSError):
    """``--out`` is a file or cannot be written (checked before compiling)."""


class BuildError(RuntimeError):
    """Compilation or validation failed; ``errors`` lists one line per problem."""

    def __init__(self, message: str, errors: Sequence[str] = (), report_path: Optional[Path] = None):
        super().__init__(message)
        self.errors = list(errors)
        self.report_path = report_path


@dataclass
class ArchResult:
    arch: str
    archive: Path
    manifest: Path
    kernels: int
    compiled: int
    cached: int
    seconds: float
    archive_bytes: int


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


def _default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def parse_shard(text: str) -> Tuple[int, int]:
    """``"K/N"`` -> (K, N), 1 <= K <= N; ValueError with a clear message otherwise."""
    try:
        k_s, n_s = str(text).split("/")
        k, n = int(k_s), int(n_s)
    except ValueError:
        raise ValueError(f"--shard takes K/N (e.g. 2/3), not {text!r}") from None
    if n < 1 or not 1 <= k <= n:
        raise ValueError(f"--shard {text}: need 1 <= K <= N")
    return k, n


def shard_keys(keys, k: int, n: int) -> List[str]:
    """Shard ``k`` of ``n`` (1-based) of the unique cache ``keys``: sorted,
    every n-th starting at k-1 (see the module docstring for why)."""
    return sorted(set(keys))[k - 1::n]


def _triton_version() -> str:
    try:
        return importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        raise BuildError(f"triton is not installed; the build needs the pinned compiler: "
                         f"pip install triton=={_version.TRITON_VERSION} "
                         f"(or pip install 'aotriton-rocm[build]')") from None


def build_inputs_hash(kernels_dir: Path, variants_bytes: bytes, targets_bytes: bytes,
                      compiler_version: str) -> str:
    """sha256 over the kernel sources, variants.toml, targets.toml, the
    measured tuning data (kernels/tuning/*.json) and the compiler version."""
    h = hashlib.sha256()
    for part in (kernel_sources_hash(kernels_dir).encode(), variants_bytes, targets_bytes,
                 f"triton=={compiler_version}".encode(), tuning_files_bytes(kernels_dir)):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()


def _task_for(v: Variant, params: List[str], arch: ArchSpec, kernels_dir: Path, sources_hash: str,
              triton_version: str) -> CompileTask:
    arg_types = dict(v.args)
    signature = tuple((p, "constexpr" if p in v.constexprs else arg_types[p]) for p in params)
    div_indices = tuple(params.index(n) for n in v.divisible_16)
    target = arch.gpu_target_args()
    options = tuple(sorted(v.options.items()))
    key = cache_key(sources_hash=sources_hash, module=v.module, function=v.function,
                    signature=signature, constexprs=v.constexprs, div_indices=div_indices,
                    target=target, options=dict(options), triton_version=triton_version,
                    env=COMPILE_ENV)
    return CompileTask(cache_key=key, variant_key=v.key, arch=arch.name, kernels_dir=str(kernels_dir),
                       module=v.module, function=v.function, signature=signature,
                       constexprs=tuple(v.constexprs.items()), div_indices=div_indices,
                       target=target, options=options)


def _record(v: Variant, meta: Dict[str, Any], extra_stats: Optional[Dict[str, Any]] = None) -> KernelRecord:
    stats = dict(meta.get("stats") or {})
    if extra_stats and "occupancy" in stats:  # LLVM's figure from the assembly text
        stats["llvm_occupancy"] = stats["occupancy"]
    stats.update(extra_stats or {})
    return KernelRecord(
        key=v.key, kernel=v.kernel, functional=dict(v.functional), config=dict(v.config),
        constexprs=dict(v.constexprs), symbol=str(meta["symbol"]), num_warps=int(meta["num_warps"]),
        num_stages=int(meta["num_stages"]), warp_size=int(meta["warp_size"]), shared=int(meta["shared"]),
        global_scratch_size=int(meta["global_scratch_size"]),
        profile_scratch_size=int(meta["profile_scratch_size"]),
        args=tuple(v.args) + SCRATCH_ARGS, divisible_16=tuple(v.divisible_16), grid=tuple(v.grid),
        stats=stats)


def _functional_text(functional: Dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in functional.items())


def _select(a: ArchSpec, items: Sequence[Tuple[Variant, CompileTask]],
            checked: Dict[Tuple[str, str], Tuple[Dict[str, Any], List[Tuple[str, str]]]],
            spec, measured, errors: List[str]) -> Dict[str, Any]:
    """Choose the shipped candidates of one arch (tuning.choose per functional
    point); appends to ``errors`` where nothing can ship. Returns the chosen
    keys, the manifest's "tuning" section, the shipped exceptions, the
    rejected candidates and how many choices were measured/static."""
    groups: Dict[Tuple[str, Tuple], List[Variant]] = {}
    for v, _ in items:
        groups.setdefault((v.kernel, tuple(v.functional.items())), []).append(v)
    chosen: set = set()
    choices: List[Dict[str, Any]] = []
    rejected: List[Dict[str, Any]] = []
    counts = {"measured": 0, "static": 0}
    axes: Dict[str, str] = {}
    cand_of: Dict[str, Candidate] = {}
    for (kname, _), vs in groups.items():
        axis, tile = grid_axis(spec.kernels[kname].grid)
        axes[kname] = axis or "seqlen_q"
        cands = []
        for i, v in enumerate(vs):
            if (a.name, v.key) not in checked:
                continue  # did not compile: already an error
            stats, resources = checked[(a.name, v.key)]
            rows = int(v.config.get(tile, 1)) if tile else 1
            cols = 1
            for k, val in v.config.items():
                if k.startswith("BLOCK_") and k != tile and isinstance(val, int):
                    cols *= val
            c = Candidate(key=v.key, config=dict(v.config), order=i, rows=rows, cols=cols,
                          num_warps=int(v.options.get("num_warps", 4)), occupancy=stats.get("occupancy"),
                          scratch=int(stats.get("private_segment_fixed_size") or 0),
                          findings=list(resources), waived=dict(v.allow))
            cands.append(c)
            cand_of[v.key] = c
        if not cands:
            continue
        func = vs[0].functional
        try:
            runs = choose(cands, kernel=kname, functional=func, measured=measured)
        except TuningError as e:
            errors.append(f"{a.name} {kname} [{_functional_text(func)}]: {e}")
            continue
        except ValueError:
            why = "; ".join(f"{c.key.rsplit('|', 1)[-1]}: {', '.join(m for _, m in c.unwaived)}" for c in cands)
            errors.append(
                f"{a.name} {kname} [{_functional_text(func)}]: no candidate config can ship ({why}); "
                f"add a config that fits to [[kernels.{kname}.configs]] for {a.name} in "
                f"kernels/variants.toml, or waive the finding on one with "
                f"allow = {{spills = true, reason = \"...\"}} (kinds: spills, scratch, lds)")
            continue
        for _, key, source in runs:
            chosen.add(key)
            counts[source] += 1
        choices.append({"kernel": kname, "functional": dict(func), "select": runs})
        for c in cands:
            if c.key not in chosen and c.findings:
                rejected.append({"key": c.key, "findings": [m for _, m in c.unwaived]})
    exceptions = [{"key": key, "kind": kind, "finding": msg, "reason": reason}
                  for key in sorted(chosen) for kind, msg, reason in cand_of[key].exceptions]
    manifest = {"schema": 1, "cost_model": COST_MODEL, "seqlen_buckets": list(SEQLEN_BUCKETS),
                "axes": axes, "measured": measured.how if measured.path else None, "choices": choices}
    return {"chosen": chosen, "manifest": manifest, "exceptions": exceptions, "rejected": rejected,
            "counts": counts}


def arch_limits_dict(a: ArchSpec) -> Dict[str, Any]:
    """The limits the code-object validator uses for ``a`` (stored in each
    AMD archive's manifest so ``aotriton-rocm validate`` needs no checkout)."""
    return dict(ArchLimits.from_spec(a).__dict__)


def _summarize(records: Sequence[KernelRecord]) -> Dict[str, Any]:
    """Per-arch validator numbers: worst registers, spills, scratch, LDS, occupancy, MFMA."""
    st = [r.stats or {} for r in records]

    def worst(key: str, fn=max) -> Optional[int]:
        vals = [int(s[key]) for s in st if s.get(key) is not None]
        return fn(vals) if vals else None
    return {
        "kernels": len(records),
        "max_vgpr": worst("vgpr_count"), "max_agpr": worst("agpr_count"), "max_sgpr": worst("sgpr_count"),
        "vgpr_spills": sum(int(s.get("vgpr_spill_count") or 0) for s in st),
        "sgpr_spills": sum(int(s.get("sgpr_spill_count") or 0) for s in st),
        "max_scratch": worst("private_segment_fixed_size"), "max_lds": worst("lds_bytes"),
        "min_occupancy": worst("occupancy", min),
        "mfma_kernels": sum(1 for s in st if s.get("mfma") or s.get("wmma")),  # matrix cores
        "allowed": sorted({a for s in st for a in (s.get("allowed") or [])}),
    }


# Upstream AOTriton's code objects for one arch (gfx942, at its head: fwd 6,598,
# dk/dv 3,670, dq 5,054, fused bwd 3,532), for the report's comparison.
UPSTREAM_PER_ARCH = 19000


def format_arch_table(report: Dict[str, Any]) -> str:
    """The per-arch build table: kernels shipped (of the candidates compiled),
    compiled/cached now, archive size, compile seconds (the sum of every
    candidate's compile time as recorded in the cache when it was compiled:
    wall time in a worker, so a loaded machine counts waiting for a core),
    worst register pressure, min occupancy, spills/scratch, matrix-core
    kernels, allowed exceptions, choices measured/static (AMD numbers from
    the code-object validator), then how the kernel count compares with
    upstream AOTriton."""
    def c(v: Any) -> str:
        return "-" if v is None else str(v)
    rows = [("arch", "shipped", "candidates", "compiled", "cached", "KiB", "compile s", "worst VGPR/AGPR/SGPR",
             "min occ", "spills", "scratch", "MFMA/WMMA", "exceptions", "measured/static", "archive")]
    shipped = []
    for a, r in (report.get("per_arch") or {}).items():
        val = r.get("validation") or {}
        regs = (f"{c(val.get('max_vgpr'))}/{c(val.get('max_agpr'))}/{c(val.get('max_sgpr'))}"
                if val else "-")
        ch = r.get("choices") or {}
        exc = r.get("exceptions")
        kib = r.get("archive_bytes")
        shipped.append(int(r.get("kernels") or 0))
        rows.append((a, str(r.get("kernels")), c(r.get("candidates")), str(r.get("compiled")),
                     str(r.get("cached")), "-" if kib is None else f"{kib / 1024:.0f}",
                     f"{r.get('compile_seconds_all', r.get('seconds', 0)):.0f}", regs,
                     c(val.get("min_occupancy")), c(val.get("vgpr_spills")), c(val.get("max_scratch")),
                     f"{val['mfma_kernels']}/{val['kernels']}" if val else "-",
                     "-" if exc is None else str(len(exc)),
                     f"{ch.get('measured', 0)}/{ch.get('static', 0)}" if ch else "-", str(r.get("archive", ""))))
    lines = [render_table(rows[0], rows[1:], left=(0, -1))]
    if shipped and max(shipped):
        lines.append(f"upstream AOTriton: ~{UPSTREAM_PER_ARCH:,} code objects per arch (gfx942); this build: "
                     f"{max(shipped):,} at most ({UPSTREAM_PER_ARCH / max(shipped):.0f}x fewer)")
    return "\n".join(lines)


def arch_chart_png(report: Dict[str, Any]) -> bytes:
    """The per-arch report as a PNG of bar plots (chart.py, matplotlib)."""
    from .chart import ORANGE, BLUE, Panel, bar_chart_png
    per = report.get("per_arch") or {}
    archs = list(per)

    def col(key, fn=lambda v: v):
        return [None if per[a].get(key) is None else fn(per[a][key]) for a in archs]
    vgpr = [(per[a].get("validation") or {}).get("max_vgpr") for a in archs]
    exc = [len(per[a].get("exceptions") or ()) if per[a].get("exceptions") is not None else None for a in archs]
    colors = [ORANGE if e else BLUE for e in exc]
    panels = [
        Panel("Kernels shipped", col("kernels"), colors, ylabel="code objects", counts=True,
              note=f"upstream AOTriton: ~{UPSTREAM_PER_ARCH:,} per arch"),
        Panel("Archive size", col("archive_bytes", lambda b: b / 1024), colors, ylabel="KiB"),
        Panel("Compile time", col("compile_seconds_all"), colors, ylabel="seconds",
              note="sum of every candidate's compile"),
        Panel("Worst VGPR use per lane", vgpr, colors, ylabel="VGPRs (AMD only)"),
        Panel("Allowed exceptions", exc, colors, ylabel="kernels", counts=True, note="waived spills / scratch / LDS"),
    ]
    notes = [f"ROCm {report.get('profile')}, triton {report.get('compiler_version')}, "
             f"aotriton-rocm {report.get('package_version')}"]
    return bar_chart_png("aotriton-rocm: per-arch build report", archs, panels, notes,
                         legend=[(BLUE, "clean"), (ORANGE, "ships waived exceptions")])


def _iter_compile_local(misses: Sequence[CompileTask], n_jobs: int, triton_cache: str):
    """Compile on a local process pool; yields (task, output) as they finish."""
    ctx = multiprocessing.get_context("spawn")
    # One compile per worker process: a code object depends on what the
    # process compiled before it (LLVM/Triton state carried across compiles
    # gave the same gfx942 dK/dV kernel 3 register allocations; in a fresh
    # process it is the same every time), so reused workers made cold builds
    # differ with the order tasks reached them.
    fresh = {"max_tasks_per_child": 1} if sys.version_info >= (3, 11) else {}
    # Workers never need torch, the bulk of a fresh worker's start-up time.
    no_torch = os.environ.get("AOTRITON_ROCM_NO_TORCH")
    os.environ["AOTRITON_ROCM_NO_TORCH"] = "1"
    pool = cf.ProcessPoolExecutor(max_workers=min(n_jobs, len(misses)), mp_context=ctx,
                                  initializer=worker_init, initargs=(triton_cache,), **fresh)
    try:
        futs = {pool.submit(compile_variant, t): t for t in misses}
        for fut in cf.as_completed(futs):
            t = futs[fut]
            try:
                res: CompileOutput = fut.result()
            except Exception as e:  # worker died (e.g. killed for memory)
                res = CompileOutput(t.cache_key, t.variant_key, t.arch, error=f"worker failed: {e!r}")
            yield t, res
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    finally:
        pool.shutdown(wait=True)
        if no_torch is None:
            os.environ.pop("AOTRITON_ROCM_NO_TORCH", None)
        else:
            os.environ["AOTRITON_ROCM_NO_TORCH"] = no_torch


TRITON_CACHE_PREFIX = "triton-cache-"
STALE_DIR = "stale"


def check_out_dir(out: Path) -> None:
    """Refuse (BuildError, before compiling anything) an ``--out`` that is a
    file or cannot be written."""
    if out.exists() and not out.is_dir():
        raise OutDirError(f"--out {out} is a file, not a directory: pass a directory (created if "
                          f"missing), or remove the file")
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


def set_aside_stale(arch_dir: Path, built: Sequence[str], inputs_hash: str) -> List[Path]:
    """Move archives in ``arch_dir`` that this build did not write and that
    come from other build inputs (or cannot be read) to ``arch_dir/stale/``,
    with their sidecars: a stale archive must not look current beside the
    new ones. Archives of the same inputs (an earlier build of other archs of
    this checkout) stay. Returns the new paths."""
    moved: List[Path] = []
    try:
        entries = sorted(arch_dir.glob("*" + ARCHIVE_SUFFIX))
    except OSError:
        return moved
    for ap in entries:
        arch = ap.name[: -len(ARCHIVE_SUFFIX)]
        if arch in built:
            continue
        try:
            their_hash = Archive.open(ap).manifest.get("build_inputs_hash")
        except ArchiveError:
            their_hash = None
        if their_hash == inputs_hash:
            continue
        stale = arch_dir / STALE_DIR
        stale.mkdir(exist_ok=True)
        for f in (ap, manifest_path_for(ap)):
            if os.path.lexists(f):
                os.replace(f, stale / f.name)
        moved.append(stale / ap.name)
    return moved


def build(profile: Optional[str], archs: Optional[Sequence[str]], out_dir, source_root=None,
          jobs: Optional[int] = None, *, kernels_dir=None, targets_path=None,
          progress: bool = True, stream: Optional[TextIO] = None,
          shard: Optional[Tuple[int, int]] = None, executor: str = "local",
          scheduler: Optional[str] = None, compile_missing: bool = True,
          expected_inputs_hash: Optional[str] = None,
          select: Optional[Callable[[Variant], bool]] = None) -> BuildResult:
    """Build one archive per arch for ROCm ``profile`` into ``out_dir``.

    ``archs``: arch names / families / "default" / "all" (comma lists allowed);
    None means targets.toml's default_archs. ``source_root``: the checkout
    (default: found by walking up from the cwd); ``kernels_dir`` and
    ``targets_path`` override ``<source_root>/kernels`` and
    ``<source_root>/ci/targets.toml``. ``jobs``: worker processes (default:
    all cores). Raises TargetError / VariantSpecError for bad requests or
    specs (before compiling anything) and BuildError if any variant fails to
    compile or validate (no archive is written then).

    ``shard=(K, N)``: compile + validate shard K only and write
    ``OUT/shard.json`` instead of archives. ``executor``: "local", "dask"
    (needs ``scheduler``, tcp://HOST:PORT) or "dask-local" (LocalCluster on
    127.0.0.1 with ``jobs`` workers). ``compile_missing=False`` (merge):
    every code object must already be in the cache; ``expected_inputs_hash``:
    refuse if the inputs hash differs (shards built from other inputs).
    ``select``: build only the variants it accepts (tests, probes; whole
    functional points should be kept or dropped, or the choice among
    candidates changes).
    """
    t_start = time.monotonic()
    if executor not in EXECUTORS:
        raise ExecutorError(f"unknown executor {executor!r}; valid: {', '.join(EXECUTORS)}")
    if executor == "dask" and not scheduler:
        raise ExecutorError("--executor dask needs --scheduler tcp://HOST:PORT "
                            "(or use --executor dask-local for a cluster on this machine)")
    if executor != "dask" and scheduler:
        raise ExecutorError(f"--scheduler is only used with --executor dask (got --executor {executor})")
    if executor.startswith("dask"):
        from .dask_executor import require_distributed
        require_distributed()  # fail before compiling anything
    if shard is not None:
        k, n = shard
        if n < 1 or not 1 <= k <= n:
            raise ValueError(f"shard {k}/{n}: need 1 <= K <= N")
    stream = stream if stream is not None else sys.stderr
    if kernels_dir is None or targets_path is None:
        root = Path(source_root) if source_root is not None else find_source_root()
        kernels_dir = Path(kernels_dir) if kernels_dir is not None else root / "kernels"
        targets_path = Path(targets_path) if targets_path is not None else root / "ci" / "targets.toml"
    kernels_dir = Path(kernels_dir).resolve()
    out = Path(out_dir).resolve()

    targets = load_targets(targets_path)
    prof, arch_specs = targets.resolve(profile, archs)
    spec = load_variants(kernels_dir)
    params_of = spec.check_sources()
    check_out_dir(out)
    clean_leftovers(out)

    triton_version = _triton_version()
    if triton_version != _version.TRITON_VERSION:
        raise BuildError(f"installed triton is {triton_version}, aotriton-rocm {_version.__version__} "
                         f"ships code compiled by triton {_version.TRITON_VERSION} exactly: "
                         f"pip install triton=={_version.TRITON_VERSION}")
    sources_hash = kernel_sources_hash(kernels_dir)
    inputs_hash = build_inputs_hash(kernels_dir, spec.raw_bytes, targets.raw_bytes, triton_version)
    if expected_inputs_hash is not None and expected_inputs_hash != inputs_hash:
        raise BuildError(f"the shards were built from other inputs (build inputs hash "
                         f"{expected_inputs_hash[:16]}...) than {kernels_dir} + {targets_path} "
                         f"({inputs_hash[:16]}...): merge with the same checkout the shards used")

    # Enumerate (fails at once if an arch has nothing to compile).
    plan: Dict[str, List[Tuple[Variant, CompileTask]]] = {}
    warnings: Dict[str, List[str]] = {}
    for a in arch_specs:
        vs = [v for v in spec.variants_for(a) if select is None or select(v)]
        if not vs:
            raise VariantSpecError(
                f"{spec.path}: no config matches {a.name} (family {a.family}); add "
                f"[[kernels.*.configs]] with archs = [\"{a.family}\"] or [\"{a.name}\"], or drop {a.name}")
        warnings[a.name] = [f"kernel {k} has no config for {a.name}" for k in spec.kernels_without_variants(a)]
        plan[a.name] = [(v, _task_for(v, params_of[v.kernel], a, kernels_dir, sources_hash, triton_version))
                        for v in vs]
    shard_key_list: List[str] = []
    if shard is not None:
        (out / SHARD_FILE).unlink(missing_ok=True)  # a failed rerun leaves no stale shard file
    all_keys = {t.cache_key for items in plan.values() for _, t in items}
    if shard is not None:
        shard_key_list = shard_keys(all_keys, *shard)
        mine = set(shard_key_list)
        plan = {a: [(v, t) for v, t in items if t.cache_key in mine] for a, items in plan.items()}

    cache = CompileCache(out / "cache")
    results: Dict[str, Tuple[Dict[str, Any], bytes]] = {}  # cache key -> (meta, code)
    compiled_keys = set()
    compile_seconds: Dict[str, float] = {a.name: 0.0 for a in arch_specs}
    misses: List[CompileTask] = []
    seen = set()
    for arch, items in plan.items():
        for v, task in items:
            if task.cache_key in seen:
                continue
            seen.add(task.cache_key)
            hit = cache.get(task.cache_key)
            if hit is not None:
                results[task.cache_key] = hit
            else:
                misses.append(task)

    prog = Progress(len(misses), desc="compile", stream=stream, enabled=progress)
    for arch, items in plan.items():
        n_miss = sum(1 for _, t in items if t.cache_key not in results)
        prog.write(f"{arch}: {len(items)} variants, {len(items) - n_miss} cached, {n_miss} to compile")

    ignored = scrubbed_env_names()
    if ignored and misses:
        prog.write(f"note: ignoring {', '.join(ignored)} while compiling (they change code generation)")
    errors: List[str] = []
    if jobs is not None and int(jobs) < 1:
        raise ValueError(f"jobs={jobs}: need 1 or more compile processes (None: one per core)")
    n_jobs = int(jobs) if jobs else _default_jobs()
    if misses and not compile_missing:
        prog.close()
        raise BuildError(f"{len(misses)} code object(s) are in none of the shard outputs, e.g. "
                         f"{misses[0].arch} {misses[0].variant_key}; no archive written")
    if misses:
        tmp_root = out / ".tmp"
        tmp_root.mkdir(parents=True, exist_ok=True)
        # the pid in the name lets the next run remove it if this one is killed
        triton_cache = tempfile.mkdtemp(prefix=f"{TRITON_CACHE_PREFIX}{os.getpid()}-", dir=tmp_root)
        if executor == "local":
            outputs = _iter_compile_local(misses, n_jobs, triton_cache)
        else:
            from .dask_executor import iter_compile_dask
            outputs = iter_compile_dask(misses, kernels_dir=kernels_dir, sources_hash=sources_hash,
                                        scheduler=scheduler if executor == "dask" else None,
                                        local_workers=min(n_jobs, len(misses)), log=prog.write)
        try:
            for t, res in outputs:
                compile_seconds[t.arch] += res.seconds
                if res.error:
                    first = res.error.strip().splitlines()[0]
                    errors.append(f"{t.arch} {t.variant_key}: compile failed: {first}")
                    prog.write(f"error: {t.arch} {t.variant_key}: compile failed:\n{res.error.rstrip()}")
                else:
                    # Same key order as a cache hit, so archives are byte-identical
                    # whether their kernels were compiled or cached.
                    meta = json.loads(json.dumps(dict(res.meta, compile_seconds=round(res.seconds, 3)),
                                                 sort_keys=True))
                    cache.put(t.cache_key, meta, res.code)
                    results[t.cache_key] = (meta, res.code)
                    compiled_keys.add(t.cache_key)
                prog.update(1, label=f"{t.arch} {t.variant_key}")
        finally:
            close = getattr(outputs, "close", None)
            if close is not None:
                close()
            prog.close()
            shutil.rmtree(triton_cache, ignore_errors=True)
            try:
                tmp_root.rmdir()
            except OSError:
                pass

    # Static validation of every code object (cached ones too): the compile
    # metadata, then, for AMD, the ELF + AMDGPU metadata (codeobject.py), whose
    # numbers go into each record's stats. A broken code object fails the
    # build; a resource finding (spills, scratch, LDS) only makes that
    # candidate ineligible unless its config waives it (allow = {...}).
    checked: Dict[Tuple[str, str], Tuple[Dict[str, Any], List[Tuple[str, str]]]] = {}
    for arch_spec in arch_specs:
        limits = ArchLimits.from_spec(arch_spec) if arch_spec.backend == "hip" else None
        for v, t in plan[arch_spec.name]:
            if t.cache_key not in results:
                continue
            meta, code = results[t.cache_key]
            problems = validate_output(meta, code, backend=arch_spec.backend, arch=arch_spec.name,
                                       triton_version=_version.TRITON_VERSION)
            stats: Dict[str, Any] = {}
            resources: List[Tuple[str, str]] = []
            if limits is not None and not any("not an ELF" in p for p in problems):
                val = validate_kernel(code, _record(v, meta), limits,
                                      code_object_version=prof.code_object_version, allow=v.allow)
                found = {m for _, m in val.resources}
                problems.extend(p for p in val.problems if p not in found)
                resources = val.resources
                stats = dict(val.stats, allowed=val.allowed) if val.allowed else val.stats
            elif limits is None:
                finding = shared_memory_finding(meta, arch_spec.name, arch_spec.max_shared_bytes)
                if finding:
                    resources = [("lds", finding)]
            checked[(arch_spec.name, v.key)] = (stats, resources)
            for p in problems:
                errors.append(f"{arch_spec.name} {v.key}: {p}")

    # Choose per (arch, functional point, seqlen bucket) among the candidate
    # configs (tuning.py); only the chosen ones ship. A shard leaves this to merge.
    selection: Dict[str, Dict[str, Any]] = {}
    if shard is None:
        for a in arch_specs:
            sel = _select(a, plan[a.name], checked, spec, load_measured(kernels_dir, a.name), errors)
            selection[a.name] = sel

    report: Dict[str, Any] = {
        "status": "failed" if errors else "ok",
        "profile": prof.name,
        "archs": [a.name for a in arch_specs],
        "package_version": _version.__version__,
        "compiler": "triton",
        "compiler_version": triton_version,
        "build_inputs_hash": inputs_hash,
        "jobs": n_jobs,
        "executor": executor,
        "shard": f"{shard[0]}/{shard[1]}" if shard else None,
        "kernels_dir": str(kernels_dir),
        "compile_env": dict(COMPILE_ENV),
        "ignored_env": scrubbed_env_names(),
        "per_arch": {},
        "errors": errors,
    }
    report_path = out / REPORT_NAME
    arch_dir = out / "archives"

    def compile_summary(a) -> Dict[str, Any]:
        items = plan[a.name]
        return {
            "kernels": len(items),
            "candidates": len(items),
            "compiled": sum(1 for _, t in items if t.cache_key in compiled_keys),
            "failed": sum(1 for _, t in items if t.cache_key not in results),
            "compile_cpu_seconds": round(compile_seconds[a.name], 3),
            "warnings": warnings[a.name],
        }

    per_arch: Dict[str, ArchResult] = {}
    shard_path: Optional[Path] = None
    if shard is not None or errors:
        # No archives: a shard leaves its code objects in OUT/cache; a failed
        # build writes nothing but the report.
        for a in arch_specs:
            report["per_arch"][a.name] = compile_summary(a)
    if shard is not None and not errors:
        # Written last: its presence means every listed key is in OUT/cache.
        shard_path = out / SHARD_FILE
        atomic_write_json(shard_path, {
            "kind": SHARD_KIND, "shard": shard[0], "shards": shard[1], "profile": prof.name,
            "archs": [a.name for a in arch_specs], "compiler_version": triton_version,
            "build_inputs_hash": inputs_hash, "total_keys": len(all_keys), "keys": shard_key_list,
        })
    elif shard is None and not errors:
        for a in arch_specs:
            t0 = time.monotonic()
            items = plan[a.name]
            sel = selection[a.name]
            pairs = [(_record(v, results[t.cache_key][0], checked[(a.name, v.key)][0] or None),
                      results[t.cache_key][1]) for v, t in items if v.key in sel["chosen"]]
            manifest = {
                "format_version": None,  # filled by write_archive
                "package_version": _version.__version__,
                "abi_version": _version.ABI_VERSION,
                "rocm_profile": prof.name,
                "arch": a.name,
                "backend": a.backend,
                "family": a.family,
                "warp_size": a.warp_size,
                "compiler": "triton",
                "compiler_version": triton_version,
                "build_inputs_hash": inputs_hash,
                "blob_sha256": None,  # filled by write_archive
            }
            if a.backend == "hip":
                manifest["code_object_version"] = prof.code_object_version
                manifest["hip_soname"] = prof.hip_soname
                manifest["arch_limits"] = arch_limits_dict(a)
            manifest["tuning"] = sel["manifest"]
            manifest["exceptions"] = sel["exceptions"]
            ap = arch_dir / f"{a.name}.aotr"
            write_archive(ap, manifest, pairs)
            mp = write_manifest_sidecar(ap)
            write_s = time.monotonic() - t0
            n_comp = sum(1 for _, t in items if t.cache_key in compiled_keys)
            ar = ArchResult(arch=a.name, archive=ap, manifest=mp, kernels=len(pairs), compiled=n_comp,
                            cached=len(items) - n_comp, seconds=round(compile_seconds[a.name] + write_s, 3),
                            archive_bytes=ap.stat().st_size)
            per_arch[a.name] = ar
            report["per_arch"][a.name] = {
                "kernels": ar.kernels, "candidates": len(items), "compiled": ar.compiled, "cached": ar.cached,
                "seconds": ar.seconds, "compile_cpu_seconds": round(compile_seconds[a.name], 3),
                "compile_seconds_all": round(sum(float(results[t.cache_key][0].get("compile_seconds", 0))
                                                      for _, t in items), 3),
                "choices": sel["counts"], "rejected": sel["rejected"], "exceptions": sel["exceptions"],
                "write_seconds": round(write_s, 3), "archive": str(ap.relative_to(out)),
                "manifest": str(mp.relative_to(out)), "archive_bytes": ar.archive_bytes,
                "code_bytes": sum(len(c) for _, c in pairs), "warnings": warnings[a.name],
                "validation": _summarize([r for r, _ in pairs]) if a.backend == "hip" else None,
            }

    if shard is None and not errors:
        stale = set_aside_stale(arch_dir, [a.name for a in arch_specs], inputs_hash)
        report["stale_archives"] = [str(p.relative_to(out)) for p in stale]
        for p in stale:
            print(f"note: {p.name} came from other build inputs (an older build?): moved to "
                  f"{p.parent} so that it is not mistaken for part of this build; rebuild it with "
                  f"--arch {p.name[: -len(ARCHIVE_SUFFIX)]} if you need it", file=stream)
        chart = out / "build-report.png"
        atomic_write_bytes(chart, arch_chart_png(report))
        report["chart"] = chart.name
    total_s = time.monotonic() - t_start
    report["seconds"] = round(total_s, 3)
    report["compiled"] = len(compiled_keys)
    report["cached"] = sum(len(items) for items in plan.values()) - len(compiled_keys)
    atomic_write_json(report_path, report)

    if errors:
        shown = "\n  ".join(errors[:MAX_ERRORS_SHOWN])
        more = f"\n  ... and {len(errors) - MAX_ERRORS_SHOWN} more" if len(errors) > MAX_ERRORS_SHOWN else ""
        raise BuildError(f"build failed: {len(errors)} problem(s); no archive written "
                         f"(report: {report_path}):\n  {shown}{more}", errors, report_path)

    return BuildResult(out_dir=out, profile=prof.name, archs=[a.name for a in arch_specs],
                       per_arch=per_arch, report_path=report_path, report=report,
                       compiled=report["compiled"], cached=report["cached"], seconds=total_s,
                       shard=shard, shard_file=shard_path)


# -- CLI wiring -----------------------------------------------------------

def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n}: the number of compile processes must be 1 or "
                                         f"more (leave -j out for one per core)")
    return n


def add_build_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``build`` subcommand's options to ``parser``."""
    parser.add_argument("--rocm", "--profile", dest="rocm", default=None, metavar="X.Y",
                        help="ROCm profile from ci/targets.toml (default: its default_profile)")
    parser.add_argument("--arch", dest="arch", action="append", default=None, metavar="ARCHS",
                        help="comma-separated archs (gfx942,gfx908,sm_90), families (cdna, rdna, "
                             "cuda), 'default' or 'all'; repeatable (default: default_archs)")
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


def run_build_command(args: argparse.Namespace) -> int:
    """Run ``build`` from parsed arguments; returns the process exit code
    (0 ok, 1 compile/validation failure, 2 bad request or spec)."""
    shard = None
    if getattr(args, "shard", None):
        try:
            shard = parse_shard(args.shard)
        except ValueError as e:
            print(f"aotriton-rocm build: error: {e}", file=sys.stderr)
            return 2
    try:
        res = build(getattr(args, "rocm", None), getattr(args, "arch", None),
                    getattr(args, "out", "build"), source_root=getattr(args, "source_root", None),
                    jobs=getattr(args, "jobs", None), kernels_dir=getattr(args, "kernels_dir", None),
                    targets_path=getattr(args, "targets", None),
                    progress=getattr(args, "progress", True), shard=shard,
                    executor=getattr(args, "executor", "local") or "local",
                    scheduler=getattr(args, "scheduler", None))
    except (TargetError, VariantSpecError, ExecutorError, OutDirError) as e:
        print(f"aotriton-rocm build: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"aotriton-rocm build: cannot write the output ({e}); pass a writable directory "
              f"with --out", file=sys.stderr)
        return 1
    except BuildError as e:
        print(f"aotriton-rocm build: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("aotriton-rocm build: interrupted; no archive written", file=sys.stderr)
        return 130
    def show(p: Path) -> str:
        rel = os.path.relpath(p)
        return str(p) if rel.startswith("..") else rel

    if res.shard is not None:
        k, n = res.shard
        print(f"ROCm {res.profile}: shard {k}/{n}: {res.compiled} compiled, {res.cached} cached in "
              f"{format_seconds(res.seconds)}; shard output: {show(res.shard_file)} "
              f"(assemble with: aotriton-rocm merge SHARD_OUTPUTS... --out DIR)")
        return 0
    print(format_arch_table(res.report))
    print(f"ROCm {res.profile}: {res.compiled} compiled, {res.cached} cached in "
          f"{format_seconds(res.seconds)}; report: {show(res.report_path)}")
    return 0
