"""The ABI of libaotriton_rocm (the C library) for ``aotriton-rocm abi-check``.

Three readings of one release's library, each compared old against new with
the rules of docs/ABI.md ("C library"):

* the ELF file (pyelftools): soname, exported functions and their version node;
* the shipped public header (c_header.py: functions, enums, defines, struct
  layouts);
* libabigail: ``abidw`` reads the DWARF into its XML (prototypes, struct
  layouts, enums) and ``abidiff`` compares the two, as the second opinion.
  A library built without DWARF (the runtime wheel is built with ``-g0`` to be
  reproducible) is read through a stand-in compiled with ``-g`` from its
  shipped header: one stub per declared function.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from .c_header import HEADER, CModel, Field, NativeAbiError, Struct, find_cc, header_model

LIB_PREFIX = "libaotriton_rocm.so"
INSTALL_ABIGAIL = ("install libabigail's abidiff/abidw: apt-get install abigail-tools "
                   "(Debian/Ubuntu), dnf install libabigail (Fedora/RHEL), conda install -c "
                   "conda-forge libabigail")


@dataclass
class NativeLib:
    library: str                      # file name in the release
    soname: Optional[str]
    symbols: Dict[str, str]           # exported function -> version node ("" if none)
    has_dwarf: bool
    header: Optional[CModel]          # None: no header shipped
    layout_by: str                    # "cc" or "C layout rules"
    # abidw's XML of the library itself (when it carries DWARF) and of a
    # stand-in built from its header; None without libabigail
    abixml: Optional[str] = None
    abixml_standin: Optional[str] = None

    @property
    def version(self) -> Optional[str]:
        d = self.header.defines if self.header else {}
        parts = [d.get(f"AOTR_VERSION_{k}") for k in ("MAJOR", "MINOR", "PATCH")]
        return ".".join(parts) if all(p is not None and p.isdigit() for p in parts) else None


# -------------------------------------------------------------------------- ELF

def elf_info(lib: Path) -> Tuple[Optional[str], Dict[str, str], bool]:
    """(soname, exported defined functions -> version node, has .debug_info)."""
    try:
        from elftools.elf.dynamic import DynamicSection
        from elftools.elf.elffile import ELFFile
        from elftools.elf.gnuversions import GNUVerSymSection
    except ImportError as e:
        raise NativeAbiError(f"reading {lib.name} needs pyelftools ({e}): "
                             "pip install 'aotriton-rocm[build]'") from None
    with open(lib, "rb") as f:
        elf = ELFFile(f)
        soname = None
        for sec in elf.iter_sections():
            if isinstance(sec, DynamicSection):
                for tag in sec.iter_tags():
                    if tag.entry.d_tag == "DT_SONAME":
                        soname = tag.soname
        dynsym = elf.get_section_by_name(".dynsym")
        versym = next((s for s in elf.iter_sections() if isinstance(s, GNUVerSymSection)), None)
        names: Dict[int, str] = {}
        verdef = elf.get_section_by_name(".gnu.version_d")
        if verdef is not None:
            for vd, aux in verdef.iter_versions():
                names[vd.entry.vd_ndx] = next(aux).name
        symbols: Dict[str, str] = {}
        for i, sym in enumerate(dynsym.iter_symbols() if dynsym else []):
            e = sym.entry
            if (e.st_info.type == "STT_FUNC" and e.st_info.bind in ("STB_GLOBAL", "STB_WEAK")
                    and e.st_shndx != "SHN_UNDEF" and e.st_other.visibility == "STV_DEFAULT"):
                ndx = versym.get_symbol(i).entry.ndx if versym is not None else 1
                ndx = ndx if isinstance(ndx, int) else 1
                symbols[sym.name] = names.get(ndx & 0x7FFF, "") if ndx & 0x7FFF > 1 else ""
        has_dwarf = elf.get_section_by_name(".debug_info") is not None
    return soname, symbols, has_dwarf


# ------------------------------------------------------------------- libabigail

def have_libabigail() -> bool:
    return bool(shutil.which("abidw") and shutil.which("abidiff"))


def _standin(lib: Path, header: Path, model: CModel, soname: Optional[str], symbols: Dict[str, str],
             d: Path) -> Path:
    """A library with the header's functions as stubs, compiled with -g: its
    DWARF is the shipped header's prototypes and types, laid out by cc."""
    cc = find_cc()
    if not cc:
        raise NativeAbiError(f"{lib.name} has no DWARF and no C compiler is here to build a stand-in "
                             "from its header for libabigail: install gcc")
    lines = [f'#include "{header.name}"']
    for name, proto in model.functions.items():
        ret, params = proto.split("(", 1)
        ret, ptypes = ret.strip(), [p.strip() for p in params.rstrip(")").split(",") if p.strip()]
        args = ", ".join(f"{t} a{i}" for i, t in enumerate(ptypes)) or "void"
        unused = "".join(f" (void)a{i};" for i in range(len(ptypes)))
        body = unused + ("" if ret == "void" else f" static {ret} r; return r;")
        lines.append(f"{ret} {name}({args}) {{{body} }}")
    src, out = d / "standin.c", d / lib.name
    src.write_text("\n".join(lines) + "\n")
    cmd = [cc, "-std=c11", "-g", "-O0", "-shared", "-fPIC", "-I", str(header.parent), "-o", str(out), str(src)]
    if soname:
        cmd.insert(1, f"-Wl,-soname,{soname}")
    nodes = set(symbols.values())
    if len(nodes) == 1 and "" not in nodes:  # the library's version node, so that abidiff sees it
        vmap = d / "standin.map"
        vmap.write_text(f"{nodes.pop()} {{ global: aotr_*; local: *; }};\n")
        cmd.insert(1, f"-Wl,--version-script={vmap}")
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise NativeAbiError(f"cannot build the DWARF stand-in of {lib.name}: {p.stderr[-2000:]}")
    return out


