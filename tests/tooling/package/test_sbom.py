"""CycloneDX SBOM of a release: `aotriton-rocm package` writes
aotriton-rocm-<version>.cdx.json next to the artifacts. The builders are
replaced by copies of a toy release's real wheels and .conda packages
(tests/support/toy_release.py; built once per session), so this checks the command's
wiring and the document, not the builders again."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from support import toy_release as TR

pytest.importorskip("build")
pytest.importorskip("rattler_build")
pytest.importorskip("cyclonedx")
pytest.importorskip("jsonschema")  # the validator: cyclonedx-python-lib[json-validation]

from aotriton_rocm import _version
from aotriton_rocm.core import torch_compat  # noqa: E402
from aotriton_rocm.commands.cli import main as cli_main  # noqa: E402
from aotriton_rocm.tooling.package import conda as C  # noqa: E402
from aotriton_rocm._version import abi_line  # noqa: E402
from aotriton_rocm.tooling.package import dist_dir as D  # noqa: E402
from aotriton_rocm.tooling.package import command as pkg  # noqa: E402
from aotriton_rocm.tooling.package import reproducible as R  # noqa: E402
from aotriton_rocm.tooling.common import source_tree as ST  # noqa: E402
from aotriton_rocm.tooling.package import sbom as S  # noqa: E402

VERSION = ST.read_version(TR.ROOT)


def check_cyclonedx(text: str) -> dict:
    """Valid against the CycloneDX 1.5 JSON schema (cyclonedx-python-lib's own
    strict validator), and every dependency names a component of the document
    (which the schema cannot check); returns the document."""
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    error = JsonStrictValidator(SchemaVersion.V1_5).validate_str(text)
    assert error is None, getattr(error.data, "message", error)
    doc = json.loads(text)
    assert doc["specVersion"] == "1.5"  # the schema accepts any version string
    meta = doc["metadata"]
    refs = [c["bom-ref"] for c in [meta["component"], *doc["components"]] if "bom-ref" in c]
    assert len(refs) == len(set(refs)), "bom-refs must be unique"
    for d in doc["dependencies"]:
        assert d["ref"] in refs and set(d.get("dependsOn", [])) <= set(refs), d
    return doc


@pytest.fixture(scope="module")
def release_dir(tmp_path_factory):
    """`aotriton-rocm package` (wheels and conda packages), the builders handing
    back copies of the toy release's files."""
    out = tmp_path_factory.mktemp("release")
    wheels = TR.wheels(VERSION)
    condas = TR.conda_packages(VERSION)
    archives = TR.archives(VERSION)

    def fake_wheels(root, archives_dir, out_dir, *a, report=None, **k):
        files = [Path(shutil.copy2(w, Path(out_dir) / w.name)) for w in wheels]
        D.write_sha256sums(out_dir, files)
        if report is not None:
            report.update({"version": VERSION, "rocm_profile": TR.ROCM})
        return files

    def fake_conda(root, archives_dir, out_dir, *a, **k):
        made = []
        for c in condas:
            (Path(out_dir) / c.parent.name).mkdir(parents=True, exist_ok=True)
            made.append(Path(shutil.copy2(c, Path(out_dir) / c.parent.name / c.name)))
        return made

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pkg, "build_wheels", fake_wheels)
        mp.setattr(C, "build_conda", fake_conda)
        common = ["package", "--archives", str(archives), "--out", str(out), "--rocm", TR.ROCM,
                  "--source-root", str(TR.ROOT)]
        assert cli_main(common) == 0
    return out, wheels, condas


