"""The build-inputs hash: what a kernel archive was built from (the kernel
sources, variants.toml, ci/targets.toml, the measured tuning data and the
compiler version), one sha256. ``build`` records it in every manifest;
``package`` and ``release`` compute it for the source tree they package and
refuse archives of other inputs. Build-time only, standard library only.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

__all__ = ["kernel_sources_hash", "tuning_files_bytes", "build_inputs_hash", "source_tree_inputs_hash"]


def kernel_sources_hash(kernels_dir) -> str:
    """sha256 over every ``*.py`` under ``kernels_dir`` (relative path + bytes)."""
    kd = Path(kernels_dir)
    h = hashlib.sha256()
    files = sorted(p for p in kd.rglob("*.py") if "__pycache__" not in p.parts)
    for p in files:
        rel = p.relative_to(kd).as_posix().encode()
        data = p.read_bytes()
        h.update(len(rel).to_bytes(8, "little") + rel)
        h.update(len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


def tuning_files_bytes(kernels_dir) -> bytes:
    """Every ``kernels/tuning/*.json`` (name + bytes, sorted)."""
    d = Path(kernels_dir) / "tuning"
    out = b""
    if d.is_dir():
        for p in sorted(d.glob("*.json")):
            data = p.read_bytes()
            out += len(p.name).to_bytes(8, "little") + p.name.encode() + len(data).to_bytes(8, "little") + data
    return out


def build_inputs_hash(kernels_dir: Path, variants_bytes: bytes, targets_bytes: bytes,
                      compiler_version: str) -> str:
    """sha256 over the kernel sources, variants.toml, targets.toml, the
    measured tuning data (kernels/tuning/*.json) and the compiler version."""
    h = hashlib.sha256()
    for part in (kernel_sources_hash(kernels_dir).encode(), variants_bytes, targets_bytes,
                 f"triton=={compiler_version}".encode(), tuning_files_bytes(kernels_dir)):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()


def source_tree_inputs_hash(source_root: Path, compiler_version: str) -> str:
    """The build-inputs hash of the checkout at ``source_root`` (its
    ``kernels/`` and ``ci/targets.toml``) for ``compiler_version``: what an
    archive built from it now records. OSError if a file cannot be read."""
    root = Path(source_root)
    kernels = root / "kernels"
    return build_inputs_hash(kernels, (kernels / "variants.toml").read_bytes(),
                             (root / "ci" / "targets.toml").read_bytes(), compiler_version)
