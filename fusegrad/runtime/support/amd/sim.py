"""A simulated MI350X function (PF or VF) behind the PCIDevice interface (facts sheet §9-§11).

`SimulatedFunction` is the chip: a BAR5 register file with the mailbox's bit semantics, sparse VRAM and doorbells,
config space, and the PF's access gates. On a VF, `SimulatedPF` runs beside it on a daemon thread and answers the
mailbox with configurable latencies and faults. Until the PF grants access, VRAM reads all 0xFF and ignores writes,
exactly the symptom seen on a real guest that skipped the handshake.
"""

from __future__ import annotations

import heapq
import itertools
import mmap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from . import regs as R
from .discovery import DISCOVERY_OFFSET_FROM_END, MI350X_VF_IPS, IPBlock, build_discovery
from .errors import PCIError
from .limits import check_count, check_seconds
from .mailbox import Event, Request
from .simgpu import SYSMEM_BASE, SimGPU
from .pci import AMD_VENDOR, ByteBAR, DoorbellBAR, PCIDevice, PCIFunction, RegisterBAR

MiB = 1 << 20
MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)  # Linux's value; Python < 3.13 does not export it
REGISTER_BAR_SIZE = 512 * 1024  # BAR5's real size is unconfirmed; it only has to cover the mailbox at 0x397C
DOORBELL_BAR_SIZE = 8 * MiB
CONFIG_SPACE_SIZE = 4096
U32 = 0xFFFFFFFF
MAX_MEMSIZE_MIB = U32 - 1
# Requests the PF defers while another function holds full access (facts §4c step 3).
DEFERRABLE = frozenset(
    {Request.REQ_GPU_INIT_DATA, Request.REQ_GPU_INIT_ACCESS, Request.REQ_GPU_FINI_ACCESS, Request.REQ_GPU_RESET_ACCESS}
)


@dataclass(frozen=True)
class SimConfig:
    """What to simulate. Latencies and times are seconds; every fault knob is off by default."""

    vf: bool = True
    address: str = "0000:83:00.0"
    vram_mib: int = 32768
    bar0_mib: int | None = None  # None: BAR0 covers all VRAM; smaller forces the MM_INDEX/MM_DATA path
    ips: tuple[IPBlock, ...] = MI350X_VF_IPS
    ack_latency_s: float = 0.001
    event_latency_s: float = 0.002
    crit_region_version: int = 1  # INIT_DATA_READY's data1; 2 adds an init-data header offset and size
    fb_protection: bool = True  # VF framebuffer closed until REQ_GPU_INIT_DATA
    write_discovery: bool = True  # False: the PF does not put a table at FB - 64 KiB
    revoke_after_s: float | None = 3.0  # GIM's default full-access timeout for one VF; None: the host raised it
    flr_after_s: float | None = None  # a host-initiated FLR this long after access was granted
    flr_duration_s: float = 0.02  # between FLR_NOTIFICATION and FLR_NOTIFICATION_CMPL
    # fault knobs (facts §11)
    never_ack: bool = False
    ack_no_event: bool = False
    wrong_event: int | None = None
    stale_event: int | None = None
    stuck_ack: bool = False
    no_rcv_clear: bool = False
    late_grant_s: float | None = None  # extra delay before INIT_ACCESS is granted
    busy_pf_s: float = 0.0  # extra delay on deferrable requests (another VF holds full access)
    guard_drop_every: int | None = None  # drop every Nth request without an ack (the PF's rate guard)
    drop_doorbell_every: int | None = None  # the GPU loses every Nth doorbell write
    hang_compute: bool = False  # the command processor never advances the compute queue

    def __post_init__(self) -> None:
        for name in ("ack_latency_s", "event_latency_s", "flr_duration_s", "busy_pf_s"):
            check_seconds(f"SimConfig.{name}", getattr(self, name), allow_zero=True)
        for name in ("revoke_after_s", "flr_after_s", "late_grant_s"):
            if getattr(self, name) is not None:
                check_seconds(f"SimConfig.{name}", getattr(self, name), allow_zero=True)
        # RCC_CONFIG_MEMSIZE is a 32-bit register in MiB, and all-ones means "not responding"
        check_count("SimConfig.vram_mib", self.vram_mib, maximum=MAX_MEMSIZE_MIB)
        if self.vram_mib * MiB <= DISCOVERY_OFFSET_FROM_END:
            raise ValueError(f"SimConfig.vram_mib={self.vram_mib} leaves no room for the discovery table")
        if self.bar0_mib is not None:
            check_count(f"SimConfig.bar0_mib (at most vram_mib={self.vram_mib})", self.bar0_mib, maximum=self.vram_mib)
        if self.guard_drop_every is not None:
            check_count("SimConfig.guard_drop_every", self.guard_drop_every, maximum=1 << 32)
        check_count("SimConfig.crit_region_version", self.crit_region_version, maximum=2)
        for name in ("wrong_event", "stale_event"):
            if getattr(self, name) is not None:
                check_count(f"SimConfig.{name} (an RCV_MSG_DATA0 dword)", getattr(self, name), minimum=0, maximum=U32)

    @property
    def vram_size(self) -> int:
        return self.vram_mib * MiB

    def function(self) -> PCIFunction:
        """How the function looks in a guest's sysfs: a passed-through VF has no physfn link there."""
        return PCIFunction(
            self.address, AMD_VENDOR, 0x75B0 if self.vf else 0x75A0, AMD_VENDOR, 0x75A0, 0x120000, None, None
        )


