"""The feature set on a real GPU (the H100 via the sm_90 target): dropout
(Philox state contract, debug mask, the backward's regenerated mask, CUDA-graph
replays), the memory-efficient op with an attention bias and its gradient,
fp32, head dim 512, variable-length batches, batch x heads past the grid's
row limit, zero-size batches. Judged with PyTorch's tolerance model.
Skipped without a GPU or an installed image for its arch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from support import attn_reference as ref
from support import philox_reference
from aotriton_rocm.integrations import torch_integration
from support.gpu import ours as _ours  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("enabled")]


FLASH = torch.ops.aten._scaled_dot_product_flash_attention.default
FLASH_BWD = torch.ops.aten._scaled_dot_product_flash_attention_backward.default


def _rand(*shape, dtype=torch.float16, seed=0):
    gen = torch.Generator("cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", generator=gen).to(dtype)


def _judge(got, q, k, v, g, **kw):
    golden = ref.attention(q, k, v, g, dtype=ref.golden_dtype(q.dtype), **kw)
    lp = ref.attention(q, k, v, g, dtype=q.dtype, **kw)
    for name, value in got.items():
        ref.check(name, value, golden[name], lp[name], q.dtype)


@pytest.mark.parametrize("dtype,d,causal,sq,sk,p", [
    (torch.float16, 64, False, 143, 579, 0.22), (torch.bfloat16, 128, True, 1024, 1024, 0.48),
    (torch.float16, 72, True, 257, 257, 0.22), (torch.bfloat16, 256, False, 4, 127, 0.48),
])
def test_flash_dropout_contract_and_mask(dtype, d, causal, sq, sk, p):
    q, k, v, g = (_rand(2, 4, s, d, dtype=dtype, seed=i) for i, s in enumerate((sq, sk, sk, sq)))
    out, lse, cq, ck, mq, mk, seed, offset, debug = FLASH(q, k, v, p, causal, True)
    # torch's RNG state contract for this build (ROCm: int64 (); CUDA: uint64 (2,) and ()).
    meta = FLASH(*(t.to("meta") for t in (q, k, v)), p, causal, True)
    assert (seed.shape, seed.dtype, offset.shape, offset.dtype) == \
        (meta[6].shape, meta[6].dtype, meta[7].shape, meta[7].dtype)
    keep = philox_reference.keep_mask_for(torch_integration._rng_inputs(seed, offset),
                                          (2, 4, sq, sk), p).cuda()
    vis = ref.visible(sq, sk, causal).cuda()
    # The GPU's Philox stream is the host model's, bit for bit; the debug mask shows it.
    assert torch.equal((debug >= 0)[..., vis], keep[..., vis])
    dq, dk, dv = FLASH_BWD(g, q, k, v, out, lse, cq, ck, mq, mk, p, causal, seed, offset)
    assert _ours("attn_fwd") == 1 and _ours("attn_bwd_dq") == 1
    _judge({"out": out, "dq": dq, "dk": dk, "dv": dv}, q, k, v, g, causal=causal, keep=keep,
           dropout_p=p)


def test_sdpa_dropout_through_autograd_uses_one_mask():
    q, k, v, g = (_rand(1, 2, 300, 64, seed=i).requires_grad_(i < 3) for i in range(4))
    torch.manual_seed(11)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.3)
    out.backward(g)
    torch.manual_seed(11)  # the same torch RNG draw gives the same Philox state
    *_, seed, offset, _ = FLASH(q.detach(), k.detach(), v.detach(), 0.3, False, True)
    keep = philox_reference.keep_mask_for(torch_integration._rng_inputs(seed, offset),
                                          (1, 2, 300, 300), 0.3).cuda()
    _judge({"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad},
           q.detach(), k.detach(), v.detach(), g, keep=keep, dropout_p=0.3)


@pytest.mark.parametrize("p", [0.0, 0.3])
def test_cuda_graph_replays(p):
    q, k, v = (_rand(2, 4, 256, 64, seed=i) for i in range(3))
    static_out = torch.empty_like(q)

    def step():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            static_out.copy_(F.scaled_dot_product_attention(q, k, v, dropout_p=p))

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    graph.replay()
    first = static_out.clone()
    graph.replay()
    assert _ours() >= 1
    if p:
        assert not torch.equal(first, static_out), "replays must draw new dropout masks"
    else:
        assert torch.equal(first, static_out), "replays without dropout must be bit-identical"


@pytest.mark.parametrize("dtype,d,mask_shape,kind,grad", [
    (torch.float16, 64, (2, 1, 300, 257), "float", True),
    (torch.bfloat16, 128, (300, 257), "bool", False),
    (torch.float32, 64, (2, 4, 300, 257), "float", True),
    (torch.float16, 512, (1, 4, 1, 257), "float", True),
    (torch.float32, 256, (2, 1, 300, 1), "float", False),
    (torch.float32, 512, (2, 4, 300, 257), "float", True),
])
def test_efficient_attention_with_bias(dtype, d, mask_shape, kind, grad):
    q, k, v, g = (_rand(2, 4, s, d, dtype=dtype, seed=i) for i, s in enumerate((300, 257, 257, 300)))
    mask = (_rand(*mask_shape, dtype=torch.float32, seed=9) > -1.0 if kind == "bool"
            else _rand(*mask_shape, dtype=dtype, seed=9))
    ts = [t.clone().requires_grad_(True) for t in (q, k, v)]
    m = mask.clone().requires_grad_(grad)
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        out = F.scaled_dot_product_attention(*ts, attn_mask=m)
    out.backward(g)
    assert _ours("attn_fwd") == 1 and _ours("attn_bwd_dq") == 1
    got = {"out": out.detach(), "dq": ts[0].grad, "dk": ts[1].grad, "dv": ts[2].grad}
    bias = mask if kind == "float" else torch.zeros(mask.shape, device="cuda").masked_fill(
        ~mask, float("-inf"))
    if grad:
        got["dbias"] = m.grad
    _judge(got, q, k, v, g, bias=bias)


def test_efficient_attention_uncovered_head_dim_falls_back_with_reason():
    torch_integration._warned.clear()
    q = _rand(1, 2, 64, 520, dtype=torch.float32)  # torch's kernel takes fp32 head dims of 4k
    with pytest.warns(UserWarning, match="head_dim 520 is not covered"):
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
            F.scaled_dot_product_attention(q, q, q)
    assert not _ours()


def test_variable_length_batch_through_the_flash_op():
    lens_q, lens_k, h, d = [1, 300, 17, 1024], [5, 129, 17, 700], 8, 128
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32).cuda()
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32).cuda()
    q, g = (_rand(sum(lens_q), h, d, seed=i) for i in (0, 1))
    k, v = (_rand(sum(lens_k), 2, d, seed=i) for i in (2, 3))
    out, lse, seed, offset, _ = torch.ops.aten._flash_attention_forward(
        q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), 0.0, True, False)
    dq, dk, dv = torch.ops.aten._flash_attention_backward(
        g, q, k, v, out, lse, cu_q, cu_k, max(lens_q), max(lens_k), 0.0, True, seed, offset)
    assert _ours("attn_fwd") == 1
    for i in range(len(lens_q)):
        rq, rk = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))

        def seq(t, rows):
            return t[rows].transpose(0, 1).unsqueeze(0)

        _judge({"out": seq(out, rq), "dq": seq(dq, rq), "dk": seq(dk, rk), "dv": seq(dv, rk)},
               seq(q, rq), seq(k, rk), seq(v, rk), seq(g, rq), causal=True)


def test_nested_jagged_sdpa_reaches_the_varlen_path():
    seqs = [_rand(s, 4, 64, seed=s) for s in (3, 40, 129)]
    nt = torch.nested.nested_tensor(seqs, layout=torch.jagged).transpose(1, 2)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = F.scaled_dot_product_attention(nt, nt, nt, is_causal=False)
    assert _ours("attn_fwd") == 1
    for s, o in zip(seqs, out.transpose(1, 2).unbind()):
        t = s.transpose(0, 1).unsqueeze(0)
        ref.check_all({"out": o.transpose(0, 1).unsqueeze(0)}, t, t, t)


def test_batch_times_heads_past_the_grid_row_limit():
    b, h = 70000, 1  # 70000 (batch, head) pairs > 65535
    q, k, v, g = (_rand(b, h, 16, 16, seed=i) for i in range(4))
    ts = [t.clone().requires_grad_(True) for t in (q, k, v)]
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = F.scaled_dot_product_attention(*ts, is_causal=True)
    out.backward(g)
    assert _ours("attn_fwd") == 1
    _judge({"out": out.detach(), "dq": ts[0].grad, "dk": ts[1].grad, "dv": ts[2].grad},
           q, k, v, g, causal=True)


def test_zero_size_batch():
    q = torch.randn(0, 4, 128, 64, device="cuda", dtype=torch.float16, requires_grad=True)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = F.scaled_dot_product_attention(q, q, q)
    out.sum().backward()
    assert out.shape == q.shape and q.grad.shape == q.shape


def test_torch_compile_with_bias_and_dropout_free_paths_matches_eager():
    # inductor calls our efficient-op override (a bias) and flash-op override
    # (GQA) as extern kernels: outputs must match eager bit for bit.
    q, k, v = (_rand(2, 4, 256, 64, seed=i) for i in range(3))
    kv = _rand(2, 2, 256, 64, seed=5)
    mask = _rand(2, 1, 256, 256, seed=4)

    def attn(q, k, v, kv, mask):
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            b = F.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
        return a, b

    eager = attn(q, k, v, kv, mask)
    compiled = torch.compile(attn)(q, k, v, kv, mask)
    for e, c in zip(eager, compiled):
        torch.testing.assert_close(c, e, atol=0, rtol=0)
    assert _ours("attn_fwd") >= 2
