"""The CPU interpreter's kernels, planned by libaotriton_rocm.

libaotriton_rocm's host backend (``AOTR_BACKEND_HOST``) checks, picks the
variant, binds the arguments, sizes the grid, pads head dims and splits the
KV cache for a CPU call exactly as it does for a GPU one, then hands each
launch to :class:`HostLauncher`, which runs the kernel sources through
Triton's interpreter. The records it plans from are the interpreter's
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
        constexprs = dict(v.constexprs)
        if "UPCAST_DOT" in constexprs:  # the interpreter keeps bf16 as raw uint16
            constexprs["UPCAST_DOT"] = True
        records.append({
            "key": v.key, "kernel": v.kernel, "functional": dict(v.functional),
            "config": dict(v.config), "constexprs": constexprs, "symbol": v.kernel,
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


class HostLauncher:
    """Runs the launches libaotriton_rocm plans: each record's kernel source
    through Triton's interpreter, with the record's constexprs."""

    def __init__(self, variants, functions):
        self._kernels = {}
        for v in variants:
            constexprs = dict(v.constexprs)
            if "UPCAST_DOT" in constexprs:
                constexprs["UPCAST_DOT"] = True
            args = tuple((name, _POINTEE[t[1:]] if t.startswith("*") else t) for name, t in v.args)
            self._kernels[v.key.encode()] = (functions.get(v.kernel), args, constexprs)
        self._spare: dict = {}
        self.error: BaseException | None = None
        self.callback = HOST_LAUNCH(self._launch)

    def _launch(self, _user, key, grid, words, _count) -> int:
        try:
            fn, arg_types, constexprs = self._kernels[key]
            args, pointers = {}, {}
            for i, (name, kind) in enumerate(arg_types):
                if isinstance(kind, torch.dtype):
                    pointers[name] = (words[i], kind)
                else:
                    args[name] = _scalar(kind, words[i])
            args.update(_pointers(pointers, self._spare))
            fn[(grid[0], grid[1], grid[2])](**args, **constexprs)
            return 0
        except BaseException as e:  # noqa: BLE001 - re-raised by the caller (raise_pending)
            self.error = e
            return 1

    def raise_pending(self) -> None:
        """Re-raise a launch's own exception (the C call only saw a failure)."""
        error, self.error = self.error, None
        if error is not None:
            raise error


def host_runtime(variants, functions, compiler_version: str) -> tuple[Runtime, HostLauncher]:
    """A libaotriton_rocm runtime on the host backend whose launches
    ``functions`` (kernel name -> interpreted function) run."""
    launcher = HostLauncher(variants, functions)
    runtime = Runtime.host(kernel_index(variants, compiler_version), launcher.callback,
                           HOST_COMPUTE_UNITS)
    return runtime, launcher
