"""AMD's Triton FlashAttention (from the amd-aiter wheel, reference.py)
compiled by our pinned triton, exactly as our build compiles our kernels
(triton_compile.compile_variant: the same compile environment, the same
amdgcn statistics), at AMD's own MI300X / MI350X configurations. Build-time
only; results are cached in the reference cache (``compiled/``), keyed like
the build's cache.

The arguments are specialised the way triton's JIT specialises AMD's own
launch (aiter/ops/triton/mha.py, mha_onekernel_bwd.py): the pointers its
wrapper passes as None are constexpr None, unit strides of the head
dimension constexpr 1, other integers i32 with 16-divisibility on pointers
and strides (contiguous tensors), not varlen, no dropout, no ALiBi, not
fp8, 16 query and key heads.
"""
from __future__ import annotations

import ast
import concurrent.futures as cf
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .cache import CompileCache, cache_key, kernel_sources_hash
from .reference import ReferenceError, ReferenceWheel
from .triton_compile import COMPILE_ENV, CompileTask, compile_variant, pool_worker_init

__all__ = ["RefShape", "RefCompiled", "AMD_KERNELS", "amd_task", "compile_reference"]

_NONE_ARGS = {"descale_q_ptr", "descale_k_ptr", "descale_v_ptr", "alibi_slopes_ptr", "s_dmask_ptr",
              "dropout_mask_ptr", "Dropout_mask", "Alibi_slopes", "Descale_q", "Descale_k", "Descale_v",
              "Descale_do", "cu_seqlens_q", "cu_seqlens_k"}
_FLOATS = {"sm_scale", "dropout_p"}


@dataclass(frozen=True)
class RefShape:
    arch: str
    direction: str  # "fwd" | "bwd"
    dtype: str  # "fp16" | "bf16"
    head_dim: int
    causal: bool

    @property
    def text(self) -> str:
        return f"{self.arch} {self.direction} {self.dtype} d{self.head_dim}{' causal' if self.causal else ''}"


@dataclass(frozen=True)
class _Kernel:
    """How to compile one of AMD's Triton kernels."""

    module: str
    functions: Tuple[str, str]  # (non-causal, causal)
    pointers: Mapping[str, str]  # name -> type, "{dtype}" for the data type
    config_path: Tuple[str, ...]  # where its config is in the MHA JSON
    constexpr_keys: Tuple[str, ...]  # config keys that are constexprs; the rest are options

    def unit_stride(self, name: str) -> bool:
        if self.module.endswith("mha"):
            return name in ("stride_qk_in", "stride_kk_in", "stride_vk_in", "stride_on_in")
        return name.startswith("stride") and name.endswith("d_in") and "descale" not in name

    def constexprs(self, shape: RefShape) -> Dict[str, Any]:
        d = shape.head_dim
        if self.module.endswith("mha"):
            return dict(IS_CAUSAL=shape.causal, NUM_Q_HEADS=16, NUM_K_HEADS=16, BLOCK_DMODEL=d,
                        BLOCK_DMODEL_POW2=d, BLOCK_DMODEL_PE=0, RETURN_SCORES=False, ENABLE_DROPOUT=False,
                        IS_FP8=False, FP8_MAX=448.0, VARLEN=False, NUM_XCD=8, USE_INT64_STRIDES=False)
        return dict(HEAD_DIM=d, ACTUAL_HEAD_DIM=d, PE_HEAD_DIM=0, ENABLE_DROPOUT=False, IS_VARLEN=False,
                    USE_ALIBI=False, USE_EXP2=True, IS_FP8=False, FP8_MAX=448.0, FP8_OUTPUT=False,
                    DEBUG_TRITON=False, DEBUG_TRITON_DETAIL=False, USE_INT64_STRIDES=False)


AMD_KERNELS: Dict[str, _Kernel] = {
    "fwd": _Kernel(module="_triton_kernels.mha", functions=("_attn_fwd", "_attn_fwd"),
                   pointers={"q_ptr": "*{dtype}", "k_ptr": "*{dtype}", "v_ptr": "*{dtype}",
                             "out_ptr": "*{dtype}", "softmax_lse_ptr": "*fp32"},
                   config_path=("fwd", "default"), constexpr_keys=("BLOCK_M", "BLOCK_N", "PRELOAD_V")),
    "bwd": _Kernel(module="_triton_kernels.mha_onekernel_bwd",
                   functions=("bwd_kernel_noncausal", "bwd_kernel_causal"),
                   pointers={n: "*{dtype}" for n in ("Q", "K", "V", "DO", "DQ", "DK", "DV")}
                   | {"M": "*fp32", "Delta": "*fp32"},
                   config_path=("bkwd_onekernel", "onekernel"),
                   constexpr_keys=("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2", "BLK_SLICE_FACTOR")),
}
_OPTIONS = ("num_warps", "num_stages", "waves_per_eu", "matrix_instr_nonkdim", "kpack")


