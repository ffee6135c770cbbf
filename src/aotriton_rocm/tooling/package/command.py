"""``aotriton-rocm package``: the wheels, the conda packages, ``SHA256SUMS``
and the SBOM of one release, from the archives ``aotriton-rocm build`` wrote.

This module only orchestrates; each step is a module of its own:

* :mod:`.naming`: artifact names and the version rules (PEP 440 finals
  ``X.Y.Z`` from ``_version.py``; ``--local-version`` adds ``+rocmA.B``);
* :mod:`.archive_intake`: every archive is verified before anything is built;
* :mod:`.wheels`: the runtime wheel (+ sdist; :mod:`.snapshot` and
  :mod:`.reproducible`) and one kernel-image wheel per arch;
* :mod:`.conda`: the conda packages, into ``OUT/conda/<subdir>/`` (a channel);
* :mod:`.sbom`: the CycloneDX SBOM of everything ``SHA256SUMS`` lists;
* :mod:`.dist_dir`: the run is staged beside ``--out`` and renamed into
  place at the end, ``PACKAGE-COMPLETE`` written last: ``--out`` is either
  what it was before or the complete new output, and then holds only what
  this run wrote. A non-empty ``--out`` that no earlier ``package`` wrote is
  refused unless ``--clean``.

Before anything is built, every archive is verified, must come from one
build of the source tree being packaged (its build-inputs hash) and, unless
``--allow-subset``, from a whole build (not ``build --only``).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ...common.errors import INTERRUPTED, CommandError, UsageError
from ...common.files import describe_os_error
from .archive_intake import collect_archives, resolve_rocm_profile
from .archive_intake import check_complete, check_matches_sources
from .dist_dir import (COMPLETE_MARKER, MARKER_KIND, check_out, clean_leftovers, real_out, stage,
                       swap_into_place, write_sha256sums)
from .naming import PackagingError, read_release_version
from ..common.source_tree import find_source_root
from ..common.targets import TargetError, load_targets
from .wheels import build_wheels

__all__ = ["PackageOptions", "PackageResult", "package", "add_package_arguments", "run_package"]


@dataclass(frozen=True)
class PackageOptions:
    archives: Path = Path("build/archives")
    out: Path = Path("dist")
    archs: Tuple[str, ...] = ()        # () = every archive found
    rocm: Optional[str] = None         # default: the profile the manifests name
    local_version: bool = False        # X.Y.Z+rocmA.B
    wheels: bool = True
    conda: bool = True
    python: Tuple[str, ...] = ()       # conda runtime Python minors; () = recipe/variants.yaml
    source_root: Optional[Path] = None
    clean: bool = False                # replace a non-empty --out package did not write
    allow_subset: bool = False         # package archives of a `build --only` (tests)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "PackageOptions":
        return cls(archives=Path(args.archives), out=Path(args.out), archs=tuple(args.arch or ()),
                   rocm=args.rocm, local_version=args.local_version, wheels=not args.no_wheels,
                   conda=not args.no_conda, python=tuple(args.python or ()),
                   source_root=Path(args.source_root) if args.source_root else None,
                   clean=args.clean, allow_subset=args.allow_subset)


@dataclass
class PackageResult:
    out: Path
    version: str                       # as stamped (with the local label, if any)
    files: List[Path]                  # what this run made, relative to ``out``
    runtime_tags: List[str] = field(default_factory=list)
    timings: Dict[str, float] = field(default_factory=dict)


def add_package_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--archives", default="build/archives", metavar="DIR",
                        help="where `aotriton-rocm build` wrote <arch>.aotr (default: %(default)s)")
    parser.add_argument("--out", default="dist", metavar="DIR",
                        help="output directory; conda packages go to OUT/conda/<subdir>/ "
                             "(a channel) (default: %(default)s)")
    parser.add_argument("--arch", action="append", default=None, metavar="ARCH",
                        help="arch to package (repeatable; default: every archive found)")
    parser.add_argument("--rocm", default=None, metavar="A.B",
                        help="ROCm profile (default: the one the manifests name)")
    parser.add_argument("--local-version", action="store_true",
                        help="per-ROCm build: versions X.Y.Z+rocmA.B (not accepted by PyPI)")
    parser.add_argument("--no-conda", action="store_true", help="wheels only")
    parser.add_argument("--no-wheels", action="store_true", help="conda packages only")
    parser.add_argument("--python", action="append", default=None, metavar="3.N",
                        help="Python minor(s) of the conda runtime package (repeatable; "
                             "default: recipe/variants.yaml)")
    parser.add_argument("--source-root", default=None, metavar="DIR",
                        help="source tree to package (default: the one around the cwd)")
    parser.add_argument("--clean", action="store_true",
                        help="replace the whole content of a non-empty --out that no earlier "
                             "`package` wrote (one it wrote is always replaced)")
    parser.add_argument("--allow-subset", action="store_true",
                        help="package archives of a subset build (`build --only`), e.g. for a "
                             "test; a release needs whole builds")


def _check_known_archs(archs: Sequence[str], root: Path) -> None:
    """``--arch`` names archs of the source tree's ci/targets.toml."""
    try:
        targets = load_targets(root / "ci" / "targets.toml")
    except (OSError, TargetError):
        return  # the packaging steps say what is wrong with the tree
    unknown = [a for a in archs if a not in targets.archs]
    if unknown:
        raise UsageError(f"unknown arch {', '.join(unknown)}: the archs of {targets.path} are "
                         f"{', '.join(targets.archs)}")


