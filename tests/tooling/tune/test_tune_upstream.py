"""The converter of upstream AOTriton's tuning databases (tooling/tune/upstream.py),
on a tiny sqlite database made here (never the real one)."""
from __future__ import annotations

import io
import json
import lzma
import sqlite3
import tarfile
from pathlib import Path

from aotriton_rocm.tooling.builder.tuning import load_measured_text, dump_measured
from aotriton_rocm.tooling.tune import upstream, upstream_drops

COLS = ["gpu", "inputs$Q_dtype", "inputs$Max_seqlen_q", "inputs$Max_seqlen_k", "inputs$CAUSAL_TYPE",
        "inputs$BLOCK_DMODEL", "inputs$ENABLE_DROPOUT", "inputs$PADDED_HEAD", "inputs$BIAS_TYPE",
        "inputs$USE_ALIBI", "inputs$INT8", "inputs$INT8_KV", "inputs$USE_P_SCALE",
        "tuned_kernel$PERSISTENT_TYPE", "tuned_kernel$GRID_CU_MULTIP", "tuned_kernel$BLOCK_M",
        "tuned_kernel$BLOCK_N", "tuned_kernel$PRE_LOAD_V", "compiler_options$waves_per_eu",
        "compiler_options$num_warps", "compiler_options$num_stages"]
BIG = (128, 64, 1, 1, 4, 1)    # BLOCK_M, BLOCK_N, PRE_LOAD_V, waves_per_eu, num_warps, num_stages
SMALL = (64, 64, 0, 2, 4, 1)
ODD = (32, 16, 1, 2, 2, 1)      # a tile we do not compile


def _row(sq, sk, causal, d, cfg, alibi=0):
    return ("gfx942_mod0", "torch.bfloat16", sq, sk, causal, d, 0, 0, 0, alibi, 0, 0, 0, 0, 2, *cfg)


def _make_db(root: Path, rows, packed: bool) -> None:
    d = root / "gfx942" / "flash"
    d.mkdir(parents=True)
    db = d / "attn_fwd.sqlite3"
    conn = sqlite3.connect(db)
    conn.execute('CREATE TABLE "FLASH$attn_fwd" (' + ", ".join(f'"{c}"' for c in COLS) + ")")
    conn.executemany(f'INSERT INTO "FLASH$attn_fwd" VALUES ({",".join("?" * len(COLS))})', rows)
    conn.commit()
    conn.close()
    if packed:  # as upstream ships it: a .tar.xz holding the one file
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(db, arcname="attn_fwd.sqlite3")
        (d / "attn_fwd.sqlite3.tar.xz").write_bytes(lzma.compress(buf.getvalue()))
        db.unlink()


def _rows():
    rows = []
    lengths = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
    for sq in lengths:
        for sk in lengths:
            for causal in (0, 3):
                # short queries: 64x64 mostly; long ones 128x64 with PRE_LOAD_V
                cfg = SMALL if sq <= 64 else BIG
                if sq == 256 and sk < 64:
                    cfg = ODD  # a minority: outvoted
                rows.append(_row(sq, sk, causal, 128, cfg))
                rows.append(_row(sq, sk, causal, 128, ODD, alibi=1))  # ALiBi rows are never used
    return rows


POINT = {"dtype": "bf16", "head_dim": 128, "pad_head": False, "has_bias": False, "enable_dropout": False}
CANDIDATES = {upstream_drops.point_key("attn_fwd", POINT): [
    {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 4, "num_stages": 1},
    {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 1}]}


def _convert(root, **kw):
    return upstream.convert(root, "gfx942", tag="0.13b", commit="c0ffee", candidates=CANDIDATES,
                            kernels=["attn_fwd"], points_of=lambda k: [POINT], **kw)


def test_votes_map_onto_buckets_with_provenance(tmp_path):
    _make_db(tmp_path, _rows(), packed=True)
    doc = _convert(tmp_path)
    ch = doc["choices"]
    # 64x64 (a tile we compile: named by its tile only) up to 64 query rows,
    # then upstream's own 128x64 config (the admitted one, with its options) above
    assert [(c["seqlen_max"], c["config"]) for c in ch] == [
        (64, {"BLOCK_M": 64, "BLOCK_N": 64}),
        (None, {"BLOCK_M": 128, "BLOCK_N": 64, "PRE_LOAD_V": True, "waves_per_eu": 1,
                "num_warps": 4, "num_stages": 1})]
    for c in ch:
        assert c["source"] == upstream.SOURCE
        up = c["upstream"]
        assert up["tag"] == "0.13b" and up["commit"] == "c0ffee"
        assert up["database"] == "modules/database/amd/gfx942/flash/attn_fwd.sqlite3.tar.xz"
        assert "gfx942_mod0" in up["gpu"] and "attn_fwd" in up["kernel"]
    # 3 buckets x 20 rows for the first run; ALiBi rows left out
    assert ch[0]["upstream"]["votes"] == "60 of 60 rows"
    # 256: 4 of its 20 rows chose the odd tile, outvoted (the open bucket takes 8192's rows)
    assert ch[1]["upstream"]["votes"] == f"{16 + 20 * 7} of {20 * 8} rows"
    # The build reads it: the first entry names the short tile for the short buckets.
    data = load_measured_text(dump_measured(doc), "gfx942", "gfx942.json")
    assert data.entry_for("attn_fwd", POINT, 32).config == (("BLOCK_M", 64), ("BLOCK_N", 64))
    assert dict(data.entry_for("attn_fwd", POINT, 4096).config)["PRE_LOAD_V"] is True


def test_deterministic_and_packed_or_not_alike(tmp_path):
    _make_db(tmp_path / "a", _rows(), packed=True)
    _make_db(tmp_path / "b", list(reversed(_rows())), packed=False)
    a, b = dump_measured(_convert(tmp_path / "a")), dump_measured(_convert(tmp_path / "b"))
    assert a == b
    assert a == dump_measured(_convert(tmp_path / "a"))


