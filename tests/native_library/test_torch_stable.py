"""libaotriton_rocm_torch (native/torch/), the torch >= 2.10 fast path, on a
CPU-only machine: how it is built and linked, that activation puts its
kernels on the dispatcher and deactivation takes them off, and the C++
kernels themselves on the CPU key (activated there for the test) over a real
archive with the stub driver: they launch what the Python route launches,
lay their outputs out as torch's meta kernels do, and hand dropout and
whatever they do not cover to aotriton_rocm::py_<op>."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from aotriton_rocm.core import attention, backends, kvcache, native, torch_native  # noqa: E402
from aotriton_rocm.common import images  # noqa: E402
from aotriton_rocm.integrations import flash_attn_ops, torch_integration  # noqa: E402
from aotriton_rocm._version import ABI_VERSION  # noqa: E402
from aotriton_rocm.tooling.builder.archive_writer import write_archive  # noqa: E402

from stub_archive import (MANIFEST, assert_same_launches, decode, kernel_of, launches,  # noqa: E402
                          records as stub_records, stub_runtime)

EXPORTS = {"aotr_torch_activate", "aotr_torch_deactivate", "aotr_torch_is_active",
           "aotr_torch_last_error", "aotr_torch_launch_count", "aotr_torch_fallback_count"}
ATEN = ["aten::" + op for op in torch_native.ATEN_OPS]


def _tool(name):
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} (binutils) is not installed")
    return path


def _out(*cmd) -> str:
    return subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout


@pytest.fixture
def ext(torch_ext, native_build, monkeypatch):
    monkeypatch.setenv(torch_native.ENV_VAR, str(torch_ext))
    monkeypatch.setenv(native.ENV_VAR, str(native_build / f"libaotriton_rocm.so.{ABI_VERSION}"))
    yield torch_ext
    torch_native.deactivate()


# ------------------------------------------------------------------ build


def test_exports_only_its_entry_points_and_needs_no_libtorch(torch_ext, native_build):
    defined = _out(_tool("nm"), "-D", "--defined-only", torch_ext).split()
    assert {s for s in defined if s.startswith("aotr_")} == EXPORTS
    assert not [s for s in defined if re.fullmatch(r"[_A-Za-z]\w*", s) and s not in EXPORTS
                and len(s) > 1]
    dynamic = _out(_tool("readelf"), "-d", torch_ext)
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", dynamic)
    assert f"libaotriton_rocm.so.{ABI_VERSION}" in needed
    assert not [n for n in needed if "torch" in n or "c10" in n], needed
    assert re.search(r"\(RUNPATH\)\s+Library runpath: \[\$ORIGIN\]", dynamic)
    undefined = _out("nm", "-D", "--undefined-only", torch_ext)
    assert "aoti_torch_library_init_impl" in undefined and "torch_call_dispatcher" in undefined
    # loadable on manylinux_2_28 like libaotriton_rocm
    versions = set(re.findall(r"GLIBC_(\d+)\.(\d+)", _out(_tool("objdump"), "-T", torch_ext)))
    assert max((int(a), int(b)) for a, b in versions) <= (2, 28)
    # built for torch 2.10 with these (newer) headers
    flags = (native_build / "CMakeFiles").parent / "torch" / "CMakeFiles" / \
        "aotriton_rocm_torch.dir" / "flags.make"
    assert "TORCH_TARGET_VERSION=0x020a000000000000" in flags.read_text()


def test_loads_only_once_libtorch_is_global(torch_ext, native_build):
    # A fresh interpreter: import torch keeps libtorch_cpu local, so the
    # extension's aoti_torch_* symbols do not resolve until torch_native
    # promotes it; loading registers nothing.
    code = f"""
import ctypes, torch
try:
    ctypes.CDLL({str(torch_ext)!r})
    print("loaded-unpromoted")
except OSError as e:
    print("refused:", e)
from aotriton_rocm.core import torch_native
def dispatch():  # every key (a CUDA build has torch's own CUDA kernels)
    return [torch._C._dispatch_dump(op) for op in {ATEN!r}]
