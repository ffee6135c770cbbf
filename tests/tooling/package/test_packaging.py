"""Packaging: wheels (runtime + per-arch images), conda packages, fresh installs.

Small real archives (tests/support/real_archives.py: the real writer, stand-in code
objects) stand in for what `aotriton-rocm build` writes: packaging verifies
every archive it ships.
The slow tests share one build of everything and one fresh venv per session.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from support import real_archives as RA

from aotriton_rocm.tooling.package import command as pkg
from aotriton_rocm.tooling.package import archive_intake as AI
from aotriton_rocm.tooling.package import naming as N
from aotriton_rocm.tooling.common import source_tree as ST
from aotriton_rocm._version import abi_line
from aotriton_rocm.tooling.package import wheels as W

ROOT = Path(__file__).resolve().parents[3]
ARCHS = ("gfx942", "sm_90")
ROCM = "6.4"
VERSION = ST.read_version(ROOT)
ABI = abi_line(VERSION)
PY_MINOR = "%d.%d" % sys.version_info[:2]
TIMINGS: dict = {}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _make_archives(d: Path, archs=ARCHS, *, version=VERSION, rocm=ROCM, size=4096) -> Path:
    # real archives (package verifies every archive it ships); stand-in code objects
    for arch in archs:
        RA.write(d, arch, version=version, rocm=rocm, size=size)
    return d


def _wheel_names(whl: Path) -> list:
    with zipfile.ZipFile(whl) as z:
        return z.namelist()


def _wheel_read(whl: Path, suffix: str) -> str:
    with zipfile.ZipFile(whl) as z:
        name = next(n for n in z.namelist() if n.endswith(suffix))
        return z.read(name).decode("utf-8")


def _metadata(whl: Path):
    from email.parser import Parser

    return Parser().parsestr(_wheel_read(whl, ".dist-info/METADATA"))


# ------------------------------------------------------------------ fast checks

def test_version_and_name_rules():
    assert N.check_final_version("0.1.0") == "0.1.0"
    for bad in ("0.9.2b", "0.10b", "0.1.0rc1", "0.1.0.dev1", "0.1.0+rocm6.4", "0.1", "01.1.0"):
        with pytest.raises(N.PackagingError):
            N.check_final_version(bad)
    assert re.fullmatch(r"\d+\.\d+\.\d+", VERSION)
    assert N.archname("sm_90") == "sm90" and N.archname("gfx942") == "gfx942"
    assert N.image_dist_name("sm_90") == "aotriton-rocm-sm90"
    assert N.image_package_name("gfx90a") == "aotriton_rocm_gfx90a"
    assert N.local_label("6.4") == "rocm6.4"
    assert N.conda_rocm_tag("6.4") == "rocm64"
    with pytest.raises(N.PackagingError):
        N.conda_rocm_tag("6")


def test_collect_archives_refuses_mismatches(tmp_path):
    d = _make_archives(tmp_path / "a", ("gfx942",))
    [inp] = AI.collect_archives(d, None, VERSION, ROCM)
    assert inp.arch == "gfx942" and inp.manifest["rocm_profile"] == ROCM
    with pytest.raises(N.PackagingError, match="no archive"):
        AI.collect_archives(d, ["gfx90a"], VERSION)
    with pytest.raises(N.PackagingError, match="ROCm"):
        AI.collect_archives(d, ["gfx942"], VERSION, "7.0")
    other = _make_archives(tmp_path / "b", ("gfx942",), version="9.9.9")
    with pytest.raises(N.PackagingError, match="rebuild"):
        AI.collect_archives(other, None, VERSION)
    (d / "gfx942.manifest.json").write_text(json.dumps({"manifest": {"arch": "gfx90a"}}))
    with pytest.raises(N.PackagingError, match="built for"):
        AI.collect_archives(d, None, VERSION)
    (d / "gfx942.manifest.json").unlink()
    with pytest.raises(N.PackagingError, match="manifest"):
        AI.collect_archives(d, None, VERSION)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "gfx942.aotr").write_bytes(b"")
    with pytest.raises(N.PackagingError, match="empty"):
        AI.collect_archives(tmp_path / "c", None, VERSION)


def test_recipe_renders_outputs_and_pins(tmp_path):
    """recipe.yaml renders the runtime per Python minor and an image per arch,
    with dot-free build strings and ABI-line bounds that exclude the next
    line's pre-releases."""
    rb = pytest.importorskip("rattler_build")
    from rattler import BuildString, MatchSpec, PackageRecord

    from aotriton_rocm.tooling.package.conda import _variant_config

    recipe = rb.Stage0Recipe.from_file(ROOT / "recipe" / "recipe.yaml")
    variants = _variant_config(ROOT, "1.4.2", ROCM, list(ARCHS), ["3.11", "3.12"],
                               torch_spec=">=2.10,<2.14.0a0")  # 1.4 is not in torch_compat.json
    seen = {}
    for v in recipe.render(variants):
        seen[(v.recipe.package.name, v.recipe.build.string)] = v.recipe.requirements.to_dict()
    assert set(seen) == {("aotriton-rocm", "py311_rocm64_0"), ("aotriton-rocm", "py312_rocm64_0"),
                         ("aotriton-rocm-gfx942", "rocm64_0"), ("aotriton-rocm-sm90", "rocm64_0")}
    assert all("." not in build for _, build in seen)
    rt = seen[("aotriton-rocm", "py311_rocm64_0")]
    assert rt["run"] == ["__glibc >=2.28"]
    assert "python >=3.11,<3.12.0a0" in rt["run_constraints"]
    assert "python_abi 3.11.* *_cp311" in rt["run_constraints"]
    assert "pytorch >=2.10,<2.14.0a0" in rt["run_constraints"]
    assert not any(r.split()[0] in ("python", "pytorch") for r in rt["run"])
    img = seen[("aotriton-rocm-gfx942", "rocm64_0")]
    [dep] = img["run"]
    assert dep == "aotriton-rocm >=1.4.2,<1.5.0a0 *_rocm64_*"
    spec = MatchSpec(dep)
    for version, ok in (("1.4.2", True), ("1.4.9", True), ("1.4.1", False), ("1.5.0a0", False),
                        ("1.5.0rc1", False), ("1.5.0", False), ("1.5b", True)):
        # "1.5b" (an upstream-AOTriton-style version) sorts below 1.5.0a0 in conda:
        # one more reason this project releases finals only.
        rec = PackageRecord(name="aotriton-rocm", version=version, build=BuildString("py311_rocm64_0"),
                            build_number=0, subdir="linux-64")
        assert spec.matches(rec) is ok, version
    other_rocm = PackageRecord(name="aotriton-rocm", version="1.4.2", build=BuildString("py311_rocm70_0"),
                               build_number=0, subdir="linux-64")
    assert not spec.matches(other_rocm)


