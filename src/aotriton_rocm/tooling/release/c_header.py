"""The C public header of libaotriton_rocm as a model for ``abi-check``: its
functions, enums, defines and struct layouts. The parser is strict, for that
header's style (no macros in declarations but ``AOTR_API``); struct layouts
come from the C compiler (``offsetof``/``sizeof``) or, without one, from the
C layout rules (LP64)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple


HEADER = "aotriton_rocm.h"


class NativeAbiError(RuntimeError):
    pass


@dataclass(frozen=True)
class Field:
    name: str
    offset: int   # bytes
    type: str


@dataclass
class Struct:
    size: Optional[int]
    fields: List[Field]

    @property
    def has_struct_size(self) -> bool:
        return bool(self.fields) and self.fields[0].name == "struct_size"


@dataclass
class CModel:
    """Functions (name -> prototype), function-pointer types (name ->
    signature), structs, enums (name -> {enumerator: value})."""
    functions: Dict[str, str] = field(default_factory=dict)
    callbacks: Dict[str, str] = field(default_factory=dict)
    structs: Dict[str, Struct] = field(default_factory=dict)
    enums: Dict[str, Dict[str, int]] = field(default_factory=dict)
    defines: Dict[str, str] = field(default_factory=dict)


# ------------------------------------------------------------------ the header

_TOKEN = re.compile(r"\s*(?:(\"(?:[^\"\\]|\\.)*\")|([A-Za-z_]\w*)|(0[xX][0-9a-fA-F]+|\d+)[uUlL]*|(\S))")
_BASE = {  # size, alignment (LP64)
    "char": (1, 1), "int": (4, 4), "unsigned": (4, 4), "float": (4, 4), "double": (8, 8),
    "int8_t": (1, 1), "uint8_t": (1, 1), "int16_t": (2, 2), "uint16_t": (2, 2),
    "int32_t": (4, 4), "uint32_t": (4, 4), "int64_t": (8, 8), "uint64_t": (8, 8),
    "size_t": (8, 8), "long": (8, 8), "uintptr_t": (8, 8),
}


def _strip_preprocessor(text: str) -> Tuple[str, Dict[str, str]]:
    """Drop comments and preprocessor lines (and what ``#ifdef __cplusplus``
    guards); collect the object-like ``#define``s."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    out, defines, skip = [], {}, []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("#"):
            d = s[1:].strip()
            if d.startswith(("if", "ifdef", "ifndef")):
                skip.append(d.startswith("ifdef") and d.split()[1:2] == ["__cplusplus"])
            elif d.startswith("endif"):
                skip.pop()
            else:
                m = re.match(r"define\s+([A-Za-z_]\w*)\s+(.+)$", d)
                if m and not any(skip):
                    defines[m.group(1)] = m.group(2).strip().strip('"')
            continue
        if not any(skip):
            out.append(line)
    return "\n".join(out), defines


def _tokens(text: str) -> List[str]:
    toks, pos = [], 0
    while True:
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            break
        pos = m.end()
        tok = next(g for g in m.groups() if g is not None)
        toks.append(tok)
    if text[pos:].strip():
        raise NativeAbiError(f"{HEADER}: cannot tokenize near {text[pos:pos + 40]!r}")
    return toks


def _split(toks: List[str], sep: str) -> List[List[str]]:
    out, cur, depth = [], [], 0
    for t in toks:
        if t in "({[":
            depth += 1
        elif t in ")}]":
            depth -= 1
        if t == sep and depth == 0:
            out.append(cur)
            cur = []
        else:
            cur.append(t)
    if cur:
        out.append(cur)
    return out


def _type_str(spec: List[str], stars: int, dims: List[str]) -> str:
    t = " ".join(spec) + (" " + "*" * stars if stars else "")
    return t + "".join(f"[{d}]" for d in dims)