def abidw(lib: Path) -> str:
    p = subprocess.run(["abidw", "--no-corpus-path", str(lib)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise NativeAbiError(f"abidw {lib.name} failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
    return p.stdout


def abixml_model(xml: str) -> CModel:
    """Prototypes of the exported aotr_* functions and the public header's
    structs and enums, from abidw's XML."""
    root = ET.fromstring(xml)
    by_id: Dict[str, ET.Element] = {}
    for el in root.iter():
        if "id" in el.attrib and el.tag != "subrange":
            by_id.setdefault(el.attrib["id"], el)

    def render(tid: str, depth: int = 0) -> str:
        el = by_id.get(tid)
        if el is None or depth > 30:
            return "void" if tid == "type-id-void" or el is None else "..."
        tag, a = el.tag, el.attrib
        if tag in ("type-decl", "typedef-decl"):
            return a.get("name", "?")
        if tag == "class-decl":
            return "struct " + a.get("name", "<anonymous>")
        if tag == "enum-decl":
            return "enum " + a.get("name", "<anonymous>")
        if tag == "pointer-type-def":
            return render(a["type-id"], depth + 1) + " *"
        if tag == "qualified-type-def":
            inner = render(a["type-id"], depth + 1)
            return (inner + " const") if inner.endswith("*") else ("const " + inner)
        if tag == "array-type-def":
            dims = "".join(f"[{s.attrib.get('length', '')}]" for s in el.findall("subrange"))
            return render(a["type-id"], depth + 1) + dims
        if tag == "function-type":
            return "function"
        return tag

    def public(el: ET.Element) -> bool:  # defined in the public header, not in the sources
        return os.path.basename(el.attrib.get("filepath", "")) == HEADER and bool(el.attrib.get("name"))

    model = CModel()
    for el in root.iter("function-decl"):
        name = el.attrib.get("name", "")
        if not name.startswith("aotr_") or "elf-symbol-id" not in el.attrib or name in model.functions:
            continue
        params = [render(p.attrib["type-id"]) for p in el.findall("parameter")
                  if "type-id" in p.attrib]
        ret = el.find("return")
        rt = render(ret.attrib["type-id"]) if ret is not None else "void"
        model.functions[name] = f"{rt} ({', '.join(params)})".replace("* (", "*(")
    for el in root.iter("class-decl"):
        a = el.attrib
        name = a.get("name", "")
        if (not public(el) or a.get("is-declaration-only") == "yes" or name in model.structs):
            continue
        fs = []
        for dm in el.findall("data-member"):
            var = dm.find("var-decl")
            fs.append(Field(var.attrib.get("name", ""), int(dm.attrib.get("layout-offset-in-bits", 0)) // 8,
                            render(var.attrib["type-id"])))
        model.structs[name] = Struct(int(a.get("size-in-bits", 0)) // 8, fs)
    for el in root.iter("enum-decl"):
        name = el.attrib.get("name", "")
        if public(el) and name not in model.enums:
            model.enums[name] = {e.attrib["name"]: int(e.attrib["value"]) for e in el.findall("enumerator")}
    return model


def abidiff(old_xml: str, new_xml: str) -> Tuple[int, str]:
    with tempfile.TemporaryDirectory(prefix="aotr-abidiff-") as d:
        a, b, supp = Path(d, "old.abi"), Path(d, "new.abi"), Path(d, "public.supp")
        a.write_text(old_xml)
        b.write_text(new_xml)
        # the library's private structs (behind opaque handles) are not ABI
        supp.write_text("[suppress_type]\n  source_location_not_regexp = (^|.*/)"
                        + re.escape(HEADER) + "$\n")
        p = subprocess.run(["abidiff", "--no-show-locs", "--suppressions", str(supp), str(a), str(b)],
                           capture_output=True, text=True)
    return p.returncode, (p.stdout + p.stderr).strip()


# --------------------------------------------------------------------- reading

def read_native(lib: Path, header: Optional[Path], with_abigail: bool) -> NativeLib:
    soname, symbols, has_dwarf = elf_info(lib)
    model, layout_by = (header_model(header) if header is not None else (None, ""))
    nl = NativeLib(library=lib.name, soname=soname, symbols=symbols, has_dwarf=has_dwarf,
                   header=model, layout_by=layout_by)
    if with_abigail and have_libabigail():
        if has_dwarf:
            nl.abixml = abidw(lib)
        if header is not None and model is not None:
            with tempfile.TemporaryDirectory(prefix="aotr-standin-") as d:
                nl.abixml_standin = abidw(_standin(lib, header, model, soname, symbols, Path(d)))
    return nl


# ------------------------------------------------------------------- comparing

def compare_models(old: CModel, new: CModel, label: str) -> List[Tuple[bool, str]]:
    """(breaking?, what) for each change between two models, by the rules of
    docs/ABI.md "C library"."""
    out: List[Tuple[bool, str]] = []
    for kind, changed, o, n in (("function", "prototype changed", old.functions, new.functions),
                                ("function-pointer type", "changed", old.callbacks, new.callbacks)):
        for name in sorted(set(o) - set(n)):
            out.append((True, f"{label}: {kind} {name} removed (was {o[name]})"))
        for name in sorted(set(n) - set(o)):
            out.append((False, f"{label}: new {kind} {name}: {n[name]}"))
        for name in sorted(set(o) & set(n)):
            if o[name] != n[name]:
                out.append((True, f"{label}: {kind} {name} {changed}: {o[name]} -> {n[name]}"))
    for s in sorted(set(old.structs) - set(new.structs)):
        out.append((True, f"{label}: struct {s} removed"))
    for s in sorted(set(new.structs) - set(old.structs)):
        out.append((False, f"{label}: new struct {s} ({new.structs[s].size} bytes)"))
    for s in sorted(set(old.structs) & set(new.structs)):
        out.extend(_compare_struct(s, old.structs[s], new.structs[s], label))
    for e in sorted(set(old.enums) - set(new.enums)):
        out.append((True, f"{label}: enum {e} removed"))
    for e in sorted(set(new.enums) - set(old.enums)):
        out.append((False, f"{label}: new enum {e}"))
    for e in sorted(set(old.enums) & set(new.enums)):
        ov, nv = old.enums[e], new.enums[e]
        for k in ov:
            if k not in nv:
                out.append((True, f"{label}: enum {e}: enumerator {k} (= {ov[k]}) removed"))
            elif ov[k] != nv[k]:
                out.append((True, f"{label}: enum {e}: {k} changed value: {ov[k]} -> {nv[k]}"))
        top = max(ov.values(), default=-1)
        for k in nv:
            if k not in ov:
                if nv[k] > top:
                    out.append((False, f"{label}: enum {e}: new enumerator {k} = {nv[k]}"))
                else:
                    out.append((True, f"{label}: enum {e}: new enumerator {k} = {nv[k]} not after the "
                                      f"last one (<= {top})"))
    return out


def _compare_struct(s: str, o: Struct, n: Struct, label: str) -> List[Tuple[bool, str]]:
    out: List[Tuple[bool, str]] = []
    nf = {f.name: f for f in n.fields}
    ofn = {f.name for f in o.fields}
    for f in o.fields:
        g = nf.get(f.name)
        if g is None:
            out.append((True, f"{label}: struct {s}: field {f.name} ({f.type} at offset {f.offset}) removed"))
            continue
        if f.offset != g.offset:
            out.append((True, f"{label}: struct {s}: field {f.name} offset changed: {f.offset} -> {g.offset}"))
        if f.type != g.type:
            out.append((True, f"{label}: struct {s}: field {f.name} type changed: {f.type} -> {g.type}"))
    old_size = o.size or 0
    added = [g for g in n.fields if g.name not in ofn]
    for g in added:
        if not o.has_struct_size:
            out.append((True, f"{label}: struct {s}: field {g.name} ({g.type}) added to a struct without "
                              f"struct_size"))
        elif g.offset < old_size:
            out.append((True, f"{label}: struct {s}: field {g.name} ({g.type}) inserted at offset {g.offset}, "
                              f"inside the old {old_size} bytes (append fields at the end)"))
        else:
            out.append((False, f"{label}: struct {s}: new field {g.name} ({g.type}) appended at offset "
                               f"{g.offset}"))
    if o.size != n.size and not (o.has_struct_size and added and all(
            (g.offset >= old_size) for g in added) and (n.size or 0) > old_size):
        out.append((True, f"{label}: struct {s}: size changed: {o.size} -> {n.size} bytes"))
    return out


def compare_native(old: NativeLib, new: NativeLib) -> Tuple[List[Tuple[bool, str]], List[str]]:
    """(changes, notes) between the libraries of two releases."""
    out: List[Tuple[bool, str]] = []
    notes: List[str] = []
    lbl = "C library"
    if old.soname != new.soname:
        out.append((True, f"{lbl}: soname changed: {old.soname} -> {new.soname}"))
    for n in sorted(set(old.symbols) - set(new.symbols)):
        out.append((True, f"{lbl}: exported symbol {n}@{old.symbols[n]} removed"))
    for n in sorted(set(new.symbols) - set(old.symbols)):
        out.append((False, f"{lbl}: new exported symbol {n}@{new.symbols[n]}"))
    for n in sorted(set(old.symbols) & set(new.symbols)):
        if old.symbols[n] != new.symbols[n]:
            out.append((True, f"{lbl}: symbol {n} version node changed: {old.symbols[n]} -> {new.symbols[n]}"))
    if old.header is not None and new.header is not None:
        out.extend(compare_models(old.header, new.header, f"{lbl} header"))
        for n in sorted(set(new.header.functions) - set(new.symbols)):
            out.append((True, f"{lbl}: {n} is declared in NEW's header but not exported by {new.library}"))
    else:
        notes.append(f"{lbl}: no public header on both sides: the header check did not run")
    if old.abixml is not None and new.abixml is not None:
        pair, source = (old.abixml, new.abixml), "the libraries' DWARF"
    elif old.abixml_standin is not None and new.abixml_standin is not None:
        pair = (old.abixml_standin, new.abixml_standin)
        bare = [r.library for r in (old, new) if r.abixml is None]
        source = (f"stand-ins compiled with -g from the shipped headers ({' and '.join(bare)} "
                  "carry no DWARF)")
    else:
        pair, source = None, ""
    if pair is not None:
        out.extend(compare_models(abixml_model(pair[0]), abixml_model(pair[1]), f"{lbl} (libabigail)"))
        rc, report = abidiff(*pair)
        if rc & 1:  # abidiff's own error
            raise NativeAbiError(f"abidiff failed ({rc}): {report[-2000:]}")
        notes.append(f"{lbl}: libabigail (abidw + abidiff) read {source}")
        if rc & 8 and not any(b for b, _ in out):
            out.append((True, f"{lbl}: abidiff reports an incompatible change: "
                              + " | ".join(report.splitlines()[:8])))
        if rc & 12:
            notes.append(f"{lbl}: abidiff (exit {rc}):\n      " + "\n      ".join(report.splitlines()[:60]))
    return out, notes
