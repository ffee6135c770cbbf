"""Where the installed C library, its header and its CMake / pkg-config files
are (``aotriton-rocm config`` prints them: config_command.py).

Standard library only: ``config`` and the runtime import this at start.

Two layouts, the same tree under a root (``lib/``, ``lib/cmake/aotriton_rocm/``,
``lib/pkgconfig/``, ``include/aotriton_rocm/``):

* wheel (and editable install): the root is the package, ``site-packages/aotriton_rocm/``;
* conda: the root is the environment, ``$PREFIX`` (the conda package keeps one
  copy of the library, in ``$PREFIX/lib``, where C and C++ programs and the
  archive search of the library expect it; none in site-packages).
"""

from __future__ import annotations

import sys
from pathlib import Path

from .._version import ABI_VERSION
from .errors import UsageError

SONAME = f"libaotriton_rocm.so.{ABI_VERSION}"
_PACKAGE = Path(__file__).resolve().parents[1]  # aotriton_rocm/ (this module is in common/)


def install_root() -> Path:
    """The package's own directory when it holds ``lib/<soname>``, else
    ``sys.prefix`` when that does (conda), else the package's directory."""
    if not (_PACKAGE / "lib" / SONAME).exists() and (Path(sys.prefix) / "lib" / SONAME).exists():
        return Path(sys.prefix)
    return _PACKAGE


# AOTriton's C++ API (libaotriton_v2, native/aotriton_api/): one library per
# API line, under lib/aotriton_api/<line>/ and include/aotriton_api/<line>/.
# The 0.12 line shares the 0.13 line's params (attn_fwd 3, attn_bwd 6); the
# 0.14 line (params 4/7, VarlenBits) also takes 0.12/0.13 callers' params.
AOTRITON_API_VERSIONS = {"0.11": "0.11.2", "0.13": "0.13.0", "0.14": "0.14.0"}
AOTRITON_API_LINE_OF = {"0.11": "0.11", "0.12": "0.13", "0.13": "0.13", "0.14": "0.14"}


def aotriton_api_line(version: str) -> str:
    """Our API line serving AOTriton ``version`` (``0.12.0``, ``0.11``, ...)."""
    line = AOTRITON_API_LINE_OF.get(".".join(version.split(".")[:2]))
    if line is None:
        raise UsageError(f"AOTriton {version} is not an API line aotriton-rocm implements "
                           f"(it implements {', '.join(sorted(AOTRITON_API_LINE_OF))})")
    return line


def aotriton_api_library(line: str) -> Path:
    """``libaotriton_v2.so.<version>`` of our API ``line`` ("0.11", "0.13" or "0.14")."""
    return install_root() / "lib" / "aotriton_api" / line / f"libaotriton_v2.so.{AOTRITON_API_VERSIONS[line]}"


def aotriton_api_include(line: str) -> Path:
    """The include directory holding ``aotriton/*.h`` of our API ``line``."""
    return install_root() / "include" / "aotriton_api" / line


def locations() -> dict:
    root = install_root()
    return {"cmakedir": root / "lib" / "cmake" / "aotriton_rocm",
            "includedir": root / "include",
            "libdir": root / "lib",
            "pkgconfigdir": root / "lib" / "pkgconfig",
            "library": root / "lib" / SONAME}
