"""Shared helpers for the AMD driver tests: short timeouts, oracles over the simulator's wire log, a fake sysfs tree."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from fusegrad.runtime.support.amd.discovery import DISCOVERY_OFFSET_FROM_END, build_discovery
from fusegrad.runtime.support.amd.mailbox import MailboxTimeouts, Request
from fusegrad.runtime.support.amd.regs import (
    MAILBOX_TRN_BYTE,
    MAILBOX_TRN_DW0,
    RCC_CONFIG_MEMSIZE,
    RCC_IOV_FUNC_IDENTIFIER,
    TRN_MSG_VALID,
)
from fusegrad.runtime.support.amd.sim import SimPCIDevice, SimulatedFunction

# For paths expected to fail: short deadlines keep the suite fast.
QUICK = MailboxTimeouts(
    ack_clear_s=0.1, ack_s=0.1, event_s=0.15, retries=2, ack_clear_poll_s=0.001, ack_poll_s=0.001, event_poll_s=0.002
)
# For paths expected to succeed: room for a descheduled PF thread on a loaded machine, at no cost when all is well.
ROOMY = MailboxTimeouts(
    ack_clear_s=2.0, ack_s=2.0, event_s=2.0, retries=2, ack_clear_poll_s=0.001, ack_poll_s=0.001, event_poll_s=0.002
)
# For a wrong-but-ordinary event: each attempt must be long enough to see the PF's reply even on a loaded machine.
PATIENT = MailboxTimeouts(
    ack_clear_s=1.0, ack_s=1.0, event_s=0.3, retries=2, ack_clear_poll_s=0.001, ack_poll_s=0.001, event_poll_s=0.002
)
# Slack on "within its timeout" checks; the machine is noisy, so only gross overruns fail.
SLACK_S = 3.0


def request_budget(t: MailboxTimeouts) -> float:
    """Longest one mailbox request may take before it must have raised."""
    return t.ack_clear_s + t.retries * (t.ack_clear_s + t.ack_s + t.event_s)


def sent(pci: SimPCIDevice) -> list[tuple[int, int]]:
    """(request id, data2) of every request the VF put on the wire."""
    return [(m.id, m.data[1]) for m in pci.sim.sent]


def assert_protocol_invariants(pci: SimPCIDevice) -> None:
    """Facts §11 oracles that hold in every scenario: never a reset or FINI request, never a second release."""
    ids = pci.requests()
    forbidden = {Request.REQ_GPU_FINI_ACCESS, Request.REL_GPU_FINI_ACCESS, Request.REQ_GPU_RESET_ACCESS}
    assert not forbidden & set(ids), ids
    assert ids.count(Request.REL_GPU_INIT_ACCESS) <= 1, ids
    if Request.REL_GPU_INIT_ACCESS in ids:
        assert ids[-1] == Request.REL_GPU_INIT_ACCESS and Request.REQ_GPU_INIT_ACCESS in ids, ids


def assert_gates_consistent(sim: SimulatedFunction) -> None:
    """Full access means every gate open and no FLR running; an FLR means no access and, under FB protection, no FB."""
    with sim.lock:
        gates = {"fb": sim.fb_enabled, "mmio": sim.mmio_write_enabled, "doorbell": sim.doorbell_enabled}
        state = f"full_access={sim.full_access} flr_in_progress={sim.flr_in_progress} gates={gates}"
        if sim.full_access:
            assert all(gates.values()) and not sim.flr_in_progress, state
        if sim.flr_in_progress:
            assert not (sim.full_access or gates["mmio"] or gates["doorbell"]), state
            assert not (sim.config.fb_protection and gates["fb"]), state


class ManualClock:
    """A clock that moves only when a test says so, for a SimPCIDevice driven through `pf.step()`."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run_pf_until(pci: SimPCIDevice, clock: ManualClock, until: float) -> None:
    """Run the hand-driven PF through every action due up to time `until`, in order, then leave the clock there."""
    assert pci.pf is not None and until >= clock.now
    for _ in range(10_000):  # a PF that kept rescheduling at zero delay would otherwise hang the test
        if (wait := pci.pf.step()) is None or clock.now + wait > until:
            break
        clock.now += wait
    else:
        raise AssertionError(f"the simulated PF did not settle before t={until}")
    clock.now = until
    pci.pf.step()


def post_request(pci: SimPCIDevice, request: int, data2: int = 0) -> None:
    """What the VF puts on the wire for one request, register by register, without waiting for anything."""
    regs = pci.map_registers()
    regs.write8(MAILBOX_TRN_BYTE, 0)
    for i, value in enumerate((request, 0, data2, 0)):
        regs.write32(MAILBOX_TRN_DW0 + i, value)
    regs.write8(MAILBOX_TRN_BYTE, TRN_MSG_VALID)


def wait_until(condition: Callable[[], object], timeout_s: float = SLACK_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


def make_function(
    root: Path,
    address: str,
    vendor: int,
    device: int,
    *,
    class_code: int = 0x120000,
    subsystem: tuple[int, int] = (0x1002, 0x75A0),
    driver: str | None = None,
    physfn: str | None = None,
) -> Path:
    """One function directory in a fake /sys/bus/pci/devices tree."""
    path = root / address
    path.mkdir(parents=True)
    for name, value in (
        ("vendor", vendor),
        ("device", device),
        ("subsystem_vendor", subsystem[0]),
        ("subsystem_device", subsystem[1]),
    ):
        (path / name).write_text(f"0x{value:04x}\n")
    (path / "class").write_text(f"0x{class_code:06x}\n")
    if driver is not None:
        (root.parent / "drivers" / driver).mkdir(parents=True, exist_ok=True)
        os.symlink(f"../../drivers/{driver}", path / "driver")
    if physfn is not None:
        os.symlink(f"../{physfn}", path / "physfn")
    return path


def add_bar_files(path: Path, *, vram_mib: int = 1024, vf: bool = False) -> None:
    """resource0/2/5 and config as plain files: a PF whose BARs the real mmap path can map (VRAM file is sparse)."""
    config = bytearray(256)
    config[0:2], config[2:4], config[0x0B] = (0x1002).to_bytes(2, "little"), (0x75A0).to_bytes(2, "little"), 0x12
    (path / "config").write_bytes(bytes(config))
    (path / "enable").write_text("0\n")
    with open(path / "resource0", "wb") as f:
        f.truncate(vram_mib << 20)
        f.seek((vram_mib << 20) - DISCOVERY_OFFSET_FROM_END)
        f.write(build_discovery())
    (path / "resource2").write_bytes(bytes(64 * 1024))
    regs = bytearray(512 * 1024)
    regs[RCC_CONFIG_MEMSIZE * 4 : RCC_CONFIG_MEMSIZE * 4 + 4] = vram_mib.to_bytes(4, "little")
    regs[RCC_IOV_FUNC_IDENTIFIER * 4] = int(vf)
    (path / "resource5").write_bytes(bytes(regs))
