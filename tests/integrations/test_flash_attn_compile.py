"""flash-attn's functions under torch.compile: each call is one operator node
(``torch.ops.aotriton_rocm.flash_attn_forward``/``backward``), so Dynamo
captures the whole function with no graph break and the compiled forward and
backward equal eager ones. On CPU tensors (kernel sources in Triton's
interpreter) with the aot_eager backend: fake kernels, autograd registration
and the real operators, without a C++ compiler for the generated code."""

from __future__ import annotations

import pytest
import torch

import aotriton_rocm

pytest.importorskip("triton", reason="the CPU backend runs kernels in Triton's interpreter")


def _dense(gen, dtype=torch.float16, b=2, sq=24, sk=40, h=4, hk=2, d=32):
    q = torch.randn(b, sq, h, d, generator=gen).to(dtype)
    k, v = (torch.randn(b, sk, hk, d, generator=gen).to(dtype) for _ in range(2))
    return q, k, v


def _varlen(gen, dtype=torch.float16, lens_q=(5, 17, 9), lens_k=(12, 3, 20), h=2, d=32):
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(sum(lens_q), h, d, generator=gen).to(dtype)
    k, v = (torch.randn(sum(lens_k), h, d, generator=gen).to(dtype) for _ in range(2))
    return q, k, v, cu_q, cu_k, max(lens_q), max(lens_k)


def _flash(q, k, v):
    return aotriton_rocm.flash_attn_func(q, k, v, causal=True, window_size=(16, -1), softcap=5.0)


def _flash_dropout(q, k, v):
    return aotriton_rocm.flash_attn_func(q, k, v, dropout_p=0.25)


def _qkvpacked(q, k, v):
    return aotriton_rocm.flash_attn_qkvpacked_func(torch.stack([q, k, v], dim=2), causal=True)


CASES = {"flash_attn_func": (_flash, dict(hk=2)),
         "dropout": (_flash_dropout, dict(hk=4)),
         "qkvpacked": (_qkvpacked, dict(sk=24, hk=4))}


def _compare(fn, inputs, seed=0):
    """Eager and compiled (fullgraph) outputs and input gradients."""
    results = []
    for run in (fn, torch.compile(fn, fullgraph=True, backend="aot_eager")):
        leaves = [t.clone().requires_grad_(t.is_floating_point()) for t in inputs]
        torch.manual_seed(seed)
        out = run(*leaves)
        out.backward(torch.ones_like(out))
        results.append((out.detach(), [t.grad for t in leaves if t.requires_grad]))
    (out_e, grads_e), (out_c, grads_c) = results
    torch.testing.assert_close(out_c, out_e, rtol=0, atol=0)
    for ge, gc in zip(grads_e, grads_c):
        torch.testing.assert_close(gc, ge, rtol=0, atol=0)


@pytest.mark.parametrize("name", sorted(CASES))
def test_dense_functions_compile_whole(name):
    fn, shape = CASES[name]
    inputs = _dense(torch.Generator().manual_seed(len(name)), **shape)
    explained = torch._dynamo.explain(fn)(*inputs)
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
    _compare(fn, inputs)


def test_varlen_function_compiles_whole():
    q, k, v, cu_q, cu_k, max_q, max_k = _varlen(torch.Generator().manual_seed(3))

    def fn(q, k, v, cu_q, cu_k):
        return aotriton_rocm.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k,
                                                    causal=True)

    explained = torch._dynamo.explain(fn)(q, k, v, cu_q, cu_k)
    assert explained.graph_break_count == 0, explained.break_reasons
    _compare(fn, (q, k, v, cu_q, cu_k))


def test_operators_are_registered_with_their_backward():
    q, k, v = _dense(torch.Generator().manual_seed(9), hk=4)
    q.requires_grad_(True)
    out = aotriton_rocm.flash_attn_func(q, k, v)  # imports the operators
    for name in ("flash_attn_forward", "flash_attn_backward", "flash_attn_kvcache"):
        assert hasattr(torch.ops.aotriton_rocm, name)
    out.sum().backward()
    assert q.grad is not None and q.grad.shape == q.shape


def test_refusal_still_names_the_reason_under_compile():
    q, k, v = _dense(torch.Generator().manual_seed(1), hk=3)  # 4 heads, 3 key heads: not GQA
    with pytest.raises(ValueError, match="multiple of"):
        torch.compile(_flash, fullgraph=True, backend="aot_eager")(q, k, v)


def test_kvcache_function_compiles_whole():
    """flash_attn_with_kvcache appending k/v in place (rotary on) and attending."""
    gen = torch.Generator().manual_seed(11)
    b, h, hk, d, cap = 2, 4, 2, 32, 48
    q = torch.randn(b, 1, h, d, generator=gen).half()
    k_new, v_new = (torch.randn(b, 1, hk, d, generator=gen).half() for _ in range(2))
    cache = torch.randn(b, cap, hk, d, generator=gen).half()
    cos, sin = torch.randn(cap, 8, generator=gen), torch.randn(cap, 8, generator=gen)
    seqlens = torch.tensor([17, 30], dtype=torch.int32)

    def fn(q, k_cache, v_cache, k, v):
        return aotriton_rocm.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cos, sin,
                                                     cache_seqlens=seqlens, causal=True)

    explained = torch._dynamo.explain(fn)(q, cache.clone(), cache.clone(), k_new, v_new)
    assert explained.graph_break_count == 0, explained.break_reasons
    caches = [(cache.clone(), cache.clone()) for _ in range(2)]
    eager = fn(q, *caches[0], k_new, v_new)
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, *caches[1], k_new, v_new)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)
    for a, c in zip(caches[0], caches[1]):  # the new keys/values were written in place
        torch.testing.assert_close(c, a, rtol=0, atol=0)
        assert not torch.equal(c, cache)
