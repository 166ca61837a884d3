"""Discovery writer/reader round trip, and rejection of corrupted tables."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fusegrad.runtime.support.amd.discovery import (
    BINARY_HEADER_SIZE,
    DIE_HEADER,
    HW_ID_NAMES,
    IP_HEADER_SIZE,
    MI350X_VF_IPS,
    TABLE_GC,
    TABLE_HARVEST,
    TABLE_INFO,
    IPBlock,
    build_discovery,
    checksum16,
    parse_discovery,
    read_discovery,
)
from fusegrad.runtime.support.amd.errors import DiscoveryError


def refresh_binary_checksum(blob: bytearray) -> bytearray:
    """Make only the binary checksum right again, so a deeper check is what fails."""
    size = struct.unpack_from("<H", blob, 10)[0]
    struct.pack_into("<H", blob, 8, checksum16(blob[10:size]))
    return blob


def refresh_all_checksums(blob: bytearray) -> bytearray:
    """Make every table checksum (spans from the writer's table_list) and the binary checksum right again."""
    for index in range(3):
        offset, _, size, _ = TABLE_INFO.unpack_from(blob, 12 + index * TABLE_INFO.size)
        struct.pack_into("<H", blob, 12 + index * TABLE_INFO.size + 2, checksum16(blob[offset : offset + size]))
    return refresh_binary_checksum(blob)


def table_offset(blob: bytes, index: int) -> int:
    return struct.unpack_from("<H", blob, 12 + index * TABLE_INFO.size)[0]


def test_default_table_round_trips():
    d = parse_discovery(build_discovery())
    assert d.ips == MI350X_VF_IPS
    assert d.versions() == {
        "GC": (9, 5, 0),
        "HDP": (4, 4, 5),
        "MMHUB": (1, 8, 1),
        "OSSSYS": (4, 4, 5),
        "NBIF": (7, 9, 0),
        "MP0": (13, 0, 14),
        "MP1": (13, 0, 12),
        "SDMA0": (4, 4, 5),
    }
    assert d.find("NBIF").bases[2] == 0xD20  # segment 2 base that puts the mailbox at 0xE56
    assert d.gc_info_version == (2, 1) and d.harvested == () and d.ip_table_version == 4
    with pytest.raises(KeyError, match="UMC"):
        d.find("UMC")


ip_blocks = st.builds(
    IPBlock,
    hw_id=st.integers(1, 299),
    instance=st.integers(0, 43),
    version=st.tuples(st.integers(0, 255), st.integers(0, 255), st.integers(0, 255)),
    bases=st.lists(st.integers(0, 0xFFFFFFFF), max_size=8).map(tuple),
    sub_revision=st.integers(0, 15),
    variant=st.integers(0, 15),
)


@settings(max_examples=100, deadline=None)
@given(
    ips=st.lists(ip_blocks, max_size=30),
    base_64=st.booleans(),
    harvested=st.lists(st.tuples(st.integers(1, 0xFFFF), st.integers(0, 255)), max_size=32),
)
def test_writer_reader_round_trip(ips, base_64, harvested):
    d = parse_discovery(build_discovery(ips, base_addr_64=base_64, harvested=harvested))
    assert d.ips == tuple(ips)
    assert d.harvested == tuple(harvested)


def test_64_bit_bases_keep_their_full_value():
    ips = [IPBlock(11, 0, (9, 5, 0), (0x1_2345_6789_ABCD, 0x40))]
    assert parse_discovery(build_discovery(ips, base_addr_64=True)).ips == tuple(ips)


def test_entries_the_kernel_skips_are_skipped():
    ips = [IPBlock(11, 44, (9, 5, 0), (1,)), IPBlock(300, 0, (1, 0, 0), (2,)), IPBlock(41, 0, (4, 4, 5), (3,))]
    assert parse_discovery(build_discovery(ips)).ips == (ips[2],)


def test_read_discovery_reads_the_window_below_the_top():
    vram_size = 1 << 30
    blob = build_discovery()
    reads = []

    def read(offset, length):
        reads.append((offset, length))
        return blob + bytes(length - len(blob))

    assert read_discovery(read, vram_size).ips == MI350X_VF_IPS
    assert reads == [(vram_size - 64 * 1024, 10 * 1024)]
    with pytest.raises(DiscoveryError, match="smaller than"):
        read_discovery(read, 4096)


def test_all_ff_says_access_was_not_granted():
    with pytest.raises(DiscoveryError, match="probably not granted by the PF"):
        parse_discovery(b"\xff" * 10240, where="at VRAM offset 0x7ffff0000")


def test_all_zero_says_the_pf_wrote_nothing():
    with pytest.raises(DiscoveryError, match="did not write a table"):
        parse_discovery(bytes(10240))


def test_bad_binary_signature():
    blob = bytearray(build_discovery())
    blob[0] ^= 0x01
    with pytest.raises(DiscoveryError, match=r"binary signature mismatch.*read 0x28211406"):
        parse_discovery(bytes(blob))


def test_bad_binary_checksum():
    blob = bytearray(build_discovery())
    blob[BINARY_HEADER_SIZE + IP_HEADER_SIZE + DIE_HEADER.size + 4] += 1  # GC's major version
    with pytest.raises(DiscoveryError, match="binary checksum mismatch"):
        parse_discovery(bytes(blob))


def test_bad_ip_discovery_signature():
    blob = bytearray(build_discovery())
    blob[BINARY_HEADER_SIZE] ^= 0xFF
    with pytest.raises(DiscoveryError, match="IP discovery signature mismatch"):
        parse_discovery(bytes(refresh_binary_checksum(blob)))


def test_bad_ip_table_checksum():
    blob = bytearray(build_discovery())
    blob[BINARY_HEADER_SIZE + IP_HEADER_SIZE + DIE_HEADER.size + 4] += 1
    with pytest.raises(DiscoveryError, match="IP discovery table checksum mismatch"):
        parse_discovery(bytes(refresh_binary_checksum(blob)))


def test_bad_gc_table_id_and_harvest_signature():
    blob = bytearray(build_discovery())
    blob[table_offset(blob, TABLE_GC)] = 1  # the id tinygrad's mock writes; the kernel rejects it too
    with pytest.raises(DiscoveryError, match="GC info table id mismatch"):
        parse_discovery(bytes(refresh_binary_checksum(blob)))
    blob = bytearray(build_discovery())
    blob[table_offset(blob, TABLE_HARVEST)] ^= 0xFF
    with pytest.raises(DiscoveryError, match="harvest table signature mismatch"):
        parse_discovery(bytes(refresh_binary_checksum(blob)))


def test_die_id_must_match_its_index():
    blob = bytearray(build_discovery())
    struct.pack_into("<H", blob, BINARY_HEADER_SIZE + IP_HEADER_SIZE, 3)
    with pytest.raises(DiscoveryError, match="die 0 .* has die_id 0 in the table and 3 in its header"):
        parse_discovery(bytes(refresh_all_checksums(blob)))


def test_truncated_tables():
    blob = build_discovery()
    with pytest.raises(DiscoveryError, match="truncated"):
        parse_discovery(blob[: len(blob) // 2])
    with pytest.raises(DiscoveryError, match="truncated"):
        parse_discovery(blob[:30])
    cut = bytearray(blob)
    struct.pack_into("<H", cut, 10, BINARY_HEADER_SIZE + IP_HEADER_SIZE + 20)  # now ends inside the IP entries
    with pytest.raises(DiscoveryError, match="truncated"):
        parse_discovery(bytes(refresh_binary_checksum(cut)))
    many = bytearray(blob)
    struct.pack_into("<H", many, BINARY_HEADER_SIZE + IP_HEADER_SIZE + 2, 200)  # die claims 200 IP entries
    with pytest.raises(DiscoveryError, match="truncated"):
        parse_discovery(bytes(refresh_all_checksums(many)))


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_any_single_byte_corruption_is_rejected(data):
    blob = bytearray(build_discovery())
    # bytes 4..7 (the binary's version) are the only ones no signature or checksum covers
    offset = data.draw(st.integers(0, len(blob) - 1).filter(lambda o: not 4 <= o < 8))
    blob[offset] ^= data.draw(st.integers(1, 255))
    with pytest.raises(DiscoveryError):
        parse_discovery(bytes(blob))


def test_names_cover_the_ips_the_driver_needs():
    assert {"GC", "HDP", "MMHUB", "OSSSYS", "NBIF", "MP0", "MP1", "SDMA0"} <= set(HW_ID_NAMES.values())
