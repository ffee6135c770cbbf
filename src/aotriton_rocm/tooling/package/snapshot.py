"""The source tree as it is packaged: a clean copy (tracked and
not-ignored files only, no build outputs), with the version stamped in.
Build-time only.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import List, Optional, Sequence

from .naming import PackagingError
from .reproducible import normalize_modes
from ..common.source_tree import version_file

__all__ = ["snapshot_source", "set_version_in_snapshot"]


_SNAPSHOT_IGNORE = shutil.ignore_patterns(
    ".*.package-staging-*", ".*.package-old-*", ".git", "__pycache__", "*.pyc", "*.so", "*.egg-info", ".venv*",
    ".pytest_cache", ".cache")


# build outputs at the top of the tree only (a build/ folder deeper in the tree is source)
_SNAPSHOT_SKIP_TOP = {"BUILD", "build", "dist", ".cache", ".whl", ".pytest_cache"}


def snapshot_source(source_root: os.PathLike, dest: os.PathLike,
                    exclude: Sequence[os.PathLike] = ()) -> Path:
    """Copy the source tree to ``dest``: in a git work tree, the tracked and the
    untracked-but-not-ignored files (what a fresh clone plus work in progress
    has); otherwise everything but caches and build outputs. Builds then never
    see stale ``build/``, ``*.egg-info`` or in-place ``*.so`` files, and never
    write into the source tree."""
    src = Path(source_root).resolve()
    dst = Path(dest)
    files: Optional[List[str]] = None
    if (src / ".git").exists() and shutil.which("git"):
        proc = subprocess.run(["git", "-C", str(src), "ls-files", "-z", "--cached", "--others",
                               "--exclude-standard"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        if proc.returncode == 0:
            files = [f for f in proc.stdout.decode("utf-8", "surrogateescape").split("\0") if f]
    if files is None:
        skip = {Path(p).resolve() for p in (*exclude, dst)}

        def ignore(directory, names):
            ignored = set(_SNAPSHOT_IGNORE(directory, names))
            if Path(directory).resolve() == src:
                ignored |= set(names) & _SNAPSHOT_SKIP_TOP
            return ignored | {n for n in names if (Path(directory) / n).resolve() in skip}

        shutil.copytree(src, dst, ignore=ignore, symlinks=True)
        normalize_modes(dst)
        return dst
    dst.mkdir(parents=True, exist_ok=True)
    for rel in files:
        top = rel.split("/", 1)[0]
        if top in _SNAPSHOT_SKIP_TOP or top.startswith(".venv"):
            continue  # build outputs that are not git-ignored (BUILD/archives)
        if any(".package-staging-" in part or ".package-old-" in part for part in rel.split("/")):
            continue  # `package` output being staged beside --out
        s = src / rel
        if not s.is_file():  # deleted in the work tree, or a submodule
            continue
        d = dst / rel
        d.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(s, d)
    normalize_modes(dst)
    return dst


def set_version_in_snapshot(snapshot: Path, version: str) -> None:
    """Rewrite ``__version__`` in the snapshot's ``_version.py`` (local label of
    a per-ROCm build: the installed package then reports what it is)."""
    path = version_file(snapshot)
    text = path.read_text(encoding="utf-8")
    pattern = re.compile(r'^__version__\s*=\s*["\'][^"\']*["\']\s*$', re.M)
    new, n = pattern.subn(f'__version__ = "{version}"', text)
    if n != 1:
        raise PackagingError(f"{path}: expected exactly one `__version__ = \"...\"` line, found {n}")
    path.write_text(new, encoding="utf-8")
