"""Every arch we build is installable by name, and `aotriton-rocm pin --rocm`
picks the build of the ROCm release asked for across the 7.x/10.x boundary
(never by PEP 440 order, where ``+rocm7.2`` sorts above ``+rocm10.0``)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from aotriton_rocm._version import ABI_VERSION
from aotriton_rocm.commands.cli import main as cli_main
from aotriton_rocm.tooling.common.targets import load_targets
from aotriton_rocm.tooling.package.naming import conda_rocm_tag, image_dist_name, local_label
from aotriton_rocm.tooling.release import pin

ROOT = Path(__file__).resolve().parents[3]
FAMILIES = ("gfx110x", "gfx115x", "gfx120x")  # upstream AOTriton's pack groups


@pytest.fixture(scope="module")
def targets():
    return load_targets(ROOT / "ci" / "targets.toml")


@pytest.fixture(scope="module")
def extras():
    """extra -> the image distributions it pulls in (pyproject.toml)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    out = {}
    for extra, reqs in project["optional-dependencies"].items():
        parsed = [Requirement(r) for r in reqs]
        images = [r for r in parsed if r.name.startswith("aotriton-rocm-")]
        for r in images:
            assert str(r.specifier) == f"~={ABI_VERSION}.0", (extra, str(r))
        if images:
            out[extra] = [r.name for r in images]
    return out


def test_every_arch_of_every_profile_has_an_extra(targets, extras):
    built = {a for p in targets.profiles.values() for a in p.archs}
    assert {"gfx950", "gfx1100", "gfx1101", "gfx1102", "gfx1150", "gfx1151", "gfx1200",
            "gfx1201"} <= built
    for arch in built | {"sm_90"}:
        assert extras[arch.replace("_", "")] == [image_dist_name(arch)], arch


def test_family_extras_and_all_follow_targets(targets, extras):
    for fam in FAMILIES:
        assert extras[fam] == [image_dist_name(a) for a in targets.arch_sets[fam]], fam
    amd = [a for a, s in targets.archs.items() if s.backend == "hip"]
    assert extras["all"] == [image_dist_name(a) for a in amd]
    # the newest profile builds every image `all` and the families name
    newest = max(targets.profiles, key=lambda v: tuple(map(int, v.split("."))))
    assert newest == "10.0" and set(targets.profiles[newest].archs) == set(amd)


def test_pin_prints_an_extra_that_exists(extras, capsys):
    assert cli_main(["pin", "--torch", "2.13", "--arch", "gfx1151"]) == 0
    req = next(Requirement(ln) for ln in capsys.readouterr().out.splitlines()
               if ln.startswith("aotriton-rocm["))
    assert req.extras == {"gfx1151"} and set(req.extras) <= set(extras)


def test_pin_names_the_rocm_release_not_a_version_order():
    # the hazard: PEP 440 compares the local labels as strings
    assert Version("0.1.0+rocm7.2") > Version("0.1.0+rocm10.0")
    assert (local_label("10.0"), conda_rocm_tag("10.0")) == ("rocm10.0", "rocm100")
    res = pin.pin_lines("2.13", ["gfx942"], rocm="10.0", index_url="https://example.org/")
    assert res["pip"][0] == "--index-url https://example.org/rocm10.0/simple/"
    assert res["conda"] == ["aotriton-rocm >=0.1.0,<0.2.0a0 *_rocm100_*",
                            "aotriton-rocm-gfx942 >=0.1.0,<0.2.0a0 rocm100_*"]
    assert pin.pin_lines("2.13", rocm="7.14")["pip"][0] == "--index-url https://INDEX/rocm7.14/simple/"
    with pytest.raises(pin.PinError, match="not of the form A.B"):
        pin.pin_lines("2.13", rocm="10")


def test_pin_command_refuses_an_index_without_rocm(capsys):
    assert cli_main(["pin", "--torch", "2.13", "--index-url", "https://example.org"]) == 1
    assert "add --rocm A.B" in capsys.readouterr().err


def _wheel(where: Path, version: str) -> None:
    """A minimal, valid runtime wheel of ``version`` (metadata only)."""
    where.mkdir(parents=True, exist_ok=True)
    di = f"aotriton_rocm-{version}.dist-info"
    files = {f"{di}/METADATA": f"Metadata-Version: 2.1\nName: aotriton-rocm\nVersion: {version}\n",
             f"{di}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{di}/RECORD"] = "".join(f"{n},,\n" for n in [*files, f"{di}/RECORD"])
    with zipfile.ZipFile(where / f"aotriton_rocm-{version}-py3-none-any.whl", "w") as z:
        for name, text in files.items():
            z.writestr(name, text)


