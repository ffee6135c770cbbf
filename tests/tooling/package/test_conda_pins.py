"""Conda pins: real .conda packages of three toy releases (0.1.0, 0.1.1 on the
0.1 ABI line, 0.2.0 on the next) in one local channel, solved with py-rattler.

`aotriton-rocm ==0.1.*` resolves to the newest point release and never
crosses to 0.2; an image of the 0.1 line never goes with a 0.2 runtime; and
the bounds hold for pre-releases of the next line (0.2.0a0, 0.2.0rc1: records
added to a copy of the channel's repodata, so the solver itself sees them).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from pathlib import Path

import pytest

from support import toy_release as TR

pytest.importorskip("rattler")
pytest.importorskip("rattler_build")
pytest.importorskip("build")

from rattler import (BuildString, Channel, Gateway, MatchSpec, PackageRecord, Subdir,  # noqa: E402
                     VirtualPackage, solve)
from rattler.exceptions import SolverError  # noqa: E402
from rattler.package import RunExportsJson  # noqa: E402

from aotriton_rocm.tooling.package.conda import index_channel, install_conda  # noqa: E402

# every test solves a channel of three toy releases (wheels and .conda packages built from this tree)
pytestmark = pytest.mark.slow

VERSIONS = ("0.1.0", "0.1.1", "0.2.0")
IMAGE = f"aotriton-rocm-{TR.ARCH}"
PY = "py%d%d" % sys.version_info[:2]


@pytest.fixture(scope="module")
def channel(tmp_path_factory):
    TR.build_wheels_in_parallel([(v, False) for v in VERSIONS])
    chan = tmp_path_factory.mktemp("channel")
    files = {}
    for v in VERSIONS:
        for p in TR.conda_packages(v):
            dst = chan / p.parent.name / p.name
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, dst)
            files.setdefault(v, []).append(dst)
    index_channel(chan)
    return chan, files


@pytest.fixture(scope="module")
def prerelease_channel(channel, tmp_path_factory):
    """The channel's repodata with 0.2.0a0 and 0.2.0rc1 runtime (and image)
    records, copies of 0.2.0's with the version changed."""
    chan, _ = channel
    d = tmp_path_factory.mktemp("prerelease-channel")
    for subdir in ("linux-64", "noarch"):
        repo = json.loads((chan / subdir / "repodata.json").read_text())
        pkgs = repo["packages.conda"]
        for fn, rec in list(pkgs.items()):
            if rec["version"] != "0.2.0":
                continue
            for pre in ("0.2.0a0", "0.2.0rc1"):
                new = dict(rec, version=pre)
                new["depends"] = [dep.replace(">=0.2.0", f">={pre}") for dep in rec["depends"]]
                pkgs[fn.replace("-0.2.0-", f"-{pre}-")] = new
        (d / subdir).mkdir()
        (d / subdir / "repodata.json").write_text(json.dumps(repo))
    return d


def _solve(chan: Path, specs):
    # The solver parses strings strictly (`==0.1.*` is refused there: conda's
    # spelling is `0.1.*` or `=0.1`); a MatchSpec object is parsed leniently.
    async def go():
        return await solve(sources=[Channel(chan.as_uri())], specs=list(specs),
                           gateway=Gateway(cache_dir=chan.parent / (chan.name + "-cache")),
                           platforms=[Subdir.current(), Subdir("noarch")],
                           virtual_packages=VirtualPackage.detect())

    return {str(r.name.normalized): str(r.version) for r in asyncio.run(go())}


def test_channel_has_the_three_releases(channel):
    chan, files = channel
    rt = json.loads((chan / "linux-64" / "repodata.json").read_text())["packages.conda"]
    noarch = json.loads((chan / "noarch" / "repodata.json").read_text())["packages.conda"]
    img = {k: r for k, r in noarch.items() if r["name"] == IMAGE}
    # and each release's aotriton-rocm-auto (tests/tooling/package/test_conda_auto.py)
    assert sorted(r["version"] for r in noarch.values() if r["name"] == "aotriton-rocm-auto") == list(VERSIONS)
    assert sorted(r["version"] for r in rt.values()) == list(VERSIONS)
    assert sorted(r["version"] for r in img.values()) == list(VERSIONS)
    assert all(r["build"] == f"{PY}_rocm64_0" for r in rt.values())
    deps = {r["version"]: r["depends"] for r in img.values()}
    assert deps == {"0.1.0": ["aotriton-rocm >=0.1.0,<0.2.0a0 *_rocm64_*"],
                    "0.1.1": ["aotriton-rocm >=0.1.1,<0.2.0a0 *_rocm64_*"],
                    "0.2.0": ["aotriton-rocm >=0.2.0,<0.3.0a0 *_rocm64_*"]}


