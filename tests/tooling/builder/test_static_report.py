"""``aotriton-rocm report``: the AMD static speed report of real gfx942 and
gfx908 builds (the forward at head dim 128 and the backward preprocess
kernel, every candidate config), its figures checked against the code
objects and LLVM's own figures, the chosen/rejected structure, JSON and the
diff between two builds."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest

pytest.importorskip("triton")

from aotriton_rocm.common.archive import Archive  # noqa: E402
from aotriton_rocm.commands.cli import main as cli_main  # noqa: E402
from aotriton_rocm.tooling.builder import command as B  # noqa: E402
from aotriton_rocm.tooling.builder import static_report as R  # noqa: E402
from aotriton_rocm.tooling.builder.cache import CompileCache  # noqa: E402
from aotriton_rocm.tooling.builder.codeobject import inspect_code_object  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
ONLY = "kernel=attn_fwd|attn_bwd_preprocess,dtype=fp16,head_dim=128,has_bias=false,enable_dropout=false"
ARCHS = ("gfx942", "gfx908")
# the 64x64 forward candidate of CDNA at head dims 64 and 128, and the same with 8 warps
SMALL_TILE = 'archs = ["cdna"]\nhead_dims = [64, 128]\nBLOCK_M = 64\nBLOCK_N = 64\nnum_warps = 4\n'


def _static_kernels(dst: Path) -> Path:
    """A copy of kernels/ whose AMD choices are all the cost model's: without
    the imported AMD tuning files and the configs with the AMD backend's
    options (test_amd_options_in_the_config_column shows those)."""
    shutil.copytree(ROOT / "kernels", dst)
    for f in (dst / "tuning").glob("gfx*.json"):
        f.unlink()
    blocks = re.split(r"(?m)^(?=\[\[kernels\.)", (dst / "variants.toml").read_text())
    (dst / "variants.toml").write_text("".join(b for b in blocks
                                               if not re.search(r"(?m)^waves_per_eu\s*=", b)))
    return dst


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("report-build")
    kernels = _static_kernels(tmp_path_factory.mktemp("kernels") / "kernels")
    B.build("6.4", list(ARCHS), out, source_root=ROOT, kernels_dir=kernels, jobs=2, progress=False,
            only=[ONLY])
    return out


def test_amd_options_in_the_config_column():
    assert R.config_text({"BLOCK_M": 128, "BLOCK_N": 64, "PRE_LOAD_V": True, "num_warps": 4,
                          "num_stages": 1, "waves_per_eu": 2, "matrix_instr_nonkdim": 16,
                          "kpack": 2}) == "128x64 preV w4 s1 wpe2 nk16 kp2"
    assert R.config_text({"BLOCK_M": 64, "BLOCK_N": 32, "PRE_LOAD_V": False, "num_warps": 4}) == "64x32 w4"
    assert "wpe = waves_per_eu" in R.LEGEND and "PRE_LOAD_V" in R.LEGEND


@pytest.fixture(scope="module")
def rebuilt(built, tmp_path_factory):
    """The same build with the 64x64 candidate at 8 warps (gfx942 only)."""
    kernels = _static_kernels(tmp_path_factory.mktemp("kernels8") / "kernels")
    spec = (kernels / "variants.toml").read_text()
    assert spec.count(SMALL_TILE) == 1
    (kernels / "variants.toml").write_text(spec.replace(SMALL_TILE, SMALL_TILE.replace("= 4", "= 8")))
    out = tmp_path_factory.mktemp("report-rebuild")
    shutil.copytree(built / "cache", out / "cache")
    res = B.build("6.4", ["gfx942"], out, source_root=ROOT, kernels_dir=kernels, jobs=2, progress=False,
                  only=[ONLY])
    assert res.compiled == 2  # the changed candidate, with and without pad_head
    return out


def _lds_bound(lds: int, warps: int, limits) -> int:
    return min(limits["max_waves"], (limits["lds_bytes"] // lds) * math.ceil(warps / limits["simds_per_cu"]))


def _check_figures(f: R.Figures, code: bytes, symbol: str, warps: int, shared: int, stats, limits):
    """The report's figures against the code object's metadata and against
    what LLVM printed in the assembly text at compile time (``stats``)."""
    km = inspect_code_object(code).kernel(symbol)
    assert (f.agpr, f.sgpr, f.scratch) == (km.agpr_count, km.sgpr_count, km.private_segment_fixed_size)
    assert (f.vgpr_spills, f.sgpr_spills) == (km.vgpr_spill_count, km.sgpr_spill_count)
    # the assembler's metadata YAML: on gfx942 .vgpr_count is VGPRs + AGPRs already
    unified = limits["vgpr_mode"] == "unified"
    assert f.registers == (stats["vgpr_count"] if unified else stats["vgpr_count"] + stats["agpr_count"])
    assert f.registers == f.vgpr + f.agpr and f.agpr == stats["agpr_count"]
    assert f.lds == shared > 0  # triton's AMD kernels take all their LDS at launch
    # LLVM's "; Occupancy:" (registers; it cannot know the LDS triton asks for at launch)
    llvm = stats.get("llvm_occupancy", stats["occupancy"])
    assert f.occupancy == min(llvm, _lds_bound(f.lds, warps, limits)) >= 1
    assert f.loop_known and f.loop == stats["loop"]


def test_figures_match_the_code_objects(built):
    reports = R.read_build(built)
    assert [r.arch for r in reports] == list(ARCHS)
    cache = CompileCache(built / "cache")
    sel = json.loads((built / "build-report.json").read_text())["per_arch"]
    for rep in reports:
        a = Archive.open(rep.archive)
        limits = a.manifest["arch_limits"]
        cache_key = {c["key"]: c["cache_key"] for p in sel[rep.arch]["selection"] for c in p["candidates"]}
        for ch in rep.choices:
            r = next(r for r in a.kernels if r.key == ch.chosen.key)
            _check_figures(ch.chosen.figures, a.code_object(r), r.symbol, r.num_warps, r.shared,
                           r.stats, limits)
            for o in ch.others:
                meta, code = cache.get(cache_key[o.key])
                _check_figures(o.figures, code, meta["symbol"], meta["num_warps"], meta["shared"],
                               meta["stats"], limits)
            f = ch.chosen.figures
            if ch.kernel == "attn_bwd_preprocess":
                assert f.loop is None and f.per_iter("mfma") == 0  # elementwise, no loop
            else:
                assert f.per_iter("mfma") > 0 and f.per_iter("global_loads") > 0
            if ch.chosen.config.get("BLOCK_M") == 128 and ch.kernel == "attn_fwd":
                # 4 waves, 32x32x8 MFMAs: a quarter of QK^T and PV of a 128x64 tile each
                assert f.per_iter("mfma") * 4 * 32 * 32 * 8 == 2 * 128 * 64 * 128


def test_chosen_and_rejected(built):
    reports = R.read_build(built)
    sel = json.loads((built / "build-report.json").read_text())["per_arch"]
    for rep in reports:
        a = Archive.open(rep.archive)
        assert rep.shipped == len(a.kernels) and rep.candidates_recorded
        shipped = {r.key for r in a.kernels}
        points = {}
        for ch in rep.choices:
            points.setdefault((ch.kernel, R.functional_text(ch.functional)), []).append(ch)
            assert ch.chosen.key in shipped and ch.source == "static"
            assert ch.chosen.key not in {o.key for o in ch.others}
            assert all(o.why and o.figures is not None for o in ch.others)
        # two forward points (pad_head or not), one preprocess point
        assert sorted(k for k, _ in points) == ["attn_bwd_preprocess", "attn_fwd", "attn_fwd"]
        candidates = {(p["kernel"], R.functional_text(p["functional"])): {c["key"] for c in p["candidates"]}
                      for p in sel[rep.arch]["selection"]}
        for key, runs in points.items():
            # runs cover every bucket once, in order, the last one open
            assert runs[0].lower == 0 and runs[-1].bounds[-1] is None
            assert [r.lower for r in runs[1:]] == [r.bounds[-1] for r in runs[:-1]]
            # each run: the chosen config and every other candidate of the point
            for r in runs:
                assert {r.chosen.key} | {o.key for o in r.others} == candidates[key]
            assert len(candidates[key]) == (3 if key[0] == "attn_fwd" else 1)
    text = R.format_report(reports)
    # a chosen row, the candidate beneath it and why it lost
    assert re.search(r"^attn_fwd +fp16 d128 +q 33\.\.64 +64x64 w4 s1 +(\d+ +){4}\d+/\d+ +\d+ +\d+ +\d+ +\d+ "
                     r"+\d+/\d+ +\d+ +chosen \(static\)$", text, re.M), text
    # the decoding tile: chosen up to 32 query rows, held back above by its seqlen_max
    assert re.search(r"^attn_fwd +fp16 d128 +q<=32 +16x64 w4 s1 .* chosen \(static\)$", text, re.M), text
    assert re.search(r"^ +vs 16x64 w4 s1 .* a tile for sequences of up to 32 only \(its seqlen_max\)$",
                     text, re.M), text
    assert re.search(r"^ +vs 128x64 w4 s1 .* pads more rows at these seqlens \(128-row tile vs 64\)$",
                     text, re.M), text
    assert re.search(r"^attn_fwd +fp16 d128 +q>64 +128x64 w4 s1 ", text, re.M)
    assert re.search(r"^ +vs 64x64 w4 s1 .* fewer useful rows \(64-row tile vs 128\)$", text, re.M)
    assert re.search(r"^attn_bwd_preprocess +fp16 d128 +q any +128 w4 s1 .* 0 +0 +0 +0/0 +0 +chosen", text, re.M)
    assert text.count("gfx942 (") == 1 and text.count("gfx908 (") == 1 and "hot loop" in text


def test_cli_json_and_filters(built, tmp_path, capsys):
    js = tmp_path / "report.json"
    assert cli_main(["report", str(built), "--arch", "gfx908", "--only", "kernel=attn_fwd",
                     "--json", str(js)]) == 0
    text = capsys.readouterr().out
    assert "gfx908 (" in text and "gfx942 (" not in text and "attn_bwd_preprocess" not in text
    doc = json.loads(js.read_text())
    (arch,) = doc["archs"]
    (rep,) = R.read_build(built, ["gfx908"], ["kernel=attn_fwd"])
    assert arch["arch"] == "gfx908" and len(arch["choices"]) == len(rep.choices) > 0
    for jc, ch in zip(arch["choices"], rep.choices):
        assert jc["chosen"]["key"] == ch.chosen.key and jc["bounds"] == ch.bounds
        assert jc["chosen"]["figures"]["occupancy"] == ch.chosen.figures.occupancy
        assert jc["chosen"]["figures"]["loop"]["mfma"] == ch.chosen.figures.per_iter("mfma")
        assert [o["why"] for o in jc["others"]] == [o.why for o in ch.others]


def test_diff_between_builds(built, rebuilt, tmp_path, capsys):
    # the 64x64 tile at 8 warps: 2 waves per SIMD on gfx942, so it wins every
    # bucket above the decoding tile's (up to 32 query rows)
    (rep,) = R.read_build(rebuilt)
    assert {(c.chosen.config["BLOCK_M"], c.chosen.config["num_warps"])
            for c in rep.choices if c.kernel == "attn_fwd"} == {(16, 4), (64, 8)}
    assert all(c.bounds[-1] == 32 for c in rep.choices
               if c.kernel == "attn_fwd" and c.chosen.config["BLOCK_M"] == 16)
    (old,) = R.read_build(built, ["gfx942"])
    changes = R.compare([old], [rep])
    assert changes and all(c.arch == "gfx942" and c.kernel == "attn_fwd" for c in changes)
    assert not any(c.worse for c in changes)
    # (the unmasked fast path may reach 2 waves at 4 warps already)
    assert any(c.new.figures.occupancy > c.old.figures.occupancy for c in changes)
    for c in changes:
        assert c.new.figures.occupancy >= c.old.figures.occupancy
        if c.new.figures.occupancy != c.old.figures.occupancy:
            assert f"occupancy {c.old.figures.occupancy} -> {c.new.figures.occupancy}" in c.changes
        if c.old.figures.per_iter("mfma") != c.new.figures.per_iter("mfma"):
            assert any(t.startswith("MFMA/iter ") for t in c.changes)
    # the other way round the same kernels got worse, and --fail-on-worse says so
    assert cli_main(["report", str(built), "--arch", "gfx942", "--against", str(rebuilt),
                     "--fail-on-worse", "--json", str(tmp_path / "d.json")]) == 1
    out, err = capsys.readouterr()
    assert re.search(r"^gfx942 +attn_fwd +fp16 d128 pad_head +q>64 +64x64 w8 s1 -> 128x64 w4 s1 +worse "
                     r"+occupancy 2 -> 1 "
                     r"\(worse\); VGPR\+AGPR \d+ -> \d+ \(worse\); LDS 16384 -> 32768 \(worse\); MFMA/iter",
                     out, re.M), out
    assert "got worse" in err
    doc = json.loads((tmp_path / "d.json").read_text())
    assert doc["changes"] and all(c["worse"] for c in doc["changes"] if c["point"] == "fp16 d128")
    # a build against itself: nothing changed; gfx908 is in one build only
    assert cli_main(["report", str(built), "--against", str(built), "--fail-on-worse"]) == 0
    assert "no shipped kernel's occupancy" in capsys.readouterr().out
    assert cli_main(["report", str(built), "--against", str(rebuilt)]) == 0
    assert re.search(r"^gfx908 +attn_fwd .* only in this build$", capsys.readouterr().out, re.M)


def test_missing_candidates_and_bad_input(built, rebuilt, tmp_path, capsys):
    copy = tmp_path / "copy"
    shutil.copytree(rebuilt, copy)
    rep_path = copy / "build-report.json"
    doc = json.loads(rep_path.read_text())
    # 128x64 ships nowhere in the rebuild: only the cache has its code object
    shipped = {r.key for r in Archive.open(copy / "archives" / "gfx942.aotr").kernels}
    (lost, *_) = [c for p in doc["per_arch"]["gfx942"]["selection"] for c in p["candidates"]
                  if c["key"] not in shipped]
    for p in (copy / "cache" / lost["cache_key"][:2]).glob(lost["cache_key"] + ".*"):
        p.unlink()
    (rep,) = R.read_build(copy)
    gone = [o for c in rep.choices for o in c.others if o.key == lost["key"]]
    assert gone and all(o.figures is None and "not in the build's cache" in o.missing for o in gone)
    assert "not in the build's cache (cleaned?)" in R.format_report([rep])
    # a build report from before candidates were recorded: shipped kernels only
    for arch in doc["per_arch"].values():
        arch.pop("selection")
    rep_path.write_text(json.dumps(doc))
    (rep,) = R.read_build(copy, ["gfx942"])
    assert not rep.candidates_recorded and all(c.others == [] for c in rep.choices) and rep.choices
    assert "lists no candidates" in R.format_report([rep])
    # not a build output, an arch it lacks, a flag without its partner: exit 2
    assert cli_main(["report", str(tmp_path)]) == 2
    assert "has no build-report.json" in capsys.readouterr().err
    assert cli_main(["report", str(built), "--arch", "gfx90a"]) == 2
    assert "has no archive for gfx90a" in capsys.readouterr().err
    assert cli_main(["report", str(built), "--fail-on-worse"]) == 2
    assert "--fail-on-worse needs --against" in capsys.readouterr().err
    assert cli_main(["report", str(built), "--only", "head_dim=64"]) == 2
    assert "--only head_dim=64 matches none of the shipped kernels" in capsys.readouterr().err
    assert cli_main(["report", str(built), "--only", "headdim=128"]) == 2
    assert "no functional point has headdim" in capsys.readouterr().err
