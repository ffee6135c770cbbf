"""Ahead-of-time compile smoke test for kernels/flash_attention.py.

Compiles one attn_fwd variant for gfx942 (HIP) and one for sm_90 (CUDA) the way
the builder does (``triton.compile`` on an ``ASTSource`` built from
kernels/variants.toml) and checks that a code object comes out, that it needs
no global scratch, fits in shared memory/LDS and, on HIP, does not spill.
No GPU is needed; the two compiles take a few seconds.
"""

import importlib
import importlib.util
import inspect
import os
import pathlib
import re
import sys
import types

import pytest

triton = pytest.importorskip("triton")

KERNEL_DIR = pathlib.Path(__file__).resolve().parents[2] / "kernels"


def _spec():
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        import tomli as tomllib
    with open(KERNEL_DIR / "variants.toml", "rb") as f:
        return tomllib.load(f)


def _module(module="flash_attention"):
    """A kernels/ module of this checkout, as a module of a package (the
    kernel sources import their helpers relatively)."""
    name = "aotriton_rocm_kernels_compile_test"
    if name not in sys.modules:
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(KERNEL_DIR)]
        pkg.__spec__ = importlib.util.spec_from_loader(name, loader=None, is_package=True)
        pkg.__spec__.submodule_search_locations = [str(KERNEL_DIR)]
        sys.modules[name] = pkg
    return importlib.import_module(f"{name}.{module}")


SPEC = _spec()
FA = _module()


def test_signatures_match_variants_toml():
    for name, kern in SPEC["kernels"].items():
        module, fn_name = kern["function"].split(":")
        assert module in ("flash_attention", "flash_decode", "flash_attention_sm90_bwd_fused",
                          "rng_state")
        fn = getattr(FA if module == "flash_attention" else _module(module), fn_name)
        params = list(inspect.signature(fn.fn).parameters)
        assert params == [a for a, _ in kern["args"]] + list(kern["constexprs"]), name


def _compile(kernel, target, family, dtype="fp16", head_dim=64, pad_head=False, features=False):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kern = SPEC["kernels"][kernel]
    point = {"dtype": dtype, "head_dim": head_dim, "pad_head": pad_head,
             "has_bias": features, "enable_dropout": features}

    def matches(c):
        when = c.get("when", {})
        return family in c["archs"] and head_dim in c.get("head_dims", [head_dim]) and all(
            point[k] in (v if isinstance(v, list) else [v]) for k, v in when.items())

    # the most specific matching config (a `when` table) first
    cfg = sorted((c for c in kern["configs"] if matches(c)), key=lambda c: "when" not in c)[0]
    signature = {a: t.replace("{dtype}", dtype) for a, t in kern["args"]}
    values = {"BLOCK_D": head_dim, "PAD_HEAD": pad_head, "UPCAST_DOT": False,
              "HAS_BIAS": features, "ENABLE_DROPOUT": features, **kern.get("constexpr_defaults", {})}
    values.update({k: v for k, v in cfg.items() if k.isupper()})
    constexprs = {c: values[c] for c in kern["constexprs"]}
    signature.update({c: "constexpr" for c in kern["constexprs"]})
    names = [a for a, _ in kern["args"]]
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in kern["divisible_16"]}
    src = ASTSource(fn=getattr(FA, kernel), signature=signature, constexprs=constexprs, attrs=attrs)
    options = {k: cfg[k] for k in ("num_warps", "num_stages", "waves_per_eu", "matrix_instr_nonkdim", "kpack")
               if k in cfg}
    return triton.compile(src, target=GPUTarget(*target), options=options)


@pytest.fixture(autouse=True)
def _compile_env(monkeypatch, tmp_path):
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        pytest.skip("TRITON_INTERPRET is set: kernels are not JIT functions")
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))


@pytest.mark.parametrize("pad_head,features", [(False, False), (True, False), (True, True)],
                         ids=["d64", "d64-masked", "d64-bias-dropout"])
def test_fwd_compiles_for_gfx942(pad_head, features):
    k = _compile("attn_fwd", ("hip", "gfx942", 64), "cdna", pad_head=pad_head, features=features)
    hsaco = k.asm["hsaco"]
    assert isinstance(hsaco, bytes) and hsaco[:4] == b"\x7fELF"
    assert k.metadata.global_scratch_size == 0
    assert 0 < k.metadata.shared <= 65536
    asm = k.asm["amdgcn"]
    stats = {key: int(v) for key, v in re.findall(
        r"^\s*\.(vgpr_spill_count|sgpr_spill_count|private_segment_fixed_size):\s*(\d+)", asm, re.M)}
    assert stats.get("vgpr_spill_count") == 0, stats
    assert stats.get("private_segment_fixed_size") == 0, stats
    assert all(int(x) == 0 for x in re.findall(r"ScratchSize:\s*(\d+)", asm))
    # 16-byte global loads: the divisibility hints reach the loads (with the
    # head-dim mask too: it is written so that Triton sees runs of 8).
    assert "global_load_dwordx4" in asm or "buffer_load_dwordx4" in asm


def test_fwd_compiles_for_sm90():
    k = _compile("attn_fwd", ("cuda", 90, 32), "cuda")
    cubin = k.asm["cubin"]
    assert isinstance(cubin, bytes) and cubin[:4] == b"\x7fELF"
    assert k.metadata.global_scratch_size == 0
    assert 0 < k.metadata.shared <= 227 * 1024
    assert "wgmma" in k.asm["ptx"]


