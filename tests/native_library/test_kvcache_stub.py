"""libaotriton_rocm's KV-cache entry points (aotr_attn_fwd_kvcache,
aotr_attn_fwd_kvcache_splits) end to end on a CPU-only machine: a real
archive of the KV-cache kernels' real argument lists, the stub driver
recording every launch, and every argument value checked by name against
what the tensors say; grids, the automatic split count (from the stub
device's compute units), the refusals, and the Python route
(flash_attn_with_kvcache on an AOT backend) handing the launch to the
library."""

from __future__ import annotations

import ctypes
import struct

import pytest

torch = pytest.importorskip("torch")

import aotriton_rocm  # noqa: E402
from aotriton_rocm.core import backends, kvcache, native  # noqa: E402
from aotriton_rocm.common import images  # noqa: E402
from aotriton_rocm.tooling.builder.archive_writer import write_archive  # noqa: E402

from stub_archive import (MANIFEST, decode, image, launches, record, stub_runtime,  # noqa: E402
                          variants)

KERNELS = ("attn_fwd_kvcache", "attn_fwd_kvcache_combine")


@pytest.fixture
def setup(stub, tmp_path):
    stub_path, lib = stub
    recs = [record(v, f"{v.kernel}#{i}") for i, v in enumerate(variants(head_dims=(64, 128)))
            if v.kernel in KERNELS]
    assert {r.kernel for r in recs} == set(KERNELS)
    archive = tmp_path / "sm_90.aotr"
    write_archive(archive, MANIFEST, [(r, image(r.symbol)) for r in recs])
    return stub_runtime(stub_path, archive), lib, {r.symbol: r for r in recs}, archive


def _f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def _t(*shape, dtype=torch.float16):
    return torch.empty(*shape, dtype=dtype)


def _params(q, kc, vc, out, lse, k_end, **kw):
    p = native.KvcacheParams()
    p.stream = 0x5000
    for name, t in dict(q=q, k_cache=kc, v_cache=vc, out=out, lse=lse, k_end=k_end).items():
        setattr(p, name, native.tensor_view(t))
    for name in ("k_start", "cache_batch_idx", "block_table", "alibi_slopes", "cu_seqlens_q",
                 "out_partial", "lse_partial"):
        if kw.get(name) is not None:
            setattr(p, name, native.tensor_view(kw[name]))
    p.max_seqlen_q = kw.get("max_seqlen_q", 0)
    p.scale = kw.get("scale", 0.125)
    p.softcap = kw.get("softcap", 0.0)
    p.causal = int(kw.get("causal", False))
    p.window_left, p.window_right = kw.get("window", (-1, -1))
    p.num_splits = kw.get("num_splits", 1)
    return p


