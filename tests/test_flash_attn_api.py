"""aotriton_rocm.flash_attn_func (flash-attn's direct API) on CPU tensors
(kernel sources in Triton's interpreter), against the explicit masked math
reference, gradients through autograd included."""

from __future__ import annotations

import pytest
import torch

import aotriton_rocm
import attn_reference as ref
from aotriton_rocm import backends

pytest.importorskip("triton", reason="the CPU backend runs kernels in Triton's interpreter")


# (dtype, D, Sq, Sk, H, Hk, causal, window, softmax_scale)
CASES = [
    (torch.float16, 64, 33, 33, 2, 2, False, (-1, -1), None),
    (torch.bfloat16, 64, 17, 40, 4, 2, True, (-1, -1), 0.3),
    (torch.float16, 72, 40, 17, 3, 1, True, (-1, -1), None),  # MQA, rows with no key
    (torch.bfloat16, 32, 70, 70, 2, 2, False, (6, 2), None),
    (torch.float16, 40, 33, 47, 2, 1, True, (9, -1), 0.2),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)).replace("torch.", ""))
def test_flash_attn_func_matches_math(case):
    dtype, d, sq, sk, h, hk, causal, window, scale = case
    gen = torch.Generator().manual_seed(sq + 7 * sk + d)
    q = torch.randn(2, sq, h, d, generator=gen).to(dtype).requires_grad_(True)
    k = torch.randn(2, sk, hk, d, generator=gen).to(dtype).requires_grad_(True)
    v = torch.randn(2, sk, hk, d, generator=gen).to(dtype).requires_grad_(True)
    g = torch.randn(2, sq, h, d, generator=gen).to(dtype)
    backends.reset_launch_counts()
    out = aotriton_rocm.flash_attn_func(q, k, v, softmax_scale=scale, causal=causal,
                                        window_size=window)
    assert out.shape == q.shape and out.dtype == dtype
    out.backward(g)
    counts = backends.launch_counts()
    assert counts[("interpreter:cpu", "attn_fwd")] == 1
    assert counts[("interpreter:cpu", "attn_bwd_dkdv")] == 1
    t = lambda x: x.detach().transpose(1, 2)  # noqa: E731
    ref.check_all({"out": t(out), "dq": t(q.grad), "dk": t(k.grad), "dv": t(v.grad)},
                  t(q), t(k), t(v), t(g), scale=scale, causal=causal, window=window)


def test_flash_attn_func_without_grad():
    q = torch.randn(1, 9, 2, 16).half()
    out = aotriton_rocm.flash_attn_func(q, q, q, causal=True)
    assert not out.requires_grad
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    ref.check_all({"out": t(out)}, t(q), t(q), t(q), causal=True)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(dropout_p=0.1), NotImplementedError, "dropout_p=0.1 is not supported yet.*supported:"),
    (dict(return_attn_probs=True), NotImplementedError, "return_attn_probs=True"),
])
def test_flash_attn_func_refuses_what_it_does_not_support(kwargs, error, match):
    q = torch.randn(1, 8, 1, 16).half()
    with pytest.raises(error, match=match):
        aotriton_rocm.flash_attn_func(q, q, q, **kwargs)


@pytest.mark.parametrize("q,k,match", [
    (torch.randn(1, 8, 1, 16).double(), torch.randn(1, 8, 1, 16).double(), "dtype"),
    (torch.randn(1, 8, 1, 12).half(), torch.randn(1, 8, 1, 12).half(), "head_dim 12"),
    (torch.randn(1, 8, 3, 16).half(), torch.randn(1, 8, 2, 16).half(), "multiple of key/value"),
    (torch.randn(8, 1, 16).half(), torch.randn(8, 1, 16).half(), "4-D"),
])
def test_flash_attn_func_says_why_not(q, k, match):
    with pytest.raises(ValueError, match=match):
        aotriton_rocm.flash_attn_func(q, k, k)
