"""What one release holds, for ``abi-check``: read from wheels, conda packages,
archives or an install (site-packages or a prefix) into a :class:`Release`:
per arch the kernels' functional keys and argument lists, the runtime's
``abi.json``, the C library (``abi_native``) and libaotriton_v2, AOTriton's
API, one library per line (``abi_aotriton_api``)."""
from __future__ import annotations

import ast
import json
import shutil
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..._version import abi_line, public_version
from ...common.kernel_abi import functional_key, kernel_abi_entries
from ...common.archive import ARCHIVE_SUFFIX, MANIFEST_SUFFIX, Archive, ArchiveError
from . import abi_aotriton_api as AA
from . import abi_native as NA
from .public_api import ABI_JSON


class AbiCheckError(RuntimeError):
    """A release could not be read."""



@dataclass
class ArchAbi:
    arch: str
    format_version: int
    version: Optional[str]
    # kernel -> functional key -> ordered [[name, type], ...]
    kernels: Dict[str, Dict[str, List[List[str]]]]
    # kernel -> functional key -> sorted code-object sha256s (to spot rebuilt code)
    code: Dict[str, Dict[str, List[str]]]


@dataclass
class Release:
    source: str
    version: Optional[str] = None
    api: Optional[Dict[str, Any]] = None          # abi.json of the runtime
    archs: Dict[str, ArchAbi] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)
    native: Optional[NA.NativeLib] = None            # libaotriton_rocm
    aotriton_api: Dict[str, AA.ApiLib] = field(default_factory=dict)  # line -> libaotriton_v2
    use_abigail: bool = True

    @property
    def abi_line(self) -> Optional[str]:
        return abi_line(self.version) if self.version else None



def version_key(v: str) -> Tuple[int, ...]:
    return tuple(int(x) for x in public_version(v).split("."))


def _arch_from_archive(path: Path, rel: Release) -> None:
    try:
        a = Archive.open(path)
    except ArchiveError as e:
        raise AbiCheckError(str(e)) from None
    arch = a.arch
    if arch in rel.archs:
        rel.notes.append(f"{arch}: more than one archive, using {path}")
    code: Dict[str, Dict[str, List[str]]] = {}
    for r in a.kernels:
        code.setdefault(r.kernel, {}).setdefault(functional_key(r.functional), []).append(r.sha256)
    for v in code.values():
        for k in v:
            v[k].sort()
    try:
        entries = kernel_abi_entries(a.kernels)
    except ValueError as e:
        raise AbiCheckError(f"{path}: {e}") from None
    rel.archs[arch] = ArchAbi(arch=arch, format_version=int(a.manifest["format_version"]),
                              version=str(a.manifest.get("package_version") or "") or None,
                              kernels=entries, code=code)


def _read_version_py(path: Path) -> Optional[str]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return None
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and getattr(node.targets[0], "id", None) == "__version__"
                and isinstance(node.value, ast.Constant)):
            return str(node.value.value)
    return None


def _scan_native(libdir: Path, incdir: Path, rel: Release) -> None:
    """libaotriton_rocm.so.* in ``libdir`` (the file itself, not its links)
    and its header under ``incdir``."""
    libs = sorted(p for p in libdir.glob(NA.LIB_PREFIX + ".*") if p.is_file() and not p.is_symlink())
    if not libs:
        return
    if len(libs) > 1:
        rel.notes.append(f"{libdir}: several libaotriton_rocm files, using {libs[-1].name}")
    header = incdir / "aotriton_rocm" / NA.HEADER
    if not header.is_file():
        rel.notes.append(f"{libdir / libs[-1].name}: no public header {header}: the header check "
                         "(prototypes, layouts) cannot run for this release")
    if rel.native is not None:
        rel.notes.append(f"{rel.source}: more than one libaotriton_rocm, using {libs[-1]}")
    try:
        rel.native = NA.read_native(libs[-1], header if header.is_file() else None, rel.use_abigail)
    except NA.NativeAbiError as e:
        raise AbiCheckError(str(e)) from None


def _scan_aotriton_api(libroot: Path, incroot: Path, rel: Release) -> None:
    """libaotriton_v2 of each line under ``libroot/aotriton_api/``."""
    try:
        found = AA.scan_api_libs(libroot, incroot)
    except NA.NativeAbiError as e:
        raise AbiCheckError(str(e)) from None
    for line, lib in found.items():
        if line in rel.aotriton_api:
            rel.notes.append(f"{rel.source}: more than one {lib.label}, using {libroot}")
        rel.aotriton_api[line] = lib


