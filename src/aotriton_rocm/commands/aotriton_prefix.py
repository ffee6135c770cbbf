"""``aotriton-rocm aotriton-prefix --out DIR``: an ``AOTRITON_INSTALLED_PREFIX``
for a PyTorch source build, from what is installed here.

PyTorch's ``cmake/External/aotriton.cmake`` links ``$P/lib/libaotriton_v2.so``,
compiles against ``$P/include/aotriton/*.h`` and copies ``$P/lib`` (newer
versions: ``libaotriton_v2*.so*`` and ``lib/aotriton.images/``) into
``torch/lib``. The prefix holds exactly that:

    lib/libaotriton_v2.so.<version>      our library of the chosen API line
    lib/libaotriton_v2.so                -> the file above
    lib/aotriton.images/amd-<arch>/<arch>.aotr   each installed kernel image
    include/aotriton/*.h                 that line's headers
    aotriton-rocm-prefix.json            what wrote it: every file with its sha256

Every image is verified first, as ``info`` verifies it (a bad one is refused
and nothing is written), and every copy is checked against its source. The
directory is written beside ``DIR`` (``.DIR.prefix-stage-<pid>``), then the
old ``DIR`` is renamed aside (``.DIR.prefix-old-<pid>``) and the new one into
place; a run interrupted between those two renames is undone by the next run
(it renames the old one back), which also removes what killed runs left.

Standard library only.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from ..common import images
from .._version import __version__
from ..common.errors import INTERRUPTED, CommandError, UsageError
from ..common.files import (describe_os_error, exclusive_lock, file_sha256, left_by_dead_process,
                            replace_dir_problem)
from ..common.paths import (AOTRITON_API_LINE_OF, AOTRITON_API_VERSIONS, aotriton_api_include,
                            aotriton_api_library, aotriton_api_line)

MARKER = "aotriton-rocm-prefix.json"
DEFAULT_LINE = "0.13"
# which PyTorch pins each line (--help); a line missing here is listed without a note
LINE_NOTES = {"0.11": "torch 2.9-2.11", "0.12": "torch 2.13",
              "0.13": "ROCm's release/2.12, PyTorch main"}
STAGE, OLD, LEGACY_STAGE = "stage-", "old-", ""   # .<name>.prefix-<tag><pid>


def api_lines() -> List[str]:
    """The ``--line`` values: every AOTriton API line aotriton-rocm implements."""
    return sorted(AOTRITON_API_LINE_OF, key=lambda v: tuple(int(x) for x in v.split(".")))


def parse_line(text: str) -> str:
    """``--line``: exactly one of :func:`api_lines` (``0.13.9`` is no line)."""
    if text not in AOTRITON_API_LINE_OF:
        raise UsageError(f"--line {text}: not an AOTriton API line aotriton-rocm implements; "
                         f"pass one of {', '.join(api_lines())} (the major.minor of the AOTriton "
                         f"version the PyTorch checkout pins)")
    return aotriton_api_line(text)


@dataclass(frozen=True)
class PrefixOptions:
    out: Path
    line: str
    archs: Optional[Tuple[str, ...]]
    clean: bool = False

    @classmethod
    def from_args(cls, args) -> "PrefixOptions":
        archs = tuple(dict.fromkeys(a.strip() for a in (args.arch or "").split(",") if a.strip()))
        return cls(Path(args.out), parse_line(args.line), archs or None, args.clean)


def add_aotriton_prefix_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Write an AOTRITON_INSTALLED_PREFIX for a PyTorch ROCm source build: our libaotriton_v2 "
        "(AOTriton's C++ API) of one API line, its headers and the installed kernel images, each "
        "verified as `aotriton-rocm info` verifies it. Then: AOTRITON_INSTALLED_PREFIX=DIR "
        "python setup.py develop (in a PyTorch checkout).")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="the prefix directory to write; one an earlier run wrote is replaced "
                             "whole, anything else is refused (see --clean)")
    lines = ", ".join(f"{v} ({LINE_NOTES[v]})" if v in LINE_NOTES else v for v in api_lines())
    parser.add_argument("--line", default=DEFAULT_LINE,
                        help=f"the AOTriton API line the PyTorch checkout pins: {lines}; "
                             f"default {DEFAULT_LINE}")
    parser.add_argument("--arch", help="comma-separated archs to include (default: every installed image)")
    parser.add_argument("--clean", action="store_true",
                        help="replace the whole content of a non-empty --out that this command did "
                             "not write, or files in it changed or added since (without it, such "
                             "an --out is refused)")


def _vendor_dir(arch: str) -> str:
    return ("nvidia-" if arch.startswith("sm_") else "amd-") + arch


# -- what goes in ----------------------------------------------------------------------

def _unknown_archs_message(missing: List[str], installed: Dict[str, Path]) -> str:
    have = ", ".join(sorted(installed)) or "none"
    known = [a for a in missing if images.publishes_image(a)]
    unknown = [a for a in missing if a not in known]
    if unknown:
        return (f"unknown arch {', '.join(unknown)}: no kernel image of it is installed here "
                f"(installed: {have}) or published (aotriton-rocm's images: "
                f"{', '.join(images.published_image_extras())}); pass --arch with installed archs, or leave --arch out "
                f"for all of them")
    return (f"no kernel image installed for {', '.join(known)} (installed: {have}): pip install "
            f"'aotriton-rocm[{','.join(a.replace('_', '') for a in known)}]'")


def _chosen_images(archs: Optional[Tuple[str, ...]]) -> Dict[str, Path]:
    installed = images.find_archives(refresh=True)
    if archs is None:
        broken = images.missing_images()
        if broken:  # info shows these as failures: the prefix would lack them silently
            raise CommandError("an installed kernel image cannot be used: " + "; ".join(
                f"{m.path} is missing or unreadable ({m.fix})" if m.arch else m.fix
                for m in broken))
        if not installed:
            raise CommandError("no kernel image is installed: install one per GPU arch first, "
                               "e.g. pip install 'aotriton-rocm[gfx942]'")
        return dict(sorted(installed.items()))
    missing = [a for a in archs if a not in installed]
    if missing:
        raise CommandError(_unknown_archs_message(missing, installed))
    return {a: installed[a] for a in archs}


def _verify_images(chosen: Dict[str, Path]) -> None:
    """Every image passes what ``info`` checks (identity, sidecar, every
    kernel's sha256, the C library's reader), or nothing is written."""
    from .install_checks import archive_problems

    bad = []
    for arch, path in chosen.items():
        _, problems = archive_problems(arch, path)
        if problems:
            bad.append(f"{arch}: " + "; ".join(problems))
    if bad:
        raise CommandError(f"{len(bad)} installed kernel image(s) failed verification, so no "
                           f"prefix was written (`aotriton-rocm info` shows them as failures):\n  "
                           + "\n  ".join(bad)
                           + "\nFix them as said, or leave them out with --arch.")


def _sources(line: str, chosen: Dict[str, Path]) -> Dict[str, Path]:
    """``{path inside the prefix: source file}``, every regular file."""
    library = aotriton_api_library(line)
    include = aotriton_api_include(line) / "aotriton"
    for what, path in (("library", library), ("headers", include)):
        if not path.exists():
            raise CommandError(f"this installation has no AOTriton API {what} for line {line} "
                               f"({path} is missing): reinstall aotriton-rocm "
                               f"(pip install --force-reinstall --no-deps aotriton-rocm)")
    files = {f"lib/{library.name}": library}
    for arch, archive in chosen.items():
        files[f"lib/aotriton.images/{_vendor_dir(arch)}/{archive.name}"] = archive
    for p in sorted(include.rglob("*")):
        if p.is_file():
            files[f"include/aotriton/{p.relative_to(include).as_posix()}"] = p
    return files


# -- what is there -----------------------------------------------------------------------

def _read_marker(out: Path) -> Optional[dict]:
    try:
        doc = json.loads((out / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ok = isinstance(doc, dict) and isinstance(doc.get("files"), dict) \
        and isinstance(doc.get("links"), dict)
    return doc if ok else None


def _foreign_content(out: Path, marker: Optional[dict]) -> List[str]:
    """What in ``out`` this command did not write, as its marker lists it:
    files added or changed since, and everything where there is no marker."""
    files = marker["files"] if marker else {}
    links = marker["links"] if marker else {}
    listed_dirs = {str(Path(rel).parent) for rel in list(files) + list(links)}
    listed_dirs |= {str(p) for d in list(listed_dirs) for p in Path(d).parents}
    foreign = []
    for root, dirs, names in os.walk(out):
        rel_root = Path(root).relative_to(out)
        for name in sorted(dirs + names):
            path, rel = Path(root) / name, (rel_root / name).as_posix()
            if rel == MARKER and marker:
                continue
            if path.is_symlink():
                if links.get(rel) != os.readlink(path):
                    foreign.append(rel)
            elif path.is_dir():
                if rel not in listed_dirs:
                    foreign.append(rel + "/")
                    dirs.remove(name)
            elif rel not in files:
                foreign.append(rel)
            elif file_sha256(path) != files[rel]:
                foreign.append(f"{rel} (changed)")
    return foreign


def _check_content(out: Path, clean: bool) -> None:
    if clean or not out.is_dir():
        return
    try:
        marker = _read_marker(out)
        foreign = _foreign_content(out, marker)
    except OSError as e:
        raise UsageError(f"--out {out} cannot be read ({describe_os_error(e)}): pass another "
                         f"--out") from None
    if foreign:
        more = len(foreign) - 5
        shown = ", ".join(foreign[:5]) + (f" and {more} more" if more > 0 else "")
        if marker:
            what = (f"holds files added or changed since aotriton-rocm aotriton-prefix wrote it "
                    f"({shown})")
        elif (out / MARKER).is_file():
            what = (f"was written by an earlier aotriton-rocm, whose {MARKER} does not list the "
                    f"files it wrote")
        else:
            what = f"was not written by aotriton-rocm aotriton-prefix (it holds {shown})"
        raise UsageError(f"--out {out} {what}; the command replaces the whole directory: pass "
                         f"--clean to replace its content, or an empty or new --out")


# -- leftovers of interrupted runs -------------------------------------------------------

def _leftovers(out: Path, tag: str) -> List[Path]:
    """``.<name>.prefix-<tag><pid>`` beside ``out`` of runs that are gone."""
    prefix = f".{out.name}.prefix-{tag}"
    try:
        entries = list(out.parent.iterdir())
    except OSError:
        return []
    return sorted(p for p in entries if p.name[len(prefix):].isdigit() and (
        left_by_dead_process(p.name, prefix) or p.name == f"{prefix}{os.getpid()}"))


def _remove(p: Path) -> None:
    if p.is_symlink() or not p.is_dir():
        p.unlink()
    else:
        shutil.rmtree(p)


def recover(out: Path) -> List[str]:
    """Undo what killed runs left beside ``out``: the old prefix renamed
    aside is renamed back where ``out`` is gone (a run killed between its two
    renames), and stage and old directories are removed. Returns what was done."""
    done = []
    olds = _leftovers(out, OLD)
    if olds and not os.path.lexists(out):
        back = max(olds, key=lambda p: p.stat().st_mtime)
        os.rename(back, out)
        olds.remove(back)
        done.append(f"restored {out} from {back.name}, where a run killed while replacing it "
                    f"had left it")
    for p in olds + _leftovers(out, STAGE) + _leftovers(out, LEGACY_STAGE):
        _remove(p)
        done.append(f"removed {p}, left by a killed run")
    return done


# -- writing -----------------------------------------------------------------------------

def _copy_verified(src: Path, dst: Path) -> str:
    """Copy ``src`` to ``dst``; its sha256, the same for both or CommandError."""
    want = file_sha256(src)
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dst)
    got = file_sha256(dst)
    if got != want:
        raise CommandError(f"the copy of {src} in {dst} differs from it (sha256 {got}, not "
                           f"{want}): check the disk holding --out, then run the command again")
    return want


def _write(stage: Path, line: str, sources: Dict[str, Path], chosen: Dict[str, Path]) -> dict:
    stage.mkdir()
    sha = {rel: _copy_verified(src, stage / rel) for rel, src in sources.items()}
    library = aotriton_api_library(line).name
    (stage / "lib" / "libaotriton_v2.so").symlink_to(library)
    record = {"written_by": f"aotriton-rocm {__version__}", "aotriton_api_line": line,
              "aotriton_version": AOTRITON_API_VERSIONS[line], "library": library,
              "library_sha256": sha[f"lib/{library}"],
              "images": {a: sha[f"lib/aotriton.images/{_vendor_dir(a)}/{p.name}"]
                         for a, p in chosen.items()},
              "files": sha, "links": {"lib/libaotriton_v2.so": library}}
    (stage / MARKER).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record


def _swap(stage: Path, out: Path) -> None:
    """``stage`` becomes ``out``; the old ``out`` stays until the new one is
    in place, and comes back if this is interrupted in between."""
    old = out.parent / f".{out.name}.prefix-{OLD}{os.getpid()}"
    moved = False
    try:
        if os.path.lexists(out):
            os.rename(out, old)
            moved = True
        os.rename(stage, out)
    except BaseException:
        if moved and not os.path.lexists(out):
            os.rename(old, out)
        raise
    if moved:
        shutil.rmtree(old, ignore_errors=True)


def write_prefix(options: PrefixOptions, say=print) -> dict:
    out = Path(os.path.abspath(options.out))
    if out.is_symlink():
        raise UsageError(f"--out {out} is a symbolic link: pass the directory itself")
    why = replace_dir_problem(out, "aotriton-prefix", "aotriton-prefix")
    if why:
        raise UsageError(why)
    stage = out.parent / f".{out.name}.prefix-{STAGE}{os.getpid()}"
    try:
        with exclusive_lock(out.parent / f".{out.name}.prefix-lock",
                            f"waiting for another aotriton-prefix writing {out}"):
            record = _replace(out, stage, options, say)
    except OSError as e:
        raise CommandError(f"could not write the prefix {out} ({describe_os_error(e)}); "
                           f"{out} is as it was") from e
    except KeyboardInterrupt:
        raise CommandError(f"interrupted; {out} is as it was", INTERRUPTED) from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return record


def _replace(out: Path, stage: Path, options: PrefixOptions, say) -> dict:
    for note in recover(out):
        say(note)
    _check_content(out, options.clean)
    chosen = _chosen_images(options.archs)
    _verify_images(chosen)
    sources = _sources(options.line, chosen)
    record = _write(stage, options.line, sources, chosen)
    _swap(stage, out)
    return record


def run_aotriton_prefix(options: PrefixOptions) -> int:
    record = write_prefix(options)
    print(f"wrote {options.out}: libaotriton_v2 {record['aotriton_version']} (AOTriton API line "
          f"{options.line}), images: {', '.join(record['images'])}, each verified")
    print(f"build PyTorch with: export AOTRITON_INSTALLED_PREFIX={options.out.resolve()}")
    return 0
