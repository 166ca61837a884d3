"""VF detection, the mailbox handshake and the lease, against the simulated PF."""

from __future__ import annotations

import gc
import time

import pytest
from amd_testlib import PATIENT, QUICK, ROOMY, SLACK_S, assert_protocol_invariants, request_budget, sent

from fusegrad.runtime.support.amd.errors import (
    FLRNotified,
    MailboxAckStuck,
    MailboxAckTimeout,
    MailboxEventTimeout,
    PFRejected,
    UnrecoverableError,
)
from fusegrad.runtime.support.amd.lease import VFLease
from fusegrad.runtime.support.amd.mailbox import Event, Mailbox, MailboxTimeouts, Message, Request, is_vf
from fusegrad.runtime.support.amd.regs import MAILBOX_RCV_DW0, MAILBOX_TRN_BYTE, TRN_MSG_VALID
from fusegrad.runtime.support.amd.sim import open_sim


def lease_on(pci, timeouts=ROOMY) -> VFLease:
    return VFLease(Mailbox(pci.map_registers(), timeouts))


def test_detects_vf_and_pf():
    with open_sim() as vf, open_sim(vf=False) as pf:
        assert is_vf(vf.map_registers())
        assert not is_vf(pf.map_registers())


def test_lease_sequence_is_the_oracle():
    with open_sim() as pci:
        with lease_on(pci) as lease:
            assert lease.acquired
            assert sent(pci) == [(Request.REQ_GPU_INIT_DATA, 2), (Request.REQ_GPU_INIT_ACCESS, 0)]
            assert [m.id for m in pci.sim.posted] == [Event.REQ_GPU_INIT_DATA_READY, Event.READY_TO_ACCESS_GPU]
            assert lease.init_data == Message(Event.REQ_GPU_INIT_DATA_READY, (1, 0, 0))
        assert sent(pci)[2:] == [(Request.REL_GPU_INIT_ACCESS, 0)]
        assert not lease.acquired
        assert lease.release() is False and lease.releases_sent == 1
        lease.close()
        del lease
        gc.collect()
        assert pci.requests().count(Request.REL_GPU_INIT_ACCESS) == 1
        assert_protocol_invariants(pci)


def test_release_never_sent_for_an_unacquired_lease():
    with open_sim() as pci:
        lease = lease_on(pci)
        assert lease.release() is False
        lease.close()
        del lease
        gc.collect()
        assert pci.requests() == []


def test_reset_and_fini_requests_are_refused_before_touching_the_mailbox():
    with open_sim() as pci:
        mailbox = Mailbox(pci.map_registers(), QUICK)
        for request in (Request.REQ_GPU_RESET_ACCESS, Request.REQ_GPU_FINI_ACCESS, Request.REL_GPU_FINI_ACCESS):
            with pytest.raises(ValueError, match=request.name):
                mailbox.request(request, Event.READY_TO_ACCESS_GPU)
        assert pci.requests() == []


def _timed(fn):
    start = time.monotonic()
    try:
        fn()
    except Exception as e:  # noqa: BLE001 -- the caller inspects it
        return e, time.monotonic() - start
    raise AssertionError("expected an exception")


def test_never_ack_raises_ack_timeout_and_withdraws_the_request():
    with open_sim(never_ack=True) as pci:
        lease = lease_on(pci, QUICK)
        error, elapsed = _timed(lease.acquire)
        assert isinstance(error, MailboxAckTimeout) and not isinstance(error, MailboxAckStuck)
        assert elapsed < QUICK.ack_clear_s + QUICK.ack_s + SLACK_S
        assert error.request == Request.REQ_GPU_INIT_DATA and error.awaited == Event.REQ_GPU_INIT_DATA_READY
        assert "REQ_GPU_INIT_DATA (6)" in str(error) and "instead" in str(error) and error.waited_s >= QUICK.ack_s
        assert not pci.sim.trn_valid  # withdrawn, so a late PF cannot act on it
        assert sent(pci) == [(Request.REQ_GPU_INIT_DATA, 2)]  # no retry after an ack timeout
        assert not lease.acquired and lease.release() is False
        assert pci.requests() == [Request.REQ_GPU_INIT_DATA]


def test_stuck_ack_raises_before_posting_anything():
    with open_sim(stuck_ack=True) as pci:
        error, elapsed = _timed(lease_on(pci, QUICK).acquire)
        assert isinstance(error, MailboxAckStuck)
        assert elapsed < QUICK.ack_clear_s + SLACK_S
        assert "did not clear" in str(error) and "0x02" in str(error)
        assert pci.requests() == []


