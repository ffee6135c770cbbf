"""``aotriton-rocm info``: version, GPU arch and the installed kernel images."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from .errors import CommandError

__all__ = ["InfoOptions", "add_info_arguments", "run_info"]


@dataclass(frozen=True)
class InfoOptions:
    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "InfoOptions":
        return cls()


def add_info_arguments(parser: argparse.ArgumentParser) -> None:
    """``info`` takes no options."""


def run_info(options: InfoOptions) -> int:
    """Print what is installed; every archive is listed, a damaged or misnamed
    one marked BAD (CommandError at the end when any is)."""
    import torch

    from . import device, images
    from ._version import ABI_VERSION, TRITON_VERSION, __version__
    from .archive import Archive, ArchiveError, identity_problems

    print(f"aotriton-rocm {__version__} (ABI {ABI_VERSION}, kernels built with triton "
          f"{TRITON_VERSION})")
    print(f"torch {torch.__version__}" + (f", HIP {torch.version.hip}" if torch.version.hip else ""))
    if device.gpu_available():
        print(f"GPU: {torch.cuda.get_device_name()} ({device.arch_of(torch.cuda.current_device())})")
    else:
        print("GPU: none visible")
    found = images.find_archives()
    if not found:
        print("kernel images: none installed (pip install 'aotriton-rocm[gfx942]', for example)")
    bad = 0
    for arch, path in sorted(found.items()):
        try:
            archive = Archive.open(path)
        except ArchiveError as exc:
            bad += 1
            print(f"  {arch}: BAD {path}: {exc}")
            continue
        m = archive.manifest
        problems = identity_problems(archive, path, expected_abi=ABI_VERSION)
        print(f"  {arch}: {'BAD ' if problems else ''}{len(archive.kernels)} kernels, "
              f"ROCm profile {m.get('rocm_profile')}, version {m.get('package_version')}, "
              f"ABI {m.get('abi_version')}, {path}")
        for problem in problems:
            print(f"      {problem}")
        bad += bool(problems)
    if bad:
        raise CommandError(f"{bad} of {len(found)} kernel image(s) unusable (marked BAD above; "
                           f"the fix is named with each)")
    return 0
