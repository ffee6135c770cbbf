"""Head dims that are not multiples of 8 on a real GPU (the H100 via the
sm_90 target): torch's flash and efficient ops through SDPA (on torch >=
2.10 the C++ route, whose libaotriton_rocm makes the zero-padded copies),
flash-attn's functions (the Python route's copies), dropout, an attention
bias, varlen and the KV cache, against the float32 math reference with
PyTorch's tolerance model; and that our kernels ran (no fallback).
Skipped without a GPU or an installed image for its arch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import aotriton_rocm
from support import attn_reference as ref
from support import kvcache_reference as kv_ref
from support import philox_reference
from aotriton_rocm.core import backends, torch_native
from aotriton_rocm.integrations import torch_integration

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("enabled")]


FLASH = torch.ops.aten._scaled_dot_product_flash_attention.default
FLASH_BWD = torch.ops.aten._scaled_dot_product_flash_attention_backward.default
EFF = torch.ops.aten._scaled_dot_product_efficient_attention.default
EFF_BWD = torch.ops.aten._scaled_dot_product_efficient_attention_backward.default


def _rand(*shape, dtype=torch.float16, seed=0):
    gen = torch.Generator("cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", generator=gen).to(dtype)


def _runs():
    """(our launches, fallbacks) on either route so far: backends counts the
    C++ route's launches too."""
    return sum(backends.launch_counts().values()), torch_native.fallback_count()


@pytest.mark.parametrize("d", [1, 3, 59, 111, 203, 509])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_flash_and_efficient_ops(d, dtype):
    """The ops called directly: on CUDA builds torch's SDPA pads the head dim
    to a multiple of 8 before the flash op and does not select the efficient
    op at such head dims; ROCm's selector sends them as they are, as do
    direct callers."""
    q, k, v, g = (_rand(2, 3, s, d, dtype=dtype, seed=i) for i, s in enumerate((143, 127, 127, 143)))
    before, fallbacks = _runs()
    out, lse, cq, ck, mq, mk, seed, offset, _ = FLASH(q, k, v, 0.0, False, False)
    dq, dk, dv = FLASH_BWD(g, q, k, v, out, lse, cq, ck, mq, mk, 0.0, False, seed, offset)
    ref.check_all({"out": out, "dq": dq, "dk": dk, "dv": dv}, q, k, v, g)
    out, lse, seed, offset = EFF(q, k, v, None, True, 0.0, True)
    dq, dk, dv, _ = EFF_BWD(g, q, k, v, None, out, lse, seed, offset, 0.0,
                            [True, True, True, False], True)
    ref.check_all({"out": out, "dq": dq, "dk": dk, "dv": dv}, q, k, v, g, causal=True,
           alignment="top_left")
    after, fallbacks_after = _runs()
    assert after - before == 8 and fallbacks_after == fallbacks


def test_sdpa_flash_pads_and_we_run_it():
    q, k, v, g = (_rand(1, 2, 200, 59, seed=i) for i in range(4))
    qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True)
    out.backward(g)
    ref.check_all({"out": out.detach(), "dq": qq.grad, "dk": kk.grad, "dv": vv.grad}, q, k, v, g,
           causal=True)


@pytest.mark.parametrize("d", [59, 203])
def test_flash_op_dropout_mask_and_backward(d):
    p, sq, sk = 0.22, 143, 579
    q, k, v, g = (_rand(2, 4, s, d, seed=i) for i, s in enumerate((sq, sk, sk, sq)))
    out, lse, cq, ck, mq, mk, seed, offset, debug = FLASH(q, k, v, p, True, True)
    keep = philox_reference.keep_mask_for(torch_integration._rng_inputs(seed, offset),
                                          (2, 4, sq, sk), p).cuda()
    vis = ref.visible(sq, sk, True).cuda()
    assert torch.equal((debug >= 0)[..., vis], keep[..., vis])
    dq, dk, dv = FLASH_BWD(g, q, k, v, out, lse, cq, ck, mq, mk, p, True, seed, offset)
    ref.check_all({"out": out, "dq": dq, "dk": dk, "dv": dv}, q, k, v, g, causal=True, keep=keep,
           dropout_p=p)


@pytest.mark.parametrize("d", [59, 111])
def test_efficient_op_with_bias_and_its_gradient(d):
    q, k, v, g = (_rand(1, 2, s, d, seed=i) for i, s in enumerate((64, 96, 96, 64)))
    bias = _rand(1, 2, 64, 96, seed=9)
    out, lse, seed, offset = EFF(q, k, v, bias, True, 0.0, False)
    dq, dk, dv, db = EFF_BWD(g, q, k, v, bias, out, lse, seed, offset, 0.0,
                             [True, True, True, True], False)
    ref.check_all({"out": out, "dq": dq, "dk": dk, "dv": dv, "dbias": db}, q, k, v, g, bias=bias)


@pytest.mark.parametrize("d", [59, 111])
def test_flash_attn_varlen(d):
    lens = [37, 0, 129, 64]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32,
                      device="cuda")
    q, k, v, g = (_rand(sum(lens), 4, d, seed=i) for i in range(4))
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    out = aotriton_rocm.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    out.backward(g)
    for i, n in enumerate(lens):
        if not n:
            continue
        rows = slice(int(cu[i]), int(cu[i + 1]))

        def seq(t):
            return t.detach()[rows].transpose(0, 1).unsqueeze(0)

        ref.check_all({"out": seq(out), "dq": seq(q.grad), "dk": seq(k.grad), "dv": seq(v.grad)},
               seq(q), seq(k), seq(v), seq(g), causal=True)


@pytest.mark.parametrize("d", [59, 111, 203])
def test_kvcache_with_append(d):
    b, sq, h, hk, cap, new = 2, 1, 8, 2, 300, 1
    q = _rand(b, sq, h, d, seed=1)
    kc, vc = _rand(b, cap, hk, d, seed=2), _rand(b, cap, hk, d, seed=3)
    kn, vn = _rand(b, new, hk, d, seed=4), _rand(b, new, hk, d, seed=5)
    seqlens = torch.tensor([100, 250], dtype=torch.int32, device="cuda")
    out = aotriton_rocm.flash_attn_with_kvcache(q, kc, vc, k=kn, v=vn, cache_seqlens=seqlens,
                                                causal=True)
    want, _ = kv_ref.attention(q.cpu(), kc.cpu(), vc.cpu(), (seqlens + new).cpu(), causal=True)
    assert (out.double().cpu() - want).abs().max().item() <= 4e-3
    assert torch.equal(kc[1, 250], kn[1, 0])
