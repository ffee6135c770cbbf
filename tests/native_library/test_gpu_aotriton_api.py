"""libaotriton_v2 (AOTriton's C++ API over libaotriton_rocm) on the GPU: the
consumer of test_aotriton_api.py (aotriton_api/consumer/consumer.cpp, a C++
program calling the API the way PyTorch does), built against an
AOTRITON_INSTALLED_PREFIX-style prefix whose lib/aotriton.images/ holds the
installed image of the GPU, computes forward and backward like the float32
math reference: permuted (B, S, H, D) views, both causal alignments, a
window, GQA, bias and its gradient, dropout (checked through the debug mask
it returns, and under CUDA-graph capture), compact varlen, staged layouts,
deterministic backward, a value head dim of its own; on the 0.14 line every
VarlenBits mode PyTorch and Transformer Engine pass (packed, seqused_k,
strided) with the logsumexp as (heads, tokens) and as (tokens, heads); and a
consumer built against the 0.13 headers linked to the 0.14 library
("0.13@0.14": its params versions 3/6 translated).

Head dims 40 and 72 (multiples of 8 but not of 16: staged by the layer),
100 (not a multiple of 8: run by the core on zero-padded copies), 160 and 512.
Skips without a GPU, cmake or a C++ compiler, or an image for the GPU."""

from __future__ import annotations

import math
import shutil
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "aotriton_api"))

from aotriton_rocm.core import device  # noqa: E402
from aotriton_rocm.common import images  # noqa: E402
from consumer_abi import (ACQUIRED_DQ_ACC, HIP_NOT_SUPPORTED, HIP_SUCCESS, Consumer,  # noqa: E402
                          make_case)
from test_aotriton_api import LINES, _run  # noqa: E402

pytestmark = pytest.mark.gpu(image=False)  # the archive fixture names what is missing

B, SQ, SK, HQ, HK = 2, 128, 192, 4, 2


@pytest.fixture(scope="module")
def archive():
    arch = device.arch_of(torch.cuda.current_device())
    path = images.find_archives().get(arch)
    if path is None:
        pytest.skip(f"no aotriton-rocm image for {arch}")
    return arch, path


@pytest.fixture(scope="module", params=sorted(LINES) + ["0.13@0.14"])
def api(request, native_build, archive, tmp_path_factory):
    """(the headers' line, the consumer built against them); "0.13@0.14": the
    0.13 headers, linked to the 0.14 library."""
    line, lib_line = (request.param.split("@") + [request.param])[:2]
    version = LINES[lib_line][0]
    if not shutil.which("c++") and not shutil.which("g++"):
        pytest.skip("needs a C++ compiler")
    inst = tmp_path_factory.mktemp("install")
    _run(["cmake", "--install", native_build, "--prefix", inst])
    p = tmp_path_factory.mktemp(f"prefix-{line}")
    (p / "lib" / "aotriton.images").mkdir(parents=True)
    name = f"libaotriton_v2.so.{version}"
    shutil.copy2(inst / "lib" / "aotriton_api" / lib_line / name, p / "lib" / name)
    (p / "lib" / "libaotriton_v2.so").symlink_to(name)
    shutil.copytree(inst / "include" / "aotriton_api" / line, p / "include")
    arch, path = archive
    # where PyTorch's build copies the images: beside the library
    (p / "lib" / "aotriton.images" / f"{arch}.aotr").symlink_to(path)
    build = tmp_path_factory.mktemp(f"consumer-{line}")
    _run(["cmake", "-S", HERE / "aotriton_api" / "consumer", "-B", build,
          f"-DAOTRITON_INSTALLED_PREFIX={p}", "-DCMAKE_BUILD_TYPE=Release"])
    _run(["cmake", "--build", build])
    return line, Consumer(build / "libaotriton_api_consumer.so", device="cuda")


def _stream():
    return torch.cuda.current_stream().cuda_stream


