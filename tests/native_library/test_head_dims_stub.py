"""libaotriton_rocm at head dims that are not multiples of 8, on the stub
driver (device addresses are host addresses, copies and memsets run at
once, launches are recorded): the call runs at the next multiple of 8 on
zero-padded copies in stream-ordered memory. Checked: the kernels' head_dim
and strides, the copies' contents as the launches saw them (the stub keeps
freed blocks readable with AOTR_STUB_KEEP_SCRATCH=1), outputs copied back at
the real head dim only, every block freed, the number of 2D copies for
dense and strided layouts; the KV cache; and the refusals."""

from __future__ import annotations

import ctypes
import dataclasses
import struct

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from aotriton_rocm.core import native  # noqa: E402
from aotriton_rocm.tooling.builder.archive_writer import write_archive  # noqa: E402

from stub_archive import MANIFEST, decode, image, launches, record, stub_runtime, variants  # noqa: E402

ELEMENT = {torch.float16: ctypes.c_uint16, torch.float32: ctypes.c_float}


@pytest.fixture
def setup(stub, tmp_path, monkeypatch):
    stub_path, lib = stub
    monkeypatch.setenv("AOTR_STUB_KEEP_SCRATCH", "1")
    recs = [record(v, f"{v.kernel}#{i}") for i, v in enumerate(variants(head_dims=(16, 64)))]
    archive = tmp_path / "sm_90.aotr"
    write_archive(archive, MANIFEST, [(r, image(r.symbol)) for r in recs])
    return stub_runtime(stub_path, archive), lib, {r.symbol: r for r in recs}


def _read(ptr, sizes, strides, dtype=torch.float16):
    """The tensor a launch was given: `sizes` / `strides` at host address `ptr`."""
    extent = 1 + sum((n - 1) * s for n, s in zip(sizes, strides))
    raw = (ELEMENT[dtype] * extent).from_address(ptr)
    flat = torch.frombuffer(bytearray(raw), dtype=dtype)
    return flat.as_strided(sizes, strides).clone()


def _launched(lib, records):
    return [(records[s], decode(records[s].args, raw)) for s, _, _, _, raw in launches(lib)]


def _fwd(rt, q, k, v, out, lse, scale=0.3):
    p = native.FwdParams()
    p.stream = 0x5000
    p.problem = native.make_problem(q, k, v, scale=scale)
    p.out, p.lse = native.tensor_view(out), native.tensor_view(lse)
    return rt.fwd(p)


def _staged(args, prefix, sizes, row="m"):
    return _read(args[prefix.upper()], sizes, (args[f"stride_{prefix}z"], args[f"stride_{prefix}h"],
                                               args[f"stride_{prefix}{row}"], 1))


def _padded(t, width):
    return F.pad(t, (0, width - t.shape[-1]))


@pytest.mark.parametrize("layout", ["bhsd", "bshd", "heads_sliced"])
def test_forward_runs_at_the_next_multiple_of_8_on_zero_padded_copies(setup, layout):
    rt, lib, records = setup
    b, h, sq, sk, d = 2, 3, 5, 7, 59
    gen = torch.Generator().manual_seed(0)

    def make(s):
        if layout == "bshd":  # flash-attn's layout, viewed (B, H, S, D)
            return torch.randn(b, s, h, d, generator=gen).half().transpose(1, 2)
        if layout == "heads_sliced":  # rows that do not collapse into one run
            return torch.randn(b, 2 * h, s, d, generator=gen).half()[:, ::2]
        return torch.randn(b, h, s, d, generator=gen).half()

    q, k, v = make(sq), make(sk), make(sk)
    out_buf = torch.full((b, h, sq, 64), 7.0, dtype=torch.float16)
    out = out_buf[..., :d]
    out[...] = 5.0
    lse = torch.empty(b, h, sq)
    assert _fwd(rt, q, k, v, out, lse) == native.OK
    (rec, args), = _launched(lib, records)
    assert rec.kernel == "attn_fwd" and args["head_dim"] == 64
    assert args["sm_scale"] == struct.unpack("<f", struct.pack("<f", 0.3))[0]
    assert all(args[f"stride_{t}{r}"] % 16 == 0 for t in "qkvo" for r in "zh") and \
        args["Q"] != q.data_ptr() and args["O"] != out.data_ptr()
    assert torch.equal(_staged(args, "q", (b, h, sq, 64)), _padded(q, 64))
    assert torch.equal(_staged(args, "k", (b, h, sk, 64), "n"), _padded(k, 64))
    assert torch.equal(_staged(args, "v", (b, h, sk, 64), "n"), _padded(v, 64))
    # nothing ran: the zeroed copy of out came back, at the real head dim only
    assert (out == 0).all() and (out_buf[..., d:] == 7).all()
    assert lib.aotr_stub_scratch(None, None) == 0  # every block freed
    copies = lib.aotr_stub_calls(b"cuMemcpy2DAsync_v2")
    assert copies == (4 if layout != "heads_sliced" else 3 * b * h + 1)


