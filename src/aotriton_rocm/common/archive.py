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
archive can be checked against what was built (:func:`verify_against_manifest`).
"""
from __future__ import annotations

import array
import dataclasses
import hashlib
import itertools
import json
import lzma
import math
import os
import re
import stat
import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .files import atomic_write, file_sha256
from .kernel_abi import kernel_abi_section

__all__ = [
    "clip",
    "MAGIC",
    "FORMAT_VERSION",
    "HEADER_SIZE",
    "ARCHIVE_SUFFIX",
    "MANIFEST_SUFFIX",
    "ArchiveError",
    "KernelRecord",
    "Archive",
    "write_archive",
    "write_manifest_sidecar",
    "manifest_path_for",
    "verify_against_manifest",
    "identity_problems",
    "regular_file_problem",
    "strict_json_loads",
    "subset_of",
    "with_fix",
]

MAGIC = b"AOTRKA\r\n"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sIIQQQ32s8x")
HEADER_SIZE = _HEADER.size  # 80
ARCHIVE_SUFFIX = ".aotr"
MANIFEST_SUFFIX = ".manifest.json"

# Keys every manifest carries (the builder fills them; the reader checks them).
MANIFEST_KEYS = (
    "format_version",
    "package_version",
    "abi_version",
    "rocm_profile",
    "arch",
    "backend",
    "warp_size",
    "compiler",
    "compiler_version",
    "build_inputs_hash",
    "blob_sha256",
)

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


def clip(value: object, limit: int = 200) -> str:
    """``str(value)`` cut to ``limit`` characters (values read from a damaged
    file go into one-line messages)."""
    text = str(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more characters)"


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


# -- the index's JSON: the C reader's rules (native/src/json.c, archive.c) ------
# Python's json accepts more than RFC 8259 (NaN, Infinity, numbers that overflow
# to inf, lone surrogate escapes, \u0000, any depth up to a RecursionError). The
# runtime's C reader refuses those, so this reader refuses them too: an archive
# one reader takes and the other refuses would pass `validate` and fail on the GPU.

MAX_JSON_DEPTH = 64                # json.c MAX_DEPTH
MAX_INDEX_SIZE = 256 << 20         # archive.c MAX_INDEX_SIZE
MAX_CODE_SIZE = 1 << 30            # archive.c MAX_CODE_SIZE
_I64 = 1 << 63
_U32 = (1 << 32) - 1
_I32 = (1 << 31) - 1
_DTYPES = ("fp16", "bf16", "fp32")
_SCALAR_ARGS = ("i32", "fp32", "i64")
_FLAGS = ("pad_head", "has_bias", "enable_dropout")
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = bytes(c for c in range(256) if c not in b"[]{}")
_NOT_BRACKET_OR_QUOTE = bytes(c for c in range(256) if c not in b'[]{}"')
_DEPTH_STEP = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_DIGIT_MARKS = bytes.maketrans(bytes(range(256)),
                               bytes(49 if 48 <= c <= 57 else 48 for c in range(256)))
_INT64_DIGITS = 19  # a run of this many digits may not fit int64
_SURROGATE = re.compile("[\ud800-\udfff]")
_SHA256_HEX = re.compile(r"[0-9a-f]{64}\Z")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number (RFC 8259 has no NaN or Infinity)")


def _finite(text: str) -> float:
    v = float(text)
    if math.isinf(v):
        raise ValueError(f"number {clip(text, 40)} is out of range (overflows to infinity)")
    return v


def _int_or_double(text: str) -> Union[int, float]:
    """An integer that fits int64 exactly, else the double the C reader keeps."""
    if len(text) <= 20:
        v = int(text)
        if -_I64 <= v < _I64:
            return v
    return _finite(text)


def _max_depth(data: bytes) -> int:
    """Nesting depth of arrays and objects, counted without recursion
    (brackets inside strings do not count)."""
    if b'\\"' in data:  # an escaped quote: find the strings by their grammar (slower)
        outside = _JSON_STRING.sub(b"", data)
    else:  # every '"' opens or closes a string
        marks = data.translate(None, _NOT_BRACKET_OR_QUOTE).replace(b'""', b"")
        # No quote left: every run of quotes was even, so no bracket sits between an
        # opening and a closing quote (the usual case, and fast); else split them off.
        outside = marks if b'"' not in marks else b"".join(data.split(b'"')[0::2])
    steps = outside.translate(_DEPTH_STEP, _NOT_BRACKET)
    return max(itertools.accumulate(array.array("b", steps)), default=0)


def _bad_strings(values: Any) -> Optional[str]:
    """Why a string among ``values`` (and inside their arrays; objects are
    checked when built) is refused: U+0000 or a lone UTF-16 surrogate."""
    stack = [values]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if "\x00" in v:
                return "\\u0000 in a string"
            if _SURROGATE.search(v):
                return "a lone UTF-16 surrogate escape in a string"
        elif isinstance(v, list):
            stack.extend(v)
    return None


def _checked_object(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    # every pair, duplicates included: the C reader parses (and checks) values that a later
    # duplicate key hides
    bad = _bad_strings([k for k, _ in pairs]) or _bad_strings([v for _, v in pairs])
    if bad:
        raise ValueError(bad)
    return dict(pairs)


def strict_json_loads(data: Union[bytes, str]) -> Any:
    """``json.loads`` with the C reader's rules: strict UTF-8, no byte order
    mark, no NaN/Infinity, no number that overflows to infinity (an integer
    beyond int64 becomes a double, as there), no ``\\u0000`` or lone surrogate,
    nesting at most MAX_JSON_DEPTH. ValueError (UnicodeDecodeError and
    JSONDecodeError are ValueErrors) says why not."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")  # a lone surrogate fails the decode below
    text = data.decode("utf-8")
    depth = _max_depth(data)
    if depth > MAX_JSON_DEPTH:
        raise ValueError(f"nesting {depth} deep, deeper than {MAX_JSON_DEPTH}")
    # The hooks cost a Python call each: used only where the text can need them.
    escapes = b"\\u" in data  # only a \u escape puts U+0000 or a surrogate in a string
    long_ints = b"1" * _INT64_DIGITS in data.translate(_DIGIT_MARKS)
    doc = json.loads(text, parse_constant=_no_constant, parse_float=_finite,
                     parse_int=_int_or_double if long_ints else None,
                     object_pairs_hook=_checked_object if escapes else None)
    bad = _bad_strings(doc) if escapes else None
    if bad:
        raise ValueError(bad)
    return doc


