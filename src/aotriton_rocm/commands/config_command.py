"""``aotriton-rocm config``: where the installed C library, its header and its
CMake / pkg-config files are, for build systems (as ``pybind11 --cmakedir``
and ``torch.utils.cmake_prefix_path`` do). Standard library only: it must
start fast (no torch, no tooling).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from ..common.errors import CommandError
from ..common.paths import locations

CONFIG_LOCATIONS = (("cmakedir", "the CMake package config (aotriton_rocmConfig.cmake)"),
                    ("includedir", "the include directory (holds aotriton_rocm/aotriton_rocm.h)"),
                    ("libdir", "the directory of the library"),
                    ("pkgconfigdir", "the directory of aotriton_rocm.pc"),
                    ("library", "the library file"))


@dataclass(frozen=True)
class ConfigOptions:
    wanted: Tuple[str, ...] = ()   # location names, in the order asked; () = all

    @classmethod
    def from_args(cls, args) -> "ConfigOptions":
        return cls(tuple(args.wanted or ()))


def add_config_arguments(parser) -> None:
    parser.description = ("Print where libaotriton_rocm is installed, for C and C++ builds: "
                          "cmake -Daotriton_rocm_DIR=\"$(aotriton-rocm config --cmakedir)\", "
                          "PKG_CONFIG_PATH=\"$(aotriton-rocm config --pkgconfigdir)\". "
                          "With no option, every location, one 'name: path' per line.")
    for name, what in CONFIG_LOCATIONS:
        parser.add_argument(f"--{name}", dest="wanted", action="append_const", const=name,
                            help=what)


def run_config(options: ConfigOptions) -> int:
    where = locations()
    missing = [str(p) for p in where.values() if not p.exists()]
    if missing:
        raise CommandError(f"this installation is incomplete ({', '.join(missing)} missing): "
                           "reinstall aotriton-rocm")
    if options.wanted:
        for name in options.wanted:
            print(where[name])
    else:
        for name, path in where.items():
            print(f"{name}: {path}")
    return 0
