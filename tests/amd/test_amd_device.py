"""The full device bring-up on the simulator: VF probe, injected faults, mid-session FLR and revoke, PF path."""

from __future__ import annotations

import gc
import time

import pytest
from amd_testlib import (
    PATIENT,
    QUICK,
    ROOMY,
    SLACK_S,
    assert_gates_consistent,
    assert_protocol_invariants,
    request_budget,
    sent,
    wait_until,
)

from fusegrad.runtime.support.amd.bootplan import IP_STEP_NAMES, PF_OWNED, STEPS
from fusegrad.runtime.support.amd.device import AMDDevice
from fusegrad.runtime.support.amd.discovery import DISCOVERY_OFFSET_FROM_END, MI350X_VF_IPS, parse_discovery
from fusegrad.runtime.support.amd.errors import (
    DeviceError,
    DiscoveryError,
    FLRNotified,
    MailboxAckStuck,
    MailboxAckTimeout,
    MailboxEventTimeout,
    PFRejected,
    UnrecoverableError,
)
from fusegrad.runtime.support.amd.mailbox import Event, Request
from fusegrad.runtime.support.amd.memory import BOOT_REGION_SIZE, MiB
from fusegrad.runtime.support.amd.regs import (
    MAILBOX_FIRST,
    MAILBOX_LAST,
    MM_DATA,
    MM_INDEX,
    MM_INDEX_ENABLE,
    MM_INDEX_HI,
    PCI_COMMAND,
    PCI_COMMAND_MASTER,
)
from fusegrad.runtime.support.amd.sim import open_sim

INIT = [(Request.REQ_GPU_INIT_DATA, 2), (Request.REQ_GPU_INIT_ACCESS, 0)]
RELEASE = [(Request.REL_GPU_INIT_ACCESS, 0)]


def test_full_vf_probe_follows_the_oracle_sequence():
    with open_sim() as pci:
        with AMDDevice(pci, ROOMY) as dev:
            assert dev.is_vf and dev.lease.acquired
            assert sent(pci) == INIT
            assert dev.vram_size == 32768 * MiB
            assert dev.discovery.versions()["GC"] == (9, 5, 0)
            assert dev.discovery.ips == MI350X_VF_IPS
            assert dev.memory.paddr_base == 1 * MiB
            assert dev.pci.config_read(PCI_COMMAND, 2) & PCI_COMMAND_MASTER
        assert sent(pci) == INIT + RELEASE
        assert dev.trace[-1] == "vf.release_init_access"
        dev.close()
        del dev
        gc.collect()
        assert sent(pci) == INIT + RELEASE
        assert_protocol_invariants(pci)
        # the release is fire-and-forget: the PF handles it after its event latency (a hang guard, not a timing)
        deadline = time.monotonic() + 30
        while "REL_INIT_ACCESS: full access ended, MMIO writes disabled" not in pci.sim.pf_log:
            assert time.monotonic() < deadline, pci.sim.pf_log
            time.sleep(0.005)


def test_vram_reads_all_ff_when_the_handshake_is_skipped():
    with open_sim() as pci:
        vram = pci.map_vram()
        for offset in (0, 4096, 1 * MiB, vram.size - DISCOVERY_OFFSET_FROM_END, vram.size - 16):
            assert vram.read(offset, 16) == b"\xff" * 16
        vram.write(0, b"\x00" * 16)  # dropped while the framebuffer is closed
        with pytest.raises(DiscoveryError, match="probably not granted by the PF"):
            parse_discovery(vram.read(vram.size - DISCOVERY_OFFSET_FROM_END, 10240))
        assert pci.requests() == []


FAULTS = [
    # (knobs, timeouts, error type, requests on the wire). INIT_ACCESS is never answered, so no release is ever sent.
    # Faults answered at once get ROOMY timeouts: a long event window costs nothing when the PF replies promptly.
    ({"never_ack": True}, QUICK, MailboxAckTimeout, [6]),
    ({"stuck_ack": True}, QUICK, MailboxAckStuck, []),
    ({"ack_no_event": True}, QUICK, MailboxEventTimeout, [6] * QUICK.retries),
    ({"wrong_event": Event.SUCCESS}, PATIENT, MailboxEventTimeout, [6] * PATIENT.retries),
    ({"wrong_event": Event.FAIL}, ROOMY, PFRejected, [6]),
    ({"wrong_event": Event.FLR_NOTIFICATION}, ROOMY, FLRNotified, [6]),
    ({"wrong_event": Event.UNRECOV_ERR_NOTIFICATION}, ROOMY, UnrecoverableError, [6]),
    ({"guard_drop_every": 1}, QUICK, MailboxAckTimeout, [6]),
]


