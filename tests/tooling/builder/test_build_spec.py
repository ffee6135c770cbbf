"""Build tooling without compiling: targets (ci/targets.toml), variant
enumeration (kernels/variants.toml), source checks, progress output."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from aotriton_rocm.tooling.common.progress import Progress, format_seconds
from aotriton_rocm.tooling.common.source_tree import SourceTreeError, find_source_root
from aotriton_rocm.tooling.common.targets import TargetError, load_targets
from aotriton_rocm.core.kernel_spec import VariantSpecError, load_variants, variant_key
from support.toy_build import config_table

ROOT = Path(__file__).resolve().parents[3]
TARGETS = ROOT / "ci" / "targets.toml"
KERNELS = ROOT / "kernels"


@pytest.fixture(scope="module")
def targets():
    return load_targets(TARGETS)


@pytest.fixture(scope="module")
def spec():
    return load_variants(KERNELS)


# -- targets -----------------------------------------------------------------

def test_resolve_archs(targets):
    prof, archs = targets.resolve("6.4", ["gfx942,gfx908", "sm_90"])
    assert prof.name == "6.4"
    assert [a.name for a in archs] == ["gfx942", "gfx908", "sm_90"]
    gfx942 = archs[0]
    assert (gfx942.backend, gfx942.warp_size, gfx942.family) == ("hip", 64, "cdna")
    assert gfx942.gpu_target_args() == ("hip", "gfx942", 64)
    assert archs[2].gpu_target_args() == ("cuda", 90, 32)


def test_resolve_defaults_families_and_aliases(targets):
    prof, archs = targets.resolve(None, None)
    assert prof.name == targets.default_profile == "6.4"
    assert [a.name for a in archs] == list(targets.default_archs)
    _, archs = targets.resolve("rocm6.4", ["cdna"])
    assert [a.name for a in archs] == ["gfx908", "gfx90a", "gfx942"]  # no gfx950 in 6.4
    _, archs = targets.resolve("7.0", ["cdna", "gfx942", "sm90"])
    assert [a.name for a in archs] == ["gfx908", "gfx90a", "gfx942", "gfx950", "sm_90"]


def test_sm90_with_any_profile(targets):
    for p in targets.profiles:
        _, archs = targets.resolve(p, ["sm_90"])
        assert archs[0].name == "sm_90"


def test_unknown_arch_fails_naming_valid_choices(targets):
    with pytest.raises(TargetError) as ei:
        targets.resolve("6.4", ["gfx942,gfx9999"])
    msg = str(ei.value)
    assert "unknown arch gfx9999" in msg
    for a in ("gfx908", "gfx90a", "gfx942", "gfx1100", "sm_90"):
        assert a in msg


def test_arch_not_in_profile_fails(targets):
    with pytest.raises(TargetError) as ei:
        targets.resolve("6.4", ["gfx950"])
    msg = str(ei.value)
    assert "gfx950 not supported by ROCm profile 6.4" in msg
    assert "gfx942" in msg and "profiles that support it: 7.0" in msg
    with pytest.raises(TargetError, match="not supported by ROCm profile 6.2"):
        targets.resolve("6.2", ["gfx1201"])


def test_unknown_profile(targets):
    with pytest.raises(TargetError, match="unknown ROCm profile '5.7'.*6.2, 6.3, 6.4, 7.0"):
        targets.resolve("5.7", ["gfx942"])


def test_malformed_targets(tmp_path):
    p = tmp_path / "t.toml"
    p.write_text('[archs]\ngfx942 = { backend = "hip", warp_size = 64, family = "cdna" }\n'
                 '[profiles."6.4"]\narchs = ["gfx942", "gfx1100"]\n')
    with pytest.raises(TargetError, match="gfx1100"):
        load_targets(p)
    with pytest.raises(TargetError, match="cannot read"):
        load_targets(tmp_path / "nope.toml")


def test_profile_matrix_data(targets):
    assert list(targets.profiles) == ["6.2", "6.3", "6.4", "7.0", "7.1", "7.2", "7.14", "7.15", "10.0"]
    assert targets.default_profile == "6.4"
    assert targets.default_archs == ("gfx908", "gfx90a", "gfx942")
    for name, prof in targets.profiles.items():
        major = name.split(".")[0]
        # ROCm 10 still ships HIP 7 (HIP 7.16): the soname follows HIP, not ROCm
        assert prof.hip_soname == f"libamdhip64.so.{6 if major == '6' else 7}"
        assert prof.code_object_version == 5
        assert "gfx908" in prof.archs and "gfx942" in prof.archs
        assert ("gfx950" in prof.archs) == (major != "6")
    known = {"gfx908", "gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1101", "gfx1102", "gfx1150",
             "gfx1151", "gfx1200", "gfx1201"}
    assert set(targets.arch_sets["all"]) == known
    assert targets.arch_sets["cdna3"] == ("gfx942", "gfx950")
    # e_flags machine values as data (hex in the TOML)
    assert targets.archs["gfx908"].mach == 0x30 and targets.archs["gfx942"].mach == 0x4c
    assert targets.archs["gfx90a"].vgpr_mode == "unified" and targets.archs["gfx908"].vgpr_mode == "split"
    assert all(targets.archs[a].mach for a in known)


def test_therock_profiles_build_every_arch(targets):
    """7.14, 7.15 and 10.0 (TheRock) carry every AMD arch we describe, gfx1102
    included, and each of upstream's pack groups resolves within them."""
    amd = [a for a, s in targets.archs.items() if s.backend == "hip"]
    for name in ("7.14", "7.15", "10.0"):
        assert list(targets.profiles[name].archs) == amd
    assert [a.name for a in targets.resolve("rocm10.0", ["gfx110x"])[1]] == ["gfx1100", "gfx1101", "gfx1102"]
    assert [a.name for a in targets.resolve("7.14", ["gfx115x,gfx120x"])[1]] == [
        "gfx1150", "gfx1151", "gfx1200", "gfx1201"]
    assert [a.name for a in targets.resolve("7.2", ["gfx110x"])[1]] == ["gfx1100", "gfx1101"]
    with pytest.raises(TargetError, match="gfx1102 not supported by ROCm profile 7.2.*7.14, 7.15, 10.0"):
        targets.resolve("7.2", ["gfx1102"])