def test_spilling_config_dropped_with_note(tmp_path):
    _make_db(tmp_path, _rows(), packed=False)
    big = {"BLOCK_M": 128, "BLOCK_N": 64, "PRE_LOAD_V": True, "waves_per_eu": 1, "num_warps": 4,
           "num_stages": 1}
    drops_file = tmp_path / "drops.json"
    drops_file.write_text(json.dumps([{"arch": "gfx942", "kernel": "attn_fwd",
                                       "functional": {k: [v] for k, v in POINT.items()},
                                       "config": big, "why": "spills 12 VGPRs"}]))
    doc = _convert(tmp_path, drops=upstream_drops.load_drops(drops_file))
    assert doc["dropped"] == [{"kernel": "attn_fwd", "functional": {k: [v] for k, v in POINT.items()},
                               "config": big, "why": "spills 12 VGPRs"}]
    # the long buckets fall back to our candidate of upstream's tile
    assert doc["choices"][-1]["config"] == {"BLOCK_M": 128, "BLOCK_N": 64}
    assert "upstream chose" in doc["choices"][-1]["upstream"]["config"]


def test_no_candidate_tile_ends_the_point(tmp_path):
    # RDNA points compile no upstream config of their own: a tile we lack is no entry
    rows = [_row(sq, sk, c, 128, ODD) for sq in (16, 32) for sk in (16, 32) for c in (0, 3)]
    _make_db(tmp_path / "x", rows, packed=False)
    (tmp_path / "gfx1100").mkdir()
    (tmp_path / "x" / "gfx942" / "flash").rename(tmp_path / "gfx1100" / "flash")
    doc = upstream.convert(tmp_path, "gfx1100", tag="0.13b", candidates=CANDIDATES,
                           kernels=["attn_fwd"], points_of=lambda k: [POINT])
    assert doc["choices"] == []  # static everywhere


def test_gfx908_takes_gfx90a_evidence(tmp_path):
    d = tmp_path / "gfx90a" / "flash"
    _make_db(tmp_path / "x", _rows(), packed=False)
    d.parent.mkdir(parents=True)
    (tmp_path / "x" / "gfx942" / "flash").rename(d)
    doc = upstream.convert(tmp_path, "gfx908", tag="0.13b", candidates=CANDIDATES,
                           kernels=["attn_fwd"], points_of=lambda k: [POINT])
    assert doc["choices"] and all("nearest CDNA" in c["upstream"]["note"] for c in doc["choices"])
    assert "gfx90a" in doc["choices"][0]["upstream"]["database"]


def test_committed_files_load_and_carry_provenance():
    root = Path(__file__).resolve().parents[3] / "kernels" / "tuning"
    for arch in ("gfx908", "gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1201"):
        text = (root / f"{arch}.json").read_text(encoding="utf-8")
        data = load_measured_text(text, arch, arch)
        doc = json.loads(text)
        assert data.entries and len(data.entries) == len(doc["choices"])
        for c in doc["choices"]:
            assert c["source"] == upstream.SOURCE or "measured" in c
            if c["source"] == upstream.SOURCE:
                assert {"kernel", "gpu", "database", "tag", "votes"} <= set(c["upstream"])


def test_tune_replaces_imported_entries_point_by_point(tmp_path):
    """A tune run on the GPU over an imported file: its own choices first,
    the imported entries kept (with their provenance) for the buckets it did
    not time and for the points it did not tune."""
    from aotriton_rocm.tooling.tune.tuning_file import PointResult, PreviousFile, merged_file
    _make_db(tmp_path, _rows(), packed=False)
    other = dict(POINT, dtype="fp16")
    doc = upstream.convert(tmp_path, "gfx942", tag="0.13b", candidates=CANDIDATES,
                           kernels=["attn_fwd"], points_of=lambda k: [POINT, other])
    # the fixture has bf16 rows only: the fp16 point gets none; give it one by hand
    doc["choices"].append(dict(doc["choices"][-1], functional={k: [v] for k, v in other.items()}))
    f = tmp_path / "gfx942.json"
    f.write_text(dump_measured(doc))
    tuned = PointResult("attn_fwd", dict(POINT), runs=[{
        "kernel": "attn_fwd", "functional": {k: [v] for k, v in POINT.items()}, "seqlen_max": None,
        "config": {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 1},
        "measured": [{"seqlen": 512, "us": 1.0}, {"seqlen": 1024, "us": 2.0}]}])
    header = {"schema": 1, "arch": "gfx942", "how": "Measured by tune.",
              "device": {"name": "AMD Instinct MI300X"}, "commands": ["aotriton-rocm tune"]}
    merged = merged_file([tuned], [("attn_fwd", dict(POINT)), ("attn_fwd", other)], header,
                         PreviousFile.read(f, "gfx942"))
    ch = merged["choices"]
    assert ch[0]["measured"] and ch[0]["device"] == "AMD Instinct MI300X" and ch[0]["seqlen_max"] == 1024
    kept = ch[1:]
    # above 1024 the imported 128x64 still decides the bf16 point; the fp16 point keeps its entry
    assert [c["functional"]["dtype"] for c in kept] == [["bf16"], ["fp16"]]
    for c in kept:
        assert c["source"] == upstream.SOURCE and "upstream AOTriton" in c["device"]
    data = load_measured_text(dump_measured(merged), "gfx942", "x")
    assert dict(data.entry_for("attn_fwd", POINT, 512).config)["BLOCK_M"] == 64
    assert dict(data.entry_for("attn_fwd", POINT, 4096).config).get("PRE_LOAD_V") is True