before = dispatch()
torch_native.load()
print("loaded, registrations unchanged:", dispatch() == before)
"""
    env = dict(os.environ, **{torch_native.ENV_VAR: str(torch_ext),
                              native.ENV_VAR: str(native_build / f"libaotriton_rocm.so.{ABI_VERSION}")})
    out = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True).stdout
    assert "refused:" in out and "undefined symbol: aoti_torch_" in out, out
    assert "loaded, registrations unchanged: True" in out, out


# ------------------------------------------------------- (de)activation


def _kernels_everywhere():
    return {op: (lambda keyset, *a, **k: None) for op in torch_native.OPS}


def _has(op, key):
    return torch._C._dispatch_has_kernel_for_dispatch_key(op, key)


def test_activate_and_deactivate_the_cuda_kernels_repeatedly(ext):
    import aotriton_rocm.integrations.flash_attn_ops  # noqa: F401  (defines flash-attn's operators)

    before = [_has(op, "CUDA") for op in ATEN]
    for _ in range(3):
        act = torch_native.activate(_kernels_everywhere(), rng_layout=torch_integration._rng_layout(),
                                    efficient_lse_align=32)
        assert torch_native.is_active() and act.active
        assert all(_has(op, "CUDA") for op in ATEN)
        for op in ATEN:
            assert "aotriton_rocm_torch.cpp" in torch._C._dispatch_dump(op)
            assert _has(op.replace("aten::", "aotriton_rocm::py_"), "CUDA")
        # ours too: flash-attn's forward operator, its Python route beside it
        assert "aotriton_rocm_torch.cpp" in torch._C._dispatch_dump("aotriton_rocm::flash_attn_forward")
        assert _has("aotriton_rocm::py_flash_attn_forward", "CUDA")
        act.remove()
        assert not torch_native.is_active()
        assert "aotriton_rocm_torch.cpp" not in torch._C._dispatch_dump("aotriton_rocm::flash_attn_forward")
        assert [_has(op, "CUDA") for op in ATEN] == before
        assert not any(_has(op.replace("aten::", "aotriton_rocm::py_"), "CUDA") for op in ATEN)
    # activating twice replaces; deactivate() clears
    torch_native.activate(_kernels_everywhere(), rng_layout=torch_integration._rng_layout(),
                          efficient_lse_align=32)
    torch_native.activate(_kernels_everywhere(), rng_layout=torch_integration._rng_layout(),
                          efficient_lse_align=32)
    torch_native.deactivate()
    assert [_has(op, "CUDA") for op in ATEN] == before


def test_refuses_a_schema_it_does_not_know(ext, monkeypatch):
    monkeypatch.setattr(torch_native, "_arg_kinds", lambda schema: "TT")
    with pytest.raises(RuntimeError, match="has a schema this library does not know"):
        torch_native.activate(_kernels_everywhere(), rng_layout=torch_integration._rng_layout(),
                              efficient_lse_align=32)
    assert not any(_has(op.replace("aten::", "aotriton_rocm::py_"), "CUDA") for op in ATEN)


# ------------------------------------------ the C++ kernels on the CPU key


def _stub_route(native_build, tmp_path, monkeypatch):
    """The stub driver's runtime over a real archive of the kernels' real
    argument lists, patched in as the Python route's backend (attention.py
    and kvcache.py through the ctypes binding); the activation's options."""
    stub_path = native_build / "tests" / "libaotr_stub_driver.so"
    monkeypatch.setenv("AOTR_STUB_CUDA_ARCH", "9.0")
    monkeypatch.setattr(native, "_lib", None)
    archive = tmp_path / "sm_90.aotr"
    recs = stub_records(bias=(False, True), dropout=(False, True))
    write_archive(archive, MANIFEST, recs)

    runtime = stub_runtime(stub_path, archive)
    monkeypatch.setattr(backends, "_native_runtime", lambda: runtime)
    monkeypatch.setattr(backends, "_added_archives", {str(archive)})
    monkeypatch.setattr(backends.AOTBackend, "_stream", lambda self: 0)
    monkeypatch.setattr(backends, "arch_of", lambda i: "sm_90")
    monkeypatch.setattr(images, "find_archives", lambda refresh=False: {"sm_90": archive})
    aot = backends.AOTBackend(0)
    monkeypatch.setattr(attention, "backend_for", lambda t: aot)
    monkeypatch.setattr(kvcache, "backend_for", lambda t: aot)
    monkeypatch.setattr(torch_native, "fallback_calls", {op: 0 for op in torch_native.OPS})
    options = dict(dispatch_key="CPU", python_keys=("CPU",), archives=[str(archive)],
                   driver_library=str(stub_path), backend=native.BACKEND_CUDA)
    return ctypes.CDLL(str(stub_path)), recs, options


