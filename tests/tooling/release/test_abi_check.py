"""`aotriton-rocm abi-check`: real releases built here (the toy kernel of
test_build.py compiled with triton for gfx942/sm_90, and the real wheel
builder), compared the way a release engineer would."""

from __future__ import annotations

import json
import re
import shutil
import sys
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("triton")

from aotriton_rocm import _version
from aotriton_rocm.common import kernel_abi  # noqa: E402
from aotriton_rocm.tooling.release import public_api  # noqa: E402
from aotriton_rocm.common.archive import Archive  # noqa: E402
from aotriton_rocm.commands.cli import main as cli_main  # noqa: E402
from aotriton_rocm.tooling.release import abi_check as AC  # noqa: E402
from aotriton_rocm.tooling.builder import command as B  # noqa: E402
from aotriton_rocm.tooling.package import snapshot as S  # noqa: E402
from aotriton_rocm.tooling.package import wheels as W  # noqa: E402
from support.toy_build import TOY_KERNEL, TOY_VARIANTS, make_root  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
OLD = _version.__version__  # 0.1.0
X, Y, Z = (int(p) for p in OLD.split("."))
POINT = f"{X}.{Y}.{Z + 1}"
NEXT_LINE = f"{X}.{Y + 1}.0"

# The toy kernel with one more argument: a changed kernel argument list.
CHANGED_KERNEL = TOY_KERNEL.replace("n, alpha, BLOCK", "n, alpha, beta, BLOCK").replace(
    "x * alpha + y", "x * alpha + y * beta")
CHANGED_VARIANTS = TOY_VARIANTS.replace('["alpha", "fp32"]]', '["alpha", "fp32"], ["beta", "fp32"]]')


