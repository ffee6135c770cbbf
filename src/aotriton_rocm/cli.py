"""The ``aotriton-rocm`` command: runtime commands (smoke, info) and, with the
build tooling installed (``aotriton-rocm[build]``), build and package."""

from __future__ import annotations

import argparse
import sys


def _info(args) -> int:
    import torch

    from . import device, images
    from ._version import ABI_VERSION, TRITON_VERSION, __version__
    from .archive import Archive

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
    for arch, path in sorted(found.items()):
        archive = Archive.open(path)
        m = archive.manifest
        print(f"  {arch}: {len(archive.kernels)} kernels, ROCm profile {m.get('rocm_profile')}, "
              f"version {m.get('package_version')}, {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="aotriton-rocm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    from .smoke import add_smoke_arguments, run_smoke_command

    p = sub.add_parser("smoke", help="check the installation and run SDPA on our kernels")
    add_smoke_arguments(p)
    p.set_defaults(run=run_smoke_command)

    p = sub.add_parser("info", help="version, GPU arch and installed kernel images")
    p.set_defaults(run=_info)

    try:
        from .tooling.build import add_build_arguments, run_build_command
        from .tooling.package import add_package_arguments, run_package_command
    except ImportError as exc:
        tooling_error = exc
    else:
        tooling_error = None
        p = sub.add_parser("build", help="compile the kernel archives ahead of time")
        add_build_arguments(p)
        p.set_defaults(run=run_build_command)
        p = sub.add_parser("package", help="wheels and conda packages from built archives")
        add_package_arguments(p)
        p.set_defaults(run=run_package_command)

    args = parser.parse_args(argv)
    if tooling_error is not None and args.command in ("build", "package"):
        print(f"aotriton-rocm: build tooling unavailable ({tooling_error}); "
              "install it with: pip install 'aotriton-rocm[build]'", file=sys.stderr)
        return 2
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