@pytest.mark.slow
def test_package_writes_a_cyclonedx_sbom(release_dir):
    out, wheels, condas = release_dir
    path = out / f"aotriton-rocm-{VERSION}.cdx.json"
    doc = check_cyclonedx(path.read_text())
    assert doc["specVersion"] == S.SPEC_VERSION == "1.5"
    epoch = R.source_date_epoch(TR.ROOT)  # the last commit's time (or the environment's)
    if epoch is not None:  # not a git checkout: stamped with the current time
        assert doc["metadata"]["timestamp"] == time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(int(epoch)))
    # every artifact with its sha256
    listed = {c["bom-ref"].split(":", 1)[1]: c for c in doc["components"] if "hashes" in c}
    want = [w.name for w in wheels] + [f"conda/{c.parent.name}/{c.name}" for c in condas]
    assert sorted(listed) == sorted(want)
    for rel, c in listed.items():
        assert c["hashes"] == [{"alg": "SHA-256",
                                "content": hashlib.sha256((out / rel).read_bytes()).hexdigest()}]
        assert c["version"] == VERSION
        assert c["licenses"] == [{"expression": "MIT"}], rel  # as each package declares it
        assert c["purl"].startswith(("pkg:pypi/aotriton-rocm", "pkg:conda/aotriton-rocm"))
    # the compiler is the build tool, pinned
    [tool] = doc["metadata"]["tools"]["components"]
    assert (tool["name"], tool["version"]) == ("triton", _version.TRITON_VERSION) == ("triton", "3.9.0")
    assert tool["purl"] == "pkg:pypi/triton@3.9.0" and tool["licenses"] == [{"expression": "MIT"}]
    assert doc["metadata"]["component"]["version"] == VERSION
    # the runtime's dependencies: torch (supported versions), image -> runtime, conda's glibc floor
    [torch] = [c for c in doc["components"] if c["name"] == "torch"]
    assert sorted(p["value"] for p in torch["properties"]) == sorted(torch_compat.supported_torch(
        abi_line(VERSION)))
    assert torch["licenses"] == [{"expression": "BSD-3-Clause"}] and torch["scope"] == "required"
    deps = {d["ref"]: d.get("dependsOn", []) for d in doc["dependencies"]}
    rt_wheel = f"wheel:{wheels[0].name}"
    assert deps[rt_wheel] == ["requirement:torch"]
    assert deps[f"wheel:{wheels[1].name}"] == [rt_wheel]
    assert sorted(deps[f"release:{VERSION}"]) == sorted(c["bom-ref"] for c in listed.values())
    assert deps["requirement:torch"] == []
    image_conda = next(f"conda/{c.parent.name}/{c.name}" for c in condas if c.parent.name == "noarch")
    rt_conda = next(f"conda/{c.parent.name}/{c.name}" for c in condas if c.parent.name != "noarch")
    assert deps["conda:" + image_conda] == ["conda:" + rt_conda]
    assert deps["conda:" + rt_conda] == ["requirement:torch"]
    [auto] = [f"conda/noarch/{c.name}" for c in condas if c.name.startswith("aotriton-rocm-auto-")]
    assert image_conda != auto and deps["conda:" + auto] == ["conda:" + image_conda]

    def requires(rel):
        return [p["value"] for p in listed[rel]["properties"] if p["name"] == "aotriton-rocm:requires"]

    assert requires(rt_conda) == ["__glibc >=2.28"]
    assert requires(image_conda) == [f"aotriton-rocm >={VERSION},<0.2.0a0 *_rocm64_*"]
    assert requires(wheels[1].name) == [f"aotriton-rocm~={abi_line(VERSION)}.0"]
    # SHA256SUMS covers the SBOM too, and checks out
    sums = (out / "SHA256SUMS").read_text()
    assert path.name in sums
    proc = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=out, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
def test_sbom_is_reproducible(release_dir, monkeypatch):
    out, _, _ = release_dir
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    a = S.sbom_json(S.build_sbom(out, VERSION, source_root=TR.ROOT, rocm_profile=TR.ROCM))
    b = S.sbom_json(S.build_sbom(out, VERSION, source_root=TR.ROOT, rocm_profile=TR.ROCM))
    assert a == b
    doc = check_cyclonedx(a)
    assert doc["metadata"]["timestamp"] == "2023-11-14T22:13:20+00:00"
    props = {p["name"]: p["value"] for p in doc["metadata"]["component"]["properties"]}
    assert props == {"aotriton-rocm:abi-line": abi_line(VERSION), "aotriton-rocm:rocm-profile": TR.ROCM}


def test_validator_rejects_broken_documents():
    good = {"bomFormat": "CycloneDX", "specVersion": "1.5", "version": 1,
            "serialNumber": "urn:uuid:3e671687-395b-41f5-a30f-a58921a69b79",
            "metadata": {"timestamp": "2024-01-01T00:00:00Z", "tools": {"components": []},
                         "component": {"type": "library", "name": "x", "bom-ref": "x"}},
            "components": [], "dependencies": [{"ref": "x", "dependsOn": []}]}
    check_cyclonedx(json.dumps(good))
    for broken in ({"bomFormat": "SPDX"}, {"specVersion": "1.2"}, {"serialNumber": "42"},
                   {"dependencies": [{"ref": "nope"}]},
                   {"components": [{"type": "wheel", "name": "y"}]},
                   {"components": [{"type": "library", "name": "y", "hashes": [{"alg": "SHA-256", "content": "z"}]}]},
                   {"unknown": 1}):
        with pytest.raises(AssertionError):
            check_cyclonedx(json.dumps({**good, **broken}))
