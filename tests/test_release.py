"""`aotriton-rocm release`: the gates in order on a toy release (the real
package step on fake archives; see tests/toy_release.py). A failing gate stops
the release before anything is uploaded; a dry run never uploads."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pytest

import toy_release as TR

pytest.importorskip("build")
pytest.importorskip("rattler_build")

from aotriton_rocm.cli import main as cli_main  # noqa: E402
from aotriton_rocm.tooling import release as R  # noqa: E402

VERSION = "0.1.1"
SECRET = "s3cr3t-never-printed-7f2a"


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    base = tmp_path_factory.mktemp("release")
    tree = base / "tree"
    shutil.copytree(TR.source_tree(VERSION), tree)
    build = base / "build"
    shutil.copytree(TR.archives(VERSION), build / "archives")
    return {"base": base, "tree": tree, "build": build}


@pytest.fixture
def no_uploads(monkeypatch):
    calls = []
    monkeypatch.setattr(R, "twine_upload", lambda *a, **k: calls.append(("twine", a)) or (0, ""))
    monkeypatch.setattr(R, "copy_to_channel", lambda *a, **k: calls.append(("channel", a)) or [])
    return calls


def _release(capsys, toy, out: str, *extra):
    rc = cli_main(["release", "--source-root", str(toy["tree"]), "--build-dir", str(toy["build"]),
                   "--out", str(toy["base"] / out), "--rocm", TR.ROCM, "--skip", "install-check",
                   "--python", "%d.%d" % __import__("sys").version_info[:2],
                   "--index-url", "http://127.0.0.1:9/", "--channel", str(toy["base"] / "channel"),
                   *extra])
    cap = capsys.readouterr()
    return rc, cap.out, cap.out + cap.err


def _verdicts(out: str) -> dict:
    v = {}
    for line in out.splitlines():
        if line.startswith("[") and "] " in line:
            gate, rest = line[1:].split("] ", 1)
            v[gate] = rest.split(":", 1)[0]
    return v


def test_missing_changelog_section_stops_before_upload(toy, capsys, monkeypatch, no_uploads):
    monkeypatch.setenv("TWINE_USERNAME", "uploader")
    monkeypatch.setenv("TWINE_PASSWORD", SECRET)
    rc, out, everything = _release(capsys, toy, "dist-1")
    assert rc == 1, everything
    assert _verdicts(out) == {"build": "PASS", "package": "PASS", "install-check": "SKIPPED",
                              "abi-check": "SKIPPED", "changelog": "FAIL", "credentials": "not run",
                              "publish": "not run"}, out
    assert "reused 1 archive(s)" in out
    assert f"no `## {VERSION}` section" in out
    assert f"release {VERSION}: STOPPED at changelog; nothing was uploaded" in out
    assert no_uploads == [] and not (toy["base"] / "channel").exists()
    assert SECRET not in everything
    # the package gate did package: wheels, conda, SHA256SUMS, SBOM
    dist = toy["base"] / "dist-1"
    assert len(list(dist.glob("*.whl"))) == 2 and len(list(dist.glob("conda/*/*.conda"))) == 2
    assert (dist / "SHA256SUMS").is_file() and (dist / f"aotriton-rocm-{VERSION}.cdx.json").is_file()


def test_dry_run_with_every_gate_passing_uploads_nothing(toy, capsys, monkeypatch, no_uploads):
    cl = toy["tree"] / "CHANGELOG.md"
    cl.write_text(cl.read_text().replace("## Unreleased", f"## {VERSION}\n- point release\n\n## Unreleased", 1))
    monkeypatch.setenv("TWINE_USERNAME", "uploader")
    monkeypatch.setenv("TWINE_PASSWORD", SECRET)
    # the package gate refuses a non-empty output directory
    rc, out, _ = _release(capsys, toy, "dist-1", "--dry-run")
    assert rc == 1 and _verdicts(out)["package"] == "FAIL" and "not empty" in out
    rc, out, everything = _release(capsys, toy, "dist-2", "--dry-run")
    assert rc == 0, everything
    v = _verdicts(out)
    assert v == {"build": "PASS", "package": "PASS", "install-check": "SKIPPED", "abi-check": "SKIPPED",
                 "changelog": "PASS", "credentials": "PASS", "publish": "SKIPPED"}, out
    assert "dry run: would upload 3 file(s) to http://127.0.0.1:9/; 2 conda package(s)" in out
    assert no_uploads == [] and SECRET not in everything


def test_credentials_gate_names_what_is_missing(monkeypatch, tmp_path):
    monkeypatch.delenv("TWINE_USERNAME", raising=False)
    monkeypatch.setenv("TWINE_PASSWORD", SECRET)
    ctx = R.Context(args=argparse.Namespace(), root=tmp_path, version=VERSION, out=tmp_path)
    with pytest.raises(R.GateFailed) as e:
        R.gate_credentials(ctx)
    assert "TWINE_USERNAME" in str(e.value) and SECRET not in str(e.value)


def test_changelog_sections(tmp_path):
    cl = tmp_path / "CHANGELOG.md"
    cl.write_text("# Changelog\n\n## Unreleased (0.1.1)\n- x\n\n## 0.1.10\n\n## [0.2.0] - 2026-01-01\n")
    assert not R.changelog_has_section(cl, "0.1.1")  # Unreleased, and 0.1.10 is another version
    assert R.changelog_has_section(cl, "0.1.10") and R.changelog_has_section(cl, "0.2.0")
    assert not R.changelog_has_section(tmp_path / "missing.md", "0.1.0")


def test_publish_refuses_skipped_gates(capsys):
    assert cli_main(["release", "--publish", "--skip", "install-check"]) == 2
    assert "dry runs only" in capsys.readouterr().err


def test_publish_uploads_to_a_real_index_and_channel(toy, capsys, monkeypatch, tmp_path):
    """--publish to pypiserver on 127.0.0.1 (htpasswd) and a channel directory.
    The install-check gate is stubbed here: fake archives cannot pass the smoke
    test (tests/test_packaging.py and install-check's own tests cover it)."""
    pytest.importorskip("pypiserver")
    pytest.importorskip("passlib")
    import json

    from pypi_index import IndexServer
    from test_publish_index import USER, write_htpasswd

    cl = toy["tree"] / "CHANGELOG.md"
    if f"## {VERSION}\n" not in cl.read_text():
        cl.write_text(cl.read_text().replace("## Unreleased", f"## {VERSION}\n\n## Unreleased", 1))
    write_htpasswd(tmp_path / "htpasswd", SECRET)
    monkeypatch.setenv("TWINE_USERNAME", USER)
    monkeypatch.setenv("TWINE_PASSWORD", SECRET)
    monkeypatch.setenv("PYTHON_KEYRING_BACKEND", "keyring.backends.null.Keyring")
    monkeypatch.setattr(R, "gate_install_check", lambda ctx: "stubbed in this test")
    monkeypatch.setitem(R._GATE_FUNCS, "install-check", R.gate_install_check)
    index = IndexServer(tmp_path / "index", tmp_path / "htpasswd", [""])
    try:
        chan = tmp_path / "channel"
        rc = cli_main(["release", "--publish", "--source-root", str(toy["tree"]),
                       "--build-dir", str(toy["build"]), "--out", str(tmp_path / "dist"),
                       "--rocm", TR.ROCM, "--python", "%d.%d" % __import__("sys").version_info[:2],
                       "--index-url", index.url(), "--channel", str(chan)])
        cap = capsys.readouterr()
        out = cap.out
        assert rc == 0, cap.out + cap.err
        assert set(_verdicts(out).values()) <= {"PASS", "SKIPPED"}, out
        assert _verdicts(out)["publish"] == "PASS" and f"release {VERSION}: PUBLISHED" in out
        assert SECRET not in cap.out + cap.err
        served = index.files()
        assert served == sorted(p.name for p in (tmp_path / "dist").iterdir()
                                if p.name.endswith((".whl", ".tar.gz"))), served
        assert any(n.startswith(f"aotriton_rocm-{VERSION}-") and n.endswith(".whl") for n in served)
        rt = json.loads((chan / "linux-64" / "repodata.json").read_text())["packages.conda"]
        img = json.loads((chan / "noarch" / "repodata.json").read_text())["packages.conda"]
        assert [r["version"] for r in rt.values()] == [VERSION] == [r["version"] for r in img.values()]
    finally:
        index.stop()
