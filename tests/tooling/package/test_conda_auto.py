"""aotriton-rocm-auto: real metapackages in a local channel beside stand-in
runtime and image packages (metadata only, same names, versions, build
strings and dependencies as recipe.yaml's), solved by py-rattler with the
``__amdgpu_arch`` virtual package faked through rattler's override
(CONDA_OVERRIDE_AMDGPU / CONDA_OVERRIDE_AMDGPU_ARCH), set and unset."""

from __future__ import annotations

import asyncio
import sys

import pytest

pytest.importorskip("rattler")
pytest.importorskip("rattler_build")

from rattler import Channel, Gateway, Subdir, solve  # noqa: E402
from rattler.exceptions import SolverError  # noqa: E402
from rattler.virtual_package import VirtualPackage, VirtualPackageOverrides  # noqa: E402
from rattler_build import assemble_package  # noqa: E402

from aotriton_rocm.tooling.package import conda_auto as CA  # noqa: E402
from aotriton_rocm.tooling.package.conda import index_channel  # noqa: E402
from aotriton_rocm.tooling.package.naming import PackagingError  # noqa: E402

VERSION = "0.1.0"
ARCHS = ("gfx942", "gfx90a", "gfx1151", "sm_90")
PY = "py%d%d" % sys.version_info[:2]


@pytest.fixture(scope="module")
def channel(tmp_path_factory):
    chan = tmp_path_factory.mktemp("channel")
    work = tmp_path_factory.mktemp("work")
    for rocm, tag in (("7.2", "rocm72"), ("10.0", "rocm100")):
        assemble_package(name="aotriton-rocm", version=VERSION, target_platform="linux-64",
                         build_string=f"{PY}_{tag}_0", output_dir=chan / "linux-64", files=[])
        for arch in ("gfx942", "gfx90a", "gfx1151"):
            assemble_package(name=f"aotriton-rocm-{arch}", version=VERSION, target_platform="noarch",
                             noarch="generic", build_string=f"{tag}_0", output_dir=chan / "noarch", files=[],
                             depends=[f"aotriton-rocm >={VERSION},<0.2.0a0 *_{tag}_*"])
        made = CA.build_auto_packages(chan, VERSION, rocm, ARCHS, epoch=1700000000)
        assert sorted(p.name for p in made) == sorted(
            f"aotriton-rocm-auto-{VERSION}-{a}_{tag}_0.conda" for a in ("gfx942", "gfx90a", "gfx1151"))
    index_channel(chan)
    return chan, work


def _solve(channel, specs, monkeypatch, arch=None):
    chan, work = channel
    if arch is None:
        monkeypatch.setenv("CONDA_OVERRIDE_AMDGPU", "")  # forced off: no AMD GPU
    else:
        monkeypatch.setenv("CONDA_OVERRIDE_AMDGPU", "0")
        monkeypatch.setenv("CONDA_OVERRIDE_AMDGPU_ARCH", arch)
    virtual = VirtualPackage.detect(VirtualPackageOverrides.from_env())

    async def go():
        return await solve(sources=[Channel(chan.as_uri())], specs=list(specs),
                           gateway=Gateway(cache_dir=work / "cache"),
                           platforms=[Subdir("linux-64"), Subdir("noarch")], virtual_packages=virtual)
    return {str(r.name.normalized): str(r.build) for r in asyncio.run(go())}


def test_isa_versions():
    assert [CA.isa_version(a) for a in ("gfx942", "gfx90a", "gfx908", "gfx950", "gfx1100", "gfx1151",
                                        "gfx1201")] == ["9.4.2", "9.0.10", "9.0.8", "9.5.0", "11.0.0",
                                                        "11.5.1", "12.0.1"]
    with pytest.raises(PackagingError, match="not an AMD gfx arch"):
        CA.isa_version("sm_90")


@pytest.mark.parametrize("isa, arch", [("9.4.2", "gfx942"), ("9.0.10", "gfx90a"), ("11.5.1", "gfx1151")])
def test_the_image_of_the_gpu_present(channel, monkeypatch, isa, arch):
    got = _solve(channel, ["aotriton-rocm-auto * *_rocm100_*"], monkeypatch, isa)
    assert got == {"aotriton-rocm-auto": f"{arch}_rocm100_0", f"aotriton-rocm-{arch}": "rocm100_0",
                   "aotriton-rocm": f"{PY}_rocm100_0"}


def test_no_amdgpu_arch_no_auto_but_the_per_arch_package(channel, monkeypatch):
    with pytest.raises(SolverError, match="__amdgpu_arch"):
        _solve(channel, ["aotriton-rocm-auto"], monkeypatch)
    with pytest.raises(SolverError):  # a GPU we ship no image for (gfx1250)
        _solve(channel, ["aotriton-rocm-auto"], monkeypatch, "12.5.0")
    assert _solve(channel, ["aotriton-rocm-gfx942 * rocm72_*"], monkeypatch) == {
        "aotriton-rocm-gfx942": "rocm72_0", "aotriton-rocm": f"{PY}_rocm72_0"}
