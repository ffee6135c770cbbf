"""The fallback to torch's own kernel on torch 2.5-2.8, which has no
``torch.library.get_kernel``: the SDPA-level CUDA ops fall back to the
lower-level op torch's kernel itself calls. Checked against torch's own meta
kernels (shapes, strides, dtypes: what torch.compile checks) and through the
real dispatcher; bit-for-bit against torch's CUDA kernels in test_gpu.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from aotriton_rocm.core import backends
from aotriton_rocm.integrations import torch_integration as ti

META = torch.device("meta")


def _layout(x):
    if isinstance(x, torch.Tensor):
        return tuple(x.shape), x.stride(), x.dtype
    return x


def _same_layouts(ours, torchs):
    assert [_layout(x) for x in ours] == [_layout(x) for x in torchs]


def _qkv(sq=17, sk=9, d=64, dtype=torch.float16, device=META):
    q = torch.empty(2, 3, sq, d, dtype=dtype, device=device)
    k = torch.empty(2, 3, sk, d, dtype=dtype, device=device)
    return q, k, torch.empty_like(k)


@pytest.mark.parametrize("dropout_p,causal,debug", [(0.0, False, False), (0.2, True, True)])
def test_flash_by_subop_lays_out_like_torch(dropout_p, causal, debug):
    q, k, v = _qkv()
    ours = ti._flash_by_subop(q, k, v, dropout_p, causal, debug, scale=0.1)
    torchs = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, causal,
                                                                debug, scale=0.1)
    _same_layouts(ours, torchs)
    grads = ti._flash_bwd_by_subop(torch.empty_like(ours[0]), q, k, v, ours[0], ours[1],
                                   *ours[2:6], dropout_p, causal, *ours[6:8], scale=0.1)
    torch_grads = torch.ops.aten._scaled_dot_product_flash_attention_backward(
        torch.empty_like(torchs[0]), q, k, v, torchs[0], torchs[1], *torchs[2:6], dropout_p,
        causal, *torchs[6:8], scale=0.1)
    _same_layouts(grads, torch_grads)


@pytest.mark.parametrize("with_bias", [False, True])
def test_efficient_by_subop_lays_out_like_torch(with_bias):
    # (torch's meta kernel of _efficient_attention_backward lacks its `out`
    # argument, so the backward is compared on the GPU only.)
    q, k, v = _qkv(dtype=torch.float32)
    bias = torch.empty(2, 1, 17, 9, device=META) if with_bias else None
    ours = ti._efficient_by_subop(q, k, v, bias, True, 0.1, True, scale=0.1)
    torchs = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, bias, True, 0.1,
                                                                    True, scale=0.1)
    _same_layouts(ours, torchs)


@pytest.fixture
def without_get_kernel(monkeypatch):
    """This torch as torch 2.5-2.8 see it: no torch.library.get_kernel."""
    monkeypatch.delattr(torch.library, "get_kernel", raising=False)
    overrides = ti._Overrides(cpu=True)
    backends.reset_launch_counts()
    yield overrides
    overrides.remove()


def test_old_torch_route_falls_back_through_the_dispatcher(without_get_kernel):
    # Meta tensors at the CUDA key: our override runs, finds no backend for
    # them, and hands the call to _flash_attention_forward (its meta kernel).
    q, k, v = _qkv()
    op = torch.ops.aten._scaled_dot_product_flash_attention.default
    cuda = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)
    with pytest.warns(UserWarning, match="no backend for device meta"):
        out = op.redispatch(cuda, q, k, v, 0.0, False, False)
    _same_layouts(out, op(q, k, v))
    assert not backends.launch_counts()


def test_old_torch_route_leaves_ops_it_cannot_fall_back_from(without_get_kernel):
    assert set(without_get_kernel._orig) == {ti._FLASH, ti._FLASH_BWD, ti._EFF, ti._EFF_BWD,
                                             ti._CPU_FLASH, ti._CPU_FLASH_BWD}


def test_old_torch_cpu_route_runs_covered_calls_and_refuses_the_rest(without_get_kernel):
    pytest.importorskip("triton", reason="the CPU backend runs kernels in Triton's interpreter")
    q = torch.randn(1, 2, 16, 32, dtype=torch.float16)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = F.scaled_dot_product_attention(q, q, q)
    assert backends.launch_counts()[("interpreter:cpu", "attn_fwd")] == 1
    ref = F.scaled_dot_product_attention(q.float(), q.float(), q.float())
    assert (out.float() - ref).abs().max() < 2e-3
    odd = torch.randn(1, 1, 8, 520, dtype=torch.float16)  # head dim 520: not covered
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), \
            pytest.raises(NotImplementedError, match="head_dim 520.*aotriton_rocm.disable"):
        F.scaled_dot_product_attention(odd, odd, odd)


def test_enable_accepts_the_old_torch_lines():
    from aotriton_rocm.core import torch_compat
    for version in ("2.5.1", "2.6.0", "2.7.1", "2.8.0"):
        torch_compat.check_torch(version)  # raises if the line does not list it
