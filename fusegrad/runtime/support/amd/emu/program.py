"""Compiling scalar, control-flow and memory instructions, and the `Program`: decoded, compiled instructions by
code offset, built lazily as the wave reaches them. Each compiled instruction is a zero-argument function returning
the next offset (ENDPGM when the wave ends, BARRIER after an s_barrier)."""

from __future__ import annotations

import numpy as np

from . import salu
from .decode import Inst, decode
from .lds import compile_ds
from .machine import EXEC, LITERAL, M0, VCC, VGPR_BASE, Machine, Unsupported, inline_constant, mask_of
from .memory import VMemory
from .cdna4 import compile_bitop3, compile_cvt_pk
from .mfma import compile_accvgpr_mov, compile_mfma
from .packed import compile_vop3p
from .vector import compile_valu

ENDPGM, BARRIER = -1, -2
U32, U64 = np.uint32, np.uint64


def _sget(m: Machine, code: int, wide: bool, literal: int | None):
    """A getter for a scalar source as a Python int (64-bit pairs when wide)."""
    if code <= EXEC + 1 and code != 125:
        if wide:
            return lambda: int(m.S[code]) | int(m.S[code + 1]) << 32
        return lambda: int(m.S[code])
    if code == 253:
        return lambda: m.scc
    if code == 251:
        return lambda: int(m.sget64(VCC) == 0)
    if code == 252:
        return lambda: int(m.exec_bits() == 0)
    value = inline_constant(code, "i64" if wide else "u32", literal)
    if wide and code == LITERAL:
        value = literal  # a 64-bit scalar literal is zero-extended (the ISA's SOP encodings have no high half)
    return lambda: value


def _sdst(m: Machine, sdst: int, wide: bool):
    if sdst > EXEC + 1:
        raise Unsupported(f"scalar destination {sdst}")
    touches_exec = sdst in (EXEC, EXEC + 1) or (wide and sdst + 1 == EXEC)
    S = m.S

    if wide:

        def put(v):
            S[sdst] = v & 0xFFFFFFFF
            S[sdst + 1] = v >> 32
            if touches_exec:
                m.exec_changed()
    else:

        def put(v):
            S[sdst] = v
            if touches_exec:
                m.exec_changed()

    return put


def compile_scalar(m: Machine, inst: Inst, nxt: int):
    f, name = inst.f, inst.name
    if name in salu.SAVEEXEC:
        op, src, put = salu.SAVEEXEC[name], _sget(m, f["ssrc0"], True, inst.literal), _sdst(m, f["sdst"], True)

        def saveexec():
            old = m.exec_bits()
            new = op(src(), old) & salu.M64
            put(old)
            m.sset64(EXEC, new)
            m.exec_changed()
            m.scc = int(new != 0)
            return nxt

        return saveexec
    if name.startswith(("s_bitset0_", "s_bitset1_")):  # sdst[src0] = 0 or 1, the other bits kept
        wide, one = name.endswith("b64"), name.startswith("s_bitset1")
        cur, idx, put = (
            _sget(m, f["sdst"], wide, None),
            _sget(m, f["ssrc0"], False, inst.literal),
            _sdst(m, f["sdst"], wide),
        )
        width = 64 if wide else 32

        def bitset():
            bit = 1 << (idx() & (width - 1))
            put(cur() | bit if one else cur() & ~bit)
            return nxt

        return bitset
    fn = salu.SOP.get(name)
    if fn is None:
        raise Unsupported(name)
    wide = salu.is_wide(name)
    if inst.fmt == "SOPK":
        k = f["simm16"]
        if name.startswith(("s_movk", "s_cmovk")):
            a, b = (lambda: k), (lambda: 0)
        else:
            a, b = _sget(m, f["sdst"], False, None), (lambda: k)
    else:
        a = _sget(m, f["ssrc0"], wide and not name.startswith(("s_bitcmp",)), inst.literal)
        b = _sget(m, f["ssrc1"], wide, inst.literal) if "ssrc1" in f else (lambda: 0)
    writes = inst.fmt in ("SOP1", "SOP2") or (inst.fmt == "SOPK" and not name.startswith("s_cmpk"))
    put = _sdst(m, f["sdst"], wide) if writes else None

    def run():
        r, scc = fn(a(), b(), m.scc)
        if r is not None and put is not None:
            put(r)
        if scc is not None:
            m.scc = scc
        return nxt

    return run


