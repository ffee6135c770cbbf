"""What the ABI of a release is, as data (see docs/ABI.md).

Runtime module: standard library at import time. :func:`public_api` imports
the package (and so torch) to read the public signatures.

Two records are written at build/package time:

* every archive manifest carries ``"abi"`` (:func:`kernel_abi_section`): the
  archive format version, the ABI line and a sha256 per kernel name over its
  set of (functional key, ordered argument list) pairs, plus one over all;
* the runtime wheel carries ``aotriton_rocm/abi.json`` (:func:`public_api`,
  written by :func:`write_abi_json`): the public functions' signatures,
  public constants, the ``smoke`` command's options, the supported torch
  versions and the conda ``run_exports`` pin.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

__all__ = [
    "ABI_JSON",
    "SCHEMA",
    "functional_key",
    "kernel_abi_entries",
    "kernel_abi_section",
    "public_api",
    "write_abi_json",
    "conda_run_exports",
]

ABI_JSON = "abi.json"
SCHEMA = 1


def functional_key(functional: Mapping[str, Any]) -> str:
    """Canonical text of a functional point: ``dtype=fp16,head_dim=64`` (sorted)."""
    return ",".join(f"{k}={json.dumps(functional[k], sort_keys=True)}" for k in sorted(functional))


def _args_of(record: Any) -> Tuple[Tuple[str, str], ...]:
    args = record["args"] if isinstance(record, Mapping) else record.args
    return tuple((str(n), str(t)) for n, t in args)


def _field(record: Any, name: str) -> Any:
    return record[name] if isinstance(record, Mapping) else getattr(record, name)


def kernel_abi_entries(records: Iterable[Any]) -> Dict[str, Dict[str, List[List[str]]]]:
    """``{kernel: {functional key: ordered [name, type] args}}`` from kernel
    records (``KernelRecord`` or their dicts). Several configs of one
    functional point must agree on the argument list (ValueError otherwise)."""
    out: Dict[str, Dict[str, List[List[str]]]] = {}
    for r in records:
        kernel = str(_field(r, "kernel"))
        fk = functional_key(_field(r, "functional"))
        args = [list(a) for a in _args_of(r)]
        seen = out.setdefault(kernel, {}).get(fk)
        if seen is not None and seen != args:
            raise ValueError(f"kernel {kernel} [{fk}]: configs disagree on the argument list")
        out[kernel][fk] = args
    return out


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def kernel_abi_section(records: Iterable[Any], format_version: int, abi_line: str) -> Dict[str, Any]:
    """The manifest's ``"abi"`` object."""
    entries = kernel_abi_entries(records)
    per_kernel = {k: _hash(sorted([fk, args] for fk, args in v.items())) for k, v in sorted(entries.items())}
    return {
        "schema": SCHEMA,
        "format_version": int(format_version),
        "abi_line": str(abi_line),
        "kernels": per_kernel,
        "kernels_sha256": _hash(per_kernel),
    }


def conda_run_exports(version: str) -> str:
    """``X.Y.Z`` -> ``aotriton-rocm >=X.Y.Z,<X.(Y+1).0a0`` (what recipe.yaml exports)."""
    x, y = version.split("+", 1)[0].split(".")[:2]
    return f"aotriton-rocm >={version.split('+', 1)[0]},<{x}.{int(y) + 1}.0a0"


# -- public Python API --------------------------------------------------------

def _param(p: Any) -> Dict[str, Any]:
    import inspect

    d: Dict[str, Any] = {"name": p.name, "kind": p.kind.name}
    if p.default is not inspect.Parameter.empty:
        d["default"] = repr(p.default)
    return d


def _describe_callable(fn: Any) -> Dict[str, Any]:
    import inspect

    sig = inspect.signature(fn)
    return {"kind": "function", "signature": f"{getattr(fn, '__name__', '?')}{sig}",
            "params": [_param(p) for p in sig.parameters.values()]}


def _smoke_cli() -> Dict[str, Any]:
    import argparse

    from .smoke import add_smoke_arguments

    parser = argparse.ArgumentParser(prog="aotriton-rocm smoke", add_help=False)
    add_smoke_arguments(parser)
    options = {}
    for action in parser._actions:  # argparse has no public list of its actions
        if not action.option_strings:
            continue
        options[max(action.option_strings, key=len)] = {
            "takes_value": action.nargs != 0,
            "choices": sorted(map(str, action.choices)) if action.choices else None,
        }
    return {"smoke": {"options": options}}


def public_api() -> Dict[str, Any]:
    """The ABI description of the running package (the content of ``abi.json``)."""
    import aotriton_rocm as pkg

    from . import torch_compat

    functions: Dict[str, Any] = {}
    constants: Dict[str, Any] = {}
    for name in sorted(pkg.__all__):
        obj = getattr(pkg, name)
        if callable(obj):
            functions[name] = _describe_callable(obj)
        else:
            constants[name] = obj
    version = str(pkg.__version__)
    from .archive import FORMAT_VERSION

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
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--write"] and len(args) == 2:
        write_abi_json(args[1])
        return 0
    print(json.dumps(public_api(), indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
