"""AMDGPU code objects built in-process: llvmlite's LLVM optimizes the IR and emits a relocatable object, and a small
linker here lays it out as the loadable code object (no opt, llc or ld.lld process).

llvmlite bundles a recent LLVM (22 with llvmlite 0.50) that knows gfx950, which Debian's LLVM 19 does not. The
renderer asks for code object v5 (the `amdhsa_code_object_version` module flag); the compiler writes the kernel
descriptor (`<kernel>.kd` in .rodata), the metadata note and the code. What is left to a linker is placing the
sections and resolving the descriptor's R_AMDGPU_REL64 to the code (plus the REL32_LO/HI pairs of constant tables).

The linked file is an ELF64 ET_DYN with one PT_LOAD (file offset = virtual address, the code 256-byte aligned), the
PT_NOTE, and the section headers and .symtab that codeobj.parse_code_object and load_image read. It has no .dynamic
or .dynsym: ROCr's loader would want ld.lld's output (the external path in codeobj.py), the driver here loads the
image itself. Relocation numbers and semantics: LLVM AMDGPUUsage, "Relocation Records".
"""

from __future__ import annotations

import functools
import struct

# R_AMDGPU_*: (size in bytes, pc-relative, which 32-bit half: 0 low, 1 high, None whole)
RELOCS = {1: (4, False, 0), 2: (4, False, 1), 3: (8, False, None), 4: (4, True, None), 5: (8, True, None)}
RELOCS |= {6: (4, False, None), 10: (4, True, 0), 11: (4, True, 1)}
SHF_ALLOC, SHF_EXECINSTR = 0x2, 0x4
SHT_NOBITS, SHT_RELA, SHT_SYMTAB, SHT_NOTE = 8, 4, 2, 7
SHN_ABS = 0xFFF1
CODE_OBJECT_V5 = 500


class LinkError(RuntimeError):
    """The relocatable object uses something this linker does not handle (named in the message)."""


@functools.cache
def _llvm():
    import llvmlite.binding as llvm

    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    return llvm


def available() -> bool:
    """llvmlite is installed and its LLVM has the amdgcn target."""
    try:
        _llvm().Target.from_triple("amdgcn-amd-amdhsa")
    except (ImportError, RuntimeError):
        return False
    return True


def llvm_version() -> tuple[int, ...]:
    return tuple(_llvm().llvm_version_info)


@functools.cache
def _target_machine(target: str):
    llvm = _llvm()
    return llvm.Target.from_triple("amdgcn-amd-amdhsa").create_target_machine(cpu=target, opt=2, reloc="pic")


def _optimized(ir: str, target: str):
    llvm, tm = _llvm(), _target_machine(target)
    mod = llvm.parse_assembly(ir)
    mod.triple, mod.data_layout = "amdgcn-amd-amdhsa", str(tm.target_data)
    mod.verify()
    builder = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=2))
    builder.getModulePassManager().run(mod, builder)
    return mod


def compile_object(ir: str, target: str) -> bytes:
    """LLVM IR -> O2 -> a relocatable ELF object for `target` (raises RuntimeError with LLVM's message on bad IR)."""
    return _target_machine(target).emit_object(_optimized(ir, target))


def assembly_and_object(ir: str, target: str) -> tuple[str, bytes]:
    """The assembly LLVM prints for the optimized module and the object it emits for the same module (each from its
    own copy, since code generation changes the module): the decoder's reference where no disassembler knows target."""
    llvm, tm, opt = _llvm(), _target_machine(target), str(_optimized(ir, target))
    return tm.emit_assembly(llvm.parse_assembly(opt)), tm.emit_object(llvm.parse_assembly(opt))


def _sections(obj: bytes) -> list[tuple]:
    (shoff,) = struct.unpack_from("<Q", obj, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", obj, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", obj, shoff + i * shentsize) for i in range(shnum)]
    names = sections[shstrndx][4]
    return [(obj[names + s[0] : obj.index(b"\0", names + s[0])].decode(), *s) for s in sections]


