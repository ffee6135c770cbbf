"""``aotriton-rocm torch-dropin``: put our libaotriton_v2 in place of the one a
ROCm torch wheel ships, and ``--undo`` it, never losing torch's own.

A torch ROCm wheel ships ``torch/lib/libaotriton_v2.so.X.Y.Z`` beside
``libtorch_hip.so``, which needs it by that file name. The command reads that
name from ``libtorch_hip.so`` (its ``DTNEEDED``), picks our library of the
same API line, keeps torch's as ``<name>.aotriton-rocm-backup`` and puts ours
under the name torch needs. Our library finds the installed kernel images
itself (the image wheels beside torch in site-packages).

The record beside them (``.aotriton-rocm-dropin.json``) names the torch it was
made for (the version in pip's ``torch-X.dist-info`` beside the package), the
file, the sha256 of torch's original and of ours. No run trusts it blindly:
under a lock (``flock`` on ``.aotriton-rocm-dropin.lock``, so one rank of a job
at a time) each run hashes what is on disk. A file whose hash is a library we
ship (or one the record names) is ours, anything else is torch's own. So:

* a record made for another torch version or file name, or whose original is
  not the file torch has now (pip reinstalled or upgraded torch; pip does not
  know the record), is retired with its backup, and the new original is
  backed up;
* ours is never backed up: with ours in place and no backup that matches the
  record of this torch (or pip's RECORD hash of the file), the command
  refuses and prints the ``pip install --force-reinstall`` line that gets
  torch's own back; ``--undo`` likewise restores only a verified backup.

Order of a change (each file written to a temporary name, synced, renamed):
retire a stale backup of another file name; write the record (naming the
original's hash and ours, before anything is swapped); write the backup;
swap ours in. ``--undo``: rename the backup over the file, then remove the
record. Interrupted anywhere, the hash of the file on disk tells the next run
which side of the swap it is on (a record naming ours while torch's original
is in place is a change that did not happen; ``--undo`` then only tidies).

Refused, with the reason: a CUDA or CPU torch, a torch built without
AOTriton, an API line we do not implement, a read-only torch directory. A
full disk or a permission error is reported with what to do and what is on
disk now. Standard library only; torch is located, not imported.
"""
from __future__ import annotations

import argparse
import errno
import hashlib
import json
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, List, Optional

from .._version import __version__
from ..common.elf_dynamic import ElfError, read_dynamic
from ..common.errors import CommandError, UsageError
from ..common.files import atomic_write, describe_os_error, exclusive_lock, file_sha256
from ..common.paths import aotriton_api_library, aotriton_api_line
from .torch_lib_state import (NEEDED, RECORD, RECORD_FORMAT, OnDisk, inspect, needed_aotriton,
                              reinstall_line, sha_or_none, torch_lib_dir)

LOCK = ".aotriton-rocm-dropin.lock"
TMP_SUFFIX = ".aotriton-rocm-tmp"


@dataclass(frozen=True)
class DropinOptions:
    torch_lib: Optional[Path]
    undo: bool

    @classmethod
    def from_args(cls, args) -> "DropinOptions":
        return cls(Path(args.torch_lib) if args.torch_lib else None, bool(args.undo))


def add_torch_dropin_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Replace the libaotriton_v2 inside an installed ROCm torch with aotriton-rocm's (AOTriton's "
        "API over our kernels: every arch we ship, gfx908 and RDNA included), keeping a backup; "
        "--undo restores it.")
    parser.add_argument("--torch-lib", help="torch's lib directory (default: that of the torch "
                        "this Python would import)")
    parser.add_argument("--undo", action="store_true", help="restore the library torch shipped")


def _reached(step: str) -> None:
    """Called after each step that changes a file (the tests interrupt there)."""


