"""flash-attn's softcap and ALiBi on the CPU (kernel sources in Triton's
interpreter), forward and backward, against an explicit float64/float32
reference (``softcap * tanh(s / softcap)`` and an explicit ALiBi bias,
differentiated by autograd): alone and together, with causal masks, windows,
Sq != Sk, GQA, padded head dims, varlen batches, dropout and an additive
bias; flash-attn's four packed variants against the unpacked calls; bad
slopes and softcaps refused with the reason. Judged with PyTorch's tolerance
model (golden float32 math, float64 for fp32 inputs)."""

from __future__ import annotations

from support import attn_reference
from support import philox_reference
import pytest
import torch

import aotriton_rocm
from aotriton_rocm.core import attention
from aotriton_rocm.flash_attn_interface import AttentionFunction

pytest.importorskip("triton", reason="the CPU backend runs kernels in Triton's interpreter")

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
GUARD = 8.0


def _rand(shape, dtype, gen, scale=1.0):
    return (torch.randn(shape, generator=gen, dtype=torch.float32) * scale).to(dtype)


def _slopes(form, b, h, gen):
    """fp32 slopes: None, per head (H,) or per batch and head (B, H)."""
    if form is None:
        return None
    shape = (h,) if form == "h" else (b, h)
    return torch.rand(shape, generator=gen, dtype=torch.float32) * 0.6 + 0.05


def _judge(results, golden, lp, dtype):
    for name, value in results.items():
        attn_reference.check(name, value, golden[name], lp[name], dtype, guard=GUARD)


def _reference(q, k, v, do, **kw):
    """(golden, low-precision) references on (B, H, S, D) tensors."""
    golden = attn_reference.attention(q, k, v, do, dtype=attn_reference.golden_dtype(q.dtype), **kw)
    lp = attn_reference.attention(q, k, v, do, dtype=q.dtype, **kw)
    return golden, lp


def _bshd(t):
    return t.transpose(1, 2)


def _flash_attn(q, k, v, do, **kw):
    """flash_attn_func on (B, S, H, D) views of (B, H, S, D) tensors: out,
    lse and the gradients, back in (B, H, S, D)."""
    qs, ks, vs = (_bshd(t).detach().requires_grad_(True) for t in (q, k, v))
    out, lse, _ = aotriton_rocm.flash_attn_func(qs, ks, vs, return_attn_probs=True, **kw)
    out.backward(_bshd(do))
    return {"out": _bshd(out.detach()), "lse": lse, "dq": _bshd(qs.grad), "dk": _bshd(ks.grad),
            "dv": _bshd(vs.grad)}


# (dtype, head_dim, causal, window, Sq, Sk, H, Hk, softcap, slopes form)
CASES = [
    (F16, 64, False, (-1, -1), 37, 45, 2, 2, 5.0, None),       # softcap alone
    (F32, 64, False, (-1, -1), 33, 33, 2, 2, 0.0, "h"),        # ALiBi (H,) alone
    (F16, 64, False, (-1, -1), 29, 41, 2, 2, 0.0, "bh"),       # ALiBi (B, H) alone
    (F32, 40, False, (-1, -1), 30, 50, 2, 2, 2.0, "bh"),       # both, padded head dim
    (F16, 72, True, (-1, -1), 45, 30, 4, 2, 3.0, "h"),         # causal Sq > Sk, GQA
    (F16, 64, True, (-1, -1), 20, 70, 4, 1, 1.5, "bh"),        # causal Sq < Sk, MQA
    (F32, 128, False, (7, 3), 40, 40, 2, 2, 4.0, "bh"),        # sliding window
    (F16, 40, True, (9, -1), 50, 35, 2, 1, 0.0, "h"),          # causal + left window
    (BF16, 64, True, (-1, -1), 33, 33, 2, 2, 2.5, "bh"),
    (F32, 72, False, (-1, 5), 17, 60, 3, 1, 0.75, "h"),        # small softcap, right window
    (BF16, 256, True, (-1, -1), 30, 45, 2, 1, 3.0, "bh"),      # both, the split dK/dV kernel
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: (
    f"{str(c[0])[6:]}-d{c[1]}-{'causal' if c[2] else 'full'}-w{c[3][0]}.{c[3][1]}-"
    f"{c[4]}x{c[5]}-h{c[6]}.{c[7]}-cap{c[8]}-{c[9]}"))
