"""CycloneDX SBOM (JSON, spec 1.5) of a release: written next to the artifacts
by ``aotriton-rocm package`` as ``aotriton-rocm-<version>.cdx.json``.

What it lists:

* every artifact in the output directory's ``SHA256SUMS`` (wheels, sdist,
  ``.conda`` packages) as a component with its SHA-256, a package URL
  (``pkg:pypi/...``, ``pkg:conda/...``), its license (as the package
  declares it) and its declared requirements;
* the runtime's run-time requirements that no metadata declares: torch
  (deliberately not a wheel requirement: ROCm users install it from the ROCm
  index), the supported minor versions taken from ``torch_compat.json``;
  conda's ``__glibc`` floor comes from the package itself;
* the pinned compiler (``triton==<TRITON_VERSION>``) as the build tool in
  ``metadata.tools``;
* the dependencies: the release on every artifact, an image package on the
  runtime package of its kind, the runtime on torch.

Written with cyclonedx-python-lib (the ``build`` extra). The output is
reproducible: the timestamp is ``SOURCE_DATE_EPOCH`` (as for the wheels) and
the serial number a UUID derived from the artifacts' hashes.
"""

from __future__ import annotations

import datetime
import os
import re
import tarfile
import time
import uuid
import zipfile
from dataclasses import dataclass, field
from email.parser import Parser
from pathlib import Path
from typing import Dict, List, Optional

from ..._version import abi_line
from ...common.files import atomic_write_text
from .conda_auto import AUTO_PACKAGE
from .dist_dir import sha256sums_path
from .reproducible import source_date_epoch

__all__ = ["SPEC_VERSION", "sbom_path", "build_sbom", "sbom_json", "write_sbom"]

SPEC_VERSION = "1.5"
RUNTIME = "aotriton-rocm"
TORCH_LICENSE = "BSD-3-Clause"
TRITON_LICENSE = "MIT"
_NS = uuid.UUID("0b5e3f3e-6a43-4c1e-9d35-2f1b0c6a7e11")  # this project's UUID namespace
_WHEEL = re.compile(r"^(?P<dist>[^-]+)-(?P<ver>[^-]+)(-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl$")
_SDIST = re.compile(r"^(?P<dist>.+)-(?P<ver>[^-]+)\.tar\.gz$")
_CONDA = re.compile(r"^(?P<name>.+)-(?P<ver>[^-]+)-(?P<build>[^-]+)\.(conda|tar\.bz2)$")


def sbom_path(out_dir: os.PathLike, version: str) -> Path:
    return Path(out_dir) / f"{RUNTIME}-{version}.cdx.json"


def _dist_name(dist: str) -> str:
    return dist.replace("_", "-").lower()


@dataclass
class Artifact:
    """One released file, as the SBOM describes it."""

    kind: str  # wheel | sdist | conda
    rel: str  # path relative to the output directory
    name: str
    version: str
    purl: str
    sha256: str
    license: Optional[str] = None
    requires: List[str] = field(default_factory=list)

    @property
    def ref(self) -> str:
        return f"{self.kind}:{self.rel}"


def _core_metadata(text: str) -> Dict[str, object]:
    meta = Parser().parsestr(text)
    return {"license": meta.get("License-Expression") or meta.get("License"),
            "requires": list(meta.get_all("Requires-Dist") or [])}


def _wheel_metadata(path: Path) -> Dict[str, object]:
    with zipfile.ZipFile(path) as z:
        name = next((n for n in z.namelist() if n.endswith(".dist-info/METADATA")), None)
        return _core_metadata(z.read(name).decode("utf-8")) if name else {"license": None, "requires": []}


