"""The physical VRAM allocator: paddr_base, physical alignment, out-of-memory errors, no overlap under fuzzing."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fusegrad.runtime.support.amd.errors import OutOfMemory
from fusegrad.runtime.support.amd.memory import (
    BOOT_REGION_SIZE,
    VF_PADDR_BASE,
    KiB,
    MiB,
    PhysicalMemory,
    RegionAllocator,
    round_up,
)


def test_vf_layout_starts_at_one_mib_and_keeps_the_top():
    mem = PhysicalMemory(1024 * MiB, paddr_base=VF_PADDR_BASE, reserve_page_tables=True)
    layout = mem.layout
    assert layout.boot == (1 * MiB, 1 * MiB + BOOT_REGION_SIZE)
    assert layout.page_table == (layout.boot[1], layout.boot[1] + 2 * MiB)
    assert layout.main == (layout.page_table[1], 1024 * MiB)
    assert PhysicalMemory(1024 * MiB).layout.boot[0] == 0


def test_two_mib_pages_are_physically_aligned_when_the_region_base_is_not():
    mem = PhysicalMemory(1024 * MiB, paddr_base=VF_PADDR_BASE)
    assert mem.main.base % (2 * MiB) == 1 * MiB  # region-local alignment would be off by 1 MiB here
    mem.alloc(4 * KiB)
    for _ in range(4):
        paddr = mem.alloc(2 * MiB, align=2 * MiB)
        assert paddr % (2 * MiB) == 0
    assert mem.alloc(4 * KiB, region="boot") >= VF_PADDR_BASE


def test_out_of_memory_names_the_request_and_the_free_space():
    region = RegionAllocator("main", 1 * MiB, 8 * MiB)
    region.alloc(3 * MiB, align=1 * MiB)
    with pytest.raises(OutOfMemory) as info:
        region.alloc(6 * MiB)
    message = str(info.value)
    assert f"{6 * MiB} bytes (6 MiB)" in message and f"{5 * MiB} bytes free" in message and "largest" in message
    with pytest.raises(OutOfMemory, match="aligned to 0x800000"):
        RegionAllocator("main", 1 * MiB, 16 * MiB).alloc(10 * MiB, align=8 * MiB)  # 16 MiB free, none aligned


@pytest.mark.parametrize(
    ("size", "align", "match"), [(0, 4096, "positive"), (4096, 3, "power of two"), (4096, 0, "power of two")]
)
def test_bad_requests_raise_value_error(size, align, match):
    with pytest.raises(ValueError, match=match):
        RegionAllocator("main", 0, MiB).alloc(size, align)


@pytest.mark.parametrize(
    ("size", "align"), [(4096.0, 4096), (4096, 4096.0), (True, 4096), (4096, True), ("4096", 4096), (1.5, 1)]
)
def test_non_integer_requests_raise_type_error_naming_them(size, align):
    bad = "size" if isinstance(size, bool) or not isinstance(size, int) else "alignment"
    with pytest.raises(TypeError, match=rf"region main: {bad} must be an int, got .*\("):
        RegionAllocator("main", 0, MiB).alloc(size, align)


def test_bad_frees_raise_value_error():
    mem = PhysicalMemory(1024 * MiB, paddr_base=VF_PADDR_BASE)
    paddr = mem.alloc(4096)
    mem.free(paddr)
    with pytest.raises(ValueError, match=hex(paddr)):
        mem.free(paddr)
    with pytest.raises(ValueError, match="outside every VRAM region"):
        mem.free(0)
    with pytest.raises(ValueError, match="unknown VRAM region"):
        mem.alloc(4096, region="nope")


def test_without_page_tables_main_starts_right_after_the_boot_region():
    mem = PhysicalMemory(1024 * MiB, paddr_base=VF_PADDR_BASE)  # large BAR: the default
    layout = mem.layout
    assert layout.boot == (1 * MiB, 1 * MiB + BOOT_REGION_SIZE)
    assert layout.page_table == (layout.boot[1], layout.boot[1]) and mem.page_table.free_bytes == 0
    assert layout.main == (layout.boot[1], 1024 * MiB)
    with pytest.raises(OutOfMemory, match="page-table"):
        mem.alloc(4 * KiB, region="page-table")


@pytest.mark.parametrize("reserve_page_tables", [False, True])
def test_too_small_vram_is_rejected_with_sizes(reserve_page_tables):
    with pytest.raises(ValueError, match="cannot hold") as info:
        PhysicalMemory(33 * MiB, paddr_base=VF_PADDR_BASE, reserve_page_tables=reserve_page_tables)
    message = str(info.value)
    assert "VRAM of 33 MiB" in message and "paddr_base 1 MiB" in message and "boot region 32 MiB" in message
    assert "page tables " + ("1 MiB" if reserve_page_tables else "0 B") in message
    assert "-" not in message.replace("page-table", "")


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((-1 * MiB,), ValueError, "vram_size .*-1048576"),
        ((0,), ValueError, "vram_size .*got 0"),
        ((1024 * MiB, -1), ValueError, "paddr_base .*-1"),
        ((1024 * MiB, 0, -MiB), ValueError, "boot_size .*-1048576"),
        ((1024.0 * MiB,), TypeError, "vram_size .*float"),
        ((True,), TypeError, "vram_size .*bool"),
    ],
)
def test_bad_layout_arguments_name_the_value(args, error, match):
    with pytest.raises(error, match=match):
        PhysicalMemory(*args)


def _holes(region: RegionAllocator) -> list[tuple[int, int]]:
    """Free space computed from the live allocations alone: an oracle independent of the free list."""
    holes, cursor = [], region.base
    for paddr, size in sorted(region.allocations().items()):
        if paddr > cursor:
            holes.append((cursor, paddr))
        cursor = paddr + size
    if cursor < region.end:
        holes.append((cursor, region.end))
    return holes


ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("alloc"),
            st.integers(1, 6 * MiB),
            st.sampled_from([1, 256, 4 * KiB, 64 * KiB, 1 * MiB, 2 * MiB]),
            st.sampled_from(["boot", "page-table", "main"]),
        ),
        st.tuples(st.just("free"), st.integers(0, 1 << 30)),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops=ops, vf=st.booleans(), small_bar=st.booleans())
def test_fuzzed_alloc_free_keeps_alignment_bounds_and_no_overlap(ops, vf, small_bar):
    mem = PhysicalMemory(
        448 * MiB, paddr_base=VF_PADDR_BASE if vf else 0, boot_size=8 * MiB, reserve_page_tables=small_bar
    )
    live: dict[int, tuple[int, int, str]] = {}
    for op in ops:
        if op[0] == "free":
            if live:
                paddr = sorted(live)[op[1] % len(live)]
                mem.free(paddr)
                del live[paddr]
            continue
        _, size, align, name = op
        region = mem.regions[name]
        fits = any(round_up(start, align) + size <= end for start, end in _holes(region))
        try:
            paddr = mem.alloc(size, align, region=name)
        except OutOfMemory as e:
            assert not fits, f"OOM although a hole fits: {e}"
            assert str(size) in str(e) and str(region.free_bytes) in str(e)
            continue
        assert fits
        assert paddr % align == 0, "alignment must hold on the physical address"
        assert region.base <= paddr and paddr + size <= region.end
        assert paddr >= mem.paddr_base and (not vf or paddr >= 1 * MiB)
        live[paddr] = (size, align, name)
    spans = sorted((paddr, paddr + size) for paddr, (size, _, _) in live.items())
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(spans)), "overlap"
    for region in mem.regions.values():
        assert region._free == _holes(region), "free list must be the exact, coalesced complement"
        assert region.free_bytes + sum(region.allocations().values()) == region.size
