"""libaotriton_rocm's runtime end to end on a CPU-only machine: a real
archive with the kernels' real argument lists, the stub driver recording
every launch (grid, block, the packed argument bytes), and the values each
argument must have, derived here from the tensors by name. Also the seqlen
buckets of the build's tuning runs, and the statuses of refused calls."""

from __future__ import annotations

import ctypes
import dataclasses
import struct

import pytest

torch = pytest.importorskip("torch")

from aotriton_rocm.core import attention, backends, native  # noqa: E402
from aotriton_rocm.common import images  # noqa: E402
from aotriton_rocm.tooling.builder.archive_writer import write_archive  # noqa: E402

from stub_archive import MANIFEST, decode as _decode, image as _image, launches as _launches  # noqa: E402
from stub_archive import record as _record, stub_runtime as _runtime, variants  # noqa: E402


def _variants(head_dims=(64,)):
    return variants(head_dims=head_dims)


def _zhm(t, prefix, varlen=False):
    s = t.stride()
    return ({f"{prefix}z": 0, f"{prefix}h": s[1], f"{prefix}m": s[0]} if varlen else
            {f"{prefix}z": s[0], f"{prefix}h": s[1], f"{prefix}m": s[2]})


def _f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


@pytest.fixture
def plain(stub, tmp_path):
    """An sm_90 archive of the fp16 head-dim-64 points (no dropout), one record each."""
    stub_path, lib = stub
    recs = [_record(v, f"k{i}") for i, v in enumerate(_variants())]
    archive = tmp_path / "sm_90.aotr"
    write_archive(archive, MANIFEST, [(r, _image(r.symbol)) for r in recs])
    return _runtime(stub_path, archive), lib, {r.symbol: r for r in recs}


def _fwd(rt, q, k, v, out, lse, **kw):
    p = native.FwdParams()
    p.stream = 0x5000
    p.problem = native.make_problem(q, k, v, **kw)
    p.out, p.lse = native.tensor_view(out), native.tensor_view(lse)
    return rt.fwd(p)


def _bwd(rt, q, k, v, out, lse, do, grads, delta, **kw):
    p = native.BwdParams()
    p.stream = 0x5000
    p.problem = native.make_problem(q, k, v, **kw)
    for name, t in (("out", out), ("lse", lse), ("grad_out", do), ("grad_q", grads[0]),
                    ("grad_k", grads[1]), ("grad_v", grads[2]), ("delta", delta)):
        setattr(p, name, native.tensor_view(t))
    return rt.bwd(p)


