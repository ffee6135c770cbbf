"""The kernel archive format (no triton needed): round trip, lazy index,
corruption detection, manifest sidecar."""

from __future__ import annotations

import builtins
import json
import os

import pytest

from aotriton_rocm.common import archive as A
from aotriton_rocm.common import archive_index as AX
from aotriton_rocm.common.archive import Archive, ArchiveError, KernelRecord, manifest_path_for
from aotriton_rocm.common.archive_identity import verify_against_manifest
from aotriton_rocm.tooling.builder.archive_writer import write_archive, write_manifest_sidecar

ARGS = (("Q", "*fp16"), ("n", "i32"), ("global_scratch", "*i8"), ("profile_scratch", "*i8"))


def _record(i: int, dtype: str = "fp16", causal: bool = False) -> KernelRecord:
    return KernelRecord(
        key=f"attn_fwd|dtype={dtype}|head_dim=64|causal={int(causal)}|BLOCK_M={64 * (i + 1)}",
        kernel="attn_fwd", functional={"dtype": dtype, "head_dim": 64, "causal": causal},
        config={"BLOCK_M": 64 * (i + 1), "num_warps": 4, "num_stages": 1},
        constexprs={"HEAD_DIM": 64, "BLOCK_M": 64 * (i + 1), "IS_CAUSAL": causal, "UPCAST_DOT": False},
        symbol="attn_fwd", num_warps=4, num_stages=1, warp_size=64, shared=1024 * i,
        global_scratch_size=0, profile_scratch_size=0, args=ARGS, divisible_16=("Q",),
        grid=("cdiv(seqlen_q, BLOCK_M)", "batch * num_heads", "1"),
        stats={"vgpr_count": 100 + i})


MANIFEST = {
    "package_version": "0.1.0", "abi_version": "0.1", "rocm_profile": "6.4", "arch": "gfx942",
    "backend": "hip", "warp_size": 64, "compiler": "triton", "compiler_version": "3.9.0",
    "build_inputs_hash": "0" * 64,
}


def _codes(n):
    # distinct, compressible, ELF-looking payloads
    return [b"\x7fELF" + bytes([i]) * 3000 + os.urandom(64) for i in range(n)]


@pytest.fixture
def written(tmp_path):
    path = tmp_path / "gfx942.aotr"
    recs = [_record(0), _record(1, causal=True), _record(2, dtype="bf16")]
    codes = _codes(len(recs))
    man, final = write_archive(path, MANIFEST, list(zip(recs, codes)))
    write_manifest_sidecar(path)
    return path, final, codes, man


def test_round_trip(written):
    path, recs, codes, man = written
    a = Archive.open(path)
    assert a.manifest == man
    assert a.manifest["format_version"] == A.FORMAT_VERSION == 1
    for k in AX.MANIFEST_KEYS:
        assert k in a.manifest
    assert a.kernels == recs
    for r, c in zip(a.kernels, codes):
        assert a.code_object(r) == c
        assert a.code_object(r.key) == c
        assert r.size == len(c) and r.compressed_size < r.size
    r0 = a.kernels[0]
    assert isinstance(r0.args, tuple) and r0.args[-2:] == (("global_scratch", "*i8"), ("profile_scratch", "*i8"))
    assert r0.grid == ("cdiv(seqlen_q, BLOCK_M)", "batch * num_heads", "1")
    assert r0.constexprs["UPCAST_DOT"] is False
    assert r0.stats == {"vgpr_count": 100}
    with pytest.raises(dataclasses_frozen_error()):
        r0.key = "x"  # type: ignore[misc]
    assert len({r0, a.kernels[1]}) == 2  # hashable despite dict fields
    assert a.verify() == []


def dataclasses_frozen_error():
    import dataclasses
    return dataclasses.FrozenInstanceError


def test_find(written):
    a = Archive.open(written[0])
    assert [r.functional["dtype"] for r in a.find("attn_fwd")] == ["fp16", "fp16", "bf16"]
    assert len(a.find("attn_fwd", dtype="fp16")) == 2
    (r,) = a.find("attn_fwd", dtype="fp16", causal=True)
    assert r.functional["causal"] is True
    assert a.find("attn_fwd", dtype="fp16", head_dim=128) == []
    assert a.find("attn_bwd_dq") == []


def test_write_is_deterministic(tmp_path):
    recs = [_record(0), _record(1)]
    codes = [b"\x7fELF" + b"a" * 500, b"\x7fELF" + b"b" * 700]
    write_archive(tmp_path / "a.aotr", MANIFEST, list(zip(recs, codes)))
    write_archive(tmp_path / "b.aotr", MANIFEST, list(zip(recs, codes)))
    assert (tmp_path / "a.aotr").read_bytes() == (tmp_path / "b.aotr").read_bytes()


def test_index_readable_without_decompressing(written, monkeypatch):
    path, recs, codes, _ = written
    read_bytes = []
    real_open = builtins.open

    class Counting:
        def __init__(self, f):
            self.f = f

        def read(self, n=-1):
            b = self.f.read(n)
            read_bytes.append(len(b))
            return b

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(A, "open", lambda *a, **k: Counting(real_open(*a, **k)), raising=False)

    def no_decompress(*a, **k):
        raise AssertionError("decompressed while opening")

    monkeypatch.setattr(A.lzma, "decompress", no_decompress)
    a = Archive.open(path)
    blob_region = sum(r.compressed_size for r in recs)
    # header + index only: never the blob region
    assert sum(read_bytes) <= os.path.getsize(path) - blob_region
    assert [r.key for r in a.kernels] == [r.key for r in recs]
    assert a.find("attn_fwd", dtype="bf16")
    monkeypatch.undo()
    assert a.code_object(a.kernels[2]) == codes[2]


