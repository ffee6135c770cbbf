"""Files written so that a reader never sees half of one, and their sha256.

Standard library only (the runtime's archive writer and the build tooling
share it).
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, Optional, Union

__all__ = ["describe_os_error", "atomic_write", "atomic_write_bytes", "atomic_write_text", "atomic_write_json",
           "atomic_copy", "atomic_move", "file_sha256", "link_or_copy", "pid_alive",
           "left_by_dead_process", "parent_file_problem", "replace_dir_problem"]

PathLike = Union[str, "os.PathLike[str]"]


def atomic_write(path: PathLike, write: Callable[[BinaryIO], Any], *, mode: int = 0o644,
                 suffix: str = ".tmp") -> None:
    """Write a file through ``write(fileobj)`` into a hidden temporary file
    beside ``path`` (``.<name>.*<suffix>``, synced), then rename it over
    ``path``; an exception from ``write`` leaves ``path`` as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + path.name + ".", suffix=suffix, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def atomic_write_bytes(path: PathLike, data: bytes) -> None:
    atomic_write(path, lambda f: f.write(data))


def atomic_write_text(path: PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: PathLike, obj: Any) -> None:
    """``obj`` as indented JSON (2 spaces, a final newline)."""
    atomic_write_bytes(path, (json.dumps(obj, indent=2) + "\n").encode())


def _partial_beside(dst: Path) -> Path:
    return dst.with_name(f".{dst.name}.{os.getpid()}.partial")


def atomic_copy(src: PathLike, dst: PathLike) -> Path:
    """Copy ``src`` to ``dst`` (metadata kept) so that ``dst`` appears whole."""
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = _partial_beside(dst)
    shutil.copy2(src, tmp)
    os.replace(tmp, dst)
    return dst


def atomic_move(src: PathLike, dst: PathLike) -> Path:
    """Put ``src`` at ``dst`` atomically, mode 0644: renamed (or, across file
    systems, copied) to a hidden name beside ``dst`` first, then renamed over
    ``dst``. ``src`` is consumed."""
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = _partial_beside(dst)
    try:
        os.replace(src, tmp)  # same file system
    except OSError:
        shutil.copy2(src, tmp)
        os.unlink(src)
    os.chmod(tmp, 0o644)
    os.replace(tmp, dst)
    return dst


def file_sha256(path: PathLike, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def link_or_copy(src: PathLike, dst: PathLike) -> None:
    """A hard link of ``src`` at ``dst`` where the file system allows, else a copy."""
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (temporary files left by a run carry
    its pid, so that a later run can tell leftovers from work in progress)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def describe_os_error(e: OSError) -> str:
    """``PATH: what went wrong`` for a user, without errno numbers; a
    read-only file system is named as such (not "permission denied")."""
    import errno

    what = "read-only file system" if e.errno == errno.EROFS else (e.strerror or str(e)).lower()
    return f"{e.filename}: {what}" if e.filename else what


def left_by_dead_process(name: str, prefix: str) -> bool:
    """Whether ``name`` is ``<prefix><pid>[-...]`` of a process that is gone
    (the scratch and staging names of a run carry its pid)."""
    if not name.startswith(prefix):
        return False
    pid = name[len(prefix):].split("-", 1)[0]
    return pid.isdigit() and not pid_alive(int(pid))


def _is_mount_point(path: Path) -> bool:
    try:
        return os.path.ismount(path)
    except OSError:
        return False


def _read_only_fs(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False


def _nearest_existing(path: Path) -> Path:
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    return path


def parent_file_problem(out: PathLike, option: str = "--out") -> Optional[str]:
    """Why nothing can be created at ``out`` because a file stands where one
    of its parent directories should be (``/etc/passwd/x``), or None. (The
    OS says "not a directory", or "permission denied" for a test of write
    access, neither of which names the file.)"""
    out = Path(os.path.abspath(out))
    probe = _nearest_existing(out.parent)
    if probe.is_dir():
        return None
    return (f"{option} {out}: {probe} is a file, not a directory, so nothing can be written "
            f"under it: pass an {option} whose parent directories are directories")


def replace_dir_problem(out: Path, command: str, example: str) -> Optional[str]:
    """Why ``command`` cannot write the directory ``--out out`` by staging it
    beside ``out`` and renaming it into place, or None. Checked before any
    work: ``out`` is a file, a file stands where one of its parent
    directories should be, ``out`` is a mount point (a rename cannot replace
    one; ``example``: the name suggested inside it), or its parent cannot be
    written (read-only file system, permissions)."""
    out = Path(os.path.abspath(out))
    if out.exists() and not out.is_dir():
        return (f"--out {out} is a file, not a directory: pass a directory (created if missing), "
                f"or remove the file")
    why = parent_file_problem(out)
    if why:
        return why
    probe = _nearest_existing(out.parent)
    if out.is_dir() and _is_mount_point(out):
        return (f"--out {out} is a mount point: {command} builds its output beside --out and "
                f"renames it into place, which cannot replace a mount point; pass a directory "
                f"inside it, e.g. --out {out / example}")
    if _read_only_fs(probe):
        return (f"--out {out}: {probe} is on a read-only file system: pass an --out on a "
                f"writable one")
    if not os.access(probe, os.W_OK | os.X_OK):
        return (f"--out {out}: cannot write in {probe} (permission denied); the output is "
                f"staged beside --out and renamed into place, so its parent directory must be "
                f"writable: pass another --out")
    return None


@contextmanager
def exclusive_lock(path: Path, waiting: str) -> Iterator[None]:
    """Hold ``flock`` on the file ``path`` (printing ``waiting`` while another
    process holds it). The holder removes the file when done, so a waiter
    that wakes on a removed file locks the new one instead."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                print(waiting, file=sys.stderr, flush=True)
                fcntl.flock(fd, fcntl.LOCK_EX)
            held, there = os.fstat(fd), os.stat(path)
            if (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino):
                break
        except FileNotFoundError:
            pass
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    try:
        yield
    finally:
        path.unlink(missing_ok=True)
        os.close(fd)