def test_ack_without_event_retries_then_raises_event_timeout():
    with open_sim(ack_no_event=True) as pci:
        error, elapsed = _timed(lease_on(pci, QUICK).acquire)
        assert isinstance(error, MailboxEventTimeout)
        assert elapsed < request_budget(QUICK) + SLACK_S
        assert error.waited_s >= QUICK.retries * QUICK.event_s * 0.9
        assert "awaited REQ_GPU_INIT_DATA_READY (7)" in str(error) and "read no message instead" in str(error)
        assert f"{QUICK.retries} attempt(s)" in str(error)
        assert sent(pci) == [(Request.REQ_GPU_INIT_DATA, 2)] * QUICK.retries


def test_non_terminal_wrong_event_is_not_yet_then_timeout_names_it():
    with open_sim(wrong_event=Event.SUCCESS) as pci:
        error, elapsed = _timed(lease_on(pci, PATIENT).acquire)
        assert isinstance(error, MailboxEventTimeout) and error.read == Event.SUCCESS
        assert "read SUCCESS (4) instead" in str(error)
        assert elapsed < request_budget(PATIENT) + SLACK_S


@pytest.mark.parametrize(
    ("event", "error_type"),
    [
        (Event.FAIL, PFRejected),
        (Event.FLR_NOTIFICATION, FLRNotified),
        (Event.UNRECOV_ERR_NOTIFICATION, UnrecoverableError),
        (Event.RAS_ERROR_DETECTED_OR_GPU_RMA, UnrecoverableError),
    ],
)
def test_terminal_events_raise_at_once_without_retry(event, error_type):
    with open_sim(wrong_event=event) as pci:
        lease = lease_on(pci, ROOMY)  # raises at once, so the long event timeout costs nothing
        error, elapsed = _timed(lease.acquire)
        assert type(error) is error_type and error.read == event
        assert elapsed < ROOMY.event_s + ROOMY.ack_s + SLACK_S
        assert f"PF sent {Event(event).name}" in str(error) and "awaited REQ_GPU_INIT_DATA_READY" in str(error)
        assert sent(pci) == [(Request.REQ_GPU_INIT_DATA, 2)]
        assert pci.sim.rcv_acks == 1 and not pci.sim.rcv_valid  # the PF's message was acknowledged
        assert not lease.acquired and lease.release() is False


def test_flr_completion_ends_an_init_access_wait():
    with open_sim(wrong_event=Event.FLR_NOTIFICATION_CMPL) as pci:
        mailbox = Mailbox(pci.map_registers(), ROOMY)
        error, elapsed = _timed(lambda: mailbox.request(Request.REQ_GPU_INIT_ACCESS, Event.READY_TO_ACCESS_GPU))
        assert type(error) is FLRNotified and error.read == Event.FLR_NOTIFICATION_CMPL
        assert elapsed < ROOMY.event_s + ROOMY.ack_s + SLACK_S
        assert pci.requests() == [Request.REQ_GPU_INIT_ACCESS]


def test_flr_completion_while_awaiting_init_data_is_not_yet():
    # an earlier session's FLR ending: INIT_DATA holds nothing it could wipe, so the VF keeps waiting and retrying
    with open_sim(wrong_event=Event.FLR_NOTIFICATION_CMPL) as pci:
        error, elapsed = _timed(lease_on(pci, PATIENT).acquire)
        assert isinstance(error, MailboxEventTimeout) and error.read == Event.FLR_NOTIFICATION_CMPL
        assert "read FLR_NOTIFICATION_CMPL (3) instead" in str(error)
        assert sent(pci) == [(Request.REQ_GPU_INIT_DATA, 2)] * PATIENT.retries
        assert elapsed < request_budget(PATIENT) + SLACK_S


def test_stale_event_is_acknowledged_before_the_first_request():
    with open_sim(stale_event=Event.READY_TO_ACCESS_GPU) as pci:
        with lease_on(pci) as lease:
            assert lease.mailbox.stale_acked == [Message(Event.READY_TO_ACCESS_GPU)]
            assert pci.sim.rcv_acks >= 1
        assert pci.requests() == [6, 1, 2]