def test_flash_attn_func_softcap_and_alibi(case):
    dtype, d, causal, window, sq, sk, h, hk, cap, form = case
    b = 2
    gen = torch.Generator().manual_seed(sq * 131 + sk * 7 + d)
    # Scores of a few units, so a softcap of 1-5 really bends them.
    q, do = (_rand((b, h, sq, d), dtype, gen, 1.5) for _ in range(2))
    k, v = (_rand((b, hk, sk, d), dtype, gen, 1.5) for _ in range(2))
    slopes = _slopes(form, b, h, gen)
    got = _flash_attn(q, k, v, do, causal=causal, window_size=window, softcap=cap,
                      alibi_slopes=slopes)
    window = attention.flash_attn_window(*window, sk)
    golden, lp = _reference(q, k, v, do, causal=causal, window=window, softcap=cap,
                            alibi_slopes=slopes)
    _judge(got, golden, lp, dtype)


def test_the_modifications_change_the_result():
    """Guards the references above: each feature alone moves out and dq."""
    gen = torch.Generator().manual_seed(3)
    q, k, v, do = (_rand((1, 2, 24, 32), F32, gen, 1.5) for _ in range(4))
    plain = _flash_attn(q, k, v, do)
    capped = _flash_attn(q, k, v, do, softcap=2.0)
    alibi = _flash_attn(q, k, v, do, alibi_slopes=torch.full((2,), 0.5))
    for name in ("out", "lse", "dq", "dk"):
        assert (plain[name] - capped[name]).abs().max() > 1e-2, name
        assert (plain[name] - alibi[name]).abs().max() > 1e-2, name


def test_per_batch_slopes_are_per_batch():
    """(B, H) slopes give each sequence its own bias: batch 1 with the slopes
    of batch 0 reproduces batch 0's output on batch 0's inputs."""
    gen = torch.Generator().manual_seed(5)
    q, k, v = (_rand((1, 16, 2, 32), F32, gen) for _ in range(3))
    q2, k2, v2 = (t.expand(2, -1, -1, -1).contiguous() for t in (q, k, v))
    slopes = torch.tensor([[0.25, 0.5], [0.9, 0.1]])
    out = aotriton_rocm.flash_attn_func(q2, k2, v2, alibi_slopes=slopes)
    alone = [aotriton_rocm.flash_attn_func(q, k, v, alibi_slopes=slopes[i]) for i in range(2)]
    assert torch.allclose(out[0], alone[0][0], atol=1e-6)
    assert torch.allclose(out[1], alone[1][0], atol=1e-6)
    assert (out[0] - out[1]).abs().max() > 1e-2


def test_with_dropout_and_bias_through_attention_module():
    """softcap + ALiBi with an additive bias (and its gradient) and dropout,
    through attention.forward/backward (the path AttentionMode shares)."""
    dtype, b, h, sq, sk, d, p = F16, 2, 2, 30, 45, 64, 0.25
    gen = torch.Generator().manual_seed(11)
    q, do = (_rand((b, h, sq, d), dtype, gen, 1.5) for _ in range(2))
    k, v = (_rand((b, h, sk, d), dtype, gen, 1.5) for _ in range(2))
    bias = _rand((b, h, sq, sk), dtype, gen)
    slopes = _slopes("bh", b, h, gen)
    torch.manual_seed(1)
    rng = tuple(attention.new_rng_state(q.device))
    dbias = attention.new_bias_grad((b, h, sq, sk), dtype, q.device)
    kw = dict(is_causal=True, bias=bias, dropout_p=p, rng=rng, softcap=3.0, alibi_slopes=slopes)
    out, lse = attention.forward(q, k, v, **kw)
    dq, dk, dv = attention.backward(do, q, k, v, out, lse, bias_grad=dbias, **kw)
    keep = philox_reference.keep_mask_for(rng, (b, h, sq, sk), p)
    golden, lp = _reference(q, k, v, do, causal=True, bias=bias, keep=keep, dropout_p=p,
                            softcap=3.0, alibi_slopes=slopes)
    _judge({"out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv, "dbias": dbias}, golden, lp,
           dtype)


def _cu(lens):
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)