def reference(q, k, v, *, scale, mask=None, window=(-1, -1), bias=None, keep=None, p=0.0,
              dtype=torch.float32):
    """Attention of (B, S, H, D) tensors in `dtype` (GQA by repetition):
    out (B, Sq, H, D) and the natural-log lse (B, H, Sq)."""
    qf, kf, vf = (x.to(dtype).transpose(1, 2) for x in (q, k, v))
    rep = qf.shape[1] // kf.shape[1]
    kf, vf = kf.repeat_interleave(rep, 1), vf.repeat_interleave(rep, 1)
    s = (qf @ kf.transpose(-1, -2)) * scale
    if bias is not None:
        s = s + bias.to(dtype)
    sq, sk = s.shape[-2:]
    i = torch.arange(sq, device=s.device)[:, None]
    j = torch.arange(sk, device=s.device)[None, :]
    shift = 0 if mask == "top_left" else sk - sq
    if mask in ("bottom_right", "top_left"):
        s = s.masked_fill(j > i + shift, -math.inf)
    elif mask == "window":
        left, right = window
        allowed = torch.ones_like(s, dtype=torch.bool)
        if left >= 0:
            allowed &= j >= i + shift - left
        if right >= 0:
            allowed &= j <= i + shift + right
        s = s.masked_fill(~allowed, -math.inf)
    lse = torch.logsumexp(s.float(), -1)
    prob = torch.softmax(s.float(), -1).to(dtype)
    if keep is not None:
        prob = prob * keep / (1 - p)
    return (prob @ vf).transpose(1, 2), lse


def _grads(q, k, v, dout, **kw):
    leaves = [x.detach().float().requires_grad_() for x in (q, k, v)]
    extra = {}
    if kw.get("bias") is not None:
        extra["bias"] = kw.pop("bias").detach().float().requires_grad_()
    out, _ = reference(*leaves, **kw, **extra)
    out.backward(dout.float())
    return [x.grad for x in leaves] + ([extra["bias"].grad] if extra else [])


def _close(name, test, ref, lp=None, fudge=8.0):
    err = (test.float() - ref.float()).abs().max().item()
    ref_err = (lp.float() - ref.float()).abs().max().item() if lp is not None else 1e-3
    assert not test.float().isnan().any(), f"{name}: NaN"
    assert err <= max(2e-3, fudge * ref_err), f"{name}: max error {err:.3g} (ref {ref_err:.3g})"


