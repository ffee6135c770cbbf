"""Where kernels run: the AOT archive on a GPU, Triton's interpreter on the CPU.

Both backends serve the same kernels (names, argument lists and functional
values from kernels/variants.toml) to :mod:`aotriton_rocm.attention`, and count
every launch, so a caller can prove that our kernels ran rather than torch's.
"""

from __future__ import annotations

import bisect
import collections
import functools
import threading
from typing import Iterable

import torch

from . import device as _device
from ._version import ABI_VERSION

KERNELS = ("attn_fwd", "attn_bwd_preprocess", "attn_bwd_dkdv", "attn_bwd_dq")
# (backend name, kernel name) -> launches since import (or the last reset).
_LAUNCHES: collections.Counter = collections.Counter()
# The interpreter executes every block op in numpy: keep CPU work bounded.
INTERPRETER_MAX_WORK = 1 << 28  # batch*heads*seqlen_q*seqlen_k*head_dim


def launch_counts() -> dict[tuple[str, str], int]:
    return dict(_LAUNCHES)


def reset_launch_counts() -> None:
    _LAUNCHES.clear()


def block_d(head_dim: int) -> int:
    """The padded tile width the kernels use for a head dim: a power of two >= 16."""
    return max(16, 1 << (int(head_dim) - 1).bit_length())


def _functional_key(kernel: str, functional: dict) -> tuple:
    """(kernel, dtype, padded head dim, masked head dim?, bias?, dropout?) of
    a variant's functional values. The preprocess kernel always masks the head
    dim and has neither a bias nor dropout: None on those axes."""
    def flag(name):
        return None if name not in functional else bool(functional[name])
    return (kernel, functional["dtype"], int(functional["head_dim"]), flag("pad_head"),
            flag("has_bias"), flag("enable_dropout"))


def _candidate_keys(kernel: str, dtype: str, head_dim: int, bias: bool, dropout: bool) -> tuple:
    """Functional keys that can run `head_dim`, best first: the unmasked fast
    path where head_dim is the tile width, else the masked variant."""
    b = block_d(head_dim)
    if kernel == "attn_bwd_preprocess":
        return ((kernel, dtype, b, None, None, None),)
    masked = (kernel, dtype, b, True, bias, dropout)
    return ((kernel, dtype, b, False, bias, dropout), masked) if b == head_dim else (masked,)


def _pick(table: dict, kernel: str, dtype: str, head_dim: int, bias: bool = False,
          dropout: bool = False):
    return next((table[k] for k in _candidate_keys(kernel, dtype, head_dim, bias, dropout)
                 if k in table), None)


def _missing(table: dict, kernel: str, dtype: str, head_dim: int, bias: bool,
             dropout: bool) -> str | None:
    """The first kernel a forward (+ backward) needs that `table` lacks, or None."""
    needed = (kernel,) if kernel != "attn_fwd" else KERNELS
    for name in needed:
        if _pick(table, name, dtype, head_dim, bias, dropout) is None:
            return (f"no {name} kernel for dtype={dtype}, head_dim={head_dim}"
                    + (", with a bias" if bias else "") + (", with dropout" if dropout else ""))
    return None


def _memo_missing(memo: dict, table: dict, *key) -> str | None:
    """:func:`_missing`, remembered per call key (it runs on every call)."""
    try:
        return memo[key]
    except KeyError:
        missing = memo[key] = _missing(table, *key)
        return missing


def _selection_tables(manifest: dict, groups: dict) -> dict:
    """Per functional key of ``groups`` (key -> records): (bounds, records,
    on_k), the seqlen runs the build chose (manifest "tuning", see
    tooling/tuning.py): records[i] serves seqlens <= bounds[i], the last one
    everything above; on_k: bucket by seqlen_k (else seqlen_q). An archive
    without tuning data serves the first record for every seqlen."""
    tuning = manifest.get("tuning") or {}
    axes = tuning.get("axes") or {}
    runs_of = {}
    for choice in tuning.get("choices") or ():
        for _, key, _ in choice["select"]:
            runs_of[key] = choice["select"]
    tables = {}
    for fkey, recs in groups.items():
        by_key = {r.key: r for r in recs}
        runs = next((runs_of[r.key] for r in recs if r.key in runs_of), None)
        if runs is None or any(k not in by_key for _, k, _ in runs):
            tables[fkey] = ((), (recs[0],), False)
        else:
            tables[fkey] = (tuple(int(b) for b, _, _ in runs[:-1]), tuple(by_key[k] for _, k, _ in runs),
                            axes.get(recs[0].kernel) == "seqlen_k")
    return tables