def test_backward_stages_every_tensor_and_skips_the_fused_kernels(setup):
    rt, lib, records = setup
    b, h, s, d = 1, 2, 9, 3
    gen = torch.Generator().manual_seed(1)
    q, k, v, out, do = (torch.randn(b, h, s, d, generator=gen).half() for _ in range(5))
    grads = [torch.full((b, h, s, d), 5.0, dtype=torch.float16) for _ in range(3)]
    lse, delta = torch.zeros(b, h, s), torch.empty(b, h, s)
    p = native.BwdParams()
    p.stream = 0x5000
    p.problem = native.make_problem(q, k, v, scale=0.5)
    for name, t in (("out", out), ("lse", lse), ("grad_out", do), ("grad_q", grads[0]),
                    ("grad_k", grads[1]), ("grad_v", grads[2]), ("delta", delta),
                    ("grad_q_accum", torch.zeros(b, h, s, d))):
        setattr(p, name, native.tensor_view(t))
    problem = native.make_problem(q, k, v, scale=0.5)
    assert rt.supported(0, problem, native.NEED_BACKWARD) == native.OK
    assert rt.supported(0, problem, native.NEED_BACKWARD | native.NEED_DQ_ACCUM) == \
        native.UNSUPPORTED
    assert rt.bwd(p) == native.OK
    got = _launched(lib, records)
    assert [r.kernel for r, _ in got] == ["attn_bwd_preprocess", "attn_bwd_dkdv", "attn_bwd_dq"]
    assert all(a["head_dim"] == 8 for _, a in got)
    for rec, args in got:
        if rec.kernel == "attn_bwd_preprocess":
            assert torch.equal(_staged(args, "o", (b, h, s, 8)), _padded(out, 8))
            assert torch.equal(_staged(args, "do", (b, h, s, 8)), _padded(do, 8))
        if rec.kernel == "attn_bwd_dq":
            assert torch.equal(_staged(args, "q", (b, h, s, 8)), _padded(q, 8))
            assert args["DQ"] != grads[0].data_ptr()
    assert all((g == 0).all() for g in grads)  # the zeroed copies came back
    assert lib.aotr_stub_scratch(None, None) == 0


def test_refusals(setup):
    rt, lib, records = setup
    for d in (513, 0):
        q = torch.zeros(1, 1, 4, d, dtype=torch.float16)
        assert _fwd(rt, q, q, q, torch.zeros_like(q), torch.empty(1, 1, 4)) == native.UNSUPPORTED
        assert f"head_dim {d} is not covered (1 to 512 are)" in \
            native.library().aotr_last_error().decode()
    q = torch.zeros(1, 1, 4, 59, dtype=torch.float16)
    assert _fwd(rt, q, q, q, torch.zeros(1, 1, 4, 60, dtype=torch.float16)[..., :58],
                torch.empty(1, 1, 4)) == native.INVALID_ARGUMENT
    q4 = torch.zeros(1, 1, 59, 4, dtype=torch.float16).transpose(2, 3)  # no 2D copy reads it
    assert q4.shape == q.shape and q4.stride(-1) == 4
    assert _fwd(rt, q4, q, q, torch.zeros_like(q), torch.empty(1, 1, 4)) == native.NEEDS_LAYOUT
    assert lib.aotr_stub_launch_count() == 0 and lib.aotr_stub_scratch(None, None) == 0