def test_code_object_is_cached(written, monkeypatch):
    a = Archive.open(written[0])
    first = a.code_object(a.kernels[0])
    monkeypatch.setattr(A.lzma, "decompress", lambda *x, **k: pytest.fail("decompressed twice"))
    assert a.code_object(a.kernels[0]) is first


def _flip(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x5A
    path.write_bytes(bytes(data))


def _blob_start(path):
    a = Archive.open(path)
    return a._blob_offset, a


def test_corrupted_blob_detected(written):
    path, recs, codes, _ = written
    blob_offset, _ = _blob_start(path)
    target = recs[1]
    _flip(path, blob_offset + target.offset + target.compressed_size // 2)
    a = Archive.open(path)  # the index is intact: opening still works
    problems = a.verify()
    assert any("blob region sha256" in p for p in problems)
    assert any(target.key in p for p in problems)
    assert not any(recs[0].key in p for p in problems)
    with pytest.raises(ArchiveError) as ei:
        a.code_object(target)
    msg = str(ei.value)
    assert target.key in msg and "corrupted" in msg and "einstall" in msg
    assert a.code_object(recs[0]) == codes[0]  # the others still load


def test_corrupted_blob_payload_after_lzma_check(written, monkeypatch):
    # Even if lzma accepted the data, the sha256 of the code object catches it.
    path, recs, _, _ = written
    a = Archive.open(path)
    monkeypatch.setattr(A.lzma, "decompress", lambda *x, **k: b"\x7fELF" + b"\0" * (recs[0].size - 4))
    with pytest.raises(ArchiveError, match="sha256"):
        a.code_object(recs[0])


def test_corrupted_index_detected(written):
    path = written[0]
    _flip(path, A.HEADER_SIZE + 10)
    with pytest.raises(ArchiveError, match="index is corrupted") as ei:
        Archive.open(path)
    assert "einstall" in str(ei.value)


def test_truncated_and_foreign_files(tmp_path, written):
    path = written[0]
    data = path.read_bytes()
    t = tmp_path / "trunc.aotr"
    t.write_bytes(data[:-10])
    with pytest.raises(ArchiveError, match="truncated"):
        Archive.open(t)
    t.write_bytes(data[:20])
    with pytest.raises(ArchiveError, match="truncated"):
        Archive.open(t)
    t.write_bytes(b"PK\x03\x04" + data[4:])
    with pytest.raises(ArchiveError, match="not an aotriton-rocm kernel archive"):
        Archive.open(t)
    future = bytearray(data)
    future[8:12] = (A.FORMAT_VERSION + 1).to_bytes(4, "little")
    t.write_bytes(bytes(future))
    with pytest.raises(ArchiveError, match="newer") as ei:
        Archive.open(t)
    assert "Upgrade aotriton-rocm" in str(ei.value)
    with pytest.raises(ArchiveError, match="cannot read"):
        Archive.open(tmp_path / "missing.aotr")


def test_manifest_sidecar(written):
    path, recs, _, man = written
    mp = manifest_path_for(path)
    assert mp.name == "gfx942.manifest.json"
    doc = json.loads(mp.read_text())
    assert doc["manifest"] == man
    assert doc["archive"]["size"] == path.stat().st_size
    assert len(doc["archive"]["sha256"]) == 64
    assert [k["key"] for k in doc["kernels"]] == [r.key for r in recs]
    assert "offset" not in doc["kernels"][0]
    assert verify_against_manifest(path, mp) == []
    assert verify_against_manifest(path) == []


def test_manifest_sidecar_mismatch(written):
    path, recs, _, _ = written
    mp = manifest_path_for(path)
    doc = json.loads(mp.read_text())
    doc["kernels"] = doc["kernels"][:-1]
    doc["kernels"][0]["num_warps"] = 8
    mp.write_text(json.dumps(doc))
    problems = verify_against_manifest(path, mp)
    assert any(recs[2].key in p and "not listed" in p for p in problems)
    assert any(recs[0].key in p and "recorded differently" in p for p in problems)


def test_manifest_sidecar_detects_changed_archive(written):
    path, recs, _, _ = written
    blob_offset, _ = _blob_start(path)
    _flip(path, blob_offset + 5)
    problems = verify_against_manifest(path)
    assert any("sha256 differs" in p for p in problems)
    assert any("blob region" in p for p in problems)
    assert verify_against_manifest(path, path.with_name("nope.json"))[0].startswith(str(path.with_name("nope.json")))


def test_write_archive_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "gfx942.aotr"
    write_archive(path, MANIFEST, [(_record(0), b"\x7fELF old")])
    before = path.read_bytes()
    calls = []

    def failing_fsync(fd):
        calls.append(fd)
        raise OSError("disk full")

    monkeypatch.setattr(A.os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="disk full"):
        write_archive(path, MANIFEST, [(_record(0), b"\x7fELF new" * 100), (_record(1), b"\x7fELF x")])
    assert calls
    assert path.read_bytes() == before  # old archive untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gfx942.aotr"]  # no temp file left


def test_write_archive_rejects_bad_input(tmp_path):
    with pytest.raises(ValueError, match="duplicate"):
        write_archive(tmp_path / "x.aotr", MANIFEST, [(_record(0), b"a"), (_record(0), b"b")])
    bad = dict(MANIFEST)
    del bad["arch"]
    with pytest.raises(ValueError, match="arch"):
        write_archive(tmp_path / "x.aotr", bad, [(_record(0), b"a")])
    assert not (tmp_path / "x.aotr").exists()