def test_named_sets_follow_the_profile(targets):
    def names(profile, req):
        return [a.name for a in targets.resolve(profile, [req])[1]]
    assert names("6.4", "cdna3") == ["gfx942"]
    assert names("7.0", "cdna3") == ["gfx942", "gfx950"]
    assert names("7.2", "rdna3") == ["gfx1100", "gfx1101", "gfx1150", "gfx1151"]
    assert names("7.1", "rdna4,cdna1") == ["gfx1200", "gfx1201", "gfx908"]
    assert names("6.4", "all") == list(targets.profiles["6.4"].archs)
    assert names("7.2", "ALL") == list(targets.profiles["7.2"].archs)
    with pytest.raises(TargetError) as ei:
        targets.resolve("6.2", ["rdna4"])
    msg = str(ei.value)
    assert "rdna4" in msg and "not supported by ROCm profile 6.2" in msg
    assert "gfx1100" in msg and "profiles that support it: 6.4, 7.0, 7.1, 7.2" in msg
    with pytest.raises(TargetError) as ei:
        targets.resolve("7.2", ["cdna5"])
    assert "unknown arch cdna5" in str(ei.value) and "cdna3" in str(ei.value) and "rdna4" in str(ei.value)
    with pytest.raises(TargetError, match="gfx1151 not supported by ROCm profile 7.0.*7.1, 7.2"):
        targets.resolve("7.0", ["gfx1151"])


def test_bad_arch_sets_in_file(tmp_path):
    head = ('[archs]\ngfx942 = { backend = "hip", warp_size = 64, family = "cdna" }\n'
            '[profiles."6.4"]\narchs = ["gfx942"]\n')
    p = tmp_path / "t.toml"
    p.write_text(head + '[arch_sets]\ncdna3 = ["gfx942", "gfx950"]\n')
    with pytest.raises(TargetError, match="arch set cdna3 lists archs not in .archs.: gfx950; valid archs: gfx942"):
        load_targets(p)
    p.write_text(head + '[arch_sets]\ngfx942 = ["gfx942"]\n')
    with pytest.raises(TargetError, match="clashes"):
        load_targets(p)
    p.write_text(head.replace('family = "cdna"', 'family = "cdna", vgpr_mode = "weird"'))
    with pytest.raises(TargetError, match="vgpr_mode"):
        load_targets(p)


