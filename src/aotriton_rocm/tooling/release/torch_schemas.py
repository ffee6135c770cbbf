"""Record the running torch's interface in ``aotriton_rocm/torch_schemas.json``.

``python -m aotriton_rocm.tooling.release.torch_schemas`` (in an environment
with the torch to record, a real build of it) stores, under its major.minor,
the schema of every aten op aotriton-rocm binds and the parameters of every
torch function it calls (:func:`aotriton_rocm.core.torch_compat.torch_interface`).
``enable()`` lets a torch newer than the compatibility table run only where
its interface equals one recorded here. ``--check`` compares instead of
writing: exit status 1 and the differences where the stored entry is missing
or differs. scripts/test-torch-compat.sh runs it for each torch it tests.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from ...core import torch_compat
from ...common.errors import CommandError, UsageError
from ...common.files import atomic_write_json

COMMENT = ("Per tested torch (major.minor): the schemas of the aten ops aotriton-rocm binds and "
           "the parameters of the torch functions it calls, from a real torch build. Generated: "
           "python -m aotriton_rocm.tooling.release.torch_schemas (see torch_compat.py).")


def _torch():
    try:
        import torch
    except ImportError:
        raise UsageError("torch is not importable here: run this in the environment of the torch "
                         "to record") from None
    return torch


def _existing(path: Path) -> Dict[str, Any]:
    if not path.exists():
        return {"comment": COMMENT, "schema": 1, "tested": {}}
    try:
        return torch_compat.load_interfaces(path)
    except ValueError as exc:
        raise CommandError(f"{exc} (move it away to start a new one)") from None


def record(path: Path, torch_module: Any = None) -> tuple[str, List[str]]:
    """Store ``torch_module``'s interface in ``path`` (written whole, then
    renamed); (its major.minor, what changed against the stored entry)."""
    torch_module = torch_module or _torch()
    minor = torch_compat.torch_minor(torch_module.__version__)
    data = _existing(path)
    current = dict(torch_compat.torch_interface(torch_module), torch=str(torch_module.__version__))
    old = data["tested"].get(minor)
    changes = ["new entry"] if old is None else torch_compat.interface_changes(old, current)
    tested = dict(data["tested"], **{minor: current})
    data = {"comment": COMMENT, "schema": 1,
            "tested": {v: tested[v] for v in sorted(tested, key=torch_compat._key)}}
    atomic_write_json(path, data)
    torch_compat._load_interfaces_file.cache_clear()
    return minor, changes


def check(path: Path, torch_module: Any = None) -> tuple[str, List[str]]:
    """(major.minor, what differs between ``path``'s entry for it and the
    running torch); ``["no entry"]`` without one."""
    torch_module = torch_module or _torch()
    minor = torch_compat.torch_minor(torch_module.__version__)
    stored = _existing(path)["tested"].get(minor)
    if stored is None:
        return minor, ["no entry"]
    return minor, torch_compat.interface_changes(stored, torch_compat.torch_interface(torch_module))


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m aotriton_rocm.tooling.release.torch_schemas",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--file", type=Path, default=torch_compat.SCHEMAS_FILE,
                        help="the table (default: the package's torch_schemas.json)")
    parser.add_argument("--check", action="store_true",
                        help="compare with the stored entry instead of writing")
    args = parser.parse_args(argv)
    try:
        if args.check:
            minor, changes = check(args.file)
            if changes:
                print(f"torch {minor}: {args.file} differs from this torch: {', '.join(changes)}; "
                      "record it with python -m aotriton_rocm.tooling.release.torch_schemas",
                      file=sys.stderr)
                return 1
            print(f"torch {minor}: the stored interface matches this torch")
            return 0
        minor, changes = record(args.file)
    except CommandError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(f"torch {minor}: recorded in {args.file}"
          + (f" ({', '.join(changes)})" if changes else " (unchanged)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