def _inputs(d, dtype=torch.float16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, SQ, HQ, d, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(B, SK, HK, d, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(B, SK, HK, d, device="cuda", dtype=dtype, generator=g)
    return q, k, v


@pytest.mark.parametrize("d", [40, 72, 100, 160, 512])
@pytest.mark.parametrize("mask,window", [(None, (-1, -1)), ("bottom_right", (-1, -1)),
                                         ("top_left", (-1, -1)), ("window", (32, 8))])
def test_forward_backward(api, d, mask, window):
    line, c = api
    q, k, v = _inputs(d)
    scale = 1 / math.sqrt(d)
    out = torch.empty_like(q)
    lse = torch.empty(B * HQ, SQ, device="cuda")
    rc = c.forward(make_case(mask=mask, window=window, scale=scale, q=q, k=k, v=v, out=out, lse=lse),
                   _stream())
    assert rc == HIP_SUCCESS
    kw = dict(scale=scale, mask=mask, window=window)
    ref, ref_lse = reference(q, k, v, **kw)
    lp, _ = reference(q, k, v, dtype=torch.float16, **kw)
    _close("out", out, ref, lp)
    torch.testing.assert_close(lse.view(B, HQ, SQ), ref_lse, atol=2e-3, rtol=1e-3)

    dout = torch.randn_like(q)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    rc = c.backward(make_case(mask=mask, window=window, scale=scale, q=q, k=k, v=v, out=out, lse=lse,
                              dout=dout, dq=dq, dk=dk, dv=dv), _stream())
    assert rc & 0xFFFFF == HIP_SUCCESS
    for name, test, want in zip(("dq", "dk", "dv"), (dq, dk, dv), _grads(q, k, v, dout, **kw)):
        _close(name, test, want, fudge=16.0)


@pytest.mark.parametrize("d", [72, 160])
def test_bias_and_its_gradient(api, d):
    """The efficient op's call: a (B, H, Sq, Sk) bias, its gradient DB in a
    16-aligned allocation sliced to Sk, causal from the top left."""
    line, c = api
    q, k, v = _inputs(d, seed=1)
    scale = 1 / math.sqrt(d)
    bias = torch.randn(B, HQ, SQ, SK, device="cuda", dtype=q.dtype)
    out, lse = torch.empty_like(q), torch.empty(B * HQ, SQ, device="cuda")
    case = make_case(mask="top_left", scale=scale, q=q, k=k, v=v, out=out, lse=lse, bias=bias)
    assert c.forward(case, _stream()) == HIP_SUCCESS
    ref, _ = reference(q, k, v, scale=scale, mask="top_left", bias=bias)
    _close("out", out, ref)
    dout = torch.randn_like(q)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dbias = torch.empty(B, HQ, SQ, -(-SK // 16) * 16 + 16, device="cuda", dtype=q.dtype)[..., :SK]
    rc = c.backward(make_case(mask="top_left", scale=scale, q=q, k=k, v=v, out=out, lse=lse,
                              bias=bias, dout=dout, dq=dq, dk=dk, dv=dv, dbias=dbias), _stream())
    assert rc & 0xFFFFF == HIP_SUCCESS
    want = _grads(q, k, v, dout, scale=scale, mask="top_left", bias=bias)
    for name, test, w in zip(("dq", "dk", "dv", "dbias"), (dq, dk, dv, dbias), want):
        _close(name, test, w, fudge=16.0)


def test_dropout_through_the_debug_mask(api):
    """dropout_p 0.2 with int64 seed/offset device scalars; the debug mask
    says which elements were kept; forward and backward match the reference
    with that mask; the simulated draws give the same mask."""
    line, c = api
    d, p = 72, 0.2
    q, k, v = _inputs(d, seed=2)
    scale = 1 / math.sqrt(d)
    seed = torch.tensor(1234, dtype=torch.int64, device="cuda")
    offset = torch.tensor(4096, dtype=torch.int64, device="cuda")
    out, lse = torch.empty_like(q), torch.empty(B * HQ, SQ, device="cuda")
    dmask = torch.empty(B, HQ, SQ, SK, device="cuda", dtype=q.dtype)
    rc = c.forward(make_case(scale=scale, dropout_p=p, q=q, k=k, v=v, out=out, lse=lse, seed=seed,
                             offset=offset, encoded_softmax=dmask), _stream())
    assert rc == HIP_SUCCESS
    keep = (dmask >= 0).float()
    assert 0.7 < keep.mean().item() < 0.9
    ref, _ = reference(q, k, v, scale=scale, keep=keep, p=p)
    _close("out", out, ref)
    dout = torch.randn_like(q)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    rc = c.backward(make_case(scale=scale, dropout_p=p, q=q, k=k, v=v, out=out, lse=lse, seed=seed,
                              offset=offset, dout=dout, dq=dq, dk=dk, dv=dv), _stream())
    assert rc & 0xFFFFF == HIP_SUCCESS
    for name, test, w in zip(("dq", "dk", "dv"), (dq, dk, dv),
                             _grads(q, k, v, dout, scale=scale, keep=keep, p=p)):
        _close(name, test, w, fudge=16.0)
    r = torch.empty(B, HQ, SQ, SK, device="cuda")
    rc = c.simulate(r, p, seed, offset, _stream())
    if rc == HIP_NOT_SUPPORTED:
        pytest.skip("this image has no dropout_uniform kernel")
    assert rc == HIP_SUCCESS
    assert torch.equal(r >= 0, keep.bool())


def _recorded_forward(c, case):
    """A CUDA graph of the consumer's forward of `case` (check_gpu inside the
    capture, as PyTorch calls it), after one run on a side stream that loads
    the modules (a capture cannot load them)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        assert c.forward(case, _stream()) == HIP_SUCCESS
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        assert c.check_gpu(_stream()) == HIP_SUCCESS
        rc = c.forward(case, _stream())
    assert rc == HIP_SUCCESS
    return graph


def test_dropout_under_graph_capture(api):
    """PyTorch's graph-safe RNG state: the seed and the graph's base offset
    are device scalars each replay refills, the call's offset within the
    graph is philox_offset2. Every replay draws at base + offset2, returns
    that state in the philox outputs, and matches the reference with the
    mask the simulated draws give for it."""
    line, c = api
    d, p, intra = 64, 0.2, 96
    q, k, v = _inputs(d, seed=3)
    scale = 1 / math.sqrt(d)
    seed = torch.tensor(1234, dtype=torch.int64, device="cuda")
    base = torch.tensor(0, dtype=torch.int64, device="cuda")
    seed_out, offset_out = (torch.zeros((), dtype=torch.int64, device="cuda") for _ in range(2))
    out, lse = torch.empty_like(q), torch.empty(B * HQ, SQ, device="cuda")
    case = make_case(scale=scale, dropout_p=p, q=q, k=k, v=v, out=out, lse=lse, seed=seed,
                     offset=base, philox_offset2=intra, seed_output=seed_out,
                     offset_output=offset_out)
    graph = _recorded_forward(c, case)
    outs = []
    for b in (4096, 8192):
        base.fill_(b)
        graph.replay()
        torch.cuda.synchronize()
        assert (seed_out.item(), offset_out.item()) == (1234, b + intra)
        r = torch.empty(B, HQ, SQ, SK, device="cuda")
        used = torch.tensor(b + intra, dtype=torch.int64, device="cuda")
        assert c.simulate(r, p, seed, used, _stream()) == HIP_SUCCESS
        keep = (r >= 0).float()
        ref, _ = reference(q, k, v, scale=scale, keep=keep, p=p)
        _close("out", out, ref)
        outs.append(out.clone())
    assert not torch.equal(outs[0], outs[1]), "a replay at another base draws another mask"


@pytest.mark.parametrize("max_k", [100, 0])  # 0: what PyTorch's efficient op passes
def test_compact_varlen(api, max_k):
    line, c = api
    d = 72
    cu_q = torch.tensor([0, 50, 128], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 64, 164], dtype=torch.int32, device="cuda")
    q = torch.randn(128, HQ, d, device="cuda", dtype=torch.float16)
    k = torch.randn(164, HK, d, device="cuda", dtype=torch.float16)
    v = torch.randn(164, HK, d, device="cuda", dtype=torch.float16)
    out = torch.empty_like(q)
    # 0.11: (batch * heads, max_seqlen_q) padded per sequence; 0.12 on: (heads, total)
    lse = torch.empty(2 * HQ, 78, device="cuda") if line == "0.11" else torch.empty(HQ, 128, device="cuda")
    scale = 1 / math.sqrt(d)
    case = dict(mask="bottom_right", scale=scale, max_seqlen=(78, max_k), q=q, k=k, v=v, out=out,
                lse=lse, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    assert c.forward(make_case(**case), _stream()) == HIP_SUCCESS
    dout = torch.randn_like(q)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    rc = c.backward(make_case(**case, dout=dout, dq=dq, dk=dk, dv=dv), _stream())
    assert rc & 0xFFFFF == HIP_SUCCESS
    for b in range(2):
        sq, sk = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        qb, kb, vb = q[sq][None], k[sk][None], v[sk][None]
        ref, _ = reference(qb, kb, vb, scale=scale, mask="bottom_right")
        _close(f"out[{b}]", out[sq][None], ref)
        want = _grads(qb, kb, vb, dout[sq][None], scale=scale, mask="bottom_right")
        for name, test, w in zip(("dq", "dk", "dv"), (dq[sq], dk[sk], dv[sk]), want):
            _close(f"{name}[{b}]", test[None], w, fudge=16.0)


def test_staged_layouts_and_deterministic_backward(api):
    """Rows of 72 + 8 elements (no 16-element alignment): the library stages
    them; deterministic=1 gives bitwise-equal gradients (0.12 on)."""
    line, c = api
    d = 72
    buf = torch.randn(B, SQ, HQ * d + 8, device="cuda", dtype=torch.float16)
    q = buf[..., : HQ * d].view(B, SQ, HQ, d)
    _, k, v = _inputs(d, seed=3)
    obuf = torch.zeros(B, SQ, HQ * d + 8, device="cuda", dtype=torch.float16)
    out = obuf[..., : HQ * d].view(B, SQ, HQ, d)
    lse = torch.empty(B * HQ, SQ, device="cuda")
    scale = 1 / math.sqrt(d)
    assert c.forward(make_case(mask="bottom_right", scale=scale, q=q, k=k, v=v, out=out, lse=lse),
                     _stream()) == HIP_SUCCESS
    ref, _ = reference(q, k, v, scale=scale, mask="bottom_right")
    _close("out", out, ref)
    assert bool((obuf[..., HQ * d:] == 0).all())
    dout = torch.randn_like(q)
    results = []
    for _ in range(2):
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        rc = c.backward(make_case(mask="bottom_right", scale=scale, deterministic=True, q=q, k=k, v=v,
                                  out=out, lse=lse, dout=dout, dq=dq, dk=dk, dv=dv), _stream())
        assert rc & 0xFFFFF == HIP_SUCCESS
        if line != "0.11":
            assert not rc & ACQUIRED_DQ_ACC
        results.append((dq, dk, dv))
    if line != "0.11":
        assert all(torch.equal(a, b) for a, b in zip(*results))
    for name, test, w in zip(("dq", "dk", "dv"), results[0],
                             _grads(q, k, v, dout, scale=scale, mask="bottom_right")):
        _close(name, test, w, fudge=16.0)


def test_gpu_queries(api):
    line, c = api
    assert c.experimental(_stream()) == 0
    # the installed image covers every call PyTorch admits (any head dim 1..512)
    assert c.check_gpu(_stream()) == HIP_SUCCESS


@pytest.mark.parametrize("d,dv", [(72, 40), (64, 128)])
def test_value_head_dim_of_its_own(api, d, dv):
    """V (and Out, dO, dV) with a head dim other than Q/K's (the efficient
    op's call since AOTriton 0.12): run by the core at the larger one."""
    line, c = api
    q, k, _ = _inputs(d, seed=4)
    v = torch.randn(B, SK, HK, dv, device="cuda", dtype=q.dtype)
    scale = 1 / math.sqrt(d)
    out = torch.empty(B, SQ, HQ, dv, device="cuda", dtype=q.dtype)
    lse = torch.empty(B * HQ, SQ, device="cuda")
    case = dict(mask="bottom_right", scale=scale, q=q, k=k, v=v, out=out, lse=lse)
    assert c.forward(make_case(**case), _stream()) == HIP_SUCCESS
    ref, _ = reference(q, k, v, scale=scale, mask="bottom_right")
    _close("out", out, ref)
    dout = torch.randn_like(out)
    dq, dk, dvv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    rc = c.backward(make_case(**case, dout=dout, dq=dq, dk=dk, dv=dvv), _stream())
    assert rc & 0xFFFFF == HIP_SUCCESS
    for name, test, w in zip(("dq", "dk", "dv"), (dq, dk, dvv),
                             _grads(q, k, v, dout, scale=scale, mask="bottom_right")):
        _close(name, test, w, fudge=16.0)


@pytest.mark.parametrize("lse_th", [False, True])
@pytest.mark.parametrize("mode", ["packed", "seqused_k", "strided"])
def test_varlen_bits_modes(api, mode, lse_th):
    """The 0.14 line's VarlenBits as PyTorch's aotriton_adapter.h builds them
    (packed 0x0B0B, seqused_k 0x150B) and as Transformer Engine passes
    cu_seqlens_padded (strided 0x1313), the logsumexp (heads, tokens) or
    (tokens, heads): forward and backward per sequence against the float32
    reference; rows outside every sequence keep what they held."""
    line, c = api
    if line != "0.14":
        pytest.skip("VarlenBits: the 0.14 line")
    d, sentinel = 72, 7.0
    lens_q, lens_k = [50, 78], [64, 100]
    dev = dict(device="cuda", dtype=torch.int32)
    cu_q = torch.tensor([0, 50, 128], **dev)
    if mode == "strided":          # each sequence in a slot with padding after it
        starts_q, starts_k = torch.tensor([0, 60], **dev), torch.tensor([0, 80], **dev)
        rows_q, rows_k = 140, 190
        extra = dict(cu_seqlens_k=torch.tensor([0, 64, 164], **dev), seq_starts_q=starts_q,
                     seq_starts_k=starts_k)
    elif mode == "seqused_k":      # K's slots of 80 and 110 rows, of which lens_k are keys
        starts_q, starts_k = cu_q[:-1], torch.tensor([0, 80], **dev)
        rows_q, rows_k = 128, 190
        extra = dict(cu_seqlens_k=torch.tensor([0, 80, 190], **dev),
                     seqused_k=torch.tensor(lens_k, **dev))
    else:
        starts_q, starts_k = cu_q[:-1], torch.tensor([0, 64], **dev)
        rows_q, rows_k = 128, 164
        extra = dict(cu_seqlens_k=torch.tensor([0, 64, 164], **dev))
    q = torch.randn(rows_q, HQ, d, device="cuda", dtype=torch.float16)
    k = torch.randn(rows_k, HK, d, device="cuda", dtype=torch.float16)
    v = torch.randn(rows_k, HK, d, device="cuda", dtype=torch.float16)
    out = torch.full_like(q, sentinel)
    lse_buf = torch.full((rows_q, HQ) if lse_th else (HQ, rows_q), sentinel, device="cuda")
    lse = lse_buf.t() if lse_th else lse_buf          # (heads, tokens) either way
    scale = 1 / math.sqrt(d)
    case = dict(mask="bottom_right", scale=scale, max_seqlen=(78, 0), q=q, k=k, v=v, out=out,
                lse=lse, cu_seqlens_q=cu_q, varlen_mode=mode, lse_th=lse_th, **extra)
    assert c.forward(make_case(**case), _stream()) == HIP_SUCCESS
    dout = torch.randn_like(q)
    dq, dk, dv = (torch.full_like(x, sentinel) for x in (q, k, v))
    rc = c.backward(make_case(**case, dout=dout, dq=dq, dk=dk, dv=dv), _stream())
    assert rc & 0xFFFFF == HIP_SUCCESS
    inside_q = torch.zeros(rows_q, dtype=torch.bool, device="cuda")
    inside_k = torch.zeros(rows_k, dtype=torch.bool, device="cuda")
    for b in range(2):
        sq = slice(int(starts_q[b]), int(starts_q[b]) + lens_q[b])
        sk = slice(int(starts_k[b]), int(starts_k[b]) + lens_k[b])
        inside_q[sq], inside_k[sk] = True, True
        qb, kb, vb = q[sq][None], k[sk][None], v[sk][None]
        ref, ref_lse = reference(qb, kb, vb, scale=scale, mask="bottom_right")
        _close(f"out[{b}]", out[sq][None], ref)
        torch.testing.assert_close(lse[:, sq], ref_lse[0], atol=2e-3, rtol=1e-3)
        want = _grads(qb, kb, vb, dout[sq][None], scale=scale, mask="bottom_right")
        for name, test, w in zip(("dq", "dk", "dv"), (dq[sq], dk[sk], dv[sk]), want):
            _close(f"{name}[{b}]", test[None], w, fudge=16.0)
    assert bool((out[~inside_q] == sentinel).all()) and bool((dq[~inside_q] == sentinel).all())
    assert bool((lse[:, ~inside_q] == sentinel).all())
    if mode != "packed":
        assert bool((dk[~inside_k] == sentinel).all()) and bool((dv[~inside_k] == sentinel).all())


def test_seqused_k_under_graph_capture(api):
    """PyTorch's seqused_k (0x150B) recorded in a CUDA graph, as a decode
    loop records it: every replay reads the key counts of that moment (they
    grow between replays) and matches the float32 reference; nothing
    synchronises, so the capture holds."""
    line, c = api
    if line != "0.14":
        pytest.skip("VarlenBits: the 0.14 line")
    d = 64
    dev = dict(device="cuda", dtype=torch.int32)
    cu_q, cu_k = torch.tensor([0, 3, 7], **dev), torch.tensor([0, 96, 224], **dev)
    used = torch.tensor([40, 9], **dev)
    q = torch.randn(7, HQ, d, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(224, HK, d, device="cuda", dtype=torch.float16) for _ in range(2))
    out, lse = torch.empty_like(q), torch.empty(HQ, 7, device="cuda")
    scale = 1 / math.sqrt(d)
    case = make_case(mask="bottom_right", scale=scale, max_seqlen=(4, 128), q=q, k=k, v=v, out=out,
                     lse=lse, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, seqused_k=used,
                     varlen_mode="seqused_k")
    graph = _recorded_forward(c, case)
    for lens in ([40, 9], [41, 10], [96, 128]):
        used.copy_(torch.tensor(lens, **dev))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for b, (q0, q1) in enumerate(((0, 3), (3, 7))):
            k0 = int(cu_k[b])
            kb, vb = (t[k0:k0 + lens[b]][None] for t in (k, v))
            ref, _ = reference(q[q0:q1][None], kb, vb, scale=scale, mask="bottom_right")
            _close(f"out[{b}] with {lens}", out[q0:q1][None], ref)