@pytest.mark.parametrize("dtype,causal,window,form,cap", [
    (F16, True, (-1, -1), "bh", 2.0),
    (F32, False, (6, 2), "h", 0.0),
    (F32, False, (-1, -1), "bh", 1.5),
])
def test_varlen_per_sequence(dtype, causal, window, form, cap):
    """Packed batches: ALiBi and masks use each sequence's own Sq, Sk and
    positions; judged per sequence against the dense reference."""
    lens_q, lens_k = [5, 17, 1, 12], [9, 11, 6, 12]
    h, hk, d = 4, 2, 40
    gen = torch.Generator().manual_seed(21)
    tq, tk = sum(lens_q), sum(lens_k)
    q, do = (_rand((tq, h, d), dtype, gen, 1.5) for _ in range(2))
    k, v = (_rand((tk, hk, d), dtype, gen, 1.5) for _ in range(2))
    slopes = _slopes(form, len(lens_q), h, gen)
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    qr, kr, vr = (t.detach().requires_grad_(True) for t in (q, k, v))
    out, lse, _ = aotriton_rocm.flash_attn_varlen_func(
        qr, kr, vr, cu_q, cu_k, max(lens_q), max(lens_k), 0.0, None, causal, window, cap,
        slopes, False, True)
    out.backward(do)
    for i in range(len(lens_q)):
        rq = slice(int(cu_q[i]), int(cu_q[i + 1]))
        rk = slice(int(cu_k[i]), int(cu_k[i + 1]))

        def seq(t, rows):
            return t[rows].transpose(0, 1).unsqueeze(0)

        w = attention.flash_attn_window(*window, max(lens_k))
        s = None if slopes is None else (slopes if slopes.dim() == 1 else slopes[i])
        golden, lp = _reference(seq(q, rq), seq(k, rk), seq(v, rk), seq(do, rq), causal=causal,
                                window=w, softcap=cap, alibi_slopes=s)
        got = {"out": seq(out.detach(), rq), "lse": lse[:, rq].unsqueeze(0),
               "dq": seq(qr.grad, rq), "dk": seq(kr.grad, rk), "dv": seq(vr.grad, rk)}
        _judge(got, golden, lp, dtype)


def _packed_case(seed=0, b=2, s=20, h=4, hk=2, d=40, dtype=F16):
    gen = torch.Generator().manual_seed(seed)
    return (_rand((b, s, h, d), dtype, gen, 1.5), _rand((b, s, hk, d), dtype, gen, 1.5),
            _rand((b, s, hk, d), dtype, gen, 1.5), _rand((b, s, h, d), dtype, gen))


def _grads_of(fn, inputs, do):
    leaves = [t.detach().requires_grad_(True) for t in inputs]
    out, lse, _ = fn(*leaves)
    out.backward(do)
    return out.detach(), lse, [t.grad for t in leaves]


KW = dict(dropout_p=0.0, softmax_scale=0.3, causal=True, window_size=(-1, -1), softcap=2.0)


def test_qkvpacked_equals_unpacked():
    q, _, _, do = _packed_case(h=4, hk=4)
    gen = torch.Generator().manual_seed(1)
    k, v = (_rand(q.shape, q.dtype, gen, 1.5) for _ in range(2))
    slopes = _slopes("bh", 2, 4, gen)
    qkv = torch.stack((q, k, v), dim=2)  # (B, S, 3, H, D)
    out, lse, (gqkv,) = _grads_of(
        lambda t: aotriton_rocm.flash_attn_qkvpacked_func(t, KW["dropout_p"], KW["softmax_scale"],
                                                          KW["causal"], KW["window_size"],
                                                          KW["softcap"], slopes, False, True),
        [qkv], do)
    ref_out, ref_lse, grads = _grads_of(
        lambda *t: aotriton_rocm.flash_attn_func(*t, **KW, alibi_slopes=slopes,
                                                 return_attn_probs=True), [q, k, v], do)
    assert gqkv.shape == qkv.shape
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    assert torch.equal(gqkv, torch.stack(grads, dim=2))


def test_kvpacked_equals_unpacked():
    q, k, v, do = _packed_case()
    slopes = _slopes("h", 2, 4, torch.Generator().manual_seed(2))
    kv = torch.stack((k, v), dim=2)  # (B, S, 2, Hk, D)
    out, lse, (gq, gkv) = _grads_of(
        lambda a, b: aotriton_rocm.flash_attn_kvpacked_func(a, b, 0.0, 0.3, True, (-1, -1), 2.0,
                                                            slopes, False, True), [q, kv], do)
    ref_out, ref_lse, (rq, rk, rv) = _grads_of(
        lambda *t: aotriton_rocm.flash_attn_func(*t, **KW, alibi_slopes=slopes,
                                                 return_attn_probs=True), [q, k, v], do)
    assert gkv.shape == kv.shape
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    assert torch.equal(gq, rq) and torch.equal(gkv, torch.stack((rk, rv), dim=2))


