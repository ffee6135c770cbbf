"""Compile one variant with ``triton.compile`` (runs in worker processes).

Build-time only. triton is imported lazily, inside the worker, after the
compile environment is set (``TRITON_CACHE_DIR``, ``TRITON_DEFAULT_FP_FUSION``).
AMD code objects produced here cannot be executed on this host: validation is
static (metadata + the amdgcn text).
"""
from __future__ import annotations

import atexit
import hashlib
import importlib
import importlib.util
import os
import re
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ...core import kernel_sources
from .amdgcn import hot_loop_stats

__all__ = [
    "COMPILE_ENV",
    "CompileTask",
    "CompileOutput",
    "worker_init",
    "scrubbed_env_names",
    "compile_task",
    "compile_variant",
    "load_kernel_function",
    "parse_amdgcn_stats",
    "shared_memory_finding",
    "validate_output",
]

# Environment every compile runs under (part of the cache key). No line info:
# it embeds the kernel file's absolute path in the code object, so the same
# sources in two checkouts (or on two build machines) gave different bytes.
COMPILE_ENV = {"TRITON_DEFAULT_FP_FUSION": "1", "TRITON_DISABLE_LINE_INFO": "1"}
ELF_MAGIC = b"\x7fELF"
# cuMemAllocAsync (the runtime's global scratch, per launch) returns at least this alignment
SCRATCH_ALIGN = 256


@dataclass(frozen=True)
class CompileTask:
    """Everything a worker needs; picklable."""

    cache_key: str
    variant_key: str
    arch: str
    kernels_dir: str
    module: str
    function: str
    signature: Tuple[Tuple[str, str], ...]  # function params in order; constexprs as "constexpr"
    constexprs: Tuple[Tuple[str, Any], ...]
    div_indices: Tuple[int, ...]  # param indices compiled with tt.divisibility=16
    target: Tuple[Any, ...]  # GPUTarget(backend, arch, warp_size)
    options: Tuple[Tuple[str, Any], ...]


@dataclass
class CompileOutput:
    cache_key: str
    variant_key: str
    arch: str
    meta: Dict[str, Any] = field(default_factory=dict)
    code: bytes = b""
    error: Optional[str] = None
    seconds: float = 0.0


# Environment variables that change what triton/LLVM generate (debug, dumps,
# kernel overrides, scheduler/buffer-op switches, ptxas options, ...). They are
# removed in the workers so a build depends on its inputs only; tool and
# library locations (*_PATH, *_LIBRARY) are kept.
_SCRUB_PREFIXES = ("TRITON_", "AMDGCN_", "NVPTX_", "MLIR_", "LLVM_", "PTXAS_")
_SCRUB_NAMES = ("DISABLE_PTXAS_OPT", "USE_IR_LOC")
_KEEP_SUFFIXES = ("_PATH", "_LIBRARY", "_LIB_PATH")


def scrubbed_env_names(environ=None) -> List[str]:
    """Names of the codegen-affecting variables set in ``environ`` (default os.environ)."""
    env = os.environ if environ is None else environ
    out = []
    for name in env:
        if name in COMPILE_ENV or name == "TRITON_CACHE_DIR":
            continue
        if name.startswith(_SCRUB_PREFIXES) or name in _SCRUB_NAMES:
            if not name.endswith(_KEEP_SUFFIXES):
                out.append(name)
    return sorted(out)


def worker_init(triton_cache_dir: str) -> None:
    for name in scrubbed_env_names():
        del os.environ[name]
    os.environ["TRITON_CACHE_DIR"] = triton_cache_dir
    os.environ.update(COMPILE_ENV)


def discard_stderr_at_exit() -> None:
    """Close this process's stderr once it shuts down. Compiling Gluon leaks
    objects inside triton's bindings (not ours to free), and nanobind lists
    them on stderr, a page per process, at shutdown."""
    def discard():
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
    atexit.register(discard)


def pool_worker_init(triton_cache_dir: str) -> None:
    """:func:`worker_init` for a compile pool's worker process, whose results
    and errors have gone back to the parent by the time it exits."""
    worker_init(triton_cache_dir)
    discard_stderr_at_exit()


def _kernels_package(kernels_dir: str) -> str:
    """A synthetic package whose __path__ is kernels_dir (relative imports work)."""
    kd = str(Path(kernels_dir).resolve())
    name = "_aotriton_rocm_kernels_" + hashlib.sha256(kd.encode()).hexdigest()[:12]
    return kernel_sources.kernels_package(name, kd)


def load_kernel_function(kernels_dir: str, module: str, function: str):
    pkg = _kernels_package(kernels_dir)
    mod = importlib.import_module(f"{pkg}.{module}")
    try:
        return getattr(mod, function)
    except AttributeError:
        raise RuntimeError(f"{Path(kernels_dir) / module.replace('.', '/')}.py has no {function!r}") from None


def _meta_rx(name: str) -> "re.Pattern[str]":
    # AMDGPU metadata (YAML) lines, e.g. "    .vgpr_count:     5" or "  - .agpr_count: 0"
    return re.compile(r"^\s*(?:-\s+)?\." + name + r":\s*(\d+)", re.M)