def package(options: PackageOptions) -> PackageResult:
    """Build everything into a staging directory beside ``options.out``, write
    ``PACKAGE-COMPLETE`` last, then rename it into place. Raises
    PackagingError / UsageError; Ctrl-C leaves ``out`` untouched."""
    if not options.conda and not options.wheels:
        raise UsageError("--no-conda and --no-wheels together leave nothing to build: drop one "
                         "of them")
    out = real_out(options.out)
    clean_leftovers(out)
    root = (options.source_root or find_source_root()).resolve()
    why = check_out(out, options.clean, keep=[("the archives", options.archives),
                                              ("the source tree", root)])
    if why:
        raise UsageError(why)
    _check_known_archs(options.archs, root)
    staging: Optional[Path] = None
    try:
        version = read_release_version(root)
        archs = list(options.archs) or None
        # every archive is verified before anything is built
        inputs = collect_archives(options.archives, archs, version, options.rocm)
        check_complete(inputs, options.allow_subset)
        check_matches_sources(inputs, root)
        staging = stage(out)
        result = _package_into(options, root, staging, archs, version)
        (staging / COMPLETE_MARKER).write_text(json.dumps({
            "kind": MARKER_KIND,
            "version": result.version,
            "archs": [i.arch for i in inputs],
            "files": sorted(p.as_posix() for p in result.files),
            "build_inputs_hash": str(inputs[0].manifest.get("build_inputs_hash")),
        }, indent=1) + "\n", encoding="utf-8")
        swap_into_place(staging, out)
        staging = None
    except OSError as e:
        raise PackagingError(f"cannot write the output ({describe_os_error(e)}); {out} is "
                             f"unchanged: pass another --out") from e
    except KeyboardInterrupt:
        raise CommandError(f"interrupted; {out} left as it was (nothing partial written)",
                           INTERRUPTED) from None
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    result.out = out
    return result


def _package_into(options: PackageOptions, root: Path, out: Path, archs: Optional[List[str]],
                  version: str) -> PackageResult:
    timings: Dict[str, float] = {}
    report: Dict[str, object] = {}
    made: List[Path] = []
    runtime_wheel: Optional[Path] = None
    if options.wheels:
        made += build_wheels(root, options.archives, out, archs, options.rocm, options.local_version,
                             timings=timings, report=report)
        runtime_wheel = made[0]
    if options.conda:
        from .conda import build_conda

        inputs = collect_archives(options.archives, archs, version, options.rocm)
        profile = resolve_rocm_profile(options.rocm, inputs)
        if profile is None:
            raise PackagingError("conda packages need a ROCm profile: pass --rocm A.B")
        # The conda runtime repacks the repaired wheel; a +rocm wheel is fine
        # (the conda version is X.Y.Z, the profile is in the build string).
        made += build_conda(root, options.archives, out / "conda", [i.arch for i in inputs], profile,
                            python_versions=list(options.python) or None,
                            runtime_wheel=runtime_wheel, timings=timings)
    stamped = str(report.get("version") or version)
    if made:
        write_sha256sums(out, made)
        from .sbom import write_sbom

        # CycloneDX SBOM of everything SHA256SUMS lists (what this run wrote)
        sbom = write_sbom(out, stamped, source_root=root,
                          rocm_profile=report.get("rocm_profile") or options.rocm)
        write_sha256sums(out, [sbom])
        print(f"SBOM: {sbom.name}", file=sys.stderr)
    return PackageResult(out=out, version=stamped, files=[p.relative_to(out) for p in made],
                         runtime_tags=list(report.get("runtime_tags") or []), timings=timings)


def run_package(options: PackageOptions) -> int:
    result = package(options)
    for rel in result.files:
        print(result.out / rel)
    if result.runtime_tags:
        print(f"runtime wheel tags: {', '.join(result.runtime_tags)}", file=sys.stderr)
    if result.timings:
        print("timings: " + ", ".join(f"{k} {v:.1f}s" for k, v in result.timings.items()),
              file=sys.stderr)
    return 0
