"""libaotriton_rocm's aotr_dropout_uniform (the draws behind torch's
_fill_mem_eff_dropout_mask_) and the variable-length debug mask, through the
stub driver on a CPU-only machine: a real archive with the kernels' real
argument lists, every launch's grid, block and argument bytes decoded by
name, and the refusals."""

from __future__ import annotations

import ctypes

import pytest

torch = pytest.importorskip("torch")

from aotriton_rocm.core import kernel_spec, native  # noqa: E402
from aotriton_rocm.tooling.builder.archive_writer import write_archive  # noqa: E402

from stub_archive import (MANIFEST, decode, image, launches, record, stub_runtime,  # noqa: E402
                          variants)


def _uniform_variant():
    spec = kernel_spec.load_variants(kernel_spec.kernels_dir())
    return next(v for v in spec.variants_for(kernel_spec.INTERPRETER_ARCH)
                if v.kernel == "dropout_uniform")


def _runtime(stub_path, tmp_path, recs):
    archive = tmp_path / "sm_90.aotr"
    write_archive(archive, MANIFEST, [(r, image(r.symbol)) for r in recs])
    return stub_runtime(stub_path, archive)


def _params(out, seed, offset, p=0.25, encode=0):
    params = native.DropoutUniformParams()
    params.stream = 0x7000
    params.out = native.tensor_view(out)
    params.philox_seed = native.tensor_view(seed)
    params.philox_offset = native.tensor_view(offset)
    params.dropout_p = p
    params.encode_keep = encode
    return params


def _last_error() -> str:
    return native.library().aotr_last_error().decode()


@pytest.mark.parametrize("shape", [(2, 3, 70, 90), (1, 70000, 5, 33)])
@pytest.mark.parametrize("encode", [0, 1])
def test_dropout_uniform_arguments_by_name(stub, tmp_path, shape, encode):
    stub_path, lib = stub
    rec = record(_uniform_variant(), "dropout_uniform#0")
    rt = _runtime(stub_path, tmp_path, [rec])
    out = torch.empty(shape)
    seed, offset = torch.tensor(5), torch.tensor(7)
    assert rt.dropout_uniform(_params(out, seed, offset, encode=encode)) == native.OK
    (sym, grid, block, stream, raw), = launches(lib)
    b, h, sq, sk = shape
    assert sym == "dropout_uniform#0" and stream == 0x7000 and block == rec.num_warps * 32
    programs = b * h
    y = min(programs, 65535)
    assert grid == (-(-sq // rec.config["BLOCK_M"]), y, -(-programs // y))
    assert decode(rec.args, raw) == {
        "R": out.data_ptr(), "RNG_SEED": seed.data_ptr(), "RNG_OFFSET": offset.data_ptr(),
        "batch": b, "num_heads": h, "max_seqlen_q": sq, "max_seqlen_k": sk, "dropout_p": 0.25,
        "encode_keep": encode, "global_scratch": 0, "profile_scratch": 0}
    assert rt.launch_count("dropout_uniform") == 1 and rt.launch_count("attn_fwd") == 0


def test_dropout_uniform_refusals(stub, tmp_path):
    stub_path, lib = stub
    rt = _runtime(stub_path, tmp_path, [record(_uniform_variant(), "u")])
    seed, offset = torch.tensor(5), torch.tensor(7)
    out = torch.empty(2, 3, 16, 32)
    assert rt.dropout_uniform(_params(out.transpose(2, 3), seed, offset)) == native.NEEDS_LAYOUT
    assert "contiguous" in _last_error()
    assert rt.dropout_uniform(_params(out.half(), seed, offset)) == native.INVALID_ARGUMENT
    assert "fp32" in _last_error()
    assert rt.dropout_uniform(_params(out[0], seed, offset)) == native.INVALID_ARGUMENT
    assert rt.dropout_uniform(_params(out, seed.int(), offset)) == native.INVALID_ARGUMENT
    assert "philox_seed" in _last_error()
    assert rt.dropout_uniform(_params(out, seed, None)) == native.INVALID_ARGUMENT
    assert rt.dropout_uniform(_params(out, seed, offset, encode=2)) == native.INVALID_ARGUMENT
    assert rt.dropout_uniform(_params(out, seed, offset, p=1.5)) == native.INVALID_ARGUMENT
    odd = torch.empty(2 * 3 * 16 * 32 + 1)[1:].view(2, 3, 16, 32)  # 4-byte aligned base
    assert rt.dropout_uniform(_params(odd, seed, offset)) == native.NEEDS_LAYOUT
    assert rt.dropout_uniform(_params(torch.empty(2, 0, 16, 32), seed, offset)) == native.OK
    assert lib.aotr_stub_launch_count() == 0
    # An image without the kernel (an older build): unsupported, with the reason.
    old_dir = tmp_path / "old"
    old_dir.mkdir()
    older = _runtime(stub_path, old_dir, [record(v, f"a{i}") for i, v in enumerate(variants())])
    assert older.dropout_uniform(_params(out, seed, offset)) == native.UNSUPPORTED
    assert "no dropout_uniform kernel" in _last_error()
    params = _params(out, seed, offset)
    params.struct_size = 8
    assert native.library().aotr_dropout_uniform(rt.handle, ctypes.byref(params)) == \
        native.INVALID_ARGUMENT


def test_variable_length_debug_mask(stub, tmp_path):
    # The forward writes a (batch, heads, max_seqlen_q, max_seqlen_k) debug
    # mask for a packed batch too (sequence b at the top left of [b]).
    stub_path, lib = stub
    recs = [record(v, f"{v.kernel}#{i}") for i, v in enumerate(variants(dropout=(True,)))]
    rt = _runtime(stub_path, tmp_path, recs)
    h, d, max_q, max_k = 2, 64, 9, 12
    cu_q = torch.tensor([0, 5, 9, 9], dtype=torch.int32)
    cu_k = torch.tensor([0, 12, 15, 20], dtype=torch.int32)
    q, out = (torch.empty(9, h, d, dtype=torch.float16) for _ in range(2))
    k = torch.empty(20, h, d, dtype=torch.float16)
    lse = torch.empty(h, 9)
    seed, offset = torch.tensor(1), torch.tensor(2)
    dmask = torch.zeros(3, h, max_q, max_k, dtype=torch.float16)
    params = native.FwdParams()
    params.problem = native.make_problem(q, k, k, scale=0.125, dropout_p=0.2, rng=(seed, offset),
                                         cu_seqlens=(cu_q, cu_k), max_seqlens=(max_q, max_k))
    params.out, params.lse = native.tensor_view(out), native.tensor_view(lse)
    params.debug_mask = native.tensor_view(dmask)
    assert rt.fwd(params) == native.OK, _last_error()
    (sym, _, _, _, raw), = launches(lib)
    by_symbol = {r.symbol: r for r in recs}
    got = decode(by_symbol[sym].args, raw)
    assert (got["DMASK"], got["store_dmask"], got["varlen"]) == (dmask.data_ptr(), 1, 1)
    assert (got["max_seqlen_q"], got["max_seqlen_k"], got["batch"]) == (max_q, max_k, 3)
    # A mask of another shape (the packed rows, say) is refused.
    params.debug_mask = native.tensor_view(torch.zeros(3, h, 9, 20, dtype=torch.float16))
    assert rt.fwd(params) == native.INVALID_ARGUMENT
    assert "debug_mask" in _last_error()
