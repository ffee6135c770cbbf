"""Fixtures shared by the test modules (helpers live in tests/support/)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

import pytest

from support import SHARED_ENV
from support.toy_build import make_root


def pytest_runtest_setup(item):
    """``@pytest.mark.gpu`` (``arch=``, ``image=False``): skipped where the
    GPU, or its image, is not there (support.gpu.missing)."""
    marker = item.get_closest_marker("gpu")
    if marker is not None:
        from support.gpu import missing

        reason = missing(**marker.kwargs)
        if reason:
            pytest.skip(reason)


def pytest_configure(config):
    if not hasattr(config, "workerinput") and not os.environ.get(SHARED_ENV):
        config._aotriton_shared_dir = tempfile.mkdtemp(prefix="aotriton-tests-")
        os.environ[SHARED_ENV] = config._aotriton_shared_dir


def pytest_unconfigure(config):
    shared = getattr(config, "_aotriton_shared_dir", None)
    if shared:
        shutil.rmtree(shared, ignore_errors=True)
        os.environ.pop(SHARED_ENV, None)


@pytest.fixture(scope="module")
def toy_root(tmp_path_factory):
    """A fresh toy kernel project (tests/support/toy_build.py) per module."""
    return make_root(tmp_path_factory.mktemp("toyroot"))


@pytest.fixture
def enabled():
    """Our implementation enabled for one test, launch counts reset."""
    import aotriton_rocm
    from aotriton_rocm.core import backends

    aotriton_rocm.enable()
    backends.reset_launch_counts()
    yield
    aotriton_rocm.disable()


@pytest.fixture
def isolated_images(monkeypatch, tmp_path):
    """No installed image is visible but AOTRITON_ROCM_ARCHIVE_DIR=tmp/images."""
    from aotriton_rocm.common import images

    d = tmp_path / "images"
    d.mkdir()
    monkeypatch.setenv(images.ENV_VAR, str(d))
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "empty-prefix"))
    monkeypatch.setattr(images, "_entry_points", lambda: [])
    images.clear_cache()
    yield d
    images.clear_cache()
