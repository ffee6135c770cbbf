"""``aotriton-rocm-auto``: the conda metapackage that installs the kernel image
of the GPU in the machine, where the solver knows it.

Build-time only. conda/ceps#189 (draft) defines the virtual package
``__amdgpu_arch``: the ISA version ``major.minor.stepping`` of the machine's
GPU with the most compute units (gfx942 -> ``9.4.2``, gfx90a -> ``9.0.10``);
rattler implements it (rattler#2806: pixi, py-rattler), with the override
``CONDA_OVERRIDE_AMDGPU_ARCH``. One build of ``aotriton-rocm-auto`` per arch
depends on ``__amdgpu_arch ==<its ISA version>`` and on that arch's image of
the same version and ROCm release, so the solver can take only the build of
the GPU present. Where the solver has no ``__amdgpu_arch`` (conda, mamba
today) or the GPU has no image, it finds no build and says so: install the
per-arch package (``aotriton-rocm-gfx942``) instead.

The packages hold no files, only metadata, so they are assembled directly
(``rattler_build.assemble_package``) rather than built from recipe.yaml.
"""
from __future__ import annotations

import datetime
import os
import re
import shutil
from pathlib import Path
from typing import List, Optional, Sequence

from ...common.files import atomic_move
from .dist_dir import scratch_dir
from .naming import PackagingError, archname, conda_rocm_tag, image_dist_name

__all__ = ["AUTO_PACKAGE", "isa_version", "auto_depends", "auto_build_string", "build_auto_packages"]

AUTO_PACKAGE = "aotriton-rocm-auto"
_GFX = re.compile(r"^gfx([0-9]{1,2})([0-9])([0-9a-f])$")


def isa_version(arch: str) -> str:
    """``gfx942`` -> ``9.4.2``, ``gfx90a`` -> ``9.0.10``, ``gfx1151`` ->
    ``11.5.1``: the version ``__amdgpu_arch`` takes for that GPU."""
    m = _GFX.match(arch)
    if not m:
        raise PackagingError(f"{arch!r} is not an AMD gfx arch name (gfxMmS, e.g. gfx942)")
    return f"{int(m[1])}.{m[2]}.{int(m[3], 16)}"


def auto_build_string(arch: str, rocm_profile: str, build_number: int = 0) -> str:
    return f"{archname(arch)}_{conda_rocm_tag(rocm_profile)}_{build_number}"


def auto_depends(arch: str, version: str, rocm_profile: str) -> List[str]:
    """The GPU that build needs, and that GPU's image of the same release."""
    return [f"__amdgpu_arch =={isa_version(arch)}",
            f"{image_dist_name(arch)} =={version} {conda_rocm_tag(rocm_profile)}_*"]


def build_auto_packages(out_dir: os.PathLike, version: str, rocm_profile: str, archs: Sequence[str],
                        epoch: Optional[int] = None) -> List[Path]:
    """One ``aotriton-rocm-auto`` package per AMD arch of ``archs`` (others,
    such as sm_90, are left out) into ``out_dir/noarch/``; returns the paths."""
    from rattler_build import assemble_package

    out = Path(out_dir).resolve() / "noarch"
    when = (datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc)
            if epoch is not None else None)
    made: List[Path] = []
    scratch = scratch_dir("aotriton-conda-auto-")
    try:
        for arch in archs:
            if not _GFX.match(arch):
                continue
            res = assemble_package(
                name=AUTO_PACKAGE, version=version, target_platform="noarch", noarch="generic",
                build_string=auto_build_string(arch, rocm_profile), output_dir=scratch,
                files=[], depends=auto_depends(arch, version, rocm_profile), license="MIT",
                summary=f"aotriton-rocm kernel image for the GPU in the machine ({arch} build, "
                        f"ROCm {rocm_profile})", timestamp=when, compression_threads=1)
            made.append(atomic_move(Path(res.path), out / Path(res.path).name))
    except PackagingError:
        raise
    except Exception as e:  # rattler_build errors
        raise PackagingError(f"{AUTO_PACKAGE}: assembling the metapackages failed: {e}") from e
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return made