@pytest.fixture
def cpu_route(ext, native_build, tmp_path, monkeypatch):
    """The C++ kernels on the CPU key over the stub driver, and the Python
    route (py_<op> on CPU) over the same archive and the same stub, which
    records both routes' launches."""
    stub, recs, options = _stub_route(native_build, tmp_path, monkeypatch)
    overrides = torch_integration._Overrides(cpu=False)  # the Python route's kernels
    kernels = {op.split("::")[1]: fn for op, fn in overrides.cuda_kernels().items()}
    torch_native.activate(kernels, rng_layout=torch_integration._rng_layout(),
                          efficient_lse_align=32, **options)
    stub.aotr_stub_reset()
    _launch_base[0] = torch_native.launch_count()
    yield stub, recs
    torch_native.deactivate()
    overrides.remove()


@pytest.fixture
def ours_route(ext, native_build, tmp_path, monkeypatch):
    """Our operators alone on the C++ kernels (CPU key, stub driver), as the
    first GPU call of one of them activates them without enable()."""
    stub, recs, options = _stub_route(native_build, tmp_path, monkeypatch)
    torch_native.activate(flash_attn_ops.PYTHON_ROUTES, aten=False, **options)
    stub.aotr_stub_reset()
    yield stub, recs
    torch_native.deactivate()


_launch_base = [0]  # the extension's launch count when the route was activated


def _cpp_launches() -> int:
    """Launches through the extension since the fixture activated it (its
    count covers every runtime it has had)."""
    return torch_native.launch_count() - _launch_base[0]


def _take(stub) -> list:
    """The launches recorded so far (and forget them)."""
    out = launches(stub)
    stub.aotr_stub_reset()
    return out


def _meta(t):
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def _same_layout(outs, meta_outs):
    assert len(outs) == len(meta_outs)
    for i, (o, m) in enumerate(zip(outs, meta_outs)):
        if isinstance(m, torch.Tensor):
            assert isinstance(o, torch.Tensor), i
            assert (o.shape, o.stride(), o.dtype) == (m.shape, m.stride(), m.dtype), i
        else:
            assert o == m, i


def _qkv(b, h, hk, sq, sk, d, bshd=False):
    def make(heads, s):
        if bshd:
            return torch.empty(b, s, heads, d, dtype=torch.float16)
        return torch.empty(b, heads, s, d, dtype=torch.float16)
    return make(h, sq), make(hk, sk), make(hk, sk)


SHAPES = [(2, 4, 4, 128, 128, 64), (1, 8, 2, 211, 333, 64)]
# torch's efficient-attention meta kernel shapes dK/dV with the query's heads:
# that op is never called with GQA shapes.
EFFICIENT_SHAPES = [(2, 4, 4, 128, 128, 64), (1, 8, 8, 211, 333, 64)]


@pytest.mark.parametrize("shape", EFFICIENT_SHAPES)
@pytest.mark.parametrize("causal", [False, True])
def test_efficient_ops_launch_what_the_python_route_launches(cpu_route, shape, causal):
    stub, records = cpu_route
    q, k, v = _qkv(*shape)
    args = (q, k, v, None, True, 0.0, causal)
    out, lse, seed, offset = torch.ops.aten._scaled_dot_product_efficient_attention(*args, scale=0.3)
    _same_layout((out, lse, seed, offset),
                 torch.ops.aten._scaled_dot_product_efficient_attention(
                     _meta(q), _meta(k), _meta(v), None, True, 0.0, causal, scale=0.3))
    do = torch.empty_like(out)
    bwd_args = (do, q, k, v, None, out, lse, seed, offset, 0.0, [True, True, True, False], causal)
    grads = torch.ops.aten._scaled_dot_product_efficient_attention_backward(*bwd_args, scale=0.3)
    meta_grads = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
        *(_meta(t) if isinstance(t, torch.Tensor) else t for t in bwd_args), scale=0.3)
    _same_layout(grads[:3], meta_grads[:3])
    assert grads[3] is None
    native_l = _take(stub)
    assert len(native_l) == 4 and _cpp_launches() == 4
    assert torch_native.fallback_count() == 0
    # the Python route on the same tensors
    attention.forward(q, k, v, is_causal=causal, scale=0.3, out=out, lse=lse,
                      causal_alignment="top_left")
    attention.backward(do, q, k, v, out, lse, is_causal=causal, scale=0.3, grads=grads[:3],
                       causal_alignment="top_left")
    assert_same_launches(_take(stub), native_l, records)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
