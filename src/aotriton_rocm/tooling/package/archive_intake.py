"""Archive intake: the archives ``build`` wrote, checked before anything is
packaged from them (:func:`collect_archives`): each is what its file name and
sidecar say, of the ABI line being packaged, matches its sidecar byte for
byte, every kernel's sha256 checks out and the runtime's C reader accepts it
(:func:`verify_archive`), and the archives of one release share one
build-inputs hash (:func:`check_one_build`). Build-time only.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

from ..._version import abi_line, public_version
from ...common.archive import ARCHIVE_SUFFIX, MANIFEST_SUFFIX, Archive, ArchiveError, build_command, identity_fix
from ...common.archive_identity import identity_problems, verify_against_manifest, with_fix
from ...common.archive_index import strict_json_loads
from ..common.inputs_hash import source_tree_inputs_hash
from .naming import PackagingError, archname, check_profile

__all__ = ["ArchiveInput", "read_manifest", "available_archs", "collect_archives", "verify_archive",
           "check_one_build", "check_matches_sources", "check_complete", "resolve_rocm_profile"]


@dataclass
class ArchiveInput:
    arch: str
    archive: Path
    manifest_path: Path
    manifest: Dict[str, object] = field(default_factory=dict)


def read_manifest(path: Path) -> Dict[str, object]:
    try:
        doc = strict_json_loads(path.read_bytes())
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
            raise PackagingError(_no_archives_message(d))
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
            raise PackagingError(f"{ap}: no archive for {arch}; build it: {build_command(d, [arch])}")
        if ap.stat().st_size == 0:
            raise PackagingError(f"{ap}: archive is empty (a failed build?)")
        if not mp.is_file():
            raise PackagingError(f"{mp}: the archive's manifest is missing")
        man = read_manifest(mp)
        m_arch = man.get("arch")
        if m_arch is not None and m_arch != arch:
            raise PackagingError(f"{mp}: built for {m_arch!r}, not {arch!r}")
        m_ver = man.get("package_version")
        if m_ver is not None and public_version(str(m_ver)) != version:
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
    (archive_identity.identity_problems), matches its sidecar byte for byte, every
    kernel's sha256 checks out (verify_against_manifest, Archive.verify) and
    the runtime's C reader accepts it (native.verify_archive). The problems
    end with the fix."""
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
        problems = identity_problems(a, archive, expected_abi=abi_line(version),
                                     context="build")
        problems += verify_against_manifest(archive, manifest_path)
        if not problems:
            problems = _c_reader_problems(Path(archive), version)
        problems = with_fix(list(dict.fromkeys(problems)),
                            identity_fix(a.arch, "build", archive))
    if key is not None:
        _verified[key] = problems
    return problems


def _c_reader_problems(archive: Path, version: str) -> List[str]:
    """What the runtime's C reader refuses in ``archive`` (the Python checks
    passed it). It can judge only archives of its own ABI line (the line is
    compiled in): packaging another line's release, which the tests do,
    leaves the C reading to that release's library."""
    from ..._version import ABI_VERSION
    from ...commands.install_checks import library_error, native_problems

    if abi_line(version) != ABI_VERSION:
        return []
    problems = native_problems(archive)
    if problems is None:
        return [f"{archive}: not checked by the C reader: libaotriton_rocm did not load "
                f"({library_error()}); nothing ships unread by it: install aotriton-rocm with "
                f"its native library (pip install -e . in a checkout) or point "
                f"AOTRITON_ROCM_NATIVE_LIB at a built libaotriton_rocm"]
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
        raise PackagingError(
            f"the archives in {inputs[0].archive.parent} come from {len(by_hash)} different builds "
            f"(build inputs hash {groups}): a release ships archives of one build only. Rebuild "
            f"them together: {_rebuild_command(inputs)} (or package only the current ones with "
            f"--arch)")


def _no_archives_message(d: Path) -> str:
    inner = d / "archives"
    if available_archs(inner):
        return (f"no *{ARCHIVE_SUFFIX} archive in {d}, but {inner} holds some: build writes its "
                f"archives into OUT/archives/; pass --archives {inner}")
    return f"no *{ARCHIVE_SUFFIX} archive in {d}; build them first: {build_command(d)}"


def _rebuild_command(inputs: Sequence[ArchiveInput]) -> str:
    return build_command(inputs[0].archive.parent, [i.arch for i in inputs])


def check_matches_sources(inputs: Sequence[ArchiveInput], source_root: Path) -> None:
    """Each archive was built from the source tree being packaged: its
    manifest's build-inputs hash is that tree's (kernel sources, variants,
    targets, tuning data, with the compiler the manifest names). Archives of
    older kernel sources beside a newer runtime are refused."""
    wrong: List[str] = []
    ours: Dict[str, str] = {}
    for i in inputs:
        compiler = str(i.manifest.get("compiler_version") or "")
        if compiler not in ours:
            try:
                ours[compiler] = source_tree_inputs_hash(source_root, compiler)
            except OSError as e:
                raise PackagingError(f"cannot hash the build inputs of {source_root} ({e}): "
                                     f"package from a complete checkout (--source-root)") from None
        theirs = i.manifest.get("build_inputs_hash")
        if theirs != ours[compiler]:
            wrong.append(f"{i.archive}: build inputs hash {theirs or '(none recorded)'}, the "
                         f"source tree's {ours[compiler]}")
    if wrong:
        raise PackagingError(
            f"{len(wrong)} archive(s) were not built from the sources being packaged "
            f"({source_root}; a kernel, variants.toml, targets.toml or the tuning data changed "
            f"since): they would ship kernels that do not match the runtime.\n  "
            + "\n  ".join(wrong) + f"\nRebuild them: {_rebuild_command(inputs)}")


def check_complete(inputs: Sequence[ArchiveInput], allow_subset: bool = False,
                   offer_allow_subset: bool = True) -> None:
    """A subset build (``build --only``) holds only some kernels: refused for
    a release unless ``allow_subset`` (tests). ``offer_allow_subset``: the
    message names ``--allow-subset`` (package has it, release does not)."""
    partial = [i for i in inputs if i.manifest.get("subset")]
    if partial and not allow_subset:
        listed = "; ".join(f"{i.archive} (--only {i.manifest['subset']})" for i in partial)
        raise PackagingError(
            f"{len(partial)} archive(s) come from a subset build and hold only some kernels: "
            f"{listed}. Rebuild them whole: {_rebuild_command(partial)}"
            + (" (or pass --allow-subset to package a subset anyway, e.g. for a test)"
               if offer_allow_subset else ""))


def resolve_rocm_profile(rocm_profile: Optional[str], inputs: Iterable[ArchiveInput]) -> Optional[str]:
    """The given profile, else the one all manifests agree on, else None."""
    if rocm_profile is not None:
        return check_profile(str(rocm_profile))
    found = {str(i.manifest["rocm_profile"]) for i in inputs if i.manifest.get("rocm_profile") is not None}
    if len(found) > 1:
        raise PackagingError(f"archives were built for different ROCm profiles: {sorted(found)}")
    return check_profile(found.pop()) if found else None