def _align(n: int, a: int) -> int:
    return -(-n // max(a, 1)) * max(a, 1)


def link(obj: bytes) -> bytes:
    """One relocatable AMDGPU object -> a loadable code object (see the module docstring)."""
    if obj[:4] != b"\x7fELF" or obj[4] != 2 or struct.unpack_from("<H", obj, 0x10)[0] != 1:
        raise LinkError("not a relocatable ELF64 object")
    secs = _sections(obj)
    # allocated sections: read-only ones first, the code after them (as ld.lld orders them), each at its alignment
    alloc = [i for i, s in enumerate(secs) if s[3] & SHF_ALLOC and s[6]]
    alloc.sort(key=lambda i: (bool(secs[i][3] & SHF_EXECINSTR), i))
    header = 64 + 2 * 56
    addr, placed = header, {}
    for i in alloc:
        align = 256 if secs[i][3] & SHF_EXECINSTR else secs[i][9]
        addr = _align(addr, align)
        placed[i] = addr
        addr += secs[i][6]
    image = bytearray(addr)
    for i, base in placed.items():
        if secs[i][2] != SHT_NOBITS:
            image[base : base + secs[i][6]] = obj[secs[i][5] : secs[i][5] + secs[i][6]]
    symtab = next((s for s in secs if s[2] == SHT_SYMTAB), None)
    if symtab is None:
        raise LinkError("the object has no symbol table")
    syms = [struct.unpack_from("<IBBHQQ", obj, symtab[5] + o) for o in range(0, symtab[6], 24)]
    strtab = secs[symtab[7]]
    sym_name = lambda n: obj[strtab[5] + n : obj.index(b"\0", strtab[5] + n)].decode()  # noqa: E731

    def value(k: int) -> int:
        name, _, _, shndx, v, _ = syms[k]
        if shndx == SHN_ABS:
            return v
        if shndx not in placed:
            raise LinkError(f"symbol {sym_name(name)!r} is undefined or in a section that is not loaded")
        return placed[shndx] + v

    for s in secs:
        if s[2] != SHT_RELA or s[8] not in placed:
            continue
        for o in range(0, s[6], 24):
            where, info, addend = struct.unpack_from("<QQq", obj, s[5] + o)
            kind, p = info & 0xFFFFFFFF, placed[s[8]] + where
            if kind not in RELOCS:
                raise LinkError(f"relocation type {kind} (R_AMDGPU_*) at {s[0]}+{where:#x} is not handled")
            size, pcrel, half = RELOCS[kind]
            v = value(info >> 32) + addend - (p if pcrel else 0)
            v = v & 0xFFFFFFFF if half == 0 else v >> 32 if half == 1 else v
            struct.pack_into("<q" if size == 8 else "<I", image, p, v if size == 8 else v & 0xFFFFFFFF)
    return _write_elf(obj, secs, placed, bytes(image), syms, symtab, strtab)


def _write_elf(obj, secs, placed, image, syms, symtab, strtab) -> bytes:
    """ELF header + PT_LOAD/PT_NOTE over the image, then .symtab, .strtab, .shstrtab and the section headers."""
    new_index = {old: k + 1 for k, old in enumerate(placed)}
    sym_bytes = b"".join(
        struct.pack(
            "<IBBHQQ",
            n,
            info,
            other,
            new_index.get(shndx, shndx if shndx >= 0xFF00 else 0),
            v + placed[shndx] if shndx in placed else v,
            size,
        )
        for n, info, other, shndx, v, size in syms
    )
    str_bytes = obj[strtab[5] : strtab[5] + strtab[6]]
    names = [secs[i][0] for i in placed] + [".symtab", ".strtab", ".shstrtab"]
    shstr = b"\0" + b"".join(n.encode() + b"\0" for n in names)
    name_off = lambda n: shstr.index(b"\0" + n.encode() + b"\0") + 1  # noqa: E731
    body = bytearray(image)
    sym_off = _align(len(body), 8)
    body += bytes(sym_off - len(body)) + sym_bytes
    str_off = len(body)
    body += str_bytes
    shstr_off = len(body)
    body += shstr
    shoff = _align(len(body), 8)
    body += bytes(shoff - len(body))
    headers = [bytes(64)]
    for i, base in placed.items():
        name, _, typ, flags, _, _, size, _, _, align, entsize = secs[i]
        headers.append(struct.pack("<IIQQQQIIQQ", name_off(name), typ, flags, base, base, size, 0, 0, align, entsize))
    nsec = len(headers)
    strtab_index = nsec + 1
    headers.append(
        struct.pack("<IIQQQQIIQQ", name_off(".symtab"), SHT_SYMTAB, 0, 0, sym_off, len(sym_bytes), strtab_index,
                    symtab[8], 8, 24)
    )  # fmt: skip
    headers.append(struct.pack("<IIQQQQIIQQ", name_off(".strtab"), 3, 0, 0, str_off, len(str_bytes), 0, 0, 1, 0))
    headers.append(struct.pack("<IIQQQQIIQQ", name_off(".shstrtab"), 3, 0, 0, shstr_off, len(shstr), 0, 0, 1, 0))
    body += b"".join(headers)
    # program headers: PT_LOAD (R|X) over the whole image, PT_NOTE over the metadata note
    note = next((i for i in placed if secs[i][2] == SHT_NOTE), None)
    load = struct.pack("<IIQQQQQQ", 1, 5, 0, 0, 0, len(image), len(image), 0x1000)
    notep = (
        struct.pack("<IIQQQQQQ", 4, 4, placed[note], placed[note], placed[note], secs[note][6], secs[note][6], 4)
        if note is not None
        else struct.pack("<IIQQQQQQ", 6, 4, 64, 64, 64, 112, 112, 8)  # PT_PHDR when there is no note
    )
    ehdr = bytearray(obj[:64])
    struct.pack_into("<HHIQQQIHHHHHH", ehdr, 0x10, 3, 224, 1, 0, 64, shoff, struct.unpack_from("<I", obj, 0x30)[0],
                     64, 56, 2, 64, len(headers), len(headers) - 1)  # fmt: skip
    body[:64] = ehdr
    body[64 : 64 + 112] = load + notep
    return bytes(body)