def test_stale_value_left_by_a_pf_that_never_clears_rcv_is_not_a_reply():
    # The seed compares RCV_DW0 alone, so a left-over 7 would look like INIT_DATA_READY; RCV_MSG_VALID says it is not.
    with open_sim(stale_event=Event.REQ_GPU_INIT_DATA_READY, no_rcv_clear=True, ack_no_event=True) as pci:
        mailbox = Mailbox(pci.map_registers(), QUICK)
        with pytest.raises(MailboxEventTimeout):
            VFLease(mailbox).acquire()
        assert pci.map_registers().read32(MAILBOX_RCV_DW0) == Event.REQ_GPU_INIT_DATA_READY
        assert mailbox.stale_acked == [Message(Event.REQ_GPU_INIT_DATA_READY)]


def test_stale_unrecoverable_error_raises_before_sending():
    with open_sim(stale_event=Event.UNRECOV_ERR_NOTIFICATION) as pci:
        with pytest.raises(UnrecoverableError, match="UNRECOV_ERR_NOTIFICATION"):
            lease_on(pci, QUICK).acquire()
        assert pci.requests() == []


def test_rate_guard_drop_on_init_access_leaves_no_lease_and_no_release():
    with open_sim(guard_drop_every=2) as pci:
        lease = lease_on(pci, MailboxTimeouts(ack_s=0.6, event_s=2.0, retries=2, ack_poll_s=0.001))
        with pytest.raises(MailboxAckTimeout, match="REQ_GPU_INIT_ACCESS"):
            lease.acquire()
        assert lease.init_data is not None and not lease.acquired
        lease.close()
        assert pci.requests() == [Request.REQ_GPU_INIT_DATA, Request.REQ_GPU_INIT_ACCESS]


def test_late_grant_after_the_vf_gave_up_sends_no_release():
    with open_sim(late_grant_s=1.0, revoke_after_s=None) as pci:
        lease = lease_on(pci, QUICK)
        with pytest.raises(MailboxEventTimeout, match="READY_TO_ACCESS_GPU"):
            lease.acquire()
        lease.close()
        deadline = time.monotonic() + 1.0 + SLACK_S
        while not pci.sim.full_access and time.monotonic() < deadline:
            time.sleep(0.005)
        # Facts §6 edge: the PF granted after all; the lease was never ours, so no release went out.
        assert pci.sim.full_access
        assert Request.REL_GPU_INIT_ACCESS not in pci.requests()


def test_busy_pf_is_waited_out_by_retries():
    with open_sim(busy_pf_s=0.12) as pci:
        with lease_on(pci, MailboxTimeouts(event_s=0.1, retries=8, event_poll_s=0.002)) as lease:
            assert lease.acquired
        ids = pci.requests()
        assert ids[-1] == Request.REL_GPU_INIT_ACCESS and set(ids) == {6, 1, 2}
        assert_protocol_invariants(pci)


def test_poll_outside_a_request():
    with open_sim(flr_after_s=0.3, revoke_after_s=None) as pci:
        with lease_on(pci) as lease:
            assert lease.mailbox.poll() is None
            deadline = time.monotonic() + 0.3 + SLACK_S
            with pytest.raises(FLRNotified, match="outside any request"):
                while time.monotonic() < deadline:
                    lease.mailbox.poll()
                    time.sleep(0.002)
        assert pci.requests() == [6, 1, 2]


def test_poll_returns_and_acknowledges_an_ordinary_message():
    with open_sim() as pci:
        mailbox = Mailbox(pci.map_registers(), QUICK)
        pci.sim.pf_post(Event.QUERY_ALIVE, (1, 2, 3))
        assert mailbox.poll() == Message(Event.QUERY_ALIVE, (1, 2, 3))
        assert not pci.sim.rcv_valid and mailbox.poll() is None


def test_trn_byte_is_a_byte_register():
    with open_sim() as pci:
        regs = pci.map_registers()
        regs.write32(0xE56, 0x1234)
        regs.write8(MAILBOX_TRN_BYTE, TRN_MSG_VALID)
        assert regs.read8(MAILBOX_TRN_BYTE) & TRN_MSG_VALID
        assert pci.sim.sent[-1].id == 0x1234


@pytest.mark.parametrize("bad", [{"event_s": 0}, {"ack_s": -1}, {"retries": 0}, {"retries": 1.5}])
def test_timeouts_are_validated(bad):
    with pytest.raises((ValueError, TypeError), match=next(iter(bad))):
        MailboxTimeouts(**bad)
