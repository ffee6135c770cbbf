"""The gates of ``aotriton-rocm release`` up to the upload: build, package,
install-check, abi-check, changelog (command.py runs them in order; the
upload gates are in publish.py). A gate returns its verdict's text, or
raises GateSkipped or GateFailed."""

from __future__ import annotations

import contextlib
import io
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from ...common.errors import CommandError
from ...common.files import file_sha256
from ..package.dist_dir import read_sha256sums
from ..package.naming import local_label
from .credentials import Credentials
from .matrix import ReleaseOptions, Target, release_archs

__all__ = ["GateFailed", "GateSkipped", "Context", "run_quiet", "logs_dir", "changelog_has_section",
           "gate_build", "gate_package", "gate_install_check", "gate_abi_check", "gate_changelog"]


class GateFailed(Exception):
    pass


class GateSkipped(Exception):
    pass


@dataclass
class Context:
    args: ReleaseOptions
    root: Path
    version: str
    out: Path
    profiles: List[str]
    targets: List[Target]
    archives: Dict[str, Path] = field(default_factory=dict)   # profile -> archives dir
    credentials: Optional[Credentials] = None
    uploaded: List[str] = field(default_factory=list)
    plan: Dict[str, List[str]] = field(default_factory=dict)  # profile -> the archs it builds


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


def run_quiet(what: str, fn: Callable[[], Any], log: Path) -> Any:
    """Run a step, its output into ``log``; a failure (the step's
    CommandError, or any other exception: a tool's unexpected error fails the
    gate, never the release tool) is a GateFailed showing the log's tail."""
    buf = io.StringIO()
    failure = None
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            result = fn()
        except CommandError as e:
            print(f"{what}: {e}")
            failure = f"{what} exited {e.exit_code}"
        except Exception as e:
            print(f"{type(e).__name__}: {e}")
            failure = f"{what} failed ({type(e).__name__})"
    text = buf.getvalue()
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(text, encoding="utf-8")
    if failure is not None:
        raise GateFailed(failure + ":\n" + "\n".join(text.strip().splitlines()[-15:]))
    return result


def logs_dir(ctx: Context) -> Path:
    return ctx.out.parent / f".{ctx.out.name}-release-logs"


def _archives_in(d: Path) -> List[Path]:
    return sorted(d.glob("*.aotr")) if d.is_dir() else []


def gate_build(ctx: Context, profile: str) -> str:
    a = ctx.args
    base = a.build_dir.resolve() if a.build_dir else ctx.root / "build" / "release"
    build_dir = base / local_label(profile)
    if a.build_dir:
        for cand in (build_dir / "archives", base / "archives" if len(ctx.profiles) == 1 else None):
            if cand is not None and _archives_in(cand):
                _check_reused(ctx, cand, profile)
                ctx.archives[profile] = cand
                have = {p.stem for p in _archives_in(cand)}
                absent = [a for a in ctx.plan.get(profile, ()) if a not in have]
                note = (f"; not among them: {', '.join(absent)} (no image of those on this "
                        f"target's index)") if absent else ""
                return f"reused {len(have)} archive(s) in {cand}{note}"
    from ..builder.command import build

    run_quiet("build", lambda: build(profile, release_archs(a), build_dir, source_root=ctx.root,
                                  progress=False),
           logs_dir(ctx) / f"build-{local_label(profile)}.log")
    ctx.archives[profile] = build_dir / "archives"
    return f"built {len(_archives_in(build_dir / 'archives'))} archive(s) into {build_dir / 'archives'}"


def _check_reused(ctx: Context, archives: Path, profile: str) -> None:
    """Archives reused from --build-dir are verified, whole (no ``--only``)
    and built from this source tree (its build-inputs hash)."""
    from ..package.archive_intake import check_complete, check_matches_sources, collect_archives

    inputs = collect_archives(archives, list(ctx.args.arch) or None, ctx.version, profile)
    check_complete(inputs, offer_allow_subset=False)   # release has no --allow-subset
    check_matches_sources(inputs, ctx.root)


def _artifacts(dist: Path) -> List[Path]:
    return sorted(dist.glob("*.whl")) + sorted(dist.glob("*.tar.gz")) + sorted(dist.glob("conda/*/*.conda"))


def _expected_version(ctx: Context, t: Target) -> str:
    return f"{ctx.version}+{local_label(t.profile)}" if t.local else ctx.version


