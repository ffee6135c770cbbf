"""`aotriton-rocm release` across a ROCm-profile x arch matrix on a toy release
(the real package step on fake archives; see tests/support/toy_release.py): ROCm 6.4
(gfx942) and ROCm 7.0 (gfx942, gfx90a), giving the targets `default` (6.4, no
local label), `rocm6.4` and `rocm7.0`. Every gate prints a verdict per target;
a failing gate stops the release before anything is uploaded; a dry run
never uploads; publishing goes to ONE real pypiserver with per-ROCm paths
(tests/support/pypi_index.py) and a conda channel directory; credentials come from
the environment or the keyring and are never printed.

The matrix is packaged once (the dry run); the publishing tests publish
those very files (--reuse-dist). The install-check gate is stubbed in the
--publish tests (--skip is refused there): fake archives cannot pass the
smoke test (tests/tooling/package/test_packaging.py covers install-check for real)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from support import toy_release as TR

pytest.importorskip("build")
pytest.importorskip("rattler_build")

from aotriton_rocm.commands.cli import main as cli_main  # noqa: E402
from aotriton_rocm.tooling.release import command as R  # noqa: E402
from aotriton_rocm.tooling.release import credentials, gates, matrix, publish  # noqa: E402

VERSION = "0.1.1"
SECRET = "s3cr3t-never-printed-7f2a"
MATRIX = {"6.4": ("gfx942",), "7.0": ("gfx942", "gfx90a")}
TARGETS = ("default", "rocm6.4", "rocm7.0")
PY = "%d.%d" % sys.version_info[:2]
NOWHERE = "http://127.0.0.1:9/"  # nothing listens there: a dry run must not try


def _with_changelog_section(tree: Path) -> None:
    cl = tree / "CHANGELOG.md"
    text = cl.read_text()
    if f"## {VERSION}\n" not in text:
        cl.write_text(text.replace("## Unreleased", f"## {VERSION}\n- point release\n\n## Unreleased", 1))


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    base = tmp_path_factory.mktemp("release")
    tree = base / "tree"
    shutil.copytree(TR.source_tree(VERSION), tree)
    bare = base / "tree-without-notes"  # the same release without its CHANGELOG section
    shutil.copytree(tree, bare)
    _with_changelog_section(tree)
    build = base / "build"
    for rocm, archs in MATRIX.items():
        shutil.copytree(TR.archives(VERSION, archs, rocm), build / f"rocm{rocm}" / "archives")
    return {"base": base, "tree": tree, "bare": bare, "build": build}


def _release(capsys, toy, out, *extra, tree=None):
    argv = ["release", "--source-root", str(tree or toy["tree"]), "--build-dir", str(toy["build"]),
            "--out", str(out), "--rocm", "6.4", "--rocm", "7.0", "--python", PY, *extra]
    rc = cli_main(argv)
    cap = capsys.readouterr()
    return rc, cap.out, cap.out + cap.err


def _verdicts(out: str) -> dict:
    v = {}
    for line in out.splitlines():
        if line.startswith("[") and "] " in line:
            gate, rest = line[1:].split("] ", 1)
            v[gate] = rest.split(":", 1)[0]
    return v


def _expected() -> dict:
    """Every gate of the matrix release, in order, all passing."""
    v = {"build rocm6.4": "PASS", "build rocm7.0": "PASS"}
    for gate in ("package", "install-check", "abi-check"):
        v.update({f"{gate} {t}": "PASS" for t in TARGETS})
    v.update({"changelog": "PASS", "credentials": "PASS"})
    v.update({f"publish {t}": "PASS" for t in TARGETS})
    v["publish conda"] = "PASS"
    return v


def _set(v: dict, gate: str, verdict: str) -> dict:
    for k in v:
        if k == gate or k.startswith(gate + " "):
            v[k] = verdict
    return v


def _after(v: dict, failed: str) -> dict:
    keys = list(v)
    for k in keys[keys.index(failed) + 1:]:
        v[k] = "not run"
    v[failed] = "FAIL"
    return v


@pytest.fixture(scope="module")
def dry(toy, tmp_path_factory):
    """The whole matrix packaged once, in a dry run with every gate passing."""
    out = toy["base"] / "dist"
    import contextlib
    import io

    buf = io.StringIO()  # (capsys is function-scoped)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TWINE_USERNAME", "uploader")
        mp.setenv("TWINE_PASSWORD", SECRET)
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            rc = cli_main(["release", "--source-root", str(toy["tree"]), "--build-dir", str(toy["build"]),
                           "--out", str(out), "--rocm", "6.4,7.0", "--python", PY,
                           "--skip", "install-check", "--index-url", NOWHERE,
                           "--channel", str(toy["base"] / "never")])
    return {"rc": rc, "out": buf.getvalue(), "dist": out}


@pytest.mark.slow
def test_matrix_dry_run_prints_every_gate_for_every_target(dry, toy):
    out = dry["out"]
    assert dry["rc"] == 0, out
    want = _set(_set(_set(_expected(), "install-check", "SKIPPED"), "abi-check", "SKIPPED"),
                "publish", "SKIPPED")
    assert _verdicts(out) == want, out
    assert list(_verdicts(out)) == list(want)  # gate order: build, package, ..., publish
    assert "matrix: ROCm 6.4, 7.0 x arch all; targets: default, rocm6.4, rocm7.0" in out
    assert "[build rocm7.0] PASS: reused 2 archive(s)" in out
    # conda: the runtime, 2 images and their 2 aotriton-rocm-auto metapackages
    assert "[package rocm7.0] PASS: 0.1.1+rocm7.0 (ROCm 7.0): 3 wheel(s), 5 conda package(s)" in out
    assert "[package default] PASS: 0.1.1 (ROCm 6.4): 2 wheel(s), 0 conda package(s)" in out
    assert "[credentials] PASS: TWINE_USERNAME and TWINE_PASSWORD from the environment" in out
    assert f"[publish default] SKIPPED: dry run: would upload 3 file(s) to {NOWHERE}\n" in out
    assert f"[publish rocm7.0] SKIPPED: dry run: would upload 4 file(s) to {NOWHERE}rocm7.0/\n" in out
    assert "[publish conda] SKIPPED: dry run: would add 8 conda package(s)" in out
    assert f"release {VERSION}: all gates passed (dry run: nothing uploaded" in out
    assert SECRET not in out and not (toy["base"] / "never").exists()
    dist = dry["dist"]
    names = {t: sorted(p.name for p in (dist / t).glob("*.whl")) for t in TARGETS}
    assert names["default"] == [f"aotriton_rocm-{VERSION}-cp39-abi3-" + names["default"][0].split("-abi3-")[1],
                                f"aotriton_rocm_gfx942-{VERSION}-py3-none-{TR.W.PLATFORM_TAG}.whl"]
    assert [n.split("-")[1] for n in names["rocm7.0"]] == [f"{VERSION}+rocm7.0"] * 3
    assert sorted(n.split("-")[0] for n in names["rocm7.0"]) == [
        "aotriton_rocm", "aotriton_rocm_gfx90a", "aotriton_rocm_gfx942"]
    condas = sorted(p.name for t in TARGETS for p in (dist / t).glob("conda/*/*.conda"))
    assert condas == sorted([f"aotriton-rocm-{VERSION}-py{PY.replace('.', '')}_rocm64_0.conda",
                             f"aotriton-rocm-{VERSION}-py{PY.replace('.', '')}_rocm70_0.conda",
                             f"aotriton-rocm-gfx942-{VERSION}-rocm64_0.conda",
                             f"aotriton-rocm-gfx942-{VERSION}-rocm70_0.conda",
                             f"aotriton-rocm-gfx90a-{VERSION}-rocm70_0.conda",
                             f"aotriton-rocm-auto-{VERSION}-gfx942_rocm64_0.conda",
                             f"aotriton-rocm-auto-{VERSION}-gfx942_rocm70_0.conda",
                             f"aotriton-rocm-auto-{VERSION}-gfx90a_rocm70_0.conda"])
    for t in TARGETS:
        assert (dist / t / "SHA256SUMS").is_file() and list((dist / t).glob("*.cdx.json")), t


@pytest.mark.slow
def test_package_gate_refuses_a_used_directory(dry, toy, capsys, monkeypatch):
    monkeypatch.setenv("TWINE_USERNAME", "uploader")
    monkeypatch.setenv("TWINE_PASSWORD", SECRET)
    rc, out, _ = _release(capsys, toy, dry["dist"], "--skip", "install-check")
    assert rc == 1 and _verdicts(out)["package default"] == "FAIL" and "is not empty" in out
    assert _verdicts(out)["package rocm6.4"] == "not run"


@pytest.mark.slow
def test_reuse_dist_refuses_a_changed_file(dry, toy, capsys, monkeypatch, tmp_path):
    copy = tmp_path / "dist"
    shutil.copytree(dry["dist"], copy)
    wheel = next((copy / "rocm7.0").glob("aotriton_rocm_gfx90a-*.whl"))
    wheel.write_bytes(wheel.read_bytes() + b"\0")
    monkeypatch.setenv("TWINE_USERNAME", "uploader")
    monkeypatch.setenv("TWINE_PASSWORD", SECRET)
    rc, out, _ = _release(capsys, toy, copy, "--reuse-dist", "--skip", "install-check")
    v = _verdicts(out)
    assert rc == 1 and v["package default"] == v["package rocm6.4"] == "PASS", out
    assert v["package rocm7.0"] == "FAIL" and f"changed or missing since packaging: {wheel.name}" in out


# ---------------------------------------------------------------- publishing

class MemoryKeyring:
    """A keyring backend holding its secrets in memory (the `keyring`
    package's backend interface; the release reads it through keyring's API)."""

    def __new__(cls):
        from keyring.backend import KeyringBackend

        class _Mem(KeyringBackend):
            priority = 1

            def __init__(self):
                super().__init__()
                self.store = {}

            def get_password(self, service, username):
                return self.store.get((service, username))

            def set_password(self, service, username, password):
                self.store[(service, username)] = password

            def delete_password(self, service, username):
                self.store.pop((service, username), None)

        return _Mem()


@pytest.fixture
def keyring_backend():
    keyring = pytest.importorskip("keyring")
    old = keyring.get_keyring()
    kr = MemoryKeyring()
    keyring.set_keyring(kr)
    yield kr
    keyring.set_keyring(old)


@pytest.fixture
def server(tmp_path):
    pytest.importorskip("pypiserver")
    pytest.importorskip("passlib")
    pytest.importorskip("twine")
    from support.pypi_index import IndexServer
    from test_publish_index import USER, write_htpasswd

    write_htpasswd(tmp_path / "htpasswd", SECRET, USER)
    srv = IndexServer(tmp_path / "index", tmp_path / "htpasswd", ["", "rocm6.4", "rocm7.0"])
    yield srv
    srv.stop()


@pytest.fixture
def stub_install_check(monkeypatch):
    monkeypatch.setattr(R, "gate_install_check", lambda ctx, t: "stubbed in this test (fake archives)")


def _publish(capsys, toy, dry, server, channel, *extra, tree=None):
    return _release(capsys, toy, dry["dist"], "--publish", "--reuse-dist", "--index-url", server.url(),
                    "--channel", str(channel), *extra, tree=tree)


@pytest.mark.slow
def test_publish_with_keyring_credentials_to_per_rocm_paths(dry, toy, capsys, monkeypatch, server,
                                                            keyring_backend, stub_install_check,
                                                            tmp_path):
    from test_publish_index import USER, fresh_venv, installed, pip

    monkeypatch.setenv("TWINE_USERNAME", USER)
    monkeypatch.delenv("TWINE_PASSWORD", raising=False)
    keyring_backend.set_password(server.url(), USER, SECRET)
    chan = tmp_path / "channel"
    rc, out, everything = _publish(capsys, toy, dry, server, chan)
    assert rc == 0, everything
    assert _verdicts(out) == _set(_expected(), "abi-check", "SKIPPED"), out
    assert f"[credentials] PASS: username from the environment, password from the keyring ({server.url()})" in out
    assert f"[publish rocm7.0] PASS: uploaded 4 file(s) to {server.url('rocm7.0')}" in out
    assert f"release {VERSION}: PUBLISHED" in out and SECRET not in everything
    for t, index in (("default", ""), ("rocm6.4", "rocm6.4"), ("rocm7.0", "rocm7.0")):
        assert server.files(index) == sorted(p.name for p in (dry["dist"] / t).iterdir()
                                             if p.name.endswith((".whl", ".tar.gz"))), t
    rt = json.loads((chan / "linux-64" / "repodata.json").read_text())["packages.conda"]
    img = json.loads((chan / "noarch" / "repodata.json").read_text())["packages.conda"]
    assert sorted(r["build"] for r in rt.values()) == [f"py{PY.replace('.', '')}_rocm64_0",
                                                       f"py{PY.replace('.', '')}_rocm70_0"]
    assert sorted((r["name"], r["build"]) for r in img.values()) == [
        ("aotriton-rocm-auto", "gfx90a_rocm70_0"), ("aotriton-rocm-auto", "gfx942_rocm64_0"),
        ("aotriton-rocm-auto", "gfx942_rocm70_0"),
        ("aotriton-rocm-gfx90a", "rocm70_0"), ("aotriton-rocm-gfx942", "rocm64_0"),
        ("aotriton-rocm-gfx942", "rocm70_0")]
    # what a ROCm 7.0 user gets from the per-ROCm path
    py = fresh_venv(tmp_path / "venv")
    res = pip("install", "--index-url", server.simple("rocm7.0"), "aotriton-rocm[gfx90a]", python=py)
    assert res.returncode == 0, res.stdout + res.stderr
    assert installed(py) == {"aotriton-rocm": f"{VERSION}+rocm7.0", "aotriton-rocm-gfx90a": f"{VERSION}+rocm7.0"}

    # publishing the same release again is refused by the index, password still unprinted
    before = {i: server.files(i) for i in ("", "rocm6.4", "rocm7.0")}
    rc, out, everything = _publish(capsys, toy, dry, server, chan)
    assert rc == 1 and _verdicts(out)["publish default"] == "FAIL", out
    assert _verdicts(out)["publish conda"] == "not run"
    assert f"release {VERSION}: STOPPED at publish default; nothing was uploaded" in out
    assert SECRET not in everything
    assert {i: server.files(i) for i in before} == before


@pytest.mark.slow
def test_wrong_password_uploads_nothing_and_is_never_printed(dry, toy, capsys, monkeypatch, server,
                                                             stub_install_check, tmp_path):
    wrong = "wrong-" + SECRET
    monkeypatch.setenv("TWINE_USERNAME", "uploader")
    monkeypatch.setenv("TWINE_PASSWORD", wrong)
    rc, out, everything = _publish(capsys, toy, dry, server, tmp_path / "channel")
    assert rc == 1, everything
    want = _after(_set(_expected(), "abi-check", "SKIPPED"), "publish default")
    assert _verdicts(out) == want, out
    assert "403" in out or "401" in out, out
    assert wrong not in everything and SECRET not in everything
    assert all(server.files(i) == [] for i in ("", "rocm6.4", "rocm7.0"))
    assert not (tmp_path / "channel").exists()


@pytest.mark.slow
def test_failing_gate_stops_before_any_upload(dry, toy, capsys, monkeypatch, server, stub_install_check,
                                              tmp_path):
    monkeypatch.setenv("TWINE_USERNAME", "uploader")
    monkeypatch.setenv("TWINE_PASSWORD", SECRET)
    chan = tmp_path / "channel"
    # the release notes are missing
    rc, out, everything = _publish(capsys, toy, dry, server, chan, tree=toy["bare"])
    assert rc == 1
    assert _verdicts(out) == _after(_set(_expected(), "abi-check", "SKIPPED"), "changelog"), out
    assert f"no `## {VERSION}` section" in out
    assert f"release {VERSION}: STOPPED at changelog; nothing was uploaded" in out
    # the ABI check against a previous release fails (here: one it cannot read;
    # the toy archives are real now, so the previous release is a damaged archive)
    prev = tmp_path / "previous"
    (prev / "default").mkdir(parents=True)
    (prev / "default" / "gfx942.aotr").write_bytes(os.urandom(2048))
    rc, out, everything = _publish(capsys, toy, dry, server, chan, "--previous", str(prev))
    assert rc == 1
    assert _verdicts(out) == _after(_expected(), "abi-check default"), out
    assert "abi-check against" in out and "exited 2" in out
    assert all(server.files(i) == [] for i in ("", "rocm6.4", "rocm7.0")) and not chan.exists()
    assert SECRET not in everything


# ------------------------------------------------------------------ the parts

def test_credentials_from_environment_keyring_or_nowhere(monkeypatch, keyring_backend):
    url = "https://index.example/"
    monkeypatch.setenv("TWINE_USERNAME", "u")
    monkeypatch.setenv("TWINE_PASSWORD", SECRET)
    creds, _ = credentials.find_credentials(url)
    assert (creds.username, creds.password) == ("u", SECRET) and "environment" in creds.source
    assert SECRET not in repr(creds) and SECRET not in creds.source
    monkeypatch.delenv("TWINE_PASSWORD")
    creds, why = credentials.find_credentials(url)
    assert creds is None and f"the keyring has no password for that user for {url}" in why
    keyring_backend.set_password(url, "u", SECRET)
    creds, _ = credentials.find_credentials(url)
    assert creds.password == SECRET and "keyring" in creds.source
    monkeypatch.delenv("TWINE_USERNAME")
    creds, why = credentials.find_credentials(url)  # no username anywhere
    assert creds is None and "TWINE_USERNAME" in why and SECRET not in why
    # without the keyring package: a clean refusal that says what to do
    monkeypatch.setitem(sys.modules, "keyring", None)
    creds, why = credentials.find_credentials(url)
    assert creds is None and "keyring package is not installed" in why


def test_credentials_gate_names_what_is_missing(monkeypatch, tmp_path):
    monkeypatch.delenv("TWINE_USERNAME", raising=False)
    monkeypatch.setenv("TWINE_PASSWORD", SECRET)
    dist = tmp_path / "default"
    dist.mkdir()
    (dist / "x.whl").write_bytes(b"")
    import argparse

    ctx = gates.Context(args=argparse.Namespace(index_url=None, rocm_index_url=None), root=tmp_path,
                        version=VERSION, out=tmp_path, profiles=["6.4"],
                        targets=[matrix.Target("default", "6.4", False, False, dist, None)])
    with pytest.raises(gates.GateFailed) as e:
        publish.gate_credentials(ctx)
    assert "TWINE_USERNAME" in str(e.value) and SECRET not in str(e.value)


@pytest.mark.slow
def test_matrix_arguments(capsys, toy):
    from aotriton_rocm.tooling.common.targets import load_targets

    every = list(load_targets(TR.ROOT / "ci" / "targets.toml").profiles)
    import argparse

    ns = argparse.Namespace(rocm=["all"], no_default=False, default_rocm=None)
    profiles, default = matrix.matrix_profiles(ns, TR.ROOT)
    assert profiles == sorted(every, key=lambda v: tuple(map(int, v.split(".")))) and default == "6.4"
    assert matrix.matrix_profiles(argparse.Namespace(rocm=["7.0"], no_default=False, default_rocm=None),
                                 TR.ROOT) == (["7.0"], None)
    assert cli_main(["release", "--source-root", str(toy["tree"]), "--rocm", "5.9"]) == 2
    assert "unknown ROCm profile '5.9'" in capsys.readouterr().err
    assert cli_main(["release", "--source-root", str(toy["tree"]), "--rocm", "7.0",
                     "--default-rocm", "6.4"]) == 2
    assert "--default-rocm 6.4 is not in the release matrix" in capsys.readouterr().err


def test_changelog_sections(tmp_path):
    cl = tmp_path / "CHANGELOG.md"
    cl.write_text("# Changelog\n\n## Unreleased (0.1.1)\n- x\n\n## 0.1.10\n\n## [0.2.0] - 2026-01-01\n")
    assert not gates.changelog_has_section(cl, "0.1.1")  # Unreleased, and 0.1.10 is another version
    assert gates.changelog_has_section(cl, "0.1.10") and gates.changelog_has_section(cl, "0.2.0")
    assert not gates.changelog_has_section(tmp_path / "missing.md", "0.1.0")


def test_publish_refuses_skipped_gates(capsys):
    assert cli_main(["release", "--publish", "--skip", "install-check"]) == 2
    assert "dry runs only" in capsys.readouterr().err


def test_release_options_and_dry_run_default():
    import argparse

    p = argparse.ArgumentParser()
    R.add_release_arguments(p)
    text = p.format_help()
    for opt in ("--rocm", "--arch", "--default-rocm", "--rocm-index-url", "--reuse-dist", "--dry-run",
                "--publish", "--previous", "--channel"):
        assert opt in text, opt
    assert p.parse_args([]).publish is False  # a dry run unless --publish
    assert not any(a.dest in ("password", "username", "token") for a in p._actions)  # never on argv


@pytest.mark.slow
def test_reused_archives_must_match_the_sources(toy, tmp_path, capsys):
    """--build-dir archives of other kernel sources, or of a subset build
    (`build --only`), fail the build gate: both hashes and the rebuild named."""
    from support import real_archives as RA

    for name, kw, needles in (
            ("older", {"inputs_hash": "b" * 64},
             ["b" * 64, RA.tree_hash(), "not built from the sources being packaged",
              "aotriton-rocm build --arch gfx942 --out"]),
            ("subset", {"subset": "dtype=fp16"},
             ["come from a subset build", "(--only dtype=fp16)",
              f"aotriton-rocm build --arch gfx942 --out {tmp_path}/subset/rocm6.4"])):
        build = tmp_path / name
        RA.write(build / "rocm6.4" / "archives", "gfx942", version=VERSION, rocm="6.4", **kw)
        rc = cli_main(["release", "--source-root", str(toy["tree"]), "--build-dir", str(build),
                       "--out", str(tmp_path / f"dist-{name}"), "--rocm", "6.4", "--python", PY,
                       "--skip", "install-check", "--index-url", NOWHERE])
        out = capsys.readouterr().out
        assert rc == 1 and _verdicts(out)["build rocm6.4"] == "FAIL", out
        assert all(n in out for n in needles), out
        assert "--allow-subset" not in out   # release has no such option
        assert not list((tmp_path / f"dist-{name}").rglob("*.whl"))