def _scan_site_packages(sp: Path, rel: Release) -> None:
    pkg = sp / "aotriton_rocm"
    _scan_native(pkg / "lib", pkg / "include", rel)
    _scan_aotriton_api(pkg / "lib", pkg / "include", rel)
    if pkg.is_dir():
        abi_json = pkg / ABI_JSON
        if abi_json.is_file():
            rel.api = json.loads(abi_json.read_text(encoding="utf-8"))
        else:
            rel.notes.append(f"{pkg}: no {ABI_JSON} (not installed from a packaged wheel): "
                             "public API not compared")
        rel.version = rel.version or _read_version_py(pkg / "_version.py")
    for d in sorted(sp.glob("aotriton_rocm_*")):
        for ap in sorted(d.glob("*" + ARCHIVE_SUFFIX)):
            _arch_from_archive(ap, rel)


CONDA_SUFFIX = ".conda"


def _conda_files(d: Path) -> List[Path]:
    """``.conda`` files in ``d``, its subdirs (a channel) or ``d/conda/<subdir>``."""
    seen: Dict[Path, None] = {}
    for pattern in ("*" + CONDA_SUFFIX, "*/*" + CONDA_SUFFIX, "conda/*/*" + CONDA_SUFFIX):
        for p in sorted(d.glob(pattern)):
            seen.setdefault(p.resolve(), None)
    return list(seen)


def _scan_conda(c: Path, rel: Release, tmp: Path) -> Optional[str]:
    """Read one conda package (runtime or kernel image) into ``rel``; returns
    the package version its ``info/index.json`` names."""
    try:
        from rattler.package_streaming import extract
    except ImportError as e:
        raise AbiCheckError(f"{c}: reading conda packages needs py-rattler ({e}): "
                            "pip install 'aotriton-rocm[build]'") from None
    dest = tmp / c.name
    try:
        extract(c, dest)
        index = json.loads((dest / "info" / "index.json").read_text(encoding="utf-8"))
    except Exception as e:  # rattler's exceptions, a missing or bad index.json
        raise AbiCheckError(f"{c}: cannot read the conda package: {e}") from None
    name, version = str(index.get("name", "")), str(index.get("version", "")) or None
    if not name.startswith("aotriton-rocm"):
        rel.notes.append(f"{c.name}: not an aotriton-rocm package ({name}), ignored")
        return None
    for sp in sorted(dest.glob("lib/python3*/site-packages")):
        _scan_site_packages(sp, rel)
    share = dest / "share" / "aotriton-rocm"
    for ap in sorted(share.glob("*" + ARCHIVE_SUFFIX)) if share.is_dir() else []:
        _arch_from_archive(ap, rel)
    _scan_native(dest / "lib", dest / "include", rel)
    _scan_aotriton_api(dest / "lib", dest / "include", rel)
    if name == "aotriton-rocm" and version:
        rel.version = version
    return version


def _scan_condas(files: List[Path], rel: Release, tmp: Path, where: Path) -> None:
    versions = {v for v in (_scan_conda(c, rel, tmp) for c in files) if v}
    if len(versions) > 1:
        raise AbiCheckError(f"{where}: conda packages of several releases "
                            f"({', '.join(sorted(versions, key=version_key))}): give one .conda "
                            "file, or a directory that holds one release")


def _scan_dir(d: Path, rel: Release, tmp: Path) -> None:
    wheels = sorted(d.glob("*.whl"))
    if wheels:
        for w in wheels:
            _scan_wheel(w, rel, tmp)
        return
    condas = _conda_files(d)
    if condas:
        _scan_condas(condas, rel, tmp, d)
        return
    archives = sorted(d.glob("*" + ARCHIVE_SUFFIX))
    if archives:
        for ap in archives:
            _arch_from_archive(ap, rel)
        return
    site = [d] if (d / "aotriton_rocm").is_dir() or any(d.glob("aotriton_rocm_*")) else []
    site += sorted(d.glob("lib/python3*/site-packages"))
    for sp in site:
        _scan_site_packages(sp, rel)
    share = d / "share" / "aotriton-rocm"
    for ap in sorted(share.glob("*" + ARCHIVE_SUFFIX)) if share.is_dir() else []:
        _arch_from_archive(ap, rel)
    # an install prefix of the C library (cmake --install: lib/, include/), or a build directory
    _scan_native(d / "lib", d / "include", rel)
    _scan_aotriton_api(d / "lib", d / "include", rel)
    if rel.native is None:
        _scan_native(d, d / "include", rel)
    if not site and not share.is_dir() and rel.native is None and not rel.aotriton_api:
        raise AbiCheckError(f"{d}: no wheels, conda packages, archives, site-packages or prefix of "
                            "aotriton-rocm (or a libaotriton_rocm build) here")


