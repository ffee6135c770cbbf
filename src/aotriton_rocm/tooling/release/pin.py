"""``aotriton-rocm pin --torch A.B``: the requirement lines for a torch version.

Reads the torch compatibility matrix (``aotriton_rocm/torch_compat.json``),
picks the newest ABI line that supports that torch and prints the pip
requirement (``~=X.Y.0``: any point release of the line) and the conda specs
(``>=X.Y.0,<X.(Y+1).0a0``: the bound stays below every pre-release of the next
line). Also home of :func:`update_readme`, which rewrites README.md's
generated torch table.

``--rocm A.B`` picks the build of one ROCm release by where it comes from,
never by version order: PEP 440 compares local labels segment by segment as
strings, so ``0.1.0+rocm7.2`` sorts above ``0.1.0+rocm10.0`` (TheRock#7183),
and a resolver that saw both would take 7.2. pip gets the per-ROCm index
(``INDEX/rocmA.B/simple/``, which holds that release's builds only), conda
the build string (``*_rocmAB_*``; the underscores keep ``rocm71`` from
matching ``rocm714``).
"""
from __future__ import annotations

import argparse
import importlib.metadata
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ...common import images
from ...core import torch_compat
from ...common.errors import CommandError

__all__ = ["PinError", "PinOptions", "pin_lines", "update_readme", "add_pin_arguments", "run_pin"]

_ARCH = re.compile(r"^[a-z][a-z0-9_]*$")


class PinError(CommandError, ValueError):
    """No release line fits the request (exit status 1)."""


# Where --rocm without --index-url points (README.md's placeholder).
INDEX_PLACEHOLDER = "https://INDEX"


@dataclass(frozen=True)
class PinOptions:
    torch: str
    archs: Tuple[str, ...] = ()
    rocm: Optional[str] = None
    index_url: Optional[str] = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "PinOptions":
        return cls(torch=args.torch, archs=tuple(args.arch), rocm=args.rocm, index_url=args.index_url)


def _line_bounds(line: str) -> tuple:
    x, y = (int(p) for p in line.split("."))
    return f"{x}.{y}.0", f"{x}.{y + 1}.0a0"


def rocm_index(rocm: str, index_url: Optional[str] = None) -> str:
    """The pip index of the ``rocm`` builds: ``INDEX/rocmA.B/simple/``."""
    return f"{(index_url or INDEX_PLACEHOLDER).rstrip('/')}/{_rocm_names(rocm)[0]}/simple/"


def _rocm_names(rocm: str) -> Tuple[str, str]:
    """(``rocmA.B``: local label and index path, ``rocmAB``: conda build-string tag)."""
    from ..package.naming import PackagingError, conda_rocm_tag, local_label

    try:
        return local_label(rocm), conda_rocm_tag(rocm)
    except PackagingError as e:
        raise PinError(f"--rocm: {e}") from None


