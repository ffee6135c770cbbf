"""``aotriton-rocm torch-dropin``: put our libaotriton_v2 in place of the one a
ROCm torch wheel ships, and ``--undo`` it.

A torch ROCm wheel ships ``torch/lib/libaotriton_v2.so.X.Y.Z`` beside
``libtorch_hip.so``, which needs it by that file name. The command reads that
name from ``libtorch_hip.so`` (its ``DT_NEEDED``), picks our library of the
same API line, keeps the original as ``<name>.aotriton-rocm-backup`` and
writes ours under the name torch needs (a new file renamed into place). A
record beside it (``.aotriton-rocm-dropin.json``) says what was done, for
``--undo``, ``info`` and ``smoke``. Our library finds the installed kernel
images itself (the image wheels beside torch in site-packages).

Refused, with the reason: a CUDA or CPU torch, a torch built without
AOTriton, an API line we do not implement, a read-only torch directory.
Standard library only; torch is located, not imported.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ._version import __version__
from .elf_dynamic import ElfError, read_dynamic
from .errors import CommandError, UsageError
from .files import file_sha256
from .paths import aotriton_api_library, aotriton_api_line

RECORD = ".aotriton-rocm-dropin.json"
DROPIN_PREFIX = "aotriton-rocm's drop-in"
BACKUP_SUFFIX = ".aotriton-rocm-backup"
TORCH_HIP = "libtorch_hip.so"
_NEEDED = re.compile(r"^libaotriton_v2\.so\.(\d+\.\d+\.\d+)$")


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


def torch_lib_dir() -> Path:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise UsageError("torch is not installed in this Python: install a ROCm torch first, "
                         "or give --torch-lib")
    return Path(list(spec.submodule_search_locations)[0]) / "lib"


def read_record(lib: Path) -> Optional[dict]:
    try:
        return json.loads((lib / RECORD).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise CommandError(f"{lib / RECORD} is unreadable ({e}): restore torch's library by "
                           f"hand from its {BACKUP_SUFFIX} file, or reinstall torch") from e


def needed_aotriton(lib: Path) -> str:
    """The libaotriton_v2 file name torch's ``libtorch_hip.so`` needs."""
    hip = lib / TORCH_HIP
    if not hip.is_file():
        kind = "a CUDA" if (lib / "libtorch_cuda.so").is_file() else "a CPU-only"
        raise UsageError(f"{lib} holds {kind} torch (no {TORCH_HIP}): AOTriton is only linked by "
                         "ROCm builds of torch; install one (pip install torch --index-url "
                         "https://download.pytorch.org/whl/rocmX.Y)")
    try:
        names = [n for n in read_dynamic(hip).needed if _NEEDED.match(n)]
    except (OSError, ElfError) as e:
        raise CommandError(f"cannot read {hip}: {e}") from e
    if not names:
        raise UsageError(f"{hip} does not link libaotriton_v2: this torch was built without "
                         "AOTriton (USE_FLASH_ATTENTION=0), there is nothing to replace")
    return names[0]


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


def install(lib: Path) -> dict:
    name = needed_aotriton(lib)
    version = _NEEDED.match(name).group(1)
    line = aotriton_api_line(version)
    ours = aotriton_api_library(line)
    if not ours.is_file():
        raise CommandError(f"this installation has no libaotriton_v2 for AOTriton {line} ({ours} is "
                           "missing): pip install --force-reinstall --no-deps aotriton-rocm")
    _check_writable(lib)
    target, backup = lib / name, lib / (name + BACKUP_SUFFIX)
    record = read_record(lib)
    if record is None:
        if not target.is_file():
            raise CommandError(f"{target} is missing: this torch install is incomplete; reinstall "
                               "torch first")
        try:
            original_soname = read_dynamic(target).soname
        except ElfError as e:
            raise CommandError(f"{target} is not a shared library ({e}): reinstall torch") from e
        tmp = lib / f".{name}.aotriton-rocm-{os.getpid()}"
        try:
            shutil.copy2(target, tmp)
            os.replace(tmp, backup)
        finally:
            tmp.unlink(missing_ok=True)
        record = {"file": name, "backup": backup.name, "original_soname": original_soname,
                  "original_sha256": file_sha256(backup)}
    tmp = lib / f".{name}.aotriton-rocm-{os.getpid()}"
    try:
        shutil.copy2(ours, tmp)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    record.update({"installed_by": f"aotriton-rocm {__version__}", "aotriton_api_line": line,
                   "source": str(ours), "sha256": file_sha256(target)})
    rec_tmp = lib / f".{RECORD}.{os.getpid()}"
    rec_tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    os.replace(rec_tmp, lib / RECORD)
    return record


def undo(lib: Path) -> dict:
    record = read_record(lib)
    if record is None:
        raise UsageError(f"{lib} has no aotriton-rocm drop-in to undo (no {RECORD})")
    _check_writable(lib)
    backup, target = lib / record["backup"], lib / record["file"]
    if not backup.is_file():
        raise CommandError(f"the backup {backup} is missing: reinstall torch to restore its "
                           f"libaotriton_v2, then delete {lib / RECORD}")
    os.replace(backup, target)
    (lib / RECORD).unlink()
    return record


def run_torch_dropin(options: DropinOptions) -> int:
    lib = options.torch_lib or torch_lib_dir()
    if not lib.is_dir():
        raise UsageError(f"--torch-lib {lib} is not a directory")
    if options.undo:
        record = undo(lib)
        print(f"restored torch's {record['file']} in {lib}")
        return 0
    record = install(lib)
    print(f"{lib / record['file']} is now aotriton-rocm's libaotriton_v2 (AOTriton API line "
          f"{record['aotriton_api_line']}); torch's own is kept as {record['backup']}. "
          "Undo with: aotriton-rocm torch-dropin --undo")
    return 0


def loaded_aotriton() -> str:
    """Which libaotriton_v2 the torch of this process has loaded, in words
    (for ``smoke`` and ``info``; call after ``import torch``)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split(None, 5)[-1].strip() for line in maps if "libaotriton_v2" in line}
    except OSError:
        return "unknown (/proc/self/maps is unreadable)"
    if not paths:
        return "none (this torch has not loaded AOTriton: a CUDA or CPU build, or one without it)"
    path = Path(sorted(paths)[0])
    record = None
    try:
        record = read_record(path.parent)
    except CommandError:
        pass
    if record and record.get("file") == path.name and record.get("sha256") == file_sha256(path):
        return f"{DROPIN_PREFIX} (AOTriton API line {record['aotriton_api_line']}): {path}"
    return f"torch's own AOTriton: {path}"
