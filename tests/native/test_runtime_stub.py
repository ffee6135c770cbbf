"""libaotriton_rocm's runtime end to end on a CPU-only machine: a real
archive of the kernels' real argument lists, the stub driver recording every
launch, and the Python launch path as the reference. For the same request
the native path must launch the same kernels with the same grids and the
same argument values (placeholder pointers of unused features aside)."""

from __future__ import annotations

import ctypes
import struct

import pytest

torch = pytest.importorskip("torch")

from aotriton_rocm import attention, backends, device, images, kernel_spec, native  # noqa: E402
from aotriton_rocm._version import ABI_VERSION  # noqa: E402
from aotriton_rocm.archive import KernelRecord, write_archive  # noqa: E402

SCRATCH = (("global_scratch", "*i8"), ("profile_scratch", "*i8"))
# Arguments whose pointer is never read when the feature is off: the Python
# path passes a placeholder tensor, the native path q's address.
PLACEHOLDERS = {"BIAS", "DMASK", "CU_Q", "CU_K", "RNG_SEED", "RNG_OFFSET", "DBIAS"}


def _records(head_dims=(64,), bias=(False,), dropout=(False,)):
    spec = kernel_spec.load_variants(kernel_spec.kernels_dir())
    seen, out = set(), []
    for v in spec.variants_for(kernel_spec.INTERPRETER_ARCH):
        f = v.functional
        if f["dtype"] != "fp16" or f["head_dim"] not in head_dims:
            continue
        if f.get("has_bias", False) not in bias or f.get("enable_dropout", False) not in dropout:
            continue
        fkey = (v.kernel, tuple(sorted(f.items())))
        if fkey in seen:
            continue
        seen.add(fkey)
        code = b"stub code of " + v.key.encode()
        image = b"AOTRSTUB" + struct.pack("<Q", 16 + len(code)) + code
        out.append((KernelRecord(
            key=v.key, kernel=v.kernel, functional=dict(f), config=dict(v.config),
            constexprs=dict(v.constexprs), symbol=v.kernel, num_warps=int(v.options.get("num_warps", 4)),
            num_stages=int(v.options.get("num_stages", 1)), warp_size=32, shared=0,
            global_scratch_size=0, profile_scratch_size=0, args=tuple(v.args) + SCRATCH,
            divisible_16=tuple(v.divisible_16), grid=tuple(v.grid)), image))
    return out


@pytest.fixture
def setup(native_build, tmp_path, monkeypatch):
    stub_path = native_build / "tests" / "libaotr_stub_driver.so"
    monkeypatch.setenv(native.ENV_VAR, str(native_build / f"libaotriton_rocm.so.{ABI_VERSION}"))
    monkeypatch.setenv("AOTR_STUB_CUDA_ARCH", "9.0")
    monkeypatch.setattr(native, "_lib", None)
    archive = tmp_path / "sm_90.aotr"
    manifest = {"package_version": "0.1.0", "abi_version": ABI_VERSION, "rocm_profile": "6.4",
                "arch": "sm_90", "backend": "cuda", "warp_size": 32, "compiler": "triton",
                "compiler_version": "3.9.0", "build_inputs_hash": "0" * 64}
    records = _records(bias=(False, True))
    write_archive(archive, manifest, records)

    # The Python launch path over the same archive, launches recorded.
    import aotriton_rocm.driver.launcher as launcher
    python_launches = []

    class RecordingKernel:
        def __init__(self, backend, code, symbol, *a):
            self.symbol = symbol

        def launch(self, grid, stream, index, *values):
            python_launches.append((self.symbol, tuple(grid), values))

    monkeypatch.setattr(launcher, "Kernel", RecordingKernel)
    monkeypatch.setattr(device, "arch_of", lambda i: "sm_90")
    monkeypatch.setattr(images, "find_archives", lambda refresh=False: {"sm_90": archive})
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda i: 0, raising=False)
    aot = backends.AOTBackend(0)
    assert aot.problem is None
    monkeypatch.setattr(attention, "backend_for", lambda t: aot)

    rt = native.Runtime(driver_library=str(stub_path), backend=native.BACKEND_CUDA)
    rt.add_archive(archive)
    stub = ctypes.CDLL(str(stub_path))
    stub.aotr_stub_reset()
    return rt, stub, {r.kernel + ("/bias" if r.functional.get("has_bias") else "")
                      + f"/{r.functional.get('pad_head')}": r for r, _ in records}, python_launches


def _native_launches(stub, records_by_symbol):
    out = []
    for i in range(stub.aotr_stub_launch_count()):
        sym = ctypes.create_string_buffer(64)
        grid = (ctypes.c_uint * 3)()
        block, shared, size = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_size_t()
        stream = ctypes.c_void_p()
        assert stub.aotr_stub_launch_info(i, sym, 64, grid, ctypes.byref(block), ctypes.byref(shared),
                                          ctypes.byref(stream), ctypes.byref(size)) >= 0
        buf = ctypes.create_string_buffer(size.value)
        stub.aotr_stub_launch_args(i, buf, size.value)
        out.append((sym.value.decode(), tuple(grid), buf.raw, block.value))
    return out