def _json_int(v: Any) -> Optional[int]:
    """``v`` as the C reader's integer (aotr_json_int): a JSON number with an
    integral value in int64 (``4`` or ``4.0``, never ``true``), else None."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v if -_I64 <= v < _I64 else None
    if isinstance(v, float) and v.is_integer() and -_I64 <= v < _I64:
        return int(v)
    return None


def _int_in(obj: Mapping[str, Any], name: str, lo: int, hi: int) -> bool:
    v = _json_int(obj.get(name))
    return v is not None and lo <= v <= hi


def _nonempty_str(v: Any) -> bool:
    return isinstance(v, str) and v != ""


def _record_problem(d: Any, i: int, blob_size: int) -> Optional[str]:
    """Why kernel record ``i`` is refused (archive.c parse_record, plus the
    fields only this reader uses), or None."""
    if not isinstance(d, dict):
        return f"kernel record {i} is not an object (it is {_json_type(d)})"
    key = d.get("key")
    if not _nonempty_str(key):
        return f"kernel record {i} has no key (a non-empty string)"
    k = clip(key, 120)
    for name in ("kernel", "symbol"):
        if not _nonempty_str(d.get(name)):
            return f"kernel {k!r}: no {name} (a non-empty string)"
    for name in ("functional", "config", "constexprs"):
        if not isinstance(d.get(name), dict):
            return f"kernel {k!r}: {name} is not an object (it is {_json_type(d.get(name))})"
    f, c = d["functional"], d["config"]
    if f.get("dtype") not in _DTYPES:
        return (f"kernel {k!r}: functional dtype {clip(f.get('dtype'), 40)!r} is not one of "
                f"{', '.join(_DTYPES)}")
    if not _int_in(f, "head_dim", 1, _I32):
        return f"kernel {k!r}: functional head_dim is missing or not a positive integer"
    for name in _FLAGS:
        if name in f and not (isinstance(f[name], bool) or _json_int(f[name]) in (0, 1)):
            return f"kernel {k!r}: functional {name} must be true or false"
    for name in ("BLOCK_M", "BLOCK_N", "MIN_SEQLEN"):
        if name in c and not _int_in(c, name, 1, _I32):
            return f"kernel {k!r}: config {name} is not a positive integer"
    for name, lo, hi in (("num_warps", 1, 1024), ("num_stages", 0, 1024), ("warp_size", 1, 1024),
                         ("shared", 0, _U32), ("global_scratch_size", 0, _U32),
                         ("profile_scratch_size", 0, _U32), ("offset", 0, _I64 - 1),
                         ("compressed_size", 0, _I64 - 1), ("size", 0, MAX_CODE_SIZE)):
        if not _int_in(d, name, lo, hi):
            return f"kernel {k!r}: {name} is missing or not an integer in [{lo}, {hi}]"
    args = d.get("args")
    if not isinstance(args, list):
        return f"kernel {k!r}: args is not a list"
    for j, pair in enumerate(args):
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
            return f"kernel {k!r}: argument {j} is not a [name, type] pair"
        t = pair[1]
        if not ((t.startswith("*") and len(t) > 1) or t in _SCALAR_ARGS):
            return (f"kernel {k!r}: argument {clip(pair[0], 40)!r} has type {clip(t, 40)!r}, which "
                    f"the runtime cannot pass (known: *<type>, i32, i64, fp32)")
    for name in ("divisible_16", "grid"):
        v = d.get(name)
        if not (isinstance(v, list) and all(isinstance(x, str) for x in v)):
            return f"kernel {k!r}: {name} is not a list of strings"
    if d.get("stats") is not None and not isinstance(d["stats"], dict):
        return f"kernel {k!r}: stats is not an object"
    if not (isinstance(d.get("sha256"), str) and _SHA256_HEX.match(d["sha256"])):
        return f"kernel {k!r}: sha256 is not 64 lowercase hex digits"
    if _json_int(d["offset"]) + _json_int(d["compressed_size"]) > blob_size:
        return f"kernel {k!r} points outside the blob region"
    return None


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    return {dict: "an object", list: "a list", str: "a string"}.get(type(v), "a number")


def _index_problem(index: Any, version: int, blob_size: int) -> Optional[str]:
    """Why a parsed index is refused (archive.c open_archive), or None."""
    if not isinstance(index, dict):
        return f"the index is {_json_type(index)}, not an object"
    m, kernels = index.get("manifest"), index.get("kernels")
    if not isinstance(m, dict):
        return f"the index has no manifest object (\"manifest\" is {_json_type(m)})"
    if not isinstance(kernels, list):
        return f"the index has no kernels list (\"kernels\" is {_json_type(kernels)})"
    if not kernels:
        return "the index lists no kernels (an empty image)"
    missing = [k for k in MANIFEST_KEYS if k not in m]
    if missing:
        return f"manifest lacks {', '.join(missing)}"
    if _json_int(m["format_version"]) != version:
        return (f"the manifest's format_version {clip(m['format_version'], 40)!r} does not match "
                f"the header's (format {version})")
    for name in ("arch", "abi_version"):
        if not isinstance(m[name], str):
            return f"manifest {name} must be a string (it is {_json_type(m[name])})"
    for i, d in enumerate(kernels):
        bad = _record_problem(d, i, blob_size)
        if bad:
            return bad
    seen = set()
    for d in kernels:
        if d["key"] in seen:
            return f"kernel key {clip(d['key'], 120)!r} appears twice"
        seen.add(d["key"])
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


# -- writing ---------------------------------------------------------------


def _json_bytes(obj: Any) -> bytes:
    """Compact JSON (the archive index)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=True).encode("utf-8")


