"""What release artifacts are called and which versions may ship: the
naming and version rules shared by the wheels, the conda packages, the SBOM
and the release command. Build-time only, standard library only.
"""
from __future__ import annotations

import os
import re
import sys

from ..._version import abi_line, public_version
from ...common.errors import CommandError
from ..common.source_tree import read_version

__all__ = [
    "PackagingError",
    "RUNTIME_DIST",
    "IMAGE_ENTRY_POINT_GROUP",
    "log",
    "archname",
    "image_dist_name",
    "image_package_name",
    "check_final_version",
    "read_release_version",
    "check_profile",
    "local_label",
    "conda_rocm_tag",
    "conda_run_exports",
]

RUNTIME_DIST = "aotriton-rocm"
IMAGE_ENTRY_POINT_GROUP = "aotriton_rocm.images"

_FINAL_VERSION = re.compile(r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$")
_ROCM_PROFILE = re.compile(r"^[0-9]+\.[0-9]+$")
_ARCH = re.compile(r"^[a-z][a-z0-9_]*$")


class PackagingError(CommandError):
    """A packaging step failed; the message says which and why."""


def log(msg: str) -> None:
    """A progress line of the packaging steps (stderr)."""
    print(f"[package] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- names

def archname(arch: str) -> str:
    """``gfx942`` -> ``gfx942``, ``sm_90`` -> ``sm90`` (PyPI/conda-friendly)."""
    if not _ARCH.match(arch):
        raise PackagingError(f"invalid arch name {arch!r}")
    return arch.replace("_", "")


def image_dist_name(arch: str) -> str:
    return f"{RUNTIME_DIST}-{archname(arch)}"


def image_package_name(arch: str) -> str:
    return f"aotriton_rocm_{archname(arch)}"


# ------------------------------------------------------------------------ versions

def check_final_version(version: str) -> str:
    """Only PEP 440 finals ``X.Y.Z`` are released: no ``b``/``rc``/``dev``/local
    label (``0.9.2b`` is a pre-release to pip, and ``>=0.9.2`` never matches it)."""
    if not _FINAL_VERSION.match(version):
        raise PackagingError(
            f"version {version!r} is not a PEP 440 final X.Y.Z (no trailing b, rc, dev "
            "or +local: pip treats those as pre-releases or refuses them on PyPI)")
    return version


def read_release_version(source_root: os.PathLike) -> str:
    """The tree's version, refused unless it may ship (:func:`check_final_version`)."""
    return check_final_version(read_version(source_root))


def check_profile(rocm_profile: str) -> str:
    """A ROCm profile name ``A.B`` (PackagingError otherwise)."""
    if not _ROCM_PROFILE.match(str(rocm_profile)):
        raise PackagingError(f"ROCm profile {rocm_profile!r} is not of the form A.B (e.g. 6.4)")
    return str(rocm_profile)


def local_label(rocm_profile: str) -> str:
    """PEP 440 local label of a per-ROCm build: ``6.4`` -> ``rocm6.4``."""
    return f"rocm{check_profile(rocm_profile)}"


def conda_rocm_tag(rocm_profile: str) -> str:
    """Conda build-string part: ``6.4`` -> ``rocm64`` (no dots: py-rattler rejects
    dots in build-string globs such as ``*rocm64*``)."""
    return "rocm" + check_profile(rocm_profile).replace(".", "")


def conda_run_exports(version: str) -> str:
    """``X.Y.Z`` -> ``aotriton-rocm >=X.Y.Z,<X.(Y+1).0a0`` (what recipe.yaml exports)."""
    x, y = abi_line(version).split(".")
    return f"{RUNTIME_DIST} >={public_version(version)},<{x}.{int(y) + 1}.0a0"
