"""The output directory of ``package``: files published into it atomically,
its ``SHA256SUMS``, and a run's staging directory beside it that is renamed
into place at the end (so ``--out`` is either what it was or complete, and
holds only what that run wrote). ``package`` owns its ``--out``: it replaces
a directory it wrote earlier (its ``PACKAGE-COMPLETE`` marker), and any
other non-empty one only when told (``--clean``).
Build-time only, standard library only.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

from ...common.files import (atomic_move, atomic_write_text, file_sha256, left_by_dead_process,
                             replace_dir_problem)

__all__ = ["COMPLETE_MARKER", "MARKER_KIND", "sha256sums_path", "write_sha256sums",
           "read_sha256sums", "move_into", "clean_leftovers", "clean_stale_scratch", "scratch_dir",
           "real_out", "read_marker", "stage", "swap_into_place", "check_out"]


def sha256sums_path(out_dir: os.PathLike) -> Path:
    return Path(out_dir) / "SHA256SUMS"


def read_sha256sums(out_dir: os.PathLike) -> Dict[str, str]:
    """``{relative path: sha256}`` of ``out_dir/SHA256SUMS`` (empty if none)."""
    path = sha256sums_path(out_dir)
    entries: Dict[str, str] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            digest, _, name = line.partition("  ")
            if name:
                entries[name] = digest
    return entries


def write_sha256sums(out_dir: os.PathLike, files: Iterable[os.PathLike]) -> Path:
    """Add ``files`` (inside ``out_dir``) to ``out_dir/SHA256SUMS`` (``sha256sum -c``
    format, paths relative to ``out_dir``, sorted); entries of files no longer
    there are dropped. Written atomically."""
    out = Path(out_dir).resolve()
    entries = {name: digest for name, digest in read_sha256sums(out).items()
               if (out / name).is_file()}
    for f in files:
        f = Path(f).resolve()
        entries[f.relative_to(out).as_posix()] = file_sha256(f)
    path = sha256sums_path(out)
    atomic_write_text(path, "".join(f"{d}  {n}\n" for n, d in sorted(entries.items())))
    return path


def move_into(files: Iterable[Path], out_dir: Path) -> List[Path]:
    return [atomic_move(f, out_dir / f.name) for f in files]


COMPLETE_MARKER = "PACKAGE-COMPLETE"
MARKER_KIND = "aotriton-rocm-package"
STAGING = ".package-staging-"
OLD = ".package-old-"
# scratch directories of one run under the system temporary directory; the
# pid in the name lets a later run remove what a killed one left there
SCRATCH_PREFIXES = ("aotriton-wheels-", "aotriton-conda-")


def scratch_dir(prefix: str) -> Path:
    """A new scratch directory ``<tmp>/<prefix><pid>-XXXX`` (see :func:`clean_stale_scratch`)."""
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-"))


def clean_stale_scratch(tmp: Optional[Path] = None) -> List[Path]:
    """Remove the scratch directories of ``package`` runs that were killed
    (their pid is gone) from the temporary directory. Returns what went."""
    tmp = Path(tmp or tempfile.gettempdir())
    removed: List[Path] = []
    try:
        entries = list(tmp.iterdir())
    except OSError:
        return removed
    for p in entries:
        if any(left_by_dead_process(p.name, prefix) for prefix in SCRATCH_PREFIXES) \
                and p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def clean_leftovers(out: Path) -> None:
    """Remove the staging/old directories interrupted runs left beside ``out``
    and their scratch in the temporary directory (their process is gone)."""
    clean_stale_scratch()
    try:
        entries = list(out.parent.iterdir())
    except OSError:
        return
    for p in entries:
        for tag in (STAGING, OLD):
            if left_by_dead_process(p.name, f".{out.name}{tag}"):
                if p.is_symlink():
                    p.unlink()
                else:
                    shutil.rmtree(p, ignore_errors=True)


def real_out(out: Path) -> Path:
    """``--out`` with symlinks resolved: the run replaces the directory a
    symlink points to and leaves the link as it is."""
    return Path(os.path.realpath(out))


def read_marker(out: Path) -> Optional[Dict[str, object]]:
    """The ``PACKAGE-COMPLETE`` record of an earlier ``package`` run in ``out``, or None."""
    try:
        doc = json.loads((out / COMPLETE_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("files"), list):
        return None
    return doc


def stage(out: Path) -> Path:
    """An empty staging directory beside ``out``: the run writes into it, then
    :func:`swap_into_place` replaces ``out``'s whole content with it."""
    staging = out.parent / f".{out.name}{STAGING}{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return staging


def swap_into_place(staging: Path, out: Path) -> None:
    """``staging`` becomes ``out`` (renames; never a half-written ``out``)."""
    old = out.parent / f".{out.name}{OLD}{os.getpid()}"
    if os.path.lexists(old):
        shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        os.rename(out, old)
    os.rename(staging, out)
    shutil.rmtree(old, ignore_errors=True)


def check_out(out: Path, clean: bool = False,
              keep: Iterable[Tuple[str, Path]] = ()) -> Optional[str]:
    """Why ``package`` cannot (or must not) write ``--out``, or None. ``out``:
    :func:`real_out`. Checked before any work: the run stages beside
    ``out`` and renames the result into place, replacing the whole directory,
    so ``out`` must be a directory ``package`` wrote (or empty, or new, or
    ``clean``), not a mount point, in a writable parent, and hold none of
    ``keep`` (``(what, path)`` pairs: the archives, the source tree)."""
    for what, path in keep:
        real = Path(os.path.realpath(path))
        if real == out or out in real.parents:
            return (f"--out {out} holds {what} ({real}): package replaces the whole of --out, "
                    f"so pass an --out outside it (e.g. {out / 'dist'})")
    why = replace_dir_problem(out, "package", "dist")
    if why:
        return why
    if out.is_dir() and not clean and read_marker(out) is None:
        try:
            names = sorted(p.name for p in out.iterdir())
        except OSError as e:
            return f"--out {out} cannot be read ({e.strerror or e}): pass another --out"
        if names:
            shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            return (f"--out {out} holds files an earlier `aotriton-rocm package` did not write "
                    f"({shown}); package replaces the whole directory: pass --clean to replace "
                    f"its content, or an empty or new --out")
    return None
