"""``aotriton-rocm release``: one command from built kernels to a published
release, as a sequence of gates, each printing a verdict:

1. ``build``        compile the archives (or reuse ``--build-dir`` if it holds them)
2. ``package``      wheels + conda packages + SHA256SUMS + SBOM into ``--out``
3. ``install-check`` install into a fresh venv / conda prefix and smoke-test
4. ``abi-check``    against ``--previous`` (a previous release's wheels); skipped
                    without one (the first release of a line)
5. ``changelog``    CHANGELOG.md has a section for this version (``## X.Y.Z``;
                    an ``Unreleased`` heading does not count)
6. ``credentials``  TWINE_USERNAME and TWINE_PASSWORD are set (never printed)
7. ``publish``      only with ``--publish``: ``twine upload`` of the wheels and
                    sdist to ``--index-url``, and the .conda files copied into
                    ``--channel`` (then re-indexed). ``--dry-run`` (the default)
                    prints what it would upload.

The first failing gate stops the release: the later gates print ``not run``,
and nothing is uploaded. Exit status 0 when every gate passed (or was
skipped), 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional, Tuple

from .package import PackagingError, find_source_root, read_version

__all__ = ["GATES", "CREDENTIAL_VARS", "changelog_has_section", "add_release_arguments",
           "run_release_command"]

GATES = ("build", "package", "install-check", "abi-check", "changelog", "credentials", "publish")
CREDENTIAL_VARS = ("TWINE_USERNAME", "TWINE_PASSWORD")
SKIPPABLE = ("install-check", "abi-check")


class GateFailed(Exception):
    pass


class GateSkipped(Exception):
    pass


@dataclass
class Context:
    args: argparse.Namespace
    root: Path
    version: str
    out: Path
    archives: Optional[Path] = None


def changelog_has_section(changelog: Path, version: str) -> bool:
    """A ``## `` heading naming ``version`` (``## 0.1.1``, ``## [0.1.1] - 2026-01-01``,
    ``## v0.1.1``) that is not an ``Unreleased`` one."""
    if not changelog.is_file():
        return False
    pat = re.compile(r"^##\s+\[?v?" + re.escape(version) + r"\]?(?![\w.+-])")
    for line in changelog.read_text(encoding="utf-8").splitlines():
        if pat.match(line) and "unreleased" not in line.lower():
            return True
    return False