def _padded(*shape):
    return torch.empty(*shape[:-1], -(-shape[-1] // 16) * 16, dtype=torch.float16)[..., :shape[-1]]


@pytest.mark.parametrize("shape", [(2, 4, 4, 128, 128, 64), (1, 8, 2, 211, 333, 64),
                                   (3, 2, 1, 1, 70000, 48), (2, 70000, 70000, 3, 3, 64)])
@pytest.mark.parametrize("causal", [False, True])
def test_arguments_by_name(plain, shape, causal):
    rt, lib, records = plain
    b, h, hk, sq, sk, d = shape
    q, out, do, dq = (_padded(b, h, sq, d) for _ in range(4))
    k, v, dk, dv = (_padded(b, hk, sk, d) for _ in range(4))
    lse, delta = torch.empty(b, h, sq), torch.empty(b, h, sq)
    window = (17, 0) if causal else (-1, -1)
    kw = dict(scale=0.3, window=window, bottom_right=not causal)
    assert _fwd(rt, q, k, v, out, lse, **kw) == native.OK
    assert _bwd(rt, q, k, v, out, lse, do, (dq, dk, dv), delta, **kw) == native.OK
    launches = _launches(lib)
    assert [records[s].kernel for s, *_ in launches] == [
        "attn_fwd", "attn_bwd_preprocess", "attn_bwd_dkdv", "attn_bwd_dq"]
    assert rt.launch_count() == 4 and rt.launch_count("attn_bwd_dq") == 1
    common = {"batch": b, "num_heads": h, "gqa_group": h // hk, "max_seqlen_q": sq,
              "max_seqlen_k": sk, "varlen": 0, "head_dim": d, "bottom_right": int(not causal),
              # flash-attn's rule: a size >= seqlen_k is unbounded
              "window_left": window[0] if window[0] < sk else -1, "window_right": window[1],
              "sm_scale": _f32(0.3),
              "dropout_p": 0.0, "Q": q.data_ptr(), "K": k.data_ptr(), "V": v.data_ptr(),
              "stride_bz": 0, "stride_bh": 0, "stride_bm": 0, "stride_lz": lse.stride(0),
              "stride_lh": lse.stride(1), "LSE": lse.data_ptr(), "global_scratch": 0,
              "profile_scratch": 0, **_zhm(q, "stride_q"), **_zhm(k, "stride_k"),
              **{n.replace("stride_km", "stride_kn"): x for n, x in _zhm(k, "stride_k").items()},
              **{n.replace("stride_vm", "stride_vn"): x for n, x in _zhm(v, "stride_v").items()},
              "CU_Q": q.data_ptr(), "CU_K": q.data_ptr(), "BIAS": q.data_ptr(),
              "RNG_SEED": q.data_ptr(), "RNG_OFFSET": q.data_ptr(),
              "ALIBI": q.data_ptr(), "stride_az": 0, "stride_ah": 0, "has_alibi": 0,
              "softcap": 0.0}
    per_kernel = {
        "attn_fwd": {"O": out.data_ptr(), "DMASK": q.data_ptr(), "store_dmask": 0,
                     **_zhm(out, "stride_o")},
        "attn_bwd_preprocess": {"O": out.data_ptr(), "DO": do.data_ptr(), "Delta": delta.data_ptr(),
                                **_zhm(out, "stride_o"), **_zhm(do, "stride_do")},
        "attn_bwd_dkdv": {"DO": do.data_ptr(), "Delta": delta.data_ptr(), "DK": dk.data_ptr(),
                          "DV": dv.data_ptr(), **_zhm(do, "stride_do"),
                          **{n[:-1] + "n": x for n, x in _zhm(dk, "stride_dk").items() if n[-1] == "m"},
                          **{n: x for n, x in _zhm(dk, "stride_dk").items() if n[-1] != "m"},
                          **{n[:-1] + "n": x for n, x in _zhm(dv, "stride_dv").items() if n[-1] == "m"},
                          **{n: x for n, x in _zhm(dv, "stride_dv").items() if n[-1] != "m"}},
        "attn_bwd_dq": {"DO": do.data_ptr(), "Delta": delta.data_ptr(), "DQ": dq.data_ptr(),
                        "DBIAS": q.data_ptr(), "store_dbias": 0, "stride_dbz": 0, "stride_dbh": 0,
                        "stride_dbm": 0, **_zhm(do, "stride_do"), **_zhm(dq, "stride_dq")},
    }
    for sym, grid, block, stream, raw in launches:
        rec = records[sym]
        got = _decode(rec.args, raw)
        want = {n: x for n, x in {**common, **per_kernel[rec.kernel]}.items() if n in got}
        assert set(got) == set(want) | ({"sm_scale", "dropout_p"} & set(got)), (rec.kernel, set(got) ^ set(want))
        assert got == want, rec.kernel
        tile = rec.config["BLOCK_N"] if rec.kernel == "attn_bwd_dkdv" else rec.config["BLOCK_M"]
        rows = sk if rec.kernel == "attn_bwd_dkdv" else sq
        programs = b * (hk if rec.kernel == "attn_bwd_dkdv" else h)
        y = min(programs, 65535)
        assert grid == (-(-rows // tile), y, -(-programs // y)), rec.kernel
        assert block == rec.num_warps * 32 and stream == 0x5000


def test_seqlen_buckets_follow_the_tuning_runs(stub, tmp_path):
    stub_path, lib = stub
    vs = {v.kernel: v for v in _variants() if not v.functional.get("has_bias")
          and v.functional.get("pad_head", False) is False}
    f64 = _record(vs["attn_fwd"], "f64", {**vs["attn_fwd"].config, "BLOCK_M": 64})
    f128 = _record(vs["attn_fwd"], "f128", {**vs["attn_fwd"].config, "BLOCK_M": 128})
    k16 = _record(vs["attn_bwd_dkdv"], "k16", {**vs["attn_bwd_dkdv"].config, "BLOCK_N": 16})
    k32 = _record(vs["attn_bwd_dkdv"], "k32", {**vs["attn_bwd_dkdv"].config, "BLOCK_N": 32})
    k64 = _record(vs["attn_bwd_dkdv"], "k64", {**vs["attn_bwd_dkdv"].config, "BLOCK_N": 64})
    others = [_record(vs[n], n) for n in ("attn_bwd_preprocess", "attn_bwd_dq")]
    tuning = {"schema": 1, "axes": {"attn_fwd": "seqlen_q", "attn_bwd_dkdv": "seqlen_k"},
              "choices": [
                  {"kernel": "attn_fwd", "functional": f64.functional,
                   "select": [[64, f64.key, "static"], [None, f128.key, "static"]]},
                  {"kernel": "attn_bwd_dkdv", "functional": k16.functional,
                   "select": [[16, k16.key, "static"], [None, k32.key, "static"]],
                   "decode": [16, k64.key, "measured"]}]}
    archive = tmp_path / "sm_90.aotr"
    write_archive(archive, {**MANIFEST, "tuning": tuning},
                  [(r, _image(r.symbol)) for r in (f64, f128, k16, k32, k64, *others)])
    rt = _runtime(stub_path, archive)
    loads = []

    def run(sq, sk):
        loads.append(lib.aotr_stub_load_count())
        lib.aotr_stub_reset()
        q, out, do, dq = (_padded(1, 1, sq, 64) for _ in range(4))
        k, v, dk, dv = (_padded(1, 1, sk, 64) for _ in range(4))
        lse, delta = torch.empty(1, 1, sq), torch.empty(1, 1, sq)
        assert _fwd(rt, q, k, v, out, lse, scale=1.0) == native.OK
        assert _bwd(rt, q, k, v, out, lse, do, (dq, dk, dv), delta, scale=1.0) == native.OK
        names = [s for s, *_ in _launches(lib)]
        return names[0], names[2]

    # dK/dV: up to 16 query rows (decoding) take the decoding tile whatever the key length
    assert run(1, 4096) == ("f64", "k64") and run(16, 16) == ("f64", "k64")
    assert run(64, 4096) == ("f64", "k32") and run(17, 16) == ("f64", "k16")
    assert run(65, 16) == ("f128", "k16") and run(100000, 17) == ("f128", "k32")
    loads.append(lib.aotr_stub_load_count())
    assert sum(loads) == 5 + 2  # each chosen record loaded once


def _scratch_forward(stub, tmp_path):
    """A runtime serving one fast-path forward record that declares 384
    bytes of global scratch per program: (runtime, record)."""
    v = next(v for v in _variants() if v.kernel == "attn_fwd" and not v.functional.get("has_bias")
             and not v.functional["pad_head"])
    rec = dataclasses.replace(_record(v, "tma"), global_scratch_size=384)
    archive = tmp_path / "sm_90.aotr"
    write_archive(archive, MANIFEST, [(rec, _image(rec.symbol))])
    return _runtime(stub[0], archive), rec


def test_global_scratch_is_allocated_per_launch(stub, tmp_path):
    """A kernel that declares global scratch (the sm_90 forward builds its TMA
    descriptors there) gets size x programs bytes, allocated and freed in the
    launch's stream order from the runtime's own pool of the device (which
    keeps 64 MiB mapped across synchronisations); kernels without get NULL."""
    lib = stub[1]
    # pools of runtimes other tests of this process keep (the torch extension's)
    pools = lib.aotr_stub_pools(None, None)
    rt, rec = _scratch_forward(stub, tmp_path)
    q = _padded(2, 3, 300, 64)
    assert _fwd(rt, q, q, q, _padded(2, 3, 300, 64), torch.empty(2, 3, 300), scale=1.0) == native.OK
    (sym, grid, _, _, raw), = _launches(lib)
    programs = grid[0] * grid[1] * grid[2]
    assert programs == -(-300 // rec.config["BLOCK_M"]) * 6
    last_bytes, last_stream = ctypes.c_size_t(), ctypes.c_void_p()
    assert lib.aotr_stub_scratch(ctypes.byref(last_bytes), ctypes.byref(last_stream)) == 0  # freed
    assert last_bytes.value == 384 * programs and last_stream.value == 0x5000
    assert lib.aotr_stub_calls(b"cuMemAllocFromPoolAsync") == lib.aotr_stub_calls(b"cuMemFreeAsync") == 1
    assert lib.aotr_stub_calls(b"cuMemAllocAsync") == 0
    device, threshold = ctypes.c_int(), ctypes.c_ulonglong()
    assert lib.aotr_stub_pools(ctypes.byref(device), ctypes.byref(threshold)) == pools + 1
    assert device.value == 0 and threshold.value == 64 << 20
    args = _decode(rec.args, raw)
    assert args["global_scratch"] != 0 and args["profile_scratch"] == 0

    # a failed allocation launches nothing and says which kernel needed it
    lib.aotr_stub_fail_next(b"cuMemAllocFromPoolAsync", 2)  # CUDA_ERROR_OUT_OF_MEMORY
    assert _fwd(rt, q, q, q, _padded(2, 3, 300, 64), torch.empty(2, 3, 300), scale=1.0) == 8  # AOTR_DRIVER_ERROR
    err = native.library().aotr_last_error().decode()
    assert "cuMemAllocFromPoolAsync failed" in err and "attn_fwd" in err and "global scratch" in err
    assert lib.aotr_stub_launch_count() == 1 and lib.aotr_stub_scratch(None, None) == 0
    assert lib.aotr_stub_calls(b"cuMemPoolCreate") == 1  # one pool, made once
    del rt
    assert lib.aotr_stub_pools(None, None) == pools  # destroyed with the runtime


def test_global_scratch_without_a_pool_uses_the_default_one(stub, tmp_path):
    """Where the driver cannot make a pool, scratch comes from the device's
    default pool (cuMemAllocAsync), and the runtime does not try again."""
    lib = stub[1]
    pools = lib.aotr_stub_pools(None, None)
    rt, rec = _scratch_forward(stub, tmp_path)
    q = _padded(2, 3, 300, 64)
    lib.aotr_stub_fail_next(b"cuMemPoolCreate", 2)
    for _ in range(2):
        assert _fwd(rt, q, q, q, _padded(2, 3, 300, 64), torch.empty(2, 3, 300), scale=1.0) == native.OK
    assert lib.aotr_stub_calls(b"cuMemPoolCreate") == 1
    assert lib.aotr_stub_calls(b"cuMemAllocAsync") == lib.aotr_stub_calls(b"cuMemFreeAsync") == 2
    assert lib.aotr_stub_launch_count() == 2 and lib.aotr_stub_scratch(None, None) == 0
    assert lib.aotr_stub_pools(None, None) == pools


def test_hip_refuses_kernels_that_need_global_scratch(stub, tmp_path):
    """The HIP path allocates no scratch (the build refuses such AMD kernels):
    an image that has one anyway fails with what to do, launching nothing."""
    stub_path, lib = stub
    v = next(v for v in _variants() if v.kernel == "attn_fwd" and not v.functional.get("has_bias")
             and not v.functional["pad_head"])
    rec = dataclasses.replace(_record(v, "scratchy"), global_scratch_size=128, warp_size=64)
    archive = tmp_path / "gfx942.aotr"
    write_archive(archive, {**MANIFEST, "arch": "gfx942", "backend": "hip", "warp_size": 64},
                  [(rec, _image(rec.symbol))])
    rt = native.Runtime(driver_library=str(stub_path), backend=native.BACKEND_HIP)
    rt.add_archive(archive)
    q = _padded(1, 2, 100, 64)
    assert _fwd(rt, q, q, q, _padded(1, 2, 100, 64), torch.empty(1, 2, 100), scale=1.0) == native.UNSUPPORTED
    assert "needs 256 bytes of global scratch, which the HIP path does not allocate" in \
        native.library().aotr_last_error().decode()
    assert lib.aotr_stub_launch_count() == 0 and lib.aotr_stub_scratch(None, None) == 0


def test_archive_without_tuning_uses_the_first_record(stub, tmp_path):
    stub_path, lib = stub
    v = next(v for v in _variants() if v.kernel == "attn_fwd" and not v.functional.get("has_bias")
             and not v.functional["pad_head"])
    first = _record(v, "first", {**v.config, "BLOCK_M": 128})
    second = _record(v, "second", {**v.config, "BLOCK_M": 64})
    archive = tmp_path / "sm_90.aotr"
    write_archive(archive, MANIFEST, [(r, _image(r.symbol)) for r in (first, second)])
    rt = _runtime(stub_path, archive)
    for sq in (1, 100, 10000):
        q = _padded(1, 1, sq, 64)
        assert _fwd(rt, q, q, q, _padded(1, 1, sq, 64), torch.empty(1, 1, sq), scale=1.0) == native.OK
    assert {s for s, *_ in _launches(lib)} == {"first"}


def test_unsupported_and_layout_statuses(plain):
    rt, lib, records = plain
    q = torch.empty(1, 2, 16, 64, dtype=torch.float16)
    lse = torch.empty(1, 2, 16)
    q128 = torch.empty(1, 2, 16, 128, dtype=torch.float16)
    assert _fwd(rt, q128, q128, q128, torch.empty_like(q128), lse, scale=1.0) == native.UNSUPPORTED
    assert "no attn_fwd kernel for dtype=fp16, head_dim=128" in native.library().aotr_last_error().decode()
    odd = torch.empty(1, 2, 16, 72, dtype=torch.float16)[..., :64]
    assert _fwd(rt, odd, q, q, torch.empty_like(q), lse, scale=1.0) == native.NEEDS_LAYOUT
    k3 = torch.empty(1, 3, 16, 64, dtype=torch.float16)
    assert _fwd(rt, q, k3, k3, torch.empty_like(q), lse, scale=1.0) == native.UNSUPPORTED
    assert "multiple of key/value heads" in native.library().aotr_last_error().decode()
    assert lib.aotr_stub_launch_count() == 0 and rt.launch_count() == 0


def test_the_python_gpu_route_is_the_native_one(stub, tmp_path, monkeypatch):
    """attention.forward/backward on an AOT backend hand the whole launch to
    libaotriton_rocm: the launches the stub records come from there."""
    stub_path, lib = stub
    recs = [_record(v, f"k{i}") for i, v in enumerate(_variants())]
    archive = tmp_path / "sm_90.aotr"
    write_archive(archive, MANIFEST, [(r, _image(r.symbol)) for r in recs])
    monkeypatch.setattr(backends, "arch_of", lambda i: "sm_90")
    monkeypatch.setattr(images, "find_archives", lambda refresh=False: {"sm_90": archive})
    monkeypatch.setattr(backends, "_native_runtime", lambda: _runtime(stub_path, archive))
    monkeypatch.setattr(backends, "_added_archives", {str(archive)})
    monkeypatch.setattr(backends.AOTBackend, "_stream", lambda self: 0x77)
    aot = backends.AOTBackend(0)
    assert aot.problem is None
    assert aot.unsupported_reason(dtype="fp16", head_dim=64) is None
    assert "head_dim=128" in aot.unsupported_reason(dtype="fp16", head_dim=128)
    assert "with dropout" in aot.unsupported_reason(dtype="fp16", head_dim=64, dropout=True)
    monkeypatch.setattr(attention, "backend_for", lambda t: aot)
    q = torch.empty(2, 3, 50, 40, dtype=torch.float16)  # rows of 40: copied into padded rows
    out, lse = attention.forward(q, q, q, is_causal=True, scale=0.5)
    attention.backward(torch.empty_like(q), q, q, q, out, lse, is_causal=True, scale=0.5)
    launches = _launches(lib)
    kernels = [{r.symbol: r for r in recs}[s].kernel for s, *_ in launches]
    assert kernels == ["attn_fwd", "attn_bwd_preprocess", "attn_bwd_dkdv", "attn_bwd_dq"]
    assert all(stream == 0x77 for _, _, _, stream, _ in launches)


def _score_mod_launches(rt, lib, slopes, softcap, *, struct_size=None):
    """Forward + backward with ALiBi slopes / softcap on (B, H, S, D) = (2,
    4, 33, 64) fp16 views; the decoded arguments of the three kernels that
    take them, by kernel."""
    b, h, sq, sk, d = 2, 4, 33, 47, 64
    q, out, do, dq = (_padded(b, h, sq, d) for _ in range(4))
    k, v, dk, dv = (_padded(b, 2, sk, d) for _ in range(4))
    lse, delta = torch.empty(b, h, sq), torch.empty(b, h, sq)
    fp = native.FwdParams()
    fp.problem = native.make_problem(q, k, v, scale=0.5)
    fp.out, fp.lse = native.tensor_view(out), native.tensor_view(lse)
    bp = native.BwdParams()
    bp.problem = fp.problem
    for name, t in (("out", out), ("lse", lse), ("grad_out", do), ("grad_q", dq),
                    ("grad_k", dk), ("grad_v", dv), ("delta", delta)):
        setattr(bp, name, native.tensor_view(t))
    for p in (fp, bp):
        p.alibi_slopes = native.tensor_view(slopes)
        p.softcap = softcap
    if struct_size is None:
        assert rt.fwd(fp) == native.OK and rt.bwd(bp) == native.OK
    else:
        lib_ = native.library()
        fp.struct_size, bp.struct_size = struct_size(native.FwdParams), struct_size(native.BwdParams)
        assert lib_.aotr_attn_fwd(rt.handle, ctypes.byref(fp)) == native.OK
        assert lib_.aotr_attn_bwd(rt.handle, ctypes.byref(bp)) == native.OK
    records_ = rt._records
    got, pads = {}, {}
    for sym, *_rest, raw in _launches(lib):
        rec = records_[sym]
        if rec.kernel != "attn_bwd_preprocess":
            args = _decode(rec.args, raw)
            got[rec.kernel] = {n: args[n] for n in ("ALIBI", "stride_az", "stride_ah",
                                                    "has_alibi", "softcap")}
            pads[rec.kernel] = rec.functional["pad_head"]
    assert set(got) == {"attn_fwd", "attn_bwd_dkdv", "attn_bwd_dq"}
    return got, q, pads


def test_score_mods_run_the_masked_variant(plain_rt):
    """Only the masked-head-dim variants carry softcap/ALiBi: a call that
    modifies the scores runs them where a plain call takes the fast path
    (head dim 64 = the tile width)."""
    rt, lib = plain_rt
    *_, plain = _score_mod_launches(rt, lib, None, 0.0)
    assert plain == dict.fromkeys(plain, False)
    for slopes, cap in ((None, 2.5), (torch.rand(4), 0.0), (torch.rand(4), 2.5)):
        *_, modified = _score_mod_launches(rt, lib, slopes, cap)
        assert modified == dict.fromkeys(modified, True)


@pytest.fixture
def plain_rt(plain):
    rt, lib, records = plain
    rt._records = records
    return rt, lib


@pytest.mark.parametrize("form", ["h", "bh", "bh-strided"])
def test_alibi_and_softcap_arguments_by_name(plain_rt, form):
    rt, lib = plain_rt
    if form == "h":
        slopes = torch.rand(4)
        want_z, want_h = 0, 1
    elif form == "bh":
        slopes = torch.rand(2, 4)
        want_z, want_h = 4, 1
    else:  # a column view of a (4, 2) tensor: strides (1, 2)
        slopes = torch.rand(4, 2).t()
        want_z, want_h = 1, 2
    got, _, _ = _score_mod_launches(rt, lib, slopes, 2.5)
    for kernel, args in got.items():
        assert args == {"ALIBI": slopes.data_ptr(), "stride_az": want_z, "stride_ah": want_h,
                        "has_alibi": 1, "softcap": 2.5}, kernel


def test_softcap_alone_and_short_structs(plain_rt):
    """A caller compiled against the params without them (struct_size up to
    debug_mask / delta) gets neither, whatever the bytes after its struct."""
    rt, lib = plain_rt
    got, q, _ = _score_mod_launches(rt, lib, None, 7.0)
    assert all(a == {"ALIBI": q.data_ptr(), "stride_az": 0, "stride_ah": 0, "has_alibi": 0,
                     "softcap": 7.0} for a in got.values())
    lib.aotr_stub_reset()
    old_size = lambda cls: cls.softcap.offset  # noqa: E731
    got, q, _ = _score_mod_launches(rt, lib, torch.rand(4), 7.0, struct_size=old_size)
    assert all(a == {"ALIBI": q.data_ptr(), "stride_az": 0, "stride_ah": 0, "has_alibi": 0,
                     "softcap": 0.0} for a in got.values())
    lib.aotr_stub_reset()
    # Up to the softcap, without the slopes.
    got, _, _ = _score_mod_launches(rt, lib, torch.rand(4), 7.0,
                                 struct_size=lambda cls: cls.alibi_slopes.offset)
    assert all(a["has_alibi"] == 0 and a["softcap"] == 7.0 for a in got.values())


@pytest.mark.parametrize("slopes,softcap,match", [
    (torch.rand(4, dtype=torch.float64), 0.0, "alibi_slopes must be fp32, not an unknown dtype"),
    (torch.rand(4).half(), 0.0, "alibi_slopes must be fp32, not fp16"),
    (torch.rand(3), 0.0, r"alibi_slopes must be \(heads,\) = \(4,\) or \(batch, heads\) = \(2, 4\)"),
    (torch.rand(4, 2), 0.0, r"\(batch, heads\) = \(2, 4\)"),
    (torch.rand(2, 4, 1), 0.0, r"\(heads,\)"),
    (None, -1.0, "softcap=-1: must be finite and >= 0"),
    (None, float("nan"), "softcap=nan"),
])
def test_bad_slopes_and_softcaps_are_refused(plain_rt, slopes, softcap, match):
    import re

    rt, lib = plain_rt
    q = _padded(2, 4, 16, 64)
    k = _padded(2, 2, 16, 64)
    p = native.FwdParams()
    p.problem = native.make_problem(q, k, k, scale=0.5)
    p.out, p.lse = native.tensor_view(_padded(2, 4, 16, 64)), native.tensor_view(torch.empty(2, 4, 16))
    p.alibi_slopes = native.tensor_view(slopes)
    p.softcap = softcap
    assert rt.fwd(p) == native.INVALID_ARGUMENT
    assert re.search(match, native.library().aotr_last_error().decode())
    assert lib.aotr_stub_launch_count() == 0


def test_images_without_softcap_and_alibi_arguments(stub, tmp_path):
    """Kernels of an image built before softcap/ALiBi (no such arguments)
    still run plain requests; softcap or ALiBi requests are refused, not
    silently ignored."""
    stub_path, lib = stub
    new = ("ALIBI", "stride_az", "stride_ah", "has_alibi", "softcap")
    recs = []
    for i, v in enumerate(_variants()):
        r = _record(v, f"k{i}")
        recs.append(dataclasses.replace(r, args=tuple(a for a in r.args if a[0] not in new)))
    archive = tmp_path / "sm_90.aotr"
    write_archive(archive, MANIFEST, [(r, _image(r.symbol)) for r in recs])
    rt = _runtime(stub_path, archive)
    q, out = _padded(1, 2, 16, 64), _padded(1, 2, 16, 64)
    lse = torch.empty(1, 2, 16)
    assert _fwd(rt, q, q, q, out, lse, scale=1.0) == native.OK
    for slopes, cap, what in ((torch.rand(2), 0.0, "ALiBi"), (None, 3.0, "softcap")):
        p = native.FwdParams()
        p.problem = native.make_problem(q, q, q, scale=1.0)
        p.out, p.lse = native.tensor_view(out), native.tensor_view(lse)
        p.alibi_slopes, p.softcap = native.tensor_view(slopes), cap
        assert rt.fwd(p) == native.UNSUPPORTED
        assert f"predates {what}" in native.library().aotr_last_error().decode()
    assert lib.aotr_stub_launch_count() == 1


@pytest.fixture
def fused(stub, tmp_path):
    """An sm_90 archive of the fp16 head-dim-64 unmasked points with the fused
    backward's kernels beside the split ones (their real argument lists)."""
    from pathlib import Path

    from aotriton_rocm.core import kernel_spec
    from aotriton_rocm.tooling.common.targets import load_targets

    stub_path, lib = stub
    sm90 = load_targets(Path(__file__).resolve().parents[2] / "ci" / "targets.toml").resolve(None, ["sm_90"])[1][0]
    spec = kernel_spec.load_variants(kernel_spec.kernels_dir())
    extra = [v for v in spec.variants_for(sm90)
             if v.kernel in backends.FUSED_BACKWARD_KERNELS and v.functional["dtype"] == "fp16"]
    plain = [v for v in _variants() if not v.functional.get("has_bias")]
    recs = [_record(v, f"{v.kernel}#{i}") for i, v in enumerate(plain + extra)]
    archive = tmp_path / "sm_90.aotr"
    write_archive(archive, MANIFEST, [(r, _image(r.symbol)) for r in recs])
    min_seqlen = next(v.config["MIN_SEQLEN"] for v in extra if v.kernel == "attn_bwd_fused")
    return _runtime(stub_path, archive), lib, {r.symbol: r for r in recs}, min_seqlen


@pytest.mark.parametrize("shape", [(2, 4, 2, 3000, 2500, 64), (1, 2, 2, 2049, 5000, 64)])
def test_the_fused_backward_runs_with_an_accumulator(fused, shape):
    rt, lib, recs, min_seqlen = fused
    b, h, hk, sq, sk, d = shape
    q, out, do, dq = (_padded(b, h, sq, d) for _ in range(4))
    k, v, dk, dv = (_padded(b, hk, sk, d) for _ in range(4))
    lse, delta = torch.empty(b, h, sq), torch.empty(b, h, sq)
    acc = torch.zeros(b, h, sq, d)
    problem = native.make_problem(q, k, v, causal=True, scale=0.125)
    need = native.NEED_BACKWARD | native.NEED_DQ_ACCUM
    assert rt.supported(0, problem, need) == native.OK
    p = native.BwdParams()
    p.stream = 0x5000
    p.problem = problem
    for name, t in (("out", out), ("lse", lse), ("grad_out", do), ("grad_q", dq), ("grad_k", dk),
                    ("grad_v", dv), ("delta", delta), ("grad_q_accum", acc)):
        setattr(p, name, native.tensor_view(t))
    lib.aotr_stub_reset()
    assert rt.bwd(p) == native.OK
    got = _launches(lib)
    assert [recs[s].kernel for s, *_ in got] == ["attn_bwd_preprocess", *backends.FUSED_BACKWARD_KERNELS]
    (_, _, _, _, pre_raw), (fsym, fgrid, _, _, fraw), (csym, cgrid, _, _, craw) = got
    assert fgrid == (-(-sk // recs[fsym].config["BLOCK_N"]), b * hk, 1)
    assert cgrid == (-(-sq // recs[csym].config["BLOCK_M"]), b * h, 1)
    fa, ca = _decode(recs[fsym].args, fraw), _decode(recs[csym].args, craw)
    strides = {"stride_dqaz": acc.stride(0), "stride_dqah": acc.stride(1), "stride_dqam": acc.stride(2)}
    assert fa["DQ_ACC"] == ca["DQ_ACC"] == acc.data_ptr() and fa["DK"] == dk.data_ptr()
    assert {n: fa[n] for n in strides} == strides == {n: ca[n] for n in strides}
    assert ca["DQ"] == dq.data_ptr() and ca["sm_scale"] == _f32(0.125)

    # shorter than MIN_SEQLEN, or no accumulator: the split kernels
    lib.aotr_stub_reset()
    p.grad_q_accum = native.Tensor()
    assert rt.bwd(p) == native.OK
    assert [recs[s].kernel for s, *_ in _launches(lib)] == ["attn_bwd_preprocess", "attn_bwd_dkdv", "attn_bwd_dq"]
    short = min_seqlen - 1
    q2, k2, v2 = _padded(1, 1, short, d), _padded(1, 1, short, d), _padded(1, 1, short, d)
    assert rt.supported(0, native.make_problem(q2, k2, v2, scale=0.125), need) == native.UNSUPPORTED


def test_a_malformed_accumulator_is_refused(fused):
    rt, lib, _, min_seqlen = fused
    n = min_seqlen
    q, out, do, dq, k, v, dk, dv = (_padded(1, 2, n, 64) for _ in range(8))
    lse, delta = torch.empty(1, 2, n), torch.empty(1, 2, n)
    p = native.BwdParams()
    p.problem = native.make_problem(q, k, v, scale=0.125)
    for name, t in (("out", out), ("lse", lse), ("grad_out", do), ("grad_q", dq), ("grad_k", dk),
                    ("grad_v", dv), ("delta", delta)):
        setattr(p, name, native.tensor_view(t))
    lib.aotr_stub_reset()
    for bad in (torch.zeros(1, 2, n, 64, dtype=torch.float16), torch.zeros(1, 2, n - 1, 64)):
        p.grad_q_accum = native.tensor_view(bad)
        assert rt.bwd(p) == native.INVALID_ARGUMENT
        assert "grad_q_accum must be an fp32 tensor shaped like q" in str(native.error(native.INVALID_ARGUMENT))
    p.grad_q_accum = native.tensor_view(torch.zeros(1, 2, n, 72)[..., :64])
    assert rt.bwd(p) == native.NEEDS_LAYOUT
    assert lib.aotr_stub_launch_count() == 0
