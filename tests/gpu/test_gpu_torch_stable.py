"""The torch extension (libaotriton_rocm_torch, torch >= 2.10) on the GPU:
SDPA through the C++ kernels matches the float32 math reference, the
kernels provably ran (launch counts) without the Python route, and dropout
takes the Python route. Needs a GPU, AOTRITON_ROCM_TORCH_LIB (the built
extension, with libaotriton_rocm.so.<ABI> beside it, e.g. a cmake build of
native/ with -DAOTR_BUILD_TORCH=ON) and an archive for the GPU
(AOTRITON_ROCM_ARCHIVE_DIR). Prints per-call times with -s."""

from __future__ import annotations

import os
import time

import pytest

torch = pytest.importorskip("torch")
if not os.environ.get("AOTRITON_ROCM_TORCH_LIB"):
    pytest.skip("set AOTRITON_ROCM_TORCH_LIB to a built libaotriton_rocm_torch.so",
                allow_module_level=True)

import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from aotriton_rocm.integrations import torch_integration  # noqa: E402
from aotriton_rocm.core import torch_native  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture
def cpp_route():
    if not torch_integration.has_registry():
        pytest.skip("torch has no flash-attention registry (torch < 2.10)")
    torch_integration.enable()
    try:
        if not torch_native.is_active():
            pytest.fail("enable() did not activate the C++ route (see its warning)")
        yield
    finally:
        torch_integration.disable()


def _ref(q, k, v, causal, mask=None):
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask,
                                          is_causal=causal)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_flash_sdpa_runs_the_cpp_kernels(cpp_route, dtype, causal):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 8, 256, 64, device="cuda", dtype=dtype, requires_grad=True)
               for _ in range(3))
    launches, fallbacks = torch_native.launch_count(), torch_native.fallback_count()
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        out.backward(torch.ones_like(out))
    torch.cuda.synchronize()
    assert torch_native.launch_count() - launches == 4  # fwd, bwd preprocess, dkdv, dq
    assert torch_native.fallback_count() == fallbacks
    ref = _ref(q, k, v, causal)
    tol = 2e-2 if dtype == torch.float16 else 5e-2
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    ref.backward(torch.ones_like(ref))
    for g, t in zip(grads, (q, k, v)):
        torch.testing.assert_close(g.float(), t.grad.float(), atol=5 * tol, rtol=5 * tol)


def test_efficient_sdpa_with_a_mask_runs_the_cpp_kernels(cpp_route):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 128, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    mask = torch.randn(1, 4, 1, 128, device="cuda", dtype=torch.float16)
    launches, fallbacks = torch_native.launch_count(), torch_native.fallback_count()
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.cuda.synchronize()
    assert torch_native.launch_count("attn_fwd") >= 1
    assert torch_native.launch_count() > launches and torch_native.fallback_count() == fallbacks
    torch.testing.assert_close(out.float(), _ref(q, k, v, False, mask.float()), atol=2e-2,
                               rtol=2e-2)


def test_dropout_takes_the_python_route(cpp_route):
    q, k, v = (torch.randn(1, 2, 128, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    fallbacks = torch_native.fallback_count()
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.2)
    assert out.shape == q.shape and torch.isfinite(out).all()
    assert torch_native.fallback_count() == fallbacks + 1


def _per_call_us(fn, n=2000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def test_print_per_call_times_of_a_tiny_call():
    if not torch_integration.has_registry():
        pytest.skip("torch < 2.10")
    q = torch.randn(1, 1, 16, 64, device="cuda", dtype=torch.float16)

    def call():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            F.scaled_dot_product_attention(q, q, q)

    times = {"torch": _per_call_us(call)}
    for name, env in (("cpp", "1"), ("python", "0")):
        os.environ[torch_native.NATIVE_ENV] = env
        torch_integration.enable()
        try:
            assert torch_native.is_active() == (env == "1")
            times[name] = _per_call_us(call)
        finally:
            torch_integration.disable()
            os.environ.pop(torch_native.NATIVE_ENV, None)
    print("\nper-call us (tiny flash SDPA):", {k: round(v, 1) for k, v in times.items()})