def _simple_index(base: Path, label: str, versions) -> None:
    """``base/<label>/simple/aotriton-rocm/index.html`` (PEP 503) listing the wheels."""
    project = base / label / "simple" / "aotriton-rocm"
    for v in versions:
        _wheel(project, v)
    links = "".join(f'<a href="{p.name}">{p.name}</a>\n' for p in sorted(project.glob("*.whl")))
    (project / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")


def _pip_pick(requirements: list, tmp_path: Path) -> str:
    req = tmp_path / "requirements.txt"
    req.write_text("\n".join(requirements) + "\n")
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
                           "--no-deps", "--disable-pip-version-check", "--no-cache-dir", "--quiet",
                           "--report", "-", "-r", str(req)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    [item] = json.loads(proc.stdout)["install"]
    return item["metadata"]["version"]


def test_pin_picks_the_rocm_build_across_the_7_to_10_boundary(tmp_path):
    """Real pip on file:// indexes: one index holding both builds takes +rocm7.2
    (version order); pin's lines for 10.0 and for 7.2 each get their own."""
    base = tmp_path / "index"
    for label in ("rocm7.2", "rocm10.0"):
        _simple_index(base, label, [f"0.1.0+{label}"])
    _simple_index(base, "mixed", ["0.1.0+rocm7.2", "0.1.0+rocm10.0"])
    mixed = [f"--index-url {(base / 'mixed' / 'simple').as_uri()}/", "aotriton-rocm~=0.1.0"]
    assert _pip_pick(mixed, tmp_path) == "0.1.0+rocm7.2"
    for rocm in ("10.0", "7.2"):
        lines = pin.pin_lines("2.13", rocm=rocm, index_url=base.as_uri())["pip"]
        assert _pip_pick([ln for ln in lines if not ln.startswith("torch")], tmp_path) == f"0.1.0+rocm{rocm}"


def _repodata_channel(root: Path, records: dict) -> Path:
    """A conda channel of repodata only (what the solver reads): subdir -> records."""
    for subdir in ("linux-64", "noarch"):
        pkgs = {f"{r['name']}-{r['version']}-{r['build']}.conda": {**r, "subdir": subdir, "depends": r.get(
            "depends", [])} for r in records.get(subdir, [])}
        d = root / subdir
        d.mkdir(parents=True, exist_ok=True)
        (d / "repodata.json").write_text(json.dumps({"info": {"subdir": subdir}, "packages": {},
                                                     "packages.conda": pkgs}))
    return root


def solve_names(channel: Path, specs, virtual=()) -> dict:
    """name -> build string of what py-rattler's solver picks from ``channel``."""
    rattler = pytest.importorskip("rattler")

    async def go():
        return await rattler.solve(sources=[rattler.Channel(channel.as_uri())], specs=list(specs),
                                   gateway=rattler.Gateway(cache_dir=channel.parent / "rattler-cache"),
                                   platforms=[rattler.Subdir("linux-64"), rattler.Subdir("noarch")],
                                   virtual_packages=list(virtual))
    return {str(r.name.normalized): str(r.build) for r in asyncio.run(go())}


def test_conda_pin_picks_the_rocm_build(tmp_path):
    """The solver, given pin's spec, takes the 10.0 runtime and image over 7.2
    and 7.14 builds of the same version; rocm71's spec does not take rocm714."""
    rt = [{"name": "aotriton-rocm", "version": "0.1.0", "build": f"py311_{t}_0", "build_number": 0}
          for t in ("rocm71", "rocm72", "rocm714", "rocm100")]
    img = [{"name": "aotriton-rocm-gfx942", "version": "0.1.0", "build": f"{t}_0", "build_number": 0,
            "depends": [f"aotriton-rocm >=0.1.0,<0.2.0a0 *_{t}_*"]} for t in ("rocm72", "rocm100")]
    chan = _repodata_channel(tmp_path / "channel", {"linux-64": rt, "noarch": img})
    assert solve_names(chan, pin.pin_lines("2.13", ["gfx942"], rocm="10.0")["conda"]) == {
        "aotriton-rocm": "py311_rocm100_0", "aotriton-rocm-gfx942": "rocm100_0"}
    assert solve_names(chan, pin.pin_lines("2.13", rocm="7.1")["conda"]) == {
        "aotriton-rocm": "py311_rocm71_0"}


def test_release_plan_builds_every_arch_of_rocm_10(tmp_path, capsys):
    """Without --arch a release builds every arch of each profile, so every
    extra above has its image on the rocm10.0 index; --shards splits each
    profile's build over machines."""
    build = tmp_path / "B"
    assert cli_main(["release", "--source-root", str(ROOT), "--rocm", "7.2,10.0", "--plan",
                     "--shards", "2", "--build-dir", str(build)]) == 0
    lines = capsys.readouterr().out.splitlines()
    targets = load_targets(ROOT / "ci" / "targets.toml")
    assert lines[0] == f"ROCm 7.2 (rocm7.2): 10 archs: {', '.join(targets.profiles['7.2'].archs)}"
    assert lines[4] == f"ROCm 10.0 (rocm10.0): 11 archs: {', '.join(targets.profiles['10.0'].archs)}"
    assert lines[5:8] == [
        f"  aotriton-rocm build --rocm 10.0 --arch all --shard 1/2 --out {build}/rocm10.0-shard1",
        f"  aotriton-rocm build --rocm 10.0 --arch all --shard 2/2 --out {build}/rocm10.0-shard2",
        f"  aotriton-rocm merge {build}/rocm10.0-shard1 {build}/rocm10.0-shard2 --out {build}/rocm10.0"]
    assert lines[-1] == f"then: aotriton-rocm release --rocm 7.2,10.0 --build-dir {build}"
    assert cli_main(["release", "--source-root", str(ROOT), "--rocm", "7.2", "--arch", "gfx1102",
                     "--plan"]) == 2
    assert "profiles that support it: 7.14, 7.15, 10.0" in capsys.readouterr().err


def test_pin_takes_a_group_extra(extras):
    """pip gets the group's extra, conda the group's image packages (read from
    the installed runtime's metadata)."""
    from aotriton_rocm.common import images

    if images.published_image_extras() is None:
        pytest.skip("the runtime has no distribution metadata here")
    res = pin.pin_lines("2.13", ["gfx110x", "gfx1100", "gfx950"], rocm="7.14")
    assert res["pip"][1] == "aotriton-rocm[gfx110x,gfx1100,gfx950]~=0.1.0"
    want = [d.removeprefix("aotriton-rocm-") for d in extras["gfx110x"]] + ["gfx950"]
    assert res["conda"][1:] == [f"aotriton-rocm-{a} >=0.1.0,<0.2.0a0 rocm714_*" for a in want]
