"""Static validation of AMD GPU code objects (HSACO).

Build-time only (the ``build`` extra): the ELF is read with pyelftools and
the AMDGPU metadata with msgpack. AMD code objects cannot be executed on the
machines this project is built on, so every one we ship is checked by
reading it:

* the ELF header: ELF64 little-endian, ``e_machine`` EM_AMDGPU (224), OS ABI
  AMDGPU_HSA (64), ``EI_ABIVERSION`` (code object v4 = 2, v5 = 3, v6 = 4) and
  the processor in ``e_flags & EF_AMDGPU_MACH`` (0xff) against the intended arch;
* the kernel symbol and its kernel descriptor symbol ``<name>.kd``;
* the AMDGPU metadata note (``NT_AMDGPU_METADATA`` = 32, owner ``"AMDGPU"``), a
  MessagePack map: register counts, spills, private segment (scratch), group
  segment (LDS), wavefront size, kernarg segment size and the ``.args`` list,
  which must match the recorded argument list;
* an occupancy estimate (waves per SIMD), see occupancy.py.

NVIDIA cubins are not read here: their figures (registers, shared memory)
come from triton's compile metadata (compile.py).

Entry points: :func:`inspect_code_object` (facts) and :func:`validate_kernel`
(facts + checks against a :class:`~aotriton_rocm.common.archive.KernelRecord`).
"""
from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import msgpack
from elftools.common.exceptions import ELFError
from elftools.construct import ConstructError
from elftools.elf.elffile import ELFFile
from elftools.elf.enums import ENUM_E_MACHINE, ENUM_EI_OSABI
from elftools.elf.sections import NoteSection, SymbolTableSection

from ...core.kernel_spec import RESOURCE_KINDS
from .occupancy import ArchLimits, estimate_occupancy

__all__ = [
    "CodeObjectError",
    "MsgpackError",
    "decode_metadata",
    "EM_AMDGPU",
    "EF_AMDGPU_MACH",
    "CODE_OBJECT_VERSIONS",
    "ElfSymbol",
    "KernelMeta",
    "CodeObjectInfo",
    "ArchLimits",
    "Validation",
    "RESOURCE_KINDS",
    "inspect_code_object",
    "expected_kernarg_layout",
    "estimate_occupancy",
    "validate_kernel",
]

EM_AMDGPU = 224
ELFOSABI_AMDGPU_HSA = 64
EF_AMDGPU_MACH_MASK = 0x0FF
NT_AMDGPU_METADATA = 32
# e_flags EF_AMDGPU_MACH values (LLVM AMDGPUUsage); ci/targets.toml carries the
# same values as data, this table names what a foreign code object targets.
EF_AMDGPU_MACH: Dict[str, int] = {
    "gfx900": 0x02C, "gfx906": 0x02F, "gfx908": 0x030, "gfx90a": 0x03F, "gfx940": 0x040,
    "gfx941": 0x04B, "gfx942": 0x04C, "gfx950": 0x04F, "gfx1030": 0x036, "gfx1100": 0x041,
    "gfx1101": 0x046, "gfx1102": 0x047, "gfx1103": 0x044, "gfx1150": 0x043, "gfx1151": 0x04A,
    "gfx1152": 0x055, "gfx1200": 0x048, "gfx1201": 0x04E,
}
_MACH_NAMES = {v: k for k, v in EF_AMDGPU_MACH.items()}
# EI_ABIVERSION (with ELFOSABI_AMDGPU_HSA) -> code object version
CODE_OBJECT_VERSIONS = {0: 2, 1: 3, 2: 4, 3: 5, 4: 6}


class CodeObjectError(ValueError):
    """The bytes are not a well-formed AMDGPU code object."""


class MsgpackError(CodeObjectError):
    """The AMDGPU metadata note is not valid MessagePack."""


# -- MessagePack ---------------------------------------------------------------

