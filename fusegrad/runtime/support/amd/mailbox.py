"""VF detection and the VF->PF mailbox request/event handshake (facts sheet §2-§5).

Where the seed driver and the Linux kernel differ (§12 item 3) this file takes the safer side, and says so inline.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from enum import IntEnum

from .errors import (
    FLRNotified,
    MailboxAckStuck,
    MailboxAckTimeout,
    MailboxEventTimeout,
    PFEventError,
    PFRejected,
    UnrecoverableError,
)
from .limits import check_count, check_seconds
from .pci import RegisterBAR
from .regs import (
    FUNC_IDENTIFIER_IS_VF,
    MAILBOX_RCV_BYTE,
    MAILBOX_RCV_DW0,
    MAILBOX_TRN_BYTE,
    MAILBOX_TRN_DW0,
    RCC_IOV_FUNC_IDENTIFIER,
    RCV_MSG_ACK,
    RCV_MSG_VALID,
    TRN_MSG_ACK,
    TRN_MSG_VALID,
)

log = logging.getLogger(__name__)


class Request(IntEnum):
    """VF->PF request IDs (TRN_MSG_DATA0)."""

    REQ_GPU_INIT_ACCESS = 1
    REL_GPU_INIT_ACCESS = 2
    REQ_GPU_FINI_ACCESS = 3
    REL_GPU_FINI_ACCESS = 4
    REQ_GPU_RESET_ACCESS = 5
    REQ_GPU_INIT_DATA = 6


class Event(IntEnum):
    """PF->VF event IDs (RCV_MSG_DATA0)."""

    CLR_MSG_BUF = 0
    READY_TO_ACCESS_GPU = 1
    FLR_NOTIFICATION = 2
    FLR_NOTIFICATION_CMPL = 3
    SUCCESS = 4
    FAIL = 5
    QUERY_ALIVE = 6
    REQ_GPU_INIT_DATA_READY = 7
    RAS_POISON_READY = 8
    PF_SOFT_FLR_NOTIFICATION = 9
    RAS_ERROR_DETECTED_OR_GPU_RMA = 10
    UNRECOV_ERR_NOTIFICATION = 17
    TEXT_MESSAGE = 255


# data2 of REQ_GPU_INIT_DATA: the VF understands the dynamic (v2) critical-region layout.
GPU_CRIT_REGION_V2 = 2
# This layer only ever sends these; resets and FINI access belong to the PF (a VF never asks for them).
SENDABLE = frozenset({Request.REQ_GPU_INIT_DATA, Request.REQ_GPU_INIT_ACCESS, Request.REL_GPU_INIT_ACCESS})
FLR_EVENTS = frozenset({Event.FLR_NOTIFICATION, Event.FLR_NOTIFICATION_CMPL, Event.PF_SOFT_FLR_NOTIFICATION})
# Conflict (§12 item 8): event 10 is RAS_ERROR_DETECTED in Linux but GPU_RMA in GIM; we take the safer GPU_RMA reading.
UNRECOVERABLE_EVENTS = frozenset({Event.UNRECOV_ERR_NOTIFICATION, Event.RAS_ERROR_DETECTED_OR_GPU_RMA})
TERMINAL_EVENTS = FLR_EVENTS | UNRECOVERABLE_EVENTS | {Event.FAIL}
# An FLR completion while INIT_DATA is awaited ends an earlier session's reset: a lease holds nothing before INIT_DATA,
# and the PF serves requests that arrive during an FLR only after it. If the reply was lost to the FLR, a retry resends.
NOT_TERMINAL_WHILE_AWAITING = {Event.REQ_GPU_INIT_DATA_READY: frozenset({Event.FLR_NOTIFICATION_CMPL})}


@dataclass(frozen=True)
class MailboxTimeouts:
    """Mailbox deadlines and poll intervals in seconds; defaults are the seed driver's (facts sheet §4a)."""

    ack_clear_s: float = 1.0
    ack_s: float = 0.5
    event_s: float = 2.0
    retries: int = 5
    ack_clear_poll_s: float = 0.001
    ack_poll_s: float = 0.005
    event_poll_s: float = 0.010

    def __post_init__(self) -> None:
        for f in fields(self):
            what, value = f"MailboxTimeouts.{f.name}", getattr(self, f.name)
            if f.name == "retries":
                check_count(what, value)
            else:
                check_seconds(what, value)


