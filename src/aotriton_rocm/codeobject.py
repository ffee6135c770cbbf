"""Static validation of AMD GPU code objects (HSACO), read with the standard library.

Runtime-safe module: no triton, no pyelftools, no torch. AMD code objects
cannot be executed on the machines this project is built on, so every one we
ship is checked by reading it:

* the ELF header: ELF64 little-endian, ``e_machine`` EM_AMDGPU (224), OS ABI
  AMDGPU_HSA (64), ``EI_ABIVERSION`` (code object v4 = 2, v5 = 3, v6 = 4) and
  the processor in ``e_flags & EF_AMDGPU_MACH`` (0xff) against the intended arch;
* the kernel symbol and its kernel descriptor symbol ``<name>.kd``;
* the AMDGPU metadata note (``NT_AMDGPU_METADATA`` = 32, owner ``"AMDGPU"``), a
  MessagePack map decoded here: register counts, spills, private segment
  (scratch), group segment (LDS), wavefront size, kernarg segment size and
  the ``.args`` list, which must match the recorded argument list;
* an occupancy estimate (waves per SIMD), see :func:`estimate_occupancy`.

Entry points: :func:`inspect_code_object` (facts) and :func:`validate_kernel`
(facts + checks against a :class:`~aotriton_rocm.archive.KernelRecord`).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

__all__ = [
    "CodeObjectError",
    "MsgpackError",
    "unpackb",
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


# Validator findings a variant spec may waive (variants.toml ``allow``).
RESOURCE_KINDS = ("spills", "scratch", "lds")


class CodeObjectError(ValueError):
    """The bytes are not a well-formed AMDGPU code object."""


class MsgpackError(CodeObjectError):
    """Malformed MessagePack data."""


# -- MessagePack (decode only; the subset the AMDGPU metadata uses, plus the rest
#    of the format so a foreign producer cannot trip us) -----------------------

class _Reader:
    __slots__ = ("buf", "pos", "depth")

    def __init__(self, buf: bytes):
        self.buf = memoryview(buf)
        self.pos = 0
        self.depth = 0

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if n < 0 or end > len(self.buf):
            raise MsgpackError(f"msgpack: truncated at byte {self.pos} (needs {n} more bytes)")
        b = bytes(self.buf[self.pos:end])
        self.pos = end
        return b

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(">" + fmt, self.take(struct.calcsize(">" + fmt)))[0]


_MAX_DEPTH = 64


def _decode(r: _Reader) -> Any:
    t = r.take(1)[0]
    if t <= 0x7F:
        return t
    if t >= 0xE0:
        return t - 0x100
    if 0x80 <= t <= 0x8F:
        return _map(r, t & 0x0F)
    if 0x90 <= t <= 0x9F:
        return _array(r, t & 0x0F)
    if 0xA0 <= t <= 0xBF:
        return _str(r, t & 0x1F)
    if t == 0xC0:
        return None
    if t == 0xC2:
        return False
    if t == 0xC3:
        return True
    simple = {0xCC: "B", 0xCD: "H", 0xCE: "I", 0xCF: "Q", 0xD0: "b", 0xD1: "h", 0xD2: "i",
              0xD3: "q", 0xCA: "f", 0xCB: "d"}
    if t in simple:
        return r.unpack(simple[t])
    if t in (0xD9, 0xDA, 0xDB):
        return _str(r, r.unpack({0xD9: "B", 0xDA: "H", 0xDB: "I"}[t]))
    if t in (0xC4, 0xC5, 0xC6):
        return r.take(r.unpack({0xC4: "B", 0xC5: "H", 0xC6: "I"}[t]))
    if t in (0xDC, 0xDD):
        return _array(r, r.unpack("H" if t == 0xDC else "I"))
    if t in (0xDE, 0xDF):
        return _map(r, r.unpack("H" if t == 0xDE else "I"))
    if t in (0xD4, 0xD5, 0xD6, 0xD7, 0xD8):  # fixext 1/2/4/8/16
        n = 1 << (t - 0xD4)
        code = r.unpack("b")
        return ("ext", code, r.take(n))
    if t in (0xC7, 0xC8, 0xC9):
        n = r.unpack({0xC7: "B", 0xC8: "H", 0xC9: "I"}[t])
        code = r.unpack("b")
        return ("ext", code, r.take(n))
    raise MsgpackError(f"msgpack: invalid type byte 0x{t:02x} at byte {r.pos - 1}")


def _str(r: _Reader, n: int) -> str:
    raw = r.take(n)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise MsgpackError(f"msgpack: string at byte {r.pos - n} is not UTF-8") from None


def _array(r: _Reader, n: int) -> List[Any]:
    r.depth += 1
    if r.depth > _MAX_DEPTH:
        raise MsgpackError("msgpack: nesting too deep")
    if n > len(r.buf) - r.pos:  # every element takes at least a byte
        raise MsgpackError(f"msgpack: array of {n} items at byte {r.pos} is longer than the data")
    out = [_decode(r) for _ in range(n)]
    r.depth -= 1
    return out


def _map(r: _Reader, n: int) -> Dict[Any, Any]:
    r.depth += 1
    if r.depth > _MAX_DEPTH:
        raise MsgpackError("msgpack: nesting too deep")
    if 2 * n > len(r.buf) - r.pos:
        raise MsgpackError(f"msgpack: map of {n} entries at byte {r.pos} is longer than the data")
    out: Dict[Any, Any] = {}
    for _ in range(n):
        k = _decode(r)
        if isinstance(k, (list, dict)):
            raise MsgpackError("msgpack: unhashable map key")
        out[k] = _decode(r)
    r.depth -= 1
    return out


def unpackb(data: bytes, *, allow_trailing: bool = False) -> Any:
    """Decode one MessagePack object from ``data`` (str for str, bytes for bin,
    ``("ext", code, bytes)`` for ext types)."""
    r = _Reader(bytes(data))
    obj = _decode(r)
    if not allow_trailing and r.pos != len(r.buf):
        # NT_AMDGPU_METADATA descriptors may be zero-padded to 4 bytes.
        if any(r.buf[r.pos:]):
            raise MsgpackError(f"msgpack: {len(r.buf) - r.pos} trailing bytes after the object")
    return obj


# -- ELF -------------------------------------------------------------------

@dataclass(frozen=True)
class ElfSymbol:
    name: str
    value: int
    size: int
    type: int  # STT_*: 1 object, 2 func, 10 amdgpu hsa kernel (legacy)
    binding: int
    shndx: int


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


_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")  # 64 bytes
_SHDR = struct.Struct("<IIQQQQIIQQ")  # 64 bytes
_SYM = struct.Struct("<IBBHQQ")  # 24 bytes
SHT_SYMTAB, SHT_NOTE, SHT_DYNSYM = 2, 7, 11


def _cstr(blob: bytes, off: int) -> str:
    if not 0 <= off < len(blob):
        raise CodeObjectError(f"string offset {off} outside its string table")
    end = blob.find(b"\0", off)
    if end < 0:
        raise CodeObjectError("unterminated string in a string table")
    return blob[off:end].decode("utf-8", "replace")


def _section_bytes(data: bytes, off: int, size: int, what: str) -> bytes:
    if off < 0 or size < 0 or off + size > len(data):
        raise CodeObjectError(f"{what} (offset {off}, {size} bytes) runs past the end of the "
                              f"{len(data)}-byte file: truncated or corrupted ELF")
    return data[off:off + size]


def _target_feature(e_flags: int, shift: int) -> str:
    # v4+: EF_AMDGPU_FEATURE_{XNACK,SRAMECC}_V4 two-bit fields at 0x300 / 0xc00
    v = (e_flags >> shift) & 0x3
    return {0: "unsupported", 1: "any", 2: "off", 3: "on"}[v]


def _notes(blob: bytes) -> List[Tuple[str, int, bytes]]:
    out = []
    pos = 0
    while pos + 12 <= len(blob):
        namesz, descsz, ntype = struct.unpack_from("<III", blob, pos)
        pos += 12
        name_end = pos + ((namesz + 3) & ~3)
        desc_end = name_end + ((descsz + 3) & ~3)
        if pos + namesz > len(blob) or name_end + descsz > len(blob):
            raise CodeObjectError("note entry runs past its section: corrupted .note")
        name = blob[pos:pos + namesz].rstrip(b"\0").decode("utf-8", "replace")
        out.append((name, ntype, blob[name_end:name_end + descsz]))
        pos = desc_end
    return out


def _int(d: Mapping[str, Any], key: str, default: int = 0) -> int:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int):
        raise CodeObjectError(f"metadata {key} is {v!r}, not an integer")
    return v


def inspect_code_object(data: bytes) -> CodeObjectInfo:
    """Parse an AMDGPU HSACO; raises :class:`CodeObjectError` naming what is wrong."""
    data = bytes(data)
    if len(data) < _EHDR.size or data[:4] != b"\x7fELF":
        raise CodeObjectError("not an ELF file (bad magic or shorter than an ELF header)")
    (ident, e_type, e_machine, _ver, _entry, _phoff, e_shoff, e_flags, _ehsize, _phentsize,
     _phnum, e_shentsize, e_shnum, e_shstrndx) = _EHDR.unpack_from(data, 0)
    if ident[4] != 2 or ident[5] != 1:
        raise CodeObjectError(f"not an ELF64 little-endian file (class {ident[4]}, data {ident[5]})")
    if e_machine != EM_AMDGPU:
        raise CodeObjectError(f"ELF machine is {e_machine}, not EM_AMDGPU ({EM_AMDGPU}): "
                              f"not an AMD GPU code object")
    if ident[7] != ELFOSABI_AMDGPU_HSA:
        raise CodeObjectError(f"ELF OS ABI is {ident[7]}, not AMDGPU_HSA ({ELFOSABI_AMDGPU_HSA})")
    abi = ident[8]
    if e_shentsize != _SHDR.size or e_shnum == 0:
        raise CodeObjectError(f"bad section header table (entry size {e_shentsize}, {e_shnum} entries)")
    table = _section_bytes(data, e_shoff, e_shnum * _SHDR.size, "section header table")
    shdrs = [_SHDR.unpack_from(table, i * _SHDR.size) for i in range(e_shnum)]
    if not 0 <= e_shstrndx < e_shnum:
        raise CodeObjectError(f"section name table index {e_shstrndx} out of range")
    sh = shdrs[e_shstrndx]
    shstr = _section_bytes(data, sh[4], sh[5], "section name table")

    symbols: Dict[str, ElfSymbol] = {}
    notes: List[Tuple[str, int, bytes]] = []
    for s in shdrs:
        sh_name, sh_type, _fl, _addr, off, size, link, _info, _align, entsize = s
        if sh_type in (SHT_SYMTAB, SHT_DYNSYM):
            name = _cstr(shstr, sh_name)
            if entsize != _SYM.size:
                raise CodeObjectError(f"symbol table {name} has entry size {entsize}")
            if not 0 <= link < e_shnum:
                raise CodeObjectError(f"symbol table {name} links to section {link}: out of range")
            strtab = _section_bytes(data, shdrs[link][4], shdrs[link][5], f"string table of {name}")
            body = _section_bytes(data, off, size, f"symbol table {name}")
            for i in range(1, size // _SYM.size):
                st_name, st_info, _other, shndx, value, ssize = _SYM.unpack_from(body, i * _SYM.size)
                nm = _cstr(strtab, st_name)
                if nm and nm not in symbols:
                    symbols[nm] = ElfSymbol(nm, value, ssize, st_info & 0xF, st_info >> 4, shndx)
        elif sh_type == SHT_NOTE:
            notes.extend(_notes(_section_bytes(data, off, size, "note section")))

    md_blobs = [d for n, t, d in notes if n == "AMDGPU" and t == NT_AMDGPU_METADATA]
    if not md_blobs:
        raise CodeObjectError("no NT_AMDGPU_METADATA note (owner AMDGPU): not a code object v3+ "
                              "or the note section is missing")
    md = unpackb(md_blobs[0])
    if not isinstance(md, dict) or not isinstance(md.get("amdhsa.kernels"), list):
        raise CodeObjectError("AMDGPU metadata has no amdhsa.kernels list")
    kernels = []
    for k in md["amdhsa.kernels"]:
        if not isinstance(k, dict):
            raise CodeObjectError("AMDGPU metadata kernel entry is not a map")
        args = k.get(".args", [])
        if not isinstance(args, list) or not all(isinstance(a, dict) for a in args):
            raise CodeObjectError(f"kernel {k.get('.name')!r}: .args is not a list of maps")
        kernels.append(KernelMeta(
            name=str(k.get(".name", "")), symbol=str(k.get(".symbol", "")),
            sgpr_count=_int(k, ".sgpr_count"), vgpr_count=_int(k, ".vgpr_count"),
            agpr_count=_int(k, ".agpr_count"), vgpr_spill_count=_int(k, ".vgpr_spill_count"),
            sgpr_spill_count=_int(k, ".sgpr_spill_count"),
            private_segment_fixed_size=_int(k, ".private_segment_fixed_size"),
            group_segment_fixed_size=_int(k, ".group_segment_fixed_size"),
            wavefront_size=_int(k, ".wavefront_size"),
            kernarg_segment_size=_int(k, ".kernarg_segment_size"),
            kernarg_segment_align=_int(k, ".kernarg_segment_align", 8),
            uses_dynamic_stack=bool(k.get(".uses_dynamic_stack", False)), args=args, raw=k))
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


# -- occupancy -------------------------------------------------------------

@dataclass(frozen=True)
class ArchLimits:
    """What the validator needs to know about one arch (from ci/targets.toml)."""

    name: str
    mach: Optional[int] = None
    lds_bytes: int = 65536
    warp_size: int = 64
    vgpr_file: int = 512
    vgpr_mode: str = "unified"
    vgpr_granule: int = 8
    max_waves: int = 8
    simds_per_cu: int = 4

    @classmethod
    def from_spec(cls, spec: Any) -> "ArchLimits":
        """From a :class:`~aotriton_rocm.tooling.targets.ArchSpec` (duck-typed)."""
        kw = {"name": spec.name, "mach": getattr(spec, "mach", None), "warp_size": spec.warp_size}
        for k in ("lds_bytes", "vgpr_file", "vgpr_mode", "vgpr_granule", "max_waves", "simds_per_cu"):
            v = getattr(spec, k, None)
            if v is not None:
                kw[k] = v
        return cls(**kw)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ArchLimits":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


def _roundup(x: int, g: int) -> int:
    return (x + g - 1) // g * g


def estimate_occupancy(km: KernelMeta, limits: ArchLimits, num_warps: int,
                       lds_bytes: Optional[int] = None) -> Dict[str, int]:
    """Waves per SIMD, the smaller of the register and the LDS limit.

    Registers (per lane): ``regs`` = the wave's VGPR allocation, rounded up to
    the arch's granule; waves = min(max_waves, vgpr_file // regs).
      * unified (gfx90a/gfx942/gfx950): 512 VGPR+AGPR per lane; the metadata's
        .vgpr_count is already the unified total (arch VGPRs aligned to 4 plus
        AGPRs), granule 8, at most 8 waves.
      * split (gfx908): 256 arch VGPRs and 256 AGPRs, allocated alike, so the
        larger of .vgpr_count and .agpr_count counts; granule 4, at most 10 waves.
      * vgpr (RDNA wave32): .vgpr_count against the wave32 register file (1536
        or 1024 entries), granule 24/16, at most 16 waves.
    This reproduces LLVM's own "; Occupancy:" figure for every flash kernel
    compiled for gfx908/gfx942 (checked in tests/test_codeobject.py).
    LDS: ``lds_bytes`` (default: .group_segment_fixed_size; triton allocates
    its LDS dynamically at launch, so pass static + dynamic) per workgroup;
    workgroups per CU = lds_per_cu // lds_bytes, each putting
    ceil(num_warps / simds_per_cu) waves on each SIMD. SGPRs are not limiting
    for these kernels (<= 106 per wave) and are ignored.
    """
    if limits.vgpr_mode == "split":
        used = max(km.vgpr_count, km.agpr_count)
    else:
        used = km.vgpr_count
    regs = _roundup(max(used, 1), limits.vgpr_granule)
    by_vgpr = min(limits.max_waves, limits.vgpr_file // regs)
    per_simd = max(1, -(-max(num_warps, 1) // limits.simds_per_cu))
    lds = km.group_segment_fixed_size if lds_bytes is None else lds_bytes
    by_lds = (limits.lds_bytes // lds) * per_simd if lds > 0 else limits.max_waves
    by_lds = min(by_lds, limits.max_waves)
    return {"occupancy": max(0, min(by_vgpr, by_lds)), "occupancy_vgpr": by_vgpr,
            "occupancy_lds": by_lds, "vgpr_alloc": regs}


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
