"""``aotriton-rocm info``: version, GPU arch, the installed kernel images,
and the installation checks ``smoke`` runs that launch no kernel
(install_checks.py): it exits non-zero, with the fix, when one fails."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from ..common.errors import CommandError

__all__ = ["InfoOptions", "add_info_arguments", "run_info"]


@dataclass(frozen=True)
class InfoOptions:
    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "InfoOptions":
        return cls()


def add_info_arguments(parser: argparse.ArgumentParser) -> None:
    """``info`` takes no options."""


def run_info(options: InfoOptions) -> int:
    """Print what is installed; every archive is listed, a damaged, misnamed
    or missing one marked BAD, and the library and torch extension checked
    (CommandError at the end when anything failed)."""
    import torch

    from ..core import device
    from ..common import gpus_present, images
    from .._version import ABI_VERSION, TRITON_VERSION, __version__
    from ..common.archive_index import clip
    from .install_checks import (archive_note, archive_problems, check_library,
                                 check_torch_extension, library_error)
    from .torch_lib_state import loaded_aotriton

    print(f"aotriton-rocm {__version__} (ABI {ABI_VERSION}, kernels built with triton "
          f"{TRITON_VERSION})")
    print(f"torch {torch.__version__}" + (f", HIP {torch.version.hip}" if torch.version.hip else ""))
    print(f"AOTriton library of torch: {loaded_aotriton()}")
    if device.gpu_available():
        print(f"GPU: {torch.cuda.get_device_name()} ({device.arch_of(torch.cuda.current_device())})")
    else:
        print("GPU: none visible")
    failed = []
    for what, ok, detail in filter(None, (check_library(), check_torch_extension())):
        print(f"{what}: {'' if ok else 'BAD '}{detail}")
        if not ok:
            failed.append(what)
    found = images.find_archives()
    print("\n".join(gpus_present.report_lines(found)))
    missing = images.missing_images()
    if not found and not missing:
        print("kernel images: none installed (pip install 'aotriton-rocm[gfx942]', for example)")
    else:
        print("kernel images:")
    bad = 0
    native_checked = library_error() is None
    for arch, path in sorted(found.items()):
        archive, problems = archive_problems(arch, path)
        if archive is None:
            print(f"  {arch}: BAD {problems[0]}")
            for problem in problems[1:]:
                print(f"      {problem}")
        else:
            m = archive.manifest
            print(f"  {arch}: {'BAD ' if problems else ''}{len(archive.kernels)} kernels, "
                  f"ROCm profile {clip(m.get('rocm_profile'), 40)}, version "
                  f"{clip(m.get('package_version'), 40)}, ABI {m.get('abi_version')}, {path}"
                  + archive_note(archive, native_checked or bool(problems)))
            for problem in problems:
                print(f"      {problem}")
        bad += bool(problems)
    for m in missing:
        bad += 1
        if m.arch:
            print(f"  {m.arch}: BAD {m.path} is missing or unreadable, but its image is "
                  f"installed; fix: {m.fix}")
        else:
            print(f"  BAD {m.fix}")
    if bad:
        failed.append(f"{bad} of {len(found) + len(missing)} kernel image(s) unusable")
    if failed:
        raise CommandError(f"{'; '.join(failed)} (marked BAD above; the fix is named with each)")
    return 0