def _build(root: Path, out: Path, version: str, archs: str, dest: Path) -> Path:
    """Build the archives of ``root`` as release ``version``; copy them to ``dest``."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_version, "__version__", version)
        mp.setattr(_version, "ABI_VERSION", ".".join(version.split(".")[:2]))
        B.build("6.4", [archs], out, source_root=root, jobs=2, progress=False)
    dest.mkdir(parents=True)
    for arch in archs.split(","):
        for suffix in (".aotr", ".manifest.json"):
            shutil.copy2(out / "archives" / f"{arch}{suffix}", dest / f"{arch}{suffix}")
    return dest


@pytest.fixture(scope="module")
def releases(tmp_path_factory):
    base = tmp_path_factory.mktemp("abi")
    toy = make_root(base / "toy")
    changed = make_root(base / "changed", CHANGED_VARIANTS)
    (changed / "kernels" / "toy.py").write_text(CHANGED_KERNEL)
    out, out2 = base / "out", base / "out2"  # one build dir each: cache hits across versions
    return {
        "old": _build(toy, out, OLD, "gfx942", base / "r-old"),
        "added_arch": _build(toy, out, POINT, "gfx942,sm_90", base / "r-added-arch"),
        "changed_args": _build(changed, out2, POINT, "gfx942", base / "r-changed-args"),
        "next_line": _build(changed, out2, NEXT_LINE, "gfx942", base / "r-next-line"),
    }


def _abi_check(capsys, old, new):
    rc = cli_main(["abi-check", str(old), str(new)])
    out = capsys.readouterr()
    return rc, out.out + out.err


@pytest.mark.slow
def test_manifest_records_abi(releases):
    a = Archive.open(releases["old"] / "gfx942.aotr")
    sec = a.manifest["abi"]
    assert sec["format_version"] == 1 and sec["abi_line"] == f"{X}.{Y}" and sec["schema"] == 1
    assert set(sec["kernels"]) == {"scale_add"} and len(sec["kernels_sha256"]) == 64
    assert sec == kernel_abi.kernel_abi_section(a.kernels, 1, f"{X}.{Y}")
    side = json.loads((releases["old"] / "gfx942.manifest.json").read_text())
    assert side["manifest"]["abi"] == sec
    # the hash follows the argument list, not the code or the config
    changed = Archive.open(releases["changed_args"] / "gfx942.aotr").manifest["abi"]
    assert changed["kernels"]["scale_add"] != sec["kernels"]["scale_add"]
    same = Archive.open(releases["added_arch"] / "sm_90.aotr").manifest["abi"]
    assert same["kernels"] == sec["kernels"]  # sm_90 uses another BLOCK: same ABI


@pytest.mark.slow
def test_added_arch_is_allowed(releases, capsys):
    rc, out = _abi_check(capsys, releases["old"], releases["added_arch"])
    assert rc == 0, out
    assert "compatible addition: new arch sm_90" in out
    assert "breaking" not in out
    assert f"OK: {POINT} is ABI compatible with {OLD}" in out


@pytest.mark.slow
def test_changed_argument_list_is_refused(releases, capsys):
    rc, out = _abi_check(capsys, releases["old"], releases["changed_args"])
    assert rc == 1, out
    assert re.search(r"breaking: gfx942: kernel scale_add \[dtype=\"fp16\",head_dim=64\] argument list "
                     r"changed: \(.*alpha:fp32, global_scratch.*\) -> \(.*alpha:fp32, beta:fp32, ", out), out
    assert f"REFUSED: {POINT} is a point release of the {X}.{Y} ABI line" in out
    assert f"release it as {NEXT_LINE}" in out
    # single archive files work too
    rc, _ = _abi_check(capsys, releases["old"] / "gfx942.aotr", releases["changed_args"] / "gfx942.aotr")
    assert rc == 1


@pytest.mark.slow
def test_next_line_may_break(releases, capsys):
    rc, out = _abi_check(capsys, releases["old"], releases["next_line"])
    assert rc == 0, out
    assert "breaking (allowed: new ABI line): gfx942: kernel scale_add" in out
    assert f"starts the new ABI line {X}.{Y + 1}" in out


@pytest.mark.slow
def test_removed_arch_and_older_release_are_refused(releases, capsys):
    rc, out = _abi_check(capsys, releases["added_arch"], releases["old"])
    assert rc == 1 and "breaking: arch sm_90 removed" in out and "older than OLD" in out


def test_unreadable_release(tmp_path, capsys):
    rc, out = _abi_check(capsys, tmp_path, tmp_path)
    assert rc == 2 and "no wheels, conda packages, archives, site-packages or prefix" in out


# ------------------------------------------------------- public API (abi.json)

def _api(**functions):
    return {"functions": {n: {"signature": f"{n}(...)", "params": ps} for n, ps in functions.items()},
            "constants": {}, "cli": {}, "torch": [], "archive_format_version": 1}


P = lambda name, kind="POSITIONAL_OR_KEYWORD", **d: dict(name=name, kind=kind, **d)  # noqa: E731


@pytest.mark.parametrize("new_params,kind", [
    ([P("a"), P("b", default="1")], AC.ADDITION),                 # new optional parameter
    ([P("a"), P("k", "KEYWORD_ONLY", default="None")], AC.ADDITION),
    ([P("a"), P("b")], AC.BREAKING),                              # new required parameter
    ([P("b", default="1"), P("a")], AC.BREAKING),                 # reordered
    ([P("x")], AC.BREAKING),                                      # renamed
    ([P("a", "KEYWORD_ONLY")], AC.BREAKING),                      # positional -> keyword-only
    ([], AC.BREAKING),                                            # removed
])
def test_signature_rules(new_params, kind):
    changes = AC._compare_api(_api(f=[P("a")]), _api(f=new_params))
    assert [c.kind for c in changes] == [kind]


def test_public_api_description_is_generated_from_the_code():
    api = public_api.public_api()
    assert set(api["functions"]) >= {"enable", "disable", "is_enabled", "launch_counts",
                                     "reset_launch_counts"}
    assert api["functions"]["enable"]["params"][0] == {
        "name": "cpu_interpreter", "kind": "POSITIONAL_OR_KEYWORD", "default": "False"}
    assert api["constants"]["IMPL_NAME"] == "AOTRITON_ROCM"
    assert set(api["cli"]["smoke"]["options"]) >= {"--device", "--quick", "--json"}
    assert api["cli"]["smoke"]["options"]["--device"] == {"takes_value": True,
                                                          "choices": ["auto", "cpu", "gpu"]}
    assert api["cli"]["smoke"]["options"]["--quick"] == {"takes_value": False, "choices": None}
    # the recorded options are the ones the smoke parser accepts
    import argparse

    from aotriton_rocm.commands.smoke import SMOKE_FLAGS, add_smoke_arguments
    parser = argparse.ArgumentParser()
    add_smoke_arguments(parser)
    for f in SMOKE_FLAGS:
        parser.parse_args([f.name, *([(f.choices or ("x",))[0]] if f.takes_value else [])])
    assert api["conda_run_exports"] == f"aotriton-rocm >={OLD},<{X}.{Y + 1}.0a0"
    assert api["abi_line"] == _version.ABI_VERSION and api["archive_format_version"] == 1


# ----------------------------------------------------------- real wheels

def _tree_with_removed_function(dest: Path, version: str) -> Path:
    """A copy of this source tree, version ``version``, without the public
    ``reset_launch_counts``."""
    tree = S.snapshot_source(ROOT, dest)
    v = tree / "src" / "aotriton_rocm" / "_version.py"
    v.write_text(re.sub(r'__version__ = "[^"]*"', f'__version__ = "{version}"', v.read_text()))
    init = tree / "src" / "aotriton_rocm" / "__init__.py"
    text = init.read_text()
    new = re.sub(r"(from \.backends import launch_counts), reset_launch_counts\b", r"\1", text)
    new = re.sub(r',\s*"reset_launch_counts"', "", new)  # out of __all__, however it is wrapped
    assert new != text and "reset_launch_counts" not in new, "__init__.py changed: update this test"
    init.write_text(new)
    return tree


@pytest.mark.slow
def test_wheels_removed_public_function_is_refused(releases, tmp_path, capsys):
    old_dist = tmp_path / "old-dist"
    W.build_wheels(ROOT, releases["old"], old_dist)
    new_tree = _tree_with_removed_function(tmp_path / "tree", POINT)
    new_dist = tmp_path / "new-dist"
    W.build_wheels(new_tree, releases["added_arch"], new_dist, archs=["gfx942"])

    runtime = next(old_dist.glob("aotriton_rocm-*.whl"))
    with zipfile.ZipFile(runtime) as z:
        shipped = json.loads(z.read("aotriton_rocm/abi.json"))
    assert shipped == json.loads(json.dumps(public_api.public_api()))  # generated from the code

    rc, out = _abi_check(capsys, old_dist, new_dist)
    assert rc == 1, out
    assert "breaking: public function aotriton_rocm.reset_launch_counts removed" in out
    assert f"REFUSED: {POINT} is a point release" in out
    for line in ("0.11", "0.13"):  # libaotriton_v2 of each line, read from the runtime wheels
        assert f"note: libaotriton_v2 (AOTriton API {line}): layouts of" in out

    # the same release as an install: wheels unpacked into site-packages
    site = tmp_path / "prefix" / "lib" / "python3.12" / "site-packages"
    for whl in old_dist.glob("*.whl"):
        with zipfile.ZipFile(whl) as z:
            z.extractall(site)
    rc, out = _abi_check(capsys, old_dist, tmp_path / "prefix")
    assert rc == 0 and "no ABI changes" in out, out
    rc, out = _abi_check(capsys, site, new_dist / next(new_dist.glob("aotriton_rocm-*.whl")).name)
    assert rc == 1 and "reset_launch_counts removed" in out, out

    # the same releases as conda packages (runtime + image .conda, a channel each)
    from aotriton_rocm.tooling.package.conda import build_conda

    py = "%d.%d" % sys.version_info[:2]
    build_conda(ROOT, releases["old"], tmp_path / "old-conda", ["gfx942"], "6.4", python_versions=[py],
                runtime_wheel=next(old_dist.glob("aotriton_rocm-*.whl")), run_tests=False)
    build_conda(new_tree, releases["added_arch"], tmp_path / "new-conda", ["gfx942", "sm_90"], "6.4",
                python_versions=[py], runtime_wheel=next(new_dist.glob("aotriton_rocm-*.whl")),
                run_tests=False)
    rc, out = _abi_check(capsys, tmp_path / "old-conda", tmp_path / "new-conda")
    assert rc == 1, out
    assert "note: libaotriton_v2 (AOTriton API 0.13): layouts of" in out
    assert "breaking: public function aotriton_rocm.reset_launch_counts removed" in out
    assert "compatible addition: new arch sm_90" in out and f"NEW {POINT} " in out
    # one .conda file each (the images), and a .conda against the wheels it was made from
    old_img = next((tmp_path / "old-conda" / "noarch").glob("aotriton-rocm-gfx942-*.conda"))
    new_img = next((tmp_path / "new-conda" / "noarch").glob("aotriton-rocm-gfx942-*.conda"))
    rc, out = _abi_check(capsys, old_img, new_img)
    assert rc == 0 and "no ABI changes" in out, out
    rc, out = _abi_check(capsys, old_dist, tmp_path / "old-conda")
    assert rc == 0 and "no ABI changes" in out, out
    # a channel holding two releases is ambiguous
    both = tmp_path / "both"
    for src in (tmp_path / "old-conda", tmp_path / "new-conda"):
        for c in src.glob("*/*.conda"):
            (both / c.parent.name).mkdir(parents=True, exist_ok=True)
            shutil.copy2(c, both / c.parent.name / c.name)
    rc, out = _abi_check(capsys, both, tmp_path / "new-conda")
    assert rc == 2 and f"conda packages of several releases ({OLD}, {POINT})" in out, out