class KernelHandle:
    """One selected variant, ready to launch with the arguments in spec order."""

    __slots__ = ("config", "_launch")

    def __init__(self, config: dict, launch):
        self.config = config
        self._launch = launch

    def launch(self, grid: tuple[int, int, int], device: torch.device, args: tuple) -> None:
        self._launch(grid, device, args)


class Backend:
    name = "?"

    def unsupported_reason(self, kernel: str, *, dtype: str, head_dim: int, bias: bool = False,
                           dropout: bool = False, work: int = 0) -> str | None:
        raise NotImplementedError

    def kernel(self, kernel: str, *, dtype: str, head_dim: int, bias: bool = False,
               dropout: bool = False, seqlen_q: int = 0, seqlen_k: int = 0) -> KernelHandle:
        """The variant for a real head dim (the padded tile width and the
        masked/unmasked choice are the backend's business)."""
        raise NotImplementedError


class AOTBackend(Backend):
    """Precompiled code objects from the installed archive for one GPU."""

    def __init__(self, device_index: int):
        from .archive import Archive, ArchiveError, identity_problems
        from .images import find_archives

        self.device_index = device_index
        self.arch = _device.arch_of(device_index)
        self.name = f"aot:{self.arch}"
        self.problem: str | None = None
        self._records: dict[tuple, list] = {}
        # per (kernel, dtype, head dim, ...) call key: (bounds, handles, on_k)
        self._handles: dict[tuple, tuple] = {}
        self._tables: dict[tuple, tuple] = {}
        self._reasons: dict[tuple, str | None] = {}
        self._lock = threading.Lock()
        path = find_archives().get(self.arch)
        if path is None:
            self.problem = (f"no kernel image is installed for {self.arch}: "
                            f"pip install 'aotriton-rocm[{self.arch.replace('_', '')}]'")
            return
        try:
            self.archive = Archive.open(path)
        except ArchiveError as e:
            self.problem = f"the kernel image for {self.arch} is unusable: {e}"
            return
        # The archive must be what its name says, for this device and this
        # runtime's ABI line: never hand another arch's code to the GPU.
        problems = identity_problems(self.archive, path, expected_arch=self.arch,
                                     expected_abi=ABI_VERSION)
        if problems:
            self.problem = (f"the kernel image for {self.arch} is refused: "
                            + " | ".join(problems))
            self.archive = None
            return
        for rec in self.archive.kernels:
            self._records.setdefault(_functional_key(rec.kernel, rec.functional), []).append(rec)
        self._tables = _selection_tables(self.archive.manifest, self._records)

    def unsupported_reason(self, kernel, *, dtype, head_dim, bias=False, dropout=False, work=0):
        if self.problem:
            return self.problem
        missing = _memo_missing(self._reasons, self._records, kernel, dtype, head_dim, bias,
                                dropout)
        return f"the {self.arch} image has {missing}" if missing else None

    def kernel(self, kernel, *, dtype, head_dim, bias=False, dropout=False, seqlen_q=0,
               seqlen_k=0):
        key = (kernel, dtype, head_dim, bias, dropout)
        sel = self._handles.get(key)
        if sel is None:
            with self._lock:
                sel = self._handles.get(key) or self._make_selector(*key)
                self._handles[key] = sel
        bounds, handles, on_k = sel
        # the seqlen bucket: the first run whose bound is >= the seqlen
        return handles[bisect.bisect_left(bounds, seqlen_k if on_k else seqlen_q)]

    def _make_selector(self, *key) -> tuple:
        """(bounds, handles, on_k) for a call key: one handle per record the
        build chose for some seqlen bucket of the functional key."""
        bounds, recs, on_k = _pick(self._tables, *key)
        made: dict = {}
        for r in recs:
            if r.key not in made:
                made[r.key] = self._make_handle(r)
        return bounds, tuple(made[r.key] for r in recs), on_k

    def _make_handle(self, rec) -> KernelHandle:
        from .driver.launcher import Kernel

        backend = self.archive.manifest["backend"]
        compiled = Kernel(backend, self.archive.code_object(rec), rec.symbol, rec.num_warps,
                          rec.warp_size, rec.shared, [t for _, t in rec.args])
        names = [n for n, _ in rec.args]
        # Positions of tensor arguments (the trailing scratch pointers are the
        # launcher's) and of arguments compiled as divisible by 16.
        tensors = tuple(i for i, (_, t) in enumerate(rec.args[:-2]) if t.startswith("*"))
        divisible = tuple(names.index(n) for n in rec.divisible_16)
        counter_key = (self.name, rec.kernel)
        index = self.device_index
        raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw_stream is None:
            def raw_stream(i):
                return torch.cuda.current_stream(i).cuda_stream

        def launch(grid, device, args):
            values = list(args)
            for i in tensors:
                values[i] = values[i].data_ptr()
            for i in divisible:
                if values[i] & 15:
                    raise ValueError(f"{rec.kernel}: argument {names[i]} = {values[i]} breaks "
                                     "the divisible-by-16 assumption it was compiled with")
            compiled.launch(grid, raw_stream(index), index, *values)
            _LAUNCHES[counter_key] += 1

        return KernelHandle(dict(rec.config), launch)


