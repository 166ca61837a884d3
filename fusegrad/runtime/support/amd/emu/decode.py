"""Decoding CDNA3 machine code: 32/64-bit instruction words -> `Inst` (format, opcode, mnemonic, fields).

The format is picked from the high bits of the first dword (ISA reference, "Microcode Formats"); a 32-bit literal
constant follows an instruction whose source operand field is 255 (SOP*, VOP1/VOP2/VOPC) or that always carries one
(v_madmk/v_madak, s_setreg_imm32_b32).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from . import isa

LITERAL = 255
SDWA, DPP = 249, 250


class DecodeError(ValueError):
    """The bytes are not an instruction this decoder knows the format of."""


@dataclass(frozen=True)
class Inst:
    fmt: str  # SOP2, SOPK, SOP1, SOPC, SOPP, SMEM, VOP2, VOP1, VOPC, VOP3, VOP3P, DS, FLAT
    op: int
    name: str  # the mnemonic without the _e32/_e64 suffix; "" when the table has none
    size: int  # bytes
    f: dict[str, int] = field(default_factory=dict)  # the encoding's fields by name
    literal: int | None = None

    @property
    def mnemonic(self) -> str:
        return self.name or f"{self.fmt.lower()} opcode {self.op:#x}"


def _bits(w: int, hi: int, lo: int) -> int:
    return (w >> lo) & ((1 << (hi - lo + 1)) - 1)


def _vop3_name(op: int) -> str:
    if op < 0x100:
        return isa.VOPC.get(op, "")
    if op < 0x140:
        return isa.VOP2.get(op - 0x100, "")
    if op < 0x1C0:
        return isa.VOP1.get(op - 0x140, "")
    return isa.VOP3_ONLY.get(op, "")


def decode(code: bytes, offset: int = 0) -> Inst:
    """The instruction at `offset` in `code`."""
    if offset + 4 > len(code):
        raise DecodeError(f"no instruction at offset {offset:#x}: the code is {len(code)} bytes")
    (w,) = struct.unpack_from("<I", code, offset)
    w2 = struct.unpack_from("<I", code, offset + 4)[0] if offset + 8 <= len(code) else None

    def second() -> int:
        if w2 is None:
            raise DecodeError(f"64-bit instruction {w:#010x} at offset {offset:#x} is cut off by the code's end")
        return w2

    def with_literal(inst: Inst, sources: tuple[int, ...], always: bool = False) -> Inst:
        if always or LITERAL in sources:
            return Inst(inst.fmt, inst.op, inst.name, inst.size + 4, inst.f, second())
        return inst

    top9 = w >> 23
    if top9 == 0x17D:
        f = {"sdst": _bits(w, 22, 16), "ssrc0": _bits(w, 7, 0)}
        op = _bits(w, 15, 8)
        return with_literal(Inst("SOP1", op, isa.SOP1.get(op, ""), 4, f), (f["ssrc0"],))
    if top9 == 0x17E:
        op, f = _bits(w, 22, 16), {"ssrc0": _bits(w, 7, 0), "ssrc1": _bits(w, 15, 8)}
        return with_literal(Inst("SOPC", op, isa.SOPC.get(op, ""), 4, f), (f["ssrc0"], f["ssrc1"]))
    if top9 == 0x17F:
        op = _bits(w, 22, 16)
        return Inst("SOPP", op, isa.SOPP.get(op, ""), 4, {"simm16": w & 0xFFFF})
    if w >> 28 == 0xB:
        op, f = _bits(w, 27, 23), {"sdst": _bits(w, 22, 16), "simm16": w & 0xFFFF}
        return with_literal(Inst("SOPK", op, isa.SOPK.get(op, ""), 4, f), (), always=op == 20)
    if w >> 30 == 0b10:
        op, f = _bits(w, 29, 23), {"sdst": _bits(w, 22, 16), "ssrc0": _bits(w, 7, 0), "ssrc1": _bits(w, 15, 8)}
        return with_literal(Inst("SOP2", op, isa.SOP2.get(op, ""), 4, f), (f["ssrc0"], f["ssrc1"]))
    if w >> 31 == 0:
        src0 = _bits(w, 8, 0)
        if w >> 25 == 0x3F:
            op, fmt, table, f = _bits(w, 16, 9), "VOP1", isa.VOP1, {"vdst": _bits(w, 24, 17), "src0": src0}
        elif w >> 25 == 0x3E:
            op, fmt, table, f = _bits(w, 24, 17), "VOPC", isa.VOPC, {"src0": src0, "vsrc1": _bits(w, 16, 9)}
        else:
            op, fmt, table = _bits(w, 30, 25), "VOP2", isa.VOP2
            f = {"vdst": _bits(w, 24, 17), "src0": src0, "vsrc1": _bits(w, 16, 9)}
        inst = Inst(fmt, op, table.get(op, ""), 4, f)
        if src0 in (SDWA, DPP):
            return Inst(fmt, op, inst.name, 8, f | {"ext": src0, "ext_word": second()})
        return with_literal(inst, (src0,), always=fmt == "VOP2" and op in (23, 24, 36, 37))
    top6 = w >> 26
    if top6 == 0b110000:
        d = second()
        op = _bits(w, 25, 18)
        f = {"sbase": _bits(w, 5, 0) * 2, "sdata": _bits(w, 12, 6), "soe": _bits(w, 14, 14), "imm": _bits(w, 17, 17)}
        f |= {"glc": _bits(w, 16, 16), "offset": _bits(d, 20, 0), "soffset": _bits(d, 31, 25)}
        return Inst("SMEM", op, isa.SMEM.get(op, ""), 8, f)
    if top6 == 0b110100:
        d = second()
        if w >> 23 == 0x1A7:
            op = _bits(w, 22, 16)
            f = {"vdst": _bits(w, 7, 0), "neg_hi": _bits(w, 10, 8), "opsel": _bits(w, 13, 11)}
            f |= {"opsel_hi2": _bits(w, 14, 14), "clamp": _bits(w, 15, 15), "src0": _bits(d, 8, 0)}
            f |= {"src1": _bits(d, 17, 9), "src2": _bits(d, 26, 18), "opsel_hi": _bits(d, 28, 27), "neg": d >> 29}
            name = isa.VOP3P.get(op, "")
            if name.startswith("v_mfma"):  # VOP3P-MAI: the same bits, named as the matrix ops use them
                f = {"vdst": f["vdst"], "src0": f["src0"], "src1": f["src1"], "src2": f["src2"]}
                f |= {"cbsz": _bits(w, 10, 8), "abid": _bits(w, 14, 11), "acc_cd": _bits(w, 15, 15)}
                f |= {"acc": _bits(d, 28, 27), "blgp": d >> 29}
            return Inst("VOP3P", op, name, 8, f)
        op = _bits(w, 25, 16)
        f = {"vdst": _bits(w, 7, 0), "clamp": _bits(w, 15, 15), "src0": _bits(d, 8, 0), "src1": _bits(d, 17, 9)}
        f |= {"src2": _bits(d, 26, 18), "omod": _bits(d, 28, 27), "neg": d >> 29}
        if op in isa.BITOP3:  # the truth table sits in the abs [10:8], omod [60:59] and neg [63:61] bits
            f = {k: f[k] for k in ("vdst", "src0", "src1", "src2")} | {"opsel": _bits(w, 14, 11)}
            f["bitop3"] = _bits(w, 10, 8) << 3 | _bits(d, 28, 27) << 6 | d >> 29
        elif op in isa.VOP3B:
            f |= {"sdst": _bits(w, 14, 8), "abs": 0, "opsel": 0}
        else:
            f |= {"abs": _bits(w, 10, 8), "opsel": _bits(w, 14, 11)}
        return Inst("VOP3", op, _vop3_name(op), 8, f)
    if top6 == 0b110110:
        d = second()
        op = _bits(w, 24, 17)
        f = {"offset0": _bits(w, 7, 0), "offset1": _bits(w, 15, 8), "gds": _bits(w, 16, 16), "acc": _bits(w, 25, 25)}
        f |= {"addr": _bits(d, 7, 0), "data0": _bits(d, 15, 8), "data1": _bits(d, 23, 16), "vdst": _bits(d, 31, 24)}
        return Inst("DS", op, isa.DS.get(op, ""), 8, f)
    if top6 == 0b110111:
        d = second()
        op, seg = _bits(w, 24, 18), _bits(w, 15, 14)
        f = {"offset": _bits(w, 12, 0), "lds": _bits(w, 13, 13), "seg": seg, "glc": _bits(w, 16, 16)}
        f |= {"slc": _bits(w, 17, 17), "addr": _bits(d, 7, 0), "data": _bits(d, 15, 8), "saddr": _bits(d, 22, 16)}
        f |= {"acc": _bits(d, 23, 23), "vdst": _bits(d, 31, 24)}
        base = isa.FLAT_OPS.get(op)
        name = f"{isa.FLAT_SEGMENTS[seg]}_{base}" if base and seg < 3 else ""
        return Inst("FLAT", op, name, 8, f)
    raise DecodeError(f"instruction word {w:#010x} at offset {offset:#x} has no CDNA3 format this decoder knows")


def decode_all(code: bytes, start: int = 0, end: int | None = None) -> list[tuple[int, Inst]]:
    """(offset, Inst) for every instruction from start to end, in order."""
    out, pc, end = [], start, len(code) if end is None else end
    while pc < end:
        inst = decode(code, pc)
        out.append((pc, inst))
        pc += inst.size
    return out
