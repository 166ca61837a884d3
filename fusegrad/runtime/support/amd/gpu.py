"""A running AMD GPU: VM, IH ring, SDMA ring and a compute queue, programmed inside the VF lease, then used through
doorbells and memory only.

Lease policy (facts §12 item 1, docs/amd-vf.md): GIM revokes full access after 3 s (1.5 s with several VFs) and
FLRs the VF. So every MMIO write (VM context, ring and queue descriptors) happens during boot, inside the lease; the
lease is then released and work runs through doorbells and memory, which stay open after REL_INIT_ACCESS. Short
windows that need MMIO again (queue reset, teardown) re-request INIT_ACCESS and release it at once. TLB invalidation
outside a window goes through the compute queue (WRITE_DATA to the invalidation register, WAIT_REG_MEM on its ack).
Each submission first polls the mailbox, so a revocation or FLR raises FLRNotified instead of hanging, and every wait
has a deadline.
"""

from __future__ import annotations

import contextlib
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from . import pm4
from .device import AMDDevice
from .errors import DeviceError, GPUFault, LeaseRequired, PFEventError, QueueTimeout
from .ipregs import IPRegisters
from .mailbox import MailboxTimeouts
from .memory import KiB, MiB
from .pci import PCIDevice
from .vm import HUBS, INVALIDATE_VMID0_ALL, PAGE, GPUVM

COMPUTE_DOORBELL, SDMA_DOORBELL, IH_DOORBELL = (
    16,
    0x100,
    0x80,
)  # 64-bit doorbell slots (amdgpu-like layout; any free slot works)
RING_BYTES, IH_BYTES, SIGNAL_SLOTS = 256 * KiB, 64 * KiB, 512
IH_CLIENT_UTCL2, IH_CLIENT_VMC, IH_CLIENT_GRBM_CP, IH_CLIENT_SDMA0 = 0x1B, 0x12, 0x14, 0x08
IH_SRC_VM_FAULT, IH_SRC_BAD_OPCODE = 0, 183


@dataclass
class Ring:
    name: str
    paddr: int
    va: int
    nbytes: int
    doorbell: int
    rptr_paddr: int  # where the engine reports its read pointer
    unit: int  # bytes per wptr step: 4 for compute (dwords), 1 for SDMA (bytes)
    wptr: int = 0
    submitted: list[tuple[int, str]] = field(default_factory=list)  # (wptr after, packet description)


def describe_pm4(packet: list[int]) -> str:
    _, opcode, _ = pm4.parse_header(packet[0])
    return pm4.OPCODE_NAMES.get(opcode, f"opcode {opcode:#x}")