def test_varlen_packed_variants_equal_unpacked():
    lens = [7, 13, 4]
    cu = _cu(lens)
    h, d = 2, 40
    gen = torch.Generator().manual_seed(4)
    q, k, v, do = (_rand((sum(lens), h, d), F32, gen, 1.5) for _ in range(4))
    slopes = _slopes("bh", len(lens), h, gen)
    args = (cu, cu, max(lens), max(lens), 0.0, None, False, (3, -1), 1.5, slopes, False, True)
    ref_out, ref_lse, ref = _grads_of(
        lambda *t: aotriton_rocm.flash_attn_varlen_func(*t, *args), [q, k, v], do)

    qkv = torch.stack((q, k, v), dim=1)  # (total, 3, H, D)
    out, lse, (g,) = _grads_of(
        lambda t: aotriton_rocm.flash_attn_varlen_qkvpacked_func(
            t, cu, max(lens), 0.0, None, False, (3, -1), 1.5, slopes, False, True), [qkv], do)
    assert g.shape == qkv.shape
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    assert torch.equal(g, torch.stack(ref, dim=1))

    kv = torch.stack((k, v), dim=1)  # (total, 2, H, D)
    out, lse, (gq, gkv) = _grads_of(
        lambda a, b: aotriton_rocm.flash_attn_varlen_kvpacked_func(a, b, *args), [q, kv], do)
    assert gkv.shape == kv.shape
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    assert torch.equal(gq, ref[0]) and torch.equal(gkv, torch.stack(ref[1:], dim=1))


def test_packed_variants_keep_flash_attn_positional_order():
    import inspect

    names = lambda f: list(inspect.signature(f).parameters)  # noqa: E731
    tail = ["dropout_p", "softmax_scale", "causal", "window_size", "softcap", "alibi_slopes",
            "deterministic", "return_attn_probs"]
    assert names(aotriton_rocm.flash_attn_func) == ["q", "k", "v", *tail]
    assert names(aotriton_rocm.flash_attn_qkvpacked_func) == ["qkv", *tail]
    assert names(aotriton_rocm.flash_attn_kvpacked_func) == ["q", "kv", *tail]
    assert names(aotriton_rocm.flash_attn_varlen_qkvpacked_func) == [
        "qkv", "cu_seqlens", "max_seqlen", *tail]
    assert names(aotriton_rocm.flash_attn_varlen_kvpacked_func) == [
        "q", "kv", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", *tail]
    assert names(aotriton_rocm.flash_attn_varlen_func) == [
        "q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", *tail,
        "block_table"]


@pytest.mark.parametrize("kwargs,match", [
    (dict(alibi_slopes=torch.ones(2, dtype=torch.float16)), "alibi_slopes must be fp32"),
    (dict(alibi_slopes=torch.ones(3)), r"alibi_slopes must be \(heads,\) = \(2,\) or "),
    (dict(alibi_slopes=torch.ones(2, 2)), r"alibi_slopes must be \(heads,\)"),
    (dict(alibi_slopes=torch.ones(1, 1, 2)), r"alibi_slopes must be \(heads,\)"),
    (dict(alibi_slopes=[0.5, 0.5]), "alibi_slopes must be a tensor"),
    (dict(alibi_slopes=torch.ones(2, device="meta")), "on the query's device"),
    (dict(softcap=float("nan")), "softcap=nan: must be finite and >= 0"),
    (dict(softcap=float("inf")), "softcap=inf: must be finite and >= 0"),
    (dict(softcap=-2.0), "softcap=-2: must be finite and >= 0"),
])
def test_bad_slopes_and_softcaps_say_why(kwargs, match):
    q = torch.randn(1, 8, 2, 16).half()
    with pytest.raises(ValueError, match=match):
        aotriton_rocm.flash_attn_func(q, q, q, **kwargs)


def test_bad_packed_shapes_say_why():
    with pytest.raises(ValueError, match=r"qkv must be \(batch, seqlen, 3, nheads, headdim\)"):
        aotriton_rocm.flash_attn_qkvpacked_func(torch.randn(1, 8, 2, 2, 16).half())
    with pytest.raises(ValueError, match=r"kv must be \(total_k, 2, nheads_k, headdim\)"):
        aotriton_rocm.flash_attn_varlen_kvpacked_func(
            torch.randn(8, 2, 16).half(), torch.randn(8, 2, 16).half(), _cu([8]), _cu([8]), 8, 8)


def test_block_table_is_refused_for_now():
    q = torch.randn(8, 2, 16).half()
    with pytest.raises(ValueError, match="block_table"):
        aotriton_rocm.flash_attn_varlen_func(q, q, q, _cu([8]), _cu([8]), 8, 8,
                                             block_table=torch.zeros(1, 1, dtype=torch.int32))


def test_slopes_get_no_gradient():
    q = torch.randn(1, 2, 8, 16, requires_grad=True)
    slopes = torch.full((2,), 0.5, requires_grad=True)
    out, _, _ = AttentionFunction.apply(q, q, q, None, None, False, "bottom_right", (-1, -1), 0.0,
                                        None, False, 1.0, slopes)
    out.sum().backward()
    assert slopes.grad is None and q.grad is not None
