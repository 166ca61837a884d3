"""sysfs enumeration and the real mmap/config path, run on plain files in a fake sysfs tree; VFIO with a fake kernel."""

from __future__ import annotations

import os
import struct

import pytest
from amd_testlib import add_bar_files, make_function

from fusegrad.runtime.support.amd import vfio
from fusegrad.runtime.support.amd.device import AMDDevice
from fusegrad.runtime.support.amd.discovery import MI350X_VF_IPS
from fusegrad.runtime.support.amd.errors import PCIError
from fusegrad.runtime.support.amd.pci import SysfsPCIDevice, list_functions, normalize_address, read_function
from fusegrad.runtime.support.amd.regs import MAILBOX_TRN_BYTE, PCI_COMMAND, PCI_COMMAND_MASTER, RCC_CONFIG_MEMSIZE


@pytest.fixture
def sysfs(tmp_path):
    root = tmp_path / "bus" / "pci" / "devices"
    root.mkdir(parents=True)
    make_function(root, "0000:82:00.0", 0x1002, 0x75A0, driver="gim")
    make_function(root, "0000:83:00.0", 0x1002, 0x75B0, physfn="0000:82:00.0")
    make_function(root, "0000:84:00.0", 0x1002, 0x75B0)  # a VF as a guest sees it: no physfn link
    make_function(root, "0000:84:00.1", 0x1002, 0xAB38, class_code=0x040300)  # HDMI audio, not a GPU
    make_function(root, "0000:00:02.0", 0x8086, 0x1234, class_code=0x030000)
    return root


def test_list_functions_filters_and_reads_attributes(sysfs):
    functions = list_functions(sysfs)
    assert [f.address for f in functions] == ["0000:82:00.0", "0000:83:00.0", "0000:84:00.0"]
    pf, vf, guest_vf = functions
    assert pf.driver == "gim" and not pf.is_vf and pf.name == "Instinct MI350X"
    assert vf.physfn == "0000:82:00.0" and vf.is_vf and vf.driver is None
    assert guest_vf.is_vf and guest_vf.physfn is None and guest_vf.name == "Instinct MI350X VF"
    assert (vf.subsystem_vendor, vf.subsystem_device, vf.class_code) == (0x1002, 0x75A0, 0x120000)


def test_missing_sysfs_root_lists_nothing(tmp_path):
    assert list_functions(tmp_path / "nope") == []


def test_read_function_errors(sysfs):
    with pytest.raises(PCIError, match="no PCI function 0000:99:00.0"):
        read_function("99:00.0", sysfs)
    (sysfs / "0000:83:00.0" / "vendor").write_text("garbage")
    with pytest.raises(PCIError, match="cannot read sysfs attributes of 0000:83:00.0"):
        read_function("0000:83:00.0", sysfs)


@pytest.mark.parametrize(("text", "expected"), [("83:00.0", "0000:83:00.0"), ("0000:C1:00.7", "0000:c1:00.7")])
def test_normalize_address(text, expected):
    assert normalize_address(text) == expected


@pytest.mark.parametrize("text", ["83:00", "0000:83:00.8", "gpu0", ""])
def test_normalize_address_rejects(text):
    with pytest.raises(ValueError, match="not a PCI address"):
        normalize_address(text)