def test_unpack_wheel_refuses_escaping_paths(tmp_path):
    from aotriton_rocm.tooling.package.conda import unpack_wheel

    whl = tmp_path / "evil-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("../escape.py", "x = 1\n")
    with pytest.raises(N.PackagingError, match="unsafe"):
        unpack_wheel(whl, tmp_path / "sp")


# ------------------------------------------------------------- session builds

@pytest.fixture(scope="session")
def fake_archives(tmp_path_factory):
    return _make_archives(tmp_path_factory.mktemp("archives"))


@pytest.fixture(scope="session")
def wheels(tmp_path_factory, fake_archives):
    for mod in ("build", "twine", "auditwheel"):
        pytest.importorskip(mod)
    out = tmp_path_factory.mktemp("dist")
    report: dict = {}
    t: dict = {}
    files = W.build_wheels(ROOT, fake_archives, out, list(ARCHS), ROCM, False, timings=t,
                             report=report)
    TIMINGS.update(t)
    return {"out": out, "files": files, "report": report,
            "runtime": files[0], "images": files[1:-1], "sdist": files[-1]}


@pytest.fixture(scope="session")
def venv_python(tmp_path_factory, wheels):
    from aotriton_rocm.tooling.release.envs import install_wheels_in_fresh_venv

    t0 = time.perf_counter()
    py = install_wheels_in_fresh_venv([wheels["runtime"], *wheels["images"]],
                                      tmp_path_factory.mktemp("venv") / "env")
    TIMINGS["fresh_venv_install"] = time.perf_counter() - t0
    return py