def _scan_wheel(w: Path, rel: Release, tmp: Path) -> None:
    dest = tmp / w.name
    try:
        with zipfile.ZipFile(w) as z:
            names = z.namelist()
            for n in names:
                top = n.split("/", 1)[0]
                if n.startswith("/") or ".." in n.split("/"):
                    raise AbiCheckError(f"{w}: unsafe member {n!r}")
                if top == "aotriton_rocm" and n in ("aotriton_rocm/" + ABI_JSON, "aotriton_rocm/_version.py",
                                                    f"aotriton_rocm/include/aotriton_rocm/{NA.HEADER}"):
                    z.extract(n, dest)
                elif n.startswith("aotriton_rocm/lib/" + NA.LIB_PREFIX):
                    z.extract(n, dest)
                elif n.startswith((f"aotriton_rocm/lib/{AA.API_DIR}/", f"aotriton_rocm/include/{AA.API_DIR}/")):
                    z.extract(n, dest)
                elif top.startswith("aotriton_rocm_") and n.endswith(ARCHIVE_SUFFIX):
                    z.extract(n, dest)
                elif top.endswith(".dist-info") and n.endswith("/METADATA"):
                    z.extract(n, dest)
    except (OSError, zipfile.BadZipFile) as e:
        raise AbiCheckError(f"{w}: cannot read wheel: {e}") from None
    meta = next(dest.glob("*.dist-info/METADATA"), None)
    if meta is not None:
        fields = dict(line.split(": ", 1) for line in meta.read_text(encoding="utf-8").splitlines()[:10]
                      if ": " in line)
        if fields.get("Name", "").lower().replace("_", "-") == "aotriton-rocm":
            rel.version = fields.get("Version")
    _scan_site_packages(dest, rel)


def load_release(path: "str | Path", require_libabigail: bool = False) -> Release:
    """Read the ABI of the release at ``path`` (see the module docstring).
    Without libabigail the C library is read by the header check only, and
    a note says so; ``require_libabigail`` makes that an error."""
    p = Path(path)
    have = NA.have_libabigail()
    if require_libabigail and not have:
        raise AbiCheckError(f"abidiff/abidw not found: {NA.INSTALL_ABIGAIL}")
    rel = Release(source=str(p), use_abigail=have)
    tmp = Path(tempfile.mkdtemp(prefix="aotriton-abi-check-"))
    try:
        if p.is_file() and p.suffix == ".whl":
            _scan_wheel(p, rel, tmp)
        elif p.is_file() and p.name.endswith(CONDA_SUFFIX):
            _scan_condas([p], rel, tmp, p)
        elif p.is_file() and p.name.endswith(ARCHIVE_SUFFIX):
            _arch_from_archive(p, rel)
        elif p.is_file() and p.name.endswith(MANIFEST_SUFFIX):
            ap = p.with_name(p.name[: -len(MANIFEST_SUFFIX)] + ARCHIVE_SUFFIX)
            _arch_from_archive(ap, rel)
        elif p.is_dir():
            _scan_dir(p, rel, tmp)
        else:
            raise AbiCheckError(f"{p}: not a wheel, .conda, archive, directory or prefix")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if rel.version is None:
        versions = sorted({a.version for a in rel.archs.values() if a.version}, key=version_key)
        if len(versions) > 1:
            raise AbiCheckError(f"{p}: archives of different versions: {versions}")
        rel.version = versions[0] if versions else None
    if rel.api is not None and rel.version is None:
        rel.version = rel.api.get("package_version")
    if rel.native is not None and rel.version is None:
        rel.version = rel.native.version  # AOTR_VERSION_* of the header
    if rel.version is None:  # AOTRITON_ROCM_VERSION of a libaotriton_v2's config.h
        rel.version = next((a.rocm_version for a in rel.aotriton_api.values() if a.rocm_version), None)
    if rel.native is not None and not have:
        rel.notes.append(f"WARNING: libabigail is not installed: {rel.native.library} was compared by the "
                         f"header check only; {NA.INSTALL_ABIGAIL}")
    if not rel.archs and rel.api is None and rel.native is None and not rel.aotriton_api:
        raise AbiCheckError(f"{p}: found no aotriton-rocm runtime or kernel archive")
    return rel