@dataclass(frozen=True)
class Message:
    """One PF->VF message: the event ID and RCV_MSG_DATA1..3."""

    event: int
    data: tuple[int, int, int] = (0, 0, 0)

    def __str__(self) -> str:
        return f"{describe_event(self.event)} data={tuple(hex(d) for d in self.data)}"


def describe_request(value: int) -> str:
    return f"{Request(value).name} ({value})" if value in Request._value2member_map_ else f"request {value:#x}"


def describe_event(value: int) -> str:
    return f"{Event(value).name} ({value})" if value in Event._value2member_map_ else f"unknown event {value:#x}"


def read_func_identifier(regs: RegisterBAR) -> int:
    return regs.read32(RCC_IOV_FUNC_IDENTIFIER)


def is_vf(regs: RegisterBAR) -> bool:
    """Bit 0 of RCC_IOV_FUNC_IDENTIFIER: set on an SR-IOV virtual function."""
    return bool(read_func_identifier(regs) & FUNC_IDENTIFIER_IS_VF)


def _terminal_error(
    msg: Message, context: str, request: int | None, awaited: int | None, waited_s: float
) -> PFEventError:
    head = f"{context}PF sent {msg}"
    kwargs = {"request": request, "awaited": awaited, "read": msg.event, "waited_s": waited_s}
    if msg.event in FLR_EVENTS:
        return FLRNotified(
            f"{head}: the PF is resetting this VF (FLR), so its access is gone; reopen the device", **kwargs
        )
    if msg.event == Event.RAS_ERROR_DETECTED_OR_GPU_RMA:
        return UnrecoverableError(
            f"{head}: read as GIM's GPU_RMA (Linux calls it RAS_ERROR_DETECTED); stop using this GPU", **kwargs
        )
    if msg.event in UNRECOVERABLE_EVENTS:
        return UnrecoverableError(f"{head}: unrecoverable error, this VF must stop using the GPU (RMA)", **kwargs)
    return PFRejected(f"{head}: the PF refused the request", **kwargs)


