"""Publishing to a real package index: pypiserver on 127.0.0.1 with htpasswd
auth (uploads only), one server per index path (the default index and the
per-ROCm one), real wheels of toy releases uploaded with twine, installed
with pip from that index only.

Releases: 0.1.0 and 0.1.1 (default build, no local label) on the default
index; 0.1.0+rocm6.4 (the per-ROCm build) on the rocm6.4 index.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import toy_release as TR

pytest.importorskip("pypiserver")
pytest.importorskip("passlib")
pytest.importorskip("twine")
pytest.importorskip("build")

USER = "uploader"
OLD, POINT = "0.1.0", "0.1.1"
LOCAL = f"{OLD}+rocm{TR.ROCM}"
SERVER_START_TIMEOUT = 30.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _quiet_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PIP_", "TWINE_")) and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # twine must never ask, nor look in a keyring, for anything
    env.update(PYTHON_KEYRING_BACKEND="keyring.backends.null.Keyring", PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.update(extra)
    return env


class Index:
    """One pypiserver process serving ``root``; stop() ends it."""

    def __init__(self, name: str, root: Path, htpasswd: Path, log: Path):
        self.name, self.root, self.log = name, root, log
        root.mkdir(parents=True)
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.simple = self.url + "simple/"
        self._log = open(log, "wb")
        exe = Path(sys.executable).with_name("pypi-server")
        cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "pypiserver"]
        self.proc = subprocess.Popen(
            [*cmd, "run", "-i", "127.0.0.1", "-p", str(self.port), "-P", str(htpasswd),
             "-a", "update", "--disable-fallback", str(root)],
            stdout=self._log, stderr=subprocess.STDOUT, env=_quiet_env())
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pypiserver exited ({self.proc.returncode}): {log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.simple, timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"pypiserver did not answer in {SERVER_START_TIMEOUT}s")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


def twine_upload(index: Index, files, password: str) -> subprocess.CompletedProcess:
    env = _quiet_env(TWINE_USERNAME=USER, TWINE_PASSWORD=password)
    return subprocess.run([sys.executable, "-m", "twine", "upload", "--non-interactive",
                           "--disable-progress-bar", "--repository-url", index.url,
                           *map(str, files)], env=env, capture_output=True, text=True, timeout=120)


def pip(*args, python=sys.executable) -> subprocess.CompletedProcess:
    # --isolated: no pip config or PIP_* variables (extra indexes, find-links)
    return subprocess.run([sys.executable, "-m", "pip", "--isolated", "--python", str(python), *args],
                          env=_quiet_env(), capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def indexes(tmp_path_factory):
    base = tmp_path_factory.mktemp("pypi")
    password = secrets.token_urlsafe(16)
    from passlib.apache import HtpasswdFile

    ht = HtpasswdFile(str(base / "htpasswd"), new=True)
    ht.set_password(USER, password)
    ht.save()
    builds = TR.build_wheels_in_parallel([(OLD, False), (POINT, False), (OLD, True)])
    started = []
    try:
        default = Index("", base / "default", base / "htpasswd", base / "default.log")
        started.append(default)
        rocm = Index(f"rocm{TR.ROCM}", base / f"rocm{TR.ROCM}", base / "htpasswd", base / "rocm.log")
        started.append(rocm)
        for index, files in ((default, builds[(OLD, False)] + builds[(POINT, False)]),
                             (rocm, builds[(OLD, True)])):
            res = twine_upload(index, files, password)
            assert res.returncode == 0, res.stdout + res.stderr
            assert password not in res.stdout + res.stderr
        yield {"default": default, "rocm": rocm, "password": password, "builds": builds}
    finally:
        for index in started:
            index.stop()


def _downloaded(d: Path) -> list:
    return sorted(p.name for p in d.iterdir())


def test_default_index_gives_newest_final(indexes, tmp_path):
    assert sorted(p.name for p in indexes["default"].root.iterdir()) == sorted(
        p.name for p in indexes["builds"][(OLD, False)] + indexes["builds"][(POINT, False)])
    res = pip("download", "--no-deps", "--only-binary", ":all:", "--index-url", indexes["default"].simple,
              "-d", str(tmp_path), "aotriton-rocm")
    assert res.returncode == 0, res.stdout + res.stderr
    [got] = _downloaded(tmp_path)
    assert got.startswith(f"aotriton_rocm-{POINT}-cp39-abi3-"), got
    # the image wheel of the ABI line the runtime's extra pins (~=0.1.0)
    res = pip("download", "--no-deps", "--index-url", indexes["default"].simple,
              "-d", str(tmp_path / "img"), f"aotriton-rocm-{TR.ARCH}~=0.1.0")
    assert res.returncode == 0, res.stdout + res.stderr
    assert _downloaded(tmp_path / "img") == [f"aotriton_rocm_{TR.ARCH}-{POINT}-py3-none-"
                                             f"{TR.pkg.PLATFORM_TAG}.whl"]


def test_rocm_index_gives_the_rocm_build(indexes, tmp_path):
    res = pip("download", "--no-deps", "--index-url", indexes["rocm"].simple, "-d", str(tmp_path),
              "aotriton-rocm", f"aotriton-rocm-{TR.ARCH}")
    assert res.returncode == 0, res.stdout + res.stderr
    names = _downloaded(tmp_path)
    assert len(names) == 2, names
    assert all(n.split("-")[1] == LOCAL for n in names), names
    # a pin on the public version matches the local build too (PEP 440)
    res = pip("download", "--no-deps", "--index-url", indexes["rocm"].simple, "-d",
              str(tmp_path / "pinned"), f"aotriton-rocm=={OLD}")
    assert res.returncode == 0, res.stdout + res.stderr
    [got] = _downloaded(tmp_path / "pinned")
    assert got.startswith(f"aotriton_rocm-{LOCAL}-"), got


def test_point_release_upgrades_in_place(indexes, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    idx = indexes["default"].simple

    def installed() -> list:
        site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()
        return sorted(p.name for p in Path(site).glob("aotriton_rocm-*.dist-info"))

    res = pip("install", "--no-deps", "--index-url", idx, f"aotriton-rocm=={OLD}", python=py)
    assert res.returncode == 0, res.stdout + res.stderr
    assert installed() == [f"aotriton_rocm-{OLD}.dist-info"]
    res = pip("install", "-U", "--no-deps", "--index-url", idx, "aotriton-rocm", python=py)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"Successfully uninstalled aotriton-rocm-{OLD}" in res.stdout, res.stdout
    assert installed() == [f"aotriton_rocm-{POINT}.dist-info"]
    code = "import importlib.metadata as m; print(m.version('aotriton-rocm'))"
    out = subprocess.run([str(py), "-c", code], capture_output=True, text=True, env=_quiet_env())
    assert out.stdout.strip() == POINT, out.stderr


def test_wrong_password_is_refused(indexes):
    before = sorted(p.name for p in indexes["rocm"].root.iterdir())
    wheel = indexes["builds"][(POINT, False)][0]
    res = twine_upload(indexes["rocm"], [wheel], "not-" + indexes["password"])
    assert res.returncode != 0
    assert "403" in res.stdout + res.stderr or "401" in res.stdout + res.stderr, res.stdout + res.stderr
    assert sorted(p.name for p in indexes["rocm"].root.iterdir()) == before


def test_reupload_of_existing_version_is_refused(indexes):
    root = indexes["default"].root
    wheel = indexes["builds"][(OLD, False)][0]
    stamp = (root / wheel.name).stat().st_mtime_ns
    res = twine_upload(indexes["default"], [wheel], indexes["password"])
    assert res.returncode != 0, res.stdout + res.stderr
    # pypiserver answers 409, or 400 to twine (what pypi.org answers)
    assert "400 Bad Request" in res.stdout + res.stderr, res.stdout + res.stderr
    assert f"Cannot upload '{wheel.name}' since it already exists" in indexes["default"].log.read_text()
    assert (root / wheel.name).stat().st_mtime_ns == stamp
