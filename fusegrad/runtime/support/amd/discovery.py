"""IP discovery table: a verifying reader and a writer of valid synthetic tables (facts sheet §8).

The table sits at `vram_size - 64 KiB`. The reader checks both signatures, the binary checksum, every table checksum
and each die's id, and returns the IP blocks with hw id, instance, version and register-segment bases (in dwords).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .errors import DiscoveryError

KiB = 1 << 10
DISCOVERY_OFFSET_FROM_END = 64 * KiB
DISCOVERY_READ_SIZE = 10 * KiB

BINARY_SIGNATURE = 0x28211407
IP_DISCOVERY_SIGNATURE = 0x53445049  # "IPDS"
GC_TABLE_ID = 0x4347  # "GC"
HARVEST_SIGNATURE = 0x56524148  # "HARV"
TABLE_IP_DISCOVERY, TABLE_GC, TABLE_HARVEST = 0, 1, 2
NUM_TABLES, MAX_DIES, HARVEST_SLOTS = 6, 16, 32
# Entries the kernel skips: instance numbers and hw ids beyond these are not real IP blocks.
MAX_INSTANCE, MAX_HW_ID = 44, 300

BINARY_HEADER = struct.Struct("<IHHHH")  # signature, version major, minor, checksum, binary size; table list follows
TABLE_INFO = struct.Struct("<HHHH")  # offset, checksum, size, padding
BINARY_HEADER_SIZE = BINARY_HEADER.size + NUM_TABLES * TABLE_INFO.size  # 60
IP_HEADER = struct.Struct("<IHHIH")  # signature, version, size, id, num_dies; 16 die slots follow
DIE_INFO = struct.Struct("<HH")  # die id, die offset (absolute)
IP_HEADER_SIZE = 80
IP_HEADER_FLAGS_OFFSET = 78  # bit 0: base addresses are 64-bit
DIE_HEADER = struct.Struct("<HH")  # die id, num ips
IP_ENTRY = struct.Struct("<HBBBBBB")  # hw id, instance, num bases, major, minor, revision, sub_revision|variant<<4
GC_HEADER = struct.Struct("<IHHI")  # table id, version major, minor, size
HARVEST_HEADER = struct.Struct("<II")  # signature, version
HARVEST_ENTRY = struct.Struct("<HBB")  # hw id, instance, reserved
HARVEST_SIZE = HARVEST_HEADER.size + HARVEST_SLOTS * HARVEST_ENTRY.size  # 136

HW_ID_NAMES: dict[int, str] = {
    1: "MP1",
    3: "THM",
    4: "SMUIO",
    5: "FUSE",
    6: "CLKA",
    10: "PWR",
    11: "GC",
    12: "VCN",
    15: "DCI",
    21: "VPE",
    32: "VCE",
    34: "MMHUB",
    35: "ATHUB",
    40: "OSSSYS",
    41: "HDP",
    42: "SDMA0",
    43: "SDMA1",
    46: "DF",
    66: "WAFLC",
    68: "SDMA2",
    69: "SDMA3",
    70: "PCIE",
    91: "LSDMA",
    108: "NBIF",
    150: "UMC",
    200: "XGMI",
    255: "MP0",
    271: "DMU",
}
HW_IDS: dict[str, int] = {name: hw_id for hw_id, name in HW_ID_NAMES.items()}


@dataclass(frozen=True)
class IPBlock:
    """One IP instance: hw id, instance number, (major, minor, revision) and register-segment bases in dwords."""

    hw_id: int
    instance: int
    version: tuple[int, int, int]
    bases: tuple[int, ...]
    die: int = 0
    sub_revision: int = 0
    variant: int = 0

    @property
    def name(self) -> str:
        return HW_ID_NAMES.get(self.hw_id, f"HWID{self.hw_id}")


@dataclass(frozen=True)
class Discovery:
    """A parsed discovery binary."""

    version: tuple[int, int]
    ip_table_version: int
    ips: tuple[IPBlock, ...]
    gc_info_version: tuple[int, int] | None
    harvested: tuple[tuple[int, int], ...]

    def find(self, hw: int | str, instance: int = 0) -> IPBlock:
        hw_id = HW_IDS[hw] if isinstance(hw, str) and hw in HW_IDS else hw
        for ip in self.ips:
            if ip.hw_id == hw_id and ip.instance == instance:
                return ip
        raise KeyError(
            f"no IP block {hw!r} instance {instance} in discovery (have {sorted({i.name for i in self.ips})})"
        )

    def versions(self) -> dict[str, tuple[int, int, int]]:
        """Version of instance 0 of every IP, by name."""
        return {ip.name: ip.version for ip in self.ips if ip.instance == 0}


# Synthetic MI350X VF table. GC 9.5.0 is gfx950; the other versions are plausible, not confirmed (facts §8).
# NBIF's segment 2 is 0xD20 so NBIO-relative registers agree with the absolute mailbox offsets; other bases are
# placeholders.
MI350X_VF_IPS: tuple[IPBlock, ...] = (
    IPBlock(HW_IDS["GC"], 0, (9, 5, 0), (0x1260, 0xA000, 0x1C000, 0x2402C00)),
    IPBlock(HW_IDS["HDP"], 0, (4, 4, 5), (0xF20, 0x240A400)),
    IPBlock(HW_IDS["MMHUB"], 0, (1, 8, 1), (0x1A000, 0x2408800)),
    IPBlock(HW_IDS["OSSSYS"], 0, (4, 4, 5), (0x10A0, 0x240A000)),
    IPBlock(HW_IDS["NBIF"], 0, (7, 9, 0), (0x0, 0x14, 0xD20, 0x10400, 0x241B000, 0x4040000)),
    IPBlock(HW_IDS["MP0"], 0, (13, 0, 14), (0x16000, 0xDC00, 0xE000, 0x1E000, 0x2402C00)),
    IPBlock(HW_IDS["MP1"], 0, (13, 0, 12), (0x16000, 0xDC00, 0xE000, 0x1E000, 0x2402C00)),
    IPBlock(HW_IDS["SDMA0"], 0, (4, 4, 5), (0x1260, 0xA000, 0x1C000, 0x2402C00)),
)


def checksum16(data: bytes) -> int:
    """16-bit wrapping byte sum, the discovery binary's checksum."""
    return sum(data) & 0xFFFF


