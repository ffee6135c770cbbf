"""Hypothesis fuzz on the GPU: shapes, GQA ratios, head dims, strided views,
causal and sliding windows, softmax scales, fp16/bf16, through flash-attn's
API on our precompiled kernels (the C library), forward and backward judged
against the float32 math reference with PyTorch's tolerance model.
Derandomized; AOTRITON_GPU_FUZZ_EXAMPLES sets the number of cases (default
40). The CPU suite fuzzes the same kernel sources through the interpreter
(tests/core/test_features_interpreter.py, tests/kernels/test_kernels_interpreter.py)."""

from __future__ import annotations

import os

import pytest
import torch

from aotriton_rocm.core import backends

pytestmark = pytest.mark.gpu

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from support import attn_reference as ref  # noqa: E402
from aotriton_rocm import flash_attn_func  # noqa: E402

EXAMPLES = int(os.environ.get("AOTRITON_GPU_FUZZ_EXAMPLES", "40"))


@st.composite
def problems(draw):
    hk = draw(st.integers(1, 3))
    return dict(
        dtype=draw(st.sampled_from([torch.float16, torch.bfloat16])),
        b=draw(st.integers(1, 3)), hk=hk, h=hk * draw(st.integers(1, 3)),
        sq=draw(st.integers(1, 300)), sk=draw(st.integers(1, 300)),
        d=8 * draw(st.integers(1, 32)),
        causal=draw(st.booleans()),
        window=(draw(st.sampled_from([-1, 0, 3, 64])), draw(st.sampled_from([-1, 0, 5, 100]))),
        scale=draw(st.sampled_from([None, 0.05, 0.3])),
        layout=draw(st.sampled_from(["bshd", "bhsd_view", "padded_rows"])),
    )


def _make(shape_bshd, dtype, layout, gen):
    b, s, h, d = shape_bshd
    if layout == "bhsd_view":  # (B, H, S, D) storage seen as (B, S, H, D): strided
        return torch.randn(b, h, s, d, device="cuda", dtype=dtype, generator=gen).transpose(1, 2)
    if layout == "padded_rows":  # rows 8 elements longer than the head dim
        full = torch.randn(b, s, h, d + 8, device="cuda", dtype=dtype, generator=gen)
        return full[..., :d]
    return torch.randn(b, s, h, d, device="cuda", dtype=dtype, generator=gen)


@settings(max_examples=EXAMPLES, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(p=problems())
def test_fuzz_against_the_math_reference(p):
    gen = torch.Generator(device="cuda").manual_seed(p["sq"] * 1000 + p["sk"])
    q = _make((p["b"], p["sq"], p["h"], p["d"]), p["dtype"], p["layout"], gen)
    k, v = (_make((p["b"], p["sk"], p["hk"], p["d"]), p["dtype"], p["layout"], gen)
            for _ in range(2))
    do = torch.randn(p["b"], p["sq"], p["h"], p["d"], device="cuda", dtype=p["dtype"],
                     generator=gen)
    qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
    backends.reset_launch_counts()
    out = flash_attn_func(qg, kg, vg, softmax_scale=p["scale"], causal=p["causal"],
                          window_size=p["window"])
    out.backward(do)
    assert sum(n for (name, _), n in backends.launch_counts().items()
               if name.startswith("aot:")) == 4, "our kernels did not run"
    t = lambda x: x.transpose(1, 2)  # noqa: E731  (the reference is (B, H, S, D))
    window = p["window"]
    # flash-attn's normalisation: a window past every key is unbounded
    window = tuple(-1 if w >= p["sk"] else w for w in window)
    ref.check_all({"out": t(out.detach()), "dq": t(qg.grad), "dk": t(kg.grad), "dv": t(vg.grad)},
                  t(q), t(k), t(v), t(do), scale=p["scale"], causal=p["causal"], window=window,
                  alignment="bottom_right")
