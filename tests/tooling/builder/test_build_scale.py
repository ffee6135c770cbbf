"""Scaling the build (issue 4 item 6): --shard K/N + merge byte-identical to an
unsharded build, the Dask executor on a LocalCluster (127.0.0.1) equal to the
local build, one compile per code object across ROCm profiles, and a no-change
rebuild that compiles nothing. Real triton compiles of the toy kernel."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

from aotriton_rocm.common.archive import Archive  # noqa: E402
from aotriton_rocm.commands.cli import main as cli_main  # noqa: E402
from aotriton_rocm.tooling.builder import command as B  # noqa: E402
from aotriton_rocm.tooling.builder import merge as M  # noqa: E402
from aotriton_rocm.tooling.builder.dask_executor import ExecutorError  # noqa: E402
from support.toy_build import make_root  # noqa: E402

ARCHS = ["gfx942,sm_90"]


def archive_files(out: Path):
    d = out / "archives"
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return make_root(tmp_path_factory.mktemp("scaleroot"))


@pytest.fixture(scope="module")
def reference(root, tmp_path_factory):
    """Unsharded local build of the toy spec (4 compiles)."""
    out = tmp_path_factory.mktemp("ref")
    B.build("6.4", ARCHS, out, source_root=root, jobs=2, progress=False)
    return out


@pytest.fixture(scope="module")
def shards(root, tmp_path_factory):
    """The same build as 3 shards, each in its own directory with its own, empty cache."""
    base = tmp_path_factory.mktemp("shards")
    dirs = []
    for k in (1, 2, 3):
        d = base / f"shard{k}"
        res = B.build("6.4", ARCHS, d, source_root=root, jobs=1, progress=False, shard=(k, 3))
        assert res.shard_file == d / "shard.json" and not (d / "archives").exists()
        dirs.append(d)
    return dirs


def test_partition_is_deterministic_and_balanced():
    keys = [f"{i:064x}" for i in range(10)]
    parts = [B.shard_keys(reversed(keys), k, 3) for k in (1, 2, 3)]
    assert parts == [B.shard_keys(keys, k, 3) for k in (1, 2, 3)]  # order-independent
    assert sorted(sum(parts, [])) == sorted(keys) and [len(p) for p in parts] == [4, 3, 3]
    assert B.parse_shard("2/3") == (2, 3)
    for bad in ("0/3", "4/3", "3", "a/b", "1/0"):
        with pytest.raises(ValueError, match="--shard"):
            B.parse_shard(bad)


def test_sharded_merge_is_byte_identical(shards, reference, tmp_path):
    docs = [json.loads((d / "shard.json").read_text()) for d in shards]
    assert [len(d["keys"]) for d in docs] == [2, 1, 1] and all(d["total_keys"] == 4 for d in docs)
    assert sorted(k for d in docs for k in d["keys"]) == sorted(
        p.stem for p in (reference / "cache").rglob("*.bin"))
    out = tmp_path / "merged"
    res = M.merge(list(reversed(shards)), out, source_root=make_root(tmp_path / "other-checkout"))
    assert res.compiled == 0 and res.cached == 4
    assert archive_files(out) == archive_files(reference)  # archives + manifests, byte for byte
    assert [m["shard"] for m in res.report["merged_from"]] == ["1/3", "2/3", "3/3"]


def test_merge_refuses_missing_and_duplicate_shards(shards, root, tmp_path, capsys):
    with pytest.raises(M.ShardError, match=r"missing shard\(s\) 2/3 \(got 1/3, 3/3\)"):
        M.merge([shards[0], shards[2]], tmp_path / "o", source_root=root)
    with pytest.raises(M.ShardError, match="shard 1/3 given more than once"):
        M.merge([shards[0], shards[0], shards[1], shards[2]], tmp_path / "o", source_root=root)
    with pytest.raises(M.ShardError, match="not a complete shard output"):
        M.merge([shards[0], tmp_path], tmp_path / "o", source_root=root)
    assert not (tmp_path / "o" / "archives").exists()
    # other inputs (a changed kernel) are refused, not silently recompiled
    changed = make_root(tmp_path / "changed")
    (changed / "kernels" / "toy.py").write_text((changed / "kernels" / "toy.py").read_text() + "\n# x\n")
    with pytest.raises(B.BuildError, match="built from other inputs"):
        M.merge(shards, tmp_path / "o2", source_root=changed)
    assert not (tmp_path / "o2" / "archives").exists()
    # CLI: exit code 2 and the message
    assert cli_main(["merge", str(shards[0]), str(shards[1]), "--out", str(tmp_path / "o3"),
                     "--source-root", str(root), "--no-progress"]) == 2
    assert "missing shard(s) 3/3" in capsys.readouterr().err


def test_build_cli_shard_argument(root, tmp_path, capsys):
    assert cli_main(["build", "--arch", "gfx942", "--shard", "4/3", "--out", str(tmp_path),
                     "--source-root", str(root)]) == 2
    assert "need 1 <= K <= N" in capsys.readouterr().err


def test_rocm_profiles_share_code_objects(reference, root, tmp_path):
    # The reference cache was filled by a 6.4 build; 6.3 has the same compile
    # inputs for gfx942 (the profile is not part of the cache key).
    out = tmp_path / "out"
    shutil.copytree(reference / "cache", out / "cache")
    res = B.build("6.3", ["gfx942"], out, source_root=root, jobs=2, progress=False)
    assert res.compiled == 0 and res.cached == 2
    a63, a64 = Archive.open(res.archives["gfx942"]), Archive.open(reference / "archives" / "gfx942.aotr")
    assert (a63.manifest["rocm_profile"], a64.manifest["rocm_profile"]) == ("6.3", "6.4")
    assert [a63.code_object(r) for r in a63.kernels] == [a64.code_object(r) for r in a64.kernels]
    again = B.build("6.3", ["gfx942"], out, source_root=root, jobs=2, progress=False)
    assert again.compiled == 0  # no-change rebuild does nothing


def test_dask_executor_without_distributed(root, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # import fails
    with pytest.raises(ExecutorError, match=r"needs Dask's distributed .*pip install"):
        B.build("6.4", ["gfx942"], tmp_path, source_root=root, executor="dask",
                scheduler="tcp://127.0.0.1:1")
    with pytest.raises(ExecutorError, match="needs --scheduler"):
        B.build("6.4", ["gfx942"], tmp_path, source_root=root, executor="dask")
    assert not (tmp_path / "cache").exists()


def test_dask_local_cluster_equals_local_build(reference, root, tmp_path):
    pytest.importorskip("distributed")
    out = tmp_path / "dask"
    res = B.build("6.4", ARCHS, out, source_root=root, jobs=2, progress=False, executor="dask-local")
    assert res.compiled == 4 and res.report["executor"] == "dask-local"
    assert archive_files(out) == archive_files(reference)