def _expected_splits(batch, heads_k, rows, seqlen_k, block_m, block_n, compute_units):
    """The split rule of aotr_attn_fwd_kvcache_splits, written out: 1 unless
    the (batch, key/value head, row block) programs leave most compute units
    idle (fewer than 4/5 of them); then about two programs per compute unit,
    each split keeping at least 4 key blocks, at most 128."""
    programs = batch * heads_k * -(-rows // block_m)
    if compute_units <= 0 or programs == 0 or programs * 5 >= compute_units * 4:
        return 1
    return max(1, min(-(-2 * compute_units // programs), -(-seqlen_k // block_n) // 4, 128))


def _last_error():
    return native.library().aotr_last_error().decode()


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("splits", [1, 3])
def test_arguments_by_name(setup, paged, splits):
    rt, lib, records, _ = setup
    b, sq, h, hk, d = 3, 2, 8, 2, 64
    q, out = _t(b, sq, h, d), _t(b, sq, h, d)
    if paged:
        kc, vc = _t(20, 32, hk, d), _t(20, 32, hk, d)
        extra = dict(block_table=torch.zeros(b, 7, dtype=torch.int32))
    else:
        kc, vc = _t(5, 300, hk, d), _t(5, 300, hk, d)
        extra = dict(cache_batch_idx=torch.zeros(b, dtype=torch.int32))
    lse = torch.empty(b, h, sq)
    k_end, k_start = torch.zeros(b, dtype=torch.int32), torch.zeros(b, dtype=torch.int32)
    alibi = torch.empty(b, h)
    o_shape, l_shape = backends.kvcache_workspace_shapes(b, h, splits, sq, d)
    o_part, l_part = torch.empty(o_shape), torch.empty(l_shape)
    p = _params(q, kc, vc, out, lse, k_end, k_start=k_start, alibi_slopes=alibi, scale=0.3,
                softcap=7.5, causal=True, window=(10**9, 5), num_splits=splits,
                out_partial=o_part, lse_partial=l_part, **extra)
    assert rt.kvcache_splits(p) == splits
    assert rt.fwd_kvcache(p) == native.OK, _last_error()
    got = launches(lib)
    kernels = [records[s].kernel for s, *_ in got]
    assert kernels == (["attn_fwd_kvcache"] if splits == 1 else list(KERNELS))
    assert rt.launch_count("attn_fwd_kvcache") == 1
    spare = q.data_ptr()
    common = {"O": out.data_ptr(), "LSE": lse.data_ptr(), "CU_Q": spare,
              "stride_oz": out.stride(0), "stride_oh": out.stride(2), "stride_om": out.stride(1),
              "stride_lz": lse.stride(0), "stride_lh": lse.stride(1), "batch": b, "num_heads": h,
              "max_seqlen_q": sq, "varlen": 0, "head_dim": d, "num_splits": splits,
              "O_PART": o_part.data_ptr() if splits > 1 else spare,
              "LSE_PART": l_part.data_ptr() if splits > 1 else spare,
              "global_scratch": 0, "profile_scratch": 0}
    main = {"Q": q.data_ptr(), "K": kc.data_ptr(), "V": vc.data_ptr(),
            "K_START": k_start.data_ptr(), "K_END": k_end.data_ptr(),
            "CACHE_BATCH_IDX": spare if paged else extra["cache_batch_idx"].data_ptr(),
            "BLOCK_TABLE": extra["block_table"].data_ptr() if paged else spare,
            "ALIBI": alibi.data_ptr(),
            "stride_qz": q.stride(0), "stride_qh": q.stride(2), "stride_qm": q.stride(1),
            "stride_kz": kc.stride(0), "stride_kh": kc.stride(2), "stride_kn": kc.stride(1),
            "stride_vz": vc.stride(0), "stride_vh": vc.stride(2), "stride_vn": vc.stride(1),
            "stride_btz": extra["block_table"].stride(0) if paged else 0,
            "stride_az": alibi.stride(0), "gqa_group": h // hk, "paged": int(paged),
            "page_size": 32 if paged else 1, "has_batch_idx": int(not paged), "has_k_start": 1,
            "has_alibi": 1,
            # causal: right = 0; a huge left clamped to seqlen_q + capacity (int32)
            "window_left": -1, "window_right": 0,  # 10**9 >= the capacity: unbounded
            "sm_scale": _f32(0.3), "softcap": _f32(7.5)}
    for sym, grid, block, stream, raw in got:
        rec = records[sym]
        values = decode(rec.args, raw)
        want = {n: x for n, x in {**common, **main}.items() if n in values}
        assert set(values) == set(want), (rec.kernel, set(values) ^ set(want))
        assert values == want, rec.kernel
        if rec.kernel == "attn_fwd_kvcache":
            rows = sq * (h // hk)
            assert grid == (-(-rows // rec.config["BLOCK_M"]) * splits, b * hk, 1)
        else:
            assert grid == (-(-sq // rec.config["BLOCK_M"]), b * h, 1)
        assert block == rec.num_warps * 32 and stream == 0x5000


def test_packed_queries_and_batch_over_the_grid_y_limit(setup):
    rt, lib, records, _ = setup
    b, h, d, total = 70000, 1, 64, 70003
    q, out = _t(total, h, d), _t(total, h, d)
    cu = torch.zeros(b + 1, dtype=torch.int32)
    kc = _t(b, 16, 1, d)
    lse = torch.empty(h, total)
    p = _params(q, kc, kc, out, lse, torch.zeros(b, dtype=torch.int32), cu_seqlens_q=cu,
                max_seqlen_q=3, num_splits=1)
    assert rt.fwd_kvcache(p) == native.OK, _last_error()
    (sym, grid, _, _, raw), = launches(lib)
    values = decode(records[sym].args, raw)
    assert values["varlen"] == 1 and values["CU_Q"] == cu.data_ptr()
    assert (values["stride_qz"], values["stride_qh"], values["stride_qm"]) == (0, d, h * d)
    assert (values["stride_lz"], values["stride_lh"]) == (0, total)
    assert grid == (1, 65535, 2)


@pytest.mark.parametrize("b, hk, g, sq, cus", [(1, 8, 4, 1, 132), (8, 8, 4, 1, 132),
                                               (64, 8, 4, 1, 132), (1, 2, 1, 1, 304),
                                               (2, 8, 4, 64, 132), (14, 8, 1, 1, 132),
                                               (10, 8, 1, 1, 132)])
def test_automatic_splits(stub, setup, monkeypatch, b, hk, g, sq, cus):
    rt, lib, records, archive = setup
    monkeypatch.setenv("AOTR_STUB_COMPUTE_UNITS", str(cus))
    rt = stub_runtime(stub[0], archive)
    h, d, cap = hk * g, 128, 8192
    q = _t(b, sq, h, d)
    p = _params(q, _t(b, cap, hk, d), _t(b, cap, hk, d), _t(b, sq, h, d), torch.empty(b, h, sq),
                torch.zeros(b, dtype=torch.int32), num_splits=0)
    n = rt.kvcache_splits(p)
    main = next(r for r in records.values() if r.kernel == "attn_fwd_kvcache"
                and r.functional["head_dim"] == 128)
    assert n == _expected_splits(b, hk, sq * g, cap, main.config["BLOCK_M"],
                                 main.config["BLOCK_N"], cus)
    assert (n > 1) == (b * hk * -(-sq * g // main.config["BLOCK_M"]) * 5 < cus * 4)
    if n > 1:  # the launch wants the workspace of that many splits
        assert rt.fwd_kvcache(p) == native.INVALID_ARGUMENT
        assert "out_partial" in _last_error()
        o_shape, l_shape = backends.kvcache_workspace_shapes(b, h, n, sq, d)
        p.out_partial = native.tensor_view(torch.empty(o_shape))
        p.lse_partial = native.tensor_view(torch.empty(l_shape))
        p.num_splits = 0
        assert rt.fwd_kvcache(p) == native.OK, _last_error()
        assert [records[s].kernel for s, *_ in launches(lib)] == list(KERNELS)


def test_refusals(setup):
    rt, lib, records, _ = setup
    b, h, d = 2, 4, 64
    q, out, lse, k_end = _t(b, 1, h, d), _t(b, 1, h, d), torch.empty(b, h, 1), torch.zeros(b, dtype=torch.int32)
    kc = _t(4, 48, 2, d)

    def status(**kw):
        args = dict(q=q, kc=kc, vc=kc, out=out, lse=lse, k_end=k_end)
        args.update({k: kw.pop(k) for k in list(kw) if k in args})
        return rt.fwd_kvcache(_params(args["q"], args["kc"], args["vc"], args["out"], args["lse"],
                                      args["k_end"], **kw))

    bt = torch.zeros(b, 3, dtype=torch.int32)
    assert status(kc=_t(4, 40, 2, d), vc=_t(4, 40, 2, d), block_table=bt) == native.UNSUPPORTED
    assert "multiple of 16" in _last_error()
    assert status(block_table=bt, cache_batch_idx=k_end) == native.UNSUPPORTED
    assert "cache_batch_idx cannot be used" in _last_error()
    assert status(k_end=torch.zeros(b, dtype=torch.int64)) == native.UNSUPPORTED
    assert "k_end" in _last_error()
    assert status(q=_t(b, 1, 3, d), out=_t(b, 1, 3, d), lse=torch.empty(b, 3, 1)) == native.UNSUPPORTED
    assert "multiple of key/value heads" in _last_error()
    q32 = _t(b, 1, h, 32)
    assert status(q=q32, out=_t(b, 1, h, 32), kc=_t(4, 48, 2, 32), vc=_t(4, 48, 2, 32)) == native.UNSUPPORTED
    assert "no attn_fwd_kvcache kernel for dtype=fp16, head_dim=32" in _last_error()
    assert status(q=_t(b, 1, h, 264), out=_t(b, 1, h, 264), kc=_t(4, 48, 2, 264),
                  vc=_t(4, 48, 2, 264)) == native.UNSUPPORTED
    assert "head_dim 264" in _last_error()
    odd = _t(b, 1, h, 72)[..., :d]
    assert status(q=odd) == native.NEEDS_LAYOUT
    assert status(num_splits=3) == native.INVALID_ARGUMENT and "out_partial" in _last_error()
    assert status(num_splits=1000) == native.INVALID_ARGUMENT
    assert status(alibi_slopes=torch.empty(h + 1)) == native.UNSUPPORTED
    assert status(softcap=-1.0) == native.UNSUPPORTED
    p = _params(q, kc, kc, out, lse, k_end)
    p.struct_size = 8
    assert native.library().aotr_attn_fwd_kvcache(rt.handle, ctypes.byref(p)) == native.INVALID_ARGUMENT
    assert "struct_size" in _last_error()
    assert lib.aotr_stub_launch_count() == 0 and rt.launch_count() == 0


def test_a_one_row_lse_takes_any_last_stride(setup):
    """As in the attention entry points (one lse layout rule): the lse's last
    stride is free where that dim has one row (seqlen_q = 1), not elsewhere."""
    rt, lib, records, _ = setup
    b, h, d = 2, 4, 64
    q, out, k_end = _t(b, 1, h, d), _t(b, 1, h, d), torch.zeros(b, dtype=torch.int32)
    kc = _t(4, 48, 2, d)
    lse = torch.empty(b * h * 4).as_strided((b, h, 1), (h * 4, 4, 4))
    assert rt.fwd_kvcache(_params(q, kc, kc, out, lse, k_end)) == native.OK, _last_error()
    (sym, _, _, _, raw), = launches(lib)
    values = decode(records[sym].args, raw)
    assert (values["stride_lz"], values["stride_lh"]) == (h * 4, 4)
    q2, out2 = _t(b, 2, h, d), _t(b, 2, h, d)
    lse2 = torch.empty(b * h * 4).as_strided((b, h, 2), (h * 4, 4, 2))
    assert rt.fwd_kvcache(_params(q2, kc, kc, out2, lse2, k_end)) == native.NEEDS_LAYOUT
    assert "lse needs a unit last stride" in _last_error()


def test_the_python_gpu_route_is_the_native_one(stub, setup, monkeypatch):
    """flash_attn_with_kvcache on an AOT backend: the append runs as torch
    ops, the attention in libaotriton_rocm (its automatic split count, the
    workspace allocated by the Python side)."""
    stub_path, lib = stub
    rt, _, records, archive = setup
    monkeypatch.setattr(backends, "arch_of", lambda i: "sm_90")
    monkeypatch.setattr(images, "find_archives", lambda refresh=False: {"sm_90": archive})
    monkeypatch.setattr(backends, "_native_runtime", lambda: rt)
    monkeypatch.setattr(backends, "_added_archives", {str(archive)})
    monkeypatch.setattr(backends.AOTBackend, "_stream", lambda self: 0x77)
    aot = backends.AOTBackend(0)
    monkeypatch.setattr(kvcache, "backend_for", lambda t: aot)
    # the archive has no head dim 32: the library refuses the call, before the append
    q32, kc32 = torch.zeros(1, 1, 2, 32).half(), torch.zeros(1, 64, 2, 32).half()
    with pytest.raises(ValueError, match="head_dim=32"):
        aotriton_rocm.flash_attn_with_kvcache(q32, kc32, kc32.clone(), torch.ones(1, 1, 2, 32).half(),
                                              torch.ones(1, 1, 2, 32).half(), cache_seqlens=3)
    assert not kc32.any() and launches(lib) == []
    b, h, hk, d = 1, 8, 2, 128
    q = torch.randn(b, 1, h, d).half()
    kc, vc = torch.zeros(b, 8192, hk, d).half(), torch.zeros(b, 8192, hk, d).half()
    k_new = torch.ones(b, 1, hk, d).half()
    out = aotriton_rocm.flash_attn_with_kvcache(q, kc, vc, k_new, k_new, cache_seqlens=100)
    assert out.shape == q.shape
    assert torch.equal(kc[0, 100], k_new[0, 0]) and torch.equal(vc[0, 100], k_new[0, 0])
    got = launches(lib)
    assert [records[s].kernel for s, *_ in got] == list(KERNELS)
    values = decode(records[got[0][0]].args, got[0][4])
    main = next(r for r in records.values() if r.kernel == "attn_fwd_kvcache"
                and r.functional["head_dim"] == d)
    assert values["num_splits"] == _expected_splits(
        b, hk, h // hk, 8192, main.config["BLOCK_M"], main.config["BLOCK_N"], 132) > 1
    assert values["Q"] == q.data_ptr() and values["K"] == kc.data_ptr()
    assert all(stream == 0x77 for *_, stream, _ in got)