def _declarator(toks: List[str], defines: Dict[str, str]) -> Tuple[int, str, List[str]]:
    """``* * name [N] [M]`` -> (stars, name, dims); ``const`` after ``*`` is kept as part of the stars."""
    stars = 0
    i = 0
    while i < len(toks) and toks[i] in ("*", "const"):
        stars += toks[i] == "*"
        i += 1
    if i >= len(toks) or not re.match(r"[A-Za-z_]\w*$", toks[i]):
        raise NativeAbiError(f"{HEADER}: unsupported declarator {' '.join(toks)!r}")
    name, dims = toks[i], []
    rest = toks[i + 1:]
    while rest:
        if len(rest) < 3 or rest[0] != "[" or rest[2] != "]":
            raise NativeAbiError(f"{HEADER}: unsupported declarator {' '.join(toks)!r}")
        dims.append(defines.get(rest[1], rest[1]))
        rest = rest[3:]
    return stars, name, dims


def _decl(toks: List[str], defines: Dict[str, str]) -> List[Tuple[str, str]]:
    """``type d1, d2`` -> [(name, type)]."""
    parts = _split(toks, ",")
    first = parts[0]
    j = next((k for k, t in enumerate(first) if t == "*"), None)
    if j is None:
        j = (first.index("[") if "[" in first else len(first)) - 1
    spec, out = first[:j], []
    if not spec or not all(re.match(r"[A-Za-z_]\w*$", t) for t in spec):
        raise NativeAbiError(f"{HEADER}: unsupported declaration {' '.join(toks)!r}")
    for d in [first[j:]] + parts[1:]:
        stars, name, dims = _declarator(d, defines)
        out.append((name, _type_str(spec, stars, dims)))
    return out


def _enum_body(toks: List[str]) -> Dict[str, int]:
    vals, nxt = {}, 0
    for item in _split(toks, ","):
        if not item:
            continue
        if len(item) == 1:
            v = nxt
        elif len(item) == 3 and item[1] == "=":
            v = int(item[2], 0)
        elif len(item) == 4 and item[1] == "=" and item[2] == "-":
            v = -int(item[3], 0)
        else:
            raise NativeAbiError(f"{HEADER}: unsupported enumerator {' '.join(item)!r}")
        vals[item[0]] = v
        nxt = v + 1
    return vals


def parse_header(text: str) -> Tuple[CModel, Dict[str, List[Tuple[str, str]]]]:
    """The header's functions (prototypes with parameter names dropped),
    structs (fields; layouts filled in by :func:`layout`) and enums. Strict:
    any declaration outside this header's style is an error."""
    body, defines = _strip_preprocessor(text)
    model = CModel(defines=defines)
    fields: Dict[str, List[Tuple[str, str]]] = {}
    for decl in _split(_tokens(body), ";"):
        if not decl:
            continue
        where = " ".join(decl[:6])
        if decl[0] == "typedef" and decl[1] in ("struct", "enum"):
            if "{" not in decl:  # typedef struct aotr_x aotr_x;  (opaque)
                if len(decl) != 4 or decl[1] != "struct":
                    raise NativeAbiError(f"{HEADER}: unsupported declaration {where!r}")
                continue
            lb = decl.index("{")
            rb = len(decl) - 1 - decl[::-1].index("}")
            tag = decl[2] if lb == 3 else None
            alias = decl[rb + 1:]
            if len(alias) != 1 or (tag is not None and tag != alias[0]):
                raise NativeAbiError(f"{HEADER}: typedef {tag} must name its tag ({where!r})")
            name, inner = alias[0], decl[lb + 1:rb]
            if decl[1] == "enum":
                model.enums[name] = _enum_body(inner)
            else:
                fields[name] = [nt for member in _split(inner, ";") if member
                                for nt in _decl(member, defines)]
        elif decl[0] == "typedef" and "(" in decl and decl[-1] == ")" \
                and decl[decl.index("(") + 1] == "*":
            # typedef RET (*name)(PARAMS);  a function-pointer type
            lp = decl.index("(")
            name, params = decl[lp + 2], decl[lp + 5:-1]
            [(_, ret)] = _decl(decl[1:lp] + ["_"], defines)
            ptypes = [_decl(p, defines)[0][1] for p in _split(params, ",")]
            model.callbacks[name] = f"{ret} ({', '.join(ptypes)})"
        elif decl[0] == "enum" and decl[1] == "{" and decl[-1] == "}":
            vals = _enum_body(decl[2:-1])
            model.enums["enum {" + next(iter(vals), "") + ", ...}"] = vals
        elif decl[0] == "AOTR_API":
            if "(" not in decl or decl[-1] != ")":
                raise NativeAbiError(f"{HEADER}: unsupported declaration {where!r}")
            lp = decl.index("(")
            [(name, ret)] = _decl(decl[1:lp], defines)
            params = decl[lp + 1:-1]
            if params == ["void"]:
                ptypes = []
            else:
                ptypes = [_decl(p, defines)[0][1] for p in _split(params, ",")]
            model.functions[name] = f"{ret} ({', '.join(ptypes)})".replace("* (", "*(")
        else:
            raise NativeAbiError(f"{HEADER}: unsupported declaration {where!r}")
    return model, fields


