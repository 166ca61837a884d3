"""The code object's `.text` section (address and bytes) and its kernel symbols, from the ELF64 headers."""

from __future__ import annotations

import struct


def sections(elf: bytes) -> dict[str, tuple[int, int, int]]:
    """name -> (virtual address, file offset, size)."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2:
        raise ValueError("not an ELF64 code object")
    (shoff,) = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    heads = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    strtab = heads[shstrndx][4]
    out = {}
    for h in heads:
        end = elf.index(b"\0", strtab + h[0])
        out[elf[strtab + h[0] : end].decode()] = (h[3], h[4], h[5])
    return out


def text(elf: bytes) -> tuple[int, bytes]:
    """(address, bytes) of `.text`."""
    found = sections(elf).get(".text")
    if found is None:
        raise ValueError("the code object has no .text section")
    addr, off, size = found
    return addr, elf[off : off + size]
