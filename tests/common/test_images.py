"""Finding installed kernel archives: env var, image-wheel entry points, conda."""

from __future__ import annotations

import os
import sys

import pytest

from aotriton_rocm.common import images


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    monkeypatch.delenv(images.ENV_VAR, raising=False)
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "empty-prefix"))
    images.clear_cache()
    yield
    images.clear_cache()


def _touch(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"AOTRKA\r\n")
    return path


def _fake_image_wheel(site, dist, module, arch, with_file=True):
    """An installed image wheel: dist-info with the entry point + the package dir."""
    di = site / f"{dist}-0.1.0.dist-info"
    di.mkdir(parents=True)
    (di / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1.0\n")
    (di / "entry_points.txt").write_text(f"[{images.ENTRY_POINT_GROUP}]\n{arch} = {module}\n")
    pkg = site / module
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise RuntimeError('image packages must not be imported')\n")
    if with_file:
        _touch(pkg / f"{arch}.aotr")
    return pkg


def test_env_var_dirs_first_wins(monkeypatch, tmp_path):
    a = _touch(tmp_path / "a" / "gfx942.aotr")
    _touch(tmp_path / "b" / "gfx942.aotr")
    b908 = _touch(tmp_path / "b" / "gfx908.aotr")
    (tmp_path / "b" / "notes.txt").write_text("x")
    monkeypatch.setenv(images.ENV_VAR, os.pathsep.join([str(tmp_path / "a"), str(tmp_path / "b"),
                                                         str(tmp_path / "missing")]))
    found = images.find_archives()
    assert found == {"gfx942": a, "gfx908": b908}
    assert any("missing" in n for n in images.search_notes())


def test_cached_until_cleared(monkeypatch, tmp_path):
    monkeypatch.setenv(images.ENV_VAR, str(tmp_path))
    assert images.find_archives() == {}
    p = _touch(tmp_path / "gfx90a.aotr")
    assert images.find_archives() == {}  # cached
    assert images.find_archives(refresh=True) == {"gfx90a": p}
    _touch(tmp_path / "sm_90.aotr")
    images.clear_cache()
    assert set(images.find_archives()) == {"gfx90a", "sm_90"}


def test_entry_point_image_wheel(monkeypatch, tmp_path):
    site = tmp_path / "site"
    pkg = _fake_image_wheel(site, "aotriton_rocm_gfx908_fake", "aotr_fake_img_gfx908", "gfx908")
    _fake_image_wheel(site, "aotriton_rocm_gfx90a_fake", "aotr_fake_img_gfx90a", "gfx90a", with_file=False)
    monkeypatch.syspath_prepend(str(site))
    found = images.find_archives()
    assert found.get("gfx908") == pkg / "gfx908.aotr"
    assert "gfx90a" not in found
    assert any("gfx90a" in n and "missing" in n for n in images.search_notes())
    assert "aotr_fake_img_gfx908" not in sys.modules  # located, not imported


def test_conda_prefix(monkeypatch, tmp_path):
    prefix = tmp_path / "conda"
    p = _touch(prefix / "share" / "aotriton-rocm" / "gfx942.aotr")
    monkeypatch.setattr(sys, "prefix", str(prefix))
    assert images.find_archives() == {"gfx942": p}


def test_priority_env_then_wheel_then_conda(monkeypatch, tmp_path):
    site = tmp_path / "site"
    pkg = _fake_image_wheel(site, "aotriton_rocm_gfx942_fake", "aotr_fake_img_gfx942", "gfx942")
    _fake_image_wheel(site, "aotriton_rocm_gfx90a_fake2", "aotr_fake_img2_gfx90a", "gfx90a")
    monkeypatch.syspath_prepend(str(site))
    prefix = tmp_path / "conda"
    for arch in ("gfx942", "gfx90a", "gfx908"):
        _touch(prefix / "share" / "aotriton-rocm" / f"{arch}.aotr")
    monkeypatch.setattr(sys, "prefix", str(prefix))
    env_dir = tmp_path / "env"
    env942 = _touch(env_dir / "gfx942.aotr")
    monkeypatch.setenv(images.ENV_VAR, str(env_dir))
    found = images.find_archives()
    assert found["gfx942"] == env942
    assert found["gfx90a"] == site / "aotr_fake_img2_gfx90a" / "gfx90a.aotr"
    assert found["gfx908"] == prefix / "share" / "aotriton-rocm" / "gfx908.aotr"
    del pkg


def test_find_archive_one_arch_without_the_metadata_scan(monkeypatch, tmp_path):
    """find_archive(arch): the env dir, then the image package at its usual
    name (where libaotriton_rocm looks too), read without any distribution's
    metadata; anything else as find_archives() finds it."""
    site = tmp_path / "site"
    usual = _fake_image_wheel(site, "aotriton_rocm_sm90", "aotriton_rocm_sm90", "sm_90")
    odd = _fake_image_wheel(site, "aotriton_rocm_gfx942_odd", "aotr_odd_gfx942", "gfx942")
    monkeypatch.syspath_prepend(str(site))
    env_dir = tmp_path / "env"
    env908 = _touch(env_dir / "gfx908.aotr")
    monkeypatch.setenv(images.ENV_VAR, str(env_dir))

    def no_scan():
        raise AssertionError("the entry points were read")

    with monkeypatch.context() as m:
        m.setattr(images, "_entry_points", no_scan)
        assert images.find_archive("gfx908") == env908
        assert images.find_archive("sm_90") == usual / "sm_90.aotr"
    # not at a usual place: the full search, which then serves from its cache
    assert images.find_archive("gfx942") == odd / "gfx942.aotr"
    assert images.find_archive("gfx1100") is None
    assert "aotriton_rocm_sm90" not in sys.modules  # located, not imported
