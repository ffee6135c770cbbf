"""The kernel ABI of an archive, as data (docs/ABI.md): every manifest
carries ``"abi"`` (:func:`kernel_abi_section`): the archive format version,
the ABI line and a sha256 per kernel name over its set of (functional key,
ordered argument list) pairs, plus one over all.

Standard library only, imported by nothing but the archive format and the
tooling that compares releases.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Dict, Iterable, List, Mapping, Tuple

__all__ = ["SCHEMA", "functional_key", "kernel_abi_entries", "kernel_abi_section"]

SCHEMA = 1


def functional_key(functional: Mapping[str, Any]) -> str:
    """Canonical text of a functional point: ``dtype=fp16,head_dim=64`` (sorted)."""
    return ",".join(f"{k}={json.dumps(functional[k], sort_keys=True)}" for k in sorted(functional))


def _field(record: Any, name: str) -> Any:
    return record[name] if isinstance(record, Mapping) else getattr(record, name)


def _args_of(record: Any) -> Tuple[Tuple[str, str], ...]:
    return tuple((str(n), str(t)) for n, t in _field(record, "args"))


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
