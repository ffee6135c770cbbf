"""Where the aotriton-rocm checkout is, and what it says its version is.

Build-time only. The one rule for the source root: the nearest directory at
or above the start whose ``pyproject.toml`` names the project
``aotriton-rocm``.
"""
from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import Optional

try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib  # type: ignore[no-redef]

from ...common.errors import UsageError

__all__ = ["PROJECT_NAME", "SourceTreeError", "find_source_root", "version_file", "read_version"]

PROJECT_NAME = "aotriton-rocm"


class SourceTreeError(UsageError):
    """No checkout where one was looked for, or its version cannot be read."""


def _is_project_root(d: Path) -> bool:
    pp = d / "pyproject.toml"
    if not pp.is_file():
        return False
    try:
        doc = tomllib.loads(pp.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return False
    return (doc.get("project") or {}).get("name") == PROJECT_NAME


def find_source_root(start: Optional[os.PathLike] = None) -> Path:
    """The checkout root: walk up from ``start`` (default: cwd) to the directory
    whose pyproject.toml has ``name = "aotriton-rocm"``."""
    here = Path(start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if _is_project_root(d):
            return d
    raise SourceTreeError(
        f"cannot find the aotriton-rocm source tree: no pyproject.toml with "
        f'name = "{PROJECT_NAME}" in {here} or any parent. Run from a checkout of '
        f"aotriton-rocm, or pass --source-root /path/to/checkout")


def version_file(source_root: os.PathLike) -> Path:
    return Path(source_root) / "src" / "aotriton_rocm" / "_version.py"


def read_version(source_root: os.PathLike) -> str:
    """``__version__`` of the tree's ``_version.py``, read without importing it
    (the tree being packaged need not be the one that is running). Not
    checked: see :func:`naming.check_final_version` for what may ship."""
    path = version_file(source_root)
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    except OSError as e:
        raise SourceTreeError(f"cannot read the version: {e}") from e
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "__version__"
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            return node.value.value
    raise SourceTreeError(f"{path}: no literal __version__ = \"X.Y.Z\"")
