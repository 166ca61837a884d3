"""CDNA4 (gfx950) vector ops CDNA3 lacks that LLVM 22 emits for the op suite.

`v_bitop3_b32` / `v_bitop3_b16` (VOP3 0x234 / 0x233): any bitwise function of three sources given by an 8-bit truth
table, bit (s0 << 2 | s1 << 1 | s2) of the table being the result for those source bits. The table's bits are spread
over the VOP3 fields CDNA3 uses for modifiers: table[5:3] in ABS [10:8], table[7:6] in OMOD [60:59], table[2:0] in
NEG [63:61] (as LLVM's gfx950 assembler encodes `bitop3:0x9c`: checked by the decoder test against its printed
assembly and by the op suite running LLVM's code).

`v_cvt_pk_f16_f32` / `v_cvt_pk_bf16_f32` (VOP3 0x267 / 0x268): two float32 sources rounded to nearest even into the
low (src0) and high (src1) halves of one VGPR; a NaN stays a quiet NaN.
"""

from __future__ import annotations

import numpy as np

from .machine import Machine, Unsupported
from .vector import _masked, writer

U32 = np.uint32


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (as uint32), rounded to nearest even; NaN quieted."""
    b = np.ascontiguousarray(np.broadcast_to(x, (64,)), np.float32).view(U32)
    rounded = (b + U32(0x7FFF) + ((b >> U32(16)) & U32(1))) >> U32(16)
    return np.where(np.isnan(b.view(np.float32)), (b >> U32(16)) | U32(0x40), rounded)


def compile_cvt_pk(m: Machine, inst, nxt: int):
    f = inst.f
    if f["abs"] or f["neg"] or f["omod"] or f["clamp"] or f["opsel"]:
        raise Unsupported(f"modifiers on {inst.name}")
    lo, hi = m.source(f["src0"], "f32", inst.literal), m.source(f["src1"], "f32", inst.literal)
    dst = m.vview(f["vdst"], "u32")
    bf16 = inst.name.endswith("bf16_f32")

    def half(x):
        if bf16:
            return _bf16_bits(x)
        return np.broadcast_to(x, (64,)).astype(np.float16).view(np.uint16).astype(U32)

    def run():
        _masked(m, dst, half(lo) | half(hi) << U32(16))
        return nxt

    return run


def compile_bitop3(m: Machine, inst, nxt: int):
    f = inst.f
    if f["opsel"]:
        raise Unsupported(f"op_sel {f['opsel']:#x} on {inst.name}")
    ty = "u16" if inst.name.endswith("b16") else "u32"
    srcs = [m.source(f[k], ty, inst.literal) for k in ("src0", "src1", "src2")]
    table, put = f["bitop3"], writer(m, f["vdst"], ty)
    minterms = [i for i in range(8) if table >> i & 1]

    def run():
        s0, s1, s2 = (np.broadcast_to(s, (64,)) for s in srcs)
        n0, n1, n2 = ~s0, ~s1, ~s2
        out = np.zeros(64, s0.dtype)
        for i in minterms:  # OR of the table's minterms, each an AND of the sources or their complements
            out |= (s0 if i & 4 else n0) & (s1 if i & 2 else n1) & (s2 if i & 1 else n2)
        put(out)
        return nxt

    return run