class Mailbox:
    """The VF side of the BAR5 mailbox."""

    def __init__(self, regs: RegisterBAR, timeouts: MailboxTimeouts | None = None):
        if timeouts is not None and not isinstance(timeouts, MailboxTimeouts):
            raise TypeError(f"timeouts must be MailboxTimeouts or None, got {timeouts!r} ({type(timeouts).__name__})")
        self.regs, self.timeouts = regs, timeouts or MailboxTimeouts()
        self.stale_acked: list[Message] = []

    def _posted(self) -> Message | None:
        """The PF's message if RCV_MSG_VALID is set, else None."""
        # Safer than the seed and kernel, which compare RCV_DW0 alone: a value left behind by a PF that does not clear
        # its buffer (facts §11 no_rcv_clear) must not count as a new reply.
        if not self.regs.read8(MAILBOX_RCV_BYTE) & RCV_MSG_VALID:
            return None
        dw = [self.regs.read32(MAILBOX_RCV_DW0 + i) for i in range(4)]
        return Message(dw[0], (dw[1], dw[2], dw[3]))

    def _ack_rcv(self) -> None:
        self.regs.write8(MAILBOX_RCV_BYTE, RCV_MSG_ACK)

    def _wait(self, done: Callable[[], object], timeout_s: float, poll_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not done():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return bool(done())
            time.sleep(min(poll_s, remaining))
        return True

    def _send(self, request: int, data: tuple[int, int, int], started: float, awaited: int | None) -> None:
        t = self.timeouts

        def ack_cleared() -> bool:
            self.regs.write8(MAILBOX_TRN_BYTE, 0)
            return not self.regs.read8(MAILBOX_TRN_BYTE) & TRN_MSG_ACK

        # Seed: 1 s deadline, fatal; kernel: no deadline. A deadline is safer than hanging forever.
        if not self._wait(ack_cleared, t.ack_clear_s, t.ack_clear_poll_s):
            trn = self.regs.read8(MAILBOX_TRN_BYTE)
            raise MailboxAckStuck(
                f"{describe_request(request)}: TRN_MSG_ACK from a previous exchange did not clear within "
                f"{t.ack_clear_s} s (TRN byte reads {trn:#04x}), so the request was not posted",
                request=request,
                awaited=awaited,
                read=trn,
                waited_s=time.monotonic() - started,
            )
        for i, value in enumerate((request, *data)):
            self.regs.write32(MAILBOX_TRN_DW0 + i, value & 0xFFFFFFFF)
        self.regs.write8(MAILBOX_TRN_BYTE, TRN_MSG_VALID)
        try:
            # Seed: fatal with no retry; kernel: only logged. Fatal is safer: the PF may never have read the request.
            if not self._wait(lambda: self.regs.read8(MAILBOX_TRN_BYTE) & TRN_MSG_ACK, t.ack_s, t.ack_poll_s):
                trn = self.regs.read8(MAILBOX_TRN_BYTE)
                raise MailboxAckTimeout(
                    f"{describe_request(request)}: awaited TRN_MSG_ACK from the PF, TRN byte read {trn:#04x} instead "
                    f"(ack never set) after {time.monotonic() - started:.3f} s (ack timeout {t.ack_s} s)",
                    request=request,
                    awaited=awaited,
                    read=trn,
                    waited_s=time.monotonic() - started,
                )
        finally:
            # withdrawn even on timeout, so a late PF cannot pick up a request the VF has given up on
            self.regs.write8(MAILBOX_TRN_BYTE, 0)

    def _await_event(self, event: int) -> tuple[Message | None, int | None]:
        """Poll one event timeout for `event` or a terminal event: (that message or None, last other event seen)."""
        deadline, other = time.monotonic() + self.timeouts.event_s, None
        terminal = TERMINAL_EVENTS - NOT_TERMINAL_WHILE_AWAITING.get(event, frozenset())
        while True:
            msg = self._posted()
            if msg is not None and (msg.event == event or msg.event in terminal):
                return msg, other
            if msg is not None:
                other = msg.event  # any other event only means "not yet", as in the seed and kernel
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None, other
            time.sleep(min(self.timeouts.event_poll_s, remaining))

    def request(
        self,
        request: int,
        event: int | None,
        data1: int = 0,
        data2: int = 0,
        data3: int = 0,
        *,
        retries: int | None = None,
    ) -> Message | None:
        """Send `request` and wait for `event` (None: fire and forget). Returns the PF's reply message."""
        if request not in SENDABLE:
            raise ValueError(
                f"{describe_request(request)} is never sent by this VF driver: resets and FINI access belong "
                f"to the PF; sendable requests are {sorted(r.name for r in SENDABLE)}"
            )
        attempts = self.timeouts.retries if retries is None else check_count("Mailbox.request retries", retries)
        started = time.monotonic()
        # Seed addition (the kernel lacks it): acknowledge a PF message left over from before, once per request.
        if (stale := self._posted()) is not None:
            self.stale_acked.append(stale)
            self._ack_rcv()
            # an RMA'd VF is ignored by the PF: say so now instead of timing out (FLR leftovers are harmless)
            if stale.event in UNRECOVERABLE_EVENTS:
                raise _terminal_error(
                    stale, f"{describe_request(request)}: before it was posted, ", request, event, 0.0
                )
        last_read: int | None = None
        for attempt in range(attempts):
            self._send(request, (data1, data2, data3), started, event)
            if event is None:
                return None
            reply, other = self._await_event(event)
            last_read = other if other is not None else last_read
            if reply is not None:
                self._ack_rcv()
                if reply.event == event:
                    return reply
                waited = time.monotonic() - started
                context = f"{describe_request(request)}: awaited {describe_event(event)}, after {waited:.3f} s "
                raise _terminal_error(reply, context, request, event, waited)
            log.debug(
                "%s: no %s after attempt %d/%d, retrying",
                describe_request(request),
                describe_event(event),
                attempt + 1,
                attempts,
            )
        waited = time.monotonic() - started
        seen = (
            f"read {describe_event(last_read)} instead"
            if last_read is not None
            else f"read no message instead (RCV_MSG_VALID stayed clear, RCV_DW0={self.regs.read32(MAILBOX_RCV_DW0):#x})"
        )
        raise MailboxEventTimeout(
            f"{describe_request(request)}: awaited {describe_event(event)}, {seen}, after {attempts} attempt(s) over "
            f"{waited:.3f} s (event timeout {self.timeouts.event_s} s each)",
            request=request,
            awaited=event,
            read=last_read,
            waited_s=waited,
        )

    def poll(self) -> Message | None:
        """Check for a PF message outside an exchange; raises for FLR, FAIL and unrecoverable errors."""
        msg = self._posted()
        if msg is None:
            return None
        self._ack_rcv()
        if msg.event in TERMINAL_EVENTS:
            raise _terminal_error(msg, "outside any request, ", None, None, 0.0)
        return msg