def pin_lines(torch_version: str, archs: Sequence[str] = (), *, rocm: Optional[str] = None,
              index_url: Optional[str] = None, data: Optional[Dict] = None) -> Dict[str, List[str]]:
    """``{"pip": [...], "conda": [...], "line": [X.Y]}`` for ``torch_version``;
    with ``rocm`` (``A.B``), the builds of that ROCm release: pip's first line
    is its index (``--index-url``, a requirements-file option), conda's specs
    match its build strings.

    PinError names the supported torch versions when none of our lines supports it.
    """
    data = data or torch_compat.load()
    try:
        minor = torch_compat.torch_minor(torch_version)
    except ValueError as e:
        raise PinError(str(e)) from None
    lines = torch_compat.lines_for_torch(minor, data=data)
    if not lines:
        known = sorted({v for e in data["lines"] for v in e["torch"]}, key=lambda v: tuple(map(int, v.split("."))))
        raise PinError(f"no aotriton-rocm release supports torch {minor}; supported torch versions: "
                       f"{', '.join(known)} (see the table in README.md)")
    line = lines[0]
    low, high = _line_bounds(line)
    names, images_of = [], []
    groups = _group_extras() if archs else {}
    for a in archs:
        if not _ARCH.match(a):
            raise PinError(f"invalid arch {a!r}")
        name = a.replace("_", "")
        if name in groups:  # gfx110x, all: pip takes the extra, conda its members
            names.append(name)
            images_of += [m for m in groups[name] if m not in images_of]
            continue
        if not images.publishes_image(a):
            raise PinError(f"unknown arch {a}: aotriton-rocm publishes kernel images for "
                           f"{', '.join(images.published_image_extras())}")
        names.append(name)
        images_of += [name] if name not in images_of else []
    extras = f"[{','.join(names)}]" if names else ""
    pip = [f"aotriton-rocm{extras}~={low}", f"torch=={minor}.*"]
    runtime_build = image_build = ""
    if rocm is not None:
        tag = _rocm_names(rocm)[1]
        pip.insert(0, f"--index-url {rocm_index(rocm, index_url)}")
        runtime_build, image_build = f" *_{tag}_*", f" {tag}_*"
    conda = [f"aotriton-rocm >={low},<{high}{runtime_build}"]
    conda += [f"aotriton-rocm-{n} >={low},<{high}{image_build}" for n in images_of]
    return {"line": [line], "pip": pip, "conda": conda}


def _group_extras() -> Dict[str, List[str]]:
    """The installed runtime's extras that pull in several images (``gfx110x``,
    ``all``) -> those images' arch names, in the metadata's order."""
    try:
        requires = importlib.metadata.requires("aotriton-rocm") or []
    except importlib.metadata.PackageNotFoundError:
        return {}
    members: Dict[str, List[str]] = {}
    for req in requires:
        m = re.match(r"\s*aotriton-rocm-([a-z0-9]+)\b.*;.*extra\s*==\s*[\"']([^\"']+)[\"']", req)
        if m:
            members.setdefault(m.group(2), []).append(m.group(1))
    return {extra: archs for extra, archs in members.items() if len(archs) > 1}


def update_readme(readme: Path, *, check: bool = False) -> bool:
    """Replace the generated torch table in ``readme`` (between the markers).
    Returns True if the file is (or, with ``check``, would stay) unchanged."""
    text = readme.read_text(encoding="utf-8")
    begin, end = torch_compat.TABLE_BEGIN, torch_compat.TABLE_END
    if begin not in text or end not in text:
        raise PinError(f"{readme}: no generated torch table markers")
    i = text.index(begin)
    j = text.index(end, i) + len(end) + 1
    new = text[:i] + torch_compat.render_table() + text[j:]
    if new == text:
        return True
    if not check:
        readme.write_text(new, encoding="utf-8")
    return False


def add_pin_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--torch", required=True, metavar="A.B", help="torch version, e.g. 2.11")
    parser.add_argument("--arch", action="append", default=[], metavar="ARCH",
                        help="kernel image arch to include (repeatable), e.g. gfx942")
    parser.add_argument("--rocm", default=None, metavar="A.B",
                        help="the builds for this ROCm release (e.g. 10.0): its per-ROCm index "
                             "and conda build strings")
    parser.add_argument("--index-url", default=None, metavar="URL",
                        help=f"base of the per-ROCm indexes (default: {INDEX_PLACEHOLDER}, a "
                             "placeholder)")


def run_pin(options: PinOptions) -> int:
    if options.index_url and not options.rocm:
        raise PinError("--index-url is the base of the per-ROCm indexes: add --rocm A.B")
    res = pin_lines(options.torch, options.archs, rocm=options.rocm, index_url=options.index_url)
    rocm = f", ROCm {options.rocm}" if options.rocm else ""
    print(f"# aotriton-rocm {res['line'][0]}.x for torch {torch_compat.torch_minor(options.torch)}{rocm}")
    print("# pip (requirements.txt; install torch from your ROCm version's wheel index):")
    for line in res["pip"]:
        print(line)
    print("# conda (environment.yml / conda install):")
    for line in res["conda"]:
        print(line)
    return 0