def test_flash_ops_launch_what_the_python_route_launches(cpu_route, shape, causal):
    stub, records = cpu_route
    q, k, v = _qkv(*shape)
    outs = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False,
                                                              scale=0.3)
    meta = torch.ops.aten._scaled_dot_product_flash_attention(_meta(q), _meta(k), _meta(v), 0.0,
                                                              causal, False, scale=0.3)
    _same_layout([outs[i] for i in (0, 1, 4, 5, 6, 7, 8)], [meta[i] for i in (0, 1, 4, 5, 6, 7, 8)])
    assert outs[2] is None and outs[3] is None
    out, lse = outs[:2]
    do = torch.empty_like(out)
    bwd_args = (do, q, k, v, out, lse, None, None, q.size(2), k.size(2), 0.0, causal,
                outs[6], outs[7])
    grads = torch.ops.aten._scaled_dot_product_flash_attention_backward(*bwd_args, scale=0.3)
    _same_layout(grads, torch.ops.aten._scaled_dot_product_flash_attention_backward(
        *(_meta(t) if isinstance(t, torch.Tensor) else t for t in bwd_args), scale=0.3))
    native_l = _take(stub)
    assert len(native_l) == 4 and torch_native.fallback_count() == 0
    attention.forward(q, k, v, is_causal=causal, scale=0.3, out=out, lse=lse)
    attention.backward(do, q, k, v, out, lse, is_causal=causal, scale=0.3, grads=grads)
    assert_same_launches(_take(stub), native_l, records)


@pytest.mark.parametrize("op", ["flash", "efficient"])
def test_head_dims_off_multiples_of_8_run_in_cpp_on_padded_copies(cpu_route, op):
    """Head dim 59: libaotriton_rocm runs it at 64 on zero-padded copies (no
    fallback to the Python route), forward and backward."""
    stub, records = cpu_route
    q, k, v = _qkv(1, 2, 2, 40, 56, 59)
    if op == "flash":
        outs = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True, False)
        out, lse = outs[:2]
        grads = torch.ops.aten._scaled_dot_product_flash_attention_backward(
            torch.ones_like(out), q, k, v, out, lse, None, None, 40, 56, 0.0, True, outs[6],
            outs[7])
    else:
        out, lse, seed, offset = torch.ops.aten._scaled_dot_product_efficient_attention(
            q, k, v, None, True, 0.0, False)
        grads = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
            torch.ones_like(out), q, k, v, None, out, lse, seed, offset, 0.0,
            [True, True, True, False], False)
    assert out.shape == q.shape and [g.shape for g in grads[:3]] == [q.shape, k.shape, v.shape]
    native_l = _take(stub)
    assert torch_native.fallback_count() == 0
    by_symbol = {r.symbol: r for r, _ in records}
    assert [by_symbol[s].kernel for s, *_ in native_l] == [
        "attn_fwd", "attn_bwd_preprocess", "attn_bwd_dkdv", "attn_bwd_dq"]
    assert all(decode(by_symbol[s].args, raw)["head_dim"] == 64 for s, _, _, _, raw in native_l)


@pytest.mark.parametrize("window", [(None, None), (17, 0), (5, 9)])
def test_flash_attention_forward_bshd_launches_what_the_python_route_launches(cpu_route, window):
    stub, records = cpu_route
    b, h, hk, sq, sk, d = 2, 4, 2, 96, 160, 64
    q, k, v = _qkv(b, h, hk, sq, sk, d, bshd=True)
    outs = torch.ops.aten._flash_attention_forward(
        q, k, v, None, None, sq, sk, 0.0, True, False, scale=0.25,
        window_size_left=window[0], window_size_right=window[1])
    _same_layout(outs, torch.ops.aten._flash_attention_forward(
        _meta(q), _meta(k), _meta(v), None, None, sq, sk, 0.0, True, False, scale=0.25,
        window_size_left=window[0], window_size_right=window[1]))
    out, lse, rng, unused, _ = outs
    do = torch.empty_like(out)
    grads = torch.ops.aten._flash_attention_backward(
        do, q, k, v, out, lse, None, None, sq, sk, 0.0, True, rng, unused, scale=0.25,
        window_size_left=window[0], window_size_right=window[1])
    assert [(g.shape, g.stride()) for g in grads] == [(t.shape, t.stride()) for t in (q, k, v)]
    native_l = _take(stub)
    assert len(native_l) == 4 and torch_native.fallback_count() == 0
    win = attention.flash_attn_window(*window, sk)
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    attention.forward(t(q), t(k), t(v), is_causal=True, scale=0.25, out=t(out), lse=lse,
                      window_size=win)
    attention.backward(t(do), t(q), t(k), t(v), t(out), lse, is_causal=True, scale=0.25,
                       grads=tuple(t(g) for g in grads), window_size=win)
    assert_same_launches(_take(stub), native_l, records)