@pytest.mark.parametrize(("knobs", "timeouts", "error_type", "wire"), FAULTS, ids=[str(f[0]) for f in FAULTS])
def test_injected_fault_raises_its_error_within_its_timeout_and_sends_no_release(knobs, timeouts, error_type, wire):
    with open_sim(**knobs) as pci:
        start = time.monotonic()
        with pytest.raises(error_type) as info:
            AMDDevice(pci, timeouts)
        assert time.monotonic() - start < request_budget(timeouts) + SLACK_S
        assert info.value.request == Request.REQ_GPU_INIT_DATA and info.value.waited_s >= 0
        assert pci.requests() == wire
        gc.collect()
        assert pci.requests() == wire
        assert_protocol_invariants(pci)


def test_failure_after_the_lease_releases_it_exactly_once():
    with open_sim(write_discovery=False) as pci:
        with pytest.raises(DiscoveryError, match="signature mismatch") as info:
            AMDDevice(pci, ROOMY)
        assert "did not write a table" in str(info.value)
        assert sent(pci) == INIT + RELEASE
        gc.collect()
        assert sent(pci) == INIT + RELEASE


def test_crit_region_v2_reply_is_named_when_discovery_is_missing():
    with open_sim(write_discovery=False, crit_region_version=2) as pci:
        with pytest.raises(DiscoveryError, match="critical-region v2"):
            AMDDevice(pci, ROOMY)
        assert sent(pci) == INIT + RELEASE


def test_crit_region_v2_with_discovery_at_the_v1_place_works():
    with open_sim(crit_region_version=2) as pci, AMDDevice(pci, ROOMY) as dev:
        assert dev.init_data.data == (2, 0, 132)
        assert dev.discovery.versions()["GC"] == (9, 5, 0)


def test_exception_inside_with_releases_the_lease():
    with open_sim() as pci:
        with pytest.raises(RuntimeError, match="user code"), AMDDevice(pci, ROOMY):
            raise RuntimeError("user code")
        assert sent(pci) == INIT + RELEASE


@pytest.mark.parametrize(
    "knobs", [{"revoke_after_s": 0.4}, {"flr_after_s": 0.4, "revoke_after_s": None}], ids=["revoke", "flr"]
)
def test_flr_mid_session_is_reported_and_vram_goes_dark(knobs):
    with open_sim(**knobs) as pci:
        dev = AMDDevice(pci, ROOMY)
        assert dev.check_pf_events() is None
        start = time.monotonic()
        with pytest.raises(FLRNotified, match="FLR"):
            while time.monotonic() - start < 0.4 + SLACK_S:
                dev.check_pf_events()
                time.sleep(0.002)
        assert time.monotonic() - start < 0.4 + SLACK_S
        assert wait_until(lambda: Event.FLR_NOTIFICATION_CMPL in [m.id for m in pci.sim.posted])
        top = dev.vram_size - DISCOVERY_OFFSET_FROM_END
        assert dev.vram.read(top, 64) == b"\xff" * 64
        dev.close()
        dev.close()
        # the PF ignores a release without a matching grant, and skipping it could leak a lease the PF still holds
        assert sent(pci) == INIT + RELEASE
        assert wait_until(lambda: "REL_INIT_ACCESS ignored: no matching REQ" in pci.sim.pf_log)
        assert_protocol_invariants(pci)