def _sm90_variant(kernel, **point):
    """The build's sm_90 variant of KERNEL at POINT that runs a Gluon kernel (a
    config's function, or the fused backward's own)."""
    from aotriton_rocm.core.kernel_spec import load_variants
    from aotriton_rocm.tooling.common.targets import load_targets

    spec = load_variants(KERNEL_DIR)
    targets = load_targets(KERNEL_DIR.parent / "ci" / "targets.toml")
    arch = targets.archs["sm_90"]
    found = [v for v in spec.variants_for(arch) if v.kernel == kernel and v.module.startswith("flash_attention_sm90")
             and all(v.functional.get(k) == val for k, val in point.items())]
    assert len(found) == 1, [v.key for v in found]
    return spec, arch, found[0]


def test_config_functions_take_the_kernel_parameters():
    # check_sources compares every config's function with the kernel's
    from aotriton_rocm.core.kernel_spec import load_variants

    params = load_variants(KERNEL_DIR).check_sources()
    gluon = _module("flash_attention_sm90")
    assert list(inspect.signature(gluon.attn_fwd.fn).parameters) == params["attn_fwd"]
    gluon_bwd = _module("flash_attention_sm90_bwd")
    assert list(inspect.signature(gluon_bwd.attn_bwd_dkdv.fn).parameters) == params["attn_bwd_dkdv"]


@pytest.mark.parametrize("head_dim", [64, 128])
def test_gluon_fwd_compiles_for_sm90(head_dim):
    """The warp-specialised sm_90 forward, compiled as the build compiles it,
    with no register spills in its loops (at head dim 64 ptxas keeps one
    64-bit launch value on the stack, 8 bytes, stored once at entry and
    loaded once per warpgroup); Q, K and V arrive by TMA through
    descriptors it builds in the launch's global scratch."""
    k = _compile_sm90_config_function("attn_fwd", "flash_attention_sm90", dtype="bf16", head_dim=head_dim,
                                      pad_head=False)
    # four 128-byte tensor maps per program: K, V and each consumer's half of Q
    assert k.metadata.global_scratch_size == 4 * 128
    ptx = k.asm["ptx"]
    assert "cp.async.bulk.tensor.2d" in ptx and "tensormap.replace" in ptx and "cp.async.ca" not in ptx
    assert _stack_bytes(k) <= 8


def test_gluon_dkdv_compiles_for_sm90():
    """The warp-specialised sm_90 dK/dV kernel at head dim 256, compiled as
    the build compiles it: 12 warps, four tensor maps (K, V, and the 3-D ones
    of Q and dO over the GQA group's heads) in global scratch, within the
    shared memory. Its consumers hold a 64 x 256 fp32 accumulator each under
    240 registers; ptxas spills some loop scalars (152 bytes of stack with
    triton 3.9), which the bound below keeps from growing unseen."""
    k = _compile_sm90_config_function("attn_bwd_dkdv", "flash_attention_sm90_bwd", dtype="bf16", head_dim=256,
                                      pad_head=False)
    assert k.metadata.global_scratch_size == 4 * 128
    ptx = k.asm["ptx"]
    assert "cp.async.bulk.tensor.3d" in ptx and "cp.async.bulk.tensor.2d" in ptx and "tensormap.replace" in ptx
    assert _stack_bytes(k) <= 256


@pytest.mark.parametrize("head_dim", [64, 128])
def test_fused_backward_compiles_for_sm90(head_dim):
    """The fused backward as the build compiles it: six tensor maps (K, V, the
    3-D ones of Q and dO, one dQ accumulator map per MMA warpgroup), dQ added
    by TMA reduce-add. Each MMA warpgroup holds dK and dV (64 x head dim fp32
    each); at head dim 128 ptxas spills some (304 bytes of stack with triton
    3.9), which the bound keeps from growing unseen."""
    k = _compile_sm90_config_function("attn_bwd_fused", "flash_attention_sm90_bwd_fused", dtype="fp16",
                                      head_dim=head_dim, pad_head=False)
    assert k.metadata.global_scratch_size == 6 * 128
    assert "cp.reduce.async.bulk.tensor" in k.asm["ptx"]
    assert _stack_bytes(k) <= 320


def _compile_sm90_config_function(kernel, module, **point):
    """Compile the sm_90 variant of KERNEL at POINT whose config names a
    function of MODULE (a Gluon kernel) through the build's compile path;
    check what every such kernel must be: a cubin for 12 warps (a producer
    warpgroup and two consumer ones, with setmaxnreg), wgmma, descriptors in
    global scratch at the runtime's alignment, within the shared memory."""
    from aotriton_rocm.tooling.builder.plan import compile_task_for
    from aotriton_rocm.tooling.builder.cache import kernel_sources_hash
    from aotriton_rocm.tooling.builder.triton_compile import SCRATCH_ALIGN, compile_task, discard_stderr_at_exit

    spec, arch, v = _sm90_variant(kernel, **point)
    assert (v.module, v.function) == (module, kernel)
    params = spec.check_sources()[kernel]
    k = compile_task(compile_task_for(v, params, arch, KERNEL_DIR, kernel_sources_hash(KERNEL_DIR), "test"))
    discard_stderr_at_exit()  # nanobind's page about triton's leaked Gluon objects
    assert k.asm["cubin"][:4] == b"\x7fELF"
    assert k.metadata.num_warps == 12
    assert k.metadata.global_scratch_align <= SCRATCH_ALIGN
    assert 0 < k.metadata.shared <= 227 * 1024
    assert "wgmma.mma_async" in k.asm["ptx"] and "setmaxnreg" in k.asm["ptx"]
    return k


def _stack_bytes(k):
    """The cubin's stack frame (register spills) per cuobjdump; 0 where the
    tool is missing."""
    import subprocess
    import tempfile

    cuobjdump = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not cuobjdump.exists():
        return 0
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        usage = subprocess.run([str(cuobjdump), "--dump-resource-usage", f.name], capture_output=True,
                               text=True, check=True).stdout
    return int(re.search(r"STACK:(\d+)", usage).group(1))