def test_find_source_root(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT / "kernels")
    assert find_source_root() == ROOT
    assert find_source_root(ROOT / "src" / "aotriton_rocm") == ROOT
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "something-else"\n')
    with pytest.raises(SourceTreeError, match='name = "aotriton-rocm".*--source-root'):
        find_source_root(tmp_path)


# -- variants ----------------------------------------------------------------

def test_real_variant_counts(targets, spec):
    assert list(spec.kernels)[:4] == ["attn_fwd", "attn_bwd_preprocess", "attn_bwd_dkdv", "attn_bwd_dq"]
    points = {(k, tuple(f.items())) for k, ks in spec.kernels.items() for f in ks.functional_combinations()}
    # the unmasked fast path only where the head dim is the tile width (64, 128)
    assert {dict(f)["head_dim"] for _, f in points if dict(f).get("pad_head") is False} == {64, 128}
    # and, on sm_90 only, the Gluon dK/dV kernel's at 256 and the fused backward's kernels
    fused = {p for p in points if p[0] in ("attn_bwd_fused", "attn_bwd_dq_convert")}
    assert {dict(f)["head_dim"] for _, f in fused} == {64, 128}
    points -= fused
    sm90_only = fused | {("attn_bwd_dkdv", (("dtype", dt), ("head_dim", 256), ("pad_head", False),
                                            ("has_bias", False), ("enable_dropout", False))) for dt in ("fp16", "bf16")}

    def covered(arch):
        vs = spec.variants_for(targets.archs[arch])
        assert len(vs) == len({v.key for v in vs}), arch
        return vs, {(v.kernel, tuple(v.functional.items())) for v in vs}
    # CDNA and sm_90 cover every functional point; CDNA has a second attn_fwd
    # candidate at head dims 64 and 128 (the build chooses per seqlen bucket),
    # and more for feature variants that need smaller tiles (`when` configs)
    fwd_64_128 = {p for p in points if p[0] == "attn_fwd" and dict(p[1])["head_dim"] in (64, 128)}
    for arch in ("gfx908", "gfx90a", "gfx942", "gfx950", "sm_90"):
        vs, got = covered(arch)
        assert got == (points | sm90_only if arch == "sm_90" else points), arch
        if arch == "sm_90":
            # one candidate per point, plus the Gluon kernels at their fast-path points
            gluon = {(v.kernel, v.functional["head_dim"], v.functional["pad_head"])
                     for v in vs if v.module.startswith("flash_attention_sm90")}
            assert gluon == {("attn_fwd", 64, False), ("attn_fwd", 128, False), ("attn_bwd_dkdv", 256, False),
                             ("attn_bwd_fused", 64, False), ("attn_bwd_fused", 128, False)}
            # (the fused backward is the only candidate of its points)
            assert len(vs) == len(got) + 2 * (len(gluon) - 2)
        else:
            assert len(vs) >= len(points) + len(fwd_64_128), arch
    # RDNA covers every fp16/bf16 attention point up to head dim 256 (fp32
    # falls back to torch there), several with two candidates, and the
    # (fp32-labelled) dropout draws and dropout state
    for arch in ("gfx1100", "gfx1101", "gfx1102", "gfx1150", "gfx1151", "gfx1200", "gfx1201"):
        vs, got = covered(arch)
        assert got == {p for p in points if dict(p[1])["head_dim"] <= 256 and (
            dict(p[1])["dtype"] != "fp32" or p[0] in ("dropout_uniform", "philox_state"))}, arch
        assert len(vs) > len(got)
    # waivers only where no candidate compiles clean: RDNA backward at head dim
    # 128 (gfx11) and 256, the gfx11 forward at 256
    def feature(v):
        return v.functional.get("has_bias") or v.functional.get("enable_dropout")
    waived = {(a, v.kernel, v.functional["head_dim"]) for a in ("gfx1100", "gfx1201")
              for v in spec.variants_for(targets.archs[a]) if v.allow and not feature(v)}
    assert waived == {("gfx1100", "attn_fwd", 256), ("gfx1100", "attn_bwd_dkdv", 128),
                      ("gfx1100", "attn_bwd_dkdv", 256), ("gfx1100", "attn_bwd_dq", 128),
                      ("gfx1100", "attn_bwd_dq", 256), ("gfx1201", "attn_bwd_dkdv", 256),
                      ("gfx1201", "attn_bwd_dq", 256)}
    # on CDNA only the fp32 backward at head dim 512; none on sm_90
    for a in ("gfx908", "gfx942", "sm_90"):
        waived = {(v.kernel, v.functional["dtype"], v.functional["head_dim"])
                  for v in spec.variants_for(targets.archs[a]) if v.allow}
        assert waived == (set() if a == "sm_90" else
                          {("attn_bwd_dkdv", "fp32", 512), ("attn_bwd_dq", "fp32", 512)}), a
    # the RDNA bias/dropout points may ship spilling (allow.only)
    assert all(v.allow for a in ("gfx1100", "gfx1201") for v in spec.variants_for(targets.archs[a]) if feature(v))
    # the masked forward without bias/dropout, where the first-release tiles
    # spill since softcap/ALiBi, has the unwaived 32x16 8-warp tile
    small = {(a, v.functional["head_dim"]) for a in ("gfx1100", "gfx1150", "gfx1201")
             for v in spec.variants_for(targets.archs[a])
             if v.kernel == "attn_fwd" and v.functional["pad_head"] and not feature(v) and not v.allow
             and (v.config["BLOCK_M"], v.config["BLOCK_N"], v.config["num_warps"]) == (32, 16, 8)}
    assert small == {("gfx1100", 64), ("gfx1100", 128), ("gfx1150", 64), ("gfx1150", 128), ("gfx1201", 256)}