class InterpreterBackend(Backend):
    """The kernel sources, run on CPU tensors by Triton's interpreter.

    It serves the variants of the NVIDIA test target (same functional coverage
    as the archives), with UPCAST_DOT on: the interpreter stores bf16 as raw
    uint16 and cannot do arithmetic on it.
    """

    name = "interpreter:cpu"

    def __init__(self):
        from triton.runtime.interpreter import InterpretedFunction

        from . import kernel_spec

        spec = kernel_spec.load_variants(kernel_spec.kernels_dir())
        self._functions = {name: InterpretedFunction(kernel_spec.jit_function(ks).fn)
                           for name, ks in spec.kernels.items()}
        self._variants: dict[tuple, object] = {}
        self._reasons: dict[tuple, str | None] = {}
        for v in spec.variants_for(kernel_spec.INTERPRETER_ARCH):
            # the first config is the default
            self._variants.setdefault(_functional_key(v.kernel, v.functional), v)

    def unsupported_reason(self, kernel, *, dtype, head_dim, bias=False, dropout=False, work=0):
        missing = _memo_missing(self._reasons, self._variants, kernel, dtype, head_dim, bias,
                                dropout)
        if missing:
            return f"the kernel sources have {missing}"
        if work > INTERPRETER_MAX_WORK:
            return "too large for the CPU interpreter backend"
        return None

    def kernel(self, kernel, *, dtype, head_dim, bias=False, dropout=False, seqlen_q=0,
               seqlen_k=0):
        variant = _pick(self._variants, kernel, dtype, head_dim, bias, dropout)
        constexprs = dict(variant.constexprs)
        if "UPCAST_DOT" in constexprs:
            constexprs["UPCAST_DOT"] = True
        fn = self._functions[kernel]
        counter_key = (self.name, kernel)

        def launch(grid, device, args):
            fn[grid](*args, **constexprs)
            _LAUNCHES[counter_key] += 1

        return KernelHandle(variant.config, launch)


@functools.lru_cache(maxsize=None)
def _aot_backend(index: int) -> AOTBackend:
    return AOTBackend(index)


class UnavailableBackend(Backend):
    """Stands in for a backend that cannot run here, and says why."""

    def __init__(self, name: str, reason: str):
        self.name, self.reason = name, reason

    def unsupported_reason(self, kernel, *, dtype, head_dim, bias=False, dropout=False, work=0):
        return self.reason


@functools.lru_cache(maxsize=1)
def _interpreter_backend() -> Backend:
    try:
        return InterpreterBackend()
    except ImportError as exc:
        return UnavailableBackend(
            "interpreter:cpu", f"the CPU backend needs triton and numpy ({exc}): "
                               "pip install 'aotriton-rocm[cpu]'")


def backend_for(t: torch.Tensor) -> Backend | None:
    """The backend that runs kernels on the tensor's device."""
    if t.is_cuda:
        return _aot_backend(t.get_device())
    if t.device.type == "cpu":
        return _interpreter_backend()
    return None


def clear_backend_caches(backends: Iterable = (_aot_backend, _interpreter_backend)) -> None:
    for b in backends:
        b.cache_clear()