@pytest.fixture(scope="session")
def conda_channel(tmp_path_factory, fake_archives, wheels):
    pytest.importorskip("rattler_build")
    pytest.importorskip("rattler")
    from aotriton_rocm.tooling.package.conda import build_conda

    chan = tmp_path_factory.mktemp("conda-channel")
    t: dict = {}
    files = build_conda(ROOT, fake_archives, chan, list(ARCHS), ROCM, python_versions=[PY_MINOR],
                        runtime_wheel=wheels["runtime"], timings=t)
    TIMINGS.update(t)
    return chan, files


@pytest.fixture(scope="session")
def conda_prefix(tmp_path_factory, conda_channel):
    from aotriton_rocm.tooling.package.conda import install_conda

    chan, _ = conda_channel
    prefix = tmp_path_factory.mktemp("conda-env") / "prefix"
    t0 = time.perf_counter()
    install_conda(chan, ["aotriton-rocm-gfx942", "aotriton-rocm-sm90",
                         f"aotriton-rocm *py{PY_MINOR.replace('.', '')}*"], prefix)
    TIMINGS["conda_install"] = time.perf_counter() - t0
    return prefix


@pytest.fixture(scope="session", autouse=True)
def _print_timings():
    yield
    if TIMINGS:
        print("\npackaging timings: " + ", ".join(f"{k} {v:.1f}s" for k, v in TIMINGS.items()))


# ---------------------------------------------------------------------- wheels

@pytest.mark.slow
def test_wheel_names_tags_versions(wheels):
    rt = wheels["runtime"]
    assert rt.parent == wheels["out"]
    m = re.fullmatch(r"aotriton_rocm-(?P<v>[^-]+)-cp39-abi3-(?P<plat>[^-]+)\.whl", rt.name)
    assert m, rt.name
    assert m["v"] == VERSION
    tags = W.wheel_tags(rt)
    assert f"cp39-abi3-{W.PLATFORM_TAG}" in tags
    # auditwheel may add older manylinux tags the launcher also qualifies for,
    # never a newer one.
    for tag in tags:
        g = re.fullmatch(r"cp39-abi3-manylinux(?:_(\d+)_(\d+)|1|2010|2014)_x86_64", tag)
        assert g, tag
        if g.group(1):
            assert (int(g.group(1)), int(g.group(2))) <= (2, 28), tag
    # (auditwheel wraps its lines by the wheel name's length)
    assert "consistent with the following platform tag" in " ".join(
        wheels["report"]["auditwheel_show"].split())
    assert {p.name for p in wheels["images"]} == {
        f"aotriton_rocm_{N.archname(a)}-{VERSION}-py3-none-{W.PLATFORM_TAG}.whl" for a in ARCHS}
    for img in wheels["images"]:
        assert W.wheel_tags(img) == [f"py3-none-{W.PLATFORM_TAG}"]
        assert _metadata(img)["Version"] == VERSION
    assert wheels["sdist"].name == f"aotriton_rocm-{VERSION}.tar.gz"
    # nothing left behind but the artifacts
    assert sorted(p.name for p in wheels["out"].iterdir()) == sorted(
        [p.name for p in wheels["files"]] + ["SHA256SUMS"])