def test_real_variant_contents(targets, spec):
    vs = {v.key: v for v in spec.variants_for(targets.archs["sm_90"])}
    key = ("attn_fwd|dtype=fp16|head_dim=128|pad_head=0|has_bias=0|enable_dropout=0|"
           "BLOCK_M=128,BLOCK_N=64,num_warps=8,num_stages=3")
    v = vs[key]
    assert v.constexprs == {"BLOCK_D": 128, "BLOCK_M": 128, "BLOCK_N": 64, "PAD_HEAD": False,
                            "HAS_BIAS": False, "ENABLE_DROPOUT": False, "UPCAST_DOT": False,
                            "PRE_LOAD_V": False}
    assert v.options == {"num_warps": 8, "num_stages": 3}
    assert v.args[0] == ("Q", "*fp16") and v.args[5] == ("LSE", "*fp32")
    assert v.args[-8:] == (("sm_scale", "fp32"), ("dropout_p", "fp32"), ("store_dmask", "i32"),
                           ("ALIBI", "*fp32"), ("stride_az", "i32"), ("stride_ah", "i32"),
                           ("has_alibi", "i32"), ("softcap", "fp32"))
    assert v.grid == ("cdiv(max_seqlen_q, BLOCK_M)", "min(batch * num_heads, 65535)",
                      "cdiv(batch * num_heads, 65535)")
    assert "stride_qm" in v.divisible_16
    cdna = {v.key: v for v in spec.variants_for(targets.archs["gfx908"])}
    v = cdna["attn_bwd_preprocess|dtype=bf16|head_dim=64|BLOCK_M=128,num_warps=4,num_stages=1"]
    assert v.constexprs == {"BLOCK_D": 64, "BLOCK_M": 128}
    assert v.args[0] == ("O", "*bf16")


@pytest.mark.skipif(not (KERNELS / "flash_attention.py").exists(), reason="no kernels/flash_attention.py yet")
def test_spec_matches_kernel_sources(spec):
    params = spec.check_sources()
    for name, ks in spec.kernels.items():
        assert [p for p in params[name] if p not in ks.constexprs] == [n for n, _ in ks.args]