@pytest.mark.parametrize("form", ["h", "bh"])
def test_flash_attention_forward_alibi_launches_what_the_python_route_launches(cpu_route, form):
    """``alibi_slopes`` of torch's op runs in C++ on our kernels (same
    launches, slopes and strides included, as the Python route); slopes it
    cannot take (not fp32) go on to the Python route."""
    stub, records = cpu_route
    b, h, hk, sq, sk, d = 2, 4, 2, 64, 96, 64
    q, k, v = _qkv(b, h, hk, sq, sk, d, bshd=True)
    slopes = torch.rand(h) if form == "h" else torch.rand(b, h)
    outs = torch.ops.aten._flash_attention_forward(
        q, k, v, None, None, sq, sk, 0.0, True, False, scale=0.25, alibi_slopes=slopes)
    _same_layout(outs, torch.ops.aten._flash_attention_forward(
        _meta(q), _meta(k), _meta(v), None, None, sq, sk, 0.0, True, False, scale=0.25,
        alibi_slopes=_meta(slopes)))
    native_l = _take(stub)
    assert len(native_l) == 1 and torch_native.fallback_count() == 0
    out, lse = outs[0], outs[1]
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    attention.forward(t(q), t(k), t(v), is_causal=True, scale=0.25, out=t(out), lse=lse,
                      alibi_slopes=slopes)
    assert_same_launches(_take(stub), native_l, records)
    # fp16 slopes: the Python route, which refuses them (and on the CPU key
    # has no torch kernel to fall back to).
    with pytest.raises(RuntimeError, match="py__flash_attention_forward"):
        torch.ops.aten._flash_attention_forward(
            q, k, v, None, None, sq, sk, 0.0, True, False, scale=0.25,
            alibi_slopes=slopes.half())
    assert torch_native.fallback_calls["_flash_attention_forward"] == 1
    assert _take(stub) == []


@pytest.mark.parametrize("bias_shape", [(2, 4, 64, 96), (1, 4, 1, 96), (96,)])
def test_efficient_ops_with_a_bias_launch_what_the_python_route_launches(cpu_route, bias_shape):
    stub, records = cpu_route
    q, k, v = _qkv(2, 4, 4, 64, 96, 64)
    bias = torch.zeros(bias_shape, dtype=torch.float16)
    out, lse, seed, offset = torch.ops.aten._scaled_dot_product_efficient_attention(
        q, k, v, bias, True, 0.0, False, scale=0.125)
    do = torch.empty_like(out)
    mask = [True, True, True, False]
    grads = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
        do, q, k, v, bias, out, lse, seed, offset, 0.0, mask, False, scale=0.125)
    assert grads[3] is None
    native_l = _take(stub)
    assert len(native_l) == 4 and torch_native.fallback_count() == 0
    attention.forward(q, k, v, scale=0.125, out=out, lse=lse, causal_alignment="top_left",
                      bias=bias)
    attention.backward(do, q, k, v, out, lse, scale=0.125, grads=grads[:3],
                       causal_alignment="top_left", bias=bias)
    assert_same_launches(_take(stub), native_l, records)
    # the bias gradient is the Python route's
    stub.aotr_stub_reset()
    grads = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
        do, q, k, v, bias, out, lse, seed, offset, 0.0, [True] * 4, False, scale=0.125)
    assert grads[3].shape == bias.shape
    assert torch_native.fallback_calls["_scaled_dot_product_efficient_attention_backward"] == 1
    assert [kernel_of(s) for s, *_ in _take(stub)] == [  # launched by the Python route
        "attn_bwd_preprocess", "attn_bwd_dkdv", "attn_bwd_dq"]


def test_layout_the_kernels_cannot_read_is_copied(cpu_route):
    stub, records = cpu_route
    # rows 72 elements apart: not a multiple of 16
    q, k, v = (torch.empty(1, 2, 40, 72, dtype=torch.float16)[..., :64] for _ in range(3))
    out, lse, _, _ = torch.ops.aten._scaled_dot_product_efficient_attention(
        q, k, v, None, True, 0.0, False)
    assert torch_native.fallback_count() == 0 and _cpp_launches() == 1
    _same_layout((out, lse), torch.ops.aten._scaled_dot_product_efficient_attention(
        _meta(q), _meta(k), _meta(v), None, True, 0.0, False)[:2])
    native_l = _take(stub)
    assert [kernel_of(s) for s, *_ in native_l] == ["attn_fwd"]
    q_arg = native_l[0][4][:8]
    assert int.from_bytes(q_arg, "little") != q.data_ptr()  # a padded copy was read


