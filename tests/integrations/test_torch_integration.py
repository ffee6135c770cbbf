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
from aotriton_rocm.core import backends
from aotriton_rocm.commands import smoke
from aotriton_rocm.integrations import torch_integration

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
    # head dims that are not the kernels' tile widths (masked head dim)
    smoke.Case(torch.bfloat16, 8, True, 19, batch=1, heads=2),
    smoke.Case(torch.float16, 24, False, 9, batch=2, heads=1),
    smoke.Case(torch.float16, 72, True, 21, batch=1, heads=2),
    smoke.Case(torch.bfloat16, 96, False, 17, batch=1, heads=1, scale=0.2),
    smoke.Case(torch.float16, 160, True, 12, batch=1, heads=1),
    smoke.Case(torch.bfloat16, 200, False, 10, batch=1, heads=1),
    smoke.Case(torch.float16, 256, True, 9, batch=1, heads=1),
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
    ({"attn_mask": torch.randn(8, 8)}, (1, 2, 8, 64), torch.float16, "attn_mask dtype"),
    ({}, (1, 2, 8, 64), torch.float64, "dtype"),
    ({}, (1, 2, 8, 520), torch.float16, "head_dim"),
])
def test_uncovered_requests_fall_back_with_reason(enabled, kwargs, shape, dtype, reason):
    torch_integration._warned.clear()
    q = torch.randn(shape, dtype=dtype, requires_grad=True)
    if not hasattr(torch.library, "get_kernel"):  # torch < 2.9: no CPU kernel to fall back to
        with pytest.raises(NotImplementedError, match=f"{reason}.*aotriton_rocm.disable"):
            _flash(q, q, q, **kwargs)
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = _flash(q, q, q, **kwargs)
        out.sum().backward()
    assert not backends.launch_counts(), "torch's kernel must have run"
    messages = [str(w.message) for w in caught if "aotriton-rocm" in str(w.message)]
    assert messages and reason in messages[0], messages
    mask = kwargs.get("attn_mask")
    ref = _math(attn_mask=None if mask is None else mask.float())(q.float(), q.float(), q.float())
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


def test_rng_layout_is_torchs_meta_kernels():
    """The flash op's RNG-state layout we assume is what torch's own meta
    kernel returns in this build."""
    q = torch.empty((1, 1, 1, 8), dtype=torch.float16, device="meta")
    outs = torch.ops.aten._scaled_dot_product_flash_attention(q, q, q, 0.0, False, False)
    assert torch_integration._rng_layout() == tuple((tuple(t.shape), t.dtype) for t in outs[6:8])


def test_non_contiguous_inputs(enabled):
    # (B, S, H, D) storage viewed as (B, H, S, D), and a head-sliced view.
    base = torch.randn(2, 19, 6, 64, dtype=torch.float16)
    q = base.transpose(1, 2)
    k = torch.randn(2, 19, 6, 64, dtype=torch.float16).transpose(1, 2)
    v = torch.randn(2, 8, 19, 64, dtype=torch.float16)[:, 1:7]
    out = _flash(q, k, v, is_causal=True)
    ref = _math(is_causal=True)(q.float(), k.float(), v.float())
    assert backends.launch_counts()[("interpreter:cpu", "attn_fwd")] == 1
    torch.testing.assert_close(out.float(), ref, atol=3e-3, rtol=0)


def test_autoload_hook_never_raises(monkeypatch):
    from aotriton_rocm import _autoload

    monkeypatch.setenv("AOTRITON_ROCM_ENABLE", "0")
    _autoload.autoload()
    assert not aotriton_rocm.is_enabled()


