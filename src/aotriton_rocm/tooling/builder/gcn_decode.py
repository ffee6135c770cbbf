"""The instructions of a CDNA code object's machine code, decoded far enough
to find its loops and count what one iteration issues.

Build-time only. Triton's kernels come with their amdgcn text, hand-written
assembly code objects (aiter's FMHA v3) do not; this reads the ``.text``
bytes of any gfx9-family code object (gfx908, gfx90a, gfx942, gfx950) so
that both are counted by one reader: each instruction's encoding family,
its length (32 or 64 bits, plus a 32-bit literal, DPP or SDWA word) and,
for the families the report counts, its class. The result is rendered as
a minimal assembly text (one mnemonic per line, a label at every branch
target) that :mod:`amdgcn` cuts into blocks and loops exactly as it does
triton's own text; tests/tooling/builder/test_reference.py checks both give the same hot
loop for the same code object.

The encodings are those of AMD's "Vega"/CDNA3 ISA guides (chapter 12,
"Microcode formats"); opcode numbers were checked against LLVM's
assembler (``llvm-mc -show-encoding``) for gfx90a and, for the gfx950-only
MFMA and transposing LDS reads, against triton's own gfx950 text.
"""
from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from .codeobject import CodeObjectError

__all__ = ["Instr", "MFMA_SHAPES", "mfma_table", "decode", "kernel_code", "code_object_text"]

# VOP3P opcodes (bits 22:16) of the matrix instructions: name, M, N, K, blocks.
# The f32/f16 ones are shared by gfx908..gfx950; gfx940 renumbered the bf16
# ones, and gfx950 added the K-doubled f16/bf16 shapes.
_MFMA_COMMON: Dict[int, Tuple[str, int, int, int, int]] = {
    0x40: ("v_mfma_f32_32x32x1_2b_f32", 32, 32, 1, 2), 0x41: ("v_mfma_f32_16x16x1_4b_f32", 16, 16, 1, 4),
    0x42: ("v_mfma_f32_4x4x1_16b_f32", 4, 4, 1, 16), 0x44: ("v_mfma_f32_32x32x2_f32", 32, 32, 2, 1),
    0x45: ("v_mfma_f32_16x16x4_f32", 16, 16, 4, 1), 0x48: ("v_mfma_f32_32x32x4_2b_f16", 32, 32, 4, 2),
    0x49: ("v_mfma_f32_16x16x4_4b_f16", 16, 16, 4, 4), 0x4A: ("v_mfma_f32_4x4x4_16b_f16", 4, 4, 4, 16),
    0x4C: ("v_mfma_f32_32x32x8_f16", 32, 32, 8, 1), 0x4D: ("v_mfma_f32_16x16x16_f16", 16, 16, 16, 1),
}
_MFMA_GFX90A = {  # gfx908/gfx90a names: v_mfma_f32_32x32x8bf16_1k, ...
    0x63: ("v_mfma_f32_32x32x4_2b_bf16", 32, 32, 4, 2), 0x64: ("v_mfma_f32_16x16x4_4b_bf16", 16, 16, 4, 4),
    0x66: ("v_mfma_f32_32x32x8_bf16", 32, 32, 8, 1), 0x67: ("v_mfma_f32_16x16x16_bf16", 16, 16, 16, 1),
}
_MFMA_GFX940 = {
    0x5D: ("v_mfma_f32_32x32x4_2b_bf16", 32, 32, 4, 2), 0x5E: ("v_mfma_f32_16x16x4_4b_bf16", 16, 16, 4, 4),
    0x60: ("v_mfma_f32_32x32x8_bf16", 32, 32, 8, 1), 0x61: ("v_mfma_f32_16x16x16_bf16", 16, 16, 16, 1),
}
_MFMA_GFX950 = {
    0x54: ("v_mfma_f32_16x16x32_f16", 16, 16, 32, 1), 0x55: ("v_mfma_f32_32x32x16_f16", 32, 32, 16, 1),
    0x35: ("v_mfma_f32_16x16x32_bf16", 16, 16, 32, 1), 0x37: ("v_mfma_f32_32x32x16_bf16", 32, 32, 16, 1),
}