def build_discovery(
    ips: Sequence[IPBlock] = MI350X_VF_IPS,
    *,
    base_addr_64: bool = False,
    harvested: Sequence[tuple[int, int]] = (),
    gc_info_version: tuple[int, int] = (2, 1),
    version: tuple[int, int] = (1, 0),
) -> bytes:
    """A valid discovery binary with one die: binary header, IPDS header (v4), die, entries, GC table, HARV table."""
    if len(harvested) > HARVEST_SLOTS:
        raise ValueError(f"at most {HARVEST_SLOTS} harvested instances fit the HARV table, got {len(harvested)}")
    entries = bytearray(DIE_HEADER.pack(0, len(ips)))
    for ip in ips:
        if not (0 <= ip.instance < 256 and 0 <= ip.hw_id < 1 << 16 and len(ip.bases) < 256):
            raise ValueError(f"IP {ip} does not fit an 8-byte discovery entry")
        entries += IP_ENTRY.pack(
            ip.hw_id, ip.instance, len(ip.bases), *ip.version, (ip.sub_revision & 0xF) | (ip.variant & 0xF) << 4
        )
        entries += struct.pack(f"<{len(ip.bases)}{'Q' if base_addr_64 else 'I'}", *ip.bases)
    ip_table_size = IP_HEADER_SIZE + len(entries)
    die_offset = BINARY_HEADER_SIZE + IP_HEADER_SIZE
    ip_header = bytearray(IP_HEADER_SIZE)
    IP_HEADER.pack_into(ip_header, 0, IP_DISCOVERY_SIGNATURE, 4, ip_table_size, 0, 1)
    DIE_INFO.pack_into(ip_header, IP_HEADER.size, 0, die_offset)
    ip_header[IP_HEADER_FLAGS_OFFSET] = int(base_addr_64)
    ip_table = bytes(ip_header + entries)
    gc_offset = BINARY_HEADER_SIZE + (ip_table_size + 3) // 4 * 4
    gc_body = bytes(64)  # the GC info body's fields are not modelled
    gc_table = GC_HEADER.pack(GC_TABLE_ID, *gc_info_version, GC_HEADER.size + len(gc_body)) + gc_body
    harvest_offset = gc_offset + len(gc_table)
    harvest = bytearray(HARVEST_SIZE)
    HARVEST_HEADER.pack_into(harvest, 0, HARVEST_SIGNATURE, 1)
    for i, (hw_id, instance) in enumerate(harvested):
        HARVEST_ENTRY.pack_into(harvest, HARVEST_HEADER.size + i * HARVEST_ENTRY.size, hw_id, instance, 0)
    total = harvest_offset + HARVEST_SIZE
    if total > DISCOVERY_READ_SIZE:
        raise ValueError(f"discovery binary of {total} bytes exceeds the {DISCOVERY_READ_SIZE} bytes a reader reads")
    blob = bytearray(total)
    blob[BINARY_HEADER_SIZE : BINARY_HEADER_SIZE + ip_table_size] = ip_table
    blob[gc_offset : gc_offset + len(gc_table)] = gc_table
    blob[harvest_offset:total] = harvest
    tables = {
        TABLE_IP_DISCOVERY: (BINARY_HEADER_SIZE, ip_table),
        TABLE_GC: (gc_offset, gc_table),
        TABLE_HARVEST: (harvest_offset, bytes(harvest)),
    }
    for index, (offset, table) in tables.items():
        TABLE_INFO.pack_into(
            blob, BINARY_HEADER.size + index * TABLE_INFO.size, offset, checksum16(table), len(table), 0
        )
    BINARY_HEADER.pack_into(blob, 0, BINARY_SIGNATURE, *version, 0, total)
    struct.pack_into("<H", blob, 8, checksum16(blob[10:total]))
    return bytes(blob)


