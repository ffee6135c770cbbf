"""The AMD GPUs in this machine, read from the amdgpu driver's KFD topology in
sysfs (no ROCm, HIP or torch needed), and the command that installs the
kernel image of each one that has none.

Runtime module: standard library only. Each node of
``/sys/class/kfd/kfd/topology/nodes/<n>/`` has a ``properties`` file of
``key value`` lines; ``gfx_target_version`` is the ISA as decimal digits
``MMmmss`` (major, minor, stepping: 90402 = 9.4.2 = gfx942, 110501 = gfx1151,
90010 = 9.0.10 = gfx90a, the stepping written in hex as LLVM names it), 0 on
CPU nodes. ``AOTRITON_ROCM_SYSFS_ROOT`` replaces ``/sys`` (tests, containers
that mount the host's sysfs elsewhere).
"""
from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path
from typing import Dict, Iterable, List, NamedTuple, Optional

__all__ = ["SYSFS_ENV", "Gpu", "arch_of_target_version", "gpus_present", "install_commands",
           "report_lines"]

SYSFS_ENV = "AOTRITON_ROCM_SYSFS_ROOT"
TOPOLOGY = "class/kfd/kfd/topology/nodes"


class Gpu(NamedTuple):
    node: int
    arch: str
    name: str  # marketing_name or name where the node has one, else ""


def arch_of_target_version(value: int) -> Optional[str]:
    """``90402`` -> ``gfx942``; None for 0 (a CPU node) or a value out of range."""
    major, minor, stepping = value // 10000, value // 100 % 100, value % 100
    if value <= 0 or minor > 9 or stepping > 15:
        return None
    return f"gfx{major}{minor}{stepping:x}"


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""


def _properties(node: Path) -> Dict[str, str]:
    out = {}
    for line in _read(node / "properties").splitlines():
        key, _, value = line.strip().partition(" ")
        out[key] = value.strip()
    return out


def gpus_present(sysfs_root: Optional[str] = None) -> List[Gpu]:
    """The GPU nodes of the KFD topology, in node order ([] without the driver)."""
    root = Path(sysfs_root or os.environ.get(SYSFS_ENV) or "/sys") / TOPOLOGY
    try:
        nodes = sorted((p for p in root.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    except OSError:
        return []
    gpus = []
    for node in nodes:
        props = _properties(node)
        try:
            arch = arch_of_target_version(int(props.get("gfx_target_version", "0")))
        except ValueError:
            arch = None
        if arch:
            name = _read(node / "marketing_name") or props.get("marketing_name", "") or _read(node / "name")
            gpus.append(Gpu(int(node.name), arch, name))
    return gpus


def _runtime_version() -> Optional[str]:
    try:
        return importlib.metadata.version("aotriton-rocm")
    except importlib.metadata.PackageNotFoundError:
        return None


def install_commands(arch: str, version: Optional[str] = None) -> List[str]:
    """The pip and conda commands that add ``arch``'s kernel image to this
    installation (same version and, for a ``+rocmA.B`` build, the same ROCm)."""
    extra = arch.replace("_", "")
    version = version if version is not None else _runtime_version()
    if not version:
        return [f'pip install "aotriton-rocm[{extra}]"', f"conda install -c CHANNEL aotriton-rocm-{extra}"]
    public, _, local = version.partition("+")
    build = f"={local.replace('.', '')}_*" if local.startswith("rocm") else ""
    return [f'pip install "aotriton-rocm[{extra}]=={version}"',
            f'conda install -c CHANNEL "aotriton-rocm-{extra}={public}{build}"']


def report_lines(installed: Iterable[str], gpus: Optional[List[Gpu]] = None) -> List[str]:
    """``info``/``smoke`` lines: the GPUs found, then for each arch without an
    installed image the commands that install it (or, for an arch we publish
    no image for, that there is none)."""
    from .images import published_image_extras, publishes_image

    gpus = gpus_present() if gpus is None else gpus
    if not gpus:
        return ["GPUs in the KFD topology: none (no amdgpu driver, or no AMD GPU)"]
    by_arch: Dict[str, List[Gpu]] = {}
    for g in gpus:
        by_arch.setdefault(g.arch, []).append(g)
    lines = ["GPUs in the KFD topology:"]
    have = set(installed)
    for arch, group in by_arch.items():
        names = sorted({g.name for g in group if g.name})
        nodes = ", ".join(str(g.node) for g in group)
        state = "kernel image installed" if arch in have else "NO kernel image installed"
        lines.append(f"  {arch} x{len(group)}{' (' + ', '.join(names) + ')' if names else ''}, "
                     f"node {nodes}: {state}")
        if arch in have:
            continue
        if not publishes_image(arch):
            lines.append(f"      aotriton-rocm publishes no kernel image for {arch} (images: "
                         f"{', '.join(published_image_extras())}); torch's own attention kernels "
                         f"run there")
        else:
            lines += [f"      install: {cmd}" for cmd in install_commands(arch)]
    return lines