def test_dropout_and_uncovered_calls_take_the_python_route(cpu_route):
    stub, records = cpu_route
    q, k, v = _qkv(1, 2, 2, 64, 64, 64)
    calls = torch_native.fallback_calls
    outs = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.1, False)
    assert calls["_scaled_dot_product_efficient_attention"] == 1
    assert torch_native.fallback_count() == 1 and _cpp_launches() == 0
    assert [kernel_of(s) for s, *_ in _take(stub)] == ["attn_fwd"]  # the Python route ran it
    _same_layout(outs[:2], torch.ops.aten._scaled_dot_product_efficient_attention(
        _meta(q), _meta(k), _meta(v), None, True, 0.1, False)[:2])
    for dropout_p, debug_mask in ((0.2, False), (0.0, True)):
        outs = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, False,
                                                                  debug_mask)
        meta = torch.ops.aten._scaled_dot_product_flash_attention(
            _meta(q), _meta(k), _meta(v), dropout_p, False, debug_mask)
        # max_q/max_k come back although py_<op> returns Tensors only
        assert outs[4:6] == (64, 64) and outs[2] is None and outs[3] is None
        _same_layout([outs[i] for i in (0, 1, 6, 7)], [meta[i] for i in (0, 1, 6, 7)])
    assert calls["_scaled_dot_product_flash_attention"] == 2
    mask = torch.ones(1, 2, 64, 64, dtype=torch.bool)  # boolean masks: the Python route
    torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, mask, True, 0.0, False)
    assert calls["_scaled_dot_product_efficient_attention"] == 2
    assert _cpp_launches() == 0 and torch_native.fallback_count() == 4
    # A head dim the archive has no kernel for: AOTR_UNSUPPORTED, the Python
    # route, which on the CPU key has no torch kernel to fall back to.
    q128 = torch.empty(1, 2, 16, 128, dtype=torch.float16)
    with pytest.raises(RuntimeError, match="py__scaled_dot_product_efficient_attention"):
        torch.ops.aten._scaled_dot_product_efficient_attention(q128, q128, q128, None, True, 0.0,
                                                              False)
    assert calls["_scaled_dot_product_efficient_attention"] == 3


def test_enable_uses_the_cpp_route_on_the_registry(ext, monkeypatch):
    if not torch_integration.has_registry():
        pytest.skip("torch has no flash-attention registry")
    monkeypatch.setattr(torch_native, "find_archives", lambda refresh=False: {})
    # enable() refuses a machine with no GPU: the registrations are what is checked here
    monkeypatch.setattr(torch_integration, "gpu_available", lambda: True)
    before = [_has(op, "CUDA") for op in ATEN]
    for _ in range(2):
        torch_integration.enable()
        try:
            assert torch_native.is_active()
            assert all("aotriton_rocm_torch.cpp" in torch._C._dispatch_dump(op) for op in ATEN)
        finally:
            torch_integration.disable()
        assert not torch_native.is_active()
        assert [_has(op, "CUDA") for op in ATEN] == before
    monkeypatch.setenv(torch_native.NATIVE_ENV, "0")
    torch_integration.enable()
    try:
        assert not torch_native.is_active()
    finally:
        torch_integration.disable()


def test_flash_attention_forward_varlen_launches_what_the_python_route_launches(cpu_route):
    stub, records = cpu_route
    h, hk, d = 4, 2, 64
    cu_q = torch.tensor([0, 17, 80, 130], dtype=torch.int32)
    cu_k = torch.tensor([0, 40, 41, 200], dtype=torch.int32)
    q = torch.empty(130, h, d, dtype=torch.float16)
    k = v = torch.empty(200, hk, d, dtype=torch.float16)
    args = (q, k, v, cu_q, cu_k, 63, 159, 0.0, True, False)
    out, lse, rng, unused, _ = torch.ops.aten._flash_attention_forward(*args, scale=0.5)
    assert lse.shape == (h, 130) and out.shape == q.shape
    do = torch.empty_like(out)
    grads = torch.ops.aten._flash_attention_backward(
        do, q, k, v, out, lse, cu_q, cu_k, 63, 159, 0.0, True, rng, unused, scale=0.5)
    native_l = _take(stub)
    assert len(native_l) == 4 and torch_native.fallback_count() == 0
    varlen = attention.Varlen(cu_q, cu_k, 63, 159)
    attention.forward(q, k, v, is_causal=True, scale=0.5, out=out, lse=lse, varlen=varlen)
    attention.backward(do, q, k, v, out, lse, is_causal=True, scale=0.5, grads=grads,
                       varlen=varlen)
    assert_same_launches(_take(stub), native_l, records)


