"""libaotriton_v2, our implementation of AOTriton's C++ API
(native/aotriton_api/), for ``aotriton-rocm abi-check``.

A release ships one library per API line: ``lib/aotriton_api/<line>/
libaotriton_v2.so.<AOTriton version>`` with its headers in
``include/aotriton_api/<line>/aotriton/`` (under ``aotriton_rocm/`` in the
runtime wheel). Each is read two ways:

* the ELF file (pyelftools): soname, exported symbols (mangled), DT_NEEDED;
* the shipped headers: a probe that includes every header and instantiates
  the templates the API passes by value, compiled with ``-g`` by the C++
  compiler; its DWARF gives every struct, class and enum of namespace
  ``aotriton``: size, fields (offset, type), static constants (``kVersion``),
  enumerator values.

Rules (docs/ABI.md, "AOTriton's API"): a point release keeps the file name,
every exported name, every layout, constant and enumerator value (it may add
symbols, types and enumerators). Any release: only names of namespace
``aotriton`` exported, nothing needed but the C/C++ runtime (the GPU runtime
is opened at run time), soname = file name = ``config.h``'s version.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from ...common.elf_dynamic import read_dynamic
from .c_header import NativeAbiError

LIB_PREFIX = "libaotriton_v2.so."
API_DIR = "aotriton_api"
LABEL = "libaotriton_v2"
# Itanium-mangled names (typeinfo and vtables too) nested in namespace aotriton
_IN_NAMESPACE = re.compile(r"^_Z(?:T[VIST])?N[rVK]*[RO]?8aotriton")
# what the library may need: the C and C++ runtime, nothing of ROCm or CUDA
_ALLOWED_NEEDED = re.compile(r"^(?:libc\.so\.6|libm\.so\.6|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1|"
                             r"libstdc\+\+\.so\.6|libgcc_s\.so\.1|ld-linux[-a-z0-9_.]*\.so\.[0-9]+)$")
# the templates the API passes by value, instantiated by the probe
_PROBE_TYPES = ("aotriton::Stream",) + tuple(f"aotriton::TensorView<{r}>" for r in range(5)) + tuple(
    f"aotriton::LazyTensor<{r}>" for r in (2, 4))


@dataclass
class TypeLayout:
    size: int
    fields: List[Tuple[str, int, str]]   # (name, offset, type); bases as "<base T>"


@dataclass
class ApiLib:
    line: str                             # "0.11", "0.13"
    library: str                          # file name
    soname: Optional[str]
    exports: Dict[str, str]               # mangled -> demangled (mangled when no c++filt)
    needed: List[str]
    version: Optional[str] = None         # AOTRITON_VERSION_* of config.h
    rocm_version: Optional[str] = None    # AOTRITON_ROCM_VERSION of config.h
    types: Dict[str, TypeLayout] = field(default_factory=dict)
    enums: Dict[str, Dict[str, int]] = field(default_factory=dict)
    constants: Dict[str, int] = field(default_factory=dict)
    has_headers: bool = False

    @property
    def label(self) -> str:
        return f"{LABEL} (AOTriton API {self.line})"


# -------------------------------------------------------------------------- ELF

def _elf(lib: Path) -> Tuple[Optional[str], List[str], List[str]]:
    """(soname, DT_NEEDED, exported defined symbols)."""
    try:
        from elftools.elf.elffile import ELFFile
    except ImportError as e:
        raise NativeAbiError(f"reading {lib.name} needs pyelftools ({e}): "
                             "pip install 'aotriton-rocm[build]'") from None
    dynamic = read_dynamic(lib)
    exports = []
    with open(lib, "rb") as f:
        dynsym = ELFFile(f).get_section_by_name(".dynsym")
        for sym in dynsym.iter_symbols() if dynsym else []:
            e = sym.entry
            if (sym.name and e.st_shndx != "SHN_UNDEF" and e.st_other.visibility == "STV_DEFAULT"
                    and e.st_info.bind in ("STB_GLOBAL", "STB_WEAK", "STB_GNU_UNIQUE")
                    and e.st_info.type not in ("STT_SECTION", "STT_FILE")):
                exports.append(sym.name)
    return dynamic.soname, list(dynamic.needed), sorted(set(exports))


def _demangle(names: List[str]) -> Dict[str, str]:
    tool = shutil.which("c++filt")
    if not tool or not names:
        return {n: n for n in names}
    p = subprocess.run([tool], input="\n".join(names) + "\n", capture_output=True, text=True)
    out = p.stdout.splitlines()
    return dict(zip(names, out)) if p.returncode == 0 and len(out) == len(names) else {n: n for n in names}


# ---------------------------------------------------------------------- headers

def find_cxx() -> Optional[str]:
    for c in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if c and shutil.which(c):
            return c
    return None


def _config(include: Path) -> Tuple[Optional[str], Optional[str]]:
    text = (include / "aotriton" / "config.h").read_text(encoding="utf-8", errors="replace")
    parts = [re.search(rf"#define AOTRITON_VERSION_{k} (\d+)u?\b", text) for k in ("MAJOR", "MINOR", "PATCH")]
    rocm = re.search(r'#define AOTRITON_ROCM_VERSION "([^"]+)"', text)
    return (".".join(m.group(1) for m in parts) if all(parts) else None), (rocm.group(1) if rocm else None)


def _probe(include: Path, d: Path) -> Path:
    """Compile the probe against the headers under ``include`` (with -g)."""
    cxx = find_cxx()
    if cxx is None:
        raise NativeAbiError(f"comparing {LABEL}'s struct layouts needs a C++ compiler (c++, g++ or "
                             "clang++; or set CXX): install g++")
    headers = sorted(p.relative_to(include).as_posix() for p in (include / "aotriton").rglob("*.h"))
    src = d / "probe.cpp"
    src.write_text("".join(f"#include <{h}>\n" for h in headers)
                   + "namespace aotriton_abi_probe {\nconstexpr unsigned long sizes[] = {"
                   + ", ".join(f"sizeof({t})" for t in _PROBE_TYPES) + "};\n}\n")
    obj = d / "probe.o"
    # our own hip types, never a ROCm install's: the layouts must not depend on the host
    cmd = [cxx, "-std=c++17", "-g", "-fno-eliminate-unused-debug-types", "-w", "-c",
           "-DAOTRITON_ROCM_NO_HIP_RUNTIME_H", "-I", str(include), str(src), "-o", str(obj)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise NativeAbiError(f"the {LABEL} headers in {include} do not compile: {p.stderr[-2000:]}")
    return obj


def _name(die) -> Optional[str]:
    a = die.attributes.get("DW_AT_name")
    return a.value.decode("utf-8", "replace") if a is not None else None


def _type_name(die, depth: int = 0) -> str:
    if die is None or depth > 20:
        return "void"
    inner = die.get_DIE_from_attribute("DW_AT_type") if "DW_AT_type" in die.attributes else None
    tag = die.tag
    if tag == "DW_TAG_pointer_type":
        return _type_name(inner, depth + 1) + "*"
    if tag in ("DW_TAG_reference_type", "DW_TAG_rvalue_reference_type"):
        return _type_name(inner, depth + 1) + ("&" if tag == "DW_TAG_reference_type" else "&&")
    if tag in ("DW_TAG_const_type", "DW_TAG_volatile_type"):
        return tag[7:-5] + " " + _type_name(inner, depth + 1)
    if tag == "DW_TAG_array_type":
        dims = ""
        for s in die.iter_children():
            a = s.attributes
            n = a["DW_AT_count"].value if "DW_AT_count" in a else (
                a["DW_AT_upper_bound"].value + 1 if "DW_AT_upper_bound" in a else "")
            dims += f"[{n}]"
        return _type_name(inner, depth + 1) + dims
    if tag == "DW_TAG_subroutine_type":
        params = [_type_name(p.get_DIE_from_attribute("DW_AT_type"), depth + 1)
                  for p in die.iter_children() if p.tag == "DW_TAG_formal_parameter"]
        return f"{_type_name(inner, depth + 1)}({', '.join(params)})"
    return _name(die) or f"<anonymous {tag[7:]}>"


def _offset(attr) -> Optional[int]:
    v = attr.value
    if isinstance(v, int):
        return v
    if isinstance(v, list) and v and v[0] == 0x23:  # DW_OP_plus_uconst ULEB128
        n, shift = 0, 0
        for b in v[1:]:
            n |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        return n
    return None


def _bit_field(member, loc) -> Optional[Tuple[int, int]]:
    """(bit offset in the struct, width) of a bit-field member, else None.
    DWARF 4+ gives DW_AT_data_bit_offset; older producers a byte location and
    DW_AT_bit_offset counted from the storage unit's most significant bit
    (little-endian targets)."""
    a = member.attributes
    if member.tag != "DW_TAG_member" or "DW_AT_bit_size" not in a:
        return None
    width = a["DW_AT_bit_size"].value
    if "DW_AT_data_bit_offset" in a:
        return a["DW_AT_data_bit_offset"].value, width
    unit = a["DW_AT_byte_size"].value if "DW_AT_byte_size" in a else 4
    base = (_offset(loc) or 0) if loc is not None else 0
    return base * 8 + unit * 8 - a["DW_AT_bit_offset"].value - width, width


def _walk(die, scope: List[str], lib: ApiLib) -> None:
    for child in die.iter_children():
        tag, name = child.tag, _name(child)
        if tag == "DW_TAG_namespace":
            if name and (scope or name == "aotriton"):
                _walk(child, scope + [name], lib)
            continue
        if not scope or not name:
            continue
        qname = "::".join(scope + [name])
        if tag in ("DW_TAG_variable", "DW_TAG_member") and "DW_AT_const_value" in child.attributes:
            lib.constants.setdefault(qname, child.attributes["DW_AT_const_value"].value)  # kVersion, ...
            continue
        if "DW_AT_declaration" in child.attributes:
            continue
        if tag in ("DW_TAG_structure_type", "DW_TAG_class_type", "DW_TAG_union_type"):
            fields = []
            for m in child.iter_children():
                loc = m.attributes.get("DW_AT_data_member_location")
                bits = _bit_field(m, loc)
                if bits is not None:  # VarlenMode, VarlenBits: the bits' place is the ABI
                    t = _type_name(m.get_DIE_from_attribute("DW_AT_type"))
                    fields.append((_name(m), bits[0] // 8, f"{t}:{bits[1]} at bit {bits[0]}"))
                elif m.tag in ("DW_TAG_member", "DW_TAG_inheritance") and loc is not None:
                    t = _type_name(m.get_DIE_from_attribute("DW_AT_type"))
                    fields.append((_name(m) if m.tag == "DW_TAG_member" else f"<base {t}>", _offset(loc), t))
            size = child.attributes.get("DW_AT_byte_size")
            lib.types.setdefault(qname, TypeLayout(size.value if size else 0, fields))
            _walk(child, scope + [name], lib)
        elif tag == "DW_TAG_enumeration_type":
            lib.enums.setdefault(qname, {_name(e): e.attributes["DW_AT_const_value"].value
                                         for e in child.iter_children() if e.tag == "DW_TAG_enumerator"})


def _layouts(include: Path, lib: ApiLib) -> None:
    from elftools.elf.elffile import ELFFile

    with tempfile.TemporaryDirectory(prefix="aotr-v2-probe-") as d:
        obj = _probe(include, Path(d))
        with open(obj, "rb") as f:
            for cu in ELFFile(f).get_dwarf_info().iter_CUs():
                _walk(cu.get_top_DIE(), [], lib)
    if not lib.types:
        raise NativeAbiError(f"the {LABEL} headers in {include} declare no type of namespace aotriton")


# --------------------------------------------------------------------- reading

def read_api_lib(lib: Path, include: Optional[Path], line: str) -> ApiLib:
    """One line's library (and its headers' layouts when ``include`` holds ``aotriton/``)."""
    soname, needed, exports = _elf(lib)
    out = ApiLib(line=line, library=lib.name, soname=soname, exports=_demangle(exports), needed=needed)
    if include is not None and (include / "aotriton" / "config.h").is_file():
        out.has_headers = True
        out.version, out.rocm_version = _config(include)
        _layouts(include, out)
    return out


def scan_api_libs(libroot: Path, incroot: Path) -> Dict[str, ApiLib]:
    """Every ``libroot/aotriton_api/<line>/libaotriton_v2.so.*`` (the file,
    not links) with its headers ``incroot/aotriton_api/<line>/``."""
    out: Dict[str, ApiLib] = {}
    base = libroot / API_DIR
    for d in sorted(base.iterdir()) if base.is_dir() else []:
        libs = sorted(p for p in d.glob(LIB_PREFIX + "*") if p.is_file() and not p.is_symlink())
        if len(libs) > 1:
            raise NativeAbiError(f"{d}: several {LABEL} files ({', '.join(p.name for p in libs)})")
        if libs:
            inc = incroot / API_DIR / d.name
            out[d.name] = read_api_lib(libs[0], inc if inc.is_dir() else None, d.name)
    return out


# ------------------------------------------------------------------- checking

def release_problems(lib: ApiLib) -> List[str]:
    """What is wrong with this library whatever the other release is."""
    out: List[str] = []
    lbl = lib.label
    outside = [m for m in lib.exports if not _IN_NAMESPACE.match(m)]
    if outside:
        out.append(f"{lbl}: exports {len(outside)} symbol(s) outside namespace aotriton (only AOTriton's "
                   "API may be exported): " + ", ".join(lib.exports[m] for m in outside[:12])
                   + (" ..." if len(outside) > 12 else ""))
    bad = [n for n in lib.needed if not _ALLOWED_NEEDED.match(n)]
    if bad:
        out.append(f"{lbl}: needs {', '.join(bad)} (DT_NEEDED): it may need only the C/C++ runtime; "
                   "the ROCm or CUDA runtime is opened at run time")
    if lib.soname != lib.library:
        out.append(f"{lbl}: soname {lib.soname} is not its file name {lib.library}")
    if not lib.has_headers:
        out.append(f"{lbl}: no headers (include/{API_DIR}/{lib.line}/aotriton/config.h) shipped with it")
    elif lib.library != LIB_PREFIX + str(lib.version):
        out.append(f"{lbl}: {lib.library} does not carry its headers' version (config.h: {lib.version})")
    return out


def _compare_layouts(o: ApiLib, n: ApiLib, lbl: str) -> List[Tuple[bool, str]]:
    out: List[Tuple[bool, str]] = []
    for t in sorted(set(o.types) - set(n.types)):
        out.append((True, f"{lbl}: type {t} removed"))
    for t in sorted(set(n.types) - set(o.types)):
        out.append((False, f"{lbl}: new type {t} ({n.types[t].size} bytes)"))
    for t in sorted(set(o.types) & set(n.types)):
        a, b = o.types[t], n.types[t]
        if a.size != b.size:
            out.append((True, f"{lbl}: {t}: size changed: {a.size} -> {b.size} bytes"))
        nf = {f[0]: f for f in b.fields}
        for name, off, typ in a.fields:
            g = nf.get(name)
            if g is None:
                out.append((True, f"{lbl}: {t}: field {name} ({typ} at offset {off}) removed"))
            elif g[1] != off:
                out.append((True, f"{lbl}: {t}: field {name} offset changed: {off} -> {g[1]}"))
            elif g[2] != typ:
                out.append((True, f"{lbl}: {t}: field {name} type changed: {typ} -> {g[2]}"))
        old_names = {f[0] for f in a.fields}
        for name, off, typ in b.fields:
            if name not in old_names:
                out.append((True, f"{lbl}: {t}: field {name} ({typ}) added at offset {off} (the layout is "
                                  "AOTriton's and fixed)"))
    for e in sorted(set(o.enums) - set(n.enums)):
        out.append((True, f"{lbl}: enum {e} removed"))
    for e in sorted(set(o.enums) & set(n.enums)):
        a, b = o.enums[e], n.enums[e]
        for k in sorted(a):
            if k not in b:
                out.append((True, f"{lbl}: enum {e}: enumerator {k} (= {a[k]}) removed"))
            elif a[k] != b[k]:
                out.append((True, f"{lbl}: enum {e}: {k} changed value: {a[k]} -> {b[k]}"))
        for k in sorted(set(b) - set(a)):
            out.append((False, f"{lbl}: enum {e}: new enumerator {k} = {b[k]}"))
    for c in sorted(set(o.constants) | set(n.constants)):
        if c not in n.constants:
            out.append((True, f"{lbl}: constant {c} (= {o.constants[c]}) removed"))
        elif c not in o.constants:
            out.append((False, f"{lbl}: new constant {c} = {n.constants[c]}"))
        elif o.constants[c] != n.constants[c]:
            out.append((True, f"{lbl}: constant {c} changed: {o.constants[c]} -> {n.constants[c]}"))
    return out


def compare_api_lib(o: ApiLib, n: ApiLib) -> Tuple[List[Tuple[bool, str]], List[str]]:
    """(changes as (breaking?, what), notes) between one line's libraries."""
    lbl, out, notes = n.label, [], []
    if o.library != n.library:
        out.append((True, f"{lbl}: file name changed: {o.library} -> {n.library} (a torch built for the "
                          "line loads it by that name)"))
    if o.soname != n.soname:
        out.append((True, f"{lbl}: soname changed: {o.soname} -> {n.soname}"))
    for m in sorted(set(o.exports) - set(n.exports), key=lambda m: o.exports[m]):
        out.append((True, f"{lbl}: exported symbol removed: {o.exports[m]} ({m})"))
    for m in sorted(set(n.exports) - set(o.exports), key=lambda m: n.exports[m]):
        out.append((False, f"{lbl}: new exported symbol {n.exports[m]}"))
    if o.has_headers and n.has_headers:
        out.extend(_compare_layouts(o, n, lbl))
        notes.append(f"{lbl}: layouts of {len(n.types)} types and {len(n.enums)} enums compared "
                     "(DWARF of a probe compiled from each release's headers)")
    else:
        out.append((True, f"{lbl}: headers missing from {'OLD' if not o.has_headers else 'NEW'}: "
                          "layouts cannot be compared"))
    return out, notes


def compare_api_libs(old: Dict[str, ApiLib], new: Dict[str, ApiLib]
                     ) -> Tuple[List[Tuple[bool, str]], List[str]]:
    """(changes, notes) between two releases' libraries, line by line."""
    out: List[Tuple[bool, str]] = []
    notes: List[str] = []
    for line in sorted(set(old) - set(new)):
        out.append((True, f"{old[line].label}: {old[line].library} is missing from NEW"))
    for line in sorted(set(new) - set(old)):
        out.append((False, f"new {new[line].label}: {new[line].library}"))
    for line in sorted(set(old) & set(new)):
        changes, n = compare_api_lib(old[line], new[line])
        out.extend(changes)
        notes.extend(n)
    return out, notes
