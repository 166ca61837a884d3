"""AMDGPU code objects: compile LLVM IR and read the kernel descriptor.

The compiler is llvmlite's LLVM, in-process (inproc.py), where it is installed with the amdgcn target; otherwise, or
with AMD_LLVM=external, the installed LLVM's opt, llc and ld.lld.

The 64-byte kernel descriptor (`<kernel>.kd`) layout is AMDGPU's public ABI (LLVM AMDGPUUsage): group segment size
at 0, private segment size at 4, kernarg size at 8, kernel_code_entry_byte_offset (i64) at 16, COMPUTE_PGM_RSRC3 at
44, RSRC1 at 48, RSRC2 at 52, kernel_code_properties (u16) at 56.
"""

from __future__ import annotations

import functools
import os
import shutil
import struct
import subprocess
import tempfile
from dataclasses import dataclass

from . import inproc

LLVM_DIRS = ("/usr/lib/llvm-20/bin", "/usr/lib/llvm-19/bin", "/usr/lib/llvm-18/bin", "/usr/lib/llvm-17/bin")
# user SGPRs the kernel_code_properties bits enable, in the order the hardware loads them (bit, count)
USER_SGPRS = ((0, 4), (1, 2), (2, 2), (3, 2), (4, 2), (5, 2), (6, 1))
KERNARG_PTR_BIT = 3


class ToolchainError(RuntimeError):
    """No LLVM with the amdgcn target (and lld) is installed, or it failed on a kernel."""


@functools.cache
def find_llvm() -> dict[str, str]:
    for d in LLVM_DIRS:
        tools = {t: os.path.join(d, t) for t in ("opt", "llc", "ld.lld")}
        if all(os.access(p, os.X_OK) for p in tools.values()):
            return tools
    tools = {t: shutil.which(t) for t in ("opt", "llc", "ld.lld")}
    if all(tools.values()):
        return tools  # type: ignore[return-value]
    raise ToolchainError(
        "DEV=AMD needs LLVM with the amdgcn target plus lld (gfx942 needs LLVM >= 17): e.g. "
        "`apt-get install llvm-19 lld-19`; looked in " + ", ".join(LLVM_DIRS) + " and PATH"
    )


def in_process(compiler: str = "") -> bool:
    """Compile with llvmlite (the default where it has amdgcn), not the external tools (compiler="external")."""
    if compiler not in ("", "llvmlite", "external"):
        raise ToolchainError(f"AMD_LLVM={compiler!r}: expected 'llvmlite', 'external' or unset")
    return compiler != "external" and inproc.available()


@functools.cache
def _external_targets() -> frozenset[str]:
    out = subprocess.run([find_llvm()["llc"], "-march=amdgcn", "-mcpu=help"], capture_output=True, text=True)
    return frozenset(w for w in (out.stdout + out.stderr).split() if w.startswith("gfx"))


def supported_targets(compiler: str = "") -> frozenset[str]:
    """The CDNA targets the compiler in use knows (llvmlite's LLVM has gfx942 from 17 on and gfx950 from 20 on)."""
    if in_process(compiler):
        v = inproc.llvm_version()[0]
        return frozenset(t for t, since in (("gfx942", 17), ("gfx950", 20)) if v >= since)
    return _external_targets()


def check_toolchain(compiler: str = "") -> None:
    """Raises ToolchainError when no compiler for amdgcn is available (neither llvmlite nor opt/llc/ld.lld)."""
    if not in_process(compiler):
        find_llvm()


def pick_target(wanted: str, compiler: str = "") -> str:
    """`wanted` when the compiler knows it, else gfx942 (same gfx9 family; LLVM 19 has no gfx950)."""
    known = supported_targets(compiler)
    if wanted not in ("gfx942", "gfx950"):
        raise ToolchainError(f"AMD_ARCH={wanted!r}: DEV=AMD builds for gfx950 (MI350X) or gfx942 (MI300X)")
    if wanted in known:
        return wanted
    if "gfx942" in known:
        return "gfx942"
    raise ToolchainError(f"this LLVM knows neither {wanted} nor gfx942 (it knows {sorted(known)})")


def _run(argv: list[str], what: str, stdin: bytes | None = None) -> bytes:
    p = subprocess.run(argv, input=stdin, capture_output=True, timeout=120)
    if p.returncode:
        raise ToolchainError(f"{what} failed ({' '.join(argv[:3])} ...): {p.stderr.decode(errors='replace')[-2000:]}")
    return p.stdout


