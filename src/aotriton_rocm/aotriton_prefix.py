"""``aotriton-rocm aotriton-prefix --out DIR``: an ``AOTRITON_INSTALLED_PREFIX``
for a PyTorch source build, from what is installed here.

PyTorch's ``cmake/External/aotriton.cmake`` links ``$P/lib/libaotriton_v2.so``,
compiles against ``$P/include/aotriton/*.h`` and copies ``$P/lib`` (newer
versions: ``libaotriton_v2*.so*`` and ``lib/aotriton.images/``) into
``torch/lib``. The prefix holds exactly that:

    lib/libaotriton_v2.so.<version>      our library of the chosen API line
    lib/libaotriton_v2.so                -> the file above
    lib/aotriton.images/amd-<arch>/<arch>.aotr   each installed kernel image
    include/aotriton/*.h                 that line's headers
    aotriton-rocm-prefix.json            what wrote it (so a rerun may replace it)

Standard library only. The directory is written beside ``DIR`` and renamed
into place: it is whole or absent.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple

from . import images
from ._version import __version__
from .errors import CommandError, UsageError
from .files import file_sha256
from .paths import AOTRITON_API_VERSIONS, aotriton_api_include, aotriton_api_library, aotriton_api_line

MARKER = "aotriton-rocm-prefix.json"
DEFAULT_LINE = "0.13"


@dataclass(frozen=True)
class PrefixOptions:
    out: Path
    line: str
    archs: Optional[Tuple[str, ...]]

    @classmethod
    def from_args(cls, args) -> "PrefixOptions":
        archs = tuple(a for a in (args.arch or "").split(",") if a) or None
        return cls(Path(args.out), aotriton_api_line(args.line), archs)


def add_aotriton_prefix_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Write an AOTRITON_INSTALLED_PREFIX for a PyTorch ROCm source build: our libaotriton_v2 "
        "(AOTriton's C++ API) of one API line, its headers and the installed kernel images. Then: "
        "AOTRITON_INSTALLED_PREFIX=DIR python setup.py develop (in a PyTorch checkout).")
    parser.add_argument("--out", required=True, help="the prefix directory to write (replaced if "
                        "an earlier run of this command wrote it; refused if it holds anything else)")
    parser.add_argument("--line", default=DEFAULT_LINE,
                        help="the AOTriton API line the PyTorch checkout pins: 0.11 (torch 2.9-2.11), "
                             "0.12 (torch 2.13), 0.13 (ROCm's release/2.12, PyTorch main); "
                             f"default {DEFAULT_LINE}")
    parser.add_argument("--arch", help="comma-separated archs to include (default: every installed image)")


def _vendor_dir(arch: str) -> str:
    return ("nvidia-" if arch.startswith("sm_") else "amd-") + arch


def _chosen_images(archs: Optional[Tuple[str, ...]]) -> Dict[str, Path]:
    installed = images.find_archives(refresh=True)
    if not installed:
        raise CommandError("no kernel image is installed: install one per GPU arch first, "
                           "e.g. pip install 'aotriton-rocm[gfx942]'")
    if archs is None:
        return dict(sorted(installed.items()))
    missing = [a for a in archs if a not in installed]
    if missing:
        raise CommandError(f"no kernel image installed for {', '.join(missing)} (installed: "
                           f"{', '.join(sorted(installed))}): pip install "
                           f"'aotriton-rocm[{','.join(missing)}]'")
    return {a: installed[a] for a in archs}


def _check_out(out: Path) -> None:
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise UsageError(f"--out {out} exists and is not a directory: choose a new path")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file():
        raise UsageError(f"--out {out} is not empty and was not written by aotriton-rocm "
                         "aotriton-prefix: choose an empty or new directory")
    parent = out.resolve().parent
    if not parent.is_dir():
        raise UsageError(f"the parent of --out ({parent}) does not exist: create it first")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"cannot write in {parent}: choose a directory you can write to")


def _write(stage: Path, line: str, chosen: Dict[str, Path]) -> dict:
    library = aotriton_api_library(line)
    include = aotriton_api_include(line) / "aotriton"
    for what, path in (("library", library), ("headers", include)):
        if not path.exists():
            raise CommandError(f"this installation has no AOTriton API {what} for line {line} "
                               f"({path} is missing): reinstall aotriton-rocm "
                               "(pip install --force-reinstall --no-deps aotriton-rocm)")
    lib = stage / "lib"
    lib.mkdir(parents=True)
    shutil.copy2(library, lib / library.name)
    (lib / "libaotriton_v2.so").symlink_to(library.name)
    for arch, archive in chosen.items():
        d = lib / "aotriton.images" / _vendor_dir(arch)
        d.mkdir(parents=True)
        shutil.copy2(archive, d / archive.name)
    shutil.copytree(include, stage / "include" / "aotriton")
    record = {"written_by": f"aotriton-rocm {__version__}", "aotriton_api_line": line,
              "aotriton_version": AOTRITON_API_VERSIONS[line], "library": library.name,
              "library_sha256": file_sha256(library),
              "images": {a: file_sha256(p) for a, p in chosen.items()}}
    (stage / MARKER).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record


def write_prefix(options: PrefixOptions) -> dict:
    out = options.out
    _check_out(out)
    chosen = _chosen_images(options.archs)
    stage = out.parent / f".{out.name}.prefix-{os.getpid()}"
    old = out.parent / f".{out.name}.prefix-old-{os.getpid()}"
    shutil.rmtree(stage, ignore_errors=True)
    try:
        record = _write(stage, options.line, chosen)
        if out.exists():
            os.replace(out, old)
        os.replace(stage, out)
    except OSError as e:
        raise CommandError(f"could not write the prefix {out}: {e.strerror or e}") from e
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    return record


def run_aotriton_prefix(options: PrefixOptions) -> int:
    record = write_prefix(options)
    print(f"wrote {options.out}: libaotriton_v2 {record['aotriton_version']} (AOTriton API line "
          f"{options.line}), images: {', '.join(record['images'])}")
    print(f"build PyTorch with: export AOTRITON_INSTALLED_PREFIX={options.out.resolve()}")
    return 0