@pytest.mark.parametrize("splits", [1, 3])
def test_kvcache_runs_on_padded_copies_of_q_and_the_caches(setup, splits):
    rt, lib, records = setup
    b, sq, h, hk, d, cap = 2, 3, 4, 2, 59, 40
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(b, sq, h, d, generator=gen).half()
    kc, vc = (torch.randn(b, cap, hk, d, generator=gen).half() for _ in range(2))
    out = torch.full((b, sq, h, d), 5.0, dtype=torch.float16)
    lse = torch.empty(b, h, sq)
    p = native.KvcacheParams()
    p.stream = 0x5000
    for name, t in dict(q=q, k_cache=kc, v_cache=vc, out=out, lse=lse,
                        k_end=torch.tensor([10, 40], dtype=torch.int32)).items():
        setattr(p, name, native.tensor_view(t))
    p.scale, p.num_splits = 0.125, splits
    p.window_left = p.window_right = -1
    if splits > 1:  # the caller's workspace, at the real head dim (not used)
        p.out_partial = native.tensor_view(torch.empty(b * h, splits, sq, d))
        p.lse_partial = native.tensor_view(torch.empty(b * h, splits, sq))
    assert rt.kvcache_splits(p) == splits
    assert rt.fwd_kvcache(p) == native.OK, native.library().aotr_last_error()
    got = _launched(lib, records)
    assert [r.kernel for r, _ in got] == ["attn_fwd_kvcache", "attn_fwd_kvcache_combine"][:1 + (splits > 1)]
    args = got[0][1]
    assert args["head_dim"] == 64
    bshd = (args["stride_qz"], args["stride_qm"], args["stride_qh"], 1)
    assert torch.equal(_read(args["Q"], (b, sq, h, 64), bshd), _padded(q, 64))
    cache = (args["stride_kz"], args["stride_kn"], args["stride_kh"], 1)
    assert torch.equal(_read(args["K"], (b, cap, hk, 64), cache), _padded(kc, 64))
    if splits > 1:
        assert args["O_PART"] != p.out_partial.data
    assert (out == 0).all() and lib.aotr_stub_scratch(None, None) == 0


def test_hip_path_stages_with_the_hip_runtime(stub, tmp_path, monkeypatch):
    """HIP: hipMallocAsync, hipMemsetAsync, hipMemcpy2DAsync, hipFreeAsync."""
    stub_path, lib = stub
    monkeypatch.setenv("AOTR_STUB_KEEP_SCRATCH", "1")
    recs = [dataclasses.replace(record(v, f"{v.kernel}#{i}"), warp_size=64)
            for i, v in enumerate(variants(head_dims=(64,))) if v.kernel == "attn_fwd"]
    archive = tmp_path / "gfx942.aotr"
    write_archive(archive, {**MANIFEST, "arch": "gfx942", "backend": "hip", "warp_size": 64},
                  [(r, image(r.symbol)) for r in recs])
    rt = native.Runtime(driver_library=str(stub_path), backend=native.BACKEND_HIP)
    rt.add_archive(archive)
    q = torch.randn(1, 2, 33, 50, generator=torch.Generator().manual_seed(3)).half()
    out = torch.full_like(q, 5.0)
    assert _fwd(rt, q, q, q, out, torch.empty(1, 2, 33)) == native.OK
    (rec, args), = _launched(lib, {r.symbol: r for r in recs})
    assert args["head_dim"] == 56
    assert torch.equal(_staged(args, "q", (1, 2, 33, 56)), _padded(q, 56))
    assert (out == 0).all() and lib.aotr_stub_scratch(None, None) == 0
    assert [lib.aotr_stub_calls(f.encode()) for f in
            ("hipMallocAsync", "hipMemsetAsync", "hipMemcpy2DAsync", "hipFreeAsync")] == [1, 1, 4, 1]