def _check_writable(lib: Path) -> None:
    try:
        read_only = bool(os.statvfs(lib).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    if read_only:
        raise UsageError(f"{lib} is on a read-only file system: install torch in an environment "
                         "you can write to (a venv or conda environment of your own)")
    if not os.access(lib, os.W_OK):
        raise UsageError(f"{lib} is not writable by this user: run as the owner of that torch "
                         "install, or install torch in a venv of your own")


# --- changing files --------------------------------------------------------------------------

@contextmanager
def _locked(lib: Path) -> Iterator[None]:
    """One run at a time on ``lib``; temporary files of a killed run are removed."""
    with exclusive_lock(lib / LOCK, f"waiting for another torch-dropin on {lib}"):
        for leftover in lib.glob(f".*{TMP_SUFFIX}"):   # of a run killed mid-write
            leftover.unlink(missing_ok=True)
        yield


def _sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _chunks(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as f:
        yield from iter(lambda: f.read(1 << 20), b"")


def _write(dst: Path, chunks: Iterable[bytes], sha: Optional[str] = None, mode: int = 0o644,
           step: str = "") -> None:
    """``dst`` written whole or not at all (files.atomic_write), its content's
    sha256 checked against ``sha`` before the rename, the directory synced."""
    def write(out) -> None:
        h = hashlib.sha256()
        for chunk in chunks:
            h.update(chunk)
            out.write(chunk)
        if sha is not None and h.hexdigest() != sha:
            raise CommandError(f"the copy meant for {dst.name} does not have the sha256 its source "
                               "had (another program writing torch's lib?): run the command again")
        _reached(step + " written")

    atomic_write(dst, write, mode=mode, suffix=TMP_SUFFIX)
    _sync_dir(dst.parent)
    _reached(step)


def _copy(src: Path, dst: Path, sha: str, step: str) -> None:
    _write(dst, _chunks(src), sha, os.stat(src).st_mode & 0o7777, step)


def _unlink(path: Path, step: str) -> bool:
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    _sync_dir(path.parent)
    _reached(step)
    return True


def _retire(s: OnDisk, backing_up: bool = False) -> List[str]:
    """Remove a stale record's backup of another file name (the record itself
    is replaced or removed by the caller); what was done, in words."""
    if s.current or s.record is None:
        return []
    old = s.stale_backup()
    if old is not None and _unlink(old, "retire"):
        return [f"retired {s.staleness()}, and its backup {old.name}"]
    if backing_up and s.backup_sha is not None and not s.backup_ok:
        return [f"retired {s.staleness()}; its {s.backup.name} is replaced"]
    return [f"retired {s.staleness()}"]


def _original_gone(s: OnDisk) -> CommandError:
    why = (f"{s.target} is missing" if s.target_sha is None else
           f"{s.target} is aotriton-rocm's, and no {s.backup.name} of {s.torch}'s own is there"
           if s.backup_sha is None else
           f"{s.target} is aotriton-rocm's, and {s.backup.name} is not {s.torch}'s own (its sha256 "
           "matches neither this torch's drop-in record nor pip's RECORD of torch)")
    return CommandError(f"{why}. Get torch's own libaotriton_v2 back with: "
                        f"{reinstall_line(s.version)} ; then run this command again")


def _new_record(s: OnDisk, line: str, ours: Path, ours_sha: str, original: str) -> dict:
    earlier = dict(s.record["ours_sha256"]) if s.current and \
        isinstance(s.record.get("ours_sha256"), dict) else {}
    if s.target_is_ours:
        earlier[s.target_sha] = s.ours[s.target_sha]
    earlier[ours_sha] = line
    return {"format": RECORD_FORMAT, "torch_version": s.version, "file": s.name,
            "backup": s.backup.name, "original_sha256": original, "sha256": ours_sha,
            "ours_sha256": earlier, "aotriton_api_line": line, "source": str(ours),
            "installed_by": f"aotriton-rocm {__version__}"}


def _write_record(lib: Path, record: dict) -> None:
    _write(lib / RECORD, [(json.dumps(record, indent=2, sort_keys=True) + "\n").encode()],
           step="record")


def install(lib: Path) -> List[str]:
    name = needed_aotriton(lib)
    line = aotriton_api_line(NEEDED.match(name).group(1))
    ours = aotriton_api_library(line)
    if not ours.is_file():
        raise CommandError(f"this installation has no libaotriton_v2 for AOTriton {line} ({ours} is "
                           "missing): pip install --force-reinstall --no-deps aotriton-rocm")
    _check_writable(lib)
    with _locked(lib):
        s = inspect(lib, name)
        if s.target_sha is None or (s.target_is_ours and not s.backup_ok):
            raise _original_gone(s)
        if not s.target_is_ours:
            try:
                read_dynamic(s.target)
            except ElfError as e:
                raise CommandError(f"{s.target} is not a shared library ({e}): "
                                   f"{reinstall_line(s.version)}") from e
        ours_sha = file_sha256(ours)
        original = s.backup_sha if s.target_is_ours else s.target_sha
        notes = _retire(s, backing_up=True)
        record = _new_record(s, line, ours, ours_sha, original)
        if record != s.record:
            _write_record(lib, record)
        if not s.backup_ok:
            _copy(s.target, s.backup, original, "backup")
        if s.target_sha != ours_sha:
            _copy(ours, s.target, ours_sha, "swap")
        if (sha_or_none(s.target), sha_or_none(s.backup)) != (ours_sha, original):
            raise CommandError(f"{s.target} or {s.backup.name} changed while this command ran "
                               "(another program writing torch's lib?): run it again")
        verb = "is now" if s.target_sha != ours_sha else "is already"
        notes.append(f"{s.target} {verb} aotriton-rocm's libaotriton_v2 (AOTriton API line {line}); "
                     f"{s.torch}'s own is kept as {s.backup.name}. Undo with: aotriton-rocm "
                     "torch-dropin --undo")
        return notes


def undo(lib: Path) -> List[str]:
    name = needed_aotriton(lib)
    _check_writable(lib)
    with _locked(lib):
        s = inspect(lib, name)
        if s.record is None and s.target_sha is not None and not s.target_is_ours:
            raise UsageError(f"{lib} has no aotriton-rocm drop-in to undo (no {RECORD}; "
                             f"{name} is torch's own)")
        if s.target_sha is not None and not s.target_is_ours:
            # torch's own is in place (an upgrade, or a run interrupted before its swap)
            notes = _retire(s)
            gone = [p.name for p in (s.backup, s.lib / RECORD) if _unlink(p, "tidy")]
            return notes + [f"{s.target} is {s.torch}'s own already; nothing to restore"
                            + (f" (removed {', '.join(gone)})" if gone else "")]
        if not s.backup_ok:
            raise _original_gone(s)
        notes = _retire(s)
        os.replace(s.backup, s.target)
        _sync_dir(lib)
        _reached("restore")
        _unlink(lib / RECORD, "forget")
        return notes + [f"restored {s.torch}'s own {name} in {lib}"]


def _failure(e: OSError, lib: Path) -> CommandError:
    """A clean message for an OSError while changing torch's lib: what
    happened, what to do, and what is on disk now (checked, not assumed)."""
    todo = {errno.ENOSPC: f"free space on the file system of {lib}, then run the command again",
            errno.EDQUOT: "free space within your disk quota, then run the command again",
            errno.EACCES: f"run as the owner of {lib} (or give yourself write access to it), "
                          "then run the command again",
            errno.EPERM: f"run as the owner of {lib}, then run the command again",
            errno.EROFS: "install torch in an environment you can write to"}
    what = f"{describe_os_error(e)}: {todo.get(e.errno, 'fix that, then run the command again')}."
    return CommandError(f"{what} {_state_now(lib)}")


def _state_now(lib: Path) -> str:
    try:
        s = inspect(lib, needed_aotriton(lib))
    except (OSError, CommandError):
        return ""
    if s.target_sha is None or (s.target_is_ours and not s.backup_ok):
        return str(_original_gone(s))
    if not s.target_is_ours:
        return f"{s.target} is {s.torch}'s own, as before."
    return f"{s.target} is aotriton-rocm's; {s.torch}'s own is kept as {s.backup.name}."


def run_torch_dropin(options: DropinOptions) -> int:
    lib = options.torch_lib or torch_lib_dir()
    if not lib.is_dir():
        raise UsageError(f"--torch-lib {lib} is not a directory")
    try:
        notes = undo(lib) if options.undo else install(lib)
    except OSError as e:
        raise _failure(e, lib) from e
    for note in notes:
        print(note)
    return 0


