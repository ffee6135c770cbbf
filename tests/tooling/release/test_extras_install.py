"""An RDNA extra and gfx950 installed by name from a real package index:
pypiserver on 127.0.0.1 serving a toy release (the runtime wheel and image
wheels of gfx1151 and gfx950 built under the ROCm 7.2 profile, uploaded with
twine); ``pip install "aotriton-rocm[ARCH]"`` into a fresh venv takes the
runtime and that image; then ``smoke --device cpu --quick`` runs the installed
package (its image found through the entry point, checked by the C reader)
in Triton's interpreter, with this environment's torch and triton."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys

import pytest

from support import toy_release as TR

pytest.importorskip("pypiserver")
pytest.importorskip("passlib")
pytest.importorskip("twine")
pytest.importorskip("build")

from support.pypi_index import IndexServer, quiet_env  # noqa: E402
from test_publish_index import fresh_venv, installed, pip, twine_upload, write_htpasswd  # noqa: E402

VERSION = "0.1.1"
ARCHS = ("gfx1151", "gfx950")  # RDNA 3.5 (Strix Halo) and MI355X: no ROCm 6.4 builds
ROCM = "7.2"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("pypi-extras")
    password = secrets.token_urlsafe(16)
    write_htpasswd(base / "htpasswd", password)
    runtime = TR.wheels(VERSION)[0]
    images = TR.image_wheels(VERSION, ARCHS, ROCM)
    srv = IndexServer(base, base / "htpasswd", [""])
    try:
        res = twine_upload(srv.url(""), [runtime, *images], password)
        assert res.returncode == 0, res.stdout + res.stderr
        yield srv
    finally:
        srv.stop()


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_extra_installs_its_image_and_smoke_passes(server, arch, tmp_path):
    py = fresh_venv(tmp_path / "venv")
    res = pip("install", "--index-url", server.simple(), f"aotriton-rocm[{arch}]", python=py)
    assert res.returncode == 0, res.stdout + res.stderr
    assert installed(py) == {"aotriton-rocm": VERSION, f"aotriton-rocm-{arch}": VERSION}
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    report = tmp_path / "smoke.json"
    # the installed package first on the path; torch and triton from this environment
    env = quiet_env(PYTHONPATH=site, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    env.pop("AOTRITON_ROCM_ARCHIVE_DIR", None)
    smoke = subprocess.run([sys.executable, "-m", "aotriton_rocm", "smoke", "--device", "cpu",
                            "--quick", "--json", str(report)], env=env, capture_output=True,
                           text=True, timeout=900)
    assert smoke.returncode == 0, smoke.stdout[-3000:] + smoke.stderr[-3000:]
    assert f"{arch}" in smoke.stdout, smoke.stdout
    where = subprocess.run([sys.executable, "-c", "import aotriton_rocm; print(aotriton_rocm.__file__)"],
                           env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert where.startswith(site), where
    assert json.loads(report.read_text())