@pytest.mark.slow
def test_runtime_metadata_extras_pin_images(wheels):
    from packaging.requirements import Requirement

    meta = _metadata(wheels["runtime"])
    assert meta["Name"] == "aotriton-rocm" and meta["Version"] == VERSION
    assert meta["Description-Content-Type"] == "text/markdown"
    reqs = [Requirement(r) for r in meta.get_all("Requires-Dist")]
    by_extra = {}
    for r in reqs:
        m = re.search(r'extra == "([^"]+)"', str(r.marker))
        by_extra.setdefault(m.group(1) if m else None, []).append(r)
    assert None not in by_extra, "the runtime must not require anything (torch included)"
    for arch in ARCHS:
        [r] = [r for r in by_extra[N.archname(arch)] if r.name == N.image_dist_name(arch)]
        [spec] = list(r.specifier)
        assert spec.operator == "~=" and abi_line(spec.version) == ABI
        assert spec.contains(VERSION) and not spec.contains(f"{ABI.split('.')[0]}.{int(ABI.split('.')[1]) + 1}.0")
    for img in wheels["images"]:
        [r] = [Requirement(x) for x in _metadata(img).get_all("Requires-Dist")]
        assert r.name == "aotriton-rocm" and str(r.specifier) == f"~={ABI}.0"


@pytest.mark.slow
def test_twine_check_strict(wheels):
    out = W.twine_check(wheels["files"])
    assert out.count("PASSED") == len(wheels["files"]), out


@pytest.mark.slow
def test_runtime_wheel_contents(wheels):
    names = _wheel_names(wheels["runtime"])
    tops = {n.split("/", 1)[0] for n in names}
    assert tops == {"aotriton_rocm", f"aotriton_rocm-{VERSION}.dist-info"}, tops
    # the C library and its public header (for C/C++ consumers), no other sources
    assert {"aotriton_rocm/lib/libaotriton_rocm.so.0.1",
            "aotriton_rocm/include/aotriton_rocm/aotriton_rocm.h",
            "aotriton_rocm/lib/cmake/aotriton_rocm/aotriton_rocmConfig.cmake",
            "aotriton_rocm/lib/cmake/aotriton_rocm/aotriton_rocmConfigVersion.cmake",
            "aotriton_rocm/lib/pkgconfig/aotriton_rocm.pc"} <= set(names)
    # and AOTriton's API (libaotriton_v2) per line: its library and headers
    api = {"0.11": "0.11.2", "0.13": "0.13.0", "0.14": "0.14.0"}
    api_headers = {f"aotriton_rocm/include/aotriton_api/{line}/aotriton/{h}" for line in api
                   for h in ("config.h", "cpp_tune.h", "dtypes.h", "flash.h", "runtime.h", "util.h")
                   + (("flash/backends.h",) if line == "0.14" else ("v2/cpp_tune.h", "v2/flash.h"))}
    assert [n for n in names if n.endswith((".c", ".h", ".pyc")) and n not in api_headers] == [
        "aotriton_rocm/include/aotriton_rocm/aotriton_rocm.h"]
    assert api_headers <= set(names), sorted(api_headers - set(names))
    api_libs = [f"aotriton_rocm/lib/aotriton_api/{line}/libaotriton_v2.so.{v}" for line, v in api.items()]
    assert set(api_libs) <= set(names)
    # every module of the source tree, kernels/ as aotriton_rocm._kernels
    want = {"aotriton_rocm/" + p.relative_to(ROOT / "src" / "aotriton_rocm").as_posix()
            for p in (ROOT / "src" / "aotriton_rocm").rglob("*.py")}
    want |= {"aotriton_rocm/_kernels/" + p.relative_to(ROOT / "kernels").as_posix()
             for p in (ROOT / "kernels").rglob("*") if p.suffix in (".py", ".toml")
             or (p.suffix == ".json" and p.parent.name == "tuning")}
    want = {w for w in want if "__pycache__" not in w}
    assert not want - set(names), sorted(want - set(names))
    assert "aotriton_rocm/_kernels/variants.toml" in names
    # the build-inputs hash of the archives it was packaged with (smoke and info check it)
    record = json.loads(_wheel_read(wheels["runtime"], "aotriton_rocm/packaged.json"))
    assert record == {"build_inputs_hash": RA.tree_hash(), "archs": sorted(ARCHS)}
    # no build-machine RUNPATH/RPATH; the C library exports its API only
    from elftools.elf.elffile import ELFFile
    import io

    for so in ("aotriton_rocm/lib/libaotriton_rocm.so.0.1", *api_libs):
        with zipfile.ZipFile(wheels["runtime"]) as z:
            elf = ELFFile(io.BytesIO(z.read(so)))
        dyn = elf.get_section_by_name(".dynamic")
        paths = [t.runpath if t.entry.d_tag == "DT_RUNPATH" else t.rpath
                 for t in dyn.iter_tags() if t.entry.d_tag in ("DT_RUNPATH", "DT_RPATH")]
        assert all(p.startswith("$ORIGIN") for p in paths), (so, paths)
        if so.endswith("0.1"):
            assert [t.soname for t in dyn.iter_tags() if t.entry.d_tag == "DT_SONAME"] == [
                "libaotriton_rocm.so.0.1"]
            exported = {sym.name for sym in elf.get_section_by_name(".dynsym").iter_symbols()
                        if sym["st_shndx"] not in ("SHN_UNDEF", "SHN_ABS")  # ABS: the version node
                        and sym["st_info"]["bind"] == "STB_GLOBAL"}
            assert exported and all(n.startswith("aotr_") for n in exported), sorted(exported)
        else:  # libaotriton_v2: the full version is the soname; AOTriton's C++ API only
            assert [t.soname for t in dyn.iter_tags() if t.entry.d_tag == "DT_SONAME"] == [
                so.rsplit("/", 1)[1]]
            exported = {sym.name for sym in elf.get_section_by_name(".dynsym").iter_symbols()
                        if sym["st_shndx"] != "SHN_UNDEF" and sym["st_info"]["bind"] != "STB_LOCAL"}
            assert exported and all(n.startswith(("_ZN8aotriton", "_ZNK8aotriton"))
                                    for n in exported), sorted(exported)
            assert elf.get_section_by_name(".gnu.version_d") is None  # unversioned