def _verify_dist(ctx: Context, t: Target) -> str:
    """--reuse-dist: OUT/<target> holds this target's packages, unchanged since
    SHA256SUMS was written."""
    sums = t.dist / "SHA256SUMS"
    if not sums.is_file():
        raise GateFailed(f"{t.dist} has no SHA256SUMS: package it first (a dry run without --reuse-dist)")
    listed = read_sha256sums(t.dist)
    bad = [n for n, d in sorted(listed.items())
           if not (t.dist / n).is_file() or file_sha256(t.dist / n) != d]
    if bad:
        raise GateFailed(f"{t.dist}: changed or missing since packaging: {', '.join(bad)} "
                         "(package again without --reuse-dist)")
    arts = _artifacts(t.dist)
    unlisted = [p.relative_to(t.dist).as_posix() for p in arts
                if p.relative_to(t.dist).as_posix() not in listed]
    if unlisted:
        raise GateFailed(f"{t.dist}: not in SHA256SUMS: {', '.join(unlisted)} (package again)")
    want = _expected_version(ctx, t)
    runtime = sorted(t.dist.glob("aotriton_rocm-*.whl"))
    if len(runtime) != 1 or runtime[0].name.split("-")[1] != want:
        raise GateFailed(f"{t.dist}: want one aotriton-rocm {want} runtime wheel, found "
                         f"{[p.name for p in runtime]} (package again)")
    if t.conda and not list(t.dist.glob("conda/*/*.conda")):
        raise GateFailed(f"{t.dist}: no conda packages (package again, or pass --no-conda)")
    return f"reused {len(arts)} artifact(s) in {t.dist}, SHA256SUMS verified"


def gate_package(ctx: Context, t: Target) -> str:
    a = ctx.args
    if a.reuse_dist:
        return _verify_dist(ctx, t)
    if t.dist.exists() and any(t.dist.iterdir()):
        raise GateFailed(f"{t.dist} is not empty: a release packages into a fresh directory "
                         "(or pass --reuse-dist to publish what a dry run packaged there)")
    from ..package.command import PackageOptions, package

    options = PackageOptions(archives=ctx.archives[t.profile], out=t.dist, source_root=ctx.root,
                             rocm=t.profile, local_version=t.local, conda=t.conda, python=a.python)
    run_quiet("package", lambda: package(options), logs_dir(ctx) / f"package-{t.name}.log")
    wheels = sorted(t.dist.glob("*.whl"))
    condas = sorted(t.dist.glob("conda/*/*.conda"))
    return (f"{_expected_version(ctx, t)} (ROCm {t.profile}): {len(wheels)} wheel(s), "
            f"{len(condas)} conda package(s), SHA256SUMS and SBOM in {t.dist}")


def gate_install_check(ctx: Context, t: Target) -> str:
    if "install-check" in ctx.args.skip:
        raise GateSkipped("--skip install-check")
    from .install_check import InstallCheckOptions, run_install_check

    options = InstallCheckOptions(dist=t.dist, work=logs_dir(ctx) / f"install-check-{t.name}",
                                  conda=t.conda)
    run_quiet("install-check", lambda: run_install_check(options),
           logs_dir(ctx) / f"install-check-{t.name}.log")
    return "fresh venv" + (" and fresh conda prefix" if t.conda else "") + ": smoke passed"


def _previous_for(prev: Path, t: Target) -> Optional[Path]:
    if (prev / t.name).is_dir():
        return prev / t.name
    runtime = sorted(prev.glob("aotriton_rocm-*.whl"))
    if runtime:
        label = runtime[0].name.split("-")[1].partition("+")[2]
        if label == (local_label(t.profile) if t.local else ""):
            return prev
    return None


def gate_abi_check(ctx: Context, t: Target) -> str:
    if "abi-check" in ctx.args.skip:
        raise GateSkipped("--skip abi-check")
    if not ctx.args.previous:
        raise GateSkipped("no --previous release given (first release of the line)")
    prev = ctx.args.previous
    if not prev.is_dir():
        raise GateFailed(f"--previous {prev}: not a directory (give the previous release's output "
                         "directory, or a directory of its wheels)")
    old = _previous_for(prev, t)
    if old is None:
        raise GateSkipped(f"no previous {t.name} release in {prev} (a new target of this release)")
    from .abi_check import AbiCheckOptions, check_releases

    options = AbiCheckOptions(old=old, new=t.dist)
    res = run_quiet(f"abi-check against {old}", lambda: check_releases(options),
                 logs_dir(ctx) / f"abi-check-{t.name}.log")
    if not res.ok:
        raise GateFailed(f"abi-check against {old}: {res.verdict}")
    return res.verdict


def gate_changelog(ctx: Context) -> str:
    changelog = ctx.root / "CHANGELOG.md"
    if not changelog_has_section(changelog, ctx.version):
        raise GateFailed(f"{changelog} has no `## {ctx.version}` section (an Unreleased heading "
                         "does not count): write the release notes first")
    return f"CHANGELOG.md has a section for {ctx.version}"
