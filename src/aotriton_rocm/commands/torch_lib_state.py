"""What torch's lib directory holds, as ``aotriton-rocm torch-dropin`` sees
it (read only): the installed torch (pip's metadata beside the package), the
drop-in record, the libaotriton_v2 files and their hashes, which of them are
ours, and which libaotriton_v2 a running torch loaded. The command itself,
which changes files, is :mod:`.torch_dropin`.
"""
from __future__ import annotations

import base64
import importlib.metadata
import importlib.util
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple

from ..common.elf_dynamic import ElfError, read_dynamic
from ..common.errors import CommandError, UsageError
from ..common.files import describe_os_error, file_sha256
from ..common.paths import AOTRITON_API_VERSIONS, aotriton_api_library

RECORD = ".aotriton-rocm-dropin.json"
RECORD_FORMAT = 2
DROPIN_PREFIX = "aotriton-rocm's drop-in"
BACKUP_SUFFIX = ".aotriton-rocm-backup"
TORCH_HIP = "libtorch_hip.so"
NEEDED = re.compile(r"^libaotriton_v2\.so\.(\d+\.\d+\.\d+)$")


def torch_lib_dir() -> Path:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise UsageError("torch is not installed in this Python: install a ROCm torch first, "
                         "or give --torch-lib")
    return Path(list(spec.submodule_search_locations)[0]) / "lib"


# --- the installed torch: pip's metadata beside the package ---------------------------------

def _torch_dist(lib: Path) -> Tuple[Optional[str], Optional[importlib.metadata.Distribution]]:
    """(version, pip's metadata) of the torch whose lib directory is ``lib``;
    (None, None) without pip metadata (a source build, a bare copy)."""
    if lib.parent.name != "torch":
        return None, None
    found = []
    for path in lib.parent.parent.glob("torch-*.dist-info"):
        dist = importlib.metadata.Distribution.at(path)
        try:
            meta = dist.metadata
            mtime = (path / "METADATA").stat().st_mtime
        except OSError:
            continue
        if meta and (meta["Name"] or "").lower() == "torch" and meta["Version"]:
            found.append((mtime, str(path), meta["Version"], dist))
    if not found:
        return None, None
    _, _, version, dist = max(found)   # pip leaves one; after a botched upgrade, the newest
    return version, dist


def _pip_sha256(dist: Optional[importlib.metadata.Distribution], name: str) -> Optional[str]:
    """The sha256 pip recorded for ``torch/lib/<name>`` when it installed torch."""
    try:
        files = (dist.files or []) if dist else []
    except OSError:
        return None
    for f in files:
        if f.as_posix() == f"torch/lib/{name}" and f.hash is not None and f.hash.mode == "sha256":
            digest = f.hash.value
            try:
                return base64.urlsafe_b64decode(digest + "=" * (-len(digest) % 4)).hex()
            except ValueError:
                return None
    return None


def reinstall_line(version: Optional[str]) -> str:
    """The command that gets torch's own libaotriton_v2 back."""
    if version is None:
        return ("pip install --force-reinstall --no-deps torch (the version you had: no "
                "torch-*.dist-info lies beside this torch)")
    line = f"pip install --force-reinstall --no-deps torch=={version}"
    rocm = re.search(r"\+(rocm\d+(?:\.\d+)*)$", version)
    return line + (f" --index-url https://download.pytorch.org/whl/{rocm.group(1)}" if rocm else "")


# --- what is on disk -------------------------------------------------------------------------

def read_record(lib: Path) -> Optional[dict]:
    """The drop-in record of ``lib``: None when there is none, {} when it is
    not JSON (a stale record, retired by the next run)."""
    try:
        text = (lib / RECORD).read_text()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise CommandError(f"cannot read the drop-in record: {describe_os_error(e)}: run as the "
                           f"owner of {lib}") from e
    try:
        record = json.loads(text)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def shipped_libraries() -> Dict[str, str]:
    """sha256 -> API line of each libaotriton_v2 this installation ships."""
    out = {}
    for line in AOTRITON_API_VERSIONS:
        path = aotriton_api_library(line)
        if path.is_file():
            out[file_sha256(path)] = line
    return out


def ours_by_sha(record: Optional[dict]) -> Dict[str, str]:
    """sha256 -> API line of every library that is ours: those we ship and
    those a record (current or stale) says it put in place."""
    earlier = (record or {}).get("ours_sha256")
    ours = dict(earlier) if isinstance(earlier, dict) else {}
    if record and isinstance(record.get("sha256"), str):
        ours.setdefault(record["sha256"], str(record.get("aotriton_api_line", "?")))
    ours.update(shipped_libraries())
    return ours


def sha_or_none(path: Path) -> Optional[str]:
    try:
        return file_sha256(path)
    except FileNotFoundError:
        return None