def test_sysfs_device_maps_resource_files_and_config(sysfs):
    path = sysfs / "0000:84:00.0"
    add_bar_files(path, vram_mib=1024)
    with SysfsPCIDevice("84:00.0", sysfs) as pci:
        assert (path / "enable").read_text() == "1"
        regs, vram, doorbells = pci.map_registers(), pci.map_vram(), pci.map_doorbells()
        assert regs.read32(RCC_CONFIG_MEMSIZE) == 1024 and vram.size == 1024 << 20
        regs.write32(0xE5E, 0x11223344)
        assert regs.read8(MAILBOX_TRN_BYTE) == 0x44 and regs.read8(MAILBOX_TRN_BYTE + 3) == 0x11
        regs.write8(MAILBOX_TRN_BYTE + 1, 0xAA)
        assert regs.read32(0xE5E) == 0x1122AA44
        doorbells.write64(3, 0x0102030405060708)
        vram.write(4096, b"fusegrad")
        assert vram.read(4096, 8) == b"fusegrad"
        with pytest.raises(IndexError, match=r"BAR5 of 0000:84:00.0.*outside"):
            regs.read32(regs.size // 4)
        assert pci.set_bus_master() & PCI_COMMAND_MASTER
        assert pci.config_read(0, 2) == 0x1002
    assert struct.unpack_from("<Q", (path / "resource2").read_bytes(), 24)[0] == 0x0102030405060708
    assert struct.unpack_from("<H", (path / "config").read_bytes(), PCI_COMMAND)[0] & PCI_COMMAND_MASTER
    with pytest.raises(PCIError, match="closed"):
        pci.config_read(0, 2)
    with pytest.raises(PCIError, match="closed"):
        pci.map_vram()


def test_real_path_probes_a_pf_end_to_end(sysfs):
    add_bar_files(sysfs / "0000:84:00.0", vram_mib=1024, vf=False)
    with SysfsPCIDevice("0000:84:00.0", sysfs) as pci, AMDDevice(pci) as dev:
        assert not dev.is_vf and dev.lease is None
        assert dev.discovery.ips == MI350X_VF_IPS and dev.vram_size == 1024 << 20


def test_missing_resource_file_is_a_clear_error(sysfs):
    (sysfs / "0000:83:00.0" / "config").write_bytes(bytes(256))
    with SysfsPCIDevice("0000:83:00.0", sysfs) as pci, pytest.raises(PCIError, match="no resource0"):
        pci.map_vram()


# region index -> (offset, size) in the fake VFIO device file: BAR0, BAR2, BAR5, config space
VFIO_REGIONS = {0: (0, 1 << 20), 2: (1 << 20, 1 << 16), 5: (2 << 20, 512 << 10), 7: (3 << 20, 4096)}


class FakeVFIOKernel:
    """Answers the VFIO ioctls the driver issues; the 'device fd' is a plain file holding the regions back to back."""

    def __init__(self, device_file):
        self.device_file, self.calls = device_file, []

    def __call__(self, fd, request, arg=0):
        self.calls.append(request)
        if request == vfio.VFIO_GET_API_VERSION:
            return vfio.VFIO_API_VERSION
        if request == vfio.VFIO_CHECK_EXTENSION:
            return int(arg == vfio.VFIO_NOIOMMU_IOMMU)
        if request == vfio.VFIO_GROUP_GET_DEVICE_FD:
            assert bytes(arg) == b"0000:83:00.0\0"
            return os.open(self.device_file, os.O_RDWR)
        if request == vfio.VFIO_DEVICE_GET_REGION_INFO:
            argsz, _, index, _, _, _ = vfio.REGION_INFO.unpack(arg)
            assert argsz == vfio.REGION_INFO.size
            offset, size = VFIO_REGIONS.get(index, (0, 0))
            arg[:] = vfio.REGION_INFO.pack(argsz, 0b111, index, 0, size, offset)
        return 0


def test_vfio_no_iommu_path(sysfs, tmp_path, monkeypatch):
    path = sysfs / "0000:83:00.0"
    os.symlink("../../../../kernel/iommu_groups/7", path / "iommu_group")
    (path / "driver_override").write_text("")
    (sysfs.parent / "drivers_probe").write_text("")
    dev_vfio = tmp_path / "dev-vfio"
    dev_vfio.mkdir()
    for name in ("vfio", "noiommu-7"):
        (dev_vfio / name).write_bytes(b"")
    device_file = tmp_path / "vfio-device"
    image = bytearray(3 << 20) + bytearray(4096)
    image[(3 << 20) : (3 << 20) + 2] = (0x1002).to_bytes(2, "little")
    image[(2 << 20) + RCC_CONFIG_MEMSIZE * 4] = 77
    device_file.write_bytes(bytes(image))
    kernel = FakeVFIOKernel(device_file)
    monkeypatch.setattr(vfio, "_ioctl", kernel)
    with vfio.VFIOPCIDevice("0000:83:00.0", sysfs, dev_vfio) as pci:
        assert pci.config_read(0, 2) == 0x1002
        assert pci.map_registers().read32(RCC_CONFIG_MEMSIZE) == 77
        assert pci.map_vram().size == 1 << 20
    assert (path / "driver_override").read_text() == "vfio-pci"
    assert (sysfs.parent / "drivers_probe").read_text() == "0000:83:00.0"
    assert kernel.calls[:5] == [
        vfio.VFIO_GET_API_VERSION,
        vfio.VFIO_CHECK_EXTENSION,
        vfio.VFIO_GROUP_SET_CONTAINER,
        vfio.VFIO_SET_IOMMU,
        vfio.VFIO_GROUP_GET_DEVICE_FD,
    ]
    assert vfio.VFIO_GROUP_GET_DEVICE_FD == 15210  # _IO(';', 106), as in the Linux UAPI


def test_vfio_refuses_a_function_bound_elsewhere(sysfs):
    with pytest.raises(PCIError, match="bound to gim"):
        vfio.VFIOPCIDevice("0000:82:00.0", sysfs)
