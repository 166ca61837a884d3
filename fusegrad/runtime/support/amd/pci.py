"""PCI access: enumerate AMD functions in sysfs, map BARs, read and write config space.

`PCIDevice` is the one interface the layers above use; `SysfsPCIDevice` (here), `VFIOPCIDevice` (vfio.py) and
`SimPCIDevice` (sim.py) implement it, and nothing above this file knows which one it has.
"""

from __future__ import annotations

import mmap
import os
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from .errors import PCIError
from .regs import PCI_COMMAND, PCI_COMMAND_MASTER

AMD_VENDOR = 0x1002
SYSFS_PCI_DEVICES = "/sys/bus/pci/devices"
BAR_VRAM, BAR_DOORBELLS, BAR_REGISTERS = 0, 2, 5

KNOWN_DEVICES: dict[int, str] = {
    0x74A1: "Instinct MI300X",
    0x74B5: "Instinct MI300X VF",
    0x74B9: "Instinct MI325X VF",
    0x75A0: "Instinct MI350X",
    0x75B0: "Instinct MI350X VF",
    0x75A3: "Instinct MI355X",
    0x75B3: "Instinct MI355X VF",
}
# Device IDs of SR-IOV VFs: inside a guest a passed-through VF has no `physfn` link, so the ID is what tells.
KNOWN_VF_IDS = frozenset({0x74B5, 0x74B9, 0x75B0, 0x75B3})
# PCI base classes of GPU functions: display controller and processing accelerator (skips the HDMI audio function).
GPU_BASE_CLASSES = (0x03, 0x12)

_ADDRESS = re.compile(r"^(?:([0-9a-fA-F]{4}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")


def normalize_address(address: str) -> str:
    """'83:00.0' -> '0000:83:00.0'; raises ValueError naming a string that is not a PCI address."""
    match = _ADDRESS.match(address.strip())
    if match is None:
        raise ValueError(f"{address!r} is not a PCI address (expected DDDD:BB:DD.F or BB:DD.F)")
    domain, bus, dev, fn = match.groups()
    return f"{(domain or '0000').lower()}:{bus.lower()}:{dev.lower()}.{fn}"


@dataclass(frozen=True)
class PCIFunction:
    """What sysfs says about one PCI function."""

    address: str
    vendor: int
    device: int
    subsystem_vendor: int
    subsystem_device: int
    class_code: int
    driver: str | None
    physfn: str | None  # address of the parent PF, seen only on the host that owns the VF

    @property
    def is_vf(self) -> bool:
        return self.physfn is not None or (self.vendor == AMD_VENDOR and self.device in KNOWN_VF_IDS)

    @property
    def name(self) -> str:
        known = KNOWN_DEVICES.get(self.device) if self.vendor == AMD_VENDOR else None
        return known or f"device {self.vendor:04x}:{self.device:04x}"

    @property
    def ids(self) -> str:
        return f"{self.vendor:04x}:{self.device:04x}"


def _read_hex(path: Path) -> int:
    return int(path.read_text().strip(), 16)


def _link_name(path: Path) -> str | None:
    return os.path.basename(os.readlink(path)) if path.is_symlink() else None


def read_function(address: str, sysfs_root: str | Path = SYSFS_PCI_DEVICES) -> PCIFunction:
    """Read one function's IDs, class, bound driver and PF link from sysfs."""
    address = normalize_address(address)
    path = Path(sysfs_root) / address
    if not path.is_dir():
        raise PCIError(f"no PCI function {address} under {sysfs_root}")
    try:
        return PCIFunction(
            address=address,
            vendor=_read_hex(path / "vendor"),
            device=_read_hex(path / "device"),
            subsystem_vendor=_read_hex(path / "subsystem_vendor"),
            subsystem_device=_read_hex(path / "subsystem_device"),
            class_code=_read_hex(path / "class"),
            driver=_link_name(path / "driver"),
            physfn=_link_name(path / "physfn"),
        )
    except (OSError, ValueError) as e:
        raise PCIError(f"cannot read sysfs attributes of {address} under {sysfs_root}: {e}") from e


def list_functions(sysfs_root: str | Path = SYSFS_PCI_DEVICES, vendor: int = AMD_VENDOR) -> list[PCIFunction]:
    """GPU functions (display or accelerator class) of `vendor`, sorted by address; [] when sysfs has none."""
    root = Path(sysfs_root)
    if not root.is_dir():
        return []
    found = []
    for entry in sorted(root.iterdir()):
        if not _ADDRESS.match(entry.name) or not (entry / "vendor").exists():
            continue
        try:  # other vendors' functions are skipped before their remaining attributes are read
            if _read_hex(entry / "vendor") != vendor:
                continue
        except (OSError, ValueError):
            continue
        function = read_function(entry.name, root)
        if (function.class_code >> 16) in GPU_BASE_CLASSES:
            found.append(function)
    return found


