"""The simulated PF under interleavings of VF requests, revokes and FLRs, driven step by step on a manual clock.

Each test places requests at chosen times relative to the PF's timers, so the interleaving is the same on every run.
"""

from __future__ import annotations

import pytest
from amd_testlib import ManualClock, assert_gates_consistent, post_request, run_pf_until

from fusegrad.runtime.support.amd.discovery import DISCOVERY_OFFSET_FROM_END, MI350X_VF_IPS, parse_discovery
from fusegrad.runtime.support.amd.mailbox import GPU_CRIT_REGION_V2, Event, Request
from fusegrad.runtime.support.amd.regs import MAILBOX_RCV_DW0
from fusegrad.runtime.support.amd.sim import SimConfig, SimPCIDevice

# Latencies are the defaults (1 ms ack, 2 ms event): INIT_ACCESS posted at 0.1 is granted at 0.103, so the revoke
# fires at 1.103 and the FLR completes at 1.603.
REVOKE_S, FLR_S = 1.0, 0.5
REVOKED, FLR_DONE = 1.103, 1.603


def posted(pci: SimPCIDevice) -> list[int]:
    return [m.id for m in pci.sim.posted]


def granted_session(clock: ManualClock, **knobs: object) -> SimPCIDevice:
    """A hand-driven VF that holds full access since 0.103 s, with 'session one' written at VRAM offset 0."""
    pci = SimPCIDevice(SimConfig(revoke_after_s=REVOKE_S, flr_duration_s=FLR_S, **knobs), pf_clock=clock)
    post_request(pci, Request.REQ_GPU_INIT_DATA, GPU_CRIT_REGION_V2)
    run_pf_until(pci, clock, 0.1)
    post_request(pci, Request.REQ_GPU_INIT_ACCESS)
    run_pf_until(pci, clock, 0.2)
    assert posted(pci) == [Event.REQ_GPU_INIT_DATA_READY, Event.READY_TO_ACCESS_GPU] and pci.sim.full_access
    pci.map_vram().write(0, b"session one")
    return pci


@pytest.mark.parametrize(
    ("request_id", "reply"),
    [
        (Request.REQ_GPU_INIT_DATA, Event.REQ_GPU_INIT_DATA_READY),
        (Request.REQ_GPU_INIT_ACCESS, Event.READY_TO_ACCESS_GPU),
    ],
    ids=["INIT_DATA", "INIT_ACCESS"],
)
def test_a_request_during_the_flr_is_served_only_after_it(request_id, reply):
    clock = ManualClock()
    with granted_session(clock) as pci:
        sim, vram = pci.sim, pci.map_vram()
        run_pf_until(pci, clock, REVOKED + 0.1)
        assert sim.flr_in_progress and posted(pci)[-1] == Event.FLR_NOTIFICATION
        assert_gates_consistent(sim)

        post_request(pci, request_id, GPU_CRIT_REGION_V2 if request_id == Request.REQ_GPU_INIT_DATA else 0)
        run_pf_until(pci, clock, REVOKED + 0.3)
        assert sim.trn_ack, "the PF still acknowledges a request during the FLR"
        assert posted(pci)[-1] == Event.FLR_NOTIFICATION, "but serves it only once the FLR completed"
        assert not sim.fb_enabled and not sim.full_access and sim.flr_in_progress
        assert_gates_consistent(sim)

        run_pf_until(pci, clock, FLR_DONE + 0.1)
        assert posted(pci)[-3:] == [Event.FLR_NOTIFICATION, Event.FLR_NOTIFICATION_CMPL, reply]
        assert not sim.flr_in_progress and sim.fb_enabled
        assert_gates_consistent(sim)
        assert vram.read(0, 11) == bytes(11), "the FLR wiped the previous session's VRAM"
        if request_id == Request.REQ_GPU_INIT_DATA:
            assert not sim.full_access
            table = vram.read(vram.size - DISCOVERY_OFFSET_FROM_END, 10240)
            assert parse_discovery(table).ips == MI350X_VF_IPS, "the new session's discovery table survived"
        else:
            assert sim.full_access and sim.mmio_write_enabled and sim.doorbell_enabled
            vram.write(0, b"session two")
            run_pf_until(pci, clock, FLR_DONE + REVOKE_S - 0.1)  # just before the new grant's own revoke
            assert vram.read(0, 11) == b"session two", "nothing left over from the old FLR touches the new session"
            assert_gates_consistent(sim)


def test_a_release_during_the_flr_is_ignored_after_it():
    clock = ManualClock()
    with granted_session(clock) as pci:
        run_pf_until(pci, clock, REVOKED + 0.1)
        post_request(pci, Request.REL_GPU_INIT_ACCESS)
        run_pf_until(pci, clock, FLR_DONE + 0.1)
        assert "REL_INIT_ACCESS ignored: no matching REQ" in pci.sim.pf_log
        assert posted(pci)[-2:] == [Event.FLR_NOTIFICATION, Event.FLR_NOTIFICATION_CMPL]
        assert not (pci.sim.full_access or pci.sim.fb_enabled or pci.sim.mmio_write_enabled)
        assert_gates_consistent(pci.sim)


def test_a_released_session_is_never_revoked_later():
    clock = ManualClock()
    with granted_session(clock) as pci:
        post_request(pci, Request.REL_GPU_INIT_ACCESS)
        run_pf_until(pci, clock, REVOKED + FLR_S + 1.0)
        assert Event.FLR_NOTIFICATION not in posted(pci) and not pci.sim.flr_in_progress
        assert not pci.sim.full_access and not pci.sim.mmio_write_enabled
        assert pci.map_vram().read(0, 11) == b"session one"
        assert_gates_consistent(pci.sim)


def test_a_host_flr_and_the_revoke_of_the_same_grant_reset_once():
    clock = ManualClock()
    with granted_session(clock, flr_after_s=REVOKE_S - 0.2) as pci:
        run_pf_until(pci, clock, REVOKED + FLR_S + 0.5)
        assert posted(pci)[2:] == [Event.FLR_NOTIFICATION, Event.FLR_NOTIFICATION_CMPL]
        assert_gates_consistent(pci.sim)


def test_fini_release_while_in_full_access_leaves_consistent_gates():
    clock = ManualClock()
    with granted_session(clock) as pci:
        post_request(pci, Request.REL_GPU_FINI_ACCESS)  # this driver never sends it; a raw VF can
        run_pf_until(pci, clock, 0.3)
        assert not pci.sim.full_access and not pci.sim.fb_enabled
        assert_gates_consistent(pci.sim)
        run_pf_until(pci, clock, REVOKED + 0.1)
        assert Event.FLR_NOTIFICATION not in posted(pci), "leaving full access cancels its revoke"


def test_a_grant_revoked_in_the_same_step_is_never_seen():
    clock = ManualClock()
    with SimPCIDevice(SimConfig(flr_after_s=0.0, revoke_after_s=None), pf_clock=clock) as pci:
        post_request(pci, Request.REQ_GPU_INIT_DATA, GPU_CRIT_REGION_V2)
        run_pf_until(pci, clock, 0.1)
        post_request(pci, Request.REQ_GPU_INIT_ACCESS)
        run_pf_until(pci, clock, 0.11)
        # READY_TO_ACCESS_GPU and FLR_NOTIFICATION went out under one hold of the lock: the VF reads only the FLR
        assert pci.map_registers().read32(MAILBOX_RCV_DW0) == Event.FLR_NOTIFICATION and pci.sim.flr_in_progress
        assert_gates_consistent(pci.sim)
