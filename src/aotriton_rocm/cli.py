"""The ``aotriton-rocm`` command: runtime commands (smoke, info) and, with the
build tooling installed (``aotriton-rocm[build]``), build and package."""

from __future__ import annotations

import argparse
import importlib
import sys


def _tooling_missing(exc: ImportError):
    def run(args) -> int:
        print(f"aotriton-rocm: build tooling unavailable ({exc}); "
              "install it with: pip install 'aotriton-rocm[build]'", file=sys.stderr)
        return 2
    return run


def _info(args) -> int:
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
        # every archive is listed; a damaged or misnamed one is marked, not fatal
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
        print(f"aotriton-rocm info: {bad} of {len(found)} kernel image(s) unusable (marked BAD "
              f"above; the fix is named with each)", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["config"]:  # for build systems: answered before any heavy import
        from .paths import run_config_command
        return run_config_command(argv[1:])
    parser = argparse.ArgumentParser(prog="aotriton-rocm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    from .smoke import add_smoke_arguments, run_smoke_command

    p = sub.add_parser("smoke", help="check the installation and run SDPA on our kernels")
    add_smoke_arguments(p)
    p.set_defaults(run=run_smoke_command)

    p = sub.add_parser("info", help="version, GPU arch and installed kernel images")
    p.set_defaults(run=_info)

    # listed for --help only: main() answers `config` before building this parser
    sub.add_parser("config", help="paths of the C library, header, CMake and pkg-config files "
                   "(--cmakedir, --includedir, --libdir, --pkgconfigdir, --library)")

    tooling = {
        "build": ("compile the kernel archives ahead of time", "build"),
        "merge": ("assemble the archives of a sharded build (build --shard K/N)", "merge"),
        "package": ("wheels and conda packages from built archives", "package"),
        "install-check": ("install the packages into fresh environments and smoke-test them",
                          "install_check"),
        "abi-check": ("compare the ABI of two releases; refuse a breaking point release",
                      "abi_check"),
        "validate": ("statically validate the AMD code objects of kernel archives", "validate"),
        "pin": ("requirement and conda spec lines for a torch version", "pin"),
        "release": ("gated release: build, package, install-check, abi-check, changelog, "
                    "credentials, publish (--dry-run by default)", "release"),
    }
    for name, (help_text, module) in tooling.items():
        p = sub.add_parser(name, help=help_text)
        try:
            mod = importlib.import_module(f".tooling.{module}", __package__)
        except ImportError as exc:  # build tooling (triton, rattler, ...) not installed
            p.set_defaults(run=_tooling_missing(exc))
            continue
        getattr(mod, f"add_{module}_arguments")(p)
        p.set_defaults(run=getattr(mod, f"run_{module}_command"))

    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
