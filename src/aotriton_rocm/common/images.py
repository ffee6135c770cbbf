"""Locate installed kernel archives (``<arch>.aotr``).

Runtime module: standard library only. Nothing here imports an image package;
package directories are found with ``importlib.util.find_spec``.

Search order (the first archive found for an arch wins):

1. ``AOTRITON_ROCM_ARCHIVE_DIR``: directories (``os.pathsep``-separated) holding
   ``*.aotr`` files; the file stem is the arch.
2. Installed image wheels: entry points in group ``aotriton_rocm.images``; the
   entry name is the arch (``gfx942``, ``sm_90``), the value an importable
   module/package name whose directory contains ``<arch>.aotr``::

       [project.entry-points."aotriton_rocm.images"]
       gfx942 = "aotriton_rocm_gfx942"

3. Conda: ``<sys.prefix>/share/aotriton-rocm/*.aotr``.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import sys
import threading
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional

__all__ = [
    "ENV_VAR",
    "MissingImage",
    "missing_images",
    "packaged_inputs_hash",
    "published_image_extras",
    "publishes_image",
    "ENTRY_POINT_GROUP",
    "find_archive",
    "find_archives",
    "clear_cache",
    "search_notes",
    "conda_archive_dir",
]

ENV_VAR = "AOTRITON_ROCM_ARCHIVE_DIR"
ENTRY_POINT_GROUP = "aotriton_rocm.images"
ARCHIVE_SUFFIX = ".aotr"

_lock = threading.Lock()
_cache: Optional[Dict[str, Path]] = None
_notes: List[str] = []
_missing: List["MissingImage"] = []
PACKAGED_RECORD = "packaged.json"


class MissingImage(NamedTuple):
    """An installed image wheel whose archive is not where it should be."""
    arch: str
    path: Path
    fix: str


def packaged_inputs_hash() -> Optional[str]:
    """The build-inputs hash of the kernel images this runtime was packaged
    with (``packaged.json``, written by ``aotriton-rocm package``); None for
    a runtime not installed from a packaged wheel (a checkout)."""
    try:
        doc = json.loads((Path(__file__).parents[1] / PACKAGED_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    value = doc.get("build_inputs_hash") if isinstance(doc, dict) else None
    return value if isinstance(value, str) and value else None


def published_image_extras() -> Optional[List[str]]:
    """The archs aotriton-rocm publishes kernel image packages for, as the
    extras of this runtime's distribution name them (``gfx942``, ``sm90``:
    ``pip install 'aotriton-rocm[gfx942]'``); None where the runtime has no
    distribution metadata (run from a source tree)."""
    try:
        requires = importlib.metadata.requires("aotriton-rocm")
    except importlib.metadata.PackageNotFoundError:
        return None
    extras = set()
    for req in requires or ():
        name, _, marker = req.partition(";")
        extra = marker.split("extra ==")[-1].strip().strip("\"'") if "extra ==" in marker else ""
        if extra and name.strip().startswith(f"aotriton-rocm-{extra}"):
            extras.add(extra)
    return sorted(extras, key=lambda e: (e.rstrip("0123456789abcdef"), len(e), e))


def publishes_image(arch: str) -> bool:
    """Whether aotriton-rocm publishes a kernel image for ``arch`` (True where
    this runtime has no package metadata to tell)."""
    published = published_image_extras()
    return published is None or arch.replace("_", "") in published


def _reinstall_command(ep, arch: str) -> str:
    dist = getattr(ep, "dist", None)
    name = getattr(dist, "name", None) or f"aotriton-rocm-{arch.replace('_', '')}"
    version = getattr(dist, "version", None)
    spec = f"{name}=={version}" if version else name
    return f"pip install --force-reinstall --no-deps '{spec}'"


def conda_archive_dir() -> Path:
    return Path(sys.prefix) / "share" / "aotriton-rocm"


def _unreadable(path: Path, e: OSError) -> MissingImage:
    return MissingImage("", path, f"cannot read {path} ({e.strerror or e}): make it readable "
                                  f"(chmod -R a+rX {path}) or point {ENV_VAR} elsewhere")


def _scan_dir(d: Path, found: Dict[str, Path], origin: str, notes: List[str],
              missing: List[MissingImage]) -> None:
    try:
        entries = sorted(d.iterdir())
    except FileNotFoundError:
        notes.append(f"{origin}: {d} does not exist")
        return
    except OSError as e:
        notes.append(f"{origin}: cannot list {d}: {e.strerror or e}")
        missing.append(_unreadable(d, e))
        return
    for p in entries:
        if p.name.endswith(ARCHIVE_SUFFIX):
            try:
                p.stat()
            except OSError as e:  # listed, but the directory is not searchable
                notes.append(f"{origin}: cannot read {p}: {e.strerror or e}")
                missing.append(_unreadable(d, e))
                return
        if p.name.endswith(ARCHIVE_SUFFIX) and not p.is_file():
            # a FIFO would block whoever opens it; a directory is no archive
            notes.append(f"{origin}: {p} ignored, not a regular file")
            continue
        if p.name.endswith(ARCHIVE_SUFFIX):
            arch = p.name[: -len(ARCHIVE_SUFFIX)]
            if arch in found:
                notes.append(f"{origin}: {p} ignored, {arch} already found at {found[arch]}")
            else:
                found[arch] = p
                notes.append(f"{origin}: {arch} -> {p}")


def _entry_points():
    eps = importlib.metadata.entry_points()
    if hasattr(eps, "select"):
        return list(eps.select(group=ENTRY_POINT_GROUP))
    return list(eps.get(ENTRY_POINT_GROUP, ()))  # Python < 3.10


def _package_dir(module: str) -> Optional[Path]:
    spec = importlib.util.find_spec(module)
    if spec is None:
        return None
    locs = list(spec.submodule_search_locations or ())
    if locs:
        return Path(locs[0])
    if spec.origin and spec.origin not in ("built-in", "frozen"):
        return Path(spec.origin).parent
    return None


def _search() -> Dict[str, Path]:
    found: Dict[str, Path] = {}
    notes: List[str] = []
    missing: List[MissingImage] = []

    env = os.environ.get(ENV_VAR, "")
    for part in env.split(os.pathsep):
        if part.strip():
            _scan_dir(Path(part.strip()).expanduser(), found, ENV_VAR, notes, missing)

    try:
        eps = _entry_points()
    except Exception as e:  # broken metadata of some unrelated distribution
        notes.append(f"entry points: cannot read ({e!r})")
        eps = []
    seen_names = set()
    for ep in eps:
        arch = ep.name
        if arch in seen_names:
            continue
        seen_names.add(arch)
        module = ep.value.split(":", 1)[0].strip()
        origin = f"entry point {ENTRY_POINT_GROUP}:{arch}={module}"
        if arch in found:
            notes.append(f"{origin}: ignored, {arch} already found at {found[arch]}")
            continue
        try:
            pkg_dir = _package_dir(module)
        except (ImportError, ValueError, OSError) as e:
            notes.append(f"{origin}: module not importable ({e})")
            continue
        if pkg_dir is None:
            notes.append(f"{origin}: module not installed")
            continue
        p = pkg_dir / (arch + ARCHIVE_SUFFIX)
        try:
            present = p.is_file()
        except OSError as e:  # a directory this user cannot read
            present = False
            notes.append(f"{origin}: cannot read {p}: {e.strerror or e}")
        if present:
            found[arch] = p
            notes.append(f"{origin}: {arch} -> {p}")
        else:
            fix = _reinstall_command(ep, arch)
            missing.append(MissingImage(arch, p, fix))
            notes.append(f"{origin}: {p} is missing or unreadable (reinstall it: {fix})")

    cdir = conda_archive_dir()
    if os.path.isdir(cdir):
        _scan_dir(cdir, found, "conda", notes, missing)

    global _notes, _missing
    _notes = notes
    _missing = [m for m in missing if not m.arch or m.arch not in found]
    return found


def find_archives(refresh: bool = False) -> Dict[str, Path]:
    """Map arch -> path of its ``.aotr`` archive; cached after the first call."""
    global _cache
    with _lock:
        if _cache is None or refresh:
            _cache = _search()
        return dict(_cache)


def find_archive(arch: str) -> Optional[Path]:
    """The archive of one arch. Cheap where it sits where libaotriton_rocm
    looks too (``AOTRITON_ROCM_ARCHIVE_DIR``, or the image package
    ``aotriton_rocm_<arch without '_'>`` on the import path): no scan of
    every installed distribution's metadata; elsewhere as
    :func:`find_archives` finds it."""
    with _lock:
        if _cache is not None:
            return _cache.get(arch)
    for part in os.environ.get(ENV_VAR, "").split(os.pathsep):
        if part.strip():
            p = Path(part.strip()).expanduser() / (arch + ARCHIVE_SUFFIX)
            if p.is_file():
                return p
    try:
        pkg_dir = _package_dir("aotriton_rocm_" + arch.replace("_", ""))
    except (ImportError, ValueError):
        pkg_dir = None
    if pkg_dir is not None and (pkg_dir / (arch + ARCHIVE_SUFFIX)).is_file():
        return pkg_dir / (arch + ARCHIVE_SUFFIX)
    return find_archives().get(arch)


def clear_cache() -> None:
    """Forget the cached search (tests, or after installing an image wheel)."""
    global _cache, _notes, _missing
    with _lock:
        _cache = None
        _notes = []
        _missing = []


def missing_images() -> List[MissingImage]:
    """Image wheels installed (their entry point is there) whose archive is
    missing or unreadable, and image directories that cannot be read, each
    with the fix (last search; ``arch`` is "" for a directory)."""
    find_archives()
    with _lock:
        return list(_missing)


def search_notes() -> List[str]:
    """What the last search looked at and why something was skipped (for `info`)."""
    with _lock:
        return list(_notes)
