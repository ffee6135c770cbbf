"""``aotriton-rocm install-check``: install what ``package`` wrote into fresh
environments (a venv from the wheels, a conda prefix from the .conda files)
and run the smoke test in each. Exits non-zero if any install or smoke fails."""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from ...common.errors import CommandError

from ..package.conda import install_conda
from .envs import install_wheels_in_fresh_venv, python_for_conda_prefix, run_smoke


def _image_archs(dist: Path) -> list[str]:
    """Archs with an image wheel in dist (aotriton_rocm_gfx942-... -> gfx942)."""
    names = {w.name.split("-")[0] for w in dist.glob("aotriton_rocm_*.whl")}
    return sorted(n[len("aotriton_rocm_"):] for n in names)


def _smoke(where: str, python, env, report: Path) -> bool:
    print(f"[install-check] smoke in {where}", flush=True)
    proc = run_smoke(python, env, ["--json", str(report)])
    print(proc.stdout, flush=True)
    ok = proc.returncode == 0
    print(f"[install-check] {where}: smoke {'PASSED' if ok else 'FAILED'} "
          f"(exit {proc.returncode}); report {report}", flush=True)
    return ok


def check_wheels(dist: Path, work: Path) -> bool:
    runtime = sorted(dist.glob("aotriton_rocm-*.whl"))
    images = sorted(dist.glob("aotriton_rocm_*.whl"))
    if len(runtime) != 1 or not images:
        print(f"[install-check] {dist} needs one runtime wheel and at least one image wheel "
              f"(found {len(runtime)} and {len(images)}): run `aotriton-rocm package` first",
              file=sys.stderr)
        return False
    venv = work / "venv"
    shutil.rmtree(venv, ignore_errors=True)
    print(f"[install-check] fresh venv {venv}: {', '.join(w.name for w in runtime + images)}",
          flush=True)
    python = install_wheels_in_fresh_venv(runtime + images, venv)
    return _smoke("fresh venv", python, None, work / "smoke-venv.json")


def check_conda(dist: Path, work: Path) -> bool:
    channel = dist / "conda"
    if not channel.is_dir():
        print(f"[install-check] no conda channel at {channel}: run `aotriton-rocm package` "
              "without --no-conda", file=sys.stderr)
        return False
    prefix = work / "conda-prefix"
    shutil.rmtree(prefix, ignore_errors=True)
    # One runtime build per Python minor: take the one for the Python that runs it.
    py = f"py{sys.version_info.major}{sys.version_info.minor}"
    specs = [f"aotriton-rocm * {py}_*"] + [f"aotriton-rocm-{a}" for a in _image_archs(dist)]
    print(f"[install-check] fresh conda prefix {prefix}: {' '.join(specs)}", flush=True)
    install_conda(channel, specs, prefix)
    python, env = python_for_conda_prefix(prefix)
    return _smoke("fresh conda prefix", python, env, work / "smoke-conda.json")


def add_install_check_arguments(parser) -> None:
    parser.add_argument("--dist", default="dist", help="what `aotriton-rocm package` wrote")
    parser.add_argument("--work", default="build/install-check",
                        help="where the fresh environments and smoke reports go")
    parser.add_argument("--no-conda", action="store_true", help="wheels only")


@dataclass(frozen=True)
class InstallCheckOptions:
    dist: Path
    work: Path
    conda: bool = True

    @classmethod
    def from_args(cls, args) -> "InstallCheckOptions":
        return cls(dist=Path(args.dist), work=Path(args.work), conda=not args.no_conda)


def install_check(options: InstallCheckOptions) -> bool:
    """Install and smoke-test the wheels (and the conda packages); True when
    everything passed. Prints each step."""
    dist, work = options.dist.resolve(), options.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    ok = check_wheels(dist, work)
    if options.conda:
        ok = check_conda(dist, work) and ok
    print(f"[install-check] {'PASSED' if ok else 'FAILED'}")
    return ok


def run_install_check(options: InstallCheckOptions) -> int:
    if not install_check(options):
        raise CommandError(f"the packages in {options.dist} failed to install or smoke-test "
                           "(see above)")
    return 0