@dataclass
class OnDisk:
    lib: Path
    name: str
    version: Optional[str]       # of the installed torch
    record: Optional[dict]       # as read, current or stale
    current: bool                # the record is of this torch and its original is not replaced
    ours: Dict[str, str]
    target_sha: Optional[str]    # None: missing
    backup_sha: Optional[str]
    trusted: set                 # hashes torch's original may have (record, pip, the file on disk)

    @property
    def target(self) -> Path:
        return self.lib / self.name

    @property
    def backup(self) -> Path:
        return self.lib / (self.name + BACKUP_SUFFIX)

    @property
    def target_is_ours(self) -> bool:
        return self.target_sha in self.ours

    @property
    def backup_ok(self) -> bool:
        return self.backup_sha is not None and self.backup_sha in self.trusted \
            and self.backup_sha not in self.ours

    @property
    def torch(self) -> str:
        return f"torch {self.version}" if self.version else "torch"

    def stale_backup(self) -> Optional[Path]:
        """The backup a stale record names under another file name (ours has
        none other than ``<file>.aotriton-rocm-backup``)."""
        file = (self.record or {}).get("file")
        if self.current or not isinstance(file, str) or not NEEDED.match(file) or file == self.name:
            return None
        return self.lib / (file + BACKUP_SUFFIX)

    def staleness(self) -> str:
        """Why the record is not trusted, in words (for the message)."""
        r = self.record or {}
        if r == {}:
            return "an unreadable drop-in record"
        if r.get("format") != RECORD_FORMAT:
            return "the drop-in record of an older aotriton-rocm (it names no torch version)"
        was = f"torch {r.get('torch_version')} ({r.get('file')})"
        if (r.get("torch_version"), r.get("file")) != (self.version, self.name):
            return f"the drop-in record of {was}: {self.torch} ({self.name}) is installed now"
        return f"the drop-in record of {was}: torch's {self.name} was reinstalled since"


def inspect(lib: Path, name: str) -> OnDisk:
    version, dist = _torch_dist(lib)
    record = read_record(lib)
    ours = ours_by_sha(record)
    target_sha = sha_or_none(lib / name)
    backup_sha = sha_or_none(lib / (name + BACKUP_SUFFIX))
    current = bool(record) and record.get("format") == RECORD_FORMAT and \
        (record.get("file"), record.get("torch_version")) == (name, version)
    if target_sha is not None and target_sha not in ours:
        current = current and record.get("original_sha256") == target_sha
        trusted = {target_sha}
    else:
        trusted = {record.get("original_sha256") if current else None, _pip_sha256(dist, name)}
        trusted.discard(None)
    return OnDisk(lib, name, version, record, current, ours, target_sha, backup_sha, trusted)


def needed_aotriton(lib: Path) -> str:
    """The libaotriton_v2 file name torch's ``libtorch_hip.so`` needs."""
    hip = lib / TORCH_HIP
    if not hip.is_file():
        kind = "a CUDA" if (lib / "libtorch_cuda.so").is_file() else "a CPU-only"
        raise UsageError(f"{lib} holds {kind} torch (no {TORCH_HIP}): AOTriton is only linked by "
                         "ROCm builds of torch; install one (pip install torch --index-url "
                         "https://download.pytorch.org/whl/rocmX.Y)")
    try:
        names = [n for n in read_dynamic(hip).needed if NEEDED.match(n)]
    except (OSError, ElfError) as e:
        raise CommandError(f"cannot read {hip}: {e}") from e
    if not names:
        raise UsageError(f"{hip} does not link libaotriton_v2: this torch was built without "
                         "AOTriton (USE_FLASH_ATTENTION=0), there is nothing to replace")
    return names[0]


def loaded_aotriton() -> str:
    """Which libaotriton_v2 the torch of this process has loaded, in words
    (for ``smoke`` and ``info``; call after ``import torch``): ours when its
    hash is a library we ship or one a drop-in record names."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split(None, 5)[-1].strip() for line in maps if "libaotriton_v2" in line}
    except OSError:
        return "unknown (/proc/self/maps is unreadable)"
    if not paths:
        return "none (this torch has not loaded AOTriton: a CUDA or CPU build, or one without it)"
    path = Path(sorted(paths)[0])
    if path.name.endswith(" (deleted)"):
        return (f"unknown (the loaded {path.name[:-len(' (deleted)')]} was replaced on disk after "
                "torch loaded it: start Python again)")
    try:
        record = read_record(path.parent)
    except CommandError:
        record = None
    try:
        line = ours_by_sha(record).get(file_sha256(path))
    except OSError as e:
        return f"unknown ({describe_os_error(e)})"
    if line:
        return f"{DROPIN_PREFIX} (AOTriton API line {line}): {path}"
    return f"torch's own AOTriton: {path}"
