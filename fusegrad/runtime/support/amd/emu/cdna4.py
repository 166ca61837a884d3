"""CDNA4 (gfx950) vector ops CDNA3 lacks that LLVM 22 emits for the op suite.

`v_bitop3_b32` / `v_bitop3_b16` (VOP3 0x234 / 0x233): any bitwise function of three sources given by an 8-bit truth
table, bit (s0 << 2 | s1 << 1 | s2) of the table being the result for those source bits. The table's bits are spread
over the VOP3 fields CDNA3 uses for modifiers: table[5:3] in ABS [10:8], table[7:6] in OMOD [60:59], table[2:0] in
NEG [63:61] (as LLVM's gfx950 assembler encodes `bitop3:0x9c`: checked by the decoder test against its printed
assembly and by the op suite running LLVM's code).
"""

from __future__ import annotations

import numpy as np

from .machine import Machine, Unsupported
from .vector import writer


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