def _check_range(offset: int, length: int, size: int, what: str) -> None:
    if offset < 0 or length < 0 or offset + length > size:
        raise IndexError(f"{what}: access of {length} bytes at {offset:#x} is outside the BAR's {size:#x} bytes")


class ByteBAR(ABC):
    """BAR0, VRAM seen as bytes."""

    size: int

    @abstractmethod
    def read(self, offset: int, length: int) -> bytes: ...

    @abstractmethod
    def write(self, offset: int, data: bytes) -> None: ...

    def view(self) -> memoryview:
        """The whole BAR as writable memory, for CPU access to VRAM without a copy per access."""
        raise NotImplementedError(f"{type(self).__name__} has no memory view")


class RegisterBAR(ABC):
    """BAR5, registers as 32-bit dwords indexed by dword, plus a byte view indexed by byte offset."""

    size: int

    @abstractmethod
    def read32(self, dword: int) -> int: ...

    @abstractmethod
    def write32(self, dword: int, value: int) -> None: ...

    @abstractmethod
    def read8(self, offset: int) -> int: ...

    @abstractmethod
    def write8(self, offset: int, value: int) -> None: ...


class DoorbellBAR(ABC):
    """BAR2, doorbells as 64-bit words."""

    size: int

    @abstractmethod
    def read64(self, index: int) -> int: ...

    @abstractmethod
    def write64(self, index: int, value: int) -> None: ...


class _MappedBAR:
    """Typed memoryviews over one mmap; each access is one load or store of the view's width."""

    def __init__(self, mm: mmap.mmap, what: str):
        self.mm, self.what, self.size = mm, what, len(mm)
        self.bytes = memoryview(mm)
        self.dwords = self.bytes[: self.size - self.size % 4].cast("I")
        self.qwords = self.bytes[: self.size - self.size % 8].cast("Q")

    def release(self) -> None:
        # the views must go before the mmap, or mmap.close() fails with "exported pointers exist"
        for view in (self.qwords, self.dwords, self.bytes):
            view.release()
        self.mm.close()


class MmapByteBAR(ByteBAR):
    def __init__(self, bar: _MappedBAR):
        self._bar, self.size = bar, bar.size

    def view(self) -> memoryview:
        return self._bar.bytes

    def read(self, offset: int, length: int) -> bytes:
        _check_range(offset, length, self.size, self._bar.what)
        return bytes(self._bar.bytes[offset : offset + length])

    def write(self, offset: int, data: bytes) -> None:
        _check_range(offset, len(data), self.size, self._bar.what)
        self._bar.bytes[offset : offset + len(data)] = data


class MmapRegisterBAR(RegisterBAR):
    def __init__(self, bar: _MappedBAR):
        self._bar, self.size = bar, bar.size

    def read32(self, dword: int) -> int:
        _check_range(dword * 4, 4, self.size, self._bar.what)
        return self._bar.dwords[dword]

    def write32(self, dword: int, value: int) -> None:
        _check_range(dword * 4, 4, self.size, self._bar.what)
        self._bar.dwords[dword] = value & 0xFFFFFFFF

    def read8(self, offset: int) -> int:
        _check_range(offset, 1, self.size, self._bar.what)
        return self._bar.bytes[offset]

    def write8(self, offset: int, value: int) -> None:
        _check_range(offset, 1, self.size, self._bar.what)
        self._bar.bytes[offset] = value & 0xFF


class MmapDoorbellBAR(DoorbellBAR):
    def __init__(self, bar: _MappedBAR):
        self._bar, self.size = bar, bar.size

    def read64(self, index: int) -> int:
        _check_range(index * 8, 8, self.size, self._bar.what)
        return self._bar.qwords[index]

    def write64(self, index: int, value: int) -> None:
        _check_range(index * 8, 8, self.size, self._bar.what)
        self._bar.qwords[index] = value & 0xFFFFFFFFFFFFFFFF


