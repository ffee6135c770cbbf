"""``aotriton-rocm release``: one command from the kernel sources to a published
release of the ROCm-profile x arch matrix, as a sequence of gates, each
printing its verdict (PASS, SKIPPED or FAIL) for every target it covers.

The matrix: ``--rocm A.B`` (repeatable, or ``all``: every profile of
``ci/targets.toml``; default: its default profile) x ``--arch`` (archs or arch
sets such as ``cdna3``, resolved per profile by the build). Targets:

* ``rocmA.B``, one per profile: the per-ROCm build, wheels ``X.Y.Z+rocmA.B``
  (uploaded to ``INDEX/rocmA.B/``) and the conda packages (build strings
  ``*_rocmAB_*``, into ``--channel``);
* ``default``: wheels ``X.Y.Z`` with no local label (the kind PyPI takes,
  uploaded to ``--index-url``) from the default profile (``--default-rocm``,
  else ``ci/targets.toml``'s when it is in the matrix; ``--no-default``: none).

Gates, in order:

1. ``build``         per profile: compile the archives into ``BUILD/rocmA.B/``
                     (``--build-dir BUILD`` reuses the archives already there)
2. ``package``       per target: wheels (+ conda) + SHA256SUMS + SBOM into
                     ``OUT/<target>/`` (``--reuse-dist``: verify what an earlier
                     dry run packaged there instead, against its SHA256SUMS)
3. ``install-check`` per target: install into a fresh venv / conda prefix, smoke
4. ``abi-check``     per target, against ``--previous PREV`` (``PREV/<target>``,
                     or PREV itself when it holds that target's wheels);
                     skipped without one (the first release of a line)
5. ``changelog``     CHANGELOG.md has a section for this version (``## X.Y.Z``;
                     an ``Unreleased`` heading does not count)
6. ``credentials``   the upload credentials: TWINE_USERNAME / TWINE_PASSWORD in
                     the environment, else the keyring (python ``keyring``,
                     service = ``--index-url``); never printed
7. ``publish``       only with ``--publish``: ``twine upload`` per target, then
                     the .conda files into ``--channel`` (re-indexed). The dry
                     run (the default) prints what it would upload.

The first failing gate stops the release: everything after it prints ``not
run`` and nothing is uploaded. Exit status 0 when every gate passed (or was
skipped), 1 otherwise, 2 for a bad command line.
"""

from __future__ import annotations

import argparse
import os
from functools import partial
from pathlib import Path
from typing import Callable, List, Tuple

from ...common.errors import CommandError, UsageError
from ...common.files import describe_os_error, parent_file_problem
from ..common.source_tree import find_source_root
from ..package.naming import local_label, read_release_version
from .gates import (Context, GateFailed, GateSkipped, gate_abi_check, gate_build, gate_changelog,
                    gate_install_check, gate_package)
from .matrix import (ReleaseOptions, matrix_profiles, plan_lines, profile_archs, release_archs,
                     release_targets)
from .publish import gate_credentials, gate_publish, gate_publish_conda

__all__ = ["GATES", "ReleaseOptions", "add_release_arguments", "run_release"]

GATES = ("build", "package", "install-check", "abi-check", "changelog", "credentials", "publish")
SKIPPABLE = ("install-check", "abi-check")


def _check_out(out: Path) -> None:
    """--out is created and written before any gate runs."""
    why = parent_file_problem(out)
    if why:
        raise UsageError(why)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise UsageError(f"--out {out} cannot be written ({describe_os_error(e)}): pass a "
                         f"writable directory") from None


def _redact(ctx: Context, text: str) -> str:
    if ctx.credentials and ctx.credentials.password:
        text = text.replace(ctx.credentials.password, "********")
    return text


def _steps(ctx: Context) -> List[Tuple[str, str, Callable[[], str]]]:
    s: List[Tuple[str, str, Callable[[], str]]] = []
    s += [("build", local_label(p), partial(gate_build, ctx, p)) for p in ctx.profiles]
    s += [("package", t.name, partial(gate_package, ctx, t)) for t in ctx.targets]
    s += [("install-check", t.name, partial(gate_install_check, ctx, t)) for t in ctx.targets]
    s += [("abi-check", t.name, partial(gate_abi_check, ctx, t)) for t in ctx.targets]
    s.append(("changelog", "", partial(gate_changelog, ctx)))
    s.append(("credentials", "", partial(gate_credentials, ctx)))
    s += [("publish", t.name, partial(gate_publish, ctx, t)) for t in ctx.targets]
    if any(t.conda for t in ctx.targets):
        s.append(("publish", "conda", partial(gate_publish_conda, ctx)))
    return s


# ---------------------------------------------------------------------------- CLI

