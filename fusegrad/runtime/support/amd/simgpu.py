"""The simulated MI350X's engines: registers with side effects, VM walks, the command processor, SDMA and IH.

`SimGPU` sits behind `SimulatedFunction`'s BAR5 and doorbells. A daemon thread (the command processor) drains the
compute queue (PM4) and the SDMA ring whenever a doorbell moves a write pointer. Every memory access by an engine goes
through VM context 0's page tables in simulated VRAM, with a TLB that only an invalidation request empties, so a
missing mapping faults (an IH entry and a queue error) and a missing invalidation reads stale translations.

DISPATCH_DIRECT runs the machine code at COMPUTE_PGM_LO/HI in the CDNA3 wave emulator (`emu/`), which fetches the
code and reaches memory through the same page tables. A kernel registered with a twin (a Python callable) either
stands in for machine code that does not exist (tests of the command processor) or, with `compare`, runs after the
emulator as its oracle. The code bytes at a registered address must match what was registered.
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from . import pm4
from .discovery import Discovery
from .ipregs import resolve, sh_register
from .vm import ADDRESS_MASK, ENTRIES, LEVEL_SHIFTS, PDE_ADDRESS_MASK, PDE_IS_PTE, PTE_SYSTEM, PTE_VALID

IH_CLIENT_UTCL2, IH_CLIENT_VMC, IH_CLIENT_GRBM_CP, IH_CLIENT_SDMA0 = 0x1B, 0x12, 0x14, 0x08
IH_SRC_VM_FAULT, IH_SRC_CP_EOP, IH_SRC_BAD_OPCODE, IH_SRC_SDMA_TRAP = 0, 181, 183, 224
IV_BYTES = 32
SYSMEM_BASE = 1 << 44
WAIT_FUNCS = {
    3: ("==", lambda a, b: a == b),
    4: ("!=", lambda a, b: a != b),
    5: (">=", lambda a, b: a >= b),
}  # simulated host bus addresses start here, far above VRAM


class SimFault(Exception):
    """An engine hit something the hardware would stop on (a VM fault, a bad packet, a wrong code address)."""

    posted = False  # whether an interrupt already told the host (VM faults post their own)


@dataclass
class SimQueue:
    name: str
    hub: str  # "GC" or "MMHUB"
    ring_va: int
    ring_bytes: int
    doorbell: int
    rptr_va: int
    wptr: int = 0  # dwords for compute, bytes for SDMA (as the doorbell carries them)
    rptr: int = 0
    executed: list[str] = field(default_factory=list)
    error: str | None = None
    waiting: str | None = None  # a WAIT_REG_MEM that has not been satisfied yet


@dataclass(frozen=True)
class SimKernel:
    """What the driver told the simulator about the code at an address (the GPU itself is told nothing)."""

    code: bytes
    twin: Callable[..., None] | None = None
    kernarg_user_sgpr: int = 0
    name: str = ""
    compare: bool = False  # the twin checks the emulator's results instead of replacing it


@dataclass
class SimDispatch:
    """What a kernel twin sees: its grid, its kernarg pointer, and memory through the page tables."""

    gpu: SimGPU
    kernarg_va: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]

    def read(self, va: int, n: int) -> bytes:
        return self.gpu.mem_read("GC", va, n)

    def kernarg_pointers(self, n: int) -> list[int]:
        return list(struct.unpack(f"<{n}Q", self.read(self.kernarg_va, 8 * n)))

    def view(self, va: int, nbytes: int) -> memoryview:
        """Writable memory at va: VRAM (or host) physically contiguous for nbytes, as mapped."""
        return self.gpu.contiguous_view("GC", va, nbytes)


class SimGPU:
    def __init__(self, fn):
        self.fn = fn
        disc = Discovery((1, 0), 4, tuple(fn.config.ips), None, ())
        self.by_dword = {r.dword: (ip, name) for (ip, name), r in resolve(disc).items()}
        self.dword_of = {(ip, name): r.dword for (ip, name), r in resolve(disc).items()}
        self.sysmem: dict[int, bytearray] = {}  # bus address -> host memory the GPU may DMA to
        self.tlb: dict[str, dict[int, tuple[int, int, bool]]] = {"GC": {}, "MMHUB": {}}
        self.kernels: dict[int, SimKernel] = {}
        self._emu = None
        self.dispatch_errors: list[str] = []
        self.compute: dict[tuple[int, int, int], SimQueue] = {}  # (me, pipe, queue) -> active HQD
        self.sdma: SimQueue | None = None
        self.ih_rptr = 0  # bytes, as the host reports it through the IH doorbell
        self.ih_wptr = 0
        self.ih_overflows = 0
        self.trace: list[str] = []  # what went over the rings, for `fusegrad-amd run --sim`
        self.doorbells_seen = 0
        self.hdp_flushes = 0
        self.sh_state: dict[str, dict[int, int]] = {}  # SH registers each queue has set (they persist, as on the GPU)
        self._stopping = False
        self.thread = threading.Thread(target=self._run, name="SimGPU-CP", daemon=True)
        self.thread.start()

    @property
    def emu(self):
        """The wave emulator (numpy), made on the first dispatch so the driver layer itself needs only the stdlib."""
        if self._emu is None:
            from .emu import Emulator

            self._emu = Emulator(
                lambda va: self._walk("GC", va),
                lambda va, n: self.mem_read("GC", va, n),
                lambda va, data: self.mem_write("GC", va, data),
                self.fn.vram,
            )
        return self._emu

    # -- registers ----------------------------------------------------------------------------------------------------
    def reg(self, ip: str, name: str) -> int:
        return self.fn.registers.get(self.dword_of[ip, name], 0)

    def _set(self, ip: str, name: str, value: int) -> None:
        self.fn.registers[self.dword_of[ip, name]] = value & 0xFFFFFFFF

    def on_write(self, dword: int, value: int) -> None:
        """Side effects of an accepted register write (from the host or from a queue's WRITE_DATA)."""
        if (key := self.by_dword.get(dword)) is None:
            return
        ip, name = key
        if name.endswith("INVALIDATE_ENG17_REQ"):
            self.tlb["GC" if ip == "GC" else "MMHUB"].clear()
            self._set(ip, name.replace("_REQ", "_ACK"), value & 0xFFFF)
        elif name == "CP_HQD_ACTIVE":
            self._hqd_active(value & 1)
        elif name == "CP_HQD_DEQUEUE_REQUEST" and value & 3:
            self.compute.pop(self._selected(), None)
            self._set("GC", "CP_HQD_ACTIVE", 0)
        elif name == "SDMA_GFX_RB_CNTL":
            self._sdma_cntl(value)
        elif name == "BIF_BX_PF0_GPU_HDP_FLUSH_REQ":
            self.hdp_flushes += 1  # the flush completes at once: the done register reports the requesting clients
            self._set("NBIF", "BIF_BX_PF0_GPU_HDP_FLUSH_DONE", value)

    def on_read(self, dword: int) -> int | None:
        """Registers that report engine state: the selected HQD's read pointer and active bit, SDMA's read pointer."""
        key = self.by_dword.get(dword)
        if key == ("GC", "CP_HQD_PQ_RPTR"):
            q = self.compute.get(self._selected())
            return (q.rptr % (q.ring_bytes // 4)) if q else 0
        if key == ("GC", "CP_HQD_ACTIVE"):
            return int(self._selected() in self.compute)
        if key == ("SDMA0", "SDMA_GFX_RB_RPTR"):
            return (self.sdma.rptr % self.sdma.ring_bytes) if self.sdma else 0
        return None

    def _selected(self) -> tuple[int, int, int]:
        v = self.reg("GC", "GRBM_GFX_CNTL")
        return (v >> 2) & 3, v & 3, (v >> 8) & 7

    def _hqd_active(self, active: int) -> None:
        sel = self._selected()
        if not active:
            self.compute.pop(sel, None)
            return
        r = lambda n: self.reg("GC", n)  # noqa: E731
        control = r("CP_HQD_PQ_CONTROL")
        ring_bytes = 4 << ((control & 0x3F) + 1)
        doorbell_control = r("CP_HQD_PQ_DOORBELL_CONTROL")
        if not doorbell_control >> 30 & 1:
            raise SimFault("CP_HQD_ACTIVE set with the doorbell disabled")
        self.compute[sel] = SimQueue(
            f"compute me{sel[0]} pipe{sel[1]} queue{sel[2]}",
            "GC",
            (r("CP_HQD_PQ_BASE") << 8) | (r("CP_HQD_PQ_BASE_HI") << 40),
            ring_bytes,
            ((doorbell_control >> 2) & 0x3FFFFFF) // 2,
            r("CP_HQD_PQ_RPTR_REPORT_ADDR") | r("CP_HQD_PQ_RPTR_REPORT_ADDR_HI") << 32,
            wptr=r("CP_HQD_PQ_WPTR_LO") | r("CP_HQD_PQ_WPTR_HI") << 32,
        )
        self.compute[sel].rptr = self.compute[sel].wptr

    def _sdma_cntl(self, value: int) -> None:
        if not value & 1:
            self.sdma = None
            return
        r = lambda n: self.reg("SDMA0", n)  # noqa: E731
        if not r("SDMA_GFX_DOORBELL") >> 28 & 1:
            raise SimFault("SDMA ring enabled with its doorbell disabled")
        self.sdma = SimQueue(
            "sdma0 gfx",
            "MMHUB",
            (r("SDMA_GFX_RB_BASE") << 8) | (r("SDMA_GFX_RB_BASE_HI") << 40),
            4 << ((value >> 1) & 0x3F),
            (r("SDMA_GFX_DOORBELL_OFFSET") >> 2 & 0x3FFFFFF) // 2,
            r("SDMA_GFX_RB_RPTR_ADDR_LO") | r("SDMA_GFX_RB_RPTR_ADDR_HI") << 32,
            wptr=r("SDMA_GFX_RB_WPTR") | r("SDMA_GFX_RB_WPTR_HI") << 32,
        )
        self.sdma.rptr = self.sdma.wptr

    def on_doorbell(self, index: int, value: int) -> None:
        ih_doorbell = self.reg("OSSSYS", "IH_DOORBELL_RPTR")
        if ih_doorbell >> 28 & 1 and index == (ih_doorbell & 0x3FFFFFF) // 2:
            self.ih_rptr = value  # the host consumed interrupt vectors up to here
            return
        self.doorbells_seen += 1
        every = self.fn.config.drop_doorbell_every
        if every and self.doorbells_seen % every == 0:
            self.trace.append(f"doorbell {index} = {value} DROPPED (fault injection)")
            return
        for q in [*self.compute.values(), self.sdma]:
            if q is not None and q.doorbell == index:
                q.wptr = value
        self.fn.changed.notify_all()

    def reset(self) -> None:
        """What an FLR does to the engines: every queue gone, TLBs empty, host mappings forgotten."""
        self.compute.clear()
        self.sdma = None
        self.ih_rptr = 0
        for t in self.tlb.values():
            t.clear()
        self.ih_wptr = 0

    # -- memory -------------------------------------------------------------------------------------------------------
    def _walk(self, hub: str, va: int) -> tuple[int, int, bool]:
        """(page base address, page size, system) of va, through the TLB, or SimFault."""
        prefix = "VM_" if hub == "GC" else "MMVM_"
        page = va & ~0xFFF
        if (hit := self.tlb[hub].get(page)) is not None:
            return hit
        cntl = self.reg(hub, f"{prefix}CONTEXT0_CNTL")

        def pair(n: str) -> int:
            return self.reg(hub, f"{prefix}CONTEXT0_PAGE_TABLE_{n}_LO32") | (
                self.reg(hub, f"{prefix}CONTEXT0_PAGE_TABLE_{n}_HI32") << 32
            )

        start, end = pair("START_ADDR") << 12, pair("END_ADDR") << 12
        if not cntl & 1:
            raise self._fault(hub, va, "VM context 0 is not enabled")
        if not start <= va <= end + 0xFFF:
            raise self._fault(hub, va, f"outside the context's range [{start:#x}, {end + 0xFFF:#x}]")
        table = (
            self.reg(hub, f"{prefix}CONTEXT0_PAGE_TABLE_BASE_ADDR_LO32")
            | self.reg(hub, f"{prefix}CONTEXT0_PAGE_TABLE_BASE_ADDR_HI32") << 32
        ) & PDE_ADDRESS_MASK
        for level, shift in enumerate(LEVEL_SHIFTS):
            index = (va >> shift) & (ENTRIES - 1)
            (entry,) = struct.unpack_from("<Q", self.fn.vram, table + index * 8)
            if not entry & PTE_VALID:
                raise self._fault(hub, va, f"no valid entry at level {level}")
            if level == 3 or entry & PDE_IS_PTE:
                size = 1 << shift
                base = (entry & ADDRESS_MASK) & ~(size - 1)
                hit = (base + (page & (size - 1)), 0x1000, bool(entry & PTE_SYSTEM))
                self.tlb[hub][page] = hit
                return hit
            table = entry & PDE_ADDRESS_MASK
        raise AssertionError("unreachable")

    def _fault(self, hub: str, va: int, why: str) -> SimFault:
        self.post_iv(IH_CLIENT_UTCL2 if hub == "GC" else IH_CLIENT_VMC, IH_SRC_VM_FAULT, (va >> 12, va >> 44, 0, 0))
        fault = SimFault(f"VM fault on the {hub} hub at VA {va:#x}: {why}")
        fault.posted = True
        return fault

    def _backing(self, addr: int, system: bool) -> tuple[object, int]:
        if not system:
            if addr >= len(self.fn.vram):
                raise SimFault(f"physical address {addr:#x} is beyond VRAM")
            return self.fn.vram, addr
        for base, buf in self.sysmem.items():
            if base <= addr < base + len(buf):
                return buf, addr - base
        raise SimFault(f"system address {addr:#x} is not host memory the GPU may reach")

    def mem_read(self, hub: str, va: int, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            cur = va + len(out)
            addr, _, system = self._walk(hub, cur)
            take = min(n - len(out), 0x1000 - (cur & 0xFFF))
            buf, off = self._backing(addr + (cur & 0xFFF), system)
            out += buf[off : off + take]
        return bytes(out)

    def mem_write(self, hub: str, va: int, data: bytes) -> None:
        done = 0
        while done < len(data):
            cur = va + done
            addr, _, system = self._walk(hub, cur)
            take = min(len(data) - done, 0x1000 - (cur & 0xFFF))
            buf, off = self._backing(addr + (cur & 0xFFF), system)
            buf[off : off + take] = data[done : done + take]
            done += take

    def contiguous_view(self, hub: str, va: int, nbytes: int) -> memoryview:
        first, _, system = self._walk(hub, va)
        start = first + (va & 0xFFF)
        page = va & ~0xFFF
        while page + 0x1000 < va + nbytes:
            page += 0x1000
            addr, _, sys2 = self._walk(hub, page)
            if addr != start - (va & 0xFFF) + (page - (va & ~0xFFF)) or sys2 != system:
                raise SimFault(f"VA range {va:#x}+{nbytes} is not physically contiguous")
        buf, off = self._backing(start, system)
        return memoryview(buf)[off : off + nbytes]

    # -- IH -----------------------------------------------------------------------------------------------------------
    def post_iv(self, client: int, src: int, data: tuple[int, int, int, int], ring_id: int = 0) -> None:
        cntl = self.reg("OSSSYS", "IH_RB_CNTL")
        if not cntl & 1:
            return  # interrupts are dropped while the IH ring is off
        size = 4 << ((cntl >> 1) & 0x1F)
        if (self.ih_wptr - self.ih_rptr) % (2 * size) >= size:
            self.ih_overflows += 1  # the ring is full: the vector is lost (hardware sets RB_OVERFLOW)
            return
        base = self.reg("OSSSYS", "IH_RB_BASE") << 8 | self.reg("OSSSYS", "IH_RB_BASE_HI") << 40
        now = time.monotonic_ns()
        words = (client | src << 8 | ring_id << 16, now & 0xFFFFFFFF, (now >> 32) & 0xFFFF, 0)
        iv = struct.pack("<8I", *words, *(d & 0xFFFFFFFF for d in data))
        self.fn.vram[base + self.ih_wptr % size : base + self.ih_wptr % size + IV_BYTES] = iv
        self.ih_wptr = (self.ih_wptr + IV_BYTES) % (2 * size)
        wb = self.reg("OSSSYS", "IH_RB_WPTR_ADDR_LO") | self.reg("OSSSYS", "IH_RB_WPTR_ADDR_HI") << 32
        self._set("OSSSYS", "IH_RB_WPTR", self.ih_wptr)
        if cntl >> 8 & 1:
            self.fn.vram[wb : wb + 4] = struct.pack("<I", self.ih_wptr)

    # -- the command processor ----------------------------------------------------------------------------------------
    def _run(self) -> None:
        with self.fn.changed:
            while not self._stopping:
                busy = False
                for q in [*self.compute.values(), self.sdma]:
                    if q is not None and q.error is None and q.rptr != q.wptr:
                        busy |= self._drain(q)
                self.fn.changed.wait(0.002 if busy else 0.05)

    def _drain(self, q: SimQueue) -> bool:
        """Run q's packets up to its wptr; False when it stalls (a hang knob or an unmet WAIT_REG_MEM)."""
        if q.hub == "GC" and self.fn.config.hang_compute:
            return False
        unit = 4 if q.hub == "GC" else 1  # compute wptr counts dwords, SDMA's bytes
        try:
            while q.rptr != q.wptr:
                offset = (q.rptr * unit) % q.ring_bytes
                ndw = self._packet_dwords(q, offset)
                dws = struct.unpack(f"<{ndw}I", self._ring_read(q, offset, ndw * 4))
                if not self._execute(q, dws):
                    return False
                q.rptr += ndw * 4 // unit
                self.mem_write(q.hub, q.rptr_va, struct.pack("<Q", q.rptr))
        except SimFault as e:
            q.error = f"{e} (after {len(q.executed)} packets; last: {q.executed[-1] if q.executed else 'none'})"
            self.trace.append(f"{q.name}: ERROR {q.error}")
            if not e.posted:  # the engine stops on the packet: the host hears of it by interrupt, not by a hang
                client = IH_CLIENT_GRBM_CP if q.hub == "GC" else IH_CLIENT_SDMA0
                self.post_iv(client, IH_SRC_BAD_OPCODE, (q.rptr & 0xFFFFFFFF, q.rptr >> 32, 0, 0))
        return True

    def _ring_read(self, q: SimQueue, offset: int, n: int) -> bytes:
        first = min(n, q.ring_bytes - offset)
        return self.mem_read(q.hub, q.ring_va + offset, first) + self.mem_read(q.hub, q.ring_va, n - first)

    def _packet_dwords(self, q: SimQueue, offset: int) -> int:
        (h,) = struct.unpack("<I", self._ring_read(q, offset, 4))
        if q.hub == "GC":
            kind, opcode, body = pm4.parse_header(h)
            if kind != 3:
                raise SimFault(f"PM4 packet of type {kind} (header {h:#010x}) at ring offset {offset:#x}")
            return 1 + body
        if (op := h & 0xFF) not in pm4.SDMA_SIZES:
            raise SimFault(f"unknown SDMA opcode {op} (header {h:#010x}) at ring offset {offset:#x}")
        return pm4.SDMA_SIZES[op]

    def _execute(self, q: SimQueue, dws: tuple[int, ...]) -> bool:
        return self._pm4(q, dws) if q.hub == "GC" else self._sdma(q, dws)

    def _pm4(self, q: SimQueue, dws: tuple[int, ...], sh: dict[int, int] | None = None) -> bool:
        _, opcode, _ = pm4.parse_header(dws[0])
        name = pm4.OPCODE_NAMES.get(opcode, f"opcode {opcode:#x}")
        sh = self.sh_state.setdefault(q.name, {}) if sh is None else sh
        if opcode == pm4.NOP or opcode == pm4.ACQUIRE_MEM:
            pass
        elif opcode == pm4.SET_SH_REG:
            for i, v in enumerate(dws[2:]):
                sh[dws[1] + i] = v
            name += f" {dws[1]:#x}={','.join(f'{v:#x}' for v in dws[2:])}"
        elif opcode == pm4.DISPATCH_DIRECT:
            self._dispatch(sh, tuple(dws[1:4]))
            name += f" {dws[1]}x{dws[2]}x{dws[3]}"
        elif opcode == pm4.RELEASE_MEM:
            addr, value = dws[3] | dws[4] << 32, dws[5] | dws[6] << 32
            data_sel, int_sel = dws[2] >> 29 & 7, dws[2] >> 24 & 7
            data = struct.pack("<Q", value) if data_sel == 2 else struct.pack("<I", value & 0xFFFFFFFF)
            self.mem_write(q.hub, addr, data)
            if int_sel:
                self.post_iv(IH_CLIENT_GRBM_CP, IH_SRC_CP_EOP, (value & 0xFFFFFFFF, value >> 32, 0, 0))
            name += f" [{addr:#x}] = {value}"
        elif opcode == pm4.WAIT_REG_MEM:
            ref, mask, func = dws[4], dws[5], dws[1] & 7
            polled = dws[2]
            if dws[1] & pm4.WAIT_MEM_SPACE:
                (value,) = struct.unpack("<I", self.mem_read(q.hub, dws[2] | dws[3] << 32, 4))
            else:
                if dws[1] >> 6 & 3 == 1 and not q.waiting:  # write-wait-write: write reg0 once, then poll reg1
                    self.fn.registers[dws[2]] = ref
                    self.on_write(dws[2], ref)
                    polled = dws[3]
                elif dws[1] >> 6 & 3 == 1:
                    polled = dws[3]
                value = self.fn.registers.get(polled, 0)
            if func not in WAIT_FUNCS:
                raise SimFault(f"WAIT_REG_MEM compare function {func} is not modelled")
            symbol, compare = WAIT_FUNCS[func]
            ok = compare(value & mask, ref)
            if not ok:
                q.waiting = f"WAIT_REG_MEM {dws[2] | dws[3] << 32:#x} & {mask:#x} (is {value & mask}) vs {ref}"
                return False
            q.waiting = None
            where = f"{dws[2] | dws[3] << 32:#x}" if dws[1] & pm4.WAIT_MEM_SPACE else self._reg_name(polled)
            if dws[1] >> 6 & 3 == 1:
                where = f"write {self._reg_name(dws[2])} = {ref:#x}, then {where}"
            name += f" {where} & {mask:#x} {symbol} {ref}"
        elif opcode == pm4.WRITE_DATA:
            dst_sel, addr = dws[1] >> 8 & 0xF, dws[2] | dws[3] << 32
            if dst_sel == 0:  # a register, written by the CP on the driver's behalf
                for i, v in enumerate(dws[4:]):
                    self.fn.registers[addr + i] = v
                    self.on_write(addr + i, v)
            else:
                self.mem_write(q.hub, addr, struct.pack(f"<{len(dws) - 4}I", *dws[4:]))
            name += (
                f" {self._reg_name(addr) if dst_sel == 0 else f'{addr:#x}'} = {','.join(f'{v:#x}' for v in dws[4:])}"
            )
        elif opcode == pm4.INDIRECT_BUFFER:
            ib, size = dws[1] | (dws[2] & 0xFFFF) << 32, dws[3] & 0xFFFFF
            body = struct.unpack(f"<{size}I", self.mem_read(q.hub, ib, size * 4))
            i = 0
            while i < size:
                _, _, n = pm4.parse_header(body[i])
                if not self._pm4(q, body[i : i + 1 + n], sh):
                    raise SimFault("WAIT_REG_MEM inside an indirect buffer never completed")
                i += 1 + n
            name += f" {ib:#x} ({size} dw)"
        else:
            raise SimFault(f"unsupported PM4 {name} on {q.name}")
        q.executed.append(name)
        self.trace.append(f"{q.name}: {name}")
        return True

    def _reg_name(self, dword: int) -> str:
        ip_name = self.by_dword.get(dword)
        return f"{ip_name[0]}.{ip_name[1]}" if ip_name else f"register {dword:#x}"

    def _dispatch(self, sh: dict[int, int], grid: tuple[int, ...]) -> None:
        def g(name: str, plus: int = 0) -> int:
            return sh.get(sh_register(name).dword + plus, 0)

        entry = (g("COMPUTE_PGM_LO") << 8) | (g("COMPUTE_PGM_HI") << 40)
        reg = self.kernels.get(entry)
        if reg is not None and self.mem_read("GC", entry, len(reg.code)) != reg.code:
            raise SimFault(f"DISPATCH_DIRECT at {entry:#x}: the code in memory is not the registered kernel's")
        block = tuple(g(f"COMPUTE_NUM_THREAD_{axis}") & 0xFFFF for axis in "XYZ")
        sgpr = reg.kernarg_user_sgpr if reg is not None else 0
        kernarg = g("COMPUTE_USER_DATA_0", sgpr) | g("COMPUTE_USER_DATA_0", sgpr + 1) << 32
        d = SimDispatch(self, kernarg, (grid[0], grid[1], grid[2]), (block[0], block[1], block[2]))
        if reg is not None and reg.twin is not None and not reg.compare:
            reg.twin(d)
            return
        name = reg.name if reg is not None and reg.name else f"at {entry:#x}"
        user = [g("COMPUTE_USER_DATA_0", i) for i in range(16)]

        def emulate() -> None:
            from .emu import EmulatorError

            try:
                self.emu.run(entry, name, g("COMPUTE_PGM_RSRC2"), user, d.grid, d.block)
            except SimFault as e:  # a VM fault inside the kernel: the IH entry is posted; say which kernel
                fault = SimFault(f"kernel {name}: {e} ({self.emu.where(entry)})")
                fault.posted = e.posted
                self.dispatch_errors.append(str(fault))
                raise fault from e
            except EmulatorError as e:
                self.dispatch_errors.append(str(e))
                raise SimFault(str(e)) from e
            except Exception as e:  # an emulator bug must stop this dispatch, not the command processor
                msg = f"kernel {name}: emulator error {type(e).__name__}: {e}"
                self.dispatch_errors.append(msg)
                raise SimFault(msg) from e

        if reg is not None and reg.twin is not None:
            reg.twin(d, emulate)
        else:
            emulate()

    def _sdma(self, q: SimQueue, dws: tuple[int, ...]) -> bool:
        op = dws[0] & 0xFF
        name = pm4.SDMA_NAMES.get(op, str(op))
        if op == pm4.SDMA_COPY:
            n, src, dst = dws[1] + 1, dws[3] | dws[4] << 32, dws[5] | dws[6] << 32
            self.mem_write(q.hub, dst, self.mem_read(q.hub, src, n))
            name += f" {src:#x} -> {dst:#x} ({n} B)"
        elif op == pm4.SDMA_CONST_FILL:
            dst, value, n = dws[1] | dws[2] << 32, dws[3], dws[4] + 1
            self.mem_write(q.hub, dst, struct.pack("<I", value) * (n // 4))
            name += f" {dst:#x} = {value:#x} ({n} B)"
        elif op == pm4.SDMA_FENCE:
            self.mem_write(q.hub, dws[1] | dws[2] << 32, struct.pack("<I", dws[3]))
            name += f" [{dws[1] | dws[2] << 32:#x}] = {dws[3]}"
        elif op == pm4.SDMA_TRAP:
            self.post_iv(IH_CLIENT_SDMA0, IH_SRC_SDMA_TRAP, (dws[1], 0, 0, 0))
        q.executed.append(name)
        self.trace.append(f"{q.name}: {name}")
        return True

    def close(self) -> None:
        with self.fn.changed:
            self._stopping = True
            self.fn.changed.notify_all()
        if self.thread is not threading.current_thread():
            self.thread.join(timeout=5)
