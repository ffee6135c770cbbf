"""Dropout draws follow torch's CUDA generator, on a real GPU (the H100 via
the sm_90 target): each op takes the generator's seed and offset and
advances the offset exactly as torch's own kernels do (checked against
torch's kernels on the same calls); torch's
test_mem_efficient_attention_vs_math_ref_grads dropout contract
(``manual_seed(42)``, the op, the mask regenerated from (42, 0), output and
gradients against the math reference with that mask, also with an
attn_mask); under CUDA-graph capture replays draw new masks (bit-identical
at p = 0), the returned seed/offset are the replay's, and the whole-graph
increment equals torch's. Skipped without a GPU or an installed image for
its arch."""

from __future__ import annotations

import pytest
import torch

import aotriton_rocm
from aotriton_rocm.core import philox_state
from aotriton_rocm.integrations import torch_integration as ti
from support.dmask_reference import check_like_torch
from support.gpu import ours as _ours

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("enabled")]


EFF = torch.ops.aten._scaled_dot_product_efficient_attention
FLASH = torch.ops.aten._scaled_dot_product_flash_attention
MATH = torch.ops.aten._scaled_dot_product_attention_math
FUDGE = {"out": 6.0 if torch.version.hip else 3.0, "dq": 110.0, "dk": 8.0,
         "dv": 6.0 if torch.version.hip else 3.0}


def _gen():
    return torch.cuda.default_generators[torch.cuda.current_device()]


def _rand(*shape, dtype=torch.float16, seed=0):
    gen = torch.Generator("cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", generator=gen).to(dtype)


def _calls(q, k, v, p):
    """(seed, offset) each op used and the generator's offset after it."""
    torch.manual_seed(42)
    seen = []
    _, _, seed, offset = EFF(q, k, v, None, False, dropout_p=p)
    seen.append((seed.item(), offset.item(), _gen().get_offset()))
    outs = FLASH(q, k, v, p)
    seed, offset = ti._rng_inputs(outs[6], outs[7])
    seen.append((seed.item(), offset.item(), _gen().get_offset()))
    return seen


def test_ops_take_and_advance_the_generator_as_torchs_kernels_do():
    b, h, sq, sk, d, p = 2, 3, 33, 47, 64, 0.3
    q = _rand(b, h, sq, d, seed=1)
    k, v = _rand(b, h, sk, d, seed=2), _rand(b, h, sk, d, seed=3)
    eff_step = philox_state.round4(b * h * sq * sk)
    flash_step = philox_state.round4(32 * b * h)
    ours = _calls(q, k, v, p)
    assert _ours("attn_fwd") == 2
    assert ours == [(42, 0, eff_step), (42, eff_step, eff_step + flash_step)]
    aotriton_rocm.disable()
    try:
        torchs = _calls(q, k, v, p)
    except RuntimeError as exc:
        pytest.skip(f"torch's own kernels do not take these calls here: {exc}")
    finally:
        aotriton_rocm.enable()
    assert [o for *_, o in torchs] == [o for *_, o in ours]


def test_flash_attn_func_takes_the_generator_state():
    b, s, h, d, p = 2, 40, 3, 32, 0.2
    q, k, v = (_rand(b, s, h, d, seed=i) for i in range(3))
    torch.manual_seed(9)
    aotriton_rocm.flash_attn_func(q, k, v, dropout_p=p)
    assert _gen().get_offset() == philox_state.round4(b * h * s * s)


