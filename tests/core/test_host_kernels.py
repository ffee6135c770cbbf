"""The CPU interpreter's calls go through libaotriton_rocm's host backend:
the C core checks, picks, binds, sizes the grid and splits, and the Python
launcher only runs what it planned."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from aotriton_rocm.core import attention, backends, kvcache
from aotriton_rocm.core.host_kernels import host_runtime, interpreter_runner, kernel_index
from aotriton_rocm.core.native import NativeError, Runtime

pytest.importorskip("triton", reason="the CPU backend runs kernels in Triton's interpreter")


def _spec():
    from aotriton_rocm.core.kernel_spec import INTERPRETER_ARCH, kernels_dir, load_variants
    spec = load_variants(kernels_dir())
    return spec, spec.variants_for(INTERPRETER_ARCH)


def _backend_with(variants, functions):
    backend = backends.InterpreterBackend()
    backend.runtime, backend._launcher = host_runtime(variants, interpreter_runner(functions),
                                                      "test")
    return backend


def _qkv(d=32, s=8):
    g = torch.Generator().manual_seed(d)
    return tuple(torch.randn(1, 2, s, d, generator=g) for _ in range(3))


def test_interpreter_launches_are_counted_by_the_c_core():
    q, k, v = _qkv()
    runtime = backends._interpreter_backend().runtime
    before = runtime.launch_count("attn_fwd")
    out, _ = attention.forward(q, k, v, is_causal=True)
    assert runtime.launch_count("attn_fwd") == before + 1
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                                           is_causal=True)
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=1e-5)


def test_an_argument_the_c_core_does_not_know_fails_the_call():
    spec, variants = _spec()
    renamed = [dataclasses.replace(v, args=tuple(("SM_SCALE" if n == "sm_scale" else n, t)
                                                 for n, t in v.args))
               if v.kernel == "attn_fwd" else v for v in variants]
    backend = _backend_with(renamed, {})
    q, k, v = _qkv()
    with backends.using(backend), pytest.raises(NativeError, match="SM_SCALE is unknown"):
        attention.forward(q, k, v)


def test_a_launch_failure_keeps_its_own_exception():
    spec, variants = _spec()

    class Broken:
        def __getitem__(self, grid):
            def run(**args):
                raise ZeroDivisionError(f"grid {grid}, {len(args)} arguments")
            return run

    backend = _backend_with(variants, {v.kernel: Broken() for v in variants})
    q, k, v = _qkv()
    with backends.using(backend), pytest.raises(ZeroDivisionError, match=r"grid \(1, 2, 1\)"):
        attention.forward(q, k, v)


def test_batch_times_heads_past_the_y_limit_continues_along_z():
    # The y grid dimension holds at most 65535 (batch, head) pairs; the rest
    # continue along z (the GPU test runs such a batch). Planned only here.
    spec, variants = _spec()
    grids = []

    class Recorder:
        def __getitem__(self, grid):
            grids.append(grid)
            return lambda **args: None

    backend = _backend_with(variants, {v.kernel: Recorder() for v in variants})
    q, k, v = (torch.zeros(70000, 1, 1, 16, dtype=torch.float16) for _ in range(3))
    with backends.using(backend):
        attention.forward(q, k, v)
    assert grids == [(1, 65535, 2)]


def test_the_host_index_must_name_the_host_backend():
    _, variants = _spec()
    index = json.loads(kernel_index(variants[:4], "test"))
    index["manifest"]["backend"] = "cuda"
    launch = backends.InterpreterBackend().runtime._keep
    with pytest.raises(NativeError, match='backend "host"'):
        Runtime.host(json.dumps(index).encode(), launch, 8)


def test_kv_cache_splits_are_the_c_cores_choice():
    # a long cache on the host's 8 compute units is split; the answer is the
    # unsplit one's
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 1, 4, 32, generator=g).half()
    kc, vc = (torch.randn(1, 1024, 1, 32, generator=g).half() for _ in range(2))
    k_end = torch.tensor([1000], dtype=torch.int32)
    out, lse, splits = kvcache.forward(q, kc, vc, k_end, num_splits=0)
    one, lse1, _ = kvcache.forward(q, kc, vc, k_end, num_splits=1)
    assert splits > 1
    torch.testing.assert_close(out, one, rtol=0, atol=1e-3)
    torch.testing.assert_close(lse, lse1, rtol=0, atol=1e-5)
