"""``aotriton-rocm abi-check OLD NEW``: compare the ABI of two releases.

A release is given as any of:

* a directory of wheels (``dist/``: the runtime wheel and image wheels), or one ``.whl``;
* conda packages: one ``.conda`` file, or a directory holding them (a channel:
  ``<subdir>/*.conda``, or ``dist/conda/<subdir>/*.conda`` when ``dist/`` has no
  wheels); read with py-rattler;
* an archives directory (``<arch>.aotr`` [+ ``<arch>.manifest.json``]), or one ``.aotr``;
* an install: a ``site-packages`` directory, or a prefix (venv or conda
  environment: ``lib/python3.*/site-packages`` and/or ``share/aotriton-rocm``).

What is compared (docs/ABI.md): the archive format version, the arch set, per
arch every kernel's functional keys and ordered argument lists, and, where the
runtime's ``aotriton_rocm/abi.json`` is present, the public functions'
signatures, public constants, the ``smoke`` command's options and the
supported torch versions, libaotriton_rocm, the C library (soname,
exported symbols and version node, prototypes, public struct layouts and
enums: ``abi_native``), and libaotriton_v2 of each AOTriton API line
(exported mangled names, struct layouts, enum and constant values:
``abi_aotriton_api``); reading a release: ``release_contents``. Each change is classified as a compatible
addition, a compatible fix or breaking. Exit status: 1 when NEW is a point
release of OLD's ABI line (same X.Y) and something is breaking, or NEW is
older than OLD; 2 when a release cannot be read; 0 otherwise (a new X.Y line
may break: reported as allowed).
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

from ...common.errors import CommandError, UsageError
from ...common.archive import ArchiveError
from . import abi_aotriton_api as AA
from . import abi_native as NA
from .release_contents import AbiCheckError, ArchAbi, Release, load_release, version_key

__all__ = [
    "ADDITION",
    "FIX",
    "BREAKING",
    "AbiCheckError",
    "Change",
    "Release",
    "CheckResult",
    "load_release",
    "compare",
    "check",
    "add_abi_check_arguments",
    "AbiCheckOptions",
    "check_releases",
    "run_abi_check",
]

ADDITION = "compatible addition"
FIX = "compatible fix"
BREAKING = "breaking"


@dataclass(frozen=True)
class Change:
    kind: str   # ADDITION / FIX / BREAKING
    what: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.what}"


# --------------------------------------------------------------------- comparing

def _compare_signature(name: str, old: Dict[str, Any], new: Dict[str, Any]) -> List[Change]:
    """New parameters with defaults (appended positionally, or keyword-only) are
    compatible; anything else that changes a parameter breaks callers."""
    op, np_ = old.get("params", []), new.get("params", [])
    if op == np_:
        return []
    what = f"function {name}: {old.get('signature')} -> {new.get('signature')}"
    positional = ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")
    new_by_name = {p["name"]: p for p in np_}
    old_pos = [p for p in op if p["kind"] in positional]
    new_pos = [p for p in np_ if p["kind"] in positional]
    has_varkw = any(p["kind"] == "VAR_KEYWORD" for p in np_)
    for p in op:
        q = new_by_name.get(p["name"])
        if p["kind"] in ("VAR_POSITIONAL", "VAR_KEYWORD"):
            if q is None or q["kind"] != p["kind"]:
                return [Change(BREAKING, what + f" ({p['name']} removed)")]
            continue
        if q is None:
            if p["kind"] == "KEYWORD_ONLY" and has_varkw:
                continue
            return [Change(BREAKING, what + f" (parameter {p['name']} removed)")]
        if p["kind"] != q["kind"] and not (p["kind"] == "KEYWORD_ONLY" and q["kind"] == "POSITIONAL_OR_KEYWORD"):
            return [Change(BREAKING, what + f" (parameter {p['name']} changed kind)")]
        if "default" in p and "default" not in q:
            return [Change(BREAKING, what + f" (parameter {p['name']} lost its default)")]
        if "default" in p and p["default"] != q["default"]:
            return [Change(BREAKING, what + f" (default of {p['name']} changed)")]
    if [p["name"] for p in new_pos[: len(old_pos)]] != [p["name"] for p in old_pos]:
        return [Change(BREAKING, what + " (positional parameters reordered)")]
    old_names = {p["name"] for p in op}
    for q in np_:
        if q["name"] not in old_names and q["kind"] not in ("VAR_POSITIONAL", "VAR_KEYWORD") \
                and "default" not in q:
            return [Change(BREAKING, what + f" (new required parameter {q['name']})")]
    return [Change(ADDITION, what + " (new optional parameters)")]


def _compare_api(old: Dict[str, Any], new: Dict[str, Any]) -> List[Change]:
    out: List[Change] = []
    of, nf = old.get("functions", {}), new.get("functions", {})
    for name in sorted(set(of) - set(nf)):
        out.append(Change(BREAKING, f"public function aotriton_rocm.{name} removed"))
    for name in sorted(set(nf) - set(of)):
        out.append(Change(ADDITION, f"new public function aotriton_rocm.{name}: {nf[name].get('signature')}"))
    for name in sorted(set(of) & set(nf)):
        out.extend(_compare_signature(f"aotriton_rocm.{name}", of[name], nf[name]))
    oc, nc = old.get("constants", {}), new.get("constants", {})
    for name in sorted(set(oc) | set(nc)):
        if name not in nc:
            out.append(Change(BREAKING, f"public constant aotriton_rocm.{name} removed"))
        elif name not in oc:
            out.append(Change(ADDITION, f"new public constant aotriton_rocm.{name} = {nc[name]!r}"))
        elif oc[name] != nc[name]:
            out.append(Change(BREAKING, f"aotriton_rocm.{name} changed: {oc[name]!r} -> {nc[name]!r}"))
    for cmd in sorted(set(old.get("cli", {})) | set(new.get("cli", {}))):
        oo = old.get("cli", {}).get(cmd, {}).get("options")
        no = new.get("cli", {}).get(cmd, {}).get("options")
        if no is None:
            out.append(Change(BREAKING, f"command `aotriton-rocm {cmd}` removed"))
            continue
        if oo is None:
            out.append(Change(ADDITION, f"new command `aotriton-rocm {cmd}`"))
            continue
        for opt in sorted(set(oo) - set(no)):
            out.append(Change(BREAKING, f"`aotriton-rocm {cmd} {opt}` removed"))
        for opt in sorted(set(no) - set(oo)):
            out.append(Change(ADDITION, f"new option `aotriton-rocm {cmd} {opt}`"))
        for opt in sorted(set(oo) & set(no)):
            a, b = oo[opt], no[opt]
            if a.get("takes_value") != b.get("takes_value"):
                out.append(Change(BREAKING, f"`aotriton-rocm {cmd} {opt}` changed whether it takes a value"))
            else:
                ach, bch = set(a.get("choices") or ()), set(b.get("choices") or ())
                if ach and bch and ach - bch:
                    out.append(Change(BREAKING, f"`aotriton-rocm {cmd} {opt}` no longer accepts "
                                                f"{sorted(ach - bch)}"))
                elif not ach and bch:
                    out.append(Change(BREAKING, f"`aotriton-rocm {cmd} {opt}` now only accepts {sorted(bch)}"))
                elif ach and bch - ach:
                    out.append(Change(ADDITION, f"`aotriton-rocm {cmd} {opt}` also accepts {sorted(bch - ach)}"))
    ot, nt = set(old.get("torch", [])), set(new.get("torch", []))
    for v in sorted(ot - nt):
        out.append(Change(BREAKING, f"torch {v} no longer supported"))
    for v in sorted(nt - ot):
        out.append(Change(ADDITION, f"torch {v} now supported"))
    if old.get("archive_format_version") != new.get("archive_format_version"):
        out.append(Change(BREAKING, f"runtime reads archive format {new.get('archive_format_version')}, "
                                    f"was {old.get('archive_format_version')}"))
    return out


def _compare_arch(o: ArchAbi, n: ArchAbi) -> List[Change]:
    out: List[Change] = []
    arch = o.arch
    if o.format_version != n.format_version:
        out.append(Change(BREAKING, f"{arch}: archive format version {o.format_version} -> {n.format_version}"))
    for k in sorted(set(o.kernels) - set(n.kernels)):
        out.append(Change(BREAKING, f"{arch}: kernel {k} removed"))
    for k in sorted(set(n.kernels) - set(o.kernels)):
        out.append(Change(ADDITION, f"{arch}: new kernel {k} ({len(n.kernels[k])} functional variants)"))
    for k in sorted(set(o.kernels) & set(n.kernels)):
        ok, nk = o.kernels[k], n.kernels[k]
        removed = sorted(set(ok) - set(nk))
        added = sorted(set(nk) - set(ok))
        for fk in removed:
            out.append(Change(BREAKING, f"{arch}: kernel {k} [{fk}] removed"))
        if added:
            out.append(Change(ADDITION, f"{arch}: kernel {k}: new variants " + "; ".join(f"[{f}]" for f in added)))
        changed_code = []
        for fk in sorted(set(ok) & set(nk)):
            if ok[fk] != nk[fk]:
                fmt = lambda a: ", ".join(f"{x}:{t}" for x, t in a)  # noqa: E731
                out.append(Change(BREAKING, f"{arch}: kernel {k} [{fk}] argument list changed: "
                                            f"({fmt(ok[fk])}) -> ({fmt(nk[fk])})"))
            elif o.code.get(k, {}).get(fk) != n.code.get(k, {}).get(fk):
                changed_code.append(fk)
        if changed_code:
            out.append(Change(FIX, f"{arch}: kernel {k}: code rebuilt with the same arguments for "
                                   f"{len(changed_code)} variant(s)"))
    return out


def compare(old: Release, new: Release) -> List[Change]:
    out: List[Change] = []
    for arch in sorted(set(old.archs) - set(new.archs)):
        out.append(Change(BREAKING, f"arch {arch} removed"))
    for arch in sorted(set(new.archs) - set(old.archs)):
        out.append(Change(ADDITION, f"new arch {arch}"))
    for arch in sorted(set(old.archs) & set(new.archs)):
        out.extend(_compare_arch(old.archs[arch], new.archs[arch]))
    if old.api is not None and new.api is not None:
        out.extend(_compare_api(old.api, new.api))
    elif old.api is not None:
        out.append(Change(BREAKING, "the runtime (aotriton_rocm package) is missing from NEW"))
    if old.native is not None and new.native is not None:
        try:
            changes, notes = NA.compare_native(old.native, new.native)
        except NA.NativeAbiError as e:
            raise AbiCheckError(str(e)) from None
        out.extend(Change(BREAKING if b else ADDITION, what) for b, what in changes)
        new.notes.extend(n for n in notes if n not in new.notes)
    elif old.native is not None:
        out.append(Change(BREAKING, f"the C library ({old.native.library}) is missing from NEW"))
    elif new.native is not None:
        out.append(Change(ADDITION, f"new C library {new.native.library} (soname {new.native.soname})"))
    changes, notes = AA.compare_api_libs(old.aotriton_api, new.aotriton_api)
    out.extend(Change(BREAKING if b else ADDITION, what) for b, what in changes)
    new.notes.extend(n for n in notes if n not in new.notes)
    return out


@dataclass
class CheckResult:
    old: Release
    new: Release
    changes: List[Change]
    point_release: bool
    ok: bool
    verdict: str


def check(old_path: "str | Path", new_path: "str | Path", require_libabigail: bool = False) -> CheckResult:
    old = load_release(old_path, require_libabigail)
    new = load_release(new_path, require_libabigail)
    changes = compare(old, new)
    breaking = [c for c in changes if c.kind == BREAKING]
    if old.version is None or new.version is None:
        raise AbiCheckError("cannot tell the version of "
                            + (old.source if old.version is None else new.source))
    point = old.abi_line == new.abi_line
    if version_key(new.version) < version_key(old.version):
        return CheckResult(old, new, changes, point, False,
                           f"REFUSED: NEW ({new.version}) is older than OLD ({old.version})")
    if new.native is not None and new.abi_line is not None:
        want = f"{NA.LIB_PREFIX}.{new.abi_line}"
        if new.native.soname != want:
            return CheckResult(old, new, changes, point, False,
                               f"REFUSED: the C library's soname is {new.native.soname}, the ABI line "
                               f"{new.abi_line} needs {want}")
    problems = [p for lib in new.aotriton_api.values() for p in AA.release_problems(lib)]
    if problems:
        changes.extend(Change(BREAKING, p) for p in problems)
        return CheckResult(old, new, changes, point, False,
                           f"REFUSED: NEW's libaotriton_v2 is not releasable: {'; '.join(problems)}")
    if point and breaking:
        verdict = (f"REFUSED: {new.version} is a point release of the {old.abi_line} ABI line and has "
                   f"{len(breaking)} breaking change(s); release it as "
                   f"{_next_line(old.version)} instead, or undo them")
        return CheckResult(old, new, changes, point, False, verdict)
    if breaking:
        verdict = (f"OK: {len(breaking)} breaking change(s) allowed: {new.version} starts the new ABI "
                   f"line {new.abi_line} (from {old.abi_line})")
    else:
        verdict = f"OK: {new.version} is ABI compatible with {old.version}"
    return CheckResult(old, new, changes, point, True, verdict)


def _next_line(version: str) -> str:
    x, y = version_key(version)[:2]
    return f"{x}.{y + 1}.0"


# ---------------------------------------------------------------------------- CLI

def add_abi_check_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.split("\n")[0].strip("`: ")
    parser.add_argument("old", metavar="OLD", help="previous release: wheel(s) dir, .whl, .conda, conda "
                                                   "channel dir, archives dir, .aotr, site-packages or prefix")
    parser.add_argument("new", metavar="NEW", help="candidate release (same kinds as OLD)")
    parser.add_argument("--json", metavar="FILE", help="also write the changes and the verdict as JSON")
    parser.add_argument("--require-libabigail", action="store_true",
                        help="fail (exit 2) when libabigail's abidiff/abidw are not installed, instead of "
                             "comparing the C library by its header only")


@dataclass(frozen=True)
class AbiCheckOptions:
    old: Path
    new: Path
    json: Optional[Path] = None
    require_libabigail: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "AbiCheckOptions":
        return cls(old=Path(args.old), new=Path(args.new),
                   json=Path(args.json) if args.json else None,
                   require_libabigail=args.require_libabigail)


def check_releases(options: AbiCheckOptions) -> "CheckResult":
    """Compare the two releases, print the changes and the verdict (and write
    the JSON report); UsageError when one of them cannot be read."""
    try:
        res = check(options.old, options.new, options.require_libabigail)
    except (AbiCheckError, ArchiveError, OSError, ValueError) as e:
        raise UsageError(str(e)) from e
    o, n = res.old, res.new
    print(f"OLD {o.version} (ABI line {o.abi_line}): {o.source}; archs {', '.join(sorted(o.archs)) or '-'}")
    print(f"NEW {n.version} (ABI line {n.abi_line}): {n.source}; archs {', '.join(sorted(n.archs)) or '-'}")
    for note in o.notes + n.notes:
        print(f"note: {note}")
    order = {BREAKING: 0, FIX: 2, ADDITION: 1}
    for c in sorted(res.changes, key=lambda c: order[c.kind]):
        label = c.kind
        if c.kind == BREAKING:
            label = "breaking" if res.point_release else "breaking (allowed: new ABI line)"
        print(f"  {label}: {c.what}")
    if not res.changes:
        print("  no ABI changes")
    print(res.verdict)
    if options.json:
        options.json.write_text(json.dumps({
            "old": {"version": o.version, "source": o.source, "archs": sorted(o.archs)},
            "new": {"version": n.version, "source": n.source, "archs": sorted(n.archs)},
            "changes": [{"kind": c.kind, "what": c.what} for c in res.changes],
            "point_release": res.point_release, "ok": res.ok, "verdict": res.verdict,
        }, indent=1) + "\n", encoding="utf-8")
    return res


def run_abi_check(options: AbiCheckOptions) -> int:
    res = check_releases(options)
    if not res.ok:
        raise CommandError(res.verdict)
    return 0