def compile_sopp(m: Machine, inst: Inst, pc: int, nxt: int):
    name, imm = inst.name, inst.f["simm16"]
    target = nxt + 4 * ((imm ^ 0x8000) - 0x8000)
    if name in ("s_nop", "s_waitcnt", "s_setprio", "s_sleep", "s_icache_inv", "s_incperflevel", "s_decperflevel"):
        return lambda: nxt
    if name == "s_endpgm":
        return lambda: ENDPGM
    if name == "s_barrier":
        return lambda: BARRIER
    if name == "s_branch":
        return lambda: target
    conds = {
        "s_cbranch_scc0": lambda: m.scc == 0,
        "s_cbranch_scc1": lambda: m.scc == 1,
        "s_cbranch_vccz": lambda: m.sget64(VCC) == 0,
        "s_cbranch_vccnz": lambda: m.sget64(VCC) != 0,
        "s_cbranch_execz": lambda: not m.exec_mask.any(),
        "s_cbranch_execnz": lambda: bool(m.exec_mask.any()),
    }
    if name in conds:
        cond = conds[name]
        return lambda: target if cond() else nxt
    raise Unsupported(name)


def compile_smem(m: Machine, inst: Inst, mem_read, nxt: int):
    f, name = inst.f, inst.name
    if not name.startswith("s_load_dword"):
        if name in ("s_dcache_inv", "s_dcache_wb"):
            return lambda: nxt
        raise Unsupported(name)
    count = {"s_load_dword": 1, "s_load_dwordx2": 2, "s_load_dwordx4": 4, "s_load_dwordx8": 8}.get(name, 16)
    base, sdata = f["sbase"], f["sdata"]
    if f["imm"]:
        off = (f["offset"] ^ 0x100000) - 0x100000  # 21-bit signed byte offset
        offset = lambda: off  # noqa: E731
    else:
        reg = f["offset"] & 0xFF
        offset = lambda: int(m.S[reg])  # noqa: E731
    extra = (lambda: int(m.S[f["soffset"]])) if f["soe"] else (lambda: 0)

    def run():
        addr = (m.sget64(base) + offset() + extra()) & ~3 & salu.M64
        m.S[sdata : sdata + count] = np.frombuffer(mem_read(addr, 4 * count), np.uint32)
        return nxt

    return run


_LOADS = {
    "load_dword": (4, None),
    "load_dwordx2": (8, None),
    "load_dwordx3": (12, None),
    "load_dwordx4": (16, None),
    "load_ubyte": (1, np.uint8),
    "load_sbyte": (1, np.int8),
    "load_ushort": (2, np.uint16),
    "load_sshort": (2, np.int16),
}
_STORES = {
    "store_dword": (4, 0),
    "store_dwordx2": (8, 0),
    "store_dwordx3": (12, 0),
    "store_dwordx4": (16, 0),
    "store_byte": (1, 0),
    "store_byte_d16_hi": (1, 2),
    "store_short": (2, 0),
    "store_short_d16_hi": (2, 2),
}


