"""fusegrad-amd: list AMD GPU functions, or probe one (map, detect VF, take the lease, discovery, release).

    fusegrad-amd list [--sim] [--sysfs-root DIR]
    fusegrad-amd probe ADDRESS [--sim] [--force] [--vfio] [--plan] [--event-timeout S] [--sysfs-root DIR]
    fusegrad-amd run ADDRESS [--sim] [--force] [--vfio] [--event-timeout S] [--sysfs-root DIR]

Exit status: 0 success, 1 the device failed, 2 refused or bad arguments.
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
from collections.abc import Sequence
from typing import TextIO

from . import pm4
from .device import AMDDevice
from .errors import AccessRefused, AMDError
from .gpu import AMDGPU
from .limits import check_seconds
from .mailbox import MailboxTimeouts
from .pci import (
    AMD_VENDOR,
    SYSFS_PCI_DEVICES,
    PCIDevice,
    PCIFunction,
    SysfsPCIDevice,
    list_functions,
    normalize_address,
    read_function,
)
from .sim import SimConfig, SimPCIDevice
from .vfio import VFIOPCIDevice

EXIT_OK, EXIT_FAILED, EXIT_REFUSED = 0, 1, 2


def _kind(function: PCIFunction) -> str:
    if function.physfn is not None:
        return f"VF of {function.physfn}"
    return "VF" if function.is_vf else "PF"


def _list(args: argparse.Namespace, out: TextIO) -> int:
    functions = [SimConfig().function()] if args.sim else list_functions(args.sysfs_root)
    if not functions:
        print(f"No AMD GPU found: no AMD display or accelerator function under {args.sysfs_root}.", file=out)
        return EXIT_OK
    rows = [("ADDRESS", "IDS", "SUBSYSTEM", "KIND", "DRIVER", "NAME")]
    rows += [
        (
            f.address,
            f.ids,
            f"{f.subsystem_vendor:04x}:{f.subsystem_device:04x}",
            _kind(f),
            f.driver or "-",
            f.name + (" (simulated)" if args.sim else ""),
        )
        for f in functions
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1], file=out)
    return EXIT_OK


def check_access(function: PCIFunction, *, force: bool, vfio: bool) -> None:
    """Raise AccessRefused for a non-AMD function always, and for a bound driver or a non-root caller unless forced."""
    if function.vendor != AMD_VENDOR:
        raise AccessRefused(f"{function.address} is not an AMD function (vendor {function.vendor:#06x}); refusing")
    bound = function.driver is not None and not (vfio and function.driver == "vfio-pci")
    if bound and not force:
        raise AccessRefused(
            f"{function.address} is bound to kernel driver '{function.driver}'; touching its BARs would race that "
            f"driver. Unbind it first (echo {function.address} > /sys/bus/pci/drivers/{function.driver}/unbind) or "
            "pass --force"
        )
    if os.geteuid() != 0 and not force:
        raise AccessRefused(
            f"probing {function.address} needs root (BAR resource files and config space are "
            f"root-only; running as uid {os.geteuid()}); run as root or pass --force"
        )


def _open(args: argparse.Namespace) -> PCIDevice:
    if args.sim:
        return SimPCIDevice(SimConfig(address=normalize_address(args.address or SimConfig.address)))
    if args.address is None:
        raise ValueError("probe needs a PCI ADDRESS (or --sim)")
    function = read_function(args.address, args.sysfs_root)
    check_access(function, force=args.force, vfio=args.vfio)
    if args.vfio:
        return VFIOPCIDevice(function.address, args.sysfs_root)
    return SysfsPCIDevice(function.address, args.sysfs_root)


def _report(dev: AMDDevice, out: TextIO, plan: bool) -> None:
    fn = dev.pci.function
    print(f"{fn.address}  {fn.ids}  {fn.name}{'  (simulated)' if isinstance(dev.pci, SimPCIDevice) else ''}", file=out)
    print(f"function: {'VF' if dev.is_vf else 'PF'} (RCC_IOV_FUNC_IDENTIFIER={dev.func_identifier:#010x})", file=out)
    if dev.lease is not None and dev.init_data is not None:
        print(
            f"lease: acquired (INIT_DATA_READY critical-region v{dev.init_data.data[0]}, READY_TO_ACCESS_GPU)", file=out
        )
    layout = dev.memory.layout
    print(
        f"VRAM: {dev.vram_size >> 20} MiB; allocator paddr_base {layout.paddr_base:#x}, main region "
        f"[{layout.main[0]:#x}, {layout.main[1]:#x})",
        file=out,
    )
    d = dev.discovery
    print(
        f"discovery v{d.version[0]}.{d.version[1]} (IP table v{d.ip_table_version}), {len(d.ips)} IP blocks:", file=out
    )
    for ip in d.ips:
        version = ".".join(map(str, ip.version))
        print(
            f"  {ip.name:<8} hw_id {ip.hw_id:>3}  instance {ip.instance}  version {version:<9} bases "
            + " ".join(f"{b:#x}" for b in ip.bases),
            file=out,
        )
    print(
        f"boot plan: {'VF' if dev.is_vf else 'PF'}, {len(dev.plan.steps)} steps, {len(dev.plan.skipped)} skipped "
        f"({len(dev.deferred)} IP steps deferred to IP-block drivers)",
        file=out,
    )
    if plan:
        print(dev.plan, file=out)


def _probe(args: argparse.Namespace, out: TextIO) -> int:
    timeouts = MailboxTimeouts(event_s=args.event_timeout)
    with _open(args) as pci, AMDDevice(pci, timeouts) as dev:
        _report(dev, out, args.plan)
    if dev.lease is not None:
        sent = "REL_GPU_INIT_ACCESS sent" if dev.lease.release_error is None else f"failed: {dev.lease.release_error}"
        print(f"lease: released ({sent})", file=out)
    return EXIT_OK


def _run(args: argparse.Namespace, out: TextIO) -> int:
    """Boot to a compute queue and an SDMA ring, release the lease, run work through doorbells, print the traffic."""
    timeouts = MailboxTimeouts(event_s=args.event_timeout)
    with _open(args) as pci, AMDGPU(pci, timeouts) as gpu:
        print(f"{pci.address}: booted; {len(gpu.regs.writes())} register writes inside the lease:", file=out)
        for name, value in gpu.regs.writes():
            print(f"  W {name:<44} {value:#010x}", file=out)
        if gpu.dev.is_vf:
            print("lease: released after boot; from here on only doorbells and memory", file=out)
        src_p, src = gpu.alloc_mapped(4096)
        dst_p, dst = gpu.alloc_mapped(4096)
        gpu.run_sdma([pm4.sdma_fill(src, 0x3F800000, 4096), pm4.sdma_copy(dst, src, 4096)])
        copied = struct.unpack_from("<4f", gpu.bar, dst_p)
        gate = gpu.new_signal()
        struct.pack_into("<Q", gpu.bar, gpu.signal_paddr(gate), 1)
        gpu.run_compute([pm4.wait_reg_mem(gate, 1), pm4.acquire_mem()])
        gpu.free_mapped(dst_p, dst)
        print(f"SDMA fill + copy: {copied}; compute queue timeline at {gpu.timeline}", file=out)
        if isinstance(pci, SimPCIDevice):
            print("what went over the rings (simulated command processor and SDMA):", file=out)
            for line in pci.sim.gpu.trace:
                print(f"  {line}", file=out)
        else:
            print("ring traffic is only traced on the simulator", file=out)
    if isinstance(pci, SimPCIDevice):
        print("mailbox requests: " + " ".join(str(r) for r in pci.requests()), file=out)
    return EXIT_OK


def _event_timeout(text: str) -> float:
    """--event-timeout as seconds; argparse's float() alone would let nan and inf through, and those waits never end."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    try:
        return check_seconds("the event timeout", value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not usable: {e}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fusegrad-amd", description="AMD GPU functions through userspace (MI350X SR-IOV VF passthrough included)."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (
        ("list", "list AMD GPU functions on this host"),
        ("probe", "map, detect, take the VF lease, print discovery and VRAM size, release"),
        ("run", "boot VM, IH, SDMA and a compute queue, release the lease, run work by doorbells, print ring traffic"),
    ):
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument("--sim", action="store_true", help="use the simulated MI350X VF instead of sysfs")
        sub.add_argument("--sysfs-root", default=SYSFS_PCI_DEVICES, help="PCI devices directory (default: %(default)s)")
    for name in ("probe", "run"):
        sub = commands.choices[name]
        sub.add_argument("address", nargs="?", help="PCI address, e.g. 0000:83:00.0 (optional with --sim)")
        sub.add_argument("--force", action="store_true", help="touch the device even if a driver is bound or not root")
        sub.add_argument("--vfio", action="store_true", help="go through vfio-pci in no-IOMMU mode")
        sub.add_argument(
            "--event-timeout",
            type=_event_timeout,
            default=MailboxTimeouts.event_s,
            help="seconds to wait for each PF event, per attempt (default: %(default)s)",
        )
    commands.choices["probe"].add_argument("--plan", action="store_true", help="also print the boot plan, step by step")
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = out or sys.stdout
    try:
        return {"list": _list, "probe": _probe, "run": _run}[args.command](args, out)
    except (AccessRefused, ValueError) as e:
        print(f"fusegrad-amd: refused: {e}", file=sys.stderr)
        return EXIT_REFUSED
    except (AMDError, OSError) as e:
        print(f"fusegrad-amd: error: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