def _rule_layout(fields: Dict[str, List[Tuple[str, str]]],
                 callbacks: Iterable[str] = ()) -> Dict[str, Struct]:
    """Offsets by the C layout rules (x86-64/aarch64 LP64)."""
    done: Dict[str, Tuple[int, int]] = {name: (8, 8) for name in callbacks}
    out: Dict[str, Struct] = {}

    def size_align(t: str) -> Tuple[int, int]:
        m = re.match(r"^(.*?)((?:\[\d+\])*)$", t)
        base, dims = m.group(1).strip(), [int(d) for d in re.findall(r"\[(\d+)\]", m.group(2))]
        if base.endswith("*"):
            s, a = 8, 8
        else:
            base = base.replace("const ", "").strip()
            if base in _BASE:
                s, a = _BASE[base]
            elif base in done:
                s, a = done[base]
            else:
                raise NativeAbiError(f"{HEADER}: no size known for type {base!r}")
        for d in dims:
            s *= d
        return s, a

    for name, fs in fields.items():
        off, align, out_fields = 0, 1, []
        for fname, ftype in fs:
            s, a = size_align(ftype)
            off = (off + a - 1) // a * a
            out_fields.append(Field(fname, off, ftype))
            off += s
            align = max(align, a)
        size = (off + align - 1) // align * align
        done[name] = (size, align)
        out[name] = Struct(size, out_fields)
    return out


def _cc_layout(header: Path, fields: Dict[str, List[Tuple[str, str]]], cc: str) -> Dict[str, Struct]:
    """Offsets and sizes as the compiler lays them out (offsetof/sizeof)."""
    lines = ["#include <stddef.h>", "#include <stdio.h>", f'#include "{header.name}"',
             "int main(void) {"]
    for s, fs in fields.items():
        lines.append(f'  printf("S %s %zu\\n", "{s}", sizeof({s}));')
        for f, _ in fs:
            lines.append(f'  printf("F %s %s %zu\\n", "{s}", "{f}", offsetof({s}, {f}));')
    lines.append("  return 0;\n}")
    with tempfile.TemporaryDirectory(prefix="aotr-layout-") as d:
        src, exe = Path(d, "layout.c"), Path(d, "layout")
        src.write_text("\n".join(lines) + "\n")
        p = subprocess.run([cc, "-std=c11", "-I", str(header.parent), "-o", str(exe), str(src)],
                           capture_output=True, text=True)
        if p.returncode != 0:
            raise NativeAbiError(f"{header}: {cc} cannot compile the layout probe: {p.stderr[-2000:]}")
        run = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    sizes: Dict[str, int] = {}
    offs: Dict[Tuple[str, str], int] = {}
    for line in run.splitlines():
        parts = line.split()
        if parts[0] == "S":
            sizes[parts[1]] = int(parts[2])
        else:
            offs[(parts[1], parts[2])] = int(parts[3])
    return {s: Struct(sizes[s], [Field(f, offs[(s, f)], t) for f, t in fs]) for s, fs in fields.items()}


def find_cc() -> Optional[str]:
    return os.environ.get("CC") if os.environ.get("CC") and shutil.which(os.environ["CC"]) \
        else shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def header_model(header: Path) -> Tuple[CModel, str]:
    model, fields = parse_header(header.read_text(encoding="utf-8"))
    cc = find_cc()
    if cc:
        model.structs = _cc_layout(header, fields, cc)
        return model, "cc"
    model.structs = _rule_layout(fields, model.callbacks)
    return model, "C layout rules"