def mfma_table(arch: str) -> Dict[int, Tuple[str, int, int, int, int]]:
    """The matrix opcodes of ``arch`` (a gfx9 CDNA arch)."""
    if arch in ("gfx908", "gfx90a"):
        return {**_MFMA_COMMON, **_MFMA_GFX90A}
    if arch == "gfx950":
        return {**_MFMA_COMMON, **_MFMA_GFX940, **_MFMA_GFX950}
    if arch in ("gfx940", "gfx941", "gfx942"):
        return {**_MFMA_COMMON, **_MFMA_GFX940}
    raise CodeObjectError(f"{arch}: the decoder reads CDNA (gfx908, gfx90a, gfx942, gfx950) code only")


# name -> (M, N, K, blocks) of every matrix instruction the decoder names
MFMA_SHAPES: Dict[str, Tuple[int, int, int, int]] = {
    v[0]: v[1:] for t in (_MFMA_COMMON, _MFMA_GFX90A, _MFMA_GFX940, _MFMA_GFX950) for v in t.values()}
_ACCVGPR = {0x58: "v_accvgpr_read_b32", 0x59: "v_accvgpr_write_b32"}

# DS opcodes (bits 24:17) -> bytes per lane, reads and writes (what triton's
# text names ds_read*/ds_write*)
_DS_READS = {0x36: 4, 0x37: 8, 0x38: 8, 0x39: 1, 0x3A: 1, 0x3B: 2, 0x3C: 2,
             0x56: 1, 0x57: 1, 0x58: 1, 0x59: 1, 0x5A: 2, 0x5B: 2,
             0x76: 8, 0x77: 16, 0x78: 16, 0xFE: 12, 0xFF: 16,
             0xE0: 8, 0xE1: 8, 0xE2: 8, 0xE3: 12}  # gfx950 ds_read_b64_tr_b4/b8/b16, b96_tr_b6
_DS_WRITES = {0x0D: 4, 0x0E: 8, 0x0F: 8, 0x1E: 1, 0x1F: 2, 0x4D: 8, 0x4E: 16, 0x4F: 16,
              0x54: 1, 0x55: 2, 0xDE: 12, 0xDF: 16}
# MUBUF/FLAT load opcodes (bits 24:18) -> bytes per lane
_VMEM_LOADS = {0x00: 4, 0x01: 8, 0x02: 12, 0x03: 16, 0x08: 2, 0x09: 4, 0x0A: 6, 0x0B: 8,
               0x10: 1, 0x11: 1, 0x12: 2, 0x13: 2, 0x14: 4, 0x15: 8, 0x16: 12, 0x17: 16,
               0x20: 1, 0x21: 1, 0x22: 1, 0x23: 1, 0x24: 2, 0x25: 2}

# SOPP opcodes (bits 22:16)
_SOPP = {0: "s_nop", 1: "s_endpgm", 2: "s_branch", 4: "s_cbranch_scc0", 5: "s_cbranch_scc1",
         6: "s_cbranch_vccz", 7: "s_cbranch_vccnz", 8: "s_cbranch_execz", 9: "s_cbranch_execnz",
         10: "s_barrier", 12: "s_waitcnt", 14: "s_sleep", 15: "s_setprio", 18: "s_trap",
         23: "s_cbranch_cdbgsys", 24: "s_cbranch_cdbguser", 25: "s_cbranch_cdbgsys_or_user",
         26: "s_cbranch_cdbgsys_and_user"}
# VOP1 transcendental opcodes (quarter rate): exp, log, rcp, rsq, sqrt, sin, cos (f32, f64, f16)
_TRANS = set(range(0x20, 0x2B)) | {0x3D, 0x3E, 0x3F, 0x40, 0x41, 0x49, 0x4A, 0x4B, 0x4C}
_LITERAL, _SDWA, _DPP = 0xFF, 0xF9, 0xFA