def compile_flat(m: Machine, inst: Inst, mem: VMemory, nxt: int):
    f, name = inst.f, inst.name
    seg = f["seg"]
    if seg == 1:
        raise Unsupported("scratch memory")
    if f["lds"]:
        raise Unsupported("global loads into LDS")
    op = name.split("_", 1)[1]
    raw_off = f["offset"]
    offset = (raw_off ^ 0x1000) - 0x1000 if seg == 2 else raw_off & 0xFFF
    saddr = f["saddr"]
    use_saddr = seg == 2 and saddr != 0x7F
    vaddr = f["addr"]
    acc = 256 if f["acc"] else 0
    V = m.V

    off64 = U64(offset % (1 << 64))

    def addresses(lanes):
        if use_saddr:
            return U64(m.sget64(saddr)) + V[lanes, vaddr].astype(U64) + off64
        return V[lanes, vaddr : vaddr + 2].copy().view(U64)[:, 0] + off64

    def lanes():
        return slice(None) if m.exec_full else np.flatnonzero(m.exec_mask)

    if op in _LOADS:
        nbytes, ext = _LOADS[op]
        vdst = acc + f["vdst"]
        words = max(nbytes // 4, 1)

        def load():
            ln = lanes()
            if not isinstance(ln, slice) and ln.size == 0:
                return nxt
            data = mem.gather(addresses(ln), nbytes)
            if ext is None:
                V[ln, vdst : vdst + words] = data.view(U32)
            else:
                V[ln, vdst] = data.view(ext)[:, 0].astype(np.int64).astype(U32)
            return nxt

        return load
    if op in _STORES:
        nbytes, byte_shift = _STORES[op]
        data_reg = acc + f["data"]
        words = max(nbytes // 4, 1)

        def store():
            ln = lanes()
            if not isinstance(ln, slice) and ln.size == 0:
                return nxt
            regs = np.ascontiguousarray(V[ln, data_reg : data_reg + words])
            raw = regs.view(np.uint8)[:, byte_shift : byte_shift + nbytes] if nbytes < 4 else regs.view(np.uint8)
            mem.scatter(addresses(ln), np.ascontiguousarray(raw))
            return nxt

        return store
    raise Unsupported(name)


class Program:
    """A kernel's instructions, decoded from the bytes `fetch(offset, n)` returns and compiled on first use."""

    def __init__(self, m: Machine, fetch, mem: VMemory, mem_read):
        self.m, self.fetch, self.mem, self.mem_read = m, fetch, mem, mem_read
        self.table: dict[int, object] = {}
        self.insts: dict[int, Inst] = {}
        self.fault_pc: int | None = None

    def where(self) -> str:
        """The instruction the last fault stopped at, for error messages."""
        if self.fault_pc is None or self.fault_pc not in self.insts:
            return "before the first instruction"
        return f"{self.insts[self.fault_pc].mnemonic} at offset {self.fault_pc:#x}"

    def inst_at(self, pc: int) -> Inst:
        if pc not in self.insts:
            self.insts[pc] = decode(self.fetch(pc, 16))
        return self.insts[pc]

    def compile(self, pc: int):
        inst = self.inst_at(pc)
        nxt, m = pc + inst.size, self.m
        fmt = inst.fmt
        try:
            if not inst.name:
                raise Unsupported("no such opcode in the CDNA3 tables")
            if fmt in ("SOP1", "SOP2", "SOPC", "SOPK"):
                fn = compile_scalar(m, inst, nxt)
            elif fmt == "SOPP":
                fn = compile_sopp(m, inst, pc, nxt)
            elif fmt == "SMEM":
                fn = compile_smem(m, inst, self.mem_read, nxt)
            elif inst.name.startswith("v_bitop3"):
                fn = compile_bitop3(m, inst, nxt)
            elif inst.name in ("v_cvt_pk_f16_f32", "v_cvt_pk_bf16_f32"):
                fn = compile_cvt_pk(m, inst, nxt)
            elif inst.name == "v_accvgpr_mov_b32":
                fn = compile_accvgpr_mov(m, inst, nxt)
            elif fmt in ("VOP1", "VOP2", "VOPC", "VOP3"):
                fn = compile_valu(m, inst, nxt)
            elif inst.name.startswith("v_mfma"):
                fn = compile_mfma(m, inst, nxt)
            elif fmt == "VOP3P":
                fn = compile_vop3p(m, inst, nxt)
            elif fmt == "FLAT":
                fn = compile_flat(m, inst, self.mem, nxt)
            elif fmt == "DS":
                fn = compile_ds(m, inst, nxt)
            else:
                raise Unsupported(fmt)
        except Unsupported as e:
            raise Unimplemented(inst, pc, str(e)) from None
        self.table[pc] = fn
        return fn


class Unimplemented(Exception):
    def __init__(self, inst: Inst, pc: int, why: str):
        self.inst, self.pc = inst, pc
        super().__init__(
            f"unimplemented instruction {inst.mnemonic} ({inst.fmt} opcode {inst.op:#x}) at offset {pc:#x}: {why}"
        )


def lanes_of(m: Machine) -> np.ndarray:
    return mask_of(m.exec_bits())


__all__ = ["Program", "Unimplemented", "ENDPGM", "BARRIER", "M0", "VGPR_BASE"]
