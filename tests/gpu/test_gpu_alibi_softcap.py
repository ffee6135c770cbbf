"""flash-attn's softcap and ALiBi on a real GPU (the H100 via the sm_90
target): flash_attn_func, flash_attn_varlen_func, the packed variants and
torch's ``_flash_attention_forward(..., alibi_slopes=)`` with our
implementation enabled, forward and backward, fp16/bf16, head dims 64/128/256,
causal and not, against the float32 math reference (explicit tanh and ALiBi
bias), with PyTorch's tolerance model. Skipped without a GPU or an installed
image for its arch."""

from __future__ import annotations

import pytest
import torch

import aotriton_rocm
from support import attn_reference as ref
from aotriton_rocm.core import backends
from support.gpu import ours as _ours  # noqa: E402

pytestmark = pytest.mark.gpu


F16, BF16 = torch.float16, torch.bfloat16


@pytest.fixture(autouse=True)
def counts():
    backends.reset_launch_counts()


def _rand(*shape, dtype=F16, seed=0, scale=1.5):
    gen = torch.Generator("cuda").manual_seed(seed)
    return (torch.randn(*shape, device="cuda", generator=gen) * scale).to(dtype)


def _slopes(form, b, h, seed=0):
    if form is None:
        return None
    gen = torch.Generator("cuda").manual_seed(seed + 99)
    shape = (h,) if form == "h" else (b, h)
    return torch.rand(shape, device="cuda", generator=gen) * 0.5 + 0.02


def _judge(got, q, k, v, g, **kw):
    """``got`` in (B, H, S, D) against the float32 reference on (B, H, S, D)."""
    golden = ref.attention(q, k, v, g, dtype=ref.golden_dtype(q.dtype), **kw)
    lp = ref.attention(q, k, v, g, dtype=q.dtype, **kw)
    for name, value in got.items():
        ref.check(name, value, golden[name], lp[name], q.dtype)


def _t(x):
    return x.transpose(1, 2)


def _flash_attn_func(q, k, v, g, **kw):
    """flash_attn_func on (B, S, H, D) views; results in (B, H, S, D)."""
    qs, ks, vs = (_t(x).detach().requires_grad_(True) for x in (q, k, v))
    out, lse, _ = aotriton_rocm.flash_attn_func(qs, ks, vs, return_attn_probs=True, **kw)
    out.backward(_t(g))
    return {"out": _t(out.detach()), "lse": lse, "dq": _t(qs.grad), "dk": _t(ks.grad),
            "dv": _t(vs.grad)}


@pytest.mark.parametrize("dtype", [F16, BF16])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("cap,form", [(30.0, None), (0.0, "h"), (0.0, "bh"), (5.0, "bh")])
def test_flash_attn_func(dtype, d, causal, cap, form):
    b, h, hk, sq, sk = 2, 8, 4, 257, 389
    seed = d + 7 * int(causal) + int(cap)
    q, g = _rand(b, h, sq, d, dtype=dtype, seed=seed), _rand(b, h, sq, d, dtype=dtype, seed=seed + 1)
    k, v = (_rand(b, hk, sk, d, dtype=dtype, seed=seed + i) for i in (2, 3))
    slopes = _slopes(form, b, h, seed)
    got = _flash_attn_func(q, k, v, g, causal=causal, softcap=cap, alibi_slopes=slopes)
    assert _ours("attn_fwd") == 1 and _ours("attn_bwd_dq") == 1
    _judge(got, q, k, v, g, causal=causal, softcap=cap, alibi_slopes=slopes)


@pytest.mark.parametrize("dtype,d", [(F16, 128), (BF16, 64), (F16, 256)])
def test_window_and_sq_longer_than_sk(dtype, d):
    b, h, sq, sk = 2, 4, 300, 150
    q, g = _rand(b, h, sq, d, dtype=dtype, seed=1), _rand(b, h, sq, d, dtype=dtype, seed=2)
    k, v = (_rand(b, h, sk, d, dtype=dtype, seed=s) for s in (3, 4))
    slopes = _slopes("bh", b, h)
    got = _flash_attn_func(q, k, v, g, causal=True, window_size=(64, -1), softcap=8.0,
                           alibi_slopes=slopes)
    _judge(got, q, k, v, g, causal=True, window=(64, -1), softcap=8.0, alibi_slopes=slopes)


@pytest.mark.parametrize("dtype,d,causal", [(F16, 128, True), (BF16, 64, False),
                                            (F16, 256, True)])
