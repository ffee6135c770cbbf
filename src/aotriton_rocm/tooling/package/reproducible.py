"""What makes two builds of one commit byte-identical: the build's time
stamp (``SOURCE_DATE_EPOCH``), the tools' environment, file modes
independent of the umask, and sdists rewritten to depend on their contents
only. Build-time only, standard library only.
"""
from __future__ import annotations

import contextlib
import gzip
import io
import os
import shutil
import stat
import subprocess
import tarfile
from pathlib import Path
from typing import Dict, Optional

from ...common.files import atomic_write_bytes
from .naming import PackagingError

__all__ = ["source_date_epoch", "reproducible_env", "normalize_sdist", "normalize_modes",
           "fixed_umask"]


def source_date_epoch(source_root: os.PathLike) -> Optional[str]:
    """``SOURCE_DATE_EPOCH`` for a build of ``source_root``: the environment's if
    set, else the committer time of the last commit (``git log -1 --format=%ct``),
    else None (not a git checkout: builds are then stamped with file times)."""
    env = os.environ.get("SOURCE_DATE_EPOCH")
    if env:
        return env
    root = Path(source_root)
    if not (root / ".git").exists() or not shutil.which("git"):
        return None
    proc = subprocess.run(["git", "-C", str(root), "log", "-1", "--format=%ct"],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    value = proc.stdout.strip()
    return value if proc.returncode == 0 and value.isdigit() else None


def reproducible_env(env: Dict[str, str], epoch: Optional[str]) -> Dict[str, str]:
    """Settings that make two builds of one tree byte-identical: zip entry
    times from ``SOURCE_DATE_EPOCH`` (setuptools' bdist_wheel and auditwheel
    both honour it; entries are written sorted) and ``-g0`` for the launcher
    (its DWARF would record the random temporary build directory, and the
    GNU build-id hashes that in)."""
    if epoch is not None:
        env["SOURCE_DATE_EPOCH"] = str(epoch)
    env["CFLAGS"] = (env.get("CFLAGS", "") + " -g0").strip()
    return env


def normalize_sdist(sdist: os.PathLike, epoch: Optional[str]) -> Path:
    """Rewrite a ``.tar.gz`` sdist so that it depends on its contents only:
    members sorted by name, owner 0/0 with no names, permissions 0755 for
    directories and executables and 0644 otherwise, no PAX extras, and
    every time stamp (member mtimes, the gzip header) set to ``epoch``
    (``SOURCE_DATE_EPOCH``; None keeps the member mtimes and writes 0 into
    the gzip header). setuptools writes the checkout's file times and the
    build time instead, so two builds of one commit would differ. The file
    is replaced atomically."""
    path = Path(sdist)
    t = int(epoch) if epoch is not None else None
    buf = io.BytesIO()
    try:
        with tarfile.open(path, "r:gz") as src, \
                tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as dst:
            members = sorted(src.getmembers(), key=lambda m: m.name)
            for m in members:
                if not (m.isfile() or m.isdir() or m.issym()):
                    raise PackagingError(f"{path.name}: unexpected member {m.name!r} (type {m.type!r})")
                n = tarfile.TarInfo(m.name)
                n.type, n.size, n.linkname = m.type, m.size, m.linkname
                n.mode = 0o755 if (m.isdir() or m.mode & 0o111) else 0o644
                n.mtime = t if t is not None else int(m.mtime)
                n.uid = n.gid = 0
                n.uname = n.gname = ""
                dst.addfile(n, src.extractfile(m) if m.isfile() else None)
    except (OSError, tarfile.TarError) as e:
        raise PackagingError(f"{path}: cannot rewrite the sdist: {e}") from e
    compressed = io.BytesIO()
    # no file name in the gzip header; mtime from the epoch
    with gzip.GzipFile(filename="", mode="wb", fileobj=compressed, compresslevel=9, mtime=t or 0) as gz:
        gz.write(buf.getvalue())
    atomic_write_bytes(path, compressed.getvalue())
    return path


def normalize_modes(tree: os.PathLike) -> None:
    """Permissions independent of the checkout's umask: directories and files
    with any execute bit 0755, other files 0644 (symlinks untouched)."""
    for dirpath, dirnames, filenames in os.walk(tree):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                continue
            want = 0o755 if (stat.S_ISDIR(st.st_mode) or st.st_mode & 0o111) else 0o644
            if stat.S_IMODE(st.st_mode) != want:
                os.chmod(p, want)


@contextlib.contextmanager
def fixed_umask(mask: int = 0o022):
    """umask 022 for what is built (and extracted) meanwhile, the build tools
    included: file and directory modes inside wheels and packages must not
    depend on the umask of whoever runs the build."""
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)