@pytest.mark.slow
def test_image_wheel_contents(wheels, fake_archives):
    for arch, img in zip(ARCHS, wheels["images"]):
        pkgname = N.image_package_name(arch)
        names = _wheel_names(img)
        tops = {n.split("/", 1)[0] for n in names}
        assert tops == {pkgname, f"{pkgname}-{VERSION}.dist-info"}, tops
        assert {f"{pkgname}/__init__.py", f"{pkgname}/{arch}.aotr",
                f"{pkgname}/{arch}.manifest.json"} <= set(names)
        with zipfile.ZipFile(img) as z:
            data = z.read(f"{pkgname}/{arch}.aotr")
        assert hashlib.sha256(data).hexdigest() == _sha256(fake_archives / f"{arch}.aotr")
        eps = _wheel_read(img, ".dist-info/entry_points.txt")
        assert "[aotriton_rocm.images]" in eps and f"{arch} = {pkgname}" in eps


@pytest.mark.slow
def test_local_version_wheels(tmp_path, fake_archives):
    files = W.build_wheels(ROOT, fake_archives, tmp_path, list(ARCHS[:1]), ROCM,
                             local_version=True)
    local = f"{VERSION}+rocm{ROCM}"
    assert files[0].name.startswith(f"aotriton_rocm-{local}-cp39-abi3-")
    assert files[1].name == f"aotriton_rocm_gfx942-{local}-py3-none-{W.PLATFORM_TAG}.whl"
    assert _metadata(files[0])["Version"] == local
    assert f'__version__ = "{local}"' in _wheel_read(files[0], "aotriton_rocm/_version.py")
    with pytest.raises(N.PackagingError, match="ROCm profile"):
        W.build_wheels(ROOT, _make_archives(tmp_path / "noprof", ("gfx942",), rocm=None),
                         tmp_path / "x", None, None, local_version=True)


# ----------------------------------------------------------------- fresh venv

