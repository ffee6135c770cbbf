"""Kernel archive: one file per arch holding precompiled code objects.

Runtime module: standard library only (no triton, no torch).

File layout (all integers little-endian)::

    offset  size  field
    0       8     MAGIC  b"AOTRKA\\r\\n"
    8       4     format version (u32), FORMAT_VERSION
    12      4     header size (u32), HEADER_SIZE: bytes before the index
    16      8     index size (u64): UTF-8 JSON, starts at HEADER_SIZE
    24      8     blob region offset (u64), from the start of the file
    32      8     blob region size (u64)
    40      32    sha256 of the index bytes
    72      8     reserved (zero)
    80      ...   index JSON: {"manifest": {...}, "kernels": [{...}, ...]}
    ...     ...   blob region: one lzma (xz) stream per kernel, back to back

Each kernel record gives its blob's ``offset`` (relative to the blob region),
``compressed_size``, the uncompressed ``size`` and the ``sha256`` of the
uncompressed code object. ``manifest["blob_sha256"]`` is the sha256 of the
whole blob region. Opening an archive reads the header and the index only;
code objects are read, decompressed and checked on first use. The index is
read under the rules of the runtime's C reader (native/src/json.c,
archive.c): strict RFC 8259 JSON, nesting up to 64, the same field types
and ranges, at least one kernel; what one reader refuses the other refuses.

Next to each ``<arch>.aotr`` the builder writes ``<arch>.manifest.json``: the
manifest, the kernel records and the archive file's sha256 and size, so an
archive can be checked against what was built.

This module reads; beside it :mod:`.archive_index` holds the index's JSON
rules and :mod:`.archive_identity` the checks of an archive against its name,
sidecar, device and runtime (:func:`~.archive_identity.verify_against_manifest`,
:func:`~.archive_identity.identity_problems`). The writer is build tooling:
:mod:`aotriton_rocm.tooling.builder.archive_writer`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import lzma
import os
import stat
import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .archive_index import MAX_INDEX_SIZE, clip, _index_problem, strict_json_loads

__all__ = [
    "MAGIC",
    "FORMAT_VERSION",
    "HEADER_SIZE",
    "ARCHIVE_SUFFIX",
    "MANIFEST_SUFFIX",
    "ArchiveError",
    "KernelRecord",
    "Archive",
    "manifest_path_for",
    "regular_file_problem",
    "identity_fix",
    "build_command",
    "IDENTITY_CONTEXTS",
]

MAGIC = b"AOTRKA\r\n"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sIIQQQ32s8x")
HEADER_SIZE = _HEADER.size  # 80
ARCHIVE_SUFFIX = ".aotr"
MANIFEST_SUFFIX = ".manifest.json"


def _fix_hint(path: "PathLike") -> str:
    """What to do about a damaged archive at ``path``, naming its image wheel."""
    name = Path(path).name
    if not name.endswith(".aotr"):
        return "Reinstall the kernel image wheel it came from, or rebuild it with `aotriton-rocm build`."
    arch = name[: -len(".aotr")]
    if _unpublished_arch(arch):
        return f"Fix: {identity_fix(arch, path=path)}."
    return (f"Fix: {identity_fix(arch)}, or rebuild it with "
            f"`aotriton-rocm build --arch {arch}`.")


def _unpublished_arch(arch: str) -> Optional[str]:
    """Why no image of ``arch`` can be installed or built (None: it can, or
    this runtime has no package metadata to tell)."""
    from .images import published_image_extras, publishes_image

    if publishes_image(arch):
        return None
    return (f"{arch!r} is no arch aotriton-rocm publishes kernel images for (it publishes "
            f"{', '.join(published_image_extras())})")


def build_command(archives_dir: Optional[PathLike], archs: Optional[Sequence[str]] = None) -> str:
    """The ``build`` command that writes ``archs`` into ``archives_dir``.
    build writes ``OUT/archives/``: only a directory named ``archives`` is one
    it writes, as ``--out`` its parent."""
    cmd = "aotriton-rocm build" + (f" --arch {','.join(archs)}" if archs else "")
    if archives_dir is None:
        return f"{cmd} --out OUT"
    d = Path(archives_dir)
    if d.name == "archives":
        return f"{cmd} --out {d.parent}"
    return (f"{cmd} --out OUT, then package OUT/archives (build writes its archives into "
            f"OUT/archives/, never into {d} itself)")


PathLike = Union[str, "os.PathLike[str]"]


class ArchiveError(Exception):
    """A kernel archive is missing, unreadable, corrupted or incompatible."""


def regular_file_problem(path: PathLike) -> Optional[str]:
    """None if ``path`` is a regular file (symlinks followed), else why not.

    Checked before a file is opened: opening a FIFO named ``*.aotr`` blocks
    until something writes to it, and a directory or device is no archive.
    """
    p = Path(path)
    try:
        st = os.stat(p)
    except OSError as e:
        return f"{p}: cannot read: {e.strerror or e}"
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode)
                else "a socket" if stat.S_ISSOCK(st.st_mode) else "a device or special file")
        return (f"{p}: is {kind}, not a regular file; kernel archives are regular files "
                f"(remove it, then rebuild or reinstall the archive)")
    return None


@dataclass(frozen=True)
class KernelRecord:
    """One precompiled kernel variant and everything needed to launch it."""

    key: str
    kernel: str
    functional: Dict[str, Any]
    config: Dict[str, Any]
    constexprs: Dict[str, Any]
    symbol: str
    num_warps: int
    num_stages: int
    warp_size: int
    shared: int
    global_scratch_size: int
    profile_scratch_size: int
    # Full ordered kernel argument list, including the two trailing scratch
    # pointers ("global_scratch", "*i8") and ("profile_scratch", "*i8").
    args: Tuple[Tuple[str, str], ...]
    divisible_16: Tuple[str, ...]
    grid: Tuple[str, ...]
    offset: int = 0
    compressed_size: int = 0
    size: int = 0
    sha256: str = ""
    # Static facts read from the code object at build time (AMD: VGPR/SGPR
    # counts and spills, scratch, code object version); may be empty.
    stats: Dict[str, Any] = field(default_factory=dict)

    def __hash__(self) -> int:  # dict fields make the generated hash unusable
        return hash((self.key, self.sha256))

    def to_dict(self, *, with_location: bool = True) -> Dict[str, Any]:
        d = {
            "key": self.key,
            "kernel": self.kernel,
            "functional": dict(self.functional),
            "config": dict(self.config),
            "constexprs": dict(self.constexprs),
            "symbol": self.symbol,
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
            "warp_size": self.warp_size,
            "shared": self.shared,
            "global_scratch_size": self.global_scratch_size,
            "profile_scratch_size": self.profile_scratch_size,
            "args": [list(a) for a in self.args],
            "divisible_16": list(self.divisible_16),
            "grid": list(self.grid),
            "offset": self.offset,
            "compressed_size": self.compressed_size,
            "size": self.size,
            "sha256": self.sha256,
            "stats": dict(self.stats),
        }
        if not with_location:
            del d["offset"], d["compressed_size"]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "KernelRecord":
        try:
            return cls(
                key=str(d["key"]),
                kernel=str(d["kernel"]),
                functional=dict(d["functional"]),
                config=dict(d["config"]),
                constexprs=dict(d["constexprs"]),
                symbol=str(d["symbol"]),
                num_warps=int(d["num_warps"]),
                num_stages=int(d["num_stages"]),
                warp_size=int(d["warp_size"]),
                shared=int(d["shared"]),
                global_scratch_size=int(d["global_scratch_size"]),
                profile_scratch_size=int(d["profile_scratch_size"]),
                args=tuple((str(n), str(t)) for n, t in d["args"]),
                divisible_16=tuple(str(x) for x in d["divisible_16"]),
                grid=tuple(str(x) for x in d["grid"]),
                offset=int(d.get("offset", 0)),
                compressed_size=int(d.get("compressed_size", 0)),
                size=int(d["size"]),
                sha256=str(d["sha256"]),
                stats=dict(d.get("stats") or {}),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ArchiveError(f"malformed kernel record {d.get('key', '?')!r}: {e!r}") from None

    def replace(self, **changes: Any) -> "KernelRecord":
        return dataclasses.replace(self, **changes)



def manifest_path_for(archive_path: PathLike) -> Path:
    """``<dir>/<arch>.aotr`` -> ``<dir>/<arch>.manifest.json``."""
    p = Path(archive_path)
    name = p.name[: -len(ARCHIVE_SUFFIX)] if p.name.endswith(ARCHIVE_SUFFIX) else p.stem
    return p.with_name(name + MANIFEST_SUFFIX)


class Archive:
    """A read-only view of one ``<arch>.aotr`` file.

    ``Archive.open(path)`` reads the header and the index only. Code objects
    are decompressed and checked on first use and then cached in memory.
    """

    def __init__(self, path: Path, manifest: Dict[str, Any], kernels: List[KernelRecord],
                 blob_offset: int, blob_size: int, file_size: int):
        self.path = path
        self.manifest = manifest
        self.kernels = kernels
        self._blob_offset = blob_offset
        self._blob_size = blob_size
        self._file_size = file_size
        self._by_key = {r.key: r for r in kernels}
        self._cache: Dict[str, bytes] = {}
        self._lock = threading.Lock()

    # -- opening ---------------------------------------------------------
    @classmethod
    def open(cls, path: PathLike) -> "Archive":
        p = Path(path)
        not_regular = regular_file_problem(p)
        if not_regular is not None:
            raise ArchiveError(not_regular)
        try:
            with open(p, "rb") as f:
                file_size = os.fstat(f.fileno()).st_size
                head = f.read(HEADER_SIZE)
                if len(head) < HEADER_SIZE:
                    raise ArchiveError(
                        f"{p}: truncated kernel archive ({file_size} bytes, shorter than its "
                        f"{HEADER_SIZE}-byte header). {_fix_hint(p)}")
                magic, version, header_size, index_size, blob_offset, blob_size, index_sha = \
                    _HEADER.unpack(head)
                if magic != MAGIC:
                    raise ArchiveError(
                        f"{p}: not an aotriton-rocm kernel archive (bad magic bytes {magic!r}). "
                        f"{_fix_hint(p)}")
                if version > FORMAT_VERSION:
                    raise ArchiveError(
                        f"{p}: archive format version {version} is newer than this aotriton-rocm "
                        f"understands (format {FORMAT_VERSION}). Upgrade aotriton-rocm to the "
                        f"release the kernel image wheel was built for, or install the image "
                        f"wheel that matches this runtime.")
                if version < 1 or header_size != HEADER_SIZE:
                    raise ArchiveError(
                        f"{p}: unsupported archive header (format {version}, header "
                        f"{header_size} bytes). {_fix_hint(p)}")
                if (header_size + index_size > blob_offset
                        or blob_offset + blob_size > file_size):
                    raise ArchiveError(
                        f"{p}: truncated or corrupted kernel archive (file is {file_size} bytes, "
                        f"header says index ends at {header_size + index_size} and blobs end at "
                        f"{blob_offset + blob_size}). {_fix_hint(p)}")
                if index_size > MAX_INDEX_SIZE:
                    raise ArchiveError(f"{p}: index of {index_size} bytes is larger than the "
                                       f"{MAX_INDEX_SIZE >> 20} MiB limit. {_fix_hint(p)}")
                f.seek(header_size)
                index_bytes = f.read(index_size)
        except OSError as e:
            raise ArchiveError(f"{p}: cannot read kernel archive: {e}. {_fix_hint(p)}") from None
        if hashlib.sha256(index_bytes).digest() != index_sha:
            raise ArchiveError(f"{p}: kernel archive index is corrupted (sha256 mismatch). {_fix_hint(p)}")
        try:
            index = strict_json_loads(index_bytes)
        except ValueError as e:
            raise ArchiveError(f"{p}: kernel archive index is unreadable: "
                               f"{clip(e)}. {_fix_hint(p)}") from None
        bad = _index_problem(index, version, blob_size)
        if bad:
            raise ArchiveError(f"{p}: kernel archive index is invalid: {bad}. {_fix_hint(p)}")
        kernels = [KernelRecord.from_dict(d) for d in index["kernels"]]
        return cls(p, index["manifest"], kernels, blob_offset, blob_size, file_size)

    # -- queries ---------------------------------------------------------
    @property
    def arch(self) -> str:
        return str(self.manifest["arch"])

    def __len__(self) -> int:
        return len(self.kernels)

    def __repr__(self) -> str:
        return f"Archive({str(self.path)!r}, arch={self.manifest.get('arch')!r}, kernels={len(self.kernels)})"

    def get(self, key: str) -> Optional[KernelRecord]:
        return self._by_key.get(key)

    def find(self, kernel: str, **functional: Any) -> List[KernelRecord]:
        """Records of ``kernel`` whose functional values equal all those given.

        ``find("attn_fwd", dtype="fp16", head_dim=128, causal=True)``; records
        are returned in archive order (the default config first).
        """
        out = []
        for r in self.kernels:
            if r.kernel != kernel:
                continue
            if all(k in r.functional and r.functional[k] == v for k, v in functional.items()):
                out.append(r)
        return out

    # -- code objects ----------------------------------------------------
    def _read_blob(self, f, r: KernelRecord) -> bytes:
        f.seek(self._blob_offset + r.offset)
        blob = f.read(r.compressed_size)
        if len(blob) != r.compressed_size:
            raise ArchiveError(f"{self.path}: kernel {r.key!r} is truncated. {_fix_hint(self.path)}")
        return blob

    def _decode(self, r: KernelRecord, blob: bytes) -> bytes:
        try:
            code = lzma.decompress(blob, format=lzma.FORMAT_XZ)
        except lzma.LZMAError as e:
            raise ArchiveError(
                f"{self.path}: kernel {r.key!r} is corrupted (cannot decompress: {e}). {_fix_hint(self.path)}"
            ) from None
        if len(code) != r.size or hashlib.sha256(code).hexdigest() != r.sha256:
            raise ArchiveError(
                f"{self.path}: kernel {r.key!r} is corrupted (sha256 of its code object does not "
                f"match the index). {_fix_hint(self.path)}")
        return code

    def code_object(self, record: Union[KernelRecord, str]) -> bytes:
        """The uncompressed, sha256-checked code object (HSACO or cubin) of a record."""
        key = record if isinstance(record, str) else record.key
        with self._lock:
            code = self._cache.get(key)
            if code is not None:
                return code
            r = self._by_key.get(key)
            if r is None:
                raise ArchiveError(f"{self.path}: no kernel {key!r} in this archive")
            try:
                with open(self.path, "rb") as f:
                    blob = self._read_blob(f, r)
            except OSError as e:
                raise ArchiveError(f"{self.path}: cannot read kernel {key!r}: {e}. {_fix_hint(self.path)}") from None
            code = self._decode(r, blob)
            self._cache[key] = code
            return code

    def verify(self) -> List[str]:
        """Check the blob region hash and every kernel; returns problems (empty = OK)."""
        problems: List[str] = []
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size != self._file_size:
                    problems.append(f"{self.path}: file size changed since it was opened")
                f.seek(self._blob_offset)
                h = hashlib.sha256()
                left = self._blob_size
                while left > 0:
                    b = f.read(min(left, 1 << 20))
                    if not b:
                        break
                    h.update(b)
                    left -= len(b)
                if left:
                    problems.append(f"{self.path}: blob region is truncated")
                elif h.hexdigest() != self.manifest.get("blob_sha256"):
                    problems.append(f"{self.path}: blob region sha256 does not match the manifest")
                for r in self.kernels:
                    try:
                        self._decode(r, self._read_blob(f, r))
                    except ArchiveError as e:
                        problems.append(str(e).replace(" " + _fix_hint(self.path), ""))
        except OSError as e:
            problems.append(f"{self.path}: cannot read: {e}")
        return problems


# -- the fix that an identity problem names ------------------------------------

IDENTITY_CONTEXTS = ("installed", "build")


def identity_fix(arch: str, context: str = "installed", path: Optional[PathLike] = None,
                 abi_line: Optional[str] = None) -> str:
    """The command that puts a good archive for ``arch`` in place.

    ``context="installed"``: reinstall the image package of the runtime's ABI
    line; ``"build"``: rebuild the archive into the output directory that
    holds ``path`` (``OUT/archives/<arch>.aotr``).
    """
    if context == "build":
        return f"rebuild it: {build_command(None if path is None else Path(path).parent, [arch])}"
    unpublished = _unpublished_arch(arch)
    if unpublished:
        return f"remove {path or f'{arch}.aotr'}: {unpublished}"
    if abi_line is None:
        from .._version import ABI_VERSION as abi_line
    an = arch.replace("_", "")
    return (f"reinstall the image: pip install --force-reinstall --no-deps "
            f"'aotriton-rocm-{an}~={abi_line}.0' (conda: conda install --force-reinstall "
            f"'aotriton-rocm-{an}={abi_line}')")