@dataclass(frozen=True)
class WireMessage:
    """One mailbox message as it crossed the wire, with its monotonic time."""

    id: int
    data: tuple[int, int, int]
    t: float = field(compare=False)


class SimulatedFunction:
    """The simulated chip state. Every access takes `lock`; `changed` wakes the PF thread."""

    def __init__(self, config: SimConfig):
        self.config = config
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        open_gates = not config.vf
        self.fb_enabled = open_gates or not config.fb_protection
        self.mmio_write_enabled = self.doorbell_enabled = open_gates
        self.full_access = False
        self.flr_in_progress = False  # between FLR_NOTIFICATION and FLR_NOTIFICATION_CMPL
        self.trn, self.rcv = [0] * 4, [0] * 4
        self.trn_valid, self.trn_ack, self.rcv_valid = False, config.stuck_ack, False
        self.send_seq = 0
        self.registers: dict[int, int] = {}
        # one contiguous mapping numpy can view; pages are only backed once touched (MAP_NORESERVE)
        self.vram = mmap.mmap(-1, config.vram_size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE)
        self.doorbells: dict[int, int] = {}
        self.config_space = bytearray(CONFIG_SPACE_SIZE)
        fn = config.function()
        for offset, size, value in (
            (0x00, 2, fn.vendor),
            (0x02, 2, fn.device),
            (0x09, 3, fn.class_code),
            (0x2C, 2, fn.subsystem_vendor),
            (0x2E, 2, fn.subsystem_device),
        ):
            self.config_space[offset : offset + size] = value.to_bytes(size, "little")
        # what happened, for tests
        self.sent: list[WireMessage] = []  # every VF request (TRN_MSG_VALID rising edge)
        self.posted: list[WireMessage] = []  # every PF event
        self.rcv_acks = 0
        self.mmio_writes: list[tuple[int, int, bool]] = []  # (dword, value, accepted), mailbox excluded
        self.config_writes: list[tuple[int, int, int]] = []
        self.pf_log: list[str] = []
        if config.stale_event is not None:
            self.rcv, self.rcv_valid = [config.stale_event, 0, 0, 0], True
        if not config.vf:
            self.pf_write_vram(config.vram_size - DISCOVERY_OFFSET_FROM_END, build_discovery(config.ips))
        self.gpu = SimGPU(self)

    def _static(self, dword: int) -> int | None:
        if dword == R.RCC_IOV_FUNC_IDENTIFIER:
            return (R.FUNC_IDENTIFIER_IS_VF | R.FUNC_IDENTIFIER_IOV_ENABLE) if self.config.vf else 0
        if dword == R.RCC_CONFIG_MEMSIZE:
            return self.config.vram_mib
        return None

    # -- VF side: BAR5 -------------------------------------------------------------------------------------------------
    def read32(self, dword: int) -> int:
        with self.lock:
            if (static := self._static(dword)) is not None:
                return static
            if dword == R.MAILBOX_CONTROL:
                return (
                    self.trn_valid * R.TRN_MSG_VALID
                    | self.trn_ack * R.TRN_MSG_ACK
                    | (self.rcv_valid * R.RCV_MSG_VALID) << 8
                )
            if R.MAILBOX_TRN_DW0 <= dword < R.MAILBOX_TRN_DW0 + 4:
                return self.trn[dword - R.MAILBOX_TRN_DW0]
            if R.MAILBOX_RCV_DW0 <= dword < R.MAILBOX_RCV_DW0 + 4:
                return self.rcv[dword - R.MAILBOX_RCV_DW0]
            if dword == R.MM_DATA:
                if (address := self._mm_address()) is None:
                    return 0xFFFFFFFF
                return int.from_bytes(self.read_vram(address, 4), "little")
            if (live := self.gpu.on_read(dword)) is not None:
                return live
            return self.registers.get(dword, 0)

    def _mm_address(self) -> int | None:
        """The VRAM address MM_INDEX/MM_INDEX_HI select, or None when its dword does not lie inside VRAM."""
        address = (self.registers.get(R.MM_INDEX_HI, 0) << 31) | (self.registers.get(R.MM_INDEX, 0) & 0x7FFFFFFF)
        return address if address + 4 <= self.config.vram_size else None

    def write32(self, dword: int, value: int) -> None:
        with self.lock:
            if dword == R.MAILBOX_CONTROL:
                self._write_control(0, value & 0xFF)
                self._write_control(1, (value >> 8) & 0xFF)
            elif R.MAILBOX_TRN_DW0 <= dword < R.MAILBOX_TRN_DW0 + 4:
                self.trn[dword - R.MAILBOX_TRN_DW0] = value
            elif dword == R.MAILBOX_INT_CNTL:
                self.registers[dword] = value
            elif R.MAILBOX_RCV_DW0 <= dword < R.MAILBOX_RCV_DW0 + 4:
                pass  # the PF's side of the mailbox is read-only to the VF
            else:
                accepted = self.mmio_write_enabled and self._static(dword) is None
                self.mmio_writes.append((dword, value, accepted))
                if accepted and dword == R.MM_DATA:
                    if (address := self._mm_address()) is not None:  # outside VRAM the write goes nowhere
                        self.write_vram(address, value.to_bytes(4, "little"))
                elif accepted:
                    self.registers[dword] = value
                    self.gpu.on_write(dword, value)

    def read8(self, offset: int) -> int:
        return (self.read32(offset // 4) >> (8 * (offset % 4))) & 0xFF

    def write8(self, offset: int, value: int) -> None:
        dword, byte = divmod(offset, 4)
        with self.lock:
            if dword == R.MAILBOX_CONTROL:
                self._write_control(byte, value)
            elif dword != R.MM_DATA:  # a byte store to MM_DATA is not a VRAM access here
                shift = 8 * byte
                self.write32(dword, (self.read32(dword) & ~(0xFF << shift)) | (value & 0xFF) << shift)

    def _write_control(self, byte: int, value: int) -> None:
        if byte == 0:
            valid = bool(value & R.TRN_MSG_VALID)
            if valid and not self.trn_valid:
                self.send_seq += 1
                self.sent.append(WireMessage(self.trn[0], (self.trn[1], self.trn[2], self.trn[3]), time.monotonic()))
                self.changed.notify_all()
            if not valid and not self.config.stuck_ack:
                self.trn_ack = False
            self.trn_valid = valid
        elif byte == 1 and value & R.RCV_MSG_ACK:
            self.rcv_valid = False
            self.rcv_acks += 1
            self.changed.notify_all()

    # -- VF side: BAR0, BAR2, config space -----------------------------------------------------------------------------
    def read_vram(self, offset: int, length: int) -> bytes:
        with self.lock:
            if not self.fb_enabled:
                return b"\xff" * length
            return bytes(self.vram[offset : offset + length])

    def write_vram(self, offset: int, data: bytes) -> None:
        with self.lock:
            if self.fb_enabled:
                self.pf_write_vram(offset, data)

    def read_doorbell(self, index: int) -> int:
        with self.lock:
            return self.doorbells.get(index, 0) if self.doorbell_enabled else 0xFFFFFFFFFFFFFFFF

    def write_doorbell(self, index: int, value: int) -> None:
        with self.lock:
            if self.doorbell_enabled:
                self.doorbells[index] = value
                self.gpu.on_doorbell(index, value)

    def config_read(self, offset: int, size: int) -> int:
        with self.lock:
            return int.from_bytes(self.config_space[offset : offset + size], "little")

    def config_write(self, offset: int, size: int, value: int) -> None:
        with self.lock:
            self.config_writes.append((offset, size, value))
            if (offset, size) == (R.PCI_COMMAND, 2):  # the only writable field modelled
                self.config_space[offset : offset + size] = value.to_bytes(size, "little")

    # -- PF side -------------------------------------------------------------------------------------------------------
    def pf_write_vram(self, offset: int, data: bytes) -> None:
        with self.lock:
            self.vram[offset : offset + len(data)] = data

    def pf_receive(self, seq: int) -> tuple[int, int, int, int] | None:
        """Facts §4c step 2: read TRN, clear RCV, drop RCV_MSG_VALID, set TRN_MSG_ACK. None if the VF withdrew."""
        with self.lock:
            if not self.trn_valid or seq != self.send_seq:
                return None
            if not self.config.no_rcv_clear:
                self.rcv = [0] * 4
            self.rcv_valid, self.trn_ack = False, True
            return self.trn[0], self.trn[1], self.trn[2], self.trn[3]

    def pf_post(self, event: int, data: tuple[int, int, int] = (0, 0, 0)) -> None:
        with self.lock:
            self.rcv, self.rcv_valid = [event, *data], True
            self.posted.append(WireMessage(event, data, time.monotonic()))

    def pf_wipe(self) -> None:
        """What an FLR leaves: empty VRAM, doorbells and registers (statics are computed, so they survive)."""
        with self.lock:
            self.vram.madvise(mmap.MADV_DONTNEED)  # private anonymous pages read back as zeros
            self.doorbells.clear()
            self.registers.clear()
            self.gpu.reset()


class SimulatedPF:
    """The host's PF driver as seen from one VF, answering the mailbox per facts §4c and §10.

    It runs every action under the function's lock, so the VF never sees a half-done transition. With the default
    clock a daemon thread drives it; with a `clock` of the test's own there is no thread, and the test calls `step()`
    after moving its clock, which makes any interleaving of VF requests, revokes and FLRs reproducible.
    """

    def __init__(self, fn: SimulatedFunction, clock: Callable[[], float] | None = None):
        self.fn, self.config = fn, fn.config
        self.clock = clock or time.monotonic
        self._heap: list[tuple[float, int, Callable[..., None], tuple]] = []
        self._order = itertools.count()
        self._seen_seq = self._received = 0
        self._generation = 0  # bumped when full access ends, which cancels its pending timers
        self._deferred: list[tuple[int, tuple[int, int, int]]] = []  # requests that arrived during an FLR
        self._stopping = False
        self.errors: list[BaseException] = []
        self.thread: threading.Thread | None = None
        if clock is None:
            self.thread = threading.Thread(target=self._run, name=f"SimulatedPF-{self.config.address}", daemon=True)
            self.thread.start()

    def _schedule(self, delay: float, action: Callable[..., None], *args: object) -> None:
        heapq.heappush(self._heap, (self.clock() + delay, next(self._order), action, args))

    def step(self) -> float | None:
        """Run every action due by the clock; returns the seconds until the next one, None when nothing is pending."""
        with self.fn.changed:
            if self.fn.send_seq != self._seen_seq:
                self._seen_seq = self.fn.send_seq
                self._schedule(self.config.ack_latency_s, self._receive, self._seen_seq)
            while self._heap and self._heap[0][0] <= self.clock() and not self._stopping:
                _, _, action, args = heapq.heappop(self._heap)
                try:
                    action(*args)
                except Exception as e:  # noqa: BLE001 -- kept for tests; a crashed responder would hang the VF
                    self.errors.append(e)
            return max(self._heap[0][0] - self.clock(), 0.0) if self._heap else None

    def _run(self) -> None:
        with self.fn.changed:
            while not self._stopping:
                self.fn.changed.wait(self.step())

    def close(self) -> None:
        with self.fn.changed:
            self._stopping = True
            self.fn.changed.notify_all()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout=5)

    def flr_now(self, reason: str = "host-initiated FLR", *, force: bool = False) -> None:
        """Revoke full access and FLR the VF at once, as the host may at any time; without a grant only when forced
        (a host reset of a VF that runs from doorbells after releasing its lease)."""
        with self.fn.changed:
            self._flr(self._generation, reason, force)
            self.fn.changed.notify_all()  # the PF thread sleeps until its old next deadline otherwise

    def _log(self, line: str) -> None:
        self.fn.pf_log.append(line)

    def _receive(self, seq: int) -> None:
        self._received += 1
        if self.config.never_ack:
            return self._log("request ignored (never_ack)")
        if self.config.guard_drop_every and self._received % self.config.guard_drop_every == 0:
            return self._log("request dropped by the rate guard, no ack")
        message = self.fn.pf_receive(seq)
        if message is None:
            return self._log("request withdrawn before the PF read it")
        request, *data = message
        delay = self.config.event_latency_s
        if request in DEFERRABLE:
            delay += self.config.busy_pf_s
        if request == Request.REQ_GPU_INIT_ACCESS and self.config.late_grant_s is not None:
            delay += self.config.late_grant_s
        self._schedule(delay, self._handle, request, tuple(data))

    def _reply(self, event: int, data: tuple[int, int, int] = (0, 0, 0)) -> None:
        if self.config.ack_no_event:
            return self._log(f"reply {event} withheld (ack_no_event)")
        self.fn.pf_post(self.config.wrong_event if self.config.wrong_event is not None else event, data)

    def _handle(self, request: int, data: tuple[int, int, int]) -> None:
        fn, config = self.fn, self.config
        if fn.flr_in_progress:
            # GIM queues a VF's events behind its reset: served now, the FLR's completion would wipe what they set up
            self._deferred.append((request, data))
            return self._log(f"request {request} deferred until the FLR completes")
        if request == Request.REQ_GPU_INIT_DATA:
            fn.fb_enabled = True
            if config.write_discovery:
                fn.pf_write_vram(config.vram_size - DISCOVERY_OFFSET_FROM_END, build_discovery(config.ips))
            self._log("INIT_DATA: framebuffer opened, discovery written")
            version = config.crit_region_version if data[1] >= config.crit_region_version else 1
            self._reply(Event.REQ_GPU_INIT_DATA_READY, (version, 0, 132) if version == 2 else (1, 0, 0))
        elif request == Request.REQ_GPU_INIT_ACCESS:
            fn.fb_enabled = fn.mmio_write_enabled = fn.doorbell_enabled = fn.full_access = True
            self._generation += 1
            if config.revoke_after_s is not None:
                self._schedule(config.revoke_after_s, self._flr, self._generation, "full-access timeout")
            if config.flr_after_s is not None:
                self._schedule(config.flr_after_s, self._flr, self._generation, "host-initiated FLR")
            self._log("INIT_ACCESS: full access granted")
            self._reply(Event.READY_TO_ACCESS_GPU)
        elif request == Request.REL_GPU_INIT_ACCESS:
            if not fn.full_access:
                return self._log("REL_INIT_ACCESS ignored: no matching REQ")
            fn.full_access = fn.mmio_write_enabled = False
            self._generation += 1
            self._log("REL_INIT_ACCESS: full access ended, MMIO writes disabled")
        elif request == Request.REQ_GPU_FINI_ACCESS:
            self._log("FINI_ACCESS requested")
            self._reply(Event.READY_TO_ACCESS_GPU)
        elif request == Request.REL_GPU_FINI_ACCESS:
            # leaving full access, as REL_INIT_ACCESS does; the framebuffer closes only under FB protection (facts §10)
            fn.full_access = fn.mmio_write_enabled = fn.doorbell_enabled = False
            fn.fb_enabled = fn.fb_enabled and not config.fb_protection
            self._generation += 1
            self._log("REL_FINI_ACCESS: full access ended, framebuffer and doorbells closed")
        else:
            self._log(f"request {request} not handled")

    def _flr(self, generation: int, reason: str, force: bool = False) -> None:
        if not force and (generation != self._generation or not self.fn.full_access):
            return
        fn = self.fn
        fn.full_access = fn.mmio_write_enabled = fn.doorbell_enabled = False
        # the framebuffer is being reset too: under FB protection it stays closed until the next INIT_DATA
        fn.fb_enabled = fn.fb_enabled and not self.config.fb_protection
        fn.flr_in_progress = True
        self._generation += 1
        self._log(f"{reason}: access revoked, FLR started")
        fn.pf_post(Event.FLR_NOTIFICATION)
        self._schedule(self.config.flr_duration_s, self._flr_done)

    def _flr_done(self) -> None:
        self.fn.pf_wipe()
        self.fn.flr_in_progress = False
        self._log("FLR complete: VRAM and registers wiped")
        self.fn.pf_post(Event.FLR_NOTIFICATION_CMPL)
        for request, data in self._deferred:
            self._schedule(self.config.event_latency_s, self._handle, request, data)
        self._deferred.clear()


class _SimBAR:
    def __init__(self, device: SimPCIDevice, size: int, what: str):
        self._device, self.size, self._what = device, size, what

    def _check(self, offset: int, length: int) -> SimulatedFunction:
        if self._device.closed:
            raise PCIError(f"simulated device {self._device.address} is closed")
        if offset < 0 or length < 0 or offset + length > self.size:
            raise IndexError(
                f"{self._what}: access of {length} bytes at {offset:#x} is outside the BAR's {self.size:#x} bytes"
            )
        return self._device.sim


class _SimVRAM(_SimBAR, ByteBAR):
    def view(self) -> memoryview:
        """All of BAR0 as writable memory (a large BAR is CPU-mapped VRAM)."""
        return memoryview(self._check(0, self.size).vram)[: self.size]

    def read(self, offset: int, length: int) -> bytes:
        return self._check(offset, length).read_vram(offset, length)

    def write(self, offset: int, data: bytes) -> None:
        self._check(offset, len(data)).write_vram(offset, data)


class _SimRegisters(_SimBAR, RegisterBAR):
    def read32(self, dword: int) -> int:
        return self._check(dword * 4, 4).read32(dword)

    def write32(self, dword: int, value: int) -> None:
        self._check(dword * 4, 4).write32(dword, value & 0xFFFFFFFF)

    def read8(self, offset: int) -> int:
        return self._check(offset, 1).read8(offset)

    def write8(self, offset: int, value: int) -> None:
        self._check(offset, 1).write8(offset, value & 0xFF)


class _SimDoorbells(_SimBAR, DoorbellBAR):
    def read64(self, index: int) -> int:
        return self._check(index * 8, 8).read_doorbell(index)

    def write64(self, index: int, value: int) -> None:
        self._check(index * 8, 8).write_doorbell(index, value & 0xFFFFFFFFFFFFFFFF)


class SimPCIDevice(PCIDevice):
    """A simulated function behind the PCIDevice interface. Close it (or use `with`) to stop the PF thread."""

    def __init__(self, config: SimConfig | None = None, *, pf_clock: Callable[[], float] | None = None):
        """`pf_clock`: drive the simulated PF by hand (`pf.step()`) on this clock instead of on its own thread."""
        self.config = config or SimConfig()
        self.function = self.config.function()
        self.sim = SimulatedFunction(self.config)
        self.pf = SimulatedPF(self.sim, pf_clock) if self.config.vf else None
        self.closed = False

    def map_vram(self) -> ByteBAR:
        bar0 = self.config.bar0_mib * MiB if self.config.bar0_mib is not None else self.config.vram_size
        return _SimVRAM(self, bar0, f"BAR0 of {self.address}")

    def map_doorbells(self) -> DoorbellBAR:
        return _SimDoorbells(self, DOORBELL_BAR_SIZE, f"BAR2 of {self.address}")

    def map_registers(self) -> RegisterBAR:
        return _SimRegisters(self, REGISTER_BAR_SIZE, f"BAR5 of {self.address}")

    def config_read(self, offset: int, size: int) -> int:
        if self.closed:
            raise PCIError(f"simulated device {self.address} is closed")
        return self.sim.config_read(offset, size)

    def config_write(self, offset: int, size: int, value: int) -> None:
        if self.closed:
            raise PCIError(f"simulated device {self.address} is closed")
        self.sim.config_write(offset, size, value)

    def alloc_sysmem(self, size: int) -> tuple[memoryview, int]:
        """Host memory the simulated GPU may reach by DMA: (memory, bus address)."""
        gpu = self.sim.gpu
        with self.sim.lock:
            bus = max((b + len(m) for b, m in gpu.sysmem.items()), default=SYSMEM_BASE)
            bus = (bus + 0xFFF) & ~0xFFF
            gpu.sysmem[bus] = buf = bytearray(size)
        return memoryview(buf), bus

    def register_kernel(
        self,
        code_va: int,
        code: bytes,
        twin: Callable[..., None] | None = None,
        kernarg_user_sgpr: int = 0,
        *,
        name: str = "",
        compare: bool = False,
    ) -> None:
        """Tell the simulator about the code at code_va (which must then hold `code`): its name for error
        messages, and optionally a twin. A twin with compare=False stands in for the machine code (called with the
        dispatch); with compare=True it is called with the dispatch and a function that runs the emulator, to
        check the emulator's results. The kernarg pointer is read from COMPUTE_USER_DATA_<kernarg_user_sgpr>."""
        from .simgpu import SimKernel

        with self.sim.lock:
            self.sim.gpu.kernels[code_va] = SimKernel(bytes(code), twin, kernarg_user_sgpr, name, compare)

    def close(self) -> None:
        self.closed = True
        if self.pf is not None:
            self.pf.close()
        self.sim.gpu.close()

    def requests(self) -> list[int]:
        """IDs of every request the VF sent, in order."""
        return [m.id for m in self.sim.sent]

    def __del__(self) -> None:
        if getattr(self, "pf", None) is not None:
            self.pf.close()
        if getattr(self, "sim", None) is not None:
            self.sim.gpu.close()


def open_sim(**knobs: object) -> SimPCIDevice:
    """A simulated function; keyword arguments are SimConfig fields."""
    return SimPCIDevice(SimConfig(**knobs))  # type: ignore[arg-type]