def test_abi_line_spec_resolves_to_newest_point_release(channel):
    chan, _ = channel
    for spec in (MatchSpec("aotriton-rocm ==0.1.*"), "aotriton-rocm 0.1.*", "aotriton-rocm =0.1",
                 "aotriton-rocm >=0.1.0,<0.2.0a0"):  # the last: what `aotriton-rocm pin` prints
        assert _solve(chan, [spec]) == {"aotriton-rocm": "0.1.1"}, spec
    assert _solve(chan, [f"{IMAGE} 0.1.*"]) == {IMAGE: "0.1.1", "aotriton-rocm": "0.1.1"}
    # unpinned: the newest line, runtime and image together
    assert _solve(chan, [IMAGE]) == {IMAGE: "0.2.0", "aotriton-rocm": "0.2.0"}
    # the oldest image of the line takes the newest runtime of the same line
    assert _solve(chan, [f"{IMAGE} ==0.1.0"]) == {IMAGE: "0.1.0", "aotriton-rocm": "0.1.1"}


def test_image_never_goes_with_the_next_line(channel, tmp_path):
    chan, _ = channel
    for image in ("0.1.0", "0.1.1"):
        with pytest.raises(SolverError):
            _solve(chan, [f"{IMAGE} =={image}", "aotriton-rocm ==0.2.0"])
    with pytest.raises(SolverError):
        _solve(chan, [f"{IMAGE} ==0.2.0", "aotriton-rocm 0.1.*"])
    # and a real install of the 0.1 line from the channel gets 0.1.1 on disk
    install_conda(chan, [f"{IMAGE} 0.1.*"], tmp_path / "prefix")
    metas = sorted(p.name for p in (tmp_path / "prefix" / "conda-meta").glob("*.json"))
    assert metas == [f"aotriton-rocm-0.1.1-{PY}_rocm64_0.json", f"{IMAGE}-0.1.1-rocm64_0.json"]


def test_run_exports_pin_the_abi_line(channel):
    _, files = channel
    for v, paths in files.items():
        x, y, _z = v.split(".")
        upper = f"{x}.{int(y) + 1}.0a0"
        for p in paths:
            name = p.name.rsplit("-", 2)[0]
            if name == "aotriton-rocm-auto":  # a metapackage: nothing to link against
                continue
            weak = RunExportsJson.from_package_archive(p).weak
            assert weak == [f"{name} >={v},<{upper}"], (p.name, weak)
            spec = MatchSpec(weak[0])
            for cand, ok in ((v, True), (f"{x}.{y}.9", True), (f"{x}.{int(y) + 1}.0a0", False),
                             (f"{x}.{int(y) + 1}.0rc1", False), (f"{x}.{int(y) + 1}.0", False)):
                rec = PackageRecord(name=name, version=cand, build=BuildString("rocm64_0"),
                                    build_number=0, subdir="noarch")
                assert spec.matches(rec) is ok, (weak[0], cand)


def test_prereleases_of_the_next_line_never_satisfy_the_bound(prerelease_channel):
    chan = prerelease_channel
    # the pre-release records are real candidates ...
    assert _solve(chan, ["aotriton-rocm ==0.2.0rc1"]) == {"aotriton-rocm": "0.2.0rc1"}
    assert _solve(chan, [f"{IMAGE} ==0.2.0a0"]) == {IMAGE: "0.2.0a0", "aotriton-rocm": "0.2.0"}
    # ... that the 0.1 line's <0.2.0a0 bound keeps out
    for pre in ("0.2.0a0", "0.2.0rc1"):
        with pytest.raises(SolverError):
            _solve(chan, [f"{IMAGE} ==0.1.1", f"aotriton-rocm =={pre}"])
    assert _solve(chan, [f"{IMAGE} 0.1.*"]) == {IMAGE: "0.1.1", "aotriton-rocm": "0.1.1"}
    for spec in (MatchSpec("aotriton-rocm ==0.1.*"), "aotriton-rocm >=0.1.0,<0.2.0a0"):
        assert _solve(chan, [spec]) == {"aotriton-rocm": "0.1.1"}, spec