# ------------------------------------ flash-attn's operators, without enable()


def test_our_operators_alone_leave_aten_ops_to_torch(ours_route):
    for op in ATEN:
        assert "aotriton_rocm_torch.cpp" not in torch._C._dispatch_dump(op)
    for op in torch_native.OURS:
        assert "aotriton_rocm_torch.cpp" in torch._C._dispatch_dump(f"aotriton_rocm::{op}")
        assert _has(f"aotriton_rocm::py_{op}", "CPU")


@pytest.mark.parametrize("window, softcap, alibi", [((-1, -1), 0.0, None), ((17, 0), 5.0, "h"),
                                                    ((5, 9), 0.0, "bh")])
def test_flash_attn_operators_launch_what_the_python_route_launches(ours_route, window, softcap,
                                                                    alibi):
    """Forward and backward of flash_attn_func's operators in C++: the
    launches (argument values, grids) the Python route makes for the call."""
    stub, records = ours_route
    b, h, hk, sq, sk, d = 2, 4, 2, 96, 160, 64
    q, k, v = _qkv(b, h, hk, sq, sk, d, bshd=True)
    slopes = None if alibi is None else torch.rand((h,) if alibi == "h" else (b, h))
    args = (0.25, True, *window, softcap, slopes)
    out, lse, state, debug = torch.ops.aotriton_rocm.flash_attn_forward(
        q, k, v, None, None, sq, sk, 0.0, *args, False, True)
    assert (out.shape, lse.shape, state.numel(), debug.numel()) == (q.shape, (b, h, sq), 0, 0)
    do = torch.empty_like(out)
    grads = torch.ops.aotriton_rocm.flash_attn_backward(
        do, q, k, v, out, lse, state, None, None, sq, sk, 0.0, *args, True)
    assert [(g.shape, g.stride()) for g in grads] == [(t.shape, t.stride()) for t in (q, k, v)]
    native_l = _take(stub)
    assert len(native_l) == 4 and torch_native.fallback_count() == 0
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    mods = dict(is_causal=True, scale=0.25, window_size=attention.flash_attn_window(*window, sk),
                softcap=softcap, alibi_slopes=slopes)
    attention.forward(t(q), t(k), t(v), out=t(out), lse=lse, **mods)
    attention.backward(t(do), t(q), t(k), t(v), t(out), lse, grads=tuple(t(g) for g in grads),
                       deterministic=True, **mods)
    assert_same_launches(_take(stub), native_l, records)


def test_flash_attn_operators_hand_dropout_and_padded_batches_to_python(ours_route):
    """Dropout, and a packed batch with rows past its last offset (the Python
    route pads the outputs there), go to the Python route."""
    stub, _ = ours_route
    q, k, v = _qkv(1, 2, 2, 32, 32, 64, bshd=True)
    torch.ops.aotriton_rocm.flash_attn_forward(q, k, v, None, None, 32, 32, 0.1, None, False, -1,
                                               -1, 0.0, None, False, False)
    cu = torch.tensor([0, 30], dtype=torch.int32)
    torch.ops.aotriton_rocm.flash_attn_forward(q[0], k[0], v[0], cu, cu, 32, 32, 0.0, None,
                                               False, -1, -1, 0.0, None, False, False)
    assert torch_native.fallback_calls["flash_attn_forward"] == 2
    assert torch_native.fallback_count() == 2