def _sidecar_bytes(doc: Dict[str, Any]) -> bytes:
    """Readable JSON: top-level keys indented, one kernel record per line."""
    lines = ["{"]
    items = list(doc.items())
    for i, (k, v) in enumerate(items):
        comma = "," if i < len(items) - 1 else ""
        if k == "kernels":
            lines.append(f' "{k}": [')
            for j, rec in enumerate(v):
                sep = "," if j < len(v) - 1 else ""
                lines.append("  " + json.dumps(rec, ensure_ascii=True) + sep)
            lines.append(" ]" + comma)
        else:
            body = json.dumps(v, indent=1, ensure_ascii=True).replace("\n", "\n ")
            lines.append(f' "{k}": {body}{comma}')
    lines.append("}")
    return ("\n".join(lines) + "\n").encode("utf-8")


def write_archive(path: PathLike, manifest: Mapping[str, Any],
                  kernels: Sequence[Tuple[KernelRecord, bytes]], *,
                  preset: int = 6) -> Tuple[Dict[str, Any], List[KernelRecord]]:
    """Write ``<arch>.aotr`` atomically (temp file + rename).

    ``kernels`` pairs a record (offset/sizes/sha256 are filled here) with its
    uncompressed code object. ``manifest`` must hold every key of
    MANIFEST_KEYS except ``blob_sha256`` and ``format_version`` (filled here).
    Returns the final manifest and records. Output is deterministic: the same
    inputs give byte-identical files.
    """
    p = Path(path)
    if not kernels:
        raise ValueError(f"{p}: no kernels to write (the readers refuse an empty image)")
    seen = set()
    records: List[KernelRecord] = []
    blobs: List[bytes] = []
    offset = 0
    for rec, code in kernels:
        if rec.key in seen:
            raise ValueError(f"duplicate kernel key {rec.key!r}")
        seen.add(rec.key)
        blob = lzma.compress(bytes(code), format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64,
                             preset=preset)
        records.append(rec.replace(offset=offset, compressed_size=len(blob), size=len(code),
                                   sha256=hashlib.sha256(code).hexdigest()))
        blobs.append(blob)
        offset += len(blob)
    blob_hash = hashlib.sha256()
    for b in blobs:
        blob_hash.update(b)
    man = dict(manifest)
    man["format_version"] = FORMAT_VERSION
    man["blob_sha256"] = blob_hash.hexdigest()
    # ABI record (docs/ABI.md): format version, ABI line, per-kernel arg-list hashes.
    man["abi"] = kernel_abi_section(records, FORMAT_VERSION, str(man.get("abi_version", "")))
    missing = [k for k in MANIFEST_KEYS if k not in man]
    if missing:
        raise ValueError(f"manifest lacks {', '.join(missing)}")
    index_bytes = _json_bytes({"manifest": man, "kernels": [r.to_dict() for r in records]})
    blob_offset = HEADER_SIZE + len(index_bytes)
    header = _HEADER.pack(MAGIC, FORMAT_VERSION, HEADER_SIZE, len(index_bytes), blob_offset,
                          offset, hashlib.sha256(index_bytes).digest())

    def write(f):
        f.write(header)
        f.write(index_bytes)
        for b in blobs:
            f.write(b)

    atomic_write(p, write)
    return man, records


def write_manifest_sidecar(archive_path: PathLike, manifest_path: Optional[PathLike] = None) -> Path:
    """Write ``<arch>.manifest.json`` for an existing archive (atomically)."""
    ap = Path(archive_path)
    mp = Path(manifest_path) if manifest_path is not None else manifest_path_for(ap)
    a = Archive.open(ap)
    doc = {
        "manifest": a.manifest,
        "archive": {"file": ap.name, "sha256": file_sha256(ap), "size": ap.stat().st_size},
        "kernels": [r.to_dict(with_location=False) for r in a.kernels],
    }
    atomic_write(mp, lambda f: f.write(_sidecar_bytes(doc)))
    return mp


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

IDENTITY_CONTEXTS = ("installed", "build")


def _arch_from_name(name: str, suffix: str) -> Optional[str]:
    return name[: -len(suffix)] if name.endswith(suffix) and len(name) > len(suffix) else None


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
