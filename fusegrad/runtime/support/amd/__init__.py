"""AMD userspace driver layer: PCI BARs, VF mailbox and lease, IP discovery, VRAM allocator, boot plan, simulator.

Stdlib only, and independent of fusegrad's tensor layers.
"""

from .bootplan import PF_OWNED, BootPlan, BootStep, plan_boot
from .device import AMDDevice
from .discovery import MI350X_VF_IPS, Discovery, IPBlock, build_discovery, parse_discovery, read_discovery
from .errors import (
    AccessRefused,
    AMDError,
    DeviceError,
    DiscoveryError,
    FLRNotified,
    MailboxAckStuck,
    MailboxAckTimeout,
    MailboxError,
    MailboxEventTimeout,
    OutOfMemory,
    PCIError,
    PFEventError,
    PFRejected,
    UnrecoverableError,
)
from .lease import VFLease
from .mailbox import Event, Mailbox, MailboxTimeouts, Message, Request, is_vf
from .memory import PhysicalMemory, RegionAllocator
from .pci import PCIDevice, PCIFunction, SysfsPCIDevice, list_functions, read_function
from .sim import SimConfig, SimPCIDevice, open_sim

__all__ = [
    "MI350X_VF_IPS",
    "PF_OWNED",
    "AMDDevice",
    "AMDError",
    "AccessRefused",
    "BootPlan",
    "BootStep",
    "DeviceError",
    "Discovery",
    "DiscoveryError",
    "Event",
    "FLRNotified",
    "IPBlock",
    "Mailbox",
    "MailboxAckStuck",
    "MailboxAckTimeout",
    "MailboxError",
    "MailboxEventTimeout",
    "MailboxTimeouts",
    "Message",
    "OutOfMemory",
    "PCIDevice",
    "PCIError",
    "PCIFunction",
    "PFEventError",
    "PFRejected",
    "PhysicalMemory",
    "RegionAllocator",
    "Request",
    "SimConfig",
    "SimPCIDevice",
    "SysfsPCIDevice",
    "UnrecoverableError",
    "VFLease",
    "build_discovery",
    "is_vf",
    "list_functions",
    "open_sim",
    "parse_discovery",
    "plan_boot",
    "read_discovery",
    "read_function",
]