def test_smoke_command_cpu_mode_passes():
    # no kernel image is installed here: only the sources are checked, which
    # smoke fails unless told that is intended
    proc = subprocess.run([sys.executable, "-m", "aotriton_rocm.commands.smoke", "--device", "cpu",
                           "--quick", "--no-images-ok"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Triton's interpreter" in proc.stdout
    assert "2 passed, 0 failed" in proc.stdout


# --- causal with seqlen_q != seqlen_k, GQA: judged like smoke.run_case -------------

def _fwd_bwd(fn, q, k, v, grad):
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    out = fn(q, k, v)
    out.backward(grad)
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def _judge(fn_ours, fn_ref, shapes, dtype, seed=0):
    """PyTorch's model: golden = fn_ref in fp32 on the rounded inputs, lp_ref =
    fn_ref in `dtype`; ours within max(1e-5, fudge * |golden - lp_ref|), no
    NaN where golden has none."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v, grad = (torch.randn(s, generator=gen).to(dtype) for s in shapes)
    golden = _fwd_bwd(fn_ref, *(t.float() for t in (q, k, v, grad)))
    lp_ref = _fwd_bwd(fn_ref, q, k, v, grad)
    ours = _fwd_bwd(fn_ours, q, k, v, grad)
    for name, g in golden.items():
        test = ours[name].float()
        assert not (torch.isnan(test).any() and not torch.isnan(g).any()), name
        err = (g - test).abs().max().item()
        tol = max(smoke.ABS_FLOOR, smoke.FUDGE[name] * (g - lp_ref[name].float()).abs().max().item())
        assert err <= tol, f"{name}: {err:.3e} > {tol:.3e}"
    return ours


def _math(**kw):
    def fn(q, k, v):
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v, **kw)
    return fn


@pytest.mark.parametrize("sq,sk", [(5, 17), (17, 5), (33, 70), (1, 9)])
def test_sdpa_causal_non_square_matches_math(enabled, sq, sk):
    # On CPU, F.sdpa(is_causal=True) with Sq != Sk reaches torch's CPU flash op,
    # whose causal mask (like the math backend's) is aligned top-left.
    _judge(lambda q, k, v: _flash(q, k, v, is_causal=True), _math(is_causal=True),
           [(1, 2, sq, 64), (1, 2, sk, 64), (1, 2, sk, 64), (1, 2, sq, 64)], torch.float16)
    assert backends.launch_counts()[("interpreter:cpu", "attn_fwd")] == 1
    assert backends.launch_counts()[("interpreter:cpu", "attn_bwd_dkdv")] == 1


@pytest.mark.parametrize("sq,sk", [(5, 17), (17, 5), (33, 70)])
def test_bottom_right_causal_matches_causal_lower_right(sq, sk):
    # torch's CUDA flash op (what causal_lower_right calls) means bottom-right:
    # our override of it, run here on CPU tensors, against torch's math
    # backend with the causal_lower_right bias. Rows that see no key (Sq > Sk)
    # are 0 in both, with zero gradients.
    from torch.nn.attention.bias import causal_lower_right

    def ours(q, k, v):
        out = torch_integration._Overrides._flash_fwd(None, None, q, k, v, 0.0, True)[0]
        return _FlashBwd.apply(q, k, v, out)

    def ref(q, k, v):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "will produce NaNs when seq_len_q > seq_len_kv"
            bias = causal_lower_right(q.shape[2], k.shape[2])
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)

    res = _judge(ours, ref, [(1, 2, sq, 40), (1, 2, sk, 40), (1, 2, sk, 40), (1, 2, sq, 40)],
                 torch.bfloat16, seed=sq)
    if sq > sk:
        assert (res["out"][:, :, : sq - sk] == 0).all() and (res["dq"][:, :, : sq - sk] == 0).all()


class _FlashBwd(torch.autograd.Function):
    """Autograd around our override of the CUDA flash op pair (on CPU tensors)."""

    @staticmethod
    def forward(ctx, q, k, v, _out):
        out, lse = torch_integration._Overrides._flash_fwd(None, None, q, k, v, 0.0, True)[:2]
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = torch_integration._Overrides._flash_bwd(
            None, None, grad.contiguous(), q, k, v, out, lse, None, None, q.shape[2], k.shape[2],
            0.0, True, None, None)
        return dq, dk, dv, None


@pytest.mark.parametrize("dtype,mask_shape,mask_dtype", [
    (torch.float16, (2, 1, 13, 21), torch.float16),  # additive, broadcast over heads
    (torch.bfloat16, (13, 21), torch.bool),           # boolean, broadcast over batch and heads
    (torch.float32, (2, 3, 13, 21), torch.float32),
])
def test_sdpa_attn_mask_on_the_cpu_op_matches_math(enabled, dtype, mask_shape, mask_dtype):
    gen = torch.Generator().manual_seed(len(mask_shape))
    mask = (torch.rand(mask_shape, generator=gen) > 0.2 if mask_dtype == torch.bool
            else torch.randn(mask_shape, generator=gen).to(mask_dtype))
    def masked(sdpa):
        # golden and low-precision reference get the mask in their own dtype
        return lambda q, k, v: sdpa(q, k, v, attn_mask=mask if mask.dtype == torch.bool
                                    else mask.to(q.dtype))

    _judge(masked(_flash), masked(lambda q, k, v, **kw: _math(**kw)(q, k, v)),
           [(2, 3, 13, 40), (2, 3, 21, 40), (2, 3, 21, 40), (2, 3, 13, 40)], dtype)
    assert backends.launch_counts()[("interpreter:cpu", "attn_fwd")] == 1


@pytest.mark.parametrize("h,hk,causal", [(4, 2, False), (6, 1, True), (4, 1, False)])
def test_sdpa_gqa_matches_math(enabled, h, hk, causal):
    # torch 2.13 sends enable_gqa=True calls to the CPU flash op with Hq != Hkv.
    try:
        _flash(*(torch.zeros(1, n, 4, 32, dtype=torch.float16) for n in (h, hk, hk)),
               enable_gqa=True)
    except RuntimeError as exc:
        if "No available kernel" not in str(exc):
            raise
        pytest.skip(f"torch {torch.__version__} sends no GQA call to the CPU flash op")
    backends.reset_launch_counts()
    _judge(lambda q, k, v: _flash(q, k, v, is_causal=causal, enable_gqa=True),
           _math(is_causal=causal, enable_gqa=True),
           [(2, h, 13, 32), (2, hk, 13, 32), (2, hk, 13, 32), (2, h, 13, 32)], torch.float16)
    assert backends.launch_counts()[("interpreter:cpu", "attn_fwd")] == 1


def test_direct_api_gqa_bottom_right_and_head_dim_80():
    # attention.forward/backward directly (the future flash-attn style API).
    from aotriton_rocm.core import attention

    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            out, lse = attention.forward(q, k, v, is_causal=True)
            ctx.save_for_backward(q, k, v, out, lse)
            return out

        @staticmethod
        def backward(ctx, grad):
            q, k, v, out, lse = ctx.saved_tensors
            return attention.backward(grad, q, k, v, out, lse, is_causal=True)

    def ref(q, k, v):
        sq, sk = q.shape[2], k.shape[2]
        mask = torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq)
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)

    q = torch.randn(1, 4, 11, 80, dtype=torch.float16)
    k = torch.randn(1, 2, 23, 80, dtype=torch.float16)
    assert attention.unsupported_reason(q, k, k, is_causal=True) is None
    _judge(Fn.apply, ref, [(1, 4, 11, 80), (1, 2, 23, 80), (1, 2, 23, 80), (1, 4, 11, 80)],
           torch.float16)