TOY_TOML = """
[kernels.add]
function = "toy:add_kernel"
args = [["X", "*{dtype}"], ["n", "i32"]]
constexprs = ["HEAD_DIM", "BLOCK"]
divisible_16 = ["X"]
grid = ["cdiv(n, BLOCK)", "1", "1"]
functional = { dtype = ["fp16", "bf16"], head_dim = [64, 128, 256] }
""" + config_table("add", "gfx942", head_dims=[64], BLOCK=32, num_warps=4) \
    + config_table("add", "cdna", BLOCK=64, num_warps=4)


def _spec(tmp_path, text):
    (tmp_path / "variants.toml").write_text(text)
    return load_variants(tmp_path)


def test_head_dims_filter_and_order(tmp_path, targets):
    s = _spec(tmp_path, TOY_TOML)
    vs = s.variants_for(targets.archs["gfx942"])
    assert len(vs) == 2 * 3 + 2  # every functional point x the cdna config, + the head 64 ones
    assert [v.key for v in vs[:3]] == [
        "add|dtype=fp16|head_dim=64|BLOCK=32,num_warps=4,num_stages=1",  # first = default
        "add|dtype=fp16|head_dim=64|BLOCK=64,num_warps=4,num_stages=1",
        "add|dtype=fp16|head_dim=128|BLOCK=64,num_warps=4,num_stages=1",
    ]
    assert len(s.variants_for(targets.archs["gfx90a"])) == 6
    assert s.variants_for(targets.archs["sm_90"]) == []


def test_variant_key_format():
    assert variant_key("k", {"dtype": "fp16", "causal": True}, {"BLOCK_M": 64, "num_warps": 4}) == \
        "k|dtype=fp16|causal=1|BLOCK_M=64,num_warps=4"


@pytest.mark.parametrize("edit, match", [
    (lambda t: t.replace('BLOCK = 64', 'BLOCK = 64\nWHAT = 1'), "'WHAT' is neither a constexpr"),
    (lambda t: t.replace('divisible_16 = ["X"]', 'divisible_16 = ["Y"]'), "divisible_16 names unknown"),
    (lambda t: t.replace('"1", "1"]', '"1"]'), "grid must have 3"),
    (lambda t: t.replace('function = "toy:add_kernel"', 'function = "toy.add_kernel"'), "module:function"),
    (lambda t: t.replace('dtype = ["fp16", "bf16"]', 'dtype = ["fp17"]'), "unknown dtype"),
    (lambda t: t.replace('num_stages = 1\n\n', '\n', 1), "lacks 'num_stages'"),
])
def test_spec_errors(tmp_path, edit, match):
    with pytest.raises(VariantSpecError, match=match):
        _spec(tmp_path, edit(TOY_TOML))


def test_missing_constexpr_value(tmp_path, targets):
    s = _spec(tmp_path, TOY_TOML.replace('["HEAD_DIM", "BLOCK"]', '["HEAD_DIM", "BLOCK", "EXTRA"]'))
    with pytest.raises(VariantSpecError, match="no value for constexpr EXTRA"):
        s.variants_for(targets.archs["gfx942"])


def test_constexpr_defaults(tmp_path, targets):
    """A constexpr with a default needs no value in the configs, and those
    keep their keys; one that sets it gets a key of its own."""
    text = TOY_TOML.replace('["HEAD_DIM", "BLOCK"]', '["HEAD_DIM", "BLOCK", "EXTRA"]\n'
                            'constexpr_defaults = { EXTRA = false }')
    plain = {v.key: v for v in _spec(tmp_path, TOY_TOML).variants_for(targets.archs["gfx942"])}
    with_default = _spec(tmp_path, text).variants_for(targets.archs["gfx942"])
    assert sorted(v.key for v in with_default) == sorted(plain)
    assert all(v.constexprs["EXTRA"] is False for v in with_default)
    text = text.replace("BLOCK = 64", "BLOCK = 64\nEXTRA = true", 1)
    keys = [v.key for v in _spec(tmp_path, text).variants_for(targets.archs["gfx942"])]
    assert any("EXTRA=1" in k for k in keys)
    with pytest.raises(VariantSpecError, match="constexpr_defaults must be a table of the kernel's"):
        _spec(tmp_path, TOY_TOML.replace('["HEAD_DIM", "BLOCK"]',
                                         '["HEAD_DIM", "BLOCK"]\nconstexpr_defaults = { NOPE = 1 }'))


