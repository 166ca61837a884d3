"""Physical VRAM allocator: boot, page-table and main regions above `paddr_base` (facts sheet §7).

Alignment is computed on physical addresses, not on offsets inside a region: with a 1 MiB `paddr_base` (VF) a
region-local 2 MiB alignment would hand out blocks that are physically 1 MiB mod 2 MiB, which breaks 2 MiB pages.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from .errors import OutOfMemory

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
# The low 1 MiB of a VF's framebuffer holds PF-owned critical-region data (VBIOS, PF2VF/VF2PF, bad pages, RAS).
VF_PADDR_BASE = 1 * MiB
BOOT_REGION_SIZE = 32 * MiB
# VRAM kept out of the allocator at the top on GC 9.4/9.5 (discovery and firmware live there).
RESERVED_VRAM_SIZE = 384 * MiB


def round_up(value: int, align: int) -> int:
    return (value + align - 1) // align * align


def _size(n: int) -> str:
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


class RegionAllocator:
    """First-fit allocator over [base, base + size) with a sorted, coalesced free list of physical ranges."""

    def __init__(self, name: str, base: int, size: int):
        if base < 0 or size < 0:
            raise ValueError(f"region {name}: base {base:#x} and size {size:#x} must be non-negative")
        self.name, self.base, self.size = name, base, size
        self._free: list[tuple[int, int]] = [(base, base + size)] if size else []  # (start, end), sorted, disjoint
        self._live: dict[int, int] = {}  # paddr -> size

    @property
    def end(self) -> int:
        return self.base + self.size

    @property
    def free_bytes(self) -> int:
        return sum(end - start for start, end in self._free)

    def largest_hole(self) -> int:
        return max((end - start for start, end in self._free), default=0)

    def allocations(self) -> dict[int, int]:
        return dict(self._live)

    def alloc(self, size: int, align: int = 4 * KiB) -> int:
        """Physical address of a new block of `size` bytes with `paddr % align == 0`."""
        for what, value in (("size", size), ("alignment", align)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"region {self.name}: {what} must be an int, got {value!r} ({type(value).__name__})")
        if size <= 0:
            raise ValueError(f"region {self.name}: allocation size must be positive, got {size}")
        if align <= 0 or align & (align - 1):
            raise ValueError(f"region {self.name}: alignment must be a power of two, got {align}")
        for i, (start, end) in enumerate(self._free):
            paddr = round_up(start, align)  # physical alignment, the point of this allocator
            if paddr + size <= end:
                self._free[i : i + 1] = [r for r in ((start, paddr), (paddr + size, end)) if r[0] < r[1]]
                self._live[paddr] = size
                return paddr
        raise OutOfMemory(
            f"region {self.name} [{self.base:#x}, {self.end:#x}): cannot allocate {size} bytes "
            f"({_size(size)}) aligned to {align:#x}: {self.free_bytes} bytes free in {len(self._free)} "
            f"hole(s), largest {self.largest_hole()} bytes"
        )

    def free(self, paddr: int) -> None:
        size = self._live.pop(paddr, None)
        if size is None:
            raise ValueError(f"region {self.name}: {paddr:#x} is not the start of a live allocation")
        start, end = paddr, paddr + size
        i = bisect.bisect_left(self._free, (start, end))
        if i < len(self._free) and self._free[i][0] == end:  # merge with the hole after
            end = self._free.pop(i)[1]
        if i > 0 and self._free[i - 1][1] == start:  # merge with the hole before
            start = self._free.pop(i - 1)[0]
            i -= 1
        self._free.insert(i, (start, end))


@dataclass(frozen=True)
class Layout:
    """Where the three regions sit, in physical addresses."""

    paddr_base: int
    boot: tuple[int, int]
    page_table: tuple[int, int]
    main: tuple[int, int]


class PhysicalMemory:
    """The VRAM allocator of one device: boot region at `paddr_base`, then page tables, then everything else."""

    def __init__(
        self,
        vram_size: int,
        paddr_base: int = 0,
        boot_size: int = BOOT_REGION_SIZE,
        *,
        reserve_page_tables: bool = False,
    ):
        """`reserve_page_tables` only for a BAR smaller than VRAM: page tables must then sit where the CPU can reach."""
        for name, value, low in (
            ("vram_size", vram_size, 1),
            ("paddr_base", paddr_base, 0),
            ("boot_size", boot_size, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(
                    f"PhysicalMemory {name} must be an int byte count, got {value!r} ({type(value).__name__})"
                )
            if value < low:
                raise ValueError(f"PhysicalMemory {name} must be at least {low}, got {value!r}")
        page_table_size = round_up(vram_size // 512, MiB) if reserve_page_tables else 0
        main_base = paddr_base + boot_size + page_table_size
        if main_base >= vram_size:
            raise ValueError(
                f"VRAM of {_size(vram_size)} cannot hold paddr_base {_size(paddr_base)} + boot region "
                f"{_size(boot_size)} + page tables {_size(page_table_size)} = {_size(main_base)} "
                "and leave a main region"
            )
        self.vram_size, self.paddr_base = vram_size, paddr_base
        self.boot = RegionAllocator("boot", paddr_base, boot_size)
        self.page_table = RegionAllocator("page-table", paddr_base + boot_size, page_table_size)
        self.main = RegionAllocator("main", main_base, vram_size - main_base)
        self.regions = {r.name: r for r in (self.boot, self.page_table, self.main)}

    @property
    def layout(self) -> Layout:
        return Layout(
            self.paddr_base,
            (self.boot.base, self.boot.end),
            (self.page_table.base, self.page_table.end),
            (self.main.base, self.main.end),
        )

    def alloc(self, size: int, align: int = 4 * KiB, region: str = "main") -> int:
        if region not in self.regions:
            raise ValueError(f"unknown VRAM region {region!r}; regions are {list(self.regions)}")
        return self.regions[region].alloc(size, align)

    def free(self, paddr: int) -> None:
        for region in self.regions.values():
            if region.base <= paddr < region.end:
                return region.free(paddr)
        raise ValueError(f"{paddr:#x} is outside every VRAM region ([{self.paddr_base:#x}, {self.vram_size:#x}))")
