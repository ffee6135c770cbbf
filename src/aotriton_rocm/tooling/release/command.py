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
import contextlib
import io
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from ...errors import CommandError, UsageError
from ...files import atomic_copy, describe_os_error, file_sha256
from ..package.dist_dir import read_sha256sums
from ..package.naming import local_label, read_release_version
from ..common.source_tree import find_source_root

__all__ = ["GATES", "CREDENTIAL_VARS", "Credentials", "Target", "ReleaseOptions",
           "changelog_has_section", "find_credentials", "add_release_arguments", "run_release"]

GATES = ("build", "package", "install-check", "abi-check", "changelog", "credentials", "publish")
CREDENTIAL_VARS = ("TWINE_USERNAME", "TWINE_PASSWORD")
SKIPPABLE = ("install-check", "abi-check")
DEFAULT_TARGET = "default"


class GateFailed(Exception):
    pass


class GateSkipped(Exception):
    pass


@dataclass
class Credentials:
    username: str
    password: str = field(repr=False)
    source: str = ""

    def env(self) -> Dict[str, str]:
        """The environment of an upload: twine reads these itself, so the
        password is never on a command line."""
        return {"TWINE_USERNAME": self.username, "TWINE_PASSWORD": self.password}


@dataclass
class Target:
    name: str                 # "default" or "rocmA.B"
    profile: str              # "A.B": the archives it is packaged from
    local: bool               # X.Y.Z+rocmA.B wheels
    conda: bool               # also the conda packages
    dist: Path                # OUT/<name>
    index_url: Optional[str]  # where its wheels are uploaded


@dataclass(frozen=True)
class ReleaseOptions:
    publish: bool = False
    rocm: Tuple[str, ...] = ()            # () = ci/targets.toml's default profile
    arch: Tuple[str, ...] = ()            # () = the build's defaults
    default_rocm: Optional[str] = None
    no_default: bool = False
    out: Path = Path("dist")
    reuse_dist: bool = False
    build_dir: Optional[Path] = None
    conda: bool = True
    python: Tuple[str, ...] = ()
    previous: Optional[Path] = None
    index_url: Optional[str] = None
    rocm_index_url: Optional[str] = None
    channel: Optional[Path] = None
    skip: Tuple[str, ...] = ()
    source_root: Optional[Path] = None

    @classmethod
    def from_args(cls, a: argparse.Namespace) -> "ReleaseOptions":
        def path(v: Optional[str]) -> Optional[Path]:
            return Path(v) if v else None
        return cls(publish=a.publish, rocm=tuple(a.rocm or ()), arch=tuple(a.arch or ()),
                   default_rocm=a.default_rocm, no_default=a.no_default, out=Path(a.out),
                   reuse_dist=a.reuse_dist, build_dir=path(a.build_dir), conda=not a.no_conda,
                   python=tuple(a.python or ()), previous=path(a.previous), index_url=a.index_url,
                   rocm_index_url=a.rocm_index_url, channel=path(a.channel),
                   skip=tuple(a.skip or ()), source_root=path(a.source_root))


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


def _quiet(what: str, fn: Callable[[], Any], log: Path) -> Any:
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


def _logs(ctx: Context) -> Path:
    return ctx.out.parent / f".{ctx.out.name}-release-logs"


# ---------------------------------------------------------------- credentials

def find_credentials(service: Optional[str]) -> Tuple[Optional[Credentials], str]:
    """Upload credentials: TWINE_USERNAME and TWINE_PASSWORD from the
    environment; what is missing there from the keyring (``keyring`` package,
    the same lookup twine does: service = the index URL). Returns
    (credentials or None, where they came from / why there are none)."""
    user = os.environ.get("TWINE_USERNAME") or None
    password = os.environ.get("TWINE_PASSWORD") or None
    if user and password:
        return Credentials(user, password, "TWINE_USERNAME and TWINE_PASSWORD from the environment"), ""
    why_not = "TWINE_USERNAME and TWINE_PASSWORD are not both set"
    if not service:
        return None, why_not + " (and a keyring lookup needs --index-url)"
    try:
        import keyring
        from keyring.errors import KeyringError
    except ImportError:
        return None, why_not + " and the keyring package is not installed (pip install keyring)"
    try:
        if not user:
            cred = keyring.get_credential(service, None)
            if cred is not None and cred.username:
                user = cred.username
                password = password or cred.password
        if user and not password:
            password = keyring.get_password(service, user)
    except KeyringError as e:
        return None, f"{why_not}, and the keyring is unusable: {type(e).__name__}: {e}"
    except Exception as e:  # a broken keyring backend must not take the release down
        return None, f"{why_not}, and the keyring lookup failed: {type(e).__name__}"
    if user and password:
        origin = "the environment" if os.environ.get("TWINE_USERNAME") else "the keyring"
        return Credentials(user, password, f"username from {origin}, password from the keyring "
                                           f"({service})"), ""
    return None, (f"{why_not}, and the keyring has no "
                  + ("password for that user" if user else "credentials")
                  + f" for {service} (`keyring set {service} USERNAME`)")