def compile_ir(ir: str, target: str, compiler: str = "") -> bytes:
    """LLVM IR -> optimized -> relocatable object -> linked code object (an ELF shared object); compiler is AMD_LLVM's
    value ("external": opt/llc/ld.lld even where llvmlite could)."""
    if in_process(compiler):
        try:
            return inproc.link(inproc.compile_object(ir, target))
        except RuntimeError as e:
            raise ToolchainError(f"llvmlite ({target}) failed: {str(e)[-2000:]}") from None
    tools = find_llvm()
    with tempfile.TemporaryDirectory(prefix="fusegrad-amd-") as d:
        opt_bc = _run([tools["opt"], "-O2", "-mtriple=amdgcn-amd-amdhsa", f"-mcpu={target}", "-"], "opt", ir.encode())
        obj = os.path.join(d, "k.o")
        _run(
            [tools["llc"], "-O2", "-mtriple=amdgcn-amd-amdhsa", f"-mcpu={target}", "-filetype=obj", "-o", obj, "-"],
            "llc",
            opt_bc,
        )
        so = os.path.join(d, "k.so")
        _run([tools["ld.lld"], "-shared", "--no-undefined", "-o", so, obj], "ld.lld")
        with open(so, "rb") as f:
            return f.read()


@dataclass(frozen=True)
class KernelDescriptor:
    name: str
    kd_offset: int  # byte offset of the descriptor in the loaded image
    entry_offset: int  # byte offset of the code in the image
    group_segment: int
    private_segment: int
    kernarg_size: int
    rsrc1: int
    rsrc2: int
    rsrc3: int
    properties: int

    @property
    def kernarg_user_sgpr(self) -> int:
        """COMPUTE_USER_DATA index where the kernarg pointer goes (after the user SGPRs enabled before it)."""
        if not self.properties >> KERNARG_PTR_BIT & 1:
            raise ToolchainError(f"kernel {self.name} does not take a kernarg segment pointer")
        return sum(n for bit, n in USER_SGPRS if bit < KERNARG_PTR_BIT and self.properties >> bit & 1)

    @property
    def vgprs(self) -> int:
        return ((self.rsrc1 & 0x3F) + 1) * 8  # gfx90a+/gfx94x allocate VGPRs in granules of 8

    @property
    def accum_offset(self) -> int:
        """The first AGPR-backed register of the unified file (gfx90a+: RSRC3.ACCUM_OFFSET, in units of 4)."""
        return ((self.rsrc3 & 0x3F) + 1) * 4

    @property
    def sgprs(self) -> int:
        return (((self.rsrc1 >> 6) & 0xF) + 1) * 8


def parse_code_object(elf: bytes, kernel: str) -> KernelDescriptor:
    """Find `<kernel>.kd` in an ELF64 code object; offsets are virtual addresses of the loaded image."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2:
        raise ToolchainError("not an ELF64 code object")
    (shoff,) = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", elf, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    for sh in sections:
        if sh[1] not in (2, 11):  # SYMTAB, DYNSYM
            continue
        strtab = sections[sh[6]]
        for off in range(sh[4], sh[4] + sh[5], 24):
            st_name, _, _, shndx, value, _ = struct.unpack_from("<IBBHQQ", elf, off)
            end = elf.index(b"\0", strtab[4] + st_name)
            if elf[strtab[4] + st_name : end].decode() != f"{kernel}.kd":
                continue
            sec = sections[shndx]
            file_off = sec[4] + (value - sec[3])
            kd = elf[file_off : file_off + 64]
            grp, priv, karg = struct.unpack_from("<III", kd, 0)
            (entry,) = struct.unpack_from("<q", kd, 16)
            rsrc3, rsrc1, rsrc2 = struct.unpack_from("<III", kd, 44)
            (props,) = struct.unpack_from("<H", kd, 56)
            return KernelDescriptor(kernel, value, value + entry, grp, priv, karg, rsrc1, rsrc2, rsrc3, props)
    raise ToolchainError(f"code object has no symbol {kernel}.kd")


def load_image(elf: bytes) -> bytes:
    """The code object's loadable segments laid out at their virtual addresses (what goes into GPU memory)."""
    (phoff,) = struct.unpack_from("<Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    image = bytearray()
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz, p_memsz, _ = struct.unpack_from(
            "<IIQQQQQQ", elf, phoff + i * phentsize
        )
        if p_type != 1:  # PT_LOAD
            continue
        if len(image) < p_vaddr + p_memsz:
            image.extend(bytes(p_vaddr + p_memsz - len(image)))
        image[p_vaddr : p_vaddr + p_filesz] = elf[p_offset : p_offset + p_filesz]
    return bytes(image)