class _Reader:
    """Bounds-checked little-endian reads over the binary; every failure names what was being read."""

    def __init__(self, blob: bytes, end: int, where: str):
        self.blob, self.end, self.where = blob, end, where

    def unpack(self, fmt: struct.Struct | str, offset: int, what: str) -> tuple[int, ...]:
        size = fmt.size if isinstance(fmt, struct.Struct) else struct.calcsize(fmt)
        if offset < 0 or offset + size > self.end:
            raise DiscoveryError(
                f"discovery table {self.where} is truncated: {what} at offset {offset:#x} needs {size} "
                f"bytes but the binary ends at {self.end:#x}"
            )
        return (
            fmt.unpack_from(self.blob, offset)
            if isinstance(fmt, struct.Struct)
            else struct.unpack_from(fmt, self.blob, offset)
        )

    def verify(self, offset: int, size: int, expected: int, what: str) -> None:
        self.unpack(f"<{size}x", offset, what)
        actual = checksum16(self.blob[offset : offset + size])
        if actual != expected:
            raise DiscoveryError(
                f"discovery {what} checksum mismatch {self.where}: header says {expected:#06x}, "
                f"bytes [{offset:#x}, {offset + size:#x}) sum to {actual:#06x}"
            )


def parse_discovery(blob: bytes, *, where: str = "", hint: str = "") -> Discovery:
    """Verify and parse a discovery binary. `where` locates it in error messages; `hint` explains a likely cause."""
    where = where or "(in memory)"
    suffix = f" ({hint})" if hint else ""
    if len(blob) and blob.count(0xFF) == len(blob):
        raise DiscoveryError(
            f"discovery table {where} reads all 0xFF ({len(blob)} bytes): VRAM access was probably not "
            "granted by the PF (no REQ_GPU_INIT_DATA handshake, or the PF revoked it)" + suffix
        )
    if len(blob) < BINARY_HEADER_SIZE:
        raise DiscoveryError(
            f"discovery table {where} is truncated: {len(blob)} bytes, the header alone is {BINARY_HEADER_SIZE}"
        )
    signature, major, minor, binary_checksum, binary_size = BINARY_HEADER.unpack_from(blob, 0)
    if signature != BINARY_SIGNATURE:
        empty = " (the window is all zero: the PF did not write a table there)" if not any(blob) else ""
        raise DiscoveryError(
            f"discovery binary signature mismatch {where}: read {signature:#010x}, expected "
            f"{BINARY_SIGNATURE:#010x}{empty}" + suffix
        )
    if not BINARY_HEADER_SIZE <= binary_size <= len(blob):
        raise DiscoveryError(
            f"discovery table {where} is truncated: header says {binary_size} bytes, "
            f"{len(blob)} bytes available (at least {BINARY_HEADER_SIZE} needed)"
        )
    r = _Reader(blob, binary_size, where)
    r.verify(10, binary_size - 10, binary_checksum, "binary")
    table_list = [
        r.unpack(TABLE_INFO, BINARY_HEADER.size + i * TABLE_INFO.size, f"table_list[{i}]") for i in range(NUM_TABLES)
    ]
    ip_offset, ip_checksum, _, _ = table_list[TABLE_IP_DISCOVERY]
    ip_signature, ip_version, ip_size, _, num_dies = r.unpack(IP_HEADER, ip_offset, "IP discovery header")
    if ip_signature != IP_DISCOVERY_SIGNATURE:
        raise DiscoveryError(
            f"IP discovery signature mismatch {where}: read {ip_signature:#010x} at offset "
            f"{ip_offset:#x}, expected {IP_DISCOVERY_SIGNATURE:#010x}"
        )
    r.verify(ip_offset, ip_size, ip_checksum, "IP discovery table")
    if not 1 <= num_dies <= MAX_DIES:
        raise DiscoveryError(f"IP discovery header {where} claims {num_dies} dies, expected 1 to {MAX_DIES}")
    base_64 = ip_version >= 4 and bool(r.unpack("<B", ip_offset + IP_HEADER_FLAGS_OFFSET, "IP header flags")[0] & 1)
    ips = []
    for die in range(num_dies):
        die_id, die_offset = r.unpack(DIE_INFO, ip_offset + IP_HEADER.size + die * DIE_INFO.size, f"die_info[{die}]")
        header_die_id, num_ips = r.unpack(DIE_HEADER, die_offset, f"die {die} header")
        if die_id != die or header_die_id != die:
            raise DiscoveryError(
                f"discovery die {die} {where} has die_id {die_id} in the table and {header_die_id} in "
                "its header; both must equal its index"
            )
        entry = die_offset + DIE_HEADER.size
        for n in range(num_ips):
            hw_id, instance, num_bases, *version, sub = r.unpack(IP_ENTRY, entry, f"die {die} IP entry {n}")
            bases = r.unpack(f"<{num_bases}{'Q' if base_64 else 'I'}", entry + IP_ENTRY.size, f"bases of IP {hw_id}")
            entry += IP_ENTRY.size + num_bases * (8 if base_64 else 4)
            if instance < MAX_INSTANCE and hw_id < MAX_HW_ID:
                ips.append(
                    IPBlock(
                        hw_id, instance, (version[0], version[1], version[2]), tuple(bases), die, sub & 0xF, sub >> 4
                    )
                )
    gc_info_version = None
    gc_offset, gc_checksum, _, _ = table_list[TABLE_GC]
    if gc_offset:
        table_id, gc_major, gc_minor, gc_size = r.unpack(GC_HEADER, gc_offset, "GC info header")
        if table_id != GC_TABLE_ID:
            raise DiscoveryError(f"GC info table id mismatch {where}: read {table_id:#x}, expected {GC_TABLE_ID:#x}")
        r.verify(gc_offset, gc_size, gc_checksum, "GC info table")
        gc_info_version = (gc_major, gc_minor)
    harvested = []
    harvest_offset, harvest_checksum, _, _ = table_list[TABLE_HARVEST]
    if harvest_offset:
        (harvest_signature, _) = r.unpack(HARVEST_HEADER, harvest_offset, "harvest header")
        if harvest_signature != HARVEST_SIGNATURE:
            raise DiscoveryError(
                f"harvest table signature mismatch {where}: read {harvest_signature:#010x}, expected "
                f"{HARVEST_SIGNATURE:#010x}"
            )
        r.verify(harvest_offset, HARVEST_SIZE, harvest_checksum, "harvest table")
        for slot in range(HARVEST_SLOTS):
            hw_id, instance, _ = r.unpack(
                HARVEST_ENTRY, harvest_offset + HARVEST_HEADER.size + slot * 4, "harvest entry"
            )
            if hw_id == 0:
                break
            harvested.append((hw_id, instance))
    return Discovery((major, minor), ip_version, tuple(ips), gc_info_version, tuple(harvested))


def read_discovery(read: Callable[[int, int], bytes], vram_size: int, *, hint: str = "") -> Discovery:
    """Read and parse the table at `vram_size - 64 KiB` through `read(offset, length)`."""
    if vram_size < DISCOVERY_OFFSET_FROM_END:
        raise DiscoveryError(
            f"VRAM size {vram_size:#x} is smaller than the {DISCOVERY_OFFSET_FROM_END:#x}-byte "
            "discovery window; RCC_CONFIG_MEMSIZE is wrong or the device is not responding"
        )
    offset = vram_size - DISCOVERY_OFFSET_FROM_END
    return parse_discovery(read(offset, DISCOVERY_READ_SIZE), where=f"at VRAM offset {offset:#x}", hint=hint)
