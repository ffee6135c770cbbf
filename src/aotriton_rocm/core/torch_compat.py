"""Torch compatibility matrix: which torch versions each ABI line supports.

Runtime module, standard library only (torch's version is passed in, or read
from an already imported torch). The data is ``torch_compat.json`` beside this
file, shipped in the wheel. :func:`check_torch` is what :func:`aotriton_rocm.enable`
calls; :func:`render_table` is the table in README.md (a test keeps them equal);
``aotriton-rocm pin --torch A.B`` reads :func:`lines_for_torch`.

A torch newer than the table is not refused by its number alone: where every
op and function of torch that we bind (:data:`BOUND_OPS`,
:data:`CALLED_FUNCTIONS`) has the schema it has in a tested torch
(``torch_schemas.json``, written from real torch builds by ``python -m
aotriton_rocm.tooling.release.torch_schemas``), it runs, with a one-time
warning; otherwise it is refused, naming what changed.
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
    "BOUND_OPS",
    "CALLED_FUNCTIONS",
    "torch_interface",
    "load_interfaces",
    "interface_changes",
]

# the package data files beside aotriton_rocm/__init__.py
DATA_FILE = Path(__file__).parents[1] / "torch_compat.json"
SCHEMAS_FILE = Path(__file__).parents[1] / "torch_schemas.json"
ALLOW_ENV = "AOTRITON_ROCM_ALLOW_UNSUPPORTED_TORCH"
TABLE_BEGIN = "<!-- torch-compat table: generated from src/aotriton_rocm/torch_compat.json -->"
TABLE_END = "<!-- end of torch-compat table -->"

_MINOR = re.compile(r"^\s*(\d+)\.(\d+)")

# Every aten op aotriton-rocm binds, on any route: those it overrides (the
# Python overrides, the C++ extension's six) and those it calls (torch < 2.9's
# fallbacks, the dropout state under CUDA-graph capture).
BOUND_OPS = (
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_flash_attention_forward", "_flash_attention_backward",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward",
    "_efficient_attention_forward", "_efficient_attention_backward",
    "_fill_mem_eff_dropout_mask_",
)
# torch's functions it calls to put them on the dispatcher (the flash
# registry, torch.library), by their path under ``torch``.
CALLED_FUNCTIONS = (
    "nn.attention.register_flash_attention_impl", "nn.attention.activate_flash_attention_impl",
    "nn.attention.current_flash_attention_impl", "nn.attention.restore_flash_attention_impl",
    "library.get_kernel", "library.Library.__init__", "library.Library.define",
    "library.Library.impl", "library.Library._destroy",
)


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
        from .._version import ABI_VERSION as line
    entry = _line(line, data or load())
    return sorted(entry["torch"], key=_key) if entry else []


def lines_for_torch(torch_version: str, *, data: Optional[Dict[str, Any]] = None) -> List[str]:
    """ABI lines supporting ``torch_version``, newest first."""
    minor = torch_minor(torch_version)
    return sorted((e["line"] for e in (data or load())["lines"] if minor in e["torch"]),
                  key=_key, reverse=True)


def _walk(root: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        root = getattr(root, part, None)
        if root is None:
            return None
    return root


def _parameters(fn: Any) -> Optional[str]:
    """``fn``'s parameters as a call sees them: names, kinds and defaults,
    without annotations (a widened type hint changes no call)."""
    import inspect

    if fn is None:
        return None
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return "(signature unreadable)"
    params = [p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()]
    return str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty))


def torch_interface(torch_module: Any = None) -> Dict[str, Dict[str, Optional[str]]]:
    """What ``torch_module`` (default: the imported torch) offers of what we
    bind: each of :data:`BOUND_OPS`'s schema (``str(op.default._schema)``) and
    each of :data:`CALLED_FUNCTIONS`'s parameters; None where it has none.
    Cheap (no torch import beyond what ``import torch`` loaded)."""
    torch_module = torch_module or sys.modules["torch"]
    ops = {}
    for op in BOUND_OPS:
        try:
            ops[op] = str(getattr(torch_module.ops.aten, op).default._schema)
        except (AttributeError, RuntimeError):
            ops[op] = None
    functions = {name: _parameters(_walk(torch_module, name)) for name in CALLED_FUNCTIONS}
    return {"ops": ops, "functions": functions}


@functools.lru_cache(maxsize=None)
def _load_interfaces_file(path: str) -> Dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    tested = data.get("tested") if isinstance(data, dict) else None
    if not isinstance(tested, dict) or data.get("schema") != 1 or not all(
            re.fullmatch(r"\d+\.\d+", v) and isinstance(e, dict) and "ops" in e and "functions" in e
            for v, e in tested.items()):
        raise ValueError(f"{path}: not a table of tested torch interfaces (schema 1); regenerate "
                         "it with python -m aotriton_rocm.tooling.release.torch_schemas")
    return data


def load_interfaces(path: Optional[os.PathLike] = None) -> Dict[str, Any]:
    """``torch_schemas.json``: per tested torch (major.minor), its :func:`torch_interface`."""
    return _load_interfaces_file(str(path or SCHEMAS_FILE))


def interface_changes(reference: Dict[str, Any], current: Dict[str, Any]) -> List[str]:
    """What differs between two :func:`torch_interface` results, each named
    as a user would look it up (``aten::<op>``, ``torch.<function>``)."""
    changes = []
    for kind, prefix, what in (("ops", "aten::", "schema"), ("functions", "torch.", "signature")):
        ref, cur = reference.get(kind, {}), current.get(kind, {})
        for name in sorted(set(ref) | set(cur)):
            if ref.get(name) == cur.get(name):
                continue
            if cur.get(name) is None:
                changes.append(f"{prefix}{name} (gone)")
            elif ref.get(name) is None:
                changes.append(f"{prefix}{name} (new)")
            else:
                changes.append(f"{prefix}{name} ({what} changed)")
    return changes


def _untested_changes() -> tuple:
    """(tested minor whose interface the imported torch has, []), or (newest
    tested minor, what differs from it)."""
    try:
        tested = load_interfaces()["tested"]
    except (OSError, ValueError) as exc:
        return "", [f"(its table of tested torch interfaces is unreadable: {exc}; reinstall "
                    "aotriton-rocm)"]
    current = torch_interface()
    for v in sorted(tested, key=_key, reverse=True):
        if not interface_changes(tested[v], current):
            return v, []
    if not tested:
        return "", ["(no tested torch interfaces are recorded)"]
    newest = max(tested, key=_key)
    return newest, interface_changes(tested[newest], current)


_noted_untested: set = set()


def _note_untested(torch_version: str, same_as: str, supported: List[str]) -> None:
    if torch_version in _noted_untested:
        return
    _noted_untested.add(torch_version)
    import warnings

    from .._version import __version__

    warnings.warn(
        f"aotriton-rocm {__version__} was not tested with torch {torch_version} (tested: "
        f"{supported[0]}-{supported[-1]}); it runs because the {len(BOUND_OPS)} ops and "
        f"{len(CALLED_FUNCTIONS)} torch functions it binds have the schemas and signatures they "
        f"have in torch {same_as}. "
        "If results look wrong, compare with torch's own kernels (aotriton_rocm.disable()) and "
        "report it", stacklevel=4)


def _fixes(minor: str, supported: List[str]) -> List[str]:
    others = lines_for_torch(minor)
    fixes = [f"install a supported torch ({', '.join('torch==' + v + '.*' for v in supported[-2:])}, "
             "from the wheel index of your ROCm version)" if supported else
             "install a supported torch"]
    if others:
        fixes.append(f"or install the aotriton-rocm release for torch {minor}: "
                     f"pip install 'aotriton-rocm~={others[0]}.0' (see `aotriton-rocm pin --torch {minor}`)")
    elif supported and _key(minor) > _key(supported[-1]):
        fixes.append(f"or upgrade to an aotriton-rocm release that lists torch {minor} "
                     "(pip install -U aotriton-rocm)")
    fixes.append(f"or set {ALLOW_ENV}=1 to try anyway (untested; wrong results are possible)")
    return fixes


def check_torch(torch_version: Optional[str] = None, *, line: Optional[str] = None) -> None:
    """Raise :class:`UnsupportedTorchError` unless ``torch_version`` (default:
    the imported torch's) is supported by ABI line ``line`` (default: ours).

    A torch newer than our line's newest passes where the imported torch's
    :func:`torch_interface` equals a tested torch's (a one-time warning says
    it is untested), and is refused naming what differs otherwise.
    ``AOTRITON_ROCM_ALLOW_UNSUPPORTED_TORCH=1`` turns a refusal into a warning.
    """
    from .._version import ABI_VERSION, __version__

    line = line or ABI_VERSION
    if torch_version is None:
        torch_version = str(sys.modules["torch"].__version__)
    minor = torch_minor(torch_version)
    supported = supported_torch(line)
    if minor in supported:
        return
    why = f"it supports torch {', '.join(supported) or '(none listed)'}"
    if supported and line == ABI_VERSION and _key(minor) > _key(supported[-1]) \
            and "torch" in sys.modules:
        same_as, changes = _untested_changes()
        if not changes:
            _note_untested(torch_version, same_as, supported)
            return
        why = f"it was tested up to torch {supported[-1]}, " + (
            f"and what it binds differs in this torch from torch {same_as}: {', '.join(changes)}"
            if same_as else " ".join(changes))
    msg = (f"aotriton-rocm {__version__} does not support torch {torch_version}: {why}. "
           "To fix: " + "; ".join(_fixes(minor, supported)) + ".")
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
