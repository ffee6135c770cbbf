"""Reproducible artifacts: building the same commit twice (two clones at
different paths, with different file times and umasks, at another wall
clock time) gives
byte-identical archives, wheels, sdist and .conda files, every time stamp
in them being SOURCE_DATE_EPOCH (the commit's time); SHA256SUMS lists every
artifact."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from support import real_archives as RA
from aotriton_rocm.tooling.package import dist_dir as D
from aotriton_rocm.tooling.package import reproducible as R
from aotriton_rocm.tooling.common import source_tree as ST
from aotriton_rocm._version import abi_line
from aotriton_rocm.tooling.package import wheels as W

ROOT = Path(__file__).resolve().parents[3]
VERSION = ST.read_version(ROOT)
ABI = abi_line(VERSION)


def _archives(d: Path) -> Path:
    # real archives (package verifies what it ships), byte-identical on every call
    for arch in ("gfx942", "sm_90"):
        RA.write(d, arch, version=VERSION)
    return d


def test_source_date_epoch_is_the_last_commit(monkeypatch):
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    want = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%ct"], capture_output=True,
                          text=True).stdout.strip()
    if not want:
        pytest.skip("not a git checkout")
    assert R.source_date_epoch(ROOT) == want
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    assert R.source_date_epoch(ROOT) == "1700000000"


def test_sha256sums(tmp_path):
    a, b = tmp_path / "a.whl", tmp_path / "sub" / "b.conda"
    b.parent.mkdir()
    a.write_bytes(b"a")
    b.write_bytes(b"b")
    D.write_sha256sums(tmp_path, [a])
    D.write_sha256sums(tmp_path, [b])  # adds, keeps a
    lines = (tmp_path / "SHA256SUMS").read_text().splitlines()
    assert lines == [f"{hashlib.sha256(b'a').hexdigest()}  a.whl",
                     f"{hashlib.sha256(b'b').hexdigest()}  sub/b.conda"]
    proc = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _clone(dest: Path, commit: str) -> Path:
    """A fresh clone of this checkout at ``commit`` (the commit, not the work tree)."""
    for cmd in (["git", "clone", "-q", "--no-hardlinks", "--no-checkout", str(ROOT), str(dest)],
                ["git", "-C", str(dest), "checkout", "-q", commit]):
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot clone the checkout: {proc.stderr.strip()}")
    return dest


def _digests(d: Path) -> dict:
    return {p.relative_to(d).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file() and p.suffix in (".whl", ".gz", ".conda")}


@pytest.fixture(scope="module")
def two_builds(tmp_path_factory):
    """The same commit packaged twice: wheels (runtime from the sdist, image
    wheels), the sdist and the .conda packages, from two clones."""
    pytest.importorskip("build")
    pytest.importorskip("rattler_build")
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    from aotriton_rocm.tooling.package.conda import build_conda

    base = tmp_path_factory.mktemp("repro")
    archives = _archives(base / "archives")
    # one commit for both clones (HEAD may move meanwhile in a shared checkout)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("SOURCE_DATE_EPOCH", raising=False)
        outs = []
        for name in ("one", "two"):
            # the second clone under another umask (files 0664), with other file times
            old_mask = os.umask(0o002 if name == "two" else 0o022)
            try:
                tree = _clone(base / f"clone-{name}", commit)
            finally:
                os.umask(old_mask)
            if name == "two":
                assert (tree / "README.md").stat().st_mode & 0o777 == 0o664
                for p in tree.rglob("*.py"):
                    os.utime(p, (time.time() + 3600, time.time() + 3600))
            out = base / f"dist-{name}"
            made = W.build_wheels(tree, archives, out, ["gfx942", "sm_90"], "6.4")
            build_conda(tree, archives, out / "conda", ["gfx942"], "6.4",
                        python_versions=["%d.%d" % sys.version_info[:2]], runtime_wheel=made[0],
                        run_tests=False)
            outs.append(out)
            time.sleep(1.1)  # another wall clock second for the second build
        epoch = int(R.source_date_epoch(base / "clone-one"))
    return outs, epoch


@pytest.mark.slow
def test_same_commit_twice_gives_identical_wheels_sdist_and_conda(two_builds):
    (one, two), _ = two_builds
    a, b = _digests(one), _digests(two)
    kinds = sorted({n.rsplit(".", 1)[-1] for n in a})
    assert kinds == ["conda", "gz", "whl"], sorted(a)
    assert len(a) == 7, sorted(a)  # runtime + 2 image wheels, sdist, 3 .conda (+ aotriton-rocm-auto)
    assert sorted(a) == sorted(b)
    differ = [n for n in a if a[n] != b[n]]
    assert differ == [], f"not byte-identical: {differ}"
    # SHA256SUMS covers every artifact and checks out
    sums = (one / "SHA256SUMS").read_text().splitlines()
    assert sorted(line.split("  ", 1)[1] for line in sums) == sorted(
        p.name for p in one.iterdir() if p.is_file() and p.name != "SHA256SUMS")
    proc = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=one, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
def test_every_time_stamp_is_the_commit_time(two_builds):
    (one, _), epoch = two_builds
    zip_time = time.gmtime(epoch)[:6]
    zip_time = zip_time[:5] + (zip_time[5] // 2 * 2,)  # zip keeps even seconds
    for whl in one.glob("*.whl"):
        with zipfile.ZipFile(whl) as z:
            assert {i.date_time for i in z.infolist()} == {zip_time}, whl.name
            modes = {(i.external_attr >> 16) & 0o777 for i in z.infolist()
                     if not i.filename.endswith("/RECORD")}  # (wheel writes RECORD 0664)
            assert modes <= {0o644, 0o755}, (whl.name, sorted(map(oct, modes)))
    [sdist] = one.glob("*.tar.gz")
    raw = sdist.read_bytes()
    assert int.from_bytes(raw[4:8], "little") == epoch  # gzip header
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(raw))) as t:
        members = t.getmembers()
    assert {m.mtime for m in members} == {epoch}
    assert {(m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, "", "")}
    assert [m.name for m in members] == sorted(m.name for m in members)
    assert {m.mode for m in members} <= {0o644, 0o755}
    condas = sorted(one.glob("conda/*/*.conda"))
    assert len(condas) == 3
    from rattler.package_streaming import extract

    for c in condas:
        with zipfile.ZipFile(c) as z:
            assert {i.date_time for i in z.infolist()} == {zip_time}, c.name
        tree = c.parent / ("x-" + c.name)
        extract(c, tree)  # rattler reads the repacked package
        assert json.loads((tree / "info" / "index.json").read_text())["timestamp"] == epoch * 1000
        # nothing of the random build directories survives
        text = "".join(p.read_text(errors="replace") for p in (tree / "info").rglob("*") if p.is_file())
        assert "/tmp/aotriton-conda-" not in text and "aotriton-wheels-" not in text
        shutil.rmtree(tree)


def test_normalize_sdist(tmp_path):
    """Owners, permissions, order and times of any sdist are normalized."""
    src = tmp_path / "x-1.0.tar.gz"
    with tarfile.open(src, "w:gz") as t:
        for name, mode in (("x-1.0/b.py", 0o664), ("x-1.0", 0o775), ("x-1.0/a.sh", 0o775)):
            info = tarfile.TarInfo(name)
            info.mode, info.mtime, info.uid, info.uname = mode, 1234567890 + len(name), 1000, "me"
            if name == "x-1.0":
                info.type = tarfile.DIRTYPE
                t.addfile(info)
            else:
                data = name.encode()
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    R.normalize_sdist(src, "1700000000")
    first = src.read_bytes()
    with tarfile.open(src) as t:
        got = [(m.name, m.mode, m.mtime, m.uid, m.uname) for m in t.getmembers()]
        assert t.extractfile("x-1.0/a.sh").read() == b"x-1.0/a.sh"
    assert got == [("x-1.0", 0o755, 1700000000, 0, ""), ("x-1.0/a.sh", 0o755, 1700000000, 0, ""),
                   ("x-1.0/b.py", 0o644, 1700000000, 0, "")]
    R.normalize_sdist(src, "1700000000")
    assert src.read_bytes() == first


def test_two_fresh_builds_give_identical_archives(tmp_path):
    """The kernel archives: the toy kernel compiled from scratch twice, from
    source trees at two different paths, into two build directories."""
    pytest.importorskip("triton")
    from aotriton_rocm.tooling.builder import command as B
    from support.toy_build import make_root

    got = []
    for name in ("first", "second-tree-elsewhere"):
        root = make_root(tmp_path / name / "src")
        res = B.build("6.4", ["gfx942"], tmp_path / name / "out", source_root=root, jobs=2,
                      progress=False)
        assert res.compiled == 2 and res.cached == 0
        d = tmp_path / name / "out" / "archives"
        got.append({p.name: p.read_bytes() for p in sorted(d.iterdir())})
    assert sorted(got[0]) == ["gfx942.aotr", "gfx942.manifest.json"]
    assert got[0] == got[1]
