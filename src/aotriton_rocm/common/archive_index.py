"""The index of a kernel archive (:mod:`.archive`) under the rules of the
runtime's C reader (native/src/json.c, archive_index.c): strict RFC 8259 JSON,
nesting up to 64, the same field types and ranges for the kernel records.
Standard library only.
"""
from __future__ import annotations

import array
import itertools
import json
import math
import re
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

__all__ = ["clip", "strict_json_loads", "MANIFEST_KEYS", "MAX_JSON_DEPTH", "MAX_INDEX_SIZE", "MAX_CODE_SIZE"]


def clip(value: object, limit: int = 200) -> str:
    """``str(value)`` cut to ``limit`` characters (values read from a damaged
    file go into one-line messages)."""
    text = str(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more characters)"


# Python's json accepts more than RFC 8259 (NaN, Infinity, numbers that overflow
# to inf, lone surrogate escapes, \u0000, any depth up to a RecursionError). The
# runtime's C reader refuses those, so this reader refuses them too: an archive
# one reader takes and the other refuses would pass `validate` and fail on the GPU.

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

MAX_JSON_DEPTH = 64                # json.c MAX_DEPTH
MAX_INDEX_SIZE = 256 << 20         # archive.c MAX_INDEX_SIZE
MAX_CODE_SIZE = 1 << 30            # archive_index.c MAX_CODE_SIZE
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
    """Why kernel record ``i`` is refused (archive_index.c parse_record, plus the
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
    """Why a parsed index is refused (archive_index.c aotr_archive_parse_index), or None."""
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