def test_reopening_during_the_flr_gets_a_session_the_flr_cannot_touch():
    # the FLR runs long enough for the reopen to land inside it; the order checks below hold even if it does not
    with open_sim(revoke_after_s=0.2, flr_duration_s=0.6) as pci:
        first = AMDDevice(pci, ROOMY)

        def flr_seen() -> bool:
            try:
                first.check_pf_events()
            except FLRNotified:
                return True
            return False

        assert wait_until(flr_seen)
        first.close()
        second = AMDDevice(pci, ROOMY)  # its INIT_DATA waits out the FLR; the completion is not a reply to it
        assert second.lease.acquired and second.discovery.ips == MI350X_VF_IPS
        ids = [m.id for m in pci.sim.posted]
        assert ids[:4] == [
            Event.REQ_GPU_INIT_DATA_READY,
            Event.READY_TO_ACCESS_GPU,
            Event.FLR_NOTIFICATION,
            Event.FLR_NOTIFICATION_CMPL,
        ], ids
        assert ids[4:6] == [Event.REQ_GPU_INIT_DATA_READY, Event.READY_TO_ACCESS_GPU], "served after the FLR"
        assert_gates_consistent(pci.sim)
        second.close()
        assert sent(pci) == INIT + RELEASE + INIT + RELEASE
        assert_gates_consistent(pci.sim)


def test_a_grant_revoked_at_once_is_never_held_and_never_released():
    with open_sim(flr_after_s=0.0, revoke_after_s=None) as pci:
        with pytest.raises(FLRNotified, match="awaited READY_TO_ACCESS_GPU") as info:
            AMDDevice(pci, ROOMY)
        assert info.value.request == Request.REQ_GPU_INIT_ACCESS
        assert sent(pci) == INIT
        assert wait_until(lambda: not pci.sim.flr_in_progress)
        assert_gates_consistent(pci.sim)
        assert_protocol_invariants(pci)


def test_flr_during_bring_up_is_reported_as_the_flr_not_as_a_missing_table(monkeypatch):
    with open_sim(revoke_after_s=None) as pci:
        read_vram_size = AMDDevice._DRIVER_STEPS["read_vram_size"]

        def read_vram_size_then_flr(dev: AMDDevice) -> None:
            read_vram_size(dev)
            pci.pf.flr_now()  # the host resets the VF between the grant and discovery

        monkeypatch.setitem(AMDDevice._DRIVER_STEPS, "read_vram_size", read_vram_size_then_flr)
        with pytest.raises(FLRNotified, match="FLR") as info:
            AMDDevice(pci, ROOMY)
        assert isinstance(info.value.__cause__, DiscoveryError)  # what the FLR did to discovery stays visible
        assert sent(pci) == INIT + RELEASE
        assert_gates_consistent(pci.sim)


def test_vf_touches_no_pf_owned_block_and_no_register_outside_the_mailbox():
    calls = []
    handlers = {name: (lambda dev, name=name: calls.append(name)) for name in IP_STEP_NAMES}
    with open_sim() as pci:
        with AMDDevice(pci, ROOMY, ip_handlers=handlers, xccs=4) as dev:
            assert dev.deferred == []
        touched = set().union(*(s.touches for s in STEPS if s.name in calls))
        assert not touched & PF_OWNED, touched & PF_OWNED
        for forbidden in (
            "init_hw.psp",
            "init_hw.smu",
            "partial_boot_detect",
            "gfx.spatial_partition",
            "smu.set_clocks",
            "clock_gating.gfx",
            "scratch.write_state",
            "ih.read_aca_banks",
        ):
            assert forbidden not in calls
        assert calls == [s.name for s in dev.plan.steps if s.layer == "ip"]
        outside = [(dw, value) for dw, value, _ in pci.sim.mmio_writes if not MAILBOX_FIRST <= dw <= MAILBOX_LAST]
        assert outside == []
        assert [(offset, size) for offset, size, _ in pci.sim.config_writes] == [(PCI_COMMAND, 2)]


def test_pf_takes_the_pf_owned_steps_and_no_lease():
    calls = []
    handlers = {name: (lambda dev, name=name: calls.append(name)) for name in IP_STEP_NAMES}
    with open_sim(vf=False) as pci, AMDDevice(pci, ROOMY, ip_handlers=handlers, xccs=4) as dev:
        assert not dev.is_vf and dev.lease is None and dev.memory.paddr_base == 0
        assert {"init_hw.psp", "init_hw.smu", "gfx.spatial_partition", "scratch.write_state"} <= set(calls)
    assert pci.requests() == []
    assert "vf.release_init_access" not in dev.trace


