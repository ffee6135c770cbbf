"""The output directory of ``package``: files published into it atomically,
its ``SHA256SUMS``, and a run's staging directory beside it that is renamed
into place at the end (so ``--out`` is either what it was or complete).
Build-time only, standard library only.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Dict, Iterable, List, Optional

from ...files import atomic_move, atomic_write_text, file_sha256, link_or_copy, pid_alive

__all__ = ["COMPLETE_MARKER", "sha256sums_path", "write_sha256sums", "read_sha256sums",
           "move_into", "clean_leftovers", "stage", "swap_into_place", "check_out"]


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
STAGING = ".package-staging-"
OLD = ".package-old-"


def clean_leftovers(out: Path) -> None:
    """Remove the staging/old directories interrupted runs left beside ``out``
    (their process is gone)."""
    try:
        entries = list(out.parent.iterdir())
    except OSError:
        return
    for p in entries:
        for tag in (STAGING, OLD):
            prefix = f".{out.name}{tag}"
            if p.name.startswith(prefix) and p.name[len(prefix):].isdigit():
                if not pid_alive(int(p.name[len(prefix):])):
                    shutil.rmtree(p, ignore_errors=True)


def stage(out: Path) -> Path:
    """A staging directory beside ``out`` holding a (hard-linked) copy of what
    ``out`` holds now: the run adds to it, then :func:`swap_into_place`."""
    staging = out.parent / f".{out.name}{STAGING}{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)

    def copy(src: str, dst: str) -> None:
        # wheels and sdists are only ever replaced by rename (atomic_move()): a hard
        # link is safe; anything a tool may rewrite in place (conda's channel,
        # repodata) is copied, so that `out` stays as it was until the swap.
        if src.endswith((".whl", ".tar.gz")) and Path(src).parent == out:
            link_or_copy(Path(src), Path(dst))
        else:
            shutil.copy2(src, dst)

    if out.is_dir():
        shutil.copytree(out, staging, symlinks=True, copy_function=copy)
        (staging / COMPLETE_MARKER).unlink(missing_ok=True)
    else:
        staging.mkdir(parents=True)
    return staging


def swap_into_place(staging: Path, out: Path) -> None:
    """``staging`` becomes ``out`` (renames; never a half-written ``out``)."""
    old = out.parent / f".{out.name}{OLD}{os.getpid()}"
    if out.exists():
        os.rename(out, old)
    os.rename(staging, out)
    shutil.rmtree(old, ignore_errors=True)


def check_out(out: Path) -> Optional[str]:
    """Why ``--out`` cannot be written, or None."""
    if out.exists() and not out.is_dir():
        return (f"--out {out} is a file, not a directory: pass a directory (created if missing), "
                f"or remove the file")
    probe = out.parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not os.access(probe, os.W_OK | os.X_OK):
        return (f"--out {out}: cannot write in {probe} (permission denied); the output is "
                f"staged beside --out and renamed into place, so its parent directory must be "
                f"writable: pass another --out")
    return None
