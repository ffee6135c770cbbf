"""CycloneDX SBOM (JSON, spec 1.5) of a release: written next to the artifacts
by ``aotriton-rocm package`` as ``aotriton-rocm-<version>.cdx.json``.

What it lists:

* every artifact in the output directory's ``SHA256SUMS`` (wheels, sdist,
  ``.conda`` packages) as a component with its SHA-256, a package URL
  (``pkg:pypi/...``, ``pkg:conda/...``) and its declared requirements;
* the runtime's run-time requirements that no metadata declares: torch
  (deliberately not a wheel requirement: ROCm users install it from the ROCm
  index), the supported minor versions taken from ``torch_compat.json``;
  conda's ``__glibc`` floor comes from the package itself;
* the pinned compiler (``triton==<TRITON_VERSION>``) as the build tool in
  ``metadata.tools``.

Written with :mod:`json` only (no network, no cyclonedx library). The output is
reproducible: the timestamp is ``SOURCE_DATE_EPOCH`` (as for the wheels) and
the serial number a UUID derived from the artifacts' hashes.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
import zipfile
from email.parser import Parser
from pathlib import Path
from typing import Dict, List, Optional

from .._version import abi_line as abi_version_of
from ..files import atomic_move as publish
from .dist_dir import sha256sums_path
from .reproducible import source_date_epoch

__all__ = ["SPEC_VERSION", "sbom_path", "build_sbom", "write_sbom"]

SPEC_VERSION = "1.5"
RUNTIME = "aotriton-rocm"
_NS = uuid.UUID("0b5e3f3e-6a43-4c1e-9d35-2f1b0c6a7e11")  # this project's UUID namespace
_WHEEL = re.compile(r"^(?P<dist>[^-]+)-(?P<ver>[^-]+)(-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl$")
_SDIST = re.compile(r"^(?P<dist>.+)-(?P<ver>[^-]+)\.tar\.gz$")
_CONDA = re.compile(r"^(?P<name>.+)-(?P<ver>[^-]+)-(?P<build>[^-]+)\.(conda|tar\.bz2)$")


def sbom_path(out_dir: os.PathLike, version: str) -> Path:
    return Path(out_dir) / f"{RUNTIME}-{version}.cdx.json"


def _dist_name(dist: str) -> str:
    return dist.replace("_", "-").lower()


def _wheel_requires(path: Path) -> List[str]:
    with zipfile.ZipFile(path) as z:
        name = next((n for n in z.namelist() if n.endswith(".dist-info/METADATA")), None)
        if name is None:
            return []
        meta = Parser().parsestr(z.read(name).decode("utf-8"))
    return list(meta.get_all("Requires-Dist") or [])


def _conda_depends(path: Path) -> List[str]:
    try:
        from rattler.package import IndexJson

        return [str(d) for d in IndexJson.from_package_archive(path).depends]
    except Exception:  # rattler missing, or not readable: the hash still identifies it
        return []


def _component(out: Path, rel: str, digest: str) -> Optional[Dict[str, object]]:
    path = out / rel
    fname = Path(rel).name
    props: List[Dict[str, str]] = [{"name": "aotriton-rocm:file", "value": rel}]
    m = _WHEEL.match(fname)
    if m:
        name, ver, kind = _dist_name(m["dist"]), m["ver"], "wheel"
        purl = f"pkg:pypi/{name}@{ver}?file_name={fname}"
        reqs = _wheel_requires(path)
    elif _SDIST.match(fname):
        m = _SDIST.match(fname)
        name, ver, kind = _dist_name(m["dist"]), m["ver"], "sdist"
        purl = f"pkg:pypi/{name}@{ver}?file_name={fname}"
        reqs = []
    elif _CONDA.match(fname):
        m = _CONDA.match(fname)
        name, ver, kind = m["name"], m["ver"], "conda"
        subdir = Path(rel).parent.name or "noarch"
        purl = f"pkg:conda/{name}@{ver}?build={m['build']}&subdir={subdir}&type=conda"
        reqs = _conda_depends(path)
    else:
        return None
    props.append({"name": "aotriton-rocm:artifact", "value": kind})
    props += [{"name": "aotriton-rocm:requires", "value": r} for r in reqs]
    return {"type": "library", "bom-ref": f"{kind}:{rel}", "name": name, "version": ver,
            "purl": purl, "hashes": [{"alg": "SHA-256", "content": digest}],
            "properties": props}


def build_sbom(out_dir: os.PathLike, version: str, *, source_root: Optional[os.PathLike] = None,
               rocm_profile: Optional[str] = None) -> Dict[str, object]:
    """The SBOM (a dict) of the artifacts ``out_dir/SHA256SUMS`` lists."""
    from .. import torch_compat
    from .._version import TRITON_VERSION

    out = Path(out_dir).resolve()
    sums = sha256sums_path(out)
    entries: Dict[str, str] = {}
    if sums.is_file():
        for line in sums.read_text(encoding="utf-8").splitlines():
            digest, _, rel = line.partition("  ")
            if rel and (out / rel).is_file():
                entries[rel] = digest
    comps = [c for c in (_component(out, rel, d) for rel, d in sorted(entries.items())) if c]

    torches = torch_compat.supported_torch(abi_version_of(version.split("+", 1)[0]))
    torch_ref = "requirement:torch"
    torch_comp = {
        "type": "framework", "bom-ref": torch_ref, "name": "torch",
        "scope": "required",
        "description": "PyTorch with ROCm (or CUDA for the sm_90 test target); installed by the "
                       "user from the ROCm wheel index, not declared as a wheel requirement",
        "properties": [{"name": "aotriton-rocm:supported-torch", "value": v} for v in torches],
    }
    deps = []
    by_name: Dict[str, List[str]] = {}
    for c in comps:
        by_name.setdefault(c["name"], []).append(c["bom-ref"])
    for c in comps:
        kind = c["bom-ref"].split(":", 1)[0]
        if c["name"] == RUNTIME and kind in ("wheel", "conda"):
            deps.append({"ref": c["bom-ref"], "dependsOn": [torch_ref]})
        elif c["name"].startswith(RUNTIME + "-") and kind in ("wheel", "conda"):
            # an image needs the runtime of its own kind (wheel or conda package)
            same = [r for r in by_name.get(RUNTIME, []) if r.startswith(kind + ":")]
            deps.append({"ref": c["bom-ref"], "dependsOn": same})

    epoch = source_date_epoch(source_root) if source_root is not None else os.environ.get(
        "SOURCE_DATE_EPOCH")
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(epoch) if epoch else time.time()))
    serial = uuid.uuid5(_NS, version + "\n" + "\n".join(
        f"{c['hashes'][0]['content']} {c['bom-ref']}" for c in comps))
    release_props = [{"name": "aotriton-rocm:abi-line", "value": abi_version_of(version.split("+", 1)[0])}]
    if rocm_profile:
        release_props.append({"name": "aotriton-rocm:rocm-profile", "value": str(rocm_profile)})
    return {
        "bomFormat": "CycloneDX",
        "specVersion": SPEC_VERSION,
        "serialNumber": f"urn:uuid:{serial}",
        "version": 1,
        "metadata": {
            "timestamp": stamp,
            "tools": {"components": [{
                "type": "application", "name": "triton", "version": TRITON_VERSION,
                "purl": f"pkg:pypi/triton@{TRITON_VERSION}",
                "description": "the pinned compiler every shipped code object is built with",
            }]},
            "component": {"type": "library", "bom-ref": f"release:{version}", "name": RUNTIME,
                          "version": version, "purl": f"pkg:pypi/{RUNTIME}@{version}",
                          "properties": release_props},
        },
        "components": comps + [torch_comp],
        "dependencies": [{"ref": f"release:{version}", "dependsOn": [c["bom-ref"] for c in comps]}]
        + deps + [{"ref": torch_ref, "dependsOn": []}],
    }


def write_sbom(out_dir: os.PathLike, version: str, **kwargs) -> Path:
    """Write ``build_sbom(...)`` to ``out_dir/aotriton-rocm-<version>.cdx.json``
    (atomically)."""
    doc = build_sbom(out_dir, version, **kwargs)
    path = sbom_path(out_dir, version)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return publish(tmp, path)
