"""Real builds (triton.compile on the CPU) of a toy kernel for gfx942 + sm_90:
archives, manifests, cache hits on rebuild, no partial archive on failure.
One slow test builds the real FlashAttention kernels for gfx942."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("triton")

from aotriton_rocm._version import ABI_VERSION, TRITON_VERSION, __version__  # noqa: E402
from aotriton_rocm.common.archive import Archive
from aotriton_rocm.common.archive_identity import verify_against_manifest  # noqa: E402
from aotriton_rocm.commands.cli import main as cli_main  # noqa: E402
from aotriton_rocm.tooling.builder import command as B  # noqa: E402
from aotriton_rocm.tooling.builder.triton_compile import validate_output  # noqa: E402
from aotriton_rocm.tooling.common.inputs_hash import module_sources_hash  # noqa: E402
from aotriton_rocm.tooling.common.targets import TargetError  # noqa: E402
from aotriton_rocm.core.kernel_spec import VariantSpecError  # noqa: E402
from support.toy_build import TOY_KERNEL, TOY_VARIANTS, make_root  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]

@pytest.fixture(scope="module")
def built(toy_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    res = B.build("6.4", ["gfx942,sm_90"], out, source_root=toy_root, jobs=2, progress=False)
    return out, res


def test_toy_build(built):
    out, res = built
    assert res.compiled == 4 and res.cached == 0
    assert set(res.archives) == {"gfx942", "sm_90"}
    assert sorted(p.name for p in (out / "archives").iterdir()) == [
        "gfx942.aotr", "gfx942.manifest.json", "sm_90.aotr", "sm_90.manifest.json"]
    assert not (out / ".tmp").exists()
    for arch, backend, ws, block in (("gfx942", "hip", 64, 512), ("sm_90", "cuda", 32, 256)):
        path = out / "archives" / f"{arch}.aotr"
        a = Archive.open(path)
        m = a.manifest
        assert (m["arch"], m["backend"], m["warp_size"], m["rocm_profile"]) == (arch, backend, ws, "6.4")
        assert (m["package_version"], m["abi_version"]) == (__version__, ABI_VERSION)
        assert (m["compiler"], m["compiler_version"]) == ("triton", TRITON_VERSION)
        assert len(m["build_inputs_hash"]) == 64 and m["format_version"] == 1
        assert [r.key for r in a.kernels] == [
            f"scale_add|dtype={d}|head_dim=64|BLOCK={block},num_warps=4,num_stages=1" for d in ("fp16", "bf16")]
        r = a.find("scale_add", dtype="bf16")[0]
        assert r.symbol == "scale_add" and r.num_warps == 4 and r.warp_size == ws
        assert r.constexprs == {"BLOCK": block, "HEAD_DIM": 64}
        assert r.args == (("X", "*bf16"), ("Y", "*bf16"), ("Out", "*bf16"), ("n", "i32"), ("alpha", "fp32"),
                          ("global_scratch", "*i8"), ("profile_scratch", "*i8"))
        assert r.divisible_16 == ("X", "Y", "Out", "n")
        assert r.global_scratch_size == 0
        assert a.code_object(r).startswith(b"\x7fELF")
        assert a.verify() == []
        assert verify_against_manifest(path) == []
        if backend == "hip":
            assert r.stats["amdgcn_target"].endswith("gfx942")
            assert r.stats["scratch_size"] == 0 and "vgpr_count" in r.stats
    report = json.loads((out / "build-report.json").read_text())
    assert report["status"] == "ok" and report["errors"] == []
    assert report["per_arch"]["gfx942"]["kernels"] == 2
    assert report["per_arch"]["gfx942"]["compiled"] == 2 and report["per_arch"]["gfx942"]["cached"] == 0
    assert report["per_arch"]["sm_90"]["archive_bytes"] == (out / "archives" / "sm_90.aotr").stat().st_size
    assert report["per_arch"]["sm_90"]["seconds"] > 0


def test_rebuild_compiles_nothing(built, toy_root):
    out, first = built
    before = {a: p.read_bytes() for a, p in first.archives.items()}
    res = B.build("6.4", ["gfx942", "sm_90"], out, source_root=toy_root, jobs=2, progress=False)
    assert res.compiled == 0 and res.cached == 4
    assert res.report["per_arch"]["gfx942"]["cached"] == 2
    assert {a: p.read_bytes() for a, p in res.archives.items()} == before  # reproducible


def test_source_change_invalidates_cache(built, toy_root, tmp_path):
    root = make_root(tmp_path / "root")
    out = tmp_path / "out"
    shutil.copytree(built[0] / "cache", out / "cache")
    res = B.build("6.4", ["sm_90"], out, source_root=root, jobs=1, progress=False)
    assert res.compiled == 0  # same sources: the copied cache answers
    (root / "kernels" / "toy.py").write_text(TOY_KERNEL + "\n# changed\n")
    res = B.build("6.4", ["sm_90"], out, source_root=root, jobs=1, progress=False)
    assert res.compiled == 2
    assert Archive.open(res.archives["sm_90"]).manifest["build_inputs_hash"] != \
        Archive.open(built[1].archives["sm_90"]).manifest["build_inputs_hash"]


def test_cache_key_covers_what_the_module_reads(built, tmp_path):
    """A kernel's cache key hashes its module and the kernels/ modules it
    imports, transitively: a new unrelated module recompiles nothing, a
    changed helper of an imported module changes the key."""
    root = make_root(tmp_path / "root")
    out = tmp_path / "out"
    shutil.copytree(built[0] / "cache", out / "cache")
    (root / "kernels" / "unrelated.py").write_text("WIDTH = 1\n")
    res = B.build("6.4", ["sm_90"], out, source_root=root, jobs=1, progress=False)
    assert res.compiled == 0

    kd = tmp_path / "kd"
    (kd / "sub").mkdir(parents=True)
    (kd / "a.py").write_text("from .b import f\nfrom . import sub\n")
    (kd / "b.py").write_text("from .sub.c import g\n")
    (kd / "sub" / "c.py").write_text("G = 1\n")
    (kd / "d.py").write_text("D = 1\n")
    first = module_sources_hash(kd, "a")
    (kd / "d.py").write_text("D = 2\n")
    assert module_sources_hash(kd, "a") == first
    (kd / "sub" / "c.py").write_text("G = 2\n")
    assert module_sources_hash(kd, "a") != first


def test_failed_build_writes_no_archive(built, tmp_path):
    # BLOCK = 100 is not a power of 2: tl.arange fails to compile for gfx942.
    bad = TOY_VARIANTS + ('\n[[kernels.scale_add.configs]]\narchs = ["gfx942"]\nBLOCK = 100\n'
                          'num_warps = 4\nnum_stages = 1\n')
    root = make_root(tmp_path / "root", bad)
    out = tmp_path / "out"
    shutil.copytree(built[0] / "cache", out / "cache")
    (out / "archives").mkdir(parents=True)
    old = (out / "archives" / "gfx942.aotr")
    old.write_bytes(b"previous archive")
    with pytest.raises(B.BuildError) as ei:
        B.build("6.4", ["gfx942", "sm_90"], out, source_root=root, jobs=2, progress=False)
    msg = str(ei.value)
    assert "scale_add|dtype=fp16|head_dim=64|BLOCK=100,num_warps=4,num_stages=1" in msg
    assert "compile failed" in msg and "no archive written" in msg
    assert len(ei.value.errors) == 2  # fp16 and bf16
    assert old.read_bytes() == b"previous archive"
    assert sorted(p.name for p in (out / "archives").iterdir()) == ["gfx942.aotr"]
    report = json.loads((out / "build-report.json").read_text())
    assert report["status"] == "failed" and len(report["errors"]) == 2
    assert report["per_arch"]["gfx942"]["failed"] == 2


def test_validation_rules():
    from aotriton_rocm.tooling.builder.triton_compile import shared_memory_finding
    ok = {"global_scratch_size": 0, "shared": 1024, "triton_version": TRITON_VERSION,
          "stats": {"scratch_size": 0, "private_segment_fixed_size": 0, "vgpr_spill_count": 2,
                    "amdgcn_target": "amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-"}}
    kw = dict(backend="hip", arch="gfx90a", triton_version=TRITON_VERSION)
    assert validate_output(ok, b"\x7fELF...", **kw) == []  # VGPR spills into AGPRs are fine
    bad = dict(ok, global_scratch_size=128, shared=70000,
               stats=dict(ok["stats"], scratch_size=64, amdgcn_target="amdgcn-amd-amdhsa--gfx942"))
    problems = validate_output(bad, b"junk", **kw)
    text = "\n".join(problems)
    for what in ("not an ELF", "global scratch", "not gfx90a"):
        assert what in text
    # resources are not integrity problems: the code-object validator (AMD) or
    # shared_memory_finding (NVIDIA) reports them, and a config may waive them
    assert "scratch memory" not in text and "shared" not in text
    assert shared_memory_finding(bad, "sm_90", 65536) == "uses 70000 bytes of shared memory, sm_90 has 65536"
    assert shared_memory_finding(ok, "sm_90", 65536) is None
    assert validate_output(dict(ok, triton_version="3.8.0"), b"\x7fELF", **kw)
    # CUDA: the runtime allocates global scratch per launch (256-byte aligned)
    cuda = dict(backend="cuda", arch="sm_90", triton_version=TRITON_VERSION)
    scratch = dict(ok, global_scratch_size=384, global_scratch_align=128)
    assert validate_output(scratch, b"\x7fELF", **cuda) == []
    assert "aligned to 1024" in "".join(validate_output(dict(scratch, global_scratch_align=1024), b"\x7fELF", **cuda))
    assert "global scratch" in "".join(validate_output(scratch, b"\x7fELF", **kw))


def test_global_scratch_the_launcher_cannot_align_fails_the_build(built, toy_root, tmp_path, monkeypatch):
    out = tmp_path / "out"
    shutil.copytree(built[0] / "cache", out / "cache")
    real_get = B.CompileCache.get

    def get(self, key):
        hit = real_get(self, key)
        return None if hit is None else (dict(hit[0], global_scratch_size=256, global_scratch_align=512),
                                         hit[1])

    monkeypatch.setattr(B.CompileCache, "get", get)
    with pytest.raises(B.BuildError, match=r"sm_90 scale_add\|dtype=fp16.*global scratch aligned to 512"):
        B.build("6.4", ["sm_90"], out, source_root=toy_root, jobs=1, progress=False)
    assert not (out / "archives" / "sm_90.aotr").exists()


def test_bad_requests_fail_before_compiling(toy_root, tmp_path):
    with pytest.raises(TargetError, match="unknown arch gfx000"):
        B.build("6.4", ["gfx000"], tmp_path / "o", source_root=toy_root)
    with pytest.raises(TargetError, match="gfx950 not supported by ROCm profile 6.4"):
        B.build("6.4", ["gfx950"], tmp_path / "o", source_root=toy_root)
    with pytest.raises(VariantSpecError, match="no config matches gfx1100"):
        B.build("6.4", ["gfx1100"], tmp_path / "o", source_root=toy_root)
    with pytest.raises(TargetError, match="unknown ROCm profile '5.7'; valid profiles: 6.2, .*7.2"):
        B.build("5.7", ["gfx942"], tmp_path / "o", source_root=toy_root)
    with pytest.raises(TargetError, match="rdna4 .*not supported by ROCm profile 6.3"):
        B.build("6.3", ["gfx942,rdna4"], tmp_path / "o", source_root=toy_root)
    assert not (tmp_path / "o" / "archives").exists()


def test_cli_wiring(toy_root, built, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(built[0] / "cache", out / "cache")
    assert cli_main(["build", "--rocm", "6.4", "--arch", "gfx942,sm_90", "--out", str(out),
                     "--source-root", str(toy_root), "-j", "1", "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "gfx942" in text and "sm_90" in text and "0 compiled, 4 cached" in text
    assert cli_main(["build", "--rocm", "6.4", "--arch", "gfx1234", "--out", str(out),
                     "--source-root", str(toy_root)]) == 2
    assert "unknown arch gfx1234" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(not (ROOT / "kernels" / "flash_attention.py").exists(),
                    reason="no kernels/flash_attention.py yet")
def test_real_flash_kernels_gfx942(tmp_path):
    # The attention kernels at bf16 and head dim 128 (where the AMD backend's
    # options and AMD's measured configs apply), no bias, no dropout, with
    # all their candidates: the rest of the matrix is compiled by the full
    # build, not in the test suite.
    subset = ["kernel=attn_fwd|attn_bwd_preprocess|attn_bwd_dkdv|attn_bwd_dq,"
              "dtype=bf16,head_dim=128,has_bias=false,enable_dropout=false"]
    res = B.build("6.4", ["gfx942"], tmp_path, source_root=ROOT, progress=False, only=subset)
    a = Archive.open(res.archives["gfx942"])
    # every functional point once in the tuning choices; only chosen candidates ship
    choices = a.manifest["tuning"]["choices"]
    # (26 candidates at 7 points: the 16-row decoding tiles of the forward
    # and dQ, configs with the AMD backend's options, AMD's own Triton
    # backward tiles, and configs AMD measured (kernels/tuning/gfx942.json))
    assert len(choices) == 7 and res.report["per_arch"]["gfx942"]["candidates"] == 26
    chosen = {key for c in choices for _, key, _ in c["select"]}
    assert {r.key for r in a.kernels} == chosen and 7 <= len(chosen) <= 26
    # the static cost model ships a decoding tile for up to 32 query rows, never beyond
    decoding = [(bound, c["kernel"]) for c in choices for bound, key, s in c["select"]
                if "BLOCK_M=16," in key and c["kernel"] in ("attn_fwd", "attn_bwd_dq") and s == "static"]
    assert all(bound is not None and bound <= 32 for bound, _ in decoding)
    # the imported AMD measurements choose where they apply (a spilling one would fall back)
    sources = {s for c in choices for _, _, s in c["select"]}
    assert sources == {"static", "measured"} and a.manifest["exceptions"] == []
    assert a.verify() == [] and verify_against_manifest(res.archives["gfx942"]) == []
    for r in a.kernels:
        assert r.global_scratch_size == 0 and r.stats["scratch_size"] == 0
        if r.kernel != "attn_bwd_preprocess":
            assert r.stats["mfma"], r.key
    fwd = a.find("attn_fwd", dtype="bf16", head_dim=128, pad_head=False)[0]
    assert fwd.args[-2:] == (("global_scratch", "*i8"), ("profile_scratch", "*i8"))
    assert fwd.args[:-2] == a.find("attn_fwd", dtype="bf16", head_dim=128, pad_head=True)[0].args[:-2]


def test_codegen_env_is_scrubbed(toy_root, tmp_path, monkeypatch):
    from aotriton_rocm.tooling.builder.triton_compile import scrubbed_env_names
    env = {"TRITON_DEBUG": "1", "AMDGCN_USE_BUFFER_OPS": "0", "TRITON_PTXAS_PATH": "/x/ptxas",
           "TRITON_DEFAULT_FP_FUSION": "1", "TRITON_CACHE_DIR": "/c", "MLIR_ENABLE_DUMP": "1", "HOME": "/h"}
    assert scrubbed_env_names(env) == ["AMDGCN_USE_BUFFER_OPS", "MLIR_ENABLE_DUMP", "TRITON_DEBUG"]
    # A build under TRITON_KERNEL_DUMP gives the same code objects and records it.
    monkeypatch.setenv("TRITON_KERNEL_DUMP", "1")
    monkeypatch.setenv("TRITON_DUMP_DIR", str(tmp_path / "dump"))
    res = B.build("6.4", ["sm_90"], tmp_path / "out", source_root=toy_root, jobs=1, progress=False)
    assert res.report["ignored_env"] == ["TRITON_DUMP_DIR", "TRITON_KERNEL_DUMP"]
    assert not (tmp_path / "dump").exists()


def test_only_builds_whole_functional_points(toy_root, built, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(built[0] / "cache", out / "cache")
    res = B.build("6.4", ["gfx942,sm_90"], out, source_root=toy_root, jobs=1, progress=False,
                  only=["dtype=bf16"])
    for arch in ("gfx942", "sm_90"):
        a = Archive.open(res.archives[arch])
        assert [r.functional["dtype"] for r in a.kernels] == ["bf16"]
        assert a.find("scale_add", dtype="fp16", head_dim=64) == []
        assert a.manifest["subset"] == "dtype=bf16"  # marked: package refuses it unless told
    assert "subset" not in Archive.open(built[1].archives["sm_90"]).manifest
    # the CLI option: alternatives of one name, repeated options combined
    assert cli_main(["build", "--arch", "sm_90", "--out", str(out), "--source-root", str(toy_root),
                     "--only", "dtype=fp16|bf16", "--only", "head_dim=64", "--no-progress"]) == 0
    assert len(Archive.open(out / "archives" / "sm_90.aotr").kernels) == 2
    capsys.readouterr()
    # refused before compiling: an unknown name, a subset matching nothing, bad syntax
    for bad, why in ((["dtyp=fp16"], "no functional point has dtyp"),
                     (["dtype=fp32"], "matches none of the 2 variants"),
                     (["dtype"], "want NAME=VALUE")):
        assert cli_main(["build", "--arch", "sm_90", "--out", str(out), "--source-root",
                         str(toy_root), *[f"--only={b}" for b in bad]]) == 2
        assert why in capsys.readouterr().err
    assert B.Subset.parse(["causal=True,kernel=attn_fwd"]).text() == "causal=true,kernel=attn_fwd"
