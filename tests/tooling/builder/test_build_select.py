"""Candidate configs, static selection per seqlen bucket, measured tuning data
and waivers, on real (tiny) compiles for gfx942, gfx1100 and sm_90."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

pytest.importorskip("triton")

from aotriton_rocm.common.archive import Archive  # noqa: E402
from aotriton_rocm.commands.cli import main as cli_main  # noqa: E402
from aotriton_rocm.core.kernel_spec import VariantSpecError, load_variants  # noqa: E402
from aotriton_rocm.tooling.builder import command as B  # noqa: E402
from aotriton_rocm.tooling.builder import tuning as T  # noqa: E402
from support.select_toy import HOG, HOG_SMALL, MEASURED, SCALE_ADD, make_root  # noqa: E402
from support.toy_build import config_table  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]

@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = make_root(tmp_path_factory.mktemp("selroot"), SCALE_ADD + HOG.replace("{allow}", "") + HOG_SMALL)
    out = tmp_path_factory.mktemp("selout")
    res = B.build("6.4", ["gfx942,gfx1100,sm_90"], out, source_root=root, jobs=2, progress=False)
    return out, res


def test_static_choice_per_seqlen_bucket(built):
    out, res = built
    a = Archive.open(res.archives["gfx942"])
    # both candidates ship: 128 for short rows (less padding), 512 from 512 on
    assert sorted(r.config["BLOCK"] for r in a.kernels) == [128, 512]
    tun = a.manifest["tuning"]
    assert tun["axes"] == {"scale_add": "n"} and tun["seqlen_buckets"][0] == 16
    (choice,) = tun["choices"]
    assert choice["functional"] == {"dtype": "fp16", "head_dim": 64}
    assert [(b, re.search(r"BLOCK=(\d+)", k).group(1), s) for b, k, s in choice["select"]] == \
        [(256, "128", "static"), (None, "512", "static")]
    rep = res.report["per_arch"]["gfx942"]
    assert rep["kernels"] == 2 and rep["candidates"] == 2 and rep["choices"] == {"measured": 0, "static": 2}
    assert tun["measured"] is None and a.manifest["exceptions"] == []


def test_no_spills_first(built):
    out, res = built
    a = Archive.open(res.archives["gfx1100"])
    # the spilling candidate (BLOCK_M 32) is compiled, rejected and not shipped
    assert [(r.kernel, r.config["BLOCK_M"]) for r in a.kernels if r.kernel == "hog"] == [("hog", 8)]
    (rej,) = res.report["per_arch"]["gfx1100"]["rejected"]
    assert "BLOCK_M=32" in rej["key"] and "scratch memory per lane" in rej["findings"][0]
    assert a.manifest["tuning"]["axes"]["hog"] == "seqlen_q"
    # wave32 stats recorded: WMMA flag present (no dot here), occupancy estimated
    r = a.find("hog")[0]
    assert r.stats["wmma"] is False and r.stats["occupancy"] >= 1


def test_measured_choice(built):
    out, res = built
    a = Archive.open(res.archives["sm_90"])
    assert [r.config["BLOCK"] for r in a.kernels] == [256]  # the measured one, for every bucket
    tun = a.manifest["tuning"]
    assert tun["measured"] == "toy: timed on an H100"
    (choice,) = tun["choices"]
    assert [(b, s) for b, _, s in choice["select"]] == [(None, "measured")]
    assert res.report["per_arch"]["sm_90"]["choices"] == {"measured": 1, "static": 0}


def test_measured_config_must_exist(built, tmp_path):
    bad = dict(MEASURED, choices=[dict(MEASURED["choices"][0], config={"BLOCK": 999})])
    root = make_root(tmp_path / "root", SCALE_ADD, measured=bad)
    out = tmp_path / "out"
    shutil.copytree(built[0] / "cache", out / "cache")
    with pytest.raises(B.BuildError, match=r"sm_90 scale_add \[dtype=fp16,head_dim=64\]: .*sm_90.json: "
                                           r"choices\[0\] names BLOCK=999 .*no candidate config has it"):
        B.build("6.4", ["sm_90"], out, source_root=root, jobs=1, progress=False)


def test_tuned_config_is_compiled_beside_the_fallback(built, tmp_path):
    """A tuning file's full config (what `aotriton-rocm tune` writes) is a
    candidate of its own: compiled, validated and shipped although
    variants.toml has no table for it; the variants.toml configs are still
    compiled (the static fallback); the buckets no entry covers get the
    cost model's choice among all of them."""
    tuned = dict(MEASURED, choices=[
        {"kernel": "scale_add", "functional": {"dtype": ["fp16"], "head_dim": [64]},
         "seqlen_max": 1024, "config": {"BLOCK": 512, "num_warps": 4, "num_stages": 1},
         "measured": [{"seqlen": 1024, "us": 1.0}]}])
    root = make_root(tmp_path / "root", SCALE_ADD, measured=tuned)
    out = tmp_path / "out"
    shutil.copytree(built[0] / "cache", out / "cache")
    res = B.build("6.4", ["sm_90"], out, source_root=root, jobs=1, progress=False)
    assert res.compiled == 1  # the tuned config; the two variants.toml ones were cached
    rep = res.report["per_arch"]["sm_90"]
    assert rep["candidates"] == 3 and rep["choices"] == {"measured": 1, "static": 1}
    a = Archive.open(res.archives["sm_90"])
    (choice,) = a.manifest["tuning"]["choices"]
    assert [(b, re.search(r"BLOCK=(\d+)", k).group(1), s) for b, k, s in choice["select"]] == \
        [(1024, "512", "measured"), (None, "512", "static")]


