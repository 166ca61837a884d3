"""AMDDevice: maps BARs, detects a VF, takes the lease, runs discovery, builds the allocator, follows the boot plan.

The steps come from `bootplan.plan_boot`; driver-layer steps run here, IP-block steps run through `ip_handlers`
that higher layers pass in (steps without a handler are listed in `deferred`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Self

from .bootplan import IP_STEP_NAMES, MAX_XCCS, STEPS_BY_NAME, BootPlan, BootStep, plan_boot
from .discovery import Discovery, read_discovery
from .errors import DeviceError, DiscoveryError, PFEventError
from .lease import VFLease
from .limits import check_count
from .mailbox import GPU_CRIT_REGION_V2, Mailbox, MailboxTimeouts, Message, read_func_identifier
from .memory import BOOT_REGION_SIZE, RESERVED_VRAM_SIZE, VF_PADDR_BASE, PhysicalMemory
from .pci import PCIDevice
from .regs import (
    FUNC_IDENTIFIER_IS_VF,
    MM_DATA,
    MM_INDEX,
    MM_INDEX_ENABLE,
    MM_INDEX_HI,
    PCI_COMMAND_MASTER,
    RCC_CONFIG_MEMSIZE,
)

IPHandler = Callable[["AMDDevice"], None]
ALL_ONES = 0xFFFFFFFF


class AMDDevice:
    """One opened AMD GPU function, usable up to VRAM and registers. Close it (or use `with`) to return the lease."""

    def __init__(
        self,
        pci: PCIDevice,
        timeouts: MailboxTimeouts | None = None,
        *,
        xccs: int = 1,
        ip_handlers: Mapping[str, IPHandler] | None = None,
    ):
        if timeouts is not None and not isinstance(timeouts, MailboxTimeouts):
            raise TypeError(f"timeouts must be MailboxTimeouts or None, got {timeouts!r} ({type(timeouts).__name__})")
        self.pci, self.timeouts, self.xccs = (
            pci,
            timeouts or MailboxTimeouts(),
            check_count("xccs", xccs, maximum=MAX_XCCS),
        )
        self.ip_handlers = dict(ip_handlers or {})
        if unknown := sorted(set(self.ip_handlers) - IP_STEP_NAMES):
            raise ValueError(f"ip_handlers names unknown IP steps {unknown}; known steps are {sorted(IP_STEP_NAMES)}")
        self.trace: list[str] = []  # steps started, in order
        self.deferred: list[str] = []  # IP steps of the plan that had no handler
        self.mailbox: Mailbox | None = None
        self.lease: VFLease | None = None
        self.booted = self.closed = False
        try:
            # the plan depends on what detection finds, so its first two steps run before it exists
            for name in ("map_bars", "detect_vf"):
                self._run(STEPS_BY_NAME[name])
            self.plan: BootPlan = plan_boot(self.is_vf, xccs)
            for step in self.plan.phase("boot"):
                if step.name not in ("map_bars", "detect_vf"):
                    self._run(step)
            self.booted = True
        except BaseException:
            self._return_lease()  # a lease taken before the failure goes back now, not at garbage collection
            self.closed = True
            raise

    # -- driver-layer steps -------------------------------------------------------------------------------------------
    def _run(self, step: BootStep) -> None:
        self.trace.append(step.name)
        if step.layer == "driver":
            self._DRIVER_STEPS[step.name](self)
        elif (handler := self.ip_handlers.get(step.name)) is not None:
            handler(self)
        else:
            self.deferred.append(step.name)

    def _map_bars(self) -> None:
        self.vram, self.doorbells, self.regs = self.pci.map_vram(), self.pci.map_doorbells(), self.pci.map_registers()

    def _detect_vf(self) -> None:
        self.func_identifier = read_func_identifier(self.regs)
        if self.func_identifier == ALL_ONES:
            raise DeviceError(
                f"{self.pci.address}: RCC_IOV_FUNC_IDENTIFIER reads {ALL_ONES:#x}; the function is not "
                "responding (in reset, BAR5 not decoding, or removed)"
            )
        self.is_vf = bool(self.func_identifier & FUNC_IDENTIFIER_IS_VF)
        if self.is_vf:
            self.mailbox = Mailbox(self.regs, self.timeouts)
            self.lease = VFLease(self.mailbox)

    def _request_init_data(self) -> None:
        # Conflict (§12 item 2): the seed's comment says "only when discovery isn't readable", its code always asks.
        # Always asking is safer: a table readable before the grant could be stale, and MMIO writes stay gated anyway.
        assert self.lease is not None
        self.lease.request_init_data()

    def _request_init_access(self) -> None:
        assert self.lease is not None
        self.lease.request_init_access()

    def _read_vram_size(self) -> None:
        memsize_mib = self.regs.read32(RCC_CONFIG_MEMSIZE)
        if memsize_mib in (0, ALL_ONES):
            raise DeviceError(f"{self.pci.address}: RCC_CONFIG_MEMSIZE reads {memsize_mib:#x} MiB; no usable VRAM size")
        self.vram_size = memsize_mib << 20

    @property
    def large_bar(self) -> bool:
        """Whether BAR0 maps all of VRAM; otherwise VRAM beyond it goes through MM_INDEX/MM_DATA."""
        return self.vram.size >= self.vram_size

    def _discovery(self) -> None:
        read = self.vram.read if self.large_bar else self._read_vram_indirect
        try:
            self.discovery: Discovery = read_discovery(read, self.vram_size, hint=self._discovery_hint())
        except DiscoveryError as e:
            # an FLR or an RMA closes the framebuffer too; when the PF said so, that is the cause to report
            try:
                self.check_pf_events()
            except PFEventError as pf_event:
                raise pf_event from e
            raise

    def _discovery_hint(self) -> str:
        init_data = self.lease.init_data if self.lease else None
        # Conflict (§12 item 4): we announce critical region v2 but read discovery at the v1 place (FB - 64 KiB).
        if init_data is not None and init_data.data[0] >= GPU_CRIT_REGION_V2:
            return (
                f"the PF answered critical-region v{init_data.data[0]} with its init-data header at "
                f"{init_data.data[1]} KiB, {init_data.data[2]} KiB long; it may have put discovery there instead"
            )
        return ""

    def _memory(self) -> None:
        paddr_base = VF_PADDR_BASE if self.is_vf else 0
        too_small = (
            f"{self.pci.address}: {self.vram_size >> 20} MiB of VRAM is too small for the "
            f"{RESERVED_VRAM_SIZE >> 20} MiB reserved at its top, paddr_base {paddr_base >> 20} MiB "
            f"and the {BOOT_REGION_SIZE >> 20} MiB boot region"
        )
        # checked here so the allocator is never handed a negative size
        if self.vram_size <= RESERVED_VRAM_SIZE:
            raise DeviceError(too_small)
        try:
            # a large BAR reaches page tables anywhere, so they need no region of their own (facts §7 reserve_ptable)
            self.memory = PhysicalMemory(
                self.vram_size - RESERVED_VRAM_SIZE, paddr_base, reserve_page_tables=not self.large_bar
            )
        except ValueError as e:
            raise DeviceError(f"{too_small}: {e}") from e

    def _bus_master_set(self) -> None:
        if not self.pci.set_bus_master() & PCI_COMMAND_MASTER:
            raise DeviceError(f"{self.pci.address}: PCI_COMMAND bus-master bit did not stick after setting it")

    def _return_lease(self) -> None:
        if self.lease is not None:
            self.trace.append("vf.release_init_access")
            self.lease.release()

    _DRIVER_STEPS: Mapping[str, Callable[[AMDDevice], None]] = {
        "map_bars": _map_bars,
        "detect_vf": _detect_vf,
        "vf.request_init_data": _request_init_data,
        "vf.request_init_access": _request_init_access,
        "read_vram_size": _read_vram_size,
        "discovery": _discovery,
        "memory": _memory,
        "pci.bus_master_set": _bus_master_set,
    }

    def _read_vram_indirect(self, offset: int, length: int) -> bytes:
        """VRAM through MM_INDEX/MM_INDEX_HI/MM_DATA, for a BAR0 smaller than VRAM."""
        out = bytearray()
        for addr in range(offset & ~3, offset + length, 4):
            self.regs.write32(MM_INDEX, (addr & 0x7FFFFFFF) | MM_INDEX_ENABLE)
            self.regs.write32(MM_INDEX_HI, addr >> 31)
            out += self.regs.read32(MM_DATA).to_bytes(4, "little")
        return bytes(out[offset & 3 : (offset & 3) + length])

    # -- public -------------------------------------------------------------------------------------------------------
    @property
    def init_data(self) -> Message | None:
        return self.lease.init_data if self.lease else None

    def check_pf_events(self) -> Message | None:
        """Poll the mailbox for a PF message; raises FLRNotified / UnrecoverableError / PFRejected. None on a PF."""
        return self.mailbox.poll() if self.mailbox is not None else None

    def close(self) -> None:
        """Run the fini phase (if boot finished), then return the lease. Idempotent."""
        if self.closed:
            return
        self.closed = True
        try:
            if self.booted:
                for step in self.plan.phase("fini"):
                    if step.name != "vf.release_init_access":
                        self._run(step)
        finally:
            self._return_lease()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "lease", None) is not None:
            self.lease.release()
