"""Is a kernel archive what it claims to be: :func:`verify_against_manifest`
(the archive against its sidecar ``<arch>.manifest.json``, every code object
checked) and :func:`identity_problems` (its name, sidecar, the device's arch
and the runtime's ABI line). Standard library only.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from .archive import (ARCHIVE_SUFFIX, FORMAT_VERSION, IDENTITY_CONTEXTS, Archive, ArchiveError, PathLike,
                      identity_fix, manifest_path_for, regular_file_problem)
from .archive_index import _json_type, clip, strict_json_loads
from .files import file_sha256

__all__ = ["verify_against_manifest", "identity_problems", "with_fix", "subset_of"]


def verify_against_manifest(archive_path: PathLike, manifest_path: Optional[PathLike] = None) -> List[str]:
    """Compare an archive with its sidecar manifest and verify its contents.

    Returns a list of problems; an empty list means the archive is exactly the
    one the sidecar describes and every code object checks out.
    """
    ap = Path(archive_path)
    mp = Path(manifest_path) if manifest_path is not None else manifest_path_for(ap)
    problems: List[str] = []
    for f in (ap, mp):
        not_regular = regular_file_problem(f)
        if not_regular is not None:
            return [not_regular]
    try:
        doc = _read_sidecar(mp)
        side_manifest, side_archive, side_kernels = doc["manifest"], doc["archive"], doc["kernels"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return [f"{mp}: cannot read manifest sidecar: {clip(repr(e))}"]
    try:
        size = ap.stat().st_size
        digest = file_sha256(ap)
    except OSError as e:
        return [f"{ap}: cannot read archive: {e}"]
    if size != side_archive.get("size"):
        problems.append(f"{ap}: size {size} differs from the manifest's "
                        f"{clip(side_archive.get('size'), 40)}")
    if digest != side_archive.get("sha256"):
        problems.append(f"{ap}: sha256 differs from the manifest sidecar {mp.name}")
    try:
        a = Archive.open(ap)
    except ArchiveError as e:
        problems.append(str(e))
        return problems
    if a.manifest != side_manifest:
        diff = sorted(k for k in set(a.manifest) | set(side_manifest)
                      if a.manifest.get(k) != side_manifest.get(k))
        problems.append(f"{ap}: embedded manifest differs from {mp.name} in "
                        f"{clip(', '.join(map(str, diff)))}")
    ours = {r.key: r.to_dict(with_location=False) for r in a.kernels}
    try:
        theirs = {str(d.get("key")): d for d in side_kernels}
    except (AttributeError, TypeError):
        return problems + [f"{mp}: \"kernels\" is not a list of kernel records"]
    for what, keys in (("listed in the sidecar but missing from the archive",
                        sorted(set(theirs) - set(ours))),
                       ("in the archive but not listed in the sidecar", sorted(set(ours) - set(theirs))),
                       ("recorded differently in the sidecar",
                        sorted(k for k in set(ours) & set(theirs) if ours[k] != theirs[k]))):
        if keys:
            shown = ", ".join(clip(repr(k), 120) for k in keys[:3])
            more = f" and {len(keys) - 3} more" if len(keys) > 3 else ""
            problems.append(f"{ap} vs {mp.name}: {len(keys)} kernel(s) {what}: {shown}{more}")
    problems.extend(a.verify())
    return problems


# -- identity ----------------------------------------------------------------
# The one rule for "is this archive what its name, its sidecar, the device and
# the runtime say it is". Every boundary calls identity_problems(): the
# runtime loader (backends.AOTBackend), `smoke`, `info`, `validate`,
# `package` (and through them install-check and release).

def _arch_from_name(name: str, suffix: str) -> Optional[str]:
    return name[: -len(suffix)] if name.endswith(suffix) and len(name) > len(suffix) else None


def identity_problems(archive: "Archive", path: Optional[PathLike] = None, *,
                      expected_arch: Optional[str] = None, expected_abi: Optional[str] = None,
                      context: str = "installed", sidecar: bool = True) -> List[str]:
    """Why ``archive`` is not what it claims to be (empty list: it is).

    Checks the manifest's arch, format version, ABI line (``abi_version`` and
    ``abi.abi_line``) and build-inputs hash
    against each other and against: the file name ``<arch>.aotr`` of
    ``path`` (default: where the archive was opened), the sidecar
    ``<arch>.manifest.json`` beside it if there is one (its manifest and the
    archive file it names; ``sidecar=False`` skips it), ``expected_arch`` (the
    device's arch) and ``expected_abi`` (the runtime's ABI line). Each
    problem names both values, the file and the fix (``context``: see
    :func:`identity_fix`).
    """
    if context not in IDENTITY_CONTEXTS:
        raise ValueError(f"context must be one of {IDENTITY_CONTEXTS}, not {context!r}")
    p = Path(path) if path is not None else Path(archive.path)
    m = archive.manifest
    arch = str(m.get("arch"))
    name_arch = _arch_from_name(p.name, ARCHIVE_SUFFIX)
    fix = identity_fix(name_arch or expected_arch or arch, context, p, expected_abi)
    problems: List[str] = []
    if name_arch is None:
        problems.append(f"{p}: the file name is not <arch>{ARCHIVE_SUFFIX} (the manifest says "
                        f"arch {arch}, so it must be named {arch}{ARCHIVE_SUFFIX}): rename it")
    elif name_arch != arch:
        problems.append(f"{p}: the file name says arch {name_arch} but the archive inside is for "
                        f"{arch} (a {arch} archive copied or renamed to {p.name}?); {fix}")
    if expected_arch is not None and arch != expected_arch:
        problems.append(f"{p}: the archive is for {arch}, the device is {expected_arch}: its code "
                        f"objects cannot run there; {fix}")
    fmt = m.get("format_version")
    if fmt != FORMAT_VERSION:
        problems.append(f"{p}: the manifest says format version {fmt!r}, this aotriton-rocm reads "
                        f"format {FORMAT_VERSION}; {fix}")
    abi = m.get("abi_version")
    section = m.get("abi")
    if not isinstance(section, dict):
        problems.append(f"{p}: the manifest has no \"abi\" record (ABI line {abi!r} unconfirmed; "
                        f"written by an older aotriton-rocm?); {fix}")
        section = {}
    else:
        if section.get("abi_line") != abi:
            problems.append(f"{p}: the manifest's abi_version is {abi!r} but its abi.abi_line is "
                            f"{section.get('abi_line')!r}; {fix}")
        if section.get("format_version") != fmt:
            problems.append(f"{p}: the manifest's format_version is {fmt!r} but its "
                            f"abi.format_version is {section.get('format_version')!r}; {fix}")
    if expected_abi is not None and abi != expected_abi:
        if context == "installed":
            an = (name_arch or arch).replace("_", "")
            abi_fix = (f"install the image of the runtime's line: pip install --force-reinstall "
                       f"--no-deps 'aotriton-rocm-{an}~={expected_abi}.0', or the runtime of the "
                       f"image's line: pip install 'aotriton-rocm~={abi}.0'")
        else:
            abi_fix = fix + " with the aotriton-rocm being packaged"
        problems.append(f"{p}: a kernel image of ABI line {abi}, the runtime is ABI line "
                        f"{expected_abi}; point releases of one line only are compatible: "
                        f"{abi_fix}")
    bih = m.get("build_inputs_hash")
    if not isinstance(bih, str) or not bih:
        problems.append(f"{p}: the manifest has no build_inputs_hash (got {bih!r}); {fix}")
    if sidecar:
        mp = manifest_path_for(p)
        if os.path.lexists(mp):
            problems.extend(_sidecar_identity(p, mp, m, name_arch, fix))
    return problems


# Words every fix names (identity_fix, _fix_hint, the C reader's hint, "rename it").
_FIX_MARKERS = ("pip install", "aotriton-rocm build", "rename it")


def with_fix(problems: List[str], fix: str) -> List[str]:
    """``problems`` ending with ``fix`` (a line of its own) unless the last
    one already names a fix: a report of damage always says what to do."""
    if problems and not any(m in problems[-1] for m in _FIX_MARKERS):
        return problems + [f"fix: {fix}"]
    return problems


def subset_of(manifest: Mapping[str, Any]) -> Optional[str]:
    """The ``build --only`` filter of a subset image (it holds only the
    kernels that filter selects; ``package`` refuses it without
    ``--allow-subset``), or None for a whole build."""
    subset = manifest.get("subset")
    return clip(subset, 200) if subset else None


def _read_sidecar(mp: Path) -> Dict[str, Any]:
    """The sidecar's JSON; TypeError unless "manifest" (and "archive", when
    present) are objects."""
    doc = strict_json_loads(mp.read_bytes())
    if not isinstance(doc, dict):
        raise TypeError(f"the sidecar is {_json_type(doc)}, not an object")
    if not isinstance(doc.get("manifest"), dict) or not isinstance(doc.get("archive", {}), dict):
        raise TypeError("\"manifest\" and \"archive\" must be objects")
    return doc


def _sidecar_identity(p: Path, mp: Path, m: Mapping[str, Any], name_arch: Optional[str],
                      fix: str) -> List[str]:
    not_regular = regular_file_problem(mp)
    if not_regular is not None:
        return [not_regular]
    try:
        doc = _read_sidecar(mp)
        sm, sa = doc["manifest"], doc.get("archive") or {}
    except (OSError, ValueError, KeyError, TypeError) as e:
        return [f"{mp}: cannot read the manifest sidecar of {p.name}: {e!r}; {fix}"]
    problems: List[str] = []
    if name_arch is not None and sm.get("arch") != name_arch:
        problems.append(f"{mp}: the file name says arch {name_arch} but the sidecar describes "
                        f"{sm.get('arch')!r}; {fix}")
    if sa.get("file") != p.name:
        problems.append(f"{mp}: the sidecar describes the archive file {sa.get('file')!r}, not "
                        f"{p.name}; {fix}")
    for key in ("arch", "format_version", "abi_version", "build_inputs_hash"):
        if sm.get(key) != m.get(key):
            problems.append(f"{mp}: {key} {sm.get(key)!r} differs from {m.get(key)!r} in the "
                            f"archive {p.name}; {fix}")
    side_line = (sm.get("abi") or {}).get("abi_line") if isinstance(sm.get("abi"), dict) else None
    arch_line = (m.get("abi") or {}).get("abi_line") if isinstance(m.get("abi"), dict) else None
    if side_line != arch_line:
        problems.append(f"{mp}: abi.abi_line {side_line!r} differs from {arch_line!r} in the "
                        f"archive {p.name}; {fix}")
    return problems
