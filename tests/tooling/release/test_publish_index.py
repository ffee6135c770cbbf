"""Publishing to a real package index with per-ROCm paths: ONE pypiserver
process on 127.0.0.1 (tests/support/pypi_index.py) serving the default index at ``/``
and the ROCm 6.4 index at ``/rocm6.4/``, uploads guarded by htpasswd; real
wheels of toy releases uploaded with twine and installed with pip into fresh
venvs from one index at a time.

Releases: 0.1.0 and 0.1.1 (default build, no local label) on the default
index; 0.1.0+rocm6.4 (the per-ROCm build) on ``/rocm6.4/``.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from support import toy_release as TR

pytest.importorskip("pypiserver")
pytest.importorskip("passlib")
pytest.importorskip("twine")
pytest.importorskip("build")

from support.pypi_index import IndexServer, quiet_env  # noqa: E402

# every test publishes toy releases (wheels built from this tree) to the index
pytestmark = pytest.mark.slow

USER = "uploader"
OLD, POINT = "0.1.0", "0.1.1"
ROCM_INDEX = f"rocm{TR.ROCM}"
LOCAL = f"{OLD}+{ROCM_INDEX}"


def write_htpasswd(path: Path, password: str, user: str = USER) -> Path:
    from passlib.apache import HtpasswdFile

    ht = HtpasswdFile(str(path), new=True)
    ht.set_password(user, password)
    ht.save()
    return path


def twine_upload(url: str, files, password: str) -> subprocess.CompletedProcess:
    env = quiet_env(TWINE_USERNAME=USER, TWINE_PASSWORD=password)
    return subprocess.run([sys.executable, "-m", "twine", "upload", "--non-interactive",
                           "--disable-progress-bar", "--repository-url", url,
                           *map(str, files)], env=env, capture_output=True, text=True, timeout=120)


def pip(*args, python=sys.executable) -> subprocess.CompletedProcess:
    # --isolated: no pip config or PIP_* variables (extra indexes, find-links)
    return subprocess.run([sys.executable, "-m", "pip", "--isolated", "--python", str(python), *args],
                          env=quiet_env(), capture_output=True, text=True, timeout=300)


def fresh_venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    return path / "bin" / "python"


def installed(python: Path) -> dict:
    """{distribution: version} of the aotriton-rocm* distributions in that venv."""
    code = ("import importlib.metadata as m, json; print(json.dumps({d.metadata['Name']: d.version "
            "for d in m.distributions() if d.metadata['Name'].startswith('aotriton')}))")
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, env=quiet_env())
    assert out.returncode == 0, out.stderr
    import json

    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    base = tmp_path_factory.mktemp("pypi")
    password = secrets.token_urlsafe(16)
    write_htpasswd(base / "htpasswd", password)
    builds = TR.build_wheels_in_parallel([(OLD, False), (POINT, False), (OLD, True)])
    server = IndexServer(base, base / "htpasswd", ["", ROCM_INDEX])
    try:
        for name, files in (("", builds[(OLD, False)] + builds[(POINT, False)]),
                            (ROCM_INDEX, builds[(OLD, True)])):
            res = twine_upload(server.url(name), files, password)
            assert res.returncode == 0, res.stdout + res.stderr
            assert password not in res.stdout + res.stderr
        yield {"server": server, "password": password, "builds": builds}
    finally:
        server.stop()


def test_one_server_with_per_rocm_paths(index):
    server, builds = index["server"], index["builds"]
    assert server.url(ROCM_INDEX) == server.base_url + f"{ROCM_INDEX}/"
    assert server.files("") == sorted(p.name for p in builds[(OLD, False)] + builds[(POINT, False)])
    assert server.files(ROCM_INDEX) == sorted(p.name for p in builds[(OLD, True)])


def test_default_index_gives_newest_final(index, tmp_path):
    py = fresh_venv(tmp_path / "venv")
    res = pip("install", "--index-url", index["server"].simple(), f"aotriton-rocm[{TR.ARCH}]", python=py)
    assert res.returncode == 0, res.stdout + res.stderr
    # the runtime and the image wheel its extra pins (~=0.1.0): both the newest final
    assert installed(py) == {"aotriton-rocm": POINT, f"aotriton-rocm-{TR.ARCH}": POINT}


def test_rocm_index_gives_the_rocm_build(index, tmp_path):
    py = fresh_venv(tmp_path / "venv")
    res = pip("install", "--index-url", index["server"].simple(ROCM_INDEX), f"aotriton-rocm[{TR.ARCH}]",
              python=py)
    assert res.returncode == 0, res.stdout + res.stderr
    assert installed(py) == {"aotriton-rocm": LOCAL, f"aotriton-rocm-{TR.ARCH}": LOCAL}
    # a pin on the public version matches the local build too (PEP 440)
    res = pip("download", "--no-deps", "--index-url", index["server"].simple(ROCM_INDEX), "-d",
              str(tmp_path / "pinned"), f"aotriton-rocm=={OLD}")
    assert res.returncode == 0, res.stdout + res.stderr
    [got] = sorted(p.name for p in (tmp_path / "pinned").iterdir())
    assert got.startswith(f"aotriton_rocm-{LOCAL}-"), got


def test_point_release_upgrades_in_place(index, tmp_path):
    py = fresh_venv(tmp_path / "venv")
    idx = index["server"].simple()
    res = pip("install", "--index-url", idx, f"aotriton-rocm[{TR.ARCH}]=={OLD}", python=py)
    assert res.returncode == 0, res.stdout + res.stderr
    assert installed(py) == {"aotriton-rocm": OLD, f"aotriton-rocm-{TR.ARCH}": POINT}
    res = pip("install", "-U", "--index-url", idx, f"aotriton-rocm[{TR.ARCH}]", python=py)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"Successfully uninstalled aotriton-rocm-{OLD}" in res.stdout, res.stdout
    assert installed(py) == {"aotriton-rocm": POINT, f"aotriton-rocm-{TR.ARCH}": POINT}
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert sorted(p.name for p in Path(site).glob("aotriton_rocm-*.dist-info")) == [
        f"aotriton_rocm-{POINT}.dist-info"]


def test_wrong_password_is_refused(index):
    server = index["server"]
    before = server.files(ROCM_INDEX)
    wheel = index["builds"][(POINT, False)][0]
    res = twine_upload(server.url(ROCM_INDEX), [wheel], "not-" + index["password"])
    out = res.stdout + res.stderr
    assert res.returncode != 0 and ("403" in out or "401" in out), out
    assert index["password"] not in out
    assert server.files(ROCM_INDEX) == before


def test_reupload_of_existing_version_is_refused(index):
    server = index["server"]
    wheel = index["builds"][(OLD, True)][0]
    stamp = (server.roots[ROCM_INDEX] / wheel.name).stat().st_mtime_ns
    res = twine_upload(server.url(ROCM_INDEX), [wheel], index["password"])
    assert res.returncode != 0, res.stdout + res.stderr
    # pypiserver answers 409, or 400 to twine (what pypi.org answers)
    assert "400 Bad Request" in res.stdout + res.stderr, res.stdout + res.stderr
    assert f"Cannot upload '{wheel.name}' since it already exists" in server.log.read_text()
    assert (server.roots[ROCM_INDEX] / wheel.name).stat().st_mtime_ns == stamp
