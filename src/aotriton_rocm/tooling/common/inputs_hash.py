"""The build-inputs hash: what a kernel archive was built from (the kernel
sources, variants.toml, ci/targets.toml, the measured tuning data and the
compiler version), one sha256. ``build`` records it in every manifest;
``package`` and ``release`` compute it for the source tree they package and
refuse archives of other inputs. Build-time only, standard library only.
"""
from __future__ import annotations

import ast
import hashlib
from pathlib import Path

__all__ = ["kernel_sources_hash", "module_sources_hash", "tuning_files_bytes", "build_inputs_hash",
           "source_tree_inputs_hash"]


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


def _local_imports(source: bytes, path: Path, module: str) -> list:
    """The kernels/ modules that ``module`` (``source``, read from ``path``)
    imports relatively (``from .x import``, ``from . import x``), as dotted
    names relative to kernels/."""
    names = []
    for node in ast.walk(ast.parse(source, filename=str(path))):
        if not isinstance(node, ast.ImportFrom) or node.level == 0:
            continue
        package = module.split(".")[:-node.level]  # the package the dots name
        if node.module:
            names.append(".".join(package + [node.module]))
        else:
            names.extend(".".join(package + [a.name]) for a in node.names)
    return names


def module_sources_hash(kernels_dir, module: str) -> str:
    """sha256 over kernel module ``module`` (dotted, relative to
    ``kernels_dir``) and every kernels/ module it imports, transitively: what
    the compile of a function of that module reads. A compile-cache key of
    it stays valid when an unrelated kernel module changes or is added."""
    kd = Path(kernels_dir)
    todo, seen, sources = [module], set(), {}
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = kd.joinpath(*name.split(".")).with_suffix(".py")
        if not path.is_file():
            continue  # ``from . import x`` of a name that is not a module
        sources[name] = path.read_bytes()
        todo.extend(_local_imports(sources[name], path, name))
    h = hashlib.sha256()
    for name in sorted(sources):
        data = sources[name]
        h.update(len(name).to_bytes(8, "little") + name.encode())
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