def test_small_bar_reads_discovery_through_mm_index():
    with open_sim(bar0_mib=256) as pci, AMDDevice(pci, ROOMY) as dev:
        assert dev.vram.size < dev.vram_size and not dev.large_bar
        assert dev.discovery.ips == MI350X_VF_IPS
        assert any(dw == 0 for dw, _, accepted in pci.sim.mmio_writes if accepted)  # MM_INDEX was used


def test_mm_index_past_the_end_of_vram_reads_all_ones_and_writes_nowhere():
    with open_sim(vf=False, vram_mib=64, bar0_mib=16) as pci:
        regs, end = pci.map_registers(), 64 * MiB
        for address in (end - 4, end - 2, end, 1 << 40):
            regs.write32(MM_INDEX, (address & 0x7FFFFFFF) | MM_INDEX_ENABLE)
            regs.write32(MM_INDEX_HI, address >> 31)
            regs.write32(MM_DATA, 0x12345678)
            expected = 0x12345678 if address + 4 <= end else 0xFFFFFFFF
            assert regs.read32(MM_DATA) == expected, hex(address)
        assert len(pci.sim.vram) == end, "simulated VRAM is exactly the configured size"


@pytest.mark.parametrize("vf", [True, False])
@pytest.mark.parametrize("bar0_mib", [None, 8192, 32768])
def test_page_table_region_only_when_the_bar_cannot_map_all_vram(vf, bar0_mib):
    with open_sim(vf=vf, bar0_mib=bar0_mib) as pci, AMDDevice(pci, ROOMY) as dev:
        layout, usable = dev.memory.layout, (32768 - 384) * MiB
        boot_end = (1 * MiB if vf else 0) + BOOT_REGION_SIZE
        assert layout.boot == (boot_end - BOOT_REGION_SIZE, boot_end)
        if bar0_mib is None or bar0_mib == 32768:
            assert dev.large_bar and layout.page_table == (boot_end, boot_end) and layout.main == (boot_end, usable)
        else:
            page_tables = 64 * MiB  # 32384 MiB / 512 = 63.25 MiB, rounded up to a whole MiB
            assert not dev.large_bar and layout.page_table == (boot_end, boot_end + page_tables)
            assert layout.main == (boot_end + page_tables, usable)


@pytest.mark.parametrize("vram_mib", [1, 256, 384, 416, 417])
def test_vram_smaller_than_the_reserved_regions_names_the_sizes(vram_mib):
    with open_sim(vram_mib=vram_mib) as pci:
        with pytest.raises(DeviceError) as info:
            AMDDevice(pci, ROOMY)
        message = str(info.value)
        assert f"{vram_mib} MiB of VRAM" in message and "384 MiB reserved" in message and "32 MiB" in message
        assert "-0x" not in message and " -" not in message
        assert sent(pci) == INIT + RELEASE  # the lease taken before the failure went back, once
    assert_protocol_invariants(pci)


def test_vram_just_large_enough_for_the_reserved_regions_boots():
    with open_sim(vram_mib=418) as pci, AMDDevice(pci, ROOMY) as dev:
        assert dev.memory.layout.main == (33 * MiB, 34 * MiB)


def test_unknown_ip_handler_is_rejected_before_touching_the_device():
    with open_sim() as pci:
        with pytest.raises(ValueError, match="init_hw.nope"):
            AMDDevice(pci, ROOMY, ip_handlers={"init_hw.nope": lambda dev: None})
        assert pci.requests() == []


def test_dead_device_is_reported():
    with open_sim() as pci:
        pci.close()
        with pytest.raises(Exception, match="closed"):
            AMDDevice(pci, QUICK)


def test_all_ones_function_identifier_is_a_device_error(monkeypatch):
    with open_sim() as pci:
        monkeypatch.setattr(pci.sim, "_static", lambda dword: 0xFFFFFFFF)
        with pytest.raises(DeviceError, match="not responding"):
            AMDDevice(pci, QUICK)
        assert pci.requests() == []
