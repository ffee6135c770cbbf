"""Where kernels run: the AOT archive on a GPU, Triton's interpreter on the CPU.

libaotriton_rocm plans every call on both (coverage, variant, arguments,
grid, head-dim padding, splits): on a GPU it launches the archive's code
objects; on the CPU its host backend hands each launch to the interpreter
(:mod:`.host_kernels`). Both count every launch, so a caller can prove that
our kernels ran rather than torch's.
"""

from __future__ import annotations

import collections
import contextlib
import functools
from typing import Iterable

import torch

from .device import arch_of
from .native import (DTYPES as NATIVE_DTYPES, NEED_BACKWARD, NEED_DEBUG_MASK, NEED_DQ_ACCUM,
                     OK as NATIVE_OK, UNSUPPORTED as NATIVE_UNSUPPORTED, BwdParams, DropoutUniformParams,
                     FwdParams, KvcacheParams, NativeError, Problem as NativeProblem,
                     Runtime as NativeRuntime, check as check_status, error as native_error,
                     make_problem, tensor_view, window_sides)
from .torch_native import launch_count as torch_native_launch_count
from .._version import ABI_VERSION

KERNELS = ("attn_fwd", "attn_bwd_preprocess", "attn_bwd_dkdv", "attn_bwd_dq")
# The fused backward (sm_90): dK, dV and the fp32 sum of dQ in one pass, then
# dQ from the sum; it replaces attn_bwd_dkdv + attn_bwd_dq where it runs.
FUSED_BACKWARD_KERNELS = ("attn_bwd_fused", "attn_bwd_dq_convert")
# The KV-cache forward (flash_attn_with_kvcache) and its split-KV combine.
KVCACHE_KERNELS = ("attn_fwd_kvcache", "attn_fwd_kvcache_combine")


