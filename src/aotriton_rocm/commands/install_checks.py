"""The installation checks that launch no kernel, shared by ``smoke`` and
``info`` (so that ``info`` sees what ``smoke`` sees): libaotriton_rocm
loads, the torch extension loads where torch takes that route, and every
installed archive is readable, what its name says, of this runtime's ABI
line, matches its sidecar, every kernel's sha256 checks out, the C reader
accepts it, and it comes from the build this runtime was packaged with.

Each check gives rows ``(what, ok, detail)``; a failing row's detail names
the file and the fix. Standard library only, apart from the native
libraries it checks.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Tuple

from ..common import images
from .._version import ABI_VERSION, __version__
from ..common.archive import Archive, ArchiveError, identity_fix, manifest_path_for
from ..common.archive_index import clip
from ..common.archive_identity import identity_problems, subset_of, verify_against_manifest, with_fix

__all__ = ["Row", "REINSTALL_RUNTIME", "NOT_READ_BY_C", "check_library", "check_torch_extension",
           "library_error", "native_problems", "archive_problems", "archive_note", "check_archives",
           "installation_rows"]

Row = Tuple[str, bool, str]
REINSTALL_RUNTIME = f"pip install --force-reinstall --no-deps 'aotriton-rocm=={__version__}'"
MAX_DETAIL = 2000  # one row stays readable whatever a damaged file holds


def check_library() -> Row:
    """libaotriton_rocm loads (every GPU call and the archive reader use it)."""
    from ..core import native

    try:
        lib = native.library()
    except OSError as exc:
        return ("library", False, f"{clip(exc, 600)}; fix: {REINSTALL_RUNTIME}")
    return ("library", True, f"libaotriton_rocm {lib.aotr_version().decode()} "
                             f"({native.library_path()})")


def check_torch_extension() -> Optional[Row]:
    """libaotriton_rocm_torch loads where it is installed and this torch
    (>= 2.10) would take that route; None where torch is older. An empty or
    broken file fails (torch would otherwise fall back without a word)."""
    from ..core import torch_native

    try:
        if not torch_native._torch_version_ok():
            return None
    except ImportError:
        return None
    path = torch_native.library_path()
    try:
        present = path.exists()
    except OSError:
        present = True  # unreadable: load() says why
    if not present:
        return ("torch extension", True, f"not installed ({path.name}): torch takes the Python "
                                         f"route")
    try:
        torch_native.load()
    except OSError as exc:
        return ("torch extension", False, f"{clip(exc, 600)}; fix: {REINSTALL_RUNTIME}")
    return ("torch extension", True, str(path))


def library_error() -> Optional[str]:
    """Why libaotriton_rocm does not load here, or None when it does."""
    from ..core import native

    try:
        native.library()
    except OSError as exc:
        return clip(exc, 600)
    return None


NOT_READ_BY_C = "not checked by the C reader: libaotriton_rocm did not load (see the library row)"


def native_problems(path: Path) -> Optional[List[str]]:
    """The C reader's verdict (native.verify_archive: the index under the C
    parser's rules, the records, identity, every code object): its problems,
    [] when it accepts the archive, None when libaotriton_rocm does not load
    (then nothing was checked: :func:`library_error` says why)."""
    from ..core import native

    if library_error() is not None:
        return None
    try:
        native.verify_archive(path)
    except native.NativeError as exc:
        return [f"libaotriton_rocm: {exc}"]
    except OSError as exc:  # a library that loaded but broke since: report, never raise
        return [f"libaotriton_rocm: {clip(exc, 600)}"]
    return []


def _inputs_problem(archive: Archive, path: Path, arch: str) -> List[str]:
    packaged = images.packaged_inputs_hash()
    theirs = archive.manifest.get("build_inputs_hash")
    if packaged is None or theirs == packaged:
        return []
    return [f"{path}: built from other kernel sources (build inputs hash {clip(theirs, 64)}) "
            f"than the ones aotriton-rocm {__version__} was packaged with ({packaged}): install "
            f"the image and the runtime of one release; {identity_fix(arch)}"]


def archive_problems(arch: str, path: Path, native_check: bool = True) -> Tuple[Optional[Archive], List[str]]:
    """The archive (None if it cannot be opened) and its problems, each once,
    the last one naming the fix. The C reader (``native_check``) reads an
    archive only once the Python checks found nothing (else it would report
    the same damage again); where libaotriton_rocm does not load it adds no
    problem: that is the library's failure (check_library), not the archive's."""
    try:
        a = Archive.open(path)
    except ArchiveError as exc:
        return None, [str(exc)]
    problems = identity_problems(a, path, expected_abi=ABI_VERSION)
    sidecar = manifest_path_for(path)
    if sidecar.exists():
        problems += verify_against_manifest(path, sidecar)  # includes Archive.verify()
    else:
        problems += a.verify()
        problems.append(f"{sidecar}: the manifest sidecar of {path.name} is missing; "
                        f"{identity_fix(arch)}")
    problems += _inputs_problem(a, path, arch)
    if not problems and native_check:
        problems = native_problems(path) or []
    return a, with_fix(list(dict.fromkeys(problems)), identity_fix(arch))


def archive_note(archive: Optional[Archive], native_checked: bool) -> str:
    """What a passing archive row adds after its path: a subset image names
    its filter; an archive the C reader could not read says so."""
    notes = []
    subset = subset_of(archive.manifest) if archive is not None else None
    if subset:
        notes.append(f"subset image: built with --only {subset}, it holds only the kernels "
                     f"that filter selects")
    if not native_checked:
        notes.append(NOT_READ_BY_C)
    return f" ({'; '.join(notes)})" if notes else ""


def _detail(problems: List[str]) -> str:
    """The problems on one line, cut to MAX_DETAIL but for the last one (the fix)."""
    text = "; ".join(problems)
    if len(text) <= MAX_DETAIL or len(problems) < 2:
        return clip(text, MAX_DETAIL)
    return f"{clip('; '.join(problems[:-1]), MAX_DETAIL)}; {problems[-1]}"


def check_archives(require_arch: Optional[str]) -> List[Row]:
    """One row per installed archive, per installed image whose archive is
    missing or unreadable, and for the GPU's arch (``require_arch``)."""
    rows: List[Row] = []
    found = images.find_archives()
    native_checked = library_error() is None
    for arch, path in sorted(found.items()):
        archive, problems = archive_problems(arch, path)
        if problems:
            rows.append((f"archive {arch}", False, _detail(problems)))
        else:
            rows.append((f"archive {arch}", True, f"{path}{archive_note(archive, native_checked)}"))
    for m in images.missing_images():
        if m.arch:
            rows.append((f"archive {m.arch}", False, f"{m.path} is missing or unreadable, but its "
                                                     f"image is installed; fix: {m.fix}"))
        else:
            rows.append(("kernel images", False, m.fix))
    if require_arch is not None and require_arch not in found:
        rows.append((f"arch {require_arch}", False,
                     f"no kernel image installed for this GPU ({require_arch}); installed: "
                     f"{', '.join(sorted(found)) or 'none'}. "
                     f"Install it: pip install 'aotriton-rocm[{require_arch.replace('_', '')}]'"))
    elif require_arch is not None:
        rows.append((f"arch {require_arch}", True, "covered by the installed images"))
    return rows


def installation_rows(require_arch: Optional[str] = None) -> List[Row]:
    """Every check above: library, torch extension, archives."""
    rows = [check_library()]
    ext = check_torch_extension()
    if ext is not None:
        rows.append(ext)
    return rows + check_archives(require_arch)
