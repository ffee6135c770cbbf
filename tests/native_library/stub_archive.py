"""Helpers of the native tests (not a test module): real archives of the
kernels' real argument lists whose code objects the stub driver accepts, and
the launches the stub recorded, decoded by argument name."""

from __future__ import annotations

import ctypes
import struct

from aotriton_rocm.core import kernel_spec
from aotriton_rocm._version import ABI_VERSION
from aotriton_rocm.common.archive import KernelRecord

SCRATCH = (("global_scratch", "*i8"), ("profile_scratch", "*i8"))
MANIFEST = {"package_version": "0.1.0", "abi_version": ABI_VERSION, "rocm_profile": "6.4",
            "arch": "sm_90", "backend": "cuda", "warp_size": 32, "compiler": "triton",
            "compiler_version": "3.9.0", "build_inputs_hash": "0" * 64}


def image(name: str) -> bytes:
    """A code object the stub driver loads (its AOTRSTUB header gives the length)."""
    code = b"stub code of " + name.encode()
    return b"AOTRSTUB" + struct.pack("<Q", 16 + len(code)) + code


def record(v, symbol: str, config=None) -> KernelRecord:
    """The archive record of variant ``v`` (optionally with another config)."""
    config = dict(v.config if config is None else config)
    key = v.key if config == v.config else v.key + "|" + symbol
    return KernelRecord(
        key=key, kernel=v.kernel, functional=dict(v.functional), config=config,
        constexprs=dict(v.constexprs), symbol=symbol, num_warps=int(v.options.get("num_warps", 4)),
        num_stages=1, warp_size=32, shared=0, global_scratch_size=0, profile_scratch_size=0,
        args=tuple(v.args) + SCRATCH, divisible_16=tuple(v.divisible_16), grid=tuple(v.grid))


def variants(head_dims=(64,), bias=(False, True), dropout=(False,), labelled=()):
    """One fp16 variant per functional point (the first config), and the
    variants of the ``labelled`` kernels (those whose dtype and head_dim are
    fixed labels: dropout_uniform, philox_state)."""
    spec = kernel_spec.load_variants(kernel_spec.kernels_dir())
    seen = {}
    for v in spec.variants_for(kernel_spec.INTERPRETER_ARCH):
        f = v.functional
        if v.kernel in labelled:
            seen.setdefault((v.kernel,), v)
            continue
        if f["dtype"] != "fp16" or f["head_dim"] not in head_dims:
            continue
        if f.get("has_bias", False) not in bias or f.get("enable_dropout", False) not in dropout:
            continue
        seen.setdefault((v.kernel, tuple(sorted(f.items()))), v)
    return list(seen.values())


def records(**kw):
    """(record, code object) pairs of :func:`variants`, each its own symbol."""
    recs = [record(v, f"{v.kernel}#{i}") for i, v in enumerate(variants(**kw))]
    return [(r, image(r.symbol)) for r in recs]


def kernel_of(symbol: str) -> str:
    return symbol.split("#", 1)[0]


def launches(lib) -> list:
    """(symbol, grid, block, stream, argument bytes) of every recorded launch."""
    out = []
    for i in range(lib.aotr_stub_launch_count()):
        sym = ctypes.create_string_buffer(128)
        grid = (ctypes.c_uint * 3)()
        block, shared, size = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_size_t()
        stream = ctypes.c_void_p()
        assert lib.aotr_stub_launch_info(i, sym, 128, grid, ctypes.byref(block), ctypes.byref(shared),
                                         ctypes.byref(stream), ctypes.byref(size)) >= 0
        buf = ctypes.create_string_buffer(size.value)
        lib.aotr_stub_launch_args(i, buf, size.value)
        out.append((sym.value.decode(), tuple(grid), block.value, stream.value or 0, buf.raw))
    return out


def decode(args, raw) -> dict:
    """Argument values by name (natural-alignment packing, as the kernels
    declare their parameters)."""
    values, off = {}, 0
    for name, typ in args:
        size, fmt = ((8, "<Q") if typ.startswith("*") else (8, "<q") if typ == "i64"
                     else (4, "<f" if typ == "fp32" else "<i"))
        off = -(-off // size) * size
        values[name] = struct.unpack_from(fmt, raw, off)[0]
        off += size
    assert off == len(raw)
    return values


def assert_same_launches(a, b, recs, ignore=("Delta",)) -> None:
    """Two routes launched the same kernels with the same grids, blocks and
    argument values (but for buffers each allocates itself, ``ignore``)."""
    by_symbol = {r.symbol: r for r, _ in recs}
    assert [s for s, *_ in a] == [s for s, *_ in b]
    for (sym, grid, block, _, raw), (_, grid2, block2, _, raw2) in zip(a, b):
        assert (grid, block) == (grid2, block2), sym
        args = by_symbol[sym].args
        va, vb = decode(args, raw), decode(args, raw2)
        for name in ignore:
            va.pop(name, None), vb.pop(name, None)
        assert va == vb, (sym, {n: (va[n], vb[n]) for n in va if va[n] != vb[n]})


def stub_runtime(stub_path, archive):
    """A libaotriton_rocm runtime on the stub driver, serving `archive`."""
    from aotriton_rocm.core import native

    rt = native.Runtime(driver_library=str(stub_path), backend=native.BACKEND_CUDA)
    rt.add_archive(archive)
    return rt
