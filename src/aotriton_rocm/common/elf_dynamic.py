"""The dynamic section of a shared library: its soname and the libraries it
needs (``DT_SONAME``, ``DT_NEEDED``), read from the file.

Standard library only (the runtime's commands read torch's libraries with it;
the build tooling has pyelftools for the rest of the format). 64-bit ELF, either
byte order; section headers are required, as every linker writes them.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

SHT_DYNAMIC = 6
DT_NULL, DT_NEEDED, DT_SONAME = 0, 1, 14


class ElfError(ValueError):
    pass


@dataclass(frozen=True)
class DynamicInfo:
    soname: Optional[str]
    needed: List[str]


def read_dynamic(path: "str | Path") -> DynamicInfo:
    data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF":
        raise ElfError(f"{path} is not an ELF file")
    if data[4] != 2:
        raise ElfError(f"{path} is not a 64-bit ELF file")
    order = {1: "<", 2: ">"}.get(data[5])
    if order is None:
        raise ElfError(f"{path}: unknown ELF byte order {data[5]}")
    try:
        shoff, = struct.unpack_from(order + "Q", data, 0x28)
        shentsize, shnum = struct.unpack_from(order + "HH", data, 0x3A)
        sections = [struct.unpack_from(order + "IIQQQQIIQQ", data, shoff + i * shentsize)
                    for i in range(shnum)]
        dynamic = next((s for s in sections if s[1] == SHT_DYNAMIC), None)
        if dynamic is None:
            return DynamicInfo(None, [])
        _, _, _, _, offset, size, link, _, _, entsize = dynamic
        strtab_offset = sections[link][4]

        def string(at: int) -> str:
            start = strtab_offset + at
            return data[start:data.index(b"\0", start)].decode("utf-8", "replace")

        soname, needed = None, []
        for at in range(offset, offset + size, entsize or 16):
            tag, value = struct.unpack_from(order + "qQ", data, at)
            if tag == DT_NULL:
                break
            if tag == DT_NEEDED:
                needed.append(string(value))
            elif tag == DT_SONAME:
                soname = string(value)
    except (struct.error, IndexError, ValueError) as e:
        raise ElfError(f"{path}: truncated or malformed ELF file ({e})") from e
    return DynamicInfo(soname, needed)