def decode_metadata(desc: bytes) -> Any:
    """Decode the one MessagePack object of an NT_AMDGPU_METADATA descriptor
    (str for str, bytes for bin). The descriptor may be zero-padded to 4 bytes;
    any other trailing byte is an error."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=max(len(desc), 1))
    unpacker.feed(bytes(desc))
    try:
        obj = unpacker.unpack()
    except msgpack.OutOfData:
        raise MsgpackError(f"msgpack: truncated ({len(desc)} bytes end inside the object)") from None
    except (msgpack.UnpackException, ValueError, TypeError) as e:
        # FormatError (a reserved type byte), StackError (nesting), non-UTF-8
        # strings, unhashable map keys
        raise MsgpackError(f"msgpack: malformed data ({type(e).__name__}"
                           f"{': ' + str(e) if str(e) else ''})") from None
    rest = bytes(desc)[unpacker.tell():]
    if any(rest):
        raise MsgpackError(f"msgpack: {len(rest)} trailing bytes after the object")
    return obj


# -- ELF -------------------------------------------------------------------

@dataclass(frozen=True)
class ElfSymbol:
    name: str
    value: int
    size: int
    type: str  # pyelftools' STT_* name: STT_OBJECT, STT_FUNC, ...
    binding: str  # STB_*
    shndx: Any  # section index, or SHN_UNDEF / SHN_ABS


@dataclass
class KernelMeta:
    """One entry of ``amdhsa.kernels`` (the fields we use; ``raw`` has all)."""

    name: str
    symbol: str
    sgpr_count: int
    vgpr_count: int
    agpr_count: int
    vgpr_spill_count: int
    sgpr_spill_count: int
    private_segment_fixed_size: int
    group_segment_fixed_size: int
    wavefront_size: int
    kernarg_segment_size: int
    kernarg_segment_align: int
    uses_dynamic_stack: bool
    args: List[Dict[str, Any]]
    raw: Dict[str, Any] = field(repr=False, default_factory=dict)

    @property
    def explicit_args(self) -> List[Dict[str, Any]]:
        return [a for a in self.args if not str(a.get(".value_kind", "")).startswith("hidden_")]


@dataclass
class CodeObjectInfo:
    arch: Optional[str]  # from e_flags; None if the machine value is unknown to us
    mach: int
    e_flags: int
    code_object_version: Optional[int]
    abi_version: int
    xnack: str  # "any" | "off" | "on" | "unsupported"
    sramecc: str
    target: str  # amdhsa.target from the metadata, e.g. "amdgcn-amd-amdhsa--gfx942"
    symbols: Dict[str, ElfSymbol]
    kernels: List[KernelMeta]
    metadata: Dict[str, Any] = field(repr=False, default_factory=dict)

    def kernel(self, name: str) -> Optional[KernelMeta]:
        for k in self.kernels:
            if k.name == name:
                return k
        return None


ELF_HEADER_BYTES = 64  # ELF64


def _enum_value(value: Any, names: Mapping[str, int]) -> int:
    """pyelftools gives known enum values as names, unknown ones as ints."""
    return value if isinstance(value, int) else names[value]


def _target_feature(e_flags: int, shift: int) -> str:
    # v4+: EF_AMDGPU_FEATURE_{XNACK,SRAMECC}_V4 two-bit fields at 0x300 / 0xc00
    v = (e_flags >> shift) & 0x3
    return {0: "unsupported", 1: "any", 2: "off", 3: "on"}[v]


def _check_header(data: bytes) -> None:
    """The identification bytes, before pyelftools picks a layout from them."""
    if len(data) < ELF_HEADER_BYTES or data[:4] != b"\x7fELF":
        raise CodeObjectError("not an ELF file (bad magic or shorter than an ELF header)")
    ei_class, ei_data = data[4], data[5]
    if (ei_class, ei_data) != (2, 1):
        raise CodeObjectError(f"not an ELF64 little-endian file (class {ei_class}, data {ei_data})")


def _check_layout(elf: ELFFile, size: int) -> None:
    """Every section lies inside the file (pyelftools reads short data silently)."""
    end = elf["e_shoff"] + elf["e_shnum"] * elf["e_shentsize"]
    if elf["e_shnum"] == 0 or end > size:
        raise CodeObjectError(f"section header table ({elf['e_shnum']} entries at offset {elf['e_shoff']}) "
                              f"runs past the end of the {size}-byte file: truncated or corrupted ELF")
    for sec in elf.iter_sections():
        if sec["sh_type"] != "SHT_NOBITS" and sec["sh_offset"] + sec["sh_size"] > size:
            raise CodeObjectError(f"section {sec.name or '?'} (offset {sec['sh_offset']}, {sec['sh_size']} "
                                  f"bytes) runs past the end of the {size}-byte file: truncated or "
                                  f"corrupted ELF")


def _symbols(elf: ELFFile) -> Dict[str, ElfSymbol]:
    out: Dict[str, ElfSymbol] = {}
    for sec in elf.iter_sections():
        if not isinstance(sec, SymbolTableSection):
            continue
        for sym in sec.iter_symbols():
            if sym.name and sym.name not in out:
                out[sym.name] = ElfSymbol(sym.name, sym["st_value"], sym["st_size"], sym["st_info"]["type"],
                                          sym["st_info"]["bind"], sym["st_shndx"])
    return out


def _metadata_notes(elf: ELFFile) -> List[bytes]:
    return [note["n_descdata"] for sec in elf.iter_sections() if isinstance(sec, NoteSection)
            for note in sec.iter_notes()
            if note["n_name"] == "AMDGPU" and note["n_type"] == NT_AMDGPU_METADATA]


def _int(d: Mapping[str, Any], key: str, default: int = 0) -> int:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int):
        raise CodeObjectError(f"metadata {key} is {v!r}, not an integer")
    return v


def _kernel_meta(k: Any) -> KernelMeta:
    if not isinstance(k, dict):
        raise CodeObjectError("AMDGPU metadata kernel entry is not a map")
    args = k.get(".args", [])
    if not isinstance(args, list) or not all(isinstance(a, dict) for a in args):
        raise CodeObjectError(f"kernel {k.get('.name')!r}: .args is not a list of maps")
    return KernelMeta(
        name=str(k.get(".name", "")), symbol=str(k.get(".symbol", "")),
        sgpr_count=_int(k, ".sgpr_count"), vgpr_count=_int(k, ".vgpr_count"),
        agpr_count=_int(k, ".agpr_count"), vgpr_spill_count=_int(k, ".vgpr_spill_count"),
        sgpr_spill_count=_int(k, ".sgpr_spill_count"),
        private_segment_fixed_size=_int(k, ".private_segment_fixed_size"),
        group_segment_fixed_size=_int(k, ".group_segment_fixed_size"),
        wavefront_size=_int(k, ".wavefront_size"),
        kernarg_segment_size=_int(k, ".kernarg_segment_size"),
        kernarg_segment_align=_int(k, ".kernarg_segment_align", 8),
        uses_dynamic_stack=bool(k.get(".uses_dynamic_stack", False)), args=args, raw=k)


def _read_elf(data: bytes) -> Tuple[ELFFile, Dict[str, ElfSymbol], List[bytes]]:
    _check_header(data)
    try:
        elf = ELFFile(io.BytesIO(data))
        machine = _enum_value(elf["e_machine"], ENUM_E_MACHINE)
        if machine != EM_AMDGPU:
            raise CodeObjectError(f"ELF machine is {machine}, not EM_AMDGPU ({EM_AMDGPU}): "
                                  f"not an AMD GPU code object")
        osabi = _enum_value(elf["e_ident"]["EI_OSABI"], ENUM_EI_OSABI)
        if osabi != ELFOSABI_AMDGPU_HSA:
            raise CodeObjectError(f"ELF OS ABI is {osabi}, not AMDGPU_HSA ({ELFOSABI_AMDGPU_HSA})")
        _check_layout(elf, len(data))
        return elf, _symbols(elf), _metadata_notes(elf)
    except (ELFError, ConstructError, UnicodeDecodeError) as e:
        raise CodeObjectError(f"truncated or corrupted ELF ({type(e).__name__}: {e})") from None


def inspect_code_object(data: bytes) -> CodeObjectInfo:
    """Parse an AMDGPU HSACO; raises :class:`CodeObjectError` naming what is wrong."""
    data = bytes(data)
    elf, symbols, md_blobs = _read_elf(data)
    if not md_blobs:
        raise CodeObjectError("no NT_AMDGPU_METADATA note (owner AMDGPU): not a code object v3+ "
                              "or the note section is missing")
    md = decode_metadata(md_blobs[0])
    if not isinstance(md, dict) or not isinstance(md.get("amdhsa.kernels"), list):
        raise CodeObjectError("AMDGPU metadata has no amdhsa.kernels list")
    kernels = [_kernel_meta(k) for k in md["amdhsa.kernels"]]
    e_flags = elf["e_flags"]
    abi = elf["e_ident"]["EI_ABIVERSION"]
    mach = e_flags & EF_AMDGPU_MACH_MASK
    return CodeObjectInfo(
        arch=_MACH_NAMES.get(mach), mach=mach, e_flags=e_flags,
        code_object_version=CODE_OBJECT_VERSIONS.get(abi), abi_version=abi,
        xnack=_target_feature(e_flags, 8), sramecc=_target_feature(e_flags, 10),
        target=str(md.get("amdhsa.target", "")), symbols=symbols, kernels=kernels, metadata=md)


# -- kernel arguments ------------------------------------------------------

_SCALAR_BYTES = {"i1": 1, "i8": 1, "u8": 1, "i16": 2, "u16": 2, "fp16": 2, "bf16": 2,
                 "i32": 4, "u32": 4, "fp32": 4, "f32": 4, "i64": 8, "u64": 8, "fp64": 8, "f64": 8}


def _arg_size(ty: str) -> int:
    if ty.startswith("*"):
        return 8
    try:
        return _SCALAR_BYTES[ty]
    except KeyError:
        raise CodeObjectError(f"unknown argument type {ty!r}") from None


def expected_kernarg_layout(args: Sequence[Tuple[str, str]]) -> Tuple[List[Tuple[str, int, int]], int]:
    """(name, offset, size) of each explicit argument with natural alignment
    (pointers 8, i64/fp64 8, i32/fp32 4, ...) and the end of the last one."""
    out = []
    off = 0
    for name, ty in args:
        size = _arg_size(ty)
        off = (off + size - 1) // size * size
        out.append((name, off, size))
        off += size
    return out, off


def _roundup(x: int, g: int) -> int:
    return (x + g - 1) // g * g


# -- validation ------------------------------------------------------------

@dataclass
class Validation:
    """Outcome of :func:`validate_kernel`: ``problems`` (empty = OK), ``stats``
    (numbers for KernelRecord.stats and the report), ``allowed`` (problems
    waived by an explicit exception, with its reason), ``resources``: the
    resource findings (kind, message), waived or not, kinds as in
    :data:`RESOURCE_KINDS`; every other problem is a broken code object."""

    problems: List[str] = field(default_factory=list)
    stats: Dict[str, Any] = field(default_factory=dict)
    allowed: List[str] = field(default_factory=list)
    resources: List[Tuple[str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _record_field(record: Any, name: str, default: Any = None) -> Any:
    if isinstance(record, Mapping):
        return record.get(name, default)
    return getattr(record, name, default)


def validate_kernel(code: bytes, record: Any, limits: ArchLimits, *,
                    code_object_version: Optional[int] = None,
                    allow: Optional[Mapping[str, str]] = None) -> Validation:
    """Check one HSACO against its KernelRecord (or a mapping with ``symbol``,
    ``args``, ``num_warps``, ``shared``, ``warp_size``) for ``limits.name``.

    ``allow`` waives resource findings by kind with a reason: "spills"
    (register spills and the scratch memory they take), "scratch" (scratch
    for anything else, e.g. a dynamic stack), "lds" (LDS over the arch's
    limit); waived problems are listed in ``Validation.allowed``.
    """
    v = Validation()
    arch = limits.name
    try:
        info = inspect_code_object(code)
    except CodeObjectError as e:
        v.problems.append(f"invalid code object: {e}")
        return v
    want_mach = limits.mach if limits.mach is not None else EF_AMDGPU_MACH.get(arch)
    if want_mach is None:
        v.problems.append(f"no EF_AMDGPU_MACH value known for {arch}")
    elif info.mach != want_mach:
        got = info.arch or f"unknown processor 0x{info.mach:03x}"
        v.problems.append(f"code object is for {got} (e_flags mach 0x{info.mach:03x}), "
                          f"not {arch} (0x{want_mach:03x})")
    if info.target and not (info.target.endswith("-" + arch) or ("-" + arch + ":") in info.target):
        v.problems.append(f"metadata amdhsa.target is {info.target!r}, not {arch}")
    if code_object_version is not None and info.code_object_version != code_object_version:
        v.problems.append(f"code object version {info.code_object_version} (EI_ABIVERSION "
                          f"{info.abi_version}), expected {code_object_version}")
    symbol = str(_record_field(record, "symbol", ""))
    km = info.kernel(symbol)
    if symbol not in info.symbols:
        v.problems.append(f"kernel symbol {symbol!r} missing from the symbol table")
    if symbol + ".kd" not in info.symbols:
        v.problems.append(f"kernel descriptor symbol {symbol + '.kd'!r} missing")
    if km is None:
        names = ", ".join(k.name for k in info.kernels) or "none"
        v.problems.append(f"no metadata for kernel {symbol!r} (the code object has: {names})")
        return v
    if km.symbol and km.symbol != symbol + ".kd":
        v.problems.append(f"metadata .symbol is {km.symbol!r}, expected {symbol + '.kd'!r}")

    num_warps = int(_record_field(record, "num_warps", 4) or 4)
    # triton's AMD kernels take their LDS dynamically (group segment 0, the
    # launch passes ``shared`` bytes): what a workgroup holds is the sum.
    shared = int(_record_field(record, "shared", 0) or 0)
    lds_total = km.group_segment_fixed_size + shared
    occ = estimate_occupancy(km, limits, num_warps, lds_total)
    v.stats.update({
        "code_object_version": info.code_object_version,
        "amdhsa_target": info.target,
        "e_flags": info.e_flags,
        "vgpr_count": km.vgpr_count, "agpr_count": km.agpr_count, "sgpr_count": km.sgpr_count,
        "vgpr_spill_count": km.vgpr_spill_count, "sgpr_spill_count": km.sgpr_spill_count,
        "private_segment_fixed_size": km.private_segment_fixed_size,
        "scratch_size": km.private_segment_fixed_size,
        "group_segment_fixed_size": km.group_segment_fixed_size, "lds_bytes": lds_total,
        "wavefront_size": km.wavefront_size, "kernarg_segment_size": km.kernarg_segment_size,
        "explicit_args": len(km.explicit_args), "hidden_args": len(km.args) - len(km.explicit_args),
        **occ,
    })

    ws = _record_field(record, "warp_size", None) or limits.warp_size
    if km.wavefront_size != int(ws):
        v.problems.append(f"wavefront size {km.wavefront_size}, the record says {ws}")

    # Arguments: the explicit metadata args against the recorded list.
    rec_args = [tuple(a) for a in (_record_field(record, "args", ()) or ())]
    try:
        layout, end = expected_kernarg_layout(rec_args)
    except CodeObjectError as e:
        v.problems.append(str(e))
        layout, end = [], 0
    explicit = km.explicit_args
    if len(explicit) != len(layout):
        v.problems.append(f"{len(explicit)} explicit kernel arguments in the code object, the record "
                          f"lists {len(layout)}")
    else:
        for (name, off, size), a in zip(layout, explicit):
            got = (a.get(".offset"), a.get(".size"))
            if got != (off, size):
                v.problems.append(f"argument {name}: offset/size {got[0]}/{got[1]} in the code object, "
                                  f"expected {off}/{size}")
                break
    if layout:
        if len(explicit) == len(km.args) and km.kernarg_segment_size != _roundup(end, km.kernarg_segment_align or 1):
            v.problems.append(f"kernarg segment is {km.kernarg_segment_size} bytes, the recorded "
                              f"arguments need {end}")
        elif km.kernarg_segment_size < end:
            v.problems.append(f"kernarg segment is {km.kernarg_segment_size} bytes, smaller than the "
                              f"{end} bytes the recorded arguments need")

    allow = dict(allow or {})

    def fail(kind: str, msg: str) -> None:
        v.resources.append((kind, msg))
        if kind in allow:
            v.allowed.append(f"{msg} (allowed: {allow[kind]})")
        else:
            v.problems.append(msg)

    if km.private_segment_fixed_size > 0 or km.uses_dynamic_stack:
        spilled = (km.vgpr_spill_count or km.sgpr_spill_count) and not km.uses_dynamic_stack
        fail("spills" if spilled else "scratch",
             f"uses {km.private_segment_fixed_size} bytes of scratch memory per lane"
             f"{' and a dynamic stack' if km.uses_dynamic_stack else ''} (VGPR spills: "
             f"{km.vgpr_spill_count}, SGPR spills: {km.sgpr_spill_count})")
    elif km.vgpr_spill_count > 0 and limits.vgpr_mode == "vgpr":
        fail("spills", f"spills {km.vgpr_spill_count} VGPRs")
    if lds_total > limits.lds_bytes:
        fail("lds", f"uses {lds_total} bytes of LDS ({km.group_segment_fixed_size} static + {shared} "
                    f"dynamic), {arch} has {limits.lds_bytes}")
    return v