def test_tuned_config_that_cannot_ship_falls_back(built, tmp_path):
    tuned = dict(MEASURED, choices=[
        {"kernel": "hog", "functional": {"dtype": ["fp16"]},
         "config": {"BLOCK_M": 32, "WIDTH": 256, "num_warps": 1, "num_stages": 1}}])
    root = make_root(tmp_path / "root", SCALE_ADD + HOG.replace("{allow}", "") + HOG_SMALL,
                     measured=None)
    (root / "kernels" / "tuning" / "gfx1100.json").write_text(json.dumps(dict(tuned, arch="gfx1100")))
    out = tmp_path / "out"
    shutil.copytree(built[0] / "cache", out / "cache")
    res = B.build("6.4", ["gfx1100"], out, source_root=root, jobs=1, progress=False)
    a = Archive.open(res.archives["gfx1100"])
    assert [r.config["BLOCK_M"] for r in a.kernels if r.kernel == "hog"] == [8]
    (note,) = [w for w in res.report["per_arch"]["gfx1100"]["warnings"] if "hog" in w]
    assert "cannot ship here" in note and "the static choice ships instead" in note


def test_spill_fails_the_build_without_a_waiver(built, tmp_path):
    root = make_root(tmp_path / "root", SCALE_ADD + HOG.replace("{allow}", ""))
    out = tmp_path / "out"
    shutil.copytree(built[0] / "cache", out / "cache")
    with pytest.raises(B.BuildError) as ei:
        B.build("6.4", ["gfx1100"], out, source_root=root, jobs=1, progress=False)
    msg = str(ei.value)
    assert re.search(r"gfx1100 hog \[dtype=fp16,head_dim=64\]: no candidate config can ship \(BLOCK_M=32,WIDTH=256,"
                     r"num_warps=1,num_stages=1: uses \d+ bytes of scratch memory per lane \(VGPR spills: \d+",
                     msg), msg
    assert 'allow = {spills = true, reason = "..."}' in msg and "no archive written" in msg
    assert not (out / "archives" / "gfx1100.aotr").exists()


def test_waiver_ships_and_is_recorded(built, tmp_path, capsys):
    allow = 'allow = { spills = true, reason = "toy: measured acceptable" }'
    root = make_root(tmp_path / "root", SCALE_ADD + HOG.replace("{allow}", allow))
    out = tmp_path / "out"
    shutil.copytree(built[0] / "cache", out / "cache")
    res = B.build("6.4", ["gfx1100"], out, source_root=root, jobs=1, progress=False)
    assert res.compiled == 0
    a = Archive.open(res.archives["gfx1100"])
    (exc,) = a.manifest["exceptions"]
    assert exc["kind"] == "spills" and exc["reason"] == "toy: measured acceptable"
    assert "BLOCK_M=32" in exc["key"] and "scratch memory per lane" in exc["finding"]
    assert res.report["per_arch"]["gfx1100"]["validation"]["allowed"]
    assert cli_main(["validate", str(res.archives["gfx1100"])]) == 0
    text = capsys.readouterr().out
    assert re.search(r"^allowed gfx1100 hog\|dtype=fp16\|head_dim=64\|BLOCK_M=32.*spills.*"
                     r"toy: measured acceptable", text, re.M)
    assert "1 allowed" in text


