"""PM4 type-3 packets for a compute queue (gfx9 family) and SDMA 4.x packets, as lists of dwords.

Layouts from AMD's public packet documentation as used by amdgpu (soc15d.h, vega10_sdma_pkt_open.h): a PM4 header is
`3 << 30 | (body dwords - 1) << 16 | opcode << 8 | shader_type << 1`; compute queues set shader_type 1.
"""

from __future__ import annotations

NOP, SET_SH_REG, DISPATCH_DIRECT, ACQUIRE_MEM = 0x10, 0x76, 0x15, 0x58
RELEASE_MEM, WAIT_REG_MEM, INDIRECT_BUFFER, WRITE_DATA = 0x49, 0x3C, 0x3F, 0x37
OPCODE_NAMES = {
    NOP: "NOP",
    SET_SH_REG: "SET_SH_REG",
    DISPATCH_DIRECT: "DISPATCH_DIRECT",
    ACQUIRE_MEM: "ACQUIRE_MEM",
    RELEASE_MEM: "RELEASE_MEM",
    WAIT_REG_MEM: "WAIT_REG_MEM",
    INDIRECT_BUFFER: "INDIRECT_BUFFER",
    WRITE_DATA: "WRITE_DATA",
}
SH_REG_START = 0x2C00
# RELEASE_MEM
CACHE_FLUSH_AND_INV_TS_EVENT, EVENT_INDEX_EOP = 0x14, 5
TC_ACTION_ENA, TC_WB_ACTION_ENA = 1 << 17, 1 << 15
DATA_SEL_32, DATA_SEL_64 = 1, 2
INT_SEL_NONE, INT_SEL_AFTER_WRITE = 0, 2
# WAIT_REG_MEM
WAIT_MEM_SPACE, FUNC_GEQ, FUNC_EQ = 1 << 4, 5, 3
# ACQUIRE_MEM coher_cntl: invalidate shader I$/K$ and TC L1/L2 (gfx9 CP_COHER_CNTL bits)
COHER_SH_ICACHE, COHER_SH_KCACHE, COHER_TC_ACTION, COHER_TCL1_ACTION = 1 << 29, 1 << 27, 1 << 23, 1 << 22
IB_VALID = 1 << 23
# SDMA 4.x opcodes
SDMA_NOP, SDMA_COPY, SDMA_FENCE, SDMA_TRAP, SDMA_POLL_REGMEM, SDMA_CONST_FILL = 0, 1, 5, 6, 8, 11
SDMA_NAMES = {SDMA_NOP: "NOP", SDMA_COPY: "COPY_LINEAR", SDMA_FENCE: "FENCE", SDMA_TRAP: "TRAP"}
SDMA_NAMES[SDMA_CONST_FILL] = "CONSTANT_FILL"
SDMA_FILL_DWORD = 2  # CONSTANT_FILL header bits 31:30
SDMA_MAX_BYTES = 1 << 22  # count field of COPY_LINEAR / CONSTANT_FILL (bytes - 1) is 22 bits


def header(opcode: int, body: int) -> int:
    if not 1 <= body <= 0x4000:
        raise ValueError(f"PM4 packet {OPCODE_NAMES.get(opcode, opcode)} with {body} body dwords")
    return 3 << 30 | (body - 1) << 16 | opcode << 8 | 1 << 1


def parse_header(dw: int) -> tuple[int, int, int]:
    """(type, opcode, body dwords) of a PM4 header."""
    return dw >> 30, (dw >> 8) & 0xFF, ((dw >> 16) & 0x3FFF) + 1


def lo(x: int) -> int:
    return x & 0xFFFFFFFF


def hi(x: int) -> int:
    return (x >> 32) & 0xFFFFFFFF


def set_sh_reg(offset: int, *values: int) -> list[int]:
    return [header(SET_SH_REG, 1 + len(values)), offset, *(lo(v) for v in values)]


def dispatch_direct(x: int, y: int, z: int, initiator: int) -> list[int]:
    return [header(DISPATCH_DIRECT, 4), x, y, z, initiator]


def acquire_mem(base: int = 0, size: int = 1 << 64) -> list[int]:
    """Invalidate the shader and texture caches over [base, base+size) before a dispatch reads host-written data."""
    cntl = COHER_SH_ICACHE | COHER_SH_KCACHE | COHER_TC_ACTION | COHER_TCL1_ACTION
    size256 = min((size + 255) >> 8, (1 << 40) - 1)
    return [header(ACQUIRE_MEM, 6), cntl, lo(size256), hi(size256) & 0xFF, lo(base >> 8), hi(base >> 8) & 0xFFFFFF, 10]