def _arg_names(path: Path, function: str) -> List[str]:
    """The parameters of ``function`` in ``path``, read without importing it."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            return [a.arg for a in node.args.args]
    raise ReferenceError(f"{path}: no function {function!r} (a newer amd-aiter layout?)")


def amd_config(wheel: ReferenceWheel, shape: RefShape) -> Dict[str, Any]:
    """AMD's configuration of the kernel for the shape's arch (its JSON entry)."""
    node: Any = wheel.config(shape.arch)
    for key in AMD_KERNELS[shape.direction].config_path:
        node = node[key]
    return dict(node)


def amd_task(wheel: ReferenceWheel, shape: RefShape, triton_version: str) -> CompileTask:
    """The compile task of AMD's kernel for ``shape`` at AMD's configuration."""
    k = AMD_KERNELS[shape.direction]
    function = k.functions[int(shape.causal)]
    kdir = wheel.kernels_dir
    names = _arg_names(kdir / (k.module.replace(".", "/") + ".py"), function)
    cfg = amd_config(wheel, shape)
    constexprs = {**k.constexprs(shape), **{c: cfg[c] for c in k.constexpr_keys if c in cfg}}
    options = tuple(sorted((o, cfg[o]) for o in _OPTIONS if o in cfg))
    signature, values, div = [], {}, []
    for i, n in enumerate(names):
        if n in constexprs:
            signature.append((n, "constexpr"))
            values[n] = constexprs[n]
        elif n in _NONE_ARGS:
            signature.append((n, "constexpr"))
            values[n] = None
        elif k.unit_stride(n):
            signature.append((n, "constexpr"))
            values[n] = 1
        elif n in k.pointers:
            signature.append((n, k.pointers[n].format(dtype=shape.dtype)))
            div.append(i)
        elif n in _FLOATS:
            signature.append((n, "fp32"))
        else:
            signature.append((n, "i32"))
            if n.startswith("stride"):
                div.append(i)
    unknown = [c for c in constexprs if c not in names]
    if unknown:
        raise ReferenceError(f"{k.module}:{function} takes no {', '.join(unknown)} (a newer amd-aiter?)")
    target = ("hip", shape.arch, 64)
    key = cache_key(sources_hash=kernel_sources_hash(kdir), module=k.module, function=function,
                    signature=signature, constexprs=values, div_indices=div, target=target,
                    options=dict(options), triton_version=triton_version, env=COMPILE_ENV)
    return CompileTask(cache_key=key, variant_key=f"amd-triton {shape.text}", arch=shape.arch,
                       kernels_dir=str(kdir), module=k.module, function=function,
                       signature=tuple(signature), constexprs=tuple(values.items()),
                       div_indices=tuple(div), target=target, options=options)


@dataclass
class RefCompiled:
    """One compiled kernel: metadata (symbol, num_warps, shared, stats) and
    code, or the compile error."""

    task: CompileTask
    meta: Dict[str, Any] = field(default_factory=dict)
    code: bytes = b""
    error: Optional[str] = None
    cached: bool = False


def compile_reference(tasks: Sequence[CompileTask], cache_dir: Path, jobs: int = 1) -> List[RefCompiled]:
    """Compile ``tasks`` (cached in ``cache_dir/compiled``; errors are not
    cached) with ``jobs`` worker processes, in order."""
    cache = CompileCache(Path(cache_dir) / "compiled")
    out: List[RefCompiled] = []
    todo: List[Tuple[int, CompileTask]] = []
    for t in tasks:
        hit = cache.get(t.cache_key)
        out.append(RefCompiled(task=t, meta=hit[0], code=hit[1], cached=True) if hit else RefCompiled(task=t))
        if hit is None:
            todo.append((len(out) - 1, t))
    if not todo:
        return out
    tcache = str(Path(cache_dir) / "triton-cache")
    with cf.ProcessPoolExecutor(max_workers=max(1, jobs), initializer=pool_worker_init,
                                initargs=(tcache,)) as pool:
        futures = {pool.submit(compile_variant, t): i for i, t in todo}
        for fut in cf.as_completed(futures):
            i = futures[fut]
            res = fut.result()
            if res.error is not None:
                out[i].error = res.error.strip().splitlines()[0]
                continue
            cache.put(res.cache_key, res.meta, res.code)
            out[i].meta, out[i].code = res.meta, res.code
    return out