def test_check_sources_errors(tmp_path):
    s = _spec(tmp_path, TOY_TOML)
    with pytest.raises(VariantSpecError, match="cannot read"):
        s.check_sources()
    (tmp_path / "toy.py").write_text("def add_kernel(n, X, HEAD_DIM, BLOCK):\n    pass\n")
    with pytest.raises(VariantSpecError, match="order"):
        s.check_sources()
    (tmp_path / "toy.py").write_text("def add_kernel(X, n, m, HEAD_DIM, BLOCK):\n    pass\n")
    with pytest.raises(VariantSpecError, match=r"in function only: \['m'\]"):
        s.check_sources()
    (tmp_path / "toy.py").write_text("def add_kernel(X, HEAD_DIM, n, BLOCK):\n    pass\n")
    assert s.check_sources() == {"add": ["X", "HEAD_DIM", "n", "BLOCK"]}



def test_config_function_compiles_another_function(tmp_path, targets):
    """A config's ``function`` names the source its variants compile; it is
    part of the variant key, and check_sources holds it to the kernel's
    parameters."""
    text = TOY_TOML + config_table("add", "gfx942", head_dims=[128], function='"toy_fast:add_fast"',
                                   BLOCK=128, num_warps=4)
    s = _spec(tmp_path, text)
    fast = [v for v in s.variants_for(targets.archs["gfx942"]) if "function" in v.config]
    assert [v.key for v in fast] == [
        f"add|dtype={dt}|head_dim=128|function=toy_fast:add_fast,BLOCK=128,num_warps=4,num_stages=1"
        for dt in ("fp16", "bf16")]
    assert {(v.module, v.function) for v in fast} == {("toy_fast", "add_fast")}
    assert {(v.module, v.function) for v in s.variants_for(targets.archs["gfx942"])
            if "function" not in v.config} == {("toy", "add_kernel")}
    (tmp_path / "toy.py").write_text("def add_kernel(X, HEAD_DIM, n, BLOCK):\n    pass\n")
    with pytest.raises(VariantSpecError, match="cannot read"):
        s.check_sources()
    (tmp_path / "toy_fast.py").write_text("def add_fast(X, n, HEAD_DIM, BLOCK):\n    pass\n")
    with pytest.raises(VariantSpecError, match="must take the kernel's parameters in the same order"):
        s.check_sources()
    (tmp_path / "toy_fast.py").write_text("def add_fast(X, HEAD_DIM, n, BLOCK):\n    pass\n")
    assert s.check_sources() == {"add": ["X", "HEAD_DIM", "n", "BLOCK"]}
    with pytest.raises(VariantSpecError, match="function must be 'module:function'"):
        _spec(tmp_path, TOY_TOML + config_table("add", "gfx942", function='"nocolon"', BLOCK=8, num_warps=4))


# -- progress ----------------------------------------------------------------

class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def _plain_run(total, seconds_per_item):
    """The plain lines of a stage of ``total`` items, one every ``seconds_per_item``."""
    buf, clock = io.StringIO(), FakeClock()
    with Progress(total, desc="compile", stream=buf, clock=clock) as p:
        for i in range(total):
            clock.t += seconds_per_item
            p.update(label=f"item{i}")
    return buf.getvalue().splitlines()


def test_progress_plain_lines_per_stage():
    # fast: the start and the end only
    assert _plain_run(3, 0.1) == ["compile: started, 3 to do", "compile: done 3/3 in 0:00 (10.0/s)"]
    # 100 items, 1 s each: a line per 10% step but at most one per 30 s: 30%, 60%, 90%
    lines = _plain_run(100, 1.0)
    assert lines[0] == "compile: started, 100 to do"
    assert [ln.split()[1] for ln in lines[1:-1]] == ["30/100", "60/100", "90/100"]
    assert lines[1] == "compile: 30/100 (30%) 1.0/s elapsed 0:30 ETA 1:10 item29"
    assert lines[-1] == "compile: done 100/100 in 1:40 (1.0/s)"


