"""Fixtures shared by the test modules (helpers live in tests/support/)."""

from __future__ import annotations

import pytest

from support.toy_build import make_root


@pytest.fixture(scope="module")
def toy_root(tmp_path_factory):
    """A fresh toy kernel project (tests/support/toy_build.py) per module."""
    return make_root(tmp_path_factory.mktemp("toyroot"))


@pytest.fixture
def enabled():
    """Our implementation enabled for one test, launch counts reset."""
    import aotriton_rocm
    from aotriton_rocm import backends

    aotriton_rocm.enable()
    backends.reset_launch_counts()
    yield
    aotriton_rocm.disable()