def add_release_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Gated release of the ROCm-profile x arch matrix: build, package, "
                          "install-check, abi-check, changelog, credentials, then (with --publish) "
                          "upload; the first failing gate stops it before anything is uploaded.")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", dest="publish", action="store_false", default=False,
                      help="run every gate, upload nothing (the default)")
    mode.add_argument("--publish", dest="publish", action="store_true",
                      help="upload when every gate passed")
    parser.add_argument("--rocm", action="append", default=None, metavar="A.B",
                        help="ROCm profile of the matrix (repeatable, comma-separated, or 'all'; "
                             "default: ci/targets.toml's default profile)")
    parser.add_argument("--arch", action="append", default=None, metavar="ARCH",
                        help="arch or arch set, per profile (repeatable; default: all, every arch "
                             "each profile supports)")
    parser.add_argument("--plan", action="store_true",
                        help="print the archs of each profile and the commands that build them "
                             "(into --build-dir), then stop")
    parser.add_argument("--shards", type=int, default=1, metavar="N",
                        help="with --plan: build each profile in N shards (build --shard K/N, merge)")
    parser.add_argument("--default-rocm", default=None, metavar="A.B",
                        help="profile of the default build (no local label, for --index-url; default: "
                             "ci/targets.toml's default profile when it is in the matrix)")
    parser.add_argument("--no-default", action="store_true",
                        help="per-ROCm builds only (no default build)")
    parser.add_argument("--out", default="dist", metavar="DIR",
                        help="release directory, one subdirectory per target (default: %(default)s)")
    parser.add_argument("--reuse-dist", action="store_true",
                        help="publish what a dry run packaged into --out (checked against its "
                             "SHA256SUMS) instead of packaging again")
    parser.add_argument("--build-dir", default=None, metavar="DIR",
                        help="build directory: DIR/rocmA.B/archives is reused if it holds archives, "
                             "else built there (default: build/release, always rebuilt)")
    parser.add_argument("--no-conda", action="store_true", help="wheels only")
    parser.add_argument("--python", action="append", default=None, metavar="3.N",
                        help="Python minor(s) of the conda runtime packages")
    parser.add_argument("--previous", default=None, metavar="DIR",
                        help="the previous release (its --out directory, or its wheels) for the ABI check")
    parser.add_argument("--index-url", default=None, metavar="URL",
                        help="upload URL of the default index (also the keyring service name)")
    parser.add_argument("--rocm-index-url", default=None, metavar="URL",
                        help="base of the per-ROCm indexes: the rocmA.B build goes to URL/rocmA.B/ "
                             "(default: --index-url)")
    parser.add_argument("--channel", default=None, metavar="DIR", help="conda channel directory")
    parser.add_argument("--skip", action="append", default=None, choices=SKIPPABLE,
                        help="skip a gate (dry runs only)")
    parser.add_argument("--source-root", default=None, metavar="DIR",
                        help="source tree to release (default: the one around the cwd)")


def run_release(args: ReleaseOptions) -> int:
    """Run the gates in order, printing each verdict; CommandError (exit 1)
    when one failed, UsageError before any gate for a bad request."""
    if args.publish and args.skip:
        raise UsageError(f"--skip {', '.join(args.skip)} is for dry runs only: a published "
                         "release passes every gate")
    try:
        root = args.source_root.resolve() if args.source_root else find_source_root()
        version = read_release_version(root)
        profiles, default = matrix_profiles(args, root)
        archs = profile_archs(args, root, profiles)
    except CommandError as e:
        raise UsageError(str(e)) from e
    if args.plan:
        build_dir = args.build_dir.resolve() if args.build_dir else root / "build" / "release"
        print("\n".join(plan_lines(args, archs, build_dir)))
        return 0
    out = args.out.resolve()
    _check_out(out)
    ctx = Context(args=args, root=root, version=version, out=out, profiles=profiles,
                  targets=release_targets(args, out, profiles, default), plan=archs)
    mode = "PUBLISH" if args.publish else "DRY RUN"
    print(f"aotriton-rocm release {version} ({mode}) from {root}", flush=True)
    print(f"matrix: ROCm {', '.join(profiles)} x arch {', '.join(release_archs(args))}; "
          f"targets: {', '.join(t.name for t in ctx.targets)}", flush=True)
    failed = None
    for gate, label, fn in _steps(ctx):
        tag = f"[{gate} {label}]" if label else f"[{gate}]"
        if failed is not None:
            print(f"{tag} not run", flush=True)
            continue
        try:
            print(_redact(ctx, f"{tag} PASS: {fn()}"), flush=True)
        except GateSkipped as e:
            print(_redact(ctx, f"{tag} SKIPPED: {e}"), flush=True)
        except (GateFailed, CommandError) as e:
            print(_redact(ctx, f"{tag} FAIL: {e}"), flush=True)
            failed = f"{gate} {label}".strip()
        except OSError as e:
            print(_redact(ctx, f"{tag} FAIL: {describe_os_error(e)}"), flush=True)
            failed = f"{gate} {label}".strip()
    if failed is not None and ctx.uploaded:
        print(f"release {version}: publishing FAILED at {failed}; already uploaded: "
              + "; ".join(ctx.uploaded))
        raise CommandError(f"gate {failed} failed after uploads (see above)")
    if failed is not None:
        print(f"release {version}: STOPPED at {failed}; nothing was uploaded")
        raise CommandError(f"gate {failed} failed (see above)")
    print(f"release {version}: " + ("PUBLISHED" if args.publish else
                                    "all gates passed (dry run: nothing uploaded; rerun with "
                                    "--publish, and --reuse-dist to upload exactly these files)"))
    return 0