def _regenerated(b, h, sq, sk, p, seed, offset):
    mask = torch.empty((b, h, sq, sk), device="cuda", dtype=torch.float32)
    filled = torch._fill_mem_eff_dropout_mask_(mask, p, seed, offset)
    return (filled > (0.0 if torch.version.hip else p)).to(torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("b,sq,sk,d,causal,p,with_mask", [
    (1, 4, 4, 8, False, 0.22, False), (8, 143, 587, 72, False, 0.48, False),
    (1, 256, 1024, 128, True, 0.22, False), (8, 64, 64, 32, False, 0.48, True),
    (1, 143, 256, 64, False, 0.22, True),
])
def test_mem_efficient_attention_vs_math_ref_grads_dropout(dtype, b, sq, sk, d, causal, p,
                                                           with_mask):
    # torch's test: the mask comes from (42, 0), the generator's state after
    # manual_seed(42), not from the op's outputs.
    h = 4
    q = torch.rand(b, h, sq, d, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.rand(b, h, sk, d, device="cuda", dtype=dtype, requires_grad=True)
    v = torch.rand(b, h, sk, d, device="cuda", dtype=dtype, requires_grad=True)
    mask = torch.rand(b, h, sq, sk, device="cuda", dtype=dtype) if with_mask else None
    torch.manual_seed(42)
    out, _, seed, offset = EFF(q, k, v, mask, True, dropout_p=p, is_causal=causal)
    assert _ours("attn_fwd") == 1
    assert (seed.item(), offset.item()) == (42, 0)
    torch.manual_seed(42)
    drop = _regenerated(b, h, sq, sk, p, 42, 0)
    upstream = torch.rand_like(out)
    grads = torch.autograd.grad(out, (q, k, v), upstream)
    golden_dtype = torch.float64 if dtype == torch.float32 else torch.float32
    refs = {}
    for dt in (golden_dtype, dtype):
        qr, kr, vr = (t.detach().to(dt).requires_grad_(True) for t in (q, k, v))
        o = MATH(qr, kr, vr, None if mask is None else mask.to(dt), dropout_p=p,
                 is_causal=causal, dropout_mask=drop)[0]
        refs[dt] = (o, *torch.autograd.grad(o, (qr, kr, vr), upstream.to(dt)))
    for name, got, g, lp in zip(("out", "dq", "dk", "dv"), (out, *grads), refs[golden_dtype],
                                refs[dtype]):
        check_like_torch(got.detach(), g.detach(), lp.detach(), FUDGE[name])


def _graph(op, q, k, v, p, rand_first):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        op(q, k, v, p)  # warm-up
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        if rand_first:
            torch.rand_like(q)  # a non-zero offset inside the graph
        outs = op(q, k, v, p)
    return graph, outs


def _eff(q, k, v, p):
    out, _, seed, offset = EFF(q, k, v, None, True, dropout_p=p)
    return out, seed, offset


def _flash(q, k, v, p):
    outs = FLASH(q, k, v, p)
    return (outs[0], *ti._rng_inputs(outs[6], outs[7]))


@pytest.mark.parametrize("op", [_eff, _flash])
@pytest.mark.parametrize("p", [0.0, 0.3])
def test_graph_replays(op, p):
    b, h, s, d = 2, 4, 256, 64
    q, k, v = (_rand(b, h, s, d, seed=i) for i in range(3))
    torch.manual_seed(42)
    graph, (out, seed, offset) = _graph(op, q, k, v, p, rand_first=True)
    graph.replay()
    first = out.clone()
    graph.replay()
    if p == 0.0:
        assert torch.equal(first, out)
        return
    assert not torch.equal(first, out)
    assert seed.item() == _gen().initial_seed()
    if op is _eff:  # torch's cudagraph test regenerates from the replay's outputs
        mask = _regenerated(b, h, s, s, p, seed.item(), offset.item())
        golden = MATH(q.float(), k.float(), v.float(), dropout_p=p, dropout_mask=mask)[0]
        lp = MATH(q, k, v, dropout_p=p, dropout_mask=mask)[0]
        check_like_torch(out, golden, lp, FUDGE["out"])


@pytest.mark.parametrize("op,count", [(_eff, lambda b, h, s: b * h * s * s),
                                      (_flash, lambda b, h, s: 32 * b * h)])
def test_graph_state_is_the_replays_and_advances_like_torch(op, count):
    b, h, s, d, p = 2, 3, 129, 64, 0.3
    q, k, v = (_rand(b, h, s, d, seed=i) for i in range(3))
    torch.manual_seed(42)
    graph, (_, seed, offset) = _graph(op, q, k, v, p, rand_first=False)
    before = _gen().get_offset()
    graph.replay()
    torch.cuda.synchronize()
    assert (seed.item(), offset.item()) == (42, before)
    assert _gen().get_offset() == before + philox_state.round4(count(b, h, s))
