"""The VF's access lease: INIT_DATA then INIT_ACCESS to take it, REL_GPU_INIT_ACCESS to give it back (facts §6)."""

from __future__ import annotations

import logging
from types import TracebackType
from typing import Self

from .mailbox import GPU_CRIT_REGION_V2, Event, Mailbox, Message, Request

log = logging.getLogger(__name__)


class VFLease:
    """Holds full access to a VF. Release is idempotent, best-effort, and never sent unless the lease was acquired.

    Conflict (facts §12 item 1): the seed holds INIT access for the whole session, while GIM revokes it after 3 s (or
    1.5 s) and FLRs the VF. Releasing early instead would make GIM disable the VF's MMIO writes, so the lease is held
    as in the seed, and the revocation is made visible: `Mailbox.poll` raises FLRNotified instead of leaving hangs.
    """

    def __init__(self, mailbox: Mailbox):
        self.mailbox = mailbox
        self.acquired = False
        self.init_data: Message | None = None  # INIT_DATA_READY: data[0] = critical-region version
        self.grant: Message | None = None  # READY_TO_ACCESS_GPU: data[1] = checksum key
        self.releases_sent = 0
        self.release_error: Exception | None = None

    def request_init_data(self) -> Message:
        """REQ_GPU_INIT_DATA (data2 = critical region v2); the PF opens the framebuffer and writes discovery."""
        # Conflict (§12 item 3): the kernel carries on when this fails; we stop as the seed does, since without it the
        # framebuffer stays closed and every VRAM read would be 0xFF.
        reply = self.mailbox.request(Request.REQ_GPU_INIT_DATA, Event.REQ_GPU_INIT_DATA_READY, data2=GPU_CRIT_REGION_V2)
        assert reply is not None
        self.init_data = reply
        return reply

    def request_init_access(self) -> Message:
        """REQ_GPU_INIT_ACCESS; the lease counts as acquired only once the PF's READY_TO_ACCESS_GPU arrived."""
        # A grant arriving after we gave up is not ours to release (facts §6 edge);
        # the PF's full-access timer reclaims it.
        if self.init_data is None:
            raise RuntimeError("REQ_GPU_INIT_ACCESS needs a successful REQ_GPU_INIT_DATA first")
        reply = self.mailbox.request(Request.REQ_GPU_INIT_ACCESS, Event.READY_TO_ACCESS_GPU)
        assert reply is not None
        self.grant, self.acquired = reply, True
        return reply

    def acquire(self) -> Self:
        if not self.acquired:
            self.request_init_data()
            self.request_init_access()
        return self

    def release(self) -> bool:
        """Send REL_GPU_INIT_ACCESS once if the lease is held; returns whether it was sent. Never raises."""
        if not getattr(self, "acquired", False):
            return False
        # cleared before sending, so a failed send is never followed by a second release
        self.acquired = False
        # sent even after an FLR: the PF ignores a release without a grant,
        # and skipping it could leak one it still holds
        self.releases_sent += 1
        try:
            self.mailbox.request(Request.REL_GPU_INIT_ACCESS, None, retries=1)
        except Exception as e:  # noqa: BLE001 -- best-effort: releasing must never mask the error that got us here
            self.release_error = e
            log.debug("REL_GPU_INIT_ACCESS failed: %s", e)
        return True

    def close(self) -> None:
        self.release()

    def __enter__(self) -> Self:
        return self.acquire()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()