_STAT_PATTERNS = {
    "vgpr_count": _meta_rx("vgpr_count"),
    "agpr_count": _meta_rx("agpr_count"),
    "vgpr_spill_count": _meta_rx("vgpr_spill_count"),
    "sgpr_count": _meta_rx("sgpr_count"),
    "sgpr_spill_count": _meta_rx("sgpr_spill_count"),
    "private_segment_fixed_size": _meta_rx("private_segment_fixed_size"),
    "group_segment_fixed_size": _meta_rx("group_segment_fixed_size"),
    # assembler comments
    "scratch_size": re.compile(r"^\s*;\s*ScratchSize:\s*(\d+)", re.M),
    "occupancy": re.compile(r"^\s*;\s*Occupancy:\s*(\d+)", re.M),
    "code_object_version": re.compile(r"^\s*\.amdhsa_code_object_version\s+(\d+)", re.M),
}
_TARGET_RE = re.compile(r'^\s*\.amdgcn_target\s+"([^"]+)"', re.M)
_MFMA_RE = re.compile(r"^\s*v_mfma_", re.M)
_WMMA_RE = re.compile(r"^\s*v_wmma_", re.M)


def parse_amdgcn_stats(text: str) -> Dict[str, Any]:
    """Static facts from triton's amdgcn assembly text (single-kernel module)."""
    stats: Dict[str, Any] = {}
    for name, rx in _STAT_PATTERNS.items():
        m = rx.search(text)
        if m:
            stats[name] = int(m.group(1))
    m = _TARGET_RE.search(text)
    if m:
        stats["amdgcn_target"] = m.group(1)
    stats["mfma"] = bool(_MFMA_RE.search(text))
    stats["wmma"] = bool(_WMMA_RE.search(text))
    # The hot loop's instructions per iteration (amdgcn.py); None: no loop.
    stats["loop"] = hot_loop_stats(text)
    return stats


def compile_task(task: CompileTask):
    """``triton.compile`` of one task: the compiled kernel (its ``asm`` holds
    the code object and, for AMD, the amdgcn text)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = load_kernel_function(task.kernels_dir, task.module, task.function)
    names = [n for n, _ in task.signature]
    if list(getattr(fn, "arg_names", names)) != names:
        raise RuntimeError(f"{task.module}:{task.function} takes {list(fn.arg_names)}, "
                           f"the build expected {names}")
    gluon = getattr(fn, "is_gluon", lambda: False)()
    source = ASTSource
    if gluon:
        from triton.experimental.gluon._runtime import GluonASTSource as source
    src = source(fn=fn, signature=dict(task.signature), constexprs=dict(task.constexprs),
                 attrs={(i,): [["tt.divisibility", 16]] for i in task.div_indices})
    return triton.compile(src, target=GPUTarget(*task.target), options=dict(task.options))


def compile_variant(task: CompileTask) -> CompileOutput:
    import time

    t0 = time.perf_counter()
    out = CompileOutput(cache_key=task.cache_key, variant_key=task.variant_key, arch=task.arch)
    try:
        k = compile_task(task)
        backend = task.target[0]
        code = k.asm["hsaco" if backend == "hip" else "cubin"]
        md = k.metadata
        stats = parse_amdgcn_stats(k.asm.get("amdgcn", "")) if backend == "hip" else {}
        out.code = bytes(code)
        out.meta = {
            "symbol": md.name,
            "num_warps": int(md.num_warps),
            "num_stages": int(md.num_stages),
            "warp_size": int(md.warp_size),
            "shared": int(md.shared),
            "global_scratch_size": int(md.global_scratch_size),
            "global_scratch_align": int(md.global_scratch_align),
            "profile_scratch_size": int(md.profile_scratch_size),
            "triton_version": str(md.triton_version),
            "triton_hash": str(md.hash),
            "target": [md.target.backend, md.target.arch, md.target.warp_size],
            "stats": stats,
        }
    except BaseException as e:  # report, never crash the pool
        if isinstance(e, KeyboardInterrupt):
            raise
        tb = traceback.format_exc(limit=-6)
        out.error = f"{type(e).__name__}: {e}\n{tb}"
    out.seconds = time.perf_counter() - t0
    return out


def validate_output(meta: Dict[str, Any], code: bytes, *, backend: str, arch: str,
                    triton_version: str) -> List[str]:
    """Checks of one compiled variant's compile metadata that no config may
    waive (a broken or unlaunchable code object); returns problems (empty =
    OK). Resources (spills, scratch, LDS) are judged by the code-object
    validator (AMD, codeobject.validate_kernel) or
    :func:`shared_memory_finding` (NVIDIA)."""
    problems = []
    if not code or not code.startswith(ELF_MAGIC):
        problems.append("code object is not an ELF file")
    scratch = meta.get("global_scratch_size", 0)
    if scratch > 0 and backend == "hip":
        problems.append(f"needs {scratch} bytes of global scratch (the HIP launcher passes "
                        f"none); change the config")
    elif scratch > 0 and not 0 < meta.get("global_scratch_align", 0) <= SCRATCH_ALIGN:
        problems.append(f"needs global scratch aligned to {meta.get('global_scratch_align')} "
                        f"bytes (the launcher's allocations guarantee {SCRATCH_ALIGN}); "
                        f"change the config")
    if meta.get("triton_version") != triton_version:
        problems.append(f"compiled by triton {meta.get('triton_version')}, expected {triton_version}")
    stats = meta.get("stats") or {}
    if backend == "hip":
        tgt = stats.get("amdgcn_target", "")
        if tgt and not (tgt.endswith("-" + arch) or ("-" + arch + ":") in tgt):
            problems.append(f"code object targets {tgt!r}, not {arch}")
    return problems


def shared_memory_finding(meta: Dict[str, Any], arch: str, max_shared: Optional[int]) -> Optional[str]:
    """The shared-memory finding of a non-AMD code object (kind "lds"), or None."""
    if max_shared is not None and meta.get("shared", 0) > max_shared:
        return f"uses {meta['shared']} bytes of shared memory, {arch} has {max_shared}"
    return None