@dataclass(frozen=True)
class Instr:
    """One decoded instruction: byte offset in the kernel, length, a
    mnemonic (exact for the classes the report counts, a family name
    otherwise: ``v_valu``, ``v_trans``, ``s_alu``, ``s_load``, ...), for a
    branch the offset it jumps to, for an LDS or vector-memory access the
    bytes per lane it moves."""

    offset: int
    size: int
    mnemonic: str
    target: Optional[int] = None
    lane_bytes: int = 0


def _vector_short(w: int) -> Tuple[str, int]:
    """VOP1, VOPC, VOP2 (bit 31 clear): mnemonic class and length."""
    src0 = w & 0x1FF
    extra = 4 if src0 in (_LITERAL, _SDWA, _DPP) else 0
    if (w >> 25) == 0x3F:  # VOP1
        op = (w >> 9) & 0xFF
        if op == 0x52:
            return "v_accvgpr_mov_b32", 4 + extra
        return ("v_trans" if op in _TRANS else "v_valu"), 4 + extra
    if (w >> 25) == 0x3E:  # VOPC
        return "v_cmp", 4 + extra
    op = (w >> 25) & 0x3F  # VOP2; madmk/madak (f32, f16) always carry a literal
    return "v_valu", 4 + (4 if op in (0x17, 0x18, 0x24, 0x25) else extra)


def _scalar(w: int, pc: int) -> Tuple[str, int, Optional[int]]:
    """SOP1, SOPC, SOPP, SOPK, SOP2 (bits 31:30 = 10)."""
    top9 = w >> 23
    if top9 == 0x17F:  # SOPP
        op = (w >> 16) & 0x7F
        name = _SOPP.get(op, "s_sopp")
        if name == "s_branch" or name.startswith("s_cbranch"):
            simm = w & 0xFFFF
            simm -= 0x10000 if simm & 0x8000 else 0
            return name, 4, pc + 4 + 4 * simm
        return name, 4, None
    if top9 == 0x17D:  # SOP1
        op = (w >> 8) & 0xFF
        name = {0x1C: "s_getpc_b64", 0x1D: "s_setpc_b64", 0x1E: "s_swappc_b64"}.get(op, "s_alu")
        return name, 4 + (4 if (w & 0xFF) == _LITERAL else 0), None
    if top9 == 0x17E:  # SOPC
        lit = _LITERAL in (w & 0xFF, (w >> 8) & 0xFF)
        return "s_cmp", 4 + (4 if lit else 0), None
    if (w >> 28) == 0xB:  # SOPK; s_setreg_imm32_b32 (op 20) carries a literal
        return "s_alu", 4 + (4 if ((w >> 23) & 0x1F) == 20 else 0), None
    lit = _LITERAL in (w & 0xFF, (w >> 8) & 0xFF)  # SOP2
    return "s_alu", 4 + (4 if lit else 0), None


def _vop3p(op: int, mfma: Dict[int, Tuple[str, int, int, int, int]]) -> str:
    if op in mfma:
        return mfma[op][0]
    if op in _ACCVGPR:
        return _ACCVGPR[op]
    if 0x40 <= op <= 0x7F:
        return f"v_mfma_op{op:#04x}"  # a matrix op missing from the table
    return "v_pk_valu"


