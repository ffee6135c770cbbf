"""SDPA through torch's real dispatcher with our implementation active, on the
CPU (kernel sources in Triton's interpreter), judged against torch's math
backend with PyTorch's tolerance model."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import aotriton_rocm
from aotriton_rocm import backends, smoke, torch_integration

pytest.importorskip("triton", reason="the CPU backend runs kernels in Triton's interpreter")


@pytest.fixture
def enabled():
    aotriton_rocm.enable(cpu_interpreter=True)
    backends.reset_launch_counts()
    yield
    aotriton_rocm.disable()


def _flash(q, k, v, **kw):
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, **kw)


@pytest.mark.parametrize("case", [
    smoke.Case(torch.float16, 64, False, 17, batch=2, heads=2),
    smoke.Case(torch.bfloat16, 64, True, 45, batch=1, heads=2),
    smoke.Case(torch.float16, 128, True, 3, batch=1, heads=1, scale=0.3),
    smoke.Case(torch.bfloat16, 128, False, 66, batch=1, heads=1),
], ids=lambda c: c.label())
def test_sdpa_forward_backward_matches_math(enabled, case):
    result = smoke.run_case(case, torch.device("cpu"), torch.Generator().manual_seed(1))
    assert result.passed, (result.errors, result.tolerances, result.note)
    assert result.backend == "interpreter:cpu"


def test_registry_activation_routes_to_our_kernels(monkeypatch):
    if not torch_integration.has_registry():
        pytest.skip("torch < 2.10 has no flash attention registry")
    monkeypatch.setenv(torch_integration.CPU_ENV, "1")
    assert torch_integration.IMPL_NAME in torch.nn.attention.list_flash_attention_impls()
    torch.nn.attention.activate_flash_attention_impl(torch_integration.IMPL_NAME)
    try:
        backends.reset_launch_counts()
        q = torch.randn(1, 1, 8, 64, dtype=torch.float16)
        _flash(q, q, q)
        assert backends.launch_counts()[("interpreter:cpu", "attn_fwd")] == 1
    finally:
        torch.nn.attention.restore_flash_attention_impl()
    backends.reset_launch_counts()
    _flash(q, q, q)
    assert not backends.launch_counts(), "restore must give torch's kernel back"


def test_not_active_until_enabled():
    backends.reset_launch_counts()
    q = torch.randn(1, 1, 8, 64, dtype=torch.float16)
    _flash(q, q, q)
    assert not backends.launch_counts()


@pytest.mark.parametrize("kwargs,shape,dtype,reason", [
    # (torch's CPU selector never sends dropout to a flash kernel; the GPU test covers it)
    ({"attn_mask": torch.randn(8, 8).half()}, (1, 2, 8, 64), torch.float16, "attn_mask"),
    ({}, (1, 2, 8, 64), torch.float32, "dtype"),
    ({}, (1, 2, 8, 32), torch.float16, "head_dim"),
])
def test_uncovered_requests_fall_back_with_reason(enabled, kwargs, shape, dtype, reason):
    torch_integration._warned.clear()
    q = torch.randn(shape, dtype=dtype, requires_grad=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = _flash(q, q, q, **kwargs)
        out.sum().backward()
    assert not backends.launch_counts(), "torch's kernel must have run"
    messages = [str(w.message) for w in caught if "aotriton-rocm" in str(w.message)]
    assert messages and reason in messages[0], messages
    mask = kwargs.get("attn_mask")
    ref = F.scaled_dot_product_attention(q.float(), q.float(), q.float(),
                                         attn_mask=None if mask is None else mask.float())
    torch.testing.assert_close(out.float(), ref, atol=2e-3, rtol=2e-3)


def test_outputs_match_torch_meta_contract(enabled):
    q, k, v = (torch.randn(2, 3, 20, 64, dtype=torch.bfloat16) for _ in range(3))
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)
    assert backends.launch_counts()[("interpreter:cpu", "attn_fwd")] == 1
    meta = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        *(t.to("meta") for t in (q, k, v)), 0.0, True)
    for ours, theirs in zip((out, lse), meta):
        assert ours.shape == theirs.shape and ours.stride() == theirs.stride()
        assert ours.dtype == theirs.dtype
    grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        torch.randn_like(out), q, k, v, out, lse, 0.0, True)
    meta_grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        *(t.to("meta") for t in (out, q, k, v, out, lse)), 0.0, True)
    for ours, theirs in zip(grads, meta_grads):
        assert ours.shape == theirs.shape and ours.stride() == theirs.stride()


def test_non_contiguous_inputs(enabled):
    # (B, S, H, D) storage viewed as (B, H, S, D), and a head-sliced view.
    base = torch.randn(2, 19, 6, 64, dtype=torch.float16)
    q = base.transpose(1, 2)
    k = torch.randn(2, 19, 6, 64, dtype=torch.float16).transpose(1, 2)
    v = torch.randn(2, 8, 19, 64, dtype=torch.float16)[:, 1:7]
    out = _flash(q, k, v, is_causal=True)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    assert backends.launch_counts()[("interpreter:cpu", "attn_fwd")] == 1
    torch.testing.assert_close(out.float(), ref, atol=3e-3, rtol=0)


def test_autoload_hook_never_raises(monkeypatch):
    from aotriton_rocm import _autoload

    monkeypatch.setenv("AOTRITON_ROCM_ENABLE", "0")
    _autoload.autoload()
    assert not aotriton_rocm.is_enabled()


def test_smoke_command_cpu_mode_passes():
    proc = subprocess.run([sys.executable, "-m", "aotriton_rocm.smoke", "--device", "cpu",
                           "--quick"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Triton's interpreter" in proc.stdout
    assert "2 passed, 0 failed" in proc.stdout