def test_progress_never_hundreds_of_lines():
    """The main job's compile stage (about a thousand kernels over hours):
    one line per 10%, not one per item or per few seconds."""
    lines = _plain_run(1200, 5.0)
    assert len(lines) == 11, lines  # start, 10% ... 90%, done
    assert lines[-1] == "compile: done 1200/1200 in 1:40:00 (0.2/s)"
    assert len(_plain_run(5000, 0.01)) <= 12


def test_progress_messages_and_disabled():
    buf = io.StringIO()
    p = Progress(2, desc="compile", stream=buf, clock=FakeClock())
    p.write("gfx942: 2 to compile\n")
    p.update()
    p.write("error: x")
    p.close()
    p.close()  # once only
    assert buf.getvalue().splitlines() == ["gfx942: 2 to compile", "compile: started, 2 to do", "error: x",
                                           "compile: stopped at 1/2 in 0:00 (0.0/s)"]
    silent = io.StringIO()
    with Progress(1, stream=silent, enabled=False) as q:
        q.update()
        q.write("x")
    assert silent.getvalue() == ""
    nothing = io.StringIO()
    Progress(0, stream=nothing).close()  # no work: no lines
    assert nothing.getvalue() == ""
    assert format_seconds(3725) == "1:02:05" and format_seconds(65) == "1:05"


def test_progress_tty_live_bar(monkeypatch):
    pytest.importorskip("rich")
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")

    class Tty(io.StringIO):
        def isatty(self):
            return True
    buf = Tty()
    with Progress(2, desc="compile", stream=buf) as p:
        p.update(label="gfx942 k1")
        p.write("message [not markup]")
        p.update(label="gfx942 k2")
    out = buf.getvalue()
    assert "\x1b[" in out  # drawn in place with terminal control sequences
    assert "message [not markup]\n" in out and "2/2" in out and "100%" in out and "gfx942 k2" in out
    assert "started" not in out  # no plain lines on a terminal
    # CI (whose runner may hand the job a pseudo-terminal): plain lines
    monkeypatch.setenv("CI", "true")
    ci = Tty()
    with Progress(2, desc="compile", stream=ci) as p:
        p.update()
        p.update()
    assert ci.getvalue().startswith("compile: started, 2 to do\n") and "\x1b[" not in ci.getvalue()


def test_exclude_drops_functional_points(tmp_path, targets):
    toml = TOY_TOML.replace('head_dim = [64, 128, 256] }',
                            'head_dim = [64, 128, 256] }\nexclude = [{ dtype = "bf16", head_dim = 128 }]')
    assert toml != TOY_TOML
    s = _spec(tmp_path, toml)
    funcs = s.kernels["add"].functional_combinations()
    assert {"dtype": "bf16", "head_dim": 128} not in funcs and len(funcs) == 5
    with pytest.raises(VariantSpecError, match="not a functional value"):
        _spec(tmp_path, TOY_TOML.replace('head_dim = [64, 128, 256] }',
                                         'head_dim = [64, 128, 256] }\nexclude = [{ head_dim = 48 }]'))


def test_exclude_except_archs_keeps_the_point_there(tmp_path, targets):
    toml = TOY_TOML.replace('head_dim = [64, 128, 256] }',
                            'head_dim = [64, 128, 256] }\n'
                            'exclude = [{ head_dim = 256, except_archs = ["sm_90", "rdna3"] }]')
    s = _spec(tmp_path, toml)
    ks = s.kernels["add"]
    assert {f["head_dim"] for f in ks.functional_combinations()} == {64, 128}  # every arch's points
    assert {f["head_dim"] for f in ks.functional_combinations(targets.archs["gfx942"])} == {64, 128}
    for arch in ("sm_90", "gfx1100"):  # by name, and by arch set
        assert {f["head_dim"] for f in ks.functional_combinations(targets.archs[arch])} == {64, 128, 256}, arch
    with pytest.raises(VariantSpecError, match="except_archs must be a list"):
        _spec(tmp_path, toml.replace('["sm_90", "rdna3"]', '"sm_90"'))
    with pytest.raises(VariantSpecError, match="names no functional value"):
        _spec(tmp_path, toml.replace('head_dim = 256, except_archs', 'except_archs'))
