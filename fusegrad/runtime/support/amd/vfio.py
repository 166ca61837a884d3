"""Optional VFIO no-IOMMU access: the function is bound to vfio-pci and BARs are mapped from the VFIO device fd.

Guests without an IOMMU (the MI350X KVM guest has none) need vfio's `enable_unsafe_noiommu_mode=1`; the group then
appears as /dev/vfio/noiommu-<group>. Ioctl numbers are the Linux UAPI's: _IO(';', 100 + n).
"""

from __future__ import annotations

import fcntl
import os
import struct
from pathlib import Path

from .errors import PCIError
from .pci import SYSFS_PCI_DEVICES, FileBackedPCIDevice, read_function

_VFIO_TYPE, _VFIO_BASE = ord(";"), 100
VFIO_GET_API_VERSION = (_VFIO_TYPE << 8) | (_VFIO_BASE + 0)
VFIO_CHECK_EXTENSION = (_VFIO_TYPE << 8) | (_VFIO_BASE + 1)
VFIO_SET_IOMMU = (_VFIO_TYPE << 8) | (_VFIO_BASE + 2)
VFIO_GROUP_SET_CONTAINER = (_VFIO_TYPE << 8) | (_VFIO_BASE + 4)
VFIO_GROUP_GET_DEVICE_FD = (_VFIO_TYPE << 8) | (_VFIO_BASE + 6)
VFIO_DEVICE_GET_REGION_INFO = (_VFIO_TYPE << 8) | (_VFIO_BASE + 8)
VFIO_API_VERSION = 0
VFIO_NOIOMMU_IOMMU = 8
VFIO_PCI_CONFIG_REGION_INDEX = 7
VFIO_REGION_INFO_FLAG_MMAP = 1 << 2
# struct vfio_region_info {u32 argsz, flags, index, cap_offset; u64 size, offset}
REGION_INFO = struct.Struct("<IIIIQQ")


def _ioctl(fd: int, request: int, arg: int | bytearray = 0) -> int:
    """One ioctl; a separate function so tests can stand in for the kernel."""
    return fcntl.ioctl(fd, request, arg, True) if isinstance(arg, bytearray) else fcntl.ioctl(fd, request, arg)


class VFIOPCIDevice(FileBackedPCIDevice):
    """A function bound to vfio-pci, used through a no-IOMMU VFIO group."""

    def __init__(self, address: str, sysfs_root: str | Path = SYSFS_PCI_DEVICES, dev_vfio: str | Path = "/dev/vfio"):
        super().__init__()
        self.function = read_function(address, sysfs_root)
        self.path = Path(sysfs_root) / self.function.address
        try:
            self._bind(Path(sysfs_root))
            group = os.path.basename(os.readlink(self.path / "iommu_group"))
            self._container = self._open(Path(dev_vfio) / "vfio")
            if (version := _ioctl(self._container, VFIO_GET_API_VERSION)) != VFIO_API_VERSION:
                raise PCIError(f"VFIO API version {version}, expected {VFIO_API_VERSION}")
            if not _ioctl(self._container, VFIO_CHECK_EXTENSION, VFIO_NOIOMMU_IOMMU):
                raise PCIError("VFIO has no no-IOMMU support (load vfio with enable_unsafe_noiommu_mode=1)")
            self._group = self._open(Path(dev_vfio) / f"noiommu-{group}")
            _ioctl(self._group, VFIO_GROUP_SET_CONTAINER, bytearray(struct.pack("<i", self._container)))
            _ioctl(self._container, VFIO_SET_IOMMU, VFIO_NOIOMMU_IOMMU)
            self._device = _ioctl(self._group, VFIO_GROUP_GET_DEVICE_FD, bytearray(self.address.encode() + b"\0"))
            self._fds.append(self._device)
            self._config_offset = self._region(VFIO_PCI_CONFIG_REGION_INDEX)[2]
        except OSError as e:
            self.close()
            raise PCIError(f"cannot open {self.address} through VFIO no-IOMMU mode: {e}") from e
        except PCIError:
            self.close()
            raise

    def _bind(self, sysfs_root: Path) -> None:
        if self.function.driver == "vfio-pci":
            return
        if self.function.driver is not None:
            raise PCIError(f"{self.address} is bound to {self.function.driver}; unbind it before using VFIO")
        (self.path / "driver_override").write_text("vfio-pci")
        (sysfs_root.parent / "drivers_probe").write_text(self.address)

    def _open(self, path: Path) -> int:
        fd = os.open(path, os.O_RDWR)
        self._fds.append(fd)
        return fd

    def _region(self, index: int) -> tuple[int, int, int]:
        """(flags, size, offset) of a VFIO region."""
        info = bytearray(REGION_INFO.pack(REGION_INFO.size, 0, index, 0, 0, 0))
        _ioctl(self._device, VFIO_DEVICE_GET_REGION_INFO, info)
        _, flags, _, _, size, offset = REGION_INFO.unpack(info)
        return flags, size, offset

    def _bar_location(self, bar: int) -> tuple[int, int, int]:
        flags, size, offset = self._region(bar)
        if size and not flags & VFIO_REGION_INFO_FLAG_MMAP:
            raise PCIError(f"BAR{bar} of {self.address} cannot be mapped through VFIO (region flags {flags:#x})")
        return self._device, offset, size

    def _config_location(self) -> tuple[int, int]:
        return self._device, self._config_offset