def _long(w: int, mfma: Dict[int, Tuple[str, int, int, int, int]]) -> Tuple[str, int]:
    """The 64-bit families, by bits 31:26: mnemonic class, bytes per lane."""
    fam = w >> 26
    if fam == 0x34:  # VOP3 / VOP3P
        if (w >> 23) == 0x1A7:
            return _vop3p((w >> 16) & 0x7F, mfma), 0
        op = (w >> 16) & 0x3FF
        return ("v_trans" if op - 0x140 in _TRANS else "v_cmp" if op < 0x100 else "v_valu"), 0
    if fam == 0x36:  # DS
        op = (w >> 17) & 0xFF
        if op in _DS_READS:
            return "ds_read", _DS_READS[op]
        return ("ds_write", _DS_WRITES[op]) if op in _DS_WRITES else ("ds_other", 0)
    if fam == 0x37:  # FLAT / SCRATCH / GLOBAL
        op = (w >> 18) & 0x7F
        seg = {0: "flat", 1: "scratch", 2: "global"}.get((w >> 14) & 3, "flat")
        if 0x10 <= op <= 0x17 or 0x20 <= op <= 0x25:
            return f"{seg}_load", _VMEM_LOADS[op]
        return (f"{seg}_store" if 0x18 <= op <= 0x1F else f"{seg}_atomic"), 0
    if fam == 0x38:  # MUBUF
        op = (w >> 18) & 0x7F
        if op in _VMEM_LOADS:
            return "buffer_load", _VMEM_LOADS[op]
        return ("buffer_store" if op <= 0x1F else "buffer_atomic"), 0
    if fam == 0x3A:  # MTBUF
        op = (w >> 15) & 0xF
        return ("buffer_load", 4 * (op % 4 + 1)) if op <= 3 else ("buffer_store", 0)
    if fam == 0x30:  # SMEM
        return ("s_load" if ((w >> 18) & 0xFF) < 0x10 else "s_mem"), 0
    if fam in (0x31, 0x3C):  # EXP, MIMG
        return "v_other", 0
    raise CodeObjectError(f"undecodable instruction word {w:#010x}")


def decode(code: bytes, arch: str, start: int = 0, end: Optional[int] = None) -> List[Instr]:
    """The instructions of ``code[start:end]`` for ``arch`` (offsets relative to ``start``)."""
    mfma = mfma_table(arch)
    end = len(code) if end is None else end
    out: List[Instr] = []
    pc = start
    while pc + 4 <= end:
        (w,) = struct.unpack_from("<I", code, pc)
        rel = pc - start
        target, lane_bytes = None, 0
        if (w >> 31) == 0:
            name, size = _vector_short(w)
        elif (w >> 30) == 0b10:
            name, size, abs_target = _scalar(w, pc)
            target = None if abs_target is None else abs_target - start
        elif (w >> 26) == 0x35:  # VINTRP (32-bit)
            name, size = "v_interp", 4
        else:
            (name, lane_bytes), size = _long(w, mfma), 8
        if pc + size > end:
            raise CodeObjectError(f"instruction at {rel:#x} runs past the end of the code")
        out.append(Instr(rel, size, name, target, lane_bytes))
        pc += size
    return out


def kernel_code(data: bytes, symbol: str) -> bytes:
    """The machine code of kernel ``symbol`` (its STT_FUNC symbol's bytes, or
    to the end of its section when the symbol has no size)."""
    try:
        elf = ELFFile(io.BytesIO(bytes(data)))
        for sec in elf.iter_sections():
            if not isinstance(sec, SymbolTableSection):
                continue
            for sym in sec.iter_symbols():
                if sym.name != symbol or sym["st_info"]["type"] != "STT_FUNC":
                    continue
                text = elf.get_section(sym["st_shndx"])
                begin = sym["st_value"] - text["sh_addr"]
                size = sym["st_size"] or text["sh_size"] - begin
                return text.data()[begin:begin + size]
    except Exception as e:  # pyelftools raises several unrelated types on bad input
        raise CodeObjectError(f"cannot read the machine code of {symbol!r}: {e}") from None
    raise CodeObjectError(f"no function symbol {symbol!r} in the code object")


def code_object_text(data: bytes, symbol: str, arch: str) -> str:
    """Kernel ``symbol`` as a minimal assembly text for :func:`amdgcn.find_loops`:
    a label ``L<offset>`` at every branch target, one mnemonic per line (an
    LDS or memory access with ``; <bytes per lane>``)."""
    instrs = decode(kernel_code(data, symbol), arch)
    targets = {i.target for i in instrs if i.target is not None}
    lines = []
    for i in instrs:
        if i.offset in targets:
            lines.append(f"L{i.offset:x}:")
        if i.target is not None:
            lines.append(f"{i.mnemonic} L{i.target:x}")
        else:
            lines.append(i.mnemonic + (f" ; {i.lane_bytes}" if i.lane_bytes else ""))
    return "\n".join(lines) + "\n"