@pytest.mark.parametrize("allow, match", [
    ('allow = { spills = true }', "allow needs a reason"),
    ('allow = { spills = false, reason = "x" }', "at least one of spills, scratch, lds"),
    ('allow = { registers = true, reason = "x" }', r"allow names \['registers'\]"),
    ('allow = "spills"', "allow must be a table"),
    ('allow = { spills = true, reason = "x", only = [{ dtype = "fp8" }] }', "allow.only must list partial"),
])
def test_waiver_syntax_errors(tmp_path, allow, match):
    root = make_root(tmp_path / "root", SCALE_ADD + HOG.replace("{allow}", allow))
    with pytest.raises(VariantSpecError, match=match):
        load_variants(root / "kernels")


def test_waiver_only_at_some_points(tmp_path):
    allow = 'allow = { spills = true, reason = "x", only = [{ dtype = "bf16" }] }'
    spec = load_variants(make_root(tmp_path / "root", SCALE_ADD + HOG.replace("{allow}", allow).replace(
        'functional = { dtype = ["fp16"], head_dim = [64] }',
        'functional = { dtype = ["fp16", "bf16"], head_dim = [64] }')) / "kernels")
    from aotriton_rocm.tooling.common.targets import load_targets
    vs = spec.variants_for(load_targets(ROOT / "ci" / "targets.toml").archs["gfx1100"])
    assert {v.functional["dtype"]: v.allow for v in vs if v.kernel == "hog" and v.config["BLOCK_M"] == 32} == \
        {"fp16": {}, "bf16": {"spills": "x"}}


def test_cost_model_order():
    def cand(key, rows, cols=64, occ=2, order=0, scratch=0, findings=(), waived=None, warps=4):
        return T.Candidate(key=key, config={}, order=order, rows=rows, cols=cols, num_warps=warps,
                           occupancy=occ, scratch=scratch, findings=list(findings), waived=waived or {})

    def best(cs, bound):
        return min((c for c in cs if c.eligible), key=lambda c: T.static_rank(c, bound)).key

    big, small = cand("128x64", 128, order=0), cand("64x64", 64, order=1)
    assert best([big, small], None) == "128x64" and best([big, small], 64) == "64x64"
    # occupancy counts up to 2 waves/SIMD, then the tile
    assert best([cand("a", 128, occ=1), cand("b", 64, occ=2, order=1)], None) == "b"
    assert best([cand("a", 128, occ=2), cand("b", 64, occ=5, order=1)], None) == "a"
    # clean first; among waived ones, fewer scratch bytes
    spill = [("spills", "uses 400 bytes of scratch")]
    w1 = cand("w1", 128, occ=5, scratch=400, findings=spill, waived={"spills": "r"})
    w2 = cand("w2", 128, occ=5, scratch=200, findings=spill, waived={"spills": "r"}, order=1)
    assert best([w1, w2, cand("clean", 16, occ=1, order=2)], None) == "clean"
    assert best([w1, w2], None) == "w2"
    assert not cand("x", 64, findings=spill).eligible
    runs = T.choose([big, small], kernel="k", functional={})
    assert runs == [[64, "64x64", "static"], [None, "128x64", "static"]]
    with pytest.raises(ValueError):
        T.choose([cand("x", 64, findings=spill)], kernel="k", functional={})
    assert T.grid_axis(["cdiv(max_seqlen_k, BLOCK_N)", "1", "1"]) == ("seqlen_k", "BLOCK_N")
    assert T.grid_axis(["4", "1", "1"]) == (None, None)


