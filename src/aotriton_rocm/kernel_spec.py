"""Reading kernels/variants.toml: the one description of what each kernel takes.

Used by the build tooling (what to compile) and by the CPU interpreter backend
(how to call the sources). The GPU runtime never needs it: every archive
records the argument lists and constexprs of what it holds.
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import sys
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

FAMILIES = {
    "cdna": ("gfx908", "gfx90a", "gfx942", "gfx950"),
    "cuda": ("sm_90",),
}


def family_of(arch: str) -> str:
    for family, archs in FAMILIES.items():
        if arch in archs:
            return family
    if arch.startswith(("gfx11", "gfx12")):
        return "rdna"
    if arch.startswith("sm_"):
        return "cuda"
    raise ValueError(f"unknown arch {arch!r}")


def kernels_dir() -> Path:
    """The installed kernel sources (package aotriton_rocm._kernels)."""
    return Path(importlib.import_module("aotriton_rocm._kernels").__path__[0])


def load(directory: Path | None = None) -> dict:
    path = (directory or kernels_dir()) / "variants.toml"
    with open(path, "rb") as f:
        return tomllib.load(f)


def function(spec: dict, kernel: str, directory: Path | None = None):
    """The @triton.jit function a spec entry names (imports triton)."""
    module_name, fn_name = spec["kernels"][kernel]["function"].split(":")
    if directory is None:
        module = importlib.import_module(f"aotriton_rocm._kernels.{module_name}")
    else:
        qualified = f"_aotriton_rocm_kernels_{abs(hash(str(directory)))}_{module_name}"
        module = sys.modules.get(qualified)
        if module is None:
            file_spec = importlib.util.spec_from_file_location(qualified,
                                                               directory / f"{module_name}.py")
            module = importlib.util.module_from_spec(file_spec)
            sys.modules[qualified] = module
            file_spec.loader.exec_module(module)
    return getattr(module, fn_name)


def configs_for(entry: dict, *, family: str, head_dim: int | None = None) -> list[dict]:
    """Tuning configs of one kernel that apply to an arch family (and head dim)."""
    found = []
    for config in entry.get("configs", []):
        if family not in config["archs"]:
            continue
        dims = config.get("head_dims")
        if dims is not None and head_dim is not None and head_dim not in dims:
            continue
        found.append({k: v for k, v in config.items() if k not in ("archs", "head_dims")})
    return found


def config_for(entry: dict, *, family: str, head_dim: int | None = None) -> dict:
    configs = configs_for(entry, family=family, head_dim=head_dim)
    if not configs:
        raise LookupError(f"no tuning config for family {family!r}, head_dim {head_dim}")
    return configs[0]


def constexprs_for(entry: dict, config: dict, *, head_dim: int, causal: bool | None,
                   upcast_dot: bool = False) -> dict:
    """Values of every constexpr of a kernel for one functional key and config."""
    values = {"HEAD_DIM": int(head_dim), "IS_CAUSAL": bool(causal),
              "UPCAST_DOT": bool(upcast_dot)}
    values.update({k: v for k, v in config.items() if k.isupper()})
    missing = [c for c in entry["constexprs"] if c not in values]
    if missing:
        raise KeyError(f"no value for constexprs {missing}")
    return {c: values[c] for c in entry["constexprs"]}


def functional_keys(entry: dict) -> list[dict]:
    """Every combination of the kernel's functional values."""
    names = sorted(entry["functional"])
    return [dict(zip(names, combo))
            for combo in itertools.product(*(entry["functional"][n] for n in names))]