def kvcache_workspace_shapes(batch: int, heads: int, num_splits: int, max_seqlen_q: int,
                             head_dim: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shapes of the KV-cache kernels' fp32 split workspace (contiguous):
    partial outputs and partial logsumexps."""
    return ((batch * heads, num_splits, max_seqlen_q, head_dim),
            (batch * heads, num_splits, max_seqlen_q))


# The attention kernels' dropout draws (torch's mask regeneration); not part
# of an attention call's coverage.
DROPOUT_UNIFORM = "dropout_uniform"
_COUNTED = KERNELS + FUSED_BACKWARD_KERNELS + (DROPOUT_UNIFORM,) + KVCACHE_KERNELS
INTERPRETER = "interpreter:cpu"
# A tensor's address in a request that only asks whether a call is covered:
# aligned for every rule, never dereferenced.
_STAND_IN_ADDRESS = 16
# The interpreter executes every block op in numpy: keep CPU work bounded.
INTERPRETER_MAX_WORK = 1 << 28  # batch*heads*seqlen_q*seqlen_k*head_dim


def _native_totals() -> collections.Counter:
    """GPU launches per kernel counted by libaotriton_rocm: the Python route's
    runtime and the torch extension's (the C++ route)."""
    totals: collections.Counter = collections.Counter()
    for kernel in _COUNTED:
        if _native_names:
            totals[kernel] += _native_runtime().launch_count(kernel)
        totals[kernel] += torch_native_launch_count(kernel)
    return totals


def _native_name() -> str:
    archs = set(_native_names.values())
    if not archs and torch.cuda.is_available():
        archs = {f"aot:{arch_of(torch.cuda.current_device())}"}
    return "+".join(sorted(archs)) or "aot"


def _host_totals() -> collections.Counter:
    """The interpreter's launches per kernel, counted by its libaotriton_rocm
    runtime (and those of runtimes dropped by clear_backend_caches)."""
    totals = collections.Counter(_host_retired)
    if _interpreter_backend.cache_info().currsize:
        runtime = getattr(_interpreter_backend(), "runtime", None)
        for kernel in _COUNTED if runtime is not None else ():
            totals[kernel] += runtime.launch_count(kernel)
    return totals


def launch_counts() -> dict[tuple[str, str], int]:
    """Launches per (backend, kernel) since import or the last reset, as
    libaotriton_rocm counts them: the GPU's, and the interpreter's."""
    counts = {}
    for name, totals, baseline in ((_native_name, _native_totals(), _native_baseline),
                                   (lambda: INTERPRETER, _host_totals(), _host_baseline)):
        for kernel, n in totals.items():
            if n > baseline[kernel]:
                counts[(name(), kernel)] = n - baseline[kernel]
    return counts


def reset_launch_counts() -> None:
    for baseline, totals in ((_native_baseline, _native_totals()),
                             (_host_baseline, _host_totals())):
        baseline.clear()
        baseline.update(totals)


class Backend:
    name = "?"

    def unsupported_reason(self, *, dtype: str, head_dim: int, bias: bool = False,
                           dropout: bool = False, work: int = 0) -> str | None:
        """Why this backend cannot run an attention forward and backward at
        this functional point (its images, its limits), or None."""
        raise NotImplementedError


@functools.lru_cache(maxsize=1)
def _native_runtime():
    """The process's libaotriton_rocm runtime (one for every device)."""
    return NativeRuntime()


def _raw_stream(index: int) -> int:
    """The current stream's handle (torch's private fast path when it has one)."""
    fast = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if fast is not None:
        return fast(index)
    return torch.cuda.current_stream(index).cuda_stream


_added_archives: set = set()
_native_baseline: collections.Counter = collections.Counter()
_host_baseline: collections.Counter = collections.Counter()
_host_retired: collections.Counter = collections.Counter()
_native_names: dict[int, str] = {}


class NativeBackend(Backend):
    """A backend whose calls libaotriton_rocm plans: coverage, kernel and
    config selection, grids, argument packing, head-dim padding and KV
    splits all happen in the C library, on ``self.runtime``'s device
    ``self.device_index``."""

    problem: str | None = None
    device_index = 0
    runtime: NativeRuntime

    def _stream(self) -> int:
        raise NotImplementedError

    def _check(self, status: int) -> None:
        check_status(status)

    def unsupported_reason(self, *, dtype, head_dim, bias=False, dropout=False, work=0):
        if self.problem:
            return self.problem
        key = (dtype, head_dim, bias, dropout)
        try:
            return self._reasons[key]
        except KeyError:
            reason = self._reasons[key] = self._probe(*key)
            return reason

    def _ready(self) -> None:
        """NativeError (AOTR_UNSUPPORTED) where this backend cannot run at all."""
        if self.problem:
            raise NativeError(NATIVE_UNSUPPORTED, "AOTR_UNSUPPORTED", self.problem)

    def _probe(self, dtype: str, head_dim: int, bias: bool, dropout: bool) -> str | None:
        """Whether the archive has every kernel of a forward and backward at
        this functional point (a shape-only problem: nothing is read)."""
        code = NATIVE_DTYPES[{"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}[dtype]]
        p = NativeProblem()
        for view in (p.q, p.k, p.v):
            view.data, view.dtype, view.rank = _STAND_IN_ADDRESS, code, 4
            view.sizes[:] = (1, 1, 1, head_dim)
            view.strides[:] = (head_dim, head_dim, head_dim, 1)
        if bias:
            p.bias.data, p.bias.dtype, p.bias.rank = _STAND_IN_ADDRESS, code, 4
            p.bias.sizes[:] = (1, 1, 1, 1)
            p.bias.strides[:] = (0, 0, 0, 1)
        p.scale, p.dropout_p = 1.0, 0.5 if dropout else 0.0
        p.window_left = p.window_right = -1
        needs = NEED_BACKWARD | (NEED_DEBUG_MASK if dropout else 0)
        status = self.runtime.supported(self.device_index, p, needs)
        return None if status == NATIVE_OK else native_error(status).message

    def forward(self, q, k, v, out, lse, *, bias, debug_mask, rng, varlen, causal, bottom_right,
                window, scale, dropout_p, softcap=0.0, alibi_slopes=None) -> None:
        """Launch the forward on tensors the kernels can read in place: q/k/v/out
        (B, H, S, D), or packed (total, H, D) with ``varlen``."""
        params = FwdParams()
        params.device = self.device_index
        params.stream = self._stream()
        params.problem = _native_problem(q, k, v, bias, rng, varlen, causal, bottom_right, window,
                                         scale, dropout_p)
        params.out, params.lse = tensor_view(out), tensor_view(lse)
        if debug_mask is not None:
            params.debug_mask = tensor_view(debug_mask)
        params.alibi_slopes = tensor_view(alibi_slopes)
        params.softcap = softcap
        _placement(params, varlen)
        self._check(self.runtime.fwd(params))

    def varlen_rows(self, q, k, v, varlen) -> tuple[int, int] | None:
        """The packed rows of q and k that ``varlen``'s offsets cover, after
        libaotriton_rocm checked them on the host (NativeError names a broken
        rule); None during a graph capture, where nothing is read."""
        p = _native_problem(q, k, v, None, None, varlen, False, True, (-1, -1), 1.0, 0.0)
        return self.runtime.varlen_rows(self.device_index, self._stream(), p)

    def kvcache_splits(self, q, k_cache, v_cache, out, lse, *, k_end, k_start, cache_batch_idx,
                       block_table, alibi_slopes, cu_seqlens_q, max_seqlen_q, scale, window,
                       causal, softcap, num_splits, shapes_only=False) -> int:
        """The split count libaotriton_rocm runs this KV-cache call with (see
        kvcache.forward); NativeError where it refuses the call. Launches
        nothing; ``shapes_only``: nothing is read either (every tensor's
        address is a stand-in, so empty tensors are checked too)."""
        self._ready()
        p = self._kvcache_params(q, k_cache, v_cache, out, lse, k_end, k_start, cache_batch_idx,
                                 block_table, alibi_slopes, cu_seqlens_q, max_seqlen_q, scale,
                                 window, causal, softcap, num_splits, shapes_only)
        return self.runtime.kvcache_splits(p)

    def forward_kvcache(self, q, k_cache, v_cache, out, lse, *, k_end, k_start, cache_batch_idx,
                        block_table, alibi_slopes, cu_seqlens_q, max_seqlen_q, scale, window,
                        causal, softcap, num_splits) -> int:
        """The KV-cache forward in libaotriton_rocm (see kvcache.forward):
        the split count from the library, the workspace allocated here.
        Returns the split count; NativeError where the library refuses the
        call (then nothing ran)."""
        self._ready()
        p = self._kvcache_params(q, k_cache, v_cache, out, lse, k_end, k_start, cache_batch_idx,
                                 block_table, alibi_slopes, cu_seqlens_q, max_seqlen_q, scale,
                                 window, causal, softcap, num_splits, False)
        splits = self.runtime.kvcache_splits(p)
        if splits > 1:
            heads, d = q.shape[-2], q.shape[-1]
            batch = q.shape[0] if cu_seqlens_q is None else cu_seqlens_q.numel() - 1
            o_shape, l_shape = kvcache_workspace_shapes(batch, heads, splits, max_seqlen_q, d)
            o_part = torch.empty(o_shape, dtype=torch.float32, device=q.device)
            l_part = torch.empty(l_shape, dtype=torch.float32, device=q.device)
            p.out_partial, p.lse_partial = tensor_view(o_part), tensor_view(l_part)
            p.num_splits = splits
        self._check(self.runtime.fwd_kvcache(p))
        return splits

    def _kvcache_params(self, q, k_cache, v_cache, out, lse, k_end, k_start, cache_batch_idx,
                        block_table, alibi_slopes, cu_seqlens_q, max_seqlen_q, scale, window,
                        causal, softcap, num_splits, shapes_only) -> KvcacheParams:
        p = KvcacheParams()
        p.device = self.device_index
        p.stream = self._stream()
        for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("out", out),
                        ("lse", lse), ("k_end", k_end), ("k_start", k_start),
                        ("cache_batch_idx", cache_batch_idx), ("block_table", block_table),
                        ("alibi_slopes", alibi_slopes), ("cu_seqlens_q", cu_seqlens_q)):
            if t is not None:
                view = tensor_view(t)
                if shapes_only:
                    view.data = _STAND_IN_ADDRESS
                setattr(p, name, view)
        p.max_seqlen_q = max_seqlen_q if cu_seqlens_q is not None else 0
        p.scale, p.softcap = scale, softcap
        p.window_left, p.window_right = window_sides(window)
        p.causal = int(bool(causal))
        p.num_splits = num_splits
        return p

    def backward(self, grad_out, q, k, v, out, lse, delta, grads, *, bias, bias_grad, rng,
                 varlen, causal, bottom_right, window, scale, dropout_p, softcap=0.0,
                 alibi_slopes=None, deterministic=False) -> None:
        params = BwdParams()
        params.device = self.device_index
        params.stream = self._stream()
        params.problem = _native_problem(q, k, v, bias, rng, varlen, causal, bottom_right, window,
                                         scale, dropout_p)
        for name, t in (("out", out), ("lse", lse), ("grad_out", grad_out), ("delta", delta),
                        ("grad_q", grads[0]), ("grad_k", grads[1]), ("grad_v", grads[2]),
                        ("grad_bias", bias_grad), ("alibi_slopes", alibi_slopes)):
            if t is not None:
                setattr(params, name, tensor_view(t))
        params.softcap = softcap
        _placement(params, varlen)
        # The fused backward where the image has it for the problem (its head
        # dim is then a tile width, so a dense accumulator meets the layout
        # rules): faster, but dQ is summed with atomics, so not where the
        # caller asks for a deterministic backward. Later allocations on this
        # stream queue behind the launches, so the accumulator may be freed
        # on return.
        if not (deterministic or softcap or alibi_slopes is not None) and self.runtime.supported(
                self.device_index, params.problem, NEED_BACKWARD | NEED_DQ_ACCUM) == NATIVE_OK:
            dq_accum = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
            params.grad_q_accum = tensor_view(dq_accum)
        self._check(self.runtime.bwd(params))


    def dropout_uniform(self, out, seed, offset, *, dropout_p, encode_keep) -> None:
        """The attention kernels' dropout draws into ``out`` (see
        :func:`aotriton_rocm.core.dropout_masks.fill_dropout_uniform`)."""
        self._ready()
        params = DropoutUniformParams()
        params.device = self.device_index
        params.stream = self._stream()
        params.out = tensor_view(out)
        params.philox_seed = tensor_view(seed, NATIVE_DTYPES["int64"])
        params.philox_offset = tensor_view(offset, NATIVE_DTYPES["int64"])
        params.dropout_p = float(dropout_p)
        params.encode_keep = int(bool(encode_keep))
        if not hasattr(self.runtime._lib, "aotr_dropout_uniform"):
            raise NativeError(NATIVE_UNSUPPORTED, "AOTR_UNSUPPORTED",
                                     "this libaotriton_rocm has no aotr_dropout_uniform")
        self._check(self.runtime.dropout_uniform(params))


class AOTBackend(NativeBackend):
    """Precompiled code objects from the installed archive for one GPU."""

    def __init__(self, device_index: int):
        from ..common.archive import Archive, ArchiveError
        from ..common.archive_identity import identity_problems
        from ..common.images import find_archives

        self.device_index = device_index
        self.arch = arch_of(device_index)
        self.name = f"aot:{self.arch}"
        self.problem: str | None = None
        self._reasons: dict[tuple, str | None] = {}
        path = find_archives().get(self.arch)
        if path is None:
            self.problem = (f"no kernel image is installed for {self.arch}: "
                            f"pip install 'aotriton-rocm[{self.arch.replace('_', '')}]'")
            return
        try:
            archive = Archive.open(path)
        except ArchiveError as e:
            self.problem = f"the kernel image for {self.arch} is unusable: {e}"
            return
        # The archive must be what its name says, for this device and this
        # runtime's ABI line: never hand another arch's code to the GPU (the
        # library checks this too, the sidecar is checked here only).
        problems = identity_problems(archive, path, expected_arch=self.arch,
                                     expected_abi=ABI_VERSION)
        if problems:
            self.problem = (f"the kernel image for {self.arch} is refused: "
                            + " | ".join(problems))
            return
        try:
            self.runtime = _native_runtime()
            if str(path) not in _added_archives:
                self.runtime.add_archive(path)
                _added_archives.add(str(path))
        except (OSError, NativeError) as e:
            self.problem = f"the kernel image for {self.arch} is unusable: {e}"
            return
        _native_names[device_index] = self.name

    def _stream(self) -> int:
        return _raw_stream(self.device_index)


def _placement(params, varlen) -> None:
    """A packed batch's sequences placed apart from its cu_seqlens."""
    for name in ("seq_starts_q", "seq_starts_k", "seqlens_k"):
        t = None if varlen is None else getattr(varlen, name)
        if t is not None:
            setattr(params, name, tensor_view(t))


def _native_problem(q, k, v, bias, rng, varlen, causal, bottom_right, window, scale, dropout_p):
    return make_problem(
        q, k, v, scale=scale, causal=causal, bottom_right=bottom_right, window=window, bias=bias,
        dropout_p=dropout_p, rng=rng,
        cu_seqlens=None if varlen is None else (varlen.cu_seqlens_q, varlen.cu_seqlens_k),
        max_seqlens=(0, 0) if varlen is None else (varlen.max_seqlen_q, varlen.max_seqlen_k))


class HostBackend(NativeBackend):
    """Calls libaotriton_rocm plans on its host backend, whose launches the
    caller runs (:mod:`.host_kernels`): ``self._launcher`` keeps a launch's
    own exception, raised again here."""

    _launcher = None

    def _stream(self) -> int:
        return 0

    def _check(self, status: int) -> None:
        self._launcher.raise_pending()
        check_status(status)


class InterpreterBackend(HostBackend):
    """The kernel sources, run on CPU tensors by Triton's interpreter, each
    call planned by libaotriton_rocm as it plans a GPU call.

    It serves the variants of the NVIDIA test target (same functional coverage
    as the archives), with UPCAST_DOT on: the interpreter stores bf16 as raw
    uint16 and cannot do arithmetic on it.
    """

    name = INTERPRETER

    def __init__(self):
        # the spec reader (tomllib, ast, dataclasses: tens of ms to import)
        # serves this backend only, not the GPU route
        import triton

        from .host_kernels import host_runtime, interpreter_runner
        from .interpreter_compat import fix_scalar_index
        from .kernel_sources import interpreted_function
        from .kernel_spec import INTERPRETER_ARCH, kernels_dir, load_variants

        fix_scalar_index()
        spec = load_variants(kernels_dir())
        variants = spec.variants_for(INTERPRETER_ARCH)
        functions = {name: interpreted_function(spec.kernels[name])
                     for name in {v.kernel for v in variants}}
        self.runtime, self._launcher = host_runtime(variants, interpreter_runner(functions),
                                                    triton.__version__)
        self._reasons: dict[tuple, str | None] = {}

    def unsupported_reason(self, *, dtype, head_dim, bias=False, dropout=False, work=0):
        if work > INTERPRETER_MAX_WORK:
            return "too large for the CPU interpreter backend"
        return super().unsupported_reason(dtype=dtype, head_dim=head_dim, bias=bias,
                                          dropout=dropout)


@functools.lru_cache(maxsize=None)
def _aot_backend(index: int) -> AOTBackend:
    return AOTBackend(index)


class UnavailableBackend(Backend):
    """Stands in for a backend that cannot run here, and says why."""

    def __init__(self, name: str, reason: str):
        self.name, self.reason = name, reason

    def unsupported_reason(self, *, dtype, head_dim, bias=False, dropout=False, work=0):
        return self.reason


@functools.lru_cache(maxsize=1)
def _interpreter_backend() -> Backend:
    try:
        return InterpreterBackend()
    except ImportError as exc:
        return UnavailableBackend(
            "interpreter:cpu", f"the CPU backend needs triton and numpy ({exc}): "
                               "pip install 'aotriton-rocm[cpu]'")


_OVERRIDE: list[Backend] = []


@contextlib.contextmanager
def using(backend: Backend):
    """Within the block, every op's kernels run on ``backend``, whatever the
    tensors' device (``aotriton-rocm tune`` times candidate configs this
    way); not thread-safe, not for production calls."""
    _OVERRIDE.append(backend)
    try:
        yield backend
    finally:
        _OVERRIDE.remove(backend)


def backend_for(t: torch.Tensor) -> Backend | None:
    """The backend that runs kernels on the tensor's device."""
    if _OVERRIDE:
        return _OVERRIDE[-1]
    if t.is_cuda:
        return _aot_backend(t.get_device())
    if t.device.type == "cpu":
        return _interpreter_backend()
    return None


def clear_backend_caches(backends: Iterable = (_aot_backend, _interpreter_backend)) -> None:
    if _interpreter_backend in tuple(backends):
        _host_retired.update(_host_totals() - _host_retired)
    for b in backends:
        b.cache_clear()
    if _aot_backend in tuple(backends):
        _native_names.clear()