def test_flash_attn_operators_run_packed_batches_in_cpp(ours_route):
    """flash_attn_varlen_func's operators on a packed batch (GQA, a window,
    softcap): forward and backward in C++, the launches the Python route
    makes, with the offsets checked by the library on the host."""
    stub, records = ours_route
    h, hk, d = 4, 2, 64
    cu_q = torch.tensor([0, 17, 80, 130], dtype=torch.int32)
    cu_k = torch.tensor([0, 40, 41, 200], dtype=torch.int32)
    q = torch.empty(130, h, d, dtype=torch.float16)
    k, v = (torch.empty(200, hk, d, dtype=torch.float16) for _ in range(2))
    args = (cu_q, cu_k, 63, 159, 0.0, 0.5, True, 30, -1, 4.0, None)
    out, lse, state, _ = torch.ops.aotriton_rocm.flash_attn_forward(q, k, v, *args, False, False)
    assert (out.shape, lse.shape) == (q.shape, (h, 130))
    do = torch.empty_like(out)
    grads = torch.ops.aotriton_rocm.flash_attn_backward(do, q, k, v, out, lse, state, *args, True)
    native_l = _take(stub)
    assert len(native_l) == 4 and torch_native.fallback_count() == 0
    varlen = attention.Varlen(cu_q, cu_k, 63, 159)
    mods = dict(is_causal=True, scale=0.5, varlen=varlen, softcap=4.0,
                window_size=attention.flash_attn_window(30, -1, 159))
    attention.forward(q, k, v, out=out, lse=lse, **mods)
    attention.backward(do, q, k, v, out, lse, grads=grads, deterministic=True, **mods)
    assert_same_launches(_take(stub), native_l, records)


def test_offsets_the_library_refuses_keep_their_reason_through_the_cpp_route(ours_route):
    q = torch.empty(130, 4, 64, dtype=torch.float16)
    k = v = torch.empty(200, 2, 64, dtype=torch.float16)
    cu_q = torch.tensor([0, 17, 80, 130], dtype=torch.int32)
    for cu_k, match in ((torch.tensor([0, 40, 30, 200], dtype=torch.int32), "non-decreasing"),
                        (torch.tensor([0, 40, 41, 201], dtype=torch.int32), "beyond the 200")):
        with pytest.raises(ValueError, match=match):
            flash_attn_ops.forward(q, k, v, cu_q, cu_k, 63, 200, 0.0, None, False, -1, -1, 0.0,
                                   None, False, False)


@pytest.mark.parametrize("num_splits", [1, 0, 4])
@pytest.mark.parametrize("paged", [False, True])
def test_kvcache_operator_launches_what_the_python_route_launches(ours_route, num_splits, paged):
    """flash_attn_with_kvcache's operator in C++ (split workspace sized by
    the library): the launches the Python route makes, but for the buffers
    each allocates itself."""
    stub, records = ours_route
    b, h, hk, d = 2, 4, 2, 64
    q = torch.empty(b, 3, h, d, dtype=torch.float16)
    if paged:
        kc = torch.empty(8, 32, hk, d, dtype=torch.float16)
        table = torch.tensor([[0, 2, 4, 6], [1, 3, 5, 7]], dtype=torch.int32)
    else:
        kc, table = torch.empty(b, 128, hk, d, dtype=torch.float16), None
    vc = torch.empty_like(kc)
    k_end = torch.tensor([100, 57], dtype=torch.int32)
    k_start = torch.tensor([3, 0], dtype=torch.int32)
    out, lse = torch.ops.aotriton_rocm.flash_attn_kvcache(
        q, kc, vc, k_end, k_start, None, table, None, 0.125, True, 40, -1, 0.0, num_splits,
        None, 0, "flash_attn_with_kvcache")
    assert (out.shape, lse.shape) == (q.shape, (b, h, 3))
    native_l = _take(stub)
    assert native_l and torch_native.fallback_count() == 0
    kvcache.forward(q, kc, vc, k_end, k_start=k_start, block_table=table, scale=0.125,
                    causal=True, window_size=(40, -1), num_splits=num_splits, out=out)
    assert_same_launches(_take(stub), native_l, records, ignore=("O_PART", "LSE_PART", "LSE"))


def test_refusals_keep_their_reason_through_the_cpp_route(ours_route):
    """A call the C++ kernel hands to the Python route, which refuses it:
    the caller gets the refusal (ValueError and its reason), not the
    extension's "py_<op> failed"."""
    import aotriton_rocm

    q, k, v = _qkv(1, 2, 2, 32, 32, 64, bshd=True)
    with pytest.raises(ValueError, match="alibi_slopes must be fp32"):
        aotriton_rocm.flash_attn_func(q, k, v, alibi_slopes=torch.ones(2, dtype=torch.float16))
    cache = torch.empty(1, 64, 2, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="alibi_slopes"):
        aotriton_rocm.flash_attn_with_kvcache(q[:, :1], cache, cache, cache_seqlens=5,
                                              alibi_slopes=torch.ones(3))
    # the range of num_splits is the library's rule, on either route
    with pytest.raises(ValueError, match="num_splits = -1 is outside"):
        aotriton_rocm.flash_attn_with_kvcache(q[:, :1], cache, cache, cache_seqlens=5,
                                              num_splits=-1)
    assert torch_native.fallback_count() == 3
