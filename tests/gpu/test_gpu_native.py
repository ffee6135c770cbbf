"""libaotriton_rocm on the GPU: the native launch path computes exactly what
the Python launch path computes (same kernels, same configs: bit for bit)
and matches the float32 math reference. Needs a GPU, a built library
(AOTRITON_ROCM_NATIVE_LIB) and an archive for the GPU (AOTRITON_ROCM_ARCHIVE_DIR)."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
if not os.environ.get("AOTRITON_ROCM_NATIVE_LIB"):
    pytest.skip("set AOTRITON_ROCM_NATIVE_LIB to a built libaotriton_rocm", allow_module_level=True)

from aotriton_rocm.core import attention, device, native  # noqa: E402
from aotriton_rocm.common import images  # noqa: E402

pytestmark = pytest.mark.gpu(image=False)  # the runtime fixture finds the archive


@pytest.fixture(scope="module")
def runtime():
    rt = native.Runtime()
    arch = device.arch_of(torch.cuda.current_device())
    path = images.find_archives().get(arch)
    if path is None:
        pytest.skip(f"no archive for {arch}")
    rt.add_archive(path)
    return rt


def _padded_like(t):
    """Uninitialised, shaped like t, rows padded to 16 elements (the layout
    the kernels read in place; attention.fresh_like does the same)."""
    d = t.shape[-1]
    return torch.empty((*t.shape[:-1], -(-d // 16) * 16), dtype=t.dtype, device=t.device)[..., :d]


def _fwd(rt, q, k, v, *, causal, scale, rng=None, dropout_p=0.0):
    out = _padded_like(q)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    p = native.FwdParams()
    p.device = q.device.index
    p.stream = torch.cuda.current_stream().cuda_stream
    p.problem = native.make_problem(q, k, v, scale=scale, causal=causal, rng=rng,
                                    dropout_p=dropout_p)
    p.out, p.lse = native.tensor_view(out), native.tensor_view(lse)
    native.check(rt.fwd(p))
    return out, lse


def _bwd(rt, do, q, k, v, out, lse, *, causal, scale, rng=None, dropout_p=0.0):
    grads = [_padded_like(t) for t in (q, k, v)]
    delta = torch.empty_like(lse)
    p = native.BwdParams()
    p.device = q.device.index
    p.stream = torch.cuda.current_stream().cuda_stream
    p.problem = native.make_problem(q, k, v, scale=scale, causal=causal, rng=rng,
                                    dropout_p=dropout_p)
    for name, t in (("out", out), ("lse", lse), ("grad_out", do), ("grad_q", grads[0]),
                    ("grad_k", grads[1]), ("grad_v", grads[2]), ("delta", delta)):
        setattr(p, name, native.tensor_view(t))
    native.check(rt.bwd(p))
    return grads


CASES = [  # dtype, B, Hq, Hkv, Sq, Sk, D, causal
    (torch.float16, 2, 4, 4, 128, 128, 64, False),
    (torch.float16, 1, 8, 2, 211, 333, 128, True),
    (torch.bfloat16, 3, 2, 1, 1, 700, 64, False),
    (torch.bfloat16, 2, 3, 3, 1024, 1024, 128, True),
    (torch.float16, 1, 2, 2, 77, 77, 120, False),   # masked head dim
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_native_equals_python_path_and_reference(runtime, case):
    dtype, b, h, hk, sq, sk, d, causal = case
    g = torch.Generator(device="cuda").manual_seed(sq * 31 + d)
    q, k, v, do = (_padded_like(torch.empty(shape, device="cuda", dtype=dtype)).copy_(
        torch.randn(shape, device="cuda", dtype=dtype, generator=g))
        for shape in ((b, h, sq, d), (b, hk, sk, d), (b, hk, sk, d), (b, h, sq, d)))
    scale = d ** -0.5
    before = runtime.launch_count()
    out, lse = _fwd(runtime, q, k, v, causal=causal, scale=scale)
    grads = _bwd(runtime, do, q, k, v, out, lse, causal=causal, scale=scale)
    assert runtime.launch_count() - before == 4
    ref_out, ref_lse = attention.forward(q, k, v, is_causal=causal, scale=scale)
    ref_grads = attention.backward(do, q, k, v, ref_out, ref_lse, is_causal=causal, scale=scale)
    torch.cuda.synchronize()
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    for a, r in zip(grads, ref_grads):
        assert torch.equal(a, r)
    # and against float32 math (bottom-right causal, as the flash op)
    qf, kf, vf = (t.float().detach().requires_grad_() for t in (q, k, v))
    kr, vr = (t.repeat_interleave(h // hk, dim=1) for t in (kf, vf))
    mask = None
    if causal:
        mask = torch.ones(sq, sk, dtype=torch.bool, device="cuda").tril(sk - sq)
    gold = torch.nn.functional.scaled_dot_product_attention(qf, kr, vr, attn_mask=mask, scale=scale)
    rows = mask.any(-1) if mask is not None else torch.ones(sq, dtype=torch.bool, device="cuda")
    gold = torch.where(rows[:, None], gold, 0)
    assert (out.float() - gold).abs().max().item() < 2e-2


def test_native_dropout_equals_python_path(runtime):
    q, k, v = (torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    rng = attention.new_rng_state(q.device)
    seed, offset = rng[0], rng[1]
    out, lse = _fwd(runtime, q, k, v, causal=False, scale=0.125, rng=(seed, offset), dropout_p=0.3)
    ref_out, ref_lse = attention.forward(q, k, v, scale=0.125, dropout_p=0.3, rng=(seed, offset))
    torch.cuda.synchronize()
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)


def test_native_refuses_a_layout_it_cannot_read(runtime):
    q = torch.randn(1, 2, 64, 72, device="cuda", dtype=torch.float16)[..., :64]  # row stride 72
    k = v = torch.randn(1, 2, 64, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(native.NativeError) as e:
        _fwd(runtime, q, k, v, causal=False, scale=0.125)
    assert e.value.status == native.NEEDS_LAYOUT and "q does not meet" in e.value.message