def _sdist_license(path: Path) -> Optional[str]:
    """An sdist's own requirements are build inputs, not listed; its license is."""
    with tarfile.open(path) as t:
        member = next((m for m in t.getmembers() if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO")), None)
        f = t.extractfile(member) if member else None
        return _core_metadata(f.read().decode("utf-8"))["license"] if f else None


def _conda_metadata(path: Path) -> Dict[str, object]:
    try:
        from rattler.package import IndexJson

        index = IndexJson.from_package_archive(path)
        return {"license": index.license, "requires": [str(d) for d in index.depends]}
    except Exception:  # rattler missing, or not readable: the hash still identifies it
        return {"license": None, "requires": []}


def _artifact(out: Path, rel: str, digest: str) -> Optional[Artifact]:
    path = out / rel
    fname = Path(rel).name
    m = _WHEEL.match(fname)
    if m:
        name = _dist_name(m["dist"])
        meta = _wheel_metadata(path)
        return Artifact("wheel", rel, name, m["ver"], f"pkg:pypi/{name}@{m['ver']}?file_name={fname}", digest,
                        meta["license"], meta["requires"])
    m = _SDIST.match(fname)
    if m:
        name = _dist_name(m["dist"])
        return Artifact("sdist", rel, name, m["ver"], f"pkg:pypi/{name}@{m['ver']}?file_name={fname}", digest,
                        _sdist_license(path))
    m = _CONDA.match(fname)
    if m:
        subdir = Path(rel).parent.name or "noarch"
        meta = _conda_metadata(path)
        return Artifact("conda", rel, m["name"], m["ver"],
                        f"pkg:conda/{m['name']}@{m['ver']}?build={m['build']}&subdir={subdir}&type=conda",
                        digest, meta["license"], meta["requires"])
    return None


def _listed_artifacts(out: Path) -> List[Artifact]:
    """The artifacts ``out/SHA256SUMS`` lists that are still there, by path."""
    sums = sha256sums_path(out)
    entries: Dict[str, str] = {}
    if sums.is_file():
        for line in sums.read_text(encoding="utf-8").splitlines():
            digest, _, rel = line.partition("  ")
            if rel and (out / rel).is_file():
                entries[rel] = digest
    found = (_artifact(out, rel, d) for rel, d in sorted(entries.items()))
    return [a for a in found if a is not None]


def _timestamp(source_root: Optional[os.PathLike]) -> datetime.datetime:
    epoch = source_date_epoch(source_root) if source_root is not None else os.environ.get("SOURCE_DATE_EPOCH")
    return datetime.datetime.fromtimestamp(int(epoch) if epoch else int(time.time()), tz=datetime.timezone.utc)


def build_sbom(out_dir: os.PathLike, version: str, *, source_root: Optional[os.PathLike] = None,
               rocm_profile: Optional[str] = None):
    """The SBOM (a ``cyclonedx.model.bom.Bom``) of the artifacts
    ``out_dir/SHA256SUMS`` lists."""
    from cyclonedx.model import HashAlgorithm, HashType, Property
    from cyclonedx.model.bom import Bom
    from cyclonedx.model.component import Component, ComponentScope, ComponentType
    from cyclonedx.model.license import LicenseExpression
    from packageurl import PackageURL

    from ...core import torch_compat
    from ..._version import TRITON_VERSION

    def licenses(expr: Optional[str]):
        return [LicenseExpression(expr)] if expr else []

    out = Path(out_dir).resolve()
    arts = _listed_artifacts(out)
    line = abi_line(version)
    comps = {a.ref: Component(
        type=ComponentType.LIBRARY, bom_ref=a.ref, name=a.name, version=a.version,
        purl=PackageURL.from_string(a.purl), hashes=[HashType(alg=HashAlgorithm.SHA_256, content=a.sha256)],
        licenses=licenses(a.license),
        properties=[Property(name="aotriton-rocm:file", value=a.rel),
                    Property(name="aotriton-rocm:artifact", value=a.kind)]
        + [Property(name="aotriton-rocm:requires", value=r) for r in a.requires]) for a in arts}
    torch = Component(
        type=ComponentType.FRAMEWORK, bom_ref="requirement:torch", name="torch", scope=ComponentScope.REQUIRED,
        licenses=licenses(TORCH_LICENSE),
        description="PyTorch with ROCm (or CUDA for the sm_90 test target); installed by the user from the "
                    "ROCm wheel index, not declared as a wheel requirement",
        properties=[Property(name="aotriton-rocm:supported-torch", value=v)
                    for v in torch_compat.supported_torch(line)])
    release_props = [Property(name="aotriton-rocm:abi-line", value=line)]
    if rocm_profile:
        release_props.append(Property(name="aotriton-rocm:rocm-profile", value=str(rocm_profile)))
    release = Component(type=ComponentType.LIBRARY, bom_ref=f"release:{version}", name=RUNTIME, version=version,
                        purl=PackageURL.from_string(f"pkg:pypi/{RUNTIME}@{version}"), properties=release_props)

    serial = uuid.uuid5(_NS, version + "\n" + "\n".join(f"{a.sha256} {a.ref}" for a in arts))
    bom = Bom(serial_number=serial, version=1)
    bom.metadata.timestamp = _timestamp(source_root)
    bom.metadata.component = release
    bom.metadata.tools.components.add(Component(
        type=ComponentType.APPLICATION, name="triton", version=TRITON_VERSION,
        purl=PackageURL.from_string(f"pkg:pypi/triton@{TRITON_VERSION}"), licenses=licenses(TRITON_LICENSE),
        description="the pinned compiler every shipped code object is built with"))
    for c in [*comps.values(), torch]:
        bom.components.add(c)
    bom.register_dependency(release, list(comps.values()))
    for a in arts:
        if a.kind not in ("wheel", "conda"):
            continue
        if a.name == RUNTIME:
            bom.register_dependency(comps[a.ref], [torch])
        elif a.name == AUTO_PACKAGE:
            # the image of its arch (named in its requires)
            wanted = {str(r).split()[0] for r in a.requires}
            bom.register_dependency(comps[a.ref], [comps[r.ref] for r in arts
                                                   if r.kind == "conda" and r.name in wanted])
        elif a.name.startswith(RUNTIME + "-"):
            # an image needs the runtime of its own kind (wheel or conda package)
            bom.register_dependency(comps[a.ref], [comps[r.ref] for r in arts
                                                   if r.name == RUNTIME and r.kind == a.kind])
    bom.register_dependency(torch, [])
    return bom


def sbom_json(bom) -> str:
    """The CycloneDX 1.5 JSON text of ``bom``."""
    from cyclonedx.output.json import JsonV1Dot5

    return JsonV1Dot5(bom).output_as_string(indent=1) + "\n"


def write_sbom(out_dir: os.PathLike, version: str, **kwargs) -> Path:
    """Write ``build_sbom(...)`` to ``out_dir/aotriton-rocm-<version>.cdx.json``
    (atomically)."""
    text = sbom_json(build_sbom(out_dir, version, **kwargs))
    path = sbom_path(out_dir, version)
    atomic_write_text(path, text)
    return path