def test_why_not_chosen():
    def cand(key, rows, cols=64, occ=2, order=0, scratch=0, findings=(), waived=None, warps=4):
        return T.Candidate(key=key, config={"BLOCK_M": rows}, order=order, rows=rows, cols=cols,
                           num_warps=warps, occupancy=occ, scratch=scratch, findings=list(findings),
                           waived=waived or {})

    big, small = cand("128x64", 128), cand("64x64", 64, order=1)
    assert T.why_not_chosen(big, small, 64, "static") == "pads more rows at these seqlens (128-row tile vs 64)"
    assert T.why_not_chosen(small, big, None, "static") == "fewer useful rows (64-row tile vs 128)"
    assert T.why_not_chosen(cand("a", 128, occ=1), small, None, "static") == \
        "lower occupancy (1 < 2 waves/SIMD)"
    assert T.why_not_chosen(cand("n", 128, cols=32), big, None, "static") == "smaller loop tile (32 < 64)"
    assert T.why_not_chosen(cand("w", 128, warps=8), big, None, "static") == "more warps (8 > 4)"
    assert T.why_not_chosen(cand("later", 128, order=3), big, None, "static").startswith("declared later")
    spill = [("spills", "uses 400 bytes of scratch")]
    assert T.why_not_chosen(cand("s", 128, findings=spill), small, None, "static") == \
        "rejected: uses 400 bytes of scratch"
    waived = cand("w1", 128, scratch=400, findings=spill, waived={"spills": "r"})
    assert T.why_not_chosen(waived, small, None, "static").startswith("ships only under a waiver")
    assert T.why_not_chosen(small, big, None, "measured") == "measured: the tuning file names BLOCK_M=128"
    # per run of choose(): every other candidate, in words (one text for the
    # buckets of a run where they agree)
    runs = T.choose([big, small], kernel="k", functional={})
    assert T.losses([big, small], runs) == [
        {"128x64": "pads more rows at these seqlens (128-row tile vs 64)"},
        {"64x64": "fewer useful rows (64-row tile vs 128)"}]


def test_seqlen_max_limits_a_candidate_to_short_buckets(tmp_path):
    """A config's seqlen_max: the cost model ships it only for buckets up to
    that length, even where it would win a longer one (here on occupancy),
    says why elsewhere, and the variant carries it (not in its key)."""
    def cand(key, rows, occ, order, seqlen_max=None):
        return T.Candidate(key=key, config={"BLOCK_M": rows}, order=order, rows=rows, cols=64,
                           occupancy=occ, seqlen_max=seqlen_max)

    big, small = cand("128x64", 128, 1, 0), cand("16x64", 16, 2, 1, seqlen_max=32)
    assert T.choose([big, small], kernel="k", functional={}) == [
        [32, "16x64", "static"], [None, "128x64", "static"]]
    assert T.losses([big, small], [[32, "16x64", "static"], [None, "128x64", "static"]])[1] == {
        "16x64": "a tile for sequences of up to 32 only (its seqlen_max)"}
    # alone it still ships everywhere rather than nothing
    assert T.choose([small], kernel="k", functional={}) == [[None, "16x64", "static"]]

    root = make_root(tmp_path / "root", SCALE_ADD + config_table("scale_add", "gfx942", BLOCK=64,
                                                                  num_warps=4, seqlen_max=32))
    spec = load_variants(root / "kernels")
    from aotriton_rocm.tooling.common.targets import load_targets
    vs = [v for v in spec.variants_for(load_targets(ROOT / "ci" / "targets.toml").archs["gfx942"])
          if v.kernel == "scale_add"]
    assert {v.config.get("BLOCK"): v.seqlen_max for v in vs}[64] == 32
    assert all("seqlen_max" not in v.key for v in vs)
    with pytest.raises(VariantSpecError, match="seqlen_max must be a positive integer"):
        load_variants(make_root(tmp_path / "bad", SCALE_ADD + config_table(
            "scale_add", "gfx942", BLOCK=64, num_warps=4, seqlen_max=0)) / "kernels")