def release_mem(addr: int, value: int, interrupt: bool = False) -> list[int]:
    """End-of-pipe: flush caches, then write the 64-bit timeline value to addr (and raise an interrupt if asked)."""
    if addr % 8:
        raise ValueError(f"RELEASE_MEM address {addr:#x} is not 8-byte aligned")
    event = CACHE_FLUSH_AND_INV_TS_EVENT | EVENT_INDEX_EOP << 8 | TC_ACTION_ENA | TC_WB_ACTION_ENA
    sel = DATA_SEL_64 << 29 | (INT_SEL_AFTER_WRITE if interrupt else INT_SEL_NONE) << 24
    return [header(RELEASE_MEM, 7), event, sel, lo(addr), hi(addr), lo(value), hi(value), 0]


def wait_reg_mem(addr: int, ref: int, mask: int = 0xFFFFFFFF, func: int = FUNC_GEQ) -> list[int]:
    """Stall the queue until (dword at addr & mask) compares `func` against ref (a memory wait, not a register)."""
    if addr % 4:
        raise ValueError(f"WAIT_REG_MEM address {addr:#x} is not dword aligned")
    return [header(WAIT_REG_MEM, 6), WAIT_MEM_SPACE | func, lo(addr), hi(addr), lo(ref), lo(mask), 4]


def indirect_buffer(addr: int, ndwords: int) -> list[int]:
    if addr % 4 or not 0 < ndwords < 1 << 20:
        raise ValueError(f"indirect buffer at {addr:#x} of {ndwords} dwords")
    return [header(INDIRECT_BUFFER, 3), lo(addr), hi(addr) & 0xFFFF, ndwords | IB_VALID]


def sdma_copy(dst: int, src: int, nbytes: int) -> list[int]:
    out: list[int] = []
    for off in range(0, nbytes, SDMA_MAX_BYTES):
        n = min(SDMA_MAX_BYTES, nbytes - off)
        out += [SDMA_COPY, n - 1, 0, lo(src + off), hi(src + off), lo(dst + off), hi(dst + off)]
    return out


def sdma_fill(dst: int, value: int, nbytes: int) -> list[int]:
    if nbytes % 4 or dst % 4:
        raise ValueError(f"SDMA dword fill needs 4-byte alignment, got dst {dst:#x} size {nbytes}")
    out: list[int] = []
    for off in range(0, nbytes, SDMA_MAX_BYTES):
        n = min(SDMA_MAX_BYTES, nbytes - off)
        out += [SDMA_CONST_FILL | SDMA_FILL_DWORD << 30, lo(dst + off), hi(dst + off), lo(value), n - 1]
    return out


def sdma_fence(addr: int, value: int) -> list[int]:
    if addr % 4:
        raise ValueError(f"SDMA fence address {addr:#x} is not dword aligned")
    return [SDMA_FENCE, lo(addr), hi(addr), lo(value)]


def sdma_trap(context: int = 0) -> list[int]:
    return [SDMA_TRAP, context]


SDMA_SIZES = {SDMA_NOP: 1, SDMA_COPY: 7, SDMA_FENCE: 4, SDMA_TRAP: 2, SDMA_CONST_FILL: 5}


def write_data_register(dword: int, value: int) -> list[int]:
    """WRITE_DATA to a register (DST_SEL 0, write confirm): how a queue programs MMIO outside the lease."""
    return [header(WRITE_DATA, 4), 0 << 8 | 1 << 20, dword, 0, lo(value)]


def hdp_flush(req_dword: int, done_dword: int, mask: int) -> list[int]:
    """WAIT_REG_MEM in write-wait-write mode (OPERATION 1): write mask to the NBIO HDP flush request register, then
    wait until the done register shows it, so the host's BAR writes (kernargs, buffers) reach memory first."""
    return [header(WAIT_REG_MEM, 6), FUNC_EQ | 1 << 6, req_dword, done_dword, lo(mask), lo(mask), 0x20]


def wait_register(dword: int, ref: int, mask: int) -> list[int]:
    """WAIT_REG_MEM on a register (MEM_SPACE 0) until (reg & mask) == ref."""
    return [header(WAIT_REG_MEM, 6), FUNC_EQ, dword, 0, lo(ref), lo(mask), 4]
