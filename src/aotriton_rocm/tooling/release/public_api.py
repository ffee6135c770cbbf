"""The public Python API of a release, as data: the content of the runtime
wheel's ``aotriton_rocm/abi.json`` (docs/ABI.md), which ``abi-check``
compares between releases.

Build-time only. :func:`public_api` imports the package it describes (and so
torch); ``package`` runs it in a subprocess against the tree being packaged
(``python -m aotriton_rocm.tooling.release.public_api --write FILE``).
"""
from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from ..package.naming import conda_run_exports

__all__ = ["ABI_JSON", "public_api", "write_abi_json"]

ABI_JSON = "abi.json"
SCHEMA = 1


def _param(p: inspect.Parameter) -> Dict[str, Any]:
    d: Dict[str, Any] = {"name": p.name, "kind": p.kind.name}
    if p.default is not inspect.Parameter.empty:
        d["default"] = repr(p.default)
    return d


def _describe_callable(fn: Any) -> Dict[str, Any]:
    sig = inspect.signature(fn)
    return {"kind": "function", "signature": f"{getattr(fn, '__name__', '?')}{sig}",
            "params": [_param(p) for p in sig.parameters.values()]}


def _smoke_cli() -> Dict[str, Any]:
    """The ``smoke`` command's options, from the table its parser is built from."""
    from ...commands.smoke import SMOKE_FLAGS

    options = {f.name: {"takes_value": f.takes_value,
                        "choices": sorted(map(str, f.choices)) if f.choices else None}
               for f in SMOKE_FLAGS}
    return {"smoke": {"options": options}}


def public_api() -> Dict[str, Any]:
    """The ABI description of the running package (the content of ``abi.json``)."""
    import aotriton_rocm as pkg

    from ...core import torch_compat
    from ...common.archive import FORMAT_VERSION

    functions: Dict[str, Any] = {}
    constants: Dict[str, Any] = {}
    for name in sorted(pkg.__all__):
        obj = getattr(pkg, name)
        if callable(obj):
            functions[name] = _describe_callable(obj)
        else:
            constants[name] = obj
    version = str(pkg.__version__)
    return {
        "schema": SCHEMA,
        "package_version": version,
        "abi_line": str(pkg.ABI_VERSION),
        "archive_format_version": FORMAT_VERSION,
        "functions": functions,
        "constants": {k: v for k, v in constants.items() if k not in ("__version__", "ABI_VERSION")},
        "cli": _smoke_cli(),
        "torch": torch_compat.supported_torch(str(pkg.ABI_VERSION)),
        "conda_run_exports": conda_run_exports(version),
    }


def write_abi_json(path: "str | Path") -> Path:
    p = Path(path)
    p.write_text(json.dumps(public_api(), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--write"] and len(args) == 2:
        write_abi_json(args[1])
        return 0
    print(json.dumps(public_api(), indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
