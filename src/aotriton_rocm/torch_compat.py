"""Torch compatibility matrix: which torch versions each ABI line supports.

Runtime module, standard library only (torch's version is passed in, or read
from an already imported torch). The data is ``torch_compat.json`` beside this
file, shipped in the wheel. :func:`check_torch` is what :func:`aotriton_rocm.enable`
calls; :func:`render_table` is the table in README.md (a test keeps them equal);
``aotriton-rocm pin --torch A.B`` reads :func:`lines_for_torch`.
"""
from __future__ import annotations

import functools
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

__all__ = [
    "ALLOW_ENV",
    "UnsupportedTorchError",
    "load",
    "torch_minor",
    "supported_torch",
    "lines_for_torch",
    "check_torch",
    "render_table",
    "TABLE_BEGIN",
    "TABLE_END",
]

DATA_FILE = Path(__file__).with_name("torch_compat.json")
ALLOW_ENV = "AOTRITON_ROCM_ALLOW_UNSUPPORTED_TORCH"
TABLE_BEGIN = "<!-- torch-compat table: generated from src/aotriton_rocm/torch_compat.json -->"
TABLE_END = "<!-- end of torch-compat table -->"

_MINOR = re.compile(r"^\s*(\d+)\.(\d+)")


class UnsupportedTorchError(RuntimeError):
    """The running torch is not one this release supports."""


@functools.lru_cache(maxsize=None)
def _load_file(path: str) -> Dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if data.get("schema") != 1 or not isinstance(data.get("lines"), list):
        raise ValueError(f"{path}: not a torch compatibility matrix (schema 1)")
    for entry in data["lines"]:
        for v in entry["torch"]:
            if not re.fullmatch(r"\d+\.\d+", v):
                raise ValueError(f"{path}: torch version {v!r} is not major.minor")
    return data


def load(path: Optional[os.PathLike] = None) -> Dict[str, Any]:
    return _load_file(str(path or DATA_FILE))


def _key(v: str) -> tuple:
    return tuple(int(x) for x in v.split("."))


def torch_minor(version: str) -> str:
    """``2.11.0+rocm6.4`` / ``2.13.0a0+git1234`` -> ``2.11`` / ``2.13``."""
    m = _MINOR.match(str(version))
    if not m:
        raise ValueError(f"cannot read a torch version from {version!r}")
    return f"{int(m.group(1))}.{int(m.group(2))}"


def _line(line: str, data: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    return next((e for e in data["lines"] if e["line"] == line), None)


def supported_torch(line: Optional[str] = None, *, data: Optional[Dict[str, Any]] = None) -> List[str]:
    """Torch major.minor versions ABI line ``line`` (default: this package's) supports."""
    if line is None:
        from ._version import ABI_VERSION as line
    entry = _line(line, data or load())
    return sorted(entry["torch"], key=_key) if entry else []


def lines_for_torch(torch_version: str, *, data: Optional[Dict[str, Any]] = None) -> List[str]:
    """ABI lines supporting ``torch_version``, newest first."""
    minor = torch_minor(torch_version)
    return sorted((e["line"] for e in (data or load())["lines"] if minor in e["torch"]),
                  key=_key, reverse=True)


def check_torch(torch_version: Optional[str] = None, *, line: Optional[str] = None) -> None:
    """Raise :class:`UnsupportedTorchError` unless ``torch_version`` (default:
    the imported torch's) is supported by ABI line ``line`` (default: ours).

    ``AOTRITON_ROCM_ALLOW_UNSUPPORTED_TORCH=1`` turns the refusal into a warning.
    """
    from ._version import ABI_VERSION, __version__

    line = line or ABI_VERSION
    if torch_version is None:
        torch_version = str(sys.modules["torch"].__version__)
    minor = torch_minor(torch_version)
    supported = supported_torch(line)
    if minor in supported:
        return
    others = lines_for_torch(minor)
    fixes = [f"install a supported torch ({', '.join('torch==' + v + '.*' for v in supported[-2:])}, "
             "from the wheel index of your ROCm version)" if supported else
             "install a supported torch"]
    if others:
        fixes.append(f"or install the aotriton-rocm release for torch {minor}: "
                     f"pip install 'aotriton-rocm~={others[0]}.0' (see `aotriton-rocm pin --torch {minor}`)")
    fixes.append(f"or set {ALLOW_ENV}=1 to try anyway (untested; wrong results are possible)")
    msg = (f"aotriton-rocm {__version__} does not support torch {torch_version}: it supports torch "
           f"{', '.join(supported) or '(none listed)'}. To fix: " + "; ".join(fixes) + ".")
    if os.environ.get(ALLOW_ENV, "") == "1":
        import warnings

        warnings.warn(msg.split(" To fix:")[0] + f" ({ALLOW_ENV}=1: going ahead anyway)", stacklevel=3)
        return
    raise UnsupportedTorchError(msg)


def render_table(data: Optional[Dict[str, Any]] = None) -> str:
    """The README's torch compatibility table (markdown, between the markers)."""
    data = data or load()
    columns = sorted({v for e in data["lines"] for v in e["torch"]}, key=_key)
    rows = [TABLE_BEGIN,
            "| aotriton-rocm | " + " | ".join(f"torch {v}" for v in columns) + " |",
            "|---" * (len(columns) + 1) + "|"]
    for e in sorted(data["lines"], key=lambda e: _key(e["line"]), reverse=True):
        tested = e.get("tested", {})
        cells = []
        for v in columns:
            if v not in e["torch"]:
                cells.append("no")
            elif v in tested:
                cells.append(f"yes, tested: {tested[v]}")
            else:
                cells.append("yes")
        rows.append(f"| {e['line']}.x | " + " | ".join(cells) + " |")
    notes = [f"{e['line']}.x: {e['note']}" for e in data["lines"] if e.get("note")]
    if notes:
        rows.append("")
        rows.append("Notes: " + "; ".join(notes) + ".")
    rows.append(TABLE_END)
    return "\n".join(rows) + "\n"