@pytest.mark.slow
def test_fresh_venv_finds_archives_through_entry_points(venv_python, wheels):
    from aotriton_rocm.tooling.release.envs import clean_env

    code = r"""
import importlib.metadata as md, json, sys
eps = {e.name: e.value for e in md.entry_points(group="aotriton_rocm.images")}
import aotriton_rocm, aotriton_rocm.common.images as images
import aotriton_rocm_gfx942, aotriton_rocm_sm90
from aotriton_rocm.core import native
native.library()
print(json.dumps({
    "eps": eps,
    "found": {k: str(v) for k, v in images.find_archives().items()},
    "gfx942": str(aotriton_rocm_gfx942.archive_path()), "gfx942_arch": aotriton_rocm_gfx942.ARCH,
    "sm_90": str(aotriton_rocm_sm90.archive_path()),
    "file": aotriton_rocm.__file__, "version": aotriton_rocm.__version__,
    "dist": md.version("aotriton-rocm"), "prefix": sys.prefix,
    "launch": str(native.library_path()),
}))
"""
    env = clean_env()
    env.pop("AOTRITON_ROCM_ARCHIVE_DIR", None)
    proc = subprocess.run([str(venv_python), "-c", code], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    venv = Path(r["prefix"])
    assert r["eps"] == {"gfx942": "aotriton_rocm_gfx942", "sm_90": "aotriton_rocm_sm90"}
    assert r["found"] == {"gfx942": r["gfx942"], "sm_90": r["sm_90"]}
    assert r["gfx942_arch"] == "gfx942"
    assert Path(r["file"]).is_relative_to(venv) and Path(r["launch"]).is_relative_to(venv)
    assert r["version"] == r["dist"] == VERSION


@pytest.mark.slow
def test_fresh_venv_info_checks_the_installation(venv_python):
    """info in the fresh venv: library, torch extension and archives pass;
    with an installed image's archive deleted it names that wheel's
    reinstall command (pip thinks the image is installed)."""
    from aotriton_rocm.tooling.release.envs import clean_env

    env = clean_env()
    env.pop("AOTRITON_ROCM_ARCHIVE_DIR", None)

    def info():
        return subprocess.run([str(venv_python), "-m", "aotriton_rocm", "info"], env=env,
                              capture_output=True, text=True, timeout=300)

    proc = info()
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "library: libaotriton_rocm" in proc.stdout and "BAD" not in proc.stdout
    where = subprocess.run([str(venv_python), "-c", "import aotriton_rocm_gfx942 as m; "
                            "print(m.archive_path())"], env=env, capture_output=True, text=True,
                           timeout=300).stdout.strip()
    archive = Path(where)
    aside = archive.with_name("gfx942.aotr.aside")
    archive.rename(aside)
    try:
        proc = info()
    finally:
        aside.rename(archive)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"pip install --force-reinstall --no-deps 'aotriton-rocm-gfx942=={VERSION}'" in proc.stdout
    assert "none installed" not in proc.stdout


@pytest.mark.slow
def test_fresh_venv_import_and_smoke_entry(venv_python):
    from aotriton_rocm.tooling.release.envs import clean_env, run_smoke

    proc = subprocess.run([str(venv_python), "-c",
                           "import aotriton_rocm, sys; print(aotriton_rocm.__version__)"],
                          env=clean_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == VERSION, proc.stderr[-3000:]
    # The smoke module is installed and starts (the fake archives cannot pass it).
    res = run_smoke(venv_python, clean_env(), ["--help"])
    assert res.returncode == 0, res.stdout[-3000:]


# ---------------------------------------------------------------------- conda

@pytest.mark.slow
def test_conda_packages_built(conda_channel):
    chan, files = conda_channel
    nodot = PY_MINOR.replace(".", "")
    names = sorted(f.relative_to(chan).as_posix() for f in files)
    assert names == sorted([f"linux-64/aotriton-rocm-{VERSION}-py{nodot}_rocm64_0.conda",
                            f"noarch/aotriton-rocm-gfx942-{VERSION}-rocm64_0.conda",
                            f"noarch/aotriton-rocm-sm90-{VERSION}-rocm64_0.conda",
                            f"noarch/aotriton-rocm-auto-{VERSION}-gfx942_rocm64_0.conda"])
    repo = json.loads((chan / "linux-64" / "repodata.json").read_text())
    [rt] = repo["packages.conda"].values()
    assert rt["depends"] == ["__glibc >=2.28"]
    assert f"python >={PY_MINOR},<3.{int(PY_MINOR.split('.')[1]) + 1}.0a0" in rt["constrains"]
    noarch = json.loads((chan / "noarch" / "repodata.json").read_text())
    for rec in noarch["packages.conda"].values():
        assert rec["noarch"] == "generic"
        major, minor = ABI.split(".")
        if rec["name"] == "aotriton-rocm-auto":  # the image of the GPU present (no sm_90 build)
            assert rec["depends"] == ["__amdgpu_arch ==9.4.2", f"aotriton-rocm-gfx942 =={VERSION} rocm64_*"]
            continue
        assert rec["depends"] == [f"aotriton-rocm >={VERSION},<{major}.{int(minor) + 1}.0a0 *_rocm64_*"]


@pytest.mark.slow
def test_conda_install_fresh_prefix(conda_prefix, fake_archives):
    share = conda_prefix / "share" / "aotriton-rocm"
    for arch in ARCHS:
        assert _sha256(share / f"{arch}.aotr") == _sha256(fake_archives / f"{arch}.aotr")
        assert (share / f"{arch}.manifest.json").is_file()
    sp = conda_prefix / "lib" / f"python{PY_MINOR}" / "site-packages"
    assert (sp / "aotriton_rocm" / "__init__.py").is_file()
    assert (sp / "aotriton_rocm" / "_kernels" / "variants.toml").is_file()
    assert (sp / f"aotriton_rocm-{VERSION}.dist-info" / "INSTALLER").read_text().strip() == "conda"
    # the C library once, in the prefix (where C/C++ builds and its archive search look)
    for rel in (f"lib/libaotriton_rocm.so.{ABI}", "include/aotriton_rocm/aotriton_rocm.h",
                "lib/cmake/aotriton_rocm/aotriton_rocmConfig.cmake", "lib/pkgconfig/aotriton_rocm.pc"):
        assert (conda_prefix / rel).is_file(), rel
    assert not (sp / "aotriton_rocm" / "lib").exists() and not (sp / "aotriton_rocm" / "include").exists()
    record = next(sp.glob("aotriton_rocm-*.dist-info")) / "RECORD"
    assert "aotriton_rocm/lib/" not in record.read_text()
    metas = sorted(p.name for p in (conda_prefix / "conda-meta").glob("*.json"))
    assert len(metas) == 3 and not any(m.startswith("python-") for m in metas), metas
    script = (conda_prefix / "bin" / "aotriton-rocm").read_text()
    assert script.startswith(f"#!{conda_prefix}/bin/python\n")


@pytest.mark.slow
def test_conda_runtime_imports_from_prefix(conda_prefix):
    from aotriton_rocm.tooling.release.envs import python_for_conda_prefix

    python, env = python_for_conda_prefix(conda_prefix)
    env.pop("AOTRITON_ROCM_ARCHIVE_DIR", None)
    code = ("import json, sys, aotriton_rocm, aotriton_rocm.common.images as im\n"
            "from aotriton_rocm.core import native; native.library()\n"
            "print(json.dumps({'prefix': sys.prefix, 'file': aotriton_rocm.__file__,\n"
            "  'launch': str(native.library_path()), 'version': aotriton_rocm.__version__,\n"
            "  'found': {k: str(v) for k, v in im.find_archives().items()}}))\n")
    proc = subprocess.run([str(python), "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert Path(r["prefix"]) == conda_prefix.resolve()
    assert Path(r["file"]).is_relative_to(conda_prefix.resolve())
    assert Path(r["launch"]).is_relative_to(conda_prefix.resolve())
    assert r["version"] == VERSION
    share = conda_prefix.resolve() / "share" / "aotriton-rocm"
    assert r["found"] == {a: str(share / f"{a}.aotr") for a in ARCHS}
    # the console script conda installed runs with the prefix's python
    proc = subprocess.run([str(conda_prefix / "bin" / "aotriton-rocm"), "--help"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.slow
def test_conda_image_alone_pulls_runtime(conda_channel, tmp_path):
    from aotriton_rocm.tooling.package.conda import install_conda

    chan, _ = conda_channel
    install_conda(chan, ["aotriton-rocm-sm90"], tmp_path / "p")
    metas = sorted(p.name for p in (tmp_path / "p" / "conda-meta").glob("*.json"))
    assert [m.rsplit("-", 2)[0] for m in metas] == ["aotriton-rocm", "aotriton-rocm-sm90"]
    with pytest.raises(N.PackagingError):
        install_conda(chan, ["aotriton-rocm-sm90", f"aotriton-rocm >{VERSION}"], tmp_path / "q")


def test_package_command_arguments_and_errors(tmp_path, capsys):
    import argparse

    from aotriton_rocm.commands.cli import main as cli_main

    parser = argparse.ArgumentParser()
    pkg.add_package_arguments(parser)
    argv = ["--archives", str(tmp_path / "none"), "--out", str(tmp_path / "o"),
            "--arch", "gfx942", "--arch", "sm_90", "--rocm", "6.4",
            "--local-version", "--no-conda", "--source-root", str(ROOT)]
    options = pkg.PackageOptions.from_args(parser.parse_args(argv))
    assert options.archs == ("gfx942", "sm_90") and options.rocm == "6.4"
    assert options.local_version and not options.conda and options.wheels
    assert cli_main(["package", *argv]) == 1
    assert "no archive for gfx942" in capsys.readouterr().err
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())
    defaults = parser.parse_args([])
    assert defaults.archives == "build/archives" and defaults.out == "dist"
    assert defaults.arch is None and defaults.rocm is None and not defaults.local_version


@pytest.mark.slow
def test_installed_images_are_identity_checked(tmp_path, wheels):
    """Real wheels that `package` would refuse, built around it: install-check,
    smoke and info in the fresh environment catch (1) a gfx90a archive shipped
    as gfx942.aotr and (2) a 0.2 image installed with --no-deps beside the 0.1
    runtime."""
    from aotriton_rocm.tooling.release import install_check
    from aotriton_rocm.tooling.release.envs import clean_env, run_smoke

    def image_wheel(arch, archive, version):
        inp = AI.ArchiveInput(arch, archive, archive.with_name(f"{arch}.manifest.json"),
                               {"arch": arch})
        [w] = W.build_image_wheels(ROOT, [inp], tmp_path / f"img-{arch}-{version}", version, ROCM)
        return w

    renamed = RA.copy_as(RA.write(tmp_path / "src", "gfx90a"), tmp_path / "renamed", "gfx942")
    dist = tmp_path / "dist"
    dist.mkdir()
    for w in (wheels["runtime"], image_wheel("gfx942", renamed, VERSION)):
        os.link(w, dist / w.name)
    work = tmp_path / "work"
    ok = install_check.install_check(install_check.InstallCheckOptions(dist, work, conda=False))
    assert ok is False
    report = json.loads((work / "smoke-venv.json").read_text())
    [row] = [r for r in report["archives"] if r[0] == "archive gfx942"]
    assert row[1] is False and "file name says arch gfx942 but the archive inside is for gfx90a" in row[2]

    vpy = work / "venv" / "bin" / "python"
    other = image_wheel("gfx90a", RA.write(tmp_path / "abi02", "gfx90a", version="0.2.0"), "0.2.0")
    subprocess.run([str(vpy), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(other)],
                   check=True, env=clean_env())
    info = subprocess.run([str(vpy), "-m", "aotriton_rocm", "info"], env=clean_env(),
                          capture_output=True, text=True, timeout=300)
    assert info.returncode == 1 and "Traceback" not in info.stderr
    assert "gfx90a: BAD" in info.stdout and "ABI line 0.2, the runtime is ABI line 0.1" in info.stdout
    assert "gfx942: BAD" in info.stdout
    res = run_smoke(vpy, clean_env(), ["--quick"])
    assert res.returncode == 1
    assert "FAIL  archive gfx90a" in res.stdout and "pip install 'aotriton-rocm~=0.2.0'" in res.stdout
    assert "2 failed (2 of them installation checks)" in res.stdout