def _quiet(fn: Callable[[], int], log: Path) -> Tuple[int, str]:
    """Run a command function, its stdout/stderr into ``log`` (the tail is shown
    on failure)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            rc = fn()
        except Exception as e:  # a tool's unexpected error fails the gate, never the release tool
            print(f"{type(e).__name__}: {e}")
            rc = 1
    text = buf.getvalue()
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(text, encoding="utf-8")
    return rc, "\n".join(text.strip().splitlines()[-15:])


def _logs(ctx: Context) -> Path:
    return ctx.out.parent / f".{ctx.out.name}-release-logs"


# ---------------------------------------------------------------------- the gates

def gate_build(ctx: Context) -> str:
    a = ctx.args
    build_dir = Path(a.build_dir) if a.build_dir else ctx.root / "build"
    archives = build_dir / "archives"
    if a.build_dir and any(archives.glob("*.aotr")):
        ctx.archives = archives
        return f"reused {len(list(archives.glob('*.aotr')))} archive(s) in {archives}"
    from .build import add_build_arguments, run_build_command

    p = argparse.ArgumentParser()
    add_build_arguments(p)
    argv = ["--out", str(build_dir), "--source-root", str(ctx.root), "--no-progress"]
    if a.rocm:
        argv += ["--rocm", a.rocm]
    for arch in a.arch or []:
        argv += ["--arch", arch]
    rc, tail = _quiet(lambda: run_build_command(p.parse_args(argv)), _logs(ctx) / "build.log")
    if rc != 0:
        raise GateFailed(f"build exited {rc}:\n{tail}")
    ctx.archives = archives
    return f"built {len(list(archives.glob('*.aotr')))} archive(s) into {archives}"


def gate_package(ctx: Context) -> str:
    from .package import add_package_arguments, run_package_command

    a = ctx.args
    if ctx.out.exists() and any(ctx.out.iterdir()):
        raise GateFailed(f"{ctx.out} is not empty: a release packages into a fresh directory")
    p = argparse.ArgumentParser()
    add_package_arguments(p)
    argv = ["--archives", str(ctx.archives), "--out", str(ctx.out), "--source-root", str(ctx.root)]
    if a.rocm:
        argv += ["--rocm", a.rocm]
    for arch in a.arch or []:
        argv += ["--arch", arch]
    if a.local_version:
        argv.append("--local-version")
    if a.no_conda:
        argv.append("--no-conda")
    for py in a.python or []:
        argv += ["--python", py]
    rc, tail = _quiet(lambda: run_package_command(p.parse_args(argv)), _logs(ctx) / "package.log")
    if rc != 0:
        raise GateFailed(f"package exited {rc}:\n{tail}")
    wheels = sorted(ctx.out.glob("*.whl"))
    condas = sorted(ctx.out.glob("conda/*/*.conda"))
    return f"{len(wheels)} wheel(s), {len(condas)} conda package(s), SHA256SUMS and SBOM in {ctx.out}"


def gate_install_check(ctx: Context) -> str:
    if "install-check" in (ctx.args.skip or []):
        raise GateSkipped("--skip install-check")
    from .install_check import run_install_check_command

    ns = argparse.Namespace(dist=str(ctx.out), work=str(_logs(ctx) / "install-check"),
                            no_conda=ctx.args.no_conda)
    rc, tail = _quiet(lambda: run_install_check_command(ns), _logs(ctx) / "install-check.log")
    if rc != 0:
        raise GateFailed(f"install-check exited {rc}:\n{tail}")
    return "fresh venv" + ("" if ctx.args.no_conda else " and fresh conda prefix") + ": smoke passed"


def gate_abi_check(ctx: Context) -> str:
    if "abi-check" in (ctx.args.skip or []):
        raise GateSkipped("--skip abi-check")
    if not ctx.args.previous:
        raise GateSkipped("no --previous release given (first release of the line)")
    from .abi_check import add_abi_check_arguments, run_abi_check_command

    p = argparse.ArgumentParser()
    add_abi_check_arguments(p)
    ns = p.parse_args([str(ctx.args.previous), str(ctx.out)])
    rc, tail = _quiet(lambda: run_abi_check_command(ns), _logs(ctx) / "abi-check.log")
    if rc != 0:
        raise GateFailed(f"abi-check exited {rc}:\n{tail}")
    return tail.splitlines()[-1] if tail else "ABI compatible"


def gate_changelog(ctx: Context) -> str:
    changelog = ctx.root / "CHANGELOG.md"
    if not changelog_has_section(changelog, ctx.version):
        raise GateFailed(f"{changelog} has no `## {ctx.version}` section (an Unreleased heading "
                         "does not count): write the release notes first")
    return f"CHANGELOG.md has a section for {ctx.version}"


def gate_credentials(ctx: Context) -> str:
    missing = [v for v in CREDENTIAL_VARS if not os.environ.get(v)]
    if missing:
        raise GateFailed(f"not set in the environment: {', '.join(missing)}")
    # Only the names: the values are never printed.
    return f"{' and '.join(CREDENTIAL_VARS)} set in the environment"


def _uploads(ctx: Context) -> List[Path]:
    return sorted(ctx.out.glob("*.whl")) + sorted(ctx.out.glob("*.tar.gz"))


def twine_upload(files: List[Path], index_url: str) -> Tuple[int, str]:
    """``twine upload`` with the credentials of the environment (twine reads
    TWINE_USERNAME/TWINE_PASSWORD itself; nothing here sees or prints them)."""
    proc = subprocess.run([sys.executable, "-m", "twine", "upload", "--non-interactive",
                           "--disable-progress-bar", "--repository-url", index_url,
                           *map(str, files)], capture_output=True, text=True, timeout=1800)
    return proc.returncode, proc.stdout + proc.stderr


def copy_to_channel(ctx: Context, channel: Path) -> List[Path]:
    from .conda import index_channel

    copied = []
    for src in sorted(ctx.out.glob("conda/*/*.conda")):
        dst = channel / src.parent.name / src.name
        if dst.exists():
            raise GateFailed(f"{dst} already exists in the channel: a published package is never replaced")
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(f".{dst.name}.{os.getpid()}.partial")
        shutil.copy2(src, tmp)
        os.replace(tmp, dst)
        copied.append(dst)
    index_channel(channel)
    return copied


def gate_publish(ctx: Context) -> str:
    a = ctx.args
    files = _uploads(ctx)
    condas = sorted(ctx.out.glob("conda/*/*.conda"))
    targets = []
    if files:
        targets.append(f"{len(files)} file(s) to {a.index_url or '(no --index-url)'}")
    if condas:
        targets.append(f"{len(condas)} conda package(s) to {a.channel or '(no --channel)'}")
    if not a.publish:
        raise GateSkipped("dry run: would upload " + "; ".join(targets or ["nothing"]))
    if files and not a.index_url:
        raise GateFailed("--publish needs --index-url for the wheels")
    if condas and not a.channel:
        raise GateFailed("--publish needs --channel for the conda packages")
    done = []
    if files:
        rc, out = twine_upload(files, a.index_url)
        if rc != 0:
            raise GateFailed("twine upload failed:\n" + "\n".join(out.strip().splitlines()[-10:]))
        done.append(f"uploaded {len(files)} file(s) to {a.index_url}")
    if condas:
        copied = copy_to_channel(ctx, Path(a.channel))
        done.append(f"{len(copied)} conda package(s) into {a.channel} (indexed)")
    return "; ".join(done)


_GATE_FUNCS = {"build": gate_build, "package": gate_package, "install-check": gate_install_check,
               "abi-check": gate_abi_check, "changelog": gate_changelog,
               "credentials": gate_credentials, "publish": gate_publish}


# ---------------------------------------------------------------------------- CLI

def add_release_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Gated release: build, package, install-check, abi-check, changelog, "
                          "credentials, then (with --publish) upload; the first failing gate stops "
                          "it before anything is uploaded.")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", dest="publish", action="store_false", default=False,
                      help="run every gate, upload nothing (the default)")
    mode.add_argument("--publish", dest="publish", action="store_true",
                      help="upload when every gate passed")
    parser.add_argument("--out", default="dist", metavar="DIR",
                        help="where the release is packaged (must be empty or absent; default: %(default)s)")
    parser.add_argument("--build-dir", default=None, metavar="DIR",
                        help="a build directory: reused if DIR/archives holds archives, else built there")
    parser.add_argument("--rocm", default=None, metavar="A.B", help="ROCm profile")
    parser.add_argument("--arch", action="append", default=None, metavar="ARCH",
                        help="arch or arch set (repeatable; default: the build's defaults)")
    parser.add_argument("--local-version", action="store_true", help="per-ROCm build (+rocmA.B)")
    parser.add_argument("--no-conda", action="store_true", help="wheels only")
    parser.add_argument("--python", action="append", default=None, metavar="3.N",
                        help="Python minor(s) of the conda runtime package")
    parser.add_argument("--previous", default=None, metavar="DIR",
                        help="the previous release (its wheels) for the ABI check")
    parser.add_argument("--index-url", default=None, metavar="URL", help="package index to upload to")
    parser.add_argument("--channel", default=None, metavar="DIR", help="conda channel directory")
    parser.add_argument("--skip", action="append", default=None, choices=SKIPPABLE,
                        help="skip a gate (dry runs only)")
    parser.add_argument("--source-root", default=None, metavar="DIR",
                        help="source tree to release (default: the one around the cwd)")


def run_release_command(args: argparse.Namespace) -> int:
    try:
        root = Path(args.source_root).resolve() if args.source_root else find_source_root()
        version = read_version(root)
    except PackagingError as e:
        print(f"aotriton-rocm release: {e}", file=sys.stderr)
        return 2
    if args.publish and args.skip:
        print(f"aotriton-rocm release: --skip {', '.join(args.skip)} is for dry runs only: "
              "a published release passes every gate", file=sys.stderr)
        return 2
    ctx = Context(args=args, root=root, version=version, out=Path(args.out).resolve())
    mode = "PUBLISH" if args.publish else "DRY RUN"
    print(f"aotriton-rocm release {version} ({mode}) from {root}", flush=True)
    failed = None
    for name in GATES:
        if failed is not None:
            print(f"[{name}] not run", flush=True)
            continue
        try:
            detail = _GATE_FUNCS[name](ctx)
            print(f"[{name}] PASS: {detail}", flush=True)
        except GateSkipped as e:
            print(f"[{name}] SKIPPED: {e}", flush=True)
        except (GateFailed, PackagingError) as e:
            print(f"[{name}] FAIL: {e}", flush=True)
            failed = name
    if failed == "publish":
        print(f"release {version}: publishing FAILED (see above for what was uploaded)")
        return 1
    if failed is not None:
        print(f"release {version}: STOPPED at {failed}; nothing was uploaded")
        return 1
    print(f"release {version}: " + ("PUBLISHED" if args.publish else
                                    "all gates passed (dry run: nothing uploaded; rerun with --publish)"))
    return 0