def _decode(args, raw):
    """Natural-alignment packing, as the kernels declare their parameters."""
    values, off = {}, 0
    for name, typ in args:
        size, fmt = (8, "<Q") if typ.startswith("*") else (4, "<f" if typ == "fp32" else "<i")
        off = -(-off // size) * size
        values[name] = struct.unpack_from(fmt, raw, off)[0]
        off += size
    assert off == len(raw)
    return values


def _compare(python, native_l, records, q_ptr):
    assert [p[0] for p in python] == [n[0] for n in native_l]
    for (sym, pgrid, pvalues), (nsym, ngrid, raw, block) in zip(python, native_l):
        rec = next(r for r in records.values() if r.symbol == sym and len(r.args) - 2 == len(pvalues)
                   and r.kernel == sym)
        assert pgrid == ngrid, sym
        assert block == rec.num_warps * rec.warp_size
        nvalues = _decode(rec.args, raw)
        assert nvalues["global_scratch"] == 0 and nvalues["profile_scratch"] == 0
        for (name, typ), pv in zip(rec.args, pvalues):
            nv = nvalues[name]
            if typ == "fp32":
                assert struct.pack("<f", pv) == struct.pack("<f", nv), name
            elif name in PLACEHOLDERS and nv == q_ptr:
                continue
            elif name == "Delta":  # the backward's workspace: each path allocates its own
                continue
            else:
                assert nv == (pv & 0xFFFFFFFFFFFFFFFF if typ.startswith("*") else pv), (sym, name)


def _run_both(rt, q, k, v, *, causal, scale, bias=None, window=(-1, -1)):
    out_n = torch.empty_like(q)
    lse_n = torch.empty(q.shape[:3], dtype=torch.float32)
    p = native.FwdParams()
    p.problem = native.make_problem(q, k, v, scale=scale, causal=causal, bias=bias, window=window)
    p.out, p.lse = native.tensor_view(out_n), native.tensor_view(lse_n)
    native.check(rt.fwd(p))
    do = torch.empty_like(q)
    grads = [torch.empty_like(t) for t in (q, k, v)]
    delta = torch.empty_like(lse_n)
    pb = native.BwdParams()
    pb.problem = p.problem
    for name, t in (("out", out_n), ("lse", lse_n), ("grad_out", do), ("grad_q", grads[0]),
                    ("grad_k", grads[1]), ("grad_v", grads[2]), ("delta", delta)):
        setattr(pb, name, native.tensor_view(t))
    native.check(rt.bwd(pb))
    # The Python path on the same tensors (its outputs are the native path's,
    # so that pointer arguments agree).
    attention.forward(q, k, v, is_causal=causal, scale=scale, out=out_n, lse=lse_n,
                      bias=bias, window_size=window)
    attention.backward(do, q, k, v, out_n, lse_n, is_causal=causal, scale=scale,
                       grads=tuple(grads), bias=bias, window_size=window)
    return delta


@pytest.mark.parametrize("shape", [(2, 4, 4, 128, 128, 64), (1, 8, 2, 211, 333, 64),
                                   (3, 2, 1, 1, 70000, 48)])
@pytest.mark.parametrize("causal", [False, True])
def test_native_launches_what_the_python_path_launches(setup, shape, causal):
    rt, stub, records, python = setup
    b, h, hk, sq, sk, d = shape
    q = torch.empty(b, h, sq, d, dtype=torch.float16)
    k = torch.empty(b, hk, sk, d, dtype=torch.float16)
    v = torch.empty(b, hk, sk, d, dtype=torch.float16)
    if d % 16:  # rows padded to 16 elements, as the kernels need
        q, k, v = (torch.empty(*t.shape[:-1], 64, dtype=t.dtype)[..., :d] for t in (q, k, v))
    _run_both(rt, q, k, v, causal=causal, scale=0.3, window=(17, -1) if causal else (-1, -1))
    native_l = _native_launches(stub, records)
    assert len(native_l) == 4 and rt.launch_count() == 4 and rt.launch_count("attn_fwd") == 1
    # delta is the one buffer the two paths allocate separately
    _compare(python, native_l, records, q.data_ptr())


def test_native_bias_launch_matches(setup):
    rt, stub, records, python = setup
    q = torch.empty(2, 4, 64, 64, dtype=torch.float16)
    k = v = torch.empty(2, 4, 96, 64, dtype=torch.float16)
    bias = torch.zeros(1, 4, 1, 96, dtype=torch.float16).expand(2, 4, 64, 96)
    _run_both(rt, q, k, v, causal=False, scale=0.125, bias=bias)
    _compare(python, _native_launches(stub, records), records, q.data_ptr())


def test_unsupported_and_layout_statuses(setup):
    rt, stub, records, _ = setup
    q = torch.empty(1, 2, 16, 64, dtype=torch.float16)
    p = native.FwdParams()
    # a head dim the archive has no kernel for
    q128 = torch.empty(1, 2, 16, 128, dtype=torch.float16)
    p.problem = native.make_problem(q128, q128, q128, scale=1.0)
    p.out, p.lse = native.tensor_view(torch.empty_like(q128)), native.tensor_view(torch.empty(1, 2, 16))
    assert rt.fwd(p) == native.UNSUPPORTED
    assert "no attn_fwd kernel for dtype=fp16, head_dim=128" in native.library().aotr_last_error().decode()
    # a view the kernels cannot read in place
    odd = torch.empty(1, 2, 16, 72, dtype=torch.float16)[..., :64]
    p.problem = native.make_problem(odd, q, q, scale=1.0)
    p.out, p.lse = native.tensor_view(torch.empty_like(q)), native.tensor_view(torch.empty(1, 2, 16))
    assert rt.fwd(p) == native.NEEDS_LAYOUT
    # shape checks the Python path makes too
    p.problem = native.make_problem(q, torch.empty(1, 3, 16, 64, dtype=torch.float16),
                                    torch.empty(1, 3, 16, 64, dtype=torch.float16), scale=1.0)
    assert rt.fwd(p) == native.UNSUPPORTED
    assert "multiple of key/value heads" in native.library().aotr_last_error().decode()
    assert stub.aotr_stub_launch_count() == 0 and rt.launch_count() == 0