def test_decoding_entry_is_a_choice_of_its_own():
    """A tuning entry with seqlen_q_max names the decoding tile of a point
    (the manifest's "decode"), apart from the buckets, which it never
    decides; it serves every key length."""
    def cand(key, rows, order):
        return T.Candidate(key=key, config={"BLOCK_M": 16, "BLOCK_N": rows}, order=order, rows=rows,
                           cols=16)

    big, small = cand("16x128", 128, 0), cand("16x64", 64, 1)
    doc = {"schema": 1, "arch": "sm_90", "choices": [
        {"kernel": "k", "functional": {"dtype": ["bf16"]}, "seqlen_max": None, "seqlen_q_max": 16,
         "config": {"BLOCK_N": 64}},
        {"kernel": "k", "functional": {"dtype": ["bf16"]}, "seqlen_max": None, "config": {"BLOCK_N": 128}}]}
    measured = T.load_measured_text(json.dumps(doc), "sm_90", "sm_90.json")
    for func, decode in (({"dtype": "bf16"}, [16, "16x64", "measured"]), ({"dtype": "fp16"}, None)):
        assert T.choose_decode([big, small], kernel="k", functional=func, measured=measured) == decode
    assert T.choose([big, small], kernel="k", functional={"dtype": "bf16"}, measured=measured) == [
        [None, "16x128", "measured"]]
    assert T.choose_decode([big, small], kernel="k", functional={"dtype": "bf16"}) is None
    with pytest.raises(T.TuningError, match="no candidate config has it"):
        T.choose_decode([big], kernel="k", functional={"dtype": "bf16"}, measured=measured)
    doc["choices"][0]["seqlen_max"] = 512
    with pytest.raises(T.TuningError, match="serves every key length"):
        T.load_measured_text(json.dumps(doc), "sm_90", "sm_90.json")


def test_selection_records_every_candidate(built):
    out, res = built
    per = res.report["per_arch"]
    (point,) = per["gfx942"]["selection"]
    assert point["kernel"] == "scale_add" and point["functional"] == {"dtype": "fp16", "head_dim": 64}
    blocks = [re.search(r"BLOCK=(\d+)", c["key"]).group(1) for c in point["candidates"]]
    assert sorted(blocks) == ["128", "512"]
    for c in point["candidates"]:  # the build's cache holds every candidate's code object
        assert (out / "cache" / c["cache_key"][:2] / f"{c['cache_key']}.bin").is_file()
    tun = Archive.open(res.archives["gfx942"]).manifest["tuning"]["choices"][0]["select"]
    assert [run[:3] for run in point["select"]] == tun
    i128, i512 = blocks.index("128"), blocks.index("512")
    (b1, _, _, why1), (b2, _, _, why2) = point["select"]
    assert (b1, why1[i128], why1[i512]) == (256, None, "pads more rows at these seqlens (512-row tile vs 128)")
    assert (b2, why2[i512], why2[i128]) == (None, None, "fewer useful rows (128-row tile vs 512)")
    # the spilling candidate: rejected with its finding
    (hog,) = [p for p in per["gfx1100"]["selection"] if p["kernel"] == "hog"]
    why = dict(zip([c["key"] for c in hog["candidates"]], hog["select"][0][3]))
    assert re.fullmatch(r"rejected: uses \d+ bytes of scratch memory per lane .*",
                        next(w for k, w in why.items() if "BLOCK_M=32" in k))
    # measured: the other candidate lost to the tuning file
    (sm,) = per["sm_90"]["selection"]
    (run,) = sm["select"]
    assert [w for w in run[3] if w] == ["measured: the tuning file names BLOCK=256,num_warps=4,num_stages=1"]


def test_static_report_of_the_toy_build(built, capsys):
    # the report reads the AMD archives only; the rejected (spilling) hog
    # candidate is listed under the shipped one with its scratch and finding
    from aotriton_rocm.tooling.builder import static_report as R
    out, res = built
    reports = R.read_build(out)
    assert [r.arch for r in reports] == ["gfx942", "gfx1100"]
    (hog,) = [c for c in reports[1].choices if c.kernel == "hog"]
    (spilled,) = hog.others
    assert hog.chosen.config["BLOCK_M"] == 8 and spilled.config["BLOCK_M"] == 32
    assert spilled.figures.scratch > 0 and spilled.figures.vgpr_spills > 0
    assert spilled.why.startswith(f"rejected: uses {spilled.figures.scratch} bytes of scratch memory")
    assert hog.chosen.figures.scratch == 0 and hog.chosen.figures.loop is None  # no loop in hog
    assert cli_main(["report", str(out), "--arch", "gfx1100"]) == 0
    text = capsys.readouterr().out
    assert re.search(r"^hog +fp16 d64 +q any +8 WIDTH=256 w1 s1 .* chosen \(static\)$", text, re.M), text
    assert re.search(r"^ +vs 32 WIDTH=256 w1 s1 .* rejected: uses \d+ bytes of scratch", text, re.M), text
    assert cli_main(["report", str(out), "--arch", "sm_90"]) == 2
    assert "sm_90 is not an AMD arch" in capsys.readouterr().err