def _redact(ctx: Context, text: str) -> str:
    if ctx.credentials and ctx.credentials.password:
        text = text.replace(ctx.credentials.password, "********")
    return text


# ---------------------------------------------------------------------- targets

def _profiles(args: ReleaseOptions, root: Path) -> Tuple[List[str], Optional[str]]:
    """(profiles of the matrix, the default build's profile or None)."""
    from ..common.targets import TargetError, load_targets

    try:
        targets = load_targets(root / "ci" / "targets.toml")
    except (TargetError, OSError) as e:
        raise UsageError(f"cannot read the ROCm profiles: {e}") from e
    wanted: List[str] = []
    for item in args.rocm or [targets.default_profile]:
        for tok in str(item).split(","):
            tok = tok.strip()
            if not tok:
                continue
            if tok == "all":
                names = list(targets.profiles)
            else:
                try:
                    names = [targets.profile(tok).name]
                except TargetError as e:
                    raise UsageError(str(e)) from e
            wanted += [n for n in names if n not in wanted]
    wanted.sort(key=lambda v: tuple(int(x) for x in v.split(".")))
    if args.no_default:
        return wanted, None
    if args.default_rocm:
        try:
            d = targets.profile(args.default_rocm).name
        except TargetError as e:
            raise UsageError(str(e)) from e
        if d not in wanted:
            raise UsageError(f"--default-rocm {d} is not in the release matrix ({', '.join(wanted)}): "
                                 f"add --rocm {d}")
        return wanted, d
    return wanted, (targets.default_profile if targets.default_profile in wanted else None)


def _rocm_index(args: ReleaseOptions, profile: str) -> Optional[str]:
    base = args.rocm_index_url or args.index_url
    return f"{base.rstrip('/')}/{local_label(profile)}/" if base else None


def _targets(args: ReleaseOptions, out: Path, profiles: List[str],
             default: Optional[str]) -> List[Target]:
    ts = []
    if default is not None:
        ts.append(Target(DEFAULT_TARGET, default, False, False, out / DEFAULT_TARGET, args.index_url))
    for p in profiles:
        name = local_label(p)
        ts.append(Target(name, p, True, args.conda, out / name, _rocm_index(args, p)))
    return ts


# ---------------------------------------------------------------------- the gates

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
                return f"reused {len(_archives_in(cand))} archive(s) in {cand}"
    from ..build.command import build

    _quiet("build", lambda: build(profile, list(a.arch) or None, build_dir, source_root=ctx.root,
                                  progress=False),
           _logs(ctx) / f"build-{local_label(profile)}.log")
    ctx.archives[profile] = build_dir / "archives"
    return f"built {len(_archives_in(build_dir / 'archives'))} archive(s) into {build_dir / 'archives'}"


def _check_reused(ctx: Context, archives: Path, profile: str) -> None:
    """Archives reused from --build-dir are verified, whole (no ``--only``)
    and built from this source tree (its build-inputs hash)."""
    from ..package.archive_intake import check_complete, check_matches_sources, collect_archives

    inputs = collect_archives(archives, list(ctx.args.arch) or None, ctx.version, profile)
    check_complete(inputs)
    check_matches_sources(inputs, ctx.root)