class AMDGPU:
    """Boots a function (PF or VF) to a usable compute queue and SDMA ring. Close it (or use `with`)."""

    def __init__(self, pci: PCIDevice, timeouts: MailboxTimeouts | None = None, *, wait_s: float = 10.0):
        self.wait_s = wait_s
        self.window_open = False
        self.released_after_boot = False
        self.pf_error: PFEventError | None = None
        handlers = {
            "init_hw.gmc": self._init_gmc,
            "init_hw.ih": self._init_ih,
            "init_hw.gfx": self._init_compute,
            "init_hw.sdma": self._init_sdma,
        }
        self.dev = AMDDevice(pci, timeouts, ip_handlers=handlers)
        try:
            self.signals_paddr, self.signals_va = self.alloc_mapped(SIGNAL_SLOTS * 8)
            self._next_signal = 0
            self.timeline = 0
            if self.dev.is_vf:
                # everything that needs MMIO is programmed: return the lease before the PF's timer runs out
                self.dev.lease.release()
                self.released_after_boot = True
        except BaseException:
            self.dev.close()
            raise

    # -- boot steps (inside the lease) ---------------------------------------------------------------------------------
    def _gate(self, what: str) -> None:
        if self.dev.is_vf and not (self.dev.lease.acquired or self.window_open):
            raise LeaseRequired(f"{what}: MMIO outside an access window would be dropped by the PF")

    def _init_gmc(self, dev: AMDDevice) -> None:
        self.dev = dev  # the boot plan runs these steps before AMDDevice() returns
        if not dev.large_bar:
            raise DeviceError(f"{dev.pci.address}: running work needs a large BAR0 (VRAM fully CPU-mapped)")
        self.bar = dev.vram.view()
        self.regs = IPRegisters(dev.regs, dev.discovery, self._gate)
        self.vm = GPUVM(dev.vram.write, dev.vram.read, dev.memory)
        for ip, name, value in self.vm.context_registers():
            self.regs.write(ip, name, value)
        self.invalidate_tlb_mmio()

    def invalidate_tlb_mmio(self) -> None:
        for ip, prefix in HUBS:
            self.regs.write(ip, f"{prefix}INVALIDATE_ENG17_REQ", INVALIDATE_VMID0_ALL)
            deadline = time.monotonic() + 1.0
            while not self.regs.read(ip, f"{prefix}INVALIDATE_ENG17_ACK") & 1:
                if time.monotonic() > deadline:
                    raise DeviceError(f"{ip} TLB invalidation was not acknowledged within 1 s")
                time.sleep(0.0005)
        self.vm.dirty = False

    def alloc_mapped(self, nbytes: int, *, executable: bool = False) -> tuple[int, int]:
        """(physical address, VA) of new zeroed VRAM mapped into the GPU VM."""
        size = max((nbytes + PAGE - 1) // PAGE * PAGE, PAGE)
        paddr = self.dev.memory.alloc(size, 2 * MiB if size >= 2 * MiB else PAGE)
        self.bar[paddr : paddr + size] = bytes(size)
        return paddr, self.vm.map(paddr, size, executable=executable)

    def staging(self, nbytes: int) -> tuple[memoryview, int] | None:
        """Host memory mapped into the GPU VM for uploads, grown as needed; None when the function has none to give."""
        if (alloc := getattr(self.dev.pci, "alloc_sysmem", None)) is None:
            return None
        if getattr(self, "_stage", None) is None or self._stage[2] < nbytes:
            size = max(1 << 20, 1 << (nbytes - 1).bit_length())
            view, bus = alloc(size)
            self._stage = (view, self.vm.map(bus, size, system=True), size)
        return self._stage[0], self._stage[1]

    def free_mapped(self, paddr: int, va: int) -> None:
        """Unmap, invalidate the TLBs (through the queue outside the lease), then free the memory."""
        self.vm.unmap(va)
        self.flush_tlb()
        self.dev.memory.free(paddr)

    def _init_ih(self, dev: AMDDevice) -> None:
        self.ih_paddr = dev.memory.alloc(IH_BYTES + PAGE, PAGE)  # the IH writes by MC (physical) address
        self.ih_wptr_paddr, self.ih_rptr = self.ih_paddr + IH_BYTES, 0
        self.bar[self.ih_paddr : self.ih_paddr + IH_BYTES + PAGE] = bytes(IH_BYTES + PAGE)
        w = self.regs.write
        w("OSSSYS", "IH_RB_BASE", (self.ih_paddr >> 8) & 0xFFFFFFFF)
        w("OSSSYS", "IH_RB_BASE_HI", self.ih_paddr >> 40)
        w("OSSSYS", "IH_RB_WPTR_ADDR_LO", self.ih_wptr_paddr & 0xFFFFFFFF)
        w("OSSSYS", "IH_RB_WPTR_ADDR_HI", self.ih_wptr_paddr >> 32)
        w("OSSSYS", "IH_RB_RPTR", 0)
        # the read pointer goes back by doorbell, so draining the ring needs no MMIO after the lease
        w("OSSSYS", "IH_DOORBELL_RPTR", OFFSET=IH_DOORBELL * 2, ENABLE=1)
        w("OSSSYS", "IH_RB_CNTL", RB_ENABLE=1, RB_SIZE=(IH_BYTES // 4).bit_length() - 1, WPTR_WRITEBACK_ENABLE=1)

    def _new_ring(self, name: str, doorbell: int, unit: int) -> Ring:
        paddr, va = self.alloc_mapped(RING_BYTES + PAGE)
        return Ring(name, paddr, va, RING_BYTES, doorbell, paddr + RING_BYTES, unit)

    def _init_compute(self, dev: AMDDevice) -> None:
        self.compute = q = self._new_ring("compute me1 pipe0 queue0", COMPUTE_DOORBELL, 4)
        self.eop_paddr, self.eop_va = self.alloc_mapped(4 * KiB)
        self.mqd_paddr, self.mqd_va = self.alloc_mapped(4 * KiB)
        w = self.regs.write
        w("GC", "GRBM_GFX_CNTL", MEID=1, PIPEID=0, QUEUEID=0, VMID=0)
        w("GC", "CP_MEC_DOORBELL_RANGE_LOWER", 0)
        w("GC", "CP_MEC_DOORBELL_RANGE_UPPER", 0x3FF << 2)
        w("GC", "CP_MQD_BASE_ADDR", self.mqd_va & 0xFFFFFFFC)
        w("GC", "CP_MQD_BASE_ADDR_HI", self.mqd_va >> 32)
        w("GC", "CP_HQD_VMID", 0)
        w("GC", "CP_HQD_PQ_BASE", (q.va >> 8) & 0xFFFFFFFF)
        w("GC", "CP_HQD_PQ_BASE_HI", q.va >> 40)
        rptr_va = q.va + RING_BYTES
        w("GC", "CP_HQD_PQ_RPTR_REPORT_ADDR", rptr_va & 0xFFFFFFFC)
        w("GC", "CP_HQD_PQ_RPTR_REPORT_ADDR_HI", rptr_va >> 32)
        w("GC", "CP_HQD_PQ_WPTR_POLL_ADDR", (rptr_va + 8) & 0xFFFFFFF8)
        w("GC", "CP_HQD_PQ_WPTR_POLL_ADDR_HI", (rptr_va + 8) >> 32)
        w("GC", "CP_HQD_PQ_DOORBELL_CONTROL", DOORBELL_OFFSET=q.doorbell * 2, DOORBELL_EN=1)
        queue_size = (RING_BYTES // 4).bit_length() - 2  # the ring holds 2^(QUEUE_SIZE+1) dwords
        w("GC", "CP_HQD_PQ_CONTROL", QUEUE_SIZE=queue_size, RPTR_BLOCK_SIZE=5, UNORD_DISPATCH=1, KMD_QUEUE=1)
        w("GC", "CP_HQD_EOP_BASE_ADDR", (self.eop_va >> 8) & 0xFFFFFFFF)
        w("GC", "CP_HQD_EOP_BASE_ADDR_HI", self.eop_va >> 40)
        w("GC", "CP_HQD_EOP_CONTROL", EOP_SIZE=(4 * KiB // 4).bit_length() - 2)
        w("GC", "CP_HQD_PQ_WPTR_LO", 0)
        w("GC", "CP_HQD_PQ_WPTR_HI", 0)
        w("GC", "CP_HQD_ACTIVE", ACTIVE=1)

    def _init_sdma(self, dev: AMDDevice) -> None:
        self.sdma = q = self._new_ring("sdma0 gfx", SDMA_DOORBELL, 1)
        w = self.regs.write
        rptr_va = q.va + RING_BYTES
        w("SDMA0", "SDMA_GFX_RB_BASE", (q.va >> 8) & 0xFFFFFFFF)
        w("SDMA0", "SDMA_GFX_RB_BASE_HI", q.va >> 40)
        w("SDMA0", "SDMA_GFX_RB_RPTR_ADDR_LO", rptr_va & 0xFFFFFFFC)
        w("SDMA0", "SDMA_GFX_RB_RPTR_ADDR_HI", rptr_va >> 32)
        w("SDMA0", "SDMA_GFX_RB_WPTR", 0)
        w("SDMA0", "SDMA_GFX_RB_WPTR_HI", 0)
        w("SDMA0", "SDMA_GFX_DOORBELL_OFFSET", OFFSET=q.doorbell * 2)
        w("SDMA0", "SDMA_GFX_DOORBELL", ENABLE=1)
        rb_size = (RING_BYTES // 4).bit_length() - 1
        w("SDMA0", "SDMA_GFX_RB_CNTL", RB_ENABLE=1, RB_SIZE=rb_size, RPTR_WRITEBACK_ENABLE=1)

    # -- access windows ------------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def mmio_window(self, why: str) -> Iterator[None]:
        """A short INIT_ACCESS window for MMIO (queue reset, teardown), released at once; a no-op on a PF."""
        if not self.dev.is_vf or self.dev.lease.acquired:
            yield
            return
        self.check_pf()
        self.dev.lease.request_init_access()
        self.window_open = True
        try:
            yield
        finally:
            self.window_open = False
            # the release's stale-event pre-ack would swallow an FLR notice posted during the window: look first
            with contextlib.suppress(PFEventError):
                self.check_pf()
            self.dev.lease.release()

    def check_pf(self) -> None:
        """Raise FLRNotified / UnrecoverableError when the PF revoked access or reset the VF since the last look.
        Once seen, the error sticks: after an FLR the queues and page tables are gone for good."""
        if self.pf_error is not None:
            raise self.pf_error
        try:
            self.dev.check_pf_events()
        except PFEventError as e:
            self.pf_error = e
            raise

    # -- submission ----------------------------------------------------------------------------------------------------
    def _rptr(self, ring: Ring) -> int:
        return struct.unpack_from("<Q", self.bar, ring.rptr_paddr)[0]

    def _submit(self, ring: Ring, packets: list[list[int]], describe) -> None:
        self.check_pf()
        dws = [dw for p in packets for dw in p]
        step = 4 // ring.unit
        nsteps = len(dws) * step
        ring_steps = ring.nbytes // ring.unit
        deadline = time.monotonic() + self.wait_s
        while ring.wptr + nsteps - self._rptr(ring) > ring_steps:
            if time.monotonic() > deadline:
                raise QueueTimeout(f"{ring.name}: no room for {len(dws)} dwords within {self.wait_s:g} s")
            time.sleep(0.0005)
        for p in packets:
            for dw in p:
                off = (ring.wptr * ring.unit) % ring.nbytes
                struct.pack_into("<I", self.bar, ring.paddr + off, dw)
                ring.wptr += step
            ring.submitted.append((ring.wptr, describe(p)))
        del ring.submitted[:-64]
        self.dev.doorbells.write64(ring.doorbell, ring.wptr)

    def submit_compute(self, packets: list[list[int]]) -> None:
        self._submit(self.compute, packets, describe_pm4)

    def submit_sdma(self, packets: list[list[int]]) -> None:
        self._submit(self.sdma, packets, lambda p: pm4.SDMA_NAMES.get(p[0] & 0xFF, str(p[0] & 0xFF)))

    # -- signals -------------------------------------------------------------------------------------------------------
    def new_signal(self) -> int:
        """VA of a fresh 8-byte timeline slot (zeroed)."""
        slot, self._next_signal = self._next_signal % SIGNAL_SLOTS, self._next_signal + 1
        struct.pack_into("<Q", self.bar, self.signal_paddr(self.signals_va + slot * 8), 0)
        return self.signals_va + slot * 8

    def signal_paddr(self, va: int) -> int:
        if 0 <= va - self.signals_va < SIGNAL_SLOTS * 8:
            return self.signals_paddr + va - self.signals_va
        found = self.vm.translate(va)
        assert found is not None and not found[1], f"signal {va:#x} is not mapped to VRAM"
        return found[0]

    def signal_value(self, va: int) -> int:
        return struct.unpack_from("<Q", self.bar, self.signal_paddr(va))[0]

    def wait(self, ring: Ring, signal_va: int, value: int, timeout_s: float | None = None) -> None:
        """Wait for the signal to reach value. Re-rings a doorbell that seems lost, raises on FLR, faults and hangs."""
        timeout_s = self.wait_s if timeout_s is None else timeout_s
        start = last_progress = time.monotonic()
        paddr, last_rptr = self.signal_paddr(signal_va), self._rptr(ring)
        next_pf_check = start
        while struct.unpack_from("<Q", self.bar, paddr)[0] < value:
            now = time.monotonic()
            if now >= next_pf_check:
                self.check_pf()
                self.check_faults()
                next_pf_check = now + 0.01
            if (rptr := self._rptr(ring)) != last_rptr:
                last_rptr, last_progress = rptr, now
            elif rptr < ring.wptr and now - last_progress > 0.05:
                self.dev.doorbells.write64(ring.doorbell, ring.wptr)  # a doorbell can be lost; ringing again is safe
                last_progress = now
            if now - start > timeout_s:
                raise QueueTimeout(self._hang_report(ring, signal_va, value, timeout_s))
            time.sleep(0.0002)

    def _hang_report(self, ring: Ring, signal_va: int, value: int, timeout_s: float) -> str:
        rptr = self._rptr(ring)
        stuck = next((what for after, what in ring.submitted if after > rptr), "none (all consumed)")
        last = ring.submitted[-1][1] if ring.submitted else "none"
        return (
            f"{ring.name}: signal {signal_va:#x} did not reach {value} within {timeout_s:g} s (it is "
            f"{self.signal_value(signal_va)}); the engine read up to {rptr} of {ring.wptr}, stuck at packet {stuck}; "
            f"last packet submitted: {last}"
        )

    # -- IH ------------------------------------------------------------------------------------------------------------
    def drain_ih(self) -> list[tuple[int, int, tuple[int, ...]]]:
        """(client, source, dwords) of every interrupt vector posted since the last call."""
        wptr = struct.unpack_from("<I", self.bar, self.ih_wptr_paddr)[0]
        out = []
        while self.ih_rptr != wptr:
            off = self.ih_rptr % IH_BYTES
            dws = struct.unpack_from("<8I", self.bar, self.ih_paddr + off)
            out.append((dws[0] & 0xFF, (dws[0] >> 8) & 0xFF, dws))
            self.ih_rptr = (self.ih_rptr + 32) % (2 * IH_BYTES)
        if out:
            self.dev.doorbells.write64(IH_DOORBELL, self.ih_rptr)
        return out

    def check_faults(self) -> None:
        for client, src, dws in self.drain_ih():
            if client in (IH_CLIENT_UTCL2, IH_CLIENT_VMC) and src == IH_SRC_VM_FAULT:
                hub = "GC" if client == IH_CLIENT_UTCL2 else "MMHUB"
                raise GPUFault(f"VM fault on the {hub} hub at page {dws[4] << 12 | dws[5] << 44:#x}")
            if src == IH_SRC_BAD_OPCODE and client in (IH_CLIENT_GRBM_CP, IH_CLIENT_SDMA0):
                ring = self.compute if client == IH_CLIENT_GRBM_CP else self.sdma
                rptr = dws[4] | dws[5] << 32
                what = next((w for after, w in ring.submitted if after > rptr), "an unknown packet")
                raise GPUFault(f"{ring.name} stopped on {what} (read pointer {rptr}): the engine rejected it")

    # -- high level ----------------------------------------------------------------------------------------------------
    def flush_tlb(self) -> None:
        """TLB invalidation after unmapping: MMIO inside a window, otherwise through the compute queue."""
        if not self.dev.is_vf or self.dev.lease.acquired or self.window_open:
            return self.invalidate_tlb_mmio()
        packets = []
        for ip, prefix in HUBS:
            req, ack = (
                self.regs.reg(ip, f"{prefix}INVALIDATE_ENG17_REQ"),
                self.regs.reg(ip, f"{prefix}INVALIDATE_ENG17_ACK"),
            )
            packets += [pm4.write_data_register(req.dword, INVALIDATE_VMID0_ALL), pm4.wait_register(ack.dword, 1, 1)]
        self.run_compute(packets)
        self.vm.dirty = False

    def hdp_flush_packet(self) -> list[int]:
        """Flush the host data path from the compute queue (me1 pipe0 is client CP2 of the NBIO flush registers)."""
        req = self.regs.reg("NBIF", "BIF_BX_PF0_GPU_HDP_FLUSH_REQ")
        done = self.regs.reg("NBIF", "BIF_BX_PF0_GPU_HDP_FLUSH_DONE")
        return pm4.hdp_flush(req.dword, done.dword, req.encode(CP2=1))

    def run_compute(self, packets: list[list[int]], timeout_s: float | None = None) -> None:
        """Submit an HDP flush, the packets, a RELEASE_MEM of the next timeline value, and wait for it."""
        self.check_pf()
        signal = self.new_signal()
        self.timeline += 1
        release = pm4.release_mem(signal, self.timeline, interrupt=True)
        self.submit_compute([self.hdp_flush_packet(), *packets, release])
        self.wait(self.compute, signal, self.timeline, timeout_s)

    def run_sdma(self, packets: list[list[int]], timeout_s: float | None = None) -> None:
        self.check_pf()
        signal = self.new_signal()
        self.submit_sdma([*packets, pm4.sdma_fence(signal, 1), pm4.sdma_trap()])
        self.wait(self.sdma, signal, 1, timeout_s)

    def reset_compute_queue(self) -> None:
        """Dequeue and reprogram the compute HQD in a short MMIO window (after a hang)."""
        with self.mmio_window("compute queue reset"):
            self.regs.write("GC", "GRBM_GFX_CNTL", MEID=1, PIPEID=0, QUEUEID=0, VMID=0)
            self.regs.write("GC", "CP_HQD_DEQUEUE_REQUEST", DEQUEUE_REQ=1)
            self._init_compute(self.dev)

    def close(self) -> None:
        """Teardown in a short window: deactivate the queue and the SDMA ring, then return everything."""
        if self.dev.closed:
            return
        try:
            if self.dev.booted:
                # after an FLR or RMA there is nothing left to tear down
                with contextlib.suppress(PFEventError), self.mmio_window("teardown"):
                    self.regs.write("GC", "GRBM_GFX_CNTL", MEID=1, PIPEID=0, QUEUEID=0, VMID=0)
                    self.regs.write("GC", "CP_HQD_DEQUEUE_REQUEST", DEQUEUE_REQ=1)
                    self.regs.write("SDMA0", "SDMA_GFX_RB_CNTL", 0)
        finally:
            self.dev.close()

    def __enter__(self) -> AMDGPU:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
