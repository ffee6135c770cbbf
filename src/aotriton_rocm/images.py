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
import os
import sys
import threading
from pathlib import Path
from typing import Dict, List, Optional

__all__ = [
    "ENV_VAR",
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


def conda_archive_dir() -> Path:
    return Path(sys.prefix) / "share" / "aotriton-rocm"


def _scan_dir(d: Path, found: Dict[str, Path], origin: str, notes: List[str]) -> None:
    try:
        entries = sorted(d.iterdir())
    except OSError as e:
        notes.append(f"{origin}: cannot list {d}: {e.strerror or e}")
        return
    for p in entries:
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

    env = os.environ.get(ENV_VAR, "")
    for part in env.split(os.pathsep):
        if part.strip():
            _scan_dir(Path(part.strip()).expanduser(), found, ENV_VAR, notes)

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
        except (ImportError, ValueError) as e:
            notes.append(f"{origin}: module not importable ({e})")
            continue
        if pkg_dir is None:
            notes.append(f"{origin}: module not installed")
            continue
        p = pkg_dir / (arch + ARCHIVE_SUFFIX)
        if p.is_file():
            found[arch] = p
            notes.append(f"{origin}: {arch} -> {p}")
        else:
            notes.append(f"{origin}: {p} is missing (reinstall the image wheel)")

    cdir = conda_archive_dir()
    if cdir.is_dir():
        _scan_dir(cdir, found, "conda", notes)

    global _notes
    _notes = notes
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
    global _cache, _notes
    with _lock:
        _cache = None
        _notes = []


def search_notes() -> List[str]:
    """What the last search looked at and why something was skipped (for `info`)."""
    with _lock:
        return list(_notes)