def test_varlen(dtype, d, causal):
    lens_q, lens_k = [100, 7, 513, 64], [200, 7, 300, 64]
    h, hk = 8, 2
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32,
                        device="cuda")
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32,
                        device="cuda")
    q, g = (_rand(sum(lens_q), h, d, dtype=dtype, seed=s) for s in (5, 6))
    k, v = (_rand(sum(lens_k), hk, d, dtype=dtype, seed=s) for s in (7, 8))
    slopes = _slopes("bh", len(lens_q), h)
    qr, kr, vr = (x.detach().requires_grad_(True) for x in (q, k, v))
    out, lse, _ = aotriton_rocm.flash_attn_varlen_func(
        qr, kr, vr, cu_q, cu_k, max(lens_q), max(lens_k), 0.0, None, causal, (-1, -1), 4.0,
        slopes, False, True)
    out.backward(g)
    for i in range(len(lens_q)):
        rq = slice(int(cu_q[i]), int(cu_q[i + 1]))
        rk = slice(int(cu_k[i]), int(cu_k[i + 1]))

        def seq(x, rows):
            return x[rows].transpose(0, 1).unsqueeze(0)

        got = {"out": seq(out.detach(), rq), "lse": lse[:, rq].unsqueeze(0),
               "dq": seq(qr.grad, rq), "dk": seq(kr.grad, rk), "dv": seq(vr.grad, rk)}
        _judge(got, seq(q, rq), seq(k, rk), seq(v, rk), seq(g, rq), causal=causal, softcap=4.0,
               alibi_slopes=slopes[i])


def test_packed_variants_equal_unpacked():
    b, s, h, d = 2, 333, 8, 128
    q, k, v, g = (_rand(b, s, h, d, seed=i) for i in range(4))
    slopes = _slopes("h", b, h)
    kw = dict(causal=True, softcap=6.0, alibi_slopes=slopes)

    def run(fn, *inputs):
        leaves = [x.detach().requires_grad_(True) for x in inputs]
        out = fn(*leaves)
        out.backward(g)
        return out.detach(), [x.grad for x in leaves]

    ref_out, (dq, dk, dv) = run(lambda *x: aotriton_rocm.flash_attn_func(*x, **kw), q, k, v)
    out, (dqkv,) = run(lambda x: aotriton_rocm.flash_attn_qkvpacked_func(x, **kw),
                       torch.stack((q, k, v), dim=2))
    assert torch.equal(out, ref_out) and torch.equal(dqkv, torch.stack((dq, dk, dv), dim=2))
    out, (dq2, dkv) = run(lambda a, c: aotriton_rocm.flash_attn_kvpacked_func(a, c, **kw), q,
                          torch.stack((k, v), dim=2))
    assert torch.equal(out, ref_out) and torch.equal(dq2, dq)
    assert torch.equal(dkv, torch.stack((dk, dv), dim=2))


@pytest.mark.parametrize("d,form,causal", [(64, "h", False), (128, "bh", True), (256, "bh", False)])
def test_torch_op_alibi_slopes_runs_on_our_kernels(d, form, causal):
    if "alibi_slopes" not in str(torch.ops.aten._flash_attention_forward.default._schema):
        pytest.skip("this torch's _flash_attention_forward has no alibi_slopes")
    aotriton_rocm.enable()
    try:
        b, h, sq, sk = 2, 8, 200, 300
        q = _rand(b, sq, h, d, seed=11)
        k, v = (_rand(b, sk, h, d, seed=s) for s in (12, 13))
        slopes = _slopes(form, b, h)
        backends.reset_launch_counts()
        out, lse, *_ = torch.ops.aten._flash_attention_forward(
            q, k, v, None, None, sq, sk, 0.0, causal, False, scale=0.1, alibi_slopes=slopes)
        assert _ours("attn_fwd") == 1
    finally:
        aotriton_rocm.disable()
    golden = ref.attention(_t(q), _t(k), _t(v), dtype=torch.float32, scale=0.1, causal=causal,
                           alibi_slopes=slopes)
    lp = ref.attention(_t(q), _t(k), _t(v), dtype=q.dtype, scale=0.1, causal=causal,
                       alibi_slopes=slopes)
    ref.check("out", _t(out), golden["out"], lp["out"], q.dtype)
    ref.check("lse", lse, golden["lse"], lp["lse"], q.dtype)


def test_bad_slopes_are_refused_with_the_reason():
    q = _rand(1, 16, 2, 64)
    with pytest.raises(ValueError, match="alibi_slopes must be on the query's device"):
        aotriton_rocm.flash_attn_func(q, q, q, alibi_slopes=torch.ones(2))
    with pytest.raises(ValueError, match="alibi_slopes must be fp32"):
        aotriton_rocm.flash_attn_func(q, q, q, alibi_slopes=torch.ones(2, device="cuda").half())
    with pytest.raises(ValueError, match="softcap=-1: must be finite and >= 0"):
        aotriton_rocm.flash_attn_func(q, q, q, softcap=-1.0)