def _check_out(out: Path) -> None:
    """--out is created and written before any gate runs."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise UsageError(f"--out {out} cannot be written ({describe_os_error(e)}): pass a "
                         f"writable directory") from None


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
    _quiet("package", lambda: package(options), _logs(ctx) / f"package-{t.name}.log")
    wheels = sorted(t.dist.glob("*.whl"))
    condas = sorted(t.dist.glob("conda/*/*.conda"))
    return (f"{_expected_version(ctx, t)} (ROCm {t.profile}): {len(wheels)} wheel(s), "
            f"{len(condas)} conda package(s), SHA256SUMS and SBOM in {t.dist}")


def gate_install_check(ctx: Context, t: Target) -> str:
    if "install-check" in ctx.args.skip:
        raise GateSkipped("--skip install-check")
    from .install_check import InstallCheckOptions, run_install_check

    options = InstallCheckOptions(dist=t.dist, work=_logs(ctx) / f"install-check-{t.name}",
                                  conda=t.conda)
    _quiet("install-check", lambda: run_install_check(options),
           _logs(ctx) / f"install-check-{t.name}.log")
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
    res = _quiet(f"abi-check against {old}", lambda: check_releases(options),
                 _logs(ctx) / f"abi-check-{t.name}.log")
    if not res.ok:
        raise GateFailed(f"abi-check against {old}: {res.verdict}")
    return res.verdict


def gate_changelog(ctx: Context) -> str:
    changelog = ctx.root / "CHANGELOG.md"
    if not changelog_has_section(changelog, ctx.version):
        raise GateFailed(f"{changelog} has no `## {ctx.version}` section (an Unreleased heading "
                         "does not count): write the release notes first")
    return f"CHANGELOG.md has a section for {ctx.version}"


def gate_credentials(ctx: Context) -> str:
    if not any(_uploads(t) for t in ctx.targets):
        raise GateSkipped("no wheels to upload")
    creds, why_not = find_credentials(ctx.args.index_url or ctx.args.rocm_index_url)
    if creds is None:
        raise GateFailed(f"no upload credentials: {why_not}")
    ctx.credentials = creds
    return creds.source  # where they came from, never what they are


def _uploads(t: Target) -> List[Path]:
    return sorted(t.dist.glob("*.whl")) + sorted(t.dist.glob("*.tar.gz"))


def twine_upload(files: List[Path], index_url: str, credentials: Credentials) -> Tuple[int, str]:
    """``twine upload``, the credentials in its environment (never on its
    command line), no keyring lookups of its own."""
    env = dict(os.environ)
    env.update(credentials.env())
    env["PYTHON_KEYRING_BACKEND"] = "keyring.backends.null.Keyring"
    proc = subprocess.run([sys.executable, "-m", "twine", "upload", "--non-interactive",
                           "--disable-progress-bar", "--repository-url", index_url,
                           *map(str, files)], capture_output=True, text=True, timeout=1800, env=env)
    return proc.returncode, proc.stdout + proc.stderr


def copy_to_channel(condas: List[Path], channel: Path) -> List[Path]:
    from ..package.conda import index_channel

    for src in condas:
        dst = channel / src.parent.name / src.name
        if dst.exists():
            raise GateFailed(f"{dst} already exists in the channel: a published package is never "
                             "replaced (release a new version)")
    copied = [atomic_copy(src, channel / src.parent.name / src.name) for src in condas]
    index_channel(channel)
    return copied


def gate_publish(ctx: Context, t: Target) -> str:
    files = _uploads(t)
    if not files:
        raise GateSkipped("nothing to upload")
    where = t.index_url or "(no --index-url)"
    if not ctx.args.publish:
        raise GateSkipped(f"dry run: would upload {len(files)} file(s) to {where}")
    if not t.index_url:
        raise GateFailed(f"--publish needs --index-url for the {t.name} wheels")
    assert ctx.credentials is not None
    rc, out = twine_upload(files, t.index_url, ctx.credentials)
    if rc != 0:
        raise GateFailed(f"twine upload to {t.index_url} failed:\n"
                         + "\n".join(out.strip().splitlines()[-10:]))
    ctx.uploaded.append(f"{len(files)} file(s) to {t.index_url}")
    return f"uploaded {len(files)} file(s) to {t.index_url}"


def gate_publish_conda(ctx: Context) -> str:
    condas = [c for t in ctx.targets if t.conda for c in sorted(t.dist.glob("conda/*/*.conda"))]
    if not condas:
        raise GateSkipped("no conda packages")
    channel = ctx.args.channel
    if not ctx.args.publish:
        raise GateSkipped(f"dry run: would add {len(condas)} conda package(s) to "
                          f"{channel or '(no --channel)'}")
    if not channel:
        raise GateFailed("--publish needs --channel for the conda packages")
    copied = copy_to_channel(condas, channel)
    ctx.uploaded.append(f"{len(copied)} conda package(s) to {channel}")
    return f"{len(copied)} conda package(s) into {channel} (indexed)"


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
                        help="arch or arch set, per profile (repeatable; default: the build's defaults)")
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
        profiles, default = _profiles(args, root)
    except CommandError as e:
        raise UsageError(str(e)) from e
    out = args.out.resolve()
    _check_out(out)
    ctx = Context(args=args, root=root, version=version, out=out, profiles=profiles,
                  targets=_targets(args, out, profiles, default))
    mode = "PUBLISH" if args.publish else "DRY RUN"
    print(f"aotriton-rocm release {version} ({mode}) from {root}", flush=True)
    print(f"matrix: ROCm {', '.join(profiles)} x arch {', '.join(args.arch or ['(build defaults)'])}; "
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
