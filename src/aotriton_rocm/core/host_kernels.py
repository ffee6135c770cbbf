"""Kernels the caller runs, planned by libaotriton_rocm.

libaotriton_rocm's host backend (``AOTR_BACKEND_HOST``) checks, picks the
variant, binds the arguments, sizes the grid, pads head dims and splits the
KV cache for a call exactly as it does for a GPU one, then hands each launch
to :class:`HostLauncher`. The CPU interpreter runs the kernel sources there
(:class:`~aotriton_rocm.core.backends.InterpreterBackend`); ``aotriton-rocm
tune`` runs and times candidate configs. The records it plans from are
variants of kernels/variants.toml (an archive's index without code objects).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import struct

import torch

from .._version import ABI_VERSION, __version__
from .native import HOST_LAUNCH, Runtime

# The runtime appends two scratch pointers to every kernel's arguments
# (the compiled kernels' global and profile scratch).
_SCRATCH = (["global_scratch", "*i8"], ["profile_scratch", "*i8"])
_POINTEE = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32,
            "i32": torch.int32, "i64": torch.int64, "i8": torch.int8}
# A (CPU) compute-unit count the host stands in for when the KV cache's
# split count is chosen: enough that long caches are split, as on a GPU.
HOST_COMPUTE_UNITS = 8


def kernel_index(variants, compiler_version: str) -> bytes:
    """The JSON index (manifest and records, no code objects) of
    ``variants`` for the host backend: the first config of each functional
    point is the one the runtime picks; no divisibility is assumed."""
    records = []
    for v in variants:
        records.append({
            "key": v.key, "kernel": v.kernel, "functional": dict(v.functional),
            "config": dict(v.config), "constexprs": interpreter_constexprs(v), "symbol": v.kernel,
            "num_warps": int(v.options.get("num_warps", 4)), "num_stages": 1, "warp_size": 32,
            "shared": 0, "global_scratch_size": 0, "profile_scratch_size": 0,
            "args": [list(a) for a in v.args] + [list(a) for a in _SCRATCH],
            "divisible_16": [], "grid": list(v.grid), "offset": 0, "compressed_size": 0,
            "size": 0, "sha256": hashlib.sha256(b"").hexdigest(), "stats": {}})
    manifest = {"format_version": 1, "package_version": __version__, "abi_version": ABI_VERSION,
                "rocm_profile": "none", "arch": "host", "backend": "host", "warp_size": 32,
                "compiler": "triton-interpreter", "compiler_version": compiler_version,
                "build_inputs_hash": "0" * 64, "blob_sha256": hashlib.sha256(b"").hexdigest()}
    return json.dumps({"manifest": manifest, "kernels": records}).encode()


def _pointers(wanted: dict, spare: dict) -> dict:
    """Tensors at the addresses of ``wanted`` (name -> (address, dtype)):
    the interpreter reads and writes through their data_ptr. Arguments that
    share an address share its bytes (the interpreter keys its copies by
    address); NULL gets a stand-in of the type (never read)."""
    widths: dict = {}
    for address, dtype in wanted.values():
        widths[address] = max(widths.get(address, 1), dtype.itemsize)
    out = {}
    for name, (address, dtype) in wanted.items():
        if address == 0:
            if dtype not in spare:
                spare[dtype] = torch.zeros(16, dtype=dtype)
            out[name] = spare[dtype]
        else:
            window = (ctypes.c_byte * widths[address]).from_address(address)
            out[name] = torch.frombuffer(window, dtype=dtype)
    return out


_WORD = struct.Struct("<Q")


def _scalar(arg_type: str, word: int):
    if arg_type == "fp32":
        return struct.unpack("<f", _WORD.pack(word)[:4])[0]
    # i32 comes sign-extended, i64 as is: both a signed 64-bit word
    return word - (1 << 64) if word >= 1 << 63 else word


def interpreter_constexprs(v) -> dict:
    """A variant's constexprs as the interpreter runs them (UPCAST_DOT on:
    it keeps bf16 as raw uint16 and cannot do arithmetic on it)."""
    constexprs = dict(v.constexprs)
    if "UPCAST_DOT" in constexprs:
        constexprs["UPCAST_DOT"] = True
    return constexprs


def interpreter_runner(functions):
    """Runs a planned launch of a variant through ``functions`` (kernel name
    -> the kernel source as Triton's interpreter runs it)."""
    constexprs: dict = {}  # per variant key, built on its first launch

    def run(v, grid, args):
        if v.key not in constexprs:
            constexprs[v.key] = interpreter_constexprs(v)
        functions[v.kernel][grid](**args, **constexprs[v.key])
    return run


class HostLauncher:
    """Takes the launches libaotriton_rocm plans and hands each to ``run(variant,
    grid, args)``, the arguments by name: pointers as tensors over host
    memory, or with ``device_memory`` as addresses (ints, which Triton's
    compiled launchers take)."""

    def __init__(self, variants, run, *, device_memory: bool = False):
        self._kernels = {}
        for v in variants:
            args = tuple((name, _POINTEE[t[1:]] if t.startswith("*") else t) for name, t in v.args)
            self._kernels[v.key.encode()] = (v, args)
        self._run = run
        self._device_memory = device_memory
        self._spare: dict = {}
        self.error: BaseException | None = None
        self.callback = HOST_LAUNCH(self._launch)

    def _launch(self, _user, key, grid, words, _count) -> int:
        try:
            v, arg_types = self._kernels[key]
            args, pointers = {}, {}
            for i, (name, kind) in enumerate(arg_types):
                if not isinstance(kind, torch.dtype):
                    args[name] = _scalar(kind, words[i])
                elif self._device_memory:
                    args[name] = words[i]
                else:
                    pointers[name] = (words[i], kind)
            args.update(_pointers(pointers, self._spare))
            self._run(v, (grid[0], grid[1], grid[2]), args)
            return 0
        except BaseException as e:  # noqa: BLE001 - re-raised by the caller (raise_pending)
            self.error = e
            return 1

    def raise_pending(self) -> None:
        """Re-raise a launch's own exception (the C call only saw a failure)."""
        error, self.error = self.error, None
        if error is not None:
            raise error


def host_runtime(variants, run, compiler_version: str, *, device_memory: bool = False,
                 compute_units: int = HOST_COMPUTE_UNITS) -> tuple[Runtime, HostLauncher]:
    """A libaotriton_rocm runtime on the host backend that plans calls from
    ``variants`` and hands each launch to ``run`` (see :class:`HostLauncher`)."""
    launcher = HostLauncher(variants, run, device_memory=device_memory)
    runtime = Runtime.host(kernel_index(variants, compiler_version), launcher.callback,
                           compute_units)
    return runtime, launcher
