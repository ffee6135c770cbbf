"""Reproducible artifacts: two wheel builds of the same tree are byte-identical
(SOURCE_DATE_EPOCH from the last commit, sorted entries, the launcher built
without DWARF), and SHA256SUMS lists every artifact."""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
import zipfile
from pathlib import Path

import pytest

from aotriton_rocm.tooling import package as pkg

ROOT = Path(__file__).resolve().parents[1]
VERSION = pkg.read_version(ROOT)
ABI = pkg.abi_version_of(VERSION)


def _archives(d: Path) -> Path:
    d.mkdir(parents=True)
    for i, arch in enumerate(("gfx942", "sm_90")):
        (d / f"{arch}.aotr").write_bytes(hashlib.sha256(arch.encode()).digest() * (64 + i))
        man = {"manifest": {"arch": arch, "package_version": VERSION, "abi_version": ABI,
                            "rocm_profile": "6.4", "format_version": 1}, "kernels": []}
        (d / f"{arch}.manifest.json").write_text(json.dumps(man), encoding="utf-8")
    return d


def test_source_date_epoch_is_the_last_commit(monkeypatch):
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    want = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%ct"], capture_output=True,
                          text=True).stdout.strip()
    if not want:
        pytest.skip("not a git checkout")
    assert pkg.source_date_epoch(ROOT) == want
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    assert pkg.source_date_epoch(ROOT) == "1700000000"


def test_sha256sums(tmp_path):
    a, b = tmp_path / "a.whl", tmp_path / "sub" / "b.conda"
    b.parent.mkdir()
    a.write_bytes(b"a")
    b.write_bytes(b"b")
    pkg.write_sha256sums(tmp_path, [a])
    pkg.write_sha256sums(tmp_path, [b])  # adds, keeps a
    lines = (tmp_path / "SHA256SUMS").read_text().splitlines()
    assert lines == [f"{hashlib.sha256(b'a').hexdigest()}  a.whl",
                     f"{hashlib.sha256(b'b').hexdigest()}  sub/b.conda"]
    proc = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
def test_two_builds_give_identical_wheels(tmp_path, monkeypatch):
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    archives = _archives(tmp_path / "archives")
    outs = []
    for name in ("one", "two"):
        out = tmp_path / name
        pkg.build_wheels(ROOT, archives, out)
        outs.append(out)
        time.sleep(1.1)  # a different wall clock second for the second build
    wheels = sorted(p.name for p in outs[0].glob("*.whl"))
    assert len(wheels) == 3 and wheels == sorted(p.name for p in outs[1].glob("*.whl"))
    for name in wheels:
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), f"{name} differs"
    # entries are stamped with the last commit's time, not the build time
    epoch = pkg.source_date_epoch(ROOT)
    if epoch is not None:
        want = time.gmtime(int(epoch))[:6]
        for name in wheels:
            with zipfile.ZipFile(outs[0] / name) as z:
                stamps = {i.date_time for i in z.infolist()}
            assert stamps == {want} or max(stamps) <= want, (name, stamps)
    # SHA256SUMS covers every artifact and checks out
    sums = (outs[0] / "SHA256SUMS").read_text().splitlines()
    assert sorted(line.split("  ", 1)[1] for line in sums) == sorted(
        p.name for p in outs[0].iterdir() if p.name != "SHA256SUMS")
    proc = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=outs[0], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
