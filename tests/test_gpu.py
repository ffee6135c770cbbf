"""The precompiled kernels on a real GPU (the H100 via the sm_90 target, or an
AMD GPU). Skipped without a GPU or without an installed image for its arch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import aotriton_rocm
from aotriton_rocm import backends, device, images, smoke

pytestmark = pytest.mark.gpu

if not device.gpu_available():
    pytest.skip("no GPU visible to torch", allow_module_level=True)
if device.arch_of(torch.cuda.current_device()) not in images.find_archives():
    pytest.skip("no kernel image installed for this GPU's arch", allow_module_level=True)


@pytest.fixture
def enabled():
    aotriton_rocm.enable()
    backends.reset_launch_counts()
    yield
    aotriton_rocm.disable()


@pytest.mark.parametrize("case", smoke.gpu_cases(quick=True), ids=lambda c: c.label())
def test_sdpa_matches_math_on_gpu(enabled, case):
    result = smoke.run_case(case, torch.device("cuda"), torch.Generator("cuda").manual_seed(3))
    assert result.passed, (result.errors, result.tolerances, result.note)
    assert result.backend.startswith("aot:")


@pytest.mark.parametrize("seqlen", [5, 129, 300])
def test_odd_seqlens_and_views(enabled, seqlen):
    q = torch.randn(2, seqlen, 4, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(2, 4, seqlen, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, 6, seqlen, 128, device="cuda", dtype=torch.bfloat16)[:, 1:5]
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    assert backends.launch_counts()[(f"aot:{device.arch_of(0)}", "attn_fwd")] == 1
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=0)


def test_torch_compile_matches_eager(enabled):
    q, k, v = (torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.float16) for _ in range(3))

    def attn(q, k, v):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    eager = attn(q, k, v)
    compiled = torch.compile(attn)(q, k, v)
    torch.testing.assert_close(compiled, eager, atol=0, rtol=0)


def test_dropout_falls_back_to_torch(enabled):
    q = torch.randn(1, 2, 64, 64, device="cuda", dtype=torch.float16)
    with pytest.warns(UserWarning, match="dropout"):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    assert not backends.launch_counts()
