"""Exceptions of the AMD userspace driver layer. Each message names the values involved."""

from __future__ import annotations


class AMDError(Exception):
    """Base class of every error this layer raises on purpose."""


class PCIError(AMDError):
    """A PCI function could not be found, opened, mapped or used."""


class AccessRefused(AMDError):
    """The function is bound to a kernel driver or the caller lacks root, and touching it was not forced."""


class DeviceError(AMDError):
    """The device answered with values that make no sense (all-ones registers, zero VRAM size)."""


class MailboxError(AMDError):
    """A VF<->PF mailbox exchange failed. Carries the request, the awaited event, what was read and the time waited."""

    def __init__(self, message: str, *, request: int | None, awaited: int | None, read: int | None, waited_s: float):
        super().__init__(message)
        self.request, self.awaited, self.read, self.waited_s = request, awaited, read, waited_s


class MailboxAckTimeout(MailboxError):
    """The PF never set TRN_MSG_ACK for a request."""


class MailboxAckStuck(MailboxAckTimeout):
    """TRN_MSG_ACK of a previous exchange never cleared, so no new request could be posted."""


class MailboxEventTimeout(MailboxError):
    """The PF acknowledged the request but the awaited event never arrived, after every retry."""


class PFEventError(MailboxError):
    """The PF sent an event that ends the exchange (or the session) instead of the awaited one."""


class PFRejected(PFEventError):
    """The PF answered IDH_FAIL."""


class FLRNotified(PFEventError):
    """The PF announced (or completed) a function-level reset of this VF; its access is gone."""


class UnrecoverableError(PFEventError):
    """The PF reported an unrecoverable error (or GPU RMA); the VF must stop using the GPU."""


class DiscoveryError(AMDError):
    """The IP discovery table is missing, unreadable or corrupted."""


class OutOfMemory(AMDError):
    """A VRAM region has no hole large enough for a request."""


class QueueTimeout(AMDError):
    """A signal did not reach its value in time: the queue is hung (or lost its doorbell for good)."""


class GPUFault(AMDError):
    """The GPU reported a fault through the IH ring (a VM fault: an unmapped or out-of-range address)."""


class LeaseRequired(AMDError):
    """MMIO programming was attempted outside an access window; the PF would silently drop it."""
