"""GPU virtual memory (GMC, gfx9 family): 4-level page tables in VRAM, a VA allocator, map/unmap, TLB invalidation.

Layout (public gfx9 VM docs as used by amdgpu): 48-bit VAs, 9 bits per level (PDB2 at bit 39, PDB1 at 30, PDB0 at 21,
PTB at 12), 8-byte entries, 512 per 4 KiB table. A PDE holds the next table's address (bits 47:6) and VALID; a PDB0
entry with PDE_IS_PTE set maps a 2 MiB page directly. PTE bits: VALID 0, SYSTEM 1 (host bus address), SNOOPED 2,
EXECUTABLE 4, READABLE 5, WRITEABLE 6, address bits 47:12.

On a VF nothing here touches a PF-owned register: only VM context 0's page-table base/range/control and the
invalidation engine 17 of both hubs (GC and MMHUB), all inside the VF's register space; FB location, system
aperture and L2 setup stay the PF's.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from .errors import DeviceError
from .memory import KiB, MiB, PhysicalMemory, RegionAllocator

PTE_VALID, PTE_SYSTEM, PTE_SNOOPED = 1 << 0, 1 << 1, 1 << 2
PTE_EXECUTABLE, PTE_READABLE, PTE_WRITEABLE = 1 << 4, 1 << 5, 1 << 6
PDE_IS_PTE = 1 << 54
ADDRESS_MASK = ((1 << 48) - 1) & ~0xFFF
PDE_ADDRESS_MASK = ((1 << 48) - 1) & ~0x3F
LEVEL_SHIFTS = (39, 30, 21, 12)  # PDB2, PDB1, PDB0, PTB
ENTRIES = 512
TABLE_BYTES = ENTRIES * 8
PAGE, HUGE = 4 * KiB, 2 * MiB
PAGE_TABLE_DEPTH = 3  # VM_CONTEXT0_CNTL.PAGE_TABLE_DEPTH: levels below the root
VA_BASE, VA_SIZE = 1 << 32, 1 << 46  # keep VA 0 and the low 4 GiB unmapped so a null pointer faults
HUBS = (("GC", "VM_"), ("MMHUB", "MMVM_"))  # compute goes through GC's hub, SDMA through MMHUB's


def pte(address: int, system: bool = False, executable: bool = False) -> int:
    flags = PTE_VALID | PTE_READABLE | PTE_WRITEABLE | (PTE_EXECUTABLE if executable else 0)
    return (address & ADDRESS_MASK) | flags | ((PTE_SYSTEM | PTE_SNOOPED) if system else 0)


@dataclass
class Mapping:
    va: int
    size: int
    target: int  # VRAM physical address, or host bus address when system
    system: bool
    pages: list[tuple[int, int]]  # (va, page size) of every leaf written


class GPUVM:
    """Page tables of VM context 0 (the kernel-mode context this driver runs everything in)."""

    def __init__(self, write: Callable[[int, bytes], None], read: Callable[[int, int], bytes], memory: PhysicalMemory):
        """`write`/`read` reach VRAM by physical address (through BAR0)."""
        self.write_vram, self.read_vram, self.memory = write, read, memory
        self.region = "page-table" if memory.page_table.size else "main"
        self.root = self._new_table()
        self.va = RegionAllocator("gpu-va", VA_BASE, VA_SIZE)
        self.mappings: dict[int, Mapping] = {}
        self.tables: dict[int, int] = {}  # paddr of a table -> live entries in it (for freeing empty tables)
        self.dirty = False  # an unmap happened since the last TLB invalidation

    def _new_table(self) -> int:
        paddr = self.memory.alloc(TABLE_BYTES, PAGE, self.region)
        self.write_vram(paddr, bytes(TABLE_BYTES))
        return paddr

    def _entry(self, table: int, index: int) -> int:
        return struct.unpack("<Q", self.read_vram(table + index * 8, 8))[0]

    def _set(self, table: int, index: int, value: int) -> None:
        self.write_vram(table + index * 8, struct.pack("<Q", value))

    def _table_for(self, va: int, leaf_level: int) -> int:
        """The table holding va's entry at leaf_level (2: PDB0 for 2 MiB, 3: PTB for 4 KiB), creating tables."""
        table = self.root
        for level in range(leaf_level):
            index = (va >> LEVEL_SHIFTS[level]) & (ENTRIES - 1)
            entry = self._entry(table, index)
            if entry & PDE_IS_PTE:
                raise DeviceError(f"VA {va:#x} is already mapped by a 2 MiB page; unmap it first")
            if not entry & PTE_VALID:
                child = self._new_table()
                self._set(table, index, (child & PDE_ADDRESS_MASK) | PTE_VALID)
                entry = child | PTE_VALID
            table = entry & PDE_ADDRESS_MASK
        return table

    def map(self, target: int, size: int, *, system: bool = False, executable: bool = False, va: int | None = None):
        """Map [target, target+size) at a new (or the given) VA; 2 MiB pages where both sides are 2 MiB aligned."""
        if size <= 0 or target % PAGE:
            raise ValueError(f"map needs a page-aligned target and a positive size, got {target:#x} + {size}")
        if not system and target < self.memory.paddr_base:
            raise DeviceError(f"VRAM {target:#x} is below paddr_base {self.memory.paddr_base:#x} (PF-owned)")
        size = (size + PAGE - 1) // PAGE * PAGE
        align = HUGE if size >= HUGE and target % HUGE == 0 else PAGE
        va = self.va.alloc(size, align) if va is None else va
        pages, off = [], 0
        while off < size:
            huge = (va + off) % HUGE == 0 and (target + off) % HUGE == 0 and size - off >= HUGE
            level, step = (2, HUGE) if huge else (3, PAGE)
            table = self._table_for(va + off, level)
            index = ((va + off) >> LEVEL_SHIFTS[level]) & (ENTRIES - 1)
            if self._entry(table, index) & PTE_VALID:
                raise DeviceError(f"VA {va + off:#x} is already mapped")
            self._set(table, index, pte(target + off, system, executable) | (PDE_IS_PTE if huge else 0))
            pages.append((va + off, step))
            off += step
        self.mappings[va] = Mapping(va, size, target, system, pages)
        return va

    def unmap(self, va: int) -> Mapping:
        """Clear a mapping's leaves; the caller must invalidate the TLBs before reusing its memory."""
        if (m := self.mappings.pop(va, None)) is None:
            raise KeyError(f"no mapping at VA {va:#x}")
        for page_va, step in m.pages:
            level = 2 if step == HUGE else 3
            table = self._table_for(page_va, level)
            self._set(table, (page_va >> LEVEL_SHIFTS[level]) & (ENTRIES - 1), 0)
        self.va.free(va)
        self.dirty = True
        return m

    def translate(self, va: int) -> tuple[int, bool] | None:
        """(address, system) of va by walking the tables as the GPU does; None when unmapped."""
        table = self.root
        for level, shift in enumerate(LEVEL_SHIFTS):
            entry = self._entry(table, (va >> shift) & (ENTRIES - 1))
            if not entry & PTE_VALID:
                return None
            if level == 3 or entry & PDE_IS_PTE:
                return (entry & ADDRESS_MASK) + (va & ((1 << shift) - 1)), bool(entry & PTE_SYSTEM)
            table = entry & PDE_ADDRESS_MASK
        return None

    # -- registers ----------------------------------------------------------------------------------------------------
    def context_registers(self) -> list[tuple[str, str, int]]:
        """(ip, register, value) that enable context 0 on both hubs with these tables."""
        base = self.root | PTE_VALID
        start, end = VA_BASE >> 12, (VA_BASE + VA_SIZE - 1) >> 12
        out = []
        for ip, prefix in HUBS:
            out += [
                (ip, f"{prefix}CONTEXT0_PAGE_TABLE_BASE_ADDR_LO32", base & 0xFFFFFFFF),
                (ip, f"{prefix}CONTEXT0_PAGE_TABLE_BASE_ADDR_HI32", base >> 32),
                (ip, f"{prefix}CONTEXT0_PAGE_TABLE_START_ADDR_LO32", start & 0xFFFFFFFF),
                (ip, f"{prefix}CONTEXT0_PAGE_TABLE_START_ADDR_HI32", start >> 32),
                (ip, f"{prefix}CONTEXT0_PAGE_TABLE_END_ADDR_LO32", end & 0xFFFFFFFF),
                (ip, f"{prefix}CONTEXT0_PAGE_TABLE_END_ADDR_HI32", end >> 32),
                (ip, f"{prefix}CONTEXT0_CNTL", 1 | PAGE_TABLE_DEPTH << 1),
            ]
        return out


INVALIDATE_VMID0_ALL = 1 | 0x1F << 19  # vmid 0; L2 PTEs, L2 PDE0-2 and L1 PTEs (bits 19-23); flush type 0