class PCIDevice(ABC):
    """One opened PCI function: BAR views and config space."""

    function: PCIFunction

    @property
    def address(self) -> str:
        return self.function.address

    @abstractmethod
    def map_vram(self) -> ByteBAR: ...

    @abstractmethod
    def map_doorbells(self) -> DoorbellBAR: ...

    @abstractmethod
    def map_registers(self) -> RegisterBAR: ...

    @abstractmethod
    def config_read(self, offset: int, size: int) -> int: ...

    @abstractmethod
    def config_write(self, offset: int, size: int, value: int) -> None: ...

    @abstractmethod
    def close(self) -> None: ...

    def set_bus_master(self) -> int:
        """Set PCI_COMMAND's bus-master bit and read it back (the read flushes the write); returns the read value."""
        command = self.config_read(PCI_COMMAND, 2)
        self.config_write(PCI_COMMAND, 2, command | PCI_COMMAND_MASTER)
        return self.config_read(PCI_COMMAND, 2)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class FileBackedPCIDevice(PCIDevice):
    """Shared mapping and config plumbing: subclasses say where a BAR lives (file, offset) and where config space is."""

    def __init__(self) -> None:
        self._maps: dict[int, _MappedBAR] = {}
        self._fds: list[int] = []
        self._closed = False

    @abstractmethod
    def _bar_location(self, bar: int) -> tuple[int, int, int]:
        """(fd, offset, size) of a BAR."""

    @abstractmethod
    def _config_location(self) -> tuple[int, int]:
        """(fd, offset) of config space."""

    def _check_open(self) -> None:
        if self._closed:
            raise PCIError(f"{self.address} is closed")

    def _map(self, bar: int) -> _MappedBAR:
        self._check_open()
        if bar not in self._maps:
            fd, offset, size = self._bar_location(bar)
            if size == 0:
                raise PCIError(f"BAR{bar} of {self.address} has size 0 (not implemented or not a memory BAR)")
            try:
                mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=offset)
            except OSError as e:
                raise PCIError(f"cannot map BAR{bar} of {self.address} ({size:#x} bytes at {offset:#x}): {e}") from e
            self._maps[bar] = _MappedBAR(mm, f"BAR{bar} of {self.address}")
        return self._maps[bar]

    def map_vram(self) -> ByteBAR:
        return MmapByteBAR(self._map(BAR_VRAM))

    def map_doorbells(self) -> DoorbellBAR:
        return MmapDoorbellBAR(self._map(BAR_DOORBELLS))

    def map_registers(self) -> RegisterBAR:
        return MmapRegisterBAR(self._map(BAR_REGISTERS))

    def config_read(self, offset: int, size: int) -> int:
        self._check_open()
        fd, base = self._config_location()
        data = os.pread(fd, size, base + offset)
        if len(data) != size:
            raise PCIError(f"config read of {size} bytes at {offset:#x} on {self.address} returned {len(data)} bytes")
        return int.from_bytes(data, "little")

    def config_write(self, offset: int, size: int, value: int) -> None:
        self._check_open()
        fd, base = self._config_location()
        os.pwrite(fd, value.to_bytes(size, "little"), base + offset)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for bar in self._maps.values():
            bar.release()
        for fd in self._fds:
            os.close(fd)
        self._maps.clear()
        self._fds.clear()


class SysfsPCIDevice(FileBackedPCIDevice):
    """A function opened through sysfs: `resourceN` files for BARs, `config` for config space. Needs root."""

    def __init__(self, address: str, sysfs_root: str | Path = SYSFS_PCI_DEVICES):
        super().__init__()
        self.function = read_function(address, sysfs_root)
        self.path = Path(sysfs_root) / self.function.address
        self._enable()
        self._config_fd = self._open(self.path / "config")

    def _open(self, path: Path) -> int:
        try:
            fd = os.open(path, os.O_RDWR | os.O_SYNC)
        except OSError as e:
            raise PCIError(f"cannot open {path}: {e} (root is needed, and the function must exist)") from e
        self._fds.append(fd)
        return fd

    def _enable(self) -> None:
        # an unbound function may have memory decoding off, which would make every BAR read all-ones
        enable = self.path / "enable"
        if enable.exists() and enable.read_text().strip() != "1":
            try:
                enable.write_text("1")
            except OSError as e:
                raise PCIError(f"cannot enable {self.address} through {enable}: {e}") from e

    def _bar_location(self, bar: int) -> tuple[int, int, int]:
        path = self.path / f"resource{bar}"
        if not path.exists():
            raise PCIError(f"{self.address} has no {path.name} in sysfs (BAR{bar} not present)")
        return self._open(path), 0, os.path.getsize(path)

    def _config_location(self) -> tuple[int, int]:
        return self._config_fd, 0
